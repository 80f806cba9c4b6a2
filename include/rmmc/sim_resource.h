/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sim resource: a simulated upstream that hands out address ranges
 * without any memory behind them.
 *
 * It stands in for a device when a workload is larger than the machine it
 * is replayed on (rmmc-replay uses it for logs whose peak does not fit), or
 * when only the bookkeeping of the layers above matters: a pool, arena or
 * limiting layer stacked on sim behaves exactly as on real memory, so its
 * fragmentation and reserved figures are exact, while nothing is mapped.
 *
 * Pointers are NOT dereferenceable. They lie in an address range the process
 * never maps (from 2^48 up, above every user mapping of a 64-bit Linux
 * process with 4-level paging), so reading or writing one faults at once
 * rather than corrupting something. Only stack sim under layers that never
 * touch the memory they manage (every rmmc sub-allocator and adaptor keeps
 * its bookkeeping on the host), and never under containers or code that
 * fills buffers.
 *
 * Ranges never overlap while live; each starts at a multiple of
 * max(alignment asked, the resource's alignment) and its size is counted
 * rounded up to the resource's alignment (the granularity, as a device
 * allocator rounds). A freed range is handed out again to a request of the
 * same rounded size, so the address span stays near the peak for repetitive
 * workloads. Capacity, when set, limits the rounded bytes live at once:
 * beyond it allocate fails with RMMC_ERROR_OUT_OF_MEMORY, as a full device
 * would (without fragmentation of its own: a device maps pages anywhere).
 *
 * Streams: the memory kind is RMMC_MEMORY_HOST, so layers above treat
 * streams as opaque keys and make no CUDA call; sim makes none either, and
 * needs no GPU. Percentages in specs (max=80%) stacked on sim resolve
 * against the host's memory, not the capacity.
 *
 * Figures (rmmc_resource_describe): RMMC_SIM_FIGURES.
 * deallocate checks the pointer and size against what it
 * handed out: RMMC_ERROR_UNKNOWN_POINTER otherwise, changing nothing.
 * Thread-safe (one mutex).
 *
 * Virtual memory (resource.h): pages of 2 MiB (or the alignment, if
 * larger), as a GPU's. Reservations take address space only; a mapped
 * range counts in "in_use"/"reserved" and against the capacity, so a pool
 * with expandable=true over sim reports what it would map on a device.
 * The figures of RMMC_SIM_VM_FIGURES follow once a reservation was made.
 */
#ifndef RMMC_SIM_RESOURCE_H
#define RMMC_SIM_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define RMMC_SIM_FIGURES(X)                                                                        \
  X(BYTES, reserved, DESCRIBE, "rounded bytes live now")                                           \
  X(BYTES, in_use, DESCRIBE, "as reserved")                                                        \
  X(BYTES, peak, DESCRIBE, "the highest in_use")                                                   \
  X(BYTES, limit, DESCRIBE_IF_SET, "the capacity, if set")                                         \
  X(COUNT, outstanding, DESCRIBE, "live ranges")                                                   \
  X(BYTES, span, DESCRIBE, "address space used so far")                                            \
  X(BYTES, granularity, DESCRIBE, "sizes are rounded to this (the option alignment)")              \
  X(COUNT, probes, DESCRIBE, "hash-table slots visited so far: the work its bookkeeping did, a "   \
                             "few per call whatever the number of ranges kept")
/* Then, once a reservation was made (above): */
#define RMMC_SIM_VM_FIGURES(X)                                                                     \
  X(BYTES, address_reserved, DESCRIBE, "address space reserved now")                               \
  X(COUNT, mapped_ranges, DESCRIBE, "ranges mapped now")

/* The sim options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_SIM_OPTIONS(X)                                                                        \
  /* rounded bytes live at once at most (0: no limit) */                                           \
  X(size_t, capacity, 0, 0, 0, "capacity", BYTES, SIZE, "no limit", "",                            \
    "bytes the simulated device holds")                                                            \
  /* granularity: power of two >= 256 (0: 256) */                                                  \
  X(size_t, alignment, RMMC_DEFAULT_ALIGNMENT, 0, 0, "alignment", BYTES, SIZE, "256", "",          \
    "granularity sizes are rounded to")

typedef struct rmmc_sim_options {
  size_t size; /* sizeof(rmmc_sim_options_t) */
  RMMC_SIM_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_sim_options_t;

#define RMMC_SIM_OPTIONS_INIT \
  {sizeof(rmmc_sim_options_t) RMMC_SIM_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a sim resource (one reference in *out); NULL options mean
 * defaults (no capacity limit, 256-byte granularity).
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL out, an options size too small, or
 * an alignment that is not a power of two of at least 256;
 * RMMC_ERROR_OUT_OF_MEMORY if the host has no memory for the bookkeeping. */
RMMC_EXPORT rmmc_status_t rmmc_sim_resource_create(const rmmc_sim_options_t *options,
                                                   rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_SIM_RESOURCE_H */
