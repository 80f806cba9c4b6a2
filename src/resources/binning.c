/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The binning resource (see include/rmmc/binning_resource.h).
 *
 * Routing: bins are ascending. first[k] is the first bin that can hold a
 * request in (2^(k-1), 2^k], so a request starts there and steps past at
 * most the bins of its own octave (and past bins whose blocks are not
 * aligned enough for an alignment above 256). No lock: the table is read
 * only. Each bin is a fixed_size resource with its own lock and streams.
 * Requests above the largest bin go to the upstream and are entered in a
 * pointer map under a mutex (they are large, so the cost is small beside
 * the upstream call): a free routed to the upstream by a wrong size, a
 * double free or a foreign pointer is refused here, so an upstream that
 * cannot tell (host: free()) never sees it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ptrmap.h"
#include "base/spec.h"
#include "binning_options.h"
#include "fixed_size_internal.h"
#include "rmmc/binning_resource.h"
#include "rmmc/fixed_size_resource.h"

typedef struct binning {
  rmmc__adaptor_t base;
  size_t n;
  size_t size[RMMC_BINNING_MAX_BINS];
  size_t align[RMMC_BINNING_MAX_BINS];
  rmmc_resource_t *bin[RMMC_BINNING_MAX_BINS];
  uint8_t first[65];
  uint64_t up_in_use, up_count; /* relaxed atomics: what the upstream serves */
  pthread_mutex_t up_lock;       /* guards up_blocks */
  rmmc__ptrmap_t up_blocks;      /* blocks from the upstream -> their bytes */
} binning_t;

static const rmmc_resource_ops_t binning_ops;

static inline size_t route(const binning_t *b, size_t bytes, size_t alignment) {
  unsigned k = bytes > 1 ? 64u - (unsigned)__builtin_clzll((unsigned long long)(bytes - 1)) : 0u;
  size_t i = b->first[k];
  while (i < b->n && (b->size[i] < bytes || b->align[i] < alignment)) i++;
  return i;
}

static rmmc_status_t binning_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out) {
  binning_t *b = (binning_t *)r;
  size_t i = route(b, bytes, alignment);
  if (RMMC_LIKELY(i < b->n)) return rmmc__upstream_allocate(b->bin[i], bytes, alignment, stream, out);
  rmmc_status_t st = rmmc__upstream_allocate(b->base.upstream, bytes, alignment, stream, out);
  if (st != RMMC_SUCCESS) return st;
  pthread_mutex_lock(&b->up_lock);
  bool kept = rmmc__ptrmap_insert(&b->up_blocks, *out, NULL, bytes);
  pthread_mutex_unlock(&b->up_lock);
  if (RMMC_UNLIKELY(!kept)) {
    (void)rmmc_resource_deallocate(b->base.upstream, *out, bytes, alignment, stream);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                          "binning: no host memory to record a %zu-byte block", bytes);
  }
  rmmc__atomic_add_u64(&b->up_in_use, bytes);
  rmmc__atomic_add_u64(&b->up_count, 1);
  return RMMC_SUCCESS;
}

static rmmc_status_t binning_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream) {
  binning_t *b = (binning_t *)r;
  size_t i = route(b, bytes, alignment);
  if (RMMC_LIKELY(i < b->n)) return rmmc_resource_deallocate(b->bin[i], ptr, bytes, alignment, stream);
  pthread_mutex_lock(&b->up_lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&b->up_blocks, ptr);
  size_t real = e != NULL ? e->size : 0;
  if (RMMC_LIKELY(e != NULL && real == bytes)) rmmc__ptrmap_remove(&b->up_blocks, e);
  pthread_mutex_unlock(&b->up_lock);
  if (RMMC_UNLIKELY(e == NULL))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "binning: %p with %zu bytes (above its largest bin, %zu bytes) is not "
                          "a block it took from its upstream, or was freed already",
                          ptr, bytes, b->size[b->n - 1]);
  if (RMMC_UNLIKELY(real != bytes))
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "binning: %p was allocated with %zu bytes, not %zu; nothing was freed",
                          ptr, real, bytes);
  rmmc_status_t st = rmmc_resource_deallocate(b->base.upstream, ptr, bytes, alignment, stream);
  if (st == RMMC_SUCCESS) {
    rmmc__atomic_sub_u64(&b->up_in_use, bytes);
    rmmc__atomic_sub_u64(&b->up_count, 1);
    return st;
  }
  /* The upstream kept it: keep knowing it. */
  pthread_mutex_lock(&b->up_lock);
  bool kept = rmmc__ptrmap_insert(&b->up_blocks, ptr, NULL, bytes);
  pthread_mutex_unlock(&b->up_lock);
  if (!kept)
    rmmc__append_error(" (and binning ran out of host memory to keep knowing %p)", ptr);
  return st;
}

static rmmc_status_t binning_release_cached(rmmc_resource_t *r) {
  binning_t *b = (binning_t *)r;
  for (size_t i = 0; i < b->n; i++) {
    rmmc_status_t st = rmmc__fixed_size_release_chunks(b->bin[i]);
    if (st != RMMC_SUCCESS) return st;
  }
  return rmmc_resource_release_cached(b->base.upstream);
}

/* The figures binning reports per bin (and cached), read from the bin's
 * describe under the same keys, and the stream counters it sums over its
 * bins. */
static const char *const summed_keys[] = {"event_records", "event_waits", "device_syncs",
                                          "stream_syncs"};
#define NSUMMED (sizeof summed_keys / sizeof summed_keys[0])

typedef struct bin_figures {
  RMMC_BINNING_BIN_FIGURES(RMMC__FIGURE_VALUE)
  uint64_t cached;
  uint64_t summed[NSUMMED];
} bin_figures_t;

static void collect_cb(void *ctx, const rmmc_field_t *f) {
  bin_figures_t *g = ctx;
#define READ_BIN(kind, name, where, doc) \
  if (strcmp(f->key, #name) == 0) g->name = f->value;
  RMMC_BINNING_BIN_FIGURES(READ_BIN)
#undef READ_BIN
  if (strcmp(f->key, RMMC__FIG(CACHED)) == 0) g->cached = f->value;
  for (size_t k = 0; k < NSUMMED; k++)
    if (strcmp(f->key, summed_keys[k]) == 0) g->summed[k] += f->value;
}

static void binning_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  binning_t *b = (binning_t *)r;
  struct {
    RMMC_BINNING_HEAD_FIGURES(RMMC__FIGURE_VALUE)
    RMMC_BINNING_FIGURES(RMMC__FIGURE_VALUE)
  } v = {.bins = b->n, .upstream_in_use = rmmc__atomic_load_u64(&b->up_in_use)};
  uint64_t summed[NSUMMED] = {0};
  char key[64];
  RMMC_BINNING_HEAD_FIGURES(RMMC__FIGURE_EMIT)
  for (size_t i = 0; i < b->n; i++) {
    bin_figures_t g;
    memset(&g, 0, sizeof g);
    rmmc_resource_describe(b->bin[i], collect_cb, &g);
    v.reserved += g.reserved;
    v.in_use += g.in_use;
    v.cached += g.cached;
    for (size_t k = 0; k < NSUMMED; k++) summed[k] += g.summed[k];
#define EMIT_BIN(kind, name, where, doc)                   \
  snprintf(key, sizeof key, "bin_%zu_" #name, b->size[i]); \
  RMMC__FIGURE_EMIT_##kind(key, g.name)
    RMMC_BINNING_BIN_FIGURES(EMIT_BIN)
#undef EMIT_BIN
  }
  v.in_use += v.upstream_in_use;
  v.upstream_allocations = rmmc__atomic_load_u64(&b->up_count);
  RMMC_BINNING_FIGURES(RMMC__FIGURE_EMIT) /* cached: its bins' (reserved counts only theirs) */
  for (size_t k = 0; k < NSUMMED; k++) rmmc__emit_count(emit, ctx, summed_keys[k], summed[k]);
}

static void binning_free(binning_t *b) {
  for (size_t i = 0; i < b->n; i++) rmmc_resource_release(b->bin[i]);
  rmmc__ptrmap_fini(&b->up_blocks);
  pthread_mutex_destroy(&b->up_lock);
  rmmc__adaptor_fini(&b->base);
  free(b);
}

static void binning_destroy(rmmc_resource_t *r) { binning_free((binning_t *)r); }

static const rmmc_resource_ops_t binning_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "binning",
    .allocate = binning_allocate,
    .deallocate = binning_deallocate,
    .release_cached = binning_release_cached,
    .describe = binning_describe,
    .destroy = binning_destroy,
    .upstream = rmmc__adaptor_upstream,
};

/* Fills sizes[] from the options; returns the count or an error status
 * (negative) after setting the message. */
static rmmc_status_t bin_sizes(const rmmc_binning_options_t *o, size_t *sizes, size_t *n) {
  const char *what = "binning_resource_create";
  if (o->bins != NULL) {
    if (o->nbins == 0 || o->nbins > RMMC_BINNING_MAX_BINS)
      return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %zu bins given (1 to %d allowed)",
                            what, o->nbins, RMMC_BINNING_MAX_BINS);
    for (size_t i = 0; i < o->nbins; i++) {
      if (o->bins[i] == 0 ||
          !rmmc__align_up_checked(o->bins[i], RMMC_DEFAULT_ALIGNMENT, &sizes[i]) ||
          sizes[i] > SIZE_MAX / 2)
        return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: bin %zu has size %zu", what, i,
                              o->bins[i]);
      if (i > 0 && sizes[i] <= sizes[i - 1])
        return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                              "%s: bins must ascend: %zu (%zu rounded to 256) after %zu", what,
                              o->bins[i], sizes[i], sizes[i - 1]);
    }
    *n = o->nbins;
    return RMMC_SUCCESS;
  }
  if (!rmmc__is_pow2(o->min_bin) || !rmmc__is_pow2(o->max_bin) || o->max_bin > SIZE_MAX / 2)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: min_bin (%zu) and max_bin (%zu) must be powers of two", what,
                          o->min_bin, o->max_bin);
  size_t lo = o->min_bin < RMMC_DEFAULT_ALIGNMENT ? RMMC_DEFAULT_ALIGNMENT : o->min_bin;
  if (o->max_bin < lo)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: max_bin (%zu) is below min_bin (%zu; at least 256)", what,
                          o->max_bin, lo);
  size_t k = 0;
  for (size_t s = lo; s <= o->max_bin; s *= 2) sizes[k++] = s;
  *n = k;
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_binning_resource_create(rmmc_resource_t *upstream,
                                                    const rmmc_binning_options_t *options,
                                                    rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("binning_resource_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
  RMMC__TAKE_OPTIONS(st, "binning_resource_create", &o, options, RMMC_BINNING_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  size_t sizes[RMMC_BINNING_MAX_BINS], n = 0;
  st = bin_sizes(&o, sizes, &n);
  if (st != RMMC_SUCCESS) return st;
  binning_t *b = calloc(1, sizeof *b);
  if (b == NULL)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "binning_resource_create: no host memory");
  rmmc__adaptor_init(&b->base, &binning_ops, upstream);
  pthread_mutex_init(&b->up_lock, NULL);
  rmmc__ptrmap_init(&b->up_blocks);
  for (size_t i = 0; i < n; i++) {
    rmmc_fixed_size_options_t fo = RMMC_FIXED_SIZE_OPTIONS_INIT;
    fo.block_size = sizes[i];
    /* A chunk's cost (descriptors made on the host) follows its blocks, so
     * each bin takes at most RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK at a time,
     * whatever chunk_size says (binning_resource.h). */
    size_t per = o.chunk_size / sizes[i];
    fo.blocks_per_chunk = per == 0 ? 1 : per > RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK
                                             ? RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK
                                             : per;
    st = rmmc_fixed_size_resource_create(upstream, &fo, &b->bin[i]);
    if (st != RMMC_SUCCESS) {
      binning_free(b);
      return st;
    }
    b->n = i + 1;
    b->size[i] = sizes[i];
    b->align[i] = rmmc_fixed_size_resource_block_alignment(b->bin[i]);
  }
  for (unsigned k = 0; k <= 64; k++) {
    size_t lower = k == 0 ? 1 : ((size_t)1 << (k - 1)) + 1;
    size_t i = 0;
    while (i < n && sizes[i] < lower) i++;
    b->first[k] = (uint8_t)i;
  }
  *out = &b->base.base;
  return RMMC_SUCCESS;
}

/* The binning behind r for the query `what`, or NULL after setting the
 * message. */
static const binning_t *queried(const rmmc_resource_t *r, const char *what) {
  return rmmc__check_kind(r, &binning_ops, what) == RMMC_SUCCESS ? (const binning_t *)r : NULL;
}

static bool bin_index_ok(const binning_t *b, size_t i, const char *what) {
  if (RMMC_LIKELY(i < b->n)) return true;
  (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: bin %zu does not exist (%zu bins)", what,
                       i, b->n);
  return false;
}

RMMC_API size_t rmmc_binning_resource_bin_count(const rmmc_resource_t *r) {
  const binning_t *b = queried(r, "binning_resource_bin_count");
  return b != NULL ? b->n : 0;
}

RMMC_API size_t rmmc_binning_resource_bin_size(const rmmc_resource_t *r, size_t i) {
  const char *what = "binning_resource_bin_size";
  const binning_t *b = queried(r, what);
  return b != NULL && bin_index_ok(b, i, what) ? b->size[i] : 0;
}

RMMC_API rmmc_resource_t *rmmc_binning_resource_bin(const rmmc_resource_t *r, size_t i) {
  const char *what = "binning_resource_bin";
  const binning_t *b = queried(r, what);
  return b != NULL && bin_index_ok(b, i, what) ? b->bin[i] : NULL;
}

RMMC_API size_t rmmc_binning_resource_bin_for(const rmmc_resource_t *r, size_t bytes,
                                              size_t alignment) {
  if (queried(r, "binning_resource_bin_for") == NULL) return 0;
  if (alignment < RMMC_DEFAULT_ALIGNMENT) alignment = RMMC_DEFAULT_ALIGNMENT;
  return route((const binning_t *)r, bytes ? bytes : 1, alignment);
}

#define BINNING_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_binning_options_t, __VA_ARGS__)
static const rmmc__spec_option_t binning_spec_options[] = {
    RMMC__BINNING_OPTIONS(BINNING_SPEC_ROW){.name = NULL},
};
#undef BINNING_SPEC_ROW

static rmmc_status_t binning_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                   int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
  size_t sizes[RMMC_BINNING_MAX_BINS];
  const char *list = rmmc__spec_string(args, "bins");
  if (list != NULL) {
    if (rmmc__spec_find(args, "min") != NULL || rmmc__spec_find(args, "max") != NULL)
      return rmmc_set_error(RMMC_ERROR_PARSE, "binning: give bins= or min=/max=, not both");
    size_t n = 0;
    for (const char *p = list;;) {
      const char *end = strchr(p, ':');
      size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
      if (n == RMMC_BINNING_MAX_BINS)
        return rmmc_set_error(RMMC_ERROR_PARSE, "binning: bins=%s: more than %d bins", list,
                              RMMC_BINNING_MAX_BINS);
      bool too_large;
      if (rmmc__parse_bytes(p, len, &sizes[n], &too_large) != RMMC_SUCCESS || sizes[n] == 0)
        return rmmc_set_error(RMMC_ERROR_PARSE, "binning: bins=%s: '%.*s' %s", list, (int)len, p,
                              too_large ? "is out of range (sizes are below 16 EiB)"
                                        : "is not a bin size (write bins=256B:4KiB:64KiB)");
      n++;
      if (end == NULL) break;
      p = end + 1;
    }
    o.bins = sizes;
    o.nbins = n;
  }
  rmmc_status_t st = rmmc__spec_fill(args, binning_spec_options, upstream, &o);
  return st == RMMC_SUCCESS ? rmmc_binning_resource_create(upstream, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__binning_spec = {
    .name = "binning",
    .help = "size classes served by fixed_size bins, larger requests by the upstream",
    .needs_upstream = true,
    .options = binning_spec_options,
    .build = binning_build,
};
