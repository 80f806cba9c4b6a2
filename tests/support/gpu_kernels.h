/* SPDX-License-Identifier: Apache-2.0 */
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

/* The stress program's tagged pattern (tests/support/pattern.h): fills the
 * n bytes at p (8-byte aligned) with the pattern tagged `tag` on `stream`,
 * full words as 64-bit stores and the n % 8 tail bytes one by one; never
 * touches a byte past p + n. Returns the launch status. */
cudaError_t gpu_fill_tagged(void *p, size_t n, uint64_t tag, cudaStream_t stream);

/* Compares the n bytes at p with the pattern tagged `tag` on `stream` and
 * adds the number of wrong units (a full word, or the whole tail counted
 * once) to *errors, a device counter; no host synchronization. Reads no
 * byte past p + n. Returns the launch status. */
cudaError_t gpu_check_tagged(const void *p, size_t n, uint64_t tag,
                             unsigned long long *errors, cudaStream_t stream);

/* Inverts the first byte at p on `stream` (n >= 1): a deliberate
 * corruption, so a checker can be shown to catch one. */
cudaError_t gpu_corrupt_byte(void *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
