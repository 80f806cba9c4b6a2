/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The adaptor base: every adaptor and sub-allocator embeds rmmc__adaptor_t
 * first; it holds the retained upstream and takes the upstream's memory
 * kind and device. Below it, the slots an adaptor that passes a call on
 * unchanged fills in (deallocate, the virtual-memory slots, get_allocation,
 * destroy), written once here (implemented in resource.c). How an adaptor
 * calls its upstream's allocate is base/upstream.h.
 */
#ifndef RMMC_INTERNAL_ADAPTOR_H
#define RMMC_INTERNAL_ADAPTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource_ops.h"

typedef struct rmmc__adaptor {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
} rmmc__adaptor_t;

/* Initializes the base with ops and retains upstream (which must not be
 * NULL; the caller checks and reports that with the adaptor's name). */
void rmmc__adaptor_init(rmmc__adaptor_t *a, const rmmc_resource_ops_t *ops,
                        rmmc_resource_t *upstream);
/* Releases the upstream. */
void rmmc__adaptor_fini(rmmc__adaptor_t *a);
/* The `upstream` slot shared by every adaptor. */
rmmc_resource_t *rmmc__adaptor_upstream(const rmmc_resource_t *r);
/* Checks the common arguments of an adaptor's _create call (NULL out or
 * upstream) and sets *out to NULL. */
rmmc_status_t rmmc__check_create(const char *what, const rmmc_resource_t *upstream,
                                 rmmc_resource_t **out);

static inline rmmc_resource_t *rmmc__upstream_of(rmmc_resource_t *r) {
  return ((rmmc__adaptor_t *)r)->upstream;
}

/* Checks the arguments (as rmmc__check_create), allocates a zeroed adaptor
 * struct of `struct_size` bytes (rmmc__adaptor_t first) and initializes it
 * with `ops`, retaining upstream. The caller fills its own fields; if it
 * then fails, it undoes this with rmmc__adaptor_fini and free. */
rmmc_status_t rmmc__adaptor_new(const char *what, const rmmc_resource_ops_t *ops,
                                rmmc_resource_t *upstream, size_t struct_size,
                                rmmc_resource_t **out);

/* The `deallocate` slot of an adaptor that only passes frees through: the
 * same call on the upstream. */
rmmc_status_t rmmc__adaptor_forward_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                               size_t alignment, cudaStream_t stream);
/* Virtual-memory slots that pass every call to the upstream (an adaptor
 * that lets an expandable pool above it reach the base's virtual memory;
 * vm_page_size is the upstream's, 0 if it has none). */
size_t rmmc__adaptor_vm_page_size(const rmmc_resource_t *r);
rmmc_status_t rmmc__adaptor_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       void **out);
rmmc_status_t rmmc__adaptor_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes);
rmmc_status_t rmmc__adaptor_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes);
rmmc_status_t rmmc__adaptor_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes);

/* The `vm_set_access` slot of an adaptor with the virtual-memory slots
 * above: the same call on the upstream. */
rmmc_status_t rmmc__adaptor_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                          bool readwrite);
/* Can r give other devices access to its pages: has r, or the layer below
 * the adaptors that pass the call on, a vm_set_access slot? */
bool rmmc__vm_can_set_access(const rmmc_resource_t *r);

/* The `get_allocation` slot of an adaptor that hands out its upstream's
 * blocks unchanged: the same question to the upstream. */
rmmc_status_t rmmc__adaptor_get_allocation(rmmc_resource_t *r, const void *ptr,
                                           rmmc_allocation_t *out);

/* The `destroy` slot of an adaptor whose struct holds nothing to free
 * beyond the upstream reference: releases the upstream, frees the struct. */
void rmmc__adaptor_destroy(rmmc_resource_t *r);

#endif /* RMMC_INTERNAL_ADAPTOR_H */
