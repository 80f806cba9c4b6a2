#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DDP and FSDP2 under torchrun, PyTorch's allocator against rmmc.

Every rank trains on its own GPU (LOCAL_RANK) with its own allocator: PyTorch's
native caching allocator, or rmmc's plug-in with the stack --spec names
(rmmc.torch.use, before CUDA starts, so each rank builds its own stack on its
own device). Two models:
  ddp    a small CNN (strided convolutions) under DistributedDataParallel
  fsdp   a small transformer (token embedding, encoder layers, head) with
         torch.distributed.fsdp.fully_shard on every layer and the root
Data are synthetic and seeded per rank; algorithms are deterministic
(cuDNN deterministic, math attention, CUBLAS_WORKSPACE_CONFIG), so the
losses of a native run and an rmmc run must be identical.

Each rank reports its losses, its median step time (after --warmup steps),
peak reserved and peak live bytes (native: torch.cuda.max_memory_reserved /
max_memory_allocated; rmmc: the stack's largest reserved_peak and the bytes
the plug-in handed PyTorch at most); rank 0 gathers them with rmmc.dist
(one table for all ranks) and writes JSON (--json).

    torchrun --nproc-per-node 2 bench/workloads/torch_dist.py --model ddp --allocator rmmc \\
        --spec "pool > cuda" --json ddp-rmmc.json
    python3 bench/workloads/torch_dist.py --compare ddp-*.json fsdp-*.json   # the targets, pass/fail

Failure: --cap-rank R --cap 64MiB puts `limiting(limit=64MiB)` on top of
rank R's stack: its allocation fails with rmmc's out-of-memory message, the
rank prints "rank R failed: ..." and exits 1 at once; torchrun then stops
the other ranks (blocked in a collective) and exits non-zero; the process
group's --timeout bounds the wait where torchrun does not.

--mempool (rmmc, native backend only): a torch.cuda.MemPool through rmmc,
registered with ProcessGroupNCCL (register_mem_pool), tensors allocated in
it (growing it after registration) all-reduced and checked, its segments
checked against rmmc's mappings and the trace, then deregistered
(mempool_check). Through the plug-in (no native backend) it prints
"mempool: skipped: needs the native backend".

Exit status: 0 when the run (or --compare's every check) passed; 1 when
one failed; 2 for bad arguments.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout
RESULT_TAG = "TORCH_DIST_RESULT "
DEFAULT_SPEC = "pool > cuda"


def native_backend(torch):
    """True when rmmc is PyTorch's allocator through the native backend
    (torch.cuda.memory.get_allocator_backend() names rmmc)."""
    try:
        return "rmmc" in str(torch.cuda.memory.get_allocator_backend()).lower()
    except Exception:  # older PyTorch, or a pluggable allocator that cannot say
        return False


def build_ddp(nn):
    """A small CNN: strided convolutions, a mean over the pixels, a head."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(128, 128, 3, stride=2, padding=1), nn.ReLU())
            self.head = nn.Linear(128, 10)

        def forward(self, x):
            return self.head(self.body(x).flatten(start_dim=2).mean(dim=2))
    return Net()


class _Transformer:
    """A small language model: embedding, encoder layers, head."""

    def __init__(self, torch, nn, vocab, d_model, layers):
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(vocab, d_model)
                self.layers = nn.ModuleList(
                    nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=4 * d_model,
                                               dropout=0.0, batch_first=True)
                    for _ in range(layers))
                self.head = nn.Linear(d_model, vocab)

            def forward(self, tokens):
                x = self.embed(tokens)
                for layer in self.layers:
                    x = layer(x)
                return self.head(x)
        self.model = LM()


# The allocator's counters the timed steps are compared by: rmmc's pool
# (growths, trims, page maps, host waits, events) or the native caching
# allocator's (segments taken and given back, retries).
POOL_COUNTERS = ("grows", "shrinks", "page_maps", "page_unmaps", "event_syncs", "event_records",
                 "event_waits", "event_queries", "stream_syncs", "device_syncs")
NATIVE_COUNTERS = (("segment.all.allocated", "grows"), ("segment.all.freed", "shrinks"),
                   ("num_alloc_retries", "retries"), ("num_sync_all_streams", "device_syncs"))


def _counters(allocator, torch, device, rmmc_mod):
    out = {}
    if allocator == "rmmc":
        for _name, f in rmmc_mod.dist.rank_figures(device=device.index)["layers"]:
            for k in POOL_COUNTERS:
                if isinstance(f.get(k), int):
                    out[k] = out.get(k, 0) + f[k]
    else:
        st = torch.cuda.memory_stats(device)
        for k, name in NATIVE_COUNTERS:
            if k in st:
                out[name] = int(st[k])
    return out


def rank_main(args):
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[k] = v  # multicast is forbidden here
    try:
        import rmmc.dist
    except ImportError:  # a checkout without the package installed: RMMC_LIB names the library
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import rmmc.dist
    spec = None
    if args.allocator == "rmmc":
        import rmmc.torch
        spec = args.spec.replace("{rank}", str(rank))  # a log file per rank, say
        if args.cap_rank == rank:
            spec = "limiting(limit=%s) > %s" % (args.cap, spec)
        rmmc.torch.use(spec)  # before CUDA starts: this rank's own stack
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout),
                            device_id=device)
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, name):
            getattr(torch.backends.cuda, name)(False)
    gen = torch.Generator().manual_seed(1000 + rank)

    if args.model == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(build_ddp(nn).to(device), device_ids=[local])
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batches = [(torch.randn(args.batch, 3, 64, 64, generator=gen),
                    torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(4)]
    else:
        from torch.distributed.fsdp import fully_shard
        lm = _Transformer(torch, nn, vocab=2048, d_model=args.d_model, layers=args.layers).model
        lm.to(device)
        for layer in lm.layers:
            fully_shard(layer)
        fully_shard(lm)
        model = lm
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batches = [(torch.randint(0, 2048, (args.batch, args.seq), generator=gen),
                    torch.randint(0, 2048, (args.batch, args.seq), generator=gen))
                   for _ in range(4)]
    loss_fn = nn.CrossEntropyLoss()
    losses, times, host = [], [], []
    before = None
    try:
        for step in range(args.steps):
            if step == args.warmup:
                before = _counters(args.allocator, torch, device, rmmc)
            x, y = batches[step % len(batches)]
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(x)
            loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            host.append(time.perf_counter() - t0)  # the host's share: launches, allocator
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    except Exception as e:  # the capped rank: its error, then out at once
        print("rank %d failed: %s: %s" % (rank, type(e).__name__, " | ".join(str(e).splitlines())),
              file=sys.stderr, flush=True)
        os._exit(1)

    mempool = None
    if args.mempool:
        mempool = mempool_check(args, torch, dist, device, rank)

    timed = times[args.warmup:] or times
    extra = {"allocator": args.allocator, "model": args.model,
             "step_ms": 1000.0 * statistics.median(timed),
             "steps_ms": [round(1000.0 * t, 3) for t in times],
             "host_ms": 1000.0 * statistics.median(host[args.warmup:] or host), "losses": losses}
    if before is not None:  # what the allocator did during the timed steps
        after = _counters(args.allocator, torch, device, rmmc)
        extra["timed"] = {k: after[k] - before.get(k, 0) for k in after}
    if args.allocator == "rmmc":
        fig = rmmc.dist.rank_figures(device=local, extra=extra)
        if fig.get("plugin_peak") is not None:  # exactly the bytes PyTorch held at most
            fig["peak_live"] = fig["plugin_peak"]
        fig["spec"] = spec
    else:
        fig = {"rank": dist.get_rank(), "world": world, "host": os.uname().nodename,
               "pid": os.getpid(), "device": local, "stack": "torch native",
               "live": torch.cuda.memory_allocated(device),
               "peak_live": torch.cuda.max_memory_allocated(device),
               "reserved": torch.cuda.memory_reserved(device),
               "peak_reserved": torch.cuda.max_memory_reserved(device)}
        fig.update(extra)
    if mempool is not None:
        fig["mempool"] = mempool
    rows = rmmc.dist.gather_figures(fig)
    if rank == 0:
        print(rmmc.dist.format_table(rows, list(rmmc.dist.COLUMNS) + [("step_ms", "step ms")]))
        for r in rows:
            print("rank %d losses: %s" % (r["rank"], " ".join("%.6f" % v for v in r["losses"])))
        result = {"model": args.model, "allocator": args.allocator, "spec": args.spec,
                  "label": args.label or args.spec,
                  "world": world, "steps": args.steps, "warmup": args.warmup,
                  "device_name": torch.cuda.get_device_name(device), "ranks": rows}
        print(RESULT_TAG + json.dumps({k: v for k, v in result.items() if k != "ranks"}))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if mempool is not None and mempool.get("status") == "wrong" else 0


def mempool_check(args, torch, dist, device, rank):
    """ProcessGroupNCCL.register_mem_pool over a MemPool through rmmc (the
    native backend only). The pool holds 8 MiB when it is registered, then
    grows (64 and 256 MiB tensors: new mappings, registered through the
    SEGMENT_ALLOC trace entries the backend's memory hooks make); every
    tensor is all-reduced and checked. Then: the pool's segments before
    registration are still there (registration and deregistration see the
    same segments), they are rmmc's mappings (count and bytes), and each
    got exactly one segment_alloc and, when the pool died after
    deregister_mem_pool, one segment_free. gpu-dist counts NCCL's REG log
    ("register comm ... buffer", one per ncclCommRegister) against the
    "segments" this prints. Returns what it saw, or a "skipped" note."""
    import gc
    if args.allocator != "rmmc" or not native_backend(torch):
        note = "skipped: needs the native backend (torch.cuda.memory.get_allocator_backend() = %r)" \
            % (getattr(torch.cuda.memory, "get_allocator_backend", lambda: None)(),)
        if rank == 0:
            print("mempool: " + note, flush=True)
        return {"status": "skipped", "note": note}
    import rmmc.torch
    native = rmmc.torch.build_native()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    pool = torch.cuda.MemPool()
    want = float(sum(range(1, dist.get_world_size() + 1)))
    tensors = []
    with torch.cuda.use_mem_pool(pool):
        tensors.append(torch.full((8 << 18,), float(rank + 1), device=device))
    seg = lambda s: (s["address"], s["total_size"])  # noqa: E731
    before = {seg(s) for s in torch.cuda.memory_snapshot(pool.id)}
    backend = dist.group.WORLD._get_backend(device)
    backend.register_mem_pool(pool)
    with torch.cuda.use_mem_pool(pool):
        for mib in (64, 256):  # grows the pool after registration
            tensors.append(torch.full((mib << 18,), float(rank + 1), device=device))
    ok = True
    for t in tensors:
        dist.all_reduce(t)
        ok = ok and bool((t == want).all().item())
    torch.cuda.synchronize()
    after = {seg(s) for s in torch.cuda.memory_snapshot(pool.id)}
    r = native.pool_resource(pool.id, device=device.index)
    figs = {}
    for _name, f in (r.layers() if r is not None else []):
        if "reserved" in dict(f):
            figs = dict(f)
            break
    if r is not None:
        r.close()
    held = figs.get("mappings", figs.get("regions"))
    problems = []
    if not before <= after:
        problems.append("segments changed: %d of %d gone" % (len(before - after), len(before)))
    if len(after) <= len(before):
        problems.append("no segment after growth (%d before, %d after)" % (len(before), len(after)))
    if held != len(after) or figs.get("reserved") != sum(n for _, n in after):
        problems.append("%d segments of %d bytes, rmmc holds %s mappings of %s bytes"
                        % (len(after), sum(n for _, n in after), held, figs.get("reserved")))
    try:
        backend.deregister_mem_pool(pool)  # every segment must be registered
    except Exception as e:  # noqa: BLE001
        problems.append("deregister_mem_pool: %s" % " | ".join(str(e).splitlines())[:300])
    del tensors, t, pool
    gc.collect()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][device.index]
    torch.cuda.memory._record_memory_history(enabled=None)
    addrs = sorted(a for a, _ in after)
    allocs = sorted(e["addr"] for e in trace if e["action"] == "segment_alloc" and e["addr"] in addrs)
    frees = sorted(e["addr"] for e in trace if e["action"] == "segment_free" and e["addr"] in addrs)
    if allocs != addrs or frees != addrs:
        problems.append("trace: %d segment_alloc, %d segment_free for %d segments"
                        % (len(allocs), len(frees), len(addrs)))
    status = "ok" if ok and not problems else "wrong"
    print("mempool: rank %d values %s, segments %d (%d before registration), rmmc mappings %s, "
          "segment_alloc %d, segment_free %d%s" % (
              rank, "ok" if ok else "WRONG", len(after), len(before), held, len(allocs),
              len(frees), "; PROBLEM " + "; ".join(problems) if problems else ""), flush=True)
    return {"status": status, "segments": len(after), "before": len(before), "mappings": held,
            "problems": problems}


# ---- --compare: the targets over the JSON of several runs (pure) ----

def _median(xs):
    return statistics.median(xs) if xs else None


def _name(run):
    """What names an rmmc run in --compare: its --label, else its spec."""
    return run.get("label") or run.get("spec") or DEFAULT_SPEC


def compare(runs):
    """Checks per (model, world), and per rmmc spec (or --label) where the
    runs hold several: identical losses of every rank in every
    run (native and rmmc), rmmc's median step time <= native's (the median
    over runs of the slowest rank's median step), and rmmc's peak reserved
    per rank <= native's (medians over runs). Returns [(check, ok, detail)]
    with ok True/False/None (None: nothing to compare)."""
    out = []
    keys = sorted({(r["model"], r["world"]) for r in runs})
    groups = []
    for model, world in keys:
        same = [r for r in runs if r["model"] == model and r["world"] == world]
        native = [r for r in same if r["allocator"] == "native"]
        rm = [r for r in same if r["allocator"] == "rmmc"]
        specs = sorted({_name(r) for r in rm})
        tag = "%s %d GPU(s)" % (model, world)
        if len(specs) <= 1:
            groups.append((tag, native, rm))
        else:  # several rmmc stacks: each against the same native runs, by name
            groups += [("%s, %s" % (tag, s), native, [r for r in rm if _name(r) == s])
                       for s in specs]
    for tag, native, rm in groups:
        group = native + rm
        if not native or not rm:
            out.append((tag + ": native and rmmc runs", None,
                        "%d native, %d rmmc run(s)" % (len(native), len(rm))))
            continue
        ref = {x["rank"]: x["losses"] for x in native[0]["ranks"]}
        diffs = []
        for r in group:
            for x in r["ranks"]:
                a, b = x["losses"], ref.get(x["rank"], [])
                if len(a) != len(b):
                    diffs.append(float("inf"))
                else:
                    diffs.append(max((abs(p - q) for p, q in zip(a, b)), default=0.0))
        worst = max(diffs) if diffs else 0.0
        out.append((tag + ": identical losses", worst == 0.0,
                    "every rank of %d run(s) equal to native run 1" % len(group) if worst == 0.0
                    else "largest difference %.3g" % worst))
        # Each run's slowest rank; the runs' spread beside the medians, since
        # on a shared host whole runs move by a few percent (docs/
        # performance.md, session 17).
        per_run = {k: [max(x["step_ms"] for x in r["ranks"]) for r in v]
                   for k, v in (("native", native), ("rmmc", rm))}
        step = {k: _median(v) for k, v in per_run.items()}
        out.append((tag + ": median step time rmmc <= native", step["rmmc"] <= step["native"],
                    "rmmc %.2f ms, native %.2f ms (%.3fx, medians of %d/%d runs; runs "
                    "%.2f-%.2f and %.2f-%.2f)" % (
                        step["rmmc"], step["native"], step["rmmc"] / step["native"], len(rm),
                        len(native), min(per_run["rmmc"]), max(per_run["rmmc"]),
                        min(per_run["native"]), max(per_run["native"]))))
        worse = []
        detail = []
        for rank in sorted(ref):
            pr = {k: _median([x["peak_reserved"] for r in v for x in r["ranks"]
                              if x["rank"] == rank and x.get("peak_reserved") is not None])
                  for k, v in (("native", native), ("rmmc", rm))}
            if pr["rmmc"] is None or pr["native"] is None:
                worse.append(rank)
                continue
            detail.append("rank %d %.1f/%.1f MiB" % (rank, pr["rmmc"] / 2**20, pr["native"] / 2**20))
            if pr["rmmc"] > pr["native"]:
                worse.append(rank)
        out.append((tag + ": peak reserved per rank rmmc <= native", not worse,
                    "rmmc/native: " + ", ".join(detail)))
    return out


def timed_summary(runs):
    """Per (model, world, allocator or spec): the median over runs of the
    slowest rank's median step and host time (the host's share: launches and
    the allocator, before the step's synchronize), and the median per rank of
    the allocator's counters over the timed steps. Lines of text."""
    out = []
    keys = sorted({(r["model"], r["world"], r["allocator"],
                    _name(r) if r["allocator"] == "rmmc" else "native") for r in runs})
    for model, world, alloc, name in keys:
        v = [r for r in runs if (r["model"], r["world"], r["allocator"]) == (model, world, alloc)
             and (alloc != "rmmc" or _name(r) == name)]
        step = _median([max(x["step_ms"] for x in r["ranks"]) for r in v])
        hosts = [max(x["host_ms"] for x in r["ranks"]) for r in v
                 if all("host_ms" in x for x in r["ranks"])]
        counts = {}
        for r in v:
            for x in r["ranks"]:
                for k, n in (x.get("timed") or {}).items():
                    counts.setdefault(k, []).append(n)
        steps = v[0].get("steps", 0) - v[0].get("warmup", 0)
        line = "%s %d GPU(s), %s: step %.2f ms" % (model, world, name, step)
        if hosts:
            line += ", host %.2f ms" % _median(hosts)
        if counts:
            line += "; per rank over %d timed steps: %s" % (steps, ", ".join(
                "%s %g" % (k, _median(n)) for k, n in sorted(counts.items())))
        out.append(line)
    return out


def compare_main(paths):
    runs = []
    for p in paths:
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            print("compare: %s: %s" % (p, e), file=sys.stderr)
    rows = compare(runs)
    for check, ok, detail in rows:
        print("%-6s %s | %s" % ({True: "PASS", False: "FAIL", None: "SKIP"}[ok], check, detail))
    for line in timed_summary(runs):
        print("info   " + line)
    return 0 if rows and all(ok is not False for _, ok, _ in rows) and runs else 1


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--allocator", choices=("native", "rmmc"), default="rmmc")
    ap.add_argument("--spec", default=DEFAULT_SPEC,
                    help="rmmc's stack (default 'pool > cuda'); {rank} becomes the rank, as in "
                    "'logging(path=fsdp-{rank}.csv) > pool > cuda'")
    ap.add_argument("--label", default=None,
                    help="the run's name in the JSON and in --compare (default: the spec), "
                    "e.g. for a variant set by an environment variable")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds a collective may wait (the process group's timeout)")
    ap.add_argument("--cap-rank", type=int, default=None)
    ap.add_argument("--cap", default="64MiB", help="the limit on --cap-rank's stack")
    ap.add_argument("--mempool", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs="+", metavar="JSON", default=None)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        ap.error("--steps and --batch must be >= 1, --warmup >= 0")
    if args.cap_rank is not None and args.allocator != "rmmc":
        ap.error("--cap-rank caps rmmc's stack: use --allocator rmmc")
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.compare:
        return compare_main(args.compare)
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
