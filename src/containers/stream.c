/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Streams: the status-returning helper and the round-robin stream pool.
 *
 * rmmc_stream_wait() is the one place rmmc orders a stream after another
 * (the containers use it when a buffer changes streams, the plug-ins when a
 * block used on another stream is freed). The pool creates its streams once
 * and hands them out through an atomic counter, so get takes no lock.
 */
#include <stdlib.h>

#include "containers.h"
#include "rmmc/stream.h"

#define MAX_POOL_STREAMS 1024

struct rmmc_stream_pool {
  int device;
  size_t count;
  uint64_t next; /* atomic */
  cudaStream_t streams[];
};

static bool flags_ok(unsigned int flags) { return (flags & ~(unsigned int)cudaStreamNonBlocking) == 0; }

static bool is_builtin_stream(cudaStream_t s) {
  return s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

static rmmc_status_t need_gpu(const char *what) {
  if (rmmc__cuda_available()) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "%s: no CUDA device is available", what);
}

RMMC_API rmmc_status_t rmmc_stream_create(unsigned int flags, cudaStream_t *out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stream_create: out is NULL");
  *out = NULL;
  if (!flags_ok(flags))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "stream_create: flags 0x%x (use cudaStreamDefault or cudaStreamNonBlocking)",
                          flags);
  rmmc_status_t st = need_gpu("stream_create");
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamCreateWithFlags(out, flags);
  if (err != cudaSuccess) {
    *out = NULL;
    return rmmc_set_cuda_error(err, "cudaStreamCreateWithFlags");
  }
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_stream_destroy(cudaStream_t stream) {
  if (is_builtin_stream(stream))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "stream_destroy: the default streams cannot be destroyed");
  rmmc_status_t st = need_gpu("stream_destroy");
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamDestroy(stream);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaStreamDestroy");
}

RMMC_API rmmc_status_t rmmc_stream_synchronize(cudaStream_t stream) {
  rmmc_status_t st = need_gpu("stream_synchronize");
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamSynchronize(stream);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaStreamSynchronize");
}

rmmc_status_t rmmc__stream_wait_from(cudaStream_t waiter, cudaStream_t waited_on,
                                     int waited_device) {
  if (waiter == waited_on) return RMMC_SUCCESS;
  rmmc_status_t st = need_gpu("stream_wait");
  if (st != RMMC_SUCCESS) return st;
  int saved;
  st = rmmc__device_push(waited_device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    rmmc__device_pop(saved);
    return rmmc_set_cuda_error(err, "stream_wait: cudaEventCreateWithFlags");
  }
  const char *what = "stream_wait: cudaEventRecord";
  err = cudaEventRecord(ev, waited_on);
  rmmc__device_pop(saved);
  if (err == cudaSuccess) {
    what = "stream_wait: cudaStreamWaitEvent";
    err = cudaStreamWaitEvent(waiter, ev, 0);
  }
  /* The event's resources are freed once the wait is satisfied. */
  cudaError_t derr = cudaEventDestroy(ev);
  if (err == cudaSuccess && derr != cudaSuccess) {
    err = derr;
    what = "stream_wait: cudaEventDestroy";
  }
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, what);
}

RMMC_API rmmc_status_t rmmc_stream_wait(cudaStream_t waiter, cudaStream_t waited_on) {
  return rmmc__stream_wait_from(waiter, waited_on, -1);
}

RMMC_API rmmc_status_t rmmc_stream_pool_create(size_t count, unsigned int flags, int device,
                                               rmmc_stream_pool_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stream_pool_create: out is NULL");
  *out = NULL;
  if (count == 0) count = RMMC_STREAM_POOL_DEFAULT_SIZE;
  if (count > MAX_POOL_STREAMS)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "stream_pool_create: %zu streams (at most %d)", count, MAX_POOL_STREAMS);
  if (!flags_ok(flags))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stream_pool_create: flags 0x%x", flags);
  rmmc_status_t st = need_gpu("stream_pool_create");
  if (st != RMMC_SUCCESS) return st;
  int dev, saved;
  st = rmmc__resolve_device(device, &dev);
  if (st != RMMC_SUCCESS) return st;
  rmmc_stream_pool_t *p = calloc(1, sizeof *p + count * sizeof(cudaStream_t));
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stream_pool_create: no host memory");
  p->device = dev;
  st = rmmc__device_push(dev, &saved);
  if (st != RMMC_SUCCESS) goto free_pool;
  for (; p->count < count; p->count++) {
    cudaError_t err = cudaStreamCreateWithFlags(&p->streams[p->count], flags);
    if (err != cudaSuccess) {
      st = rmmc_set_cuda_error(err, "stream_pool_create: cudaStreamCreateWithFlags");
      goto destroy_streams;
    }
  }
  rmmc__device_pop(saved);
  *out = p;
  return RMMC_SUCCESS;

destroy_streams:
  while (p->count > 0) (void)cudaStreamDestroy(p->streams[--p->count]);
  rmmc__device_pop(saved);
free_pool:
  free(p);
  return st;
}

RMMC_API void rmmc_stream_pool_destroy(rmmc_stream_pool_t *pool) {
  if (pool == NULL) return;
  int saved;
  if (rmmc__device_push(pool->device, &saved) == RMMC_SUCCESS) {
    for (size_t i = 0; i < pool->count; i++) (void)cudaStreamDestroy(pool->streams[i]);
    rmmc__device_pop(saved);
  }
  free(pool);
}

/* The accessors answer a NULL pool with a neutral value (the legacy
 * default stream, 0 streams, device -1) and a message rather than a crash. */
static bool pool_ok(const rmmc_stream_pool_t *pool, const char *what) {
  if (RMMC_LIKELY(pool != NULL)) return true;
  (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: stream pool is NULL", what);
  return false;
}

RMMC_API cudaStream_t rmmc_stream_pool_get(rmmc_stream_pool_t *pool) {
  if (!pool_ok(pool, "stream_pool_get")) return NULL;
  uint64_t i = __atomic_fetch_add(&pool->next, 1, __ATOMIC_RELAXED);
  return pool->streams[i % pool->count];
}

RMMC_API cudaStream_t rmmc_stream_pool_get_at(const rmmc_stream_pool_t *pool, size_t index) {
  if (!pool_ok(pool, "stream_pool_get_at")) return NULL;
  return pool->streams[index % pool->count];
}

RMMC_API size_t rmmc_stream_pool_size(const rmmc_stream_pool_t *pool) {
  return pool_ok(pool, "stream_pool_size") ? pool->count : 0;
}

RMMC_API int rmmc_stream_pool_device(const rmmc_stream_pool_t *pool) {
  return pool_ok(pool, "stream_pool_device") ? pool->device : -1;
}
