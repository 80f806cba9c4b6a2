/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The binning resource: size classes served by fixed_size bins, larger
 * requests by the upstream.
 *
 * A request goes to the smallest bin whose block holds it (and whose
 * blocks are aligned enough); each bin is a fixed_size resource over the
 * binning's upstream, so its blocks come in chunks from the upstream and
 * are reused in O(1). Requests above the largest bin go to the upstream
 * itself: in practice `binning > pool > cuda`, bins for the many small
 * requests and the coalescing pool for the large ones. The bin is found in
 * O(1) (a table indexed by the request's power of two, then at most the
 * few bins of that octave). deallocate routes by size and alignment the
 * same way, so it must be given the size allocate was given.
 *
 * Bins. Either powers of two from min_bin to max_bin (default 256 B to
 * 4 MiB: 15 bins), or an explicit ascending list (each rounded up to a
 * multiple of 256). Default rationale: rmmc aligns to 256 bytes, so no
 * smaller bin is useful; the top is RMM's (2^22, whose bins start at
 * 256 KiB, so small requests there all take 256 KiB). Up to 4 MiB requests
 * are numerous and a free list beats a coalescing search; rounding wastes
 * at most half a block (a quarter on average), which above 4 MiB starts to
 * cost more than the pool's exact sizing saves in time. Each bin takes
 * chunks of max(1, chunk_size / bin) blocks, at most
 * RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK (2^20: a chunk's host descriptors
 * and the time to make them follow its blocks, so a large chunk_size costs
 * a small bin no more than 32 MiB and a few milliseconds per chunk)
 * (default 2 MiB of blocks per chunk).
 *
 * Stream order, thread safety and bad input: those of fixed_size for
 * binned sizes (see fixed_size_resource.h), the upstream's for the rest.
 * A wrong size that routes to another bin than the block's is caught there
 * (RMMC_ERROR_UNKNOWN_POINTER); one that routes to the upstream is for the
 * upstream to catch. Thread-safe: bins lock separately, routing takes no
 * lock. CUDA graph pools below work through it: the bins pass routed
 * calls to the upstream (fixed_size_resource.h), as larger sizes go; so do
 * they every call while a pool below is paused (pool_resource.h, "Sleep
 * mode"), which the pool refuses.
 *
 * release_cached releases every bin's wholly free chunks, then forwards to
 * the upstream once. describe: the rows of RMMC_BINNING_HEAD_FIGURES, then
 * per bin, smallest first, those of RMMC_BINNING_BIN_FIGURES keyed
 * "bin_<bytes>_<name>" (e.g. bin_4096_in_use), then those of
 * RMMC_BINNING_FIGURES, then event_records, event_waits, device_syncs and
 * stream_syncs summed over the bins.
 */
#ifndef RMMC_BINNING_RESOURCE_H
#define RMMC_BINNING_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What describe reports, in the order above (rmmc/figures.h: the rows). */
#define RMMC_BINNING_HEAD_FIGURES(X) X(COUNT, bins, DESCRIBE, "bins")
#define RMMC_BINNING_BIN_FIGURES(X)                                                                \
  X(BYTES, reserved, DESCRIBE, "bytes the bin took from the upstream")                             \
  X(BYTES, in_use, DESCRIBE, "bytes of the bin's blocks handed out")                               \
  X(COUNT, chunks, DESCRIBE, "the bin's chunks")                                                   \
  X(COUNT, free_blocks, DESCRIBE, "the bin's free blocks")
#define RMMC_BINNING_FIGURES(X)                                                                    \
  X(BYTES, reserved, DESCRIBE, "all bins'")                                                        \
  X(BYTES, in_use, DESCRIBE, "all bins' plus what the upstream serves directly")                   \
  X(BYTES, cached, DESCRIBE, "the bins' bytes not in use")                                         \
  X(BYTES, upstream_in_use, DESCRIBE, "bytes the upstream serves directly, not yet freed")         \
  X(COUNT, upstream_allocations, DESCRIBE, "allocations the upstream served directly, ever")

/* The most bins one binning resource has. */
#define RMMC_BINNING_MAX_BINS 64

/* The binning options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_BINNING_OPTIONS(X)                                                                    \
  /* smallest power-of-two bin (default 256) */                                                    \
  X(size_t, min_bin, 256, 0, 0, "min", BYTES, SIZE, "256B", "", "smallest power-of-two bin")       \
  /* largest power-of-two bin (default 4 MiB) */                                                   \
  X(size_t, max_bin, (size_t)4 << 20, 0, 0, "max", BYTES, SIZE, "4MiB", "",                        \
    "largest power-of-two bin")                                                                    \
  /* explicit ascending bin sizes (borrowed), or NULL */                                           \
  X(const size_t *, bins, NULL, 0, 0, "bins", STRING, NONE, "powers of two from min to max", "",   \
    "explicit bin sizes, ascending: bins=256B:4KiB:64KiB")                                         \
  /* entries in bins */                                                                            \
  X(size_t, nbins, 0, 0, 0, NULL, NOSPEC, NONE, NULL, NULL, NULL)                                  \
  /* upstream bytes per bin chunk (default 2 MiB; at least 1) */                                  \
  X(size_t, chunk_size, (size_t)2 << 20, 1, SIZE_MAX, "chunk", BYTES, SIZE, "2MiB", "",            \
    "upstream bytes per bin chunk (at most 2^20 blocks of a bin)")

typedef struct rmmc_binning_options {
  size_t size; /* sizeof(rmmc_binning_options_t) */
  RMMC_BINNING_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_binning_options_t;

#define RMMC_BINNING_OPTIONS_INIT \
  {sizeof(rmmc_binning_options_t) RMMC_BINNING_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a binning resource over `upstream` (retained by the binning and
 * by each bin); NULL options mean defaults. Takes nothing from the
 * upstream until used. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or
 * out, options.size 0, min_bin or max_bin not a power of two, min_bin >
 * max_bin, an explicit list that is empty, longer than
 * RMMC_BINNING_MAX_BINS, contains 0 or is not strictly ascending after
 * rounding to 256, or a chunk_size of 0; RMMC_ERROR_OUT_OF_MEMORY. */
RMMC_EXPORT rmmc_status_t rmmc_binning_resource_create(rmmc_resource_t *upstream,
                                                       const rmmc_binning_options_t *options,
                                                       rmmc_resource_t **out);

/* Number of bins (0 for a resource of another kind). */
RMMC_EXPORT size_t rmmc_binning_resource_bin_count(const rmmc_resource_t *r);

/* Block size of bin i, smallest first (0 if out of range or another kind). */
RMMC_EXPORT size_t rmmc_binning_resource_bin_size(const rmmc_resource_t *r, size_t i);

/* The fixed_size resource behind bin i, borrowed (valid while r is), or
 * NULL. Its describe gives the bin's own figures. */
RMMC_EXPORT rmmc_resource_t *rmmc_binning_resource_bin(const rmmc_resource_t *r, size_t i);

/* Which bin serves (bytes, alignment): its index, or the bin count when
 * the upstream serves it (also for a resource of another kind: 0). */
RMMC_EXPORT size_t rmmc_binning_resource_bin_for(const rmmc_resource_t *r, size_t bytes,
                                                 size_t alignment);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_BINNING_RESOURCE_H */
