# SPDX-License-Identifier: Apache-2.0
"""CuPy through rmmc.cupy.use(): a computation with its result checked,
the plug-in's figures, and out of memory as rmmc.OutOfMemoryError (a
MemoryError). Fresh interpreter per case. Skipped without CuPy or a GPU
(scripts/gpu-python runs them on the GPU machine)."""
from conftest import run_python, skip_unless

try:
    import cupy
except ImportError:
    cupy = None
skip_unless(cupy is not None, "CuPy is not installed")


def _devices():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # CUDA errors, no driver
        return 0


skip_unless(_devices() > 0, "no CUDA device for CuPy")


def test_computation_through_rmmc():
    r = run_python(r'''
import cupy, numpy, rmmc, rmmc.cupy
rmmc.cupy.use("pool > cuda")
a = cupy.arange(1_000_000, dtype=cupy.float64)
b = cupy.sqrt(a) * 2.0
m = cupy.random.default_rng(0).standard_normal((512, 512))
total = float(b.sum())
want = float((numpy.sqrt(numpy.arange(1_000_000, dtype=numpy.float64)) * 2.0).sum())
assert abs(total - want) <= 1e-9 * want, (total, want)
prod = m @ m.T
assert numpy.allclose(cupy.asnumpy(prod), cupy.asnumpy(m) @ cupy.asnumpy(m).T, rtol=1e-6, atol=1e-6)
s = rmmc.cupy.stats(0)
assert s["allocations"] >= 4 and s["bytes_in_use"] > 0, s
assert rmmc.stack_figures(0)[0][0] == "pool"
del a, b, m, prod
assert rmmc.cupy.stats(0)["deallocations"] >= 3
print("ok", total)
''')
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_out_of_memory_is_a_memory_error():
    r = run_python(r'''
import cupy, rmmc, rmmc.cupy
rmmc.cupy.use("limiting(limit=32MiB) > pool > cuda")
keep = cupy.zeros(4 << 20, dtype=cupy.uint8)
try:
    cupy.zeros(64 << 20, dtype=cupy.uint8)
    print("no error")
except MemoryError as e:
    print(type(e).__name__, isinstance(e, rmmc.OutOfMemoryError), e.status)
''')
    assert "OutOfMemoryError True -2" in r.stdout, r.stdout + r.stderr


def test_allocations_follow_cupys_current_stream():
    r = run_python(r'''
import cupy, rmmc, rmmc.cupy
malloc = rmmc.cupy.use("statistics > pool > cuda")
s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
with s1:
    a = cupy.arange(1 << 20, dtype=cupy.float32) * 2
with s2:
    b = cupy.arange(1 << 20, dtype=cupy.float32) * 3
c = cupy.ones(16)
assert {s1.ptr, s2.ptr} <= set(malloc.streams), malloc.streams
assert cupy.cuda.get_current_stream().ptr in malloc.streams
with s1:
    assert float(a.sum()) == float(cupy.arange(1 << 20, dtype=cupy.float32).sum()) * 2
del a, b
s1.synchronize(); s2.synchronize()
fixed = rmmc.cupy.use(stream=s1)
d = cupy.zeros(10)
assert list(fixed.streams) == [s1.ptr], fixed.streams
print("ok")
''')
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
