# SPDX-License-Identifier: Apache-2.0
"""rmmc stacks inside RMM (RAPIDS Memory Manager), and RMM's resources under rmmc's layers.

    import rmmc.rmm
    rmmc.rmm.use("statistics > pool(initial=1GiB) > cuda")   # RMM's current device resource
    import rmm, cupy
    from rmm.allocators.cupy import rmm_cupy_allocator
    cupy.cuda.set_allocator(rmm_cupy_allocator)              # CuPy, cuDF, ... now allocate from rmmc

use() builds the stack (or takes an rmmc.Resource or rmmc.mr object), makes
it rmmc's registry resource for the device too (so rmmc.torch, rmmc.cupy,
rmmc.DeviceBuffer and RMM share one stack and one set of figures), and
installs it with rmm.mr.set_per_device_resource as an
rmm.mr.DeviceMemoryResource (RmmcMemoryResource): rmm.DeviceBuffer,
rmm.allocators (CuPy, Numba, PyTorch) and every library that allocates
through RMM then allocate from it, in C++ (include/rmmc/rmm.hpp): no Python
on the allocation path, the stream RMM gives passed through. RMM's own
adaptors take it as an upstream (rmm.mr.StatisticsResourceAdaptor(mr)).

The other way, over(rmm_mr, spec) puts rmmc's layers over an RMM resource
object (``over(rmm.mr.CudaAsyncMemoryResource(), "statistics > limiting(limit=8GiB)")``),
and from_rmm(rmm_mr) gives it as an rmmc.mr object.

The C++ layer is compiled against the installed librmm's headers on first
use (a C++17 compiler and the CUDA toolkit's headers are needed, as for
rmmc.torch's native backend) and cached per RMM version under
~/.cache/rmmc/rmm_bridge ($RMMC_RMM_BUILD_DIR). RMM 25.12 and later (CCCL
cuda::mr resources); an older RMM is refused in one sentence.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from . import Resource, _bridge, _device, get_default, set_default
# over and build_bridge are this module's API; _UPSTREAMS is read by the tests.
from ._bridge import _UPSTREAMS, _field, _rmm, build_bridge, over  # noqa: F401
from ._lib import InvalidArgumentError

# RmmcMemoryResource (a subclass of RMM's class, made on first use: it needs
# RMM) is reached as rmmc.rmm.RmmcMemoryResource, not through __all__.
__all__ = ["use", "reinitialize", "over", "from_rmm", "build_bridge", "bench_pairs",
           "current_stack"]
_classes: dict = {}


def _rmmc_class(rmm):
    """RmmcMemoryResource, made once per process: a Python subclass of RMM's
    DeviceMemoryResource whose C++ resource is an rmmc stack."""
    cls = _classes.get("RmmcMemoryResource")
    if cls is not None:
        return cls

    class RmmcMemoryResource(rmm.mr.DeviceMemoryResource):
        """An rmm.mr.DeviceMemoryResource over an rmmc stack (rmmc.rmm).
        ``resource`` is the rmmc.Resource (one reference), ``spec`` its
        spec; allocate/deallocate/figures as RMM's and rmmc's objects.
        Copies and pickles are refused: the object owns its C++ resource."""

        def __init__(self, stack: Any, device: Optional[int] = None) -> None:
            dll = build_bridge()
            self._cxx = None
            self.resource = _as_resource(stack, device)
            self.spec = self.resource.spec
            cxx = dll.rmmc_rmm_resource_new(self.resource.handle)
            if not cxx:
                raise RuntimeError("rmmc.rmm: " + dll.rmmc_rmm_bridge_error().decode())
            if dll.rmmc_rmm_bind(_field(dll, self), cxx) != 0:
                dll.rmmc_rmm_resource_delete(cxx)
                raise RuntimeError("rmmc.rmm: " + dll.rmmc_rmm_bridge_error().decode())
            self._cxx = cxx

        @property
        def handle(self) -> int:
            """The rmmc_resource_t * (borrowed)."""
            return self.resource.handle

        def figures(self) -> dict:
            return self.resource.figures()

        def layers(self) -> list:
            return self.resource.layers()

        def __reduce__(self):
            raise TypeError("an rmmc.rmm.RmmcMemoryResource owns its C++ resource and cannot be "
                            "copied or pickled: build one per process (rmmc.rmm.use(spec))")

        def __del__(self) -> None:
            cxx, self._cxx = getattr(self, "_cxx", None), None
            dll = _bridge.loaded()
            if cxx and dll is not None:
                dll.rmmc_rmm_unbind(_field(dll, self))
                dll.rmmc_rmm_resource_delete(cxx)

        def __repr__(self) -> str:
            return "rmmc.rmm.RmmcMemoryResource(%r)" % (self.spec,)

    RmmcMemoryResource.__module__ = __name__
    RmmcMemoryResource.__qualname__ = "RmmcMemoryResource"
    _classes["RmmcMemoryResource"] = RmmcMemoryResource
    return RmmcMemoryResource


def __getattr__(name):
    if name == "RmmcMemoryResource":
        return _rmmc_class(_rmm())
    raise AttributeError("module 'rmmc.rmm' has no attribute %r" % name)


def _as_resource(stack, device):
    """An rmmc.Resource holding its own reference, from a spec, a Resource
    or an rmmc.mr object."""
    from .mr import DeviceMemoryResource as RmmcMr
    if isinstance(stack, str):
        return Resource(stack, device)
    if isinstance(stack, RmmcMr):
        stack = stack.resource
    if isinstance(stack, Resource):
        return Resource._adopt(stack.handle, stack.spec)
    raise TypeError("rmmc.rmm: a stack is a spec (str), an rmmc.Resource or an rmmc.mr object, "
                    "not %s" % type(stack).__name__)


def use(spec: Union[str, Resource, Any, None] = None, device: Optional[int] = None) -> Any:
    """Makes an rmmc stack RMM's current resource for `device` (default:
    the current device) and rmmc's registry resource there. `spec`: a spec
    (built on that device), an rmmc.Resource or rmmc.mr object, or None for
    the device's rmmc stack as it is (RMMC_ALLOC_CONF, rmmc.set_default).
    Returns the RmmcMemoryResource, which rmm.mr.get_current_device_resource()
    returns from then on."""
    rmm = _rmm()
    dev = _device(device)
    if spec is None:
        stack = get_default(dev)
    elif isinstance(spec, str):
        stack = Resource(spec, dev)
        set_default(stack, dev)
    else:
        stack = _as_resource(spec, dev)
        set_default(stack, dev)
    try:
        mr = _rmmc_class(rmm)(stack)
    finally:
        stack.close()
    rmm.mr.set_per_device_resource(dev, mr)
    return mr


def reinitialize(spec: Union[str, None] = None, devices: Union[int, list] = 0, **rmm_options: Any) -> None:
    """RMM's rmm.reinitialize() with an rmmc stack on each of `devices`:
    RMM's reinitialize hooks run first (last registered first), then each
    device gets `spec`, or the stack RMM's keywords describe
    (pool_allocator=, initial_pool_size=, maximum_pool_size=,
    managed_memory=, logging=, log_file_name=; rmmc.reinitialize_spec
    writes it). Every device's stack is built before any is installed."""
    rmm = _rmm()
    from .rmm_compat import reinitialize_spec
    if spec is not None and rmm_options:
        raise TypeError("rmmc.rmm.reinitialize: a spec or RMM's keywords, not both (%s)"
                        % ", ".join(sorted(rmm_options)))
    devs = [devices] if isinstance(devices, int) else list(devices)
    if not devs:
        raise InvalidArgumentError(-1, "rmmc.rmm.reinitialize: devices is empty")
    import rmm.rmm as rmm_top
    for func, args, kwargs in reversed(list(getattr(rmm_top, "_reinitialize_hooks", []))):
        func(*args, **kwargs)
    built = []
    try:
        for d in devs:
            s = spec if spec is not None else reinitialize_spec(device=d, **rmm_options)
            built.append((d, Resource(s, d)))
        for d, r in built:
            use(r, d)
    finally:
        for _, r in built:
            r.close()


def current_stack(device: Optional[int] = None) -> Optional[Resource]:
    """The rmmc stack behind RMM's current resource for `device` (an
    rmmc.Resource holding its own reference), or None when RMM's resource
    there is not an rmmc one."""
    rmm = _rmm()
    mr = rmm.mr.get_per_device_resource(_device(device))
    if isinstance(mr, _rmmc_class(rmm)):
        return Resource._adopt(mr.handle, mr.spec)
    return None


def from_rmm(rmm_mr: Any, kind: Optional[str] = None, device: Optional[int] = None) -> Any:
    """The RMM resource object as an rmmc.mr object (layer "rmm"), for rmmc's
    adaptors: rmmc.mr.StatisticsResourceAdaptor(rmmc.rmm.from_rmm(rmm_mr))."""
    from .mr import _from_rmm
    return _from_rmm(rmm_mr, kind, device)


def bench_pairs(mr: Any, nbytes: int = 256, pairs: int = 100000, stream: int = 0) -> float:
    """Nanoseconds per allocate/free pair of `nbytes` on `stream`, timed in
    C++ (RMM's benchmark loop): through RMM's resource_ref when `mr` is an
    RMM resource object, straight through rmmc when it is an rmmc.Resource.
    Raises RmmcError when an allocation fails."""
    rmm = _rmm()
    dll = build_bridge()
    if isinstance(mr, rmm.mr.DeviceMemoryResource):
        ns = dll.rmmc_rmm_bench_pairs(_field(dll, mr), None, nbytes, pairs, stream or None)
    elif isinstance(mr, Resource):
        ns = dll.rmmc_rmm_bench_pairs(None, mr.handle, nbytes, pairs, stream or None)
    else:
        raise TypeError("bench_pairs times an RMM resource object or an rmmc.Resource")
    if ns < 0:
        raise RuntimeError("rmmc.rmm.bench_pairs: " + dll.rmmc_rmm_bridge_error().decode())
    return ns
