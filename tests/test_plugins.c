/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The PyTorch and CuPy entry points on the CPU, over host spies set in the
 * registry: the blocks reach the right resource with the right size and
 * stream, the figures count them, unknown and double frees are counted and
 * reported without touching a resource, failures return NULL with the
 * message kept, limits hold, recorded streams are kept, and many threads
 * agree. Host suite (each test in its own process: the figures are
 * process-wide).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

#define STREAM_A ((cudaStream_t)0x10)
#define STREAM_B ((cudaStream_t)0x20)

/* A host spy set as device 0's resource; the registry holds the only
 * reference the caller does not. */
static rmmc_resource_t *install_spy(void) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, r, NULL), RMMC_SUCCESS);
  rmmc_plugin_reset_stats();
  return r;
}

static rmmc_plugin_stats_t stats(int device) {
  rmmc_plugin_stats_t s = RMMC_PLUGIN_STATS_INIT;
  ck_assert_int_eq(rmmc_plugin_get_stats(device, &s), RMMC_SUCCESS);
  return s;
}

static const char *last_plugin_error(void) {
  static char buf[1024];
  rmmc_plugin_last_error(buf, sizeof buf);
  return buf;
}

START_TEST(test_plugins_torch_alloc_and_free) {
  rmmc_resource_t *r = install_spy();
  spy_t *s = spy_of(r);
  void *p = rmmc_torch_alloc(1000, 0, STREAM_A);
  ck_assert_ptr_nonnull(p);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_uint_eq(c.last_bytes, 1000);
  ck_assert_ptr_eq(c.last_stream, STREAM_A);
  memset(p, 0xa5, 1000); /* host memory: really there */
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.allocations, 1);
  ck_assert_uint_eq(st.live_blocks, 1);
  ck_assert_uint_eq(st.bytes_in_use, 1000);
  ck_assert_uint_eq(st.peak_bytes, 1000);
  ck_assert_int_eq(rmmc_resource_refcount(r), 3); /* caller, registry, the block */
  rmmc_torch_free(p, 1000, 0, STREAM_A);
  c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_ptr_eq(c.last_stream, STREAM_A);
  st = stats(0);
  ck_assert_uint_eq(st.deallocations, 1);
  ck_assert_uint_eq(st.live_blocks, 0);
  ck_assert_uint_eq(st.bytes_in_use, 0);
  ck_assert_uint_eq(st.peak_bytes, 1000);
  ck_assert_int_eq(rmmc_resource_refcount(r), 2);
  /* Size 0 and NULL: nothing happens, nothing is counted. */
  ck_assert_ptr_null(rmmc_torch_alloc(0, 0, STREAM_A));
  rmmc_torch_free(NULL, 0, 0, STREAM_A);
  st = stats(0);
  ck_assert_uint_eq(st.allocations + st.allocation_failures + st.unknown_frees, 1);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_cupy_free_uses_recorded_size_and_stream) {
  rmmc_resource_t *r = install_spy();
  spy_t *s = spy_of(r);
  void *a = rmmc_cupy_malloc((void *)STREAM_B, 777, 0);
  void *b = rmmc_cupy_malloc(NULL, 4096, 0);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_eq(spy_counts(s).last_stream, NULL);
  /* CuPy gives neither size nor stream on free; the spy checks the size. */
  rmmc_cupy_free(NULL, a, 0);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.last_bytes, 777);
  ck_assert_ptr_eq(c.last_stream, STREAM_B);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_cupy_free((void *)STREAM_A, b, 0);
  c = spy_counts(s);
  ck_assert_uint_eq(c.last_bytes, 4096);
  ck_assert_ptr_eq(c.last_stream, NULL);
  ck_assert_uint_eq(c.outstanding, 0);
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.allocations, 2);
  ck_assert_uint_eq(st.deallocations, 2);
  ck_assert_uint_eq(st.peak_bytes, 4873);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_unknown_and_double_frees_are_counted) {
  rmmc_resource_t *r = install_spy();
  spy_t *s = spy_of(r);
  int local;
  rmmc_torch_free(&local, sizeof local, 0, STREAM_A);
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.unknown_frees, 1);
  ck_assert_uint_eq(spy_counts(s).deallocate_calls, 0);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "was not allocated through rmmc's plug-ins"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "left alone"));
  void *p = rmmc_cupy_malloc(NULL, 64, 0);
  rmmc_cupy_free(NULL, p, 0);
  rmmc_cupy_free(NULL, p, 0); /* double free */
  st = stats(0);
  ck_assert_uint_eq(st.unknown_frees, 2);
  ck_assert_uint_eq(st.deallocations, 1);
  ck_assert_uint_eq(spy_counts(s).deallocate_calls, 1);
  /* A bogus device id in a free is counted too, under every device. */
  rmmc_torch_free(&local, 4, 99, NULL);
  ck_assert_uint_eq(stats(-1).unknown_frees, 3);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_failures_return_null_with_message) {
  rmmc_resource_t *r = install_spy();
  spy_t *s = spy_of(r);
  spy_fail_nth(s, 1);
  ck_assert_ptr_null(rmmc_torch_alloc(512, 0, STREAM_A));
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.allocation_failures, 1);
  ck_assert_uint_eq(st.allocations, 0);
  ck_assert_uint_eq(st.bytes_in_use, 0);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "out of memory"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "spy failure injected"));
  ck_assert_int_eq(rmmc_resource_refcount(r), 2); /* nothing kept */
  /* Bad device ids. */
  ck_assert_ptr_null(rmmc_torch_alloc(8, -1, NULL));
  ck_assert_ptr_null(rmmc_cupy_malloc(NULL, 8, 64));
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "device 64 is out of range"));
  ck_assert_uint_eq(stats(-1).allocation_failures, 3);
  /* A device with no resource and no GPU to build one. */
  if (rmmc_device_count() == 0) {
    ck_assert_ptr_null(rmmc_torch_alloc(8, 5, NULL));
    ck_assert_ptr_nonnull(strstr(last_plugin_error(), "no CUDA device"));
  }
  /* The last error survives on another thread's view, and truncates. */
  char small[8];
  size_t n = rmmc_plugin_last_error(small, sizeof small);
  ck_assert_uint_gt(n, 7);
  ck_assert_uint_eq(strlen(small), 7);
  ck_assert_uint_eq(rmmc_plugin_last_error(NULL, 0), n);
  rmmc_plugin_reset_stats();
  ck_assert_uint_eq(rmmc_plugin_last_error(NULL, 0), 0);
  ck_assert_uint_eq(stats(-1).allocation_failures, 0);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_free_goes_to_the_allocating_resource) {
  rmmc_resource_t *a = install_spy(), *b;
  void *p = rmmc_torch_alloc(300, 0, STREAM_A);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, b, NULL), RMMC_SUCCESS);
  rmmc_torch_free(p, 300, 0, STREAM_A);
  ck_assert_uint_eq(spy_counts(spy_of(a)).outstanding, 0);
  ck_assert_uint_eq(spy_counts(spy_of(a)).deallocate_calls, 1);
  ck_assert_uint_eq(spy_counts(spy_of(b)).deallocate_calls, 0);
  ck_assert_int_eq(rmmc_resource_refcount(a), 1); /* the block let go of it */
  rmmc_registry_clear();
  rmmc_resource_release(a);
  rmmc_resource_release(b);
}
END_TEST

START_TEST(test_plugins_limit_holds) {
  rmmc_resource_t *r = install_spy();
  ck_assert_int_eq(rmmc_plugin_set_limit(0, 1000), RMMC_SUCCESS);
  ck_assert_uint_eq(stats(0).limit, 1000);
  void *a = rmmc_torch_alloc(600, 0, NULL);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_null(rmmc_cupy_malloc(NULL, 600, 0));
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "plug-in limit"));
  ck_assert_uint_eq(stats(0).bytes_in_use, 600);
  ck_assert_uint_eq(spy_counts(spy_of(r)).allocate_calls, 1); /* never asked */
  void *b = rmmc_torch_alloc(400, 0, NULL);
  ck_assert_ptr_nonnull(b); /* exactly at the limit */
  rmmc_torch_free(a, 600, 0, NULL);
  a = rmmc_cupy_malloc(NULL, 600, 0);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(rmmc_plugin_set_limit(0, 0), RMMC_SUCCESS); /* no limit */
  void *c = rmmc_torch_alloc(1 << 20, 0, NULL);
  ck_assert_ptr_nonnull(c);
  rmmc_torch_free(c, 1 << 20, 0, NULL);
  rmmc_cupy_free(NULL, a, 0);
  rmmc_torch_free(b, 400, 0, NULL);
  ck_assert_uint_eq(stats(0).bytes_in_use, 0);
  ck_assert_int_eq(rmmc_plugin_set_limit(-1, 10), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_plugin_set_limit(64, 10), RMMC_ERROR_INVALID_ARGUMENT);
  /* The memory fraction checks its argument, and needs a GPU for the total. */
  rmmc_torch_set_memory_fraction(1.5, 0);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "1.5 is not in (0, 1]"));
  rmmc_torch_set_memory_fraction(0.5, 0);
  if (rmmc_device_count() == 0) {
    ck_assert_ptr_nonnull(strstr(last_plugin_error(), "no CUDA device"));
    ck_assert_uint_eq(stats(0).limit, 0);
  } else {
    size_t free_b, total_b;
    ck_assert_int_eq(rmmc_device_memory_info(0, &free_b, &total_b), RMMC_SUCCESS);
    ck_assert_uint_eq(stats(0).limit, total_b / 2);
  }
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_record_stream_and_empty_cache) {
  rmmc_resource_t *r = install_spy();
  void *p = rmmc_torch_alloc(128, 0, STREAM_A);
  rmmc_torch_record_stream(p, STREAM_B);
  rmmc_torch_record_stream(p, STREAM_B); /* already recorded */
  rmmc_torch_record_stream(p, STREAM_A); /* its own stream */
  ck_assert_uint_eq(stats(0).recorded_streams, 1);
  for (uintptr_t i = 0; i < 20; i++) rmmc_torch_record_stream(p, (cudaStream_t)(0x100 + i));
  ck_assert_uint_eq(stats(0).recorded_streams, 17); /* then the device-wide fallback */
  /* Host memory needs no ordering: the free goes through. */
  rmmc_torch_free(p, 128, 0, STREAM_A);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  ck_assert_uint_eq(stats(0).deallocation_failures, 0);
  int local;
  rmmc_torch_record_stream(&local, STREAM_B);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "record_stream"));
  /* empty_cache releases the devices the plug-ins used, and only those. */
  rmmc_torch_empty_cache();
  ck_assert_uint_eq(spy_counts(spy_of(r)).release_calls, 1);
  ck_assert_int_eq(rmmc_plugin_release_cached(), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(r)).release_calls, 2);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_plugins_map_survives_growth_and_any_order) {
  rmmc_resource_t *r = install_spy();
  enum { N = 5000 };
  void **ps = malloc(N * sizeof *ps);
  for (size_t i = 0; i < N; i++) {
    ps[i] = (i % 2) ? rmmc_torch_alloc(256 + i, 0, STREAM_A) : rmmc_cupy_malloc(NULL, 256 + i, 0);
    ck_assert_ptr_nonnull(ps[i]);
  }
  ck_assert_uint_eq(stats(0).live_blocks, N);
  /* Free in a scrambled order: each free must find its block and size. */
  for (size_t k = 0; k < N; k++) {
    size_t i = (k * 2749) % N;
    if (i % 2) rmmc_torch_free(ps[i], 256 + i, 0, STREAM_A);
    else rmmc_cupy_free(NULL, ps[i], 0);
  }
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.deallocations, N);
  ck_assert_uint_eq(st.unknown_frees, 0);
  ck_assert_uint_eq(st.live_blocks, 0);
  ck_assert_uint_eq(st.bytes_in_use, 0);
  spy_counts_t c = spy_counts(spy_of(r));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  free(ps);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

static void *churn(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *held[32] = {0};
  size_t sizes[32] = {0};
  for (int i = 0; i < 20000; i++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 16) % 32);
    if (held[k] != NULL) {
      if (((unsigned char *)held[k])[0] != (unsigned char)sizes[k]) return (void *)1;
      if (k % 2) rmmc_torch_free(held[k], sizes[k], 0, STREAM_A);
      else rmmc_cupy_free(NULL, held[k], 0);
      held[k] = NULL;
    } else {
      sizes[k] = 1 + (seed >> 8) % 5000;
      held[k] = (k % 2) ? rmmc_torch_alloc(sizes[k], 0, STREAM_A) : rmmc_cupy_malloc(NULL, sizes[k], 0);
      if (held[k] == NULL) return (void *)2;
      memset(held[k], (unsigned char)sizes[k], sizes[k]);
    }
  }
  for (int k = 0; k < 32; k++)
    if (held[k] != NULL) rmmc_torch_free(held[k], sizes[k], 0, STREAM_A);
  return NULL;
}

START_TEST(test_plugins_many_threads) {
  rmmc_resource_t *r = install_spy();
  pthread_t t[8];
  for (uintptr_t i = 0; i < 8; i++) pthread_create(&t[i], NULL, churn, (void *)(i + 1));
  for (int i = 0; i < 8; i++) {
    void *rv;
    pthread_join(t[i], &rv);
    ck_assert_ptr_null(rv);
  }
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.allocations, st.deallocations);
  ck_assert_uint_eq(st.unknown_frees, 0);
  ck_assert_uint_eq(st.live_blocks, 0);
  ck_assert_uint_eq(st.bytes_in_use, 0);
  ck_assert_uint_gt(st.peak_bytes, 0);
  spy_counts_t c = spy_counts(spy_of(r));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_uint_eq(c.allocate_calls, st.allocations);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

/* Issue 25, F8: one thread replaces device 0's resource and drops its own
 * reference while 4 threads allocate through the PyTorch and CuPy entry
 * points. The plug-ins used to load the registry's
 * borrowed pointer and retain it only then: under ASan, heap-use-after-free
 * in rmmc_resource_retain within a second. Every allocation must succeed,
 * every free go to the stack that gave the block, and every replaced
 * stack be destroyed once its blocks are back. */
typedef struct replace_worker {
  int stop; /* atomic */
  int index;
  unsigned long ops, failures;
} replace_worker_t;

static void *replace_churn(void *arg) {
  replace_worker_t *w = arg;
  while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
    size_t n = 256 + (w->ops % 16) * 512;
    void *p;
    if (w->ops % 2 == 0) {
      p = rmmc_torch_alloc(n, 0, STREAM_A);
      if (p == NULL) w->failures++;
      else rmmc_torch_free(p, n, 0, STREAM_A);
    } else {
      p = rmmc_cupy_malloc(STREAM_B, n, 0);
      if (p == NULL) w->failures++;
      else rmmc_cupy_free(STREAM_B, p, 0);
    }
    __atomic_fetch_add(&w->ops, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static unsigned long worker_ops(replace_worker_t *w, int n) {
  unsigned long ops = 0;
  for (int i = 0; i < n; i++) ops += __atomic_load_n(&w[i].ops, __ATOMIC_RELAXED);
  return ops;
}

START_TEST(test_plugins_registry_replaced_under_load) {
  /* Cheap stacks, so the sets come fast: a statistics adaptor over one
   * host resource, each freed by the release after its set unless the
   * plug-ins hold blocks of it; every 16th a caching stack (statistics >
   * binning > pool, statistics > fixed_size > pool) over the same host
   * resource. */
  rmmc_resource_t *host;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  rmmc_resource_t *first;
  ck_assert_int_eq(rmmc_statistics_adaptor_create(host, &first), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, first, NULL), RMMC_SUCCESS);
  rmmc_resource_release(first);
  rmmc_plugin_reset_stats();
  enum { T = 4 };
  replace_worker_t w[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    w[i] = (replace_worker_t){0, i, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, replace_churn, &w[i]), 0);
  }
  unsigned sets = 0;
  long elapsed;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    rmmc_resource_t *r, *prev, *below = host, *pool = NULL, *cache = NULL;
    if (sets % 16 == 15) {
      ck_assert_int_eq(rmmc_pool_resource_create(host, NULL, &pool), RMMC_SUCCESS);
      rmmc_fixed_size_options_t fo = RMMC_FIXED_SIZE_OPTIONS_INIT;
      fo.block_size = 8192;
      ck_assert_int_eq(sets % 32 == 15 ? rmmc_binning_resource_create(pool, NULL, &cache)
                                       : rmmc_fixed_size_resource_create(pool, &fo, &cache),
                       RMMC_SUCCESS);
      rmmc_resource_release(pool);
      below = cache;
    }
    ck_assert_int_eq(rmmc_statistics_adaptor_create(below, &r), RMMC_SUCCESS);
    rmmc_resource_release(cache);
    ck_assert_int_eq(rmmc_set_device_resource(0, r, &prev), RMMC_SUCCESS);
    rmmc_resource_release(r);    /* the registry holds it */
    rmmc_resource_release(prev); /* gone, unless the plug-ins hold blocks of it */
    sets++;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* At least 2 s and 1000 sets with 1000 plug-in calls between them, so
     * that a slow machine (or memcheck, which runs one thread at a time)
     * does the same work; 120 s bounds a worker that makes no progress. */
    elapsed = (now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec);
  } while (elapsed < 120000000000L &&
           (elapsed < 2000000000L || sets <= 1000 || worker_ops(w, T) <= 1000));
  unsigned long ops = 0;
  for (int i = 0; i < T; i++) __atomic_store_n(&w[i].stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(w[i].failures == 0, "worker %d: %lu failures: %s", i, w[i].failures,
                  last_plugin_error());
    ops += w[i].ops;
  }
  ck_assert_uint_gt(sets, 1000);
  ck_assert_uint_gt(ops, 1000);
  rmmc_plugin_stats_t st = stats(0);
  ck_assert_uint_eq(st.allocations, st.deallocations);
  ck_assert_uint_eq(st.deallocation_failures, 0);
  ck_assert_uint_eq(st.live_blocks, 0);
  rmmc_registry_clear();
  rmmc_resource_release(host);
}
END_TEST

START_TEST(test_plugins_stats_arguments_and_totals) {
  rmmc_resource_t *r = install_spy();
  rmmc_plugin_stats_t st = RMMC_PLUGIN_STATS_INIT;
  ck_assert_int_eq(rmmc_plugin_get_stats(0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_plugin_get_stats(64, &st), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_plugin_get_stats(-2, &st), RMMC_ERROR_INVALID_ARGUMENT);
  st.size = 8;
  ck_assert_int_eq(rmmc_plugin_get_stats(0, &st), RMMC_ERROR_INVALID_ARGUMENT);
  void *p = rmmc_torch_alloc(100, 0, NULL);
  void *q = rmmc_torch_alloc(50, 0, NULL);
  rmmc_torch_free(q, 50, 0, NULL);
  /* Resetting keeps what is out and restarts the peak from it. */
  rmmc_plugin_reset_stats();
  st = stats(-1);
  ck_assert_uint_eq(st.size, sizeof st);
  ck_assert_uint_eq(st.allocations, 0);
  ck_assert_uint_eq(st.live_blocks, 1);
  ck_assert_uint_eq(st.bytes_in_use, 100);
  ck_assert_uint_eq(st.peak_bytes, 100);
  ck_assert_uint_eq(stats(0).peak_bytes, 100);
  rmmc_torch_free(p, 100, 0, NULL);
  ck_assert_uint_eq(stats(-1).bytes_in_use, 0);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

/* init records the device count and reports a broken environment; run in
 * a fresh process (fork mode) since both are process-wide. */
START_TEST(test_plugins_torch_init) {
  const char *f = getenv("CK_FORK");
  if (f != NULL && strcmp(f, "no") == 0) return;
  setenv("RMMC_ALLOC_CONF", "statistics > > cuda", 1);
  rmmc_resource_t *r = install_spy();
  rmmc_resource_t *r1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r1), RMMC_SUCCESS);
  if (rmmc_device_count() == 0 || rmmc_device_count() > 1)
    ck_assert_int_eq(rmmc_set_device_resource(1, r1, NULL), RMMC_SUCCESS);
  fflush(stderr);
  rmmc_torch_init(1);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "RMMC_ALLOC_CONF is not a valid stack spec"));
  void *p = rmmc_torch_alloc(10, 0, NULL);
  ck_assert_ptr_nonnull(p);
  ck_assert_ptr_null(rmmc_torch_alloc(10, 1, NULL)); /* beyond the count PyTorch gave */
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "device 1 is out of range"));
  ck_assert_uint_eq(spy_counts(spy_of(r1)).allocate_calls, 0);
  rmmc_torch_free(p, 10, 0, NULL);
  rmmc_registry_clear();
  rmmc_resource_release(r);
  rmmc_resource_release(r1);
}
END_TEST

/* One stack per device: each device's blocks come from its own stack and
 * go back to it, whatever device the free names (the map knows better). */
START_TEST(test_plugins_one_stack_per_device) {
  if (rmmc_device_count() > 0) return; /* ids past the GPUs are refused there */
  rmmc_resource_t *r[3];
  for (int d = 0; d < 3; d++) {
    ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r[d]), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_set_device_resource(d, r[d], NULL), RMMC_SUCCESS);
  }
  rmmc_plugin_reset_stats();
  void *t[3], *c[3];
  for (int d = 0; d < 3; d++) {
    t[d] = rmmc_torch_alloc(100 + (size_t)d, d, STREAM_A);
    c[d] = rmmc_cupy_malloc(STREAM_B, 200 + (size_t)d, d);
    ck_assert_ptr_nonnull(t[d]);
    ck_assert_ptr_nonnull(c[d]);
    spy_counts_t k = spy_counts(spy_of(r[d]));
    ck_assert_uint_eq(k.outstanding, 2);
    ck_assert_uint_eq(k.outstanding_bytes, 300 + 2 * (size_t)d);
    ck_assert_uint_eq(stats(d).live_blocks, 2);
  }
  /* Freed naming the wrong device: each block still goes to its own. */
  for (int d = 0; d < 3; d++) {
    rmmc_torch_free(t[d], 100 + (size_t)d, (d + 1) % 3, STREAM_A);
    rmmc_cupy_free(NULL, c[d], (d + 2) % 3);
  }
  for (int d = 0; d < 3; d++) {
    spy_counts_t k = spy_counts(spy_of(r[d]));
    ck_assert_uint_eq(k.outstanding, 0);
    ck_assert_uint_eq(k.deallocate_errors, 0);
    rmmc_plugin_stats_t st = stats(d);
    ck_assert_uint_eq(st.live_blocks, 0);
    ck_assert_uint_eq(st.deallocations, 2);
    ck_assert_uint_eq(st.unknown_frees, 0);
  }
  rmmc_registry_clear();
  for (int d = 0; d < 3; d++) rmmc_resource_release(r[d]);
}
END_TEST

/* set_base_alloc_fn: no allocation of its own holds a host pool's block,
 * so the block is its base; unknown pointers come back as they are. Memory
 * hooks set through the plug-ins reach the device's pool. */
static void count_acquire(void *ptr, size_t bytes, void *user) {
  (void)ptr;
  *(size_t *)user += bytes;
}

START_TEST(test_plugins_base_alloc_and_hooks) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(address_space=64MiB) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, r, NULL), RMMC_SUCCESS);
  size_t acquired = 0;
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = count_acquire;
  h.user = &acquired;
  ck_assert_int_eq(rmmc_plugin_set_memory_hooks(0, &h), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_plugin_set_memory_hooks(-1, &h), RMMC_SUCCESS); /* the current: 0 */
  void *p = rmmc_torch_alloc(5000, 0, STREAM_A);
  ck_assert_ptr_nonnull(p);
  uint64_t reserved = 0;
  ck_assert(rmmc_resource_get_field(r, "reserved", &reserved));
  ck_assert_uint_eq(acquired, reserved);
  ck_assert_uint_gt(acquired, 0);
  size_t size = 0;
  ck_assert_ptr_eq(rmmc_torch_base_alloc(p, &size), p);
  ck_assert_uint_eq(size, 5000);
  char local;
  size = 9;
  ck_assert_ptr_eq(rmmc_torch_base_alloc(&local, &size), &local);
  ck_assert_uint_eq(size, 0);
  ck_assert_ptr_nonnull(strstr(last_plugin_error(), "rmmc_torch_base_alloc"));
  rmmc_torch_free(p, 5000, 0, STREAM_A);
  ck_assert_int_eq(rmmc_plugin_set_memory_hooks(70, &h), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_registry_clear();
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plugins");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_plugins_torch_alloc_and_free);
  tcase_add_test(tc, test_plugins_cupy_free_uses_recorded_size_and_stream);
  tcase_add_test(tc, test_plugins_unknown_and_double_frees_are_counted);
  tcase_add_test(tc, test_plugins_failures_return_null_with_message);
  tcase_add_test(tc, test_plugins_free_goes_to_the_allocating_resource);
  tcase_add_test(tc, test_plugins_limit_holds);
  tcase_add_test(tc, test_plugins_record_stream_and_empty_cache);
  tcase_add_test(tc, test_plugins_map_survives_growth_and_any_order);
  tcase_add_test(tc, test_plugins_many_threads);
  tcase_add_test(tc, test_plugins_registry_replaced_under_load);
  tcase_add_test(tc, test_plugins_stats_arguments_and_totals);
  tcase_add_test(tc, test_plugins_torch_init);
  tcase_add_test(tc, test_plugins_one_stack_per_device);
  tcase_add_test(tc, test_plugins_base_alloc_and_hooks);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
