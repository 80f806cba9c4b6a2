/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource's options, once, as data (internal): one row per option of
 * rmmc_arena_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * arena resource's code, the help and tests/test_options_tables.c (against
 * RMMC_ARENA_OPTIONS_INIT) are made from it.
 * large_cache_size has no row: it is no longer used (arena_resource.h).
 */
#ifndef RMMC_ARENA_OPTIONS_H
#define RMMC_ARENA_OPTIONS_H

#include <limits.h>
#include <stdint.h>

#include "rmmc/arena_resource.h"

#define RMMC__ARENA_OPTIONS(X) RMMC_ARENA_OPTIONS(X)

#endif /* RMMC_ARENA_OPTIONS_H */
