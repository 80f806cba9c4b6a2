/*
 * peers: rmmc-bench's and rmmc-replay's measurements, on exactly the same op
 * sequences and logs, for the allocators rmmc is compared with:
 *
 *   cca                 PyTorch's CUDA caching allocator (c10), through
 *                       raw_alloc_with_stream(size, stream) / raw_delete(ptr)
 *   cca_expandable      the same with expandable segments (the process must
 *                       run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
 *                       checked at start)
 *   cuda_async          cudaMallocFromPoolAsync / cudaFreeAsync on the device's
 *                       default pool, release threshold set to UINT64_MAX
 *                       (nothing is given back at a synchronization)
 *   cuda_async_default  the same pool with its release threshold left as the
 *                       driver has it (0 unless changed): what rmmc-bench's
 *                       baseline cuda_async(default_pool=true) calls
 *   cudaMalloc          cudaMalloc / cudaFree
 *
 * One allocator per process (the caching allocator reads its configuration
 * from the environment once); scripts/peers runs them all and merges the
 * JSON. Memory is never touched: what is measured is the allocators'
 * bookkeeping, as in rmmc's tools.
 *
 * "bench" ports tools/bench_engine.c line for line: the same splitmix64,
 * the same sequences (thread i seeded with seed + i: the fill sizes, then
 * one victim slot and one size per step), the op sequences generated before
 * the threads start, one non-blocking stream per thread, an untimed fill, a
 * barrier, the timed calls plus a cudaStreamSynchronize of the thread's
 * stream, a barrier, an untimed drain, a device synchronization and a check
 * that the allocator hands out 0 bytes after every run; one untimed warm-up
 * run and the same --budget rule (a second warm-up, then a prefix of the
 * sequence). ns/call = wall * threads / calls, the median of --repeat runs.
 * Where rmmc-bench builds a fresh stack per row, peers empties the
 * allocator's cache (emptyCache, cudaMemPoolTrimTo) at the end of each row.
 *
 * "replay" ports tools/replay_log.c (the same checks: every free matches a
 * live allocation, `allocate failure` lines and null pointers are not
 * replayed) and tools/replay_engine.c: one thread per logged thread in the
 * global order of the log (--single-thread: all on one), logged streams
 * mapped to real streams (0: the legacy default stream, 1: cudaStreamLegacy,
 * 2: cudaStreamPerThread, others: a new non-blocking stream each), every call
 * timed with the clock's own cost subtracted, what the log leaves live freed
 * untimed. "warm" replays the log once untimed first and times the second
 * epoch; its peak reserved covers both epochs (as rmmc-replay --warm), and
 * the warm epoch's own peak is reported too. Reserved bytes are the
 * allocator's own figures: the caching allocator's reserved_bytes (device
 * stats), the pool's cudaMemPoolAttrReservedMem{Current,High}, and for
 * cudaMalloc the bytes passed to cudaMalloc still outstanding (what
 * rmmc-replay's meter counts over its cuda base). Upstream calls: the caching
 * allocator's num_device_alloc + num_device_free (cudaMalloc/cudaFree and page
 * maps/unmaps), cudaMalloc's calls; the pool gives no count (null; its
 * reserved growth during the epoch is reported instead).
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef PEERS_NO_TORCH
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif
#endif

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitIo = 3;
constexpr int kExitNoGpu = 77;

constexpr int kMaxThreads = 256;
constexpr int kMaxRepeat = 100;
constexpr size_t kMaxOps = 10000000;
constexpr size_t kErrLen = 1024;

const char *program = "peers";

int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", program);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(%s --help lists the options)\n", program);
  return kExitUsage;
}

uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64, as tools/bench_engine.c. */
uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/* rmmc's size syntax (rmmc__parse_bytes): 256, 64KiB, 1.5MiB, 4M, 2GB. */
bool parse_bytes(const char *text, size_t *out) {
  char buf[64];
  size_t len = strlen(text);
  if (len == 0 || len >= sizeof buf) return false;
  memcpy(buf, text, len + 1);
  char *end;
  double v = strtod(buf, &end);
  if (end == buf || !(v >= 0) || !isdigit((unsigned char)buf[0])) return false;
  static const struct {
    const char *suffix;
    double mult;
  } units[] = {{"", 1},          {"B", 1},
               {"K", 1024.0},    {"KB", 1024.0},    {"KiB", 1024.0},
               {"M", 1048576.0}, {"MB", 1048576.0}, {"MiB", 1048576.0},
               {"G", 1073741824.0}, {"GB", 1073741824.0}, {"GiB", 1073741824.0},
               {"T", 1099511627776.0}, {"TB", 1099511627776.0}, {"TiB", 1099511627776.0}};
  for (const auto &u : units) {
    if (strcmp(end, u.suffix) == 0) {
      double bytes = v * u.mult;
      if (bytes >= 18446744073709551615.0 || bytes != std::floor(bytes)) return false;
      *out = (size_t)bytes;
      return true;
    }
  }
  return false;
}

bool parse_count(const char *flag, const char *text, unsigned long long lo, unsigned long long hi,
                 unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (!isdigit((unsigned char)text[0]) || *end != '\0' || errno != 0 || v < lo || v > hi) {
    usage_error("%s wants a whole number from %llu to %llu, not '%s'", flag, lo, hi, text);
    return false;
  }
  *out = v;
  return true;
}

/* "4MiB", "1000B": the largest unit that divides the size exactly (as
 * tools/cli.h, so case labels read as rmmc-bench's). */
std::string format_size(size_t bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, u++;
  return std::to_string(bytes) + units[u];
}

/* "10.60 GiB", "512 B". */
std::string human_bytes(uint64_t bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = (double)bytes;
  int u = 0;
  while (x >= 1024.0 && u < 4) x /= 1024.0, u++;
  char buf[32];
  if (u == 0) snprintf(buf, sizeof buf, "%llu B", (unsigned long long)bytes);
  else snprintf(buf, sizeof buf, "%.2f %s", x, units[u]);
  return buf;
}

void json_string(FILE *f, const std::string &s) {
  fputc('"', f);
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

std::string cpu_name() {
  std::string name = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return name;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    char *p = strchr(line, ':');
    if (p == nullptr) break;
    p++;
    while (*p == ' ') p++;
    p[strcspn(p, "\n")] = '\0';
    name = p;
    break;
  }
  fclose(f);
  return name;
}

std::string cuda_message(const char *what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

/* ---- the allocators ---- */

typedef std::vector<std::pair<std::string, uint64_t>> counters_t;

/* One allocator. allocate/deallocate are called from many threads at once
 * (each with its own stream); everything else from the main thread while no
 * call is in flight. */
class Peer {
 public:
  virtual ~Peer() = default;
  virtual const char *name() const = 0;
  /* What exactly runs, for the table header and the JSON. */
  virtual std::string detail() const = 0;
  /* Readies the allocator on `device` and checks it is the one named. */
  virtual bool init(int device, std::string *err) = 0;
  /* Hot path. On failure the message goes to err (len bytes). */
  virtual bool allocate(size_t bytes, cudaStream_t stream, void **out, char *err, size_t len) = 0;
  virtual bool deallocate(void *p, size_t bytes, cudaStream_t stream, char *err, size_t len) = 0;
  /* Bytes the allocator says are handed out (after a device sync); false
   * if it does not say. */
  virtual bool in_use(uint64_t *bytes) = 0;
  /* Back to a fresh state: every cached byte given back. */
  virtual bool release_cached(std::string *err) = 0;
  /* Bytes taken from the driver now, their peak since reset_peak(). */
  virtual uint64_t reserved_current() = 0;
  virtual uint64_t reserved_peak() = 0;
  virtual void reset_peak() = 0;
  /* Driver allocations and frees (page maps and unmaps included) so far;
   * false if the allocator does not count them. */
  virtual bool upstream_calls(uint64_t *n) = 0;
  /* Further cumulative counters worth a delta over an epoch. */
  virtual void counters(counters_t *out) { out->clear(); }
};

class CudaMallocPeer final : public Peer {
 public:
  const char *name() const override { return "cudaMalloc"; }
  std::string detail() const override { return "cudaMalloc/cudaFree"; }
  bool init(int, std::string *) override { return true; }
  bool allocate(size_t bytes, cudaStream_t, void **out, char *err, size_t len) override {
    cudaError_t e = cudaMalloc(out, bytes);
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *out = nullptr;
      snprintf(err, len, "%s", cuda_message("cudaMalloc", e).c_str());
      return false;
    }
    uint64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (peak < now && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return true;
  }
  bool deallocate(void *p, size_t bytes, cudaStream_t, char *err, size_t len) override {
    cudaError_t e = cudaFree(p);
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      snprintf(err, len, "%s", cuda_message("cudaFree", e).c_str());
      return false;
    }
    current_.fetch_sub(bytes, std::memory_order_relaxed);
    return true;
  }
  bool in_use(uint64_t *bytes) override {
    *bytes = current_.load();
    return true;
  }
  bool release_cached(std::string *) override { return true; }
  uint64_t reserved_current() override { return current_.load(); }
  uint64_t reserved_peak() override { return peak_.load(); }
  void reset_peak() override { peak_.store(current_.load()); }
  bool upstream_calls(uint64_t *n) override {
    *n = calls_.load();
    return true;
  }

 private:
  std::atomic<uint64_t> current_{0}, peak_{0}, calls_{0};
};

class CudaAsyncPeer final : public Peer {
 public:
  explicit CudaAsyncPeer(bool keep) : keep_(keep) {}
  const char *name() const override { return keep_ ? "cuda_async" : "cuda_async_default"; }
  std::string detail() const override {
    char buf[256];
    snprintf(buf, sizeof buf,
             "cudaMallocFromPoolAsync/cudaFreeAsync on the device's default pool, release "
             "threshold %s (%llu; it was %llu)",
             keep_ ? "set to UINT64_MAX" : "left as it was", (unsigned long long)threshold_,
             (unsigned long long)threshold_before_);
    return buf;
  }
  bool init(int device, std::string *err) override {
    int supported = 0;
    cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
    if (e != cudaSuccess) return fail(err, "cudaDeviceGetAttribute(MemoryPoolsSupported)", e);
    if (!supported) {
      *err = "device " + std::to_string(device) + " does not support memory pools";
      return false;
    }
    e = cudaDeviceGetDefaultMemPool(&pool_, device);
    if (e != cudaSuccess) return fail(err, "cudaDeviceGetDefaultMemPool", e);
    e = cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold_before_);
    if (e != cudaSuccess) return fail(err, "cudaMemPoolGetAttribute(ReleaseThreshold)", e);
    threshold_ = threshold_before_;
    if (keep_) {
      threshold_ = UINT64_MAX;
      e = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold_);
      if (e != cudaSuccess) return fail(err, "cudaMemPoolSetAttribute(ReleaseThreshold)", e);
    }
    return true;
  }
  bool allocate(size_t bytes, cudaStream_t stream, void **out, char *err, size_t len) override {
    cudaError_t e = cudaMallocFromPoolAsync(out, bytes, pool_, stream);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    *out = nullptr;
    snprintf(err, len, "%s", cuda_message("cudaMallocFromPoolAsync", e).c_str());
    return false;
  }
  bool deallocate(void *p, size_t, cudaStream_t stream, char *err, size_t len) override {
    cudaError_t e = cudaFreeAsync(p, stream);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    snprintf(err, len, "%s", cuda_message("cudaFreeAsync", e).c_str());
    return false;
  }
  bool in_use(uint64_t *bytes) override { return attr(cudaMemPoolAttrUsedMemCurrent, bytes); }
  bool release_cached(std::string *err) override {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemPoolTrimTo(pool_, 0);
    return e == cudaSuccess || fail(err, "cudaMemPoolTrimTo", e);
  }
  uint64_t reserved_current() override {
    uint64_t v = 0;
    attr(cudaMemPoolAttrReservedMemCurrent, &v);
    return v;
  }
  uint64_t reserved_peak() override {
    uint64_t v = 0;
    attr(cudaMemPoolAttrReservedMemHigh, &v);
    return v;
  }
  void reset_peak() override {
    uint64_t zero = 0; /* resets the high-water mark to the current value */
    if (cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero) != cudaSuccess)
      (void)cudaGetLastError();
    if (cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero) != cudaSuccess)
      (void)cudaGetLastError();
  }
  bool upstream_calls(uint64_t *) override { return false; }

 private:
  static bool fail(std::string *err, const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    *err = cuda_message(what, e);
    return false;
  }
  bool attr(cudaMemPoolAttr a, uint64_t *v) {
    if (cudaMemPoolGetAttribute(pool_, a, v) == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
  }
  bool keep_;
  cudaMemPool_t pool_ = nullptr;
  uint64_t threshold_before_ = 0, threshold_ = 0;
};

#ifndef PEERS_NO_TORCH
namespace CCA = c10::cuda::CUDACachingAllocator;

std::string torch_version() {
#ifdef TORCH_VERSION_MAJOR
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
#else
  return "unknown";
#endif
}

std::string env_or(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return v != nullptr ? v : dflt;
}

class CcaPeer final : public Peer {
 public:
  explicit CcaPeer(bool expandable) : expandable_(expandable) {}
  const char *name() const override { return expandable_ ? "cca_expandable" : "cca"; }
  std::string detail() const override {
    return "PyTorch " + torch_version() + " CUDA caching allocator (backend " + backend_ +
           ", expandable segments " + (expandable_ ? "on" : "off") +
           "), raw_alloc_with_stream/raw_delete; PYTORCH_CUDA_ALLOC_CONF=" +
           env_or("PYTORCH_CUDA_ALLOC_CONF", "(unset)") +
           " PYTORCH_ALLOC_CONF=" + env_or("PYTORCH_ALLOC_CONF", "(unset)") + notes_;
  }

  bool init(int device, std::string *err) override {
    device_ = (c10::DeviceIndex)device;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      *err = cuda_message("cudaGetDeviceCount", e);
      return false;
    }
    cudaStream_t probe = nullptr;
    try {
      CCA::init(count); /* what torch.cuda's lazy init does; a no-op when done */
      CCA::CUDAAllocator *a = CCA::get();
      if (a == nullptr) {
        *err = "c10::cuda::CUDACachingAllocator::get() is null";
        return false;
      }
      backend_ = a->name();
      if (backend_ == "cudaMallocAsync") {
        *err = "PyTorch's CUDA allocator backend is 'cudaMallocAsync', not the caching allocator: "
               "unset backend: in PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF";
        return false;
      }
      bool configured = c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
      if (configured != expandable_) {
        *err = std::string("expandable segments are ") + (configured ? "on" : "off") +
               " in this process but '" + name() + "' wants them " +
               (expandable_ ? "on: run it with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                            : "off: run it without expandable_segments in PYTORCH_CUDA_ALLOC_CONF "
                              "and PYTORCH_ALLOC_CONF");
        return false;
      }
      /* A probe: the allocator must accept a stream it did not create (and
       * should key the block by it: a note if its snapshot says otherwise),
       * and must make an expandable segment iff asked. */
      e = cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        *err = cuda_message("cudaStreamCreateWithFlags", e);
        return false;
      }
      void *p = CCA::raw_alloc_with_stream((size_t)4 << 20, probe);
      CCA::SnapshotInfo snap = CCA::snapshot();
      bool found = false;
      for (const auto &seg : snap.segments) {
        if ((size_t)p < seg.address || (size_t)p >= seg.address + seg.total_size) continue;
        found = true;
        if (seg.stream != (void *)probe)
          notes_ += "; note: the snapshot names another stream than the one passed";
        if (seg.is_expandable != expandable_)
          *err = std::string("the caching allocator made a ") +
                 (seg.is_expandable ? "n expandable" : " plain") + " segment for '" + name() + "'";
      }
      if (!found) notes_ += "; note: the probe allocation is in no segment of the snapshot";
      else if (notes_.empty()) notes_ = "; probe: a foreign stream's block, keyed by that stream";
      CCA::raw_delete(p);
      e = cudaStreamSynchronize(probe);
      if (e != cudaSuccess && err->empty()) *err = cuda_message("cudaStreamSynchronize", e);
      CCA::emptyCache();
    } catch (const c10::Error &x) {
      *err = std::string("the caching allocator failed: ") + x.what_without_backtrace();
    } catch (const std::exception &x) {
      *err = std::string("the caching allocator failed: ") + x.what();
    }
    if (probe != nullptr) (void)cudaStreamDestroy(probe);
    return err->empty();
  }

  bool allocate(size_t bytes, cudaStream_t stream, void **out, char *err, size_t len) override {
    try {
      *out = CCA::raw_alloc_with_stream(bytes, stream);
      return true;
    } catch (const c10::Error &x) {
      snprintf(err, len, "raw_alloc_with_stream: %s", x.what_without_backtrace());
    } catch (const std::exception &x) {
      snprintf(err, len, "raw_alloc_with_stream: %s", x.what());
    }
    *out = nullptr;
    return false;
  }
  bool deallocate(void *p, size_t, cudaStream_t, char *err, size_t len) override {
    try {
      CCA::raw_delete(p);
      return true;
    } catch (const c10::Error &x) {
      snprintf(err, len, "raw_delete: %s", x.what_without_backtrace());
    } catch (const std::exception &x) {
      snprintf(err, len, "raw_delete: %s", x.what());
    }
    return false;
  }
  bool in_use(uint64_t *bytes) override {
    c10::CachingDeviceAllocator::DeviceStats s;
    if (!stats(&s)) return false;
    *bytes = (uint64_t)s.allocated_bytes[0].current;
    return true;
  }
  bool release_cached(std::string *err) override {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      *err = cuda_message("cudaDeviceSynchronize", e);
      return false;
    }
    try {
      CCA::emptyCache();
      return true;
    } catch (const c10::Error &x) {
      *err = std::string("emptyCache: ") + x.what_without_backtrace();
    } catch (const std::exception &x) {
      *err = std::string("emptyCache: ") + x.what();
    }
    return false;
  }
  uint64_t reserved_current() override {
    c10::CachingDeviceAllocator::DeviceStats s;
    return stats(&s) ? (uint64_t)s.reserved_bytes[0].current : 0;
  }
  uint64_t reserved_peak() override {
    c10::CachingDeviceAllocator::DeviceStats s;
    return stats(&s) ? (uint64_t)s.reserved_bytes[0].peak : 0;
  }
  void reset_peak() override {
    try {
      CCA::resetPeakStats(device_);
    } catch (const std::exception &) {
    }
  }
  bool upstream_calls(uint64_t *n) override {
    c10::CachingDeviceAllocator::DeviceStats s;
    if (!stats(&s)) return false;
    *n = (uint64_t)(s.num_device_alloc + s.num_device_free);
    return true;
  }
  void counters(counters_t *out) override {
    out->clear();
    c10::CachingDeviceAllocator::DeviceStats s;
    if (!stats(&s)) return;
    out->emplace_back("device_allocs", (uint64_t)s.num_device_alloc);
    out->emplace_back("device_frees", (uint64_t)s.num_device_free);
    out->emplace_back("segments_allocated", (uint64_t)s.segment[0].allocated);
    out->emplace_back("segments_freed", (uint64_t)s.segment[0].freed);
    out->emplace_back("alloc_retries", (uint64_t)s.num_alloc_retries);
    out->emplace_back("sync_all_streams", (uint64_t)s.num_sync_all_streams);
    out->emplace_back("ooms", (uint64_t)s.num_ooms);
  }

 private:
  bool stats(c10::CachingDeviceAllocator::DeviceStats *s) {
    try {
      *s = CCA::getDeviceStats(device_);
      return true;
    } catch (const std::exception &) {
      return false;
    }
  }
  bool expandable_;
  c10::DeviceIndex device_ = 0;
  std::string backend_ = "?";
  std::string notes_;
};
#endif /* PEERS_NO_TORCH */

const char *const kAllocators[] = {"cca", "cca_expandable", "cuda_async", "cuda_async_default",
                                   "cudaMalloc"};

Peer *make_peer(const std::string &name) {
  if (name == "cudaMalloc") return new CudaMallocPeer();
  if (name == "cuda_async") return new CudaAsyncPeer(true);
  if (name == "cuda_async_default") return new CudaAsyncPeer(false);
#ifndef PEERS_NO_TORCH
  if (name == "cca") return new CcaPeer(false);
  if (name == "cca_expandable") return new CcaPeer(true);
#endif
  return nullptr;
}

/* ---- bench: tools/bench_engine.c ---- */

enum Pattern { PAIR = 1, RANDOM = 2 };

struct BenchCase {
  Pattern pattern;
  size_t min_bytes, max_bytes, live;
  std::string label;
};

struct BenchParams {
  int threads;
  size_t ops;
  int repeat;
  uint64_t seed;
  double budget_s;
};

struct BenchResult {
  bool ok = false;
  size_t ops = 0;
  int runs = 0;
  double ns[kMaxRepeat] = {};
  double median = 0, min = 0, max = 0, ops_per_s = 0;
  char error[kErrLen] = {};
};

struct Slot {
  void *ptr;
  size_t bytes;
};

struct Engine;

struct Worker {
  Engine *e = nullptr;
  int index = 0;
  pthread_t thread{};
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  std::vector<size_t> fill_sizes;
  std::vector<uint32_t> victims;
  std::vector<size_t> step_sizes;
  std::vector<Slot> slots;
  uint64_t t_start = 0, t_end = 0;
  size_t done = 0;
  bool failed = false;
  char error[kErrLen] = {};
};

struct Engine {
  Peer *peer = nullptr;
  int device = 0;
  const BenchCase *c = nullptr;
  int threads = 0;
  size_t ops = 0;
  uint64_t limit_ns = 0;
  bool quit = false;
  pthread_mutex_t start_lock;
  pthread_cond_t start_cond;
  int start_state = 0; /* 0 waiting, 1 go, -1 abort */
  pthread_barrier_t outer; /* main + workers */
  pthread_barrier_t inner; /* workers */
  std::vector<Worker> workers;
};

size_t random_size(uint64_t *state, const BenchCase *c) {
  uint64_t span = (uint64_t)(c->max_bytes - c->min_bytes) + 1;
  return c->min_bytes + (size_t)(span == 0 ? next_random(state) : next_random(state) % span);
}

void worker_fail(Worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void worker_fail(Worker *w, const char *fmt, ...) {
  if (w->failed) return;
  w->failed = true;
  int n = snprintf(w->error, sizeof w->error, "thread %d: ", w->index);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->error + n, sizeof w->error - (size_t)n, fmt, ap);
  va_end(ap);
}

inline bool do_allocate(Worker *w, size_t bytes, void **p) {
  char msg[512];
  if (w->e->peer->allocate(bytes, w->stream, p, msg, sizeof msg)) return true;
  worker_fail(w, "allocate(%zu bytes) failed: %s", bytes, msg);
  return false;
}

inline bool do_deallocate(Worker *w, void *p, size_t bytes) {
  char msg[512];
  if (w->e->peer->deallocate(p, bytes, w->stream, msg, sizeof msg)) return true;
  worker_fail(w, "deallocate(%p, %zu bytes) failed: %s", p, bytes, msg);
  return false;
}

bool sync_stream(Worker *w, const char *when) {
  cudaError_t err = cudaStreamSynchronize(w->stream);
  if (err == cudaSuccess) return true;
  worker_fail(w, "cudaStreamSynchronize %s: %s", when, cudaGetErrorString(err));
  return false;
}

inline bool over_budget(const Worker *w, size_t i) {
  uint64_t limit = w->e->limit_ns;
  return limit != 0 && (i & 63) == 63 && now_ns() - w->t_start > limit;
}

void timed_pair(Worker *w, size_t steps) {
  size_t bytes = w->e->c->min_bytes, i;
  for (i = 0; i < steps; i++) {
    void *p;
    if (!do_allocate(w, bytes, &p)) break;
    if (!do_deallocate(w, p, bytes)) break;
    if (over_budget(w, i)) {
      i++;
      break;
    }
  }
  w->done = 2 * i;
}

void timed_random(Worker *w, size_t steps) {
  size_t i;
  for (i = 0; i < steps; i++) {
    Slot *s = &w->slots[w->victims[i]];
    if (!do_deallocate(w, s->ptr, s->bytes)) break;
    s->ptr = nullptr;
    s->bytes = w->step_sizes[i];
    if (!do_allocate(w, s->bytes, &s->ptr)) break;
    if (over_budget(w, i)) {
      i++;
      break;
    }
  }
  w->done = 2 * i;
}

void worker_run(Worker *w) {
  Engine *e = w->e;
  const BenchCase *c = e->c;
  w->done = 0;
  if (c->pattern == RANDOM) {
    for (size_t i = 0; i < c->live; i++) {
      w->slots[i].bytes = w->fill_sizes[i];
      if (!do_allocate(w, w->slots[i].bytes, &w->slots[i].ptr)) break;
    }
  }
  if (!w->failed) sync_stream(w, "after the fill");
  pthread_barrier_wait(&e->inner);
  w->t_start = now_ns();
  if (!w->failed) {
    if (c->pattern == PAIR) timed_pair(w, e->ops / 2);
    else timed_random(w, e->ops / 2);
    if (!w->failed) sync_stream(w, "at the end of the timed calls");
  }
  w->t_end = now_ns();
  pthread_barrier_wait(&e->inner);
  if (c->pattern == RANDOM) {
    for (size_t i = 0; i < c->live; i++) {
      if (w->slots[i].ptr == nullptr) continue;
      if (do_deallocate(w, w->slots[i].ptr, w->slots[i].bytes)) w->slots[i].ptr = nullptr;
    }
  }
  sync_stream(w, "after the drain");
}

void *worker_main(void *arg) {
  Worker *w = static_cast<Worker *>(arg);
  Engine *e = w->e;
  pthread_mutex_lock(&e->start_lock);
  while (e->start_state == 0) pthread_cond_wait(&e->start_cond, &e->start_lock);
  int state = e->start_state;
  pthread_mutex_unlock(&e->start_lock);
  if (state < 0) return nullptr;
  cudaError_t err = cudaSetDevice(e->device);
  if (err != cudaSuccess) worker_fail(w, "cudaSetDevice(%d): %s", e->device, cudaGetErrorString(err));
  for (;;) {
    pthread_barrier_wait(&e->outer); /* go */
    if (e->quit) break;
    if (w->failed) { /* a failed thread still meets every barrier */
      pthread_barrier_wait(&e->inner);
      pthread_barrier_wait(&e->inner);
    } else {
      worker_run(w);
    }
    pthread_barrier_wait(&e->outer); /* done */
  }
  return nullptr;
}

void generate_sequence(Worker *w, const BenchCase *c, const BenchParams *p) {
  if (c->pattern != RANDOM) return;
  size_t steps = p->ops / 2;
  w->fill_sizes.resize(c->live);
  w->slots.assign(c->live, Slot{nullptr, 0});
  w->victims.resize(steps);
  w->step_sizes.resize(steps);
  uint64_t state = p->seed + (uint64_t)w->index;
  for (size_t i = 0; i < c->live; i++) w->fill_sizes[i] = random_size(&state, c);
  for (size_t i = 0; i < steps; i++) {
    w->victims[i] = (uint32_t)(next_random(&state) % c->live);
    w->step_sizes[i] = random_size(&state, c);
  }
}

bool check_figures(Engine *e, char *err, size_t len) {
  uint64_t v;
  if (e->peer->in_use(&v) && v != 0) {
    snprintf(err, len, "after every block was freed, %s reports %llu bytes in use (expected 0)",
             e->peer->name(), (unsigned long long)v);
    return false;
  }
  return true;
}

bool engine_run(Engine *e, size_t ops, uint64_t limit_ns, uint64_t *wall_ns, size_t *done_min,
                char *err, size_t len) {
  e->ops = ops;
  e->limit_ns = limit_ns;
  pthread_barrier_wait(&e->outer); /* go */
  pthread_barrier_wait(&e->outer); /* done */
  uint64_t first = UINT64_MAX, last = 0;
  size_t dmin = SIZE_MAX;
  for (int i = 0; i < e->threads; i++) {
    Worker *w = &e->workers[i];
    if (w->failed) {
      snprintf(err, len, "%s", w->error);
      return false;
    }
    first = std::min(first, w->t_start);
    last = std::max(last, w->t_end);
    dmin = std::min(dmin, w->done);
  }
  cudaError_t cerr = cudaDeviceSynchronize();
  if (cerr != cudaSuccess) {
    snprintf(err, len, "cudaDeviceSynchronize after a run: %s", cudaGetErrorString(cerr));
    return false;
  }
  if (!check_figures(e, err, len)) return false;
  *wall_ns = last > first ? last - first : 1;
  *done_min = dmin;
  return true;
}

void bench_measure(Peer *peer, int device, const BenchCase *c, const BenchParams *p,
                   BenchResult *out) {
  *out = BenchResult();
  char *err = out->error;
  size_t len = sizeof out->error;
  Engine e;
  e.peer = peer;
  e.device = device;
  e.c = c;
  e.threads = p->threads;
  e.workers.resize((size_t)p->threads);
  int started = 0, barriers = 0;
  bool streams_ok = true;
  for (int i = 0; i < p->threads; i++) {
    Worker *w = &e.workers[i];
    w->e = &e;
    w->index = i;
    generate_sequence(w, c, p);
    cudaError_t cerr = cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking);
    if (cerr != cudaSuccess) {
      snprintf(err, len, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(cerr));
      streams_ok = false;
      break;
    }
    w->own_stream = true;
  }
  pthread_mutex_init(&e.start_lock, nullptr);
  pthread_cond_init(&e.start_cond, nullptr);
  if (streams_ok) {
    if (pthread_barrier_init(&e.outer, nullptr, (unsigned)p->threads + 1) == 0) barriers++;
    if (barriers == 1 && pthread_barrier_init(&e.inner, nullptr, (unsigned)p->threads) == 0)
      barriers++;
    if (barriers < 2) snprintf(err, len, "pthread_barrier_init failed");
  }
  if (barriers == 2) {
    for (; started < p->threads; started++) {
      if (pthread_create(&e.workers[started].thread, nullptr, worker_main, &e.workers[started]) != 0) {
        snprintf(err, len, "cannot start thread %d of %d", started + 1, p->threads);
        break;
      }
    }
    pthread_mutex_lock(&e.start_lock);
    e.start_state = started == p->threads ? 1 : -1;
    pthread_cond_broadcast(&e.start_cond);
    pthread_mutex_unlock(&e.start_lock);
  }
  if (barriers == 2 && started == p->threads) {
    uint64_t wall;
    size_t done, ops = p->ops;
    uint64_t limit = (uint64_t)(p->budget_s * 1e9);
    bool ok = engine_run(&e, ops, limit, &wall, &done, err, len);
    if (ok && limit != 0 && done < ops) { /* slow or still growing: warm up again */
      ok = engine_run(&e, ops, limit, &wall, &done, err, len);
      if (ok && done < ops) ops = done < 2 ? 2 : done & ~(size_t)1;
    }
    out->ops = ops;
    for (int run = 0; ok && run < p->repeat; run++) {
      ok = engine_run(&e, ops, 0, &wall, &done, err, len);
      if (ok) out->ns[out->runs++] = (double)wall / (double)ops;
    }
    if (ok) {
      double sorted[kMaxRepeat];
      std::copy(out->ns, out->ns + out->runs, sorted);
      std::sort(sorted, sorted + out->runs);
      int n = out->runs;
      out->median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
      out->min = sorted[0];
      out->max = sorted[n - 1];
      out->ops_per_s = (double)p->threads * 1e9 / out->median;
      out->ok = true;
      out->error[0] = '\0';
    }
    e.quit = true;
    pthread_barrier_wait(&e.outer);
  }
  for (int i = 0; i < started; i++) pthread_join(e.workers[i].thread, nullptr);
  if (barriers > 1) pthread_barrier_destroy(&e.inner);
  if (barriers > 0) pthread_barrier_destroy(&e.outer);
  pthread_cond_destroy(&e.start_cond);
  pthread_mutex_destroy(&e.start_lock);
  /* What a failed run left live goes back; then the cache, before the
   * streams it is keyed by go (rmmc-bench releases the stack here). */
  for (auto &w : e.workers) {
    char msg[512];
    for (auto &s : w.slots)
      if (s.ptr != nullptr) (void)peer->deallocate(s.ptr, s.bytes, w.stream, msg, sizeof msg);
  }
  std::string why;
  if (!peer->release_cached(&why) && out->ok) {
    out->ok = false;
    snprintf(err, len, "releasing the cache after the row: %s", why.c_str());
  }
  for (auto &w : e.workers)
    if (w.own_stream) (void)cudaStreamDestroy(w.stream);
}

/* ---- replay: tools/replay_log.c ---- */

enum { ALLOCATE = 0, FREE = 1 };

struct Event {
  uint64_t size;
  uint32_t slot;
  uint32_t stream;
  uint16_t thread;
  uint8_t action;
};

struct Log {
  std::string name;
  std::vector<Event> events;
  uint32_t nslots = 0;
  std::vector<uint64_t> thread_ids, stream_ids;
  uint64_t allocations = 0, frees = 0, logged_failures = 0, null_events = 0;
  uint64_t peak_live = 0;
  size_t peak_event = 0;
  uint64_t live_at_end = 0, outstanding_at_end = 0;
  uint64_t lines = 0;
  bool has_time = false;
  int64_t first_time_us = 0, last_time_us = 0;
};

constexpr int kMaxLogThreads = 1024; /* REPLAY_MAX_THREADS */

struct Field {
  const char *p;
  size_t len;
};

bool field_is(Field f, const char *word) {
  size_t n = strlen(word);
  return f.len == n && strncasecmp(f.p, word, n) == 0;
}

bool parse_dec(Field f, uint64_t *out) {
  if (f.len == 0 || f.len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < f.len; i++) {
    unsigned d = (unsigned)(f.p[i] - '0');
    if (d > 9 || v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool parse_hex(Field f, uint64_t *out) {
  if (field_is(f, "(nil)")) {
    *out = 0;
    return true;
  }
  if (f.len > 2 && f.p[0] == '0' && (f.p[1] == 'x' || f.p[1] == 'X')) f.p += 2, f.len -= 2;
  if (f.len == 0 || f.len > 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < f.len; i++) {
    int c = (unsigned char)f.p[i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

bool parse_fraction_us(Field f, int64_t *out) {
  if (f.len == 0 || f.len > 9) return false;
  int64_t v = 0;
  for (size_t i = 0; i < 6; i++) {
    if (i < f.len) {
      unsigned d = (unsigned)(f.p[i] - '0');
      if (d > 9) return false;
      v = v * 10 + d;
    } else {
      v *= 10;
    }
  }
  for (size_t i = 6; i < f.len; i++)
    if ((unsigned)(f.p[i] - '0') > 9) return false;
  *out = v;
  return true;
}

bool parse_time(Field f, int64_t *out) {
  uint64_t v;
  if (parse_dec(f, &v)) {
    if (v > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)v;
    return true;
  }
  const char *colon = (const char *)memchr(f.p, ':', f.len);
  if (colon == nullptr) {
    const char *dot = (const char *)memchr(f.p, '.', f.len);
    int64_t frac;
    if (dot == nullptr || !parse_dec(Field{f.p, (size_t)(dot - f.p)}, &v) ||
        v > (uint64_t)INT64_MAX / 1000000 - 1 ||
        !parse_fraction_us(Field{dot + 1, f.len - (size_t)(dot + 1 - f.p)}, &frac))
      return false;
    *out = (int64_t)v * 1000000 + frac;
    return true;
  }
  uint64_t part[3];
  const char *p = f.p, *end = f.p + f.len;
  for (int k = 0; k < 3; k++) {
    const char *q = p;
    while (q < end && isdigit((unsigned char)*q)) q++;
    if (q == p || q - p > 2 || !parse_dec(Field{p, (size_t)(q - p)}, &part[k])) return false;
    p = q;
    if (k < 2) {
      if (p == end || *p != ':') return false;
      p++;
    }
  }
  if (part[0] > 23 || part[1] > 59 || part[2] > 60) return false;
  int64_t frac = 0;
  if (p < end) {
    if (*p != '.' && *p != ':') return false;
    if (!parse_fraction_us(Field{p + 1, (size_t)(end - p - 1)}, &frac)) return false;
  }
  *out = (int64_t)((part[0] * 60 + part[1]) * 60 + part[2]) * 1000000 + frac;
  return true;
}

enum { COL_THREAD, COL_TIME, COL_ACTION, COL_POINTER, COL_SIZE, COL_STREAM, NCOLS };
const char *const column_names[NCOLS] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
const bool column_required[NCOLS] = {false, false, true, true, true, false};
constexpr int kMaxFields = 32;

int split(const char *s, size_t len, Field *fields, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && s[i] != ',') continue;
    if (n == max) return max + 1;
    size_t a = start, b = i;
    while (a < b && isspace((unsigned char)s[a])) a++;
    while (b > a && isspace((unsigned char)s[b - 1])) b--;
    fields[n++] = Field{s + a, b - a};
    start = i + 1;
  }
  return n;
}

struct Parser {
  Log *log;
  int col[NCOLS];
  int nfields = 0;
  bool have_header = false;
  uint64_t line = 0;
  std::unordered_map<uint64_t, uint32_t> pointers, threads, streams;
  std::vector<uint64_t> slot_size;
  uint64_t live = 0;
  std::string error;
};

bool bad_line(Parser *p, const char *what_kind, const char *s, size_t len, const std::string &what) {
  char buf[512];
  int shown = len > 120 ? 120 : (int)len;
  snprintf(buf, sizeof buf, "%s:%llu: %s: %s\n  %.*s%s", p->log->name.c_str(),
           (unsigned long long)p->line, what_kind, what.c_str(), shown, s, len > 120 ? "..." : "");
  p->error = buf;
  return false;
}

std::string quote(Field f) { return std::string(f.p, f.len); }

bool parse_header(Parser *p, const char *s, size_t len) {
  Field f[kMaxFields];
  int n = split(s, len, f, kMaxFields);
  char buf[512];
  if (n > kMaxFields) {
    snprintf(buf, sizeof buf, "%s:%llu: header has more than %d columns", p->log->name.c_str(),
             (unsigned long long)p->line, kMaxFields);
    p->error = buf;
    return false;
  }
  for (int c = 0; c < NCOLS; c++) p->col[c] = -1;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < NCOLS; c++)
      if (field_is(f[i], column_names[c])) {
        if (p->col[c] != -1) {
          snprintf(buf, sizeof buf, "%s:%llu: header names column '%s' twice",
                   p->log->name.c_str(), (unsigned long long)p->line, column_names[c]);
          p->error = buf;
          return false;
        }
        p->col[c] = i;
      }
  for (int c = 0; c < NCOLS; c++)
    if (column_required[c] && p->col[c] == -1) {
      snprintf(buf, sizeof buf,
               "%s:%llu: missing columns: the header has no '%s' column (an RMM log starts with "
               "Thread,Time,Action,Pointer,Size,Stream)",
               p->log->name.c_str(), (unsigned long long)p->line, column_names[c]);
      p->error = buf;
      return false;
    }
  p->nfields = n;
  p->have_header = true;
  return true;
}

uint32_t intern(std::unordered_map<uint64_t, uint32_t> *m, std::vector<uint64_t> *ids, uint64_t id) {
  auto it = m->find(id);
  if (it != m->end()) return it->second;
  uint32_t v = (uint32_t)ids->size();
  m->emplace(id, v);
  ids->push_back(id);
  return v;
}

bool parse_line(Parser *p, const char *s, size_t len) {
  Log *log = p->log;
  Field f[kMaxFields];
  int n = split(s, len, f, kMaxFields);
  if (n < p->nfields)
    return bad_line(p, "missing columns", s, len,
                    std::to_string(n) + " fields, the header has " + std::to_string(p->nfields));
  if (n > p->nfields)
    return bad_line(p, "malformed line", s, len,
                    std::string(n > kMaxFields ? "too many" : "more") + " fields, the header has " +
                        std::to_string(p->nfields));
  Field action = f[p->col[COL_ACTION]];
  int act;
  if (field_is(action, "allocate")) act = 0;
  else if (field_is(action, "free") || field_is(action, "deallocate")) act = 1;
  else if (field_is(action, "allocate failure")) act = 2;
  else
    return bad_line(p, "malformed line", s, len,
                    "unknown action '" + quote(action) + "' (allocate, free or allocate failure)");
  uint64_t ptr, size, thread = 0, stream = 0;
  int64_t t = 0;
  Field fp = f[p->col[COL_POINTER]], fs = f[p->col[COL_SIZE]];
  if (!parse_hex(fp, &ptr)) return bad_line(p, "malformed line", s, len, "pointer '" + quote(fp) + "' is not hex");
  if (!parse_dec(fs, &size))
    return bad_line(p, "bad size", s, len, "size '" + quote(fs) + "' is not a byte count");
  if (p->col[COL_THREAD] >= 0) {
    Field ft = f[p->col[COL_THREAD]];
    if (!parse_dec(ft, &thread) &&
        !(ft.len > 2 && ft.p[0] == '0' && (ft.p[1] == 'x' || ft.p[1] == 'X') && parse_hex(ft, &thread)))
      return bad_line(p, "malformed line", s, len, "thread '" + quote(ft) + "' is not a number");
  }
  if (p->col[COL_STREAM] >= 0) {
    Field fst = f[p->col[COL_STREAM]];
    if (!parse_hex(fst, &stream))
      return bad_line(p, "malformed line", s, len, "stream '" + quote(fst) + "' is not hex");
  }
  if (p->col[COL_TIME] >= 0) {
    Field ftm = f[p->col[COL_TIME]];
    if (!parse_time(ftm, &t))
      return bad_line(p, "malformed line", s, len,
                      "time '" + quote(ftm) + "' is neither microseconds nor HH:MM:SS.ffffff");
  }
  if (act == 2) {
    log->logged_failures++;
  } else if (ptr == 0) {
    if (act == 0 && size != 0)
      return bad_line(p, "malformed line", s, len,
                      "allocation of " + std::to_string(size) +
                          " bytes returned a null pointer (log it as 'allocate failure')");
    log->null_events++;
  } else {
    auto it = p->pointers.find(ptr);
    uint32_t slot;
    if (act == 0) {
      if (it != p->pointers.end())
        return bad_line(p, "allocation of a pointer that is already live", s, len,
                        "the pointer is still live (allocated with " +
                            std::to_string(p->slot_size[it->second]) + " bytes, not yet freed)");
      if (log->nslots == UINT32_MAX - 1) {
        p->error = log->name + ": more than 2^32-2 allocations";
        return false;
      }
      slot = log->nslots++;
      p->slot_size.push_back(size);
      p->pointers.emplace(ptr, slot);
    } else {
      if (it == p->pointers.end())
        return bad_line(p, "free of an unknown pointer", s, len,
                        "the pointer was not allocated earlier in the log, or was freed already");
      slot = it->second;
      if (p->slot_size[slot] != size)
        return bad_line(p, "free with another size than its allocation", s, len,
                        "allocated with " + std::to_string(p->slot_size[slot]) +
                            " bytes, freed with " + std::to_string(size));
      p->pointers.erase(it);
    }
    uint32_t ti = intern(&p->threads, &log->thread_ids, thread);
    uint32_t si = intern(&p->streams, &log->stream_ids, stream);
    if (log->thread_ids.size() > (size_t)kMaxLogThreads) {
      p->error = log->name + ":" + std::to_string(p->line) + ": more than " +
                 std::to_string(kMaxLogThreads) + " threads";
      return false;
    }
    log->events.push_back(Event{size, slot, si, (uint16_t)ti, (uint8_t)act});
    if (act == ALLOCATE) {
      log->allocations++;
      p->live += size;
      if (p->live > log->peak_live) {
        log->peak_live = p->live;
        log->peak_event = log->events.size() - 1;
      }
    } else {
      log->frees++;
      p->live -= size;
    }
  }
  if (p->col[COL_TIME] >= 0) {
    if (!log->has_time) log->first_time_us = t;
    log->has_time = true;
    log->last_time_us = t;
  }
  return true;
}

bool handle_line(Parser *p, const char *s, size_t len) {
  p->line++;
  p->log->lines = p->line;
  if (len > 0 && s[len - 1] == '\r') len--;
  size_t i = 0;
  while (i < len && isspace((unsigned char)s[i])) i++;
  if (i == len) return true;
  if (!p->have_header) return parse_header(p, s, len);
  return parse_line(p, s, len);
}

/* Reads a plain or gzip log (by content; gzip through `gzip -dc`). */
bool read_log(const char *path, Log *log, std::string *err) {
  log->name = path;
  FILE *f = fopen(path, "rb");
  if (f == nullptr) {
    *err = std::string(path) + ": cannot open: " + strerror(errno);
    return false;
  }
  unsigned char magic[2] = {0, 0};
  size_t got = fread(magic, 1, 2, f);
  rewind(f);
  bool piped = false;
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    fclose(f);
    std::string cmd = "gzip -dc -- '";
    for (const char *c = path; *c; c++) {
      if (*c == '\'') cmd += "'\\''";
      else cmd += *c;
    }
    cmd += "'";
    f = popen(cmd.c_str(), "r");
    if (f == nullptr) {
      *err = std::string(path) + ": cannot run '" + cmd + "': " + strerror(errno);
      return false;
    }
    piped = true;
  }
  Parser p;
  p.log = log;
  char *line = nullptr;
  size_t cap = 0;
  ssize_t n;
  bool ok = true;
  while (ok && (n = getline(&line, &cap, f)) >= 0) {
    size_t len = (size_t)n;
    if (len > 0 && line[len - 1] == '\n') len--;
    ok = handle_line(&p, line, len);
  }
  free(line);
  bool read_error = ferror(f) != 0;
  int rc = piped ? pclose(f) : fclose(f);
  if (!ok) {
    *err = p.error;
    if (piped && rc != 0) *err += " ('gzip -dc' failed too: not a complete gzip file?)";
    return false;
  }
  if (read_error || (piped && rc != 0)) {
    *err = std::string(path) + (piped ? ": 'gzip -dc' failed: not a complete gzip file?" : ": read error");
    return false;
  }
  if (!p.have_header) {
    *err = std::string(path) + ": empty log: expected a header line such as Thread,Time,Action,Pointer,Size,Stream";
    return false;
  }
  log->live_at_end = p.live;
  log->outstanding_at_end = p.pointers.size();
  return true;
}

/* ---- replay: tools/replay_engine.c ---- */

struct ReplayResult {
  std::string error; /* empty: replayed */
  bool warm = false;
  uint32_t threads = 1;
  uint64_t events = 0, calls = 0, failures = 0, free_errors = 0, skipped_frees = 0;
  uint64_t reserved_at_start = 0;
  uint64_t peak_reserved = 0;      /* over every epoch of this replay */
  uint64_t end_reserved = 0;       /* after the last event, before the leftovers are freed */
  uint64_t timed_peak_reserved = 0; /* the timed epoch's own peak */
  uint64_t timed_start_reserved = 0;
  uint64_t total_ns = 0;
  double ns_per_call = 0, ns_per_call_min = 0;
  unsigned repeats = 1;
  bool has_upstream = false;
  uint64_t upstream_calls = 0; /* during the timed epoch */
  counters_t counters;         /* deltas during the timed epoch */
  std::string first_failure;
};

struct Run;

struct RWorker {
  Run *run = nullptr;
  uint16_t index = 0;
  std::vector<size_t> events;
  pthread_t tid{};
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool sleeping = false;
  uint64_t ns = 0, calls = 0, failures = 0, free_errors = 0, skipped_frees = 0;
  char first_failure[512] = {};
  size_t first_failure_event = 0;
};

struct Run {
  const Log *log = nullptr;
  Peer *peer = nullptr;
  int device = 0;
  std::vector<cudaStream_t> streams;
  std::vector<void *> slots;
  std::atomic<size_t> turn{0};
  std::atomic<bool> aborted{false};
  std::vector<RWorker> workers;
};

constexpr size_t kNoTurn = SIZE_MAX;
constexpr int kSpins = 4000;

uint64_t timer_overhead() {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 2000; i++) {
    uint64_t a = now_ns(), b = now_ns();
    best = std::min(best, b - a);
  }
  return best;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void run_event(Run *run, RWorker *w, size_t i) {
  const Event *e = &run->log->events[i];
  cudaStream_t stream = run->streams[e->stream];
  char msg[512];
  if (e->action == ALLOCATE) {
    void *p = nullptr;
    uint64_t t0 = now_ns();
    bool ok = run->peer->allocate(e->size, stream, &p, msg, sizeof msg);
    w->ns += now_ns() - t0;
    w->calls++;
    if (!ok) {
      if (w->failures++ == 0) {
        snprintf(w->first_failure, sizeof w->first_failure, "%s", msg);
        w->first_failure_event = i;
      }
      p = nullptr;
    }
    run->slots[e->slot] = p;
  } else {
    void *p = run->slots[e->slot];
    if (p != nullptr) {
      uint64_t t0 = now_ns();
      bool ok = run->peer->deallocate(p, e->size, stream, msg, sizeof msg);
      w->ns += now_ns() - t0;
      w->calls++;
      if (!ok) w->free_errors++;
      run->slots[e->slot] = nullptr;
    } else if (e->size != 0) {
      w->skipped_frees++;
    }
  }
}

bool wait_turn(Run *run, RWorker *w, size_t i) {
  for (int k = 0; k < kSpins; k++) {
    if (run->turn.load(std::memory_order_acquire) == i) return true;
    cpu_relax();
  }
  pthread_mutex_lock(&w->mu);
  w->sleeping = true;
  while (run->turn.load(std::memory_order_acquire) != i && !run->aborted.load(std::memory_order_acquire))
    pthread_cond_wait(&w->cv, &w->mu);
  w->sleeping = false;
  pthread_mutex_unlock(&w->mu);
  return run->turn.load(std::memory_order_acquire) == i;
}

void pass_turn(Run *run, size_t next) {
  RWorker *o = &run->workers[run->log->events[next].thread];
  run->turn.store(next, std::memory_order_seq_cst);
  pthread_mutex_lock(&o->mu);
  if (o->sleeping) pthread_cond_signal(&o->cv);
  pthread_mutex_unlock(&o->mu);
}

void *rworker_main(void *arg) {
  RWorker *w = static_cast<RWorker *>(arg);
  Run *run = w->run;
  const std::vector<Event> &ev = run->log->events;
  size_t n = ev.size();
  if (cudaSetDevice(run->device) != cudaSuccess) (void)cudaGetLastError();
  for (size_t i : w->events) {
    if ((i == 0 || ev[i - 1].thread != w->index) && !wait_turn(run, w, i)) return nullptr;
    run_event(run, w, i);
    if (i + 1 < n && ev[i + 1].thread != w->index) pass_turn(run, i + 1);
  }
  return nullptr;
}

bool run_threads(Run *run, std::string *err) {
  for (auto &w : run->workers) w.events.clear();
  for (size_t i = 0; i < run->log->events.size(); i++)
    run->workers[run->log->events[i].thread].events.push_back(i);
  run->turn.store(kNoTurn);
  run->aborted.store(false);
  size_t started = 0;
  for (; started < run->workers.size(); started++) {
    if (pthread_create(&run->workers[started].tid, nullptr, rworker_main, &run->workers[started]) != 0) {
      *err = "cannot start replay thread " + std::to_string(started + 1);
      run->aborted.store(true, std::memory_order_seq_cst);
      for (size_t t = 0; t < started; t++) {
        pthread_mutex_lock(&run->workers[t].mu);
        pthread_cond_broadcast(&run->workers[t].cv);
        pthread_mutex_unlock(&run->workers[t].mu);
      }
      break;
    }
  }
  if (err->empty() && !run->log->events.empty()) pass_turn(run, 0);
  for (size_t t = 0; t < started; t++) pthread_join(run->workers[t].tid, nullptr);
  return err->empty();
}

bool map_streams(Run *run, std::string *err) {
  for (uint64_t id : run->log->stream_ids) {
    cudaStream_t s = nullptr;
    if (id == 0) s = nullptr;
    else if (id == (uint64_t)(uintptr_t)cudaStreamLegacy) s = cudaStreamLegacy;
    else if (id == (uint64_t)(uintptr_t)cudaStreamPerThread) s = cudaStreamPerThread;
    else {
      cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        *err = cuda_message("cudaStreamCreateWithFlags", e);
        return false;
      }
    }
    run->streams.push_back(s);
  }
  return true;
}

bool is_created_stream(cudaStream_t s) {
  return s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread;
}

void free_leftovers(Run *run, ReplayResult *res) {
  char msg[512];
  for (const Event &e : run->log->events) {
    if (e.action != ALLOCATE || run->slots[e.slot] == nullptr) continue;
    if (!run->peer->deallocate(run->slots[e.slot], e.size, run->streams[e.stream], msg, sizeof msg))
      res->free_errors++;
    run->slots[e.slot] = nullptr;
  }
}

counters_t delta(const counters_t &after, const counters_t &before) {
  counters_t d = after;
  for (size_t i = 0; i < d.size() && i < before.size(); i++) d[i].second -= before[i].second;
  return d;
}

/* One replay on a fresh allocator (its cache emptied first). */
bool replay_once(const Log *log, Peer *peer, int device, bool warm, bool threaded,
                 ReplayResult *res) {
  *res = ReplayResult();
  res->warm = warm;
  res->events = log->events.size();
  Run run;
  run.log = log;
  run.peer = peer;
  run.device = device;
  run.slots.assign(log->nslots ? log->nslots : 1, nullptr);
  bool use_threads = threaded && log->thread_ids.size() > 1;
  size_t nworkers = use_threads ? log->thread_ids.size() : 1;
  res->threads = (uint32_t)nworkers;
  run.workers.resize(nworkers);
  for (size_t t = 0; t < nworkers; t++) {
    run.workers[t].run = &run;
    run.workers[t].index = (uint16_t)t;
    pthread_mutex_init(&run.workers[t].mu, nullptr);
    pthread_cond_init(&run.workers[t].cv, nullptr);
  }
  std::string err;
  bool ok = peer->release_cached(&err);
  if (ok) ok = map_streams(&run, &err);
  uint64_t overhead = timer_overhead();
  uint64_t up0 = 0, earlier_peak = 0;
  counters_t c0;
  if (ok) {
    res->reserved_at_start = peer->reserved_current();
    peer->reset_peak();
    res->has_upstream = peer->upstream_calls(&up0);
    peer->counters(&c0);
  }
  for (int pass = warm ? 0 : 1; ok && pass < 2; pass++) {
    if (pass == 1 && warm) {
      free_leftovers(&run, res);
      for (auto &w : run.workers) {
        w.ns = w.calls = w.failures = w.free_errors = w.skipped_frees = 0;
        w.first_failure[0] = '\0';
      }
      res->free_errors = 0;
      earlier_peak = peer->reserved_peak();
      peer->reset_peak();
      res->timed_start_reserved = peer->reserved_current();
      res->has_upstream = peer->upstream_calls(&up0);
      peer->counters(&c0);
    } else if (pass == 1) {
      res->timed_start_reserved = res->reserved_at_start;
    }
    if (use_threads) ok = run_threads(&run, &err);
    else
      for (size_t i = 0; i < log->events.size(); i++) run_event(&run, &run.workers[0], i);
  }
  if (ok) {
    res->end_reserved = peer->reserved_current();
    res->timed_peak_reserved = peer->reserved_peak();
    res->peak_reserved = std::max(earlier_peak, res->timed_peak_reserved);
    uint64_t up1 = 0;
    if (res->has_upstream && peer->upstream_calls(&up1)) res->upstream_calls = up1 - up0;
    counters_t c1;
    peer->counters(&c1);
    res->counters = delta(c1, c0);
    free_leftovers(&run, res);
    size_t first_event = SIZE_MAX;
    for (auto &w : run.workers) {
      res->calls += w.calls;
      res->failures += w.failures;
      res->free_errors += w.free_errors;
      res->skipped_frees += w.skipped_frees;
      res->total_ns += w.ns;
      if (w.failures > 0 && w.first_failure_event < first_event) {
        first_event = w.first_failure_event;
        res->first_failure = "event " + std::to_string(first_event) + ": " + w.first_failure;
      }
    }
    uint64_t cost = overhead * res->calls;
    res->total_ns = res->total_ns > cost ? res->total_ns - cost : 0;
    res->ns_per_call = res->calls ? (double)res->total_ns / (double)res->calls : 0.0;
    res->ns_per_call_min = res->ns_per_call;
  }
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess && ok) {
    ok = false;
    err = cuda_message("cudaDeviceSynchronize after the replay", e);
  }
  std::string why;
  if (!peer->release_cached(&why) && ok) {
    ok = false;
    err = "releasing the cache after the replay: " + why;
  }
  for (cudaStream_t s : run.streams)
    if (is_created_stream(s)) (void)cudaStreamDestroy(s);
  for (auto &w : run.workers) {
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
  }
  if (!ok) res->error = err.empty() ? "replay failed" : err;
  return ok;
}

/* --repeat: more replays, each on a fresh allocator; the time figures
 * become medians (memory figures: the first replay), as rmmc-replay. */
bool replay(const Log *log, Peer *peer, int device, bool warm, bool threaded, unsigned repeat,
            ReplayResult *res) {
  if (!replay_once(log, peer, device, warm, threaded, res)) return false;
  std::vector<double> all{res->ns_per_call};
  for (unsigned k = 1; k < repeat; k++) {
    ReplayResult r;
    if (!replay_once(log, peer, device, warm, threaded, &r)) {
      res->error = "repeated replay " + std::to_string(k + 1) + " failed: " + r.error;
      return false;
    }
    all.push_back(r.ns_per_call);
  }
  std::sort(all.begin(), all.end());
  res->ns_per_call = all[repeat / 2];
  res->ns_per_call_min = all[0];
  res->repeats = repeat;
  return true;
}

/* ---- the command line ---- */

struct RunInfo {
  std::string device = "none";
  int device_id = -1;
  std::string cpu;
};

bool parse_threads(const char *text, std::vector<int> *out) {
  std::string s(text);
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string tok = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    unsigned long long t;
    if (!parse_count("--threads", tok.c_str(), 1, kMaxThreads, &t)) return false;
    if (std::find(out->begin(), out->end(), (int)t) == out->end()) out->push_back((int)t);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

/* pair:SIZE or random:MIN-MAX:LIVE. */
bool parse_case(const char *text, std::vector<BenchCase> *out) {
  std::string s(text);
  BenchCase c{};
  if (s.compare(0, 5, "pair:") == 0) {
    if (!parse_bytes(s.substr(5).c_str(), &c.min_bytes) || c.min_bytes == 0) goto bad;
    c.pattern = PAIR;
    c.max_bytes = c.min_bytes;
    c.live = 0;
    c.label = "pair " + format_size(c.min_bytes);
  } else if (s.compare(0, 7, "random:") == 0) {
    size_t dash = s.find('-', 7), colon = s.find(':', 7);
    if (dash == std::string::npos || colon == std::string::npos || colon < dash) goto bad;
    unsigned long long live;
    if (!parse_bytes(s.substr(7, dash - 7).c_str(), &c.min_bytes) ||
        !parse_bytes(s.substr(dash + 1, colon - dash - 1).c_str(), &c.max_bytes) ||
        c.min_bytes == 0 || c.max_bytes < c.min_bytes)
      goto bad;
    if (!parse_count("--case live", s.substr(colon + 1).c_str(), 1, 10000000, &live)) return false;
    c.pattern = RANDOM;
    c.live = (size_t)live;
    c.label = "random " + format_size(c.min_bytes) + "-" + format_size(c.max_bytes) + " live " +
              std::to_string(c.live);
  } else {
    goto bad;
  }
  out->push_back(c);
  return true;
bad:
  usage_error("--case '%s': want pair:SIZE or random:MIN-MAX:LIVE (sizes as 256, 1MiB), with "
              "0 < MIN <= MAX",
              text);
  return false;
}

const char usage_text[] =
    "Usage: peers bench  --allocator NAME [options]\n"
    "       peers replay --allocator NAME [options] LOG...\n"
    "rmmc-bench's and rmmc-replay's measurements, on the same sequences and logs,\n"
    "for the allocators rmmc is compared with (one per process):\n"
    "  cca                 PyTorch's CUDA caching allocator (raw_alloc_with_stream)\n"
    "  cca_expandable      the same with expandable segments; the process must run\n"
    "                      with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
    "  cuda_async          cudaMallocAsync on the device's default pool, release\n"
    "                      threshold UINT64_MAX\n"
    "  cuda_async_default  the same pool, release threshold left as it is (what\n"
    "                      rmmc-bench's cuda_async(default_pool=true) calls)\n"
    "  cudaMalloc          cudaMalloc/cudaFree\n"
    "\n"
    "Common options\n"
    "  --allocator NAME  one of the above (required)\n"
    "  --device N        the GPU (default 0)\n"
    "  --json FILE       write the records as a JSON array\n"
    "  --quiet           no progress lines on stderr\n"
    "\n"
    "bench (rmmc-bench's engine: seeded splitmix64 sequences, thread i seeded with\n"
    "seed + i, one non-blocking stream per thread, untimed fill and drain, the timed\n"
    "calls plus a sync of the thread's stream; ns/call = wall * threads / calls,\n"
    "median of the runs; one untimed warm-up run)\n"
    "  --case SPEC       pair:SIZE or random:MIN-MAX:LIVE, repeatable. Default:\n"
    "                    pair:256 pair:1MiB random:256-4MiB:1000 random:256-1MiB:200\n"
    "  --threads LIST    thread counts (default 1,4,16)\n"
    "  --ops N           calls per thread per timed run (default 100000)\n"
    "  --repeat N        timed runs (default 5)\n"
    "  --seed N          sequence seed (default 1)\n"
    "  --budget SEC      time budget of a run (default 0.25; 0: none), as rmmc-bench\n"
    "\n"
    "replay (rmmc-replay's engine: one thread per logged thread in log order,\n"
    "logged streams mapped to real streams, every call timed)\n"
    "  --epochs LIST     cold, warm or both (default cold,warm): cold replays the log\n"
    "                    once on an emptied allocator; warm replays it once untimed,\n"
    "                    then times a second epoch (peak reserved covers both; the\n"
    "                    warm epoch's own peak is reported too)\n"
    "  --repeat N        replays per epoch kind, each on an emptied allocator: time\n"
    "                    figures are medians, memory figures the first's (default 1)\n"
    "  --single-thread   replay every event on one thread\n"
    "\n"
    "Exit status: 0 all passed; 1 a measurement failed (replay: a replay could not\n"
    "run; refused allocations are results, counted in the table, as rmmc-replay);\n"
    "2 bad usage or a bad log; 3 the JSON could not be written; 77 no CUDA device.\n";

struct Options {
  std::string mode, allocator;
  int device = 0;
  const char *json = nullptr;
  bool quiet = false;
  std::vector<BenchCase> cases;
  std::vector<int> threads;
  size_t ops = 100000;
  int repeat = -1;
  uint64_t seed = 1;
  double budget_s = 0.25;
  bool cold = false, warm = false, single = false;
  std::vector<const char *> logs;
};

int parse_options(int argc, char **argv, Options *o) {
  if (argc < 2) return usage_error("no mode: bench or replay");
  std::string mode = argv[1];
  if (mode == "-h" || mode == "--help") {
    fputs(usage_text, stdout);
    return 0;
  }
  if (mode != "bench" && mode != "replay") return usage_error("unknown mode '%s' (bench or replay)", argv[1]);
  o->mode = mode;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&](const char **v) {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    const char *v = nullptr;
    unsigned long long n;
    if (a == "-h" || a == "--help") {
      fputs(usage_text, stdout);
      return 0;
    } else if (a == "--quiet") {
      o->quiet = true;
    } else if (a == "--single-thread") {
      o->single = true;
    } else if (a.compare(0, 2, "--") != 0) {
      if (mode != "replay") return usage_error("unexpected argument '%s'", a.c_str());
      o->logs.push_back(argv[i]);
    } else if (!value(&v)) {
      return usage_error("%s needs a value (or is not an option)", a.c_str());
    } else if (a == "--allocator") {
      o->allocator = v;
    } else if (a == "--device") {
      if (!parse_count("--device", v, 0, 1023, &n)) return kExitUsage;
      o->device = (int)n;
    } else if (a == "--json") {
      o->json = v;
    } else if (a == "--case" && mode == "bench") {
      if (!parse_case(v, &o->cases)) return kExitUsage;
    } else if (a == "--threads" && mode == "bench") {
      if (!parse_threads(v, &o->threads)) return kExitUsage;
    } else if (a == "--ops" && mode == "bench") {
      if (!parse_count("--ops", v, 1, kMaxOps, &n)) return kExitUsage;
      o->ops = (size_t)(n + (n & 1));
    } else if (a == "--repeat") {
      if (!parse_count("--repeat", v, 1, kMaxRepeat, &n)) return kExitUsage;
      o->repeat = (int)n;
    } else if (a == "--seed" && mode == "bench") {
      if (!parse_count("--seed", v, 0, UINT64_MAX, &n)) return kExitUsage;
      o->seed = n;
    } else if (a == "--budget" && mode == "bench") {
      char *end;
      o->budget_s = strtod(v, &end);
      if (end == v || *end != '\0' || !(o->budget_s >= 0 && o->budget_s <= 3600))
        return usage_error("--budget wants seconds from 0 to 3600, not '%s'", v);
    } else if (a == "--epochs" && mode == "replay") {
      std::string s(v);
      size_t start = 0;
      for (;;) {
        size_t comma = s.find(',', start);
        std::string tok = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (tok == "cold") o->cold = true;
        else if (tok == "warm") o->warm = true;
        else return usage_error("--epochs: '%s' is neither cold nor warm", tok.c_str());
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      return usage_error("unknown option '%s' for %s", a.c_str(), mode.c_str());
    }
  }
  if (o->allocator.empty()) return usage_error("--allocator is required");
  bool known = false;
  for (const char *name : kAllocators) known |= o->allocator == name;
  if (!known)
    return usage_error("--allocator '%s' is not one of cca, cca_expandable, cuda_async, "
                       "cuda_async_default, cudaMalloc",
                       o->allocator.c_str());
#ifdef PEERS_NO_TORCH
  if (o->allocator == "cca" || o->allocator == "cca_expandable")
    return usage_error("this build has no PyTorch (built with -DPEERS_NO_TORCH): '%s' is not "
                       "available",
                       o->allocator.c_str());
#endif
  if (mode == "bench") {
    if (o->cases.empty()) {
      parse_case("pair:256", &o->cases);
      parse_case("pair:1MiB", &o->cases);
      parse_case("random:256-4MiB:1000", &o->cases);
      parse_case("random:256-1MiB:200", &o->cases);
    }
    if (o->threads.empty()) o->threads = {1, 4, 16};
    if (o->repeat < 0) o->repeat = 5;
  } else {
    if (o->logs.empty()) return usage_error("replay: no log given");
    if (!o->cold && !o->warm) o->cold = o->warm = true;
    if (o->repeat < 0) o->repeat = 1;
  }
  return -1;
}

/* Device check and name; 0 or an exit status. */
int open_device(const Options &o, RunInfo *info) {
  info->cpu = cpu_name();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    fprintf(stderr, "%s: no CUDA device (%s): nothing to measure\n", program,
            e != cudaSuccess ? cuda_message("cudaGetDeviceCount", e).c_str() : "0 devices");
    return kExitNoGpu;
  }
  if (o.device >= count) {
    fprintf(stderr, "%s: --device %d: this machine has %d CUDA device%s\n", program, o.device,
            count, count == 1 ? "" : "s");
    return kExitUsage;
  }
  e = cudaSetDevice(o.device);
  struct cudaDeviceProp prop;
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, o.device);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", program, cuda_message("cudaSetDevice/cudaGetDeviceProperties", e).c_str());
    return kExitFailed;
  }
  info->device = prop.name;
  info->device_id = o.device;
  return 0;
}

struct BenchRow {
  const BenchCase *c;
  int threads;
  BenchResult res;
  bool has_scaling = false;
  double scaling = 0;
};

void bench_json(FILE *f, const Options &o, const RunInfo &info, const Peer &peer,
                const std::vector<BenchRow> &rows) {
  fputs("[\n", f);
  for (size_t i = 0; i < rows.size(); i++) {
    const BenchRow &r = rows[i];
    const BenchResult &res = r.res;
    fputs("  {\"stack\": ", f);
    json_string(f, peer.name());
    fputs(", \"allocator\": ", f);
    json_string(f, peer.name());
    fputs(", \"allocator_detail\": ", f);
    json_string(f, peer.detail());
    fprintf(f, ", \"baseline\": %s, \"memory\": \"device\", \"pattern\": \"%s\", \"label\": ",
            std::string(peer.name()).compare(0, 4, "cuda") == 0 ? "true" : "false",
            r.c->pattern == PAIR ? "pair" : "random");
    json_string(f, r.c->label);
    fprintf(f, ", \"threads\": %d, \"ops\": %zu, \"ops_requested\": %zu, \"runs\": %d", r.threads,
            res.ops, o.ops, res.runs);
    if (res.ok) {
      fprintf(f, ", \"ns_per_call\": %.3f, \"min\": %.3f, \"max\": %.3f, \"ns_runs\": [", res.median,
              res.min, res.max);
      for (int k = 0; k < res.runs; k++) fprintf(f, "%s%.3f", k ? ", " : "", res.ns[k]);
      fprintf(f, "], \"ops_per_s\": %.1f", res.ops_per_s);
    } else {
      fputs(", \"ns_per_call\": null, \"min\": null, \"max\": null, \"ns_runs\": [], "
            "\"ops_per_s\": null",
            f);
    }
    fputs(", \"ratio\": null, \"ratio_to\": null", f);
    if (r.has_scaling) fprintf(f, ", \"scaling_vs_1_thread\": %.4g", r.scaling);
    else fputs(", \"scaling_vs_1_thread\": null", f);
    if (r.c->pattern == PAIR) fprintf(f, ", \"sizes\": [%zu]", r.c->min_bytes);
    else fprintf(f, ", \"sizes\": [%zu, %zu]", r.c->min_bytes, r.c->max_bytes);
    fprintf(f, ", \"size_min\": %zu, \"size_max\": %zu, \"live\": %zu, \"seed\": %llu, "
               "\"budget_s\": %g, \"device\": ",
            r.c->min_bytes, r.c->max_bytes, r.c->live, (unsigned long long)o.seed, o.budget_s);
    json_string(f, info.device);
    fprintf(f, ", \"device_id\": %d, \"cpu\": ", info.device_id);
    json_string(f, info.cpu);
    fprintf(f, ", \"status\": \"%s\", \"error\": ", res.ok ? "ok" : "failed");
    if (res.ok) fputs("null", f);
    else json_string(f, res.error);
    fprintf(f, "}%s\n", i + 1 < rows.size() ? "," : "");
  }
  fputs("]\n", f);
}

int run_bench(const Options &o, const RunInfo &info, Peer *peer) {
  printf("# peers bench | allocator: %s | device: %s (%d) | cpu: %s | seed %llu, %d runs, %zu ops "
         "per thread and run, budget %g s\n",
         peer->name(), info.device.c_str(), info.device_id, info.cpu.c_str(),
         (unsigned long long)o.seed, o.repeat, o.ops, o.budget_s);
  printf("# %s\n", peer->detail().c_str());
  fflush(stdout);
  std::vector<BenchRow> rows;
  for (const BenchCase &c : o.cases)
    for (int t : o.threads) rows.push_back(BenchRow{&c, t, BenchResult()});
  int k = 0;
  for (BenchRow &r : rows) {
    BenchParams p{r.threads, o.ops, o.repeat, o.seed, o.budget_s};
    bench_measure(peer, o.device, r.c, &p, &r.res);
    k++;
    if (!r.res.ok)
      fprintf(stderr, "%s: %s | %s | %d threads: FAILED: %s\n", program, peer->name(),
              r.c->label.c_str(), r.threads, r.res.error);
    else if (!o.quiet)
      fprintf(stderr, "[%d/%zu] %s | %s | %d thr: %.1f ns/call (%zu ops)\n", k, rows.size(),
              peer->name(), r.c->label.c_str(), r.threads, r.res.median, r.res.ops);
  }
  for (BenchRow &r : rows)
    for (const BenchRow &b : rows)
      if (b.c == r.c && b.threads == 1 && r.threads != 1 && r.res.ok && b.res.ok) {
        r.has_scaling = true;
        r.scaling = r.res.ops_per_s / b.res.ops_per_s;
      }
  int sw = std::max(9, (int)strlen(peer->name())), pw = 7;
  for (const BenchCase &c : o.cases) pw = std::max(pw, (int)c.label.size());
  printf("%-*s  %-*s  %3s  %9s  %10s  %10s  %12s  %6s\n", sw, "allocator", pw, "pattern", "thr",
         "ops", "ns/call", "min", "ops/s", "xT1");
  bool cut_any = false;
  int rc = 0;
  const BenchCase *last = nullptr;
  for (const BenchRow &r : rows) {
    if (last != nullptr && r.c != last) putchar('\n');
    last = r.c;
    if (!r.res.ok) {
      std::string first(r.res.error, strcspn(r.res.error, "\n"));
      printf("%-*s  %-*s  %3d  FAILED: %s\n", sw, peer->name(), pw, r.c->label.c_str(), r.threads,
             first.c_str());
      rc = kExitFailed;
      continue;
    }
    bool cut = r.res.ops < o.ops;
    cut_any |= cut;
    char ops[32], scaling[32] = "-";
    snprintf(ops, sizeof ops, "%zu%s", r.res.ops, cut ? "*" : "");
    if (r.has_scaling) snprintf(scaling, sizeof scaling, "%.2f", r.scaling);
    printf("%-*s  %-*s  %3d  %9s  %10.1f  %10.1f  %12.0f  %6s\n", sw, peer->name(), pw,
           r.c->label.c_str(), r.threads, ops, r.res.median, r.res.min, r.res.ops_per_s, scaling);
  }
  printf("# ns/call: median of %d runs of wall time * threads / calls (a call is one allocate or "
         "one free); min: the fastest run\n",
         o.repeat);
  printf("# xT1: aggregate ops/s divided by the same allocator's ops/s with 1 thread\n");
  if (cut_any)
    printf("# *: fewer calls per run than --ops %zu: the allocator ran longer than the %g s budget\n",
           o.ops, o.budget_s);
  fflush(stdout);
  if (o.json != nullptr) {
    FILE *f = fopen(o.json, "w");
    if (f == nullptr) {
      fprintf(stderr, "%s: cannot write --json %s: %s\n", program, o.json, strerror(errno));
      return kExitIo;
    }
    bench_json(f, o, info, *peer, rows);
    if (fclose(f) != 0) {
      fprintf(stderr, "%s: writing --json %s failed\n", program, o.json);
      return kExitIo;
    }
  }
  return rc;
}

struct ReplayRow {
  const Log *log;
  bool warm;
  ReplayResult res;
};

void replay_json(FILE *f, const RunInfo &info, const Peer &peer, const std::vector<ReplayRow> &rows) {
  fputs("[\n", f);
  for (size_t i = 0; i < rows.size(); i++) {
    const ReplayRow &row = rows[i];
    const Log *log = row.log;
    const ReplayResult &r = row.res;
    fputs("  {\"stack\": ", f);
    json_string(f, peer.name());
    fputs(", \"allocator\": ", f);
    json_string(f, peer.name());
    fputs(", \"allocator_detail\": ", f);
    json_string(f, peer.detail());
    fputs(", \"log\": ", f);
    json_string(f, log->name);
    fprintf(f, ", \"warm\": %s, \"device\": ", row.warm ? "true" : "false");
    json_string(f, info.device);
    if (!r.error.empty()) {
      fputs(", \"error\": ", f);
      json_string(f, r.error);
      fprintf(f, "}%s\n", i + 1 < rows.size() ? "," : "");
      continue;
    }
    fputs(", \"upstream\": \"driver\", \"upstream_kind\": \"device\", \"simulated\": false, "
          "\"real_streams\": true",
          f);
    fprintf(f, ",\n   \"threads\": %u, \"logged_threads\": %zu, \"streams\": %zu", r.threads,
            log->thread_ids.size(), log->stream_ids.size());
    fprintf(f, ", \"events\": %llu, \"calls\": %llu, \"failures\": %llu",
            (unsigned long long)r.events, (unsigned long long)r.calls, (unsigned long long)r.failures);
    fprintf(f, ", \"free_errors\": %llu, \"skipped_frees\": %llu, \"logged_failures\": %llu",
            (unsigned long long)r.free_errors, (unsigned long long)r.skipped_frees,
            (unsigned long long)log->logged_failures);
    fprintf(f, ",\n   \"peak_live_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
               "\"end_reserved_bytes\": %llu",
            (unsigned long long)log->peak_live, (unsigned long long)r.peak_reserved,
            (unsigned long long)r.end_reserved);
    if (log->peak_live)
      fprintf(f, ", \"ratio\": %.6f", (double)r.peak_reserved / (double)log->peak_live);
    else
      fputs(", \"ratio\": null", f);
    fprintf(f, ", \"reserved_at_start_bytes\": %llu, \"timed_epoch_peak_reserved_bytes\": %llu",
            (unsigned long long)r.reserved_at_start, (unsigned long long)r.timed_peak_reserved);
    if (log->peak_live)
      fprintf(f, ", \"timed_epoch_ratio\": %.6f",
              (double)r.timed_peak_reserved / (double)log->peak_live);
    fprintf(f, ", \"timed_epoch_reserved_growth_bytes\": %llu",
            (unsigned long long)(r.timed_peak_reserved > r.timed_start_reserved
                                     ? r.timed_peak_reserved - r.timed_start_reserved
                                     : 0));
    fprintf(f, ", \"live_at_end_bytes\": %llu, \"outstanding_at_end\": %llu",
            (unsigned long long)log->live_at_end, (unsigned long long)log->outstanding_at_end);
    fprintf(f, ",\n   \"ns_per_call\": %.1f, \"total_call_ns\": %llu, \"own_ns_per_call\": null",
            r.ns_per_call, (unsigned long long)r.total_ns);
    if (r.has_upstream)
      fprintf(f, ", \"upstream_calls\": %llu", (unsigned long long)r.upstream_calls);
    else
      fputs(", \"upstream_calls\": null", f);
    fprintf(f, ", \"upstream_ns\": null, \"repeats\": %u, \"ns_per_call_min\": %.1f", r.repeats,
            r.ns_per_call_min);
    for (const auto &c : r.counters) fprintf(f, ", \"%s\": %llu", c.first.c_str(), (unsigned long long)c.second);
    if (r.failures > 0) {
      fputs(", \"first_failure\": ", f);
      json_string(f, r.first_failure);
    }
    fprintf(f, ",\n   \"null_events\": %llu, \"skipped_total\": 0, \"skipped\": {\"malformed\": 0, "
               "\"missing_columns\": 0, \"bad_size\": 0, \"unknown_pointer\": 0, "
               "\"duplicate_pointer\": 0, \"size_mismatch\": 0}}%s\n",
            (unsigned long long)log->null_events, i + 1 < rows.size() ? "," : "");
  }
  fputs("]\n", f);
}

void describe_log(const Log &log) {
  printf("%s: %zu events (%llu allocations, %llu frees) on %zu thread%s and %zu stream%s; peak "
         "live %s at event %zu",
         log.name.c_str(), log.events.size(), (unsigned long long)log.allocations,
         (unsigned long long)log.frees, log.thread_ids.size(), log.thread_ids.size() == 1 ? "" : "s",
         log.stream_ids.size(), log.stream_ids.size() == 1 ? "" : "s",
         human_bytes(log.peak_live).c_str(), log.peak_event);
  if (log.has_time && log.last_time_us >= log.first_time_us)
    printf("; spans %.3f s", (double)(log.last_time_us - log.first_time_us) / 1e6);
  printf("\n");
  if (log.logged_failures)
    printf("  %llu 'allocate failure' lines are not replayed\n", (unsigned long long)log.logged_failures);
  if (log.null_events)
    printf("  %llu lines with a null pointer are no-ops\n", (unsigned long long)log.null_events);
  if (log.outstanding_at_end)
    printf("  %llu allocations (%s) are still live at the end of the log: freed after the replay, "
           "untimed\n",
           (unsigned long long)log.outstanding_at_end, human_bytes(log.live_at_end).c_str());
}

int run_replay(const Options &o, const RunInfo &info, Peer *peer) {
  std::vector<Log> logs(o.logs.size());
  for (size_t i = 0; i < o.logs.size(); i++) {
    std::string err;
    if (!read_log(o.logs[i], &logs[i], &err)) {
      fprintf(stderr, "%s: %s\n", program, err.c_str());
      return kExitUsage;
    }
  }
  printf("# peers replay | allocator: %s | device: %s (%d) | cpu: %s | %s, %d replay%s per "
         "epoch kind\n",
         peer->name(), info.device.c_str(), info.device_id, info.cpu.c_str(),
         o.single ? "single thread" : "one thread per logged thread", o.repeat,
         o.repeat == 1 ? "" : "s");
  printf("# %s\n", peer->detail().c_str());
  std::vector<ReplayRow> rows;
  int rc = 0;
  for (const Log &log : logs) {
    describe_log(log);
    fflush(stdout);
    for (int warm = o.cold ? 0 : 1; warm <= (o.warm ? 1 : 0); warm++) {
      ReplayRow row{&log, warm == 1, ReplayResult()};
      if (!replay(&log, peer, o.device, warm == 1, !o.single, (unsigned)o.repeat, &row.res)) {
        fprintf(stderr, "%s: %s | %s | %s: %s\n", program, peer->name(), log.name.c_str(),
                warm ? "warm" : "cold", row.res.error.c_str());
        rc = kExitFailed;
      } else if (!o.quiet) {
        fprintf(stderr, "%s | %s | %s: %.1f ns/call, peak reserved %s\n", peer->name(),
                log.name.c_str(), warm ? "warm" : "cold", row.res.ns_per_call,
                human_bytes(row.res.peak_reserved).c_str());
      }
      rows.push_back(row);
    }
  }
  printf("%-18s  %-5s  %-32s %9s %8s %11s %11s %7s %11s %7s %8s %8s\n", "allocator", "epoch",
         "log", "events", "failures", "peak live", "peak rsvd", "ratio", "timed peak", "ratio",
         "ns/call", "upstream");
  for (const ReplayRow &row : rows) {
    const ReplayResult &r = row.res;
    std::string base = row.log->name;
    size_t slash = base.rfind('/');
    if (slash != std::string::npos) base = base.substr(slash + 1);
    if (base.size() > 32) base = base.substr(0, 29) + "...";
    if (!r.error.empty()) {
      printf("%-18s  %-5s  %-32s error: %s\n", peer->name(), row.warm ? "warm" : "cold",
             base.c_str(), r.error.c_str());
      continue;
    }
    double live = (double)row.log->peak_live;
    char up[32] = "-";
    if (r.has_upstream) snprintf(up, sizeof up, "%llu", (unsigned long long)r.upstream_calls);
    printf("%-18s  %-5s  %-32s %9llu %8llu %11s %11s %6.3fx %11s %6.3fx %8.1f %8s\n", peer->name(),
           row.warm ? "warm" : "cold", base.c_str(), (unsigned long long)r.events,
           (unsigned long long)r.failures, human_bytes(row.log->peak_live).c_str(),
           human_bytes(r.peak_reserved).c_str(), live > 0 ? (double)r.peak_reserved / live : 0.0,
           human_bytes(r.timed_peak_reserved).c_str(),
           live > 0 ? (double)r.timed_peak_reserved / live : 0.0, r.ns_per_call, up);
  }
  printf("# peak rsvd: the allocator's peak reserved bytes over the replay (warm: both epochs); "
         "timed peak: the timed epoch's own; ratio: over the log's peak live bytes\n");
  printf("# ns/call: mean time per allocate/free call of the timed epoch%s; upstream: driver "
         "allocations + frees (page maps + unmaps) in the timed epoch ('-': not counted)\n",
         o.repeat > 1 ? " (median of the replays)" : "");
  for (const ReplayRow &row : rows) {
    if (row.res.failures > 0)
      printf("%s | %s: %llu allocations failed (the first: %s)\n", peer->name(),
             row.log->name.c_str(), (unsigned long long)row.res.failures,
             row.res.first_failure.c_str());
    if (row.res.free_errors > 0)
      printf("%s | %s: %llu frees refused\n", peer->name(), row.log->name.c_str(),
             (unsigned long long)row.res.free_errors);
  }
  fflush(stdout);
  if (o.json != nullptr) {
    FILE *f = fopen(o.json, "w");
    if (f == nullptr) {
      fprintf(stderr, "%s: cannot write --json %s: %s\n", program, o.json, strerror(errno));
      return kExitIo;
    }
    replay_json(f, info, *peer, rows);
    if (fclose(f) != 0) {
      fprintf(stderr, "%s: writing --json %s failed\n", program, o.json);
      return kExitIo;
    }
  }
  return rc;
}

} /* namespace */

int main(int argc, char **argv) {
  Options o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;
  RunInfo info;
  rc = open_device(o, &info);
  if (rc != 0) return rc;
  Peer *peer = make_peer(o.allocator);
  std::string err;
  if (!peer->init(o.device, &err)) {
    fprintf(stderr, "%s: %s: %s\n", program, o.allocator.c_str(), err.c_str());
    delete peer;
    return kExitFailed;
  }
  rc = o.mode == "bench" ? run_bench(o, info, peer) : run_replay(o, info, peer);
  delete peer;
  return rc;
}
