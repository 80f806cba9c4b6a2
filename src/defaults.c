/*
 * The process default: what the registry builds for a device on first use.
 */
#include "internal.h"
#include "rmmc/cuda_resource.h"

rmmc_status_t rmmc__create_default_resource(int device, rmmc_resource_t **out) {
  return rmmc_cuda_resource_create(device, out);
}
