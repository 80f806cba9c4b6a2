/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's parts (internal): the types the stream-ordering core shares
 * with its growth backends, chunks (chunks.c) and virtual memory (vm.c),
 * and the core operations the backends call. include/rmmc/pool_resource.h
 * has the contract and the policies; docs/design.md ("A request through
 * the pool", "The pool") the two levels, stream heaps over a shared heap.
 *
 * Blocks tile each region (a chunk, or a reservation backed page by page)
 * in address order (prev/next); a block is free, used, a span (lent to a
 * stream heap, which carves small blocks from it) or, in a reservation,
 * unmapped. Lock order: a stream heap's lock, then the shared one; the
 * shared lock never waits for a heap lock (it only try-locks them, to
 * reclaim spans). A free block of the shared heap carries an owner (the
 * stream it was freed on; NULL: "clean") and a tag, the owner's epoch its
 * reuse by others waits for (stream_events.h, "Epochs"). Pages and chunks
 * go back to the driver only when no work is pending on them.
 */
#ifndef RMMC_POOL_INTERNAL_H
#define RMMC_POOL_INTERNAL_H

#include "base/internal.h"
#include "base/lock.h"
#include "base/ptrmap.h"
#include "base/stream_events.h"
#include "base/tlsf.h"
#include "rmmc/pool_resource.h"

#define POOL_GRANULE ((size_t)256)
#define POOL_MAX_REQUEST ((size_t)1 << 47) /* larger requests cannot be met */

typedef struct pool_block pool_block_t;
typedef struct pool_region pool_region_t;
typedef struct pool_owner pool_owner_t;
typedef struct pool_sheap pool_sheap_t;
typedef struct pool pool_t;

enum { B_FREE = 0, B_USED, B_SPAN, B_UNMAPPED, B_FOREIGN };
enum { W_OUT = 0, W_INDEX, W_HOT }; /* where a free block is */

struct pool_block {
  rmmc__tlsf_node_t node; /* node.size: the block's bytes */
  uintptr_t addr;
  pool_block_t *prev, *next;   /* physical neighbours in the region */
  pool_block_t *qprev, *qnext; /* owner's queue (shared free), foreign or hole list */
  pool_region_t *region;
  pool_owner_t *owner; /* free or foreign: the stream whose work it waits for */
  uint64_t tag;        /* ... up to this epoch of it */
  size_t requested;    /* used: bytes asked for */
  uint64_t freed;      /* shared free blocks: the pool's clock when last freed into */
  uint8_t state;
  uint8_t where;
};

enum { SEG_ON = 0, SEG_OFF, SEG_WOKEN };
enum { POOL_SLEEP_ALL = 0, POOL_SLEEP_FREE, POOL_SLEEP_LIVE }; /* pool_backend_t.sleep */

/* A mapped range of a reservation: one upstream vm_map call. */
typedef struct pool_seg {
  uintptr_t addr;
  size_t size;
  uint8_t off;  /* SEG_ON, or paused (sleep.c): SEG_OFF (unmapped) or SEG_WOKEN (mapped
                 * by a wake still in progress) */
  uint8_t live; /* a discard pause's mark: a live block lies on it (sleep.c) */
} pool_seg_t;

struct pool_region {
  uintptr_t base;
  size_t size;
  pool_block_t *first;
  pool_region_t *prev, *next; /* the pool's regions, or a heap's spans */
  /* spans */
  pool_block_t *parent; /* the shared-heap block holding it; NULL: a region */
  pool_sheap_t *heap;
  uint64_t tag;  /* the newest tag of a free made into it */
  size_t nused;  /* blocks handed out of it */
  /* reservations (vm) */
  pool_seg_t *segs; /* sorted by address */
  size_t nsegs, capsegs;
};

/* A stream, or a graph pool (slot NULL), as an owner of free blocks in the
 * shared heap. A graph pool's blocks never merge with other memory and go
 * back to the shared heap only when the pool is released. */
struct pool_owner {
  rmmc__stream_slot_t *slot;     /* NULL: a graph pool */
  pool_sheap_t *heap;            /* its heaps, one per stripe in use (atomic head) */
  rmmc__tlsf_t *idx; /* its shared free blocks: 10 KiB, so only while listed (owner_ready) */
  pool_block_t *qhead;           /* the same, listed */
  uint64_t seen_done;            /* its finished epoch at the last consolidation */
  size_t uncovered_bytes;        /* freed in the shared heap since its last record */
  unsigned uncovered;
  pool_owner_t *next;
  /* graph pools */
  uint64_t gid[2];               /* the caller's id (PyTorch: a MempoolId_t) */
  int begun;                     /* routing: begins - ends */
  bool released;
  const void *route_key;         /* routed by stream (key), or by capture */
  unsigned long long capture;    /* the CUDA capture id bound, 0: none */
  uint64_t pending_thread;       /* the thread whose next capture binds */
  size_t used_bytes;             /* its blocks handed out */
  /* streams: listed in p->owners (next, prev; shared lock) while it has a
   * heap or shared free blocks. It joins when it gets a heap (heap_new) and
   * leaves when it has neither (heap_retire, consolidate); a shared-heap
   * call that finds it without a heap gives it one first (owner_rejoin), so
   * no call works on an owner without an index. */
  pool_owner_t *prev;
  bool listed;
  /* streams: in p->pending from its first shared free block until a
   * consolidation finds none left (shared lock) */
  pool_owner_t *pnext, *pprev;
  bool pending;
};

static inline bool pool_owner_done(const pool_owner_t *o, uint64_t tag) {
  return o->slot != NULL && rmmc__stream_slot_known_done(o->slot, tag);
}

/* Block structs come from batches, kept on free lists per lock. */
typedef struct pool_meta {
  pool_block_t *spare;
  size_t nspare;
  struct pool_batch *batches;
} pool_meta_t;

struct pool_sheap {
  rmmc__lock_t lock;
  pool_t *pool;
  /* Its stream's owner; NULL once retired (written under both the heap's
   * and the shared lock): a thread whose cache still names a retired or
   * reused heap sees another owner once it holds the lock, and looks again. */
  pool_owner_t *owner;
  pool_sheap_t *onext; /* the next heap of the same stream (owner->heap), or spare */
  pool_sheap_t *hprev, *hnext; /* the pool's live heaps, latest span taker first (shared lock) */
  pool_sheap_t *snext;         /* a pass's list of the live heaps (p->snap_lock) */
  unsigned stripe;     /* which of the stream's heaps: threads map to stripes */
  pool_block_t *hot; /* its last free, kept out of idx for an exact-size reuse */
  rmmc__tlsf_t idx;
  rmmc__ptrmap_t used;
  pool_region_t *spans;
  size_t nspans, nidle; /* spans held; of which wholly free */
  pool_block_t *foreign; /* blocks of its spans freed on other streams */
  size_t nforeign;
  pool_meta_t meta;
  size_t in_use, peak; /* bytes of its blocks handed out (read relaxed) */
  uint64_t empties; /* device memory: frees that left it holding nothing */
} __attribute__((aligned(64)));

/* How a growth (the backend's grow) may go, flags. */
enum {
  POOL_GROW_ANY = 0,          /* as far as the maximum, after the trim the budget asks for */
  POOL_GROW_WITHIN = 1u << 0, /* not past the budget (rmmc__pool_admit): out of memory instead */
  POOL_GROW_EXACT = 1u << 1,  /* the request alone, not rounded up to min_growth (initial size) */
};

typedef struct pool_backend {
  const char *name;
  /* Under the shared lock: adds free memory owner o's stream may use at
   * once, as one free block (o's or clean, merged, not indexed) of at least
   * `need` bytes in *out, to be carved at `align`; rounded up to min_growth
   * (where the backend has room) unless POOL_GROW_EXACT. OUT_OF_MEMORY when
   * the upstream or the maximum refuses, or with POOL_GROW_WITHIN when the
   * budget would (rmmc__pool_admit; else the backend runs the trim the
   * budget asks for). o NULL: the initial growth (a clean block). */
  rmmc_status_t (*grow)(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t need,
                        size_t align, unsigned how, pool_block_t **out);
  /* Under the shared lock: gives back free memory no stream has pending
   * work on (asking CUDA at most once per stream) until reserved <= goal. */
  rmmc_status_t (*trim)(pool_t *p, size_t goal);
  /* Everything back to the upstream (destroy; the device is idle). */
  void (*fini)(pool_t *p);
  void (*describe)(pool_t *p, rmmc_field_cb emit, void *ctx);
  /* Backend invariants (pool_resource_check), under every lock. */
  bool (*check)(pool_t *p, char *msg, size_t len);
  /* Under the shared lock: makes the memory the backend mapped itself
   * reachable from device d (rmmc_resource_enable_peer_access), all or
   * nothing. NULL: the backend maps nothing itself (chunks are the
   * upstream's memory, which the upstream made reachable). */
  rmmc_status_t (*grant)(pool_t *p, int d);
  /* Sleep mode (sleep.c), under every lock, no work pending on the
   * pool's memory. sleep unmaps every mapping still mapped of `which`
   * (POOL_SLEEP_ALL, or those whose live mark is clear or set: _FREE,
   * _LIVE), on_release before each, marking it off and adding its bytes to
   * *gone; one the upstream refuses stays on, the others still go (_LIVE:
   * unless none had gone yet), and the first refusal's status is returned.
   * wake maps every mapping that is off again at its address (peers
   * granted, on_acquire after each), all or nothing: on a refusal it unmaps
   * what it mapped (one whose unmap is refused too stays mapped, not off).
   * NULL: the backend cannot (chunks). */
  rmmc_status_t (*sleep)(pool_t *p, int which, size_t *gone);
  rmmc_status_t (*wake)(pool_t *p);
} pool_backend_t;

extern const pool_backend_t rmmc__pool_chunks;
extern const pool_backend_t rmmc__pool_vm;

struct pool {
  rmmc__adaptor_t base;
  /* Read on every call, written only at creation (or by graph begin/end):
   * kept apart from the shared heap's lock and figures, which other
   * threads write. */
  uint64_t id; /* never reused: thread caches key on it */
  bool cuda;   /* device memory: streams are real */
  size_t small_max, small_chunk;
  unsigned stream_heaps; /* heaps per stream: threads on one stream spread over them */
  int graphs_routing; /* atomic: graph pools being routed to, + 1 while paused (the
                       * allocation's one slow-path gate; sleep.c) */
  const pool_backend_t *be;
  /* options, resolved */
  size_t maximum_size, min_growth, granularity, gc_limit, event_bytes, cache_size;
  unsigned event_interval;
  double slack, split_limit;
  bool release_before_grow, sync_before_peak;
  size_t page, segment, address_space; /* vm: the upstream's page, most bytes per mapping */
  bool segment_scales; /* vm: page=0: a large growth maps fewer, larger segments (vm.c) */
  /* the shared heap */
  rmmc__lock_t lock __attribute__((aligned(64)));
  bool last_resort;
  bool hold_peak; /* step 4's first growth: no new high-water mark (policy.c) */
  pool_owner_t *graphs; /* graph pools, listed */
  int graphs_by_capture; /* routed by capture id (shared lock) */
  pool_region_t *regions;
  size_t nregions;
  rmmc__tlsf_t clean;
  rmmc__ptrmap_t used;  /* large blocks */
  rmmc__ptrmap_t spans; /* span base -> span */
  pool_block_t *holes;  /* vm: unmapped blocks */
  rmmc__stream_set_t streams;
  pool_owner_t *owners;  /* streams with a heap or shared free blocks (listed) */
  pool_owner_t *pending; /* streams that have had free blocks in the shared heap since the
                          * last consolidation: the slow path's passes go over these */
  size_t nowners, nheaps; /* listed streams, live heaps */
  pool_sheap_t *heaps, *heaps_tail; /* live heaps, latest span taker first */
  pool_sheap_t *spare_heaps;        /* retired heaps, for reuse (never freed before destroy) */
  uint64_t heaps_gen;               /* heaps made, retired or reused (lock_all's check) */
  uint64_t heaps_retired;
  /* Passes over every heap without the shared lock (lock_all, the heaps'
   * lending, release_cached) list them through snext under this lock. */
  pthread_mutex_t snap_lock;
  pool_sheap_t *snap_first; /* lock_all's list */
  pool_meta_t meta;
  uint64_t clock; /* shared-heap frees and slow paths: the time base of idleness */
  double band, band_max;  /* steady-state hysteresis: growth may pass the budget by band x slack,
                           * band widening to band_max (shared_heap.c, rmmc__pool_admit) */
  /* figures (shared lock) */
  size_t reserved, reserved_peak, committed, committed_peak, span_bytes, free_bytes;
  uint64_t grows, shrinks, page_maps, page_unmaps;
  uint64_t budget_trims;  /* gives-back the growth budget asked for before a growth */
  uint64_t refusal_trims; /* growths the upstream refused, mapped after giving back (vm.c) */
  uint64_t adoptions; /* streams whose covered frees another stream joined (adopt_covered) */
  rmmc_memory_hooks_t hooks; /* rmmc_resource_set_memory_hooks (shared lock; query.c) */
  uint64_t peers; /* devices given access (bit d; shared lock; query.c): every mapping's */
  /* sleep mode (sleep.c; every lock to write) */
  int paused;               /* atomic read: allocations are refused */
  pool_t *below;            /* the pool layer under this one's upstream, which counts it */
  int pools_above;          /* atomic: pools whose upstream holds this one (they cannot pause) */
  size_t off_bytes;         /* bytes of mappings that are off (counted in reserved) */
  struct pool_sleep_head *sleep; /* the backup and counts; NULL before the first pause */
};

/* Creates a pool; `arena`: named "arena" (the arena mode, arena.c). */
rmmc_status_t rmmc__pool_create(rmmc_resource_t *upstream, const rmmc_pool_options_t *options,
                                bool arena, rmmc_resource_t **out);
/* True if r is a pool made by rmmc_arena_resource_create. */
bool rmmc__pool_is_arena(const rmmc_resource_t *r);

/* ---- the shared heap (shared_heap.c): what the core and backends call ---- */

rmmc_status_t rmmc__pool_no_host_memory(void);
/* Merges b (free, unindexed) and indexes the result. */
void rmmc__pool_put_free(pool_t *p, pool_block_t *b);
pool_block_t *rmmc__pool_carve(pool_t *p, pool_block_t *b, size_t n, size_t align);
void rmmc__pool_cover(pool_t *p, pool_owner_t *o, cudaStream_t stream);

/* Tops the spare list up to a call's worth; false without host memory. */
bool rmmc__pool_room(pool_t *p);
void rmmc__pool_drop_block(pool_t *p, pool_block_t *b);
/* A new region [base, base + size) with one block of `state` (free: owner
 * o, tag, merged; not indexed); linked into the pool's list. NULL without
 * host memory. */
pool_region_t *rmmc__pool_add_region(pool_t *p, uintptr_t base, size_t size, int state);
void rmmc__pool_remove_region(pool_t *p, pool_region_t *r);
/* Gives o its index (shared lock held) just before it is listed: false
 * without host memory. */
bool rmmc__pool_owner_ready(pool_t *p, pool_owner_t *o);
/* A stream's owner joins or leaves the pool's list of owners (p->owners). */
void rmmc__pool_owner_list(pool_t *p, pool_owner_t *o);
void rmmc__pool_owner_unlist(pool_t *p, pool_owner_t *o);
/* A stream leaves p->pending (consolidate: it has no shared free block). */
void rmmc__pool_pending_remove(pool_t *p, pool_owner_t *o);
/* Indexing of shared free blocks (by owner, or clean). */
void rmmc__pool_link_free(pool_t *p, pool_block_t *b);
void rmmc__pool_unlink_free(pool_t *p, pool_block_t *b);
/* Makes b (free, unindexed) merge with its neighbours as the rules allow;
 * returns the merged block, still unindexed. */
pool_block_t *rmmc__pool_merge(pool_t *p, pool_block_t *b);
/* Splits b at addr (b->addr < addr < end): b keeps the front; the back is a
 * new block of the same state, owner and tag, returned. */
pool_block_t *rmmc__pool_split(pool_t *p, pool_block_t *b, uintptr_t addr);
/* May owner o's stream take free block b at once? Clears b's owner when
 * its epoch is known finished. */
bool rmmc__pool_usable(pool_t *p, pool_block_t *b, const pool_owner_t *o);
/* Is the work before b's free known finished (asking CUDA if `ask`)? */
bool rmmc__pool_settled(pool_t *p, pool_block_t *b, bool ask);
/* The growth budget's answer (rmmc__pool_admit): grow; give back to a goal
 * first (the caller runs the trim: the shared heap calls no backend); or
 * refuse. */
typedef enum { POOL_ADMIT_YES, POOL_ADMIT_TRIM, POOL_ADMIT_NO } pool_admit_t;
pool_admit_t rmmc__pool_admit(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t add,
                              size_t need, bool within, size_t *goal);
pool_admit_t rmmc__pool_admit_max(pool_t *p, size_t add);
/* The out-of-memory error with the pool's figures. */
rmmc_status_t rmmc__pool_oom(pool_t *p, size_t bytes, cudaStream_t stream, const char *why);
/* Upstream calls that may run during another thread's graph capture. */
rmmc_status_t rmmc__pool_upstream_allocate(pool_t *p, size_t bytes, cudaStream_t stream, void **out);
rmmc_status_t rmmc__pool_upstream_deallocate(pool_t *p, void *ptr, size_t bytes);

/* ---- sleep mode (sleep.c) ---- */

/* The pool layer of a stack (r itself, or the first pool below it); NULL. */
pool_t *rmmc__pool_in(rmmc_resource_t *r);
/* The error of a call `what` on a stack without one. */
rmmc_status_t rmmc__pool_no_layer(const char *what, const rmmc_resource_t *stack);
/* A pause (+1) or resume (-1) counted where graph routes are (graphs.c):
 * the pool's allocation gate, and the process count that makes caching
 * layers above a pool ask whether their calls must go down to it (fixed_size,
 * binning's bins: base/graph_route.h), so that none of them hands out
 * memory of a paused pool from its cache (design rule 13). */
void rmmc__pool_count_route(pool_t *p, int delta);
/* Puts every heap's hot block back in its index (every lock held), so an
 * allocation that passed the pause gate before a pause finds it only
 * through the slow path, which refuses while paused. */
void rmmc__pool_heaps_cool(pool_t *p);
/* The refusal of an allocation that raced a pause (no lock taken). */
rmmc_status_t rmmc__pool_paused_refusal(size_t bytes);
/* Every lock of the pool: stream heaps first, then the shared one. */
void rmmc__pool_lock_all(pool_t *p);
void rmmc__pool_unlock_all(pool_t *p);
/* Bytes held from the upstream now: reserved less what is off. */
static inline size_t pool_held(const pool_t *p) { return p->reserved - p->off_bytes; }
/* The head of the sleep state, which the first pause makes: pool.c calls
 * the sleep code through it, so the core does not depend on sleep.c
 * (no cycle) and a program that never pauses links none of it. */
typedef struct pool_sleep_head {
  /* Frees the backup's host memory once its copies are done (release_cached
   * while awake: !destroying); destroying: everything. */
  void (*drop)(pool_t *p, bool destroying);
  /* describe's sleep fields. */
  void (*describe)(pool_t *p, rmmc_field_cb emit, void *ctx);
} pool_sleep_head_t;

/* ---- queries, memory hooks and peer access (query.c) ---- */

rmmc_status_t rmmc__pool_get_allocation(rmmc_resource_t *r, const void *ptr,
                                        rmmc_allocation_t *out);
rmmc_status_t rmmc__pool_set_memory_hooks(rmmc_resource_t *r, const rmmc_memory_hooks_t *hooks);
rmmc_status_t rmmc__pool_enable_peer_access(rmmc_resource_t *r, int peer_device);
/* The pool's peers as text ("1,3"; "" for none). */
void rmmc__pool_peers_text(uint64_t peers, char *buf, size_t len);

/* The backends call these under the shared lock (or in fini) after a range
 * (a chunk, one mapping) came from the upstream and before it goes back:
 * growth and trimming only, never on a call served from memory held. */
static inline void pool_hook_acquire(pool_t *p, uintptr_t a, size_t n) {
  if (RMMC_UNLIKELY(p->hooks.on_acquire != NULL)) p->hooks.on_acquire((void *)a, n, p->hooks.user);
}
static inline void pool_hook_release(pool_t *p, uintptr_t a, size_t n) {
  if (RMMC_UNLIKELY(p->hooks.on_release != NULL)) p->hooks.on_release((void *)a, n, p->hooks.user);
}

/* vm: the first of r's mappings (sorted) at or above addr (`end`: the
 * first that ends above it). */
static inline size_t pool_seg_search(const pool_region_t *r, uintptr_t addr, bool end) {
  size_t lo = 0, hi = r->nsegs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const pool_seg_t *g = &r->segs[mid];
    if (end ? g->addr + g->size <= addr : g->addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
static inline size_t pool_seg_lower_bound(const pool_region_t *r, uintptr_t addr) {
  return pool_seg_search(r, addr, false);
}

/* vm: does the union of r's mappings (those that are on, if `on`) cover
 * [a0, a1) (covered), or does no mapping touch it (!covered)? */
static inline bool pool_segs_cover(const pool_region_t *r, uintptr_t a0, uintptr_t a1,
                                   bool covered, bool on) {
  size_t i = pool_seg_search(r, a0, true);
  if (!covered) return i == r->nsegs || r->segs[i].addr >= a1;
  uintptr_t at = a0;
  for (; i < r->nsegs && at < a1; i++) {
    if (r->segs[i].addr > at || (on && r->segs[i].off != SEG_ON)) return false;
    at = r->segs[i].addr + r->segs[i].size;
  }
  return at >= a1;
}

static inline pool_block_t *pool_block_of(rmmc__tlsf_node_t *n) {
  return RMMC_CONTAINER_OF(n, pool_block_t, node);
}
static inline size_t pool_bsize(const pool_block_t *b) { return b->node.size; }
static inline uintptr_t pool_bend(const pool_block_t *b) { return b->addr + b->node.size; }

/* ---- block structs and neighbours ---- */

#define POOL_SPARE_MIN 8
bool rmmc__pool_meta_refill(pool_meta_t *m);
void rmmc__pool_meta_fini(pool_meta_t *m);

static inline bool pool_meta_room(pool_meta_t *m) {
  return RMMC_LIKELY(m->nspare >= POOL_SPARE_MIN) || rmmc__pool_meta_refill(m);
}

static inline pool_block_t *pool_meta_take(pool_meta_t *m) {
  pool_block_t *b = m->spare;
  m->spare = b->qnext;
  m->nspare--;
  return b;
}

static inline void pool_meta_put(pool_meta_t *m, pool_block_t *b) {
  b->qnext = m->spare;
  m->spare = b;
  m->nspare++;
}

/* Splits b at `at` (inside it): b keeps the front; the back, a new block
 * with b's state, owner and tag, is returned (in no list). */
static inline pool_block_t *pool_split_block(pool_meta_t *m, pool_block_t *b, uintptr_t at) {
  pool_block_t *r = pool_meta_take(m);
  /* Field by field: a compound literal zeroes the whole struct first, and
   * that was a sixth of a small allocation's time. */
  r->node.size = pool_bend(b) - at;
  r->addr = at;
  r->prev = b;
  r->next = b->next;
  r->region = b->region;
  r->owner = b->owner;
  r->tag = b->tag;
  r->freed = b->freed; /* trim order (vm_trim reads it) */
  r->state = b->state;
  r->where = W_OUT;
  if (b->next != NULL) b->next->prev = r;
  b->next = r;
  b->node.size = at - b->addr;
  return r;
}

/* Absorbs n, b's neighbour on `side` (0: before), into b. */
static inline void pool_absorb(pool_block_t *b, pool_block_t *n, int side) {
  if (side == 0) {
    b->addr = n->addr;
    b->prev = n->prev;
    if (n->prev != NULL) n->prev->next = b;
    else b->region->first = b;
  } else {
    b->next = n->next;
    if (n->next != NULL) n->next->prev = b;
  }
  b->node.size += n->node.size;
}

static inline bool pool_shared_free(const pool_block_t *n) {
  return n != NULL && n->state == B_FREE && n->where == W_INDEX;
}

#endif /* RMMC_POOL_INTERNAL_H */
