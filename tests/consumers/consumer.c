/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program of someone else's that uses an installed rmmc (tests/consumers,
 * built by scripts/check-consumers with pkg-config, CMake and Meson). It
 * checks that the headers and the library it runs against are one version,
 * calls the CUDA runtime itself (the headers include cuda_runtime_api.h, so
 * the build must know the toolkit's include directory) and allocates
 * through a host stack (no GPU needed), with figures read back.
 */
#include <stdio.h>
#include <string.h>

#include <rmmc/rmmc.h>

int main(void) {
  if (rmmc_version() != RMMC_VERSION || strcmp(rmmc_version_string(), RMMC_VERSION_STRING) != 0) {
    fprintf(stderr, "headers %s, library %s\n", RMMC_VERSION_STRING, rmmc_version_string());
    return 1;
  }
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || runtime <= 0) {
    fprintf(stderr, "cudaRuntimeGetVersion failed\n");
    return 1;
  }
  rmmc_resource_t *stack;
  if (rmmc_stack_create("statistics > pool(initial=1MiB) > host", -1, &stack) != RMMC_SUCCESS) {
    fprintf(stderr, "%s\n", rmmc_last_error_message());
    return 1;
  }
  void *p = NULL;
  cudaStream_t stream = 0; /* host memory: any stream */
  uint64_t in_use = 0;
  int ok = rmmc_resource_allocate(stack, 4096, 256, stream, &p) == RMMC_SUCCESS &&
           rmmc_resource_get_field(stack, "in_use", &in_use) && in_use == 4096;
  memset(p, 1, 4096);
  ok = ok && rmmc_resource_deallocate(stack, p, 4096, 256, stream) == RMMC_SUCCESS;
  rmmc_resource_release(stack);
  printf("consumer: rmmc %s, CUDA runtime %d, %s\n", rmmc_version_string(), runtime,
         ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
