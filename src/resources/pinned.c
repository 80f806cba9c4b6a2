/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pinned resource: portable page-locked host memory from cudaHostAlloc.
 */
#include <stdlib.h>

#include "base/spec.h"
#include "rmmc/pinned_resource.h"

static rmmc_status_t pinned_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                     cudaStream_t stream, void **out) {
  rmmc_status_t st = rmmc__check_base_alignment(r, alignment);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  return rmmc__base_allocate_status(r, err, bytes, stream, "cudaHostAlloc");
}

static rmmc_status_t pinned_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                       size_t alignment, cudaStream_t stream) {
  (void)r, (void)bytes, (void)alignment, (void)stream;
  cudaError_t err = cudaFreeHost(ptr);
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidHostPointer)
    return rmmc__unknown_cuda_pointer(r, err, "cudaFreeHost", ptr);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaFreeHost");
}

static bool pinned_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  (void)a, (void)b;
  return true;
}

static void pinned_destroy(rmmc_resource_t *r) { free(r); }

/* Nothing to grant: with unified addressing (every 64-bit platform CUDA
 * 13 runs on), memory from cudaHostAlloc is reachable from every device at
 * its host address, whichever device was current when it was allocated
 * (cudaHostAllocPortable makes it pinned for every context too). So the
 * call checks the peer and succeeds. */
static rmmc_status_t pinned_enable_peer_access(rmmc_resource_t *r, int peer) {
  return rmmc__check_peer_attribute("pinned: enable_peer_access", r->device, peer,
                                    cudaDevAttrUnifiedAddressing,
                                    "does not share the host's address space (no unified "
                                    "addressing), so it cannot reach pinned memory directly");
}

static const rmmc_resource_ops_t pinned_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "pinned",
    .allocate = pinned_allocate,
    .deallocate = pinned_deallocate,
    .is_equal = pinned_is_equal,
    .destroy = pinned_destroy,
    .enable_peer_access = pinned_enable_peer_access,
};

RMMC_API rmmc_status_t rmmc_pinned_resource_create(rmmc_resource_t **out) {
  return rmmc__device_resource_new("pinned_resource_create", -1, &pinned_ops,
                                   RMMC_MEMORY_PINNED, sizeof(rmmc_resource_t), out);
}

static rmmc_status_t pinned_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                  int device, rmmc_resource_t **out) {
  (void)args, (void)upstream, (void)device;
  return rmmc_pinned_resource_create(out);
}

const rmmc__spec_entry_t rmmc__pinned_spec = {
    .name = "pinned",
    .help = "page-locked host memory (cudaHostAlloc)",
    .build = pinned_build,
};
