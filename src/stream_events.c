/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream identities and events (see stream_events.h). The only file of the
 * sub-allocators that calls CUDA's event API, and only for device-accessible
 * memory.
 */
#include "stream_events.h"

#include <stdlib.h>
#include <string.h>

/* A process-unique id per thread, never reused (unlike OS thread ids), so
 * a dead thread's per-thread stream never aliases a new thread's. */
static uint64_t next_thread_uid;
static _Thread_local uint64_t tl_thread_uid;

const void *rmmc__stream_key(cudaStream_t stream) {
  if (stream == NULL || stream == cudaStreamLegacy) return (const void *)(uintptr_t)1;
  if (stream == cudaStreamPerThread) {
    if (RMMC_UNLIKELY(tl_thread_uid == 0))
      tl_thread_uid = __atomic_add_fetch(&next_thread_uid, 1, __ATOMIC_RELAXED);
    /* Bit 63 is never set in a user-space address, so no handle collides. */
    return (const void *)(uintptr_t)((UINT64_C(1) << 63) | tl_thread_uid);
  }
  return (const void *)stream;
}

void rmmc__stream_set_init(rmmc__stream_set_t *s, const rmmc_resource_t *r, size_t user_size) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->lock, NULL);
  s->host = r->kind == RMMC_MEMORY_HOST;
  s->device = r->device;
  s->user_size = user_size;
  rmmc__ptrmap_init(&s->map);
}

void rmmc__stream_set_fini(rmmc__stream_set_t *s) {
  int saved = -1;
  bool pushed = !s->host && s->nslots > 0 && rmmc__device_push(s->device, &saved) == RMMC_SUCCESS;
  for (uint32_t i = 0; i < s->nslots; i++) {
    if (pushed && s->slots[i]->event != NULL) (void)cudaEventDestroy(s->slots[i]->event);
    free(s->slots[i]);
  }
  if (pushed) rmmc__device_pop(saved);
  free(s->slots);
  rmmc__ptrmap_fini(&s->map);
  pthread_mutex_destroy(&s->lock);
}

static rmmc_status_t new_slot(rmmc__stream_set_t *s, cudaStream_t stream, const void *key,
                              rmmc__stream_slot_t **out) {
  if (s->nslots == s->cap) {
    uint32_t cap = s->cap ? s->cap * 2 : 8;
    rmmc__stream_slot_t **a = realloc(s->slots, cap * sizeof *a);
    if (a == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stream slots: no host memory");
    s->slots = a;
    s->cap = cap;
  }
  rmmc__stream_slot_t *slot = calloc(1, RMMC__SLOT_USER_OFFSET + s->user_size);
  if (slot == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stream slot: no host memory");
  slot->stream = stream == cudaStreamLegacy ? NULL : stream;
  slot->id = s->nslots;
  if (!s->host) {
    int saved;
    rmmc_status_t st = rmmc__device_push(s->device, &saved);
    if (st == RMMC_SUCCESS) {
      cudaError_t err = cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming);
      rmmc__device_pop(saved);
      if (err != cudaSuccess) st = rmmc_set_cuda_error(err, "cudaEventCreateWithFlags (stream slot)");
    }
    if (st != RMMC_SUCCESS) {
      free(slot);
      return st;
    }
  }
  if (!rmmc__ptrmap_insert(&s->map, (void *)key, slot, 0)) {
    int saved;
    if (slot->event != NULL && rmmc__device_push(s->device, &saved) == RMMC_SUCCESS) {
      (void)cudaEventDestroy(slot->event);
      rmmc__device_pop(saved);
    }
    free(slot);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stream map: no host memory");
  }
  s->slots[s->nslots] = slot;
  __atomic_store_n(&s->nslots, s->nslots + 1, __ATOMIC_RELEASE);
  *out = slot;
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__stream_set_get(rmmc__stream_set_t *s, cudaStream_t stream,
                                   rmmc__stream_slot_t **out) {
  const void *key = rmmc__stream_key(stream);
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&s->map, key);
  if (e != NULL) *out = e->value;
  else st = new_slot(s, stream, key, out);
  pthread_mutex_unlock(&s->lock);
  return st;
}

int rmmc__captures_underway;

bool rmmc__stream_is_capturing(cudaStream_t stream) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &cs, NULL, NULL, NULL, NULL, NULL);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return cs != cudaStreamCaptureStatusNone;
}

int rmmc__capture_relax(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return (int)mode;
}

void rmmc__capture_restore(int mode) {
  if (mode < 0) return;
  enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)mode;
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) (void)cudaGetLastError();
}

/* Records slot's event on `stream` and closes an epoch: the epoch number is
 * taken before the record is issued and published after it, so a free
 * whose tag (taken before the number moved) is at most epoch_recorded was
 * made before an issued record. Declined, with RMMC_ERROR_NOT_SUPPORTED,
 * on a stream being captured (the record would land in the graph). */
rmmc_status_t rmmc__stream_slot_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                       cudaStream_t stream) {
  if (!s->host && rmmc__stream_is_capturing(stream))
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "stream-ordered free: the stream is being captured into a graph");
  uint64_t e = __atomic_add_fetch(&slot->epoch_next, 1, __ATOMIC_ACQ_REL);
  rmmc__atomic_add_u64(&s->records, 1);
  if (!s->host) {
    int saved;
    rmmc_status_t st = rmmc__device_push(s->device, &saved);
    if (st != RMMC_SUCCESS) return st;
    cudaError_t err = cudaEventRecord(slot->event, stream);
    rmmc__device_pop(saved);
    if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaEventRecord (stream-ordered free)");
  }
  rmmc__atomic_max_u64(&slot->epoch_recorded, e);
  if (s->host) rmmc__atomic_max_u64(&slot->epoch_done, e); /* no device work to wait for */
  __atomic_store_n(&slot->want, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&slot->recorded, true, __ATOMIC_RELEASE);
  return RMMC_SUCCESS;
}

bool rmmc__stream_slot_done(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot, uint64_t tag) {
  if (rmmc__stream_slot_known_done(slot, tag)) return true;
  uint64_t rec = __atomic_load_n(&slot->epoch_recorded, __ATOMIC_ACQUIRE);
  if (rec < tag || s->host) return false;
  int saved;
  if (rmmc__device_push(s->device, &saved) != RMMC_SUCCESS) return false;
  int mode = rmmc__capture_relax();
  cudaError_t err = cudaEventQuery(slot->event);
  rmmc__capture_restore(mode);
  rmmc__device_pop(saved);
  rmmc__atomic_add_u64(&s->queries, 1);
  if (err != cudaSuccess) {
    (void)cudaGetLastError(); /* cudaErrorNotReady, or an error: not finished */
    return false;
  }
  rmmc__atomic_max_u64(&slot->epoch_done, rec);
  return true;
}


bool rmmc__stream_slot_try_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                  cudaStream_t stream) {
  if (s->host) return rmmc__stream_slot_record(s, slot, stream) == RMMC_SUCCESS;
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  if (rmmc__stream_slot_record(s, slot, stream) == RMMC_SUCCESS) return true;
  rmmc__error_restore(&saved);
  return false;
}

rmmc_status_t rmmc__stream_slot_wait(rmmc__stream_set_t *s, const rmmc__stream_slot_t *producer,
                                     cudaStream_t consumer) {
  if (s->host) {
    rmmc__atomic_add_u64(&s->waits, 1);
    return RMMC_SUCCESS;
  }
  if (rmmc__stream_is_capturing(consumer))
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "cross-stream reuse: the stream is being captured into a graph");
  rmmc__atomic_add_u64(&s->waits, 1);
  int saved;
  rmmc_status_t st = rmmc__device_push(s->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamWaitEvent(consumer, producer->event, 0);
  rmmc__device_pop(saved);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaStreamWaitEvent (cross-stream reuse)");
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__stream_set_sync(rmmc__stream_set_t *s) {
  /* The slot array may grow under get(): read it under the set's lock. */
  pthread_mutex_lock(&s->lock);
  uint32_t n = s->nslots;
  uint64_t next[64], *before = n <= 64 ? next : malloc(n * sizeof *before);
  if (before != NULL)
    for (uint32_t i = 0; i < n; i++) /* frees from now on wait for a later epoch */
      before[i] = __atomic_add_fetch(&s->slots[i]->epoch_next, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_unlock(&s->lock);
  if (before == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "device sync: no host memory");
  rmmc_status_t st = RMMC_SUCCESS;
  if (!s->host) {
    if (__atomic_load_n(&rmmc__captures_underway, __ATOMIC_RELAXED) > 0) {
      st = rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "a CUDA graph capture is underway: the device cannot be synchronized");
      goto done;
    }
    int saved;
    st = rmmc__device_push(s->device, &saved);
    if (st != RMMC_SUCCESS) goto done;
    cudaError_t err = cudaDeviceSynchronize();
    rmmc__device_pop(saved);
    if (err != cudaSuccess) {
      st = rmmc_set_cuda_error(err, "cudaDeviceSynchronize (reclaiming freed memory)");
      goto done;
    }
  }
  rmmc__atomic_add_u64(&s->syncs, 1);
  pthread_mutex_lock(&s->lock);
  for (uint32_t i = 0; i < n; i++) rmmc__atomic_max_u64(&s->slots[i]->epoch_done, before[i]);
  pthread_mutex_unlock(&s->lock);
done:
  if (before != next) free(before);
  return st;
}

rmmc_status_t rmmc__stream_set_sync_stream(rmmc__stream_set_t *s, cudaStream_t stream) {
  rmmc__atomic_add_u64(&s->stream_syncs, 1);
  if (s->host) return RMMC_SUCCESS;
  int saved;
  rmmc_status_t st = rmmc__device_push(s->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaStreamSynchronize(stream);
  rmmc__device_pop(saved);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaStreamSynchronize");
  return RMMC_SUCCESS;
}

void rmmc__stream_set_describe(rmmc__stream_set_t *s, rmmc_field_cb emit, void *ctx) {
  rmmc__emit_count(emit, ctx, "streams", rmmc__stream_set_count(s));
  rmmc__emit_count(emit, ctx, "event_records", rmmc__atomic_load_u64(&s->records));
  rmmc__emit_count(emit, ctx, "event_waits", rmmc__atomic_load_u64(&s->waits));
  rmmc__emit_count(emit, ctx, "device_syncs", rmmc__atomic_load_u64(&s->syncs));
  rmmc__emit_count(emit, ctx, "stream_syncs", rmmc__atomic_load_u64(&s->stream_syncs));
  rmmc__emit_count(emit, ctx, "event_queries", rmmc__atomic_load_u64(&s->queries));
}
