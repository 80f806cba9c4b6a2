/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Base CUDA resources and the registry on a real GPU: cuda, managed (with
 * prefetch), pinned, cuda_async (owned pool and default-pool view). Data is
 * written on a stream and read back. Suite cuda: exits 77 without a GPU,
 * runs without fork.
 */
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)

/* Writes a byte pattern on a stream, reads it back, checks it. */
static void roundtrip(rmmc_resource_t *r, size_t bytes, cudaStream_t stream) {
  unsigned char *d;
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, 256, stream, (void **)&d);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %s", rmmc_resource_name(r), rmmc_last_error_message());
  ck_assert_uint_eq((uintptr_t)d % 256, 0);
  unsigned char *h = malloc(bytes);
  CUDA_OK(cudaMemsetAsync(d, 0x5c, bytes, stream));
  CUDA_OK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDefault, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  ck_assert_uint_eq(h[0], 0x5c);
  ck_assert_uint_eq(h[bytes / 2], 0x5c);
  ck_assert_uint_eq(h[bytes - 1], 0x5c);
  free(h);
  ck_assert_int_eq(rmmc_resource_deallocate(r, d, bytes, 256, stream), RMMC_SUCCESS);
}

START_TEST(test_gpu_cuda_resource) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_cuda_resource_create(-1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "cuda");
  ck_assert_int_eq(rmmc_resource_memory_kind(r), RMMC_MEMORY_DEVICE);
  ck_assert_int_eq(rmmc_resource_device(r), 0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  roundtrip(r, 1 << 20, s);
  roundtrip(r, 1000, NULL);
  roundtrip(r, 3000, cudaStreamPerThread);
  /* Out of memory is its own status with a useful message. */
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, (size_t)1 << 42, 256, s, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "device 0") && strstr(m, "free of") && strstr(m, "4.00 TiB"), "%s", m);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess); /* not left sticky */
  roundtrip(r, 4096, s);
  /* Alignment above 256 is refused, not ignored. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 4096, s, &p), RMMC_ERROR_NOT_SUPPORTED);
  /* A pointer cudaFree does not know. */
  int host_var;
  ck_assert_int_eq(rmmc_resource_deallocate(r, &host_var, 4, 256, s), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_ne(rmmc_last_cuda_error(), cudaSuccess);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  rmmc_resource_t *r2;
  ck_assert_int_eq(rmmc_cuda_resource_create(0, &r2), RMMC_SUCCESS);
  ck_assert(rmmc_resource_is_equal(r, r2));
  rmmc_resource_release(r2);
  ck_assert_int_eq(rmmc_cuda_resource_create(rmmc_device_count(), &r2), RMMC_ERROR_INVALID_ARGUMENT);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_gpu_managed_and_pinned) {
  rmmc_managed_options_t o = RMMC_MANAGED_OPTIONS_INIT;
  o.prefetch = true;
  rmmc_resource_t *m, *pn;
  ck_assert_int_eq(rmmc_managed_resource_create(0, &o, &m), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_memory_kind(m), RMMC_MEMORY_MANAGED);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  roundtrip(m, 8 << 20, s);
  /* Managed memory is readable by the CPU after the stream is done. */
  unsigned char *p;
  ck_assert_int_eq(rmmc_resource_allocate(m, 1 << 20, 256, s, (void **)&p), RMMC_SUCCESS);
  CUDA_OK(cudaMemsetAsync(p, 7, 1 << 20, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_uint_eq(p[12345], 7);
  ck_assert_int_eq(rmmc_resource_deallocate(m, p, 1 << 20, 256, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pinned_resource_create(&pn), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_memory_kind(pn), RMMC_MEMORY_PINNED);
  ck_assert_int_eq(rmmc_resource_device(pn), -1);
  roundtrip(pn, 1 << 20, s);
  ck_assert_int_eq(rmmc_resource_allocate(pn, 4096, 256, s, (void **)&p), RMMC_SUCCESS);
  memset(p, 3, 4096);
  ck_assert_uint_eq(p[4095], 3);
  ck_assert_int_eq(rmmc_resource_deallocate(pn, p, 4096, 256, s), RMMC_SUCCESS);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(m);
  rmmc_resource_release(pn);
}
END_TEST

START_TEST(test_gpu_cuda_async_resource) {
  rmmc_cuda_async_options_t o = RMMC_CUDA_ASYNC_OPTIONS_INIT;
  o.initial_pool_size = 64 << 20;
  rmmc_resource_t *a, *v;
  ck_assert_int_eq(rmmc_cuda_async_resource_create(0, &o, &a), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(rmmc_cuda_async_resource_pool(a));
  uint64_t reserved = 0;
  ck_assert(rmmc_resource_get_field(a, "reserved", &reserved));
  ck_assert_uint_ge(reserved, 64 << 20);
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreate(&s1));
  CUDA_OK(cudaStreamCreate(&s2));
  roundtrip(a, 1 << 20, s1);
  roundtrip(a, 5 << 20, s2);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(a, 1 << 20, 256, s1, &p), RMMC_SUCCESS);
  uint64_t in_use = 0;
  ck_assert(rmmc_resource_get_field(a, "in_use", &in_use));
  ck_assert_uint_ge(in_use, 1 << 20);
  ck_assert_int_eq(rmmc_resource_deallocate(a, p, 1 << 20, 256, s1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(a), RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(a, "reserved", &reserved));
  ck_assert_uint_eq(reserved, 0);
  ck_assert_int_eq(rmmc_resource_allocate(a, (size_t)1 << 42, 256, s1, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  /* The default-pool view: what plain cudaMallocAsync uses. */
  ck_assert_int_eq(rmmc_cuda_async_resource_create_view(0, NULL, &v), RMMC_SUCCESS);
  cudaMemPool_t def;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&def, 0));
  ck_assert_ptr_eq(rmmc_cuda_async_resource_pool(v), def);
  ck_assert(!rmmc_resource_is_equal(a, v));
  roundtrip(v, 1 << 20, s2);
  rmmc_resource_release(v);
  CUDA_OK(cudaDeviceGetDefaultMemPool(&def, 0)); /* the view did not destroy it */
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
  rmmc_resource_release(a);
  ck_assert_ptr_null(rmmc_cuda_async_resource_pool(NULL));
}
END_TEST

START_TEST(test_gpu_registry_default_and_helpers) {
  rmmc_registry_clear();
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_get_current_device_resource(&r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "cuda");
  void *p;
  ck_assert_int_eq(rmmc_allocate(12345, NULL, &p), RMMC_SUCCESS);
  CUDA_OK(cudaMemset(p, 0, 12345));
  ck_assert_int_eq(rmmc_deallocate(p, 12345, NULL), RMMC_SUCCESS);
  size_t f, t, pct;
  ck_assert_int_eq(rmmc_device_memory_info(-1, &f, &t), RMMC_SUCCESS);
  ck_assert_uint_gt(t, 0);
  ck_assert_uint_le(f, t);
  ck_assert_int_eq(rmmc_percent_of_free_device_memory(0, 50, &pct), RMMC_SUCCESS);
  ck_assert_uint_gt(pct, 0);
  ck_assert_uint_le(pct, f);
  ck_assert_uint_eq(pct % 256, 0);
  ck_assert_int_eq(rmmc_percent_of_free_device_memory(0, 0, &pct), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_get_device_resource(rmmc_device_count(), &r), RMMC_ERROR_INVALID_ARGUMENT);
  /* Specs build real stacks. */
  rmmc_resource_t *s;
  ck_assert_int_eq(rmmc_stack_create("cuda_async(initial=32MiB, release_threshold=1%)", -1, &s),
                   RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(s), "cuda_async");
  roundtrip(s, 1 << 20, NULL);
  rmmc_resource_release(s);
  ck_assert_int_eq(rmmc_stack_create("managed(prefetch=true)", 0, &s), RMMC_SUCCESS);
  roundtrip(s, 1 << 20, NULL);
  rmmc_resource_release(s);
  rmmc_registry_clear();
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_base");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gpu_cuda_resource);
  tcase_add_test(tc, test_gpu_managed_and_pinned);
  tcase_add_test(tc, test_gpu_cuda_async_resource);
  tcase_add_test(tc, test_gpu_registry_default_and_helpers);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
