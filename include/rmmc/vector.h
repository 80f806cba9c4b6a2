/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A typed, stream-ordered, uninitialized vector (RMM's device_uvector).
 *
 * A vector is a buffer (buffer.h) of elements of one size: any trivially
 * copyable C type (numbers, structs without pointers to host memory). It is
 * created with the element size, and every count is in elements; sizes that
 * overflow (count * element size) are refused. The element memory follows
 * the buffer's rules: stream-ordered, on the device the vector remembers,
 * any memory kind (host memory makes it a CPU-only vector with no CUDA
 * call). Element access checks the index and the element size:
 *
 *   rmmc_vector_t v = RMMC_VECTOR_INIT;
 *   rmmc_vector_create(&v, 1000, sizeof(float), stream, NULL);
 *   float x = 2.5f;
 *   rmmc_vector_set(&v, 7, &x, sizeof x);
 *   rmmc_vector_get(&v, 7, &x, sizeof x);
 *   my_kernel<<<..., stream>>>(RMMC_VECTOR_DATA(&v, float), rmmc_vector_size(&v));
 *   rmmc_vector_destroy(&v);
 *
 * Synchronization. get and set wait for the vector's stream: get because
 * the value must have arrived before it is returned, set because the value
 * usually lives on the caller's stack and must not go out of scope before
 * the copy has read it (cudaMemcpyAsync from pinned memory does not wait).
 * set_async does not wait: the caller keeps the value alive and unchanged
 * until the stream has reached the copy. Nothing else waits.
 *
 * A vector is not thread-safe: one thread uses it at a time. Its fields
 * are read-only for the caller.
 */
#ifndef RMMC_VECTOR_H
#define RMMC_VECTOR_H

#include <stddef.h>

#include "rmmc/buffer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rmmc_vector {
  rmmc_buffer_t buffer; /* the bytes: size = count * element_size */
  size_t element_size;  /* bytes per element; 0 for a null vector */
} rmmc_vector_t;

/* A null vector. Zeros work too. */
#define RMMC_VECTOR_INIT {RMMC_BUFFER_INIT, 0}

/* The elements, typed: RMMC_VECTOR_DATA(&v, float). */
#define RMMC_VECTOR_DATA(v, T) ((T *)rmmc_vector_data(v))

/* Fills *v with `count` uninitialized elements of `element_size` bytes
 * from `r` (NULL: the current device's resource), ordered on `stream`.
 * Whatever *v held is overwritten; on failure *v is left null.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL v, an element size of 0 or a
 * count * element_size that overflows; otherwise as rmmc_buffer_create(). */
RMMC_EXPORT rmmc_status_t rmmc_vector_create(rmmc_vector_t *v, size_t count, size_t element_size,
                                             cudaStream_t stream, rmmc_resource_t *r);

/* As rmmc_vector_create(), then copies `count` elements from `src` (host or
 * device memory) on `stream`, as rmmc_buffer_create_from() does.
 * RMMC_ERROR_INVALID_ARGUMENT also for a NULL src with count > 0. */
RMMC_EXPORT rmmc_status_t rmmc_vector_create_from(rmmc_vector_t *v, const void *src, size_t count,
                                                  size_t element_size, cudaStream_t stream,
                                                  rmmc_resource_t *r);

/* Fills *dst with a copy of src's elements on `stream` (which first waits
 * for src's stream) from `r` (NULL: the current device's resource).
 * Statuses as rmmc_buffer_create_copy(). */
RMMC_EXPORT rmmc_status_t rmmc_vector_create_copy(rmmc_vector_t *dst, const rmmc_vector_t *src,
                                                  cudaStream_t stream, rmmc_resource_t *r);

/* Frees the elements on the vector's stream, with its device current, and
 * leaves *v null (as rmmc_buffer_destroy()). NULL and null are no-ops. */
RMMC_EXPORT rmmc_status_t rmmc_vector_destroy(rmmc_vector_t *v);

/* Destroys what dst held, moves src's elements into dst and leaves src
 * null (as rmmc_buffer_move()). */
RMMC_EXPORT rmmc_status_t rmmc_vector_move(rmmc_vector_t *dst, rmmc_vector_t *src);

/* Sets the number of elements, keeping the first min(old, new) elements;
 * new elements are uninitialized. Reallocates only above the capacity
 * (stream-ordered copy, no host wait). On failure nothing changes.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL or null vector or a count whose
 * size overflows; the resource's status if allocation fails. */
RMMC_EXPORT rmmc_status_t rmmc_vector_resize(rmmc_vector_t *v, size_t count);

/* Makes room for at least `count` elements, keeping the contents. Statuses
 * as rmmc_vector_resize(). */
RMMC_EXPORT rmmc_status_t rmmc_vector_reserve(rmmc_vector_t *v, size_t count);

/* Makes the capacity equal to the size, keeping the contents. */
RMMC_EXPORT rmmc_status_t rmmc_vector_shrink_to_fit(rmmc_vector_t *v);

/* Moves the vector to `stream`, ordered after the old one (as
 * rmmc_buffer_set_stream()). */
RMMC_EXPORT rmmc_status_t rmmc_vector_set_stream(rmmc_vector_t *v, cudaStream_t stream);

/* Copies element `index` into *out (value_size bytes, which must be the
 * element size) and waits for the stream, so *out is ready on return.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL or null vector, a NULL out, an
 * index at or beyond the size or a value_size that is not the element size;
 * RMMC_ERROR_CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_vector_get(const rmmc_vector_t *v, size_t index, void *out,
                                          size_t value_size);

/* Copies *value (value_size bytes, the element size) into element `index`
 * and waits for the stream, so value may go out of scope on return.
 * Statuses as rmmc_vector_get(). */
RMMC_EXPORT rmmc_status_t rmmc_vector_set(rmmc_vector_t *v, size_t index, const void *value,
                                          size_t value_size);

/* As rmmc_vector_set() without waiting: *value must stay valid and
 * unchanged until the vector's stream has reached the copy. */
RMMC_EXPORT rmmc_status_t rmmc_vector_set_async(rmmc_vector_t *v, size_t index, const void *value,
                                                size_t value_size);

/* Copies `count` elements from element `first` to host memory `dst` and
 * waits for the stream. RMMC_ERROR_INVALID_ARGUMENT for a range beyond the
 * size or a NULL dst with count > 0. */
RMMC_EXPORT rmmc_status_t rmmc_vector_copy_to_host(const rmmc_vector_t *v, size_t first,
                                                   void *dst, size_t count);

/* Copies `count` elements from host memory `src` to element `first` and
 * waits for the stream. Statuses as rmmc_vector_copy_to_host(). */
RMMC_EXPORT rmmc_status_t rmmc_vector_copy_from_host(rmmc_vector_t *v, size_t first,
                                                     const void *src, size_t count);

/* The number of elements. */
static inline size_t rmmc_vector_size(const rmmc_vector_t *v) {
  return v->element_size == 0 ? 0 : v->buffer.size / v->element_size;
}

/* The number of elements the memory holds without reallocating. */
static inline size_t rmmc_vector_capacity(const rmmc_vector_t *v) {
  return v->element_size == 0 ? 0 : v->buffer.capacity / v->element_size;
}

/* The elements (NULL while the capacity is 0); see RMMC_VECTOR_DATA. */
static inline void *rmmc_vector_data(const rmmc_vector_t *v) { return v->buffer.data; }

/* The vector's stream. */
static inline cudaStream_t rmmc_vector_stream(const rmmc_vector_t *v) { return v->buffer.stream; }

#ifdef __cplusplus
}
#endif

#endif /* RMMC_VECTOR_H */
