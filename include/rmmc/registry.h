/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-device resource registry, device helpers and convenience calls.
 *
 * The registry holds one resource per CUDA device. Until a resource is set
 * for a device, the first get builds that device's default: a cuda resource,
 * or the stack RMMC_ALLOC_CONF names (see defaults.h). The current device is
 * cudaGetDevice() at call time; on a machine with no CUDA device the current
 * device is 0 and no default can be built, so a program sets a resource (a
 * host resource, say) explicitly, and get without one says so with
 * RMMC_ERROR_NO_DEVICE.
 *
 * Lifetime. The registry retains what it holds. rmmc_set_device_resource()
 * retains the new resource and hands the reference it held on the previous
 * one to the caller, who releases it (after freeing what was allocated from
 * it). The pointer rmmc_get_device_resource() returns is borrowed: it stays
 * valid while the registry holds it, so only until the next set of that
 * device by any thread; retaining it afterwards is too late when another
 * thread may set meanwhile (and release what it got back). Code that may
 * run beside a set takes its own reference with
 * rmmc_retain_device_resource(), which is atomic with set: what it returns
 * was the device's resource at some moment of the call and stays valid
 * until the caller releases it. rmmc_allocate(), rmmc_deallocate(), the
 * containers and the PyTorch and CuPy plug-ins do so.
 * rmmc_registry_clear() drops every reference the registry holds.
 *
 * All calls are safe from many threads at once. A set (or clear) waits for
 * the retains under way on other threads to finish (a few loads each).
 */
#ifndef RMMC_REGISTRY_H
#define RMMC_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The highest number of devices the registry tracks. */
#define RMMC_REGISTRY_MAX_DEVICES 64

/* The number of CUDA devices; 0 when there is none or no driver. Never
 * fails. */
RMMC_EXPORT int rmmc_device_count(void);

/* True when kernels on `device` can be given access to the memory of
 * `peer_device` (cudaDeviceCanAccessPeer; the order of CUDA's and of
 * PyTorch's torch.cuda.can_device_access_peer): two different devices
 * that exist and have a peer path. False otherwise, and without a GPU.
 * rmmc_resource_enable_peer_access(r, device) on a stack of peer_device
 * succeeds where this is true. Never fails; thread-safe. */
RMMC_EXPORT bool rmmc_device_can_access_peer(int device, int peer_device);

/* The current CUDA device of the calling thread, or 0 when the machine has
 * no CUDA device. RMMC_ERROR_INVALID_ARGUMENT for NULL, RMMC_ERROR_CUDA if
 * CUDA fails otherwise. */
RMMC_EXPORT rmmc_status_t rmmc_get_current_device(int *device);

/* Device `device`'s resource, borrowed, in *out; builds the default on first
 * use. RMMC_ERROR_INVALID_ARGUMENT for a NULL out or an id out of range;
 * RMMC_ERROR_NO_DEVICE when nothing is set and there is no device to build a
 * default on; the default's own status if building it fails. */
RMMC_EXPORT rmmc_status_t rmmc_get_device_resource(int device, rmmc_resource_t **out);

/* Device `device`'s resource in *out with a new reference, which the
 * caller releases; builds the default on first use. Atomic with
 * rmmc_set_device_resource() on other threads: never a resource a set has
 * already handed back. Statuses as rmmc_get_device_resource(). */
RMMC_EXPORT rmmc_status_t rmmc_retain_device_resource(int device, rmmc_resource_t **out);

/* Makes `r` device `device`'s resource (retaining it) and stores the
 * reference the registry held on the previous one in *previous (NULL if
 * there was none; `previous` itself may be NULL, which releases it). r ==
 * NULL returns the device to its lazily built default.
 * RMMC_ERROR_INVALID_ARGUMENT for an id out of range;
 * RMMC_ERROR_INCOMPATIBLE for a resource of another device. */
RMMC_EXPORT rmmc_status_t rmmc_set_device_resource(int device, rmmc_resource_t *r,
                                                   rmmc_resource_t **previous);

/* The same for the current device. */
RMMC_EXPORT rmmc_status_t rmmc_get_current_device_resource(rmmc_resource_t **out);
RMMC_EXPORT rmmc_status_t rmmc_retain_current_device_resource(rmmc_resource_t **out);
RMMC_EXPORT rmmc_status_t rmmc_set_current_device_resource(rmmc_resource_t *r,
                                                           rmmc_resource_t **previous);

/* Drops every reference the registry holds; the next get builds defaults
 * again. For tests and orderly shutdown. */
RMMC_EXPORT void rmmc_registry_clear(void);

/* Allocates from the current device's resource on `stream` with the
 * default alignment (statuses as rmmc_resource_allocate). */
RMMC_EXPORT rmmc_status_t rmmc_allocate(size_t bytes, cudaStream_t stream, void **out);

/* Returns memory from rmmc_allocate() to the resource it came from: the
 * current device's, or, while several devices have resources in the
 * registry, the device whose stack holds the block whatever device is
 * current (found with rmmc_resource_get_allocation(); a current stack that
 * cannot tell is given the free). */
RMMC_EXPORT rmmc_status_t rmmc_deallocate(void *ptr, size_t bytes, cudaStream_t stream);

/* Free and total memory of `device` (-1: the current device).
 * RMMC_ERROR_NO_DEVICE with no GPU, RMMC_ERROR_CUDA if CUDA fails. */
RMMC_EXPORT rmmc_status_t rmmc_device_memory_info(int device, size_t *free_bytes,
                                                  size_t *total_bytes);

/* `percent` (0 < percent <= 100) of device `device`'s free memory, rounded
 * down to a multiple of 256 bytes. */
RMMC_EXPORT rmmc_status_t rmmc_percent_of_free_device_memory(int device, double percent,
                                                             size_t *out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_REGISTRY_H */
