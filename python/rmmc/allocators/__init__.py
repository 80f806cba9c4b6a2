# SPDX-License-Identifier: Apache-2.0
"""rmm.allocators by RMM's names, over rmmc's registry stack (what
rmmc.set_default, RMMC_ALLOC_CONF or rmmc.mr.set_current_device_resource
installed):

    from rmmc.allocators.cupy import rmm_cupy_allocator     # cupy.cuda.set_allocator(...)
    from rmmc.allocators.numba import RMMNumbaManager       # numba.cuda.set_memory_manager(...)
    from rmmc.allocators.torch import rmm_torch_allocator   # torch.cuda.memory.change_current_allocator(...)
"""
