/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The binning resource's options, once, as data (internal): one row per option of
 * rmmc_binning_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
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

#define RMMC__BINNING_OPTIONS(X) RMMC_BINNING_OPTIONS(X)

#endif /* RMMC_BINNING_OPTIONS_H */
