/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sharing device memory between two processes on one GPU. The test is the
 * exporter (and sometimes the importer); tests/ipc_peer.c, started with
 * posix_spawn (a process that used CUDA cannot use it in a forked child),
 * is the other process, driven over a socket. Chunks (pool(expandable=
 * false) > cuda, and cuda itself) and pages (pool(expandable=true) >
 * cuda(ipc=true)): data written on one side is read on the other, many
 * blocks of one chunk or mapping range open it once, teardown in both
 * orders, exports from many threads at once, stale handles (freed,
 * revoked, the stack released, the exporter gone), a child that dies
 * holding imports (the device memory comes back), exports refused with
 * clear statuses, allocation queries and memory hooks on device memory.
 * Suite cuda: exits 77 without a GPU, runs without fork.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc_peer.h"
#include "pattern.h"
#include "rmmc/rmmc.h"
#include "test_main.h"

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define CHUNKS "pool(expandable=false) > cuda"
#define PAGES "pool(expandable=true, page=2MiB) > cuda(ipc=true)"

extern char **environ;
static const char *peer_path; /* argv[1] */

/* ---- the other process ---- */

typedef struct peer {
  pid_t pid;
  int sock;
} peer_t;

static peer_t peer_start(void) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  char fd[16];
  snprintf(fd, sizeof fd, "%d", sv[1]);
  char *argv[] = {(char *)peer_path, fd, NULL};
  peer_t p = {0, sv[0]};
  ck_assert_msg(posix_spawn(&p.pid, peer_path, NULL, NULL, argv, environ) == 0, "spawn %s",
                peer_path);
  close(sv[1]);
  return p;
}

static peer_reply_t peer_call(peer_t *p, uint32_t op, uint64_t ptr, uint64_t bytes, uint64_t tag,
                              const rmmc_ipc_handle_t *h, const int *fds, size_t nfds) {
  peer_cmd_t c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.ptr = ptr;
  c.bytes = bytes;
  c.tag = tag;
  ck_assert_int_eq(send(p->sock, &c, sizeof c, MSG_NOSIGNAL), (ssize_t)sizeof c);
  if (h != NULL)
    ck_assert_msg(rmmc_ipc_send(p->sock, h, fds, nfds) == RMMC_SUCCESS, "%s",
                  rmmc_last_error_message());
  peer_reply_t r;
  ck_assert_int_eq(recv(p->sock, &r, sizeof r, 0), (ssize_t)sizeof r);
  return r;
}

static void peer_stop(peer_t *p) {
  peer_reply_t r = peer_call(p, PEER_EXIT, 0, 0, 0, NULL, NULL, 0);
  ck_assert_int_eq(r.status, 0);
  int status;
  ck_assert_int_eq(waitpid(p->pid, &status, 0), p->pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "peer status %d", status);
  close(p->sock);
}

#define PEER_OK(r) ck_assert_msg((r).status == 0, "peer: %s", (r).message)

/* ---- this side ---- */

static rmmc_resource_t *stack(const char *spec) {
  rmmc_resource_t *r = NULL;
  ck_assert_msg(rmmc_stack_create(spec, 0, &r) == RMMC_SUCCESS, "%s: %s", spec,
                rmmc_last_error_message());
  return r;
}

/* Pattern `tag` into h (n bytes): word i of pattern.h, little-endian. */
static void make_pattern(unsigned char *h, size_t n, uint64_t tag) {
  for (size_t w = 0; w * 8 < n; w++) {
    uint64_t v = pattern_word(tag, w);
    for (size_t j = 0; j < 8 && w * 8 + j < n; j++) h[w * 8 + j] = (unsigned char)(v >> (8 * j));
  }
}

static void fill(void *d, size_t n, uint64_t tag) {
  unsigned char *h = malloc(n);
  make_pattern(h, n, tag);
  CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyDefault));
  free(h);
}

static void expect_pattern(const void *d, size_t n, uint64_t tag) {
  unsigned char *h = malloc(n), *want = malloc(n);
  CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDefault));
  make_pattern(want, n, tag);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != want[i];
  free(want);
  free(h);
  ck_assert_msg(bad == 0, "%zu of %zu bytes differ from pattern %llu", bad, n,
                (unsigned long long)tag);
}

typedef struct exported {
  rmmc_ipc_handle_t h;
  int fds[RMMC_IPC_MAX_FDS];
  size_t n;
} exported_t;

static exported_t *export_block(rmmc_resource_t *r, const void *p) {
  exported_t *e = malloc(sizeof *e);
  rmmc_status_t st = rmmc_ipc_export(r, p, &e->h, e->fds, RMMC_IPC_MAX_FDS, &e->n);
  ck_assert_msg(st == RMMC_SUCCESS, "export %p: %s", p, rmmc_last_error_message());
  return e;
}

static void exported_free(exported_t *e) {
  for (size_t i = 0; i < e->n; i++) close(e->fds[i]);
  free(e);
}

/* The peer imports e: its pointer. */
static uint64_t peer_import(peer_t *p, const exported_t *e) {
  peer_reply_t r = peer_call(p, PEER_IMPORT, 0, 0, 0, &e->h, e->fds, e->n);
  PEER_OK(r);
  ck_assert_uint_ne(r.value[0], 0);
  return r.value[0];
}

static void peer_expect(peer_t *p, uint64_t ptr, size_t n, uint64_t tag) {
  peer_reply_t r = peer_call(p, PEER_READ, ptr, n, tag, NULL, NULL, 0);
  PEER_OK(r);
  ck_assert_msg(r.value[0] == 0, "the peer reads %llu words that differ from pattern %llu",
                (unsigned long long)r.value[0], (unsigned long long)tag);
}

static peer_reply_t peer_stats(peer_t *p) {
  peer_reply_t r = peer_call(p, PEER_STATS, 0, 0, 0, NULL, NULL, 0);
  PEER_OK(r);
  return r;
}
#define IMPORTS(r) ((r).value[1])
#define OPEN_BASES(r) ((r).value[2])
#define OPENS(r) ((r).value[3])

static size_t device_free(void) {
  size_t f, t;
  ck_assert_int_eq(rmmc_device_memory_info(0, &f, &t), RMMC_SUCCESS);
  return f;
}

/* ---- chunks ---- */

/* How the second half of the blocks is torn down, the exporter first. */
enum {
  /* cudaFree of memory another process has open is undefined (CUDA's
   * documentation): with a plain cuda resource every free is a cudaFree,
   * so the peer always closes first. */
  CLOSE_FIRST,
  /* Chunks: the exporter frees its blocks (the pool keeps the chunk), the
   * peer reads and closes, then the pool gives the chunk back. */
  FREE_BLOCKS_FIRST,
  /* Pages: the exporter frees and unmaps everything; the peer's mappings
   * hold the physical memory, whose contents it still reads, until it
   * closes. */
  GIVE_BACK_FIRST,
};

/* Blocks of one chunk or page range: each exported, imported by the peer
 * (a chunk opened once), read there, written there and read here; an
 * import made twice is one mapping; half torn down with the peer closing
 * first, half with the exporter freeing first as `order` says. */
static void share_blocks(const char *spec, const size_t *sizes, int nblocks, bool one_base,
                         int order) {
  rmmc_resource_t *r = stack(spec);
  peer_t peer = peer_start();
  void *d[8];
  exported_t *e[8];
  uint64_t imp[8];
  for (int i = 0; i < nblocks; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, sizes[i], 256, NULL, &d[i]), RMMC_SUCCESS);
    fill(d[i], sizes[i], 10 + (uint64_t)i);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int i = 0; i < nblocks; i++) {
    e[i] = export_block(r, d[i]);
    rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
    ck_assert_int_eq(rmmc_ipc_handle_info(&e[i]->h, &info), RMMC_SUCCESS);
    ck_assert_uint_eq(info.bytes, sizes[i]);
    ck_assert_uint_eq(info.nfds, e[i]->n);
    ck_assert_int_eq(info.exporter_pid, getpid());
    imp[i] = peer_import(&peer, e[i]);
    peer_expect(&peer, imp[i], sizes[i], 10 + (uint64_t)i);
  }
  peer_reply_t s = peer_stats(&peer);
  ck_assert_uint_eq(IMPORTS(s), (uint64_t)nblocks);
  if (one_base) {
    ck_assert_uint_eq(OPEN_BASES(s), 1);
    ck_assert_uint_eq(OPENS(s), 1);
  }
  ck_assert_uint_eq(s.value[4], 0); /* every export's registry was read */
  /* The peer writes, this side reads. */
  PEER_OK(peer_call(&peer, PEER_WRITE, imp[0], sizes[0], 77, NULL, NULL, 0));
  expect_pattern(d[0], sizes[0], 77);
  /* The same handle again: the same pointer, nothing opened. */
  uint64_t again = peer_import(&peer, e[1]);
  ck_assert_uint_eq(again, imp[1]);
  ck_assert_uint_eq(OPENS(peer_stats(&peer)), OPENS(s));
  PEER_OK(peer_call(&peer, PEER_CLOSE, again, 0, 0, NULL, NULL, 0));
  /* The peer closes first; then this side frees. */
  for (int i = 0; i < nblocks / 2; i++)
    PEER_OK(peer_call(&peer, PEER_CLOSE, imp[i], 0, 0, NULL, NULL, 0));
  for (int i = 0; i < nblocks / 2; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(r, d[i], sizes[i], 256, NULL), RMMC_SUCCESS);
    peer_reply_t c = peer_call(&peer, PEER_CHECK, 0, 0, 0, &e[i]->h, e[i]->fds, e[i]->n);
    ck_assert_int_eq(c.status, RMMC_ERROR_STALE);
  }
  /* The other half: this side first, as far as CUDA allows. */
  if (order != CLOSE_FIRST)
    for (int i = nblocks / 2; i < nblocks; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, d[i], sizes[i], 256, NULL), RMMC_SUCCESS);
  if (order == GIVE_BACK_FIRST) {
    ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
    uint64_t reserved = 1;
    ck_assert(rmmc_resource_get_field(r, "reserved", &reserved));
    ck_assert_uint_eq(reserved, 0);
  }
  for (int i = nblocks / 2; i < nblocks; i++) {
    peer_expect(&peer, imp[i], sizes[i], 10 + (uint64_t)i);
    PEER_OK(peer_call(&peer, PEER_CLOSE, imp[i], 0, 0, NULL, NULL, 0));
  }
  if (order == CLOSE_FIRST)
    for (int i = nblocks / 2; i < nblocks; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, d[i], sizes[i], 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  s = peer_stats(&peer);
  ck_assert_uint_eq(IMPORTS(s), 0);
  ck_assert_uint_eq(OPEN_BASES(s), 0);
  ck_assert_int_eq(peer_call(&peer, PEER_CLOSE, imp[0], 0, 0, NULL, NULL, 0).status,
                   RMMC_ERROR_UNKNOWN_POINTER);
  for (int i = 0; i < nblocks; i++) exported_free(e[i]);
  peer_stop(&peer);
  rmmc_resource_release(r);
}

START_TEST(test_gpu_chunks_two_processes) {
  /* One 32 MiB chunk holds them all (a span for the small ones). */
  size_t sizes[] = {4 * MiB, MiB + 100, 300 * KiB, 7 * MiB, 1000, 5 * MiB};
  rmmc_resource_t *r = stack(CHUNKS);
  void *d[6];
  void *chunk = NULL;
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, sizes[i], 256, NULL, &d[i]), RMMC_SUCCESS);
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    ck_assert_int_eq(rmmc_resource_get_allocation(r, d[i], &a), RMMC_SUCCESS);
    ck_assert_int_eq(a.backing, RMMC_BACKING_BLOCK);
    if (i == 0) chunk = a.upstream.ptr;
    ck_assert_ptr_eq(a.upstream.ptr, chunk);
  }
  for (int i = 0; i < 6; i++) rmmc_resource_deallocate(r, d[i], sizes[i], 256, NULL);
  rmmc_resource_release(r);
  share_blocks(CHUNKS, sizes, 6, true, FREE_BLOCKS_FIRST);
}
END_TEST

START_TEST(test_gpu_pages_two_processes) {
  /* 9 MiB over 2 MiB mappings: 5 or 6 descriptors; small ones share a range. */
  size_t sizes[] = {9 * MiB, 200 * KiB, 300 * KiB, 3 * MiB + 512, 64 * KiB, 100};
  share_blocks(PAGES, sizes, 6, false, GIVE_BACK_FIRST);
  rmmc_resource_t *r = stack(PAGES);
  void *d;
  ck_assert_int_eq(rmmc_resource_allocate(r, 9 * MiB, 256, NULL, &d), RMMC_SUCCESS);
  exported_t *e = export_block(r, d);
  ck_assert_uint_ge(e->n, 5);
  /* Too little room for the descriptors: how many are needed. */
  rmmc_ipc_handle_t h;
  int fds[2] = {-5, -5};
  size_t n = 0;
  ck_assert_int_eq(rmmc_ipc_export(r, d, &h, fds, 2, &n), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(n, e->n);
  ck_assert_int_eq(fds[0], -5);
  exported_free(e);
  ck_assert_int_eq(rmmc_resource_deallocate(r, d, 9 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* A plain cuda resource's cudaMalloc blocks; an import in the exporting
 * process is the exporter's own pointer. */
START_TEST(test_gpu_cuda_base_and_same_process) {
  size_t sizes[] = {MiB, 3 * MiB};
  share_blocks("cuda", sizes, 2, false, CLOSE_FIRST);
  rmmc_resource_t *r = stack("statistics > cuda");
  void *d, *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, NULL, &d), RMMC_SUCCESS);
  exported_t *e = export_block(r, (char *)d + 4096);
  ck_assert_int_eq(rmmc_ipc_import(&e->h, e->fds, e->n, &p), RMMC_SUCCESS);
  ck_assert_ptr_eq(p, (char *)d + 4096);
  ck_assert_int_eq(rmmc_ipc_close(p), RMMC_SUCCESS);
  exported_free(e);
  ck_assert_int_eq(rmmc_resource_deallocate(r, d, MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* ---- many exports at once ---- */

enum { THREADS = 8, PER_THREAD = 24 };

typedef struct exporter {
  rmmc_resource_t *r;
  int id;
  void *d[PER_THREAD];
  size_t n[PER_THREAD];
  exported_t *e[PER_THREAD];
  int errors;
} exporter_t;

static void *export_many(void *arg) {
  exporter_t *x = arg;
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) x->errors++;
  for (int i = 0; i < PER_THREAD; i++) {
    x->n[i] = (size_t)(1 + (x->id * 7 + i * 13) % 40) * 64 * KiB;
    if (rmmc_resource_allocate(x->r, x->n[i], 256, s, &x->d[i]) != RMMC_SUCCESS) {
      x->errors++;
      continue;
    }
    unsigned char *h = malloc(x->n[i]);
    make_pattern(h, x->n[i], 1000 + (uint64_t)(x->id * PER_THREAD + i));
    if (cudaMemcpyAsync(x->d[i], h, x->n[i], cudaMemcpyDefault, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      x->errors++;
    free(h);
    x->e[i] = malloc(sizeof *x->e[i]);
    if (rmmc_ipc_export(x->r, x->d[i], &x->e[i]->h, x->e[i]->fds, RMMC_IPC_MAX_FDS, &x->e[i]->n) !=
        RMMC_SUCCESS)
      x->errors++;
  }
  cudaStreamDestroy(s);
  return NULL;
}

START_TEST(test_gpu_concurrent_exports) {
  const char *specs[] = {CHUNKS, PAGES};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r = stack(specs[k]);
    exporter_t *x = calloc(THREADS, sizeof *x);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
      x[i].r = r;
      x[i].id = i;
      pthread_create(&t[i], NULL, export_many, &x[i]);
    }
    for (int i = 0; i < THREADS; i++) {
      pthread_join(t[i], NULL);
      ck_assert_int_eq(x[i].errors, 0);
    }
    rmmc_ipc_stats_t st = RMMC_IPC_STATS_INIT;
    ck_assert_int_eq(rmmc_ipc_get_stats(&st), RMMC_SUCCESS);
    ck_assert_uint_eq(st.exports, THREADS * PER_THREAD);
    peer_t peer = peer_start();
    for (int i = 0; i < THREADS; i++)
      for (int j = 0; j < PER_THREAD; j++) {
        uint64_t p = peer_import(&peer, x[i].e[j]);
        peer_expect(&peer, p, x[i].n[j], 1000 + (uint64_t)(i * PER_THREAD + j));
      }
    peer_reply_t s = peer_stats(&peer);
    ck_assert_uint_eq(IMPORTS(s), THREADS * PER_THREAD);
    if (k == 0) ck_assert_uint_lt(OPENS(s), THREADS * PER_THREAD); /* chunks shared */
    peer_stop(&peer); /* exits holding every import */
    for (int i = 0; i < THREADS; i++)
      for (int j = 0; j < PER_THREAD; j++) {
        ck_assert_int_eq(rmmc_resource_deallocate(r, x[i].d[j], x[i].n[j], 256, NULL),
                         RMMC_SUCCESS);
        exported_free(x[i].e[j]);
      }
    ck_assert_int_eq(rmmc_ipc_get_stats(&st), RMMC_SUCCESS);
    ck_assert_uint_eq(st.exports, 0);
    free(x);
    rmmc_resource_release(r);
  }
}
END_TEST

/* ---- stale handles ---- */

static void expect_peer_stale(peer_t *peer, const exported_t *e, const char *needle) {
  peer_reply_t r = peer_call(peer, PEER_IMPORT, 0, 0, 0, &e->h, e->fds, e->n);
  ck_assert_int_eq(r.status, RMMC_ERROR_STALE);
  ck_assert_msg(strstr(r.message, needle) != NULL, "'%s' lacks '%s'", r.message, needle);
  ck_assert_uint_eq(r.value[0], 0);
}

START_TEST(test_gpu_stale_handles) {
  const char *specs[] = {CHUNKS, PAGES};
  peer_t peer = peer_start();
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r = stack(specs[k]);
    void *a, *b, *c;
    ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &b), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &c), RMMC_SUCCESS);
    exported_t *ea = export_block(r, a), *eb = export_block(r, b), *ec = export_block(r, c);
    ck_assert_int_eq(rmmc_resource_deallocate(r, a, 3 * MiB, 256, NULL), RMMC_SUCCESS);
    expect_peer_stale(&peer, ea, "freed the block");
    ck_assert_int_eq(rmmc_ipc_revoke(b), RMMC_SUCCESS);
    expect_peer_stale(&peer, eb, "revoked");
    /* A new block where a was, exported: the old handle still stale. */
    void *a2;
    ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &a2), RMMC_SUCCESS);
    exported_t *ea2 = export_block(r, a2);
    uint64_t p = peer_import(&peer, ea2);
    PEER_OK(peer_call(&peer, PEER_CLOSE, p, 0, 0, NULL, NULL, 0));
    ck_assert_int_eq(peer_call(&peer, PEER_CHECK, 0, 0, 0, &ea->h, ea->fds, ea->n).status,
                     RMMC_ERROR_STALE);
    rmmc_resource_release(r); /* c and a2 still allocated: their exports die with it */
    expect_peer_stale(&peer, ec, "freed the block");
    expect_peer_stale(&peer, ea2, "freed the block");
    exported_free(ea), exported_free(eb), exported_free(ec), exported_free(ea2);
  }
  /* The peer exports, then exits: its handles are stale here. */
  peer_cmd_t c;
  memset(&c, 0, sizeof c);
  c.op = PEER_EXPORT;
  c.bytes = 2 * MiB;
  c.tag = 5;
  snprintf(c.spec, sizeof c.spec, "%s", CHUNKS);
  ck_assert_int_eq(send(peer.sock, &c, sizeof c, 0), (ssize_t)sizeof c);
  peer_reply_t r;
  ck_assert_int_eq(recv(peer.sock, &r, sizeof r, 0), (ssize_t)sizeof r);
  PEER_OK(r);
  exported_t *e = malloc(sizeof *e);
  ck_assert_int_eq(rmmc_ipc_recv(peer.sock, &e->h, e->fds, RMMC_IPC_MAX_FDS, &e->n), RMMC_SUCCESS);
  void *p;
  ck_assert_msg(rmmc_ipc_import(&e->h, e->fds, e->n, &p) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  expect_pattern(p, 2 * MiB, 5);
  ck_assert_int_eq(rmmc_ipc_close(p), RMMC_SUCCESS);
  peer_stop(&peer);
  p = (void *)1;
  ck_assert_int_eq(rmmc_ipc_import(&e->h, e->fds, e->n, &p), RMMC_ERROR_STALE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "exited"));
  ck_assert_ptr_null(p);
  exported_free(e);
}
END_TEST

/* ---- a child dies holding imports ---- */

START_TEST(test_gpu_child_dies_holding_imports) {
  CUDA_OK(cudaFree(0));
  size_t before = device_free();
  rmmc_resource_t *chunks = stack(CHUNKS), *pages = stack(PAGES);
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(chunks, 64 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pages, 64 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  fill(a, 64 * MiB, 1);
  fill(b, 64 * MiB, 2);
  exported_t *ea = export_block(chunks, a), *eb = export_block(pages, b);
  peer_t peer = peer_start();
  uint64_t pa = peer_import(&peer, ea), pb = peer_import(&peer, eb);
  peer_expect(&peer, pa, 64 * MiB, 1);
  peer_expect(&peer, pb, 64 * MiB, 2);
  peer_cmd_t c;
  memset(&c, 0, sizeof c);
  c.op = PEER_DIE;
  ck_assert_int_eq(send(peer.sock, &c, sizeof c, 0), (ssize_t)sizeof c);
  int status;
  ck_assert_int_eq(waitpid(peer.pid, &status, 0), peer.pid);
  ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  close(peer.sock);
  /* This side still frees and gives everything back. */
  expect_pattern(a, 64 * MiB, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(chunks, a, 64 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pages, b, 64 * MiB, 256, NULL), RMMC_SUCCESS);
  exported_free(ea);
  exported_free(eb);
  rmmc_resource_release(chunks);
  rmmc_resource_release(pages);
  /* The driver lets go of the dead process's context and imports soon. */
  size_t after = 0;
  for (int i = 0; i < 100 && (after = device_free()) + 64 * MiB < before; i++) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  ck_assert_msg(after + 64 * MiB >= before, "device free memory %zu MiB, %zu MiB before",
                after >> 20, before >> 20);
}
END_TEST

/* ---- refused ---- */

static void expect_refused(const char *spec, const char *needle) {
  rmmc_resource_t *r = stack(spec);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_ipc_handle_t h;
  int fds[8];
  size_t n = 9;
  ck_assert_int_eq(rmmc_ipc_export(r, p, &h, fds, 8, &n), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "%s: '%s' lacks '%s'", spec,
                rmmc_last_error_message(), needle);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}

/* Device-kind pages that are not cuda's: a layer over the host's virtual
 * memory that calls itself device memory. */
typedef struct devvm {
  rmmc_resource_t base;
  rmmc_resource_t *up;
} devvm_t;
static rmmc_status_t dv_allocate(rmmc_resource_t *r, size_t b, size_t a, cudaStream_t s, void **o) {
  return rmmc_resource_allocate(((devvm_t *)r)->up, b, a, s, o);
}
static rmmc_status_t dv_deallocate(rmmc_resource_t *r, void *p, size_t b, size_t a,
                                   cudaStream_t s) {
  return rmmc_resource_deallocate(((devvm_t *)r)->up, p, b, a, s);
}
static void dv_destroy(rmmc_resource_t *r) {
  rmmc_resource_release(((devvm_t *)r)->up);
  free(r);
}
static size_t dv_page(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const devvm_t *)r)->up);
}
static rmmc_status_t dv_reserve(rmmc_resource_t *r, size_t b, size_t a, void **o) {
  return rmmc_resource_vm_reserve(((devvm_t *)r)->up, b, a, o);
}
static rmmc_status_t dv_unreserve(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_unreserve(((devvm_t *)r)->up, p, b);
}
static rmmc_status_t dv_map(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_map(((devvm_t *)r)->up, p, b);
}
static rmmc_status_t dv_unmap(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_unmap(((devvm_t *)r)->up, p, b);
}
static const rmmc_resource_ops_t dv_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION, .name = "devvm", .allocate = dv_allocate,
    .deallocate = dv_deallocate, .destroy = dv_destroy, .vm_page_size = dv_page,
    .vm_reserve = dv_reserve, .vm_unreserve = dv_unreserve, .vm_map = dv_map,
    .vm_unmap = dv_unmap};

static void said_ipc(void *ctx, const rmmc_field_t *f) {
  if (strcmp(f->key, "ipc") == 0 && f->kind == RMMC_FIELD_TEXT && strstr(f->text, "shareable"))
    *(bool *)ctx = true;
}

START_TEST(test_gpu_refused) {
  expect_refused("pool(expandable=true) > cuda", "cuda(ipc=true)");
  expect_refused("managed", "managed memory");
  expect_refused("pool > managed", "managed memory");
  expect_refused("pinned", "pinned memory");
  expect_refused("cuda_async", "cuda_async");
  expect_refused("pool(expandable=false) > cuda_async", "cuda_async");
  expect_refused("fixed_size(block=4MiB, blocks_per_chunk=2) > cuda", "fixed_size");
  expect_refused("binning > pool > cuda", "binning");
  expect_refused("arena > cuda", "cuda(ipc=true)"); /* a pool: cuda's pages must be shareable */
  devvm_t *dv = calloc(1, sizeof *dv);
  rmmc_resource_init(&dv->base, &dv_ops, RMMC_MEMORY_DEVICE, 0);
  ck_assert_int_eq(rmmc_host_resource_create(&dv->up), RMMC_SUCCESS);
  rmmc_pool_options_t po = RMMC_POOL_OPTIONS_INIT;
  po.expandable = 1;
  po.address_space = 256 * MiB;
  rmmc_resource_t *pool = NULL;
  ck_assert_int_eq(rmmc_pool_resource_create(&dv->base, &po, &pool), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 3 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_ipc_handle_t h;
  int fds[4];
  size_t n;
  ck_assert_int_eq(rmmc_ipc_export(pool, p, &h, fds, 4, &n), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "pages of a devvm resource"));
  ck_assert_int_eq(rmmc_resource_deallocate(pool, p, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(pool);
  rmmc_resource_release(&dv->base);
  /* describe names the shareable pages. */
  rmmc_resource_t *r = stack("cuda(ipc=true)");
  bool said = false;
  rmmc_resource_describe(r, said_ipc, &said);
  ck_assert(said);
  rmmc_resource_release(r);
  r = stack("cuda");
  said = false;
  rmmc_resource_describe(r, said_ipc, &said);
  ck_assert(!said);
  rmmc_resource_release(r);
  rmmc_cuda_options_t o = RMMC_CUDA_OPTIONS_INIT;
  o.size = 1;
  ck_assert_int_eq(rmmc_cuda_resource_create_with_options(0, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

/* ---- queries and hooks on device memory ---- */

static void count_range(void *ptr, size_t bytes, void *user) {
  (void)ptr;
  ((uint64_t *)user)[0]++;
  ((uint64_t *)user)[1] += bytes;
}
static void uncount_range(void *ptr, size_t bytes, void *user) {
  (void)ptr;
  ((uint64_t *)user)[2]++;
  ((uint64_t *)user)[1] -= bytes;
}

START_TEST(test_gpu_queries_and_hooks) {
  rmmc_resource_t *cuda = stack("cuda");
  void *d, *m;
  ck_assert_int_eq(rmmc_resource_allocate(cuda, 5 * MiB, 256, NULL, &d), RMMC_SUCCESS);
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  ck_assert_int_eq(rmmc_resource_get_allocation(cuda, (char *)d + MiB, &a), RMMC_SUCCESS);
  ck_assert_ptr_eq(a.base, d);
  ck_assert_uint_ge(a.bytes, 5 * MiB);
  ck_assert_int_eq(a.backing, RMMC_BACKING_OWN);
  ck_assert_ptr_eq(a.resource, cuda);
  CUDA_OK(cudaMallocManaged(&m, MiB, cudaMemAttachGlobal));
  ck_assert_int_eq(rmmc_resource_get_allocation(cuda, m, &a), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "managed"));
  int local;
  ck_assert_int_eq(rmmc_resource_get_allocation(cuda, &local, &a), RMMC_ERROR_UNKNOWN_POINTER);
  CUDA_OK(cudaFree(m));
  ck_assert_int_eq(rmmc_resource_deallocate(cuda, d, 5 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(cuda);
  /* PyTorch's getBaseAllocation through the plug-in: a block's chunk (the
   * cudaMalloc allocation the driver knows), or the block itself on pages. */
  const char *specs[] = {CHUNKS, PAGES};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r = stack(specs[k]);
    ck_assert_int_eq(rmmc_set_device_resource(0, r, NULL), RMMC_SUCCESS);
    void *t = rmmc_torch_alloc(3 * MiB, 0, NULL);
    ck_assert_ptr_nonnull(t);
    size_t bytes = 0;
    void *base = rmmc_torch_base_alloc((char *)t, &bytes);
    if (k == 0) {
      ck_assert_int_eq(rmmc_resource_get_allocation(r, t, &a), RMMC_SUCCESS);
      ck_assert_ptr_eq(base, a.upstream.ptr);
      ck_assert_uint_ge(bytes, a.upstream.bytes);
      ck_assert_uint_ge(bytes, 32 * MiB);
    } else {
      ck_assert_ptr_eq(base, t);
      ck_assert_uint_eq(bytes, 3 * MiB);
    }
    rmmc_torch_free(t, 3 * MiB, 0, NULL);
    rmmc_registry_clear();
    rmmc_resource_release(r);
  }
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r = stack(specs[k]);
    uint64_t seen[3] = {0, 0, 0};
    rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
    h.on_acquire = count_range;
    h.on_release = uncount_range;
    h.user = seen;
    ck_assert_int_eq(rmmc_resource_set_memory_hooks(r, &h), RMMC_SUCCESS);
    void *p[4];
    for (int i = 0; i < 4; i++)
      ck_assert_int_eq(rmmc_resource_allocate(r, (size_t)(i + 1) * 40 * MiB, 256, NULL, &p[i]),
                       RMMC_SUCCESS);
    uint64_t reserved;
    ck_assert(rmmc_resource_get_field(r, "reserved", &reserved));
    ck_assert_uint_eq(seen[1], reserved);
    for (int i = 0; i < 4; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], (size_t)(i + 1) * 40 * MiB, 256, NULL),
                       RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
    ck_assert(rmmc_resource_get_field(r, "reserved", &reserved));
    ck_assert_uint_eq(seen[1], reserved);
    rmmc_resource_release(r);
    ck_assert_uint_eq(seen[1], 0);
    ck_assert_uint_eq(seen[0], seen[2]);
    ck_assert_uint_gt(seen[0], 0);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("gpu_ipc");
  TCase *tc = tcase_create("gpu_ipc");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_gpu_chunks_two_processes);
  tcase_add_test(tc, test_gpu_pages_two_processes);
  tcase_add_test(tc, test_gpu_cuda_base_and_same_process);
  tcase_add_test(tc, test_gpu_concurrent_exports);
  tcase_add_test(tc, test_gpu_stale_handles);
  tcase_add_test(tc, test_gpu_child_dies_holding_imports);
  tcase_add_test(tc, test_gpu_refused);
  tcase_add_test(tc, test_gpu_queries_and_hooks);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  peer_path = argc > 1 ? argv[1] : NULL;
  if (peer_path == NULL) {
    fprintf(stderr, "usage: test_gpu_ipc PATH_OF_ipc_peer\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  return rmmc_test_run(suite(), true);
}
