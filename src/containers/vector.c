/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The typed vector (see vector.h): element counts and sizes checked here,
 * everything else done by the buffer.
 */
#include "base/internal.h"
#include "rmmc/vector.h"

static const rmmc_vector_t null_vector = RMMC_VECTOR_INIT;

/* count * element_size, refusing overflow. */
static rmmc_status_t bytes_of(size_t count, size_t element_size, size_t *bytes, const char *what) {
  if (element_size == 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: element size is 0", what);
  if (count > SIZE_MAX / element_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: %zu elements of %zu bytes overflow size_t", what, count, element_size);
  *bytes = count * element_size;
  return RMMC_SUCCESS;
}

static rmmc_status_t check_live(const rmmc_vector_t *v, const char *what) {
  if (v == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: vector is NULL", what);
  if (v->buffer.resource == NULL || v->element_size == 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: the vector is null (never created, destroyed or moved from)", what);
  return RMMC_SUCCESS;
}

/* Creates the vector, copying from src when `from` (the buffer refuses a
 * NULL src with bytes > 0). */
static rmmc_status_t create(rmmc_vector_t *v, bool from, const void *src, size_t count,
                            size_t element_size, cudaStream_t stream, rmmc_resource_t *r,
                            const char *what) {
  if (v == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: vector is NULL", what);
  *v = null_vector;
  size_t bytes = 0;
  rmmc_status_t st = bytes_of(count, element_size, &bytes, what);
  if (st != RMMC_SUCCESS) return st;
  st = from ? rmmc_buffer_create_from(&v->buffer, src, bytes, stream, r)
            : rmmc_buffer_create(&v->buffer, bytes, stream, r);
  if (st == RMMC_SUCCESS) v->element_size = element_size;
  return st;
}

RMMC_API rmmc_status_t rmmc_vector_create_from(rmmc_vector_t *v, const void *src, size_t count,
                                               size_t element_size, cudaStream_t stream,
                                               rmmc_resource_t *r) {
  return create(v, true, src, count, element_size, stream, r, "vector_create_from");
}

RMMC_API rmmc_status_t rmmc_vector_create(rmmc_vector_t *v, size_t count, size_t element_size,
                                          cudaStream_t stream, rmmc_resource_t *r) {
  return create(v, false, NULL, count, element_size, stream, r, "vector_create");
}

RMMC_API rmmc_status_t rmmc_vector_create_copy(rmmc_vector_t *dst, const rmmc_vector_t *src,
                                               cudaStream_t stream, rmmc_resource_t *r) {
  if (dst == NULL || dst == src)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "vector_create_copy: destination is NULL or the source itself");
  *dst = null_vector;
  rmmc_status_t st = check_live(src, "vector_create_copy (source)");
  if (st == RMMC_SUCCESS) st = rmmc_buffer_create_copy(&dst->buffer, &src->buffer, stream, r);
  if (st == RMMC_SUCCESS) dst->element_size = src->element_size;
  return st;
}

RMMC_API rmmc_status_t rmmc_vector_destroy(rmmc_vector_t *v) {
  if (v == NULL) return RMMC_SUCCESS;
  rmmc_status_t st = rmmc_buffer_destroy(&v->buffer);
  v->element_size = 0;
  return st;
}

RMMC_API rmmc_status_t rmmc_vector_move(rmmc_vector_t *dst, rmmc_vector_t *src) {
  if (dst == NULL || src == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "vector_move: NULL vector");
  if (dst == src) return RMMC_SUCCESS;
  rmmc_status_t st = rmmc_buffer_move(&dst->buffer, &src->buffer);
  dst->element_size = src->element_size;
  src->element_size = 0;
  return st;
}

RMMC_API rmmc_status_t rmmc_vector_resize(rmmc_vector_t *v, size_t count) {
  size_t bytes = 0;
  rmmc_status_t st = check_live(v, "vector_resize");
  if (st == RMMC_SUCCESS) st = bytes_of(count, v->element_size, &bytes, "vector_resize");
  return st == RMMC_SUCCESS ? rmmc_buffer_resize(&v->buffer, bytes) : st;
}

RMMC_API rmmc_status_t rmmc_vector_reserve(rmmc_vector_t *v, size_t count) {
  size_t bytes = 0;
  rmmc_status_t st = check_live(v, "vector_reserve");
  if (st == RMMC_SUCCESS) st = bytes_of(count, v->element_size, &bytes, "vector_reserve");
  return st == RMMC_SUCCESS ? rmmc_buffer_reserve(&v->buffer, bytes) : st;
}

RMMC_API rmmc_status_t rmmc_vector_shrink_to_fit(rmmc_vector_t *v) {
  rmmc_status_t st = check_live(v, "vector_shrink_to_fit");
  return st == RMMC_SUCCESS ? rmmc_buffer_shrink_to_fit(&v->buffer) : st;
}

RMMC_API rmmc_status_t rmmc_vector_set_stream(rmmc_vector_t *v, cudaStream_t stream) {
  rmmc_status_t st = check_live(v, "vector_set_stream");
  return st == RMMC_SUCCESS ? rmmc_buffer_set_stream(&v->buffer, stream) : st;
}

/* Checks one element access: the index, the value pointer and its size. */
static rmmc_status_t check_element(const rmmc_vector_t *v, size_t index, const void *value,
                                   size_t value_size, const char *what) {
  rmmc_status_t st = check_live(v, what);
  if (st != RMMC_SUCCESS) return st;
  if (value == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: value is NULL", what);
  if (value_size != v->element_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: value of %zu bytes for elements of %zu bytes", what, value_size,
                          v->element_size);
  if (index >= rmmc_vector_size(v))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: index %zu is out of range (the vector holds %zu elements)", what,
                          index, rmmc_vector_size(v));
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_vector_get(const rmmc_vector_t *v, size_t index, void *out,
                                       size_t value_size) {
  rmmc_status_t st = check_element(v, index, out, value_size, "vector_get");
  if (st != RMMC_SUCCESS) return st;
  return rmmc_buffer_copy_to_host(&v->buffer, index * v->element_size, out, value_size);
}

RMMC_API rmmc_status_t rmmc_vector_set(rmmc_vector_t *v, size_t index, const void *value,
                                       size_t value_size) {
  rmmc_status_t st = check_element(v, index, value, value_size, "vector_set");
  if (st != RMMC_SUCCESS) return st;
  return rmmc_buffer_copy_from_host(&v->buffer, index * v->element_size, value, value_size);
}

RMMC_API rmmc_status_t rmmc_vector_set_async(rmmc_vector_t *v, size_t index, const void *value,
                                             size_t value_size) {
  rmmc_status_t st = check_element(v, index, value, value_size, "vector_set_async");
  if (st != RMMC_SUCCESS) return st;
  return rmmc_buffer_copy_from_host_async(&v->buffer, index * v->element_size, value, value_size);
}

/* Checks a range of `count` elements from `first` and gives its bytes. */
static rmmc_status_t range_bytes(const rmmc_vector_t *v, size_t first, size_t count,
                                 size_t *offset, size_t *bytes, const char *what) {
  rmmc_status_t st = check_live(v, what);
  if (st != RMMC_SUCCESS) return st;
  size_t n = rmmc_vector_size(v);
  if (first > n || count > n - first)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: elements [%zu, %zu + %zu) are out of range (the vector holds %zu)",
                          what, first, first, count, n);
  *offset = first * v->element_size;
  *bytes = count * v->element_size;
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_vector_copy_to_host(const rmmc_vector_t *v, size_t first, void *dst,
                                                size_t count) {
  size_t offset = 0, bytes = 0;
  rmmc_status_t st = range_bytes(v, first, count, &offset, &bytes, "vector_copy_to_host");
  return st == RMMC_SUCCESS ? rmmc_buffer_copy_to_host(&v->buffer, offset, dst, bytes) : st;
}

RMMC_API rmmc_status_t rmmc_vector_copy_from_host(rmmc_vector_t *v, size_t first,
                                                  const void *src, size_t count) {
  size_t offset = 0, bytes = 0;
  rmmc_status_t st = range_bytes(v, first, count, &offset, &bytes, "vector_copy_from_host");
  return st == RMMC_SUCCESS ? rmmc_buffer_copy_from_host(&v->buffer, offset, src, bytes) : st;
}
