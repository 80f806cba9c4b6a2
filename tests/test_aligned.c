/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aligned adaptor over a host spy: the conformance battery, alignment
 * at and above the threshold and pass-through below it, per-call
 * alignment, data read back, unknown and mismatched frees, upstream
 * failures, options, and thousands of live blocks. Host suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "faulty.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_aligned_adaptor_create(up, NULL, out);
}

/* Every allocation goes through the map, with a 64 KiB slack. */
static rmmc_status_t make_all(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.alignment = 64 * KiB;
  o.threshold = 0;
  return rmmc_aligned_adaptor_create(up, &o, out);
}

static const conformance_case_t cases[] = {
    {"aligned(default)", make_default, 0},
    {"aligned(alignment=64KiB, threshold=0)", make_all, 0},
};

static rmmc_resource_t *make(rmmc_resource_t *up, size_t alignment, size_t threshold) {
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.alignment = alignment;
  o.threshold = threshold;
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, &o, &r), RMMC_SUCCESS);
  return r;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 7);
}
static bool check(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(seed + i * 7)) return false;
  return true;
}

START_TEST(test_aligned_at_and_above_threshold_only) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  r = make(up, 64 * KiB, MiB);
  ck_assert_str_eq(rmmc_resource_name(r), "aligned");
  ck_assert_int_eq(rmmc_resource_memory_kind(r), RMMC_MEMORY_HOST);
  /* Below the threshold: the upstream's own pointer and size, untouched. */
  unsigned char *small;
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB - 1, 256, NULL, (void **)&small), RMMC_SUCCESS);
  spy_counts_t c = spy_counts(s);
  ck_assert_ptr_eq(c.last_ptr, small);
  ck_assert_uint_eq(c.last_bytes, MiB - 1);
  ck_assert_uint_eq(c.last_alignment, 256);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  /* At and above: 64 KiB aligned inside an over-allocation. */
  const size_t sizes[] = {MiB, MiB + 1, 3 * MiB + 123};
  unsigned char *big[3];
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, sizes[i], 256, NULL, (void **)&big[i]), RMMC_SUCCESS);
    ck_assert_msg((uintptr_t)big[i] % (64 * KiB) == 0, "%p not 64 KiB aligned", (void *)big[i]);
    c = spy_counts(s);
    size_t up_bytes = sizes[i] + 64 * KiB - 256;
    ck_assert_uint_eq(c.last_bytes, up_bytes);
    ck_assert_uint_eq(c.last_alignment, 256);
    unsigned char *raw = c.last_ptr;
    ck_assert(big[i] >= raw && big[i] + sizes[i] <= raw + up_bytes);
    fill(big[i], sizes[i], (unsigned)i);
  }
  fill(small, MiB - 1, 99);
  ck_assert_uint_eq(field(r, "outstanding"), 3);
  ck_assert_uint_eq(field(r, "overhead"), 3 * (64 * KiB - 256));
  ck_assert_uint_eq(field(r, "alignment"), 64 * KiB);
  ck_assert_uint_eq(field(r, "threshold"), MiB);
  for (int i = 0; i < 3; i++) {
    ck_assert(check(big[i], sizes[i], (unsigned)i));
    ck_assert_int_eq(rmmc_resource_deallocate(r, big[i], sizes[i], 256, NULL), RMMC_SUCCESS);
  }
  ck_assert(check(small, MiB - 1, 99));
  ck_assert_int_eq(rmmc_resource_deallocate(r, small, MiB - 1, 256, NULL), RMMC_SUCCESS);
  c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  ck_assert_uint_eq(field(r, "overhead"), 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

START_TEST(test_aligned_honours_per_call_alignment) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  r = make(up, 4096, MiB);
  const size_t aligns[] = {512, 8192, 1 << 16, 1 << 21};
  for (size_t i = 0; i < 4; i++) {
    unsigned char *p;
    ck_assert_int_eq(rmmc_resource_allocate(r, 1000, aligns[i], NULL, (void **)&p), RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p % aligns[i], 0);
    ck_assert_uint_eq(spy_counts(s).last_bytes, 1000 + aligns[i] - 256);
    ck_assert_uint_eq(spy_counts(s).last_alignment, 256);
    fill(p, 1000, 5);
    ck_assert(check(p, 1000, 5));
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, aligns[i], NULL), RMMC_SUCCESS);
  }
  /* A per-call alignment above the adaptor's wins at the threshold too. */
  unsigned char *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 * MiB, 1 << 20, NULL, (void **)&p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % (1 << 20), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 1 << 20, NULL), RMMC_SUCCESS);
  /* 256 and below pass straight through. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 64, NULL, (void **)&p), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).last_bytes, 1000);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 64, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

START_TEST(test_aligned_unknown_pointer_loses_nothing) {
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  r = make(up, 64 * KiB, MiB);
  unsigned char *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 * MiB, 256, NULL, (void **)&p), RMMC_SUCCESS);
  fill(p, 2 * MiB, 3);
  spy_counts_t before = spy_counts(s);
  /* An address inside the block, a wrong size, a wrong alignment: all
   * refused without reaching the upstream. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p + 64 * KiB, 2 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "was not allocated here") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "not allocated with 3145728 bytes") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 1 << 20, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  int on_stack;
  ck_assert_int_eq(rmmc_resource_deallocate(r, &on_stack, 2 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  spy_counts_t after = spy_counts(s);
  ck_assert_uint_eq(after.deallocate_calls, before.deallocate_calls);
  ck_assert_uint_eq(after.outstanding, 1);
  ck_assert_uint_eq(field(r, "outstanding"), 1);
  /* Below the threshold the upstream judges, and also keeps its memory. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, &on_stack, 100, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(spy_counts(s).deallocate_errors, 1);
  ck_assert_uint_eq(spy_counts(s).outstanding, 1);
  /* The block is intact and frees normally, once. */
  ck_assert(check(p, 2 * MiB, 3));
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

START_TEST(test_aligned_upstream_failures) {
  rmmc_resource_t *spy, *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(faulty_create(spy, &up), RMMC_SUCCESS);
  faulty_t *f = faulty_of(up);
  r = make(up, 4096, 0);
  /* Allocation failures come back as they are and record nothing. */
  spy_fail_nth(s, 1);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 10000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(rmmc_last_error_message(), "13840 bytes") != NULL, "%s",
                rmmc_last_error_message());
  faulty_fail_allocate(f, RMMC_ERROR_CUDA, 1);
  ck_assert_int_eq(rmmc_resource_allocate(r, 10000, 256, NULL, &p), RMMC_ERROR_CUDA);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  /* A free the upstream refuses keeps the record: a second try works. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 10000, 256, NULL, &p), RMMC_SUCCESS);
  faulty_fail_deallocate(f, RMMC_ERROR_CUDA, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 10000, 256, NULL), RMMC_ERROR_CUDA);
  ck_assert_str_eq(rmmc_last_error_message(), "faulty: injected ERROR_CUDA");
  ck_assert_uint_eq(field(r, "outstanding"), 1);
  ck_assert_uint_eq(spy_counts(s).outstanding, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 10000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  /* A request that overflows once the slack is added never reaches it. */
  uint64_t calls = spy_counts(s).allocate_calls;
  ck_assert_int_eq(rmmc_resource_allocate(r, SIZE_MAX - 1000, 256, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "overflows"));
  ck_assert_uint_eq(spy_counts(s).allocate_calls, calls);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_aligned_options) {
  rmmc_resource_t *up, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  const size_t bad[] = {0, 3, 3000, 4097, ((size_t)1 << 20) + 4096};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.alignment = bad[i];
    r = (rmmc_resource_t *)1;
    ck_assert_int_eq(rmmc_aligned_adaptor_create(up, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "not a power of two"));
  }
  o = (rmmc_aligned_options_t){0};
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "initialize the options with their _INIT macro"));
  ck_assert_int_eq(rmmc_aligned_adaptor_create(NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  /* Defaults, and small alignments raised to 256. */
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, NULL, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "alignment"), 4096);
  ck_assert_uint_eq(field(r, "threshold"), MiB);
  ck_assert_int_eq(rmmc_resource_refcount(up), 2);
  rmmc_resource_release(r);
  o = (rmmc_aligned_options_t)RMMC_ALIGNED_OPTIONS_INIT;
  o.alignment = 16;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, &o, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "alignment"), 256);
  rmmc_resource_release(r);
  /* An older, shorter options struct: missing fields keep their defaults. */
  o = (rmmc_aligned_options_t)RMMC_ALIGNED_OPTIONS_INIT;
  o.size = offsetof(rmmc_aligned_options_t, threshold);
  o.alignment = 8192;
  o.threshold = 5;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(up, &o, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "alignment"), 8192);
  ck_assert_uint_eq(field(r, "threshold"), MiB);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;
  return x < y ? -1 : x > y;
}

START_TEST(test_aligned_many_live_blocks) {
  enum { N = 6000 };
  rmmc_resource_t *up, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &up), RMMC_SUCCESS);
  r = make(up, 1024, 0);
  void **p = calloc(N, sizeof *p);
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, 300, 256, NULL, &p[i]), RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p[i] % 1024, 0);
    memset(p[i], i & 0xff, 300);
  }
  ck_assert_uint_eq(field(r, "outstanding"), N);
  ck_assert_uint_eq(field(r, "overhead"), (uint64_t)N * (1024 - 256));
  for (int i = 0; i < N; i++) ck_assert_uint_eq(((unsigned char *)p[i])[299], (unsigned)(i & 0xff));
  void **sorted = malloc(N * sizeof *sorted);
  memcpy(sorted, p, N * sizeof *p);
  qsort(sorted, N, sizeof *sorted, cmp_ptr);
  for (int i = 1; i < N; i++) ck_assert((char *)sorted[i - 1] + 300 <= (char *)sorted[i]);
  /* Free in a scrambled order. */
  for (int i = 0; i < N; i++) {
    int j = (int)(((unsigned)i * 2654435761u) % N);
    void *t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 300, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "outstanding"), 0);
  ck_assert_uint_eq(spy_counts(spy_of(up)).outstanding, 0);
  free(sorted);
  free(p);
  rmmc_resource_release(r);
  rmmc_resource_release(up);
}
END_TEST

int main(void) {
  Suite *s = suite_create("aligned");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_aligned_at_and_above_threshold_only);
  tcase_add_test(tc, test_aligned_honours_per_call_alignment);
  tcase_add_test(tc, test_aligned_unknown_pointer_loses_nothing);
  tcase_add_test(tc, test_aligned_upstream_failures);
  tcase_add_test(tc, test_aligned_options);
  tcase_add_test(tc, test_aligned_many_live_blocks);
  suite_add_tcase(s, tc);
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  return rmmc_test_run(s, false);
}
