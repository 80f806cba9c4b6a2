#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rmmc's native PyTorch backend against PyTorch's own allocator, case by case.

Every case (one per row of issue 26's table) runs twice, each time in a
fresh process: once with PyTorch's native allocator ("torch"), once with
rmmc's native backend ("rmmc", rmmc.torch.use(SPEC, backend="native")).
Each run prints one JSON line of results; the driver compares the two runs
of a case (what must be equal is equal) and checks the rmmc run's own
assertions (rmmc's figures against PyTorch's), then prints a pass/fail
table and writes torch_native.json under $OUT (or --json). It never stops
at a failing case.

    PYTHONPATH=python RMMC_LIB=build/librmmc.so \
        python3 tests/python/gpu/torch_native_suite.py [--only CASE,...]

Exit status: 0 all passed, 1 a case failed, 77 no GPU or no torch (skip).
"""
import argparse
import json
import os
import subprocess
import sys
import time

TAG = "TORCH_NATIVE_CASE "
MODE = os.environ.get("RMMC_CASE_MODE")   # set in the case processes
SPEC = os.environ.get("RMMC_CASE_SPEC", "pool > cuda")

if MODE == "rmmc":
    # At import, so that torch.multiprocessing's spawned children (which
    # import this file as __mp_main__) install rmmc before they rebuild a
    # shared CUDA tensor.
    import rmmc.torch as _rt
    _BACKEND = _rt.use(SPEC, backend="native")
else:
    _BACKEND = None


class CaseFailure(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise CaseFailure(what)


# ---------------------------------------------------------------- the cases

def case_backend_name():
    import torch
    torch.zeros(1, device="cuda")
    name = torch.cuda.memory.get_allocator_backend()
    if MODE == "rmmc":
        check(name == "rmmc", "get_allocator_backend() is %r" % name)
    return {"compare": {"initialized": True}, "name": name}


def case_statistics():
    """A random sequence of allocations and frees: memory_allocated equals
    the bytes rmmc handed to PyTorch at every step; requested bytes and
    counts equal native PyTorch's."""
    import random
    import torch
    import rmmc
    rng = random.Random(7)
    live, requested_seq, count_seq = [], [], []
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_stats().get("requested_bytes.all.current", 0)
    base_count = torch.cuda.memory_stats().get("allocation.all.current", 0)
    peak = torch.cuda.memory_allocated()
    slack = 0  # most bytes the pool's in_use exceeded the bytes handed out
    for step in range(400):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))
        else:
            n = rng.choice([1, 100, 511, 512, 4096, 100000, 1 << 20, (1 << 20) + 1, 5 << 20,
                            rng.randint(1, 40 << 20)])
            live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        m = torch.cuda.memory_stats()
        requested_seq.append(m["requested_bytes.all.current"] - base)
        count_seq.append(m["allocation.all.current"] - base_count)
        alloc = torch.cuda.memory_allocated()
        peak = max(peak, alloc)
        check(torch.cuda.max_memory_allocated() == peak,
              "step %d: max_memory_allocated %d != %d" % (step, torch.cuda.max_memory_allocated(),
                                                         peak))
        check(torch.cuda.memory_reserved() >= alloc, "step %d: reserved < allocated" % step)
        if MODE == "rmmc":
            out = _BACKEND.bytes_out()
            check(alloc == out, "step %d: memory_allocated %d != bytes rmmc handed out %d"
                  % (step, alloc, out))
            figs = dict(rmmc.stack_figures()[0][1])
            if "in_use" in figs:
                # The pool may keep a sliver it does not split off a block.
                check(figs["in_use"] >= out, "step %d: pool in_use %d < %d"
                      % (step, figs["in_use"], out))
                slack = max(slack, figs["in_use"] - out)
                check(torch.cuda.memory_reserved() == figs["reserved"],
                      "step %d: memory_reserved %d != pool reserved %d"
                      % (step, torch.cuda.memory_reserved(), figs["reserved"]))
    torch.cuda.reset_peak_memory_stats()
    check(torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated(),
          "reset_peak_memory_stats left the peak above the current value")
    summary = torch.cuda.memory_summary()
    check("Allocated memory" in summary, "memory_summary() lacks its table")
    keys = sorted(torch.cuda.memory_stats().keys())
    del live
    return {"compare": {"requested": requested_seq, "counts": count_seq, "keys": keys},
            "pool_in_use_slack": slack}


def case_empty_cache():
    import torch
    xs = [torch.empty(8 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
    before = torch.cuda.memory_reserved()
    del xs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    check(after < before, "empty_cache left reserved at %d (from %d)" % (after, before))
    return {"compare": {"shrank": after < before, "allocated": torch.cuda.memory_allocated()}}


def case_cudnn_resnet():
    """cudnn.benchmark (cacheInfo) while training a ResNet-18."""
    import torch
    import torchvision
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    # Benchmarking times algorithms and keeps the fastest, which differs from
    # run to run (native against native too); deterministic limits the
    # choice to algorithms whose results do not depend on it.
    torch.backends.cudnn.deterministic = True
    model = torchvision.models.resnet18(weights=None, num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    losses = []
    for _ in range(5):
        x = torch.randn(16, 3, 64, 64, device="cuda", generator=g)
        y = torch.randint(0, 10, (16,), device="cuda", generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # Even among deterministic algorithms the benchmark's pick can differ
    # between two processes (H100: the first loss equal to 1e-5, later steps
    # within 1-2%): close to 2%, not bit for bit.
    return {"compare_close": {"losses": losses}, "rtol": 2e-2}


def case_compile_reduce_overhead():
    """torch.compile(mode="reduce-overhead"): CUDA graph trees over private
    pools, checkPoolLiveAllocations and checkpoints."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)).cuda()
    f = torch.compile(model, mode="reduce-overhead")
    outs = []
    for i in range(6):
        x = torch.full((32, 64), float(i) / 10, device="cuda")
        y = f(x)
        outs.append(float(y.sum().item()))
        y = f(x * 2)  # a second call before the first output is read again
        outs.append(float(y.sum().item()))
    with torch.no_grad():
        ref = float(model(torch.full((32, 64), 0.5, device="cuda")).sum().item())
    return {"compare_close": {"outputs": outs, "eager": [ref]}}


def case_cuda_graph():
    import torch
    s = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = x * 2 + 1  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        t = x * 2
        y = t + 1
        del t
    results = []
    for v in (1.0, 3.0):
        x.fill_(v)
        g.replay()
        torch.cuda.synchronize()
        results.append(float(y.sum().item()))
    pool = g.pool()
    if MODE == "rmmc":
        r = _BACKEND.pool_resource(pool)
        check(r is not None, "the graph's pool has no rmmc stack")
        figs = dict(r.layers()[0][1])
        check(figs.get("in_use", 1) > 0, "the graph pool holds nothing: %s" % figs)
    del g, y
    return {"compare": {"results": results}}


def case_mempool():
    """torch.cuda.MemPool + use_mem_pool: allocations land in the pool's
    own rmmc stack, and its memory goes back when the pool dies."""
    import gc
    import torch
    torch.zeros(1, device="cuda")
    pool = torch.cuda.MemPool()
    counts = [pool.use_count()]
    with torch.cuda.use_mem_pool(pool):
        counts.append(pool.use_count())
        x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # outside: default pool
    counts.append(pool.use_count())
    snap = torch.cuda.memory_snapshot(pool.id) if hasattr(torch.cuda, "memory_snapshot") else []
    in_pool = sum(b["size"] for s in snap for b in s["blocks"]
                  if b["state"] == "active_allocated")
    result = {"compare": {"use_counts": counts, "in_pool_at_least_x": in_pool >= x.numel()}}
    if MODE == "rmmc":
        r = _BACKEND.pool_resource(pool.id)
        check(r is not None, "MemPool has no rmmc stack of its own")
        figs = dict(r.layers()[0][1])
        check(3 << 20 <= figs.get("in_use", 0) < 4 << 20,
              "the pool's stack has in_use %s, not %d" % (figs.get("in_use"), 3 << 20))
        r.close()
        check(_BACKEND.pool_count() >= 1, "no private pool alive")
    pid = pool.id
    del x, pool
    gc.collect()
    torch.cuda.synchronize()
    if MODE == "rmmc":
        check(_BACKEND.pool_resource(pid) is None, "the pool's stack outlived the pool")
        check(_BACKEND.pool_count() == 0, "%d private pools left" % _BACKEND.pool_count())
    del y
    return result


def _pool_layer_figures(r):
    """The figures of the stack's pool layer (the first that reports
    "reserved"), or {}."""
    for _name, figs in r.layers():
        figs = dict(figs)
        if "reserved" in figs:
            return figs
    return {}


def case_mempool_segments():
    """snapshot(pool)'s segments are the pool's memory: stable while held
    (what ProcessGroupNCCL.register_mem_pool registers and
    deregister_mem_pool deregisters later), one per chunk or page mapping
    of rmmc's pool, adding up to its reserved bytes; the default pool's
    segments add up to memory_reserved(); growth and the pool's death show
    as segment_alloc / segment_free in the trace; _memory_viz renders it."""
    import gc
    import torch
    from torch.cuda import _memory_viz
    torch.zeros(1, device="cuda")
    dev = torch.cuda.current_device()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        small = torch.ones(8 << 18, device="cuda")  # 8 MiB
    before = torch.cuda.memory_snapshot(pool.id)
    with torch.cuda.use_mem_pool(pool):  # grows the pool; a block over several mappings
        big = torch.ones(256 << 18, device="cuda")
    after = torch.cuda.memory_snapshot(pool.id)
    seg = lambda s: (s["address"], s["total_size"])  # noqa: E731
    stable = {seg(s) for s in before} <= {seg(s) for s in after}
    grew = len(after) > len(before)
    owners = {tuple(s.get("segment_pool_id", pool.id)) for s in after}
    tiled = all(sum(b["size"] for b in s["blocks"]) == s["total_size"] for s in after)
    held = sum(b["size"] for s in after for b in s["blocks"] if b["state"] == "active_allocated")
    snap = torch.cuda.memory._snapshot()
    everything = sum(s["total_size"] for s in snap["segments"])
    reserved = torch.cuda.memory_reserved()
    html = _memory_viz.segment_plot(snap)
    trace_html = _memory_viz.trace_plot(snap)
    check(len(html) > 1000 and len(trace_html) > 1000, "_memory_viz rendered nothing")
    check(stable, "segments of the pool changed when it grew: %s -> %s"
          % (sorted(seg(s) for s in before), sorted(seg(s) for s in after)))
    check(grew, "the pool did not show a new segment after growing")
    check(tiled, "blocks do not tile the pool's segments")
    check(held == small.numel() * 4 + big.numel() * 4,
          "the pool's segments hold %d allocated bytes" % held)
    check(everything == reserved, "segments add up to %d, memory_reserved() is %d"
          % (everything, reserved))
    addrs = {s["address"] for s in after}
    pid = pool.id
    result = {"compare": {"stable": stable, "grew": grew, "tiled": tiled,
                          "segments_equal_reserved": everything == reserved,
                          "owner_is_pool": owners == {tuple(pid)}}}
    if MODE == "rmmc":
        r = _BACKEND.pool_resource(pid)
        check(r is not None, "MemPool has no rmmc stack of its own")
        figs = _pool_layer_figures(r)
        r.close()
        mine = sum(s["total_size"] for s in after)
        check(mine == figs.get("reserved"), "the pool's segments add up to %d, its reserved is %s"
              % (mine, figs.get("reserved")))
        count = figs.get("mappings", figs.get("regions"))
        check(len(after) == count, "%d segments, the pool holds %s mappings/chunks (%s)"
              % (len(after), count, figs))
        result["pool"] = {"segments": len(after), "reserved": mine}
        # A user's hooks on the default stack ride on the backend's: they
        # hear what it holds (= the default pool's segments), its growth,
        # and everything when removed; the snapshot keeps its segments.
        import rmmc
        user_held = {}
        rmmc.set_memory_hooks(lambda p, n: user_held.__setitem__(p, n),
                              lambda p, n: user_held.pop(p), device=dev)
        default = {seg(s) for s in torch.cuda.memory_snapshot()
                   if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)}
        check(set(user_held.items()) == default, "the user's hooks hold %d ranges, the default pool "
              "%d segments" % (len(user_held), len(default)))
        grown = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")
        default = {seg(s) for s in torch.cuda.memory_snapshot()
                   if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)}
        check(set(user_held.items()) == default, "after growth: hooks %d ranges, segments %d"
              % (len(user_held), len(default)))
        rmmc.set_memory_hooks(device=dev)
        check(not user_held, "%d ranges still held by the removed hooks" % len(user_held))
        check({seg(s) for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)} == default,
              "removing the user's hooks changed the snapshot")
        del grown
    del small, big, pool
    gc.collect()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][dev]
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e["addr"] for e in trace if e["action"] == "segment_alloc" and e["addr"] in addrs]
    frees = [e["addr"] for e in trace if e["action"] == "segment_free" and e["addr"] in addrs]
    if MODE == "rmmc":  # PyTorch keeps a dead pool's segments cached until empty_cache
        check(sorted(allocs) == sorted(addrs), "segment_alloc entries %d for %d segments"
              % (len(allocs), len(addrs)))
        check(sorted(frees) == sorted(addrs), "segment_free entries %d for %d segments"
              % (len(frees), len(addrs)))
    return result


def case_snapshot():
    """_record_memory_history + _snapshot/_dump_snapshot: _memory_viz
    renders it, tools/torch_snapshot_to_csv.py reads it, segments hold
    every live block and add up to memory_allocated."""
    import pickle
    import tempfile
    import torch
    from torch.cuda import _memory_viz
    torch.zeros(1, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=10000)
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 2 << 20, 7 << 20)]
    tmp = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    del tmp
    snap = torch.cuda.memory._snapshot()
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    html = _memory_viz.trace_plot(snap)
    seg_html = _memory_viz.segment_plot(snap)
    check(len(html) > 1000 and len(seg_html) > 1000, "_memory_viz rendered nothing")
    check(len(_memory_viz.segsum(snap)) > 0 and len(_memory_viz.trace(snap)) > 0,
          "_memory_viz.segsum/trace produced nothing")
    allocated = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    check(allocated == torch.cuda.memory_allocated(),
          "snapshot blocks add up to %d, memory_allocated is %d"
          % (allocated, torch.cuda.memory_allocated()))
    for t in keep:
        p = t.data_ptr()
        check(any(s["address"] <= p < s["address"] + s["total_size"] for s in snap["segments"]),
              "block %#x is in no segment" % p)
    for s in snap["segments"]:
        check(sum(b["size"] for b in s["blocks"]) == s["total_size"],
              "segment %#x: blocks do not tile it" % s["address"])
    trace = snap["device_traces"][torch.cuda.current_device()]
    actions = [e["action"] for e in trace if e["action"] in ("alloc", "free_requested")]
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    frames = any(e.get("frames") for e in trace if e["action"] == "alloc")
    check(frames, "no trace entry has frames")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    tool = os.path.join(root, "tools", "torch_snapshot_to_csv.py")
    rows = None
    if os.path.exists(tool):
        out = subprocess.run([sys.executable, tool, path], capture_output=True, text=True)
        check(out.returncode == 0, "torch_snapshot_to_csv.py failed: %s" % out.stderr[-500:])
        rows = len([l for l in out.stdout.splitlines()[1:] if l.strip()])
    with open(path, "rb") as f:
        check("segments" in pickle.load(f), "the dumped snapshot has no segments")
    if MODE == "rmmc":
        import rmmc
        figs = dict(rmmc.stack_figures()[0][1])
        if "reserved" in figs:
            total = sum(s["total_size"] for s in snap["segments"])
            # The segments are what the pool holds, free ones too.
            check(total == figs["reserved"], "segments add up to %d, rmmc's reserved is %d"
                  % (total, figs["reserved"]))
    del keep
    return {"compare": {"actions": actions, "allocs": len(sizes), "csv_rows": rows},
            "sizes": sizes}


def case_out_of_memory():
    """torch.OutOfMemoryError with PyTorch's first sentence, the observers
    called, and the process allocating again."""
    import torch
    torch.zeros(1, device="cuda")
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(
        lambda device, alloc, total, free: seen.append((device, total)))
    _, total = torch.cuda.mem_get_info()
    caught, message = None, ""
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        caught, message = "OutOfMemoryError", str(e)
    except Exception as e:  # noqa: BLE001 (the wrong type is what we report)
        caught, message = type(e).__name__, str(e)
    check(caught == "OutOfMemoryError", "caught %s: %s" % (caught, message[:300]))
    check(message.startswith("CUDA out of memory. Tried to allocate "),
          "message: %r" % message[:200])
    check(" has a total capacity of " in message, "no capacity in %r" % message[:300])
    x = torch.ones(1 << 20, device="cuda")
    ok = float(x.sum().item()) == float(1 << 20)
    check(ok, "allocating after the OOM failed")
    ooms = torch.cuda.memory_stats().get("num_ooms", 0)
    return {"compare": {"caught": caught, "observer_calls": len(seen), "num_ooms": ooms,
                        "first_sentence": message.split(". ")[0], "after": ok},
            "message": message[:600]}


def case_memory_fraction():
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.set_per_process_memory_fraction(0.05)
    _, total = torch.cuda.mem_get_info()
    try:
        torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
        refused = False
    except torch.OutOfMemoryError:
        refused = True
    small = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    frac = None
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        frac = torch.cuda.get_per_process_memory_fraction()
    del small
    return {"compare": {"refused": refused, "fraction": frac}}


def case_record_stream():
    """A block used on another stream and freed: its memory is not reused
    before that stream's work is done."""
    import torch
    side = torch.cuda.Stream()
    results = []
    for _ in range(5):
        x = torch.ones(16 << 20, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # ~ tens of ms of GPU time first
            y = x * 3
        x.record_stream(side)
        del x
        z = torch.zeros(16 << 20, device="cuda")  # may reuse x's memory: must wait
        z += 7
        torch.cuda.synchronize()
        results.append(float(y.sum().item()))
        del y, z
    return {"compare": {"sums": results}}


def _ipc_child(q_in, q_out):
    import torch
    t = q_in.get()
    s = float(t.sum().item())
    t.add_(1)
    torch.cuda.synchronize()
    q_out.put((s, torch.cuda.memory.get_allocator_backend()))
    q_in.get()  # hold the tensor until the parent has read it


def case_multiprocessing():
    """Two processes share a CUDA tensor through torch.multiprocessing."""
    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(q_in, q_out))
    p.start()
    t = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    q_in.put(t)
    s, child_backend = q_out.get(timeout=300)
    torch.cuda.synchronize()
    after = float(t.sum().item())
    q_in.put(None)
    p.join(120)
    check(p.exitcode == 0, "the child exited with %s" % p.exitcode)
    if MODE == "rmmc":
        check(child_backend == "rmmc", "the child's allocator is %r" % child_backend)
    return {"compare": {"child_sum": s, "parent_after": after}}


def _ddp_worker():
    """One rank of the ddp case (under torchrun): 5 DDP steps, rank 0 prints
    the losses."""
    import torch
    import torch.distributed as dist
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator(device="cuda")
    g.manual_seed(rank)
    losses = []
    for _ in range(5):
        x = torch.randn(64, 256, device="cuda", generator=g)
        y = torch.randint(0, 10, (64,), device="cuda", generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    backend = torch.cuda.memory.get_allocator_backend()
    dist.destroy_process_group()
    if rank == 0:
        print("DDP_RESULT " + json.dumps({"losses": losses, "backend": backend}), flush=True)


def case_ddp():
    """DDP over NCCL on two GPUs (torchrun); skipped with fewer."""
    import torch
    if torch.cuda.device_count() < 2:
        return {"compare": {"skipped": "fewer than 2 GPUs"}, "skip": True}
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", os.path.abspath(__file__), "--ddp-worker"],
                       capture_output=True, text=True, env=env, timeout=240)
    check(p.returncode == 0, "torchrun exited %d: %s" % (p.returncode, (p.stdout + p.stderr)[-800:]))
    out = [l for l in p.stdout.splitlines() if l.startswith("DDP_RESULT ")]
    check(out, "no result from rank 0")
    r = json.loads(out[-1][len("DDP_RESULT "):])
    if MODE == "rmmc":
        check(r["backend"] == "rmmc", "the ranks' allocator is %r" % r["backend"])
    return {"compare_close": {"losses": r["losses"]}}


# ---------------------------------------------- capture safety and sharing

def _capture_storm(mode, captures=10):
    """Thread A captures a ResNet-18 forward `captures` times, each into a
    new CUDAGraph with capture_error_mode=`mode` (each output replaces the
    last inside the next capture, so the previous graph's pool dies during
    a capture), replays each and checks it against eager; thread B
    allocates, fills and frees tensors on its own stream all the while."""
    import random
    import threading
    import torch
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).cuda().eval()
    x = torch.randn(8, 3, 64, 64, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm), torch.no_grad():
        for _ in range(3):
            ref = model(x)
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    ref = ref.clone()
    stop = threading.Event()
    side = {"allocs": 0, "errors": []}

    def thread_b():
        s = torch.cuda.Stream()
        rng = random.Random(1)
        live = []
        with torch.cuda.stream(s):
            while not stop.is_set():
                try:
                    n = rng.choice([1 << 10, 1 << 16, 1 << 20, (3 << 20) + 5, 17 << 20])
                    live.append(torch.empty(n, dtype=torch.uint8, device="cuda").fill_(7))
                    side["allocs"] += 1
                    if len(live) > 12 or rng.random() < 0.5:
                        live.pop(rng.randrange(len(live)))
                except Exception as e:  # noqa: BLE001 (what broke is the result)
                    side["errors"].append("%s: %s" % (type(e).__name__, str(e)[:160]))
                    break
            del live
            s.synchronize()

    tb = threading.Thread(target=thread_b)
    tb.start()
    ok, errors = 0, []
    try:
        for i in range(captures):
            g = torch.cuda.CUDAGraph()
            try:
                with torch.no_grad(), torch.cuda.graph(g, capture_error_mode=mode):
                    out = model(x)
                g.replay()
                torch.cuda.synchronize()
                if torch.allclose(out, ref, rtol=1e-3, atol=1e-3):
                    ok += 1
                else:
                    errors.append("replay %d differs from eager" % i)
            except Exception as e:  # noqa: BLE001
                errors.append("capture %d: %s: %s" % (i, type(e).__name__, str(e)[:200]))
                break  # a broken capture can leave the stream capturing
    finally:
        stop.set()
        tb.join()
    return {"captures_ok": ok, "errors": errors, "side_errors": side["errors"][:3],
            "side_allocated": side["allocs"] > 0}


def case_concurrent_capture():
    """Concurrent capture (issue 42): thread_local and relaxed captures of
    a ResNet-18 forward while another thread allocates on its own stream;
    10 of 10 captures replay as eager in each mode. (global mode fails
    natively too: the other thread's allocations are what it forbids.)"""
    import torch
    torch.zeros(1, device="cuda")
    out = {mode: _capture_storm(mode) for mode in ("thread_local", "relaxed")}
    result = {"compare": {m: {"captures_ok": r["captures_ok"], "side_errors": r["side_errors"],
                              "side_allocated": r["side_allocated"]}
                          for m, r in out.items()},
              "detail": out}
    for m, r in out.items():
        check(r["captures_ok"] == 10, "%s: %d of 10 captures: %s" % (m, r["captures_ok"],
                                                                      r["errors"][:2]))
    # What stays after the storms, as natively: a private pool lives on
    # while a block of it does (cuBLAS keeps a workspace per stream, made
    # in the capture's pool), so the pools that hold segments after
    # empty_cache are compared with native PyTorch's, from the snapshot.
    import gc
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pools = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()
                    if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)})
    result["compare"]["pools_with_segments_after_empty_cache"] = len(pools)
    if MODE == "rmmc":
        result["pools_alive"] = _BACKEND.pool_count()
        result["pools_described"] = _BACKEND.pools_describe()
        check(_BACKEND.pool_count() == len(pools), "%d private pools alive, %d hold segments: %s"
              % (_BACKEND.pool_count(), len(pools), _BACKEND.pools_describe()))
    return result


def case_failed_capture():
    """A capture that fails leaves the allocator as it was: a Python
    exception raised inside torch.cuda.graph, an out-of-memory error inside
    one (test_graph_capture_oom), then a capture CUDA invalidates (a
    synchronizing .item() inside it). After each the next capture replays
    right, memory_allocated is back where it was, and empty_cache gives
    memory back (a capture left behind would block it)."""
    import gc
    import torch
    torch.zeros(1, device="cuda")
    x = torch.ones(1 << 16, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    res = {}

    def good_capture():
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = x * 3 + 1
            x.fill_(2.0)
            g.replay()
            torch.cuda.synchronize()
            v = float(y.sum().item())
            x.fill_(1.0)
            del g, y
            gc.collect()
            torch.cuda.synchronize()
            return v
        except Exception as e:  # noqa: BLE001
            return "%s" % type(e).__name__

    def gives_back():
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del big
        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved() < before

    def raise_inside():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            t = x * 2  # noqa: F841 (a block of the capture's pool, freed as the frame goes)
            raise ValueError("inside the capture")

    try:
        raise_inside()
    except ValueError:
        res["raised"] = "ValueError"
    gc.collect()
    res["after_raise"] = good_capture()
    res["allocated_back_after_raise"] = torch.cuda.memory_allocated() == base
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(2 ** 40, device="cuda")
        res["oom"] = "no error"
    except torch.OutOfMemoryError:
        res["oom"] = "OutOfMemoryError"
    except RuntimeError as e:
        res["oom"] = "RuntimeError"
        res["oom_message"] = str(e)[:200]
    gc.collect()
    res["after_oom"] = good_capture()
    res["allocated_back_after_oom"] = torch.cuda.memory_allocated() == base
    res["empty_cache_gives_back"] = gives_back()
    if MODE == "rmmc":
        res["pools_left"] = _BACKEND.pool_count()
        check(_BACKEND.pool_count() == 0, "%d private pools left after a raise and an OOM "
              "in captures and empty_cache" % _BACKEND.pool_count())
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            (x * 2).sum().item()
        res["invalidated"] = "no error"
    except RuntimeError:
        res["invalidated"] = "RuntimeError"
    gc.collect()
    torch.cuda.synchronize()
    res["after_invalidated"] = good_capture()
    # PyTorch's own allocator keeps counting the invalidated capture as
    # underway (its capture_end threw before ending the routing), so its
    # empty_cache then gives nothing back: rmmc's need not match that.
    after_invalidated = gives_back()
    if MODE == "rmmc":
        check(after_invalidated, "empty_cache gave nothing back after an invalidated capture")
    check(res.get("oom") == "OutOfMemoryError", "OOM in a capture: %s" % res.get("oom_message"))
    check(res["after_raise"] == res["after_oom"] == float(7 * (1 << 16)),
          "captures after the failures replayed %s and %s" % (res["after_raise"],
                                                            res["after_oom"]))
    return {"compare": {k: v for k, v in res.items() if k not in ("oom_message", "pools_left")},
            "detail": dict(res, empty_cache_gives_back_after_invalidated=after_invalidated)}


def _share_child(q_in, q_out):
    import torch
    ts = q_in.get()
    sums = []
    for k, t in enumerate(ts):
        sums.append(float(t.double().sum().item()))
        t.add_(k + 1)
    torch.cuda.synchronize()
    q_out.put((sums, torch.cuda.memory.get_allocator_backend()))
    q_in.get()  # hold the tensors until the parent has read them


SHARE_SIZES = (1, 1000, 1 << 18, (1 << 18) + 3, 10 << 20, 75 << 20)  # float32 elements


def case_share_default():
    """torch.multiprocessing shares tensors of the default stack as
    rmmc.torch.use("pool > cuda") builds it (no ipc option written: pages
    are shareable by default under PyTorch), of sizes from 4 bytes to 300
    MiB; a spawned child reads each, adds k + 1 to the k-th, the parent
    reads the sums back."""
    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_share_child, args=(q_in, q_out))
    p.start()
    ts = [torch.arange(n, dtype=torch.float32, device="cuda").remainder_(97) for n in SHARE_SIZES]
    before = [float(t.double().sum().item()) for t in ts]
    q_in.put(ts)
    sums, child_backend = q_out.get(timeout=300)
    torch.cuda.synchronize()
    after = [float(t.double().sum().item()) for t in ts]
    q_in.put(None)
    p.join(120)
    check(p.exitcode == 0, "the child exited with %s" % p.exitcode)
    check(sums == before, "the child read %s, the parent wrote %s" % (sums, before))
    want = [b + (k + 1) * n for k, (b, n) in enumerate(zip(before, SHARE_SIZES))]
    check(after == want, "the parent read back %s, not %s" % (after, want))
    result = {"compare": {"child_read": sums, "parent_after": after}}
    if MODE == "rmmc":
        check(child_backend == "rmmc", "the child's allocator is %r" % child_backend)
        import rmmc
        layers = dict(rmmc.stack_figures()[0][1]) if rmmc.stack_figures() else {}
        result["stack"] = {k: v for k, v in layers.items() if k in ("ipc", "page")}
    return result


def case_sharing_cost():
    """What shareable pages cost (rmmc only): a fresh `pool > cuda` grows
    by 64 page mappings of 32 MiB, with and without ipc (POSIX descriptor
    handles), three rounds each; then 20,000 allocate/free pairs of 1 MiB
    in steady state. Medians; the native run reports nothing."""
    import statistics
    import time
    if MODE != "rmmc":
        return {"compare": {}}
    import rmmc
    grow, steady = {}, {}
    for ipc in ("false", "true"):
        spec = "pool > cuda(ipc=%s)" % ipc
        per = []
        for _ in range(3):
            with rmmc.Resource(spec) as r:
                ptrs = []
                t0 = time.perf_counter_ns()
                for _ in range(64):
                    ptrs.append(r.allocate(32 << 20))
                t1 = time.perf_counter_ns()
                for q in ptrs:
                    r.deallocate(q, 32 << 20)
            per.append((t1 - t0) / 64 / 1000.0)
        grow[ipc] = statistics.median(per)
        with rmmc.Resource(spec) as r:
            q = r.allocate(1 << 20)
            r.deallocate(q, 1 << 20)
            t0 = time.perf_counter_ns()
            for _ in range(20000):
                q = r.allocate(1 << 20)
                r.deallocate(q, 1 << 20)
            steady[ipc] = (time.perf_counter_ns() - t0) / 20000.0
    return {"compare": {}, "growth_us_per_32MiB_mapping": grow,
            "growth_ipc_over_plain": grow["true"] / grow["false"],
            "steady_ns_per_1MiB_pair": steady,
            "steady_ipc_over_plain": steady["true"] / steady["false"]}


CASES = {
    "backend_name": case_backend_name,
    "statistics": case_statistics,
    "empty_cache": case_empty_cache,
    "cudnn_resnet": case_cudnn_resnet,
    "compile_reduce_overhead": case_compile_reduce_overhead,
    "cuda_graph": case_cuda_graph,
    "mempool": case_mempool,
    "snapshot": case_snapshot,
    "mempool_segments": case_mempool_segments,
    "out_of_memory": case_out_of_memory,
    "memory_fraction": case_memory_fraction,
    "record_stream": case_record_stream,
    "multiprocessing": case_multiprocessing,
    # the same sharing over an expandable pool (descriptors via pidfd_getfd)
    "multiprocessing_vm": case_multiprocessing,
    "ddp": case_ddp,
    # issue 42: capture safety on every stack, sharing on the default stack
    "concurrent_capture": case_concurrent_capture,
    "concurrent_capture_chunks": case_concurrent_capture,
    "concurrent_capture_binning": case_concurrent_capture,
    "concurrent_capture_arena": case_concurrent_capture,
    "failed_capture": case_failed_capture,
    "share_default": case_share_default,
    "sharing_cost": case_sharing_cost,
}
# Cases whose rmmc run uses another spec than --spec.
CASE_SPECS = {"multiprocessing": "pool(expandable=false) > cuda",
              "multiprocessing_vm": "pool > cuda(ipc=true)",
              "concurrent_capture": "pool > cuda",
              "concurrent_capture_chunks": "pool(expandable=false) > cuda",
              "concurrent_capture_binning": "binning > pool > cuda",
              "concurrent_capture_arena": "arena > cuda",
              "share_default": "pool > cuda"}
# Cases not in the default run (scripts/gpu-torch --issue42 names them).
EXTRA_CASES = ("concurrent_capture", "concurrent_capture_chunks", "concurrent_capture_binning",
               "concurrent_capture_arena", "failed_capture", "share_default", "sharing_cost")


def run_case(name):
    t0 = time.time()
    try:
        out = CASES[name]()
        out["ok"] = True
    except CaseFailure as e:
        out = {"ok": False, "error": "check failed: %s" % e}
    except Exception as e:  # noqa: BLE001
        import traceback
        out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e),
               "traceback": traceback.format_exc()[-2000:]}
    out["seconds"] = round(time.time() - t0, 2)
    print(TAG + json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------- the driver

def spawn(name, mode, spec, timeout):
    env = dict(os.environ)
    env["RMMC_CASE_MODE"] = mode
    env["RMMC_CASE_SPEC"] = spec
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("RMMC_TORCH_AUTOLOAD", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--case", name]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"ok": False, "error": "timed out after %d s" % timeout,
                "log": ((e.stdout or b"") if isinstance(e.stdout, str) else "")[-1500:]}
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    return {"ok": False, "error": "no result (exit status %d)" % p.returncode,
            "log": (p.stdout + p.stderr)[-3000:]}


def close(a, b, rtol=1e-3, atol=1e-4):
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rtol, atol) for x, y in zip(a, b))
    return abs(a - b) <= atol + rtol * abs(b)


def compare(t, r):
    """Why the rmmc run differs from the torch run ("" if it does not)."""
    if not t.get("ok"):
        return "the native PyTorch run failed: %s" % t.get("error")
    if not r.get("ok"):
        return r.get("error", "failed")
    for k, v in t.get("compare", {}).items():
        if r.get("compare", {}).get(k) != v:
            return "%s differs: torch %s, rmmc %s" % (k, str(v)[:200],
                                                      str(r.get("compare", {}).get(k))[:200])
    for k, v in t.get("compare_close", {}).items():
        rv = r.get("compare_close", {}).get(k)
        if rv is None or not close(rv, v, rtol=t.get("rtol", 1e-3)):
            return "%s not close: torch %s, rmmc %s" % (k, str(v)[:200], str(rv)[:200])
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", help="comma-separated cases (default: all but the issue-42 ones: "
                    + ", ".join(EXTRA_CASES) + ")")
    ap.add_argument("--parallel", type=int, default=1,
                    help="processes at once (cases that share the GPU's memory politely)")
    ap.add_argument("--spec", default="pool > cuda")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per process")
    ap.add_argument("--json", help="default: $OUT/torch_native.json")
    args = ap.parse_args()
    if args.ddp_worker:
        return _ddp_worker()
    if args.case:
        return run_case(args.case)
    try:
        import torch
    except ImportError:
        print("torch_native_suite: no torch: skipped")
        return 77
    if not torch.cuda.is_available():
        print("torch_native_suite: no GPU: skipped")
        return 77
    names = args.only.split(",") if args.only else [c for c in CASES if c not in EXTRA_CASES]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print("torch_native_suite: unknown case(s) %s (known: %s)" % (", ".join(unknown),
                                                                     ", ".join(CASES)))
        return 2
    # Variants of one case (another spec) share its native run.
    native_of = {}
    for name in names:
        native_of.setdefault(CASES[name], name)
    jobs = {("torch", native_of[CASES[n]]) for n in names} | {("rmmc", n) for n in names}
    import concurrent.futures
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, args.parallel)) as pool:
        futures = {pool.submit(spawn, n, mode, CASE_SPECS.get(n, args.spec), args.timeout):
                   (mode, n) for mode, n in sorted(jobs)}
        for f in concurrent.futures.as_completed(futures):
            results[futures[f]] = f.result()
    rows, failed = [], 0
    for name in names:
        spec = CASE_SPECS.get(name, args.spec)
        t = results[("torch", native_of[CASES[name]])]
        r = results[("rmmc", name)]
        why = compare(t, r)
        status = "PASS" if not why else "FAIL"
        if not why and t.get("skip"):
            status, why = "SKIP", t["compare"].get("skipped", "skipped")
        if why and name in ("multiprocessing_vm", "share_default") and \
                "Operation not permitted" in why:
            # pidfd_getfd needs ptrace permission over the exporter (Yama
            # ptrace_scope=1 refuses a child reading its parent), as
            # PyTorch's own expandable segments do: a property of the host.
            status, why = "SKIP", "pidfd_getfd refused (ptrace_scope): " + why[:200]
        failed += status == "FAIL"
        rows.append({"case": name, "status": status, "why": why, "spec": spec,
                     "torch": t, "rmmc": r})
        print("%-26s %s  (torch %.1fs, rmmc %.1fs)%s" % (
            name, status, t.get("seconds", 0) or 0, r.get("seconds", 0) or 0,
            "" if not why else "\n    " + why), flush=True)
        if status == "FAIL":
            for side, res in (("torch", t), ("rmmc", r)):
                if res.get("traceback") or res.get("log"):
                    print("    [%s] %s" % (side, (res.get("traceback") or res.get("log"))
                                          .replace("\n", "\n    [%s] " % side)[-2500:]))
    print("\n%-26s %s" % ("case", "result"))
    for row in rows:
        print("%-26s %s%s" % (row["case"], row["status"],
                              "" if not row["why"] else "  " + row["why"][:150]))
    print("torch_native_suite: %d of %d cases passed, %d skipped (torch %s, %s)"
          % (sum(r["status"] == "PASS" for r in rows), len(rows),
             sum(r["status"] == "SKIP" for r in rows), torch.__version__,
             torch.cuda.get_device_name()))
    path = args.json or (os.path.join(os.environ["OUT"], "torch_native.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "spec": args.spec, "cases": rows}, f,
                      indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
