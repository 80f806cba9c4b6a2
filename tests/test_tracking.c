/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tracking adaptor over a host spy: conformance, the records it keeps,
 * refused frees (unknown pointer, wrong size or alignment, double free)
 * that lose nothing, a free the upstream refuses, the report parsed back,
 * call stacks, many threads, large tables, spec. Host suite.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static rmmc_status_t make_tracking(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  return rmmc_tracking_adaptor_create(upstream, NULL, out);
}

static rmmc_status_t make_tracking_bt(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  rmmc_tracking_options_t o = RMMC_TRACKING_OPTIONS_INIT;
  o.backtrace = true;
  return rmmc_tracking_adaptor_create(upstream, &o, out);
}

static const conformance_case_t cases[] = {{"tracking", make_tracking, 0},
                                           {"tracking+backtrace", make_tracking_bt, 0}};

typedef struct fixture {
  rmmc_resource_t *spy, *r;
  spy_t *s;
} fixture_t;

static fixture_t setup(bool backtrace, int depth) {
  fixture_t f;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f.spy), RMMC_SUCCESS);
  f.s = spy_of(f.spy);
  rmmc_tracking_options_t o = RMMC_TRACKING_OPTIONS_INIT;
  o.backtrace = backtrace;
  if (depth) o.backtrace_depth = depth;
  ck_assert_int_eq(rmmc_tracking_adaptor_create(f.spy, &o, &f.r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(f.r), "tracking");
  return f;
}

static void teardown(fixture_t *f) {
  uint64_t before = spy_destroyed_total();
  rmmc_resource_release(f->r);
  ck_assert_uint_eq(spy_counts(f->s).outstanding, 0);
  ck_assert_uint_eq(spy_counts(f->s).deallocate_errors, 0);
  rmmc_resource_release(f->spy);
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
}

/* Collects for_each's records. */
typedef struct collected {
  rmmc_tracked_allocation_t a[128];
  void *frames0[128];
  int n;
} collected_t;

static void collect(void *ctx, const rmmc_tracked_allocation_t *a) {
  collected_t *c = ctx;
  ck_assert_int_lt(c->n, 128);
  ck_assert_uint_eq(a->size, sizeof *a);
  c->frames0[c->n] = a->nframes > 0 ? a->frames[0] : NULL;
  c->a[c->n] = *a;
  c->a[c->n].frames = NULL; /* not valid after the callback */
  c->n++;
}

static uint64_t my_tid(void) { return (uint64_t)syscall(SYS_gettid); }

START_TEST(test_tracking_records) {
  fixture_t f = setup(false, 0);
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 5000, 4096, (cudaStream_t)0x10, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1, 16, cudaStreamPerThread, &c), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 3);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(f.r), 6001);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(f.r, "outstanding", &v));
  ck_assert_uint_eq(v, 3);
  ck_assert(rmmc_resource_get_field(f.r, "in_use", &v));
  ck_assert_uint_eq(v, 6001);
  collected_t got = {0};
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(f.r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, 3);
  /* Oldest first, with what was asked for. */
  void *ptrs[] = {a, b, c};
  size_t bytes[] = {1000, 5000, 1}, aligns[] = {256, 4096, 256};
  cudaStream_t streams[] = {NULL, (cudaStream_t)0x10, cudaStreamPerThread};
  for (int i = 0; i < 3; i++) {
    ck_assert_ptr_eq(got.a[i].ptr, ptrs[i]);
    ck_assert_uint_eq(got.a[i].bytes, bytes[i]);
    ck_assert_uint_eq(got.a[i].alignment, aligns[i]);
    ck_assert_ptr_eq(got.a[i].stream, streams[i]);
    ck_assert_uint_eq(got.a[i].thread, my_tid());
    ck_assert_uint_eq(got.a[i].serial, (uint64_t)i + 1);
    ck_assert_int_eq(got.a[i].nframes, 0);
    ck_assert_ptr_null(got.frames0[i]);
  }
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, b, 5000, 4096, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 2);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(f.r), 1001);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, c, 1, 16, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(f.r), 0);
  got.n = 0;
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(f.r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, 0);
  /* A failed upstream allocation leaves no record. */
  spy_fail_nth(f.s, 1);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 64, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 0);
  teardown(&f);
}
END_TEST

START_TEST(test_tracking_refused_frees_lose_nothing) {
  fixture_t f = setup(false, 0);
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  char want[128];
  /* A pointer never allocated here. */
  int local;
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, &local, 64, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  snprintf(want, sizeof want, "deallocate of %p (64 bytes) which is not outstanding", (void *)&local);
  ck_assert_msg(strstr(rmmc_last_error_message(), want) != NULL, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 1);
  /* The wrong size: refused, counted, the record stays. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 999, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  snprintf(want, sizeof want, "deallocate of %p with 999 bytes (alignment 256), but it was allocated with 1000 bytes (alignment 256)", a);
  ck_assert_msg(strstr(rmmc_last_error_message(), want) != NULL, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 2);
  /* The wrong alignment. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 4096, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "(alignment 4096), but it was allocated with 1000 bytes (alignment 256)") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 3);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(f.r, "errors", &v));
  ck_assert_uint_eq(v, 3);
  /* None of that reached the upstream; the block is still tracked. */
  ck_assert_uint_eq(spy_counts(f.s).deallocate_calls, 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 1);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(f.r), 1000);
  /* The correct free works. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(f.s).deallocate_calls, 1);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 0);
  /* A second free of it is refused before the upstream. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "already freed") != NULL, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(f.s).deallocate_calls, 1);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 4);
  teardown(&f);
}
END_TEST

/* outer tracking > inner tracking > spy: freeing through the inner one
 * first makes the outer one's upstream refuse; the outer keeps its record. */
START_TEST(test_tracking_keeps_record_when_upstream_refuses) {
  fixture_t f = setup(false, 0);
  rmmc_resource_t *outer;
  ck_assert_int_eq(rmmc_tracking_adaptor_create(f.r, NULL, &outer), RMMC_SUCCESS);
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(outer, 512, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 512, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(outer, a, 512, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "not outstanding") != NULL, "%s", rmmc_last_error_message());
  /* The inner adaptor counted the refusal; the outer still tracks a. */
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 1);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(outer), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(outer), 1);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(outer), 512);
  collected_t got = {0};
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(outer, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, 1);
  ck_assert_ptr_eq(got.a[0].ptr, a);
  ck_assert_uint_eq(got.a[0].serial, 1);
  rmmc_resource_release(outer); /* its record of a goes with it; the memory is back */
  teardown(&f);
}
END_TEST

/* Reads a whole report into a malloc'd string. */
static char *report_of(rmmc_resource_t *r) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(rmmc_tracking_adaptor_report(r, m), RMMC_SUCCESS);
  fclose(m);
  return text;
}

static int count_lines_starting(const char *text, const char *prefix) {
  int n = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, prefix, strlen(prefix)) == 0) n++;
  return n;
}

START_TEST(test_tracking_report_lists_outstanding) {
  fixture_t f = setup(false, 0);
  char *text = report_of(f.r);
  ck_assert_str_eq(text, "rmmc tracking adaptor: no outstanding allocations\n");
  free(text);
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 2 << 20, 256, (cudaStream_t)0x10, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 4096, 512, NULL, &c), RMMC_SUCCESS);
  text = report_of(f.r);
  /* Summary: count and bytes, human-readable and exact. */
  size_t total = 1000 + (2 << 20) + 4096;
  char want[256];
  snprintf(want, sizeof want, "rmmc tracking adaptor: 3 outstanding allocations, 2.00 MiB (%zu bytes)\n", total);
  ck_assert_msg(strncmp(text, want, strlen(want)) == 0, "%s", text);
  ck_assert_int_eq(count_lines_starting(text, "  #"), 3);
  /* Largest first, each with its number, pointer, size, alignment, stream, thread. */
  char *l1 = strstr(text, "\n  #") + 1;
  char *l2 = strstr(l1 + 1, "\n  #") + 1;
  char *l3 = strstr(l2 + 1, "\n  #") + 1;
  snprintf(want, sizeof want, "  #2 %p: 2.00 MiB (2097152 bytes), alignment 256, stream 0x10, thread %llu\n", b,
           (unsigned long long)my_tid());
  ck_assert_msg(strncmp(l1, want, strlen(want)) == 0, "%s", text);
  snprintf(want, sizeof want, "  #3 %p: 4.00 KiB (4096 bytes), alignment 512, stream default, thread %llu\n", c,
           (unsigned long long)my_tid());
  ck_assert_msg(strncmp(l2, want, strlen(want)) == 0, "%s", text);
  snprintf(want, sizeof want, "  #1 %p: 1000 B (1000 bytes), alignment 256, stream default, thread %llu\n", a,
           (unsigned long long)my_tid());
  ck_assert_msg(strcmp(l3, want) == 0, "%s", text);
  free(text);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, b, 2 << 20, 256, NULL), RMMC_SUCCESS);
  text = report_of(f.r);
  ck_assert_int_eq(count_lines_starting(text, "  #"), 2);
  ck_assert_ptr_nonnull(strstr(text, "2 outstanding allocations, 4.98 KiB (5096 bytes)"));
  free(text);
  /* Bad arguments and a failing stream. */
  ck_assert_int_eq(rmmc_tracking_adaptor_report(f.r, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_tracking_adaptor_report(f.spy, stderr), RMMC_ERROR_INVALID_ARGUMENT);
  FILE *full = fopen("/dev/full", "w");
  if (full != NULL) {
    ck_assert_int_eq(rmmc_tracking_adaptor_report(f.r, full), RMMC_ERROR_IO);
    fclose(full);
  }
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(f.r, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, c, 4096, 512, NULL), RMMC_SUCCESS);
  teardown(&f);
}
END_TEST

/* Not inlined, so that it is the first frame of the stack it records. */
__attribute__((noinline)) void *tracking_test_leaky_function(rmmc_resource_t *r, size_t n) {
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, NULL, &p), RMMC_SUCCESS);
  __asm__ volatile("" ::: "memory"); /* no tail call */
  return p;
}

START_TEST(test_tracking_backtrace) {
  fixture_t f = setup(true, 4);
  void *p = tracking_test_leaky_function(f.r, 3000);
  collected_t got = {0};
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(f.r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, 1);
  ck_assert_int_ge(got.a[0].nframes, 1);
  ck_assert_int_le(got.a[0].nframes, 4);
  /* The innermost frame is the return address inside the caller. */
  uintptr_t fn = (uintptr_t)tracking_test_leaky_function, ret = (uintptr_t)got.frames0[0];
  ck_assert_msg(ret > fn && ret < fn + 512, "frame 0 at %#lx, function at %#lx", (unsigned long)ret,
                (unsigned long)fn);
  char *text = report_of(f.r);
  ck_assert_int_eq(count_lines_starting(text, "  #1 "), 1);
  /* One symbolized line per frame, naming this program. */
  ck_assert_int_eq(count_lines_starting(text, "      "), got.a[0].nframes);
  ck_assert_msg(strstr(text, "      ") && strstr(text, "test_tracking"), "%s", text);
  free(text);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, 3000, 256, NULL), RMMC_SUCCESS);
  teardown(&f);
}
END_TEST

START_TEST(test_tracking_large_tables) {
  fixture_t f = setup(false, 0);
  enum { N = 20000 };
  void **p = malloc(N * sizeof *p);
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(rmmc_resource_allocate(f.r, (size_t)(i % 700) + 1, 256, NULL, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), N);
  /* Free every other one, in a scrambled order, then check the rest. */
  uint64_t expect_bytes = 0;
  for (int k = 0; k < N; k++) {
    int i = (int)(((unsigned)k * 7919u) % N);
    if (i % 2 == 0)
      ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[i], (size_t)(i % 700) + 1, 256, NULL), RMMC_SUCCESS);
    else
      expect_bytes += (size_t)(i % 700) + 1;
  }
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), N / 2);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(f.r), expect_bytes);
  for (int i = 1; i < N; i += 2) /* each survivor is still found, with its size */
    ck_assert_int_eq(rmmc_resource_deallocate(f.r, p[i], (size_t)(i % 700) + 1, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 0);
  free(p);
  teardown(&f);
}
END_TEST

/* ---- many threads: each allocates, hands half its blocks to the next
 * thread to free, and keeps a few ---- */

enum { THREADS = 8, PER_THREAD = 3000, KEEP = 5 };

typedef struct handoff {
  rmmc_resource_t *r;
  pthread_barrier_t *barrier;
  int id;
  uint64_t tid;
  void *mine[PER_THREAD];
  struct handoff *all;
} handoff_t;

static size_t hsize(int id, int i) { return (size_t)(id * 131 + i * 17) % 4000 + 1; }

static void *handoff_worker(void *arg) {
  handoff_t *h = arg;
  h->tid = my_tid();
  for (int i = 0; i < PER_THREAD; i++) {
    if (rmmc_resource_allocate(h->r, hsize(h->id, i), 256, (cudaStream_t)(uintptr_t)(h->id + 1), &h->mine[i]) != RMMC_SUCCESS)
      return (void *)1;
    if (i % 2 == 1 && i >= 2 * KEEP &&
        rmmc_resource_deallocate(h->r, h->mine[i - 1], hsize(h->id, i - 1), 256, NULL) != RMMC_SUCCESS)
      return (void *)1;
  }
  pthread_barrier_wait(h->barrier);
  /* Free the next thread's odd blocks (beyond its first KEEP*2). */
  handoff_t *next = &h->all[(h->id + 1) % THREADS];
  for (int i = 2 * KEEP + 1; i < PER_THREAD; i += 2)
    if (rmmc_resource_deallocate(h->r, next->mine[i], hsize(next->id, i), 256, NULL) != RMMC_SUCCESS)
      return (void *)1;
  return NULL;
}

START_TEST(test_tracking_threads) {
  fixture_t f = setup(false, 0);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, THREADS);
  static handoff_t h[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    h[i].r = f.r, h[i].barrier = &barrier, h[i].id = i, h[i].all = h;
    ck_assert_int_eq(pthread_create(&th[i], NULL, handoff_worker, &h[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    ck_assert_ptr_null(ret);
  }
  pthread_barrier_destroy(&barrier);
  /* Each thread kept its first 2*KEEP blocks. */
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), THREADS * 2 * KEEP);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(f.r), 0);
  collected_t got = {0};
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(f.r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, THREADS * 2 * KEEP);
  for (int k = 0; k < got.n; k++) {
    int owner = (int)(uintptr_t)got.a[k].stream - 1;
    ck_assert_int_ge(owner, 0);
    ck_assert_int_lt(owner, THREADS);
    ck_assert_uint_eq(got.a[k].thread, h[owner].tid);
    if (k > 0) ck_assert_uint_lt(got.a[k - 1].serial, got.a[k].serial);
    bool found = false;
    for (int i = 0; i < 2 * KEEP; i++)
      if (h[owner].mine[i] == got.a[k].ptr) found = got.a[k].bytes == hsize(owner, i);
    ck_assert(found);
  }
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < 2 * KEEP; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(f.r, h[t].mine[i], hsize(t, i), 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(f.r), 0);
  teardown(&f);
}
END_TEST

START_TEST(test_tracking_spec_and_options) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("tracking(backtrace=true, depth=8) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "tracking");
  void *p = tracking_test_leaky_function(r, 100);
  collected_t got = {0};
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.n, 1);
  ck_assert_int_ge(got.a[0].nframes, 1);
  ck_assert_int_le(got.a[0].nframes, 8);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("tracking > host", -1, &r), RMMC_SUCCESS);
  p = tracking_test_leaky_function(r, 100);
  got.n = 0;
  ck_assert_int_eq(rmmc_tracking_adaptor_for_each(r, collect, &got), RMMC_SUCCESS);
  ck_assert_int_eq(got.a[0].nframes, 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("tracking(backtrace=true, depth=0) > host", -1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "depth=0 is out of range (1 to 256)") != NULL,
                "%s", rmmc_last_error_message());
  /* Issue 11, F5: the value as written, not a wrapped one. */
  ck_assert_int_eq(rmmc_stack_create("tracking(backtrace=true, depth=99999999999) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "depth=99999999999 is out of range (1 to 256)"),
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_create("tracking(backtrace=true, depth=99999999999999999999) > host",
                                     -1, &r),
                   RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(),
                       "depth=99999999999999999999 is out of range (integers are 64-bit)"),
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_validate("tracking(backtrace=maybe) > host"), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_validate("tracking(stacks=true) > host"), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "(it takes: backtrace, depth)") != NULL, "%s",
                rmmc_last_error_message());
  /* The C API checks the depth too, and retains nothing when it fails. */
  rmmc_resource_t *spy;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  rmmc_tracking_options_t o = RMMC_TRACKING_OPTIONS_INIT;
  o.backtrace = true;
  o.backtrace_depth = 257;
  ck_assert_int_eq(rmmc_tracking_adaptor_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_int_eq(rmmc_tracking_adaptor_create(NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(spy), 0);
  ck_assert_msg(strstr(rmmc_last_error_message(), "not a tracking") != NULL, "%s", rmmc_last_error_message());
  rmmc_resource_release(spy);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tracking");
  conformance_add(s, cases, 2);
  TCase *tc = tcase_create("tracking");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_tracking_records);
  tcase_add_test(tc, test_tracking_refused_frees_lose_nothing);
  tcase_add_test(tc, test_tracking_keeps_record_when_upstream_refuses);
  tcase_add_test(tc, test_tracking_report_lists_outstanding);
  tcase_add_test(tc, test_tracking_backtrace);
  tcase_add_test(tc, test_tracking_large_tables);
  tcase_add_test(tc, test_tracking_threads);
  tcase_add_test(tc, test_tracking_spec_and_options);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
