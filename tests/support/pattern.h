/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tagged pattern of the stress program (tools/rmmc-stress.c), one function
 * for the CPU and the GPU (tests/support/gpu_kernels.cu includes this file
 * under nvcc), so host-mode and kernel verification check the same bytes.
 *
 * A block of n bytes tagged `tag` holds the little-endian 64-bit words
 * pattern_word(tag, 0), pattern_word(tag, 1), ... truncated to n bytes: word
 * i covers bytes 8i .. 8i+7, and the n % 8 bytes past the last full word
 * are the low bytes of pattern_word(tag, n / 8). Tags are random 64-bit
 * numbers, so a block still holding another allocation's data, or the
 * same data shifted, mismatches in every word with near certainty.
 */
#ifndef RMMC_TEST_PATTERN_H
#define RMMC_TEST_PATTERN_H

#include <stdint.h>

#ifdef __CUDACC__
#define PATTERN_FN __host__ __device__ static inline
#else
#define PATTERN_FN static inline
#endif

/* Word i of the pattern tagged `tag` (splitmix64's finalizer over the tag
 * and the index). */
PATTERN_FN uint64_t pattern_word(uint64_t tag, uint64_t i) {
  uint64_t z = tag ^ (i * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Byte j (0..7) of word w as memory holds it: little-endian, as on x86-64
 * and every CUDA device. */
PATTERN_FN uint8_t pattern_byte_of(uint64_t w, unsigned j) {
  return (uint8_t)(w >> (8u * j));
}

#undef PATTERN_FN

#endif
