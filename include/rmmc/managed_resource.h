/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The managed resource: cudaMallocManaged (unified memory, attached
 * globally) on one device, with an option to prefetch each allocation to the
 * device on the allocating stream right away, so that first touch by a
 * kernel does not fault page by page (as the RAPIDS guidance recommends).
 * Alignment above 256 is RMMC_ERROR_NOT_SUPPORTED. Thread-safe.
 */
#ifndef RMMC_MANAGED_RESOURCE_H
#define RMMC_MANAGED_RESOURCE_H

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The managed options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_MANAGED_OPTIONS(X)                                                                    \
  /* prefetch every allocation to the device (default false) */                                    \
  X(bool, prefetch, false, 0, 0, "prefetch", BOOL, BOOL, "false", "",                              \
    "prefetch each allocation to the device")

typedef struct rmmc_managed_options {
  size_t size; /* sizeof(rmmc_managed_options_t): set by the INIT macro */
  RMMC_MANAGED_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_managed_options_t;

#define RMMC_MANAGED_OPTIONS_INIT \
  {sizeof(rmmc_managed_options_t) RMMC_MANAGED_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a managed resource for `device` (-1: current); NULL options mean
 * defaults. RMMC_ERROR_NO_DEVICE without a GPU; RMMC_ERROR_NOT_SUPPORTED if
 * the device cannot do managed memory. */
RMMC_EXPORT rmmc_status_t rmmc_managed_resource_create(int device,
                                                       const rmmc_managed_options_t *options,
                                                       rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_MANAGED_RESOURCE_H */
