/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Resource dispatch: the only place that calls through an ops table.
 *
 * The wrappers validate arguments once (NULL resource or out-pointer, 0
 * bytes, alignment, size overflow), normalize the alignment to at least 256,
 * and add what every resource shares: the out-of-memory rule and the stack
 * figures in an out-of-memory message at the outermost call, the forwarding
 * of release_cached through adaptors, reference counting.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/exports.h"
#include "base/internal.h"

RMMC_API void rmmc_resource_init(rmmc_resource_t *r, const rmmc_resource_ops_t *ops,
                                 rmmc_memory_kind_t kind, int device) {
  r->ops = ops;
  r->refcount = 1;
  r->kind = kind;
  r->device = device;
}

RMMC_API const char *rmmc_memory_kind_name(rmmc_memory_kind_t kind) {
  switch (kind) {
  case RMMC_MEMORY_DEVICE: return "device";
  case RMMC_MEMORY_HOST: return "host";
  case RMMC_MEMORY_PINNED: return "pinned";
  case RMMC_MEMORY_MANAGED: return "managed";
  }
  return "unknown";
}

RMMC_API bool rmmc_memory_kind_is_device_accessible(rmmc_memory_kind_t kind) {
  return kind == RMMC_MEMORY_DEVICE || kind == RMMC_MEMORY_PINNED ||
         kind == RMMC_MEMORY_MANAGED;
}

RMMC_API bool rmmc_memory_kind_is_host_accessible(rmmc_memory_kind_t kind) {
  return kind == RMMC_MEMORY_HOST || kind == RMMC_MEMORY_PINNED ||
         kind == RMMC_MEMORY_MANAGED;
}

/* Adds what the stack knows to an out-of-memory message: each layer's
 * reserved and in-use figures, outermost first. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline, cold))
#endif
static void append_stack_figures(rmmc_resource_t *r) {
  rmmc__append_error("; stack:");
  for (int depth = 0; r != NULL && depth < 16; depth++, r = rmmc_resource_upstream(r)) {
    uint64_t reserved = 0, in_use = 0;
    char a[32], b[32];
    bool has_reserved = rmmc_resource_get_field(r, RMMC__FIG(RESERVED), &reserved);
    bool has_in_use = rmmc_resource_get_field(r, RMMC__FIG(IN_USE), &in_use);
    rmmc__append_error("%s %s", depth ? " >" : "", r->ops->name);
    if (has_reserved)
      rmmc__append_error(" (reserved %s", rmmc__format_bytes(reserved, a, sizeof a));
    if (has_in_use)
      rmmc__append_error("%sin use %s)", has_reserved ? ", " : " (",
                         rmmc__format_bytes(in_use, b, sizeof b));
    else if (has_reserved)
      rmmc__append_error(")");
  }
}

typedef struct cache_figures {
  uint64_t value[RMMC__FIG_COUNT]; /* the first of each standard byte figure */
  bool has[RMMC__FIG_COUNT];
} cache_figures_t;

static void cache_cb(void *ctx, const rmmc_field_t *f) {
  cache_figures_t *c = ctx;
  if (f->kind != RMMC_FIELD_BYTES) return;
  rmmc__figure_t k = rmmc__figure_of(f->key);
  if (k != RMMC__FIG_COUNT && !c->has[k]) {
    c->value[k] = f->value;
    c->has[k] = true;
  }
}

/* Does r itself cache memory? It says so with the figure "cached", or else
 * with "reserved" above "in_use" (resource.h); one that reports neither
 * (adaptors, base resources) caches nothing. */
static bool caches(rmmc_resource_t *r) {
  cache_figures_t c;
  memset(&c, 0, sizeof c);
  rmmc_resource_describe(r, cache_cb, &c);
  enum { CACHED = RMMC__FIG_CACHED, RESERVED = RMMC__FIG_RESERVED, IN_USE = RMMC__FIG_IN_USE };
  return c.has[CACHED] ? c.value[CACHED] > 0
                       : c.has[RESERVED] && c.has[IN_USE] && c.value[RESERVED] > c.value[IN_USE];
}

/* The out-of-memory rule (internal.h; docs/design.md says why here). r is
 * a layer that caches, entered by its caller (the application, an adaptor)
 * and not by a caching layer above it, which would apply the rule itself:
 * r has tried everything it knows, so its stack gives back what it caches
 * (r's release_cached gives back r's own free memory, then forwards, so
 * what r hands to a caching upstream goes further down too) and the
 * request is retried once, even if the release failed part way (what it
 * gave back may be enough). Neither the release nor the retry applies the
 * rule again (RMMC__NO_RETRY). A retry that succeeds leaves the thread's
 * error state as it was before the outermost call; one that fails says it
 * retried. */
static _Thread_local rmmc_resource_t *rule_applied_by;

RMMC_COLD void rmmc__oom_rule_applied(rmmc_resource_t *r) { rule_applied_by = r; }

RMMC_COLD rmmc_status_t rmmc__allocate_after_release(rmmc_resource_t *r, size_t bytes,
                                                     size_t alignment, cudaStream_t stream,
                                                     void **out) {
  rmmc_resource_t *applied = rule_applied_by;
  rule_applied_by = NULL;
  if (applied == r || !caches(r)) return RMMC_ERROR_OUT_OF_MEMORY;
  int saved = rmmc__call_depth;
  rmmc__call_depth = (saved + 1) | RMMC__NO_RETRY; /* the release and the retry belong to the call */
  rmmc_status_t rst = rmmc_resource_release_cached(r);
  char why[200];
  if (rst != RMMC_SUCCESS) snprintf(why, sizeof why, "%s", rmmc_last_error_message());
  rmmc_status_t st = r->ops->allocate(r, bytes, alignment, stream, out);
  rmmc__call_depth = saved;
  if (st == RMMC_SUCCESS) {
    (void)rmmc__error_restore_call_start();
    return st;
  }
  *out = NULL;
  if (st == RMMC_ERROR_OUT_OF_MEMORY)
    rmmc__append_error(RMMC__RETRIED_NOTE, r->ops->name);
  if (rst != RMMC_SUCCESS) rmmc__append_error(" (giving it back failed: %s)", why);
  return st;
}

/* The outermost allocate failed: an out-of-memory message gets the stack's
 * figures; the error state kept for a retry is forgotten. */
RMMC_COLD static void outermost_failure(rmmc_resource_t *r, rmmc_status_t st) {
  rmmc__error_forget_call_start();
  if (st == RMMC_ERROR_OUT_OF_MEMORY) append_stack_figures(r);
}

RMMC_API rmmc_status_t rmmc_resource_allocate(rmmc_resource_t *r, size_t bytes,
                                              size_t alignment, cudaStream_t stream,
                                              void **out) {
  if (RMMC_UNLIKELY(out == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "allocate: out-pointer is NULL");
  *out = NULL;
  if (RMMC_UNLIKELY(r == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "allocate: resource is NULL");
  if (RMMC_UNLIKELY(!rmmc__is_pow2(alignment)))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "allocate: alignment %zu is not a power of two", alignment);
  if (alignment < RMMC_DEFAULT_ALIGNMENT) alignment = RMMC_DEFAULT_ALIGNMENT;
  if (bytes == 0) return RMMC_SUCCESS;
  if (RMMC_UNLIKELY(bytes > SIZE_MAX - (alignment - 1)))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "allocate: %zu bytes overflows when rounded to alignment %zu",
                          bytes, alignment);
  rmmc__call_depth++;
  rmmc_status_t st = r->ops->allocate(r, bytes, alignment, stream, out);
  rmmc__call_depth--;
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) {
    *out = NULL;
    if (st == RMMC_ERROR_OUT_OF_MEMORY && !(rmmc__call_depth & RMMC__NO_RETRY))
      st = rmmc__allocate_after_release(r, bytes, alignment, stream, out);
    rule_applied_by = NULL; /* whoever it was meant for has seen the failure */
    if (st != RMMC_SUCCESS && rmmc__call_depth == 0) outermost_failure(r, st);
  } else if (RMMC_UNLIKELY(rmmc__call_start_kept) && rmmc__call_depth == 0) {
    /* A failure on the way was overcome: a call that succeeds leaves the
     * thread's error state as it was (status.h). */
    (void)rmmc__error_restore_call_start();
  }
  return st;
}

RMMC_API rmmc_status_t rmmc_resource_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                                size_t alignment, cudaStream_t stream) {
  if (RMMC_UNLIKELY(r == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "deallocate: resource is NULL");
  if (RMMC_UNLIKELY(!rmmc__is_pow2(alignment)))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "deallocate: alignment %zu is not a power of two", alignment);
  if (ptr == NULL) return RMMC_SUCCESS;
  if (RMMC_UNLIKELY(bytes == 0))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "deallocate: %p with 0 bytes (allocate(0) returns NULL)", ptr);
  if (alignment < RMMC_DEFAULT_ALIGNMENT) alignment = RMMC_DEFAULT_ALIGNMENT;
  /* A block exported to other processes: its handles go stale before it can
   * be reused (exports.h). One relaxed load while nothing is exported. */
  if (RMMC_UNLIKELY(__atomic_load_n(&rmmc__exports_count, __ATOMIC_RELAXED) != 0))
    rmmc__exports_on_free(ptr);
  return r->ops->deallocate(r, ptr, bytes, alignment, stream);
}

RMMC_API rmmc_status_t rmmc_resource_allocate_sync(rmmc_resource_t *r, size_t bytes, void **out) {
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, RMMC_DEFAULT_ALIGNMENT, NULL, out);
  if (st != RMMC_SUCCESS || *out == NULL || r->kind == RMMC_MEMORY_HOST) return st;
  cudaError_t err = cudaStreamSynchronize(NULL);
  if (err != cudaSuccess) {
    rmmc_status_t cst = rmmc_set_cuda_error(err, "allocate_sync: cudaStreamSynchronize");
    (void)rmmc_resource_deallocate(r, *out, bytes, RMMC_DEFAULT_ALIGNMENT, NULL);
    *out = NULL;
    return cst;
  }
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_resource_deallocate_sync(rmmc_resource_t *r, void *ptr, size_t bytes) {
  if (r != NULL && ptr != NULL && r->kind != RMMC_MEMORY_HOST) {
    int saved;
    rmmc_status_t st = rmmc__device_push(r->device, &saved);
    if (st != RMMC_SUCCESS) return st;
    cudaError_t err = cudaDeviceSynchronize();
    rmmc__device_pop(saved);
    if (err != cudaSuccess) return rmmc_set_cuda_error(err, "deallocate_sync: cudaDeviceSynchronize");
  }
  return rmmc_resource_deallocate(r, ptr, bytes, RMMC_DEFAULT_ALIGNMENT, NULL);
}

RMMC_API rmmc_resource_t *rmmc_resource_retain(rmmc_resource_t *r) {
  if (r != NULL) __atomic_add_fetch(&r->refcount, 1, __ATOMIC_RELAXED);
  return r;
}

/* ---- RMMC_CHECK_RELEASE ---- */

/* RMMC_CHECK_RELEASE=1: say on stderr when the last reference to a
 * resource that still has blocks out is released.
 *
 * Releasing a stack frees what it holds, the blocks handed out included,
 * under whoever still uses them: a use-after-free the program did not ask
 * for, and the usual cause a leak checker shows nothing. rmmc never prints
 * unless asked (the library's rule), so the check is off unless the
 * environment asks, read once. In a cascade (releasing a stack destroys
 * each layer), the outermost layer with live blocks is reported, not the
 * layers under it (their figures count the same blocks again); a layer
 * that reports neither "outstanding" nor "in_use" (cuda, host) is never
 * reported.
 */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool enabled;
static _Thread_local int depth;    /* releases in progress on this thread (a cascade) */
static _Thread_local int reported; /* the depth whose layer was reported, or 0 */

static void read_env(void) {
  const char *v = getenv("RMMC_CHECK_RELEASE");
  enabled = v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0 ||
                          strcmp(v, "yes") == 0 || strcmp(v, "on") == 0);
}

static bool release_check_begin(rmmc_resource_t *r) {
  pthread_once(&env_once, read_env);
  if (!enabled) return false;
  depth++;
  if (reported != 0) return true; /* an outer layer said it for these blocks */
  uint64_t count = 0, bytes = 0;
  bool has_count = rmmc_resource_get_field(r, RMMC__FIG(OUTSTANDING), &count);
  bool has_bytes = rmmc_resource_get_field(r, RMMC__FIG(IN_USE), &bytes);
  if ((has_count && count > 0) || (has_bytes && bytes > 0)) {
    char b[32], what[96] = "";
    if (has_count) snprintf(what, sizeof what, "%llu block%s", (unsigned long long)count, count == 1 ? "" : "s");
    if (has_bytes)
      snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s", has_count ? ", " : "",
               rmmc__format_bytes(bytes, b, sizeof b));
    fprintf(stderr,
            "rmmc: releasing the last reference to a %s resource with %s still allocated through "
            "it: they are freed with it (RMMC_CHECK_RELEASE)\n",
            rmmc_resource_name(r), what);
    reported = depth;
  }
  return true;
}

static void release_check_end(bool begun) {
  if (!begun) return;
  if (reported == depth) reported = 0;
  depth--;
}


RMMC_API void rmmc_resource_release(rmmc_resource_t *r) {
  if (r == NULL) return;
  if (__atomic_sub_fetch(&r->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    bool checked = release_check_begin(r); /* RMMC_CHECK_RELEASE=1: live blocks? */
    if (__atomic_load_n(&rmmc__exports_count, __ATOMIC_RELAXED) != 0)
      rmmc__exports_forget_owner(r); /* its blocks die with it */
    r->ops->destroy(r);
    release_check_end(checked);
  }
}

RMMC_API long rmmc_resource_refcount(const rmmc_resource_t *r) {
  return r == NULL ? 0 : __atomic_load_n(&r->refcount, __ATOMIC_RELAXED);
}

RMMC_API bool rmmc_resource_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  if (a == b) return true;
  if (a == NULL || b == NULL || a->ops != b->ops || a->ops->is_equal == NULL) return false;
  return a->ops->is_equal(a, b);
}

RMMC_API rmmc_status_t rmmc_resource_release_cached(rmmc_resource_t *r) {
  if (r == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "release_cached: resource is NULL");
  if (r->ops->release_cached != NULL) return r->ops->release_cached(r);
  rmmc_resource_t *up = rmmc_resource_upstream(r);
  return up != NULL ? rmmc_resource_release_cached(up) : RMMC_SUCCESS;
}

RMMC_API const char *rmmc_resource_name(const rmmc_resource_t *r) {
  return r == NULL ? "(null)" : r->ops->name;
}

RMMC_API rmmc_memory_kind_t rmmc_resource_memory_kind(const rmmc_resource_t *r) {
  return r == NULL ? (rmmc_memory_kind_t)0 : r->kind;
}

RMMC_API int rmmc_resource_device(const rmmc_resource_t *r) { return r == NULL ? -1 : r->device; }

RMMC_API rmmc_resource_t *rmmc_resource_upstream(const rmmc_resource_t *r) {
  if (r == NULL || r->ops->upstream == NULL) return NULL;
  return r->ops->upstream(r);
}

/* ---- virtual memory ---- */

RMMC_API size_t rmmc_resource_vm_page_size(const rmmc_resource_t *r) {
  if (r == NULL || r->ops->version < 2 || r->ops->vm_page_size == NULL) return 0;
  return r->ops->vm_page_size(r);
}

/* Checks r and the range [ptr, ptr + bytes) (ptr may be NULL: not given). */
static rmmc_status_t vm_check(const char *what, const rmmc_resource_t *r, const void *ptr,
                              size_t bytes) {
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: resource is NULL", what);
  size_t page = rmmc_resource_vm_page_size(r);
  if (page == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "%s: %s has no virtual memory", what,
                          r->ops->name);
  if (bytes == 0 || bytes % page != 0 || (uintptr_t)ptr % page != 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: %p + %zu bytes is not a non-empty range of whole %zu-byte pages",
                          what, ptr, bytes, page);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_resource_vm_reserve(rmmc_resource_t *r, size_t bytes,
                                                size_t alignment, void **out) {
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "vm_reserve: out-pointer is NULL");
  *out = NULL;
  rmmc_status_t st = vm_check("vm_reserve", r, NULL, bytes);
  if (st != RMMC_SUCCESS) return st;
  size_t page = rmmc_resource_vm_page_size(r);
  if (alignment < page) alignment = page;
  if (!rmmc__is_pow2(alignment) || alignment > ((size_t)1 << 40))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "vm_reserve: alignment %zu is not a power of two up to 1 TiB", alignment);
  st = r->ops->vm_reserve(r, bytes, alignment, out);
  if (st != RMMC_SUCCESS) *out = NULL;
  return st;
}

/* vm_check for a range that must be given (not NULL). */
static rmmc_status_t vm_range_check(const char *what, const rmmc_resource_t *r, const void *ptr,
                                    size_t bytes) {
  rmmc_status_t st = vm_check(what, r, ptr, bytes);
  if (st == RMMC_SUCCESS && ptr == NULL)
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: pointer is NULL", what);
  return st;
}

RMMC_API rmmc_status_t rmmc_resource_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  rmmc_status_t st = vm_range_check("vm_unreserve", r, ptr, bytes);
  return st == RMMC_SUCCESS ? r->ops->vm_unreserve(r, ptr, bytes) : st;
}

RMMC_API rmmc_status_t rmmc_resource_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  rmmc_status_t st = vm_range_check("vm_map", r, ptr, bytes);
  return st == RMMC_SUCCESS ? r->ops->vm_map(r, ptr, bytes) : st;
}

RMMC_API rmmc_status_t rmmc_resource_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  rmmc_status_t st = vm_range_check("vm_unmap", r, ptr, bytes);
  return st == RMMC_SUCCESS ? r->ops->vm_unmap(r, ptr, bytes) : st;
}

/* A peer device named to r: in [0, 64) and not r's own. */
static rmmc_status_t peer_check(const char *what, const rmmc_resource_t *r, int device) {
  if (device < 0 || device >= RMMC_MAX_DEVICES)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range [0, %d)",
                          what, device, RMMC_MAX_DEVICES);
  if (device == r->device)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: device %d cannot be its own peer: the %s stack's memory is device "
                          "%d's already",
                          what, device, r->ops->name, r->device);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_resource_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes,
                                                   int device, bool readwrite) {
  rmmc_status_t st = vm_range_check("vm_set_access", r, ptr, bytes);
  if (st == RMMC_SUCCESS) st = peer_check("vm_set_access", r, device);
  if (st != RMMC_SUCCESS) return st;
  if (r->ops->version < 4 || r->ops->vm_set_access == NULL)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "vm_set_access: %s cannot give other devices access to its pages",
                          r->ops->name);
  return r->ops->vm_set_access(r, ptr, bytes, device, readwrite);
}

/* ---- allocation queries and memory hooks (version 3) ---- */

static void allocation_clear(rmmc_allocation_t *out) {
  out->base = NULL;
  out->bytes = 0;
  out->resource = NULL;
  out->backing = (rmmc_backing_t)0;
  out->upstream = (rmmc_range_t){NULL, 0};
  out->nmappings = 0;
}

RMMC_API rmmc_status_t rmmc_resource_get_allocation(rmmc_resource_t *r, const void *ptr,
                                                    rmmc_allocation_t *out) {
  if (out == NULL || out->size < sizeof(rmmc_allocation_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "get_allocation: the allocation struct is NULL or its size is not set "
                          "(initialize it with RMMC_ALLOCATION_INIT)");
  allocation_clear(out);
  if (r == NULL || ptr == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "get_allocation: %s is NULL",
                          r == NULL ? "the resource" : "the pointer");
  if (out->mappings == NULL && out->max_mappings > 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "get_allocation: max_mappings is %zu but mappings is NULL",
                          out->max_mappings);
  if (r->ops->version < 3 || r->ops->get_allocation == NULL)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "get_allocation: a %s resource cannot tell which of its blocks holds "
                          "a pointer",
                          r->ops->name);
  rmmc_status_t st = r->ops->get_allocation(r, ptr, out);
  if (st != RMMC_SUCCESS) allocation_clear(out);
  return st;
}

RMMC_API rmmc_status_t rmmc_resource_set_memory_hooks(rmmc_resource_t *r,
                                                      const rmmc_memory_hooks_t *hooks) {
  if (r == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "set_memory_hooks: resource is NULL");
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  if (hooks != NULL) {
    if (hooks->size < sizeof(rmmc_memory_hooks_t))
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "set_memory_hooks: hooks->size is %zu: initialize the hooks with "
                            "RMMC_MEMORY_HOOKS_INIT",
                            hooks->size);
    h.on_acquire = hooks->on_acquire;
    h.on_release = hooks->on_release;
    h.user = hooks->user;
  }
  const rmmc_memory_hooks_t *arg =
      h.on_acquire == NULL && h.on_release == NULL ? NULL : &h;
  for (rmmc_resource_t *x = r; x != NULL; x = rmmc_resource_upstream(x))
    if (x->ops->version >= 3 && x->ops->set_memory_hooks != NULL)
      return x->ops->set_memory_hooks(x, arg);
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "set_memory_hooks: no layer of this %s stack reports the memory it takes "
                        "from the system (a pool does: stack one on it)",
                        r->ops->name);
}

/* ---- peer access (version 4) ---- */

RMMC_API rmmc_status_t rmmc_resource_enable_peer_access(rmmc_resource_t *r, int peer_device) {
  if (r == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "enable_peer_access: resource is NULL");
  rmmc_status_t st = peer_check("enable_peer_access", r, peer_device);
  if (st != RMMC_SUCCESS) return st;
  rmmc_resource_t *base = r;
  for (rmmc_resource_t *x = r; x != NULL; base = x, x = rmmc_resource_upstream(x))
    if (x->ops->version >= 4 && x->ops->enable_peer_access != NULL)
      return x->ops->enable_peer_access(x, peer_device);
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "enable_peer_access: device %d cannot be given access to the memory of "
                        "this %s stack: its base, %s, %s",
                        peer_device, r->ops->name, base->ops->name,
                        base->kind == RMMC_MEMORY_HOST
                            ? "hands out host memory, which kernels cannot reach"
                            : "cannot make its memory reachable from another device (a "
                              "resource of your own needs the enable_peer_access slot, ops "
                              "table version 4)");
}

RMMC_API void rmmc_resource_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  if (r == NULL || emit == NULL || r->ops->describe == NULL) return;
  r->ops->describe(r, emit, ctx);
}

struct field_lookup {
  const char *key;
  uint64_t value;
  bool found;
};

static void lookup_cb(void *ctx, const rmmc_field_t *f) {
  struct field_lookup *l = ctx;
  if (!l->found && f->kind != RMMC_FIELD_TEXT && strcmp(f->key, l->key) == 0) {
    l->value = f->value;
    l->found = true;
  }
}

/* Figure keys the pool reported before they were named after its options:
 * callers of get_field may have them in code. */
static const char *const renamed_keys[][2] = {
    {"limit", "maximum_size"},
    {"span_size", "small_chunk"},
    {"heap_cache", "cache_size"},
};

RMMC_API bool rmmc_resource_get_field(rmmc_resource_t *r, const char *key, uint64_t *value) {
  if (key == NULL || value == NULL) return false;
  struct field_lookup l = {key, 0, false};
  rmmc_resource_describe(r, lookup_cb, &l);
  for (size_t i = 0; !l.found && i < sizeof renamed_keys / sizeof renamed_keys[0]; i++)
    if (strcmp(key, renamed_keys[i][0]) == 0) {
      l.key = renamed_keys[i][1];
      rmmc_resource_describe(r, lookup_cb, &l);
    }
  if (l.found) *value = l.value;
  return l.found;
}

void rmmc__emit_bytes(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v) {
  rmmc_field_t f = {key, RMMC_FIELD_BYTES, v, NULL};
  emit(ctx, &f);
}

void rmmc__emit_count(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v) {
  rmmc_field_t f = {key, RMMC_FIELD_COUNT, v, NULL};
  emit(ctx, &f);
}

void rmmc__emit_text(rmmc_field_cb emit, void *ctx, const char *key, const char *text) {
  rmmc_field_t f = {key, RMMC_FIELD_TEXT, 0, text};
  emit(ctx, &f);
}

/* ---- base resource of a device ---- */

rmmc_status_t rmmc__device_resource_new(const char *what, int device,
                                        const rmmc_resource_ops_t *ops,
                                        rmmc_memory_kind_t kind, size_t struct_size,
                                        rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: out is NULL", what);
  *out = NULL;
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "%s: no CUDA device is available", what);
  int dev = -1;
  if (device != -1 || kind != RMMC_MEMORY_PINNED) {
    rmmc_status_t st = rmmc__resolve_device(device, &dev);
    if (st != RMMC_SUCCESS) return st;
  }
  rmmc_resource_t *r = calloc(1, struct_size);
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", what);
  rmmc_resource_init(r, ops, kind, dev);
  *out = r;
  return RMMC_SUCCESS;
}

/* ---- graph routing (internal.h) ---- */

int rmmc__graph_routes;
static rmmc__graph_router_fn graph_router;

void rmmc__set_graph_router(rmmc__graph_router_fn fn) {
  __atomic_store_n(&graph_router, fn, __ATOMIC_RELEASE);
}

bool rmmc__graph_routed_slow(rmmc_resource_t *stack, cudaStream_t stream) {
  rmmc__graph_router_fn fn = __atomic_load_n(&graph_router, __ATOMIC_ACQUIRE);
  return fn != NULL && fn(stack, stream);
}

/* ---- adaptor base ---- */

void rmmc__adaptor_init(rmmc__adaptor_t *a, const rmmc_resource_ops_t *ops,
                        rmmc_resource_t *upstream) {
  rmmc_resource_init(&a->base, ops, upstream->kind, upstream->device);
  a->upstream = rmmc_resource_retain(upstream);
}

void rmmc__adaptor_fini(rmmc__adaptor_t *a) {
  rmmc_resource_release(a->upstream);
  a->upstream = NULL;
}

rmmc_resource_t *rmmc__adaptor_upstream(const rmmc_resource_t *r) {
  return ((const rmmc__adaptor_t *)r)->upstream;
}

rmmc_status_t rmmc__check_create(const char *what, const rmmc_resource_t *upstream,
                                 rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: out-pointer is NULL", what);
  *out = NULL;
  if (upstream == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: upstream resource is NULL", what);
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__adaptor_new(const char *what, const rmmc_resource_ops_t *ops,
                                rmmc_resource_t *upstream, size_t struct_size,
                                rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create(what, upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc__adaptor_t *a = calloc(1, struct_size);
  if (a == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", what);
  rmmc__adaptor_init(a, ops, upstream);
  *out = &a->base;
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__adaptor_forward_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                               size_t alignment, cudaStream_t stream) {
  return rmmc__forward_deallocate((const rmmc__adaptor_t *)r, ptr, bytes, alignment, stream);
}

size_t rmmc__adaptor_vm_page_size(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const rmmc__adaptor_t *)r)->upstream);
}

rmmc_status_t rmmc__adaptor_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       void **out) {
  return rmmc_resource_vm_reserve(rmmc__upstream_of(r), bytes, alignment, out);
}

rmmc_status_t rmmc__adaptor_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return rmmc_resource_vm_unreserve(rmmc__upstream_of(r), ptr, bytes);
}

rmmc_status_t rmmc__adaptor_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return rmmc_resource_vm_map(rmmc__upstream_of(r), ptr, bytes);
}

rmmc_status_t rmmc__adaptor_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return rmmc_resource_vm_unmap(rmmc__upstream_of(r), ptr, bytes);
}

rmmc_status_t rmmc__adaptor_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                          bool readwrite) {
  return rmmc_resource_vm_set_access(rmmc__upstream_of(r), ptr, bytes, device, readwrite);
}

bool rmmc__vm_can_set_access(const rmmc_resource_t *r) {
  while (r != NULL && r->ops->version >= 4 && r->ops->vm_set_access == rmmc__adaptor_vm_set_access)
    r = rmmc__adaptor_upstream(r);
  return r != NULL && r->ops->version >= 4 && r->ops->vm_set_access != NULL;
}

rmmc_status_t rmmc__adaptor_get_allocation(rmmc_resource_t *r, const void *ptr,
                                           rmmc_allocation_t *out) {
  return rmmc_resource_get_allocation(rmmc__upstream_of(r), ptr, out);
}

void rmmc__adaptor_destroy(rmmc_resource_t *r) {
  rmmc__adaptor_fini((rmmc__adaptor_t *)r);
  free(r);
}

rmmc_status_t rmmc__check_kind(const rmmc_resource_t *r, const rmmc_resource_ops_t *ops,
                               const char *what) {
  if (RMMC_LIKELY(r != NULL && r->ops == ops)) return RMMC_SUCCESS;
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: resource is NULL", what);
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: the resource is a %s, not a %s", what,
                        r->ops->name, ops->name);
}

static _Thread_local uint64_t tl_thread_id RMMC_TLS_FAST;

uint64_t rmmc__thread_id(void) {
  if (RMMC_UNLIKELY(tl_thread_id == 0)) tl_thread_id = (uint64_t)syscall(SYS_gettid);
  return tl_thread_id;
}
