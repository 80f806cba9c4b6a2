/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sharing between processes, the parts that need no GPU: handle bytes
 * (round trips of both kinds, every way a handle can be damaged), the
 * SCM_RIGHTS helpers over stream, seqpacket and datagram sockets with
 * memfds (descriptors arrive and refer to the same files; batches past the
 * kernel's limit; every failure closes what came and leaks nothing), the
 * exporter's registry (live, freed through the dispatch, owner destroyed,
 * revoked, re-exported, slot reused; checked from another process through
 * /proc, and after that process exits), importing one's own export,
 * exports refused for memory that cannot be shared (host, managed, pinned,
 * a layer that cannot tell), and bad arguments. Linked against librmmc.a:
 * it calls the registry and the handle encoder (internal) beside the
 * public calls. Host suite.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "base/exports.h"
#include "base/ipc_handle.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own */
}

/* Fields of a consistent handle of either kind. */
static rmmc__ipc_fields_t *fields(rmmc_ipc_kind_t kind, uint32_t n) {
  rmmc__ipc_fields_t *f = calloc(1, sizeof *f);
  f->kind = kind;
  f->ref = (rmmc__export_ref_t){(uint32_t)getpid(), 7, 0x1234567890abcdefull, 3, 42};
  f->device = 1;
  for (int i = 0; i < 16; i++) f->uuid[i] = (uint8_t)(0xA0 + i);
  if (kind == RMMC_IPC_CUDA) {
    for (int i = 0; i < 64; i++) f->cuda[i] = (uint8_t)i;
    f->origin = 0x7f0000000000;
    f->origin_bytes = 32 * MiB;
    f->offset = 4096;
    f->bytes = MiB;
  } else {
    f->page = 2 * MiB;
    f->nmappings = n;
    for (uint32_t i = 0; i < n; i++) f->pages[i] = 1 + i % 16;
    for (uint32_t i = 0; i < n; i++) f->origin_bytes += f->pages[i] * f->page;
    f->origin = 0x7f0000000000;
    f->offset = 256;
    f->bytes = f->origin_bytes - 256;
  }
  return f;
}

static rmmc_ipc_handle_t *encoded(const rmmc__ipc_fields_t *f) {
  rmmc_ipc_handle_t *h = malloc(sizeof *h);
  rmmc__ipc_encode(f, h);
  return h;
}

/* ---- handle bytes ---- */

START_TEST(test_handle_round_trip) {
  uint32_t counts[] = {0, 1, 17, RMMC_IPC_MAX_FDS};
  for (int c = 0; c < 4; c++) {
    rmmc_ipc_kind_t kind = counts[c] == 0 ? RMMC_IPC_CUDA : RMMC_IPC_VM;
    rmmc__ipc_fields_t *f = fields(kind, counts[c]), *g = calloc(1, sizeof *g);
    rmmc_ipc_handle_t *h = encoded(f);
    ck_assert_int_eq(rmmc__ipc_decode(h, g), RMMC_SUCCESS);
    ck_assert_int_eq(g->kind, kind);
    ck_assert_mem_eq(&g->ref, &f->ref, sizeof f->ref);
    ck_assert_int_eq(g->device, 1);
    ck_assert_mem_eq(g->uuid, f->uuid, 16);
    ck_assert_uint_eq(g->offset, f->offset);
    ck_assert_uint_eq(g->bytes, f->bytes);
    ck_assert_uint_eq(g->origin, f->origin);
    ck_assert_uint_eq(g->origin_bytes, f->origin_bytes);
    ck_assert_uint_eq(g->nmappings, f->nmappings);
    if (kind == RMMC_IPC_CUDA) ck_assert_mem_eq(g->cuda, f->cuda, 64);
    for (uint32_t i = 0; i < f->nmappings; i++) ck_assert_uint_eq(g->pages[i], f->pages[i]);
    rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
    ck_assert_int_eq(rmmc_ipc_handle_info(h, &info), RMMC_SUCCESS);
    ck_assert_int_eq(info.kind, kind);
    ck_assert_uint_eq(info.nfds, counts[c]);
    ck_assert_uint_eq(info.handle_bytes, 192 + 4 * (size_t)counts[c]);
    ck_assert_uint_eq(info.bytes, f->bytes);
    ck_assert_int_eq(info.exporter_pid, getpid());
    ck_assert_int_eq(info.exporter_device, 1);
    ck_assert_uint_eq(info.generation, 42);
    ck_assert_mem_eq(info.device_uuid, f->uuid, 16);
    /* Bytes past the meaningful ones do not matter. */
    if (info.handle_bytes < RMMC_IPC_HANDLE_BYTES) {
      h->bytes[RMMC_IPC_HANDLE_BYTES - 1] ^= 0xff;
      ck_assert_int_eq(rmmc__ipc_decode(h, g), RMMC_SUCCESS);
    }
    free(h);
    free(f);
    free(g);
  }
}
END_TEST

static void expect_damaged(const rmmc_ipc_handle_t *h, const char *needle) {
  rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
  ck_assert_int_eq(rmmc_ipc_handle_info(h, &info), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s' lacks '%s'",
                rmmc_last_error_message(), needle);
  ck_assert_int_eq(rmmc_ipc_check(h), RMMC_ERROR_INVALID_ARGUMENT);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_ipc_import(h, NULL, 0, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
}

START_TEST(test_handle_damage) {
  rmmc__ipc_fields_t *f = fields(RMMC_IPC_VM, 5);
  rmmc_ipc_handle_t *h = encoded(f);
  rmmc_ipc_handle_t bad;
  memset(&bad, 0, sizeof bad);
  expect_damaged(&bad, "not an rmmc IPC handle");
  /* Each meaningful byte flipped in turn: always refused. */
  for (size_t i = 0; i < 192 + 4 * 5; i++) {
    bad = *h;
    bad.bytes[i] ^= 0x40;
    rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
    ck_assert_msg(rmmc_ipc_handle_info(&bad, &info) == RMMC_ERROR_INVALID_ARGUMENT,
                  "byte %zu flipped was accepted", i);
  }
  bad = *h;
  bad.bytes[8] = 2; /* version 2: read as newer */
  expect_damaged(&bad, "version 2");
  bad = *h;
  bad.bytes[100] ^= 1;
  expect_damaged(&bad, "checksum");
  /* Consistent checksums over inconsistent fields. */
  rmmc__ipc_fields_t *g = fields(RMMC_IPC_VM, 5);
  g->kind = (rmmc_ipc_kind_t)9;
  rmmc_ipc_handle_t *e = encoded(g);
  expect_damaged(e, "unknown kind");
  free(e);
  g->kind = RMMC_IPC_VM;
  g->pages[2] = 0;
  e = encoded(g);
  expect_damaged(e, "0 pages");
  free(e);
  g->pages[2] = 4; /* fields() made it 3 */
  e = encoded(g);
  expect_damaged(e, "do not add up");
  free(e);
  free(g);
  g = fields(RMMC_IPC_VM, 5);
  g->page = 3 * MiB;
  e = encoded(g);
  expect_damaged(e, "power of two");
  free(e);
  free(g);
  g = fields(RMMC_IPC_CUDA, 0);
  g->bytes = g->origin_bytes;
  e = encoded(g);
  expect_damaged(e, "outside its origin");
  free(e);
  g->bytes = 10;
  g->ref.generation = 0;
  e = encoded(g);
  expect_damaged(e, "no export slot");
  free(e);
  free(g);
  free(h);
  free(f);
  rmmc_ipc_info_t small = RMMC_IPC_INFO_INIT;
  small.size = 4;
  ck_assert_int_eq(rmmc_ipc_handle_info(&bad, &small), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_handle_info(NULL, &small), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

/* ---- sockets ---- */

static int memfd_with(unsigned v) {
  int fd = memfd_create("t", MFD_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, &v, sizeof v), (ssize_t)sizeof v);
  return fd;
}

static unsigned memfd_value(int fd) {
  unsigned v = 0;
  ck_assert_int_eq(pread(fd, &v, sizeof v, 0), (ssize_t)sizeof v);
  return v;
}

static void raise_fd_limit(void) {
  struct rlimit r;
  getrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_cur < 4096 && r.rlim_max >= 4096) r.rlim_cur = 4096;
  setrlimit(RLIMIT_NOFILE, &r);
}

/* Send n memfds with a handle on a socket of `type`; they arrive in order,
 * refer to the same files (same inode, same contents), close-on-exec. */
static void round_trip(int type, uint32_t n) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, type, 0, sv), 0);
  int before = open_fds();
  rmmc__ipc_fields_t *f = fields(n ? RMMC_IPC_VM : RMMC_IPC_CUDA, n);
  rmmc_ipc_handle_t *h = encoded(f), got;
  int *fds = malloc((n + 1) * sizeof *fds), *in = malloc(RMMC_IPC_MAX_FDS * sizeof *in);
  for (uint32_t i = 0; i < n; i++) fds[i] = memfd_with(1000 + i);
  ck_assert_msg(rmmc_ipc_send(sv[0], h, fds, n) == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  size_t k = 99;
  ck_assert_msg(rmmc_ipc_recv(sv[1], &got, in, RMMC_IPC_MAX_FDS, &k) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(k, n);
  ck_assert_mem_eq(got.bytes, h->bytes, 192 + 4 * (size_t)n);
  for (uint32_t i = 0; i < n; i++) {
    struct stat a, b;
    ck_assert_int_eq(fstat(fds[i], &a), 0);
    ck_assert_int_eq(fstat(in[i], &b), 0);
    ck_assert_uint_eq(a.st_ino, b.st_ino);
    ck_assert_uint_eq(memfd_value(in[i]), 1000 + i);
    ck_assert_int_ne(fcntl(in[i], F_GETFD) & FD_CLOEXEC, 0);
    close(in[i]);
    close(fds[i]);
  }
  close(sv[0]);
  close(sv[1]);
  ck_assert_int_eq(open_fds(), before - 2);
  free(fds);
  free(in);
  free(h);
  free(f);
}

START_TEST(test_socket_round_trips) {
  raise_fd_limit();
  uint32_t counts[] = {0, 1, 239, 240, 241, 500, RMMC_IPC_MAX_FDS};
  int types[] = {SOCK_STREAM, SOCK_SEQPACKET, SOCK_DGRAM};
  for (int t = 0; t < 3; t++)
    for (int c = 0; c < 7; c++) {
      if (types[t] == SOCK_DGRAM && counts[c] > 500) continue; /* datagrams queue in few buffers */
      round_trip(types[t], counts[c]);
    }
}
END_TEST

/* Two handles back to back on one stream socket are two receives. */
START_TEST(test_socket_back_to_back) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  rmmc__ipc_fields_t *f = fields(RMMC_IPC_VM, 3), *g = fields(RMMC_IPC_CUDA, 0);
  rmmc_ipc_handle_t *a = encoded(f), *b = encoded(g), got;
  int fds[3] = {memfd_with(1), memfd_with(2), memfd_with(3)}, in[8];
  ck_assert_int_eq(rmmc_ipc_send(sv[0], a, fds, 3), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_ipc_send(sv[0], b, NULL, 0), RMMC_SUCCESS);
  size_t k;
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 8, &k), RMMC_SUCCESS);
  ck_assert_uint_eq(k, 3);
  ck_assert_uint_eq(memfd_value(in[2]), 3);
  for (int i = 0; i < 3; i++) close(in[i]), close(fds[i]);
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 8, &k), RMMC_SUCCESS);
  ck_assert_uint_eq(k, 0);
  ck_assert_mem_eq(got.bytes, b->bytes, 192);
  close(sv[0]);
  close(sv[1]);
  free(a), free(b), free(f), free(g);
}
END_TEST

START_TEST(test_socket_failures) {
  raise_fd_limit();
  int before = open_fds();
  rmmc__ipc_fields_t *f = fields(RMMC_IPC_VM, 300);
  rmmc_ipc_handle_t *h = encoded(f), got;
  int *fds = malloc(300 * sizeof *fds), in[400];
  for (int i = 0; i < 300; i++) fds[i] = memfd_with((unsigned)i);
  int sv[2];
  size_t k = 5;
  /* The count must match the handle's. */
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ck_assert_int_eq(rmmc_ipc_send(sv[0], h, fds, 299), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "300 descriptors"));
  /* Too little room: the rest are closed, nothing kept. */
  ck_assert_int_eq(rmmc_ipc_send(sv[0], h, fds, 300), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 100, &k), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(k, 0);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "room for 100"));
  /* Not what rmmc_ipc_send writes. */
  char junk[64];
  memset(junk, 'x', sizeof junk);
  ck_assert_int_eq(write(sv[0], junk, sizeof junk), (ssize_t)sizeof junk);
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 400, &k), RMMC_ERROR_PARSE);
  close(sv[0]);
  close(sv[1]);
  /* The peer goes away mid-handle, or before anything. */
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  unsigned char part[40];
  memcpy(part, "rIPC", 4); /* a header claiming 192 bytes, then the end */
  memset(part + 4, 0, sizeof part - 4);
  part[12] = 192;
  part[6] = 1;
  ck_assert_int_eq(write(sv[0], part, sizeof part), (ssize_t)sizeof part);
  close(sv[0]);
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 400, &k), RMMC_ERROR_IO);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "closed"));
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 400, &k), RMMC_ERROR_IO);
  close(sv[1]);
  /* A socket that is not one. */
  ck_assert_int_eq(rmmc_ipc_send(-1, h, fds, 300), RMMC_ERROR_IO);
  ck_assert_int_eq(rmmc_ipc_recv(-1, &got, in, 400, &k), RMMC_ERROR_IO);
  /* A datagram that is cut short. */
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  ck_assert_int_eq(write(sv[0], junk, 8), 8);
  ck_assert_int_eq(rmmc_ipc_recv(sv[1], &got, in, 400, &k), RMMC_ERROR_PARSE);
  close(sv[0]);
  close(sv[1]);
  /* Bad handles and arguments. */
  rmmc_ipc_handle_t zero;
  memset(&zero, 0, sizeof zero);
  ck_assert_int_eq(rmmc_ipc_send(0, &zero, NULL, 0), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_send(0, NULL, NULL, 0), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_send(0, h, NULL, 3), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_recv(0, NULL, in, 4, &k), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_recv(0, &got, NULL, 4, &k), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_recv(0, &got, in, 4, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  for (int i = 0; i < 300; i++) close(fds[i]);
  ck_assert_int_eq(open_fds(), before); /* every received descriptor was closed */
  free(fds);
  free(h);
  free(f);
}
END_TEST

/* ---- the registry ---- */

/* A handle for an export registered here (own memory, kind chunk). */
static rmmc_ipc_handle_t *handle_for(const rmmc__export_ref_t *ref, const void *base,
                                     size_t bytes) {
  rmmc__ipc_fields_t *f = fields(RMMC_IPC_CUDA, 0);
  f->ref = *ref;
  f->origin = (uint64_t)(uintptr_t)base;
  f->origin_bytes = bytes;
  f->offset = 0;
  f->bytes = bytes;
  rmmc_ipc_handle_t *h = encoded(f);
  free(f);
  return h;
}

static rmmc_resource_t *host_pool(void) {
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("statistics > pool(address_space=64MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  return r;
}

static rmmc__export_ref_t export_block(rmmc_resource_t *r, void *p) {
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  ck_assert_int_eq(rmmc_resource_get_allocation(r, p, &a), RMMC_SUCCESS);
  rmmc__export_ref_t ref;
  ck_assert_int_eq(rmmc__exports_add(a.base, p, a.bytes, a.resource, &ref), RMMC_SUCCESS);
  return ref;
}

#define EXPECT_STALE(h, needle)                                                                \
  do {                                                                                         \
    ck_assert_int_eq(rmmc_ipc_check(h), RMMC_ERROR_STALE);                                     \
    ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s' lacks '%s'",        \
                  rmmc_last_error_message(), needle);                                          \
  } while (0)

START_TEST(test_registry_in_process) {
  rmmc_resource_t *r = host_pool();
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 8 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, NULL, &c), RMMC_SUCCESS);
  rmmc__export_ref_t ra = export_block(r, a), rb = export_block(r, (char *)b + 100);
  rmmc__export_ref_t rc = export_block(r, c);
  ck_assert_uint_eq(rmmc__exports_live(), 3);
  ck_assert_uint_eq(ra.pid, (uint32_t)getpid());
  ck_assert_uint_ne(ra.generation, rb.generation);
  /* Exporting a block again is the same export, even by another pointer. */
  rmmc__export_ref_t again = export_block(r, (char *)a + 8);
  ck_assert_uint_eq(again.slot, ra.slot);
  ck_assert_uint_eq(again.generation, ra.generation);
  ck_assert_uint_eq(rmmc__exports_live(), 3);
  rmmc_ipc_handle_t *ha = handle_for(&ra, a, 4096), *hb = handle_for(&rb, b, 8 * MiB);
  rmmc_ipc_handle_t *hc = handle_for(&rc, c, 3000);
  ck_assert_int_eq(rmmc_ipc_check(ha), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_ipc_check(hb), RMMC_SUCCESS);
  /* Freed through the dispatch: stale. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 4096, 256, NULL), RMMC_SUCCESS);
  EXPECT_STALE(ha, "freed the block");
  ck_assert_int_eq(rmmc_ipc_check(hb), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc__exports_live(), 2);
  /* A block freed and handed out again at that address: a new export in
   * the old slot; the old handle says so. */
  void *a2;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &a2), RMMC_SUCCESS);
  rmmc__export_ref_t ra2 = export_block(r, a2);
  ck_assert_uint_ne(ra2.generation, ra.generation);
  if (ra2.slot == ra.slot) EXPECT_STALE(ha, "exported another in its place");
  /* Revoked explicitly, by the pointer it was exported by. */
  ck_assert_int_eq(rmmc_ipc_revoke((char *)b + 100), RMMC_SUCCESS);
  EXPECT_STALE(hb, "revoked");
  ck_assert_int_eq(rmmc_ipc_revoke((char *)b + 100), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_ipc_revoke(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 8 * MiB, 256, NULL), RMMC_SUCCESS);
  /* The layer that handed it out destroyed (c still allocated): stale. */
  ck_assert_int_eq(rmmc_ipc_check(hc), RMMC_SUCCESS);
  rmmc_resource_release(r);
  EXPECT_STALE(hc, "freed the block");
  ck_assert_uint_eq(rmmc__exports_live(), 0);
  /* Handles of this process's table with another id: an old incarnation. */
  rmmc__export_ref_t fake = ra;
  fake.table_id ^= 1;
  rmmc_ipc_handle_t *hf = handle_for(&fake, a, 4096);
  EXPECT_STALE(hf, "another export table");
  rmmc_ipc_stats_t s = RMMC_IPC_STATS_INIT;
  ck_assert_int_eq(rmmc_ipc_get_stats(&s), RMMC_SUCCESS);
  ck_assert_uint_eq(s.exports, 0);
  s.size = 3;
  ck_assert_int_eq(rmmc_ipc_get_stats(&s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_get_stats(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  free(ha), free(hb), free(hc), free(hf);
}
END_TEST

/* A handle of this process imports as the exporter's own pointer, with no
 * GPU; closes balance imports; a stale one imports nothing. */
START_TEST(test_import_own_export) {
  rmmc_resource_t *r = host_pool();
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(r, 64 * KiB, 256, NULL, &a), RMMC_SUCCESS);
  rmmc__export_ref_t ref = export_block(r, a);
  rmmc__ipc_fields_t *f = fields(RMMC_IPC_CUDA, 0);
  f->ref = ref;
  f->origin = (uint64_t)(uintptr_t)a;
  f->origin_bytes = 64 * KiB;
  f->offset = 512;
  f->bytes = 64 * KiB - 512;
  rmmc_ipc_handle_t *h = encoded(f);
  void *p = NULL, *q = NULL;
  ck_assert_int_eq(rmmc_ipc_import(h, NULL, 0, &p), RMMC_SUCCESS);
  ck_assert_ptr_eq(p, (char *)a + 512);
  ck_assert_int_eq(rmmc_ipc_import(h, NULL, 0, &q), RMMC_SUCCESS);
  ck_assert_ptr_eq(q, p);
  rmmc_ipc_stats_t s = RMMC_IPC_STATS_INIT;
  ck_assert_int_eq(rmmc_ipc_get_stats(&s), RMMC_SUCCESS);
  ck_assert_uint_eq(s.imports, 2);
  ck_assert_uint_eq(s.open_bases, 0); /* nothing opened: our own memory */
  ck_assert_uint_eq(s.exports, 1);
  ck_assert_int_eq(rmmc_ipc_close(p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_ipc_close(q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_ipc_close(q), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_ipc_get_stats(&s), RMMC_SUCCESS);
  ck_assert_uint_eq(s.imports, 0);
  /* Descriptors that do not match the handle. */
  int fd = memfd_with(1);
  ck_assert_int_eq(rmmc_ipc_import(h, &fd, 1, &p), RMMC_ERROR_INVALID_ARGUMENT);
  close(fd);
  ck_assert_int_eq(rmmc_ipc_import(h, NULL, 0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_import(NULL, NULL, 0, &p), RMMC_ERROR_INVALID_ARGUMENT);
  /* Freed: stale, nothing imported. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 64 * KiB, 256, NULL), RMMC_SUCCESS);
  p = (void *)1;
  ck_assert_int_eq(rmmc_ipc_import(h, NULL, 0, &p), RMMC_ERROR_STALE);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_ipc_get_stats(&s), RMMC_SUCCESS);
  ck_assert_uint_eq(s.imports, 0);
  /* Another process's live handle with no GPU here: no device to open it on. */
  rmmc_resource_release(r);
  free(h);
  free(f);
}
END_TEST

/* Across processes: a child exports (host memory, no CUDA) and reports its
 * handles through a pipe; the parent reads the child's table through
 * /proc: live, then revoked, then the child gone. */
START_TEST(test_registry_across_processes) {
  int up[2], down[2];
  ck_assert_int_eq(pipe(up), 0);
  ck_assert_int_eq(pipe(down), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(up[0]);
    close(down[1]);
    rmmc_resource_t *r = host_pool();
    void *a, *b;
    char cmd;
    if (rmmc_resource_allocate(r, 4096, 256, NULL, &a) != RMMC_SUCCESS ||
        rmmc_resource_allocate(r, 4096, 256, NULL, &b) != RMMC_SUCCESS)
      _exit(2);
    if (rmmc__exports_live() != 0) _exit(3); /* nothing inherited */
    rmmc__export_ref_t refs[2] = {export_block(r, a), export_block(r, b)};
    if (write(up[1], refs, sizeof refs) != (ssize_t)sizeof refs) _exit(4);
    if (read(down[0], &cmd, 1) != 1) _exit(5);
    (void)rmmc_resource_deallocate(r, a, 4096, 256, NULL); /* revokes a */
    if (write(up[1], "k", 1) != 1) _exit(6);
    if (read(down[0], &cmd, 1) != 1) _exit(7);
    _exit(0); /* exits holding b's export */
  }
  close(up[1]);
  close(down[0]);
  rmmc__export_ref_t refs[2];
  ck_assert_int_eq(read(up[0], refs, sizeof refs), (ssize_t)sizeof refs);
  ck_assert_uint_eq(refs[0].pid, (uint32_t)child);
  rmmc_ipc_handle_t *ha = handle_for(&refs[0], (void *)0x10000, 4096);
  rmmc_ipc_handle_t *hb = handle_for(&refs[1], (void *)0x20000, 4096);
  ck_assert_msg(rmmc_ipc_check(ha) == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_ipc_check(hb), RMMC_SUCCESS);
  bool verified = false;
  ck_assert_int_eq(rmmc__exports_check(&refs[0], &verified), RMMC_SUCCESS);
  ck_assert(verified);
  /* Importing the child's live handle here: checked, then no GPU. */
  void *p = (void *)1;
  rmmc_status_t st = rmmc_ipc_import(hb, NULL, 0, &p);
  ck_assert_int_eq(st, RMMC_ERROR_NO_DEVICE); /* its device (a made-up UUID) is not here */
  ck_assert_ptr_null(p);
  ck_assert_int_eq(write(down[1], "f", 1), 1);
  char ack;
  ck_assert_int_eq(read(up[0], &ack, 1), 1);
  EXPECT_STALE(ha, "freed the block");
  ck_assert_int_eq(rmmc_ipc_check(hb), RMMC_SUCCESS);
  ck_assert_int_eq(write(down[1], "x", 1), 1);
  int status;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  EXPECT_STALE(hb, "exited");
  EXPECT_STALE(ha, "exited");
  p = (void *)1;
  ck_assert_int_eq(rmmc_ipc_import(hb, NULL, 0, &p), RMMC_ERROR_STALE);
  ck_assert_ptr_null(p);
  close(up[0]);
  close(down[1]);
  free(ha), free(hb);
}
END_TEST

/* Issue 25, F12: a handle naming another process's descriptor that is no
 * export table (the exporter gone and its pid reused, or a forged handle)
 * is stale at once, whatever the descriptor is: a FIFO with no writer
 * (whose blocking open never returned, with the export registry's lock
 * held), a pipe whose writer is gone, sockets, a directory, devices, a
 * regular file, memfds unsealed and sealed, a pidfd, an eventfd, a closed
 * number. A child holds them; the checks and imports run here, each bounded
 * in time, and another thread's export goes on meanwhile. */
static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Exports, checks and frees blocks (the export registry's lock) while the
 * main thread checks hostile handles. */
static void *export_meanwhile(void *arg) {
  rmmc_resource_t *r = arg;
  for (int i = 0; i < 200; i++) {
    void *p;
    if (rmmc_resource_allocate(r, 4096, 256, NULL, &p) != RMMC_SUCCESS) return (void *)1;
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    rmmc__export_ref_t ref;
    bool verified = false;
    if (rmmc_resource_get_allocation(r, p, &a) != RMMC_SUCCESS ||
        rmmc__exports_add(a.base, p, a.bytes, a.resource, &ref) != RMMC_SUCCESS ||
        rmmc__exports_check(&ref, &verified) != RMMC_SUCCESS || !verified)
      return (void *)2;
    if (rmmc_resource_deallocate(r, p, 4096, 256, NULL) != RMMC_SUCCESS) return (void *)3;
  }
  return NULL;
}

START_TEST(test_descriptors_of_every_type_are_stale) {
  enum { NDESC = 14 };
  static const char *const what[NDESC] = {
      "FIFO without writer", "pipe without writer", "pipe with writer", "socketpair",
      "listening UNIX socket", "directory", "/dev/null", "/dev/zero", "regular file",
      "memfd unsealed", "memfd sealed, not a table", "pidfd", "eventfd", "closed number"};
  char fifo[64];
  snprintf(fifo, sizeof fifo, "/tmp/rmmc-test-fifo-%d", (int)getpid());
  unlink(fifo);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  int up[2], down[2];
  ck_assert_int_eq(pipe(up), 0);
  ck_assert_int_eq(pipe(down), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(up[0]);
    close(down[1]);
    int fds[NDESC], p1[2], p2[2], sp[2];
    fds[0] = open(fifo, O_RDONLY | O_NONBLOCK); /* no one writes */
    if (pipe(p1) != 0 || pipe(p2) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) _exit(2);
    close(p1[1]);
    fds[1] = p1[0];
    fds[2] = p2[0];
    fds[3] = sp[0];
    fds[4] = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fds[4] >= 0) (void)listen(fds[4], 1);
    fds[5] = open("/tmp", O_RDONLY | O_DIRECTORY);
    fds[6] = open("/dev/null", O_RDWR);
    fds[7] = open("/dev/zero", O_RDONLY);
    char file[64];
    snprintf(file, sizeof file, "/tmp/rmmc-test-file-%d", (int)getpid());
    fds[8] = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    unlink(file);
    fds[9] = memfd_create("not-rmmc", MFD_CLOEXEC);
    fds[10] = memfd_create("rmmc-ipc-exports", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    for (int i = 8; i <= 10; i++)
      if (fds[i] < 0 || ftruncate(fds[i], 8 * MiB) != 0) _exit(3);
    if (fcntl(fds[10], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) _exit(4);
    fds[11] = (int)syscall(434 /* pidfd_open */, getpid(), 0);
    fds[12] = (int)syscall(SYS_eventfd2, 0, 0);
    fds[13] = 900;
    close(900);
    for (int i = 0; i < NDESC - 1; i++)
      if (fds[i] < 0 && i != 11 && i != 12) _exit(10 + i); /* pidfd, eventfd: kernel may lack */
    if (write(up[1], fds, sizeof fds) != (ssize_t)sizeof fds) _exit(5);
    char cmd;
    if (read(down[0], &cmd, 1) != 1) _exit(6);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  int fds[NDESC];
  ck_assert_int_eq(read(up[0], fds, sizeof fds), (ssize_t)sizeof fds);
  rmmc_resource_t *r = host_pool();
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, export_meanwhile, r), 0);
  for (int i = 0; i < NDESC; i++) {
    if (fds[i] < 0) continue;
    rmmc__export_ref_t ref = {(uint32_t)child, (uint32_t)fds[i], 0x1234567890abcdefull, 3, 42};
    rmmc_ipc_handle_t *h = handle_for(&ref, (void *)0x10000, 4096);
    double t0 = seconds_now();
    rmmc_status_t st = rmmc_ipc_check(h);
    ck_assert_msg(st == RMMC_ERROR_STALE, "%s: check gave %s: %s", what[i], rmmc_status_name(st),
                  rmmc_last_error_message());
    void *p = (void *)1;
    st = rmmc_ipc_import(h, NULL, 0, &p);
    ck_assert_msg(st == RMMC_ERROR_STALE, "%s: import gave %s: %s", what[i],
                  rmmc_status_name(st), rmmc_last_error_message());
    ck_assert_ptr_null(p);
    ck_assert_msg(seconds_now() - t0 < 2.0, "%s: took %.1f s", what[i], seconds_now() - t0);
    free(h);
  }
  void *rv = (void *)1;
  pthread_join(th, &rv);
  ck_assert_ptr_null(rv);
  ck_assert_int_eq(write(down[1], "x", 1), 1);
  int status;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  unlink(fifo);
  close(up[0]);
  close(down[1]);
  rmmc_resource_release(r);
}
END_TEST

/* A forked child starts with no exports and a table of its own; its
 * parent's exports stay the parent's. */
START_TEST(test_fork_resets_exports) {
  rmmc_resource_t *r = host_pool();
  void *a;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &a), RMMC_SUCCESS);
  rmmc__export_ref_t ref = export_block(r, a);
  int pipefd[2];
  ck_assert_int_eq(pipe(pipefd), 0);
  pid_t child = fork();
  if (child == 0) {
    /* Each step only after the one before succeeded: export_block on a
     * block never allocated would read an uninitialized pointer. */
    void *b = NULL;
    if (rmmc__exports_live() != 0 || rmmc_resource_allocate(r, 4096, 256, NULL, &b) != RMMC_SUCCESS)
      _exit(1);
    rmmc__export_ref_t mine = export_block(r, b);
    int ok = 1;
    ok = ok && mine.table_id != ref.table_id && mine.pid == (uint32_t)getpid();
    /* Freeing the parent's block here does not touch the parent's table. */
    ok = ok && rmmc_resource_deallocate(r, a, 4096, 256, NULL) == RMMC_SUCCESS;
    bool verified;
    ok = ok && rmmc__exports_check(&ref, &verified) == RMMC_SUCCESS && verified;
    _exit(ok ? 0 : 1);
  }
  int status;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  bool verified;
  ck_assert_int_eq(rmmc__exports_check(&ref, &verified), RMMC_SUCCESS);
  ck_assert(verified);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 4096, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc__exports_check(&ref, &verified), RMMC_ERROR_STALE);
  close(pipefd[0]);
  close(pipefd[1]);
  rmmc_resource_release(r);
}
END_TEST

/* ---- exports refused ---- */

static void expect_refused(rmmc_resource_t *r, size_t bytes, rmmc_status_t status,
                           const char *needle) {
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, bytes, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_ipc_handle_t h;
  int fds[4] = {-7, -7, -7, -7};
  size_t n = 9;
  ck_assert_int_eq(rmmc_ipc_export(r, p, &h, fds, 4, &n), status);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s' lacks '%s'",
                rmmc_last_error_message(), needle);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(fds[0], -7);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, bytes, 256, NULL), RMMC_SUCCESS);
}

START_TEST(test_export_refused) {
  const char *host_specs[] = {"host", "pool(address_space=64MiB) > host",
                              "statistics > pool(expandable=true, address_space=64MiB) > host",
                              "pool > sim"};
  for (int i = 0; i < 4; i++) {
    rmmc_resource_t *r = NULL;
    ck_assert_int_eq(rmmc_stack_create(host_specs[i], -1, &r), RMMC_SUCCESS);
    expect_refused(r, 4096, RMMC_ERROR_NOT_SUPPORTED, "host memory");
    rmmc_resource_release(r);
  }
  rmmc_memory_kind_t kinds[] = {RMMC_MEMORY_MANAGED, RMMC_MEMORY_PINNED};
  const char *names[] = {"managed memory", "pinned memory"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *spy;
    ck_assert_int_eq(spy_create(kinds[i], &spy), RMMC_SUCCESS);
    expect_refused(spy, 4096, RMMC_ERROR_NOT_SUPPORTED, names[i]);
    rmmc_resource_release(spy);
  }
  /* Device memory from a layer that cannot tell (the spy). Device stacks
   * of a pool need a GPU (its events): the GPU test refuses those (pages
   * of a resource that is not cuda, cuda without ipc=true, fixed_size). */
  rmmc_resource_t *spy;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &spy), RMMC_SUCCESS);
  expect_refused(spy, 4096, RMMC_ERROR_NOT_SUPPORTED, "spy resource cannot tell");
  /* A pointer no block holds, and bad arguments. */
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("pool(address_space=64MiB) > host", -1, &r), RMMC_SUCCESS);
  rmmc_ipc_handle_t h;
  int fds[2];
  size_t n;
  char local;
  ck_assert_int_eq(rmmc_ipc_export(NULL, &local, &h, fds, 2, &n), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_export(r, NULL, &h, fds, 2, &n), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_export(r, &local, NULL, fds, 2, &n), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_export(r, &local, &h, NULL, 2, &n), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_export(r, &local, &h, fds, 2, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_ipc_close(&local), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_ipc_check(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_release(r);
  rmmc_resource_release(spy);
  ck_assert_uint_eq(rmmc__exports_live(), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ipc");
  TCase *tc = tcase_create("ipc");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_handle_round_trip);
  tcase_add_test(tc, test_handle_damage);
  tcase_add_test(tc, test_socket_round_trips);
  tcase_add_test(tc, test_socket_back_to_back);
  tcase_add_test(tc, test_socket_failures);
  tcase_add_test(tc, test_registry_in_process);
  tcase_add_test(tc, test_import_own_export);
  tcase_add_test(tc, test_registry_across_processes);
  tcase_add_test(tc, test_descriptors_of_every_type_are_stale);
  tcase_add_test(tc, test_fork_resets_exports);
  tcase_add_test(tc, test_export_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
