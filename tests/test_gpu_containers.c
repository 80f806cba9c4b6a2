/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Containers, streams, plug-ins and RMMC_ALLOC_CONF on a real GPU.
 *
 * Stream order is tested with a slow writer kernel (gpu_slow_fill): work
 * that must wait for it sees its bytes; calls that must not block the host
 * return while it still runs (cudaStreamQuery says cudaErrorNotReady).
 * Buffers on many pool streams are filled by kernels and read back. Where
 * two devices exist, buffers of device 1 are resized and destroyed while
 * device 0 is current. RMMC_ALLOC_CONF is tested end to end in child
 * processes (this program run again with --alloc-conf-child), since the
 * environment is read once per process. Suite cuda: exits 77 without a
 * GPU, runs without fork.
 */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_kernels.h"
#include "rmmc/rmmc.h"
#include "test_main.h"

extern char **environ;

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)
#define RMMC_OK(x)                                                                                 \
  do {                                                                                             \
    rmmc_status_t st_ = (x);                                                                       \
    ck_assert_msg(st_ == RMMC_SUCCESS, "%s: %s: %s", #x, rmmc_status_name(st_),                    \
                  rmmc_last_error_message());                                                      \
  } while (0)

#define SLOW_NS ((uint64_t)50 * 1000 * 1000) /* 50 ms of spinning before the writes */
#define MiB ((size_t)1 << 20)

static rmmc_resource_t *async_resource(int device) {
  rmmc_cuda_async_options_t o = RMMC_CUDA_ASYNC_OPTIONS_INIT;
  o.initial_pool_size = 64 * MiB;
  rmmc_resource_t *r;
  RMMC_OK(rmmc_cuda_async_resource_create(device, &o, &r));
  return r;
}

static cudaStream_t new_stream(void) {
  cudaStream_t s;
  RMMC_OK(rmmc_stream_create(cudaStreamNonBlocking, &s));
  return s;
}

/* Reads [offset, offset + n) of the buffer and checks every byte is v. */
static void expect_bytes(const rmmc_buffer_t *b, size_t offset, size_t n, unsigned char v) {
  unsigned char *h = malloc(n);
  RMMC_OK(rmmc_buffer_copy_to_host(b, offset, h, n));
  for (size_t i = 0; i < n; i++)
    if (h[i] != v) ck_abort_msg("byte %zu is 0x%02x, not 0x%02x", offset + i, h[i], v);
  free(h);
}

static void expect_pattern(const rmmc_buffer_t *b, size_t n, uint32_t seed) {
  unsigned char *h = malloc(n);
  RMMC_OK(rmmc_buffer_copy_to_host(b, 0, h, n));
  for (size_t i = 0; i < n; i++)
    if (h[i] != (unsigned char)((seed + i * 131u) & 0xffu))
      ck_abort_msg("seed %u: byte %zu is 0x%02x", seed, i, h[i]);
  free(h);
}

START_TEST(test_gpu_buffer_reallocation_is_stream_ordered) {
  rmmc_resource_t *r = async_resource(0);
  cudaStream_t s = new_stream();
  rmmc_buffer_t b;
  RMMC_OK(rmmc_buffer_create(&b, 1 * MiB, s, r));
  ck_assert_int_eq(b.device, 0);
  CUDA_OK(gpu_slow_fill(b.data, 1 * MiB, 0xab, SLOW_NS, s));
  /* The copy into the new block is enqueued after the writer, and the host
   * is not held up: the writer is still running when resize returns. */
  RMMC_OK(rmmc_buffer_resize(&b, 4 * MiB));
  ck_assert_int_eq(cudaStreamQuery(s), cudaErrorNotReady);
  expect_bytes(&b, 0, 1 * MiB, 0xab);
  CUDA_OK(gpu_slow_fill(b.data, 4 * MiB, 0xcd, SLOW_NS, s));
  RMMC_OK(rmmc_buffer_reserve(&b, 8 * MiB));
  ck_assert_int_eq(cudaStreamQuery(s), cudaErrorNotReady);
  ck_assert_uint_eq(b.capacity, 8 * MiB);
  expect_bytes(&b, 0, 4 * MiB, 0xcd);
  RMMC_OK(rmmc_buffer_resize(&b, 3 * MiB));
  CUDA_OK(gpu_slow_fill(b.data, 3 * MiB, 0x17, SLOW_NS, s));
  RMMC_OK(rmmc_buffer_shrink_to_fit(&b));
  ck_assert_int_eq(cudaStreamQuery(s), cudaErrorNotReady);
  ck_assert_uint_eq(b.capacity, 3 * MiB);
  expect_bytes(&b, 0, 3 * MiB, 0x17);
  RMMC_OK(rmmc_buffer_destroy(&b));
  CUDA_OK(cudaStreamSynchronize(s));
  RMMC_OK(rmmc_stream_destroy(s));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

START_TEST(test_gpu_buffer_stream_change_and_copy_wait) {
  rmmc_resource_t *r = async_resource(0);
  cudaStream_t s1 = new_stream(), s2 = new_stream(), s3 = new_stream();
  rmmc_buffer_t a, c;
  RMMC_OK(rmmc_buffer_create(&a, 2 * MiB, s1, r));
  CUDA_OK(gpu_slow_fill(a.data, 2 * MiB, 0x11, SLOW_NS, s1));
  /* s2 waits for s1 without the host waiting. */
  RMMC_OK(rmmc_buffer_set_stream(&a, s2));
  ck_assert_int_eq(cudaStreamQuery(s1), cudaErrorNotReady);
  ck_assert_ptr_eq(a.stream, s2);
  expect_bytes(&a, 0, 2 * MiB, 0x11);
  /* A copy on a third stream waits for the source's stream. */
  CUDA_OK(gpu_slow_fill(a.data, 2 * MiB, 0x22, SLOW_NS, s2));
  RMMC_OK(rmmc_buffer_create_copy(&c, &a, s3, r));
  ck_assert_int_eq(cudaStreamQuery(s2), cudaErrorNotReady);
  expect_bytes(&c, 0, 2 * MiB, 0x22);
  /* The copy is deep. */
  CUDA_OK(cudaMemsetAsync(c.data, 0x33, 2 * MiB, s3));
  expect_bytes(&a, 0, 2 * MiB, 0x22);
  RMMC_OK(rmmc_buffer_destroy(&a));
  RMMC_OK(rmmc_buffer_destroy(&c));
  CUDA_OK(cudaDeviceSynchronize());
  RMMC_OK(rmmc_stream_destroy(s1));
  RMMC_OK(rmmc_stream_destroy(s2));
  RMMC_OK(rmmc_stream_destroy(s3));
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_gpu_buffers_on_many_streams) {
  rmmc_resource_t *r = async_resource(0);
  rmmc_stream_pool_t *pool;
  RMMC_OK(rmmc_stream_pool_create(8, cudaStreamNonBlocking, -1, &pool));
  ck_assert_uint_eq(rmmc_stream_pool_size(pool), 8);
  ck_assert_int_eq(rmmc_stream_pool_device(pool), 0);
  enum { N = 32 };
  rmmc_buffer_t b[N];
  for (uint32_t i = 0; i < N; i++) {
    cudaStream_t s = rmmc_stream_pool_get(pool);
    ck_assert_ptr_eq(s, rmmc_stream_pool_get_at(pool, i)); /* round-robin from 0 */
    RMMC_OK(rmmc_buffer_create(&b[i], 1 * MiB + i * 4096, s, r));
    CUDA_OK(gpu_fill_pattern(b[i].data, b[i].size, i, s));
    RMMC_OK(rmmc_buffer_reserve(&b[i], 2 * MiB)); /* stream-ordered copy */
  }
  for (uint32_t i = 0; i < N; i++) {
    expect_pattern(&b[i], b[i].size, i);
    RMMC_OK(rmmc_buffer_destroy(&b[i]));
  }
  /* Distinct streams; get_at wraps. */
  for (size_t i = 0; i < 8; i++)
    for (size_t j = i + 1; j < 8; j++)
      ck_assert_ptr_ne(rmmc_stream_pool_get_at(pool, i), rmmc_stream_pool_get_at(pool, j));
  ck_assert_ptr_eq(rmmc_stream_pool_get_at(pool, 3), rmmc_stream_pool_get_at(pool, 11));
  rmmc_stream_pool_destroy(pool);
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

static rmmc_stream_pool_t *g_pool;

static void *take_streams(void *arg) {
  size_t *counts = arg;
  for (int i = 0; i < 10000; i++) {
    cudaStream_t s = rmmc_stream_pool_get(g_pool);
    size_t k = 0;
    while (k < 8 && rmmc_stream_pool_get_at(g_pool, k) != s) k++;
    counts[k]++; /* k == 8: not a pool stream */
  }
  return NULL;
}

START_TEST(test_gpu_stream_pool_threads_and_helpers) {
  RMMC_OK(rmmc_stream_pool_create(8, 0, 0, &g_pool));
  pthread_t t[8];
  size_t counts[8][9] = {{0}};
  for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, take_streams, counts[i]);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  /* 80000 gets over 8 streams, round-robin: exactly 10000 each. */
  for (int k = 0; k <= 8; k++) {
    size_t sum = 0;
    for (int i = 0; i < 8; i++) sum += counts[i][k];
    ck_assert_uint_eq(sum, k < 8 ? 10000 : 0);
  }
  rmmc_stream_pool_destroy(g_pool);
  /* rmmc_stream_wait orders raw CUDA work too. */
  cudaStream_t s1 = new_stream(), s2 = new_stream();
  void *d;
  unsigned char *h;
  CUDA_OK(cudaMalloc(&d, MiB));
  CUDA_OK(cudaMallocHost((void **)&h, MiB));
  CUDA_OK(gpu_slow_fill(d, MiB, 0x42, SLOW_NS, s1));
  RMMC_OK(rmmc_stream_wait(s2, s1));
  ck_assert_int_eq(cudaStreamQuery(s1), cudaErrorNotReady);
  CUDA_OK(cudaMemcpyAsync(h, d, MiB, cudaMemcpyDeviceToHost, s2));
  RMMC_OK(rmmc_stream_synchronize(s2));
  for (size_t i = 0; i < MiB; i++)
    if (h[i] != 0x42) ck_abort_msg("byte %zu is 0x%02x", i, h[i]);
  CUDA_OK(cudaFreeHost(h));
  CUDA_OK(cudaFree(d));
  RMMC_OK(rmmc_stream_destroy(s1));
  RMMC_OK(rmmc_stream_destroy(s2));
  rmmc_stream_pool_t *p;
  ck_assert_int_eq(rmmc_stream_pool_create(2, 0, rmmc_device_count(), &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
}
END_TEST

START_TEST(test_gpu_vector_and_scalar) {
  rmmc_resource_t *r = async_resource(0);
  cudaStream_t s = new_stream();
  rmmc_vector_t v;
  RMMC_OK(rmmc_vector_create(&v, 4 * MiB, 1, s, r));
  CUDA_OK(gpu_slow_fill(rmmc_vector_data(&v), 4 * MiB, 0x5a, SLOW_NS, s));
  unsigned char c = 0;
  RMMC_OK(rmmc_vector_get(&v, 4 * MiB - 1, &c, 1)); /* waits for the writer */
  ck_assert_uint_eq(c, 0x5a);
  RMMC_OK(rmmc_vector_destroy(&v));
  RMMC_OK(rmmc_vector_create(&v, 1000, sizeof(int), s, r));
  for (int i = 0; i < 1000; i += 111) RMMC_OK(rmmc_vector_set(&v, (size_t)i, &(int){-i}, sizeof(int)));
  static const int kept = 4242; /* outlives the copy: set_async's contract */
  RMMC_OK(rmmc_vector_set_async(&v, 998, &kept, sizeof kept));
  RMMC_OK(rmmc_vector_resize(&v, 100000));
  int x;
  for (int i = 0; i < 1000; i += 111) {
    RMMC_OK(rmmc_vector_get(&v, (size_t)i, &x, sizeof x));
    ck_assert_int_eq(x, -i);
  }
  RMMC_OK(rmmc_vector_get(&v, 998, &x, sizeof x));
  ck_assert_int_eq(x, 4242);
  ck_assert_int_eq(rmmc_vector_get(&v, 100000, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  RMMC_OK(rmmc_vector_destroy(&v));
  rmmc_scalar_t sc;
  RMMC_OK(rmmc_scalar_create_from(&sc, &(double){2.5}, sizeof(double), s, r));
  double d = 0;
  RMMC_OK(rmmc_scalar_get(&sc, &d, sizeof d));
  ck_assert(d == 2.5);
  CUDA_OK(cudaMemsetAsync(rmmc_scalar_data(&sc), 0, sizeof(double), s));
  RMMC_OK(rmmc_scalar_get(&sc, &d, sizeof d));
  ck_assert(d == 0.0);
  RMMC_OK(rmmc_scalar_destroy(&sc));
  /* Pinned and managed memory work the same way, and the CPU may read them
   * once the stream is done. */
  rmmc_resource_t *pinned, *managed;
  RMMC_OK(rmmc_pinned_resource_create(&pinned));
  RMMC_OK(rmmc_managed_resource_create(0, NULL, &managed));
  rmmc_resource_t *kinds[2] = {pinned, managed};
  for (int k = 0; k < 2; k++) {
    rmmc_buffer_t b;
    RMMC_OK(rmmc_buffer_create(&b, MiB, s, kinds[k]));
    ck_assert_int_eq(b.device, 0);
    CUDA_OK(gpu_fill_pattern(b.data, MiB, 77, s));
    RMMC_OK(rmmc_buffer_resize(&b, 2 * MiB));
    RMMC_OK(rmmc_stream_synchronize(s));
    for (size_t i = 0; i < MiB; i += 4093)
      ck_assert_uint_eq(((unsigned char *)b.data)[i], (unsigned char)((77 + i * 131u) & 0xffu));
    RMMC_OK(rmmc_buffer_destroy(&b));
  }
  rmmc_resource_release(pinned);
  rmmc_resource_release(managed);
  RMMC_OK(rmmc_stream_destroy(s));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

START_TEST(test_gpu_buffer_of_another_device) {
  if (rmmc_device_count() < 2) {
    fprintf(stderr, "test_gpu_buffer_of_another_device: one device only, skipped\n");
    return;
  }
  int cur;
  CUDA_OK(cudaSetDevice(1));
  rmmc_buffer_t b, e;
  RMMC_OK(rmmc_buffer_create(&b, MiB, NULL, NULL)); /* device 1's registry resource */
  ck_assert_int_eq(b.device, 1);
  CUDA_OK(cudaMemset(b.data, 0x61, MiB));
  CUDA_OK(cudaSetDevice(0));
  rmmc_resource_t *r1 = async_resource(1);
  RMMC_OK(rmmc_buffer_create(&e, MiB, NULL, r1)); /* made while device 0 is current */
  ck_assert_int_eq(e.device, 1);
  /* Resize, read and destroy with device 0 current. */
  RMMC_OK(rmmc_buffer_resize(&b, 3 * MiB));
  struct cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, b.data));
  ck_assert_int_eq(attr.device, 1);
  CUDA_OK(cudaGetDevice(&cur));
  ck_assert_int_eq(cur, 0);
  expect_bytes(&b, 0, MiB, 0x61);
  /* A copy onto device 0 waits for the slow writer on b's stream (device
   * 1's legacy stream). */
  cudaStream_t s0 = new_stream();
  rmmc_buffer_t c0;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(gpu_slow_fill(b.data, MiB, 0x63, SLOW_NS, b.stream));
  CUDA_OK(cudaSetDevice(0));
  RMMC_OK(rmmc_buffer_create_copy(&c0, &b, s0, NULL));
  ck_assert_int_eq(c0.device, 0);
  expect_bytes(&c0, 0, MiB, 0x63);
  RMMC_OK(rmmc_buffer_destroy(&c0));
  RMMC_OK(rmmc_stream_destroy(s0));
  RMMC_OK(rmmc_buffer_destroy(&b));
  RMMC_OK(rmmc_buffer_destroy(&e));
  CUDA_OK(cudaGetDevice(&cur));
  ck_assert_int_eq(cur, 0);
  rmmc_resource_release(r1);
  CUDA_OK(cudaGetLastError());
}
END_TEST

START_TEST(test_gpu_plugins_record_stream_delays_reuse) {
  rmmc_resource_t *r = async_resource(0);
  rmmc_resource_t *prev;
  RMMC_OK(rmmc_set_device_resource(0, r, &prev));
  rmmc_plugin_reset_stats();
  cudaStream_t s1 = new_stream(), s2 = new_stream();
  const size_t n = 8 * MiB;
  void *p = rmmc_torch_alloc(n, 0, s1);
  ck_assert_msg(p != NULL, "%s", rmmc_last_error_message());
  CUDA_OK(cudaMemsetAsync(p, 0, n, s1));
  CUDA_OK(cudaStreamSynchronize(s1));
  /* The block is used on s2 (a slow writer), then freed on s1. */
  rmmc_torch_record_stream(p, s2);
  CUDA_OK(gpu_slow_fill(p, n, 0xcd, SLOW_NS, s2));
  rmmc_torch_free(p, n, 0, s1);
  ck_assert_int_eq(cudaStreamQuery(s2), cudaErrorNotReady); /* no host wait */
  void *q = rmmc_torch_alloc(n, 0, s1);
  ck_assert_ptr_nonnull(q);
  CUDA_OK(cudaMemsetAsync(q, 0, n, s1));
  CUDA_OK(cudaDeviceSynchronize());
  if (q == p) {
    /* The memset was ordered after the writer, so zeros are what stays. */
    unsigned char *h = malloc(n);
    CUDA_OK(cudaMemcpy(h, q, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
      if (h[i] != 0) ck_abort_msg("byte %zu is 0x%02x: reused before s2 was done", i, h[i]);
    free(h);
  } else {
    fprintf(stderr, "record_stream test: the pool did not hand the block out again\n");
  }
  rmmc_torch_free(q, n, 0, s1);
  rmmc_plugin_stats_t st = RMMC_PLUGIN_STATS_INIT;
  RMMC_OK(rmmc_plugin_get_stats(0, &st));
  ck_assert_uint_eq(st.recorded_streams, 1);
  ck_assert_uint_eq(st.deallocations, 2);
  ck_assert_uint_eq(st.deallocation_failures, 0);
  CUDA_OK(cudaDeviceSynchronize());
  RMMC_OK(rmmc_stream_destroy(s1));
  RMMC_OK(rmmc_stream_destroy(s2));
  rmmc_resource_t *mine;
  RMMC_OK(rmmc_set_device_resource(0, prev, &mine));
  rmmc_resource_release(mine);
  rmmc_resource_release(prev);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_gpu_plugins_on_the_default_resource) {
  rmmc_plugin_reset_stats();
  cudaStream_t s = new_stream();
  unsigned char h[4096];
  void *t = rmmc_torch_alloc(1 << 20, 0, s);
  void *c = rmmc_cupy_malloc((void *)s, 4096, 0);
  ck_assert_ptr_nonnull(t);
  ck_assert_ptr_nonnull(c);
  CUDA_OK(cudaMemsetAsync(c, 0x7e, 4096, s));
  CUDA_OK(cudaMemcpyAsync(h, c, 4096, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_uint_eq(h[4095], 0x7e);
  rmmc_cupy_free(NULL, c, 0);
  rmmc_torch_free(t, 1 << 20, 0, s);
  /* The memory fraction becomes a limit on what the plug-ins hand out. */
  rmmc_torch_set_memory_fraction(0.01, 0);
  rmmc_plugin_stats_t st = RMMC_PLUGIN_STATS_INIT;
  RMMC_OK(rmmc_plugin_get_stats(0, &st));
  ck_assert_uint_gt(st.limit, 0);
  ck_assert_ptr_null(rmmc_torch_alloc(st.limit + 1, 0, s));
  char msg[1024];
  rmmc_plugin_last_error(msg, sizeof msg);
  ck_assert_ptr_nonnull(strstr(msg, "plug-in limit"));
  RMMC_OK(rmmc_plugin_set_limit(0, 0));
  /* A real out-of-memory returns NULL with the resource's message. */
  ck_assert_ptr_null(rmmc_torch_alloc((size_t)1 << 45, 0, s));
  rmmc_plugin_last_error(msg, sizeof msg);
  ck_assert_ptr_nonnull(strstr(msg, "out of memory"));
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  rmmc_torch_empty_cache();
  RMMC_OK(rmmc_plugin_get_stats(0, &st));
  ck_assert_uint_eq(st.allocations, 2);
  ck_assert_uint_eq(st.deallocations, 2);
  ck_assert_uint_eq(st.allocation_failures, 2);
  ck_assert_uint_eq(st.live_blocks, 0);
  RMMC_OK(rmmc_stream_destroy(s));
}
END_TEST

/* ---- RMMC_ALLOC_CONF end to end, in child processes ---- */

/* The child: builds the current device's default, checks its name and the
 * configuration status (a status name, or FAILURE for any but SUCCESS),
 * allocates through it. Exit 0 when all agree. want_name "-": the lookup
 * must fail (strict configuration) with want_status, and so must an
 * allocation through the default. */
static int alloc_conf_child(const char *want_name, const char *want_status) {
  rmmc_resource_t *r;
  rmmc_status_t st = rmmc_get_current_device_resource(&r);
  if (strcmp(want_name, "-") == 0) {
    void *p = NULL;
    rmmc_status_t ast = rmmc_allocate(1 << 20, NULL, &p);
    fprintf(stderr, "get: %s\n", rmmc_last_error_message());
    bool status_ok = strcmp(want_status, "FAILURE") == 0 ? st != RMMC_SUCCESS
                                                         : strcmp(rmmc_status_name(st), want_status) == 0;
    return status_ok && ast == st && p == NULL ? 0 : 1;
  }
  if (st != RMMC_SUCCESS) {
    printf("get: %s\n", rmmc_last_error_message());
    return 1;
  }
  const char *spec, *message;
  rmmc_status_t cs = rmmc_default_config_status(&spec, &message);
  printf("resource=%s status=%s spec=%s\n", rmmc_resource_name(r), rmmc_status_name(cs), spec);
  void *p;
  if (rmmc_allocate(1 << 20, NULL, &p) != RMMC_SUCCESS || cudaMemset(p, 1, 1 << 20) != cudaSuccess ||
      rmmc_deallocate(p, 1 << 20, NULL) != RMMC_SUCCESS)
    return 1;
  bool status_ok = strcmp(want_status, "FAILURE") == 0 ? cs != RMMC_SUCCESS
                                                       : strcmp(rmmc_status_name(cs), want_status) == 0;
  return strcmp(rmmc_resource_name(r), want_name) == 0 && status_ok ? 0 : 1;
}

/* Runs the child with RMMC_ALLOC_CONF=conf and one more variable, extra
 * ("NAME=value"; NULL: none), and returns its stderr; *code gets its exit
 * status. */
static char *run_child(const char *conf, const char *extra, const char *want_name,
                       const char *want_status, int *code) {
  static char err[16384];
  size_t n = 0, nenv = 0;
  while (environ[n] != NULL) n++;
  char **env = calloc(n + 3, sizeof *env);
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "RMMC_ALLOC_CONF", 15) != 0 && strncmp(environ[i], "RMMC_NO_CACHING=", 16) != 0)
      env[nenv++] = environ[i];
  char a[512];
  if (conf != NULL) {
    snprintf(a, sizeof a, "RMMC_ALLOC_CONF=%s", conf);
    env[nenv++] = a;
  }
  if (extra != NULL) env[nenv++] = (char *)extra;
  int pipefd[2];
  ck_assert_int_eq(pipe(pipefd), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  char *argv[] = {"test_gpu_containers", "--alloc-conf-child", (char *)want_name,
                  (char *)want_status, NULL};
  pid_t pid;
  ck_assert_int_eq(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, env), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  size_t used = 0;
  ssize_t got;
  while ((got = read(pipefd[0], err + used, sizeof err - 1 - used)) > 0) used += (size_t)got;
  err[used] = '\0';
  close(pipefd[0]);
  int wstatus;
  ck_assert_int_eq(waitpid(pid, &wstatus, 0), pid);
  *code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128;
  free(env);
  return err;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

START_TEST(test_gpu_alloc_conf_end_to_end) {
  int code;
  char *err = run_child("cuda_async(initial=16MiB)", NULL, "cuda_async", "SUCCESS", &code);
  ck_assert_msg(code == 0, "good spec: exit %d, stderr: %s", code, err);
  ck_assert_int_eq(count_of(err, "rmmc:"), 0);
  /* a typo is refused loudly: every lookup fails with the parse status */
  err = run_child("cuda_asink(initial=16MiB)", NULL, "-", "ERROR_PARSE", &code);
  ck_assert_msg(code == 0, "bad spec: exit %d, stderr: %s", code, err);
  ck_assert_int_ge(count_of(err, "RMMC_ALLOC_CONF is not a valid stack spec"), 1);
  ck_assert_int_eq(count_of(err, "rmmc: RMMC_ALLOC_CONF is not a valid stack spec"), 1);
  ck_assert_ptr_nonnull(strstr(err, "unknown resource 'cuda_asink'"));
  /* ... unless the process opted into the fallback */
  err = run_child("cuda_asink(initial=16MiB)", "RMMC_ALLOC_CONF_FALLBACK=1", "cuda", "ERROR_PARSE", &code);
  ck_assert_msg(code == 0, "bad spec with fallback: exit %d, stderr: %s", code, err);
  ck_assert_int_eq(count_of(err, "rmmc: RMMC_ALLOC_CONF is not a valid stack spec"), 1);
  err = run_child("cuda_async", "RMMC_NO_CACHING=1", "cuda", "SUCCESS", &code);
  ck_assert_msg(code == 0, "no caching: exit %d, stderr: %s", code, err);
  err = run_child("cuda_async(initial=100TiB)", "RMMC_ALLOC_CONF_FALLBACK=1", "cuda", "FAILURE", &code);
  ck_assert_msg(code == 0, "unbuildable spec: exit %d, stderr: %s", code, err);
  ck_assert_int_eq(count_of(err, "could not be built for device 0"), 1);
  err = run_child("cuda_async(initial=100TiB)", NULL, "-", "FAILURE", &code);
  ck_assert_msg(code == 0, "unbuildable spec, strict: exit %d, stderr: %s", code, err);
  ck_assert_ptr_nonnull(strstr(err, "RMMC_ALLOC_CONF_FALLBACK=1 uses the plain cuda resource"));
  err = run_child(NULL, NULL, "cuda", "SUCCESS", &code);
  ck_assert_msg(code == 0, "unset: exit %d, stderr: %s", code, err);
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--alloc-conf-child") == 0)
    return alloc_conf_child(argv[2], argv[3]);
  Suite *s = suite_create("gpu_containers");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_gpu_buffer_reallocation_is_stream_ordered);
  tcase_add_test(tc, test_gpu_buffer_stream_change_and_copy_wait);
  tcase_add_test(tc, test_gpu_buffers_on_many_streams);
  tcase_add_test(tc, test_gpu_stream_pool_threads_and_helpers);
  tcase_add_test(tc, test_gpu_vector_and_scalar);
  tcase_add_test(tc, test_gpu_buffer_of_another_device);
  tcase_add_test(tc, test_gpu_plugins_record_stream_delays_reuse);
  tcase_add_test(tc, test_gpu_plugins_on_the_default_resource);
  tcase_add_test(tc, test_gpu_alloc_conf_end_to_end);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
