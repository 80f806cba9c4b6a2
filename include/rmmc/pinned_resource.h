/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pinned resource: page-locked host memory from cudaHostAlloc
 * (portable: usable from every device's streams), freed by cudaFreeHost.
 * Its memory belongs to no one device (rmmc_resource_device() is -1).
 * Alignment above 256 is RMMC_ERROR_NOT_SUPPORTED. Thread-safe.
 */
#ifndef RMMC_PINNED_RESOURCE_H
#define RMMC_PINNED_RESOURCE_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a pinned host resource. RMMC_ERROR_NO_DEVICE without a GPU. */
RMMC_EXPORT rmmc_status_t rmmc_pinned_resource_create(rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_PINNED_RESOURCE_H */
