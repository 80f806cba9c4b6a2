/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sharing device memory between processes on one machine.
 *
 * One process exports a block it allocated through rmmc; the handle (plain
 * bytes: send it over any channel) and, for virtual-memory pages, file
 * descriptors (send them over a UNIX socket: rmmc_ipc_send/recv) go to
 * another process, which imports them and gets a device pointer to the
 * same memory. What travels depends on what lies under the block:
 *
 *   chunks of cudaMalloc memory (`pool(expandable=false) > cuda`, a plain
 *   `cuda` resource): the CUDA IPC handle (cudaIpcGetMemHandle) of the
 *   chunk and the block's offset in it; no descriptor. The importer opens
 *   each chunk once (cudaIpcOpenMemHandle with
 *   cudaIpcMemLazyEnablePeerAccess) and shares it between every import of
 *   blocks in it; the chunk is closed when its last import is.
 *
 *   pages of an expandable pool over `cuda(ipc=true)`: one POSIX file
 *   descriptor per mapping under the block (cuMemExportToShareableHandle;
 *   a block of N bytes lies on about N / page + 1 mappings, 32 MiB each by
 *   default), which the importer maps in order into address space of its
 *   own (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess). Each
 *   export is mapped once however often it is imported. The cuda resource
 *   must create its memory shareable: `cuda(ipc=true)` or
 *   rmmc_cuda_resource_create_with_options() with ipc set.
 *
 * Memory of any other kind (host, pinned, managed, cuda_async, sim) or
 * under a layer that cannot tell which block holds a pointer (fixed_size,
 * binning) cannot be exported: RMMC_ERROR_NOT_SUPPORTED, naming it. The
 * arena is a pool and exports as one.
 *
 * Lifetime and staleness. An export lasts until its block is freed through
 * rmmc_resource_deallocate() (on any stack the block belongs to), the layer
 * that handed it out is destroyed, or rmmc_ipc_revoke() is called; then its
 * handles are stale. The exporter keeps a registry of its exports (a table
 * in shared memory, one slot and generation number per exported block)
 * that an importer reads before it opens anything: importing, or checking
 * (rmmc_ipc_check), a stale handle gives RMMC_ERROR_STALE, as does a handle
 * whose exporter has exited. What cannot be detected: a block freed after
 * the importer's check (use the memory only while the exporter keeps it:
 * agree on that over your channel, as PyTorch's reference counts do); a
 * block freed by a path that bypasses rmmc_resource_deallocate (a layer
 * freeing its upstream's block itself) and reallocated at the same
 * address with the same size; an exporter whose table the importer may not
 * read (another user, or a process made undumpable): then the handle is
 * trusted, and CUDA itself refuses chunks already given back. Imported
 * memory stays valid in the importer until it closes the import, even if
 * the exporter frees it (the driver keeps it until both let go); a process
 * that dies holding imports leaks nothing (the driver drops them).
 *
 * Streams. Import and export order nothing: make the importer wait for the
 * exporter's work on the block (an IPC event, cudaIpcGetEventHandle, or
 * synchronize before sending) and free the block only after the importer
 * is done with it.
 *
 * Thread-safe. A process that called CUDA cannot use CUDA in a child it
 * forks (start the child first, or exec); a forked child starts with no
 * exports of its own.
 */
#ifndef RMMC_IPC_H
#define RMMC_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A handle's size. Only its first rmmc_ipc_info_t.handle_bytes bytes
 * matter (192 for chunks, 192 + 4 per descriptor for pages): a channel may
 * carry those alone. */
#define RMMC_IPC_HANDLE_BYTES 4096

/* The most descriptors one handle carries: a block on more mappings cannot
 * be exported (raise the pool's page option). */
#define RMMC_IPC_MAX_FDS 976

/* An exported block: plain bytes, valid in any process on this machine. */
typedef struct rmmc_ipc_handle {
  unsigned char bytes[RMMC_IPC_HANDLE_BYTES];
} rmmc_ipc_handle_t;

/* What kind of memory a handle shares. */
typedef enum rmmc_ipc_kind {
  RMMC_IPC_CUDA = 1, /* a cudaMalloc allocation: a CUDA IPC handle, no descriptor */
  RMMC_IPC_VM = 2,   /* virtual-memory pages: one descriptor per mapping */
} rmmc_ipc_kind_t;

/* What a handle says about itself (rmmc_ipc_handle_info). */
typedef struct rmmc_ipc_info {
  size_t size;          /* sizeof(rmmc_ipc_info_t): RMMC_IPC_INFO_INIT */
  rmmc_ipc_kind_t kind;
  size_t bytes;         /* bytes from the exported pointer to its block's end */
  size_t nfds;          /* descriptors that travel with it */
  size_t handle_bytes;  /* the meaningful bytes at its start */
  int exporter_pid;     /* the exporting process */
  int exporter_device;  /* the device's ordinal there */
  unsigned char device_uuid[16]; /* the device (ordinals differ between processes) */
  uint64_t generation;  /* of the export (a block exported anew gets a new one) */
} rmmc_ipc_info_t;

#define RMMC_IPC_INFO_INIT {sizeof(rmmc_ipc_info_t), (rmmc_ipc_kind_t)0, 0, 0, 0, 0, 0, {0}, 0}

/* Exports the block of r's stack that holds `ptr` (a pointer r handed out,
 * or any pointer inside one) into *handle, and writes the descriptors it
 * needs to fds[0 .. *nfds) (for RMMC_IPC_VM: open descriptors the caller
 * owns: send them with the handle, then close them). The importer's pointer
 * will correspond to ptr. Exporting a block again gives the same export
 * (new descriptors, close-on-exec). RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for NULL
 * arguments or room for fewer descriptors than needed (*nfds then says how
 * many); RMMC_ERROR_UNKNOWN_POINTER when no live block of r holds ptr;
 * RMMC_ERROR_NOT_SUPPORTED for memory that cannot be shared (see above;
 * the message says why and what would); RMMC_ERROR_CUDA when the driver
 * refuses; RMMC_ERROR_NO_DEVICE without a GPU. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_export(rmmc_resource_t *r, const void *ptr,
                                          rmmc_ipc_handle_t *handle, int *fds, size_t max_fds,
                                          size_t *nfds);

/* Makes every handle of the block holding `ptr` (its first byte, or the
 * pointer it was exported by) stale now, as freeing it would.
 * RMMC_ERROR_UNKNOWN_POINTER if no export of it is live. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_revoke(const void *ptr);

/* Imports a handle (with the descriptors that came with it, which stay the
 * caller's to close) and stores a device pointer to the exported memory in
 * *out, valid until rmmc_ipc_close(*out). The device is found by its UUID,
 * whatever its ordinal here. Importing a handle again, or another block of
 * the same chunk, reuses what is open. In the exporting process itself it
 * returns the exporter's own pointer. RMMC_SUCCESS;
 * RMMC_ERROR_INVALID_ARGUMENT for NULL arguments, bytes that are not an
 * intact rmmc handle, or descriptors not matching it; RMMC_ERROR_STALE when
 * the block was freed or revoked or the exporter has exited;
 * RMMC_ERROR_NO_DEVICE when this process does not see the device;
 * RMMC_ERROR_CUDA when the driver refuses. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_import(const rmmc_ipc_handle_t *handle, const int *fds,
                                          size_t nfds, void **out);

/* Ends an import (a pointer rmmc_ipc_import returned; each import needs
 * one close); the memory is unmapped with its last import.
 * RMMC_ERROR_UNKNOWN_POINTER for another pointer; RMMC_ERROR_CUDA if the
 * driver refuses to unmap. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_close(void *ptr);

/* Is the export behind `handle` still live? RMMC_SUCCESS (also when the
 * exporter's registry cannot be read: see above); RMMC_ERROR_STALE with
 * why; RMMC_ERROR_INVALID_ARGUMENT for bytes that are not an intact handle.
 * Opens nothing. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_check(const rmmc_ipc_handle_t *handle);

/* Decodes what a handle says about itself into *info (set its size with
 * RMMC_IPC_INFO_INIT). RMMC_ERROR_INVALID_ARGUMENT for NULL, a bad size, or
 * bytes that are not an intact rmmc handle (the message says what is
 * wrong: not a handle, damaged, or made by a newer rmmc). */
RMMC_EXPORT rmmc_status_t rmmc_ipc_handle_info(const rmmc_ipc_handle_t *handle,
                                               rmmc_ipc_info_t *info);

/* ---- passing a handle and its descriptors over a UNIX socket ----
 *
 * rmmc_ipc_send writes the handle's meaningful bytes and its descriptors
 * (SCM_RIGHTS, in batches of at most 240 per message) to a connected
 * AF_UNIX socket (SOCK_STREAM, SOCK_SEQPACKET or SOCK_DGRAM); nfds must be
 * what the handle says. The sender keeps its descriptors (close them after).
 * rmmc_ipc_recv reads one handle and its descriptors (received close-on-
 * exec; the caller closes them) into fds (room for max_fds) and *nfds.
 * Both retry on EINTR and block. RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT
 * for NULL arguments, a handle that does not decode, nfds not matching it,
 * or more descriptors arriving than fit (those are closed); RMMC_ERROR_IO
 * when the socket fails or the peer closes it first (nothing is kept: the
 * descriptors received so far are closed); RMMC_ERROR_PARSE when what
 * arrives is not what rmmc_ipc_send writes. Thread-safe per socket as a
 * socket is (one sender and one receiver at a time). */
RMMC_EXPORT rmmc_status_t rmmc_ipc_send(int socket, const rmmc_ipc_handle_t *handle,
                                        const int *fds, size_t nfds);
RMMC_EXPORT rmmc_status_t rmmc_ipc_recv(int socket, rmmc_ipc_handle_t *handle, int *fds,
                                        size_t max_fds, size_t *nfds);

/* This process's exports and imports (rmmc_ipc_get_stats). */
typedef struct rmmc_ipc_stats {
  size_t size;          /* sizeof(rmmc_ipc_stats_t): RMMC_IPC_STATS_INIT */
  uint64_t exports;     /* exports live now (blocks with live handles) */
  uint64_t imports;     /* imports not yet closed */
  uint64_t open_bases;  /* chunks and page mappings open for them now */
  uint64_t opens;       /* chunks and page mappings ever opened (cache misses) */
  uint64_t unverified;  /* imports whose exporter's registry could not be read */
} rmmc_ipc_stats_t;

#define RMMC_IPC_STATS_INIT {sizeof(rmmc_ipc_stats_t), 0, 0, 0, 0, 0}

/* Fills *stats. RMMC_ERROR_INVALID_ARGUMENT for NULL or a bad size. */
RMMC_EXPORT rmmc_status_t rmmc_ipc_get_stats(rmmc_ipc_stats_t *stats);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_IPC_H */
