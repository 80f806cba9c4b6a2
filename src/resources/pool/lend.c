/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's last help before out of memory (core.h): other stream
 * heaps' free blocks, lent to a request the shared heap's steps could not
 * serve, and the out-of-memory message that says what stayed free.
 */
#include "core.h"

/* ---- out of memory: free blocks of other streams' heaps ----
 *
 * A stream heap's free blocks sit in spans that hold live blocks too, so
 * no other stream can take them by giving back idle spans: stream A fills
 * the pool with 512 KiB blocks and frees every other one, and stream B's
 * 512 KiB finds half the pool free and none of it in the shared heap.
 * When the shared heap's steps have failed, a request
 * that fits in a span is served from another heap's free block (the block
 * stays that heap's; B's free of it is a foreign free), as RMM's
 * get_block takes another stream's blocks: at once if that stream's work
 * before its frees into the span is known finished (or B's own stream's),
 * else behind a GPU-side wait on that stream's event when one covers them;
 * only after the last resort's synchronization, everything. */

/* A request the shared heap's steps before the last resort could not
 * serve, built once at the start of its out-of-memory path
 * (rmmc__pool_small_short, rmmc__pool_large_short): o is the stream's
 * owner, h the thread's heap of the stream for a small request (NULL for a
 * large one); n bytes (whole granules) at `align`, `bytes` as the caller
 * asked. */
typedef struct pool_request {
  pool_t *p;
  pool_sheap_t *h;
  pool_owner_t *o;
  cudaStream_t stream;
  size_t n, align, bytes;
} pool_request_t;

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

/* Other heaps lend a block for r (no lock held): true with *out set, or
 * false with the thread's error state as it was and *seen telling what the
 * heaps hold. */
static POOL_NOINLINE bool heaps_lend(const pool_request_t *r, lend_seen_t *seen, void **out) {
  pool_t *p = r->p;
  *seen = (lend_seen_t){0};
  if (r->n + (r->align - POOL_GRANULE) > p->span) return false;
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

/* The heap this thread cached was retired: its heap of the stream again. */
POOL_NOINLINE rmmc_status_t rmmc__pool_small_again(pool_t *p, cudaStream_t stream, size_t n,
                                               size_t align, size_t bytes, void **out) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = rmmc__pool_heap_stale(p, stream, &h, &o);
  return st == RMMC_SUCCESS ? rmmc__pool_small_allocate(p, h, o, stream, n, align, bytes, out) : st;
}

/* Small request r's last resort (no lock held): its heap's own blocks,
 * then a span from the shared heap's last resort (policy.c). False when
 * the heap was retired meanwhile (nothing done), else true with the
 * status in *st. */
static bool heap_last_resort(const pool_request_t *r, rmmc_status_t *st, void **out) {
  pool_sheap_t *h = r->h;
  rmmc__lock(&h->lock);
  if (h->owner != r->o) {
    rmmc__unlock(&h->lock);
    return false;
  }
  pool_block_t *b;
  *st = rmmc__pool_small_general(r->p, h, r->stream, r->n, r->n + (r->align - POOL_GRANULE),
                                 r->align, r->bytes, SLOW_LAST, &b);
  if (*st == RMMC_SUCCESS) {
    heap_hand_out(h, b, r->bytes);
    *out = (void *)b->addr;
  }
  rmmc__unlock(&h->lock);
  return true;
}

/* A request the shared heap's steps before the last resort could not
 * serve, small (r->h: the thread's heap) or large (no lock held), in named
 * steps: other heaps lend; the last resort; other heaps lend again, now
 * that every stream's work is known finished; out of memory. */
static rmmc_status_t pool_short(const pool_request_t *r, void **out) {
  lend_seen_t seen;
  rmmc_status_t st;
  if (heaps_lend(r, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  if (r->h == NULL)
    st = rmmc__pool_large_allocate(r->p, r->o, r->stream, r->n, r->align, r->bytes, SLOW_LAST, out);
  else if (!heap_last_resort(r, &st, out))
    return rmmc__pool_small_again(r->p, r->stream, r->n, r->align, r->bytes, out);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && heaps_lend(r, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  return pool_out_of_memory(r->p, &seen, st);
}

/* The entries from the fast paths (pool.c), which build the request only
 * here, off their frames. */
POOL_NOINLINE rmmc_status_t rmmc__pool_small_short(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                                   cudaStream_t stream, size_t n, size_t align,
                                                   size_t bytes, void **out) {
  return pool_short(&(pool_request_t){p, h, o, stream, n, align, bytes}, out);
}

POOL_NOINLINE rmmc_status_t rmmc__pool_large_short(pool_t *p, pool_owner_t *o, cudaStream_t stream,
                                                   size_t n, size_t align, size_t bytes,
                                                   void **out) {
  return pool_short(&(pool_request_t){p, NULL, o, stream, n, align, bytes}, out);
}
