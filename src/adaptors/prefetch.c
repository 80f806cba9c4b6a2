/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefetch adaptor: cudaMemPrefetchAsync (CUDA 13's form, with a
 * struct cudaMemLocation) of every managed allocation to the upstream's
 * device, on the allocating stream. Over device memory it passes through.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/spec.h"
#include "rmmc/prefetch_adaptor.h"

typedef struct prefetch_adaptor {
  rmmc__adaptor_t a;
  bool active;                    /* false: device memory, pass through */
  uint64_t prefetches, prefetched; /* atomic */
} prefetch_adaptor_t;

static rmmc_status_t prefetch_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       cudaStream_t stream, void **out) {
  prefetch_adaptor_t *p = (prefetch_adaptor_t *)r;
  rmmc_status_t st = rmmc_resource_allocate(p->a.upstream, bytes, alignment, stream, out);
  if (st != RMMC_SUCCESS || !p->active) return st;
  int saved;
  st = rmmc__device_push(r->device, &saved);
  if (st == RMMC_SUCCESS) {
    struct cudaMemLocation loc = {.type = cudaMemLocationTypeDevice, .id = r->device};
    cudaError_t err = cudaMemPrefetchAsync(*out, bytes, loc, 0, stream);
    rmmc__device_pop(saved);
    if (RMMC_LIKELY(err == cudaSuccess)) {
      rmmc__atomic_add_u64(&p->prefetches, 1);
      rmmc__atomic_add_u64(&p->prefetched, bytes);
      return RMMC_SUCCESS;
    }
    st = rmmc_set_cuda_error(err, "prefetch adaptor: cudaMemPrefetchAsync");
  }
  rmmc__error_state_t failure;
  rmmc__error_save(&failure);
  (void)rmmc_resource_deallocate(p->a.upstream, *out, bytes, alignment, stream);
  rmmc__error_restore(&failure);
  *out = NULL;
  return st;
}

static void prefetch_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  prefetch_adaptor_t *p = (prefetch_adaptor_t *)r;
  char mode[48];
  if (p->active)
    snprintf(mode, sizeof mode, "prefetch to device %d", r->device);
  else
    snprintf(mode, sizeof mode, "pass-through (device memory)");
  rmmc__emit_text(emit, ctx, "mode", mode);
  rmmc__emit_count(emit, ctx, "prefetches", rmmc__atomic_load_u64(&p->prefetches));
  rmmc__emit_bytes(emit, ctx, "prefetched", rmmc__atomic_load_u64(&p->prefetched));
}

static const rmmc_resource_ops_t prefetch_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "prefetch",
    .allocate = prefetch_allocate,
    .deallocate = rmmc__adaptor_forward_deallocate,
    .describe = prefetch_describe,
    .destroy = rmmc__adaptor_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

/* Managed memory can be prefetched only where the device has concurrent
 * managed access (cudaMemPrefetchAsync fails otherwise). */
static rmmc_status_t check_managed_prefetch(const char *what, const rmmc_resource_t *upstream) {
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE,
                          "%s: the %s upstream hands out managed memory, but no CUDA device is "
                          "available to prefetch it to",
                          what, upstream->ops->name);
  int concurrent = 0;
  cudaError_t err =
      cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, upstream->device);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "prefetch adaptor: cudaDeviceGetAttribute");
  if (!concurrent)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "%s: device %d has no concurrent managed access, so managed memory "
                          "cannot be prefetched on it",
                          what, upstream->device);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_prefetch_adaptor_create(rmmc_resource_t *upstream,
                                                    rmmc_resource_t **out) {
  static const char what[] = "prefetch_adaptor_create";
  rmmc_status_t st = rmmc__check_create(what, upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_memory_kind_t kind = upstream->kind;
  if (kind == RMMC_MEMORY_MANAGED) {
    st = check_managed_prefetch(what, upstream);
    if (st != RMMC_SUCCESS) return st;
  } else if (kind != RMMC_MEMORY_DEVICE) {
    return rmmc_set_error(RMMC_ERROR_INCOMPATIBLE,
                          "%s: the %s upstream hands out %s memory, which cannot be prefetched: "
                          "stack prefetch on managed memory (managed, or a sub-allocator over it)",
                          what, upstream->ops->name, rmmc_memory_kind_name(kind));
  }
  st = rmmc__adaptor_new(what, &prefetch_ops, upstream, sizeof(prefetch_adaptor_t), out);
  if (st != RMMC_SUCCESS) return st;
  ((prefetch_adaptor_t *)*out)->active = kind == RMMC_MEMORY_MANAGED;
  return RMMC_SUCCESS;
}

static rmmc_status_t prefetch_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                    int device, rmmc_resource_t **out) {
  (void)args, (void)device;
  return rmmc_prefetch_adaptor_create(upstream, out);
}

const rmmc__spec_entry_t rmmc__prefetch_spec = {
    .name = "prefetch",
    .help = "prefetch each managed allocation to the device on its stream",
    .needs_upstream = true,
    .build = prefetch_build,
};
