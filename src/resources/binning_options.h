/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The binning resource's options, once, as data (internal): one row per option of
 * rmmc_binning_options_t (its public header is the manual of each), with the columns
 * of src/resources/pool/options.h. The spec table and builder beside the
 * binning resource's code, the help and tests/test_options_tables.c (against
 * RMMC_BINNING_OPTIONS_INIT) are made from it.
 * bins= is text (a list of sizes) that binning_build parses into bins and
 * nbins itself: its row has no field type (NONE), and nbins no row.
 */
#ifndef RMMC_BINNING_OPTIONS_H
#define RMMC_BINNING_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/binning_resource.h"

#define RMMC__BINNING_OPTIONS(X)                                                                   \
  X(min_bin, "min", BYTES, SIZE, 256, "256B", 0, 0, "",                                            \
    "smallest power-of-two bin")                                                                   \
  X(max_bin, "max", BYTES, SIZE, (size_t)4 << 20, "4MiB", 0, 0, "",                                \
    "largest power-of-two bin")                                                                    \
  X(bins, "bins", STRING, NONE, NULL, "powers of two from min to max", 0, 0, "",                   \
    "explicit bin sizes, ascending: bins=256B:4KiB:64KiB")                                         \
  X(chunk_size, "chunk", BYTES, SIZE, (size_t)2 << 20, "2MiB", 0, 0, "",                           \
    "upstream bytes per bin chunk (at most 2^20 blocks of a bin)")

#endif /* RMMC_BINNING_OPTIONS_H */
