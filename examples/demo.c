/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The demo (scripts/demo runs it): builds a stack from a spec, makes it the
 * current device's resource, allocates and frees on two streams, shows a
 * block coming back from the pool, a capped allocation failing with its
 * message, and the memory status report. On a machine without a GPU it runs
 * on host memory and says so.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmmc/rmmc.h"

static int fail(const char *what) {
  fflush(stdout);
  fprintf(stderr, "demo: %s: %s\n", what, rmmc_last_error_message());
  return 1;
}

int main(void) {
  bool gpu = rmmc_device_count() > 0;
  const char *base = gpu ? "cuda" : "host";
  if (gpu)
    printf("CUDA devices: %d; the demo runs on device memory of the current device\n",
           rmmc_device_count());
  else
    printf("no CUDA device here: the demo runs on host memory (the same stacks run on a GPU "
           "with 'cuda' as the base)\n");

  char spec[256];
  snprintf(spec, sizeof spec, "statistics > limiting(limit=512MiB) > pool(initial=64MiB) > %s", base);
  printf("stack: %s\n", spec);
  rmmc_resource_t *stack, *previous;
  if (rmmc_stack_create(spec, -1, &stack) != RMMC_SUCCESS) return fail("building the stack");
  if (rmmc_set_current_device_resource(stack, &previous) != RMMC_SUCCESS)
    return fail("setting the current device's resource");
  rmmc_resource_release(previous);

  cudaStream_t s[2] = {(cudaStream_t)(uintptr_t)0x1001, (cudaStream_t)(uintptr_t)0x1002};
  if (gpu)
    for (int i = 0; i < 2; i++)
      if (cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) != cudaSuccess)
        return fail("cudaStreamCreate");

  static const size_t sizes[] = {256, 4096, 1 << 20, 10 << 20, 100 << 20};
  void *p[5];
  for (int i = 0; i < 5; i++) {
    if (rmmc_allocate(sizes[i], s[i % 2], &p[i]) != RMMC_SUCCESS) return fail("allocate");
    if (gpu) cudaMemsetAsync(p[i], 0, sizes[i], s[i % 2]);
    printf("  allocated %9zu bytes on stream %d at %p\n", sizes[i], i % 2, p[i]);
  }
  void *first = p[3];
  rmmc_deallocate(p[3], sizes[3], s[1]);
  rmmc_allocate(sizes[3], s[1], &p[3]);
  printf("  freed and re-allocated 10 MiB on the same stream: %s block\n",
         p[3] == first ? "the same" : "another");

  void *big = NULL;
  rmmc_status_t st = rmmc_allocate((size_t)1 << 30, s[0], &big);
  printf("  1 GiB over the 512 MiB limit: %s\n    %s\n", rmmc_status_name(st),
         rmmc_last_error_message());

  uint64_t peak = 0, allocs = 0;
  rmmc_resource_get_field(stack, "peak", &peak);
  rmmc_resource_get_field(stack, "allocations", &allocs);
  printf("  statistics: %llu allocations, peak %llu bytes\n\n", (unsigned long long)allocs,
         (unsigned long long)peak);
  rmmc_memory_status(-1, stdout);

  for (int i = 0; i < 5; i++) rmmc_deallocate(p[i], sizes[i], s[i % 2]);
  if (gpu)
    for (int i = 0; i < 2; i++) cudaStreamDestroy(s[i]);
  rmmc_set_current_device_resource(NULL, &previous);
  rmmc_resource_release(previous);
  rmmc_resource_release(stack);
  return st == RMMC_ERROR_OUT_OF_MEMORY ? 0 : 1;
}
