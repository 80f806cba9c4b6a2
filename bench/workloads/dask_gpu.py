#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Dask on every GPU through rmmc: a worker per GPU (plain dask.distributed,
rmmc.dask.gpu_cluster: CUDA_VISIBLE_DEVICES per worker), each given its own
stack by rmmc.dask's plugin with CuPy and PyTorch routed through it.

1. A CuPy-backed dask.array pipeline (blocks moved to the GPUs with
   cupy.asarray; elementwise work, a matrix product, reductions) whose result
   must equal the same computation in NumPy in this process, exactly (integer
   data); every worker must have taken blocks (its stack's peak > 0), on its
   own GPU (distinct PCI bus ids).
2. A PyTorch task on every worker: its tensors come from rmmc (the plug-in's
   allocation count grows on every worker).
3. Per-worker figures (peak reserved, peak live) in one call
   (rmmc.dask.figures_table).
4. Failure: the plugin again, with the last worker capped by `limiting`
   below what a task needs: that task fails with rmmc's out-of-memory
   message, the same task succeeds on the other workers, and the capped
   worker still serves a small task.

Prints a PASS/FAIL line per check and writes JSON (--json). Exit status 0
when every check passed.
    python3 bench/workloads/dask_gpu.py [--workers N] [--spec SPEC] [--json out.json]
    python3 bench/workloads/dask_gpu.py --host 2     # the same checks on host stacks, no GPU
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout


def gpu_identity():
    """The PCI bus id of the one GPU this worker sees ("0000:1B:00.0")."""
    import cupy
    return cupy.cuda.Device(0).pci_bus_id


def torch_task(n):
    import torch
    import rmmc.torch
    before = rmmc.torch.stats(0)["allocations"]
    t = torch.arange(n, device="cuda", dtype=torch.int64)
    total = int(t.sum().item())
    return total, rmmc.torch.stats(0)["allocations"] - before


def cupy_task(nbytes, host=False):
    """Sums nbytes / 8 ones made on the GPU (CuPy through rmmc), or, with
    host=True, in memory from the worker's rmmc stack."""
    if host:
        import ctypes
        import numpy as np
        import rmmc
        r = rmmc.get_default(0)
        p = r.allocate(nbytes)
        try:
            a = np.frombuffer((ctypes.c_char * nbytes).from_address(p), dtype=np.int64)
            a[:] = 1
            return int(a.sum())
        finally:
            r.deallocate(p, nbytes)
    import cupy
    a = cupy.ones(nbytes // 8, dtype=cupy.int64)
    return int(a.sum().get())


def through_host_stack(block):
    """--host: a block copied into memory from the worker's rmmc stack and
    back (the data go through rmmc as CuPy's blocks do on the GPU)."""
    import ctypes
    import numpy as np
    import rmmc
    r = rmmc.get_default(0)
    p = r.allocate(block.nbytes)
    try:
        ctypes.memmove(p, block.ctypes.data, block.nbytes)
        out = np.empty_like(block)
        ctypes.memmove(out.ctypes.data, p, block.nbytes)
    finally:
        r.deallocate(p, block.nbytes)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=None, help="default: every visible GPU")
    ap.add_argument("--spec", default="statistics > pool > cuda")
    ap.add_argument("--cap", default="64MiB", help="the capped worker's limit")
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--host", type=int, default=0, metavar="N",
                    help="N host workers on host stacks, NumPy blocks: the script's own check "
                         "without a GPU (the spec's base becomes host)")
    args = ap.parse_args()
    host = args.host > 0
    if host:
        args.spec = args.spec.rsplit(">", 1)[0] + "> host" if ">" in args.spec else "host"
    try:
        import rmmc.dask
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import rmmc.dask
    import numpy as np
    import dask.array as da
    from distributed import Client

    checks = []

    def check(name, ok, detail=""):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print("%s %s%s" % ("PASS" if ok else "FAIL", name, ": " + detail if detail else ""),
              flush=True)

    t0 = time.time()
    cluster = rmmc.dask.gpu_cluster(devices=list(range(args.host))) if host else \
        rmmc.dask.gpu_cluster(args.workers)
    client = Client(cluster)
    n = len(cluster.workers)
    client.wait_for_workers(n, timeout=180)
    by_name = {str(w["name"]): a for a, w in client.scheduler_info()["workers"].items()}
    print("%d workers up in %.1f s" % (n, time.time() - t0), flush=True)
    result = {"workers": n, "spec": args.spec, "checks": checks}
    try:
        rmmc.dask.install(client, args.spec, cupy=not host, torch=not host)
        visible = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        ids = visible if host else client.run(gpu_identity)
        check("a worker per GPU", len(set(ids.values())) == n and len(set(visible.values())) == n,
              "%s" % sorted(ids.values()))

        rng = np.random.default_rng(27)
        x = rng.integers(0, 1000, size=(args.rows, 1000)).astype(np.int64)
        if host:
            to_device, meta = through_host_stack, np.empty((0, 0), dtype=np.int64)
        else:
            import cupy
            to_device, meta = cupy.asarray, cupy.empty((0, 0), dtype=cupy.int64)
        dx = da.from_array(x, chunks=(args.rows // 16, 1000)).map_blocks(
            to_device, dtype=np.int64, meta=meta)
        y = dx * 3 + 1
        expr = (y.T @ y).sum(axis=0) + y.max(axis=1).sum() - (y % 7).sum()
        t1 = time.time()
        got = expr.compute()
        got = got.get() if hasattr(got, "get") else got
        elapsed = time.time() - t1
        yx = x * 3 + 1
        want = (yx.T @ yx).sum(axis=0) + yx.max(axis=1).sum() - (yx % 7).sum()
        check("dask.array pipeline (%s blocks) equals NumPy" % ("host" if host else "CuPy"),
              np.array_equal(got, want),
              "%d values, %.2f s on %d %s" % (want.size, elapsed, n, "workers" if host else "GPUs"))
        figs = rmmc.dask.collect_figures(client)
        if not host:
            routes = {f["worker"]: f["routed"] for f in figs.values()}
            check("CuPy and PyTorch routed through rmmc on every worker",
                  all(v == "cupy,torch" for v in routes.values()), "%s" % routes)
        used = {f["worker"]: f["peak_live"] for f in figs.values()}
        check("every worker computed through its own stack", all(v and v > 0 for v in used.values()),
              "peak live per worker: %s" % used)

        if not host:
            tasks = {name: client.submit(torch_task, 1 << 20, workers=[addr], pure=False)
                     for name, addr in by_name.items()}
            tres = {name: t.result(timeout=300) for name, t in tasks.items()}
            want_sum = (1 << 20) * ((1 << 20) - 1) // 2
            check("PyTorch on every worker allocates through rmmc",
                  all(s == want_sum and a > 0 for s, a in tres.values()),
                  "plug-in allocations per worker: %s" % {k: v[1] for k, v in tres.items()})

        table = rmmc.dask.figures_table(client)
        print(table, flush=True)
        result["figures"] = {f["worker"]: {k: f.get(k) for k in (
            "stack", "live", "peak_live", "reserved", "peak_reserved", "plugin_peak", "visible")}
            for f in rmmc.dask.collect_figures(client).values()}

        capped = sorted(by_name)[-1]
        rmmc.dask.install(client, args.spec, cupy=not host, torch=not host,
                          per_worker={capped: "limiting(limit=%s) > %s" % (args.cap, args.spec)})
        need = 4 * rmmc.parse_size(args.cap)
        futs = {name: client.submit(cupy_task, need, host, workers=[addr], pure=False)
                for name, addr in by_name.items()}
        errors, sums = {}, {}
        for name, fut in futs.items():
            try:
                sums[name] = fut.result(timeout=300)
            except Exception as e:  # the capped worker's task
                errors[name] = "%s: %s" % (type(e).__name__, e)
        msg = errors.get(capped, "")
        check("the capped worker's task fails with rmmc's out-of-memory message",
              list(errors) == [capped] and "out of memory" in msg and "limit" in msg,
              msg.splitlines()[0][:300] if msg else "no error (%s)" % errors)
        others = [name for name in by_name if name != capped]
        check("the other workers finish the same task",
              all(sums.get(name) == need // 8 for name in others), "%s" % sums)
        small = client.submit(cupy_task, 1 << 20, host, workers=[by_name[capped]], pure=False)
        check("the capped worker still serves", small.result(timeout=120) == (1 << 17))
        result["capped_error"] = msg
    except Exception as e:
        check("dask run", False, "%s: %s" % (type(e).__name__, e))
    finally:
        client.close()
        cluster.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    failed = [c for c in checks if not c["ok"]]
    print("dask_gpu: %d check(s), %d failed" % (len(checks), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
