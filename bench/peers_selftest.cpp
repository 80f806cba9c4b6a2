/*
 * A check of bench/peers.cpp on a machine without a GPU (scripts/peers
 * --selftest builds and runs it): peers.cpp compiled without PyTorch and
 * linked against a fake CUDA runtime defined here (host memory, streams as
 * tokens, a "default pool" that counts bytes), so the bench and replay
 * engines, the threads, the cudaMalloc and cudaMallocAsync code paths and
 * the reports run end to end. What it cannot show: anything about a real
 * GPU, the driver or PyTorch's allocator.
 *
 *   peers_selftest bench|replay ...   peers itself, over the fake runtime
 *   peers_selftest seq PATTERN MIN MAX LIVE OPS SEED THREADS
 *                                     the op sequences, one line per thread
 *                                     (FNV-1a of fill sizes, victims, step sizes)
 *   peers_selftest log FILE           the parsed log: counts, then one line
 *                                     per event (action slot size thread stream)
 */
#define main peers_main
#include "peers.cpp"
#undef main

#include <mutex>
#include <set>

/* ---- the fake CUDA runtime ---- */

namespace {
std::mutex fake_lock;
std::set<void *> fake_streams;
uint64_t pool_used = 0, pool_used_high = 0, pool_reserved_high = 0, pool_threshold = 0;
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
  *p = malloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
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
  case cudaMemPoolAttrUsedMemCurrent:
  case cudaMemPoolAttrReservedMemCurrent: *v = pool_used; return cudaSuccess;
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
  case cudaMemPoolAttrReservedMemHigh: pool_reserved_high = pool_used; return v == 0 ? cudaSuccess : cudaErrorInvalidValue;
  default: return cudaErrorInvalidValue;
  }
}
cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t, cudaStream_t) {
  *p = malloc(bytes ? bytes : 1);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> g(fake_lock);
  pool_blocks[*p] = bytes;
  pool_used += bytes;
  pool_used_high = std::max(pool_used_high, pool_used);
  pool_reserved_high = std::max(pool_reserved_high, pool_used);
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t) {
  std::lock_guard<std::mutex> g(fake_lock);
  auto it = pool_blocks.find(p);
  if (it == pool_blocks.end()) return cudaErrorInvalidValue;
  pool_used -= it->second;
  pool_blocks.erase(it);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }
}

/* ---- dumps for comparing with rmmc's own code ---- */

namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int i = 0; i < 8; i++) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};

int dump_sequences(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: peers_selftest seq pair|random MIN MAX LIVE OPS SEED THREADS\n");
    return 2;
  }
  BenchCase c{};
  c.pattern = strcmp(argv[2], "pair") == 0 ? PAIR : RANDOM;
  c.min_bytes = strtoull(argv[3], nullptr, 10);
  c.max_bytes = strtoull(argv[4], nullptr, 10);
  c.live = strtoull(argv[5], nullptr, 10);
  BenchParams p{atoi(argv[8]), (size_t)strtoull(argv[6], nullptr, 10), 1,
                strtoull(argv[7], nullptr, 10), 0};
  for (int t = 0; t < p.threads; t++) {
    Worker w;
    w.index = t;
    generate_sequence(&w, &c, &p);
    Fnv fill, victims, steps;
    for (size_t v : w.fill_sizes) fill.add(v);
    for (uint32_t v : w.victims) victims.add(v);
    for (size_t v : w.step_sizes) steps.add(v);
    printf("thread %d: fill %zu %016llx victims %zu %016llx steps %zu %016llx\n", t,
           w.fill_sizes.size(), (unsigned long long)fill.h, w.victims.size(),
           (unsigned long long)victims.h, w.step_sizes.size(), (unsigned long long)steps.h);
  }
  return 0;
}

int dump_log(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: peers_selftest log FILE\n");
    return 2;
  }
  Log log;
  std::string err;
  if (!read_log(argv[2], &log, &err)) {
    fprintf(stderr, "%s\n", err.c_str());
    return 2;
  }
  printf("events %zu slots %u threads %zu streams %zu allocations %llu frees %llu failures %llu "
         "null %llu peak %llu at %zu live_end %llu outstanding %llu\n",
         log.events.size(), log.nslots, log.thread_ids.size(), log.stream_ids.size(),
         (unsigned long long)log.allocations, (unsigned long long)log.frees,
         (unsigned long long)log.logged_failures, (unsigned long long)log.null_events,
         (unsigned long long)log.peak_live, log.peak_event, (unsigned long long)log.live_at_end,
         (unsigned long long)log.outstanding_at_end);
  for (uint64_t id : log.thread_ids) printf("thread %llu\n", (unsigned long long)id);
  for (uint64_t id : log.stream_ids) printf("stream %llx\n", (unsigned long long)id);
  for (const Event &e : log.events)
    printf("%u %u %llu %u %u\n", e.action, e.slot, (unsigned long long)e.size, e.thread, e.stream);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "seq") == 0) return dump_sequences(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "log") == 0) return dump_log(argc, argv);
  return peers_main(argc, argv);
}
