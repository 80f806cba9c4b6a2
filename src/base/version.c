/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The library's version at run time (version.h): the values the headers
 * had when this librmmc was compiled.
 */
#include "base/internal.h"
#include "rmmc/version.h"

RMMC_API int rmmc_version(void) { return RMMC_VERSION; }

RMMC_API const char *rmmc_version_string(void) { return RMMC_VERSION_STRING; }
