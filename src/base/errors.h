/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The error state beyond the public rmmc_set_error (status.h): this thread's
 * message and raw CUDA error saved and restored around code that runs after
 * a failure, the state kept from the start of the outermost allocate,
 * out-of-memory and unknown-pointer messages, and the small formatters the
 * messages use (stream names, resource kinds). Implemented in status.c.
 */
#ifndef RMMC_INTERNAL_ERRORS_H
#define RMMC_INTERNAL_ERRORS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource_ops.h"

/* This thread's error state (message and raw CUDA error), saved so that a
 * layer that runs code of its own after a failure (a failure callback) can
 * hand the original failure back unchanged. */
#define RMMC__MESSAGE_MAX 1024
typedef struct rmmc__error_state {
  char message[RMMC__MESSAGE_MAX];
  cudaError_t cuda_error;
} rmmc__error_state_t;
void rmmc__error_save(rmmc__error_state_t *state);
void rmmc__error_restore(const rmmc__error_state_t *state);
/* The error state as it was when the outermost allocate of this thread
 * began (status.c keeps it at the first failure inside the call): puts it
 * back and returns true, or returns false when nothing inside the call
 * wrote one. Inside the call (depth > 0) it stays kept, to be put back
 * again by the outermost wrapper when the call succeeds; at depth 0 it is
 * then forgotten. */
bool rmmc__error_restore_call_start(void);
/* Forgets it (the call ends with a failure of its own). */
void rmmc__error_forget_call_start(void);

/* Writes this thread's message for rmmc_set_oom_error() (which adds a
 * device's free memory to it); leaves the last CUDA error alone. */
void rmmc__set_oom_message(const rmmc_resource_t *r, size_t bytes, cudaStream_t stream,
                           const char *detail, va_list ap);

/* Appends to this thread's error message. */
void rmmc__append_error(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Records that CUDA refused to free a pointer it does not know:
 * RMMC_ERROR_UNKNOWN_POINTER, keeping err as the last CUDA error. */
rmmc_status_t rmmc__unknown_cuda_pointer(const rmmc_resource_t *r, cudaError_t err,
                                         const char *what, const void *ptr);

/* For the public accessors of one kind of resource: RMMC_SUCCESS if r was
 * made with `ops`, else RMMC_ERROR_INVALID_ARGUMENT with a message naming
 * `what`, the expected kind and the kind r is. */
rmmc_status_t rmmc__check_kind(const rmmc_resource_t *r, const rmmc_resource_ops_t *ops,
                               const char *what);

/* Stream name for messages ("default", "per-thread", or the pointer). */
const char *rmmc__stream_name(cudaStream_t stream, char *buf, size_t len);

#endif /* RMMC_INTERNAL_ERRORS_H */
