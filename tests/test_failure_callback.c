/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failure-callback adaptor over a host spy: the conformance battery,
 * reclaim-and-retry with a user callback, giving up with the original
 * out-of-memory status and message, other errors never retried, the
 * built-in release_cached form, and concurrent retries. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "conformance.h"
#include "faulty.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

static bool decline(size_t bytes, void *user) {
  (void)bytes, (void)user;
  return false;
}

static rmmc_status_t make_user(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_failure_callback_adaptor_create(up, decline, NULL, out);
}

static rmmc_status_t make_builtin(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_failure_callback_adaptor_create_release_cached(up, 2, out);
}

static const conformance_case_t cases[] = {
    {"failure_callback(user)", make_user, 0},
    {"failure_callback(release_cached)", make_builtin, 0},
};

/* A callback that frees memory (lifts the spy's capacity) on its
 * `free_at`-th call, returns `answer` until then, and can clobber the
 * thread's error state as real callbacks might. */
typedef struct reclaimer {
  spy_t *spy;
  uint64_t calls, free_at;
  bool answer, clobber;
  size_t last_bytes;
} reclaimer_t;

static bool reclaim(size_t bytes, void *user) {
  reclaimer_t *c = user;
  c->calls++;
  c->last_bytes = bytes;
  if (c->clobber) {
    (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "callback noise");
    (void)rmmc_set_cuda_error(cudaErrorInvalidValue, "callback cuda noise");
  }
  if (c->free_at != 0 && c->calls == c->free_at) spy_set_capacity(c->spy, SIZE_MAX);
  return c->answer;
}

START_TEST(test_failure_callback_retries_until_success) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  reclaimer_t c = {.spy = s, .free_at = 3, .answer = true};
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, reclaim, &c, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "failure_callback");
  ck_assert_ptr_eq(rmmc_resource_upstream(r), up);
  /* The upstream fails the first 3 calls (capacity 0) until the callback
   * frees memory on its third call. */
  spy_set_capacity(s, 0);
  unsigned char *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 512, (cudaStream_t)0x30, (void **)&p), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq((uintptr_t)p % 512, 0);
  memset(p, 0x77, 5000);
  ck_assert_uint_eq(p[4999], 0x77);
  ck_assert_uint_eq(c.calls, 3);
  ck_assert_uint_eq(c.last_bytes, 5000);
  spy_counts_t sc = spy_counts(s);
  ck_assert_uint_eq(sc.allocate_calls, 4);
  ck_assert_uint_eq(sc.allocate_failures, 3);
  ck_assert_uint_eq(sc.last_alignment, 512);
  ck_assert_ptr_eq(sc.last_stream, (cudaStream_t)0x30);
  ck_assert_uint_eq(field(r, "callbacks"), 3);
  ck_assert_uint_eq(field(r, "recovered"), 1);
  ck_assert_uint_eq(field(r, "gave_up"), 0);
  /* No failure: the callback is not asked. */
  void *q;
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_uint_eq(c.calls, 3);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 100, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 5000, 512, (cudaStream_t)0x30), RMMC_SUCCESS);
  sc = spy_counts(s);
  ck_assert_uint_eq(sc.outstanding, 0);
  ck_assert_ptr_eq(sc.last_stream, (cudaStream_t)0x30);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

/* Says yes while *user counts down, then no. */
static bool twice(size_t bytes, void *user) {
  (void)bytes;
  uint64_t *left = user;
  if (*left == 0) return false;
  (*left)--;
  return true;
}

START_TEST(test_failure_callback_gives_up_with_original_oom) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  spy_set_capacity(s, 1000);
  /* What the upstream alone says. */
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(up, 5000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  char alone[1024];
  snprintf(alone, sizeof alone, "%s", rmmc_last_error_message());
  char *cut = strstr(alone, "; stack:");
  ck_assert_ptr_nonnull(cut);
  *cut = '\0'; /* the upstream's own message, without the stack figures */

  reclaimer_t c = {.spy = s, .answer = false, .clobber = true};
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, reclaim, &c, &r), RMMC_SUCCESS);
  rmmc_clear_last_error();
  p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_uint_eq(c.calls, 1);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strncmp(m, alone, strlen(alone)) == 0, "'%s' does not start with '%s'", m, alone);
  ck_assert_msg(strstr(m, "spy failure injected") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "gave up after 0 retries") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stack: failure_callback > spy") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "noise") == NULL, "callback's error leaked: %s", m);
  ck_assert_int_eq(rmmc_last_cuda_error(), cudaSuccess);

  ck_assert_int_eq(spy_counts(s).allocate_calls, 2);
  rmmc_resource_release(r);

  /* Yes twice, then no: two retries, three questions, still the OOM. */
  uint64_t yes_left = 2;
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, twice, &yes_left, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "gave up after 2 retries") != NULL, "%s", m);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 5);
  ck_assert_uint_eq(field(r, "callbacks"), 3);
  ck_assert_uint_eq(field(r, "gave_up"), 1);
  ck_assert_uint_eq(field(r, "recovered"), 0);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

static uint64_t counted_calls;
static bool count_and_retry(size_t bytes, void *user) {
  (void)bytes, (void)user;
  __atomic_add_fetch(&counted_calls, 1, __ATOMIC_RELAXED);
  return true;
}

START_TEST(test_failure_callback_other_errors_pass_through) {
  rmmc_resource_t *spy, *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(faulty_create(spy, &up), RMMC_SUCCESS);
  faulty_t *f = faulty_of(up);
  counted_calls = 0;
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, count_and_retry, NULL, &r), RMMC_SUCCESS);
  const rmmc_status_t others[] = {RMMC_ERROR_CUDA, RMMC_ERROR_INVALID_ARGUMENT,
                                  RMMC_ERROR_NOT_SUPPORTED, RMMC_ERROR_NO_DEVICE};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    faulty_fail_allocate(f, others[i], 1);
    void *p = (void *)1;
    ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), others[i]);
    ck_assert_ptr_null(p);
    char want[64];
    snprintf(want, sizeof want, "faulty: injected %s", rmmc_status_name(others[i]));
    ck_assert_str_eq(rmmc_last_error_message(), want);
  }
  ck_assert_uint_eq(counted_calls, 0);
  ck_assert_uint_eq(faulty_counts(f).allocate_calls, 4);
  ck_assert_uint_eq(field(r, "callbacks"), 0);
  /* An OOM followed by another error on the retry: that error comes back. */
  faulty_fail_allocate(f, RMMC_ERROR_OUT_OF_MEMORY, 1);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(counted_calls, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  /* Deallocate errors pass through too, and lose nothing. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  faulty_fail_deallocate(f, RMMC_ERROR_CUDA, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_ERROR_CUDA);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_failure_callback_builtin_release_cached) {
  rmmc_resource_t *spy, *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(faulty_create(spy, &up), RMMC_SUCCESS);
  faulty_t *f = faulty_of(up);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(up, 1, &r), RMMC_SUCCESS);
  /* One failure: release_cached reaches the spy, the retry succeeds. */
  spy_fail_nth(s, 1);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).release_calls, 1);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  ck_assert_uint_eq(field(r, "recovered"), 1);
  ck_assert_uint_eq(field(r, "retries"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
  /* Out of memory for good: one release, one retry, then the OOM. */
  spy_set_capacity(s, 0);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rmmc_last_error_message(), "gave up after 1 retry") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(s).release_calls, 2);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 4);
  /* release_cached failing stops the retries: no second allocate. */
  faulty_fail_release(f, RMMC_ERROR_CUDA, 1);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rmmc_last_error_message(), "spy failure injected") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(s).release_calls, 2);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 5);
  ck_assert_uint_eq(field(r, "gave_up"), 2);
  rmmc_resource_release(r);
  /* retries=3: three releases, four attempts. */
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(up, 3, &r), RMMC_SUCCESS);
  spy_counts_t before = spy_counts(s);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(spy_counts(s).release_calls - before.release_calls, 3);
  ck_assert_uint_eq(spy_counts(s).allocate_calls - before.allocate_calls, 4);
  ck_assert_uint_eq(field(r, "callbacks"), 4);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_failure_callback_bad_arguments) {
  rmmc_resource_t *up, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "callback is NULL"));
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(NULL, decline, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, decline, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(up, 0, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "retries=0"));
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(up, -5, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(NULL, 1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  /* Nothing was retained by the failed creates. */
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

typedef struct worker {
  rmmc_resource_t *r;
  int ok;
} worker_t;

static void *retry_worker(void *arg) {
  worker_t *w = arg;
  for (int i = 0; i < 2000; i++) {
    void *p;
    size_t n = 256 + (size_t)(i % 17) * 100;
    if (rmmc_resource_allocate(w->r, n, 256, NULL, &p) != RMMC_SUCCESS) continue;
    ((char *)p)[n - 1] = 1;
    if (rmmc_resource_deallocate(w->r, p, n, 256, NULL) == RMMC_SUCCESS) w->ok++;
  }
  return NULL;
}

START_TEST(test_failure_callback_concurrent_retries) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  counted_calls = 0;
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(up, count_and_retry, NULL, &r), RMMC_SUCCESS);
  spy_fail_every(s, 3);
  enum { T = 8 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){r, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, retry_worker, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  spy_fail_every(s, 0);
  /* Every allocation succeeded in the end; each upstream failure asked the
   * callback exactly once. */
  for (int i = 0; i < T; i++) ck_assert_int_eq(w[i].ok, 2000);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_gt(c.allocate_failures, 0);
  ck_assert_uint_eq(counted_calls, c.allocate_failures);
  ck_assert_uint_eq(field(r, "callbacks"), c.allocate_failures);
  ck_assert_uint_eq(c.allocate_calls - c.allocate_failures, (uint64_t)T * 2000);
  ck_assert_uint_le(field(r, "recovered"), c.allocate_failures);
  ck_assert_uint_gt(field(r, "recovered"), 0);
  ck_assert_uint_eq(c.outstanding, 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

int main(void) {
  Suite *s = suite_create("failure_callback");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_failure_callback_retries_until_success);
  tcase_add_test(tc, test_failure_callback_gives_up_with_original_oom);
  tcase_add_test(tc, test_failure_callback_other_errors_pass_through);
  tcase_add_test(tc, test_failure_callback_builtin_release_cached);
  tcase_add_test(tc, test_failure_callback_bad_arguments);
  tcase_add_test(tc, test_failure_callback_concurrent_retries);
  suite_add_tcase(s, tc);
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  return rmmc_test_run(s, false);
}
