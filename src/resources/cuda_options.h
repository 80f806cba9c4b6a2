/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda resource's options, once, as data (internal): one row per option of
 * rmmc_cuda_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * cuda resource's code, the help and tests/test_options_tables.c (against
 * RMMC_CUDA_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_CUDA_OPTIONS_H
#define RMMC_CUDA_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "rmmc/cuda_resource.h"

#define RMMC__CUDA_OPTIONS(X) RMMC_CUDA_OPTIONS(X)

#endif /* RMMC_CUDA_OPTIONS_H */
