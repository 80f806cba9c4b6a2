/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc-bench's measurement engine (tools/bench_engine.c) over a spy and a
 * recording resource: the calls it makes match the op sequence it claims,
 * sequences are seeded and identical across runs, each thread has its own
 * stream key, failures of allocate or deallocate and figures not back to 0
 * are reported (with every block freed), the budget shortens runs, bad
 * arguments are refused, and the engine releases the reference it is given.
 * Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

/* ---- a recording resource: host memory, remembers what it was asked ---- */

#define MAX_KEYS 16

typedef struct recorder {
  rmmc_resource_t base;
  pthread_mutex_t lock;
  uint64_t allocs, deallocs, hash, size_sum;
  size_t min_seen, max_seen;
  cudaStream_t keys[MAX_KEYS];
  int nkeys;
  uint64_t fail_dealloc_nth; /* the Nth deallocate fails (0: never) */
} recorder_t;

static void note_key(recorder_t *rec, cudaStream_t s) {
  for (int i = 0; i < rec->nkeys; i++)
    if (rec->keys[i] == s) return;
  if (rec->nkeys < MAX_KEYS) rec->keys[rec->nkeys++] = s;
}

static rmmc_status_t rec_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                  cudaStream_t stream, void **out) {
  recorder_t *rec = (recorder_t *)r;
  void *p = NULL;
  if (posix_memalign(&p, alignment, bytes) != 0)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "recorder: no memory");
  pthread_mutex_lock(&rec->lock);
  rec->allocs++;
  rec->hash = rec->hash * 1000003u + bytes;
  rec->size_sum += bytes;
  if (bytes < rec->min_seen) rec->min_seen = bytes;
  if (bytes > rec->max_seen) rec->max_seen = bytes;
  note_key(rec, stream);
  pthread_mutex_unlock(&rec->lock);
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t rec_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t alignment,
                                    cudaStream_t stream) {
  (void)alignment;
  recorder_t *rec = (recorder_t *)r;
  pthread_mutex_lock(&rec->lock);
  rec->deallocs++;
  bool fail = rec->fail_dealloc_nth != 0 && rec->deallocs == rec->fail_dealloc_nth;
  note_key(rec, stream);
  pthread_mutex_unlock(&rec->lock);
  if (fail) /* as the contract says: an unknown pointer is left as it was */
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "recorder: refusing %p (%zu bytes)", ptr,
                          bytes);
  free(ptr);
  return RMMC_SUCCESS;
}

static void rec_destroy(rmmc_resource_t *r) {
  recorder_t *rec = (recorder_t *)r;
  pthread_mutex_destroy(&rec->lock);
  free(rec);
}

static const rmmc_resource_ops_t rec_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "recorder",
    .allocate = rec_allocate,
    .deallocate = rec_deallocate,
    .destroy = rec_destroy,
};

static recorder_t *recorder_new(void) {
  recorder_t *rec = calloc(1, sizeof *rec);
  ck_assert_ptr_nonnull(rec);
  rmmc_resource_init(&rec->base, &rec_ops, RMMC_MEMORY_HOST, -1);
  pthread_mutex_init(&rec->lock, NULL);
  rec->min_seen = SIZE_MAX;
  return rec;
}

/* ---- helpers ---- */

static bench_params_t params(int threads, size_t ops, int repeat) {
  return (bench_params_t){.threads = threads, .ops = ops, .repeat = repeat, .seed = 1,
                          .budget_s = 0};
}

static const bench_case_t pair_4k = {.pattern = BENCH_PAIR, .min_bytes = 4096, .max_bytes = 4096};
static const bench_case_t random_small = {.pattern = BENCH_RANDOM, .min_bytes = 1000,
                                          .max_bytes = 3000, .live = 8};

static void assert_stats(const bench_result_t *res, int threads) {
  ck_assert_msg(res->ok, "measurement failed: %s", res->error);
  ck_assert_str_eq(res->error, "");
  ck_assert(res->min > 0);
  ck_assert(res->min <= res->median && res->median <= res->max);
  for (int i = 0; i < res->runs; i++) ck_assert(res->ns[i] >= res->min && res->ns[i] <= res->max);
  double expect = threads * 1e9 / res->median;
  ck_assert(res->ops_per_s > expect * 0.999 && res->ops_per_s < expect * 1.001);
}

/* ---- tests ---- */

START_TEST(test_bench_pair_calls_match_sequence) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  bench_params_t p = params(2, 100, 3);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  assert_stats(&res, 2);
  ck_assert_int_eq(res.runs, 3);
  ck_assert_uint_eq(res.ops, 100);
  spy_counts_t c = spy_counts(spy_of(r));
  /* 2 threads x (1 warm-up + 3 timed runs) x 50 pairs */
  ck_assert_uint_eq(c.allocate_calls, 400);
  ck_assert_uint_eq(c.deallocate_calls, 400);
  ck_assert_uint_eq(c.allocate_failures, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.last_bytes, 4096);
  ck_assert_uint_eq(c.last_alignment, RMMC_DEFAULT_ALIGNMENT);
  ck_assert(c.peak_bytes >= 4096 && c.peak_bytes <= 2 * 4096);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1); /* the engine released its reference */
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_random_keeps_live_blocks) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  bench_params_t p = params(3, 40, 2);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &random_small, &p, &res);
  assert_stats(&res, 3);
  spy_counts_t c = spy_counts(spy_of(r));
  /* 3 threads x 3 runs x (8 fill + 20 steps); every block freed */
  ck_assert_uint_eq(c.allocate_calls, 3 * 3 * 28);
  ck_assert_uint_eq(c.deallocate_calls, 3 * 3 * 28);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_uint_eq(c.outstanding, 0);
  /* All 24 blocks are live together once every thread has filled. */
  ck_assert_uint_ge(c.peak_bytes, 24 * 1000);
  ck_assert_uint_le(c.peak_bytes, 24 * 3000);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_sequences_are_seeded) {
  recorder_t *a = recorder_new(), *b = recorder_new(), *c = recorder_new();
  bench_params_t p = params(1, 200, 1);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(&a->base), &random_small, &p, &res);
  assert_stats(&res, 1);
  bench_measure(rmmc_resource_retain(&b->base), &random_small, &p, &res);
  assert_stats(&res, 1);
  p.seed = 2;
  bench_measure(rmmc_resource_retain(&c->base), &random_small, &p, &res);
  assert_stats(&res, 1);
  ck_assert_uint_eq(a->allocs, 2 * (8 + 100));
  ck_assert_uint_eq(a->hash, b->hash);
  ck_assert_uint_ne(a->hash, c->hash);
  ck_assert_uint_ge(a->min_seen, 1000);
  ck_assert_uint_le(a->max_seen, 3000);
  ck_assert_uint_lt(a->min_seen, a->max_seen);
  rmmc_resource_release(&a->base);
  rmmc_resource_release(&b->base);
  rmmc_resource_release(&c->base);
}
END_TEST

START_TEST(test_bench_threads_have_own_streams) {
  recorder_t *a = recorder_new(), *b = recorder_new();
  bench_params_t p = params(4, 100, 1);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(&a->base), &random_small, &p, &res);
  assert_stats(&res, 4);
  bench_measure(rmmc_resource_retain(&b->base), &random_small, &p, &res);
  assert_stats(&res, 4);
  ck_assert_int_eq(a->nkeys, 4);
  for (int i = 0; i < a->nkeys; i++) {
    uintptr_t key = (uintptr_t)a->keys[i];
    ck_assert_msg(key > 2, "stream key %lu is a special CUDA handle", (unsigned long)key);
  }
  /* Thread i has seed + i: the same multiset of sizes in both measurements. */
  ck_assert_uint_eq(a->size_sum, b->size_sum);
  ck_assert_uint_eq(a->allocs, 4 * 2 * (8 + 50));
  rmmc_resource_release(&a->base);
  rmmc_resource_release(&b->base);
}
END_TEST

START_TEST(test_bench_one_stream_for_every_thread) {
  recorder_t *a = recorder_new();
  bench_params_t p = params(4, 100, 1);
  p.one_stream = true;
  bench_result_t res;
  bench_measure(rmmc_resource_retain(&a->base), &random_small, &p, &res);
  assert_stats(&res, 4);
  ck_assert_int_eq(a->nkeys, 1); /* every thread's calls name the same stream */
  ck_assert_msg((uintptr_t)a->keys[0] > 2, "stream key %lu is a special CUDA handle",
                (unsigned long)(uintptr_t)a->keys[0]);
  ck_assert_uint_eq(a->allocs, 4 * 2 * (8 + 50)); /* all four threads ran */
  rmmc_resource_release(&a->base);
}
END_TEST

START_TEST(test_bench_malloc_baseline) {
  bench_params_t p = params(2, 200, 3);
  bench_result_t res;
  bench_measure(NULL, &pair_4k, &p, &res);
  assert_stats(&res, 2);
  bench_measure(NULL, &random_small, &p, &res);
  assert_stats(&res, 2);
  ck_assert_int_eq(res.runs, 3);
}
END_TEST

START_TEST(test_bench_reports_allocation_failure_in_warm_up) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  spy_fail_nth(spy_of(r), 37);
  bench_params_t p = params(2, 100, 3);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &random_small, &p, &res);
  ck_assert(!res.ok);
  ck_assert_int_eq(res.runs, 0);
  ck_assert_msg(strstr(res.error, "allocate(") && strstr(res.error, "ERROR_OUT_OF_MEMORY") &&
                    strstr(res.error, "spy failure injected"),
                "message: %s", res.error);
  spy_counts_t c = spy_counts(spy_of(r));
  ck_assert_uint_eq(c.allocate_failures, 1);
  ck_assert_uint_eq(c.outstanding, 0); /* the other thread's blocks were freed too */
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_reports_allocation_failure_in_timed_run) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  spy_fail_nth(spy_of(r), 120); /* warm-up 50, run 1 50, then the 20th of run 2 */
  bench_params_t p = params(1, 100, 5);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  ck_assert(!res.ok);
  ck_assert_int_eq(res.runs, 1);
  ck_assert_ptr_nonnull(strstr(res.error, "thread 0: allocate(4096 bytes)"));
  spy_counts_t c = spy_counts(spy_of(r));
  ck_assert_uint_eq(c.allocate_calls, 120);
  ck_assert_uint_eq(c.outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_reports_deallocate_failure) {
  recorder_t *rec = recorder_new();
  rec->fail_dealloc_nth = 30;
  bench_params_t p = params(1, 100, 2);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(&rec->base), &random_small, &p, &res);
  ck_assert(!res.ok);
  ck_assert_msg(strstr(res.error, "deallocate(") && strstr(res.error, "ERROR_UNKNOWN_POINTER"),
                "message: %s", res.error);
  /* The refused block was retried by the drain: nothing leaks. */
  ck_assert_uint_eq(rec->allocs + 1, rec->deallocs);
  rmmc_resource_release(&rec->base);
}
END_TEST

START_TEST(test_bench_reports_figures_not_back_to_zero) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  void *held;
  ck_assert_int_eq(rmmc_resource_allocate(r, 512, 256, NULL, &held), RMMC_SUCCESS);
  bench_params_t p = params(1, 20, 2);
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  ck_assert(!res.ok);
  ck_assert_msg(strstr(res.error, "spy reports in_use = 512 (expected 0)"), "message: %s", res.error);
  ck_assert_int_eq(rmmc_resource_deallocate(r, held, 512, 256, NULL), RMMC_SUCCESS);
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  assert_stats(&res, 1);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_budget_shortens_runs) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  bench_params_t p = params(2, 1000000, 2);
  p.budget_s = 1e-6;
  bench_result_t res;
  bench_measure(rmmc_resource_retain(r), &random_small, &p, &res);
  assert_stats(&res, 2);
  ck_assert_uint_ge(res.ops, 2);
  ck_assert_uint_le(res.ops, 100000);
  ck_assert_uint_eq(res.ops % 2, 0);
  spy_counts_t c = spy_counts(spy_of(r));
  ck_assert_uint_eq(c.allocate_calls, c.deallocate_calls);
  ck_assert_uint_eq(c.outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bench_rejects_bad_arguments) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  bench_result_t res;
  bench_params_t good = params(1, 10, 1), p;
  bench_case_t c;
  p = good, p.ops = 11;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  ck_assert(!res.ok && strstr(res.error, "ops must be even"));
  p = good, p.threads = 0;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  ck_assert(!res.ok && strstr(res.error, "threads"));
  p = good, p.repeat = BENCH_MAX_REPEAT + 1;
  bench_measure(rmmc_resource_retain(r), &pair_4k, &p, &res);
  ck_assert(!res.ok && strstr(res.error, "repeat"));
  c = random_small, c.live = 0;
  bench_measure(rmmc_resource_retain(r), &c, &good, &res);
  ck_assert(!res.ok && strstr(res.error, "live"));
  c = random_small, c.min_bytes = 5000;
  bench_measure(rmmc_resource_retain(r), &c, &good, &res);
  ck_assert(!res.ok && strstr(res.error, "min <= max"));
  c = pair_4k, c.max_bytes = 8192;
  bench_measure(rmmc_resource_retain(r), &c, &good, &res);
  ck_assert(!res.ok && strstr(res.error, "pair wants min == max"));
  bench_measure(rmmc_resource_retain(r), NULL, &good, &res);
  ck_assert(!res.ok && strstr(res.error, "NULL"));
  ck_assert_uint_eq(spy_counts(spy_of(r)).allocate_calls, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1); /* released on refusal too */
  rmmc_resource_release(r);
}
END_TEST

static Suite *bench_suite(void) {
  Suite *s = suite_create("bench");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_bench_pair_calls_match_sequence);
  tcase_add_test(tc, test_bench_random_keeps_live_blocks);
  tcase_add_test(tc, test_bench_sequences_are_seeded);
  tcase_add_test(tc, test_bench_threads_have_own_streams);
  tcase_add_test(tc, test_bench_one_stream_for_every_thread);
  tcase_add_test(tc, test_bench_malloc_baseline);
  tcase_add_test(tc, test_bench_reports_allocation_failure_in_warm_up);
  tcase_add_test(tc, test_bench_reports_allocation_failure_in_timed_run);
  tcase_add_test(tc, test_bench_reports_deallocate_failure);
  tcase_add_test(tc, test_bench_reports_figures_not_back_to_zero);
  tcase_add_test(tc, test_bench_budget_shortens_runs);
  tcase_add_test(tc, test_bench_rejects_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(bench_suite(), false); }
