/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's request path past the fast paths (core.h): get_block
 * takes a request the fast paths missed through named steps in order
 * (docs/design.md, "A request through the pool", step 5), among them the
 * last help before out of memory: other stream heaps' free blocks lent.
 */
#include "core.h"

/* ---- lending: free blocks of other streams' heaps ----
 *
 * A heap's free blocks sit in spans that hold live blocks too, so giving
 * back idle spans frees none of them: stream A fills the pool with 512 KiB
 * blocks and frees every other one, and B's 512 KiB finds half the pool
 * free and none of it in the shared heap. So, as RMM's get_block takes
 * another stream's blocks, a request that fits in a span is served from
 * another heap's free block, which stays that heap's (B's free of it is a
 * foreign free). */

typedef struct lend_seen {
  size_t free_bytes, largest; /* free in the heaps it looked at */
  bool pending;               /* a fitting block waits for another stream's work */
} lend_seen_t;

/* Lists the live heaps through snext (snap_lock held): returns the first. */
pool_sheap_t *rmmc__pool_heaps_snapshot(pool_t *p) {
  rmmc__lock(&p->lock);
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext) x->snext = x->hnext;
  pool_sheap_t *first = p->heaps;
  rmmc__unlock(&p->lock);
  return first;
}

/* One heap x (locked, live) lends a block for r, or not. */
static bool heap_lend(const pool_request_t *r, pool_sheap_t *x, bool capturing, lend_seen_t *seen,
                      void **out) {
  pool_t *p = r->p;
  if (__atomic_load_n(&p->paused, __ATOMIC_RELAXED)) return false; /* raced a pause (exact: x locked) */
  size_t need = r->n + (r->align - POOL_GRANULE);
  size_t largest = rmmc__tlsf_largest(&x->idx);
  if (x->hot != NULL && pool_bsize(x->hot) > largest) largest = pool_bsize(x->hot);
  seen->free_bytes += heap_cached_bytes(x);
  if (largest > seen->largest) seen->largest = largest;
  pool_block_t *b = heap_search(x, need);
  if (b == NULL || !pool_meta_room(&x->meta)) return false;
  rmmc__stream_slot_t *s = x->owner->slot;
  uint64_t tag = b->region->tag;
  bool ok = x->owner == r->o || rmmc__stream_slot_known_done(s, tag);
  if (!ok && !p->cuda) /* host memory: no work behind a stream, a record costs nothing */
    ok = rmmc__stream_slot_try_record(&p->streams, s, NULL);
  if (!ok) ok = rmmc__stream_slot_done(&p->streams, s, tag);
  if (!ok && !capturing && rmmc__stream_slot_covered(s, tag))
    ok = rmmc__stream_slot_wait(&p->streams, s, r->stream) == RMMC_SUCCESS;
  if (!ok) { /* its stream covers its frees at its next call */
    __atomic_store_n(&s->want, 1, __ATOMIC_RELAXED);
    seen->pending = true;
    return false;
  }
  if ((b = heap_carve(x, b, r->n, r->align, r->bytes)) == NULL) return false;
  heap_hand_out(x, b, r->bytes);
  *out = (void *)b->addr;
  return true;
}

/* Other heaps lend a block for r (no lock held): true with *out set and the
 * call's error state as at its start, or false with the thread's error
 * state as it was and *seen telling what the heaps hold. */
static POOL_NOINLINE bool heaps_lend(const pool_request_t *r, lend_seen_t *seen, void **out) {
  pool_t *p = r->p;
  *seen = (lend_seen_t){0};
  if (r->n + (r->align - POOL_GRANULE) > p->small_chunk) return false;
  bool capturing = p->cuda && rmmc__stream_is_capturing(r->stream);
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  bool lent = false;
  pthread_mutex_lock(&p->snap_lock);
  for (pool_sheap_t *x = rmmc__pool_heaps_snapshot(p); x != NULL && !lent; x = x->snext) {
    rmmc__lock(&x->lock);
    if (x->owner != NULL) lent = heap_lend(r, x, capturing, seen, out);
    rmmc__unlock(&x->lock);
  }
  pthread_mutex_unlock(&p->snap_lock);
  rmmc__error_restore(&saved);
  if (lent) (void)rmmc__error_restore_call_start();
  return lent;
}

/* The pool's out of memory after every step (the message set, `st` out of
 * memory): says what stays free in the heaps and why it could not serve,
 * and tells the wrapper that the rule was applied. */
static rmmc_status_t pool_out_of_memory(pool_t *p, const lend_seen_t *seen, rmmc_status_t st) {
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  if (seen->free_bytes > 0) {
    char fb[32], lb[32];
    rmmc__append_error("; %s stays free inside stream heaps' spans that hold live blocks, largest "
                       "free block %s%s",
                       rmmc__format_bytes(seen->free_bytes, fb, sizeof fb),
                       rmmc__format_bytes(seen->largest, lb, sizeof lb),
                       seen->pending ? ", one that fits waits for another stream's work" : "");
  }
  rmmc__oom_rule_applied(&p->base.base);
  return st;
}

/* ---- get_block ----
 *
 * Its steps (none calls back into get_block; a heap retired while its lock
 * was dropped is replaced in the request by the stream's heap now):
 *   1. own heap (small; h locked): h's index, then foreign frees done;
 *   2. shared heap (shared lock): a span (small) or the request (large),
 *      by the slow path's steps before the last resort (policy.c);
 *   3. lend (no lock held);
 *   4. release and retry: steps 1 and 2 with the last resort;
 *   5. lend again; else out of memory. */

/* Step 1 (h locked): h's own free blocks, on the caller's values (the
 * common path past the hot block, which builds no request). *out: the
 * block, or NULL when none fits (then a span). */
static inline rmmc_status_t own_heap(pool_t *p, pool_sheap_t *h, cudaStream_t stream, size_t n,
                                     size_t align, size_t bytes, pool_block_t **out) {
  size_t need = n + (align - POOL_GRANULE);
  *out = NULL;
  if (!pool_meta_room(&h->meta)) return rmmc__pool_no_host_memory();
  /* Passed the pause gate as a pause began: the free blocks may have no
   * pages behind them now (the pause holds h's lock while it sets it). */
  if (RMMC_UNLIKELY(__atomic_load_n(&p->paused, __ATOMIC_RELAXED)))
    return rmmc__pool_paused_refusal(bytes);
  if (RMMC_UNLIKELY(__atomic_load_n(&h->owner->slot->want, __ATOMIC_RELAXED)))
    rmmc__pool_cover_now(p, h->owner, stream);
  pool_block_t *b = heap_search(h, need);
  if (b == NULL && h->nforeign > 0 &&
      rmmc__pool_retire_foreign(p, h, stream, !p->cuda || !rmmc__stream_is_capturing(stream)) > 0) {
    if (h->nidle * p->small_chunk > p->cache_size) rmmc__pool_heap_trim(p, h, stream);
    b = heap_search(h, need);
  }
  if (b != NULL && (*out = heap_carve(h, b, n, align, bytes)) == NULL)
    return rmmc__pool_no_host_memory();
  return RMMC_SUCCESS;
}

/* Hands out block b of h (h locked; dropped here). */
static inline rmmc_status_t heap_give(pool_sheap_t *h, pool_block_t *b, size_t bytes, void **out) {
  heap_hand_out(h, b, bytes);
  *out = (void *)b->addr;
  rmmc__unlock(&h->lock);
  return RMMC_SUCCESS;
}

/* After step 1 of small request r (its status st, its block b or NULL; h
 * locked, dropped here): step 2, a span from the shared heap, when h had
 * no block; the block handed out. */
static rmmc_status_t heap_finish(const pool_request_t *r, rmmc_status_t st, pool_block_t *b,
                                 void **out) {
  pool_sheap_t *h = r->h;
  if (st == RMMC_SUCCESS && b == NULL && (st = rmmc__pool_span_take(r)) == RMMC_SUCCESS &&
      (b = heap_carve(h, heap_search(h, r->n + (r->align - POOL_GRANULE)), r->n, r->align,
                      r->bytes)) == NULL)
    st = rmmc__pool_no_host_memory();
  if (st == RMMC_SUCCESS) return heap_give(h, b, r->bytes, out);
  rmmc__unlock(&h->lock);
  return st;
}

/* Step 2 of a large request (shared lock held; dropped here): the shared
 * heap's slow path, the block handed out. In the second pass the lock is
 * taken afresh, so its gate and best fit come first, as on the fast path. */
static rmmc_status_t shared_steps(const pool_request_t *r, void **out) {
  pool_t *p = r->p;
  pool_block_t *b = NULL;
  rmmc_status_t st = RMMC_SUCCESS;
  if (r->steps == SLOW_LAST) {
    rmmc__lock(&p->lock);
    if ((st = shared_gate(p, r->o, r->bytes)) != RMMC_SUCCESS) goto unlock;
    if (r->n + (r->align - POOL_GRANULE) <= POOL_MAX_REQUEST &&
        (b = find_usable(p, r->o, r->n, r->align)) != NULL)
      rmmc__pool_unlink_free(p, b);
  }
  if (b == NULL && (st = rmmc__pool_shared_slow(r, &b)) != RMMC_SUCCESS) goto unlock;
  st = large_hand_out(p, b, r->n, r->align, r->bytes, NULL, out);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

#if RMMC_DEBUG_CHECKS >= 1
void (*rmmc__pool_before_retry)(pool_t *p);
#endif

/* Steps 2-5 of request r; st: step 1's status (RMMC_SUCCESS: h had no
 * block, or r is large). Entered with the fast path's lock held. */
static POOL_NOINLINE rmmc_status_t request_steps(pool_request_t *r, rmmc_status_t st, void **out) {
  pool_sheap_t *h = r->h;
  lend_seen_t seen;
  /* 2. */
  st = h != NULL ? heap_finish(r, st, NULL, out) : shared_steps(r, out);
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  /* 3. */
  if (heaps_lend(r, &seen, out)) return RMMC_SUCCESS;
  /* 4. */
  r->steps = SLOW_LAST;
  if (h == NULL) {
    st = shared_steps(r, out);
  } else {
#if RMMC_DEBUG_CHECKS >= 1
    if (rmmc__pool_before_retry != NULL) rmmc__pool_before_retry(r->p);
#endif
    rmmc__lock(&h->lock);
    while (h->owner != r->o) { /* h was retired meanwhile: the stream's heap now */
      rmmc__unlock(&h->lock);
      st = rmmc__pool_heap_find(r->p, r->stream, rmmc__stream_key_fast(r->stream), &r->h, &r->o);
      if (st != RMMC_SUCCESS) return st;
      h = r->h;
      rmmc__lock(&h->lock);
    }
    pool_block_t *b;
    st = own_heap(r->p, h, r->stream, r->n, r->align, r->bytes, &b);
    st = heap_finish(r, st, b, out);
  }
  /* 5. */
  if (st == RMMC_ERROR_OUT_OF_MEMORY && heaps_lend(r, &seen, out)) return RMMC_SUCCESS;
  return pool_out_of_memory(r->p, &seen, st);
}

/* Step 1 here; the request is built only past it. */
RMMC_HOT
POOL_NOINLINE rmmc_status_t rmmc__pool_get_block(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                                 cudaStream_t stream, size_t n, size_t align,
                                                 size_t bytes, void **out) {
  rmmc_status_t st = RMMC_SUCCESS;
  if (h != NULL) {
    pool_block_t *b;
    st = own_heap(p, h, stream, n, align, bytes, &b);
    if (RMMC_LIKELY(b != NULL)) return heap_give(h, b, bytes, out);
  }
  pool_request_t r = {.p = p, .h = h, .o = o, .stream = stream, .n = n, .align = align,
                      .bytes = bytes, .take = h != NULL ? p->small_chunk : n,
                      .take_align = h != NULL ? p->small_chunk : align, .steps = SLOW_BEFORE_LAST};
  return request_steps(&r, st, out);
}
