# SPDX-License-Identifier: Apache-2.0
"""rmmc.DeviceBuffer: RMM's rmm.DeviceBuffer over rmmc_buffer_t.

An untyped, stream-ordered block of memory from a resource (the current
device's, or the rmmc.mr object given as ``mr``) that frameworks can take
without a copy: ``__cuda_array_interface__`` (CuPy, Numba, PyTorch) and
DLPack (``__dlpack__``/``__dlpack_device__``: torch.from_dlpack,
cupy.from_dlpack, numpy.from_dlpack for host memory), both as a 1-D array
of uint8. Memory a host stack hands out (rmmc.mr.HostMemoryResource) is
exported as CPU memory (DLPack kDLCPU, ``__array_interface__``) and has no
``__cuda_array_interface__``.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

from . import InvalidArgumentError, _args
from ._capi import Buffer, clib
from ._lib import check
from ._stream import DEFAULT_STREAM, Stream

__all__ = ["DeviceBuffer", "to_device"]

# DLPack (dlpack.h, v0.8 ABI: the unversioned DLManagedTensor).
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DL_DELETER)]

_CAPSULE_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.PyDLL(None)  # its own function objects: pythonapi's are shared
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# Exported tensors alive, by the address of their DLManagedTensor: each
# keeps its buffer (and so the memory) until the consumer calls the deleter.
_EXPORTS: dict = {}


@DL_DELETER
def _dl_deleter(managed):
    _EXPORTS.pop(ctypes.addressof(managed.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # Never consumed (still named "dltensor"): the producer deletes it.
    if _api.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        _EXPORTS.pop(_api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME), None)


def _mr_handle(mr, what):
    """The resource to allocate from: mr's, or the current device's (with
    the Python answer when there is no GPU and none was set)."""
    if mr is None:
        from . import _device, _device_resource
        return _device_resource(_device(None), what).value
    from .mr import DeviceMemoryResource
    if not isinstance(mr, DeviceMemoryResource):
        raise TypeError("mr must be a memory resource object (rmmc.mr), not %s"
                        % type(mr).__name__)
    return mr.handle


class _MemLocation(ctypes.Structure):
    """cudaMemLocation (CUDA 12.2+): type 1 is a device."""
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _prefetch(ptr, nbytes, device, stream):
    """cudaMemPrefetchAsync of the CUDA runtime librmmc loaded (13's form
    takes a cudaMemLocation, 12's a device number)."""
    from ._lib import lib, RmmcError
    maps = open("/proc/self/maps").read()
    cudart = sorted({l.split()[-1] for l in maps.splitlines() if "libcudart.so" in l})
    if not cudart:
        lib()
        maps = open("/proc/self/maps").read()
        cudart = sorted({l.split()[-1] for l in maps.splitlines() if "libcudart.so" in l})
    rt = ctypes.CDLL(cudart[0])
    fn = rt.cudaMemPrefetchAsync
    if cudart[0].rsplit(".so.", 1)[-1].split(".")[0] >= "13":
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _MemLocation, ctypes.c_uint,
                       ctypes.c_void_p]
        err = fn(ptr, nbytes, _MemLocation(1, device), 0, stream or None)
    else:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        err = fn(ptr, nbytes, device, stream or None)
    if err:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        rt.cudaGetLastError()
        raise RmmcError(-3, "cudaMemPrefetchAsync: %s" % rt.cudaGetErrorString(err).decode(),
                        "prefetch")


def _nbytes(size):
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgumentError(-1, "size must be an int >= 0, not %r" % (size,))
    return size


class DeviceBuffer:
    """``DeviceBuffer(*, ptr=0, size=0, stream=DEFAULT_STREAM, mr=None)``
    (RMM's, keywords only): `size` uninitialized bytes from `mr` (None: the
    current device's resource), ordered on `stream` (an rmmc.Stream, any
    stream object or a cudaStream_t as an int). ``DeviceBuffer(ptr=host_data,
    size=n)`` copies n bytes from a host address (an int, as RMM) or, as an
    rmmc addition, a host object with the buffer protocol (bytes,
    bytearray, memoryview, a NumPy array; size 0: all of it)."""

    def __init__(self, *, ptr: Any = 0, size: int = 0, stream: Any = DEFAULT_STREAM,
                 mr: Any = None) -> None:
        self._b = Buffer(None, 0, 0, None, None, -1)
        h = _mr_handle(mr, "DeviceBuffer")
        self._mr = mr
        s = _args.stream(stream)
        if ptr is None or (isinstance(ptr, int) and not isinstance(ptr, bool) and ptr == 0):
            check(clib().rmmc_buffer_create(ctypes.byref(self._b), _nbytes(size), s, h),
                  "DeviceBuffer(size=%r)" % (size,))
            return
        if isinstance(ptr, int) and not isinstance(ptr, bool):
            src = _args.pointer(ptr, "ptr")
        else:
            view = memoryview(ptr).cast("B")
            if size == 0:
                size = len(view)
            elif _nbytes(size) > len(view):
                raise InvalidArgumentError(-1, "DeviceBuffer(ptr=...): size %d is more than the "
                                           "%d bytes given" % (size, len(view)))
            keep = (ctypes.c_char * len(view)).from_buffer_copy(view) if len(view) else None
            src = ctypes.addressof(keep) if keep is not None else None
        check(clib().rmmc_buffer_create_from(ctypes.byref(self._b), src, _nbytes(size), s, h),
              "DeviceBuffer(ptr=..., size=%r)" % (size,))

    # --- what RMM's DeviceBuffer offers -------------------------------------------------
    @property
    def ptr(self) -> int:
        """The address of the memory (0 for an empty buffer)."""
        return self._b.data or 0

    @property
    def size(self) -> int:
        return self._b.size

    nbytes = size

    def __len__(self):
        return self._b.size

    def capacity(self):
        return self._b.capacity

    @property
    def stream(self):
        """The buffer's stream (the one its memory is ordered on), an rmmc.Stream."""
        return Stream._from_handle(self._b.stream or 0)

    @property
    def mr(self):
        """The memory resource object the memory came from: the `mr` given,
        else the stack the buffer holds (the device's current one when it
        was made)."""
        if self._mr is not None:
            return self._mr
        from . import Resource
        from .mr import DeviceMemoryResource
        if not self._b.resource:
            return None
        return DeviceMemoryResource._wrap(Resource._adopt(self._b.resource, "<buffer's stack>"))

    @property
    def memory_kind(self):
        """"device", "host", "pinned" or "managed"."""
        if not self._b.resource:
            return "host"
        return clib().rmmc_memory_kind_name(
            clib().rmmc_resource_memory_kind(self._b.resource)).decode()

    @property
    def device(self):
        """The buffer's device, -1 for host memory."""
        return self._b.device

    def _on(self, stream):
        """Orders the buffer on `stream` from now on, when one is given."""
        if stream is not None and stream is not DEFAULT_STREAM:
            s = _args.stream(stream)
            if (s or None) != (self._b.stream or None):
                check(clib().rmmc_buffer_set_stream(ctypes.byref(self._b), s), "stream")

    def resize(self, new_size: int, stream: Any = DEFAULT_STREAM) -> None:
        """Sets the size (reallocating above the capacity, keeping the
        contents), ordered on `stream`."""
        self._on(stream)
        check(clib().rmmc_buffer_resize(ctypes.byref(self._b), _nbytes(new_size)), "resize")

    def reserve(self, new_capacity: int, stream: Any = DEFAULT_STREAM) -> None:
        self._on(stream)
        check(clib().rmmc_buffer_reserve(ctypes.byref(self._b), _nbytes(new_capacity)), "reserve")

    def copy_to_host(self, ary: Any = None, stream: Any = DEFAULT_STREAM) -> Any:
        """The contents copied to the host: into `ary` (a writable object
        with the buffer protocol, at least size bytes) if given, else a new
        NumPy array of uint8 (RMM's), or a bytearray where NumPy is not
        installed. Waits for the copy."""
        self._on(stream)
        n = self.size
        if ary is None:
            try:
                import numpy
                ary = numpy.empty(n, dtype=numpy.uint8)
            except ImportError:
                ary = bytearray(n)
        view = memoryview(ary).cast("B")
        if view.readonly or len(view) < n:
            raise InvalidArgumentError(-1, "copy_to_host needs a writable buffer of at least "
                                       "%d bytes" % n)
        if n:
            dst = (ctypes.c_char * len(view)).from_buffer(view)
            check(clib().rmmc_buffer_copy_to_host(ctypes.byref(self._b), 0,
                                                  ctypes.addressof(dst), n), "copy_to_host")
        return ary

    def copy_from_host(self, ary: Any, stream: Any = DEFAULT_STREAM) -> None:
        """Copies the bytes of a host object with the buffer protocol into
        the start of the buffer (at most size bytes). Waits for the copy."""
        self._on(stream)
        view = memoryview(ary).cast("B")
        if len(view) > self.size:
            raise InvalidArgumentError(-1, "copy_from_host: %d bytes do not fit a buffer of %d"
                                       % (len(view), self.size))
        if len(view):
            src = (ctypes.c_char * len(view)).from_buffer_copy(view)
            check(clib().rmmc_buffer_copy_from_host(ctypes.byref(self._b), 0,
                                                    ctypes.addressof(src), len(view)),
                  "copy_from_host")

    def copy_from_device(self, cuda_ary: Any, stream: Any = DEFAULT_STREAM) -> None:
        """Copies a device array (anything with __cuda_array_interface__, 1-D
        and contiguous: a DeviceBuffer, CuPy, Numba, PyTorch) into the start
        of the buffer, device to device, ordered on `stream` (the buffer's
        stream from then on), as RMM copies it; a host-memory buffer copies
        from another host-memory DeviceBuffer."""
        self._on(stream)
        if isinstance(cuda_ary, DeviceBuffer) and cuda_ary.memory_kind == "host":
            src, n = cuda_ary.ptr, cuda_ary.size
        else:
            cai = getattr(cuda_ary, "__cuda_array_interface__", None)
            if cai is None:
                raise ValueError("Expected object to support `__cuda_array_interface__` protocol")
            shape, strides = cai["shape"], cai.get("strides")
            itemsize = int(cai["typestr"][2:]) if cai["typestr"][2:].isdigit() else 1
            if len(shape) > 1:
                raise ValueError("Only 1-D contiguous arrays are supported, got %d-D array"
                                 % len(shape))
            if strides is not None and strides[0] != itemsize:
                raise ValueError("Only 1-D contiguous arrays are supported, got a "
                                 "non-contiguous array")
            src, n = cai["data"][0], (shape[0] if shape else 1) * itemsize
            if self.memory_kind == "host":
                raise InvalidArgumentError(-1, "copy_from_device: this buffer is host memory "
                                           "(a host stack): it copies from host memory")
        if n > self.size:
            raise ValueError("Argument `hb` is too large. Need space for %i bytes." % n)
        if n:
            check(clib().rmmc_buffer_copy_from_host_async(ctypes.byref(self._b), 0, src, n),
                  "copy_from_device")  # cudaMemcpyDefault: device to device

    def tobytes(self, stream: Any = DEFAULT_STREAM) -> bytes:
        return bytes(memoryview(self.copy_to_host(stream=stream)).cast("B"))

    def __bytes__(self):
        return self.tobytes()

    def __sizeof__(self):
        return self.size

    def copy(self) -> "DeviceBuffer":
        """A new buffer with a copy of the contents, from the same resource,
        on the same stream (device to device)."""
        out = DeviceBuffer.__new__(DeviceBuffer)
        out._b = Buffer(None, 0, 0, None, None, -1)
        out._mr = self._mr
        check(clib().rmmc_buffer_create_copy(ctypes.byref(out._b), ctypes.byref(self._b),
                                             self._b.stream, self._b.resource), "copy")
        return out

    __copy__ = copy

    def __reduce__(self):
        # RMM's: pickled as its bytes, rebuilt by to_device() from the
        # current device's resource where it is unpickled (never the raw
        # rmmc_buffer_t, which would free the memory twice).
        return to_device, (self.tobytes(),)

    def prefetch(self, device: Optional[int] = None, stream: Any = None) -> None:
        """Moves managed memory to `device` (default: the buffer's) ahead of
        use, ordered on `stream` (default: the buffer's): RMM's prefetch. For
        memory that is not managed it does nothing, as RMM's."""
        if self.memory_kind != "managed" or not self.size:
            return
        from . import _device
        dev = self.device if device is None else _device(device)
        s = self._b.stream if stream is None else _args.stream(stream)
        _prefetch(self.ptr, self.size, dev, s)

    @staticmethod
    def to_device(b: Any, stream: Any = DEFAULT_STREAM, mr: Any = None) -> "DeviceBuffer":
        """A new DeviceBuffer holding a copy of host bytes `b`."""
        return DeviceBuffer(ptr=b, size=len(memoryview(b).cast("B")), stream=stream, mr=mr)

    # --- zero-copy export ---------------------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        if self.memory_kind == "host":
            raise AttributeError("host memory has no __cuda_array_interface__ (it has "
                                 "__array_interface__ and DLPack)")
        # The copies wait for the buffer's stream; work on a stream of the
        # caller's (allocate, resize) is for the consumer to wait on.
        return {"shape": (self.size,), "strides": None, "typestr": "|u1",
                "data": (self.ptr, False), "version": 3, "stream": self._b.stream or None}

    @property
    def __array_interface__(self):
        if self.memory_kind != "host":
            raise AttributeError("device memory has no __array_interface__ (use "
                                 "__cuda_array_interface__ or DLPack)")
        return {"shape": (self.size,), "strides": None, "typestr": "|u1",
                "data": (self.ptr, False), "version": 3}

    def __dlpack_device__(self):
        kind = self.memory_kind
        dev = max(self.device, 0)
        if kind == "host":
            return (KDL_CPU, 0)
        return ({"device": KDL_CUDA, "managed": KDL_CUDA_MANAGED,
                 "pinned": KDL_CUDA_HOST}[kind], dev if kind != "pinned" else 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the buffer as 1-D uint8 (zero-copy; the
        buffer stays alive until the consumer deletes the tensor). The
        buffer's work is ordered on its own stream and every copy method
        waits, so `stream` needs no wait here."""
        if copy:
            raise BufferError("DeviceBuffer.__dlpack__ exports without a copy (copy=True "
                              "is not supported)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("DeviceBuffer lives on %r, not %r"
                              % (self.__dlpack_device__(), tuple(dl_device)))
        m = DLManagedTensor()
        shape = (ctypes.c_int64 * 1)(self.size)
        t = m.dl_tensor
        t.data = self.ptr or None
        t.device = DLDevice(*self.__dlpack_device__())
        t.ndim = 1
        t.dtype = DLDataType(1, 8, 1)  # kDLUInt, 8 bits, 1 lane
        t.shape = shape
        t.strides = None
        t.byte_offset = 0
        m.deleter = _dl_deleter
        addr = ctypes.addressof(m)
        _EXPORTS[addr] = (m, shape, self)
        return _api.PyCapsule_New(addr, _CAPSULE_NAME, _capsule_destructor)

    def close(self):
        """Gives the memory back now (idempotent); the buffer is then empty.
        BufferError while a DLPack export of it is alive."""
        if any(e[2] is self for e in list(_EXPORTS.values())):
            raise BufferError("DeviceBuffer.close: a DLPack tensor still uses this memory")
        if self._b.resource:
            check(clib().rmmc_buffer_destroy(ctypes.byref(self._b)), "DeviceBuffer.close")

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        return "<rmmc.DeviceBuffer size=%d ptr=0x%x %s memory, device %d>" % (
            self.size, self.ptr, self.memory_kind, self.device)


def to_device(b: Any, stream: Any = DEFAULT_STREAM, mr: Any = None) -> DeviceBuffer:
    """rmm.to_device: a DeviceBuffer holding a copy of host bytes `b`."""
    return DeviceBuffer.to_device(b, stream, mr)
