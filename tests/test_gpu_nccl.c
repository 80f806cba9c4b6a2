/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL on rmmc pool memory, registered through rmmc's memory hooks.
 *
 * One process drives every visible GPU (ncclCommInitAll). Each device gets
 * its own `pool > cuda` stack whose memory hooks register every mapping
 * the pool takes with that device's communicator (ncclCommRegister) and
 * deregister it before the pool gives it back (ncclCommDeregister): each
 * range exactly once, since registering a range twice exhausts NCCL's
 * registration space (NVIDIA/nccl#2331). The pool grows after the hooks
 * are installed (the collectives' buffers), trims (release_cached) and is
 * destroyed; the test checks that every on_acquire was registered once,
 * every on_release matched a registration and came while the range was
 * still mapped, and nothing is left registered. All-reduce, all-gather and
 * reduce-scatter on pool blocks are checked value by value; then all-reduce
 * bandwidth on pool blocks is measured against cudaMalloc buffers in the
 * same run (3 alternating rounds, medians).
 *
 * NCCL is not linked: the program dlopens $RMMC_NCCL_LIB, else
 * libnccl.so.2 (scripts/gpu-dist points it at the libnccl of PyTorch's
 * nvidia-nccl wheel), and declares the few entry points it uses below.
 * Without a GPU or without libnccl it exits 77 (skipped). NVLink multicast
 * stays off (NCCL_NVLS_ENABLE=0 is set before NCCL starts).
 *
 * It prints "registered N" / "deregistered N" totals for counting against
 * NCCL's own log (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG: one "register comm
 * ... buffer ..." line per ncclCommRegister).
 *
 * Usage: test_gpu_nccl [--bytes N] [--iters N] [--rounds N] [--spec SPEC]
 *                      [--bw-tolerance F]   (F: 0.03 fails below 97% of
 *                      cudaMalloc's bandwidth; default: report only)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "rmmc/rmmc.h"

#include "support/nccl_api.h"

static struct {
  comm_init_all_fn comm_init_all;
  comm_destroy_fn comm_destroy;
  comm_register_fn comm_register;
  comm_deregister_fn comm_deregister;
  all_reduce_fn all_reduce;
  all_gather_fn all_gather;
  reduce_scatter_fn reduce_scatter;
  group_fn group_start, group_end;
  error_string_fn error_string;
} nccl;

#define MAX_DEV 16
#define MAX_RANGES 4096

static int failures;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      failures++;                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
    }                                                             \
  } while (0)

#define NCCL_OK(call)                                                                     \
  do {                                                                                    \
    nccl_result_t r_ = (call);                                                            \
    if (r_ != NCCL_SUCCESS) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
              nccl.error_string(r_));                                                     \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
              cudaGetErrorString(e_));                                                    \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#define RMMC_OK(call)                                                                     \
  do {                                                                                    \
    rmmc_status_t s_ = (call);                                                            \
    if (s_ != RMMC_SUCCESS) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
              rmmc_last_error_message());                                                 \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* What one device's hooks registered: the ranges held now, and counts. */
typedef struct registry {
  int device;
  nccl_comm_t comm;
  size_t n;
  struct { void *ptr; size_t bytes; void *handle; } ranges[MAX_RANGES];
  unsigned long acquired, released, registered, deregistered;
  unsigned long twice, unknown, unmapped_at_release, nccl_errors;
  int phase; /* counts acquires after the hooks were installed */
  unsigned long acquired_later;
} registry_t;

static registry_t regs[MAX_DEV];

static void on_acquire(void *ptr, size_t bytes, void *user) {
  registry_t *g = user;
  int old = -1;
  g->acquired++;
  if (g->phase) g->acquired_later++;
  for (size_t i = 0; i < g->n; i++)
    if (g->ranges[i].ptr == ptr) {
      g->twice++; /* never register a range twice */
      return;
    }
  if (g->n == MAX_RANGES) {
    g->nccl_errors++;
    return;
  }
  cudaGetDevice(&old);
  cudaSetDevice(g->device);
  void *handle = NULL;
  nccl_result_t r = nccl.comm_register(g->comm, ptr, bytes, &handle);
  if (old >= 0) cudaSetDevice(old);
  if (r != NCCL_SUCCESS) {
    fprintf(stderr, "ncclCommRegister(device %d, %p, %zu): %s\n", g->device, ptr, bytes,
            nccl.error_string(r));
    g->nccl_errors++;
    return;
  }
  g->ranges[g->n].ptr = ptr;
  g->ranges[g->n].bytes = bytes;
  g->ranges[g->n].handle = handle;
  g->n++;
  g->registered++;
}

static void on_release(void *ptr, size_t bytes, void *user) {
  registry_t *g = user;
  int old = -1;
  g->released++;
  size_t i = 0;
  while (i < g->n && g->ranges[i].ptr != ptr) i++;
  if (i == g->n || g->ranges[i].bytes != bytes) {
    g->unknown++;
    return;
  }
  /* Still mapped: the pool must call before it unmaps. */
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, (char *)ptr + bytes - 1) != cudaSuccess ||
      a.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    g->unmapped_at_release++;
  }
  cudaGetDevice(&old);
  cudaSetDevice(g->device);
  nccl_result_t r = nccl.comm_deregister(g->comm, g->ranges[i].handle);
  if (old >= 0) cudaSetDevice(old);
  if (r != NCCL_SUCCESS) {
    fprintf(stderr, "ncclCommDeregister(device %d, %p): %s\n", g->device, ptr,
            nccl.error_string(r));
    g->nccl_errors++;
  } else {
    g->deregistered++;
  }
  g->ranges[i] = g->ranges[--g->n];
}

static int load_nccl(void) {
  const char *path = getenv("RMMC_NCCL_LIB");
  void *h = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    printf("skipped: cannot load NCCL (%s); set RMMC_NCCL_LIB\n", dlerror());
    return 0;
  }
#define SYM(field, name)                                          \
  do {                                                            \
    *(void **)(&nccl.field) = dlsym(h, name);                     \
    if (nccl.field == NULL) {                                     \
      printf("skipped: %s has no %s\n", path ? path : "libnccl", name); \
      return 0;                                                   \
    }                                                             \
  } while (0)
  SYM(comm_init_all, "ncclCommInitAll");
  SYM(comm_destroy, "ncclCommDestroy");
  SYM(comm_register, "ncclCommRegister");
  SYM(comm_deregister, "ncclCommDeregister");
  SYM(all_reduce, "ncclAllReduce");
  SYM(all_gather, "ncclAllGather");
  SYM(reduce_scatter, "ncclReduceScatter");
  SYM(group_start, "ncclGroupStart");
  SYM(group_end, "ncclGroupEnd");
  SYM(error_string, "ncclGetErrorString");
#undef SYM
  return 1;
}

/* The value rank r holds at index i: small integers, exact in float sums. */
static float value(int r, size_t i) { return (float)((r + 1) * 10 + (int)(i % 13)); }

/* Rank `rank`'s values into its device's buffer. The copy runs on the
 * legacy stream, which the collectives' non-blocking streams do not wait
 * for: the device is synchronized before they start. */
static void fill(float *dev_ptr, int rank, size_t count, size_t offset) {
  float *h = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) h[i] = value(rank, offset + i);
  CUDA_OK(cudaSetDevice(rank));
  CUDA_OK(cudaMemcpy(dev_ptr, h, count * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  free(h);
}

/* From the device that holds dev_ptr: an expandable pool's pages are
 * granted to their own device only, so a copy made while another device is
 * current is refused (invalid argument). */
static float *read_back(const float *dev_ptr, size_t count) {
  struct cudaPointerAttributes a;
  CUDA_OK(cudaPointerGetAttributes(&a, dev_ptr));
  CUDA_OK(cudaSetDevice(a.device));
  float *h = malloc(count * sizeof(float));
  CUDA_OK(cudaMemcpy(h, dev_ptr, count * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

static int ndev;
static nccl_comm_t comms[MAX_DEV];
static cudaStream_t streams[MAX_DEV];
static rmmc_resource_t *pools[MAX_DEV];

static void *pool_alloc(int d, size_t bytes) {
  void *p;
  CUDA_OK(cudaSetDevice(d));
  RMMC_OK(rmmc_resource_allocate(pools[d], bytes, 256, streams[d], &p));
  return p;
}

static void pool_free(int d, void *p, size_t bytes) {
  CUDA_OK(cudaSetDevice(d));
  RMMC_OK(rmmc_resource_deallocate(pools[d], p, bytes, 256, streams[d]));
}

static void sync_all(void) {
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamSynchronize(streams[d]));
  }
}

/* All-reduce, all-gather and reduce-scatter of `count` floats per rank on
 * pool blocks; every value read back and checked. */
static void collectives(size_t count) {
  float *send[MAX_DEV], *recv[MAX_DEV];
  size_t big = count * (size_t)ndev;
  for (int d = 0; d < ndev; d++) {
    send[d] = pool_alloc(d, big * sizeof(float));
    recv[d] = pool_alloc(d, big * sizeof(float));
  }
  /* all-reduce: recv[i] = sum over ranks of value(r, i) */
  for (int d = 0; d < ndev; d++) fill(send[d], d, count, 0);
  NCCL_OK(nccl.group_start());
  for (int d = 0; d < ndev; d++)
    NCCL_OK(nccl.all_reduce(send[d], recv[d], count, NCCL_FLOAT32, NCCL_SUM, comms[d], streams[d]));
  NCCL_OK(nccl.group_end());
  sync_all();
  unsigned long bad = 0;
  for (int d = 0; d < ndev; d++) {
    float *h = read_back(recv[d], count);
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int r = 0; r < ndev; r++) want += value(r, i);
      bad += h[i] != want;
    }
    free(h);
  }
  CHECK(bad == 0, "all-reduce: %lu wrong values", bad);
  printf("collective all-reduce (%zu floats x %d ranks, pool blocks): %s\n", count, ndev,
         bad ? "WRONG" : "values ok");

  /* all-gather: recv[r * count + i] = value(r, i) */
  NCCL_OK(nccl.group_start());
  for (int d = 0; d < ndev; d++)
    NCCL_OK(nccl.all_gather(send[d], recv[d], count, NCCL_FLOAT32, comms[d], streams[d]));
  NCCL_OK(nccl.group_end());
  sync_all();
  bad = 0;
  for (int d = 0; d < ndev; d++) {
    float *h = read_back(recv[d], big);
    for (int r = 0; r < ndev; r++)
      for (size_t i = 0; i < count; i++) bad += h[(size_t)r * count + i] != value(r, i);
    free(h);
  }
  CHECK(bad == 0, "all-gather: %lu wrong values", bad);
  printf("collective all-gather: %s\n", bad ? "WRONG" : "values ok");

  /* reduce-scatter: rank d gets sum over r of value(r, d * count + i) */
  for (int d = 0; d < ndev; d++) fill(send[d], d, big, 0);
  NCCL_OK(nccl.group_start());
  for (int d = 0; d < ndev; d++)
    NCCL_OK(nccl.reduce_scatter(send[d], recv[d], count, NCCL_FLOAT32, NCCL_SUM, comms[d],
                                streams[d]));
  NCCL_OK(nccl.group_end());
  sync_all();
  bad = 0;
  for (int d = 0; d < ndev; d++) {
    float *h = read_back(recv[d], count);
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int r = 0; r < ndev; r++) want += value(r, (size_t)d * count + i);
      bad += h[i] != want;
    }
    free(h);
  }
  CHECK(bad == 0, "reduce-scatter: %lu wrong values", bad);
  printf("collective reduce-scatter: %s\n", bad ? "WRONG" : "values ok");
  for (int d = 0; d < ndev; d++) {
    pool_free(d, send[d], big * sizeof(float));
    pool_free(d, recv[d], big * sizeof(float));
  }
}

/* Seconds per all-reduce of `bytes` over the buffers given. */
static double time_all_reduce(float **send, float **recv, size_t bytes, int iters) {
  size_t count = bytes / sizeof(float);
  cudaEvent_t start[MAX_DEV], stop[MAX_DEV];
  for (int w = 0; w < 3; w++) { /* warm-up */
    NCCL_OK(nccl.group_start());
    for (int d = 0; d < ndev; d++)
      NCCL_OK(nccl.all_reduce(send[d], recv[d], count, NCCL_FLOAT32, NCCL_SUM, comms[d],
                              streams[d]));
    NCCL_OK(nccl.group_end());
  }
  sync_all();
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaEventCreate(&start[d]));
    CUDA_OK(cudaEventCreate(&stop[d]));
    CUDA_OK(cudaEventRecord(start[d], streams[d]));
  }
  for (int it = 0; it < iters; it++) {
    NCCL_OK(nccl.group_start());
    for (int d = 0; d < ndev; d++)
      NCCL_OK(nccl.all_reduce(send[d], recv[d], count, NCCL_FLOAT32, NCCL_SUM, comms[d],
                              streams[d]));
    NCCL_OK(nccl.group_end());
  }
  double worst = 0;
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaEventRecord(stop[d], streams[d]));
  }
  for (int d = 0; d < ndev; d++) {
    float ms;
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaEventSynchronize(stop[d]));
    CUDA_OK(cudaEventElapsedTime(&ms, start[d], stop[d]));
    if (ms > worst) worst = ms;
    cudaEventDestroy(start[d]);
    cudaEventDestroy(stop[d]);
  }
  return worst / 1000.0 / iters;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void bandwidth(size_t bytes, int iters, int rounds, double tolerance) {
  float *ps[MAX_DEV], *pr[MAX_DEV], *cs[MAX_DEV], *cr[MAX_DEV];
  for (int d = 0; d < ndev; d++) {
    ps[d] = pool_alloc(d, bytes);
    pr[d] = pool_alloc(d, bytes);
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaMalloc((void **)&cs[d], bytes));
    CUDA_OK(cudaMalloc((void **)&cr[d], bytes));
    fill(ps[d], d, bytes / sizeof(float) < 1024 ? bytes / sizeof(float) : 1024, 0);
    CUDA_OK(cudaMemset(cs[d], 0, bytes));
    CUDA_OK(cudaDeviceSynchronize());
  }
  double tp[64], tc[64];
  if (rounds > 64) rounds = 64;
  for (int r = 0; r < rounds; r++) { /* alternate which goes first */
    if (r % 2 == 0) {
      tc[r] = time_all_reduce(cs, cr, bytes, iters);
      tp[r] = time_all_reduce(ps, pr, bytes, iters);
    } else {
      tp[r] = time_all_reduce(ps, pr, bytes, iters);
      tc[r] = time_all_reduce(cs, cr, bytes, iters);
    }
    printf("bandwidth round %d: pool %.2f GB/s, cudaMalloc %.2f GB/s (algorithm bandwidth)\n", r,
           bytes / tp[r] / 1e9, bytes / tc[r] / 1e9);
  }
  qsort(tp, (size_t)rounds, sizeof(double), cmp_double);
  qsort(tc, (size_t)rounds, sizeof(double), cmp_double);
  double bp = bytes / tp[rounds / 2] / 1e9, bc = bytes / tc[rounds / 2] / 1e9;
  double factor = ndev > 1 ? 2.0 * (ndev - 1) / ndev : 1.0;
  printf("bandwidth all-reduce %zu bytes x %d iters, median of %d rounds: pool %.2f GB/s "
         "(bus %.2f), cudaMalloc %.2f GB/s (bus %.2f), pool/cudaMalloc %.4f\n",
         bytes, iters, rounds, bp, bp * factor, bc, bc * factor, bp / bc);
  if (tolerance > 0)
    CHECK(bp >= bc * (1.0 - tolerance), "pool bandwidth %.2f GB/s is below %.0f%% of cudaMalloc's %.2f",
          bp, 100.0 * (1.0 - tolerance), bc);
  for (int d = 0; d < ndev; d++) {
    pool_free(d, ps[d], bytes);
    pool_free(d, pr[d], bytes);
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaFree(cs[d]));
    CUDA_OK(cudaFree(cr[d]));
  }
}

int main(int argc, char **argv) {
  size_t bytes = 64u << 20, count = 1u << 20;
  int iters = 20, rounds = 3;
  double tolerance = 0;
  const char *spec = "pool(initial=64MiB) > cuda";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bytes") && i + 1 < argc) bytes = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--spec") && i + 1 < argc) spec = argv[++i];
    else if (!strcmp(argv[i], "--bw-tolerance") && i + 1 < argc) tolerance = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--bytes N] [--iters N] [--rounds N] [--count N] [--spec S] "
                      "[--bw-tolerance F]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1 || rounds < 1 || count < 1 || bytes < 1024) {
    fprintf(stderr, "--iters, --rounds, --count must be >= 1 and --bytes >= 1024\n");
    return 2;
  }
  /* Multicast is forbidden on the GPU machines: keep NVLS off whatever the
   * caller's environment says. */
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("skipped: no GPU\n");
    return 77;
  }
  if (!load_nccl()) return 77;
  if (ndev > MAX_DEV) ndev = MAX_DEV;
  printf("%d GPU(s), stack '%s'\n", ndev, spec);

  int devs[MAX_DEV];
  for (int d = 0; d < ndev; d++) devs[d] = d;
  NCCL_OK(nccl.comm_init_all(comms, ndev, devs));
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
    RMMC_OK(rmmc_stack_create(spec, d, &pools[d]));
    /* The initial mapping before the hooks: set_memory_hooks registers it. */
    void *p = pool_alloc(d, 1u << 20);
    pool_free(d, p, 1u << 20);
    regs[d].device = d;
    regs[d].comm = comms[d];
    rmmc_memory_hooks_t hooks = RMMC_MEMORY_HOOKS_INIT;
    hooks.on_acquire = on_acquire;
    hooks.on_release = on_release;
    hooks.user = &regs[d];
    RMMC_OK(rmmc_resource_set_memory_hooks(pools[d], &hooks));
    CHECK(regs[d].registered >= 1, "device %d: the mappings held when the hooks were set were "
                                   "not registered", d);
    regs[d].phase = 1;
  }

  collectives(count);
  bandwidth(bytes, iters, rounds, tolerance);

  /* Trim: everything is free, so release_cached gives mappings back
   * (deregistered first), then destroying the stack gives back the rest. */
  for (int d = 0; d < ndev; d++) {
    unsigned long before = regs[d].released;
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamSynchronize(streams[d]));
    RMMC_OK(rmmc_resource_release_cached(pools[d]));
    printf("device %d: release_cached gave back %lu mapping(s)\n", d, regs[d].released - before);
    rmmc_resource_release(pools[d]);
    pools[d] = NULL;
  }
  unsigned long reg_total = 0, dereg_total = 0;
  for (int d = 0; d < ndev; d++) {
    registry_t *g = &regs[d];
    printf("device %d: acquired %lu (%lu after registration began), released %lu, registered "
           "%lu, deregistered %lu, twice %lu, unknown %lu, unmapped at release %lu, NCCL errors "
           "%lu, left registered %zu\n",
           d, g->acquired, g->acquired_later, g->released, g->registered, g->deregistered,
           g->twice, g->unknown, g->unmapped_at_release, g->nccl_errors, g->n);
    CHECK(g->acquired_later >= 1, "device %d: the pool never grew after registration began", d);
    CHECK(g->registered == g->acquired, "device %d: %lu acquired, %lu registered", d, g->acquired,
          g->registered);
    CHECK(g->twice == 0 && g->unknown == 0 && g->nccl_errors == 0,
          "device %d: a range registered twice, released unregistered, or refused by NCCL", d);
    CHECK(g->deregistered == g->registered && g->n == 0,
          "device %d: %zu range(s) left registered", d, g->n);
    CHECK(g->unmapped_at_release == 0, "device %d: %lu range(s) released after unmapping", d,
          g->unmapped_at_release);
    reg_total += g->registered;
    dereg_total += g->deregistered;
  }
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    cudaStreamDestroy(streams[d]);
    NCCL_OK(nccl.comm_destroy(comms[d]));
  }
  printf("registered %lu\nderegistered %lu\n", reg_total, dereg_total);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
