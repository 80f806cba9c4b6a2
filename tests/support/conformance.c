/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance battery (see conformance.h). Every check builds a fresh
 * stack over a host spy, runs, releases the stack, and asserts that the spy
 * got back every byte and was destroyed: leaks and double frees fail here.
 */
#include "conformance.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "faulty.h"
#include "graph_contract.h"
#include "rmmc/host_resource.h"
#include "rmmc/pool_resource.h"
#include "spy.h"
#include "tsan.h"

/* Under ThreadSanitizer (tsan.h) the random runs are a fifth as long and
 * blocks are filled every 4093 bytes, not 61: the threads still meet in
 * every path; the full bulk runs in the other builds. */
#define OPS(n) (RMMC_TEST_TSAN ? (n) / 5 : (n))
#define FILL_STRIDE (RMMC_TEST_TSAN ? 4093 : 61)

static const conformance_case_t *g_cases;

typedef struct fixture {
  const conformance_case_t *c;
  rmmc_resource_t *spy;
  rmmc_resource_t *r;
  uint64_t destroyed_before;
  unsigned long ops_done; /* atomic: random_run's operations so far (paces the watcher) */
} fixture_t;

static void setup(fixture_t *f, int i) {
  f->c = &g_cases[i];
  f->destroyed_before = spy_destroyed_total();
  f->ops_done = 0;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f->spy), RMMC_SUCCESS);
  rmmc_status_t st = f->c->make(f->spy, &f->r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: factory failed: %s", f->c->name, rmmc_last_error_message());
  ck_assert_ptr_nonnull(f->r);
}

static void teardown(fixture_t *f) {
  spy_t *s = spy_of(f->spy);
  rmmc_resource_release(f->r);
  spy_counts_t c = spy_counts(s);
  ck_assert_msg(c.outstanding == 0, "%s: %llu upstream allocations leaked", f->c->name,
                (unsigned long long)c.outstanding);
  ck_assert_msg(c.deallocate_errors == 0, "%s: %llu bad frees reached the upstream", f->c->name,
                (unsigned long long)c.deallocate_errors);
  rmmc_resource_release(f->spy);
  ck_assert_uint_eq(spy_destroyed_total(), f->destroyed_before + 1);
}

static size_t max_request(const fixture_t *f) {
  return f->c->max_request ? f->c->max_request : (size_t)8 << 20;
}

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += FILL_STRIDE) b[i] = (unsigned char)(seed + i);
  b[n - 1] = (unsigned char)(seed ^ 0x5a);
}

static int check_fill(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += FILL_STRIDE)
    if (b[i] != (unsigned char)(seed + i)) return 0;
  return b[n - 1] == (unsigned char)(seed ^ 0x5a);
}

START_TEST(test_conformance_sizes_and_alignment) {
  fixture_t f;
  setup(&f, _i);
  static const size_t sizes[] = {1, 255, 256, 257, 1000, 4095, 4096, 65537, 1 << 20, (3 << 20) + 7};
  static const size_t aligns[] = {1, 8, 256, 512, 4096};
  void *ptrs[sizeof sizes / sizeof sizes[0]][sizeof aligns / sizeof aligns[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
      size_t a = aligns[j] < 256 ? 256 : aligns[j];
      ptrs[i][j] = NULL;
      if (sizes[i] > max_request(&f)) continue;
      rmmc_status_t st = rmmc_resource_allocate(f.r, sizes[i], aligns[j], NULL, &ptrs[i][j]);
      ck_assert_msg(st == RMMC_SUCCESS, "%s: allocate %zu/%zu: %s", f.c->name, sizes[i], aligns[j],
                    rmmc_last_error_message());
      ck_assert_ptr_nonnull(ptrs[i][j]);
      ck_assert_msg((uintptr_t)ptrs[i][j] % a == 0, "%s: %p not aligned to %zu", f.c->name,
                    ptrs[i][j], a);
      fill(ptrs[i][j], sizes[i], (unsigned)(i * 7 + j));
    }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
      if (ptrs[i][j] == NULL) continue;
      ck_assert_msg(check_fill(ptrs[i][j], sizes[i], (unsigned)(i * 7 + j)),
                    "%s: data of %zu-byte block changed", f.c->name, sizes[i]);
      ck_assert_int_eq(rmmc_resource_deallocate(f.r, ptrs[i][j], sizes[i], aligns[j], NULL),
                       RMMC_SUCCESS);
    }
  teardown(&f);
}
END_TEST

START_TEST(test_conformance_bad_input) {
  fixture_t f;
  setup(&f, _i);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 0, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, NULL, 0, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, NULL, 64, 256, NULL), RMMC_SUCCESS);
  p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 64, 3, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 64, 0, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 64, 256, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  p = (void *)1;
  rmmc_status_t st = rmmc_resource_allocate(f.r, SIZE_MAX, 256, NULL, &p);
  ck_assert_int_ne(st, RMMC_SUCCESS);
  ck_assert_ptr_null(p);
  st = rmmc_resource_allocate(f.r, SIZE_MAX / 2, 256, NULL, &p);
  ck_assert_int_ne(st, RMMC_SUCCESS);
  ck_assert_ptr_null(p);
  ck_assert_str_ne(rmmc_last_error_message(), "");
  /* Still serves correctly afterwards. */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  fill(p, 4096, 9);
  ck_assert(check_fill(p, 4096, 9));
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, 4096, 256, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(rmmc_resource_name(f.r));
  ck_assert_int_eq(rmmc_resource_memory_kind(f.r), RMMC_MEMORY_HOST);
  ck_assert_int_eq(rmmc_resource_release_cached(f.r), RMMC_SUCCESS);
  teardown(&f);
}
END_TEST

/* Graph pools (design rule 13): through every stack with a pool layer
 * below, whatever caches above it, a graph's blocks serve nothing else
 * while it lives, one thread routing beside others included; a stack
 * without a pool refuses to route, saying so. */
START_TEST(test_conformance_graph_pools) {
  fixture_t f;
  setup(&f, _i);
  if (graph_contract_pool_of(f.r) == NULL) {
    ck_assert_int_eq(rmmc_pool_graph_begin(f.r, 1, 2, true, (cudaStream_t)1),
                     RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no pool layer"));
  } else {
    graph_contract_run(f.r, max_request(&f), f.c->name);
    graph_contract_threads(f.r, max_request(&f), 3, f.c->name);
  }
  teardown(&f);
}
END_TEST

typedef struct live {
  char *p;
  size_t n;
  unsigned seed;
  cudaStream_t stream;
} live_t;

static int cmp_live(const void *a, const void *b) {
  const live_t *x = a, *y = b;
  return x->p < y->p ? -1 : x->p > y->p;
}

/* Random allocate/free with up to `nlive` live blocks; checks data and that
 * no two live blocks overlap. */
static void random_run(fixture_t *f, unsigned seed, int ops, int nlive, int nstreams) {
  live_t *live = calloc((size_t)nlive, sizeof *live);
  live_t *sorted = calloc((size_t)nlive, sizeof *sorted);
  int n = 0;
  size_t maxr = max_request(f);
  size_t cap = maxr < ((size_t)1 << 20) ? maxr : ((size_t)1 << 20);
  for (int op = 0; op < ops; op++) {
    seed = seed * 1103515245u + 12345u;
    bool do_alloc = n == 0 || (n < nlive && (seed >> 16) % 3 != 0);
    if (do_alloc) {
      seed = seed * 1103515245u + 12345u;
      size_t bytes = 1 + ((size_t)(seed >> 8) % cap);
      cudaStream_t st = (cudaStream_t)(uintptr_t)(1 + (seed >> 4) % (unsigned)nstreams);
      void *p;
      rmmc_status_t s = rmmc_resource_allocate(f->r, bytes, 256, st, &p);
      ck_assert_msg(s == RMMC_SUCCESS, "%s: allocate %zu: %s", f->c->name, bytes,
                    rmmc_last_error_message());
      ck_assert_msg((uintptr_t)p % 256 == 0, "misaligned");
      fill(p, bytes, seed);
      live[n++] = (live_t){p, bytes, seed, st};
    } else {
      int k = (int)((seed >> 8) % (unsigned)n);
      ck_assert_msg(check_fill(live[k].p, live[k].n, live[k].seed), "%s: data corrupted",
                    f->c->name);
      /* Free on the allocating stream or another: both are allowed. */
      cudaStream_t st = (seed & 64) ? live[k].stream : (cudaStream_t)(uintptr_t)(1 + (seed >> 7) % (unsigned)nstreams);
      ck_assert_int_eq(rmmc_resource_deallocate(f->r, live[k].p, live[k].n, 256, st), RMMC_SUCCESS);
      live[k] = live[--n];
    }
    __atomic_add_fetch(&f->ops_done, 1, __ATOMIC_RELAXED);
    if (op % 97 == 0 && n > 1) {
      memcpy(sorted, live, (size_t)n * sizeof *live);
      qsort(sorted, (size_t)n, sizeof *sorted, cmp_live);
      for (int i = 1; i < n; i++)
        ck_assert_msg(sorted[i - 1].p + sorted[i - 1].n <= sorted[i].p, "%s: live blocks overlap",
                      f->c->name);
    }
  }
  for (int i = 0; i < n; i++) {
    ck_assert(check_fill(live[i].p, live[i].n, live[i].seed));
    ck_assert_int_eq(rmmc_resource_deallocate(f->r, live[i].p, live[i].n, 256, live[i].stream),
                     RMMC_SUCCESS);
  }
  free(live);
  free(sorted);
}

START_TEST(test_conformance_random_sequence) {
  fixture_t f;
  setup(&f, _i);
  random_run(&f, 12345u + (unsigned)_i, OPS(4000), 150, 3);
  ck_assert_int_eq(rmmc_resource_release_cached(f.r), RMMC_SUCCESS);
  random_run(&f, 777u, OPS(1000), 40, 1);
  teardown(&f);
}
END_TEST

typedef struct thread_arg {
  fixture_t *f;
  unsigned seed;
} thread_arg_t;

static void *thread_main(void *arg) {
  thread_arg_t *t = arg;
  random_run(t->f, t->seed, OPS(3000), 40, 2);
  return NULL;
}

typedef struct watcher {
  fixture_t *f;
  int stop; /* atomic */
  unsigned rounds;
  rmmc_status_t release_status;
} watcher_t;

static void count_field(void *ctx, const rmmc_field_t *fl) {
  (void)fl;
  ++*(unsigned *)ctx;
}

/* Reads every layer's figures and releases the stack's cache while the
 * workers allocate and free: what a monitoring thread, or the
 * out-of-memory rule on another thread, does. At most one round per
 * operation the workers have done: unpaced, the number of rounds was the
 * scheduler's choice. Under valgrind, which runs one thread at a time, the
 * watcher took nearly all the CPU (it holds the layers' locks most of the
 * time, and the workers it woke found them taken again and went back to
 * sleep): 1.4 million rounds for fixed_size > arena where natively it runs
 * 175 thousand, and the out-of-memory and expandable pool programs spent
 * minutes in this check. Paced, it runs at most 24,000 rounds (OPS(3000)
 * for each of 8 workers), the order of what the pool cases ran natively. */
static void *watcher_main(void *arg) {
  watcher_t *w = arg;
  while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) || w->rounds == 0) {
    while (w->rounds >= __atomic_load_n(&w->f->ops_done, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
      sched_yield();
    unsigned fields = 0;
    for (rmmc_resource_t *r = w->f->r; r != NULL; r = rmmc_resource_upstream(r))
      rmmc_resource_describe(r, count_field, &fields);
    if (w->rounds++ % 4 == 0) {
      rmmc_status_t st = rmmc_resource_release_cached(w->f->r);
      if (st != RMMC_SUCCESS) w->release_status = st;
    }
  }
  return NULL;
}

START_TEST(test_conformance_threads) {
  fixture_t f;
  setup(&f, _i);
  enum { T = 8 };
  pthread_t th[T], wt;
  thread_arg_t args[T];
  watcher_t w = {&f, 0, 0, RMMC_SUCCESS};
  ck_assert_int_eq(pthread_create(&wt, NULL, watcher_main, &w), 0);
  for (int i = 0; i < T; i++) {
    args[i] = (thread_arg_t){&f, 1000u + (unsigned)i * 7919u};
    ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
  pthread_join(wt, NULL);
  ck_assert_msg(w.release_status == RMMC_SUCCESS, "%s: release_cached beside the workers: %s",
                f.c->name, rmmc_status_name(w.release_status));
  ck_assert_uint_gt(w.rounds, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_conformance_upstream_failure) {
  fixture_t f;
  setup(&f, _i);
  spy_t *s = spy_of(f.spy);
  spy_counts_t c = spy_counts(s);
  /* Nothing more from upstream: a request the resource has not cached
   * must fail cleanly, and the resource must serve again afterwards. */
  spy_set_capacity(s, c.outstanding_bytes);
  size_t big = max_request(&f);
  void *p = (void *)1;
  rmmc_status_t st = rmmc_resource_allocate(f.r, big, 256, NULL, &p);
  if (st == RMMC_SUCCESS) { /* it had that much cached: give it back */
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, big, 256, NULL), RMMC_SUCCESS);
  } else {
    ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
    ck_assert_ptr_null(p);
    ck_assert_str_ne(rmmc_last_error_message(), "");
  }
  spy_set_capacity(s, SIZE_MAX);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, big, 256, NULL, &p), RMMC_SUCCESS);
  fill(p, big, 3);
  ck_assert(check_fill(p, big, 3));
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, big, 256, NULL), RMMC_SUCCESS);
  /* Every second upstream call fails: whatever fails is reported, what
   * succeeds is usable, nothing leaks (teardown checks). */
  spy_fail_every(s, 2);
  void *ps[64];
  size_t ns[64];
  int got = 0;
  for (int i = 0; i < 64; i++) {
    ns[got] = (size_t)(i + 1) * 100000;
    if (ns[got] > big) ns[got] = big;
    st = rmmc_resource_allocate(f.r, ns[got], 256, NULL, &ps[got]);
    ck_assert(st == RMMC_SUCCESS || st == RMMC_ERROR_OUT_OF_MEMORY);
    if (st == RMMC_SUCCESS) fill(ps[got], ns[got], 11), got++;
  }
  spy_fail_every(s, 0);
  for (int i = 0; i < got; i++) {
    ck_assert(check_fill(ps[i], ns[i], 11));
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, ps[i], ns[i], 256, NULL), RMMC_SUCCESS);
  }
  teardown(&f);
}
END_TEST

/* The out-of-memory rule (resource.h, docs/design.md): a stack reports out
 * of memory only when nothing in it caches memory. Fill the resource until
 * an upstream capped at 48 MiB more than it holds refuses, free everything,
 * then ask for a size it has not cached: the memory it caches must come
 * back for it (issue 11: arena and binning kept theirs), and the success
 * leaves the thread's last error alone. */
START_TEST(test_conformance_oom_gives_back_cached_memory) {
  fixture_t f;
  setup(&f, _i);
  spy_t *s = spy_of(f.spy);
  const size_t cap = spy_counts(s).outstanding_bytes + ((size_t)48 << 20);
  spy_set_capacity(s, cap);
  enum { MAX_BLOCKS = 2048 };
  static const size_t sizes[] = {(size_t)3 << 19, (size_t)1 << 20, (size_t)192 << 10};
  void **p = calloc(MAX_BLOCKS, sizeof *p);
  size_t *n = calloc(MAX_BLOCKS, sizeof *n);
  ck_assert(p != NULL && n != NULL);
  int got = 0;
  for (; got < MAX_BLOCKS; got++) {
    n[got] = sizes[got % 3] < max_request(&f) ? sizes[got % 3] : max_request(&f);
    rmmc_status_t st = rmmc_resource_allocate(f.r, n[got], 256, NULL, &p[got]);
    if (st != RMMC_SUCCESS) {
      ck_assert_msg(st == RMMC_ERROR_OUT_OF_MEMORY, "%s: %s", f.c->name, rmmc_last_error_message());
      break;
    }
    fill(p[got], n[got], (unsigned)got);
  }
  ck_assert_msg(got > 0, "%s: nothing allocated under the cap: %s", f.c->name,
                rmmc_last_error_message());
  for (int i = 0; i < got; i++) {
    ck_assert(check_fill(p[i], n[i], (unsigned)i));
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[i], n[i], 256, NULL), RMMC_SUCCESS);
  }
  size_t big = max_request(&f) < ((size_t)8 << 20) ? max_request(&f) : (size_t)8 << 20;
  void *q = NULL;
  rmmc_clear_last_error();
  rmmc_status_t st = rmmc_resource_allocate(f.r, big, 256, NULL, &q);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %zu bytes with nothing live: %s", f.c->name, big,
                rmmc_last_error_message());
  ck_assert_msg(rmmc_last_error_message()[0] == '\0', "%s: a success left '%s'", f.c->name,
                rmmc_last_error_message());
  fill(q, big, 77);
  ck_assert(check_fill(q, big, 77));
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, q, big, 256, NULL), RMMC_SUCCESS);
  spy_set_capacity(s, SIZE_MAX);
  free(p);
  free(n);
  teardown(&f);
}
END_TEST

/* The out-of-memory rule across streams (issue 25, F10): memory one
 * stream freed is cached memory for every other stream. Under an upstream
 * capped at 64 MiB over what the resource holds, stream A fills it with
 * blocks of 512 KiB (or the largest request) and frees every other one;
 * stream B's request of the same size must be served (from A's free
 * memory: the cap allows nothing more), leaving no message. RMM's pool
 * serves it; the pool and the arena refused it before. */
START_TEST(test_conformance_oom_with_memory_cached_on_another_stream) {
  fixture_t f;
  setup(&f, _i);
  spy_t *s = spy_of(f.spy);
  spy_set_capacity(s, spy_counts(s).outstanding_bytes + ((size_t)64 << 20));
  const size_t size = max_request(&f) < ((size_t)512 << 10) ? max_request(&f) : (size_t)512 << 10;
  cudaStream_t a = (cudaStream_t)(uintptr_t)0xa000, b = (cudaStream_t)(uintptr_t)0xb000;
  enum { MAX_BLOCKS = 4096 };
  void **p = calloc(MAX_BLOCKS, sizeof *p);
  ck_assert_ptr_nonnull(p);
  int got = 0;
  rmmc_status_t st = RMMC_SUCCESS;
  for (; got < MAX_BLOCKS; got++) {
    st = rmmc_resource_allocate(f.r, size, 256, a, &p[got]);
    if (st != RMMC_SUCCESS) break;
    fill(p[got], size, (unsigned)got);
  }
  ck_assert_msg(st == RMMC_ERROR_OUT_OF_MEMORY, "%s: stream A never ran out: %s", f.c->name,
                rmmc_status_name(st));
  ck_assert_msg(got >= 4, "%s: %d blocks under the cap", f.c->name, got);
  for (int i = 0; i < got; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[i], size, 256, a), RMMC_SUCCESS);
  void *q = NULL;
  rmmc_clear_last_error();
  st = rmmc_resource_allocate(f.r, size, 256, b, &q);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: stream B's %zu bytes with %d of stream A's blocks free: %s",
                f.c->name, size, (got + 1) / 2, rmmc_last_error_message());
  ck_assert_msg(rmmc_last_error_message()[0] == '\0', "%s: a success left '%s'", f.c->name,
                rmmc_last_error_message());
  fill(q, size, 4242);
  for (int i = 1; i < got; i += 2)
    ck_assert_msg(check_fill(p[i], size, (unsigned)i), "%s: stream A's block %d changed", f.c->name,
                  i);
  ck_assert(check_fill(q, size, 4242));
  /* B's block goes back on B, A's on A; then A serves again. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, q, size, 256, b), RMMC_SUCCESS);
  for (int i = 1; i < got; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[i], size, 256, a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, size, 256, a, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, q, size, 256, a), RMMC_SUCCESS);
  spy_set_capacity(s, SIZE_MAX);
  free(p);
  teardown(&f);
}
END_TEST

/* Tens of thousands of streams, one block each, as a program that makes a
 * stream per request or per task does (issue 25, F9): every request is
 * served, the memory taken from the upstream stays what the first streams
 * took (nothing is kept per stream that never comes back), a layer that
 * reports "heaps" keeps it bounded, and everything comes back
 * (teardown). */
START_TEST(test_conformance_many_streams) {
  fixture_t f;
  setup(&f, _i);
  spy_t *s = spy_of(f.spy);
  const int streams = getenv("RMMC_TEST_QUICK") != NULL || RMMC_TEST_TSAN ? 4000 : 30000;
  const size_t sizes[2] = {1024, max_request(&f) < ((size_t)64 << 10) ? max_request(&f) : 64 << 10};
  size_t warm = 0;
  for (int i = 1; i <= streams; i++) {
    cudaStream_t st = (cudaStream_t)(uintptr_t)(0x100000 + (uintptr_t)i * 16);
    void *p[2];
    for (int k = 0; k < 2; k++) {
      rmmc_status_t r = rmmc_resource_allocate(f.r, sizes[k], 256, st, &p[k]);
      ck_assert_msg(r == RMMC_SUCCESS, "%s: stream %d: %s", f.c->name, i,
                    rmmc_last_error_message());
      fill(p[k], sizes[k], (unsigned)(i + k));
    }
    for (int k = 0; k < 2; k++) {
      ck_assert(check_fill(p[k], sizes[k], (unsigned)(i + k)));
      ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[k], sizes[k], 256, st), RMMC_SUCCESS);
    }
    if (i == 1000) warm = spy_counts(s).outstanding_bytes;
  }
  size_t held = spy_counts(s).outstanding_bytes;
  ck_assert_msg(held <= 2 * warm + ((size_t)64 << 20),
                "%s: %zu bytes held from the upstream after %d streams, %zu after 1000", f.c->name,
                held, streams, warm);
  for (rmmc_resource_t *r = f.r; r != NULL; r = rmmc_resource_upstream(r)) {
    uint64_t heaps = 0;
    if (rmmc_resource_get_field(r, "heaps", &heaps))
      ck_assert_msg(heaps <= 1024, "%s: %s keeps %llu heaps after %d streams", f.c->name,
                    rmmc_resource_name(r), (unsigned long long)heaps, streams);
  }
  teardown(&f);
}
END_TEST

/* Every figure of every layer and, for a pool layer, its figures struct
 * and every invariant. */
static void read_stack(fixture_t *f) {
  unsigned fields = 0;
  for (rmmc_resource_t *r = f->r; r != NULL; r = rmmc_resource_upstream(r))
    rmmc_resource_describe(r, count_field, &fields);
  ck_assert_uint_gt(fields, 0);
  rmmc_resource_t *pool = graph_contract_pool_of(f->r);
  if (pool == NULL) return;
  rmmc_pool_figures_t fig = RMMC_POOL_FIGURES_INIT;
  ck_assert_int_eq(rmmc_pool_resource_figures(pool, &fig), RMMC_SUCCESS);
  ck_assert_uint_ge(fig.reserved, fig.in_use);
  rmmc_status_t st = rmmc_pool_resource_check(pool);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %s", f->c->name, rmmc_last_error_message());
}

typedef struct keys_thread {
  fixture_t *f;
  unsigned seed;
  int keys, ops;
} keys_thread_t;

static void *keys_main(void *arg) {
  keys_thread_t *t = arg;
  unsigned x = t->seed;
  size_t maxr = max_request(t->f) < ((size_t)1 << 20) ? max_request(t->f) : (size_t)1 << 20;
  for (int op = 0; op < t->ops; op++) {
    x = x * 1103515245u + 12345u;
    cudaStream_t s = (cudaStream_t)(uintptr_t)(0x100000 + 16 * (1 + (x >> 8) % (unsigned)t->keys));
    cudaStream_t o = (cudaStream_t)(uintptr_t)(0x100000 + 16 * (1 + (x >> 3) % (unsigned)t->keys));
    size_t n = (x & 15) == 0 ? maxr : 1 + (x >> 16) % 8192;
    if (n > maxr) n = maxr;
    void *p = NULL;
    rmmc_status_t st = rmmc_resource_allocate(t->f->r, n, 256, s, &p);
    ck_assert_msg(st == RMMC_SUCCESS, "%s: %zu bytes: %s", t->f->c->name, n,
                  rmmc_last_error_message());
    fill(p, n, x);
    ck_assert_msg(check_fill(p, n, x), "%s: data changed", t->f->c->name);
    ck_assert_int_eq(rmmc_resource_deallocate(t->f->r, p, n, 256, (x & 64) ? o : s), RMMC_SUCCESS);
    __atomic_add_fetch(&t->f->ops_done, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* Streams that come and go, shared by threads (issue 41, F13): four
 * threads walk the same 700 stream keys, past the pool's 256 heaps, each
 * in its own order (a key's heap retired under another thread's cache,
 * and for another thread's stripe), some blocks freed on another key,
 * while this thread reads every layer's figures and checks the pool; and
 * again after. */
START_TEST(test_conformance_many_stream_keys_on_threads) {
  fixture_t f;
  setup(&f, _i);
  enum { T = 4 };
  const int ops = OPS(1000); /* each thread meets about 530 of the 700 keys */
  keys_thread_t t[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    t[i] = (keys_thread_t){&f, 31u + 7919u * (unsigned)i, 700, ops};
    ck_assert_int_eq(pthread_create(&th[i], NULL, keys_main, &t[i]), 0);
  }
  unsigned long seen = 0;
  while (__atomic_load_n(&f.ops_done, __ATOMIC_RELAXED) < (unsigned long)(T * ops)) {
    unsigned long now = __atomic_load_n(&f.ops_done, __ATOMIC_RELAXED);
    if (now - seen < 400) {
      sched_yield();
      continue;
    }
    seen = now;
    read_stack(&f);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  read_stack(&f);
  ck_assert_int_eq(rmmc_resource_release_cached(f.r), RMMC_SUCCESS);
  read_stack(&f);
  teardown(&f);
}
END_TEST

/* ---- sleep mode through the stack (design rules 13 and 14) ---- */

static rmmc_pool_sleep_state_t sleep_state(rmmc_resource_t *r) {
  rmmc_pool_sleep_state_t s = RMMC_POOL_SLEEP_STATE_INIT;
  ck_assert_int_eq(rmmc_pool_sleep_state(r, &s), RMMC_SUCCESS);
  return s;
}

/* Blocks of several sizes (up to the largest request) on two streams,
 * kept and filled, and as many allocated and freed (in every layer's
 * cache). */
typedef struct sleepers {
  void *p[6];
  size_t n[6];
  int count;
} sleepers_t;

static void sleepers_make(fixture_t *f, sleepers_t *z) {
  static const size_t sizes[] = {256, 1000, 4096, 64 << 10, 1 << 20, 3 << 20};
  z->count = 0;
  for (int i = 0; i < 6; i++) {
    if (sizes[i] > max_request(f)) continue;
    cudaStream_t st = (cudaStream_t)(uintptr_t)(1 + i % 2);
    void *q = NULL;
    ck_assert_int_eq(rmmc_resource_allocate(f->r, sizes[i], 256, st, &z->p[z->count]),
                     RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(f->r, sizes[i], 256, st, &q), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(f->r, q, sizes[i], 256, st), RMMC_SUCCESS);
    z->n[z->count] = sizes[i];
    fill(z->p[z->count], sizes[i], 40u + (unsigned)i);
    z->count++;
  }
}

static bool sleepers_intact(const sleepers_t *z) {
  for (int i = 0; i < z->count; i++)
    if (!check_fill(z->p[i], z->n[i], 40u + (unsigned)i)) return false;
  return true;
}

static void sleepers_free(fixture_t *f, sleepers_t *z) {
  for (int i = 0; i < z->count; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(f->r, z->p[i], z->n[i], 256,
                                              (cudaStream_t)(uintptr_t)(1 + i % 2)),
                     RMMC_SUCCESS);
}

/* Every size on every stream, served, written and read back. */
static void serves_again(fixture_t *f) {
  for (size_t n = 256; n <= max_request(f) && n <= ((size_t)4 << 20); n *= 16)
    for (uintptr_t s = 1; s <= 2; s++) {
      void *p = NULL;
      rmmc_status_t st = rmmc_resource_allocate(f->r, n, 256, (cudaStream_t)s, &p);
      ck_assert_msg(st == RMMC_SUCCESS, "%s: %zu bytes after resume: %s", f->c->name, n,
                    rmmc_last_error_message());
      fill(p, n, 77);
      ck_assert(check_fill(p, n, 77));
      ck_assert_int_eq(rmmc_resource_deallocate(f->r, p, n, 256, (cudaStream_t)s), RMMC_SUCCESS);
    }
}

/* Nothing is handed out while the pool below is paused (issue 41, F14):
 * blocks of every size freed into every layer's cache, the pool paused
 * through the stack, then every size on every stream is refused with the
 * pool's message; after resume the stack serves again and, after a
 * backup, the live blocks read back as they were. A stack whose pool
 * cannot sleep refuses the pause and keeps serving; one with no pool says
 * so. */
START_TEST(test_conformance_pause_hands_out_nothing) {
  fixture_t f;
  setup(&f, _i);
  rmmc_pool_sleep_state_t s0 = RMMC_POOL_SLEEP_STATE_INIT;
  if (rmmc_pool_sleep_state(f.r, &s0) != RMMC_SUCCESS) {
    ck_assert_int_eq(rmmc_pool_pause(f.r, RMMC_POOL_PAUSE_DISCARD, NULL),
                     RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no pool layer"));
  } else if (!s0.can_sleep) {
    ck_assert_int_eq(rmmc_pool_pause(f.r, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_ERROR_NOT_SUPPORTED);
    ck_assert(!sleep_state(f.r).paused);
  } else {
    sleepers_t z;
    sleepers_make(&f, &z);
    for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++) {
      rmmc_status_t st = rmmc_pool_pause(f.r, (rmmc_pool_pause_mode_t)mode, NULL);
      ck_assert_msg(st == RMMC_SUCCESS, "%s: pause: %s", f.c->name, rmmc_last_error_message());
      for (size_t n = 256; n <= max_request(&f) && n <= ((size_t)4 << 20); n *= 4)
        for (uintptr_t k = 1; k <= 3; k++) {
          void *p = (void *)1;
          st = rmmc_resource_allocate(f.r, n, 256, (cudaStream_t)k, &p);
          ck_assert_msg(st == RMMC_ERROR_OUT_OF_MEMORY && p == NULL,
                        "%s: %zu bytes handed out while paused (%s)", f.c->name, n,
                        rmmc_status_name(st));
          ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "paused"));
        }
      ck_assert_int_eq(rmmc_pool_resume(f.r, NULL), RMMC_SUCCESS);
      if (mode == RMMC_POOL_PAUSE_BACKUP)
        ck_assert_msg(sleepers_intact(&z), "%s: a live block changed across a backup pause",
                      f.c->name);
      serves_again(&f);
    }
    sleepers_free(&f, &z);
  }
  serves_again(&f);
  teardown(&f);
}
END_TEST

/* The faulty layer below the stack's mappings, if its factory put one. */
static faulty_t *faulty_below(rmmc_resource_t *r) {
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (faulty_of(r) != NULL) return faulty_of(r);
  return NULL;
}

/* A failed pause or resume loses nothing (issue 41, F15; design rule 14):
 * over a pool that can sleep with a faulty layer below its mappings, the
 * kth unmap of a pause refused (several k, both modes): the stack is then
 * awake with every live block as it was, or paused as the message says
 * (discard, past a page under a live block), and resumes; the kth map of a
 * resume refused: still paused, and the next resume brings the backup
 * back. Every time the stack serves again afterwards. */
START_TEST(test_conformance_failed_pause_loses_nothing) {
  fixture_t f;
  setup(&f, _i);
  faulty_t *fy = faulty_below(f.r);
  rmmc_pool_sleep_state_t s0 = RMMC_POOL_SLEEP_STATE_INIT;
  if (fy == NULL || rmmc_pool_sleep_state(f.r, &s0) != RMMC_SUCCESS || !s0.can_sleep) {
    teardown(&f); /* nothing to inject into: the battery's other checks hold it */
    return;
  }
  rmmc_resource_t *pool = graph_contract_pool_of(f.r);
  sleepers_t z;
  sleepers_make(&f, &z);
  uint64_t nmaps = 0;
  ck_assert(rmmc_resource_get_field(pool, "mappings", &nmaps) && nmaps > 0);
  const uint64_t ks[] = {1, 2, nmaps / 2 + 1, nmaps};
  for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++)
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
      faulty_fail_nth(fy, FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, ks[j]);
      rmmc_status_t st = rmmc_pool_pause(f.r, (rmmc_pool_pause_mode_t)mode, NULL);
      faulty_disarm(fy);
      ck_assert_msg(st == RMMC_ERROR_CUDA, "%s: pause with unmap %llu refused: %s", f.c->name,
                    (unsigned long long)ks[j], rmmc_status_name(st));
      ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
      if (sleep_state(f.r).paused) {
        ck_assert_msg(mode == RMMC_POOL_PAUSE_DISCARD, "%s: a backup pause stayed paused: %s",
                      f.c->name, rmmc_last_error_message());
        ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "paused (discard)"));
        ck_assert_int_eq(rmmc_pool_resume(f.r, NULL), RMMC_SUCCESS);
        for (int i = 0; i < z.count; i++) fill(z.p[i], z.n[i], 40u + (unsigned)i);
      } else {
        ck_assert_msg(sleepers_intact(&z), "%s: awake after a failed %s pause, data lost",
                      f.c->name, mode == RMMC_POOL_PAUSE_BACKUP ? "backup" : "discard");
      }
      serves_again(&f);
      /* A resume whose kth map is refused: still paused, whole; again. */
      ck_assert_int_eq(rmmc_pool_pause(f.r, (rmmc_pool_pause_mode_t)mode, NULL), RMMC_SUCCESS);
      faulty_fail_nth(fy, FAULTY_ALLOCATE, RMMC_ERROR_OUT_OF_MEMORY, ks[j]);
      st = rmmc_pool_resume(f.r, NULL);
      faulty_disarm(fy);
      ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
      ck_assert(sleep_state(f.r).paused);
      ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
      ck_assert_int_eq(rmmc_pool_resume(f.r, NULL), RMMC_SUCCESS);
      if (mode == RMMC_POOL_PAUSE_BACKUP) ck_assert(sleepers_intact(&z));
      else
        for (int i = 0; i < z.count; i++) fill(z.p[i], z.n[i], 40u + (unsigned)i);
      serves_again(&f);
    }
  sleepers_free(&f, &z);
  teardown(&f);
}
END_TEST

START_TEST(test_conformance_ownership) {
  fixture_t f;
  setup(&f, _i);
  /* The stack holds the spy: dropping our reference keeps it alive. */
  ck_assert_int_ge(rmmc_resource_refcount(f.spy), 2);
  rmmc_resource_t *extra = rmmc_resource_retain(f.r);
  ck_assert_ptr_eq(extra, f.r);
  ck_assert_int_eq(rmmc_resource_refcount(f.r), 2);
  rmmc_resource_release(extra);
  ck_assert_int_eq(rmmc_resource_refcount(f.r), 1);
  ck_assert(rmmc_resource_is_equal(f.r, f.r));
  ck_assert(!rmmc_resource_is_equal(f.r, f.spy));
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, 1000, 256, NULL), RMMC_SUCCESS);
  teardown(&f);
}
END_TEST

void conformance_add(Suite *s, const conformance_case_t *cases, int ncases) {
  g_cases = cases;
  TCase *tc = tcase_create("conformance");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_conformance_sizes_and_alignment, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_bad_input, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_graph_pools, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_random_sequence, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_threads, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_upstream_failure, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_ownership, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_oom_gives_back_cached_memory, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_oom_with_memory_cached_on_another_stream, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_many_streams, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_many_stream_keys_on_threads, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_pause_hands_out_nothing, 0, ncases);
  tcase_add_loop_test(tc, test_conformance_failed_pause_loses_nothing, 0, ncases);
  suite_add_tcase(s, tc);
}
