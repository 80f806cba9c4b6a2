#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sleep mode under PyTorch (issue 29): a model whose weights live in one
pool and a cache in another, with a captured CUDA graph; each case in a
fresh interpreter (an allocator is chosen before CUDA starts).

mempool (the native backend, rmmc.torch.use's default): the weights in one
  torch.cuda.MemPool, the "KV cache" and the static input in another, made
  with rmmc.torch.mem_pool("pool > cuda") (an expandable rmmc pool each);
  the CUDA graph is captured into the cache's pool (torch.cuda.graph(pool=
  cache.id)) and writes the cache. Then
    pause   rmmc.torch.pause(pool=weights, mode="backup") and
            pause(pool=cache, mode="discard"): torch.cuda.mem_get_info must
            show >= 95% of both pools' reserved bytes free, and
            torch.cuda.memory_reserved() drop by as much; allocating into a
            paused pool raises torch.OutOfMemoryError ("paused"), the
            default pool keeps working;
  other   a second process allocates that memory (more than was free
          before), writes it and gives it back;
  resume  the cache first (it allocates again while the weights still
          sleep: the pools are independent), then the weights: every tensor
          has the same data_ptr, the weights are bit-identical (two 64-bit
          hashes per tensor computed on the GPU, and sampled values), and
          after the static input is written again (it was discarded) the
          graph's replay gives the same output and cache bit for bit;
  again   a second cycle, both discarded, gives the memory back too.
resource (the plug-in): the same with the weights in an rmmc.Resource("pool
  > cuda") (tensors over __cuda_array_interface__) and the cache, input and
  graph in the stack PyTorch allocates from (rmmc.torch.pause()).

Every check runs even when an earlier one failed; each prints ok/FAIL, each
case PASS/FAIL, and --json gets every figure.

  RMMC_LIB=build/librmmc.so PYTHONPATH=python python3 bench/workloads/torch_sleep.py \\
      [--cases mempool,resource] [--weights 0.3] [--cache 0.35] [--json FILE]

--weights and --cache are fractions of the device's total memory. Exit 0
when every check passed, 1 otherwise, 77 without a GPU or PyTorch.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

GiB = 1 << 30
HIDDEN = 8192
CASES = ("mempool", "resource")


class _Block:
    """A block of an rmmc.Resource seen as a CUDA array (freed with it)."""

    def __init__(self, res, shape, typestr, itemsize):
        n = itemsize
        for d in shape:
            n *= d
        self.res, self.nbytes = res, n
        self.ptr = res.allocate(n)
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (self.ptr, False), "strides": None,
                                         "version": 2}

    def __del__(self):
        try:
            self.res.deallocate(self.ptr, self.nbytes)
        except Exception:
            pass


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print("  %s %s" % ("ok  " if ok else "FAIL", what), flush=True)
        if not ok:
            self.failures.append(what)
        return ok


def hashes(params):
    """Two 64-bit hashes per tensor, computed on the GPU, and 4096 values."""
    import torch
    out = []
    for p in params:
        v = p.detach().view(torch.int32).flatten().to(torch.int64)
        k = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
        out.append((int(v.sum()), int((v * k).sum()), p.detach().flatten()[:4096].cpu()))
        del v, k
    return out


def same_hashes(a, b):
    import torch
    return all(x[0] == y[0] and x[1] == y[1] and torch.equal(x[2], y[2]) for x, y in zip(a, b))


def other_process(nbytes, expect):
    """Another process allocates and writes nbytes, then gives them back."""
    code = ("import torch; x = torch.empty(%d, dtype=torch.uint8, device='cuda'); x.fill_(7); "
            "torch.cuda.synchronize(); print(int(x[-1])); del x" % nbytes)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=""))
    expect(r.returncode == 0 and r.stdout.strip() == "7",
           "a second process allocates and writes %.2f GiB given back (exit %d %s; %.1f s)" % (
               nbytes / GiB, r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:100],
               time.perf_counter() - t0))


def build_model(nlayers, make):
    """nlayers Linear(HIDDEN, HIDDEN) whose parameters come from make(shape)."""
    import torch
    model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, device="meta")
                                  for _ in range(nlayers)])
    for layer in model:
        for name in ("weight", "bias"):
            t = make((HIDDEN, HIDDEN) if name == "weight" else (HIDDEN,))
            t.normal_(0, 1.0 / HIDDEN ** 0.5)
            setattr(layer, name, torch.nn.Parameter(t, requires_grad=False))
    return model


def capture(model, static_x, cache, pool=None, warmup_pool=None):
    """Warms up on a side stream (its allocations in MemPool warmup_pool if
    given), then captures tanh(model(x)) writing the cache into graph pool
    `pool` (default: a new one); returns (graph, y)."""
    import contextlib
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    routed = (torch.cuda.use_mem_pool(warmup_pool) if warmup_pool is not None
              else contextlib.nullcontext())
    with routed, torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.no_grad():
        y = torch.tanh(model(static_x))
        cache[:y.numel()].copy_(y.flatten())
    graph.replay()
    torch.cuda.synchronize()
    return graph, y


def reference(params, cache, static_x, y):
    """Before the first pause: a case's tensors (the weights, the cache, the
    graph's static input and output), their data_ptrs, the weights' hashes
    and, on the host, the graph's output and the part of the cache it
    wrote: what check_resumed compares after a resume."""
    ref = {"params": params, "cache": cache, "static_x": static_x, "y": y}
    ref["host_y"], ref["host_cache"] = y.cpu(), cache[:y.numel()].cpu()
    ref["hashes"] = hashes(params)
    ref["tensors"] = params + [cache, static_x, y]
    ref["ptrs"] = [t.data_ptr() for t in ref["tensors"]]
    return ref


def same_ptrs(ref):
    return [t.data_ptr() for t in ref["tensors"]] == ref["ptrs"]


def check_resumed(ref, graph, x_host, expect):
    """After a resume: every tensor at its data_ptr, the weights
    bit-identical, and, once the static input is written again from x_host
    (it lived in the discarded cache), the graph's replay gives the same
    output and cache."""
    import torch
    y, cache = ref["y"], ref["cache"]
    expect(same_ptrs(ref), "every tensor keeps its data_ptr")
    expect(same_hashes(ref["hashes"], hashes(ref["params"])), "the weights are bit-identical")
    ref["static_x"].copy_(x_host)  # it lived in the discarded cache pool
    graph.replay()
    torch.cuda.synchronize()
    y_now = y.cpu()
    expect(torch.equal(y_now, ref["host_y"]),
           "the graph's replay gives the same output (max diff %g)"
           % float((y_now - ref["host_y"]).abs().max()))
    expect(torch.equal(cache[:y.numel()].cpu(), ref["host_cache"]),
           "the graph's replay writes the same cache")


def case_mempool(a, expect, out):
    import torch
    import rmmc.torch as rt
    rt.use("pool > cuda", backend="native")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    free0, total = torch.cuda.mem_get_info()
    print("torch_sleep mempool: %s, %.1f GiB total, %.1f GiB free; PyTorch %s, backend %s" % (
        torch.cuda.get_device_name(), total / GiB, free0 / GiB, torch.__version__,
        torch.cuda.memory.get_allocator_backend()), flush=True)
    weights_pool = rt.mem_pool("pool > cuda")
    cache_pool = rt.mem_pool("pool > cuda")
    with rt.pool_resource(weights_pool) as w0, rt.pool_resource(cache_pool) as c0:
        expect(weights_pool.id != cache_pool.id and w0.handle != c0.handle
               and [n for n, _ in w0.layers()] == [n for n, _ in c0.layers()] == ["pool", "cuda"],
               "two MemPools, each an rmmc stack `pool > cuda` of its own")
    nlayers = max(2, int(a.weights * total) // (HIDDEN * HIDDEN * 4))
    with torch.cuda.use_mem_pool(weights_pool):
        model = build_model(nlayers, lambda shape: torch.empty(shape, device=dev))
    params = list(model.parameters())
    with torch.cuda.use_mem_pool(cache_pool):
        cache = torch.zeros(int(a.cache * total) // 4, dtype=torch.float32, device=dev)
        x_host = torch.randn(64, HIDDEN)
        static_x = x_host.to(dev)
    # The warm-up's activations are cached in the cache pool for the capture.
    graph, y = capture(model, static_x, cache, pool=cache_pool.id, warmup_pool=cache_pool)
    ref = reference(params, cache, static_x, y)
    wres, cres = rt.pool_resource(weights_pool), rt.pool_resource(cache_pool)
    native = rt.build_native()

    def stack_of(t):
        r = native.block_resource(t.untyped_storage().data_ptr())
        if r is None:
            return None
        with r:
            return r.handle
    expect(all(stack_of(p) == wres.handle for p in params)
           and stack_of(cache) == stack_of(static_x) == stack_of(y) == cres.handle,
           "the parameters are blocks of the weights pool's stack; the cache, input and "
           "graph output of the cache pool's")
    wpool, cpool = dict(wres.layers())["pool"], dict(cres.layers())["pool"]
    reserved = int(wpool["reserved"]) + int(cpool["reserved"])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the default pool's cache (the hashes'): not the MemPools'
    free1, _ = torch.cuda.mem_get_info()
    torch_reserved1 = torch.cuda.memory_reserved()
    print("  weights pool %.2f GiB (%d layers), cache pool %.2f GiB; free %.2f GiB" % (
        wpool["reserved"] / GiB, nlayers, cpool["reserved"] / GiB, free1 / GiB), flush=True)

    t0 = time.perf_counter()
    rt.pause(pool=weights_pool, mode="backup")
    t1 = time.perf_counter()
    rt.pause(pool=cache_pool, mode="discard")
    t2 = time.perf_counter()
    free2, _ = torch.cuda.mem_get_info()
    given = free2 - free1
    ws, cs = rt.sleep_state(pool=weights_pool), rt.sleep_state(pool=cache_pool)
    out.update(reserved=reserved, given_back=given, pause_weights_s=t1 - t0,
               pause_cache_s=t2 - t1, weights_backed_up=int(ws["backed_up"]),
               param_bytes=sum(p.numel() * 4 for p in params))
    print("  pause: weights %.3f s (%.2f GiB backed up), cache %.3f s; free %.2f -> %.2f GiB" % (
        t1 - t0, ws["backed_up"] / GiB, t2 - t1, free1 / GiB, free2 / GiB), flush=True)
    expect(given >= 0.95 * reserved,
           "pause gives back >= 95%% of both pools' reserved bytes (%.1f%%)" % (
               100.0 * given / max(reserved, 1)))
    expect(ws["paused"] and ws["mode"] == "backup" and cs["paused"] and cs["mode"] == "discard"
           and ws["held"] == 0 and cs["held"] == 0 and cs["backed_up"] == 0
           and ws["backed_up"] >= out["param_bytes"],
           "sleep_state: both paused, nothing held, the weights backed up (%s / %s)" % (
               {k: ws[k] for k in ("paused", "mode", "held", "backed_up")},
               {k: cs[k] for k in ("paused", "mode", "held", "backed_up")}))
    torch_reserved2 = torch.cuda.memory_reserved()
    expect(torch_reserved1 - torch_reserved2 >= 0.95 * reserved,
           "torch.cuda.memory_reserved() drops by the pools' bytes (%.2f -> %.2f GiB)" % (
               torch_reserved1 / GiB, torch_reserved2 / GiB))
    try:
        with torch.cuda.use_mem_pool(cache_pool):
            torch.empty(1 << 20, device=dev)
        expect(False, "allocating into a paused MemPool raises")
    except torch.OutOfMemoryError as e:
        expect("paused" in str(e), "allocating into a paused MemPool raises "
               "torch.OutOfMemoryError (%s)" % str(e).splitlines()[0][:70])
    z = torch.ones(1 << 20, device=dev)
    expect(float(z.sum()) == float(1 << 20), "the default pool allocates while the MemPools sleep")
    del z

    other_n = int(reserved * 0.95) - int(1.5 * GiB)
    out["other_process_bytes"] = other_n
    print("  another process takes %.2f GiB (more than the %.2f GiB free before the pause: %s)"
          % (other_n / GiB, free1 / GiB, other_n > free1), flush=True)
    other_process(other_n, expect)

    t4 = time.perf_counter()
    rt.resume(pool=cache_pool)
    t5 = time.perf_counter()
    with torch.cuda.use_mem_pool(cache_pool):
        w = torch.full((1 << 20,), 3.0, device=dev)
    expect(float(w.sum()) == 3.0 * (1 << 20) and rt.sleep_state(pool=weights_pool)["paused"]
           and not rt.sleep_state(pool=cache_pool)["paused"],
           "the cache pool resumed alone allocates while the weights pool sleeps")
    del w
    rt.resume(pool=weights_pool)
    torch.cuda.synchronize()
    t6 = time.perf_counter()
    out.update(resume_cache_s=t5 - t4, resume_weights_s=t6 - t5)
    print("  resume: cache %.3f s, weights %.3f s" % (t5 - t4, t6 - t5), flush=True)
    check_resumed(ref, graph, x_host, expect)

    rt.pause(pool=weights_pool, mode="discard")
    rt.pause(pool=cache_pool, mode="discard")
    free3, _ = torch.cuda.mem_get_info()
    rt.resume(pool=cache_pool)
    rt.resume(pool=weights_pool)
    out["given_back_again"] = free3 - free1
    expect(free3 - free1 >= 0.95 * reserved, "a second pause gives the memory back too")
    expect(same_ptrs(ref), "... and the addresses stay")
    ws = rt.sleep_state(pool=weights_pool)
    expect(ws["pauses"] == 2 and ws["resumes"] == 2, "the weights pool counted 2 pauses and "
           "2 resumes (%d, %d)" % (ws["pauses"], ws["resumes"]))
    wres.close()
    cres.close()
    del graph, y, cache, static_x, model, params, ref


def case_resource(a, expect, out):
    import torch
    import rmmc
    import rmmc.torch as rt
    rt.use("pool > cuda", backend="plugin")  # PyTorch's stack is the registry's
    dev = torch.device("cuda")
    torch.manual_seed(0)
    free0, total = torch.cuda.mem_get_info()
    print("torch_sleep resource: %s, %.1f GiB total, %.1f GiB free; PyTorch %s, plug-in" % (
        torch.cuda.get_device_name(), total / GiB, free0 / GiB, torch.__version__), flush=True)
    wres = rmmc.Resource("pool > cuda", device=0)
    nlayers = max(2, int(a.weights * total) // (HIDDEN * HIDDEN * 4))
    blocks = []

    def make(shape):
        b = _Block(wres, shape, "<f4", 4)
        blocks.append(b)
        return torch.as_tensor(b, device=dev)
    model = build_model(nlayers, make)
    params = list(model.parameters())
    expect(all(p.data_ptr() == b.ptr for p, b in zip(params, blocks)),
           "every parameter lies in the weights pool")
    cache = torch.zeros(int(a.cache * total) // 4, dtype=torch.float32, device=dev)
    x_host = torch.randn(64, HIDDEN)
    static_x = x_host.to(dev)
    graph, y = capture(model, static_x, cache)
    ref = reference(params, cache, static_x, y)
    torch.cuda.synchronize()
    wres_pool = dict(wres.layers())["pool"]
    cache_pool = dict(rmmc.stack_figures())["pool"]
    reserved = int(wres_pool["reserved"]) + int(cache_pool["reserved"])
    free1, _ = torch.cuda.mem_get_info()
    print("  weights pool %.2f GiB (%d layers), cache pool %.2f GiB; free %.2f GiB" % (
        wres_pool["reserved"] / GiB, nlayers, cache_pool["reserved"] / GiB, free1 / GiB),
        flush=True)

    t0 = time.perf_counter()
    stream = torch.cuda.current_stream().cuda_stream
    wres.pause("backup", stream)
    t1 = time.perf_counter()
    rt.pause("discard")
    t2 = time.perf_counter()
    free2, _ = torch.cuda.mem_get_info()
    given = free2 - free1
    out.update(reserved=reserved, given_back=given, pause_weights_s=t1 - t0,
               pause_cache_s=t2 - t1, weights_backed_up=int(wres.sleep_state()["backed_up"]))
    print("  pause: weights %.3f s (%.2f GiB backed up), cache %.3f s; free %.2f -> %.2f GiB" % (
        t1 - t0, out["weights_backed_up"] / GiB, t2 - t1, free1 / GiB, free2 / GiB), flush=True)
    expect(given >= 0.95 * reserved,
           "pause gives back >= 95%% of both pools' reserved bytes (%.1f%%)" % (
               100.0 * given / max(reserved, 1)))
    try:
        torch.empty(1 << 20, device=dev)
        expect(False, "allocating a tensor while paused raises")
    except RuntimeError as e:
        expect("paused" in str(e), "allocating a tensor while paused raises (%s)" %
               str(e).splitlines()[0][:80])
    n = int(reserved * 0.95) - int(1.5 * GiB)
    out["other_process_bytes"] = n
    other_process(n, expect)

    t4 = time.perf_counter()
    rt.resume()
    wres.resume(stream)
    torch.cuda.synchronize()
    out["resume_s"] = time.perf_counter() - t4
    print("  resume: %.3f s" % out["resume_s"], flush=True)
    check_resumed(ref, graph, x_host, expect)
    z = torch.ones(1 << 20, device=dev) * 2
    expect(float(z.sum()) == 2.0 * (1 << 20), "new tensors work after resume")

    wres.pause("discard", stream)
    rt.pause("discard")
    free3, _ = torch.cuda.mem_get_info()
    rt.resume()
    wres.resume(stream)
    out["given_back_again"] = free3 - free1
    expect(free3 - free1 >= 0.95 * reserved, "a second pause gives the memory back too")
    expect(same_ptrs(ref), "... and the addresses stay")
    del graph, y, cache, static_x, z, ref


def run_one(case, a):
    """One case in this process; writes {"failures", figures...} to a.result."""
    import faulthandler
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(max(30, a.timeout - 20), exit=True)
    expect, out = Checks(), {"case": case}
    try:
        (case_mempool if case == "mempool" else case_resource)(a, expect, out)
    except Exception as e:  # a check that could not run is a failure, reported
        import traceback
        traceback.print_exc()
        expect(False, "the %s case ran to its end (%s: %s)" % (case, type(e).__name__, e))
    import torch
    out["device"] = torch.cuda.get_device_name()
    out["failures"] = expect.failures
    with open(a.result, "w") as f:
        json.dump(out, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--weights", type=float, default=0.3)
    ap.add_argument("--cache", type=float, default=0.35)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per case")
    ap.add_argument("--json")
    ap.add_argument("--case", help=argparse.SUPPRESS)   # internal: run one case here
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        return run_one(a.case, a)
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error("unknown case %s (the cases: %s)" % (", ".join(bad), ", ".join(CASES)))
    try:
        import torch
    except ImportError:
        print("torch_sleep: PyTorch is not installed: skipped")
        return 77
    if not torch.cuda.is_available():  # does not initialize CUDA in PyTorch
        print("torch_sleep: no CUDA device: skipped")
        return 77
    results, summary = {}, []
    for case in cases:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            path = tf.name
        cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--result", path,
               "--weights", str(a.weights), "--cache", str(a.cache), "--timeout", str(a.timeout)]
        try:
            rc = subprocess.run(cmd, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out after %d s" % a.timeout
        try:
            with open(path) as f:
                out = json.load(f)
        except (OSError, ValueError):
            out = {"failures": ["the %s case left no result (exit %s)" % (case, rc)]}
        os.unlink(path)
        results[case] = out
        summary.append("%s %s%s" % ("PASS" if not out["failures"] else "FAIL", case,
                                    "" if not out["failures"] else ": " + "; ".join(
                                        out["failures"])))
    failed = sum(bool(results[c]["failures"]) for c in cases)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print("torch_sleep:")
    for line in summary:
        print("  " + line)
    print("torch_sleep: %s" % ("PASS" if not failed else "FAIL (%d of %d cases)" % (
        failed, len(cases))))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
