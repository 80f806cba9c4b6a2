/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Setting the process default. Two ways:
 *  - without code: RMMC_ALLOC_CONF='pool(initial=1GiB) > cuda' ./app builds
 *    every device's default from that spec at first use;
 *  - in code, as here: build a stack per device and put it in the registry.
 * Everything that allocates through the registry (rmmc_allocate, buffers,
 * the PyTorch and CuPy plug-ins) then uses it. Without a GPU the demo sets a
 * host-memory stack for device 0 and says so.
 */
#include <stdio.h>

#include "rmmc/rmmc.h"

int main(void) {
  int n = rmmc_device_count();
  const char *spec = n > 0 ? "statistics > pool(initial=32MiB) > cuda"
                           : "statistics > pool(initial=32MiB) > host";
  if (n == 0) printf("no CUDA device: device 0 gets a host-memory stack\n");
  for (int dev = 0; dev < (n > 0 ? n : 1); dev++) {
    rmmc_resource_t *stack, *previous;
    if (rmmc_stack_create(spec, n > 0 ? dev : -1, &stack) != RMMC_SUCCESS ||
        rmmc_set_device_resource(dev, stack, &previous) != RMMC_SUCCESS) {
      fprintf(stderr, "device %d: %s\n", dev, rmmc_last_error_message());
      return 1;
    }
    rmmc_resource_release(stack);    /* the registry holds it */
    rmmc_resource_release(previous); /* the default it replaced, if any */
    printf("device %d: %s\n", dev, spec);
  }

  /* Any code now allocates through the registry. */
  void *p;
  if (rmmc_allocate(4 << 20, NULL, &p) != RMMC_SUCCESS) return 1;
  rmmc_resource_t *current;
  rmmc_get_current_device_resource(&current); /* borrowed */
  uint64_t in_use = 0;
  rmmc_resource_get_field(current, "in_use", &in_use);
  printf("allocated through the default: %llu bytes in use\n", (unsigned long long)in_use);
  rmmc_deallocate(p, 4 << 20, NULL);

  const char *conf, *msg;
  rmmc_default_config_status(&conf, &msg);
  printf("RMMC_ALLOC_CONF default would be: %s\n", conf ? conf : "(not read yet)");
  rmmc_registry_clear(); /* orderly shutdown: drop the registry's references */
  return in_use == (4u << 20) ? 0 : 1;
}
