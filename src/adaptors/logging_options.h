/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The logging adaptor's options, once, as data (internal): one row per option of
 * rmmc_logging_options_t (its public header is the manual of each), with the columns
 * of include/rmmc/options.h (the table itself is the public header's). The spec table and builder beside the
 * logging adaptor's code, the help and tests/test_options_tables.c (against
 * RMMC_LOGGING_OPTIONS_INIT) are made from it.
 * path= is the create's own argument, no field: a row of its own in
 * logging.c; time= is text logging_build turns into the enum (NONE).
 */
#ifndef RMMC_LOGGING_OPTIONS_H
#define RMMC_LOGGING_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "rmmc/logging_adaptor.h"

#define RMMC__LOGGING_OPTIONS(X) RMMC_LOGGING_OPTIONS(X)

#endif /* RMMC_LOGGING_OPTIONS_H */
