# SPDX-License-Identifier: Apache-2.0
"""rmmc: composable GPU memory resources (RMM-style) for Python.

A stack of memory resources is written as a spec, outermost first:
``"statistics > pool(initial=1GiB) > cuda"``. Each GPU has a current
resource in rmmc's registry; the PyTorch and CuPy plug-ins and
``rmmc_allocate()`` allocate through it.

    import rmmc, rmmc.torch
    rmmc.torch.use("pool > cuda")          # before PyTorch touches CUDA

    import rmmc, rmmc.cupy
    rmmc.cupy.use("pool > cuda")

    r = rmmc.Resource("statistics > pool > host")   # no GPU needed
    p = r.allocate(1 << 20)
    r.deallocate(p, 1 << 20)
    r.figures()                            # {'in_use': 0, 'peak': 1048576, ...}

    with rmmc.statistics() as s:           # counts what the registry hands out
        ...
    s.peak_bytes

Errors are exceptions carrying rmmc's status and message (RmmcError and
its subclasses; out of memory is OutOfMemoryError, a MemoryError). The
library is librmmc.so inside this package ($RMMC_LIB overrides it).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _args
from ._ref import Ref

from ._lib import (FIELD_BYTES, FIELD_CB, FIELD_TEXT, MEMORY_HOOK, PAUSE_MODES, SleepState,
                   STATUS_NAMES,
                   InvalidArgumentError, MemoryHooks, NoDeviceError, NotSupportedError,
                   OutOfMemoryError, ParseError, PluginStats, RmmcError, StaleError,
                   Statistics as _StatisticsStruct, UnknownPointerError, check, error_for,
                   last_error, lib, library_path, read_text)

__all__ = [
    "RmmcError", "OutOfMemoryError", "ParseError", "InvalidArgumentError", "NoDeviceError",
    "UnknownPointerError", "NotSupportedError", "StaleError", "Resource", "Bytes", "version",
    "set_default", "get_default", "set_memory_hooks", "device_spec",
    "memory_status", "stack_figures", "statistics", "validate", "set_alloc_conf", "parse_size",
    "stack_help", "config_status", "device_count", "plugin_stats", "plugin_last_error", "release_cached",
    "library_path",
]

DEFAULT_ALIGNMENT = 256


def __getattr__(name):
    if name == "__version__":
        return version()
    raise AttributeError("module 'rmmc' has no attribute %r" % name)


def version() -> str:
    """The version of the loaded librmmc ("0.2.0")."""
    return lib().rmmc_version_string().decode()


def device_count() -> int:
    """CUDA devices visible (0 without a GPU or driver)."""
    return lib().rmmc_device_count()


def _device(device):
    """A device id: `device`, or the current device (0 without a GPU)."""
    if device is not None:
        return _args.device(device)
    d = ctypes.c_int()
    check(lib().rmmc_get_current_device(ctypes.byref(d)), "get_current_device")
    return d.value


def _encode(spec, what="a stack spec"):
    return _args.text(spec, what)


class Bytes(int):
    """A figure that counts bytes (the others count things)."""


def _describe(handle):
    out = {}

    def emit(_ctx, field):
        f = field.contents
        key = f.key.decode()
        if f.kind == FIELD_TEXT:
            out[key] = f.text.decode() if f.text else ""
        else:
            out[key] = Bytes(f.value) if f.kind == FIELD_BYTES else int(f.value)
    lib().rmmc_resource_describe(handle, FIELD_CB(emit), None)
    # One set of figure names across the Python API (RMM's, as statistics()
    # and rmmc.stats use): in_use and peak stay as the library's own names.
    # peak_bytes is the peak of the bytes held by callers, which a pool or
    # arena does not keep (its "peak" counts spans lent to stream heaps:
    # one 4 KiB block reads 4 MiB there), so it has none.
    if "in_use" in out:
        out["current_bytes"] = out["in_use"]
    if "peak" in out and lib().rmmc_resource_name(handle) not in (b"pool", b"arena"):
        out["peak_bytes"] = out["peak"]
    return out


def _layers(handle):
    layers = []
    p = handle
    while p:
        layers.append((lib().rmmc_resource_name(p).decode(), _describe(p)))
        p = lib().rmmc_resource_upstream(p)
    return layers


class Resource:
    """A stack of memory resources built from a spec, holding one reference.

    ``Resource("pool(initial=64MiB) > cuda", device=0)``. allocate() and
    deallocate() are stream-ordered (``stream`` is a cudaStream_t: an int,
    0 for the legacy default stream, or a framework's stream object) and
    return/take the address as an int. close() (or leaving a ``with``
    block) drops the reference; closing with blocks still allocated through
    this object warns (ResourceWarning), since freeing the stack frees them
    under whoever still uses them. Safe to share between threads: a close()
    on one thread waits for no call, and the calls already under way on
    others finish on the stack before the reference goes.

    copy.copy() gives another Resource over the same stack with a reference
    of its own (close either, the other keeps working). A stack is not
    deep-copied or pickled (TypeError): its memory and state belong to this
    process; pickle the ``spec`` and build a Resource from it instead.
    """

    _not_a_stream = True  # has .handle, which is no stream

    def __init__(self, spec: str, device: Optional[int] = None) -> None:
        handle = ctypes.c_void_p()
        check(lib().rmmc_stack_create(_encode(spec),
                                      -1 if device is None else _args.device(device, allow_all=True),
                                      ctypes.byref(handle)), "Resource(%r)" % spec)
        self._ref = Ref(handle.value, "rmmc.Resource")
        self.spec = spec
        self._live: Dict[int, int] = {}

    @classmethod
    def _adopt(cls, handle, spec):
        """Wraps `handle`, taking a new reference (the caller keeps its own,
        which must stay valid during this call)."""
        self = cls.__new__(cls)
        self._ref = Ref(lib().rmmc_resource_retain(handle), "rmmc.Resource")
        self.spec = spec
        self._live = {}
        return self

    def _use(self):
        """``with r._use() as h:``: the handle, held for the block."""
        return self._ref

    @property
    def _handle(self):
        """The handle while open, None once closed (identity checks only)."""
        return self._ref.peek()

    def _h(self):
        with self._ref as h:
            return h

    @property
    def handle(self) -> int:
        """The rmmc_resource_t * as an int (borrowed: valid while this is open)."""
        return self._h()

    @property
    def name(self) -> str:
        """The outermost layer's name ("pool")."""
        with self._ref as h:
            return lib().rmmc_resource_name(h).decode()

    @property
    def memory_kind(self) -> str:
        """"device", "host", "pinned" or "managed"."""
        with self._ref as h:
            return lib().rmmc_memory_kind_name(lib().rmmc_resource_memory_kind(h)).decode()

    @property
    def device(self) -> int:
        """The device the stack serves, or -1 (host memory)."""
        with self._ref as h:
            return lib().rmmc_resource_device(h)

    def allocate(self, nbytes: int, stream: Any = 0, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocates `nbytes` ready for use on `stream`; returns the address
        (0 for 0 bytes). OutOfMemoryError when the stack cannot."""
        nbytes = _args.size(nbytes, "nbytes")
        alignment = _args.alignment(alignment)
        stream = _args.stream(stream)
        p = ctypes.c_void_p()
        with self._ref as h:
            check(lib().rmmc_resource_allocate(h, nbytes, alignment, stream, ctypes.byref(p)),
                  "allocate(%d)" % nbytes)
        if p.value:
            self._live[p.value] = nbytes
        return p.value or 0

    def deallocate(self, ptr: int, nbytes: int, stream: Any = 0,
                   alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Returns a block allocate() gave, with its size; reusable on
        `stream` at once. 0 is a no-op."""
        ptr = _args.pointer(ptr, "ptr")
        nbytes = _args.size(nbytes, "nbytes")
        alignment = _args.alignment(alignment)
        stream = _args.stream(stream)
        with self._ref as h:
            check(lib().rmmc_resource_deallocate(h, ptr, nbytes, alignment, stream),
                  "deallocate(0x%x, %d)" % (ptr or 0, nbytes))
        self._live.pop(ptr, None)

    def figures(self) -> Dict[str, Any]:
        """The outermost layer's figures: {"in_use": Bytes, "peak": ..., ...}."""
        with self._ref as h:
            return _describe(h)

    def layers(self) -> List[Tuple[str, Dict[str, Any]]]:
        """[(name, figures)] for every layer, outermost first."""
        with self._ref as h:
            return _layers(h)

    def status(self) -> str:
        """The status report of the whole stack, as text."""
        with self._ref as h:
            return read_text(lib().rmmc_resource_status_string, h)

    def release_cached(self) -> None:
        """Gives memory cached by the stack's layers back to their upstreams."""
        with self._ref as h:
            check(lib().rmmc_resource_release_cached(h), "release_cached")

    def set_memory_hooks(self, on_acquire: Optional[Callable[[int, int], None]] = None,
                         on_release: Optional[Callable[[int, int], None]] = None) -> None:
        """Calls on_acquire(ptr, nbytes) for each range of memory the stack
        takes from the system (a pool's chunks or page mappings, those held
        now included) and on_release(ptr, nbytes) before it gives one back;
        both None removes them. They run on whichever thread makes the pool
        grow or shrink, holding the pool's lock: do not allocate from this
        stack inside them. NotSupportedError if no layer can (no pool)."""
        hooks = _make_hooks(on_acquire, on_release)
        with self._ref as h:
            check(lib().rmmc_resource_set_memory_hooks(h, hooks), "set_memory_hooks")
            _HOOKS_ALIVE[("resource", h)] = hooks

    def pause(self, mode: str = "backup", stream: Any = 0) -> None:
        """Sleep mode: gives every page of the stack's pool back to the
        driver, keeping its addresses (include/rmmc/pool_resource.h, "Sleep
        mode"). mode "backup" copies the live blocks to pinned host memory
        (restored by resume()), "discard" drops their contents. Synchronizes
        the device; the backup is copied on `stream`. While paused,
        allocations raise OutOfMemoryError; frees are accepted.
        NotSupportedError for a pool without virtual memory (chunks)."""
        if not isinstance(mode, str) or mode not in PAUSE_MODES:
            raise InvalidArgumentError(-1, "pause: mode must be 'backup' or 'discard', not %r"
                                       % (mode,))
        stream = _args.stream(stream)
        with self._ref as h:
            check(lib().rmmc_pool_pause(h, PAUSE_MODES[mode], stream), "pause(%r)" % mode)

    def resume(self, stream: Any = 0) -> None:
        """Maps the paused pool's pages again at the same addresses and
        enqueues the backup's copies back on `stream`: the contents are in
        place for work on that stream. OutOfMemoryError (still paused,
        backup kept) when the device lacks the memory."""
        stream = _args.stream(stream)
        with self._ref as h:
            check(lib().rmmc_pool_resume(h, stream), "resume")

    def sleep_state(self) -> Dict[str, Any]:
        """{"paused", "mode" ("backup"/"discard"/None), "held", "unmapped",
        "backed_up", "backup_ranges", "host_bytes", "pauses", "resumes",
        "can_sleep"} of the stack's pool."""
        with self._ref as h:
            return _sleep_state(h)

    @property
    def closed(self):
        return self._ref.closed

    def close(self) -> None:
        """Drops this object's reference (idempotent; safe from any thread)."""
        live = dict(self._live)
        if not self._ref.close():
            return
        if live:
            warnings.warn("rmmc.Resource(%r) closed with %d block(s) (%d bytes) still allocated "
                          "through it" % (self.spec, len(live), sum(live.values())),
                          ResourceWarning, stacklevel=2)

    def __copy__(self):
        with self._ref as h:
            return Resource._adopt(h, self.spec)

    def __deepcopy__(self, memo):
        raise TypeError("an rmmc.Resource is not deep-copied: its stack's memory and state "
                        "belong to it (copy.copy() shares the stack with a reference of its "
                        "own; Resource(r.spec) builds a new one)")

    def __reduce__(self):
        raise TypeError("an rmmc.Resource cannot be pickled: its stack lives in this process "
                        "(pickle its spec, %r, and build a Resource from it there)" % (self.spec,))

    def __enter__(self) -> "Resource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        try:
            with self._ref as h:
                state = "%s memory, device %d" % (
                    lib().rmmc_memory_kind_name(lib().rmmc_resource_memory_kind(h)).decode(),
                    lib().rmmc_resource_device(h))
        except InvalidArgumentError:
            state = "closed"
        return "rmmc.Resource(%r) [%s]" % (self.spec, state)


def _sleep_state(handle):
    st = SleepState()
    st.size = ctypes.sizeof(SleepState)
    check(lib().rmmc_pool_sleep_state(handle, ctypes.byref(st)), "sleep_state")
    out = {name: getattr(st, name) for name, *_ in SleepState._fields_ if name != "size"}
    out["mode"] = {v: k for k, v in PAUSE_MODES.items()}.get(st.mode)
    for k in ("held", "unmapped", "backed_up", "host_bytes"):
        out[k] = Bytes(out[k])
    return out


def validate(spec: str) -> None:
    """Raises ParseError (with rmmc's caret message) if `spec` does not parse."""
    check(lib().rmmc_stack_validate(_encode(spec)), "validate")


def set_alloc_conf(spec: Optional[str], default: str) -> str:
    """Sets RMMC_ALLOC_CONF, which each device's default stack is built from
    at its first use, for this process and those it starts: `spec` (a
    program's --spec), else RMMC_ALLOC_CONF as it is, else `default`.
    Returns that spec. Raises ParseError, leaving RMMC_ALLOC_CONF alone, if
    it does not parse. Call it before the first default is built (before a
    framework's first GPU allocation through rmmc)."""
    chosen = spec or os.environ.get("RMMC_ALLOC_CONF") or default
    validate(chosen)
    os.environ["RMMC_ALLOC_CONF"] = chosen
    return chosen


def parse_size(text: str) -> int:
    """A size as specs write it ("256MiB", "1.5 GiB") in bytes."""
    out = ctypes.c_size_t()
    check(lib().rmmc_parse_size(_encode(text, "a size"), ctypes.byref(out)), "parse_size")
    return out.value


def stack_help(resource: Optional[str] = None) -> str:
    """Every resource a spec may name, with its options, one per line; or,
    for one `resource` ("pool"), each option with the unit of its value,
    what it does and its default. ParseError for an unknown name."""
    if resource is not None:
        from ._lib import stack_help_resource
        return stack_help_resource(resource)
    n = lib().rmmc_stack_help(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib().rmmc_stack_help(buf, n + 1)
    return buf.value.decode()


def config_status() -> Tuple[str, str, str]:
    """(status name, spec, message) of the process default: what
    RMMC_ALLOC_CONF or set_default() chose, and the first problem."""
    spec, msg = ctypes.c_char_p(), ctypes.c_char_p()
    st = lib().rmmc_default_config_status(ctypes.byref(spec), ctypes.byref(msg))
    return (STATUS_NAMES.get(st, str(st)), (spec.value or b"").decode(),
            (msg.value or b"").decode())


def set_default(spec: Union[str, Resource], device: Optional[int] = None) -> Optional[Resource]:
    """Makes `spec` (a str, or a Resource) the process default.

    device=None and a str: every device's default from now on, built on the
    device's first use (replaces RMMC_ALLOC_CONF; devices that already have
    a resource keep it). device=N, or a Resource: installed for that device
    now (a Resource for its own device, or the current one for host memory).
    Returns the Resource installed, or None. Raises ParseError for a spec
    that does not parse (PyTorch's syntax is recognised and the rmmc
    spelling named).
    """
    if isinstance(spec, Resource):
        r = spec
        dev = r.device if r.device >= 0 and device is None else _device(device)
    elif device is None:
        check(lib().rmmc_set_default_spec(_encode(spec)), "set_default(%r)" % spec)
        return None
    else:
        dev = _device(device)
        r = Resource(spec, dev)
    with r._use() as h:
        check(lib().rmmc_set_device_resource(dev, h, None), "set_default")
    return r


_HOOKS_ALIVE: dict = {}  # the ctypes callbacks rmmc holds, kept alive


def _make_hooks(on_acquire, on_release):
    if on_acquire is None and on_release is None:
        return None
    h = MemoryHooks()
    h.size = ctypes.sizeof(MemoryHooks)
    if on_acquire is not None:
        h.on_acquire = MEMORY_HOOK(lambda p, n, _u: on_acquire(p, n))
    if on_release is not None:
        h.on_release = MEMORY_HOOK(lambda p, n, _u: on_release(p, n))
    return h


def set_memory_hooks(on_acquire: Optional[Callable[[int, int], None]] = None,
                     on_release: Optional[Callable[[int, int], None]] = None,
                     device: Optional[int] = None) -> None:
    """Memory hooks (Resource.set_memory_hooks) on the device's registry
    stack: what rmmc.torch and rmmc.cupy allocate from, so NCCL, RDMA or
    cuFile registration can follow it (built from the default spec on
    first use). Under rmmc.torch's native backend, which keeps that
    stack's hook slot for PyTorch's snapshots and NCCL registration, the
    hooks ride on the backend's."""
    dev = _device(device)
    hooks = _make_hooks(on_acquire, on_release)
    rt = __import__("sys").modules.get(__name__ + ".torch")
    native = rt._native_lib if rt is not None and rt.backend() == "native" else None
    setter = (native._dll.rmmc_torch_native_set_memory_hooks if native is not None
              else lib().rmmc_plugin_set_memory_hooks)
    check(setter(dev, hooks), "set_memory_hooks")
    _HOOKS_ALIVE[("device", dev)] = hooks


def device_spec(config: str, device: int) -> str:
    """The spec `device` uses under a configuration of RMMC_ALLOC_CONF's
    form ("pool > cuda; 1: pool(maximum_size=40GiB) > cuda")."""
    buf = ctypes.create_string_buffer(4097)
    check(lib().rmmc_default_config_device_spec(_encode(config, "config"), _args.device(device),
                                                buf, len(buf)),
          "device_spec")
    return buf.value.decode()


def _device_resource(dev, what, retain=False):
    """The registry's rmmc_resource_t * for device `dev`: borrowed, or with
    retain=True one reference the caller releases, taken atomically with a
    set on another thread. NoDeviceError says what to call
    from Python when there is no GPU."""
    handle = ctypes.c_void_p()
    get = lib().rmmc_retain_device_resource if retain else lib().rmmc_get_device_resource
    st = get(dev, ctypes.byref(handle))
    if st == -6:
        raise NoDeviceError(st, "no CUDA device is available, so device %d has no default "
                            "resource: set one first, e.g. rmmc.set_default(\"host\", device=%d) "
                            "or rmmc.mr.set_current_device_resource(rmmc.mr.HostMemoryResource())"
                            % (dev, dev), what)
    check(st, what)
    return handle


def get_default(device: Optional[int] = None) -> Resource:
    """The device's current resource (built from the default spec on first
    use) as a Resource holding its own reference."""
    dev = _device(device)
    handle = _device_resource(dev, "get_default(%d)" % dev, retain=True)
    r = Resource._adopt(handle.value, "<device %d>" % dev)
    lib().rmmc_resource_release(handle.value)
    return r


def stack_figures(device: Optional[int] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """[(layer name, figures)] of the device's current stack, outermost first."""
    with get_default(device) as r:
        return r.layers()


def memory_status(device: Optional[int] = None) -> str:
    """The device's memory status report (free/total memory, every layer's
    figures) as text, like torch.cuda.memory_summary()."""
    return read_text(lib().rmmc_memory_status_string, -1 if device is None else _device(device))


def plugin_stats(device: int = -1) -> Dict[str, int]:
    """The PyTorch/CuPy plug-ins' figures for a device (-1: all) as a dict."""
    s = PluginStats()
    s.size = ctypes.sizeof(PluginStats)
    device = _args.device(device, allow_all=True)
    check(lib().rmmc_plugin_get_stats(device, ctypes.byref(s)), "plugin_stats")
    out = {name: getattr(s, name) for name, *_ in PluginStats._fields_ if name != "size"}
    out["current_bytes"] = out["bytes_in_use"]  # the Python API's name; bytes_in_use stays
    return out


def plugin_last_error() -> str:
    """The message of the last plug-in failure on any thread ("" if none)."""
    n = lib().rmmc_plugin_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib().rmmc_plugin_last_error(buf, n + 1)
    return buf.value.decode(errors="replace")


def release_cached(device: Optional[int] = None) -> None:
    """Gives the cached memory of the device's current stack back."""
    with get_default(device) as r:
        r.release_cached()


_STAT_FIELDS = [name for name, *_ in _StatisticsStruct._fields_ if name != "size"]


def _statistics_struct():
    s = _StatisticsStruct()
    s.size = ctypes.sizeof(s)
    return s


class StatisticsScope:
    """What a ``with rmmc.statistics()`` block counted. Inside the block
    get() reads the figures so far; after it, the attributes hold the
    block's final figures (current_bytes, peak_bytes, total_bytes,
    current_count, peak_count, total_count, deallocations). A finished
    scope copies and pickles as its figures; an open one does neither
    (TypeError: it holds the device's statistics layer)."""

    def __init__(self, stats, scope_id, device):
        self._stats = stats  # an rmmc.Resource over the statistics layer while open
        self._id = scope_id
        self._lock = threading.Lock()
        self.device = device
        for name in _STAT_FIELDS:
            setattr(self, name, None)

    def get(self):
        with self._lock:
            if self._stats is None:
                return {name: getattr(self, name) for name in _STAT_FIELDS}
            s = _statistics_struct()
            with self._stats._use() as h:
                check(lib().rmmc_statistics_adaptor_get_scope(h, self._id, ctypes.byref(s)),
                      "statistics")
            return {name: getattr(s, name) for name in _STAT_FIELDS}

    def _finish(self):
        """Ends the scope (once): its final figures in the attributes.
        Returns the statistics layer's Resource for the caller to close."""
        with self._lock:
            stats, self._stats = self._stats, None
            if stats is None:
                return None
            s = _statistics_struct()
            try:
                with stats._use() as h:
                    check(lib().rmmc_statistics_adaptor_pop_scope(h, self._id, ctypes.byref(s)),
                          "statistics")
            except Exception:
                stats.close()
                raise
            for name in _STAT_FIELDS:
                setattr(self, name, getattr(s, name))
            return stats

    def __reduce__(self):
        with self._lock:
            if self._stats is not None:
                raise TypeError("an open rmmc.StatisticsScope cannot be copied or pickled: it "
                                "holds the device's statistics layer (its figures can, once "
                                "the block has ended)")
            return (_finished_scope, (self.device, {n: getattr(self, n) for n in _STAT_FIELDS}))

    def __repr__(self):
        return "rmmc.StatisticsScope(%s)" % ", ".join(
            "%s=%s" % (k, v) for k, v in self.get().items())


def _finished_scope(device, figures):
    scope = StatisticsScope(None, 0, device)
    for name, value in figures.items():
        setattr(scope, name, value)
    return scope


# The statistics layers statistics() put in the registry, by handle:
# [device, the previous resource (a reference), blocks open on it]. One
# lock orders every block's entry and exit, so threads share one layer
# and the last block out puts the previous resource back.
_STATS_LOCK = threading.Lock()
_STATS_INSTALLED: dict = {}


def _statistics_layer(dev):
    """A reference on the statistics layer a block of device `dev` counts
    with: the registry's own when it has one on top, else a layer put
    there for the blocks (counted in _STATS_INSTALLED). _STATS_LOCK held."""
    release = lib().rmmc_resource_release
    while True:
        current = _device_resource(dev, "statistics", retain=True).value
        if current in _STATS_INSTALLED:
            _STATS_INSTALLED[current][2] += 1
            return current
        if lib().rmmc_resource_name(current).decode() == "statistics":
            return current
        wrapped = ctypes.c_void_p()
        st = lib().rmmc_statistics_adaptor_create(current, ctypes.byref(wrapped))
        if st != 0:
            release(current)
            check(st, "statistics")
        old = ctypes.c_void_p()
        st = lib().rmmc_set_device_resource(dev, wrapped, ctypes.byref(old))
        if st != 0:
            e = error_for(st, last_error(), "statistics")
            release(wrapped.value)
            release(current)
            raise e
        release(current)  # `old` holds the registry's reference now
        if old.value != current:
            # Another thread set the registry between the retain and the
            # set: put its resource back and look again.
            mine = ctypes.c_void_p()
            lib().rmmc_set_device_resource(dev, old, ctypes.byref(mine))
            release(mine.value)
            release(old.value)
            release(wrapped.value)
            continue
        _STATS_INSTALLED[wrapped.value] = [dev, old.value, 1]
        return lib().rmmc_resource_retain(wrapped.value)


def _statistics_leave(dev, stats):
    """The registry side of a block's end; True if the registry no longer
    holds `stats`. _STATS_LOCK held."""
    release = lib().rmmc_resource_release
    now = ctypes.c_void_p()
    changed = lib().rmmc_retain_device_resource(dev, ctypes.byref(now)) != 0 or now.value != stats
    if now.value:
        release(now.value)
    installed = _STATS_INSTALLED.get(stats)
    if installed is not None:
        installed[2] -= 1
        if installed[2] == 0:
            del _STATS_INSTALLED[stats]
            previous = installed[1]
            st = 0
            if not changed:
                mine = ctypes.c_void_p()
                st = lib().rmmc_set_device_resource(dev, previous, ctypes.byref(mine))
                release(mine.value)
            release(previous)
            release(stats)  # the layer's own reference
            check(st, "statistics")
    return changed


@contextlib.contextmanager
def statistics(device: Optional[int] = None) -> Iterator["StatisticsScope"]:
    """Counts what the device's current resource hands out inside the block
    (RMM's rmm.statistics.statistics()): opens a scope on the stack's
    statistics layer, wrapping the current resource in one for the block if
    it has none (and putting the old one back after). Blocks nest, and
    blocks of many threads at once share one layer: each counts what the
    resource handed out (on any thread) from its start to its end, and the
    last to end puts the old resource back. Yields a StatisticsScope.
    Raises RmmcError if the registry's resource was changed inside the
    block (the changed registry is then left as it is)."""
    dev = _device(device)
    with _STATS_LOCK:
        handle = _statistics_layer(dev)
        sid = ctypes.c_uint64()
        st = lib().rmmc_statistics_adaptor_push_scope(handle, ctypes.byref(sid))
        if st != 0:
            e = error_for(st, last_error(), "statistics")
            _statistics_leave(dev, handle)
            lib().rmmc_resource_release(handle)
            raise e
    stats = Resource._adopt(handle, "<statistics of device %d>" % dev)
    lib().rmmc_resource_release(handle)
    scope = StatisticsScope(stats, sid.value, dev)
    try:
        yield scope
    finally:
        try:
            scope._finish()
        finally:
            with _STATS_LOCK:
                changed = _statistics_leave(dev, handle)
            stats.close()
        if changed:
            raise RmmcError(-10, "the registry's resource for device %d was changed inside "
                            "the statistics block" % dev, "statistics")


# The block by a name no submodule has (rmmc.statistics becomes RMM's module
# below): rmmc.stats takes it from here.
_statistics_block = statistics


# The RMM-style layer: rmmc.mr, rmmc.stats, DeviceBuffer and
# RMM's top-level calls. Imported here, after everything they use.
from . import mr, stats  # noqa: E402
from .buffer import DeviceBuffer, to_device  # noqa: E402
from .rmm_compat import (is_initialized, register_reinitialize_hook,  # noqa: E402
                         reinitialize, reinitialize_spec, unregister_reinitialize_hook)

__all__ += ["mr", "stats", "DeviceBuffer", "to_device", "reinitialize", "reinitialize_spec",
            "is_initialized", "register_reinitialize_hook", "unregister_reinitialize_hook"]

# RMM's other top-level names: `import rmmc as rmm` runs a RAPIDS
# script's memory set-up (README.md, "Coming from RMM", has the differences).
RMMError = RmmcError  # RMM's exception: every rmmc failure is one
from .mr import disable_logging, enable_logging, get_log_filenames  # noqa: E402
from .logger import (flush_logger, get_flush_level, get_logging_level,  # noqa: E402
                     level_enum, set_flush_level, set_logging_level, should_log)
from ._stream import (DEFAULT_STREAM, LEGACY_DEFAULT_STREAM,  # noqa: E402
                      PER_THREAD_DEFAULT_STREAM, Stream)
from ._summary import memory_summary, memory_summary_line  # noqa: E402
# rmmc.statistics: RMM's module by its name, still callable as the context
# manager above (with rmmc.statistics() as s: ...).
__import__("importlib").import_module(__name__ + ".statistics")

__all__ += ["RMMError", "enable_logging", "disable_logging", "get_log_filenames",
            "flush_logger", "get_flush_level", "get_logging_level", "level_enum",
            "set_flush_level", "set_logging_level", "should_log", "Stream", "DEFAULT_STREAM",
            "LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "memory_summary",
            "memory_summary_line"]
