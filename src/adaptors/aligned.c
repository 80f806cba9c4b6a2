/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aligned adaptor: over-allocate and align, remembering the original
 * pointer on the host.
 *
 * A request needs work only when its effective alignment (the per-call
 * alignment, raised to the adaptor's for requests at or above the
 * threshold) exceeds the 256 every upstream gives. Then the adaptor asks
 * the upstream for bytes + alignment - 256 at 256, which always contains an
 * aligned block of `bytes`, and records aligned -> (original, upstream
 * size) in one of 16 maps picked by hashing the aligned pointer. Every
 * over-allocated block is recorded, even when the upstream pointer happened
 * to be aligned already, so a stray free is always recognised.
 */
#include <stdlib.h>
#include <string.h>

#include "base/ptrmap.h"
#include "aligned_options.h"
#include "base/spec.h"
#include "rmmc/aligned_adaptor.h"

#define ALIGNED_SHARDS 16

typedef struct aligned_shard {
  pthread_mutex_t lock;
  rmmc__ptrmap_t map; /* aligned pointer -> original pointer, upstream bytes */
} aligned_shard_t;

typedef struct aligned_adaptor {
  rmmc__adaptor_t a;
  size_t alignment, threshold;
  uint64_t outstanding, overhead; /* atomic */
  aligned_shard_t shards[ALIGNED_SHARDS];
} aligned_adaptor_t;

static size_t effective_alignment(const aligned_adaptor_t *g, size_t bytes, size_t alignment) {
  return bytes >= g->threshold && g->alignment > alignment ? g->alignment : alignment;
}

static aligned_shard_t *shard_of(aligned_adaptor_t *g, const void *p) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ULL;
  return &g->shards[h >> 60];
}

static rmmc_status_t aligned_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out) {
  aligned_adaptor_t *g = (aligned_adaptor_t *)r;
  size_t align = effective_alignment(g, bytes, alignment);
  if (align <= RMMC_DEFAULT_ALIGNMENT)
    return rmmc_resource_allocate(g->a.upstream, bytes, alignment, stream, out);
  size_t slack = align - RMMC_DEFAULT_ALIGNMENT;
  if (bytes > SIZE_MAX - RMMC_DEFAULT_ALIGNMENT - slack)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "aligned adaptor: %zu bytes overflows with the slack for alignment %zu",
                          bytes, align);
  size_t up_bytes = bytes + slack;
  void *raw;
  rmmc_status_t st =
      rmmc_resource_allocate(g->a.upstream, up_bytes, RMMC_DEFAULT_ALIGNMENT, stream, &raw);
  if (st != RMMC_SUCCESS) return st;
  void *p = (void *)rmmc__align_up((uintptr_t)raw, align);
  aligned_shard_t *s = shard_of(g, p);
  pthread_mutex_lock(&s->lock);
  bool kept = rmmc__ptrmap_insert(&s->map, p, raw, up_bytes);
  pthread_mutex_unlock(&s->lock);
  if (RMMC_UNLIKELY(!kept)) {
    (void)rmmc_resource_deallocate(g->a.upstream, raw, up_bytes, RMMC_DEFAULT_ALIGNMENT, stream);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                          "aligned adaptor: no host memory to record a %zu-byte block", bytes);
  }
  rmmc__atomic_add_u64(&g->outstanding, 1);
  rmmc__atomic_add_u64(&g->overhead, slack);
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t aligned_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream) {
  aligned_adaptor_t *g = (aligned_adaptor_t *)r;
  size_t align = effective_alignment(g, bytes, alignment);
  if (align <= RMMC_DEFAULT_ALIGNMENT)
    return rmmc_resource_deallocate(g->a.upstream, ptr, bytes, alignment, stream);
  size_t slack = align - RMMC_DEFAULT_ALIGNMENT;
  aligned_shard_t *s = shard_of(g, ptr);
  pthread_mutex_lock(&s->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&s->map, ptr);
  if (e == NULL || bytes > SIZE_MAX - slack || e->size != bytes + slack) {
    pthread_mutex_unlock(&s->lock);
    if (e == NULL)
      return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                            "aligned adaptor: %p (%zu bytes, aligned to %zu) was not allocated here",
                            ptr, bytes, align);
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "aligned adaptor: %p was not allocated with %zu bytes aligned to %zu",
                          ptr, bytes, align);
  }
  void *raw = e->value;
  size_t up_bytes = e->size;
  rmmc__ptrmap_remove(&s->map, e);
  pthread_mutex_unlock(&s->lock);
  rmmc_status_t st =
      rmmc_resource_deallocate(g->a.upstream, raw, up_bytes, RMMC_DEFAULT_ALIGNMENT, stream);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) {
    /* The upstream kept the block, so keep its record. The record goes
     * before the upstream call because the upstream may hand the memory
     * out again at once, and the same aligned address with it. */
    pthread_mutex_lock(&s->lock);
    (void)rmmc__ptrmap_insert(&s->map, ptr, raw, up_bytes);
    pthread_mutex_unlock(&s->lock);
    return st;
  }
  rmmc__atomic_sub_u64(&g->outstanding, 1);
  rmmc__atomic_sub_u64(&g->overhead, slack);
  return RMMC_SUCCESS;
}

static void aligned_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  aligned_adaptor_t *g = (aligned_adaptor_t *)r;
  struct {
    RMMC_ALIGNED_FIGURES(RMMC__FIGURE_VALUE)
  } v = {g->alignment, g->threshold, rmmc__atomic_load_u64(&g->outstanding),
         rmmc__atomic_load_u64(&g->overhead)};
  RMMC_ALIGNED_FIGURES(RMMC__FIGURE_EMIT)
}

static void aligned_destroy(rmmc_resource_t *r) {
  aligned_adaptor_t *g = (aligned_adaptor_t *)r;
  for (int i = 0; i < ALIGNED_SHARDS; i++) {
    rmmc__ptrmap_fini(&g->shards[i].map);
    pthread_mutex_destroy(&g->shards[i].lock);
  }
  rmmc__adaptor_destroy(r);
}

static const rmmc_resource_ops_t aligned_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "aligned",
    .allocate = aligned_allocate,
    .deallocate = aligned_deallocate,
    .describe = aligned_describe,
    .destroy = aligned_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

RMMC_API rmmc_status_t rmmc_aligned_adaptor_create(rmmc_resource_t *upstream,
                                                   const rmmc_aligned_options_t *options,
                                                   rmmc_resource_t **out) {
  static const char what[] = "aligned_adaptor_create";
  rmmc_status_t st = rmmc__check_create(what, upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_aligned_options_t opts = RMMC_ALIGNED_OPTIONS_INIT;
  RMMC__TAKE_OPTIONS(st, what, &opts, options, RMMC_ALIGNED_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  if (!rmmc__is_pow2(opts.alignment))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: alignment %zu is not a power of two", what, opts.alignment);
  st = rmmc__adaptor_new(what, &aligned_ops, upstream, sizeof(aligned_adaptor_t), out);
  if (st != RMMC_SUCCESS) return st;
  aligned_adaptor_t *g = (aligned_adaptor_t *)*out;
  g->alignment = opts.alignment < RMMC_DEFAULT_ALIGNMENT ? RMMC_DEFAULT_ALIGNMENT : opts.alignment;
  g->threshold = opts.threshold;
  for (int i = 0; i < ALIGNED_SHARDS; i++) {
    pthread_mutex_init(&g->shards[i].lock, NULL);
    rmmc__ptrmap_init(&g->shards[i].map);
  }
  return RMMC_SUCCESS;
}

#define ALIGNED_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_aligned_options_t, __VA_ARGS__)
static const rmmc__spec_option_t aligned_spec_options[] = {
    RMMC__ALIGNED_OPTIONS(ALIGNED_SPEC_ROW){.name = NULL},
};
#undef ALIGNED_SPEC_ROW

static rmmc_status_t aligned_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                   int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_aligned_options_t opts = RMMC_ALIGNED_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, aligned_spec_options, upstream, &opts);
  return st == RMMC_SUCCESS ? rmmc_aligned_adaptor_create(upstream, &opts, out) : st;
}

const rmmc__spec_entry_t rmmc__aligned_spec = {
    .name = "aligned",
    .help = "align allocations at or above a threshold to a larger power of two",
    .needs_upstream = true,
    .options = aligned_spec_options,
    .build = aligned_build,
};
