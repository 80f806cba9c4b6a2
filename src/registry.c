/*
 * The per-device registry and the CUDA device helpers.
 *
 * Each slot is an atomic pointer: get is one load on the hot path and takes
 * the lock only to build a default on first use; set swaps under the lock.
 * Nothing here calls CUDA until a function that needs a device is called.
 */
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "internal.h"
#include "rmmc/registry.h"

_Static_assert(RMMC_REGISTRY_MAX_DEVICES == RMMC_MAX_DEVICES, "one device limit");

static rmmc_resource_t *slots[RMMC_MAX_DEVICES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int device_count_cached;

static void count_devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  device_count_cached = n;
}

RMMC_API int rmmc_device_count(void) {
  pthread_once(&count_once, count_devices);
  return device_count_cached;
}

bool rmmc__cuda_available(void) { return rmmc_device_count() > 0; }

RMMC_API rmmc_status_t rmmc_get_current_device(int *device) {
  if (device == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "get_current_device: NULL");
  if (!rmmc__cuda_available()) {
    *device = 0;
    return RMMC_SUCCESS;
  }
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaGetDevice");
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__resolve_device(int device, int *out) {
  if (device == -1) return rmmc_get_current_device(out);
  if (device < 0 || device >= RMMC_MAX_DEVICES)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "device %d is out of range", device);
  int n = rmmc_device_count();
  if (n > 0 && device >= n)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "device %d does not exist (this machine has %d)", device, n);
  *out = device;
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__device_push(int device, int *saved) {
  *saved = -1;
  if (device < 0) return RMMC_SUCCESS;
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "device %d: no CUDA device is available", device);
  int cur;
  cudaError_t err = cudaGetDevice(&cur);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaGetDevice");
  if (cur == device) return RMMC_SUCCESS;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaSetDevice");
  *saved = cur;
  return RMMC_SUCCESS;
}

void rmmc__device_pop(int saved) {
  if (saved >= 0) (void)cudaSetDevice(saved);
}

rmmc_status_t rmmc__device_resource_new(const char *what, int device,
                                        const rmmc_resource_ops_t *ops,
                                        rmmc_memory_kind_t kind, size_t struct_size,
                                        rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: out is NULL", what);
  *out = NULL;
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "%s: no CUDA device is available", what);
  int dev = -1;
  if (device != -1 || kind != RMMC_MEMORY_PINNED) {
    rmmc_status_t st = rmmc__resolve_device(device, &dev);
    if (st != RMMC_SUCCESS) return st;
  }
  rmmc_resource_t *r = calloc(1, struct_size);
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", what);
  rmmc_resource_init(r, ops, kind, dev);
  *out = r;
  return RMMC_SUCCESS;
}

static rmmc_status_t check_id(int device) {
  if (device < 0 || device >= RMMC_MAX_DEVICES)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "device %d is out of range [0, %d)", device, RMMC_MAX_DEVICES);
  int n = rmmc_device_count();
  if (n > 0 && device >= n)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "device %d does not exist (this machine has %d)", device, n);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_get_device_resource(int device, rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "get_device_resource: out is NULL");
  *out = NULL;
  rmmc_status_t st = check_id(device);
  if (st != RMMC_SUCCESS) return st;
  rmmc_resource_t *r = __atomic_load_n(&slots[device], __ATOMIC_ACQUIRE);
  if (RMMC_LIKELY(r != NULL)) {
    *out = r;
    return RMMC_SUCCESS;
  }
  pthread_mutex_lock(&registry_lock);
  r = slots[device];
  if (r == NULL) {
    st = rmmc__default_config_check(); /* a broken RMMC_ALLOC_CONF fails first, GPU or not */
    if (st == RMMC_SUCCESS && !rmmc__cuda_available()) {
      st = rmmc_set_error(RMMC_ERROR_NO_DEVICE,
                          "no CUDA device is available, so device %d has no default resource: "
                          "set one (a host resource, say) with rmmc_set_device_resource()",
                          device);
    } else if (st == RMMC_SUCCESS) {
      st = rmmc__create_default_resource(device, &r);
      if (st == RMMC_SUCCESS) __atomic_store_n(&slots[device], r, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&registry_lock);
  if (st == RMMC_SUCCESS) *out = r;
  return st;
}

RMMC_API rmmc_status_t rmmc_set_device_resource(int device, rmmc_resource_t *r,
                                                rmmc_resource_t **previous) {
  if (previous != NULL) *previous = NULL;
  rmmc_status_t st = check_id(device);
  if (st != RMMC_SUCCESS) return st;
  if (r != NULL && r->device >= 0 && r->device != device)
    return rmmc_set_error(RMMC_ERROR_INCOMPATIBLE,
                          "set_device_resource: a %s resource of device %d cannot serve device %d",
                          r->ops->name, r->device, device);
  rmmc_resource_retain(r);
  pthread_mutex_lock(&registry_lock);
  rmmc_resource_t *old = slots[device];
  __atomic_store_n(&slots[device], r, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&registry_lock);
  if (previous != NULL)
    *previous = old;
  else
    rmmc_resource_release(old);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_get_current_device_resource(rmmc_resource_t **out) {
  int dev;
  if (out != NULL) *out = NULL;
  rmmc_status_t st = rmmc_get_current_device(&dev);
  return st != RMMC_SUCCESS ? st : rmmc_get_device_resource(dev, out);
}

RMMC_API rmmc_status_t rmmc_set_current_device_resource(rmmc_resource_t *r,
                                                        rmmc_resource_t **previous) {
  int dev;
  if (previous != NULL) *previous = NULL;
  rmmc_status_t st = rmmc_get_current_device(&dev);
  return st != RMMC_SUCCESS ? st : rmmc_set_device_resource(dev, r, previous);
}

RMMC_API void rmmc_registry_clear(void) {
  rmmc_resource_t *held[RMMC_MAX_DEVICES];
  pthread_mutex_lock(&registry_lock);
  for (int i = 0; i < RMMC_MAX_DEVICES; i++) {
    held[i] = slots[i];
    __atomic_store_n(&slots[i], NULL, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&registry_lock);
  for (int i = 0; i < RMMC_MAX_DEVICES; i++) rmmc_resource_release(held[i]);
}

RMMC_API rmmc_status_t rmmc_allocate(size_t bytes, cudaStream_t stream, void **out) {
  rmmc_resource_t *r;
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "allocate: out-pointer is NULL");
  rmmc_status_t st = rmmc_get_current_device_resource(&r);
  if (st != RMMC_SUCCESS) {
    *out = NULL;
    return st;
  }
  return rmmc_resource_allocate(r, bytes, RMMC_DEFAULT_ALIGNMENT, stream, out);
}

RMMC_API rmmc_status_t rmmc_deallocate(void *ptr, size_t bytes, cudaStream_t stream) {
  rmmc_resource_t *r;
  if (ptr == NULL) return RMMC_SUCCESS;
  rmmc_status_t st = rmmc_get_current_device_resource(&r);
  return st != RMMC_SUCCESS ? st : rmmc_resource_deallocate(r, ptr, bytes, RMMC_DEFAULT_ALIGNMENT, stream);
}

RMMC_API rmmc_status_t rmmc_device_memory_info(int device, size_t *free_bytes, size_t *total_bytes) {
  if (free_bytes == NULL || total_bytes == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "device_memory_info: NULL out-pointer");
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "device_memory_info: no CUDA device is available");
  int dev, saved;
  rmmc_status_t st = rmmc__resolve_device(device, &dev);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc__device_push(dev, &saved);
  if (st != RMMC_SUCCESS) return st;
  cudaError_t err = cudaMemGetInfo(free_bytes, total_bytes);
  rmmc__device_pop(saved);
  return err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaMemGetInfo");
}

RMMC_API rmmc_status_t rmmc_percent_of_free_device_memory(int device, double percent, size_t *out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "percent_of_free: out is NULL");
  *out = 0;
  if (!(percent > 0.0 && percent <= 100.0))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "percent_of_free: %g is not in (0, 100]", percent);
  size_t free_b, total_b;
  rmmc_status_t st = rmmc_device_memory_info(device, &free_b, &total_b);
  if (st != RMMC_SUCCESS) return st;
  *out = (size_t)((double)free_b * (percent / 100.0)) & ~(RMMC_DEFAULT_ALIGNMENT - 1);
  return RMMC_SUCCESS;
}
