/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bad input on the GPU resources (cuda, managed, pinned, cuda_async) and
 * containers over device memory: what needs a device to answer. The checks
 * that need none are in test_bad_input.c. GPU suite: skips without a GPU.
 */
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

#define EXPECT(call, status)                                                                  \
  do {                                                                                        \
    rmmc_clear_last_error();                                                                  \
    rmmc_status_t st_ = (call);                                                               \
    ck_assert_msg(st_ == (status), "%s: got %s, expected %s (message: '%s')", #call,          \
                  rmmc_status_name(st_), rmmc_status_name(status), rmmc_last_error_message()); \
    if ((status) != RMMC_SUCCESS)                                                             \
      ck_assert_msg(rmmc_last_error_message()[0] != '\0', "%s: no message", #call);           \
  } while (0)

typedef rmmc_status_t (*make_fn)(rmmc_resource_t **out);
static rmmc_status_t make_cuda(rmmc_resource_t **out) { return rmmc_cuda_resource_create(-1, out); }
static rmmc_status_t make_managed(rmmc_resource_t **out) {
  return rmmc_managed_resource_create(-1, NULL, out);
}
static rmmc_status_t make_pinned(rmmc_resource_t **out) { return rmmc_pinned_resource_create(out); }
static rmmc_status_t make_async(rmmc_resource_t **out) {
  return rmmc_cuda_async_resource_create(-1, NULL, out);
}
static const make_fn makers[] = {make_cuda, make_managed, make_pinned, make_async};

/* Each GPU base resource: 0 bytes, SIZE_MAX, a size no device has, an
 * alignment above 256 (NOT_SUPPORTED: cudaMalloc promises 256), bad
 * alignments; and it still serves afterwards. */
START_TEST(test_gpu_base_sizes_and_alignments) {
  rmmc_resource_t *r;
  ck_assert_int_eq(makers[_i](&r), RMMC_SUCCESS);
  void *p = (void *)1;
  EXPECT(rmmc_resource_allocate(r, 0, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_ptr_null(p);
  EXPECT(rmmc_resource_allocate(r, SIZE_MAX, 256, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_resource_allocate(r, (size_t)1 << 50, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess); /* the failure does not stick */
  EXPECT(rmmc_resource_allocate(r, 1024, 4096, NULL, &p), RMMC_ERROR_NOT_SUPPORTED);
  EXPECT(rmmc_resource_allocate(r, 1024, 3, NULL, &p), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_resource_allocate(r, 1024, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT(rmmc_resource_deallocate(r, p, 1024, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  rmmc_resource_release(r);
}
END_TEST

/* cuda and managed free with cudaFree, which knows its pointers: a double
 * free and a foreign pointer are UNKNOWN_POINTER, and CUDA's error does
 * not stick to later calls. */
START_TEST(test_gpu_cudafree_resources_detect_unknown_pointers) {
  rmmc_resource_t *r;
  ck_assert_int_eq(makers[_i](&r), RMMC_SUCCESS);
  void *p = NULL;
  EXPECT(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  EXPECT(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
  EXPECT(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  char host[512];
  EXPECT(rmmc_resource_deallocate(r, host + 256, 256, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  EXPECT(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  EXPECT(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* A pool over cuda: unknown pointers, double frees and wrong sizes are
 * refused by the pool before CUDA sees them; invariants hold. */
START_TEST(test_gpu_pool_over_cuda_refuses_bad_frees) {
  rmmc_resource_t *cuda, *pool;
  ck_assert_int_eq(rmmc_cuda_resource_create(-1, &cuda), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_create(cuda, NULL, &pool), RMMC_SUCCESS);
  rmmc_resource_release(cuda);
  cudaStream_t s1, s2;
  ck_assert_int_eq(rmmc_stream_create(cudaStreamNonBlocking, &s1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stream_create(cudaStreamNonBlocking, &s2), RMMC_SUCCESS);
  void *p = NULL;
  EXPECT(rmmc_resource_allocate(pool, 1000, 256, s1, &p), RMMC_SUCCESS);
  EXPECT(rmmc_resource_deallocate(pool, p, 2000, 256, s1), RMMC_ERROR_UNKNOWN_POINTER);
  EXPECT(rmmc_resource_deallocate(pool, (char *)p + 256, 500, 256, s1), RMMC_ERROR_UNKNOWN_POINTER);
  EXPECT(rmmc_resource_deallocate(pool, p, 1000, 256, s2), RMMC_SUCCESS); /* another stream */
  EXPECT(rmmc_resource_deallocate(pool, p, 1000, 256, s2), RMMC_ERROR_UNKNOWN_POINTER);
  EXPECT(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  EXPECT(rmmc_resource_allocate(pool, (size_t)1 << 50, 256, s1, &p), RMMC_ERROR_OUT_OF_MEMORY);
  EXPECT(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  EXPECT(rmmc_resource_allocate(pool, 1000, 256, s1, &p), RMMC_SUCCESS);
  EXPECT(rmmc_resource_deallocate(pool, p, 1000, 256, s1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stream_synchronize(s1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stream_synchronize(s2), RMMC_SUCCESS);
  rmmc_resource_release(pool);
  ck_assert_int_eq(rmmc_stream_destroy(s1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stream_destroy(s2), RMMC_SUCCESS);
}
END_TEST

/* Device ids out of range, and prefetch over memory it cannot prefetch. */
START_TEST(test_gpu_creates_bad_devices) {
  rmmc_resource_t *r = (rmmc_resource_t *)1, *pinned;
  int n = rmmc_device_count();
  EXPECT(rmmc_cuda_resource_create(n, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  EXPECT(rmmc_managed_resource_create(n, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_cuda_async_resource_create(n, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_cuda_async_resource_create_view(n, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  EXPECT(rmmc_device_memory_info(n, (size_t[]){0}, (size_t[]){0}), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pinned_resource_create(&pinned), RMMC_SUCCESS);
  EXPECT(rmmc_prefetch_adaptor_create(pinned, &r), RMMC_ERROR_INCOMPATIBLE);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_resource_refcount(pinned), 1);
  rmmc_resource_release(pinned);
  rmmc_stream_pool_t *sp = (rmmc_stream_pool_t *)1;
  EXPECT(rmmc_stream_pool_create(2, 0, n, &sp), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(sp);
}
END_TEST

/* Containers over device memory: out-of-range transfers and impossible
 * growth leave the contents as they were. */
START_TEST(test_gpu_containers_bad_input_keep_contents) {
  rmmc_resource_t *cuda;
  ck_assert_int_eq(rmmc_cuda_resource_create(-1, &cuda), RMMC_SUCCESS);
  int xs[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0}, x = 0;
  rmmc_vector_t v;
  EXPECT(rmmc_vector_create_from(&v, xs, 8, sizeof(int), NULL, cuda), RMMC_SUCCESS);
  EXPECT(rmmc_vector_resize(&v, (size_t)1 << 60), RMMC_ERROR_OUT_OF_MEMORY);
  EXPECT(rmmc_vector_get(&v, 8, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_vector_get(&v, 0, &x, 2), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_vector_copy_to_host(&v, 4, back, 5), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_vector_copy_to_host(&v, 0, back, 8), RMMC_SUCCESS);
  ck_assert_mem_eq(back, xs, sizeof xs);
  rmmc_scalar_t s;
  double d = 1.25, e = 0;
  EXPECT(rmmc_scalar_create_from(&s, &d, sizeof d, NULL, cuda), RMMC_SUCCESS);
  EXPECT(rmmc_scalar_set(&s, &d, 4), RMMC_ERROR_INVALID_ARGUMENT);
  EXPECT(rmmc_scalar_get(&s, &e, sizeof e), RMMC_SUCCESS);
  ck_assert(e == 1.25);
  EXPECT(rmmc_scalar_destroy(&s), RMMC_SUCCESS);
  EXPECT(rmmc_vector_destroy(&v), RMMC_SUCCESS);
  EXPECT(rmmc_vector_destroy(&v), RMMC_SUCCESS);
  rmmc_resource_release(cuda);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_bad_input");
  TCase *tc = tcase_create("gpu");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_gpu_base_sizes_and_alignments, 0, 4);
  tcase_add_loop_test(tc, test_gpu_cudafree_resources_detect_unknown_pointers, 0, 2);
  tcase_add_test(tc, test_gpu_pool_over_cuda_refuses_bad_frees);
  tcase_add_test(tc, test_gpu_creates_bad_devices);
  tcase_add_test(tc, test_gpu_containers_bad_input_keep_contents);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
