/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fixed_size resource's options, once, as data (internal): one row per option of
 * rmmc_fixed_size_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * fixed_size resource's code, the help and tests/test_options_tables.c (against
 * RMMC_FIXED_SIZE_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_FIXED_SIZE_OPTIONS_H
#define RMMC_FIXED_SIZE_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/fixed_size_resource.h"

#define RMMC__FIXED_SIZE_OPTIONS(X) RMMC_FIXED_SIZE_OPTIONS(X)

#endif /* RMMC_FIXED_SIZE_OPTIONS_H */
