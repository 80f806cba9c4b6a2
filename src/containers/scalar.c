/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device scalar (see scalar.h): a buffer of one value, its size checked
 * on every access.
 */
#include "base/internal.h"
#include "rmmc/scalar.h"

static rmmc_status_t check_access(const rmmc_scalar_t *s, const void *value, size_t size,
                                  const char *what) {
  if (s == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: scalar is NULL", what);
  if (s->buffer.resource == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: the scalar is null (never created, destroyed or moved from)", what);
  if (value == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: value is NULL", what);
  if (size != s->buffer.size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %zu bytes for a scalar of %zu bytes",
                          what, size, s->buffer.size);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_scalar_create(rmmc_scalar_t *s, size_t size, cudaStream_t stream,
                                          rmmc_resource_t *r) {
  if (s == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "scalar_create: scalar is NULL");
  if (size == 0) {
    s->buffer = (rmmc_buffer_t)RMMC_BUFFER_INIT;
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "scalar_create: size is 0");
  }
  return rmmc_buffer_create(&s->buffer, size, stream, r);
}

RMMC_API rmmc_status_t rmmc_scalar_create_from(rmmc_scalar_t *s, const void *value, size_t size,
                                               cudaStream_t stream, rmmc_resource_t *r) {
  if (s != NULL && value == NULL) {
    s->buffer = (rmmc_buffer_t)RMMC_BUFFER_INIT;
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "scalar_create_from: value is NULL");
  }
  rmmc_status_t st = rmmc_scalar_create(s, size, stream, r);
  if (st == RMMC_SUCCESS) st = rmmc_buffer_copy_from_host(&s->buffer, 0, value, size);
  if (st != RMMC_SUCCESS && s != NULL) (void)rmmc_buffer_destroy(&s->buffer);
  return st;
}

RMMC_API rmmc_status_t rmmc_scalar_destroy(rmmc_scalar_t *s) {
  return s == NULL ? RMMC_SUCCESS : rmmc_buffer_destroy(&s->buffer);
}

RMMC_API rmmc_status_t rmmc_scalar_move(rmmc_scalar_t *dst, rmmc_scalar_t *src) {
  if (dst == NULL || src == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "scalar_move: NULL scalar");
  return rmmc_buffer_move(&dst->buffer, &src->buffer);
}

RMMC_API rmmc_status_t rmmc_scalar_get(const rmmc_scalar_t *s, void *out, size_t size) {
  rmmc_status_t st = check_access(s, out, size, "scalar_get");
  return st == RMMC_SUCCESS ? rmmc_buffer_copy_to_host(&s->buffer, 0, out, size) : st;
}

RMMC_API rmmc_status_t rmmc_scalar_set(rmmc_scalar_t *s, const void *value, size_t size) {
  rmmc_status_t st = check_access(s, value, size, "scalar_set");
  return st == RMMC_SUCCESS ? rmmc_buffer_copy_from_host(&s->buffer, 0, value, size) : st;
}

RMMC_API rmmc_status_t rmmc_scalar_set_async(rmmc_scalar_t *s, const void *value, size_t size) {
  rmmc_status_t st = check_access(s, value, size, "scalar_set_async");
  return st == RMMC_SUCCESS ? rmmc_buffer_copy_from_host_async(&s->buffer, 0, value, size) : st;
}

RMMC_API rmmc_status_t rmmc_scalar_set_stream(rmmc_scalar_t *s, cudaStream_t stream) {
  if (s == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "scalar_set_stream: scalar is NULL");
  return rmmc_buffer_set_stream(&s->buffer, stream);
}
