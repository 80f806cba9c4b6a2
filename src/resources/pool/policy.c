/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's stream-ordering policy (core.h): covering frees,
 * coalescing other streams' finished frees, the search over frees another
 * stream may take behind a GPU-side wait, the shared heap's slow path.
 */
#include "core.h"

/* Covers o's frees now, from outside the shared lock: its counts start
 * again under the lock, the record (on `stream`, o's) follows outside. */
void rmmc__pool_cover_now(pool_t *p, pool_owner_t *o, cudaStream_t stream) {
  rmmc__lock(&p->lock);
  o->uncovered = 0;
  o->uncovered_bytes = 0;
  rmmc__unlock(&p->lock);
  (void)rmmc__stream_slot_try_record(&p->streams, o->slot, stream);
}

/* Moves q's shared free blocks of epochs up to `upto` to owner `to` with
 * tag `tag` (to NULL: clean, the tag kept) and merges them anew. */
static void relabel(pool_t *p, pool_owner_t *q, uint64_t upto, pool_owner_t *to, uint64_t tag) {
  pool_block_t *moved = NULL;
  for (pool_block_t *b = q->qhead, *next; b != NULL; b = next) {
    next = b->qnext;
    POOL_ASSERT(p, b, b->state == B_FREE && b->where == W_INDEX && b->owner == q);
    if (b->tag > upto) continue;
    rmmc__pool_unlink_free(p, b);
    b->owner = to;
    if (to != NULL) b->tag = tag;
    b->qnext = moved;
    moved = b;
  }
  for (pool_block_t *b = moved, *next; b != NULL; b = next) {
    next = b->qnext;
    rmmc__pool_put_free(p, b);
  }
}

/* Relabels clean q's shared free blocks whose epoch is known finished and
 * merges them; nothing to do while q's finished epoch stays where the last
 * pass saw it (a free is tagged past the epoch finished at the time). */
static void consolidate_owner(pool_t *p, pool_owner_t *q) {
  uint64_t done = __atomic_load_n(&q->slot->epoch_done, __ATOMIC_ACQUIRE);
  if (q->qhead == NULL || done == q->seen_done) return;
  q->seen_done = done;
  relabel(p, q, done, NULL, 0);
}

/* Every stream's finished frees coalesce (asking CUDA once per stream with
 * recorded, unfinished frees when `ask`). A stream left with neither a heap
 * nor free blocks leaves the list of owners here (and only in heap_retire
 * otherwise: no other pass over the list unlinks). */
void rmmc__pool_consolidate(pool_t *p, bool ask) {
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

/* Other streams' blocks of `need` bytes. A stream whose fitting block an
 * event covers is asked (one query) whether that work has finished: then
 * its frees coalesce and *settled is set (search again); else the best such
 * block is returned, *from its owner, for a GPU-side wait. Streams whose
 * fitting block no event covers yet are asked to record. */
static pool_block_t *find_covered(pool_t *p, pool_owner_t *o, size_t need, pool_owner_t **from,
                                  bool *settled) {
  *settled = false;
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) { /* finished: coalesce */
    if (q == o) continue;
    rmmc__tlsf_node_t *x = rmmc__tlsf_find(q->idx, need);
    if (x == NULL) continue;
    uint64_t tag = pool_block_of(x)->tag;
    /* Host memory: covering another stream's frees costs nothing, and is
     * done once heaps were retired: a stream that never comes back would
     * keep its frees and the clean memory beside them (at event_interval=64,
     * 30,000 streams held 2 MiB each). Before, each stream covers its own,
     * as on a GPU (covering for them cost the 4-stream transformer log over
     * sim 1.047x -> 1.057x). */
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

/* Adoption: o's stream waits on the GPU for another stream's last event,
 * whose covered frees become o's (tagged with o's next epoch, which
 * includes the wait) and merge with o's and clean neighbours, one stream
 * at a time until a block of r->take fits, so memory freed side by side on
 * several streams joins without a synchronization. Returns that block
 * (still indexed) or NULL. */
static pool_block_t *adopt_covered(const pool_request_t *r) {
  pool_t *p = r->p;
  pool_owner_t *o = r->o;
  uint64_t mine = rmmc__stream_slot_tag(o->slot);
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) {
    if (q == o || q->slot == NULL || q->qhead == NULL) continue;
    uint64_t rec = __atomic_load_n(&q->slot->epoch_recorded, __ATOMIC_ACQUIRE);
    pool_block_t *b = q->qhead;
    while (b != NULL && b->tag > rec) b = b->qnext;
    if (b == NULL) continue;
    if (rmmc__stream_slot_wait(&p->streams, q->slot, r->stream) != RMMC_SUCCESS) return NULL;
    relabel(p, q, rec, o, mine);
    p->adoptions++;
    if ((b = find_usable(p, o, r->take, r->take_align)) != NULL) return b;
  }
  return NULL;
}

/* ---- the shared heap's slow path ----
 *
 * No free block of r->take bytes (at r->take_align) that r's stream may use
 * at once: the steps cheapest first, in RMM's get_block order, with growth
 * within the budget before any GPU-side wait (docs/design.md, "A request
 * through the pool", step 5.2):
 *   1. reuse without waiting;  2. grow within the budget;
 *   3. reuse behind GPU-side waits;  4. grow past the budget, trimming first;
 *   5. the last resort (get_block's second pass, SLOW_LAST): synchronize,
 *      merge everything, give everything cached back, grow.
 * Each returns a block (taken: still indexed; grown: fresh) or NULL. */

/* Step 1. *covered and *from: the best block another stream freed under an
 * event, for step 3. */
static pool_block_t *reuse_without_wait(const pool_request_t *r, size_t fit,
                                        pool_block_t **covered, pool_owner_t **from) {
  pool_t *p = r->p;
  pool_owner_t *o = r->o;
  size_t need = r->take, align = r->take_align;
  pool_block_t *b;
  bool settled;
  /* Other streams' frees known finished, then those that fit, asked; then
   * again with other heaps' idle spans back, before the pool grows. */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && rmmc__pool_reclaim_spans(p, r->h, align <= p->small_chunk ? need : SIZE_MAX) == 0)
      return NULL;
    rmmc__pool_consolidate(p, false);
    if ((b = find_usable(p, o, need, align)) != NULL) return b;
    *covered = find_covered(p, o, fit, from, &settled);
    if (settled && (b = find_usable(p, o, need, align)) != NULL) return b;
  }
  return NULL;
}

/* Step 3: only the query of every stream while o's stream is captured (a
 * wait would join the capture). */
static pool_block_t *reuse_after_wait(const pool_request_t *r, bool capturing,
                                      pool_block_t *covered, pool_owner_t *from) {
  pool_t *p = r->p;
  pool_block_t *b;
  if (!capturing && covered != NULL &&
      rmmc__stream_slot_wait(&p->streams, from->slot, r->stream) == RMMC_SUCCESS)
    return covered;
  rmmc__pool_consolidate(p, true);
  if ((b = find_usable(p, r->o, r->take, r->take_align)) != NULL) return b;
  return capturing ? NULL : adopt_covered(r);
}

/* Step 4's trim to what the budget, gc_threshold and the maximum ask;
 * false (message set) when the maximum still refuses. */
static bool trim_to_budget(const pool_request_t *r) {
  pool_t *p = r->p;
  size_t goal;
  pool_admit_t a = rmmc__pool_admit(p, r->o, r->stream, 0, r->take, false, &goal);
  if (a == POOL_ADMIT_TRIM) {
    p->budget_trims++;
    (void)p->be->trim(p, goal);
    a = rmmc__pool_admit_max(p, 0);
  }
  return a == POOL_ADMIT_YES;
}

/* Has some stream recorded work not yet known finished? */
static bool unfinished_frees(const pool_t *p) {
  for (const pool_owner_t *q = p->pending; q != NULL; q = q->pnext)
    if (q->slot != NULL && !rmmc__stream_slot_known_idle(q->slot)) return true;
  return false;
}

/* A block found free: out of its index, for the caller. */
static rmmc_status_t slow_take(pool_block_t *b, pool_t *p, pool_block_t **out) {
  POOL_ASSERT(p, b, b->state == B_FREE && b->where == W_INDEX);
  rmmc__pool_unlink_free(p, b);
  *out = b;
  return RMMC_SUCCESS;
}

/* The backend grows for r (`how`: POOL_GROW_*), the growth counted. */
static rmmc_status_t slow_grow(const pool_request_t *r, unsigned how, pool_block_t **out) {
  pool_t *p = r->p;
  rmmc_status_t st = p->be->grow(p, r->o, r->stream, r->take, r->take_align, how, out);
  if (st == RMMC_SUCCESS) p->grows++;
  return st;
}

/* Grows, but not past the peak reserved (trimming to the budget first). */
static rmmc_status_t grow_within_peak(const pool_request_t *r, pool_block_t **out) {
  r->p->hold_peak = true;
  rmmc_status_t st = slow_grow(r, POOL_GROW_ANY, out);
  r->p->hold_peak = false;
  return st;
}

/* Step 4's growth. On a busy GPU most frees wait behind work the host ran
 * ahead of, and the pool would grow to a new high-water mark holding them
 * (docs/design.md, "Growth and giving back"). So with sync_before_peak it
 * grows only to its peak reserved; past that the host waits one mark at a
 * time (stream_events.h: the nearest, so the shortest wait), the frees
 * behind it merge and may go back, and it tries again; only when every
 * stream is known finished does it grow past (a stall: event_syncs). */
static rmmc_status_t grow_past_budget(const pool_request_t *r, bool capturing,
                                      pool_block_t **out) {
  pool_t *p = r->p;
  pool_owner_t *o = r->o;
  pool_block_t *b;
  rmmc_status_t st;
  if (p->sync_before_peak && !capturing && p->free_bytes >= r->take && unfinished_frees(p)) {
    st = grow_within_peak(r, out);
    if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
    /* o's own frees first: the only stream this call may record on. */
    rmmc__pool_cover(p, o, r->stream);
    for (;;) {
      bool settled = false;
      for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext)
        if (q->slot != NULL && rmmc__stream_slot_finish_mark(&p->streams, q->slot)) settled = true;
      if (!settled) break;
      rmmc__pool_consolidate(p, false);
      if ((b = find_usable(p, o, r->take, r->take_align)) != NULL) return slow_take(b, p, out);
      st = grow_within_peak(r, out);
      if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
    }
  }
  return slow_grow(r, POOL_GROW_ANY, out);
}

/* Step 5. The message of the step that failed last says why. */
static rmmc_status_t last_resort(const pool_request_t *r, bool capturing, pool_block_t **out) {
  pool_t *p = r->p;
  char why[256];
  snprintf(why, sizeof why, "%s", rmmc_last_error_message());
  /* Every stream's memory, everything cached below. */
  p->last_resort = true;
  if (!capturing && rmmc__stream_set_sync(&p->streams) == RMMC_SUCCESS) {
    rmmc__pool_consolidate(p, false);
    rmmc__pool_graph_drain(p);
  }
  (void)rmmc__pool_reclaim_spans(p, r->h, SIZE_MAX);
  rmmc__pool_consolidate(p, false);
  pool_block_t *b = find_usable(p, r->o, r->take, r->take_align);
  if (b != NULL) {
    p->last_resort = false;
    return slow_take(b, p, out);
  }
  (void)p->be->trim(p, 0);
  (void)rmmc_resource_release_cached(p->base.upstream);
  rmmc_status_t st = slow_grow(r, POOL_GROW_ANY, out);
  p->last_resort = false;
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  /* The out-of-memory rule (internal.h) applied here, under the pool's own
   * lock; get_block lends once more, then tells the wrapper not to apply
   * it again (pool_out_of_memory). */
  st = rmmc__pool_oom(p, r->bytes, r->stream, why);
  rmmc__append_error(RMMC__RETRIED_NOTE, p->base.base.ops->name);
  return st;
}

/* Under the shared lock: the steps of r's pass; *out a block of r->take
 * at r->take_align, unindexed, that r's stream may use at once. */
static rmmc_status_t shared_slow_steps(const pool_request_t *r, pool_block_t **out) {
  pool_t *p = r->p;
  size_t need = r->take, align = r->take_align;
  size_t fit = need + (align > POOL_GRANULE ? align - POOL_GRANULE : 0);
  if (fit > POOL_MAX_REQUEST)
    return rmmc__pool_oom(p, r->bytes, r->stream, "larger than any pool can hold");
  p->clock++;
  bool capturing = p->cuda && rmmc__stream_is_capturing(r->stream);
  if (r->steps == SLOW_LAST) return last_resort(r, capturing, out);
  pool_block_t *b, *covered = NULL;
  pool_owner_t *from = NULL;
  /* 1. */
  if ((b = reuse_without_wait(r, fit, &covered, &from)) != NULL) return slow_take(b, p, out);
  /* 2. */
  rmmc_status_t st = slow_grow(r, POOL_GROW_WITHIN, out);
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  /* 3. */
  if ((b = reuse_after_wait(r, capturing, covered, from)) != NULL) return slow_take(b, p, out);
  /* 4. (5: get_block's second pass, SLOW_LAST) */
  if (trim_to_budget(r) && (b = find_usable(p, r->o, need, align)) != NULL)
    return slow_take(b, p, out);
  return grow_past_budget(r, capturing, out);
}

/* A success leaves the thread's error state as it was before the call
 * (steps may fail on the way before one succeeds). */
POOL_NOINLINE rmmc_status_t rmmc__pool_shared_slow(const pool_request_t *r, pool_block_t **out) {
  rmmc_status_t st = shared_slow_steps(r, out);
  if (st == RMMC_SUCCESS) (void)rmmc__error_restore_call_start();
  return st;
}
