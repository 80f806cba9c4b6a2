/*
 * What sharing memory between processes costs on this machine
 * (docs/design.md quotes the figures): physical memory created shareable
 * (POSIX file descriptor handles) against plain, per mapping size; each
 * step of an export and of an import, for cudaMalloc chunks (CUDA IPC
 * handles) and for pages (file descriptors); rmmc's whole export, socket
 * transfer, import and close; and a pool growing over cuda against
 * cuda(ipc=true). Medians of repeated runs, microseconds.
 *
 *   rmmc-ipc-costs [--json FILE] [--quick]
 *
 * The importing side is a child forked before this process touches CUDA
 * (a process that used CUDA cannot use it in a forked child); handles go
 * to it over a socketpair with rmmc_ipc_send. Built by tools/meson.build;
 * `scripts/gpu-check --ipc` runs it. Driver entry points come through
 * cudaGetDriverEntryPointByVersion, as src/resources/cuda.c does.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "rmmc/rmmc.h"

#define MiB ((size_t)1 << 20)
#define MAX_RUNS 400

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define CU(x)                                                                                   \
  do {                                                                                          \
    CUresult r_ = (x);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      char b_[32];                                                                              \
      snprintf(b_, sizeof b_, "CUresult %d", (int)r_);                                          \
      die(#x, b_);                                                                              \
    }                                                                                           \
  } while (0)

static void sym(const char *name, void **fn, unsigned version) {
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || *fn == NULL)
    die("no driver symbol", name);
}

static struct {
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 access;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 address_free;
  PFN_cuMemExportToShareableHandle_v10020 export_handle;
} drv;

static FILE *json;
static int records;
static const char *device_name;

/* One figure: printed, and a JSON record. */
static void report(const char *what, size_t bytes, const char *variant, double us, int runs) {
  char size[32] = "";
  if (bytes) snprintf(size, sizeof size, "%zu MiB", bytes / MiB);
  printf("%-44s %-9s %-12s %10.1f us  (median of %d)\n", what, size, variant, us, runs);
  fflush(stdout);
  if (json != NULL)
    fprintf(json, "%s\n  {\"what\": \"%s\", \"bytes\": %zu, \"variant\": \"%s\", \"us\": %.2f, "
                  "\"runs\": %d, \"device\": \"%s\"}",
            records++ ? "," : "", what, bytes, variant, us, runs, device_name);
}

static int runs_for(size_t bytes, bool quick) {
  int n = bytes <= 2 * MiB ? 200 : bytes <= 32 * MiB ? 100 : 30;
  return quick ? n / 10 + 3 : n;
}

/* ---- the driver, one process ---- */

static void physical_costs(bool quick) {
  size_t sizes[] = {2 * MiB, 32 * MiB, 256 * MiB};
  for (int shareable = 0; shareable < 2; shareable++) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const char *variant = shareable ? "posix_fd" : "plain";
    for (int s = 0; s < 3; s++) {
      size_t n = sizes[s];
      int runs = runs_for(n, quick);
      double create[MAX_RUNS], mapped[MAX_RUNS], unmap[MAX_RUNS], exp[MAX_RUNS];
      CUdeviceptr va;
      CU(drv.reserve(&va, n, 0, 0, 0));
      for (int i = 0; i < runs + 2; i++) { /* two warm-up rounds */
        CUmemGenericAllocationHandle h;
        double t0 = now_us();
        CU(drv.create(&h, n, &prop, 0));
        double t1 = now_us();
        CU(drv.map(va, n, 0, h, 0));
        CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CU(drv.access(va, n, &acc, 1));
        double t2 = now_us();
        double te = 0;
        if (shareable) {
          int fd = -1;
          double a = now_us();
          CU(drv.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
          te = now_us() - a;
          close(fd);
        }
        double t3 = now_us();
        CU(drv.unmap(va, n));
        CU(drv.release(h));
        double t4 = now_us();
        if (i >= 2) {
          create[i - 2] = t1 - t0;
          mapped[i - 2] = t2 - t0;
          unmap[i - 2] = t4 - t3;
          exp[i - 2] = te;
        }
      }
      CU(drv.address_free(va, n));
      report("cuMemCreate", n, variant, median(create, runs), runs);
      report("cuMemCreate + cuMemMap + cuMemSetAccess", n, variant, median(mapped, runs), runs);
      report("cuMemUnmap + cuMemRelease", n, variant, median(unmap, runs), runs);
      if (shareable) report("cuMemExportToShareableHandle (+ close)", n, variant, median(exp, runs), runs);
    }
  }
}

/* A pool mapping fresh pages for each request (release_cached between):
 * what ipc=true adds to growth. */
static void pool_growth_costs(bool quick) {
  const char *specs[] = {"pool(expandable=true) > cuda", "pool(expandable=true) > cuda(ipc=true)"};
  const char *variants[] = {"plain", "posix_fd"};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r;
    RM(rmmc_stack_create(specs[k], 0, &r));
    int runs = runs_for(32 * MiB, quick);
    double t[MAX_RUNS];
    for (int i = 0; i < runs + 2; i++) {
      void *p;
      double t0 = now_us();
      RM(rmmc_resource_allocate(r, 32 * MiB, 256, NULL, &p));
      double t1 = now_us();
      RM(rmmc_resource_deallocate(r, p, 32 * MiB, 256, NULL));
      RM(rmmc_resource_release_cached(r));
      if (i >= 2) t[i - 2] = t1 - t0;
    }
    report("pool: allocate 32 MiB that maps a page", 32 * MiB, variants[k], median(t, runs), runs);
    rmmc_resource_release(r);
  }
}

/* ---- export here, import in the child ---- */

enum { IMPORT_RUNS = 60 };

typedef struct sample {
  char what[48];
  size_t bytes;
  char variant[16];
  double us;
  int runs;
} sample_t;

/* The child: imports every handle it is sent, timing a cold import, a
 * cached one and the closes; sends its figures back. */
static int child_main(int sock) {
  for (;;) {
    rmmc_ipc_handle_t h;
    static int fds[RMMC_IPC_MAX_FDS];
    size_t n;
    double t0 = now_us();
    rmmc_status_t st = rmmc_ipc_recv(sock, &h, fds, RMMC_IPC_MAX_FDS, &n);
    double recv_us = now_us() - t0;
    if (st == RMMC_ERROR_IO) return 0; /* the parent is done */
    if (st != RMMC_SUCCESS) die("child: rmmc_ipc_recv", rmmc_last_error_message());
    void *p, *q;
    t0 = now_us();
    RM(rmmc_ipc_import(&h, fds, n, &p));
    double cold = now_us() - t0;
    t0 = now_us();
    RM(rmmc_ipc_import(&h, fds, n, &q));
    double warm = now_us() - t0;
    t0 = now_us();
    RM(rmmc_ipc_close(q));
    double close_shared = now_us() - t0;
    t0 = now_us();
    RM(rmmc_ipc_close(p));
    double close_last = now_us() - t0;
    for (size_t i = 0; i < n; i++) close(fds[i]);
    double out[5] = {recv_us, cold, warm, close_shared, close_last};
    if (send(sock, out, sizeof out, 0) != (ssize_t)sizeof out) return 1;
  }
}

static void sharing_costs(int sock, bool quick) {
  const char *specs[] = {"pool(expandable=false) > cuda", "pool(expandable=true) > cuda(ipc=true)"};
  const char *variants[] = {"chunk", "pages"};
  size_t sizes[] = {MiB, 32 * MiB, 256 * MiB};
  const char *names[] = {"rmmc_ipc_send (handle + descriptors)", "rmmc_ipc_import, first (opens)",
                         "rmmc_ipc_import, again (cached)", "rmmc_ipc_close, not the last",
                         "rmmc_ipc_close, the last (closes)"};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r;
    RM(rmmc_stack_create(specs[k], 0, &r));
    for (int s = 0; s < 3; s++) {
      int runs = quick ? 5 : IMPORT_RUNS;
      if (sizes[s] >= 256 * MiB && !quick) runs = 20;
      double exp[IMPORT_RUNS], send_us[IMPORT_RUNS], got[5][IMPORT_RUNS];
      size_t nfds = 0;
      for (int i = 0; i < runs; i++) {
        void *p;
        RM(rmmc_resource_allocate(r, sizes[s], 256, NULL, &p));
        rmmc_ipc_handle_t h;
        static int fds[RMMC_IPC_MAX_FDS];
        double t0 = now_us();
        RM(rmmc_ipc_export(r, p, &h, fds, RMMC_IPC_MAX_FDS, &nfds));
        exp[i] = now_us() - t0;
        t0 = now_us();
        RM(rmmc_ipc_send(sock, &h, fds, nfds));
        send_us[i] = now_us() - t0;
        double back[5];
        if (recv(sock, back, sizeof back, MSG_WAITALL) != (ssize_t)sizeof back)
          die("recv", "the importing child went away");
        for (int j = 0; j < 5; j++) got[j][i] = back[j];
        for (size_t j = 0; j < nfds; j++) close(fds[j]);
        RM(rmmc_resource_deallocate(r, p, sizes[s], 256, NULL));
      }
      char variant[32];
      snprintf(variant, sizeof variant, "%s/%zufd", variants[k], nfds);
      report("rmmc_ipc_export", sizes[s], variant, median(exp, runs), runs);
      report(names[0], sizes[s], variant, median(send_us, runs), runs);
      for (int j = 1; j < 5; j++) report(names[j], sizes[s], variant, median(got[j], runs), runs);
    }
    rmmc_resource_release(r);
  }
  /* The CUDA call behind a chunk's export, on its own. */
  void *d;
  CK(cudaMalloc(&d, 32 * MiB));
  double t[MAX_RUNS];
  int runs = quick ? 10 : 200;
  for (int i = 0; i < runs; i++) {
    cudaIpcMemHandle_t h;
    double t0 = now_us();
    CK(cudaIpcGetMemHandle(&h, d));
    t[i] = now_us() - t0;
  }
  report("cudaIpcGetMemHandle", 32 * MiB, "chunk", median(t, runs), runs);
  CK(cudaFree(d));
}

int main(int argc, char **argv) {
  bench_program = "rmmc-ipc-costs";
  const char *json_path = NULL;
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (strcmp(argv[i], "--quick") == 0) quick = true;
    else {
      fprintf(stderr, "usage: rmmc-ipc-costs [--json FILE] [--quick]\n");
      return 2;
    }
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair", "failed");
  pid_t child = fork(); /* before anything touches CUDA */
  if (child < 0) die("fork", "failed");
  if (child == 0) {
    close(sv[0]);
    return child_main(sv[1]);
  }
  close(sv[1]);
  if (rmmc_device_count() == 0) {
    fprintf(stderr, "rmmc-ipc-costs: no CUDA device\n");
    close(sv[0]);
    waitpid(child, NULL, 0);
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  device_name = prop.name;
  printf("device: %s\n", prop.name);
  if (json_path != NULL && (json = fopen(json_path, "w")) == NULL) die("fopen", json_path);
  if (json != NULL) fprintf(json, "[");
  sym("cuMemCreate", (void **)&drv.create, 10020);
  sym("cuMemRelease", (void **)&drv.release, 10020);
  sym("cuMemMap", (void **)&drv.map, 10020);
  sym("cuMemUnmap", (void **)&drv.unmap, 10020);
  sym("cuMemSetAccess", (void **)&drv.access, 10020);
  sym("cuMemAddressReserve", (void **)&drv.reserve, 10020);
  sym("cuMemAddressFree", (void **)&drv.address_free, 10020);
  sym("cuMemExportToShareableHandle", (void **)&drv.export_handle, 10020);
  physical_costs(quick);
  pool_growth_costs(quick);
  sharing_costs(sv[0], quick);
  close(sv[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (json != NULL) {
    fprintf(json, "\n]\n");
    fclose(json);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rmmc-ipc-costs: the importing child failed (status %d)\n", status);
    return 1;
  }
  return 0;
}
