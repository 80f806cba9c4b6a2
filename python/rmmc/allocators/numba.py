# SPDX-License-Identifier: Apache-2.0
"""rmm.allocators.numba by RMM's name: RMMNumbaManager is rmmc.numba's
EMM plugin (NUMBA_CUDA_MEMORY_MANAGER=rmmc.allocators.numba works too)."""
from ..numba import RmmcNumbaManager as RMMNumbaManager
from ..numba import _numba_memory_manager  # noqa: F401

__all__ = ["RMMNumbaManager"]
