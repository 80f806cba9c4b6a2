/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's shared heap (internal; pool_internal.h): block structs, the
 * shared free blocks with their owners (indexing, merging, carving), the
 * growth budget, and the upstream calls and errors the core and the
 * backends share. It calls neither of them: the budget answers "trim to
 * this goal first" (POOL_ADMIT_TRIM) and its caller runs the trim.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

#define BATCH 255

struct pool_batch {
  struct pool_batch *next;
  pool_block_t b[BATCH];
};

bool rmmc__pool_meta_refill(pool_meta_t *m) {
  struct pool_batch *x = malloc(sizeof *x);
  if (x == NULL) return false;
  x->next = m->batches;
  m->batches = x;
  for (int i = 0; i < BATCH; i++) {
    x->b[i].qnext = m->spare;
    m->spare = &x->b[i];
  }
  m->nspare += BATCH;
  return true;
}

void rmmc__pool_meta_fini(pool_meta_t *m) {
  for (struct pool_batch *x = m->batches, *next; x != NULL; x = next) {
    next = x->next;
    free(x);
  }
  memset(m, 0, sizeof *m);
}

bool rmmc__pool_room(pool_t *p) { return pool_meta_room(&p->meta); }
void rmmc__pool_drop_block(pool_t *p, pool_block_t *b) { pool_meta_put(&p->meta, b); }

rmmc_status_t rmmc__pool_no_host_memory(void) {
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: no host memory for bookkeeping");
}

pool_block_t *rmmc__pool_split(pool_t *p, pool_block_t *b, uintptr_t at) {
  return pool_split_block(&p->meta, b, at);
}

/* ---- shared free blocks ---- */

static inline rmmc__tlsf_t *index_of(pool_t *p, const pool_owner_t *o) {
  return o != NULL ? o->idx : &p->clean;
}

/* A stream is on the list of owners (p->owners) while it has a heap or a
 * shared free block, so streams that left nothing behind cost the slow
 * path's passes nothing; it leaves in heap retirement and consolidate. */
bool rmmc__pool_owner_ready(pool_t *p, pool_owner_t *o) {
  (void)p;
  if (RMMC_LIKELY(o->idx != NULL)) return true;
  o->idx = calloc(1, sizeof *o->idx);
  return o->idx != NULL;
}

void rmmc__pool_owner_list(pool_t *p, pool_owner_t *o) {
  if (o->listed) return;
  o->listed = true;
  o->prev = NULL;
  o->next = p->owners;
  if (p->owners != NULL) p->owners->prev = o;
  p->owners = o;
  p->nowners++;
}

void rmmc__pool_owner_unlist(pool_t *p, pool_owner_t *o) {
  if (!o->listed) return;
  o->listed = false;
  if (o->prev != NULL) o->prev->next = o->next;
  else p->owners = o->next;
  if (o->next != NULL) o->next->prev = o->prev;
  p->nowners--;
  free(o->idx); /* empty: neither a heap nor a free block is left */
  o->idx = NULL;
}

/* p->pending: a stream joins with a free block in the shared heap and
 * leaves only in consolidate, so that no pass over the list sees a stream
 * leave under its feet. */
static void pending_add(pool_t *p, pool_owner_t *o) {
  o->pending = true;
  /* In the order streams came (latest first): which stream's frees a short
   * stream adopts first changes placement (1 point on the 4-stream
   * transformer log over sim). Past 64 places the order is approximate. */
  pool_owner_t *at = p->pending, *before = NULL;
  for (int steps = 0; at != NULL && at->slot->id > o->slot->id && steps < 64; steps++)
    before = at, at = at->pnext;
  o->pprev = before;
  o->pnext = at;
  if (at != NULL) at->pprev = o;
  if (before != NULL) before->pnext = o;
  else p->pending = o;
}

void rmmc__pool_pending_remove(pool_t *p, pool_owner_t *o) {
  if (!o->pending) return;
  o->pending = false;
  if (o->pprev != NULL) o->pprev->pnext = o->pnext;
  else p->pending = o->pnext;
  if (o->pnext != NULL) o->pnext->pprev = o->pprev;
}

RMMC_HOT
void rmmc__pool_link_free(pool_t *p, pool_block_t *b) {
  b->where = W_INDEX;
  rmmc__tlsf_insert(index_of(p, b->owner), &b->node);
  if (b->owner != NULL) { /* the owner's list, for consolidation */
    pool_owner_t *o = b->owner;
    if (RMMC_UNLIKELY(!o->pending) && o->slot != NULL) {
      rmmc__pool_owner_list(p, o);
      pending_add(p, o);
    }
    b->qprev = NULL;
    b->qnext = o->qhead;
    if (o->qhead != NULL) o->qhead->qprev = b;
    o->qhead = b;
  }
  p->free_bytes += pool_bsize(b);
}

RMMC_HOT
void rmmc__pool_unlink_free(pool_t *p, pool_block_t *b) {
  rmmc__tlsf_remove(index_of(p, b->owner), &b->node);
  if (b->owner != NULL) {
    if (b->qprev != NULL) b->qprev->qnext = b->qnext;
    else b->owner->qhead = b->qnext;
    if (b->qnext != NULL) b->qnext->qprev = b->qprev;
  }
  b->where = W_OUT;
  p->free_bytes -= pool_bsize(b);
}

bool rmmc__pool_settled(pool_t *p, pool_block_t *b, bool ask) {
  if (b->owner == NULL) return true;
  if (b->owner->slot == NULL) return false; /* a graph pool's, until released */
  return ask ? rmmc__stream_slot_done(&p->streams, b->owner->slot, b->tag)
             : rmmc__stream_slot_known_done(b->owner->slot, b->tag);
}

bool rmmc__pool_usable(pool_t *p, pool_block_t *b, const pool_owner_t *o) {
  return b->owner == NULL || b->owner == o || rmmc__pool_settled(p, b, false);
}

/* A block freed on stream S sits in S's index (owner S, tag: S's epoch) or,
 * once no stream's work is pending on it, in the clean index. Blocks of one
 * owner merge (the tag is the later one); a clean block merges with any and
 * takes the other's owner and tag; a block whose epoch is known finished
 * counts as clean (relabeled lazily: when touched, or by consolidation
 * before the pool grows); a graph pool's blocks merge only with each other.
 * Absorbing a finished block can bring one of b's own stream next to b:
 * each side goes on until nothing more merges. */
RMMC_HOT
pool_block_t *rmmc__pool_merge(pool_t *p, pool_block_t *b) {
  if (b->owner != NULL && pool_owner_done(b->owner, b->tag)) b->owner = NULL;
  for (int side = 0; side < 2;) {
    pool_block_t *n = side == 0 ? b->prev : b->next;
    pool_owner_t *no = pool_shared_free(n) ? n->owner : NULL;
    if (no != NULL && no != b->owner && pool_owner_done(no, n->tag)) no = NULL;
    bool apart = no != b->owner && ((no != NULL && (b->owner != NULL || no->slot == NULL)) ||
                                    (b->owner != NULL && b->owner->slot == NULL));
    if (!pool_shared_free(n) || apart) {
      side++;
      continue;
    }
    rmmc__pool_unlink_free(p, n);
    if (b->owner == NULL) {
      b->owner = no;
      b->tag = n->tag;
    } else if (no == b->owner && n->tag > b->tag) {
      b->tag = n->tag;
    }
    if (n->freed > b->freed) b->freed = n->freed;
    pool_absorb(b, n, side);
    pool_meta_put(&p->meta, n);
  }
  return b;
}

RMMC_HOT
void rmmc__pool_put_free(pool_t *p, pool_block_t *b) {
  b->freed = p->clock; /* merging keeps the latest: see rmmc__pool_merge */
  rmmc__pool_link_free(p, rmmc__pool_merge(p, b));
}

/* Cuts [a, a + n) out of b (free, unindexed; a the first `align`-aligned
 * address in it); the padding before and the rest after stay free. Needs 2
 * spare structs. Returns the piece, unindexed. */
pool_block_t *rmmc__pool_carve(pool_t *p, pool_block_t *b, size_t n, size_t align) {
  uintptr_t a = rmmc__align_up(b->addr, align);
  if (a != b->addr) {
    pool_block_t *r = pool_split_block(&p->meta, b, a);
    rmmc__pool_put_free(p, b);
    b = r;
  }
  if (pool_bsize(b) > n) rmmc__pool_put_free(p, pool_split_block(&p->meta, b, b->addr + n));
  return b;
}

/* Records o's event on `stream` (the stream of the current call, o's),
 * covering its frees so far; skipped on a capturing stream. */
void rmmc__pool_cover(pool_t *p, pool_owner_t *o, cudaStream_t stream) {
  if (rmmc__stream_slot_try_record(&p->streams, o->slot, stream)) {
    o->uncovered = 0;
    o->uncovered_bytes = 0;
  }
}

/* ---- the budget ---- */

static size_t budget_for(const pool_t *p, size_t need) {
  size_t peak = p->committed + need;
  if (peak < p->committed_peak) peak = p->committed_peak;
  double b = (1.0 + p->slack) * (double)peak;
  return b >= (double)SIZE_MAX ? SIZE_MAX : (size_t)b;
}

/* May the pool grow by `add` bytes for a request of `need`? `within`: YES
 * if it fits the budget as things are, else NO (no message). Otherwise TRIM
 * with *goal when the budget, gc_threshold or the maximum ask for memory
 * back first (o's own frees covered first, so they can go back once
 * finished): the caller trims to *goal, then asks rmmc__pool_admit_max. */
pool_admit_t rmmc__pool_admit(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t add,
                              size_t need, bool within, size_t *goal_out) {
  size_t b = p->release_before_grow ? budget_for(p, need) : SIZE_MAX;
  if (p->gc_limit < b) b = p->gc_limit;
  size_t after = p->reserved + add;
  if (within) return after <= b && after <= p->maximum_size ? POOL_ADMIT_YES : POOL_ADMIT_NO;
  size_t goal = SIZE_MAX;
  if (after > p->maximum_size) goal = p->maximum_size;
  if (after > p->gc_limit && p->gc_limit < goal) goal = p->gc_limit;
  if (after > b && b < goal) goal = b;
  /* Hysteresis (docs/design.md, "Growth and giving back"): while the peak
   * rises a growth past the budget gives back first; in a steady state it
   * may pass the budget by up to band x slack first, and a give-back all
   * the same widens the band by half a slack, up to band_max (as glibc
   * raises its trim threshold). The maximum and gc_threshold have no band. */
  if (goal == b && p->committed + need <= p->committed_peak) {
    if ((double)after <= (1.0 + p->band * p->slack) * (double)p->committed_peak) goal = SIZE_MAX;
    else
      p->band = fmin(p->band + 0.5, p->band_max);
  }
  if (goal != SIZE_MAX) {
    if (o != NULL && o->uncovered > 0) rmmc__pool_cover(p, o, stream);
    *goal_out = goal > add ? goal - add : 0;
    return POOL_ADMIT_TRIM;
  }
  return rmmc__pool_admit_max(p, add);
}

/* After the trim rmmc__pool_admit asked for: YES if growing by `add` keeps
 * within the maximum (and, while hold_peak, within the peak reserved), else
 * NO with the message set. */
pool_admit_t rmmc__pool_admit_max(pool_t *p, size_t add) {
  if (p->hold_peak && p->reserved + add > p->reserved_peak) {
    rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: growing would pass its peak reserved");
    return POOL_ADMIT_NO;
  }
  if (p->reserved + add > p->maximum_size) {
    char mx[32];
    rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: its maximum of %s is reached",
                   rmmc__format_bytes(p->maximum_size, mx, sizeof mx));
    return POOL_ADMIT_NO;
  }
  return POOL_ADMIT_YES;
}

/* ---- errors and upstream calls ---- */

rmmc_status_t rmmc__pool_oom(pool_t *p, size_t bytes, cudaStream_t stream, const char *why) {
  char re[32], iu[32], lf[32], mx[32];
  size_t largest = rmmc__tlsf_largest(&p->clean);
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext) {
    size_t l = rmmc__tlsf_largest(q->idx);
    if (l > largest) largest = l;
  }
  return rmmc_set_oom_error(
      &p->base.base, bytes, stream,
      "pool reserved %s, handed out or lent %s, largest free block %s, maximum %s (%s)",
      rmmc__format_bytes(p->reserved, re, sizeof re),
      rmmc__format_bytes(p->committed, iu, sizeof iu),
      rmmc__format_bytes(largest, lf, sizeof lf),
      p->maximum_size == SIZE_MAX ? "none" : rmmc__format_bytes(p->maximum_size, mx, sizeof mx),
      why != NULL ? why : "no block fits and the pool cannot grow");
}

rmmc_status_t rmmc__pool_upstream_allocate(pool_t *p, size_t bytes, cudaStream_t stream,
                                           void **out) {
  int mode = p->cuda ? rmmc__capture_relax() : -1;
  rmmc_status_t st = rmmc__upstream_allocate(p->base.upstream, bytes, POOL_GRANULE, stream, out);
  rmmc__capture_restore(mode);
  return st;
}

rmmc_status_t rmmc__pool_upstream_deallocate(pool_t *p, void *ptr, size_t bytes) {
  int mode = p->cuda ? rmmc__capture_relax() : -1;
  rmmc_status_t st = rmmc_resource_deallocate(p->base.upstream, ptr, bytes, POOL_GRANULE, NULL);
  rmmc__capture_restore(mode);
  return st;
}

pool_region_t *rmmc__pool_add_region(pool_t *p, uintptr_t base, size_t size, int state) {
  pool_region_t *r = calloc(1, sizeof *r);
  if (r == NULL || !pool_meta_room(&p->meta)) {
    free(r);
    return NULL;
  }
  pool_block_t *b = pool_meta_take(&p->meta);
  *b = (pool_block_t){.node.size = size, .addr = base, .region = r, .state = (uint8_t)state};
  *r = (pool_region_t){.base = base, .size = size, .first = b, .next = p->regions};
  if (p->regions != NULL) p->regions->prev = r;
  p->regions = r;
  p->nregions++;
  return r;
}

void rmmc__pool_remove_region(pool_t *p, pool_region_t *r) {
  if (r->prev != NULL) r->prev->next = r->next;
  else p->regions = r->next;
  if (r->next != NULL) r->next->prev = r->prev;
  p->nregions--;
  free(r->segs);
  free(r);
}

