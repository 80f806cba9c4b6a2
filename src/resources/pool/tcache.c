/* SPDX-License-Identifier: Apache-2.0 */
/* The pool's thread cache (tcache.h): thread numbers and the misses. */
#include "core.h"

/* A thread's number, given on its first call into any pool: threads on one
 * stream take the stream's heaps in turn (number modulo stream_heaps). A
 * thread that exits gives its number back and the next new thread takes
 * the lowest free one, so recreated workers reuse a stream's heaps instead
 * of stranding their spans (design.md, "Thread numbers are given back").
 * Numbers past THREAD_NUMBERS are never given back. */
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
  return (tl_number - 1) % p->stream_heaps;
}

_Thread_local tl_entry_t *rmmc__pool_tl_cache RMMC_TLS_FAST;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static bool tl_key_ok;

static void tl_free(void *c) { /* the thread exits */
  free(c);
  rmmc__pool_tl_cache = NULL;
  thread_number_give(tl_number);
  tl_number = 0;
}

static void tl_init(void) { tl_key_ok = pthread_key_create(&tl_key, tl_free) == 0; }

/* Stripe `stripe`'s heap of o (shared lock held). */
static pool_sheap_t *heap_of_stripe(pool_owner_t *o, unsigned stripe) {
  pool_sheap_t *h = o->heap;
  while (h != NULL && h->stripe != stripe) h = h->onext;
  return h;
}

POOL_NOINLINE rmmc_status_t rmmc__pool_heap_find(pool_t *p, cudaStream_t stream, const void *key,
                                                 pool_sheap_t **out, pool_owner_t **owner) {
  rmmc__stream_slot_t *slot;
  rmmc_status_t st = rmmc__stream_set_get(&p->streams, stream, &slot);
  if (st != RMMC_SUCCESS) return st;
  pool_owner_t *o = rmmc__stream_slot_user(slot);
  unsigned stripe = thread_stripe(p);
  rmmc__lock(&p->lock);
  pool_sheap_t *h = heap_of_stripe(o, stripe);
  if (h == NULL) st = rmmc__pool_heap_new(p, o, slot, stripe, &h);
  rmmc__unlock(&p->lock);
  if (st != RMMC_SUCCESS) return st;
  if (rmmc__pool_tl_cache == NULL) {
    pthread_once(&tl_once, tl_init);
    tl_entry_t *c = calloc(TL_WAYS, sizeof *c);
    if (c != NULL && tl_key_ok && pthread_setspecific(tl_key, c) == 0) rmmc__pool_tl_cache = c;
    else free(c);
  }
  if (rmmc__pool_tl_cache != NULL)
    rmmc__pool_tl_cache[tl_way(p->id, key)] = (tl_entry_t){p->id, key, h, o};
  *out = h;
  *owner = o;
  return RMMC_SUCCESS;
}

/* A call in the shared heap (shared lock held) finds o without a heap when
 * every heap of o was retired since this thread cached one: o may then be
 * unlisted (no index), or listed only for free blocks a consolidation in
 * this call may unlist it for. So it gets a heap of this thread's stripe
 * first, which keeps it listed, with its index, to the call's end
 * (consolidate unlists only streams without a heap; heaps are retired only
 * as another is made). */
POOL_NOINLINE rmmc_status_t rmmc__pool_owner_rejoin(pool_t *p, pool_owner_t *o) {
  pool_sheap_t *h;
  return rmmc__pool_heap_new(p, o, o->slot, thread_stripe(p), &h);
}
