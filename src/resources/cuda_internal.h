/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the cuda resource offers the rest of the library beyond its slots
 * (internal): sharing its memory with other processes, for src/front/ipc.c. The
 * driver's entry points stay in cuda.c, looked up once.
 */
#ifndef RMMC_CUDA_INTERNAL_H
#define RMMC_CUDA_INTERNAL_H

#include "base/internal.h"

/* Is r a cuda resource; one whose pages are made shareable (ipc=true)? */
bool rmmc__cuda_is(const rmmc_resource_t *r);
bool rmmc__cuda_is_shareable(const rmmc_resource_t *r);

/* A POSIX file descriptor (the caller's to close) for the physical memory
 * mapped at addr: one range that r's vm_map mapped. */
rmmc_status_t rmmc__cuda_export_mapping(rmmc_resource_t *r, void *addr, int *fd);

/* Maps n imported allocations (descriptors fds[i] of sizes[i] bytes) in
 * order into fresh address space, read-write for `device`; *out is its
 * start. On failure nothing stays mapped. */
rmmc_status_t rmmc__cuda_import_mappings(int device, const int *fds, const size_t *sizes, size_t n,
                                         void **out);
/* Unmaps what rmmc__cuda_import_mappings mapped and frees its address space. */
rmmc_status_t rmmc__cuda_unmap_import(int device, void *base, const size_t *sizes, size_t n);

/* The device's UUID (as CUDA_VISIBLE_DEVICES and nvidia-smi name it). */
rmmc_status_t rmmc__cuda_device_uuid(int device, unsigned char uuid[16]);

#endif /* RMMC_CUDA_INTERNAL_H */
