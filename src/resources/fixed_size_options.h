/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fixed_size resource's options, once, as data (internal): one row per option of
 * rmmc_fixed_size_options_t (its public header is the manual of each), with the columns
 * of src/resources/pool/options.h. The spec table and builder beside the
 * fixed_size resource's code, the help and tests/test_options_tables.c (against
 * RMMC_FIXED_SIZE_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_FIXED_SIZE_OPTIONS_H
#define RMMC_FIXED_SIZE_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/fixed_size_resource.h"

#define RMMC__FIXED_SIZE_OPTIONS(X)                                                                \
  X(block_size, "block", BYTES, SIZE, (size_t)1 << 20, "1MiB", 0, 0, "",                           \
    "bytes per block")                                                                             \
  X(blocks_per_chunk, "blocks_per_chunk", INT, SIZE, 128, "128", 1,                              \
    (long long)RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK, "blocks",                                     \
    "blocks taken from the upstream at a time (a 32-byte host descriptor each)")

#endif /* RMMC_FIXED_SIZE_OPTIONS_H */
