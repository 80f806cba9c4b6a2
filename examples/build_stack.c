/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Building a stack by hand: tracking > limiting > pool > base, where base is
 * cudaMalloc on a GPU and host memory without one. Each create takes its
 * own reference to the layer below, so we drop ours as we go: releasing the
 * top frees the whole stack. Then a leak shows up in the tracking report.
 */
#include <stdio.h>

#include "rmmc/rmmc.h"

#define TRY(call)                                                                        \
  do {                                                                                   \
    rmmc_status_t st_ = (call);                                                          \
    if (st_ != RMMC_SUCCESS) {                                                           \
      fprintf(stderr, "%s: %s\n  %s\n", #call, rmmc_status_name(st_), rmmc_last_error_message()); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(void) {
  rmmc_resource_t *base, *pool, *limited, *tracked;
  if (rmmc_device_count() > 0) {
    TRY(rmmc_cuda_resource_create(-1, &base));
  } else {
    printf("no CUDA device: building the stack over host memory\n");
    TRY(rmmc_host_resource_create(&base));
  }

  rmmc_pool_options_t po = RMMC_POOL_OPTIONS_INIT;
  po.initial_size = 64 << 20;
  po.maximum_size = 1u << 30;
  TRY(rmmc_pool_resource_create(base, &po, &pool));
  rmmc_resource_release(base); /* the pool holds it now */
  TRY(rmmc_limiting_adaptor_create(pool, 256 << 20, &limited));
  rmmc_resource_release(pool);
  TRY(rmmc_tracking_adaptor_create(limited, NULL, &tracked));
  rmmc_resource_release(limited);

  void *a, *b;
  TRY(rmmc_resource_allocate(tracked, 1 << 20, 256, NULL, &a));
  TRY(rmmc_resource_allocate(tracked, 3000, 256, NULL, &b));
  TRY(rmmc_resource_deallocate(tracked, a, 1 << 20, 256, NULL));
  /* b is "forgotten": the tracking report lists it. */
  printf("outstanding: %zu allocation(s), %zu bytes\n",
         rmmc_tracking_adaptor_get_outstanding_count(tracked),
         rmmc_tracking_adaptor_get_outstanding_bytes(tracked));
  rmmc_tracking_adaptor_report(tracked, stdout);
  rmmc_resource_print_status(tracked, stdout);

  int leaks = (int)rmmc_tracking_adaptor_get_outstanding_count(tracked);
  TRY(rmmc_resource_deallocate(tracked, b, 3000, 256, NULL));
  rmmc_resource_release(tracked); /* frees tracking, limiting, pool and base */
  return leaks == 1 ? 0 : 1;
}
