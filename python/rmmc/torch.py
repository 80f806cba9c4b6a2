# SPDX-License-Identifier: Apache-2.0
"""PyTorch through rmmc: two lines.

    import rmmc.torch
    rmmc.torch.use("pool > cuda")   # before any CUDA use

use() installs rmmc's plug-in as PyTorch's CUDA allocator
(torch.cuda.memory.CUDAPluggableAllocator) with every hook rmmc offers:
init, empty_cache, set_per_process_memory_fraction, record_stream and the
CUDA graph pool hooks (torch.cuda.graph captures into a private pool).
PyTorch cannot swap an allocator it has started, so use() raises if CUDA is
already initialized in PyTorch. An allocation rmmc cannot serve raises
RuntimeError with rmmc's message (PyTorch does not check a pluggable
allocator's NULL, so the plug-in throws; PyTorch raises OutOfMemoryError
only for its own allocator, pytorch/pytorch#133280); stats() and
last_error() have the figures.
"""
from ._lib import address, lib
from ._plugin import prepare
from . import plugin_last_error, plugin_stats

_HOOKS = (("set_init_fn", "rmmc_torch_init"),
          ("set_reset_fn", "rmmc_torch_empty_cache"),
          ("set_memory_fraction_fn", "rmmc_torch_set_memory_fraction"),
          ("set_record_stream_fn", "rmmc_torch_record_stream"),
          # CUDA graphs: torch.cuda.graph's private pools
          ("set_begin_allocate_to_pool", "rmmc_torch_begin_allocate_to_pool"),
          ("set_end_allocate_to_pool_fn", "rmmc_torch_end_allocate_to_pool"),
          ("set_release_pool", "rmmc_torch_release_pool"),
          # getBaseAllocation: the chunk under a block (CUDA IPC in older PyTorch)
          ("set_base_alloc_fn", "rmmc_torch_base_alloc"))


def use(spec=None, device=None, fraction=None):
    """Makes rmmc PyTorch's CUDA allocator. `spec` (optional) becomes the
    default stack (rmmc.set_default(spec, device)); without one,
    RMMC_ALLOC_CONF or a default set earlier is used, and a broken
    RMMC_ALLOC_CONF raises ParseError here. `fraction` caps the bytes
    PyTorch may hold through rmmc per device
    (torch.cuda.set_per_process_memory_fraction). Returns the allocator.
    Raises RuntimeError if PyTorch has initialized CUDA already."""
    import torch
    if torch.cuda.is_initialized():
        raise RuntimeError("rmmc.torch.use() must run before PyTorch initializes CUDA (it did "
                           "already: call use() first thing, before any tensor goes to the GPU)")
    prepare(spec, device)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib().path, "rmmc_torch_alloc",
                                                      "rmmc_torch_free")
    lib().rmmc_torch_raise_on_failure(1)
    hooks = alloc.allocator()
    for setter, fn in _HOOKS:
        if hasattr(hooks, setter):  # older PyTorch versions lack some
            getattr(hooks, setter)(address(fn))
    torch.cuda.memory.change_current_allocator(alloc)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    return alloc


def _stream(stream):
    if stream is not None:
        return getattr(stream, "cuda_stream", stream)
    import torch
    return torch.cuda.current_stream().cuda_stream


def pause(mode="backup", device=None, stream=None):
    """Sleep mode for the rmmc stack PyTorch allocates from on `device`
    (the registry's; rmmc.Resource.pause): every page of its pool goes back
    to the driver (torch.cuda.mem_get_info shows it free) and every tensor
    keeps its data_ptr. mode "backup" keeps the tensors' contents in pinned
    host memory, "discard" drops them. Synchronizes the device; the copies
    run on `stream` (default: the current stream). While paused, allocating
    a tensor raises. Tensors in other rmmc.Resource stacks pause with their
    own Resource.pause()."""
    from . import get_default
    with get_default(device) as r:
        r.pause(mode, _stream(stream))


def resume(device=None, stream=None):
    """Wakes what pause() put to sleep: the same addresses, the backup's
    contents in place for work on `stream` (default: the current stream)."""
    from . import get_default
    with get_default(device) as r:
        r.resume(_stream(stream))


def sleep_state(device=None):
    """rmmc.Resource.sleep_state() of the stack PyTorch allocates from."""
    from . import get_default
    with get_default(device) as r:
        return r.sleep_state()


def stats(device=-1):
    """The plug-in's figures: allocations, bytes_in_use, peak_bytes, ..."""
    return plugin_stats(device)


def last_error():
    """Why the last allocation through the plug-in failed ("" if none)."""
    return plugin_last_error()
