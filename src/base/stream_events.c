/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream identities and events (see stream_events.h). The only file of the
 * sub-allocators that calls CUDA's event API, and only for device-accessible
 * memory.
 */
#include "base/stream_events.h"

#include "base/driver.h"

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
  const char *lag = getenv("RMMC_HOST_EVENT_LAG");
  if (s->host && lag != NULL) s->host_lag = strtoull(lag, NULL, 10);
  s->device = r->device;
  s->user_size = user_size;
  rmmc__ptrmap_init(&s->map);
}

void rmmc__stream_set_marks(rmmc__stream_set_t *s, uint32_t shift) {
  s->mark_shift = shift;
}

/* A slot's events (the device current). */
static void slot_events_destroy(rmmc__stream_slot_t *slot) {
  if (slot->event != NULL) (void)cudaEventDestroy(slot->event);
  for (unsigned i = 0; i < RMMC__SLOT_MARKS; i++)
    if (slot->marks[i] != NULL) (void)cudaEventDestroy(slot->marks[i]);
}

/* Mark i's event, made on its first use (the device current), so that a
 * stream that records fewer than 2^mark_shift times (a stream per request)
 * makes none; NULL when it cannot be made (that mark is then skipped). */
static cudaEvent_t mark_event(rmmc__stream_slot_t *slot, unsigned i) {
  cudaEvent_t ev = __atomic_load_n(&slot->marks[i], __ATOMIC_ACQUIRE);
  if (RMMC_LIKELY(ev != NULL)) return ev;
  int mode = rmmc__capture_relax(); /* another thread's capture stays intact */
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  rmmc__capture_restore(mode);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  cudaEvent_t none = NULL;
  if (!__atomic_compare_exchange_n(&slot->marks[i], &none, ev, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    (void)cudaEventDestroy(ev); /* another record made it first */
    ev = none;
  }
  return ev;
}

void rmmc__stream_set_fini(rmmc__stream_set_t *s) {
  int saved = -1;
  bool pushed = !s->host && s->nslots > 0 && rmmc__device_push(s->device, &saved) == RMMC_SUCCESS;
  for (uint32_t i = 0; i < s->nslots; i++) {
    if (pushed) slot_events_destroy(s->slots[i]);
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
    if (!s->host && rmmc__device_push(s->device, &saved) == RMMC_SUCCESS) {
      slot_events_destroy(slot);
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

/* Each CUDA call here goes to the driver when its table is there (the
 * runtime's entry point does not scale with threads: driver.h) and to the
 * runtime otherwise. */

bool rmmc__stream_is_capturing(cudaStream_t stream) {
  const rmmc__driver_t *d = rmmc__driver();
  if (d != NULL) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult res = d->stream_is_capturing((CUstream)stream, &cs);
    if (res == CUDA_SUCCESS) return cs != CU_STREAM_CAPTURE_STATUS_NONE;
    /* No context yet (a default stream on a thread's first call): the
     * runtime's call below makes one. Any other error: the safe answer. */
    if (res != CUDA_ERROR_INVALID_CONTEXT) return true;
  }
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &cs, NULL, NULL, NULL, NULL, NULL);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return cs != cudaStreamCaptureStatusNone;
}

/* The driver's capture modes are the runtime's, value for value. */
int rmmc__capture_relax(void) {
  const rmmc__driver_t *d = rmmc__driver();
  if (d != NULL) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    return d->exchange_capture_mode(&mode) == CUDA_SUCCESS ? (int)mode : -1;
  }
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return (int)mode;
}

void rmmc__capture_restore(int mode) {
  if (mode < 0) return;
  const rmmc__driver_t *d = rmmc__driver();
  if (d != NULL) {
    CUstreamCaptureMode m = (CUstreamCaptureMode)mode;
    (void)d->exchange_capture_mode(&m);
    return;
  }
  enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)mode;
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) (void)cudaGetLastError();
}

/* rmmc__device_push, leaving the thread's error state as it was when it
 * fails (a slow path: the device was not current). */
static rmmc_status_t push_quiet(int device, int *saved) {
  *saved = -1;
  if (rmmc__device_is_current(device)) return RMMC_SUCCESS;
  rmmc__error_state_t e;
  rmmc__error_save(&e);
  rmmc_status_t st = rmmc__device_push(device, saved);
  if (st != RMMC_SUCCESS) rmmc__error_restore(&e);
  return st;
}

/* Records slot's event on `stream` and closes an epoch: the epoch number is
 * taken before the record is issued and published after it, so a free
 * whose tag (taken before the number moved) is at most epoch_recorded was
 * made before an issued record. Declined, with RMMC_ERROR_NOT_SUPPORTED,
 * on a stream being captured (the record would land in the graph).
 * `quiet`: a failure writes no error (the caller goes on without it), so
 * the common case needs no copy of the thread's error state (1 KiB). */
static rmmc_status_t record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                            cudaStream_t stream, bool quiet) {
  int saved = -1;
  if (!s->host) {
    /* The device first: the default streams are the current device's. */
    rmmc_status_t st = quiet ? push_quiet(s->device, &saved) : rmmc__device_push(s->device, &saved);
    if (st != RMMC_SUCCESS) return st;
    if (rmmc__stream_is_capturing(stream)) {
      rmmc__device_pop(saved);
      return quiet ? RMMC_ERROR_NOT_SUPPORTED
                   : rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                                    "stream-ordered free: the stream is being captured into a graph");
    }
  }
  uint64_t e = __atomic_add_fetch(&slot->epoch_next, 1, __ATOMIC_ACQ_REL);
  rmmc__atomic_add_u64(&s->records, 1);
  /* Every 2^mark_shift-th epoch is also a mark: its number is withdrawn
   * while the mark's event moves and published once the record is issued. */
  unsigned m = RMMC__SLOT_MARKS;
  if (RMMC_UNLIKELY(s->mark_shift > 0) && (e & ((UINT64_C(1) << s->mark_shift) - 1)) == 0) {
    m = (unsigned)((e >> s->mark_shift) % RMMC__SLOT_MARKS);
    __atomic_store_n(&slot->mark_epoch[m], 0, __ATOMIC_RELEASE);
  }
  if (!s->host) {
    const rmmc__driver_t *d = rmmc__driver();
    CUresult res = CUDA_SUCCESS;
    cudaError_t err = cudaSuccess;
    if (d != NULL) res = d->event_record((CUevent)slot->event, (CUstream)stream);
    else err = cudaEventRecord(slot->event, stream);
    if (m < RMMC__SLOT_MARKS && res == CUDA_SUCCESS && err == cudaSuccess) {
      cudaEvent_t ev = mark_event(slot, m);
      bool marked = ev != NULL && (d != NULL ? d->event_record((CUevent)ev, (CUstream)stream) == CUDA_SUCCESS
                                             : cudaEventRecord(ev, stream) == cudaSuccess);
      if (!marked) { /* no mark this time: the last record still covers everything */
        if (d == NULL) (void)cudaGetLastError();
        m = RMMC__SLOT_MARKS;
      }
    }
    rmmc__device_pop(saved);
    if (quiet && (res != CUDA_SUCCESS || err != cudaSuccess)) {
      if (err != cudaSuccess) (void)cudaGetLastError();
      return RMMC_ERROR_CUDA;
    }
    if (res != CUDA_SUCCESS) return rmmc__set_driver_error(res, "cuEventRecord (stream-ordered free)");
    if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaEventRecord (stream-ordered free)");
  }
  rmmc__atomic_max_u64(&slot->epoch_recorded, e);
  if (m < RMMC__SLOT_MARKS) __atomic_store_n(&slot->mark_epoch[m], e, __ATOMIC_RELEASE);
  if (s->host && e > s->host_lag) /* no device work to wait for */
    rmmc__atomic_max_u64(&slot->epoch_done, e - s->host_lag);
  __atomic_store_n(&slot->want, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&slot->recorded, true, __ATOMIC_RELEASE);
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__stream_slot_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                       cudaStream_t stream) {
  return record(s, slot, stream, false);
}

bool rmmc__stream_slot_try_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                  cudaStream_t stream) {
  return record(s, slot, stream, true) == RMMC_SUCCESS;
}

bool rmmc__stream_slot_done(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot, uint64_t tag) {
  if (rmmc__stream_slot_known_done(slot, tag)) return true;
  uint64_t rec = __atomic_load_n(&slot->epoch_recorded, __ATOMIC_ACQUIRE);
  if (rec < tag || s->host) return false;
  /* An event needs no current context: the driver's query goes without the
   * device switch. */
  const rmmc__driver_t *d = rmmc__driver();
  bool done;
  int mode = rmmc__capture_relax();
  if (d != NULL) {
    done = d->event_query((CUevent)slot->event) == CUDA_SUCCESS;
  } else {
    int saved;
    if (rmmc__device_push(s->device, &saved) != RMMC_SUCCESS) {
      rmmc__capture_restore(mode);
      return false;
    }
    cudaError_t err = cudaEventQuery(slot->event);
    rmmc__device_pop(saved);
    if (err != cudaSuccess) (void)cudaGetLastError(); /* cudaErrorNotReady, or an error */
    done = err == cudaSuccess;
  }
  rmmc__capture_restore(mode);
  rmmc__atomic_add_u64(&s->queries, 1);
  if (!done) return false; /* not ready, or an error: not finished */
  rmmc__atomic_max_u64(&slot->epoch_done, rec);
  return true;
}

/* Blocks the host until `event`'s last record has finished, then counts
 * epoch `upto` (or more) of slot as known finished. */
static bool finish_at(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot, cudaEvent_t event,
                      uint64_t upto) {
  if (!s->host) {
    if (__atomic_load_n(&rmmc__captures_underway, __ATOMIC_RELAXED) > 0) return false;
    int mode = rmmc__capture_relax(), saved;
    bool done = false;
    if (rmmc__device_push(s->device, &saved) == RMMC_SUCCESS) {
      cudaError_t err = cudaEventSynchronize(event);
      rmmc__device_pop(saved);
      if (err != cudaSuccess) (void)cudaGetLastError();
      done = err == cudaSuccess;
    }
    rmmc__capture_restore(mode);
    if (!done) return false; /* an error: nothing becomes known finished */
  }
  rmmc__atomic_add_u64(&s->finishes, 1);
  rmmc__atomic_max_u64(&slot->epoch_done, upto);
  return true;
}

bool rmmc__stream_slot_finish_mark(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot) {
  uint64_t done = __atomic_load_n(&slot->epoch_done, __ATOMIC_ACQUIRE);
  uint64_t rec = __atomic_load_n(&slot->epoch_recorded, __ATOMIC_ACQUIRE);
  if (done >= rec) return false;
  /* The oldest mark past what is known finished. Its event may have moved
   * on to a later mark meanwhile: the wait is then longer, never wrong. */
  uint64_t best = UINT64_MAX;
  unsigned at = RMMC__SLOT_MARKS;
  for (unsigned i = 0; i < RMMC__SLOT_MARKS; i++) {
    uint64_t e = __atomic_load_n(&slot->mark_epoch[i], __ATOMIC_ACQUIRE);
    if (e > done && e < rec && e < best) {
      best = e;
      at = i;
    }
  }
  if (at == RMMC__SLOT_MARKS) return finish_at(s, slot, slot->event, rec);
  return finish_at(s, slot, __atomic_load_n(&slot->marks[at], __ATOMIC_ACQUIRE), best);
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
  const rmmc__driver_t *d = rmmc__driver();
  if (d != NULL) {
    CUresult res = d->stream_wait_event((CUstream)consumer, (CUevent)producer->event, 0);
    if (res != CUDA_SUCCESS) st = rmmc__set_driver_error(res, "cuStreamWaitEvent (cross-stream reuse)");
  } else {
    cudaError_t err = cudaStreamWaitEvent(consumer, producer->event, 0);
    if (err != cudaSuccess) st = rmmc_set_cuda_error(err, "cudaStreamWaitEvent (cross-stream reuse)");
  }
  rmmc__device_pop(saved);
  return st;
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
#define EMIT_COUNTER(key, counter) rmmc__emit_count(emit, ctx, #key, rmmc__stream_set_##key(s));
  RMMC__STREAM_SET_FIGURES(EMIT_COUNTER)
#undef EMIT_COUNTER
}
