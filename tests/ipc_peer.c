/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The other process of tests/test_gpu_ipc.c (protocol in
 * tests/support/ipc_peer.h): imports what the test exports, reads and
 * writes it, closes it, exports blocks of its own, and dies on demand.
 * Usage: ipc_peer SOCKET_FD. Exits 0 when told to or when the socket
 * closes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc_peer.h"
#include "pattern.h"
#include "rmmc/rmmc.h"

static int sock;
static rmmc_resource_t *stack;

static void reply(int32_t status, const uint64_t *values) {
  peer_reply_t r;
  memset(&r, 0, sizeof r);
  r.status = status;
  if (values != NULL) memcpy(r.value, values, sizeof r.value);
  if (status != 0) snprintf(r.message, sizeof r.message, "%s", rmmc_last_error_message());
  if (send(sock, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r) exit(3);
}

static void fill(unsigned char *h, size_t n, uint64_t tag) {
  for (size_t w = 0; w * 8 < n; w++) {
    uint64_t v = pattern_word(tag, w);
    for (size_t j = 0; j < 8 && w * 8 + j < n; j++) h[w * 8 + j] = (unsigned char)(v >> (8 * j));
  }
}

static uint64_t differing_words(const unsigned char *h, size_t n, uint64_t tag) {
  uint64_t bad = 0;
  for (size_t w = 0; w * 8 < n; w++) {
    uint64_t v = pattern_word(tag, w);
    for (size_t j = 0; j < 8 && w * 8 + j < n; j++)
      if (h[w * 8 + j] != (unsigned char)(v >> (8 * j))) {
        bad++;
        break;
      }
  }
  return bad;
}

static int32_t cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  return rmmc_set_error(RMMC_ERROR_CUDA, "peer: %s: %s", what, cudaGetErrorString(e));
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  sock = atoi(argv[1]);
  static int fds[RMMC_IPC_MAX_FDS];
  for (;;) {
    peer_cmd_t c;
    ssize_t got = recv(sock, &c, sizeof c, 0);
    if (got == 0) return 0;
    if (got != (ssize_t)sizeof c) return 4;
    uint64_t v[5] = {0, 0, 0, 0, 0};
    rmmc_ipc_handle_t h;
    size_t n = 0;
    int32_t st = 0;
    switch (c.op) {
    case PEER_IMPORT:
    case PEER_CHECK: {
      st = rmmc_ipc_recv(sock, &h, fds, RMMC_IPC_MAX_FDS, &n);
      void *p = NULL;
      if (st == 0) st = c.op == PEER_IMPORT ? rmmc_ipc_import(&h, fds, n, &p) : rmmc_ipc_check(&h);
      for (size_t i = 0; i < n; i++) close(fds[i]);
      v[0] = (uint64_t)(uintptr_t)p;
      reply(st, v);
      break;
    }
    case PEER_READ:
    case PEER_WRITE: {
      unsigned char *buf = malloc(c.bytes);
      if (c.op == PEER_READ) {
        st = cuda_status(cudaMemcpy(buf, (void *)(uintptr_t)c.ptr, c.bytes, cudaMemcpyDefault),
                         "cudaMemcpy from the import");
        v[0] = st == 0 ? differing_words(buf, c.bytes, c.tag) : 0;
      } else {
        fill(buf, c.bytes, c.tag);
        st = cuda_status(cudaMemcpy((void *)(uintptr_t)c.ptr, buf, c.bytes, cudaMemcpyDefault),
                         "cudaMemcpy to the import");
        if (st == 0) st = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      }
      free(buf);
      reply(st, v);
      break;
    }
    case PEER_CLOSE:
      reply(rmmc_ipc_close((void *)(uintptr_t)c.ptr), v);
      break;
    case PEER_STATS: {
      rmmc_ipc_stats_t s = RMMC_IPC_STATS_INIT;
      st = rmmc_ipc_get_stats(&s);
      uint64_t w[5] = {s.exports, s.imports, s.open_bases, s.opens, s.unverified};
      reply(st, w);
      break;
    }
    case PEER_EXPORT: {
      void *p = NULL;
      if (stack == NULL) st = rmmc_stack_create(c.spec, 0, &stack);
      if (st == 0) st = rmmc_resource_allocate(stack, c.bytes, 256, NULL, &p);
      if (st == 0) {
        unsigned char *buf = malloc(c.bytes);
        fill(buf, c.bytes, c.tag);
        st = cuda_status(cudaMemcpy(p, buf, c.bytes, cudaMemcpyDefault), "cudaMemcpy");
        free(buf);
      }
      if (st == 0) st = rmmc_ipc_export(stack, p, &h, fds, RMMC_IPC_MAX_FDS, &n);
      v[0] = (uint64_t)(uintptr_t)p;
      reply(st, v);
      if (st == 0) {
        if (rmmc_ipc_send(sock, &h, fds, n) != 0) return 5;
        for (size_t i = 0; i < n; i++) close(fds[i]);
      }
      break;
    }
    case PEER_FREE:
      reply(rmmc_resource_deallocate(stack, (void *)(uintptr_t)c.ptr, c.bytes, 256, NULL), v);
      break;
    case PEER_DIE:
      abort();
    case PEER_EXIT:
      reply(0, v);
      _exit(0);
    default:
      return 6;
    }
  }
}
