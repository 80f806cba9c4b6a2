/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool resource over a host spy (no GPU, no virtual memory: the chunk
 * backend), and the pool's behaviour that does not depend on the backend:
 * the conformance battery in several configurations; every invariant after
 * every step of random runs on one thread and on many (own and shared
 * stream keys, frees on other streams, blocks handed between threads,
 * concurrent checks and release_cached, a maximum); stream heaps (reuse of
 * the last free, foreign frees, spans given back by a thread that exited,
 * the cache bound with 64 threads); stream order in host mode (epochs
 * covered by records, reuse by other streams); hysteresis (phases repeat
 * with no upstream call) and pressure (cached memory given back before out
 * of memory); the budget (release_before_grow, release_slack, gc_threshold,
 * the maximum and its message); split_limit; bad frees, bad options, the
 * figures and the spec entry; destroy with live blocks. Host suite.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "pool_util.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

/* ---- conformance in several configurations ---- */

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_pool_resource_create(up, NULL, out);
}

static rmmc_status_t make_growing(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 64 * KiB;
  o.min_growth = 256 * KiB;
  o.growth_granularity = 64 * KiB;
  o.small_max = 16 * KiB;
  o.small_chunk = 128 * KiB;
  o.cache_size = 128 * KiB;
  return rmmc_pool_resource_create(up, &o, out);
}

static rmmc_status_t make_unseparated(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.event_interval = 64;
  return rmmc_pool_resource_create(up, &o, out);
}

static rmmc_status_t make_initial(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 64 * MiB;
  o.gc_threshold = 0.5;
  o.maximum_size = 1024 * MiB;
  o.release_before_grow = false;
  return rmmc_pool_resource_create(up, &o, out);
}

static rmmc_status_t make_no_cache(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.cache_size = 0;
  o.small_chunk = 1 * MiB;
  o.split_limit = 1.0;
  return rmmc_pool_resource_create(up, &o, out);
}

static const conformance_case_t cases[] = {
    {"pool", make_default, 0},
    {"pool(initial=64KiB,min_growth=256KiB,small_max=16KiB,small_chunk=128KiB)", make_growing, 0},
    {"pool(small_max=0,release_before_grow=false,event_interval=64)", make_unseparated, 0},
    {"pool(initial=64MiB,max=1GiB,gc_threshold=0.5,release_before_grow=false)", make_initial, 0},
    {"pool(cache=0,small_chunk=1MiB,split_limit=1)", make_no_cache, 0},
};

/* ---- helpers ---- */

typedef struct fixture {
  rmmc_resource_t *spy, *pool;
} fixture_t;

static fixture_t make_fixture(const rmmc_pool_options_t *o) {
  fixture_t f;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f.spy), RMMC_SUCCESS);
  rmmc_status_t st = rmmc_pool_resource_create(f.spy, o, &f.pool);
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  CHECK_POOL(f.pool);
  return f;
}

/* Checks the pool, releases it and checks that the spy got every byte back
 * and saw no bad free. */
static void drop_fixture(fixture_t *f) {
  CHECK_POOL(f->pool);
  spy_t *s = spy_of(f->spy);
  rmmc_resource_release(f->pool);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.outstanding_bytes, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(f->spy);
}

static void *alloc_ok(rmmc_resource_t *r, size_t bytes, cudaStream_t s) {
  void *p = NULL;
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, 256, s, &p);
  ck_assert_msg(st == RMMC_SUCCESS, "allocate %zu: %s", bytes, rmmc_last_error_message());
  ck_assert_ptr_nonnull(p);
  return p;
}

static void free_ok(rmmc_resource_t *r, void *p, size_t bytes, cudaStream_t s) {
  rmmc_status_t st = rmmc_resource_deallocate(r, p, bytes, 256, s);
  ck_assert_msg(st == RMMC_SUCCESS, "free %p + %zu: %s", p, bytes, rmmc_last_error_message());
}

static uint64_t spy_allocs(const fixture_t *f) { return spy_counts(spy_of(f->spy)).allocate_calls; }
static uint64_t spy_frees(const fixture_t *f) { return spy_counts(spy_of(f->spy)).deallocate_calls; }
static uint64_t spy_bytes(const fixture_t *f) { return spy_counts(spy_of(f->spy)).outstanding_bytes; }

/* ---- invariants: random runs ---- */

START_TEST(test_pool_random_run_keeps_invariants) {
  /* Default options: blocks on both sides of small_max (1 MiB), alignments
   * up to 64 KiB, 3 stream keys. */
  pool_run_t run = {.seed = 1u, .steps = 2500, .max_live = 120, .nstreams = 3,
                    .small_max = 1 * MiB, .max_bytes = 12 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 300};
  fixture_t f = make_fixture(NULL);
  pool_run_result_t r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.foreign_frees, pool_steps(2500) / 25);
  ck_assert_int_gt(r.releases, 0);
  drop_fixture(&f);

  /* Small spans and chunks: many spans taken and given back, many growths
   * and trims. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 128 * KiB;
  o.growth_granularity = 64 * KiB;
  o.small_max = 8 * KiB;
  o.small_chunk = 64 * KiB;
  o.cache_size = 128 * KiB;
  o.event_interval = 3;
  f = make_fixture(&o);
  run = (pool_run_t){.seed = 2u, .steps = 2500, .max_live = 200, .nstreams = 4,
                     .small_max = 8 * KiB, .max_bytes = 2 * MiB, .max_align = 64 * KiB,
                     .real = true, .release_every = 400};
  r = pool_random_run(f.pool, &run);
  ck_assert_uint_gt(field(f.pool, "shrinks"), 0);
  drop_fixture(&f);

  /* No stream heaps (small_max=0): every block in the shared heap. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.event_interval = 1;
  f = make_fixture(&o);
  run = (pool_run_t){.seed = 4u, .steps = 2000, .max_live = 150, .nstreams = 2,
                     .small_max = 0, .max_bytes = 4 * MiB, .max_align = 64 * KiB, .real = true};
  (void)pool_random_run(f.pool, &run);
  ck_assert_uint_eq(field(f.pool, "spans"), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_random_run_with_maximum_keeps_invariants) {
  /* A maximum: out of memory happens, leaves every block and invariant
   * intact, and reserved never passes the maximum. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = 24 * MiB;
  o.min_growth = 4 * MiB;
  o.small_chunk = 1 * MiB;
  o.small_max = 256 * KiB;
  fixture_t f = make_fixture(&o);
  pool_run_t run = {.seed = 3u, .steps = 2500, .max_live = 100, .nstreams = 3,
                    .small_max = 256 * KiB, .max_bytes = 8 * MiB, .max_align = 64 * KiB,
                    .real = true, .oom_ok = true, .release_every = 500,
                    .maximum = 24 * MiB};
  pool_run_result_t r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.ooms, 0);
  ck_assert_uint_le(field(f.pool, "reserved_peak"), 24 * MiB);
  drop_fixture(&f);

  /* The upstream refuses (a capped spy) instead of the maximum. */
  f = make_fixture(NULL);
  spy_set_capacity(spy_of(f.spy), 48 * MiB);
  run.seed = 33u;
  run.maximum = 48 * MiB;
  run.max_bytes = 20 * MiB;
  run.small_max = 1 * MiB;
  r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.ooms, 0);
  ck_assert_uint_le(field(f.pool, "reserved_peak"), 48 * MiB);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_threads_keep_invariants) {
  /* 8 threads: 4 on their own stream keys, 4 sharing keys 1 and 2; frees on
   * other streams, blocks freed by other threads, concurrent checks and
   * release_cached. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.small_chunk = 256 * KiB;
  o.small_max = 64 * KiB;
  o.cache_size = 512 * KiB;
  fixture_t f = make_fixture(&o);
  pool_run_t run = {.seed = 5u, .steps = 6000, .max_live = 64, .nstreams = 2,
                    .small_max = 64 * KiB, .max_bytes = 4 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 2000};
  pool_mt_result_t r = pool_threaded_run(f.pool, &run, 8);
  ck_assert_int_gt(r.checks, pool_steps(40));
  ck_assert_int_gt(r.handoffs, pool_steps(40));
  ck_assert_int_gt(r.foreign_frees, pool_steps(2500) / 25);
  ck_assert_uint_ge(field(f.pool, "streams"), 10);
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(f.spy)).outstanding, 0);
  ck_assert_uint_eq(field(f.pool, "reserved"), 0);
  drop_fixture(&f);

  /* With a maximum: out of memory under contention stays clean. */
  o.maximum_size = 32 * MiB;
  f = make_fixture(&o);
  run.seed = 55u;
  run.oom_ok = true;
  run.max_bytes = 6 * MiB;
  r = pool_threaded_run(f.pool, &run, 8);
  ck_assert_int_gt(r.ooms, 0);
  ck_assert_uint_le(field(f.pool, "reserved_peak"), 32 * MiB);
  drop_fixture(&f);
}
END_TEST

/* Threads sharing one stream key: each allocates small blocks and fills
 * them, hands them to the next thread, which checks and frees them. */
typedef struct one_stream {
  rmmc_resource_t *pool;
  pthread_barrier_t *barrier;
  void **mine, **next; /* this thread's blocks; the next thread's */
  int n, index, failures;
} one_stream_t;

static void *one_stream_main(void *arg) {
  one_stream_t *u = arg;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x5157; /* one key for all */
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < u->n; i++) {
      size_t n = (size_t)(1 + (i * 7 + u->index) % 64) * KiB;
      if (rmmc_resource_allocate(u->pool, n, 256, s, &u->mine[i]) != RMMC_SUCCESS) {
        u->failures++;
        u->mine[i] = NULL;
        continue;
      }
      pool_fill(u->mine[i], n, (unsigned)(u->index * 1000 + i));
    }
    pthread_barrier_wait(u->barrier);
    int from = (u->index + 1) % 4; /* the next thread's blocks */
    for (int i = 0; i < u->n; i++) {
      size_t n = (size_t)(1 + (i * 7 + from) % 64) * KiB;
      if (u->next[i] == NULL) continue;
      if (!pool_filled(u->next[i], n, (unsigned)(from * 1000 + i))) u->failures++;
      if (rmmc_resource_deallocate(u->pool, u->next[i], n, 256, s) != RMMC_SUCCESS) u->failures++;
    }
    pthread_barrier_wait(u->barrier);
  }
  return NULL;
}

static void run_one_stream(rmmc_resource_t *pool, int n) {
  pthread_barrier_t barrier;
  ck_assert_int_eq(pthread_barrier_init(&barrier, NULL, 4), 0);
  void *blocks[4][64];
  one_stream_t u[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    u[i] = (one_stream_t){pool, &barrier, blocks[i], blocks[(i + 1) % 4], n, i, 0};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, one_stream_main, &u[i]), 0);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(u[i].failures, 0);
  pthread_barrier_destroy(&barrier);
}

START_TEST(test_pool_threads_on_one_stream_take_their_own_heaps) {
  /* Four threads on one stream, stream_heaps=4: four heaps of the one
   * stream (threads are numbered in turn on their first call, so four new
   * threads take four stripes). A block freed by another thread of the
   * stream goes back to its own heap at once (no foreign list): after the
   * first round every span is wholly free again, and the second round is
   * served from them with no upstream call. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.growth_granularity = 4 * MiB;
  o.cache_size = 64 * MiB;
  o.stream_heaps = 4;
  fixture_t f = make_fixture(&o);
  run_one_stream(f.pool, 16);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "streams"), 1);
  ck_assert_uint_eq(field(f.pool, "heaps"), 4);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  uint64_t calls = spy_allocs(&f);
  run_one_stream(f.pool, 16);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(spy_allocs(&f), calls); /* nothing stranded by the cross-thread frees */
  ck_assert_uint_eq(field(f.pool, "heaps"), 4); /* new threads, the same four stripes */
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  char line[200] = "";
  ck_assert(pool_text(f.pool, "stream", line, sizeof line));
  ck_assert_msg(strstr(line, "heaps=4") != NULL, "%s", line);
  drop_fixture(&f);

  /* stream_heaps=1: the threads share the stream's one heap, as before. */
  o.stream_heaps = 1;
  f = make_fixture(&o);
  run_one_stream(f.pool, 16);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "heaps"), 1);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  drop_fixture(&f);
}
END_TEST

/* One round of a thread made anew: a block on stream 0x5E, freed. */
static void *one_round_main(void *arg) {
  void *b = NULL;
  if (rmmc_resource_allocate(arg, 4096, 256, STREAM(0x5E), &b) != RMMC_SUCCESS) return arg;
  return rmmc_resource_deallocate(arg, b, 4096, 256, STREAM(0x5E)) == RMMC_SUCCESS ? NULL : arg;
}

START_TEST(test_pool_threads_made_anew_keep_the_streams_heap) {
  /* Six rounds, each a new thread on the same stream, one at a time: a
   * thread that exits gives its number back and the next takes it, so the
   * stream keeps one heap (with numbers never reused, each round took a
   * new stripe of the eight and a new heap). */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.stream_heaps = 8;
  fixture_t f = make_fixture(&o);
  for (int round = 0; round < 6; round++) {
    pthread_t th;
    void *failed = f.pool;
    ck_assert_int_eq(pthread_create(&th, NULL, one_round_main, f.pool), 0);
    ck_assert_int_eq(pthread_join(th, &failed), 0);
    ck_assert_msg(failed == NULL, "round %d: %s", round, rmmc_last_error_message());
  }
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "heaps"), 1);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_many_live_blocks) {
  /* Enough live blocks to grow the pointer maps many times. */
  fixture_t f = make_fixture(NULL);
  const int N = pool_steps(20000);
  void **p = malloc((size_t)N * sizeof *p);
  for (int i = 0; i < N; i++) {
    p[i] = alloc_ok(f.pool, 256 + (size_t)(i % 7) * 256, STREAM(1 + i % 2));
    *(int *)p[i] = i;
  }
  CHECK_POOL(f.pool);
  for (int i = 0; i < N; i += 2) {
    ck_assert_int_eq(*(int *)p[i], i);
    free_ok(f.pool, p[i], 256 + (size_t)(i % 7) * 256, STREAM(1 + i % 2));
  }
  CHECK_POOL(f.pool);
  for (int i = 1; i < N; i += 2) {
    ck_assert_int_eq(*(int *)p[i], i);
    free_ok(f.pool, p[i], 256 + (size_t)(i % 7) * 256, STREAM(2 - i % 2)); /* the other stream */
  }
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  free(p);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_alignments) {
  fixture_t f = make_fixture(NULL);
  void *p[18];
  for (int i = 0; i < 18; i++) {
    size_t align = (size_t)1 << (i + 5); /* 32 B .. 4 MiB */
    size_t bytes = 1000 + (size_t)i * 777;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, bytes, align, STREAM(i % 2), &p[i]),
                     RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p[i] % (align < 256 ? 256 : align), 0);
    pool_fill(p[i], bytes, (unsigned)i);
    CHECK_POOL(f.pool);
  }
  for (int i = 0; i < 18; i++) {
    size_t bytes = 1000 + (size_t)i * 777;
    ck_assert(pool_filled(p[i], bytes, (unsigned)i));
    ck_assert_int_eq(
        rmmc_resource_deallocate(f.pool, p[i], bytes, (size_t)1 << (i + 5), STREAM(i % 2)),
        RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
  drop_fixture(&f);
}
END_TEST

/* ---- release_cached and coalescing ---- */

START_TEST(test_pool_release_cached_returns_everything) {
  fixture_t f = make_fixture(NULL);
  spy_t *s = spy_of(f.spy);
  void *p[64];
  size_t n[64];
  for (int i = 0; i < 64; i++) {
    n[i] = (size_t)(i % 9 + 1) * (i % 2 ? 100 * KiB : 3 * MiB);
    p[i] = alloc_ok(f.pool, n[i], STREAM(i % 3));
  }
  /* Nothing is wholly free yet: release gives back nothing in use. */
  uint64_t reserved = field(f.pool, "reserved"), in_use = field(f.pool, "in_use");
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f.pool, "in_use"), in_use);
  ck_assert_uint_le(field(f.pool, "reserved"), reserved);
  ck_assert_uint_ge(field(f.pool, "reserved"), in_use);
  for (int i = 0; i < 64; i++) free_ok(f.pool, p[i], n[i], STREAM(i % 5));
  CHECK_POOL(f.pool);
  ck_assert_uint_gt(spy_counts(s).outstanding, 0); /* cached */
  ck_assert_uint_gt(field(f.pool, "spans"), 0);
  uint64_t releases_before = spy_counts(s).release_calls;
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  /* Every byte went back, and the call was forwarded to the upstream. */
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.outstanding_bytes, 0);
  ck_assert_uint_eq(c.release_calls, releases_before + 1);
  rmmc_pool_figures_t g = pool_figures(f.pool);
  ck_assert_uint_eq(g.reserved, 0);
  ck_assert_uint_eq(g.cached, 0);
  ck_assert_uint_eq(g.pending, 0);
  ck_assert_uint_eq(g.shrinks, g.grows);
  ck_assert_uint_eq(field(f.pool, "regions"), 0);
  ck_assert_uint_eq(field(f.pool, "spans"), 0);
  ck_assert_uint_eq(field(f.pool, "free"), 0);
  ck_assert_uint_eq(field(f.pool, "largest_free"), 0);
  ck_assert_uint_gt(field(f.pool, "reserved_peak"), 0);
  /* And it serves again. */
  p[0] = alloc_ok(f.pool, 5000, NULL);
  pool_fill(p[0], 5000, 1);
  ck_assert(pool_filled(p[0], 5000, 1));
  free_ok(f.pool, p[0], 5000, NULL);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_coalescing_restores_whole_regions) {
  /* One stream: blocks freed in a scrambled order merge back into the whole
   * chunk, which then serves one request at its start with no upstream
   * call. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 32 * MiB;
  o.small_max = 0; /* every block straight from the chunk */
  fixture_t f = make_fixture(&o);
  ck_assert_uint_eq(spy_allocs(&f), 1);
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  enum { N = 128 };
  void *p[N];
  for (int i = 0; i < N; i++) p[i] = alloc_ok(f.pool, 256 * KiB, NULL);
  ck_assert_uint_eq(field(f.pool, "free"), 0);
  for (int i = 0; i < N; i++) {
    free_ok(f.pool, p[(i * 37) % N], 256 * KiB, NULL);
    CHECK_POOL(f.pool);
  }
  ck_assert_uint_eq(field(f.pool, "free"), 32 * MiB);
  ck_assert_uint_eq(field(f.pool, "largest_free"), 32 * MiB);
  void *whole = alloc_ok(f.pool, 32 * MiB, NULL);
  ck_assert_ptr_eq(whole, p[0]);
  ck_assert_uint_eq(spy_allocs(&f), 1);
  free_ok(f.pool, whole, 32 * MiB, NULL);
  drop_fixture(&f);

  /* Two streams, every free covered at once (event_interval=1, and a second
   * stream known before the frees): the halves each stream freed merge, and
   * a third stream gets the whole chunk. */
  o.event_interval = 1;
  o.initial_size = 34 * MiB;
  f = make_fixture(&o);
  void *first = alloc_ok(f.pool, 2 * MiB, STREAM(2));
  for (int i = 0; i < N; i++) p[i] = alloc_ok(f.pool, 256 * KiB, STREAM(1));
  free_ok(f.pool, first, 2 * MiB, STREAM(2));
  for (int i = 0; i < N; i += 2) {
    free_ok(f.pool, p[i], 256 * KiB, STREAM(1));
    CHECK_POOL(f.pool);
  }
  for (int i = 1; i < N; i += 2) {
    free_ok(f.pool, p[i], 256 * KiB, STREAM(2));
    CHECK_POOL(f.pool);
  }
  ck_assert_uint_eq(field(f.pool, "largest_free"), 34 * MiB);
  whole = alloc_ok(f.pool, 34 * MiB, STREAM(3));
  ck_assert_ptr_eq(whole, first);
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  ck_assert_uint_eq(field(f.pool, "grows"), 0);
  ck_assert_uint_eq(spy_allocs(&f), 1);
  free_ok(f.pool, whole, 34 * MiB, STREAM(3));
  drop_fixture(&f);
}
END_TEST

/* ---- stream heaps ---- */

START_TEST(test_pool_small_free_is_reused_at_once) {
  /* The last block a stream freed serves the next request of that size on
   * that stream: the same address, no new span, no upstream call. */
  fixture_t f = make_fixture(NULL);
  void *keep = alloc_ok(f.pool, 4096, STREAM(1)); /* keeps the span busy */
  void *a = alloc_ok(f.pool, 3000, STREAM(1));
  uint64_t spans = field(f.pool, "spans"), calls = spy_allocs(&f);
  for (int i = 0; i < 100; i++) {
    free_ok(f.pool, a, 3000, STREAM(1));
    void *b = alloc_ok(f.pool, 3000, STREAM(1));
    ck_assert_ptr_eq(b, a);
  }
  ck_assert_uint_eq(field(f.pool, "spans"), spans);
  ck_assert_uint_eq(spy_allocs(&f), calls);
  /* Another stream gets a span of its own, not this block. */
  free_ok(f.pool, a, 3000, STREAM(1));
  void *b = alloc_ok(f.pool, 3000, STREAM(2));
  ck_assert_ptr_ne(b, a);
  ck_assert_uint_eq(field(f.pool, "spans"), spans + 1);
  ck_assert_uint_eq(field(f.pool, "streams"), 2);
  pool_stream_line_t l;
  ck_assert(pool_stream_line(f.pool, STREAM(1), &l));
  ck_assert_double_eq_tol(l.in_use, 4096, 1);
  ck_assert_double_eq_tol(l.cached, 4 * MiB - 4096, 4 * MiB / 200);
  ck_assert(pool_stream_line(f.pool, STREAM(2), &l));
  ck_assert_double_eq_tol(l.in_use, 3072, 1);
  free_ok(f.pool, b, 3000, STREAM(2));
  free_ok(f.pool, keep, 4096, STREAM(1));
  drop_fixture(&f);
}
END_TEST

/* A span of 64 KiB filled with four 16 KiB blocks on stream 1 (every
 * request up to 64 KiB is small). */
static fixture_t full_span(void *blk[4]) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = 64 * KiB;
  o.small_max = 64 * KiB;
  o.min_growth = 1 * MiB;
  fixture_t f = make_fixture(&o);
  for (int i = 0; i < 4; i++) {
    blk[i] = alloc_ok(f.pool, 16 * KiB, STREAM(1));
    pool_fill(blk[i], 16 * KiB, (unsigned)i);
  }
  ck_assert_uint_eq(field(f.pool, "spans"), 1);
  ck_assert_uint_eq(field(f.pool, "cached"), 0);
  return f;
}

START_TEST(test_pool_foreign_free_returns_to_its_stream) {
  /* A small block freed on another stream goes back to the heap of the
   * stream that allocated it: once that stream needs memory it reuses the
   * block (the same address) rather than take a new span. */
  void *blk[4];
  fixture_t f = full_span(blk);
  uint64_t records = field(f.pool, "event_records");
  free_ok(f.pool, blk[2], 16 * KiB, STREAM(2));
  CHECK_POOL(f.pool);
  /* Covered by a record of stream 2 (host mode: finished at once). */
  ck_assert_uint_eq(field(f.pool, "event_records"), records + 1);
  ck_assert_uint_eq(field(f.pool, "in_use"), 48 * KiB);
  ck_assert_uint_eq(field(f.pool, "spans"), 1);
  void *again = alloc_ok(f.pool, 16 * KiB, STREAM(1));
  ck_assert_ptr_eq(again, blk[2]);
  ck_assert_uint_eq(field(f.pool, "spans"), 1);
  ck_assert_uint_eq(field(f.pool, "event_waits"), 0);
  CHECK_POOL(f.pool);
  for (int i = 0; i < 4; i++)
    if (i != 2) ck_assert(pool_filled(blk[i], 16 * KiB, (unsigned)i));
  /* The block is stream 1's again: a free on stream 1 is an ordinary one,
   * and a second free anywhere is refused. */
  free_ok(f.pool, again, 16 * KiB, STREAM(1));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, again, 16 * KiB, 256, STREAM(2)),
                   RMMC_ERROR_UNKNOWN_POINTER);
  for (int i = 0; i < 4; i++)
    if (i != 2) free_ok(f.pool, blk[i], 16 * KiB, STREAM(i % 2 ? 3 : 1));
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_foreign_free_beside_hot_block_merges) {
  /* Stream 1's span: [a][b][c][d]. c is freed on stream 2 (a foreign
   * free), then a and b on stream 1 (b stays unmerged as the heap's last
   * free). When stream 1 takes c back, c merges with b and the block must
   * merge with a as well: free neighbours in a span never stay apart, and a
   * span that is wholly free again is one block, which goes back whole. */
  void *blk[4];
  fixture_t f = full_span(blk);
  free_ok(f.pool, blk[2], 16 * KiB, STREAM(2));
  free_ok(f.pool, blk[0], 16 * KiB, STREAM(1));
  free_ok(f.pool, blk[1], 16 * KiB, STREAM(1));
  CHECK_POOL(f.pool);
  /* 32 KiB fits no free block of stream 1 but the three merged. */
  void *x = alloc_ok(f.pool, 32 * KiB, STREAM(1));
  CHECK_POOL(f.pool);
  ck_assert_ptr_eq(x, blk[0]);
  ck_assert_uint_eq(field(f.pool, "spans"), 1);
  free_ok(f.pool, x, 32 * KiB, STREAM(1));
  free_ok(f.pool, blk[3], 16 * KiB, STREAM(1));
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "cached"), 64 * KiB);
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "cached"), 0);
  ck_assert_uint_eq(spy_bytes(&f), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_foreign_free_then_span_goes_back_whole) {
  /* The same layout without a request in between: c comes back to stream
   * 1's heap only when stream 1 needs memory; the span, wholly free, goes
   * back to the shared heap as one block and nothing of it stays in the
   * heap's index (release_cached, then new requests reuse the memory). */
  void *blk[4];
  fixture_t f = full_span(blk);
  free_ok(f.pool, blk[2], 16 * KiB, STREAM(2));
  free_ok(f.pool, blk[0], 16 * KiB, STREAM(1));
  free_ok(f.pool, blk[1], 16 * KiB, STREAM(1));
  void *x = alloc_ok(f.pool, 48 * KiB, STREAM(1)); /* takes c back: a+b+c */
  ck_assert_ptr_eq(x, blk[0]);
  free_ok(f.pool, x, 48 * KiB, STREAM(1));
  free_ok(f.pool, blk[3], 16 * KiB, STREAM(1));
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(spy_bytes(&f), 0);
  /* Nothing stale is handed out: every new block is new memory (the spy
   * holds it) and can be written. */
  for (int i = 0; i < 8; i++) {
    void *p = alloc_ok(f.pool, 16 * KiB, STREAM(1));
    pool_fill(p, 16 * KiB, 9);
    ck_assert_uint_gt(spy_bytes(&f), 0);
    CHECK_POOL(f.pool);
    free_ok(f.pool, p, 16 * KiB, STREAM(1));
  }
  drop_fixture(&f);
}
END_TEST

/* A thread that allocates and frees small blocks on its per-thread stream
 * and exits, leaving its heap's spans idle. */
typedef struct span_user {
  rmmc_resource_t *pool;
  cudaStream_t stream;
  int blocks;
  size_t bytes;
  int failures;
} span_user_t;

static void *span_user_main(void *arg) {
  span_user_t *u = arg;
  void *b[64];
  for (int i = 0; i < u->blocks; i++)
    if (rmmc_resource_allocate(u->pool, u->bytes, 256, u->stream, &b[i]) != RMMC_SUCCESS)
      u->failures++;
    else
      pool_fill(b[i], u->bytes, (unsigned)i);
  for (int i = 0; i < u->blocks; i++) {
    if (!pool_filled(b[i], u->bytes, (unsigned)i)) u->failures++;
    if (rmmc_resource_deallocate(u->pool, b[i], u->bytes, 256, u->stream) != RMMC_SUCCESS)
      u->failures++;
  }
  return NULL;
}

static void run_span_user(rmmc_resource_t *pool, cudaStream_t s, int blocks, size_t bytes) {
  span_user_t u = {pool, s, blocks, bytes, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, span_user_main, &u), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_int_eq(u.failures, 0);
}

START_TEST(test_pool_exited_thread_gives_back_its_spans) {
  /* A thread fills three spans on its per-thread stream (a stream of its
   * own), frees everything and exits: its heap keeps them (within cache=).
   * The upstream then has no more room; the main thread's requests, large
   * and small, are served from the dead thread's spans, with no upstream
   * call. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.growth_granularity = 4 * MiB;
  o.cache_size = 16 * MiB;
  fixture_t f = make_fixture(&o);
  run_span_user(f.pool, cudaStreamPerThread, 12, 1 * MiB);
  ck_assert_uint_eq(field(f.pool, "spans"), 3);
  ck_assert_uint_eq(field(f.pool, "cached"), 12 * MiB);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  uint64_t calls = spy_allocs(&f), bytes = spy_bytes(&f);
  spy_set_capacity(spy_of(f.spy), bytes);
  void *big = alloc_ok(f.pool, 8 * MiB, cudaStreamPerThread);
  pool_fill(big, 8 * MiB, 1);
  void *small = alloc_ok(f.pool, 512 * KiB, NULL);
  pool_fill(small, 512 * KiB, 2);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(spy_counts(spy_of(f.spy)).allocate_calls - spy_counts(spy_of(f.spy)).allocate_failures,
                    calls);
  ck_assert_uint_eq(spy_bytes(&f), bytes);
  ck_assert(pool_filled(big, 8 * MiB, 1) && pool_filled(small, 512 * KiB, 2));
  free_ok(f.pool, big, 8 * MiB, cudaStreamPerThread);
  free_ok(f.pool, small, 512 * KiB, NULL);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  drop_fixture(&f);
}
END_TEST

/* Allocates `n` 1 MiB blocks on its per-thread stream and exits, handing
 * them to the caller. */
typedef struct producer {
  rmmc_resource_t *pool;
  void *blk[16];
  int n, failures;
} producer_t;

static void *producer_main(void *arg) {
  producer_t *u = arg;
  for (int i = 0; i < u->n; i++)
    if (rmmc_resource_allocate(u->pool, 1 * MiB, 256, cudaStreamPerThread, &u->blk[i]) !=
        RMMC_SUCCESS)
      u->failures++;
  return NULL;
}

START_TEST(test_pool_blocks_freed_by_other_streams_serve_under_pressure) {
  /* A producer thread allocates 12 small blocks (three spans of its
   * per-thread stream's heap) and exits; the main thread frees them all on
   * its own stream (foreign frees: they go back to the dead thread's heap).
   * Nothing is in use. With no more room upstream, a request must be
   * served from that memory: the pool never reports out of memory while it
   * caches memory that would serve the request. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.growth_granularity = 4 * MiB;
  fixture_t f = make_fixture(&o);
  producer_t u = {.pool = f.pool, .n = 12};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, producer_main, &u), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_int_eq(u.failures, 0);
  for (int i = 0; i < 12; i++) free_ok(f.pool, u.blk[i], 1 * MiB, NULL);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  spy_set_capacity(spy_of(f.spy), spy_bytes(&f));
  void *big = NULL;
  rmmc_status_t st = rmmc_resource_allocate(f.pool, 8 * MiB, 256, NULL, &big);
  ck_assert_msg(st == RMMC_SUCCESS, "nothing in use, %llu bytes reserved: %s",
                (unsigned long long)field(f.pool, "reserved"), rmmc_last_error_message());
  pool_fill(big, 8 * MiB, 1);
  void *small = alloc_ok(f.pool, 512 * KiB, STREAM(5));
  CHECK_POOL(f.pool);
  ck_assert(pool_filled(big, 8 * MiB, 1));
  free_ok(f.pool, big, 8 * MiB, NULL);
  free_ok(f.pool, small, 512 * KiB, STREAM(5));
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_idle_stream_spans_serve_others_before_growth) {
  /* The header: "other streams take back a heap's free spans before the
   * pool grows". Stream 1 fills and frees three spans and goes idle (every
   * free on its own stream, so its heap keeps them); stream 2 then needs
   * 8 MiB. The pool has 12 MiB of idle spans: it must not grow. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.growth_granularity = 4 * MiB;
  o.cache_size = 16 * MiB;
  fixture_t f = make_fixture(&o);
  run_span_user(f.pool, STREAM(1), 12, 1 * MiB);
  ck_assert_uint_eq(field(f.pool, "cached"), 12 * MiB);
  uint64_t reserved = field(f.pool, "reserved"), grows = field(f.pool, "grows");
  void *big = alloc_ok(f.pool, 8 * MiB, STREAM(2));
  CHECK_POOL(f.pool);
  ck_assert_msg(field(f.pool, "reserved") == reserved && field(f.pool, "grows") == grows,
                "the pool grew from %llu to %llu bytes with %llu bytes of idle spans cached",
                (unsigned long long)reserved, (unsigned long long)field(f.pool, "reserved"),
                (unsigned long long)12 * MiB);
  free_ok(f.pool, big, 8 * MiB, STREAM(2));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_foreign_frees_keep_the_cache_bound) {
  /* Stream 1 fills 10 spans with 40 blocks; stream 2 frees them all
   * (foreign frees). When stream 1 next allocates it takes them back: its
   * heap then keeps at most cache= bytes of wholly free spans (16 MiB,
   * four spans) besides the span it allocates from, and the rest goes back
   * to the shared heap. */
  fixture_t f = make_fixture(NULL);
  void *b[40];
  for (int i = 0; i < 40; i++) b[i] = alloc_ok(f.pool, 1 * MiB, STREAM(1));
  ck_assert_uint_eq(field(f.pool, "spans"), 10);
  for (int i = 0; i < 40; i++) free_ok(f.pool, b[i], 1 * MiB, STREAM(2));
  void *x = alloc_ok(f.pool, 4096, STREAM(1));
  void *y = alloc_ok(f.pool, 4096, STREAM(1));
  free_ok(f.pool, y, 4096, STREAM(1));
  CHECK_POOL(f.pool);
  pool_stream_line_t l;
  ck_assert(pool_stream_line(f.pool, STREAM(1), &l));
  ck_assert_msg(l.cached <= 16.0 * MiB + 4.0 * MiB && field(f.pool, "spans") <= 5,
                "stream 1 caches %.0f bytes in %llu spans (cache=16MiB, 4 MiB spans)", l.cached,
                (unsigned long long)field(f.pool, "spans"));
  free_ok(f.pool, x, 4096, STREAM(1));
  drop_fixture(&f);
}
END_TEST

/* 64 threads on their own stream keys (or all on one: shared). */
typedef struct cache_user {
  rmmc_resource_t *pool;
  int index, failures;
  double worst_cached, worst_bound;
  bool shared;
  pthread_barrier_t *started; /* every thread has made its first call */
} cache_user_t;

enum { CACHE_THREADS = 64, CACHE_LIVE = 32 };
#define CACHE_SPAN (64 * KiB)
#define CACHE_BYTES (2 * CACHE_SPAN)

static void *cache_user_main(void *arg) {
  cache_user_t *u = arg;
  cudaStream_t s = STREAM(u->shared ? 99 : 100 + u->index);
  void *b[CACHE_LIVE] = {0};
  size_t n[CACHE_LIVE] = {0};
  unsigned seed = 7u + (unsigned)u->index * 977u;
  for (int step = 0; step < pool_steps(3000); step++) {
    /* All threads live at once, each with its own number (numbers of
     * exited threads are reused): 64 threads cover every stripe. */
    if (step == 1) pthread_barrier_wait(u->started);
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 8) % CACHE_LIVE);
    if (b[k] == NULL) {
      n[k] = 1 + (seed >> 12) % (16 * KiB);
      if (rmmc_resource_allocate(u->pool, n[k], 256, s, &b[k]) != RMMC_SUCCESS)
        u->failures++;
    } else {
      if (rmmc_resource_deallocate(u->pool, b[k], n[k], 256, s) != RMMC_SUCCESS)
        u->failures++;
      b[k] = NULL;
    }
    if (step % 250 == 249 && !u->shared) {
      /* Wholly free spans: at most cache= bytes; each other span holds a
       * live block of this thread, so it caches less than a span. */
      int live = 0;
      for (int i = 0; i < CACHE_LIVE; i++) live += b[i] != NULL;
      pool_stream_line_t l;
      if (!pool_stream_line(u->pool, STREAM(100 + u->index), &l)) {
        u->failures++;
        continue;
      }
      double bound = (double)CACHE_BYTES + (double)live * CACHE_SPAN;
      if (l.cached > u->worst_cached) u->worst_cached = l.cached, u->worst_bound = bound;
      if (l.cached > bound * 1.005) u->failures++;
    }
  }
  for (int i = 0; i < CACHE_LIVE; i++)
    if (b[i] != NULL && rmmc_resource_deallocate(u->pool, b[i], n[i], 256, s) != RMMC_SUCCESS)
      u->failures++;
  /* Everything freed: only wholly free spans, at most cache= bytes. */
  pool_stream_line_t l;
  if (!u->shared &&
      (!pool_stream_line(u->pool, s, &l) || l.in_use != 0 || l.cached > CACHE_BYTES))
    u->failures++;
  return NULL;
}

/* A pool of CACHE_SPAN spans caching at most CACHE_BYTES per heap, run by
 * CACHE_THREADS cache users (on one stream key when `shared`); every user
 * must finish with no failure. */
static fixture_t run_cache_users(unsigned stream_heaps, bool shared) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = CACHE_SPAN;
  o.small_max = 16 * KiB;
  o.cache_size = CACHE_BYTES;
  o.min_growth = 1 * MiB;
  o.growth_granularity = 64 * KiB;
  o.stream_heaps = stream_heaps;
  fixture_t f = make_fixture(&o);
  pthread_t th[CACHE_THREADS];
  cache_user_t u[CACHE_THREADS];
  pthread_barrier_t started;
  ck_assert_int_eq(pthread_barrier_init(&started, NULL, CACHE_THREADS), 0);
  for (int i = 0; i < CACHE_THREADS; i++) {
    u[i] = (cache_user_t){f.pool, i, 0, 0, 0, shared, &started};
    ck_assert_int_eq(pthread_create(&th[i], NULL, cache_user_main, &u[i]), 0);
  }
  for (int i = 0; i < CACHE_THREADS; i++) {
    ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_msg(u[i].failures == 0, "thread %d: %d failures (cached %.0f, bound %.0f)", i,
                  u[i].failures, u[i].worst_cached, u[i].worst_bound);
  }
  pthread_barrier_destroy(&started);
  CHECK_POOL(f.pool);
  return f;
}

START_TEST(test_pool_stream_heaps_stay_within_cache_bound) {
  fixture_t f = run_cache_users(0, false);
  ck_assert_uint_eq(field(f.pool, "streams"), CACHE_THREADS);
  ck_assert_int_eq(pool_stream_lines(f.pool), CACHE_THREADS);
  rmmc_pool_figures_t g = pool_figures(f.pool);
  ck_assert_uint_eq(g.in_use, 0);
  ck_assert_uint_le(g.cached, (size_t)CACHE_THREADS * CACHE_BYTES);
  ck_assert_uint_le(field(f.pool, "spans"), (uint64_t)CACHE_THREADS * (CACHE_BYTES / CACHE_SPAN));
  ck_assert_uint_eq(g.cached, field(f.pool, "spans") * CACHE_SPAN);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_threads_on_one_stream_stay_within_cache_bound) {
  /* 64 threads on one stream key, stream_heaps=8: the stream has 8 heaps
   * (64 new threads cover every stripe), each caching at most cache=
   * bytes of wholly free spans once everything is freed. */
  fixture_t f = run_cache_users(8, true);
  ck_assert_uint_eq(field(f.pool, "streams"), 1);
  ck_assert_uint_eq(field(f.pool, "heaps"), 8);
  rmmc_pool_figures_t g = pool_figures(f.pool);
  ck_assert_uint_eq(g.in_use, 0);
  ck_assert_uint_le(g.cached, (size_t)8 * CACHE_BYTES);
  ck_assert_uint_eq(g.cached, field(f.pool, "spans") * CACHE_SPAN);
  pool_stream_line_t l;
  ck_assert(pool_stream_line(f.pool, STREAM(99), &l));
  ck_assert_uint_eq((uint64_t)l.cached, g.cached);
  drop_fixture(&f);
}
END_TEST

/* Threads that each use a new stream key for every few blocks, while
 * other threads check and describe the pool. */
typedef struct newcomer {
  rmmc_resource_t *pool;
  int index, failures;
  int *stop;
  char first[256];
} newcomer_t;

static void *newcomer_main(void *arg) {
  newcomer_t *u = arg;
  for (int i = 0; i < pool_steps(4000); i++) {
    cudaStream_t s = STREAM(0x10000 * (u->index + 1) + i);
    void *p[4];
    for (int k = 0; k < 4; k++) {
      if (rmmc_resource_allocate(u->pool, 1000 + (size_t)k * 300, 256, s, &p[k]) != RMMC_SUCCESS) {
        u->failures++;
        return NULL;
      }
      pool_fill(p[k], 1000 + (size_t)k * 300, (unsigned)(i + k));
    }
    for (int k = 0; k < 4; k++) {
      if (!pool_filled(p[k], 1000 + (size_t)k * 300, (unsigned)(i + k))) u->failures++;
      if (rmmc_resource_deallocate(u->pool, p[k], 1000 + (size_t)k * 300, 256, s) != RMMC_SUCCESS)
        u->failures++;
    }
  }
  return NULL;
}

static void *checker_main(void *arg) {
  newcomer_t *u = arg;
  while (!__atomic_load_n(u->stop, __ATOMIC_ACQUIRE)) {
    if (rmmc_pool_resource_check(u->pool) != RMMC_SUCCESS && u->failures++ == 0)
      snprintf(u->first, sizeof u->first, "%s", rmmc_last_error_message());
    rmmc_pool_figures_t g = RMMC_POOL_FIGURES_INIT;
    if (rmmc_pool_resource_figures(u->pool, &g) != RMMC_SUCCESS || g.in_use > g.reserved)
      u->failures++;
  }
  return NULL;
}

START_TEST(test_pool_check_while_streams_appear) {
  /* rmmc_pool_resource_check (and describe, figures) take every lock: a
   * stream heap made while one of them runs must be locked too, or left
   * out, and never unlocked by it. Four threads make a new stream heap every
   * four blocks while a fifth checks the pool in a loop: every check
   * passes, every block keeps its data. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = 64 * KiB;
  o.small_max = 16 * KiB;
  o.cache_size = 0;
  o.min_growth = 1 * MiB;
  fixture_t f = make_fixture(&o);
  int stop = 0; /* atomic: the checker reads it while this thread sets it */
  newcomer_t u[5];
  pthread_t th[5];
  for (int i = 0; i < 5; i++) {
    u[i] = (newcomer_t){f.pool, i, 0, &stop, ""};
    ck_assert_int_eq(pthread_create(&th[i], NULL, i < 4 ? newcomer_main : checker_main, &u[i]), 0);
  }
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_join(th[i], NULL), 0);
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(pthread_join(th[4], NULL), 0);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(u[i].failures, 0);
  ck_assert_msg(u[4].failures == 0, "%d concurrent checks failed; the first: %s", u[4].failures,
                u[4].first);
  ck_assert_uint_eq(field(f.pool, "streams"), 4 * (uint64_t)pool_steps(4000));
  drop_fixture(&f);
}
END_TEST

/* ---- stream order in host mode ---- */

START_TEST(test_pool_freeing_stream_reuses_at_once) {
  /* A large block freed on stream A serves A's next request at once (the
   * same address), even when no record covers the free. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.event_interval = 64;
  fixture_t f = make_fixture(&o);
  void *other = alloc_ok(f.pool, 2 * MiB, STREAM(0xB)); /* a second stream */
  void *a = alloc_ok(f.pool, 6 * MiB, STREAM(0xA));
  uint64_t grows = field(f.pool, "grows"), records = field(f.pool, "event_records");
  free_ok(f.pool, a, 6 * MiB, STREAM(0xA));
  ck_assert_uint_eq(field(f.pool, "event_records"), records); /* 1 free of 64 */
  pool_stream_line_t l;
  ck_assert(pool_stream_line(f.pool, STREAM(0xA), &l));
  ck_assert_double_ge(l.pending, 6.0 * MiB);
  void *b = alloc_ok(f.pool, 6 * MiB, STREAM(0xA));
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(field(f.pool, "grows"), grows);
  free_ok(f.pool, b, 6 * MiB, STREAM(0xA));
  free_ok(f.pool, other, 2 * MiB, STREAM(0xB));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_other_stream_reuses_once_covered) {
  /* event_interval=1 (the default): with several streams every free in the
   * shared heap is covered by a record at once, which in host mode
   * finishes the epoch: another stream reuses the memory without growing
   * and without a wait. */
  fixture_t f = make_fixture(NULL);
  void *b0 = alloc_ok(f.pool, 2 * MiB, STREAM(0xB));
  void *a = alloc_ok(f.pool, 8 * MiB, STREAM(0xA));
  uint64_t grows = field(f.pool, "grows"), records = field(f.pool, "event_records");
  free_ok(f.pool, a, 8 * MiB, STREAM(0xA));
  ck_assert_uint_eq(field(f.pool, "event_records"), records + 1);
  void *b = alloc_ok(f.pool, 8 * MiB, STREAM(0xB));
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(field(f.pool, "grows"), grows);
  /* Host mode: a record finishes its epoch, so nothing ever waits on an
   * event and nothing synchronizes. */
  ck_assert_uint_eq(field(f.pool, "event_waits"), 0);
  ck_assert_uint_eq(field(f.pool, "device_syncs"), 0);
  free_ok(f.pool, b, 8 * MiB, STREAM(0xB));
  free_ok(f.pool, b0, 2 * MiB, STREAM(0xB));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_uncovered_free_waits_for_a_record) {
  /* event_interval=64: stream A's free is not covered yet, so stream B may
   * not take that memory (it grows instead) and asks A to record. A's next
   * free in the shared heap records, covering both; then stream C reuses
   * A's first block without growing. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.event_interval = 64;
  o.min_growth = 2 * MiB;
  fixture_t f = make_fixture(&o);
  void *x = alloc_ok(f.pool, 2 * MiB, STREAM(0xA));
  void *a = alloc_ok(f.pool, 8 * MiB, STREAM(0xA));
  void *c0 = alloc_ok(f.pool, 2 * MiB, STREAM(0xC)); /* C is known */
  free_ok(f.pool, a, 8 * MiB, STREAM(0xA));
  uint64_t grows = field(f.pool, "grows"), records = field(f.pool, "event_records");
  void *b = alloc_ok(f.pool, 8 * MiB, STREAM(0xB));
  ck_assert_ptr_ne(b, a);
  ck_assert_uint_eq(field(f.pool, "grows"), grows + 1);
  ck_assert_uint_eq(field(f.pool, "event_records"), records);
  free_ok(f.pool, x, 2 * MiB, STREAM(0xA)); /* B asked: A records now */
  ck_assert_uint_eq(field(f.pool, "event_records"), records + 1);
  grows = field(f.pool, "grows");
  void *c = alloc_ok(f.pool, 8 * MiB, STREAM(0xC));
  ck_assert_ptr_eq(c, a);
  ck_assert_uint_eq(field(f.pool, "grows"), grows);
  ck_assert_uint_eq(field(f.pool, "event_waits"), 0);
  free_ok(f.pool, b, 8 * MiB, STREAM(0xB));
  free_ok(f.pool, c, 8 * MiB, STREAM(0xC));
  free_ok(f.pool, c0, 2 * MiB, STREAM(0xC));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_event_bytes_covers_large_frees) {
  /* event_interval=1000, event_bytes=4MiB: with two streams in use, frees
   * are covered once 4 MiB of them wait, whatever their count; until then
   * another stream may not take them. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.event_interval = 1000;
  o.event_bytes = 4 * MiB;
  o.initial_size = 16 * MiB; /* one chunk: a1 and a2 are neighbours */
  fixture_t f = make_fixture(&o);
  void *b0 = alloc_ok(f.pool, 2 * MiB, STREAM(0xB));
  void *a1 = alloc_ok(f.pool, 2 * MiB, STREAM(0xA)), *a2 = alloc_ok(f.pool, 3 * MiB, STREAM(0xA));
  uint64_t records = field(f.pool, "event_records");
  free_ok(f.pool, a1, 2 * MiB, STREAM(0xA));
  ck_assert_uint_eq(field(f.pool, "event_records"), records);
  free_ok(f.pool, a2, 3 * MiB, STREAM(0xA)); /* 5 MiB wait: covered */
  ck_assert_uint_eq(field(f.pool, "event_records"), records + 1);
  uint64_t grows = field(f.pool, "grows");
  void *b = alloc_ok(f.pool, 5 * MiB, STREAM(0xB));
  ck_assert_ptr_eq(b, a1); /* a1 and a2 merged, then reused */
  ck_assert_uint_eq(field(f.pool, "grows"), grows);
  free_ok(f.pool, b, 5 * MiB, STREAM(0xB));
  free_ok(f.pool, b0, 2 * MiB, STREAM(0xB));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_describes_every_figure) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 16 * MiB;
  o.min_growth = 2 * MiB;
  fixture_t f = make_fixture(&o);
  ck_assert_uint_eq(field(f.pool, "reserved"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "free"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  ck_assert_uint_eq(field(f.pool, "largest_free"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  ck_assert_uint_eq(field(f.pool, "reserved_peak"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "peak"), 0);
  ck_assert_uint_eq(field(f.pool, "streams"), 0);
  ck_assert_int_eq(pool_stream_lines(f.pool), 0);
  uint64_t unused;
  ck_assert(!rmmc_resource_get_field(f.pool, "limit", &unused));
  /* The backend, as text. */
  char backend[32] = "";
  ck_assert(pool_text(f.pool, "backend", backend, sizeof backend));
  ck_assert_str_eq(backend, "chunks");
  void *small[6], *large;
  for (int i = 0; i < 6; i++) small[i] = alloc_ok(f.pool, 1000 * (size_t)(i + 1), STREAM(0x50));
  large = alloc_ok(f.pool, 3 * MiB, NULL);
  uint64_t in_use = (4 + 8 + 12 + 16 + 20 + 24) * 256 + 3 * MiB; /* rounded to 256 */
  ck_assert_uint_eq(field(f.pool, "in_use"), in_use);
  ck_assert_uint_eq(field(f.pool, "free") + in_use, 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "spans"), 1);
  /* peak: large blocks and spans lent. */
  ck_assert_uint_eq(field(f.pool, "peak"), 4 * MiB + 3 * MiB);
  ck_assert_uint_eq(field(f.pool, "cached"), 4 * MiB - (in_use - 3 * MiB));
  ck_assert_uint_eq(field(f.pool, "streams"), 2);
  ck_assert_int_eq(pool_stream_lines(f.pool), 2);
  pool_stream_line_t l;
  ck_assert(pool_stream_line(f.pool, STREAM(0x50), &l));
  ck_assert_double_eq_tol(l.in_use, (double)(in_use - 3 * MiB), 1);
  ck_assert_double_eq_tol(l.cached, (double)(4 * MiB - (in_use - 3 * MiB)), 4 * MiB / 200.0);
  ck_assert_double_eq(l.pending, 0);
  ck_assert(pool_stream_line(f.pool, NULL, &l));
  ck_assert_double_eq(l.cached, 0);
  ck_assert(!pool_stream_line(f.pool, STREAM(0x51), &l));
  /* A large free is pending on its stream until covered (one stream in
   * use: no record). */
  free_ok(f.pool, large, 3 * MiB, NULL);
  ck_assert(pool_stream_line(f.pool, NULL, &l));
  ck_assert_double_ge(l.pending, 3.0 * MiB);
  ck_assert_double_eq_tol((double)field(f.pool, "pending"), l.pending, l.pending / 200);
  /* The figures agree with describe. */
  rmmc_pool_figures_t g = pool_figures(f.pool);
  ck_assert_uint_eq(g.reserved, field(f.pool, "reserved"));
  ck_assert_uint_eq(g.in_use, field(f.pool, "in_use"));
  ck_assert_uint_eq(g.cached, field(f.pool, "cached"));
  ck_assert_uint_eq(g.pending, field(f.pool, "pending"));
  ck_assert_uint_eq(g.grows, field(f.pool, "grows"));
  ck_assert_uint_eq(g.shrinks, field(f.pool, "shrinks"));
  ck_assert_uint_eq(g.event_records, field(f.pool, "event_records"));
  ck_assert_uint_eq(g.event_waits, field(f.pool, "event_waits"));
  ck_assert_uint_eq(g.event_queries, field(f.pool, "event_queries"));
  ck_assert_uint_eq(g.device_syncs, field(f.pool, "device_syncs"));
  for (int i = 0; i < 6; i++) free_ok(f.pool, small[i], 1000 * (size_t)(i + 1), STREAM(0x50));
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_figures_reject_bad_arguments) {
  fixture_t f = make_fixture(NULL);
  rmmc_pool_figures_t g = RMMC_POOL_FIGURES_INIT;
  ck_assert_int_eq(rmmc_pool_resource_figures(f.pool, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resource_figures(NULL, &g), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resource_figures(f.spy, &g), RMMC_ERROR_INVALID_ARGUMENT);
  g.size = 4;
  ck_assert_int_eq(rmmc_pool_resource_figures(f.pool, &g), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "RMMC_POOL_FIGURES_INIT"));
  /* An older, shorter struct gets what fits. */
  struct {
    rmmc_pool_figures_t f;
    size_t canary;
  } big;
  memset(&big, 0xab, sizeof big);
  big.f.size = offsetof(rmmc_pool_figures_t, cached);
  void *p = alloc_ok(f.pool, 5 * MiB, NULL);
  ck_assert_int_eq(rmmc_pool_resource_figures(f.pool, &big.f), RMMC_SUCCESS);
  ck_assert_uint_eq(big.f.size, offsetof(rmmc_pool_figures_t, cached));
  ck_assert_uint_eq(big.f.in_use, 5 * MiB);
  ck_assert_uint_eq(big.f.reserved, field(f.pool, "reserved"));
  ck_assert_uint_eq(big.f.cached, (size_t)0xabababababababab);
  /* check() refuses what is not a pool. */
  ck_assert_int_eq(rmmc_pool_resource_check(f.spy), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resource_check(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  free_ok(f.pool, p, 5 * MiB, NULL);
  drop_fixture(&f);
}
END_TEST

/* ---- hysteresis and pressure ---- */

/* One cycle of phases: many large blocks, then many small ones on two
 * streams, then large blocks of other sizes. */
static void phase_cycle(rmmc_resource_t *pool, int cycle) {
  void *p[64];
  size_t n[64];
  for (int i = 0; i < 24; i++) {
    n[i] = (size_t)(2 + i % 5) * MiB + (size_t)i * 4096;
    p[i] = alloc_ok(pool, n[i], STREAM(1 + i % 2));
    pool_fill(p[i], n[i], (unsigned)(cycle + i));
  }
  for (int i = 0; i < 24; i++) {
    ck_assert(pool_filled(p[i], n[i], (unsigned)(cycle + i)));
    free_ok(pool, p[i], n[i], STREAM(1 + i % 2));
  }
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 64; i++) {
      n[i] = 1000 + (size_t)((i * 7919 + round * 104729) % (512 * 1024));
      p[i] = alloc_ok(pool, n[i], STREAM(1 + i % 2));
    }
    for (int i = 0; i < 64; i++) free_ok(pool, p[i], n[i], STREAM(1 + (i / 2) % 2));
  }
  for (int i = 0; i < 8; i++) {
    n[i] = (size_t)(9 + i) * MiB;
    p[i] = alloc_ok(pool, n[i], STREAM(2 - i % 2));
  }
  for (int i = 0; i < 8; i++) free_ok(pool, p[i], n[i], STREAM(2 - i % 2));
}

START_TEST(test_pool_phases_repeat_without_upstream_calls) {
  /* After the first cycle the pool has what the workload needs: later
   * cycles make no upstream call at all. */
  fixture_t f = make_fixture(NULL);
  phase_cycle(f.pool, 0);
  CHECK_POOL(f.pool);
  uint64_t allocs = spy_allocs(&f), frees = spy_frees(&f);
  uint64_t grows = field(f.pool, "grows"), shrinks = field(f.pool, "shrinks");
  for (int cycle = 1; cycle <= 4; cycle++) {
    phase_cycle(f.pool, cycle);
    CHECK_POOL(f.pool);
    ck_assert_msg(spy_allocs(&f) == allocs && spy_frees(&f) == frees,
                  "cycle %d: %llu upstream allocations, %llu frees after the first cycle", cycle,
                  (unsigned long long)(spy_allocs(&f) - allocs),
                  (unsigned long long)(spy_frees(&f) - frees));
    ck_assert_uint_eq(field(f.pool, "grows"), grows);
    ck_assert_uint_eq(field(f.pool, "shrinks"), shrinks);
  }
  ck_assert_uint_eq(field(f.pool, "device_syncs"), 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_repeated_request_grows_once) {
  /* The same request freed and made again, on one stream then alternating
   * between two: one growth per stream at most, never given back and taken
   * again. */
  for (int streams = 1; streams <= 2; streams++) {
    fixture_t f = make_fixture(NULL);
    for (int i = 0; i < 400; i++) {
      void *p = alloc_ok(f.pool, 3 * MiB, STREAM(1 + i % streams));
      free_ok(f.pool, p, 3 * MiB, STREAM(1 + i % streams));
    }
    /* Two streams: the first free comes before the second stream exists,
     * so no event covers it and the second stream's first request grows
     * (on a GPU nothing else is safe without a synchronization); from then
     * on every free is covered. */
    ck_assert_msg(spy_allocs(&f) == (uint64_t)streams && spy_frees(&f) == 0,
                  "%d stream(s): %llu upstream allocations and %llu frees for one request "
                  "repeated", streams, (unsigned long long)spy_allocs(&f),
                  (unsigned long long)spy_frees(&f));
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_pressure_gives_back_free_chunks) {
  /* The upstream has room for 20 MiB. The pool caches a free 8 MiB chunk
   * and 8 MiB in use; a 12 MiB request makes it give the cached chunk back
   * and succeed (the pool never reports out of memory while it caches
   * memory that would serve the request). */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 256 * KiB;
  o.small_max = 0;
  o.release_before_grow = false;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  spy_set_capacity(s, 20 * MiB);
  void *a = alloc_ok(f.pool, 8 * MiB, NULL);
  void *b = alloc_ok(f.pool, 8 * MiB, STREAM(2));
  free_ok(f.pool, b, 8 * MiB, STREAM(2));
  ck_assert_uint_eq(field(f.pool, "reserved"), 16 * MiB);
  void *c = alloc_ok(f.pool, 12 * MiB, NULL);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "reserved"), 20 * MiB);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 20 * MiB);
  ck_assert_uint_ge(spy_counts(s).allocate_failures, 1);
  ck_assert_uint_eq(field(f.pool, "shrinks"), 1);
  pool_fill(c, 12 * MiB, 3);
  ck_assert(pool_filled(c, 12 * MiB, 3));
  free_ok(f.pool, c, 12 * MiB, NULL);
  free_ok(f.pool, a, 8 * MiB, NULL);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_pressure_under_limiting_gives_back_cached_memory) {
  /* pool > limiting(limit=48MiB) > spy, chunks: every kind of cached
   * memory serves a request that needs it rather than out of memory:
   * stream heaps' idle spans, large blocks pending on another stream (not
   * covered: event_interval=1000), and wholly free chunks of another
   * shape. */
  rmmc_resource_t *spy = new_spy(), *lim, *pool;
  ck_assert_int_eq(rmmc_limiting_adaptor_create(spy, 48 * MiB, &lim), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 2 * MiB;
  o.event_interval = 1000;
  o.release_before_grow = false;
  o.cache_size = 16 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(lim, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(lim);
  /* Idle spans on stream 1 (the heap keeps up to 16 MiB). */
  void *b[16];
  for (int i = 0; i < 16; i++) b[i] = alloc_ok(pool, 1 * MiB, STREAM(1));
  for (int i = 0; i < 16; i++) free_ok(pool, b[i], 1 * MiB, STREAM(1));
  ck_assert_uint_eq(field(pool, "cached"), 16 * MiB);
  /* Large blocks freed on stream 2, not covered. */
  void *l[4];
  for (int i = 0; i < 4; i++) l[i] = alloc_ok(pool, 6 * MiB, STREAM(2));
  for (int i = 0; i < 4; i++) free_ok(pool, l[i], 6 * MiB, STREAM(2));
  ck_assert_uint_ge(field(pool, "pending"), 24 * MiB);
  ck_assert_uint_le(field(pool, "reserved"), 48 * MiB);
  /* Stream 3 needs 40 MiB in one block. */
  void *big = alloc_ok(pool, 40 * MiB, STREAM(3));
  pool_fill(big, 40 * MiB, 4);
  CHECK_POOL(pool);
  ck_assert_uint_le(field(pool, "reserved"), 48 * MiB);
  ck_assert_uint_le(rmmc_limiting_adaptor_get_used(lim), 48 * MiB);
  ck_assert(pool_filled(big, 40 * MiB, 4));
  free_ok(pool, big, 40 * MiB, STREAM(3));
  /* And back: 16 small blocks on stream 1 again. */
  for (int i = 0; i < 16; i++) b[i] = alloc_ok(pool, 1 * MiB, STREAM(1));
  for (int i = 0; i < 16; i++) free_ok(pool, b[i], 1 * MiB, STREAM(1));
  CHECK_POOL(pool);
  rmmc_resource_release(pool);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_pool_backs_off_when_upstream_refuses) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 64 * MiB;
  o.small_max = 0;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  spy_set_capacity(s, 40 * MiB);
  /* 64 MiB is refused; the pool halves to 32 MiB. */
  void *a = alloc_ok(f.pool, MiB, NULL), *d = (void *)1;
  spy_counts_t k = spy_counts(s);
  ck_assert_uint_eq(k.allocate_failures, 1);
  ck_assert_uint_eq(k.outstanding_bytes, 32 * MiB);
  ck_assert_uint_eq(field(f.pool, "reserved"), 32 * MiB);
  /* The rest of that chunk serves without the upstream. */
  void *b = alloc_ok(f.pool, 31 * MiB, NULL);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  /* 8 MiB left upstream: 64, 32 and 16 MiB are refused, 8 MiB taken. */
  void *c = alloc_ok(f.pool, 3 * MiB, NULL);
  k = spy_counts(s);
  ck_assert_uint_eq(k.allocate_failures, 4);
  ck_assert_uint_eq(k.outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  /* 5 MiB cached, nothing upstream: 6 MiB fails cleanly with the
   * upstream's reason. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 6 * MiB, 256, NULL, &d), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(d);
  ck_assert_msg(strstr(rmmc_last_error_message(), "spy failure injected") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  /* Freeing makes room: served from the cache. */
  free_ok(f.pool, b, 31 * MiB, NULL);
  d = alloc_ok(f.pool, 6 * MiB, NULL);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  free_ok(f.pool, a, MiB, NULL);
  free_ok(f.pool, c, 3 * MiB, NULL);
  free_ok(f.pool, d, 6 * MiB, NULL);
  drop_fixture(&f);
}
END_TEST

/* ---- the budget ---- */

START_TEST(test_pool_release_before_grow_gives_back_first) {
  /* With release_before_grow, a wholly free chunk that cannot serve a
   * larger request goes back before the pool grows; without, it stays. */
  for (int on = 0; on <= 1; on++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.release_before_grow = on;
    fixture_t f = make_fixture(&o);
    void *a = alloc_ok(f.pool, 10 * MiB, NULL);
    free_ok(f.pool, a, 10 * MiB, NULL);
    void *b = alloc_ok(f.pool, 12 * MiB, NULL);
    ck_assert_uint_eq(spy_bytes(&f), on ? 12 * MiB : 22 * MiB);
    ck_assert_uint_eq(field(f.pool, "shrinks"), on ? 1 : 0);
    ck_assert_uint_eq(field(f.pool, "grows"), 2);
    ck_assert_uint_eq(field(f.pool, "reserved_peak"), on ? 12 * MiB : 22 * MiB);
    CHECK_POOL(f.pool);
    free_ok(f.pool, b, 12 * MiB, NULL);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_release_slack_bounds_reserved_while_peak_grows) {
  /* A live 4 MiB block and three free 4 MiB chunks (peak 16 MiB), then a
   * 14 MiB request (peak 18 MiB): reserved stays within (1 + slack) x the
   * peak, giving back only the chunks the budget needs: all three at
   * slack 0.02, one at 0.5, none at 1. */
  static const double slack[] = {0.02, 0.5, 1.0};
  static const uint64_t shrinks[] = {3, 1, 0};
  for (int k = 0; k < 3; k++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.release_slack = slack[k];
    fixture_t f = make_fixture(&o);
    void *p[4];
    for (int i = 0; i < 4; i++) p[i] = alloc_ok(f.pool, 4 * MiB, NULL);
    for (int i = 1; i < 4; i++) free_ok(f.pool, p[i], 4 * MiB, NULL);
    ck_assert_uint_eq(field(f.pool, "reserved"), 16 * MiB);
    void *big = alloc_ok(f.pool, 14 * MiB, NULL);
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(field(f.pool, "shrinks"), shrinks[k]);
    ck_assert_uint_le(field(f.pool, "reserved"), (uint64_t)((1.0 + slack[k]) * 18 * MiB));
    ck_assert_uint_eq(field(f.pool, "reserved"), 30 * MiB - shrinks[k] * 4 * MiB);
    ck_assert_uint_eq(spy_bytes(&f), field(f.pool, "reserved"));
    free_ok(f.pool, big, 14 * MiB, NULL);
    free_ok(f.pool, p[0], 4 * MiB, NULL);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_budget_trims_before_it_grows) {
  /* The budget answers "trim to this goal" (rmmc__pool_admit) and the
   * chunk backend runs that trim before it asks the upstream: over an
   * upstream that holds 20 MiB, with 16 MiB reserved (three free 4 MiB
   * chunks) and a 14 MiB request, the three chunks go back first, so the
   * upstream never refuses (a growth before the trim would ask for 30). */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.min_growth = 2 * MiB;
  fixture_t f = make_fixture(&o);
  spy_set_capacity(spy_of(f.spy), 20 * MiB);
  void *p[4];
  for (int i = 0; i < 4; i++) p[i] = alloc_ok(f.pool, 4 * MiB, NULL);
  for (int i = 1; i < 4; i++) free_ok(f.pool, p[i], 4 * MiB, NULL);
  void *big = alloc_ok(f.pool, 14 * MiB, NULL);
  CHECK_POOL(f.pool);
  spy_counts_t c = spy_counts(spy_of(f.spy));
  ck_assert_uint_eq(c.allocate_failures, 0);
  ck_assert_uint_eq(c.deallocate_calls, 3);
  ck_assert_uint_eq(field(f.pool, "shrinks"), 3);
  ck_assert_uint_eq(field(f.pool, "reserved"), 18 * MiB);
  ck_assert_uint_eq(spy_bytes(&f), 18 * MiB);
  free_ok(f.pool, big, 14 * MiB, NULL);
  free_ok(f.pool, p[0], 4 * MiB, NULL);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_budget_follows_a_growing_peak) {
  /* Cold growth: each step allocates a larger block and frees the one
   * before (on two streams in turn). reserved stays within (1 + slack) x
   * the peak handed out, plus the rounding of the two live blocks' chunks to
   * the granularity (2 MiB each), at every step. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.min_growth = 2 * MiB;
  o.release_slack = 0.02;
  fixture_t f = make_fixture(&o);
  void *prev = NULL;
  size_t prev_n = 0;
  for (int step = 1; step <= 40; step++) {
    size_t n = (size_t)step * 700 * KiB + 4096;
    void *p = alloc_ok(f.pool, n, STREAM(1 + step % 2));
    if (prev != NULL) free_ok(f.pool, prev, prev_n, STREAM(1 + (step - 1) % 2));
    prev = p;
    prev_n = n;
    CHECK_POOL(f.pool);
    uint64_t peak = field(f.pool, "peak");
    ck_assert_msg(field(f.pool, "reserved") <= (uint64_t)(1.02 * (double)peak) + 4 * MiB,
                  "step %d: reserved %llu, peak %llu", step,
                  (unsigned long long)field(f.pool, "reserved"), (unsigned long long)peak);
  }
  ck_assert_uint_gt(field(f.pool, "shrinks"), 10);
  free_ok(f.pool, prev, prev_n, STREAM(1));
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_steady_state_keeps_its_memory) {
  /* Hysteresis: after a peak, smaller working sets (a dip) give nothing
   * back; the peak comes again with no upstream call. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.min_growth = 2 * MiB;
  fixture_t f = make_fixture(&o);
  void *p[8];
  for (int i = 0; i < 8; i++) p[i] = alloc_ok(f.pool, 4 * MiB, NULL);
  for (int i = 0; i < 8; i++) free_ok(f.pool, p[i], 4 * MiB, NULL);
  uint64_t allocs = spy_allocs(&f), reserved = field(f.pool, "reserved");
  for (int round = 0; round < 20; round++) {
    int k = 1 + round % 8;
    for (int i = 0; i < k; i++) p[i] = alloc_ok(f.pool, 4 * MiB, NULL);
    for (int i = 0; i < k; i++) free_ok(f.pool, p[i], 4 * MiB, NULL);
  }
  ck_assert_uint_eq(spy_allocs(&f), allocs);
  ck_assert_uint_eq(spy_frees(&f), 0);
  ck_assert_uint_eq(field(f.pool, "reserved"), reserved);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_gc_threshold_trims) {
  /* gc_threshold 0.5 of a 64 MiB maximum: growth beyond 32 MiB reserved
   * first gives back wholly free chunks (release_before_grow off, so only
   * the threshold does). */
  for (int gc = 0; gc <= 1; gc++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.maximum_size = 64 * MiB;
    o.gc_threshold = gc ? 0.5 : 0.0;
    o.release_before_grow = false;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    fixture_t f = make_fixture(&o);
    void *p[3];
    for (int i = 0; i < 3; i++) p[i] = alloc_ok(f.pool, 10 * MiB, NULL);
    ck_assert_uint_eq(field(f.pool, "reserved"), 30 * MiB);
    for (int i = 0; i < 3; i++) free_ok(f.pool, p[i], 10 * MiB, NULL);
    CHECK_POOL(f.pool);
    void *big = alloc_ok(f.pool, 12 * MiB, NULL);
    CHECK_POOL(f.pool);
    /* With GC: 30 + 12 > 32, so chunks go until 12 more fit under 32. */
    ck_assert_uint_eq(field(f.pool, "reserved"), gc ? 32 * MiB : 42 * MiB);
    ck_assert_uint_eq(spy_bytes(&f), gc ? 32 * MiB : 42 * MiB);
    ck_assert_uint_eq(field(f.pool, "shrinks"), gc ? 1 : 0);
    free_ok(f.pool, big, 12 * MiB, NULL);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_maximum_bounds_reserved_with_clean_oom) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = 8 * MiB;
  o.min_growth = 2 * MiB;
  o.small_max = 0;
  fixture_t f = make_fixture(&o);
  ck_assert_uint_eq(field(f.pool, "limit"), 8 * MiB);
  void *p[8];
  for (int i = 0; i < 8; i++) {
    p[i] = alloc_ok(f.pool, MiB, NULL);
    pool_fill(p[i], MiB, (unsigned)i);
    ck_assert_uint_le(field(f.pool, "reserved"), 8 * MiB);
    CHECK_POOL(f.pool);
  }
  ck_assert_uint_eq(field(f.pool, "reserved"), 8 * MiB);
  ck_assert_uint_eq(spy_bytes(&f), 8 * MiB);
  /* Past the maximum: out of memory with the figures in the message
   * (rmmc__pool_oom). */
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 1000000, 256, STREAM(7), &q),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "out of memory: pool resource could not allocate") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "(1000000 bytes)") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stream 0x107") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "pool reserved 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "handed out or lent 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "largest free block 0 B") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "maximum 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "maximum of 8.00 MiB is reached") != NULL, "%s", m);
  CHECK_POOL(f.pool);
  /* Larger than anything could ever hold. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, (size_t)1 << 60, 256, NULL, &q),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rmmc_last_error_message(), "larger than any pool can hold") != NULL, "%s",
                rmmc_last_error_message());
  CHECK_POOL(f.pool);
  /* Nothing was lost; a free makes room again, for another stream too. */
  for (int i = 0; i < 8; i++) ck_assert(pool_filled(p[i], MiB, (unsigned)i));
  free_ok(f.pool, p[3], MiB, NULL);
  q = alloc_ok(f.pool, 1000000, STREAM(7));
  ck_assert_ptr_eq(q, p[3]);
  ck_assert_uint_eq(field(f.pool, "reserved"), 8 * MiB);
  free_ok(f.pool, q, 1000000, STREAM(7));
  for (int i = 0; i < 8; i++)
    if (i != 3) free_ok(f.pool, p[i], MiB, NULL);
  drop_fixture(&f);
}
END_TEST

/* ---- split_limit ---- */

START_TEST(test_pool_split_limit_grows_rather_than_split) {
  /* A wholly free 64 MiB chunk is more than 8 x the 4 MiB a 4 MiB request
   * would grow: the pool grows a 4 MiB chunk instead of splitting it, and
   * the budget gives the big one back. split_limit=0 splits it; a 10 MiB
   * request (64 <= 80) splits it. */
  const size_t req[] = {4 * MiB, 4 * MiB, 10 * MiB};
  const double limit[] = {8.0, 0.0, 8.0};
  for (int k = 0; k < 3; k++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.split_limit = limit[k];
    fixture_t f = make_fixture(&o);
    void *a = alloc_ok(f.pool, 64 * MiB, NULL);
    free_ok(f.pool, a, 64 * MiB, NULL);
    void *b = alloc_ok(f.pool, req[k], NULL);
    CHECK_POOL(f.pool);
    bool grew = k == 0;
    ck_assert_uint_eq(field(f.pool, "grows"), grew ? 2 : 1);
    ck_assert_uint_eq(spy_allocs(&f), grew ? 2 : 1);
    if (!grew) ck_assert_ptr_eq(b, a);
    /* The header: "the pool grows instead, and the budget gives the big
     * chunk back if it is not needed". */
    ck_assert_msg(field(f.pool, "shrinks") == (grew ? 1u : 0u) &&
                      spy_bytes(&f) == (grew ? 4 * MiB : 64 * MiB),
                  "split_limit=%g, %zu bytes: %llu shrinks, %llu bytes reserved upstream for one "
                  "block", limit[k], req[k], (unsigned long long)field(f.pool, "shrinks"),
                  (unsigned long long)spy_bytes(&f));
    free_ok(f.pool, b, req[k], NULL);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_split_limit_yields_before_oom) {
  /* When the upstream refuses, the big free chunk is split after all
   * (release_before_grow off: it would give the chunk back first). */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.release_before_grow = false;
  o.small_max = 0;
  o.min_growth = 2 * MiB;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  void *a = alloc_ok(f.pool, 64 * MiB, NULL);
  free_ok(f.pool, a, 64 * MiB, NULL);
  spy_fail_every(s, 1);
  void *b = alloc_ok(f.pool, 4 * MiB, NULL);
  spy_fail_every(s, 0);
  CHECK_POOL(f.pool);
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(field(f.pool, "grows"), 1);
  ck_assert_uint_eq(field(f.pool, "shrinks"), 0);
  ck_assert_uint_eq(spy_bytes(&f), 64 * MiB);
  free_ok(f.pool, b, 4 * MiB, NULL);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_split_limit_1_serves_a_request_off_the_granularity) {
  /* Issue 11, F1: with split_limit=1, a request above min_growth that is
   * not a multiple of the growth granularity (39 MiB: the pool grows
   * 40 MiB) must be served by the chunk grown for it, with one upstream
   * call, and so must the same request made again: the chunk is never too
   * big for the request it was grown for. */
  static const size_t sizes[] = {39 * MiB, 33 * MiB + 1, 63 * MiB + 256, 100 * MiB + 5};
  static const double limits[] = {1.0, 1.01, 1.2};
  for (size_t l = 0; l < sizeof limits / sizeof limits[0]; l++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
      o.split_limit = limits[l];
      o.expandable = 0;
      fixture_t f = make_fixture(&o);
      for (int round = 0; round < 3; round++) {
        void *p = NULL;
        rmmc_status_t st = rmmc_resource_allocate(f.pool, sizes[i], 256, NULL, &p);
        ck_assert_msg(st == RMMC_SUCCESS, "split_limit=%g, %zu bytes: %s", limits[l], sizes[i],
                      rmmc_last_error_message());
        ck_assert_msg(spy_allocs(&f) == 1,
                      "split_limit=%g, %zu bytes, round %d: %llu upstream allocations",
                      limits[l], sizes[i], round, (unsigned long long)spy_allocs(&f));
        ck_assert_uint_eq(spy_bytes(&f), (sizes[i] + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
        pool_fill(p, sizes[i], 5);
        ck_assert(pool_filled(p, sizes[i], 5));
        free_ok(f.pool, p, sizes[i], NULL);
        CHECK_POOL(f.pool);
      }
      drop_fixture(&f);
    }
  }
  /* The issue's own case, through a spec (over host: virtual memory). */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(split_limit=1) > host", -1, &r), RMMC_SUCCESS);
  for (int round = 0; round < 3; round++) {
    void *p = NULL;
    ck_assert_msg(rmmc_resource_allocate(r, 39 * MiB, 256, NULL, &p) == RMMC_SUCCESS, "%s",
                  rmmc_last_error_message());
    pool_fill(p, 39 * MiB, 6);
    ck_assert(pool_filled(p, 39 * MiB, 6));
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 39 * MiB, 256, NULL), RMMC_SUCCESS);
  }
  ck_assert_uint_eq(field(r, "grows"), 1);
  CHECK_POOL(r);
  rmmc_resource_release(r);
}
END_TEST

/* ---- bad input ---- */

START_TEST(test_pool_bad_frees_lose_nothing) {
  fixture_t f = make_fixture(NULL);
  void *s1 = alloc_ok(f.pool, 3000, STREAM(1)), *s2 = alloc_ok(f.pool, 5000, STREAM(1));
  void *l1 = alloc_ok(f.pool, 5 * MiB, STREAM(1)), *l2 = alloc_ok(f.pool, 2 * MiB, STREAM(2));
  pool_fill(s1, 3000, 1);
  pool_fill(s2, 5000, 2);
  pool_fill(l1, 5 * MiB, 3);
  pool_fill(l2, 2 * MiB, 4);
  rmmc_pool_figures_t before = pool_figures(f.pool);
  int local;
  struct bad {
    void *p;
    size_t n;
    cudaStream_t s;
    const char *text;
  } bad[] = {
      {&local, 4, STREAM(1), "not allocated by this pool"},         /* never the pool's */
      {&local, 4 * MiB, STREAM(9), "not allocated by this pool"},   /* large, unseen stream */
      {(char *)s1 + 256, 256, STREAM(1), "not allocated by this pool"}, /* inside a small block */
      {(char *)s1 + 256, 256, STREAM(2), "not allocated by this pool"},
      {(char *)l1 + 4096, 4096, STREAM(1), "not allocated by this pool"}, /* inside a large one */
      {(char *)l1 + 2 * MiB, 2 * MiB, STREAM(2), "not allocated by this pool"},
      {s1, 2999, STREAM(1), "allocated with 3000 bytes, not 2999"}, /* wrong sizes */
      {s1, 3000 + 256, STREAM(2), "allocated with 3000 bytes, not 3256"},
      {s2, 2 * MiB, STREAM(1), "allocated with 5000 bytes, not 2097152"},
      {l1, 6 * MiB, STREAM(1), "allocated with 5242880 bytes, not 6291456"},
      {l1, 4096, STREAM(1), "allocated with 5242880 bytes, not 4096"},
      {l2, 2 * MiB - 1, STREAM(3), "allocated with 2097152 bytes, not 2097151"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, bad[i].p, bad[i].n, 256, bad[i].s),
                     RMMC_ERROR_UNKNOWN_POINTER);
    ck_assert_msg(strstr(rmmc_last_error_message(), bad[i].text) != NULL, "%zu: '%s' lacks '%s'",
                  i, rmmc_last_error_message(), bad[i].text);
    CHECK_POOL(f.pool);
  }
  /* Nothing changed. */
  rmmc_pool_figures_t after = pool_figures(f.pool);
  ck_assert_uint_eq(after.in_use, before.in_use);
  ck_assert_uint_eq(after.reserved, before.reserved);
  ck_assert_uint_eq(after.cached, before.cached);
  ck_assert(pool_filled(s1, 3000, 1) && pool_filled(s2, 5000, 2));
  ck_assert(pool_filled(l1, 5 * MiB, 3) && pool_filled(l2, 2 * MiB, 4));
  /* Double frees, small and large, on the same stream and another one. */
  free_ok(f.pool, s1, 3000, STREAM(1));
  free_ok(f.pool, s2, 5000, STREAM(2)); /* foreign */
  free_ok(f.pool, l1, 5 * MiB, STREAM(1));
  free_ok(f.pool, l2, 2 * MiB, STREAM(1));
  uint64_t in_use = field(f.pool, "in_use");
  ck_assert_uint_eq(in_use, 0);
  void *twice[] = {s1, s1, s2, s2, l1, l1, l2, l2};
  size_t tn[] = {3000, 3000, 5000, 5000, 5 * MiB, 5 * MiB, 2 * MiB, 2 * MiB};
  for (int i = 0; i < 8; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, twice[i], tn[i], 256, STREAM(1 + i % 2)),
                     RMMC_ERROR_UNKNOWN_POINTER);
    ck_assert_msg(strstr(rmmc_last_error_message(), "or was freed already") != NULL, "%s",
                  rmmc_last_error_message());
    CHECK_POOL(f.pool);
  }
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  /* The memory is whole: everything serves again and goes back. */
  void *again = alloc_ok(f.pool, 5 * MiB, STREAM(1));
  pool_fill(again, 5 * MiB, 7);
  ck_assert(pool_filled(again, 5 * MiB, 7));
  free_ok(f.pool, again, 5 * MiB, STREAM(1));
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_bytes(&f), 0);
  ck_assert_uint_eq(spy_counts(spy_of(f.spy)).deallocate_errors, 0);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_create_rejects_bad_options) {
  rmmc_resource_t *spy, *pool = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_create(NULL, NULL, &pool), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(pool);
  ck_assert_int_eq(rmmc_pool_resource_create(spy, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_pool_options_t o;
#define BAD(i, expr, text)                                                                     \
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;                                             \
  expr;                                                                                        \
  pool = (rmmc_resource_t *)1;                                                                 \
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_ERROR_INVALID_ARGUMENT);    \
  ck_assert_ptr_null(pool);                                                                    \
  ck_assert_msg(strstr(rmmc_last_error_message(), text) != NULL, "%d: %s", i,                  \
                rmmc_last_error_message())
  BAD(0, o.size = 4, "options size is 4");
  BAD(1, o.size = sizeof o + 8, "options size");
  BAD(2, o.growth_granularity = 3 * MiB, "growth_granularity");
  BAD(3, o.growth_granularity = 128, "growth_granularity");
  BAD(4, o.growth_granularity = (size_t)2 << 30, "growth_granularity");
  BAD(5, (o.small_max = 2 * MiB, o.small_chunk = MiB), "small_chunk");
  BAD(6, o.small_chunk = 1000, "small_chunk");
  BAD(7, o.small_chunk = 96 * KiB, "small_chunk");
  BAD(8, o.small_chunk = 32 * KiB, "small_chunk");
  BAD(9, o.small_chunk = (size_t)2 << 30, "small_chunk");
  BAD(10, o.small_chunk = 0, "small_chunk");
  BAD(11, o.gc_threshold = 1.5, "gc_threshold");
  BAD(12, o.gc_threshold = -0.1, "gc_threshold");
  BAD(13, o.event_interval = 0, "event_interval");
  BAD(14, (o.initial_size = 8 * MiB, o.maximum_size = 4 * MiB), "initial_size");
  BAD(15, o.min_growth = (size_t)1 << 60, "min_growth");
  BAD(16, o.initial_size = (size_t)1 << 60, "initial_size");
  BAD(17, o.release_slack = -0.5, "release_slack");
  BAD(18, o.split_limit = 0.5, "split_limit");
  BAD(19, o.split_limit = -1, "split_limit");
  BAD(20, o.expandable = 2, "expandable");
  BAD(21, o.expandable = -2, "expandable");
  BAD(22, o.stream_heaps = 1025, "stream_heaps");
  BAD(23, o.checkpoint_every = 1, "checkpoint_every");
  BAD(24, o.checkpoint_every = 24, "checkpoint_every");
  BAD(25, o.checkpoint_every = 131072, "checkpoint_every");
  BAD(26, o.release_band = -0.5, "release_band");
  BAD(27, o.release_band = 1001, "release_band");
  BAD(28, o.release_band = NAN, "release_band");
#undef BAD
  /* Virtual memory over an upstream without it. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  pool = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_null(pool);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "virtual memory"));
  /* Nothing was retained or allocated by the failures. */
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 0);
  /* The edges that are allowed. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = 64 * KiB;
  o.small_max = 64 * KiB;
  o.split_limit = 1.0;
  o.gc_threshold = 1.0;
  o.maximum_size = 0; /* no limit */
  o.release_slack = 0;
  o.cache_size = 0;
  o.checkpoint_every = 65536;
  o.release_band = 1000;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_SUCCESS);
  uint64_t unused;
  ck_assert(!rmmc_resource_get_field(pool, "limit", &unused));
  rmmc_resource_release(pool);
  o.small_chunk = (size_t)1 << 30;
  o.growth_granularity = (size_t)1 << 30;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(pool);
  /* An older, shorter options struct gets defaults for the rest. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.size = offsetof(rmmc_pool_options_t, maximum_size);
  o.initial_size = MiB;
  o.maximum_size = 12345; /* beyond the size given: ignored */
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_SUCCESS);
  ck_assert_uint_ge(field(pool, "reserved"), MiB);
  ck_assert(!rmmc_resource_get_field(pool, "limit", &unused));
  ck_assert_int_eq(rmmc_resource_refcount(spy), 2);
  rmmc_resource_release(pool);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  /* An initial size the upstream refuses: out of memory, nothing kept. */
  spy_set_capacity(spy_of(spy), MiB);
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 2 * MiB;
  pool = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(pool);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_pool_initial_size_reserves_what_it_asks) {
  /* initial=: "bytes reserved at creation": the initial chunk is the size
   * asked, rounded up to the growth granularity, not to min_growth (a
   * growth policy for later requests). */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 1 * MiB;
  fixture_t f = make_fixture(&o);
  ck_assert_uint_eq(spy_allocs(&f), 1);
  ck_assert_msg(field(f.pool, "reserved") == 2 * MiB,
                "initial=1MiB (granularity 2 MiB, min_growth 32 MiB) reserved %llu bytes",
                (unsigned long long)field(f.pool, "reserved"));
  drop_fixture(&f);
  rmmc_resource_t *r;
  ck_assert_int_eq(
      rmmc_stack_create("pool(initial=1MiB, min_growth=8MiB, granularity=1MiB) > host", -1, &r),
      RMMC_SUCCESS);
  ck_assert_msg(field(r, "reserved") == MiB, "initial=1MiB, granularity=1MiB: reserved %llu",
                (unsigned long long)field(r, "reserved"));
  rmmc_resource_release(r);
}
END_TEST

/* Issue 28: the defaults are no longer told by their values. min_growth=32MiB
 * over virtual memory used to read as unset (32 MiB was the _INIT value and
 * the chunks' default); now RMMC_POOL_MIN_GROWTH_DEFAULT is the default and
 * 32 MiB is 32 MiB. page= likewise: 0 takes the upstream's larger page, an
 * explicit 32 MiB is checked against it. */
static size_t reserved_after_3MiB(const char *spec) {
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_stack_create(spec, -1, &r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %s", spec, rmmc_last_error_message());
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  size_t reserved = (size_t)field(r, "reserved");
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  return reserved;
}

START_TEST(test_pool_explicit_defaults_are_taken_as_given) {
  /* Virtual memory (sim's 2 MiB pages): the shortfall, or min_growth. */
  ck_assert_uint_eq(reserved_after_3MiB("pool > sim"), 4 * MiB);
  ck_assert_uint_eq(reserved_after_3MiB("pool(min_growth=32MiB) > sim"), 32 * MiB);
  ck_assert_uint_eq(reserved_after_3MiB("pool(min_growth=8MiB) > sim"), 8 * MiB);
  /* Chunks: 32 MiB by default, or min_growth. */
  ck_assert_uint_eq(reserved_after_3MiB("pool(expandable=false) > sim"), 32 * MiB);
  ck_assert_uint_eq(reserved_after_3MiB("pool(expandable=false, min_growth=4MiB) > sim"), 4 * MiB);
  /* The C API: the _INIT value is the default; 32 MiB is taken as given. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  ck_assert(o.min_growth == RMMC_POOL_MIN_GROWTH_DEFAULT);
  ck_assert_uint_eq(o.page_size, 0);
  rmmc_resource_t *up = NULL, *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("sim", -1, &up), RMMC_SUCCESS);
  o.min_growth = 32 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(up, &o, &r), RMMC_SUCCESS);
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 32 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* Above 128 TiB is still refused; only the default's value passes. */
  o.min_growth = RMMC_POOL_MIN_GROWTH_DEFAULT - 1;
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_pool_resource_create(up, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "min_growth"));
  rmmc_resource_release(up);
  /* page=: the default follows an upstream page above 32 MiB; an explicit
   * 32 MiB that is no multiple of it is refused, saying so. */
  ck_assert_int_eq(rmmc_stack_create("pool > sim(alignment=64MiB)", -1, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("pool(page=32MiB) > sim(alignment=64MiB)", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "page_size") != NULL, "%s",
                rmmc_last_error_message());
}
END_TEST

START_TEST(test_pool_destroy_returns_everything_with_live_blocks) {
  /* Destroying a pool gives its chunks back even with blocks still out
   * (they are the caller's to stop using), large and small, on several
   * streams, with foreign frees pending and idle spans cached. */
  fixture_t f = make_fixture(NULL);
  (void)alloc_ok(f.pool, 3 * MiB, NULL);
  (void)alloc_ok(f.pool, 100, STREAM(3));
  void *x = alloc_ok(f.pool, 200, STREAM(4));
  free_ok(f.pool, x, 200, STREAM(5));
  for (int i = 0; i < 8; i++) free_ok(f.pool, alloc_ok(f.pool, MiB, STREAM(6)), MiB, STREAM(6));
  ck_assert_uint_gt(spy_counts(spy_of(f.spy)).outstanding, 0);
  drop_fixture(&f); /* asserts outstanding == 0 */
}
END_TEST

/* ---- spec ---- */

START_TEST(test_pool_spec_entry_takes_every_option) {
  rmmc_resource_t *r;
  rmmc_status_t st = rmmc_stack_create(
      "pool(initial=2MiB, max=64MiB, min_growth=2MiB, granularity=1MiB, small_max=64KiB, "
      "small_chunk=1MiB, cache=2MiB, gc_threshold=0.5, release_before_grow=false, "
      "release_slack=0.1, split_limit=4, event_interval=8, event_bytes=1MiB, expandable=false, "
      "page=4MiB, address_space=1GiB, stream_heaps=3) > host",
      -1, &r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  ck_assert_str_eq(rmmc_resource_name(r), "pool");
  ck_assert_str_eq(rmmc_resource_name(rmmc_resource_upstream(r)), "host");
  char backend[32] = "";
  ck_assert(pool_text(r, "backend", backend, sizeof backend));
  ck_assert_str_eq(backend, "chunks");
  ck_assert_uint_eq(field(r, "reserved"), 2 * MiB);
  ck_assert_uint_eq(field(r, "maximum_size"), 64 * MiB);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  pool_fill(p, 3 * MiB, 3);
  ck_assert(pool_filled(p, 3 * MiB, 3));
  /* 2 MiB initial + 3 MiB (granularity 1 MiB; release_before_grow=false:
   * the initial chunk stays). */
  ck_assert_uint_eq(field(r, "reserved"), 5 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  /* small_max=64KiB and small_chunk=1MiB: a 64 KiB block takes a 1 MiB span. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 64 * KiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "spans"), 1);
  ck_assert_uint_eq(field(r, "cached"), 1 * MiB - 64 * KiB);
  ck_assert_uint_eq(field(r, "heaps"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 64 * KiB, 256, NULL), RMMC_SUCCESS);
  CHECK_POOL(r);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool(stream_heaps=1025) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "stream_heaps=1025"));
  /* expandable=true over host: virtual memory. */
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=true, page=4MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert(pool_text(r, "backend", backend, sizeof backend));
  ck_assert_str_eq(backend, "virtual memory");
  rmmc_resource_release(r);
  /* A percentage of the host's memory. */
  ck_assert_int_eq(rmmc_stack_create("pool(max=50%) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_gt(field(r, "maximum_size"), 0);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool > host", -1, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* Typos and bad values, each named. */
  expect_spec_error("pool(inital=1MiB) > host", RMMC_ERROR_PARSE, "inital");
  expect_spec_error("pool(sync_before_grow=true) > host", RMMC_ERROR_PARSE, "sync_before_grow");
  expect_spec_error("pool(event_interval=0) > host", RMMC_ERROR_INVALID_ARGUMENT, "event_interval");
  expect_spec_error("pool(gc_threshold=2) > host", RMMC_ERROR_INVALID_ARGUMENT, "gc_threshold");
  expect_spec_error("pool(small_chunk=3MiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "small_chunk");
  expect_spec_error("pool(split_limit=0.5) > host", RMMC_ERROR_INVALID_ARGUMENT, "split_limit");
  expect_spec_error("pool(expandable=true) > statistics > host", RMMC_ERROR_NOT_SUPPORTED,
                    "virtual memory");
  ck_assert_int_eq(rmmc_stack_create("pool", -1, &r), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_validate("pool(initial=1GiB, max=80%) > host"), RMMC_SUCCESS);
  char help[8192];
  rmmc_stack_help(help, sizeof help);
  static const char *options[] = {"initial", "max", "min_growth", "granularity", "small_max",
                                  "small_chunk", "cache", "gc_threshold", "release_before_grow",
                                  "release_slack", "split_limit", "event_interval", "event_bytes",
                                  "expandable", "page", "address_space", "sync_before_peak",
                                  "checkpoint_every", "release_band"};
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    ck_assert_msg(strstr(help, options[i]) != NULL, "help lacks %s", options[i]);
  ck_assert_ptr_null(strstr(help, "sync_before_grow"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("pool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_pool_random_run_keeps_invariants);
  tcase_add_test(tc, test_pool_random_run_with_maximum_keeps_invariants);
  tcase_add_test(tc, test_pool_threads_keep_invariants);
  tcase_add_test(tc, test_pool_threads_on_one_stream_take_their_own_heaps);
  tcase_add_test(tc, test_pool_threads_made_anew_keep_the_streams_heap);
  tcase_add_test(tc, test_pool_many_live_blocks);
  tcase_add_test(tc, test_pool_alignments);
  tcase_add_test(tc, test_pool_release_cached_returns_everything);
  tcase_add_test(tc, test_pool_coalescing_restores_whole_regions);
  tcase_add_test(tc, test_pool_small_free_is_reused_at_once);
  tcase_add_test(tc, test_pool_foreign_free_returns_to_its_stream);
  tcase_add_test(tc, test_pool_foreign_free_beside_hot_block_merges);
  tcase_add_test(tc, test_pool_foreign_free_then_span_goes_back_whole);
  tcase_add_test(tc, test_pool_exited_thread_gives_back_its_spans);
  tcase_add_test(tc, test_pool_blocks_freed_by_other_streams_serve_under_pressure);
  tcase_add_test(tc, test_pool_idle_stream_spans_serve_others_before_growth);
  tcase_add_test(tc, test_pool_foreign_frees_keep_the_cache_bound);
  tcase_add_test(tc, test_pool_stream_heaps_stay_within_cache_bound);
  tcase_add_test(tc, test_pool_threads_on_one_stream_stay_within_cache_bound);
  tcase_add_test(tc, test_pool_check_while_streams_appear);
  tcase_add_test(tc, test_pool_freeing_stream_reuses_at_once);
  tcase_add_test(tc, test_pool_other_stream_reuses_once_covered);
  tcase_add_test(tc, test_pool_uncovered_free_waits_for_a_record);
  tcase_add_test(tc, test_pool_event_bytes_covers_large_frees);
  tcase_add_test(tc, test_pool_describes_every_figure);
  tcase_add_test(tc, test_pool_figures_reject_bad_arguments);
  tcase_add_test(tc, test_pool_phases_repeat_without_upstream_calls);
  tcase_add_test(tc, test_pool_repeated_request_grows_once);
  tcase_add_test(tc, test_pool_pressure_gives_back_free_chunks);
  tcase_add_test(tc, test_pool_pressure_under_limiting_gives_back_cached_memory);
  tcase_add_test(tc, test_pool_backs_off_when_upstream_refuses);
  tcase_add_test(tc, test_pool_release_before_grow_gives_back_first);
  tcase_add_test(tc, test_pool_release_slack_bounds_reserved_while_peak_grows);
  tcase_add_test(tc, test_pool_budget_trims_before_it_grows);
  tcase_add_test(tc, test_pool_budget_follows_a_growing_peak);
  tcase_add_test(tc, test_pool_steady_state_keeps_its_memory);
  tcase_add_test(tc, test_pool_gc_threshold_trims);
  tcase_add_test(tc, test_pool_maximum_bounds_reserved_with_clean_oom);
  tcase_add_test(tc, test_pool_split_limit_grows_rather_than_split);
  tcase_add_test(tc, test_pool_split_limit_yields_before_oom);
  tcase_add_test(tc, test_pool_split_limit_1_serves_a_request_off_the_granularity);
  tcase_add_test(tc, test_pool_bad_frees_lose_nothing);
  tcase_add_test(tc, test_pool_create_rejects_bad_options);
  tcase_add_test(tc, test_pool_initial_size_reserves_what_it_asks);
  tcase_add_test(tc, test_pool_explicit_defaults_are_taken_as_given);
  tcase_add_test(tc, test_pool_destroy_returns_everything_with_live_blocks);
  tcase_add_test(tc, test_pool_spec_entry_takes_every_option);
  suite_add_tcase(s, tc);
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  return rmmc_test_run(s, false);
}
