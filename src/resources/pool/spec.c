/* SPDX-License-Identifier: Apache-2.0 */
/* The pool's entry in the stack-spec table, made from the rows of
 * RMMC_POOL_OPTIONS. A separate object from the core, so a program that
 * makes pools by hand links no spec code. */
#include "base/spec.h"
#include "rmmc/pool_resource.h"

#define POOL_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_pool_options_t, __VA_ARGS__)
static const rmmc__spec_option_t pool_spec_options[] = {
    RMMC_POOL_OPTIONS(POOL_SPEC_ROW){.name = NULL},
};
#undef POOL_SPEC_ROW

static rmmc_status_t pool_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, pool_spec_options, upstream, &o);
  return st == RMMC_SUCCESS ? rmmc_pool_resource_create(upstream, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__pool_spec = {
    .name = "pool",
    .help = "stream-ordered sub-allocator: per-stream heaps over one coalescing address space",
    .needs_upstream = true,
    .options = pool_spec_options,
    .build = pool_build,
};
