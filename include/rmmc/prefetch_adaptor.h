/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefetch adaptor: managed memory moved to the device as it is
 * allocated.
 *
 * After each allocation from a managed-memory upstream (the managed
 * resource, or a sub-allocator over one) the adaptor enqueues
 * cudaMemPrefetchAsync of the whole block to the upstream's device on the
 * allocating stream, so the first kernel on that stream finds it resident
 * instead of faulting it over page by page (RMM's
 * prefetch_resource_adaptor). The prefetch is ordered on the stream like
 * any work: it has not necessarily happened when allocate returns. If the
 * prefetch cannot be enqueued, the block goes back to the upstream and
 * allocate returns the CUDA failure (RMMC_ERROR_CUDA, or
 * RMMC_ERROR_OUT_OF_MEMORY for cudaErrorMemoryAllocation) with its message.
 *
 * Upstream kinds: managed memory is prefetched; device memory already
 * lives on the device, so the adaptor passes allocations through unchanged
 * (a stack spec may put it over any device stack); host and pinned memory
 * cannot be prefetched and are refused when the adaptor is created.
 *
 * Figures (rmmc_resource_describe): "mode" (text: "prefetch to device N"
 * or "pass-through (device memory)"), "prefetches" (count), "prefetched"
 * (bytes). Deallocate and release_cached pass to the upstream.
 * Thread-safe.
 */
#ifndef RMMC_PREFETCH_ADAPTOR_H
#define RMMC_PREFETCH_ADAPTOR_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a prefetch adaptor over `upstream` (retained) and stores one
 * reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or
 * out; RMMC_ERROR_INCOMPATIBLE for an upstream of host or pinned memory;
 * for managed memory, RMMC_ERROR_NO_DEVICE without a GPU and
 * RMMC_ERROR_NOT_SUPPORTED if the device cannot prefetch (no concurrent
 * managed access); RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_prefetch_adaptor_create(rmmc_resource_t *upstream,
                                                       rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_PREFETCH_ADAPTOR_H */
