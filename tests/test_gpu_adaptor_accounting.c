/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The limiting, statistics, tracking and logging adaptors over a real cuda
 * resource: memory written with cudaMemsetAsync and read back, every
 * layer's figures, the limit and a real CUDA out-of-memory seen by each
 * layer, a foreign device pointer refused, many threads, a spec with a
 * percentage of free device memory. Suite cuda: exits 77 without a GPU,
 * runs without fork.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)

typedef struct chain {
  rmmc_resource_t *cuda, *logging, *tracking, *limiting, *statistics;
  FILE *log;
  char *log_text;
  size_t log_len;
} chain_t;

static void build(chain_t *c, size_t limit) {
  memset(c, 0, sizeof *c);
  c->log = open_memstream(&c->log_text, &c->log_len);
  ck_assert_ptr_nonnull(c->log);
  ck_assert_int_eq(rmmc_cuda_resource_create(-1, &c->cuda), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(c->cuda, c->log, NULL, &c->logging), RMMC_SUCCESS);
  rmmc_tracking_options_t o = RMMC_TRACKING_OPTIONS_INIT;
  o.backtrace = true;
  ck_assert_int_eq(rmmc_tracking_adaptor_create(c->logging, &o, &c->tracking), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(c->tracking, limit, &c->limiting), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(c->limiting, &c->statistics), RMMC_SUCCESS);
  /* Adaptors take their upstream's kind and device. */
  ck_assert_int_eq(rmmc_resource_memory_kind(c->statistics), RMMC_MEMORY_DEVICE);
  ck_assert_int_eq(rmmc_resource_device(c->statistics), rmmc_resource_device(c->cuda));
}

static void release(chain_t *c) {
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(c->tracking), 0);
  rmmc_resource_release(c->logging);
  rmmc_resource_release(c->tracking);
  rmmc_resource_release(c->limiting);
  rmmc_resource_release(c->cuda);
  rmmc_resource_release(c->statistics); /* the last reference: the stack goes */
  fclose(c->log);
  free(c->log_text);
}

static int count_substr(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

/* Writes `value` on the stream, copies back, checks first, middle, last. */
static void write_and_check(void *d, size_t n, unsigned char value, cudaStream_t s) {
  unsigned char *h = malloc(n);
  ck_assert_ptr_nonnull(h);
  CUDA_OK(cudaMemsetAsync(d, value, n, s));
  CUDA_OK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_uint_eq(h[0], value);
  ck_assert_uint_eq(h[n / 2], value);
  ck_assert_uint_eq(h[n - 1], value);
  free(h);
}

START_TEST(test_gpu_adaptor_stack_figures) {
  chain_t c;
  build(&c, 64 << 20);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  size_t sizes[3] = {1 << 20, 3000, 5 << 20};
  void *p[3];
  for (int i = 0; i < 3; i++) {
    rmmc_status_t st = rmmc_resource_allocate(c.statistics, sizes[i], 256, s, &p[i]);
    ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
    ck_assert_uint_eq((uintptr_t)p[i] % 256, 0);
    write_and_check(p[i], sizes[i], (unsigned char)(0x30 + i), s);
  }
  /* The first block still holds its data after the others were written. */
  write_and_check(p[0], sizes[0], 0x77, s);
  size_t sum = sizes[0] + sizes[1] + sizes[2];
  rmmc_statistics_t st = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(c.statistics, &st), RMMC_SUCCESS);
  ck_assert_int_eq(st.current_bytes, (int64_t)sum);
  ck_assert_int_eq(st.peak_bytes, (int64_t)sum);
  ck_assert_uint_eq(st.total_count, 3);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(c.limiting), sizes[0] + 3072 + sizes[2]);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(c.tracking), 3);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(c.tracking), sum);
  /* Over the limit: refused by limiting, with device figures in the message. */
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(c.statistics, 60 << 20, 256, s, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "limiting resource could not allocate") && strstr(m, "device ") &&
                    strstr(m, "limit 64.00 MiB") && strstr(m, "> cuda"),
                "%s", m);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  /* A scope measures one phase. */
  ck_assert_int_eq(rmmc_statistics_adaptor_push(c.statistics), RMMC_SUCCESS);
  void *r;
  ck_assert_int_eq(rmmc_resource_allocate(c.statistics, 4 << 20, 256, s, &r), RMMC_SUCCESS);
  write_and_check(r, 4 << 20, 0x11, s);
  ck_assert_int_eq(rmmc_resource_deallocate(c.statistics, r, 4 << 20, 256, s), RMMC_SUCCESS);
  rmmc_statistics_t phase = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(c.statistics, &phase), RMMC_SUCCESS);
  ck_assert_int_eq(phase.current_bytes, 0);
  ck_assert_int_eq(phase.peak_bytes, 4 << 20);
  ck_assert_uint_eq(phase.total_count, 1);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(c.statistics, &st), RMMC_SUCCESS);
  ck_assert_int_eq(st.peak_bytes, (int64_t)sum + (4 << 20));
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(c.statistics, p[i], sizes[i], 256, s), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(c.limiting), 0);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(c.logging), RMMC_SUCCESS);
  ck_assert_int_eq(count_substr(c.log_text, ",allocate,"), 4);
  ck_assert_int_eq(count_substr(c.log_text, ",free,"), 4);
  ck_assert_int_eq(count_substr(c.log_text, ",allocate failure,"), 0);
  char stream_col[40];
  snprintf(stream_col, sizeof stream_col, ",%zu,0x%llx\n", sizes[1], (unsigned long long)(uintptr_t)s);
  ck_assert_int_eq(count_substr(c.log_text, stream_col), 2); /* allocate and free of the 3000-byte block */
  CUDA_OK(cudaStreamDestroy(s));
  release(&c);
}
END_TEST

START_TEST(test_gpu_adaptor_stack_cuda_oom_and_foreign_pointer) {
  chain_t c;
  build(&c, SIZE_MAX);
  /* A request CUDA itself cannot meet: every layer sees the failure. */
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(c.statistics, (size_t)1 << 42, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  ck_assert_msg(strstr(rmmc_last_error_message(), "cuda") != NULL, "%s", rmmc_last_error_message());
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(c.limiting), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(c.tracking), 0);
  rmmc_statistics_t st = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(c.statistics, &st), RMMC_SUCCESS);
  ck_assert_uint_eq(st.total_count, 0);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(c.logging), RMMC_SUCCESS);
  ck_assert_int_eq(count_substr(c.log_text, ",allocate failure,0x0,4398046511104,0x0\n"), 1);
  /* A device pointer from elsewhere is refused by tracking (a live block
   * keeps limiting's count above its size, so limiting lets the free
   * through): cudaFree is not called, so the owner can still free it. */
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(c.statistics, 8192, 256, NULL, &p), RMMC_SUCCESS);
  void *foreign;
  CUDA_OK(cudaMalloc(&foreign, 4096));
  ck_assert_int_eq(rmmc_resource_deallocate(c.statistics, foreign, 4096, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "tracking adaptor") != NULL, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(c.tracking), 1);
  CUDA_OK(cudaFree(foreign));
  /* Still serves. */
  write_and_check(p, 8192, 0x42, NULL);
  ck_assert_int_eq(rmmc_resource_deallocate(c.statistics, p, 8192, 256, NULL), RMMC_SUCCESS);
  release(&c);
}
END_TEST

enum { THREADS = 4, PER_THREAD = 200 };

typedef struct worker {
  rmmc_resource_t *r;
  int id;
} worker_t;

static void *gpu_worker(void *arg) {
  worker_t *w = arg;
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) return (void *)1;
  void *held[8] = {0};
  size_t held_n[8] = {0};
  for (int i = 0; i < PER_THREAD; i++) {
    int k = i % 8;
    if (held[k] != NULL && rmmc_resource_deallocate(w->r, held[k], held_n[k], 256, s) != RMMC_SUCCESS)
      return (void *)1;
    held_n[k] = (size_t)(w->id * 4096 + i * 256 + 1);
    if (rmmc_resource_allocate(w->r, held_n[k], 256, s, &held[k]) != RMMC_SUCCESS) return (void *)1;
    if (cudaMemsetAsync(held[k], w->id, held_n[k], s) != cudaSuccess) return (void *)1;
  }
  if (cudaStreamSynchronize(s) != cudaSuccess) return (void *)1;
  for (int k = 0; k < 8; k++)
    if (rmmc_resource_deallocate(w->r, held[k], held_n[k], 256, s) != RMMC_SUCCESS) return (void *)1;
  cudaStreamDestroy(s);
  return NULL;
}

START_TEST(test_gpu_adaptor_stack_threads) {
  chain_t c;
  build(&c, 1 << 30);
  pthread_t th[THREADS];
  worker_t w[THREADS];
  uint64_t bytes = 0;
  for (int t = 0; t < THREADS; t++) {
    w[t] = (worker_t){c.statistics, t};
    for (int i = 0; i < PER_THREAD; i++) bytes += (uint64_t)(t * 4096 + i * 256 + 1);
    ck_assert_int_eq(pthread_create(&th[t], NULL, gpu_worker, &w[t]), 0);
  }
  for (int t = 0; t < THREADS; t++) {
    void *ret;
    pthread_join(th[t], &ret);
    ck_assert_ptr_null(ret);
  }
  rmmc_statistics_t st = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(c.statistics, &st), RMMC_SUCCESS);
  ck_assert_int_eq(st.current_bytes, 0);
  ck_assert_uint_eq(st.total_bytes, bytes);
  ck_assert_uint_eq(st.total_count, (uint64_t)THREADS * PER_THREAD);
  ck_assert_uint_eq(st.deallocations, (uint64_t)THREADS * PER_THREAD);
  ck_assert_int_le(st.peak_count, THREADS * 8);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(c.limiting), 0);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(c.tracking), 0);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(c.logging), RMMC_SUCCESS);
  ck_assert_int_eq(count_substr(c.log_text, "\n"), 1 + 2 * THREADS * PER_THREAD);
  release(&c);
}
END_TEST

START_TEST(test_gpu_adaptor_spec_percent_of_device) {
  size_t ten_percent = 0;
  ck_assert_int_eq(rmmc_percent_of_free_device_memory(-1, 10.0, &ten_percent), RMMC_SUCCESS);
  rmmc_resource_t *r;
  rmmc_status_t st = rmmc_stack_create("statistics > limiting(limit=10%) > tracking > cuda", -1, &r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  rmmc_resource_t *lim = rmmc_resource_upstream(r);
  ck_assert_str_eq(rmmc_resource_name(lim), "limiting");
  size_t limit = rmmc_limiting_adaptor_get_limit(lim);
  /* Free memory moves a little between the two reads. */
  size_t slack = (size_t)256 << 20;
  ck_assert_msg(limit + slack > ten_percent && limit < ten_percent + slack, "limit %zu, 10%% %zu", limit,
                ten_percent);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1 << 20, 256, NULL, &p), RMMC_SUCCESS);
  write_and_check(p, 1 << 20, 0x9a, NULL);
  ck_assert_int_eq(rmmc_resource_allocate(r, limit, 256, NULL, &(void *){NULL}), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1 << 20, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_adaptor_accounting");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_gpu_adaptor_stack_figures);
  tcase_add_test(tc, test_gpu_adaptor_stack_cuda_oom_and_foreign_pointer);
  tcase_add_test(tc, test_gpu_adaptor_stack_threads);
  tcase_add_test(tc, test_gpu_adaptor_spec_percent_of_device);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
