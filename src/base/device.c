/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device helpers: the ground floor above status.c.
 *
 * How many devices there are (counted once), the current device, checking
 * and resolving a device id, making a device current for one call and
 * putting the previous one back, and a device's free and total memory.
 * Everything above (dispatch, resources, the spec options, the registry,
 * containers) asks here; this file calls only status.c and CUDA, and calls
 * CUDA only when one of its functions is called.
 */
#include <stdarg.h>

#include "base/driver.h"
#include "base/internal.h"
#include "rmmc/registry.h"

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

/* ---- the driver's entry points (driver.h) ---- */

bool rmmc__driver_load(const rmmc__driver_sym_t *syms, size_t n, char *why, size_t why_len) {
  for (size_t i = 0; i < n; i++) {
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion(syms[i].name, syms[i].fn, syms[i].version,
                                                       cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || *syms[i].fn == NULL) {
      (void)cudaGetLastError();
      snprintf(why, why_len, "the driver has no %s (%s)", syms[i].name,
               err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found");
      return false;
    }
  }
  return true;
}

static rmmc__driver_t drv;
static bool drv_ok;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_init(void) {
  const rmmc__driver_sym_t syms[] = {
      {"cuCtxGetDevice", (void **)&drv.ctx_get_device, 2000},
      {"cuDeviceGet", (void **)&drv.device_get, 2000},
      {"cuStreamIsCapturing", (void **)&drv.stream_is_capturing, 10000},
      {"cuEventRecord", (void **)&drv.event_record, 2000},
      {"cuEventQuery", (void **)&drv.event_query, 2000},
      {"cuStreamWaitEvent", (void **)&drv.stream_wait_event, 3020},
      {"cuThreadExchangeStreamCaptureMode", (void **)&drv.exchange_capture_mode, 10010},
      {"cuGetErrorName", (void **)&drv.error_name, 6000},
      {"cuGetErrorString", (void **)&drv.error_string, 6000},
  };
  char why[160];
  int n = rmmc_device_count();
  if (n == 0 || !rmmc__driver_load(syms, sizeof syms / sizeof syms[0], why, sizeof why)) return;
  drv.ndevices = n < RMMC_MAX_DEVICES ? n : RMMC_MAX_DEVICES;
  for (int i = 0; i < drv.ndevices; i++)
    if (drv.device_get(&drv.devices[i], i) != CUDA_SUCCESS) return;
  drv_ok = true;
}

const rmmc__driver_t *rmmc__driver(void) {
  pthread_once(&drv_once, drv_init);
  return drv_ok ? &drv : NULL;
}

/* The runtime number of the device of the calling thread's current
 * context, from the driver (cuCtxGetDevice: 17-34 ns at any thread count,
 * where cudaGetDevice took 49 ns alone and 1.7 us with 16 threads at once
 * on the H100); false when there is no context or no driver table. */
static bool driver_current(int *out) {
  const rmmc__driver_t *d = rmmc__driver();
  CUdevice cur;
  if (d == NULL || d->ctx_get_device(&cur) != CUDA_SUCCESS) return false;
  for (int i = 0; i < d->ndevices; i++)
    if (d->devices[i] == cur) {
      *out = i;
      return true;
    }
  return false;
}

rmmc_status_t rmmc__set_driver_error(CUresult res, const char *what) {
  const char *name = NULL, *text = NULL;
  if (drv_ok) {
    if (drv.error_name(res, &name) != CUDA_SUCCESS) name = NULL;
    if (drv.error_string(res, &text) != CUDA_SUCCESS) text = NULL;
  }
  return rmmc_set_error(res == CUDA_ERROR_OUT_OF_MEMORY ? RMMC_ERROR_OUT_OF_MEMORY : RMMC_ERROR_CUDA,
                        "%s failed: %s (%s, %d)", what, text != NULL ? text : "driver error",
                        name != NULL ? name : "CUresult", (int)res);
}

RMMC_API bool rmmc_device_can_access_peer(int device, int peer_device) {
  int n = rmmc_device_count(), can = 0;
  if (device < 0 || peer_device < 0 || device >= n || peer_device >= n || device == peer_device)
    return false;
  if (cudaDeviceCanAccessPeer(&can, device, peer_device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return can != 0;
}

/* What every layer that makes device memory reachable checks: the peer
 * exists, is another device and has what the memory needs of it, a peer
 * path to `device` (attr < 0: cudaDeviceCanAccessPeer) or device attribute
 * `attr`; "<what>: device <peer> <lacking>" otherwise. */
static rmmc_status_t check_peer(const char *what, int device, int peer, int attr,
                                const char *lacking) {
  int n = rmmc_device_count();
  if (n == 0) return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "%s: no CUDA device is available", what);
  if (peer < 0 || peer >= n)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: device %d cannot be given access to the memory of device %d: "
                          "device %d does not exist (this machine has %d)",
                          what, peer, device, peer, n);
  if (peer == device)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: device %d cannot be its own peer: the memory is its own", what,
                          peer);
  int has = 0;
  cudaError_t err = attr < 0 ? cudaDeviceCanAccessPeer(&has, peer, device)
                             : cudaDeviceGetAttribute(&has, (enum cudaDeviceAttr)attr, peer);
  if (err != cudaSuccess)
    return rmmc_set_cuda_error(err, attr < 0 ? "cudaDeviceCanAccessPeer" : "cudaDeviceGetAttribute");
  if (!has) return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "%s: device %d %s", what, peer, lacking);
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__check_peer(const char *what, int device, int peer) {
  char lacking[320];
  snprintf(lacking, sizeof lacking,
           "cannot access the memory of device %d: cudaDeviceCanAccessPeer says the two cannot "
           "be peers (no NVLink or PCIe peer-to-peer path between them, or the platform forbids "
           "it); cudaMemcpyPeer still copies between them, through the host",
           device);
  return check_peer(what, device, peer, -1, lacking);
}

rmmc_status_t rmmc__check_peer_attribute(const char *what, int device, int peer,
                                         enum cudaDeviceAttr attr, const char *lacking) {
  return check_peer(what, device, peer, (int)attr, lacking);
}

RMMC_API rmmc_status_t rmmc_get_current_device(int *device) {
  if (device == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "get_current_device: NULL");
  if (!rmmc__cuda_available()) {
    *device = 0;
    return RMMC_SUCCESS;
  }
  if (driver_current(device)) return RMMC_SUCCESS;
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

bool rmmc__device_is_current(int device) {
  int cur;
  return driver_current(&cur) && cur == device;
}

rmmc_status_t rmmc__device_push(int device, int *saved) {
  *saved = -1;
  if (device < 0) return RMMC_SUCCESS;
  if (!rmmc__cuda_available())
    return rmmc_set_error(RMMC_ERROR_NO_DEVICE, "device %d: no CUDA device is available", device);
  if (rmmc__device_is_current(device)) return RMMC_SUCCESS;
  int cur;
  cudaError_t err = cudaGetDevice(&cur);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaGetDevice");
  if (cur == device) {
    /* The runtime's device, but no context is current for the driver yet
     * (the thread's first CUDA call): make it current, as the runtime's
     * next call would, so that the driver's calls find it too. */
    if (rmmc__driver() != NULL && (err = cudaSetDevice(device)) != cudaSuccess)
      return rmmc_set_cuda_error(err, "cudaSetDevice");
    return RMMC_SUCCESS;
  }
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return rmmc_set_cuda_error(err, "cudaSetDevice");
  *saved = cur;
  return RMMC_SUCCESS;
}

void rmmc__device_pop(int saved) {
  if (saved >= 0) (void)cudaSetDevice(saved);
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

/* Here rather than in status.c because for device memory the message gives
 * the device's free and total memory, which takes a device switch. Asking
 * for them leaves the failure as it was: the message (a switch that fails
 * writes its own) and the last CUDA error. */
RMMC_API rmmc_status_t rmmc_set_oom_error(const rmmc_resource_t *r, size_t bytes,
                                          cudaStream_t stream, const char *detail, ...) {
  va_list ap;
  va_start(ap, detail);
  rmmc__set_oom_message(r, bytes, stream, detail, ap);
  va_end(ap);
  if (r->device < 0) return RMMC_ERROR_OUT_OF_MEMORY;
  rmmc__error_state_t before;
  rmmc__error_save(&before);
  size_t free_b = 0, total_b = 0;
  int saved;
  if (rmmc__device_push(r->device, &saved) != RMMC_SUCCESS) {
    rmmc__error_restore(&before);
    return RMMC_ERROR_OUT_OF_MEMORY;
  }
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    char fb[32], tb[32];
    rmmc__append_error("; device %d has %s free of %s", r->device,
                       rmmc__format_bytes(free_b, fb, sizeof fb),
                       rmmc__format_bytes(total_b, tb, sizeof tb));
  } else {
    (void)cudaGetLastError();
  }
  rmmc__device_pop(saved);
  return RMMC_ERROR_OUT_OF_MEMORY;
}
