# SPDX-License-Identifier: Apache-2.0
"""RMM's ``rmm.mr`` over rmmc: memory resource objects an RMM user knows,
composed by wrapping objects, and the per-device current resource.

    import rmmc.mr as mr
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size="1GiB",
                                 maximum_pool_size=2**34)
    mr.set_current_device_resource(mr.StatisticsResourceAdaptor(pool))

Each object holds an rmmc stack (``.resource``, an rmmc.Resource) and
``.spec`` says the same stack as a spec ("statistics > pool(initial=...)
> cuda"): the two ways build the same layers. A layer class builds its
layer on the upstream *object* (rmmc_stack_create_over), which it keeps
alive. Sizes are ints (bytes) or spec sizes ("256MiB"). HostMemoryResource
(rmmc's ``host``: malloc'd memory, no GPU needed) is an rmmc addition that
lets every layer run on a machine without a GPU.

RMM's names, signatures and defaults (rmm 26.10: tests/python/test_rmm_names.py
compares them; README.md, "Coming from RMM", lists the differences and why):
the first argument of a layer is `upstream_mr`, an rmmc.mr object or any of
RMM's own resource objects (put under the layer through rmmc.rmm.from_rmm);
str sizes read as RMM reads them ("1GB" = 10**9, "1GiB" = 2**30);
PoolMemoryResource's initial size defaults to half the device's free
memory; a LoggingResourceAdaptor's file gets RMM's ".dev<N>" suffix.
"""
from __future__ import annotations

import copy
import ctypes
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

from . import InvalidArgumentError, NotSupportedError, Resource, _args, _device, _device_resource
from ._counters import _pop, _push, _read
from ._lib import (ALLOCATE_SLOT, DEALLOCATE_SLOT, DESTROY_SLOT, FAILURE_CB, TRACKED_CB,
                   ResourceBase, ResourceOps, check, lib)
from ._sizes import rmm_parse_bytes
from ._stream import DEFAULT_STREAM, Stream

__all__ = [
    "DeviceMemoryResource", "UpstreamResourceAdaptor", "CudaMemoryResource",
    "ManagedMemoryResource", "PinnedMemoryResource", "PinnedHostMemoryResource",
    "CudaAsyncMemoryResource", "HostMemoryResource", "SystemMemoryResource",
    "PoolMemoryResource", "BinningMemoryResource", "FixedSizeMemoryResource",
    "ArenaMemoryResource", "LimitingResourceAdaptor", "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor", "LoggingResourceAdaptor", "FailureCallbackResourceAdaptor",
    "AlignedResourceAdaptor", "PrefetchResourceAdaptor", "CallbackMemoryResource",
    "CudaAsyncViewMemoryResource", "SamHeadroomMemoryResource", "get_current_device_resource",
    "set_current_device_resource", "get_per_device_resource", "set_per_device_resource",
    "get_current_device_resource_type", "is_initialized", "available_device_memory",
    "enable_logging", "disable_logging", "get_log_filenames", "experimental",
]

_log = logging.getLogger("rmmc")


def _size(value, what):
    """Bytes from an int or a str, as RMM's parse_bytes reads it ("1GB" =
    10**9, "1GiB" = 2**30, "1.5 gib"); ValueError for what it cannot read."""
    if isinstance(value, str):
        try:
            value = rmm_parse_bytes(value)
        except ValueError as e:
            raise InvalidArgumentError(-1, "%s: %s" % (what, e)) from None
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s is a number of bytes (int) or a size such as '1GiB', not %s"
                        % (what, type(value).__name__))
    return _args.size(value, what)


def _is_rmm_object(obj):
    """True for one of RMM's own resource objects (rmm.mr.*)."""
    import sys
    rmm = sys.modules.get("rmm.mr")
    return rmm is not None and isinstance(obj, rmm.DeviceMemoryResource)


def _layer(name, **options):
    """'name(k=v, ...)' for the options that are not None."""
    given = ["%s=%s" % (k, v) for k, v in options.items() if v is not None]
    return "%s(%s)" % (name, ", ".join(given)) if given else name


class DeviceMemoryResource:
    """The base of every resource object: allocate/deallocate through the
    stack it holds. ``resource`` is the rmmc.Resource, ``spec`` its spec,
    ``handle`` the rmmc_resource_t * (borrowed), ``upstream_mr`` the
    upstream object (None for a base resource).

    As RMM's, a resource object is not pickled or deep-copied (TypeError):
    its stack lives in this process. copy.copy() gives another object of
    the same class over the same stack, with a reference of its own."""

    _not_a_stream = True  # has .handle, which is no stream
    upstream_mr = None

    def __init__(self, *args, **kwargs):
        raise TypeError("DeviceMemoryResource is abstract: build one of its subclasses "
                        "(CudaMemoryResource(), PoolMemoryResource(upstream), ...)")

    def _init_base(self, spec, device=None):
        self.resource = Resource(spec, device)
        self.spec = spec
        self.upstream_mr = None

    def _init_rmm(self, rmm_class, what, *args, **kwargs):
        """This object as RMM's own resource of `rmm_class`, through the RMM
        bridge (for what rmmc's own resources do not do)."""
        try:
            import rmm.mr
        except ImportError:
            raise NotSupportedError(-5, "rmmc.mr.%s(%s) is RMM's resource, which rmmc reaches "
                                    "through RMM: install rmm-cu13 (rmmc.rmm)" % (rmm_class, what),
                                    rmm_class) from None
        from ._bridge import over
        obj = getattr(rmm.mr if "." not in rmm_class else rmm.mr.experimental,
                      rmm_class.split(".")[-1])(*args, **kwargs)
        self.resource = over(obj, None, "managed" if "Managed" in rmm_class else "device")
        self.spec = self.resource.spec
        self.upstream_mr = None
        self.rmm_mr = obj

    def _init_over(self, layer, upstream):
        upstream = _upstream(upstream)
        h = ctypes.c_void_p()
        text = _args.text(layer, "the layer's spec")
        with upstream.resource._use() as up:
            check(lib().rmmc_stack_create_over(text, up, ctypes.byref(h)),
                  "%s(%s)" % (type(self).__name__, layer))
        spec = "%s > %s" % (layer, upstream.spec)
        self.resource = Resource._adopt(h.value, spec)
        lib().rmmc_resource_release(h.value)  # _adopt took its own reference
        self.spec = spec
        self.upstream_mr = upstream

    @classmethod
    def _wrap(cls, resource):
        """An object of this class around an existing rmmc.Resource."""
        self = cls.__new__(cls)
        self.resource = resource
        self.spec = resource.spec
        self.upstream_mr = None
        return self

    @property
    def handle(self):
        return self.resource.handle

    def _call(self, fn, *args):
        """fn(handle, *args) with the stack's reference held for the call."""
        with self.resource._use() as h:
            return fn(h, *args)

    @property
    def device(self):
        """The device the stack serves, -1 for host memory."""
        return self.resource.device

    def __copy__(self):
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.resource = copy.copy(self.resource)
        return other

    def __deepcopy__(self, memo):
        raise TypeError("rmmc.mr.%s is not deep-copied: its stack's memory and state belong to "
                        "it (copy.copy() shares the stack)" % type(self).__name__)

    def __reduce__(self):
        raise TypeError("rmmc.mr.%s cannot be pickled: its stack lives in this process (as "
                        "RMM's memory resources; build it again there, e.g. from its spec %r)"
                        % (type(self).__name__, self.spec))

    def get_upstream(self) -> Optional["DeviceMemoryResource"]:
        """The upstream resource object (RMM's get_upstream()); None for a base resource."""
        return self.upstream_mr

    def allocate(self, nbytes: int, stream: Any = DEFAULT_STREAM) -> int:
        """The address of `nbytes` bytes, ready on `stream` (an rmmc.Stream,
        any stream object, or a cudaStream_t as an int). MemoryError
        (rmmc.OutOfMemoryError) when the stack cannot."""
        return self.resource.allocate(nbytes, stream)

    def deallocate(self, ptr: int, nbytes: int, stream: Any = DEFAULT_STREAM) -> None:
        """Returns a block allocate() gave, with its size, reusable on `stream`."""
        self.resource.deallocate(ptr, nbytes, stream)

    def figures(self) -> Dict[str, Any]:
        """The outermost layer's figures (rmmc.Resource.figures())."""
        return self.resource.figures()

    def release_cached(self) -> None:
        """Gives cached memory back to the upstreams."""
        self.resource.release_cached()

    def __repr__(self):
        return "rmmc.mr.%s(%r)" % (type(self).__name__, self.spec)


def _upstream(upstream):
    """The upstream as an rmmc.mr object: one of ours, or one of RMM's own
    put under rmmc through the RMM bridge (rmmc.rmm.from_rmm)."""
    if isinstance(upstream, DeviceMemoryResource):
        return upstream
    if _is_rmm_object(upstream):
        return _from_rmm(upstream)
    if upstream is None:
        raise TypeError("Argument `upstream_mr` must not be None")
    raise TypeError("upstream_mr must be a memory resource object (rmmc.mr or rmm.mr), not %s"
                    % type(upstream).__name__)


def _from_rmm(rmm_mr, kind=None, device=None):
    """An RMM resource object as an rmmc.mr object (layer "rmm"), through
    the RMM bridge (rmmc.rmm.from_rmm)."""
    from ._bridge import over
    return DeviceMemoryResource._wrap(over(rmm_mr, None, kind, device))


class UpstreamResourceAdaptor(DeviceMemoryResource):
    """The base of the layers over an upstream (RMM's): ``upstream_mr`` is
    the upstream object, kept alive by the layer."""

    def __init__(self, upstream_mr, *args, **kwargs):
        raise TypeError("UpstreamResourceAdaptor is abstract: build one of its subclasses "
                        "(PoolMemoryResource(upstream_mr), ...)")


class CudaMemoryResource(DeviceMemoryResource):
    """cudaMalloc/cudaFree: ``cuda``."""

    def __init__(self, device=None):
        self._init_base("cuda", device)


class ManagedMemoryResource(DeviceMemoryResource):
    """cudaMallocManaged: ``managed``."""

    def __init__(self, device=None):
        self._init_base("managed", device)


class PinnedMemoryResource(DeviceMemoryResource):
    """Pinned host memory (cudaHostAlloc): ``pinned``."""

    def __init__(self, device=None):
        self._init_base("pinned", device)


PinnedHostMemoryResource = PinnedMemoryResource


class CudaAsyncMemoryResource(DeviceMemoryResource):
    """cudaMallocAsync on a memory pool of its own: ``cuda_async(initial=,
    release_threshold=)``. enable_ipc / enable_fabric (a pool whose memory
    exports POSIX file descriptors / fabric handles) take RMM's own
    resource through the RMM bridge (rmmc.rmm.from_rmm), as rmmc's
    cuda_async makes no shareable pool; NotSupportedError without RMM."""

    def __init__(self, initial_pool_size=None, release_threshold=None, enable_ipc=False,
                 enable_fabric=False, device=None):
        initial = None if initial_pool_size is None else _size(initial_pool_size,
                                                               "initial_pool_size")
        threshold = None if release_threshold is None else _size(release_threshold,
                                                                 "release_threshold")
        if enable_ipc or enable_fabric:
            self._init_rmm("CudaAsyncMemoryResource", "enable_ipc/enable_fabric",
                           initial_pool_size=initial, release_threshold=threshold,
                           enable_ipc=bool(enable_ipc), enable_fabric=bool(enable_fabric))
            return
        self._init_base(_layer("cuda_async", initial=initial, release_threshold=threshold),
                        device)

    def pool_handle(self):
        """The cudaMemPool_t behind it, as an int."""
        return self._call(lib().rmmc_cuda_async_resource_pool) or 0


class HostMemoryResource(DeviceMemoryResource):
    """rmmc's ``host``: malloc'd host memory, no GPU (an rmmc addition; the
    stacks of the tests and of CPU-only runs)."""

    def __init__(self):
        self._init_base("host")


SystemMemoryResource = HostMemoryResource


class PoolMemoryResource(UpstreamResourceAdaptor):
    """A coalescing pool over `upstream_mr`: ``pool(initial=, maximum_size=)``.
    initial_pool_size None: half the device's free memory, as RMM
    (``initial=50%``; 0 over host memory, rmmc's addition);
    maximum_pool_size None: no limit."""

    def __init__(self, upstream_mr: Any, initial_pool_size: Union[int, str, None] = None,
                 maximum_pool_size: Union[int, str, None] = None) -> None:
        upstream_mr = _upstream(upstream_mr)
        if initial_pool_size is not None:
            initial = _size(initial_pool_size, "initial_pool_size")
        else:
            initial = "50%" if upstream_mr.resource.memory_kind in ("device", "managed") else None
        self._init_over(_layer(
            "pool", initial=initial,
            maximum_size=None if maximum_pool_size is None
            else _size(maximum_pool_size, "maximum_pool_size")), upstream_mr)

    def pool_size(self) -> int:
        """Bytes the pool holds from its upstream (RMM's pool_size())."""
        return int(self.figures().get("reserved", 0))


class BinningMemoryResource(UpstreamResourceAdaptor):
    """Power-of-two bins from 2**min_size_exponent to 2**max_size_exponent
    bytes, larger requests to `upstream_mr`: ``binning(min=, max=)`` (-1,
    RMM's default: rmmc's default bins, 256 B to 4 MiB). `bins` (an rmmc
    addition) gives explicit bin sizes instead. add_bin() adds a bin while
    the layer holds no memory."""

    def __init__(self, upstream_mr, min_size_exponent=-1, max_size_exponent=-1, bins=None):
        for name, e in (("min_size_exponent", min_size_exponent),
                        ("max_size_exponent", max_size_exponent)):
            if not -1 <= _args.integer(e, name) < 63:
                raise InvalidArgumentError(-1, "%s must be an int in [-1, 63), not %r" % (name, e))
        if bins is not None and isinstance(bins, (str, bytes)):
            raise TypeError("bins is a list of sizes, not %s" % type(bins).__name__)
        self._exponents = (min_size_exponent, max_size_exponent)
        self._bins = None if bins is None else [_size(b, "bins") for b in bins]
        self._added = []
        self._build(_upstream(upstream_mr))

    def _build(self, upstream):
        lo, hi = self._exponents
        use_exponents = self._bins is None and lo != -1 and hi != -1
        self._init_over(_layer(
            "binning",
            min=(1 << lo) if use_exponents else None,
            max=(1 << hi) if use_exponents else None,
            bins=None if self._bins is None else ":".join(str(b) for b in self._bins)), upstream)

    def add_bin(self, allocation_size, bin_resource=None):
        """Adds a fixed_size bin of `allocation_size` blocks (RMM's add_bin).
        rmmc rebuilds its bins, so the layer must hold no memory and nothing
        else may use it yet (RmmcError IN_USE otherwise); a bin over another
        resource (`bin_resource`) is NotSupportedError: rmmc's bins are
        fixed_size layers over the binning's upstream."""
        size = _size(allocation_size, "allocation_size")
        if bin_resource is not None:
            raise NotSupportedError(-5, "rmmc's bins are fixed_size layers over the binning's "
                                    "upstream: a bin over another resource is not supported "
                                    "(build that bin as its own stack)", "add_bin")
        from ._lib import RmmcError
        figures = self.figures()
        with self.resource._use() as h:
            # The registry, another layer or a copy of this object holds it
            # when it has more than this object's one reference.
            if figures.get("reserved", 0) or lib().rmmc_resource_refcount(h) > 1:
                raise RmmcError(-10, "add_bin: the binning layer is in use (it holds memory, or "
                                "another layer or the registry holds it): add bins before using "
                                "it", "add_bin")
            n = lib().rmmc_binning_resource_bin_count(h)
            current = [lib().rmmc_binning_resource_bin_size(h, i) for i in range(n)]
        self._bins = sorted(set(current + [(size + 255) // 256 * 256]))
        old = self.resource
        self._build(self.upstream_mr)
        old.close()
        self._added.append(size)

    @property
    def bin_mrs(self):
        """Each bin as a FixedSizeMemoryResource object, smallest first."""
        out = []
        with self.resource._use() as h:
            for i in range(lib().rmmc_binning_resource_bin_count(h)):
                b = lib().rmmc_binning_resource_bin(h, i)
                out.append(FixedSizeMemoryResource._wrap(Resource._adopt(b, "<bin %d of %s>" % (
                    lib().rmmc_binning_resource_bin_size(h, i), self.spec))))
        return out


class FixedSizeMemoryResource(UpstreamResourceAdaptor):
    """Blocks of block_size bytes, taken blocks_to_preallocate at a time:
    ``fixed_size(block=, blocks_per_chunk=)``."""

    def __init__(self, upstream_mr, block_size=1 << 20, blocks_to_preallocate=128):
        if _args.c_int(blocks_to_preallocate, "blocks_to_preallocate") < 1:
            raise InvalidArgumentError(-1, "blocks_to_preallocate must be an int >= 1, not %r"
                                       % (blocks_to_preallocate,))
        self._init_over(_layer("fixed_size", block=_size(block_size, "block_size"),
                               blocks_per_chunk=blocks_to_preallocate), upstream_mr)


class ArenaMemoryResource(UpstreamResourceAdaptor):
    """Per-stream arenas over `upstream_mr`: ``arena(max_size=)`` (arena_size:
    the most taken from the upstream). dump_log_on_failure: rmmc's
    out-of-memory message always carries the arena's figures (RMM writes
    them to its log only when asked); with it, the failure is also logged
    to the "rmmc" logger (logging), as RMM logs its dump."""

    def __init__(self, upstream_mr, arena_size=None, dump_log_on_failure=False):
        self._init_over(_layer("arena", max_size=None if arena_size is None
                               else _size(arena_size, "arena_size")), upstream_mr)
        self._dump = bool(dump_log_on_failure)

    def allocate(self, nbytes, stream=DEFAULT_STREAM):
        try:
            return self.resource.allocate(nbytes, stream)
        except MemoryError as e:
            if self._dump:
                _log.error("rmmc arena %s: %s\n%s", self.spec, e, self.resource.status())
            raise


class LimitingResourceAdaptor(UpstreamResourceAdaptor):
    """At most allocation_limit bytes outstanding: ``limiting(limit=)``."""

    def __init__(self, upstream_mr: Any, allocation_limit: Union[int, str]) -> None:
        self._init_over(_layer("limiting", limit=_size(allocation_limit, "allocation_limit")),
                        upstream_mr)

    def get_allocation_limit(self) -> int:
        return self._call(lib().rmmc_limiting_adaptor_get_limit)

    def get_allocated_bytes(self) -> int:
        return self._call(lib().rmmc_limiting_adaptor_get_used)


class StatisticsResourceAdaptor(UpstreamResourceAdaptor):
    """Counts bytes and allocations, with a stack of counters
    (push_counters/pop_counters): ``statistics``."""

    def __init__(self, upstream_mr: Any) -> None:
        self._init_over("statistics", upstream_mr)

    @property
    def allocation_counts(self):
        """The counters of the innermost scope (rmmc.stats.Statistics)."""
        return self._call(_read)

    def push_counters(self):
        """Opens a new scope of counters; returns the counters before it."""
        return self._call(_push)

    def pop_counters(self):
        """Closes the innermost scope (folding it into the one below);
        returns its counters."""
        return self._call(_pop)


class TrackingResourceAdaptor(UpstreamResourceAdaptor):
    """Records every outstanding allocation (and its call stack with
    capture_stacks): ``tracking(backtrace=)``."""

    def __init__(self, upstream_mr: Any, capture_stacks: bool = False) -> None:
        self._init_over(_layer("tracking", backtrace="true" if capture_stacks else None),
                        upstream_mr)

    def get_allocated_bytes(self):
        return self._call(lib().rmmc_tracking_adaptor_get_outstanding_bytes)

    def get_outstanding_allocations(self):
        """[(ptr, bytes, stream)] of the outstanding allocations, oldest first."""
        out = []

        def each(_ctx, a):
            out.append((a.contents.ptr or 0, a.contents.bytes, a.contents.stream or 0))
        check(self._call(lib().rmmc_tracking_adaptor_for_each, TRACKED_CB(each), None),
              "get_outstanding_allocations")
        return out

    def get_outstanding_allocations_str(self) -> str:
        """The outstanding allocations, one per line."""
        return "".join("0x%x: %d bytes on stream 0x%x\n" % a
                       for a in self.get_outstanding_allocations())

    def log_outstanding_allocations(self) -> None:
        """Logs the outstanding allocations at debug level (RMM logs them
        with its logger at debug): to the "rmmc" logger (logging) when
        rmmc.should_log(rmmc.level_enum.debug)."""
        from .logger import level_enum, should_log
        if should_log(level_enum.debug):
            _log.debug("Outstanding Allocations: %s", self.get_outstanding_allocations_str())


class LoggingResourceAdaptor(UpstreamResourceAdaptor):
    """Writes every allocation and free in RMM's CSV format to
    log_file_name (default $RMM_LOG_FILE) with the device before its
    extension, as RMM names it ("rmm.log" on device 0: "rmm.dev0.log",
    made absolute): ``logging(path=)``."""

    def __init__(self, upstream_mr: Any, log_file_name: Optional[str] = None) -> None:
        if log_file_name is None:
            log_file_name = os.environ.get("RMM_LOG_FILE")
        if isinstance(log_file_name, os.PathLike):
            log_file_name = os.fspath(log_file_name)
        if log_file_name is not None and not isinstance(log_file_name, str):
            raise TypeError("log_file_name must be a str, not %s" % type(log_file_name).__name__)
        if not log_file_name:
            raise InvalidArgumentError(-1, "RMM log file must be specified either using "
                                       "log_file_name= argument or RMM_LOG_FILE environment "
                                       "variable")
        upstream_mr = _upstream(upstream_mr)
        dev = getattr(self, "_for_device", None)
        if dev is None:
            dev = upstream_mr.device if upstream_mr.device >= 0 else _device(None)
        stem, ext = os.path.splitext(log_file_name)
        log_file_name = os.path.abspath("%s.dev%d%s" % (stem, dev, ext))
        if '"' in log_file_name:
            raise InvalidArgumentError(-1, "log_file_name may not contain '\"'")
        self._file_name = log_file_name
        self._init_over('logging(path="%s")' % log_file_name, upstream_mr)

    def get_file_name(self) -> str:
        return self._file_name

    def flush(self) -> None:
        check(self._call(lib().rmmc_logging_adaptor_flush), "flush")


class FailureCallbackResourceAdaptor(UpstreamResourceAdaptor):
    """Calls callback(nbytes) when `upstream` runs out of memory; a true
    result retries the allocation. (The spec form, failure_callback(
    retries=N), releases cached memory instead of calling Python.)"""

    def __init__(self, upstream_mr: Any, callback: Callable[[int], bool]) -> None:
        if not callable(callback):
            raise TypeError("callback must be callable")
        upstream = _upstream(upstream_mr)
        self._callback = FAILURE_CB(lambda nbytes, _u: bool(callback(nbytes)))
        h = ctypes.c_void_p()
        with upstream.resource._use() as up:
            check(lib().rmmc_failure_callback_adaptor_create(up, self._callback, None,
                                                              ctypes.byref(h)),
                  "FailureCallbackResourceAdaptor")
        spec = "<python failure callback> > %s" % upstream.spec
        self.resource = Resource._adopt(h.value, spec)
        lib().rmmc_resource_release(h.value)
        self.spec = spec
        self.upstream_mr = upstream


class AlignedResourceAdaptor(UpstreamResourceAdaptor):
    """Aligns allocations of at least alignment_threshold bytes to
    `alignment`: ``aligned(alignment=, threshold=)``."""

    def __init__(self, upstream_mr, alignment=None, alignment_threshold=None):
        self._init_over(_layer("aligned",
                               alignment=None if alignment is None
                               else _size(alignment, "alignment"),
                               threshold=None if alignment_threshold is None
                               else _size(alignment_threshold, "alignment_threshold")),
                        upstream_mr)


class PrefetchResourceAdaptor(UpstreamResourceAdaptor):
    """Prefetches each allocation to the device: ``prefetch``."""

    def __init__(self, upstream_mr):
        self._init_over("prefetch", upstream_mr)


class CudaAsyncViewMemoryResource(DeviceMemoryResource):
    """cudaMallocFromPoolAsync from an existing pool (`pool_handle`: a
    cudaMemPool_t or CUmemoryPool, as an int or a cuda-python handle),
    never destroyed by this resource (rmmc_cuda_async_resource_create_view)."""

    def __init__(self, pool_handle, device=None):
        try:
            pool = int(pool_handle)
        except (TypeError, ValueError):
            raise ValueError("pool_handle must be a cudaMemPool_t or CUmemoryPool") from None
        h = ctypes.c_void_p()
        dev = -1 if device is None else _device(device)
        check(lib().rmmc_cuda_async_resource_create_view(dev, pool or None, ctypes.byref(h)),
              "CudaAsyncViewMemoryResource")
        self.resource = Resource._adopt(h.value, "cuda_async(view)")
        lib().rmmc_resource_release(h.value)
        self.spec = self.resource.spec
        self.upstream_mr = None

    def pool_handle(self):
        return self._call(lib().rmmc_cuda_async_resource_pool) or 0


class SamHeadroomMemoryResource(DeviceMemoryResource):
    """RMM's system-allocated memory with `headroom` bytes of device memory
    kept free (Grace Hopper's system memory): RMM's own resource through
    the RMM bridge; NotSupportedError without RMM."""

    def __init__(self, headroom):
        self._init_rmm("SamHeadroomMemoryResource", "headroom=%r" % (headroom,),
                       _size(headroom, "headroom"))


class _Experimental:
    """rmm.mr.experimental's names."""

    class CudaAsyncManagedMemoryResource(DeviceMemoryResource):
        """RMM's managed memory from a cudaMemPool (experimental in RMM):
        RMM's own resource through the RMM bridge; NotSupportedError
        without RMM."""

        def __init__(self):
            self._init_rmm("experimental.CudaAsyncManagedMemoryResource", "")

        def pool_handle(self):
            """The cudaMemPool_t of RMM's resource, as an int."""
            return int(self.rmm_mr.pool_handle())

    __all__ = ["CudaAsyncManagedMemoryResource"]


experimental = _Experimental()

# CallbackMemoryResource: an rmmc resource whose slots are Python callables
# (resource_ops.h through ctypes). Every resource alive, by the address of
# its base: the struct, its ops table and the callables, kept until destroy.
_CALLBACK_RESOURCES: dict = {}
# Destroyed ones, freed at the next construction: destroy runs inside one of
# their own callbacks, whose code must outlive the call.
_CALLBACK_DESTROYED: list = []


class CallbackMemoryResource(DeviceMemoryResource):
    """RMM's CallbackMemoryResource: allocate_func(nbytes, stream) returns
    an address, deallocate_func(ptr, nbytes, stream) frees it; `stream` is
    an rmmc.Stream. A Python call per allocation, as in RMM: for debugging
    and tests. A MemoryError from allocate_func is rmmc's out of memory."""

    def __init__(self, allocate_func: Callable[[int, Stream], int],
                 deallocate_func: Callable[[int, int, Stream], None]) -> None:
        if not callable(allocate_func) or not callable(deallocate_func):
            raise TypeError("allocate_func and deallocate_func must be callable")
        self._allocate_func, self._deallocate_func = allocate_func, deallocate_func

        def fail(e, what):
            status = -2 if isinstance(e, MemoryError) else -11
            lib().rmmc_set_error(status, ("%s: %s: %s" % (what, type(e).__name__, e))
                                  .replace("%", "%%").encode(errors="replace"))
            return status

        def allocate(_r, nbytes, _alignment, stream, out):
            try:
                out[0] = int(allocate_func(nbytes, Stream._from_handle(stream or 0))) or None
                return 0
            except BaseException as e:  # noqa: B902 (the status carries it)
                return fail(e, "CallbackMemoryResource allocate_func")

        def deallocate(_r, ptr, nbytes, _alignment, stream):
            try:
                deallocate_func(ptr or 0, nbytes, Stream._from_handle(stream or 0))
                return 0
            except BaseException as e:  # noqa: B902
                return fail(e, "CallbackMemoryResource deallocate_func")

        def destroy(r):
            _CALLBACK_DESTROYED.append(_CALLBACK_RESOURCES.pop(r, None))

        del _CALLBACK_DESTROYED[:]

        ops = ResourceOps(version=1, name=b"callback", allocate=ALLOCATE_SLOT(allocate),
                          deallocate=DEALLOCATE_SLOT(deallocate), destroy=DESTROY_SLOT(destroy))
        base = ResourceBase()
        lib().rmmc_resource_init(ctypes.byref(base), ctypes.byref(ops), 1, _device(None))
        addr = ctypes.addressof(base)
        _CALLBACK_RESOURCES[addr] = (base, ops)
        self.resource = Resource._adopt(addr, "callback")
        lib().rmmc_resource_release(addr)  # _adopt took its own reference
        self.spec = "callback"
        self.upstream_mr = None


# The objects set through this module, by device: get_current_device_resource()
# hands back the same object while the registry still holds its stack.
_SET: dict = {}


def get_per_device_resource(device: Optional[int]) -> DeviceMemoryResource:
    """The resource object of `device`'s registry entry (built from the
    default spec on first use). It holds a reference of its own, taken
    atomically with sets on other threads (the registry's stack stays
    valid as long as the object lives)."""
    device = _device(device)
    h = _device_resource(device, "get_per_device_resource", retain=True).value
    try:
        mr = _SET.get(device)
        if mr is not None and mr.resource._handle == h:
            return mr
        spec = "<device %d: %s>" % (device, lib().rmmc_resource_name(h).decode())
        return DeviceMemoryResource._wrap(Resource._adopt(h, spec))
    finally:
        lib().rmmc_resource_release(h)


def set_per_device_resource(device: Optional[int], mr: DeviceMemoryResource) -> None:
    """Makes `mr` the registry's resource for `device` (what rmmc.torch,
    rmmc.cupy, rmmc_allocate and DeviceBuffer allocate from)."""
    if not isinstance(mr, DeviceMemoryResource):
        raise TypeError("mr must be a memory resource object (rmmc.mr), not %s"
                        % type(mr).__name__)
    device = _device(device)
    with mr.resource._use() as h:
        check(lib().rmmc_set_device_resource(device, h, None), "set_per_device_resource")
    _SET[device] = mr


def _set_per_device_resources(pairs):
    """set_per_device_resource for each (device, mr) of `pairs`, all or
    nothing: if one set fails, the devices set before it get their
    previous resources back (or none, as before) and the error is raised."""
    done = []  # (device, the registry's reference on its previous resource)
    try:
        for device, mr in pairs:
            old = ctypes.c_void_p()
            with mr.resource._use() as h:
                check(lib().rmmc_set_device_resource(device, h, ctypes.byref(old)),
                      "set_per_device_resource(%d)" % device)
            done.append((device, old.value))
    except BaseException:
        for device, old in reversed(done):
            mine = ctypes.c_void_p()
            lib().rmmc_set_device_resource(device, old, ctypes.byref(mine))
            lib().rmmc_resource_release(mine.value)
            lib().rmmc_resource_release(old)
        raise
    for device, old in done:
        lib().rmmc_resource_release(old)
    for device, mr in pairs:
        _SET[device] = mr


def get_current_device_resource() -> DeviceMemoryResource:
    """The current device's resource object."""
    return get_per_device_resource(None)


def set_current_device_resource(mr: DeviceMemoryResource) -> None:
    """set_per_device_resource for the current device."""
    set_per_device_resource(None, mr)


def get_current_device_resource_type() -> type:
    """The class of the current device's resource object."""
    return type(get_current_device_resource())


def is_initialized(device: Optional[int] = None) -> bool:
    """True once a resource was set for the device through this module or
    rmmc.reinitialize() (RMM's rmm.is_initialized())."""
    return _device(device) in _SET


def available_device_memory(device: Optional[int] = None) -> Tuple[int, int]:
    """(free, total) bytes of the device. NoDeviceError without a GPU."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(lib().rmmc_device_memory_info(-1 if device is None else _device(device),
                                         ctypes.byref(free), ctypes.byref(total)),
          "available_device_memory")
    return free.value, total.value


def enable_logging(log_file_name: Optional[str] = None) -> None:
    """Wraps each device's current resource (set through this module, or
    device 0's) in a LoggingResourceAdaptor (RMM's enable_logging), unless
    it is one: log_file_name (default $RMM_LOG_FILE) gets ".dev<N>"."""
    devices = sorted(_SET) or [0]
    built = []
    for d in devices:
        cur = get_per_device_resource(d)
        if not isinstance(cur, LoggingResourceAdaptor):
            built.append((d, LoggingResourceAdaptor(cur, log_file_name)))
    for d, r in built:
        set_per_device_resource(d, r)


def disable_logging() -> None:
    """Puts back the upstream of every device's LoggingResourceAdaptor set
    through this module or reinitialize(logging=True)."""
    for d, r in sorted(_SET.items()):
        up = r.get_upstream() if isinstance(r, LoggingResourceAdaptor) else None
        if up is not None:
            set_per_device_resource(d, up)


def get_log_filenames() -> Dict[int, Optional[str]]:
    """{device: the log file of its LoggingResourceAdaptor, or None}."""
    return {d: r.get_file_name() if isinstance(r, LoggingResourceAdaptor) else None
            for d, r in sorted(_SET.items())}
