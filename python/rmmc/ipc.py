# SPDX-License-Identifier: Apache-2.0
"""Sharing device memory between processes (include/rmmc/ipc.h).

    import rmmc.ipc
    e = rmmc.ipc.export(ptr)                  # a block of the device's stack (or resource=...)
    rmmc.ipc.send(sock, e)                    # a connected AF_UNIX socket: handle + descriptors
    e.close()                                 # this side's descriptors

    handle, fds = rmmc.ipc.recv(sock)         # in the other process
    p = rmmc.ipc.import_handle(handle, fds)   # a device pointer (int) to the same memory
    ...
    rmmc.ipc.close(p)

Chunks of cudaMalloc memory (``pool(expandable=false) > cuda``) travel as a
CUDA IPC handle; pages of an expandable pool over ``cuda(ipc=true)`` with
one file descriptor per mapping, which only a UNIX socket (send/recv here)
or another descriptor-passing channel can carry. A handle whose block was
freed, or whose exporter exited, raises StaleError on import.

PyTorch: share_tensor(t) and tensor_from(meta, handle, fds) wrap a CUDA
tensor allocated through rmmc.torch; torch.multiprocessing's own sharing
works with the native backend in both processes, and refuses the
plug-in (CUDAPluggableAllocator) in current PyTorch (docs/design.md).
"""
import ctypes
import os
import socket as _socket
import weakref

from . import _args
from ._lib import (IPC_MAX_FDS, IpcHandle, IpcInfo, IpcStats, NotSupportedError, StaleError,
                   check, lib)

__all__ = ["Export", "export", "import_handle", "close", "check_handle", "revoke", "send",
           "recv", "info", "stats", "share_tensor", "tensor_from", "StaleError",
           "NotSupportedError"]

KINDS = {1: "cuda", 2: "vm"}


def _handle(data):
    """A ctypes handle from bytes (the meaningful ones suffice)."""
    if isinstance(data, Export):
        data = data.handle
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("an rmmc IPC handle is bytes (or an Export), not %s" % type(data).__name__)
    data = bytes(data)
    if len(data) > ctypes.sizeof(IpcHandle):
        raise ValueError("an rmmc IPC handle has at most %d bytes, not %d"
                         % (ctypes.sizeof(IpcHandle), len(data)))
    h = IpcHandle()
    ctypes.memmove(h, data, len(data))
    return h


def info(handle):
    """What a handle says about itself: {kind, bytes, nfds, handle_bytes,
    exporter_pid, exporter_device, device_uuid, generation}."""
    i = IpcInfo()
    i.size = ctypes.sizeof(IpcInfo)
    check(lib().rmmc_ipc_handle_info(ctypes.byref(_handle(handle)), ctypes.byref(i)),
          "ipc handle_info")
    return {"kind": KINDS.get(i.kind, str(i.kind)), "bytes": i.bytes, "nfds": i.nfds,
            "handle_bytes": i.handle_bytes, "exporter_pid": i.exporter_pid,
            "exporter_device": i.exporter_device, "device_uuid": bytes(i.device_uuid).hex(),
            "generation": i.generation}


class Export:
    """An exported block: `handle` (bytes, only the meaningful ones) and
    `fds` (file descriptors this object owns; close() closes them: after
    sending them)."""

    def __init__(self, handle, fds):
        self.handle = handle
        self.fds = list(fds)

    @property
    def info(self):
        return info(self.handle)

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class _Resource:
    """``with _Resource(resource, device) as h:``: the handle to export
    from, held for the block: an rmmc.Resource's or rmmc.mr object's (its
    own reference), a raw address (the caller's to keep valid), or the
    device registry's (a reference taken atomically with sets on other
    threads, released after)."""

    def __init__(self, resource, device):
        from . import Resource, _device
        self._ref = self._h = self._raw = self._dev = None
        if isinstance(resource, Resource):
            self._ref = resource._use()
        elif isinstance(getattr(resource, "resource", None), Resource):
            self._ref = resource.resource._use()  # an rmmc.mr object
        elif resource is not None:
            self._raw = _args.pointer(resource, "resource")
        else:
            self._dev = _device(device)

    def __enter__(self):
        if self._ref is not None:
            return self._ref.__enter__()
        if self._dev is None:
            return self._raw
        from . import _device_resource
        self._h = _device_resource(self._dev, "ipc export", retain=True).value
        return self._h

    def __exit__(self, *exc):
        if self._ref is not None:
            return self._ref.__exit__(*exc)
        if self._h is not None:
            lib().rmmc_resource_release(self._h)
        return False


def export(ptr, resource=None, device=None):
    """Exports the block holding `ptr` (an int) of `resource` (an
    rmmc.Resource or a resource address), or of the device's registry stack
    (what rmmc.torch and rmmc.cupy allocate from). Returns an Export.
    NotSupportedError for memory that cannot be shared (the message says
    why and what would)."""
    h = IpcHandle()
    fds = (ctypes.c_int * IPC_MAX_FDS)()
    n = ctypes.c_size_t()
    ptr = _args.pointer(ptr, "ptr")
    with _Resource(resource, device) as r:
        check(lib().rmmc_ipc_export(r, ptr, ctypes.byref(h), fds, IPC_MAX_FDS, ctypes.byref(n)),
              "ipc export")
    handle = bytes(h)
    length = info(handle)["handle_bytes"]
    return Export(handle[:length], [fds[i] for i in range(n.value)])


def import_handle(handle, fds=()):
    """Imports a handle (bytes, or an Export) with its descriptors (which
    stay the caller's); returns a device pointer (int) valid until
    close(ptr). StaleError if its block was freed or its exporter exited."""
    fds = [_args.fd(f) for f in fds]
    arr = (ctypes.c_int * max(1, len(fds)))(*fds)
    p = ctypes.c_void_p()
    check(lib().rmmc_ipc_import(ctypes.byref(_handle(handle)), arr, len(fds), ctypes.byref(p)),
          "ipc import")
    return p.value


def close(ptr):
    """Ends an import (each import needs one close)."""
    check(lib().rmmc_ipc_close(_args.pointer(ptr, "ptr")), "ipc close")


def check_handle(handle):
    """Raises StaleError if the export behind `handle` is no longer live."""
    check(lib().rmmc_ipc_check(ctypes.byref(_handle(handle))), "ipc check")


def revoke(ptr):
    """Makes the handles of the block at `ptr` stale now (as freeing it does)."""
    check(lib().rmmc_ipc_revoke(_args.pointer(ptr, "ptr")), "ipc revoke")


def _fileno(sock):
    return _args.fd(sock, "socket")


def send(sock, handle, fds=None):
    """Sends a handle (an Export, or bytes with `fds`) and its descriptors
    over a connected AF_UNIX socket (a socket object or a descriptor)."""
    if isinstance(handle, Export):
        fds = handle.fds if fds is None else fds
    fds = [_args.fd(f) for f in fds or ()]
    arr = (ctypes.c_int * max(1, len(fds)))(*fds)
    check(lib().rmmc_ipc_send(_fileno(sock), ctypes.byref(_handle(handle)), arr, len(fds)),
          "ipc send")


def recv(sock):
    """Receives one handle and its descriptors (the caller's to close):
    (handle bytes, [fds])."""
    h = IpcHandle()
    fds = (ctypes.c_int * IPC_MAX_FDS)()
    n = ctypes.c_size_t()
    check(lib().rmmc_ipc_recv(_fileno(sock), ctypes.byref(h), fds, IPC_MAX_FDS, ctypes.byref(n)),
          "ipc recv")
    handle = bytes(h)
    return handle[:info(handle)["handle_bytes"]], [fds[i] for i in range(n.value)]


def stats():
    """This process's exports and imports: {exports, imports, open_bases,
    opens, unverified}."""
    s = IpcStats()
    s.size = ctypes.sizeof(IpcStats)
    check(lib().rmmc_ipc_get_stats(ctypes.byref(s)), "ipc stats")
    return {name: getattr(s, name) for name, *_ in IpcStats._fields_ if name != "size"}


def socketpair():
    """A connected AF_UNIX stream socket pair (what send/recv need)."""
    return _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)


# ---- PyTorch ----

def share_tensor(t):
    """Exports the storage of CUDA tensor `t` (allocated through rmmc.torch,
    which must stay alive and unchanged until the importer is done).
    Returns (meta, Export): meta describes the view (shape, stride, dtype,
    offset) for tensor_from(). With the native backend the block is
    exported from the stack that handed it out (a MemPool's own stack, or
    the device's); with the plug-in, from the device's registry stack."""
    storage = t.untyped_storage()
    meta = {"shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).replace("torch.", ""), "storage_offset": t.storage_offset(),
            "nbytes": storage.nbytes(), "device": t.device.index}
    ptr = storage.data_ptr()
    from . import torch as _rt  # rmmc.torch: imports no torch by itself
    native = _rt._native_lib if _rt.backend() == "native" else None
    stack = native.block_resource(ptr) if native is not None else None
    if stack is not None:
        with stack:
            return meta, export(ptr, resource=stack)
    return meta, export(ptr, device=t.device.index)


class _Imported:
    """The imported memory as __cuda_array_interface__ (bytes), closed when
    the last tensor over it goes."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}
        self.closer = weakref.finalize(self, close, ptr)


def tensor_from(meta, handle, fds=()):
    """A CUDA tensor over memory another process shared with share_tensor()
    (the import is closed when the tensor and its views are gone)."""
    import torch
    holder = _Imported(import_handle(handle, fds), meta["nbytes"])
    try:
        raw = torch.as_tensor(holder, device="cuda")
    except Exception:
        holder.closer()
        raise
    dtype = getattr(torch, meta["dtype"])
    flat = raw.view(dtype)
    return torch.as_strided(flat, meta["shape"], meta["stride"], meta["storage_offset"])
