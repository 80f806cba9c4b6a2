/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA helpers for the resources that talk to CUDA directly: which device is
 * current and switching to another, peer access checks, the base
 * resources' shared creation, alignment rule and cudaFree slot. Each that
 * returns a status has recorded the error. Implemented in device.c.
 */
#ifndef RMMC_INTERNAL_DEVICE_H
#define RMMC_INTERNAL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"
#include "rmmc/resource_ops.h"

#define RMMC_MAX_DEVICES 64

/* True if the CUDA runtime sees at least one device; never fails. */
bool rmmc__cuda_available(void);

/* Is `device` the device of the calling thread's current context? One
 * driver call (cuCtxGetDevice), no error set; false when unsure (no
 * context yet, no driver table). */
bool rmmc__device_is_current(int device);

/* Makes `device` current for the calling thread and remembers the previous
 * one in *saved (-1 if nothing had to change). Asks the driver first
 * (rmmc__device_is_current), the runtime only when that says no. */
rmmc_status_t rmmc__device_push(int device, int *saved);
void rmmc__device_pop(int saved);

/* Can kernels on `peer` be given access to the memory of `device`? Checks
 * that peer exists, differs from device and has a peer path to it
 * (cudaDeviceCanAccessPeer); RMMC_ERROR_INVALID_ARGUMENT,
 * RMMC_ERROR_NOT_SUPPORTED or RMMC_ERROR_NO_DEVICE with a message that
 * starts with `what` and names both devices otherwise. */
rmmc_status_t rmmc__check_peer(const char *what, int device, int peer);
/* For memory that every device reaches without a grant (managed, pinned):
 * peer exists, differs from device (-1: none) and has device attribute
 * `attr`; RMMC_ERROR_NOT_SUPPORTED with "device <peer> <lacking>"
 * otherwise. */
rmmc_status_t rmmc__check_peer_attribute(const char *what, int device, int peer,
                                         enum cudaDeviceAttr attr, const char *lacking);

/* Resolves -1 to the current device and checks the id. */
rmmc_status_t rmmc__resolve_device(int device, int *out);

/* Allocates and initializes a base resource of `struct_size` bytes for
 * `device` (-1: current) after checking that a GPU is there; the struct is
 * zeroed past the base. For the resources that talk to CUDA directly. */
rmmc_status_t rmmc__device_resource_new(const char *what, int device,
                                        const rmmc_resource_ops_t *ops,
                                        rmmc_memory_kind_t kind, size_t struct_size,
                                        rmmc_resource_t **out);

/* Base CUDA resources give 256-byte alignment and no more. */
static inline rmmc_status_t rmmc__check_base_alignment(const rmmc_resource_t *r,
                                                       size_t alignment) {
  if (RMMC_LIKELY(alignment <= RMMC_DEFAULT_ALIGNMENT)) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                        "%s resource gives 256-byte alignment, not %zu: stack an aligned "
                        "adaptor or a pool on it",
                        r->ops->name, alignment);
}

/* The start of a base CUDA resource's allocate: the alignment check, then
 * r's device made current (rmmc__device_pop(*saved) undoes it). */
static inline rmmc_status_t rmmc__base_allocate_begin(const rmmc_resource_t *r, size_t alignment,
                                                      int *saved) {
  rmmc_status_t st = rmmc__check_base_alignment(r, alignment);
  return st == RMMC_SUCCESS ? rmmc__device_push(r->device, saved) : st;
}

/* The status of `err`, what CUDA's allocation call `what` (cudaMalloc, ...)
 * answered to a request of `bytes` on `stream`: out of memory with
 * rmmc_set_oom_error's full message, so retry logic and users see the
 * device's state, or the CUDA error as it is. */
static inline rmmc_status_t rmmc__base_allocate_status(const rmmc_resource_t *r, cudaError_t err,
                                                       size_t bytes, cudaStream_t stream,
                                                       const char *what) {
  if (RMMC_LIKELY(err == cudaSuccess)) return RMMC_SUCCESS;
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return rmmc_set_oom_error(r, bytes, stream, "%s failed", what);
  }
  return rmmc_set_cuda_error(err, what);
}

/* Slots shared by the resources that free with cudaFree (cuda, managed):
 * cudaFree on the resource's device, a pointer CUDA does not know being
 * RMMC_ERROR_UNKNOWN_POINTER; equal when of the same device. */
rmmc_status_t rmmc__cudafree_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream);
bool rmmc__same_device_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b);

/* Builds device `device`'s default resource (registry, first use). */
rmmc_status_t rmmc__create_default_resource(int device, rmmc_resource_t **out);

#endif /* RMMC_INTERNAL_DEVICE_H */
