/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The untyped buffer (see buffer.h).
 *
 * Every operation that touches memory makes the buffer's device current
 * (buffer_enter) and restores the caller's device (buffer_leave). Copies go
 * through copy_bytes(): memcpy for host memory, where no CUDA call may be
 * made, cudaMemcpyAsync on the buffer's stream otherwise. Reallocation
 * (resize, reserve, shrink_to_fit) is written once in reallocate(): the new
 * block is allocated, filled and installed before the old one is returned,
 * so a failure leaves the buffer as it was.
 */
#include <string.h>

#include "containers.h"
#include "rmmc/buffer.h"
#include "rmmc/registry.h"
#include "rmmc/stream.h"

static const rmmc_buffer_t null_buffer = RMMC_BUFFER_INIT;

static bool is_host(const rmmc_resource_t *r) { return r->kind == RMMC_MEMORY_HOST; }

/* The device a buffer on r belongs to: none for host memory, the
 * resource's own device, or the current one for memory of no device
 * (pinned). Unknown kinds are refused. */
static rmmc_status_t device_for(const rmmc_resource_t *r, int *device) {
  switch (r->kind) {
  case RMMC_MEMORY_HOST: *device = -1; return RMMC_SUCCESS;
  case RMMC_MEMORY_DEVICE:
  case RMMC_MEMORY_PINNED:
  case RMMC_MEMORY_MANAGED:
    if (r->device >= 0) {
      *device = r->device;
      return RMMC_SUCCESS;
    }
    return rmmc_get_current_device(device);
  }
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "buffer: the %s resource reports memory kind %d, which a buffer cannot use",
                        r->ops->name, (int)r->kind);
}

static rmmc_status_t buffer_enter(int device, int *saved) {
  *saved = -1;
  return device < 0 ? RMMC_SUCCESS : rmmc__device_push(device, saved);
}

static void buffer_leave(int saved) { rmmc__device_pop(saved); }

/* Copies n bytes, stream-ordered unless host_only; the caller has made the
 * right device current. */
static rmmc_status_t copy_bytes(bool host_only, void *dst, const void *src, size_t n,
                                cudaStream_t stream, const char *what) {
  if (n == 0) return RMMC_SUCCESS;
  if (host_only) {
    memcpy(dst, src, n);
    return RMMC_SUCCESS;
  }
  cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, what);
}

static rmmc_status_t check_live(const rmmc_buffer_t *b, const char *what) {
  if (b == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: buffer is NULL", what);
  if (b->resource == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: the buffer is null (never created, destroyed or moved from)", what);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_buffer_create(rmmc_buffer_t *b, size_t size, cudaStream_t stream,
                                          rmmc_resource_t *r) {
  if (b == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "buffer_create: buffer is NULL");
  *b = null_buffer;
  /* A reference of our own from here on: the registry's may go meanwhile. */
  rmmc_status_t st = RMMC_SUCCESS;
  if (r == NULL) st = rmmc_retain_current_device_resource(&r);
  else rmmc_resource_retain(r);
  int device, saved;
  if (st == RMMC_SUCCESS) st = device_for(r, &device);
  if (st == RMMC_SUCCESS) st = buffer_enter(device, &saved);
  if (st != RMMC_SUCCESS) goto release;
  void *p = NULL;
  st = rmmc_resource_allocate(r, size, RMMC_DEFAULT_ALIGNMENT, stream, &p);
  buffer_leave(saved);
  if (st != RMMC_SUCCESS) goto release;
  b->data = p;
  b->size = b->capacity = size;
  b->stream = stream;
  b->resource = r; /* the reference taken above */
  b->device = device;
  return RMMC_SUCCESS;
release:
  rmmc_resource_release(r);
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_create_from(rmmc_buffer_t *b, const void *src, size_t size,
                                               cudaStream_t stream, rmmc_resource_t *r) {
  if (b != NULL) *b = null_buffer;
  if (src == NULL && size > 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "buffer_create_from: source is NULL with %zu bytes", size);
  rmmc_status_t st = rmmc_buffer_create(b, size, stream, r);
  if (st != RMMC_SUCCESS || size == 0) return st;
  int saved;
  st = buffer_enter(b->device, &saved);
  if (st == RMMC_SUCCESS) {
    st = copy_bytes(is_host(b->resource), b->data, src, size, stream,
                    "buffer_create_from: cudaMemcpyAsync");
    buffer_leave(saved);
  }
  if (st != RMMC_SUCCESS) (void)rmmc_buffer_destroy(b);
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_create_copy(rmmc_buffer_t *dst, const rmmc_buffer_t *src,
                                               cudaStream_t stream, rmmc_resource_t *r) {
  if (dst == NULL || dst == src)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "buffer_create_copy: destination is NULL or the source itself");
  *dst = null_buffer;
  rmmc_status_t st = check_live(src, "buffer_create_copy (source)");
  if (st == RMMC_SUCCESS) st = rmmc_buffer_create(dst, src->size, stream, r);
  if (st != RMMC_SUCCESS || src->size == 0) return st;
  bool dst_host = is_host(dst->resource), src_host = is_host(src->resource);
  int saved;
  st = buffer_enter(dst_host ? src->device : dst->device, &saved);
  if (st != RMMC_SUCCESS) goto destroy_dst;
  /* The source's contents are ordered on its own stream, which may belong
   * to another device. */
  if (!src_host) st = rmmc__stream_wait_from(stream, src->stream, src->device);
  if (st == RMMC_SUCCESS)
    st = copy_bytes(dst_host && src_host, dst->data, src->data, src->size, stream,
                    "buffer_create_copy: cudaMemcpyAsync");
  /* A host buffer is read by the CPU at once: wait for a copy from a device. */
  if (st == RMMC_SUCCESS && dst_host && !src_host) st = rmmc_stream_synchronize(stream);
  buffer_leave(saved);
  if (st == RMMC_SUCCESS) return RMMC_SUCCESS;
destroy_dst:
  (void)rmmc_buffer_destroy(dst);
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_destroy(rmmc_buffer_t *b) {
  if (b == NULL || b->resource == NULL) return RMMC_SUCCESS;
  rmmc_status_t st = RMMC_SUCCESS;
  if (b->data != NULL) {
    int saved;
    st = buffer_enter(b->device, &saved);
    if (st == RMMC_SUCCESS) {
      st = rmmc_resource_deallocate(b->resource, b->data, b->capacity, RMMC_DEFAULT_ALIGNMENT,
                                    b->stream);
      buffer_leave(saved);
    }
  }
  rmmc_resource_release(b->resource);
  *b = null_buffer;
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_move(rmmc_buffer_t *dst, rmmc_buffer_t *src) {
  if (dst == NULL || src == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "buffer_move: NULL buffer");
  if (dst == src) return RMMC_SUCCESS;
  rmmc_status_t st = rmmc_buffer_destroy(dst);
  *dst = *src;
  *src = null_buffer;
  return st;
}

/* Replaces the memory by `capacity` bytes (>= size) holding the same first
 * `size` bytes, on the buffer's stream. On failure nothing changes. */
static rmmc_status_t reallocate(rmmc_buffer_t *b, size_t capacity) {
  int saved;
  rmmc_status_t st = buffer_enter(b->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  void *p = NULL;
  st = rmmc_resource_allocate(b->resource, capacity, RMMC_DEFAULT_ALIGNMENT, b->stream, &p);
  if (st == RMMC_SUCCESS) {
    st = copy_bytes(is_host(b->resource), p, b->data, b->size, b->stream,
                    "buffer reallocation: cudaMemcpyAsync");
    if (st != RMMC_SUCCESS) {
      (void)rmmc_resource_deallocate(b->resource, p, capacity, RMMC_DEFAULT_ALIGNMENT, b->stream);
    } else {
      void *old = b->data;
      size_t old_capacity = b->capacity;
      b->data = p;
      b->capacity = capacity;
      /* Stream-ordered after the copy that read it. */
      st = rmmc_resource_deallocate(b->resource, old, old_capacity, RMMC_DEFAULT_ALIGNMENT,
                                    b->stream);
    }
  }
  buffer_leave(saved);
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_resize(rmmc_buffer_t *b, size_t size) {
  rmmc_status_t st = check_live(b, "buffer_resize");
  if (st != RMMC_SUCCESS) return st;
  if (size > b->capacity) st = reallocate(b, size);
  if (st == RMMC_SUCCESS) b->size = size;
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_reserve(rmmc_buffer_t *b, size_t capacity) {
  rmmc_status_t st = check_live(b, "buffer_reserve");
  if (st != RMMC_SUCCESS || capacity <= b->capacity) return st;
  return reallocate(b, capacity);
}

RMMC_API rmmc_status_t rmmc_buffer_shrink_to_fit(rmmc_buffer_t *b) {
  rmmc_status_t st = check_live(b, "buffer_shrink_to_fit");
  if (st != RMMC_SUCCESS || b->size == b->capacity) return st;
  return reallocate(b, b->size);
}

RMMC_API rmmc_status_t rmmc_buffer_set_stream(rmmc_buffer_t *b, cudaStream_t stream) {
  rmmc_status_t st = check_live(b, "buffer_set_stream");
  if (st != RMMC_SUCCESS) return st;
  if (b->data != NULL && stream != b->stream && !is_host(b->resource)) {
    int saved;
    st = buffer_enter(b->device, &saved);
    if (st != RMMC_SUCCESS) return st;
    st = rmmc_stream_wait(stream, b->stream);
    buffer_leave(saved);
    if (st != RMMC_SUCCESS) return st;
  }
  b->stream = stream;
  return RMMC_SUCCESS;
}

/* Checks a host transfer of `bytes` at `offset`. */
static rmmc_status_t check_range(const rmmc_buffer_t *b, size_t offset, const void *host,
                                 size_t bytes, const char *what) {
  rmmc_status_t st = check_live(b, what);
  if (st != RMMC_SUCCESS) return st;
  if (host == NULL && bytes > 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: host pointer is NULL with %zu bytes",
                          what, bytes);
  if (offset > b->size || bytes > b->size - offset)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: bytes [%zu, %zu + %zu) are out of range: the buffer holds %zu", what,
                          offset, offset, bytes, b->size);
  return RMMC_SUCCESS;
}

/* Copies between the buffer and other memory, then waits for the stream
 * if asked to. to_host: buffer -> other. */
static rmmc_status_t transfer(const rmmc_buffer_t *b, size_t offset, void *other, size_t bytes,
                              bool to_host, bool wait, const char *what) {
  rmmc_status_t st = check_range(b, offset, other, bytes, what);
  if (st != RMMC_SUCCESS || bytes == 0) return st;
  char *mem = (char *)b->data + offset;
  if (is_host(b->resource)) {
    memcpy(to_host ? other : mem, to_host ? (const void *)mem : other, bytes);
    return RMMC_SUCCESS;
  }
  int saved;
  st = buffer_enter(b->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaMemcpyAsync(to_host ? other : mem, to_host ? (const void *)mem : other,
                                    bytes, cudaMemcpyDefault, b->stream);
  if (err != cudaSuccess) st = rmmc_set_cuda_error(err, what);
  else if (wait) st = rmmc_stream_synchronize(b->stream);
  buffer_leave(saved);
  return st;
}

RMMC_API rmmc_status_t rmmc_buffer_copy_to_host(const rmmc_buffer_t *b, size_t offset, void *dst,
                                                size_t bytes) {
  return transfer(b, offset, dst, bytes, true, true, "buffer_copy_to_host");
}

RMMC_API rmmc_status_t rmmc_buffer_copy_to_host_async(const rmmc_buffer_t *b, size_t offset,
                                                      void *dst, size_t bytes) {
  return transfer(b, offset, dst, bytes, true, false, "buffer_copy_to_host_async");
}

RMMC_API rmmc_status_t rmmc_buffer_copy_from_host(rmmc_buffer_t *b, size_t offset,
                                                  const void *src, size_t bytes) {
  return transfer(b, offset, (void *)(uintptr_t)src, bytes, false, true, "buffer_copy_from_host");
}

RMMC_API rmmc_status_t rmmc_buffer_copy_from_host_async(rmmc_buffer_t *b, size_t offset,
                                                        const void *src, size_t bytes) {
  return transfer(b, offset, (void *)(uintptr_t)src, bytes, false, false,
                  "buffer_copy_from_host_async");
}
