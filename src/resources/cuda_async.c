/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda_async resource: cudaMallocFromPoolAsync / cudaFreeAsync on a
 * cudaMemPool_t the resource owns (created with an initial size and a
 * release threshold) or only views (the device's default pool, or one the
 * caller gives).
 */
#include <stdlib.h>

#include "cuda_async_options.h"
#include "base/spec.h"
#include "rmmc/cuda_async_resource.h"
#include "rmmc/cuda_resource.h"

typedef struct async_resource {
  rmmc_resource_t base;
  cudaMemPool_t pool;
  bool owned;
} async_resource_t;

static rmmc_status_t async_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  async_resource_t *a = (async_resource_t *)r;
  int saved;
  rmmc_status_t st = rmmc__base_allocate_begin(r, alignment, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaMallocFromPoolAsync(out, bytes, a->pool, stream);
  rmmc__device_pop(saved);
  return rmmc__base_allocate_status(r, err, bytes, stream, "cudaMallocFromPoolAsync");
}

static rmmc_status_t async_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  (void)bytes, (void)alignment;
  int saved;
  rmmc_status_t st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaFreeAsync(ptr, stream);
  rmmc__device_pop(saved);
  if (err == cudaErrorInvalidValue)
    return rmmc__unknown_cuda_pointer(r, err, "cudaFreeAsync", ptr);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaFreeAsync");
}

static bool async_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  return ((const async_resource_t *)a)->pool == ((const async_resource_t *)b)->pool;
}

static rmmc_status_t async_release_cached(rmmc_resource_t *r) {
  async_resource_t *a = (async_resource_t *)r;
  int saved;
  rmmc_status_t st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaMemPoolTrimTo(a->pool, 0);
  rmmc__device_pop(saved);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cuda_async release");
}

static void async_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  async_resource_t *a = (async_resource_t *)r;
  static const struct {
    const char *key;
    enum cudaMemPoolAttr attr;
  } attrs[] = {
      {RMMC__FIG(RESERVED), cudaMemPoolAttrReservedMemCurrent},
      {RMMC__FIG(IN_USE), cudaMemPoolAttrUsedMemCurrent},
      {RMMC__FIG(PEAK), cudaMemPoolAttrUsedMemHigh},
      {"reserved_peak", cudaMemPoolAttrReservedMemHigh},
      {"release_threshold", cudaMemPoolAttrReleaseThreshold},
  };
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    uint64_t v = 0;
    if (cudaMemPoolGetAttribute(a->pool, attrs[i].attr, &v) == cudaSuccess)
      rmmc__emit_bytes(emit, ctx, attrs[i].key, (uint64_t)v);
    else
      (void)cudaGetLastError();
  }
  rmmc__emit_text(emit, ctx, "pool", a->owned ? "owned" : "view");
}

static void async_destroy(rmmc_resource_t *r) {
  async_resource_t *a = (async_resource_t *)r;
  if (a->owned) {
    /* Frees enqueued on streams must complete before the pool goes. */
    int saved;
    if (rmmc__device_push(r->device, &saved) == RMMC_SUCCESS) {
      (void)cudaDeviceSynchronize();
      (void)cudaMemPoolDestroy(a->pool);
      rmmc__device_pop(saved);
    }
  }
  free(a);
}

/* The pool's access: every allocation of the pool, now and later
 * (cudaMemPoolSetAccess). For a view of the device's default pool, that
 * pool's, which every cudaMallocAsync of the device uses. */
static rmmc_status_t async_enable_peer_access(rmmc_resource_t *r, int peer) {
  int saved;
  rmmc_status_t st = rmmc__check_peer("cuda_async: enable_peer_access", r->device, peer);
  if (st == RMMC_SUCCESS) st = rmmc__device_push(peer, &saved); /* the peer's context exists */
  if (st != RMMC_SUCCESS) return st;
  struct cudaMemAccessDesc access = {
      .location = {.type = cudaMemLocationTypeDevice, .id = peer},
      .flags = cudaMemAccessFlagsProtReadWrite};
  cudaError_t err = cudaMemPoolSetAccess(((async_resource_t *)r)->pool, &access, 1);
  rmmc__device_pop(saved);
  if (err == cudaSuccess) return RMMC_SUCCESS;
  char what[96];
  snprintf(what, sizeof what, "cudaMemPoolSetAccess (device %d reaching device %d's pool)", peer,
           r->device);
  return rmmc_set_cuda_error(err, what);
}

static const rmmc_resource_ops_t async_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "cuda_async",
    .allocate = async_allocate,
    .deallocate = async_deallocate,
    .is_equal = async_is_equal,
    .release_cached = async_release_cached,
    .describe = async_describe,
    .destroy = async_destroy,
    .enable_peer_access = async_enable_peer_access,
};

static rmmc_status_t check_pools_supported(int device) {
  int supported = 0;
  cudaError_t err = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaDeviceGetAttribute");
  if (!supported)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "cuda_async: device %d does not support memory pools", device);
  return RMMC_SUCCESS;
}

/* Reserves `bytes` in the pool by allocating and freeing them, as RMM does. */
static rmmc_status_t reserve_initial(async_resource_t *a, size_t bytes) {
  void *p = NULL;
  cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, a->pool, NULL);
  if (err == cudaSuccess) err = cudaFreeAsync(p, NULL);
  if (err == cudaSuccess) err = cudaStreamSynchronize(NULL);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return rmmc_set_oom_error(&a->base, bytes, NULL, "cannot reserve the initial pool size");
  }
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cuda_async initial reserve");
}

RMMC_API rmmc_status_t rmmc_cuda_async_resource_create(int device,
                                                       const rmmc_cuda_async_options_t *options,
                                                       rmmc_resource_t **out) {
  rmmc_cuda_async_options_t opts = RMMC_CUDA_ASYNC_OPTIONS_INIT;
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "cuda_async_resource_create: out is NULL");
  *out = NULL;
  rmmc_resource_t *r;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, "cuda_async_resource_create", &opts, options, RMMC_CUDA_ASYNC_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc__device_resource_new("cuda_async_resource_create", device, &async_ops,
                                               RMMC_MEMORY_DEVICE, sizeof(async_resource_t), &r);
  if (st != RMMC_SUCCESS) return st;
  async_resource_t *a = (async_resource_t *)r;
  int saved = -1;
  st = check_pools_supported(r->device);
  if (st == RMMC_SUCCESS) st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) goto free_resource;
  struct cudaMemPoolProps props = {0};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = r->device;
  cudaError_t err = cudaMemPoolCreate(&a->pool, &props);
  if (err != cudaSuccess) {
    st = rmmc_set_cuda_error(err, "cudaMemPoolCreate");
    goto pop_device;
  }
  a->owned = true;
  uint64_t threshold = (uint64_t)opts.release_threshold;
  err = cudaMemPoolSetAttribute(a->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (err != cudaSuccess) {
    st = rmmc_set_cuda_error(err, "cudaMemPoolSetAttribute(release threshold)");
    goto destroy_pool;
  }
  if (opts.initial_pool_size > 0) {
    st = reserve_initial(a, rmmc__align_up(opts.initial_pool_size, RMMC_DEFAULT_ALIGNMENT));
    if (st != RMMC_SUCCESS) goto destroy_pool;
  }
  rmmc__device_pop(saved);
  *out = r;
  return RMMC_SUCCESS;

destroy_pool:
  (void)cudaMemPoolDestroy(a->pool);
pop_device:
  rmmc__device_pop(saved);
free_resource:
  free(r);
  return st;
}

RMMC_API rmmc_status_t rmmc_cuda_async_resource_create_view(int device, cudaMemPool_t pool,
                                                            rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "cuda_async_resource_create_view: out is NULL");
  *out = NULL;
  rmmc_resource_t *r;
  rmmc_status_t st = rmmc__device_resource_new("cuda_async_resource_create_view", device,
                                               &async_ops, RMMC_MEMORY_DEVICE,
                                               sizeof(async_resource_t), &r);
  if (st != RMMC_SUCCESS) return st;
  st = check_pools_supported(r->device);
  if (st == RMMC_SUCCESS && pool == NULL) {
    cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, r->device);
    if (err != cudaSuccess) st = rmmc_set_cuda_error(err, "cudaDeviceGetDefaultMemPool");
  }
  if (st != RMMC_SUCCESS) {
    free(r);
    return st;
  }
  ((async_resource_t *)r)->pool = pool;
  *out = r;
  return RMMC_SUCCESS;
}

RMMC_API cudaMemPool_t rmmc_cuda_async_resource_pool(const rmmc_resource_t *r) {
  if (rmmc__check_kind(r, &async_ops, "cuda_async_resource_pool") != RMMC_SUCCESS) return NULL;
  return ((const async_resource_t *)r)->pool;
}

#define ASYNC_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_cuda_async_options_t, __VA_ARGS__)
static const rmmc__spec_option_t async_spec_options[] = {
    RMMC__CUDA_ASYNC_OPTIONS(ASYNC_SPEC_ROW)
    /* Not a field: it picks the view of the device's default pool. */
    {.name = "default_pool", .type = RMMC__OPT_BOOL,
     .help = "use the device's default pool (plain cudaMallocAsync)", .def = "false"},
    {.name = NULL},
};
#undef ASYNC_SPEC_ROW

static rmmc_status_t async_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                 int device, rmmc_resource_t **out) {
  (void)upstream;
  bool use_default = false;
  rmmc__spec_bool(args, "default_pool", &use_default);
  if (use_default) return rmmc_cuda_async_resource_create_view(device, NULL, out);
  rmmc_cuda_async_options_t opts = RMMC_CUDA_ASYNC_OPTIONS_INIT;
  rmmc_resource_t *probe = NULL;
  rmmc_status_t st = rmmc_cuda_resource_create(device, &probe); /* resolves percentages */
  if (st == RMMC_SUCCESS) st = rmmc__spec_fill(args, async_spec_options, probe, &opts);
  rmmc_resource_release(probe);
  return st == RMMC_SUCCESS ? rmmc_cuda_async_resource_create(device, &opts, out) : st;
}

const rmmc__spec_entry_t rmmc__cuda_async_spec = {
    .name = "cuda_async",
    .help = "CUDA's stream-ordered pool (cudaMallocFromPoolAsync)",
    .options = async_spec_options,
    .build = async_build,
};
