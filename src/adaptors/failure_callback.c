/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failure-callback adaptor: on out of memory from the upstream, ask a
 * callback (or release the upstream's cache) and retry while it says so.
 *
 * The common path is one upstream call and one compare. The retry loop
 * saves the thread's error state before each callback, so that when the
 * callback declines, the upstream's own out-of-memory message comes back
 * rather than whatever the callback's own work left behind.
 */
#include <limits.h>
#include <stdlib.h>

#include "base/spec.h"
#include "rmmc/failure_callback_adaptor.h"

typedef struct failure_adaptor {
  rmmc__adaptor_t a;
  rmmc_failure_cb cb; /* NULL: the built-in release_cached behaviour */
  void *user;
  unsigned retries;   /* built-in only: retries per allocation */
  uint64_t callbacks, recovered, gave_up; /* atomic */
} failure_adaptor_t;

/* Asks whether to retry after `attempt` retries have failed. */
static bool should_retry(failure_adaptor_t *f, size_t bytes, unsigned attempt) {
  rmmc__atomic_add_u64(&f->callbacks, 1);
  if (f->cb != NULL) return f->cb(bytes, f->user);
  return attempt < f->retries && rmmc_resource_release_cached(f->a.upstream) == RMMC_SUCCESS;
}

static rmmc_status_t retry_after_oom(failure_adaptor_t *f, size_t bytes, size_t alignment,
                                     cudaStream_t stream, void **out) {
  rmmc__error_state_t failure;
  unsigned attempt = 0;
  for (;; attempt++) {
    rmmc__error_save(&failure);
    if (!should_retry(f, bytes, attempt)) break;
    rmmc_status_t st = rmmc_resource_allocate(f->a.upstream, bytes, alignment, stream, out);
    if (st != RMMC_ERROR_OUT_OF_MEMORY) {
      if (st == RMMC_SUCCESS) rmmc__atomic_add_u64(&f->recovered, 1);
      return st;
    }
  }
  rmmc__atomic_add_u64(&f->gave_up, 1);
  rmmc__error_restore(&failure);
  rmmc__append_error("; failure_callback gave up after %u %s", attempt,
                     attempt == 1 ? "retry" : "retries");
  return RMMC_ERROR_OUT_OF_MEMORY;
}

static rmmc_status_t failure_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out) {
  failure_adaptor_t *f = (failure_adaptor_t *)r;
  rmmc_status_t st = rmmc_resource_allocate(f->a.upstream, bytes, alignment, stream, out);
  if (RMMC_LIKELY(st != RMMC_ERROR_OUT_OF_MEMORY)) return st;
  return retry_after_oom(f, bytes, alignment, stream, out);
}

static void failure_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  failure_adaptor_t *f = (failure_adaptor_t *)r;
  struct {
    RMMC_FAILURE_CALLBACK_FIGURES(RMMC__FIGURE_VALUE)
  } v = {f->cb != NULL ? "user callback" : "release_cached", f->cb == NULL ? f->retries : 0,
         rmmc__atomic_load_u64(&f->callbacks), rmmc__atomic_load_u64(&f->recovered),
         rmmc__atomic_load_u64(&f->gave_up)};
  RMMC_FAILURE_CALLBACK_FIGURES(RMMC__FIGURE_EMIT)
}

static const rmmc_resource_ops_t failure_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "failure_callback",
    .allocate = failure_allocate,
    .deallocate = rmmc__adaptor_forward_deallocate,
    .describe = failure_describe,
    .destroy = rmmc__adaptor_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

static rmmc_status_t create(const char *what, rmmc_resource_t *upstream, rmmc_failure_cb cb,
                            void *user, unsigned retries, rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__adaptor_new(what, &failure_ops, upstream, sizeof(failure_adaptor_t), out);
  if (st != RMMC_SUCCESS) return st;
  failure_adaptor_t *f = (failure_adaptor_t *)*out;
  f->cb = cb;
  f->user = user;
  f->retries = retries;
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_failure_callback_adaptor_create(rmmc_resource_t *upstream,
                                                            rmmc_failure_cb cb, void *user_data,
                                                            rmmc_resource_t **out) {
  static const char what[] = "failure_callback_adaptor_create";
  if (cb == NULL) {
    rmmc_status_t st = rmmc__check_create(what, upstream, out);
    if (st != RMMC_SUCCESS) return st;
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: callback is NULL (for the built-in behaviour use "
                          "rmmc_failure_callback_adaptor_create_release_cached)",
                          what);
  }
  return create(what, upstream, cb, user_data, 0, out);
}

RMMC_API rmmc_status_t rmmc_failure_callback_adaptor_create_release_cached(
    rmmc_resource_t *upstream, int retries, rmmc_resource_t **out) {
  static const char what[] = "failure_callback_adaptor_create_release_cached";
  if (retries < 1) {
    rmmc_status_t st = rmmc__check_create(what, upstream, out);
    if (st != RMMC_SUCCESS) return st;
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: retries=%d, must be at least 1", what,
                          retries);
  }
  return create(what, upstream, NULL, NULL, (unsigned)retries, out);
}

static const rmmc__spec_option_t failure_spec_options[] = {
    {.name = "retries", .type = RMMC__OPT_INT, .help = "retries per allocation, each after release_cached (default 1)"},
    {.name = NULL},
};

static rmmc_status_t failure_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                   int device, rmmc_resource_t **out) {
  (void)device;
  long long retries = 1;
  rmmc_status_t st = rmmc__spec_int_in(args, "retries", 1, INT_MAX, &retries);
  return st == RMMC_SUCCESS
             ? rmmc_failure_callback_adaptor_create_release_cached(upstream, (int)retries, out)
             : st;
}

const rmmc__spec_entry_t rmmc__failure_callback_spec = {
    .name = "failure_callback",
    .help = "on out of memory, release the upstream's cached memory and retry",
    .needs_upstream = true,
    .options = failure_spec_options,
    .build = failure_build,
};
