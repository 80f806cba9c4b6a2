/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource: per-thread arenas over a global arena, for many
 * threads allocating at once (RMM's arena_memory_resource, reworked).
 *
 * Layout. The global arena takes memory from the upstream in chunks of
 * chunk_size and carves it into superblocks (superblock_size bytes,
 * aligned to that size) and large blocks. Each thread gets one arena per
 * stream it uses. An arena holds superblocks, each cut into equal blocks
 * of one size class (classes step by a quarter of each power of two from
 * 256 B up to a quarter superblock, so at most 25% of a block is
 * rounding). Allocating and freeing a small block on the owning thread
 * takes only that arena's lock (uncontended) and a bitmap scan: threads on
 * their own streams share no lock. Larger requests go to the global arena
 * (one lock, address-ordered first fit, sizes rounded the same way); the
 * block then belongs to the requesting arena, and freed on its stream it
 * is cached by that arena (up to large_cache_size bytes) for its next
 * request of the same class, without the global lock. Bookkeeping is on
 * the host; the memory is never touched.
 *
 * Memory moves back. An arena keeps the last superblock of each class it
 * uses even when wholly free, plus up to keep_superblocks further wholly
 * free ones, and gives other wholly free superblocks back to the global
 * arena. When the upstream is out of memory (or max_size is reached),
 * every arena gives back its wholly free superblocks and cached large
 * blocks and the allocation is retried once; release_cached does the same
 * and then returns wholly free chunks to the upstream. When a thread
 * exits, its arenas give back their wholly free superblocks and cached
 * large blocks; what still holds live blocks goes back once those are
 * freed (from any thread). The resource may be destroyed while threads
 * that used it still run, and a thread may exit after it is gone. A thread
 * keeps at most 64 arenas (streams): a 65th stream detaches the oldest as
 * if its thread had exited, so a new stream handle per call does not grow
 * the resource without bound; once that happened, before the global arena
 * grows while half of what it reserved is free but usable only by the
 * stream that freed it, it synchronizes the device and reuses that
 * instead.
 *
 * Stream order. A block freed on the stream of the arena that owns it is
 * reused by that stream at once, with no CUDA call. A small block freed on
 * another stream records that stream's event and is reused by the owner's
 * stream only after cudaStreamWaitEvent on it (at the owner's next
 * allocate); a large one goes back to the global arena. Memory given back
 * during a call on a stream records that stream's event, and another
 * stream taking it waits on the event first. Memory given back with no
 * live stream to name (thread exit, out-of-memory reclaim) is reused by
 * the same stream at once and by others only after a device
 * synchronization, which the out-of-memory path performs. Chunks are taken
 * from the upstream on the default stream and synchronized once, so every
 * stream may use them. For host memory streams are opaque keys and no
 * CUDA call is made. (As in RMM, a destroyed stream's handle that CUDA
 * reuses for a new stream counts as the same stream.)
 *
 * Alignment: any power of two. A small request takes the first class that
 * is a multiple of the alignment (superblocks are aligned to their size);
 * when no small class is, the global arena places the block on it.
 *
 * Bad input. deallocate returns RMMC_ERROR_UNKNOWN_POINTER, changing
 * nothing, for a pointer no block of the arena starts at, a block already
 * free (also while its free on another stream is pending, or while it is
 * cached), a size whose class differs from the block's, or a large block
 * freed with another rounded size. A wrong size of the same class cannot
 * be told apart.
 *
 * Costs to know: a thread that cycles through many streams gets an arena
 * (and superblocks) per stream; memory cached by an idle thread is only
 * reclaimed on out of memory, at its exit or by release_cached.
 *
 * describe: superblock_size, reserved, in_use, chunks, superblocks (held by
 * arenas), cached_superblocks (wholly free ones among them), global_free,
 * largest_free, large_allocations, large_bytes, cached_large_bytes, arenas
 * (of live threads), detached_arenas (of exited threads, still holding
 * memory), streams, event_records, event_waits, device_syncs, stream_syncs.
 * Thread-safe.
 */
#ifndef RMMC_ARENA_RESOURCE_H
#define RMMC_ARENA_RESOURCE_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rmmc_arena_options {
  size_t size;             /* sizeof(rmmc_arena_options_t) */
  size_t superblock_size;  /* power of two, 64 KiB to 1 GiB (default 4 MiB) */
  size_t chunk_size;       /* taken from the upstream at a time, rounded up to
                              superblocks (default 256 MiB) */
  size_t max_size;         /* most taken from the upstream (default 0: no limit) */
  size_t keep_superblocks; /* wholly free superblocks an arena keeps beyond
                              the last of each class (default 4) */
  size_t large_cache_size; /* bytes of freed large blocks an arena keeps for
                              its stream (default 1 GiB; 0: none) */
} rmmc_arena_options_t;

#define RMMC_ARENA_OPTIONS_INIT                                                \
  {sizeof(rmmc_arena_options_t), (size_t)4 << 20, (size_t)256 << 20, 0, 4, (size_t)1 << 30}

/* Creates an arena resource over `upstream` (retained); NULL options mean
 * defaults. Takes nothing from the upstream until the first allocate.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or out, options.size 0,
 * a superblock size that is not a power of two in range, a chunk_size of 0
 * or a max_size below one superblock; RMMC_ERROR_OUT_OF_MEMORY;
 * RMMC_ERROR_INTERNAL if no thread-exit hook can be registered. */
RMMC_EXPORT rmmc_status_t rmmc_arena_resource_create(rmmc_resource_t *upstream,
                                                     const rmmc_arena_options_t *options,
                                                     rmmc_resource_t **out);

/* The bytes a request of `bytes` at `alignment` occupies in an arena: its
 * size class, or its rounded large size (0 for a resource of another kind
 * or a size too large to serve). */
RMMC_EXPORT size_t rmmc_arena_resource_block_size(const rmmc_resource_t *r, size_t bytes,
                                                  size_t alignment);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_ARENA_RESOURCE_H */
