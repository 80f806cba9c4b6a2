# SPDX-License-Identifier: Apache-2.0
"""rmmc.torch.pause/resume/sleep_state(pool=...) and pool_spec() without a
GPU or PyTorch (issue 29): the native backend is stood in for by an object
that answers rmmc_torch_native_pool_resource with host stacks, so the
wrapper's own work runs for real over rmmc's C pause: the pool found by
its MemPool id, each pool pausing and resuming on its own, the backup's
contents back, a chunk pool refused with the hint, an unknown pool, bad
arguments and the wrong backend refused before anything changes. The GPU
side is bench/workloads/torch_sleep.py (scripts/gpu-check --sleep)."""
import ctypes
import threading

import pytest

import rmmc
import rmmc.torch as rt
from rmmc._lib import lib


class FakeMemPool:
    """What rmmc.torch reads of a torch.cuda.MemPool: its id."""

    def __init__(self, a, b):
        self.id = (a, b)


class FakeDll:
    """The native backend's entry points the wrapper calls."""

    def __init__(self, pools):
        self.pools = pools  # (device, id0, id1) -> rmmc.Resource
        self.specs = []     # rmmc_torch_native_set_pool_spec's arguments, in order

    def rmmc_torch_native_pool_resource(self, device, a, b):
        r = self.pools.get((device, a, b))
        return lib().rmmc_resource_retain(r.handle) if r is not None else None

    def rmmc_torch_native_set_pool_spec(self, spec):
        self.specs.append(None if spec is None else spec.decode())


@pytest.fixture
def native(monkeypatch):
    """Installs a stand-in native backend with two host pools (MemPool ids
    (0, 1) and (0, 2) on device 0) and a chunk pool ((0, 3))."""
    pools = {(0, 0, 1): rmmc.Resource("statistics > pool(expandable=true, page=2MiB) > host"),
             (0, 0, 2): rmmc.Resource("pool(expandable=true, page=2MiB) > host"),
             (0, 0, 3): rmmc.Resource("pool(expandable=false) > host")}
    backend = object.__new__(rt.NativeBackend)
    backend._dll = FakeDll(pools)
    monkeypatch.setattr(rt, "_native_lib", backend)
    monkeypatch.setattr(rt, "_backend", "native")
    yield pools, backend._dll
    for r in pools.values():
        r.close()


def test_pools_pause_and_resume_independently(native):
    pools, _ = native
    weights, cache = pools[(0, 0, 1)], pools[(0, 0, 2)]
    wp, cp = FakeMemPool(0, 1), FakeMemPool(0, 2)
    w = weights.allocate(5 << 20)
    c = cache.allocate(3 << 20)
    ctypes.memset(w, 0x5A, 5 << 20)
    ctypes.memset(c, 0x33, 3 << 20)
    held_w = rt.sleep_state(device=0, pool=wp)["held"]
    assert held_w >= 5 << 20
    rt.pause(mode="backup", device=0, stream=0, pool=wp)
    s = rt.sleep_state(device=0, pool=wp.id)  # the id serves as well as the pool
    assert s["paused"] and s["mode"] == "backup" and s["held"] == 0
    assert s["unmapped"] == held_w and s["backed_up"] >= 5 << 20
    # The other pool is awake: it allocates and its data is untouched.
    assert not rt.sleep_state(device=0, pool=cp)["paused"]
    c2 = cache.allocate(1 << 20)
    assert ctypes.string_at(c, 3 << 20) == b"\x33" * (3 << 20)
    with pytest.raises(rmmc.OutOfMemoryError, match="paused"):
        weights.allocate(4096)
    rt.pause(mode="discard", device=0, stream=0, pool=cp)
    assert rt.sleep_state(device=0, pool=cp)["mode"] == "discard"
    assert cache.figures()["reserved"] == 0
    # Resumed in the other order: each on its own.
    rt.resume(device=0, stream=0, pool=cp)
    assert rt.sleep_state(device=0, pool=wp)["paused"]
    assert not rt.sleep_state(device=0, pool=cp)["paused"]
    rt.resume(device=0, stream=0, pool=wp)
    assert ctypes.string_at(w, 5 << 20) == b"\x5a" * (5 << 20)
    s = rt.sleep_state(device=0, pool=wp)
    assert not s["paused"] and s["pauses"] == s["resumes"] == 1
    assert rt.sleep_state(device=0, pool=cp)["pauses"] == 1
    with pytest.raises(rmmc.InvalidArgumentError, match="not paused"):
        rt.resume(device=0, stream=0, pool=wp)
    weights.deallocate(w, 5 << 20)
    cache.deallocate(c, 3 << 20)
    cache.deallocate(c2, 1 << 20)


def test_pool_resource_is_the_pools_stack(native):
    pools, _ = native
    with rt.pool_resource(FakeMemPool(0, 1), device=0) as r:
        assert r.handle == pools[(0, 0, 1)].handle
        assert [n for n, _ in r.layers()] == ["statistics", "pool", "host"]


def test_a_chunk_pool_refuses_and_says_how_to_get_one_that_sleeps(native):
    pools, _ = native
    p = pools[(0, 0, 3)].allocate(1 << 20)
    with pytest.raises(rmmc.NotSupportedError) as e:
        rt.pause(mode="backup", device=0, stream=0, pool=FakeMemPool(0, 3))
    text = str(e.value)
    assert "chunks" in text and "rmmc.torch.pool_spec" in text and "(0, 3)" in text
    assert not rt.sleep_state(device=0, pool=FakeMemPool(0, 3))["paused"]
    with pytest.raises(rmmc.NotSupportedError, match="chunk"):
        rt.resume(device=0, stream=0, pool=FakeMemPool(0, 3))
    pools[(0, 0, 3)].deallocate(p, 1 << 20)


def test_an_unknown_pool_is_refused(native):
    for call in (lambda: rt.pause(device=0, stream=0, pool=FakeMemPool(0, 9)),
                 lambda: rt.resume(device=0, stream=0, pool=(0, 9)),
                 lambda: rt.sleep_state(device=0, pool=[0, 9]),
                 lambda: rt.pool_resource((0, 1), device=1)):
        with pytest.raises(ValueError, match="no private pool"):
            call()


@pytest.mark.parametrize("pool,err", [("weights", TypeError), ((1,), TypeError),
                                      ((1, 2, 3), TypeError), ((True, 1), TypeError),
                                      ((1.0, 2), TypeError), ((0, 0), ValueError),
                                      ((-1, 2), ValueError), (FakeMemPool(0, 0), ValueError)])
def test_bad_pool_arguments(native, pool, err):
    pools, _ = native
    with pytest.raises(err, match="rmmc.torch.pause"):
        rt.pause(mode="discard", device=0, stream=0, pool=pool)
    assert all(not r.sleep_state()["paused"] for r in pools.values() if
               r.sleep_state()["can_sleep"])


def test_a_bad_mode_is_refused_first(monkeypatch):
    monkeypatch.setattr(rt, "_backend", None)
    monkeypatch.setattr(rt, "_native_lib", None)
    with pytest.raises(rmmc.InvalidArgumentError, match="'backup' or 'discard'"):
        rt.pause(mode="sleep", pool=FakeMemPool(0, 1))


@pytest.mark.parametrize("backend", [None, "plugin"])
def test_pools_need_the_native_backend(monkeypatch, backend):
    monkeypatch.setattr(rt, "_backend", backend)
    monkeypatch.setattr(rt, "_native_lib", None)
    want = "plug-in" if backend else "has not run"
    for call in (lambda: rt.pause(device=0, stream=0, pool=FakeMemPool(0, 1)),
                 lambda: rt.resume(device=0, stream=0, pool=FakeMemPool(0, 1)),
                 lambda: rt.sleep_state(device=0, pool=FakeMemPool(0, 1)),
                 lambda: rt.pool_spec("pool > cuda").__enter__()):
        with pytest.raises(RuntimeError, match="native backend") as e:
            call()
        assert want in str(e.value)


def test_pool_spec_nests_per_thread_and_checks_the_spec(native):
    _, dll = native
    with rt.pool_spec("pool(expandable=true) > cuda") as s:
        assert s == "pool(expandable=true) > cuda"
        with rt.pool_spec("pool > cuda(ipc=true)"):
            seen = []
            t = threading.Thread(target=lambda: seen.append(getattr(rt._pool_specs, "stack",
                                                                    None)))
            t.start()
            t.join()
            assert seen == [None]  # another thread's pools keep the default
        assert dll.specs[-1] == "pool(expandable=true) > cuda"
    assert dll.specs == ["pool(expandable=true) > cuda", "pool > cuda(ipc=true)",
                         "pool(expandable=true) > cuda", None]
    with pytest.raises(rmmc.ParseError):
        with rt.pool_spec("pool(expandable=maybe) > cuda"):
            pass
    with pytest.raises(TypeError, match="str"):
        with rt.pool_spec(b"pool > cuda"):
            pass
    assert dll.specs[-1] is None and len(dll.specs) == 4  # a refused spec set nothing
    with pytest.raises(KeyError):
        with rt.pool_spec("pool > cuda"):
            raise KeyError("inside")
    assert dll.specs[-1] is None  # restored on the way out of an exception
