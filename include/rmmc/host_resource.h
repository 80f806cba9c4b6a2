/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host resource: aligned pageable host memory from the C library.
 *
 * Needs no GPU and no driver and never calls CUDA; streams are ignored.
 * It is the upstream the CPU tests use under every sub-allocator and adaptor,
 * and what the demo and the replay tool run on when there is no GPU.
 * All host resources are equal (memory from one may be freed through
 * another). Thread-safe. A request above 2^63 bytes or aligned to more than
 * 1 GiB is RMMC_ERROR_OUT_OF_MEMORY without calling the C library (no such
 * allocation can exist; posix_memalign with a huge alignment can take
 * minutes).
 *
 * Virtual memory (resource.h), in pages of the system's page size:
 * reserve is an inaccessible anonymous mmap, map makes a range readable and
 * writable (zeroed pages on first touch), unmap drops its pages
 * (MADV_DONTNEED) and makes it inaccessible again, unreserve is munmap.
 */
#ifndef RMMC_HOST_RESOURCE_H
#define RMMC_HOST_RESOURCE_H

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a host resource (one reference in *out).
 * RMMC_ERROR_INVALID_ARGUMENT for NULL out; RMMC_ERROR_OUT_OF_MEMORY. */
RMMC_EXPORT rmmc_status_t rmmc_host_resource_create(rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_HOST_RESOURCE_H */
