// Test kernels (see gpu_kernels.h).
#include "gpu_kernels.h"

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
