/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the virtual-memory backend's two files share (internal): vm_map.c
 * defines these, vm.c (placing, growing, trimming) calls them and puts the
 * last three in the backend's table. All under the shared lock.
 */
#ifndef RMMC_POOL_VM_H
#define RMMC_POOL_VM_H

#include "pool_internal.h"

/* ---- vm_map.c: a reservation's segments ---- */
bool rmmc__pool_seg_insert(pool_region_t *r, uintptr_t addr, size_t size);
void rmmc__pool_seg_remove(pool_region_t *r, size_t i);

/* ---- vm_map.c: the upstream's calls ---- */
rmmc_status_t rmmc__pool_vm_map(pool_t *p, uintptr_t a, size_t n);
rmmc_status_t rmmc__pool_vm_unmap(pool_t *p, uintptr_t a, size_t n);
/* Unmaps [a, a + n) after telling the memory hooks it goes. */
rmmc_status_t rmmc__pool_vm_unmap_announced(pool_t *p, uintptr_t a, size_t n);
rmmc_status_t rmmc__pool_vm_access(pool_t *p, uintptr_t a, size_t n, int d, bool on);
/* Maps [a, a + n) of r as one segment, granted to every peer; on a
 * refusal nothing of it stays mapped or listed. */
rmmc_status_t rmmc__pool_vm_map_segment(pool_t *p, pool_region_t *r, uintptr_t a, size_t n);

/* ---- vm_map.c: the backend's peer and sleep slots (pool_backend_t) ---- */
rmmc_status_t rmmc__pool_vm_grant(pool_t *p, int d);
rmmc_status_t rmmc__pool_vm_sleep(pool_t *p, int which, size_t *gone);
rmmc_status_t rmmc__pool_vm_wake(pool_t *p);

#endif /* RMMC_POOL_VM_H */
