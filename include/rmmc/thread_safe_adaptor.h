/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The thread-safe adaptor: one mutex around every call to a resource that
 * is not thread-safe itself.
 *
 * Every built-in resource is thread-safe already; this is for users' own
 * resources (resource_ops.h) written for one thread. allocate, deallocate
 * and release_cached take the adaptor's mutex for the whole upstream call,
 * so the upstream sees one call at a time. The mutex is not recursive: the
 * upstream must not call back into this adaptor.
 *
 * Not serialized: rmmc_resource_describe() on the upstream itself, which
 * the library calls without this lock when it walks a stack (the status
 * report, out-of-memory messages). A wrapped resource's describe slot must
 * therefore be safe beside its other slots (read counters only), or NULL.
 *
 * Figures (rmmc_resource_describe): "contended" (calls that found the
 * mutex taken and waited). Thread-safe.
 */
#ifndef RMMC_THREAD_SAFE_ADAPTOR_H
#define RMMC_THREAD_SAFE_ADAPTOR_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a thread-safe adaptor over `upstream` (retained) and stores one
 * reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream or
 * out; RMMC_ERROR_OUT_OF_MEMORY if host memory runs out. */
RMMC_EXPORT rmmc_status_t rmmc_thread_safe_adaptor_create(rmmc_resource_t *upstream,
                                                          rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_THREAD_SAFE_ADAPTOR_H */
