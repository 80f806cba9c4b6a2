/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tracking adaptor's options, once, as data (internal): one row per option of
 * rmmc_tracking_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * tracking adaptor's code, the help and tests/test_options_tables.c (against
 * RMMC_TRACKING_OPTIONS_INIT) are made from it.
 */
#ifndef RMMC_TRACKING_OPTIONS_H
#define RMMC_TRACKING_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "rmmc/tracking_adaptor.h"

/* The most frames kept per allocation (the header says 1..256). */
#define RMMC__TRACKING_MAX_DEPTH 256

#define RMMC__TRACKING_OPTIONS(X) RMMC_TRACKING_OPTIONS(X)

#endif /* RMMC_TRACKING_OPTIONS_H */
