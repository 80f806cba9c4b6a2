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
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _args

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
    "memory_status", "stack_figures", "statistics", "validate", "parse_size", "stack_help",
    "config_status", "device_count", "plugin_stats", "plugin_last_error", "release_cached",
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
    deallocate() are stream-ordered (``stream`` is a cudaStream_t as an int,
    0 for the legacy default stream) and return/take the address as an int.
    close() (or leaving a ``with`` block) drops the reference; closing with
    blocks still allocated through this object warns (ResourceWarning), since
    freeing the stack frees them under whoever still uses them.
    """

    def __init__(self, spec: str, device: Optional[int] = None) -> None:
        handle = ctypes.c_void_p()
        check(lib().rmmc_stack_create(_encode(spec), -1 if device is None else _args.device(device, allow_all=True),
                                      ctypes.byref(handle)), "Resource(%r)" % spec)
        self._handle = handle.value
        self.spec = spec
        self._live: Dict[int, int] = {}

    @classmethod
    def _adopt(cls, handle, spec):
        """Wraps `handle`, taking a new reference."""
        self = cls.__new__(cls)
        self._handle = lib().rmmc_resource_retain(handle)
        self.spec = spec
        self._live = {}
        return self

    def _h(self):
        if self._handle is None:
            raise InvalidArgumentError(-1, "this rmmc.Resource is closed")
        return self._handle

    @property
    def handle(self) -> int:
        """The rmmc_resource_t * as an int (borrowed: valid while this is open)."""
        return self._h()

    @property
    def name(self) -> str:
        """The outermost layer's name ("pool")."""
        return lib().rmmc_resource_name(self._h()).decode()

    @property
    def memory_kind(self) -> str:
        """"device", "host", "pinned" or "managed"."""
        return lib().rmmc_memory_kind_name(lib().rmmc_resource_memory_kind(self._h())).decode()

    @property
    def device(self) -> int:
        """The device the stack serves, or -1 (host memory)."""
        return lib().rmmc_resource_device(self._h())

    def allocate(self, nbytes: int, stream: Any = 0, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocates `nbytes` ready for use on `stream`; returns the address
        (0 for 0 bytes). OutOfMemoryError when the stack cannot."""
        nbytes = _args.size(nbytes, "nbytes")
        alignment = _args.size(alignment, "alignment")
        stream = _args.stream(stream)
        p = ctypes.c_void_p()
        check(lib().rmmc_resource_allocate(self._h(), nbytes, alignment, stream,
                                           ctypes.byref(p)),
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
        alignment = _args.size(alignment, "alignment")
        stream = _args.stream(stream)
        check(lib().rmmc_resource_deallocate(self._h(), ptr, nbytes, alignment, stream),
              "deallocate(0x%x, %d)" % (ptr or 0, nbytes))
        self._live.pop(ptr, None)

    def figures(self) -> Dict[str, Any]:
        """The outermost layer's figures: {"in_use": Bytes, "peak": ..., ...}."""
        return _describe(self._h())

    def layers(self) -> List[Tuple[str, Dict[str, Any]]]:
        """[(name, figures)] for every layer, outermost first."""
        return _layers(self._h())

    def status(self) -> str:
        """The status report of the whole stack, as text."""
        return read_text(lib().rmmc_resource_status_string, self._h())

    def release_cached(self) -> None:
        """Gives memory cached by the stack's layers back to their upstreams."""
        check(lib().rmmc_resource_release_cached(self._h()), "release_cached")

    def set_memory_hooks(self, on_acquire: Optional[Callable[[int, int], None]] = None,
                         on_release: Optional[Callable[[int, int], None]] = None) -> None:
        """Calls on_acquire(ptr, nbytes) for each range of memory the stack
        takes from the system (a pool's chunks or page mappings, those held
        now included) and on_release(ptr, nbytes) before it gives one back;
        both None removes them. They run on whichever thread makes the pool
        grow or shrink, holding the pool's lock: do not allocate from this
        stack inside them. NotSupportedError if no layer can (no pool)."""
        hooks = _make_hooks(on_acquire, on_release)
        check(lib().rmmc_resource_set_memory_hooks(self._h(), hooks), "set_memory_hooks")
        _HOOKS_ALIVE[("resource", self._handle)] = hooks

    def pause(self, mode: str = "backup", stream: Any = 0) -> None:
        """Sleep mode: gives every page of the stack's pool back to the
        driver, keeping its addresses (include/rmmc/pool_resource.h, "Sleep
        mode"). mode "backup" copies the live blocks to pinned host memory
        (restored by resume()), "discard" drops their contents. Synchronizes
        the device; the backup is copied on `stream`. While paused,
        allocations raise OutOfMemoryError; frees are accepted.
        NotSupportedError for a pool without virtual memory (chunks)."""
        if mode not in PAUSE_MODES:
            raise InvalidArgumentError(-1, "pause: mode must be 'backup' or 'discard', not %r"
                                       % (mode,))
        check(lib().rmmc_pool_pause(self._h(), PAUSE_MODES[mode], stream or None),
              "pause(%r)" % mode)

    def resume(self, stream: Any = 0) -> None:
        """Maps the paused pool's pages again at the same addresses and
        enqueues the backup's copies back on `stream`: the contents are in
        place for work on that stream. OutOfMemoryError (still paused,
        backup kept) when the device lacks the memory."""
        check(lib().rmmc_pool_resume(self._h(), stream or None), "resume")

    def sleep_state(self) -> Dict[str, Any]:
        """{"paused", "mode" ("backup"/"discard"/None), "held", "unmapped",
        "backed_up", "backup_ranges", "host_bytes", "pauses", "resumes",
        "can_sleep"} of the stack's pool."""
        return _sleep_state(self._h())

    def close(self) -> None:
        """Drops this object's reference (idempotent)."""
        if self._handle is None:
            return
        if self._live:
            warnings.warn("rmmc.Resource(%r) closed with %d block(s) (%d bytes) still allocated "
                          "through it" % (self.spec, len(self._live), sum(self._live.values())),
                          ResourceWarning, stacklevel=2)
        lib().rmmc_resource_release(self._handle)
        self._handle = None

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
        state = "closed" if self._handle is None else "%s memory, device %d" % (
            self.memory_kind, self.device)
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
        from ._capi import stack_help_resource
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
    check(lib().rmmc_set_device_resource(dev, r._h(), None), "set_default")
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
    form ("pool > cuda; 1: pool(max=40GiB) > cuda")."""
    buf = ctypes.create_string_buffer(4097)
    check(lib().rmmc_default_config_device_spec(_encode(config, "config"), _args.device(device),
                                                buf, len(buf)),
          "device_spec")
    return buf.value.decode()


def _device_resource(dev, what, retain=False):
    """The registry's rmmc_resource_t * for device `dev`: borrowed, or with
    retain=True one reference the caller releases, taken atomically with a
    set on another thread (issue 25, F8). NoDeviceError says what to call
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


class StatisticsScope:
    """What a ``with rmmc.statistics()`` block counted. Inside the block
    get() reads the figures so far; after it, the attributes hold the
    block's final figures (current_bytes, peak_bytes, total_bytes,
    current_count, peak_count, total_count, deallocations)."""

    def __init__(self, handle, device):
        self._handle = handle
        self.device = device
        for name in _STAT_FIELDS:
            setattr(self, name, None)

    def get(self):
        if self._handle is None:
            return {name: getattr(self, name) for name in _STAT_FIELDS}
        s = _StatisticsStruct()
        s.size = ctypes.sizeof(s)
        check(lib().rmmc_statistics_adaptor_get(self._handle, ctypes.byref(s)), "statistics")
        return {name: getattr(s, name) for name in _STAT_FIELDS}

    def _finish(self, s):
        for name in _STAT_FIELDS:
            setattr(self, name, getattr(s, name))
        self._handle = None

    def __repr__(self):
        return "rmmc.StatisticsScope(%s)" % ", ".join(
            "%s=%s" % (k, v) for k, v in self.get().items())


@contextlib.contextmanager
def statistics(device: Optional[int] = None) -> Iterator["StatisticsScope"]:
    """Counts what the device's current resource hands out inside the block
    (RMM's rmm.statistics.statistics()): pushes a scope on the stack's
    statistics layer, wrapping the current resource in one for the block if
    it has none (and putting the old one back after). Scopes nest. Yields a
    StatisticsScope. Raises RmmcError if the registry's resource was
    changed inside the block."""
    dev = _device(device)
    current = _device_resource(dev, "statistics", retain=True)
    previous = None
    if lib().rmmc_resource_name(current).decode() == "statistics":
        stats = current.value  # the reference just taken
    else:
        wrapped = ctypes.c_void_p()
        st = lib().rmmc_statistics_adaptor_create(current, ctypes.byref(wrapped))
        lib().rmmc_resource_release(current.value)
        check(st, "statistics")
        stats = wrapped.value
        old = ctypes.c_void_p()
        st = lib().rmmc_set_device_resource(dev, stats, ctypes.byref(old))
        if st != 0:
            e = error_for(st, last_error(), "statistics")
            lib().rmmc_resource_release(stats)
            raise e
        previous = old.value
    try:
        check(lib().rmmc_statistics_adaptor_push(stats), "statistics")
        scope = StatisticsScope(stats, dev)
        try:
            yield scope
        finally:
            s = _StatisticsStruct()
            s.size = ctypes.sizeof(s)
            check(lib().rmmc_statistics_adaptor_pop(stats, ctypes.byref(s)), "statistics")
            scope._finish(s)
            now = ctypes.c_void_p()
            check(lib().rmmc_get_device_resource(dev, ctypes.byref(now)), "statistics")
            if now.value != stats:
                raise RmmcError(-10, "the registry's resource for device %d was changed inside "
                                "the statistics block" % dev, "statistics")
    finally:
        if previous is not None:
            lib().rmmc_set_device_resource(dev, previous, None)
            lib().rmmc_resource_release(previous)
        lib().rmmc_resource_release(stats)


# The RMM-style layer (issue 30): rmmc.mr, rmmc.stats, DeviceBuffer and
# RMM's top-level calls. Imported here, after everything they use.
from . import mr, stats  # noqa: E402
from .buffer import DeviceBuffer, to_device  # noqa: E402
from .rmm_compat import (is_initialized, register_reinitialize_hook,  # noqa: E402
                         reinitialize, reinitialize_spec, unregister_reinitialize_hook)

__all__ += ["mr", "stats", "DeviceBuffer", "to_device", "reinitialize", "reinitialize_spec",
            "is_initialized", "register_reinitialize_hook", "unregister_reinitialize_hook"]

# RMM's other top-level names (issue 44): `import rmmc as rmm` runs a RAPIDS
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
