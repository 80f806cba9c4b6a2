/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool resource: the stream-ordering core (include/rmmc/pool_resource.h
 * has the contract and the policies, pool_internal.h the layout of memory
 * and the locks; growth and giving back live in the backends,
 * chunks.c and vm.c).
 *
 * Hot paths. A call finds its stream's heap through a small thread-local
 * cache keyed by (pool id, stream). A small request takes the heap's lock,
 * then the heap's hot block (exact size) or an O(1) index search, carves,
 * and inserts one entry into the heap's pointer map; a small free takes the
 * lock, finds and removes the entry, merges with free neighbours and
 * becomes the new hot block. A large request does the same in the shared
 * heap under its lock, with the search over the clean blocks and the
 * stream's own. Everything else (a new span, other streams' memory, growth)
 * is out of line.
 *
 * Shared free blocks and their owners. A free block freed on stream S
 * sits in S's index (owner S, tag: S's epoch) or, once no stream's work is
 * pending on it, in the clean index. Merging (rmmc__pool_merge): blocks of
 * the same owner merge (the tag is the later one), a clean block merges
 * with any and takes the other's owner and tag; blocks whose epoch is known
 * finished count as clean. Blocks are relabeled clean lazily, when touched
 * or in a consolidation pass before the pool grows.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec/spec.h"
#include "pool_internal.h"
#include "rmmc/registry.h"

#define TL_WAYS 8u

#if defined(__GNUC__) || defined(__clang__)
#define POOL_NOINLINE __attribute__((noinline))
#else
#define POOL_NOINLINE
#endif

static const rmmc_resource_ops_t pool_ops, arena_ops;

/* The arena (arena.c) is this pool under another name: both tables. */
static inline bool is_pool(const rmmc_resource_t *r) {
  return r != NULL && (r->ops == &pool_ops || r->ops == &arena_ops);
}
static rmmc_status_t not_a_pool(const char *what, const rmmc_resource_t *r) {
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s is not a pool", what,
                        r == NULL ? "NULL" : r->ops->name);
}
static uint64_t next_pool_id;

/* ---- the thread cache: (pool id, stream key) -> stream heap ---- */

typedef struct tl_entry {
  uint64_t pool;
  const void *key;
  pool_sheap_t *heap;  /* may have been retired since: checked under its lock */
  pool_owner_t *owner; /* the stream's owner, which lives as long as the pool */
} tl_entry_t;

/* A thread's number, given on its first call into any pool: threads on one
 * stream take the stream's heaps in turn (number modulo the stripes). A
 * thread that exits gives its number back and the next new thread takes
 * the lowest free one, so threads that come and go (a pool of workers made
 * anew, each epoch of a replay) keep using the same heaps of a stream
 * instead of making a new one each time, which strands the old ones' spans
 * (on 16 CPUs the 4-stream log's warm epoch reserved 1.060x instead of
 * 1.045x over sim, the server log's 1.245x instead of 1.225x). Numbers past
 * THREAD_NUMBERS are never given back. */
enum { THREAD_NUMBERS = 4096 };
static _Thread_local unsigned tl_number;
static pthread_mutex_t numbers_lock = PTHREAD_MUTEX_INITIALIZER;
static bool number_taken[THREAD_NUMBERS];
static unsigned next_thread_number = THREAD_NUMBERS;

static unsigned thread_number_take(void) {
  pthread_mutex_lock(&numbers_lock);
  unsigned n = 0;
  while (n < THREAD_NUMBERS && number_taken[n]) n++;
  if (n < THREAD_NUMBERS) number_taken[n] = true;
  pthread_mutex_unlock(&numbers_lock);
  return n < THREAD_NUMBERS ? n + 1 : __atomic_add_fetch(&next_thread_number, 1, __ATOMIC_RELAXED);
}

static void thread_number_give(unsigned n) {
  if (n == 0 || n > THREAD_NUMBERS) return;
  pthread_mutex_lock(&numbers_lock);
  number_taken[n - 1] = false;
  pthread_mutex_unlock(&numbers_lock);
}

static inline unsigned thread_stripe(const pool_t *p) {
  if (tl_number == 0) tl_number = thread_number_take();
  return (tl_number - 1) % p->stripes;
}

static _Thread_local tl_entry_t *tl_cache RMMC_TLS_FAST;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static bool tl_key_ok;

static void tl_free(void *c) { /* the thread exits */
  free(c);
  tl_cache = NULL;
  thread_number_give(tl_number);
  tl_number = 0;
}

static void tl_init(void) { tl_key_ok = pthread_key_create(&tl_key, tl_free) == 0; }

static inline unsigned tl_way(uint64_t pool, const void *key) {
  uint64_t h = (pool ^ (uint64_t)(uintptr_t)key) * UINT64_C(0x9E3779B97F4A7C15);
  return (unsigned)(h >> 61) & (TL_WAYS - 1);
}

static inline tl_entry_t *heap_cached(const pool_t *p, const void *key) {
  tl_entry_t *c = tl_cache;
  if (RMMC_LIKELY(c != NULL)) {
    tl_entry_t *e = &c[tl_way(p->id, key)];
    if (RMMC_LIKELY(e->pool == p->id && e->key == key)) return e;
  }
  return NULL;
}

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

/* Stripe `stripe`'s heap of o (shared lock held). */
static pool_sheap_t *heap_of_stripe(pool_owner_t *o, unsigned stripe) {
  pool_sheap_t *h = o->heap;
  while (h != NULL && h->stripe != stripe) h = h->onext;
  return h;
}

static size_t heap_release_idle(pool_t *p, pool_sheap_t *x, size_t keep, cudaStream_t stream,
                                bool in_call);
static size_t retire_foreign(pool_t *p, pool_sheap_t *h, cudaStream_t stream, bool can_wait);

/* Retires x (both locks held; x holds no block): its spans go back to the
 * shared heap, it leaves its stream's list and the pool's, and waits on the
 * spare list for reuse. Its stream leaves the list of owners once it has
 * neither a heap nor free blocks in the shared heap. */
static void heap_retire(pool_t *p, pool_sheap_t *x) {
  (void)heap_release_idle(p, x, 0, NULL, false);
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
 * found busy moves to the front, so the next look starts with others):
 * the number of heaps, and every pass over them, stays bounded however many
 * streams come and go, and a busy pool pays nothing. */
enum { POOL_HEAPS_KEPT = 256 };

static void heaps_retire_idle(pool_t *p) {
  int retired = 0;
  for (int looked = 0; looked < 4 && retired < 2 && p->heaps_tail != NULL; looked++) {
    pool_sheap_t *x = p->heaps_tail;
    if (!rmmc__lock_try(&x->lock)) {
      heaps_touch(p, x);
      continue;
    }
    if (x->nforeign > 0) (void)retire_foreign(p, x, NULL, false); /* finished ones */
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
static rmmc_status_t heap_new(pool_t *p, pool_owner_t *o, rmmc__stream_slot_t *slot,
                              unsigned stripe, pool_sheap_t **out) {
  if (!rmmc__pool_owner_ready(p, o)) return rmmc__pool_no_host_memory();
  if (p->nheaps >= POOL_HEAPS_KEPT) heaps_retire_idle(p);
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
    h->nspans = h->nidle = h->low_idle = 0;
    h->tick = 0;
    h->in_use = h->peak = 0;
    h->span_takes = h->span_returns = 0;
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

/* The calling thread's heap of `stream` (key `key`), made on first use, and
 * cached for this thread with the stream's owner. */
static POOL_NOINLINE rmmc_status_t heap_find(pool_t *p, cudaStream_t stream, const void *key,
                                             pool_sheap_t **out, pool_owner_t **owner) {
  rmmc__stream_slot_t *slot;
  rmmc_status_t st = rmmc__stream_set_get(&p->streams, stream, &slot);
  if (st != RMMC_SUCCESS) return st;
  pool_owner_t *o = rmmc__stream_slot_user(slot);
  unsigned stripe = thread_stripe(p);
  rmmc__lock(&p->lock);
  pool_sheap_t *h = heap_of_stripe(o, stripe);
  if (h == NULL) st = heap_new(p, o, slot, stripe, &h);
  rmmc__unlock(&p->lock);
  if (st != RMMC_SUCCESS) return st;
  if (tl_cache == NULL) {
    pthread_once(&tl_once, tl_init);
    tl_entry_t *c = calloc(TL_WAYS, sizeof *c);
    if (c != NULL && tl_key_ok && pthread_setspecific(tl_key, c) == 0) tl_cache = c;
    else free(c);
  }
  if (tl_cache != NULL) tl_cache[tl_way(p->id, key)] = (tl_entry_t){p->id, key, h, o};
  *out = h;
  *owner = o;
  return RMMC_SUCCESS;
}

/* The calling thread's heap of `stream` and the stream's owner. The heap
 * may have been retired since it was cached: whoever locks it checks that
 * its owner is still o (heap_stale). */
static inline rmmc_status_t heap_of(pool_t *p, cudaStream_t stream, pool_sheap_t **out,
                                    pool_owner_t **owner) {
  const void *key = rmmc__stream_key_fast(stream);
  tl_entry_t *e = heap_cached(p, key);
  if (RMMC_LIKELY(e != NULL)) {
    *out = e->heap;
    *owner = e->owner;
    return RMMC_SUCCESS;
  }
  return heap_find(p, stream, key, out, owner);
}

/* h was retired (and maybe reused) since this thread cached it: the
 * thread's heap of the stream again (h is not locked). */
static POOL_NOINLINE rmmc_status_t heap_stale(pool_t *p, cudaStream_t stream, pool_sheap_t **h,
                                              pool_owner_t **o) {
  return heap_find(p, stream, rmmc__stream_key_fast(stream), h, o);
}

/* ---- streams' epochs ---- */

/* Counts a free of `bytes` into the shared heap on o's stream (shared
 * lock). True when o's frees are now due an event (enough wait, or another
 * stream asked, and other streams use the pool): the counts start again
 * and the caller records o's event on o's stream, after dropping the
 * shared lock where it can (a record is a driver call, 0.3 us and more,
 * and the runtime serializes it across threads). */
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

/* Covers o's frees now, from outside the shared lock: its counts start
 * again under the lock, the record (on `stream`, o's) follows outside. */
static void cover_now(pool_t *p, pool_owner_t *o, cudaStream_t stream) {
  rmmc__lock(&p->lock);
  o->uncovered = 0;
  o->uncovered_bytes = 0;
  rmmc__unlock(&p->lock);
  (void)rmmc__stream_slot_try_record(&p->streams, o->slot, stream);
}

/* Relabels clean q's shared free blocks whose epoch is known finished and
 * merges them. A free is tagged past the epoch finished at the time, so
 * while q's finished epoch stays where the last pass saw it there is
 * nothing to do. */
static void consolidate_owner(pool_t *p, pool_owner_t *q) {
  uint64_t done = __atomic_load_n(&q->slot->epoch_done, __ATOMIC_ACQUIRE);
  if (q->qhead == NULL || done == q->seen_done) return;
  q->seen_done = done;
  pool_block_t *settled = NULL;
  for (pool_block_t *b = q->qhead, *next; b != NULL; b = next) {
    next = b->qnext;
    if (b->tag > done) continue;
    rmmc__pool_unlink_free(p, b);
    b->owner = NULL;
    b->qnext = settled;
    settled = b;
  }
  for (pool_block_t *b = settled, *next; b != NULL; b = next) {
    next = b->qnext;
    rmmc__pool_put_free(p, b);
  }
}

/* Every stream's finished frees coalesce (asking CUDA once per stream with
 * recorded, unfinished frees when `ask`): before the pool grows. A stream
 * left with neither a heap nor free blocks leaves the list of owners here
 * (only here and in heap_retire: no other pass over the list unlinks). */
static void consolidate(pool_t *p, bool ask) {
  for (pool_owner_t *q = p->pending, *next; q != NULL; q = next) {
    next = q->pnext;
    if (q->qhead == NULL) {
      rmmc__pool_pending_remove(p, q);
      if (q->heap == NULL) rmmc__pool_owner_unlist(p, q);
      continue;
    }
    if (ask) {
      rmmc__stream_slot_t *s = q->slot;
      (void)rmmc__stream_slot_done(&p->streams, s, __atomic_load_n(&s->epoch_recorded, __ATOMIC_ACQUIRE));
    }
    consolidate_owner(p, q);
  }
}

/* ---- the shared heap's search ---- */

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
static inline pool_block_t *find_usable(pool_t *p, pool_owner_t *o, size_t n, size_t align) {
  pool_block_t *b = find_usable_raw(p, o, n);
  if (align <= POOL_GRANULE || b == NULL) return b;
  if (rmmc__align_up(b->addr, align) + n <= pool_bend(b)) return b;
  return find_usable_raw(p, o, n + align - POOL_GRANULE);
}

/* Other streams' blocks that would serve a request of `need` bytes. A
 * stream whose fitting block an event covers is asked (one query) whether
 * that work has finished: then its finished frees coalesce and *settled is
 * set (search again). Otherwise the best such block is returned (o's
 * stream may take it after waiting on that event), *from its owner.
 * Streams whose fitting block no event covers yet are asked to record. */
static pool_block_t *find_covered(pool_t *p, pool_owner_t *o, size_t need, pool_owner_t **from,
                                  bool *settled) {
  *settled = false;
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) { /* finished: coalesce */
    if (q == o) continue;
    rmmc__tlsf_node_t *x = rmmc__tlsf_find(q->idx, need);
    if (x == NULL) continue;
    uint64_t tag = pool_block_of(x)->tag;
    /* Host memory: no work behind a stream, so covering another stream's
     * frees costs nothing (as span_give_back does). Done once streams come
     * and go (heaps were retired): a stream that never comes back would
     * keep its frees, and the clean memory beside them, for good (over
     * event_interval=64, 30,000 streams held 2 MiB each). Before, each
     * stream covers its own, as on a GPU: covering for them changes
     * placement (the 4-stream transformer log over sim, 1.047x -> 1.057x). */
    if (!rmmc__stream_slot_covered(q->slot, tag) &&
        (p->cuda || p->heaps_retired == 0 ||
         !rmmc__stream_slot_try_record(&p->streams, q->slot, NULL))) {
      __atomic_store_n(&q->slot->want, 1, __ATOMIC_RELAXED);
    } else if (rmmc__stream_slot_done(&p->streams, q->slot, tag)) {
      consolidate_owner(p, q);
      *settled = true;
    }
  }
  pool_block_t *best = NULL; /* then the best still pending behind an event */
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) {
    if (q == o) continue;
    rmmc__tlsf_node_t *x = rmmc__tlsf_find(q->idx, need);
    if (x == NULL) continue;
    pool_block_t *b = pool_block_of(x);
    if (!rmmc__stream_slot_covered(q->slot, b->tag)) continue;
    if (best == NULL || pool_bsize(b) < pool_bsize(best)) best = b, *from = q;
  }
  return best;
}

/* Other streams' frees that their events cover but that have not finished
 * yet: o's stream waits on the GPU for one such stream's last event (no
 * host stall), its covered blocks become o's own (tagged with o's next
 * epoch: another stream may take them once o's work up to now is done,
 * which includes the wait) and merge with o's and clean neighbours, one
 * stream at a time until a block of `need` bytes is free. Memory that
 * several streams freed side by side so joins into one block without a
 * synchronization. Returns that block (unindexed not yet: find_usable's),
 * or NULL when no stream's covered frees make one. */
static pool_block_t *adopt_covered(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t need,
                                   size_t align) {
  uint64_t mine = rmmc__stream_slot_tag(o->slot);
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) {
    if (q == o || q->slot == NULL || q->qhead == NULL) continue;
    uint64_t rec = __atomic_load_n(&q->slot->epoch_recorded, __ATOMIC_ACQUIRE);
    pool_block_t *b = q->qhead;
    while (b != NULL && b->tag > rec) b = b->qnext;
    if (b == NULL) continue;
    if (rmmc__stream_slot_wait(&p->streams, q->slot, stream) != RMMC_SUCCESS) return NULL;
    pool_block_t *moved = NULL;
    for (pool_block_t *next; b != NULL; b = next) {
      next = b->qnext;
      if (b->tag > rec) continue;
      rmmc__pool_unlink_free(p, b);
      b->owner = o;
      b->tag = mine;
      b->qnext = moved;
      moved = b;
    }
    for (pool_block_t *next; moved != NULL; moved = next) {
      next = moved->qnext;
      rmmc__pool_put_free(p, moved);
    }
    p->adoptions++;
    if ((b = find_usable(p, o, need, align)) != NULL) return b;
  }
  return NULL;
}

/* ---- stream heaps: spans lent by the shared heap ---- */

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
  pool_block_t *hot = x->hot;
  if (hot != NULL && hot->region == sp) { /* the hot block merges into the whole span */
    x->hot = NULL;
    hot->where = W_OUT;
    heap_link(x, heap_merge(x, hot));
  }
  pool_block_t *f = sp->first;
  heap_unlink(x, f);
  pool_meta_put(&x->meta, f);
  span_list_remove(x, sp);
  x->nspans--;
  x->nidle--;
  if (x->low_idle > x->nidle) x->low_idle = x->nidle;
  x->span_returns++;
  rmmc__ptrmap_remove(&p->spans, rmmc__ptrmap_find(&p->spans, (void *)sp->base));
  pool_block_t *b = sp->parent;
  b->state = B_FREE;
  b->owner = sp->tag != 0 ? x->owner : NULL;
  b->tag = sp->tag;
  /* Host memory: streams are keys with no work behind them, so covering
   * another stream's frees costs nothing (device memory waits for x's next
   * call, which the want flag asks for, or a synchronization). */
  if (!in_call && !p->cuda && b->owner != NULL &&
      !rmmc__stream_slot_known_done(x->owner->slot, b->tag))
    (void)rmmc__stream_slot_try_record(&p->streams, x->owner->slot, NULL);
  else if (!in_call && b->owner != NULL)
    __atomic_store_n(&x->owner->slot->want, 1, __ATOMIC_RELAXED);
  p->committed -= sp->size;
  p->span_bytes -= sp->size;
  rmmc__pool_put_free(p, b);
  if (in_call && cover_claim(p, x->owner, sp->size)) /* stream: x's */
    (void)rmmc__stream_slot_try_record(&p->streams, x->owner->slot, stream);
  free(sp);
}

/* Takes back x's wholly free spans, keeping `keep` of them. */
static size_t heap_release_idle(pool_t *p, pool_sheap_t *x, size_t keep, cudaStream_t stream,
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

/* Under the shared lock: every other heap that is not busy gives back its
 * wholly free spans (try-locks only, so it never waits on a heap). */
static size_t retire_foreign(pool_t *p, pool_sheap_t *h, cudaStream_t stream, bool can_wait);

/* For a request of `need` bytes (aligned at most to a span): up to a span,
 * the first heap (latest span taker first) that gives back a span is
 * enough, since a whole span, aligned to its size, fits any such request;
 * above, every heap gives back, so that spans side by side can merge. */
static size_t reclaim_spans(pool_t *p, pool_sheap_t *skip, size_t need) {
  size_t n = 0;
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext) {
    /* nidle and nforeign change under x's lock only: read them there (a
     * peek without it is a data race, which the TSan pass reported). */
    if (x == skip || !rmmc__lock_try(&x->lock)) continue;
    if (x->nforeign > 0) (void)retire_foreign(p, x, NULL, false); /* finished ones */
    n += heap_release_idle(p, x, 0, NULL, false);
    rmmc__unlock(&x->lock);
    if (n > 0 && need <= p->span) break;
  }
  return n;
}

/* A new highest figure of bytes handed out or lent (the budget's basis). */
static inline void new_peak(pool_t *p) {
  p->committed_peak = p->committed;
  p->peak_clock = p->clock;
}

/* ---- growth: the shared heap's slow path ---- */

static void graph_drain(pool_t *p);

/* Which steps of the slow path a call takes: the out-of-memory path runs
 * the steps before the last resort, lends from other streams' heaps
 * (heaps_lend, no lock held), and only then the last resort. */
typedef enum { SLOW_BEFORE_LAST, SLOW_LAST } slow_steps_t;

/* Under the shared lock, no block of at least `need` bytes usable by o's
 * stream being free: the escalation of the header comment, cheapest first.
 * On success *out is a free block of at least need bytes, unindexed, that
 * o's stream may use at once. `bytes`: the caller's request, for the
 * message (a span is taken for a small one). */
static rmmc_status_t shared_slow_steps(pool_t *p, pool_owner_t *o, pool_sheap_t *self,
                                       cudaStream_t stream, size_t need, size_t align,
                                       size_t bytes, slow_steps_t steps, pool_block_t **out);

/* The slow path's steps may fail on the way (over the budget, a growth the
 * upstream refused) before one succeeds: a success leaves the thread's
 * error state as it was before the call. */
static POOL_NOINLINE rmmc_status_t shared_slow(pool_t *p, pool_owner_t *o, pool_sheap_t *self,
                                               cudaStream_t stream, size_t need, size_t align,
                                               size_t bytes, slow_steps_t steps,
                                               pool_block_t **out) {
  rmmc_status_t st = shared_slow_steps(p, o, self, stream, need, align, bytes, steps, out);
  if (st == RMMC_SUCCESS) (void)rmmc__error_restore_call_start();
  return st;
}

static rmmc_status_t shared_slow_steps(pool_t *p, pool_owner_t *o, pool_sheap_t *self,
                                       cudaStream_t stream, size_t need, size_t align,
                                       size_t bytes, slow_steps_t steps, pool_block_t **out) {
  size_t fit = need + (align > POOL_GRANULE ? align - POOL_GRANULE : 0);
  if (fit > POOL_MAX_REQUEST) return rmmc__pool_oom(p, bytes, stream, "larger than any pool can hold");
  p->clock++;
  bool capturing = p->cuda && rmmc__stream_is_capturing(stream);
  pool_block_t *b;
  rmmc_status_t st;
  if (steps == SLOW_LAST) goto last_resort;
  /* Other streams' frees known finished, then those that fit, asked. */
  consolidate(p, false);
  if ((b = find_usable(p, o, need, align)) != NULL) goto take;
  pool_owner_t *q = NULL;
  bool settled;
  pool_block_t *covered = find_covered(p, o, fit, &q, &settled);
  if (settled && (b = find_usable(p, o, need, align)) != NULL) goto take;
  /* Idle spans of other stream heaps come back before the pool grows. */
  if (reclaim_spans(p, self, align <= p->span ? need : SIZE_MAX) > 0) {
    consolidate(p, false);
    if ((b = find_usable(p, o, need, align)) != NULL) goto take;
    covered = find_covered(p, o, fit, &q, &settled);
    if (settled && (b = find_usable(p, o, need, align)) != NULL) goto take;
  }
  /* Growth that keeps within the budget. */
  st = p->be->grow(p, o, stream, need, align, true, &b);
  if (st == RMMC_SUCCESS) goto grown;
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  /* Another stream's memory behind a GPU-side wait. */
  if (!capturing && covered != NULL &&
      rmmc__stream_slot_wait(&p->streams, q->slot, stream) == RMMC_SUCCESS) {
    b = covered;
    goto take;
  }
  consolidate(p, true);
  if ((b = find_usable(p, o, need, align)) != NULL) goto take;
  /* Other streams' covered frees, joined behind GPU-side waits. */
  if (!capturing && (b = adopt_covered(p, o, stream, need, align)) != NULL) goto take;
  /* Growth past the budget's trimming. */
  if (rmmc__pool_admit(p, o, stream, 0, need, false) && (b = find_usable(p, o, need, align)) != NULL)
    goto take;
  st = p->be->grow(p, o, stream, need, align, false, &b);
  if (st == RMMC_SUCCESS) goto grown;
  if (st != RMMC_ERROR_OUT_OF_MEMORY || steps == SLOW_BEFORE_LAST) return st;
last_resort:;
  /* The last resort: every stream's memory, everything cached below. The
   * message of the step that failed last says why. */
  char why[256];
  snprintf(why, sizeof why, "%s", rmmc_last_error_message());
  p->last_resort = true;
  if (!capturing && rmmc__stream_set_sync(&p->streams) == RMMC_SUCCESS) {
    consolidate(p, false);
    graph_drain(p);
  }
  (void)reclaim_spans(p, self, SIZE_MAX);
  consolidate(p, false);
  if ((b = find_usable(p, o, need, align)) != NULL) goto take_last;
  p->trim_min_age = 0;
  (void)p->be->trim(p, 0);
  (void)rmmc_resource_release_cached(p->base.upstream);
  st = p->be->grow(p, o, stream, need, align, false, &b);
  if (st == RMMC_SUCCESS) goto grown_last;
  p->last_resort = false;
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  /* The out-of-memory rule (internal.h) applied here, under the pool's own
   * lock; the caller lends from other heaps once more, then tells the
   * resource.c wrapper not to apply it again (pool_oom_final). */
  st = rmmc__pool_oom(p, bytes, stream, why);
  rmmc__append_error(RMMC__RETRIED_NOTE, p->base.base.ops->name);
  return st;
take_last:
  p->last_resort = false;
take:
  rmmc__pool_unlink_free(p, b);
  *out = b;
  return RMMC_SUCCESS;
grown_last:
  p->last_resort = false;
grown:
  p->grows++;
  *out = b;
  return RMMC_SUCCESS;
}

/* ---- graph pools ----
 *
 * A graph pool is a pool_owner_t without a stream: allocations routed to
 * it (by stream, or by the CUDA capture the calling thread begins next)
 * take its free blocks first, then clean memory (no stream's work pending:
 * nothing may make a capture wait), then growth; its blocks go back to it
 * when freed, whoever frees them, and merge only with each other, so no
 * work outside the graph ever gets memory a replay of it may write. A
 * released pool's free blocks return to the shared heap after a device
 * synchronization (refused while a capture rmmc knows of is underway: then
 * at the next release, release_cached or last resort); blocks still out
 * return as ordinary frees. */

static pool_owner_t *graph_find(pool_t *p, uint64_t id0, uint64_t id1) {
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next)
    if (!g->released && g->gid[0] == id0 && g->gid[1] == id1) return g;
  return NULL;
}

/* Frees a released graph pool's struct once nothing of it is left. */
static void graph_forget(pool_t *p, pool_owner_t *g) {
  if (!g->released || g->used_bytes > 0 || g->idx->count > 0) return;
  for (pool_owner_t **l = &p->graphs; *l != NULL; l = &(*l)->next)
    if (*l == g) {
      *l = g->next;
      break;
    }
  free(g->idx);
  free(g);
}

/* Released graph pools give their free blocks back (the device is idle:
 * the caller synchronized it). */
static void graph_drain(pool_t *p) {
  for (pool_owner_t *g = p->graphs, *next; g != NULL; g = next) {
    next = g->next;
    if (!g->released) continue;
    while (g->qhead != NULL) {
      pool_block_t *b = g->qhead;
      rmmc__pool_unlink_free(p, b);
      b->owner = NULL;
      rmmc__pool_put_free(p, b);
    }
    graph_forget(p, g);
  }
}

/* The graph pool a call on `stream` is routed to, or NULL. */
static POOL_NOINLINE pool_owner_t *graph_route(pool_t *p, cudaStream_t stream) {
  const void *key = rmmc__stream_key_fast(stream);
  unsigned long long cid = 0;
  bool capturing = false;
  if (p->cuda && __atomic_load_n(&p->graphs_by_capture, __ATOMIC_RELAXED) > 0) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamGetCaptureInfo(stream, &cs, &cid, NULL, NULL, NULL, NULL) != cudaSuccess)
      (void)cudaGetLastError();
    else capturing = cs == cudaStreamCaptureStatusActive;
  }
  pool_owner_t *found = NULL;
  rmmc__lock(&p->lock);
  for (pool_owner_t *g = p->graphs; g != NULL && found == NULL; g = g->next)
    if (g->begun > 0 && ((g->route_key != NULL && g->route_key == key) ||
                         (capturing && g->capture == cid)))
      found = g;
  if (found == NULL && capturing) { /* the first allocation of a capture this thread began */
    uint64_t tid = rmmc__thread_id();
    for (pool_owner_t *g = p->graphs; g != NULL && found == NULL; g = g->next)
      if (g->begun > 0 && g->route_key == NULL && g->capture == 0 && g->pending_thread == tid) {
        g->capture = cid;
        found = g;
      }
  }
  rmmc__unlock(&p->lock);
  return found;
}

static POOL_NOINLINE rmmc_status_t graph_allocate(pool_t *p, pool_owner_t *g, cudaStream_t stream,
                                                  size_t n, size_t align, size_t bytes,
                                                  void **out) {
  size_t need = n + (align - POOL_GRANULE);
  if (need > POOL_MAX_REQUEST) return rmmc__pool_oom(p, bytes, stream, "larger than any pool can hold");
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  if (!pool_meta_room(&p->meta)) {
    st = rmmc__pool_no_host_memory();
    goto unlock;
  }
  rmmc__tlsf_node_t *x = rmmc__tlsf_find(g->idx, need);
  if (x == NULL) x = rmmc__tlsf_find(&p->clean, need);
  if (x == NULL) { /* other streams' finished frees */
    consolidate(p, true);
    x = rmmc__tlsf_find(&p->clean, need);
  }
  pool_block_t *b;
  if (x != NULL) {
    b = pool_block_of(x);
    rmmc__pool_unlink_free(p, b);
  } else if ((st = p->be->grow(p, NULL, stream, n, align, false, &b)) != RMMC_SUCCESS) {
    if (st == RMMC_ERROR_OUT_OF_MEMORY) st = rmmc__pool_oom(p, bytes, stream, rmmc_last_error_message());
    goto unlock;
  } else {
    p->grows++;
  }
  b = rmmc__pool_carve(p, b, n, align);
  if (!rmmc__ptrmap_insert(&p->used, (void *)b->addr, b, bytes)) {
    rmmc__pool_put_free(p, b);
    st = rmmc__pool_no_host_memory();
    goto unlock;
  }
  b->state = B_USED;
  b->owner = g;
  b->requested = bytes;
  g->used_bytes += pool_bsize(b);
  p->committed += pool_bsize(b);
  if (p->committed > p->committed_peak) new_peak(p);
  *out = (void *)b->addr;
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

/* The pool layer of a stack (r itself, or the first pool below it). */
static pool_t *pool_in(rmmc_resource_t *r) {
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (is_pool(r)) return (pool_t *)r;
  return NULL;
}
pool_t *rmmc__pool_in(rmmc_resource_t *r) { return pool_in(r); }

/* The router of caching layers above a pool (internal.h): does a call on
 * `stream` through `stack` reach a pool that sends it to a graph pool? */
static bool graph_routes_call(rmmc_resource_t *stack, cudaStream_t stream) {
  pool_t *p = pool_in(stack);
  return p != NULL && __atomic_load_n(&p->graphs_routing, __ATOMIC_RELAXED) > 0 &&
         graph_route(p, stream) != NULL;
}

/* Counts one graph pool more (+1) or less (-1) being routed to. */
static void count_route(pool_t *p, int delta) {
  if (delta > 0) rmmc__set_graph_router(graph_routes_call);
  __atomic_add_fetch(&p->graphs_routing, delta, __ATOMIC_RELAXED);
  __atomic_add_fetch(&rmmc__graph_routes, delta, __ATOMIC_RELAXED);
}

RMMC_API rmmc_status_t rmmc_pool_graph_begin(rmmc_resource_t *stack, uint64_t id0, uint64_t id1,
                                             bool by_stream, cudaStream_t stream) {
  pool_t *p = pool_in(stack);
  if (p == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_graph_begin: %s has no pool layer",
                          stack == NULL ? "NULL" : rmmc_resource_name(stack));
  if (!by_stream && !p->cuda)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_graph_begin: routing by capture needs device memory; route a "
                          "host pool by stream");
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g == NULL) {
    g = calloc(1, sizeof *g);
    if (g == NULL || (g->idx = calloc(1, sizeof *g->idx)) == NULL) {
      free(g);
      st = rmmc__pool_no_host_memory();
      goto unlock;
    }
    g->gid[0] = id0;
    g->gid[1] = id1;
    g->next = p->graphs;
    p->graphs = g;
  } else if (g->begun > 0) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "pool_graph_begin: graph pool (%llu, %llu) is already being routed to",
                        (unsigned long long)id0, (unsigned long long)id1);
    goto unlock;
  }
  g->begun = 1;
  g->capture = 0;
  g->route_key = by_stream ? rmmc__stream_key(stream) : NULL;
  g->pending_thread = by_stream ? 0 : rmmc__thread_id();
  if (!by_stream) {
    p->graphs_by_capture++;
    __atomic_add_fetch(&rmmc__captures_underway, 1, __ATOMIC_RELAXED);
  }
  count_route(p, 1);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_graph_end(rmmc_resource_t *stack, uint64_t id0, uint64_t id1) {
  pool_t *p = pool_in(stack);
  if (p == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_graph_end: %s has no pool layer",
                          stack == NULL ? "NULL" : rmmc_resource_name(stack));
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g == NULL || g->begun == 0) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "pool_graph_end: graph pool (%llu, %llu) is not being routed to",
                        (unsigned long long)id0, (unsigned long long)id1);
  } else {
    if (g->route_key == NULL) {
      p->graphs_by_capture--;
      __atomic_sub_fetch(&rmmc__captures_underway, 1, __ATOMIC_RELAXED);
    }
    g->begun = 0;
    g->route_key = NULL;
    g->capture = 0;
    g->pending_thread = 0;
    count_route(p, -1);
  }
  rmmc__unlock(&p->lock);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_graph_release(rmmc_resource_t *stack, uint64_t id0, uint64_t id1) {
  pool_t *p = pool_in(stack);
  if (p == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_graph_release: %s has no pool layer",
                          stack == NULL ? "NULL" : rmmc_resource_name(stack));
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g == NULL) {
    rmmc__unlock(&p->lock);
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_graph_release: no graph pool (%llu, %llu)",
                          (unsigned long long)id0, (unsigned long long)id1);
  }
  if (g->begun > 0) {
    if (g->route_key == NULL) {
      p->graphs_by_capture--;
      __atomic_sub_fetch(&rmmc__captures_underway, 1, __ATOMIC_RELAXED);
    }
    g->begun = 0;
    count_route(p, -1);
  }
  g->released = true;
  graph_forget(p, g);
  rmmc__unlock(&p->lock);
  /* Replays may still run: the free blocks go back once the device is
   * idle (an explicit call, so it may synchronize). */
  if (rmmc__stream_set_sync(&p->streams) == RMMC_SUCCESS) {
    rmmc__lock(&p->lock);
    graph_drain(p);
    rmmc__unlock(&p->lock);
  }
  return RMMC_SUCCESS;
}

/* ---- large blocks: the shared heap ---- */

static POOL_NOINLINE rmmc_status_t large_allocate(pool_t *p, pool_owner_t *o,
                                                  cudaStream_t stream, size_t n, size_t align,
                                                  size_t bytes, slow_steps_t steps, void **out) {
  size_t need = n + (align - POOL_GRANULE);
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  /* o's last heap may have been retired since this thread cached it. */
  if (!pool_meta_room(&p->meta) || !rmmc__pool_owner_ready(p, o)) {
    st = rmmc__pool_no_host_memory();
    goto unlock;
  }
  pool_block_t *b = need <= POOL_MAX_REQUEST ? find_usable(p, o, n, align) : NULL;
  if (RMMC_LIKELY(b != NULL)) rmmc__pool_unlink_free(p, b);
  else if ((st = shared_slow(p, o, NULL, stream, n, align, bytes, steps, &b)) != RMMC_SUCCESS)
    goto unlock;
  b = rmmc__pool_carve(p, b, n, align);
  if (RMMC_UNLIKELY(!rmmc__ptrmap_insert(&p->used, (void *)b->addr, b, bytes))) {
    rmmc__pool_put_free(p, b);
    st = rmmc__pool_no_host_memory();
    goto unlock;
  }
  b->state = B_USED;
  b->owner = NULL;
  b->requested = bytes;
  p->committed += pool_bsize(b);
  if (p->committed > p->committed_peak) new_peak(p);
  *out = (void *)b->addr;
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

/* Frees the large block of map entry e on o's stream (shared lock held).
 * *cover: o's frees are due an event, which the caller records once it has
 * dropped the shared lock (cover_claim). */
static rmmc_status_t large_free(pool_t *p, pool_owner_t *o, rmmc__ptrmap_entry_t *e, void *ptr,
                                size_t bytes, bool *cover) {
  pool_block_t *b = e->value;
  if (RMMC_UNLIKELY(b->requested != bytes))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "pool: %p was allocated with %zu bytes, not %zu; nothing was freed", ptr,
                          b->requested, bytes);
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
    graph_forget(p, g); /* released: the block is the freeing stream's, as any */
  }
  b->owner = o;
  b->tag = rmmc__stream_slot_tag(o->slot);
  p->clock++;
  rmmc__pool_put_free(p, b);
  *cover = cover_claim(p, o, size);
  return RMMC_SUCCESS;
}

/* ---- small blocks: the stream heaps ---- */

/* A span for h (h's lock held): lent by the shared heap, aligned to its
 * size so that a free from another stream finds it from the pointer. */
static rmmc_status_t span_take(pool_t *p, pool_sheap_t *h, cudaStream_t stream, size_t bytes,
                               slow_steps_t steps) {
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
  pool_block_t *b = find_usable(p, o, p->span, p->span);
  if (b != NULL) rmmc__pool_unlink_free(p, b);
  else if ((st = shared_slow(p, o, h, stream, p->span, p->span, bytes, steps, &b)) != RMMC_SUCCESS)
    goto fail;
  b = rmmc__pool_carve(p, b, p->span, p->span);
  *sp = (pool_region_t){.base = b->addr, .size = p->span, .parent = b, .heap = h};
  if (!rmmc__ptrmap_insert(&p->spans, (void *)b->addr, sp, 0)) {
    rmmc__pool_put_free(p, b);
    st = rmmc__pool_no_host_memory();
    goto fail;
  }
  b->state = B_SPAN;
  b->owner = NULL;
  p->committed += p->span;
  p->span_bytes += p->span;
  p->spans_lent++;
  if (p->committed > p->committed_peak) new_peak(p);
  heaps_touch(p, h);
  rmmc__unlock(&p->lock);
  pool_block_t *f = pool_meta_take(&h->meta);
  *f = (pool_block_t){.node.size = p->span, .addr = b->addr, .region = sp, .state = B_FREE};
  sp->first = f;
  sp->next = h->spans;
  if (h->spans != NULL) h->spans->prev = sp;
  h->spans = sp;
  h->nspans++;
  h->nidle++;
  h->span_takes++;
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
static size_t retire_foreign(pool_t *p, pool_sheap_t *h, cudaStream_t stream, bool can_wait) {
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
    h->nforeign--;
    b->state = B_FREE;
    b->owner = NULL;
    if (--b->region->nused == 0) h->nidle++;
    heap_link(h, heap_merge(h, b));
    n++;
  }
  return n;
}

static inline pool_block_t *heap_search(pool_sheap_t *h, size_t need) {
  rmmc__tlsf_node_t *x = rmmc__tlsf_find(&h->idx, need);
  pool_block_t *b = x != NULL ? pool_block_of(x) : NULL;
  pool_block_t *hot = h->hot;
  if (hot != NULL && pool_bsize(hot) >= need && (b == NULL || pool_bsize(hot) < pool_bsize(b)))
    b = hot;
  return b;
}

static void heap_trim(pool_t *p, pool_sheap_t *h, cudaStream_t stream);

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
  if (b->region->nused++ == 0 && --h->nidle < h->low_idle) h->low_idle = h->nidle;
  h->in_use += pool_bsize(b);
  if (h->in_use > h->peak) h->peak = h->in_use;
}

/* A small allocation past the hot block (h's lock held): the index, then
 * foreign frees, then a new span. */
static POOL_NOINLINE rmmc_status_t small_general(pool_t *p, pool_sheap_t *h, cudaStream_t stream,
                                                 size_t n, size_t need, size_t align,
                                                 size_t bytes, slow_steps_t steps,
                                                 pool_block_t **out) {
  if (!pool_meta_room(&h->meta)) return rmmc__pool_no_host_memory();
  if (RMMC_UNLIKELY(__atomic_load_n(&h->owner->slot->want, __ATOMIC_RELAXED)))
    cover_now(p, h->owner, stream);
  pool_block_t *b = heap_search(h, need);
  if (b == NULL && h->nforeign > 0 &&
      retire_foreign(p, h, stream, !p->cuda || !rmmc__stream_is_capturing(stream)) > 0) {
    if (h->nidle * p->span > p->cache_bytes) heap_trim(p, h, stream);
    b = heap_search(h, need);
  }
  if (b == NULL) {
    rmmc_status_t st = span_take(p, h, stream, bytes, steps);
    if (st != RMMC_SUCCESS) return st;
    b = heap_search(h, need);
  }
  if ((b = heap_carve(h, b, n, align, bytes)) == NULL) return rmmc__pool_no_host_memory();
  *out = b;
  return RMMC_SUCCESS;
}

/* ---- out of memory: free blocks of other streams' heaps ----
 *
 * A stream heap's free blocks sit in spans that hold live blocks too, so
 * no other stream can take them by giving back idle spans: stream A fills
 * the pool with 512 KiB blocks and frees every other one, and stream B's
 * 512 KiB finds half the pool free and none of it in the shared heap
 * (issue 25, F10). When the shared heap's steps have failed, a request
 * that fits in a span is served from another heap's free block (the block
 * stays that heap's; B's free of it is a foreign free), as RMM's
 * get_block takes another stream's blocks: at once if that stream's work
 * before its frees into the span is known finished (or B's own stream's),
 * else behind a GPU-side wait on that stream's event when one covers them;
 * only after the last resort's synchronization, everything. */

typedef struct lend_seen {
  size_t free_bytes, largest; /* free in the heaps it looked at */
  bool pending;               /* a fitting block waits for another stream's work */
} lend_seen_t;

/* Lists the live heaps through snext (snap_lock held): returns the first. */
static pool_sheap_t *heaps_snapshot(pool_t *p) {
  rmmc__lock(&p->lock);
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext) x->snext = x->hnext;
  pool_sheap_t *first = p->heaps;
  rmmc__unlock(&p->lock);
  return first;
}

/* One heap x (locked, live) lends a block for o's stream, or not. */
static bool heap_lend(pool_t *p, pool_sheap_t *x, pool_owner_t *o, cudaStream_t stream, size_t n,
                      size_t align, size_t bytes, bool capturing, lend_seen_t *seen, void **out) {
  size_t need = n + (align - POOL_GRANULE);
  size_t largest = rmmc__tlsf_largest(&x->idx);
  if (x->hot != NULL && pool_bsize(x->hot) > largest) largest = pool_bsize(x->hot);
  seen->free_bytes += heap_cached_bytes(x);
  if (largest > seen->largest) seen->largest = largest;
  pool_block_t *b = heap_search(x, need);
  if (b == NULL || !pool_meta_room(&x->meta)) return false;
  rmmc__stream_slot_t *s = x->owner->slot;
  uint64_t tag = b->region->tag;
  bool ok = x->owner == o || rmmc__stream_slot_known_done(s, tag);
  if (!ok && !p->cuda) /* host memory: no work behind a stream, a record costs nothing */
    ok = rmmc__stream_slot_try_record(&p->streams, s, NULL);
  if (!ok) ok = rmmc__stream_slot_done(&p->streams, s, tag);
  if (!ok && !capturing && rmmc__stream_slot_covered(s, tag))
    ok = rmmc__stream_slot_wait(&p->streams, s, stream) == RMMC_SUCCESS;
  if (!ok) { /* its stream covers its frees at its next call */
    __atomic_store_n(&s->want, 1, __ATOMIC_RELAXED);
    seen->pending = true;
    return false;
  }
  if ((b = heap_carve(x, b, n, align, bytes)) == NULL) return false;
  heap_hand_out(x, b, bytes);
  *out = (void *)b->addr;
  return true;
}

/* Other heaps lend a block of n bytes at `align` to o's stream (no lock
 * held): true with *out set, or false with the thread's error state as it
 * was and *seen telling what the heaps hold. */
static POOL_NOINLINE bool heaps_lend(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t n,
                                     size_t align, size_t bytes, lend_seen_t *seen, void **out) {
  *seen = (lend_seen_t){0};
  if (n + (align - POOL_GRANULE) > p->span) return false;
  bool capturing = p->cuda && rmmc__stream_is_capturing(stream);
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  bool lent = false;
  pthread_mutex_lock(&p->snap_lock);
  for (pool_sheap_t *x = heaps_snapshot(p); x != NULL && !lent; x = x->snext) {
    rmmc__lock(&x->lock);
    if (x->owner != NULL) lent = heap_lend(p, x, o, stream, n, align, bytes, capturing, seen, out);
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

static inline rmmc_status_t small_allocate(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                           cudaStream_t stream, size_t n, size_t align,
                                           size_t bytes, void **out);

/* The heap this thread cached was retired: its heap of the stream again. */
static POOL_NOINLINE rmmc_status_t small_again(pool_t *p, cudaStream_t stream, size_t n,
                                               size_t align, size_t bytes, void **out) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = heap_stale(p, stream, &h, &o);
  return st == RMMC_SUCCESS ? small_allocate(p, h, o, stream, n, align, bytes, out) : st;
}

/* A small request the shared heap's steps could not serve (no lock held):
 * other heaps lend; the last resort; other heaps lend, now that every
 * stream's work is known finished. */
static POOL_NOINLINE rmmc_status_t small_short(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                               cudaStream_t stream, size_t n, size_t align,
                                               size_t bytes, void **out) {
  lend_seen_t seen;
  if (heaps_lend(p, o, stream, n, align, bytes, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  rmmc__lock(&h->lock);
  if (h->owner != o) { /* retired meanwhile */
    rmmc__unlock(&h->lock);
    return small_again(p, stream, n, align, bytes, out);
  }
  pool_block_t *b;
  rmmc_status_t st = small_general(p, h, stream, n, n + (align - POOL_GRANULE), align, bytes,
                                   SLOW_LAST, &b);
  if (st == RMMC_SUCCESS) {
    heap_hand_out(h, b, bytes);
    *out = (void *)b->addr;
  }
  rmmc__unlock(&h->lock);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && heaps_lend(p, o, stream, n, align, bytes, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  return pool_out_of_memory(p, &seen, st);
}

/* A large request the shared heap's steps could not serve (no lock held),
 * as small_short. */
static POOL_NOINLINE rmmc_status_t large_short(pool_t *p, pool_owner_t *o, cudaStream_t stream,
                                               size_t n, size_t align, size_t bytes, void **out) {
  lend_seen_t seen;
  if (heaps_lend(p, o, stream, n, align, bytes, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  rmmc_status_t st = large_allocate(p, o, stream, n, align, bytes, SLOW_LAST, out);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && heaps_lend(p, o, stream, n, align, bytes, &seen, out)) {
    (void)rmmc__error_restore_call_start();
    return RMMC_SUCCESS;
  }
  return pool_out_of_memory(p, &seen, st);
}

static inline rmmc_status_t small_allocate(pool_t *p, pool_sheap_t *h, pool_owner_t *o,
                                           cudaStream_t stream, size_t n, size_t align,
                                           size_t bytes, void **out) {
  size_t need = n + (align - POOL_GRANULE);
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&h->lock);
  if (RMMC_UNLIKELY(h->owner != o)) {
    rmmc__unlock(&h->lock);
    return small_again(p, stream, n, align, bytes, out);
  }
  pool_block_t *b = h->hot;
  if (RMMC_LIKELY(b != NULL && pool_bsize(b) == need && align == POOL_GRANULE)) {
    if (RMMC_UNLIKELY(!rmmc__ptrmap_insert(&h->used, (void *)b->addr, b, bytes))) {
      st = rmmc__pool_no_host_memory();
      goto unlock;
    }
    h->hot = NULL;
    b->where = W_OUT;
  } else if ((st = small_general(p, h, stream, n, need, align, bytes, SLOW_BEFORE_LAST, &b)) !=
             RMMC_SUCCESS) {
    rmmc__unlock(&h->lock);
    if (st == RMMC_ERROR_OUT_OF_MEMORY) st = small_short(p, h, o, stream, n, align, bytes, out);
    return st;
  }
  heap_hand_out(h, b, bytes);
  *out = (void *)b->addr;
unlock:
  rmmc__unlock(&h->lock);
  return st;
}

/* Keeps h's wholly free spans within cache_size (h's lock held). */
static POOL_NOINLINE void heap_trim(pool_t *p, pool_sheap_t *h, cudaStream_t stream) {
  size_t keep = p->cache_bytes / p->span;
  rmmc__lock(&p->lock);
  (void)heap_release_idle(p, h, keep, stream, true);
  rmmc__unlock(&p->lock);
}

/* Device memory: h's stream has just freed its last block, for the 1st,
 * 2nd, 4th, 8th, ... time: its event covers those frees (h locked, in a
 * call on h's stream). A stream made per request or per task frees its
 * last block once or a few times and never comes back: when its heap is
 * retired (or its idle spans taken back), the spans it freed into can then
 * serve other streams once a query finds the work done, where an
 * uncovered span waited for a device synchronization (a heap's small
 * frees record nothing: no other stream can reach them while the heap
 * holds them). A stream that keeps working pays log2 of its emptyings:
 * nothing in a steady state. */
static inline bool power_of_two_count(uint64_t *n) {
  uint64_t c = ++*n;
  return (c & (c - 1)) == 0;
}

static POOL_NOINLINE void heap_emptied(pool_t *p, pool_sheap_t *h, cudaStream_t stream) {
  (void)rmmc__stream_slot_try_record(&p->streams, h->owner->slot, stream);
}

/* Frees the small block of h's map entry e on h's own stream (h locked). */
static inline rmmc_status_t small_free(pool_t *p, pool_sheap_t *h, rmmc__ptrmap_entry_t *e,
                                       void *ptr, size_t bytes, cudaStream_t stream) {
  pool_block_t *b = e->value;
  if (RMMC_UNLIKELY(b->requested != bytes))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "pool: %p was allocated with %zu bytes, not %zu; nothing was freed", ptr,
                          b->requested, bytes);
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
    if (++h->nidle * p->span > p->cache_bytes) heap_trim(p, h, stream);
    else if (p->cuda && h->in_use == 0 && power_of_two_count(&h->empties))
      heap_emptied(p, h, stream);
  }
  return RMMC_SUCCESS;
}

/* A free that h's map does not hold: a large block, a block of another
 * stream's heap (a foreign free), or bad input. No lock held. */
static POOL_NOINLINE rmmc_status_t free_slow(pool_t *p, pool_owner_t *o, void *ptr, size_t bytes,
                                             cudaStream_t stream) {
  rmmc__lock(&p->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, ptr);
  if (e != NULL && !rmmc__pool_owner_ready(p, o)) { /* its last heap retired meanwhile */
    rmmc__unlock(&p->lock);
    return rmmc__pool_no_host_memory();
  }
  if (e != NULL) {
    bool cover = false;
    rmmc_status_t st = large_free(p, o, e, ptr, bytes, &cover);
    rmmc__unlock(&p->lock);
    if (cover) (void)rmmc__stream_slot_try_record(&p->streams, o->slot, stream);
    return st;
  }
  e = p->span > 0 ? rmmc__ptrmap_find(&p->spans, (void *)((uintptr_t)ptr & ~(p->span - 1))) : NULL;
  pool_sheap_t *a = e != NULL ? ((pool_region_t *)e->value)->heap : NULL;
  rmmc__unlock(&p->lock);
  if (a == NULL)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "pool: %p was not allocated by this pool, or was freed already", ptr);
  rmmc_status_t st = RMMC_SUCCESS;
  bool foreign = false;
  uint64_t tag = 0;
  rmmc__lock(&a->lock);
  e = rmmc__ptrmap_find(&a->used, ptr);
  if (e == NULL) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p was not allocated by this pool, or was freed already", ptr);
  } else if (a->owner == o) { /* this stream's: another thread's heap of it */
    st = small_free(p, a, e, ptr, bytes, stream);
  } else {
    pool_block_t *b = e->value;
    if (b->requested != bytes) {
      st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "pool: %p was allocated with %zu bytes, not %zu; nothing was freed", ptr,
                          b->requested, bytes);
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
  }
  rmmc__unlock(&a->lock);
  if (foreign && !rmmc__stream_slot_covered(o->slot, tag)) cover_now(p, o, stream);
  return st;
}

/* ---- the resource's slots ---- */

/* Expensive checks (debug_checks=2): every invariant after every call. */
#if RMMC_DEBUG_CHECKS >= 2
static void lock_all(pool_t *p);
static void unlock_all(pool_t *p);
static bool check_locked(pool_t *p, char *msg, size_t len);
static rmmc_status_t expensive_check(pool_t *p, rmmc_status_t st, const char *where) {
  char msg[512];
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  lock_all(p);
  bool ok = check_locked(p, msg, sizeof msg);
  unlock_all(p);
  if (!ok) {
    fprintf(stderr, "rmmc: pool invariant broken after %s: %s\n", where, msg);
    abort();
  }
  rmmc__error_restore(&saved);
  return st;
}
#define POOL_EXPENSIVE(p, st, where) expensive_check(p, st, where)
#else
#define POOL_EXPENSIVE(p, st, where) (st)
#endif

static rmmc_status_t pool_allocate_in(pool_t *p, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out);
static rmmc_status_t pool_deallocate_in(pool_t *p, void *ptr, size_t bytes, cudaStream_t stream);

static rmmc_status_t pool_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  pool_t *p = (pool_t *)r;
  return POOL_EXPENSIVE(p, pool_allocate_in(p, bytes, alignment, stream, out), "allocate");
}

static rmmc_status_t pool_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)alignment;
  pool_t *p = (pool_t *)r;
  return POOL_EXPENSIVE(p, pool_deallocate_in(p, ptr, bytes, stream), "deallocate");
}

/* An allocation while paused (sleep.c): refused. */
static POOL_NOINLINE rmmc_status_t paused_error(pool_t *p, size_t bytes) {
  char b[32];
  rmmc__lock(&p->lock); /* release_cached may drop mappings meanwhile (TSan) */
  size_t off = p->off_bytes;
  rmmc__unlock(&p->lock);
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                        "pool: cannot allocate %zu bytes: the pool is paused (rmmc_pool_pause) "
                        "and holds no memory until rmmc_pool_resume (%s of its pages are given "
                        "back)",
                        bytes, rmmc__format_bytes(off, b, sizeof b));
}

static inline rmmc_status_t pool_allocate_in(pool_t *p, size_t bytes, size_t alignment,
                                             cudaStream_t stream, void **out) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = heap_of(p, stream, &h, &o);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  size_t n = rmmc__align_up(bytes, POOL_GRANULE);
  if (RMMC_UNLIKELY(__atomic_load_n(&p->graphs_routing, __ATOMIC_RELAXED) > 0)) {
    if (__atomic_load_n(&p->paused, __ATOMIC_RELAXED)) return paused_error(p, bytes);
    pool_owner_t *g = graph_route(p, stream);
    if (g != NULL) return graph_allocate(p, g, stream, n, alignment, bytes, out);
  }
  if (RMMC_LIKELY(n <= p->small_max && n + (alignment - POOL_GRANULE) <= p->span))
    return small_allocate(p, h, o, stream, n, alignment, bytes, out);
  st = large_allocate(p, o, stream, n, alignment, bytes, SLOW_BEFORE_LAST, out);
  if (RMMC_UNLIKELY(st == RMMC_ERROR_OUT_OF_MEMORY))
    st = large_short(p, o, stream, n, alignment, bytes, out);
  return st;
}

static inline rmmc_status_t pool_deallocate_in(pool_t *p, void *ptr, size_t bytes,
                                               cudaStream_t stream) {
  pool_sheap_t *h;
  pool_owner_t *o;
  rmmc_status_t st = heap_of(p, stream, &h, &o);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
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

/* Locks every live heap, then the shared heap (describe, check): heap
 * locks come first, so the heaps are listed under the shared lock, locked,
 * and the list is checked again under the shared lock until no heap was
 * made, retired or reused meanwhile (heaps_gen). One such pass at a time
 * (snap_lock, held until unlock_all): the list is kept in the heaps' snext. */
static void lock_all(pool_t *p) {
  pthread_mutex_lock(&p->snap_lock);
  for (;;) {
    rmmc__lock(&p->lock);
    uint64_t gen = p->heaps_gen;
    rmmc__unlock(&p->lock);
    pool_sheap_t *first = heaps_snapshot(p);
    for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__lock(&x->lock);
    rmmc__lock(&p->lock);
    if (p->heaps_gen == gen) {
      p->snap_first = first;
      return;
    }
    rmmc__unlock(&p->lock);
    for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__unlock(&x->lock);
  }
}

static void unlock_all(pool_t *p) {
  pool_sheap_t *first = p->snap_first;
  rmmc__unlock(&p->lock);
  for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__unlock(&x->lock);
  pthread_mutex_unlock(&p->snap_lock);
}
void rmmc__pool_lock_all(pool_t *p) { lock_all(p); }
void rmmc__pool_unlock_all(pool_t *p) { unlock_all(p); }

static rmmc_status_t pool_release_cached(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  /* An explicit call: the device may be synchronized (unless a known
   * capture is underway), after which every free is finished. */
  rmmc_status_t st = rmmc__stream_set_sync(&p->streams);
  if (st != RMMC_SUCCESS && st != RMMC_ERROR_NOT_SUPPORTED) return st;
  pthread_mutex_lock(&p->snap_lock);
  for (pool_sheap_t *x = heaps_snapshot(p); x != NULL; x = x->snext) {
    rmmc__lock(&x->lock);
    if (x->owner != NULL) { /* not retired meanwhile */
      (void)retire_foreign(p, x, NULL, false);
      rmmc__lock(&p->lock);
      (void)heap_release_idle(p, x, 0, NULL, false);
      rmmc__unlock(&p->lock);
    }
    rmmc__unlock(&x->lock);
  }
  pthread_mutex_unlock(&p->snap_lock);
  rmmc__lock(&p->lock);
  if (st == RMMC_SUCCESS) graph_drain(p);
  consolidate(p, true);
  p->trim_min_age = 0;
  st = p->be->trim(p, 0);
  rmmc__unlock(&p->lock);
  if (p->sleep != NULL) p->sleep->drop(p, false);
  st = POOL_EXPENSIVE(p, st, "release_cached");
  return st == RMMC_SUCCESS ? rmmc_resource_release_cached(p->base.upstream) : st;
}

/* ---- figures ---- */

typedef struct totals {
  size_t in_use, cached, pending, spans, largest;
} totals_t;

static void add_totals(pool_t *p, totals_t *t) {
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next) {
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext) {
      t->in_use += x->in_use;
      t->cached += heap_cached_bytes(x);
      t->spans += x->nspans;
    }
    t->pending += q->idx->bytes;
    size_t l = rmmc__tlsf_largest(q->idx);
    if (l > t->largest) t->largest = l;
  }
  size_t l = rmmc__tlsf_largest(&p->clean);
  if (l > t->largest) t->largest = l;
  t->in_use += p->committed - p->span_bytes;
}

static void pool_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  pool_t *p = (pool_t *)r;
  lock_all(p);
  totals_t t = {0};
  add_totals(p, &t);
  size_t reserved = pool_held(p), reserved_peak = p->reserved_peak, peak = p->committed_peak;
  size_t regions = p->nregions, heaps = p->nheaps, graphs = 0, graph_bytes = 0;
  uint64_t retired = p->heaps_retired;
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next)
    graphs++, graph_bytes += g->used_bytes + g->idx->bytes;
  uint64_t grows = p->grows, shrinks = p->shrinks, peers = p->peers, adoptions = p->adoptions;
  unlock_all(p);
  rmmc__emit_bytes(emit, ctx, "reserved", reserved);
  rmmc__emit_bytes(emit, ctx, "in_use", t.in_use);
  rmmc__emit_bytes(emit, ctx, "free", reserved > t.in_use ? reserved - t.in_use : 0);
  rmmc__emit_bytes(emit, ctx, "peak", peak);
  rmmc__emit_bytes(emit, ctx, "reserved_peak", reserved_peak);
  rmmc__emit_bytes(emit, ctx, "largest_free", t.largest);
  if (p->max_size != SIZE_MAX) rmmc__emit_bytes(emit, ctx, "limit", p->max_size);
  rmmc__emit_bytes(emit, ctx, "small_max", p->small_max); /* the settings of the stream heaps */
  rmmc__emit_bytes(emit, ctx, "span_size", p->span);
  rmmc__emit_bytes(emit, ctx, "heap_cache", p->cache_bytes);
  rmmc__emit_bytes(emit, ctx, "cached", t.cached);
  rmmc__emit_bytes(emit, ctx, "pending", t.pending);
  rmmc__emit_count(emit, ctx, "regions", regions);
  rmmc__emit_count(emit, ctx, "graph_pools", graphs);
  rmmc__emit_bytes(emit, ctx, "graph_bytes", graph_bytes);
  rmmc__emit_count(emit, ctx, "spans", t.spans);
  rmmc__emit_count(emit, ctx, "heaps", heaps);
  rmmc__emit_count(emit, ctx, "heaps_retired", retired);
  rmmc__emit_count(emit, ctx, "grows", grows);
  rmmc__emit_count(emit, ctx, "shrinks", shrinks);
  rmmc__emit_count(emit, ctx, "adoptions", adoptions);
  if (peers != 0) {
    char text[200];
    rmmc__pool_peers_text(peers, text, sizeof text);
    rmmc__emit_text(emit, ctx, "peers", text);
  }
  rmmc__stream_set_describe(&p->streams, emit, ctx);
  p->be->describe(p, emit, ctx);
  if (p->sleep != NULL) p->sleep->describe(p, emit, ctx);
  /* One line per stream. */
  lock_all(p);
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next) {
    size_t in_use = 0, cached = 0, nheaps = 0;
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext)
      in_use += x->in_use, cached += heap_cached_bytes(x), nheaps++;
    char name[40], a[32], b[32], c[32], line[200];
    snprintf(line, sizeof line, "%s in_use=%s cached=%s pending=%s heaps=%zu",
             rmmc__stream_name(q->slot->stream, name, sizeof name),
             rmmc__format_bytes(in_use, a, sizeof a), rmmc__format_bytes(cached, b, sizeof b),
             rmmc__format_bytes(q->idx->bytes, c, sizeof c), nheaps);
    rmmc__emit_text(emit, ctx, "stream", line);
  }
  unlock_all(p);
}

RMMC_API rmmc_status_t rmmc_pool_resource_figures(rmmc_resource_t *pool,
                                                  rmmc_pool_figures_t *figures) {
  if (!is_pool(pool)) return not_a_pool("pool_resource_figures", pool);
  if (figures == NULL || figures->size < sizeof(size_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_figures: figures must be set with RMMC_POOL_FIGURES_INIT");
  pool_t *p = (pool_t *)pool;
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  lock_all(p);
  totals_t t = {0};
  add_totals(p, &t);
  f.reserved = pool_held(p);
  f.grows = p->grows;
  f.shrinks = p->shrinks;
  unlock_all(p);
  f.in_use = t.in_use;
  f.cached = t.cached;
  f.pending = t.pending;
  f.device_syncs = rmmc__atomic_load_u64(&p->streams.syncs);
  f.event_records = rmmc__atomic_load_u64(&p->streams.records);
  f.event_waits = rmmc__atomic_load_u64(&p->streams.waits);
  f.event_queries = rmmc__atomic_load_u64(&p->streams.queries);
  size_t n = figures->size < sizeof f ? figures->size : sizeof f;
  memcpy(figures, &f, n);
  figures->size = n;
  return RMMC_SUCCESS;
}

/* ---- invariants ---- */

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      snprintf(msg, len, __VA_ARGS__);                                                         \
      return false;                                                                            \
    }                                                                                          \
  } while (0)

static bool check_heap(pool_t *p, pool_sheap_t *h, char *msg, size_t len) {
  size_t free_bytes = 0, nfree = 0, used = 0, nused = 0, idle = 0, foreign = 0;
  for (pool_region_t *sp = h->spans; sp != NULL; sp = sp->next) {
    CHECK(sp->heap == h && sp->parent != NULL && sp->parent->state == B_SPAN &&
              sp->parent->addr == sp->base && pool_bsize(sp->parent) == sp->size,
          "span %p does not match its shared block", (void *)sp->base);
    CHECK(sp->base % p->span == 0, "span %p is not aligned to %zu", (void *)sp->base, p->span);
    uintptr_t at = sp->base;
    size_t in_span = 0;
    for (pool_block_t *b = sp->first, *prev = NULL; b != NULL; prev = b, b = b->next) {
      CHECK(b->addr == at && b->prev == prev && b->region == sp, "span %p: blocks do not tile it",
            (void *)sp->base);
      CHECK(pool_bsize(b) > 0 && pool_bsize(b) % POOL_GRANULE == 0 && b->addr % POOL_GRANULE == 0,
            "block %p has size %zu", (void *)b->addr, pool_bsize(b));
      if (b->state == B_FREE) {
        CHECK(b->where == W_INDEX || (b->where == W_HOT && h->hot == b), "free block %p is lost",
              (void *)b->addr);
        CHECK(prev == NULL || prev->state != B_FREE || b == h->hot || prev == h->hot,
              "adjacent free blocks at %p", (void *)b->addr);
        free_bytes += pool_bsize(b);
        nfree += b->where == W_INDEX;
      } else if (b->state == B_USED) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&h->used, (void *)b->addr);
        CHECK(e != NULL && e->value == b, "used block %p is not in its heap's map", (void *)b->addr);
        used += pool_bsize(b);
        nused++;
        in_span++;
      } else {
        CHECK(b->state == B_FOREIGN, "block %p of a span has state %d", (void *)b->addr, b->state);
        foreign++;
        in_span++;
      }
      at += pool_bsize(b);
    }
    CHECK(at == sp->base + sp->size, "span %p: blocks do not tile it", (void *)sp->base);
    CHECK(sp->nused == in_span, "span %p counts %zu used, holds %zu", (void *)sp->base, sp->nused,
          in_span);
    idle += sp->nused == 0;
  }
  CHECK(rmmc__tlsf_valid(&h->idx), "a stream heap's index is inconsistent");
  CHECK(h->idx.count == nfree, "a stream heap's index holds %zu blocks, its spans %zu free",
        h->idx.count, nfree);
  CHECK(h->idx.bytes + (h->hot != NULL ? pool_bsize(h->hot) : 0) == free_bytes,
        "a stream heap's free bytes do not add up");
  CHECK(h->used.count == nused && h->in_use == used, "a stream heap's used blocks do not add up");
  CHECK(h->nidle == idle, "a stream heap counts %zu idle spans, holds %zu", h->nidle, idle);
  CHECK(h->nforeign == foreign, "a stream heap counts %zu foreign frees, holds %zu", h->nforeign,
        foreign);
  return true;
}

static bool check_locked(pool_t *p, char *msg, size_t len) {
  size_t nfree = 0, free_bytes = 0, committed = 0, spans = 0, nused = 0, heaps = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) {
    uintptr_t at = r->base;
    for (pool_block_t *b = r->first, *prev = NULL; b != NULL; prev = b, b = b->next) {
      CHECK(b->addr == at && b->prev == prev && b->region == r,
            "region %p: blocks do not tile it", (void *)r->base);
      CHECK(pool_bsize(b) > 0 && pool_bsize(b) % POOL_GRANULE == 0 && b->addr % POOL_GRANULE == 0,
            "block %p has size %zu", (void *)b->addr, pool_bsize(b));
      if (b->state == B_FREE) {
        CHECK(b->where == W_INDEX, "free block %p is in no index", (void *)b->addr);
        CHECK(prev == NULL || prev->state != B_FREE ||
                  (prev->owner != b->owner &&
                   ((prev->owner != NULL && b->owner != NULL) ||
                    (prev->owner != NULL && prev->owner->slot == NULL) ||
                    (b->owner != NULL && b->owner->slot == NULL))),
              "free blocks at %p (owner %p tag %llu) and %p (owner %p tag %llu) should have merged",
              (void *)prev->addr, (void *)prev->owner, (unsigned long long)prev->tag,
              (void *)b->addr, (void *)b->owner, (unsigned long long)b->tag);
        nfree++;
        free_bytes += pool_bsize(b);
      } else if (b->state == B_USED) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, (void *)b->addr);
        CHECK(e != NULL && e->value == b, "used block %p is not in the map", (void *)b->addr);
        committed += pool_bsize(b);
        nused++;
      } else if (b->state == B_SPAN) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->spans, (void *)b->addr);
        CHECK(e != NULL && ((pool_region_t *)e->value)->parent == b, "span %p is not in the map",
              (void *)b->addr);
        committed += pool_bsize(b);
        spans++;
      } else {
        CHECK(b->state == B_UNMAPPED && p->be == &rmmc__pool_vm, "block %p has state %d",
              (void *)b->addr, b->state);
      }
      at += pool_bsize(b);
    }
    CHECK(at == r->base + r->size, "region %p: blocks do not tile it", (void *)r->base);
  }
  size_t indexed = p->clean.count, indexed_bytes = p->clean.bytes;
  CHECK(rmmc__tlsf_valid(&p->clean), "the clean index is inconsistent");
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next) {
    CHECK(rmmc__tlsf_valid(q->idx), "a stream's index is inconsistent");
    size_t listed = 0;
    for (pool_block_t *b = q->qhead; b != NULL; b = b->qnext, listed++)
      CHECK(b->owner == q && b->where == W_INDEX, "a stream's list holds a stranger");
    CHECK(listed == q->idx->count, "a stream's list and index differ");
    indexed += q->idx->count;
    indexed_bytes += q->idx->bytes;
    size_t nheaps = 0;
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext, nheaps++) {
      CHECK(x->owner == q && x->stripe < p->stripes, "a heap is listed under another stream");
      for (pool_sheap_t *y = x->onext; y != NULL; y = y->onext)
        CHECK(y->stripe != x->stripe, "a stream has two heaps of stripe %u", x->stripe);
      if (!check_heap(p, x, msg, len)) return false;
    }
    CHECK(q->listed && q->slot != NULL, "an unlisted stream on the list of owners");
    heaps += nheaps;
  }
  size_t live = 0;
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext, live++)
    CHECK(x->owner != NULL && x->owner->listed && (x->hnext == NULL ? p->heaps_tail == x
                                                                    : x->hnext->hprev == x),
          "the list of heaps holds a retired heap or is broken");
  CHECK(live == p->nheaps, "%zu heaps on the pool's list, %zu made", live, p->nheaps);
  for (pool_sheap_t *x = p->spare_heaps; x != NULL; x = x->onext)
    CHECK(x->owner == NULL && x->nspans == 0 && x->used.count == 0 && x->idx.count == 0,
          "a retired heap holds memory");
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next) {
    CHECK(g->slot == NULL && rmmc__tlsf_valid(g->idx), "a graph pool's index is inconsistent");
    size_t listed = 0;
    for (pool_block_t *b = g->qhead; b != NULL; b = b->qnext, listed++)
      CHECK(b->owner == g && b->where == W_INDEX, "a graph pool's list holds a stranger");
    CHECK(listed == g->idx->count, "a graph pool's list and index differ");
    indexed += g->idx->count;
    indexed_bytes += g->idx->bytes;
  }
  CHECK(heaps == p->nheaps, "%zu heaps listed, %zu made", heaps, p->nheaps);
  CHECK(indexed == nfree && indexed_bytes == free_bytes && free_bytes == p->free_bytes,
        "indices hold %zu blocks (%zu bytes), the regions %zu free (%zu bytes)", indexed,
        indexed_bytes, nfree, free_bytes);
  CHECK(committed == p->committed, "committed %zu, blocks add up to %zu", p->committed,
        committed);
  CHECK(nused == p->used.count && spans == p->spans.count, "maps and blocks differ");
  CHECK(spans * p->span == p->span_bytes, "span bytes do not add up");
  CHECK(p->reserved <= p->max_size, "reserved %zu above the maximum %zu", p->reserved,
        p->max_size);
  CHECK(p->reserved_peak >= p->reserved && p->committed_peak >= p->committed, "peaks below current");
  return p->be->check(p, msg, len);
}

#undef CHECK

RMMC_API rmmc_status_t rmmc_pool_resource_check(rmmc_resource_t *pool) {
  if (!is_pool(pool)) return not_a_pool("pool_resource_check", pool);
  pool_t *p = (pool_t *)pool;
  char msg[512];
  lock_all(p);
  bool ok = check_locked(p, msg, sizeof msg);
  unlock_all(p);
  return ok ? RMMC_SUCCESS : rmmc_set_error(RMMC_ERROR_INTERNAL, "pool invariant broken: %s", msg);
}

/* ---- lifetime ---- */

static void pool_destroy(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  if (p->cuda && p->regions != NULL) (void)rmmc__stream_set_sync(&p->streams);
  if (p->be != NULL) p->be->fini(p);
  if (p->sleep != NULL) p->sleep->drop(p, true);
  for (int spare = 0; spare < 2; spare++)
    for (pool_sheap_t *x = spare ? p->spare_heaps : p->heaps, *xnext; x != NULL; x = xnext) {
      xnext = spare ? x->onext : x->hnext;
      for (pool_region_t *sp = x->spans, *next; sp != NULL; sp = next) {
        next = sp->next;
        free(sp);
      }
      rmmc__pool_meta_fini(&x->meta);
      rmmc__ptrmap_fini(&x->used);
      free(x);
    }
  for (pool_owner_t *g = p->graphs, *next; g != NULL; g = next) {
    next = g->next;
    if (g->begun > 0) { /* destroyed while routed: the process counts stay true */
      if (g->route_key == NULL) __atomic_sub_fetch(&rmmc__captures_underway, 1, __ATOMIC_RELAXED);
      count_route(p, -1);
    }
    free(g->idx);
    free(g);
  }
  for (uint32_t i = 0; i < rmmc__stream_set_count(&p->streams); i++)
    free(((pool_owner_t *)rmmc__stream_slot_user(rmmc__stream_set_at(&p->streams, i)))->idx);
  rmmc__pool_meta_fini(&p->meta);
  rmmc__ptrmap_fini(&p->used);
  rmmc__ptrmap_fini(&p->spans);
  rmmc__stream_set_fini(&p->streams);
  pthread_mutex_destroy(&p->snap_lock);
  rmmc__adaptor_fini(&p->base);
  free(p);
}

#define POOL_OPS(NAME)                                                                         \
  {                                                                                            \
    .version = RMMC_RESOURCE_OPS_VERSION, .name = NAME, .allocate = pool_allocate,             \
    .deallocate = pool_deallocate, .release_cached = pool_release_cached,                      \
    .describe = pool_describe, .destroy = pool_destroy, .upstream = rmmc__adaptor_upstream,    \
    .get_allocation = rmmc__pool_get_allocation,                                               \
    .set_memory_hooks = rmmc__pool_set_memory_hooks,                                           \
    .enable_peer_access = rmmc__pool_enable_peer_access,                                       \
  }
static const rmmc_resource_ops_t pool_ops = POOL_OPS("pool"), arena_ops = POOL_OPS("arena");

/* Checks the options and resolves them into p. */
static rmmc_status_t apply_options(pool_t *p, const rmmc_pool_options_t *o) {
  const char *bad = NULL;
  if (o->growth_granularity < POOL_GRANULE || o->growth_granularity > ((size_t)1 << 30) ||
      !rmmc__is_pow2(o->growth_granularity))
    bad = "growth_granularity must be a power of two from 256 B to 1 GiB";
  else if (!rmmc__is_pow2(o->small_chunk) || o->small_chunk < ((size_t)64 << 10) ||
           o->small_chunk > ((size_t)1 << 30) || rmmc__align_up(o->small_max, POOL_GRANULE) > o->small_chunk)
    bad = "small_chunk must be a power of two from 64 KiB to 1 GiB and at least small_max";
  else if (!(o->gc_threshold >= 0.0 && o->gc_threshold <= 1.0))
    bad = "gc_threshold must be a fraction from 0 to 1";
  else if (!(o->release_slack >= 0.0 && o->release_slack <= 1e6))
    bad = "release_slack must be a fraction of at least 0";
  else if (!(o->split_limit == 0.0 || (o->split_limit >= 1.0 && o->split_limit <= 1e6)))
    bad = "split_limit must be 0 (off) or at least 1";
  else if (o->event_interval < 1)
    bad = "event_interval must be at least 1";
  else if (o->min_growth > POOL_MAX_REQUEST || o->initial_size > POOL_MAX_REQUEST)
    bad = "initial_size and min_growth must be at most 128 TiB";
  else if (o->expandable < -1 || o->expandable > 1)
    bad = "expandable must be -1 (when the upstream can), 0 or 1";
  else if (o->stream_heaps > 1024)
    bad = "stream_heaps must be 0 (one per CPU) to 1024";
  if (bad != NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_resource_create: %s", bad);
  p->max_size = o->maximum_size == 0 || o->maximum_size == SIZE_MAX
                    ? SIZE_MAX
                    : o->maximum_size & ~(POOL_GRANULE - 1);
  if (o->initial_size > p->max_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: initial_size %zu is above maximum_size %zu",
                          o->initial_size, p->max_size);
  p->granularity = o->growth_granularity;
  p->min_growth = o->min_growth;
  p->small_max = o->small_max > 0 ? rmmc__align_up(o->small_max, POOL_GRANULE) : 0;
  p->span = o->small_chunk;
  p->cache_bytes = o->cache_size;
  p->stripes = o->stream_heaps;
  if (p->stripes == 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->stripes = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus;
  }
  p->release_before_grow = o->release_before_grow;
  p->slack = o->release_slack;
  p->band = 3.0;
  p->split_limit = o->split_limit;
  p->event_interval = o->event_interval;
  p->event_bytes = o->event_bytes;
  p->gc_limit = SIZE_MAX;
  if (o->gc_threshold > 0.0) {
    size_t basis = p->max_size, total = 0, unused;
    rmmc_memory_kind_t kind = p->base.base.kind;
    if (basis == SIZE_MAX && (kind == RMMC_MEMORY_DEVICE || kind == RMMC_MEMORY_MANAGED)) {
      rmmc_status_t st = rmmc_device_memory_info(p->base.base.device, &unused, &total);
      if (st != RMMC_SUCCESS) return st;
      basis = total;
    } else if (basis == SIZE_MAX) {
      basis = rmmc__host_memory_total();
      if (basis == 0)
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "pool_resource_create: gc_threshold needs the host memory size, "
                              "which is unknown: set maximum_size");
    }
    p->gc_limit = (size_t)((double)basis * o->gc_threshold);
  }
  return RMMC_SUCCESS;
}

/* Chooses the backend and sets its options. */
static rmmc_status_t choose_backend(pool_t *p, const rmmc_pool_options_t *o) {
  rmmc_resource_t *up = p->base.upstream;
  size_t up_page = rmmc_resource_vm_page_size(up);
  if (o->expandable == 1 && up_page == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_resource_create: expandable needs an upstream with virtual "
                          "memory (cuda, host, sim); %s has none",
                          rmmc_resource_name(up));
  if (o->expandable == 0 || up_page == 0) {
    p->be = &rmmc__pool_chunks;
    if (p->min_growth == 0) p->min_growth = p->granularity;
    p->min_growth = rmmc__align_up(p->min_growth, p->granularity);
    return RMMC_SUCCESS;
  }
  size_t seg = o->page_size != 0 ? o->page_size : (size_t)32 << 20;
  if (o->page_size == ((size_t)32 << 20) && seg < up_page) seg = up_page; /* the default only */
  if (seg < up_page || seg % up_page != 0 || seg > ((size_t)1 << 40))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: page_size %zu must be a multiple of %s's page "
                          "(%zu) up to 1 TiB",
                          seg, rmmc_resource_name(up), up_page);
  size_t space = o->address_space;
  if (space == 0 && p->max_size != SIZE_MAX) space = p->max_size;
  if (space == 0) {
    size_t total = 0, unused;
    if (p->base.base.kind != RMMC_MEMORY_HOST) {
      rmmc_status_t st = rmmc_device_memory_info(p->base.base.device, &unused, &total);
      if (st != RMMC_SUCCESS) return st;
    } else {
      total = rmmc__host_memory_total();
    }
    space = total > 0 && total <= POOL_MAX_REQUEST / 2 ? 2 * total : (size_t)64 << 30;
  }
  if (space > POOL_MAX_REQUEST)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: address_space %zu is above 128 TiB", space);
  p->be = &rmmc__pool_vm;
  p->page = up_page;
  p->segment = seg;
  size_t align = p->span > up_page ? p->span : up_page;
  p->address_space = rmmc__align_up(space, align);
  p->min_growth = o->min_growth == ((size_t)32 << 20) ? 0 : rmmc__align_up(o->min_growth, up_page);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_pool_resource_create(rmmc_resource_t *upstream,
                                                 const rmmc_pool_options_t *options,
                                                 rmmc_resource_t **out) {
  return rmmc__pool_create(upstream, options, false, out);
}

rmmc_status_t rmmc__pool_create(rmmc_resource_t *upstream, const rmmc_pool_options_t *options,
                                bool arena, rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("pool_resource_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  st = rmmc__copy_options("pool_resource_create", &o, sizeof o, options);
  if (st != RMMC_SUCCESS) return st;
  pool_t *p = calloc(1, sizeof *p);
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool_resource_create: no host memory");
  rmmc__adaptor_init(&p->base, arena ? &arena_ops : &pool_ops, upstream);
  p->id = __atomic_add_fetch(&next_pool_id, 1, __ATOMIC_RELAXED);
  p->cuda = upstream->kind != RMMC_MEMORY_HOST;
  rmmc__ptrmap_init(&p->used);
  rmmc__ptrmap_init(&p->spans);
  pthread_mutex_init(&p->snap_lock, NULL);
  rmmc__stream_set_init(&p->streams, upstream, sizeof(pool_owner_t));
  st = apply_options(p, &o);
  if (st == RMMC_SUCCESS) st = choose_backend(p, &o);
  if (st == RMMC_SUCCESS && !pool_meta_room(&p->meta)) st = rmmc__pool_no_host_memory();
  if (st == RMMC_SUCCESS && o.initial_size > 0) {
    pool_block_t *b;
    size_t min_growth = p->min_growth; /* the initial size is what is asked for */
    p->min_growth = 0;
    st = p->be->grow(p, NULL, NULL, rmmc__align_up(o.initial_size, POOL_GRANULE), POOL_GRANULE,
                     false, &b);
    p->min_growth = min_growth;
    if (st == RMMC_SUCCESS) {
      b->owner = NULL; /* ready for every stream (the backend made sure) */
      rmmc__pool_put_free(p, b);
    }
  }
  if (st != RMMC_SUCCESS) goto destroy;
  *out = &p->base.base;
  return RMMC_SUCCESS;
destroy:
  pool_destroy(&p->base.base);
  return st;
}

bool rmmc__pool_is_arena(const rmmc_resource_t *r) { return r != NULL && r->ops == &arena_ops; }

/* ---- stack spec ---- */

static const rmmc__spec_option_t pool_spec_options[] = {
    {"initial", RMMC__OPT_BYTES_PCT, "bytes reserved at creation (default 0)"},
    {"max", RMMC__OPT_BYTES_PCT, "most bytes reserved from the upstream (default: no limit)"},
    {"min_growth", RMMC__OPT_BYTES, "chunks: fewest bytes one growth takes (default 32MiB)"},
    {"granularity", RMMC__OPT_BYTES, "chunks: growth rounded up to this power of two (default 2MiB)"},
    {"small_max", RMMC__OPT_BYTES, "requests up to this size go to the stream heaps (default 1MiB; 0: off)"},
    {"small_chunk", RMMC__OPT_BYTES, "bytes of one span lent to a stream heap (default 4MiB)"},
    {"cache", RMMC__OPT_BYTES, "wholly free span bytes a stream heap keeps (default 8MiB)"},
    {"stream_heaps", RMMC__OPT_INT, "most heaps per stream, for threads sharing one (default: one per CPU up to 64)"},
    {"gc_threshold", RMMC__OPT_DOUBLE, "fraction of max/device memory above which growth gives back first (default 0: off)"},
    {"release_before_grow", RMMC__OPT_BOOL, "keep reserved within the budget before growing (default true)"},
    {"release_slack", RMMC__OPT_DOUBLE, "the budget: reserved within (1 + this) x peak (default 0.02)"},
    {"split_limit", RMMC__OPT_DOUBLE, "chunks: grow rather than split a free chunk this many times the growth (default 8; 0: off)"},
    {"event_interval", RMMC__OPT_INT, "frees per stream between event records, while several streams use the pool (default 1)"},
    {"event_bytes", RMMC__OPT_BYTES, "freed bytes per stream between event records (default 256MiB)"},
    {"expandable", RMMC__OPT_BOOL, "virtual memory (true) or chunks (false); default: virtual memory when the upstream has it"},
    {"page", RMMC__OPT_BYTES, "virtual memory: most bytes one mapping covers (default 32MiB)"},
    {"address_space", RMMC__OPT_BYTES, "virtual memory: bytes of one reservation (default max, else 2x memory)"},
    {NULL, 0, NULL},
};

static rmmc_status_t pool_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_bytes(args, "initial", upstream, &o.initial_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "max", upstream, &o.maximum_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "min_growth", upstream, &o.min_growth);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "granularity", upstream, &o.growth_granularity);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "small_max", upstream, &o.small_max);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "small_chunk", upstream, &o.small_chunk);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "cache", upstream, &o.cache_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "event_bytes", upstream, &o.event_bytes);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "page", upstream, &o.page_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "address_space", upstream, &o.address_space);
  if (st != RMMC_SUCCESS) return st;
  rmmc__spec_double(args, "gc_threshold", &o.gc_threshold);
  rmmc__spec_bool(args, "release_before_grow", &o.release_before_grow);
  rmmc__spec_double(args, "release_slack", &o.release_slack);
  rmmc__spec_double(args, "split_limit", &o.split_limit);
  bool expandable;
  if (rmmc__spec_bool(args, "expandable", &expandable)) o.expandable = expandable ? 1 : 0;
  long long interval;
  if (rmmc__spec_int(args, "event_interval", &interval)) {
    if (interval < 1 || interval > (long long)UINT_MAX)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "pool: event_interval=%lld is out of range (1 to %u)", interval,
                            UINT_MAX);
    o.event_interval = (unsigned)interval;
  }
  long long heaps;
  if (rmmc__spec_int(args, "stream_heaps", &heaps)) {
    if (heaps < 0 || heaps > 1024)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "pool: stream_heaps=%lld is out of range (0 to 1024)", heaps);
    o.stream_heaps = (unsigned)heaps;
  }
  return rmmc_pool_resource_create(upstream, &o, out);
}

const rmmc__spec_entry_t rmmc__pool_spec = {
    .name = "pool",
    .help = "stream-ordered sub-allocator: per-stream heaps over one coalescing address space",
    .needs_upstream = true,
    .options = pool_spec_options,
    .build = pool_build,
};
