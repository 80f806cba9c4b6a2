/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aligned adaptor's options, once, as data (internal): one row per option of
 * rmmc_aligned_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * aligned adaptor's code, the help and tests/test_options_tables.c (against
 * RMMC_ALIGNED_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_ALIGNED_OPTIONS_H
#define RMMC_ALIGNED_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/aligned_adaptor.h"

#define RMMC__ALIGNED_OPTIONS(X) RMMC_ALIGNED_OPTIONS(X)

#endif /* RMMC_ALIGNED_OPTIONS_H */
