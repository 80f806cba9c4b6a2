/*
 * The pool resource: a coalescing, stream-ordered sub-allocator.
 *
 * A pool takes large chunks from its upstream and carves them into blocks.
 * Freed blocks merge with their free neighbours of the same chunk, and
 * wholly free chunks go back to the upstream on rmmc_resource_release_cached()
 * (RMM's pool cannot do that), when the pool is about to grow (see
 * release_before_grow) and above the garbage-collection threshold. All
 * bookkeeping lives in host memory: the pool never reads or writes the
 * memory it manages, so it works over device memory, host memory or any
 * upstream at all.
 *
 * Search. Free blocks sit in two-level segregated-fit indices (TLSF: 32
 * size classes per power of two, bitmaps at both levels): finding a block
 * that fits is O(1), a few bit scans, never a walk of a free list. The
 * head of the request's own size class is tried first, then the smallest
 * non-empty class above it, so the block found is at most about 1/16
 * larger than the request (the rest is split off and stays free). A hash
 * map finds the block behind a pointer on free in O(1); each chunk keeps
 * its blocks in a physical prev/next list, so merging is O(1).
 *
 * Small and large requests. Requests of at most `small_max` bytes (1 MiB by
 * default) are served from slabs of `small_chunk` bytes (4 MiB) carved from
 * the pool like any large block; an emptied slab goes back to the large
 * blocks when they run short. So small, short-lived blocks never pin or
 * split the large free space, and large requests never land between small
 * ones. small_max = 0 turns this off.
 *
 * Growth. When nothing free fits, the pool grows by at least the request,
 * rounded up to `growth_granularity` (2 MiB, which is what the driver maps
 * anyway), and at least `min_growth`. Before growing it first gives back
 * chunks that are wholly free (release_before_grow, on by default: the
 * chunk that fits is rarely the one cached) while the reserved bytes would
 * exceed (1 + release_slack) x the peak in use, so the memory reserved
 * from the upstream stays close to the memory in use without giving back
 * and taking again at every growth. A wholly free chunk much larger than a
 * request (split_limit) is not split for it: the pool grows, so that
 * chunk can go back whole. If the upstream refuses,
 * the pool backs off (halves the growth down to the request) and, as a last
 * resort, releases everything it caches and retries once before failing
 * with RMMC_ERROR_OUT_OF_MEMORY; the message gives the request, the pool's
 * reserved/in use/free/largest free block/maximum figures and, for device
 * memory, the device's free and total memory. It never reserves more than
 * `maximum_size` in all.
 *
 * Streams. Each stream has its own free blocks. A block freed on stream S
 * is reused by S at once, with no CUDA call; the last block S freed is kept
 * aside ("hot") so that a request of exactly its size takes it without a
 * search. Blocks reach other streams through one CUDA event per stream,
 * recorded lazily (a cudaEventRecord per free would cost more than the
 * allocation itself): a deallocate records S's event when S holds
 * `event_interval` (64) freed blocks, or `event_bytes` (1 GiB), that no
 * event covers yet. Those blocks are then "covered": another stream T may
 * take one after cudaStreamWaitEvent(T, event of S), a wait on the GPU
 * (no CPU stall) made only when T takes S's memory. A block not yet
 * covered ("fresh") is S's alone and merges only with S's other fresh
 * blocks; once covered it merges with S's covered neighbours and with
 * untouched memory. A request on S looks, in order, at: S's blocks and
 * untouched ones (best fit among them); a new slab (small requests); S's
 * fresh blocks after covering them (one record on S, and they merge); other
 * streams' covered blocks (with the wait); emptied slabs merged back; a
 * cudaDeviceSynchronize after which every free block of every stream is
 * untouched and merges (only when another stream's fresh block alone would
 * serve the request, when growing would take the reserved bytes past the
 * release_slack budget while other streams hold free memory, or always
 * with sync_before_grow); growth; and, when
 * the upstream refuses, a synchronization, the release of every wholly free
 * chunk and a last growth. Events outlive their streams and the pool only
 * ever calls CUDA on the stream passed to the current call, so freeing on a
 * stream that is destroyed afterwards is safe. A destroyed stream's handle
 * may be reused by a new stream, which then inherits the old stream's
 * fresh blocks: if handles may come back, destroy a stream only once its
 * work is done. cudaStreamPerThread is a distinct stream per thread. Newly
 * grown chunks belong to the stream that grew the pool, covered by an event
 * recorded right after the upstream call, which is right for stream-ordered
 * upstreams (cuda_async) too. When the upstream's memory kind is
 * RMMC_MEMORY_HOST, streams are only keys and the pool makes no CUDA call
 * at all: a freed block is covered at the stream's next free (covering
 * costs nothing there), and free blocks of all streams merge before the
 * pool grows.
 *
 * Alignment: any power of two (the pool pads inside a block). Deallocate
 * needs the same `bytes` as allocate; alignment is not checked.
 *
 * Figures (rmmc_resource_describe): "reserved" (bytes held from the
 * upstream), "in_use" (bytes of the blocks handed out, after rounding to
 * 256), "free" (reserved - in_use), "peak" (highest in_use),
 * "reserved_peak", "largest_free" (largest free block), "limit" (the
 * maximum; absent without one), "chunks" (upstream chunks held), "slabs",
 * "free_unowned" (free bytes no stream has touched since the last
 * synchronization), counts "chunk_allocations", "chunk_releases",
 * "event_records", "event_waits", "device_syncs", and one text field
 * "free_on_stream" per stream that holds free blocks, reading
 * "stream=NAME free=BYTES fresh=BYTES" (NAME as in error messages:
 * "default", "per-thread" or the handle; fresh: bytes not yet covered by an
 * event, which only that stream may reuse).
 *
 * Thread-safe: one lock per pool (a futex lock: one atomic instruction to
 * take it, one to drop it), held for about a hundred instructions on the
 * common path; growth, trimming and CUDA calls (rare) happen under it too.
 */
#ifndef RMMC_POOL_RESOURCE_H
#define RMMC_POOL_RESOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pool options. Stack specs name them in parentheses (`pool(initial=1GiB,
 * max=80%)`): the spec option name is given first on each line. */
typedef struct rmmc_pool_options {
  size_t size; /* sizeof(rmmc_pool_options_t) */
  /* initial=: bytes reserved at creation, one chunk (default 0). */
  size_t initial_size;
  /* max=: most bytes ever reserved from the upstream (default SIZE_MAX and
   * 0 both mean no limit). Specs also take a percentage of the device's
   * free memory (of the host's memory for host upstreams). */
  size_t maximum_size;
  /* min_growth=: fewest bytes one growth asks the upstream for (default
   * 32 MiB); larger requests grow by their own size. */
  size_t min_growth;
  /* granularity=: growth is rounded up to this power of two (default
   * 2 MiB, at least 256). */
  size_t growth_granularity;
  /* small_max=: requests up to this many bytes are small and served from
   * slabs (default 1 MiB; 0 serves every request from the large blocks). */
  size_t small_max;
  /* small_chunk=: bytes of one slab (default 4 MiB; at least small_max,
   * a multiple of 256). */
  size_t small_chunk;
  /* gc_threshold=: fraction (0 to 1) of maximum_size or, without one, of
   * the device's total memory (the host's for host upstreams); a growth
   * that would take the reserved bytes above it first gives back wholly free
   * chunks until it would not (PyTorch's garbage_collection_threshold).
   * 0 (default) turns it off. */
  double gc_threshold;
  /* release_before_grow=: before a growth give back wholly free chunks
   * while reserved + growth exceeds the release_slack budget (default
   * true): keeps reserved close to the peak in use. */
  bool release_before_grow;
  /* event_interval=: record a stream's event after this many frees on it
   * that no event covers yet (default 64, at least 1). Device memory; in
   * host mode only a stream's last free is ever uncovered. */
  unsigned event_interval;
  /* event_bytes=: ... or when that many freed bytes wait (default 1 GiB). */
  size_t event_bytes;
  /* sync_before_grow=: device memory: before growing, synchronize the
   * device whenever other streams hold free memory, so that every stream's
   * free blocks merge and serve the request (default false: only when
   * another stream's uncovered block alone would serve it; a CPU stall per
   * growth buys less memory when streams interleave). Host memory always
   * does it: it costs nothing there. */
  bool sync_before_grow;
  /* release_slack=: release_before_grow gives chunks back only when the
   * growth would take the reserved bytes above (1 + release_slack) x the
   * highest in-use figure seen (this request counted), and only as many as
   * that budget needs (default 0.05). Releasing every free chunk before
   * each growth kept the ResNet-50 log at 1.036x but cost 537 upstream
   * calls; the budget keeps it at 1.05x with 300, and a batch workload
   * from 1187 calls to 244. 0 releases down to the peak itself. */
  double release_slack;
  /* split_limit=: a wholly free chunk larger than split_limit x the growth
   * a request would make (the request, at least min_growth) is not split
   * for it: the pool grows instead, and the budget above gives the big
   * chunk back if it is not needed (default 8; 0: off; at least 1).
   * Growing workloads (a transformer's attention scores growing with the
   * square of the sequence) otherwise put a smaller, longer-lived block
   * (a KV cache, the QKV projection) into the chunk the last scores left,
   * pinning gigabytes: 1.835x peak reserved / peak live, 1.08x with it.
   * Ignored on the last resort before out of memory. */
  double split_limit;
  /* expandable=: grow in place instead of by chunks (default false). The
   * pool reserves address space from its upstream (address_space bytes at
   * a time) and maps memory into it page by page as blocks are handed out
   * (rmmc_resource_vm_map: resource.h, "Virtual memory"), like PyTorch's
   * expandable segments. Free blocks merge across what would have been
   * chunk boundaries, so a growing workload never strands memory between
   * chunks, and the pages wholly inside free blocks can go back on their
   * own: "reserved" counts mapped pages, release_cached unmaps every free
   * page, and release_before_grow / gc_threshold / maximum_size unmap free
   * pages (after a synchronization of the device, as cudaFree would make)
   * instead of giving back whole chunks. split_limit does not apply.
   * Needs an upstream with virtual memory (cuda, host, sim):
   * RMMC_ERROR_NOT_SUPPORTED otherwise. */
  bool expandable;
  /* page=: bytes mapped at a time (default: 32 MiB or the upstream's page,
   * whichever is larger; a power of two, a multiple of the upstream's, at
   * most 1 GiB). A mapping costs about the same whatever its size (45 us on
   * an H200), so small pages give back memory more finely but cost more
   * calls: on the ResNet-50 log 2 MiB pages reached 1.032x peak reserved /
   * peak live at 31.5 us per call, 32 MiB pages 1.041x at 1.8 us. */
  size_t page_size;
  /* address_space=: bytes of one reservation (default: maximum_size if
   * set, else twice the device's memory, or the host's for host
   * upstreams); another is reserved when a request does not fit. */
  size_t address_space;
} rmmc_pool_options_t;

#define RMMC_POOL_OPTIONS_INIT                                                 \
  {sizeof(rmmc_pool_options_t), 0, SIZE_MAX, (size_t)32 << 20, (size_t)2 << 20,             \
   (size_t)1 << 20, (size_t)4 << 20, 0.0, true, 64, (size_t)1 << 30, false, 0.05, 8.0, false, 0, 0}

/* Creates a pool over `upstream`, which it retains (the caller keeps its
 * own reference); NULL options mean defaults. Reserves initial_size at
 * once. Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL
 * upstream or out, an options size this library does not know, or an option
 * out of range (the message names it); RMMC_ERROR_OUT_OF_MEMORY if the
 * initial size cannot be reserved or host memory runs out; RMMC_ERROR_CUDA
 * if creating an event fails later (device upstreams only). A failed create
 * retains nothing. */
RMMC_EXPORT rmmc_status_t rmmc_pool_resource_create(rmmc_resource_t *upstream,
                                                    const rmmc_pool_options_t *options,
                                                    rmmc_resource_t **out);

/* Validates every internal invariant of a pool: chunks do not overlap;
 * each chunk's blocks tile it exactly; every block is 256-byte aligned and
 * a multiple of 256 bytes; the free indices hold exactly the free blocks,
 * each in the bin its size maps to, with bitmaps that match; every block
 * handed out is in the pointer map and nothing else is; free + in use ==
 * reserved (and each figure equals the sum over the blocks); reserved is
 * within the maximum; coalescing is complete (no two adjacent free blocks
 * that the rules would merge: the same stream and state, or covered and
 * untouched); slabs match their parent blocks. Takes the pool's lock; for
 * tests and debugging (linear in the number of blocks). Returns
 * RMMC_SUCCESS, RMMC_ERROR_INVALID_ARGUMENT if `pool` is not a pool, or
 * RMMC_ERROR_INTERNAL with the first violation in the message. */
RMMC_EXPORT rmmc_status_t rmmc_pool_resource_check(rmmc_resource_t *pool);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_POOL_RESOURCE_H */
