/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tracking adaptor (see tracking_adaptor.h).
 *
 * Outstanding allocations live in 64 shards chosen by a hash of the
 * pointer; each shard is an open-addressing table with linear probing and
 * backward-shift deletion (no tombstones) under its own mutex, its records
 * inline so that tracking an allocation costs no malloc of its own (the
 * call stack, when captured, is one malloc). Each shard keeps its own
 * count and bytes (stored under its lock, read by the accessors without
 * it), so threads working in different shards share no cache line but the
 * allocation serial number.
 *
 * deallocate checks the record and removes it under the shard lock before
 * calling the upstream, so two threads freeing one pointer cannot both get
 * through; if the upstream refuses, the record is put back.
 */
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>

#include "base/spec.h"
#include "tracking_options.h"
#include "rmmc/tracking_adaptor.h"

#define NSHARDS 64
#define MAX_DEPTH RMMC__TRACKING_MAX_DEPTH
#define SKIP_FRAMES 2 /* tracking_allocate and rmmc_resource_allocate */
#define EXTRA_FRAMES 2 /* room for frames a sanitizer's backtrace() wrapper adds */

/* The create holds backtrace_depth to its table row's max; the frame
 * buffer below is sized by MAX_DEPTH, so the two must agree. */
#define TRACKING_MAX_ROW(ctype, field, cdef, lo, hi, ...) tracking_max_##field = (hi),
enum { RMMC_TRACKING_OPTIONS(TRACKING_MAX_ROW) };
#undef TRACKING_MAX_ROW
_Static_assert(tracking_max_backtrace_depth == MAX_DEPTH,
               "the table's depth range and the frame buffer disagree");

typedef struct record {
  void *ptr; /* NULL: empty slot */
  size_t bytes;
  size_t alignment;
  cudaStream_t stream;
  uint64_t thread;
  uint64_t serial;
  void **frames; /* malloc'd, or NULL */
  int nframes;
} record_t;

typedef struct shard {
  _Alignas(64) pthread_mutex_t lock; /* one cache line per shard or more */
  record_t *slots;
  size_t mask;  /* capacity - 1; 0 while nothing was allocated */
  size_t count; /* written under the lock, read by the accessors without it */
  size_t bytes; /* likewise */
} shard_t;

typedef struct tracking {
  rmmc__adaptor_t a;
  bool backtrace;
  int depth;
  uint64_t serial;            /* atomic */
  uint64_t errors;            /* atomic */
  shard_t *shards;            /* NSHARDS, 64-byte aligned */
} tracking_t;

/* splitmix64's finalizer: pointers are 256-byte (often 2 MiB) aligned, so
 * their low bits carry nothing. */
static inline uint64_t hash_ptr(const void *p) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

static inline shard_t *shard_of(tracking_t *t, uint64_t h) { return &t->shards[h >> 58]; }

/* Finds ptr's slot (or the empty slot ending its probe). Shard locked, non-empty. */
static inline record_t *probe(shard_t *s, const void *ptr, uint64_t h) {
  size_t i = (size_t)h & s->mask;
  while (s->slots[i].ptr != NULL && s->slots[i].ptr != ptr) i = (i + 1) & s->mask;
  return &s->slots[i];
}

/* Doubles the table (16 slots at first). False if host memory runs out; the
 * table is then unchanged. Shard locked. */
static bool grow(shard_t *s) {
  size_t ncap = s->mask ? (s->mask + 1) * 2 : 16;
  record_t *ns = calloc(ncap, sizeof *ns);
  if (ns == NULL) return false;
  record_t *old = s->slots;
  size_t oldcap = s->mask ? s->mask + 1 : 0;
  s->slots = ns;
  s->mask = ncap - 1;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i].ptr != NULL) *probe(s, old[i].ptr, hash_ptr(old[i].ptr)) = old[i];
  free(old);
  return true;
}

/* Adds a record (its pointer not present). False if host memory runs out. */
static bool insert(tracking_t *t, const record_t *rec, uint64_t h) {
  shard_t *s = shard_of(t, h);
  pthread_mutex_lock(&s->lock);
  if ((s->count + 1) * 2 > (s->mask ? s->mask + 1 : 0) && !grow(s)) {
    pthread_mutex_unlock(&s->lock);
    return false;
  }
  *probe(s, rec->ptr, h) = *rec;
  __atomic_store_n(&s->count, s->count + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&s->bytes, s->bytes + rec->bytes, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&s->lock);
  return true;
}

/* Removes the record at slot e by shifting later members of its probe run
 * back (Knuth's algorithm R). Shard locked. */
static void remove_slot(shard_t *s, record_t *e) {
  __atomic_store_n(&s->bytes, s->bytes - e->bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&s->count, s->count - 1, __ATOMIC_RELAXED);
  size_t i = (size_t)(e - s->slots);
  for (size_t j = (i + 1) & s->mask;; j = (j + 1) & s->mask) {
    if (s->slots[j].ptr == NULL) break;
    size_t home = (size_t)hash_ptr(s->slots[j].ptr) & s->mask;
    /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
    bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      s->slots[i] = s->slots[j];
      i = j;
    }
  }
  s->slots[i] = (record_t){0};
}

static rmmc_status_t tracking_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       cudaStream_t stream, void **out) {
  tracking_t *t = (tracking_t *)r;
  rmmc_status_t st = rmmc__forward_allocate(&t->a, bytes, alignment, stream, out);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) return st;
  record_t rec = {*out, bytes, alignment, stream, rmmc__thread_id(),
                  __atomic_add_fetch(&t->serial, 1, __ATOMIC_RELAXED), NULL, 0};
  if (t->backtrace) {
    /* The caller's frames start after the one that returns into
     * rmmc_resource_allocate; a fixed count would be wrong where a
     * sanitizer wraps backtrace() in a frame of its own. */
    void *buf[MAX_DEPTH + SKIP_FRAMES + EXTRA_FRAMES];
    int got = backtrace(buf, t->depth + SKIP_FRAMES + EXTRA_FRAMES), skip = SKIP_FRAMES;
    for (int i = 0; i < SKIP_FRAMES + EXTRA_FRAMES && i < got; i++)
      if (buf[i] == __builtin_return_address(0)) skip = i + 1;
    int n = got - skip < t->depth ? got - skip : t->depth;
    if (n > 0 && (rec.frames = malloc((size_t)n * sizeof(void *))) != NULL) {
      memcpy(rec.frames, buf + skip, (size_t)n * sizeof(void *));
      rec.nframes = n;
    }
  }
  if (RMMC_LIKELY(insert(t, &rec, hash_ptr(rec.ptr)))) return RMMC_SUCCESS;
  free(rec.frames);
  (void)rmmc_resource_deallocate(t->a.upstream, *out, bytes, alignment, stream);
  *out = NULL;
  return rmmc_set_oom_error(r, bytes, stream, "no host memory to track the allocation");
}

static rmmc_status_t tracking_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                         size_t alignment, cudaStream_t stream) {
  tracking_t *t = (tracking_t *)r;
  uint64_t h = hash_ptr(ptr);
  shard_t *s = shard_of(t, h);
  pthread_mutex_lock(&s->lock);
  record_t *e = s->mask ? probe(s, ptr, h) : NULL;
  if (RMMC_UNLIKELY(e == NULL || e->ptr == NULL || e->bytes != bytes || e->alignment != alignment)) {
    bool known = e != NULL && e->ptr != NULL;
    size_t real_bytes = known ? e->bytes : 0, real_alignment = known ? e->alignment : 0;
    pthread_mutex_unlock(&s->lock);
    __atomic_add_fetch(&t->errors, 1, __ATOMIC_RELAXED);
    if (!known)
      return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                            "tracking adaptor: deallocate of %p (%zu bytes) which is not "
                            "outstanding through it (never allocated here, or already freed)",
                            ptr, bytes);
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "tracking adaptor: deallocate of %p with %zu bytes (alignment %zu), "
                          "but it was allocated with %zu bytes (alignment %zu); it stays "
                          "allocated",
                          ptr, bytes, alignment, real_bytes, real_alignment);
  }
  record_t rec = *e;
  remove_slot(s, e);
  pthread_mutex_unlock(&s->lock);
  rmmc_status_t st = rmmc__forward_deallocate(&t->a, ptr, bytes, alignment, stream);
  if (RMMC_LIKELY(st == RMMC_SUCCESS)) {
    free(rec.frames);
  } else if (!insert(t, &rec, h)) {
    /* The upstream kept the memory but we cannot track it again: say so. */
    free(rec.frames);
    rmmc__append_error(" (and the tracking adaptor ran out of host memory to keep tracking %p)",
                       ptr);
  }
  return st;
}

/* ---- copies for for_each and report ---- */

typedef struct snapshot {
  record_t *recs; /* frames are copies owned by the snapshot */
  size_t n;
} snapshot_t;

static void snapshot_free(snapshot_t *sn) {
  for (size_t i = 0; i < sn->n; i++) free(sn->recs[i].frames);
  free(sn->recs);
}

static int by_serial(const void *a, const void *b) {
  const record_t *x = a, *y = b;
  return x->serial < y->serial ? -1 : x->serial > y->serial;
}

static int by_size_desc(const void *a, const void *b) {
  const record_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return by_serial(a, b);
}

/* Copies every record, shard by shard, frames included. */
static rmmc_status_t take_snapshot(tracking_t *t, const char *what, snapshot_t *sn) {
  size_t cap = 0;
  sn->recs = NULL;
  sn->n = 0;
  for (int k = 0; k < NSHARDS; k++) {
    shard_t *s = &t->shards[k];
    pthread_mutex_lock(&s->lock);
    while (sn->n + s->count > cap) {
      size_t need = sn->n + s->count;
      pthread_mutex_unlock(&s->lock);
      size_t ncap = cap * 2 > need ? cap * 2 : need + 16;
      record_t *nr = realloc(sn->recs, ncap * sizeof *nr);
      if (nr == NULL) goto no_memory;
      sn->recs = nr;
      cap = ncap;
      pthread_mutex_lock(&s->lock);
    }
    for (size_t i = 0; s->mask && i <= s->mask; i++) {
      if (s->slots[i].ptr == NULL) continue;
      record_t *c = &sn->recs[sn->n];
      *c = s->slots[i];
      if (c->frames != NULL) {
        c->frames = malloc((size_t)c->nframes * sizeof(void *));
        if (c->frames == NULL) {
          pthread_mutex_unlock(&s->lock);
          goto no_memory;
        }
        memcpy(c->frames, s->slots[i].frames, (size_t)c->nframes * sizeof(void *));
      }
      sn->n++;
    }
    pthread_mutex_unlock(&s->lock);
  }
  return RMMC_SUCCESS;

no_memory:
  snapshot_free(sn);
  sn->recs = NULL;
  sn->n = 0;
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory for the copy", what);
}

static const rmmc_resource_ops_t tracking_ops;

RMMC_API rmmc_status_t rmmc_tracking_adaptor_for_each(rmmc_resource_t *r,
                                                      rmmc_tracked_allocation_cb cb, void *ctx) {
  rmmc_status_t st = rmmc__check_kind(r, &tracking_ops, "tracking_adaptor_for_each");
  if (st != RMMC_SUCCESS) return st;
  if (cb == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "tracking_adaptor_for_each: cb is NULL");
  snapshot_t sn;
  st = take_snapshot((tracking_t *)r, "tracking_adaptor_for_each", &sn);
  if (st != RMMC_SUCCESS) return st;
  if (sn.n > 1) qsort(sn.recs, sn.n, sizeof *sn.recs, by_serial);
  for (size_t i = 0; i < sn.n; i++) {
    const record_t *c = &sn.recs[i];
    rmmc_tracked_allocation_t a = {sizeof a,  c->ptr,    c->bytes,  c->alignment, c->stream,
                                   c->thread, c->serial, c->frames, c->nframes};
    cb(ctx, &a);
  }
  snapshot_free(&sn);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_tracking_adaptor_report(rmmc_resource_t *r, FILE *out) {
  rmmc_status_t st = rmmc__check_kind(r, &tracking_ops, "tracking_adaptor_report");
  if (st != RMMC_SUCCESS) return st;
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "tracking_adaptor_report: out is NULL");
  snapshot_t sn;
  st = take_snapshot((tracking_t *)r, "tracking_adaptor_report", &sn);
  if (st != RMMC_SUCCESS) return st;
  if (sn.n > 1) qsort(sn.recs, sn.n, sizeof *sn.recs, by_size_desc);
  uint64_t total = 0;
  for (size_t i = 0; i < sn.n; i++) total += sn.recs[i].bytes;
  char a[32], b[32];
  if (sn.n == 0)
    fprintf(out, "rmmc tracking adaptor: no outstanding allocations\n");
  else
    fprintf(out, "rmmc tracking adaptor: %zu outstanding allocation%s, %s (%llu bytes)\n", sn.n,
            sn.n == 1 ? "" : "s", rmmc__format_bytes(total, a, sizeof a),
            (unsigned long long)total);
  for (size_t i = 0; i < sn.n; i++) {
    const record_t *c = &sn.recs[i];
    fprintf(out, "  #%llu %p: %s (%zu bytes), alignment %zu, stream %s, thread %llu\n",
            (unsigned long long)c->serial, c->ptr, rmmc__format_bytes(c->bytes, a, sizeof a),
            c->bytes, c->alignment, rmmc__stream_name(c->stream, b, sizeof b),
            (unsigned long long)c->thread);
    if (c->nframes == 0) continue;
    char **names = backtrace_symbols(c->frames, c->nframes);
    for (int f = 0; f < c->nframes; f++) {
      if (names != NULL)
        fprintf(out, "      %s\n", names[f]);
      else
        fprintf(out, "      [%p]\n", c->frames[f]);
    }
    free(names);
  }
  snapshot_free(&sn);
  if (fflush(out) != 0 || ferror(out))
    return rmmc_set_error(RMMC_ERROR_IO, "tracking_adaptor_report: writing the report failed");
  return RMMC_SUCCESS;
}

/* ---- accessors, describe, lifetime ---- */

/* Sums a per-shard figure (each exact, the sum not one snapshot while
 * other threads allocate). */
static size_t sum_shards(const tracking_t *t, bool bytes) {
  size_t n = 0;
  for (int k = 0; k < NSHARDS; k++)
    n += __atomic_load_n(bytes ? &t->shards[k].bytes : &t->shards[k].count, __ATOMIC_RELAXED);
  return n;
}

RMMC_API size_t rmmc_tracking_adaptor_get_outstanding_count(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &tracking_ops, "tracking_adaptor_get_outstanding_count") != RMMC_SUCCESS)
    return 0;
  return sum_shards((const tracking_t *)r, false);
}

RMMC_API size_t rmmc_tracking_adaptor_get_outstanding_bytes(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &tracking_ops, "tracking_adaptor_get_outstanding_bytes") != RMMC_SUCCESS)
    return 0;
  return sum_shards((const tracking_t *)r, true);
}

RMMC_API uint64_t rmmc_tracking_adaptor_get_error_count(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &tracking_ops, "tracking_adaptor_get_error_count") != RMMC_SUCCESS)
    return 0;
  return __atomic_load_n(&((const tracking_t *)r)->errors, __ATOMIC_RELAXED);
}

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define TRACKING_FIGURES(X)                                          \
  X(BYTES, in_use, DESCRIBE, "bytes outstanding (sizes as given)") \
  X(COUNT, outstanding, DESCRIBE, "allocations outstanding")       \
  X(COUNT, errors, DESCRIBE, "deallocations refused (rmmc_tracking_adaptor_get_error_count)")

static void tracking_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  tracking_t *t = (tracking_t *)r;
  struct {
    TRACKING_FIGURES(RMMC__FIGURE_VALUE)
  } v = {sum_shards(t, true), sum_shards(t, false), __atomic_load_n(&t->errors, __ATOMIC_RELAXED)};
  TRACKING_FIGURES(RMMC__FIGURE_EMIT)
}

/* Frees the bookkeeping (records of allocations still outstanding too: the
 * memory itself belongs to the caller, who must free it before). */
static void free_shards(shard_t *shards) {
  for (int k = 0; k < NSHARDS; k++) {
    shard_t *s = &shards[k];
    for (size_t i = 0; s->mask && i <= s->mask; i++)
      if (s->slots[i].ptr != NULL) free(s->slots[i].frames);
    free(s->slots);
    pthread_mutex_destroy(&s->lock);
  }
  free(shards);
}

static void tracking_destroy(rmmc_resource_t *r) {
  free_shards(((tracking_t *)r)->shards);
  rmmc__adaptor_destroy(r);
}

static const rmmc_resource_ops_t tracking_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "tracking",
    .allocate = tracking_allocate,
    .deallocate = tracking_deallocate,
    .describe = tracking_describe,
    .destroy = tracking_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

RMMC_API rmmc_status_t rmmc_tracking_adaptor_create(rmmc_resource_t *upstream,
                                                    const rmmc_tracking_options_t *options,
                                                    rmmc_resource_t **out) {
  rmmc_tracking_options_t opts = RMMC_TRACKING_OPTIONS_INIT;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, "tracking_adaptor_create", &opts, options, RMMC_TRACKING_OPTIONS);
  if (st != RMMC_SUCCESS) {
    if (out != NULL) *out = NULL;
    return st;
  }
  st = rmmc__adaptor_new("tracking_adaptor_create", &tracking_ops, upstream, sizeof(tracking_t),
                         out);
  if (st != RMMC_SUCCESS) return st;
  tracking_t *t = (tracking_t *)*out;
  t->backtrace = opts.backtrace;
  t->depth = opts.backtrace_depth;
  t->shards = aligned_alloc(64, NSHARDS * sizeof(shard_t));
  if (t->shards == NULL) {
    rmmc__adaptor_destroy(*out);
    *out = NULL;
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "tracking_adaptor_create: no host memory");
  }
  memset(t->shards, 0, NSHARDS * sizeof(shard_t));
  for (int k = 0; k < NSHARDS; k++) pthread_mutex_init(&t->shards[k].lock, NULL);
  if (opts.backtrace) {
    /* backtrace() loads the unwinder on first use: do it here, not in an
     * allocation. */
    void *warm[2];
    (void)backtrace(warm, 2);
  }
  return RMMC_SUCCESS;
}

#define TRACKING_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_tracking_options_t, __VA_ARGS__)
static const rmmc__spec_option_t tracking_spec_options[] = {
    RMMC__TRACKING_OPTIONS(TRACKING_SPEC_ROW){.name = NULL},
};
#undef TRACKING_SPEC_ROW

static rmmc_status_t tracking_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                    int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_tracking_options_t opts = RMMC_TRACKING_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, tracking_spec_options, upstream, &opts);
  return st == RMMC_SUCCESS ? rmmc_tracking_adaptor_create(upstream, &opts, out) : st;
}

const rmmc__spec_entry_t rmmc__tracking_spec = {
    .name = "tracking",
    .help = "knows every outstanding allocation (leak report, checked frees)",
    .needs_upstream = true,
    .options = tracking_spec_options,
    .build = tracking_build,
};
