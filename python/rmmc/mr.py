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
"""
import copy
import ctypes
import os

from . import InvalidArgumentError, Resource, _args, _device, _device_resource, parse_size
from ._capi import FAILURE_CB, TRACKED_CB, clib
from ._lib import check

__all__ = [
    "DeviceMemoryResource", "UpstreamResourceAdaptor", "CudaMemoryResource",
    "ManagedMemoryResource", "PinnedMemoryResource", "PinnedHostMemoryResource",
    "CudaAsyncMemoryResource", "HostMemoryResource", "SystemMemoryResource",
    "PoolMemoryResource", "BinningMemoryResource", "FixedSizeMemoryResource",
    "ArenaMemoryResource", "LimitingResourceAdaptor", "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor", "LoggingResourceAdaptor", "FailureCallbackResourceAdaptor",
    "AlignedResourceAdaptor", "PrefetchResourceAdaptor", "get_current_device_resource",
    "set_current_device_resource", "get_per_device_resource", "set_per_device_resource",
    "get_current_device_resource_type", "is_initialized", "available_device_memory",
]


def _size(value, what):
    """Bytes from an int or a spec size ("1GiB"), as a spec writes them."""
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s is a number of bytes (int) or a size such as '1GiB', not %s"
                        % (what, type(value).__name__))
    return _args.size(value, what)


def _layer(name, **options):
    """'name(k=v, ...)' for the options that are not None."""
    given = ["%s=%s" % (k, v) for k, v in options.items() if v is not None]
    return "%s(%s)" % (name, ", ".join(given)) if given else name


class DeviceMemoryResource:
    """The base of every resource object: allocate/deallocate through the
    stack it holds. ``resource`` is the rmmc.Resource, ``spec`` its spec,
    ``handle`` the rmmc_resource_t * (borrowed).

    As RMM's, a resource object is not pickled or deep-copied (TypeError):
    its stack lives in this process. copy.copy() gives another object of
    the same class over the same stack, with a reference of its own."""

    _not_a_stream = True  # has .handle, which is no stream

    def __init__(self, *args, **kwargs):
        raise TypeError("DeviceMemoryResource is abstract: build one of its subclasses "
                        "(CudaMemoryResource(), PoolMemoryResource(upstream), ...)")

    def _init_base(self, spec, device=None):
        self.resource = Resource(spec, device)
        self.spec = spec
        self.upstream_mr = None

    def _init_over(self, layer, upstream):
        if not isinstance(upstream, DeviceMemoryResource):
            raise TypeError("upstream must be a memory resource object (rmmc.mr), not %s"
                            % type(upstream).__name__)
        h = ctypes.c_void_p()
        text = _args.text(layer, "the layer's spec")
        with upstream.resource._use() as up:
            check(clib().rmmc_stack_create_over(text, up, ctypes.byref(h)),
                  "%s(%s)" % (type(self).__name__, layer))
        spec = "%s > %s" % (layer, upstream.spec)
        self.resource = Resource._adopt(h.value, spec)
        clib().rmmc_resource_release(h.value)  # _adopt took its own reference
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

    def get_upstream(self):
        """The upstream resource object (RMM's get_upstream()); None for a base resource."""
        return self.upstream_mr

    def allocate(self, nbytes, stream=0):
        """The address of `nbytes` bytes, ready on `stream` (an int)."""
        return self.resource.allocate(nbytes, stream)

    def deallocate(self, ptr, nbytes, stream=0):
        """Returns a block allocate() gave, with its size."""
        self.resource.deallocate(ptr, nbytes, stream)

    def figures(self):
        """The outermost layer's figures (rmmc.Resource.figures())."""
        return self.resource.figures()

    def release_cached(self):
        """Gives cached memory back to the upstreams."""
        self.resource.release_cached()

    def __repr__(self):
        return "rmmc.mr.%s(%r)" % (type(self).__name__, self.spec)


UpstreamResourceAdaptor = DeviceMemoryResource  # RMM's base of the adaptors


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
    release_threshold=)``."""

    def __init__(self, initial_pool_size=None, release_threshold=None, device=None):
        spec = _layer("cuda_async",
                      initial=None if initial_pool_size is None
                      else _size(initial_pool_size, "initial_pool_size"),
                      release_threshold=None if release_threshold is None
                      else _size(release_threshold, "release_threshold"))
        self._init_base(spec, device)


class HostMemoryResource(DeviceMemoryResource):
    """rmmc's ``host``: malloc'd host memory, no GPU (an rmmc addition; the
    stacks of the tests and of CPU-only runs)."""

    def __init__(self):
        self._init_base("host")


SystemMemoryResource = HostMemoryResource


class PoolMemoryResource(DeviceMemoryResource):
    """A coalescing pool over `upstream`: ``pool(initial=, max=)``.
    maximum_pool_size None: no limit."""

    def __init__(self, upstream, initial_pool_size=None, maximum_pool_size=None):
        self._init_over(_layer(
            "pool",
            initial=None if initial_pool_size is None
            else _size(initial_pool_size, "initial_pool_size"),
            max=None if maximum_pool_size is None
            else _size(maximum_pool_size, "maximum_pool_size")), upstream)

    def pool_size(self):
        """Bytes the pool holds from its upstream (RMM's pool_size())."""
        return int(self.figures().get("reserved", 0))


class BinningMemoryResource(DeviceMemoryResource):
    """Power-of-two bins from 2**min_size_exponent to 2**max_size_exponent
    bytes, larger requests to `upstream`: ``binning(min=, max=)``. `bins`
    (an rmmc addition) gives explicit bin sizes instead."""

    def __init__(self, upstream, min_size_exponent=None, max_size_exponent=None, bins=None):
        for name, e in (("min_size_exponent", min_size_exponent),
                        ("max_size_exponent", max_size_exponent)):
            if e is not None and not 0 <= _args.integer(e, name) < 63:
                raise InvalidArgumentError(-1, "%s must be an int in [0, 63), not %r" % (name, e))
        if bins is not None and isinstance(bins, (str, bytes)):
            raise TypeError("bins is a list of sizes, not %s" % type(bins).__name__)
        self._init_over(_layer(
            "binning",
            min=None if min_size_exponent is None else 1 << min_size_exponent,
            max=None if max_size_exponent is None else 1 << max_size_exponent,
            bins=None if bins is None else ":".join(str(_size(b, "bins")) for b in bins)),
            upstream)


class FixedSizeMemoryResource(DeviceMemoryResource):
    """Blocks of block_size bytes, taken blocks_to_preallocate at a time:
    ``fixed_size(block=, blocks_per_chunk=)``."""

    def __init__(self, upstream, block_size=1 << 20, blocks_to_preallocate=128):
        if _args.c_int(blocks_to_preallocate, "blocks_to_preallocate") < 1:
            raise InvalidArgumentError(-1, "blocks_to_preallocate must be an int >= 1, not %r"
                                       % (blocks_to_preallocate,))
        self._init_over(_layer("fixed_size", block=_size(block_size, "block_size"),
                               blocks_per_chunk=blocks_to_preallocate), upstream)


class ArenaMemoryResource(DeviceMemoryResource):
    """Per-stream arenas over `upstream`: ``arena(max=)`` (arena_size: the
    most taken from the upstream)."""

    def __init__(self, upstream, arena_size=None):
        self._init_over(_layer("arena", max=None if arena_size is None
                               else _size(arena_size, "arena_size")), upstream)


class LimitingResourceAdaptor(DeviceMemoryResource):
    """At most allocation_limit bytes outstanding: ``limiting(limit=)``."""

    def __init__(self, upstream, allocation_limit):
        self._init_over(_layer("limiting", limit=_size(allocation_limit, "allocation_limit")),
                        upstream)

    def get_allocation_limit(self):
        return self._call(clib().rmmc_limiting_adaptor_get_limit)

    def get_allocated_bytes(self):
        return self._call(clib().rmmc_limiting_adaptor_get_used)


class StatisticsResourceAdaptor(DeviceMemoryResource):
    """Counts bytes and allocations, with a stack of counters
    (push_counters/pop_counters): ``statistics``."""

    def __init__(self, upstream):
        self._init_over("statistics", upstream)

    @property
    def allocation_counts(self):
        """The counters of the innermost scope (rmmc.stats.Statistics)."""
        from .stats import _read
        return self._call(_read)

    def push_counters(self):
        """Opens a new scope of counters; returns the counters before it."""
        from .stats import _push
        return self._call(_push)

    def pop_counters(self):
        """Closes the innermost scope (folding it into the one below);
        returns its counters."""
        from .stats import _pop
        return self._call(_pop)


class TrackingResourceAdaptor(DeviceMemoryResource):
    """Records every outstanding allocation (and its call stack with
    capture_stacks): ``tracking(backtrace=)``."""

    def __init__(self, upstream, capture_stacks=False):
        self._init_over(_layer("tracking", backtrace="true" if capture_stacks else None),
                        upstream)

    def get_allocated_bytes(self):
        return self._call(clib().rmmc_tracking_adaptor_get_outstanding_bytes)

    def get_outstanding_allocations(self):
        """[(ptr, bytes, stream)] of the outstanding allocations, oldest first."""
        out = []

        def each(_ctx, a):
            out.append((a.contents.ptr or 0, a.contents.bytes, a.contents.stream or 0))
        check(self._call(clib().rmmc_tracking_adaptor_for_each, TRACKED_CB(each), None),
              "get_outstanding_allocations")
        return out

    def get_outstanding_allocations_str(self):
        """The outstanding allocations, one per line."""
        return "".join("0x%x: %d bytes on stream 0x%x\n" % a
                       for a in self.get_outstanding_allocations())


class LoggingResourceAdaptor(DeviceMemoryResource):
    """Writes every allocation and free to log_file_name in RMM's CSV
    format: ``logging(path=)``."""

    def __init__(self, upstream, log_file_name=None):
        if log_file_name is None:
            log_file_name = os.environ.get("RMM_LOG_FILE")
        if isinstance(log_file_name, os.PathLike):
            log_file_name = os.fspath(log_file_name)
        if log_file_name is not None and not isinstance(log_file_name, str):
            raise TypeError("log_file_name must be a str, not %s" % type(log_file_name).__name__)
        if not log_file_name:
            raise InvalidArgumentError(-1, "LoggingResourceAdaptor needs log_file_name (or "
                                       "$RMM_LOG_FILE)")
        if '"' in log_file_name:
            raise InvalidArgumentError(-1, "log_file_name may not contain '\"'")
        self._file_name = log_file_name
        self._init_over('logging(path="%s")' % log_file_name, upstream)

    def get_file_name(self):
        return self._file_name

    def flush(self):
        check(self._call(clib().rmmc_logging_adaptor_flush), "flush")


class FailureCallbackResourceAdaptor(DeviceMemoryResource):
    """Calls callback(nbytes) when `upstream` runs out of memory; a true
    result retries the allocation. (The spec form, failure_callback(
    retries=N), releases cached memory instead of calling Python.)"""

    def __init__(self, upstream, callback):
        if not callable(callback):
            raise TypeError("callback must be callable")
        if not isinstance(upstream, DeviceMemoryResource):
            raise TypeError("upstream must be a memory resource object (rmmc.mr), not %s"
                            % type(upstream).__name__)
        self._callback = FAILURE_CB(lambda nbytes, _u: bool(callback(nbytes)))
        h = ctypes.c_void_p()
        with upstream.resource._use() as up:
            check(clib().rmmc_failure_callback_adaptor_create(up, self._callback, None,
                                                              ctypes.byref(h)),
                  "FailureCallbackResourceAdaptor")
        spec = "<python failure callback> > %s" % upstream.spec
        self.resource = Resource._adopt(h.value, spec)
        clib().rmmc_resource_release(h.value)
        self.spec = spec
        self.upstream_mr = upstream


class AlignedResourceAdaptor(DeviceMemoryResource):
    """Aligns allocations of at least alignment_threshold bytes to
    `alignment`: ``aligned(alignment=, threshold=)``."""

    def __init__(self, upstream, alignment=None, alignment_threshold=None):
        self._init_over(_layer("aligned",
                               alignment=None if alignment is None
                               else _size(alignment, "alignment"),
                               threshold=None if alignment_threshold is None
                               else _size(alignment_threshold, "alignment_threshold")),
                        upstream)


class PrefetchResourceAdaptor(DeviceMemoryResource):
    """Prefetches each allocation to the device: ``prefetch``."""

    def __init__(self, upstream):
        self._init_over("prefetch", upstream)


# The objects set through this module, by device: get_current_device_resource()
# hands back the same object while the registry still holds its stack.
_SET = {}


def get_per_device_resource(device):
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
        spec = "<device %d: %s>" % (device, clib().rmmc_resource_name(h).decode())
        return DeviceMemoryResource._wrap(Resource._adopt(h, spec))
    finally:
        clib().rmmc_resource_release(h)


def set_per_device_resource(device, mr):
    """Makes `mr` the registry's resource for `device` (what rmmc.torch,
    rmmc.cupy, rmmc_allocate and DeviceBuffer allocate from)."""
    if not isinstance(mr, DeviceMemoryResource):
        raise TypeError("mr must be a memory resource object (rmmc.mr), not %s"
                        % type(mr).__name__)
    device = _device(device)
    with mr.resource._use() as h:
        check(clib().rmmc_set_device_resource(device, h, None), "set_per_device_resource")
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
                check(clib().rmmc_set_device_resource(device, h, ctypes.byref(old)),
                      "set_per_device_resource(%d)" % device)
            done.append((device, old.value))
    except BaseException:
        for device, old in reversed(done):
            mine = ctypes.c_void_p()
            clib().rmmc_set_device_resource(device, old, ctypes.byref(mine))
            clib().rmmc_resource_release(mine.value)
            clib().rmmc_resource_release(old)
        raise
    for device, old in done:
        clib().rmmc_resource_release(old)
    for device, mr in pairs:
        _SET[device] = mr


def get_current_device_resource():
    """The current device's resource object."""
    return get_per_device_resource(None)


def set_current_device_resource(mr):
    """set_per_device_resource for the current device."""
    set_per_device_resource(None, mr)


def get_current_device_resource_type():
    """The class of the current device's resource object."""
    return type(get_current_device_resource())


def is_initialized(device=None):
    """True once a resource was set for the device through this module or
    rmmc.reinitialize() (RMM's rmm.is_initialized())."""
    return _device(device) in _SET


def available_device_memory(device=None):
    """(free, total) bytes of the device. NoDeviceError without a GPU."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(clib().rmmc_device_memory_info(-1 if device is None else _device(device),
                                         ctypes.byref(free), ctypes.byref(total)),
          "available_device_memory")
    return free.value, total.value
