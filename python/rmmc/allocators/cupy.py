# SPDX-License-Identifier: Apache-2.0
"""rmm.allocators.cupy by RMM's name: rmm_cupy_allocator(nbytes) allocates
an rmmc.DeviceBuffer from the current device's stack on CuPy's current
stream, as RMM's does (rmmc.cupy.use() installs a C allocator instead,
without a Python object per block)."""
from typing import Any

from ..buffer import DeviceBuffer

try:
    import cupy
except ImportError:
    cupy = None

__all__ = ["rmm_cupy_allocator"]


def rmm_cupy_allocator(nbytes: int) -> Any:
    """A cupy.cuda.MemoryPointer to `nbytes` from rmmc's current stack."""
    if cupy is None:
        raise ModuleNotFoundError("No module named 'cupy'")
    stream = cupy.cuda.get_current_stream().ptr
    buf = DeviceBuffer(size=nbytes, stream=stream)
    dev_id = -1 if buf.ptr else cupy.cuda.device.get_device_id()
    mem = cupy.cuda.UnownedMemory(ptr=buf.ptr, size=buf.size, owner=buf, device_id=dev_id)
    return cupy.cuda.memory.MemoryPointer(mem, 0)
