/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda resource: cudaMalloc and cudaFree on the resource's device.
 */
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/driver.h"
#include "base/spec.h"
#include "cuda_internal.h"
#include "cuda_options.h"
#include "rmmc/cuda_resource.h"

typedef struct cuda_resource {
  rmmc_resource_t base;
  size_t vm_page; /* virtual memory page size; 0: the driver has none */
  bool ipc;       /* pages made shareable (POSIX file descriptors) */
} cuda_resource_t;

static rmmc_status_t cuda_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  int saved;
  rmmc_status_t st = rmmc__base_allocate_begin(r, alignment, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaMalloc(out, bytes);
  rmmc__device_pop(saved);
  return rmmc__base_allocate_status(r, err, bytes, stream, "cudaMalloc");
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

/* ---- virtual memory: the driver's cuMemCreate/cuMemMap family ----
 *
 * The driver entry points come through rmmc__driver_load (driver.h), so
 * nothing links against libcuda and a machine without a driver still loads
 * the library. One physical allocation backs each range given to map;
 * unmap finds it again from the address (cuMemRetainAllocationHandle), so
 * no table is kept. */

typedef struct vm_driver {
  bool ok;
  char why[160];
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 address_free;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 set_access;
  PFN_cuMemRetainAllocationHandle_v11000 retain;
  PFN_cuMemGetAllocationGranularity_v10020 granularity;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDeviceGetAttribute_v2000 attribute;
  /* sharing between processes (ipc.c) and allocation queries */
  PFN_cuMemExportToShareableHandle_v10020 export_handle;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle;
  PFN_cuMemGetAddressRange_v3020 address_range;
  PFN_cuDeviceGetUuid_v11040 uuid;
} vm_driver_t;

static vm_driver_t vm;
static pthread_once_t vm_once = PTHREAD_ONCE_INIT;

static void vm_load(void) {
  const rmmc__driver_sym_t syms[] = {
      {"cuMemAddressReserve", (void **)&vm.reserve, 10020},
      {"cuMemAddressFree", (void **)&vm.address_free, 10020},
      {"cuMemCreate", (void **)&vm.create, 10020},
      {"cuMemRelease", (void **)&vm.release, 10020},
      {"cuMemMap", (void **)&vm.map, 10020},
      {"cuMemUnmap", (void **)&vm.unmap, 10020},
      {"cuMemSetAccess", (void **)&vm.set_access, 10020},
      {"cuMemRetainAllocationHandle", (void **)&vm.retain, 11000},
      {"cuMemGetAllocationGranularity", (void **)&vm.granularity, 10020},
      {"cuDeviceGet", (void **)&vm.device_get, 2000},
      {"cuDeviceGetAttribute", (void **)&vm.attribute, 2000},
      {"cuMemExportToShareableHandle", (void **)&vm.export_handle, 10020},
      {"cuMemImportFromShareableHandle", (void **)&vm.import_handle, 10020},
      {"cuMemGetAddressRange", (void **)&vm.address_range, 3020},
      {"cuDeviceGetUuid", (void **)&vm.uuid, 11040},
  };
  vm.ok = rmmc__driver_load(syms, sizeof syms / sizeof syms[0], vm.why, sizeof vm.why);
}

static void vm_prop(const rmmc_resource_t *r, CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = r->device;
  if (((const cuda_resource_t *)r)->ipc)
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

static rmmc_status_t vm_failed(CUresult res, const char *what) {
  if (res == CUDA_ERROR_OUT_OF_MEMORY)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "cuda: %s: out of device memory", what);
  return rmmc_set_error(RMMC_ERROR_CUDA, "cuda: %s failed (CUresult %d)", what, (int)res);
}

/* The device's minimum mapping granularity (2 MiB on current GPUs), 0 if
 * the driver has no virtual memory management. */
static size_t cuda_vm_page_size(const rmmc_resource_t *r) {
  cuda_resource_t *c = (cuda_resource_t *)r;
  return c->vm_page;
}

/* The start of every virtual memory call: the driver's entry points
 * loaded, then `device` made current (rmmc__device_pop(*saved) undoes it). */
static rmmc_status_t vm_begin(int device, int *saved) {
  pthread_once(&vm_once, vm_load);
  if (!vm.ok) return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "cuda: virtual memory: %s", vm.why);
  return rmmc__device_push(device, saved);
}

static size_t sum_sizes(const size_t *sizes, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += sizes[i];
  return total;
}

static rmmc_status_t cuda_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                     void **out) {
  int saved;
  rmmc_status_t st = vm_begin(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUdeviceptr p = 0;
  CUresult res = vm.reserve(&p, bytes, alignment, 0, 0);
  rmmc__device_pop(saved);
  if (res != CUDA_SUCCESS) return vm_failed(res, "cuMemAddressReserve");
  *out = (void *)(uintptr_t)p;
  return RMMC_SUCCESS;
}

/* Unreserve and unmap: the driver call in the slot *call (read once the
 * driver is loaded) on one range, on r's device. */
static rmmc_status_t cuda_vm_range_call(rmmc_resource_t *r, const PFN_cuMemUnmap_v10020 *call,
                                        void *ptr, size_t bytes, const char *what) {
  int saved;
  rmmc_status_t st = vm_begin(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUresult res = (*call)((CUdeviceptr)(uintptr_t)ptr, bytes);
  rmmc__device_pop(saved);
  return res == CUDA_SUCCESS ? RMMC_SUCCESS : vm_failed(res, what);
}

static rmmc_status_t cuda_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return cuda_vm_range_call(r, &vm.address_free, ptr, bytes, "cuMemAddressFree");
}

static rmmc_status_t cuda_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  int saved;
  rmmc_status_t st = vm_begin(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)ptr;
  CUmemAllocationProp prop;
  vm_prop(r, &prop);
  CUmemGenericAllocationHandle h;
  CUresult res = vm.create(&h, bytes, &prop, 0);
  const char *what = "cuMemCreate";
  if (res == CUDA_SUCCESS) {
    res = vm.map(d, bytes, 0, h, 0);
    what = "cuMemMap";
    if (res == CUDA_SUCCESS) {
      CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      res = vm.set_access(d, bytes, &access, 1);
      what = "cuMemSetAccess";
      if (res != CUDA_SUCCESS) (void)vm.unmap(d, bytes);
    }
    (void)vm.release(h); /* the mapping keeps the memory until it is unmapped */
  }
  rmmc__device_pop(saved);
  return res == CUDA_SUCCESS ? RMMC_SUCCESS : vm_failed(res, what);
}

static rmmc_status_t cuda_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return cuda_vm_range_call(r, &vm.unmap, ptr, bytes, "cuMemUnmap");
}

/* Grants (or takes back) `device`'s access to pages mapped by cuda_vm_map:
 * their mapping gave access to the resource's own device only. */
static rmmc_status_t cuda_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                        bool readwrite) {
  int saved;
  rmmc_status_t st = readwrite ? rmmc__check_peer("cuda: vm_set_access", r->device, device)
                               : RMMC_SUCCESS;
  if (st == RMMC_SUCCESS) st = vm_begin(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUmemAccessDesc access = {
      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
      .flags = readwrite ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE};
  CUresult res = vm.set_access((CUdeviceptr)(uintptr_t)ptr, bytes, &access, 1);
  rmmc__device_pop(saved);
  if (res == CUDA_SUCCESS) return RMMC_SUCCESS;
  char what[128];
  snprintf(what, sizeof what, "cuMemSetAccess (%s device %d, %zu bytes of device %d)",
           readwrite ? "granting" : "taking back from", device, bytes, r->device);
  return vm_failed(res, what);
}

/* ---- peer access: the contexts' (every cudaMalloc allocation) ---- */

static rmmc_status_t cuda_enable_peer_access(rmmc_resource_t *r, int peer) {
  int saved;
  rmmc_status_t st = rmmc__check_peer("cuda: enable_peer_access", r->device, peer);
  if (st == RMMC_SUCCESS) st = rmmc__device_push(peer, &saved);
  if (st != RMMC_SUCCESS) return st;
  /* From the peer's context: it may then reach the resource's device. */
  cudaError_t err = cudaDeviceEnablePeerAccess(r->device, 0);
  rmmc__device_pop(saved);
  if (err == cudaSuccess) return RMMC_SUCCESS;
  if (err == cudaErrorPeerAccessAlreadyEnabled) { /* by us or anyone else: what was asked */
    (void)cudaGetLastError();
    return RMMC_SUCCESS;
  }
  char what[96];
  snprintf(what, sizeof what, "cudaDeviceEnablePeerAccess (device %d reaching device %d)", peer,
           r->device);
  return rmmc_set_cuda_error(err, what);
}

/* ---- which allocation holds a pointer ---- */

static rmmc_status_t cuda_get_allocation(rmmc_resource_t *r, const void *ptr,
                                         rmmc_allocation_t *out) {
  pthread_once(&vm_once, vm_load);
  if (!vm.ok)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "cuda: cannot look up allocations: %s", vm.why);
  struct cudaPointerAttributes at;
  cudaError_t err = cudaPointerGetAttributes(&at, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "cuda: %p is not memory CUDA knows (%s)", ptr,
                          cudaGetErrorString(err));
  }
  if (at.type != cudaMemoryTypeDevice || at.device != r->device)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "cuda: %p is not device memory of device %d (CUDA says: %s memory of "
                          "device %d)",
                          ptr, r->device,
                          at.type == cudaMemoryTypeDevice    ? "device"
                          : at.type == cudaMemoryTypeHost    ? "pinned host"
                          : at.type == cudaMemoryTypeManaged ? "managed"
                                                             : "unregistered host",
                          at.device);
  int saved;
  rmmc_status_t st = rmmc__device_push(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult res = vm.address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  rmmc__device_pop(saved);
  if (res != CUDA_SUCCESS)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                          "cuda: %p is not inside an allocation of device %d (CUresult %d)", ptr,
                          r->device, (int)res);
  out->base = (void *)(uintptr_t)base;
  out->bytes = size;
  out->resource = r;
  out->backing = RMMC_BACKING_OWN;
  out->upstream = (rmmc_range_t){(void *)(uintptr_t)base, size};
  return RMMC_SUCCESS;
}

static void cuda_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  if (((cuda_resource_t *)r)->ipc)
    rmmc__emit_text(emit, ctx, "ipc", "pages shareable (POSIX file descriptors)");
}

/* ---- sharing with other processes (ipc.c) ---- */

bool rmmc__cuda_is_shareable(const rmmc_resource_t *r) {
  return rmmc__cuda_is(r) && ((const cuda_resource_t *)r)->ipc;
}

rmmc_status_t rmmc__cuda_export_mapping(rmmc_resource_t *r, void *addr, int *fd) {
  int saved;
  *fd = -1;
  rmmc_status_t st = vm_begin(r->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUmemGenericAllocationHandle h;
  CUresult res = vm.retain(&h, addr);
  const char *what = "cuMemRetainAllocationHandle";
  if (res == CUDA_SUCCESS) {
    int out = -1;
    res = vm.export_handle(&out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    what = "cuMemExportToShareableHandle";
    if (res == CUDA_SUCCESS) *fd = out;
    (void)vm.release(h);
  }
  rmmc__device_pop(saved);
  return res == CUDA_SUCCESS ? RMMC_SUCCESS : vm_failed(res, what);
}

/* The driver calls below need a context; a process that only imports
 * has made no runtime call that would have started one. */
static rmmc_status_t start_context(void) {
  cudaError_t err = cudaFree(NULL);
  return err == cudaSuccess ? RMMC_SUCCESS
                            : rmmc_set_cuda_error(err, "cudaFree(NULL) (starting the context)");
}

/* Unmaps the first n imported mappings at base and frees the reservation
 * (`total` bytes). Device current. */
static CUresult import_undo(CUdeviceptr base, const size_t *sizes, size_t n, size_t total) {
  CUresult first = CUDA_SUCCESS;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    CUresult res = vm.unmap(base + off, sizes[i]);
    if (first == CUDA_SUCCESS) first = res;
    off += sizes[i];
  }
  CUresult res = vm.address_free(base, total);
  return first != CUDA_SUCCESS ? first : res;
}

rmmc_status_t rmmc__cuda_import_mappings(int device, const int *fds, const size_t *sizes, size_t n,
                                         void **out) {
  size_t total = sum_sizes(sizes, n);
  int saved;
  rmmc_status_t st = vm_begin(device, &saved);
  if (st == RMMC_SUCCESS && (st = start_context()) != RMMC_SUCCESS) rmmc__device_pop(saved);
  if (st != RMMC_SUCCESS) return st;
  CUdeviceptr base = 0;
  CUresult res = vm.reserve(&base, total, 0, 0, 0);
  const char *what = "cuMemAddressReserve";
  size_t mapped = 0, off = 0;
  for (; res == CUDA_SUCCESS && mapped < n; mapped++) {
    CUmemGenericAllocationHandle h;
    res = vm.import_handle(&h, (void *)(uintptr_t)fds[mapped],
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    what = "cuMemImportFromShareableHandle";
    if (res != CUDA_SUCCESS) break;
    res = vm.map(base + off, sizes[mapped], 0, h, 0);
    what = "cuMemMap";
    (void)vm.release(h); /* the mapping holds the memory */
    if (res != CUDA_SUCCESS) break;
    off += sizes[mapped];
  }
  if (res == CUDA_SUCCESS) {
    CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    res = vm.set_access(base, total, &access, 1);
    what = "cuMemSetAccess";
  }
  if (res != CUDA_SUCCESS && base != 0) (void)import_undo(base, sizes, mapped, total);
  rmmc__device_pop(saved);
  if (res != CUDA_SUCCESS) return vm_failed(res, what);
  *out = (void *)(uintptr_t)base;
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__cuda_unmap_import(int device, void *base, const size_t *sizes, size_t n) {
  size_t total = sum_sizes(sizes, n);
  int saved;
  rmmc_status_t st = vm_begin(device, &saved);
  if (st != RMMC_SUCCESS) return st;
  CUresult res = import_undo((CUdeviceptr)(uintptr_t)base, sizes, n, total);
  rmmc__device_pop(saved);
  return res == CUDA_SUCCESS ? RMMC_SUCCESS : vm_failed(res, "cuMemUnmap/cuMemAddressFree");
}

rmmc_status_t rmmc__cuda_device_uuid(int device, unsigned char uuid[16]) {
  pthread_once(&vm_once, vm_load);
  if (!vm.ok) return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "cuda: the driver: %s", vm.why);
  CUdevice dev;
  CUuuid u;
  CUresult res = vm.device_get(&dev, device);
  if (res == CUDA_SUCCESS) res = vm.uuid(&u, dev);
  if (res != CUDA_SUCCESS) return vm_failed(res, "cuDeviceGetUuid");
  memcpy(uuid, u.bytes, 16);
  return RMMC_SUCCESS;
}

static const rmmc_resource_ops_t cuda_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "cuda",
    .allocate = cuda_allocate,
    .deallocate = rmmc__cudafree_deallocate,
    .is_equal = rmmc__same_device_is_equal,
    .describe = cuda_describe,
    .destroy = cuda_destroy,
    .vm_page_size = cuda_vm_page_size,
    .vm_reserve = cuda_vm_reserve,
    .vm_unreserve = cuda_vm_unreserve,
    .vm_map = cuda_vm_map,
    .vm_unmap = cuda_vm_unmap,
    .get_allocation = cuda_get_allocation,
    .enable_peer_access = cuda_enable_peer_access,
    .vm_set_access = cuda_vm_set_access,
};

bool rmmc__cuda_is(const rmmc_resource_t *r) { return r != NULL && r->ops == &cuda_ops; }

RMMC_API rmmc_status_t rmmc_cuda_resource_create_with_options(int device,
                                                              const rmmc_cuda_options_t *options,
                                                              rmmc_resource_t **out) {
  rmmc_cuda_options_t o = RMMC_CUDA_OPTIONS_INIT;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, "cuda_resource_create", &o, options, RMMC_CUDA_OPTIONS);
  if (st != RMMC_SUCCESS) {
    if (out != NULL) *out = NULL;
    return st;
  }
  st = rmmc__device_resource_new("cuda_resource_create", device, &cuda_ops, RMMC_MEMORY_DEVICE,
                                 sizeof(cuda_resource_t), out);
  if (st != RMMC_SUCCESS) return st;
  /* Virtual memory where the driver and device support it: its page size. */
  cuda_resource_t *c = (cuda_resource_t *)*out;
  c->ipc = o.ipc;
  int saved;
  pthread_once(&vm_once, vm_load);
  if (vm.ok && rmmc__device_push(c->base.device, &saved) == RMMC_SUCCESS) {
    int supported = 0, fd_handles = 0;
    CUdevice dev;
    if (vm.device_get(&dev, c->base.device) != CUDA_SUCCESS ||
        vm.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
            CUDA_SUCCESS)
      supported = 0;
    if (supported && o.ipc &&
        (vm.attribute(&fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                      dev) != CUDA_SUCCESS ||
         !fd_handles)) {
      rmmc__device_pop(saved);
      free(c);
      *out = NULL;
      return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                            "cuda_resource_create: device %d cannot share virtual memory through "
                            "POSIX file descriptors, so ipc=true cannot be honoured (its "
                            "cudaMalloc memory can be shared: pool(expandable=false) > cuda)",
                            device);
    }
    CUmemAllocationProp prop;
    vm_prop(&c->base, &prop);
    size_t g = 0;
    if (supported && vm.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
        rmmc__is_pow2(g))
      c->vm_page = g;
    rmmc__device_pop(saved);
  }
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_cuda_resource_create(int device, rmmc_resource_t **out) {
  return rmmc_cuda_resource_create_with_options(device, NULL, out);
}

#define CUDA_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_cuda_options_t, __VA_ARGS__)
static const rmmc__spec_option_t cuda_spec_options[] = {
    RMMC__CUDA_OPTIONS(CUDA_SPEC_ROW){.name = NULL},
};
#undef CUDA_SPEC_ROW

static rmmc_status_t cuda_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  rmmc_cuda_options_t o = RMMC_CUDA_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, cuda_spec_options, upstream, &o);
  return st == RMMC_SUCCESS ? rmmc_cuda_resource_create_with_options(device, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__cuda_spec = {
    .name = "cuda",
    .help = "cudaMalloc/cudaFree",
    .options = cuda_spec_options,
    .build = cuda_build,
};
