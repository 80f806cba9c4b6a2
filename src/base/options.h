/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one rule for a caller's options struct (STYLE.md: structs the caller
 * allocates start with a `size` member set by their _INIT macro): every
 * create that takes options copies them here, with one check and one
 * message.
 */
#ifndef RMMC_INTERNAL_OPTIONS_H
#define RMMC_INTERNAL_OPTIONS_H

#include <stddef.h>
#include <string.h>

#include "rmmc/resource_ops.h" /* rmmc_set_error */

/* Copies a caller's options struct (whose first member is `size_t size`)
 * over the defaults in *dst (`dst_size` bytes): NULL keeps the defaults; a
 * size from sizeof(size_t) to dst_size (this struct or an older, shorter
 * one) copies that much. Anything else is RMMC_ERROR_INVALID_ARGUMENT
 * naming `what`: below, options not set with the _INIT macro; above, a
 * newer header's options (or garbage), refused rather than misread, since
 * this library cannot honour fields it does not know. */
static inline rmmc_status_t rmmc__copy_options(const char *what, void *dst, size_t dst_size,
                                               const void *src) {
  if (src == NULL) return RMMC_SUCCESS;
  size_t size = *(const size_t *)src;
  if (size < sizeof(size_t) || size > dst_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: options size is %zu; this library knows sizes from %zu to %zu: "
                          "initialize the options with their _INIT macro",
                          what, size, sizeof(size_t), dst_size);
  memcpy(dst, src, size);
  *(size_t *)dst = dst_size;
  return RMMC_SUCCESS;
}

#endif /* RMMC_INTERNAL_OPTIONS_H */
