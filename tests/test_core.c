/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Core: status table, thread-local errors, dispatch-wrapper validation,
 * reference counting and the host resource. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

START_TEST(test_status_names_and_strings) {
  ck_assert_int_eq(RMMC_SUCCESS, 0);
  ck_assert_str_eq(rmmc_status_name(RMMC_SUCCESS), "SUCCESS");
  ck_assert_str_eq(rmmc_status_name(RMMC_ERROR_OUT_OF_MEMORY), "ERROR_OUT_OF_MEMORY");
  ck_assert_str_eq(rmmc_status_string(RMMC_ERROR_OUT_OF_MEMORY), "out of memory");
  ck_assert_str_eq(rmmc_status_string(RMMC_ERROR_NO_DEVICE), "no CUDA device");
  ck_assert_str_eq(rmmc_status_name((rmmc_status_t)-999), "UNKNOWN_STATUS");
  ck_assert_str_eq(rmmc_status_string((rmmc_status_t)42), "unknown status");
  /* Every status has a distinct name. */
  rmmc_status_t all[] = {RMMC_ERROR_INVALID_ARGUMENT, RMMC_ERROR_OUT_OF_MEMORY, RMMC_ERROR_CUDA,
                         RMMC_ERROR_UNKNOWN_POINTER,  RMMC_ERROR_NOT_SUPPORTED, RMMC_ERROR_NO_DEVICE};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    for (size_t j = i + 1; j < sizeof all / sizeof all[0]; j++)
      ck_assert_str_ne(rmmc_status_name(all[i]), rmmc_status_name(all[j]));
}
END_TEST

static void *other_thread(void *arg) {
  (void)arg;
  /* A fresh thread sees no error from another thread. */
  return (void *)(uintptr_t)(rmmc_last_error_message()[0] == '\0');
}

START_TEST(test_last_error_is_thread_local) {
  rmmc_clear_last_error();
  ck_assert_str_eq(rmmc_last_error_message(), "");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(NULL, 1, 256, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "resource is NULL"));
  ck_assert_int_eq(rmmc_last_cuda_error(), cudaSuccess);
  pthread_t t;
  void *clean;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, &clean);
  ck_assert_ptr_eq(clean, (void *)1);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "resource is NULL"));
  rmmc_clear_last_error();
  ck_assert_str_eq(rmmc_last_error_message(), "");
}
END_TEST

START_TEST(test_wrappers_validate_before_dispatch) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  spy_t *s = spy_of(r);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 0, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_resource_allocate(r, 10, 3, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "power of two"));
  ck_assert_int_eq(rmmc_resource_allocate(r, 10, 0, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_allocate(r, SIZE_MAX, 256, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "overflows"));
  ck_assert_int_eq(rmmc_resource_allocate(r, 10, 256, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(NULL, (void *)1, 10, 256, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(r, (void *)1, 0, 256, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(r, (void *)1, 10, 7, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(r, NULL, 10, 256, NULL), RMMC_SUCCESS);
  /* None of that reached the resource. */
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.allocate_calls, 0);
  ck_assert_uint_eq(c.deallocate_calls, 0);
  /* Small alignments are raised to 256 before dispatch. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 10, 16, (cudaStream_t)0x10, &p), RMMC_SUCCESS);
  c = spy_counts(s);
  ck_assert_uint_eq(c.last_alignment, 256);
  ck_assert_uint_eq(c.last_bytes, 10);
  ck_assert_ptr_eq(c.last_stream, (cudaStream_t)0x10);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 10, 16, (cudaStream_t)0x10), RMMC_SUCCESS);
  c = spy_counts(s);
  ck_assert_uint_eq(c.last_alignment, 256);
  ck_assert_uint_eq(c.outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_oom_message_names_request_and_stack) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  spy_set_capacity(spy_of(r), 1000);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, (cudaStream_t)0x20, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "5000 bytes") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "spy") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stream 0x20") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "host memory") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stack: spy (in use 0 B)") != NULL, "%s", m);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_oom_message_of_device_memory_stays_an_oom_message) {
  /* A device resource's message adds the device's free memory (device.c);
   * on a machine without one, the failed device switch must not replace
   * the out-of-memory message or the last CUDA error. */
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &r), RMMC_SUCCESS);
  spy_set_capacity(spy_of(r), 1000);
  rmmc_clear_last_error();
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strncmp(m, "out of memory: spy resource", 27) == 0, "%s", m);
  ck_assert_msg(strstr(m, "5000 bytes) on device 0, stream default") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stack: spy") != NULL, "%s", m);
  if (rmmc_device_count() > 0)
    ck_assert_msg(strstr(m, "; device 0 has ") != NULL, "%s", m);
  else
    ck_assert_msg(strstr(m, "no CUDA device") == NULL, "%s", m);
  ck_assert_int_eq(rmmc_last_cuda_error(), cudaSuccess);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_error_message_may_quote_itself) {
  /* Wrapping the current message ("context: %s", rmmc_last_error_message())
   * is the natural way to add context; every writer must read its
   * arguments before it overwrites the buffer they point into. */
  rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "inner failure %d", 7);
  ck_assert_int_eq(rmmc_set_error(RMMC_ERROR_CUDA, "outer: %s", rmmc_last_error_message()),
                   RMMC_ERROR_CUDA);
  ck_assert_str_eq(rmmc_last_error_message(), "outer: inner failure 7");
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_host_resource_create(&r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_oom_error(r, 4096, NULL, "upstream said (%s)", rmmc_last_error_message()),
                   RMMC_ERROR_OUT_OF_MEMORY);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strncmp(m, "out of memory: host resource could not allocate 4.00 KiB", 56) == 0, "%s", m);
  ck_assert_msg(strstr(m, ": upstream said (outer: inner failure 7)") != NULL, "%s", m);
  rmmc_set_error(RMMC_ERROR_CUDA, "%s", "x");
  ck_assert_int_eq(rmmc_set_cuda_error(cudaErrorInvalidValue, rmmc_last_error_message()), RMMC_ERROR_CUDA);
  ck_assert_msg(strncmp(rmmc_last_error_message(), "x failed: ", 10) == 0, "%s", rmmc_last_error_message());
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_refcount_release_destroys_once) {
  rmmc_resource_t *r;
  uint64_t before = spy_destroyed_total();
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  ck_assert_ptr_eq(rmmc_resource_retain(r), r);
  ck_assert_int_eq(rmmc_resource_refcount(r), 2);
  rmmc_resource_release(r);
  ck_assert_uint_eq(spy_destroyed_total(), before);
  rmmc_resource_release(r);
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
  rmmc_resource_release(NULL);
  ck_assert_ptr_null(rmmc_resource_retain(NULL));
  ck_assert_int_eq(rmmc_resource_refcount(NULL), 0);
}
END_TEST

START_TEST(test_host_resource_serves_and_is_equal) {
  rmmc_resource_t *a, *b;
  ck_assert_int_eq(rmmc_host_resource_create(&a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_host_resource_create(&b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_host_resource_create(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_str_eq(rmmc_resource_name(a), "host");
  ck_assert_int_eq(rmmc_resource_memory_kind(a), RMMC_MEMORY_HOST);
  ck_assert_int_eq(rmmc_resource_device(a), -1);
  ck_assert_ptr_null(rmmc_resource_upstream(a));
  ck_assert(rmmc_resource_is_equal(a, b));
  ck_assert(!rmmc_resource_is_equal(a, NULL));
  size_t aligns[] = {256, 4096, 1 << 16};
  for (size_t i = 0; i < 3; i++) {
    unsigned char *p;
    ck_assert_int_eq(rmmc_resource_allocate(a, 100000, aligns[i], NULL, (void **)&p), RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p % aligns[i], 0);
    memset(p, 0xab, 100000);
    ck_assert_uint_eq(p[99999], 0xab);
    /* Host resources are equal: free through the other one. */
    ck_assert_int_eq(rmmc_resource_deallocate(b, p, 100000, aligns[i], NULL), RMMC_SUCCESS);
  }
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate_sync(a, 512, &p), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(rmmc_resource_deallocate_sync(a, p, 512), RMMC_SUCCESS);
  /* A request the host cannot meet is out of memory, not a crash. */
  ck_assert_int_eq(rmmc_resource_allocate(a, SIZE_MAX / 2, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "host"));
  ck_assert_int_eq(rmmc_resource_release_cached(a), RMMC_SUCCESS);
  rmmc_resource_release(a);
  rmmc_resource_release(b);
}
END_TEST

START_TEST(test_memory_kinds) {
  ck_assert_str_eq(rmmc_memory_kind_name(RMMC_MEMORY_DEVICE), "device");
  ck_assert_str_eq(rmmc_memory_kind_name(RMMC_MEMORY_MANAGED), "managed");
  ck_assert_str_eq(rmmc_memory_kind_name((rmmc_memory_kind_t)99), "unknown");
  ck_assert(rmmc_memory_kind_is_device_accessible(RMMC_MEMORY_PINNED));
  ck_assert(!rmmc_memory_kind_is_device_accessible(RMMC_MEMORY_HOST));
  ck_assert(rmmc_memory_kind_is_host_accessible(RMMC_MEMORY_MANAGED));
  ck_assert(!rmmc_memory_kind_is_host_accessible(RMMC_MEMORY_DEVICE));
}
END_TEST

START_TEST(test_cuda_resources_need_a_device) {
  /* On a machine without a GPU every CUDA resource says so cleanly. */
  if (rmmc_device_count() > 0) return;
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_cuda_resource_create(-1, &r), RMMC_ERROR_NO_DEVICE);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_managed_resource_create(0, NULL, &r), RMMC_ERROR_NO_DEVICE);
  ck_assert_int_eq(rmmc_pinned_resource_create(&r), RMMC_ERROR_NO_DEVICE);
  ck_assert_int_eq(rmmc_cuda_async_resource_create(0, NULL, &r), RMMC_ERROR_NO_DEVICE);
  ck_assert_int_eq(rmmc_cuda_async_resource_create_view(0, NULL, &r), RMMC_ERROR_NO_DEVICE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no CUDA device"));
  ck_assert_int_eq(rmmc_cuda_async_resource_create(0, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  size_t f, t;
  ck_assert_int_eq(rmmc_device_memory_info(0, &f, &t), RMMC_ERROR_NO_DEVICE);
}
END_TEST

int main(void) {
  Suite *s = suite_create("core");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_status_names_and_strings);
  tcase_add_test(tc, test_last_error_is_thread_local);
  tcase_add_test(tc, test_wrappers_validate_before_dispatch);
  tcase_add_test(tc, test_oom_message_names_request_and_stack);
  tcase_add_test(tc, test_oom_message_of_device_memory_stays_an_oom_message);
  tcase_add_test(tc, test_error_message_may_quote_itself);
  tcase_add_test(tc, test_refcount_release_destroys_once);
  tcase_add_test(tc, test_host_resource_serves_and_is_equal);
  tcase_add_test(tc, test_memory_kinds);
  tcase_add_test(tc, test_cuda_resources_need_a_device);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
