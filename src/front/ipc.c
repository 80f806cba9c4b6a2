/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Export and import of blocks between processes (include/rmmc/ipc.h).
 *
 * Export walks down the stack from the pointer with
 * rmmc_resource_get_allocation until it reaches memory a layer made
 * itself: each layer names the block of its upstream that holds the block
 * (a chunk) or the mappings under it. A cudaMalloc allocation of a cuda
 * resource is shared with its CUDA IPC handle; mappings of an expandable
 * pool, when the cuda resource under it made them shareable, with one file
 * descriptor each. The export is entered in the registry (exports.c),
 * whose slot and generation the handle carries.
 *
 * Import checks the registry first (a stale handle opens nothing), finds
 * the device by UUID, and opens what the handle names once: a chunk per
 * CUDA IPC handle (cudaIpcOpenMemHandle), a run of mappings per export
 * (the descriptors of each export of a block are new files, so two
 * exports of one mapping cannot be told apart here; an export's slot and
 * generation can). Every open base counts its imports and is closed with
 * the last. One lock covers the cache; opening runs under it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/exports.h"
#include "base/ipc_handle.h"
#include "resources/cuda_internal.h"
#include "rmmc/ipc.h"
#include "rmmc/registry.h"

#define WALK_MAX 16

/* ---- the exporter ---- */

/* What lies under an exported block at the bottom of the stack. */
typedef struct origin {
  rmmc_ipc_kind_t kind;
  rmmc_resource_t *base; /* the cuda resource that made the memory */
  uintptr_t start;       /* the cudaMalloc allocation, or the first mapping */
  size_t bytes;
  const rmmc_range_t *maps; /* pages: the mappings, in order */
  size_t nmaps;
} origin_t;

static rmmc_status_t export_failed(rmmc_status_t st) {
  char why[RMMC__MESSAGE_MAX - 32];
  snprintf(why, sizeof why, "%s", rmmc_last_error_message());
  return rmmc_set_error(st, "ipc_export: %s", why);
}

static rmmc_resource_t *bottom_of(rmmc_resource_t *r) {
  for (rmmc_resource_t *up; (up = rmmc_resource_upstream(r)) != NULL;) r = up;
  return r;
}

/* Walks from the block holding ptr down to the memory under it. *top: the
 * block as r's stack handed it out. */
static rmmc_status_t find_origin(rmmc_resource_t *r, const void *ptr, rmmc_range_t *buf,
                                 rmmc_allocation_t *top, origin_t *o) {
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  a.mappings = buf;
  a.max_mappings = RMMC_IPC_MAX_FDS;
  rmmc_status_t st = rmmc_resource_get_allocation(r, ptr, &a);
  if (st != RMMC_SUCCESS) return export_failed(st);
  *top = a;
  for (int depth = 0; depth < WALK_MAX; depth++) {
    if (a.backing == RMMC_BACKING_OWN) {
      if (!rmmc__cuda_is(a.resource))
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "ipc_export: the block's memory comes from a %s resource, which "
                              "cannot share it with another process (a cuda resource can)",
                              rmmc_resource_name(a.resource));
      *o = (origin_t){RMMC_IPC_CUDA, a.resource, (uintptr_t)a.upstream.ptr, a.upstream.bytes,
                      NULL, 0};
      return RMMC_SUCCESS;
    }
    if (a.backing == RMMC_BACKING_MAPPINGS) {
      rmmc_resource_t *vm = bottom_of(a.resource);
      if (!rmmc__cuda_is(vm))
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "ipc_export: the block lies on pages of a %s resource, which "
                              "cannot share them with another process",
                              rmmc_resource_name(vm));
      if (!rmmc__cuda_is_shareable(vm))
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "ipc_export: the block lies on pages of an expandable %s, and the "
                              "cuda resource under it does not make them shareable: build it "
                              "as cuda(ipc=true) (or use chunks: pool(expandable=false) > cuda)",
                              rmmc_resource_name(a.resource));
      if (a.nmappings > RMMC_IPC_MAX_FDS)
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "ipc_export: the block lies on %zu mappings; a handle carries at "
                              "most %d (raise the pool's page option)",
                              a.nmappings, RMMC_IPC_MAX_FDS);
      *o = (origin_t){RMMC_IPC_VM, vm, (uintptr_t)a.upstream.ptr, a.upstream.bytes, buf,
                      a.nmappings};
      return RMMC_SUCCESS;
    }
    rmmc_resource_t *up = rmmc_resource_upstream(a.resource);
    if (a.backing != RMMC_BACKING_BLOCK || up == NULL)
      return rmmc_set_error(RMMC_ERROR_INTERNAL,
                            "ipc_export: %s says its block lies on its upstream's, but it has "
                            "none",
                            rmmc_resource_name(a.resource));
    rmmc_allocation_t b = RMMC_ALLOCATION_INIT;
    b.mappings = buf;
    b.max_mappings = RMMC_IPC_MAX_FDS;
    st = rmmc_resource_get_allocation(up, a.upstream.ptr, &b);
    if (st != RMMC_SUCCESS) return export_failed(st);
    a = b;
  }
  return rmmc_set_error(RMMC_ERROR_INTERNAL, "ipc_export: a stack deeper than %d layers", WALK_MAX);
}

static void close_fds(int *fds, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

RMMC_API rmmc_status_t rmmc_ipc_export(rmmc_resource_t *r, const void *ptr,
                                       rmmc_ipc_handle_t *handle, int *fds, size_t max_fds,
                                       size_t *nfds) {
  if (nfds != NULL) *nfds = 0;
  if (r == NULL || ptr == NULL || handle == NULL || nfds == NULL || (max_fds > 0 && fds == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_export: NULL resource, pointer, handle, count or descriptors");
  rmmc_memory_kind_t kind = rmmc_resource_memory_kind(r);
  if (kind != RMMC_MEMORY_DEVICE)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "ipc_export: a %s stack hands out %s memory, which cannot be shared "
                          "with another process: CUDA shares device memory only (cuda, or a "
                          "pool over it)",
                          rmmc_resource_name(r), rmmc_memory_kind_name(kind));
  rmmc_range_t *buf = malloc(RMMC_IPC_MAX_FDS * sizeof *buf);
  rmmc__ipc_fields_t *f = calloc(1, sizeof *f);
  rmmc_status_t st = buf != NULL && f != NULL
                         ? RMMC_SUCCESS
                         : rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_export: no host memory");
  rmmc_allocation_t top = RMMC_ALLOCATION_INIT;
  origin_t o = {0};
  size_t made = 0;
  if (st == RMMC_SUCCESS) st = find_origin(r, ptr, buf, &top, &o);
  if (st != RMMC_SUCCESS) goto out;
  uintptr_t p = (uintptr_t)ptr, end = (uintptr_t)top.base + top.bytes;
  if (p < o.start || end > o.start + o.bytes) {
    st = rmmc_set_error(RMMC_ERROR_INTERNAL,
                        "ipc_export: the block %p + %zu does not lie in the memory under it "
                        "(%p + %zu)",
                        top.base, top.bytes, (void *)o.start, o.bytes);
    goto out;
  }
  f->kind = o.kind;
  f->device = o.base->device;
  f->offset = p - o.start;
  f->bytes = end - p;
  f->origin = o.start;
  f->origin_bytes = o.bytes;
  st = rmmc__cuda_device_uuid(o.base->device, f->uuid);
  if (st != RMMC_SUCCESS) goto out;
  if (o.kind == RMMC_IPC_CUDA) {
    int saved;
    st = rmmc__device_push(o.base->device, &saved);
    if (st != RMMC_SUCCESS) goto out;
    cudaIpcMemHandle_t h;
    cudaError_t err = cudaIpcGetMemHandle(&h, (void *)o.start);
    rmmc__device_pop(saved);
    if (err != cudaSuccess) {
      st = rmmc_set_cuda_error(err, "ipc_export: cudaIpcGetMemHandle");
      goto out;
    }
    _Static_assert(sizeof h == sizeof f->cuda, "a CUDA IPC handle is 64 bytes");
    memcpy(f->cuda, &h, sizeof h);
  } else {
    if (o.nmaps > max_fds) {
      *nfds = o.nmaps;
      st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_export: the block lies on %zu mappings and needs as many "
                          "descriptors; there is room for %zu",
                          o.nmaps, max_fds);
      goto out;
    }
    f->page = rmmc_resource_vm_page_size(o.base);
    f->nmappings = (uint32_t)o.nmaps;
    for (; made < o.nmaps; made++) {
      if (f->page == 0 || o.maps[made].bytes % f->page != 0 ||
          o.maps[made].bytes / f->page > UINT32_MAX) {
        st = rmmc_set_error(RMMC_ERROR_INTERNAL,
                            "ipc_export: mapping %p + %zu is not whole %zu-byte pages",
                            o.maps[made].ptr, o.maps[made].bytes, (size_t)f->page);
        goto out;
      }
      f->pages[made] = (uint32_t)(o.maps[made].bytes / f->page);
      st = rmmc__cuda_export_mapping(o.base, o.maps[made].ptr, &fds[made]);
      if (st != RMMC_SUCCESS) {
        st = export_failed(st);
        goto out;
      }
      /* Not inherited by programs this process starts (sent on purpose only). */
      (void)fcntl(fds[made], F_SETFD, fcntl(fds[made], F_GETFD) | FD_CLOEXEC);
    }
  }
  st = rmmc__exports_add(top.base, ptr, top.bytes, top.resource, &f->ref);
  if (st != RMMC_SUCCESS) goto out;
  rmmc__ipc_encode(f, handle);
  *nfds = made;
out:
  if (st != RMMC_SUCCESS && made > 0) close_fds(fds, made);
  free(buf);
  free(f);
  return st;
}

rmmc_status_t rmmc__ipc_base_allocation(rmmc_resource_t *r, const void *ptr, void **base,
                                        size_t *bytes) {
  rmmc_range_t *buf = malloc(RMMC_IPC_MAX_FDS * sizeof *buf);
  if (buf == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "no host memory");
  rmmc_allocation_t top;
  origin_t o;
  rmmc_status_t st = find_origin(r, ptr, buf, &top, &o);
  free(buf);
  if (st != RMMC_SUCCESS) return st;
  if (o.kind != RMMC_IPC_CUDA)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "the block lies on virtual-memory pages: no one allocation holds it");
  *base = (void *)o.start;
  *bytes = o.bytes;
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_ipc_revoke(const void *ptr) {
  if (ptr == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "ipc_revoke: NULL pointer");
  return rmmc__exports_revoke(ptr);
}

/* ---- the importer ---- */

typedef struct base {
  struct base *next;
  rmmc_ipc_kind_t kind; /* 0: the exporter's own memory (this process) */
  uint32_t pid;
  uint64_t table_id;
  unsigned char cuda[64];    /* chunks: the key */
  uint32_t slot;             /* pages and own memory: the key */
  uint64_t generation;
  int device;
  char *ptr;
  size_t *sizes; /* pages */
  size_t n;
  long refs;
} base_t;

typedef struct import {
  struct import *next;
  char *ptr;
  base_t *base;
  long refs;
} import_t;

static pthread_mutex_t imp_lock = PTHREAD_MUTEX_INITIALIZER;
static base_t *bases;
static import_t *imports;
static uint64_t n_imports, n_opens, n_unverified;

static bool same_base(const base_t *b, const rmmc__ipc_fields_t *f, rmmc_ipc_kind_t kind) {
  if (b->kind != kind || b->pid != f->ref.pid || b->table_id != f->ref.table_id) return false;
  if (kind == RMMC_IPC_CUDA) return memcmp(b->cuda, f->cuda, sizeof b->cuda) == 0;
  return b->slot == f->ref.slot && b->generation == f->ref.generation;
}

/* The local ordinal of the device with this UUID. */
static rmmc_status_t device_of(const unsigned char uuid[16], int *device) {
  int n = rmmc_device_count();
  for (int d = 0; d < n; d++) {
    unsigned char u[16];
    if (rmmc__cuda_device_uuid(d, u) == RMMC_SUCCESS && memcmp(u, uuid, 16) == 0) {
      *device = d;
      return RMMC_SUCCESS;
    }
  }
  char hex[40];
  for (int i = 0, k = 0; i < 16; i++)
    k += snprintf(hex + k, sizeof hex - (size_t)k, "%s%02x",
                  i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", uuid[i]);
  return rmmc_set_error(RMMC_ERROR_NO_DEVICE,
                        "ipc_import: the memory is on GPU-%s, which this process does not see "
                        "(%d device%s visible: CUDA_VISIBLE_DEVICES?)",
                        hex, n, n == 1 ? "" : "s");
}

/* Opens what f names (lock held). */
static rmmc_status_t open_base(const rmmc__ipc_fields_t *f, rmmc_ipc_kind_t kind, int device,
                               const int *fds, base_t **out) {
  base_t *b = calloc(1, sizeof *b);
  if (b == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_import: no host memory");
  *b = (base_t){.kind = kind, .pid = f->ref.pid, .table_id = f->ref.table_id,
                .slot = f->ref.slot, .generation = f->ref.generation, .device = device};
  memcpy(b->cuda, f->cuda, sizeof b->cuda);
  rmmc_status_t st = RMMC_SUCCESS;
  if (kind == 0) {
    b->ptr = (char *)(uintptr_t)f->origin; /* our own memory */
  } else if (kind == RMMC_IPC_CUDA) {
    int saved;
    st = rmmc__device_push(device, &saved);
    if (st == RMMC_SUCCESS) {
      cudaIpcMemHandle_t h;
      memcpy(&h, f->cuda, sizeof h);
      void *p = NULL;
      cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      rmmc__device_pop(saved);
      if (err != cudaSuccess)
        st = rmmc_set_cuda_error(err, "ipc_import: cudaIpcOpenMemHandle (the chunk may have "
                                      "been given back by its exporter)");
      b->ptr = p;
    }
  } else {
    b->n = f->nmappings;
    b->sizes = malloc(b->n * sizeof *b->sizes);
    if (b->sizes == NULL)
      st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_import: no host memory");
    for (size_t i = 0; st == RMMC_SUCCESS && i < b->n; i++) b->sizes[i] = f->pages[i] * f->page;
    void *p = NULL;
    if (st == RMMC_SUCCESS) st = rmmc__cuda_import_mappings(device, fds, b->sizes, b->n, &p);
    if (st != RMMC_SUCCESS) {
      char why[RMMC__MESSAGE_MAX - 32];
      snprintf(why, sizeof why, "%s", rmmc_last_error_message());
      st = rmmc_set_error(st, "ipc_import: %s", why);
    }
    b->ptr = p;
  }
  if (st != RMMC_SUCCESS) {
    free(b->sizes);
    free(b);
    return st;
  }
  b->next = bases;
  bases = b;
  if (kind != 0) n_opens++;
  *out = b;
  return RMMC_SUCCESS;
}

static rmmc_status_t close_base(base_t *b) {
  rmmc_status_t st = RMMC_SUCCESS;
  if (b->kind == RMMC_IPC_CUDA) {
    int saved;
    st = rmmc__device_push(b->device, &saved);
    if (st == RMMC_SUCCESS) {
      cudaError_t err = cudaIpcCloseMemHandle(b->ptr);
      rmmc__device_pop(saved);
      if (err != cudaSuccess) st = rmmc_set_cuda_error(err, "ipc_close: cudaIpcCloseMemHandle");
    }
  } else if (b->kind == RMMC_IPC_VM) {
    st = rmmc__cuda_unmap_import(b->device, b->ptr, b->sizes, b->n);
  }
  for (base_t **l = &bases; *l != NULL; l = &(*l)->next)
    if (*l == b) {
      *l = b->next;
      break;
    }
  free(b->sizes);
  free(b);
  return st;
}

RMMC_API rmmc_status_t rmmc_ipc_import(const rmmc_ipc_handle_t *handle, const int *fds,
                                       size_t nfds, void **out) {
  if (out != NULL) *out = NULL;
  if (handle == NULL || out == NULL || (nfds > 0 && fds == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_import: NULL handle, out-pointer or descriptors");
  rmmc__ipc_fields_t *f = malloc(sizeof *f);
  if (f == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_import: no host memory");
  rmmc_status_t st = rmmc__ipc_decode(handle, f);
  if (st == RMMC_SUCCESS && nfds != rmmc__ipc_nfds(f))
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "ipc_import: the handle travels with %zu descriptors; %zu were given",
                        rmmc__ipc_nfds(f), nfds);
  for (size_t i = 0; st == RMMC_SUCCESS && i < nfds; i++)
    if (fds[i] < 0)
      st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "ipc_import: descriptor %zu is %d", i,
                          fds[i]);
  bool verified = false;
  if (st == RMMC_SUCCESS) st = rmmc__exports_check(&f->ref, &verified);
  bool own = st == RMMC_SUCCESS && verified && f->ref.pid == (uint32_t)getpid();
  int device = -1;
  if (st == RMMC_SUCCESS && !own) st = device_of(f->uuid, &device);
  if (st != RMMC_SUCCESS) {
    free(f);
    return st;
  }
  rmmc_ipc_kind_t kind = own ? (rmmc_ipc_kind_t)0 : f->kind;
  pthread_mutex_lock(&imp_lock);
  if (!verified) n_unverified++;
  base_t *b = bases;
  while (b != NULL && !same_base(b, f, kind)) b = b->next;
  if (b == NULL) st = open_base(f, kind, device, fds, &b);
  if (st == RMMC_SUCCESS) {
    char *p = b->ptr + f->offset;
    import_t *im = imports;
    while (im != NULL && !(im->ptr == p && im->base == b)) im = im->next;
    if (im == NULL && (im = calloc(1, sizeof *im)) != NULL) {
      *im = (import_t){imports, p, b, 0};
      imports = im;
    }
    if (im == NULL) {
      st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_import: no host memory");
      if (b->refs == 0) (void)close_base(b);
    } else {
      im->refs++;
      b->refs++;
      n_imports++;
      *out = p;
    }
  }
  pthread_mutex_unlock(&imp_lock);
  free(f);
  return st;
}

RMMC_API rmmc_status_t rmmc_ipc_close(void *ptr) {
  pthread_mutex_lock(&imp_lock);
  import_t **l = &imports;
  while (*l != NULL && (*l)->ptr != (char *)ptr) l = &(*l)->next;
  import_t *im = *l;
  rmmc_status_t st = RMMC_SUCCESS;
  if (im == NULL) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "ipc_close: %p is not a pointer rmmc_ipc_import returned, or it was "
                        "closed as often as it was imported",
                        ptr);
  } else {
    base_t *b = im->base;
    n_imports--;
    if (--im->refs == 0) {
      *l = im->next;
      free(im);
    }
    if (--b->refs == 0) st = close_base(b);
  }
  pthread_mutex_unlock(&imp_lock);
  return st;
}

RMMC_API rmmc_status_t rmmc_ipc_check(const rmmc_ipc_handle_t *handle) {
  if (handle == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "ipc_check: NULL handle");
  rmmc__ipc_fields_t *f = malloc(sizeof *f);
  if (f == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_check: no host memory");
  rmmc_status_t st = rmmc__ipc_decode(handle, f);
  bool verified;
  if (st == RMMC_SUCCESS) st = rmmc__exports_check(&f->ref, &verified);
  free(f);
  return st;
}

RMMC_API rmmc_status_t rmmc_ipc_get_stats(rmmc_ipc_stats_t *stats) {
  if (stats == NULL || stats->size < sizeof(rmmc_ipc_stats_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_get_stats: NULL, or its size is not set (RMMC_IPC_STATS_INIT)");
  pthread_mutex_lock(&imp_lock);
  stats->imports = n_imports;
  stats->open_bases = 0;
  for (base_t *b = bases; b != NULL; b = b->next) stats->open_bases += b->kind != 0;
  stats->opens = n_opens;
  stats->unverified = n_unverified;
  pthread_mutex_unlock(&imp_lock);
  stats->exports = rmmc__exports_live();
  return RMMC_SUCCESS;
}
