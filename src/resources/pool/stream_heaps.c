/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's stream heaps (core.h; docs/design.md, "Stream heaps"):
 * the pool's list of live heaps, making, reusing and retiring heaps, taking
 * and giving back spans, and frees from other streams (foreign).
 */
#include "core.h"

/* ---- the pool's list of live heaps (shared lock) ----
 *
 * Heaps are listed latest span taker first. Heaps are retired from the
 * other end: a stream that has not needed a span for longest, and holds no
 * block, is the one least likely to come back (a program that makes a
 * stream per request or per task leaves one such heap behind each time). */

static void heaps_remove(pool_t *p, pool_sheap_t *h) {
  if (h->hprev != NULL) h->hprev->hnext = h->hnext;
  else p->heaps = h->hnext;
  if (h->hnext != NULL) h->hnext->hprev = h->hprev;
  else p->heaps_tail = h->hprev;
  h->hprev = h->hnext = NULL;
}

static void heaps_push(pool_t *p, pool_sheap_t *h) {
  h->hprev = NULL;
  h->hnext = p->heaps;
  if (p->heaps != NULL) p->heaps->hprev = h;
  else p->heaps_tail = h;
  p->heaps = h;
}

static inline void heaps_touch(pool_t *p, pool_sheap_t *h) {
  if (p->heaps != h) {
    heaps_remove(p, h);
    heaps_push(p, h);
  }
}

/* Retires x (both locks held; x holds no block): its spans go back to the
 * shared heap, it leaves its stream's list and the pool's, and waits on the
 * spare list for reuse. Its stream leaves the list of owners once it has
 * neither a heap nor free blocks in the shared heap. */
static void heap_retire(pool_t *p, pool_sheap_t *x) {
  (void)rmmc__pool_heap_release_idle(p, x, 0, NULL, false);
  POOL_CHECK(p, NULL, rmmc__pool_heap_empty_ok, x);
  pool_owner_t *o = x->owner;
  pool_sheap_t **l = &o->heap;
  while (*l != x) l = &(*l)->onext;
  *l = x->onext;
  heaps_remove(p, x);
  x->owner = NULL;
  x->onext = p->spare_heaps;
  p->spare_heaps = x;
  p->nheaps--;
  p->heaps_gen++;
  p->heaps_retired++;
  if (o->heap == NULL && !o->pending) rmmc__pool_owner_unlist(p, o);
}

/* Past POOL_HEAPS_KEPT live heaps, each new heap retires up to two idle
 * ones, looking at no more than four from the old end of the list (one
 * found busy moves to the front): the number of heaps stays bounded however
 * many streams come and go, and a busy pool pays nothing. */
enum { POOL_HEAPS_KEPT = 256 };

static void heaps_retire_idle(pool_t *p) {
  int retired = 0;
  for (int looked = 0; looked < 4 && retired < 2 && p->heaps_tail != NULL; looked++) {
    pool_sheap_t *x = p->heaps_tail;
    if (!rmmc__lock_try(&x->lock)) {
      heaps_touch(p, x);
      continue;
    }
    if (x->nforeign > 0) (void)rmmc__pool_retire_foreign(p, x, NULL, false); /* finished ones */
    if (x->used.count == 0 && x->nforeign == 0) {
      heap_retire(p, x);
      retired++;
    } else {
      heaps_touch(p, x);
    }
    rmmc__unlock(&x->lock);
  }
}

/* Stripe `stripe`'s heap of o's stream, made (shared lock held): a spare
 * heap reused (one whose lock a stale caller holds is left for later) or a
 * new one. */
rmmc_status_t rmmc__pool_heap_new(pool_t *p, pool_owner_t *o, rmmc__stream_slot_t *slot,
                              unsigned stripe, pool_sheap_t **out) {
  /* Retiring first: it may retire o's own last heap (another stripe's),
   * and o then leaves the list and gives up its index; o is made ready and
   * listed only after, so it is never listed without an index (listed
   * after its index was freed, its next search would crash). */
  if (p->nheaps >= POOL_HEAPS_KEPT) heaps_retire_idle(p);
  if (!rmmc__pool_owner_ready(p, o)) return rmmc__pool_no_host_memory();
  pool_sheap_t *h = NULL;
  for (pool_sheap_t **l = &p->spare_heaps; *l != NULL; l = &(*l)->onext)
    if (rmmc__lock_try(&(*l)->lock)) {
      h = *l;
      *l = h->onext;
      break;
    }
  if (h != NULL) { /* emptied when retired: its map and block structs are kept */
    h->onext = NULL;
    h->stripe = stripe;
    h->hot = NULL;
    h->spans = NULL;
    h->nspans = h->nidle = 0;
    h->in_use = h->peak = 0;
    h->empties = 0;
    h->owner = o;
    rmmc__unlock(&h->lock);
  } else {
    h = aligned_alloc(64, sizeof *h);
    if (h == NULL) return rmmc__pool_no_host_memory();
    memset(h, 0, sizeof *h);
    h->pool = p;
    h->owner = o;
    h->stripe = stripe;
    rmmc__ptrmap_init(&h->used);
  }
  if (o->slot == NULL) o->slot = slot; /* once: other heaps' threads read it */
  rmmc__pool_owner_list(p, o);
  h->onext = o->heap;
  o->heap = h;
  heaps_push(p, h);
  p->nheaps++;
  p->heaps_gen++;
  *out = h;
  return RMMC_SUCCESS;
}

/* x's hot block merges with its neighbours and is indexed (x locked). */
static void heap_cool(pool_sheap_t *x) {
  pool_block_t *b = x->hot;
  x->hot = NULL;
  b->where = W_OUT;
  heap_link(x, heap_merge(x, b));
}

static void span_list_remove(pool_sheap_t *h, pool_region_t *sp) {
  if (sp->prev != NULL) sp->prev->next = sp->next;
  else h->spans = sp->next;
  if (sp->next != NULL) sp->next->prev = sp->prev;
}

/* Gives wholly free span sp of heap x back to the shared heap; both locks
 * are held. `stream`: the stream of the current call if it is x's (frees
 * then count towards covering), else NULL. */
static void span_give_back(pool_t *p, pool_sheap_t *x, pool_region_t *sp, cudaStream_t stream,
                           bool in_call) {
  if (x->hot != NULL && x->hot->region == sp) heap_cool(x); /* it merges into the whole span */
  POOL_CHECK(p, sp->parent, rmmc__pool_span_back_ok, p, sp);
  pool_block_t *f = sp->first;
  heap_unlink(x, f);
  pool_meta_put(&x->meta, f);
  span_list_remove(x, sp);
  x->nspans--;
  x->nidle--;
  rmmc__ptrmap_remove(&p->spans, rmmc__ptrmap_find(&p->spans, (void *)sp->base));
  pool_block_t *b = sp->parent;
  b->state = B_FREE;
  b->owner = sp->tag != 0 ? x->owner : NULL;
  b->tag = sp->tag;
  /* Host memory: covering another stream's frees costs nothing; device
   * memory waits for x's next call (the want flag) or a synchronization. */
  if (!in_call && !p->cuda && b->owner != NULL &&
      !rmmc__stream_slot_known_done(x->owner->slot, b->tag))
    (void)rmmc__stream_slot_try_record(&p->streams, x->owner->slot, NULL);
  else if (!in_call && b->owner != NULL)
    __atomic_store_n(&x->owner->slot->want, 1, __ATOMIC_RELAXED);
  POOL_SUB(p, p->committed, sp->size);
  POOL_SUB(p, p->span_bytes, sp->size);
  rmmc__pool_put_free(p, b);
  if (in_call && cover_claim(p, x->owner, sp->size)) /* stream: x's */
    (void)rmmc__stream_slot_try_record(&p->streams, x->owner->slot, stream);
  free(sp);
}

/* Takes back x's wholly free spans, keeping `keep` of them. */
size_t rmmc__pool_heap_release_idle(pool_t *p, pool_sheap_t *x, size_t keep, cudaStream_t stream,
                                bool in_call) {
  size_t n = 0;
  for (pool_region_t *sp = x->spans, *next; sp != NULL && x->nidle > keep; sp = next) {
    next = sp->next;
    if (sp->nused != 0 || (x->hot != NULL && x->hot->region == sp && keep > 0)) continue;
    span_give_back(p, x, sp, stream, in_call);
    n++;
  }
  return n;
}

/* Under the shared lock: other heaps not busy (try-locks only) give back
 * their wholly free spans. For `need` up to a span the first heap that
 * gives one back is enough (a whole span, aligned to its size, fits any
 * such request); above, every heap does, so that spans side by side can
 * merge. */
size_t rmmc__pool_reclaim_spans(pool_t *p, pool_sheap_t *skip, size_t need) {
  size_t n = 0;
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext) {
    /* nidle and nforeign are read under x's lock only (TSan). */
    if (x == skip || !rmmc__lock_try(&x->lock)) continue;
    if (x->nforeign > 0) (void)rmmc__pool_retire_foreign(p, x, NULL, false); /* finished ones */
    n += rmmc__pool_heap_release_idle(p, x, 0, NULL, false);
    rmmc__unlock(&x->lock);
    if (n > 0 && need <= p->small_chunk) break;
  }
  return n;
}

/* ---- small blocks: the stream heaps ---- */

/* A span for small request r's heap (h's lock held): lent by the shared
 * heap (its best fit, else the slow path's steps of r's pass), aligned to
 * its size so that a free from another stream finds it from the pointer. */
rmmc_status_t rmmc__pool_span_take(const pool_request_t *r) {
  pool_t *p = r->p;
  pool_sheap_t *h = r->h;
  pool_region_t *sp = calloc(1, sizeof *sp);
  if (sp == NULL || !pool_meta_room(&h->meta)) {
    free(sp);
    return rmmc__pool_no_host_memory();
  }
  pool_owner_t *o = h->owner;
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  if (!pool_meta_room(&p->meta)) {
    st = rmmc__pool_no_host_memory();
    goto fail;
  }
  pool_block_t *b = find_usable(p, o, p->small_chunk, p->small_chunk);
  if (b != NULL) rmmc__pool_unlink_free(p, b);
  else if ((st = rmmc__pool_shared_slow(r, &b)) != RMMC_SUCCESS)
    goto fail;
  b = rmmc__pool_carve(p, b, p->small_chunk, p->small_chunk);
  POOL_CHECK(p, b, rmmc__pool_block_ok, b, B_FREE);
  POOL_ASSERT(p, b, b->addr % p->small_chunk == 0 && pool_bsize(b) == p->small_chunk && b->where == W_OUT);
  *sp = (pool_region_t){.base = b->addr, .size = p->small_chunk, .parent = b, .heap = h};
  if (!rmmc__ptrmap_insert(&p->spans, (void *)b->addr, sp, 0)) {
    rmmc__pool_put_free(p, b);
    st = rmmc__pool_no_host_memory();
    goto fail;
  }
  b->state = B_SPAN;
  b->owner = NULL;
  p->committed += p->small_chunk;
  p->span_bytes += p->small_chunk;
  if (p->committed > p->committed_peak) new_peak(p);
  heaps_touch(p, h);
  rmmc__unlock(&p->lock);
  pool_block_t *f = pool_meta_take(&h->meta);
  *f = (pool_block_t){.node.size = p->small_chunk, .addr = b->addr, .region = sp, .state = B_FREE};
  sp->first = f;
  sp->next = h->spans;
  if (h->spans != NULL) h->spans->prev = sp;
  h->spans = sp;
  h->nspans++;
  h->nidle++;
  heap_link(h, f);
  return RMMC_SUCCESS;
fail:
  rmmc__unlock(&p->lock);
  free(sp);
  return st;
}

/* Blocks of h's spans freed on other streams: those whose work has
 * finished, or that an event covers (h's stream then waits on it, unless
 * it is being captured), become free. Returns how many. */
size_t rmmc__pool_retire_foreign(pool_t *p, pool_sheap_t *h, cudaStream_t stream, bool can_wait) {
  size_t n = 0;
  pool_owner_t *waited = NULL;
  for (pool_block_t **link = &h->foreign, *b; (b = *link) != NULL;) {
    rmmc__stream_slot_t *s = b->owner->slot;
    bool ok = rmmc__stream_slot_done(&p->streams, s, b->tag);
    if (!ok && can_wait && rmmc__stream_slot_covered(s, b->tag)) {
      if (waited == b->owner) ok = true;
      else if (rmmc__stream_slot_wait(&p->streams, s, stream) == RMMC_SUCCESS) {
        waited = b->owner;
        ok = true;
        b->region->tag = rmmc__stream_slot_tag(h->owner->slot); /* after the wait */
      } else {
        can_wait = false;
      }
    }
    if (!ok) {
      __atomic_store_n(&s->want, 1, __ATOMIC_RELAXED);
      link = &b->qnext;
      continue;
    }
    *link = b->qnext;
    POOL_ASSERT(p, b, b->state == B_FOREIGN && b->region->heap == h && b->region->nused > 0);
    POOL_SUB(p, h->nforeign, 1);
    b->state = B_FREE;
    b->owner = NULL;
    if (--b->region->nused == 0) h->nidle++;
    heap_link(h, heap_merge(h, b));
    n++;
  }
  return n;
}

void rmmc__pool_heaps_cool(pool_t *p) {
  for (pool_sheap_t *x = p->snap_first; x != NULL; x = x->snext)
    if (x->hot != NULL) heap_cool(x);
}

rmmc_status_t rmmc__pool_paused_refusal(size_t bytes) {
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                        "pool: cannot allocate %zu bytes: the pool is paused (rmmc_pool_pause) "
                        "and holds no memory until rmmc_pool_resume",
                        bytes);
}
