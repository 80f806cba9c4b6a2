/*
 * The pool resource over a host spy (no GPU): the conformance battery in
 * several configurations, every internal invariant after every step of long
 * random runs, coalescing, release_cached, growth, back-off, the maximum
 * and its out-of-memory message, per-stream reuse, the GC threshold,
 * threads, bad input, options and the spec entry. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)
#define STREAM(n) ((cudaStream_t)(uintptr_t)(n))

/* Every invariant holds, or the test fails with the pool's own message. */
#define CHECK_POOL(r)                                                          \
  do {                                                                         \
    rmmc_status_t check_st_ = rmmc_pool_resource_check(r);                     \
    ck_assert_msg(check_st_ == RMMC_SUCCESS, "%s", rmmc_last_error_message()); \
  } while (0)

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
  return rmmc_pool_resource_create(up, &o, out);
}

static rmmc_status_t make_unseparated(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.event_interval = 1;
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

static const conformance_case_t cases[] = {
    {"pool", make_default, 0},
    {"pool(initial=64KiB,min_growth=256KiB,small_max=16KiB)", make_growing, 0},
    {"pool(small_max=0,release_before_grow=false,event_interval=1)", make_unseparated, 0},
    {"pool(initial=64MiB,max=1GiB,gc_threshold=0.5)", make_initial, 0},
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

/* Releases the pool and checks that the spy got every byte back. */
static void drop_fixture(fixture_t *f) {
  spy_t *s = spy_of(f->spy);
  rmmc_resource_release(f->pool);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(f->spy);
}

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 97) b[i] = (unsigned char)(seed + i);
  b[n - 1] = (unsigned char)(seed * 7 + 1);
}

static bool filled(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 97) /* the last byte has its own value */
    if (b[i] != (unsigned char)(seed + i)) return false;
  return b[n - 1] == (unsigned char)(seed * 7 + 1);
}

typedef struct live {
  char *p;
  size_t n, align;
  unsigned seed;
  cudaStream_t stream;
} live_t;

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

/* A random run of `ops` steps over `nstreams` stream keys: sizes from 1 B
 * to `maxsize` (log-spread), alignments up to 64 KiB, frees on the
 * allocating stream or another, release_cached now and then. Checks data,
 * and every invariant after every step. Out of memory is allowed when the
 * pool has a maximum; then the pool must still be consistent. */
static void random_run(rmmc_resource_t *pool, unsigned seed, int ops, int maxlive, int nstreams,
                       size_t maxsize, bool oom_ok) {
  live_t *live = calloc((size_t)maxlive, sizeof *live);
  int n = 0;
  for (int op = 0; op < ops; op++) {
    unsigned r = next_rand(&seed);
    if (n < maxlive && (n == 0 || r % 5 < 3)) {
      unsigned shift = next_rand(&seed) % 24;
      size_t bytes = 1 + next_rand(&seed) % ((size_t)1 << shift);
      if (bytes > maxsize) bytes = maxsize;
      size_t align = (next_rand(&seed) % 8 == 0) ? (size_t)1 << (next_rand(&seed) % 17) : 256;
      cudaStream_t s = STREAM(1 + next_rand(&seed) % (unsigned)nstreams);
      void *p = NULL;
      rmmc_status_t st = rmmc_resource_allocate(pool, bytes, align, s, &p);
      if (st == RMMC_ERROR_OUT_OF_MEMORY && oom_ok) {
        ck_assert_ptr_null(p);
      } else {
        ck_assert_msg(st == RMMC_SUCCESS, "allocate %zu/%zu: %s", bytes, align,
                      rmmc_last_error_message());
        ck_assert_uint_eq((uintptr_t)p % (align < 256 ? 256 : align), 0);
        fill(p, bytes, r);
        live[n++] = (live_t){p, bytes, align, r, s};
      }
    } else if (n > 0) {
      int k = (int)(next_rand(&seed) % (unsigned)n);
      ck_assert_msg(filled(live[k].p, live[k].n, live[k].seed), "data of a live block changed");
      cudaStream_t s = r % 3 ? live[k].stream : STREAM(1 + next_rand(&seed) % (unsigned)nstreams);
      ck_assert_int_eq(rmmc_resource_deallocate(pool, live[k].p, live[k].n, live[k].align, s),
                       RMMC_SUCCESS);
      live[k] = live[--n];
    }
    if (r % 211 == 0) ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
    CHECK_POOL(pool);
  }
  for (int i = 0; i < n; i++) {
    ck_assert(filled(live[i].p, live[i].n, live[i].seed));
    ck_assert_int_eq(
        rmmc_resource_deallocate(pool, live[i].p, live[i].n, live[i].align, live[i].stream),
        RMMC_SUCCESS);
    CHECK_POOL(pool);
  }
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  free(live);
}

/* ---- invariants ---- */

START_TEST(test_pool_invariants_after_every_step) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fixture_t f = make_fixture(NULL);
  random_run(f.pool, 1u, 3000, 120, 3, 16 * MiB, false);
  drop_fixture(&f);

  /* Small chunks and slabs: lots of growth, slabs and trimming. */
  o.min_growth = 128 * KiB;
  o.growth_granularity = 64 * KiB;
  o.small_max = 8 * KiB;
  o.small_chunk = 64 * KiB;
  o.event_interval = 3;
  f = make_fixture(&o);
  random_run(f.pool, 2u, 3000, 200, 4, 2 * MiB, false);
  drop_fixture(&f);

  /* A maximum: out of memory happens and leaves the pool consistent. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = 24 * MiB;
  o.min_growth = 4 * MiB;
  o.release_before_grow = false;
  f = make_fixture(&o);
  random_run(f.pool, 3u, 3000, 100, 2, 8 * MiB, true);
  ck_assert_uint_le(field(f.pool, "reserved_peak"), 24 * MiB);
  drop_fixture(&f);

  /* One stream, no small/large separation, every free covered at once. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.event_interval = 1;
  f = make_fixture(&o);
  random_run(f.pool, 4u, 3000, 150, 1, 4 * MiB, false);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_many_live_blocks) {
  /* Enough live blocks to grow the pointer map many times. */
  fixture_t f = make_fixture(NULL);
  enum { N = 20000 };
  void **p = malloc(N * sizeof *p);
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 256 + (size_t)(i % 7) * 256, 256, NULL, &p[i]),
                     RMMC_SUCCESS);
    *(int *)p[i] = i;
  }
  CHECK_POOL(f.pool);
  for (int i = 0; i < N; i += 2) {
    ck_assert_int_eq(*(int *)p[i], i);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], 256 + (size_t)(i % 7) * 256, 256, NULL),
                     RMMC_SUCCESS);
  }
  CHECK_POOL(f.pool);
  for (int i = 1; i < N; i += 2) {
    ck_assert_int_eq(*(int *)p[i], i);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], 256 + (size_t)(i % 7) * 256, 256, NULL),
                     RMMC_SUCCESS);
  }
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  free(p);
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
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, n[i], 256, STREAM(i % 3), &p[i]), RMMC_SUCCESS);
  }
  ck_assert_uint_gt(spy_counts(s).outstanding, 1);
  /* Nothing is wholly free yet: release gives back nothing in use. */
  uint64_t reserved = field(f.pool, "reserved");
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f.pool, "in_use") <= field(f.pool, "reserved"), 1);
  ck_assert_uint_le(field(f.pool, "reserved"), reserved);
  for (int i = 0; i < 64; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], n[i], 256, STREAM(i % 5)), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  ck_assert_uint_gt(spy_counts(s).outstanding, 0); /* cached */
  uint64_t releases_before = spy_counts(s).release_calls;
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  /* Every byte went back, and the call was forwarded to the upstream. */
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.outstanding_bytes, 0);
  ck_assert_uint_eq(c.release_calls, releases_before + 1);
  ck_assert_uint_eq(field(f.pool, "reserved"), 0);
  ck_assert_uint_eq(field(f.pool, "chunks"), 0);
  ck_assert_uint_eq(field(f.pool, "slabs"), 0);
  ck_assert_uint_eq(field(f.pool, "free"), 0);
  ck_assert_uint_gt(field(f.pool, "reserved_peak"), 0);
  /* And it serves again. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 5000, 256, NULL, &p[0]), RMMC_SUCCESS);
  fill(p[0], 5000, 1);
  ck_assert(filled(p[0], 5000, 1));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[0], 5000, 256, NULL), RMMC_SUCCESS);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_coalescing_restores_whole_chunks) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 32 * MiB;
  o.small_max = 0; /* every block straight from the chunk */
  o.event_interval = 1000000;
  o.event_bytes = SIZE_MAX; /* frees stay fresh until the pool needs them merged */
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  uint64_t calls = spy_counts(s).allocate_calls;
  ck_assert_uint_eq(calls, 1);
  enum { N = 128 };
  void *p[N];
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 256 * KiB, 256, NULL, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f.pool, "free"), 0);
  /* Free in a scrambled order (odd strides), checking after every free. */
  for (int i = 0; i < N; i++) {
    int k = (i * 37) % N;
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[k], 256 * KiB, 256, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
  /* Everything merged but the last free (still fresh: the stream's hot
   * block), which merges as soon as it is covered. */
  ck_assert_uint_eq(field(f.pool, "free"), 32 * MiB);
  ck_assert_uint_ge(field(f.pool, "largest_free"), 16 * MiB);
  /* The whole chunk serves one request, at the chunk's start, with no
   * upstream call. */
  void *whole;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 32 * MiB, 256, NULL, &whole), RMMC_SUCCESS);
  ck_assert_ptr_eq(whole, p[0]);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, calls);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, whole, 32 * MiB, 256, NULL), RMMC_SUCCESS);

  /* Covered and untouched neighbours merge too: free every other block on
   * stream 1 with immediate covering, then the rest on stream 2. */
  o.event_interval = 1;
  o.event_bytes = 1;
  fixture_t g = make_fixture(&o);
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(rmmc_resource_allocate(g.pool, 256 * KiB, 256, STREAM(1), &p[i]), RMMC_SUCCESS);
  for (int i = 0; i < N; i += 2) {
    ck_assert_int_eq(rmmc_resource_deallocate(g.pool, p[i], 256 * KiB, 256, STREAM(1)), RMMC_SUCCESS);
    CHECK_POOL(g.pool);
  }
  for (int i = 1; i < N; i += 2) {
    ck_assert_int_eq(rmmc_resource_deallocate(g.pool, p[i], 256 * KiB, 256, STREAM(1)), RMMC_SUCCESS);
    CHECK_POOL(g.pool);
  }
  ck_assert_uint_eq(field(g.pool, "largest_free"), 32 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(g.pool, 32 * MiB, 256, STREAM(2), &whole), RMMC_SUCCESS);
  ck_assert_ptr_eq(whole, p[0]);
  ck_assert_uint_eq(field(g.pool, "chunks"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(g.pool, whole, 32 * MiB, 256, STREAM(2)), RMMC_SUCCESS);
  drop_fixture(&g);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_deferred_merge_happens_before_growth) {
  /* A fresh block next to covered ones stays apart (only its stream may
   * take it) until the pool would otherwise grow: then it is covered and
   * merged. In host mode a stream's last free stays fresh (its hot block)
   * and the one before is covered at once. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 8 * MiB;
  o.small_max = 0;
  o.event_interval = 1000;
  o.event_bytes = SIZE_MAX;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  void *p[8];
  for (int i = 0; i < 8; i++)
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, MiB, 256, NULL, &p[i]), RMMC_SUCCESS);
  static const int order[] = {0, 2, 4, 1};
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[order[i]], MiB, 256, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
  /* p[1] is fresh between covered p[0] and p[2]: not merged yet. */
  ck_assert_uint_eq(field(f.pool, "largest_free"), MiB);
  void *all;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 3 * MiB, 256, NULL, &all), RMMC_SUCCESS);
  ck_assert_ptr_eq(all, p[0]);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, all, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  for (int i = 3; i < 8; i++)
    if (i != 4) ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], MiB, 256, NULL), RMMC_SUCCESS);
  drop_fixture(&f);

  /* Blocks of three streams merge after the pool synchronizes them (host
   * mode: at no cost) rather than grow. */
  f = make_fixture(&o);
  s = spy_of(f.spy);
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4 * MiB, 256, STREAM(1), &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, STREAM(2), &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, NULL, &c), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 4 * MiB, 256, STREAM(1)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 2 * MiB, 256, STREAM(2)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, c, 2 * MiB, 256, NULL), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "largest_free"), 4 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 8 * MiB, 256, STREAM(3), &all), RMMC_SUCCESS);
  ck_assert_ptr_eq(all, a);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, all, 8 * MiB, 256, STREAM(3)), RMMC_SUCCESS);
  drop_fixture(&f);
}
END_TEST

/* ---- growth, maximum, back-off ---- */

START_TEST(test_pool_grows_to_max_then_clean_oom) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = 8 * MiB;
  o.min_growth = 2 * MiB;
  o.small_max = 0;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  ck_assert_uint_eq(field(f.pool, "limit"), 8 * MiB);
  void *p[8];
  for (int i = 0; i < 8; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, MiB, 256, NULL, &p[i]), RMMC_SUCCESS);
    fill(p[i], MiB, (unsigned)i);
    ck_assert_uint_le(field(f.pool, "reserved"), 8 * MiB);
    CHECK_POOL(f.pool);
  }
  ck_assert_uint_eq(field(f.pool, "reserved"), 8 * MiB);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 8 * MiB);
  /* Past the maximum: out of memory with the figures in the message. */
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 1000000, 256, STREAM(7), &q),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "1000000 bytes") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "pool reserved 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "in use 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "free 0 B") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "largest free block 0 B") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "maximum 8.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "maximum size is reached") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stream 0x7") != NULL, "%s", m);
  CHECK_POOL(f.pool);
  /* Larger than anything could ever hold. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, (size_t)1 << 60, 256, NULL, &q),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rmmc_last_error_message(), "larger than any pool") != NULL, "%s",
                rmmc_last_error_message());
  /* Nothing was lost; a free makes room again. */
  for (int i = 0; i < 8; i++) ck_assert(filled(p[i], MiB, (unsigned)i));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[3], MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 1000000, 256, STREAM(7), &q), RMMC_SUCCESS);
  ck_assert_ptr_eq(q, p[3]);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, q, 1000000, 256, STREAM(7)), RMMC_SUCCESS);
  for (int i = 0; i < 8; i++)
    if (i != 3) ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], MiB, 256, NULL), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_oom_releases_its_cache_and_retries) {
  /* The upstream has room for 16 MiB. The pool caches a free 8 MiB chunk
   * and 8 MiB in use; a 12 MiB request must make it give the cached chunk
   * back and then succeed. */
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 256 * KiB;
  o.small_max = 0;
  o.release_before_grow = false;
  fixture_t f = make_fixture(&o);
  spy_t *s = spy_of(f.spy);
  spy_set_capacity(s, 20 * MiB);
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 8 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 8 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 8 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f.pool, "reserved"), 16 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 12 * MiB, 256, NULL, &c), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "reserved"), 20 * MiB);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 20 * MiB);
  ck_assert_uint_ge(spy_counts(s).allocate_failures, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, c, 12 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 8 * MiB, 256, NULL), RMMC_SUCCESS);
  drop_fixture(&f);
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
  void *a, *b, *c, *d = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, MiB, 256, NULL, &a), RMMC_SUCCESS);
  spy_counts_t k = spy_counts(s);
  ck_assert_uint_eq(k.allocate_failures, 1);
  ck_assert_uint_eq(k.outstanding_bytes, 32 * MiB);
  ck_assert_uint_eq(field(f.pool, "reserved"), 32 * MiB);
  /* The rest of that chunk serves without the upstream. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 31 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  /* 8 MiB left upstream: 64, 32 and 16 MiB are refused, 8 MiB taken. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 3 * MiB, 256, NULL, &c), RMMC_SUCCESS);
  k = spy_counts(s);
  ck_assert_uint_eq(k.allocate_failures, 4);
  ck_assert_uint_eq(k.outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  /* 5 MiB cached, nothing upstream: 6 MiB backs off down to its own size,
   * is refused, and fails cleanly with the upstream's reason. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 6 * MiB, 256, NULL, &d), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(d);
  ck_assert_msg(strstr(rmmc_last_error_message(), "spy failure injected") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  /* Freeing makes room: served from the cache. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 31 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 6 * MiB, 256, NULL, &d), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 40 * MiB);
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, c, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, d, 6 * MiB, 256, NULL), RMMC_SUCCESS);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_release_before_grow) {
  /* With release_before_grow, a wholly free chunk that cannot serve a
   * request goes back before the pool grows; without, it stays. */
  for (int on = 0; on <= 1; on++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.release_before_grow = on;
    fixture_t f = make_fixture(&o);
    spy_t *s = spy_of(f.spy);
    void *a, *b;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 10 * MiB, 256, NULL, &a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 10 * MiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 12 * MiB, 256, NULL, &b), RMMC_SUCCESS);
    ck_assert_uint_eq(spy_counts(s).outstanding_bytes, on ? 12 * MiB : 22 * MiB);
    ck_assert_uint_eq(field(f.pool, "chunk_releases"), on ? 1 : 0);
    ck_assert_uint_eq(field(f.pool, "reserved_peak"), on ? 12 * MiB : 22 * MiB);
    CHECK_POOL(f.pool);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 12 * MiB, 256, NULL), RMMC_SUCCESS);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_release_slack_budget) {
  /* A growth within (1 + release_slack) x the peak in use releases
   * nothing; past it, only as many wholly free chunks go back as the
   * budget needs (the old policy released them all). */
  for (int wide = 0; wide <= 1; wide++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.release_slack = wide ? 1.0 : 0.05;
    fixture_t f = make_fixture(&o);
    spy_t *s = spy_of(f.spy);
    void *p[3], *big;
    for (int i = 0; i < 3; i++)
      ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4 * MiB, 256, NULL, &p[i]), RMMC_SUCCESS);
    for (int i = 0; i < 3; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], 4 * MiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_uint_eq(field(f.pool, "chunk_allocations"), 3);
    /* Peak 12 MiB; 12 reserved + 6 more: within 24 (slack 1), above 12.6
     * (slack 0.05): two 4 MiB chunks go, the third stays. */
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 6 * MiB, 256, NULL, &big), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(field(f.pool, "chunk_allocations"), 4);
    ck_assert_uint_eq(field(f.pool, "chunk_releases"), wide ? 0 : 2);
    ck_assert_uint_eq(field(f.pool, "reserved"), wide ? 18 * MiB : 10 * MiB);
    ck_assert_uint_eq(spy_counts(s).outstanding_bytes, wide ? 18 * MiB : 10 * MiB);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, big, 6 * MiB, 256, NULL), RMMC_SUCCESS);
    drop_fixture(&f);
  }
}
END_TEST

START_TEST(test_pool_split_limit) {
  /* A wholly free 64 MiB chunk is more than 8 x a 4 MiB request: the pool
   * grows a 4 MiB chunk and gives the big one back instead of splitting
   * it. split_limit=0 splits it; a 10 MiB request (64 <= 80) splits it. */
  const size_t req[] = {4 * MiB, 4 * MiB, 10 * MiB};
  const double limit[] = {8.0, 0.0, 8.0};
  for (int k = 0; k < 3; k++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    o.split_limit = limit[k];
    fixture_t f = make_fixture(&o);
    spy_t *s = spy_of(f.spy);
    void *a, *b;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 64 * MiB, 256, NULL, &a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 64 * MiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, req[k], 256, NULL, &b), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
    bool grew = k == 0;
    ck_assert_uint_eq(field(f.pool, "chunk_allocations"), grew ? 2 : 1);
    ck_assert_uint_eq(field(f.pool, "chunk_releases"), grew ? 1 : 0);
    ck_assert_uint_eq(spy_counts(s).outstanding_bytes, grew ? 4 * MiB : 64 * MiB);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, req[k], 256, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
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
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 64 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 64 * MiB, 256, NULL), RMMC_SUCCESS);
  spy_fail_every(s, 1);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  spy_fail_every(s, 0);
  CHECK_POOL(f.pool);
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(field(f.pool, "chunk_allocations"), 1);
  ck_assert_uint_eq(field(f.pool, "chunk_releases"), 0);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 64 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 4 * MiB, 256, NULL), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_split_limit_never_refuses_its_new_chunk) {
  /* Issue 11, F1: with split_limit=1 a request above min_growth that is not
   * a multiple of the growth granularity (39 MiB: the pool grows 40 MiB)
   * was refused: the new chunk was more than 1 x the request. The chunk a
   * pool grows for a request must serve it, with one upstream call. */
  static const size_t sizes[] = {39 * MiB, 33 * MiB + 1, 63 * MiB + 256, 100 * MiB + 5};
  static const double limits[] = {1.0, 1.01, 1.2};
  for (size_t l = 0; l < sizeof limits / sizeof limits[0]; l++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
      o.split_limit = limits[l];
      fixture_t f = make_fixture(&o);
      void *p = NULL;
      rmmc_status_t st = rmmc_resource_allocate(f.pool, sizes[i], 256, NULL, &p);
      ck_assert_msg(st == RMMC_SUCCESS, "split_limit=%g, %zu bytes: %s", limits[l], sizes[i],
                    rmmc_last_error_message());
      ck_assert_uint_eq(field(f.pool, "chunk_allocations"), 1);
      ck_assert_uint_eq(spy_counts(spy_of(f.spy)).allocate_calls, 1);
      ck_assert_uint_eq(spy_counts(spy_of(f.spy)).outstanding_bytes,
                        (sizes[i] + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
      fill(p, sizes[i], 5);
      ck_assert(filled(p, sizes[i], 5));
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, sizes[i], 256, NULL), RMMC_SUCCESS);
      CHECK_POOL(f.pool);
      drop_fixture(&f);
    }
  }
  /* The issue's own case, through a spec. */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(split_limit=1) > host", -1, &r), RMMC_SUCCESS);
  void *p = NULL;
  ck_assert_msg(rmmc_resource_allocate(r, 39 * MiB, 256, NULL, &p) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 39 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_pool_gc_threshold_trims) {
  /* gc_threshold 0.5 of a 64 MiB maximum: growth beyond 32 MiB reserved
   * first gives back wholly free chunks. */
  for (int gc = 0; gc <= 1; gc++) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.maximum_size = 64 * MiB;
    o.gc_threshold = gc ? 0.5 : 0.0;
    o.release_before_grow = false;
    o.small_max = 0;
    o.min_growth = 2 * MiB;
    fixture_t f = make_fixture(&o);
    spy_t *s = spy_of(f.spy);
    void *p[3];
    for (int i = 0; i < 3; i++)
      ck_assert_int_eq(rmmc_resource_allocate(f.pool, 10 * MiB, 256, NULL, &p[i]), RMMC_SUCCESS);
    ck_assert_uint_eq(field(f.pool, "reserved"), 30 * MiB);
    for (int i = 0; i < 3; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], 10 * MiB, 256, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
    void *big;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 12 * MiB, 256, NULL, &big), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
    /* With GC: 30 + 12 > 32, so chunks go until 12 more fit under 32. */
    ck_assert_uint_eq(field(f.pool, "reserved"), gc ? 32 * MiB : 42 * MiB);
    ck_assert_uint_eq(spy_counts(s).outstanding_bytes, gc ? 32 * MiB : 42 * MiB);
    ck_assert_uint_eq(field(f.pool, "chunk_releases"), gc ? 1 : 0);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, big, 12 * MiB, 256, NULL), RMMC_SUCCESS);
    drop_fixture(&f);
  }
}
END_TEST

/* ---- streams ---- */

START_TEST(test_pool_reuse_prefers_the_freeing_stream) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 16 * MiB;
  o.small_max = 0;
  fixture_t f = make_fixture(&o);
  void *a1, *a2, *b1, *x;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, STREAM(0xA), &a1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, STREAM(0xA), &a2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a1, 2 * MiB, 256, STREAM(0xA)), RMMC_SUCCESS);
  /* Stream B asks first: it gets untouched memory, not A's block. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, STREAM(0xB), &b1), RMMC_SUCCESS);
  ck_assert_ptr_ne(b1, a1);
  /* A gets its own block back. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, STREAM(0xA), &x), RMMC_SUCCESS);
  ck_assert_ptr_eq(x, a1);
  CHECK_POOL(f.pool);
  /* Free A's blocks; per-stream figures show them. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, x, 2 * MiB, 256, STREAM(0xA)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a2, 2 * MiB, 256, STREAM(0xA)), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  /* When only A's memory is left, B reclaims it rather than growing. */
  spy_t *s = spy_of(f.spy);
  uint64_t calls = spy_counts(s).allocate_calls;
  void *rest;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 10 * MiB, 256, STREAM(0xC), &rest), RMMC_SUCCESS);
  void *b2;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4 * MiB, 256, STREAM(0xB), &b2), RMMC_SUCCESS);
  ck_assert_ptr_eq(b2, a1);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, calls);
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b2, 4 * MiB, 256, STREAM(0xB)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b1, 2 * MiB, 256, STREAM(0xB)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, rest, 10 * MiB, 256, STREAM(0xC)), RMMC_SUCCESS);
  /* No CUDA call in host mode: no events, no synchronization. */
  ck_assert_uint_eq(field(f.pool, "event_records"), 0);
  ck_assert_uint_eq(field(f.pool, "event_waits"), 0);
  ck_assert_uint_eq(field(f.pool, "device_syncs"), 0);
  drop_fixture(&f);
}
END_TEST

typedef struct stream_texts {
  int n;
  char text[8][128];
} stream_texts_t;

static void collect_streams(void *ctx, const rmmc_field_t *fl) {
  stream_texts_t *t = ctx;
  if (fl->kind == RMMC_FIELD_TEXT && strcmp(fl->key, "free_on_stream") == 0 && t->n < 8)
    snprintf(t->text[t->n++], sizeof t->text[0], "%s", fl->text);
}

/* Free and fresh bytes the pool reports for stream key `s` (false if none). */
static bool stream_free(rmmc_resource_t *pool, uintptr_t s, size_t *free_b, size_t *fresh_b) {
  stream_texts_t t = {0};
  rmmc_resource_describe(pool, collect_streams, &t);
  char want[32];
  snprintf(want, sizeof want, "stream=%p ", (void *)s);
  for (int i = 0; i < t.n; i++) {
    if (strncmp(t.text[i], want, strlen(want)) != 0) continue;
    ck_assert_int_eq(sscanf(t.text[i] + strlen(want), "free=%zu fresh=%zu", free_b, fresh_b), 2);
    return true;
  }
  return false;
}

START_TEST(test_pool_describe_figures) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 16 * MiB;
  o.small_max = 0;
  o.event_interval = 3;
  fixture_t f = make_fixture(&o);
  ck_assert_uint_eq(field(f.pool, "reserved"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "free"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "free_unowned"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  ck_assert_uint_eq(field(f.pool, "chunks"), 1);
  ck_assert_uint_eq(field(f.pool, "largest_free"), 16 * MiB);
  uint64_t unused;
  ck_assert(!rmmc_resource_get_field(f.pool, "limit", &unused));
  void *p[6];
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 1000 * (size_t)(i + 1), 256, STREAM(0x50), &p[i]),
                     RMMC_SUCCESS);
  uint64_t in_use = field(f.pool, "in_use");
  ck_assert_uint_eq(in_use, (4 + 8 + 12 + 16 + 20 + 24) * 256); /* rounded to 256 */
  ck_assert_uint_eq(field(f.pool, "peak"), in_use);
  ck_assert_uint_eq(field(f.pool, "free") + in_use, 16 * MiB);
  size_t fb, fr;
  ck_assert(!stream_free(f.pool, 0x50, &fb, &fr));
  /* Two non-adjacent frees: the last one is fresh (only stream 0x50 may
   * take it); in host mode the one before is covered at once. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[1], 2000, 256, STREAM(0x50)), RMMC_SUCCESS);
  ck_assert(stream_free(f.pool, 0x50, &fb, &fr));
  ck_assert_uint_eq(fb, 8 * 256);
  ck_assert_uint_eq(fr, 8 * 256);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[3], 4000, 256, STREAM(0x50)), RMMC_SUCCESS);
  ck_assert(stream_free(f.pool, 0x50, &fb, &fr));
  ck_assert_uint_eq(fb, 8 * 256 + 16 * 256);
  ck_assert_uint_eq(fr, 16 * 256);
  /* The last block touches the untouched rest of the chunk; it merges with
   * it once covered. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[5], 6000, 256, STREAM(0x50)), RMMC_SUCCESS);
  ck_assert(stream_free(f.pool, 0x50, &fb, &fr));
  ck_assert_uint_eq(fr, 24 * 256);
  ck_assert_uint_eq(fb, (8 + 16 + 24) * 256);
  ck_assert_uint_eq(fb + field(f.pool, "free_unowned") + field(f.pool, "in_use"), 16 * MiB);
  ck_assert_uint_eq(field(f.pool, "peak"), in_use);
  CHECK_POOL(f.pool);
  for (int i = 0; i < 6; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], 1000 * (size_t)(i + 1), 256, STREAM(0x50)),
                     RMMC_SUCCESS);
  drop_fixture(&f);
}
END_TEST

/* ---- threads ---- */

typedef struct thread_arg {
  rmmc_resource_t *pool;
  unsigned seed;
  int failures;
} thread_arg_t;

static void *thread_main(void *arg) {
  thread_arg_t *t = arg;
  enum { LIVE = 64 };
  live_t live[LIVE];
  int n = 0;
  unsigned seed = t->seed;
  for (int op = 0; op < 20000; op++) {
    unsigned r = next_rand(&seed);
    if (n < LIVE && (n == 0 || r % 2)) {
      size_t bytes = 1 + next_rand(&seed) % ((size_t)1 << (next_rand(&seed) % 22));
      /* Half the threads share stream keys 1 and 2; each has its own too. */
      cudaStream_t s = STREAM(r % 3 == 0 ? 100 + t->seed % 1000 : 1 + r % 2);
      void *p;
      if (rmmc_resource_allocate(t->pool, bytes, 256, s, &p) != RMMC_SUCCESS) {
        t->failures++;
        continue;
      }
      fill(p, bytes, r);
      live[n++] = (live_t){p, bytes, 256, r, s};
    } else {
      int k = (int)(next_rand(&seed) % (unsigned)n);
      if (!filled(live[k].p, live[k].n, live[k].seed)) t->failures++;
      if (rmmc_resource_deallocate(t->pool, live[k].p, live[k].n, 256, live[k].stream) != RMMC_SUCCESS)
        t->failures++;
      live[k] = live[--n];
    }
    if (op % 5000 == 4999 && rmmc_resource_release_cached(t->pool) != RMMC_SUCCESS) t->failures++;
  }
  for (int i = 0; i < n; i++) {
    if (!filled(live[i].p, live[i].n, live[i].seed)) t->failures++;
    if (rmmc_resource_deallocate(t->pool, live[i].p, live[i].n, 256, live[i].stream) != RMMC_SUCCESS)
      t->failures++;
  }
  return NULL;
}

START_TEST(test_pool_many_threads) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 4 * MiB;
  o.event_interval = 8;
  fixture_t f = make_fixture(&o);
  enum { T = 16 };
  pthread_t th[T];
  thread_arg_t args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (thread_arg_t){f.pool, 17u + (unsigned)i * 7919u, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(args[i].failures, 0);
  }
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(f.spy)).outstanding, 0);
  drop_fixture(&f);
}
END_TEST

/* ---- bad input ---- */

START_TEST(test_pool_bad_pointers_lose_nothing) {
  fixture_t f = make_fixture(NULL);
  void *p, *q;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 3000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 5 * MiB, 256, NULL, &q), RMMC_SUCCESS);
  fill(p, 3000, 5);
  uint64_t in_use = field(f.pool, "in_use"), reserved = field(f.pool, "reserved");
  /* A pointer the pool never handed out, and one inside a block. */
  int local;
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, &local, 4, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "not allocated by this pool") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, (char *)p + 256, 256, 256, NULL),
                   RMMC_ERROR_UNKNOWN_POINTER);
  /* The right pointer with the wrong size. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, 2999, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "3000 bytes, not 2999") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, q, 6 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  /* Nothing changed. */
  ck_assert_uint_eq(field(f.pool, "in_use"), in_use);
  ck_assert_uint_eq(field(f.pool, "reserved"), reserved);
  ck_assert(filled(p, 3000, 5));
  CHECK_POOL(f.pool);
  /* The right free works; a second one is refused. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, 3000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, 3000, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "freed already") != NULL, "%s",
                rmmc_last_error_message());
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, q, 5 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, q, 5 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  CHECK_POOL(f.pool);
  /* The upstream never saw a bad free. */
  ck_assert_uint_eq(spy_counts(spy_of(f.spy)).deallocate_errors, 0);
  /* check() refuses what is not a pool. */
  ck_assert_int_eq(rmmc_pool_resource_check(f.spy), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resource_check(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  drop_fixture(&f);
}
END_TEST

START_TEST(test_pool_alignments) {
  fixture_t f = make_fixture(NULL);
  void *p[18];
  for (int i = 0; i < 18; i++) {
    size_t align = (size_t)1 << (i + 5); /* 32 B .. 4 MiB */
    size_t bytes = 1000 + (size_t)i * 777;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, bytes, align, STREAM(i % 2), &p[i]), RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p[i] % (align < 256 ? 256 : align), 0);
    fill(p[i], bytes, (unsigned)i);
    CHECK_POOL(f.pool);
  }
  for (int i = 0; i < 18; i++) {
    size_t bytes = 1000 + (size_t)i * 777;
    ck_assert(filled(p[i], bytes, (unsigned)i));
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], bytes, (size_t)1 << (i + 5), STREAM(i % 2)),
                     RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
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
#define BAD(i, expr, text)                                                     \
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;                             \
  expr;                                                                        \
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_ERROR_INVALID_ARGUMENT); \
  ck_assert_ptr_null(pool);                                                    \
  ck_assert_msg(strstr(rmmc_last_error_message(), text) != NULL, "%d: %s", i,  \
                rmmc_last_error_message())
  BAD(0, o.size = 4, "options size is 4");
  BAD(1, o.size = sizeof o + 8, "options size");
  BAD(2, o.growth_granularity = 3 * MiB, "growth_granularity");
  BAD(3, o.growth_granularity = 128, "growth_granularity");
  BAD(4, (o.small_max = 2 * MiB, o.small_chunk = MiB), "small_chunk");
  BAD(5, o.small_chunk = 1000, "small_chunk");
  BAD(6, o.gc_threshold = 1.5, "gc_threshold");
  BAD(7, o.gc_threshold = -0.1, "gc_threshold");
  BAD(8, o.event_interval = 0, "event_interval");
  BAD(9, (o.initial_size = 8 * MiB, o.maximum_size = 4 * MiB), "initial_size");
  BAD(10, o.min_growth = (size_t)1 << 60, "min_growth");
  BAD(11, o.release_slack = -0.5, "release_slack");
  BAD(12, o.split_limit = 0.5, "split_limit");
#undef BAD
  /* Nothing was retained by the failures. */
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 0);
  /* An older, shorter options struct gets defaults for the rest. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.size = offsetof(rmmc_pool_options_t, maximum_size);
  o.initial_size = MiB;
  o.maximum_size = 12345; /* beyond the size given: ignored */
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "reserved"), MiB);
  uint64_t unused;
  ck_assert(!rmmc_resource_get_field(pool, "limit", &unused));
  ck_assert_int_eq(rmmc_resource_refcount(spy), 2);
  rmmc_resource_release(pool);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  /* An initial size the upstream refuses: out of memory, nothing kept. */
  spy_set_capacity(spy_of(spy), MiB);
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 2 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &pool), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(pool);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_pool_destroy_returns_chunks_in_use) {
  /* Destroying a pool gives its chunks back even with blocks still out
   * (they are the caller's to stop using). */
  fixture_t f = make_fixture(NULL);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 100, 256, STREAM(3), &p), RMMC_SUCCESS);
  ck_assert_uint_gt(spy_counts(spy_of(f.spy)).outstanding, 0);
  drop_fixture(&f); /* asserts outstanding == 0 */
}
END_TEST

/* ---- spec ---- */

START_TEST(test_pool_spec_entry) {
  rmmc_resource_t *r;
  rmmc_status_t st = rmmc_stack_create(
      "pool(initial=1MiB, max=64MiB, min_growth=2MiB, granularity=1MiB, small_max=64KiB, "
      "small_chunk=1MiB, gc_threshold=0.5, release_before_grow=false, event_interval=8, "
      "event_bytes=1MiB, sync_before_grow=true) > host",
      -1, &r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  ck_assert_str_eq(rmmc_resource_name(r), "pool");
  ck_assert_str_eq(rmmc_resource_name(rmmc_resource_upstream(r)), "host");
  ck_assert_uint_eq(field(r, "reserved"), MiB);
  ck_assert_uint_eq(field(r, "limit"), 64 * MiB);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  fill(p, 3 * MiB, 3);
  ck_assert(filled(p, 3 * MiB, 3));
  ck_assert_uint_eq(field(r, "reserved"), 4 * MiB); /* 1 MiB initial + 3 MiB (granularity 1 MiB) */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  CHECK_POOL(r);
  rmmc_resource_release(r);
  /* A percentage of the host's memory. */
  ck_assert_int_eq(rmmc_stack_create("pool(max=50%) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_gt(field(r, "limit"), 0);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool > host", -1, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* Typos and bad values. */
  ck_assert_int_eq(rmmc_stack_create("pool(inital=1MiB) > host", -1, &r), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_create("pool(event_interval=0) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stack_create("pool(gc_threshold=2) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stack_create("pool", -1, &r), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_validate("pool(initial=1GiB, max=80%) > host"), RMMC_SUCCESS);
  char help[4096];
  rmmc_stack_help(help, sizeof help);
  ck_assert_ptr_nonnull(strstr(help, "pool"));
  ck_assert_ptr_nonnull(strstr(help, "release_before_grow"));
  ck_assert_ptr_nonnull(strstr(help, "sync_before_grow"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("pool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_pool_invariants_after_every_step);
  tcase_add_test(tc, test_pool_many_live_blocks);
  tcase_add_test(tc, test_pool_release_cached_returns_everything);
  tcase_add_test(tc, test_pool_coalescing_restores_whole_chunks);
  tcase_add_test(tc, test_pool_deferred_merge_happens_before_growth);
  tcase_add_test(tc, test_pool_grows_to_max_then_clean_oom);
  tcase_add_test(tc, test_pool_oom_releases_its_cache_and_retries);
  tcase_add_test(tc, test_pool_backs_off_when_upstream_refuses);
  tcase_add_test(tc, test_pool_release_before_grow);
  tcase_add_test(tc, test_pool_release_slack_budget);
  tcase_add_test(tc, test_pool_split_limit);
  tcase_add_test(tc, test_pool_split_limit_yields_before_oom);
  tcase_add_test(tc, test_pool_split_limit_never_refuses_its_new_chunk);
  tcase_add_test(tc, test_pool_gc_threshold_trims);
  tcase_add_test(tc, test_pool_reuse_prefers_the_freeing_stream);
  tcase_add_test(tc, test_pool_describe_figures);
  tcase_add_test(tc, test_pool_many_threads);
  tcase_add_test(tc, test_pool_bad_pointers_lose_nothing);
  tcase_add_test(tc, test_pool_alignments);
  tcase_add_test(tc, test_pool_create_rejects_bad_options);
  tcase_add_test(tc, test_pool_destroy_returns_chunks_in_use);
  tcase_add_test(tc, test_pool_spec_entry);
  suite_add_tcase(s, tc);
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  return rmmc_test_run(s, false);
}
