/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writing a memory resource.
 *
 * A resource is a struct whose first member is an rmmc_resource_t; the
 * rmmc_resource_t points to a const ops table. Fill the table with
 * designated initializers, set .version to RMMC_RESOURCE_OPS_VERSION, and
 * call rmmc_resource_init() on the embedded base before handing the resource
 * out. The library calls the slots only through its own wrappers
 * (rmmc_resource_allocate() and friends), after validating the arguments, so
 * a slot never sees a NULL resource, a NULL out-pointer, 0 bytes, a NULL
 * pointer to free, or an alignment that is not a power of two below 256.
 *
 * Growth. Slots are only ever appended, grouped by the version that added
 * them; the library reads a slot only if the table's version is at least the
 * slot's version, so a table built against an older header keeps working.
 * examples/custom_resource.c writes a complete resource.
 */
#ifndef RMMC_RESOURCE_OPS_H
#define RMMC_RESOURCE_OPS_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RMMC_RESOURCE_OPS_VERSION 4

typedef struct rmmc_resource_ops {
  /* RMMC_RESOURCE_OPS_VERSION of the header the table was built with. */
  int version;
  /* Short name, used in reports, messages and stack specs. Required. */
  const char *name;

  /* ---- version 1 ---- */

  /* Required. bytes > 0; alignment is a power of two >= 256. Stores the
   * pointer in *out and returns RMMC_SUCCESS, or returns an error status
   * (after rmmc_set_error() or rmmc_set_oom_error()) and leaves *out alone.
   * Must be thread-safe. */
  rmmc_status_t (*allocate)(rmmc_resource_t *r, size_t bytes, size_t alignment,
                            cudaStream_t stream, void **out);

  /* Required. ptr != NULL, bytes and alignment as given to allocate. On
   * RMMC_ERROR_UNKNOWN_POINTER the resource must not have changed. */
  rmmc_status_t (*deallocate)(rmmc_resource_t *r, void *ptr, size_t bytes,
                              size_t alignment, cudaStream_t stream);

  /* Optional (NULL: only a resource is equal to itself). Called only for two
   * resources with the same ops table. */
  bool (*is_equal)(const rmmc_resource_t *a, const rmmc_resource_t *b);

  /* Optional (NULL: nothing is cached; adaptors with an upstream slot get
   * the call forwarded). Gives cached, unused memory back upstream, then
   * calls rmmc_resource_release_cached() on its upstream. A resource that
   * caches also reports how much through describe ("cached", or "reserved"
   * and "in_use"): the out-of-memory rule (resource.h) calls this slot when
   * the resource fails an allocation for memory while it caches, then
   * retries the request. Called with no lock of the resource's own held. */
  rmmc_status_t (*release_cached)(rmmc_resource_t *r);

  /* Optional. Emits the resource's own figures (resource.h lists keys). */
  void (*describe)(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx);

  /* Required. Frees everything the resource holds, releases its upstream
   * (rmmc_resource_release) and frees the struct. Called once, by the last
   * rmmc_resource_release(). */
  void (*destroy)(rmmc_resource_t *r);

  /* Optional. The upstream, borrowed, or NULL. */
  rmmc_resource_t *(*upstream)(const rmmc_resource_t *r);

  /* ---- version 2: virtual memory (optional: all five slots or none) ----
   *
   * Address space reserved first and backed with memory page by page, so a
   * sub-allocator can grow a range in place and give back the pages inside
   * it that no block uses (resource.h, "Virtual memory", has the contract
   * the wrappers check). */

  /* The page size: a power of two; every range below is aligned to it. */
  size_t (*vm_page_size)(const rmmc_resource_t *r);
  /* Reserves `bytes` of address space with nothing behind it, starting at
   * a multiple of `alignment` (a power of two, at least the page size). */
  rmmc_status_t (*vm_reserve)(rmmc_resource_t *r, size_t bytes, size_t alignment, void **out);
  /* Gives back a whole reservation; no page of it is mapped. */
  rmmc_status_t (*vm_unreserve)(rmmc_resource_t *r, void *ptr, size_t bytes);
  /* Backs [ptr, ptr + bytes), unmapped and inside one reservation, with
   * memory the resource's device can read and write. On failure nothing is
   * mapped (RMMC_ERROR_OUT_OF_MEMORY when memory ran out). */
  rmmc_status_t (*vm_map)(rmmc_resource_t *r, void *ptr, size_t bytes);
  /* Takes back the memory of exactly one range given to vm_map. */
  rmmc_status_t (*vm_unmap)(rmmc_resource_t *r, void *ptr, size_t bytes);

  /* ---- version 3: allocation queries and memory hooks (optional) ---- */

  /* ptr != NULL, out->size checked. Fills *out for the block holding ptr
   * (resource.h, rmmc_resource_get_allocation: base, bytes, resource = r,
   * backing, upstream, mappings up to out->max_mappings and nmappings);
   * RMMC_ERROR_UNKNOWN_POINTER if none of r's live blocks holds it. An
   * adaptor that hands out its upstream's blocks unchanged sets it to pass
   * the question on (the library's adaptors do). NULL: the question is
   * answered with RMMC_ERROR_NOT_SUPPORTED. */
  rmmc_status_t (*get_allocation)(rmmc_resource_t *r, const void *ptr, rmmc_allocation_t *out);

  /* hooks == NULL removes them; otherwise a copy of a checked struct. Takes
   * the hooks for the memory r takes from its upstream (resource.h,
   * rmmc_resource_set_memory_hooks: the old hooks' on_release and the new
   * ones' on_acquire for every range held now). NULL: the call goes to the
   * upstream, or is RMMC_ERROR_NOT_SUPPORTED without one. */
  rmmc_status_t (*set_memory_hooks)(rmmc_resource_t *r, const rmmc_memory_hooks_t *hooks);

  /* ---- version 4: peer access (optional) ---- */

  /* peer_device in [0, 64) and not r's own device (checked). Lets kernels
   * on peer_device reach the memory r hands out, now and from now on
   * (resource.h, rmmc_resource_enable_peer_access); enabling a peer twice
   * succeeds. A layer whose memory comes from its upstream passes the call
   * down itself (rmmc_resource_enable_peer_access on the upstream) before
   * doing its own part, and on failure leaves its own state as it was.
   * NULL: the call goes to the upstream, or is RMMC_ERROR_NOT_SUPPORTED
   * without one. */
  rmmc_status_t (*enable_peer_access)(rmmc_resource_t *r, int peer_device);

  /* With the virtual-memory slots; optional even then. [ptr, ptr + bytes)
   * is one or more whole ranges given to vm_map, contiguous; device in
   * [0, 64), not r's own (checked). Grants `device` read and write access
   * to it (readwrite), or takes that access back (!readwrite). On failure
   * the range's access is as it was. NULL: RMMC_ERROR_NOT_SUPPORTED (a pool
   * over the resource cannot then let other devices reach its pages). */
  rmmc_status_t (*vm_set_access)(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                 bool readwrite);
} rmmc_resource_ops_t;

/* The base every resource embeds as its first member. Fields are set by
 * rmmc_resource_init() and read through the accessors of resource.h. */
struct rmmc_resource {
  const rmmc_resource_ops_t *ops;
  long refcount; /* atomic; only retain/release touch it */
  rmmc_memory_kind_t kind;
  int device;
};

/* Initializes the embedded base with one reference. */
RMMC_EXPORT void rmmc_resource_init(rmmc_resource_t *r,
                                    const rmmc_resource_ops_t *ops,
                                    rmmc_memory_kind_t kind, int device);

/* Records a failure on this thread: sets the thread-local message
 * (printf-style) and returns `status`, so a slot can
 * `return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "...", ...)`. */
RMMC_EXPORT rmmc_status_t rmmc_set_error(rmmc_status_t status, const char *fmt,
                                         ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Records a CUDA failure: RMMC_ERROR_OUT_OF_MEMORY for
 * cudaErrorMemoryAllocation, RMMC_ERROR_CUDA otherwise; keeps `err` as the
 * last CUDA error; the message names `what` and CUDA's own text. Clears
 * CUDA's sticky-free last error so it does not leak into later calls. */
RMMC_EXPORT rmmc_status_t rmmc_set_cuda_error(cudaError_t err,
                                              const char *what);

/* Records an out-of-memory failure of resource r for `bytes` on `stream`
 * with a message in the style of PyTorch's: the request, the device, the
 * stream, the resource, the `detail` given (printf-style; may be NULL) and,
 * for device memory, the device's free and total memory. Returns
 * RMMC_ERROR_OUT_OF_MEMORY. */
RMMC_EXPORT rmmc_status_t rmmc_set_oom_error(const rmmc_resource_t *r,
                                             size_t bytes, cudaStream_t stream,
                                             const char *detail, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* RMMC_RESOURCE_OPS_H */
