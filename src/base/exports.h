/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The exporter's registry of blocks shared with other processes (internal;
 * include/rmmc/ipc.h has the contract).
 *
 * Each exported block holds one slot of a table that lives in shared
 * memory (a memfd of this process): the slot's word is the export's
 * generation while it is live and 0 once it is revoked. A handle names the
 * table (this process's pid, the memfd's descriptor number and a random
 * table id) and the slot and generation, so an importer can read the word
 * through /proc/PID/fd/FD and see a stale handle without asking us. A
 * generation is never reused in a process; a slot is reused once revoked.
 *
 * Revocation happens when the block is freed through
 * rmmc_resource_deallocate (the dispatch checks rmmc__exports_count, one
 * relaxed load, and calls rmmc__exports_on_free only while exports are
 * live), when the layer that handed the block out is destroyed, or on an
 * explicit rmmc_ipc_revoke(). Thread-safe (one mutex; a counting filter
 * keeps frees of blocks never exported off it).
 */
#ifndef RMMC_EXPORTS_H
#define RMMC_EXPORTS_H

#include "base/internal.h"

/* Live exports in this process (atomic; read relaxed on every free). */
extern int rmmc__exports_count;

/* Where a handle finds its export. */
typedef struct rmmc__export_ref {
  uint32_t pid;      /* the exporting process */
  uint32_t table_fd; /* its descriptor of the table's memfd */
  uint64_t table_id; /* random, in the table's header */
  uint32_t slot;
  uint64_t generation;
} rmmc__export_ref_t;

/* Registers (or finds, if it is live already) the export of the block at
 * `base` (`bytes`, handed out by `owner`; `user` the pointer the caller
 * exported, which may lie inside it) and fills *ref. The table is made on
 * the first export. RMMC_ERROR_OUT_OF_MEMORY when 65535 blocks are
 * exported at once or memory for the table runs out; RMMC_ERROR_IO if the
 * memfd cannot be made. */
rmmc_status_t rmmc__exports_add(const void *base, const void *user, size_t bytes,
                                const rmmc_resource_t *owner, rmmc__export_ref_t *ref);

/* A free of `ptr` is about to happen: revokes the export of the block at
 * ptr (its base or the pointer it was exported by), if any. */
void rmmc__exports_on_free(const void *ptr);

/* `owner` is being destroyed: revokes every export of its blocks. */
void rmmc__exports_forget_owner(const rmmc_resource_t *owner);

/* Revokes the export of the block holding ptr (its base or exported
 * pointer); RMMC_ERROR_UNKNOWN_POINTER if none is live. */
rmmc_status_t rmmc__exports_revoke(const void *ptr);

/* Is the export `ref` still live? RMMC_SUCCESS (also, with *verified
 * false, when the exporter's table cannot be read: another user, a
 * process that forbids it); RMMC_ERROR_STALE when its block was freed or
 * revoked or its exporter has exited (the message says which). Reads this
 * process's table directly, another's through /proc (cached per table). */
rmmc_status_t rmmc__exports_check(const rmmc__export_ref_t *ref, bool *verified);

/* Live exports, and this process's table (pid 0 before the first export). */
size_t rmmc__exports_live(void);
void rmmc__exports_table(uint32_t *pid, uint32_t *fd, uint64_t *id);

#endif /* RMMC_EXPORTS_H */
