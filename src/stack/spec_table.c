/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every resource and adaptor the stack-spec parser knows, in the order
 * rmmc_stack_help() lists them. Each entry lives beside its resource's code.
 */
#include "base/spec.h"

extern const rmmc__spec_entry_t rmmc__host_spec, rmmc__cuda_spec, rmmc__managed_spec,
    rmmc__pinned_spec, rmmc__cuda_async_spec;
extern const rmmc__spec_entry_t rmmc__sim_spec;
extern const rmmc__spec_entry_t rmmc__failure_callback_spec;
extern const rmmc__spec_entry_t rmmc__aligned_spec;
extern const rmmc__spec_entry_t rmmc__thread_safe_spec;
extern const rmmc__spec_entry_t rmmc__prefetch_spec;
extern const rmmc__spec_entry_t rmmc__limiting_spec;
extern const rmmc__spec_entry_t rmmc__statistics_spec;
extern const rmmc__spec_entry_t rmmc__tracking_spec;
extern const rmmc__spec_entry_t rmmc__logging_spec;
extern const rmmc__spec_entry_t rmmc__pool_spec;
extern const rmmc__spec_entry_t rmmc__fixed_size_spec;
extern const rmmc__spec_entry_t rmmc__binning_spec;
extern const rmmc__spec_entry_t rmmc__arena_spec;

const rmmc__spec_entry_t *const rmmc__spec_entries[] = {
    /* base resources */
    &rmmc__cuda_spec,
    &rmmc__managed_spec,
    &rmmc__pinned_spec,
    &rmmc__cuda_async_spec,
    &rmmc__host_spec,
    &rmmc__sim_spec,
    /* sub-allocators */
    &rmmc__pool_spec,
    &rmmc__fixed_size_spec,
    &rmmc__binning_spec,
    &rmmc__arena_spec,
    /* adaptors */
    &rmmc__failure_callback_spec,
    &rmmc__aligned_spec,
    &rmmc__thread_safe_spec,
    &rmmc__prefetch_spec,
    &rmmc__limiting_spec,
    &rmmc__statistics_spec,
    &rmmc__tracking_spec,
    &rmmc__logging_spec,
    NULL,
};
