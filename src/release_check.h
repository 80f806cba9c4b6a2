/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RMMC_CHECK_RELEASE report (internal; release_check.c), called by
 * rmmc_resource_release() around a resource's destroy.
 */
#ifndef RMMC_RELEASE_CHECK_H
#define RMMC_RELEASE_CHECK_H

#include <stdbool.h>

#include "rmmc/resource.h"

/* Before destroying r: reports r's live blocks if the environment asked
 * and r is the outermost layer being destroyed on this thread. Returns
 * what rmmc__release_check_end() wants. */
bool rmmc__release_check_begin(rmmc_resource_t *r);
void rmmc__release_check_end(bool begun);

#endif /* RMMC_RELEASE_CHECK_H */
