/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The measurement engine behind rmmc-bench (internal to tools/, never
 * installed; tests/test_bench.c drives it over a spy resource).
 *
 * One call, bench_measure(), times one resource on one case (pattern, sizes,
 * live count) with T threads, each thread on its own stream (or all on one,
 * `one_stream`) and its own seeded op sequence, and returns the per-call
 * times of `repeat` timed runs.
 *
 * What one run does, per thread (all threads start together at a barrier):
 *   untimed  random pattern: allocate the `live` blocks of the sequence's
 *            fill; GPU stacks then synchronize the thread's stream
 *   timed    `ops` calls: pair = ops/2 times (allocate S; free it);
 *            random = ops/2 times (free the block in a random live slot;
 *            allocate a random size in [min, max] into that slot);
 *            GPU stacks (memory kind other than host) then synchronize the
 *            thread's stream, so stream-ordered work the calls enqueued
 *            (cudaFreeAsync, a pool's events) is inside the clock
 *   untimed  a barrier, then every live block is freed (and the stream
 *            synchronized); the main thread synchronizes the device and
 *            checks the stack's figures: "in_use" and "outstanding" of the
 *            outermost layer, where reported, must be 0.
 * wall = last thread's stop - first thread's start; ns per call =
 * wall / ops (= wall * T / all calls); aggregate ops/s = T * ops / wall.
 * Memory is never touched: what is measured is the allocator's bookkeeping.
 *
 * Before timing, one untimed warm-up run of the same sequence. With a
 * budget, a warm-up thread stops once it has run longer than the budget;
 * if any did, a second warm-up runs the same way on the now warm stack, and
 * the timed runs use the calls the slowest thread managed within the budget
 * (a prefix of the same sequence) instead of `ops`.
 */
#ifndef RMMC_BENCH_ENGINE_H
#define RMMC_BENCH_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/resource.h"

#define BENCH_MAX_THREADS 256
#define BENCH_MAX_REPEAT 100
#define BENCH_MAX_OPS ((size_t)10000000)
#define BENCH_ERROR_LEN 1024

typedef enum bench_pattern {
  BENCH_PAIR = 1,   /* allocate then free the same size, repeatedly */
  BENCH_RANDOM = 2, /* keep `live` blocks; free a random one, allocate a random size */
} bench_pattern_t;

typedef struct bench_case {
  bench_pattern_t pattern;
  size_t min_bytes; /* pair: the size (max_bytes equal); random: uniform in [min, max] */
  size_t max_bytes;
  size_t live; /* random: live blocks per thread (>= 1); pair: 0 */
} bench_case_t;

typedef struct bench_params {
  int threads;     /* 1 .. BENCH_MAX_THREADS */
  size_t ops;      /* calls per thread per timed run: even, 2 .. BENCH_MAX_OPS */
  int repeat;      /* timed runs, 1 .. BENCH_MAX_REPEAT */
  uint64_t seed;   /* thread i's sequence is seeded with seed + i */
  double budget_s; /* time budget of a run (see above); 0: none */
  bool one_stream; /* every thread on one stream (thread 0's) instead of its own */
} bench_params_t;

typedef struct bench_result {
  bool ok;       /* every run completed and every check passed */
  size_t ops;    /* calls per thread per timed run actually used */
  int runs;      /* timed runs completed */
  double ns[BENCH_MAX_REPEAT]; /* ns per call of each timed run */
  double median, min, max;     /* over the runs (ns per call) */
  double ops_per_s;            /* aggregate, from the median */
  char error[BENCH_ERROR_LEN]; /* when !ok: what failed, first failure only */
} bench_result_t;

/* Measures `r` on case `c` with params `p` and fills *out. Takes over one
 * reference to `r` and releases it before destroying the streams, so a
 * stack's per-stream state never outlives a stream (retain first to keep
 * the resource). r == NULL is the built-in baseline that calls malloc/free
 * directly. A failed
 * allocate or free, a CUDA failure, a stack whose figures are not back to 0
 * after a run, or bad arguments end the measurement with out->ok false and
 * the message in out->error; blocks still live are freed first. Streams: a
 * stack whose memory kind is not host gets one cudaStreamNonBlocking stream
 * per thread on the stack's device; host stacks get distinct opaque keys.
 * Not reentrant with respect to `r`'s figures: nothing else may use `r`
 * while it runs. */
void bench_measure(rmmc_resource_t *r, const bench_case_t *c, const bench_params_t *p,
                   bench_result_t *out);

/* True when a stack of this memory kind is run with CUDA streams. */
bool bench_uses_gpu(const rmmc_resource_t *r);

#endif /* RMMC_BENCH_ENGINE_H */
