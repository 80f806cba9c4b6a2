/*
 * Small CUDA kernels for the GPU tests and the stress program, callable
 * from C. Built only when nvcc is found (meson option gpu_kernels); test
 * programs that use them are built only then.
 */
#ifndef RMMC_TEST_GPU_KERNELS_H
#define RMMC_TEST_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Spins for about `ns` nanoseconds on the GPU, then fills n bytes at p
 * with `value`, all on `stream`: a slow writer for stream-order tests. */
cudaError_t gpu_slow_fill(void *p, size_t n, uint8_t value, uint64_t ns, cudaStream_t stream);

/* Fills n bytes at p with a pattern derived from `seed` (byte i is
 * (seed + i * 131) & 0xff, written as 32-bit words where aligned). */
cudaError_t gpu_fill_pattern(void *p, size_t n, uint32_t seed, cudaStream_t stream);

/* Checks the pattern of gpu_fill_pattern and adds the number of wrong
 * bytes to *errors (a device or managed counter the caller zeroed). */
cudaError_t gpu_check_pattern(const void *p, size_t n, uint32_t seed,
                              unsigned long long *errors, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
