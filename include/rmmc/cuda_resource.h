/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda resource: cudaMalloc and cudaFree on one device.
 *
 * cudaMalloc is synchronous and cudaFree synchronizes the device, so the
 * stream arguments only order nothing: memory is ready for every stream.
 * Alignment: cudaMalloc gives 256 bytes; a larger alignment is
 * RMMC_ERROR_NOT_SUPPORTED (stack an aligned adaptor or a pool on top).
 * A pointer cudaFree does not know is RMMC_ERROR_UNKNOWN_POINTER. Two cuda
 * resources of one device are equal. Thread-safe.
 *
 * Virtual memory (resource.h): where the driver and the device support it
 * (cudaDevAttrVirtualMemoryManagementSupported), the resource also reserves
 * address space (cuMemAddressReserve) and maps memory into it
 * (cuMemCreate + cuMemMap + cuMemSetAccess, one physical allocation per
 * mapped range, read-write for its device); rmmc_resource_vm_page_size() is
 * the device's minimum granularity (2 MiB on current GPUs), 0 without
 * support. This is what pool(expandable=true) grows on. The driver's entry
 * points are looked up through the runtime: rmmc never links libcuda.
 *
 * Sharing with other processes (ipc.h): cudaMalloc memory always can be
 * (CUDA IPC handles). Virtual-memory pages can be when the resource makes
 * them shareable: the ipc option (`cuda(ipc=true)`) asks cuMemCreate for
 * POSIX file descriptor handles, which costs a little per mapping
 * (docs/design.md has the figures) and needs a device that supports them
 * (RMMC_ERROR_NOT_SUPPORTED at creation otherwise). describe reports an
 * "ipc" text field when it is on.
 */
#ifndef RMMC_CUDA_RESOURCE_H
#define RMMC_CUDA_RESOURCE_H

#include <stdbool.h>

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a cuda resource for `device` (-1: the current device).
 * RMMC_ERROR_NO_DEVICE without a GPU; RMMC_ERROR_INVALID_ARGUMENT for a bad
 * device id or NULL out. */
RMMC_EXPORT rmmc_status_t rmmc_cuda_resource_create(int device, rmmc_resource_t **out);

/* The cuda options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_CUDA_OPTIONS(X)                                                                       \
  /* ipc=: make virtual-memory pages shareable with other processes (rmmc_ipc_export of an         \
   * expandable pool's blocks); default false.                                                     \
   */                                                                                              \
  X(bool, ipc, false, 0, 0, "ipc", BOOL, BOOL, "false", "",                                        \
    "virtual-memory pages shareable with other processes (POSIX file descriptors)")

/* Options of the cuda resource (stack specs name them in parentheses). */
typedef struct rmmc_cuda_options {
  size_t size; /* sizeof(rmmc_cuda_options_t) */
  RMMC_CUDA_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_cuda_options_t;

#define RMMC_CUDA_OPTIONS_INIT \
  {sizeof(rmmc_cuda_options_t) RMMC_CUDA_OPTIONS(RMMC_OPTION_DEFAULT)}

/* rmmc_cuda_resource_create() with options (NULL: defaults). Also
 * RMMC_ERROR_INVALID_ARGUMENT for options not set with their _INIT macro;
 * RMMC_ERROR_NOT_SUPPORTED for ipc on a device that has virtual memory
 * but cannot share it through file descriptors. */
RMMC_EXPORT rmmc_status_t rmmc_cuda_resource_create_with_options(int device,
                                                                const rmmc_cuda_options_t *options,
                                                                rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_CUDA_RESOURCE_H */
