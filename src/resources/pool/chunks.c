/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's chunk backend (docs/design.md, "Growth backends"): regions are
 * chunks taken with rmmc_resource_allocate, at least min_growth bytes in
 * granularity steps, halving towards the request when the upstream
 * refuses; trimming gives back wholly free chunks whose frees finished.
 */
#include <stdio.h>

#include "check.h"
#include "pool_internal.h"

static rmmc_status_t chunks_trim(pool_t *p, size_t goal);

/* The budget's answer for growing by `add`, the trim it asks for run. */
static bool chunks_admit(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t add, size_t need,
                         bool within) {
  size_t goal;
  pool_admit_t a = rmmc__pool_admit(p, o, stream, add, need, within, &goal);
  if (a == POOL_ADMIT_TRIM) {
    (void)chunks_trim(p, goal);
    a = rmmc__pool_admit_max(p, add);
  }
  return a == POOL_ADMIT_YES;
}

static rmmc_status_t chunks_grow(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t need,
                                 size_t align, unsigned how, pool_block_t **out) {
  bool within = how & POOL_GROW_WITHIN;
  size_t min = how & POOL_GROW_EXACT ? 0 : p->min_growth;
  size_t pad = align > POOL_GRANULE ? align - POOL_GRANULE : 0;
  size_t want = rmmc__align_up(need + pad, p->granularity);
  size_t g = want < min ? min : want;
  if (!chunks_admit(p, o, stream, g, need, within)) {
    /* The maximum: try the request alone before giving up. */
    if (within || g == want || !chunks_admit(p, o, stream, want, need, false))
      return within ? rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: over its budget") :
                      RMMC_ERROR_OUT_OF_MEMORY;
    g = want;
  }
  if (g > p->maximum_size - p->reserved) g = p->maximum_size - p->reserved;
  if (g < want) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: the maximum size is reached");
  void *ptr = NULL;
  for (;;) {
    rmmc_status_t st = rmmc__pool_upstream_allocate(p, g, stream, &ptr);
    if (st == RMMC_SUCCESS) break;
    if (st != RMMC_ERROR_OUT_OF_MEMORY || g == want) return st;
    size_t half = rmmc__align_up(g / 2, p->granularity);
    g = half > want && half < g ? half : want;
  }
  pool_region_t *r = rmmc__pool_add_region(p, (uintptr_t)ptr, g, B_FREE);
  if (r == NULL) {
    (void)rmmc__pool_upstream_deallocate(p, ptr, g);
    return rmmc__pool_no_host_memory();
  }
  p->reserved += g;
  if (p->reserved > p->reserved_peak) p->reserved_peak = p->reserved;
  pool_hook_acquire(p, (uintptr_t)ptr, g);
  /* A stream-ordered upstream's memory is ready on `stream`: the chunk is
   * o's until its event says so for the others. */
  pool_block_t *b = r->first;
  if (p->cuda && o != NULL) {
    b->owner = o;
    b->tag = rmmc__stream_slot_tag(o->slot);
    (void)rmmc__stream_slot_try_record(&p->streams, o->slot, stream);
  }
  POOL_CHECK(p, b, rmmc__pool_grown_ok, b, o, need, false);
  *out = b;
  return RMMC_SUCCESS;
}

static rmmc_status_t chunks_trim(pool_t *p, size_t goal) {
  for (pool_region_t *r = p->regions, *next; r != NULL && p->reserved > goal; r = next) {
    next = r->next;
    pool_block_t *b = r->first;
    if (b->state != B_FREE || b->next != NULL || !rmmc__pool_settled(p, b, true))
      continue;
    rmmc__pool_unlink_free(p, b);
    POOL_CHECK(p, b, rmmc__pool_block_ok, b, B_FREE); /* the whole chunk: prev == NULL too */
    pool_hook_release(p, r->base, r->size);
    rmmc_status_t st = rmmc__pool_upstream_deallocate(p, (void *)r->base, r->size);
    if (st != RMMC_SUCCESS) {
      pool_hook_acquire(p, r->base, r->size); /* still held */
      rmmc__pool_link_free(p, b);
      return st;
    }
    POOL_SUB(p, p->reserved, r->size);
    p->shrinks++;
    rmmc__pool_drop_block(p, b);
    rmmc__pool_remove_region(p, r);
  }
  return RMMC_SUCCESS;
}

static void chunks_fini(pool_t *p) {
  while (p->regions != NULL) {
    pool_region_t *r = p->regions;
    pool_hook_release(p, r->base, r->size);
    (void)rmmc_resource_deallocate(p->base.upstream, (void *)r->base, r->size, POOL_GRANULE, NULL);
    rmmc__pool_remove_region(p, r);
  }
}

static void chunks_describe(pool_t *p, rmmc_field_cb emit, void *ctx) {
  (void)p;
  rmmc__emit_text(emit, ctx, "backend", "chunks");
}

static bool chunks_check(pool_t *p, char *msg, size_t len) {
  size_t sum = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) sum += r->size;
  POOL_WALK_CHECK(sum == p->reserved, "reserved %zu, chunks add up to %zu", p->reserved, sum);
  return true;
}

const pool_backend_t rmmc__pool_chunks = {
    .name = "chunks",
    .grow = chunks_grow,
    .trim = chunks_trim,
    .fini = chunks_fini,
    .describe = chunks_describe,
    .check = chunks_check,
};
