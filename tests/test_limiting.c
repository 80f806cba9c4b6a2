/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The limiting adaptor over a host spy: conformance, the cap at its exact
 * boundary with rounding to the alignment, rollback when the upstream
 * fails, refused frees, the cap under many threads, spec parsing. Host suite.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static rmmc_status_t make_limiting(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  return rmmc_limiting_adaptor_create(upstream, (size_t)1 << 30, out);
}

static const conformance_case_t cases[] = {{"limiting", make_limiting, 0}};

typedef struct fixture {
  rmmc_resource_t *spy, *r;
  spy_t *s;
} fixture_t;

static fixture_t setup(size_t limit) {
  fixture_t f;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f.spy), RMMC_SUCCESS);
  f.s = spy_of(f.spy);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(f.spy, limit, &f.r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(f.r), "limiting");
  ck_assert_ptr_eq(rmmc_resource_upstream(f.r), f.spy);
  return f;
}

static void teardown(fixture_t *f) {
  uint64_t before = spy_destroyed_total();
  rmmc_resource_release(f->r);
  ck_assert_uint_eq(spy_counts(f->s).outstanding, 0);
  rmmc_resource_release(f->spy);
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
}

START_TEST(test_limiting_boundary_exact) {
  fixture_t f = setup(4096);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_limit(f.r), 4096);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  void *a, *b, *c;
  /* 1000 bytes count as 1024 (rounded to 256). */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 1024);
  /* Exactly the remaining 3072 bytes fit. */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 3072, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 4096);
  /* One more byte does not, and the upstream is not asked. */
  uint64_t calls = spy_counts(f.s).allocate_calls;
  c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1, 256, (cudaStream_t)0x30, &c),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  ck_assert_uint_eq(spy_counts(f.s).allocate_calls, calls);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "limiting resource could not allocate") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "limit 4.00 KiB (4096 bytes)") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "4.00 KiB in use through the adaptor") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stream 0x30") != NULL, "%s", m);
  /* The outermost wrapper adds the stack's figures. */
  ck_assert_msg(strstr(m, "stack: limiting (in use 4.00 KiB) > spy (in use 3.98 KiB)") != NULL,
                "%s", m);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 4096);
  /* Freeing the 1000-byte block gives back 1024: 1024 fits, 1025 (1280) does not. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 3072);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1025, 256, NULL, &c), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1024, 256, NULL, &c), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, c, 1024, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, b, 3072, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  /* A larger alignment counts whole: 1 byte at 4096 takes the whole limit. */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1, 4096, NULL, &a), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)a % 4096, 0);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 4096);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1, 256, NULL, &c), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1, 4096, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  /* A request larger than the whole limit fails too. */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 5000, 256, NULL, &c), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  teardown(&f);
}
END_TEST

START_TEST(test_limiting_zero_limit_refuses_everything) {
  fixture_t f = setup(0);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 0, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(f.s).allocate_calls, 0);
  teardown(&f);
}
END_TEST

START_TEST(test_limiting_rolls_back_when_upstream_fails) {
  fixture_t f = setup(1 << 20);
  void *a, *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 512, 256, NULL, &a), RMMC_SUCCESS);
  spy_fail_nth(f.s, 1);
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 100000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  /* The upstream's own message comes through. */
  ck_assert_msg(strstr(rmmc_last_error_message(), "spy failure injected") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 512);
  /* The whole limit is available again. */
  ck_assert_int_eq(rmmc_resource_allocate(f.r, (1 << 20) - 512, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 1 << 20);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, p, (1 << 20) - 512, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 512, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  teardown(&f);
}
END_TEST

START_TEST(test_limiting_refuses_bad_frees) {
  fixture_t f = setup(1 << 20);
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  uint64_t frees = spy_counts(f.s).deallocate_calls;
  /* More than is in use cannot be legitimate: refused before the upstream. */
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 5000, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "only 1024 bytes are in use") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(f.s).deallocate_calls, frees);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 1024);
  /* A pointer the upstream refuses leaves the count alone. */
  int local;
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, &local, 256, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 1024);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  /* The spy saw one refused free: the foreign pointer. */
  ck_assert_uint_eq(spy_counts(f.s).deallocate_errors, 1);
  teardown(&f);
}
END_TEST

START_TEST(test_limiting_accessors_and_describe) {
  fixture_t f = setup(12345);
  uint64_t v = 0;
  ck_assert(rmmc_resource_get_field(f.r, "limit", &v));
  ck_assert_uint_eq(v, 12345);
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(f.r, 300, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(f.r, "in_use", &v));
  ck_assert_uint_eq(v, 512);
  ck_assert_int_eq(rmmc_resource_deallocate(f.r, a, 300, 256, NULL), RMMC_SUCCESS);
  /* Accessors on another kind of resource say so. */
  rmmc_clear_last_error();
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_limit(f.spy), 0);
  ck_assert_msg(strstr(rmmc_last_error_message(), "the resource is a spy, not a limiting") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(NULL), 0);
  ck_assert_msg(strstr(rmmc_last_error_message(), "resource is NULL") != NULL, "%s",
                rmmc_last_error_message());
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_limiting_adaptor_create(NULL, 1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(f.spy, 1, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  teardown(&f);
}
END_TEST

/* ---- many threads ---- */

enum { THREADS = 8, HOLD = 24, ROUNDS = 100, BLOCK = 256, LIMIT_BLOCKS = 40 };

typedef struct worker {
  rmmc_resource_t *r;
  pthread_barrier_t *barrier;
  uint64_t ok, refused;
} worker_t;

/* Each round every thread asks for HOLD blocks while nobody frees, then
 * all free together: the threads ask for 8 * 24 blocks against a limit of
 * 40 at the same time. */
static void *limit_worker(void *arg) {
  worker_t *w = arg;
  void *held[HOLD];
  for (int round = 0; round < ROUNDS; round++) {
    int n = 0;
    for (int i = 0; i < HOLD; i++) {
      rmmc_status_t st = rmmc_resource_allocate(w->r, BLOCK, 256, NULL, &held[n]);
      if (st == RMMC_SUCCESS) n++, w->ok++;
      else if (st == RMMC_ERROR_OUT_OF_MEMORY) w->refused++;
      else return (void *)1;
    }
    pthread_barrier_wait(w->barrier);
    for (int i = 0; i < n; i++)
      if (rmmc_resource_deallocate(w->r, held[i], BLOCK, 256, NULL) != RMMC_SUCCESS) return (void *)1;
    pthread_barrier_wait(w->barrier);
  }
  return NULL;
}

START_TEST(test_limiting_exact_under_threads) {
  fixture_t f = setup((size_t)LIMIT_BLOCKS * BLOCK);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t th[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){f.r, &barrier, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, limit_worker, &w[i]), 0);
  }
  uint64_t ok = 0, refused = 0;
  for (int i = 0; i < THREADS; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    ck_assert_ptr_null(ret);
    ok += w[i].ok;
    refused += w[i].refused;
  }
  pthread_barrier_destroy(&barrier);
  /* Exactly the limit's worth succeeded each round: never more (the cap
   * holds) and never less (no request was refused while it would fit, as
   * an add-then-roll-back counter may). */
  ck_assert_uint_eq(ok, (uint64_t)LIMIT_BLOCKS * ROUNDS);
  ck_assert_uint_eq(refused, (uint64_t)(THREADS * HOLD - LIMIT_BLOCKS) * ROUNDS);
  spy_counts_t c = spy_counts(f.s);
  /* Only admitted requests reached the upstream, which never held more
   * than the limit. */
  ck_assert_uint_eq(c.allocate_calls, ok);
  ck_assert_uint_eq(c.peak_bytes, (uint64_t)LIMIT_BLOCKS * BLOCK);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(f.r), 0);
  teardown(&f);
}
END_TEST

/* ---- stack specs ---- */

START_TEST(test_limiting_spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=1MiB) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "limiting");
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_limit(r), 1 << 20);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1 << 20, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1, 256, NULL, &(void *){NULL}), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1 << 20, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* A percentage of a host stack is of the host's memory. */
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=50%) > host", -1, &r), RMMC_SUCCESS);
  size_t total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_limit(r), (size_t)((double)total * 0.5) & ~(size_t)255);
  rmmc_resource_release(r);
  /* The limit is required. */
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("limiting > host", -1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "limiting needs a limit") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=lots) > host", -1, &r), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "'lots' is not a size") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_validate("limiting(max=1GiB) > host"), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "limiting has no option 'max' (it takes: limit)") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_validate("limiting(limit=4GiB)"), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "limiting needs an upstream") != NULL, "%s",
                rmmc_last_error_message());
  char help[4096];
  rmmc_stack_help(help, sizeof help);
  ck_assert_ptr_nonnull(strstr(help, "limiting"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("limiting");
  conformance_add(s, cases, 1);
  TCase *tc = tcase_create("limiting");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_limiting_boundary_exact);
  tcase_add_test(tc, test_limiting_zero_limit_refuses_everything);
  tcase_add_test(tc, test_limiting_rolls_back_when_upstream_fails);
  tcase_add_test(tc, test_limiting_refuses_bad_frees);
  tcase_add_test(tc, test_limiting_accessors_and_describe);
  tcase_add_test(tc, test_limiting_exact_under_threads);
  tcase_add_test(tc, test_limiting_spec);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
