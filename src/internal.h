/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal helpers shared by the core, the resources and the adaptors.
 * Never installed. Non-static internal functions are named rmmc__*.
 */
#ifndef RMMC_INTERNAL_H
#define RMMC_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rmmc/report.h"
#include "rmmc/resource_ops.h"

#define RMMC_API RMMC_EXPORT

#define RMMC_MAX_DEVICES 64

#if defined(__GNUC__) || defined(__clang__)
#define RMMC_COLD __attribute__((cold, noinline))
#define RMMC_LIKELY(x) __builtin_expect(!!(x), 1)
#define RMMC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define RMMC_COLD
#define RMMC_LIKELY(x) (x)
#define RMMC_UNLIKELY(x) (x)
#endif

#define RMMC_CONTAINER_OF(ptr, type, member)                                   \
  ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline bool rmmc__is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Rounds x up to a multiple of the power of two a; the caller makes sure it
 * does not overflow (rmmc__align_up_checked does). */
static inline size_t rmmc__align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

static inline bool rmmc__align_up_checked(size_t x, size_t a, size_t *out) {
  if (x > SIZE_MAX - (a - 1)) return false;
  *out = rmmc__align_up(x, a);
  return true;
}

/* Relaxed atomic counters (statistics, figures read at any time). */
static inline uint64_t rmmc__atomic_load_u64(const uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline uint64_t rmmc__atomic_add_u64(uint64_t *p, uint64_t v) {
  return __atomic_add_fetch(p, v, __ATOMIC_RELAXED);
}
static inline uint64_t rmmc__atomic_sub_u64(uint64_t *p, uint64_t v) {
  return __atomic_sub_fetch(p, v, __ATOMIC_RELAXED);
}
/* Raises *p to at least v. */
static inline void rmmc__atomic_max_u64(uint64_t *p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v &&
         !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* Human-readable byte counts: the public rmmc_format_bytes (report.h). */
#define rmmc__format_bytes rmmc_format_bytes

/* Emits one field through a describe callback. */
void rmmc__emit_bytes(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v);
void rmmc__emit_count(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v);
void rmmc__emit_text(rmmc_field_cb emit, void *ctx, const char *key, const char *text);

/* Total physical host memory in bytes (0 if unknown). */
size_t rmmc__host_memory_total(void);

/* ---- thread-local nesting of the public wrappers ----
 * rmmc__call_depth counts the allocate wrappers this thread is inside (0:
 * none, the caller is the application), plus RMMC__NO_RETRY while a caching
 * layer calls its own upstream or a retry runs: the out-of-memory rule is
 * then someone else's (below). initial-exec: the hot path must not call
 * __tls_get_addr; 4 bytes fit the static TLS surplus even when the library
 * is dlopen'ed (PyTorch does), which bounds the library's whole TLS block. */
#if defined(__GNUC__) || defined(__clang__)
#define RMMC_TLS_FAST __attribute__((tls_model("initial-exec")))
#else
#define RMMC_TLS_FAST
#endif
extern _Thread_local int rmmc__call_depth RMMC_TLS_FAST;
#define RMMC__NO_RETRY (1 << 30)

/* The out-of-memory rule (resource.h, docs/design.md), applied where a
 * call enters resource r (the public wrapper, an adaptor's forward) and r's
 * allocate slot has just answered RMMC_ERROR_OUT_OF_MEMORY: if r caches
 * memory (figure "cached", or "reserved" above "in_use"), r's stack gives
 * back what it caches and the request is retried once. Returns the status
 * of the call (out of memory, unchanged, when nothing is cached). Cold. */
rmmc_status_t rmmc__allocate_after_release(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                           cudaStream_t stream, void **out);
/* A caching layer that applies the rule itself, under its own lock (the
 * pool), calls this before it answers RMMC_ERROR_OUT_OF_MEMORY: the
 * wrapper or forward that entered r then does not apply it a second time
 * (a second release and retry would find what the first did, and its note
 * would say twice that the cache was given back). Cleared by the next
 * failure of any allocate on the thread. */
void rmmc__oom_rule_applied(rmmc_resource_t *r);
/* The note an out-of-memory message gets once the rule has run, whether
 * the wrapper ran it or a layer under its own lock (the pool): the
 * layer's name as its argument. */
#define RMMC__RETRIED_NOTE \
  "; %s gave back its cached memory (and its upstream's) and the request was retried"

/* ---- adaptors ----
 * Every adaptor and sub-allocator embeds rmmc__adaptor_t first: it holds the
 * retained upstream and takes the upstream's memory kind and device. */
typedef struct rmmc__adaptor {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
} rmmc__adaptor_t;

/* Initializes the base with ops and retains upstream (which must not be
 * NULL; the caller checks and reports that with the adaptor's name). */
void rmmc__adaptor_init(rmmc__adaptor_t *a, const rmmc_resource_ops_t *ops,
                        rmmc_resource_t *upstream);
/* Releases the upstream. */
void rmmc__adaptor_fini(rmmc__adaptor_t *a);
/* The `upstream` slot shared by every adaptor. */
rmmc_resource_t *rmmc__adaptor_upstream(const rmmc_resource_t *r);
/* Checks the common arguments of an adaptor's _create call (NULL out or
 * upstream) and sets *out to NULL. */
rmmc_status_t rmmc__check_create(const char *what, const rmmc_resource_t *upstream,
                                 rmmc_resource_t **out);

static inline rmmc_resource_t *rmmc__upstream_of(rmmc_resource_t *r) {
  return ((rmmc__adaptor_t *)r)->upstream;
}

/* Checks the arguments (as rmmc__check_create), allocates a zeroed adaptor
 * struct of `struct_size` bytes (rmmc__adaptor_t first) and initializes it
 * with `ops`, retaining upstream. The caller fills its own fields; if it
 * then fails, it undoes this with rmmc__adaptor_fini and free. */
rmmc_status_t rmmc__adaptor_new(const char *what, const rmmc_resource_ops_t *ops,
                                rmmc_resource_t *upstream, size_t struct_size,
                                rmmc_resource_t **out);
/* An adaptor's calls of its upstream with the arguments its own slot got
 * (validated by the outermost public wrapper, src/resource.c), straight
 * through the upstream's slot: a second validation would find nothing, and
 * the wrapper's call depth still marks the outermost call. *out is NULL
 * after a failure, as the wrapper promises; an out of memory gets the
 * out-of-memory rule here, as in the wrapper, so that the adaptor (and
 * those above it) see one call with its final outcome. The only other
 * dispatch through an ops table. */
static inline rmmc_status_t rmmc__forward_allocate(const rmmc__adaptor_t *a, size_t bytes,
                                                   size_t alignment, cudaStream_t stream,
                                                   void **out) {
  rmmc_resource_t *up = a->upstream;
  rmmc_status_t st = up->ops->allocate(up, bytes, alignment, stream, out);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) {
    *out = NULL;
    if (st == RMMC_ERROR_OUT_OF_MEMORY && !(rmmc__call_depth & RMMC__NO_RETRY))
      st = rmmc__allocate_after_release(up, bytes, alignment, stream, out);
  }
  return st;
}

/* A caching layer's call of its upstream (or of its own parts: binning's
 * bins): rmmc_resource_allocate without the out-of-memory rule, which the
 * layer's own caller applies to the whole stack once the layer has tried
 * everything it knows (its growth fallbacks would otherwise flush the
 * upstream's cache at every speculative attempt). */
static inline rmmc_status_t rmmc__upstream_allocate(rmmc_resource_t *up, size_t bytes,
                                                    size_t alignment, cudaStream_t stream,
                                                    void **out) {
  int saved = rmmc__call_depth;
  rmmc__call_depth = saved | RMMC__NO_RETRY;
  rmmc_status_t st = rmmc_resource_allocate(up, bytes, alignment, stream, out);
  rmmc__call_depth = saved;
  return st;
}

static inline rmmc_status_t rmmc__forward_deallocate(const rmmc__adaptor_t *a, void *ptr,
                                                     size_t bytes, size_t alignment,
                                                     cudaStream_t stream) {
  rmmc_resource_t *up = a->upstream;
  return up->ops->deallocate(up, ptr, bytes, alignment, stream);
}

/* The `deallocate` slot of an adaptor that only passes frees through: the
 * same call on the upstream. */
rmmc_status_t rmmc__adaptor_forward_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                               size_t alignment, cudaStream_t stream);
/* Virtual-memory slots that pass every call to the upstream (an adaptor
 * that lets an expandable pool above it reach the base's virtual memory;
 * vm_page_size is the upstream's, 0 if it has none). */
size_t rmmc__adaptor_vm_page_size(const rmmc_resource_t *r);
rmmc_status_t rmmc__adaptor_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       void **out);
rmmc_status_t rmmc__adaptor_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes);
rmmc_status_t rmmc__adaptor_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes);
rmmc_status_t rmmc__adaptor_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes);

/* The `vm_set_access` slot of an adaptor with the virtual-memory slots
 * above: the same call on the upstream. */
rmmc_status_t rmmc__adaptor_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                          bool readwrite);
/* Can r give other devices access to its pages: has r, or the layer below
 * the adaptors that pass the call on, a vm_set_access slot? */
bool rmmc__vm_can_set_access(const rmmc_resource_t *r);

/* The `get_allocation` slot of an adaptor that hands out its upstream's
 * blocks unchanged: the same question to the upstream. */
rmmc_status_t rmmc__adaptor_get_allocation(rmmc_resource_t *r, const void *ptr,
                                           rmmc_allocation_t *out);

/* The `destroy` slot of an adaptor whose struct holds nothing to free
 * beyond the upstream reference: releases the upstream, frees the struct. */
void rmmc__adaptor_destroy(rmmc_resource_t *r);

/* ---- graph pools through caching layers (design rule 13) ----
 *
 * A layer that caches memory above a pool (fixed_size, and binning through
 * its bins) must not keep a graph pool's blocks in its cache, nor hand a
 * capture blocks of its cache: it passes the calls the pool routes to a
 * graph pool straight to its upstream. rmmc__graph_routes counts the graph
 * pools being routed to in the process; while it is 0 the question costs
 * one load. The pool installs the router (rmmc__graph_router: true when a
 * call on `stream` through `stack` reaches a pool that routes it to a graph
 * pool) before it first counts a route, so the layers below the pool in
 * the link order are not called from here (docs/design.md, "Layers"). */
typedef bool (*rmmc__graph_router_fn)(rmmc_resource_t *stack, cudaStream_t stream);
extern int rmmc__graph_routes;
void rmmc__set_graph_router(rmmc__graph_router_fn fn);
bool rmmc__graph_routed_slow(rmmc_resource_t *stack, cudaStream_t stream);
static inline bool rmmc__graph_routed(rmmc_resource_t *stack, cudaStream_t stream) {
  return RMMC_UNLIKELY(__atomic_load_n(&rmmc__graph_routes, __ATOMIC_RELAXED) > 0) &&
         rmmc__graph_routed_slow(stack, stream);
}

/* Copies a caller's options struct (whose first member is `size_t size`)
 * over the defaults in *dst (`dst_size` bytes): NULL keeps the defaults; a
 * size from sizeof(size_t) to dst_size (this struct or an older, shorter
 * one) copies that much. Anything else is RMMC_ERROR_INVALID_ARGUMENT
 * naming `what`: below, options not set with the _INIT macro; above, a
 * newer header's options (or garbage), refused rather than misread, since
 * this library cannot honour fields it does not know. Every create that
 * takes options checks them here, with one rule and one message. */
static inline rmmc_status_t rmmc__copy_options(const char *what, void *dst, size_t dst_size,
                                               const void *src) {
  if (src == NULL) return RMMC_SUCCESS;
  size_t size = *(const size_t *)src;
  if (size < sizeof(size_t) || size > dst_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: options size is %zu; this library knows sizes from %zu to %zu: "
                          "initialize the options with their _INIT macro",
                          what, size, sizeof(size_t), dst_size);
  memcpy(dst, src, size);
  *(size_t *)dst = dst_size;
  return RMMC_SUCCESS;
}

/* For the public accessors of one kind of resource: RMMC_SUCCESS if r was
 * made with `ops`, else RMMC_ERROR_INVALID_ARGUMENT with a message naming
 * `what`, the expected kind and the kind r is. */
rmmc_status_t rmmc__check_kind(const rmmc_resource_t *r, const rmmc_resource_ops_t *ops,
                               const char *what);

/* The calling thread's operating-system id (gettid on Linux), as RMM's logs
 * and reports show it. Cached per thread: one thread-local load. */
uint64_t rmmc__thread_id(void);

/* ---- CUDA helpers ----
 * Each returns a status after recording the error. */

/* True if the CUDA runtime sees at least one device; never fails. */
bool rmmc__cuda_available(void);

/* Is `device` the device of the calling thread's current context? One
 * driver call (cuCtxGetDevice), no error set; false when unsure (no
 * context yet, no driver table). */
bool rmmc__device_is_current(int device);

/* Makes `device` current for the calling thread and remembers the previous
 * one in *saved (-1 if nothing had to change). Asks the driver first
 * (rmmc__device_is_current), the runtime only when that says no. */
rmmc_status_t rmmc__device_push(int device, int *saved);
void rmmc__device_pop(int saved);

/* Can kernels on `peer` be given access to the memory of `device`? Checks
 * that peer exists, differs from device and has a peer path to it
 * (cudaDeviceCanAccessPeer); RMMC_ERROR_INVALID_ARGUMENT,
 * RMMC_ERROR_NOT_SUPPORTED or RMMC_ERROR_NO_DEVICE with a message that
 * starts with `what` and names both devices otherwise. */
rmmc_status_t rmmc__check_peer(const char *what, int device, int peer);
/* For memory that every device reaches without a grant (managed, pinned):
 * peer exists, differs from device (-1: none) and has device attribute
 * `attr`; RMMC_ERROR_NOT_SUPPORTED with "device <peer> <lacking>"
 * otherwise. */
rmmc_status_t rmmc__check_peer_attribute(const char *what, int device, int peer,
                                         enum cudaDeviceAttr attr, const char *lacking);

/* Resolves -1 to the current device and checks the id. */
rmmc_status_t rmmc__resolve_device(int device, int *out);

/* Allocates and initializes a base resource of `struct_size` bytes for
 * `device` (-1: current) after checking that a GPU is there; the struct is
 * zeroed past the base. For the resources that talk to CUDA directly. */
rmmc_status_t rmmc__device_resource_new(const char *what, int device,
                                        const rmmc_resource_ops_t *ops,
                                        rmmc_memory_kind_t kind, size_t struct_size,
                                        rmmc_resource_t **out);

/* Base CUDA resources give 256-byte alignment and no more. */
static inline rmmc_status_t rmmc__check_base_alignment(const rmmc_resource_t *r,
                                                       size_t alignment) {
  if (RMMC_LIKELY(alignment <= RMMC_DEFAULT_ALIGNMENT)) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "%s resource gives 256-byte alignment, not %zu: stack an aligned "
                        "adaptor or a pool on it",
                        r->ops->name, alignment);
}

/* Slots shared by the resources that free with cudaFree (cuda, managed):
 * cudaFree on the resource's device, a pointer CUDA does not know being
 * RMMC_ERROR_UNKNOWN_POINTER; equal when of the same device. */
rmmc_status_t rmmc__cudafree_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream);
bool rmmc__same_device_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b);

/* Stream name for messages ("default", "per-thread", or the pointer). */
const char *rmmc__stream_name(cudaStream_t stream, char *buf, size_t len);

/* This thread's error state (message and raw CUDA error), saved so that a
 * layer that runs code of its own after a failure (a failure callback) can
 * hand the original failure back unchanged. */
#define RMMC__MESSAGE_MAX 1024
typedef struct rmmc__error_state {
  char message[RMMC__MESSAGE_MAX];
  cudaError_t cuda_error;
} rmmc__error_state_t;
void rmmc__error_save(rmmc__error_state_t *state);
void rmmc__error_restore(const rmmc__error_state_t *state);
/* The error state as it was when the outermost allocate of this thread
 * began (status.c keeps it at the first failure inside the call): puts it
 * back and returns true, or returns false when nothing inside the call
 * wrote one. Either way it is then forgotten. */
bool rmmc__error_restore_call_start(void);
/* Forgets it (the call ends with a failure of its own). */
void rmmc__error_forget_call_start(void);

/* Writes this thread's message for rmmc_set_oom_error() (which adds a
 * device's free memory to it); leaves the last CUDA error alone. */
void rmmc__set_oom_message(const rmmc_resource_t *r, size_t bytes, cudaStream_t stream,
                           const char *detail, va_list ap);

/* Appends to this thread's error message. */
void rmmc__append_error(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Builds device `device`'s default resource (registry, first use). */
rmmc_status_t rmmc__create_default_resource(int device, rmmc_resource_t **out);

/* Records that CUDA refused to free a pointer it does not know:
 * RMMC_ERROR_UNKNOWN_POINTER, keeping err as the last CUDA error. */
rmmc_status_t rmmc__unknown_cuda_pointer(const rmmc_resource_t *r, cudaError_t err,
                                         const char *what, const void *ptr);


#endif /* RMMC_INTERNAL_H */
