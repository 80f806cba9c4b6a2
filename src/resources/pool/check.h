/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cheap checks (debug_checks >= 1; check.c): local invariants the slow
 * paths assert as they go, a few loads each on a path that already takes a
 * lock, none on the fast paths. A failed check is a bug or memory
 * corruption: going on would hand out the same memory twice or lose it, so
 * the pool reports it (RMMC_ERROR_INTERNAL, and stderr) and aborts.
 * debug_checks=0 compiles them to nothing.
 */
#ifndef RMMC_POOL_CHECK_H
#define RMMC_POOL_CHECK_H

#include <stdio.h>

#include "pool_internal.h"

/* Reports a broken invariant `what` (the condition's text) about block b
 * (may be NULL) and aborts. */
_Noreturn void rmmc__pool_check_failed(const pool_t *p, const pool_block_t *b, const char *what,
                                       const char *file, int line);

/* The local invariants, each false (with *what set) when broken. b has
 * `state`, is granule-aligned and sized, lies in its region, and its
 * neighbours touch it (prev->addr + prev->size == addr, and they link back). */
bool rmmc__pool_block_ok(const pool_block_t *b, int state, const char **what);
/* A growth's block for owner o: free, in no index, clean or o's, >= need
 * bytes, of a region (not a span), and (`mapped`: a reservation's) wholly
 * on mappings that are on. */
bool rmmc__pool_grown_ok(const pool_block_t *b, const pool_owner_t *o, size_t need, bool mapped,
                         const char **what);
/* vm hole u: unmapped, on no mapping, merged with no hole beside it. */
bool rmmc__pool_hole_ok(const pool_block_t *u, const char **what);
/* A stream heap being retired holds nothing: no block out, no span, no
 * free or foreign block. */
bool rmmc__pool_heap_empty_ok(const pool_sheap_t *x, const char **what);
/* Span sp, wholly free, going back: its one free block covers it, and its
 * parent is the span's block of the shared heap. */
bool rmmc__pool_span_back_ok(const pool_t *p, const pool_region_t *sp, const char **what);

/* In a walk of every invariant (rmmc_pool_resource_check; `msg` and `len`
 * in scope): unless `cond`, writes the message and returns false. */
#define POOL_WALK_CHECK(cond, ...)                                                                 \
  do {                                                                                             \
    if (!(cond)) return (snprintf(msg, len, __VA_ARGS__), false);                                  \
  } while (0)

#if RMMC_DEBUG_CHECKS >= 1
/* Asserts `cond` about block b (may be NULL) of pool p. */
#define POOL_ASSERT(p, b, cond)                                                                    \
  (RMMC_LIKELY(cond) ? (void)0 : rmmc__pool_check_failed((p), (b), #cond, __FILE__, __LINE__))
/* Asserts checker `fn` (rmmc__pool_*_ok above) about block b:
 * POOL_CHECK(p, b, rmmc__pool_block_ok, b, B_FREE). */
#define POOL_CHECK(p, b, fn, ...)                                                                  \
  do {                                                                                             \
    const char *pool_what_ = #fn;                                                                  \
    if (RMMC_UNLIKELY(!fn(__VA_ARGS__, &pool_what_)))                                              \
      rmmc__pool_check_failed((p), (b), pool_what_, __FILE__, __LINE__);                           \
  } while (0)
/* Takes `n` from counter `c` of pool p, asserting it does not underflow. */
#define POOL_SUB(p, c, n)                                                                          \
  do {                                                                                             \
    POOL_ASSERT(p, NULL, (c) >= (n));                                                              \
    (c) -= (n);                                                                                    \
  } while (0)
#else
#define POOL_ASSERT(p, b, cond) ((void)0)
#define POOL_CHECK(p, b, fn, ...) ((void)0)
#define POOL_SUB(p, c, n) ((void)((c) -= (n)))
#endif

#endif /* RMMC_POOL_CHECK_H */
