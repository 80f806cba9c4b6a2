/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process default's configuration, as the rest of the core sees it
 * (internal; defaults.c and torch_conf.c).
 */
#ifndef RMMC_CONFIG_INTERNAL_H
#define RMMC_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/status.h"

/* RMMC_SUCCESS, or, when the configuration is broken and the process did
 * not opt into the fallback (RMMC_ALLOC_CONF_FALLBACK), the status of the
 * problem with its message set: what a registry lookup that would build a
 * default returns, GPU or not. Reads the environment on first use. */
rmmc_status_t rmmc__default_config_check(void);

/* When `conf` is PyTorch's allocator syntax (key:value pairs such as
 * expandable_segments:True), writes a sentence naming the rmmc spelling
 * into buf (len bytes, terminated) and returns true; false otherwise. */
bool rmmc__torch_conf_hint(const char *conf, char *buf, size_t len);

#endif /* RMMC_CONFIG_INTERNAL_H */
