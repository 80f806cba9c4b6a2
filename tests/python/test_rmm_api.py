# SPDX-License-Identifier: Apache-2.0
"""What RMM's names do in rmmc, on host stacks: a RAPIDS-style memory
set-up run through `import rmmc as rmm`, RMM's keywords and sizes, the
resources RMM has that rmmc's spec language does not name
(CallbackMemoryResource, add_bin), DeviceBuffer's copies and properties,
streams as objects, the logging calls and the logger levels,
rmmc.statistics as a module, and rmm.allocators' names. Each checked by
what it does (bytes counted, memory read back, files written, calls seen)."""
import copy
import ctypes
import logging
import os

import pytest

import rmmc
import rmmc as rmm
import rmmc.mr as mr
from rmmc._lib import lib


@pytest.fixture(autouse=True)
def clean_registry():
    lib().rmmc_registry_clear()
    mr._SET.clear()
    yield
    lib().rmmc_registry_clear()
    mr._SET.clear()


def test_a_rapids_memory_setup_runs_unchanged(tmp_path):
    # What a RAPIDS script writes, with base="host" standing in for a GPU.
    rmm.reinitialize(pool_allocator=True, initial_pool_size="2MB", maximum_pool_size="64MB",
                     logging=True, log_file_name=str(tmp_path / "rmm.csv"), base="host")
    assert rmm.is_initialized()
    cur = rmm.mr.get_current_device_resource()
    assert isinstance(cur, rmm.mr.LoggingResourceAdaptor)
    assert isinstance(cur.get_upstream(), rmm.mr.PoolMemoryResource)
    assert isinstance(cur.get_upstream(), rmm.mr.UpstreamResourceAdaptor)
    assert cur.get_upstream().pool_size() >= 2 * 10 ** 6
    assert rmm.get_log_filenames() == {0: str(tmp_path / "rmm.dev0.csv")}
    rmm.statistics.enable_statistics()
    buf = rmm.DeviceBuffer(size=1000)
    assert rmm.statistics.get_statistics().current_bytes == 1000
    del buf
    assert rmm.statistics.get_statistics().current_bytes == 0
    # rmmc.statistics() stays the counting block it was.
    with rmmc.statistics() as s:
        rmm.DeviceBuffer(size=300)
    assert s.peak_bytes == 300
    with pytest.raises(rmm.RMMError):
        rmm.DeviceBuffer(size=1 << 40)  # past the pool's maximum
    rmm.disable_logging()
    assert rmm.get_log_filenames() == {0: None}
    cur.flush()
    assert ",allocate," in open(str(tmp_path / "rmm.dev0.csv")).read()


def test_enable_logging_wraps_each_device_and_rmm_log_file(tmp_path, monkeypatch):
    mr.set_current_device_resource(mr.HostMemoryResource())
    monkeypatch.setenv("RMM_LOG_FILE", str(tmp_path / "env.txt"))
    rmm.enable_logging()
    assert rmm.get_log_filenames() == {0: str(tmp_path / "env.dev0.txt")}
    rmm.enable_logging()  # once: not a second layer
    assert [n for n, _ in mr.get_current_device_resource().resource.layers()] == \
        ["logging", "host"]
    p = mr.get_current_device_resource().allocate(64)
    mr.get_current_device_resource().deallocate(p, 64)
    rmm.disable_logging()
    assert [n for n, _ in mr.get_current_device_resource().resource.layers()] == ["host"]


def test_callback_memory_resource_calls_python_with_streams():
    host = mr.HostMemoryResource()
    calls = []

    def allocate(n, stream):
        calls.append(("allocate", n, stream))
        return host.allocate(n)

    def deallocate(ptr, n, stream):
        calls.append(("deallocate", n, stream))
        host.deallocate(ptr, n)
    cb = mr.CallbackMemoryResource(allocate, deallocate)
    stats = mr.StatisticsResourceAdaptor(cb)  # rmmc's layers over it
    s = rmm.Stream(obj=0x1234)
    p = stats.allocate(1000, s)
    ctypes.memset(p, 5, 1000)
    stats.deallocate(p, 1000, s)
    assert [c[:2] for c in calls] == [("allocate", 1000), ("deallocate", 1000)]
    assert all(isinstance(c[2], rmm.Stream) and c[2] == s for c in calls)
    assert stats.allocation_counts.total_bytes == 1000

    def refuse(n, stream):
        raise MemoryError("no room for %d" % n)
    with pytest.raises(rmmc.OutOfMemoryError, match="no room for 64"):
        mr.CallbackMemoryResource(refuse, deallocate).allocate(64)

    def broken(n, stream):
        raise KeyError("x")
    with pytest.raises(rmmc.RmmcError, match="KeyError"):
        mr.CallbackMemoryResource(broken, deallocate).allocate(64)
    with pytest.raises(TypeError):
        mr.CallbackMemoryResource(1, deallocate)
    del cb, stats
    import gc
    gc.collect()
    keep = mr.CallbackMemoryResource(allocate, deallocate)  # frees what destroyed ones kept
    assert len(mr._CALLBACK_RESOURCES) == 1 and mr._CALLBACK_DESTROYED == []
    del keep


def test_binning_add_bin_and_bin_mrs():
    host = mr.HostMemoryResource()
    b = mr.BinningMemoryResource(upstream_mr=host, min_size_exponent=10, max_size_exponent=12)
    assert [x.spec.split(" ")[1] for x in b.bin_mrs] == ["1024", "2048", "4096"]
    b.add_bin(3000)
    sizes = [int(x.spec.split(" ")[1]) for x in b.bin_mrs]
    assert sizes == [1024, 2048, 3072, 4096]
    p = b.allocate(2500)  # the new bin serves it
    assert int(b.bin_mrs[2].figures()["in_use"]) == 3072
    with pytest.raises(rmmc.RmmcError, match="in use"):
        b.add_bin(8192)
    b.deallocate(p, 2500)
    with pytest.raises(rmmc.NotSupportedError, match="fixed_size layers"):
        b.add_bin(8192, bin_resource=host)


def test_tracking_logs_outstanding_allocations(caplog):
    t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
    p = t.allocate(777)
    with caplog.at_level(logging.DEBUG, logger="rmmc"):
        t.log_outstanding_allocations()  # level info: nothing
        assert caplog.records == []
        rmm.set_logging_level(rmm.level_enum.debug)
        try:
            t.log_outstanding_allocations()
        finally:
            rmm.set_logging_level(rmm.level_enum.info)
    assert "777 bytes" in caplog.text
    t.deallocate(p, 777)


def test_arena_dump_log_on_failure(caplog):
    a = mr.ArenaMemoryResource(mr.LimitingResourceAdaptor(mr.HostMemoryResource(), "64MiB"),
                               dump_log_on_failure=True)
    with caplog.at_level(logging.ERROR, logger="rmmc"):
        with pytest.raises(MemoryError):
            a.allocate(1 << 30)
    assert "rmmc arena arena > limiting(limit=67108864) > host" in caplog.text
    assert "limit          64.00 MiB" in caplog.text  # the stack's figures, as RMM's dump


def test_logger_levels_are_rmms():
    assert rmm.get_logging_level() == rmm.level_enum.info
    assert rmm.should_log(rmm.level_enum.warn) and not rmm.should_log(rmm.level_enum.debug)
    rmm.set_logging_level(rmm.level_enum.off)
    try:
        assert not rmm.should_log(rmm.level_enum.critical)
    finally:
        rmm.set_logging_level(rmm.level_enum.info)
    rmm.set_flush_level(rmm.level_enum.error)
    assert rmm.get_flush_level() == rmm.level_enum.error
    rmm.flush_logger()
    with pytest.raises(TypeError, match="level_enum"):
        rmm.set_logging_level(2)


def test_device_buffer_as_rmms():
    host = mr.HostMemoryResource()
    b = rmm.DeviceBuffer.to_device(b"hello world", mr=host)
    with pytest.raises(TypeError):
        rmm.DeviceBuffer(0, 10)  # keywords only, as RMM's
    c = copy.copy(b)
    assert c.ptr != b.ptr and bytes(c) == b"hello world" and b.copy().tobytes() == b"hello world"
    assert c.mr is host and b.mr is host
    d = rmm.DeviceBuffer(size=11, mr=host)
    d.copy_from_device(c)  # a host-memory buffer copies from another
    assert bytes(d) == b"hello world"
    with pytest.raises(ValueError, match="too large"):
        rmm.DeviceBuffer(size=5, mr=host).copy_from_device(c)
    with pytest.raises(ValueError, match="__cuda_array_interface__"):
        d.copy_from_device(b"abc")
    out = d.copy_to_host()
    try:
        import numpy
    except ImportError:
        assert isinstance(out, bytearray)
    else:
        assert isinstance(out, numpy.ndarray) and out.dtype == numpy.uint8
    assert bytes(out) == b"hello world"
    d.prefetch()  # not managed memory: nothing to do, as RMM's
    import pickle
    mr.set_current_device_resource(host)
    e2 = pickle.loads(pickle.dumps(d))  # RMM's: the bytes, rebuilt from the current resource
    assert bytes(e2) == b"hello world" and e2.ptr != d.ptr
    s = rmm.Stream(obj=0x99)
    e = rmm.DeviceBuffer(size=16, stream=s, mr=host)
    assert e.stream == s and isinstance(e.stream, rmm.Stream)
    assert e.__cuda_array_interface__ if e.memory_kind != "host" else True
    # From the current device's stack: .mr is that stack.
    mr.set_current_device_resource(mr.StatisticsResourceAdaptor(host))
    f = rmm.DeviceBuffer(size=100)
    assert f.mr.handle == mr.get_current_device_resource().handle


def test_streams_as_objects():
    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x42)

    class CuPyLike:
        ptr = 0x43
    assert rmm.Stream(Protocol()) == rmm.Stream(obj=0x42)
    assert rmm.Stream(CuPyLike()).__cuda_stream__() == (0, 0x43)
    assert rmm.DEFAULT_STREAM.is_default() and not rmm.Stream(obj=0x42).is_default()
    with pytest.raises(ValueError, match="flags may only"):
        rmm.Stream(obj=0x42, flags=rmmc._stream.CudaStreamFlags.NON_BLOCKING)
    r = rmmc.Resource("statistics > host")
    p = r.allocate(10, stream=Protocol())  # any stream object, not only ints
    r.deallocate(p, 10, stream=rmm.Stream(obj=0x42))
    with pytest.raises(TypeError, match="must be a CUDA stream"):
        r.allocate(10, stream=object())

    import pickle
    mine = rmm.Stream(obj=0x42)
    view = copy.copy(mine)
    assert view == mine and view._owner is mine and not view._owned  # never destroyed twice
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(mine)

    class V1:
        def __cuda_stream__(self):
            return (1, 0x42)
    with pytest.raises(ValueError, match="version 1 is not supported"):
        r.allocate(10, stream=V1())
    r.close()


def test_rmm_modules_by_their_names():
    import rmmc.allocators.cupy as ac
    import rmmc.allocators.torch as at
    import rmmc.statistics as st
    assert st.enable_statistics is rmmc.stats.enable_statistics
    assert callable(rmmc.statistics)
    assert isinstance(st.profiler(name="x"), st.ProfilerContext)
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError):
            ac.rmm_cupy_allocator(16)
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    assert (at.rmm_torch_allocator is None) == (not gpu)


def test_resources_rmm_has_and_rmmc_reaches_through_rmm():
    try:
        import rmm as real_rmm  # noqa: F401
    except ImportError:
        with pytest.raises(rmmc.NotSupportedError, match="install rmm-cu13"):
            mr.CudaAsyncMemoryResource(enable_ipc=True)
        with pytest.raises(rmmc.NotSupportedError, match="install rmm-cu13"):
            mr.SamHeadroomMemoryResource(1 << 30)
        with pytest.raises(rmmc.NotSupportedError):
            mr.experimental.CudaAsyncManagedMemoryResource()
    else:
        if rmmc.device_count() == 0:
            pytest.skip("RMM's resources need a GPU (scripts/gpu-rapids)")
    with pytest.raises(ValueError, match="pool_handle"):
        mr.CudaAsyncViewMemoryResource("x")
