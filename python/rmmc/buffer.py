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

Exports and the memory under them. A DLPack tensor keeps the buffer and
its memory until the consumer deletes it: meanwhile close() and a resize()
or reserve() that would move the memory raise BufferError (as a bytearray
refuses to resize under a memoryview). The array interfaces have no such
end: their consumers (CuPy, Numba, NumPy) keep the buffer object alive,
not the memory, so once one was handed out, memory that close(), resize()
or reserve() replaces stays allocated until the buffer itself is
collected: a consumer never reads freed memory, though after a move it
sees the old contents.

Copies and threads. copy.copy()/copy.deepcopy() (and copy()) copy the
contents into new memory from the same resource; pickling copies them to
the host and back into memory from the current device's resource (as
RMM's). A buffer is safe to share between threads: its calls are
serialized.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

from . import InvalidArgumentError, _args
from ._lib import Buffer, check, lib
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


def _resource(mr, what):
    """The rmmc.Resource to allocate from: mr's, or None for the current
    device's (taken with a reference of its own by the caller)."""
    if mr is None:
        return None
    from .mr import DeviceMemoryResource
    if not isinstance(mr, DeviceMemoryResource):
        raise TypeError("mr must be a memory resource object (rmmc.mr), not %s"
                        % type(mr).__name__)
    return mr.resource


class _Using:
    """``with _Using(resource, what) as h:``: the handle of `resource`, or
    of the current device's registry entry with a reference held for the
    block (retained atomically with sets on other threads)."""

    def __init__(self, resource, what):
        self._resource = resource
        self._what = what
        self._h = None

    def __enter__(self):
        if self._resource is not None:
            return self._resource._use().__enter__()
        from . import _device, _device_resource
        self._h = _device_resource(_device(None), self._what, retain=True).value
        return self._h

    def __exit__(self, *exc):
        if self._resource is not None:
            return self._resource._use().__exit__(*exc)
        lib().rmmc_resource_release(self._h)
        return False


def _new_struct():
    return Buffer(None, 0, 0, None, None, -1)


class _MemLocation(ctypes.Structure):
    """cudaMemLocation (CUDA 12.2+): type 1 is a device."""
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _prefetch(ptr, nbytes, device, stream):
    """cudaMemPrefetchAsync of the CUDA runtime librmmc loaded (13's form
    takes a cudaMemLocation, 12's a device number)."""
    from ._lib import RmmcError
    lib()
    maps = open("/proc/self/maps").read()
    cudart = sorted({l.split()[-1] for l in maps.splitlines() if "libcudart.so" in l})
    rt = ctypes.CDLL(cudart[0])
    fn = rt.cudaMemPrefetchAsync
    if int(cudart[0].rsplit(".so.", 1)[-1].split(".")[0]) >= 13:
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


class DeviceBuffer:
    """``DeviceBuffer(*, ptr=0, size=0, stream=DEFAULT_STREAM, mr=None)``
    (RMM's, keywords only): `size` uninitialized bytes from `mr` (None: the
    current device's resource), ordered on `stream` (an rmmc.Stream, any
    stream object or a cudaStream_t as an int). ``DeviceBuffer(ptr=...,
    size=n)`` copies n bytes from a host address (an int; 0 allocates
    without copying, as RMM) or, as an rmmc addition, a host object with
    the buffer protocol (bytes, bytearray, memoryview, a NumPy array; size
    0: all of it)."""

    _not_a_stream = True  # has .ptr, which is no stream

    def __init__(self, *, ptr: Any = 0, size: int = 0, stream: Any = DEFAULT_STREAM,
                 mr: Any = None) -> None:
        self._b = _new_struct()
        self._lock = threading.RLock()
        self._retired: list = []  # memory an array interface may still point to
        self._shared = False  # an array interface was handed out for self._b's memory
        resource = _resource(mr, "DeviceBuffer")
        stream = _args.stream(stream)
        self._mr = mr
        src = None
        if ptr is not None and (isinstance(ptr, int) or hasattr(ptr, "__index__")):
            src = _args.pointer(ptr, "ptr")
            size = _args.size(size, "size")
        elif ptr is not None:
            view = memoryview(ptr).cast("B")
            if isinstance(size, int) and not isinstance(size, bool) and size == 0:
                size = len(view)
            elif _args.size(size, "size") > len(view):
                raise InvalidArgumentError(-1, "DeviceBuffer(ptr=...): size %d is more than the "
                                           "%d bytes given" % (size, len(view)))
            keep = (ctypes.c_char * len(view)).from_buffer_copy(view) if len(view) else None
            src = ctypes.addressof(keep) if keep is not None else None
        else:
            size = _args.size(size, "size")
        with _Using(resource, "DeviceBuffer") as h:
            if src is None:
                check(lib().rmmc_buffer_create(ctypes.byref(self._b), size, stream, h),
                      "DeviceBuffer(size=%d)" % size)
            else:
                check(lib().rmmc_buffer_create_from(ctypes.byref(self._b), src, size, stream, h),
                      "DeviceBuffer(ptr=..., size=%d)" % size)

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
        with self._lock:
            if not self._b.resource:
                return None
            return DeviceMemoryResource._wrap(Resource._adopt(self._b.resource,
                                                              "<buffer's stack>"))

    def _on(self, stream):
        """Orders the buffer on `stream` from now on, when one is given."""
        if stream is not None and stream is not DEFAULT_STREAM:
            s = _args.stream(stream)
            with self._lock:
                if (s or None) != (self._b.stream or None) and self._b.resource:
                    check(lib().rmmc_buffer_set_stream(ctypes.byref(self._b), s), "stream")

    @property
    def memory_kind(self):
        """"device", "host", "pinned" or "managed"."""
        with self._lock:
            if not self._b.resource:
                return "host"
            return lib().rmmc_memory_kind_name(
                lib().rmmc_resource_memory_kind(self._b.resource)).decode()

    @property
    def device(self):
        """The buffer's device, -1 for host memory."""
        return self._b.device

    def _dlpack_alive(self):
        return any(e[2] is self for e in list(_EXPORTS.values()))

    def _before_move(self, what, needed):
        """Called (lock held) before a call that would give the memory
        back: BufferError while a DLPack tensor uses it; True when an array
        interface was handed out, so the memory is to be retired instead."""
        if not needed:
            return False
        if self._dlpack_alive():
            raise BufferError("DeviceBuffer.%s: a DLPack tensor still uses this memory (its "
                              "consumer has not deleted it); %s would free it" % (what, what))
        return self._shared

    def _grow(self, fn, n, what):
        """resize/reserve to `n` bytes: in place when the capacity holds,
        else moving the memory (retired while an array interface may point
        to it)."""
        with self._lock:
            if self._before_move(what, n > self._b.capacity and self._b.resource):
                new = _new_struct()
                check(lib().rmmc_buffer_create_copy(ctypes.byref(new), ctypes.byref(self._b),
                                                     self._b.stream, self._b.resource), what)
                st = fn(ctypes.byref(new), n)
                if st != 0:
                    lib().rmmc_buffer_destroy(ctypes.byref(new))
                    check(st, what)
                self._retired.append(self._b)
                self._b, self._shared = new, False
                return
            check(fn(ctypes.byref(self._b), n), what)

    def resize(self, new_size: int, stream: Any = DEFAULT_STREAM) -> None:
        """Sets the size (reallocating above the capacity, keeping the
        contents), ordered on `stream`. BufferError when that would move
        memory a DLPack tensor still uses."""
        n = _args.size(new_size, "new_size")
        self._on(stream)
        self._grow(lib().rmmc_buffer_resize, n, "resize")

    def reserve(self, new_capacity: int, stream: Any = DEFAULT_STREAM) -> None:
        """Makes the capacity at least new_capacity, keeping the contents.
        BufferError when that would move memory a DLPack tensor still uses."""
        n = _args.size(new_capacity, "new_capacity")
        self._on(stream)
        self._grow(lib().rmmc_buffer_reserve, n, "reserve")

    def copy(self) -> "DeviceBuffer":
        """A new buffer with a copy of the contents, from the same resource,
        on the same stream (RMM's DeviceBuffer.copy())."""
        other = DeviceBuffer.__new__(DeviceBuffer)
        other._b = _new_struct()
        other._lock = threading.RLock()
        other._retired = []
        other._shared = False
        other._mr = self._mr
        with self._lock:
            if not self._b.resource:
                raise InvalidArgumentError(-1, "DeviceBuffer.copy: the buffer is closed")
            check(lib().rmmc_buffer_create_copy(ctypes.byref(other._b), ctypes.byref(self._b),
                                                 self._b.stream, self._b.resource), "copy")
        return other

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        # As RMM: the bytes, into memory from the current device's resource.
        return (to_device, (bytes(self.copy_to_host()),))

    def copy_to_host(self, ary: Any = None, stream: Any = DEFAULT_STREAM) -> Any:
        """The contents copied to the host: into `ary` (a writable object
        with the buffer protocol, at least size bytes) if given, else a new
        NumPy array of uint8 (RMM's), or a bytearray where NumPy is not
        installed. Waits for the copy."""
        self._on(stream)
        with self._lock:
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
                check(lib().rmmc_buffer_copy_to_host(ctypes.byref(self._b), 0,
                                                      ctypes.addressof(dst), n), "copy_to_host")
            return ary

    def copy_from_host(self, ary: Any, stream: Any = DEFAULT_STREAM) -> None:
        """Copies the bytes of a host object with the buffer protocol into
        the start of the buffer (at most size bytes). Waits for the copy."""
        self._on(stream)
        view = memoryview(ary).cast("B")
        src = (ctypes.c_char * len(view)).from_buffer_copy(view) if len(view) else None
        with self._lock:
            if len(view) > self.size:
                raise InvalidArgumentError(-1, "copy_from_host: %d bytes do not fit a buffer of "
                                           "%d" % (len(view), self.size))
            if src is not None:
                check(lib().rmmc_buffer_copy_from_host(ctypes.byref(self._b), 0,
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
            keep = cuda_ary
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
            keep = cuda_ary
            if self.memory_kind == "host":
                raise InvalidArgumentError(-1, "copy_from_device: this buffer is host memory "
                                           "(a host stack): it copies from host memory")
        with self._lock:
            if n > self.size:
                raise ValueError("Argument `hb` is too large. Need space for %i bytes." % n)
            if n:  # cudaMemcpyDefault: device to device, on the buffer's stream
                check(lib().rmmc_buffer_copy_from_host_async(ctypes.byref(self._b), 0, src, n),
                      "copy_from_device")
        del keep

    def tobytes(self, stream: Any = DEFAULT_STREAM) -> bytes:
        return bytes(memoryview(self.copy_to_host(stream=stream)).cast("B"))

    def __bytes__(self) -> bytes:
        return self.tobytes()

    def __sizeof__(self) -> int:
        return self.size

    def prefetch(self, device: Optional[int] = None, stream: Any = None) -> None:
        """Moves managed memory to `device` (default: the buffer's) ahead of
        use, ordered on `stream` (default: the buffer's): RMM's prefetch. For
        memory that is not managed it does nothing, as RMM's."""
        if self.memory_kind != "managed" or not self.size:
            return
        from . import _device
        dev = self.device if device is None else _device(device)
        s = self._b.stream if stream is None else _args.stream(stream)
        with self._lock:
            _prefetch(self.ptr, self.size, dev, s)

    @staticmethod
    def to_device(b: Any, stream: Any = DEFAULT_STREAM, mr: Any = None) -> "DeviceBuffer":
        """A new DeviceBuffer holding a copy of host bytes `b`."""
        if isinstance(b, int) or hasattr(b, "__index__"):
            raise TypeError("to_device takes host bytes (an object with the buffer protocol), "
                            "not %s" % type(b).__name__)
        return DeviceBuffer(ptr=b, size=len(memoryview(b).cast("B")), stream=stream, mr=mr)

    # --- zero-copy export ---------------------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        if self.memory_kind == "host":
            raise AttributeError("host memory has no __cuda_array_interface__ (it has "
                                 "__array_interface__ and DLPack)")
        # The copies wait for the buffer's stream; work on a stream of the
        # caller's (allocate, resize) is for the consumer to wait on.
        with self._lock:
            self._shared = True
            return {"shape": (self.size,), "strides": None, "typestr": "|u1",
                    "data": (self.ptr, False), "version": 3,
                    "stream": self._b.stream or None}

    @property
    def __array_interface__(self):
        if self.memory_kind != "host":
            raise AttributeError("device memory has no __array_interface__ (use "
                                 "__cuda_array_interface__ or DLPack)")
        with self._lock:
            self._shared = True
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
        with self._lock:
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
        BufferError while a DLPack export of it is alive. After an array
        interface was handed out, the memory stays allocated until the
        buffer is collected (its consumers hold the buffer, not the memory)."""
        with self._lock:
            if not self._b.resource:
                return
            if self._before_move("close", True):
                old = _new_struct()
                lib().rmmc_buffer_move(ctypes.byref(old), ctypes.byref(self._b))
                self._retired.append(old)
                self._shared = False
                return
            check(lib().rmmc_buffer_destroy(ctypes.byref(self._b)), "DeviceBuffer.close")

    def __del__(self):
        # Unreachable: no DLPack export (it holds the buffer) and no array
        # interface consumer (they hold it too) is left.
        try:
            for b in [self._b] + self._retired:
                lib().rmmc_buffer_destroy(ctypes.byref(b))
        except Exception:  # interpreter shutdown, or __init__ failed early
            pass

    def __repr__(self):
        return "<rmmc.DeviceBuffer size=%d ptr=0x%x %s memory, device %d>" % (
            self.size, self.ptr, self.memory_kind, self.device)


def to_device(b: Any, stream: Any = DEFAULT_STREAM, mr: Any = None) -> DeviceBuffer:
    """rmm.to_device: a DeviceBuffer holding a copy of host bytes `b`."""
    return DeviceBuffer.to_device(b, stream, mr)
