/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tracking adaptor: knows every allocation outstanding through it.
 *
 * For each allocation it keeps the pointer, size, alignment, stream, the
 * allocating thread and, if asked, the call stack (return addresses taken
 * with backtrace() at allocate time; turned into names only when a report
 * is printed). rmmc_tracking_adaptor_report() lists what is outstanding:
 * at shutdown, that is the list of leaks.
 *
 * Deallocation is checked: a pointer that is not outstanding through the
 * adaptor (never allocated here, or already freed), or a size or alignment
 * other than the one it was allocated with, is refused with
 * RMMC_ERROR_UNKNOWN_POINTER and a message giving the pointer, the size
 * given and the size allocated; the upstream is not called, the allocation
 * stays tracked (so the correct free still works later) and the error is
 * counted (rmmc_tracking_adaptor_get_error_count). If the upstream refuses
 * a free, the allocation stays tracked as well.
 *
 * Bookkeeping is a hash map on the host, split in shards with a lock each,
 * so threads freeing different pointers rarely meet. Thread-safe; streams
 * are recorded and passed to the upstream unchanged.
 *
 * Stack spec: `tracking`, `tracking(backtrace=true, depth=24)`.
 */
#ifndef RMMC_TRACKING_ADAPTOR_H
#define RMMC_TRACKING_ADAPTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h> /* FILE, for the report */

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tracking options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_TRACKING_OPTIONS(X)                                                                   \
  /* capture the call stack of each allocation (default false) */                                  \
  X(bool, backtrace, false, 0, 0, "backtrace", BOOL, BOOL, "false", "",                            \
    "capture each allocation's call stack")                                                        \
  /* most frames kept per allocation, 1..256 (default 16) */                                       \
  X(int, backtrace_depth, 16, 1, 256, "depth", INT, INT, "16", "frames",      \
    "most frames kept per allocation")

typedef struct rmmc_tracking_options {
  size_t size; /* sizeof(rmmc_tracking_options_t) */
  RMMC_TRACKING_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_tracking_options_t;

#define RMMC_TRACKING_OPTIONS_INIT \
  {sizeof(rmmc_tracking_options_t) RMMC_TRACKING_OPTIONS(RMMC_OPTION_DEFAULT)}

/* One outstanding allocation, as rmmc_tracking_adaptor_for_each() shows it.
 * Valid only during the callback. */
typedef struct rmmc_tracked_allocation {
  size_t size;          /* sizeof(rmmc_tracked_allocation_t) of the library */
  void *ptr;
  size_t bytes;         /* as given to allocate */
  size_t alignment;     /* as the upstream got it (at least 256) */
  cudaStream_t stream;  /* the allocating stream */
  uint64_t thread;      /* operating-system id of the allocating thread */
  uint64_t serial;      /* 1 for the adaptor's first allocation, then 2, ... */
  void *const *frames;  /* return addresses, innermost first (NULL without backtrace) */
  int nframes;
} rmmc_tracked_allocation_t;

typedef void (*rmmc_tracked_allocation_cb)(void *ctx, const rmmc_tracked_allocation_t *a);

/* Creates a tracking adaptor over `upstream` (retained); NULL options mean
 * defaults. One reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL
 * upstream or out, or a depth outside 1..256 (with backtrace on or off);
 * RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_tracking_adaptor_create(rmmc_resource_t *upstream,
                                                       const rmmc_tracking_options_t *options,
                                                       rmmc_resource_t **out);

/* The number of allocations outstanding now; 0 (and the thread's error
 * set) if r is not a tracking adaptor. */
RMMC_EXPORT size_t rmmc_tracking_adaptor_get_outstanding_count(const rmmc_resource_t *r);

/* The bytes outstanding now (sizes as given to allocate); 0 (and the error
 * set) if r is not a tracking adaptor. */
RMMC_EXPORT size_t rmmc_tracking_adaptor_get_outstanding_bytes(const rmmc_resource_t *r);

/* The number of deallocations refused so far (unknown pointer, wrong size
 * or alignment); 0 (and the error set) if r is not a tracking adaptor. */
RMMC_EXPORT uint64_t rmmc_tracking_adaptor_get_error_count(const rmmc_resource_t *r);

/* Calls `cb` once for each outstanding allocation, oldest first, on a copy
 * taken shard by shard (allocations made or freed while the copy is taken
 * may or may not appear). No lock is held during the callbacks, which may
 * allocate and free through the adaptor. RMMC_ERROR_INVALID_ARGUMENT if r
 * is not a tracking adaptor or cb is NULL; RMMC_ERROR_OUT_OF_MEMORY if host
 * memory for the copy runs out (no callback is made then). */
RMMC_EXPORT rmmc_status_t rmmc_tracking_adaptor_for_each(rmmc_resource_t *r,
                                                         rmmc_tracked_allocation_cb cb,
                                                         void *ctx);

/* Writes the outstanding allocations to `out` (borrowed), largest first:
 * a summary line with the count and bytes, then one line per allocation
 * (number, pointer, size human-readable and in bytes, alignment, stream,
 * thread) followed, with backtrace on, by its call stack, one symbolized
 * frame per line. RMMC_ERROR_INVALID_ARGUMENT if r is not a tracking
 * adaptor or out is NULL; RMMC_ERROR_IO if writing fails;
 * RMMC_ERROR_OUT_OF_MEMORY as for_each. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_tracking_adaptor_report(rmmc_resource_t *r, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_TRACKING_ADAPTOR_H */
