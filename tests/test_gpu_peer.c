/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer access on two GPUs (rmmc_resource_enable_peer_access). A kernel on
 * device 1 writes memory of a stack of device 0 and device 0 reads it back
 * (and the other way round), for blocks allocated before the call and for
 * blocks the stack took after it by growing: the expandable pool over cuda
 * (driver pages: cuMemSetAccess on every mapping), the chunk pool over cuda
 * and plain cuda (the contexts' peer access), cuda_async (its pool's
 * access) and managed memory. Copies between two devices' pools
 * (cudaMemcpyPeerAsync and cudaMemcpyAsync with cudaMemcpyDefault), checked
 * by data. One thread per device on its own stack (per-device default
 * specs in the registry) allocating, filling and freeing under load, a
 * quarter of its blocks handed to the other device's thread, which checks
 * them with a kernel of its own device and frees them with rmmc_deallocate
 * while its own device is current: every block goes back to the stack it
 * came from (each stack's statistics end at zero, counts equal). A pool of
 * device 1 used while device 0 is current: its events cover a free and
 * order the reuse by another stream, and device 0 stays current.
 *
 * On one GPU only the refusals run (a device as its own peer, devices that
 * do not exist; the current device left as it was), then the program says
 * "skipped: needs two GPUs" and exits 77, so a one-GPU run never reads as a
 * pass of the two-GPU cases; the same where two devices cannot be peers
 * (after checking that the refusal says so). Suite cuda, without fork.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_kernels.h"
#include "pool_util.h"
#include "rmmc/rmmc.h"
#include "test_util.h"

#define CUDA_OK(x)                                                                          \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    ck_assert_msg(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_));                \
  } while (0)
#define OK(x) ck_assert_msg((x) == RMMC_SUCCESS, "%s: %s", #x, rmmc_last_error_message())

static int ndev;

static rmmc_resource_t *stack_on(const char *spec, int device) {
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_stack_create(spec, device, &r);
  ck_assert_msg(st == RMMC_SUCCESS, "%s on device %d: %s", spec, device, rmmc_last_error_message());
  return r;
}

/* The pool layer of a stack, or NULL. */
static rmmc_resource_t *pool_in(rmmc_resource_t *r) {
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (strcmp(rmmc_resource_name(r), "pool") == 0) return r;
  return NULL;
}

static void sync_both(void) {
  for (int d = 0; d < 2 && d < ndev; d++) { /* one device in the one-GPU refusals */
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaDeviceSynchronize());
  }
}

/* Fills n bytes at p with the pattern of `seed` from a kernel on `device`,
 * and waits for it. */
static void write_on(int device, void *p, size_t n, uint32_t seed) {
  CUDA_OK(cudaSetDevice(device));
  CUDA_OK(gpu_fill_pattern(p, n, seed, NULL));
  CUDA_OK(cudaDeviceSynchronize());
}

/* The bytes of p that a kernel on `device` finds differing from `seed`'s
 * pattern. */
static unsigned long long wrong_on(int device, const void *p, size_t n, uint32_t seed) {
  CUDA_OK(cudaSetDevice(device));
  unsigned long long *d = NULL, h = ~0ull;
  CUDA_OK(cudaMalloc((void **)&d, sizeof *d));
  CUDA_OK(cudaMemset(d, 0, sizeof *d));
  CUDA_OK(gpu_check_pattern(p, n, seed, d, NULL));
  CUDA_OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d));
  return h;
}

static void *alloc_on(rmmc_resource_t *r, size_t n) {
  void *p = NULL;
  OK(rmmc_resource_allocate(r, n, 256, NULL, &p));
  ck_assert_ptr_nonnull(p);
  sync_both(); /* ready on device 0's legacy stream: let the other device's kernels at it */
  return p;
}

/* Device `peer` writes p and `owner` reads it back, then the other way. */
static void both_ways(const char *what, int owner, int peer, void *p, size_t n, uint32_t seed) {
  write_on(peer, p, n, seed);
  unsigned long long bad = wrong_on(owner, p, n, seed);
  ck_assert_msg(bad == 0,
                "%s: %llu of %zu bytes written by device %d read back wrong on device %d%s", what,
                bad, n, peer, owner,
                strstr(what, "cuda_async") ? " (NVIDIA bug 6098762 drops peer writes into pools "
                                             "after cudaMemPoolSetAccess on some drivers)"
                                           : "");
  write_on(owner, p, n, seed + 1);
  bad = wrong_on(peer, p, n, seed + 1);
  ck_assert_msg(bad == 0, "%s: device %d reads %llu of %zu bytes wrong", what, peer, bad, n);
}

/* ---- one GPU: refusals ---- */

static const char *const every_base[] = {"pool > cuda", "pool(expandable=false) > cuda", "cuda",
                                         "cuda_async", "managed"};

START_TEST(test_gpu_peer_refusals) {
  for (size_t i = 0; i < sizeof every_base / sizeof every_base[0]; i++) {
    rmmc_resource_t *r = stack_on(every_base[i], 0);
    CUDA_OK(cudaSetDevice(0));
    ck_assert_int_eq(rmmc_resource_enable_peer_access(r, 0), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(rmmc_last_error_message(), "device 0 cannot be its own peer"), "%s: %s",
                  every_base[i], rmmc_last_error_message());
    ck_assert_int_eq(rmmc_resource_enable_peer_access(r, ndev), RMMC_ERROR_INVALID_ARGUMENT);
    char want[64];
    snprintf(want, sizeof want, "device %d does not exist", ndev);
    ck_assert_msg(strstr(rmmc_last_error_message(), want), "%s: %s", every_base[i],
                  rmmc_last_error_message());
    ck_assert_int_eq(rmmc_resource_enable_peer_access(r, -1), RMMC_ERROR_INVALID_ARGUMENT);
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    ck_assert_int_eq(cur, 0);
    /* The stack still works. */
    void *p = alloc_on(r, MiB);
    write_on(0, p, MiB, 3);
    ck_assert_uint_eq(wrong_on(0, p, MiB, 3), 0);
    OK(rmmc_resource_deallocate(r, p, MiB, 256, NULL));
    rmmc_resource_release(r);
  }
  /* Pinned memory belongs to no device: every device that exists reaches it. */
  rmmc_resource_t *pinned = stack_on("pinned", -1);
  OK(rmmc_resource_enable_peer_access(pinned, 0));
  ck_assert_int_eq(rmmc_resource_enable_peer_access(pinned, ndev), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_release(pinned);
  ck_assert(!rmmc_device_can_access_peer(0, 0));
  ck_assert(!rmmc_device_can_access_peer(0, ndev));
  /* Two devices that cannot be peers: the refusal names both. */
  if (ndev >= 2 && !rmmc_device_can_access_peer(1, 0)) {
    rmmc_resource_t *r = stack_on("pool(expandable=false) > cuda", 0);
    ck_assert_int_eq(rmmc_resource_enable_peer_access(r, 1), RMMC_ERROR_NOT_SUPPORTED);
    ck_assert_msg(strstr(rmmc_last_error_message(),
                         "device 1 cannot access the memory of device 0"),
                  "%s", rmmc_last_error_message());
    rmmc_resource_release(r);
  }
}
END_TEST

/* ---- two GPUs ---- */

typedef struct kernel_case {
  const char *spec;
  const char *backend; /* the pool's "backend" text, or NULL */
  size_t grow;         /* a request that makes the stack take new memory */
} kernel_case_t;

static const kernel_case_t kernel_cases[] = {
    {"pool > cuda", "virtual memory", 256 * MiB},
    {"pool(initial=64MiB) > cuda", "virtual memory", 256 * MiB}, /* mapped at creation */
    {"pool(expandable=false) > cuda", "chunks", 256 * MiB},
    {"statistics > binning > pool > cuda", "virtual memory", 256 * MiB},
    {"cuda", NULL, 64 * MiB},
    {"cuda_async", NULL, 64 * MiB},
    {"managed", NULL, 16 * MiB},
};

/* Device 1's kernels on device 0's memory: before the stack grows (a block
 * allocated before the call) and after (a block that made it grow); the
 * current device (0, then 1) is the same after the call as before. */
START_TEST(test_gpu_peer_kernel_on_1_writes_memory_of_0) {
  const kernel_case_t *c = &kernel_cases[_i];
  rmmc_resource_t *r = stack_on(c->spec, 0), *pool = pool_in(r);
  if (c->backend != NULL) {
    char text[64] = "";
    ck_assert(pool_text(pool, "backend", text, sizeof text));
    ck_assert_str_eq(text, c->backend);
  }
  size_t n = 8 * MiB;
  void *before = alloc_on(r, n);
  for (int current = 0; current < 2; current++) { /* the second time: nothing changes */
    CUDA_OK(cudaSetDevice(current));
    OK(rmmc_resource_enable_peer_access(r, 1));
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    ck_assert_msg(cur == current, "%s: device %d current after the call, not %d", c->spec, cur,
                  current);
  }
  both_ways(c->spec, 0, 1, before, n, 11);

  uint64_t reserved = pool != NULL ? field(pool, "reserved") : 0;
  void *after = alloc_on(r, c->grow);
  if (pool != NULL)
    ck_assert_msg(field(pool, "reserved") > reserved, "%s: the pool did not grow", c->spec);
  both_ways(c->spec, 0, 1, after, c->grow, 21);
  both_ways(c->spec, 0, 1, before, n, 31); /* still */
  if (pool != NULL) {
    char peers[64] = "";
    ck_assert(pool_text(pool, "peers", peers, sizeof peers));
    ck_assert_str_eq(peers, "1");
  }
  OK(rmmc_resource_deallocate(r, after, c->grow, 256, NULL));
  OK(rmmc_resource_deallocate(r, before, n, 256, NULL));
  /* Given back and taken again: new mappings, reachable again. */
  OK(rmmc_resource_release_cached(r));
  void *again = alloc_on(r, c->grow);
  both_ways(c->spec, 0, 1, again, c->grow, 41);
  OK(rmmc_resource_deallocate(r, again, c->grow, 256, NULL));
  CUDA_OK(cudaSetDevice(0));
  rmmc_resource_release(r);
}
END_TEST

/* Enabled on an expandable pool before it maps anything, from device 0. */
START_TEST(test_gpu_peer_enabled_before_any_mapping) {
  rmmc_resource_t *r = stack_on("pool > cuda", 0);
  CUDA_OK(cudaSetDevice(0));
  OK(rmmc_resource_enable_peer_access(r, 1));
  ck_assert_uint_eq(field(r, "mappings"), 0);
  void *p = alloc_on(r, 100 * MiB);
  ck_assert_uint_ge(field(r, "mappings"), 3);
  both_ways("pool > cuda, enabled first", 0, 1, p, 100 * MiB, 51);
  OK(rmmc_resource_deallocate(r, p, 100 * MiB, 256, NULL));
  rmmc_resource_release(r);
}
END_TEST

/* Copies between a pool of device 0 and a pool of device 1, both ways,
 * checked by kernels on the receiving device. */
typedef struct copy_case {
  const char *spec0, *spec1;
} copy_case_t;

static const copy_case_t copy_cases[] = {
    {"pool > cuda", "pool > cuda"},
    {"pool(expandable=false) > cuda", "pool(expandable=false) > cuda"},
    {"pool > cuda", "pool(expandable=false) > cuda"},
};

START_TEST(test_gpu_peer_copies_between_pools) {
  const copy_case_t *c = &copy_cases[_i];
  rmmc_resource_t *r0 = stack_on(c->spec0, 0), *r1 = stack_on(c->spec1, 1);
  OK(rmmc_resource_enable_peer_access(r0, 1));
  OK(rmmc_resource_enable_peer_access(r1, 0));
  size_t sizes[] = {MiB, 64 * MiB + 4096};
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    void *a0 = alloc_on(r0, n), *a1 = alloc_on(r1, n);
    uint32_t seed = 60u + (uint32_t)k;
    write_on(0, a0, n, seed);
    cudaStream_t s;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMemcpyPeerAsync(a1, 1, a0, 0, n, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamDestroy(s));
    ck_assert_msg(wrong_on(1, a1, n, seed) == 0, "%s -> %s: %zu bytes copied wrong", c->spec0,
                  c->spec1, n);
    write_on(1, a1, n, seed + 10);
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMemcpyAsync(a0, a1, n, cudaMemcpyDefault, s)); /* as PyTorch copies */
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamDestroy(s));
    ck_assert_msg(wrong_on(0, a0, n, seed + 10) == 0, "%s <- %s: %zu bytes copied wrong", c->spec0,
                  c->spec1, n);
    OK(rmmc_resource_deallocate(r0, a0, n, 256, NULL));
    OK(rmmc_resource_deallocate(r1, a1, n, 256, NULL));
  }
  CUDA_OK(cudaSetDevice(0));
  rmmc_resource_release(r1);
  rmmc_resource_release(r0);
}
END_TEST

/* ---- one thread per device, on its own stack ---- */

#define BOX 64
#define LIVE 32
typedef struct mail {
  void *p;
  size_t n;
  uint32_t seed;
} mail_t;

typedef struct box {
  pthread_mutex_t lock;
  mail_t m[BOX];
  int n;
} box_t;

typedef struct worker {
  int device;
  box_t *mine, *theirs; /* blocks for this thread to check and free; for the other */
  pthread_barrier_t *done;
  cudaStream_t stream; /* destroyed by the main thread after the stacks (they keep per-stream state) */
  uint64_t rng;
  int iters;
  /* results, read by the main thread after the join */
  uint64_t allocs, own_frees, handed, received, bytes;
  unsigned long long wrong;
  int failures, wrong_device;
  char first[256];
} worker_t;

static void w_fail(worker_t *w, const char *what, const char *why) {
  if (w->failures++ == 0) snprintf(w->first, sizeof w->first, "device %d: %s: %s", w->device, what, why);
}
#define W_CUDA(w, x)                                                            \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) w_fail((w), #x, cudaGetErrorString(e_));             \
  } while (0)
#define W_RMMC(w, x)                                                            \
  do {                                                                          \
    if ((x) != RMMC_SUCCESS) w_fail((w), #x, rmmc_last_error_message());        \
  } while (0)

static uint64_t w_next(worker_t *w) {
  w->rng ^= w->rng << 13, w->rng ^= w->rng >> 7, w->rng ^= w->rng << 17;
  return w->rng;
}

/* Checks and frees what the other thread handed over: a kernel of this
 * device reads the other device's memory, then the block goes back with
 * rmmc_deallocate while this device is current. */
static void take_mail(worker_t *w, cudaStream_t s, unsigned long long *d_wrong) {
  mail_t got[BOX];
  pthread_mutex_lock(&w->mine->lock);
  int n = w->mine->n;
  memcpy(got, w->mine->m, (size_t)n * sizeof got[0]);
  w->mine->n = 0;
  pthread_mutex_unlock(&w->mine->lock);
  for (int i = 0; i < n; i++) W_CUDA(w, gpu_check_pattern(got[i].p, got[i].n, got[i].seed, d_wrong, s));
  if (n > 0) W_CUDA(w, cudaStreamSynchronize(s));
  for (int i = 0; i < n; i++) W_RMMC(w, rmmc_deallocate(got[i].p, got[i].n, NULL));
  w->received += (uint64_t)n;
}

static void *device_main(void *arg) {
  worker_t *w = arg;
  cudaStream_t s = NULL;
  unsigned long long *d_wrong = NULL;
  W_CUDA(w, cudaSetDevice(w->device));
  W_CUDA(w, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  w->stream = s;
  W_CUDA(w, cudaMalloc((void **)&d_wrong, sizeof *d_wrong));
  W_CUDA(w, cudaMemset(d_wrong, 0, sizeof *d_wrong));
  mail_t live[LIVE];
  int nlive = 0;
  for (int it = 0; it < w->iters && w->failures == 0; it++) {
    if (it % 16 == 0) take_mail(w, s, d_wrong);
    uint64_t r = w_next(w);
    if (nlive < LIVE && (nlive == 0 || (r & 1))) {
      size_t n = (r >> 8) % 97 == 0 ? 48 * MiB + (r >> 20) % MiB : 256 + (size_t)((r >> 16) % (4 * MiB));
      void *p = NULL;
      W_RMMC(w, rmmc_allocate(n, s, &p));
      if (p == NULL) break;
      mail_t m = {p, n, (uint32_t)(r >> 32)};
      W_CUDA(w, gpu_fill_pattern(p, n, m.seed, s));
      live[nlive++] = m;
      w->allocs++;
      w->bytes += n;
      continue;
    }
    int i = (int)((r >> 4) % (uint64_t)nlive);
    mail_t m = live[i];
    live[i] = live[--nlive];
    bool hand = (r >> 40) % 4 == 0;
    if (hand) {
      W_CUDA(w, cudaStreamSynchronize(s)); /* its fill is done before the other device reads */
      pthread_mutex_lock(&w->theirs->lock);
      hand = w->theirs->n < BOX;
      if (hand) w->theirs->m[w->theirs->n++] = m;
      pthread_mutex_unlock(&w->theirs->lock);
    }
    if (hand) {
      w->handed++;
    } else {
      W_CUDA(w, gpu_check_pattern(m.p, m.n, m.seed, d_wrong, s));
      W_RMMC(w, rmmc_deallocate(m.p, m.n, s));
      w->own_frees++;
    }
  }
  for (int i = 0; i < nlive; i++) {
    W_CUDA(w, gpu_check_pattern(live[i].p, live[i].n, live[i].seed, d_wrong, s));
    W_RMMC(w, rmmc_deallocate(live[i].p, live[i].n, s));
    w->own_frees++;
  }
  pthread_barrier_wait(w->done); /* nothing more is handed over */
  take_mail(w, s, d_wrong);
  W_CUDA(w, cudaStreamSynchronize(s));
  W_CUDA(w, cudaMemcpy(&w->wrong, d_wrong, sizeof w->wrong, cudaMemcpyDeviceToHost));
  int cur = -1;
  W_CUDA(w, cudaGetDevice(&cur));
  w->wrong_device = cur != w->device;
  W_CUDA(w, cudaFree(d_wrong));
  return NULL;
}

START_TEST(test_gpu_peer_one_thread_per_device) {
  rmmc_registry_clear();
  OK(rmmc_set_default_spec("statistics > pool > cuda; 1: statistics > pool(expandable=false) > cuda"));
  rmmc_resource_t *r[2];
  for (int d = 0; d < 2; d++) OK(rmmc_get_device_resource(d, &r[d]));
  ck_assert_str_eq(rmmc_resource_name(r[0]), "statistics");
  char text[64];
  ck_assert(pool_text(pool_in(r[0]), "backend", text, sizeof text));
  ck_assert_str_eq(text, "virtual memory");
  ck_assert(pool_text(pool_in(r[1]), "backend", text, sizeof text));
  ck_assert_str_eq(text, "chunks");
  OK(rmmc_resource_enable_peer_access(r[0], 1));
  OK(rmmc_resource_enable_peer_access(r[1], 0));

  box_t box[2];
  pthread_barrier_t done;
  pthread_barrier_init(&done, NULL, 2);
  worker_t w[2];
  pthread_t t[2];
  for (int d = 0; d < 2; d++) {
    pthread_mutex_init(&box[d].lock, NULL);
    box[d].n = 0;
  }
  for (int d = 0; d < 2; d++) {
    w[d] = (worker_t){.device = d, .mine = &box[d], .theirs = &box[1 - d], .done = &done,
                      .rng = 0x9E3779B97F4A7C15ull * (uint64_t)(d + 1), .iters = 4000};
    pthread_create(&t[d], NULL, device_main, &w[d]);
  }
  for (int d = 0; d < 2; d++) pthread_join(t[d], NULL);
  for (int d = 0; d < 2; d++) {
    ck_assert_msg(w[d].failures == 0, "%d failures; the first: %s", w[d].failures, w[d].first);
    ck_assert_msg(w[d].wrong == 0, "device %d: %llu bytes read back wrong", d, w[d].wrong);
    ck_assert_int_eq(w[d].wrong_device, 0);
    ck_assert_uint_gt(w[d].handed, 20);
    ck_assert_uint_eq(w[d].handed, w[1 - d].received);
    ck_assert_uint_eq(w[d].allocs, w[d].own_frees + w[d].handed);
    rmmc_statistics_t st = RMMC_STATISTICS_INIT;
    OK(rmmc_statistics_adaptor_get(r[d], &st));
    ck_assert_msg(st.current_bytes == 0 && st.current_count == 0,
                  "device %d's stack holds %lld bytes in %lld blocks", d,
                  (long long)st.current_bytes, (long long)st.current_count);
    ck_assert_uint_eq(st.total_count, w[d].allocs); /* every block came back to its own stack */
    ck_assert_uint_eq(st.deallocations, w[d].allocs);
    ck_assert_uint_eq(st.total_bytes, w[d].bytes);
  }
  for (int d = 0; d < 2; d++) pthread_mutex_destroy(&box[d].lock);
  pthread_barrier_destroy(&done);
  rmmc_registry_clear();
  OK(rmmc_set_default_spec("cuda"));
  for (int d = 0; d < 2; d++) {
    CUDA_OK(cudaSetDevice(d));
    if (w[d].stream != NULL) CUDA_OK(cudaStreamDestroy(w[d].stream));
  }
  CUDA_OK(cudaSetDevice(0));
}
END_TEST

/* ---- stream events of device 1 while device 0 is current ----
 * The pool's device check asks the driver (the current context's device
 * against the driver's handle of the pool's device) and switches through
 * the runtime when they differ. A large free on a stream of device 1, made
 * while device 0 is current, must be covered by device 1's event, another
 * stream of device 1 must get the block only after the kernel queued
 * before the free, and device 0 must be current again after each call. */
START_TEST(test_gpu_peer_events_of_device_1_with_0_current) {
  const size_t n = (size_t)2 << 20;
  const uint64_t slow_ns = (uint64_t)50 * 1000 * 1000;
  CUDA_OK(cudaSetDevice(1));
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CUDA_OK(cudaSetDevice(0));
  rmmc_resource_t *r = stack_on("pool > cuda", 1);
  void *known, *p, *q;
  OK(rmmc_resource_allocate(r, 256, 256, b, &known)); /* two streams: frees record */
  OK(rmmc_resource_allocate(r, n, 256, a, &p));
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(gpu_slow_fill(p, n, 0xA5, slow_ns, a));
  CUDA_OK(cudaSetDevice(0));
  uint64_t records = field(r, "event_records");
  OK(rmmc_resource_deallocate(r, p, n, 256, a));
  ck_assert_uint_eq(field(r, "event_records"), records + 1);
  int cur = -1;
  OK(rmmc_get_current_device(&cur));
  ck_assert_int_eq(cur, 0);
  OK(rmmc_resource_allocate(r, n, 256, b, &q));
  ck_assert_msg(q == p, "stream b got %p, not the freed block %p: the case proves nothing", q, p);
  ck_assert_uint_ge(field(r, "event_waits"), 1);
  OK(rmmc_get_current_device(&cur));
  ck_assert_int_eq(cur, 0);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMemsetAsync(q, 0x3C, n, b));
  CUDA_OK(cudaDeviceSynchronize());
  unsigned char *h = malloc(n);
  ck_assert_ptr_nonnull(h);
  CUDA_OK(cudaMemcpy(h, q, n, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != 0x3C;
  free(h);
  ck_assert_msg(bad == 0, "%zu of %zu bytes were overwritten after the block changed streams", bad,
                n);
  CUDA_OK(cudaSetDevice(0));
  OK(rmmc_resource_deallocate(r, q, n, 256, b));
  OK(rmmc_resource_deallocate(r, known, 256, 256, b));
  OK(rmmc_pool_resource_check(r));
  rmmc_resource_release(r);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CUDA_OK(cudaSetDevice(0));
}
END_TEST

int main(void) {
  ndev = rmmc_device_count();
  if (ndev == 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  bool two = ndev >= 2 && rmmc_device_can_access_peer(0, 1) && rmmc_device_can_access_peer(1, 0);
  Suite *s = suite_create("gpu_peer");
  TCase *one = tcase_create("one_gpu");
  tcase_set_timeout(one, 300);
  tcase_add_test(one, test_gpu_peer_refusals);
  suite_add_tcase(s, one);
  if (two) {
    TCase *tc = tcase_create("two_gpus");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_gpu_peer_kernel_on_1_writes_memory_of_0, 0,
                        (int)(sizeof kernel_cases / sizeof kernel_cases[0]));
    tcase_add_test(tc, test_gpu_peer_enabled_before_any_mapping);
    tcase_add_loop_test(tc, test_gpu_peer_copies_between_pools, 0,
                        (int)(sizeof copy_cases / sizeof copy_cases[0]));
    tcase_add_test(tc, test_gpu_peer_one_thread_per_device);
    tcase_add_test(tc, test_gpu_peer_events_of_device_1_with_0_current);
    suite_add_tcase(s, tc);
  }
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (failed != 0) return EXIT_FAILURE;
  if (!two) {
    printf("skipped: needs two GPUs that can be peers (%d device%s%s); only the one-GPU refusals "
           "ran, and passed\n",
           ndev, ndev == 1 ? "" : "s", ndev >= 2 ? ", not peers" : "");
    return 77;
  }
  return EXIT_SUCCESS;
}
