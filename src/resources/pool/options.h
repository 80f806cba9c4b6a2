/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's options, once, as data (internal): one row per option of
 * rmmc_pool_options_t (include/rmmc/pool_resource.h, the manual of each).
 * The stack-spec table and its builder (spec.c, through rmmc__spec_fill),
 * the help (`rmmc-bench --list`, rmmc_stack_help_resource) and the test
 * that holds this table against the header's struct and its positional
 * RMMC_POOL_OPTIONS_INIT (tests/test_options_tables.c) are made from it.
 *
 * Columns: field of the struct, spec key, spec type, field type, default
 * (C, the _INIT value), default (as the help says it), min, max (integers:
 * the builder's range check; 0, 0: the field's type), unit, help. Spec keys
 * are what users write (`pool(initial=1GiB, max=80%)`); where one differs
 * from its field (initial/initial_size, max/maximum_size,
 * granularity/growth_granularity, cache/cache_size, page/page_size) both
 * names are public and kept, and this row is where the two meet. Ranges of
 * sizes and fractions are the create's (apply_options), which C callers
 * need too; the builder checks the integers it narrows.
 */
#ifndef RMMC_POOL_OPTIONS_H
#define RMMC_POOL_OPTIONS_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "rmmc/pool_resource.h"

#define RMMC__POOL_OPTIONS(X)                                                                  \
  X(initial_size, "initial", BYTES_PCT, SIZE, 0, "0", 0, 0, "",                                \
    "bytes reserved at creation")                                                              \
  X(maximum_size, "max", BYTES_PCT, SIZE, SIZE_MAX, "no limit", 0, 0, "",                      \
    "most bytes reserved from the upstream")                                                   \
  X(min_growth, "min_growth", BYTES, SIZE, RMMC_POOL_MIN_GROWTH_DEFAULT,                       \
    "chunks 32MiB, virtual memory the shortfall", 0, 0, "", "fewest bytes one growth takes")   \
  X(growth_granularity, "granularity", BYTES, SIZE, (size_t)2 << 20, "2MiB", 0, 0, "",         \
    "chunks: growth rounded up to this power of two")                                          \
  X(small_max, "small_max", BYTES, SIZE, (size_t)1 << 20, "1MiB", 0, 0, "",                    \
    "requests up to this size go to the stream heaps (0: off)")                                \
  X(small_chunk, "small_chunk", BYTES, SIZE, (size_t)4 << 20, "4MiB", 0, 0, "",                \
    "bytes of one span lent to a stream heap")                                                 \
  X(cache_size, "cache", BYTES, SIZE, (size_t)8 << 20, "8MiB", 0, 0, "",                       \
    "wholly free span bytes a stream heap keeps")                                              \
  X(stream_heaps, "stream_heaps", INT, UNSIGNED, 0, "one per CPU up to 64", 0, 1024, "heaps",  \
    "most heaps per stream, for threads sharing one")                                          \
  X(gc_threshold, "gc_threshold", DOUBLE, DOUBLE, 0.0, "0: off", 0, 0, "fraction",             \
    "of max/device memory above which growth gives back first")                                \
  X(release_before_grow, "release_before_grow", BOOL, BOOL, true, "true", 0, 0, "",            \
    "keep reserved within the budget before growing")                                          \
  X(release_slack, "release_slack", DOUBLE, DOUBLE, 0.02, "0.02", 0, 0, "fraction",            \
    "the budget: reserved within (1 + this) x peak")                                           \
  X(split_limit, "split_limit", DOUBLE, DOUBLE, 8.0, "8; 0: off", 0, 0, "times",               \
    "chunks: grow rather than split a free chunk this many times the growth")                  \
  X(event_interval, "event_interval", INT, UNSIGNED, 1, "1", 1, UINT_MAX, "frees",             \
    "frees per stream between event records, while several streams use the pool")             \
  X(event_bytes, "event_bytes", BYTES, SIZE, (size_t)256 << 20, "256MiB", 0, 0, "",            \
    "freed bytes per stream between event records")                                            \
  X(expandable, "expandable", BOOL, INT, -1, "virtual memory when the upstream has it", 0, 0,  \
    "", "virtual memory (true) or chunks (false)")                                             \
  X(page_size, "page", BYTES, SIZE, 0, "32MiB, or the upstream's page if larger", 0, 0, "",    \
    "virtual memory: most bytes one mapping covers")                                           \
  X(address_space, "address_space", BYTES, SIZE, 0, "max, else 2x memory", 0, 0, "",           \
    "virtual memory: bytes of one reservation")                                                \
  X(sync_before_peak, "sync_before_peak", BOOL, BOOL, true, "true", 0, 0, "",                  \
    "wait for streams' unfinished frees before reserved passes its peak")                     \
  X(checkpoint_every, "checkpoint_every", INT, UNSIGNED, 64, "64", 0, 65536, "records",        \
    "sync_before_peak: a checkpoint every this-many-th event record (power of two; 0: none)")  \
  X(release_band, "release_band", DOUBLE, DOUBLE, 4.0, "4", 0, 0, "x slack",                   \
    "steady state: the band past the budget widens from 3 to this while growths give back")

#endif /* RMMC_POOL_OPTIONS_H */
