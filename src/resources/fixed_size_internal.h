/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What binning needs of fixed_size beyond the public header (internal).
 */
#ifndef RMMC_FIXED_SIZE_INTERNAL_H
#define RMMC_FIXED_SIZE_INTERNAL_H

#include "base/internal.h"

/* release_cached without forwarding to the upstream: binning releases all
 * its bins' chunks first and forwards once. r must be a fixed_size. */
rmmc_status_t rmmc__fixed_size_release_chunks(rmmc_resource_t *r);

#endif /* RMMC_FIXED_SIZE_INTERNAL_H */
