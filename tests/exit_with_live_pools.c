/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Process exit with pools installed in the registry and live buffers, a
 * known RMM bug class (destructors running after the CUDA runtime has gone):
 * the program must neither crash nor hang. It installs
 * `statistics > pool > base` (cuda on a GPU, host otherwise) as the current
 * device's resource, keeps buffers and raw allocations on two streams live,
 * and returns from main (or calls exit(), with argument "exit") without
 * freeing anything. Two threads use the pool on their per-thread streams
 * (each a stream heap of its own): one has exited with blocks still live,
 * the other is still allocating and freeing when the process ends. meson
 * runs it with a timeout; exit status 0 is success.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"

/* Allocates on its per-thread stream and returns with the blocks live. */
static void *leaver(void *arg) {
  void **p = arg;
  for (int i = 0; i < 4; i++)
    if (rmmc_allocate((size_t)(i + 1) << 12, cudaStreamPerThread, &p[i]) != RMMC_SUCCESS) return NULL;
  return p;
}

/* Allocates and frees on its per-thread stream until the process ends. */
static void *busy(void *arg) {
  (void)arg;
  for (unsigned i = 0;; i++) {
    void *p;
    size_t n = 256 + (i % 64) * 1024;
    if (rmmc_allocate(n, cudaStreamPerThread, &p) == RMMC_SUCCESS)
      (void)rmmc_deallocate(p, n, cudaStreamPerThread);
  }
  return NULL;
}

int main(int argc, char **argv) {
  bool gpu = rmmc_device_count() > 0;
  rmmc_resource_t *stack, *prev;
  if (rmmc_stack_create(gpu ? "statistics > pool(initial=64MiB) > cuda"
                            : "statistics > pool(initial=64MiB) > host",
                        -1, &stack) != RMMC_SUCCESS ||
      rmmc_set_current_device_resource(stack, &prev) != RMMC_SUCCESS) {
    fprintf(stderr, "setup: %s\n", rmmc_last_error_message());
    return 1;
  }
  rmmc_resource_release(prev);
  rmmc_resource_release(stack); /* the registry alone holds it now */
  cudaStream_t s[2] = {(cudaStream_t)0x10, (cudaStream_t)0x20};
  if (gpu)
    for (int i = 0; i < 2; i++) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  static rmmc_buffer_t bufs[8];
  for (int i = 0; i < 8; i++) {
    if (rmmc_buffer_create(&bufs[i], (size_t)(i + 1) << 16, s[i % 2], NULL) != RMMC_SUCCESS) {
      fprintf(stderr, "buffer: %s\n", rmmc_last_error_message());
      return 1;
    }
  }
  void *p;
  if (rmmc_allocate(1 << 20, s[1], &p) != RMMC_SUCCESS) return 1;
  static void *left[4];
  pthread_t t;
  void *got = NULL;
  if (pthread_create(&t, NULL, leaver, left) != 0 || pthread_join(t, &got) != 0 || got == NULL) {
    fprintf(stderr, "thread: %s\n", rmmc_last_error_message());
    return 1;
  }
  if (pthread_create(&t, NULL, busy, NULL) != 0 || pthread_detach(t) != 0) return 1;
  if (gpu) cudaMemsetAsync(p, 0, 1 << 20, s[1]);
  printf("exiting with 13 live allocations in a registry pool and a thread using it (%s)\n",
         gpu ? "GPU" : "host");
  fflush(stdout);
  if (argc > 1 && strcmp(argv[1], "exit") == 0) exit(0);
  return 0;
}
