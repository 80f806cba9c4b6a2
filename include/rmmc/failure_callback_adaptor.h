/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failure-callback adaptor: reclaim and retry on out of memory.
 *
 * When the upstream returns RMMC_ERROR_OUT_OF_MEMORY, the adaptor asks a
 * callback whether to try again; the callback frees what the host can (drops
 * caches, runs its garbage collector, spills to host) and returns true to
 * retry, false to give up. It is asked again after every failed retry, as
 * long as it returns true, so a callback that can free nothing more must
 * return false (it may count calls through its user_data). This is how
 * CUDA.jl reclaims and retries, how PyTorch frees its cached blocks and
 * retries, and how dask-cuda spills (RMM's failure_callback_resource_adaptor).
 *
 * Other errors pass through untouched and are never retried. When the
 * callback gives up, the call returns RMMC_ERROR_OUT_OF_MEMORY with the
 * message (and raw CUDA error) of the upstream's last failed attempt,
 * unchanged except for "; failure_callback gave up after N retries"
 * appended: whatever the callback did in between does not overwrite it.
 *
 * Deallocate, release_cached and the rest pass straight to the upstream.
 * Figures (rmmc_resource_describe): RMMC_FAILURE_CALLBACK_FIGURES.
 *
 * Thread safety: the adaptor is thread-safe and takes no lock; the callback
 * may be called from several threads at once and must be thread-safe
 * itself. It may allocate and free through any resource, this one included.
 */
#ifndef RMMC_FAILURE_CALLBACK_ADAPTOR_H
#define RMMC_FAILURE_CALLBACK_ADAPTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define RMMC_FAILURE_CALLBACK_FIGURES(X)                                                \
  X(TEXT, on_failure, DESCRIBE, "\"user callback\" or \"release_cached\" (built-in)") \
  X(COUNT, retries, DESCRIBE_IF_SET, "the built-in form's retries (at least 1)")        \
  X(COUNT, callbacks, DESCRIBE, "times the callback was asked")                         \
  X(COUNT, recovered, DESCRIBE, "allocations that succeeded on a retry")                \
  X(COUNT, gave_up, DESCRIBE, "allocations that failed after it declined")

/* Asked after the upstream ran out of memory for a request of `bytes`
 * bytes; returns true to retry the allocation, false to give up. */
typedef bool (*rmmc_failure_cb)(size_t bytes, void *user_data);

/* Creates a failure-callback adaptor over `upstream` (retained) that calls
 * cb(bytes, user_data) on every out-of-memory failure; user_data is
 * borrowed and must stay valid while the adaptor lives. Stores one
 * reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream, cb or
 * out; RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_failure_callback_adaptor_create(rmmc_resource_t *upstream,
                                                               rmmc_failure_cb cb,
                                                               void *user_data,
                                                               rmmc_resource_t **out);

/* Creates the built-in form (the one stack specs build, as
 * `failure_callback(retries=N)`): on out of memory it calls
 * rmmc_resource_release_cached() on the upstream, so that caching layers
 * below give their free memory back, and retries, at most `retries` times
 * per allocation (and stops early if release_cached fails). Place it above
 * the caching layers: `failure_callback > pool > cuda`. `retries` must be
 * at least 1 (RMMC_ERROR_INVALID_ARGUMENT otherwise); other statuses as
 * rmmc_failure_callback_adaptor_create. */
RMMC_EXPORT rmmc_status_t rmmc_failure_callback_adaptor_create_release_cached(
    rmmc_resource_t *upstream, int retries, rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_FAILURE_CALLBACK_ADAPTOR_H */
