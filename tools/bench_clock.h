// SPDX-License-Identifier: Apache-2.0
/* The clock and the op sequences the measuring tools share: rmmc-bench's
 * engine (bench_engine.c), rmmc-replay's (replay_engine.c) and rmmc-ab
 * (bench/ab.c), which must draw the same sequence as rmmc-bench for the
 * same seed. Header-only: rmmc-ab links neither engine (it loads librmmc
 * with dlopen). */
#ifndef RMMC_BENCH_CLOCK_H
#define RMMC_BENCH_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: small, fast, and the same on every platform. */
static inline uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

#endif
