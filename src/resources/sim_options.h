/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sim resource's options, once, as data (internal): one row per option of
 * rmmc_sim_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * sim resource's code, the help and tests/test_options_tables.c (against
 * RMMC_SIM_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_SIM_OPTIONS_H
#define RMMC_SIM_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "rmmc/sim_resource.h"

#define RMMC__SIM_OPTIONS(X) RMMC_SIM_OPTIONS(X)

#endif /* RMMC_SIM_OPTIONS_H */
