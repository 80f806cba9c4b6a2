#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CuPy array math with every device allocation going through rmmc.

rmmc.cupy.use() makes rmmc CuPy's allocator (a failure raises with rmmc's
message); the stack comes from RMMC_ALLOC_CONF (set here from --spec; the
default is a pool with statistics on top). The script checks a few results
against NumPy, then shows that rmmc counted CuPy's allocations and got
every block back once the arrays were gone.

    python3 examples/cupy_math.py            # the installed package (pip install .)
    RMMC_LIB=build/librmmc.so PYTHONPATH=python python3 examples/cupy_math.py
    python3 examples/cupy_math.py --spec "cuda_async"

Exit status: 0 when the results and the counts are right, 1 when not, 2
for a spec that does not parse, 3 when cupy is missing, 4 without a GPU.
"""

import argparse
import gc
import sys

import rmmc
import rmmc.cupy

DEFAULT_SPEC = "statistics > pool > cuda"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="stack spec (default: $RMMC_ALLOC_CONF or %r)" % DEFAULT_SPEC)
    ap.add_argument("--n", type=int, default=2048, help="matrix size")
    args = ap.parse_args()

    try:
        spec = rmmc.set_alloc_conf(args.spec, DEFAULT_SPEC)
    except rmmc.ParseError as e:
        print("error: RMMC_ALLOC_CONF: %s" % e.message, file=sys.stderr)
        return 2
    try:
        import cupy as cp
        import numpy as np
    except ImportError as e:
        print("error: CuPy (and NumPy) are needed (%s)" % e, file=sys.stderr)
        return 3
    try:
        ndev = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        ndev = 0
    if ndev == 0:
        print("error: no CUDA device", file=sys.stderr)
        return 4

    rmmc.cupy.use()  # each block ordered on CuPy's current stream
    device = cp.cuda.Device().id
    # Warm up once, so what libraries keep for good (handles, workspaces) is
    # out before the baseline is taken.
    w = cp.ones((64, 64), dtype=cp.float32)
    float((w @ w).sum())
    del w
    gc.collect()
    base = rmmc.cupy.stats(device)
    ok = True

    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((args.n, args.n), dtype=np.float32)
    b_h = rng.standard_normal((args.n, args.n), dtype=np.float32)
    a, b = cp.asarray(a_h), cp.asarray(b_h)
    c = a @ b
    err = float(np.max(np.abs(cp.asnumpy(c[:64, :64]) - a_h[:64] @ b_h[:, :64])))
    print("matmul %dx%d: max error on a 64x64 corner %.2e" % (args.n, args.n, err))
    ok &= err < 1e-2 * args.n ** 0.5

    x = cp.linspace(0, 100, 10_000_000, dtype=cp.float64)
    ident = float(cp.max(cp.abs(cp.sin(x) ** 2 + cp.cos(x) ** 2 - 1)))
    print("max |sin^2 + cos^2 - 1| over 1e7 points: %.2e" % ident)
    ok &= ident < 1e-12
    s = float(cp.sum(cp.arange(1_000_000, dtype=cp.int64)))
    print("sum 0..999999 = %d" % s)
    ok &= s == 999999 * 1000000 // 2

    during = rmmc.cupy.stats(device)
    print("\nwhile the arrays live: %d allocations, %d blocks out, %.1f MiB in use, peak %.1f MiB"
          % (during["allocations"] - base["allocations"], during["live_blocks"],
             during["bytes_in_use"] / 2**20, during["peak_bytes"] / 2**20))
    print(rmmc.memory_summary(device))
    del a, b, c, x
    gc.collect()
    cp.cuda.Device().synchronize()
    after = rmmc.cupy.stats(device)
    unknown = after["unknown_frees"] - base["unknown_frees"]
    failures = after["allocation_failures"] - base["allocation_failures"]
    print("after del: %d deallocations, %d blocks out, %.1f MiB in use, %d unknown frees"
          % (after["deallocations"] - base["deallocations"], after["live_blocks"],
             after["bytes_in_use"] / 2**20, unknown))
    rmmc.release_cached(device)

    if during["allocations"] - base["allocations"] < 4:
        print("FAIL: CuPy allocated (almost) nothing through rmmc"); ok = False
    if after["live_blocks"] != base["live_blocks"]:
        print("FAIL: %d blocks out, %d before the arrays" % (after["live_blocks"], base["live_blocks"]))
        ok = False
    if unknown or failures:
        print("FAIL: unknown frees or failed allocations: %s" % after); ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
