/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The thread-safe adaptor: a mutex around every upstream call. A trylock
 * first lets it count contention at no cost to the uncontended path.
 *
 * The shortest adaptor, and the template for new ones. Calling the upstream
 * follows one rule (src/base/upstream.h, "THE RULE"): an adaptor that
 * caches nothing passes its slot's call on with rmmc__forward_allocate, or
 * with rmmc_resource_allocate as here, which checks the arguments again and
 * has the same outcome; it must use rmmc_resource_allocate for a request
 * with arguments of its own (aligned). On out of memory both apply the
 * out-of-memory rule to the upstream (a caching upstream gives back what it
 * caches and the request is retried once). A layer that caches memory calls
 * its upstream with rmmc__upstream_allocate instead, which leaves the rule
 * to the layer's own caller.
 */
#include <stdlib.h>

#include "base/spec.h"
#include "rmmc/thread_safe_adaptor.h"

typedef struct thread_safe_adaptor {
  rmmc__adaptor_t a;
  pthread_mutex_t lock;
  uint64_t contended; /* atomic */
} thread_safe_adaptor_t;

static void lock(thread_safe_adaptor_t *t) {
  if (RMMC_LIKELY(pthread_mutex_trylock(&t->lock) == 0)) return;
  rmmc__atomic_add_u64(&t->contended, 1);
  pthread_mutex_lock(&t->lock);
}

static rmmc_status_t ts_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                 cudaStream_t stream, void **out) {
  thread_safe_adaptor_t *t = (thread_safe_adaptor_t *)r;
  lock(t);
  rmmc_status_t st = rmmc_resource_allocate(t->a.upstream, bytes, alignment, stream, out);
  pthread_mutex_unlock(&t->lock);
  return st;
}

static rmmc_status_t ts_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t alignment,
                                   cudaStream_t stream) {
  thread_safe_adaptor_t *t = (thread_safe_adaptor_t *)r;
  lock(t);
  rmmc_status_t st = rmmc_resource_deallocate(t->a.upstream, ptr, bytes, alignment, stream);
  pthread_mutex_unlock(&t->lock);
  return st;
}

static rmmc_status_t ts_release_cached(rmmc_resource_t *r) {
  thread_safe_adaptor_t *t = (thread_safe_adaptor_t *)r;
  lock(t);
  rmmc_status_t st = rmmc_resource_release_cached(t->a.upstream);
  pthread_mutex_unlock(&t->lock);
  return st;
}

static void ts_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  thread_safe_adaptor_t *t = (thread_safe_adaptor_t *)r;
  rmmc__emit_count(emit, ctx, "contended", rmmc__atomic_load_u64(&t->contended));
}

static void ts_destroy(rmmc_resource_t *r) {
  pthread_mutex_destroy(&((thread_safe_adaptor_t *)r)->lock);
  rmmc__adaptor_destroy(r);
}

static const rmmc_resource_ops_t ts_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "thread_safe",
    .allocate = ts_allocate,
    .deallocate = ts_deallocate,
    .release_cached = ts_release_cached,
    .describe = ts_describe,
    .destroy = ts_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

RMMC_API rmmc_status_t rmmc_thread_safe_adaptor_create(rmmc_resource_t *upstream,
                                                       rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__adaptor_new("thread_safe_adaptor_create", &ts_ops, upstream,
                                       sizeof(thread_safe_adaptor_t), out);
  if (st != RMMC_SUCCESS) return st;
  pthread_mutex_init(&((thread_safe_adaptor_t *)*out)->lock, NULL);
  return RMMC_SUCCESS;
}

static rmmc_status_t ts_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                              int device, rmmc_resource_t **out) {
  (void)args, (void)device;
  return rmmc_thread_safe_adaptor_create(upstream, out);
}

const rmmc__spec_entry_t rmmc__thread_safe_spec = {
    .name = "thread_safe",
    .help = "a mutex around every call to the upstream (for resources that are not thread-safe)",
    .needs_upstream = true,
    .build = ts_build,
};
