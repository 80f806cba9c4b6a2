/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The thread-safe adaptor: over a deliberately unsafe resource (its
 * counters are read-modify-write without a lock, and it records how many
 * threads are inside it at once) the counts come out exact and only one
 * thread is ever inside; the conformance battery over a spy; errors and
 * release_cached pass through. Host suite.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static rmmc_status_t make(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_thread_safe_adaptor_create(up, out);
}

static const conformance_case_t cases[] = {{"thread_safe", make, 0}};

/* ---- a resource that is not thread-safe ---- */
typedef struct unsafe {
  rmmc_resource_t base;
  uint64_t allocations, deallocations, releases; /* plain, racy on purpose */
  int inside, most_inside;                       /* atomic: threads inside now, at most */
  rmmc_resource_t *watch; /* rendezvous: wait inside until it reports contention */
} unsafe_t;

static void enter(unsafe_t *u) {
  int now = __atomic_add_fetch(&u->inside, 1, __ATOMIC_SEQ_CST);
  int most = __atomic_load_n(&u->most_inside, __ATOMIC_SEQ_CST);
  while (now > most && !__atomic_compare_exchange_n(&u->most_inside, &most, now, false,
                                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
}

static void leave(unsafe_t *u) { __atomic_sub_fetch(&u->inside, 1, __ATOMIC_SEQ_CST); }

/* Read, dawdle, write: concurrent callers lose updates. */
static void bump(uint64_t *counter) {
  volatile uint64_t v = *counter;
  for (int i = 0; i < 50; i++) v = v + 0;
  sched_yield();
  *counter = v + 1;
}

/* Waits (up to 10 s) inside the resource until the adaptor in front of it
 * has seen another thread find its lock taken. */
static void rendezvous(unsafe_t *u) {
  if (u->watch == NULL) return;
  for (int i = 0; i < 10000; i++) {
    uint64_t contended = 0;
    if (rmmc_resource_get_field(u->watch, "contended", &contended) && contended > 0) return;
    if (__atomic_load_n(&u->most_inside, __ATOMIC_SEQ_CST) > 1) return;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

static rmmc_status_t unsafe_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                     cudaStream_t stream, void **out) {
  unsafe_t *u = (unsafe_t *)r;
  enter(u);
  rendezvous(u);
  bump(&u->allocations);
  void *p = NULL;
  int err = posix_memalign(&p, alignment, bytes);
  leave(u);
  if (err != 0) return rmmc_set_oom_error(r, bytes, stream, "unsafe: posix_memalign");
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t unsafe_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                       size_t alignment, cudaStream_t stream) {
  (void)bytes, (void)alignment, (void)stream;
  unsafe_t *u = (unsafe_t *)r;
  enter(u);
  bump(&u->deallocations);
  free(ptr);
  leave(u);
  return RMMC_SUCCESS;
}

static rmmc_status_t unsafe_release(rmmc_resource_t *r) {
  unsafe_t *u = (unsafe_t *)r;
  enter(u);
  bump(&u->releases);
  leave(u);
  return RMMC_SUCCESS;
}

static void unsafe_destroy(rmmc_resource_t *r) { free(r); }

static const rmmc_resource_ops_t unsafe_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "unsafe",
    .allocate = unsafe_allocate,
    .deallocate = unsafe_deallocate,
    .release_cached = unsafe_release,
    .destroy = unsafe_destroy,
};

static unsafe_t *unsafe_new(void) {
  unsafe_t *u = calloc(1, sizeof *u);
  rmmc_resource_init(&u->base, &unsafe_ops, RMMC_MEMORY_HOST, -1);
  return u;
}

enum { THREADS = 8, ROUNDS = 3000 };

static void *hammer(void *arg) {
  rmmc_resource_t *r = arg;
  for (int i = 0; i < ROUNDS; i++) {
    void *p;
    size_t n = 64 + (size_t)(i % 13) * 32;
    if (rmmc_resource_allocate(r, n, 256, NULL, &p) != RMMC_SUCCESS) return (void *)1;
    memset(p, i & 0xff, n);
    if (rmmc_resource_deallocate(r, p, n, 256, NULL) != RMMC_SUCCESS) return (void *)1;
    if (i % 100 == 0 && rmmc_resource_release_cached(r) != RMMC_SUCCESS) return (void *)1;
  }
  return NULL;
}

static void run_threads(rmmc_resource_t *r, int n) {
  pthread_t th[THREADS];
  for (int i = 0; i < n; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, hammer, r), 0);
  for (int i = 0; i < n; i++) {
    void *failed;
    pthread_join(th[i], &failed);
    ck_assert_ptr_null(failed);
  }
}

START_TEST(test_thread_safe_counts_are_exact) {
  unsafe_t *u = unsafe_new();
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(&u->base, &r), RMMC_SUCCESS);
  rmmc_resource_release(&u->base); /* the adaptor holds it now */
  ck_assert_str_eq(rmmc_resource_name(r), "thread_safe");
  ck_assert_ptr_eq(rmmc_resource_upstream(r), &u->base);
  run_threads(r, THREADS);
  ck_assert_uint_eq(u->allocations, (uint64_t)THREADS * ROUNDS);
  ck_assert_uint_eq(u->deallocations, (uint64_t)THREADS * ROUNDS);
  ck_assert_uint_eq(u->releases, (uint64_t)THREADS * (ROUNDS / 100));
  ck_assert_int_eq(u->most_inside, 1);
  uint64_t contended;
  ck_assert(rmmc_resource_get_field(r, "contended", &contended));
  ck_assert_uint_le(contended, (uint64_t)THREADS * ROUNDS * 2 + THREADS * (ROUNDS / 100));
  rmmc_resource_release(r);
}
END_TEST

static void *one_allocation(void *arg) {
  rmmc_resource_t *r = arg;
  void *p;
  if (rmmc_resource_allocate(r, 512, 256, NULL, &p) != RMMC_SUCCESS) return (void *)1;
  return rmmc_resource_deallocate(r, p, 512, 256, NULL) == RMMC_SUCCESS ? NULL : (void *)1;
}

static void two_at_once(rmmc_resource_t *r) {
  pthread_t a, b;
  void *fa, *fb;
  ck_assert_int_eq(pthread_create(&a, NULL, one_allocation, r), 0);
  ck_assert_int_eq(pthread_create(&b, NULL, one_allocation, r), 0);
  pthread_join(a, &fa);
  pthread_join(b, &fb);
  ck_assert_ptr_null(fa);
  ck_assert_ptr_null(fb);
}

/* Deterministic: the first thread inside waits for the second. Without the
 * adaptor both end up inside (the resource really is unsafe); with it the
 * second waits on the mutex (counted as contention) and never gets in. */
START_TEST(test_thread_safe_serializes_calls) {
  if (!RMMC_TEST_TSAN) { /* the bare resource races on purpose, as TSan would rightly say */
    unsafe_t *bare = unsafe_new();
    bare->watch = &bare->base; /* no "contended" field: waits for a second thread inside */
    two_at_once(&bare->base);
    ck_assert_int_eq(bare->most_inside, 2);
    rmmc_resource_release(&bare->base);
  }

  unsafe_t *u = unsafe_new();
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(&u->base, &r), RMMC_SUCCESS);
  u->watch = r;
  two_at_once(r);
  ck_assert_int_eq(u->most_inside, 1);
  ck_assert_uint_eq(u->allocations, 2);
  uint64_t contended = 0;
  ck_assert(rmmc_resource_get_field(r, "contended", &contended));
  ck_assert_uint_ge(contended, 1);
  rmmc_resource_release(&u->base);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_thread_safe_passes_errors_and_release) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(up, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(up), 2);
  spy_fail_nth(s, 1);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, (cudaStream_t)0x40, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "spy failure injected"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "stack: thread_safe > spy"));
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 4096, (cudaStream_t)0x40, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % 4096, 0);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.last_alignment, 4096);
  ck_assert_ptr_eq(c.last_stream, (cudaStream_t)0x40);
  int x;
  ck_assert_int_eq(rmmc_resource_deallocate(r, &x, 4, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 4096, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).release_calls, 1);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  /* It can be used again after an error: the lock was released. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 10, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 10, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_t *bad = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(NULL, &bad), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(bad);
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(up, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(up), 2);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

int main(void) {
  Suite *s = suite_create("thread_safe");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_thread_safe_counts_are_exact);
  tcase_add_test(tc, test_thread_safe_serializes_calls);
  tcase_add_test(tc, test_thread_safe_passes_errors_and_release);
  suite_add_tcase(s, tc);
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  return rmmc_test_run(s, false);
}
