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

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Optional, Union

from . import Resource, _device, get_default, set_default
from ._lib import InvalidArgumentError, NotSupportedError, check, lib, library_path

# RmmcMemoryResource (a subclass of RMM's class, made on first use: it needs
# RMM) is reached as rmmc.rmm.RmmcMemoryResource, not through __all__.
__all__ = ["use", "reinitialize", "over", "from_rmm", "build_bridge", "bench_pairs",
           "current_stack"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_bridge: Optional[ctypes.CDLL] = None
_classes: dict = {}
# RMM objects that rmmc resources (from over/from_rmm) refer to, by key:
# dropped when the rmmc resource is destroyed.
_UPSTREAMS: dict = {}
_ON_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_ON_DESTROY
def _drop_upstream(ctx):
    _UPSTREAMS.pop(ctx, None)


def _rmm():
    try:
        import rmm  # noqa: F401 (loads librmm)
        import rmm.mr
    except ImportError as e:
        raise ImportError("rmmc.rmm needs RMM's Python package (pip install rmm-cu13, or "
                          "rmm-cu12): %s" % e) from None
    return rmm


def _include_dirs(rmm_mod):
    """rmmc's headers, librmm's (and CCCL's inside them), CUDA's."""
    from .torch import _include_dir as rmmc_include
    out = [rmmc_include()]
    try:
        import librmm
        root = os.path.join(os.path.dirname(librmm.__file__), "include")
    except ImportError:  # a conda or system RMM: headers beside the library
        root = os.path.join(sys.prefix, "include")
    env = os.environ.get("RMMC_RMM_INCLUDE")
    if env:
        root = env
    if not os.path.exists(os.path.join(root, "rmm", "resource_ref.hpp")):
        raise FileNotFoundError(
            "RMM's C++ headers were not found (%s/rmm/resource_ref.hpp): install librmm (pip "
            "install librmm-cu13, which rmm-cu13 depends on), or set RMMC_RMM_INCLUDE" % root)
    out.append(root)
    if os.path.isdir(os.path.join(root, "rapids")):
        out.append(os.path.join(root, "rapids"))  # CCCL (cuda/memory_resource)
    cuda = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            cuda.append(os.path.join(os.environ[var], "include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        cuda.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
    cuda.append("/usr/local/cuda/include")
    cuda += [os.path.join(p, "nvidia", "cu13", "include") for p in sys.path if p]
    for c in cuda:
        if os.path.exists(os.path.join(c, "cuda_runtime_api.h")):
            out.append(c)
            return out
    raise FileNotFoundError("the CUDA toolkit's headers (cuda_runtime_api.h) were not found in "
                            "%s: install the CUDA toolkit or set CUDA_PATH" % ", ".join(cuda))


def _librmm_path():
    try:
        import librmm
        p = os.path.join(os.path.dirname(librmm.__file__), "lib64", "librmm.so")
        if os.path.exists(p):
            return p
    except ImportError:
        pass
    return None


def build_bridge(verbose: bool = False) -> ctypes.CDLL:
    """Compiles (or finds in the cache) the C++ layer for the installed RMM
    and loads it. Raises ImportError without RMM, FileNotFoundError without
    headers or a compiler, RuntimeError when the compiler fails."""
    global _bridge
    with _lock:
        if _bridge is not None:
            return _bridge
        rmm = _rmm()
        lib()  # librmmc first: the bridge binds to the same copy
        src = os.path.join(_HERE, "_rmm_bridge.cpp")
        incs = _include_dirs(rmm)
        hpp = os.path.join(incs[0], "rmmc", "rmm.hpp")
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if cxx is None:
            raise FileNotFoundError("rmmc.rmm compiles its C++ layer on first use and found no "
                                    "C++ compiler (set CXX)")
        key = hashlib.sha256()
        for path in (src, hpp, library_path()):
            with open(path, "rb") as f:
                key.update(f.read())
        key.update(("%s|%s|%s" % (rmm.__version__, cxx, incs)).encode())
        cache = os.environ.get("RMMC_RMM_BUILD_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rmmc",
            "rmm_bridge")
        out = os.path.join(cache, "rmmc_rmm_bridge-%s-%s.so" % (rmm.__version__,
                                                               key.hexdigest()[:16]))
        if not os.path.exists(out):
            os.makedirs(cache, exist_ok=True)
            librmm = _librmm_path()
            libdir = os.path.dirname(library_path())
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
            os.close(fd)
            cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-Wall",
                   "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
            # A compiler that links libstdc++ statically (the GPU machine's
            # /opt/gcc) would export a second copy's symbols: kept local
            # (as rmmc.torch does for its backend).
            cmd += ["-isystem" + d for d in incs[1:]] + ["-I" + incs[0], src, "-o", tmp,
                                                          library_path(), "-Wl,-rpath," + libdir,
                                                          "-Wl,--exclude-libs,ALL"]
            if librmm:
                cmd += [librmm, "-Wl,-rpath," + os.path.dirname(librmm)]
            else:
                cmd += ["-lrmm"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if verbose or os.environ.get("RMMC_RMM_VERBOSE") == "1":
                sys.stderr.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
            if r.returncode != 0:
                os.unlink(tmp)
                raise RuntimeError("rmmc.rmm: compiling the C++ layer against RMM %s failed:\n%s"
                                   % (rmm.__version__, (r.stderr or r.stdout)[-4000:]))
            os.replace(tmp, out)  # atomic: Dask workers may build at once
        dll = ctypes.CDLL(out)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for name, res, args in (
                ("rmmc_rmm_bridge_error", ctypes.c_char_p, []),
                ("rmmc_rmm_bridge_rmm_version", ctypes.c_char_p, []),
                ("rmmc_rmm_field_layout", None, [ctypes.POINTER(sz), ctypes.POINTER(sz)]),
                ("rmmc_rmm_resource_new", vp, [vp]),
                ("rmmc_rmm_resource_delete", None, [vp]),
                ("rmmc_rmm_bind", ctypes.c_int, [vp, vp]),
                ("rmmc_rmm_unbind", None, [vp]),
                ("rmmc_rmm_field_has_value", ctypes.c_int, [vp]),
                ("rmmc_rmm_field_is", ctypes.c_int, [vp, vp]),
                ("rmmc_rmm_upstream_create", ctypes.c_int,
                 [vp, ctypes.c_int, ctypes.c_int, _ON_DESTROY, vp, ctypes.POINTER(vp)]),
                ("rmmc_rmm_bench_pairs", ctypes.c_double, [vp, vp, sz, ctypes.c_long, vp])):
            fn = getattr(dll, name)
            fn.restype = res
            fn.argtypes = args
        setattr(dll, "path", out)
        _check_layout(dll, rmm)
        _bridge = dll
        return dll


def _field_offset(dll, rmm):
    """Where DeviceMemoryResource keeps c_ref in its objects: after the
    object header and Cython's method table, checked against the class's
    size so a changed RMM is refused rather than written into."""
    size, align = ctypes.c_size_t(), ctypes.c_size_t()
    dll.rmmc_rmm_field_layout(ctypes.byref(size), ctypes.byref(align))
    base = rmm.mr.DeviceMemoryResource
    ptr = ctypes.sizeof(ctypes.c_void_p)
    offset = object.__basicsize__ + ptr
    offset = (offset + align.value - 1) // align.value * align.value
    whole = max(align.value, ptr)
    expect = (offset + size.value + whole - 1) // whole * whole
    return offset, expect, base


def _check_layout(dll, rmm):
    offset, expect, base = _field_offset(dll, rmm)
    if "__pyx_vtable__" not in base.__dict__ or base.__basicsize__ != expect:
        raise NotSupportedError(
            -5, "rmmc.rmm: RMM %s keeps its resources in a way this rmmc does not know "
            "(rmm.mr.DeviceMemoryResource is %d bytes, %d expected): rmmc supports RMM 25.12 "
            "and later" % (rmm.__version__, base.__basicsize__, expect))
    setattr(dll, "field_offset", offset)


def _field(dll, obj):
    return id(obj) + dll.field_offset


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
            if cxx and _bridge is not None:
                _bridge.rmmc_rmm_unbind(_field(_bridge, self))
                _bridge.rmmc_rmm_resource_delete(cxx)

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


def _upstream_handle(rmm_mr, kind, device):
    rmm = _rmm()
    dll = build_bridge()
    if not isinstance(rmm_mr, rmm.mr.DeviceMemoryResource):
        raise TypeError("rmmc.rmm: an RMM resource object (rmm.mr.*MemoryResource), not %s"
                        % type(rmm_mr).__name__)
    kinds = {"device": 1, "host": 2, "pinned": 3, "managed": 4}
    if kind not in kinds:
        raise InvalidArgumentError(-1, "kind is one of %s, not %r" % (", ".join(kinds), kind))
    dev = -1 if kind == "host" else _device(device)
    key = id(rmm_mr)
    while key in _UPSTREAMS:  # the same object under two rmmc resources
        key += 1 << 48
    _UPSTREAMS[key] = rmm_mr
    h = ctypes.c_void_p()
    st = dll.rmmc_rmm_upstream_create(_field(dll, rmm_mr), kinds[kind], dev, _drop_upstream, key,
                                      ctypes.byref(h))
    if st != 0:
        _UPSTREAMS.pop(key, None)
        check(st, "rmmc.rmm.over")
    return h.value


def _kind_of(rmm_mr, kind):
    if kind is not None:
        return kind
    name = type(rmm_mr).__name__
    return {"ManagedMemoryResource": "managed", "PinnedHostMemoryResource": "pinned",
            "SystemMemoryResource": "host"}.get(name, "device")


def over(rmm_mr: Any, spec: Optional[str] = None, kind: Optional[str] = None,
         device: Optional[int] = None) -> Resource:
    """An rmmc stack over an RMM resource object: `spec` names rmmc's layers
    above it ("statistics > pool"; None: the RMM resource alone, as the
    layer "rmm"). `kind`: what memory it hands out ("device", "managed",
    "pinned", "host"; default from its class). The rmmc stack keeps the RMM
    object alive. Returns an rmmc.Resource."""
    h = _upstream_handle(rmm_mr, _kind_of(rmm_mr, kind), device)
    try:
        if spec is None:
            return Resource._adopt(h, "rmm")
        from ._capi import clib
        top = ctypes.c_void_p()
        check(clib().rmmc_stack_create_over(spec.encode() if isinstance(spec, str) else spec,
                                            h, ctypes.byref(top)), "rmmc.rmm.over(%r)" % (spec,))
        try:
            return Resource._adopt(top.value, "%s > rmm" % spec)
        finally:
            lib().rmmc_resource_release(top.value)
    finally:
        lib().rmmc_resource_release(h)


def from_rmm(rmm_mr: Any, kind: Optional[str] = None, device: Optional[int] = None) -> Any:
    """The RMM resource object as an rmmc.mr object (layer "rmm"), for rmmc's
    adaptors: rmmc.mr.StatisticsResourceAdaptor(rmmc.rmm.from_rmm(rmm_mr))."""
    from .mr import DeviceMemoryResource as RmmcMr
    return RmmcMr._wrap(over(rmm_mr, None, kind, device))


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
