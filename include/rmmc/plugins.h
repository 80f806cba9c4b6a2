/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Framework plug-ins: C entry points PyTorch and CuPy call to allocate
 * through rmmc, with no code of their own compiled against rmmc.
 *
 * PyTorch (torch.cuda.memory.CUDAPluggableAllocator):
 *
 *   lib = "/path/to/librmmc.so"
 *   a = torch.cuda.memory.CUDAPluggableAllocator(lib, "rmmc_torch_alloc",
 *                                                "rmmc_torch_free")
 *   # optional hooks, by address (ctypes.cast(fn, c_void_p).value):
 *   a.allocator().set_init_fn(addr("rmmc_torch_init"))
 *   a.allocator().set_reset_fn(addr("rmmc_torch_empty_cache"))
 *   a.allocator().set_memory_fraction_fn(addr("rmmc_torch_set_memory_fraction"))
 *   a.allocator().set_record_stream_fn(addr("rmmc_torch_record_stream"))
 *   a.allocator().set_begin_allocate_to_pool(addr("rmmc_torch_begin_allocate_to_pool"))
 *   a.allocator().set_end_allocate_to_pool_fn(addr("rmmc_torch_end_allocate_to_pool"))
 *   a.allocator().set_release_pool(addr("rmmc_torch_release_pool"))
 *   a.allocator().set_base_alloc_fn(addr("rmmc_torch_base_alloc"))
 *   torch.cuda.memory.change_current_allocator(a)   # before any CUDA use
 *
 * CuPy (cupy.cuda.memory.CFunctionAllocator):
 *
 *   cupy.cuda.set_allocator(cupy.cuda.memory.CFunctionAllocator(
 *       0, addr("rmmc_cupy_malloc"), addr("rmmc_cupy_free"), lib_object).malloc)
 *
 * Both allocate from the registry's resource of the device they are given,
 * looked up at call time (registry.h; set RMMC_ALLOC_CONF to choose the
 * stack with no code, see defaults.h). Every block handed out is entered in
 * a thread-safe map (pointer -> size, stream, device, resource), so a free
 * returns the block to the resource it came from with the size and stream
 * it was allocated with, even if the registry has changed since; CuPy's
 * free gives neither size nor stream. A pointer the map does not know is
 * never passed to a resource: it is counted (unknown_frees) and reported.
 *
 * Errors never crash the framework: an allocation that fails returns NULL
 * (PyTorch then raises torch.OutOfMemoryError) and a free that fails
 * returns. The message is kept twice: in the calling thread's
 * rmmc_last_error_message(), and process-wide in rmmc_plugin_last_error()
 * for frameworks that allocate on threads of their own (PyTorch's autograd
 * engine runs backward passes on its own threads).
 *
 * Sharing tensors between processes: PyTorch's own path
 * (torch.multiprocessing, Storage._share_cuda_) refuses pluggable
 * allocators in current versions (shareIpcHandle and getIpcDevPtr raise);
 * older ones share through rmmc_torch_base_alloc below. rmmc's own export
 * and import (ipc.h; rmmc.ipc in Python) work with any version:
 * docs/design.md, "Sharing between processes".
 */
#ifndef RMMC_PLUGINS_H
#define RMMC_PLUGINS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "rmmc/export.h"
#include "rmmc/resource.h"
#include "rmmc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- PyTorch ---- */

/* Allocates `size` bytes on `device`, ready for use on `stream`, from the
 * device's registry resource. Returns NULL (and records why) when the
 * resource fails, when the limit set through the memory fraction would be
 * exceeded, or for a bad device id; NULL without an error for size 0.
 * Thread-safe. */
RMMC_EXPORT void *rmmc_torch_alloc(size_t size, int device, cudaStream_t stream);

/* With `on` nonzero, a failed rmmc_torch_alloc() throws a C++
 * std::runtime_error with rmmc's message instead of returning NULL, through
 * the libstdc++ already loaded in the process (none loaded: NULL as
 * before). PyTorch does not check the pointer a pluggable allocator
 * returns, so NULL would become a tensor at address 0; PyTorch raises the
 * exception as RuntimeError. rmmc.torch.use() turns it on; only a C++
 * caller that catches may. Off by default. */
RMMC_EXPORT void rmmc_torch_raise_on_failure(int on);

/* Returns a block from rmmc_torch_alloc() to the resource it came from, on
 * the stream it was allocated on, after ordering that stream after every
 * stream rmmc_torch_record_stream() recorded for the block. The size,
 * device and stream recorded at allocation are used (PyTorch passes the
 * same ones back). NULL is a no-op; an unknown pointer is counted and
 * reported, never freed. Thread-safe. */
RMMC_EXPORT void rmmc_torch_free(void *ptr, size_t size, int device, cudaStream_t stream);

/* set_init_fn: PyTorch calls it once with the device count when its CUDA
 * state initializes. Records the count (device ids at or above it are
 * refused later) and reads the environment's configuration, so a bad
 * RMMC_ALLOC_CONF is reported then, not at the first allocation. Builds no
 * resource: a stack is built on a device only when the device is used. */
RMMC_EXPORT void rmmc_torch_init(int device_count);

/* set_reset_fn (torch.cuda.empty_cache()): releases the cached memory of
 * every device the plug-ins have allocated on (rmmc_plugin_release_cached()). */
RMMC_EXPORT void rmmc_torch_empty_cache(void);

/* set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction):
 * limits the bytes handed out through the plug-ins on `device` to
 * `fraction` (0 < fraction <= 1) of the device's total memory
 * (rmmc_plugin_set_limit()). PyTorch's own allocator counts cached memory
 * too; rmmc counts the bytes in use through the plug-ins, since the stack
 * under them may be shared. Failures are recorded (rmmc_plugin_last_error). */
RMMC_EXPORT void rmmc_torch_set_memory_fraction(double fraction, int device);

/* set_record_stream_fn (Tensor.record_stream): records that the block at
 * `ptr` is also used on `stream`. When the block is freed, the stream it
 * is freed on is made to wait (an event, rmmc_stream_wait(); no host
 * block) for the work enqueued on each recorded stream up to that moment,
 * so the resource cannot hand the block out again, on the freeing stream or
 * any stream ordered after it, before that work is done. Up to 16 streams
 * per block are recorded; beyond that (or if the events cannot be made)
 * the free waits for the whole device (cudaDeviceSynchronize). An unknown
 * pointer is reported and ignored. Thread-safe. */
RMMC_EXPORT void rmmc_torch_record_stream(void *ptr, cudaStream_t stream);

/* set_begin_allocate_to_pool / set_end_allocate_to_pool_fn /
 * set_release_pool (torch.cuda.graph, CUDAGraph.capture_begin/end/reset,
 * make_graphed_callables): the device's registry stack routes the capture
 * the calling thread begins next to the graph pool (id0, id1), a PyTorch
 * MempoolId_t (rmmc_pool_graph_begin/_end/_release, pool_resource.h: a
 * stack with no pool layer records a failure and allocates as usual).
 * PyTorch passes its MempoolId_t by value and a C++ filter by reference,
 * which these signatures receive on the x86-64 and AArch64 ABIs; the
 * filter is not called: routing by capture selects the same streams. */
RMMC_EXPORT void rmmc_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1,
                                                   const void *filter);
RMMC_EXPORT void rmmc_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
RMMC_EXPORT void rmmc_torch_release_pool(int device, uint64_t id0, uint64_t id1);

/* set_base_alloc_fn (PyTorch's getBaseAllocation): the cudaMalloc
 * allocation that holds the block at `ptr` (a pool's chunk, found with
 * rmmc_resource_get_allocation() down the stack) and its size in *size,
 * as PyTorch's own allocator reports for CUDA IPC; for a block on
 * virtual-memory pages, or of a stack that cannot tell, the block itself.
 * An unknown pointer is returned as it is with *size 0 (and reported).
 * PyTorch versions that share tensors through cudaIpcGetMemHandle of this
 * base (before shareIpcHandle) can then share chunk-backed rmmc memory;
 * docs/design.md says which do. Thread-safe. */
RMMC_EXPORT void *rmmc_torch_base_alloc(void *ptr, size_t *size);

/* ---- CuPy ---- */

/* Allocates `size` bytes on `device` from its registry resource, ordered
 * on the stream `param` holds: CFunctionAllocator passes its `param`
 * integer through, so pass a cudaStream_t there, or 0 for the legacy
 * default stream (which orders itself with CuPy's blocking streams; use
 * it unless all of CuPy's work runs on one stream you name). NULL on
 * failure (recorded) or for size 0. Thread-safe. */
RMMC_EXPORT void *rmmc_cupy_malloc(void *param, size_t size, int device);

/* Returns a block from rmmc_cupy_malloc() with the size and stream recorded
 * at allocation (CuPy gives neither). NULL is a no-op; an unknown pointer
 * is counted and reported, never freed. Thread-safe. */
RMMC_EXPORT void rmmc_cupy_free(void *param, void *ptr, int device);

/* ---- figures and control, shared by both ---- */

typedef struct rmmc_plugin_stats {
  size_t size;                  /* sizeof(rmmc_plugin_stats_t): set by RMMC_PLUGIN_STATS_INIT */
  uint64_t allocations;         /* blocks handed out */
  uint64_t allocation_failures; /* allocations that returned NULL for a size > 0 */
  uint64_t deallocations;       /* blocks returned */
  uint64_t deallocation_failures; /* frees the resource refused or could not order */
  uint64_t unknown_frees;       /* frees of pointers the plug-ins never handed out */
  uint64_t recorded_streams;    /* streams recorded by rmmc_torch_record_stream() */
  uint64_t live_blocks;         /* blocks out now */
  uint64_t bytes_in_use;        /* bytes out now (as requested) */
  uint64_t peak_bytes;          /* the highest bytes_in_use seen */
  uint64_t limit;               /* the limit in bytes (0: none) */
} rmmc_plugin_stats_t;

#define RMMC_PLUGIN_STATS_INIT {sizeof(rmmc_plugin_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/* Fills *out with the figures of `device`, or of every device summed for
 * device -1 (peak_bytes is then the process-wide peak and limit 0).
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL out, an out->size smaller than
 * the first version of the struct, or a bad device id. Thread-safe (each
 * figure is read atomically; the set is not one snapshot). */
RMMC_EXPORT rmmc_status_t rmmc_plugin_get_stats(int device, rmmc_plugin_stats_t *out);

/* Lets at most `bytes` be out through the plug-ins on `device` at once (0:
 * no limit); allocations above it return NULL with an out-of-memory
 * message. Blocks already out stay. RMMC_ERROR_INVALID_ARGUMENT for a bad
 * device id. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_plugin_set_limit(int device, size_t bytes);

/* Memory hooks (resource.h) on device `device`'s registry resource (-1:
 * the current device; built from the default on first use), so that NCCL,
 * RDMA or cuFile registration follows the memory the framework's stack
 * takes: rmmc_resource_set_memory_hooks() on it, with its statuses and
 * those of rmmc_get_device_resource(). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_plugin_set_memory_hooks(int device, const rmmc_memory_hooks_t *hooks);

/* Releases the cached memory of the registry resource of every device the
 * plug-ins have allocated on (rmmc_resource_release_cached()). Returns the
 * first failure; the other devices are still released. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_plugin_release_cached(void);

/* Copies the message of the last plug-in failure on any thread into buf
 * (`len` bytes, always terminated; buf may be NULL with len 0) and returns
 * its length ("" and 0 if none). Thread-safe. */
RMMC_EXPORT size_t rmmc_plugin_last_error(char *buf, size_t len);

/* Sets the counts (allocations, failures, deallocations, unknown frees,
 * recorded streams) to 0 and the peak to the bytes in use now, and forgets
 * the last failure. Blocks out, bytes in use and limits stay (as
 * torch.cuda.reset_peak_memory_stats). Thread-safe. */
RMMC_EXPORT void rmmc_plugin_reset_stats(void);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_PLUGINS_H */
