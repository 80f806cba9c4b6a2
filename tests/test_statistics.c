/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The statistics adaptor over a host spy: conformance, figures, push/pop
 * nesting with RMM's merge rule checked number by number, exact totals and
 * peaks under many threads (more than it has per-thread shards, and
 * threads that come and go), push/pop racing with allocations, the
 * size-first struct, failures not counted, spec. Host suite.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static rmmc_status_t make_statistics(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  return rmmc_statistics_adaptor_create(upstream, out);
}

static const conformance_case_t cases[] = {{"statistics", make_statistics, 0}};

typedef struct fixture {
  rmmc_resource_t *spy, *r;
  spy_t *s;
} fixture_t;

static fixture_t setup(void) {
  fixture_t f;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f.spy), RMMC_SUCCESS);
  f.s = spy_of(f.spy);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(f.spy, &f.r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(f.r), "statistics");
  return f;
}

static void teardown(fixture_t *f) {
  uint64_t before = spy_destroyed_total();
  rmmc_resource_release(f->r);
  ck_assert_uint_eq(spy_counts(f->s).outstanding, 0);
  rmmc_resource_release(f->spy);
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
}

/* Checks every field of the innermost scope's figures. */
#define EXPECT(r, cb, pb, tb, cc, pc, tc, d)                                                       \
  do {                                                                                             \
    rmmc_statistics_t st_ = RMMC_STATISTICS_INIT;                                                  \
    ck_assert_int_eq(rmmc_statistics_adaptor_get((r), &st_), RMMC_SUCCESS);                        \
    expect_figures(&st_, cb, pb, tb, cc, pc, tc, d, __LINE__);                                     \
  } while (0)

static void expect_figures(const rmmc_statistics_t *s, int64_t cb, int64_t pb, uint64_t tb,
                           int64_t cc, int64_t pc, uint64_t tc, uint64_t d, int line) {
  ck_assert_msg(s->current_bytes == cb && s->peak_bytes == pb && s->total_bytes == tb &&
                    s->current_count == cc && s->peak_count == pc && s->total_count == tc &&
                    s->deallocations == d,
                "line %d: got bytes %lld/%lld/%llu counts %lld/%lld/%llu deallocs %llu, want "
                "%lld/%lld/%llu %lld/%lld/%llu %llu",
                line, (long long)s->current_bytes, (long long)s->peak_bytes,
                (unsigned long long)s->total_bytes, (long long)s->current_count,
                (long long)s->peak_count, (unsigned long long)s->total_count,
                (unsigned long long)s->deallocations, (long long)cb, (long long)pb,
                (unsigned long long)tb, (long long)cc, (long long)pc, (unsigned long long)tc,
                (unsigned long long)d);
}

static void *alloc(rmmc_resource_t *r, size_t n) {
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, NULL, &p), RMMC_SUCCESS);
  return p;
}

static void dealloc(rmmc_resource_t *r, void *p, size_t n) {
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, n, 256, NULL), RMMC_SUCCESS);
}

START_TEST(test_statistics_figures) {
  fixture_t f = setup();
  EXPECT(f.r, 0, 0, 0, 0, 0, 0, 0);
  void *a = alloc(f.r, 100), *b = alloc(f.r, 200), *c = alloc(f.r, 300);
  EXPECT(f.r, 600, 600, 600, 3, 3, 3, 0);
  dealloc(f.r, b, 200);
  EXPECT(f.r, 400, 600, 600, 2, 3, 3, 1);
  void *d = alloc(f.r, 1000);
  EXPECT(f.r, 1400, 1400, 1600, 3, 3, 4, 1);
  dealloc(f.r, a, 100);
  dealloc(f.r, c, 300);
  dealloc(f.r, d, 1000);
  EXPECT(f.r, 0, 1400, 1600, 0, 3, 4, 4);
  /* A failed allocation and a refused free count nothing. */
  spy_fail_nth(f.s, 1);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 5000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  int local;
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, &local, 64, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  EXPECT(f.r, 0, 1400, 1600, 0, 3, 4, 4);
  /* describe gives the whole adaptor's figures. */
  uint64_t v;
  ck_assert(rmmc_resource_get_field(f.r, "peak", &v));
  ck_assert_uint_eq(v, 1400);
  ck_assert(rmmc_resource_get_field(f.r, "total", &v));
  ck_assert_uint_eq(v, 1600);
  ck_assert(rmmc_resource_get_field(f.r, "allocations", &v));
  ck_assert_uint_eq(v, 4);
  ck_assert(rmmc_resource_get_field(f.r, "deallocations", &v));
  ck_assert_uint_eq(v, 4);
  teardown(&f);
}
END_TEST

START_TEST(test_statistics_push_pop_nesting) {
  fixture_t f = setup();
  void *A = alloc(f.r, 100);
  EXPECT(f.r, 100, 100, 100, 1, 1, 1, 0);
  ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 1);
  EXPECT(f.r, 0, 0, 0, 0, 0, 0, 0); /* a fresh scope */
  void *B = alloc(f.r, 500), *C = alloc(f.r, 300);
  EXPECT(f.r, 800, 800, 800, 2, 2, 2, 0);
  dealloc(f.r, B, 500);
  EXPECT(f.r, 300, 800, 800, 1, 2, 2, 1);
  dealloc(f.r, A, 100); /* allocated before the scope: its current goes down */
  EXPECT(f.r, 200, 800, 800, 0, 2, 2, 2);
  ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 2);
  void *D = alloc(f.r, 50);
  EXPECT(f.r, 50, 50, 50, 1, 1, 1, 0);
  rmmc_statistics_t popped = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &popped), RMMC_SUCCESS);
  expect_figures(&popped, 50, 50, 50, 1, 1, 1, 0, __LINE__);
  /* Merged into depth 1: current 200+50, peak max(800, 200+50), totals added. */
  EXPECT(f.r, 250, 800, 850, 1, 2, 3, 2);
  dealloc(f.r, C, 300);
  EXPECT(f.r, -50, 800, 850, 0, 2, 3, 3); /* below zero, as in RMM */
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &popped), RMMC_SUCCESS);
  expect_figures(&popped, -50, 800, 850, 0, 2, 3, 3, __LINE__);
  /* Merged into the outermost scope (100, 100, 100 / 1, 1, 1 before the
   * push): current 100-50, peak max(100, 100+800), total 100+850; counts
   * 1+0, max(1, 1+2), 1+3. The timeline's real peak was A+B+C = 900. */
  EXPECT(f.r, 50, 900, 950, 1, 3, 4, 3);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  /* The outermost scope cannot be popped. */
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &popped), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_msg(strstr(rmmc_last_error_message(), "no scope was pushed") != NULL, "%s",
                rmmc_last_error_message());
  EXPECT(f.r, 50, 900, 950, 1, 3, 4, 3);
  /* Pop without a place to put the figures still merges. */
  ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
  void *E = alloc(f.r, 2000);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, NULL), RMMC_SUCCESS);
  EXPECT(f.r, 2050, 2050, 2950, 2, 3, 5, 3);
  dealloc(f.r, D, 50);
  dealloc(f.r, E, 2000);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(f.r, "in_use", &v));
  ck_assert_uint_eq(v, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_statistics_deep_scopes_and_describe_folds) {
  fixture_t f = setup();
  enum { DEPTH = 40 };
  void *p[DEPTH];
  /* Each scope allocates i+1 KiB: scopes grow the frame stack past its
   * first allocation. */
  for (int i = 0; i < DEPTH; i++) {
    ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
    p[i] = alloc(f.r, (size_t)(i + 1) << 10);
  }
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), DEPTH);
  uint64_t total = (uint64_t)DEPTH * (DEPTH + 1) / 2 << 10, v;
  /* describe folds every scope in without popping. */
  ck_assert(rmmc_resource_get_field(f.r, "in_use", &v));
  ck_assert_uint_eq(v, total);
  ck_assert(rmmc_resource_get_field(f.r, "peak", &v));
  ck_assert_uint_eq(v, total);
  ck_assert(rmmc_resource_get_field(f.r, "scopes", &v));
  ck_assert_uint_eq(v, DEPTH);
  for (int i = DEPTH - 1; i >= 0; i--) {
    dealloc(f.r, p[i], (size_t)(i + 1) << 10);
    rmmc_statistics_t s = RMMC_STATISTICS_INIT;
    ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &s), RMMC_SUCCESS);
    /* Scope i saw its own block and everything pushed inside it. */
    uint64_t inside = ((uint64_t)DEPTH * (DEPTH + 1) / 2 - (uint64_t)i * (i + 1) / 2) << 10;
    ck_assert_int_eq(s.current_bytes, 0);
    ck_assert_uint_eq(s.total_bytes, inside);
    ck_assert_int_eq(s.peak_bytes, (int64_t)inside);
    ck_assert_uint_eq(s.total_count, (uint64_t)(DEPTH - i));
  }
  EXPECT(f.r, 0, (int64_t)total, total, 0, DEPTH, DEPTH, DEPTH);
  teardown(&f);
}
END_TEST

/* Checks every field of open scope `id`'s figures. */
#define EXPECT_SCOPE(r, id, cb, pb, tb, cc, pc, tc, d)                                             \
  do {                                                                                             \
    rmmc_statistics_t st_ = RMMC_STATISTICS_INIT;                                                  \
    ck_assert_int_eq(rmmc_statistics_adaptor_get_scope((r), (id), &st_), RMMC_SUCCESS);            \
    expect_figures(&st_, cb, pb, tb, cc, pc, tc, d, __LINE__);                                     \
  } while (0)

#define POP_SCOPE(r, id, cb, pb, tb, cc, pc, tc, d)                                                \
  do {                                                                                             \
    rmmc_statistics_t st_ = RMMC_STATISTICS_INIT;                                                  \
    ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope((r), (id), &st_), RMMC_SUCCESS);            \
    expect_figures(&st_, cb, pb, tb, cc, pc, tc, d, __LINE__);                                     \
  } while (0)

/* Scopes of threads whose blocks overlap without nesting: each ends by id
 * wherever it is, counts everything from its push to its pop (the peaks of
 * the scopes pushed after it included), and the ones above keep counting. */
START_TEST(test_statistics_scopes_end_in_any_order) {
  fixture_t f = setup();
  uint64_t A, B;
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &A), RMMC_SUCCESS);
  void *a1 = alloc(f.r, 100);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &B), RMMC_SUCCESS);
  ck_assert_uint_ne(A, 0);
  ck_assert_uint_ne(A, B);
  void *b1 = alloc(f.r, 50);
  EXPECT_SCOPE(f.r, A, 150, 150, 150, 2, 2, 2, 0);
  EXPECT_SCOPE(f.r, B, 50, 50, 50, 1, 1, 1, 0);
  POP_SCOPE(f.r, A, 150, 150, 150, 2, 2, 2, 0); /* the outer one ends first */
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 1);
  EXPECT(f.r, 50, 50, 50, 1, 1, 1, 0); /* B is the innermost, unchanged */
  void *b2 = alloc(f.r, 25);
  dealloc(f.r, a1, 100);
  /* B from its push (at 100 bytes, 1 block): 175 at most, 75 now. */
  POP_SCOPE(f.r, B, -25, 75, 75, 1, 2, 2, 1);
  EXPECT(f.r, 75, 175, 175, 2, 3, 3, 1);
  dealloc(f.r, b1, 50);
  dealloc(f.r, b2, 25);

  /* Three open, the middle one ends; the others still see every segment. */
  uint64_t P, Q, R;
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &P), RMMC_SUCCESS);
  void *x = alloc(f.r, 1000);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &Q), RMMC_SUCCESS);
  void *y = alloc(f.r, 500);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &R), RMMC_SUCCESS);
  dealloc(f.r, y, 500);
  void *z = alloc(f.r, 2000);
  dealloc(f.r, z, 2000);
  POP_SCOPE(f.r, Q, 0, 2000, 2500, 0, 1, 2, 2);
  EXPECT_SCOPE(f.r, P, 1000, 3000, 3500, 1, 2, 3, 2);
  void *w = alloc(f.r, 100);
  POP_SCOPE(f.r, R, -400, 1500, 2100, 0, 0, 2, 2);
  POP_SCOPE(f.r, P, 1100, 3000, 3600, 2, 2, 4, 2);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  dealloc(f.r, x, 1000);
  dealloc(f.r, w, 100);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(f.r, "peak", &v));
  ck_assert_uint_eq(v, 3000);

  /* pop() ends the innermost scope whatever its id; that id is gone then. */
  uint64_t S, T;
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &S), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &T), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, T, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, S, NULL), RMMC_SUCCESS);
  teardown(&f);
}
END_TEST

START_TEST(test_statistics_scope_bad_ids) {
  fixture_t f = setup();
  uint64_t A;
  rmmc_statistics_t s = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.spy, &A), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  ck_assert_int_eq(rmmc_statistics_adaptor_push_scope(f.r, &A), RMMC_SUCCESS);
  /* 0 is the outermost scope's, which never ends; other ids were never given. */
  uint64_t bad[] = {0, A + 1, UINT64_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, bad[i], &s),
                     RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(rmmc_last_error_message(), "no open scope") != NULL, "%s",
                  rmmc_last_error_message());
    ck_assert_int_eq(rmmc_statistics_adaptor_get_scope(f.r, bad[i], &s),
                     RMMC_ERROR_INVALID_ARGUMENT);
  }
  ck_assert_int_eq(rmmc_statistics_adaptor_get_scope(f.r, A, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_scope(f.spy, A, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.spy, A, &s), RMMC_ERROR_INVALID_ARGUMENT);
  s.size = 0;
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, A, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 1); /* nothing changed */
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, A, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop_scope(f.r, A, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  teardown(&f);
}
END_TEST

START_TEST(test_statistics_struct_size_and_bad_arguments) {
  fixture_t f = setup();
  void *a = alloc(f.r, 4096);
  /* An older, shorter struct gets only the fields it has. */
  rmmc_statistics_t s;
  memset(&s, 0x77, sizeof s);
  s.size = offsetof(rmmc_statistics_t, total_bytes);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.r, &s), RMMC_SUCCESS);
  ck_assert_int_eq(s.current_bytes, 4096);
  ck_assert_int_eq(s.peak_bytes, 4096);
  uint64_t untouched;
  memset(&untouched, 0x77, sizeof untouched);
  ck_assert_uint_eq(s.total_bytes, untouched);
  ck_assert_uint_eq(s.deallocations, untouched);
  s.size = sizeof(size_t);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.r, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "RMMC_STATISTICS_INIT") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.r, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.spy, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "not a statistics") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_statistics_adaptor_push(f.spy), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_push(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.spy), -1);
  /* pop with a too-small struct changes nothing. */
  ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
  s.size = 0;
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 1);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, NULL), RMMC_SUCCESS);
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_statistics_adaptor_create(NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  dealloc(f.r, a, 4096);
  teardown(&f);
}
END_TEST

/* ---- many threads ---- */

enum { THREADS = 8, BLOCKS = 50, ROUNDS = 40 };

typedef struct worker {
  rmmc_resource_t *r;
  pthread_barrier_t *barrier;
  unsigned id;
  int keep; /* blocks left allocated at the end */
} worker_t;

static size_t block_size(unsigned id, int i) { return 1 + (size_t)(id * 7919u + (unsigned)i * 104729u) % 5000; }

/* Every round each thread allocates its BLOCKS blocks, meets the others at
 * the barrier (so all blocks of all threads are held at once) and frees
 * them; in the last round it keeps `keep` of them. */
static void *stats_worker(void *arg) {
  worker_t *w = arg;
  void *p[BLOCKS];
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < BLOCKS; i++)
      if (rmmc_resource_allocate(w->r, block_size(w->id, i), 256, NULL, &p[i]) != RMMC_SUCCESS)
        return (void *)1;
    pthread_barrier_wait(w->barrier);
    int keep = round == ROUNDS - 1 ? w->keep : 0;
    for (int i = keep; i < BLOCKS; i++)
      if (rmmc_resource_deallocate(w->r, p[i], block_size(w->id, i), 256, NULL) != RMMC_SUCCESS)
        return (void *)1;
    pthread_barrier_wait(w->barrier);
  }
  for (int i = 0; i < w->keep; i++)
    if (rmmc_resource_deallocate(w->r, p[i], block_size(w->id, i), 256, NULL) != RMMC_SUCCESS)
      return (void *)1;
  return NULL;
}

START_TEST(test_statistics_exact_under_threads) {
  fixture_t f = setup();
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t th[THREADS];
  worker_t w[THREADS];
  uint64_t round_bytes = 0;
  for (unsigned t = 0; t < THREADS; t++)
    for (int i = 0; i < BLOCKS; i++) round_bytes += block_size(t, i);
  /* Thread t keeps t blocks through its last barrier, freeing them after. */
  for (unsigned t = 0; t < THREADS; t++) {
    w[t] = (worker_t){f.r, &barrier, t, (int)t};
    ck_assert_int_eq(pthread_create(&th[t], NULL, stats_worker, &w[t]), 0);
  }
  for (unsigned t = 0; t < THREADS; t++) {
    void *ret;
    pthread_join(th[t], &ret);
    ck_assert_ptr_null(ret);
  }
  pthread_barrier_destroy(&barrier);
  uint64_t n = (uint64_t)THREADS * BLOCKS * ROUNDS;
  /* All blocks of a round were held at once, and no moment held more. */
  EXPECT(f.r, 0, (int64_t)round_bytes, round_bytes * ROUNDS, 0, THREADS * BLOCKS, n, n);
  teardown(&f);
}
END_TEST

/* Runs n stats_workers (ids first .. first + n - 1, none keeping a block)
 * on r at once and returns the bytes they all hold in each round. */
static uint64_t run_wave(rmmc_resource_t *r, unsigned first, unsigned n) {
  enum { MAX_WAVE = 80 };
  ck_assert_uint_le(n, MAX_WAVE);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, n);
  pthread_t th[MAX_WAVE];
  worker_t w[MAX_WAVE];
  uint64_t round_bytes = 0;
  for (unsigned t = 0; t < n; t++) {
    for (int i = 0; i < BLOCKS; i++) round_bytes += block_size(first + t, i);
    w[t] = (worker_t){r, &barrier, first + t, 0};
    ck_assert_int_eq(pthread_create(&th[t], NULL, stats_worker, &w[t]), 0);
  }
  for (unsigned t = 0; t < n; t++) {
    void *ret;
    pthread_join(th[t], &ret);
    ck_assert_ptr_null(ret);
  }
  pthread_barrier_destroy(&barrier);
  return round_bytes;
}

/* More live threads than the adaptor keeps per-thread totals for (64):
 * the others share one set, and every figure stays exact. */
START_TEST(test_statistics_exact_beyond_thread_shards) {
  fixture_t f = setup();
  enum { MANY = 72 };
  uint64_t round_bytes = run_wave(f.r, 0, MANY);
  uint64_t n = (uint64_t)MANY * BLOCKS * ROUNDS;
  EXPECT(f.r, 0, (int64_t)round_bytes, round_bytes * ROUNDS, 0, MANY * BLOCKS, n, n);
  teardown(&f);
}
END_TEST

/* Threads come and go in waves, alternating between two adaptors: each
 * exiting thread's totals stay counted after a later thread takes over its
 * slot, in the right adaptor. */
START_TEST(test_statistics_threads_come_and_go) {
  fixture_t f = setup();
  rmmc_resource_t *other;
  ck_assert_int_eq(rmmc_statistics_adaptor_create(f.spy, &other), RMMC_SUCCESS);
  enum { WAVES = 6, WAVE = 20 };
  uint64_t peak[2] = {0, 0}, total[2] = {0, 0}, n[2] = {0, 0};
  for (unsigned k = 0; k < WAVES; k++) {
    uint64_t round_bytes = run_wave(k % 2 ? other : f.r, k * WAVE, WAVE);
    peak[k % 2] = round_bytes > peak[k % 2] ? round_bytes : peak[k % 2];
    total[k % 2] += round_bytes * ROUNDS;
    n[k % 2] += (uint64_t)WAVE * BLOCKS * ROUNDS;
  }
  EXPECT(f.r, 0, (int64_t)peak[0], total[0], 0, WAVE * BLOCKS, n[0], n[0]);
  EXPECT(other, 0, (int64_t)peak[1], total[1], 0, WAVE * BLOCKS, n[1], n[1]);
  rmmc_resource_release(other);
  teardown(&f);
}
END_TEST

typedef struct churn {
  rmmc_resource_t *r;
  volatile int *stop;
  uint64_t allocations;
  uint64_t bytes;
} churn_t;

static void *churn_worker(void *arg) {
  churn_t *c = arg;
  unsigned seed = (unsigned)(uintptr_t)c;
  while (!__atomic_load_n(c->stop, __ATOMIC_RELAXED) || c->allocations < 1000) {
    seed = seed * 1103515245u + 12345u;
    size_t n = 1 + (seed >> 8) % 3000;
    void *p;
    if (rmmc_resource_allocate(c->r, n, 256, NULL, &p) != RMMC_SUCCESS) return (void *)1;
    c->allocations++;
    c->bytes += n;
    if (rmmc_resource_deallocate(c->r, p, n, 256, NULL) != RMMC_SUCCESS) return (void *)1;
  }
  return NULL;
}

/* Scopes pushed and popped while other threads allocate: whatever scope a
 * racing call lands in, after everything is popped the outermost figures
 * hold every call exactly once. */
START_TEST(test_statistics_push_pop_racing_allocations) {
  fixture_t f = setup();
  volatile int stop = 0;
  enum { T = 4 };
  pthread_t th[T];
  churn_t c[T];
  for (int i = 0; i < T; i++) {
    c[i] = (churn_t){f.r, &stop, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, churn_worker, &c[i]), 0);
  }
  uint64_t scope_total = 0;
  for (int k = 0; k < 3000; k++) {
    ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
    if (k % 3 == 0) ck_assert_int_eq(rmmc_statistics_adaptor_push(f.r), RMMC_SUCCESS);
    rmmc_statistics_t s = RMMC_STATISTICS_INIT;
    if (k % 3 == 0) ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_statistics_adaptor_pop(f.r, &s), RMMC_SUCCESS);
    /* Each scope's figures stay within what is possible: every block is at
     * most 3000 bytes and at most T are outstanding at once. */
    ck_assert_int_ge(s.peak_bytes, 0);
    ck_assert_int_le(s.peak_bytes, (int64_t)T * 3000 * 2);
    ck_assert_int_le(s.current_bytes, (int64_t)T * 3000);
    ck_assert_int_ge(s.current_bytes, -(int64_t)T * 3000);
    scope_total += s.total_count;
  }
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  uint64_t n = 0, bytes = 0;
  for (int i = 0; i < T; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    ck_assert_ptr_null(ret);
    n += c[i].allocations;
    bytes += c[i].bytes;
  }
  ck_assert_uint_le(scope_total, n);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  rmmc_statistics_t s = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.r, &s), RMMC_SUCCESS);
  ck_assert_int_eq(s.current_bytes, 0);
  ck_assert_int_eq(s.current_count, 0);
  ck_assert_uint_eq(s.total_count, n);
  ck_assert_uint_eq(s.total_bytes, bytes);
  ck_assert_uint_eq(s.deallocations, n);
  ck_assert_int_ge(s.peak_count, 1);
  ck_assert_int_le(s.peak_count, T);
  ck_assert_int_le(s.peak_bytes, (int64_t)T * 3000);
  teardown(&f);
}
END_TEST

/* 16 threads, each with scopes of its own that end in whatever order the
 * threads run: every scope counts at least its own thread's blocks, never
 * more than all of them, and nothing is lost in the adaptor's figures
 * (with push/pop the pops of one thread would end another's scope). */
typedef struct scoper {
  rmmc_resource_t *r;
  pthread_barrier_t *barrier;
  unsigned id;
  int bad;
} scoper_t;

static void *scope_worker(void *arg) {
  scoper_t *w = arg;
  for (int round = 0; round < 200; round++) {
    uint64_t id;
    if (rmmc_statistics_adaptor_push_scope(w->r, &id) != RMMC_SUCCESS) return (void *)1;
    void *p[4];
    size_t n = 256 * (w->id + 1);
    for (int i = 0; i < 4; i++)
      if (rmmc_resource_allocate(w->r, n, 256, NULL, &p[i]) != RMMC_SUCCESS) return (void *)1;
    if (round % 50 == 0) pthread_barrier_wait(w->barrier); /* all scopes open at once */
    for (int i = 0; i < 4; i++)
      if (rmmc_resource_deallocate(w->r, p[i], n, 256, NULL) != RMMC_SUCCESS) return (void *)1;
    rmmc_statistics_t s = RMMC_STATISTICS_INIT;
    if (rmmc_statistics_adaptor_pop_scope(w->r, id, &s) != RMMC_SUCCESS) return (void *)1;
    /* Other threads' frees may take the current figures below the base,
     * so a scope's peak is only known to be >= 0 (its figures at push);
     * their calls under way at the push or pop may land on either side
     * (the header's rule), so only the totals bound it from below. */
    if (s.total_count < 4 || s.total_bytes < 4 * n || s.peak_bytes < 0 || s.peak_count < 0 ||
        s.total_count > 16 * 4 * 200)
      w->bad++;
  }
  return NULL;
}

START_TEST(test_statistics_scopes_from_threads) {
  fixture_t f = setup();
  enum { T = 16 };
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, T);
  pthread_t th[T];
  scoper_t w[T];
  for (unsigned i = 0; i < T; i++) {
    w[i] = (scoper_t){f.r, &barrier, i, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, scope_worker, &w[i]), 0);
  }
  uint64_t bytes = 0;
  for (unsigned i = 0; i < T; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    ck_assert_ptr_null(ret);
    ck_assert_int_eq(w[i].bad, 0);
    bytes += 200u * 4u * 256u * (i + 1);
  }
  pthread_barrier_destroy(&barrier);
  ck_assert_int_eq(rmmc_statistics_adaptor_get_depth(f.r), 0);
  rmmc_statistics_t s = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(f.r, &s), RMMC_SUCCESS);
  ck_assert_int_eq(s.current_bytes, 0);
  ck_assert_int_eq(s.current_count, 0);
  ck_assert_uint_eq(s.total_bytes, bytes);
  ck_assert_uint_eq(s.total_count, T * 200 * 4);
  ck_assert_uint_eq(s.deallocations, T * 200 * 4);
  /* At the barriers every thread held its 4 blocks at once. */
  ck_assert_int_ge(s.peak_count, T * 4);
  ck_assert_int_ge(s.peak_bytes, (int64_t)(4 * 256 * T * (T + 1) / 2));
  teardown(&f);
}
END_TEST

START_TEST(test_statistics_spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("statistics > host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "statistics");
  void *p = alloc(r, 777);
  EXPECT(r, 777, 777, 777, 1, 1, 1, 0);
  dealloc(r, p, 777);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("statistics() > host", -1, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_validate("statistics(peak=1) > host"), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "statistics has no option 'peak' (it takes: none)") != NULL,
                "%s", rmmc_last_error_message());
}
END_TEST

/* ---- the packed word and its switch to the slow path ----
 * A fake upstream hands out one fake pointer for any size (the adaptor
 * never touches memory), so terabytes and half a million allocations cost
 * nothing. */
typedef struct fake {
  rmmc_resource_t base;
  int64_t bytes, count; /* atomic: outstanding, as the upstream saw them */
} fake_t;

static rmmc_status_t fake_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  (void)alignment, (void)stream;
  fake_t *f = (fake_t *)r;
  __atomic_add_fetch(&f->bytes, (int64_t)bytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->count, 1, __ATOMIC_RELAXED);
  *out = (void *)(uintptr_t)4096;
  return RMMC_SUCCESS;
}

static rmmc_status_t fake_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)ptr, (void)alignment, (void)stream;
  fake_t *f = (fake_t *)r;
  __atomic_sub_fetch(&f->bytes, (int64_t)bytes, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&f->count, 1, __ATOMIC_RELAXED);
  return RMMC_SUCCESS;
}

static void fake_destroy(rmmc_resource_t *r) { free(r); }

static const rmmc_resource_ops_t fake_ops = {.version = RMMC_RESOURCE_OPS_VERSION,
                                             .name = "fake",
                                             .allocate = fake_allocate,
                                             .deallocate = fake_deallocate,
                                             .destroy = fake_destroy};

/* A statistics adaptor over a new fake upstream (*fake borrowed). */
static rmmc_resource_t *fake_stats(fake_t **fake) {
  fake_t *f = calloc(1, sizeof *f);
  ck_assert_ptr_nonnull(f);
  rmmc_resource_init(&f->base, &fake_ops, RMMC_MEMORY_HOST, -1);
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_statistics_adaptor_create(&f->base, &r), RMMC_SUCCESS);
  rmmc_resource_release(&f->base);
  *fake = f;
  return r;
}

static uint64_t slow_path(rmmc_resource_t *r) {
  uint64_t v = 99;
  ck_assert(rmmc_resource_get_field(r, "slow_path", &v));
  return v;
}

#define GIB_1 (((size_t)1 << 30) - 1) /* the largest allocation the xadd takes */
#define TIB_4 ((size_t)1 << 42)       /* the bytes the word holds: up to TIB_4 - 1 */
#define COUNT_MAX (((int64_t)1 << 19) - 1)

/* Bytes past 2^32 and up to 4 TiB - 1 in the word, exactly (4095 xadds of
 * 1 GiB - 1), then the 4097th allocation reaches 4 TiB and switches: every
 * figure stays exact, across push/pop, down to zero. */
START_TEST(test_statistics_switch_on_bytes) {
  fake_t *fk;
  rmmc_resource_t *r = fake_stats(&fk);
  void *p;
  for (int i = 0; i < 4096; i++) p = alloc(r, GIB_1);
  int64_t b = 4096 * (int64_t)GIB_1;
  ck_assert_int_lt(b, (int64_t)TIB_4);
  EXPECT(r, b, b, (uint64_t)b, 4096, 4096, 4096, 0);
  ck_assert_uint_eq(slow_path(r), 0);
  p = alloc(r, GIB_1);
  b += (int64_t)GIB_1;
  ck_assert_int_ge(b, (int64_t)TIB_4);
  ck_assert_uint_eq(slow_path(r), 1);
  EXPECT(r, b, b, (uint64_t)b, 4097, 4097, 4097, 0);
  ck_assert_int_eq(rmmc_statistics_adaptor_push(r), RMMC_SUCCESS);
  p = alloc(r, 1000);
  dealloc(r, p, GIB_1);
  dealloc(r, p, GIB_1);
  EXPECT(r, 1000 - 2 * (int64_t)GIB_1, 1000, 1000, -1, 1, 1, 2);
  rmmc_statistics_t st = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(r, &st), RMMC_SUCCESS);
  EXPECT(r, b + 1000 - 2 * (int64_t)GIB_1, b + 1000, (uint64_t)b + 1000, 4096, 4098, 4098, 2);
  dealloc(r, p, 1000);
  for (int i = 0; i < 4095; i++) dealloc(r, p, GIB_1);
  EXPECT(r, 0, b + 1000, (uint64_t)b + 1000, 0, 4098, 4098, 4098);
  ck_assert_int_eq(fk->bytes, 0);
  ck_assert_int_eq(fk->count, 0);
  ck_assert_uint_eq(slow_path(r), 1);
  rmmc_resource_release(r);
}
END_TEST

/* 2^19 - 1 allocations of mixed sizes in the word, the next one switches;
 * bytes and count never bleed into each other. */
START_TEST(test_statistics_switch_on_count) {
  fake_t *fk;
  rmmc_resource_t *r = fake_stats(&fk);
  void *p = NULL;
  int64_t b = 0;
  for (int64_t i = 0; i < COUNT_MAX; i++) {
    size_t n = (size_t)(i % 5) * 300 + 1;
    p = alloc(r, n);
    b += (int64_t)n;
  }
  EXPECT(r, b, b, (uint64_t)b, COUNT_MAX, COUNT_MAX, (uint64_t)COUNT_MAX, 0);
  ck_assert_uint_eq(slow_path(r), 0);
  p = alloc(r, 7);
  ck_assert_uint_eq(slow_path(r), 1);
  EXPECT(r, b + 7, b + 7, (uint64_t)b + 7, COUNT_MAX + 1, COUNT_MAX + 1, (uint64_t)COUNT_MAX + 1,
         0);
  dealloc(r, p, 7);
  for (int64_t i = 0; i < COUNT_MAX; i++) dealloc(r, p, (size_t)(i % 5) * 300 + 1);
  uint64_t n = (uint64_t)COUNT_MAX + 1;
  EXPECT(r, 0, b + 7, (uint64_t)b + 7, 0, COUNT_MAX + 1, n, n);
  rmmc_resource_release(r);
}
END_TEST

/* Large allocations take the checked CAS: 4 TiB - 1 fits in the word, one
 * byte more switches, and 1 PiB (which no word holds) is exact after. */
START_TEST(test_statistics_large_allocations) {
  fake_t *fk;
  rmmc_resource_t *r = fake_stats(&fk);
  void *p = alloc(r, TIB_4 - 1);
  int64_t b = (int64_t)TIB_4 - 1;
  EXPECT(r, b, b, (uint64_t)b, 1, 1, 1, 0);
  ck_assert_uint_eq(slow_path(r), 0);
  p = alloc(r, 1);
  ck_assert_uint_eq(slow_path(r), 1);
  EXPECT(r, b + 1, b + 1, (uint64_t)b + 1, 2, 2, 2, 0);
  p = alloc(r, (size_t)1 << 50);
  int64_t big = b + 1 + ((int64_t)1 << 50);
  EXPECT(r, big, big, (uint64_t)big, 3, 3, 3, 0);
  dealloc(r, p, (size_t)1 << 50);
  dealloc(r, p, 1);
  dealloc(r, p, TIB_4 - 1);
  EXPECT(r, 0, big, (uint64_t)big, 0, 3, 3, 3);
  rmmc_resource_release(r);
  /* A fresh adaptor whose first allocation is 1 PiB switches at once. */
  r = fake_stats(&fk);
  p = alloc(r, (size_t)1 << 50);
  ck_assert_uint_eq(slow_path(r), 1);
  EXPECT(r, (int64_t)1 << 50, (int64_t)1 << 50, (uint64_t)1 << 50, 1, 1, 1, 0);
  dealloc(r, p, (size_t)1 << 50);
  EXPECT(r, 0, (int64_t)1 << 50, (uint64_t)1 << 50, 0, 1, 1, 1);
  rmmc_resource_release(r);
}
END_TEST

/* A deallocation of memory not allocated here, which the upstream accepts,
 * takes the figures below zero (as before the word): the word cannot hold
 * that, so the adaptor switches and stays exact. */
START_TEST(test_statistics_below_zero_switches) {
  fake_t *fk;
  rmmc_resource_t *r = fake_stats(&fk);
  void *p = alloc(r, 50);
  dealloc(r, p, 100);
  ck_assert_uint_eq(slow_path(r), 1);
  EXPECT(r, -50, 50, 50, 0, 1, 1, 1);
  dealloc(r, p, 10);
  EXPECT(r, -60, 50, 50, -1, 1, 1, 2);
  p = alloc(r, 60);
  p = alloc(r, 60);
  EXPECT(r, 60, 60, 170, 1, 1, 3, 2);
  dealloc(r, p, 60);
  dealloc(r, p, 60);
  rmmc_resource_release(r);
}
END_TEST

enum { RACERS = 4 };

typedef struct racer {
  rmmc_resource_t *r;
  pthread_barrier_t *barrier;
  size_t bytes;
  int n;
} racer_t;

/* Allocates n blocks, waits for all racers, frees them. */
static void *racer(void *arg) {
  racer_t *w = arg;
  void *p = NULL;
  for (int i = 0; i < w->n; i++)
    if (rmmc_resource_allocate(w->r, w->bytes, 256, NULL, &p) != RMMC_SUCCESS) return arg;
  pthread_barrier_wait(w->barrier);
  pthread_barrier_wait(w->barrier); /* the main thread checks the figures */
  for (int i = 0; i < w->n; i++)
    if (rmmc_resource_deallocate(w->r, p, w->bytes, 256, NULL) != RMMC_SUCCESS) return arg;
  return NULL;
}

/* Threads cross a limit together (bytes, then count): no update is lost
 * or counted twice while the adaptor switches under them. Allocation only
 * grows the figures, so the peak is the final current exactly. */
static void race_switch(size_t bytes, int per_thread) {
  fake_t *fk;
  rmmc_resource_t *r = fake_stats(&fk);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, RACERS + 1);
  pthread_t th[RACERS];
  racer_t w[RACERS];
  for (int t = 0; t < RACERS; t++) {
    w[t] = (racer_t){r, &barrier, bytes, per_thread};
    ck_assert_int_eq(pthread_create(&th[t], NULL, racer, &w[t]), 0);
  }
  pthread_barrier_wait(&barrier);
  int64_t n = (int64_t)RACERS * per_thread, b = n * (int64_t)bytes;
  EXPECT(r, b, b, (uint64_t)b, n, n, (uint64_t)n, 0);
  ck_assert_uint_eq(slow_path(r), 1);
  pthread_barrier_wait(&barrier);
  for (int t = 0; t < RACERS; t++) {
    void *ret;
    pthread_join(th[t], &ret);
    ck_assert_ptr_null(ret);
  }
  pthread_barrier_destroy(&barrier);
  EXPECT(r, 0, b, (uint64_t)b, 0, n, (uint64_t)n, (uint64_t)n);
  ck_assert_int_eq(fk->count, 0);
  rmmc_resource_release(r);
}

START_TEST(test_statistics_switch_racing_threads) {
  race_switch(GIB_1, 1100);        /* 4400 > 4096 blocks of 1 GiB - 1 */
  race_switch(3, (1 << 17) + 1000); /* > 2^19 allocations */
}
END_TEST

int main(void) {
  Suite *s = suite_create("statistics");
  conformance_add(s, cases, 1);
  TCase *tc = tcase_create("statistics");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_statistics_figures);
  tcase_add_test(tc, test_statistics_push_pop_nesting);
  tcase_add_test(tc, test_statistics_deep_scopes_and_describe_folds);
  tcase_add_test(tc, test_statistics_scopes_end_in_any_order);
  tcase_add_test(tc, test_statistics_scope_bad_ids);
  tcase_add_test(tc, test_statistics_scopes_from_threads);
  tcase_add_test(tc, test_statistics_struct_size_and_bad_arguments);
  tcase_add_test(tc, test_statistics_exact_under_threads);
  tcase_add_test(tc, test_statistics_exact_beyond_thread_shards);
  tcase_add_test(tc, test_statistics_threads_come_and_go);
  tcase_add_test(tc, test_statistics_push_pop_racing_allocations);
  tcase_add_test(tc, test_statistics_spec);
  tcase_add_test(tc, test_statistics_switch_on_bytes);
  tcase_add_test(tc, test_statistics_switch_on_count);
  tcase_add_test(tc, test_statistics_large_allocations);
  tcase_add_test(tc, test_statistics_below_zero_switches);
  tcase_add_test(tc, test_statistics_switch_racing_threads);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
