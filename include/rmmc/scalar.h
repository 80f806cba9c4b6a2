/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A single stream-ordered value in device memory (RMM's device_scalar),
 * for results a kernel writes (a count, a flag, a sum) and parameters it
 * reads.
 *
 *   rmmc_scalar_t sum = RMMC_SCALAR_INIT;
 *   rmmc_scalar_create_from(&sum, &(double){0.0}, sizeof(double), stream, NULL);
 *   reduce<<<..., stream>>>(data, n, RMMC_SCALAR_DATA(&sum, double));
 *   double result;
 *   rmmc_scalar_get(&sum, &result, sizeof result);   (waits for the stream)
 *   rmmc_scalar_destroy(&sum);
 *
 * The value is a buffer (buffer.h) of `size` bytes and follows its rules:
 * stream-ordered, on the device the scalar remembers, any memory kind.
 * get and set wait for the stream for the reasons vector.h gives; set_async
 * does not. Not thread-safe: one thread uses a scalar at a time.
 */
#ifndef RMMC_SCALAR_H
#define RMMC_SCALAR_H

#include <stddef.h>

#include "rmmc/buffer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rmmc_scalar {
  rmmc_buffer_t buffer; /* buffer.size is the value's size */
} rmmc_scalar_t;

/* A null scalar. Zeros work too. */
#define RMMC_SCALAR_INIT {RMMC_BUFFER_INIT}

/* The value's device pointer, typed: RMMC_SCALAR_DATA(&s, int). */
#define RMMC_SCALAR_DATA(s, T) ((T *)(s)->buffer.data)

/* Fills *s with an uninitialized value of `size` bytes from `r` (NULL: the
 * current device's resource), ordered on `stream`; on failure *s is left
 * null. RMMC_ERROR_INVALID_ARGUMENT for a NULL s or a size of 0; otherwise
 * as rmmc_buffer_create(). */
RMMC_EXPORT rmmc_status_t rmmc_scalar_create(rmmc_scalar_t *s, size_t size, cudaStream_t stream,
                                             rmmc_resource_t *r);

/* As rmmc_scalar_create(), then sets the value from host memory `value`
 * and waits for the stream (so value may be a temporary).
 * RMMC_ERROR_INVALID_ARGUMENT also for a NULL value; RMMC_ERROR_CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_scalar_create_from(rmmc_scalar_t *s, const void *value, size_t size,
                                                  cudaStream_t stream, rmmc_resource_t *r);

/* Frees the value on its stream with its device current and leaves *s
 * null. NULL and null are no-ops. */
RMMC_EXPORT rmmc_status_t rmmc_scalar_destroy(rmmc_scalar_t *s);

/* Destroys what dst held, moves src's value into dst, leaves src null. */
RMMC_EXPORT rmmc_status_t rmmc_scalar_move(rmmc_scalar_t *dst, rmmc_scalar_t *src);

/* Copies the value into *out (size bytes, which must be the value's size)
 * and waits for the stream. RMMC_ERROR_INVALID_ARGUMENT for a NULL or null
 * scalar, a NULL out or another size; RMMC_ERROR_CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_scalar_get(const rmmc_scalar_t *s, void *out, size_t size);

/* Copies *value (size bytes) into the scalar and waits for the stream, so
 * value may go out of scope on return. Statuses as rmmc_scalar_get(). */
RMMC_EXPORT rmmc_status_t rmmc_scalar_set(rmmc_scalar_t *s, const void *value, size_t size);

/* As rmmc_scalar_set() without waiting: *value must stay valid and
 * unchanged until the stream has reached the copy. */
RMMC_EXPORT rmmc_status_t rmmc_scalar_set_async(rmmc_scalar_t *s, const void *value, size_t size);

/* Moves the scalar to `stream`, ordered after the old one (as
 * rmmc_buffer_set_stream()). */
RMMC_EXPORT rmmc_status_t rmmc_scalar_set_stream(rmmc_scalar_t *s, cudaStream_t stream);

/* The value's device pointer (NULL for a null scalar). */
static inline void *rmmc_scalar_data(const rmmc_scalar_t *s) { return s->buffer.data; }

/* The value's size in bytes (0 for a null scalar). */
static inline size_t rmmc_scalar_size(const rmmc_scalar_t *s) { return s->buffer.size; }

#ifdef __cplusplus
}
#endif

#endif /* RMMC_SCALAR_H */
