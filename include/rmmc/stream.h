/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA streams: a small helper and a stream pool (as RMM's cuda_stream_pool).
 *
 * The helper wraps stream creation, destruction and synchronization in
 * rmmc statuses and adds rmmc_stream_wait(), the one way rmmc orders one
 * stream after another without blocking the host (an event recorded on one
 * stream and waited for by the other). The containers and the plug-ins use
 * it to hand memory from one stream to another.
 *
 * A stream pool creates a fixed number of streams on one device once and
 * hands them out round-robin, so short-lived work can run on separate
 * streams without creating and destroying streams each time.
 *
 * Every call needs a GPU; without one they return RMMC_ERROR_NO_DEVICE.
 */
#ifndef RMMC_STREAM_H
#define RMMC_STREAM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "rmmc/export.h"
#include "rmmc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The number of streams a pool created with count 0 holds (RMM's default). */
#define RMMC_STREAM_POOL_DEFAULT_SIZE 16

/* Creates a stream on the current device with cudaStreamCreateWithFlags;
 * `flags` is cudaStreamDefault (synchronizes with the legacy default
 * stream) or cudaStreamNonBlocking. The caller owns the stream and destroys
 * it with rmmc_stream_destroy().
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL out or other flags;
 * RMMC_ERROR_NO_DEVICE without a GPU; RMMC_ERROR_CUDA if CUDA fails. */
RMMC_EXPORT rmmc_status_t rmmc_stream_create(unsigned int flags, cudaStream_t *out);

/* Destroys a stream made by rmmc_stream_create(). Work already enqueued on
 * it still completes (cudaStreamDestroy's rule). The legacy default stream
 * (NULL), cudaStreamLegacy and cudaStreamPerThread cannot be destroyed:
 * RMMC_ERROR_INVALID_ARGUMENT. RMMC_ERROR_CUDA if CUDA fails. */
RMMC_EXPORT rmmc_status_t rmmc_stream_destroy(cudaStream_t stream);

/* Blocks the calling thread until the work enqueued on `stream` is done.
 * RMMC_ERROR_NO_DEVICE without a GPU; RMMC_ERROR_CUDA if CUDA fails (the
 * error of a kernel that failed on the stream, say). */
RMMC_EXPORT rmmc_status_t rmmc_stream_synchronize(cudaStream_t stream);

/* Makes work enqueued on `waiter` after this call wait until the work
 * enqueued on `waited_on` before this call is done, without blocking the
 * host: records an event on `waited_on` on the current device and makes
 * `waiter` wait for it. Nothing to do (RMMC_SUCCESS) when both are the same
 * stream. Both streams must belong to the current device, or be the NULL /
 * per-thread default stream. RMMC_ERROR_NO_DEVICE without a GPU;
 * RMMC_ERROR_CUDA if CUDA fails. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_stream_wait(cudaStream_t waiter, cudaStream_t waited_on);

/* A fixed set of streams of one device, handed out round-robin. Opaque. */
typedef struct rmmc_stream_pool rmmc_stream_pool_t;

/* Creates `count` streams (0: RMMC_STREAM_POOL_DEFAULT_SIZE) with `flags`
 * (as rmmc_stream_create) on `device` (-1: the current device) and stores
 * the pool in *out. The caller's current device is left as it was. On
 * failure nothing is kept and *out is NULL.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL out, other flags, a bad device id
 * or more than 1024 streams; RMMC_ERROR_NO_DEVICE without a GPU;
 * RMMC_ERROR_OUT_OF_MEMORY without host memory; RMMC_ERROR_CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_stream_pool_create(size_t count, unsigned int flags, int device,
                                                  rmmc_stream_pool_t **out);

/* Destroys every stream of the pool (enqueued work still completes) and
 * the pool. NULL is a no-op. No stream of the pool may be used after. */
RMMC_EXPORT void rmmc_stream_pool_destroy(rmmc_stream_pool_t *pool);

/* The next stream, round-robin (an atomic counter: thread-safe, lock-free).
 * A NULL pool gives NULL (the legacy default stream) and sets the message:
 * a caller's bug, reported rather than a crash. */
RMMC_EXPORT cudaStream_t rmmc_stream_pool_get(rmmc_stream_pool_t *pool);

/* The stream at `index` modulo the pool's size: the same index always gives
 * the same stream (as RMM's get_stream(stream_id)). Thread-safe. */
RMMC_EXPORT cudaStream_t rmmc_stream_pool_get_at(const rmmc_stream_pool_t *pool, size_t index);

/* The number of streams in the pool (0 for NULL, with a message). */
RMMC_EXPORT size_t rmmc_stream_pool_size(const rmmc_stream_pool_t *pool);

/* The device the pool's streams belong to (-1 for NULL, with a message). */
RMMC_EXPORT int rmmc_stream_pool_device(const rmmc_stream_pool_t *pool);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_STREAM_H */
