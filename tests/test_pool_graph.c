/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA graph private pools in the pool, over host memory: routing by
 * stream (what a capture does on a GPU, without one), reuse inside the
 * pool, no sharing with other streams while it lives (before and after the
 * routing ends), pools shared by several "captures", release, the figures,
 * bad input, and routing on one thread while others allocate on their own
 * streams. The GPU side (routing by capture, graphs replayed) is
 * tests/test_gpu_graph.c. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graph_contract.h"
#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define S(n) ((cudaStream_t)(uintptr_t)(n))

static const char *const specs[] = {"pool > host", "pool > sim", "pool(expandable=false) > host"};

static rmmc_resource_t *make(const char *spec) {
  rmmc_resource_t *r;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  return r;
}

#define CHECK_POOL(r) ck_assert_msg(rmmc_pool_resource_check(r) == RMMC_SUCCESS, "%s", rmmc_last_error_message())

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

START_TEST(test_pool_graph_routes_by_stream_and_keeps_its_memory) {
  rmmc_resource_t *r = make(specs[_i]);
  enum { N = 12 };
  void *g[N];
  size_t n[N];
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 7, 1, true, S(1)), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "graph_pools"), 1);
  for (int i = 0; i < N; i++) { /* small and large: every size goes to the graph pool */
    n[i] = i % 2 ? 3 * MiB + (size_t)i * 4096 : 64 * KiB + (size_t)i * 256;
    ck_assert_int_eq(rmmc_resource_allocate(r, n[i], 256, S(1), &g[i]), RMMC_SUCCESS);
    CHECK_POOL(r);
  }
  uint64_t graph_bytes = field(r, "graph_bytes");
  ck_assert_uint_ge(graph_bytes, 6 * 3 * MiB);
  /* Freed inside the "capture": reused by the next allocation of the same
   * size on the routed stream, and counted in the graph pool still. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, g[3], n[3], 256, S(1)), RMMC_SUCCESS);
  void *again;
  ck_assert_int_eq(rmmc_resource_allocate(r, n[3], 256, S(1), &again), RMMC_SUCCESS);
  ck_assert_ptr_eq(again, g[3]);
  ck_assert_uint_eq(field(r, "graph_bytes"), graph_bytes);
  /* Another stream meanwhile never gets graph memory. */
  void *o[N];
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, n[i], 256, S(2), &o[i]), RMMC_SUCCESS);
    for (int k = 0; k < N; k++) ck_assert(!overlaps(o[i], n[i], g[k], n[k]));
  }
  ck_assert_int_eq(rmmc_pool_graph_end(r, 7, 1), RMMC_SUCCESS);
  /* The graph lives on: its blocks, freed on any stream, stay in its pool
   * and serve no one else, on the routed stream or another. */
  for (int i = 0; i < N; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], n[i], 256, S(i % 3 + 1)), RMMC_SUCCESS);
  CHECK_POOL(r);
  ck_assert_uint_eq(field(r, "graph_bytes"), graph_bytes);
  void *x[N];
  for (int i = 0; i < N; i++) {
    cudaStream_t s = S(i % 2 ? 1 : 3);
    ck_assert_int_eq(rmmc_resource_allocate(r, n[i], 256, s, &x[i]), RMMC_SUCCESS);
    for (int k = 0; k < N; k++) ck_assert(!overlaps(x[i], n[i], g[k], n[k]));
  }
  /* A second capture into the same pool reuses what the first freed. */
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 7, 1, true, S(4)), RMMC_SUCCESS);
  void *y;
  ck_assert_int_eq(rmmc_resource_allocate(r, n[0], 256, S(4), &y), RMMC_SUCCESS);
  bool from_pool = false;
  for (int k = 0; k < N; k += 2) from_pool |= y == g[k];
  ck_assert_msg(from_pool, "a shared graph pool should hand out its own free block");
  ck_assert_uint_eq(field(r, "graph_bytes"), graph_bytes);
  ck_assert_int_eq(rmmc_pool_graph_end(r, 7, 1), RMMC_SUCCESS);
  /* Release: the free blocks go back; the blocks still out return as
   * ordinary frees, and then the graph pool is gone. */
  ck_assert_int_eq(rmmc_pool_graph_release(r, 7, 1), RMMC_SUCCESS);
  CHECK_POOL(r);
  ck_assert_uint_lt(field(r, "graph_bytes"), graph_bytes);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, n[0], 256, S(4)), RMMC_SUCCESS);
  for (int i = 1; i < N; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(r, g[i], n[i], 256, S(1)), RMMC_SUCCESS);
  CHECK_POOL(r);
  ck_assert_uint_eq(field(r, "graph_pools"), 0);
  ck_assert_uint_eq(field(r, "graph_bytes"), 0);
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(r, o[i], n[i], 256, S(2)), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(r, x[i], n[i], 256, S(i % 2 ? 1 : 3)), RMMC_SUCCESS);
  }
  CHECK_POOL(r);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  /* Released memory is the shared heap's again: the pool gives it all back. */
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_pool_graph_bad_input) {
  rmmc_resource_t *r = make("statistics > pool > host");
  /* The stack's pool layer is found below an adaptor. */
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 1, 2, true, S(1)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 1, 2, true, S(1)), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "already being routed"));
  ck_assert_int_eq(rmmc_pool_graph_end(r, 1, 2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_end(r, 1, 2), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "not being routed"));
  ck_assert_int_eq(rmmc_pool_graph_end(r, 9, 9), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 9, 9), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no graph pool (9, 9)"));
  /* Routing by capture needs device memory. */
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 3, 3, false, NULL), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 1, 2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 1, 2), RMMC_ERROR_INVALID_ARGUMENT);
  CHECK_POOL(rmmc_resource_upstream(r));
  rmmc_resource_release(r);
  /* A stack without a pool layer. */
  ck_assert_int_eq(rmmc_stack_create("statistics > host", -1, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 1, 2, true, S(1)), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "has no pool layer"));
  ck_assert_int_eq(rmmc_pool_graph_begin(NULL, 1, 2, true, S(1)), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_release(r);
}
END_TEST

/* One thread routes its stream to a graph pool and allocates; others
 * allocate and free on their own streams at the same time: no block of one
 * ever overlaps a live block of another, and the graph pool's blocks stay
 * its own. */
typedef struct worker {
  rmmc_resource_t *r;
  int index;
  void *live[64];
  size_t n[64];
  int bad;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  uint64_t seed = 0x9E3779B97F4A7C15u * (uint64_t)(w->index + 1);
  for (int i = 0; i < 64; i++) w->live[i] = NULL;
  for (int op = 0; op < 4000 && !w->bad; op++) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    int k = (int)(seed % 64);
    if (w->live[k] != NULL) {
      if (rmmc_resource_deallocate(w->r, w->live[k], w->n[k], 256, S(10 + w->index)) != RMMC_SUCCESS)
        w->bad = 1;
      w->live[k] = NULL;
    } else {
      w->n[k] = 256 + (size_t)(seed >> 40) % (2 * MiB);
      if (rmmc_resource_allocate(w->r, w->n[k], 256, S(10 + w->index), &w->live[k]) != RMMC_SUCCESS)
        w->bad = 2;
      else
        memset(w->live[k], 0x40 + w->index, w->n[k] < 512 ? w->n[k] : 512);
    }
  }
  return NULL;
}

START_TEST(test_pool_graph_routing_while_others_allocate) {
  rmmc_resource_t *r = make("pool > host");
  enum { T = 4 };
  worker_t w[T];
  pthread_t th[T];
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 5, 5, true, S(10)), RMMC_SUCCESS); /* worker 0's stream */
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){.r = r, .index = i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) ck_assert_msg(w[i].bad == 0, "worker %d failed: %d", i, w[i].bad);
  CHECK_POOL(r);
  ck_assert_uint_gt(field(r, "graph_bytes"), 0);
  /* Live blocks of every worker are disjoint, and intact. */
  for (int a = 0; a < T; a++)
    for (int i = 0; i < 64; i++) {
      if (w[a].live[i] == NULL) continue;
      unsigned char *p = w[a].live[i];
      for (size_t j = 0; j < (w[a].n[i] < 512 ? w[a].n[i] : 512); j++)
        ck_assert_uint_eq(p[j], 0x40 + a);
      for (int b = 0; b < T; b++)
        for (int k = 0; k < 64; k++)
          if ((a != b || i != k) && w[b].live[k] != NULL)
            ck_assert(!overlaps(w[a].live[i], w[a].n[i], w[b].live[k], w[b].n[k]));
    }
  ck_assert_int_eq(rmmc_pool_graph_end(r, 5, 5), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 5, 5), RMMC_SUCCESS);
  for (int a = 0; a < T; a++)
    for (int i = 0; i < 64; i++)
      if (w[a].live[i] != NULL)
        ck_assert_int_eq(rmmc_resource_deallocate(r, w[a].live[i], w[a].n[i], 256, S(10 + a)), RMMC_SUCCESS);
  CHECK_POOL(r);
  ck_assert_uint_eq(field(r, "graph_pools"), 0);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  rmmc_resource_release(r);
}
END_TEST

/* Issue 25, F7: through a layer that caches above the pool (binning,
 * fixed_size, with adaptors between), a block a graph freed came back to
 * the routed stream after the routing ended, while the graph lived. Every
 * stack with a pool layer below is held to the contract
 * (tests/support/graph_contract.c; the conformance battery runs it over
 * every case too). */
static const struct {
  const char *spec;
  size_t max_request;
} caching[] = {
    {"pool > host", 0},
    {"arena > host", 0},
    {"binning > pool > host", 0},
    {"fixed_size(block=4KiB) > pool > host", 4096},
    {"binning > statistics > pool > host", 0},
    {"fixed_size(block=64KiB) > limiting(limit=1GiB) > tracking > pool > host", 65536},
    {"statistics > binning(max=64KiB) > pool(expandable=false) > host", 0},
    {"binning > arena > host", 0},
    {"aligned(alignment=4KiB) > fixed_size(block=4KiB, blocks_per_chunk=4) > pool > host", 4096},
};

START_TEST(test_pool_graph_through_caching_layers) {
  rmmc_resource_t *r = make(caching[_i].spec);
  size_t max = caching[_i].max_request ? caching[_i].max_request : 4 * MiB;
  graph_contract_run(r, max, caching[_i].spec);
  graph_contract_threads(r, max, 3, caching[_i].spec);
  rmmc_resource_release(r);
}
END_TEST

/* The finding as reported: 4 KiB allocated and freed inside, the same 4
 * KiB asked for on the same stream after the end. */
START_TEST(test_pool_graph_finding_f7) {
  static const char *const stacks[] = {"binning > pool > host",
                                       "fixed_size(block=4096) > pool > host"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *r = make(stacks[i]);
    void *g, *q;
    ck_assert_int_eq(rmmc_pool_graph_begin(r, 1, 1, true, S(5)), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S(5), &g), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(r, g, 4096, 256, S(5)), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_pool_graph_end(r, 1, 1), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S(5), &q), RMMC_SUCCESS);
    ck_assert_msg(!overlaps(q, 4096, g, 4096), "%s: the graph's block %p came back", stacks[i], g);
    ck_assert_int_eq(rmmc_resource_deallocate(r, q, 4096, 256, S(5)), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_pool_graph_release(r, 1, 1), RMMC_SUCCESS);
    rmmc_resource_release(r);
  }
}
END_TEST

/* A graph pool's growth first gives back free pages past the budget; when
 * the upstream refuses to unmap one the growth still succeeds (it keeps
 * the page), and a call that succeeds leaves the thread's message as it
 * was (status.h). The graph path grew without the shared heap's slow path,
 * which restores the message, so it kept "faulty: injected ERROR_CUDA"
 * (found by tests/fuzz/fuzz_api). */
START_TEST(test_pool_graph_growth_past_a_refused_unmap_leaves_no_message) {
  rmmc_resource_t *spy, *fy, *r, *vm = new_vm_base(4 * KiB, &spy, &fy);
  ck_assert_int_eq(rmmc_stack_create_over("pool(page=64KiB, small_max=0, release_slack=0)", vm, &r),
                   RMMC_SUCCESS);
  void *a, *b, *c, *x;
  /* Two streams in use: A's free on stream 2 is covered by an event at
   * once, so its pages may go back (host memory: finished as recorded). */
  ck_assert_int_eq(rmmc_resource_allocate(r, 1 * MiB, 256, S(3), &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4 * MiB, 256, S(2), &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4 * MiB, 256, S(2), &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 4 * MiB, 256, S(2)), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 9 * MiB);
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 3, 4, true, S(1)), RMMC_SUCCESS);
  faulty_fail_deallocate(faulty_of(fy), RMMC_ERROR_CUDA, 1000); /* vmspy's unmaps fail */
  rmmc_clear_last_error();
  ck_assert_int_eq(rmmc_resource_allocate(r, 8 * MiB, 256, S(1), &c), RMMC_SUCCESS);
  ck_assert_uint_gt(faulty_counts(faulty_of(fy)).deallocate_injected, 0); /* the trim was refused */
  ck_assert_msg(rmmc_last_error_message()[0] == '\0', "a successful allocate left '%s'",
                rmmc_last_error_message());
  faulty_disarm(faulty_of(fy));
  CHECK_POOL(r);
  ck_assert_uint_eq(field(r, "reserved"), 17 * MiB); /* A's pages kept */
  ck_assert_int_eq(rmmc_resource_deallocate(r, c, 8 * MiB, 256, S(1)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_end(r, 3, 4), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 3, 4), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 4 * MiB, 256, S(2)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 1 * MiB, 256, S(3)), RMMC_SUCCESS);
  finish_vm(r, vm, fy, spy);
}
END_TEST

int main(void) {
  Suite *s = suite_create("pool_graph");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_pool_graph_routes_by_stream_and_keeps_its_memory, 0,
                      (int)(sizeof specs / sizeof specs[0]));
  tcase_add_test(tc, test_pool_graph_bad_input);
  tcase_add_test(tc, test_pool_graph_routing_while_others_allocate);
  tcase_add_test(tc, test_pool_graph_finding_f7);
  tcase_add_test(tc, test_pool_graph_growth_past_a_refused_unmap_leaves_no_message);
  tcase_add_loop_test(tc, test_pool_graph_through_caching_layers, 0,
                      (int)(sizeof caching / sizeof caching[0]));
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
