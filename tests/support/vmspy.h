/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The vmspy resource: virtual memory for tests, checked. It forwards
 * allocate/deallocate to its upstream (a spy, usually) and implements the
 * vm_* slots itself with mmap/mprotect/madvise, checking every call
 * against what it handed out: a range mapped twice, unmapped but not
 * mapped, outside any reservation, or a reservation given back with pages
 * still mapped is refused (RMMC_ERROR_INVALID_ARGUMENT) and counted as an
 * error. Each mapped range is paired with an allocation of the same size
 * from the upstream, so the upstream spy's capacity, fail_nth/fail_every
 * and leak checks cover mapped memory too; an unmap whose upstream free
 * fails (a faulty upstream) leaves the range mapped. Thread-safe.
 *
 * Peer access, modelled as a driver keeps it: each mapped range carries
 * the devices granted access to it (vm_set_access), none when it is
 * mapped, and loses them when it is unmapped; a vm_set_access whose range
 * is not whole mapped ranges, contiguous, is refused and counted as an
 * error. enable_peer_access records the device (the base's own part: its
 * memory is the mappings) and succeeds.
 */
#ifndef RMMC_TEST_VMSPY_H
#define RMMC_TEST_VMSPY_H

#include <stddef.h>
#include <stdint.h>

#include "rmmc/resource_ops.h"

typedef struct vmspy_counts {
  uint64_t reserves, unreserves, maps, unmaps, map_failures, errors;
  size_t mapped_bytes, peak_mapped_bytes, reserved_bytes;
  uint64_t grants, revokes, access_failures; /* vm_set_access calls (injected failures) */
  uint64_t peer_enables;                     /* enable_peer_access calls */
  uint64_t peers_enabled;                    /* their devices (bit d) */
} vmspy_counts_t;

/* Creates a vmspy over `upstream` (retained) with pages of `page` bytes (a
 * power of two, a multiple of the system page). Memory kind host. */
rmmc_status_t vmspy_create(rmmc_resource_t *upstream, size_t page, rmmc_resource_t **out);
/* The counts of a vmspy (zeros for another resource). */
vmspy_counts_t vmspy_counts(rmmc_resource_t *r);
/* `count` vm_set_access calls from the nth from now on (1: the next) fail
 * with RMMC_ERROR_CUDA, changing nothing; nth 0 disarms. */
void vmspy_fail_set_access(rmmc_resource_t *r, uint64_t nth, uint64_t count);
/* How many mapped ranges device d may not reach (not granted), and how many
 * ranges are mapped in all. */
size_t vmspy_unreachable(rmmc_resource_t *r, int d, size_t *mapped);

#endif
