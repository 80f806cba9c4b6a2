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

/* The one range check of a create's options: each row of an options table
 * (include/rmmc/options.h) with a range (min, max not both 0) holds its
 * field of *o within it, or the create fails with
 * "<what>: <field>=<value> is out of range (<min> to <max>)". Values are
 * compared as doubles: exact for every integer field up to 2^53 and every
 * range the tables hold. Use: RMMC__CHECK_OPTION_RANGES(st, "pool_resource_create",
 * o, RMMC_POOL_OPTIONS), with st RMMC_SUCCESS before. */
static inline rmmc_status_t rmmc__option_in_range(const char *what, const char *field, double v,
                                                  double lo, double hi) {
  if (v >= lo && v <= hi) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%.17g is out of range (%.17g to %.17g)",
                        what, field, v, lo, hi);
}
#define RMMC__CHECK_OPTION_RANGES(st, what, o, TABLE)                                           \
  do {                                                                                          \
    const char *rmmc__what = (what);                                                            \
    __typeof__(o) rmmc__o = (o);                                                                \
    rmmc_status_t rmmc__st = RMMC_SUCCESS;                                                      \
    TABLE(RMMC__OPTION_RANGE_ROW)                                                               \
    (st) = rmmc__st;                                                                            \
  } while (0)
#define RMMC__OPTION_RANGE_ROW(ctype, field, cdef, lo, hi, ...)                                 \
  if (rmmc__st == RMMC_SUCCESS && ((lo) != 0 || (hi) != 0))                                     \
    rmmc__st = rmmc__option_in_range(rmmc__what, #field, (double)rmmc__o->field, (double)(lo), \
                                     (double)(hi));

#endif /* RMMC_INTERNAL_OPTIONS_H */
