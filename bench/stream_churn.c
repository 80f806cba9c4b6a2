/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a request costs when every request comes on a new stream
 * (programs that make a stream per request or per task, CuPy's users,
 * servers): one allocate and one free of --bytes on a stream the stack has
 * never seen, timed over a window of --window requests that starts once
 * 10, 1,000, 10,000 and --streams streams have been used; the median of
 * --runs runs, each on a fresh stack. Also the stack's "heaps" and
 * "streams" figures at the end (the pool's heaps stay bounded).
 *
 *   rmmc-stream-churn [--spec SPEC] [--streams N] [--window W] [--runs R]
 *                     [--bytes B]
 *
 * Default: `pool > sim`, 40,000 streams, windows of 200, 5 runs, 1 KiB.
 * Over host-memory stacks (sim, host) the streams are handles no CUDA call
 * sees; over device memory each request creates a CUDA stream before the
 * timed calls and destroys it after them. docs/design.md ("Stream heaps") has the design.
 * Built by tools/meson.build; not installed.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "rmmc/rmmc.h"

#define MAX_RUNS 64
#define POINTS 4

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

typedef struct opts {
  const char *spec;
  long streams, window, runs;
  size_t bytes;
} opts_t;

static long next_handle; /* host stacks: every request a handle never seen */

/* One request on a new stream; returns its microseconds. */
static double request(rmmc_resource_t *r, const opts_t *o, bool device) {
  cudaStream_t s;
  if (device) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  else s = (cudaStream_t)(uintptr_t)(0x100000 + (uintptr_t)(++next_handle) * 64);
  double t0 = now_us();
  void *p;
  RM(rmmc_resource_allocate(r, o->bytes, 256, s, &p));
  RM(rmmc_resource_deallocate(r, p, o->bytes, 256, s));
  double t = now_us() - t0;
  if (device) CK(cudaStreamDestroy(s));
  return t;
}

static uint64_t figure(rmmc_resource_t *r, const char *key) {
  for (; r != NULL; r = rmmc_resource_upstream(r)) {
    uint64_t v;
    if (rmmc_resource_get_field(r, key, &v)) return v;
  }
  return 0;
}

static void usage(void) {
  fprintf(stderr, "usage: rmmc-stream-churn [--spec SPEC] [--streams N] [--window W] "
                  "[--runs R] [--bytes B]\n");
  exit(2);
}

int main(int argc, char **argv) {
  bench_program = "rmmc-stream-churn";
  opts_t o = {"pool > sim", 40000, 200, 5, 1024};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (strcmp(argv[i - 1], "--spec") == 0) o.spec = v;
    else if (strcmp(argv[i - 1], "--streams") == 0) o.streams = atol(v);
    else if (strcmp(argv[i - 1], "--window") == 0) o.window = atol(v);
    else if (strcmp(argv[i - 1], "--runs") == 0) o.runs = atol(v);
    else if (strcmp(argv[i - 1], "--bytes") == 0) RM(rmmc_parse_size(v, &o.bytes));
    else usage();
  }
  if (o.streams < 10 || o.window < 1 || o.runs < 1 || o.runs > MAX_RUNS) usage();
  const long at[POINTS] = {10, 1000, 10000, o.streams};
  double cost[POINTS][MAX_RUNS];
  uint64_t heaps = 0, streams = 0;
  bool device = false;
  for (long run = 0; run < o.runs; run++) {
    rmmc_resource_t *r;
    RM(rmmc_stack_create(o.spec, -1, &r));
    device = rmmc_resource_memory_kind(r) != RMMC_MEMORY_HOST;
    long used = 0;
    for (int k = 0; k < POINTS; k++) {
      for (; used < at[k]; used++) (void)request(r, &o, device);
      double sum = 0;
      for (long w = 0; w < o.window; w++) sum += request(r, &o, device);
      used += o.window;
      cost[k][run] = sum / (double)o.window;
    }
    heaps = figure(r, "heaps");
    streams = figure(r, "streams");
    rmmc_resource_release(r);
  }
  printf("rmmc-stream-churn: %s, %zu bytes, a new stream per request (allocate + free), "
         "window %ld, median of %ld runs\n",
         o.spec, o.bytes, o.window, o.runs);
  for (int k = 0; k < POINTS; k++)
    printf("  after %6ld streams: %9.2f us per request\n", at[k], median(cost[k], (int)o.runs));
  printf("  ratio after %ld to after 10: %.2f\n", o.streams,
         median(cost[POINTS - 1], (int)o.runs) / median(cost[0], (int)o.runs));
  printf("  at the end: heaps %llu, streams %llu%s\n", (unsigned long long)heaps,
         (unsigned long long)streams, device ? " (real CUDA streams, made and destroyed outside the timing)" : "");
  return 0;
}
