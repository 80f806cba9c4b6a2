# SPDX-License-Identifier: Apache-2.0
"""A stateful property test of the Python layer (hypothesis): random
sequences over rmmc.Resource (and its copies), rmmc.mr objects and the
registry, DeviceBuffer (resize, reserve, copies, pickling, DLPack and
array interface exports), sleep mode, statistics blocks from threads and
reinitialize, on host stacks, with every argument drawn across types and
ranges (out of range, negative, huge, floats, strings, None, bools, stream
objects). A model says what each call must do: the value it returns, the
exception a bad argument must raise with nothing changed, the bytes each
block and buffer holds, the figures of statistics layers; at the end every
stack must hold exactly the reference its witness keeps (nothing leaked,
nothing released twice). Under the ASan build (meson test python_asan) a
use-after-free anywhere fails at once.

Budget: RMMC_HYPOTHESIS_EXAMPLES sequences (default 10, for the plain
runs in python_package, check-python and check-wheel; python_asan runs
40) of at most RMMC_HYPOTHESIS_STEPS steps (default 40), from
RMMC_HYPOTHESIS_SEED (default: a fixed seed, so CI is reproducible;
"random" for a new one each run; scripts/python-fuzz runs it for as long
as you like). A failure
prints the shrunk sequence and the @reproduce_failure blob that replays it.
"""
import copy
import ctypes
import gc
import os
import pickle
import threading
import warnings

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings, strategies as st  # noqa: E402
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, invariant,  # noqa: E402
                                 multiple, rule, run_state_machine_as_test)

import rmmc  # noqa: E402
import rmmc.mr as mr  # noqa: E402
from rmmc import buffer as bufmod  # noqa: E402
from rmmc._lib import lib  # noqa: E402

SIZE_MAX = PTR_MAX = (1 << 64) - 1
INT_MAX = (1 << 31) - 1

# ---- the oracle: what a value must do, written apart from rmmc._args ------------------------


def int_error(v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        return TypeError
    if v < lo:
        return ValueError
    if v > hi:
        return OverflowError
    return None


def size_error(v):
    return int_error(v, 0, SIZE_MAX)


def alignment_error(v):
    e = size_error(v)
    if e is None and (v == 0 or v & (v - 1)):
        return ValueError
    return e


class TorchStream:
    def __init__(self, v):
        self.cuda_stream = v


class CupyStream:
    def __init__(self, v):
        self.ptr = v


class NumbaStream:
    def __init__(self, v):
        self.handle = ctypes.c_void_p(v) if isinstance(v, int) and 0 <= v <= PTR_MAX else v


class ProtocolStream:
    def __init__(self, version, v):
        self._p = (version, v)

    def __cuda_stream__(self):
        return self._p


class NotAStream:
    pass


def stream_error(s):
    if s is None:
        return None
    if isinstance(s, TorchStream):
        return int_error(s.cuda_stream, 0, PTR_MAX)
    if isinstance(s, CupyStream):
        return int_error(s.ptr, 0, PTR_MAX)
    if isinstance(s, NumbaStream):
        h = s.handle
        return None if isinstance(h, ctypes.c_void_p) else (int_error(h, 0, PTR_MAX) if h is not None else None)
    if isinstance(s, ProtocolStream):
        version, v = s._p
        e = int_error(version, 0, INT_MAX * 4)
        if e is not None:
            return TypeError if e is TypeError else ValueError
        if version != 0:
            return ValueError
        return int_error(v, 0, PTR_MAX)
    if isinstance(s, (NotAStream, mr.DeviceMemoryResource, rmmc.Resource)):
        return TypeError
    return int_error(s, 0, PTR_MAX)


def device_error(v):
    return int_error(v, 0, INT_MAX)


# ---- strategies: valid values most of the time, anything else the rest ----------------------

HUGE = st.sampled_from([2 ** 64, 2 ** 64 + 16, 2 ** 64 + 4096, 2 ** 70, 2 ** 200, SIZE_MAX + 1])
NEGATIVE = st.sampled_from([-1, -16, -(2 ** 63), -(2 ** 64) + 16])
JUNK = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.booleans(),
                 st.binary(max_size=3), st.just([16]), st.just(NotAStream()))
ANY_INT = st.one_of(st.integers(-(2 ** 66), 2 ** 66), HUGE, NEGATIVE)


def sometimes_bad(good, bad=st.one_of(HUGE, NEGATIVE, JUNK)):
    return st.one_of(good, good, good, good, bad)


SIZES = sometimes_bad(st.one_of(st.integers(0, 4096), st.integers(4097, 1 << 18)))
SIZES_OR_HUGE_VALID = st.one_of(SIZES, st.just(1 << 50))
ALIGNMENTS = sometimes_bad(st.sampled_from([1, 2, 64, 256, 512, 4096]),
                           st.one_of(st.sampled_from([0, 3, 100, 257]), HUGE, NEGATIVE, JUNK))
STREAM_VALUES = st.one_of(st.integers(0, 1 << 48), st.sampled_from([0, 1, 2, PTR_MAX]))
STREAMS = st.one_of(
    st.none(), STREAM_VALUES, STREAM_VALUES, STREAM_VALUES,
    st.builds(TorchStream, st.one_of(STREAM_VALUES, ANY_INT, JUNK)),
    st.builds(CupyStream, st.one_of(STREAM_VALUES, ANY_INT)),
    st.builds(NumbaStream, st.one_of(STREAM_VALUES, ANY_INT, st.floats())),
    st.builds(ProtocolStream, st.one_of(st.just(0), st.just(0), st.integers(-2, 3), JUNK),
              st.one_of(STREAM_VALUES, ANY_INT, JUNK)),
    ANY_INT, JUNK)
DEVICES = st.one_of(st.just(0), st.just(0), st.integers(-3, 70), HUGE, JUNK)

# Stacks over host memory; `pausable`: the pool is the outermost caching
# layer (caching layers above a paused pool are issue 41's F14, fixed in C).
SPECS = [("host", False, False), ("pool > host", True, False),
         ("statistics > pool > host", True, True),
         ("limiting(limit=1MiB) > pool > host", True, False),
         ("tracking > pool > host", True, False), ("binning > pool > host", False, False),
         ("fixed_size(block=4096) > pool > host", False, False), ("arena > host", False, False),
         ("statistics > host", False, True), ("pool(expandable=false) > host", False, False)]


def bad(*errors):
    """The exception types the bad arguments among `errors` may raise."""
    return tuple(e for e in errors if e is not None)


_PATTERNS = {}


def pattern(seed, n):
    """n bytes that depend on seed (251 bytes, repeated)."""
    base = _PATTERNS.get(seed)
    if base is None:
        base = _PATTERNS[seed] = bytes((seed + i * 7) & 0xFF for i in range(251))
    return (base * (n // 251 + 1))[:n]


# ---- the model ---------------------------------------------------------------------------------

class Stack:
    """One C stack and what the model knows of it."""

    def __init__(self, spec, pausable, counts, witness):
        self.spec, self.pausable = spec, pausable
        self.witness = witness      # a Resource kept to the end: the stack's last reference
        self.blocks = {}            # ptr -> (nbytes, alignment, pattern seed)
        self.paused = None          # "backup" / "discard" / None
        self.exact = counts         # a statistics layer on top counting only the model's blocks


class Buf:
    """A DeviceBuffer and what it must hold."""

    def __init__(self, b, content):
        self.b, self.content = b, bytearray(content)
        self.retired = []           # (address, bytes) an array interface may still read
        self.shared = False         # an array interface was handed out for its memory
        self.closed = False


class Capsule:
    def __init__(self, cap, buf, ptr):
        self.cap, self.buf, self.ptr = cap, buf, ptr
        self.managed = None         # the DLManagedTensor once a consumer took it


class PythonLayer(RuleBasedStateMachine):
    # Bundles hold tokens; the objects live in self.objs, so that the end
    # can drop every one of them and count the references left.
    resources = Bundle("resources")
    blocks = Bundle("blocks")
    mrs = Bundle("mrs")
    buffers = Bundle("buffers")
    capsules = Bundle("capsules")

    def __init__(self):
        super().__init__()
        lib().rmmc_registry_clear()
        mr._SET.clear()
        self.objs = {}              # token -> object
        self.next_token = 1000
        self.stacks = []            # every Stack, in creation order
        self.of = {}                # id(Resource or mr object) -> Stack (objects kept in objs/keep)
        self.keep = []
        self.current = None         # the registry's mr object for device 0, as the model has it
        self.seed = 0
        warnings.simplefilter("ignore", ResourceWarning)

    # -- helpers --
    def put(self, obj):
        self.next_token += 1
        self.objs[self.next_token] = obj
        return self.next_token

    def _stack_for(self, obj, spec, pausable, counts):
        res = obj if isinstance(obj, rmmc.Resource) else obj.resource
        s = Stack(spec, pausable, counts, copy.copy(res))
        self.stacks.append(s)
        self._bind(obj, s)
        return s

    def _bind(self, obj, s):
        self.of[id(obj)] = s
        self.keep.append(obj)

    def _next_seed(self):
        self.seed = (self.seed + 37) % 251
        return self.seed

    def _registry_handle(self):
        h = ctypes.c_void_p()
        if lib().rmmc_retain_device_resource(0, ctypes.byref(h)) != 0:
            return None
        lib().rmmc_resource_release(h.value)
        return h.value

    def _dlpack_alive(self, x):
        return any(c.buf is x and c.cap is not None for c in self._caps())

    def _caps(self):
        return [o for o in self.objs.values() if isinstance(o, Capsule)]

    def _bufs(self):
        return [o for o in self.objs.values() if isinstance(o, Buf)]

    # -- Resource ----------------------------------------------------------------------------
    @rule(target=resources, which=st.sampled_from(SPECS))
    def new_resource(self, which):
        spec, pausable, counts = which
        r = rmmc.Resource(spec)
        self._stack_for(r, spec, pausable, counts)
        return self.put(r)

    @rule(target=resources, t=resources)
    def copy_resource(self, t):
        r = self.objs[t]
        if r.closed:
            with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
                copy.copy(r)
            return multiple()
        c = copy.copy(r)
        assert c.handle == r.handle and c is not r
        self._bind(c, self.of[id(r)])
        return self.put(c)

    @rule(t=resources, how=st.sampled_from(["pickle", "deepcopy"]))
    def pickle_resource(self, t, how):
        r = self.objs[t]
        with pytest.raises(TypeError):
            pickle.dumps(r) if how == "pickle" else copy.deepcopy(r)

    @rule(t=resources)
    def close_resource(self, t):
        r = self.objs[t]
        r.close()
        assert r.closed
        r.close()  # idempotent
        with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
            r.allocate(16)
        with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
            r.figures()

    @rule(target=blocks, t=resources, n=SIZES_OR_HUGE_VALID, alignment=ALIGNMENTS,
          stream=STREAMS)
    def allocate(self, t, n, alignment, stream):
        r = self.objs[t]
        s = self.of[id(r)]
        before = s.witness.figures().get("in_use")
        errors = bad(size_error(n), alignment_error(alignment), stream_error(stream))

        def call():
            return r.allocate(n, stream=stream, alignment=alignment)
        if errors or r.closed:
            with pytest.raises(errors or rmmc.InvalidArgumentError):
                call()
            assert s.witness.figures().get("in_use") == before
            return multiple()
        if n == 0:  # NULL with success, paused or not
            assert call() == 0
            return multiple()
        if s.paused or n >= 1 << 50:
            # Paused: refused at once; huge: no host memory for it.
            with pytest.raises((rmmc.OutOfMemoryError, rmmc.NotSupportedError)):
                call()
            assert s.witness.figures().get("in_use") == before
            return multiple()
        try:
            p = call()
        except (rmmc.OutOfMemoryError, rmmc.NotSupportedError):
            # limiting's 1 MiB, fixed_size's block size: the stack's own refusal.
            assert "limiting" in s.spec or "fixed_size" in s.spec, s.spec
            assert s.witness.figures().get("in_use") == before
            return multiple()
        assert p and p % max(alignment, 256) == 0
        for q, (m, _a, _seed) in s.blocks.items():
            assert p + n <= q or q + m <= p, "blocks overlap"
        seed = self._next_seed()
        ctypes.memmove(p, pattern(seed, n), n)
        s.blocks[p] = (n, alignment, seed)
        return self.put((s, p))

    @rule(b=consumes(blocks), t=resources, stream=STREAMS,
          wrong=st.sampled_from([None, None, None, "ptr", "nbytes", "alignment"]))
    def deallocate(self, b, t, stream, wrong):
        s, p = self.objs.pop(b)
        r = self.objs[t]
        n, alignment, seed = s.blocks[p]
        if s.paused is None:
            assert ctypes.string_at(p, n) == pattern(seed, n), "a block lost its contents"
        if self.of[id(r)] is not s or r.closed:
            r = s.witness  # through a wrapper of its own stack
        if wrong is not None or stream_error(stream) is not None:
            args = {"ptr": p, "nbytes": n, "alignment": alignment, "stream": stream}
            if wrong == "ptr":
                args["ptr"] = p + (1 << 64)
            elif wrong == "nbytes":
                args["nbytes"] = -n
            elif wrong == "alignment":
                args["alignment"] = float(alignment)
            with pytest.raises((TypeError, ValueError, OverflowError)):
                r.deallocate(**args)
            stream = 0
        r.deallocate(p, n, stream=stream, alignment=alignment)
        del s.blocks[p]

    @rule(t=resources, mode=st.one_of(st.sampled_from(["backup", "discard"]), JUNK,
                                      st.just("sleep")), stream=STREAMS)
    def pause(self, t, mode, stream):
        r = self.objs[t]
        s = self.of[id(r)]
        wrong_mode = not isinstance(mode, str) or mode not in ("backup", "discard")
        if wrong_mode or stream_error(stream) is not None:
            with pytest.raises((TypeError, ValueError, OverflowError)):
                r.pause(mode, stream=stream)
        elif r.closed:
            with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
                r.pause(mode, stream=stream)
        elif not s.pausable:
            if s.spec in ("host", "statistics > host", "pool(expandable=false) > host"):
                with pytest.raises(rmmc.RmmcError):
                    r.pause(mode, stream=stream)
            return
        elif s.paused:
            try:
                r.pause(mode, stream=stream)  # asleep already: refused, or nothing to do
            except rmmc.RmmcError:
                pass
        else:
            r.pause(mode, stream=stream)
            s.paused = mode
        if s.pausable:
            state = s.witness.sleep_state()
            assert bool(state["paused"]) == bool(s.paused)

    @rule(t=resources, stream=STREAMS)
    def resume(self, t, stream):
        r = self.objs[t]
        s = self.of[id(r)]
        if not s.pausable:
            return
        if stream_error(stream) is not None:
            with pytest.raises((TypeError, ValueError, OverflowError)):
                r.resume(stream=stream)
        elif r.closed:
            with pytest.raises(rmmc.InvalidArgumentError, match="closed"):
                r.resume(stream=stream)
        elif not s.paused:
            try:
                r.resume(stream=stream)
            except rmmc.RmmcError:
                pass
        else:
            r.resume(stream=stream)
            for p, (n, a, seed) in list(s.blocks.items()):
                if s.paused == "backup":
                    assert ctypes.string_at(p, n) == pattern(seed, n), "backup lost data"
                else:  # discarded: whatever is there now; write a fresh pattern
                    seed = self._next_seed()
                    ctypes.memmove(p, pattern(seed, n), n)
                    s.blocks[p] = (n, a, seed)
            s.paused = None
        assert bool(s.witness.sleep_state()["paused"]) == bool(s.paused)

    # -- rmmc.mr and the registry ----------------------------------------------------------
    @rule(target=mrs, kind=st.sampled_from(["host", "pool", "statistics", "limiting",
                                            "binning", "failure"]),
          upstream=st.one_of(st.none(), mrs), size=sometimes_bad(st.sampled_from(
              [None, 0, 4096, 1 << 20, "1MiB"]), st.one_of(HUGE, NEGATIVE, st.floats())))
    def new_mr(self, kind, upstream, size):
        if upstream is None:
            up = mr.HostMemoryResource()
            self._stack_for(up, "host", False, False)
        else:
            up = self.objs[upstream]
        size_is_bad = size is not None and not isinstance(size, str) and size_error(size) is not None
        make = {
            "host": lambda: mr.HostMemoryResource(),
            "pool": lambda: mr.PoolMemoryResource(up, initial_pool_size=size),
            "statistics": lambda: mr.StatisticsResourceAdaptor(up),
            # A bad size is passed on to be refused; any other is 1 GiB, a
            # limit the model never reaches (a binning over a 1 MiB limit
            # cannot take one 2 MiB chunk: a refusal, not a finding).
            "limiting": lambda: mr.LimitingResourceAdaptor(up, size if size_is_bad else 1 << 30),
            "binning": lambda: mr.BinningMemoryResource(up),
            "failure": lambda: mr.FailureCallbackResourceAdaptor(up, lambda n: False),
        }[kind]
        if kind in ("pool", "limiting") and size_is_bad:
            with pytest.raises(size_error(size)):
                make()
            return multiple()
        obj = make()
        if kind != "host":
            self.of[id(up)].exact = False  # what goes through it now comes from above too
        self._stack_for(obj, obj.spec, False, False)
        return self.put(obj)

    @rule(target=mrs, t=mrs)
    def copy_mr(self, t):
        m = self.objs[t]
        c = copy.copy(m)
        assert type(c) is type(m) and c.handle == m.handle and c.resource is not m.resource
        self._bind(c, self.of[id(m)])
        return self.put(c)

    @rule(t=mrs, how=st.sampled_from(["pickle", "deepcopy"]))
    def pickle_mr(self, t, how):
        with pytest.raises(TypeError):
            m = self.objs[t]
            pickle.dumps(m) if how == "pickle" else copy.deepcopy(m)

    @rule(t=consumes(mrs))
    def drop_mr(self, t):
        self.objs.pop(t)  # the stack stays while its witness, the registry or a buffer holds it
        gc.collect()

    @rule(t=mrs, device=DEVICES)
    def set_current(self, t, device):
        m = self.objs[t]
        e = None if device is None else device_error(device)  # None: the current device (0)
        if e is None and device is not None and device >= 64:
            e = ValueError
        before = self._registry_handle()
        if e is not None:
            with pytest.raises(e):
                mr.set_per_device_resource(device, m)
            assert self._registry_handle() == before
            return
        mr.set_per_device_resource(device, m)
        if device in (0, None):
            self.current = m
            assert mr.get_per_device_resource(0) is m

    @rule()
    def get_current(self):
        if self.current is None:
            if rmmc.device_count() > 0:  # the device's process default
                assert mr.get_current_device_resource().handle
                return
            with pytest.raises(rmmc.NoDeviceError):
                mr.get_current_device_resource()
            return
        g = mr.get_current_device_resource()
        assert g.handle == self.current.handle
        p = g.allocate(100)
        g.deallocate(p, 100)

    @rule(devices=st.one_of(st.lists(DEVICES, min_size=0, max_size=3), DEVICES),
          pool=st.booleans())
    def reinitialize(self, devices, pool):
        items = devices if isinstance(devices, list) else [devices]
        wrong = (not isinstance(devices, (list, int)) or isinstance(devices, bool) or not items
                 or any(int_error(d, 0, 63) is not None for d in items))
        before = self._registry_handle()

        def call():
            rmmc.reinitialize(pool_allocator=pool, devices=devices, base="host")
        if wrong:
            with pytest.raises((TypeError, ValueError, OverflowError)):
                call()
            assert self._registry_handle() == before
            return
        call()
        if 0 in items:
            self.current = mr.get_per_device_resource(0)
            names = [n for n, _ in self.current.resource.layers()]
            assert names == (["pool", "host"] if pool else ["host"])
            self._stack_for(self.current, self.current.spec, False, False)

    @rule(threads=st.integers(1, 8), n=st.integers(0, 1 << 16), depth=st.integers(1, 3))
    def statistics_from_threads(self, threads, n, depth):
        """Threads each open `depth` nested statistics blocks; blocks of
        different threads overlap in whatever order they run."""
        before = self._registry_handle()
        errors, scopes = [], []

        def blocks(i, level):
            with rmmc.statistics(0) as sc:
                b = rmmc.DeviceBuffer(size=n + i)
                if level > 1:
                    blocks(i, level - 1)
                sc.get()
                b.close()
            scopes.append((i, level, sc))

        def work(i):
            try:
                blocks(i, depth)
            except rmmc.NoDeviceError:
                errors.append("nodevice")
            except Exception as e:  # noqa: BLE001 - checked below
                errors.append(repr(e))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        if before is None:
            assert errors == ["nodevice"] * threads
            return
        assert errors == []
        for i, level, sc in scopes:
            # A block counts its own buffer and those of the blocks inside it.
            assert sc.total_bytes >= (n + i) * level
            assert sc.total_count >= (level if n + i else 0)
            again = pickle.loads(pickle.dumps(sc))  # finished: its figures travel
            assert again.get() == sc.get()
        assert self._registry_handle() == before  # every block's layer went

    # -- threads sharing one object ---------------------------------------------------------
    @rule(t=resources, threads=st.integers(2, 6), rounds=st.integers(1, 40),
          close_after=st.integers(0, 40))
    def threads_share_a_resource(self, t, threads, rounds, close_after):
        """Threads allocate and free through one copy of a Resource while
        the main thread closes it: each call either runs on a live stack or
        raises "closed", and nothing is lost (what a thread could not free
        through the closed copy goes back through the witness)."""
        r = self.objs[t]
        s = self.of[id(r)]
        if r.closed or s.paused:
            return
        c = copy.copy(r)
        leftovers, errors = [], []
        go = threading.Barrier(threads + 1)

        def work(i):
            go.wait()
            for k in range(rounds):
                try:
                    p = c.allocate(256 * (i + 1))
                except rmmc.InvalidArgumentError:
                    return
                except (rmmc.OutOfMemoryError, rmmc.NotSupportedError):
                    continue
                try:
                    c.deallocate(p, 256 * (i + 1))
                except rmmc.InvalidArgumentError:
                    leftovers.append((p, 256 * (i + 1)))
                    return
                except Exception as e:  # noqa: BLE001 - checked below
                    errors.append(repr(e))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        [x.start() for x in ts]
        go.wait()
        for _ in range(close_after):
            c.figures()
        c.close()
        [x.join() for x in ts]
        assert errors == []
        for p, n in leftovers:
            if p:
                s.witness.deallocate(p, n)

    @rule(ts=st.lists(mrs, min_size=1, max_size=3), rounds=st.integers(1, 30))
    def threads_race_the_registry(self, ts, rounds):
        """One thread sets the device's resource to one object after
        another while others get it and allocate through what they got (a
        get holds a reference of its own: issue 41's F17)."""
        objs = [self.objs[t] for t in ts]
        errors = []
        go = threading.Barrier(3)

        def setter():
            go.wait()
            for k in range(rounds):
                mr.set_per_device_resource(0, objs[k % len(objs)])

        def getter():
            go.wait()
            for _ in range(rounds):
                try:
                    g = mr.get_per_device_resource(0)
                    p = g.allocate(512)
                    g.deallocate(p, 512)
                    b = rmmc.DeviceBuffer(size=64)
                    b.close()
                except rmmc.NoDeviceError:
                    pass  # nothing set yet
                except rmmc.OutOfMemoryError:
                    pass  # a stack that cannot serve 512 bytes (binning > limiting(1MiB): 2 MiB chunks)
                except Exception as e:  # noqa: BLE001 - checked below
                    errors.append(repr(e))

        threads = [threading.Thread(target=f) for f in (setter, getter, getter)]
        [x.start() for x in threads]
        [x.join() for x in threads]
        assert errors == []
        self.current = objs[(rounds - 1) % len(objs)]
        assert mr.get_per_device_resource(0) is self.current

    @rule(t=buffers, threads=st.integers(2, 4), n=st.integers(0, 1 << 14))
    def threads_share_a_buffer(self, t, threads, n):
        """Threads resize, read and write one buffer at once: its calls are
        serialized, so each sees a whole buffer, never memory being moved."""
        x = self.objs[t]
        if x.closed or self._dlpack_alive(x) or x.shared:
            return
        errors = []

        def work(i):
            try:
                for k in range(5):
                    x.b.resize((n + 97 * (i + k)) % (1 << 14))
                    data = x.b.tobytes()
                    assert len(data) <= 1 << 14
                    x.b.copy_from_host(bytes([i]) * min(16, len(data)))
            except Exception as e:  # noqa: BLE001 - checked below
                errors.append(repr(e))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        [y.start() for y in ts]
        [y.join() for y in ts]
        assert errors == []
        x.content = bytearray(x.b.tobytes())

    # -- DeviceBuffer ------------------------------------------------------------------------
    @rule(target=buffers, t=st.one_of(st.none(), mrs), size=SIZES, stream=STREAMS,
          data=st.one_of(st.none(), st.binary(max_size=300)))
    def new_buffer(self, t, size, stream, data):
        m = None if t is None else self.objs[t]
        if data is not None:
            errors = bad(stream_error(stream))

            def call():
                return rmmc.DeviceBuffer(ptr=data, size=len(data), stream=stream, mr=m)
        else:
            errors = bad(size_error(size), stream_error(stream))

            def call():
                return rmmc.DeviceBuffer(size=size, stream=stream, mr=m)
        if errors:
            with pytest.raises(errors):
                call()
            return multiple()
        if m is None and self.current is None:
            if rmmc.device_count() > 0:  # the device's default, on streams this model fakes
                return multiple()
            with pytest.raises(rmmc.NoDeviceError):
                call()
            return multiple()
        b = call()
        content = data if data is not None else b.tobytes()
        assert b.size == len(content)
        return self.put(Buf(b, content))

    @rule(t=buffers, n=SIZES, op=st.sampled_from(["resize", "reserve"]))
    def resize(self, t, n, op):
        x = self.objs[t]
        e = size_error(n)
        if x.closed:
            return
        if e is not None:
            size, capacity = x.b.size, x.b.capacity()
            with pytest.raises(e):
                getattr(x.b, op)(n)
            assert (x.b.size, x.b.capacity()) == (size, capacity)
            return
        moves = n > x.b.capacity()
        if moves and self._dlpack_alive(x):
            ptr = x.b.ptr
            with pytest.raises(BufferError):
                getattr(x.b, op)(n)
            assert x.b.ptr == ptr
            return
        old_ptr, old = x.b.ptr, bytes(x.content)
        getattr(x.b, op)(n)
        if moves and x.shared:
            x.retired.append((old_ptr, old))
            x.shared = False
        if op == "resize":
            if n <= len(x.content):
                del x.content[n:]
            else:
                now = x.b.tobytes()
                assert now[:len(x.content)] == bytes(x.content)
                x.content = bytearray(now)
        assert x.b.size == len(x.content) and x.b.capacity() >= x.b.size
        assert x.b.tobytes() == bytes(x.content)

    @rule(t=buffers)
    def write_buffer(self, t):
        x = self.objs[t]
        if x.closed or not x.content:
            return
        data = pattern(self._next_seed(), len(x.content))
        x.b.copy_from_host(data)
        x.content = bytearray(data)

    @rule(target=buffers, t=buffers, how=st.sampled_from(["copy", "deepcopy", "method",
                                                           "pickle"]))
    def copy_buffer(self, t, how):
        x = self.objs[t]
        if x.closed:
            if how == "method":
                with pytest.raises(rmmc.InvalidArgumentError):
                    x.b.copy()
            return multiple()
        if how == "pickle":
            data = pickle.dumps(x.b)
            if self.current is None:
                if rmmc.device_count() == 0:  # else the device's default takes it
                    with pytest.raises(rmmc.NoDeviceError):
                        pickle.loads(data)
                return multiple()
            c = pickle.loads(data)
        else:
            c = {"copy": copy.copy, "deepcopy": copy.deepcopy,
                 "method": lambda b: b.copy()}[how](x.b)
        assert c.tobytes() == bytes(x.content) and (c.ptr != x.b.ptr or not x.content)
        return self.put(Buf(c, x.content))

    @rule(target=capsules, t=buffers)
    def dlpack(self, t):
        x = self.objs[t]
        if x.closed:
            return multiple()
        return self.put(Capsule(x.b.__dlpack__(), x, x.b.ptr))

    @rule(t=capsules)
    def consume_capsule(self, t):
        c = self.objs[t]
        if c.managed is not None:
            return
        api = ctypes.PyDLL(None)
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
        m = bufmod.DLManagedTensor.from_address(api.PyCapsule_GetPointer(c.cap, b"dltensor"))
        assert (m.dl_tensor.data or 0) == c.ptr and m.dl_tensor.shape[0] == len(c.buf.content)
        if c.buf.content:
            assert ctypes.string_at(c.ptr, len(c.buf.content)) == bytes(c.buf.content)
        api.PyCapsule_SetName(c.cap, b"used_dltensor")
        c.managed = m  # the consumer holds the tensor now; the capsule may go

    @rule(t=consumes(capsules))
    def drop_capsule(self, t):
        c = self.objs.pop(t)
        if c.managed is not None:
            c.managed.deleter(ctypes.pointer(c.managed))
        c.cap = c.managed = None
        gc.collect()

    @rule(t=buffers)
    def array_interface(self, t):
        x = self.objs[t]
        if x.closed:
            return
        ai = x.b.__array_interface__
        assert ai["shape"] == (len(x.content),)
        if x.content:
            assert ctypes.string_at(ai["data"][0], len(x.content)) == bytes(x.content)
        x.shared = True
        with pytest.raises(AttributeError):
            x.b.__cuda_array_interface__  # host memory has none

    @rule(t=buffers)
    def close_buffer(self, t):
        x = self.objs[t]
        if x.closed:
            x.b.close()
            return
        if self._dlpack_alive(x):
            with pytest.raises(BufferError):
                x.b.close()
            return
        if x.shared and x.content:
            x.retired.append((x.b.ptr, bytes(x.content)))
        x.b.close()
        x.closed = True
        x.content = bytearray()
        assert x.b.size == 0

    @rule(t=consumes(buffers))
    def drop_buffer(self, t):
        self.objs.pop(t)
        gc.collect()

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def figures_match(self):
        for s in self.stacks:
            if s.exact:
                f = s.witness.figures()
                assert f["in_use"] == sum(n for n, _a, _s in s.blocks.values()), s.spec

    @invariant()
    def exported_memory_stays(self):
        for x in self._bufs():
            for ptr, data in x.retired:
                if data:
                    assert ctypes.string_at(ptr, len(data)) == data, "retired memory changed"

    def _let_go(self):
        """The consumers delete their DLPack tensors; every object goes."""
        for c in self._caps():
            if c.managed is not None:
                c.managed.deleter(ctypes.pointer(c.managed))
            c.cap = c.managed = None
        self.objs.clear()

    def teardown(self):
        # Drop what holds stacks; then each stack must hold just its witness.
        self._let_go()
        gc.collect()
        assert not bufmod._EXPORTS
        for s in self.stacks:
            if s.paused:
                s.witness.resume()
            for p, (n, a, _seed) in list(s.blocks.items()):
                s.witness.deallocate(p, n, alignment=a)
            s.blocks.clear()
        self.current = None
        self.keep.clear()
        self.of.clear()
        lib().rmmc_registry_clear()
        mr._SET.clear()
        gc.collect()
        for s in reversed(self.stacks):
            h = s.witness.handle
            assert lib().rmmc_resource_refcount(h) == 1, "%s holds a reference too many" % s.spec
            s.witness.close()
        self.stacks.clear()


def test_python_layer():
    seed = os.environ.get("RMMC_HYPOTHESIS_SEED", "41")
    if seed == "random":
        seed = str(int.from_bytes(os.urandom(4), "little"))
    print("RMMC_HYPOTHESIS_SEED=%s" % seed)
    machine = hypothesis.seed(int(seed))(type("PythonLayerSeeded", (PythonLayer,), {}))
    run_state_machine_as_test(machine, settings=settings(
        max_examples=int(os.environ.get("RMMC_HYPOTHESIS_EXAMPLES", "10")),
        stateful_step_count=int(os.environ.get("RMMC_HYPOTHESIS_STEPS", "40")),
        deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck)))
