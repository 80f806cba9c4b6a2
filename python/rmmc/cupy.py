# SPDX-License-Identifier: Apache-2.0
"""CuPy through rmmc:

    import rmmc.cupy
    rmmc.cupy.use("pool > cuda")

use() sets CuPy's allocator (cupy.cuda.set_allocator) to rmmc's plug-in
(cupy.cuda.memory.CFunctionAllocator over rmmc_cupy_malloc/free), raising
rmmc.OutOfMemoryError (a MemoryError) with rmmc's message when the stack
cannot allocate, where CFunctionAllocator alone would hand out NULL.
"""
from . import _args
from ._lib import OutOfMemoryError, ParseError, RmmcError, address, last_error, lib
from ._plugin import prepare
from . import plugin_last_error, plugin_stats


def use(spec=None, device=None, stream=0):
    """Makes rmmc CuPy's allocator. `spec` (optional) becomes the default
    stack (rmmc.set_default(spec, device)); a broken RMMC_ALLOC_CONF raises
    ParseError here. `stream`: the cudaStream_t (int) allocations are
    ordered on; 0, the legacy default stream, orders itself with CuPy's
    blocking streams. Returns the malloc function installed."""
    import cupy
    stream = _args.stream(stream) or 0
    prepare(spec, device)
    c_alloc = cupy.cuda.memory.CFunctionAllocator(
        stream, address("rmmc_cupy_malloc"), address("rmmc_cupy_free"), lib())

    def malloc(size):
        mp = c_alloc.malloc(size)
        if size and not mp.ptr:
            why = last_error() or plugin_last_error()
            if "out of memory" in why:
                raise OutOfMemoryError(-2, why, "rmmc.cupy: %d bytes" % size)
            if "not a valid stack spec" in why:
                raise ParseError(-8, why, "rmmc.cupy: %d bytes" % size)
            raise RmmcError(-11, why, "rmmc.cupy: %d bytes" % size)
        return mp

    cupy.cuda.set_allocator(malloc)
    return malloc


def stats(device=-1):
    """The plug-in's figures: allocations, bytes_in_use, peak_bytes, ..."""
    return plugin_stats(device)
