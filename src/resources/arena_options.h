/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource's options, once, as data (internal): one row per option of
 * rmmc_arena_options_t (its public header is the manual of each), with the columns
 * of src/resources/pool/options.h. The spec table and builder beside the
 * arena resource's code, the help and tests/test_options_tables.c (against
 * RMMC_ARENA_OPTIONS_INIT) are made from it.
 * large_cache_size has no row: it is no longer used (arena_resource.h).
 */
#ifndef RMMC_ARENA_OPTIONS_H
#define RMMC_ARENA_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/arena_resource.h"

#define RMMC__ARENA_OPTIONS(X)                                                                     \
  X(superblock_size, "superblock", BYTES, SIZE, (size_t)16 << 20, "16MiB", 0, 0, "",               \
    "span of a stream heap, a power of two; requests up to a quarter of it stay in the heaps")     \
  X(chunk_size, "chunk", BYTES, SIZE, 0, "the pool's", 0, 0, "",                                   \
    "fewest bytes one growth takes from the upstream")                                             \
  X(max_size, "max", BYTES_PCT, SIZE, 0, "no limit", 0, 0, "",                                     \
    "most taken from the upstream")                                                                \
  X(keep_superblocks, "keep", INT, SIZE, 1, "1", 0, LLONG_MAX, "superblocks",                      \
    "wholly free superblocks a stream heap keeps")

#endif /* RMMC_ARENA_OPTIONS_H */
