/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer copy bandwidth between two GPUs (docs/design.md quotes the
 * figures): cudaMemcpyPeerAsync from a block of a pool on the source device
 * to a block of a pool on the destination device, against the same copy
 * between plain cudaMalloc buffers, both ways, for 1 MiB, 64 MiB and
 * 256 MiB. Variants: cudaMalloc with peer access still off (what the
 * driver does without it: staged copies), cudaMalloc with peer access on,
 * `pool > cuda` (driver pages, granted to the peer by
 * rmmc_resource_enable_peer_access) and `pool(expandable=false) > cuda`
 * (cudaMalloc chunks). Each figure is the median of several trials, each
 * trial a batch of copies timed with events on a stream of the source
 * device; after the trials one more copy into a zeroed destination is
 * read back whole and checked.
 *
 *   rmmc-peer-bw [--json FILE] [--quick] [--devices SRC,DST]
 *
 * Exit status: 0 measured; 1 a CUDA or rmmc failure, or data copied wrong;
 * 2 bad command line; 77 skipped (fewer than two GPUs, or two that cannot
 * be peers: it says so). Built by tools/meson.build (not installed);
 * `scripts/gpu-check --peer` runs it.
 */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "rmmc/rmmc.h"

#define MiB ((size_t)1 << 20)
#define TRIALS_MAX 9

/* Where the two buffers of a variant come from: two stacks (one per
 * device), or plain cudaMalloc (stacks NULL). */
typedef struct variant {
  const char *name;
  const char *spec; /* NULL: cudaMalloc */
  rmmc_resource_t *stack[2];
} variant_t;

static void *take(variant_t *v, int side, int device, size_t n) {
  void *p = NULL;
  if (v->spec == NULL) {
    CK(cudaSetDevice(device));
    CK(cudaMalloc(&p, n));
  } else {
    RM(rmmc_resource_allocate(v->stack[side], n, 256, NULL, &p));
  }
  return p;
}

static void give(variant_t *v, int side, int device, void *p, size_t n) {
  if (v->spec == NULL) {
    CK(cudaSetDevice(device));
    CK(cudaFree(p));
  } else {
    RM(rmmc_resource_deallocate(v->stack[side], p, n, 256, NULL));
  }
}

static FILE *json;
static int records;
static char names[2][256];

/* The median GB/s of copies of n bytes from device `from` to `to` (trials
 * of `copies` each), and the data check. */
static double measure(variant_t *v, const int dev[2], int from, size_t n, int trials, int copies) {
  int to = 1 - from;
  void *src = take(v, from, dev[from], n), *dst = take(v, to, dev[to], n);
  unsigned char value = (unsigned char)(0x30 + n / MiB % 200);
  CK(cudaSetDevice(dev[from]));
  CK(cudaMemset(src, value, n));
  CK(cudaDeviceSynchronize());
  cudaStream_t s;
  cudaEvent_t a, b;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaMemcpyPeerAsync(dst, dev[to], src, dev[from], n, s)); /* warm-up */
  CK(cudaStreamSynchronize(s));
  double gbps[TRIALS_MAX];
  for (int t = 0; t < trials; t++) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < copies; i++) CK(cudaMemcpyPeerAsync(dst, dev[to], src, dev[from], n, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    gbps[t] = (double)n * copies / ((double)ms * 1e-3) / 1e9;
  }
  double mid = median(gbps, trials);
  /* The data: one more copy into a zeroed destination, read back whole. */
  CK(cudaSetDevice(dev[to]));
  CK(cudaMemset(dst, 0, n));
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(dev[from]));
  CK(cudaMemcpyPeerAsync(dst, dev[to], src, dev[from], n, s));
  CK(cudaStreamSynchronize(s));
  unsigned char *h = malloc(n);
  if (h == NULL) die("malloc", "no host memory for the check");
  CK(cudaSetDevice(dev[to]));
  CK(cudaMemcpy(h, dst, n, cudaMemcpyDefault));
  CK(cudaSetDevice(dev[from]));
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += h[i] != value;
  free(h);
  if (wrong != 0) {
    char why[160];
    snprintf(why, sizeof why, "%zu of %zu bytes copied from device %d to %d are wrong", wrong, n,
             dev[from], dev[to]);
    die(v->name, why);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaStreamDestroy(s));
  give(v, from, dev[from], src, n);
  give(v, to, dev[to], dst, n);
  return mid;
}

/* Turns on the contexts' peer access both ways, as an application that
 * copies between cudaMalloc buffers would. */
static void enable_contexts(const int dev[2]) {
  for (int i = 0; i < 2; i++) {
    CK(cudaSetDevice(dev[i]));
    cudaError_t err = cudaDeviceEnablePeerAccess(dev[1 - i], 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else CK(err);
  }
}

int main(int argc, char **argv) {
  bench_program = "rmmc-peer-bw";
  const char *json_path = NULL;
  bool quick = false;
  int dev[2] = {0, 1};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (strcmp(argv[i], "--quick") == 0) quick = true;
    else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc &&
             sscanf(argv[i + 1], "%d,%d", &dev[0], &dev[1]) == 2 && dev[0] >= 0 && dev[1] >= 0 &&
             dev[0] != dev[1])
      i++;
    else {
      fprintf(stderr, "usage: rmmc-peer-bw [--json FILE] [--quick] [--devices SRC,DST]\n");
      return 2;
    }
  }
  int n = rmmc_device_count();
  if (n < 2 || dev[0] >= n || dev[1] >= n) {
    printf("skipped: needs two GPUs (devices %d and %d; this machine has %d)\n", dev[0], dev[1], n);
    return 77;
  }
  if (!rmmc_device_can_access_peer(dev[0], dev[1]) || !rmmc_device_can_access_peer(dev[1], dev[0])) {
    printf("skipped: devices %d and %d cannot be peers (cudaDeviceCanAccessPeer)\n", dev[0], dev[1]);
    return 77;
  }
  for (int i = 0; i < 2; i++) {
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev[i]));
    snprintf(names[i], sizeof names[i], "%s", prop.name);
  }
  if (json_path != NULL && (json = fopen(json_path, "w")) == NULL) die("fopen", json_path);
  if (json != NULL) fprintf(json, "[");

  variant_t variants[] = {
      {"cudaMalloc, peer access off", NULL, {NULL, NULL}},
      {"cudaMalloc", NULL, {NULL, NULL}},
      {"pool > cuda", "pool > cuda", {NULL, NULL}},
      {"pool(expandable=false) > cuda", "pool(expandable=false) > cuda", {NULL, NULL}},
  };
  const size_t sizes[] = {MiB, 64 * MiB, 256 * MiB};
  const int copies[] = {200, 20, 8};
  int trials = quick ? 3 : 7;
  double base[2][3] = {{0}}; /* cudaMalloc with peer access, per direction and size */
  printf("# rmmc-peer-bw: device %d (%s) and device %d (%s); cudaMemcpyPeerAsync on a stream of "
         "the source device, median of %d trials\n",
         dev[0], names[0], dev[1], names[1], trials);
  printf("%-32s %-6s %9s %10s %14s\n", "variant", "copy", "size", "GB/s", "vs cudaMalloc");
  for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
    variant_t *v = &variants[vi];
    if (vi == 1) enable_contexts(dev);
    for (int side = 0; v->spec != NULL && side < 2; side++) {
      if (rmmc_stack_create(v->spec, dev[side], &v->stack[side]) != RMMC_SUCCESS)
        die(v->spec, rmmc_last_error_message());
      RM(rmmc_resource_enable_peer_access(v->stack[side], dev[1 - side]));
    }
    for (int from = 0; from < 2; from++)
      for (int k = 0; k < 3; k++) {
        double g = measure(v, dev, from, sizes[k], trials, quick ? copies[k] / 4 + 1 : copies[k]);
        if (vi == 1) base[from][k] = g;
        char dir[32], size[32], ratio[32] = "";
        snprintf(dir, sizeof dir, "%d->%d", dev[from], dev[1 - from]);
        snprintf(size, sizeof size, "%zu MiB", sizes[k] / MiB);
        if (vi != 1 && base[from][k] > 0) snprintf(ratio, sizeof ratio, "%.2fx", g / base[from][k]);
        printf("%-32s %-6s %9s %10.1f %14s\n", v->name, dir, size, g, ratio);
        fflush(stdout);
        if (json != NULL)
          fprintf(json,
                  "%s\n  {\"variant\": \"%s\", \"from\": %d, \"to\": %d, \"bytes\": %zu, "
                  "\"gbps\": %.2f, \"vs_cudamalloc\": %.3f, \"trials\": %d, \"copies\": %d, "
                  "\"devices\": [\"%s\", \"%s\"]}",
                  records++ ? "," : "", v->name, dev[from], dev[1 - from], sizes[k], g,
                  base[from][k] > 0 ? g / base[from][k] : 0.0, trials,
                  quick ? copies[k] / 4 + 1 : copies[k], names[0], names[1]);
      }
    for (int side = 0; side < 2; side++) rmmc_resource_release(v->stack[side]);
  }
  if (json != NULL) {
    fprintf(json, "\n]\n");
    fclose(json);
  }
  return 0;
}
