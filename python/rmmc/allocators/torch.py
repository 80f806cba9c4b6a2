# SPDX-License-Identifier: Apache-2.0
"""rmm.allocators.torch by RMM's name: rmm_torch_allocator is a
torch.cuda.memory.CUDAPluggableAllocator over rmmc's plug-in (librmmc's
rmmc_torch_alloc / rmmc_torch_free, the registry's stack), or None where
PyTorch or a GPU is missing, as RMM's. rmmc.torch.use() installs the
native backend instead, with PyTorch's own memory tools kept."""
from typing import Any

__all__ = ["rmm_torch_allocator"]

rmm_torch_allocator: Any = None

try:
    from torch.cuda.memory import CUDAPluggableAllocator
except ImportError:
    pass
else:
    from torch.cuda import is_available

    if is_available():
        from .._lib import lib
        rmm_torch_allocator = CUDAPluggableAllocator(lib().path, alloc_fn_name="rmmc_torch_alloc",
                                                     free_fn_name="rmmc_torch_free")
    del is_available
