/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource: the pool (pool_resource.h) set up for many threads
 * churning blocks of up to a few MiB at once, under RMM's name for that
 * job. It is a mode of the pool, not an allocator of its
 * own: rmmc_arena_resource_create makes a pool whose stream heaps serve
 * every request up to a quarter superblock, carved from spans of one
 * superblock, each heap keeping keep_superblocks wholly free spans. The
 * resource's name is "arena"; everything else is the pool's: stream order,
 * out of memory, thread exit, describe fields, rmmc_pool_resource_figures,
 * rmmc_pool_resource_check, graph pools, sharing and peers.
 *
 * Why. RMM-style per-thread arenas (rmmc 0.1-0.2) scaled with threads but
 * kept free memory per thread, per stream and per size class: 1.5-14x the
 * live bytes on the replayed logs (24x on the GPU), where this mode holds
 * 1.02-1.31x. The pool's stream heaps give the same lock independence;
 * raising what they serve from 1 MiB to 4 MiB (the default superblock of
 * 16 MiB) keeps threads that churn 1-4 MiB blocks off the pool's shared
 * heap, whose event records the CUDA runtime serializes across threads
 * (on an H100, random 256 B-4 MiB with 16 threads: 120 ns per call
 * against the plain pool's 14,000 and the old arena's 1,087), for a few
 * points of memory on multi-stream workloads (docs/design.md, "The arena
 * is a mode of the pool").
 *
 * Options: superblock_size: a span, a power of two from 64 KiB to 1 GiB
 * (default 16 MiB); requests up to a quarter of it go to the stream heaps,
 * larger ones to the shared heap. chunk_size: fewest bytes one growth takes
 * from the upstream (the pool's min_growth; default 0: the pool's own, which
 * maps just the shortfall on virtual memory). max_size: the pool's
 * maximum_size (0, the default, or SIZE_MAX: no limit; at least one
 * superblock; the pool's own default is SIZE_MAX). keep_superblocks:
 * wholly free spans a stream heap keeps (default 1; 0 gives each back to
 * the shared heap at once, so a thread that allocates and frees one block
 * over and over takes a span each time). large_cache_size is no longer
 * used (the pool keeps no per-stream cache of large blocks: their free
 * memory merges in the shared heap); it stays for source compatibility.
 *
 * Thread-safe.
 */
#ifndef RMMC_ARENA_RESOURCE_H
#define RMMC_ARENA_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The arena options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_ARENA_OPTIONS(X)                                                                      \
  /* superblock_size= (also written superblock=): span of a stream heap, the pool's small_chunk,   \
   * a power of two, 64 KiB to 1 GiB (default 16 MiB) */                                           \
  X(size_t, superblock_size, (size_t)16 << 20, (size_t)64 << 10, (size_t)1 << 30,                  \
    "superblock_size", BYTES, SIZE, "16MiB", "",                                                   \
    "span of a stream heap, a power of two; requests up to a quarter of it stay in the heaps")     \
  /* fewest bytes one growth takes from the upstream (default 0: the pool's own) */                \
  X(size_t, chunk_size, 0, 0, (size_t)1 << 47, "chunk", BYTES, SIZE, "the pool's", "",             \
    "fewest bytes one growth takes from the upstream")                                             \
  /* max_size= (also written max=): most taken from the upstream (default 0: no limit; SIZE_MAX    \
   * too, and `none` in a spec) */                                                                 \
  X(size_t, max_size, 0, 0, 0, "max_size", BYTES_PCT, SIZE, "no limit", "",                        \
    "most taken from the upstream")                                                                \
  /* wholly free spans a stream heap keeps (default 1) */                                          \
  X(size_t, keep_superblocks, 1, 0, INT64_MAX, "keep", INT, SIZE, "1", "superblocks",              \
    "wholly free superblocks a stream heap keeps")                                                 \
  /* no longer used (see above) */                                                                 \
  X(size_t, large_cache_size, 0, 0, 0, NULL, NOSPEC, NONE, NULL, NULL, NULL)

typedef struct rmmc_arena_options {
  size_t size; /* sizeof(rmmc_arena_options_t) */
  RMMC_ARENA_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_arena_options_t;

#define RMMC_ARENA_OPTIONS_INIT \
  {sizeof(rmmc_arena_options_t) RMMC_ARENA_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates an arena (a pool, above) over `upstream` (retained); NULL options
 * mean defaults. Takes nothing from the upstream until the first allocate.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or out, options.size 0,
 * a superblock size that is not a power of two in range, a chunk_size or
 * keep_superblocks x superblock_size above 128 TiB, or a max_size below one
 * superblock; RMMC_ERROR_OUT_OF_MEMORY; the pool's other errors. */
RMMC_EXPORT rmmc_status_t rmmc_arena_resource_create(rmmc_resource_t *upstream,
                                                     const rmmc_arena_options_t *options,
                                                     rmmc_resource_t **out);

/* The bytes a request of `bytes` at `alignment` occupies in an arena: bytes
 * rounded up to 256 (the pool carves exact sizes; alignment costs nothing
 * inside the block). 0, with a message, for a resource that is not an
 * arena, an alignment that is not a power of two, 0 bytes or a size too
 * large to serve. */
RMMC_EXPORT size_t rmmc_arena_resource_block_size(const rmmc_resource_t *r, size_t bytes,
                                                  size_t alignment);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_ARENA_RESOURCE_H */
