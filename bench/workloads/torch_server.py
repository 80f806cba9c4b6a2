#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A multi-threaded PyTorch inference server: native, expandable segments and rmmc, side by side.

Serves the same seeded stream of requests in one process per allocator
(PyTorch's allocator can only be chosen before the first CUDA use):

  native      PyTorch's caching allocator with its defaults
  expandable  PyTorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  rmmc        rmmc's plug-in over the stack RMMC_ALLOC_CONF names (--spec;
              several --spec run one process each)

Each process builds two models once with fixed seeds and shares them,
read-only, between --threads threads, each with its own CUDA stream: a
ResNet-50 (torchvision, random weights, eval) over batches of 1-32 images of
160, 224 or 288 pixels, and a 6-layer transformer encoder (d_model 512, 8
heads) over batches of 1-16 token sequences of 32-1024 tokens, in fp16 under
torch.inference_mode. Request i is fully determined by (--seed, i): its
model, shape and input (made on the GPU by a generator seeded for i). The
threads take requests from one shared queue; each request ends with its
stream synchronized and a checksum of its output: the float64 sums of the
output and of its magnitudes, and the int64 sum of its bit patterns. The first --warmup requests
are untimed; then --requests are timed (requests per second over the whole
phase, p50/p99 latency).

Figures per process: peak reserved (native: torch.cuda.max_memory_reserved;
rmmc: the largest "reserved"/"reserved_peak" figure of any stack layer),
peak bytes handed to PyTorch (max_memory_allocated; rmmc: the plug-in's
peak), the device memory in use (cudaMemGetInfo, sampled 10 times a second),
and every numeric figure of every layer (rmmc) or torch.cuda.memory_stats()
(native) at the end of the warm-up and at the end, so the steady state is
their difference: device synchronizations (the pool's "device_syncs";
PyTorch's "num_sync_all_streams") and upstream calls.

Checksums must be bit-identical to the native run's (the allocator must not
change a result; deterministic cuDNN, no cuDNN benchmark, a fixed cuBLAS
workspace); --rtol compares the float sums instead, within that fraction of
the sum of magnitudes.

    python3 bench/workloads/torch_server.py --lib build/librmmc.so
    python3 bench/workloads/torch_server.py --spec "pool > cuda" --spec "arena > cuda" --threads 16

Prints a table and writes the whole comparison as JSON to
$OUT/torch_server.json when OUT is set (or to --json).

Exit status: 0 when every run finished with the native run's checksums, 1
when one failed, timed out or differed (or, with --strict, when an rmmc run
missed a target of issue 12), 2 for bad arguments, a library that does not
load or a spec that does not parse.
"""

import argparse
import contextlib
import json
import math
import os
import random
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # when loaded from a test
import workload_driver  # noqa: E402
import workload_rmmc  # noqa: E402

DEFAULT_SPEC = "statistics > pool > cuda"
RESULT_TAG = "TORCH_SERVER_RESULT "
MODES = ("native", "expandable", "rmmc")
EXPANDABLE_CONF = "expandable_segments:True"
CUBLAS_WORKSPACE = ":4096:8"  # the same fixed cuBLAS workspace in every process

# rmmc figures (the peak reservation: workload_rmmc.RESERVED_KEYS):
# device_syncs are the pool's whole-device synchronizations; the upstream
# keys count calls to the layer below (chunks, pages).
SYNC_KEY = "device_syncs"
UPSTREAM_KEYS = ("grows", "shrinks")
# PyTorch's figures for the same (torch.cuda.memory_stats()).
TORCH_SYNC_KEY = "num_sync_all_streams"
TORCH_UPSTREAM_KEYS = ("num_device_alloc", "num_device_free")

# Targets of issue 12 for an rmmc run.
TARGET_RATIO = 1.10

WORKLOADS = {
    "full": {
        "cnn": "resnet50", "cnn_batches": (1, 2, 4, 8, 16, 32), "cnn_sizes": (160, 224, 288),
        "text_layers": 6, "d_model": 512, "heads": 8, "ff": 2048, "vocab": 32000,
        "text_batch": (1, 16), "seq": (32, 1024), "cnn_share": 0.5,
    },
    # --tiny: a smoke test of the whole path in seconds (also on a CPU).
    "tiny": {
        "cnn": "resnet18", "cnn_batches": (1, 2, 3), "cnn_sizes": (32, 48),
        "text_layers": 2, "d_model": 32, "heads": 4, "ff": 64, "vocab": 100,
        "text_batch": (1, 3), "seq": (4, 24), "cnn_share": 0.5,
    },
}


# ---------------------------------------------------------------------------
# The workload: request i is a pure function of (seed, i).

def cnn_shapes(w):
    return [(b, s) for s in w["cnn_sizes"] for b in w["cnn_batches"]]


def request_plan(seed, i, w):
    """Request i: {"id", "kind" ("cnn" or "text"), "batch", "size" (image
    side or sequence length), "seed" (of its input)}. The first
    2 x len(cnn_shapes) requests alternate every CNN shape (in order) with
    random text requests, so a warm-up that long has seen every shape."""
    rng = random.Random("torch_server:%d:%d" % (seed, i))  # str seeds hash the same everywhere
    shapes = cnn_shapes(w)
    if i < 2 * len(shapes):
        kind = "cnn" if i % 2 == 0 else "text"
    else:
        kind = "cnn" if rng.random() < w["cnn_share"] else "text"
    if kind == "cnn":
        batch, size = shapes[i // 2] if i < 2 * len(shapes) else rng.choice(shapes)
    else:
        batch = rng.randint(*w["text_batch"])
        size = rng.randint(*w["seq"])
    return {"id": i, "kind": kind, "batch": batch, "size": size, "seed": rng.getrandbits(62)}


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100.0 * len(s)) - 1)]


# ---------------------------------------------------------------------------
# The worker: one process, one allocator.

def numeric(d):
    return {k: int(v) if isinstance(v, int) else v for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def deltas(before, after):
    return {k: after[k] - before[k] for k in after if k in before}


def worker(args):
    """One server run; prints a RESULT_TAG line with the JSON summary."""
    tag = "[%s]" % args.label
    rm = workload_rmmc.worker_load(args.worker, args.lib, args.spec[0])
    cuda = args.device == "cuda"
    torch, torchvision, failed = workload_driver.start_torch(cuda)
    if failed:
        return failed
    if rm is not None:
        workload_rmmc.use_torch()  # before the first CUDA allocation
    # The same kernels for the same shapes in every process.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    if hasattr(torch.utils, "deterministic"):
        torch.utils.deterministic.fill_uninitialized_memory = False  # no extra fills
    if not cuda:
        torch.set_num_threads(1)
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    bits_dtype = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
                  torch.float32: torch.int32}[dtype]  # same width: the output's bit patterns
    w = WORKLOADS["tiny" if args.tiny else "full"]

    class TextEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(w["vocab"], w["d_model"])
            layer = torch.nn.TransformerEncoderLayer(w["d_model"], w["heads"], w["ff"],
                                                     dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, w["text_layers"],
                                                       enable_nested_tensor=False)

        def forward(self, tokens):
            return self.encoder(self.embed(tokens))

    # Models: made on the CPU with fixed seeds (the same weights everywhere).
    torch.manual_seed(args.seed)
    cnn = getattr(torchvision.models, w["cnn"])(weights=None).eval()
    text = TextEncoder().eval()
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    cnn = cnn.to(device=dev, dtype=dtype, memory_format=memory_format)
    text = text.to(device=dev, dtype=dtype)
    for p in list(cnn.parameters()) + list(text.parameters()):
        p.requires_grad_(False)

    total = args.warmup + args.requests
    plans = [request_plan(args.seed, i, w) for i in range(total)]
    checksums = [None] * total
    latency = [None] * total
    served_by = [None] * total
    lock = threading.Lock()
    cursor = [0]
    phase_end = [args.warmup]
    failure = []
    barrier = threading.Barrier(args.threads + 1)

    def next_request():
        with lock:
            if failure or cursor[0] >= phase_end[0]:
                return None
            cursor[0] += 1
            return cursor[0] - 1

    def run_request(plan, stream):
        gen = torch.Generator(device=dev)
        gen.manual_seed(plan["seed"])
        b, s = plan["batch"], plan["size"]
        if plan["kind"] == "cnn":  # made channels-last: no copy before the first conv
            x = torch.randn((b, s, s, 3), generator=gen, device=dev, dtype=dtype)
            out = cnn(x.permute(0, 3, 1, 2))
        else:
            tokens = torch.randint(0, w["vocab"], (b, s), generator=gen, device=dev)
            out = text(tokens)
        out = out.contiguous()
        fsum = out.sum(dtype=torch.float64)
        asum = out.abs().sum(dtype=torch.float64)
        bsum = out.view(bits_dtype).sum(dtype=torch.int64)
        if stream is not None:
            stream.synchronize()
        return [fsum.item(), asum.item(), bsum.item()]

    def serve(tid):
        try:
            stream = torch.cuda.Stream() if cuda else None
            ctx = torch.cuda.stream(stream) if cuda else contextlib.nullcontext()
            with ctx, torch.inference_mode():
                for phase in range(2):
                    while True:
                        i = next_request()
                        if i is None:
                            break
                        t0 = time.perf_counter()
                        checksums[i] = run_request(plans[i], stream)
                        latency[i] = time.perf_counter() - t0
                        served_by[i] = tid
                    barrier.wait()  # end of the phase: the main thread reads figures
                    if phase == 0:
                        barrier.wait()  # start of the timed phase
        except threading.BrokenBarrierError:
            pass
        except BaseException:
            with lock:
                failure.append("thread %d: %s" % (tid, traceback.format_exc()))
            barrier.abort()

    device_index = torch.cuda.current_device() if cuda else None
    mem_total = torch.cuda.mem_get_info()[1] if cuda else 0
    used_peak = [0]
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.1):
            free, _ = torch.cuda.mem_get_info()
            used_peak[0] = max(used_peak[0], mem_total - free)

    def figures():
        f = {}
        if cuda:
            free, _ = torch.cuda.mem_get_info()
            used_peak[0] = max(used_peak[0], mem_total - free)
            f["device_used_bytes"] = mem_total - free
        if rm is not None:
            f["plugin_stats"] = rm.torch.stats(device_index)
            f["stack"] = workload_rmmc.layers_json(rm.stack_figures(device_index))
        elif cuda:
            f["torch_memory_stats"] = numeric(torch.cuda.memory_stats())
        return f

    print("%s %s, %s, %d threads, %d warm-up + %d timed requests, seed %d"
          % (tag, torch.cuda.get_device_name() if cuda else "cpu", args.dtype, args.threads,
             args.warmup, args.requests, args.seed), flush=True)
    sampler = threading.Thread(target=sample, daemon=True) if cuda else None
    if sampler:
        sampler.start()
    threads = [threading.Thread(target=serve, args=(t,), daemon=True)
               for t in range(args.threads)]
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    warm = end = None
    t0 = t1 = None
    try:
        barrier.wait()  # warm-up done, every stream synchronized
        warm = figures()
        print("%s warm-up: %d requests in %.1f s"
              % (tag, args.warmup, time.perf_counter() - t_start), flush=True)
        with lock:
            phase_end[0] = total
        t0 = time.perf_counter()
        barrier.wait()  # go
        barrier.wait()  # all served
        t1 = time.perf_counter()
        end = figures()
    except threading.BrokenBarrierError:
        pass  # a serving thread failed: reported below
    except BaseException:
        barrier.abort()  # reading the figures failed: let the threads go
        raise
    for t in threads:
        t.join()
    if sampler:
        sampling.set()
        sampler.join()
    if failure:
        print("error: a serving thread failed:\n%s" % "".join(failure), file=sys.stderr)
        return 6

    timed = range(args.warmup, total)
    lat_ms = [latency[i] * 1e3 for i in timed]
    elapsed = t1 - t0
    nonfinite = sum(1 for c in checksums if not math.isfinite(c[0]))
    result = {
        "mode": args.worker,
        "label": args.label,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "dtype": args.dtype,
        "threads": args.threads,
        "warmup": args.warmup,
        "requests": args.requests,
        "seed": args.seed,
        "workload": w,
        "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "RMMC_ALLOC_CONF",
                                               "CUBLAS_WORKSPACE_CONFIG")},
        "timed_s": elapsed,
        "requests_per_s": args.requests / elapsed if elapsed > 0 else None,
        "latency_ms": {"p50": percentile(lat_ms, 50), "p99": percentile(lat_ms, 99),
                       "mean": sum(lat_ms) / len(lat_ms), "max": max(lat_ms)},
        "timed_kinds": {k: sum(1 for i in timed if plans[i]["kind"] == k) for k in ("cnn", "text")},
        "served_per_thread": [sum(1 for i in timed if served_by[i] == t)
                              for t in range(args.threads)],
        "checksums": checksums,
        "nonfinite_checksums": nonfinite,
        "figures_warm": warm,
        "figures_end": end,
        "device_used_peak_bytes": used_peak[0] if cuda else None,
        "device_total_bytes": mem_total if cuda else None,
    }
    result.update(memory_summary(result, rm is not None))
    if cuda and rm is None:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    elif rm is not None:
        figures, problem = workload_rmmc.plugin_summary(
            rm, args.spec[0], end["plugin_stats"], [layer["figures"] for layer in end["stack"]])
        result.update(figures)
        if problem:
            print("error: %s" % problem, file=sys.stderr)
            print(RESULT_TAG + json.dumps(result), flush=True)
            return 5
    print("%s timed: %d requests in %.1f s: %.1f requests/s, p50 %.1f ms, p99 %.1f ms"
          % (tag, args.requests, elapsed, result["requests_per_s"] or 0,
             result["latency_ms"]["p50"], result["latency_ms"]["p99"]), flush=True)
    if nonfinite:
        print("%s warning: %d outputs are not finite; their checksums are weak"
              % (tag, nonfinite), flush=True)
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


def memory_summary(result, is_rmmc):
    """Steady-state figures (end of run minus end of warm-up): device
    syncs, upstream calls and every numeric figure's difference."""
    warm, end = result.get("figures_warm"), result.get("figures_end")
    out = {"steady_device_syncs": None, "steady_upstream_calls": None, "steady_deltas": None}
    if not warm or not end:
        return out
    if is_rmmc:
        layers = []
        for a, b in zip(warm.get("stack", []), end.get("stack", [])):
            layers.append({"layer": b["layer"],
                           "deltas": deltas(numeric(a["figures"]), numeric(b["figures"]))})
        out["steady_deltas"] = {"stack": layers,
                                "plugin_stats": deltas(warm["plugin_stats"], end["plugin_stats"])}
        syncs = [d["deltas"][SYNC_KEY] for d in layers if SYNC_KEY in d["deltas"]]
        ups = [d["deltas"][k] for d in layers for k in UPSTREAM_KEYS if k in d["deltas"]]
    elif "torch_memory_stats" in end:
        d = deltas(warm["torch_memory_stats"], end["torch_memory_stats"])
        out["steady_deltas"] = {"torch_memory_stats": {k: v for k, v in d.items() if v}}
        syncs = [d[TORCH_SYNC_KEY]] if TORCH_SYNC_KEY in d else []
        ups = [d[k] for k in TORCH_UPSTREAM_KEYS if k in d]
    else:
        return out
    out["steady_device_syncs"] = sum(syncs) if syncs else None
    out["steady_upstream_calls"] = sum(ups) if ups else None
    return out


# ---------------------------------------------------------------------------
# The driver: one worker process per run, then the comparison.

def plan_runs(args):
    """[(label, mode, spec or None)] in the order they run (native first: it
    is the reference)."""
    runs = []
    for mode in MODES:
        if mode not in args.modes:
            continue
        if mode != "rmmc":
            runs.append((mode, mode, None))
        elif len(args.spec) == 1:
            runs.append(("rmmc", mode, args.spec[0]))
        else:
            runs += [("rmmc%d" % (k + 1), mode, s) for k, s in enumerate(args.spec)]
    return runs


def worker_command(label, mode, spec, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--label", label,
           "--threads", str(args.threads), "--requests", str(args.requests),
           "--warmup", str(args.warmup), "--seed", str(args.seed), "--dtype", args.dtype,
           "--device", args.device]
    if spec is not None:
        cmd += ["--spec", spec]
    if args.tiny:
        cmd.append("--tiny")
    if args.lib:
        cmd += ["--lib", args.lib]
    return cmd


def worker_env(mode):
    env = dict(os.environ)
    env.pop("RMMC_ALLOC_CONF", None)  # the rmmc worker sets its own from --spec
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the native run uses PyTorch's defaults
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE_CONF
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    return env


def relative_difference(a, b):
    """a, b: [sum, sum of magnitudes, sum of bit patterns]. The largest
    difference of the two float sums relative to the sum of magnitudes (a
    plain sum can cancel to nearly 0: a LayerNorm's output sums to ~0).
    0 when equal; inf when one is not finite and they differ."""
    worst = 0.0
    scale = max(abs(a[1]), abs(b[1]))
    for x, y in ((a[0], b[0]), (a[1], b[1])):
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        if not (math.isfinite(x) and math.isfinite(y)) or scale == 0:
            return math.inf
        worst = max(worst, abs(x - y) / scale)
    return worst


def same_checksum(a, b, rtol):
    """Exact (rtol 0): every figure equal, NaN equal to NaN. With rtol > 0:
    the float sums within rtol of the sum of magnitudes."""
    if rtol == 0:
        return a[2] == b[2] and relative_difference(a, b) == 0
    return relative_difference(a, b) <= rtol


def compare_checksums(ref, run, rtol):
    """Compares run's checksums with ref's, request by request."""
    a, b = ref["checksums"], run["checksums"]
    n = min(len(a), len(b))
    bad = [i for i in range(n) if not same_checksum(a[i], b[i], rtol)]
    rel = max((relative_difference(a[i], b[i]) for i in range(n)), default=0.0)
    if len(a) != len(b):
        bad += list(range(n, max(len(a), len(b))))
    return {"compared": max(len(a), len(b)), "mismatches": len(bad), "first_mismatches": bad[:10],
            "max_relative_difference": rel}


def evaluate(runs, args):
    """Per run: checksum comparison with the reference, requests/s relative
    to expandable, reserved/allocated and, for rmmc runs, issue 12's
    targets. Returns (comparison dict, reference label, error list)."""
    ref_label = "native" if "native" in runs else next(iter(runs), None)
    exp = runs.get("expandable")
    comparison, errors = {}, []
    for label, r in runs.items():
        c = {}
        if label != ref_label:
            c["checksums"] = compare_checksums(runs[ref_label], r, args.rtol)
            if c["checksums"]["mismatches"]:
                errors.append("%s: %d of %d checksums differ from the %s run's (first: requests %s)"
                              % (label, c["checksums"]["mismatches"], c["checksums"]["compared"],
                                 ref_label, c["checksums"]["first_mismatches"]))
        rps = r.get("requests_per_s")
        c["rps_vs_expandable"] = (rps / exp["requests_per_s"]
                                  if exp and rps and exp.get("requests_per_s") else None)
        res, alloc = r.get("peak_reserved_bytes"), r.get("peak_allocated_bytes")
        c["reserved_over_allocated"] = res / alloc if res and alloc else None
        if r.get("mode") == "rmmc":
            t = {
                "rps_at_least_expandable": (None if c["rps_vs_expandable"] is None
                                            else c["rps_vs_expandable"] >= 1.0),
                "reserved_within_%.2fx" % TARGET_RATIO: (
                    None if c["reserved_over_allocated"] is None
                    else c["reserved_over_allocated"] <= TARGET_RATIO),
                "checksums_equal_native": (None if ref_label != "native" or label == ref_label
                                           else c["checksums"]["mismatches"] == 0),
                "no_steady_device_syncs": (None if r.get("steady_device_syncs") is None
                                           else r["steady_device_syncs"] == 0),
            }
            c["targets"] = t
            c["targets_met"] = all(v is not False for v in t.values())
        comparison[label] = c
    return comparison, ref_label, errors


def mib(b):
    return "-" if b is None else "{:,.0f} MiB".format(b / 2**20)


def fmt(v, pattern):
    return "-" if v is None else pattern % v


def report(runs, comparison, ref_label, specs):
    """The comparison table, as text."""
    lines = []
    head = ("%-11s %8s %7s %8s %8s %14s %14s %9s %14s %12s %6s %9s"
            % ("run", "req/s", "vs exp", "p50 ms", "p99 ms", "peak reserved", "peak alloc",
               "res/alloc", "device used", "checksums", "syncs", "upstream"))
    lines.append(head)
    for label, r in runs.items():
        c = comparison[label]
        if label == ref_label:
            sums = "reference"
        elif c["checksums"]["mismatches"] == 0:
            sums = "equal"
        else:
            sums = "%d differ" % c["checksums"]["mismatches"]
        lat = r.get("latency_ms", {})
        lines.append("%-11s %8s %7s %8s %8s %14s %14s %9s %14s %12s %6s %9s" % (
            label, fmt(r.get("requests_per_s"), "%.1f"), fmt(c["rps_vs_expandable"], "%.2fx"),
            fmt(lat.get("p50"), "%.1f"), fmt(lat.get("p99"), "%.1f"),
            mib(r.get("peak_reserved_bytes")), mib(r.get("peak_allocated_bytes")),
            fmt(c["reserved_over_allocated"], "%.2fx"), mib(r.get("device_used_peak_bytes")),
            sums, fmt(r.get("steady_device_syncs"), "%d"),
            fmt(r.get("steady_upstream_calls"), "%d")))
    lines.append("syncs, upstream: in the timed phase (the steady state): rmmc's '%s' and %s;"
                 % (SYNC_KEY, "/".join(UPSTREAM_KEYS)))
    lines.append("  PyTorch's '%s' and %s." % (TORCH_SYNC_KEY, "/".join(TORCH_UPSTREAM_KEYS)))
    for label, spec in specs:
        lines.append("%s: %s" % (label, spec))
    for label, r in runs.items():
        end = r.get("figures_end") or {}
        steady = r.get("steady_deltas") or {}
        for layer, moved in zip(end.get("stack", []), steady.get("stack", [])):
            figs = {k: v for k, v in layer["figures"].items() if not isinstance(v, str)}
            lines.append("  %s %s: %s" % (label, layer["layer"], figs))
            changed = {k: v for k, v in moved["deltas"].items() if v}
            if changed:
                lines.append("  %s %s, changed in the timed phase: %s"
                             % (label, layer["layer"], changed))
    for label, c in comparison.items():
        if "targets" in c:
            lines.append("targets for %s (issue 12): %s" % (label, ", ".join(
                "%s %s" % (k, {True: "yes", False: "NO", None: "n/a"}[v])
                for k, v in c["targets"].items())))
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="path to librmmc.so (default: $RMMC_LIB or ./build)")
    ap.add_argument("--spec", action="append",
                    help="rmmc stack spec, repeatable: one process each (default: "
                         "$RMMC_ALLOC_CONF or %r)" % DEFAULT_SPEC)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated runs among %s (default: all)" % ", ".join(MODES))
    ap.add_argument("--threads", type=int, default=8, help="serving threads, one stream each")
    ap.add_argument("--requests", type=int, default=4000, help="timed requests")
    ap.add_argument("--warmup", type=int, default=300, help="untimed requests before them (the first 36 "
                         "cover every CNN shape)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=0.0,
                    help="relative tolerance on the checksums' float sums (default 0: "
                         "bit-identical outputs)")
    ap.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                    help="model and input precision (default: float16; float32 on a CPU)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a debug run of the server's logic (no allocator to compare)")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny models and shapes: a smoke test of the whole path")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per process")
    ap.add_argument("--json", help="where to write the summary (default: $OUT/torch_server.json)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when an rmmc run misses one of issue 12's targets")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--label", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    problems = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        problems.append("--modes takes a comma-separated list of %s (got %r)"
                        % (", ".join(MODES), args.modes))
    args.modes = [m for m in MODES if m in modes]
    if args.threads < 1 or args.requests < 1:
        problems.append("--threads and --requests must be positive")
    if args.warmup < 0:
        problems.append("--warmup must not be negative")
    if args.timeout < 1:
        problems.append("--timeout must be positive")
    if not args.rtol >= 0:
        problems.append("--rtol must be 0 or more")
    if args.spec and "rmmc" not in args.modes and not args.worker:
        problems.append("--spec is for rmmc runs, and --modes has none")
    if args.spec and any(not s.strip() for s in args.spec):
        problems.append("--spec must not be empty")
    if args.lib and not os.path.exists(args.lib):  # RMMC_LIB must name a library
        problems.append("--lib %s: no such file or directory" % args.lib)
    if args.device == "cpu" and "rmmc" in args.modes and not args.worker:
        problems.append("--device cpu cannot run rmmc's plug-in (leave rmmc out of --modes)")
    if not args.spec:
        args.spec = [os.environ.get("RMMC_ALLOC_CONF") or DEFAULT_SPEC]
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    if args.label is None:
        args.label = args.worker
    return args, problems


def main(argv=None):
    args, problems = parse_args(argv)
    if problems:
        for p in problems:
            print("error: %s" % p, file=sys.stderr)
        return 2
    if args.worker:
        return worker(args)

    if "rmmc" in args.modes:  # check the library and the specs before spending GPU time
        for spec in args.spec:
            rm, problem = workload_rmmc.open_checked(args.lib, spec)
            if problem:
                print("error: %s" % problem, file=sys.stderr)
                return 2
            args.lib = rm.library_path()

    plan = plan_runs(args)
    runs, errors = {}, []
    for label, mode, spec in plan:
        result, err = workload_driver.run_worker(worker_command(label, mode, spec, args),
                                                 worker_env(mode), label, args.timeout,
                                                 RESULT_TAG)
        if result is not None:  # also a summary from a run that then failed: kept in the JSON
            runs[label] = result
        if err:
            errors.append(err)
            print("error: " + err, file=sys.stderr)

    comparison, ref_label, mismatches = evaluate(runs, args)
    errors += mismatches
    specs = [(label, spec) for label, mode, spec in plan if mode == "rmmc"]
    w = WORKLOADS["tiny" if args.tiny else "full"]
    print("\n=== %d threads, %d timed + %d warm-up requests, seed %d, %s, %s: %s (%s) and a "
          "%d-layer transformer encoder (d_model %d)"
          % (args.threads, args.requests, args.warmup, args.seed, args.dtype, args.device,
             w["cnn"], "batches %s, sizes %s" % (",".join(map(str, w["cnn_batches"])),
                                                 ",".join(map(str, w["cnn_sizes"]))),
             w["text_layers"], w["d_model"]))
    if runs:
        print(report(runs, comparison, ref_label, specs))
    missed = [label for label, c in comparison.items() if c.get("targets_met") is False]
    if missed:
        print("targets missed by: %s" % ", ".join(missed))
    for e in mismatches:
        print("error: " + e, file=sys.stderr)

    summary = {"threads": args.threads, "requests": args.requests, "warmup": args.warmup,
               "seed": args.seed, "dtype": args.dtype, "device": args.device, "rtol": args.rtol,
               "workload": w, "specs": dict(specs), "reference": ref_label,
               "runs": runs, "comparison": comparison, "errors": errors}
    path = workload_driver.summary_path(args.json, "torch_server.json")
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
        print("summary written to %s" % path)
    if errors:
        return 1
    if args.strict and missed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
