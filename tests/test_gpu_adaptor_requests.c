/* SPDX-License-Identifier: Apache-2.0 */
/*
 * failure_callback, aligned, prefetch and the status report on a real GPU:
 * prefetch of managed memory (a few MiB, never oversubscribed) checked
 * through cudaMemRangeGetAttribute, aligned blocks over cudaMalloc with
 * data read back, out of memory from a 4 TiB request reaching the callback
 * and coming back cleanly, release_cached trimming a cuda_async pool, and
 * the report with the device's real figures. Suite cuda: exits 77 without
 * a GPU, runs without fork.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"

static bool starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)
#define MiB ((size_t)1 << 20)
#define TiB4 ((size_t)1 << 42)

/* Writes on the device, reads back through a host copy. */
static void check_device_roundtrip(void *d, size_t n, unsigned char value, cudaStream_t s) {
  unsigned char *h = malloc(n);
  ck_assert_ptr_nonnull(h);
  CUDA_OK(cudaMemsetAsync(d, value, n, s));
  CUDA_OK(cudaMemcpyAsync(h, d, n, cudaMemcpyDefault, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_uint_eq(h[0], value);
  ck_assert_uint_eq(h[n / 2], value);
  ck_assert_uint_eq(h[n - 1], value);
  free(h);
}

static int last_prefetch_location(const void *p, size_t n) {
  int loc = -100;
  CUDA_OK(cudaMemRangeGetAttribute(&loc, sizeof loc, cudaMemRangeAttributeLastPrefetchLocation,
                                   p, n));
  return loc;
}

START_TEST(test_gpu_prefetch_over_managed) {
  rmmc_resource_t *m, *r;
  ck_assert_int_eq(rmmc_managed_resource_create(0, NULL, &m), RMMC_SUCCESS); /* no prefetch */
  int concurrent = 0;
  CUDA_OK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  if (!concurrent) {
    ck_assert_int_eq(rmmc_prefetch_adaptor_create(m, &r), RMMC_ERROR_NOT_SUPPORTED);
    rmmc_resource_release(m);
    return;
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  const size_t n = 4 * MiB;
  /* Control: straight from the managed resource, nothing is prefetched. */
  unsigned char *c;
  ck_assert_int_eq(rmmc_resource_allocate(m, n, 256, s, (void **)&c), RMMC_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(last_prefetch_location(c, n), cudaInvalidDeviceId);

  ck_assert_int_eq(rmmc_prefetch_adaptor_create(m, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_memory_kind(r), RMMC_MEMORY_MANAGED);
  unsigned char *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, s, (void **)&p), RMMC_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(last_prefetch_location(p, n), 0);
  enum cudaMemLocationType type = cudaMemLocationTypeInvalid;
  CUDA_OK(cudaMemRangeGetAttribute(&type, sizeof type,
                                   cudaMemRangeAttributeLastPrefetchLocationType, p, n));
  ck_assert_int_eq(type, cudaMemLocationTypeDevice);
  int id = -100;
  CUDA_OK(cudaMemRangeGetAttribute(&id, sizeof id, cudaMemRangeAttributeLastPrefetchLocationId,
                                   p, n));
  ck_assert_int_eq(id, 0);
  ck_assert_uint_eq(field(r, "prefetches"), 1);
  ck_assert_uint_eq(field(r, "prefetched"), n);

  /* Data round-trips: device writes, CPU reads; CPU writes, device copies. */
  check_device_roundtrip(p, n, 0x3c, s);
  ck_assert_uint_eq(p[n - 1], 0x3c); /* managed: the CPU reads it directly */
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7);
  void *d;
  CUDA_OK(cudaMalloc(&d, n));
  unsigned char *h = malloc(n);
  CUDA_OK(cudaMemcpyAsync(d, p, n, cudaMemcpyDefault, s));
  CUDA_OK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; i += 4093) ck_assert_uint_eq(h[i], (unsigned char)(i * 7));
  ck_assert_uint_eq(h[n - 1], (unsigned char)((n - 1) * 7));
  free(h);
  CUDA_OK(cudaFree(d));

  char buf[4096];
  ck_assert_int_eq(rmmc_resource_status_string(r, buf, sizeof buf, NULL), RMMC_SUCCESS);
  ck_assert_msg(strstr(buf, "prefetch to device 0") != NULL, "%s", buf);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, n, 256, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(m, c, n, 256, s), RMMC_SUCCESS);
  rmmc_resource_release(r);
  rmmc_resource_release(m);

  /* The same through specs; over device memory it passes through. */
  ck_assert_int_eq(rmmc_stack_create("prefetch > managed", 0, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 * MiB, 256, s, (void **)&p), RMMC_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(last_prefetch_location(p, 2 * MiB), 0);
  check_device_roundtrip(p, 2 * MiB, 0x11, s);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 256, s), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("prefetch > cuda", 0, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, s, (void **)&p), RMMC_SUCCESS);
  check_device_roundtrip(p, MiB, 0x22, s);
  ck_assert_uint_eq(field(r, "prefetches"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, MiB, 256, s), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* Pinned host memory is refused. */
  ck_assert_int_eq(rmmc_stack_create("prefetch > pinned", 0, &r), RMMC_ERROR_INCOMPATIBLE);
  CUDA_OK(cudaStreamDestroy(s));
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
}
END_TEST

START_TEST(test_gpu_aligned_over_cuda) {
  rmmc_resource_t *c, *a;
  ck_assert_int_eq(rmmc_cuda_resource_create(0, &c), RMMC_SUCCESS);
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.alignment = 64 << 10;
  o.threshold = MiB;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(c, &o, &a), RMMC_SUCCESS);
  rmmc_resource_release(c);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  const size_t big = 3 * MiB + 5;
  void *p, *q, *t;
  ck_assert_int_eq(rmmc_resource_allocate(a, big, 256, s, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % (64 << 10), 0);
  check_device_roundtrip(p, big, 0xa5, s);
  /* The cuda resource alone refuses 4096; through the adaptor it works. */
  ck_assert_int_eq(rmmc_resource_allocate(rmmc_resource_upstream(a), 1000, 4096, s, &q),
                   RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_int_eq(rmmc_resource_allocate(a, 1000, 4096, s, &q), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)q % 4096, 0);
  check_device_roundtrip(q, 1000, 0x5a, s);
  /* Below the threshold at 256: cudaMalloc's own pointer. */
  ck_assert_int_eq(rmmc_resource_allocate(a, 5000, 256, s, &t), RMMC_SUCCESS);
  check_device_roundtrip(t, 5000, 0x01, s);
  ck_assert_uint_eq(field(a, "outstanding"), 2);
  /* Unknown pointers: refused, nothing freed. */
  ck_assert_int_eq(rmmc_resource_deallocate(a, (char *)p + (64 << 10), big, 256, s),
                   RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(a, (char *)t + 256, 5000, 256, s),
                   RMMC_ERROR_UNKNOWN_POINTER); /* cudaFree refuses it */
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  ck_assert_uint_eq(field(a, "outstanding"), 2);
  check_device_roundtrip(p, big, 0x77, s); /* still ours */
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(rmmc_resource_deallocate(a, p, big, 256, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(a, q, 1000, 4096, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(a, t, 5000, 256, s), RMMC_SUCCESS);
  ck_assert_uint_eq(field(a, "outstanding"), 0);
  /* Out of memory passes through with the slack-sized request. */
  ck_assert_int_eq(rmmc_resource_allocate(a, TiB4, 256, s, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  ck_assert_uint_eq(field(a, "outstanding"), 0);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(a);
}
END_TEST

typedef struct asked {
  int calls, yes;
  size_t bytes;
} asked_t;

static bool ask(size_t bytes, void *user) {
  asked_t *a = user;
  a->calls++;
  a->bytes = bytes;
  if (a->yes == 0) return false;
  a->yes--;
  return true;
}

START_TEST(test_gpu_failure_callback_over_cuda) {
  rmmc_resource_t *c, *r;
  ck_assert_int_eq(rmmc_cuda_resource_create(0, &c), RMMC_SUCCESS);
  asked_t a = {0, 0, 0};
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(c, ask, &a, &r), RMMC_SUCCESS);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, TiB4, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(a.calls, 1);
  ck_assert_uint_eq(a.bytes, TiB4);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "cudaMalloc failed") && strstr(m, "4.00 TiB") &&
                    strstr(m, "free of") && strstr(m, "gave up after 0 retries") &&
                    strstr(m, "stack: failure_callback > cuda"),
                "%s", m);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  a = (asked_t){0, 2, 0};
  ck_assert_int_eq(rmmc_resource_allocate(r, TiB4, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(a.calls, 3);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "gave up after 2 retries"));
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  /* Ordinary requests never ask. */
  a = (asked_t){0, 0, 0};
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, NULL, &p), RMMC_SUCCESS);
  check_device_roundtrip(p, MiB, 0x42, NULL);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(a.calls, 0);
  ck_assert_uint_eq(field(r, "gave_up"), 2);
  rmmc_resource_release(r);
  rmmc_resource_release(c);

  /* The built-in form over cuda_async: release_cached trims the pool. */
  ck_assert_int_eq(rmmc_stack_create("failure_callback(retries=2) > cuda_async(initial=16MiB)", 0, &r),
                   RMMC_SUCCESS);
  rmmc_resource_t *pool = rmmc_resource_upstream(r);
  ck_assert_uint_ge(field(pool, "reserved"), 16 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(r, TiB4, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "gave up after 2 retries"));
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  ck_assert_uint_eq(field(pool, "reserved"), 0);
  ck_assert_uint_eq(field(r, "callbacks"), 3);
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, NULL, &p), RMMC_SUCCESS);
  check_device_roundtrip(p, MiB, 0x43, NULL);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_gpu_memory_status_report) {
  rmmc_resource_t *r, *prev;
  ck_assert_int_eq(rmmc_stack_create("failure_callback > aligned(alignment=64KiB) > cuda", 0, &r),
                   RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 8 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  char buf[8192];
  size_t need = 0;
  ck_assert_int_eq(rmmc_resource_status_string(r, buf, sizeof buf, &need), RMMC_SUCCESS);
  ck_assert_uint_lt(need, sizeof buf);
  ck_assert_msg(starts_with(buf, "rmmc resource status: failure_callback\n  device memory: "),
                "%s", buf);
  /* The device line carries the real total. */
  size_t free_b, total_b;
  ck_assert_int_eq(rmmc_device_memory_info(0, &free_b, &total_b), RMMC_SUCCESS);
  char total[64];
  snprintf(total, sizeof total, " free, %.2f GiB total\n", (double)total_b / (double)(1u << 30));
  ck_assert_msg(strstr(buf, total) != NULL, "'%s' not in:\n%s", total, buf);
  double used, fr;
  char u1[8], u2[8];
  const char *line = strstr(buf, "  device memory: ");
  ck_assert_int_eq(sscanf(line, "  device memory: %lf %7s used, %lf %7s free", &used, u1, &fr, u2), 4);
  ck_assert(used > 0.0);
  ck_assert_ptr_nonnull(strstr(buf, "    1. failure_callback [device memory, device 0]\n"));
  ck_assert_ptr_nonnull(strstr(buf, "    2. aligned [device memory, device 0]\n"));
  ck_assert_ptr_nonnull(strstr(buf, "         alignment      64.00 KiB\n"));
  ck_assert_ptr_nonnull(strstr(buf, "         outstanding    1\n"));
  ck_assert_ptr_nonnull(strstr(buf, "    3. cuda [device memory, device 0]\n         (no figures)\n"));

  /* Through the registry, printed for the log too. */
  ck_assert_int_eq(rmmc_set_device_resource(0, r, &prev), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_memory_status(0, stdout), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_memory_status_string(-1, buf, sizeof buf, NULL), RMMC_SUCCESS);
  ck_assert_msg(starts_with(buf, "rmmc memory status: device 0\n  device memory: "), "%s", buf);
  ck_assert_ptr_null(strstr(buf, "no CUDA device"));
  ck_assert_ptr_nonnull(strstr(buf, "    3. cuda [device memory, device 0]\n"));
  rmmc_resource_t *back;
  ck_assert_int_eq(rmmc_set_device_resource(0, prev, &back), RMMC_SUCCESS);
  ck_assert_ptr_eq(back, r);
  rmmc_resource_release(back);
  rmmc_resource_release(prev);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 8 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_adaptor_requests");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gpu_prefetch_over_managed);
  tcase_add_test(tc, test_gpu_aligned_over_cuda);
  tcase_add_test(tc, test_gpu_failure_callback_over_cuda);
  tcase_add_test(tc, test_gpu_memory_status_report);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
