/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool resource: a coalescing, stream-ordered sub-allocator that is
 * fast on one thread, scales with threads, stays close to the bytes in use
 * and makes no driver call in a steady state. `pool > cuda` with default
 * options is rmmc's recommended stack.
 *
 * Memory. Over an upstream with virtual memory (cuda, host, sim; through
 * limiting too) the pool reserves address space once and maps memory into
 * it as it grows, one mapping per growth of exactly the shortfall (in the
 * upstream's pages, 2 MiB on a GPU, at most `page_size` per mapping): free
 * space of every stream coalesces in one address space, so nothing stays
 * stranded between chunks. Over any other upstream (cuda_async, managed,
 * pinned, your own) it takes chunks with rmmc_resource_allocate, at least
 * min_growth at a time, and coalesces within each chunk. expandable=false
 * chooses chunks over any upstream.
 *
 * Two levels. Requests of at most small_max bytes (1 MiB) are served by a
 * heap of the calling stream, which carves them from spans (small_chunk
 * bytes, 4 MiB) it borrows from the shared heap: allocating and freeing a
 * small block on one stream takes only that stream's lock, so threads on
 * their own streams share nothing (and the last block a stream freed is
 * reused by an exact-size request without a search). Threads sharing a
 * stream take its heaps in turn (up to stream_heaps of them), so they do
 * not share that lock either; a block one of them frees goes straight back
 * to the heap it came from. Larger requests go to the shared heap under
 * one lock. A stream heap keeps at most cache_size
 * bytes of wholly free spans; more go back to the shared heap at once, and
 * other streams take back a heap's free spans before the pool grows.
 * Streams that come and go (one per request or per task) cost nothing
 * lasting: past 256 heaps, each new heap retires heaps that hold no block,
 * those that took a span longest ago first (their spans go back to the
 * shared heap, the heap is reused), so the number of heaps, the memory kept
 * per stream and the slow path's work stay bounded however many streams
 * the pool has seen (a stream whose heap was retired gets one again when
 * it comes back).
 *
 * Search. Free blocks sit in two-level segregated-fit indices (32 classes
 * per power of two, bitmaps at both levels): a search is O(1), the block
 * found at most about 1/16 larger than the request (the rest stays free);
 * merging with free neighbours is O(1).
 *
 * Streams. A block freed on stream S is reused by S at once. Other streams
 * reuse it once the work queued on S before the free has finished, which
 * the pool learns from S's event (one cudaEventRecord per event_interval
 * frees or event_bytes bytes, only while other streams use the pool; one
 * cudaEventQuery when another stream needs memory), or, when no finished
 * memory fits, behind cudaStreamWaitEvent on S's event (a GPU-side wait,
 * no CPU stall). When no single freed block fits and the pool would grow
 * past its budget, the short stream waits on other streams' events one at
 * a time and takes all their covered frees, which merge with each other
 * (memory freed side by side on several streams joins into one block).
 * Before a growth would take reserved past the most the pool ever held,
 * and only then, the host waits for the streams whose frees are not yet
 * known finished (sync_before_peak, cudaEventSynchronize: the "event_syncs"
 * figure), so those frees can merge and go back first: one checkpoint at a
 * time, the oldest not known finished first (the nearest point of a busy
 * stream's queue), trying again after each, so a wait rarely drains a
 * stream.
 * The pool never synchronizes the device on a normal path:
 * only as the last resort before out of memory and in release_cached.
 * When the upstream refuses a growth (the device is full), the virtual-
 * memory backend first gives back as much finished free memory as the
 * growth maps, from pages that lie inside free blocks elsewhere, and maps
 * again, before the last resort synchronizes and gives every free page
 * back.
 * Events outlive their streams, and the pool calls CUDA only on the stream
 * of the current call, so a stream destroyed after a free is safe (a
 * destroyed stream's handle reused by a new stream counts as the same
 * stream). cudaStreamPerThread is a distinct stream per thread. For host
 * memory (host, sim) streams are keys and no CUDA call is made; the pool
 * follows the same policy with every event finishing when recorded.
 *
 * Graph capture. On a stream being captured into a CUDA graph the pool
 * records, waits and synchronizes nothing and takes no memory another
 * stream freed with work still pending; driver calls (growth) run under a
 * relaxed capture mode, so they neither break the capture nor another
 * thread's.
 *
 * Growth and giving back (hysteresis). The budget is (1 + release_slack)
 * x the most the pool ever had handed out or lent to stream heaps. While
 * that peak rises (a cold start), a growth that would take the reserved
 * bytes past the budget first gives back free memory, oldest free first;
 * in a steady state (no new peak) only once the growth would pass a band
 * of 3 x release_slack more (1.06x by default), and then down to the
 * budget, so a round that needs a little more than the last one does not
 * give back and take again; each such steady-state give-back widens the
 * band by 0.5 x release_slack, up to release_band (4: 1.08x), so a
 * workload whose rounds keep giving back and taking again settles; in a
 * workload that repeats, no upstream call is made. Only memory no stream
 * has work pending on goes back (what is pending goes at a later growth).
 * gc_threshold and maximum_size bound reserved bytes the same way, steady
 * or not. When the upstream refuses,
 * a request that fits in a span is served from a free block of another
 * stream's heap (free memory inside spans that still hold live blocks,
 * which no other step reaches) if that stream's work before its frees
 * there is known finished, or behind a GPU-side wait on its event; then
 * the pool takes back every stream heap's free spans, gives back all free
 * memory (after a device synchronization), asks the upstream to release
 * what it caches and tries once more, other heaps' free blocks (now
 * finished) included, before failing with RMMC_ERROR_OUT_OF_MEMORY; the
 * message gives the request, the pool's figures, what stays free inside
 * stream heaps and the device's free and total memory.
 *
 * Alignment: any power of two (the pool pads inside a block). Deallocate
 * needs the same `bytes` as allocate; alignment is not checked.
 *
 * Figures (rmmc_resource_describe): "reserved" (bytes held from the
 * upstream: mapped pages or chunks), "in_use" (bytes of the blocks handed
 * out, after rounding to 256; exact when no call is running), "free"
 * (reserved - in_use), "peak" (most bytes ever handed out as large blocks
 * or lent to stream heaps as spans), "reserved_peak", "largest_free",
 * "limit" (absent without one), "regions" (chunks or reservations),
 * "graph_pools" and "graph_bytes" (CUDA graph private pools: below),
 * "spans" (lent to stream heaps), "heaps" (live stream heaps, of every
 * stream), "heaps_retired" (heaps retired so far), "cached" (free bytes
 * inside stream heaps), "streams", "event_records", "event_waits", "event_queries",
 * "event_syncs" (the host waited for a stream's last event before the pool
 * grew past its peak reserved: below), "device_syncs", "grows" (upstream
 * allocations or mappings), "shrinks"
 * (upstream frees or unmappings), "adoptions" (times a stream short of
 * memory waited on another stream's event and took all of that stream's
 * covered frees, rather than growing past its budget), the text field
 * "release_band" (the steady-state band now, in release_slacks: "3.0" to
 * release_band; see "Growth and giving back"), and one text field "stream" per stream
 * that holds a heap or free blocks in the shared heap:
 * "NAME in_use=BYTES cached=BYTES pending=BYTES heaps=N" (pending: free
 * bytes in the shared heap waiting for that stream's work). The
 * virtual-memory backend adds "backend", "page", "address_space",
 * "mappings", "page_maps", "page_unmaps", "budget_trims" (gives-back the
 * budget asked for before a growth) and "refusal_trims" (growths the
 * upstream refused, mapped after giving back as much finished free memory
 * as they lacked: below).
 *
 * Thread-safe; see "Two levels" for what is shared.
 */
#ifndef RMMC_POOL_RESOURCE_H
#define RMMC_POOL_RESOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/figures.h"
#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The pool options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_POOL_OPTIONS(X)                                                                       \
  /* initial=: bytes reserved (mapped) at creation (default 0; at most 128 TiB). */                \
  X(size_t, initial_size, 0, 0, (size_t)1 << 47, "initial", BYTES_PCT, SIZE, "0", "",              \
    "bytes reserved at creation")                                                                  \
  /* maximum_size= (also written max=): most bytes ever reserved from the upstream. No limit:      \
   * SIZE_MAX (the default) or 0 here, `none` in a spec (the arena's max_size has the same         \
   * three, with 0 its default). Specs also take a percentage of the device's free memory (of the  \
   * host's memory for host upstreams).                                                            \
   */                                                                                              \
  X(size_t, maximum_size, SIZE_MAX, 0, 0, "maximum_size", BYTES_PCT, SIZE, "no limit", "",         \
    "most bytes reserved from the upstream")                                                       \
  /* min_growth=: chunks: fewest bytes one growth takes; larger requests grow by their own size.   \
   * Virtual memory: growth maps the shortfall, at least this many bytes.                          \
   * RMMC_POOL_MIN_GROWTH_DEFAULT (the _INIT value): 32 MiB for chunks, nothing more than the      \
   * shortfall for virtual memory; any other value, 32 MiB included, is taken as given.            \
   */                                                                                              \
  X(size_t, min_growth, RMMC_POOL_MIN_GROWTH_DEFAULT, 0, 0, "min_growth", BYTES, SIZE, "chunks 32MiB, virtual memory the shortfall", "",\
    "fewest bytes one growth takes")                                                               \
  /* granularity=: chunks: growth is rounded up to this power of two (default 2 MiB; 256 B to      \
   * 1 GiB).                                                                                       \
   */                                                                                              \
  X(size_t, growth_granularity, (size_t)2 << 20, 256, (size_t)1 << 30,                             \
    "granularity", BYTES, SIZE, "2MiB", "",                                                        \
    "chunks: growth rounded up to this power of two")                                              \
  /* small_max=: requests up to this many bytes are served by the stream heaps (default 1 MiB; 0   \
   * sends every request to the shared heap).                                                      \
   */                                                                                              \
  X(size_t, small_max, (size_t)1 << 20, 0, 0, "small_max", BYTES, SIZE, "1MiB", "",                \
    "requests up to this size go to the stream heaps (0: off)")                                    \
  /* small_chunk=: bytes of one span (default 4 MiB; a power of two from 64 KiB to 1 GiB, at       \
   * least small_max).                                                                             \
   */                                                                                              \
  X(size_t, small_chunk, (size_t)4 << 20, (size_t)64 << 10, (size_t)1 << 30,                       \
    "small_chunk", BYTES, SIZE, "4MiB", "",                                                        \
    "bytes of one span lent to a stream heap")                                                     \
  /* gc_threshold=: fraction (0 to 1) of maximum_size or, without one, of the device's total       \
   * memory (the host's for host upstreams) above which a growth first gives back free memory      \
   * (PyTorch's garbage_collection_threshold). 0 (default) turns it off.                           \
   */                                                                                              \
  X(double, gc_threshold, 0.0, 0.0, 1.0, "gc_threshold", DOUBLE, DOUBLE, "0: off", "fraction",     \
    "of max/device memory above which growth gives back first")                                    \
  /* release_before_grow=: keep reserved within the budget of release_slack by giving back free    \
   * memory before growing (default true).                                                         \
   */                                                                                              \
  X(bool, release_before_grow, true, 0, 0, "release_before_grow", BOOL, BOOL, "true", "",          \
    "keep reserved within the budget before growing")                                              \
  /* event_interval=: while several streams use the pool, record a stream's event after this       \
   * many frees in the shared heap that no event covers yet (default 1: another stream may want    \
   * the memory at once; a record costs ~0.3 us on an H100; at least 1). Raising it costs memory   \
   * when streams share: an uncovered free merges with the free memory beside it and keeps all     \
   * of it from other streams until the record (event_interval=8: 4.1x the live bytes on a         \
   * 4-stream transformer log, 2.6x on an 8-stream server log, against 1.05x and 1.25x; docs/      \
   * design.md, "Stream order: epochs, not an event per free").                                    \
   */                                                                                              \
  X(unsigned, event_interval, 1, 1, UINT_MAX, "event_interval", INT, UNSIGNED, "1", "frees",       \
    "frees per stream between event records, while several streams use the pool")                  \
  /* event_bytes=: ... or when that many freed bytes wait (default 256 MiB; the same cost as       \
   * event_interval).                                                                              \
   */                                                                                              \
  X(size_t, event_bytes, (size_t)256 << 20, 0, 0, "event_bytes", BYTES, SIZE, "256MiB", "",        \
    "freed bytes per stream between event records")                                                \
  /* release_slack=: the budget is (1 + release_slack) x the peak (default 0.02; 0 to 1e6). */     \
  X(double, release_slack, 0.02, 0.0, 1e6, "release_slack", DOUBLE, DOUBLE, "0.02", "fraction",    \
    "the budget: reserved within (1 + this) x peak")                                               \
  /* split_limit=: chunks: a wholly free chunk larger than split_limit x the growth a request      \
   * would make is not split for it: the pool grows instead, and the budget gives the big chunk    \
   * back if it is not needed (default 8; 0: off; else 1 to 1e6). Never applies to a chunk the     \
   * pool has just taken for the request, nor on the last resort.                                  \
   */                                                                                              \
  X(double, split_limit, 8.0, 0.0, 1e6, "split_limit", DOUBLE, DOUBLE, "8; 0: off", "times",       \
    "chunks: grow rather than split a free chunk this many times the growth")                      \
  /* expandable=: -1 (default): virtual memory when the upstream has it, chunks otherwise; 1:      \
   * virtual memory (RMMC_ERROR_NOT_SUPPORTED without it); 0: chunks.                              \
   */                                                                                              \
  X(int, expandable, -1, -1, 1,                                                                    \
    "expandable", BOOL, INT, "virtual memory when the upstream has it", "",                        \
    "virtual memory (true) or chunks (false)")                                                     \
  /* page=: virtual memory: most bytes one mapping covers, a multiple of the upstream's page (0,   \
   * the default: 32 MiB, or the upstream's page where that is larger, and a growth of more than   \
   * 8 such pages maps in 8 equal mappings of up to 1 GiB). Memory goes back a whole mapping at a  \
   * time; a mapping costs about the same whatever its size (~50 us on an H100).                   \
   */                                                                                              \
  X(size_t, page_size, 0, 0, 0, "page", BYTES, SIZE, "32MiB, or the upstream's page if larger", "",\
    "virtual memory: most bytes one mapping covers")                                               \
  /* address_space=: virtual memory: bytes of one reservation (default: maximum_size if set,       \
   * else twice the device's memory, or the host's); another is reserved when a request does not   \
   * fit.                                                                                          \
   */                                                                                              \
  X(size_t, address_space, 0, 0, 0, "address_space", BYTES, SIZE, "max, else 2x memory", "",       \
    "virtual memory: bytes of one reservation")                                                    \
  /* cache_size= (also written cache=): wholly free span bytes a stream heap keeps (default 8 MiB: \
   * two spans; more go back to the shared heap at once). Below one span (small_chunk) a heap      \
   * keeps none, and a thread that allocates and frees one block takes a span and gives it back    \
   * every time (on the H100 with small_chunk=16MiB and this default: 182 ns per pair call, 28 ns  \
   * with cache_size=16MiB).                                                                       \
   */                                                                                              \
  X(size_t, cache_size, (size_t)8 << 20, 0, 0, "cache_size", BYTES, SIZE, "8MiB", "",              \
    "wholly free span bytes a stream heap keeps")                                                  \
  /* stream_heaps=: most heaps per stream: threads sharing a stream take its heaps in turn         \
   * (thread number modulo this), so they do not share a lock (default 0: the machine's online     \
   * CPUs, at most 64; 1: one heap per stream; at most 1024).                                      \
   */                                                                                              \
  X(unsigned, stream_heaps, 0, 0, 1024, "stream_heaps", INT, UNSIGNED, "one per CPU up to 64", "heaps",\
    "most heaps per stream, for threads sharing one")                                              \
  /* sync_before_peak=: before a growth past the most the pool ever reserved, the host waits for   \
   * each stream with frees not yet known finished (cudaEventSynchronize: a stall while the GPU    \
   * catches up), one checkpoint at a time (checkpoint_every below), so those frees can merge      \
   * and go back and the pool may not need the new high-water mark (default true; false: the       \
   * pool grows instead, keeping more memory reserved while the GPU runs behind; docs/design.md,   \
   * "Growth and giving back"). Counted as the figure event_syncs. Since 0.3.                      \
   */                                                                                              \
  X(bool, sync_before_peak, true, 0, 0, "sync_before_peak", BOOL, BOOL, "true", "",                \
    "wait for streams' unfinished frees before reserved passes its peak")                          \
  /* checkpoint_every=: with sync_before_peak, every this-many-th event record of a stream also    \
   * records one of 8 checkpoint events, so the host can wait for an earlier point of a busy       \
   * stream than its last record (default 64; a power of two from 2 to 65536; 0: no checkpoints,   \
   * the wait is for the stream's last record). Each checkpoint is one more event record: at 16,   \
   * about 2% of the pool's call time on one-thread replays of logs that free across 4-8           \
   * streams, at 64 about a quarter of that (H100; docs/performance.md, "Comparing two builds").   \
   * Since 0.3.                                                                                    \
   */                                                                                              \
  X(unsigned, checkpoint_every, 64, 0, 65536, "checkpoint_every", INT, UNSIGNED, "64", "records",  \
    "sync_before_peak: a checkpoint every this-many-th event record (power of two; 0: none)")      \
  /* release_band=: in a steady state (no new peak) a growth gives back free memory only once it   \
   * would take reserved past the budget by more than band x release_slack. The band starts at 3   \
   * (or at this, if lower) and widens by 0.5 each time a steady-state growth still has to give    \
   * back, up to this (default 4: from 1.06x to 1.08x the peak at the default slack), so a         \
   * workload whose every round gives back and takes memory again settles instead (FSDP2 on 4      \
   * GPUs: from 2 page moves per step to none; docs/design.md, "Growth and giving back"). 3: the   \
   * fixed band of earlier versions; 0: give back whenever past the budget. From 0 to 1000.        \
   * Since 0.3.                                                                                    \
   */                                                                                              \
  X(double, release_band, 4.0, 0.0, 1000.0, "release_band", DOUBLE, DOUBLE, "4", "x slack",        \
    "steady state: the band past the budget widens from 3 to this while growths give back")

/* Pool options. Stack specs name them in parentheses (`pool(initial=1GiB,
 * maximum_size=80%)`): the spec option name is given first on each line.
 * Where it differs from the member's name (initial, min_growth's
 * granularity, page), the short word is the spec's; max= and cache= are
 * older spellings of maximum_size= and cache_size=, still accepted. */
typedef struct rmmc_pool_options {
  size_t size; /* sizeof(rmmc_pool_options_t) */
  RMMC_POOL_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_pool_options_t;

/* min_growth's default: the backend's own (see min_growth above). */
#define RMMC_POOL_MIN_GROWTH_DEFAULT SIZE_MAX

#define RMMC_POOL_OPTIONS_INIT \
  {sizeof(rmmc_pool_options_t) RMMC_POOL_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a pool over `upstream`, which it retains (the caller keeps its
 * own reference); NULL options mean defaults. Reserves initial_size at
 * once. Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for a NULL
 * upstream or out, an options size this library does not know, or an option
 * out of range (the message names it); RMMC_ERROR_NOT_SUPPORTED for
 * expandable=1 over an upstream without virtual memory;
 * RMMC_ERROR_OUT_OF_MEMORY if the initial size cannot be reserved or host
 * memory runs out. A failed create retains nothing. */
RMMC_EXPORT rmmc_status_t rmmc_pool_resource_create(rmmc_resource_t *upstream,
                                                    const rmmc_pool_options_t *options,
                                                    rmmc_resource_t **out);

/* Validates every internal invariant of a pool: regions do not overlap;
 * each region's and span's blocks tile it exactly; every block is 256-byte
 * aligned and a multiple of 256 bytes; the indices hold exactly the free
 * blocks, each in the index of its owner, with bitmaps that match; every
 * block handed out is in a pointer map and nothing else is; free, in use
 * and lent bytes add up to what is reserved; reserved is within the
 * maximum; coalescing is complete where the rules allow; mapped ranges
 * (virtual memory) cover exactly the blocks that need memory. Takes every
 * lock; for tests and debugging (linear in the number of blocks). Returns
 * RMMC_SUCCESS, RMMC_ERROR_INVALID_ARGUMENT if `pool` is not a pool, or
 * RMMC_ERROR_INTERNAL with the first violation in the message.
 *
 * Built-in checks (the build's `debug_checks` option, meson.options): at 1,
 * the default, the pool asserts local invariants on its slow paths
 * (growth, trimming, spans lent and taken back, heaps retired, frees from
 * another stream), never on the fast paths; at 2 it also runs this whole
 * check after every call; at 0, none. A broken invariant means a bug or
 * memory corruption: the pool sets RMMC_ERROR_INTERNAL with the invariant,
 * the block and the source file:line as the thread's message, writes that
 * message to stderr and calls abort(), since going on would hand out the
 * same memory twice or lose it. This is the one exception to "status codes,
 * never aborts". */
RMMC_EXPORT rmmc_status_t rmmc_pool_resource_check(rmmc_resource_t *pool);

/* The pool's figures, once, in the order describe reports them: each row
 * gives the figure's kind, its key (the member's name), whether
 * rmmc_pool_figures_t has it, and what it means (rmmc/figures.h: the
 * columns). After these, describe reports the streams' figures (streams,
 * event_records, event_waits, device_syncs, stream_syncs, event_queries,
 * event_syncs), then its backend's (backend, and page, address_space,
 * mappings, page_maps, page_unmaps, budget_trims, refusal_trims for virtual
 * memory), sleep mode's once it has been used (sleep, paused_bytes,
 * backed_up, backup_host, pauses, resumes), and a "stream" line per stream. */
#define RMMC_POOL_FIGURES(X)                                                                       \
  X(BYTES, reserved, BOTH, "bytes held from the upstream")                                         \
  X(BYTES, in_use, BOTH, "bytes handed out")                                                       \
  X(BYTES, free, DESCRIBE, "reserved less in_use")                                                 \
  X(BYTES, peak, DESCRIBE, "the most bytes handed out or lent to stream heaps at once")            \
  X(BYTES, reserved_peak, DESCRIBE, "the most bytes ever held from the upstream")                  \
  X(BYTES, largest_free, DESCRIBE, "the largest free block")                                       \
  X(BYTES, maximum_size, DESCRIBE_IF_SET, "the option maximum_size, while the pool has one")       \
  X(BYTES, small_max, DESCRIBE, "the option small_max: stream heaps serve requests up to this")    \
  X(BYTES, small_chunk, DESCRIBE, "the option small_chunk: bytes of one span")                     \
  X(BYTES, cache_size, DESCRIBE, "the option cache_size: wholly free span bytes a heap keeps")     \
  X(BYTES, cached, BOTH, "free bytes held in stream heaps")                                        \
  X(BYTES, pending, BOTH, "free bytes waiting for some stream's work")                             \
  X(COUNT, regions, DESCRIBE, "regions taken from the upstream (chunks, or reservations)")         \
  X(COUNT, graph_pools, DESCRIBE, "private pools of CUDA graphs")                                  \
  X(BYTES, graph_bytes, DESCRIBE, "bytes the graph pools hold, in use or free")                    \
  X(COUNT, spans, DESCRIBE, "spans lent to stream heaps")                                          \
  X(COUNT, heaps, DESCRIBE, "live stream heaps")                                                   \
  X(COUNT, heaps_retired, DESCRIBE, "stream heaps retired")                                        \
  X(COUNT, grows, BOTH, "growths: memory taken from the upstream")                                 \
  X(COUNT, shrinks, BOTH, "times memory went back to the upstream")                                \
  X(COUNT, adoptions, DESCRIBE, "streams whose covered frees another stream joined")               \
  X(TEXT, release_band, DESCRIBE, "the steady-state band now, in release_slacks (\"4.0\")")        \
  X(TEXT, peers, DESCRIBE_IF_SET, "the devices given access to the pool's memory, once one is")    \
  X(COUNT, device_syncs, STRUCT, "device synchronizations")                                        \
  X(COUNT, event_records, STRUCT, "event records")                                                 \
  X(COUNT, event_waits, STRUCT, "GPU-side waits on another stream's event")                        \
  X(COUNT, event_queries, STRUCT, "event queries")                                                 \
  /* Since 0.3. */                                                                                 \
  X(COUNT, event_syncs, STRUCT, "host waits on a stream's event before a new peak")

/* The pool's cached memory as figures a caller can act on (thread-safe,
 * without taking the shared lock for long): the rows of RMMC_POOL_FIGURES
 * that are members, in order. */
typedef struct rmmc_pool_figures {
  size_t size; /* sizeof(rmmc_pool_figures_t) */
  RMMC_POOL_FIGURES(RMMC_FIGURE_FIELD)
} rmmc_pool_figures_t;

#define RMMC_POOL_FIGURES_INIT \
  {sizeof(rmmc_pool_figures_t) RMMC_POOL_FIGURES(RMMC_FIGURE_ZERO)}

/* Fills *figures (whose size member is set with RMMC_POOL_FIGURES_INIT).
 * RMMC_ERROR_INVALID_ARGUMENT if `pool` is not a pool or figures is NULL
 * or has a bad size. */
RMMC_EXPORT rmmc_status_t rmmc_pool_resource_figures(rmmc_resource_t *pool,
                                                     rmmc_pool_figures_t *figures);

/* ---- CUDA graphs: private pools ----
 *
 * Memory handed out while a stream is captured into a CUDA graph is used
 * by every replay of the graph, so no work outside the graph may get it
 * while the graph lives. Between rmmc_pool_graph_begin() and
 * rmmc_pool_graph_end(), allocations of the routed calls go to the graph
 * pool `(id0, id1)` (PyTorch's MempoolId_t; any two numbers you choose):
 * they take the graph pool's free blocks first, then memory no stream has
 * work pending on (a capture must never wait on other streams), then new
 * memory; the graph pool's blocks go back to it when freed, on any stream,
 * inside the capture (reused by later allocations of the capture, in
 * stream order) or after it (a graph's outputs), and never serve anything
 * else. Begin the same id again for another capture to share the pool
 * between graphs (torch.cuda.graph(pool=...), make_graphed_callables).
 * rmmc_pool_graph_release() ends the pool: its free blocks return to the
 * shared heap once the device is idle (the call synchronizes it, unless a
 * routed capture is underway: then later), and blocks still out return
 * as ordinary frees.
 *
 * Routing: by_stream true routes every call on `stream` (any memory; the
 * stream need not be capturing: a host-memory pool can be tested this
 * way). by_stream false routes the capture the calling thread begins next
 * (stream ignored): the first allocation on a stream being captured, from
 * this thread, binds the pool to that capture's id, and every allocation
 * on a stream of that capture (forked side streams too, from any thread)
 * goes to it. While any pool is routed, every allocation of the pool asks
 * CUDA for the stream's capture status (~75 ns); otherwise routing costs
 * one load. Without routing, a capture through the pool still works (the
 * pool records, waits and synchronizes nothing on a capturing stream and
 * grows under a relaxed capture mode), but memory freed inside the capture
 * may be reused outside it.
 *
 * `stack` may be the pool or any stack with a pool layer below (the first
 * is used); layers that cache above the pool (binning, fixed_size) pass
 * the routed calls through to it, so a graph's blocks never enter their
 * caches. RMMC_ERROR_INVALID_ARGUMENT: no pool layer, a pool already
 * being routed to (begin), not routed (end), unknown (release);
 * RMMC_ERROR_NOT_SUPPORTED: routing by capture over host memory. Thread-
 * safe. */
RMMC_EXPORT rmmc_status_t rmmc_pool_graph_begin(rmmc_resource_t *stack, uint64_t id0,
                                                uint64_t id1, bool by_stream,
                                                cudaStream_t stream);
RMMC_EXPORT rmmc_status_t rmmc_pool_graph_end(rmmc_resource_t *stack, uint64_t id0, uint64_t id1);
RMMC_EXPORT rmmc_status_t rmmc_pool_graph_release(rmmc_resource_t *stack, uint64_t id0,
                                                  uint64_t id1);

/* ---- Sleep mode: give the memory back, take it again at the same addresses ----
 *
 * Serving and RL stacks switch one GPU between phases; a phase that sleeps
 * must give its memory back and find its blocks at the same addresses when
 * it wakes (CUDA graphs, NCCL registrations and raw pointers point there).
 * rmmc_pool_pause() unmaps and gives back to the upstream (the driver)
 * every page of the pool, live blocks' included, keeping its address space
 * reserved and its books as they are; rmmc_pool_resume() maps new pages at
 * the same addresses. Only a pool with the virtual-memory backend can sleep
 * (expandable, over cuda, host or sim; through adaptors too):
 * RMMC_ERROR_NOT_SUPPORTED otherwise, the message saying why, nothing
 * changed. Pools pause and resume independently. Layers that cache the
 * pool's memory above it (binning, fixed_size) hand out nothing while it
 * is paused: their calls go to the pool, which refuses them, and they
 * serve from their caches again after resume. A pool over which another
 * pool is stacked (its upstream reaches this one) cannot pause
 * (RMMC_ERROR_NOT_SUPPORTED): the upper pool would hand out its cached
 * pages.
 *
 * Live blocks' contents (mode, per pause): RMMC_POOL_PAUSE_BACKUP copies
 * every block handed out to host memory (pinned, for device memory) and
 * resume copies it back; RMMC_POOL_PAUSE_DISCARD copies nothing and never
 * reads them: after resume their contents are undefined (zeros or stale).
 * Free memory is never copied. The backup buffer is kept after resume for
 * the next pause (pinning a large buffer costs more than its copies;
 * docs/design.md, "Sleep mode") until rmmc_resource_release_cached() or the
 * pool's destruction. Backup needs memory behind the addresses: over sim
 * it is RMMC_ERROR_NOT_SUPPORTED (discard works).
 *
 * Streams. pause synchronizes the pool's device (a pool cannot know which
 * streams use a live block, and unmapping a page a kernel still touches is
 * a fault), so all work queued before the call, on any stream, is done
 * before a page goes; it is refused (RMMC_ERROR_NOT_SUPPORTED) during a
 * graph capture the pool knows of. Work of other devices on the pool's
 * memory (peers) must be finished by the caller. The backup is copied on
 * `stream` and pause returns once it is on the host. resume maps the pages
 * and enqueues the copies back on `stream`: the contents are in place for
 * work queued on `stream` after the call (other streams: order them after
 * it, e.g. with an event), as for memory allocate hands out.
 *
 * While paused an allocation from the pool fails at once with
 * RMMC_ERROR_OUT_OF_MEMORY ("the pool is paused"; a paused pool holds no
 * memory, and callers that handle out of memory -- a framework raising its
 * OOM exception, a fallback pool -- do the right thing; blocking until a
 * resume would hang a thread that holds the only way to resume). Frees are
 * accepted (the block's memory is simply not restored), as are describe,
 * get_allocation, set_memory_hooks, enable_peer_access (a page is granted
 * when it is mapped again) and release_cached, which drops the mappings
 * lying wholly in free memory so that resume maps less. A pause must not
 * race with allocations or with work on the pool's memory.
 *
 * Memory hooks (rmmc_resource_set_memory_hooks) hear every mapping go
 * (on_release before each unmap) and come back (on_acquire after each new
 * map), in address order (a discard pause: those under no live block first,
 * then the others, each in address order), so registrations (NCCL, RDMA)
 * can be renewed.
 * IPC: an export of a block (rmmc_ipc_export) is revoked by a pause (its
 * importer's check reports it stale); the importer's open mapping keeps
 * the old physical pages alive, and away from this process, until it
 * closes it, and never sees the new ones: export again after resume.
 *
 * Failures leave the pool paused or awake, never half of each, and lose
 * nothing: a pause either takes effect or leaves the pool as it was, every
 * live block's contents intact. A backup pause whose unmapping the
 * upstream refuses halfway maps back what went and restores it (awake, as
 * before). A discard pause has nothing to restore from, so it gives back
 * the pages under no live block first (a refusal there maps them back:
 * awake as before, no live block touched) and then the others; once a page
 * under a live block has gone the pause goes on to the end, since that
 * block's contents cannot come back and the caller asked for them to go: a
 * refusal then leaves the pool paused as asked, the pages the upstream
 * kept counted as held, and the message says so. If mapping back is
 * refused too the pool stays paused, the pages that could not go counted
 * as held, and resume retries. A resume whose mapping is refused unmaps
 * what it mapped and stays paused with its backup (try again once memory
 * is free). */
typedef enum rmmc_pool_pause_mode {
  RMMC_POOL_PAUSE_BACKUP = 1,  /* live blocks copied to host memory, restored on resume */
  RMMC_POOL_PAUSE_DISCARD = 2, /* live blocks' contents dropped, never read */
} rmmc_pool_pause_mode_t;

/* Pauses the pool layer of `stack` (the pool itself or the first pool below
 * it). Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for no pool layer,
 * a bad mode or a pool paused already; RMMC_ERROR_NOT_SUPPORTED (nothing
 * changed) for a chunk pool, backup over sim, or during a known capture;
 * RMMC_ERROR_OUT_OF_MEMORY when no (pinned) host memory holds the backup
 * (nothing changed); RMMC_ERROR_CUDA when a copy or synchronization fails
 * (nothing changed); the upstream's status when it refuses to unmap (the
 * pool awake as before with its data, or paused as the message says: a
 * discard pause past its first page under a live block, or a pause whose
 * mapping back was refused too; rmmc_pool_sleep_state tells which).
 * Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_pool_pause(rmmc_resource_t *stack, rmmc_pool_pause_mode_t mode,
                                          cudaStream_t stream);

/* Resumes the pool layer of `stack`: maps its pages again at the same
 * addresses and, after a backup, enqueues the copies back on `stream`.
 * Returns RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for no pool layer or a
 * pool not paused; RMMC_ERROR_NOT_SUPPORTED for a chunk pool; the
 * upstream's status (RMMC_ERROR_OUT_OF_MEMORY when memory is short) when it
 * refuses a mapping, or RMMC_ERROR_CUDA when a copy cannot be enqueued: the
 * pool then stays paused with its backup. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_pool_resume(rmmc_resource_t *stack, cudaStream_t stream);

/* A pool's sleep state. */
typedef struct rmmc_pool_sleep_state {
  size_t size;           /* sizeof(rmmc_pool_sleep_state_t): RMMC_POOL_SLEEP_STATE_INIT */
  bool can_sleep;        /* the virtual-memory backend */
  bool paused;
  int mode;              /* the pause's rmmc_pool_pause_mode_t; 0 when awake */
  size_t held;           /* bytes mapped now (the "reserved" figure) */
  size_t unmapped;       /* bytes given back that resume maps again ("paused_bytes") */
  size_t backed_up;      /* bytes of live blocks held on the host ("backed_up") */
  size_t backup_ranges;  /* copies they take (touching blocks are one) */
  size_t host_bytes;     /* host memory kept for backups ("backup_host") */
  uint64_t pauses, resumes;
} rmmc_pool_sleep_state_t;

#define RMMC_POOL_SLEEP_STATE_INIT {sizeof(rmmc_pool_sleep_state_t), false, false, 0, 0, 0, 0, 0, 0, 0, 0}

/* Fills *out (size set with RMMC_POOL_SLEEP_STATE_INIT) for the pool layer
 * of `stack`. describe shows the same once the pool has paused: "sleep"
 * (awake, backup or discard), "paused_bytes", "backed_up", "backup_host",
 * "pauses", "resumes"; while paused "reserved" counts only what is still
 * mapped (0 after a pause that succeeded) and "in_use" the live blocks.
 * RMMC_ERROR_INVALID_ARGUMENT: no pool layer, out NULL or a bad size. */
RMMC_EXPORT rmmc_status_t rmmc_pool_sleep_state(rmmc_resource_t *stack,
                                                rmmc_pool_sleep_state_t *out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_POOL_RESOURCE_H */
