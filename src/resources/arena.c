/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource (see include/rmmc/arena_resource.h).
 *
 * Three levels, each with its own lock, always taken in this order:
 * arenas_lock (the list of arenas) > an arena's lock > glock (the global
 * arena). No path holds two arena locks.
 *
 * - Global arena (glock): chunks from the upstream; an address-ordered
 *   array of free ranges, each tagged with how other streams may reuse it
 *   (clean; same stream only; after the stream's event; after a device
 *   synchronization); maps from superblock base and from large block to
 *   the owning arena. Ranges of different chunks or tags never merge.
 * - Arena (one per thread and stream, lock uncontended unless another
 *   thread frees into it): superblocks by size class (lists of those with a
 *   free block), a map of its superblocks, and frees from other streams
 *   waiting for the owner's stream to wait on their events. A class's last
 *   superblock stays in its class list when wholly free, still formatted (a
 *   thread that allocates and frees one block over and over never
 *   reformats, nor touches the global arena); up to `keep` further wholly
 *   free superblocks wait in a classless list. Large blocks it took from
 *   the global arena are its own too: freed on its stream they are cached
 *   by class (up to cache_limit bytes) for its next large request.
 * - Superblock: superblock_size bytes at a multiple of that size, one size
 *   class, a bitmap of blocks in use (a hint keeps the scan short).
 *
 * Threads find their arena through a thread-local cache (resource id,
 * stream) -> arena, backed by a per-thread list of entries, one per arena
 * resource, that a pthread key destructor walks at thread exit. Entries
 * hold a reference to a small shared record that outlives the resource, so
 * a thread exiting after the resource is gone (or while it is destroyed)
 * only finds the record marked dead. Arena structs are freed only with the
 * resource; a dead thread's arena is reused once it holds nothing.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../lock.h"
#include "../spec.h"
#include "../stream_events.h"
#include "rmmc/arena_resource.h"

#define MAX_CLASSES 80
#define NO_CLASS UINT32_MAX
#define MIN_SUPERBLOCK ((size_t)64 << 10)
#define MAX_SUPERBLOCK ((size_t)1 << 30)

/* How a free range of the global arena may be reused by a stream. */
enum {
  TAG_CLEAN, /* by any stream */
  TAG_SAME,  /* by `slot`'s stream only (no event covers it) */
  TAG_EVENT, /* by others after waiting on `slot`'s event */
  TAG_MIXED, /* freed on several streams: only after a device sync */
};

typedef struct achunk {
  void *raw;
  size_t raw_bytes, raw_align;
  char *start; /* superblock-aligned */
  size_t size;
} achunk_t;

typedef struct range {
  char *start;
  size_t size;
  achunk_t *chunk;
  rmmc__stream_slot_t *slot; /* TAG_SAME, TAG_EVENT */
  int tag;
} range_t;

struct arena;

typedef struct sb {
  char *base;
  achunk_t *chunk;
  struct arena *owner;
  struct sb *next, *prev;
  uint32_t cls, block, nblocks, nused, hint;
  bool mixed; /* holds a block freed on another stream with no wait (detached arena) */
  uint64_t bits[]; /* 1: in use; bits from nblocks up are set */
} sb_t;

typedef struct pending {
  sb_t *sb;
  uint32_t idx;
  rmmc__stream_slot_t *slot;
} pending_t;

/* A large block an arena owns: allocated, or freed on its stream and
 * cached for its next request of the same class. */
typedef struct lblk {
  char *ptr;
  size_t size;
  achunk_t *chunk;
  struct lblk *next; /* in the cache */
  bool cached;
} lblk_t;

#define LARGE_CLASSES 64 /* cached large classes: up to 2^16 x the largest small one */
#define ARENAS_PER_THREAD 64 /* arenas (streams) a thread keeps attached */

typedef struct arena {
  rmmc__lock_t lock;
  rmmc__stream_slot_t *slot; /* its stream */
  bool attached;             /* a live thread uses it */
  size_t nsb;    /* superblocks held */
  size_t nidle;  /* of which wholly free (in their class list or in `empty`) */
  size_t nempty; /* of which in `empty` */
  uint64_t in_use;
  sb_t *empty; /* wholly free superblocks of no class (singly linked) */
  rmmc__ptrmap_t sbs;
  pending_t *pending;
  size_t npending, cap_pending;
  rmmc__ptrmap_t large; /* its large blocks -> lblk_t */
  size_t lcached;       /* bytes of large blocks cached */
  uint64_t large_live, large_bytes;
  struct arena *next_all;
  sb_t *partial[MAX_CLASSES];
  lblk_t *lcache[LARGE_CLASSES];
} arena_t;

struct arena_res;

typedef struct shared {
  pthread_mutex_t lock;
  bool alive; /* atomic */
  long refs;
  struct arena_res *res;
} shared_t;

typedef struct arena_res {
  rmmc__adaptor_t base;
  uint64_t rid;
  size_t sb_size, max_small, chunk_size, max_size, keep, cache_limit;
  unsigned sb_shift;
  uint32_t nwords, nclasses;
  uint32_t class_bytes[MAX_CLASSES];
  rmmc__stream_set_t streams;
  pthread_mutex_t glock;
  range_t *free;
  size_t nfree, cap_free;
  achunk_t **chunks;
  size_t nchunks, cap_chunks;
  rmmc__ptrmap_t owners; /* superblock base -> arena */
  rmmc__ptrmap_t large;  /* large block -> owning arena */
  size_t reserved;
  bool pad;
  uint64_t evictions;      /* atomic: arenas detached for a thread's 65th stream */
  uint64_t evictions_seen; /* glock: the count at the last synchronization for them */
  pthread_mutex_t arenas_lock;
  arena_t *arenas;
  shared_t *shared;
} arena_res_t;

static const rmmc_resource_ops_t arena_ops;

/* ---- size classes: 256, 512, 768, 1024, then four steps per power of two ---- */

static uint32_t class_index(size_t s) {
  if (s <= 1024) return (uint32_t)((s + 255) / 256 - 1);
  unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(s - 1));
  size_t step = (size_t)1 << (k - 2);
  size_t m = (s - ((size_t)1 << k) + step - 1) / step;
  return (uint32_t)(4 + (k - 10) * 4 + (m - 1));
}

static size_t class_size(uint32_t i) {
  if (i < 4) return 256 * ((size_t)i + 1);
  unsigned k = 10 + (i - 4) / 4;
  return ((size_t)1 << k) + (size_t)((i - 4) % 4 + 1) * ((size_t)1 << (k - 2));
}

/* The class serving (bytes, alignment), or nclasses for the global arena. */
static inline uint32_t route(const arena_res_t *res, size_t bytes, size_t alignment) {
  size_t s = bytes > alignment ? bytes : alignment;
  if (s > res->max_small) return res->nclasses;
  uint32_t i = class_index(s);
  while (i < res->nclasses && (res->class_bytes[i] & (alignment - 1)) != 0) i++;
  return i;
}

/* The bytes a large block of `bytes` occupies (0 if it cannot be served). */
static size_t large_size(size_t bytes) {
  return bytes > SIZE_MAX / 4 ? 0 : class_size(class_index(bytes));
}

/* ---- global arena (glock held) ---- */

static bool g_reserve_ranges(arena_res_t *res, size_t extra) {
  if (res->nfree + extra <= res->cap_free) return true;
  size_t cap = res->cap_free ? res->cap_free * 2 : 32;
  while (cap < res->nfree + extra) cap *= 2;
  range_t *a = realloc(res->free, cap * sizeof *a);
  if (a == NULL) return false;
  res->free = a;
  res->cap_free = cap;
  return true;
}

static bool same_kind(const range_t *a, const range_t *b) {
  return a->chunk == b->chunk && a->tag == b->tag && a->slot == b->slot;
}

/* Adds a free range, merging it with neighbours of its chunk and tag. If
 * host memory for the array runs out the range is lost (leaked, never
 * corrupted). */
static void g_put(arena_res_t *res, char *start, size_t size, achunk_t *chunk, int tag,
                  rmmc__stream_slot_t *slot) {
  range_t r = {start, size, chunk, tag == TAG_CLEAN || tag == TAG_MIXED ? NULL : slot, tag};
  size_t lo = 0, hi = res->nfree;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (res->free[mid].start < start) lo = mid + 1;
    else hi = mid;
  }
  range_t *prev = lo > 0 ? &res->free[lo - 1] : NULL;
  range_t *next = lo < res->nfree ? &res->free[lo] : NULL;
  bool with_prev = prev != NULL && same_kind(prev, &r) && prev->start + prev->size == start;
  bool with_next = next != NULL && same_kind(next, &r) && start + size == next->start;
  if (with_prev && with_next) {
    prev->size += size + next->size;
    memmove(next, next + 1, (res->nfree - lo - 1) * sizeof *next);
    res->nfree--;
  } else if (with_prev) {
    prev->size += size;
  } else if (with_next) {
    next->start = start;
    next->size += size;
  } else if (g_reserve_ranges(res, 1)) {
    memmove(&res->free[lo + 1], &res->free[lo], (res->nfree - lo) * sizeof *res->free);
    res->free[lo] = r;
    res->nfree++;
  }
}

/* After a device synchronization every free range is clean: retag and
 * merge neighbours of the same chunk. */
static void g_all_clean(arena_res_t *res) {
  size_t n = 0;
  for (size_t i = 0; i < res->nfree; i++) {
    range_t r = res->free[i];
    r.tag = TAG_CLEAN;
    r.slot = NULL;
    if (n > 0 && same_kind(&res->free[n - 1], &r) &&
        res->free[n - 1].start + res->free[n - 1].size == r.start)
      res->free[n - 1].size += r.size;
    else
      res->free[n++] = r;
  }
  res->nfree = n;
}

static bool g_all_clean_already(const arena_res_t *res) {
  for (size_t i = 0; i < res->nfree; i++)
    if (res->free[i].tag != TAG_CLEAN) return false;
  return true;
}

/* Removes [p, p+size) at `align` from the first free range `slot`'s stream
 * may use: first those it may use as they are, then those covered by
 * another stream's event (after making `stream` wait on it). Returns
 * RMMC_ERROR_OUT_OF_MEMORY without a message if nothing fits. */
static rmmc_status_t g_carve(arena_res_t *res, size_t size, size_t align,
                             rmmc__stream_slot_t *slot, cudaStream_t stream, char **out,
                             achunk_t **chunk) {
  if (!g_reserve_ranges(res, 1))
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < res->nfree; i++) {
      range_t *r = &res->free[i];
      bool usable = pass == 0 ? r->tag == TAG_CLEAN ||
                                    ((r->tag == TAG_SAME || r->tag == TAG_EVENT) && r->slot == slot)
                              : r->tag == TAG_EVENT && r->slot != slot;
      if (!usable) continue;
      size_t off = (size_t)((char *)rmmc__align_up((uintptr_t)r->start, align) - r->start);
      if (off > r->size || r->size - off < size) continue;
      if (pass == 1) {
        rmmc_status_t st = rmmc__stream_slot_wait(&res->streams, r->slot, stream);
        if (st != RMMC_SUCCESS) return st;
      }
      char *p = r->start + off;
      size_t right = r->size - off - size;
      *out = p;
      *chunk = r->chunk;
      if (off > 0 && right > 0) {
        range_t tail = *r;
        tail.start = p + size;
        tail.size = right;
        r->size = off;
        memmove(&res->free[i + 2], &res->free[i + 1], (res->nfree - i - 1) * sizeof *r);
        res->free[i + 1] = tail;
        res->nfree++;
      } else if (off > 0) {
        r->size = off;
      } else if (right > 0) {
        r->start = p + size;
        r->size = right;
      } else {
        memmove(r, r + 1, (res->nfree - i - 1) * sizeof *r);
        res->nfree--;
      }
      return RMMC_SUCCESS;
    }
  }
  return RMMC_ERROR_OUT_OF_MEMORY;
}

static rmmc_status_t up_allocate(arena_res_t *res, size_t bytes, void **raw, size_t *raw_bytes,
                                 size_t *raw_align) {
  rmmc_resource_t *up = res->base.upstream;
  rmmc_status_t st = RMMC_ERROR_NOT_SUPPORTED;
  *raw_bytes = bytes;
  *raw_align = res->sb_size;
  if (!res->pad) {
    st = rmmc__upstream_allocate(up, bytes, res->sb_size, NULL, raw);
    if (st == RMMC_ERROR_NOT_SUPPORTED) res->pad = true;
  }
  if (res->pad) {
    *raw_bytes = bytes + res->sb_size - RMMC_DEFAULT_ALIGNMENT;
    *raw_align = RMMC_DEFAULT_ALIGNMENT;
    st = rmmc__upstream_allocate(up, *raw_bytes, *raw_align, NULL, raw);
  }
  return st;
}

/* Takes a chunk that holds `size` bytes at `align` from the upstream. */
static rmmc_status_t g_grow(arena_res_t *res, size_t size, size_t align, cudaStream_t stream) {
  size_t need;
  if (!rmmc__align_up_checked(size, res->sb_size, &need) ||
      (align > res->sb_size && need > SIZE_MAX - align))
    return rmmc_set_oom_error(&res->base.base, size, stream, "arena: the request is too large");
  if (align > res->sb_size) need += align - res->sb_size;
  size_t bytes = need > res->chunk_size ? need : res->chunk_size;
  char b1[32], b2[32];
  if (res->max_size != 0) {
    if (res->reserved > res->max_size || res->max_size - res->reserved < need)
      return rmmc_set_oom_error(&res->base.base, size, stream,
                                "arena: its limit of %s from the upstream is reached (%s taken)",
                                rmmc__format_bytes(res->max_size, b1, sizeof b1),
                                rmmc__format_bytes(res->reserved, b2, sizeof b2));
    size_t room = (res->max_size - res->reserved) & ~(res->sb_size - 1);
    if (bytes > room) bytes = room;
  }
  if (res->nchunks == res->cap_chunks) {
    size_t cap = res->cap_chunks ? res->cap_chunks * 2 : 8;
    achunk_t **a = realloc(res->chunks, cap * sizeof *a);
    if (a == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
    res->chunks = a;
    res->cap_chunks = cap;
  }
  achunk_t *c = malloc(sizeof *c);
  if (c == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
  rmmc_status_t st = up_allocate(res, bytes, &c->raw, &c->raw_bytes, &c->raw_align);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && bytes > need) {
    bytes = need; /* short of a whole chunk: take what this request needs */
    st = up_allocate(res, bytes, &c->raw, &c->raw_bytes, &c->raw_align);
  }
  if (st == RMMC_SUCCESS) {
    /* Taken on the default stream: wait for it once so every stream may
     * use the chunk (RMM's arena allocates synchronously too). */
    st = rmmc__stream_set_sync_stream(&res->streams, NULL);
    if (st != RMMC_SUCCESS)
      (void)rmmc_resource_deallocate(res->base.upstream, c->raw, c->raw_bytes, c->raw_align, NULL);
  } else {
    rmmc__append_error("; arena could not take a %s chunk from %s",
                       rmmc__format_bytes(bytes, b1, sizeof b1), res->base.upstream->ops->name);
  }
  if (st != RMMC_SUCCESS) {
    free(c);
    return st;
  }
  c->start = (char *)rmmc__align_up((uintptr_t)c->raw, res->sb_size);
  c->size = bytes;
  res->chunks[res->nchunks++] = c;
  res->reserved += c->raw_bytes;
  g_put(res, c->start, c->size, c, TAG_CLEAN, NULL);
  return RMMC_SUCCESS;
}

/* Bytes of free ranges no stream but their own (or, mixed, none) may use
 * before a device synchronization. */
static size_t g_stranded(const arena_res_t *res) {
  size_t n = 0;
  for (size_t i = 0; i < res->nfree; i++)
    if (res->free[i].tag == TAG_SAME || res->free[i].tag == TAG_MIXED) n += res->free[i].size;
  return n;
}

/* Carves, growing once if nothing fits. After a thread detached arenas
 * for naming more than ARENAS_PER_THREAD streams (a new stream handle per
 * call), their memory is stranded on streams that may never come back:
 * before growing past twice what is not stranded, the device is then
 * synchronized and every range becomes clean instead (issue 11; the pool's
 * release_slack budget does the same). Workloads with fewer streams per
 * thread keep growing without a synchronization, as before. */
static rmmc_status_t g_take(arena_res_t *res, size_t size, size_t align, rmmc__stream_slot_t *slot,
                            cudaStream_t stream, char **out, achunk_t **chunk) {
  rmmc_status_t st = g_carve(res, size, align, slot, stream, out, chunk);
  if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  uint64_t evictions = __atomic_load_n(&res->evictions, __ATOMIC_RELAXED);
  if (evictions != res->evictions_seen && res->reserved > 0 &&
      2 * g_stranded(res) >= res->reserved) {
    res->evictions_seen = evictions;
    st = rmmc__stream_set_sync(&res->streams);
    if (st != RMMC_SUCCESS) return st;
    g_all_clean(res);
    st = g_carve(res, size, align, slot, stream, out, chunk);
    if (st != RMMC_ERROR_OUT_OF_MEMORY) return st;
  }
  st = g_grow(res, size, align, stream);
  if (st != RMMC_SUCCESS) return st;
  st = g_carve(res, size, align, slot, stream, out, chunk);
  if (st == RMMC_ERROR_OUT_OF_MEMORY)
    return rmmc_set_oom_error(&res->base.base, size, stream, "arena: no room after growing");
  return st;
}

/* ---- superblocks (owner's lock held) ---- */

static void list_push(sb_t **head, sb_t *sb) {
  sb->prev = NULL;
  sb->next = *head;
  if (*head != NULL) (*head)->prev = sb;
  *head = sb;
}

static void list_remove(sb_t **head, sb_t *sb) {
  if (sb->prev != NULL) sb->prev->next = sb->next;
  else *head = sb->next;
  if (sb->next != NULL) sb->next->prev = sb->prev;
}

static void sb_format(const arena_res_t *res, sb_t *sb, uint32_t cls) {
  sb->cls = cls;
  sb->block = res->class_bytes[cls];
  sb->nblocks = (uint32_t)(res->sb_size / sb->block);
  sb->nused = 0;
  sb->hint = 0;
  sb->mixed = false;
  uint32_t w = sb->nblocks / 64, rem = sb->nblocks % 64;
  memset(sb->bits, 0, w * sizeof(uint64_t));
  if (rem != 0) sb->bits[w++] = ~(uint64_t)0 << rem;
  memset(&sb->bits[w], 0xff, (res->nwords - w) * sizeof(uint64_t));
}

static inline uint32_t sb_take(sb_t *sb) {
  for (uint32_t w = sb->hint;; w++) {
    uint64_t avail = ~sb->bits[w];
    if (avail != 0) {
      unsigned b = (unsigned)__builtin_ctzll(avail);
      sb->bits[w] |= (uint64_t)1 << b;
      sb->hint = w;
      sb->nused++;
      return w * 64 + b;
    }
  }
}

/* Removes sb from its arena and gives its range to the global arena. */
static void give_back(arena_res_t *res, arena_t *a, sb_t *sb, int tag) {
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&a->sbs, sb->base);
  if (e != NULL) rmmc__ptrmap_remove(&a->sbs, e);
  a->nsb--;
  pthread_mutex_lock(&res->glock);
  e = rmmc__ptrmap_find(&res->owners, sb->base);
  if (e != NULL) rmmc__ptrmap_remove(&res->owners, e);
  g_put(res, sb->base, res->sb_size, sb->chunk, sb->mixed ? TAG_MIXED : tag, a->slot);
  pthread_mutex_unlock(&res->glock);
  free(sb);
}

/* Marks block idx of sb free (the caller accounted in_use). A superblock
 * left wholly free is kept (see the top of the file) or given back covered
 * by an event recorded now on `stream`, which is the arena's stream (the
 * caller frees or allocates on it) unless sb is mixed. */
static void sb_release(arena_res_t *res, arena_t *a, sb_t *sb, uint32_t idx, cudaStream_t stream) {
  bool was_full = sb->nused == sb->nblocks;
  sb->bits[idx / 64] &= ~((uint64_t)1 << (idx % 64));
  if (idx / 64 < sb->hint) sb->hint = idx / 64;
  sb->nused--;
  if (sb->nused != 0) {
    if (was_full) list_push(&a->partial[sb->cls], sb);
    return;
  }
  if (!was_full) list_remove(&a->partial[sb->cls], sb);
  if (a->attached && a->partial[sb->cls] == NULL) {
    list_push(&a->partial[sb->cls], sb); /* the class's last: stays, formatted */
    a->nidle++;
    return;
  }
  if (a->attached && a->nempty < res->keep) {
    sb->cls = NO_CLASS;
    sb->next = a->empty;
    a->empty = sb;
    a->nempty++;
    a->nidle++;
    return;
  }
  int tag = TAG_SAME;
  if (!sb->mixed && rmmc__stream_slot_try_record(&res->streams, a->slot, stream)) tag = TAG_EVENT;
  give_back(res, a, sb, tag);
}

/* Gives every wholly free superblock of the arena back, tagged `tag`
 * (no stream to record on: the caller is not on the arena's stream).
 * Returns how many. */
static size_t give_back_idle(arena_res_t *res, arena_t *a, int tag) {
  size_t n = 0;
  while (a->empty != NULL) {
    sb_t *sb = a->empty;
    a->empty = sb->next;
    give_back(res, a, sb, tag);
    n++;
  }
  for (uint32_t c = 0; c < res->nclasses && n < a->nidle; c++) {
    for (sb_t *sb = a->partial[c], *next; sb != NULL; sb = next) {
      next = sb->next;
      if (sb->nused != 0) continue;
      list_remove(&a->partial[c], sb);
      give_back(res, a, sb, tag);
      n++;
    }
  }
  a->nidle = 0;
  a->nempty = 0;
  return n;
}

/* Takes large block b from arena a (owner's lock held) and gives its range
 * to the global arena. */
static void large_give_back(arena_res_t *res, arena_t *a, lblk_t *b, int tag,
                            rmmc__stream_slot_t *slot) {
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&a->large, b->ptr);
  if (e != NULL) rmmc__ptrmap_remove(&a->large, e);
  pthread_mutex_lock(&res->glock);
  e = rmmc__ptrmap_find(&res->large, b->ptr);
  if (e != NULL) rmmc__ptrmap_remove(&res->large, e);
  g_put(res, b->ptr, b->size, b->chunk, tag, slot);
  pthread_mutex_unlock(&res->glock);
  free(b);
}

/* Gives every cached large block of the arena back (no stream to record
 * on). Returns how many. */
static size_t give_back_large_cache(arena_res_t *res, arena_t *a) {
  size_t n = 0;
  for (uint32_t c = 0; c < LARGE_CLASSES; c++) {
    while (a->lcache[c] != NULL) {
      lblk_t *b = a->lcache[c];
      a->lcache[c] = b->next;
      large_give_back(res, a, b, TAG_SAME, a->slot);
      n++;
    }
  }
  a->lcached = 0;
  return n;
}

/* The index of the allocated block of class cls at ptr in sb, or
 * UINT32_MAX with *st set. */
static uint32_t sb_check(const arena_t *a, const sb_t *sb, const void *ptr, uint32_t cls,
                         size_t bytes, rmmc_status_t *st) {
  *st = RMMC_SUCCESS;
  if (sb->cls != cls) {
    *st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                         "arena: %p is in a superblock of %u-byte blocks, not of the class of "
                         "%zu bytes",
                         ptr, sb->cls == NO_CLASS ? 0u : sb->block, bytes);
    return UINT32_MAX;
  }
  size_t off = (size_t)((const char *)ptr - sb->base);
  uint32_t idx = (uint32_t)(off / sb->block);
  if (off % sb->block != 0 || idx >= sb->nblocks) {
    *st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "arena: %p is not the start of a block", ptr);
    return UINT32_MAX;
  }
  bool pending = false;
  for (size_t i = 0; i < a->npending && !pending; i++)
    pending = a->pending[i].sb == sb && a->pending[i].idx == idx;
  if (pending || !(sb->bits[idx / 64] >> (idx % 64) & 1)) {
    *st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "arena: block %p is already free", ptr);
    return UINT32_MAX;
  }
  return idx;
}

/* Frees made on other streams: wait for each of their events on the
 * arena's stream (alive: the caller allocates on it), then release. */
static rmmc_status_t merge_pending(arena_res_t *res, arena_t *a, cudaStream_t stream) {
  for (size_t i = 0; i < a->npending; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = a->pending[j].slot == a->pending[i].slot;
    if (seen) continue;
    rmmc_status_t st = rmmc__stream_slot_wait(&res->streams, a->pending[i].slot, stream);
    if (st != RMMC_SUCCESS) return st;
  }
  size_t n = a->npending;
  a->npending = 0;
  for (size_t i = 0; i < n; i++) sb_release(res, a, a->pending[i].sb, a->pending[i].idx, stream);
  return RMMC_SUCCESS;
}

static rmmc_status_t take_superblock(arena_res_t *res, arena_t *a, uint32_t cls,
                                     cudaStream_t stream, sb_t **out) {
  sb_t *sb = a->empty;
  if (sb != NULL) {
    a->empty = sb->next; /* still counted idle until its first block goes */
    a->nempty--;
  } else {
    sb = malloc(sizeof *sb + res->nwords * sizeof(uint64_t));
    if (sb == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
    pthread_mutex_lock(&res->glock);
    rmmc_status_t st = g_take(res, res->sb_size, res->sb_size, a->slot, stream, &sb->base, &sb->chunk);
    if (st == RMMC_SUCCESS && !rmmc__ptrmap_insert(&res->owners, sb->base, a, 0)) {
      g_put(res, sb->base, res->sb_size, sb->chunk, TAG_SAME, a->slot);
      st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
    }
    pthread_mutex_unlock(&res->glock);
    if (st == RMMC_SUCCESS && !rmmc__ptrmap_insert(&a->sbs, sb->base, sb, 0)) {
      a->nsb++;
      sb->mixed = false;
      give_back(res, a, sb, TAG_SAME);
      return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
    }
    if (st != RMMC_SUCCESS) {
      free(sb);
      return st;
    }
    sb->owner = a;
    a->nsb++;
    a->nidle++; /* idle until its first block goes */
  }
  sb_format(res, sb, cls);
  list_push(&a->partial[cls], sb);
  *out = sb;
  return RMMC_SUCCESS;
}

/* The error state at the start of a call, saved by its slow path (where a
 * failure may be overcome) so that a call that succeeds leaves it as it
 * was. */
typedef struct saved_error {
  bool saved;
  rmmc__error_state_t state;
} saved_error_t;

static inline void save_error_once(saved_error_t *e) {
  if (!e->saved) rmmc__error_save(&e->state);
  e->saved = true;
}

static rmmc_status_t small_allocate(arena_res_t *res, arena_t *a, uint32_t cls,
                                    cudaStream_t stream, saved_error_t *err, void **out) {
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&a->lock);
  if (RMMC_UNLIKELY(a->npending != 0)) st = merge_pending(res, a, stream);
  sb_t *sb = a->partial[cls];
  if (RMMC_UNLIKELY(sb == NULL) && st == RMMC_SUCCESS) {
    save_error_once(err);
    st = take_superblock(res, a, cls, stream, &sb);
  }
  if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
    if (RMMC_UNLIKELY(sb->nused == 0)) a->nidle--;
    uint32_t idx = sb_take(sb);
    if (sb->nused == sb->nblocks) list_remove(&a->partial[cls], sb);
    a->in_use += sb->block;
    *out = sb->base + (size_t)idx * sb->block;
  }
  rmmc__unlock(&a->lock);
  return st;
}

/* ---- finding this thread's arena ---- */

typedef struct tl_arena {
  cudaStream_t stream;
  arena_t *arena;
} tl_arena_t;

typedef struct tl_entry { /* one per thread and arena resource */
  struct tl_entry *next;
  shared_t *shared;
  uint64_t rid;
  size_t n, cap;
  tl_arena_t *v;
} tl_entry_t;

static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static int tl_key_error;
static uint64_t next_rid;
static _Thread_local tl_entry_t *tl_head;
static _Thread_local uint64_t tl_rid; /* cache of the last lookup */
static _Thread_local cudaStream_t tl_stream;
static _Thread_local arena_t *tl_arena;

static void shared_unref(shared_t *s) {
  pthread_mutex_lock(&s->lock);
  long left = --s->refs;
  pthread_mutex_unlock(&s->lock);
  if (left == 0) {
    pthread_mutex_destroy(&s->lock);
    free(s);
  }
}

/* Releases the arena's pending frees (owner's lock held) without waiting on
 * their events: the caller either synchronized the device under the lock or
 * knows no stream of the owner will wait. Their superblocks become mixed, so
 * that one given back is tagged, not covered by an event of the owner. */
static void release_pending(arena_res_t *res, arena_t *a) {
  size_t n = a->npending;
  a->npending = 0;
  for (size_t i = 0; i < n; i++) {
    a->pending[i].sb->mixed = true;
    sb_release(res, a, a->pending[i].sb, a->pending[i].idx, NULL);
  }
}

/* A thread's arena loses its thread: its pending frees and wholly free
 * superblocks go back (no stream may be named now: tags, no events). */
static void detach(arena_res_t *res, arena_t *a) {
  rmmc__lock(&a->lock);
  a->attached = false;
  release_pending(res, a);
  (void)give_back_idle(res, a, TAG_SAME);
  (void)give_back_large_cache(res, a);
  rmmc__unlock(&a->lock);
}

static void tl_destructor(void *head) {
  for (tl_entry_t *e = head, *next; e != NULL; e = next) {
    next = e->next;
    shared_t *s = e->shared;
    pthread_mutex_lock(&s->lock);
    if (s->alive)
      for (size_t i = 0; i < e->n; i++) detach(s->res, e->v[i].arena);
    pthread_mutex_unlock(&s->lock);
    shared_unref(s);
    free(e->v);
    free(e);
  }
  tl_head = NULL;
  tl_rid = 0;
}

static void tl_key_init(void) { tl_key_error = pthread_key_create(&tl_key, tl_destructor); }

/* An arena for `slot`: a dead thread's arena that holds nothing, or a new one. */
static rmmc_status_t attach_arena(arena_res_t *res, rmmc__stream_slot_t *slot, arena_t **out) {
  arena_t *a = NULL;
  pthread_mutex_lock(&res->arenas_lock);
  for (arena_t *x = res->arenas; x != NULL && a == NULL; x = x->next_all) {
    rmmc__lock(&x->lock);
    if (!x->attached && x->nsb == 0 && x->npending == 0 && x->large.count == 0) {
      a = x;
      a->attached = true;
      a->slot = slot;
    }
    rmmc__unlock(&x->lock);
  }
  if (a == NULL) {
    size_t bytes = (sizeof *a + 63) & ~(size_t)63; /* own cache lines: no false sharing */
    a = aligned_alloc(64, bytes);
    if (a != NULL) {
      memset(a, 0, sizeof *a);
      rmmc__ptrmap_init(&a->sbs);
      rmmc__ptrmap_init(&a->large);
      a->attached = true;
      a->slot = slot;
      a->next_all = res->arenas;
      res->arenas = a;
    }
  }
  pthread_mutex_unlock(&res->arenas_lock);
  if (a == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
  *out = a;
  return RMMC_SUCCESS;
}

/* This thread's arena for `stream` (NULL when there is none and !create). */
static rmmc_status_t arena_lookup(arena_res_t *res, cudaStream_t stream, bool create,
                                  arena_t **out) {
  if (stream == cudaStreamLegacy) stream = NULL;
  if (RMMC_LIKELY(tl_rid == res->rid && tl_stream == stream)) {
    *out = tl_arena;
    return RMMC_SUCCESS;
  }
  *out = NULL;
  tl_entry_t *entry = NULL;
  bool head_changed = false;
  for (tl_entry_t **pp = &tl_head; *pp != NULL;) {
    tl_entry_t *e = *pp;
    if (e->rid == res->rid) {
      entry = e;
      break;
    }
    if (!__atomic_load_n(&e->shared->alive, __ATOMIC_ACQUIRE)) { /* its resource is gone */
      head_changed |= pp == &tl_head;
      *pp = e->next;
      shared_unref(e->shared);
      free(e->v);
      free(e);
      continue;
    }
    pp = &e->next;
  }
  if (head_changed) (void)pthread_setspecific(tl_key, tl_head);
  for (size_t i = 0; entry != NULL && i < entry->n; i++) {
    if (entry->v[i].stream == stream) {
      *out = entry->v[i].arena;
      break;
    }
  }
  if (*out == NULL && !create) return RMMC_SUCCESS;
  if (*out == NULL) {
    if (entry == NULL) {
      entry = calloc(1, sizeof *entry);
      if (entry == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
      entry->shared = res->shared;
      entry->rid = res->rid;
      pthread_mutex_lock(&res->shared->lock);
      res->shared->refs++;
      pthread_mutex_unlock(&res->shared->lock);
      entry->next = tl_head;
      tl_head = entry;
      (void)pthread_setspecific(tl_key, tl_head);
    }
    if (entry->n == ARENAS_PER_THREAD) {
      /* A thread that keeps naming new streams (a new handle per call)
       * would hold an arena, and the superblocks it caches, per stream
       * (125 GiB reserved for 64 MiB live after 64k handles): its oldest
       * arena is detached as at thread exit, giving back what it caches. */
      detach(res, entry->v[0].arena);
      memmove(entry->v, entry->v + 1, (entry->n - 1) * sizeof *entry->v);
      entry->n--;
      __atomic_add_fetch(&res->evictions, 1, __ATOMIC_RELAXED);
    }
    if (entry->n == entry->cap) {
      size_t cap = entry->cap ? entry->cap * 2 : 4;
      tl_arena_t *v = realloc(entry->v, cap * sizeof *v);
      if (v == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
      entry->v = v;
      entry->cap = cap;
    }
    rmmc__stream_slot_t *slot;
    rmmc_status_t st = rmmc__stream_set_get(&res->streams, stream, &slot);
    if (st == RMMC_SUCCESS) st = attach_arena(res, slot, out);
    if (st != RMMC_SUCCESS) return st;
    entry->v[entry->n++] = (tl_arena_t){stream, *out};
  }
  tl_rid = res->rid;
  tl_stream = stream;
  tl_arena = *out;
  return RMMC_SUCCESS;
}

/* ---- reclaiming ---- */

/* Every arena releases the frees other streams made into it (after a device
 * synchronization) and gives back its wholly free superblocks; then, if any free
 * range may not be reused by every stream, the device is synchronized and
 * all of them become clean. *changed says whether anything became usable. */
static rmmc_status_t reclaim(arena_res_t *res, bool *changed) {
  *changed = false;
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&res->arenas_lock);
  for (arena_t *a = res->arenas; a != NULL; a = a->next_all) {
    rmmc__lock(&a->lock);
    /* Blocks freed on other streams wait for the owner's next allocate,
     * which may never come: without them a superblock never looks free
     * and its chunk never goes back. There is no stream to wait on here,
     * so wait for the device, under the owner's lock so that no free joins
     * meanwhile; then they are complete (host memory: no wait at all). */
    if (a->npending != 0 && st == RMMC_SUCCESS) {
      st = rmmc__stream_set_sync(&res->streams);
      if (st == RMMC_SUCCESS) {
        release_pending(res, a);
        *changed = true;
      }
    }
    if (give_back_idle(res, a, TAG_SAME) + give_back_large_cache(res, a) != 0) *changed = true;
    rmmc__unlock(&a->lock);
  }
  pthread_mutex_unlock(&res->arenas_lock);
  if (st != RMMC_SUCCESS) return st;
  pthread_mutex_lock(&res->glock);
  if (!g_all_clean_already(res)) {
    st = rmmc__stream_set_sync(&res->streams);
    if (st == RMMC_SUCCESS) {
      g_all_clean(res);
      *changed = true;
    }
  }
  pthread_mutex_unlock(&res->glock);
  return st;
}

/* ---- large blocks: the global arena, cached per arena ---- */

/* The cache list of a large block of `size` bytes, or NULL if not cached. */
static lblk_t **cache_list(const arena_res_t *res, arena_t *a, size_t size) {
  uint32_t c = class_index(size);
  if (c < res->nclasses || c - res->nclasses >= LARGE_CLASSES) return NULL;
  return &a->lcache[c - res->nclasses];
}

static rmmc_status_t large_allocate(arena_res_t *res, arena_t *a, size_t bytes, size_t alignment,
                                    cudaStream_t stream, saved_error_t *err, void **out) {
  size_t size = large_size(bytes);
  if (size == 0)
    return rmmc_set_oom_error(&res->base.base, bytes, stream, "arena: the request is too large");
  rmmc__lock(&a->lock);
  rmmc_status_t st = a->npending != 0 ? merge_pending(res, a, stream) : RMMC_SUCCESS;
  if (st != RMMC_SUCCESS) {
    rmmc__unlock(&a->lock);
    return st;
  }
  lblk_t **pp = cache_list(res, a, size), *b = NULL;
  while (pp != NULL && *pp != NULL && ((uintptr_t)(*pp)->ptr & (alignment - 1)) != 0) pp = &(*pp)->next;
  if (pp != NULL && *pp != NULL) { /* freed on this stream: reuse at once */
    b = *pp;
    *pp = b->next;
    b->cached = false;
    a->lcached -= size;
  } else {
    char *p;
    achunk_t *chunk;
    save_error_once(err);
    b = malloc(sizeof *b);
    if (b == NULL) st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
    if (st == RMMC_SUCCESS) {
      pthread_mutex_lock(&res->glock);
      st = g_take(res, size, alignment, a->slot, stream, &p, &chunk);
      if (st == RMMC_SUCCESS && !rmmc__ptrmap_insert(&res->large, p, a, 0)) {
        g_put(res, p, size, chunk, TAG_SAME, a->slot);
        st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
      }
      pthread_mutex_unlock(&res->glock);
    }
    if (st == RMMC_SUCCESS) {
      *b = (lblk_t){p, size, chunk, NULL, false};
      if (!rmmc__ptrmap_insert(&a->large, p, b, 0)) {
        large_give_back(res, a, b, TAG_SAME, a->slot);
        st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
      }
    } else {
      free(b);
    }
  }
  if (st == RMMC_SUCCESS) {
    a->in_use += size;
    a->large_bytes += size;
    a->large_live++;
    *out = b->ptr;
  }
  rmmc__unlock(&a->lock);
  return st;
}

/* Frees large block b of arena a (owner's lock held) on `stream` (slot):
 * cached by the arena if freed on its stream and there is room, else given
 * back covered by the freeing stream's event. */
static rmmc_status_t large_free(arena_res_t *res, arena_t *a, lblk_t *b, size_t bytes,
                                rmmc__stream_slot_t *slot, cudaStream_t stream) {
  size_t size = large_size(bytes);
  if (b->cached)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "arena: large block %p is already free", (void *)b->ptr);
  if (b->size != size)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "arena: large block %p has %zu bytes, not the %zu of a %zu-byte request",
                          (void *)b->ptr, b->size, size, bytes);
  a->in_use -= size;
  a->large_bytes -= size;
  a->large_live--;
  lblk_t **list = cache_list(res, a, size);
  if (a->attached && slot == a->slot && list != NULL && a->lcached + size <= res->cache_limit) {
    b->cached = true;
    b->next = *list;
    *list = b;
    a->lcached += size;
    return RMMC_SUCCESS;
  }
  int tag = rmmc__stream_slot_try_record(&res->streams, slot, stream) ? TAG_EVENT : TAG_SAME;
  large_give_back(res, a, b, tag, slot);
  return RMMC_SUCCESS;
}

static rmmc_status_t large_deallocate(arena_res_t *res, void *ptr, size_t bytes,
                                      cudaStream_t stream) {
  arena_t *a;
  rmmc_status_t st = arena_lookup(res, stream, false, &a);
  if (st != RMMC_SUCCESS) return st;
  if (a != NULL) {
    rmmc__lock(&a->lock);
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&a->large, ptr);
    if (e != NULL) st = large_free(res, a, e->value, bytes, a->slot, stream);
    rmmc__unlock(&a->lock);
    if (e != NULL) return st;
  }
  rmmc__stream_slot_t *slot;
  st = rmmc__stream_set_get(&res->streams, stream, &slot);
  if (st != RMMC_SUCCESS) return st;
  for (int attempt = 0; attempt < 2; attempt++) {
    pthread_mutex_lock(&res->glock);
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&res->large, ptr);
    arena_t *owner = e != NULL ? e->value : NULL;
    pthread_mutex_unlock(&res->glock);
    if (owner == NULL) break;
    rmmc__lock(&owner->lock);
    e = rmmc__ptrmap_find(&owner->large, ptr);
    if (e != NULL) st = large_free(res, owner, e->value, bytes, slot, stream);
    rmmc__unlock(&owner->lock);
    if (e != NULL) return st;
  }
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "arena: %p is not a large block of this arena (%zu bytes given)", ptr, bytes);
}

/* ---- the ops ---- */

static rmmc_status_t arena_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  arena_res_t *res = (arena_res_t *)r;
  arena_t *a;
  rmmc_status_t st = arena_lookup(res, stream, true, &a);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  uint32_t cls = route(res, bytes, alignment);
  saved_error_t err;
  err.saved = false;
  for (int attempt = 0;; attempt++) {
    st = cls < res->nclasses ? small_allocate(res, a, cls, stream, &err, out)
                             : large_allocate(res, a, bytes, alignment, stream, &err, out);
    if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
      if (RMMC_UNLIKELY(err.saved)) rmmc__error_restore(&err.state);
      return st;
    }
    if (st != RMMC_ERROR_OUT_OF_MEMORY || attempt == 1) return st;
    bool changed;
    rmmc_status_t rst = reclaim(res, &changed);
    if (rst != RMMC_SUCCESS) return rst;
    if (!changed) return st;
  }
}

/* A free of a block this thread's arena for `stream` does not hold. */
static rmmc_status_t remote_free(arena_res_t *res, void *ptr, char *base, uint32_t cls,
                                 size_t bytes, cudaStream_t stream) {
  rmmc__stream_slot_t *slot;
  rmmc_status_t st = rmmc__stream_set_get(&res->streams, stream, &slot);
  if (st != RMMC_SUCCESS) return st;
  for (int attempt = 0; attempt < 2; attempt++) {
    pthread_mutex_lock(&res->glock);
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&res->owners, base);
    arena_t *owner = e != NULL ? e->value : NULL;
    pthread_mutex_unlock(&res->glock);
    if (owner == NULL) break;
    rmmc__lock(&owner->lock);
    e = rmmc__ptrmap_find(&owner->sbs, base);
    if (e == NULL) { /* it moved meanwhile: look again */
      rmmc__unlock(&owner->lock);
      continue;
    }
    sb_t *sb = e->value;
    uint32_t idx = sb_check(owner, sb, ptr, cls, bytes, &st);
    if (st == RMMC_SUCCESS) {
      if (owner->slot == slot) { /* same stream, another thread */
        owner->in_use -= sb->block;
        sb_release(res, owner, sb, idx, stream);
      } else if (owner->attached) { /* the owner's stream must wait for this one */
        if (owner->npending == owner->cap_pending) {
          size_t cap = owner->cap_pending ? owner->cap_pending * 2 : 16;
          pending_t *v = realloc(owner->pending, cap * sizeof *v);
          if (v == NULL) st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "arena: no host memory");
          else {
            owner->pending = v;
            owner->cap_pending = cap;
          }
        }
        if (st == RMMC_SUCCESS) st = rmmc__stream_slot_record(&res->streams, slot, stream);
        if (st == RMMC_SUCCESS) {
          owner->pending[owner->npending++] = (pending_t){sb, idx, slot};
          owner->in_use -= sb->block;
        }
      } else { /* no owner stream will ever wait: reusable after a device sync */
        sb->mixed = true;
        owner->in_use -= sb->block;
        sb_release(res, owner, sb, idx, stream);
      }
    }
    rmmc__unlock(&owner->lock);
    return st;
  }
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "arena: %p is not a block of this arena", ptr);
}

static rmmc_status_t arena_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  arena_res_t *res = (arena_res_t *)r;
  uint32_t cls = route(res, bytes, alignment);
  if (cls >= res->nclasses) return large_deallocate(res, ptr, bytes, stream);
  char *base = (char *)((uintptr_t)ptr & ~(uintptr_t)(res->sb_size - 1));
  arena_t *a;
  rmmc_status_t st = arena_lookup(res, stream, false, &a);
  if (st != RMMC_SUCCESS) return st;
  if (RMMC_LIKELY(a != NULL)) {
    rmmc__lock(&a->lock);
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&a->sbs, base);
    if (RMMC_LIKELY(e != NULL)) {
      sb_t *sb = e->value;
      uint32_t idx = sb_check(a, sb, ptr, cls, bytes, &st);
      if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
        a->in_use -= sb->block;
        sb_release(res, a, sb, idx, stream);
      }
      rmmc__unlock(&a->lock);
      return st;
    }
    rmmc__unlock(&a->lock);
  }
  return remote_free(res, ptr, base, cls, bytes, stream);
}

static rmmc_status_t arena_release_cached(rmmc_resource_t *r) {
  arena_res_t *res = (arena_res_t *)r;
  bool changed;
  rmmc_status_t st = reclaim(res, &changed);
  if (st != RMMC_SUCCESS) return st;
  pthread_mutex_lock(&res->glock);
  for (size_t i = 0; i < res->nchunks && st == RMMC_SUCCESS;) {
    achunk_t *c = res->chunks[i];
    size_t k = 0;
    while (k < res->nfree && res->free[k].start != c->start) k++;
    if (k == res->nfree || res->free[k].size != c->size || res->free[k].tag != TAG_CLEAN) {
      i++;
      continue;
    }
    st = rmmc_resource_deallocate(res->base.upstream, c->raw, c->raw_bytes, c->raw_align, NULL);
    if (st != RMMC_SUCCESS) break;
    memmove(&res->free[k], &res->free[k + 1], (res->nfree - k - 1) * sizeof *res->free);
    res->nfree--;
    res->reserved -= c->raw_bytes;
    res->chunks[i] = res->chunks[--res->nchunks];
    free(c);
  }
  pthread_mutex_unlock(&res->glock);
  return st == RMMC_SUCCESS ? rmmc_resource_release_cached(res->base.upstream) : st;
}

static void arena_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  arena_res_t *res = (arena_res_t *)r;
  uint64_t nsb = 0, nidle = 0, in_use = 0, attached = 0, detached = 0;
  uint64_t nlarge = 0, large = 0, lcached = 0;
  pthread_mutex_lock(&res->arenas_lock);
  for (arena_t *a = res->arenas; a != NULL; a = a->next_all) {
    rmmc__lock(&a->lock);
    nsb += a->nsb;
    nidle += a->nidle;
    nlarge += a->large_live;
    large += a->large_bytes;
    lcached += a->lcached;
    in_use += a->in_use;
    if (a->attached) attached++;
    else if (a->nsb > 0 || a->large.count > 0) detached++;
    rmmc__unlock(&a->lock);
  }
  pthread_mutex_unlock(&res->arenas_lock);
  pthread_mutex_lock(&res->glock);
  uint64_t reserved = res->reserved, chunks = res->nchunks, gfree = 0, largest = 0;
  for (size_t i = 0; i < res->nfree; i++) {
    gfree += res->free[i].size;
    if (res->free[i].size > largest) largest = res->free[i].size;
  }
  pthread_mutex_unlock(&res->glock);
  rmmc__emit_bytes(emit, ctx, "superblock_size", res->sb_size);
  rmmc__emit_bytes(emit, ctx, "reserved", reserved);
  rmmc__emit_bytes(emit, ctx, "in_use", in_use);
  rmmc__emit_count(emit, ctx, "chunks", chunks);
  rmmc__emit_count(emit, ctx, "superblocks", nsb);
  rmmc__emit_count(emit, ctx, "cached_superblocks", nidle);
  rmmc__emit_bytes(emit, ctx, "global_free", gfree);
  rmmc__emit_bytes(emit, ctx, "largest_free", largest);
  rmmc__emit_count(emit, ctx, "large_allocations", nlarge);
  rmmc__emit_bytes(emit, ctx, "large_bytes", large);
  rmmc__emit_bytes(emit, ctx, "cached_large_bytes", lcached);
  rmmc__emit_count(emit, ctx, "arenas", attached);
  rmmc__emit_count(emit, ctx, "detached_arenas", detached);
  rmmc__stream_set_describe(&res->streams, emit, ctx);
}

static void arena_destroy(rmmc_resource_t *r) {
  arena_res_t *res = (arena_res_t *)r;
  /* Threads that still hold entries only find the record dead from now. */
  pthread_mutex_lock(&res->shared->lock);
  __atomic_store_n(&res->shared->alive, false, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&res->shared->lock);
  if (res->nchunks > 0) (void)rmmc__stream_set_sync(&res->streams);
  for (arena_t *a = res->arenas, *next; a != NULL; a = next) {
    next = a->next_all;
    for (size_t i = 0; a->sbs.slots != NULL && i <= a->sbs.mask; i++)
      if (a->sbs.slots[i].key != NULL) free(a->sbs.slots[i].value);
    rmmc__ptrmap_fini(&a->sbs);
    for (size_t i = 0; a->large.slots != NULL && i <= a->large.mask; i++)
      if (a->large.slots[i].key != NULL) free(a->large.slots[i].value);
    rmmc__ptrmap_fini(&a->large);
    free(a->pending);
    free(a);
  }
  for (size_t i = 0; i < res->nchunks; i++) {
    achunk_t *c = res->chunks[i];
    (void)rmmc_resource_deallocate(res->base.upstream, c->raw, c->raw_bytes, c->raw_align, NULL);
    free(c);
  }
  free(res->chunks);
  free(res->free);
  rmmc__ptrmap_fini(&res->owners);
  rmmc__ptrmap_fini(&res->large);
  rmmc__stream_set_fini(&res->streams);
  pthread_mutex_destroy(&res->glock);
  pthread_mutex_destroy(&res->arenas_lock);
  shared_unref(res->shared);
  rmmc__adaptor_fini(&res->base);
  free(res);
}

static const rmmc_resource_ops_t arena_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "arena",
    .allocate = arena_allocate,
    .deallocate = arena_deallocate,
    .release_cached = arena_release_cached,
    .describe = arena_describe,
    .destroy = arena_destroy,
    .upstream = rmmc__adaptor_upstream,
};

RMMC_API rmmc_status_t rmmc_arena_resource_create(rmmc_resource_t *upstream,
                                                  const rmmc_arena_options_t *options,
                                                  rmmc_resource_t **out) {
  const char *what = "arena_resource_create";
  rmmc_status_t st = rmmc__check_create(what, upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  st = rmmc__copy_options(what, &o, sizeof o, options);
  if (st != RMMC_SUCCESS) return st;
  if (!rmmc__is_pow2(o.superblock_size) || o.superblock_size < MIN_SUPERBLOCK ||
      o.superblock_size > MAX_SUPERBLOCK)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: superblock size %zu is not a power of two from 64 KiB to 1 GiB",
                          what, o.superblock_size);
  size_t chunk;
  if (o.chunk_size == 0 || !rmmc__align_up_checked(o.chunk_size, o.superblock_size, &chunk))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: chunk size %zu is not usable", what,
                          o.chunk_size);
  if (o.max_size != 0 && o.max_size < o.superblock_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: max size %zu is below one superblock (%zu)", what, o.max_size,
                          o.superblock_size);
  pthread_once(&tl_once, tl_key_init);
  if (tl_key_error != 0)
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "%s: pthread_key_create failed (%d)", what,
                          tl_key_error);
  arena_res_t *res = calloc(1, sizeof *res);
  shared_t *sh = calloc(1, sizeof *sh);
  if (res == NULL || sh == NULL) {
    free(res);
    free(sh);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", what);
  }
  rmmc__adaptor_init(&res->base, &arena_ops, upstream);
  res->rid = __atomic_add_fetch(&next_rid, 1, __ATOMIC_RELAXED);
  res->sb_size = o.superblock_size;
  res->sb_shift = (unsigned)__builtin_ctzll((unsigned long long)o.superblock_size);
  res->nwords = (uint32_t)(o.superblock_size / RMMC_DEFAULT_ALIGNMENT / 64);
  res->max_small = o.superblock_size / 4;
  res->nclasses = class_index(res->max_small) + 1;
  for (uint32_t i = 0; i < res->nclasses; i++) res->class_bytes[i] = (uint32_t)class_size(i);
  res->chunk_size = chunk;
  res->max_size = o.max_size;
  res->keep = o.keep_superblocks;
  res->cache_limit = o.large_cache_size;
  rmmc__stream_set_init(&res->streams, upstream, 0);
  pthread_mutex_init(&res->glock, NULL);
  pthread_mutex_init(&res->arenas_lock, NULL);
  rmmc__ptrmap_init(&res->owners);
  rmmc__ptrmap_init(&res->large);
  pthread_mutex_init(&sh->lock, NULL);
  sh->alive = true;
  sh->refs = 1;
  sh->res = res;
  res->shared = sh;
  *out = &res->base.base;
  return RMMC_SUCCESS;
}

RMMC_API size_t rmmc_arena_resource_block_size(const rmmc_resource_t *r, size_t bytes,
                                               size_t alignment) {
  if (rmmc__check_kind(r, &arena_ops, "arena_resource_block_size") != RMMC_SUCCESS) return 0;
  if (!rmmc__is_pow2(alignment)) {
    (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                         "arena_resource_block_size: alignment %zu is not a power of two", alignment);
    return 0;
  }
  const arena_res_t *res = (const arena_res_t *)r;
  if (alignment < RMMC_DEFAULT_ALIGNMENT) alignment = RMMC_DEFAULT_ALIGNMENT;
  if (bytes == 0) return 0;
  uint32_t cls = route(res, bytes, alignment);
  return cls < res->nclasses ? res->class_bytes[cls] : large_size(bytes);
}

static const rmmc__spec_option_t arena_spec_options[] = {
    {"superblock", RMMC__OPT_BYTES, "superblock size, a power of two (default 4MiB)"},
    {"chunk", RMMC__OPT_BYTES, "taken from the upstream at a time (default 256MiB)"},
    {"max", RMMC__OPT_BYTES_PCT, "most taken from the upstream (default: no limit)"},
    {"keep", RMMC__OPT_INT, "wholly free superblocks a thread's arena keeps (default 4)"},
    {"cache", RMMC__OPT_BYTES, "bytes of freed large blocks a thread's arena keeps (default 1GiB)"},
    {NULL, 0, NULL},
};

static rmmc_status_t arena_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                 int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  long long keep = (long long)o.keep_superblocks;
  rmmc_status_t st = rmmc__spec_int_in(args, "keep", 0, LLONG_MAX, &keep);
  o.keep_superblocks = (size_t)keep;
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "superblock", upstream, &o.superblock_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "chunk", upstream, &o.chunk_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "max", upstream, &o.max_size);
  if (st == RMMC_SUCCESS) st = rmmc__spec_bytes(args, "cache", upstream, &o.large_cache_size);
  return st == RMMC_SUCCESS ? rmmc_arena_resource_create(upstream, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__arena_spec = {
    .name = "arena",
    .help = "per-thread arenas of size-class superblocks over a global arena (many threads)",
    .needs_upstream = true,
    .options = arena_spec_options,
    .build = arena_build,
};
