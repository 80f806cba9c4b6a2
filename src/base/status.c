/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Status names and the thread-local error detail.
 *
 * The message buffer and the raw cudaError_t live in thread-local storage:
 * resources are shared between threads, so no error state is kept per
 * object. rmmc_set_error() and friends are the only writers.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/internal.h"
#include "rmmc/report.h"

static _Thread_local char tl_message[RMMC__MESSAGE_MAX];
static _Thread_local cudaError_t tl_cuda_error = cudaSuccess;
_Thread_local int rmmc__call_depth RMMC_TLS_FAST;

/* The error state as it was when the outermost allocate began, kept by the
 * first write inside it (cold: writes are failures), so that the wrapper
 * can put it back when its retry overcomes an out-of-memory: a call that
 * succeeds leaves the state as it was, at no cost to calls that do not
 * fail. The outermost allocate puts it back when it succeeds (a layer's
 * path that overcame a failure of its own, a graph pool's growth past a
 * refused give-back, need not) and forgets it when it fails, so a kept
 * state never outlives its call; a write outside any allocate (depth 0)
 * forgets it too. */
/* The kept state is on the heap (freed at thread exit): the library's
 * thread-local block must stay small enough for the static TLS surplus,
 * which holds all of it once the library is dlopen'ed with an initial-exec
 * variable (internal.h, RMMC_TLS_FAST). Without host memory nothing is
 * kept, and a successful retry leaves the message it overcame. */
static _Thread_local rmmc__error_state_t *tl_call_start;
_Thread_local bool rmmc__call_start_kept RMMC_TLS_FAST;
static pthread_key_t call_start_key;
static pthread_once_t call_start_once = PTHREAD_ONCE_INIT;
static bool call_start_key_made;

/* At thread exit (other keys' destructors may still fail a call after it:
 * they find no buffer and make a new one). */
static void call_start_free(void *b) {
  free(b);
  tl_call_start = NULL;
  rmmc__call_start_kept = false;
}

static void call_start_key_init(void) {
  call_start_key_made = pthread_key_create(&call_start_key, call_start_free) == 0;
}

static rmmc__error_state_t *call_start_buffer(void) {
  if (tl_call_start != NULL) return tl_call_start;
  pthread_once(&call_start_once, call_start_key_init);
  if (!call_start_key_made) return NULL;
  rmmc__error_state_t *b = malloc(sizeof *b);
  if (b != NULL && pthread_setspecific(call_start_key, b) != 0) {
    free(b);
    b = NULL;
  }
  return tl_call_start = b;
}

static void before_write(void) {
  if (rmmc__call_depth == 0) {
    rmmc__call_start_kept = false;
  } else if (!rmmc__call_start_kept) {
    rmmc__error_state_t *b = call_start_buffer();
    if (b == NULL) return;
    memcpy(b->message, tl_message, sizeof tl_message);
    b->cuda_error = tl_cuda_error;
    rmmc__call_start_kept = true;
  }
}

bool rmmc__error_restore_call_start(void) {
  bool kept = rmmc__call_start_kept;
  if (kept) rmmc__error_restore(tl_call_start);
  /* Inside the call it stays kept: a layer's success on the way (a pool's
   * slow path) may be followed by another layer's failure and success, and
   * the state to end the call with is still this one. */
  if (rmmc__call_depth == 0) rmmc__call_start_kept = false;
  return kept;
}

void rmmc__error_forget_call_start(void) { rmmc__call_start_kept = false; }

RMMC_API const char *rmmc_status_name(rmmc_status_t status) {
  switch (status) {
#define RMMC_STATUS_NAME_(name, value, text)                                   \
  case RMMC_##name:                                                            \
    return #name;
    RMMC_STATUS_MAP(RMMC_STATUS_NAME_)
#undef RMMC_STATUS_NAME_
  }
  return "UNKNOWN_STATUS";
}

RMMC_API const char *rmmc_status_string(rmmc_status_t status) {
  switch (status) {
#define RMMC_STATUS_TEXT_(name, value, text)                                   \
  case RMMC_##name:                                                            \
    return text;
    RMMC_STATUS_MAP(RMMC_STATUS_TEXT_)
#undef RMMC_STATUS_TEXT_
  }
  return "unknown status";
}

RMMC_API const char *rmmc_last_error_message(void) { return tl_message; }

RMMC_API cudaError_t rmmc_last_cuda_error(void) { return tl_cuda_error; }

RMMC_API void rmmc_clear_last_error(void) {
  before_write();
  tl_message[0] = '\0';
  tl_cuda_error = cudaSuccess;
}

void rmmc__error_save(rmmc__error_state_t *state) {
  memcpy(state->message, tl_message, sizeof tl_message);
  state->cuda_error = tl_cuda_error;
}

void rmmc__error_restore(const rmmc__error_state_t *state) {
  memcpy(tl_message, state->message, sizeof tl_message);
  tl_cuda_error = state->cuda_error;
}

/* Every writer formats into a local buffer first: a caller may pass the
 * current message as an argument ("...: %s", rmmc_last_error_message()),
 * and formatting into the buffer being read is undefined. */
static void vset_message(const char *fmt, va_list ap) {
  char buf[RMMC__MESSAGE_MAX];
  vsnprintf(buf, sizeof buf, fmt, ap);
  before_write();
  memcpy(tl_message, buf, sizeof buf);
}

static void set_message(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset_message(fmt, ap);
  va_end(ap);
}

/* Appends to the current message (used to add stack figures to an
 * out-of-memory message at the outermost call). */
void rmmc__append_error(const char *fmt, ...) {
  size_t used = strlen(tl_message);
  if (used + 1 >= sizeof tl_message) return;
  char buf[RMMC__MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof tl_message - used, fmt, ap);
  va_end(ap);
  before_write();
  memcpy(tl_message + used, buf, strlen(buf) + 1);
}

RMMC_API rmmc_status_t rmmc_set_error(rmmc_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset_message(fmt, ap);
  va_end(ap);
  tl_cuda_error = cudaSuccess;
  return status;
}

rmmc_status_t rmmc__unknown_cuda_pointer(const rmmc_resource_t *r, cudaError_t err,
                                         const char *what, const void *ptr) {
  (void)cudaGetLastError();
  set_message("%s resource: %s does not know %p (%s)", r->ops->name, what, ptr, cudaGetErrorName(err));
  tl_cuda_error = err;
  return RMMC_ERROR_UNKNOWN_POINTER;
}

RMMC_API rmmc_status_t rmmc_set_cuda_error(cudaError_t err, const char *what) {
  /* Reading the error resets CUDA's non-sticky last error. */
  (void)cudaGetLastError();
  rmmc_status_t status =
      err == cudaErrorMemoryAllocation ? RMMC_ERROR_OUT_OF_MEMORY : RMMC_ERROR_CUDA;
  set_message("%s failed: %s (%s, %d)", what, cudaGetErrorString(err), cudaGetErrorName(err), (int)err);
  tl_cuda_error = err;
  return status;
}

/* The message of rmmc_set_oom_error (device.c, which adds a device's free
 * memory to it, so that this file calls nothing of the library's). */
void rmmc__set_oom_message(const rmmc_resource_t *r, size_t bytes, cudaStream_t stream,
                           const char *detail, va_list ap) {
  char req[32], sbuf[32];
  char msg[RMMC__MESSAGE_MAX];
  int n = snprintf(msg, sizeof msg,
                   "out of memory: %s resource could not allocate %s (%zu bytes) on ",
                   r->ops->name, rmmc__format_bytes(bytes, req, sizeof req), bytes);
  if (r->device >= 0)
    n += snprintf(msg + n, sizeof msg - (size_t)n, "device %d", r->device);
  else
    n += snprintf(msg + n, sizeof msg - (size_t)n, "host memory");
  n += snprintf(msg + n, sizeof msg - (size_t)n, ", stream %s",
                rmmc__stream_name(stream, sbuf, sizeof sbuf));
  if (detail != NULL && (size_t)n + 2 < sizeof msg) {
    n += snprintf(msg + n, sizeof msg - (size_t)n, ": ");
    if ((size_t)n < sizeof msg)
      n += vsnprintf(msg + n, sizeof msg - (size_t)n, detail, ap);
  }
  before_write();
  memcpy(tl_message, msg, sizeof msg);
}

RMMC_API const char *rmmc_format_bytes(uint64_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, len, "%.2f %s", v, units[u]);
  return buf;
}

const char *rmmc__stream_name(cudaStream_t stream, char *buf, size_t len) {
  if (stream == NULL) return "default";
  if (stream == cudaStreamPerThread) return "per-thread";
  if (stream == cudaStreamLegacy) return "legacy";
  snprintf(buf, len, "%p", (void *)stream);
  return buf;
}

size_t rmmc__host_memory_total(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return (size_t)pages * (size_t)page;
}
