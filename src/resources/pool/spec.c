/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's entry in the stack-spec table (src/spec/spec_table.c): its
 * options and the builder that makes a pool from them. A separate object
 * from the core, so a program that makes pools by hand links no spec code.
 */
#include <limits.h>

#include "spec/spec.h"
#include "rmmc/pool_resource.h"

/* ---- stack spec ---- */

static const rmmc__spec_option_t pool_spec_options[] = {
    {"initial", RMMC__OPT_BYTES_PCT, "bytes reserved at creation (default 0)"},
    {"max", RMMC__OPT_BYTES_PCT, "most bytes reserved from the upstream (default: no limit)"},
    {"min_growth", RMMC__OPT_BYTES, "chunks: fewest bytes one growth takes (default 32MiB)"},
    {"granularity", RMMC__OPT_BYTES, "chunks: growth rounded up to this power of two (default 2MiB)"},
    {"small_max", RMMC__OPT_BYTES, "requests up to this size go to the stream heaps (default 1MiB; 0: off)"},
    {"small_chunk", RMMC__OPT_BYTES, "bytes of one span lent to a stream heap (default 4MiB)"},
    {"cache", RMMC__OPT_BYTES, "wholly free span bytes a stream heap keeps (default 8MiB)"},
    {"stream_heaps", RMMC__OPT_INT, "most heaps per stream, for threads sharing one (default: one per CPU up to 64)"},
    {"gc_threshold", RMMC__OPT_DOUBLE, "fraction of max/device memory above which growth gives back first (default 0: off)"},
    {"release_before_grow", RMMC__OPT_BOOL, "keep reserved within the budget before growing (default true)"},
    {"release_slack", RMMC__OPT_DOUBLE, "the budget: reserved within (1 + this) x peak (default 0.02)"},
    {"split_limit", RMMC__OPT_DOUBLE, "chunks: grow rather than split a free chunk this many times the growth (default 8; 0: off)"},
    {"event_interval", RMMC__OPT_INT, "frees per stream between event records, while several streams use the pool (default 1)"},
    {"event_bytes", RMMC__OPT_BYTES, "freed bytes per stream between event records (default 256MiB)"},
    {"expandable", RMMC__OPT_BOOL, "virtual memory (true) or chunks (false); default: virtual memory when the upstream has it"},
    {"page", RMMC__OPT_BYTES, "virtual memory: most bytes one mapping covers (default 32MiB)"},
    {"address_space", RMMC__OPT_BYTES, "virtual memory: bytes of one reservation (default max, else 2x memory)"},
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
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "cache", upstream, &o.cache_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "event_bytes", upstream, &o.event_bytes);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "page", upstream, &o.page_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "address_space", upstream, &o.address_space);
  if (st != RMMC_SUCCESS) return st;
  rmmc__spec_double(args, "gc_threshold", &o.gc_threshold);
  rmmc__spec_bool(args, "release_before_grow", &o.release_before_grow);
  rmmc__spec_double(args, "release_slack", &o.release_slack);
  rmmc__spec_double(args, "split_limit", &o.split_limit);
  bool expandable;
  if (rmmc__spec_bool(args, "expandable", &expandable)) o.expandable = expandable ? 1 : 0;
  long long interval;
  if (rmmc__spec_int(args, "event_interval", &interval)) {
    if (interval < 1 || interval > (long long)UINT_MAX)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "pool: event_interval=%lld is out of range (1 to %u)", interval,
                            UINT_MAX);
    o.event_interval = (unsigned)interval;
  }
  long long heaps;
  if (rmmc__spec_int(args, "stream_heaps", &heaps)) {
    if (heaps < 0 || heaps > 1024)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                            "pool: stream_heaps=%lld is out of range (0 to 1024)", heaps);
    o.stream_heaps = (unsigned)heaps;
  }
  return rmmc_pool_resource_create(upstream, &o, out);
}

const rmmc__spec_entry_t rmmc__pool_spec = {
    .name = "pool",
    .help = "stream-ordered sub-allocator: per-stream heaps over one coalescing address space",
    .needs_upstream = true,
    .options = pool_spec_options,
    .build = pool_build,
};
