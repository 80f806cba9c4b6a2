/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda_async resource: CUDA's stream-ordered allocator.
 *
 * Allocates with cudaMallocFromPoolAsync and frees with cudaFreeAsync on
 * the given stream, from a cudaMemPool_t that the resource either creates
 * and owns (with an initial size it reserves at once and a release
 * threshold: memory above it goes back to the driver at synchronization
 * points) or only views (an existing pool such as the device's default,
 * which it never destroys). release_cached synchronizes the device and trims
 * the pool to 0. Alignment above 256 is RMMC_ERROR_NOT_SUPPORTED.
 * Thread-safe.
 */
#ifndef RMMC_CUDA_ASYNC_RESOURCE_H
#define RMMC_CUDA_ASYNC_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuda async options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_CUDA_ASYNC_OPTIONS(X)                                                                 \
  /* bytes reserved at creation (default 0) */                                                     \
  X(size_t, initial_pool_size, 0, 0, 0, "initial", BYTES_PCT, SIZE, "0", "",                       \
    "bytes reserved at creation")                                                                  \
  /* bytes kept cached (default SIZE_MAX: keep all) */                                             \
  X(size_t, release_threshold, SIZE_MAX, 0, 0, "release_threshold", BYTES_PCT, SIZE, "all", "",    \
    "bytes kept cached at synchronization")

typedef struct rmmc_cuda_async_options {
  size_t size; /* sizeof(rmmc_cuda_async_options_t) */
  RMMC_CUDA_ASYNC_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_cuda_async_options_t;

#define RMMC_CUDA_ASYNC_OPTIONS_INIT \
  {sizeof(rmmc_cuda_async_options_t) RMMC_CUDA_ASYNC_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a resource with its own pool on `device` (-1: current); NULL
 * options mean defaults. RMMC_ERROR_NO_DEVICE without a GPU;
 * RMMC_ERROR_NOT_SUPPORTED if the device has no memory pools;
 * RMMC_ERROR_OUT_OF_MEMORY if the initial size cannot be reserved. */
RMMC_EXPORT rmmc_status_t rmmc_cuda_async_resource_create(int device,
                                                          const rmmc_cuda_async_options_t *options,
                                                          rmmc_resource_t **out);

/* Creates a view of an existing pool of `device`; NULL pool views the
 * device's default pool (what plain cudaMallocAsync uses). The pool is not
 * destroyed with the resource. */
RMMC_EXPORT rmmc_status_t rmmc_cuda_async_resource_create_view(int device, cudaMemPool_t pool,
                                                               rmmc_resource_t **out);

/* The pool behind a cuda_async resource (NULL for another kind). */
RMMC_EXPORT cudaMemPool_t rmmc_cuda_async_resource_pool(const rmmc_resource_t *r);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_CUDA_ASYNC_RESOURCE_H */
