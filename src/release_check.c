/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RMMC_CHECK_RELEASE=1: say on stderr when the last reference to a
 * resource that still has blocks out is released.
 *
 * Releasing a stack frees what it holds, the blocks handed out included,
 * under whoever still uses them: a use-after-free the program did not ask
 * for, and the usual cause a leak checker shows nothing. rmmc never prints
 * unless asked (the library's rule), so the check is off unless the
 * environment asks, read once. In a cascade (releasing a stack destroys
 * each layer), the outermost layer with live blocks is reported, not the
 * layers under it (their figures count the same blocks again); a layer
 * that reports neither "outstanding" nor "in_use" (cuda, host) is never
 * reported.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "release_check.h"

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool enabled;
static _Thread_local int depth;    /* releases in progress on this thread (a cascade) */
static _Thread_local int reported; /* the depth whose layer was reported, or 0 */

static void read_env(void) {
  const char *v = getenv("RMMC_CHECK_RELEASE");
  enabled = v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0 ||
                          strcmp(v, "yes") == 0 || strcmp(v, "on") == 0);
}

bool rmmc__release_check_begin(rmmc_resource_t *r) {
  pthread_once(&env_once, read_env);
  if (!enabled) return false;
  depth++;
  if (reported != 0) return true; /* an outer layer said it for these blocks */
  uint64_t count = 0, bytes = 0;
  bool has_count = rmmc_resource_get_field(r, "outstanding", &count);
  bool has_bytes = rmmc_resource_get_field(r, "in_use", &bytes);
  if ((has_count && count > 0) || (has_bytes && bytes > 0)) {
    char b[32], what[96] = "";
    if (has_count) snprintf(what, sizeof what, "%llu block%s", (unsigned long long)count, count == 1 ? "" : "s");
    if (has_bytes)
      snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s", has_count ? ", " : "",
               rmmc__format_bytes(bytes, b, sizeof b));
    fprintf(stderr,
            "rmmc: releasing the last reference to a %s resource with %s still allocated through "
            "it: they are freed with it (RMMC_CHECK_RELEASE)\n",
            rmmc_resource_name(r), what);
    reported = depth;
  }
  return true;
}

void rmmc__release_check_end(bool begun) {
  if (!begun) return;
  if (reported == depth) reported = 0;
  depth--;
}
