#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ResNet-50 training: PyTorch's native allocator against rmmc, side by side.

Trains torchvision's ResNet-50 (random weights, synthetic data, fixed seed)
twice, in two separate processes since PyTorch's allocator can only be
chosen before the first CUDA use: once with PyTorch's own caching
allocator, once through rmmc's plug-in with the stack RMMC_ALLOC_CONF names
(--spec). Prints the loss of every step of both runs, the median step time
(after the warm-up steps), the peak memory each reserved and the device
memory in use (cudaMemGetInfo, sampled every step, comparable across both),
and writes the whole comparison as JSON to $OUT/torch_demo.json when OUT is
set (or to --json).

    python3 bench/workloads/torch_demo.py --lib build/librmmc.so
    python3 bench/workloads/torch_demo.py --spec "statistics > pool(initial=8GiB) > cuda" --steps 30

Peak figures: native = torch.cuda.max_memory_reserved() (and
max_memory_allocated()); rmmc = the plug-ins' peak of bytes handed to
PyTorch (the analogue of max_memory_allocated) and the largest "reserved"
/ "peak" figure any layer of the stack reports (the pool's reservation),
plus every layer's figures.

Exit status: 0 when both runs finished, 1 when one failed or timed out,
2 for bad arguments or a spec that does not parse.
"""

import argparse
import json
import os
import statistics
import sys
import time

import workload_driver
import workload_rmmc

DEFAULT_SPEC = "statistics > pool > cuda"
RESULT_TAG = "TORCH_DEMO_RESULT "


def worker(args):
    """One training run; prints a RESULT_TAG line with the JSON summary."""
    rm = workload_rmmc.worker_load(args.worker, args.lib, args.spec)
    torch, torchvision, failed = workload_driver.start_torch()
    if failed:
        return failed
    if rm is not None:
        workload_rmmc.use_torch()  # before the first CUDA allocation
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    model = torchvision.models.resnet50(weights=None).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    _, total = torch.cuda.mem_get_info()
    losses, times, used_peak = [], [], 0
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 224, 224, device=dev, generator=gen)
        y = torch.randint(0, 1000, (args.batch,), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        free, _ = torch.cuda.mem_get_info()
        used_peak = max(used_peak, total - free)
        print("[%s] step %3d  loss %.5f  %.1f ms" % (args.worker, step, losses[-1],
                                                      times[-1] * 1e3), flush=True)
    timed = times[args.warmup:] if len(times) > args.warmup else times
    result = {
        "mode": args.worker,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "losses": losses,
        "step_ms": [t * 1e3 for t in times],
        "median_step_ms": statistics.median(timed) * 1e3,
        "device_used_peak_bytes": used_peak,
        "device_total_bytes": total,
    }
    if rm is None:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    else:
        stats = rm.torch.stats(torch.cuda.current_device())
        layers = rm.stack_figures(torch.cuda.current_device())
        figures, problem = workload_rmmc.plugin_summary(rm, args.spec, stats,
                                                        [f for _, f in layers])
        result.update(figures)
        result.update({"plugin_stats": stats,
                       "stack_figures": workload_rmmc.layers_json(layers)})
        if problem:
            print("error: %s" % problem, file=sys.stderr)
            print(RESULT_TAG + json.dumps(result), flush=True)
            return 5
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


def run_worker(mode, args):
    """Runs one worker process; returns (summary dict or None, error text)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--spec", args.spec,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seed", str(args.seed),
           "--warmup", str(args.warmup)]
    if args.lib:
        cmd += ["--lib", args.lib]
    env = dict(os.environ)
    env.pop("RMMC_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the native run uses PyTorch's defaults
    return workload_driver.run_worker(cmd, env, mode, args.timeout, RESULT_TAG)


def mib(b):
    return "-" if b is None else "%.0f MiB" % (b / 2**20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="path to librmmc.so (default: $RMMC_LIB or ./build)")
    ap.add_argument("--spec", default=os.environ.get("RMMC_ALLOC_CONF") or DEFAULT_SPEC,
                    help="rmmc stack spec (default: $RMMC_ALLOC_CONF or %r)" % DEFAULT_SPEC)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--json", help="where to write the summary (default: $OUT/torch_demo.json)")
    ap.add_argument("--only", choices=["native", "rmmc"], help="run one side only")
    ap.add_argument("--worker", choices=["native", "rmmc"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1:
        print("error: --steps and --batch must be positive", file=sys.stderr)
        return 2
    if args.worker:
        return worker(args)

    if args.only != "native":  # check the library and the spec before spending GPU time
        rm, problem = workload_rmmc.open_checked(args.lib, args.spec)
        if problem:
            print("error: %s" % problem, file=sys.stderr)
            return 2
        args.lib = rm.library_path()

    runs, errors = {}, []
    for mode in ("native", "rmmc"):
        if args.only and mode != args.only:
            continue
        result, err = run_worker(mode, args)
        if result is not None:
            runs[mode] = result
        if err:
            errors.append(err)
            print("error: " + err, file=sys.stderr)

    print("\n=== ResNet-50, batch %d, %d steps, seed %d, rmmc spec %r"
          % (args.batch, args.steps, args.seed, args.spec))
    if len(runs) == 2:
        print("step   native loss    rmmc loss")
        for i, (a, b) in enumerate(zip(runs["native"]["losses"], runs["rmmc"]["losses"])):
            print("%4d   %10.5f   %10.5f" % (i, a, b))
        diff = max(abs(a - b) for a, b in zip(runs["native"]["losses"], runs["rmmc"]["losses"]))
        print("largest loss difference: %.3g (the allocator should not change the math)" % diff)
    print("%-8s %14s %16s %18s %18s" % ("", "median step", "peak reserved", "peak allocated",
                                       "device used peak"))
    for mode, r in runs.items():
        print("%-8s %11.1f ms %16s %18s %18s" % (mode, r["median_step_ms"],
                                                mib(r.get("peak_reserved_bytes")),
                                                mib(r.get("peak_allocated_bytes")),
                                                mib(r["device_used_peak_bytes"])))
    if "rmmc" in runs:
        for layer in runs["rmmc"].get("stack_figures", []):
            print("  rmmc %-12s %s" % (layer["layer"] + ":", layer["figures"]))

    summary = {"spec": args.spec, "batch": args.batch, "steps": args.steps, "seed": args.seed,
               "warmup": args.warmup, "runs": runs, "errors": errors}
    path = workload_driver.summary_path(args.json, "torch_demo.json")
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)
        print("summary written to %s" % path)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
