/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The faulty resource: a pass-through adaptor, written as a user would
 * (resource_ops.h only), that injects a chosen status into the next N
 * allocate, deallocate or release_cached calls, or into every Nth call of
 * a kind, without calling its upstream (enable_peer_access too, which it
 * otherwise passes down as a user's adaptor of version 4 would). For the
 * error paths the spy cannot
 * reach (it fails allocate with out of memory only), and for fault
 * injection across whole stacks (tests/test_fault_injection.c).
 * faulty_vm_create makes one that also passes virtual memory through
 * (resource.h, "Virtual memory") and can refuse vm_reserve, vm_map and
 * vm_unmap the same way, for pools with the virtual-memory backend over any
 * base (host, sim). Thread-safe.
 */
#ifndef RMMC_TEST_FAULTY_H
#define RMMC_TEST_FAULTY_H

#include <stdint.h>

#include "rmmc/resource_ops.h"

typedef struct faulty faulty_t;

typedef struct faulty_counts {
  uint64_t allocate_calls, deallocate_calls, release_calls; /* injected ones too */
  uint64_t allocate_injected, deallocate_injected, release_injected; /* failed on purpose */
  uint64_t peer_calls, peer_injected; /* enable_peer_access */
  uint64_t vm_reserve_calls, vm_map_calls, vm_unmap_calls;          /* faulty_vm_create only */
  uint64_t vm_reserve_injected, vm_map_injected, vm_unmap_injected;
} faulty_counts_t;

/* The kinds of call faulty can fail. */
typedef enum faulty_op {
  FAULTY_ALLOCATE,
  FAULTY_DEALLOCATE,
  FAULTY_RELEASE,
  FAULTY_PEER, /* enable_peer_access */
  FAULTY_VM_RESERVE, /* the virtual-memory calls of a faulty_vm_create resource */
  FAULTY_VM_MAP,
  FAULTY_VM_UNMAP,
} faulty_op_t;

/* Creates a faulty resource over `upstream` (retained); same memory kind
 * and device as the upstream. */
rmmc_status_t faulty_create(rmmc_resource_t *upstream, rmmc_resource_t **out);
/* The same over an upstream with virtual memory (RMMC_ERROR_NOT_SUPPORTED
 * otherwise, nothing retained): vm_page_size, vm_unreserve and
 * vm_set_access pass through; vm_reserve, vm_map and vm_unmap can be
 * refused (the upstream not called: a refused unmap leaves the range
 * mapped, a refused map maps nothing). */
rmmc_status_t faulty_vm_create(rmmc_resource_t *upstream, rmmc_resource_t **out);
/* The faulty resource behind r (either kind), or NULL. */
faulty_t *faulty_of(rmmc_resource_t *r);

/* The next `count` calls of that kind return `status` with the message
 * "faulty: injected <STATUS_NAME>" and leave everything as it was. */
void faulty_fail_allocate(faulty_t *f, rmmc_status_t status, uint64_t count);
void faulty_fail_deallocate(faulty_t *f, rmmc_status_t status, uint64_t count);
void faulty_fail_release(faulty_t *f, rmmc_status_t status, uint64_t count);
void faulty_fail_peer_access(faulty_t *f, rmmc_status_t status, uint64_t count);
/* The same for any kind of call. */
void faulty_fail_next(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t count);
/* From now on every Nth call of kind `op` (the Nth, 2Nth, ... counted from
 * this call) returns `status` as above; n = 0 turns it off. Independent of
 * the next-N count above (a call fails if either says so). */
void faulty_fail_every(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t n);
/* Only the Nth call of kind `op` from now on (1: the next) returns `status`
 * as above; n = 0 turns it off. Independent of the two above. */
void faulty_fail_nth(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t n);
/* Turns every injection off (counts, every-Nth and the Nth). */
void faulty_disarm(faulty_t *f);
faulty_counts_t faulty_counts(faulty_t *f);

#endif
