/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Calling an upstream: the thread's call depth, the out-of-memory rule, and
 * the three verbs a layer calls the allocate of the resource below it with.
 *
 * THE RULE (which verb, when, and what it does on out of memory):
 *
 *   1. rmmc__forward_allocate(&a, bytes, alignment, stream, out): an
 *      adaptor that passes the call its own allocate slot got, with the
 *      same arguments, to its upstream (logging, tracking, limiting,
 *      statistics). It goes straight through the upstream's slot: the
 *      outermost public wrapper has validated the arguments already.
 *   2. rmmc_resource_allocate(up, ...): a request the layer makes itself,
 *      with arguments it computed (aligned's enlarged size and the default
 *      alignment), or any call on a resource that is not its upstream. It
 *      validates them as for any caller. An adaptor that passes its own
 *      arguments on may use it too (thread_safe, failure_callback,
 *      prefetch do): the outcome is the same as verb 1, at the cost of
 *      checking again what the wrapper checked (a few compares).
 *   3. rmmc__upstream_allocate(up, ...): a layer that caches memory (pool,
 *      binning, fixed_size; arena grows through the pool's code) calling its upstream or
 *      its own parts (binning's bins). It is verb 2 with the out-of-memory
 *      rule switched off for the call.
 *
 *   On out of memory, verbs 1 and 2 apply the out-of-memory rule to the
 *   upstream they called, unless a caching layer above has switched it
 *   off (RMMC__NO_RETRY): if that upstream caches memory (figure "cached",
 *   or "reserved" above "in_use"), its stack gives back what it caches and
 *   the request is retried once; *out is NULL after any failure. Verb 3
 *   returns the upstream's out of memory unchanged: the caching layer
 *   tries its own fallbacks first (flushing the upstream's cache at each
 *   speculative attempt would be wrong), and its own caller then applies
 *   the rule once to the whole stack. So an adaptor that caches nothing
 *   uses 1 (or 2), and a layer that caches uses 3.
 *
 *   Frees need no rule: rmmc__forward_deallocate (or the shared slot
 *   rmmc__adaptor_forward_deallocate) for a pass-through,
 *   rmmc_resource_deallocate for a free the layer makes itself.
 */
#ifndef RMMC_INTERNAL_UPSTREAM_H
#define RMMC_INTERNAL_UPSTREAM_H

#include <stddef.h>

#include "adaptor.h"
#include "compiler.h"
#include "rmmc/resource_ops.h"

/* ---- thread-local nesting of the public wrappers ----
 * rmmc__call_depth counts the allocate wrappers this thread is inside (0:
 * none, the caller is the application), plus RMMC__NO_RETRY while a caching
 * layer calls its own upstream or a retry runs: the out-of-memory rule is
 * then someone else's (above). Initial-exec (RMMC_TLS_FAST): the hot path
 * must not call __tls_get_addr; 4 bytes fit the static TLS surplus even
 * when the library is dlopen'ed. */
extern _Thread_local int rmmc__call_depth RMMC_TLS_FAST;
#define RMMC__NO_RETRY (1 << 30)
/* True while an error state of the outermost allocate's start is kept
 * (status.c: the first write inside the call keeps it): the wrapper puts it
 * back when the call succeeds after all (one load on the hot path). */
extern _Thread_local bool rmmc__call_start_kept RMMC_TLS_FAST;

/* The out-of-memory rule (resource.h, docs/design.md), applied where a
 * call enters resource r (the public wrapper, an adaptor's forward) and r's
 * allocate slot has just answered RMMC_ERROR_OUT_OF_MEMORY: if r caches
 * memory (figure "cached", or "reserved" above "in_use"), r's stack gives
 * back what it caches and the request is retried once. Returns the status
 * of the call (out of memory, unchanged, when nothing is cached). Cold. */
rmmc_status_t rmmc__allocate_after_release(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                           cudaStream_t stream, void **out);
/* A caching layer that applies the rule itself, under its own lock (the
 * pool), calls this before it answers RMMC_ERROR_OUT_OF_MEMORY: the
 * wrapper or forward that entered r then does not apply it a second time
 * (a second release and retry would find what the first did, and its note
 * would say twice that the cache was given back). Cleared by the next
 * failure of any allocate on the thread. */
void rmmc__oom_rule_applied(rmmc_resource_t *r);
/* The note an out-of-memory message gets once the rule has run, whether
 * the wrapper ran it or a layer under its own lock (the pool): the
 * layer's name as its argument. */
#define RMMC__RETRIED_NOTE \
  "; %s gave back its cached memory (and its upstream's) and the request was retried"

/* Verb 1. An adaptor's call of its upstream with the arguments its own
 * slot got (validated by the outermost public wrapper, src/base/resource.c),
 * straight through the upstream's slot: a second validation would find
 * nothing, and the wrapper's call depth still marks the outermost call.
 * *out is NULL after a failure, as the wrapper promises; an out of memory
 * gets the out-of-memory rule here, as in the wrapper, so that the adaptor
 * (and those above it) see one call with its final outcome. The only
 * other dispatch through an ops table. */
static inline rmmc_status_t rmmc__forward_allocate(const rmmc__adaptor_t *a, size_t bytes,
                                                   size_t alignment, cudaStream_t stream,
                                                   void **out) {
  rmmc_resource_t *up = a->upstream;
  rmmc_status_t st = up->ops->allocate(up, bytes, alignment, stream, out);
  if (RMMC_UNLIKELY(st != RMMC_SUCCESS)) {
    *out = NULL;
    if (st == RMMC_ERROR_OUT_OF_MEMORY && !(rmmc__call_depth & RMMC__NO_RETRY))
      st = rmmc__allocate_after_release(up, bytes, alignment, stream, out);
  }
  return st;
}

/* Verb 3. A caching layer's call of its upstream (or of its own parts:
 * binning's bins): rmmc_resource_allocate without the out-of-memory rule,
 * which the layer's own caller applies to the whole stack once the layer
 * has tried everything it knows (its growth fallbacks would otherwise
 * flush the upstream's cache at every speculative attempt). */
static inline rmmc_status_t rmmc__upstream_allocate(rmmc_resource_t *up, size_t bytes,
                                                    size_t alignment, cudaStream_t stream,
                                                    void **out) {
  int saved = rmmc__call_depth;
  rmmc__call_depth = saved | RMMC__NO_RETRY;
  rmmc_status_t st = rmmc_resource_allocate(up, bytes, alignment, stream, out);
  rmmc__call_depth = saved;
  return st;
}

/* The free of verb 1: the same call on the upstream, through its slot. */
static inline rmmc_status_t rmmc__forward_deallocate(const rmmc__adaptor_t *a, void *ptr,
                                                     size_t bytes, size_t alignment,
                                                     cudaStream_t stream) {
  rmmc_resource_t *up = a->upstream;
  return up->ops->deallocate(up, ptr, bytes, alignment, stream);
}

#endif /* RMMC_INTERNAL_UPSTREAM_H */
