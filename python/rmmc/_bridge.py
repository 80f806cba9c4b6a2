# SPDX-License-Identifier: Apache-2.0
"""The RMM bridge's machinery, below rmmc.mr and rmmc.rmm: compiling and
loading the C++ layer (rmmc/_rmm_bridge.cpp, include/rmmc/rmm.hpp) against
the installed librmm, finding the C++ resource inside RMM's Python objects,
and over(): an rmmc stack over an RMM resource object. rmmc.rmm (use,
reinitialize, from_rmm, RmmcMemoryResource) is built on it; rmmc.mr puts
RMM's objects under its layers through it."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Optional

from . import Resource, _device
from ._lib import (ON_DESTROY, InvalidArgumentError, NotSupportedError, check, declare, lib,
                   library_path)

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_bridge: Optional[ctypes.CDLL] = None
# RMM objects that rmmc resources (from over/from_rmm) refer to, by key:
# dropped when the rmmc resource is destroyed.
_UPSTREAMS: dict = {}


@ON_DESTROY
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
        dll = declare(ctypes.CDLL(out), "rmm_bridge")
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
        top = ctypes.c_void_p()
        check(lib().rmmc_stack_create_over(spec.encode() if isinstance(spec, str) else spec,
                                            h, ctypes.byref(top)), "rmmc.rmm.over(%r)" % (spec,))
        try:
            return Resource._adopt(top.value, "%s > rmm" % spec)
        finally:
            lib().rmmc_resource_release(top.value)
    finally:
        lib().rmmc_resource_release(h)


def loaded() -> Optional[ctypes.CDLL]:
    """The bridge if build_bridge() has loaded it, else None."""
    return _bridge
