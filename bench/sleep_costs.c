/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What sleep mode costs against its physical limits, measured in one run
 * (docs/design.md, "Sleep mode"):
 *
 *   backup   pause + resume of a pool whose live blocks total S bytes
 *            (S = 1, 8, 32 GiB by default), against the pinned host copy
 *            bandwidth of the same bytes: cudaMemcpyAsync D2H then H2D of
 *            S bytes between a cudaMalloc buffer and a pinned one, on one
 *            stream. The first cycle pins the backup buffer (cudaHostAlloc);
 *            later cycles reuse it: both are reported, the ratio on the
 *            later ones (median of 3).
 *   discard  pause + resume with nothing copied, against the driver's own
 *            cost for the same pages done directly, as src/resources/cuda.c
 *            does them: cuMemUnmap per mapping, then cuMemCreate + cuMemMap
 *            + cuMemSetAccess + cuMemRelease per mapping (median of 5).
 *
 *   rmmc-sleep-costs [--json FILE] [--discard GiB] [GiB ...]
 *
 * Sizes that do not fit the device's free memory (less 2 GiB) or half the
 * host's memory (pinned) are skipped with a line saying so. Exit 1 on any failure,
 * with the call named; the data of the backed-up block is checked after
 * every resume.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "rmmc/rmmc.h"

#define GiB ((size_t)1 << 30)
#define MiB ((size_t)1 << 20)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *sym(const char *name, unsigned version) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    die(name, "driver entry point not found");
  return fn;
}

/* A driver entry point into a typed pointer (ISO C has no cast between
 * data and function pointers). */
#define SYM(var, name)                                                                          \
  do {                                                                                          \
    void *f_ = sym(name, 10020);                                                                \
    memcpy(&(var), &f_, sizeof f_);                                                             \
  } while (0)

#define CU(x)                                                                                   \
  do {                                                                                          \
    CUresult r_ = (x);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      char m_[32];                                                                              \
      snprintf(m_, sizeof m_, "CUresult %d", (int)r_);                                          \
      die(#x, m_);                                                                              \
    }                                                                                           \
  } while (0)

/* D2H then H2D of n bytes on s, seconds (median of reps). */
static double copy_time(size_t n, cudaStream_t s, int reps) {
  void *d, *h;
  CK(cudaMalloc(&d, n));
  CK(cudaHostAlloc(&h, n, cudaHostAllocPortable));
  CK(cudaMemsetAsync(d, 1, n, s));
  CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s)); /* warm */
  CK(cudaStreamSynchronize(s));
  double t[8];
  for (int i = 0; i < reps; i++) {
    double t0 = now_s();
    CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    t[i] = now_s() - t0;
  }
  CK(cudaFreeHost(h));
  CK(cudaFree(d));
  return median(t, reps);
}

static void expect_bytes(const void *d, size_t n, unsigned char v) {
  unsigned char h[4096];
  size_t at[3] = {0, n / 2, n - sizeof h};
  for (int k = 0; k < 3; k++) {
    CK(cudaMemcpy(h, (const char *)d + at[k], sizeof h, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof h; i++)
      if (h[i] != v) die("the data after resume", "differs from before the pause");
  }
}

typedef struct backup_result {
  double copy_s, first_s, steady_s, pause_s, resume_s;
} backup_result_t;

static backup_result_t backup_case(size_t n, cudaStream_t s) {
  backup_result_t res = {0};
  res.copy_s = copy_time(n, s, 3);
  rmmc_resource_t *r;
  RM(rmmc_stack_create("pool > cuda", -1, &r));
  void *p;
  RM(rmmc_resource_allocate(r, n, 256, s, &p));
  CK(cudaMemsetAsync(p, 0x5a, n, s));
  double t[4], tp[4], tr[4];
  for (int c = 0; c < 4; c++) {
    double t0 = now_s();
    RM(rmmc_pool_pause(r, RMMC_POOL_PAUSE_BACKUP, s));
    double t1 = now_s();
    RM(rmmc_pool_resume(r, s));
    CK(cudaStreamSynchronize(s));
    double t2 = now_s();
    t[c] = t2 - t0, tp[c] = t1 - t0, tr[c] = t2 - t1;
    expect_bytes(p, n, 0x5a);
  }
  res.first_s = t[0];
  res.steady_s = median(t + 1, 3);
  res.pause_s = median(tp + 1, 3);
  res.resume_s = median(tr + 1, 3);
  RM(rmmc_resource_deallocate(r, p, n, 256, s));
  rmmc_resource_release(r);
  return res;
}

typedef struct discard_result {
  size_t pages;
  double sleep_s, driver_s;
} discard_result_t;

static discard_result_t discard_case(size_t n, cudaStream_t s) {
  discard_result_t res = {0};
  int dev;
  CK(cudaGetDevice(&dev));
  PFN_cuMemCreate_v10020 mcreate;
  PFN_cuMemRelease_v10020 mrelease;
  PFN_cuMemMap_v10020 mmap_;
  PFN_cuMemUnmap_v10020 munmap_;
  PFN_cuMemSetAccess_v10020 maccess;
  PFN_cuMemAddressReserve_v10020 mreserve;
  PFN_cuMemAddressFree_v10020 mfree;
  SYM(mcreate, "cuMemCreate");
  SYM(mrelease, "cuMemRelease");
  SYM(mmap_, "cuMemMap");
  SYM(munmap_, "cuMemUnmap");
  SYM(maccess, "cuMemSetAccess");
  SYM(mreserve, "cuMemAddressReserve");
  SYM(mfree, "cuMemAddressFree");
  /* rmmc's pool: one live block of n bytes, page= at its default. */
  rmmc_resource_t *r;
  RM(rmmc_stack_create("pool > cuda", -1, &r));
  void *p;
  RM(rmmc_resource_allocate(r, n, 256, s, &p));
  CK(cudaStreamSynchronize(s));
  uint64_t mappings = 0;
  if (!rmmc_resource_get_field(r, "mappings", &mappings)) die("describe", "no 'mappings'");
  size_t page = (size_t)32 << 20; /* the pool's default page= */
  double t[5];
  for (int c = 0; c < 5; c++) {
    double t0 = now_s();
    RM(rmmc_pool_pause(r, RMMC_POOL_PAUSE_DISCARD, s));
    RM(rmmc_pool_resume(r, s));
    CK(cudaStreamSynchronize(s));
    t[c] = now_s() - t0;
  }
  res.sleep_s = median(t, 5);
  res.pages = (size_t)mappings;
  RM(rmmc_resource_deallocate(r, p, n, 256, s));
  rmmc_resource_release(r);
  /* The driver directly: the same number of mappings of the same size. */
  size_t bytes = res.pages * page;
  CUdeviceptr base;
  CU(mreserve(&base, bytes, 2 * MiB, 0, 0));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  for (size_t i = 0; i < res.pages; i++) { /* mapped, as the pool's are */
    CUmemGenericAllocationHandle h;
    CU(mcreate(&h, page, &prop, 0));
    CU(mmap_(base + i * page, page, 0, h, 0));
    CU(maccess(base + i * page, page, &access, 1));
    CU(mrelease(h));
  }
  for (int c = 0; c < 5; c++) {
    double t0 = now_s();
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < res.pages; i++) CU(munmap_(base + i * page, page));
    for (size_t i = 0; i < res.pages; i++) {
      CUmemGenericAllocationHandle h;
      CU(mcreate(&h, page, &prop, 0));
      CU(mmap_(base + i * page, page, 0, h, 0));
      CU(maccess(base + i * page, page, &access, 1));
      CU(mrelease(h));
    }
    t[c] = now_s() - t0;
  }
  res.driver_s = median(t, 5);
  for (size_t i = 0; i < res.pages; i++) CU(munmap_(base + i * page, page));
  CU(mfree(base, bytes));
  return res;
}

int main(int argc, char **argv) {
  bench_program = "rmmc-sleep-costs";
  const char *json = NULL;
  double sizes[16];
  int nsizes = 0;
  double discard_gib = 8;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
    else if (strcmp(argv[i], "--discard") == 0 && i + 1 < argc) discard_gib = atof(argv[++i]);
    else if (nsizes < 16 && atof(argv[i]) > 0) sizes[nsizes++] = atof(argv[i]);
    else {
      fprintf(stderr, "usage: rmmc-sleep-costs [--json FILE] [--discard GiB] [GiB ...]\n");
      return 2;
    }
  }
  if (nsizes == 0) sizes[0] = 1, sizes[1] = 8, sizes[2] = 32, nsizes = 3;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "rmmc-sleep-costs: no CUDA device\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t host = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  printf("device: %s; host memory %.0f GiB\n", prop.name, (double)host / GiB);
  FILE *jf = json != NULL ? fopen(json, "w") : NULL;
  if (json != NULL && jf == NULL) die(json, "cannot write");
  if (jf) fprintf(jf, "{\"device\": \"%s\", \"backup\": [", prop.name);
  int worst_ok = 1, written = 0;
  for (int k = 0; k < nsizes; k++) {
    size_t n = (size_t)(sizes[k] * (double)GiB);
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    /* copy_time holds n on the device and n pinned, then the pool does
     * (one after the other) */
    if (n + 2 * GiB > fr || n > host / 2) {
      printf("backup %6.1f GiB: skipped (device free %.1f GiB, host %.0f GiB)\n", sizes[k],
             (double)fr / GiB, (double)host / GiB);
      continue;
    }
    backup_result_t b = backup_case(n, s);
    double ratio = b.steady_s / b.copy_s;
    worst_ok &= ratio <= 1.2;
    printf("backup %6.1f GiB: D2H+H2D %.3f s (%.1f GB/s each way); pause+resume %.3f s "
           "(pause %.3f, resume %.3f) = %.2fx the copies%s; first cycle (pins the buffer) %.3f s "
           "= %.2fx\n",
           sizes[k], b.copy_s, 2.0 * (double)n / b.copy_s / 1e9, b.steady_s, b.pause_s,
           b.resume_s, ratio, ratio <= 1.2 ? "" : " (ABOVE 1.2x)", b.first_s,
           b.first_s / b.copy_s);
    if (jf)
      fprintf(jf,
              "%s{\"gib\": %g, \"copy_s\": %.6f, \"sleep_s\": %.6f, \"pause_s\": %.6f, "
              "\"resume_s\": %.6f, \"first_s\": %.6f, \"ratio\": %.4f}",
              written++ ? ", " : "", sizes[k], b.copy_s, b.steady_s, b.pause_s, b.resume_s, b.first_s,
              ratio);
  }
  size_t fr = 0, tot = 0;
  CK(cudaMemGetInfo(&fr, &tot));
  size_t dn = (size_t)(discard_gib * (double)GiB);
  if (dn + 2 * GiB > fr) dn = (fr - 2 * GiB) & ~((size_t)32 * MiB - 1);
  discard_result_t d = discard_case(dn, s);
  double dratio = d.sleep_s / d.driver_s;
  worst_ok &= dratio <= 1.2;
  printf("discard %.1f GiB (%zu mappings of 32 MiB): pause+resume %.3f s (%.1f us per mapping); "
         "driver unmap + create/map/access/release %.3f s (%.1f us per mapping) = %.2fx%s\n",
         (double)dn / GiB, d.pages, d.sleep_s, d.sleep_s * 1e6 / (double)d.pages, d.driver_s,
         d.driver_s * 1e6 / (double)d.pages, dratio, dratio <= 1.2 ? "" : " (ABOVE 1.2x)");
  if (jf) {
    fprintf(jf,
            "], \"discard\": {\"gib\": %.3f, \"mappings\": %zu, \"sleep_s\": %.6f, "
            "\"driver_s\": %.6f, \"ratio\": %.4f}}\n",
            (double)dn / GiB, d.pages, d.sleep_s, d.driver_s, dratio);
    fclose(jf);
  }
  printf("sleep costs: %s\n", worst_ok ? "every ratio within 1.2x" : "SOME RATIO ABOVE 1.2x");
  CK(cudaStreamDestroy(s));
  return 0;
}
