/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's options table (internal name): RMMC_POOL_OPTIONS in
 * include/rmmc/pool_resource.h is the one table; the spec rows, the help
 * and the create's ranges are made from it.
 */
#ifndef RMMC_POOL_OPTIONS_H
#define RMMC_POOL_OPTIONS_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "rmmc/pool_resource.h"

#define RMMC__POOL_OPTIONS(X) RMMC_POOL_OPTIONS(X)

#endif /* RMMC_POOL_OPTIONS_H */
