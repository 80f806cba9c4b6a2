#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sleep mode under PyTorch (issue 29): a model whose weights live in one
rmmc pool and a cache in another, with a captured CUDA graph.

The weights pool is an rmmc.Resource("pool > cuda") whose blocks become the
model's parameters (torch.as_tensor over __cuda_array_interface__); the
cache pool is the stack PyTorch allocates from through rmmc's plug-in
(rmmc.torch.use), which also holds the graph's private pool, its static
input and output, and a "KV cache" tensor the graph writes. Then:

  pause   the weights with backup (Resource.pause("backup")), the cache
          with discard (rmmc.torch.pause("discard")): torch.cuda.mem_get_info
          must show >= 95% of both pools' reserved bytes free;
  other   a second process allocates that memory (less room for its own
          context), writes it and gives it back;
  resume  both: every tensor has the same data_ptr, the weights are
          bit-identical (two 64-bit hashes per tensor, computed on the GPU,
          and sampled bytes), and after the static input is written again
          (it was in the discarded pool) the graph's replay gives the same
          output and cache bit for bit.

Every check runs even when an earlier one failed; the summary lists them.

  RMMC_LIB=build/librmmc.so PYTHONPATH=python python3 scripts/torch_sleep.py \\
      [--weights 0.3] [--cache 0.35] [--json FILE]

--weights and --cache are fractions of the device's total memory. Exit 0
when every check passed, 1 otherwise, 77 without a GPU or PyTorch.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

GiB = 1 << 30
HIDDEN = 8192


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=float, default=0.3)
    ap.add_argument("--cache", type=float, default=0.35)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_sleep: PyTorch is not installed: skipped")
        return 77
    import rmmc
    import rmmc.torch
    if not torch.cuda.is_available():  # does not initialize CUDA in PyTorch
        print("torch_sleep: no CUDA device: skipped")
        return 77
    rmmc.torch.use("pool > cuda")  # before PyTorch initializes CUDA
    failures, out = [], {}

    def expect(ok, what):
        print("  %s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    torch.manual_seed(0)
    dev = torch.device("cuda")
    free0, total = torch.cuda.mem_get_info()
    print("torch_sleep: %s, %.1f GiB total, %.1f GiB free; PyTorch %s" % (
        torch.cuda.get_device_name(), total / GiB, free0 / GiB, torch.__version__))

    # The weights pool and the model.
    wres = rmmc.Resource("pool > cuda", device=0)
    nlayers = max(2, int(a.weights * total) // (HIDDEN * HIDDEN * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, device="meta")
                                  for _ in range(nlayers)])
    blocks = []
    for layer in model:
        for name in ("weight", "bias"):
            shape = (HIDDEN, HIDDEN) if name == "weight" else (HIDDEN,)
            b = _Block(wres, shape, "<f4", 4)
            blocks.append(b)
            t = torch.as_tensor(b, device=dev)
            t.normal_(0, 1.0 / HIDDEN ** 0.5)
            setattr(layer, name, torch.nn.Parameter(t, requires_grad=False))
    params = [p for p in model.parameters()]
    expect(all(p.data_ptr() == b.ptr for p, b in zip(params, blocks)),
           "every parameter lies in the weights pool")

    # The cache pool (PyTorch's allocations through the plug-in): a cache,
    # the static input, a CUDA graph writing both its output and the cache.
    cache = torch.zeros(int(a.cache * total) // 4, dtype=torch.float32, device=dev)
    x_host = torch.randn(64, HIDDEN)
    static_x = x_host.to(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        y = torch.tanh(model(static_x))
        cache[:y.numel()].copy_(y.flatten())
    graph.replay()
    torch.cuda.synchronize()
    ref_y, ref_cache = y.cpu(), cache[:y.numel()].cpu()

    def hashes():
        out = []
        for p in params:
            v = p.detach().view(torch.int32).flatten().to(torch.int64)
            k = torch.arange(v.numel(), device=dev, dtype=torch.int64) % 65521 + 1
            out.append((int(v.sum()), int((v * k).sum()), p.detach().flatten()[:4096].cpu()))
            del v, k
        return out

    h0 = hashes()
    tensors = params + [cache, static_x, y]
    ptrs = [t.data_ptr() for t in tensors]
    torch.cuda.synchronize()
    wres_pool = dict(wres.layers())["pool"]
    cache_pool = dict(rmmc.stack_figures())["pool"]
    reserved = int(wres_pool["reserved"]) + int(cache_pool["reserved"])
    free1, _ = torch.cuda.mem_get_info()
    print("  weights pool %.2f GiB (%d layers), cache pool %.2f GiB; free %.2f GiB" % (
        wres_pool["reserved"] / GiB, nlayers, cache_pool["reserved"] / GiB, free1 / GiB))

    # Pause: weights backed up, cache discarded.
    t0 = time.perf_counter()
    stream = torch.cuda.current_stream().cuda_stream
    wres.pause("backup", stream)
    t1 = time.perf_counter()
    rmmc.torch.pause("discard")
    t2 = time.perf_counter()
    free2, _ = torch.cuda.mem_get_info()
    given = free2 - free1
    out.update(reserved=reserved, given_back=given, pause_weights_s=t1 - t0,
               pause_cache_s=t2 - t1, weights_backed_up=int(wres.sleep_state()["backed_up"]))
    print("  pause: weights %.3f s (%.2f GiB backed up), cache %.3f s; free %.2f -> %.2f GiB" % (
        t1 - t0, out["weights_backed_up"] / GiB, t2 - t1, free1 / GiB, free2 / GiB))
    expect(given >= 0.95 * reserved,
           "pause gives back >= 95%% of both pools' reserved bytes (%.1f%%)" % (
               100.0 * given / max(reserved, 1)))
    try:
        torch.empty(1 << 20, device=dev)
        expect(False, "allocating a tensor while paused raises")
    except RuntimeError as e:
        expect("paused" in str(e), "allocating a tensor while paused raises (%s)" %
               str(e).splitlines()[0][:80])

    # Another process takes the memory and gives it back.
    n = int(reserved * 0.95) - int(1.5 * GiB)
    code = ("import torch; x = torch.empty(%d, dtype=torch.uint8, device='cuda'); x.fill_(7); "
            "torch.cuda.synchronize(); print(int(x[-1])); del x" % n)
    t3 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    out["other_process_bytes"] = n
    print("  another process: %.2f GiB (more than the %.2f GiB free before the pause: %s), "
          "%.1f s" % (n / GiB, free1 / GiB, n > free1, time.perf_counter() - t3))
    expect(r.returncode == 0 and r.stdout.strip() == "7",
           "a second process allocates and writes the memory given back (exit %d %s)" % (
               r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:100]))

    # Resume: same addresses, same weights, the graph replays equal.
    t4 = time.perf_counter()
    rmmc.torch.resume()
    wres.resume(stream)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    out["resume_s"] = t5 - t4
    print("  resume: %.3f s" % (t5 - t4))
    expect([t.data_ptr() for t in tensors] == ptrs, "every tensor keeps its data_ptr")
    h1 = hashes()
    same = all(a_[0] == b_[0] and a_[1] == b_[1] and torch.equal(a_[2], b_[2])
               for a_, b_ in zip(h0, h1))
    expect(same, "the weights are bit-identical")
    static_x.copy_(x_host)  # it lived in the discarded cache pool
    graph.replay()
    torch.cuda.synchronize()
    y_now = y.cpu()
    expect(torch.equal(y_now, ref_y), "the graph's replay gives the same output (max diff %g)"
           % float((y_now - ref_y).abs().max()))
    expect(torch.equal(cache[:y.numel()].cpu(), ref_cache),
           "the graph's replay writes the same cache")
    z = torch.ones(1 << 20, device=dev) * 2
    expect(float(z.sum()) == 2.0 * (1 << 20), "new tensors work after resume")

    # A second cycle, both discarded, to show it repeats.
    wres.pause("discard", stream)
    rmmc.torch.pause("discard")
    free3, _ = torch.cuda.mem_get_info()
    rmmc.torch.resume()
    wres.resume(stream)
    expect(free3 - free1 >= 0.95 * reserved, "a second pause gives the memory back too")
    expect([t.data_ptr() for t in tensors] == ptrs, "... and the addresses stay")

    out["failures"] = failures
    out["device"] = torch.cuda.get_device_name()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    del graph, y, cache, static_x, z
    print("torch_sleep: %s" % ("PASS" if not failures else "FAIL (%d): %s" % (
        len(failures), "; ".join(failures))))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
