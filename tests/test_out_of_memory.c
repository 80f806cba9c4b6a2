/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The out-of-memory rule (issue 11; resource.h, "Out of memory"): a stack
 * reports out of memory only when nothing in it caches memory. Stacks of
 * two and three caching layers over a capped upstream run the conformance
 * battery (which holds the rule's generic check); the issue's own stacks
 * over a capped sim run as written; and the rule's edges: no release when
 * nothing caches, one retry only, the message of a retry that fails, a
 * release that fails, the thread's last error after a retry that succeeds,
 * many threads at once. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "faulty.h"
#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* ---- stacks of caching layers, over the battery's spy ----
 * Without limits of their own: the battery's other checks keep up to 320
 * MiB live, and its out-of-memory check caps the spy itself. Layers that
 * reach a limit of their own run below, as the issue wrote them. */

static rmmc_status_t pool_max(rmmc_resource_t *up, size_t max, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = max;
  return rmmc_pool_resource_create(up, &o, out);
}

/* Builds a layer with `make` over *inner (which it retains) if st is a
 * success, and drops our reference to *inner. */
static rmmc_status_t over(rmmc_status_t st, rmmc_resource_t *const *inner,
                          rmmc_status_t (*make)(rmmc_resource_t *, rmmc_resource_t **),
                          rmmc_resource_t **out) {
  if (st == RMMC_SUCCESS) st = make(*inner, out);
  rmmc_resource_release(*inner);
  return st;
}

static rmmc_status_t make_binning(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_binning_resource_create(up, NULL, out);
}

static rmmc_status_t make_pool(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_pool_resource_create(up, NULL, out);
}

static rmmc_status_t make_arena_small(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  o.superblock_size = MiB;
  o.chunk_size = 8 * MiB;
  return rmmc_arena_resource_create(up, &o, out);
}

static rmmc_status_t binning_over_pool64(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_resource_t *pool = NULL;
  return over(pool_max(up, 64 * MiB, &pool), &pool, make_binning, out);
}

static rmmc_status_t binning_over_pool(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_resource_t *pool = NULL;
  return over(rmmc_pool_resource_create(up, NULL, &pool), &pool, make_binning, out);
}

static rmmc_status_t binning_over_arena(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_resource_t *arena = NULL;
  return over(rmmc_arena_resource_create(up, NULL, &arena), &arena, make_binning, out);
}

static rmmc_status_t binning_over_pool_over_arena(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_resource_t *arena = NULL, *pool = NULL;
  rmmc_status_t st = over(rmmc_arena_resource_create(up, NULL, &arena), &arena, make_pool, &pool);
  return over(st, &pool, make_binning, out);
}

static rmmc_status_t fixed_size_over_arena_small(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_resource_t *arena = NULL;
  rmmc_status_t st = make_arena_small(up, &arena);
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = 2 * MiB;
  o.blocks_per_chunk = 2;
  if (st == RMMC_SUCCESS) st = rmmc_fixed_size_resource_create(arena, &o, out);
  rmmc_resource_release(arena);
  return st;
}

static const conformance_case_t cases[] = {
    {"arena(superblock=1MiB, chunk=8MiB)", make_arena_small, 0},
    {"binning > pool", binning_over_pool, 0},
    {"binning > arena", binning_over_arena, 0},
    {"binning > pool > arena", binning_over_pool_over_arena, 0},
    {"fixed_size(block=2MiB, blocks_per_chunk=2) > arena(superblock=1MiB, chunk=8MiB)",
     fixed_size_over_arena_small, 2 * MiB},
};

/* ---- the stacks, as written ---- */

/* Allocates n blocks of `bytes` (all live at once), then frees them. */
static void fill_and_free(rmmc_resource_t *r, int n, size_t bytes) {
  void *p[64];
  ck_assert_int_le(n, 64);
  for (int i = 0; i < n; i++)
    ck_assert_msg(rmmc_resource_allocate(r, bytes, 256, NULL, &p[i]) == RMMC_SUCCESS,
                  "block %d of %zu bytes: %s", i, bytes, rmmc_last_error_message());
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], bytes, 256, NULL), RMMC_SUCCESS);
}

/* With nothing live, `bytes` is served; the thread's last error is what it
 * was before the call. */
static void served(rmmc_resource_t *r, const char *spec, size_t bytes) {
  (void)rmmc_set_error(RMMC_ERROR_IO, "an earlier failure of this thread");
  void *q = NULL;
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, 256, NULL, &q);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %zu bytes with nothing live: %s", spec, bytes,
                rmmc_last_error_message());
  ck_assert_str_eq(rmmc_last_error_message(), "an earlier failure of this thread");
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, bytes, 256, NULL), RMMC_SUCCESS);
}

static rmmc_resource_t *stack(const char *spec) {
  rmmc_resource_t *r = NULL;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s: %s", spec,
                rmmc_last_error_message());
  return r;
}

/* The base of a stack (its innermost layer). */
static rmmc_resource_t *base_of(rmmc_resource_t *r) {
  while (rmmc_resource_upstream(r) != NULL) r = rmmc_resource_upstream(r);
  return r;
}

START_TEST(test_out_of_memory_arena_gives_back_whole_chunks) {
  /* F2: 4 x 200 MiB freed, then 300 MiB: sim was full of the arena's free
   * chunks ("in use 0 B"). */
  rmmc_resource_t *r = stack("arena > sim(capacity=1GiB)");
  fill_and_free(r, 4, 200 * MiB);
  served(r, "arena > sim(capacity=1GiB)", 300 * MiB);
  ck_assert_uint_le(field(base_of(r), "peak"), 1024 * MiB);
  rmmc_resource_release(r);
  /* F2: the arena's own limit, reached by its free chunks. */
  r = stack("arena(max=32MiB, superblock=1MiB, chunk=8MiB) > sim");
  fill_and_free(r, 4, 7 * MiB);
  served(r, "arena(max=32MiB, superblock=1MiB, chunk=8MiB) > sim", 20 * MiB);
  ck_assert_uint_le(field(r, "reserved"), 32 * MiB);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_out_of_memory_binning_gives_back_its_bins) {
  /* F3: 15 x 4 MiB freed, then 8 MiB (above the largest bin: straight to
   * the upstream, which the bins' free chunks fill). */
  static const char *const specs[] = {
      "binning > sim(capacity=64MiB)",
      "binning > pool(max=64MiB) > sim",
      "binning > arena > sim(capacity=192MiB)",
  };
  /* All that fit: 4 MiB-aligned chunks; the arena, a pool with 16 MiB
   * spans on 192 MiB of sim, maps 12 spans and fits 3 such chunks in each
   * (an aligned search asks for size + alignment - 256 bytes). */
  static const int blocks[] = {15, 15, 36};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    rmmc_resource_t *r = stack(specs[i]);
    fill_and_free(r, blocks[i], 4 * MiB);
    uint64_t cached = 0;
    (void)rmmc_resource_get_field(r, "cached", &cached);
    served(r, specs[i], 8 * MiB);
    ck_assert_uint_eq(cached, (uint64_t)blocks[i] * 4 * MiB);
    ck_assert_uint_lt(field(r, "cached"), cached); /* the bins gave theirs back */
    rmmc_resource_release(r);
  }
}
END_TEST

START_TEST(test_out_of_memory_three_caching_layers) {
  /* binning's bins hold the pool's chunks, which hold the arena's, which
   * hold all of sim: every layer must give back for 8 MiB to fit. */
  const char *spec = "binning > pool > arena > sim(capacity=96MiB)";
  rmmc_resource_t *r = stack(spec);
  void *p[64];
  int n = 0;
  while (n < 64 && rmmc_resource_allocate(r, 4 * MiB, 256, NULL, &p[n]) == RMMC_SUCCESS) n++;
  ck_assert_int_ge(n, 16);
  ck_assert_int_le(n, 24);
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 4 * MiB, 256, NULL), RMMC_SUCCESS);
  served(r, spec, 8 * MiB);
  rmmc_resource_release(r);
}
END_TEST

/* ---- the rule's edges ---- */

START_TEST(test_out_of_memory_without_a_cache_asks_nothing_back) {
  /* Adaptors over a full spy: nothing caches, so no release goes down and
   * the upstream is asked once. */
  rmmc_resource_t *spy = new_spy(), *lim = NULL, *r = NULL;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(spy, 64 * MiB, &lim), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(lim, &r), RMMC_SUCCESS);
  rmmc_resource_release(lim);
  spy_set_capacity(s, 4 * MiB);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 8 * MiB, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.release_calls, 0);
  ck_assert_uint_eq(c.allocate_calls, 1);
  ck_assert_ptr_null(strstr(rmmc_last_error_message(), "retried"));
  /* The limit refuses without asking the spy: no release either. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 65 * MiB, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(spy_counts(s).release_calls, 0);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  finish(r, spy);
}
END_TEST

/* ---- a layer that caches and says so only with "reserved" above "in_use"
 * (no "cached" figure: cuda_async's way, which no other host resource has).
 * Its allocate fails while it holds free memory (reserved above in_use) or
 * while `full`; release_cached gives the free memory back. */
typedef struct reserved_cache {
  rmmc_resource_t base;
  uint64_t reserved, in_use;
  bool full;
  int allocates, releases;
} reserved_cache_t;

static rmmc_status_t rc_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                 cudaStream_t stream, void **out) {
  (void)stream;
  reserved_cache_t *c = (reserved_cache_t *)r;
  c->allocates++;
  if (c->full || c->reserved > c->in_use)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "reserved_cache: no room");
  size_t rounded = (bytes + alignment - 1) & ~(alignment - 1);
  *out = aligned_alloc(alignment, rounded);
  if (*out == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "reserved_cache: malloc");
  c->in_use += bytes;
  c->reserved += bytes;
  return RMMC_SUCCESS;
}

static rmmc_status_t rc_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t alignment,
                                   cudaStream_t stream) {
  (void)alignment, (void)stream;
  reserved_cache_t *c = (reserved_cache_t *)r;
  free(ptr);
  c->in_use -= bytes;
  return RMMC_SUCCESS;
}

static rmmc_status_t rc_release(rmmc_resource_t *r) {
  reserved_cache_t *c = (reserved_cache_t *)r;
  c->releases++;
  c->reserved = c->in_use;
  return RMMC_SUCCESS;
}

static void rc_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  reserved_cache_t *c = (reserved_cache_t *)r;
  rmmc_field_t f = {"reserved", RMMC_FIELD_BYTES, c->reserved, NULL};
  emit(ctx, &f);
  f = (rmmc_field_t){"in_use", RMMC_FIELD_BYTES, c->in_use, NULL};
  emit(ctx, &f);
}

static void rc_destroy(rmmc_resource_t *r) { free(r); }

static const rmmc_resource_ops_t reserved_cache_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "reserved_cache",
    .allocate = rc_allocate,
    .deallocate = rc_deallocate,
    .release_cached = rc_release,
    .describe = rc_describe,
    .destroy = rc_destroy,
};

static reserved_cache_t *new_reserved_cache(uint64_t reserved, bool full) {
  reserved_cache_t *c = calloc(1, sizeof *c);
  ck_assert_ptr_nonnull(c);
  rmmc_resource_init(&c->base, &reserved_cache_ops, RMMC_MEMORY_HOST, -1);
  c->reserved = reserved;
  c->full = full;
  return c;
}

START_TEST(test_out_of_memory_reserved_above_in_use_is_a_cache) {
  /* Entered by the wrapper, by an adaptor's forward (statistics) and by an
   * adaptor's own wrapper call (thread_safe): each time one release of the
   * layer and one retry, which succeeds. */
  for (int how = 0; how < 3; how++) {
    reserved_cache_t *c = new_reserved_cache(4 * MiB, false);
    rmmc_resource_t *top = &c->base;
    if (how == 1) ck_assert_int_eq(rmmc_statistics_adaptor_create(&c->base, &top), RMMC_SUCCESS);
    if (how == 2) ck_assert_int_eq(rmmc_thread_safe_adaptor_create(&c->base, &top), RMMC_SUCCESS);
    if (how != 0) rmmc_resource_release(&c->base);
    void *p = NULL;
    ck_assert_int_eq(rmmc_resource_allocate(top, 1 * MiB, 256, NULL, &p), RMMC_SUCCESS);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(c->releases, 1);
    ck_assert_int_eq(c->allocates, 2);
    ck_assert_uint_eq(c->reserved, 1 * MiB);
    ck_assert_int_eq(rmmc_resource_deallocate(top, p, 1 * MiB, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(top);
  }
}
END_TEST

START_TEST(test_out_of_memory_reserved_equal_to_in_use_is_no_cache) {
  /* Full, holding nothing free: out of memory at once, nothing released,
   * and the message lists the layer's figures without a retry note. */
  reserved_cache_t *c = new_reserved_cache(0, true);
  rmmc_resource_t *top = NULL;
  ck_assert_int_eq(rmmc_statistics_adaptor_create(&c->base, &top), RMMC_SUCCESS);
  rmmc_resource_release(&c->base);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(top, 1 * MiB, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(c->releases, 0);
  ck_assert_int_eq(c->allocates, 1);
  ck_assert_ptr_null(strstr(rmmc_last_error_message(), "retried"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "reserved_cache (reserved 0"));
  rmmc_resource_release(top);
}
END_TEST

START_TEST(test_out_of_memory_retries_once_and_says_so) {
  /* A pool holding free memory that cannot serve the request: one release
   * of the stack, one retry, then out of memory whose message says so and
   * lists the stack's figures once. */
  rmmc_resource_t *spy = new_spy(), *r = NULL;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(pool_max(spy, 64 * MiB, &r), RMMC_SUCCESS);
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(r, 20 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 10 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 10 * MiB, 256, NULL), RMMC_SUCCESS);
  spy_set_capacity(s, spy_counts(s).outstanding_bytes);
  uint64_t before = spy_counts(s).release_calls;
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 40 * MiB, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_uint_eq(spy_counts(s).release_calls, before + 1);
  const char *m = rmmc_last_error_message();
  static const char note_text[] =
      "pool gave back its cached memory (and its upstream's) and the request was retried";
  const char *note = strstr(m, note_text);
  ck_assert_msg(note != NULL, "%s", m);
  ck_assert_msg(strstr(m, "; stack: pool") != NULL && strstr(strstr(m, "; stack:") + 1, "; stack:") == NULL,
                "the figures once: %s", m);
  ck_assert_ptr_null(strstr(note + sizeof note_text - 1, "retried"));
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 20 * MiB, 256, NULL), RMMC_SUCCESS);
  spy_set_capacity(s, SIZE_MAX);
  finish(r, spy);
}
END_TEST

START_TEST(test_out_of_memory_release_failure_is_reported) {
  /* binning > faulty > spy: the release fails on its way down (after the
   * bins gave their chunks back through faulty), the retry still runs and
   * succeeds on what came back; when it cannot, both failures are told. */
  rmmc_resource_t *spy = new_spy(), *flt = NULL, *r = NULL;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(faulty_create(spy, &flt), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_binning_resource_create(flt, NULL, &r), RMMC_SUCCESS);
  rmmc_resource_release(flt);
  spy_set_capacity(s, 16 * MiB);
  fill_and_free(r, 4, 4 * MiB);
  faulty_fail_release(faulty_of(flt), RMMC_ERROR_CUDA, 1);
  served(r, "binning > faulty > spy", 8 * MiB);
  ck_assert_uint_eq(faulty_counts(faulty_of(flt)).release_injected, 1);
  /* Now nothing can make room for 20 MiB: out of memory, and the failed
   * release is in the message. */
  fill_and_free(r, 4, 4 * MiB);
  faulty_fail_release(faulty_of(flt), RMMC_ERROR_CUDA, 1);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 20 * MiB, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(rmmc_last_error_message(),
                       "(giving it back failed: faulty: injected ERROR_CUDA)") != NULL,
                "%s", rmmc_last_error_message());
  spy_set_capacity(s, SIZE_MAX);
  finish(r, spy);
}
END_TEST

static bool count_and_decline(size_t bytes, void *user) {
  (void)bytes;
  ++*(int *)user;
  return false;
}

START_TEST(test_out_of_memory_adaptors_above_see_one_call) {
  /* logging > failure_callback(user) > statistics > binning > spy: the
   * rule is applied where the call enters binning, so the adaptors above
   * see one call and its outcome: one log line, no callback, one count. */
  char path[] = "/tmp/rmmc_oom_log_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  rmmc_resource_t *spy = new_spy(), *bin = NULL, *stats = NULL, *fcb = NULL, *r = NULL;
  spy_t *s = spy_of(spy);
  int asked = 0;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, &bin), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(bin, &stats), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(stats, count_and_decline, &asked, &fcb),
                   RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_create(fcb, path, NULL, &r), RMMC_SUCCESS);
  rmmc_resource_release(bin);
  rmmc_resource_release(stats);
  rmmc_resource_release(fcb);
  spy_set_capacity(s, 16 * MiB);
  fill_and_free(r, 4, 4 * MiB); /* binning caches 16 MiB: the spy is full */
  served(r, "logging > failure_callback > statistics > binning > spy", 8 * MiB);
  ck_assert_int_eq(asked, 0);
  ck_assert_uint_eq(spy_counts(s).release_calls, 1);
  ck_assert_uint_eq(field(stats, "allocations"), 5);
  rmmc_resource_release(r); /* flushes the log */
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char line[256];
  int lines = 0, failures = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lines++;
    failures += strstr(line, "allocate failure") != NULL;
  }
  fclose(f);
  unlink(path);
  ck_assert_int_eq(lines, 1 + 5 + 5); /* header, 5 allocations, 5 frees */
  ck_assert_int_eq(failures, 0);
  spy_set_capacity(s, SIZE_MAX);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_out_of_memory_layers_own_fallbacks_release_nothing) {
  /* A caching layer's own attempts do not trigger the rule below it: the
   * arena (a pool over binning: chunks) asks binning for a whole 256 MiB
   * chunk first (past the largest bin: binning's upstream, capped at 64
   * MiB, refuses), then for halves down to what the request needs. The
   * 2 MiB bin chunk binning caches must survive those speculative
   * refusals; only the arena's caller may ask it back. */
  rmmc_resource_t *spy = new_spy(), *bin = NULL, *r = NULL;
  spy_t *s = spy_of(spy);
  spy_set_capacity(s, 64 * MiB);
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, &bin), RMMC_SUCCESS);
  rmmc_arena_options_t ao = RMMC_ARENA_OPTIONS_INIT;
  ao.chunk_size = 256 * MiB;
  ck_assert_int_eq(rmmc_arena_resource_create(bin, &ao, &r), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(bin, 2 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(bin, p, 2 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(bin, "cached"), 2 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_ge(spy_counts(s).allocate_failures, 1); /* the 256 MiB attempt */
  ck_assert_uint_eq(spy_counts(s).release_calls, 0);
  ck_assert_uint_eq(field(bin, "cached"), 2 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(bin);
  spy_set_capacity(s, SIZE_MAX);
  finish(r, spy);
}
END_TEST

typedef struct storm {
  rmmc_resource_t *r;
  unsigned seed;
  int served, refused, other; /* other: failures that are not out of memory */
} storm_t;

/* Each round holds up to 20 blocks (15 of 4 MiB, 5 of 1 MiB: more than
 * the 64 MiB the stack may take, so every round runs out of memory even
 * alone), then frees them. */
static void *storm_main(void *arg) {
  storm_t *t = arg;
  enum { K = 20 };
  void *p[K];
  size_t n[K];
  for (int round = 0; round < 40; round++) {
    int k = 0;
    for (; k < K; k++) {
      t->seed = t->seed * 1103515245u + 12345u;
      n[k] = (k % 4 == 3 ? MiB : 4 * MiB) + (t->seed >> 4) % 4096;
      rmmc_status_t st = rmmc_resource_allocate(t->r, n[k], 256, NULL, &p[k]);
      if (st != RMMC_SUCCESS) {
        t->refused += st == RMMC_ERROR_OUT_OF_MEMORY;
        t->other += st != RMMC_ERROR_OUT_OF_MEMORY;
        break;
      }
      memset(p[k], (int)k, 64);
    }
    t->served += k;
    while (k-- > 0) (void)rmmc_resource_deallocate(t->r, p[k], n[k], 256, NULL);
  }
  return NULL;
}

START_TEST(test_out_of_memory_storm_of_threads) {
  /* Eight threads run a tight binning > pool stack out of memory over and
   * over: every call is served or refused cleanly, nothing leaks, and
   * with nothing live at the end a large request is served. */
  rmmc_resource_t *spy = new_spy(), *r = NULL;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(binning_over_pool64(spy, &r), RMMC_SUCCESS);
  enum { T = 8 };
  pthread_t th[T];
  storm_t st[T];
  for (int i = 0; i < T; i++) {
    st[i] = (storm_t){r, 17u + 7919u * (unsigned)i, 0, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, storm_main, &st[i]), 0);
  }
  int served_total = 0, refused = 0, other = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    served_total += st[i].served;
    refused += st[i].refused;
    other += st[i].other;
  }
  ck_assert_int_ge(served_total, T * 40);
  ck_assert_int_eq(refused, T * 40);
  ck_assert_int_eq(other, 0);
  ck_assert_uint_le(spy_counts(s).peak_bytes, 64 * MiB);
  served(r, "binning > pool(max=64MiB) > spy", 48 * MiB);
  finish(r, spy);
}
END_TEST

/* A retry that succeeds through layers that overcome failures of their own
 * on the way leaves the thread's message as it was before the call. Here
 * binning's 64 KiB bin cannot take a chunk (the upstream refuses the
 * pool's mappings 3 to 5 times: the growth, then the pool's own tries),
 * binning caches its 1 KiB bin, so the rule gives that back and retries:
 * the bin saved the message of the first attempt, the pool's growth
 * succeeded and put back the call's start, and the bin then put its saved
 * copy back, the first attempt's out of memory, over a success (found by
 * tests/fuzz/fuzz_api). Virtual memory over vmspy: the same addresses, and
 * so the same growths, in every run. */
START_TEST(test_out_of_memory_retry_through_layers_leaves_no_message) {
  for (uint64_t nfail = 1; nfail <= 5; nfail++) {
    rmmc_resource_t *spy, *fy, *r, *vm = new_vm_base(4 * KiB, &spy, &fy);
    ck_assert_int_eq(rmmc_stack_create_over("binning(bins=1KiB:64KiB, chunk=256KiB) > "
                                            "pool(page=256KiB, small_max=0)",
                                            vm, &r),
                     RMMC_SUCCESS);
    void *a, *b[4], *c;
    ck_assert_int_eq(rmmc_resource_allocate(r, 1 * KiB, 256, NULL, &a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(r, a, 1 * KiB, 256, NULL), RMMC_SUCCESS);
    for (int i = 0; i < 4; i++)
      ck_assert_int_eq(rmmc_resource_allocate(r, 64 * KiB, 256, NULL, &b[i]), RMMC_SUCCESS);
    faulty_fail_allocate(faulty_of(fy), RMMC_ERROR_OUT_OF_MEMORY, nfail);
    rmmc_set_error(RMMC_ERROR_IO, "an earlier failure of this thread");
    ck_assert_int_eq(rmmc_resource_allocate(r, 64 * KiB, 256, NULL, &c), RMMC_SUCCESS);
    ck_assert_uint_eq(faulty_counts(faulty_of(fy)).allocate_injected, nfail);
    ck_assert_msg(strcmp(rmmc_last_error_message(), "an earlier failure of this thread") == 0,
                  "%d refusals: a successful allocate left '%s'", (int)nfail,
                  rmmc_last_error_message());
    /* The next call that fails on the way keeps its own start. */
    faulty_fail_allocate(faulty_of(fy), RMMC_ERROR_OUT_OF_MEMORY, nfail);
    rmmc_clear_last_error();
    void *d;
    ck_assert_int_eq(rmmc_resource_allocate(r, 64 * KiB, 256, NULL, &d), RMMC_SUCCESS);
    ck_assert_str_eq(rmmc_last_error_message(), "");
    faulty_disarm(faulty_of(fy));
    ck_assert_int_eq(rmmc_resource_deallocate(r, d, 64 * KiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(r, c, 64 * KiB, 256, NULL), RMMC_SUCCESS);
    for (int i = 0; i < 4; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, b[i], 64 * KiB, 256, NULL), RMMC_SUCCESS);
    finish_vm(r, vm, fy, spy);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("out_of_memory");
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  TCase *tc = tcase_create("out_of_memory");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_out_of_memory_arena_gives_back_whole_chunks);
  tcase_add_test(tc, test_out_of_memory_binning_gives_back_its_bins);
  tcase_add_test(tc, test_out_of_memory_three_caching_layers);
  tcase_add_test(tc, test_out_of_memory_without_a_cache_asks_nothing_back);
  tcase_add_test(tc, test_out_of_memory_retries_once_and_says_so);
  tcase_add_test(tc, test_out_of_memory_reserved_above_in_use_is_a_cache);
  tcase_add_test(tc, test_out_of_memory_reserved_equal_to_in_use_is_no_cache);
  tcase_add_test(tc, test_out_of_memory_release_failure_is_reported);
  tcase_add_test(tc, test_out_of_memory_storm_of_threads);
  tcase_add_test(tc, test_out_of_memory_adaptors_above_see_one_call);
  tcase_add_test(tc, test_out_of_memory_layers_own_fallbacks_release_nothing);
  tcase_add_test(tc, test_out_of_memory_retry_through_layers_leaves_no_message);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
