/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's options table (internal name): RMMC_POOL_OPTIONS in
 * include/rmmc/pool_resource.h is the one table, with the manual of each
 * option and the columns of include/rmmc/options.h. The stack-spec table
 * and its builder (spec.c, through rmmc__spec_fill), the help
 * (`rmmc-bench --list`, rmmc_stack_help_resource), the create's integer
 * ranges (apply_options, RMMC__CHECK_OPTION_RANGES) and
 * tests/test_options_tables.c are made from it. Spec keys are what users
 * write (`pool(initial=1GiB, maximum_size=80%)`); where one differs from its
 * field (initial/initial_size, granularity/growth_granularity,
 * page/page_size) both names are public and kept, and the row is where the
 * two meet. Older keys (max, cache) are aliases in src/stack/spec_aliases.c.
 * The builder checks the integers it narrows.
 */
#ifndef RMMC_POOL_OPTIONS_H
#define RMMC_POOL_OPTIONS_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "rmmc/pool_resource.h"

#define RMMC__POOL_OPTIONS(X) RMMC_POOL_OPTIONS(X)

#endif /* RMMC_POOL_OPTIONS_H */
