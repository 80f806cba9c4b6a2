/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers the command-line programs share (rmmc-bench, rmmc-replay and
 * rmmc-stress): usage errors that name the program, unknown options and
 * --version said the same way by each, whole numbers and
 * sizes checked with their flag in the message, JSON strings, and sizes
 * written in their largest exact unit. Header-only; every function is
 * static, so a program pays for what it calls. The program sets
 * cli_program (its name) before the first usage error.
 */
#ifndef RMMC_TOOLS_CLI_H
#define RMMC_TOOLS_CLI_H

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"

/* The exit status of a bad command line. */
#define CLI_EXIT_USAGE 2

static const char *cli_program = "rmmc";

/* "PROG: what\n(PROG --help lists the options)" on stderr; returns
 * CLI_EXIT_USAGE. */
static int cli_usage_error(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2), unused))
#endif
    ;

static int cli_usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", cli_program);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(%s --help lists the options)\n", cli_program);
  return CLI_EXIT_USAGE;
}

/* The message for what getopt_long returned '?' or ':' for (opterr = 0
 * and an optstring starting with ':'): the option as the user wrote it,
 * from optopt for a short option and from argv for a long one. Every
 * tool's unknown or incomplete option reads the same way. */
static int cli_bad_option(int c, char **argv)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((unused))
#endif
    ;

static int cli_bad_option(int c, char **argv) {
  char what[64];
  const char *arg = argv[optind - 1];
  if (strncmp(arg, "--", 2) == 0)
    snprintf(what, sizeof what, "%.*s", (int)strcspn(arg, "="), arg);
  else
    snprintf(what, sizeof what, "-%c", optopt);
  if (c == ':') return cli_usage_error("%s needs a value", what);
  return cli_usage_error("unknown option '%s'", what);
}

/* "PROG 0.2.0" on stdout: the library's version at run time, and the
 * headers' where they differ (a program run against another librmmc than
 * it was built with). Returns 0, the exit status of --version. */
static int cli_print_version(void)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((unused))
#endif
    ;

static int cli_print_version(void) {
  printf("%s %s", cli_program, rmmc_version_string());
  if (rmmc_version() != RMMC_VERSION) printf(" (built with rmmc %s headers)", RMMC_VERSION_STRING);
  printf("\n");
  return 0;
}

/* A whole number from lo to hi for `flag`; false after a usage error. */
static inline bool cli_parse_count(const char *flag, const char *text, unsigned long long lo,
                                   unsigned long long hi, unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (!isdigit((unsigned char)text[0]) || *end != '\0' || errno != 0 || v < lo || v > hi) {
    cli_usage_error("%s wants a whole number from %llu to %llu, not '%s'", flag, lo, hi, text);
    return false;
  }
  *out = v;
  return true;
}

/* A size ("4MiB") for `flag`, refused if 0 unless allow_zero; false after a
 * usage error. */
static inline bool cli_parse_bytes(const char *flag, const char *text, bool allow_zero,
                                   size_t *out) {
  if (rmmc_parse_size(text, out) != RMMC_SUCCESS) {
    cli_usage_error("%s: %s", flag, rmmc_last_error_message());
    return false;
  }
  if (*out == 0 && !allow_zero) {
    cli_usage_error("%s: a size of 0 bytes allocates nothing", flag);
    return false;
  }
  return true;
}

/* The version of the JSON the tools write (--json): every record of
 * rmmc-bench and rmmc-replay, and rmmc-stress's object, carry it as
 * "schema_version". Raised when a field changes meaning or goes away;
 * adding a field keeps it. */
#define CLI_JSON_SCHEMA_VERSION 1

/* s as a JSON string, quotes and escapes included. */
static inline void cli_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* "4MiB", "1000B": the largest unit that divides the size exactly. */
static inline void cli_format_size(size_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, u++;
  snprintf(buf, len, "%zu%s", bytes, units[u]);
}

#endif /* RMMC_TOOLS_CLI_H */
