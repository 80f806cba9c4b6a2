/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefetch adaptor's host-side paths: host and pinned upstreams are
 * refused at create time, managed memory without a GPU is NO_DEVICE, device
 * memory passes through unchanged, and the stack spec reports the same.
 * Prefetching itself runs in test_gpu_adaptor_requests. Host suite.
 */
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

START_TEST(test_prefetch_refuses_host_memory) {
  const rmmc_memory_kind_t kinds[] = {RMMC_MEMORY_HOST, RMMC_MEMORY_PINNED};
  const char *names[] = {"host memory", "pinned memory"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *up, *r = (rmmc_resource_t *)1;
    ck_assert_int_eq(spy_create(kinds[i], &up), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_prefetch_adaptor_create(up, &r), RMMC_ERROR_INCOMPATIBLE);
    ck_assert_ptr_null(r);
    const char *m = rmmc_last_error_message();
    ck_assert_msg(strstr(m, names[i]) != NULL && strstr(m, "cannot be prefetched") != NULL &&
                      strstr(m, "spy upstream") != NULL,
                  "%s", m);
    ck_assert_int_eq(rmmc_resource_refcount(up), 1);
    ck_assert_uint_eq(spy_counts(spy_of(up)).allocate_calls, 0);
    rmmc_resource_release(up);
  }
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_prefetch_adaptor_create(NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_prefetch_adaptor_create(NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_prefetch_managed_needs_a_device) {
  if (rmmc_device_count() > 0) return; /* the GPU program covers this machine */
  rmmc_resource_t *up, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_MANAGED, &up), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_prefetch_adaptor_create(up, &r), RMMC_ERROR_NO_DEVICE);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "managed memory"));
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

START_TEST(test_prefetch_passes_device_memory_through) {
  rmmc_resource_t *up, *r;
  /* A spy reporting device memory (its blocks are host memory, which this
   * path never touches). */
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &up), RMMC_SUCCESS);
  spy_t *s = spy_of(up);
  ck_assert_int_eq(rmmc_prefetch_adaptor_create(up, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "prefetch");
  ck_assert_int_eq(rmmc_resource_memory_kind(r), RMMC_MEMORY_DEVICE);
  ck_assert_int_eq(rmmc_resource_device(r), 0);
  ck_assert_ptr_eq(rmmc_resource_upstream(r), up);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 1024, (cudaStream_t)0x50, &p), RMMC_SUCCESS);
  spy_counts_t c = spy_counts(s);
  ck_assert_ptr_eq(c.last_ptr, p);
  ck_assert_uint_eq(c.last_bytes, 3000);
  ck_assert_uint_eq(c.last_alignment, 1024);
  ck_assert_ptr_eq(c.last_stream, (cudaStream_t)0x50);
  /* Errors pass through too. */
  spy_fail_nth(s, 1);
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  int x;
  ck_assert_int_eq(rmmc_resource_deallocate(r, &x, 4, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3000, 1024, (cudaStream_t)0x50), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).release_calls, 1);
  uint64_t n = 99;
  ck_assert(rmmc_resource_get_field(r, "prefetches", &n));
  ck_assert_uint_eq(n, 0);
  char buf[2048];
  ck_assert_int_eq(rmmc_resource_status_string(r, buf, sizeof buf, NULL), RMMC_SUCCESS);
  ck_assert_msg(strstr(buf, "pass-through (device memory)") != NULL, "%s", buf);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_resource_refcount(up), 1);
  rmmc_resource_release(up);
}
END_TEST

START_TEST(test_prefetch_spec) {
  ck_assert_int_eq(rmmc_stack_validate("prefetch > managed"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("prefetch > host"), RMMC_SUCCESS); /* types check out */
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("prefetch > host", -1, &r), RMMC_ERROR_INCOMPATIBLE);
  ck_assert_ptr_null(r);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "cannot be prefetched") != NULL && strstr(m, "'prefetch'") != NULL, "%s", m);
  ck_assert_int_eq(rmmc_stack_validate("prefetch(to=0) > managed"), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_validate("prefetch"), RMMC_ERROR_PARSE);
}
END_TEST

int main(void) {
  Suite *s = suite_create("prefetch");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_prefetch_refuses_host_memory);
  tcase_add_test(tc, test_prefetch_managed_needs_a_device);
  tcase_add_test(tc, test_prefetch_passes_device_memory_through);
  tcase_add_test(tc, test_prefetch_spec);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
