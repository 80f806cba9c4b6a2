/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The managed resource's options, once, as data (internal): one row per option of
 * rmmc_managed_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * managed resource's code, the help and tests/test_options_tables.c (against
 * RMMC_MANAGED_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_MANAGED_OPTIONS_H
#define RMMC_MANAGED_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "rmmc/managed_resource.h"

#define RMMC__MANAGED_OPTIONS(X) RMMC_MANAGED_OPTIONS(X)

#endif /* RMMC_MANAGED_OPTIONS_H */
