/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's parts (internal): what only the files of the
 * stream-ordering core share; pool_internal.h has what the backends share
 * too. The core is pool.c, tcache.c, policy.c, stream_heaps.c, lend.c,
 * graphs.c, figures.c and lifetime.c (docs/design.md, "Where things live"),
 * each its own translation unit: what one calls in another is rmmc__pool_*
 * and declared below, by file; what the hot paths share is static inline
 * here. A static link takes them together (tests/test_layers.py counts them
 * as one).
 */
#ifndef RMMC_POOL_CORE_H
#define RMMC_POOL_CORE_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "pool_internal.h"
#include "rmmc/registry.h"
#include "tcache.h"

#define POOL_NOINLINE __attribute__((noinline)) /* GNU C, as the pool's aligned(64) */

extern const rmmc_resource_ops_t rmmc__pool_ops, rmmc__pool_arena_ops; /* pool.c */

/* The arena (arena.c) is this pool under another name: both tables. */
static inline bool is_pool(const rmmc_resource_t *r) {
  return r != NULL && (r->ops == &rmmc__pool_ops || r->ops == &rmmc__pool_arena_ops);
}

/* Which steps of the shared heap's slow path a pass takes: get_block lends
 * from other streams' heaps (no lock held) before the last resort. */
typedef enum { SLOW_BEFORE_LAST, SLOW_LAST } slow_steps_t;

/* A request the fast paths missed, built once by get_block (lend.c) and
 * handed to each step: h the thread's heap of o's stream (NULL: a large
 * request); n bytes (whole granules) at `align`, `bytes` as asked; take at
 * take_align: what the shared heap gives it (a span, or n at `align`). */
typedef struct pool_request {
  pool_t *p;
  pool_sheap_t *h;
  pool_owner_t *o;
  cudaStream_t stream;
  size_t n, align, bytes;
  size_t take, take_align;
  slow_steps_t steps;
} pool_request_t;

/* ---- the parts' functions, by file (pool_internal.h: the backends' too) ---- */

/* pool.c */
void rmmc__pool_heap_trim(pool_t *p, pool_sheap_t *h, cudaStream_t stream);
/* policy.c */
void rmmc__pool_cover_now(pool_t *p, pool_owner_t *o, cudaStream_t stream);
void rmmc__pool_consolidate(pool_t *p, bool ask);
rmmc_status_t rmmc__pool_shared_slow(const pool_request_t *r, pool_block_t **out);
/* stream_heaps.c */
rmmc_status_t rmmc__pool_heap_new(pool_t *p, pool_owner_t *o, rmmc__stream_slot_t *slot,
                                  unsigned stripe, pool_sheap_t **out);
size_t rmmc__pool_heap_release_idle(pool_t *p, pool_sheap_t *x, size_t keep, cudaStream_t stream,
                                    bool in_call);
size_t rmmc__pool_reclaim_spans(pool_t *p, pool_sheap_t *skip, size_t need);
size_t rmmc__pool_retire_foreign(pool_t *p, pool_sheap_t *h, cudaStream_t stream, bool can_wait);
rmmc_status_t rmmc__pool_span_take(const pool_request_t *r);
/* lend.c */
#if RMMC_DEBUG_CHECKS >= 1
/* A test's seam: called, when set, by a small request between lending
 * (step 3) and its retry (step 4), no lock held. */
extern void (*rmmc__pool_before_retry)(pool_t *p);
#endif
pool_sheap_t *rmmc__pool_heaps_snapshot(pool_t *p);
/* Entered with the fast path's lock held (h's for a small request, the
 * shared lock for a large one), which it drops. */
rmmc_status_t rmmc__pool_get_block(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                   cudaStream_t stream, size_t n, size_t align, size_t bytes,
                                   void **out);
/* graphs.c */
void rmmc__pool_graph_forget(pool_t *p, pool_owner_t *g);
void rmmc__pool_graph_drain(pool_t *p);
pool_owner_t *rmmc__pool_graph_route(pool_t *p, cudaStream_t stream);
rmmc_status_t rmmc__pool_graph_allocate(pool_t *p, pool_owner_t *g, cudaStream_t stream, size_t n,
                                        size_t align, size_t bytes, void **out);
/* figures.c */
void rmmc__pool_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx);
bool rmmc__pool_check_locked(pool_t *p, char *msg, size_t len);
#if RMMC_DEBUG_CHECKS >= 2 /* every invariant after every call */
rmmc_status_t rmmc__pool_expensive_check(pool_t *p, rmmc_status_t st, const char *where);
#define POOL_EXPENSIVE(p, st, where) rmmc__pool_expensive_check(p, st, where)
#else
#define POOL_EXPENSIVE(p, st, where) (st)
#endif
/* lifetime.c */
rmmc_status_t rmmc__pool_release_cached(rmmc_resource_t *r);
void rmmc__pool_destroy(rmmc_resource_t *r);

/* ---- inline helpers the parts share (hot paths among them) ---- */

/* Counts a free of `bytes` into the shared heap on o's stream (shared
 * lock). True when o's frees are now due an event (another stream asked,
 * or enough wait while other streams use the pool): the caller records it
 * after dropping the shared lock where it can (a record is a driver call,
 * 0.3 us and more, serialized across threads). */
static inline bool cover_claim(const pool_t *p, pool_owner_t *o, size_t bytes) {
  o->uncovered++;
  o->uncovered_bytes += bytes;
  if (!RMMC_UNLIKELY(__atomic_load_n(&o->slot->want, __ATOMIC_RELAXED)) &&
      !(p->nowners > 1 &&
        (o->uncovered >= p->event_interval || o->uncovered_bytes >= p->event_bytes)))
    return false;
  o->uncovered = 0;
  o->uncovered_bytes = 0;
  return true;
}

/* split_limit (chunks): a wholly free chunk far larger than the growth a
 * request would make is not split for it. */
static inline bool too_big_to_split(const pool_t *p, const pool_block_t *b, size_t need) {
  if (p->split_limit == 0.0 || p->last_resort || b->prev != NULL || b->next != NULL ||
      p->be != &rmmc__pool_chunks)
    return false;
  size_t g = rmmc__align_up(need, p->granularity); /* what chunks_grow would take */
  if (g < p->min_growth) g = p->min_growth;
  return (double)pool_bsize(b) > p->split_limit * (double)g;
}

/* The best fit that o's stream may take at once: clean or its own. */
static inline pool_block_t *find_usable_raw(pool_t *p, pool_owner_t *o, size_t need) {
  rmmc__tlsf_node_t *x = rmmc__tlsf_find(&p->clean, need);
  rmmc__tlsf_node_t *y = rmmc__tlsf_find(o->idx, need);
  if (RMMC_UNLIKELY(x == NULL && y == NULL)) { /* a fit behind a bin's head */
    x = rmmc__tlsf_find_fit(&p->clean, need);
    y = rmmc__tlsf_find_fit(o->idx, need);
  }
  if (y != NULL && (x == NULL || y->size <= x->size)) x = y;
  if (x == NULL) return NULL;
  pool_block_t *b = pool_block_of(x);
  return RMMC_UNLIKELY(too_big_to_split(p, b, need)) ? NULL : b;
}

/* ... that holds n bytes at an `align`-aligned address: a block of n bytes
 * first (it may happen to be aligned), else one that surely is. */
RMMC_HOT
static inline pool_block_t *find_usable(pool_t *p, pool_owner_t *o, size_t n, size_t align) {
  pool_block_t *b = find_usable_raw(p, o, n);
  if (align <= POOL_GRANULE || b == NULL) return b;
  if (rmmc__align_up(b->addr, align) + n <= pool_bend(b)) return b;
  return find_usable_raw(p, o, n + align - POOL_GRANULE);
}

static inline void heap_link(pool_sheap_t *h, pool_block_t *b) {
  b->where = W_INDEX;
  rmmc__tlsf_insert(&h->idx, &b->node);
}

static inline void heap_unlink(pool_sheap_t *h, pool_block_t *b) {
  if (b->where == W_HOT) h->hot = NULL;
  else rmmc__tlsf_remove(&h->idx, &b->node);
  b->where = W_OUT;
}

static inline size_t heap_cached_bytes(const pool_sheap_t *x) {
  return x->idx.bytes + (x->hot != NULL ? pool_bsize(x->hot) : 0);
}

static inline bool heap_free(const pool_block_t *n) {
  return n != NULL && n->state == B_FREE && n->where != W_OUT;
}

/* Merges b (free, in no index) with its free neighbours in the span. The
 * hot block is kept unmerged, so absorbing it can bring another free block
 * next to b: each side goes on until no free block is left beside b. */
static inline pool_block_t *heap_merge(pool_sheap_t *h, pool_block_t *b) {
  pool_block_t *n;
  while (heap_free(n = b->prev)) {
    heap_unlink(h, n);
    pool_absorb(b, n, 0);
    pool_meta_put(&h->meta, n);
  }
  while (heap_free(n = b->next)) {
    heap_unlink(h, n);
    pool_absorb(b, n, 1);
    pool_meta_put(&h->meta, n);
  }
  return b;
}

static inline pool_block_t *heap_search(pool_sheap_t *h, size_t need) {
  rmmc__tlsf_node_t *x = rmmc__tlsf_find(&h->idx, need);
  pool_block_t *b = x != NULL ? pool_block_of(x) : NULL;
  pool_block_t *hot = h->hot;
  if (hot != NULL && pool_bsize(hot) >= need && (b == NULL || pool_bsize(hot) < pool_bsize(b)))
    b = hot;
  return b;
}

/* Cuts n bytes at `align` out of h's free block b (found by heap_search;
 * h locked, 2 spare structs) and enters it in h's map: the block, or NULL
 * without host memory (b stays free). */
static inline pool_block_t *heap_carve(pool_sheap_t *h, pool_block_t *b, size_t n, size_t align,
                                       size_t bytes) {
  bool was_hot = b->where == W_HOT;
  heap_unlink(h, b);
  if (was_hot) b = heap_merge(h, b); /* the hot block was kept unmerged */
  uintptr_t a = rmmc__align_up(b->addr, align);
  if (a != b->addr) {
    pool_block_t *r = pool_split_block(&h->meta, b, a);
    heap_link(h, b);
    b = r;
  }
  if (pool_bsize(b) > n) heap_link(h, pool_split_block(&h->meta, b, b->addr + n));
  if (RMMC_UNLIKELY(!rmmc__ptrmap_insert(&h->used, (void *)b->addr, b, bytes))) {
    heap_link(h, heap_merge(h, b));
    return NULL;
  }
  return b;
}

/* Hands out h's block b (in h's map; h locked). */
static inline void heap_hand_out(pool_sheap_t *h, pool_block_t *b, size_t bytes) {
  b->state = B_USED;
  b->requested = bytes;
  if (b->region->nused++ == 0) h->nidle--;
  h->in_use += pool_bsize(b);
  if (h->in_use > h->peak) h->peak = h->in_use;
}

/* A large request at the shared heap (shared lock held): room for block
 * structs, no pause begun since the call passed the pause gate, and o's
 * heap back if it was retired. */
static inline rmmc_status_t shared_gate(pool_t *p, pool_owner_t *o, size_t bytes) {
  if (!pool_meta_room(&p->meta)) return rmmc__pool_no_host_memory();
  if (RMMC_UNLIKELY(__atomic_load_n(&p->paused, __ATOMIC_RELAXED))) /* raced a pause */
    return rmmc__pool_paused_refusal(bytes);
  if (RMMC_UNLIKELY(o->heap == NULL)) return rmmc__pool_owner_rejoin(p, o);
  return RMMC_SUCCESS;
}

/* A new highest figure of bytes handed out or lent (the budget's basis). */
static inline void new_peak(pool_t *p) { p->committed_peak = p->committed; }

/* Carves n bytes at `align` out of free block b (unindexed; shared lock)
 * and hands them out in *out as a large block of graph pool g or (NULL) of
 * the shared heap: where every large allocation ends. */
static inline rmmc_status_t large_hand_out(pool_t *p, pool_block_t *b, size_t n, size_t align,
                                           size_t bytes, pool_owner_t *g, void **out) {
  b = rmmc__pool_carve(p, b, n, align);
  if (RMMC_UNLIKELY(!rmmc__ptrmap_insert(&p->used, (void *)b->addr, b, bytes))) {
    rmmc__pool_put_free(p, b);
    return rmmc__pool_no_host_memory();
  }
  b->state = B_USED;
  b->owner = g;
  b->requested = bytes;
  if (g != NULL) g->used_bytes += pool_bsize(b);
  p->committed += pool_bsize(b);
  if (p->committed > p->committed_peak) new_peak(p);
  *out = (void *)b->addr;
  return RMMC_SUCCESS;
}

#endif /* RMMC_POOL_CORE_H */
