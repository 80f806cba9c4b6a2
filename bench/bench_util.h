/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the measuring programs of bench/ share (rmmc-ipc-costs,
 * rmmc-peer-bw): a failure ends the program with a line naming it and
 * the call (CK for the runtime, RM for rmmc), and the median of repeated
 * runs. Header-only; the program sets bench_program before the first
 * failure.
 */
#ifndef RMMC_BENCH_UTIL_H
#define RMMC_BENCH_UTIL_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "rmmc/rmmc.h"

static const char *bench_program = "rmmc-bench";

static inline void die(const char *what, const char *why) {
  fprintf(stderr, "%s: %s: %s\n", bench_program, what, why);
  exit(1);
}

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) die(#x, cudaGetErrorString(e_));                                     \
  } while (0)
#define RM(x)                                                                                   \
  do {                                                                                          \
    if ((x) != RMMC_SUCCESS) die(#x, rmmc_last_error_message());                                \
  } while (0)

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n > 0); sorts v. */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
