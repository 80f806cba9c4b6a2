# SPDX-License-Identifier: Apache-2.0
"""CuPy through rmmc:

    import rmmc.cupy
    rmmc.cupy.use("pool > cuda")

use() sets CuPy's allocator (cupy.cuda.set_allocator) to rmmc's plug-in
(cupy.cuda.memory.CFunctionAllocator over rmmc_cupy_malloc/free, on CuPy's
current stream as RMM's allocator), raising
rmmc.OutOfMemoryError (a MemoryError) with rmmc's message when the stack
cannot allocate, where CFunctionAllocator alone would hand out NULL.
"""
from . import _args
from ._lib import OutOfMemoryError, ParseError, RmmcError, address, last_error, lib
from ._plugin import prepare
from . import plugin_last_error, plugin_stats


def use(spec=None, device=None, stream=None):
    """Makes rmmc CuPy's allocator. `spec` (optional) becomes the default
    stack (rmmc.set_default(spec, device)); a broken RMMC_ALLOC_CONF raises
    ParseError here. `stream`: None (the default) orders each allocation on
    CuPy's current stream at the time (cupy.cuda.get_current_stream(), as
    RMM's rmm_cupy_allocator does), and frees it on the same stream; a
    cudaStream_t (an int, or a stream object) fixes the stream for every
    allocation instead. Returns the malloc function installed."""
    import cupy
    fixed = None if stream is None else (_args.stream(stream) or 0)
    prepare(spec, device)
    malloc_fn, free_fn = address("rmmc_cupy_malloc"), address("rmmc_cupy_free")
    # One CFunctionAllocator per stream: its param is the stream that
    # rmmc_cupy_malloc and rmmc_cupy_free order the block on.
    by_stream = {}

    def allocator(s):
        a = by_stream.get(s)
        if a is None:
            a = by_stream.setdefault(s, cupy.cuda.memory.CFunctionAllocator(s, malloc_fn, free_fn,
                                                                              lib()))
        return a

    def malloc(size):
        s = fixed if fixed is not None else cupy.cuda.get_current_stream().ptr
        mp = allocator(s).malloc(size)
        if size and not mp.ptr:
            why = last_error() or plugin_last_error()
            if "out of memory" in why:
                raise OutOfMemoryError(-2, why, "rmmc.cupy: %d bytes" % size)
            if "not a valid stack spec" in why:
                raise ParseError(-8, why, "rmmc.cupy: %d bytes" % size)
            raise RmmcError(-11, why, "rmmc.cupy: %d bytes" % size)
        return mp

    malloc.streams = by_stream  # the streams allocated on so far (tests, reports)
    cupy.cuda.set_allocator(malloc)
    return malloc


def stats(device=-1):
    """The plug-in's figures: allocations, bytes_in_use, peak_bytes, ..."""
    return plugin_stats(device)
