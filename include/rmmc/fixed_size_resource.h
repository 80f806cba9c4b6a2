/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fixed_size resource: blocks of one size carved from upstream chunks.
 *
 * Every allocation gets one block of `block_size` bytes. Blocks come from
 * chunks of `blocks_per_chunk` blocks that the resource takes from its
 * upstream when it runs out (the first on first use); allocate and
 * deallocate pop and push a free list: O(1), no search. The bookkeeping is
 * on the host: the memory handed out is never read or written, so any
 * upstream works (cuda, pool, host, a simulated one).
 *
 * Requests. A request larger than the block, or with an alignment above the
 * block alignment (the largest power of two dividing the block size, at
 * most RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT), fails with
 * RMMC_ERROR_NOT_SUPPORTED and a message naming the block size: it is a
 * request this resource never serves (not a shortage, so retry logic keyed
 * on RMMC_ERROR_OUT_OF_MEMORY leaves it alone). Chunks are asked of the
 * upstream with the block alignment; an upstream that refuses alignments
 * above 256 (the base CUDA resources) gets padded requests instead.
 *
 * Stream order (RMM's fixed_size_memory_resource, with events on demand).
 * Each stream has its own free list. A block freed on stream S is reused by
 * S at once, with no CUDA call. A stream T whose list is empty takes the
 * blocks S freed before S's event was last recorded, after
 * cudaStreamWaitEvent(T, S's event). S records its event at a deallocate
 * only while some other stream is short of blocks (it had to take a new
 * chunk since it last freed or took blocks): streams that do not share
 * blocks never make a CUDA call, and a stream that runs short gets the
 * others' later frees. A new chunk is taken on the requesting stream and
 * its blocks belong to that stream. Order of supply when a stream's list
 * is empty: another stream's covered blocks; past 64 streams and four
 * chunks, when half the blocks are free on other streams' lists (streams
 * that free and never come back, such as a new stream handle per call), a
 * device synchronization after which any stream's blocks are reused; a new
 * chunk;
 * and when the upstream is out of memory, the synchronization after all. The events belong to the resource and survive the streams, so
 * freeing on a stream that is later destroyed is safe; a destroyed stream's
 * handle reused by CUDA for a new stream counts as the same stream (as in
 * RMM). For host memory streams are opaque keys and no CUDA call is made.
 *
 * Bad input. deallocate returns RMMC_ERROR_UNKNOWN_POINTER, changing
 * nothing, for a pointer that is not the start of one of its blocks
 * (foreign or interior pointers), a block that is already free (double
 * free), or a size or alignment no block could have served. A wrong size
 * that still fits the block cannot be told apart and is accepted.
 *
 * release_cached gives every wholly free chunk back to the upstream (after
 * a device synchronization for device memory, since the blocks may have
 * been freed on streams with work in flight), then forwards to the
 * upstream. Thread-safe: one mutex per resource.
 *
 * CUDA graphs (pool_resource.h, "private pools"): over a stack with a pool
 * layer, a call the pool routes to a graph pool (the routed stream, or a
 * capture routed by capture) skips the free lists: its block comes from
 * the upstream, so from the graph pool, and its free goes straight back
 * there, whenever and on whatever stream it comes; a graph's block never
 * serves anything else and a capture never gets a block of the lists.
 * The same way, while the pool below is paused (pool_resource.h, "Sleep
 * mode") every allocate goes to it, which refuses it: no block of the
 * lists, whose pages the pause unmapped, is handed out; after resume the
 * lists serve again. While any graph pool in the process is routed or any
 * pool is paused, every allocate asks the pool below (a routed one takes
 * its lock, and on a GPU the stream's capture status); otherwise the check
 * is one load. describe's "graph_routed": bytes handed out that way and
 * not yet freed.
 *
 * describe: the rows of RMMC_FIXED_SIZE_FIGURES, then the figures of the
 * streams (streams, event_records, event_waits, device_syncs, stream_syncs,
 * event_queries, event_syncs).
 */
#ifndef RMMC_FIXED_SIZE_RESOURCE_H
#define RMMC_FIXED_SIZE_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define RMMC_FIXED_SIZE_FIGURES(X)                                                                 \
  X(BYTES, block_size, DESCRIBE, "bytes per block (the option, rounded up)")                       \
  X(COUNT, blocks_per_chunk, DESCRIBE, "blocks per chunk taken from the upstream")                 \
  X(BYTES, reserved, DESCRIBE, "bytes taken from the upstream")                                    \
  X(BYTES, in_use, DESCRIBE, "blocks handed out x block size")                                     \
  X(BYTES, cached, DESCRIBE, "free blocks x block size")                                           \
  X(BYTES, peak, DESCRIBE, "the highest in_use")                                                   \
  X(COUNT, chunks, DESCRIBE, "chunks taken from the upstream")                                     \
  X(COUNT, blocks, DESCRIBE, "blocks of those chunks")                                             \
  X(COUNT, free_blocks, DESCRIBE, "blocks free")                                                   \
  X(BYTES, largest_free, DESCRIBE, "block_size while a block is free, else 0")                     \
  X(BYTES, graph_routed, DESCRIBE, "bytes handed out from the pool below (above), not yet freed")

/* The most a block is aligned to (a page). */
#define RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT ((size_t)4096)

/* The most blocks one chunk holds (2^20). Each block has a 32-byte
 * descriptor on the host, made and linked when its chunk is taken, so a
 * chunk costs host memory and time in proportion to its blocks: at most 32
 * MiB and a few milliseconds. */
#define RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK ((size_t)1 << 20)

/* The fixed size options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_FIXED_SIZE_OPTIONS(X)                                                                 \
  /* bytes per block, rounded up to 256 (default 1 MiB; at least 1) */                            \
  X(size_t, block_size, (size_t)1 << 20, 1, SIZE_MAX,                                              \
    "block", BYTES, SIZE, "1MiB", "", "bytes per block")                                           \
  /* blocks per upstream chunk (default 128; 1 to 2^20) */                                         \
  X(size_t, blocks_per_chunk, 128, 1, RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK, "blocks_per_chunk", INT, SIZE, \
    "128", "blocks",\
    "blocks taken from the upstream at a time (a 32-byte host descriptor each)")

typedef struct rmmc_fixed_size_options {
  size_t size; /* sizeof(rmmc_fixed_size_options_t) */
  RMMC_FIXED_SIZE_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_fixed_size_options_t;

#define RMMC_FIXED_SIZE_OPTIONS_INIT \
  {sizeof(rmmc_fixed_size_options_t) RMMC_FIXED_SIZE_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a fixed_size resource over `upstream` (retained; NULL options mean
 * defaults). Takes nothing from the upstream until the first allocate.
 * RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or out, options.size 0,
 * a block size or blocks_per_chunk of 0, blocks_per_chunk above
 * RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK, or a chunk size that overflows;
 * RMMC_ERROR_OUT_OF_MEMORY without host memory. */
RMMC_EXPORT rmmc_status_t rmmc_fixed_size_resource_create(rmmc_resource_t *upstream,
                                                          const rmmc_fixed_size_options_t *options,
                                                          rmmc_resource_t **out);

/* The block size of a fixed_size resource (0 for another kind). */
RMMC_EXPORT size_t rmmc_fixed_size_resource_block_size(const rmmc_resource_t *r);

/* The alignment every block has (0 for another kind). */
RMMC_EXPORT size_t rmmc_fixed_size_resource_block_alignment(const rmmc_resource_t *r);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_FIXED_SIZE_RESOURCE_H */
