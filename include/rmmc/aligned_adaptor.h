/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aligned adaptor: larger alignment for large allocations.
 *
 * Allocations of at least `threshold` bytes are aligned to `alignment` (a
 * power of two), smaller ones pass through with the alignment asked for;
 * RMM's aligned_resource_adaptor. Any per-call alignment above 256 is
 * honoured too, over any upstream, including base CUDA resources that give
 * 256 and no more. Such a request is served by over-allocating from the
 * upstream (bytes + alignment - 256, 256-aligned) and handing out the first
 * aligned address inside; the original pointer is kept in a host-side map
 * (the memory itself is never touched, so device memory works), sharded
 * over 16 locks. Requests that need no more than 256 take no lock and cost
 * one compare.
 *
 * Deallocate must be given the bytes and alignment given to allocate (as
 * everywhere): they decide which path the block took. A pointer the map
 * does not hold, or one freed with other bytes or alignment than it was
 * allocated with, is RMMC_ERROR_UNKNOWN_POINTER and changes nothing.
 *
 * Figures (rmmc_resource_describe): RMMC_ALIGNED_FIGURES. Thread-safe.
 */
#ifndef RMMC_ALIGNED_ADAPTOR_H
#define RMMC_ALIGNED_ADAPTOR_H

#include <stddef.h>

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define RMMC_ALIGNED_FIGURES(X)                                                     \
  X(BYTES, alignment, DESCRIBE, "the option alignment")                             \
  X(BYTES, threshold, DESCRIBE, "the option threshold")                             \
  X(COUNT, outstanding, DESCRIBE, "over-allocated blocks live now")                 \
  X(BYTES, overhead, DESCRIBE, "bytes they take beyond what was asked")

/* The aligned options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_ALIGNED_OPTIONS(X)                                                                    \
  /* power of two; below 256 means 256 (default 4096) */                                           \
  X(size_t, alignment, 4096, 0, 0, "alignment", BYTES, SIZE, "4096", "",                           \
    "power of two given to large allocations")                                                     \
  /* allocations of at least this many bytes get it (default 1 MiB; 0: every allocation) */        \
  X(size_t, threshold, (size_t)1 << 20, 0, 0, "threshold", BYTES, SIZE, "1MiB", "",                \
    "allocations of at least this size are aligned")

typedef struct rmmc_aligned_options {
  size_t size; /* sizeof(rmmc_aligned_options_t): set by the INIT macro */
  RMMC_ALIGNED_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_aligned_options_t;

#define RMMC_ALIGNED_OPTIONS_INIT \
  {sizeof(rmmc_aligned_options_t) RMMC_ALIGNED_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates an aligned adaptor over `upstream` (retained); NULL options mean
 * defaults. Stores one reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a
 * NULL upstream or out, options whose size is 0 (not initialized with
 * RMMC_ALIGNED_OPTIONS_INIT) or an alignment that is not a power of two;
 * RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. Allocate adds
 * RMMC_ERROR_INVALID_ARGUMENT for a request that overflows once the
 * alignment slack is added, and RMMC_ERROR_OUT_OF_MEMORY (nothing kept) if
 * the host map cannot grow. */
RMMC_EXPORT rmmc_status_t rmmc_aligned_adaptor_create(rmmc_resource_t *upstream,
                                                      const rmmc_aligned_options_t *options,
                                                      rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_ALIGNED_ADAPTOR_H */
