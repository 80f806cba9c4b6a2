/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The managed resource: cudaMallocManaged, optionally prefetched to the
 * device on the allocating stream.
 */
#include <stdlib.h>

#include "managed_options.h"
#include "base/spec.h"
#include "rmmc/managed_resource.h"

typedef struct managed_resource {
  rmmc_resource_t base;
  bool prefetch;
} managed_resource_t;

static rmmc_status_t managed_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out) {
  managed_resource_t *m = (managed_resource_t *)r;
  int saved;
  rmmc_status_t st = rmmc__base_allocate_begin(r, alignment, &saved);
  if (st != RMMC_SUCCESS) return st;
  void *p = NULL;
  cudaError_t err = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
  if (err == cudaSuccess && m->prefetch) {
    struct cudaMemLocation loc = {.type = cudaMemLocationTypeDevice, .id = r->device};
    err = cudaMemPrefetchAsync(p, bytes, loc, 0, stream);
    if (err != cudaSuccess) {
      st = rmmc_set_cuda_error(err, "managed resource: cudaMemPrefetchAsync");
      (void)cudaFree(p);
      rmmc__device_pop(saved);
      return st;
    }
  }
  rmmc__device_pop(saved);
  st = rmmc__base_allocate_status(r, err, bytes, stream, "cudaMallocManaged");
  if (st == RMMC_SUCCESS) *out = p;
  return st;
}

static void managed_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  rmmc__emit_text(emit, ctx, "prefetch", ((managed_resource_t *)r)->prefetch ? "on" : "off");
}

static void managed_destroy(rmmc_resource_t *r) { free(r); }

/* Nothing to grant: managed memory is reachable from every device that
 * supports managed memory (its pages migrate to the device that touches
 * them, or are read over the interconnect where the device may not hold
 * them), without peer access between the devices. So the call checks the
 * peer and succeeds. */
static rmmc_status_t managed_enable_peer_access(rmmc_resource_t *r, int peer) {
  return rmmc__check_peer_attribute("managed: enable_peer_access", r->device, peer,
                                    cudaDevAttrManagedMemory, "does not support managed memory");
}

static const rmmc_resource_ops_t managed_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "managed",
    .allocate = managed_allocate,
    .deallocate = rmmc__cudafree_deallocate,
    .is_equal = rmmc__same_device_is_equal,
    .describe = managed_describe,
    .destroy = managed_destroy,
    .enable_peer_access = managed_enable_peer_access,
};

RMMC_API rmmc_status_t rmmc_managed_resource_create(int device, const rmmc_managed_options_t *options,
                                                    rmmc_resource_t **out) {
  rmmc_managed_options_t opts = RMMC_MANAGED_OPTIONS_INIT;
  if (out != NULL) *out = NULL;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, "managed_resource_create", &opts, options, RMMC_MANAGED_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc__device_resource_new("managed_resource_create", device, &managed_ops,
                                 RMMC_MEMORY_MANAGED, sizeof(managed_resource_t), out);
  if (st != RMMC_SUCCESS) return st;
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrManagedMemory, (*out)->device) != cudaSuccess ||
      !supported) {
    (void)cudaGetLastError();
    free(*out);
    *out = NULL;
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "managed_resource_create: device does not support managed memory");
  }
  ((managed_resource_t *)*out)->prefetch = opts.prefetch;
  return RMMC_SUCCESS;
}

#define MANAGED_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_managed_options_t, __VA_ARGS__)
static const rmmc__spec_option_t managed_spec_options[] = {
    RMMC__MANAGED_OPTIONS(MANAGED_SPEC_ROW){.name = NULL},
};
#undef MANAGED_SPEC_ROW

static rmmc_status_t managed_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                   int device, rmmc_resource_t **out) {
  rmmc_managed_options_t opts = RMMC_MANAGED_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, managed_spec_options, upstream, &opts);
  return st == RMMC_SUCCESS ? rmmc_managed_resource_create(device, &opts, out) : st;
}

const rmmc__spec_entry_t rmmc__managed_spec = {
    .name = "managed",
    .help = "managed (unified) memory, cudaMallocManaged",
    .options = managed_spec_options,
    .build = managed_build,
};
