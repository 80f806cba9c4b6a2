/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Handle bytes (ipc_handle.h) and the socket helpers that carry a handle
 * with its descriptors (include/rmmc/ipc.h). Host code only: no CUDA.
 *
 * On the socket, each message starts with a 16-byte header: magic "rIPC",
 * sequence number (u16), last-message flag (u16), descriptors in this
 * message (u32), payload bytes (u32). The first message's payload is the
 * handle's meaningful bytes; later messages carry only descriptors (at most
 * 240 a message: the kernel takes 253). On a stream socket the header is
 * read first, so that the descriptors attached to its first byte arrive with
 * it, then exactly the payload; on a datagram or seqpacket socket each
 * message is read whole.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/ipc_handle.h"

static const unsigned char magic[8] = {'r', 'm', 'm', 'c', 'I', 'P', 'C', 0};

static void put16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* FNV-1a over the meaningful bytes, the checksum's own 4 read as zeros. */
static uint32_t checksum(const unsigned char *b, size_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < len; i++) {
    h ^= (i >= 16 && i < 20) ? 0u : b[i];
    h *= UINT64_C(0x100000001b3);
  }
  return (uint32_t)(h ^ (h >> 32));
}

void rmmc__ipc_encode(const rmmc__ipc_fields_t *f, rmmc_ipc_handle_t *h) {
  unsigned char *b = h->bytes;
  memset(b, 0, sizeof h->bytes);
  size_t len = rmmc__ipc_length(f);
  memcpy(b, magic, 8);
  put16(b + 8, RMMC__IPC_VERSION);
  put16(b + 10, (uint16_t)f->kind);
  put32(b + 12, (uint32_t)len);
  put32(b + 20, (uint32_t)rmmc__ipc_nfds(f));
  put32(b + 24, f->ref.pid);
  put32(b + 28, (uint32_t)f->device);
  put32(b + 32, f->ref.table_fd);
  put64(b + 40, f->ref.table_id);
  put32(b + 48, f->ref.slot);
  put64(b + 56, f->ref.generation);
  memcpy(b + 64, f->uuid, 16);
  put64(b + 80, f->offset);
  put64(b + 88, f->bytes);
  put64(b + 96, f->origin);
  put64(b + 104, f->page);
  memcpy(b + 112, f->cuda, 64);
  put64(b + 176, f->origin_bytes);
  if (f->kind == RMMC_IPC_VM)
    for (uint32_t i = 0; i < f->nmappings; i++) put32(b + RMMC__IPC_HEADER + 4 * i, f->pages[i]);
  put32(b + 16, checksum(b, len));
}

static rmmc_status_t bad(const char *why) {
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "ipc: %s", why);
}

rmmc_status_t rmmc__ipc_decode(const rmmc_ipc_handle_t *h, rmmc__ipc_fields_t *f) {
  const unsigned char *b = h->bytes;
  if (memcmp(b, magic, 8) != 0)
    return bad("these bytes are not an rmmc IPC handle (no magic number at their start)");
  unsigned version = get16(b + 8);
  if (version != RMMC__IPC_VERSION)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc: the handle has version %u; this rmmc reads version %u (export "
                          "and import with the same rmmc)",
                          version, RMMC__IPC_VERSION);
  uint32_t len = get32(b + 12);
  if (len < RMMC__IPC_HEADER || len > RMMC_IPC_HANDLE_BYTES)
    return bad("the handle is damaged (its length is out of range)");
  if (checksum(b, len) != get32(b + 16))
    return bad("the handle is damaged (its checksum does not match: truncated or changed in "
               "transit?)");
  memset(f, 0, offsetof(rmmc__ipc_fields_t, pages));
  f->kind = (rmmc_ipc_kind_t)get16(b + 10);
  uint32_t nfds = get32(b + 20);
  f->ref.pid = get32(b + 24);
  f->device = (int32_t)get32(b + 28);
  f->ref.table_fd = get32(b + 32);
  f->ref.table_id = get64(b + 40);
  f->ref.slot = get32(b + 48);
  f->ref.generation = get64(b + 56);
  memcpy(f->uuid, b + 64, 16);
  f->offset = get64(b + 80);
  f->bytes = get64(b + 88);
  f->origin = get64(b + 96);
  f->page = get64(b + 104);
  memcpy(f->cuda, b + 112, 64);
  f->origin_bytes = get64(b + 176);
  if (f->kind != RMMC_IPC_CUDA && f->kind != RMMC_IPC_VM)
    return bad("the handle is damaged (unknown kind)");
  if (f->ref.slot == 0 || f->ref.generation == 0 || f->ref.pid == 0)
    return bad("the handle is damaged (no export slot or generation)");
  if (f->bytes == 0 || f->offset > f->origin_bytes || f->bytes > f->origin_bytes - f->offset)
    return bad("the handle is damaged (its range lies outside its origin)");
  if (f->kind == RMMC_IPC_CUDA) {
    if (nfds != 0 || len != RMMC__IPC_HEADER)
      return bad("the handle is damaged (a chunk's handle carries no descriptors)");
    return RMMC_SUCCESS;
  }
  if (nfds == 0 || nfds > RMMC_IPC_MAX_FDS || len != RMMC__IPC_HEADER + 4 * nfds)
    return bad("the handle is damaged (its count of descriptors does not match its length)");
  if (f->page == 0 || (f->page & (f->page - 1)) != 0)
    return bad("the handle is damaged (its page size is not a power of two)");
  f->nmappings = nfds;
  uint64_t total = 0;
  for (uint32_t i = 0; i < nfds; i++) {
    f->pages[i] = get32(b + RMMC__IPC_HEADER + 4 * i);
    if (f->pages[i] == 0) return bad("the handle is damaged (a mapping of 0 pages)");
    total += f->pages[i];
  }
  if (total > UINT64_MAX / f->page || total * f->page != f->origin_bytes)
    return bad("the handle is damaged (its mappings do not add up to its origin)");
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_ipc_handle_info(const rmmc_ipc_handle_t *handle,
                                            rmmc_ipc_info_t *info) {
  if (handle == NULL || info == NULL || info->size < sizeof(rmmc_ipc_info_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_handle_info: NULL, or the info's size is not set (initialize it "
                          "with RMMC_IPC_INFO_INIT)");
  rmmc__ipc_fields_t *f = malloc(sizeof *f);
  if (f == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_handle_info: no host memory");
  rmmc_status_t st = rmmc__ipc_decode(handle, f);
  if (st == RMMC_SUCCESS) {
    info->kind = f->kind;
    info->bytes = f->bytes;
    info->nfds = rmmc__ipc_nfds(f);
    info->handle_bytes = rmmc__ipc_length(f);
    info->exporter_pid = (int)f->ref.pid;
    info->exporter_device = f->device;
    memcpy(info->device_uuid, f->uuid, 16);
    info->generation = f->ref.generation;
  }
  free(f);
  return st;
}

/* ---- over a socket ---- */

#define BATCH 240
#define WIRE_MAGIC 0x43504972u /* "rIPC" */

typedef struct wire {
  unsigned char b[16];
} wire_t;

static void wire_put(wire_t *w, uint16_t seq, bool last, uint32_t nfds, uint32_t payload) {
  put32(w->b, WIRE_MAGIC);
  put16(w->b + 4, seq);
  put16(w->b + 6, last ? 1 : 0);
  put32(w->b + 8, nfds);
  put32(w->b + 12, payload);
}

static rmmc_status_t io_error(const char *what, int err) {
  return rmmc_set_error(RMMC_ERROR_IO, "ipc: %s: %s", what, strerror(err));
}

static bool is_stream(int sock) {
  int type = 0;
  socklen_t len = sizeof type;
  return getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type == SOCK_STREAM;
}

/* Sends one message: header, payload, descriptors; a stream socket may
 * take it in parts (the descriptors go with its first byte). */
static rmmc_status_t send_message(int sock, const wire_t *w, const void *payload, size_t len,
                                  const int *fds, size_t nfds) {
  union {
    char buf[CMSG_SPACE(BATCH * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov[2] = {{(void *)w->b, sizeof w->b}, {(void *)payload, len}};
  struct msghdr m = {0};
  m.msg_iov = iov;
  m.msg_iovlen = len > 0 ? 2 : 1;
  if (nfds > 0) {
    memset(&ctl, 0, sizeof ctl);
    m.msg_control = ctl.buf;
    m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do n = sendmsg(sock, &m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) return io_error("sending the handle failed", errno);
  size_t total = sizeof w->b + len, done = (size_t)n;
  while (done < total) { /* a stream socket took part of it: the rest, no descriptors */
    const unsigned char *at = done < sizeof w->b
                                  ? w->b + done
                                  : (const unsigned char *)payload + (done - sizeof w->b);
    size_t left = done < sizeof w->b ? sizeof w->b - done : total - done;
    do n = send(sock, at, left, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0) return io_error("sending the handle failed", errno);
    done += (size_t)n;
  }
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_ipc_send(int sock, const rmmc_ipc_handle_t *handle, const int *fds,
                                     size_t nfds) {
  if (handle == NULL || (nfds > 0 && fds == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "ipc_send: NULL handle or descriptors");
  rmmc__ipc_fields_t *f = malloc(sizeof *f);
  if (f == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc_send: no host memory");
  rmmc_status_t st = rmmc__ipc_decode(handle, f);
  size_t want = 0, len = 0;
  if (st == RMMC_SUCCESS) {
    want = rmmc__ipc_nfds(f);
    len = rmmc__ipc_length(f);
  }
  free(f);
  if (st != RMMC_SUCCESS) return st;
  if (nfds != want)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_send: the handle travels with %zu descriptors, not %zu", want, nfds);
  size_t sent = 0;
  uint16_t seq = 0;
  do {
    size_t k = nfds - sent < BATCH ? nfds - sent : BATCH;
    wire_t w;
    wire_put(&w, seq, sent + k == nfds, (uint32_t)k, seq == 0 ? (uint32_t)len : 0);
    st = send_message(sock, &w, seq == 0 ? handle->bytes : NULL, seq == 0 ? len : 0, fds + sent, k);
    sent += k;
    seq++;
  } while (st == RMMC_SUCCESS && sent < nfds);
  return st;
}

/* Reads exactly len bytes (stream sockets). */
static rmmc_status_t read_all(int sock, void *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(sock, (char *)buf + done, len - done, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("receiving a handle failed", errno);
    if (n == 0)
      return rmmc_set_error(RMMC_ERROR_IO,
                            "ipc: the peer closed the socket in the middle of a handle");
    done += (size_t)n;
  }
  return RMMC_SUCCESS;
}

typedef struct inbox {
  int *fds;
  size_t max, n, dropped;
} inbox_t;

/* Takes the descriptors of a received message: into the inbox while it has
 * room, closed past it. */
static void take_fds(struct msghdr *m, inbox_t *in) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c != NULL; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (in->n < in->max) in->fds[in->n++] = fd;
      else close(fd), in->dropped++;
    }
  }
}

/* Receives one message: its header in *w, its payload into payload (room
 * `room`), its descriptors into the inbox. *got: descriptors it brought. */
static rmmc_status_t recv_message(int sock, bool stream, wire_t *w, void *payload, size_t room,
                                  inbox_t *in, size_t *got, size_t *payload_len) {
  union {
    char buf[CMSG_SPACE(253 * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov[2] = {{w->b, sizeof w->b}, {payload, room}};
  struct msghdr m = {0};
  m.msg_iov = iov;
  m.msg_iovlen = stream || room == 0 ? 1 : 2;
  m.msg_control = ctl.buf;
  m.msg_controllen = sizeof ctl.buf;
  size_t before = in->n + in->dropped;
  ssize_t n;
  do n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return io_error("receiving a handle failed", errno);
  take_fds(&m, in);
  *got = in->n + in->dropped - before;
  if (n == 0)
    return rmmc_set_error(RMMC_ERROR_IO, "ipc: the peer closed the socket before a handle came");
  if (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC))
    return rmmc_set_error(RMMC_ERROR_PARSE,
                          "ipc: a message on the socket was cut short (not one rmmc_ipc_send "
                          "wrote)");
  size_t have = (size_t)n;
  if (stream && have < sizeof w->b) {
    rmmc_status_t st = read_all(sock, w->b + have, sizeof w->b - have);
    if (st != RMMC_SUCCESS) return st;
    have = sizeof w->b;
  }
  if (have < sizeof w->b || get32(w->b) != WIRE_MAGIC)
    return rmmc_set_error(RMMC_ERROR_PARSE,
                          "ipc: what came on the socket is not a handle rmmc_ipc_send wrote");
  *payload_len = get32(w->b + 12);
  if (*payload_len > room)
    return rmmc_set_error(RMMC_ERROR_PARSE, "ipc: a message on the socket claims %zu bytes",
                          *payload_len);
  if (stream) return read_all(sock, payload, *payload_len);
  if (have - sizeof w->b != *payload_len)
    return rmmc_set_error(RMMC_ERROR_PARSE, "ipc: a message on the socket has the wrong length");
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_ipc_recv(int sock, rmmc_ipc_handle_t *handle, int *fds,
                                     size_t max_fds, size_t *nfds) {
  if (nfds != NULL) *nfds = 0;
  if (handle == NULL || nfds == NULL || (max_fds > 0 && fds == NULL))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc_recv: NULL handle, descriptors or count");
  bool stream = is_stream(sock);
  inbox_t in = {fds, max_fds, 0, 0};
  memset(handle->bytes, 0, sizeof handle->bytes);
  rmmc_status_t st = RMMC_SUCCESS;
  size_t expected = 0;
  for (uint16_t seq = 0;; seq++) {
    wire_t w;
    size_t got = 0, len = 0;
    st = recv_message(sock, stream, &w, seq == 0 ? handle->bytes : NULL,
                      seq == 0 ? sizeof handle->bytes : 0, &in, &got, &len);
    if (st != RMMC_SUCCESS) break;
    if (get16(w.b + 4) != seq || got != get32(w.b + 8) || (seq == 0) != (len > 0)) {
      st = rmmc_set_error(RMMC_ERROR_PARSE,
                          "ipc: message %u on the socket is out of order or lost descriptors "
                          "(%zu came, %u announced)",
                          (unsigned)seq, got, get32(w.b + 8));
      break;
    }
    if (seq == 0) {
      rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
      st = rmmc_ipc_handle_info(handle, &info);
      if (st != RMMC_SUCCESS) break;
      expected = info.nfds;
    }
    if (get16(w.b + 6) != 0) break;
  }
  if (st == RMMC_SUCCESS && in.n + in.dropped != expected)
    st = rmmc_set_error(RMMC_ERROR_PARSE,
                        "ipc: %zu descriptors came with a handle that needs %zu",
                        in.n + in.dropped, expected);
  if (st == RMMC_SUCCESS && in.dropped > 0)
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "ipc_recv: the handle came with %zu descriptors, room for %zu (the "
                        "rest were closed)",
                        in.n + in.dropped, max_fds);
  if (st != RMMC_SUCCESS) {
    for (size_t i = 0; i < in.n; i++) close(in.fds[i]);
    return st;
  }
  *nfds = in.n;
  return RMMC_SUCCESS;
}
