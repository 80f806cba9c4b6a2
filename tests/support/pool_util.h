/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the pool's test programs (test_pool.c over the chunk backend,
 * test_pool_expandable.c over the virtual-memory one) share: the invariant
 * check as an assertion, data patterns, the per-stream lines of the pool's
 * description, and random runs, on one thread with every invariant checked
 * after every step, or on many threads that share the pool, its stream keys
 * and their blocks while other threads check the pool concurrently.
 */
#ifndef RMMC_TEST_POOL_UTIL_H
#define RMMC_TEST_POOL_UTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/rmmc.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
/* A stream key: host-memory pools treat stream handles as opaque keys.
 * Small handles are special (0: default, 1: cudaStreamLegacy, the same
 * stream; 2: cudaStreamPerThread, one stream per thread), so keys start at
 * 0x100. */
#define STREAM(n) ((cudaStream_t)(uintptr_t)(0x100 + (n)))

/* Every invariant of the pool holds, or the test fails with the pool's own
 * message. */
#define CHECK_POOL(r)                                                          \
  do {                                                                         \
    rmmc_status_t check_st_ = rmmc_pool_resource_check(r);                     \
    ck_assert_msg(check_st_ == RMMC_SUCCESS, "%s", rmmc_last_error_message()); \
  } while (0)

/* n, or n / 5 (at least 1) when RMMC_TEST_QUICK is set (the valgrind
 * pass, 20-50x slower): for step and iteration counts. */
int pool_steps(int n);

/* Writes a pattern tagged `seed` over n bytes (sampled: every 97th byte and
 * the last); filled() reads it back. */
void pool_fill(void *p, size_t n, unsigned seed);
bool pool_filled(const void *p, size_t n, unsigned seed);

/* The figures of rmmc_pool_resource_figures(), asserted to succeed. */
rmmc_pool_figures_t pool_figures(rmmc_resource_t *pool);

/* The pool's "stream" line for `stream` (named "default" for NULL and
 * cudaStreamLegacy, "per-thread", else "0x..."): its in_use, cached and
 * pending figures, parsed from their rounded text (within 0.5%). False if
 * the pool lists no such stream. */
typedef struct pool_stream_line {
  double in_use, cached, pending;
} pool_stream_line_t;
bool pool_stream_line(rmmc_resource_t *pool, cudaStream_t stream, pool_stream_line_t *out);
/* The text figure `key` ("backend"), copied into buf; false if absent. */
bool pool_text(rmmc_resource_t *pool, const char *key, char *buf, size_t len);

/* How many "stream" lines the pool's description holds. */
int pool_stream_lines(rmmc_resource_t *pool);

/* A random run on one thread. Sizes spread log-uniformly on both sides of
 * small_max up to max_bytes; one request in eight asks an alignment from 1 B
 * to max_align; stream keys 1..nstreams; a third of the frees on another
 * stream than the block's (foreign frees for small blocks). After every
 * step: every invariant (rmmc_pool_resource_check), "in_use" equal to the
 * live bytes rounded to 256, reserved within the maximum, the figures of
 * describe and of rmmc_pool_resource_figures agreeing; now and then, no two
 * live blocks overlapping and every live block's data intact (`real`).
 * Out of memory is allowed only with `oom_ok`, and leaves every live block
 * and every invariant intact. Frees everything at the end. `steps` goes
 * through pool_steps(). */
typedef struct pool_run {
  unsigned seed;
  int steps, max_live, nstreams;
  size_t small_max, max_bytes, max_align;
  bool real;         /* the memory can be written and read back */
  bool oom_ok;       /* out of memory is allowed (a maximum, a capped upstream) */
  int release_every; /* release_cached about once in this many steps (0: never) */
  size_t maximum;    /* reserved must stay within it (0: none) */
} pool_run_t;

typedef struct pool_run_result {
  int allocs, frees, foreign_frees, ooms, releases;
  size_t peak_live;
} pool_run_result_t;

pool_run_result_t pool_random_run(rmmc_resource_t *pool, const pool_run_t *cfg);

/* The same on `nthreads` threads at once: thread i uses its own stream key
 * (STREAM(100 + i), or cudaStreamPerThread when i % 4 == 2) or, for odd i,
 * shares STREAM(1) and STREAM(2) with the other odd threads;
 * frees go to the block's stream or another one; blocks pass between
 * threads through a mailbox (freed by a thread that did not allocate them);
 * release_cached and rmmc_pool_resource_check run concurrently now and then.
 * Every failure (a status, changed data, a broken invariant) is counted and
 * the first one's message kept. After the join the pool holds nothing in
 * use and passes the check. */
typedef struct pool_mt_result {
  int failures, ooms, checks, releases, handoffs, foreign_frees;
  char first[512];
} pool_mt_result_t;

pool_mt_result_t pool_threaded_run(rmmc_resource_t *pool, const pool_run_t *cfg, int nthreads);

#endif
