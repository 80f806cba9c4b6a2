/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The statistics adaptor (see statistics_adaptor.h).
 *
 * The hot path costs one locked instruction per call: one 8-byte lock xadd
 * on `hot->cur`, which packs the current count (bits COUNT_SHIFT..62) and
 * the current bytes (bits 0..COUNT_SHIFT-1) of the whole adaptor. An
 * allocation adds `bytes + ONE`, a deallocation subtracts it, and the value
 * the xadd returns gives both new current figures for the peaks:
 * `live_max_*`, on the same cache line, is the running maximum of the live
 * segment (a load, and a CAS only when a peak is exceeded).
 *
 * Field widths. 43 bits of bytes and 20 of count, and each field is only
 * used up to half its width (4 TiB, 512 Ki allocations outstanding): the top
 * bit of each is a guard, so that one mask test on the value xadd returns
 * sees a field reach its limit while the field still holds it exactly. Bit
 * 63 is SLOW: set once the adaptor has switched to its exact slow path.
 * Bytes get the larger share because GPU figures grow in bytes (a node has
 * terabytes, not petabytes, and 4 TiB outstanding through one adaptor is
 * more than any GPU node holds); 512 Ki live allocations is far beyond what
 * real workloads hold (a pool's ResNet-50 replay holds a few thousand).
 * Past either limit the figures stay exact, only slower.
 *
 * Overflow. An allocation of XADD_MAX bytes or more takes a CAS instead of
 * the xadd and checks before it writes. A smaller one that leaves a field
 * at or past its limit is still held exactly (the guard bit has room) and
 * switches the adaptor, once and for good, to the slow path: `slow` is set
 * (later calls go straight to it), then under `lock` one atomic exchange
 * moves the packed word into the signed 64-bit pair slow_cur_* and leaves
 * SLOW_MARK in it. An xadd that lands before the exchange is in the pair;
 * one that lands after sees SLOW in the value it gets back, undoes itself
 * and redoes the update on the pair, so nothing is lost or counted twice.
 * The slow path updates the pair under `lock`. A field could only pass its
 * guard bit if 2^(BYTE_BITS-1) / XADD_MAX = 4096 threads (2^19 for the
 * count) each landed one call between the limit being reached and `slow`
 * being set, since every caller that sees the limit sets it; after the
 * switch the leftovers of late calls stay 2^62 away from clearing SLOW.
 *
 * Totals are not shared: each thread adds its allocations to its own
 * cache-line shard of the adaptor with plain loads and stores, and readers
 * sum the shards. A thread takes a shard slot (process-wide, the same in
 * every adaptor) on its first allocation and gives it back when it exits;
 * threads beyond SHARDS live ones share one more shard with atomic adds.
 * Deallocations are derived: total count - current count. Nothing here is
 * ever reset and the hot path never looks at the scope stack, so push and
 * pop cannot race with it over memory.
 *
 * A scope is a snapshot: push records the counters at that moment as the
 * scope's base, so the scope's current and total figures are the counters
 * minus the base (RMM's merge rule for current and totals then holds by
 * construction). Peaks are kept per segment: `seg_max` of a frame is the
 * highest absolute current seen while that frame was the innermost one,
 * and push/pop close the live segment with an atomic exchange. A scope's
 * absolute peak is the maximum over its own segments and those of every
 * scope pushed inside it, which is what pop folds into the parent, and
 * equals RMM's max(outer peak, outer current before the push + popped
 * peak).
 *
 * A scope that ends while scopes pushed after it are still open (threads
 * whose blocks overlap without nesting: pop_scope) is taken out of the
 * middle of the stack. Its figures are those of any scope: the counters
 * minus its base, its peak the maximum over its own segments, those of
 * every frame above it and the live segment (all of them began after it).
 * Its own segments fold into the frame below it, which becomes the parent
 * of the frames above it; theirs fold into that parent when they end, so
 * every scope still sees every segment of its lifetime. The live segment
 * stays open: it belongs to the innermost frame, which did not change.
 */
#include <stdlib.h>
#include <string.h>

#include "base/spec.h"
#include "rmmc/statistics_adaptor.h"

typedef struct counters {
  int64_t cur_bytes, total_bytes, cur_count, total_count;
} counters_t;

typedef struct frame {
  counters_t base;      /* the counters when the scope was pushed */
  int64_t seg_max_bytes; /* highest absolute current in this frame's own segments */
  int64_t seg_max_count;
  uint64_t id;          /* what push_scope handed out (0 for the outermost frame) */
} frame_t;

enum { LINE = 64, SHARDS = 64 }; /* threads that keep totals without a locked instruction */

/* The packed current figures (see the top of the file). */
#define COUNT_SHIFT 43                              /* bytes: bits 0..42 */
#define ONE ((uint64_t)1 << COUNT_SHIFT)            /* one allocation */
#define BYTES_MASK (ONE - 1)
#define BYTES_LIMIT ((uint64_t)1 << (COUNT_SHIFT - 1)) /* 4 TiB: the guard bit of bytes */
#define COUNT_LIMIT ((uint64_t)1 << 62)             /* 2^19 allocations: the guard of count */
#define SLOW ((uint64_t)1 << 63)                    /* switched to the slow path */
#define SLOW_MARK (SLOW | ((uint64_t)1 << 62))      /* the word after the switch */
#define XADD_MAX ((uint64_t)1 << 30)                /* larger allocations take a CAS */

/* What every call writes, on a cache line of its own. */
typedef struct hot {
  uint64_t cur;                           /* atomic: count << COUNT_SHIFT | bytes, SLOW */
  int slow;                               /* atomic: set once, before the switch */
  int64_t live_max_bytes, live_max_count; /* atomic: the running maxima of the live segment */
  char pad[LINE - 4 * sizeof(int64_t)];
} hot_t;

/* One thread's totals; shards[SHARDS] is shared (atomic adds). */
typedef struct shard {
  int64_t total_bytes, total_count;
  char pad[LINE - 2 * sizeof(int64_t)];
} shard_t;

typedef struct statistics {
  rmmc__adaptor_t a;
  hot_t *hot;            /* one LINE-aligned block: hot, then SHARDS + 1 shards */
  shard_t *shards;
  pthread_mutex_t lock;  /* push, pop, get, the slow path */
  bool switched;         /* the slow path holds the current figures (under lock) */
  int64_t slow_bytes, slow_count; /* the current figures once switched (under lock) */
  frame_t *frames;       /* frames[0] is the outermost scope */
  int depth;             /* index of the innermost frame */
  int cap;
  uint64_t next_id;      /* the id of the last scope pushed (under lock) */
} statistics_t;

/* ---- shard slots: per thread, process-wide ---- */
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slots_used; /* bit i: a live thread owns slot i */
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;
static pthread_key_t slot_key;
static bool slot_key_ok;
static _Thread_local int tl_slot RMMC_TLS_FAST; /* slot + 1; 0 before the first allocation */

/* At thread exit: the slot goes back; a later allocation by this thread
 * (another key's destructor) uses the shared shard. */
static void slot_release(void *v) {
  pthread_mutex_lock(&slots_lock);
  slots_used &= ~((uint64_t)1 << ((uintptr_t)v - 1));
  pthread_mutex_unlock(&slots_lock);
  tl_slot = SHARDS + 1;
}

static void slot_key_create(void) {
  slot_key_ok = pthread_key_create(&slot_key, slot_release) == 0;
}

#if defined(__GNUC__) || defined(__clang__)
/* A library unloaded before some thread exits must not leave it a
 * destructor to call. */
__attribute__((destructor)) static void slot_key_delete(void) {
  if (slot_key_ok) pthread_key_delete(slot_key);
}
#endif

/* The calling thread's first allocation: claims a free slot, or SHARDS. */
static RMMC_COLD int slot_claim(void) {
  pthread_once(&slot_once, slot_key_create);
  int slot = SHARDS;
  pthread_mutex_lock(&slots_lock);
  if (slot_key_ok && ~slots_used != 0) {
    slot = __builtin_ctzll(~slots_used);
    if (pthread_setspecific(slot_key, (void *)(uintptr_t)(slot + 1)) == 0)
      slots_used |= (uint64_t)1 << slot;
    else
      slot = SHARDS;
  }
  pthread_mutex_unlock(&slots_lock);
  tl_slot = slot + 1;
  return slot;
}

/* ---- the hot path ---- */

/* Adds one allocation of `bytes` to the calling thread's shard. */
static inline void add_totals(statistics_t *s, int64_t bytes) {
  int slot = tl_slot - 1;
  if (RMMC_UNLIKELY(slot < 0)) slot = slot_claim();
  shard_t *sh = &s->shards[slot];
  if (RMMC_LIKELY(slot < SHARDS)) { /* only this thread writes it */
    __atomic_store_n(&sh->total_bytes, sh->total_bytes + bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&sh->total_count, sh->total_count + 1, __ATOMIC_RELAXED);
  } else {
    __atomic_add_fetch(&sh->total_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->total_count, 1, __ATOMIC_RELAXED);
  }
}

static inline void max_i64(int64_t *p, int64_t v) {
  int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v &&
         !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void peaks(statistics_t *s, int64_t bytes, int64_t count) {
  max_i64(&s->hot->live_max_bytes, bytes);
  max_i64(&s->hot->live_max_count, count);
}

/* Moves the packed figures into the pair, once; the caller holds the lock. */
static void switch_locked(statistics_t *s) {
  if (s->switched) return;
  __atomic_store_n(&s->hot->slow, 1, __ATOMIC_RELAXED);
  uint64_t w = __atomic_exchange_n(&s->hot->cur, SLOW_MARK, __ATOMIC_RELAXED);
  s->slow_bytes = (int64_t)(w & BYTES_MASK);
  s->slow_count = (int64_t)(w >> COUNT_SHIFT);
  s->switched = true;
}

/* The slow path: adds (bytes, count) to the pair, switching first if needed. */
static RMMC_COLD void add_slow(statistics_t *s, int64_t bytes, int64_t count) {
  pthread_mutex_lock(&s->lock);
  switch_locked(s);
  s->slow_bytes += bytes;
  s->slow_count += count;
  if (count > 0) peaks(s, s->slow_bytes, s->slow_count);
  pthread_mutex_unlock(&s->lock);
}

/* A field reached its limit (sets `slow` first: see the top of the file). */
static RMMC_COLD void start_switch(statistics_t *s) {
  __atomic_store_n(&s->hot->slow, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&s->lock);
  switch_locked(s);
  pthread_mutex_unlock(&s->lock);
}

/* Adds an allocation of `bytes` off the xadd path: a CAS that checks before
 * it writes (large allocations), or the slow path. */
static RMMC_COLD void add_checked(statistics_t *s, uint64_t bytes) {
  uint64_t w = __atomic_load_n(&s->hot->cur, __ATOMIC_RELAXED), now;
  do {
    if (w & SLOW || __atomic_load_n(&s->hot->slow, __ATOMIC_RELAXED) ||
        bytes >= BYTES_LIMIT || (w & BYTES_MASK) + bytes >= BYTES_LIMIT ||
        w + ONE >= COUNT_LIMIT) {
      if (!(w & SLOW)) start_switch(s);
      add_slow(s, (int64_t)bytes, 1);
      return;
    }
    now = w + bytes + ONE;
  } while (!__atomic_compare_exchange_n(&s->hot->cur, &w, now, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  peaks(s, (int64_t)(now & BYTES_MASK), (int64_t)(now >> COUNT_SHIFT));
}

/* The xadd of an allocation left a guard bit or SLOW set in `now`. */
static RMMC_COLD void add_limit(statistics_t *s, uint64_t now, uint64_t bytes) {
  if (now & SLOW) { /* landed after the switch: not in the pair */
    __atomic_sub_fetch(&s->hot->cur, bytes + ONE, __ATOMIC_RELAXED);
    add_slow(s, (int64_t)bytes, 1);
    return;
  }
  /* Landed before it: in the word, exactly (the guard bit has room). */
  peaks(s, (int64_t)(now & BYTES_MASK), (int64_t)(now >> COUNT_SHIFT));
  start_switch(s);
}

static rmmc_status_t statistics_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                         cudaStream_t stream, void **out) {
  statistics_t *s = (statistics_t *)r;
  rmmc_status_t st = rmmc__forward_allocate(&s->a, bytes, alignment, stream, out);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  hot_t *h = s->hot;
  add_totals(s, (int64_t)bytes); /* first: the locked update of cur then publishes it */
  if (RMMC_UNLIKELY(bytes >= XADD_MAX || __atomic_load_n(&h->slow, __ATOMIC_RELAXED))) {
    add_checked(s, bytes);
    return RMMC_SUCCESS;
  }
  uint64_t now = __atomic_add_fetch(&h->cur, bytes + ONE, __ATOMIC_RELAXED);
  if (RMMC_UNLIKELY(now & (SLOW | COUNT_LIMIT | BYTES_LIMIT))) {
    add_limit(s, now, bytes);
    return RMMC_SUCCESS;
  }
  peaks(s, (int64_t)(now & BYTES_MASK), (int64_t)(now >> COUNT_SHIFT));
  return RMMC_SUCCESS;
}

static rmmc_status_t statistics_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                           size_t alignment, cudaStream_t stream) {
  statistics_t *s = (statistics_t *)r;
  rmmc_status_t st = rmmc__forward_deallocate(&s->a, ptr, bytes, alignment, stream);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  hot_t *h = s->hot;
  /* A deallocation of what was allocated here always fits in the word; one
   * that does not (a caller's bug the upstream let through) would take the
   * figures below zero, which only the signed pair can hold. */
  uint64_t w = __atomic_load_n(&h->cur, __ATOMIC_RELAXED);
  if (RMMC_UNLIKELY(w < ONE || (w & BYTES_MASK) < bytes || w & SLOW ||
                    __atomic_load_n(&h->slow, __ATOMIC_RELAXED))) {
    add_slow(s, -(int64_t)bytes, -1);
    return RMMC_SUCCESS;
  }
  uint64_t now = __atomic_sub_fetch(&h->cur, bytes + ONE, __ATOMIC_RELAXED);
  if (RMMC_UNLIKELY(now & SLOW)) { /* landed after the switch: not in the pair */
    __atomic_add_fetch(&h->cur, bytes + ONE, __ATOMIC_RELAXED);
    add_slow(s, -(int64_t)bytes, -1);
  }
  return RMMC_SUCCESS;
}

/* Current figures first, then the totals (added before current). The
 * caller holds the lock. */
static counters_t load_counters(const statistics_t *s) {
  counters_t c = {0, 0, 0, 0};
  if (s->switched) {
    c.cur_bytes = s->slow_bytes;
    c.cur_count = s->slow_count;
  } else {
    uint64_t w = __atomic_load_n(&s->hot->cur, __ATOMIC_RELAXED);
    c.cur_bytes = (int64_t)(w & BYTES_MASK);
    c.cur_count = (int64_t)(w >> COUNT_SHIFT);
  }
  for (int i = 0; i <= SHARDS; i++) {
    c.total_bytes += __atomic_load_n(&s->shards[i].total_bytes, __ATOMIC_RELAXED);
    c.total_count += __atomic_load_n(&s->shards[i].total_count, __ATOMIC_RELAXED);
  }
  return c;
}

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

/* Closes the live segment: restarts its maximum at `now`, returns the old one. */
static int64_t close_segment(int64_t *live_max, int64_t now) {
  return __atomic_exchange_n(live_max, now, __ATOMIC_RELAXED);
}

/* The figures of a scope with base `b` whose absolute maxima are max_b and
 * max_c, given the counters c now. */
static rmmc_statistics_t figures(const counters_t *c, const counters_t *b, int64_t max_b,
                                 int64_t max_c) {
  rmmc_statistics_t f = RMMC_STATISTICS_INIT;
  f.current_bytes = c->cur_bytes - b->cur_bytes;
  f.peak_bytes = max2(max_b, c->cur_bytes) - b->cur_bytes;
  f.total_bytes = (uint64_t)(c->total_bytes - b->total_bytes);
  f.current_count = c->cur_count - b->cur_count;
  f.peak_count = max2(max_c, c->cur_count) - b->cur_count;
  f.total_count = (uint64_t)(c->total_count - b->total_count);
  int64_t deallocs = (c->total_count - c->cur_count) - (b->total_count - b->cur_count);
  f.deallocations = deallocs > 0 ? (uint64_t)deallocs : 0;
  return f;
}

/* The figures of frames[k]: its own segments, those of every frame above
 * it and the live segment; the caller holds the lock. */
static rmmc_statistics_t scope_figures(statistics_t *s, int k) {
  counters_t c = load_counters(s);
  int64_t max_b = __atomic_load_n(&s->hot->live_max_bytes, __ATOMIC_RELAXED);
  int64_t max_c = __atomic_load_n(&s->hot->live_max_count, __ATOMIC_RELAXED);
  for (int i = k; i <= s->depth; i++) {
    max_b = max2(max_b, s->frames[i].seg_max_bytes);
    max_c = max2(max_c, s->frames[i].seg_max_count);
  }
  return figures(&c, &s->frames[k].base, max_b, max_c);
}

/* The index of the open scope `id` (1..depth), or -1; the caller holds the lock. */
static int find_scope(const statistics_t *s, uint64_t id) {
  for (int i = s->depth; i >= 1 && id != 0; i--)
    if (s->frames[i].id == id) return i;
  return -1;
}

/* Checks that out has room for the first field. */
static rmmc_status_t check_out(const char *what, const rmmc_statistics_t *out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: out is NULL", what);
  if (out->size < offsetof(rmmc_statistics_t, current_bytes) + sizeof out->current_bytes)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: out->size is %zu: set it with RMMC_STATISTICS_INIT", what,
                          out->size);
  return RMMC_SUCCESS;
}

/* Copies the fields that fit in out->size (checked), leaving size alone. */
static void copy_out(rmmc_statistics_t *out, const rmmc_statistics_t *f) {
  size_t first = offsetof(rmmc_statistics_t, current_bytes);
  size_t n = out->size < sizeof *f ? out->size : sizeof *f;
  memcpy((char *)out + first, (const char *)f + first, n - first);
}

static rmmc_status_t check(rmmc_resource_t *r, const char *what);

RMMC_API rmmc_status_t rmmc_statistics_adaptor_get(rmmc_resource_t *r, rmmc_statistics_t *out) {
  rmmc_status_t st = check(r, "statistics_adaptor_get");
  if (st == RMMC_SUCCESS) st = check_out("statistics_adaptor_get", out);
  if (st != RMMC_SUCCESS) return st;
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  rmmc_statistics_t f = scope_figures(s, s->depth);
  pthread_mutex_unlock(&s->lock);
  copy_out(out, &f);
  return RMMC_SUCCESS;
}

/* Pushes a fresh frame and stores its id in *id (may be NULL). */
static rmmc_status_t push(rmmc_resource_t *r, const char *what, uint64_t *id) {
  rmmc_status_t st = check(r, what);
  if (st != RMMC_SUCCESS) return st;
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  if (s->depth + 1 == s->cap) {
    int ncap = s->cap * 2;
    frame_t *nf = realloc(s->frames, (size_t)ncap * sizeof *nf);
    if (nf == NULL) {
      pthread_mutex_unlock(&s->lock);
      return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory for scope %d", what,
                            s->depth + 1);
    }
    s->frames = nf;
    s->cap = ncap;
  }
  counters_t c = load_counters(s);
  hot_t *h = s->hot;
  frame_t *outer = &s->frames[s->depth];
  outer->seg_max_bytes = max2(outer->seg_max_bytes, close_segment(&h->live_max_bytes, c.cur_bytes));
  outer->seg_max_count = max2(outer->seg_max_count, close_segment(&h->live_max_count, c.cur_count));
  s->frames[++s->depth] = (frame_t){c, c.cur_bytes, c.cur_count, ++s->next_id};
  if (id != NULL) *id = s->next_id;
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_push(rmmc_resource_t *r) {
  return push(r, "statistics_adaptor_push", NULL);
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_push_scope(rmmc_resource_t *r, uint64_t *id) {
  if (id == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "statistics_adaptor_push_scope: id is NULL");
  return push(r, "statistics_adaptor_push_scope", id);
}

/* Ends frames[k] (1 <= k <= depth): its figures in *f, its segments
 * folded into the frame below, the frames above moved down. The caller
 * holds the lock. */
static void end_frame(statistics_t *s, int k, rmmc_statistics_t *f) {
  frame_t *frame = &s->frames[k];
  if (k == s->depth) { /* the innermost: its live segment ends too */
    counters_t c = load_counters(s);
    hot_t *h = s->hot;
    frame->seg_max_bytes = max2(frame->seg_max_bytes, close_segment(&h->live_max_bytes, c.cur_bytes));
    frame->seg_max_count = max2(frame->seg_max_count, close_segment(&h->live_max_count, c.cur_count));
    *f = figures(&c, &frame->base, frame->seg_max_bytes, frame->seg_max_count);
  } else {
    *f = scope_figures(s, k);
  }
  frame_t *outer = &s->frames[k - 1];
  outer->seg_max_bytes = max2(outer->seg_max_bytes, frame->seg_max_bytes);
  outer->seg_max_count = max2(outer->seg_max_count, frame->seg_max_count);
  memmove(frame, frame + 1, (size_t)(s->depth - k) * sizeof *frame);
  s->depth--;
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_pop(rmmc_resource_t *r, rmmc_statistics_t *out) {
  rmmc_status_t st = check(r, "statistics_adaptor_pop");
  if (st == RMMC_SUCCESS && out != NULL) st = check_out("statistics_adaptor_pop", out);
  if (st != RMMC_SUCCESS) return st;
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  if (s->depth == 0) {
    pthread_mutex_unlock(&s->lock);
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "statistics_adaptor_pop: no scope was pushed (push before pop)");
  }
  rmmc_statistics_t f;
  end_frame(s, s->depth, &f);
  pthread_mutex_unlock(&s->lock);
  if (out != NULL) copy_out(out, &f);
  return RMMC_SUCCESS;
}

/* Reads (end == false) or ends scope `id`. */
static rmmc_status_t scope_call(rmmc_resource_t *r, uint64_t id, rmmc_statistics_t *out, bool end,
                                const char *what) {
  rmmc_status_t st = check(r, what);
  if (st == RMMC_SUCCESS && (out != NULL || !end)) st = check_out(what, out);
  if (st != RMMC_SUCCESS) return st;
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  int k = find_scope(s, id);
  if (k < 0) {
    pthread_mutex_unlock(&s->lock);
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: no open scope %llu (ended already, or never pushed here)", what,
                          (unsigned long long)id);
  }
  rmmc_statistics_t f;
  if (end)
    end_frame(s, k, &f);
  else
    f = scope_figures(s, k);
  pthread_mutex_unlock(&s->lock);
  if (out != NULL) copy_out(out, &f);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_get_scope(rmmc_resource_t *r, uint64_t id,
                                                         rmmc_statistics_t *out) {
  return scope_call(r, id, out, false, "statistics_adaptor_get_scope");
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_pop_scope(rmmc_resource_t *r, uint64_t id,
                                                         rmmc_statistics_t *out) {
  return scope_call(r, id, out, true, "statistics_adaptor_pop_scope");
}

RMMC_API int rmmc_statistics_adaptor_get_depth(rmmc_resource_t *r) {
  if (check(r, "statistics_adaptor_get_depth") != RMMC_SUCCESS) return -1;
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  int depth = s->depth;
  pthread_mutex_unlock(&s->lock);
  return depth;
}

/* The whole adaptor's figures: the outermost scope with every scope inside
 * it folded in, as if all were popped. */
static void statistics_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_lock(&s->lock);
  counters_t c = load_counters(s);
  int64_t max_b = __atomic_load_n(&s->hot->live_max_bytes, __ATOMIC_RELAXED);
  int64_t max_c = __atomic_load_n(&s->hot->live_max_count, __ATOMIC_RELAXED);
  for (int i = 0; i <= s->depth; i++) {
    max_b = max2(max_b, s->frames[i].seg_max_bytes);
    max_c = max2(max_c, s->frames[i].seg_max_count);
  }
  int depth = s->depth;
  bool switched = s->switched;
  pthread_mutex_unlock(&s->lock);
  counters_t zero = {0, 0, 0, 0};
  rmmc_statistics_t f = figures(&c, &zero, max_b, max_c);
  /* The whole adaptor's current figures go below 0 only when memory not
   * allocated here was freed through it: those report 0. */
#define VALUE_BOTH(name) v.name = f.name > 0 ? (uint64_t)f.name : 0;
#define VALUE_DESCRIBE(name)
#define VALUE(kind, type, name, key, where, doc) VALUE_##where(name)
  struct {
    RMMC_STATISTICS_FIGURES(RMMC__FIGURE_KEYED_VALUE)
  } v = {.scopes = (uint64_t)depth, .slow_path = switched ? 1 : 0};
  RMMC_STATISTICS_FIGURES(VALUE)
  RMMC_STATISTICS_FIGURES(RMMC__FIGURE_KEYED_EMIT)
#undef VALUE
}

static void statistics_destroy(rmmc_resource_t *r) {
  statistics_t *s = (statistics_t *)r;
  pthread_mutex_destroy(&s->lock);
  free(s->frames);
  free(s->hot);
  rmmc__adaptor_destroy(r);
}

static const rmmc_resource_ops_t statistics_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "statistics",
    .allocate = statistics_allocate,
    .deallocate = statistics_deallocate,
    .describe = statistics_describe,
    .destroy = statistics_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

static rmmc_status_t check(rmmc_resource_t *r, const char *what) {
  return rmmc__check_kind(r, &statistics_ops, what);
}

RMMC_API rmmc_status_t rmmc_statistics_adaptor_create(rmmc_resource_t *upstream,
                                                      rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__adaptor_new("statistics_adaptor_create", &statistics_ops, upstream,
                                       sizeof(statistics_t), out);
  if (st != RMMC_SUCCESS) return st;
  statistics_t *s = (statistics_t *)*out;
  s->cap = 8;
  s->frames = calloc((size_t)s->cap, sizeof *s->frames);
  s->hot = aligned_alloc(LINE, sizeof(hot_t) + (SHARDS + 1) * sizeof(shard_t));
  if (s->frames == NULL || s->hot == NULL) {
    free(s->frames);
    free(s->hot);
    rmmc__adaptor_destroy(*out);
    *out = NULL;
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "statistics_adaptor_create: no host memory");
  }
  memset(s->hot, 0, sizeof(hot_t) + (SHARDS + 1) * sizeof(shard_t));
  s->shards = (shard_t *)(s->hot + 1);
  pthread_mutex_init(&s->lock, NULL);
  return RMMC_SUCCESS;
}

static rmmc_status_t statistics_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                      int device, rmmc_resource_t **out) {
  (void)args, (void)device;
  return rmmc_statistics_adaptor_create(upstream, out);
}

const rmmc__spec_entry_t rmmc__statistics_spec = {
    .name = "statistics",
    .help = "counts current, peak and total bytes and allocations, in scopes",
    .needs_upstream = true,
    .build = statistics_build,
};
