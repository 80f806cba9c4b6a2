/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool resource: its slots and the allocate and free paths, the fast
 * paths first, then the slow paths in the order a call takes them
 * (docs/design.md, "A request through the pool"; pool_internal.h has the
 * layout and the locks, core.h the core's files; shared_heap.c how shared
 * free blocks merge).
 */
#include "core.h"

/* The slow paths, after the fast paths. */
static POOL_NOINLINE rmmc_status_t allocate_uncached(pool_t *p, const void *key, size_t bytes,
                                                     size_t alignment, cudaStream_t stream,
                                                     void **out);
static POOL_NOINLINE rmmc_status_t deallocate_uncached(pool_t *p, const void *key, void *ptr,
                                                       size_t bytes, cudaStream_t stream);
static POOL_NOINLINE rmmc_status_t paused_error(pool_t *p, size_t bytes);
static POOL_NOINLINE rmmc_status_t small_again(pool_t *p, cudaStream_t stream, size_t n,
                                               size_t align, size_t bytes, void **out);
static POOL_NOINLINE rmmc_status_t large_allocate(pool_t *p, pool_owner_t *o, cudaStream_t stream,
                                                  size_t n, size_t align, size_t bytes, void **out);
static POOL_NOINLINE rmmc_status_t wrong_size(const void *ptr, size_t had, size_t bytes);
static POOL_NOINLINE rmmc_status_t free_slow(pool_t *p, pool_owner_t *o, void *ptr, size_t bytes,
                                             cudaStream_t stream);

/* ---- the fast paths ---- */

/* A small request in h, the calling thread's heap of o's stream (h may
 * have been retired since it was cached: h's lock tells). */
static inline rmmc_status_t small_allocate(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                           cudaStream_t stream, size_t n, size_t align,
                                           size_t bytes, void **out) {
  size_t need = n + (align - POOL_GRANULE);
  rmmc__lock(&h->lock);
  if (RMMC_UNLIKELY(h->owner != o)) {
    rmmc__unlock(&h->lock);
    return small_again(p, stream, n, align, bytes, out);
  }
  pool_block_t *b = h->hot;
  if (RMMC_UNLIKELY(b == NULL || pool_bsize(b) != need || align != POOL_GRANULE))
    return rmmc__pool_get_block(p, h, o, stream, n, align, bytes, out); /* drops h's lock */
  rmmc_status_t st = RMMC_SUCCESS;
  if (RMMC_LIKELY(rmmc__ptrmap_insert(&h->used, (void *)b->addr, b, bytes))) {
    h->hot = NULL;
    b->where = W_OUT;
    heap_hand_out(h, b, bytes);
    *out = (void *)b->addr;
  } else {
    st = rmmc__pool_no_host_memory();
  }
  rmmc__unlock(&h->lock);
  return st;
}

static inline rmmc_status_t heap_allocate(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                          size_t bytes, size_t alignment, cudaStream_t stream,
                                          void **out) {
  size_t n = rmmc__align_up(bytes, POOL_GRANULE);
  if (RMMC_UNLIKELY(__atomic_load_n(&p->graphs_routing, __ATOMIC_RELAXED) > 0)) {
    if (__atomic_load_n(&p->paused, __ATOMIC_RELAXED)) return paused_error(p, bytes);
    pool_owner_t *g = rmmc__pool_graph_route(p, stream);
    if (g != NULL) return rmmc__pool_graph_allocate(p, g, stream, n, alignment, bytes, out);
  }
  if (RMMC_LIKELY(n <= p->small_max && n + (alignment - POOL_GRANULE) <= p->small_chunk))
    return small_allocate(p, h, o, stream, n, alignment, bytes, out);
  return large_allocate(p, o, stream, n, alignment, bytes, out);
}

/* The calling thread's heap of the stream from its cache (tcache.h); a
 * miss goes out of line whole, so that the fast path holds the heap and
 * the owner in registers. */
RMMC_HOT
static rmmc_status_t pool_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  pool_t *p = (pool_t *)r;
  const void *key = rmmc__stream_key_fast(stream);
  tl_entry_t *e = heap_cached(p, key);
  return POOL_EXPENSIVE(p,
                        RMMC_UNLIKELY(e == NULL)
                            ? allocate_uncached(p, key, bytes, alignment, stream, out)
                            : heap_allocate(p, e->heap, e->owner, bytes, alignment, stream, out),
                        "allocate");
}

/* Counts 1, 2, 4, 8, ...: true at each power of two. */
static inline bool power_of_two_count(uint64_t *n) {
  uint64_t c = ++*n;
  return (c & (c - 1)) == 0;
}

/* Frees the small block of h's map entry e on h's own stream (h locked). */
static inline rmmc_status_t small_free(pool_t *p, pool_sheap_t *h, rmmc__ptrmap_entry_t *e,
                                       void *ptr, size_t bytes, cudaStream_t stream) {
  pool_block_t *b = e->value;
  if (RMMC_UNLIKELY(b->requested != bytes)) return wrong_size(ptr, b->requested, bytes);
  rmmc__ptrmap_remove(&h->used, e);
  h->in_use -= pool_bsize(b);
  pool_region_t *sp = b->region;
  sp->tag = rmmc__stream_slot_tag(h->owner->slot);
  /* b becomes the hot block as it is, for an exact-size reuse; the previous
   * hot block merges with its neighbours and is indexed (b is not free yet
   * for that merge). */
  pool_block_t *old = h->hot;
  if (old != NULL) {
    h->hot = NULL;
    old->where = W_OUT;
    heap_link(h, heap_merge(h, old));
  }
  b->state = B_FREE;
  h->hot = b;
  b->where = W_HOT;
  if (--sp->nused == 0) {
    if (++h->nidle * p->small_chunk > p->cache_size) rmmc__pool_heap_trim(p, h, stream);
    /* Device memory: the stream's event covers its frees when its heap
     * empties for the 1st, 2nd, 4th, ... time, so that the spans of a
     * stream that never comes back serve others once a query finds the
     * work done (design.md, "Streams that come and go"); a stream that
     * keeps working pays log2 of its emptyings. */
    else if (p->cuda && h->in_use == 0 && power_of_two_count(&h->empties))
      (void)rmmc__stream_slot_try_record(&p->streams, h->owner->slot, stream);
  }
  return RMMC_SUCCESS;
}

/* A free into h, as small_allocate. */
static inline rmmc_status_t heap_deallocate(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                            void *ptr, size_t bytes, cudaStream_t stream) {
  rmmc_status_t st;
  if (RMMC_LIKELY(bytes <= p->small_max)) {
    rmmc__lock(&h->lock);
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&h->used, ptr);
    if (RMMC_LIKELY(e != NULL && h->owner == o)) {
      st = small_free(p, h, e, ptr, bytes, stream);
      rmmc__unlock(&h->lock);
      return st;
    }
    rmmc__unlock(&h->lock);
  }
  return free_slow(p, o, ptr, bytes, stream);
}

RMMC_HOT
static rmmc_status_t pool_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)alignment;
  pool_t *p = (pool_t *)r;
  const void *key = rmmc__stream_key_fast(stream);
  tl_entry_t *e = heap_cached(p, key);
  return POOL_EXPENSIVE(p,
                        RMMC_UNLIKELY(e == NULL)
                            ? deallocate_uncached(p, key, ptr, bytes, stream)
                            : heap_deallocate(p, e->heap, e->owner, ptr, bytes, stream),
                        "deallocate");
}

/* ---- the slow paths ---- */

/* The calling thread's cache misses p's heap of the stream (key `key`):
 * found or made (tcache.c), then the call as on a hit. */
static POOL_NOINLINE rmmc_status_t allocate_uncached(pool_t *p, const void *key, size_t bytes,
                                                     size_t alignment, cudaStream_t stream,
                                                     void **out) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = rmmc__pool_heap_find(p, stream, key, &h, &o);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  return heap_allocate(p, h, o, bytes, alignment, stream, out);
}

static POOL_NOINLINE rmmc_status_t deallocate_uncached(pool_t *p, const void *key, void *ptr,
                                                       size_t bytes, cudaStream_t stream) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = rmmc__pool_heap_find(p, stream, key, &h, &o);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  return heap_deallocate(p, h, o, ptr, bytes, stream);
}

/* An allocation while paused (sleep.c): refused. */
static POOL_NOINLINE rmmc_status_t paused_error(pool_t *p, size_t bytes) {
  char b[32];
  rmmc__lock(&p->lock); /* release_cached may drop mappings meanwhile (TSan) */
  size_t off = p->off_bytes;
  rmmc__unlock(&p->lock);
  rmmc_status_t st = rmmc__pool_paused_refusal(bytes);
  rmmc__append_error(" (%s of its pages are given back)", rmmc__format_bytes(off, b, sizeof b));
  return st;
}

/* The heap this thread cached was retired: its heap of the stream again. */
static POOL_NOINLINE rmmc_status_t small_again(pool_t *p, cudaStream_t stream, size_t n,
                                               size_t align, size_t bytes, void **out) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = rmmc__pool_heap_find(p, stream, rmmc__stream_key_fast(stream), &h, &o);
  return st == RMMC_SUCCESS ? small_allocate(p, h, o, stream, n, align, bytes, out) : st;
}

/* Large blocks: the shared heap's best fit that the stream may use at
 * once; else get_block, which takes the shared lock over. */
RMMC_HOT
static POOL_NOINLINE rmmc_status_t large_allocate(pool_t *p, pool_owner_t *o, cudaStream_t stream,
                                                  size_t n, size_t align, size_t bytes,
                                                  void **out) {
  size_t need = n + (align - POOL_GRANULE);
  rmmc__lock(&p->lock);
  rmmc_status_t st = shared_gate(p, o, bytes);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) goto unlock;
  pool_block_t *b = need <= POOL_MAX_REQUEST ? find_usable(p, o, n, align) : NULL;
  if (RMMC_UNLIKELY(b == NULL))
    return rmmc__pool_get_block(p, NULL, o, stream, n, align, bytes, out);
  rmmc__pool_unlink_free(p, b);
  st = large_hand_out(p, b, n, align, bytes, NULL, out);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

/* Keeps h's wholly free spans within cache_size (h's lock held). */
POOL_NOINLINE void rmmc__pool_heap_trim(pool_t *p, pool_sheap_t *h, cudaStream_t stream) {
  size_t keep = p->cache_size / p->small_chunk;
  rmmc__lock(&p->lock);
  (void)rmmc__pool_heap_release_idle(p, h, keep, stream, true);
  rmmc__unlock(&p->lock);
}

static POOL_NOINLINE rmmc_status_t wrong_size(const void *ptr, size_t had, size_t bytes) {
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p was allocated with %zu bytes, not %zu; nothing was freed", ptr,
                        had, bytes);
}

static rmmc_status_t not_ours(const void *ptr) {
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p was not allocated by this pool, or was freed already", ptr);
}

/* Frees the large block of map entry e on o's stream (shared lock held).
 * *cover: o's frees are due an event, which the caller records once it has
 * dropped the shared lock (cover_claim). */
static rmmc_status_t large_free(pool_t *p, pool_owner_t *o, rmmc__ptrmap_entry_t *e, void *ptr,
                                size_t bytes, bool *cover) {
  pool_block_t *b = e->value;
  if (RMMC_UNLIKELY(b->requested != bytes)) return wrong_size(ptr, b->requested, bytes);
  rmmc__ptrmap_remove(&p->used, e);
  size_t size = pool_bsize(b);
  p->committed -= size;
  b->state = B_FREE;
  pool_owner_t *g = b->owner; /* a graph pool's block goes back to it */
  if (RMMC_UNLIKELY(g != NULL)) {
    g->used_bytes -= size;
    if (!g->released) {
      b->tag = 0;
      rmmc__pool_put_free(p, b);
      return RMMC_SUCCESS;
    }
    rmmc__pool_graph_forget(p, g); /* released: the block is the freeing stream's, as any */
  }
  b->owner = o;
  b->tag = rmmc__stream_slot_tag(o->slot);
  p->clock++;
  rmmc__pool_put_free(p, b);
  *cover = cover_claim(p, o, size);
  return RMMC_SUCCESS;
}

/* A free that h's map does not hold: a large block, a block of another
 * stream's heap (a foreign free), or bad input. No lock held. */
RMMC_HOT
static POOL_NOINLINE rmmc_status_t free_slow(pool_t *p, pool_owner_t *o, void *ptr, size_t bytes,
                                             cudaStream_t stream) {
  rmmc__lock(&p->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, ptr);
  if (e != NULL) {
    rmmc_status_t st =
        RMMC_UNLIKELY(o->heap == NULL) ? rmmc__pool_owner_rejoin(p, o) : RMMC_SUCCESS;
    bool cover = false;
    if (st == RMMC_SUCCESS) st = large_free(p, o, e, ptr, bytes, &cover);
    rmmc__unlock(&p->lock);
    if (cover) (void)rmmc__stream_slot_try_record(&p->streams, o->slot, stream);
    return st;
  }
  e = p->small_chunk > 0
          ? rmmc__ptrmap_find(&p->spans, (void *)((uintptr_t)ptr & ~(p->small_chunk - 1)))
          : NULL;
  pool_sheap_t *a = e != NULL ? ((pool_region_t *)e->value)->heap : NULL;
  rmmc__unlock(&p->lock);
  if (a == NULL) return not_ours(ptr);
  rmmc_status_t st = RMMC_SUCCESS;
  bool foreign = false;
  uint64_t tag = 0;
  rmmc__lock(&a->lock);
  e = rmmc__ptrmap_find(&a->used, ptr);
  pool_block_t *b = e != NULL ? e->value : NULL;
  if (b == NULL) {
    st = not_ours(ptr);
  } else if (a->owner == o) { /* this stream's: another thread's heap of it */
    st = small_free(p, a, e, ptr, bytes, stream);
  } else if (b->requested != bytes) {
    st = wrong_size(ptr, b->requested, bytes);
  } else { /* reusable by a's stream once o's work up to now is done */
    rmmc__ptrmap_remove(&a->used, e);
    a->in_use -= pool_bsize(b);
    b->state = B_FOREIGN;
    b->owner = o;
    b->tag = tag = rmmc__stream_slot_tag(o->slot);
    b->qnext = a->foreign;
    a->foreign = b;
    a->nforeign++;
    foreign = true;
  }
  rmmc__unlock(&a->lock);
  if (foreign && !rmmc__stream_slot_covered(o->slot, tag)) rmmc__pool_cover_now(p, o, stream);
  return st;
}

#define POOL_OPS(NAME)                                                                         \
  {                                                                                            \
    .version = RMMC_RESOURCE_OPS_VERSION, .name = NAME, .allocate = pool_allocate,             \
    .deallocate = pool_deallocate, .release_cached = rmmc__pool_release_cached,                \
    .describe = rmmc__pool_describe, .destroy = rmmc__pool_destroy,                            \
    .upstream = rmmc__adaptor_upstream, .get_allocation = rmmc__pool_get_allocation,           \
    .set_memory_hooks = rmmc__pool_set_memory_hooks,                                           \
    .enable_peer_access = rmmc__pool_enable_peer_access,                                       \
  }
const rmmc_resource_ops_t rmmc__pool_ops = POOL_OPS("pool"),
                          rmmc__pool_arena_ops = POOL_OPS("arena");
