/*
 * What the CUDA calls an allocator might make cost on this machine, one by
 * one (the design of the pool's stream ordering and growth rests on these
 * figures; docs/design.md quotes them). Each figure is the mean over many
 * calls, in nanoseconds, on an idle device unless said otherwise.
 *
 *   cc -O2 -I/usr/local/cuda/include bench/cuda_costs.c -L/usr/local/cuda/lib64 -lcudart -lpthread
 *
 * `cuda_costs threads` runs only the last part: the calls a free might make
 * (an event record, a capture check, a device check), through the runtime
 * and through the driver, from 1, 4 and 16 threads at once, each on its own
 * stream: do they scale? It first checks that the driver's cuEventRecord
 * and cuEventQuery work from a thread with no current context.
 *
 * Driver entry points come through cudaGetDriverEntryPointByVersion (no
 * libcuda link), as src/resources/cuda.c does.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));        \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)
#define CU(x)                                                                                   \
  do {                                                                                          \
    CUresult r_ = (x);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_);              \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static void *sym(const char *name, unsigned version) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    fprintf(stderr, "no driver symbol %s\n", name);
    exit(1);
  }
  return fn;
}

static void report(const char *what, double total_ns, int n) {
  printf("%-58s %10.0f ns\n", what, total_ns / n);
  fflush(stdout);
}

/* ---- runtime calls from several threads at once ---- */

enum {
  T_RECORD,
  T_CAPTURE_INFO,
  T_GET_DEVICE,
  T_POOL_RUNTIME, /* what a pool's record makes today: capture info, device, record */
  T_CU_RECORD,
  T_CU_IS_CAPTURING,
  T_CU_CTX_CURRENT,
  T_CU_CTX_DEVICE,
  T_POOL_DRIVER, /* the same through the driver: is-capturing, record */
  T_CALLS
};
static PFN_cuEventRecord_v2000 cu_record;
static PFN_cuEventQuery_v2000 cu_query;
static PFN_cuStreamIsCapturing_v10000 cu_is_capturing;
static PFN_cuCtxGetCurrent_v4000 cu_ctx_current;
static PFN_cuCtxGetDevice_v2000 cu_ctx_device;
typedef struct {
  int call, calls;
  pthread_barrier_t *start;
  double ns;
} tcall_t;

static void *tcall_run(void *arg) {
  tcall_t *t = arg;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  cudaEvent_t e;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  pthread_barrier_wait(t->start);
  double t0 = now_ns();
  for (int i = 0; i < t->calls; i++) {
    if (t->call == T_RECORD) {
      CK(cudaEventRecord(e, s));
    } else if (t->call == T_CAPTURE_INFO) {
      enum cudaStreamCaptureStatus cs;
      CK(cudaStreamGetCaptureInfo(s, &cs, NULL, NULL, NULL, NULL, NULL));
    } else if (t->call == T_GET_DEVICE) {
      int d;
      CK(cudaGetDevice(&d));
    } else if (t->call == T_POOL_RUNTIME) {
      enum cudaStreamCaptureStatus cs;
      int d;
      CK(cudaStreamGetCaptureInfo(s, &cs, NULL, NULL, NULL, NULL, NULL));
      CK(cudaGetDevice(&d));
      CK(cudaEventRecord(e, s));
    } else if (t->call == T_CU_RECORD) {
      CU(cu_record((CUevent)e, (CUstream)s));
    } else if (t->call == T_CU_IS_CAPTURING) {
      CUstreamCaptureStatus cs;
      CU(cu_is_capturing((CUstream)s, &cs));
    } else if (t->call == T_CU_CTX_CURRENT) {
      CUcontext c;
      CU(cu_ctx_current(&c));
    } else if (t->call == T_CU_CTX_DEVICE) {
      CUdevice d;
      CU(cu_ctx_device(&d));
    } else {
      CUstreamCaptureStatus cs;
      CU(cu_is_capturing((CUstream)s, &cs));
      CU(cu_record((CUevent)e, (CUstream)s));
    }
  }
  t->ns = now_ns() - t0;
  CK(cudaStreamSynchronize(s));
  CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(s));
  return NULL;
}

/* Does the driver's record need the calling thread to have a current
 * context? A new thread that made no CUDA call has none. */
typedef struct {
  cudaEvent_t e;
  cudaStream_t s;
  CUresult rec, query;
  CUcontext ctx;
} nocontext_t;

static void *nocontext_run(void *arg) {
  nocontext_t *t = arg;
  CU(cu_ctx_current(&t->ctx));
  t->rec = cu_record((CUevent)t->e, (CUstream)t->s);
  t->query = cu_query((CUevent)t->e);
  if (t->query == CUDA_ERROR_NOT_READY) t->query = CUDA_SUCCESS;
  return NULL;
}

static void threads_section(void) {
  static const char *names[] = {"cudaEventRecord",
                                "cudaStreamGetCaptureInfo",
                                "cudaGetDevice",
                                "capture info + cudaGetDevice + cudaEventRecord",
                                "cuEventRecord",
                                "cuStreamIsCapturing",
                                "cuCtxGetCurrent",
                                "cuCtxGetDevice",
                                "cuStreamIsCapturing + cuEventRecord"};
  enum { CALLS = 50000, MAXT = 16 };
  cu_record = sym("cuEventRecord", 2000);
  cu_query = sym("cuEventQuery", 2000);
  cu_is_capturing = sym("cuStreamIsCapturing", 10000);
  cu_ctx_current = sym("cuCtxGetCurrent", 4000);
  cu_ctx_device = sym("cuCtxGetDevice", 2000);
  {
    nocontext_t t;
    CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&t.e, cudaEventDisableTiming));
    pthread_t th;
    if (pthread_create(&th, NULL, nocontext_run, &t) != 0) exit(1);
    pthread_join(th, NULL);
    printf("a thread with no current context (%s): cuEventRecord %d, cuEventQuery %d (0: works)\n",
           t.ctx == NULL ? "none" : "has one", (int)t.rec, (int)t.query);
    CK(cudaStreamSynchronize(t.s));
    CK(cudaEventDestroy(t.e));
    CK(cudaStreamDestroy(t.s));
  }
  for (int call = 0; call < T_CALLS; call++)
    for (int n = 1; n <= MAXT; n *= 4) {
      pthread_barrier_t start;
      pthread_barrier_init(&start, NULL, (unsigned)n);
      pthread_t th[MAXT];
      tcall_t t[MAXT];
      for (int i = 0; i < n; i++) {
        t[i] = (tcall_t){.call = call, .calls = CALLS, .start = &start};
        if (pthread_create(&th[i], NULL, tcall_run, &t[i]) != 0) exit(1);
      }
      double slowest = 0;
      for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (t[i].ns > slowest) slowest = t[i].ns;
      }
      pthread_barrier_destroy(&start);
      char what[80];
      snprintf(what, sizeof what, "%s, %d thread%s at once (per call, per thread)", names[call], n,
               n > 1 ? "s" : "");
      report(what, slowest, CALLS);
    }
}

int main(int argc, char **argv) {
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  if (argc > 1 && strcmp(argv[1], "threads") == 0) {
    threads_section();
    return 0;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s\n", prop.name);
  PFN_cuStreamWriteValue64_v11070 write64 = sym("cuStreamWriteValue64", 11070);
  PFN_cuStreamWaitValue64_v11070 wait64 = sym("cuStreamWaitValue64", 11070);
  PFN_cuMemCreate_v10020 mcreate = sym("cuMemCreate", 10020);
  PFN_cuMemRelease_v10020 mrelease = sym("cuMemRelease", 10020);
  PFN_cuMemMap_v10020 mmap_ = sym("cuMemMap", 10020);
  PFN_cuMemUnmap_v10020 munmap_ = sym("cuMemUnmap", 10020);
  PFN_cuMemSetAccess_v10020 maccess = sym("cuMemSetAccess", 10020);
  PFN_cuMemAddressReserve_v10020 mreserve = sym("cuMemAddressReserve", 10020);
  PFN_cuStreamGetCaptureInfo_v12030 capinfo = sym("cuStreamGetCaptureInfo", 12030);
  (void)capinfo;

  cudaStream_t s, s2;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const int N = 20000;
  double t;

  /* dry runs so that lazy initialisation is not timed */
  for (int i = 0; i < 100; i++) CK(cudaEventRecord(ev, s));
  CK(cudaStreamSynchronize(s));

  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaEventRecord(ev, s));
  report("cudaEventRecord", now_ns() - t, N);
  CK(cudaStreamSynchronize(s));
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaEventQuery(ev));
  report("cudaEventQuery (complete)", now_ns() - t, N);
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaStreamWaitEvent(s2, ev, 0));
  report("cudaStreamWaitEvent", now_ns() - t, N);
  CK(cudaStreamSynchronize(s2));

  uint64_t *word;
  CK(cudaHostAlloc((void **)&word, 4096, cudaHostAllocMapped));
  CUdeviceptr dword;
  CK(cudaHostGetDevicePointer((void **)&dword, word, 0));
  printf("host-mapped word %p, device pointer 0x%llx (same: %s)\n", (void *)word,
         (unsigned long long)dword, (uintptr_t)word == (uintptr_t)dword ? "yes" : "no");
  for (int i = 0; i < 100; i++) CU(write64((CUstream)s, dword, (cuuint64_t)i, 0));
  CK(cudaStreamSynchronize(s));
  t = now_ns();
  for (int i = 0; i < N; i++) CU(write64((CUstream)s, dword, (cuuint64_t)(1000 + i), 0));
  report("cuStreamWriteValue64 (host-mapped word)", now_ns() - t, N);
  CK(cudaStreamSynchronize(s));
  printf("word after the writes: %llu (expect %d)\n", (unsigned long long)*(volatile uint64_t *)word,
         1000 + N - 1);
  t = now_ns();
  for (int i = 0; i < N; i++) CU(wait64((CUstream)s2, dword, 5, CU_STREAM_WAIT_VALUE_GEQ));
  report("cuStreamWaitValue64 (already satisfied)", now_ns() - t, N);
  CK(cudaStreamSynchronize(s2));

  /* Latency: an idle stream writes the word; how long until the host sees it. */
  double lat = 0;
  for (int i = 0; i < 1000; i++) {
    volatile uint64_t *w = word;
    uint64_t v = 1000000 + (uint64_t)i;
    double t0 = now_ns();
    CU(write64((CUstream)s, dword, v, 0));
    while (*w != v) {
    }
    lat += now_ns() - t0;
  }
  report("write-to-host-visible latency, idle stream", lat, 1000);
  lat = 0;
  for (int i = 0; i < 1000; i++) {
    double t0 = now_ns();
    CK(cudaEventRecord(ev, s));
    while (cudaEventQuery(ev) != cudaSuccess) {
    }
    lat += now_ns() - t0;
  }
  report("record-to-query-complete latency, idle stream", lat, 1000);

  enum cudaStreamCaptureStatus cs;
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaStreamIsCapturing(s, &cs));
  report("cudaStreamIsCapturing", now_ns() - t, N);
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaStreamGetCaptureInfo(s, &cs, NULL, NULL, NULL, NULL, NULL));
  report("cudaStreamGetCaptureInfo", now_ns() - t, N);
  unsigned long long id;
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaStreamGetId(s, &id));
  report("cudaStreamGetId", now_ns() - t, N);
  int dev;
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaGetDevice(&dev));
  report("cudaGetDevice", now_ns() - t, N);
  t = now_ns();
  for (int i = 0; i < N; i++) CK(cudaSetDevice(0));
  report("cudaSetDevice (same device)", now_ns() - t, N);

  /* Growth: cudaMalloc/cudaFree and the virtual-memory calls. */
  size_t sizes[] = {(size_t)2 << 20, (size_t)32 << 20, (size_t)256 << 20, (size_t)1 << 30};
  for (int k = 0; k < 4; k++) {
    int n = k < 2 ? 200 : 20;
    void *p[200];
    double ta = 0, tf = 0;
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CK(cudaMalloc(&p[i], sizes[k]));
      ta += now_ns() - t0;
    }
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CK(cudaFree(p[i]));
      tf += now_ns() - t0;
    }
    char what[96];
    snprintf(what, sizeof what, "cudaMalloc %zu MiB", sizes[k] >> 20);
    report(what, ta, n);
    snprintf(what, sizeof what, "cudaFree %zu MiB", sizes[k] >> 20);
    report(what, tf, n);
  }
  CUmemAllocationProp mp;
  memset(&mp, 0, sizeof mp);
  mp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  mp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mp.location.id = 0;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location = mp.location;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr base;
  size_t span = (size_t)64 << 30;
  CU(mreserve(&base, span, (size_t)2 << 20, 0, 0));
  size_t psz[] = {(size_t)2 << 20, (size_t)32 << 20, (size_t)256 << 20};
  for (int k = 0; k < 3; k++) {
    int n = 64;
    CUmemGenericAllocationHandle h[64];
    double tc = 0, tm = 0, ts = 0, tu = 0, tr = 0;
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CU(mcreate(&h[i], psz[k], &mp, 0));
      double t1 = now_ns();
      CU(mmap_(base + (CUdeviceptr)i * psz[k], psz[k], 0, h[i], 0));
      double t2 = now_ns();
      CU(maccess(base + (CUdeviceptr)i * psz[k], psz[k], &ad, 1));
      double t3 = now_ns();
      tc += t1 - t0, tm += t2 - t1, ts += t3 - t2;
    }
    for (int i = 0; i < n; i++) {
      double t0 = now_ns();
      CU(munmap_(base + (CUdeviceptr)i * psz[k], psz[k]));
      double t1 = now_ns();
      CU(mrelease(h[i]));
      tu += t1 - t0, tr += now_ns() - t1;
    }
    char what[96];
    snprintf(what, sizeof what, "page %zu MiB: cuMemCreate", psz[k] >> 20);
    report(what, tc, n);
    snprintf(what, sizeof what, "page %zu MiB: cuMemMap", psz[k] >> 20);
    report(what, tm, n);
    snprintf(what, sizeof what, "page %zu MiB: cuMemSetAccess", psz[k] >> 20);
    report(what, ts, n);
    snprintf(what, sizeof what, "page %zu MiB: cuMemUnmap", psz[k] >> 20);
    report(what, tu, n);
    snprintf(what, sizeof what, "page %zu MiB: cuMemRelease", psz[k] >> 20);
    report(what, tr, n);
  }
  /* Batched: 16 pages of 2 MiB created and mapped one by one, one
   * cuMemSetAccess over all 32 MiB. */
  {
    int rounds = 16;
    double tb = 0, tub = 0;
    CUmemGenericAllocationHandle h[16];
    for (int r = 0; r < rounds; r++) {
      double t0 = now_ns();
      for (int i = 0; i < 16; i++) {
        CU(mcreate(&h[i], (size_t)2 << 20, &mp, 0));
        CU(mmap_(base + (CUdeviceptr)i * (2 << 20), (size_t)2 << 20, 0, h[i], 0));
      }
      CU(maccess(base, (size_t)32 << 20, &ad, 1));
      double t1 = now_ns();
      for (int i = 0; i < 16; i++) {
        CU(munmap_(base + (CUdeviceptr)i * (2 << 20), (size_t)2 << 20));
        CU(mrelease(h[i]));
      }
      tb += t1 - t0;
      tub += now_ns() - t1;
    }
    report("32 MiB as 16 x 2 MiB pages, one cuMemSetAccess: map all", tb, rounds);
    report("32 MiB as 16 x 2 MiB pages: unmap + release all", tub, rounds);
  }
  /* Unmapping while the device is busy on another stream: does it wait? */
  {
    CUmemGenericAllocationHandle h;
    CU(mcreate(&h, (size_t)2 << 20, &mp, 0));
    CU(mmap_(base, (size_t)2 << 20, 0, h, 0));
    CU(maccess(base, (size_t)2 << 20, &ad, 1));
    void *big;
    CK(cudaMalloc(&big, (size_t)4 << 30));
    for (int i = 0; i < 20; i++) CK(cudaMemsetAsync(big, i, (size_t)4 << 30, s2));
    double t0 = now_ns();
    CU(munmap_(base, (size_t)2 << 20));
    double t1 = now_ns();
    CU(mrelease(h));
    double t2 = now_ns();
    cudaError_t q = cudaStreamQuery(s2);
    printf("unmap with 20 x 4 GiB memsets queued elsewhere: cuMemUnmap %.0f ns, cuMemRelease %.0f "
           "ns, other stream still busy after: %s\n",
           t1 - t0, t2 - t1, q == cudaErrorNotReady ? "yes" : "no");
    (void)cudaGetLastError();
    CK(cudaStreamSynchronize(s2));
    CK(cudaFree(big));
  }
  threads_section();
  return 0;
}
