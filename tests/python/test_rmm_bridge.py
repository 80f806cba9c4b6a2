# SPDX-License-Identifier: Apache-2.0
"""rmmc.rmm against RMM's own Python package, on host stacks (RMM imports
and its resource objects work without a GPU): an rmmc stack as RMM's
per-device resource, RMM's adaptors, pool and DeviceBuffer over it with
rmmc's figures counting every byte, rmmc's layers over RMM's resources
(and RMM's exceptions coming up as rmmc's statuses), the lifetime of both
sides, and the C++ timing loop. The compiled layer is built on first use
(tests run it as a user would). Skipped without rmm (scripts/check-python
installs rmm-cu13)."""
import ctypes
import gc
import pickle

import pytest

rmm = pytest.importorskip("rmm")

import rmmc  # noqa: E402
import rmmc.rmm  # noqa: E402
from rmmc._lib import lib  # noqa: E402


@pytest.fixture(autouse=True)
def clean():
    lib().rmmc_registry_clear()
    yield
    lib().rmmc_registry_clear()


def in_use(r):
    return int(r.figures()["in_use"])


def test_an_rmmc_stack_is_rmms_device_resource():
    mr = rmmc.rmm.use("statistics > pool(initial=1MiB) > host", device=0)
    assert isinstance(mr, rmm.mr.DeviceMemoryResource)
    assert type(mr).__name__ == "RmmcMemoryResource"
    assert rmm.mr.get_per_device_resource(0) is mr
    # The same stack is rmmc's registry resource for the device.
    with rmmc.get_default(0) as reg:
        assert reg.handle == mr.handle
    assert rmmc.rmm.current_stack(0).handle == mr.handle
    p = mr.allocate(1000)
    ctypes.memset(p, 3, 1000)
    assert ctypes.string_at(p + 999, 1) == b"\x03"
    assert in_use(mr) == 1000
    mr.deallocate(p, 1000)
    assert in_use(mr) == 0


def test_rmms_consumers_allocate_through_rmmc():
    mr = rmmc.rmm.use("statistics > pool(initial=1MiB) > host", device=0)
    # RMM's statistics adaptor over rmmc: both count the same bytes.
    st = rmm.mr.StatisticsResourceAdaptor(mr)
    q = st.allocate(4096)
    assert st.allocation_counts.current_bytes == 4096 and in_use(mr) == 4096
    st.deallocate(q, 4096)
    assert in_use(mr) == 0
    # RMM's DeviceBuffer from it.
    b = rmm.DeviceBuffer(size=100, mr=mr)
    assert b.size == 100 and in_use(mr) == 100
    del b
    gc.collect()
    assert in_use(mr) == 0
    # RMM's pool takes its initial pool from rmmc and serves from it.
    pool = rmm.mr.PoolMemoryResource(mr, initial_pool_size=1 << 20, maximum_pool_size=1 << 21)
    assert in_use(mr) == 1 << 20
    x = pool.allocate(100)
    assert in_use(mr) == 1 << 20
    pool.deallocate(x, 100)
    del pool
    gc.collect()
    assert in_use(mr) == 0


def test_out_of_memory_reaches_rmm_as_memoryerror():
    mr = rmmc.rmm.use("limiting(limit=64KiB) > host", device=0)
    with pytest.raises(MemoryError, match="rmmc: out of memory"):
        rmm.DeviceBuffer(size=1 << 20, mr=mr)
    with pytest.raises(MemoryError):
        mr.allocate(1 << 20)
    assert in_use(rmmc.rmm.current_stack(0)) == 0


def test_rmmc_layers_over_an_rmm_resource():
    rmmc_base = rmmc.rmm.use("statistics > host", device=0)
    rmm_stats = rmm.mr.StatisticsResourceAdaptor(rmmc_base)
    r = rmmc.rmm.over(rmm_stats, "statistics > limiting(limit=1MiB)", kind="host")
    assert [n for n, _ in r.layers()] == ["statistics", "limiting", "rmm"]
    assert r.memory_kind == "host"
    a = r.allocate(5000)
    ctypes.memset(a, 1, 5000)
    assert rmm_stats.allocation_counts.current_bytes == 5000 and in_use(rmmc_base) == 5000
    r.deallocate(a, 5000)
    assert rmm_stats.allocation_counts.current_bytes == 0
    with pytest.raises(rmmc.OutOfMemoryError, match="limiting"):
        r.allocate(2 << 20)
    # An RMM resource refusing comes up as rmmc's status with RMM's text.
    tight = rmm.mr.LimitingResourceAdaptor(rmmc_base, 4096)
    with rmmc.rmm.over(tight, kind="host") as t:
        with pytest.raises(rmmc.OutOfMemoryError, match="the RMM resource: .*out_of_memory"):
            t.allocate(8192)
    # The rmmc stack keeps the RMM object alive until the stack goes.
    del rmm_stats
    gc.collect()
    assert len(rmmc.rmm._UPSTREAMS) == 1
    a = r.allocate(100)
    r.deallocate(a, 100)
    r.close()
    gc.collect()
    assert rmmc.rmm._UPSTREAMS == {}
    # As an rmmc.mr object under rmmc.mr's adaptors.
    import rmmc.mr as mr
    up = rmmc.rmm.from_rmm(rmm.mr.StatisticsResourceAdaptor(rmmc_base), kind="host")
    lim = mr.LimitingResourceAdaptor(up, 1 << 20)
    assert lim.spec == "limiting(limit=1048576) > rmm"
    p = lim.allocate(256)
    assert lim.get_allocated_bytes() == 256
    lim.deallocate(p, 256)


def test_refusals():
    mr = rmmc.rmm.use("host", device=0)
    with pytest.raises(TypeError, match="cannot be copied or pickled"):
        pickle.dumps(mr)
    import copy
    with pytest.raises(TypeError):
        copy.copy(mr)
    with pytest.raises(TypeError, match="RMM resource object"):
        rmmc.rmm.over(object())
    with pytest.raises(TypeError, match="a spec"):
        rmmc.rmm.use(42)
    with pytest.raises(rmmc.ParseError):
        rmmc.rmm.use("pool > hots", device=0)
    with pytest.raises(rmmc.InvalidArgumentError, match="kind"):
        rmmc.rmm.over(mr, kind="gpu")
    with pytest.raises(TypeError, match="not both"):
        rmmc.rmm.reinitialize("host", pool_allocator=True)
    # A refused use() leaves RMM's resource as it was.
    assert rmm.mr.get_per_device_resource(0) is mr


def test_reinitialize_runs_rmms_hooks_and_builds_every_device_first():
    calls = []
    rmm.register_reinitialize_hook(calls.append, "hook")
    try:
        rmmc.rmm.reinitialize(pool_allocator=True, initial_pool_size="1MiB", base="host")
    finally:
        rmm.unregister_reinitialize_hook(calls.append)
    assert calls == ["hook"]
    mr = rmm.mr.get_per_device_resource(0)
    assert mr.spec == "pool(initial=1048576) > host"
    before = mr
    with pytest.raises(rmmc.ParseError):
        rmmc.rmm.reinitialize("pool > nothing")
    assert rmm.mr.get_per_device_resource(0) is before


def test_the_bridge_costs_little_over_rmmc_alone():
    mr = rmmc.rmm.use("pool > host", device=0)
    rmmc.rmm.bench_pairs(mr, 256, 20000)  # warm
    through_rmm = min(rmmc.rmm.bench_pairs(mr, 256, 50000) for _ in range(3))
    alone = min(rmmc.rmm.bench_pairs(mr.resource, 256, 50000) for _ in range(3))
    assert through_rmm > 0 and alone > 0
    # One call through RMM's resource_ref and rmmc's C++ object: a few ns
    # here; the bound only catches a Python call or a lock on the path.
    assert through_rmm < alone + 200, (through_rmm, alone)
