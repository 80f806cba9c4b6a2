// SPDX-License-Identifier: Apache-2.0
/*
 * A check of bench/peers.cpp on a machine without a GPU (scripts/peers
 * --selftest builds and runs it): peers.cpp compiled without PyTorch, linked
 * with rmmc's bench and replay engines and librmmc, over a fake CUDA runtime
 * defined here (host memory, streams as tokens, a "default pool" that keeps
 * what was freed as reserved until trimmed). The executable's definitions
 * take the place of the CUDA runtime's for librmmc and the engines too.
 *
 *   peers_selftest bench|replay ...   peers itself, over the fake runtime
 *   peers_selftest wrap               the wrappers checked call by call:
 *                                     each call reaches the peer's API,
 *                                     describe's figures, destroy's trim
 *
 * What it cannot show: anything about a real GPU, the driver or PyTorch's
 * allocator (the cca wrappers are not built here).
 */
#define main peers_main
#include "peers.cpp"
#undef main

#include <mutex>
#include <set>
#include <unordered_map>

/* ---- the fake CUDA runtime ---- */

namespace {
std::mutex fake_lock;
std::set<void *> fake_streams;
uint64_t pool_used = 0, pool_used_high = 0, pool_reserved = 0, pool_reserved_high = 0,
         pool_threshold = 0;
/* Calls into the fake runtime, by entry point. */
uint64_t n_malloc, n_free, n_pool_alloc, n_pool_free, n_trim;
std::unordered_map<void *, size_t> pool_blocks;
int fake_pool_token;
}  // namespace

extern "C" {
cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int) {
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "fake CUDA device (peers_selftest)");
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t) { return "cudaErrorFake"; }
const char *cudaGetErrorString(cudaError_t) { return "fake runtime error"; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::mutex> g(fake_lock);
  bool known = s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread ||
               fake_streams.count((void *)s) > 0;
  return known ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
  std::lock_guard<std::mutex> g(fake_lock);
  void *token = malloc(1);
  fake_streams.insert(token);
  *s = (cudaStream_t)token;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> g(fake_lock);
  if (fake_streams.erase((void *)s) == 0) return cudaErrorInvalidResourceHandle;
  free((void *)s);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
  __atomic_fetch_add(&n_malloc, 1, __ATOMIC_RELAXED);
  *p = malloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
  __atomic_fetch_add(&n_free, 1, __ATOMIC_RELAXED);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr, int) {
  *value = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int) {
  *pool = (cudaMemPool_t)&fake_pool_token;
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, enum cudaMemPoolAttr attr, void *value) {
  std::lock_guard<std::mutex> g(fake_lock);
  uint64_t *v = (uint64_t *)value;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold: *v = pool_threshold; return cudaSuccess;
  case cudaMemPoolAttrUsedMemCurrent: *v = pool_used; return cudaSuccess;
  case cudaMemPoolAttrReservedMemCurrent: *v = pool_reserved; return cudaSuccess;
  case cudaMemPoolAttrUsedMemHigh: *v = pool_used_high; return cudaSuccess;
  case cudaMemPoolAttrReservedMemHigh: *v = pool_reserved_high; return cudaSuccess;
  default: return cudaErrorInvalidValue;
  }
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, enum cudaMemPoolAttr attr, void *value) {
  std::lock_guard<std::mutex> g(fake_lock);
  uint64_t v = *(uint64_t *)value;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold: pool_threshold = v; return cudaSuccess;
  case cudaMemPoolAttrUsedMemHigh: pool_used_high = pool_used; return v == 0 ? cudaSuccess : cudaErrorInvalidValue;
  case cudaMemPoolAttrReservedMemHigh: pool_reserved_high = pool_reserved; return v == 0 ? cudaSuccess : cudaErrorInvalidValue;
  default: return cudaErrorInvalidValue;
  }
}
cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t, cudaStream_t) {
  *p = malloc(bytes ? bytes : 1);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> g(fake_lock);
  n_pool_alloc++;
  pool_blocks[*p] = bytes;
  pool_used += bytes;
  pool_reserved = std::max(pool_reserved, pool_used);
  pool_used_high = std::max(pool_used_high, pool_used);
  pool_reserved_high = std::max(pool_reserved_high, pool_reserved);
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t) {
  std::lock_guard<std::mutex> g(fake_lock);
  auto it = pool_blocks.find(p);
  if (it == pool_blocks.end()) return cudaErrorInvalidValue;
  n_pool_free++;
  pool_used -= it->second;
  pool_blocks.erase(it);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t keep) {
  std::lock_guard<std::mutex> g(fake_lock);
  n_trim++;
  pool_reserved = std::max(pool_used, std::min<uint64_t>(pool_reserved, keep));
  return cudaSuccess;
}
}

/* ---- the wrappers, call by call ---- */

namespace {

int failures;

void expect(bool ok, const char *what, uint64_t got, uint64_t want) {
  if (ok && got == want) return;
  fprintf(stderr, "wrap: %s: got %llu, want %llu%s\n", what, (unsigned long long)got,
          (unsigned long long)want, ok ? "" : " (not reported)");
  failures++;
}

void expect_field(rmmc_resource_t *r, const char *key, uint64_t want) {
  uint64_t v = 0;
  bool ok = rmmc_resource_get_field(r, key, &v);
  std::string what = std::string(rmmc_resource_name(r)) + " describe " + key;
  expect(ok, what.c_str(), v, want);
}

/* Three blocks through the library's wrappers onto one peer, then two
 * freed: each call must reach the peer's own entry point, and describe
 * must say what the peer says. */
void check_peer(Kind kind) {
  rmmc_resource_t *r = nullptr;
  if (peer_create(kind, 0, &r) != RMMC_SUCCESS) {
    fprintf(stderr, "wrap: %s: %s\n", kNames[kind], rmmc_last_error_message());
    failures++;
    return;
  }
  bool pool = kind != CUDA_MALLOC;
  uint64_t *allocs = pool ? &n_pool_alloc : &n_malloc, *frees = pool ? &n_pool_free : &n_free;
  uint64_t a0 = *allocs, f0 = *frees, t0 = n_trim;
  cudaStream_t s = nullptr;
  void *p[3] = {};
  const size_t sizes[3] = {1024, 4096, 65536};
  for (int i = 0; i < 3; i++)
    expect(rmmc_resource_allocate(r, sizes[i], 256, s, &p[i]) == RMMC_SUCCESS && p[i] != nullptr,
           "allocate", 0, 0);
  expect(true, "allocations reaching the peer", *allocs - a0, 3);
  expect_field(r, "in_use", 1024 + 4096 + 65536);
  expect_field(r, "reserved", 1024 + 4096 + 65536);
  expect(rmmc_resource_deallocate(r, p[2], sizes[2], 256, s) == RMMC_SUCCESS, "deallocate", 0, 0);
  expect(rmmc_resource_deallocate(r, p[0], sizes[0], 256, s) == RMMC_SUCCESS, "deallocate", 0, 0);
  expect(true, "frees reaching the peer", *frees - f0, 2);
  expect_field(r, "in_use", 4096);
  /* The pool keeps what was freed; cudaMalloc gives it straight back. */
  expect_field(r, "reserved", pool ? 1024 + 4096 + 65536 : 4096);
  expect_field(r, "peak", 1024 + 4096 + 65536);
  if (!pool) expect_field(r, "upstream_calls", 5);
  uint64_t v;
  expect(pool == !rmmc_resource_get_field(r, "upstream_calls", &v), "upstream_calls reported",
         0, 0);
  expect(rmmc_resource_deallocate(r, p[1], sizes[1], 256, s) == RMMC_SUCCESS, "deallocate", 0, 0);
  rmmc_resource_release(r); /* destroy empties the cache */
  if (pool) {
    expect(true, "trims by destroy", n_trim - t0, 1);
    expect(true, "the pool's reserved bytes after destroy", pool_reserved, 0);
  }
  /* A fresh wrapper starts from an emptied cache with its peak restarted. */
  if (peer_create(kind, 0, &r) == RMMC_SUCCESS) {
    expect_field(r, "in_use", 0);
    expect_field(r, "reserved", 0);
    expect_field(r, "peak", 0);
    rmmc_resource_release(r);
  }
}

int check_wrappers() {
  for (Kind k : {CUDA_ASYNC, CUDA_ASYNC_DEFAULT, CUDA_MALLOC}) check_peer(k);
  std::string detail;
  expect(peer_setup(CUDA_ASYNC, 0, &detail) == RMMC_SUCCESS, "cuda_async setup", 0, 0);
  expect(true, "cuda_async's release threshold", pool_threshold, UINT64_MAX);
  expect(peer_setup(CCA, 0, &detail) != RMMC_SUCCESS, "cca refused without PyTorch", 0, 0);
  printf("wrap: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "wrap") == 0) return check_wrappers();
  return peers_main(argc, argv);
}
