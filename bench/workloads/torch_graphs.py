#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs through rmmc's PyTorch plug-in, side by side with PyTorch's
own allocator: one process per allocator (PyTorch picks its allocator once).

Each process:
  1. captures a ResNet-18 forward pass (eval, fp16, batch 16) with
     torch.cuda.graph, replays it 100 times on fresh inputs copied into the
     static input, and compares every replay's output with an eager run of
     the same input (bit for bit);
  2. captures a second graph into the first graph's memory pool
     (torch.cuda.graph(pool=...)), and replays both;
  3. trains a small MLP for 20 steps with make_graphed_callables and
     compares the losses with the same steps run eagerly;
  4. times a graphed inference loop (copy input, replay, synchronize):
     median milliseconds per iteration after warm-up;
  5. captures small temporaries (4 KiB, freed inside the capture) on a
     capture stream of its own, then fills tensors of the same size on that
     stream right after the capture and replays the graph 50 times: the
     tensors must keep their values (issue 25, F7: through a caching layer
     above the pool the graph's freed block came back and the replays
     overwrote it);
  6. captures ResNet-18 again while another thread runs eager convolutions
     on its own stream: both threads' results must match eager references
     (issue 25, F7: cuDNN failed in the other thread through
     `binning > pool > cuda`).
The rmmc process installs the plug-in with every hook (the graph pool
hooks too) over --spec (default "pool > cuda") and reports the pool's
figures (graph pools, device synchronizations).

    python3 bench/workloads/torch_graphs.py --lib build/librmmc.so [--json out.json]

Exit status: 0 when both ran and every comparison held, 1 otherwise, 2 for
bad arguments.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import workload_driver
import workload_rmmc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout
TAG = "TORCH_GRAPHS_RESULT "


def worker(args):
    rm = workload_rmmc.worker_load(args.worker, args.lib, args.spec)
    import torch
    import torchvision
    if rm is not None:
        workload_rmmc.use_torch()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    out = {"worker": args.worker, "spec": args.spec if rm else None}

    # 1. ResNet-18 forward, captured and replayed.
    model = torchvision.models.resnet18(weights=None).to(dev).half().eval()
    static_in = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.half)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as PyTorch's docs do
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g1 = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g1):
        static_out = model(static_in)
    mismatches = 0
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    with torch.no_grad():
        for i in range(100):
            x = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.half, generator=gen)
            static_in.copy_(x)
            g1.replay()
            ref = model(x)
            if not torch.equal(static_out, ref):
                mismatches += 1
    torch.cuda.synchronize()
    out["resnet18_replays"] = 100
    out["resnet18_mismatches"] = mismatches

    # 2. A second graph sharing the first one's pool.
    g2 = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g2, pool=g1.pool()):
        static_out2 = model(static_in) * 2
    with torch.no_grad():
        x = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.half, generator=gen)
        static_in.copy_(x)
        g1.replay()
        g2.replay()
        ok2 = torch.equal(static_out2, model(x) * 2) and torch.equal(static_out, model(x))
    out["shared_pool_equal"] = bool(ok2)

    # 3. make_graphed_callables: a training step, graphed and eager.
    def mlp():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10)).to(dev)
    losses = {}
    for mode in ("eager", "graphed"):
        net = mlp()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        data = torch.Generator(device=dev)
        data.manual_seed(4)
        sample = torch.randn(64, 512, device=dev, generator=data)
        if mode == "graphed":
            net = torch.cuda.make_graphed_callables(net, (sample,))
        seq = []
        for step in range(20):
            xb = torch.randn(64, 512, device=dev, generator=data)
            yb = torch.randint(0, 10, (64,), device=dev, generator=data)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            seq.append(loss.item())
        losses[mode] = seq
    out["graphed_callables_max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["eager"], losses["graphed"]))

    # 4. Timing: the graphed inference loop.
    xs = [torch.randn(16, 3, 224, 224, device=dev, dtype=torch.half, generator=gen) for _ in range(8)]
    times = []
    for i in range(args.iters + 20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        static_in.copy_(xs[i % len(xs)])
        g1.replay()
        torch.cuda.synchronize()
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e3)
    out["graphed_loop_median_ms"] = statistics.median(times)
    # 5. Right after a capture, on its stream: tensors of the graph's sizes.
    cs = torch.cuda.Stream()
    small_in = torch.randn(1024, device=dev)
    torch.cuda.synchronize()
    g3 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g3, stream=cs):
        a = small_in * 3.0          # 4 KiB temporaries, freed inside the capture
        b = a + 1.0
        del a
        small_out = b * b
        del b
    with torch.cuda.stream(cs):
        kept = [torch.full((1024,), float(k), device=dev) for k in range(8)]
    cs.synchronize()
    for _ in range(50):
        g3.replay()
    torch.cuda.synchronize()
    out["after_capture_overwritten"] = sum(
        int(not torch.equal(t, torch.full((1024,), float(k), device=dev))) for k, t in enumerate(kept))
    ref3 = small_in * 3.0 + 1.0
    out["small_graph_equal"] = bool(torch.equal(small_out, ref3 * ref3))
    del kept, g3

    # 6. A capture in this thread while another thread runs eager work.
    import threading
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(32, 8, 3, padding=1)).to(dev).half().eval()
    cin = torch.randn(8, 3, 64, 64, device=dev, dtype=torch.half)
    with torch.no_grad():
        cref = conv(cin)
    torch.cuda.synchronize()
    stop, errors = threading.Event(), []

    def eager_loop():
        s = torch.cuda.Stream()
        n = 0
        try:
            with torch.no_grad(), torch.cuda.stream(s):
                while not stop.is_set() or n < 5:
                    y = conv(cin)
                    s.synchronize()
                    if not torch.equal(y, cref):
                        errors.append("eager result %d differs" % n)
                    n += 1
        except Exception as e:  # cuDNN or the allocator failing in this thread
            errors.append("%s: %s" % (type(e).__name__, e))
    th = threading.Thread(target=eager_loop)
    th.start()
    g4 = torch.cuda.CUDAGraph()
    try:
        # thread_local: the other thread's synchronizations are legal meanwhile
        with torch.no_grad(), torch.cuda.graph(g4, capture_error_mode="thread_local"):
            static_out4 = model(static_in)
        with torch.no_grad():
            mism4 = 0
            for i in range(20):
                x = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.half, generator=gen)
                static_in.copy_(x)
                g4.replay()
                mism4 += int(not torch.equal(static_out4, model(x)))
    except Exception as e:
        errors.append("capture: %s: %s" % (type(e).__name__, e))
        mism4 = -1
    stop.set()
    th.join()
    torch.cuda.synchronize()
    out["capture_beside_thread_mismatches"] = mism4
    out["capture_beside_thread_errors"] = errors[:5]
    del g4

    out["max_memory_reserved"] = torch.cuda.max_memory_reserved() if rm is None else None
    if rm is not None:
        out["rmmc_layers"] = rm.stack_figures()
        out["plugin_last_error"] = rm.torch.last_error()
    del g2, g1
    torch.cuda.synchronize()
    print(TAG + json.dumps(out), flush=True)
    return 0


def run(mode, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--lib", args.lib,
           "--spec", args.spec, "--iters", str(args.iters)]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"worker": mode, "error": "timed out"}
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    tail = (p.stdout + p.stderr).strip().splitlines()[-30:]
    return {"worker": mode, "error": "exit %d" % p.returncode, "tail": tail}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "librmmc.so"))
    ap.add_argument("--spec", default="pool > cuda")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not os.path.exists(args.lib):
        print("torch_graphs.py: no library at %s" % args.lib, file=sys.stderr)
        return 2
    results = [run("native", args), run("rmmc", args)]
    ok = True
    print("%-8s %10s %12s %12s %12s" % ("run", "mismatch", "shared pool", "graphed loss", "loop ms"))
    for r in results:
        if "error" in r:
            ok = False
            print("%-8s FAILED: %s\n  %s" % (r["worker"], r["error"], "\n  ".join(r.get("tail", []))))
            continue
        good = r["resnet18_mismatches"] == 0 and r["shared_pool_equal"] and \
            r["graphed_callables_max_loss_diff"] < 1e-4 and \
            r["after_capture_overwritten"] == 0 and r["small_graph_equal"] and \
            r["capture_beside_thread_mismatches"] == 0 and not r["capture_beside_thread_errors"]
        if not good:
            print("%-8s after capture overwritten %d, small graph %s, capture beside a thread: "
                  "%d mismatches, errors %s" % (r["worker"], r["after_capture_overwritten"],
                                                r["small_graph_equal"],
                                                r["capture_beside_thread_mismatches"],
                                                r["capture_beside_thread_errors"]))
        ok &= good
        print("%-8s %10d %12s %12.2e %12.3f" % (r["worker"], r["resnet18_mismatches"],
                                                 r["shared_pool_equal"],
                                                 r["graphed_callables_max_loss_diff"],
                                                 r["graphed_loop_median_ms"]))
    if all("error" not in r for r in results):
        ratio = results[1]["graphed_loop_median_ms"] / results[0]["graphed_loop_median_ms"]
        print("graphed loop, rmmc / native: %.3f" % ratio)
    path = workload_driver.summary_path(args.json, "torch_graphs.json")
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
