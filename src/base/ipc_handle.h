/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bytes of an rmmc_ipc_handle_t (internal): one fixed little-endian
 * layout, written by rmmc__ipc_encode and checked field by field by
 * rmmc__ipc_decode, so a handle from any build of this version reads the
 * same everywhere and damaged or foreign bytes are refused, not trusted.
 *
 *   0   8  magic "rmmcIPC\0"       104  8  page (pages: size unit)
 *   8   2  version (1)              112 64  CUDA IPC handle (chunks)
 *   10  2  kind                     176  8  origin bytes, 184 8 zero
 *   12  4  length (meaningful bytes)192 4n  pages: each mapping's size
 *   16  4  checksum (FNV-1a)                in pages, in address order
 *   20  4  descriptors (pages: n)
 *   24  4  exporter pid             36  4  zero
 *   28  4  exporter device ordinal  40  8  export table id
 *   32  4  export table descriptor  48  4  slot, 52 4 zero
 *   56  8  generation               64 16  device UUID
 *   80  8  offset of the exported pointer in the origin
 *   88  8  bytes from it to the block's end
 *   96  8  origin: the exporter's address of the chunk or first mapping
 *   (the origin's bytes: the chunk's size, or for pages page x the pages
 *   listed, which decode checks.)
 */
#ifndef RMMC_IPC_HANDLE_H
#define RMMC_IPC_HANDLE_H

#include "base/exports.h"
#include "rmmc/ipc.h"

#define RMMC__IPC_HEADER 192u
#define RMMC__IPC_VERSION 1u

typedef struct rmmc__ipc_fields {
  rmmc_ipc_kind_t kind;
  rmmc__export_ref_t ref;
  int32_t device;
  uint8_t uuid[16];
  uint64_t offset, bytes;    /* the exported pointer in the origin; bytes to the block's end */
  uint64_t origin, origin_bytes;
  uint64_t page;             /* pages: the unit of pages[] */
  uint8_t cuda[64];          /* chunks: cudaIpcMemHandle_t */
  uint32_t nmappings;        /* pages: descriptors */
  uint32_t pages[RMMC_IPC_MAX_FDS];
} rmmc__ipc_fields_t;

/* Writes f into h (the rest of h zeroed). f must be consistent (decode's
 * checks); the encoder does not check. */
void rmmc__ipc_encode(const rmmc__ipc_fields_t *f, rmmc_ipc_handle_t *h);

/* Reads and checks h into f: RMMC_ERROR_INVALID_ARGUMENT naming the first
 * problem (not a handle, newer version, damaged, inconsistent). */
rmmc_status_t rmmc__ipc_decode(const rmmc_ipc_handle_t *h, rmmc__ipc_fields_t *f);

/* The meaningful bytes of a handle with these fields. */
static inline size_t rmmc__ipc_length(const rmmc__ipc_fields_t *f) {
  return RMMC__IPC_HEADER + (f->kind == RMMC_IPC_VM ? 4u * f->nmappings : 0u);
}

static inline size_t rmmc__ipc_nfds(const rmmc__ipc_fields_t *f) {
  return f->kind == RMMC_IPC_VM ? f->nmappings : 0;
}

/* The cudaMalloc allocation that holds ptr, a block of r's stack (ipc.c):
 * what PyTorch's getBaseAllocation asks. RMMC_ERROR_NOT_SUPPORTED for
 * pages or memory of another kind; the get_allocation statuses. */
rmmc_status_t rmmc__ipc_base_allocation(rmmc_resource_t *r, const void *ptr, void **base,
                                        size_t *bytes);

#endif /* RMMC_IPC_HANDLE_H */
