/*
 * The cuda resource: cudaMalloc and cudaFree on the resource's device.
 */
#include <stdlib.h>

#include "../spec.h"
#include "rmmc/cuda_resource.h"

static rmmc_status_t cuda_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  int saved;
  rmmc_status_t st = rmmc__check_base_alignment(r, alignment);
  if (st == RMMC_SUCCESS) st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaMalloc(out, bytes);
  rmmc__device_pop(saved);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return rmmc_set_oom_error(r, bytes, stream, "cudaMalloc failed");
  }
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaMalloc");
}

rmmc_status_t rmmc__cudafree_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream) {
  (void)bytes, (void)alignment, (void)stream;
  int saved;
  rmmc_status_t st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaFree(ptr);
  rmmc__device_pop(saved);
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidDevicePointer)
    return rmmc__unknown_cuda_pointer(r, err, "cudaFree", ptr);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaFree");
}

bool rmmc__same_device_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  return a->device == b->device;
}

static void cuda_destroy(rmmc_resource_t *r) { free(r); }

static const rmmc_resource_ops_t cuda_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "cuda",
    .allocate = cuda_allocate,
    .deallocate = rmmc__cudafree_deallocate,
    .is_equal = rmmc__same_device_is_equal,
    .destroy = cuda_destroy,
};

RMMC_API rmmc_status_t rmmc_cuda_resource_create(int device, rmmc_resource_t **out) {
  return rmmc__device_resource_new("cuda_resource_create", device, &cuda_ops,
                                   RMMC_MEMORY_DEVICE, sizeof(rmmc_resource_t), out);
}

static rmmc_status_t cuda_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  (void)args, (void)upstream;
  return rmmc_cuda_resource_create(device, out);
}

const rmmc__spec_entry_t rmmc__cuda_spec = {
    .name = "cuda",
    .help = "cudaMalloc/cudaFree",
    .build = cuda_build,
};
