/*
 * The process default: what the registry builds for a device on first use.
 *
 * The environment (RMMC_ALLOC_CONF, RMMC_NO_CACHING; see defaults.h) is
 * read once and turned into one spec by rmmc_default_config_resolve(), a
 * pure function the tests call directly. A problem never stops the
 * process: it is printed once on stderr, kept for
 * rmmc_default_config_status(), and the plain cuda resource is used.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"
#include "rmmc/cuda_resource.h"
#include "rmmc/defaults.h"
#include "rmmc/spec.h"

#define SPEC_MAX 4097 /* the parser takes at most 4096 characters */
#define MESSAGE_MAX 1536

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static char config_spec[SPEC_MAX];        /* written once, in read_environment */
static rmmc_status_t config_status;       /* the first problem; under config_lock */
static char config_message[MESSAGE_MAX];  /* complete before config_status is set */

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
  rmmc_status_t st = rmmc_stack_validate(alloc_conf);
  if (st != RMMC_SUCCESS) {
    char why[MESSAGE_MAX - 64];
    snprintf(why, sizeof why, "%s", rmmc_last_error_message());
    return rmmc_set_error(st, "RMMC_ALLOC_CONF is not a valid stack spec: %s", why);
  }
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
  rmmc_status_t st = rmmc_default_config_resolve(getenv("RMMC_ALLOC_CONF"),
                                                 getenv("RMMC_NO_CACHING"), config_spec,
                                                 sizeof config_spec);
  if (st == RMMC_SUCCESS) return;
  const char *why = rmmc_last_error_message();
  fprintf(stderr, "rmmc: %s\nrmmc: every device uses the plain cuda resource instead\n", why);
  record_problem(st, why);
}

RMMC_API rmmc_status_t rmmc_default_config_status(const char **spec, const char **message) {
  pthread_once(&env_once, read_environment);
  pthread_mutex_lock(&config_lock);
  rmmc_status_t st = config_status;
  pthread_mutex_unlock(&config_lock);
  if (spec != NULL) *spec = config_spec;
  if (message != NULL) *message = st == RMMC_SUCCESS ? "" : config_message;
  return st;
}

rmmc_status_t rmmc__create_default_resource(int device, rmmc_resource_t **out) {
  pthread_once(&env_once, read_environment);
  rmmc_status_t st = rmmc_stack_create(config_spec, device, out);
  if (st == RMMC_SUCCESS || strcmp(config_spec, RMMC_DEFAULT_SPEC) == 0) return st;
  char why[MESSAGE_MAX];
  snprintf(why, sizeof why, "RMMC_ALLOC_CONF could not be built for device %d: %s", device,
           rmmc_last_error_message());
  fprintf(stderr, "rmmc: %s\nrmmc: device %d uses the plain cuda resource instead\n", why, device);
  record_problem(st, why);
  return rmmc_cuda_resource_create(device, out);
}
