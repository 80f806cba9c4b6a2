/* SPDX-License-Identifier: Apache-2.0 */
/* The pool's cheap checks (check.h) and the report of a broken one. */
#include <stdlib.h>

#include "check.h"

static const char *state_name(int s) {
  static const char *const names[] = {"free", "used", "span", "unmapped", "foreign"};
  return s >= 0 && s <= B_FOREIGN ? names[s] : "?";
}

/* abort() through a pointer: a direct call would be the library's first,
 * and its new PLT entry would move all of .text by 16 bytes, changing the
 * code alignment the fast paths run at (1.25x on the 256-byte pair of
 * rmmc-ab, instructions unchanged). */
static void (*volatile pool_abort)(void) = abort;

_Noreturn void rmmc__pool_check_failed(const pool_t *p, const pool_block_t *b, const char *what,
                                       const char *file, int line) {
  char blk[256] = "";
  if (b != NULL) {
    const pool_region_t *r = b->region;
    snprintf(blk, sizeof blk,
             "; block %p + %zu (%s, where %d, owner %p, prev %p, next %p) in %s %p + %zu",
             (void *)b->addr, pool_bsize(b), state_name(b->state), b->where, (void *)b->owner,
             b->prev != NULL ? (void *)b->prev->addr : NULL,
             b->next != NULL ? (void *)b->next->addr : NULL,
             r != NULL && r->parent != NULL ? "span" : "region",
             r != NULL ? (void *)r->base : NULL, r != NULL ? r->size : (size_t)0);
  }
  /* The library's error path first (a handler of the thread's message, a
   * debugger's breakpoint on rmmc_set_error), then stderr, since the
   * process does not come back from the abort to read it. */
  (void)rmmc_set_error(RMMC_ERROR_INTERNAL, "pool %p: invariant broken at %s:%d: %s%s",
                       (const void *)p, file, line, what, blk);
  fprintf(stderr, "rmmc: %s\n", rmmc_last_error_message());
  fflush(stderr);
  pool_abort();
  __builtin_trap(); /* not reached */
}

#define FAIL(text) return (*what = (text), false)

bool rmmc__pool_block_ok(const pool_block_t *b, int state, const char **what) {
  const pool_region_t *r = b->region;
  if (b->state != state) FAIL("the block is in the state the step expects");
  if (b->addr % POOL_GRANULE != 0 || pool_bsize(b) == 0 || pool_bsize(b) % POOL_GRANULE != 0)
    FAIL("the block is granule-aligned and sized (addr, size: multiples of 256, size > 0)");
  if (r == NULL || b->addr < r->base || pool_bend(b) > r->base + r->size)
    FAIL("the block lies inside its region");
  if (b->prev != NULL ? b->prev->next != b || pool_bend(b->prev) != b->addr : r->first != b)
    FAIL("the block's neighbour before it touches it (prev->addr + prev->size == addr, "
         "prev->next == block; the first block begins its region's list)");
  if (b->prev == NULL && b->addr != r->base) FAIL("the region's first block begins it");
  if (b->next != NULL ? b->next->prev != b || b->next->addr != pool_bend(b)
                      : pool_bend(b) != r->base + r->size)
    FAIL("the block's neighbour after it touches it (addr + size == next->addr, "
         "next->prev == block; the last block ends its region)");
  return true;
}

bool rmmc__pool_grown_ok(const pool_block_t *b, const pool_owner_t *o, size_t need,
                         bool mapped_only, const char **what) {
  if (!rmmc__pool_block_ok(b, B_FREE, what)) return false;
  if (b->where != W_OUT) FAIL("a growth's block is in no index");
  if (pool_bsize(b) < need) FAIL("a growth's block holds the bytes asked for");
  if (b->owner != NULL && b->owner != o) FAIL("a growth's block is clean or the grower's");
  if (b->region->parent != NULL) FAIL("a growth's block is of a region, not a span");
  if (mapped_only && !pool_segs_cover(b->region, b->addr, pool_bend(b), true, true))
    FAIL("a growth's block is wholly mapped (no gap, no mapping a pause turned off)");
  return true;
}

bool rmmc__pool_hole_ok(const pool_block_t *u, const char **what) {
  if (!rmmc__pool_block_ok(u, B_UNMAPPED, what)) return false;
  if (u->where != W_OUT || u->owner != NULL) FAIL("a hole is in no index and has no owner");
  if (!pool_segs_cover(u->region, u->addr, pool_bend(u), false, true)) FAIL("a hole is on no mapping");
  if ((u->prev != NULL && u->prev->state == B_UNMAPPED) ||
      (u->next != NULL && u->next->state == B_UNMAPPED))
    FAIL("a hole has merged with the holes beside it");
  return true;
}

bool rmmc__pool_heap_empty_ok(const pool_sheap_t *x, const char **what) {
  if (x->used.count != 0 || x->in_use != 0) FAIL("a heap being retired has no block handed out");
  if (x->spans != NULL || x->nspans != 0 || x->nidle != 0)
    FAIL("a heap being retired holds no span");
  if (x->foreign != NULL || x->nforeign != 0 || x->hot != NULL || x->idx.bytes != 0)
    FAIL("a heap being retired has no free or foreign block");
  return true;
}

bool rmmc__pool_span_back_ok(const pool_t *p, const pool_region_t *sp, const char **what) {
  const pool_block_t *f = sp->first, *b = sp->parent;
  if (sp->nused != 0) FAIL("a span going back has no block handed out");
  if (f == NULL || f->addr != sp->base || pool_bsize(f) != sp->size || f->prev != NULL ||
      f->next != NULL || f->state != B_FREE || f->where == W_OUT)
    FAIL("a span going back is one free block, in its heap's index");
  if (b == NULL) FAIL("a span going back has its block in the shared heap");
  if (!rmmc__pool_block_ok(b, B_SPAN, what)) return false;
  if (b->addr != sp->base || pool_bsize(b) != sp->size || sp->size != p->small_chunk ||
      sp->base % p->small_chunk != 0)
    FAIL("a span going back is its shared-heap block, one span in size and alignment");
  return true;
}
