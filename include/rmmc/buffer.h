/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An untyped, stream-ordered, uninitialized memory buffer (RMM's
 * device_buffer).
 *
 * A buffer owns `capacity` bytes from a resource, of which the first `size`
 * are in use. It remembers the resource (retained), the stream its memory
 * is ordered on and the device it belongs to. Every call that touches the
 * memory or the resource makes that device current and restores the
 * caller's device before it returns, so a buffer may be resized or
 * destroyed while another device is current.
 *
 * Stream order. Allocation, the copies that resize, reserve and
 * shrink_to_fit make (cudaMemcpyAsync), and deallocation are all enqueued
 * on the buffer's stream: none of them blocks the host. The calls whose
 * names do not end in _async and that move data to or from host memory
 * wait for the stream before they return, and say so. Changing the stream
 * orders the new stream after the old one (rmmc_stream_wait()), so the
 * memory is never used or freed on the new stream before the old stream's
 * work on it is done.
 *
 * Memory kinds. A buffer accepts every kind of memory: device, managed and
 * pinned memory (device-accessible: copies go through cudaMemcpyAsync with
 * cudaMemcpyDefault, so the other side of a copy may be host or device
 * memory) and host memory (copies use memcpy and no CUDA call is made at
 * all, so the buffer logic runs on machines without a GPU; the other side
 * of a copy must then be host memory, and streams are only remembered). A
 * resource that reports a kind outside rmmc_memory_kind_t is refused with
 * RMMC_ERROR_NOT_SUPPORTED.
 *
 * The struct is the caller's: declare it anywhere (stack, array, inside
 * another struct), initialize it with RMMC_BUFFER_INIT or zeros (a null
 * buffer), fill it with one of the _create calls and free it with
 * rmmc_buffer_destroy(). Its fields are read-only for the caller. A buffer
 * is not thread-safe: one thread uses it at a time.
 */
#ifndef RMMC_BUFFER_H
#define RMMC_BUFFER_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rmmc_buffer {
  void *data;                /* the memory; NULL while capacity is 0 */
  size_t size;               /* bytes in use */
  size_t capacity;           /* bytes allocated */
  cudaStream_t stream;       /* the stream the memory is ordered on */
  rmmc_resource_t *resource; /* retained; NULL for a null buffer */
  int device;                /* made current for the buffer's calls; -1: host memory */
} rmmc_buffer_t;

/* A null buffer: nothing allocated, no resource. Zeros work too. */
#define RMMC_BUFFER_INIT {NULL, 0, 0, NULL, NULL, -1}

/* Fills *b with a buffer of `size` uninitialized bytes from `r` (NULL: the
 * current device's resource, see registry.h), ordered on `stream`. The
 * buffer retains the resource. Whatever *b held is overwritten (destroy a
 * live buffer first); on failure *b is left null.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL b; RMMC_ERROR_NOT_SUPPORTED for a
 * resource of unknown memory kind; the registry's status when r is NULL and
 * there is no resource for the current device; the resource's status
 * (RMMC_ERROR_OUT_OF_MEMORY, ...) when allocation fails. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_create(rmmc_buffer_t *b, size_t size, cudaStream_t stream,
                                             rmmc_resource_t *r);

/* As rmmc_buffer_create(), then copies `size` bytes from `src` into the
 * buffer on `stream` (stream-ordered: the host is not blocked; `src` must
 * stay valid and unchanged until the stream has reached the copy, which
 * pageable host memory guarantees by itself since CUDA stages it).
 * RMMC_ERROR_INVALID_ARGUMENT also for a NULL src with size > 0;
 * RMMC_ERROR_CUDA if the copy cannot be enqueued (nothing is kept). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_create_from(rmmc_buffer_t *b, const void *src, size_t size,
                                                  cudaStream_t stream, rmmc_resource_t *r);

/* Fills *dst with a copy of src's `size` bytes (capacity = size) from `r`
 * (NULL: the current device's resource), ordered on `stream`, which first
 * waits for src's stream. Statuses as rmmc_buffer_create_from(); also
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL src or dst == src. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_create_copy(rmmc_buffer_t *dst, const rmmc_buffer_t *src,
                                                  cudaStream_t stream, rmmc_resource_t *r);

/* Returns the memory to the resource on the buffer's stream (the last one
 * it was given), releases the resource and leaves *b null. The buffer's
 * device is made current for the call, whatever device is current. A null
 * buffer (or NULL) is a no-op. The buffer is left null even when the
 * resource reports an error, which is returned. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_destroy(rmmc_buffer_t *b);

/* Moves src's memory into dst without copying: destroys what dst held
 * first, then dst takes src's memory, resource, stream and device and src
 * is left null. dst == src is a no-op. Returns the status of destroying
 * dst's old memory (the move happens either way);
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL argument. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_move(rmmc_buffer_t *dst, rmmc_buffer_t *src);

/* Sets the size to `size` bytes. Up to the capacity only the size changes
 * (nothing is reallocated, as RMM); above it a new allocation of exactly
 * `size` bytes is made, the old contents are copied into it and the old
 * memory is freed, all on the buffer's stream. The first min(old, new size)
 * bytes are kept; bytes beyond the old size are uninitialized. On failure
 * the buffer is unchanged.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL or null (never created) buffer;
 * the resource's status if allocation fails; RMMC_ERROR_CUDA if the copy
 * cannot be enqueued. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_resize(rmmc_buffer_t *b, size_t size);

/* Makes the capacity at least `capacity` bytes, keeping the size and the
 * contents (reallocating as rmmc_buffer_resize() does). A capacity at or
 * below the current one does nothing. Statuses as rmmc_buffer_resize(). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_reserve(rmmc_buffer_t *b, size_t capacity);

/* Makes the capacity equal to the size, keeping the contents (a size of 0
 * frees the memory). Statuses as rmmc_buffer_resize(). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_shrink_to_fit(rmmc_buffer_t *b);

/* Moves the buffer to `stream`: later calls (and destroy) use it, and
 * `stream` first waits, without blocking the host, for the work enqueued on
 * the old stream (rmmc_stream_wait(); nothing for host memory or without
 * memory). RMMC_ERROR_INVALID_ARGUMENT for a NULL or null buffer;
 * RMMC_ERROR_CUDA if the wait cannot be enqueued (the stream is then left
 * unchanged). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_set_stream(rmmc_buffer_t *b, cudaStream_t stream);

/* Copies `bytes` bytes at `offset` of the buffer to `dst` and waits for the
 * buffer's stream, so dst is ready when the call returns.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL or null buffer, a NULL dst with
 * bytes > 0 or a range that ends beyond the size; RMMC_ERROR_CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_copy_to_host(const rmmc_buffer_t *b, size_t offset,
                                                   void *dst, size_t bytes);

/* As rmmc_buffer_copy_to_host() without waiting: the copy is enqueued on
 * the buffer's stream and dst is ready once the stream has reached it
 * (synchronize the stream before reading dst). Host memory copies at once. */
RMMC_EXPORT rmmc_status_t rmmc_buffer_copy_to_host_async(const rmmc_buffer_t *b, size_t offset,
                                                         void *dst, size_t bytes);

/* Copies `bytes` bytes from `src` to `offset` of the buffer and waits for
 * the buffer's stream, so src may be reused (or go out of scope) at once.
 * Statuses as rmmc_buffer_copy_to_host(). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_copy_from_host(rmmc_buffer_t *b, size_t offset,
                                                     const void *src, size_t bytes);

/* As rmmc_buffer_copy_from_host() without waiting: src must stay valid and
 * unchanged until the stream has reached the copy (pinned memory, or a
 * host value that outlives a later synchronization). */
RMMC_EXPORT rmmc_status_t rmmc_buffer_copy_from_host_async(rmmc_buffer_t *b, size_t offset,
                                                           const void *src, size_t bytes);

/* True for a null buffer: one that holds no resource (never created,
 * destroyed or moved from). A created buffer of size 0 is not null. */
static inline bool rmmc_buffer_is_null(const rmmc_buffer_t *b) {
  return b == NULL || b->resource == NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* RMMC_BUFFER_H */
