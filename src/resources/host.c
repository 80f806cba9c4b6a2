/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host resource: posix_memalign and free. No CUDA, no state: every
 * host resource is equal to every other, and the stream is ignored.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/spec.h"
#include "rmmc/host_resource.h"

/* Beyond these no allocation can exist on a 64-bit host (and glibc's
 * posix_memalign with a 2^62 alignment crashes valgrind; a 2^40 one took
 * minutes on a 128 GiB machine): refused before the C library sees them. */
#define HOST_MAX_BYTES ((size_t)PTRDIFF_MAX)
#define HOST_MAX_ALIGNMENT ((size_t)1 << 30)

static rmmc_status_t host_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  void *p = NULL;
  if (RMMC_UNLIKELY(bytes > HOST_MAX_BYTES || alignment > HOST_MAX_ALIGNMENT))
    return rmmc_set_oom_error(r, bytes, stream,
                              "no host allocation of this size aligned to %zu can exist "
                              "(the host resource serves up to 2^63 bytes and 1 GiB alignment)",
                              alignment);
  if (posix_memalign(&p, alignment, bytes) != 0)
    return rmmc_set_oom_error(r, bytes, stream, "posix_memalign failed");
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t host_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  (void)r, (void)bytes, (void)alignment, (void)stream;
  free(ptr);
  return RMMC_SUCCESS;
}

static bool host_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  (void)a, (void)b;
  return true;
}

static void host_destroy(rmmc_resource_t *r) { free(r); }

/* ---- virtual memory: mmap, mprotect, madvise ----
 * A reservation is an inaccessible anonymous mapping; map makes a range
 * readable and writable (the kernel supplies zeroed pages on first touch)
 * and unmap drops its pages and makes it inaccessible again. */

static size_t host_vm_page_size(const rmmc_resource_t *r) {
  (void)r;
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? (size_t)page : 4096;
}

static rmmc_status_t host_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                     void **out) {
  size_t extra = alignment - host_vm_page_size(r); /* trimmed off after aligning */
  if (bytes > SIZE_MAX - extra)
    return rmmc_set_oom_error(r, bytes, NULL, "address space request too large");
  char *p = mmap(NULL, bytes + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return rmmc_set_oom_error(r, bytes, NULL, "mmap of address space failed (errno %d)", errno);
  char *a = (char *)rmmc__align_up((uintptr_t)p, alignment);
  if (a > p) munmap(p, (size_t)(a - p));
  if (p + extra > a) munmap(a + bytes, (size_t)(p + extra - a));
  *out = a;
  return RMMC_SUCCESS;
}

static rmmc_status_t host_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  (void)r;
  if (munmap(ptr, bytes) != 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "host: munmap(%p, %zu) failed (errno %d)",
                          ptr, bytes, errno);
  return RMMC_SUCCESS;
}

static rmmc_status_t host_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  if (mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0)
    return errno == ENOMEM ? rmmc_set_oom_error(r, bytes, NULL, "mprotect failed")
                           : rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                                            "host: mprotect(%p, %zu) failed (errno %d)", ptr,
                                            bytes, errno);
  return RMMC_SUCCESS;
}

static rmmc_status_t host_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  (void)r;
  if (madvise(ptr, bytes, MADV_DONTNEED) != 0 || mprotect(ptr, bytes, PROT_NONE) != 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "host: unmapping %p + %zu failed (errno %d)",
                          ptr, bytes, errno);
  return RMMC_SUCCESS;
}

static const rmmc_resource_ops_t host_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "host",
    .allocate = host_allocate,
    .deallocate = host_deallocate,
    .is_equal = host_is_equal,
    .destroy = host_destroy,
    .vm_page_size = host_vm_page_size,
    .vm_reserve = host_vm_reserve,
    .vm_unreserve = host_vm_unreserve,
    .vm_map = host_vm_map,
    .vm_unmap = host_vm_unmap,
};

RMMC_API rmmc_status_t rmmc_host_resource_create(rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "host_resource_create: out is NULL");
  *out = NULL;
  rmmc_resource_t *r = malloc(sizeof *r);
  if (r == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "host_resource_create: no memory");
  rmmc_resource_init(r, &host_ops, RMMC_MEMORY_HOST, -1);
  *out = r;
  return RMMC_SUCCESS;
}

static rmmc_status_t host_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                int device, rmmc_resource_t **out) {
  (void)args, (void)upstream, (void)device;
  return rmmc_host_resource_create(out);
}

const rmmc__spec_entry_t rmmc__host_spec = {
    .name = "host",
    .help = "aligned host memory from the C library (no GPU needed)",
    .build = host_build,
};
