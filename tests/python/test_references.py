# SPDX-License-Identifier: Apache-2.0
"""Every Python object that holds a stack holds a reference (DESIGN.md
contract 15), and every value crosses into C checked: copying and pickling
retain or refuse (issue 41, F16), the registry is read with a reference of
one's own (F17), exported memory is never freed under its consumer (F18),
sizes, addresses and streams are checked (F19), statistics blocks of many
threads share the registry cleanly (F20), a failed reinitialize installs
nothing (F21), and the headers are found from a build directory anywhere."""
import copy
import ctypes
import gc
import os
import pickle
import shutil
import threading

import pytest

import rmmc
import rmmc.mr as mr
import rmmc.stats as stats
from rmmc._lib import lib


pytestmark = pytest.mark.usefixtures("clean_registry")  # conftest.py


def refcount(handle):
    return lib().rmmc_resource_refcount(handle)


def layer_names(obj):
    return [name for name, _ in obj.resource.layers()]


# --- F16: copying and pickling ----------------------------------------------------------------

def test_a_copied_resource_holds_a_reference_of_its_own():
    r = rmmc.Resource("statistics > pool > host")
    c = copy.copy(r)
    assert c is not r and c.spec == r.spec and c.handle == r.handle
    assert refcount(r.handle) == 2
    p = r.allocate(4096)
    r.deallocate(p, 4096)
    r.close()
    assert refcount(c.handle) == 1  # the copy's own reference keeps the stack
    p = c.allocate(8192)
    assert c.figures()["in_use"] == 8192
    c.deallocate(p, 8192)
    c.close()
    with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
        c.allocate(1)


def test_resources_are_not_pickled_or_deep_copied():
    r = rmmc.Resource("pool > host")
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(r, protocol=proto)
    with pytest.raises(TypeError, match="not deep-copied"):
        copy.deepcopy(r)
    with pytest.raises(TypeError, match="not deep-copied"):
        copy.deepcopy({"stack": r})
    assert refcount(r.handle) == 1  # nothing took or dropped a reference
    r.close()


MR_OBJECTS = [
    lambda: mr.HostMemoryResource(),
    lambda: mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size="1MiB"),
    lambda: mr.StatisticsResourceAdaptor(mr.HostMemoryResource()),
    lambda: mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20),
    lambda: mr.BinningMemoryResource(mr.HostMemoryResource(), 8, 12),
    lambda: mr.FailureCallbackResourceAdaptor(mr.HostMemoryResource(), lambda n: False),
]


@pytest.mark.parametrize("make", MR_OBJECTS)
def test_mr_objects_copy_with_a_reference_and_refuse_pickling(make):
    a = make()
    h = a.handle
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(a)
    with pytest.raises(TypeError, match="not deep-copied"):
        copy.deepcopy(a)
    b = copy.copy(a)
    assert type(b) is type(a) and b.spec == a.spec and b.handle == h
    assert b.resource is not a.resource and refcount(h) == 2
    del a
    gc.collect()
    assert refcount(h) == 1
    p = b.allocate(256)
    b.deallocate(p, 256)


def test_statistics_scope_pickles_only_once_finished():
    mr.set_current_device_resource(mr.HostMemoryResource())
    with rmmc.statistics() as s:
        with pytest.raises(TypeError, match="open rmmc.StatisticsScope"):
            pickle.dumps(s)
        with pytest.raises(TypeError, match="open rmmc.StatisticsScope"):
            copy.copy(s)
        b = rmmc.DeviceBuffer(size=1000)
    t = pickle.loads(pickle.dumps(s))
    assert t.total_bytes == s.total_bytes == 1000 and t.get() == s.get()
    assert copy.deepcopy(s).peak_bytes == 1000
    b.close()


def test_device_buffer_copies_contents_and_pickles_as_rmms():
    host = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b = rmmc.DeviceBuffer.to_device(b"copy me", mr=host)
    for c in (copy.copy(b), copy.deepcopy(b), b.copy()):
        assert c.ptr != b.ptr and c.tobytes() == b"copy me"
        c.copy_from_host(b"CHANGED")
        assert b.tobytes() == b"copy me"  # its own memory
    del c
    gc.collect()
    assert host.allocation_counts.current_bytes == 7
    # Unpickled into memory from the current device's resource (as RMM).
    cur = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(cur)
    u = pickle.loads(pickle.dumps(b))
    assert u.tobytes() == b"copy me" and cur.allocation_counts.current_bytes == 7
    b.close()
    with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
        b.copy()


# --- F17: borrowing from the registry ---------------------------------------------------------

class Interposed:
    """The library with `action` run just before the first call of `name`:
    another thread's set, landing at the worst moment."""

    def __init__(self, real, name, action):
        self._real, self._name, self._action = real, name, action

    def __getattr__(self, attr):
        fn = getattr(self._real, attr)
        if attr != self._name or self._action is None:
            return fn
        action, self._action = self._action, None

        def call(*args):
            action()
            return fn(*args)
        return call


def registry_pool_only_the_registry_holds():
    """A pool in the registry (device 0) that nothing else holds, and the
    list its on_release hook fills when it is destroyed."""
    released = []
    pool = rmmc.Resource("pool(initial=1MiB) > host")
    pool.set_memory_hooks(on_release=lambda p, n: released.append(n))
    assert lib().rmmc_set_device_resource(0, pool.handle, None) == 0
    pool.close()
    return released


@pytest.mark.parametrize("where,call", [
    ("rmmc.mr", lambda: mr.get_per_device_resource(0)),
    ("rmmc.buffer", lambda: rmmc.DeviceBuffer(size=100)),
])
def test_a_set_on_another_thread_cannot_free_what_a_get_returns(monkeypatch, where, call):
    released = registry_pool_only_the_registry_holds()
    other = rmmc.Resource("host")
    seen = []

    def set_elsewhere():
        assert lib().rmmc_set_device_resource(0, other.handle, None) == 0
        seen.append(list(released))

    module = __import__(where, fromlist=["lib"])
    name = "rmmc_resource_name" if where == "rmmc.mr" else "rmmc_buffer_create"
    monkeypatch.setattr(module, "lib", lambda: Interposed(lib(), name, set_elsewhere))
    obj = call()
    assert seen == [[]]  # the pool outlived the set: the get held it
    assert not released
    if where == "rmmc.mr":
        p = obj.allocate(4096)  # the pool still works through the object
        obj.deallocate(p, 4096)
    del obj
    gc.collect()
    assert released  # and went when the object did


def test_gets_racing_sets_from_threads(python):
    """F17 as found: one thread sets the device's resource over and over,
    another gets it and allocates through it (ASan saw a use-after-free
    within seconds); with a reference of its own each get is safe."""
    p = python("""
import sys, threading, time, rmmc, rmmc.mr as mr
sys.setswitchinterval(1e-6)  # the threads interleave between any two bytecodes
mr.set_current_device_resource(mr.PoolMemoryResource(mr.HostMemoryResource()))
stop = time.time() + 1.5
errors = []
def setter():
    while time.time() < stop:
        mr.set_per_device_resource(0, mr.PoolMemoryResource(mr.HostMemoryResource()))
        with rmmc.Resource("pool > host") as r:
            rmmc.lib().rmmc_set_device_resource(0, r.handle, None)
def getter():
    n = 0
    while time.time() < stop:
        try:
            r = mr.get_per_device_resource(0)
            q = r.allocate(4096); r.deallocate(q, 4096)
            b = rmmc.DeviceBuffer(size=256); b.close()
            n += 1
        except Exception as e:
            errors.append(repr(e))
    print("gets", n)
ts = [threading.Thread(target=setter)] + [threading.Thread(target=getter) for _ in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
print("errors", errors[:3])
""")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "errors []" in p.stdout and "gets" in p.stdout


# --- F18: exports and the memory under them -------------------------------------------------

def test_resize_and_reserve_refuse_to_free_memory_a_dlpack_tensor_uses():
    s = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b = rmmc.DeviceBuffer.to_device(b"x" * 64, mr=s)
    cap = b.__dlpack__()
    ptr = b.ptr
    with pytest.raises(BufferError, match="DLPack tensor still uses"):
        b.resize(4096)
    with pytest.raises(BufferError, match="DLPack tensor still uses"):
        b.reserve(4096)
    with pytest.raises(BufferError, match="still uses"):
        b.close()
    assert b.ptr == ptr and b.size == 64 and b.capacity() == 64
    b.resize(16)  # within the capacity: nothing moves
    b.reserve(64)
    assert b.ptr == ptr and b.size == 16
    del cap
    gc.collect()
    b.resize(4096)
    assert b.ptr != ptr and b.tobytes()[:16] == b"x" * 16
    b.close()
    assert s.allocation_counts.current_bytes == 0


def test_memory_an_array_interface_handed_out_stays_until_the_buffer_goes():
    s = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b = rmmc.DeviceBuffer.to_device(b"abcdefgh", mr=s)
    old = b.__array_interface__["data"][0]
    b.resize(1 << 16)  # moves: the consumer may still read the old memory
    assert b.ptr != old and b.tobytes()[:8] == b"abcdefgh"
    assert ctypes.string_at(old, 8) == b"abcdefgh"
    assert s.allocation_counts.current_bytes == 8 + (1 << 16)
    b.reserve(1 << 17)  # the new memory was never handed out: freed as usual
    assert s.allocation_counts.current_bytes == 8 + (1 << 17)
    b.__array_interface__
    b.close()
    assert b.size == 0 and s.allocation_counts.current_bytes == 8 + (1 << 17)
    del b
    gc.collect()
    assert s.allocation_counts.current_bytes == 0


# --- F19: values checked before C -------------------------------------------------------------

@pytest.mark.parametrize("n,exc", [(2 ** 64 + 16, OverflowError), (2 ** 70, OverflowError),
                                   (-1, ValueError), (16.0, TypeError), ("16", TypeError),
                                   (True, TypeError)])
def test_buffer_sizes(n, exc):
    host = mr.HostMemoryResource()
    with pytest.raises(exc):
        rmmc.DeviceBuffer(size=n, mr=host)
    b = rmmc.DeviceBuffer(size=32, mr=host)
    for op in (b.resize, b.reserve):
        with pytest.raises(exc):
            op(n)
        assert b.size == 32 and b.capacity() == 32


@pytest.mark.parametrize("ptr,exc", [(-1, ValueError), (2 ** 64, OverflowError),
                                     (1.0, TypeError), ("0x10", TypeError)])
def test_buffer_source_addresses(ptr, exc):
    with pytest.raises(exc):
        rmmc.DeviceBuffer(ptr=ptr, size=8, mr=mr.HostMemoryResource())


def test_buffer_from_address_zero_allocates_without_a_copy():
    b = rmmc.DeviceBuffer(ptr=0, size=8, mr=mr.HostMemoryResource())
    assert b.size == 8 and b.ptr


class TorchLike:
    cuda_stream = 0


class CupyLike:
    ptr = 0


class Protocol:
    def __cuda_stream__(self):
        return (0, 0)


class ProtocolAttribute:
    __cuda_stream__ = (0, 0)


class NumbaLike:
    handle = ctypes.c_void_p(None)


class ProtocolV1:
    def __cuda_stream__(self):
        return (1, 0)


STREAM_OBJECTS = [TorchLike(), CupyLike(), Protocol(), ProtocolAttribute(), NumbaLike()]
BAD_STREAMS = [(-1, ValueError), (2 ** 64 + 3, OverflowError), ("0", TypeError),
               (1.5, TypeError), (True, TypeError), (ProtocolV1(), ValueError),
               (object(), TypeError), (mr.HostMemoryResource(), TypeError)]


@pytest.mark.parametrize("stream,exc", BAD_STREAMS)
def test_bad_streams_everywhere(stream, exc):
    r = rmmc.Resource("pool > host")
    for call in (lambda: r.pause(stream=stream), lambda: r.resume(stream=stream),
                 lambda: r.allocate(256, stream=stream),
                 lambda: rmmc.DeviceBuffer(size=8, stream=stream, mr=mr.HostMemoryResource())):
        with pytest.raises(exc):
            call()
    assert not r.sleep_state()["paused"] and r.figures()["in_use"] == 0


@pytest.mark.parametrize("stream", STREAM_OBJECTS, ids=lambda s: type(s).__name__)
def test_stream_objects_everywhere(stream):
    r = rmmc.Resource("pool > host")
    p = r.allocate(256, stream=stream)
    r.deallocate(p, 256, stream=stream)
    r.pause(stream=stream)
    assert r.sleep_state()["paused"]
    r.resume(stream=stream)
    assert not r.sleep_state()["paused"]
    b = rmmc.DeviceBuffer(size=8, stream=stream, mr=mr.HostMemoryResource())
    assert b.stream == 0


def test_sizes_of_mr_objects_are_checked():
    host = mr.HostMemoryResource()
    with pytest.raises(OverflowError):
        mr.PoolMemoryResource(host, initial_pool_size=2 ** 64)
    with pytest.raises(OverflowError):
        mr.FixedSizeMemoryResource(host, blocks_to_preallocate=2 ** 40)
    with pytest.raises(TypeError):
        mr.BinningMemoryResource(host, min_size_exponent=8.0)
    with pytest.raises(ValueError, match="NUL"):
        mr.LoggingResourceAdaptor(host, log_file_name="log\x00.csv")


# --- F20: statistics blocks from many threads -------------------------------------------------

def test_statistics_blocks_of_sixteen_threads():
    pool = mr.PoolMemoryResource(mr.HostMemoryResource())
    mr.set_current_device_resource(pool)
    barrier = threading.Barrier(16)
    errors, scopes = [], {}

    def work(i):
        try:
            for k in range(20):
                with rmmc.statistics() as s:
                    b = rmmc.DeviceBuffer(size=1000 * (i + 1))
                    if k % 10 == 0:
                        barrier.wait(timeout=60)  # every thread's block open at once
                    inside = s.get()
                    b.close()
                assert s.total_bytes >= 1000 * (i + 1) and s.total_count >= 1
                assert inside["total_bytes"] >= 1000 * (i + 1)
                scopes[i] = s
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert len(scopes) == 16
    cur = mr.get_current_device_resource()
    assert cur is pool and layer_names(cur) == ["pool", "host"]


def test_statistics_blocks_overlapping_without_nesting():
    mr.set_current_device_resource(mr.HostMemoryResource())
    a_ctx = rmmc.statistics()
    a = a_ctx.__enter__()
    x = rmmc.DeviceBuffer(size=100)
    b_ctx = rmmc.statistics()
    b = b_ctx.__enter__()
    y = rmmc.DeviceBuffer(size=50)
    a_ctx.__exit__(None, None, None)  # the first one ends first (another thread's, say)
    assert (a.current_bytes, a.peak_bytes, a.total_bytes) == (150, 150, 150)
    assert layer_names(mr.get_current_device_resource())[0] == "statistics"  # b still counts
    z = rmmc.DeviceBuffer(size=25)
    x.close()
    b_ctx.__exit__(None, None, None)
    assert (b.current_bytes, b.peak_bytes, b.total_bytes, b.total_count) == (-25, 75, 75, 2)
    assert layer_names(mr.get_current_device_resource()) == ["host"]
    y.close()
    z.close()


def test_profiler_blocks_of_many_threads():
    mr.set_current_device_resource(mr.HostMemoryResource())
    stats.enable_statistics()
    records = stats.ProfilerRecords()
    barrier = threading.Barrier(8)

    def work(i):
        with stats.profiler(records=records, name="t%d" % i):
            b = rmmc.DeviceBuffer(size=4096 * (i + 1))
            barrier.wait(timeout=60)
            b.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i in range(8):
        r = records.records["t%d" % i]
        assert r.num_calls == 1 and r.memory_total >= 4096 * (i + 1)
    assert lib().rmmc_statistics_adaptor_get_depth(mr.get_current_device_resource().handle) == 0


def test_enable_statistics_from_threads_wraps_once():
    import sys
    mr.set_current_device_resource(mr.PoolMemoryResource(mr.HostMemoryResource()))
    barrier = threading.Barrier(8)

    def enable():
        barrier.wait(timeout=60)
        stats.enable_statistics()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads interleave between any two bytecodes
    try:
        threads = [threading.Thread(target=enable) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(old)
    assert layer_names(mr.get_current_device_resource()) == ["statistics", "pool", "host"]


# --- F21: reinitialize is all or nothing ------------------------------------------------------

def test_a_failed_reinitialize_installs_nothing():
    before = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_per_device_resource(0, before)
    for devices in ([0, 99], [0, -1], [0, "1"], [0, 1.0]):
        with pytest.raises((ValueError, TypeError)):
            rmmc.reinitialize(base="host", pool_allocator=True, devices=devices)
        assert mr.get_per_device_resource(0) is before
        assert layer_names(mr.get_per_device_resource(0)) == ["statistics", "host"]


def test_a_reinitialize_whose_second_set_fails_puts_the_first_back(monkeypatch):
    before = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_per_device_resource(0, before)
    real = lib()

    class FailSecondDevice:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name != "rmmc_set_device_resource":
                return fn

            def set_(device, r, out):
                if device == 1 and r:
                    return -11  # RMMC_ERROR_INTERNAL
                return fn(device, r, out)
            return set_
    monkeypatch.setattr(mr, "lib", lambda: FailSecondDevice())
    with pytest.raises(rmmc.RmmcError, match="set_per_device_resource\\(1\\)"):
        rmmc.reinitialize(base="host", pool_allocator=True, devices=[0, 1])
    monkeypatch.undo()
    assert mr.get_per_device_resource(0) is before
    assert refcount(before.handle) == 2  # the object's and the registry's, nothing leaked
    if rmmc.device_count() == 0:
        with pytest.raises(rmmc.NoDeviceError):
            mr.get_per_device_resource(1)  # still nothing set
    else:
        assert 1 not in mr._SET  # still nothing set (a device 1 gets its default)


# --- the headers, with the build directory outside the checkout -------------------------------

def test_headers_found_with_the_library_anywhere(tmp_path, monkeypatch):
    import rmmc.torch as rt
    monkeypatch.delenv("RMMC_INCLUDE", raising=False)
    lib_copy = tmp_path / "build" / "librmmc.so"
    lib_copy.parent.mkdir()
    shutil.copy(rmmc.library_path(), lib_copy)
    monkeypatch.setenv("RMMC_LIB", str(lib_copy))
    inc = rt._include_dir()
    assert os.path.exists(os.path.join(inc, "rmmc", "resource.h"))
    assert not inc.startswith(str(tmp_path))


def test_the_package_installs_every_module():
    """python/meson.build names the files pip installs: a module left out
    imports from the checkout and fails in an installed package."""
    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.dirname(os.path.dirname(here))
    with open(os.path.join(checkout, "python", "meson.build")) as f:
        listed = f.read()
    modules = sorted(n for n in os.listdir(os.path.join(checkout, "python", "rmmc"))
                     if n.endswith((".py", ".cpp")))
    assert modules and [m for m in modules if "'rmmc/%s'" % m not in listed] == []
