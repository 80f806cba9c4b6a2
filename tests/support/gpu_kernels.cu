/* SPDX-License-Identifier: Apache-2.0 */
// Test kernels (see gpu_kernels.h).
#include "gpu_kernels.h"
#include "pattern.h"

__global__ void slow_fill_kernel(uint8_t *p, size_t n, uint8_t value, uint64_t ns) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t start = clock64();
    // clock64 counts SM cycles; ~2 GHz, so 2 cycles per ns is conservative.
    while ((uint64_t)(clock64() - start) < ns * 2) {
    }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = value;
}

__device__ inline uint8_t pattern_byte(uint32_t seed, size_t i) {
  return (uint8_t)((seed + i * 131u) & 0xffu);
}

__global__ void fill_pattern_kernel(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = pattern_byte(seed, i);
}

__global__ void check_pattern_kernel(const uint8_t *p, size_t n, uint32_t seed,
                                     unsigned long long *errors) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    bad += p[i] != pattern_byte(seed, i);
  if (bad) atomicAdd(errors, bad);
}

static unsigned grid_for(size_t n) {
  size_t blocks = (n + 255) / 256;
  return (unsigned)(blocks > 1024 ? 1024 : (blocks ? blocks : 1));
}

extern "C" cudaError_t gpu_slow_fill(void *p, size_t n, uint8_t value, uint64_t ns,
                                     cudaStream_t stream) {
  // One block only, so the spin delays every write.
  slow_fill_kernel<<<1, 256, 0, stream>>>((uint8_t *)p, n, value, ns);
  return cudaGetLastError();
}

extern "C" cudaError_t gpu_fill_pattern(void *p, size_t n, uint32_t seed, cudaStream_t stream) {
  fill_pattern_kernel<<<grid_for(n), 256, 0, stream>>>((uint8_t *)p, n, seed);
  return cudaGetLastError();
}

extern "C" cudaError_t gpu_check_pattern(const void *p, size_t n, uint32_t seed,
                                         unsigned long long *errors, cudaStream_t stream) {
  check_pattern_kernel<<<grid_for(n), 256, 0, stream>>>((const uint8_t *)p, n, seed, errors);
  return cudaGetLastError();
}

// ---- the stress program's tagged pattern (pattern.h) ----

static unsigned grid_for_words(size_t words) {
  size_t blocks = (words + 255) / 256;
  return (unsigned)(blocks > 1024 ? 1024 : (blocks ? blocks : 1));
}

__global__ void fill_tagged_kernel(uint64_t *p, size_t words, unsigned tail, uint64_t tag) {
  size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = first; i < words; i += (size_t)gridDim.x * blockDim.x)
    p[i] = pattern_word(tag, i);
  if (tail != 0 && first == 0) {
    uint64_t w = pattern_word(tag, words);
    uint8_t *b = (uint8_t *)(p + words);
    for (unsigned j = 0; j < tail; j++) b[j] = pattern_byte_of(w, j);
  }
}

__global__ void check_tagged_kernel(const uint64_t *p, size_t words, unsigned tail, uint64_t tag,
                                    unsigned long long *errors) {
  size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (size_t i = first; i < words; i += (size_t)gridDim.x * blockDim.x)
    bad += p[i] != pattern_word(tag, i);
  if (tail != 0 && first == 0) {
    uint64_t w = pattern_word(tag, words);
    const uint8_t *b = (const uint8_t *)(p + words);
    bool wrong = false;
    for (unsigned j = 0; j < tail; j++) wrong |= b[j] != pattern_byte_of(w, j);
    bad += wrong;
  }
  if (bad) atomicAdd(errors, bad);
}

__global__ void corrupt_byte_kernel(uint8_t *p) { p[0] ^= 0xffu; }

extern "C" cudaError_t gpu_fill_tagged(void *p, size_t n, uint64_t tag, cudaStream_t stream) {
  size_t words = n / 8;
  fill_tagged_kernel<<<grid_for_words(words), 256, 0, stream>>>((uint64_t *)p, words,
                                                                (unsigned)(n % 8), tag);
  return cudaGetLastError();
}

extern "C" cudaError_t gpu_check_tagged(const void *p, size_t n, uint64_t tag,
                                        unsigned long long *errors, cudaStream_t stream) {
  size_t words = n / 8;
  check_tagged_kernel<<<grid_for_words(words), 256, 0, stream>>>(
      (const uint64_t *)p, words, (unsigned)(n % 8), tag, errors);
  return cudaGetLastError();
}

extern "C" cudaError_t gpu_corrupt_byte(void *p, cudaStream_t stream) {
  corrupt_byte_kernel<<<1, 1, 0, stream>>>((uint8_t *)p);
  return cudaGetLastError();
}
