/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The limiting adaptor (see limiting_adaptor.h): one atomic counter of the
 * bytes outstanding through it, each allocation rounded up to its
 * alignment. allocate reserves with a compare-and-swap loop that refuses to
 * pass the limit, then asks the upstream and gives the reservation back if
 * the upstream fails; deallocate returns the bytes after the upstream took
 * the memory back. No lock anywhere.
 *
 * RMM's limiting adaptor adds first and subtracts again when over the
 * limit, so for a moment the counter exceeds the limit and a concurrent
 * allocation that would fit is refused; the CAS never does that.
 */
#include "base/spec.h"
#include "rmmc/limiting_adaptor.h"

typedef struct limiting {
  rmmc__adaptor_t a;
  size_t limit;
  size_t used; /* atomic */
} limiting_t;

/* The out-of-memory refusal, out of the hot path. */
static RMMC_COLD rmmc_status_t refuse(limiting_t *l, size_t used, size_t need, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  char lim[32], use[32], req[32];
  return rmmc_set_oom_error(&l->a.base, bytes, stream,
                            "limit %s (%zu bytes), %s in use through the adaptor, %s "
                            "requested after rounding to %zu",
                            rmmc__format_bytes(l->limit, lim, sizeof lim), l->limit,
                            rmmc__format_bytes(used, use, sizeof use),
                            rmmc__format_bytes(need, req, sizeof req), alignment);
}

/* Counts `need` bytes (`bytes` rounded to `alignment`) against the limit,
 * or refuses them with out of memory. */
static inline rmmc_status_t take(limiting_t *l, size_t need, size_t bytes, size_t alignment,
                                 cudaStream_t stream) {
  size_t used = __atomic_load_n(&l->used, __ATOMIC_RELAXED);
  do {
    if (RMMC_UNLIKELY(need > l->limit - used))
      return refuse(l, used, need, bytes, alignment, stream);
  } while (!__atomic_compare_exchange_n(&l->used, &used, used + need, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  return RMMC_SUCCESS;
}

static rmmc_status_t limiting_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       cudaStream_t stream, void **out) {
  limiting_t *l = (limiting_t *)r;
  size_t need = rmmc__align_up(bytes, alignment); /* the wrapper checked overflow */
  rmmc_status_t st = take(l, need, bytes, alignment, stream);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  st = rmmc__forward_allocate(&l->a, bytes, alignment, stream, out);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) __atomic_sub_fetch(&l->used, need, __ATOMIC_RELAXED);
  return st;
}

static rmmc_status_t limiting_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                         size_t alignment, cudaStream_t stream) {
  limiting_t *l = (limiting_t *)r;
  size_t give = rmmc__align_up(bytes, alignment);
  /* Every legitimate allocation is still counted while it is freed, so a
   * size above the count cannot be one: refuse it before the upstream sees
   * it and the counter wraps. */
  size_t used = __atomic_load_n(&l->used, __ATOMIC_RELAXED);
  if (RMMC_UNLIKELY(give > used))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "limiting adaptor: deallocate of %p with %zu bytes (%zu rounded) but "
                          "only %zu bytes are in use through it",
                          ptr, bytes, give, used);
  rmmc_status_t st = rmmc__forward_deallocate(&l->a, ptr, bytes, alignment, stream);
  if (RMMC_LIKELY(st == RMMC_SUCCESS)) __atomic_sub_fetch(&l->used, give, __ATOMIC_RELAXED);
  return st;
}

/* Mapped pages count against the limit like allocations: a hard cap on an
 * expandable pool above. */
static rmmc_status_t limiting_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  limiting_t *l = (limiting_t *)r;
  rmmc_status_t st = take(l, bytes, bytes, rmmc_resource_vm_page_size(r), NULL);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc_resource_vm_map(l->a.upstream, ptr, bytes);
  if (st != RMMC_SUCCESS) __atomic_sub_fetch(&l->used, bytes, __ATOMIC_RELAXED);
  return st;
}

static rmmc_status_t limiting_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  limiting_t *l = (limiting_t *)r;
  rmmc_status_t st = rmmc_resource_vm_unmap(l->a.upstream, ptr, bytes);
  if (st == RMMC_SUCCESS) __atomic_sub_fetch(&l->used, bytes, __ATOMIC_RELAXED);
  return st;
}

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define LIMITING_FIGURES(X)                                       \
  X(BYTES, limit, DESCRIBE, "the most bytes outstanding at once") \
  X(BYTES, in_use, DESCRIBE, "bytes outstanding through it")

static void limiting_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  limiting_t *l = (limiting_t *)r;
  struct {
    LIMITING_FIGURES(RMMC__FIGURE_VALUE)
  } v = {l->limit, __atomic_load_n(&l->used, __ATOMIC_RELAXED)};
  LIMITING_FIGURES(RMMC__FIGURE_EMIT)
}

static const rmmc_resource_ops_t limiting_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "limiting",
    .allocate = limiting_allocate,
    .deallocate = limiting_deallocate,
    .describe = limiting_describe,
    .destroy = rmmc__adaptor_destroy,
    .upstream = rmmc__adaptor_upstream,
    .vm_page_size = rmmc__adaptor_vm_page_size,
    .vm_reserve = rmmc__adaptor_vm_reserve,
    .vm_unreserve = rmmc__adaptor_vm_unreserve,
    .vm_map = limiting_vm_map,
    .vm_unmap = limiting_vm_unmap,
    .vm_set_access = rmmc__adaptor_vm_set_access,
    .get_allocation = rmmc__adaptor_get_allocation,
};

RMMC_API rmmc_status_t rmmc_limiting_adaptor_create(rmmc_resource_t *upstream, size_t limit,
                                                    rmmc_resource_t **out) {
  rmmc_status_t st =
      rmmc__adaptor_new("limiting_adaptor_create", &limiting_ops, upstream, sizeof(limiting_t), out);
  if (st == RMMC_SUCCESS) ((limiting_t *)*out)->limit = limit;
  return st;
}

RMMC_API size_t rmmc_limiting_adaptor_get_limit(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &limiting_ops, "limiting_adaptor_get_limit") != RMMC_SUCCESS) return 0;
  return ((const limiting_t *)r)->limit;
}

RMMC_API size_t rmmc_limiting_adaptor_get_used(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &limiting_ops, "limiting_adaptor_get_used") != RMMC_SUCCESS) return 0;
  return __atomic_load_n(&((const limiting_t *)r)->used, __ATOMIC_RELAXED);
}

static const rmmc__spec_option_t limiting_spec_options[] = {
    {.name = "limit", .type = RMMC__OPT_BYTES_PCT, .help = "most bytes outstanding (size, or % of free memory; required, no default)"},
    {.name = NULL},
};

static rmmc_status_t limiting_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                    int device, rmmc_resource_t **out) {
  (void)device;
  if (rmmc__spec_find(args, "limit") == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "limiting needs a limit: write limiting(limit=4GiB) or limiting(limit=80%%)");
  size_t limit = 0;
  rmmc_status_t st = rmmc__spec_bytes(args, "limit", upstream, &limit);
  return st == RMMC_SUCCESS ? rmmc_limiting_adaptor_create(upstream, limit, out) : st;
}

const rmmc__spec_entry_t rmmc__limiting_spec = {
    .name = "limiting",
    .help = "fails allocations past a byte limit (RMM's limiting_resource_adaptor)",
    .needs_upstream = true,
    .options = limiting_spec_options,
    .build = limiting_build,
};
