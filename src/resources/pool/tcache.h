/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's thread cache (internal; tcache.c): TL_WAYS ways keyed by (pool
 * id, stream key), each the thread's heap of the stream and its owner. A
 * cached heap may have been retired since: whoever locks it checks that its
 * owner is still the cached one, and finds the thread's heap again if not.
 */
#ifndef RMMC_POOL_TCACHE_H
#define RMMC_POOL_TCACHE_H

#include "pool_internal.h"

#define TL_WAYS 8u

typedef struct tl_entry {
  uint64_t pool;
  const void *key;
  pool_sheap_t *heap;  /* may have been retired since: checked under its lock */
  pool_owner_t *owner; /* the stream's owner, which lives as long as the pool */
} tl_entry_t;

/* The calling thread's TL_WAYS entries; NULL before its first miss. */
extern _Thread_local tl_entry_t *rmmc__pool_tl_cache RMMC_TLS_FAST;

/* The calling thread's heap of `stream` (key `key`), made on first use, and
 * cached for this thread with the stream's owner. */
rmmc_status_t rmmc__pool_heap_find(pool_t *p, cudaStream_t stream, const void *key,
                                   pool_sheap_t **out, pool_owner_t **owner);
/* h was retired (and maybe reused) since this thread cached it: the
 * thread's heap of the stream again (h is not locked). */
rmmc_status_t rmmc__pool_heap_stale(pool_t *p, cudaStream_t stream, pool_sheap_t **h,
                                    pool_owner_t **o);
rmmc_status_t rmmc__pool_owner_rejoin(pool_t *p, pool_owner_t *o);

static inline unsigned tl_way(uint64_t pool, const void *key) {
  uint64_t h = (pool ^ (uint64_t)(uintptr_t)key) * UINT64_C(0x9E3779B97F4A7C15);
  return (unsigned)(h >> 61) & (TL_WAYS - 1);
}

/* The calling thread's entry for p and stream key `key`, or NULL. */
static inline tl_entry_t *heap_cached(const pool_t *p, const void *key) {
  tl_entry_t *c = rmmc__pool_tl_cache;
  if (RMMC_LIKELY(c != NULL)) {
    tl_entry_t *e = &c[tl_way(p->id, key)];
    if (RMMC_LIKELY(e->pool == p->id && e->key == key)) return e;
  }
  return NULL;
}

#endif /* RMMC_POOL_TCACHE_H */
