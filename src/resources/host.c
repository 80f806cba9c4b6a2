/*
 * The host resource: posix_memalign and free. No CUDA, no state: every
 * host resource is equal to every other, and the stream is ignored.
 */
#include <errno.h>
#include <stdlib.h>

#include "../spec.h"
#include "rmmc/host_resource.h"

static rmmc_status_t host_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  void *p = NULL;
  if (posix_memalign(&p, alignment, bytes) != 0)
    return rmmc_set_oom_error(r, bytes, stream, "posix_memalign failed");
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t host_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)r, (void)bytes, (void)alignment, (void)stream;
  free(ptr);
  return RMMC_SUCCESS;
}

static bool host_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  (void)a, (void)b;
  return true;
}

static void host_destroy(rmmc_resource_t *r) { free(r); }

static const rmmc_resource_ops_t host_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "host",
    .allocate = host_allocate,
    .deallocate = host_deallocate,
    .is_equal = host_is_equal,
    .destroy = host_destroy,
};

RMMC_API rmmc_status_t rmmc_host_resource_create(rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "host_resource_create: out is NULL");
  *out = NULL;
  rmmc_resource_t *r = malloc(sizeof *r);
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "host_resource_create: no memory");
  rmmc_resource_init(r, &host_ops, RMMC_MEMORY_HOST, -1);
  *out = r;
  return RMMC_SUCCESS;
}

static rmmc_status_t host_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  (void)args, (void)upstream, (void)device;
  return rmmc_host_resource_create(out);
}

const rmmc__spec_entry_t rmmc__host_spec = {
    .name = "host",
    .help = "aligned host memory from the C library (no GPU needed)",
    .build = host_build,
};
