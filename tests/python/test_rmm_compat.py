# SPDX-License-Identifier: Apache-2.0
"""The RMM-compatible layer over host stacks (no GPU): every RMM call the
README's mapping table names, with its rmmc equivalent, checked by what it
does (bytes counted, memory read back, layers built, hooks called)."""
import ctypes
import os

import pytest

import rmmc
import rmmc.mr as mr
import rmmc.stats as stats


pytestmark = pytest.mark.usefixtures("clean_registry")  # conftest.py


def host_pool(**kw):
    return mr.PoolMemoryResource(mr.HostMemoryResource(), **kw)


def layer_names(obj):
    return [name for name, _ in obj.resource.layers()]


# --- rmm.mr: composing objects --------------------------------------------------------------

def test_pool_over_an_upstream_object_builds_the_spec_stack():
    base = mr.HostMemoryResource()
    pool = mr.PoolMemoryResource(base, initial_pool_size="1MiB", maximum_pool_size=1 << 26)
    assert pool.spec == "pool(initial=1048576, maximum_size=67108864) > host"
    assert layer_names(pool) == ["pool", "host"]
    assert pool.get_upstream() is base and pool.upstream_mr is base
    assert pool.pool_size() >= 1 << 20
    # The same stack as a spec: the same layers and options.
    with rmmc.Resource(pool.spec) as r:
        assert [n for n, _ in r.layers()] == layer_names(pool)
        assert r.layers()[0][1]["reserved"] == pool.figures()["reserved"]
    p = pool.allocate(1000)
    ctypes.memset(p, 7, 1000)
    assert ctypes.string_at(p + 999, 1) == b"\x07"
    assert pool.figures()["in_use"] >= 1000  # the pool's rounded size
    pool.deallocate(p, 1000)
    assert pool.figures()["in_use"] == 0


def test_layers_keep_their_upstream_alive():
    import gc
    from rmmc._lib import lib
    refcount = lib().rmmc_resource_refcount
    pool = host_pool(initial_pool_size=1 << 20)
    stats_mr = mr.StatisticsResourceAdaptor(pool)
    before = refcount(pool.handle)
    lim = mr.LimitingResourceAdaptor(stats_mr, allocation_limit="64KiB")
    assert refcount(stats_mr.handle) == 2  # the object's and the limiting layer's
    del lim
    gc.collect()
    assert refcount(stats_mr.handle) == 1
    assert refcount(pool.handle) == before


def test_every_layer_class_builds_its_layer():
    host = mr.HostMemoryResource()
    cases = [
        (mr.PoolMemoryResource(host), "pool"),
        (mr.BinningMemoryResource(host_pool(), 10, 16), "binning(min=1024, max=65536)"),
        (mr.BinningMemoryResource(host_pool(), bins=[256, "4KiB"]), "binning(bins=256:4096)"),
        (mr.FixedSizeMemoryResource(host, block_size="64KiB", blocks_to_preallocate=4),
         "fixed_size(block=65536, blocks_per_chunk=4)"),
        (mr.ArenaMemoryResource(host, arena_size="32MiB"), "arena(max_size=33554432)"),
        (mr.LimitingResourceAdaptor(host, 4096), "limiting(limit=4096)"),
        (mr.StatisticsResourceAdaptor(host), "statistics"),
        (mr.TrackingResourceAdaptor(host, capture_stacks=True), "tracking(backtrace=true)"),
        (mr.AlignedResourceAdaptor(host, alignment=4096, alignment_threshold="1MiB"),
         "aligned(alignment=4096, threshold=1048576)"),
    ]
    for obj, layer in cases:
        assert obj.spec.startswith(layer + " > "), (obj.spec, layer)
        assert layer_names(obj)[0] == layer.split("(")[0]
        p = obj.allocate(3000)
        assert p != 0
        obj.deallocate(p, 3000)


def test_fixed_size_binning_and_arena_serve_memory():
    fs = mr.FixedSizeMemoryResource(mr.HostMemoryResource(), block_size=4096,
                                    blocks_to_preallocate=2)
    ptrs = [fs.allocate(100) for _ in range(3)]
    assert len(set(ptrs)) == 3
    for p in ptrs:
        fs.deallocate(p, 100)
    b = mr.BinningMemoryResource(host_pool(), 8, 12)
    p = b.allocate(300)
    ctypes.memset(p, 1, 300)
    b.deallocate(p, 300)


def test_limiting_adaptor_counts_and_refuses():
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), allocation_limit=8192)
    assert lim.get_allocation_limit() == 8192
    p = lim.allocate(4096)
    assert lim.get_allocated_bytes() == 4096
    with pytest.raises(rmmc.OutOfMemoryError):
        lim.allocate(8192)
    assert lim.get_allocated_bytes() == 4096
    lim.deallocate(p, 4096)
    assert lim.get_allocated_bytes() == 0


def test_statistics_adaptor_counters_push_and_pop():
    s = mr.StatisticsResourceAdaptor(host_pool())
    p = s.allocate(1000)
    c = s.allocation_counts
    assert (c.current_bytes, c.current_count, c.peak_bytes, c.total_count) == (1000, 1, 1000, 1)
    before = s.push_counters()
    assert before.current_bytes == 1000
    q = s.allocate(500)
    s.deallocate(q, 500)
    inner = s.pop_counters()
    assert (inner.peak_bytes, inner.total_bytes, inner.total_count) == (500, 500, 1)
    s.deallocate(p, 1000)
    assert s.allocation_counts.current_bytes == 0
    assert s.allocation_counts.total_count == 2


def test_tracking_adaptor_lists_outstanding_allocations():
    t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
    p = t.allocate(777)
    q = t.allocate(4096)
    assert t.get_allocated_bytes() == 777 + 4096
    assert t.get_outstanding_allocations() == [(p, 777, 0), (q, 4096, 0)]
    text = t.get_outstanding_allocations_str()
    assert "0x%x: 777 bytes" % p in text and "4096 bytes" in text
    t.deallocate(p, 777)
    t.deallocate(q, 4096)
    assert t.get_allocated_bytes() == 0 and t.get_outstanding_allocations() == []


def test_logging_adaptor_writes_rmm_csv(tmp_path):
    lg = mr.LoggingResourceAdaptor(mr.HostMemoryResource(), log_file_name=str(tmp_path / "log.csv"))
    path = str(tmp_path / "log.dev0.csv")  # RMM's name: the device before the extension
    assert lg.get_file_name() == path
    p = lg.allocate(2048)
    lg.deallocate(p, 2048)
    lg.flush()
    lines = open(path).read().splitlines()
    assert lines[0].startswith("Thread,Time,Action,Pointer,Size,Stream")
    assert ",allocate," in lines[1] and ",2048," in lines[1]
    assert ",free," in lines[2]
    with pytest.raises(rmmc.InvalidArgumentError, match="RMM log file must be specified"):
        mr.LoggingResourceAdaptor(mr.HostMemoryResource(), log_file_name="")


def test_failure_callback_adaptor_calls_python_and_retries():
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), allocation_limit=4096)
    held = [lim.allocate(4096)]
    calls = []

    def on_failure(nbytes):
        calls.append(nbytes)
        if held:  # free what blocks the request, then retry
            lim.deallocate(held.pop(), 4096)
            return True
        return False
    fc = mr.FailureCallbackResourceAdaptor(lim, on_failure)
    p = fc.allocate(1024)
    assert calls == [1024] and lim.get_allocated_bytes() == 1024
    with pytest.raises(rmmc.OutOfMemoryError):
        fc.allocate(8192)
    assert calls == [1024, 8192]
    fc.deallocate(p, 1024)


def test_bad_arguments_are_clear_errors():
    host = mr.HostMemoryResource()
    with pytest.raises(TypeError, match="upstream_mr must be a memory resource object"):
        mr.PoolMemoryResource("host")
    with pytest.raises(TypeError, match="must not be None"):
        mr.PoolMemoryResource(None)
    with pytest.raises(TypeError, match="int\\) or a size"):
        mr.PoolMemoryResource(host, initial_pool_size=1.5)
    # Sizes as RMM's parse_bytes reads them: "1GB" is 10**9, "1G" is refused.
    assert mr.PoolMemoryResource(upstream_mr=host, initial_pool_size="1MB").spec == \
        "pool(initial=1000000) > host"
    with pytest.raises(rmmc.InvalidArgumentError, match="Could not parse 1G as a byte"):
        mr.PoolMemoryResource(host, initial_pool_size="1G")
    with pytest.raises(rmmc.InvalidArgumentError, match=">= 0"):
        mr.LimitingResourceAdaptor(host, -1)
    with pytest.raises(rmmc.InvalidArgumentError, match="min_size_exponent"):
        mr.BinningMemoryResource(host, 70)
    with pytest.raises(TypeError, match="abstract"):
        mr.DeviceMemoryResource()
    if rmmc.device_count() == 0:
        with pytest.raises(rmmc.NoDeviceError):
            mr.CudaMemoryResource()


# --- rmm.mr: the current resource -----------------------------------------------------------

def test_set_and_get_the_current_device_resource():
    assert not rmmc.is_initialized()
    s = mr.StatisticsResourceAdaptor(host_pool())
    mr.set_current_device_resource(s)
    assert rmmc.is_initialized() and mr.is_initialized()
    assert mr.get_current_device_resource() is s
    assert mr.get_per_device_resource(0) is s
    assert mr.get_current_device_resource_type() is mr.StatisticsResourceAdaptor
    # What the registry hands out (rmmc_allocate, DeviceBuffer) goes through it.
    b = rmmc.DeviceBuffer(size=3000)
    assert s.allocation_counts.current_bytes == 3000
    b.close()
    assert s.allocation_counts.current_bytes == 0
    # Set from elsewhere: a plain object around the registry's stack.
    rmmc.set_default("host", device=0)
    other = mr.get_current_device_resource()
    assert other is not s and type(other) is mr.DeviceMemoryResource
    assert layer_names(other) == ["host"]
    with pytest.raises(TypeError):
        mr.set_per_device_resource(0, "pool > host")


def test_no_gpu_answers_in_python_terms():
    if rmmc.device_count() > 0:
        pytest.skip("has a GPU")
    with pytest.raises(rmmc.NoDeviceError) as e:
        mr.get_current_device_resource()
    assert "rmmc.mr.set_current_device_resource(rmmc.mr.HostMemoryResource())" in str(e.value)
    assert "rmmc_set_device_resource" not in str(e.value)
    with pytest.raises(rmmc.NoDeviceError) as e:
        with rmmc.statistics():
            pass
    assert 'rmmc.set_default("host", device=0)' in str(e.value)
    assert "rmmc_set_device_resource" not in str(e.value)
    with pytest.raises(rmmc.NoDeviceError) as e:
        rmmc.DeviceBuffer(size=16)
    assert "rmmc.mr.set_current_device_resource" in str(e.value)
    with pytest.raises(rmmc.NoDeviceError):
        mr.available_device_memory()


# --- rmm.reinitialize and hooks -------------------------------------------------------------

def test_reinitialize_maps_rmm_keywords_onto_a_stack(tmp_path):
    log = str(tmp_path / "rmm.csv")
    calls = []
    rmmc.register_reinitialize_hook(calls.append, "first")
    rmmc.register_reinitialize_hook(calls.append, "second")
    rmmc.reinitialize(pool_allocator=True, initial_pool_size="2MiB", maximum_pool_size=1 << 26,
                      logging=True, log_file_name=log, devices=[0], base="host")
    assert calls == ["second", "first"]  # last registered first, as RMM
    cur = mr.get_current_device_resource()
    spec = rmmc.reinitialize_spec(pool_allocator=True, initial_pool_size="2MiB",
                                  maximum_pool_size=1 << 26, logging=True, log_file_name=log,
                                  base="host")
    log0 = str(tmp_path / "rmm.dev0.csv")
    assert cur.spec == spec == ('logging(path="%s") > pool(initial=2097152, maximum_size=67108864) > host'
                                % log0)
    assert layer_names(cur) == ["logging", "pool", "host"]
    assert rmmc.is_initialized()
    p = cur.allocate(100)
    cur.deallocate(p, 100)
    cur.resource.close()
    assert os.path.exists(log0)
    rmmc.unregister_reinitialize_hook(calls.append)
    rmmc.reinitialize(base="host")
    assert calls == ["second", "first"]
    assert layer_names(mr.get_current_device_resource()) == ["host"]
    # One stack per device, each its own (RMM's devices=[...]): with no GPU
    # every device number holds a host stack; with GPUs only those there.
    if rmmc.device_count() == 1:
        return
    rmmc.reinitialize(pool_allocator=True, devices=[0, 1], base="host")
    d0, d1 = mr.get_per_device_resource(0), mr.get_per_device_resource(1)
    assert d0.spec == d1.spec == "pool > host" and d0 is not d1 and d0.handle != d1.handle
    assert rmmc.is_initialized(0) and rmmc.is_initialized(1)


def test_reinitialize_specs_for_gpu_stacks_and_bad_input():
    assert rmmc.reinitialize_spec() == "cuda"
    assert rmmc.reinitialize_spec(managed_memory=True) == "managed"
    assert rmmc.reinitialize_spec(pool_allocator=True, managed_memory=True,
                                  initial_pool_size=1 << 30) == "pool(initial=1073741824) > managed"
    rmmc.validate(rmmc.reinitialize_spec(pool_allocator=True, maximum_pool_size="1GiB"))
    with pytest.raises(rmmc.InvalidArgumentError, match="device numbers"):
        rmmc.reinitialize(devices=[-1], base="host")
    with pytest.raises(rmmc.InvalidArgumentError, match="RMM log file must be specified"):
        rmmc.reinitialize(logging=True, base="host")
    # RMM's defaults and sizes: half the free memory, "1GB" = 10**9.
    assert rmmc.reinitialize_spec(pool_allocator=True) == "pool(initial=50%) > cuda"
    assert rmmc.reinitialize_spec(pool_allocator=True, initial_pool_size="1GB",
                                  maximum_pool_size="2GB") == \
        "pool(initial=1000000000, maximum_size=2000000000) > cuda"
    with pytest.raises(rmmc.InvalidArgumentError, match="base is None"):
        rmmc.reinitialize(base="disk")
    assert not rmmc.is_initialized()  # nothing was installed by the failures
    if rmmc.device_count() == 0:
        with pytest.raises(rmmc.NoDeviceError):
            rmmc.reinitialize(pool_allocator=True)
        assert not rmmc.is_initialized()


# --- rmm.statistics -------------------------------------------------------------------------

def test_statistics_enable_push_pop_and_profiler():
    mr.set_current_device_resource(host_pool())
    assert stats.get_statistics() is None and stats.push_statistics() is None
    assert stats.pop_statistics() is None
    stats.enable_statistics()
    stats.enable_statistics()  # once only
    assert layer_names(mr.get_current_device_resource()) == ["statistics", "pool", "host"]
    records = stats.ProfilerRecords()

    @stats.profiler(records=records)
    def work(n):
        b = rmmc.DeviceBuffer(size=n)
        return b.size

    assert work(1000) == 1000 and work(3000) == 3000
    with stats.profiler(records=records, name="block"):
        keep = rmmc.DeviceBuffer(size=512)
    (fname,) = [k for k in records.records if k.endswith("work")]
    r = records.records[fname]
    assert (r.num_calls, r.memory_total, r.memory_peak) == (2, 4000, 3000)
    assert records.records["block"].memory_peak == 512
    report = records.report()
    assert "memory_peak" in report and fname in report
    assert report.index(fname) < report.index("block")  # larger peak first
    assert stats.get_statistics().current_bytes == 512
    before = stats.push_statistics()
    assert before.current_bytes == 512
    keep.close()
    popped = stats.pop_statistics()
    assert popped.total_count == 0 and popped.current_bytes == -512
    with pytest.raises(ValueError):
        records.report(ordered_by="size")


def test_statistics_context_is_rmms():
    mr.set_current_device_resource(host_pool())
    with stats.statistics() as scope:
        b = rmmc.DeviceBuffer(size=2000)
        b.close()
    assert scope.peak_bytes == 2000 and scope.current_bytes == 0


# --- DeviceBuffer ---------------------------------------------------------------------------

def test_device_buffer_copies_and_resizes():
    host = mr.HostMemoryResource()
    b = rmmc.DeviceBuffer.to_device(b"hello rmmc", mr=host)
    assert b.size == len(b) == b.nbytes == 10 and b.memory_kind == "host"
    assert b.tobytes() == b"hello rmmc"
    b.copy_from_host(b"HELLO")
    assert bytes(b.copy_to_host()) == b"HELLO rmmc"  # a NumPy array, as RMM's
    out = bytearray(16)
    assert b.copy_to_host(out) is out and out[:10] == b"HELLO rmmc"
    b.resize(4)
    assert b.tobytes() == b"HELL" and b.capacity() == 10
    b.reserve(64)
    assert b.capacity() == 64 and b.tobytes() == b"HELL"
    c = rmmc.DeviceBuffer(size=4, mr=host)
    c.copy_from_device(b)
    assert c.tobytes() == b"HELL"
    d = rmmc.DeviceBuffer(ptr=bytearray(b"xyz"), mr=host)
    assert d.tobytes() == b"xyz"
    with pytest.raises(rmmc.InvalidArgumentError, match="do not fit"):
        c.copy_from_host(b"too long!")
    with pytest.raises(rmmc.InvalidArgumentError, match="writable buffer"):
        c.copy_to_host(bytes(4))
    with pytest.raises(rmmc.InvalidArgumentError, match="size must be"):
        rmmc.DeviceBuffer(size=-1, mr=host)
    with pytest.raises(TypeError, match="memory resource object"):
        rmmc.DeviceBuffer(size=1, mr="host")


def test_device_buffer_counts_against_its_resource():
    s = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b = rmmc.DeviceBuffer(size=4096, mr=s)
    assert s.allocation_counts.current_bytes == 4096
    b.close()
    b.close()
    assert s.allocation_counts.current_bytes == 0 and b.size == 0


def test_array_interfaces_of_host_memory():
    b = rmmc.DeviceBuffer.to_device(b"abcdef", mr=mr.HostMemoryResource())
    ai = b.__array_interface__
    assert ai["shape"] == (6,) and ai["typestr"] == "|u1" and ai["data"][0] == b.ptr
    assert ctypes.string_at(ai["data"][0], 6) == b"abcdef"
    assert not hasattr(b, "__cuda_array_interface__")
    assert b.__dlpack_device__() == (1, 0)  # kDLCPU


def test_dlpack_capsule_holds_the_buffer_until_deleted():
    from rmmc import buffer as bufmod
    api = ctypes.PyDLL(None)
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.restype = ctypes.c_int
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    s = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b = rmmc.DeviceBuffer.to_device(b"dlpack!", mr=s)
    ptr = b.ptr
    cap = b.__dlpack__()
    m = bufmod.DLManagedTensor.from_address(api.PyCapsule_GetPointer(cap, b"dltensor"))
    t = m.dl_tensor
    assert t.data == ptr and t.ndim == 1 and t.shape[0] == 7 and not t.strides
    assert (t.device.device_type, t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 1, 8, 1)
    assert ctypes.string_at(t.data, 7) == b"dlpack!"
    with pytest.raises(BufferError, match="still uses"):
        b.close()
    # A consumer takes it (renames the capsule) and deletes it later: the
    # memory stays allocated until then, even with the buffer dropped.
    assert api.PyCapsule_SetName(cap, b"used_dltensor") == 0
    del b, cap
    assert s.allocation_counts.current_bytes == 7
    m.deleter(ctypes.pointer(m))
    import gc
    gc.collect()
    assert s.allocation_counts.current_bytes == 0
    # Never consumed: the capsule's destructor lets go.
    b2 = rmmc.DeviceBuffer.to_device(b"x" * 100, mr=s)
    cap2 = b2.__dlpack__()
    del b2, cap2
    gc.collect()
    assert s.allocation_counts.current_bytes == 0 and not bufmod._EXPORTS
    b3 = rmmc.DeviceBuffer(size=8, mr=s)
    with pytest.raises(BufferError, match="copy=True"):
        b3.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="lives on"):
        b3.__dlpack__(dl_device=(2, 0))


def test_numpy_takes_host_buffers_without_a_copy():
    np = pytest.importorskip("numpy")
    b = rmmc.DeviceBuffer.to_device(bytes(range(10)), mr=mr.HostMemoryResource())
    a = np.from_dlpack(b)
    assert a.tolist() == list(range(10)) and a.ctypes.data == b.ptr
    assert np.asarray(b).ctypes.data == b.ptr


# --- stack_help and figure names ------------------------------------------------------------

def test_stack_help_of_one_resource_gives_units_and_defaults():
    text = rmmc.stack_help("pool")
    assert text.startswith("pool: ")
    line = [ln for ln in text.splitlines() if ln.split()[:1] == ["initial"]][0]
    assert "size (bytes; KiB..TiB) or % of free memory" in line
    assert "(default 0; 0 to 140737488355328)" in line  # the table row's range
    assert "fixed_size" in rmmc.stack_help() and "block" in rmmc.stack_help("fixed_size")
    with pytest.raises(rmmc.ParseError, match="did you mean 'pool'"):
        rmmc.stack_help("pol")


def test_one_set_of_figure_names():
    with rmmc.Resource("statistics > host") as r:
        p = r.allocate(1000)
        f = r.figures()
        assert f["current_bytes"] == f["in_use"] == 1000
        assert f["peak_bytes"] == f["peak"] == 1000
        r.deallocate(p, 1000)
    ps = rmmc.plugin_stats()
    assert ps["current_bytes"] == ps["bytes_in_use"] and "peak_bytes" in ps


def test_device_buffer_into_torch_and_cupy_on_a_gpu():
    """GPU machine (scripts/gpu-python): device memory through DLPack into
    PyTorch and through __cuda_array_interface__ into CuPy, no copy."""
    if rmmc.device_count() == 0:
        pytest.skip("no GPU")
    torch = pytest.importorskip("torch")
    s = mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(mr.CudaMemoryResource()))
    mr.set_current_device_resource(s)
    b = rmmc.DeviceBuffer.to_device(bytes(range(256)))
    assert b.memory_kind == "device" and b.__dlpack_device__() == (2, b.device)
    t = torch.from_dlpack(b)
    assert t.is_cuda and t.dtype == torch.uint8 and t.data_ptr() == b.ptr
    assert t.cpu().tolist() == list(range(256))
    t += 1  # the consumer writes the buffer's memory
    assert b.tobytes() == bytes((i + 1) % 256 for i in range(256))
    del t
    import gc
    gc.collect()
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        a = cupy.asarray(b)
        assert a.data.ptr == b.ptr and int(a.sum()) == sum((i + 1) % 256 for i in range(256))
        del a
        gc.collect()  # CuPy's view of the buffer keeps it until collected
    b.close()
    assert s.allocation_counts.current_bytes == 0
