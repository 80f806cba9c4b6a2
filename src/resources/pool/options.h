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

#define RMMC__POOL_OPTIONS(X) RMMC_POOL_OPTIONS(X)

#endif /* RMMC_POOL_OPTIONS_H */
