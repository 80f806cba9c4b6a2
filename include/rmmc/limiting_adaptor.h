/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The limiting adaptor: a hard cap on the bytes outstanding through it.
 *
 * Every allocation is counted rounded up to its alignment (at least 256
 * bytes, as the memory really taken is). An allocation that would take the
 * count above the limit fails with RMMC_ERROR_OUT_OF_MEMORY before the
 * upstream is asked, with a message naming the limit and the bytes in use.
 * The bytes are reserved with an atomic compare-and-swap before the
 * upstream is called, so the count never exceeds the limit, not even for a
 * moment, however many threads allocate at once; if the upstream then fails,
 * the reservation is given back. The hot path takes no lock.
 *
 * Stack spec: `limiting(limit=4GiB)`; the limit may be a percentage of the
 * upstream device's free memory (of the host's memory for host stacks):
 * `limiting(limit=80%)`.
 *
 * Virtual memory (resource.h) passes through to the upstream, and pages
 * mapped through the adaptor count against the limit like allocations, so
 * `pool(expandable=true) > limiting(limit=40GiB) > cuda` caps what the pool
 * maps.
 *
 * Thread-safe. Streams are passed to the upstream unchanged.
 */
#ifndef RMMC_LIMITING_ADAPTOR_H
#define RMMC_LIMITING_ADAPTOR_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a limiting adaptor over `upstream` (retained) that lets at most
 * `limit` bytes be outstanding through it; one reference in *out.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or out;
 * RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_limiting_adaptor_create(rmmc_resource_t *upstream, size_t limit,
                                                       rmmc_resource_t **out);

/* The limit in bytes; 0 (and the thread's error set to
 * RMMC_ERROR_INVALID_ARGUMENT) if r is not a limiting adaptor. */
RMMC_EXPORT size_t rmmc_limiting_adaptor_get_limit(const rmmc_resource_t *r);

/* The bytes outstanding through the adaptor now, each allocation rounded
 * up to its alignment; 0 (and the error set) if r is not a limiting
 * adaptor. A relaxed read: exact once concurrent calls have returned. */
RMMC_EXPORT size_t rmmc_limiting_adaptor_get_used(const rmmc_resource_t *r);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_LIMITING_ADAPTOR_H */
