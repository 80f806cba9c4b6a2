/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the describe slots, logs and reports print: the fields of a describe
 * callback, byte counts in human units, the thread id RMM's logs show, the
 * host's memory size.
 */
#ifndef RMMC_INTERNAL_FIELDS_H
#define RMMC_INTERNAL_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "rmmc/report.h"

/* Human-readable byte counts: the public rmmc_format_bytes (report.h). */
#define rmmc__format_bytes rmmc_format_bytes

/* Emits one field through a describe callback. */
void rmmc__emit_bytes(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v);
void rmmc__emit_count(rmmc_field_cb emit, void *ctx, const char *key, uint64_t v);
void rmmc__emit_text(rmmc_field_cb emit, void *ctx, const char *key, const char *text);

/* Total physical host memory in bytes (0 if unknown). */
size_t rmmc__host_memory_total(void);

/* The calling thread's operating-system id (gettid on Linux), as RMM's logs
 * and reports show it. Cached per thread: one thread-local load. */
uint64_t rmmc__thread_id(void);

#endif /* RMMC_INTERNAL_FIELDS_H */
