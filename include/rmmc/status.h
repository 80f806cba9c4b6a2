/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc status codes and the thread-local error detail.
 *
 * Every fallible rmmc call returns an rmmc_status_t. RMMC_SUCCESS is 0 and
 * every error is negative. The detail of the most recent failure on the
 * calling thread (a human-readable sentence, and for CUDA failures the raw
 * cudaError_t) is kept in thread-local storage and overwritten by the next
 * failure on that thread; successful calls leave it alone.
 */
#ifndef RMMC_STATUS_H
#define RMMC_STATUS_H

#include <cuda_runtime_api.h>

#include "rmmc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, description): the one table behind the enum, the names and
 * the descriptions. Values are stable: append, never renumber. */
#define RMMC_STATUS_MAP(X)                                                     \
  X(SUCCESS, 0, "success")                                                     \
  X(ERROR_INVALID_ARGUMENT, -1, "invalid argument")                            \
  X(ERROR_OUT_OF_MEMORY, -2, "out of memory")                                  \
  X(ERROR_CUDA, -3, "CUDA error")                                              \
  X(ERROR_UNKNOWN_POINTER, -4, "pointer not allocated by this resource")       \
  X(ERROR_NOT_SUPPORTED, -5, "operation not supported")                        \
  X(ERROR_NO_DEVICE, -6, "no CUDA device")                                     \
  X(ERROR_INCOMPATIBLE, -7, "incompatible resources")                          \
  X(ERROR_PARSE, -8, "malformed input")                                        \
  X(ERROR_IO, -9, "input/output error")                                        \
  X(ERROR_IN_USE, -10, "resource in use")                                      \
  X(ERROR_INTERNAL, -11, "internal error")                                    \
  X(ERROR_STALE, -12, "stale handle")

typedef enum rmmc_status {
#define RMMC_STATUS_ENUM_(name, value, text) RMMC_##name = (value),
  RMMC_STATUS_MAP(RMMC_STATUS_ENUM_)
#undef RMMC_STATUS_ENUM_
} rmmc_status_t;

/* The enum constant's name without the prefix ("ERROR_OUT_OF_MEMORY"), or
 * "UNKNOWN_STATUS" for a value outside the table. Never NULL. */
RMMC_EXPORT const char *rmmc_status_name(rmmc_status_t status);

/* A short description ("out of memory"). Never NULL. */
RMMC_EXPORT const char *rmmc_status_string(rmmc_status_t status);

/* The detail of the last failure on this thread: a full sentence naming what
 * failed and why, or "" if nothing has failed on this thread yet. The string
 * belongs to the thread and is valid until its next failing rmmc call. */
RMMC_EXPORT const char *rmmc_last_error_message(void);

/* The cudaError_t of the last failure on this thread that came from CUDA,
 * or cudaSuccess if the last failure did not come from CUDA. */
RMMC_EXPORT cudaError_t rmmc_last_cuda_error(void);

/* Forgets the last error of this thread (message "" and cudaSuccess). */
RMMC_EXPORT void rmmc_clear_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_STATUS_H */
