# SPDX-License-Identifier: Apache-2.0
"""Numba's External Memory Management plugin over rmmc:

    NUMBA_CUDA_MEMORY_MANAGER=rmmc.numba python app.py

or in code, before Numba touches the GPU:

    from numba import cuda
    import rmmc.numba
    cuda.set_memory_manager(rmmc.numba.RmmcNumbaManager)

Every device array Numba makes (cuda.device_array, cuda.to_device, ...)
is then a block of the current device's rmmc stack (rmmc's registry: what
RMMC_ALLOC_CONF, rmmc.set_default or rmmc.rmm.use installed), ordered on
the legacy default stream as RMM's RMMNumbaManager orders its blocks, and
freed when Numba drops the array. IPC handles (cuda.to_device(...)
.get_ipc_handle(), Numba's multiprocessing) are made as RMM's plugin makes
them: a CUDA IPC handle of the allocation that holds the block, with the
block's offset in it; a pool whose memory is cudaMalloc'd chunks
(``pool(expandable=false) > cuda``) shares this way, the expandable pool's
mapped pages do not (rmmc.ipc shares those). get_memory_info() is the
device's (free, total), as Numba's own manager gives.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Tuple

from numba import cuda
from numba.cuda import HostOnlyCUDAMemoryManager, IpcHandle, MemoryPointer

from .buffer import DeviceBuffer
from ._lib import NotSupportedError

__all__ = ["RmmcNumbaManager"]


def _finalizer(ptr: int, allocations: Dict[int, Any]) -> Callable[[], None]:
    """Frees the block when Numba drops its MemoryPointer (Numba clears
    `allocations` on a context reset: nothing is left to free then)."""
    def finalize() -> None:
        if allocations:
            buf = allocations.pop(ptr, None)
            if buf is not None:
                buf.close()
    return finalize


def _driver():
    """cuda-python's driver bindings (what numba-cuda itself uses)."""
    try:
        from cuda.bindings import driver
    except ImportError:  # cuda-python before 12.6
        from cuda import cuda as driver
    return driver


class RmmcNumbaManager(HostOnlyCUDAMemoryManager):
    """Numba's EMM plugin (numba.cuda.BaseCUDAMemoryManager, interface
    version 1): device memory from rmmc's current stack; host memory
    (pinned, mapped) from Numba's own HostOnly manager."""

    def initialize(self) -> None:
        pass

    def memalloc(self, size: int) -> MemoryPointer:
        """`size` bytes from the current device's rmmc stack (raises
        rmmc.OutOfMemoryError, a MemoryError, when it cannot)."""
        buf = DeviceBuffer(size=size)
        ptr = int(buf.ptr)
        self.allocations[ptr] = buf
        return MemoryPointer(self.context, _driver().CUdeviceptr(ptr), size,
                             finalizer=_finalizer(ptr, self.allocations))

    def get_ipc_handle(self, memory: MemoryPointer) -> IpcHandle:
        """A CUDA IPC handle for the allocation holding `memory`, with the
        block's offset in it (RMM's plugin does the same)."""
        drv = _driver()
        start, _ = cuda.cudadrv.driver.device_extents(memory)
        err, handle = drv.cuIpcGetMemHandle(start)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise NotSupportedError(
                -5, "rmmc.numba: CUDA cannot share this block (%s): legacy CUDA IPC shares "
                "cudaMalloc'd memory, so share from a stack whose pool takes chunks "
                "(pool(expandable=false) > cuda), or use rmmc.ipc for the expandable pool's "
                "pages" % (err,), "get_ipc_handle")
        offset = int(memory.handle) - int(start)
        source = cuda.current_context().device.get_device_identity()
        return IpcHandle(memory, handle, memory.size, source, offset=offset)

    def get_memory_info(self) -> Tuple[int, int]:
        """(free, total) bytes of the device, from the driver."""
        from .mr import available_device_memory
        return available_device_memory()

    @property
    def interface_version(self) -> int:
        return 1


for _, _method in inspect.getmembers(RmmcNumbaManager, inspect.isfunction):
    if _method.__doc__ is None:
        parent = getattr(HostOnlyCUDAMemoryManager, _method.__name__, None)
        _method.__doc__ = getattr(parent, "__doc__", None)

# What NUMBA_CUDA_MEMORY_MANAGER=rmmc.numba loads.
_numba_memory_manager = RmmcNumbaManager
