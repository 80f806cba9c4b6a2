/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fixed_size resource (see include/rmmc/fixed_size_resource.h).
 *
 * Each chunk carries an array of block descriptors on the host. A free
 * block sits on the free list of the stream slot it was freed on (doubly
 * linked, so releasing a wholly free chunk can unlink its blocks wherever
 * they are); an allocated block is on no list (owner NULL), which is how a
 * double free is caught. Deallocate finds a pointer's chunk through a map
 * from address windows to the chunk that starts in the window: a window is
 * the largest power of two not above the chunk span, so at most one chunk
 * starts in each window and a pointer's chunk starts in its own window or
 * one of the two before it (three lookups at most, O(1)).
 *
 * A stream's list (newest first) ends in a covered segment: the blocks
 * pushed before its stream's event was last recorded (or before a device
 * synchronization: clean). Only that segment may go to another stream.
 * Events are recorded on demand: a free records its stream's event only
 * while some other stream is starving (had to take a new chunk since it
 * last freed or took blocks), so streams that never share blocks make no
 * CUDA call, and a stream that runs short makes the others cover their
 * frees for it.
 *
 * One mutex guards everything; the upstream is called with it held (chunk
 * growth is rare and this keeps two threads from growing at once).
 *
 * Graph pools (design rule 13): a call that a pool below routes to a CUDA
 * graph's private pool (internal.h, rmmc__graph_routed) bypasses the free
 * lists: the block comes from the upstream, so from the graph pool, and is
 * kept in the `routed` map until its free, which goes straight back to the
 * upstream and so to the graph pool, whichever stream frees it and whether
 * or not the routing has ended. A graph's block thus never enters a free
 * list, and a capture never gets a block another stream freed. Deallocate
 * looks in that map only for a pointer that is none of its blocks. The same
 * path serves every call while the pool below is paused (its pages, those
 * of the free lists included, are unmapped): the pool refuses it, and the
 * free lists serve again once it resumes.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/lock.h"
#include "base/spec.h"
#include "base/stream_events.h"
#include "fixed_size_internal.h"
#include "fixed_size_options.h"
#include "rmmc/fixed_size_resource.h"

typedef struct fs_chunk fs_chunk_t;

typedef struct fs_block {
  struct fs_block *next, *prev;
  fs_chunk_t *chunk;
  rmmc__stream_slot_t *owner; /* the slot whose list holds it; NULL while allocated */
} fs_block_t;

struct fs_chunk {
  void *raw; /* as the upstream returned it */
  size_t raw_bytes, raw_align;
  char *first; /* the first block */
  size_t index; /* in fixed_size_t.chunks */
  size_t nfree;
  fs_block_t blocks[];
};

enum { COVER_CLEAN, COVER_EVENT };

/* The owner data of each stream slot. */
typedef struct fs_list {
  fs_block_t *head, *tail;
  fs_block_t *covered; /* first block of the covered segment, or NULL */
  size_t count;
  int cover;     /* of the covered segment */
  bool starving; /* took a new chunk since it last freed or took blocks */
} fs_list_t;

typedef struct fixed_size {
  rmmc__adaptor_t base;
  size_t block, per_chunk, span, align;
  unsigned block_shift; /* log2(block) when block is a power of two, else 0 */
  unsigned window_shift;
  bool pad; /* the upstream refused the chunk alignment: pad chunks instead */
  rmmc__lock_t lock;
  rmmc__stream_set_t streams;
  const void *last_key; /* cache of the last stream looked up */
  rmmc__stream_slot_t *last_slot;
  rmmc__ptrmap_t windows; /* window index + 1 -> chunk starting in it */
  fs_chunk_t **chunks;
  size_t nchunks, cap_chunks;
  uint64_t reserved, in_use, peak, free_blocks;
  uint32_t starving; /* slots starving */
  rmmc__ptrmap_t routed; /* blocks routed to graph pools -> their alignment; size: bytes */
  uint64_t routed_bytes;
} fixed_size_t;

static const rmmc_resource_ops_t fs_ops;

/* ---- free lists ---- */

static inline fs_list_t *list_of(rmmc__stream_slot_t *slot) { return rmmc__stream_slot_user(slot); }

static inline void list_push(fs_list_t *l, fs_block_t *b) {
  b->prev = NULL;
  b->next = l->head;
  if (l->head != NULL) l->head->prev = b;
  else l->tail = b;
  l->head = b;
  l->count++;
}

static inline fs_block_t *list_pop(fs_list_t *l) {
  fs_block_t *b = l->head;
  if (b == l->covered) l->covered = b->next;
  l->head = b->next;
  if (l->head != NULL) l->head->prev = NULL;
  else l->tail = NULL;
  l->count--;
  return b;
}

static void list_unlink(fs_list_t *l, fs_block_t *b) {
  if (b == l->covered) l->covered = b->next;
  if (b->prev != NULL) b->prev->next = b->next;
  else l->head = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
  else l->tail = b->prev;
  l->count--;
}

/* Moves the covered segment of src into the empty list dst, now owned by
 * dst_slot. */
static void list_take_covered(fs_list_t *dst, rmmc__stream_slot_t *dst_slot, fs_list_t *src) {
  fs_block_t *first = src->covered;
  size_t n = 0;
  for (fs_block_t *b = first; b != NULL; b = b->next, n++) b->owner = dst_slot;
  dst->head = first;
  dst->tail = src->tail;
  dst->count = n;
  src->tail = first->prev;
  if (src->tail != NULL) src->tail->next = NULL;
  else src->head = NULL;
  first->prev = NULL;
  src->count -= n;
  src->covered = NULL;
}

static void set_starving(fixed_size_t *fs, fs_list_t *l, bool starving) {
  if (l->starving == starving) return;
  l->starving = starving;
  if (starving) fs->starving++;
  else fs->starving--;
}

/* After a device synchronization every free block may go anywhere. */
static void mark_all_clean(fixed_size_t *fs) {
  uint32_t n = rmmc__stream_set_count(&fs->streams);
  for (uint32_t i = 0; i < n; i++) {
    fs_list_t *l = list_of(rmmc__stream_set_at(&fs->streams, i));
    l->covered = l->head;
    l->cover = COVER_CLEAN;
  }
}

/* ---- lookups ---- */

static inline char *block_ptr(const fixed_size_t *fs, const fs_block_t *b) {
  return b->chunk->first + (size_t)(b - b->chunk->blocks) * fs->block;
}

static inline void *window_key(const fixed_size_t *fs, uintptr_t addr) {
  return (void *)((addr >> fs->window_shift) + 1);
}

/* The descriptor of the block starting at ptr, or NULL. */
static fs_block_t *find_block(const fixed_size_t *fs, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr, w = p >> fs->window_shift;
  for (uintptr_t d = 0; d < 3 && d <= w; d++) {
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&fs->windows, (void *)(w - d + 1));
    if (e == NULL) continue;
    fs_chunk_t *c = e->value;
    uintptr_t first = (uintptr_t)c->first;
    if (p < first) continue; /* starts after p: a chunk further back may hold it */
    size_t off = p - first;
    if (off >= fs->span) return NULL; /* past the last chunk starting before p */
    if (fs->block_shift != 0) {
      if ((off & (fs->block - 1)) != 0) return NULL;
      return &c->blocks[off >> fs->block_shift];
    }
    if (off % fs->block != 0) return NULL;
    return &c->blocks[off / fs->block];
  }
  return NULL;
}

static inline rmmc_status_t slot_for(fixed_size_t *fs, cudaStream_t stream,
                                     rmmc__stream_slot_t **out) {
  const void *key = rmmc__stream_key(stream);
  if (RMMC_LIKELY(key == fs->last_key)) {
    *out = fs->last_slot;
    return RMMC_SUCCESS;
  }
  rmmc_status_t st = rmmc__stream_set_get(&fs->streams, stream, out);
  if (st == RMMC_SUCCESS) {
    fs->last_key = key;
    fs->last_slot = *out;
  }
  return st;
}

/* ---- supply: steal, grow, reclaim ---- */

/* Takes another stream's covered segment for `slot` (whose list is
 * empty): a clean one as it is, one covered by an event after making
 * `stream` wait on it. Returns false if no stream has one; otherwise true
 * with *st the outcome of the wait. */
static bool steal(fixed_size_t *fs, rmmc__stream_slot_t *slot, cudaStream_t stream,
                  rmmc_status_t *st) {
  fs_list_t *mine = list_of(slot);
  uint32_t n = rmmc__stream_set_count(&fs->streams);
  for (uint32_t i = 0; i < n; i++) {
    rmmc__stream_slot_t *other = rmmc__stream_set_at(&fs->streams, i);
    fs_list_t *l = list_of(other);
    if (other == slot || l->covered == NULL) continue;
    if (l->cover == COVER_EVENT) {
      *st = rmmc__stream_slot_wait(&fs->streams, other, stream);
      if (*st != RMMC_SUCCESS) return true;
    }
    /* Safe for this stream now; for others (unless clean) only once it
     * records again. */
    bool clean = l->cover == COVER_CLEAN;
    list_take_covered(mine, slot, l);
    mine->covered = clean ? mine->head : NULL;
    mine->cover = COVER_CLEAN;
    set_starving(fs, mine, false);
    *st = RMMC_SUCCESS;
    return true;
  }
  return false;
}

/* Takes a new chunk from the upstream on `stream`; its blocks go to the
 * slot's (empty) list, usable by that stream only until it records. */
static rmmc_status_t grow(fixed_size_t *fs, rmmc__stream_slot_t *slot, cudaStream_t stream) {
  rmmc_resource_t *up = fs->base.upstream;
  if (fs->nchunks == fs->cap_chunks) {
    size_t cap = fs->cap_chunks ? fs->cap_chunks * 2 : 8;
    fs_chunk_t **a = realloc(fs->chunks, cap * sizeof *a);
    if (a == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "fixed_size: no host memory");
    fs->chunks = a;
    fs->cap_chunks = cap;
  }
  fs_chunk_t *c = malloc(sizeof *c + fs->per_chunk * sizeof(fs_block_t));
  if (c == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "fixed_size: no host memory");
  void *raw = NULL;
  size_t bytes = fs->span, align = fs->align;
  rmmc_status_t st = RMMC_ERROR_NOT_SUPPORTED;
  if (!fs->pad) {
    st = rmmc__upstream_allocate(up, bytes, align, stream, &raw);
    if (st == RMMC_ERROR_NOT_SUPPORTED && align > RMMC_DEFAULT_ALIGNMENT) fs->pad = true;
  }
  if (fs->pad) {
    bytes = fs->span + fs->align - RMMC_DEFAULT_ALIGNMENT;
    align = RMMC_DEFAULT_ALIGNMENT;
    st = rmmc__upstream_allocate(up, bytes, align, stream, &raw);
  }
  if (st != RMMC_SUCCESS) {
    char b1[32], b2[32];
    rmmc__append_error("; fixed_size (%s blocks) could not take a %s chunk from %s",
                       rmmc__format_bytes(fs->block, b1, sizeof b1),
                       rmmc__format_bytes(bytes, b2, sizeof b2), up->ops->name);
    free(c);
    return st;
  }
  c->raw = raw;
  c->raw_bytes = bytes;
  c->raw_align = align;
  c->first = (char *)rmmc__align_up((uintptr_t)raw, fs->align);
  if (!rmmc__ptrmap_insert(&fs->windows, window_key(fs, (uintptr_t)c->first), c, 0)) {
    (void)rmmc_resource_deallocate(up, raw, bytes, align, stream);
    free(c);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "fixed_size: no host memory");
  }
  fs_list_t *l = list_of(slot);
  for (size_t i = 0; i < fs->per_chunk; i++) {
    fs_block_t *b = &c->blocks[i];
    b->chunk = c;
    b->owner = slot;
    b->prev = i ? &c->blocks[i - 1] : NULL;
    b->next = i + 1 < fs->per_chunk ? &c->blocks[i + 1] : NULL;
  }
  l->head = &c->blocks[0];
  l->tail = &c->blocks[fs->per_chunk - 1];
  l->count = fs->per_chunk;
  l->covered = NULL;
  c->nfree = fs->per_chunk;
  c->index = fs->nchunks;
  fs->chunks[fs->nchunks++] = c;
  fs->free_blocks += fs->per_chunk;
  fs->reserved += bytes;
  return RMMC_SUCCESS;
}

/* Past MANY_STREAMS streams (a new stream handle per call: streams that
 * free and never come back, their blocks never covered for others), would
 * a new chunk take the reserved blocks past twice those in use, with the
 * free half on other streams' lists? Then a synchronization serves better
 * than growth (the pool's release_slack budget does the same).
 * Workloads with fewer streams keep growing without a synchronization, as
 * before; small sets never pay (SYNC_MIN_CHUNKS). */
#define MANY_STREAMS 64
#define SYNC_MIN_CHUNKS 4
static bool growth_over_budget(const fixed_size_t *fs) {
  return rmmc__stream_set_count(&fs->streams) > MANY_STREAMS && fs->nchunks >= SYNC_MIN_CHUNKS &&
         2 * fs->free_blocks >= fs->nchunks * fs->per_chunk;
}

/* Fills the empty list of `slot`: another stream's reusable list, else
 * (many streams, past the budget above) every stream's after a device
 * synchronization,
 * else a new chunk, else (upstream out of memory) the synchronization
 * after all. */
static rmmc_status_t refill(fixed_size_t *fs, rmmc__stream_slot_t *slot, cudaStream_t stream) {
  rmmc_status_t st;
  if (steal(fs, slot, stream, &st)) return st;
  if (growth_over_budget(fs)) {
    st = rmmc__stream_set_sync(&fs->streams);
    if (st != RMMC_SUCCESS) return st;
    mark_all_clean(fs);
    if (steal(fs, slot, stream, &st)) return st;
  }
  /* From now on other streams cover their frees so this one can reuse them. */
  set_starving(fs, list_of(slot), true);
  /* A failure overcome below (an alignment refused, out of memory) must not
   * show in the thread's error state: the call succeeds. */
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  st = grow(fs, slot, stream);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && fs->free_blocks != 0) {
    rmmc_status_t sst = rmmc__stream_set_sync(&fs->streams);
    if (sst != RMMC_SUCCESS) return sst;
    mark_all_clean(fs);
    if (steal(fs, slot, stream, &sst)) st = sst;
  }
  if (st == RMMC_SUCCESS) rmmc__error_restore(&saved);
  return st;
}

/* ---- the ops ---- */

static rmmc_status_t refuse(const fixed_size_t *fs, size_t bytes, size_t alignment) {
  char b[32];
  if (bytes > fs->block)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "fixed_size: a request of %zu bytes is larger than its block size %s "
                          "(%zu bytes); stack binning or pool for larger requests",
                          bytes, rmmc__format_bytes(fs->block, b, sizeof b), fs->block);
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "fixed_size: alignment %zu is above the %zu bytes its %s blocks are "
                        "aligned to",
                        alignment, fs->align, rmmc__format_bytes(fs->block, b, sizeof b));
}

/* A call routed to a graph pool below: the upstream's block, recorded. */
static RMMC_COLD rmmc_status_t routed_allocate(fixed_size_t *fs, size_t bytes, size_t alignment,
                                               cudaStream_t stream, void **out) {
  rmmc_status_t st = rmmc__upstream_allocate(fs->base.upstream, bytes, alignment, stream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc__lock(&fs->lock);
  bool kept = rmmc__ptrmap_insert(&fs->routed, *out, (void *)(uintptr_t)alignment, bytes);
  if (kept) fs->routed_bytes += bytes;
  rmmc__unlock(&fs->lock);
  if (RMMC_LIKELY(kept)) return RMMC_SUCCESS;
  (void)rmmc_resource_deallocate(fs->base.upstream, *out, bytes, alignment, stream);
  *out = NULL;
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                        "fixed_size: no host memory to record a block of a graph pool");
}

/* The free of a pointer that is none of fs's blocks: a routed block goes
 * back to the upstream (lock held on entry, released on return). */
static RMMC_COLD rmmc_status_t routed_deallocate(fixed_size_t *fs, void *ptr, cudaStream_t stream) {
  rmmc__ptrmap_entry_t *e = fs->routed.count > 0 ? rmmc__ptrmap_find(&fs->routed, ptr) : NULL;
  if (e == NULL) {
    rmmc__unlock(&fs->lock);
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "fixed_size: %p is not the start of one of its blocks", ptr);
  }
  size_t bytes = e->size, alignment = (size_t)(uintptr_t)e->value;
  rmmc__ptrmap_remove(&fs->routed, e);
  fs->routed_bytes -= bytes;
  rmmc__unlock(&fs->lock);
  rmmc_status_t st = rmmc_resource_deallocate(fs->base.upstream, ptr, bytes, alignment, stream);
  if (st == RMMC_SUCCESS) return st;
  /* The upstream kept it: keep knowing it. */
  rmmc__lock(&fs->lock);
  if (rmmc__ptrmap_insert(&fs->routed, ptr, (void *)(uintptr_t)alignment, bytes))
    fs->routed_bytes += bytes;
  else
    rmmc__append_error(" (and fixed_size ran out of host memory to keep knowing %p)", ptr);
  rmmc__unlock(&fs->lock);
  return st;
}

static rmmc_status_t fs_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                 cudaStream_t stream, void **out) {
  fixed_size_t *fs = (fixed_size_t *)r;
  if (RMMC_UNLIKELY(bytes > fs->block || alignment > fs->align)) return refuse(fs, bytes, alignment);
  if (rmmc__graph_routed(fs->base.upstream, stream))
    return routed_allocate(fs, bytes, alignment, stream, out);
  rmmc__stream_slot_t *slot;
  rmmc__lock(&fs->lock);
  rmmc_status_t st = slot_for(fs, stream, &slot);
  if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
    fs_list_t *l = list_of(slot);
    if (RMMC_UNLIKELY(l->head == NULL)) st = refill(fs, slot, stream);
    if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
      fs_block_t *b = list_pop(l);
      b->owner = NULL;
      b->chunk->nfree--;
      fs->free_blocks--;
      fs->in_use += fs->block;
      if (fs->in_use > fs->peak) fs->peak = fs->in_use;
      *out = block_ptr(fs, b);
    }
  }
  rmmc__unlock(&fs->lock);
  return st;
}

static rmmc_status_t fs_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t alignment,
                                   cudaStream_t stream) {
  fixed_size_t *fs = (fixed_size_t *)r;
  if (RMMC_UNLIKELY(bytes > fs->block || alignment > fs->align))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "fixed_size: %p with %zu bytes and alignment %zu cannot be one of its "
                          "%zu-byte blocks",
                          ptr, bytes, alignment, fs->block);
  rmmc__stream_slot_t *slot;
  rmmc_status_t st;
  rmmc__lock(&fs->lock);
  fs_block_t *b = find_block(fs, ptr);
  if (RMMC_UNLIKELY(b == NULL))
    return routed_deallocate(fs, ptr, stream);
  if (RMMC_UNLIKELY(b->owner != NULL))
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "fixed_size: block %p is already free", ptr);
  else if ((st = slot_for(fs, stream, &slot)) == RMMC_SUCCESS) {
    fs_list_t *l = list_of(slot);
    list_push(l, b);
    b->owner = slot;
    b->chunk->nfree++;
    fs->free_blocks++;
    fs->in_use -= fs->block;
    set_starving(fs, l, false);
    /* Cover the list only while another stream is short of blocks; a
     * failed record just keeps the new blocks to this stream. */
    if (RMMC_UNLIKELY(fs->starving != 0) && rmmc__stream_slot_try_record(&fs->streams, slot, stream)) {
      l->covered = l->head;
      l->cover = COVER_EVENT;
    }
  }
  rmmc__unlock(&fs->lock);
  return st;
}

/* Unlinks a wholly free chunk's blocks and forgets it (the caller gave its
 * memory back). */
static void drop_chunk(fixed_size_t *fs, fs_chunk_t *c) {
  for (size_t i = 0; i < fs->per_chunk; i++) list_unlink(list_of(c->blocks[i].owner), &c->blocks[i]);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&fs->windows, window_key(fs, (uintptr_t)c->first));
  if (e != NULL) rmmc__ptrmap_remove(&fs->windows, e);
  fs->free_blocks -= fs->per_chunk;
  fs->reserved -= c->raw_bytes;
  fs->chunks[c->index] = fs->chunks[--fs->nchunks];
  fs->chunks[c->index]->index = c->index;
  free(c);
}

rmmc_status_t rmmc__fixed_size_release_chunks(rmmc_resource_t *r) {
  fixed_size_t *fs = (fixed_size_t *)r;
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&fs->lock);
  bool any = false;
  for (size_t i = 0; i < fs->nchunks && !any; i++) any = fs->chunks[i]->nfree == fs->per_chunk;
  /* Blocks may have been freed on streams with work in flight: wait for
   * the device, then hand whole chunks back on the default stream. */
  if (any) st = rmmc__stream_set_sync(&fs->streams);
  if (any && st == RMMC_SUCCESS) {
    mark_all_clean(fs);
    for (size_t i = 0; i < fs->nchunks;) {
      fs_chunk_t *c = fs->chunks[i];
      if (c->nfree != fs->per_chunk) {
        i++;
        continue;
      }
      st = rmmc_resource_deallocate(fs->base.upstream, c->raw, c->raw_bytes, c->raw_align, NULL);
      if (st != RMMC_SUCCESS) break;
      drop_chunk(fs, c);
    }
  }
  rmmc__unlock(&fs->lock);
  return st;
}

static rmmc_status_t fs_release_cached(rmmc_resource_t *r) {
  rmmc_status_t st = rmmc__fixed_size_release_chunks(r);
  return st == RMMC_SUCCESS ? rmmc_resource_release_cached(rmmc__upstream_of(r)) : st;
}

static void fs_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  fixed_size_t *fs = (fixed_size_t *)r;
  struct {
    RMMC_FIXED_SIZE_FIGURES(RMMC__FIGURE_VALUE)
  } v = {.block_size = fs->block, .blocks_per_chunk = fs->per_chunk};
  rmmc__lock(&fs->lock);
  v.reserved = fs->reserved, v.in_use = fs->in_use, v.peak = fs->peak, v.chunks = fs->nchunks;
  v.free_blocks = fs->free_blocks, v.graph_routed = fs->routed_bytes;
  rmmc__unlock(&fs->lock);
  v.cached = v.free_blocks * fs->block; /* reserved counts chunk padding too */
  v.blocks = v.chunks * fs->per_chunk;
  v.largest_free = v.free_blocks ? fs->block : 0;
  RMMC_FIXED_SIZE_FIGURES(RMMC__FIGURE_EMIT)
  rmmc__stream_set_describe(&fs->streams, emit, ctx);
}

static void fs_destroy(rmmc_resource_t *r) {
  fixed_size_t *fs = (fixed_size_t *)r;
  if (fs->nchunks > 0) (void)rmmc__stream_set_sync(&fs->streams);
  for (size_t i = 0; i < fs->nchunks; i++) {
    fs_chunk_t *c = fs->chunks[i];
    (void)rmmc_resource_deallocate(fs->base.upstream, c->raw, c->raw_bytes, c->raw_align, NULL);
    free(c);
  }
  free(fs->chunks);
  /* Routed blocks still out are freed with the resource, as its own are. */
  for (size_t i = 0; fs->routed.count > 0 && i <= fs->routed.mask; i++) {
    rmmc__ptrmap_entry_t *e = &fs->routed.slots[i];
    if (e->key != NULL)
      (void)rmmc_resource_deallocate(fs->base.upstream, e->key, e->size,
                                     (size_t)(uintptr_t)e->value, NULL);
  }
  rmmc__ptrmap_fini(&fs->routed);
  rmmc__ptrmap_fini(&fs->windows);
  rmmc__stream_set_fini(&fs->streams);
  rmmc__adaptor_fini(&fs->base);
  free(fs);
}

static const rmmc_resource_ops_t fs_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "fixed_size",
    .allocate = fs_allocate,
    .deallocate = fs_deallocate,
    .release_cached = fs_release_cached,
    .describe = fs_describe,
    .destroy = fs_destroy,
    .upstream = rmmc__adaptor_upstream,
};

static unsigned log2_floor(size_t x) { return (unsigned)(63 - __builtin_clzll((unsigned long long)x)); }

RMMC_API rmmc_status_t rmmc_fixed_size_resource_create(rmmc_resource_t *upstream,
                                                       const rmmc_fixed_size_options_t *options,
                                                       rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("fixed_size_resource_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  RMMC__TAKE_OPTIONS(st, "fixed_size_resource_create", &o, options, RMMC_FIXED_SIZE_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  size_t block;
  if (!rmmc__align_up_checked(o.block_size, RMMC_DEFAULT_ALIGNMENT, &block) ||
      o.blocks_per_chunk > (SIZE_MAX - RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT) / block)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "fixed_size_resource_create: %zu blocks of %zu bytes overflow a chunk",
                          o.blocks_per_chunk, o.block_size);
  fixed_size_t *fs = calloc(1, sizeof *fs);
  if (fs == NULL)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "fixed_size_resource_create: no host memory");
  rmmc__adaptor_init(&fs->base, &fs_ops, upstream);
  fs->block = block;
  fs->per_chunk = o.blocks_per_chunk;
  fs->span = block * o.blocks_per_chunk;
  fs->align = block & (~block + 1);
  if (fs->align > RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT) fs->align = RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT;
  fs->block_shift = rmmc__is_pow2(block) ? log2_floor(block) : 0;
  fs->window_shift = log2_floor(fs->span);
  rmmc__stream_set_init(&fs->streams, upstream, sizeof(fs_list_t));
  rmmc__ptrmap_init(&fs->windows);
  rmmc__ptrmap_init(&fs->routed);
  *out = &fs->base.base;
  return RMMC_SUCCESS;
}

RMMC_API size_t rmmc_fixed_size_resource_block_size(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &fs_ops, "fixed_size_resource_block_size") != RMMC_SUCCESS) return 0;
  return ((const fixed_size_t *)r)->block;
}

RMMC_API size_t rmmc_fixed_size_resource_block_alignment(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &fs_ops, "fixed_size_resource_block_alignment") != RMMC_SUCCESS) return 0;
  return ((const fixed_size_t *)r)->align;
}

#define FS_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_fixed_size_options_t, __VA_ARGS__)
static const rmmc__spec_option_t fs_spec_options[] = {
    RMMC__FIXED_SIZE_OPTIONS(FS_SPEC_ROW){.name = NULL},
};
#undef FS_SPEC_ROW

static rmmc_status_t fs_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream, int device,
                              rmmc_resource_t **out) {
  (void)device;
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, fs_spec_options, upstream, &o);
  return st == RMMC_SUCCESS ? rmmc_fixed_size_resource_create(upstream, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__fixed_size_spec = {
    .name = "fixed_size",
    .help = "blocks of one size carved from upstream chunks, O(1) free lists per stream",
    .needs_upstream = true,
    .options = fs_spec_options,
    .build = fs_build,
};
