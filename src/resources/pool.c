/*
 * The pool resource (include/rmmc/pool_resource.h has the contract and the
 * policies; this comment says how the code is laid out).
 *
 * Memory is taken from the upstream in chunks. A chunk is tiled by blocks
 * kept in a physical list (phys_prev/phys_next). A block is used (handed
 * out: in the pointer map `used`), a slab (a large block whose memory is a
 * small chunk with its own blocks), or free. A free block has an owner (a
 * stream, or the pool's `neutral` pseudo-stream for memory no stream has
 * pending work on) and a state: FRESH (freed on its owner, not yet covered
 * by the owner's event: only the owner may take it) or COVERED (the owner's
 * event was recorded after its free: any stream may take it after waiting
 * on that event; neutral blocks are always COVERED and need no wait). Each
 * free block sits in exactly one TLSF index, owner->idx[class][state],
 * except each stream's hot block (its last free, fresh), which sits in
 * owner->hot (idx == NULL) so that an immediate same-size request skips
 * the index.
 *
 * Merging rules (merge): two adjacent free blocks merge when they have the
 * same owner and state, or are both COVERED and one is neutral (the result
 * keeps the stream owner, so the wait stays correct). FRESH blocks become
 * COVERED, and merge further, when their owner's event is recorded
 * (cover); a synchronization of the device makes every free block neutral
 * (settle). In host mode (host upstream) nothing calls CUDA: covering is
 * free, so a stream's previous hot block is covered at its next free and
 * settle only relabels.
 *
 * Everything runs under one lock. Hot path: one compare for the stream,
 * the hot block or three O(1) index searches, carve, one map insert; free:
 * one map lookup and removal, O(1) merges, the hot slot.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lock.h"
#include "../ptrmap.h"
#include "../spec.h"
#include "rmmc/pool_resource.h"
#include "rmmc/registry.h"

#define GRANULE ((size_t)256)
#define GRANULE_LOG2 8u
#define SL_LOG2 5u
#define SL_COUNT 32u
#define FL_SHIFT (GRANULE_LOG2 + SL_LOG2) /* sizes below 8 KiB map linearly */
#define FL_COUNT 40u                      /* block sizes below 2^51 */
#define MAX_REQUEST ((size_t)1 << 48)     /* larger requests cannot be met */
#define SPARE_MIN 8                       /* block structs kept ready */
#define META_BATCH 255
/* Expandable: bytes mapped at a time. Each mapping costs about 45 us on an
 * H200 whatever its size (cuMemCreate + cuMemMap + cuMemSetAccess), so
 * 2 MiB pages made a ResNet-50 replay 8x slower than cudaMalloc'd chunks;
 * 32 MiB pages made it 2.2x faster (PyTorch's expandable segments map 20
 * MiB at a time). */
#define DEFAULT_PAGE ((size_t)32 << 20)

#if defined(__GNUC__) || defined(__clang__)
#define RMMC_NOINLINE __attribute__((noinline))
#define RMMC_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RMMC_NOINLINE
#define RMMC_ALWAYS_INLINE inline
#endif

enum { CLASS_SMALL = 0, CLASS_LARGE = 1, NCLASS = 2 };
enum { ST_FRESH = 0, ST_COVERED = 1, ST_USED = 2, ST_SLAB = 3 };

typedef struct block block_t;
typedef struct chunk chunk_t;
typedef struct pstream pstream_t;

struct block {
  uintptr_t addr;
  size_t size;
  block_t *phys_prev, *phys_next; /* neighbours in the chunk */
  block_t *free_prev, *free_next; /* bin list (free); free_next links spares */
  chunk_t *chunk;
  pstream_t *owner; /* free blocks */
  struct tlsf *idx; /* free blocks: the index holding it (NULL: its owner's hot block) */
  union {
    size_t requested; /* used blocks: bytes asked for */
    chunk_t *slab;    /* slab blocks: the small chunk inside */
  } u;
  int state;
};

struct chunk {
  uintptr_t base;
  size_t size;
  chunk_t *prev, *next; /* the pool's list of upstream chunks, or of slabs */
  block_t *first;
  block_t *parent; /* slabs: the large block holding it; NULL: upstream chunk */
  uint64_t *mapped; /* expandable: one bit per page, set while the page is mapped */
  int cls;
};

typedef struct tlsf {
  uint64_t fl_map;
  uint32_t sl_map[FL_COUNT];
  block_t *heads[FL_COUNT][SL_COUNT];
  size_t bytes, count;
} tlsf_t;

struct pstream {
  uintptr_t key;
  cudaStream_t stream; /* for reports only: never passed to CUDA */
  cudaEvent_t event;   /* device mode */
  pstream_t *next;
  block_t *hot;          /* the last block freed here, fresh, kept out of idx */
  tlsf_t idx[NCLASS][2]; /* [class][ST_FRESH / ST_COVERED] */
};

typedef struct meta_batch {
  struct meta_batch *next;
  block_t blocks[META_BATCH];
} meta_batch_t;

typedef struct pool {
  rmmc__adaptor_t base;
  rmmc__lock_t lock;
  bool cuda; /* streams are real: events, waits, synchronization */
  /* options, resolved */
  size_t max_size, min_growth, granularity, small_max, small_chunk, gc_limit, event_bytes;
  unsigned event_interval;
  bool release_before_grow, sync_before_grow;
  double release_slack, split_limit; /* split_limit 0: off */
  bool last_resort; /* out of memory: split_limit is ignored */
  /* expandable: chunks are address-space reservations backed page by page */
  bool vm;
  size_t page, address_space; /* page size; bytes of one reservation */
  size_t span;                /* bytes of address space held (chunks) */
  uint64_t page_maps, page_unmaps;
  /* state */
  rmmc__ptrmap_t used;    /* address -> used block */
  rmmc__ptrmap_t streams; /* stream key -> pstream */
  pstream_t *last;        /* the stream of the last call */
  pstream_t *stream_list;
  pstream_t neutral;
  chunk_t *chunks, *slabs;
  chunk_t *spare_chunks; /* linked by next; at least 2 before each call's work */
  size_t nspare_chunks;
  block_t *spare;
  size_t nspare;
  meta_batch_t *batches;
  /* figures */
  size_t reserved, in_use, free_bytes, reserved_peak, in_use_peak, nchunks, nslabs;
  uint64_t chunk_allocs, chunk_releases, event_records, event_waits, device_syncs;
} pool_t;

static const rmmc_resource_ops_t pool_ops;

/* ---- block structs ---- */

static bool refill_spare(pool_t *p) {
  meta_batch_t *m = malloc(sizeof *m);
  if (m == NULL) return false;
  m->next = p->batches;
  p->batches = m;
  for (int i = 0; i < META_BATCH; i++) {
    m->blocks[i].free_next = p->spare;
    p->spare = &m->blocks[i];
  }
  p->nspare += META_BATCH;
  return true;
}

static inline block_t *new_block(pool_t *p) {
  block_t *b = p->spare;
  p->spare = b->free_next;
  p->nspare--;
  return b;
}

static inline void drop_block(pool_t *p, block_t *b) {
  b->free_next = p->spare;
  p->spare = b;
  p->nspare++;
}

static inline chunk_t *new_chunk(pool_t *p) {
  chunk_t *c = p->spare_chunks;
  p->spare_chunks = c->next;
  p->nspare_chunks--;
  return c;
}

static void drop_chunk(pool_t *p, chunk_t *c) {
  if (p->nspare_chunks >= 4) {
    free(c);
    return;
  }
  c->next = p->spare_chunks;
  p->spare_chunks = c;
  p->nspare_chunks++;
}

/* ---- TLSF indices ---- */

static inline unsigned log2_floor(size_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static inline void bin_of(size_t size, unsigned *fl, unsigned *sl) {
  if (size < ((size_t)1 << FL_SHIFT)) {
    *fl = 0;
    *sl = (unsigned)(size >> GRANULE_LOG2);
    return;
  }
  unsigned t = log2_floor(size);
  *fl = t - (FL_SHIFT - 1);
  *sl = (unsigned)(size >> (t - SL_LOG2)) & (SL_COUNT - 1);
}

static inline void tlsf_insert(tlsf_t *x, block_t *b) {
  unsigned fl, sl;
  bin_of(b->size, &fl, &sl);
  block_t *h = x->heads[fl][sl];
  b->free_prev = NULL;
  b->free_next = h;
  if (h != NULL) h->free_prev = b;
  x->heads[fl][sl] = b;
  x->fl_map |= (uint64_t)1 << fl;
  x->sl_map[fl] |= 1u << sl;
  x->bytes += b->size;
  x->count++;
}

static inline void tlsf_remove(tlsf_t *x, block_t *b) {
  if (b->free_next != NULL) b->free_next->free_prev = b->free_prev;
  if (b->free_prev != NULL) {
    b->free_prev->free_next = b->free_next;
  } else {
    unsigned fl, sl;
    bin_of(b->size, &fl, &sl);
    x->heads[fl][sl] = b->free_next;
    if (b->free_next == NULL && (x->sl_map[fl] &= ~(1u << sl)) == 0)
      x->fl_map &= ~((uint64_t)1 << fl);
  }
  x->bytes -= b->size;
  x->count--;
}

/* A free block of at least `need` bytes, O(1): the head of need's own bin
 * if it fits, else the head of the first non-empty higher bin (all of whose
 * blocks fit). NULL if there is none. need <= MAX_REQUEST. */
static inline block_t *tlsf_find(const tlsf_t *x, size_t need) {
  if (x->count == 0) return NULL;
  unsigned fl, sl;
  bin_of(need, &fl, &sl);
  block_t *h = x->heads[fl][sl];
  if (h != NULL && h->size >= need) return h;
  uint32_t slm = sl + 1 < SL_COUNT ? x->sl_map[fl] & (~0u << (sl + 1)) : 0;
  if (slm == 0) {
    uint64_t flm = x->fl_map & (~(uint64_t)0 << (fl + 1));
    if (flm == 0) return NULL;
    fl = (unsigned)__builtin_ctzll(flm);
    slm = x->sl_map[fl];
  }
  return x->heads[fl][__builtin_ctz(slm)];
}

/* Any block of the index (the head of its lowest non-empty bin). */
static inline block_t *tlsf_any(const tlsf_t *x) {
  unsigned fl = (unsigned)__builtin_ctzll(x->fl_map);
  return x->heads[fl][__builtin_ctz(x->sl_map[fl])];
}

/* The largest block of the index: the biggest in its highest bin. */
static size_t tlsf_largest(const tlsf_t *x) {
  if (x->count == 0) return 0;
  unsigned fl = log2_floor(x->fl_map);
  unsigned sl = 31u - (unsigned)__builtin_clz(x->sl_map[fl]);
  size_t best = 0;
  for (const block_t *b = x->heads[fl][sl]; b != NULL; b = b->free_next)
    if (b->size > best) best = b->size;
  return best;
}

static inline tlsf_t *index_of(const block_t *b) {
  return &b->owner->idx[b->chunk->cls][b->state];
}

static inline void link_free(pool_t *p, block_t *b) {
  b->idx = index_of(b);
  tlsf_insert(b->idx, b);
  p->free_bytes += b->size;
}

static inline void unlink_free(pool_t *p, block_t *b) {
  if (RMMC_UNLIKELY(b->idx == NULL)) b->owner->hot = NULL;
  else tlsf_remove(b->idx, b);
  p->free_bytes -= b->size;
}

/* ---- merging and carving ---- */

static inline bool is_free(const block_t *b) { return b->state <= ST_COVERED; }

/* May free blocks a and b (adjacent) become one? See the file comment. */
static inline bool mergeable(const pool_t *p, const block_t *a, const block_t *b) {
  if (a->state != b->state) return false;
  if (a->owner == b->owner) return true;
  return a->state == ST_COVERED && (a->owner == &p->neutral || b->owner == &p->neutral);
}

/* Merges b (free: owner and state set, in no index) with every neighbour
 * the rules allow; b is the merged block. */
static RMMC_ALWAYS_INLINE void merge(pool_t *p, block_t *b) {
  block_t *n = b->phys_prev;
  if (n != NULL && is_free(n) && mergeable(p, n, b)) {
    unlink_free(p, n);
    if (b->owner == &p->neutral) b->owner = n->owner;
    b->addr = n->addr;
    b->size += n->size;
    b->phys_prev = n->phys_prev;
    if (n->phys_prev != NULL) n->phys_prev->phys_next = b;
    else b->chunk->first = b;
    drop_block(p, n);
  }
  n = b->phys_next;
  if (n != NULL && is_free(n) && mergeable(p, b, n)) {
    unlink_free(p, n);
    if (b->owner == &p->neutral) b->owner = n->owner;
    b->size += n->size;
    b->phys_next = n->phys_next;
    if (n->phys_next != NULL) n->phys_next->phys_prev = b;
    drop_block(p, n);
  }
}

/* Makes b free: merges it, then indexes the result. */
static void put_free(pool_t *p, block_t *b) {
  merge(p, b);
  link_free(p, b);
}

/* Makes b (just freed by its owner, fresh, merged) the owner's hot block:
 * the next request of exactly its size takes it without touching an index.
 * The previous hot block goes into the fresh index or, in host mode where
 * covering costs nothing, is covered and merged at once. */
static inline void put_hot(pool_t *p, pstream_t *ps, block_t *b) {
  block_t *h = ps->hot;
  if (h != NULL) {
    unlink_free(p, h);
    if (!p->cuda) {
      h->state = ST_COVERED;
      merge(p, h);
    }
    link_free(p, h);
  }
  ps->hot = b;
  b->idx = NULL;
  p->free_bytes += b->size;
}

/* Cuts b (free, unindexed, at least n + the alignment padding long) down
 * to n bytes at an `align`-aligned address; the padding before and the rest
 * after become free blocks with b's owner and state. Needs 2 spare structs.
 * Neither piece can merge: b's neighbours were not mergeable with b. */
static void carve(pool_t *p, block_t *b, size_t n, size_t align) {
  uintptr_t a = rmmc__align_up(b->addr, align);
  if (a != b->addr) {
    block_t *l = new_block(p);
    *l = (block_t){.addr = b->addr, .size = a - b->addr, .phys_prev = b->phys_prev,
                   .phys_next = b, .chunk = b->chunk, .owner = b->owner, .state = b->state};
    if (l->phys_prev != NULL) l->phys_prev->phys_next = l;
    else b->chunk->first = l;
    b->phys_prev = l;
    b->addr = a;
    b->size -= l->size;
    link_free(p, l);
  }
  if (b->size > n) {
    block_t *r = new_block(p);
    *r = (block_t){.addr = b->addr + n, .size = b->size - n, .phys_prev = b,
                   .phys_next = b->phys_next, .chunk = b->chunk, .owner = b->owner,
                   .state = b->state};
    if (r->phys_next != NULL) r->phys_next->phys_prev = r;
    b->phys_next = r;
    b->size = n;
    link_free(p, r);
  }
}

/* ---- streams ---- */

static _Thread_local char tl_per_thread_key;

/* cudaStreamPerThread names a different stream in every thread. */
static inline uintptr_t stream_key(const pool_t *p, cudaStream_t s) {
  if (p->cuda && s == cudaStreamPerThread) return (uintptr_t)&tl_per_thread_key;
  return (uintptr_t)s;
}

static rmmc_status_t cuda_failed(cudaError_t err, const char *what) {
  return rmmc_set_cuda_error(err, what);
}

static rmmc_status_t no_host_memory(void) {
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: no host memory for bookkeeping");
}

/* Stream keys in the pointer map, which reserves NULL (the legacy default
 * stream's key is 0). */
static inline void *stream_map_key(uintptr_t key) { return (void *)(key + 1); }

static pstream_t *lookup_stream(const pool_t *p, uintptr_t key) {
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->streams, stream_map_key(key));
  return e != NULL ? e->value : NULL;
}

/* The state of `stream` (key `key`), created on first use. */
static rmmc_status_t find_stream(pool_t *p, uintptr_t key, cudaStream_t stream, pstream_t **out) {
  pstream_t *ps = lookup_stream(p, key);
  if (ps == NULL) {
    ps = calloc(1, sizeof *ps);
    if (ps == NULL) return no_host_memory();
    if (p->cuda) {
      int saved;
      rmmc_status_t st = rmmc__device_push(p->base.base.device, &saved);
      if (st == RMMC_SUCCESS) {
        cudaError_t err = cudaEventCreateWithFlags(&ps->event, cudaEventDisableTiming);
        rmmc__device_pop(saved);
        if (err != cudaSuccess) st = cuda_failed(err, "pool: cudaEventCreateWithFlags");
      }
      if (st != RMMC_SUCCESS) {
        free(ps);
        return st;
      }
    }
    if (!rmmc__ptrmap_insert(&p->streams, stream_map_key(key), ps, 0)) {
      if (p->cuda) (void)cudaEventDestroy(ps->event);
      free(ps);
      return no_host_memory();
    }
    ps->key = key;
    ps->stream = stream;
    ps->next = p->stream_list;
    p->stream_list = ps;
  }
  p->last = ps;
  *out = ps;
  return RMMC_SUCCESS;
}

static inline size_t fresh_count(const pstream_t *ps) {
  return ps->idx[CLASS_SMALL][ST_FRESH].count + ps->idx[CLASS_LARGE][ST_FRESH].count +
         (ps->hot != NULL);
}

static inline size_t fresh_bytes(const pstream_t *ps) {
  return ps->idx[CLASS_SMALL][ST_FRESH].bytes + ps->idx[CLASS_LARGE][ST_FRESH].bytes +
         (ps->hot != NULL ? ps->hot->size : 0);
}

static inline size_t stream_free_bytes(const pstream_t *ps) {
  return fresh_bytes(ps) + ps->idx[CLASS_SMALL][ST_COVERED].bytes +
         ps->idx[CLASS_LARGE][ST_COVERED].bytes;
}

/* Moves every free block of ps to state `state` and owner `owner`, merging
 * as the rules allow. */
static void relabel_all(pool_t *p, pstream_t *ps, int from, pstream_t *owner, int state) {
  if (from == ST_FRESH && ps->hot != NULL) {
    block_t *h = ps->hot;
    unlink_free(p, h);
    link_free(p, h);
  }
  for (int cls = 0; cls < NCLASS; cls++) {
    tlsf_t *x = &ps->idx[cls][from];
    while (x->count > 0) {
      block_t *b = tlsf_any(x);
      unlink_free(p, b);
      b->owner = owner;
      b->state = state;
      put_free(p, b);
    }
  }
}

/* Covers ps's fresh blocks: in device mode records ps's event on `stream`
 * (the handle of the current call, so it is alive) first; then the blocks
 * are covered and merge with their covered neighbours. A failed record
 * leaves them fresh, which is safe, and is not reported: the caller's own
 * work succeeded. */
static bool cover(pool_t *p, pstream_t *ps, cudaStream_t stream) {
  if (p->cuda) {
    int saved;
    if (rmmc__device_push(p->base.base.device, &saved) != RMMC_SUCCESS) return false;
    cudaError_t err = cudaEventRecord(ps->event, stream);
    rmmc__device_pop(saved);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    p->event_records++;
  }
  relabel_all(p, ps, ST_FRESH, ps, ST_COVERED);
  return true;
}

/* Makes `stream` wait for q's last recorded event before it uses q's
 * covered memory. */
static rmmc_status_t wait_for(pool_t *p, cudaStream_t stream, const pstream_t *q) {
  if (!p->cuda || q == &p->neutral) return RMMC_SUCCESS;
  int saved;
  rmmc_status_t st = rmmc__device_push(p->base.base.device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamWaitEvent(stream, q->event, 0);
  rmmc__device_pop(saved);
  if (err != cudaSuccess) return cuda_failed(err, "pool: cudaStreamWaitEvent");
  p->event_waits++;
  return RMMC_SUCCESS;
}

/* Waits for the whole device (device mode), then makes every free block
 * neutral and merges all it can. */
static rmmc_status_t settle(pool_t *p) {
  if (p->cuda) {
    int saved;
    rmmc_status_t st = rmmc__device_push(p->base.base.device, &saved);
    if (st != RMMC_SUCCESS) return st;
    cudaError_t err = cudaDeviceSynchronize();
    rmmc__device_pop(saved);
    if (err != cudaSuccess) return cuda_failed(err, "pool: cudaDeviceSynchronize");
    p->device_syncs++;
  }
  for (pstream_t *q = p->stream_list; q != NULL; q = q->next) {
    relabel_all(p, q, ST_FRESH, &p->neutral, ST_COVERED);
    relabel_all(p, q, ST_COVERED, &p->neutral, ST_COVERED);
  }
  return RMMC_SUCCESS;
}

/* ---- slabs ---- */

/* Turns the large block L (free, unindexed, at least small_chunk long)
 * into a slab whose one free block gets `owner` and `state`. Uses the spare
 * chunk struct and up to 3 spare block structs. */
static void make_slab(pool_t *p, block_t *L, pstream_t *owner, int state) {
  carve(p, L, p->small_chunk, GRANULE);
  chunk_t *c = new_chunk(p);
  block_t *b = new_block(p);
  *c = (chunk_t){.base = L->addr, .size = L->size, .next = p->slabs, .first = b, .parent = L,
                 .cls = CLASS_SMALL};
  if (p->slabs != NULL) p->slabs->prev = c;
  p->slabs = c;
  p->nslabs++;
  L->state = ST_SLAB;
  L->u.slab = c;
  *b = (block_t){.addr = c->base, .size = c->size, .chunk = c, .owner = owner, .state = state};
  link_free(p, b);
}

/* Gives every wholly free slab back to the large blocks; returns how many. */
static size_t reclaim_slabs(pool_t *p) {
  size_t n = 0;
  for (chunk_t *c = p->slabs, *next; c != NULL; c = next) {
    next = c->next;
    block_t *b = c->first;
    if (!is_free(b) || b->phys_next != NULL) continue;
    unlink_free(p, b);
    block_t *L = c->parent;
    L->owner = b->owner;
    L->state = b->state;
    drop_block(p, b);
    if (c->prev != NULL) c->prev->next = c->next;
    else p->slabs = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
    p->nslabs--;
    drop_chunk(p, c);
    put_free(p, L);
    n++;
  }
  return n;
}

/* ---- search ---- */

/* split_limit: is b a wholly free upstream chunk more than split_limit
 * times the growth a request of `need` bytes would make? Then the pool
 * grows instead of splitting it (a smaller, maybe long-lived, block would
 * pin it), and release_before_grow can give it back. Off on the last resort
 * before out of memory. The growth is counted as grow() makes it, rounded
 * to the granularity: a chunk grown for this very request is never too big
 * for it (split_limit >= 1; issue 11, F1). */
static inline bool too_big_to_split(const pool_t *p, const block_t *b, size_t need) {
  if (b->phys_prev != NULL || b->phys_next != NULL || p->split_limit == 0.0 || p->last_resort)
    return false;
  size_t want = rmmc__align_up(need, p->granularity);
  size_t g = want < p->min_growth ? p->min_growth : want;
  return (double)b->size > p->split_limit * (double)g;
}

static inline block_t *smaller(block_t *a, block_t *b) {
  return b != NULL && (a == NULL || b->size < a->size) ? b : a;
}

/* The best fit among the blocks ps may take at once: its own and the
 * neutral ones. */
static inline block_t *find_local(pool_t *p, pstream_t *ps, int cls, size_t need) {
  block_t *h = ps->hot;
  if (h != NULL && (h->size < need || h->chunk->cls != cls)) h = NULL;
  if (h != NULL && h->size == need) return h;
  block_t *b = smaller(h, tlsf_find(&ps->idx[cls][ST_FRESH], need));
  if (b != NULL && b->size == need) return b;
  b = smaller(b, tlsf_find(&ps->idx[cls][ST_COVERED], need));
  b = smaller(b, tlsf_find(&p->neutral.idx[cls][ST_COVERED], need));
  return cls == CLASS_LARGE && b != NULL && RMMC_UNLIKELY(too_big_to_split(p, b, need)) ? NULL : b;
}

/* The best fit among other streams' covered blocks; *owner gets its
 * stream. */
static block_t *find_remote(pool_t *p, pstream_t *ps, int cls, size_t need, pstream_t **owner) {
  block_t *best = NULL;
  for (pstream_t *q = p->stream_list; q != NULL; q = q->next) {
    if (q == ps) continue;
    block_t *b = tlsf_find(&q->idx[cls][ST_COVERED], need);
    if (b != NULL && cls == CLASS_LARGE && too_big_to_split(p, b, need)) continue;
    if (smaller(best, b) != best) best = b, *owner = q;
  }
  return best;
}

static rmmc_status_t commit(pool_t *p, chunk_t *c, uintptr_t a, size_t n, cudaStream_t stream);

/* make_slab, after mapping the slab's pages in expandable mode (L is cut
 * to the slab's size first and is not free meanwhile); if they cannot be
 * mapped, L goes back to the free blocks and the error comes back. */
static rmmc_status_t take_slab(pool_t *p, block_t *L, pstream_t *owner, int state,
                               cudaStream_t stream) {
  if (p->vm) {
    carve(p, L, p->small_chunk, GRANULE);
    int s = L->state;
    L->state = ST_USED;
    rmmc_status_t st = commit(p, L->chunk, L->addr, L->size, stream);
    L->state = s;
    if (st != RMMC_SUCCESS) {
      put_free(p, L);
      return st;
    }
  }
  make_slab(p, L, owner, state);
  return RMMC_SUCCESS;
}

/* Finds a block of class cls with `need` bytes for ps without growing:
 * local blocks, a new slab from local large blocks (small class), other
 * streams' covered blocks (after a wait), a slab from those. On success *out
 * is the block, unindexed. */
static rmmc_status_t try_serve(pool_t *p, pstream_t *ps, cudaStream_t stream, int cls,
                               size_t need, block_t **out) {
  block_t *b = find_local(p, ps, cls, need);
  if (b == NULL && cls == CLASS_SMALL) {
    block_t *L = find_local(p, ps, CLASS_LARGE, p->small_chunk);
    if (L != NULL) {
      unlink_free(p, L);
      rmmc_status_t st = take_slab(p, L, L->owner, L->state, stream);
      if (st != RMMC_SUCCESS) return st;
      b = find_local(p, ps, cls, need);
    }
  }
  if (b == NULL) {
    pstream_t *q = NULL;
    b = find_remote(p, ps, cls, need, &q);
    if (b == NULL && cls == CLASS_SMALL) {
      block_t *L = find_remote(p, ps, CLASS_LARGE, p->small_chunk, &q);
      if (L != NULL) {
        rmmc_status_t st = wait_for(p, stream, q);
        if (st != RMMC_SUCCESS) return st;
        unlink_free(p, L);
        st = take_slab(p, L, ps, ST_FRESH, stream);
        if (st != RMMC_SUCCESS) return st;
        b = find_local(p, ps, cls, need);
      }
    } else if (b != NULL) {
      rmmc_status_t st = wait_for(p, stream, q);
      if (st != RMMC_SUCCESS) return st;
    }
  }
  if (b != NULL) unlink_free(p, b);
  *out = b;
  return RMMC_SUCCESS;
}

/* ---- growth and trimming ---- */

static void add_chunk(pool_t *p, uintptr_t base, size_t size, pstream_t *owner, int state) {
  chunk_t *c = new_chunk(p);
  block_t *b = new_block(p);
  *c = (chunk_t){.base = base, .size = size, .next = p->chunks, .first = b, .cls = CLASS_LARGE};
  if (p->chunks != NULL) p->chunks->prev = c;
  p->chunks = c;
  p->nchunks++;
  p->chunk_allocs++;
  if (p->vm) {
    p->span += size; /* reserved counts mapped pages only */
  } else {
    p->reserved += size;
    if (p->reserved > p->reserved_peak) p->reserved_peak = p->reserved;
  }
  *b = (block_t){.addr = base, .size = size, .chunk = c, .owner = owner, .state = state};
  link_free(p, b);
}

/* Gives wholly free chunks back to the upstream until reserved <= goal.
 * In device mode a chunk with pending work of a stream other than ps is
 * kept (its stream may be gone; settle() first to release those). The
 * upstream gets `stream`, on which the freed memory's work is ordered. */
static rmmc_status_t trim(pool_t *p, const pstream_t *ps, cudaStream_t stream, size_t goal) {
  if (p->vm) return RMMC_SUCCESS; /* reservations stay; unmap_free gives memory back */
  for (chunk_t *c = p->chunks, *next; c != NULL && p->reserved > goal; c = next) {
    next = c->next;
    block_t *b = c->first;
    if (!is_free(b) || b->phys_next != NULL) continue;
    if (p->cuda && b->owner != &p->neutral && b->owner != ps) continue;
    unlink_free(p, b);
    rmmc_status_t st = rmmc_resource_deallocate(p->base.upstream, (void *)c->base, c->size,
                                                GRANULE, stream);
    if (st != RMMC_SUCCESS) {
      link_free(p, b);
      return st;
    }
    if (c->prev != NULL) c->prev->next = c->next;
    else p->chunks = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
    p->reserved -= c->size;
    p->nchunks--;
    p->chunk_releases++;
    drop_block(p, b);
    drop_chunk(p, c);
  }
  return RMMC_SUCCESS;
}

/* ---- expandable mode: pages mapped into address-space reservations ----
 *
 * A chunk is a reservation; p->reserved counts its mapped pages. Every
 * page under a used block or a slab is mapped (commit() maps what is
 * missing when a block is handed out); a free block may hold unmapped
 * pages. Fresh blocks are always fully mapped (they come from frees of used
 * blocks and merge only with each other), so the hot-block fast path needs
 * no check. Pages go back only from untouched (neutral) free blocks, after
 * settle(): on a device that is a synchronization, as cudaFree would be. */

static inline bool page_is_mapped(const chunk_t *c, size_t i) {
  return (c->mapped[i >> 6] >> (i & 63)) & 1;
}

static inline void page_set(chunk_t *c, size_t i, bool on) {
  if (on) c->mapped[i >> 6] |= (uint64_t)1 << (i & 63);
  else c->mapped[i >> 6] &= ~((uint64_t)1 << (i & 63));
}

/* Pages [*first, *end) of chunk c that [a, a + n) touches. */
static inline void pages_touched(const pool_t *p, const chunk_t *c, uintptr_t a, size_t n,
                                 size_t *first, size_t *end) {
  *first = (a - c->base) / p->page;
  *end = (a + n - c->base + p->page - 1) / p->page;
}

/* Bytes of the pages [a, a + n) touches that are not mapped: a popcount
 * per 64 pages. */
static size_t unmapped_bytes(const pool_t *p, const chunk_t *c, uintptr_t a, size_t n) {
  size_t first, end, mapped = 0;
  pages_touched(p, c, a, n, &first, &end);
  for (size_t i = first; i < end;) {
    size_t w = i >> 6, lo = i & 63, hi = end - (w << 6) < 64 ? end - (w << 6) : 64;
    uint64_t mask = (hi == 64 ? ~(uint64_t)0 : ((uint64_t)1 << hi) - 1) & ~(((uint64_t)1 << lo) - 1);
    mapped += (size_t)__builtin_popcountll(c->mapped[w] & mask);
    i = (w << 6) + hi;
  }
  return (end - first - mapped) * p->page;
}

/* Unmaps page i of chunk c. */
static rmmc_status_t unmap_page(pool_t *p, chunk_t *c, size_t i) {
  rmmc_status_t st =
      rmmc_resource_vm_unmap(p->base.upstream, (void *)(c->base + i * p->page), p->page);
  if (st != RMMC_SUCCESS) return st;
  page_set(c, i, false);
  p->page_unmaps++;
  p->reserved -= p->page;
  return RMMC_SUCCESS;
}

/* Maps every page [a, a + n) touches that is not mapped yet, one upstream
 * call per page (so that each can go back alone). On failure the pages
 * this call mapped are unmapped again (if the host has memory for the
 * copy of the page map that tells them; else they stay, counted, as free
 * memory). */
static rmmc_status_t map_pages(pool_t *p, chunk_t *c, uintptr_t a, size_t n) {
  size_t first, end, i;
  pages_touched(p, c, a, n, &first, &end);
  size_t w0 = first >> 6, nw = ((end - 1) >> 6) - w0 + 1;
  uint64_t *before = malloc(nw * sizeof *before);
  if (before != NULL) memcpy(before, c->mapped + w0, nw * sizeof *before);
  rmmc_status_t st = RMMC_SUCCESS;
  for (i = first; i < end; i++) {
    if (page_is_mapped(c, i)) continue;
    st = rmmc_resource_vm_map(p->base.upstream, (void *)(c->base + i * p->page), p->page);
    if (st != RMMC_SUCCESS) break;
    page_set(c, i, true);
    p->page_maps++;
    p->reserved += p->page;
    if (p->reserved > p->reserved_peak) p->reserved_peak = p->reserved;
  }
  if (st != RMMC_SUCCESS && before != NULL) {
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    for (size_t k = first; k < i; k++)
      if (!((before[(k >> 6) - w0] >> (k & 63)) & 1)) (void)unmap_page(p, c, k);
    rmmc__error_restore(&why);
  }
  free(before);
  return st;
}

/* Unmaps the pages lying wholly inside untouched free blocks, largest
 * blocks first, until reserved <= goal. */
static rmmc_status_t unmap_free(pool_t *p, size_t goal) {
  tlsf_t *x = &p->neutral.idx[CLASS_LARGE][ST_COVERED];
  for (unsigned fl = FL_COUNT; fl-- > 0;) {
    for (unsigned sl = SL_COUNT; sl-- > 0;) {
      for (block_t *b = x->heads[fl][sl]; b != NULL; b = b->free_next) {
        chunk_t *c = b->chunk;
        size_t first = (b->addr - c->base + p->page - 1) / p->page;
        size_t end = (b->addr + b->size - c->base) / p->page;
        for (size_t i = first; i < end; i++) {
          if (p->reserved <= goal) return RMMC_SUCCESS;
          if (!page_is_mapped(c, i)) continue;
          rmmc_status_t st = unmap_page(p, c, i);
          if (st != RMMC_SUCCESS) return st;
        }
      }
    }
  }
  return RMMC_SUCCESS;
}

/* Gives back mapped pages of free blocks until reserved <= goal: every free
 * block becomes untouched first (settle). */
static rmmc_status_t shrink(pool_t *p, size_t goal) {
  if (p->reserved <= goal) return RMMC_SUCCESS;
  rmmc_status_t st = settle(p);
  if (st != RMMC_SUCCESS) return st;
  reclaim_slabs(p);
  return unmap_free(p, goal);
}

/* Backs [a, a + n) of chunk c with memory before it is handed out (a used
 * block or a slab, not free while this runs: shrink() may merge and
 * relabel the free blocks around it). Keeps reserved within the budget
 * that release_before_grow and the maximum set, as growth does in chunk
 * mode; on out of memory gives back every free page and tries once more. */
static rmmc_status_t pool_oom(const pool_t *p, size_t bytes, cudaStream_t stream,
                              const char *why);

static rmmc_status_t commit(pool_t *p, chunk_t *c, uintptr_t a, size_t n, cudaStream_t stream) {
  size_t add = unmapped_bytes(p, c, a, n);
  if (RMMC_LIKELY(add == 0)) return RMMC_SUCCESS;
  rmmc_status_t st = RMMC_SUCCESS;
  if (p->release_before_grow) {
    size_t peak = p->in_use + n > p->in_use_peak ? p->in_use + n : p->in_use_peak;
    double budget = (1.0 + p->release_slack) * (double)peak;
    if ((double)p->reserved + (double)add > budget)
      st = shrink(p, budget > (double)add ? (size_t)(budget - (double)add) : 0);
  } else if (p->gc_limit > 0 && p->reserved + add > p->gc_limit) {
    st = shrink(p, p->gc_limit > add ? p->gc_limit - add : 0);
  }
  if (st == RMMC_SUCCESS && p->reserved + add > p->max_size)
    st = shrink(p, p->max_size > add ? p->max_size - add : 0);
  if (st != RMMC_SUCCESS) return st;
  if (p->reserved + add > p->max_size)
    return pool_oom(p, n, stream, "the maximum size is reached");
  /* A gigabyte or more on a device: ask it first rather than map page by
   * page into certain failure (and back). */
  if (p->cuda && add >= ((size_t)1 << 30)) {
    size_t dfree = 0, dtotal = 0;
    if (rmmc_device_memory_info(p->base.base.device, &dfree, &dtotal) == RMMC_SUCCESS &&
        add > dfree && (st = shrink(p, 0)) == RMMC_SUCCESS &&
        rmmc_device_memory_info(p->base.base.device, &dfree, &dtotal) == RMMC_SUCCESS &&
        add > dfree) {
      char a1[32], a2[32], why[96];
      snprintf(why, sizeof why, "%s more to map, the device has %s free",
               rmmc__format_bytes(add, a1, sizeof a1), rmmc__format_bytes(dfree, a2, sizeof a2));
      return pool_oom(p, n, stream, why);
    }
    if (st != RMMC_SUCCESS) return st;
  }
  st = map_pages(p, c, a, n);
  if (st == RMMC_ERROR_OUT_OF_MEMORY) { /* last resort */
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    st = shrink(p, 0);
    if (st == RMMC_SUCCESS) st = map_pages(p, c, a, n);
    if (st == RMMC_ERROR_OUT_OF_MEMORY) rmmc__error_restore(&why);
  }
  if (st == RMMC_ERROR_OUT_OF_MEMORY) {
    char why[256];
    snprintf(why, sizeof why, "%s", rmmc_last_error_message());
    st = pool_oom(p, n, stream, why);
  }
  return st;
}

/* Reserves `bytes` of address space (a multiple of the page) as a new
 * chunk for `owner`. */
static rmmc_status_t add_reservation(pool_t *p, size_t bytes, pstream_t *owner, int state) {
  size_t words = (bytes / p->page + 63) / 64;
  uint64_t *bits = calloc(words, sizeof *bits);
  if (bits == NULL) return no_host_memory();
  void *ptr = NULL;
  rmmc_status_t st = rmmc_resource_vm_reserve(p->base.upstream, bytes, p->page, &ptr);
  if (st != RMMC_SUCCESS) {
    free(bits);
    return st;
  }
  add_chunk(p, (uintptr_t)ptr, bytes, owner, state);
  p->chunks->mapped = bits;
  return RMMC_SUCCESS;
}

/* Takes a new chunk of at least `need` bytes from the upstream for ps, as
 * the growth policy says (header comment). RMMC_ERROR_OUT_OF_MEMORY when the
 * maximum or the upstream refuses even the smallest growth. */
static rmmc_status_t grow(pool_t *p, pstream_t *ps, cudaStream_t stream, size_t need) {
  if (p->vm) { /* address space ran out: one more reservation */
    size_t want = rmmc__align_up(need, p->page);
    (void)ps, (void)stream;
    return add_reservation(p, want > p->address_space ? want : p->address_space, &p->neutral,
                           ST_COVERED);
  }
  size_t want = rmmc__align_up(need, p->granularity);
  size_t g = want < p->min_growth ? p->min_growth : want;
  rmmc_status_t st = RMMC_SUCCESS;
  if (p->release_before_grow) {
    /* The budget: (1 + release_slack) x the most ever in use, counting this
     * request; wholly free chunks go back only as far as it needs. */
    size_t peak = p->in_use + need > p->in_use_peak ? p->in_use + need : p->in_use_peak;
    double budget = (1.0 + p->release_slack) * (double)peak;
    if ((double)p->reserved + (double)g > budget)
      st = trim(p, ps, stream, budget > (double)g ? (size_t)(budget - (double)g) : 0);
  } else if (p->gc_limit > 0 && p->reserved + g > p->gc_limit)
    st = trim(p, ps, stream, p->gc_limit > g ? p->gc_limit - g : 0);
  if (st == RMMC_SUCCESS && p->reserved + want > p->max_size)
    st = trim(p, ps, stream, p->max_size > want ? p->max_size - want : 0);
  if (st != RMMC_SUCCESS) return st;
  size_t room = p->max_size - p->reserved;
  if (want > room)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: the maximum size is reached");
  if (g > room) g = room;
  void *ptr = NULL;
  for (;;) {
    st = rmmc_resource_allocate(p->base.upstream, g, GRANULE, stream, &ptr);
    if (st == RMMC_SUCCESS) break;
    if (st != RMMC_ERROR_OUT_OF_MEMORY || g == want) return st;
    size_t half = rmmc__align_up(g / 2, p->granularity);
    g = half > want && half < g ? half : want;
  }
  /* The upstream may be stream-ordered: the chunk is ready on `stream`, so
   * in device mode it is ps's, covered by an event recorded right now (it
   * stays fresh, which is safe, if that fails). */
  add_chunk(p, (uintptr_t)ptr, g, p->cuda ? ps : &p->neutral, p->cuda ? ST_FRESH : ST_COVERED);
  if (p->cuda) (void)cover(p, ps, stream);
  return RMMC_SUCCESS;
}

/* ---- allocate and deallocate ---- */

static size_t largest_free(const pool_t *p) {
  size_t best = 0;
  for (int cls = 0; cls < NCLASS; cls++) {
    size_t n = tlsf_largest(&p->neutral.idx[cls][ST_COVERED]);
    if (n > best) best = n;
    for (const pstream_t *q = p->stream_list; q != NULL; q = q->next)
      for (int st = ST_FRESH; st <= ST_COVERED; st++)
        if ((n = tlsf_largest(&q->idx[cls][st])) > best) best = n;
  }
  for (const pstream_t *q = p->stream_list; q != NULL; q = q->next)
    if (q->hot != NULL && q->hot->size > best) best = q->hot->size;
  return best;
}

/* The out-of-memory error with the pool's figures; `why` (may be NULL) is
 * what refused, e.g. the upstream's own message. */
static rmmc_status_t pool_oom(const pool_t *p, size_t bytes, cudaStream_t stream,
                              const char *why) {
  char re[32], iu[32], fr[32], lf[32], mx[32];
  return rmmc_set_oom_error(
      &p->base.base, bytes, stream,
      "pool reserved %s, in use %s, free %s, largest free block %s, maximum %s (%s)",
      rmmc__format_bytes(p->reserved, re, sizeof re), rmmc__format_bytes(p->in_use, iu, sizeof iu),
      rmmc__format_bytes(p->free_bytes, fr, sizeof fr),
      rmmc__format_bytes(largest_free(p), lf, sizeof lf),
      p->max_size == SIZE_MAX ? "none" : rmmc__format_bytes(p->max_size, mx, sizeof mx),
      why != NULL ? why : "no block fits and the pool cannot grow");
}

static inline bool need_room(const pool_t *p) {
  return p->nspare < SPARE_MIN || p->nspare_chunks < 2;
}

/* Tops up the spare structs so that carving, slabs and growth cannot fail
 * for host memory. */
static rmmc_status_t make_room(pool_t *p) {
  if (p->nspare < SPARE_MIN && !refill_spare(p)) goto no_memory;
  while (p->nspare_chunks < 2) {
    chunk_t *c = malloc(sizeof *c);
    if (c == NULL) goto no_memory;
    c->next = p->spare_chunks;
    p->spare_chunks = c;
    p->nspare_chunks++;
  }
  return RMMC_SUCCESS;
no_memory:
  return no_host_memory();
}

/* True if another stream than ps holds a fresh block that alone would
 * serve a request of class cls and `need` bytes: a device synchronization
 * (which makes it reusable) then surely pays. */
static bool others_fresh_fit(const pool_t *p, const pstream_t *ps, int cls, size_t need) {
  for (const pstream_t *q = p->stream_list; q != NULL; q = q->next) {
    if (q == ps) continue;
    const block_t *h = q->hot;
    if (h != NULL && h->chunk->cls == cls && h->size >= need) return true;
    if (tlsf_find(&q->idx[cls][ST_FRESH], need) != NULL) return true;
    if (cls == CLASS_SMALL && ((h != NULL && h->chunk->cls == CLASS_LARGE && h->size >= p->small_chunk) ||
                               tlsf_find(&q->idx[CLASS_LARGE][ST_FRESH], p->small_chunk) != NULL))
      return true;
  }
  return false;
}

/* Would growing for `need` bytes take the reserved bytes past the budget
 * of release_before_grow? Then other streams' free memory is worth a
 * synchronization: unmerged and held by streams that cannot share it
 * without one, it would otherwise pile up (a 4-stream transformer log
 * reserved 15x its peak live bytes) while trim() may only give back
 * chunks no other stream has pending work on. */
static bool growth_over_budget(const pool_t *p, size_t need) {
  if (!p->release_before_grow || p->vm) return false;
  size_t want = rmmc__align_up(need, p->granularity);
  size_t g = want < p->min_growth ? p->min_growth : want;
  size_t peak = p->in_use + need > p->in_use_peak ? p->in_use + need : p->in_use_peak;
  return (double)p->reserved + (double)g > (1.0 + p->release_slack) * (double)peak;
}

/* When no local block fits: escalate through the steps of the header
 * comment, cheapest first, until a block is found (unindexed in *out). */
static rmmc_status_t alloc_slow(pool_t *p, pstream_t *ps, cudaStream_t stream, int cls,
                                size_t need, size_t bytes, block_t **out) {
  block_t *b = NULL;
  if (need > MAX_REQUEST) return pool_oom(p, bytes, stream, "larger than any pool can hold");
  rmmc_status_t st = try_serve(p, ps, stream, cls, need, &b);
  /* ps's recent frees, once covered, merge with their neighbours. */
  if (st == RMMC_SUCCESS && b == NULL && fresh_count(ps) > 0 && cover(p, ps, stream))
    st = try_serve(p, ps, stream, cls, need, &b);
  if (st == RMMC_SUCCESS && b == NULL && reclaim_slabs(p) > 0)
    st = try_serve(p, ps, stream, cls, need, &b);
  /* Other streams' free memory, merged across streams, once the device is
   * idle. In host mode that costs nothing: always before growing. In device
   * mode it stalls the CPU, so (unless sync_before_grow) only when another
   * stream holds a block, not yet covered by its event, that alone serves
   * the request; merging otherwise waits for the out-of-memory path. */
  size_t others_free = p->free_bytes - stream_free_bytes(ps) - stream_free_bytes(&p->neutral);
  if (st == RMMC_SUCCESS && b == NULL &&
      (p->cuda && !p->sync_before_grow
           ? others_fresh_fit(p, ps, cls, need) ||
                 (others_free > 0 && growth_over_budget(p, cls == CLASS_SMALL ? p->small_chunk : need))
           : others_free > 0)) {
    st = settle(p);
    if (st == RMMC_SUCCESS) {
      reclaim_slabs(p);
      st = try_serve(p, ps, stream, cls, need, &b);
    }
  }
  if (st != RMMC_SUCCESS || b != NULL) goto done;
  size_t grow_need = cls == CLASS_SMALL ? p->small_chunk : need;
  st = grow(p, ps, stream, grow_need);
  if (st == RMMC_ERROR_OUT_OF_MEMORY) {
    /* Last resort: give back everything cached, then grow again. */
    char why[200];
    snprintf(why, sizeof why, "%s", rmmc_last_error_message());
    p->last_resort = true;
    st = settle(p);
    if (st == RMMC_SUCCESS) {
      reclaim_slabs(p);
      st = try_serve(p, ps, stream, cls, need, &b);
    }
    if (st == RMMC_SUCCESS && b == NULL) st = trim(p, ps, stream, 0);
    if (st == RMMC_SUCCESS && b == NULL) {
      st = grow(p, ps, stream, grow_need);
      if (st == RMMC_ERROR_OUT_OF_MEMORY) {
        p->last_resort = false;
        snprintf(why, sizeof why, "%s", rmmc_last_error_message());
        return pool_oom(p, bytes, stream, why);
      }
    }
  }
  if (st == RMMC_SUCCESS && b == NULL) st = try_serve(p, ps, stream, cls, need, &b);
  p->last_resort = false;
done:
  if (st == RMMC_SUCCESS && b == NULL) st = pool_oom(p, bytes, stream, NULL);
  *out = b;
  return st;
}

/* Allocation past the fast path: room for bookkeeping, the index search,
 * the slow path, carving. Kept out of line so that the fast path stays
 * small. */
static RMMC_NOINLINE rmmc_status_t alloc_general(pool_t *p, pstream_t *ps, cudaStream_t stream,
                                                 int cls, size_t n, size_t need, size_t alignment,
                                                 size_t bytes, block_t **out) {
  rmmc_status_t st;
  if (RMMC_UNLIKELY(need_room(p)) && (st = make_room(p)) != RMMC_SUCCESS) return st;
  /* The block goes into the pointer map (which may need host memory)
   * before anything else changes. */
  block_t *b = RMMC_LIKELY(need <= MAX_REQUEST) ? find_local(p, ps, cls, need) : NULL;
  if (RMMC_LIKELY(b != NULL)) {
    if (!rmmc__ptrmap_insert(&p->used, (void *)rmmc__align_up(b->addr, alignment), b, bytes))
      return no_host_memory();
    unlink_free(p, b);
  } else {
    if ((st = alloc_slow(p, ps, stream, cls, need, bytes, &b)) != RMMC_SUCCESS) return st;
    if (!rmmc__ptrmap_insert(&p->used, (void *)rmmc__align_up(b->addr, alignment), b, bytes)) {
      put_free(p, b);
      return no_host_memory();
    }
  }
  carve(p, b, n, alignment);
  if (p->vm && b->chunk->parent == NULL) { /* a large block: its pages */
    int state = b->state;
    b->state = ST_USED;
    if ((st = commit(p, b->chunk, b->addr, b->size, stream)) != RMMC_SUCCESS) {
      rmmc__ptrmap_remove(&p->used, rmmc__ptrmap_find(&p->used, (void *)b->addr));
      b->state = state;
      put_free(p, b);
      return st;
    }
  }
  *out = b;
  return RMMC_SUCCESS;
}

static rmmc_status_t pool_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  pool_t *p = (pool_t *)r;
  size_t n = rmmc__align_up(bytes, GRANULE);
  size_t need = n + (alignment - GRANULE); /* room for any padding */
  int cls = n <= p->small_max && need <= p->small_chunk ? CLASS_SMALL : CLASS_LARGE;
  uintptr_t key = stream_key(p, stream);
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  pstream_t *ps = p->last;
  if (RMMC_UNLIKELY(ps == NULL || ps->key != key) &&
      (st = find_stream(p, key, stream, &ps)) != RMMC_SUCCESS)
    goto unlock;
  /* Fast path: the stream's hot block has exactly the size asked for. */
  block_t *b = ps->hot;
  if (RMMC_LIKELY(b != NULL && b->size == need && alignment == GRANULE &&
                  b->chunk->cls == cls)) {
    if (RMMC_UNLIKELY(!rmmc__ptrmap_insert(&p->used, (void *)b->addr, b, bytes))) {
      st = no_host_memory();
      goto unlock;
    }
    ps->hot = NULL;
    p->free_bytes -= need;
  } else if ((st = alloc_general(p, ps, stream, cls, n, need, alignment, bytes, &b)) !=
             RMMC_SUCCESS) {
    goto unlock;
  }
  b->state = ST_USED;
  b->u.requested = bytes;
  p->in_use += b->size;
  if (p->in_use > p->in_use_peak) p->in_use_peak = p->in_use;
  *out = (void *)b->addr;
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

static rmmc_status_t pool_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)alignment;
  pool_t *p = (pool_t *)r;
  uintptr_t key = stream_key(p, stream);
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, ptr);
  if (RMMC_UNLIKELY(e == NULL)) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p was not allocated by this pool, or was freed already", ptr);
    goto unlock;
  }
  block_t *b = e->value;
  if (RMMC_UNLIKELY(b->u.requested != bytes)) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p was allocated with %zu bytes, not %zu; nothing was freed", ptr,
                        b->u.requested, bytes);
    goto unlock;
  }
  pstream_t *ps = p->last;
  if (RMMC_UNLIKELY(ps == NULL || ps->key != key) &&
      (st = find_stream(p, key, stream, &ps)) != RMMC_SUCCESS)
    goto unlock;
  rmmc__ptrmap_remove(&p->used, e); /* e is still valid: find_stream touches another map */
  p->in_use -= b->size;
  b->owner = ps;
  b->state = ST_FRESH;
  merge(p, b);
  put_hot(p, ps, b);
  if (fresh_count(ps) >= p->event_interval || fresh_bytes(ps) >= p->event_bytes)
    (void)cover(p, ps, stream);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

/* ---- release, figures, checks ---- */

static rmmc_status_t pool_release_cached(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  rmmc__lock(&p->lock);
  rmmc_status_t st = settle(p);
  if (st == RMMC_SUCCESS) {
    reclaim_slabs(p);
    st = p->vm ? unmap_free(p, 0) : trim(p, NULL, NULL, 0);
  }
  rmmc__unlock(&p->lock);
  return st == RMMC_SUCCESS ? rmmc_resource_release_cached(p->base.upstream) : st;
}

typedef struct stream_figures {
  cudaStream_t stream;
  size_t free, fresh;
} stream_figures_t;

static void pool_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  pool_t *p = (pool_t *)r;
  rmmc__lock(&p->lock);
  size_t largest = largest_free(p), unowned = stream_free_bytes(&p->neutral), k = 0;
  /* Expandable: free blocks span address space; free memory is what is mapped and unused. */
  size_t free_b = !p->vm ? p->free_bytes : p->reserved > p->in_use ? p->reserved - p->in_use : 0;
  const size_t bytes[] = {p->reserved,     p->in_use,  free_b, p->in_use_peak,
                          p->reserved_peak, largest,   unowned};
  size_t span = p->span, page = p->page;
  uint64_t maps = p->page_maps, unmaps = p->page_unmaps;
  bool vm = p->vm;
  const uint64_t counts[] = {p->nchunks,       p->nslabs,      p->chunk_allocs,
                             p->chunk_releases, p->event_records, p->event_waits,
                             p->device_syncs};
  size_t max_size = p->max_size;
  stream_figures_t *sf = p->streams.count ? malloc(p->streams.count * sizeof *sf) : NULL;
  for (const pstream_t *q = p->stream_list; sf != NULL && q != NULL; q = q->next)
    if (stream_free_bytes(q) > 0)
      sf[k++] = (stream_figures_t){q->stream, stream_free_bytes(q), fresh_bytes(q)};
  rmmc__unlock(&p->lock);
  static const char *const byte_keys[] = {"reserved", "in_use",       "free",        "peak",
                                          "reserved_peak", "largest_free", "free_unowned"};
  static const char *const count_keys[] = {"chunks",        "slabs",       "chunk_allocations",
                                           "chunk_releases", "event_records", "event_waits",
                                           "device_syncs"};
  for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++)
    rmmc__emit_bytes(emit, ctx, byte_keys[i], bytes[i]);
  if (max_size != SIZE_MAX) rmmc__emit_bytes(emit, ctx, "limit", max_size);
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    rmmc__emit_count(emit, ctx, count_keys[i], counts[i]);
  if (vm) {
    rmmc__emit_bytes(emit, ctx, "address_space", span);
    rmmc__emit_bytes(emit, ctx, "page_size", page);
    rmmc__emit_count(emit, ctx, "page_maps", maps);
    rmmc__emit_count(emit, ctx, "page_unmaps", unmaps);
  }
  for (size_t i = 0; i < k; i++) {
    char name[32], text[128];
    snprintf(text, sizeof text, "stream=%s free=%zu fresh=%zu",
             rmmc__stream_name(sf[i].stream, name, sizeof name), sf[i].free, sf[i].fresh);
    rmmc__emit_text(emit, ctx, "free_on_stream", text);
  }
  free(sf);
}

typedef struct tally {
  size_t used_bytes, free_bytes, used_blocks, free_blocks, slabs;
} tally_t;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      snprintf(msg, len, __VA_ARGS__);                                         \
      return false;                                                            \
    }                                                                          \
  } while (0)

static bool valid_owner(const pool_t *p, const pstream_t *o) {
  return o == &p->neutral || (o != NULL && lookup_stream(p, o->key) == o);
}

/* Walks one chunk's blocks (and its slabs' blocks). */
static bool check_chunk(const pool_t *p, const chunk_t *c, tally_t *t, char *msg, size_t len) {
  uintptr_t expect = c->base;
  const block_t *prev = NULL;
  for (const block_t *b = c->first; b != NULL; prev = b, b = b->phys_next) {
    CHECK(b->chunk == c, "block %#zx: wrong chunk", (size_t)b->addr);
    CHECK(b->phys_prev == prev, "block %#zx: broken physical list", (size_t)b->addr);
    CHECK(b->addr == expect, "chunk %#zx: gap or overlap at %#zx (block starts at %#zx)",
          (size_t)c->base, (size_t)expect, (size_t)b->addr);
    CHECK(b->size > 0 && b->size % GRANULE == 0 && b->addr % GRANULE == 0,
          "block %#zx: size %zu or address not a multiple of 256", (size_t)b->addr, b->size);
    CHECK(b->size <= c->base + c->size - b->addr, "block %#zx runs past its chunk",
          (size_t)b->addr);
    if (is_free(b)) {
      CHECK(valid_owner(p, b->owner), "free block %#zx: unknown owner", (size_t)b->addr);
      CHECK(b->owner != &p->neutral || b->state == ST_COVERED,
            "free block %#zx: neutral but fresh", (size_t)b->addr);
      CHECK(b->idx != NULL ? b->idx == index_of(b) : b->owner->hot == b && b->state == ST_FRESH,
            "free block %#zx: not in the index its owner, class and state name",
            (size_t)b->addr);
      CHECK(prev == NULL || !is_free(prev) || !mergeable(p, prev, b),
            "free blocks %#zx and %#zx are adjacent and mergeable but not merged",
            (size_t)prev->addr, (size_t)b->addr);
      t->free_bytes += b->size;
      t->free_blocks++;
    } else if (p->vm && c->parent == NULL && unmapped_bytes(p, c, b->addr, b->size) != 0) {
      CHECK(false, "%s block %#zx has unmapped pages", b->state == ST_SLAB ? "slab" : "used",
            (size_t)b->addr);
    } else if (b->state == ST_USED) {
      const rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, (void *)b->addr);
      CHECK(e != NULL && e->value == b && e->size == b->u.requested,
            "used block %#zx is not in the pointer map as it should be", (size_t)b->addr);
      CHECK(b->u.requested > 0 && b->u.requested <= b->size,
            "used block %#zx: %zu bytes requested in a %zu-byte block", (size_t)b->addr,
            b->u.requested, b->size);
      t->used_bytes += b->size;
      t->used_blocks++;
    } else if (b->state == ST_SLAB) {
      const chunk_t *s = b->u.slab;
      CHECK(c->cls == CLASS_LARGE && s != NULL && s->parent == b && s->base == b->addr &&
                s->size == b->size && s->cls == CLASS_SMALL,
            "slab block %#zx does not match its slab", (size_t)b->addr);
      t->slabs++;
      if (!check_chunk(p, s, t, msg, len)) return false;
    } else {
      CHECK(false, "block %#zx: bad state %d", (size_t)b->addr, b->state);
    }
    expect = b->addr + b->size;
  }
  CHECK(expect == c->base + c->size, "chunk %#zx: blocks end at %#zx, chunk at %#zx",
        (size_t)c->base, (size_t)expect, (size_t)(c->base + c->size));
  return true;
}

/* Walks one index: every listed block is free, belongs here, sits in the
 * bin its size maps to; bitmaps match the lists; counts and bytes match. */
static bool check_index(const pool_t *p, const tlsf_t *x, const pstream_t *owner, int cls,
                        int state, size_t *blocks, char *msg, size_t len) {
  size_t count = 0, bytes = 0;
  for (unsigned fl = 0; fl < FL_COUNT; fl++) {
    CHECK(((x->fl_map >> fl) & 1) == (x->sl_map[fl] != 0), "index: level bitmap wrong at %u", fl);
    for (unsigned sl = 0; sl < SL_COUNT; sl++) {
      const block_t *h = x->heads[fl][sl];
      CHECK(((x->sl_map[fl] >> sl) & 1) == (h != NULL), "index: bin bitmap wrong at %u/%u", fl, sl);
      const block_t *prev = NULL;
      for (const block_t *b = h; b != NULL; prev = b, b = b->free_next) {
        CHECK(count < x->count, "index: more blocks listed than counted");
        unsigned bf, bs;
        bin_of(b->size, &bf, &bs);
        CHECK(b->free_prev == prev, "index: broken list at %#zx", (size_t)b->addr);
        CHECK(is_free(b) && b->owner == owner && b->state == state && b->chunk->cls == cls &&
                  b->idx == x,
              "index: block %#zx is listed in the wrong index", (size_t)b->addr);
        CHECK(bf == fl && bs == sl, "index: block %#zx of %zu bytes in the wrong bin",
              (size_t)b->addr, b->size);
        count++;
        bytes += b->size;
      }
    }
  }
  (void)p;
  CHECK(count == x->count && bytes == x->bytes, "index: %zu blocks/%zu bytes listed, %zu/%zu counted",
        count, bytes, x->count, x->bytes);
  *blocks += count;
  return true;
}

static int cmp_chunk(const void *a, const void *b) {
  const chunk_t *x = *(const chunk_t *const *)a, *y = *(const chunk_t *const *)b;
  return x->base < y->base ? -1 : x->base > y->base;
}

static bool check_locked(const pool_t *p, char *msg, size_t len) {
  tally_t t = {0};
  size_t reserved = 0, nchunks = 0, nslabs = 0, indexed = 0, nstreams = 0, mapped = 0;
  for (const chunk_t *c = p->chunks; c != NULL; c = c->next) {
    CHECK(c->parent == NULL && c->cls == CLASS_LARGE, "chunk %#zx: not an upstream chunk",
          (size_t)c->base);
    CHECK(c->next == NULL || c->next->prev == c, "chunk list broken");
    CHECK(c->first != NULL && c->first->phys_prev == NULL, "chunk %#zx: bad first block",
          (size_t)c->base);
    if (!check_chunk(p, c, &t, msg, len)) return false;
    if (p->vm) {
      CHECK(c->mapped != NULL && c->size % p->page == 0 && c->base % p->page == 0,
            "reservation %#zx: no page map or not whole pages", (size_t)c->base);
      for (size_t i = 0; i < c->size / p->page; i++) mapped += page_is_mapped(c, i) * p->page;
    }
    reserved += c->size;
    nchunks++;
  }
  for (const chunk_t *c = p->slabs; c != NULL; c = c->next) {
    CHECK(c->parent != NULL && c->parent->state == ST_SLAB && c->parent->u.slab == c,
          "slab %#zx: not held by a slab block", (size_t)c->base);
    nslabs++;
  }
  CHECK(nchunks == p->nchunks, "%zu chunks listed, %zu counted", nchunks, p->nchunks);
  CHECK(nslabs == p->nslabs && t.slabs == nslabs, "%zu slabs listed, %zu found, %zu counted",
        nslabs, t.slabs, p->nslabs);
  /* No two upstream chunks overlap. */
  if (nchunks > 1) {
    const chunk_t **v = malloc(nchunks * sizeof *v);
    CHECK(v != NULL, "no host memory to check the pool");
    size_t i = 0;
    for (const chunk_t *c = p->chunks; c != NULL; c = c->next) v[i++] = c;
    qsort(v, nchunks, sizeof *v, cmp_chunk);
    bool ok = true;
    for (i = 1; i < nchunks && ok; i++) ok = v[i - 1]->base + v[i - 1]->size <= v[i]->base;
    size_t at = ok ? 0 : (size_t)v[i - 1]->base;
    free(v);
    CHECK(ok, "chunks overlap at %#zx", at);
  }
  for (int cls = 0; cls < NCLASS; cls++) {
    CHECK(p->neutral.idx[cls][ST_FRESH].count == 0, "neutral blocks listed as fresh");
    if (!check_index(p, &p->neutral.idx[cls][ST_COVERED], &p->neutral, cls, ST_COVERED,
                     &indexed, msg, len))
      return false;
  }
  for (const pstream_t *q = p->stream_list; q != NULL; q = q->next, nstreams++) {
    CHECK(lookup_stream(p, q->key) == q, "stream state not in the stream map");
    if (q->hot != NULL) {
      CHECK(q->hot->owner == q && q->hot->idx == NULL && q->hot->state == ST_FRESH,
            "hot block %#zx is not its stream's fresh block", (size_t)q->hot->addr);
      indexed++;
    }
    for (int cls = 0; cls < NCLASS; cls++)
      for (int st = ST_FRESH; st <= ST_COVERED; st++)
        if (!check_index(p, &q->idx[cls][st], q, cls, st, &indexed, msg, len)) return false;
  }
  CHECK(nstreams == p->streams.count, "%zu streams listed, %zu mapped", nstreams, p->streams.count);
  CHECK(indexed == t.free_blocks, "%zu free blocks in chunks, %zu in indices", t.free_blocks,
        indexed);
  CHECK(t.used_blocks == p->used.count, "%zu used blocks in chunks, %zu in the map",
        t.used_blocks, p->used.count);
  if (p->vm) {
    CHECK(reserved == p->span, "address space %zu, reservations sum to %zu", p->span, reserved);
    CHECK(mapped == p->reserved, "reserved %zu, mapped pages sum to %zu", p->reserved, mapped);
    reserved = p->span; /* what free + in use tile */
  } else {
    CHECK(reserved == p->reserved, "reserved %zu, chunks sum to %zu", p->reserved, reserved);
  }
  CHECK(t.used_bytes == p->in_use, "in use %zu, used blocks sum to %zu", p->in_use, t.used_bytes);
  CHECK(t.free_bytes == p->free_bytes, "free %zu, free blocks sum to %zu", p->free_bytes,
        t.free_bytes);
  CHECK(p->free_bytes + p->in_use == reserved, "free %zu + in use %zu != %zu", p->free_bytes,
        p->in_use, reserved);
  CHECK(p->reserved <= p->max_size, "reserved %zu above the maximum %zu", p->reserved,
        p->max_size);
  CHECK(p->reserved_peak >= p->reserved && p->in_use_peak >= p->in_use, "peaks below current");
  return true;
}

#undef CHECK

RMMC_API rmmc_status_t rmmc_pool_resource_check(rmmc_resource_t *pool) {
  if (pool == NULL || pool->ops != &pool_ops)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_resource_check: %s is not a pool",
                          pool == NULL ? "NULL" : pool->ops->name);
  pool_t *p = (pool_t *)pool;
  char msg[256];
  rmmc__lock(&p->lock);
  bool ok = check_locked(p, msg, sizeof msg);
  rmmc__unlock(&p->lock);
  return ok ? RMMC_SUCCESS : rmmc_set_error(RMMC_ERROR_INTERNAL, "pool invariant broken: %s", msg);
}

/* ---- lifetime ---- */

static void pool_destroy(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  int saved = -1;
  bool device = p->cuda && rmmc__device_push(r->device, &saved) == RMMC_SUCCESS;
  if (device && cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  for (chunk_t *c = p->chunks, *next; c != NULL; c = next) {
    next = c->next;
    if (c->mapped != NULL) { /* a reservation */
      for (size_t i = 0; i < c->size / p->page; i++)
        if (page_is_mapped(c, i))
          (void)rmmc_resource_vm_unmap(p->base.upstream, (void *)(c->base + i * p->page), p->page);
      (void)rmmc_resource_vm_unreserve(p->base.upstream, (void *)c->base, c->size);
      free(c->mapped);
    } else {
      (void)rmmc_resource_deallocate(p->base.upstream, (void *)c->base, c->size, GRANULE, NULL);
    }
    free(c);
  }
  for (chunk_t *c = p->slabs, *next; c != NULL; c = next) {
    next = c->next;
    free(c);
  }
  for (chunk_t *c = p->spare_chunks, *next; c != NULL; c = next) {
    next = c->next;
    free(c);
  }
  for (pstream_t *q = p->stream_list, *next; q != NULL; q = next) {
    next = q->next;
    if (device && q->event != NULL) (void)cudaEventDestroy(q->event);
    free(q);
  }
  if (device) rmmc__device_pop(saved);
  for (meta_batch_t *m = p->batches, *next; m != NULL; m = next) {
    next = m->next;
    free(m);
  }
  rmmc__ptrmap_fini(&p->used);
  rmmc__ptrmap_fini(&p->streams);
  rmmc__adaptor_fini(&p->base);
  free(p);
}

static const rmmc_resource_ops_t pool_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "pool",
    .allocate = pool_allocate,
    .deallocate = pool_deallocate,
    .release_cached = pool_release_cached,
    .describe = pool_describe,
    .destroy = pool_destroy,
    .upstream = rmmc__adaptor_upstream,
};

/* Expandable mode: the page size and the reservation size. */
static rmmc_status_t apply_vm_options(pool_t *p, const rmmc_pool_options_t *o) {
  rmmc_resource_t *up = p->base.upstream;
  size_t up_page = rmmc_resource_vm_page_size(up);
  if (up_page == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_resource_create: expandable needs an upstream with virtual "
                          "memory (cuda, host, sim); %s has none",
                          rmmc_resource_name(up));
  size_t page = o->page_size != 0 ? o->page_size : up_page > DEFAULT_PAGE ? up_page : DEFAULT_PAGE;
  if (!rmmc__is_pow2(page) || page % up_page != 0 || page > ((size_t)1 << 30))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: page_size %zu must be a power of two up to 1 GiB "
                          "and a multiple of %s's page (%zu)",
                          page, rmmc_resource_name(up), up_page);
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
    space = total > 0 && total <= MAX_REQUEST / 2 ? 2 * total : (size_t)64 << 30;
  }
  if (space > MAX_REQUEST)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: address_space %zu is above 256 TiB", space);
  p->vm = true;
  p->page = page;
  p->address_space = rmmc__align_up(space, page);
  p->split_limit = 0.0; /* free space merges across the whole reservation */
  return RMMC_SUCCESS;
}

/* Checks the options and resolves them into p. */
static rmmc_status_t apply_options(pool_t *p, const rmmc_pool_options_t *o) {
  const char *bad = NULL;
  if (o->growth_granularity < GRANULE || o->growth_granularity > ((size_t)1 << 30) ||
      !rmmc__is_pow2(o->growth_granularity))
    bad = "growth_granularity must be a power of two from 256 B to 1 GiB";
  else if (o->small_max > 0 && (o->small_chunk % GRANULE != 0 || o->small_chunk > ((size_t)1 << 30) ||
                                rmmc__align_up(o->small_max, GRANULE) > o->small_chunk))
    bad = "small_chunk must be a multiple of 256 up to 1 GiB and at least small_max";
  else if (!(o->gc_threshold >= 0.0 && o->gc_threshold <= 1.0))
    bad = "gc_threshold must be a fraction from 0 to 1";
  else if (!(o->release_slack >= 0.0 && o->release_slack <= 1e6))
    bad = "release_slack must be a fraction of at least 0";
  else if (!(o->split_limit == 0.0 || (o->split_limit >= 1.0 && o->split_limit <= 1e6)))
    bad = "split_limit must be 0 (off) or at least 1";
  else if (o->event_interval < 1)
    bad = "event_interval must be at least 1";
  else if (o->min_growth > MAX_REQUEST || o->initial_size > MAX_REQUEST)
    bad = "initial_size and min_growth must be at most 256 TiB";
  if (bad != NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_resource_create: %s", bad);
  p->max_size = o->maximum_size == 0 || o->maximum_size == SIZE_MAX
                    ? SIZE_MAX
                    : o->maximum_size & ~(GRANULE - 1);
  if (o->initial_size > p->max_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: initial_size %zu is above maximum_size %zu",
                          o->initial_size, p->max_size);
  p->granularity = o->growth_granularity;
  p->min_growth = rmmc__align_up(o->min_growth, p->granularity);
  p->small_max = o->small_max > 0 ? rmmc__align_up(o->small_max, GRANULE) : 0;
  p->small_chunk = o->small_chunk;
  p->release_before_grow = o->release_before_grow;
  p->release_slack = o->release_slack;
  p->split_limit = o->split_limit;
  p->sync_before_grow = o->sync_before_grow;
  p->event_interval = o->event_interval;
  p->event_bytes = o->event_bytes;
  p->gc_limit = SIZE_MAX;
  if (o->expandable) {
    rmmc_status_t st = apply_vm_options(p, o);
    if (st != RMMC_SUCCESS) return st;
  }
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

/* Reserves the initial chunk, ready for every stream. Expandable: the
 * first reservation, with `bytes` mapped at its start. */
static rmmc_status_t reserve_initial(pool_t *p, size_t bytes) {
  if (p->vm) {
    rmmc_status_t st = make_room(p);
    size_t space = rmmc__align_up(bytes, p->page);
    if (st == RMMC_SUCCESS)
      st = add_reservation(p, space > p->address_space ? space : p->address_space, &p->neutral,
                           ST_COVERED);
    if (st == RMMC_SUCCESS && bytes > 0) st = map_pages(p, p->chunks, p->chunks->base, bytes);
    return st;
  }
  bytes = rmmc__align_up(bytes, GRANULE);
  void *ptr = NULL;
  rmmc_status_t st = make_room(p);
  if (st == RMMC_SUCCESS) st = rmmc_resource_allocate(p->base.upstream, bytes, GRANULE, NULL, &ptr);
  if (st != RMMC_SUCCESS) return st;
  if (p->cuda) {
    int saved;
    st = rmmc__device_push(p->base.base.device, &saved);
    if (st == RMMC_SUCCESS) {
      cudaError_t err = cudaStreamSynchronize(NULL);
      rmmc__device_pop(saved);
      if (err != cudaSuccess) st = cuda_failed(err, "pool: cudaStreamSynchronize");
    }
    if (st != RMMC_SUCCESS) {
      (void)rmmc_resource_deallocate(p->base.upstream, ptr, bytes, GRANULE, NULL);
      return st;
    }
  }
  add_chunk(p, (uintptr_t)ptr, bytes, &p->neutral, ST_COVERED);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_pool_resource_create(rmmc_resource_t *upstream,
                                                 const rmmc_pool_options_t *options,
                                                 rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("pool_resource_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  st = rmmc__copy_options("pool_resource_create", &o, sizeof o, options);
  if (st != RMMC_SUCCESS) return st;
  pool_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool_resource_create: no host memory");
  rmmc__adaptor_init(&p->base, &pool_ops, upstream);
  p->cuda = upstream->kind != RMMC_MEMORY_HOST;
  rmmc__ptrmap_init(&p->used);
  rmmc__ptrmap_init(&p->streams);
  st = apply_options(p, &o);
  if (st == RMMC_SUCCESS && (o.initial_size > 0 || p->vm)) st = reserve_initial(p, o.initial_size);
  if (st != RMMC_SUCCESS) goto destroy;
  *out = &p->base.base;
  return RMMC_SUCCESS;
destroy:
  pool_destroy(&p->base.base);
  return st;
}

/* ---- stack spec ---- */

static const rmmc__spec_option_t pool_spec_options[] = {
    {"initial", RMMC__OPT_BYTES_PCT, "bytes reserved at creation (default 0)"},
    {"max", RMMC__OPT_BYTES_PCT, "most bytes reserved from the upstream (default: no limit)"},
    {"min_growth", RMMC__OPT_BYTES, "fewest bytes one growth takes (default 32MiB)"},
    {"granularity", RMMC__OPT_BYTES, "growth rounded up to this power of two (default 2MiB)"},
    {"small_max", RMMC__OPT_BYTES, "requests up to this size come from slabs (default 1MiB; 0: off)"},
    {"small_chunk", RMMC__OPT_BYTES, "bytes of one slab (default 4MiB)"},
    {"gc_threshold", RMMC__OPT_DOUBLE, "fraction of max/device memory above which growth trims first (default 0: off)"},
    {"release_before_grow", RMMC__OPT_BOOL, "give back wholly free chunks before growing (default true)"},
    {"release_slack", RMMC__OPT_DOUBLE, "release_before_grow keeps reserved within (1 + this) x peak in use (default 0.05)"},
    {"split_limit", RMMC__OPT_DOUBLE, "grow rather than split a free chunk this many times the growth (default 8; 0: off)"},
    {"event_interval", RMMC__OPT_INT, "frees per stream between event records (default 64)"},
    {"event_bytes", RMMC__OPT_BYTES, "freed bytes per stream between event records (default 1GiB)"},
    {"sync_before_grow", RMMC__OPT_BOOL, "synchronize the device so all streams' free blocks merge before growing (default false)"},
    {"expandable", RMMC__OPT_BOOL, "grow in place: reserve address space, map pages as needed, unmap free pages (default false)"},
    {"page", RMMC__OPT_BYTES, "expandable: bytes mapped at a time (default 32MiB)"},
    {"address_space", RMMC__OPT_BYTES, "expandable: bytes of one reservation (default max, else 2x memory)"},
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
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "event_bytes", upstream, &o.event_bytes);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "page", upstream, &o.page_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "address_space", upstream, &o.address_space);
  if (st != RMMC_SUCCESS) return st;
  rmmc__spec_double(args, "gc_threshold", &o.gc_threshold);
  rmmc__spec_bool(args, "release_before_grow", &o.release_before_grow);
  rmmc__spec_double(args, "release_slack", &o.release_slack);
  rmmc__spec_double(args, "split_limit", &o.split_limit);
  rmmc__spec_bool(args, "sync_before_grow", &o.sync_before_grow);
  rmmc__spec_bool(args, "expandable", &o.expandable);
  long long interval;
  if (rmmc__spec_int(args, "event_interval", &interval)) {
    if (interval < 1 || interval > (long long)UINT_MAX)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "pool: event_interval=%lld is out of range (1 to %u)", interval,
                            UINT_MAX);
    o.event_interval = (unsigned)interval;
  }
  return rmmc_pool_resource_create(upstream, &o, out);
}

const rmmc__spec_entry_t rmmc__pool_spec = {
    .name = "pool",
    .help = "coalescing stream-ordered sub-allocator (best fit, O(1), gives chunks back)",
    .needs_upstream = true,
    .options = pool_spec_options,
    .build = pool_build,
};
