/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Using memory resources.
 *
 * A memory resource hands out memory: device memory (cuda, cuda_async),
 * managed memory, pinned host memory or plain host memory. Sub-allocators
 * (pool, fixed_size, binning, arena) carve memory they took from an upstream
 * resource, and adaptors (limiting, statistics, logging, ...) wrap an upstream
 * and add one concern. Every resource is used through the calls below, which
 * validate arguments once and dispatch through the resource's ops table.
 *
 * Stream order. allocate(bytes, alignment, stream) returns memory that is
 * ready for use by work enqueued on `stream` after the call. deallocate(...,
 * stream) declares that once the work already enqueued on `stream` is done,
 * the memory may be reused; a resource may hand it out again at once to the
 * same stream, and to another stream only after making that stream wait. A
 * NULL stream is the legacy default stream; cudaStreamPerThread works too.
 * Host-memory resources treat streams as opaque keys and never call CUDA.
 *
 * Guarantees (as RMM): every pointer is aligned to at least
 * RMMC_DEFAULT_ALIGNMENT (256) bytes, or to the requested alignment if larger;
 * alignment must be a power of two; a request of 0 bytes returns NULL with
 * RMMC_SUCCESS; deallocate must be given the bytes and alignment that were
 * passed to allocate. Deallocating NULL is a no-op that succeeds.
 *
 * Ownership. Resources are reference counted. A _create call returns one
 * reference to the caller. An adaptor or sub-allocator retains its upstream
 * and releases it when it is destroyed, so releasing the top of a stack frees
 * the whole stack once nobody else holds a part of it; the per-device
 * registry retains what it holds and hands the previous resource back to the
 * caller of set. Whoever holds a reference drops it with
 * rmmc_resource_release(); a failed _create retains nothing. Memory still
 * allocated from a resource must be returned before its last reference goes:
 * destroying a resource frees what it cached, not what callers still hold.
 *
 * Out of memory. A stack reports RMMC_ERROR_OUT_OF_MEMORY only when nothing
 * in it caches memory: when the outermost layer that caches (its figure
 * "cached", or "reserved" above "in_use") fails for memory, its stack gives
 * back what it caches (rmmc_resource_release_cached() on it) and the
 * request is retried once, before the failure goes up to the layers above,
 * which see one call. A retry that succeeds leaves the thread's last error
 * as it was.
 *
 * Thread safety. Every built-in resource may be called from many threads at
 * once. Retain and release are atomic.
 */
#ifndef RMMC_RESOURCE_H
#define RMMC_RESOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "rmmc/export.h"
#include "rmmc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest alignment of every pointer rmmc hands out. */
#define RMMC_DEFAULT_ALIGNMENT ((size_t)256)

/* A memory resource. Built-in resources are opaque: use the functions of
 * this header and of each resource's own header. resource_ops.h shows the
 * layout to those who write their own resource. */
typedef struct rmmc_resource rmmc_resource_t;

/* What kind of memory a resource hands out. */
typedef enum rmmc_memory_kind {
  RMMC_MEMORY_DEVICE = 1,  /* device memory: not readable by the CPU */
  RMMC_MEMORY_HOST = 2,    /* pageable host memory: not usable by kernels */
  RMMC_MEMORY_PINNED = 3,  /* page-locked host memory: CPU and device */
  RMMC_MEMORY_MANAGED = 4, /* managed (unified) memory: CPU and device */
} rmmc_memory_kind_t;

/* "device", "host", "pinned" or "managed" ("unknown" otherwise). */
RMMC_EXPORT const char *rmmc_memory_kind_name(rmmc_memory_kind_t kind);
/* True for device, pinned and managed memory. */
RMMC_EXPORT bool rmmc_memory_kind_is_device_accessible(rmmc_memory_kind_t kind);
/* True for host, pinned and managed memory. */
RMMC_EXPORT bool rmmc_memory_kind_is_host_accessible(rmmc_memory_kind_t kind);

/* Allocates `bytes` bytes aligned to max(alignment, 256), ready for use on
 * `stream`, and stores the pointer in *out (NULL for 0 bytes). On failure
 * *out is set to NULL (when out is not NULL).
 * Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL resource or
 * out-pointer, an alignment that is not a power of two, or a size that
 * overflows when rounded to the alignment; RMMC_ERROR_OUT_OF_MEMORY when the
 * resource cannot satisfy the request even after its stack gave back what
 * it caches ("Out of memory" above; the message gives the request, the
 * device, the stream, the resource and the figures it knows);
 * RMMC_ERROR_CUDA for other CUDA failures. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_allocate(rmmc_resource_t *r,
                                                 size_t bytes,
                                                 size_t alignment,
                                                 cudaStream_t stream,
                                                 void **out);

/* Returns memory obtained from rmmc_resource_allocate() with the same bytes
 * and alignment; it may be reused by `stream` at once. NULL is a no-op.
 * Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL resource, a
 * bad alignment or a non-NULL pointer with 0 bytes;
 * RMMC_ERROR_UNKNOWN_POINTER where the resource can tell that the pointer or
 * size is not one it handed out (the memory it does own is left as it was);
 * RMMC_ERROR_CUDA when CUDA fails. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_deallocate(rmmc_resource_t *r,
                                                   void *ptr, size_t bytes,
                                                   size_t alignment,
                                                   cudaStream_t stream);

/* Synchronous convenience: allocate with the default alignment on the legacy
 * default stream and, for device-accessible memory, wait for that stream, so
 * the memory may be used on any stream at once. */
RMMC_EXPORT rmmc_status_t rmmc_resource_allocate_sync(rmmc_resource_t *r,
                                                      size_t bytes,
                                                      void **out);

/* Synchronous convenience: for device-accessible memory, wait for the whole
 * device first (the memory may have been used on any stream), then
 * deallocate with the default alignment on the legacy default stream. */
RMMC_EXPORT rmmc_status_t rmmc_resource_deallocate_sync(rmmc_resource_t *r,
                                                        void *ptr,
                                                        size_t bytes);

/* Takes one more reference to r and returns r (NULL stays NULL). */
RMMC_EXPORT rmmc_resource_t *rmmc_resource_retain(rmmc_resource_t *r);

/* Drops one reference; the last one destroys the resource, which releases
 * its upstream in turn. NULL is a no-op. Blocks still allocated through a
 * destroyed resource are freed with it (a later use of them is a use after
 * free); with RMMC_CHECK_RELEASE=1 in the environment the last release of a
 * layer that reports live blocks ("outstanding" or "in_use") says so on
 * stderr, once per stack. */
RMMC_EXPORT void rmmc_resource_release(rmmc_resource_t *r);

/* The number of references held now (for tests and reports). */
RMMC_EXPORT long rmmc_resource_refcount(const rmmc_resource_t *r);

/* True when memory allocated from one may be deallocated through the
 * other: the same resource, or equal per the resource's is_equal slot. */
RMMC_EXPORT bool rmmc_resource_is_equal(const rmmc_resource_t *a,
                                        const rmmc_resource_t *b);

/* Gives cached but unused memory back to the upstream (pools give back
 * wholly free chunks). Resources that cache nothing succeed and do nothing.
 * Adaptors forward to their upstream. */
RMMC_EXPORT rmmc_status_t rmmc_resource_release_cached(rmmc_resource_t *r);

/* The resource's short name ("cuda", "pool", "statistics", ...). */
RMMC_EXPORT const char *rmmc_resource_name(const rmmc_resource_t *r);

/* The kind of memory the resource hands out. */
RMMC_EXPORT rmmc_memory_kind_t rmmc_resource_memory_kind(const rmmc_resource_t *r);

/* The CUDA device the memory belongs to (-1 for host memory that belongs to
 * no device). */
RMMC_EXPORT int rmmc_resource_device(const rmmc_resource_t *r);

/* The upstream of an adaptor or sub-allocator, borrowed (valid while r is),
 * or NULL for a base resource. */
RMMC_EXPORT rmmc_resource_t *rmmc_resource_upstream(const rmmc_resource_t *r);

/* ---- Virtual memory ----
 *
 * Some base resources (cuda, host, sim) can reserve address space and back
 * it with memory page by page; a pool with expandable=true uses this to grow
 * in place and to give back the pages inside its free blocks. The calls
 * below are that interface; they are not stream-ordered: the caller makes
 * sure no pending work uses a range it unmaps. Thread-safe.
 *
 * rmmc_resource_vm_page_size() is the page size (a power of two), or 0 if r
 * has no virtual memory (then every other call returns
 * RMMC_ERROR_NOT_SUPPORTED). Ranges must be non-empty multiples of the page
 * size at page-aligned addresses (RMMC_ERROR_INVALID_ARGUMENT otherwise, as
 * for a NULL r or out-pointer). reserve gives `bytes` of address space with
 * nothing behind it, aligned to `alignment` (a power of two; 0 or less
 * than the page means the page); unreserve gives a whole reservation back, with no page
 * mapped. map backs an unmapped range inside a reservation with memory the
 * resource's device may read and write (RMMC_ERROR_OUT_OF_MEMORY if memory
 * ran out; nothing is mapped then); unmap gives back exactly one range that
 * map was given. */
RMMC_EXPORT size_t rmmc_resource_vm_page_size(const rmmc_resource_t *r);
RMMC_EXPORT rmmc_status_t rmmc_resource_vm_reserve(rmmc_resource_t *r, size_t bytes,
                                                   size_t alignment, void **out);
RMMC_EXPORT rmmc_status_t rmmc_resource_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes);
RMMC_EXPORT rmmc_status_t rmmc_resource_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes);
RMMC_EXPORT rmmc_status_t rmmc_resource_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes);

/* Grants device `device` read and write access to mapped pages (readwrite
 * true), or takes it back (false): [ptr, ptr + bytes) is one or more whole
 * ranges given to map, contiguous. A mapping is reachable from r's own
 * device only until a range is granted; a pool over r does this for the
 * peers rmmc_resource_enable_peer_access() named, on every mapping it
 * makes. On failure the access is as it was. Returns RMMC_SUCCESS;
 * RMMC_ERROR_INVALID_ARGUMENT for a bad range, a device out of [0, 64) or
 * r's own device (its access comes with the mapping);
 * RMMC_ERROR_NOT_SUPPORTED when r cannot grant access (host, sim, a
 * resource of your own without the vm_set_access slot) or the two devices
 * cannot be peers; RMMC_ERROR_CUDA when the driver refuses. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes,
                                                      int device, bool readwrite);

/* ---- Allocations: which block holds a pointer ----
 *
 * A range of addresses: `bytes` bytes from `ptr`. */
typedef struct rmmc_range {
  void *ptr;
  size_t bytes;
} rmmc_range_t;

/* Where the memory of a block came from, one layer down. */
typedef enum rmmc_backing {
  /* The layer made the memory itself (cudaMalloc, the driver, malloc):
   * `upstream` is that whole allocation as the layer made it. */
  RMMC_BACKING_OWN = 1,
  /* The block lies inside one block the layer's upstream handed out (a
   * pool's chunk): `upstream` is that block; ask the upstream about it. */
  RMMC_BACKING_BLOCK = 2,
  /* The block lies on virtual-memory mappings the layer made through its
   * upstream's vm_map (an expandable pool's pages): `mappings` lists them,
   * each exactly one range given to vm_map, in address order, and
   * `upstream` spans them. */
  RMMC_BACKING_MAPPINGS = 3,
} rmmc_backing_t;

/* The block of a resource that holds a pointer. Set `size` with
 * RMMC_ALLOCATION_INIT; to learn the mappings of a RMMC_BACKING_MAPPINGS
 * block, point `mappings` at room for `max_mappings` ranges first. */
typedef struct rmmc_allocation {
  size_t size;               /* sizeof(rmmc_allocation_t) */
  void *base;                /* the block's first byte */
  size_t bytes;              /* its size: the bytes allocate was asked for */
  rmmc_resource_t *resource; /* the layer that handed it out (borrowed) */
  rmmc_backing_t backing;    /* where its memory came from, one layer down */
  rmmc_range_t upstream;     /* that memory (see rmmc_backing_t) */
  rmmc_range_t *mappings;    /* in: room for the mappings (may be NULL) */
  size_t max_mappings;       /* in: how many ranges fit there */
  size_t nmappings;          /* out: how many mappings the block lies on (all of
                              * them; only the first max_mappings are written) */
} rmmc_allocation_t;

#define RMMC_ALLOCATION_INIT {sizeof(rmmc_allocation_t), NULL, 0, NULL, (rmmc_backing_t)0, {NULL, 0}, NULL, 0, 0}

/* Finds the block of r's stack that holds `ptr` (its first byte or any byte
 * inside it) and fills *out: the block, the layer that handed it out, and
 * what memory lies under it. Adaptors pass the question to their upstream;
 * the pool answers for its blocks (O(1) for a block's first byte, a walk of
 * its chunk's or span's blocks otherwise); the cuda resource for its
 * cudaMalloc allocations (the driver knows their range). Not on any hot
 * path: a lookup takes the layer's locks.
 * Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL r, ptr or
 * out, or an out->size below the first version of the struct;
 * RMMC_ERROR_UNKNOWN_POINTER when no live block of the stack holds ptr;
 * RMMC_ERROR_NOT_SUPPORTED when a layer cannot tell (fixed_size, binning,
 * cuda_async, managed, pinned, host, sim, or a resource of your own
 * without the get_allocation slot). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_get_allocation(rmmc_resource_t *r, const void *ptr,
                                                       rmmc_allocation_t *out);

/* ---- Memory hooks: what a stack takes from the system ----
 *
 * Registration-style users (NCCL's ncclCommRegister, RDMA memory regions,
 * cuFile's buffer registration) must know every range of memory a pool
 * holds, as it grows and before it gives memory back. on_acquire(ptr,
 * bytes, user) is called after a layer took a new range from its upstream
 * (a pool's chunk, or one mapping of its pages); on_release(ptr, bytes,
 * user) before the layer gives that same range back (trimming,
 * release_cached, destruction). The ranges are exactly those: each
 * on_release matches one earlier on_acquire. Both run on the thread that
 * makes the pool grow or shrink, under the pool's lock: a hook must not
 * call the same resource. Either may be NULL. */
typedef void (*rmmc_memory_hook_cb)(void *ptr, size_t bytes, void *user);

typedef struct rmmc_memory_hooks {
  size_t size;                    /* sizeof(rmmc_memory_hooks_t): RMMC_MEMORY_HOOKS_INIT */
  rmmc_memory_hook_cb on_acquire; /* a range was taken from the upstream */
  rmmc_memory_hook_cb on_release; /* a range is about to go back */
  void *user;                     /* passed to both */
} rmmc_memory_hooks_t;

#define RMMC_MEMORY_HOOKS_INIT {sizeof(rmmc_memory_hooks_t), NULL, NULL, NULL}

/* Installs `hooks` (copied; NULL removes them) on the layer of r's stack
 * that takes memory from the system: r itself if it supports hooks, else
 * the first layer below it that does (adaptors and sub-allocators without
 * their own pass the call down; the pool takes it). So that a registration
 * always matches what is held, the hooks being replaced get on_release for
 * every range held now, and the new hooks on_acquire for each, before this
 * returns. Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL r or
 * a hooks->size below the first version of the struct;
 * RMMC_ERROR_NOT_SUPPORTED when no layer of the stack supports hooks.
 * Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_set_memory_hooks(rmmc_resource_t *r,
                                                         const rmmc_memory_hooks_t *hooks);

/* ---- Peer access: another device's kernels on a stack's memory ----
 *
 * Lets kernels running on device `peer_device` read and write the memory
 * r's stack hands out: every block it holds now and every block it maps or
 * allocates later, so a pool that grows after the call stays reachable.
 * Each layer does its part and passes the call down: a pool grants each of
 * its virtual-memory mappings to the peer (cuMemSetAccess) now and at
 * every later mapping; the cuda resource enables the two contexts' peer
 * access (cudaDeviceEnablePeerAccess from the peer's context: every
 * cudaMalloc allocation of its device, now and later; the calling thread's
 * current device is left as it was); cuda_async sets its memory pool's
 * access (cudaMemPoolSetAccess: the device's default pool, for a view of
 * it); managed and pinned memory is reachable from every device already,
 * so the call only checks the peer; adaptors and the other sub-allocators
 * take their memory from their upstream and pass the call on. Enabling a
 * peer twice succeeds and does nothing more. There is no disable: CUDA's
 * context peer access is shared by every user of the two devices (PyTorch
 * and CuPy enable it and never turn it off), and access taken back from
 * memory a kernel still uses faults that kernel; release the stack
 * instead. Call it before launching the peer's kernels that use the
 * memory; it is not stream-ordered.
 *
 * Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL r, a
 * peer_device out of [0, 64), one that does not exist, or r's own device
 * (its memory is its own; the message names both); RMMC_ERROR_NOT_SUPPORTED
 * when the two devices cannot be peers (cudaDeviceCanAccessPeer says no:
 * no NVLink or PCIe peer path, or a platform that forbids it; the message
 * names both) or when the stack's memory is not device memory (host, sim)
 * or its base cannot tell (a resource of your own without the
 * enable_peer_access slot); RMMC_ERROR_NO_DEVICE without a GPU;
 * RMMC_ERROR_CUDA when CUDA refuses otherwise. On failure a pool's
 * mappings are as they were (those granted before the failure are taken
 * back); what a layer below did before the failure stays (CUDA's context
 * peer access is never turned off, for the reason above). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_resource_enable_peer_access(rmmc_resource_t *r, int peer_device);

/* One figure a resource reports about itself. */
typedef enum rmmc_field_kind {
  RMMC_FIELD_BYTES = 1, /* value is a number of bytes */
  RMMC_FIELD_COUNT = 2, /* value is a count */
  RMMC_FIELD_TEXT = 3,  /* text is a string */
} rmmc_field_kind_t;

typedef struct rmmc_field {
  const char *key; /* "reserved", "in_use", "peak", "limit", ... */
  rmmc_field_kind_t kind;
  uint64_t value;
  const char *text;
} rmmc_field_t;

/* Called once per figure; the field is valid only during the call. */
typedef void (*rmmc_field_cb)(void *ctx, const rmmc_field_t *field);

/* Calls `emit` for each figure the resource knows about itself (not its
 * upstream's). Keys used by the built-in resources, where they apply:
 * "reserved" (bytes taken from the upstream), "in_use" (bytes handed out),
 * "cached" (bytes held for reuse that release_cached may give back; a
 * resource that does not report it caches "reserved" minus "in_use"),
 * "peak", "limit" (the limiting adaptor's; the pool's is "maximum_size"),
 * "largest_free", "chunks", "outstanding". Thread-safe. */
RMMC_EXPORT void rmmc_resource_describe(rmmc_resource_t *r, rmmc_field_cb emit,
                                        void *ctx);

/* Looks up one figure by key through rmmc_resource_describe(); returns false
 * (and leaves *value alone) if the resource does not report it. The pool's
 * and the arena's figures are named after their options (maximum_size,
 * small_chunk, cache_size); the keys they had before (limit, span_size,
 * heap_cache) still find them here, though describe reports only the new
 * names. */
RMMC_EXPORT bool rmmc_resource_get_field(rmmc_resource_t *r, const char *key,
                                         uint64_t *value);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_RESOURCE_H */
