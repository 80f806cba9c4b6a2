/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The statistics adaptor: counts bytes and allocations through it.
 *
 * It keeps the current, peak and total bytes and counts of what was
 * allocated through it, readable at any time, and a stack of counter
 * scopes with RMM's semantics so that a caller can measure one phase:
 *
 *   rmmc_statistics_adaptor_push(r);          fresh counters from here
 *   ... the phase ...
 *   rmmc_statistics_adaptor_pop(r, &phase);    the phase's figures
 *
 * push starts a fresh set of counters (all 0); the figures read with
 * rmmc_statistics_adaptor_get() are those of the innermost scope. pop ends
 * the innermost scope, returns its figures and merges them into the scope
 * around it: outer current += popped current, outer peak = max(outer peak,
 * outer current before the push + popped peak), totals added. A scope that
 * frees memory allocated before it began sees its current figures go below
 * zero (as in RMM), which is why they are signed. Popped or not, the
 * outermost scope always ends up with the figures of the whole adaptor;
 * describe() reports those at any time (RMMC_STATISTICS_FIGURES below).
 *
 * Scopes that overlap without nesting. Threads that each measure a phase
 * of their own end their scopes in any order: push_scope() hands out an
 * id, and pop_scope() ends that scope wherever it is in the stack. Every
 * scope counts what went through the adaptor, on any thread, from its push
 * to its pop; one that ends under scopes pushed after it merges into the
 * scope it was pushed in (by the rule above), and those scopes keep
 * counting. There are no per-thread counters: a scope's figures are the
 * whole adaptor's over its lifetime.
 *
 * Concurrency. Allocate and deallocate take no lock: each updates the
 * current figures with one atomic instruction and the calling thread's own
 * totals without one; push, pop and get take a mutex among themselves only.
 * A call that returns before push (pop) begins is attributed to the outer
 * (inner) scope; one that runs while push or pop runs may be attributed to
 * either side, never lost and never counted twice in the merged figures.
 * Figures read while other threads allocate are not one snapshot (two
 * fields may be a few calls apart); once those calls have returned they
 * are exact.
 *
 * Limits. The fast path holds the current figures of the whole adaptor in
 * one 64-bit word: up to 4 TiB (2^42 bytes) and 2^19 - 1 allocations
 * outstanding, and allocations under 1 GiB by one lock xadd (larger ones by
 * one CAS). The call that reaches either limit switches the adaptor, once
 * and for good, to an exact slow path (a mutex per call): the figures stay
 * exact and nothing is lost in the switch, only each call costs more.
 * describe() reports "slow_path" 1 once it has switched.
 *
 * A deallocation of more than is outstanding (memory not allocated here,
 * which the upstream accepted) takes the current figures below zero, which
 * the slow path holds: it switches too.
 *
 * Stack spec: `statistics` (no options). Thread-safe; streams are passed to
 * the upstream unchanged.
 */
#ifndef RMMC_STATISTICS_ADAPTOR_H
#define RMMC_STATISTICS_ADAPTOR_H

#include <stdint.h>

#include "rmmc/figures.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The statistics figures (keyed rows of rmmc/figures.h): the members of
 * rmmc_statistics_t, a scope's figures, in order, and what describe()
 * reports, the whole adaptor's, under each row's key, in row order. */
#define RMMC_STATISTICS_FIGURES(X)                                                                 \
  X(BYTES, int64_t, current_bytes, in_use, BOTH, "bytes allocated and not yet freed")              \
  X(BYTES, int64_t, peak_bytes, peak, BOTH, "the highest current_bytes reached")                   \
  X(BYTES, uint64_t, total_bytes, total, BOTH, "bytes ever allocated")                             \
  X(COUNT, int64_t, current_count, outstanding, BOTH, "allocations not yet freed")                 \
  X(COUNT, int64_t, peak_count, peak_outstanding, BOTH, "the highest current_count reached")       \
  X(COUNT, uint64_t, total_count, allocations, BOTH, "allocations ever made (successful ones)")    \
  X(COUNT, uint64_t, deallocations, deallocations, BOTH, "deallocations (successful ones)")        \
  X(COUNT, uint64_t, scopes, scopes, DESCRIBE, "scopes pushed and not popped")                     \
  X(COUNT, uint64_t, slow_path, slow_path, DESCRIBE, "1 once the adaptor took the slow path")

/* Figures of one scope: the BOTH rows above. The caller sets `size`
 * (RMMC_STATISTICS_INIT); rmmc fills the fields that fit in it, so fields
 * can be appended. */
typedef struct rmmc_statistics {
  size_t size; /* sizeof(rmmc_statistics_t), set by the caller */
  RMMC_STATISTICS_FIGURES(RMMC_FIGURE_KEYED_FIELD)
} rmmc_statistics_t;

#define RMMC_STATISTICS_INIT \
  {sizeof(rmmc_statistics_t) RMMC_STATISTICS_FIGURES(RMMC_FIGURE_KEYED_ZERO)}

/* Creates a statistics adaptor over `upstream` (retained); one reference in
 * *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or out;
 * RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_create(rmmc_resource_t *upstream,
                                                         rmmc_resource_t **out);

/* Stores the figures of the innermost scope in *out (as many fields as
 * out->size holds). RMMC_ERROR_INVALID_ARGUMENT if r is not a statistics
 * adaptor, out is NULL or out->size is too small for the first field.
 * Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_get(rmmc_resource_t *r,
                                                      rmmc_statistics_t *out);

/* Starts a fresh scope of counters (all 0) inside the current one.
 * RMMC_ERROR_INVALID_ARGUMENT if r is not a statistics adaptor;
 * RMMC_ERROR_OUT_OF_MEMORY if host memory for the scope runs out (nothing
 * changes). Thread-safe; scopes belong to the adaptor, not to a thread. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_push(rmmc_resource_t *r);

/* Ends the innermost scope: stores its figures in *out (may be NULL) and
 * merges them into the scope around it (see above).
 * RMMC_ERROR_INVALID_ARGUMENT if r is not a statistics adaptor or out->size
 * is too small; RMMC_ERROR_NOT_SUPPORTED when no scope was pushed (the
 * outermost scope cannot be popped; nothing changes). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_pop(rmmc_resource_t *r,
                                                      rmmc_statistics_t *out);

/* Starts a scope as rmmc_statistics_adaptor_push() does and stores its id
 * (never 0) in *id, for rmmc_statistics_adaptor_get_scope() and
 * rmmc_statistics_adaptor_pop_scope(). RMMC_ERROR_INVALID_ARGUMENT if r is
 * not a statistics adaptor or id is NULL; RMMC_ERROR_OUT_OF_MEMORY as
 * push (nothing changes). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_push_scope(rmmc_resource_t *r, uint64_t *id);

/* Stores the figures of the open scope `id` in *out: what went through the
 * adaptor since it was pushed (its peak over that time included), whether
 * or not it is the innermost. RMMC_ERROR_INVALID_ARGUMENT if r is not a
 * statistics adaptor, out is NULL or too small, or no open scope has that
 * id. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_get_scope(rmmc_resource_t *r, uint64_t id,
                                                            rmmc_statistics_t *out);

/* Ends the open scope `id`, wherever it is in the stack: stores its
 * figures in *out (may be NULL) and merges them into the scope it was
 * pushed in; scopes pushed after it stay open, inside that scope.
 * rmmc_statistics_adaptor_pop() ends the innermost scope, whatever its id.
 * RMMC_ERROR_INVALID_ARGUMENT if r is not a statistics adaptor, out is too
 * small, or no open scope has that id (one ended already; nothing
 * changes). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_statistics_adaptor_pop_scope(rmmc_resource_t *r, uint64_t id,
                                                            rmmc_statistics_t *out);

/* The number of scopes pushed and not popped (0 at creation); -1 (and the
 * thread's error set) if r is not a statistics adaptor. */
RMMC_EXPORT int rmmc_statistics_adaptor_get_depth(rmmc_resource_t *r);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_STATISTICS_ADAPTOR_H */
