/*
 * The stack-spec option values, for the resources' build functions: the
 * accessors (rmmc__spec_int, _double, _bool, _string, _bytes) and the size
 * syntax (rmmc__parse_bytes).
 *
 * Apart from the parser (spec.c) and its table of every resource
 * (spec_table.c) on purpose: each resource's build function reads its
 * options here, and the parser's table links every resource, so a resource
 * that called into spec.c would pull the parser and through it the whole
 * library into any program that uses it. This file calls only the device
 * helpers (a percentage of a device's free memory) and status.c.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/registry.h"
#include "spec.h"

rmmc_status_t rmmc__parse_bytes(const char *text, size_t len, size_t *out) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) return RMMC_ERROR_PARSE;
  memcpy(buf, text, len);
  buf[len] = '\0';
  char *end;
  double v = strtod(buf, &end);
  if (end == buf || !(v >= 0) || !isdigit((unsigned char)buf[0])) return RMMC_ERROR_PARSE;
  while (*end == ' ' || *end == '\t') end++; /* "64 MiB" */
  /* Binary units only: KB, MB, GB, TB mean 1000^n to some and 1024^n to
   * others, so they are refused (rmmc__size_unit_hint says what to write). */
  static const struct {
    const char *suffix;
    double mult;
  } units[] = {{"", 1},          {"B", 1},
               {"K", 1024.0},    {"KiB", 1024.0},
               {"M", 1048576.0}, {"MiB", 1048576.0},
               {"G", 1073741824.0}, {"GiB", 1073741824.0},
               {"T", 1099511627776.0}, {"TiB", 1099511627776.0}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) == 0) {
      double bytes = v * units[i].mult;
      if (bytes >= 18446744073709551615.0 || bytes != floor(bytes)) return RMMC_ERROR_PARSE;
      *out = (size_t)bytes;
      return RMMC_SUCCESS;
    }
  }
  return RMMC_ERROR_PARSE;
}

const rmmc__spec_value_t *rmmc__spec_find(const rmmc__spec_args_t *args, const char *name) {
  for (int i = 0; i < args->count; i++)
    if (strcmp(args->values[i].option->name, name) == 0) return &args->values[i];
  return NULL;
}

bool rmmc__spec_int(const rmmc__spec_args_t *args, const char *name, long long *out) {
  const rmmc__spec_value_t *v = rmmc__spec_find(args, name);
  if (v != NULL) *out = (long long)v->number;
  return v != NULL;
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
    *out = (size_t)v->number;
    return RMMC_SUCCESS;
  }
  if (upstream != NULL && upstream->kind == RMMC_MEMORY_DEVICE)
    return rmmc_percent_of_free_device_memory(upstream->device, v->number, out);
  size_t total = rmmc__host_memory_total();
  if (total == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "%s: %s=%g%%: host memory size unknown",
                          args->layer, name, v->number);
  *out = (size_t)((double)total * v->number / 100.0) & ~(RMMC_DEFAULT_ALIGNMENT - 1);
  return RMMC_SUCCESS;
}
