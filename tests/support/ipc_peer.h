/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The protocol between tests/test_gpu_ipc.c and its helper process
 * tests/ipc_peer.c, which the test starts with posix_spawn (a process that
 * has used CUDA cannot use it in a child it forks) and drives over a
 * SOCK_SEQPACKET socket: one command, then (for IMPORT and CHECK) a handle
 * with its descriptors sent by rmmc_ipc_send, then one reply; EXPORT
 * replies, then sends a handle of its own.
 */
#ifndef RMMC_TEST_IPC_PEER_H
#define RMMC_TEST_IPC_PEER_H

#include <stdint.h>

enum {
  PEER_IMPORT = 1, /* a handle follows; reply: status, value = the imported pointer */
  PEER_READ,       /* [ptr, ptr + bytes) holds pattern `tag`? value = words that differ */
  PEER_WRITE,      /* write pattern `tag` to [ptr, ptr + bytes), synchronized */
  PEER_CLOSE,      /* rmmc_ipc_close(ptr) */
  PEER_CHECK,      /* a handle follows; rmmc_ipc_check */
  PEER_STATS,      /* value[] = exports, imports, open_bases, opens, unverified */
  PEER_EXPORT,     /* allocate `bytes` from stack `spec`, fill pattern `tag`, export;
                      reply value = pointer, then the handle and descriptors */
  PEER_FREE,       /* free the block at ptr (bytes) of the peer's stack */
  PEER_DIE,        /* abort() at once, holding everything */
  PEER_EXIT,       /* reply, then exit(0) without closing anything */
};

typedef struct peer_cmd {
  uint32_t op;
  uint32_t pad;
  uint64_t ptr, bytes, tag;
  char spec[240];
} peer_cmd_t;

typedef struct peer_reply {
  int32_t status;
  uint32_t pad;
  uint64_t value[5];
  char message[1024];
} peer_reply_t;

#endif
