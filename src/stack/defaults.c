/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process default: what the registry builds for a device on first use.
 *
 * The environment (RMMC_ALLOC_CONF, RMMC_NO_CACHING,
 * RMMC_ALLOC_CONF_FALLBACK; see defaults.h) is read once and turned into
 * one spec by rmmc_default_config_resolve(), a pure function the tests call
 * directly; rmmc_set_default_spec() replaces it from code. A problem is
 * printed once on stderr and kept for rmmc_default_config_status(). By
 * default it then fails every lookup that would build a default (strict);
 * with RMMC_ALLOC_CONF_FALLBACK=1 the plain cuda resource is used instead.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/config.h"
#include "base/internal.h"
#include "rmmc/cuda_resource.h"
#include "rmmc/defaults.h"
#include "rmmc/spec.h"

#define SPEC_MAX 4097 /* the parser takes at most 4096 characters */
#define MESSAGE_MAX 1536

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static char config_spec[SPEC_MAX];        /* under config_lock after read_environment */
static rmmc_status_t config_status;       /* the first problem; under config_lock */
static char config_message[MESSAGE_MAX];  /* complete before config_status is set */
static bool config_fallback;              /* RMMC_ALLOC_CONF_FALLBACK: written once */
static bool config_no_caching;            /* RMMC_NO_CACHING: written once */

static bool is_blank(const char *s) {
  while (isspace((unsigned char)*s)) s++;
  return *s == '\0';
}

/* 1 for on, 0 for off (or blank), -1 for anything else. */
static int parse_switch(const char *v) {
  static const char *const on[] = {"1", "true", "yes", "on"};
  static const char *const off[] = {"0", "false", "no", "off"};
  if (is_blank(v)) return 0;
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(v, on[i]) == 0) return 1;
    if (strcasecmp(v, off[i]) == 0) return 0;
  }
  return -1;
}

/* rmmc_stack_validate() with PyTorch's syntax recognised: the parser's
 * message, then what the rmmc spelling is. `what` names the value. */
static rmmc_status_t validate_spec(const char *what, const char *spec) {
  rmmc_status_t st = rmmc_stack_validate(spec);
  if (st == RMMC_SUCCESS) return st;
  char why[MESSAGE_MAX - 64], hint[640];
  snprintf(why, sizeof why, "%s", rmmc_last_error_message());
  if (rmmc__torch_conf_hint(spec, hint, sizeof hint))
    return rmmc_set_error(st, "%s is not a valid stack spec: %s\n  (%s)", what, why, hint);
  return rmmc_set_error(st, "%s is not a valid stack spec: %s", what, why);
}

/* ---- one spec, or one per device ----
 *
 * A configuration is a stack spec for every device, or items separated by
 * ';', each `DEVICES: SPEC` where DEVICES is '*' or a list of device
 * numbers and ranges (`0`, `0,2`, `1-3`); an item without a device list
 * serves every device no other item names, as '*' does (at most one such
 * item). No spec contains ';' or starts with a digit or '*' (names are
 * words), so the two forms cannot be confused. */

#define ITEMS_MAX (RMMC_MAX_DEVICES + 1)

typedef struct conf_item {
  const char *spec; /* inside the value, not terminated: len bytes */
  size_t len;
  const char *list; /* its device list, sel bytes (0: none) */
  size_t sel;
  uint64_t devices; /* bit d: device d; 0 with all */
  bool all;
} conf_item_t;

static const char *skip_blank(const char *s) {
  while (isspace((unsigned char)*s)) s++;
  return s;
}

/* Parses the device list at the start of an item (`0,2-3:` or `*:`). */
static rmmc_status_t parse_devices(const char *what, const char *item, size_t len,
                                   conf_item_t *out, size_t *used) {
  const char *p = item, *end = item + len;
  p = skip_blank(p);
  if (*p == '*') {
    out->all = true;
    p = skip_blank(p + 1);
  } else {
    for (;;) {
      char *e;
      long lo = strtol(p, &e, 10), hi = lo;
      if (e == p || lo < 0) break;
      p = skip_blank(e);
      if (*p == '-') {
        p = skip_blank(p + 1);
        hi = strtol(p, &e, 10);
        if (e == p || hi < lo)
          return rmmc_set_error(RMMC_ERROR_PARSE,
                                "%s: '%.*s': a device range is LOW-HIGH with LOW <= HIGH", what,
                                (int)len, item);
        p = skip_blank(e);
      }
      if (hi >= RMMC_MAX_DEVICES)
        return rmmc_set_error(RMMC_ERROR_PARSE,
                              "%s: '%.*s': device %ld is past the last one rmmc tracks (%d)",
                              what, (int)len, item, hi, RMMC_MAX_DEVICES - 1);
      for (long d = lo; d <= hi; d++) {
        if (out->devices & (UINT64_C(1) << d))
          return rmmc_set_error(RMMC_ERROR_PARSE, "%s: '%.*s' names device %ld twice", what,
                                (int)len, item, d);
        out->devices |= UINT64_C(1) << d;
      }
      if (*p != ',') break;
      p = skip_blank(p + 1);
    }
  }
  if (p >= end || *p != ':' || (!out->all && out->devices == 0))
    return rmmc_set_error(RMMC_ERROR_PARSE,
                          "%s: '%.*s': an item starting with a device list is `DEVICES: SPEC` "
                          "(devices as 0, 0,2 or 1-3, or *), e.g. `0: pool > cuda; 1: cuda`",
                          what, (int)len, item);
  *used = (size_t)(p + 1 - item);
  return RMMC_SUCCESS;
}

/* Splits `value` into items (at ';' outside parentheses and quotes) and
 * checks each: device lists, and every spec through the parser. */
static rmmc_status_t split_config(const char *what, const char *value, conf_item_t *items,
                                  int *nitems) {
  *nitems = 0;
  int depth = 0, all = -1;
  bool quoted = false;
  const char *start = value;
  for (const char *p = value;; p++) {
    if (*p == '"') quoted = !quoted;
    else if (!quoted && *p == '(') depth++;
    else if (!quoted && *p == ')' && depth > 0) depth--;
    if (*p != '\0' && (*p != ';' || depth > 0 || quoted)) continue;
    size_t len = (size_t)(p - start);
    const char *item = skip_blank(start);
    len -= (size_t)(item - start);
    start = p + 1;
    while (len > 0 && isspace((unsigned char)item[len - 1])) len--;
    if (len > 0) {
      if (*nitems == ITEMS_MAX)
        return rmmc_set_error(RMMC_ERROR_PARSE, "%s has more than %d items", what, ITEMS_MAX);
      conf_item_t *it = &items[(*nitems)++];
      *it = (conf_item_t){item, len, item, 0, 0, false};
      if (isdigit((unsigned char)*item) || *item == '*') {
        size_t used = 0;
        rmmc_status_t st = parse_devices(what, item, len, it, &used);
        if (st != RMMC_SUCCESS) return st;
        it->sel = used - 1;
        while (it->sel > 0 && isspace((unsigned char)item[it->sel - 1])) it->sel--;
        it->spec = skip_blank(item + used);
        it->len = len - (size_t)(it->spec - item);
        if (it->len == 0)
          return rmmc_set_error(RMMC_ERROR_PARSE, "%s: '%.*s' has no spec after ':'", what,
                                (int)len, item);
      } else {
        it->all = true;
      }
      if (it->all) {
        if (all >= 0)
          return rmmc_set_error(RMMC_ERROR_PARSE,
                                "%s has two items for every device ('%.*s' and '%.*s'): give "
                                "one spec without a device list (or '*'), the others with "
                                "theirs",
                                what, (int)items[all].len, items[all].spec, (int)it->len,
                                it->spec);
        all = *nitems - 1;
      }
      for (int i = 0; i < *nitems - 1; i++)
        if (items[i].devices & it->devices)
          return rmmc_set_error(RMMC_ERROR_PARSE, "%s names device %d in two items ('%.*s' and "
                                "'%.*s')",
                                what, __builtin_ctzll(items[i].devices & it->devices),
                                (int)items[i].sel, items[i].list, (int)it->sel, it->list);
    }
    if (*p == '\0') break;
  }
  bool one = *nitems == 1 && items[0].all && items[0].spec == skip_blank(value);
  for (int i = 0; i < *nitems; i++) {
    char spec[SPEC_MAX], name[96];
    snprintf(spec, sizeof spec, "%.*s", (int)items[i].len, items[i].spec);
    if (one)
      snprintf(name, sizeof name, "%s", what);
    else if (items[i].sel == 0)
      snprintf(name, sizeof name, "%s (the item for every other device)", what);
    else
      snprintf(name, sizeof name, "%s (item `%.*s:`)", what, (int)items[i].sel, items[i].list);
    rmmc_status_t st = validate_spec(name, spec);
    if (st != RMMC_SUCCESS) return st;
  }
  return RMMC_SUCCESS;
}

static rmmc_status_t validate_with_hint(const char *what, const char *value) {
  conf_item_t items[ITEMS_MAX];
  int n;
  rmmc_status_t st = split_config(what, value, items, &n);
  if (st == RMMC_SUCCESS && n == 0) st = validate_spec(what, value); /* the parser's message */
  return st;
}

RMMC_API rmmc_status_t rmmc_default_config_device_spec(const char *config, int device, char *spec,
                                                       size_t len) {
  if (config == NULL || spec == NULL || len == 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "default_config_device_spec: NULL configuration or spec buffer");
  spec[0] = '\0';
  if (device < 0 || device >= RMMC_MAX_DEVICES)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "default_config_device_spec: device %d is out of range [0, %d)", device,
                          RMMC_MAX_DEVICES);
  conf_item_t items[ITEMS_MAX];
  int n;
  rmmc_status_t st = is_blank(config) ? (n = 0, RMMC_SUCCESS)
                                      : split_config("the configuration", config, items, &n);
  if (st != RMMC_SUCCESS) return st;
  const conf_item_t *pick = NULL;
  for (int i = 0; i < n; i++)
    if (items[i].all && pick == NULL) pick = &items[i];
  for (int i = 0; i < n; i++)
    if (items[i].devices & (UINT64_C(1) << device)) pick = &items[i];
  const char *s = pick != NULL ? pick->spec : RMMC_DEFAULT_SPEC;
  size_t l = pick != NULL ? pick->len : strlen(RMMC_DEFAULT_SPEC);
  if (l >= len)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "default_config_device_spec: device %d's spec needs %zu bytes, the "
                          "buffer has %zu",
                          device, l + 1, len);
  memcpy(spec, s, l);
  spec[l] = '\0';
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_default_config_resolve(const char *alloc_conf, const char *no_caching,
                                                   char *spec, size_t len) {
  if (spec == NULL || len < sizeof RMMC_DEFAULT_SPEC)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "default_config_resolve: the spec buffer is NULL or too small");
  snprintf(spec, len, "%s", RMMC_DEFAULT_SPEC);
  int off_switch = no_caching == NULL ? 0 : parse_switch(no_caching);
  if (off_switch < 0)
    return rmmc_set_error(RMMC_ERROR_PARSE,
                          "RMMC_NO_CACHING=\"%s\" is not a switch: write 1 to turn caching off "
                          "or 0 to leave it on",
                          no_caching);
  if (off_switch == 1 || alloc_conf == NULL || is_blank(alloc_conf)) return RMMC_SUCCESS;
  rmmc_status_t st = validate_with_hint("RMMC_ALLOC_CONF", alloc_conf);
  if (st != RMMC_SUCCESS) return st;
  if (strlen(alloc_conf) >= len)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "default_config_resolve: RMMC_ALLOC_CONF needs %zu bytes, the buffer "
                          "has %zu",
                          strlen(alloc_conf) + 1, len);
  snprintf(spec, len, "%s", alloc_conf);
  return RMMC_SUCCESS;
}

/* Keeps the first problem for rmmc_default_config_status(). */
static void record_problem(rmmc_status_t st, const char *message) {
  pthread_mutex_lock(&config_lock);
  if (config_status == RMMC_SUCCESS) {
    snprintf(config_message, sizeof config_message, "%s", message);
    config_status = st;
  }
  pthread_mutex_unlock(&config_lock);
}

static void read_environment(void) {
  const char *fallback = getenv("RMMC_ALLOC_CONF_FALLBACK");
  int on = fallback == NULL ? 0 : parse_switch(fallback);
  config_fallback = on == 1;
  const char *no_caching = getenv("RMMC_NO_CACHING");
  config_no_caching = no_caching != NULL && parse_switch(no_caching) == 1;
  char spec[SPEC_MAX];
  rmmc_status_t st = on < 0 ? rmmc_set_error(RMMC_ERROR_PARSE,
                                             "RMMC_ALLOC_CONF_FALLBACK=\"%s\" is not a switch: "
                                             "write 1 to fall back to cuda on a bad "
                                             "RMMC_ALLOC_CONF, or 0",
                                             fallback)
                            : rmmc_default_config_resolve(getenv("RMMC_ALLOC_CONF"), no_caching,
                                                          spec, sizeof spec);
  pthread_mutex_lock(&config_lock);
  snprintf(config_spec, sizeof config_spec, "%s", st == RMMC_SUCCESS ? spec : RMMC_DEFAULT_SPEC);
  pthread_mutex_unlock(&config_lock);
  if (st == RMMC_SUCCESS) return;
  const char *why = rmmc_last_error_message();
  fprintf(stderr, "rmmc: %s\n%s\n", why,
          config_fallback ? "rmmc: every device uses the plain cuda resource instead "
                            "(RMMC_ALLOC_CONF_FALLBACK=1)"
                          : "rmmc: allocations through the registry fail with this error until "
                            "it is fixed (RMMC_ALLOC_CONF_FALLBACK=1 uses the plain cuda resource "
                            "instead)");
  record_problem(st, why);
}

RMMC_API rmmc_status_t rmmc_default_config_status(const char **spec, const char **message) {
  pthread_once(&env_once, read_environment);
  pthread_mutex_lock(&config_lock);
  rmmc_status_t st = config_status;
  pthread_mutex_unlock(&config_lock);
  /* config_spec changes only through rmmc_set_default_spec(), which
   * documents that strings returned before are then stale. */
  if (spec != NULL) *spec = config_spec;
  if (message != NULL) *message = st == RMMC_SUCCESS ? "" : config_message;
  return st;
}

rmmc_status_t rmmc__default_config_check(void) {
  pthread_once(&env_once, read_environment);
  if (config_fallback) return RMMC_SUCCESS;
  pthread_mutex_lock(&config_lock);
  rmmc_status_t st = config_status;
  char message[MESSAGE_MAX];
  if (st != RMMC_SUCCESS) snprintf(message, sizeof message, "%s", config_message);
  pthread_mutex_unlock(&config_lock);
  return st == RMMC_SUCCESS ? st : rmmc_set_error(st, "%s", message);
}

RMMC_API rmmc_status_t rmmc_set_default_spec(const char *spec) {
  if (spec == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "set_default_spec: spec is NULL");
  pthread_once(&env_once, read_environment);
  rmmc_status_t st = validate_with_hint("set_default_spec", spec);
  if (st != RMMC_SUCCESS) return st;
  if (strlen(spec) >= SPEC_MAX)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "set_default_spec: longer than %d characters",
                          SPEC_MAX - 1);
  pthread_mutex_lock(&config_lock);
  snprintf(config_spec, sizeof config_spec, "%s", config_no_caching ? RMMC_DEFAULT_SPEC : spec);
  config_status = RMMC_SUCCESS; /* the program, not the environment, is in charge now */
  config_message[0] = '\0';
  pthread_mutex_unlock(&config_lock);
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__create_default_resource(int device, rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__default_config_check();
  if (st != RMMC_SUCCESS) return st;
  char config[SPEC_MAX], spec[SPEC_MAX];
  pthread_mutex_lock(&config_lock);
  snprintf(config, sizeof config, "%s", config_spec);
  pthread_mutex_unlock(&config_lock);
  st = rmmc_default_config_device_spec(config, device, spec, sizeof spec);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc_stack_create(spec, device, out);
  if (st == RMMC_SUCCESS || strcmp(spec, RMMC_DEFAULT_SPEC) == 0) return st;
  char why[MESSAGE_MAX];
  snprintf(why, sizeof why, "the default stack \"%.256s\" could not be built for device %d: %s", spec,
           device, rmmc_last_error_message());
  if (!config_fallback) {
    /* Strict: this lookup fails, and the next one tries again. */
    return rmmc_set_error(st, "%s (RMMC_ALLOC_CONF_FALLBACK=1 uses the plain cuda resource "
                              "instead)",
                          why);
  }
  fprintf(stderr, "rmmc: %s\nrmmc: device %d uses the plain cuda resource instead\n", why, device);
  record_problem(st, why);
  return rmmc_cuda_resource_create(device, out);
}
