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
#include <stdio.h>
#include <stdlib.h>
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

/* A double as the shortest text that reads back as the same value ("0.02",
 * not "0.020000000000000000"), for the range messages and the help. */
static inline void rmmc__format_double(char *buf, size_t len, double v) {
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, len, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return;
  }
}

/* The one range check of a create's options: each row of an options table
 * (include/rmmc/options.h) with a range (min, max not both 0) holds its
 * field of *o within it, or the create fails with
 * "<what>: <field>=<value> is out of range (<min> to <max>)" (the spec
 * parser's words). Each field is compared in its own kind of number, so
 * the bounds and the value are exact: signed and unsigned integers as
 * long long and unsigned long long, doubles as doubles (NaN is out of every
 * range). Use: RMMC__CHECK_OPTION_RANGES(st, "pool_resource_create", o,
 * RMMC_POOL_OPTIONS), st set to the first failure or RMMC_SUCCESS. */
static inline rmmc_status_t rmmc__option_signed_in_range(const char *what, const char *field,
                                                         long long v, long long lo,
                                                         long long hi) {
  if (v >= lo && v <= hi) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%lld is out of range (%lld to %lld)",
                        what, field, v, lo, hi);
}
static inline rmmc_status_t rmmc__option_unsigned_in_range(const char *what, const char *field,
                                                           unsigned long long v,
                                                           unsigned long long lo,
                                                           unsigned long long hi) {
  if (v >= lo && v <= hi) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%llu is out of range (%llu to %llu)",
                        what, field, v, lo, hi);
}
static inline rmmc_status_t rmmc__option_double_in_range(const char *what, const char *field,
                                                         double v, double lo, double hi) {
  if (v >= lo && v <= hi) return RMMC_SUCCESS;
  char vt[32], lt[32], ht[32];
  rmmc__format_double(vt, sizeof vt, v);
  rmmc__format_double(lt, sizeof lt, lo);
  rmmc__format_double(ht, sizeof ht, hi);
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%s is out of range (%s to %s)", what,
                        field, vt, lt, ht);
}
/* A row of another type (a pointer, a struct) can hold no range: reached
 * only if a table gives one, which is a mistake in the table. */
static inline rmmc_status_t rmmc__option_no_range(const char *what, const char *field, ...) {
  return rmmc_set_error(RMMC_ERROR_INTERNAL, "%s: %s has a range but is not a number", what,
                        field);
}
#define RMMC__OPTION_IN_RANGE(v)                                                                \
  _Generic((v),                                                                                 \
      _Bool: rmmc__option_unsigned_in_range,                                                    \
      char: rmmc__option_signed_in_range,                                                       \
      signed char: rmmc__option_signed_in_range,                                                \
      short: rmmc__option_signed_in_range,                                                      \
      int: rmmc__option_signed_in_range,                                                        \
      long: rmmc__option_signed_in_range,                                                       \
      long long: rmmc__option_signed_in_range,                                                  \
      unsigned char: rmmc__option_unsigned_in_range,                                            \
      unsigned short: rmmc__option_unsigned_in_range,                                           \
      unsigned: rmmc__option_unsigned_in_range,                                                 \
      unsigned long: rmmc__option_unsigned_in_range,                                            \
      unsigned long long: rmmc__option_unsigned_in_range,                                       \
      float: rmmc__option_double_in_range,                                                      \
      double: rmmc__option_double_in_range,                                                     \
      default: rmmc__option_no_range)
/* Every create's options in one step: copied over the defaults in *dst
 * (rmmc__copy_options), then held to the ranges of the layer's table.
 * Use: RMMC__TAKE_OPTIONS(st, "pool_resource_create", &o, options,
 * RMMC_POOL_OPTIONS). */
#define RMMC__TAKE_OPTIONS(st, what, dst, src, TABLE)                                           \
  do {                                                                                          \
    (st) = rmmc__copy_options((what), (dst), sizeof *(dst), (src));                             \
    if ((st) == RMMC_SUCCESS) RMMC__CHECK_OPTION_RANGES(st, what, dst, TABLE);                  \
  } while (0)
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
    rmmc__st = RMMC__OPTION_IN_RANGE(rmmc__o->field)(rmmc__what, #field, rmmc__o->field, (lo), \
                                                     (hi));

#endif /* RMMC_INTERNAL_OPTIONS_H */
