#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMM's consumers through an rmmc stack, on one GPU (scripts/gpu-rapids
runs it with the carried wheels on PYTHONPATH). Each part runs in a fresh
process (the frameworks' allocators are set once per process) and prints
PASS/FAIL lines; the figures of every part go into one JSON file.

1. rmm.DeviceBuffer through rmmc.rmm.use(): rmmc's statistics layer counts
   every byte (exactly the buffers' sizes), data round-trips, and RMM's own
   StatisticsResourceAdaptor and PoolMemoryResource over the rmmc stack.
2. CuPy through rmm.allocators.cupy (on CuPy's current stream): a
   computation checked against NumPy, rmmc's figures back at their
   baseline after the arrays go.
3. Numba through RMM's EMM plugin (NUMBA_CUDA_MEMORY_MANAGER=
   rmm.allocators.numba) and through rmmc's (rmmc.numba): device arrays and
   a kernel, counted by rmmc; an IPC handle opened in a child process
   (pool(expandable=false) > cuda: cudaMalloc'd chunks).
4. PyTorch through rmm.allocators.torch: a matmul checked on the CPU, every
   tensor's bytes in rmmc's figures.
5. The bridge's cost: allocate/free pairs of 256 B and 1 MiB timed in C++
   (RMM's benchmark loop) through RMM's resource_ref to the rmmc pool,
   straight through rmmc, and RMM's own pool, in alternating rounds.
6. Dask: rmmc.dask's plugin makes a worker's stack RMM's current resource;
   an rmm.DeviceBuffer made on the worker shows in its rmmc figures.
7. rmmc's layers over RMM's own resource (rmmc.rmm.over(CudaAsyncMemoryResource)).

    python3 bench/workloads/rapids_gpu.py [--json out.json] [--only N,...] [--host]
Exit status 0 when every part passed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

PARTS = {}


def part(n, title):
    def deco(fn):
        PARTS[n] = (title, fn)
        return fn
    return deco


def check(ok, what, results):
    results.append({"check": what, "ok": bool(ok)})
    print("%s %s" % ("PASS" if ok else "FAIL", what), flush=True)
    return ok


# Each part is Python source run in a fresh interpreter; it prints one line
# "RESULT <json>" with its figures and a list of (what, ok) checks.
PRELUDE = r'''
import json, sys
checks, figs = [], {}
def ok(c, what):
    checks.append([what, bool(c)])
def done():
    print("RESULT " + json.dumps({"checks": checks, "figures": figs}))
'''

SRC = {}

SRC[1] = r'''
import rmm, rmmc, rmmc.rmm
mr = rmmc.rmm.use("statistics > pool(initial=256MiB) > cuda")
ok(type(rmm.mr.get_per_device_resource(0)).__name__ == "RmmcMemoryResource",
   "RMM's resource for device 0 is the rmmc stack")
st = lambda: int(mr.figures()["in_use"])
base = st()
data = bytes(range(256)) * 4096
b = rmm.DeviceBuffer.to_device(data) if rmmc.device_count() else rmm.DeviceBuffer(size=len(data), mr=mr)
kw = {} if rmmc.device_count() else {"mr": mr}  # on a GPU: RMM's current resource
c = rmm.DeviceBuffer(size=12345, **kw)
ok(st() - base == len(data) + 12345, "rmmc's statistics count every DeviceBuffer byte (%d)" % (st() - base))
ok(not rmmc.device_count() or b.tobytes() == data, "rmm.DeviceBuffer round trip through the rmmc pool")
figs["device_buffer_bytes"] = st() - base
del b, c
ok(st() == base, "freed: back to the baseline")
rs = rmm.mr.StatisticsResourceAdaptor(mr)
p = rs.allocate(1 << 20)
ok(rs.allocation_counts.current_bytes == 1 << 20 and st() - base == 1 << 20,
   "RMM's StatisticsResourceAdaptor over the rmmc stack: both count 1 MiB")
rs.deallocate(p, 1 << 20)
pool = rmm.mr.PoolMemoryResource(mr, initial_pool_size=64 << 20)
ok(st() - base == 64 << 20, "RMM's pool takes its 64 MiB from rmmc")
del pool
try:
    rmm.DeviceBuffer(size=1 << 50, **kw)
    ok(False, "an impossible DeviceBuffer raises MemoryError")
except MemoryError as e:
    ok("rmmc:" in str(e), "an impossible DeviceBuffer raises MemoryError with rmmc's message")
figs["summary"] = rmmc.memory_summary_line(0)
done()
'''

SRC[2] = r'''
import cupy, numpy, rmm, rmmc, rmmc.rmm
from rmm.allocators.cupy import rmm_cupy_allocator
mr = rmmc.rmm.use("statistics > pool(initial=256MiB) > cuda")
cupy.cuda.set_allocator(rmm_cupy_allocator)
st = lambda: int(mr.figures()["in_use"])
base = st()
s = cupy.cuda.Stream(non_blocking=True)
with s:
    a = cupy.arange(1 << 22, dtype=cupy.float64)
    b = cupy.sqrt(a) * 2.0
    total = float(b.sum())
    s.synchronize()
want = float((numpy.sqrt(numpy.arange(1 << 22, dtype=numpy.float64)) * 2.0).sum())
ok(abs(total - want) <= 1e-9 * want, "CuPy through rmm.allocators.cupy on a stream of its own: the result")
live = st() - base
ok(live >= 2 * (8 << 22), "rmmc counts CuPy's arrays (%d bytes live)" % live)
figs["cupy_live_bytes"] = live
del a, b
s.synchronize()
ok(st() == base, "CuPy's arrays freed: rmmc back to the baseline")
done()
'''

SRC[3] = r'''
import os, numpy, rmmc, rmmc.rmm
import multiprocessing as mp


def child(handle, q):  # top level: the spawned child imports this file
    with handle as arr:
        q.put(float(arr.copy_to_host().sum()))


def main():
    which = os.environ["NUMBA_CUDA_MEMORY_MANAGER"]
    if which.startswith("rmm."):
        mr = rmmc.rmm.use("statistics > pool(expandable=false, initial=64MiB) > cuda")
        stack = mr.resource
    else:
        stack = rmmc.set_default("statistics > pool(expandable=false, initial=64MiB) > cuda",
                                 device=0)
    from numba import cuda
    st = lambda: int(stack.figures()["in_use"])
    base = st()
    x = numpy.arange(1 << 20, dtype=numpy.float32)
    d = cuda.to_device(x)
    out = cuda.device_array_like(d)

    try:
        @cuda.jit
        def twice(a, b):
            i = cuda.grid(1)
            if i < a.size:
                b[i] = 2 * a[i]
        twice[(x.size + 255) // 256, 256](d, out)
    except AttributeError as e:
        # numba-cuda releases that predate the installed NumPy fail to
        # compile any kernel (np.row_stack went in NumPy 2.3); the memory
        # manager is what is tested here, so CuPy's kernel reads and
        # writes Numba's arrays instead (through __cuda_array_interface__).
        print("NOTE this numba-cuda cannot compile kernels with this NumPy (%s): a CuPy kernel "
              "over Numba's arrays instead" % e)
        import cupy
        cupy.multiply(cupy.asarray(d), 2, out=cupy.asarray(out))
        cupy.cuda.Device().synchronize()
    ok(numpy.array_equal(out.copy_to_host(), 2 * x), "Numba (%s): a kernel over rmmc's arrays" % which)
    live = st() - base
    ok(live == 2 * x.nbytes, "rmmc counts Numba's two arrays exactly (%d bytes)" % live)
    figs["numba_live_bytes"] = live
    h = d.get_ipc_handle()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(h, q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    ok(got == float(x.sum()), "Numba (%s): an IPC handle opened in another process" % which)
    # Numba defers frees: a dead array's memory waits in the context's
    # pending deallocations until they are flushed (by count or size, or
    # as here explicitly); the IPC handle keeps its array alive.
    del d, out, h
    cuda.current_context().deallocations.clear()
    ok(st() == base, "Numba's arrays freed: rmmc back to the baseline (%d bytes over)" % (st() - base))
    done()


if __name__ == "__main__":
    main()
'''

SRC[4] = r'''
import torch, rmm, rmmc, rmmc.rmm
mr = rmmc.rmm.use("statistics > pool(initial=256MiB) > cuda")
from rmm.allocators.torch import rmm_torch_allocator
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
st = lambda: int(mr.figures()["in_use"])
base = st()
a = torch.randn(1024, 1024, device="cuda")
b = torch.randn(1024, 1024, device="cuda")
c = a @ b
torch.cuda.synchronize()
ref = a.cpu() @ b.cpu()
ok(torch.allclose(c.cpu(), ref, rtol=1e-3, atol=1e-3), "PyTorch through rmm.allocators.torch: a matmul")
want = sum(t.untyped_storage().nbytes() for t in (a, b, c))
live = st() - base
ok(live >= want, "rmmc counts PyTorch's tensors (%d bytes live, %d in tensors)" % (live, want))
figs["torch_live_bytes"], figs["torch_tensor_bytes"] = live, want
del a, b, c, ref
torch.cuda.synchronize()
# What stays is PyTorch's cuBLAS workspace (allocated through the same
# allocator at the first matmul, kept for the handle's life): the three
# tensors' bytes, exactly, must have gone back.
freed = live - (st() - base)
ok(freed == want, "PyTorch's tensors freed back through RMM into rmmc (%d of %d bytes)" % (freed, want))
done()
'''

SRC[5] = r'''
import statistics as S, rmm, rmmc, rmmc.rmm
mr = rmmc.rmm.use("pool(initial=1GiB) > cuda")
rmm_pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
rows = {}
for nbytes in (256, 1 << 20):
    got = {"bridge": [], "rmmc": [], "rmm_pool": []}
    rmmc.rmm.bench_pairs(mr, nbytes, 50000)
    rmmc.rmm.bench_pairs(rmm_pool, nbytes, 50000)
    for _ in range(7):  # alternating rounds, the same process
        got["bridge"].append(rmmc.rmm.bench_pairs(mr, nbytes, 200000))
        got["rmmc"].append(rmmc.rmm.bench_pairs(mr.resource, nbytes, 200000))
        got["rmm_pool"].append(rmmc.rmm.bench_pairs(rmm_pool, nbytes, 200000))
    med = {k: S.median(v) for k, v in got.items()}
    rows[nbytes] = dict(med, bridge_minus_rmmc=med["bridge"] - med["rmmc"],
                        ratio=med["bridge"] / med["rmmc"], runs=got)
    print("  %8d B: bridge %.1f ns, rmmc %.1f ns (+%.1f ns, %.3fx), RMM's pool %.1f ns per pair"
          % (nbytes, med["bridge"], med["rmmc"], med["bridge"] - med["rmmc"],
             med["bridge"] / med["rmmc"], med["rmm_pool"]), file=sys.stderr)
    ok(med["bridge"] - med["rmmc"] < 15.0,
       "%d B pairs: the bridge costs %.1f ns over rmmc alone (< 15 ns)" % (nbytes, med["bridge"] - med["rmmc"]))
figs["bench_ns_per_pair"] = rows
done()
'''

SRC[6] = r'''
import os
from distributed import Client
import rmmc, rmmc.dask
def on_worker():
    import rmm, rmmc
    cur = rmm.mr.get_current_device_resource()
    with rmmc.get_default(0) as r:
        before = int(r.figures()["in_use"])
        b = rmm.DeviceBuffer(size=3 << 20)
        after = int(r.figures()["in_use"])
        same = cur.handle == r.handle
    return {"type": type(cur).__name__, "same": same, "delta": after - before}
cluster = rmmc.dask.gpu_cluster(n_workers=1)
client = Client(cluster)
client.wait_for_workers(1, timeout=120)
rmmc.dask.install(client, "statistics > pool(initial=256MiB) > cuda", torch=False)
res = list(client.run(on_worker).values())[0]
ok(res["type"] == "RmmcMemoryResource" and res["same"], "Dask: the worker's RMM resource is its rmmc stack")
ok(res["delta"] == 3 << 20, "Dask: an rmm.DeviceBuffer on the worker is counted by its rmmc stack")
f = list(rmmc.dask.collect_figures(client).values())[0]
ok("rmm" in f["routed"], "Dask: the plugin reports RMM routed (%s)" % f["routed"])
figs["dask_worker"] = dict(res, routed=f["routed"])
client.close(); cluster.close()
done()
'''

SRC[7] = r'''
import rmm, rmmc, rmmc.rmm
am = rmm.mr.CudaAsyncMemoryResource()
r = rmmc.rmm.over(am, "statistics > limiting(limit=64MiB)")
p = r.allocate(8 << 20)
ok(int(r.figures()["in_use"]) == 8 << 20, "rmmc's statistics and limiting over RMM's CudaAsyncMemoryResource")
try:
    r.allocate(128 << 20)
    ok(False, "the limit refuses")
except rmmc.OutOfMemoryError:
    ok(True, "rmmc's limit over RMM's resource refuses with OutOfMemoryError")
r.deallocate(p, 8 << 20)
pool = rmmc.mr.PoolMemoryResource(am, initial_pool_size=32 << 20)  # an RMM object as upstream
q = pool.allocate(1000); pool.deallocate(q, 1000)
ok(pool.spec.endswith("> rmm"), "rmmc.mr.PoolMemoryResource over an rmm.mr object (%s)" % pool.spec)
done()
'''


def run(n, env_extra=None, timeout=240, host=False):
    env = dict(os.environ, **(env_extra or {}))
    t0 = time.time()
    code = PRELUDE + SRC[n]
    if host:  # the harness itself, without a GPU: host stacks
        code = code.replace("> cuda\")", "> host\", device=0)").replace(
            "rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)",
            "rmm.mr.PoolMemoryResource(rmmc.rmm.use('host', device=0), initial_pool_size=1 << 30)")
    if "__main__" in SRC[n]:  # a part with a spawned child runs from a file
        import tempfile
        fd, path = tempfile.mkstemp(suffix="_rapids_part%d.py" % n)
        with os.fdopen(fd, "w") as f:
            f.write(code)
        cmd = [sys.executable, path]
    else:
        cmd = [sys.executable, "-c", code]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    sys.stderr.write(r.stderr[-3000:] if r.returncode else r.stderr[-1500:])
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[7:])
            out["seconds"] = round(time.time() - t0, 1)
            return out
    return {"checks": [["part %d ran (exit %d): %s" % (n, r.returncode,
                                                        (r.stderr.strip().splitlines() or ["?"])[-1]),
                        False]], "figures": {}, "seconds": round(time.time() - t0, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", help="comma-separated part numbers")
    ap.add_argument("--host", action="store_true",
                    help="parts 1 and 5 over host stacks, to check the harness without a GPU")
    a = ap.parse_args()
    only = {int(x) for x in a.only.split(",")} if a.only else None
    plan = [(1, "rmm.DeviceBuffer", None), (2, "CuPy via rmm.allocators.cupy", None),
            (3, "Numba via RMM's EMM plugin", {"NUMBA_CUDA_MEMORY_MANAGER": "rmm.allocators.numba"}),
            (3, "Numba via rmmc's EMM plugin", {"NUMBA_CUDA_MEMORY_MANAGER": "rmmc.numba"}),
            (4, "PyTorch via rmm.allocators.torch", None), (5, "the bridge's cost", None),
            (6, "Dask worker plugin", None), (7, "rmmc over RMM's resources", None)]
    report, results = {}, []
    for n, title, env in plan:
        if only and n not in only:
            continue
        print("== %d. %s" % (n, title), flush=True)
        out = run(n, env, host=a.host)
        for what, good in out["checks"]:
            check(good, what, results)
        report[title] = out
    failed = [r["check"] for r in results if not r["ok"]]
    print("%d passed, %d failed" % (len(results) - len(failed), len(failed)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"parts": report, "failed": failed}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
