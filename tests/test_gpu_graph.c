/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA graphs through the pool on a GPU: a capture that allocates (and
 * grows the pool) is not invalidated, with or without a private pool; a
 * graph captured into a private pool replays 100 times with the right data
 * while other streams allocate and write meanwhile (their blocks never
 * overlap the graph's memory, and neither corrupts the other); one thread
 * capturing in thread-local mode while others allocate and free on their
 * own streams; release gives the memory back. The same through layers that
 * cache above the pool (binning, fixed_size; issue 25, F7): a block asked
 * for on the capture stream right after the capture is not overwritten by
 * the graph's replays, and a capture beside threads allocating through
 * them. Suite cuda: exits 77 without a GPU, runs without fork.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_kernels.h"
#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static unsigned long long pattern_errors(const void *d, size_t n, uint32_t seed, cudaStream_t s) {
  unsigned long long *e, h = ~0ull;
  CUDA_OK(cudaMalloc((void **)&e, sizeof *e));
  CUDA_OK(cudaMemsetAsync(e, 0, sizeof *e, s));
  CUDA_OK(gpu_check_pattern(d, n, seed, e, s));
  CUDA_OK(cudaMemcpyAsync(&h, e, sizeof h, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaFree(e));
  return h;
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

enum { NG = 6 };
static const size_t gsizes[NG] = {64 * KiB, 3 * MiB, 200 * KiB, 9 * MiB, 1000, 24 * MiB};

/* Captures on s: allocate every size, fill the first with a pattern, copy
 * it along the chain (each block into the next), free the first half
 * inside the capture and allocate them again (reuse in stream order). The
 * last block holds the pattern at each replay. */
static void capture_chain(rmmc_resource_t *r, cudaStream_t s, void **g, cudaGraph_t *graph) {
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < NG; i++)
    ck_assert_msg(rmmc_resource_allocate(r, gsizes[i], 256, s, &g[i]) == RMMC_SUCCESS, "%s",
                  rmmc_last_error_message());
  CUDA_OK(gpu_fill_pattern(g[0], gsizes[0], 4242, s));
  for (int i = 1; i < NG; i++) {
    size_t n = gsizes[i] < gsizes[0] ? gsizes[i] : gsizes[0];
    CUDA_OK(cudaMemcpyAsync(g[i], g[0], n, cudaMemcpyDeviceToDevice, s));
  }
  for (int i = 1; i < NG / 2; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], gsizes[i], 256, s), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, gsizes[i], 256, s, &g[i]), RMMC_SUCCESS);
    CUDA_OK(cudaMemsetAsync(g[i], 0x11, gsizes[i], s));
  }
  CUDA_OK(cudaStreamEndCapture(s, graph)); /* fails if anything invalidated the capture */
}

START_TEST(test_gpu_graph_private_pool_replays) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("statistics > pool > cuda", -1, &r), RMMC_SUCCESS);
  cudaStream_t s, t;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 11, 0, false, NULL), RMMC_SUCCESS);
  void *g[NG];
  cudaGraph_t graph;
  capture_chain(r, s, g, &graph);
  ck_assert_int_eq(rmmc_pool_graph_end(r, 11, 0), RMMC_SUCCESS);
  rmmc_resource_t *pool = rmmc_resource_upstream(r);
  uint64_t graph_bytes = field(pool, "graph_bytes");
  size_t total = 0;
  for (int i = 0; i < NG; i++) total += gsizes[i];
  ck_assert_uint_ge(graph_bytes, total);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  /* Replays, with another stream allocating, writing and freeing between
   * them: its blocks never overlap the graph's, the graph's output stays
   * right, and the other stream's data stays its own. */
  for (int rep = 0; rep < 100; rep++) {
    CUDA_OK(cudaGraphLaunch(exec, s));
    void *o[4];
    size_t on[4] = {64 * KiB, 9 * MiB, 24 * MiB, 3 * MiB};
    for (int k = 0; k < 4; k++) {
      ck_assert_int_eq(rmmc_resource_allocate(r, on[k], 256, t, &o[k]), RMMC_SUCCESS);
      for (int i = 0; i < NG; i++) ck_assert(!overlaps(o[k], on[k], g[i], gsizes[i]));
      CUDA_OK(gpu_fill_pattern(o[k], on[k], 100u + (uint32_t)rep, t));
    }
    if (rep % 25 == 24) {
      ck_assert_uint_eq(pattern_errors(g[NG - 1], gsizes[0], 4242, s), 0);
      ck_assert_uint_eq(pattern_errors(o[1], on[1], 100u + (uint32_t)rep, t), 0);
    }
    for (int k = 0; k < 4; k++) ck_assert_int_eq(rmmc_resource_deallocate(r, o[k], on[k], 256, t), RMMC_SUCCESS);
  }
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  /* The graph goes, then its pool: every block back, the device's memory
   * with it. */
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int i = 0; i < NG; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], gsizes[i], 256, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 11, 0), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "graph_pools"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "reserved"), 0);
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaStreamDestroy(t));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

/* No private pool: the capture still survives allocations that grow the
 * pool (driver calls under a relaxed capture mode) and frees (no event
 * recorded into the graph). */
START_TEST(test_gpu_graph_capture_without_routing) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool > cuda", -1, &r), RMMC_SUCCESS);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *g[NG];
  cudaGraph_t graph;
  capture_chain(r, s, g, &graph);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 10; rep++) CUDA_OK(cudaGraphLaunch(exec, s));
  ck_assert_uint_eq(pattern_errors(g[NG - 1], gsizes[0], 4242, s), 0);
  ck_assert_uint_eq(field(r, "device_syncs"), 0);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int i = 0; i < NG; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], gsizes[i], 256, s), RMMC_SUCCESS);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

/* One thread captures in thread-local mode into a private pool while three
 * others allocate, fill, check and free on their own streams. */
typedef struct other {
  rmmc_resource_t *r;
  int index;
  volatile int *stop;
  int bad;
  long rounds;
} other_t;

static void *other_main(void *arg) {
  other_t *o = arg;
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    o->bad = 1;
    return NULL;
  }
  unsigned long long *e;
  if (cudaMalloc((void **)&e, sizeof *e) != cudaSuccess) o->bad = 2;
  while (!*o->stop && !o->bad) {
    size_t n = (size_t)(o->rounds % 7 + 1) * 700 * KiB;
    void *p;
    unsigned long long h = 1;
    if (rmmc_resource_allocate(o->r, n, 256, s, &p) != RMMC_SUCCESS ||
        gpu_fill_pattern(p, n, (uint32_t)o->rounds, s) != cudaSuccess ||
        cudaMemsetAsync(e, 0, sizeof *e, s) != cudaSuccess ||
        gpu_check_pattern(p, n, (uint32_t)o->rounds, e, s) != cudaSuccess ||
        cudaMemcpyAsync(&h, e, sizeof h, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess || h != 0 ||
        rmmc_resource_deallocate(o->r, p, n, 256, s) != RMMC_SUCCESS)
      o->bad = 3;
    o->rounds++;
  }
  (void)cudaFree(e);
  (void)cudaStreamDestroy(s);
  return NULL;
}

/* The stack's pool layer (the first with graph figures). */
static rmmc_resource_t *pool_of(rmmc_resource_t *r) {
  uint64_t v;
  while (r != NULL && !rmmc_resource_get_field(r, "graph_pools", &v)) r = rmmc_resource_upstream(r);
  ck_assert_ptr_nonnull(r);
  return r;
}

static const char *const others_specs[] = {"pool > cuda", "binning > pool > cuda",
                                           "statistics > binning(max=1MiB) > pool > cuda"};

START_TEST(test_gpu_graph_capture_while_others_allocate) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(others_specs[_i], -1, &r), RMMC_SUCCESS);
  volatile int stop = 0;
  enum { T = 3 };
  other_t o[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    o[i] = (other_t){.r = r, .index = i, .stop = &stop};
    ck_assert_int_eq(pthread_create(&th[i], NULL, other_main, &o[i]), 0);
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int round = 0; round < 5; round++) {
    ck_assert_int_eq(rmmc_pool_graph_begin(r, 21, (uint64_t)round, false, NULL), RMMC_SUCCESS);
    void *g[NG];
    cudaGraph_t graph;
    capture_chain(r, s, g, &graph);
    ck_assert_int_eq(rmmc_pool_graph_end(r, 21, (uint64_t)round), RMMC_SUCCESS);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 20; rep++) CUDA_OK(cudaGraphLaunch(exec, s));
    ck_assert_uint_eq(pattern_errors(g[NG - 1], gsizes[0], 4242, s), 0);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    for (int i = 0; i < NG; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], gsizes[i], 256, s), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_pool_graph_release(r, 21, (uint64_t)round), RMMC_SUCCESS);
  }
  stop = 1;
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) {
    ck_assert_msg(o[i].bad == 0, "thread %d failed (%d) after %ld rounds", i, o[i].bad, o[i].rounds);
    ck_assert_int_gt(o[i].rounds, 0);
  }
  rmmc_resource_t *pool = pool_of(r);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "graph_pools"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

/* Issue 25, F7 on the device: small blocks captured through a caching
 * layer (routed by capture, as PyTorch's hooks do), one freed inside the
 * capture; right after it a block of the same size on the capture stream
 * holds data of its own while the graph replays 50 times: the graph must
 * not write it (with the bug the graph's freed block came back and the
 * replays overwrote it). */
static const char *const caching_specs[] = {"binning > pool > cuda",
                                            "fixed_size(block=4KiB) > pool > cuda",
                                            "binning > statistics > pool > cuda"};

START_TEST(test_gpu_graph_through_caching_layers) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(caching_specs[_i], -1, &r), RMMC_SUCCESS);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  enum { K = 8 };
  const size_t n = 4 * KiB;
  void *warm[K], *g[K], *after[K];
  /* The layer's cache holds blocks from before the capture. */
  for (int i = 0; i < K; i++) ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, s, &warm[i]), RMMC_SUCCESS);
  for (int i = 0; i < K; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, warm[i], n, 256, s), RMMC_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s));
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 31, 1, false, NULL), RMMC_SUCCESS);
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < K; i++) {
    ck_assert_msg(rmmc_resource_allocate(r, n, 256, s, &g[i]) == RMMC_SUCCESS, "%s",
                  rmmc_last_error_message());
    CUDA_OK(gpu_fill_pattern(g[i], n, 5000u + (uint32_t)i, s));
  }
  for (int i = 0; i < K; i += 2) /* scratch freed inside the capture */
    ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], n, 256, s), RMMC_SUCCESS);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ck_assert_int_eq(rmmc_pool_graph_end(r, 31, 1), RMMC_SUCCESS);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < K; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, s, &after[i]), RMMC_SUCCESS);
    for (int k = 0; k < K; k++)
      ck_assert_msg(!overlaps(after[i], n, g[k], n), "%s: block %p after the capture is the "
                    "graph's", caching_specs[_i], after[i]);
    CUDA_OK(gpu_fill_pattern(after[i], n, 9000u + (uint32_t)i, s));
  }
  for (int rep = 0; rep < 50; rep++) CUDA_OK(cudaGraphLaunch(exec, s));
  for (int i = 0; i < K; i++)
    ck_assert_msg(pattern_errors(after[i], n, 9000u + (uint32_t)i, s) == 0,
                  "%s: the graph's replays overwrote a block handed out after the capture",
                  caching_specs[_i]);
  for (int i = 1; i < K; i += 2) ck_assert_uint_eq(pattern_errors(g[i], n, 5000u + (uint32_t)i, s), 0);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int i = 0; i < K; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, after[i], n, 256, s), RMMC_SUCCESS);
  for (int i = 1; i < K; i += 2) ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], n, 256, s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 31, 1), RMMC_SUCCESS);
  rmmc_resource_t *pool = pool_of(r);
  ck_assert_uint_eq(field(pool, "graph_pools"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  CUDA_OK(cudaStreamDestroy(s));
  rmmc_resource_release(r);
  CUDA_OK(cudaGetLastError());
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_graph");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_gpu_graph_private_pool_replays);
  tcase_add_test(tc, test_gpu_graph_capture_without_routing);
  tcase_add_loop_test(tc, test_gpu_graph_capture_while_others_allocate, 0,
                      (int)(sizeof others_specs / sizeof others_specs[0]));
  tcase_add_loop_test(tc, test_gpu_graph_through_caching_layers, 0,
                      (int)(sizeof caching_specs / sizeof caching_specs[0]));
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
