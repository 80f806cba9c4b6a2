/* SPDX-License-Identifier: Apache-2.0 */
/* What the virtual-memory backend's files share (internal): vm.c places,
 * grows and trims, and has the end, figures and invariants; vm_map.c has
 * the mappings. All under the shared lock. */
#ifndef RMMC_POOL_VM_H
#define RMMC_POOL_VM_H

#include "pool_internal.h"

bool rmmc__pool_seg_insert(pool_region_t *r, uintptr_t addr, size_t size);
void rmmc__pool_seg_remove(pool_region_t *r, size_t i);
rmmc_status_t rmmc__pool_vm_unmap_announced(pool_t *p, uintptr_t a, size_t n);
/* Maps [a, a + n) of r as one segment, granted to every peer; on a
 * refusal nothing of it stays mapped or listed. */
rmmc_status_t rmmc__pool_vm_map_segment(pool_t *p, pool_region_t *r, uintptr_t a, size_t n);

/* The backend's slots (pool_backend_t) that vm_map.c defines. */
rmmc_status_t rmmc__pool_vm_grant(pool_t *p, int d);
rmmc_status_t rmmc__pool_vm_sleep(pool_t *p, int which, size_t *gone);
rmmc_status_t rmmc__pool_vm_wake(pool_t *p);

#endif /* RMMC_POOL_VM_H */
