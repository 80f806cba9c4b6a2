/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stack-spec option values, for the resources' build functions: the
 * accessors (rmmc__spec_int, _double, _bool, _string, _bytes), the generic
 * builder that fills an options struct from a table (rmmc__spec_fill) and
 * the size syntax (rmmc__parse_bytes).
 *
 * Apart from the parser (spec.c) and its table of every resource
 * (spec_table.c) on purpose: each resource's build function reads its
 * options here, and the parser's table links every resource, so a resource
 * that called into spec.c would pull the parser and through it the whole
 * library into any program that uses it. This file calls only the device
 * helpers (a percentage of a device's free memory) and status.c.
 */
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/registry.h"
#include "base/options.h" /* rmmc__format_double */
#include "base/spec.h"

/* Binary units only: KB, MB, GB, TB mean 1000^n to some and 1024^n to
 * others, so they are refused (rmmc__size_unit_hint says what to write). */
static const struct {
  const char *suffix;
  unsigned shift; /* the unit is 2^shift bytes */
} units[] = {{"", 0},   {"B", 0},    {"K", 10},  {"KiB", 10}, {"M", 20},
             {"MiB", 20}, {"G", 30}, {"GiB", 30}, {"T", 40},  {"TiB", 40}};

static bool unit_of(const char *suffix, unsigned *shift) {
  while (*suffix == ' ' || *suffix == '\t') suffix++; /* "64 MiB" */
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(suffix, units[i].suffix) == 0) {
      *shift = units[i].shift;
      return true;
    }
  return false;
}

/* Whole numbers of bytes are exact (strtoull: 18446744073709551615 is the
 * largest size); fractions and exponents ("1.5GiB", "1e6") go through
 * strtod and must come to a whole number of bytes. */
rmmc_status_t rmmc__parse_bytes(const char *text, size_t len, size_t *out, bool *too_large) {
  char buf[64];
  if (too_large != NULL) *too_large = false;
  if (len == 0 || !isdigit((unsigned char)text[0])) return RMMC_ERROR_PARSE;
  if (len >= sizeof buf) { /* no size is written this long: digits only make it too large */
    size_t i = 0;
    while (i < len && isdigit((unsigned char)text[i])) i++;
    if (too_large != NULL) *too_large = i > 20;
    return RMMC_ERROR_PARSE;
  }
  memcpy(buf, text, len);
  buf[len] = '\0';
  char *end;
  unsigned shift;
  errno = 0;
  unsigned long long whole = strtoull(buf, &end, 10);
  if (unit_of(end, &shift)) {
    bool fits = errno != ERANGE && whole <= (unsigned long long)(SIZE_MAX >> shift);
    if (too_large != NULL) *too_large = !fits;
    if (!fits) return RMMC_ERROR_PARSE;
    *out = (size_t)whole << shift;
    return RMMC_SUCCESS;
  }
  double v = strtod(buf, &end);
  if (end == buf || !(v >= 0) || !unit_of(end, &shift)) return RMMC_ERROR_PARSE;
  double bytes = ldexp(v, (int)shift);
  if (bytes >= 18446744073709551616.0) {
    if (too_large != NULL) *too_large = true;
    return RMMC_ERROR_PARSE;
  }
  if (bytes != floor(bytes)) return RMMC_ERROR_PARSE;
  *out = (size_t)bytes;
  return RMMC_SUCCESS;
}

const rmmc__spec_value_t *rmmc__spec_find(const rmmc__spec_args_t *args, const char *name) {
  for (int i = 0; i < args->count; i++)
    if (strcmp(args->values[i].option->name, name) == 0) return &args->values[i];
  return NULL;
}

bool rmmc__spec_int(const rmmc__spec_args_t *args, const char *name, long long *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v != NULL) *out = v->integer;
  return v != NULL;
}

rmmc_status_t rmmc__spec_int_in(const rmmc__spec_args_t *args, const char *name, long long lo,
                                long long hi, long long *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v == NULL) return RMMC_SUCCESS;
  if (v->integer < lo || v->integer > hi)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%s is out of range (%lld to %lld)",
                          args->layer, v->key != NULL ? v->key : name, v->text, lo, hi);
  *out = v->integer;
  return RMMC_SUCCESS;
}

bool rmmc__spec_double(const rmmc__spec_args_t *args, const char *name, double *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v != NULL) *out = v->number;
  return v != NULL;
}

bool rmmc__spec_bool(const rmmc__spec_args_t *args, const char *name, bool *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v != NULL) *out = v->boolean;
  return v != NULL;
}

const char *rmmc__spec_string(const rmmc__spec_args_t *args, const char *name) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  return v != NULL ? v->text : NULL;
}

rmmc_status_t rmmc__spec_bytes(const rmmc__spec_args_t *args, const char *name,
                               const rmmc_resource_t *upstream, size_t *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v == NULL) return RMMC_SUCCESS;
  if (!v->is_percent) {
    *out = v->bytes;
    return RMMC_SUCCESS;
  }
  if (upstream != NULL && upstream->kind == RMMC_MEMORY_DEVICE)
    return rmmc_percent_of_free_device_memory(upstream->device, v->number, out);
  size_t total = rmmc__host_memory_total();
  if (total == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "%s: %s=%g%%: host memory size unknown",
                          args->layer, v->key != NULL ? v->key : name, v->number);
  *out = (size_t)((double)total * v->number / 100.0) & ~(RMMC_DEFAULT_ALIGNMENT - 1);
  return RMMC_SUCCESS;
}

void rmmc__spec_range_text(const rmmc__spec_option_t *o, char *buf, size_t len) {
  if (len > 0) buf[0] = '\0';
  if (!o->ranged || o->type == RMMC__OPT_BOOL || o->type == RMMC__OPT_STRING) return;
  if (o->field == RMMC__FIELD_DOUBLE) {
    char lo[32], hi[32];
    rmmc__format_double(lo, sizeof lo, o->dlo);
    rmmc__format_double(hi, sizeof hi, o->dhi);
    snprintf(buf, len, "%s to %s", lo, hi);
  } else {
    snprintf(buf, len, "%lld to %llu", o->lo, o->hi);
  }
}

/* The range check of a size or a number the builder stored (integers have
 * theirs in rmmc__spec_int_in). */
static rmmc_status_t stored_in_range(const rmmc__spec_args_t *args, const rmmc__spec_option_t *o,
                                     const void *at) {
  bool in;
  if (o->field == RMMC__FIELD_DOUBLE) {
    double v = *(const double *)at;
    in = v >= o->dlo && v <= o->dhi;
  } else {
    size_t v = *(const size_t *)at;
    in = (o->lo <= 0 || v >= (unsigned long long)o->lo) && v <= o->hi;
  }
  if (in) return RMMC_SUCCESS;
  char range[96];
  rmmc__spec_range_text(o, range, sizeof range);
  const rmmc__spec_value_t *given = rmmc__spec_find(args, o->name);
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s=%s is out of range (%s)", args->layer,
                        given->key != NULL ? given->key : o->name, given->text, range);
}

/* An integer option's range, in long long (what the parser reads). */
static long long int_max(const rmmc__spec_option_t *o, long long otherwise) {
  if (!o->ranged) return otherwise;
  return o->hi > (unsigned long long)LLONG_MAX ? LLONG_MAX : (long long)o->hi;
}

rmmc_status_t rmmc__spec_fill(const rmmc__spec_args_t *args, const rmmc__spec_option_t *table,
                              const rmmc_resource_t *upstream, void *options) {
  for (const rmmc__spec_option_t *o = table; o->name != NULL; o++) {
    if (o->field == RMMC__FIELD_NONE || rmmc__spec_find(args, o->name) == NULL) continue;
    char *at = (char *)options + o->offset;
    long long lo = o->ranged ? o->lo : 0, v = 0;
    bool b = false;
    rmmc_status_t st = RMMC_SUCCESS;
    switch (o->field) {
    case RMMC__FIELD_NONE: break;
    case RMMC__FIELD_SIZE: /* a size, or a count (INT) */
      if (o->type != RMMC__OPT_INT) {
        st = rmmc__spec_bytes(args, o->name, upstream, (size_t *)(void *)at);
        if (st == RMMC_SUCCESS && o->ranged) st = stored_in_range(args, o, at);
      } else {
        st = rmmc__spec_int_in(args, o->name, lo, int_max(o, LLONG_MAX), &v);
        if (st == RMMC_SUCCESS) *(size_t *)(void *)at = (size_t)v;
      }
      break;
    case RMMC__FIELD_DOUBLE:
      (void)rmmc__spec_double(args, o->name, (double *)(void *)at);
      if (o->ranged) st = stored_in_range(args, o, at);
      break;
    case RMMC__FIELD_BOOL: (void)rmmc__spec_bool(args, o->name, (bool *)(void *)at); break;
    case RMMC__FIELD_INT: /* an integer, or a bool as 1 or 0 */
      if (o->type == RMMC__OPT_BOOL) {
        (void)rmmc__spec_bool(args, o->name, &b);
        *(int *)(void *)at = b ? 1 : 0;
      } else {
        st = rmmc__spec_int_in(args, o->name, o->ranged ? o->lo : INT_MIN, int_max(o, INT_MAX), &v);
        if (st == RMMC_SUCCESS) *(int *)(void *)at = (int)v;
      }
      break;
    case RMMC__FIELD_UNSIGNED:
      st = rmmc__spec_int_in(args, o->name, lo, int_max(o, (long long)UINT_MAX), &v);
      if (st == RMMC_SUCCESS) *(unsigned *)(void *)at = (unsigned)v;
      break;
    }
    if (st != RMMC_SUCCESS) return st;
  }
  return RMMC_SUCCESS;
}
