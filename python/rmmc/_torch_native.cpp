// SPDX-License-Identifier: Apache-2.0
//
// rmmc as PyTorch's native CUDA allocator backend: the whole
// c10::cuda::CUDACachingAllocator::CUDAAllocator interface over rmmc's public
// C API, installed with CUDACachingAllocator::allocator.store() (what
// torch.cuda.memory.change_current_allocator does), so PyTorch's memory tools
// keep working: statistics, cacheInfo (cudnn.benchmark), private pools
// (torch.cuda.MemPool, use_mem_pool, torch.cuda.graph, torch.compile's CUDA
// graph trees), history and snapshots, c10::OutOfMemoryError, and
// torch.multiprocessing's CUDA IPC through rmmc's IPC.
//
// rmmc.torch.use() compiles this file against the installed torch with
// torch.utils.cpp_extension (once per torch version; cached) and calls
// rmmc_torch_native_install() through ctypes. Nothing here is Python.
//
// Where memory comes from. Default allocations of device D go to the
// registry resource of D (rmmc_get_device_resource: what RMMC_ALLOC_CONF or
// rmmc.set_default chose). Each private pool (a MempoolId_t) is a stack of
// its own, built from the same spec as D's default (rmmc_stack_create), or
// a pool layer over the CUDAAllocator a MemPool(allocator=...) names: its
// memory serves nothing else, and when the pool is released and its last
// block freed the stack is destroyed, which gives all of its memory back.
// The memory fraction bounds what the device's stacks reserve, as PyTorch's
// bounds what its allocator holds (try_stack).
// Which pool an allocation goes to is decided as PyTorch's allocator
// decides: the filters given to beginAllocateToPool, evaluated on the
// allocating stream, newest first.
//
// Bookkeeping. Every block handed out is in a map (pointer -> size, stream,
// pool, recorded streams, context); figures PyTorch asks for come from those
// counts plus the stacks' own figures (rmmc_resource_get_field), mapped by
// fill_device_stats() below, a pure function the host selftest checks
// (-DRMMC_TORCH_NATIVE_SELFTEST builds only it and a main()).
//
// Versions: PyTorch 2.9 to 2.15 (scripts/torch-native-check compiles and
// selftests each; 2.14+ need C++20). RMMC_TORCH_AT_LEAST guards the
// differences of the interface: getExpandableSegmentSizes and user
// metadata (2.10); createOrIncrefPool's shared_ptr, setUseOnOOM's flag,
// snapshot's include_traces, recordHistory's skip_actions (2.11); the
// OOM-rejection observers, num_oom_rejections and getContextForPointer
// (2.12); markCaptureBegin/End and reserved_bytes_by_private_pools (2.13);
// supportsUserMetadata and annotateMemory (2.14). allocateWithAddress
// (2.13) keeps PyTorch's refusal: rmmc cannot allocate at a chosen address.

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define RMMC_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace rmmc_torch {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;

// PyTorch's split between its small and large pools (kSmallSize).
constexpr size_t kSmallSize = 1 << 20;
// Blocks are asked of rmmc in multiples of PyTorch's kMinBlockSize (512),
// as PyTorch's allocator rounds them, so memory_allocated() and the
// active/allocated bytes of a program are PyTorch's, and each is what rmmc
// really handed out (rmmc's own granule, 256, divides it).
constexpr size_t kRound = 512;

inline size_t round_size(size_t n) {
  return (n + kRound - 1) / kRound * kRound;
}

// PyTorch refuses any single request of an exabyte or more before trying
// (its "Tried to allocate more than 1EB memory").
constexpr size_t kOneExaByte = size_t(1) << 60;

// ---- stack specs under PyTorch ----
//
// What the backend adds to a spec it builds a stack from, where the spec
// does not say otherwise (each key given, by any of its names, wins):
//   cuda layers under a pool (or arena), when `shareable`: ipc=true, so
//     pages of an expandable pool can go to another process
//     (torch.multiprocessing), as PyTorch's expandable segments can (a
//     cuda layer alone hands out cudaMalloc memory, shareable anyway);
//   pool layers of a private pool (`private_pool`): small_chunk=2MiB,
//     min_growth=2MiB, page=1TiB. PyTorch's private pools hold their small
//     blocks in 2 MiB segments and each large one in a segment of its own;
//     so does a private pool then (a graph pool of a few small tensors
//     holds 2 MiB, not a 4 MiB span or a 32 MiB chunk), and each growth is
//     one mapping: one segment in snapshots, a block never split across
//     segments. A private pool gives its memory back whole when it dies, so
//     finer mappings would only cost driver calls.
//   every pool layer: stream_heaps=1. PyTorch keeps one small pool per
//     stream, whichever thread allocates; so does such a pool: threads on
//     one stream carve their small blocks from the same spans (a second
//     thread's first block does not take a span, and a growth, of its
//     own), and a block freed on another thread of its stream goes back
//     by the fast path (autograd's device thread frees what the forward
//     allocated). `pool(stream_heaps=0)` asks for a heap per thread again.
// Pure: the host selftest checks it. A spec it cannot split is returned
// as it is (rmmc's parser then says what is wrong with it).
struct LayerDefault {
  const char* layer;  // resource name
  const char* keys;   // names of the option, '|'-separated ("page|page_size")
  const char* option; // what is added ("page=1TiB")
  const char* unless; // another key whose presence keeps it out, or nullptr
};

inline std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Splits `s` at top-level `sep` (not inside parentheses); false if the
// parentheses do not balance.
inline bool split_top(const std::string& s, char sep, std::vector<std::string>* out) {
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '(') depth++;
    if (c == ')' && --depth < 0) return false;
    if (c == sep && depth == 0) {
      out->push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out->push_back(cur);
  return depth == 0;
}

inline bool has_key(const std::vector<std::string>& keys, const char* names) {
  std::string all(names);
  size_t from = 0;
  for (;;) {
    size_t bar = all.find('|', from);
    std::string name = all.substr(from, bar == std::string::npos ? std::string::npos : bar - from);
    if (std::find(keys.begin(), keys.end(), name) != keys.end())
      return true;
    if (bar == std::string::npos)
      return false;
    from = bar + 1;
  }
}

inline std::string spec_with_defaults(const std::string& spec, bool shareable,
                                      bool private_pool) {
  static const LayerDefault defaults[] = {
      {"cuda", "ipc", "ipc=true", nullptr},
      {"pool", "small_chunk", "small_chunk=2MiB", "small_max"},
      {"pool", "min_growth", "min_growth=2MiB", nullptr},
      {"pool", "page|page_size", "page=1TiB", nullptr},
      {"pool", "stream_heaps", "stream_heaps=1", nullptr},
  };
  std::vector<std::string> layers;
  if (!split_top(spec, '>', &layers))
    return spec;
  std::string out;
  bool under_pool = false; // a pool or arena above this layer
  for (size_t i = 0; i < layers.size(); i++) {
    std::string layer = trim(layers[i]);
    std::string name = layer, opts;
    size_t open = layer.find('(');
    if (open != std::string::npos) {
      if (layer.back() != ')')
        return spec;
      name = trim(layer.substr(0, open));
      opts = trim(layer.substr(open + 1, layer.size() - open - 2));
    }
    std::vector<std::string> items, keys;
    if (!opts.empty() && !split_top(opts, ',', &items))
      return spec;
    for (const std::string& it : items) {
      std::string key = trim(it.substr(0, it.find('=')));
      std::transform(key.begin(), key.end(), key.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      keys.push_back(key);
    }
    for (const LayerDefault& d : defaults) {
      const std::string key(d.keys);
      const bool wanted = std::string(d.layer) == "cuda" ? shareable && under_pool
                          : key == "stream_heaps"        ? true
                                                         : private_pool;
      if (!wanted || name != d.layer || has_key(keys, d.keys) ||
          (d.unless != nullptr && has_key(keys, d.unless)))
        continue;
      opts += opts.empty() ? d.option : std::string(", ") + d.option;
    }
    if (name == "pool" || name == "arena")
      under_pool = true;
    if (i > 0)
      out += " > ";
    out += opts.empty() ? name : name + "(" + opts + ")";
  }
  return out;
}

// The innermost layer of a spec (its base resource: "cuda(ipc=true)" of
// "pool > cuda(ipc=true)"), what a MemPool(no_split=True) allocates from:
// each block its own allocation. A spec it cannot split is returned whole.
inline std::string base_layer(const std::string& spec) {
  std::vector<std::string> layers;
  if (!split_top(spec, '>', &layers))
    return spec;
  return trim(layers.back());
}

// The same over a whole configuration (RMMC_ALLOC_CONF's form: items
// separated by ';', each "DEVICES: SPEC" or a spec), for the shareable
// default only.
inline std::string config_with_defaults(const std::string& config) {
  std::vector<std::string> items;
  if (!split_top(config, ';', &items))
    return config;
  std::string out;
  for (size_t i = 0; i < items.size(); i++) {
    std::string item = items[i], head;
    size_t colon = item.find(':');
    if (colon != std::string::npos) { // a device list: "*", or digits, ',', '-'
      head = item.substr(0, colon + 1);
      item = item.substr(colon + 1);
    }
    if (i > 0)
      out += ";";
    out += trim(item).empty() ? items[i] : head + (head.empty() ? "" : " ") +
                                              spec_with_defaults(item, true, false);
  }
  return out;
}

// What the layer counts itself, per device. Allocation-side figures are
// exact: they change with every block handed to PyTorch or taken back.
struct Counters {
  StatArray allocation;      // blocks out
  StatArray allocated_bytes; // their sizes rounded (round_size: what rmmc handed out)
  StatArray requested_bytes; // their sizes as PyTorch asked
  // Blocks not yet given back to rmmc: out, or freed by PyTorch while a
  // capture may be underway with streams recorded on them (their release
  // waits for the capture to end, as PyTorch's deferred events do).
  StatArray active;
  StatArray active_bytes;
  int64_t num_ooms = 0;
  int64_t num_oom_rejections = 0; // refused by the memory fraction (try_stack)
  int64_t num_alloc_retries = 0;
  int64_t num_sync_all_streams = 0; // emptyCache calls that synchronized
  // Since the backend started (no reset clears them): rmmc.torch.stats().
  int64_t recorded_streams = 0; // recordStream calls that added a stream
  int64_t lifetime_allocations = 0;
  int64_t lifetime_frees = 0;
  int64_t lifetime_ooms = 0;
  int64_t lifetime_peak_allocated = 0; // of allocated_bytes (rounded: what rmmc handed out)

  // Calls f on every Stat of the arrays PyTorch's resets clear
  // (resetAccumulatedStats, resetPeakStats).
  template <typename F> void for_each_reset_stat(F f) {
    for (StatArray* a : {&allocation, &allocated_bytes, &requested_bytes, &active, &active_bytes})
      for (Stat& s : *a)
        f(s);
  }
};

// What the stacks under the device report (summed over the default stack and
// the private pools' stacks). has_cache: some layer caches (a pool), so
// `reserved` is its figure; otherwise reserved is the bytes out.
struct StackFigures {
  bool has_cache = false;
  uint64_t reserved = 0;      // "reserved"
  uint64_t reserved_peak = 0; // "reserved_peak"
  uint64_t regions = 0;       // "regions": chunks or reservations
  uint64_t grows = 0;         // "grows": upstream allocations or mappings
  uint64_t shrinks = 0;       // "shrinks" (a destroyed private pool's regions too)
  uint64_t device_syncs = 0;  // "device_syncs"
};

// What resetPeakStats / resetAccumulatedStats leave for the stack figures,
// which rmmc does not reset: the values at the last reset.
struct ResetBase {
  uint64_t reserved_peak_at_reset = 0; // rmmc's reserved_peak then
  uint64_t reserved_at_reset = 0;      // reserved then
  uint64_t grows_at_reset = 0;
  uint64_t shrinks_at_reset = 0;
  uint64_t regions_peak = 0; // highest regions seen since the reset
};

// Fills PyTorch's DeviceStats from the layer's counts and the stacks'
// figures. Pure: the host selftest checks it.
//
//   allocation, allocated_bytes, requested_bytes: the layer's counts (small
//     and large split at 1 MiB as PyTorch splits them).
//   active, active_bytes: the layer's count of blocks not yet given back:
//     the allocated ones, and those freed with recorded streams during a
//     capture (given back when it ends; outside a capture a freed block
//     goes back to rmmc at once behind GPU-side waits).
//   reserved_bytes: the stacks' "reserved" (all in the aggregate and large
//     rows: rmmc has one heap, not PyTorch's two); peak: rmmc's
//     reserved_peak if it rose after the last reset, else the larger of
//     reserved then and now. Without a caching layer: the bytes out.
//   segment: current = "regions", peak = highest seen since the reset
//     (sampled when stats are read), allocated/freed = "grows"/"shrinks"
//     since the reset; num_device_alloc / num_device_free the same.
//   inactive_split_bytes: reserved - allocated (free bytes the stacks
//     cache); inactive_split count: 0 (rmmc does not count free blocks).
//   num_ooms, num_alloc_retries: the layer's (a retry is an allocation
//     that failed, released every cache of the device and was tried again);
//     num_oom_rejections (2.12+): requests refused because the device's
//     stacks would reserve more than the memory fraction allows.
//   num_sync_all_streams: rmmc's "device_syncs" plus the layer's own.
//   oversize_allocations, oversize_segments: 0 (rmmc has no oversize
//     class); max_split_size: SIZE_MAX as PyTorch reports with no limit.
inline int64_t since(uint64_t now, uint64_t then) {
  return now > then ? static_cast<int64_t>(now - then) : 0;
}

inline DeviceStats fill_device_stats(const Counters& c, const StackFigures& f,
                                     ResetBase& base) {
  DeviceStats s;
  s.allocation = c.allocation;
  s.allocated_bytes = c.allocated_bytes;
  s.requested_bytes = c.requested_bytes;
  s.active = c.active;
  s.active_bytes = c.active_bytes;

  const int64_t out = c.allocated_bytes[0].current;
  Stat reserved;
  if (f.has_cache) {
    reserved.current = static_cast<int64_t>(f.reserved);
    uint64_t peak = f.reserved_peak > base.reserved_peak_at_reset
                        ? f.reserved_peak
                        : std::max(base.reserved_at_reset, f.reserved);
    reserved.peak = static_cast<int64_t>(std::max<uint64_t>(peak, f.reserved));
  } else {
    reserved = c.allocated_bytes[0];
  }
  if (f.has_cache) {
    reserved.allocated = since(f.grows, base.grows_at_reset);
    reserved.freed = since(f.shrinks, base.shrinks_at_reset);
  }
  s.reserved_bytes[0] = reserved;
  s.reserved_bytes[2] = reserved;

  Stat inactive;
  inactive.current = std::max<int64_t>(0, reserved.current - out);
  inactive.peak = std::max<int64_t>(0, reserved.peak - c.allocated_bytes[0].peak);
  s.inactive_split_bytes[0] = inactive;
  s.inactive_split_bytes[2] = inactive;

  Stat segment;
  if (f.has_cache) {
    base.regions_peak = std::max(base.regions_peak, f.regions);
    segment.current = static_cast<int64_t>(f.regions);
    segment.peak = static_cast<int64_t>(base.regions_peak);
    segment.allocated = since(f.grows, base.grows_at_reset);
    segment.freed = since(f.shrinks, base.shrinks_at_reset);
  } else {
    segment = c.allocation[0];
  }
  s.segment[0] = segment;
  s.segment[2] = segment;

  s.num_ooms = c.num_ooms;
#if RMMC_TORCH_AT_LEAST(2, 12)
  s.num_oom_rejections = c.num_oom_rejections;
#endif
  s.num_alloc_retries = c.num_alloc_retries;
  s.num_sync_all_streams =
      static_cast<int64_t>(f.device_syncs) + c.num_sync_all_streams;
  s.num_device_alloc = segment.allocated;
  s.num_device_free = segment.freed;
  s.max_split_size = static_cast<int64_t>(SIZE_MAX);
  return s;
}

// The row of a block (1 small, 2 large), split as PyTorch's pools are.
inline size_t row_of(size_t requested) {
  return round_size(requested) <= kSmallSize ? 1 : 2;
}

// Counts one block given to PyTorch or taken back (allocation,
// allocated_bytes, requested_bytes, lifetime figures).
inline void count_block(Counters& c, size_t requested, bool in) {
  const size_t rounded = round_size(requested);
  const size_t type = row_of(requested);
  for (size_t t : {size_t(0), type}) {
    if (in && t == 0) {
      c.lifetime_allocations++;
      c.lifetime_peak_allocated = std::max(
          c.lifetime_peak_allocated, c.allocated_bytes[0].current + static_cast<int64_t>(rounded));
    } else if (t == 0) {
      c.lifetime_frees++;
    }
    if (in) {
      c.allocation[t].increase(1);
      c.allocated_bytes[t].increase(rounded);
      c.requested_bytes[t].increase(requested);
    } else {
      c.allocation[t].decrease(1);
      c.allocated_bytes[t].decrease(rounded);
      c.requested_bytes[t].decrease(requested);
    }
  }
}

// reserved_bytes_by_private_pools (2.13+): per private pool, the bytes its
// stack reserves, sampled when statistics are read and set to 0 when the
// pool's stack is destroyed; peak, allocated and freed last until a reset
// (a dead pool's entry goes at resetAccumulatedStats). Pure: the selftest
// checks it.
struct PoolReserved {
  std::map<std::pair<uint64_t, uint64_t>, Stat> by_pool;
  void sample(std::pair<uint64_t, uint64_t> id, uint64_t now) {
    Stat& st = by_pool[id];
    const int64_t n = static_cast<int64_t>(now);
    if (n > st.current)
      st.increase(n - st.current);
    else if (n < st.current)
      st.decrease(st.current - n);
  }
  void reset_peak() {
    for (auto& kv : by_pool)
      kv.second.reset_peak();
  }
  void reset_accumulated() {
    for (auto it = by_pool.begin(); it != by_pool.end();) {
      it->second.reset_accumulated();
      it = it->second.current == 0 ? by_pool.erase(it) : std::next(it);
    }
  }
};

// Counts one block becoming active (handed out) or inactive (back in rmmc).
inline void count_active(Counters& c, size_t requested, bool in) {
  const int64_t rounded = static_cast<int64_t>(round_size(requested));
  for (size_t t : {size_t(0), row_of(requested)}) {
    if (in) {
      c.active[t].increase(1);
      c.active_bytes[t].increase(rounded);
    } else {
      c.active[t].decrease(1);
      c.active_bytes[t].decrease(rounded);
    }
  }
}

// PyTorch's byte format in its messages ("20.00 GiB", "512 bytes").
inline std::string format_size(uint64_t size) {
  char buf[64];
  if (size <= 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)size);
  } else if (size <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", size / 1024.0);
  } else if (size <= 1073741824ULL) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", size / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", size / 1073741824.0);
  }
  return buf;
}

// ---- segments: what a stack holds, with the blocks PyTorch has in it ----
//
// A snapshot's segments are the ranges the stack took from the system, as
// its memory hooks report them (one per chunk of a chunked pool, one per
// page mapping of an expandable pool): stable while the memory is held,
// which is what ProcessGroupNCCL::registerMemPool and deregisterMemPool
// need (they register the segments of one snapshot and deregister those of
// a later one), and adding up to the stack's reserved bytes. The blocks
// PyTorch holds are laid into them in address order, the gaps free, so the
// blocks tile every segment as in PyTorch's own snapshots. A block of an
// expandable pool may lie on several mappings: it is listed once per
// mapping, in pieces that add up to it (its requested bytes go to the
// first pieces).

struct Range {
  uintptr_t addr;
  size_t size;
  int32_t seq = 0; // order of acquisition in the process (SegmentInfo::registration_counter)
};

struct LiveBlock {
  uintptr_t addr;
  size_t size;      // rounded as rmmc rounds it
  size_t requested; // as PyTorch asked
};

struct Piece {
  size_t size;
  size_t requested; // 0 for free memory
  long block;       // index into the blocks; -1: free memory
};

struct SegmentLayout {
  uintptr_t addr;
  size_t size;
  std::vector<Piece> pieces; // in address order, adding up to size
  int32_t seq = 0;           // the range's
};

// Lays `blocks` (sorted by address, disjoint) into `ranges` (sorted,
// disjoint). Pure: the host selftest checks it. Blocks that lie in no range
// (a stack whose hooks someone else replaced) are listed in *outside.
inline std::vector<SegmentLayout> layout_segments(const std::vector<Range>& ranges,
                                                  const std::vector<LiveBlock>& blocks,
                                                  std::vector<size_t>* outside) {
  std::vector<SegmentLayout> out;
  out.reserve(ranges.size());
  std::vector<size_t> left(blocks.size()); // requested bytes not yet placed
  std::vector<bool> placed(blocks.size(), false);
  for (size_t k = 0; k < blocks.size(); k++)
    left[k] = blocks[k].requested;
  size_t j = 0;
  for (const Range& r : ranges) {
    const uintptr_t end = r.addr + r.size;
    while (j < blocks.size() && blocks[j].addr + blocks[j].size <= r.addr)
      j++;
    SegmentLayout seg{r.addr, r.size, {}, r.seq};
    uintptr_t cursor = r.addr;
    while (j < blocks.size() && blocks[j].addr < end) {
      const LiveBlock& b = blocks[j];
      const uintptr_t from = std::max(b.addr, cursor);
      const uintptr_t to = std::min<uintptr_t>(b.addr + b.size, end);
      if (to <= from) { // overlaps the block before it: never for disjoint blocks
        j++;
        continue;
      }
      if (from > cursor)
        seg.pieces.push_back({from - cursor, 0, -1});
      const size_t req = std::min<size_t>(to - from, left[j]);
      left[j] -= req;
      seg.pieces.push_back({to - from, req, static_cast<long>(j)});
      placed[j] = true;
      cursor = to;
      if (b.addr + b.size > end)
        break; // goes on in the next range
      j++;
    }
    if (cursor < end)
      seg.pieces.push_back({end - cursor, 0, -1});
    out.push_back(std::move(seg));
  }
  if (outside != nullptr)
    for (size_t k = 0; k < blocks.size(); k++)
      if (!placed[k])
        outside->push_back(k);
  return out;
}

// A memory hook's shape (rmmc_memory_hook_cb's, without rmmc's header).
using RangeFn = void (*)(void* ptr, size_t bytes, void* user);
struct RangeHooks {
  RangeFn on_acquire = nullptr;
  RangeFn on_release = nullptr;
  void* user = nullptr;
};

// The ranges one stack holds, kept by its memory hooks (which run under
// the pool's lock: `mutex_` is taken under it and nothing here calls rmmc),
// and hooks of a user riding on them: called after the range is recorded
// on acquire and before it is dropped on release, under the same lock, so
// set_user's replay (the old hooks hear on_release and the new on_acquire
// for every range held, rmmc_resource_set_memory_hooks' contract) cannot
// interleave with a growth. Pure: the host selftest checks it.
class SegmentRanges {
 public:
  void acquired(void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> g(mutex_);
    ranges_[reinterpret_cast<uintptr_t>(ptr)] = {bytes, next_seq()};
    if (user_.on_acquire != nullptr)
      user_.on_acquire(ptr, bytes, user_.user);
  }
  void released(void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> g(mutex_);
    if (user_.on_release != nullptr)
      user_.on_release(ptr, bytes, user_.user);
    ranges_.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  // Numbers ranges in the order the process acquired them, as PyTorch's
  // allocator numbers its segments: ProcessGroupNCCL.register_mem_pool
  // registers a snapshot's segments in this order and refuses a negative one.
  static int32_t next_seq() {
    static std::atomic<int32_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) & 0x7fffffff;
  }
  void set_user(const RangeHooks& hooks) {
    std::lock_guard<std::mutex> g(mutex_);
    const RangeHooks old = user_;
    user_ = hooks;
    for (auto& r : ranges_) {
      if (old.on_release != nullptr)
        old.on_release(reinterpret_cast<void*>(r.first), r.second.first, old.user);
      if (user_.on_acquire != nullptr)
        user_.on_acquire(reinterpret_cast<void*>(r.first), r.second.first, user_.user);
    }
  }
  // The ranges in address order.
  std::vector<Range> list() const {
    std::lock_guard<std::mutex> g(mutex_);
    std::vector<Range> out;
    out.reserve(ranges_.size());
    for (auto& r : ranges_)
      out.push_back({r.first, r.second.first, r.second.second});
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<uintptr_t, std::pair<size_t, int32_t>> ranges_; // size, seq
  RangeHooks user_;
};

} // namespace rmmc_torch

#ifdef RMMC_TORCH_NATIVE_SELFTEST
// ---- host selftest of the pure parts (no GPU, no libtorch) ----
#include <cstdlib>

static int failures = 0;
#define EXPECT_EQ(a, b)                                                     \
  do {                                                                      \
    long long va = (long long)(a), vb = (long long)(b);                     \
    if (va != vb) {                                                         \
      std::fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n",      \
                   __FILE__, __LINE__, #a, va, #b, vb);                     \
      failures++;                                                           \
    }                                                                       \
  } while (0)

int main() {
  using namespace rmmc_torch;
  Counters c;
  // PyTorch's rounding: at least 512 bytes, in multiples of 512; the rows
  // split at 1 MiB after rounding.
  EXPECT_EQ(round_size(1), 512);
  EXPECT_EQ(round_size(512), 512);
  EXPECT_EQ(round_size(513), 1024);
  EXPECT_EQ(row_of(1u << 20), 1);
  EXPECT_EQ(row_of((1u << 20) - 100), 1);
  EXPECT_EQ(row_of((1u << 20) + 1), 2);
  // 100 bytes (small) and 3 MiB + 1 (large) out; then the small one back.
  count_block(c, 100, true);
  count_block(c, (3u << 20) + 1, true);
  EXPECT_EQ(c.allocated_bytes[0].current, 512 + (3 << 20) + 512);
  EXPECT_EQ(c.requested_bytes[0].current, 100 + (3 << 20) + 1);
  EXPECT_EQ(c.allocation[1].current, 1);
  EXPECT_EQ(c.allocation[2].current, 1);
  count_block(c, 100, false);
  EXPECT_EQ(c.allocated_bytes[0].current, (3 << 20) + 512);
  EXPECT_EQ(c.allocated_bytes[0].peak, 512 + (3 << 20) + 512);
  EXPECT_EQ(c.allocated_bytes[0].freed, 512);
  EXPECT_EQ(c.allocated_bytes[1].current, 0);
  // Active: blocks not yet given back (the large one, and the small one
  // while its release waits for a capture to end).
  count_active(c, 100, true);
  count_active(c, (3u << 20) + 1, true);
  EXPECT_EQ(c.active[0].current, 2);
  EXPECT_EQ(c.active_bytes[0].current, 512 + (3 << 20) + 512);
  // rmmc.torch.stats()'s lifetime figures: 2 out, 1 back, peak as rmmc
  // handed them out (rounded), what a statistics layer below counts.
  EXPECT_EQ(c.lifetime_allocations, 2);
  EXPECT_EQ(c.lifetime_frees, 1);
  EXPECT_EQ(c.lifetime_peak_allocated, 512 + (3 << 20) + 512);
  for (Stat& st : c.allocation)
    st.reset_accumulated(); // resetAccumulatedStats leaves them
  EXPECT_EQ(c.lifetime_allocations, 2);
  c.num_ooms = 2;
  c.num_oom_rejections = 1;
  c.num_alloc_retries = 3;

  // A pool holding 32 MiB in 2 regions after 3 grows and 1 shrink.
  StackFigures f;
  f.has_cache = true;
  f.reserved = 32u << 20;
  f.reserved_peak = 40u << 20;
  f.regions = 2;
  f.grows = 3;
  f.shrinks = 1;
  f.device_syncs = 4;
  ResetBase base;
  DeviceStats s = fill_device_stats(c, f, base);
  EXPECT_EQ(s.allocated_bytes[0].current, (3 << 20) + 512);
  EXPECT_EQ(s.active[0].current, 2); // the small one still active
  EXPECT_EQ(s.active_bytes[0].current, 512 + (3 << 20) + 512);
  EXPECT_EQ(s.active_bytes[1].current, 512);
  count_active(c, 100, false); // given back
  s = fill_device_stats(c, f, base);
  EXPECT_EQ(s.active_bytes[0].current, (3 << 20) + 512);
  EXPECT_EQ(s.active_bytes[0].freed, 512);
  EXPECT_EQ(s.active[1].current, 0);
  EXPECT_EQ(s.requested_bytes[0].current, (3 << 20) + 1);
  EXPECT_EQ(s.reserved_bytes[0].current, 32 << 20);
  EXPECT_EQ(s.reserved_bytes[0].peak, 40 << 20);
  EXPECT_EQ(s.reserved_bytes[2].current, 32 << 20);
  EXPECT_EQ(s.reserved_bytes[1].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[0].current, (32 << 20) - (3 << 20) - 512);
  EXPECT_EQ(s.segment[0].current, 2);
  EXPECT_EQ(s.segment[0].allocated, 3);
  EXPECT_EQ(s.segment[0].freed, 1);
  EXPECT_EQ(s.num_device_alloc, 3);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_ooms, 2);
#if RMMC_TORCH_AT_LEAST(2, 12)
  EXPECT_EQ(s.num_oom_rejections, 1);
#endif
  EXPECT_EQ(s.num_alloc_retries, 3);
  EXPECT_EQ(s.num_sync_all_streams, 4);
  EXPECT_EQ(s.oversize_allocations.current, 0);

  // resetPeakStats + resetAccumulatedStats: the peak starts again from now.
  base.reserved_peak_at_reset = f.reserved_peak;
  base.reserved_at_reset = f.reserved;
  base.grows_at_reset = f.grows;
  base.shrinks_at_reset = f.shrinks;
  base.regions_peak = f.regions;
  f.reserved = 16u << 20; // shrank since
  s = fill_device_stats(c, f, base);
  EXPECT_EQ(s.reserved_bytes[0].peak, 32 << 20);
  EXPECT_EQ(s.segment[0].allocated, 0);
  f.reserved_peak = 48u << 20; // a new peak after the reset
  f.reserved = 48u << 20;
  f.grows = 5;
  f.regions = 3;
  s = fill_device_stats(c, f, base);
  EXPECT_EQ(s.reserved_bytes[0].peak, 48 << 20);
  EXPECT_EQ(s.segment[0].allocated, 2);
  EXPECT_EQ(s.segment[0].peak, 3);

  // A private pool destroyed since the reset took its counts with it: the
  // differences never go negative.
  f.grows = 1;
  f.shrinks = 0;
  s = fill_device_stats(c, f, base);
  EXPECT_EQ(s.segment[0].allocated, 0);
  EXPECT_EQ(s.segment[0].freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);

  // A stack without a cache (plain cuda): reserved is the bytes out.
  StackFigures none;
  ResetBase b2;
  s = fill_device_stats(c, none, b2);
  EXPECT_EQ(s.reserved_bytes[0].current, (3 << 20) + 512);
  EXPECT_EQ(s.segment[0].current, 1);
  EXPECT_EQ(s.inactive_split_bytes[0].current, 0);

  // Segments: a chunked pool's two chunks, blocks in the first.
  {
    const uintptr_t A = 0x7f0000000000, B = 0x7f0000800000;
    std::vector<Range> ranges{{A, 4u << 20}, {B, 2u << 20}};
    std::vector<LiveBlock> blocks{{A, 1024, 1000}, {A + (1u << 20), 2u << 20, 2u << 20}};
    std::vector<size_t> outside;
    std::vector<SegmentLayout> segs = layout_segments(ranges, blocks, &outside);
    EXPECT_EQ(segs.size(), 2);
    EXPECT_EQ(outside.size(), 0);
    EXPECT_EQ(segs[0].addr, A);
    EXPECT_EQ(segs[0].size, 4u << 20);
    EXPECT_EQ(segs[0].pieces.size(), 4);
    EXPECT_EQ(segs[0].pieces[0].block, 0);
    EXPECT_EQ(segs[0].pieces[0].size, 1024);
    EXPECT_EQ(segs[0].pieces[0].requested, 1000);
    EXPECT_EQ(segs[0].pieces[1].block, -1);
    EXPECT_EQ(segs[0].pieces[1].size, (1u << 20) - 1024);
    EXPECT_EQ(segs[0].pieces[2].block, 1);
    EXPECT_EQ(segs[0].pieces[2].size, 2u << 20);
    EXPECT_EQ(segs[0].pieces[3].block, -1);
    EXPECT_EQ(segs[0].pieces[3].size, 1u << 20);
    // The empty chunk is a segment too: the pool holds it.
    EXPECT_EQ(segs[1].addr, B);
    EXPECT_EQ(segs[1].pieces.size(), 1);
    EXPECT_EQ(segs[1].pieces[0].block, -1);
    EXPECT_EQ(segs[1].pieces[0].size, 2u << 20);
  }
  // An expandable pool's mappings, back to back: a block across two of
  // them is listed in two pieces adding up to it, requested bytes first.
  {
    const uintptr_t M = 0x7e0000000000;
    std::vector<Range> ranges{{M, 2u << 20}, {M + (2u << 20), 2u << 20}, {M + (4u << 20), 2u << 20}};
    std::vector<LiveBlock> blocks{{M + (1u << 20), 2u << 20, (2u << 20) - 100},
                                  {M + (3u << 20), 3u << 20, 3u << 20}};
    std::vector<size_t> outside;
    std::vector<SegmentLayout> segs = layout_segments(ranges, blocks, &outside);
    EXPECT_EQ(segs.size(), 3);
    EXPECT_EQ(outside.size(), 0);
    size_t total = 0, alloc = 0, req = 0;
    for (const SegmentLayout& s : segs) {
      size_t sum = 0;
      for (const Piece& p : s.pieces) {
        sum += p.size;
        if (p.block >= 0) {
          alloc += p.size;
          req += p.requested;
        }
      }
      EXPECT_EQ(sum, s.size); // the pieces tile the segment
      total += s.size;
    }
    EXPECT_EQ(total, 6u << 20);
    EXPECT_EQ(alloc, 5u << 20);
    EXPECT_EQ(req, (5u << 20) - 100);
    EXPECT_EQ(segs[0].pieces.size(), 2);
    EXPECT_EQ(segs[0].pieces[1].block, 0);
    EXPECT_EQ(segs[0].pieces[1].requested, 1u << 20);
    EXPECT_EQ(segs[1].pieces.size(), 2);
    EXPECT_EQ(segs[1].pieces[0].block, 0);
    EXPECT_EQ(segs[1].pieces[0].requested, (1u << 20) - 100);
    EXPECT_EQ(segs[1].pieces[1].block, 1);
    EXPECT_EQ(segs[1].pieces[1].size, 1u << 20);
    EXPECT_EQ(segs[2].pieces.size(), 1);
    EXPECT_EQ(segs[2].pieces[0].block, 1);
    EXPECT_EQ(segs[2].pieces[0].size, 2u << 20);
  }
  // A block in no range (hooks replaced by someone else) is reported; a
  // stack with nothing held has no segments.
  {
    std::vector<Range> ranges{{0x1000000, 1u << 20}};
    std::vector<LiveBlock> blocks{{0x800000, 512, 512}, {0x1000000, 512, 300}, {0x3000000, 256, 1}};
    std::vector<size_t> outside;
    std::vector<SegmentLayout> segs = layout_segments(ranges, blocks, &outside);
    EXPECT_EQ(segs.size(), 1);
    EXPECT_EQ(outside.size(), 2);
    EXPECT_EQ(outside[0], 0);
    EXPECT_EQ(outside[1], 2);
    EXPECT_EQ(segs[0].pieces.size(), 2);
    EXPECT_EQ(segs[0].pieces[0].block, 1);
    outside.clear();
    EXPECT_EQ(layout_segments({}, blocks, &outside).size(), 0);
    EXPECT_EQ(outside.size(), 3);
  }

  // The ranges a stack's hooks report, and a user's hooks riding on them.
  {
    struct Held {
      std::map<uintptr_t, size_t> ranges;
      int acquires = 0, releases = 0, wrong = 0;
    };
    RangeFn acq = [](void* p, size_t n, void* u) {
      auto* h = static_cast<Held*>(u);
      h->wrong += h->ranges.count(reinterpret_cast<uintptr_t>(p)) != 0;
      h->ranges[reinterpret_cast<uintptr_t>(p)] = n;
      h->acquires++;
    };
    RangeFn rel = [](void* p, size_t n, void* u) {
      auto* h = static_cast<Held*>(u);
      auto it = h->ranges.find(reinterpret_cast<uintptr_t>(p));
      h->wrong += it == h->ranges.end() || it->second != n;
      if (it != h->ranges.end())
        h->ranges.erase(it);
      h->releases++;
    };
    void* const A = reinterpret_cast<void*>(0x10000000);
    void* const B = reinterpret_cast<void*>(0x20000000);
    void* const C = reinterpret_cast<void*>(0x08000000);
    SegmentRanges sr;
    sr.acquired(B, 2u << 20);
    sr.acquired(A, 32u << 20);
    std::vector<Range> l = sr.list();
    EXPECT_EQ(l.size(), 2);
    EXPECT_EQ(l[0].addr, 0x10000000); // address order
    EXPECT_EQ(l[0].size, 32u << 20);
    EXPECT_EQ(l[1].addr, 0x20000000);
    // Numbered in the order acquired (register_mem_pool sorts by it, >= 0).
    EXPECT_EQ(l[0].seq >= 0 && l[1].seq >= 0, 1);
    EXPECT_EQ(l[0].seq > l[1].seq, 1); // A came after B
    EXPECT_EQ(layout_segments(l, {}, nullptr)[0].seq, l[0].seq);
    Held h1, h2;
    sr.set_user({acq, rel, &h1}); // hears what is held now
    EXPECT_EQ(h1.acquires, 2);
    sr.acquired(C, 4u << 20); // and growth
    EXPECT_EQ(h1.ranges.size(), 3);
    sr.released(A, 32u << 20); // and give-back
    EXPECT_EQ(h1.ranges.size(), 2);
    EXPECT_EQ(sr.list().size(), 2);
    sr.set_user({acq, rel, &h2}); // the old hooks let go of all, the new take all
    EXPECT_EQ(h1.ranges.size(), 0);
    EXPECT_EQ(h1.releases, 3);
    EXPECT_EQ(h2.ranges.size(), 2);
    EXPECT_EQ(h2.ranges.count(0x08000000), 1);
    sr.set_user(RangeHooks{}); // removed: released
    EXPECT_EQ(h2.ranges.size(), 0);
    EXPECT_EQ(h2.releases, 2);
    sr.released(B, 2u << 20); // no user hooks: only the table
    EXPECT_EQ(sr.list().size(), 1);
    EXPECT_EQ(sr.list()[0].addr, 0x08000000);
    EXPECT_EQ(h1.wrong + h2.wrong, 0);
    EXPECT_EQ(h2.acquires, 2);
  }

  // Private pools' reserved bytes: sampled, 0 when the pool dies, the peak
  // and the accumulated figures kept until a reset.
  {
    PoolReserved pr;
    const std::pair<uint64_t, uint64_t> one{0, 1}, two{0, 2};
    pr.sample(one, 4u << 20);
    pr.sample(one, 6u << 20);
    pr.sample(two, 2u << 20);
    pr.sample(one, 0); // destroyed
    EXPECT_EQ(pr.by_pool.size(), 2);
    EXPECT_EQ(pr.by_pool[one].current, 0);
    EXPECT_EQ(pr.by_pool[one].peak, 6 << 20);
    EXPECT_EQ(pr.by_pool[one].allocated, 6 << 20);
    EXPECT_EQ(pr.by_pool[one].freed, 6 << 20);
    pr.reset_peak();
    EXPECT_EQ(pr.by_pool[one].peak, 0);
    EXPECT_EQ(pr.by_pool[two].peak, 2 << 20);
    pr.reset_accumulated(); // the dead pool's entry goes
    EXPECT_EQ(pr.by_pool.size(), 1);
    EXPECT_EQ(pr.by_pool[two].current, 2 << 20);
    EXPECT_EQ(pr.by_pool[two].allocated, 0);
  }

  // Specs under PyTorch: shareable pages under a pool, a private pool's
  // sizes; what a spec says wins, by either of an option's names.
  {
    auto same = [](const std::string& a, const char* b) { return a == b ? 1 : 0; };
    EXPECT_EQ(same(spec_with_defaults("pool > cuda", true, false),
                   "pool(stream_heaps=1) > cuda(ipc=true)"), 1);
    EXPECT_EQ(same(spec_with_defaults("pool>cuda", false, false), "pool(stream_heaps=1) > cuda"), 1);
    EXPECT_EQ(same(spec_with_defaults("cuda", true, false), "cuda"), 1); // cudaMalloc memory
    EXPECT_EQ(same(spec_with_defaults("fixed_size > cuda", true, false), "fixed_size > cuda"), 1);
    EXPECT_EQ(same(spec_with_defaults("binning > pool(expandable=false) > cuda", true, false),
                   "binning > pool(expandable=false, stream_heaps=1) > cuda(ipc=true)"),
              1);
    EXPECT_EQ(same(spec_with_defaults("arena > cuda", true, false), "arena > cuda(ipc=true)"), 1);
    EXPECT_EQ(same(spec_with_defaults("pool > cuda(ipc=false)", true, false),
                   "pool(stream_heaps=1) > cuda(ipc=false)"),
              1);
    EXPECT_EQ(same(spec_with_defaults("pool > cuda( IPC = false )", true, false),
                   "pool(stream_heaps=1) > cuda(IPC = false)"),
              1);
    EXPECT_EQ(same(spec_with_defaults("pool > cuda_async", true, false),
                   "pool(stream_heaps=1) > cuda_async"), 1);
    EXPECT_EQ(same(spec_with_defaults("pool > cuda", true, true),
                   "pool(small_chunk=2MiB, min_growth=2MiB, page=1TiB, stream_heaps=1) > cuda(ipc=true)"),
              1);
    EXPECT_EQ(same(spec_with_defaults("statistics > pool(initial=1GiB, page_size=64MiB) > cuda",
                                      false, true),
                   "statistics > pool(initial=1GiB, page_size=64MiB, small_chunk=2MiB, "
                   "min_growth=2MiB, stream_heaps=1) > cuda"),
              1);
    EXPECT_EQ(same(spec_with_defaults("pool(small_max=4MiB, min_growth=1GiB) > cuda", false, true),
                   "pool(small_max=4MiB, min_growth=1GiB, page=1TiB, stream_heaps=1) > cuda"),
              1);
    EXPECT_EQ(same(spec_with_defaults("pool(stream_heaps=0) > cuda", false, false),
                   "pool(stream_heaps=0) > cuda"),
              1);
    // Not split: returned as it is, for the parser to explain.
    EXPECT_EQ(same(spec_with_defaults("pool(initial=1GiB > cuda", true, true),
                   "pool(initial=1GiB > cuda"),
              1);
    EXPECT_EQ(same(spec_with_defaults("pool) > cuda", true, true), "pool) > cuda"), 1);
    EXPECT_EQ(same(config_with_defaults("pool > cuda"),
                   "pool(stream_heaps=1) > cuda(ipc=true)"), 1);
    EXPECT_EQ(same(config_with_defaults("0: pool > cuda; 1-3: cuda;*:arena>cuda(ipc=false)"),
                   "0: pool(stream_heaps=1) > cuda(ipc=true); 1-3: cuda;*: arena > cuda(ipc=false)"),
              1);
    EXPECT_EQ(same(config_with_defaults(""), ""), 1);
    EXPECT_EQ(same(base_layer("statistics > pool(initial=1GiB) > cuda(ipc=true)"),
                   "cuda(ipc=true)"),
              1);
    EXPECT_EQ(same(base_layer("cuda_async"), "cuda_async"), 1);
    EXPECT_EQ(same(base_layer("pool(x=1 > cuda"), "pool(x=1 > cuda"), 1);
  }

  EXPECT_EQ(std::string(format_size(512)) == "512 bytes", 1);
  EXPECT_EQ(std::string(format_size(20ull << 30)) == "20.00 GiB", 1);
  EXPECT_EQ(std::string(format_size(3u << 20)) == "3.00 MiB", 1);
  EXPECT_EQ(std::string(format_size(1536)) == "1.50 KiB", 1);

  // The resets reach every Stat of the five arrays, and only those.
  {
    Counters r;
    count_block(r, 100, true);
    count_block(r, 100, false);
    count_active(r, 100, true);
    r.num_ooms = 1;
    size_t visited = 0;
    r.for_each_reset_stat([&](Stat& st) {
      visited++;
      st.reset_peak();
    });
    EXPECT_EQ(visited, 5 * r.allocation.size());
    EXPECT_EQ(r.allocation[0].peak, 0);
    EXPECT_EQ(r.requested_bytes[0].peak, 0);
    EXPECT_EQ(r.active_bytes[0].peak, 512);
    EXPECT_EQ(r.allocated_bytes[0].freed, 512); // reset_peak leaves the totals
    r.for_each_reset_stat([](Stat& st) { st.reset_accumulated(); });
    EXPECT_EQ(r.allocated_bytes[0].freed, 0);
    EXPECT_EQ(r.active[0].allocated, 0);
    EXPECT_EQ(r.num_ooms, 1);
  }
  if (failures == 0)
    std::printf("torch-native selftest: all checks passed\n");
  return failures == 0 ? 0 : 1;
}

#else // !RMMC_TORCH_NATIVE_SELFTEST
// ---- the allocator ----

#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>
#include <rmmc/defaults.h>
#include <rmmc/ipc.h>
#include <rmmc/registry.h>
#include <rmmc/resource.h>
#include <rmmc/resource_ops.h>
#include <rmmc/spec.h>
#include <rmmc/status.h>
#include <rmmc/stream.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rmmc_torch {

namespace CCA = c10::cuda::CUDACachingAllocator;
using AnnotationEntryT = decltype(CCA::SnapshotInfo::external_annotations)::value_type;
using c10::DeviceIndex;
using c10::MempoolId_t;
using CCA::SegmentInfo;
using CCA::TraceEntry;

struct MempoolHash {
  size_t operator()(const MempoolId_t& id) const noexcept {
    return std::hash<unsigned long long>()(id.first * 1000003ULL ^ id.second);
  }
};

// What one stack holds, as its memory hooks report it: the snapshot's
// segments, and the SEGMENT_ALLOC / SEGMENT_FREE trace entries the trackers
// PyTorch attaches hear (ProcessGroupNCCL registers a registered pool's new
// segments with NCCL on SEGMENT_ALLOC and deregisters them on SEGMENT_FREE,
// which comes before the pages go). The hooks run under the pool's lock on
// the thread that grows or trims it. The user hooks of `ranges`: those
// rmmc.set_memory_hooks(device=) gave for the device's default stack
// (rmmc_torch_native_set_memory_hooks), so the backend and the user share
// the stack's one hook slot.
//
// The bytes its ranges add up to (`held`: the stack's reserved bytes, kept
// by the hooks) are summed per device (`device_held`), which the memory
// fraction is checked against as PyTorch checks its reserved bytes; `out`
// is the backend's blocks in the stack (their rounded sizes, under the
// device lock), so held - out is what the stack caches free.
struct SegmentTable {
  DeviceIndex device = 0;
  MempoolId_t pool{0, 0};
  std::atomic<bool> hooked{false};     // the stack took the hooks (a pool is in it)
  std::atomic<bool> expandable{false}; // its ranges are page mappings
  SegmentRanges ranges;
  std::atomic<int64_t> held{0};
  std::atomic<int64_t>* device_held = nullptr;
  int64_t out = 0;
};

// A private pool: an rmmc stack of its own. A pool over another
// CUDAAllocator (torch.cuda.MemPool(allocator=...)) is a pool layer over
// that allocator (allocator_stack): it caches what the allocator handed out,
// as PyTorch's private pools do, and gives it back at emptyCache or death.
struct Pool {
  MempoolId_t id;
  DeviceIndex device = 0;
  rmmc_resource_t* stack = nullptr;               // owned (one reference)
  std::shared_ptr<SegmentTable> segments;         // outlives the stack
  std::shared_ptr<CCA::CUDAAllocator> allocator;  // the stack's memory comes from it
  int use_count = 0;
  size_t live = 0;          // blocks out (zombies included)
  bool use_on_oom = false;
  std::string spec;         // its stack's spec; empty: the device's default
  bool no_split = false;    // setNoSplit: its stack is the spec's base layer alone
};

// The spec the calling thread's new private pools get instead of the
// device's default (rmmc.torch.pool_spec; empty: the default). A pool takes
// it when it is first named (MemPool's constructor, a capture's
// beginAllocateToPool), on the thread that names it.
thread_local std::string tls_pool_spec;

// A block handed to PyTorch.
struct Block {
  size_t size = 0;          // as requested
  cudaStream_t stream = nullptr;
  DeviceIndex device = 0;
  Pool* pool = nullptr;     // nullptr: the device's default stack
  rmmc_resource_t* res = nullptr; // the stack it came from (borrowed)
  SegmentTable* table = nullptr;  // that stack's (its pool's or the device's)
  bool unhooked = false;    // counted in DeviceState::unhooked (a stack without hooks)
  std::vector<cudaStream_t> streams; // recorded by recordStream
  std::shared_ptr<c10::GatheredContext> context;
  bool zombie = false;      // freed by PyTorch, kept for a checkpoint
  bool active = true;       // counted in the active figures
  int checkpoints = 0;      // checkpoint states that hold it
  std::string ipc;          // the handle shareIpcHandle made, if any
  std::vector<int> ipc_fds; // descriptors it refers to (closed at free)
};

// A block freed with recorded streams, and the events recorded on them at
// the free: it goes back to its stack once they are complete.
struct Pending {
  void* ptr = nullptr;
  Block block;
  std::vector<cudaEvent_t> events;
};

// A block freed with recorded streams while one of its streams was being
// captured. `markers`: with graph_capture_record_stream_reuse, the nodes
// that ended each of its streams' work in the capture graph at the free
// (every stream capturing into one graph); empty: it waits for the end of
// the capture.
struct Deferred {
  void* ptr = nullptr;
  Block block;
  std::vector<cudaGraphNode_t> markers;
};

struct Route {
  MempoolId_t id;
  std::function<bool(cudaStream_t)> filter;
  // Learnt at its first allocation: a capture's route (the stream was being
  // captured) or another's (a MemPool's, use_mem_pool); unknown before.
  enum Kind { UNKNOWN, CAPTURE, OTHER } kind = UNKNOWN;
  cudaStream_t stream = nullptr; // the stream of that first allocation
  // Who began it: the thread and its current stream then (a capture begins
  // on that stream, on that thread, right after).
  std::thread::id thread;
  cudaStream_t begin_stream = nullptr;
};

// Is `s` being captured into a graph? An error reads as `on_error`: yes
// before a stream-ordered call on it (the safe answer), and for a route's
// stream that can no longer be asked (destroyed since) no, unless the
// error says a capture uses the legacy stream implicitly.
inline bool stream_capturing(cudaStream_t s, bool on_error = true) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(s, &st);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return on_error || err == cudaErrorStreamCaptureImplicit;
  }
  return st != cudaStreamCaptureStatusNone;
}

// PyTorch's OomRejectionObserver (2.12+): device, the request, the bytes
// allocated before it, the device's total.
using OomRejectionFn = std::function<void(int64_t, size_t, size_t, size_t)>;

struct DeviceState {
  std::mutex mutex; // everything below, and the blocks of this device
  rmmc_resource_t* stack = nullptr; // the registry's resource (one reference)
  SegmentTable segments; // what `stack` holds (never destroyed, as the stack)
  std::unordered_map<void*, Block> blocks;
  std::unordered_map<MempoolId_t, std::unique_ptr<Pool>, MempoolHash> pools;
  std::vector<Route> routes; // beginAllocateToPool, oldest first
  int captures = 0; // markCaptureBegin less markCaptureEnd (2.13+)
  // Blocks PyTorch freed with recorded streams while one of their streams
  // was being captured: given back once no capture may be underway, or,
  // with graph_capture_record_stream_reuse, once the capture graph orders
  // their stream's next work after every marker (reuse_in_capture).
  std::vector<Deferred> deferred;
  std::atomic<size_t> ndeferred{0}; // deferred.size(), read without the lock
  std::atomic<size_t> nmarked{0};   // of which have markers
  // Per (capture id, stream): the graph nodes found to precede the stream's
  // work so far (reuse_in_capture's walks, never repeated).
  std::map<std::pair<unsigned long long, cudaStream_t>, std::unordered_set<cudaGraphNode_t>>
      visited;
  // Blocks freed with recorded streams, each waiting for the events
  // recorded on those streams at the free (release_block).
  std::vector<Pending> pending;
  std::atomic<size_t> npending{0};
  std::vector<cudaEvent_t> free_events; // recorded and found complete: reused
  Counters counters;
  ResetBase base;
  StackFigures retired; // grows and shrinks of private pools destroyed
  PoolReserved pool_reserved; // reserved_bytes_by_private_pools
  std::atomic<bool> fraction_set{false}; // a fraction below 1 is set (0 is one too)
  double fraction = 0;
  size_t limit = 0; // bytes the device's stacks may reserve (with fraction_set)
  size_t total = 0; // the device's bytes when the fraction was set
  // What the device's stacks reserve: the ranges their hooks report, and
  // the blocks of stacks without hooks (their own memory each).
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> unhooked{0};
};

inline int64_t device_reserved(const DeviceState& d) {
  return d.held.load(std::memory_order_relaxed) + d.unhooked.load(std::memory_order_relaxed);
}

// May a CUDA graph capture be underway on the device? Then nothing may
// synchronize the device, free memory to the driver or destroy a stack (a
// capture's stream, or the device, would be synchronized: CUDA refuses
// that and invalidates the capture). PyTorch begins routing to a capture's
// private pool before it begins the capture and ends it after
// (beginAllocateToPool / endAllocateToPool); a route counts until its
// first allocation shows what it is: a MemPool's (use_mem_pool) then
// counts no more, nor a capture's whose stream no longer captures (a
// capture CUDA invalidated: PyTorch's capture_end throws before it ends
// the routing, which then stays). A route nothing was allocated through
// yet counts for other threads (their call may come between its
// beginAllocateToPool and the capture's begin); on the thread that began
// it, it counts only while the stream current then captures: that thread
// is here, not beginning a capture, so a capture of that route is either
// underway on that stream or not at all (one that failed before allocating
// anything leaves such a route behind). 2.13+ also says when a capture
// starts and ends (markCaptureBegin / markCaptureEnd). Device lock held.
inline bool capture_possible(const DeviceState& d) {
  if (d.captures > 0)
    return true;
  for (const Route& r : d.routes) {
    if (r.kind == Route::UNKNOWN) {
      if (r.thread != std::this_thread::get_id() || stream_capturing(r.begin_stream, false))
        return true;
    } else if (r.kind == Route::CAPTURE && stream_capturing(r.stream, false)) {
      return true;
    }
  }
  return false;
}

// What getCheckpointState keeps: the blocks of a pool live then.
struct CheckpointState : CCA::AllocatorState {
  DeviceIndex device = 0;
  MempoolId_t id;
  std::vector<std::pair<void*, size_t>> live; // pointer, size
  ~CheckpointState() override;
};

class RmmcAllocator;
RmmcAllocator* the_allocator = nullptr;

void raw_delete_fn(void* ptr);
void install_segment_hooks(rmmc_resource_t* stack, SegmentTable* t);

// A private pool's stack and its segments, taken out of the pool to be
// destroyed outside the device lock.
struct Reaped {
  rmmc_resource_t* stack = nullptr;
  std::shared_ptr<SegmentTable> segments;
  MempoolId_t id{0, 0};
};

// Sums one stack's figures into *f (the first layer from the top that
// reports "reserved" is the cache).
void add_stack_figures(rmmc_resource_t* stack, StackFigures* f) {
  for (rmmc_resource_t* r = stack; r != nullptr; r = rmmc_resource_upstream(r)) {
    uint64_t v = 0;
    if (!rmmc_resource_get_field(r, "reserved", &v))
      continue;
    f->has_cache = true;
    f->reserved += v;
    if (rmmc_resource_get_field(r, "reserved_peak", &v))
      f->reserved_peak += v;
    if (rmmc_resource_get_field(r, "regions", &v))
      f->regions += v;
    if (rmmc_resource_get_field(r, "grows", &v))
      f->grows += v;
    if (rmmc_resource_get_field(r, "shrinks", &v))
      f->shrinks += v;
    if (rmmc_resource_get_field(r, "device_syncs", &v))
      f->device_syncs += v;
    return;
  }
}

uint64_t largest_free(rmmc_resource_t* stack) {
  for (rmmc_resource_t* r = stack; r != nullptr; r = rmmc_resource_upstream(r)) {
    uint64_t v = 0;
    if (rmmc_resource_get_field(r, "largest_free", &v))
      return v;
  }
  return 0;
}

// Switches the calling thread to the relaxed capture mode for a scope, as
// PyTorch's CUDAStreamCaptureModeGuard: a call that would be unsafe during
// a global-mode capture (building a stack, a driver allocation) then
// neither fails nor invalidates one another thread (or this one) has
// underway.
struct CaptureRelaxed {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  bool swapped;
  CaptureRelaxed() : swapped(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) {
    if (!swapped)
      (void)cudaGetLastError();
  }
  ~CaptureRelaxed() {
    if (swapped)
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
  }
  CaptureRelaxed(const CaptureRelaxed&) = delete;
  CaptureRelaxed& operator=(const CaptureRelaxed&) = delete;
};

// A CUDA failure that is the device running out of memory counts as out
// of memory (PyTorch raises OutOfMemoryError for it too).
rmmc_status_t as_oom(rmmc_status_t st) {
  if (st == RMMC_ERROR_CUDA && rmmc_last_cuda_error() == cudaErrorMemoryAllocation)
    return RMMC_ERROR_OUT_OF_MEMORY;
  return st;
}

std::string last_error() {
  const char* m = rmmc_last_error_message();
  return m != nullptr ? m : "";
}

// ---- capture graphs (graph_capture_record_stream_reuse) ----

// What cudaStreamGetCaptureInfo says of a stream: its capture's id, graph
// and the nodes the stream's next work will depend on (its terminals).
struct CaptureInfo {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* terminals = nullptr;
  size_t nterminals = 0;
};

// False if the stream cannot be asked (its status then reads as none).
inline bool capture_info(cudaStream_t s, CaptureInfo* ci) {
#if CUDART_VERSION >= 13000
  cudaError_t err = cudaStreamGetCaptureInfo(s, &ci->status, &ci->id, &ci->graph, &ci->terminals,
                                             nullptr, &ci->nterminals);
#else
  cudaError_t err = cudaStreamGetCaptureInfo_v2(s, &ci->status, &ci->id, &ci->graph,
                                                &ci->terminals, &ci->nterminals);
#endif
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *ci = CaptureInfo{};
    return false;
  }
  return true;
}

// The nodes a graph node depends on (empty if it cannot be asked).
inline std::vector<cudaGraphNode_t> node_parents(cudaGraphNode_t n) {
  size_t count = 0;
#if CUDART_VERSION >= 13000
  if (cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::vector<cudaGraphNode_t> out(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count != 0 && cudaGraphNodeGetDependencies(n, out.data(), edges.data(), &count) != cudaSuccess) {
#else
  if (cudaGraphNodeGetDependencies(n, nullptr, &count) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::vector<cudaGraphNode_t> out(count);
  if (count != 0 && cudaGraphNodeGetDependencies(n, out.data(), &count) != cudaSuccess) {
#endif
    (void)cudaGetLastError();
    return {};
  }
  out.resize(count);
  return out;
}

// PyTorch's free markers: the terminal nodes, at the free, of the block's
// stream and of every stream recorded on it. A block whose streams do not
// all capture into one graph gets none (it waits for the capture's end).
inline std::vector<cudaGraphNode_t> free_markers(const Block& b) {
  std::unordered_set<cudaGraphNode_t> set;
  cudaGraph_t graph = nullptr;
  auto add = [&](cudaStream_t s) {
    CaptureInfo ci;
    if (!capture_info(s, &ci) || ci.status != cudaStreamCaptureStatusActive ||
        (graph != nullptr && ci.graph != graph))
      return false;
    graph = ci.graph;
    set.insert(ci.terminals, ci.terminals + ci.nterminals);
    return true;
  };
  if (!add(b.stream))
    return {};
  for (cudaStream_t s : b.streams)
    if (!add(s))
      return {};
  return std::vector<cudaGraphNode_t>(set.begin(), set.end());
}

// ---- another CUDAAllocator as an rmmc resource ----
//
// The memory of a MemPool(allocator=...): what the allocator's raw_alloc
// hands out (on the stream rmmc asks with), given back with its raw_delete.
// A pool layer over it caches as PyTorch's private pool does over its
// allocator. Nothing here may throw into rmmc.
struct AllocatorResource {
  rmmc_resource_t base; // first: what rmmc sees
  std::shared_ptr<CCA::CUDAAllocator> allocator;
  DeviceIndex device = 0;
};

rmmc_status_t allocator_allocate(rmmc_resource_t* r, size_t bytes, size_t alignment,
                                 cudaStream_t stream, void** out) {
  auto* a = reinterpret_cast<AllocatorResource*>(r);
  void* p = nullptr;
  try {
    c10::cuda::CUDAGuard guard(a->device);
    p = a->allocator->raw_alloc_with_stream(bytes, stream);
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    return rmmc_set_oom_error(r, bytes, stream, "the MemPool's allocator refused: %s", e.what());
  }
  if (p == nullptr)
    return rmmc_set_oom_error(r, bytes, stream, "the MemPool's allocator returned no memory");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    try {
      a->allocator->raw_delete(p);
    } catch (const std::exception&) {
    }
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "the MemPool's allocator returned %p, not %zu-byte aligned", p,
                          alignment);
  }
  *out = p;
  return RMMC_SUCCESS;
}

rmmc_status_t allocator_deallocate(rmmc_resource_t* r, void* ptr, size_t, size_t, cudaStream_t) {
  auto* a = reinterpret_cast<AllocatorResource*>(r);
  try {
    c10::cuda::CUDAGuard guard(a->device);
    a->allocator->raw_delete(ptr);
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    return rmmc_set_error(RMMC_ERROR_CUDA, "the MemPool's allocator could not free %p: %s", ptr,
                          e.what());
  }
  return RMMC_SUCCESS;
}

void allocator_destroy(rmmc_resource_t* r) {
  delete reinterpret_cast<AllocatorResource*>(r);
}

const rmmc_resource_ops_t* allocator_ops() {
  static const rmmc_resource_ops_t ops = [] {
    rmmc_resource_ops_t o;
    std::memset(&o, 0, sizeof o);
    o.version = RMMC_RESOURCE_OPS_VERSION;
    o.name = "torch_allocator";
    o.allocate = allocator_allocate;
    o.deallocate = allocator_deallocate;
    o.destroy = allocator_destroy;
    return o;
  }();
  return &ops;
}

// One reference to a new resource over `allocator` on `device`.
rmmc_resource_t* allocator_resource(std::shared_ptr<CCA::CUDAAllocator> allocator,
                                    DeviceIndex device) {
  auto* a = new AllocatorResource;
  rmmc_resource_init(&a->base, allocator_ops(), RMMC_MEMORY_DEVICE, device);
  a->allocator = std::move(allocator);
  a->device = device;
  return &a->base;
}

// The pool layer over another allocator: PyTorch's private pool over it
// takes 2 MiB segments for requests up to 1 MiB and one segment per larger
// request (rounded to 2 MiB), best fit among what it caches; so does a
// chunked pool without stream heaps growing by at least 2 MiB.
constexpr const char* kAllocatorPoolSpec =
    "pool(expandable=false, small_max=0, min_growth=2MiB, stream_heaps=1)";

class RmmcAllocator final : public CCA::CUDAAllocator {
 public:
  // ---- c10::Allocator ----
  c10::DataPtr allocate(size_t size) override {
    DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* p = alloc_block(size, device, stream);
    return {p, p, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &raw_delete_fn;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- raw ----
  void* raw_alloc(size_t nbytes) override {
    DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc_block(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc_block(nbytes, device, stream);
  }
  void raw_delete(void* ptr) override {
    free_block(ptr);
  }

  // ---- life ----
  void init(int device_count) override {
    count_ = std::min(std::max(device_count, 0), kMaxDevices);
    initialized_ = true;
  }
  bool initialized() override {
    return initialized_;
  }
  void enable(bool value) override {
    enabled_ = value;
  }
  bool isEnabled() const override {
    return enabled_;
  }
  std::string name() override {
    return "rmmc";
  }

  // ---- limits and caches ----
  double getMemoryFraction(DeviceIndex device) override {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    // As PyTorch's: the bytes allowed over the device's total, not the
    // fraction asked for (the two differ by the rounding to bytes).
    return !d.fraction_set || d.total == 0
               ? 1.0
               : static_cast<double>(d.limit) / static_cast<double>(d.total);
  }
  void setMemoryFraction(double fraction, DeviceIndex device) override {
    // PyTorch's range: 0 (nothing more may be allocated) to 1.
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "rmmc: invalid memory fraction ", fraction,
                " (0 <= fraction <= 1)");
    size_t free = 0, total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    }
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    // As PyTorch's: 1 is no limit at all; below it, the bytes the device's
    // stacks may reserve (what they hold, free memory included).
    d.fraction_set = fraction < 1;
    d.fraction = fraction;
    d.limit = static_cast<size_t>(fraction * static_cast<double>(total));
    d.total = total;
  }
  // Gives back what the device's caches hold: the default stack's and
  // those of the private pools nothing uses any more (as PyTorch's own: a
  // live pool's free memory may be a graph's); released pools with nothing
  // out are destroyed. With a pool id, that pool's. Nothing while a capture
  // may be underway on the device (as PyTorch, which releases nothing of
  // its default pool then): giving memory back synchronizes.
  void emptyCache(MempoolId_t mempool_id) override {
    for (int i = 0; i < ndev(); i++) {
      DeviceState& d = devices_[i];
      std::vector<rmmc_resource_t*> stacks;
      std::vector<Reaped> dead;
      {
        std::lock_guard<std::mutex> g(d.mutex);
        if (capture_possible(d))
          continue;
        for (auto it = d.pools.begin(); it != d.pools.end();) {
          Pool& p = *it->second;
          const bool mine = mempool_id == MempoolId_t{0, 0} || p.id == mempool_id;
          if (mine && p.use_count == 0 && p.live == 0) {
            dead.push_back(take_pool_locked(d, it++));
            continue;
          }
          if (mine && p.stack != nullptr && (p.use_count == 0 || p.id == mempool_id))
            stacks.push_back(rmmc_resource_retain(p.stack));
          ++it;
        }
        if (mempool_id == MempoolId_t{0, 0} && d.stack != nullptr)
          stacks.push_back(rmmc_resource_retain(d.stack));
      }
      give_back_deferred(d);
      give_back_pending(d, true);
      for (Reaped& r : dead)
        destroy_pool_stack(d, std::move(r));
      for (rmmc_resource_t* s : stacks) {
        rmmc_status_t st = rmmc_resource_release_cached(s);
        std::string msg = last_error();
        rmmc_resource_release(s);
        TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: emptyCache: ", msg);
      }
    }
  }
  void cacheInfo(DeviceIndex device, size_t* largestBlock) override {
    if (*largestBlock == 0) {
      size_t total = 0;
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(largestBlock, &total));
    }
    DeviceState& d = dev(device);
    std::vector<rmmc_resource_t*> stacks;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (d.stack != nullptr)
        stacks.push_back(rmmc_resource_retain(d.stack));
    }
    for (rmmc_resource_t* s : stacks) {
      *largestBlock = std::max<size_t>(*largestBlock, largest_free(s));
      rmmc_resource_release(s);
    }
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    // The block itself: shareIpcHandle exports exactly the block.
    DeviceState* d = find_device(ptr);
    TORCH_CHECK(d != nullptr, "rmmc: getBaseAllocation: unknown pointer ", ptr);
    std::lock_guard<std::mutex> g(d->mutex);
    if (size != nullptr)
      *size = d->blocks.at(ptr).size;
    return ptr;
  }
#if RMMC_TORCH_AT_LEAST(2, 10)
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex) override {
    return {}; // rmmc's pool has no per-stream expandable segments
  }
#endif

  // ---- streams ----
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &raw_delete_fn)
      return; // not ours (PyTorch ignores those too)
    DeviceState* d = find_device(ptr.get());
    if (d == nullptr)
      return;
    std::lock_guard<std::mutex> g(d->mutex);
    Block& b = d->blocks.at(ptr.get());
    if (stream.stream() == b.stream)
      return;
    if (std::find(b.streams.begin(), b.streams.end(), stream.stream()) == b.streams.end()) {
      b.streams.push_back(stream.stream());
      d->counters.recorded_streams++;
    }
  }

  // ---- statistics ----
  DeviceStats getDeviceStats(DeviceIndex device) override {
    DeviceState& d = dev(device);
    std::vector<std::pair<MempoolId_t, uint64_t>> per_pool;
    StackFigures f = figures(d, &per_pool);
    std::lock_guard<std::mutex> g(d.mutex);
    for (auto& pr : per_pool)
      d.pool_reserved.sample({pr.first.first, pr.first.second}, pr.second);
    DeviceStats s = fill_device_stats(d.counters, f, d.base);
#if RMMC_TORCH_AT_LEAST(2, 13)
    for (auto& kv : d.pool_reserved.by_pool) {
      StatArray row;
      row[0] = kv.second;
      row[2] = kv.second; // rmmc's pool has one heap: the large row, as reserved_bytes
      s.reserved_bytes_by_private_pools[MempoolId_t{kv.first.first, kv.first.second}] = row;
    }
#endif
    return s;
  }
  void resetAccumulatedStats(DeviceIndex device) override {
    DeviceState& d = dev(device);
    StackFigures f = figures(d);
    std::lock_guard<std::mutex> g(d.mutex);
    d.counters.for_each_reset_stat([](Stat& s) { s.reset_accumulated(); });
    d.counters.num_ooms = 0;
    d.counters.num_oom_rejections = 0;
    d.counters.num_alloc_retries = 0;
    d.counters.num_sync_all_streams = 0;
    d.base.grows_at_reset = f.grows;
    d.base.shrinks_at_reset = f.shrinks;
    d.pool_reserved.reset_accumulated();
  }
  void resetPeakStats(DeviceIndex device) override {
    DeviceState& d = dev(device);
    StackFigures f = figures(d);
    std::lock_guard<std::mutex> g(d.mutex);
    d.counters.for_each_reset_stat([](Stat& s) { s.reset_peak(); });
    d.pool_reserved.reset_peak();
    d.base.reserved_peak_at_reset = f.reserved_peak;
    d.base.reserved_at_reset = f.reserved;
    d.base.regions_peak = f.regions;
  }

  // ---- private pools ----
#if RMMC_TORCH_AT_LEAST(2, 11)
  void createOrIncrefPool(DeviceIndex device, MempoolId_t id,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
#else
  void createOrIncrefPool(DeviceIndex device, MempoolId_t id,
                          CCA::CUDAAllocator* raw) override {
    // PyTorch keeps the allocator alive as long as the MemPool holding it.
    std::shared_ptr<CCA::CUDAAllocator> allocator(raw, [](CCA::CUDAAllocator*) {});
    if (raw == nullptr)
      allocator.reset();
#endif
    DeviceState& d = dev(device);
    {
      std::lock_guard<std::mutex> g(d.mutex);
      Pool& p = pool_locked(d, device, id);
      if (allocator && !p.allocator && p.stack == nullptr)
        p.allocator = std::move(allocator); // its stack is built over it (ensure_stack)
      p.use_count++;
    }
    try {
      ensure_stack(d, device, id);
    } catch (...) {
      undo_incref(d, id, false);
      throw;
    }
  }
  int getPoolUseCount(DeviceIndex device, MempoolId_t id) override {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    auto it = d.pools.find(id);
    return it == d.pools.end() ? 0 : it->second->use_count;
  }
  void beginAllocateToPool(DeviceIndex device, MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    DeviceState& d = dev(device);
    Route route;
    route.id = id;
    route.filter = std::move(filter);
    route.thread = std::this_thread::get_id();
    route.begin_stream = c10::cuda::getCurrentCUDAStream(device).stream();
    {
      std::lock_guard<std::mutex> g(d.mutex);
      pool_locked(d, device, id).use_count++;
      d.routes.push_back(std::move(route));
    }
    // Now, before PyTorch begins the capture: building a stack calls CUDA.
    try {
      ensure_stack(d, device, id);
    } catch (...) {
      undo_incref(d, id, true);
      throw;
    }
  }
  // Takes back what a create or begin that failed did (nothing leaks).
  void undo_incref(DeviceState& d, MempoolId_t id, bool routed) {
    Reaped dead;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (routed) {
        for (auto it = d.routes.rbegin(); it != d.routes.rend(); ++it) {
          if (it->id == id) {
            d.routes.erase(std::next(it).base());
            break;
          }
        }
      }
      auto it = d.pools.find(id);
      if (it != d.pools.end()) {
        it->second->use_count--;
        dead = reap_locked(d, it);
      }
    }
    destroy_pool_stack(d, std::move(dead));
  }
  void endAllocateToPool(DeviceIndex device, MempoolId_t id) override {
    DeviceState& d = dev(device);
    bool found = false;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      for (auto it = d.routes.begin(); it != d.routes.end(); ++it) {
        if (it->id == id) {
          d.routes.erase(it);
          found = true;
          break;
        }
      }
      // The graph walks of captures that have ended are of no more use.
      for (auto it = d.visited.begin(); it != d.visited.end();) {
        CaptureInfo ci;
        const bool live = capture_info(it->first.second, &ci) &&
                          ci.status == cudaStreamCaptureStatusActive && ci.id == it->first.first;
        it = live ? std::next(it) : d.visited.erase(it);
      }
    }
    TORCH_CHECK(found, "rmmc: endAllocateToPool: pool (", id.first, ", ", id.second,
                ") is not being allocated to");
    give_back_deferred(d); // frees of the capture that waited for its end
  }
#if RMMC_TORCH_AT_LEAST(2, 13)
  // A capture really began or ended on the device (PyTorch 2.13+): counted
  // with the routes as a capture that may be underway.
  void markCaptureBegin(DeviceIndex device) override {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    d.captures++;
  }
  void markCaptureEnd(DeviceIndex device) override {
    DeviceState& d = dev(device);
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (d.captures > 0)
        d.captures--;
    }
    give_back_deferred(d);
  }
#endif
  void releasePool(DeviceIndex device, MempoolId_t id) override {
    DeviceState& d = dev(device);
    Reaped dead;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      auto it = d.pools.find(id);
      TORCH_CHECK(it != d.pools.end(), "rmmc: releasePool: unknown pool (", id.first, ", ",
                  id.second, ")");
      TORCH_CHECK(it->second->use_count > 0, "rmmc: releasePool: pool (", id.first, ", ",
                  id.second, ") released more often than created");
      it->second->use_count--;
      dead = reap_locked(d, it);
    }
    destroy_pool_stack(d, std::move(dead));
    give_back_deferred(d);
  }
#if RMMC_TORCH_AT_LEAST(2, 11)
  void setUseOnOOM(DeviceIndex device, MempoolId_t id, bool use_on_oom) override {
#else
  void setUseOnOOM(DeviceIndex device, MempoolId_t id) override {
    const bool use_on_oom = true;
#endif
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    pool_locked(d, device, id).use_on_oom = use_on_oom;
  }
#if RMMC_TORCH_AT_LEAST(2, 10)
  // MemPool(no_split=True): the pool never carves one allocation into
  // several blocks (what a registration per tensor, ncclMemAlloc-style,
  // needs): its stack becomes its spec's base layer alone (cuda), each
  // block its own allocation and its own segment in snapshots. PyTorch
  // calls it as the pool is made, before any block: the stack built then
  // has taken no memory, so replacing it synchronizes nothing.
  void setNoSplit(DeviceIndex device, MempoolId_t id) override {
    DeviceState& d = dev(device);
    Reaped old;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      Pool& p = pool_locked(d, device, id);
      if (p.no_split)
        return;
      TORCH_CHECK(p.live == 0, "rmmc: setNoSplit: pool (", id.first, ", ", id.second,
                  ") has blocks out already");
      if (p.stack != nullptr && capture_possible(d)) {
        // destroying even an unused stack synchronizes: keep it (splitting)
        TORCH_WARN("rmmc: setNoSplit during a capture: pool (", id.first, ", ", id.second,
                   ") keeps its splitting stack");
        return;
      }
      p.no_split = true;
      if (p.stack == nullptr)
        return; // a stack built at first use
      old = Reaped{p.stack, std::move(p.segments), p.id};
      p.stack = nullptr;
    }
    destroy_pool_stack(d, std::move(old));
    ensure_stack(d, device, id);
  }
#endif
  bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    auto it = d.pools.find(id);
    Pool* p = it == d.pools.end() ? nullptr : it->second.get();
    size_t live = 0;
    for (auto& kv : d.blocks) {
      if (kv.second.pool != p || p == nullptr || kv.second.zombie)
        continue;
      if (expected.count(kv.first) == 0)
        return false;
      live++;
    }
    return live == expected.size();
  }
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(DeviceIndex device,
                                                          MempoolId_t id) override {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    auto it = d.pools.find(id);
    auto state = std::make_shared<CheckpointState>();
    state->device = device;
    state->id = id;
    if (it == d.pools.end())
      return state; // a pool with nothing in it (PyTorch's would be empty too)
    for (auto& kv : d.blocks) {
      if (kv.second.pool == it->second.get() && !kv.second.zombie) {
        state->live.emplace_back(kv.first, kv.second.size);
        kv.second.checkpoints++;
      }
    }
    return state;
  }
  // Brings the pool back to the checkpoint: blocks live now but not then are
  // freed; blocks live then are live again at the same addresses. A block
  // a checkpoint holds is kept (a zombie) when PyTorch frees it, so it can
  // come back; it goes to rmmc when no checkpoint holds it any more.
  CCA::CheckpointDelta setCheckpointPoolState(
      DeviceIndex device, std::shared_ptr<CCA::AllocatorState> as) override {
    auto* state = dynamic_cast<CheckpointState*>(as.get());
    TORCH_CHECK(state != nullptr, "rmmc: setCheckpointPoolState: not an rmmc state");
    DeviceState& d = dev(device);
    CCA::CheckpointDelta delta;
    std::vector<void*> to_free;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      auto it = d.pools.find(state->id);
      if (it == d.pools.end()) {
        TORCH_CHECK(state->live.empty(), "rmmc: setCheckpointPoolState: the pool is gone");
        return delta;
      }
      std::unordered_set<void*> then;
      for (auto& pr : state->live)
        then.insert(pr.first);
      for (auto& kv : d.blocks) {
        if (kv.second.pool != it->second.get() || kv.second.zombie)
          continue;
        delta.ptrs_freed.push_back(kv.first);
        if (then.count(kv.first) == 0)
          to_free.push_back(kv.first);
      }
      for (auto& pr : state->live) {
        auto b = d.blocks.find(pr.first);
        TORCH_CHECK(b != d.blocks.end() && b->second.size == pr.second,
                    "rmmc: setCheckpointPoolState: block ", pr.first, " is gone");
        if (b->second.zombie) {
          b->second.zombie = false;
          b->second.active = true;
          count_block(d.counters, b->second.size, true);
          count_active(d.counters, b->second.size, true);
        }
        delta.dataptrs_allocd.emplace_back(pr.first, pr.first, &raw_delete_fn,
                                           c10::Device(c10::DeviceType::CUDA, device));
      }
    }
    for (void* p : to_free)
      free_block(p);
    return delta;
  }
  void release_checkpoint(CheckpointState* s) {
    if (s->device < 0 || s->device >= ndev())
      return;
    DeviceState& d = devices_[s->device];
    std::vector<void*> dead;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      for (auto& pr : s->live) {
        auto b = d.blocks.find(pr.first);
        if (b == d.blocks.end())
          continue;
        if (--b->second.checkpoints == 0 && b->second.zombie)
          dead.push_back(pr.first);
      }
    }
    for (void* p : dead)
      give_back(p);
  }

  // ---- history and snapshots ----
  void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, CCA::RecordContext when,
#if RMMC_TORCH_AT_LEAST(2, 11)
                     bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
#else
                     bool clearHistory) override {
    const std::vector<std::string> skip_actions;
#endif
    std::lock_guard<std::mutex> g(history_mutex_);
    history_ = enabled;
    tracing_ = enabled || !trackers_.empty();
    recorder_ = enabled ? context_recorder : nullptr;
    when_ = enabled ? when : CCA::RecordContext::NEVER;
    max_entries_ = std::max<size_t>(alloc_trace_max_entries, 1);
    skip_.clear();
    for (const std::string& a : skip_actions)
      skip_.insert(a);
    if (clearHistory) {
      trace_.clear();
      trace_next_ = 0;
      annotations_.clear();
      annotations_next_ = 0;
    }
    if (!enabled)
      compile_contexts_.clear();
  }
  bool isHistoryEnabled() override {
    return history_;
  }
  // record_function's annotations while history is on (the snapshot's
  // external_annotations), kept as the trace is.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!history_)
      return;
    DeviceIndex device = 0;
    if (c10::cuda::GetDevice(&device) != cudaSuccess)
      (void)cudaGetLastError();
    AnnotationEntryT ae(device, c10::getApproximateTime());
    for (const auto& kv : md)
      ae.recordUserMetadata(kv.first, kv.second);
    std::lock_guard<std::mutex> g(history_mutex_);
    if (annotations_.size() < max_entries_) {
      annotations_.push_back(std::move(ae));
    } else {
      annotations_[annotations_next_] = std::move(ae);
      annotations_next_ = (annotations_next_ + 1) % max_entries_;
    }
  }
  // torch.compile's regions (_record_memory_history(compile_context=True)):
  // the innermost is each trace entry's compile_context ("N/A" outside).
  void pushCompileContext(std::string& md) override {
    if (!history_)
      return;
    std::lock_guard<std::mutex> g(history_mutex_);
    compile_contexts_.push_back(md);
  }
  void popCompileContext() override {
    std::lock_guard<std::mutex> g(history_mutex_);
    if (!compile_contexts_.empty())
      compile_contexts_.pop_back();
  }
#if RMMC_TORCH_AT_LEAST(2, 10)
  // torch.cuda.memory._set_memory_metadata: a string every trace entry
  // recorded from now on carries.
  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> g(history_mutex_);
    user_metadata_ = metadata;
  }
  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> g(history_mutex_);
    return user_metadata_;
  }
#endif
#if RMMC_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override {
    return true;
  }
  // torch.cuda.memory._annotate_memory: an "annotate" trace entry for a
  // live block, the metadata its payload.
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    for (int i = 0; i < ndev(); i++) {
      DeviceState& d = devices_[i];
      size_t size = 0;
      cudaStream_t stream = nullptr;
      MempoolId_t pool{0, 0};
      {
        std::lock_guard<std::mutex> g(d.mutex);
        auto it = d.blocks.find(const_cast<void*>(ptr));
        if (it == d.blocks.end() || it->second.zombie)
          continue;
        size = it->second.size;
        stream = it->second.stream;
        if (it->second.pool != nullptr)
          pool = it->second.pool->id;
      }
      record(TraceEntry::ANNOTATE, static_cast<DeviceIndex>(i), reinterpret_cast<size_t>(ptr),
             size, stream, pool, nullptr, &metadata);
      return;
    }
    TORCH_CHECK(false, "rmmc: annotateMemory: ", ptr, " is not a live block rmmc handed out");
  }
#endif
#if RMMC_TORCH_AT_LEAST(2, 12)
  // The context history recorded when `ptr` (a live block) was allocated.
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    for (int i = 0; i < ndev(); i++) {
      std::lock_guard<std::mutex> g(devices_[i].mutex);
      auto it = devices_[i].blocks.find(const_cast<void*>(ptr));
      if (it != devices_[i].blocks.end())
        return it->second.zombie ? nullptr : it->second.context;
    }
    return nullptr;
  }
#endif
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(history_mutex_);
    oom_observers_.push_back(std::move(observer));
  }
#if RMMC_TORCH_AT_LEAST(2, 12)
  // Observers of the requests refused before reaching rmmc (the memory
  // fraction): PyTorch's preemptive rejection, which its
  // throw_on_cudamalloc_oom turns on; rmmc always refuses so.
  void attachOomRejectionObserver(CCA::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> g(history_mutex_);
    rejection_observers_.push_back(std::move(observer));
  }
#endif
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> g(history_mutex_);
    trackers_.push_back(std::move(tracker));
    tracing_ = true;
  }
#if RMMC_TORCH_AT_LEAST(2, 11)
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
#else
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id) override {
    const bool include_traces = true;
#endif
    CCA::SnapshotInfo info;
    for (int i = 0; i < ndev(); i++)
      snapshot_device(static_cast<DeviceIndex>(i), mempool_id, &info.segments);
    info.device_traces.resize(ndev());
    if (include_traces) {
      record(TraceEntry::SNAPSHOT, 0, 0, 0, nullptr, {0, 0}, nullptr);
      std::lock_guard<std::mutex> g(history_mutex_);
      auto to_unix = clock_.makeConverter();
      size_t n = trace_.size();
      for (size_t k = 0; k < n; k++) {
        TraceEntry te = trace_[(trace_next_ + k) % n];
        if (static_cast<size_t>(te.device_) < info.device_traces.size()) {
          te.time_.t_ = to_unix(te.time_.approx_t_);
          info.device_traces[te.device_].push_back(std::move(te));
        }
      }
      const size_t na = annotations_.size();
      for (size_t k = 0; k < na; k++) {
        AnnotationEntryT ae = annotations_[(annotations_next_ + k) % na];
        ae.time_.t_ = to_unix(ae.time_.approx_t_);
        info.external_annotations.push_back(std::move(ae));
      }
    }
    return info;
  }

  // ---- IPC (torch.multiprocessing) ----
  CCA::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // ---- peers and copies ----
  void enablePeerAccess(DeviceIndex dev_, DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev_);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
    // Memory rmmc maps itself (an expandable pool's pages) needs its own
    // access grant; chunks of cudaMalloc follow the context's.
    rmmc_resource_t* s = stack_of(dev_);
    rmmc_status_t st = rmmc_resource_enable_peer_access(s, dev_to_access);
    std::string msg = last_error();
    rmmc_resource_release(s);
    TORCH_CHECK(st == RMMC_SUCCESS || st == RMMC_ERROR_NOT_SUPPORTED,
                "rmmc: enablePeerAccess: ", msg);
  }
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override {
    // Pages rmmc maps itself need the Peer copy when P2P is off (as
    // cudaMallocAsync memory does); the Peer copy works for every kind.
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // ---- for rmmc.torch (tests and reports) ----
  rmmc_status_t set_user_hooks(DeviceIndex device, const rmmc_memory_hooks_t* hooks);
  // The stack of private pool `id` (one new reference), or nullptr.
  rmmc_resource_t* pool_stack(DeviceIndex device, MempoolId_t id) {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    auto it = d.pools.find(id);
    if (it == d.pools.end() || it->second->stack == nullptr)
      return nullptr;
    return rmmc_resource_retain(it->second->stack);
  }
  // The stack block `ptr` came from (one new reference), or nullptr for a
  // pointer rmmc did not hand out.
  rmmc_resource_t* block_stack(void* ptr) {
    for (int i = 0; i < ndev(); i++) {
      std::lock_guard<std::mutex> g(devices_[i].mutex);
      auto it = devices_[i].blocks.find(ptr);
      if (it != devices_[i].blocks.end())
        return it->second.res != nullptr ? rmmc_resource_retain(it->second.res) : nullptr;
    }
    return nullptr;
  }
  size_t pool_count(DeviceIndex device) {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    return d.pools.size();
  }
  // One line on the device's private pools and what keeps each: its id,
  // users (MemPools, graphs, routings), blocks out; the routings and the
  // frees that wait for captures to end.
  std::string pools_describe(DeviceIndex device) {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    std::string s;
    for (const auto& pr : d.pools) {
      const Pool& p = *pr.second;
      s += "(" + std::to_string(p.id.first) + "," + std::to_string(p.id.second) +
           "): users " + std::to_string(p.use_count) + ", blocks " + std::to_string(p.live) +
           (p.stack == nullptr ? ", no stack" : "") + "; ";
    }
    s += "routings " + std::to_string(d.routes.size()) + ", captures " +
         std::to_string(d.captures) + ", deferred frees " + std::to_string(d.deferred.size()) +
         " (" + std::to_string(d.nmarked.load()) + " with free markers), pending frees " +
         std::to_string(d.pending.size());
    return s;
  }
  // Bytes handed to PyTorch now, each block rounded as PyTorch rounds it
  // (what rmmc handed out).
  size_t bytes_out(DeviceIndex device) {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    return static_cast<size_t>(d.counters.allocated_bytes[0].current);
  }
  // rmmc.torch.stats() as the plug-in has it (rmmc_plugin_stats_t's order):
  // allocations, allocation_failures, deallocations, deallocation_failures,
  // unknown_frees, recorded_streams, live_blocks, bytes_in_use (rounded
  // as rmmc was asked for them, so what a statistics layer on the stack
  // counts), peak_bytes (of the same), limit. Not reset by resetPeakStats/resetAccumulatedStats, like the
  // plug-in's: they count since the backend started.
  static constexpr int kPluginStats = 10;
  void plugin_stats(DeviceIndex device, long long out[kPluginStats]) {
    DeviceState& d = dev(device);
    std::lock_guard<std::mutex> g(d.mutex);
    const Counters& c = d.counters;
    const long long v[kPluginStats] = {
        c.lifetime_allocations, c.lifetime_ooms, c.lifetime_frees, 0, 0,
        c.recorded_streams, c.allocation[0].current, c.allocated_bytes[0].current,
        c.lifetime_peak_allocated, static_cast<long long>(d.limit)};
    std::copy(v, v + kPluginStats, out);
  }
  // rmmc's message for the last allocation the backend refused ("" if none).
  // (Not named last_error: that is rmmc's thread-local message, above.)
  std::string last_oom_message() {
    std::lock_guard<std::mutex> g(history_mutex_);
    return last_oom_;
  }

  // ---- the block path ----
  void* alloc_block(size_t size, DeviceIndex device, cudaStream_t stream);
  rmmc_status_t try_stack(DeviceState& d, rmmc_resource_t* res, SegmentTable* t, size_t bytes,
                          cudaStream_t stream, bool grow, void** out, std::string* why,
                          bool* by_fraction);
  void reuse_in_capture(DeviceState& d, cudaStream_t stream);
  void free_block(void* ptr);
  void give_back(void* ptr);
  void give_back_deferred(DeviceState& d);
  void give_back_pending(DeviceState& d, bool wait);
  void release_block(DeviceState& d, void* ptr, Block&& b);
  void finish_release(DeviceState& d, void* ptr, Block&& b);

 private:
  // Devices PyTorch counted (init), or CUDA counts if init has not run.
  int ndev() {
    int n = count_.load(std::memory_order_relaxed);
    if (n == 0) {
      n = std::min(static_cast<int>(c10::cuda::device_count()), kMaxDevices);
      count_ = n;
    }
    return n;
  }
  DeviceState& dev(DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < ndev(), "rmmc: invalid device ",
                static_cast<int>(device), " (", ndev(), " devices)");
    return devices_[device];
  }
  DeviceState* find_device(void* ptr) {
    for (int i = 0; i < ndev(); i++) {
      std::lock_guard<std::mutex> g(devices_[i].mutex);
      if (devices_[i].blocks.count(ptr) != 0)
        return &devices_[i];
    }
    return nullptr;
  }
  // The device to look in first for a block being freed: the current one
  // (frees mostly happen where the block lives), else 0.
  int first_device() {
    int cur = 0;
    if (ndev() > 1 && cudaGetDevice(&cur) != cudaSuccess) {
      (void)cudaGetLastError();
      cur = 0;
    }
    return cur >= 0 && cur < ndev() ? cur : 0;
  }
  // The device's registry stack (one new reference), built on first use.
  rmmc_resource_t* stack_of(DeviceIndex device) {
    DeviceState& d = dev(device);
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (d.stack != nullptr)
        return rmmc_resource_retain(d.stack);
    }
    rmmc_resource_t* r = nullptr;
    rmmc_status_t st;
    {
      c10::cuda::CUDAGuard guard(device);
      CaptureRelaxed relaxed; // building a stack must not break a capture
      st = rmmc_get_device_resource(device, &r);
      std::string fallback;
      if (st == RMMC_ERROR_NOT_SUPPORTED && !(fallback = unshared_spec(device)).empty()) {
        // The device cannot share its pages: the stack the configuration
        // had before rmmc.torch made it shareable, installed as the default.
        rmmc_resource_t* built = nullptr;
        st = rmmc_stack_create(fallback.c_str(), device, &built);
        if (st == RMMC_SUCCESS) {
          st = rmmc_set_device_resource(device, built, nullptr);
          rmmc_resource_release(built);
        }
        if (st == RMMC_SUCCESS)
          st = rmmc_get_device_resource(device, &r);
      }
    }
    TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: no resource for device ", static_cast<int>(device),
                ": ", last_error());
    rmmc_resource_t* mine = nullptr;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (d.stack == nullptr) {
        d.stack = rmmc_resource_retain(r); // r is the registry's, borrowed
        d.segments.device = device;
        d.segments.device_held = &d.held;
        mine = rmmc_resource_retain(d.stack);
      }
    }
    if (mine != nullptr) {
      // Outside the device lock (the hooks hear what the stack holds now
      // under the pool's lock). The stack's hook slot is the backend's from
      // here on; users reach it through rmmc.set_memory_hooks(device=).
      install_segment_hooks(mine, &d.segments);
      rmmc_resource_release(mine);
    }
    std::lock_guard<std::mutex> g(d.mutex);
    return rmmc_resource_retain(d.stack);
  }
  Pool& pool_locked(DeviceState& d, DeviceIndex device, MempoolId_t id) {
    auto& slot = d.pools[id];
    if (!slot) {
      slot = std::make_unique<Pool>();
      slot->id = id;
      slot->device = device;
      slot->spec = tls_pool_spec;
    }
    return *slot;
  }
  // Builds a pool's stack from `chosen` (rmmc.torch.pool_spec), or else the
  // device's spec (outside the device lock), with its memory hooks
  // reporting to *segments.
  // Builds a pool's stack from `chosen` (rmmc.torch.pool_spec), or else the
  // device's spec (outside the device lock), with a private pool's
  // defaults (spec_with_defaults) and, under rmmc.torch.use(), shareable
  // pages; where the device cannot share them, without. Its memory hooks
  // report to *segments.
  rmmc_resource_t* build_pool_stack(DeviceIndex device, const std::string& chosen,
                                    SegmentTable* segments, bool no_split,
                                    const std::shared_ptr<CCA::CUDAAllocator>& allocator) {
    if (allocator)
      return allocator_stack(device, allocator, segments, no_split);
    std::string spec = chosen, unshared;
    if (spec.empty()) {
      const char* config = nullptr;
      rmmc_default_config_status(&config, nullptr);
      char buf[4096];
      rmmc_status_t st = rmmc_default_config_device_spec(config != nullptr ? config : "cuda",
                                                         device, buf, sizeof buf);
      TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: private pool: ", last_error());
      spec = buf;
      unshared = unshared_spec(device);
    }
    if (no_split) {
      spec = base_layer(spec);
      unshared = unshared.empty() ? unshared : base_layer(unshared);
    }
    const std::string first = spec_with_defaults(spec, shareable_, true);
    const std::string second = spec_with_defaults(unshared.empty() ? spec : unshared, false, true);
    rmmc_resource_t* r = nullptr;
    c10::cuda::CUDAGuard guard(device);
    CaptureRelaxed relaxed; // never break a capture another thread (or this one) has underway
    rmmc_status_t st = rmmc_stack_create(first.c_str(), device, &r);
    const std::string* built = &first;
    if (st == RMMC_ERROR_NOT_SUPPORTED && second != first) {
      built = &second;
      st = rmmc_stack_create(second.c_str(), device, &r);
    }
    TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: private pool: cannot build \"", *built, "\": ",
                last_error());
    install_segment_hooks(r, segments);
    return r;
  }
  // A MemPool(allocator=...)'s stack: kAllocatorPoolSpec over the
  // allocator (the allocator alone for no_split: a block per raw_alloc).
  // A spec chosen with rmmc.torch.pool_spec does not apply: its base layer
  // would not be the allocator.
  rmmc_resource_t* allocator_stack(DeviceIndex device,
                                   const std::shared_ptr<CCA::CUDAAllocator>& allocator,
                                   SegmentTable* segments, bool no_split) {
    rmmc_resource_t* base = allocator_resource(allocator, device);
    rmmc_resource_t* r = base;
    if (!no_split) {
      c10::cuda::CUDAGuard guard(device);
      CaptureRelaxed relaxed;
      r = nullptr;
      rmmc_status_t st = rmmc_stack_create_over(kAllocatorPoolSpec, base, &r);
      std::string why = st != RMMC_SUCCESS ? last_error() : std::string();
      rmmc_resource_release(base); // the pool holds it
      TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: MemPool over an allocator: cannot build \"",
                  kAllocatorPoolSpec, "\": ", why);
    }
    install_segment_hooks(r, segments);
    return r;
  }
  // The device's spec under the configuration rmmc.torch.use() had before
  // it made pages shareable, while the process still runs the shareable one
  // it made of it, with the other defaults under PyTorch (stream_heaps=1);
  // "" otherwise.
  std::string unshared_spec(DeviceIndex device) {
    const char* config = nullptr;
    rmmc_default_config_status(&config, nullptr);
    std::string original;
    {
      std::lock_guard<std::mutex> g(config_mutex_);
      if (config == nullptr || original_config_.empty() || shareable_config_ != config)
        return "";
      original = original_config_;
    }
    char buf[4096];
    if (rmmc_default_config_device_spec(original.c_str(), device, buf, sizeof buf) != RMMC_SUCCESS) {
      rmmc_clear_last_error();
      return "";
    }
    return spec_with_defaults(buf, false, false);
  }

 public:
  // rmmc.torch.use(): the process configuration is now `shareable`, made
  // from `original` (config_with_defaults); stacks the backend builds get
  // shareable pages from now on.
  void set_configs(const char* shareable, const char* original) {
    std::lock_guard<std::mutex> g(config_mutex_);
    shareable_config_ = shareable != nullptr ? shareable : "";
    original_config_ = original != nullptr ? original : "";
    shareable_ = true;
  }

 private:
  std::shared_ptr<SegmentTable> new_segments(DeviceIndex device, MempoolId_t id) {
    auto t = std::make_shared<SegmentTable>();
    t->device = device;
    t->pool = id;
    t->device_held = &devices_[device].held;
    return t;
  }
  // Gives pool `id` its stack unless it has one.
  void ensure_stack(DeviceState& d, DeviceIndex device, MempoolId_t id) {
    std::string spec;
    bool no_split = false;
    std::shared_ptr<CCA::CUDAAllocator> allocator;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      auto it = d.pools.find(id);
      if (it == d.pools.end() || it->second->stack != nullptr)
        return;
      spec = it->second->spec;
      no_split = it->second->no_split;
      allocator = it->second->allocator;
    }
    std::shared_ptr<SegmentTable> segments = new_segments(device, id);
    rmmc_resource_t* built = build_pool_stack(device, spec, segments.get(), no_split, allocator);
    {
      std::lock_guard<std::mutex> g(d.mutex);
      auto it = d.pools.find(id);
      if (it != d.pools.end() && it->second->stack == nullptr) {
        it->second->stack = built;
        it->second->segments = std::move(segments);
        built = nullptr;
      }
    }
    rmmc_resource_release(built); // another thread built it first
  }
  // The pool's stack to destroy if it is released and empty (the caller
  // destroys it outside the lock); removes the pool then. While a capture
  // may be underway the pool stays, released and empty, until emptyCache
  // (or an allocation's retry after out of memory) destroys it, as
  // PyTorch's allocator keeps such a pool's segments until emptyCache: a
  // graph captured meanwhile may use memory freed into it, and destroying
  // a stack synchronizes.
  Reaped reap_locked(DeviceState& d, decltype(d.pools)::iterator it) {
    Pool& p = *it->second;
    if (p.use_count > 0 || p.live > 0 || capture_possible(d))
      return {};
    return take_pool_locked(d, it);
  }
  Reaped take_pool_locked(DeviceState& d, decltype(d.pools)::iterator it) {
    Pool& p = *it->second;
    Reaped r{p.stack, std::move(p.segments), p.id};
    d.pools.erase(it);
    return r;
  }
  // Released empty pools (emptyCache's and the out-of-memory retry's),
  // when no capture may be underway.
  std::vector<Reaped> reap_dormant_locked(DeviceState& d) {
    std::vector<Reaped> out;
    if (capture_possible(d))
      return out;
    for (auto it = d.pools.begin(); it != d.pools.end();) {
      if (it->second->use_count == 0 && it->second->live == 0)
        out.push_back(take_pool_locked(d, it++));
      else
        ++it;
    }
    return out;
  }
  // The device's stacks' figures summed; with per_pool, each private
  // pool's reserved bytes too.
  StackFigures figures(DeviceState& d,
                       std::vector<std::pair<MempoolId_t, uint64_t>>* per_pool = nullptr) {
    std::vector<std::pair<MempoolId_t, rmmc_resource_t*>> stacks;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (d.stack != nullptr)
        stacks.push_back({MempoolId_t{0, 0}, rmmc_resource_retain(d.stack)});
      for (auto& p : d.pools)
        if (p.second->stack != nullptr)
          stacks.push_back({p.first, rmmc_resource_retain(p.second->stack)});
    }
    StackFigures f;
    for (auto& pr : stacks) {
      const uint64_t before = f.reserved;
      add_stack_figures(pr.second, &f);
      if (per_pool != nullptr && pr.first != MempoolId_t{0, 0})
        per_pool->push_back({pr.first, f.reserved - before});
      rmmc_resource_release(pr.second);
    }
    std::lock_guard<std::mutex> g(d.mutex);
    f.grows += d.retired.grows;
    f.shrinks += d.retired.shrinks;
    return f;
  }
  // Destroys a private pool's stack (its memory goes back to the device),
  // keeping its counts in the device's figures. No stack: nothing to do.
  // The hooks come off first, which announces every segment's end
  // (SEGMENT_FREE: NCCL deregisters them) while the table still lives, even
  // if someone else (rmmc_torch_native_pool_resource) keeps the stack.
  void destroy_pool_stack(DeviceState& d, Reaped reaped) {
    rmmc_resource_t* dead = reaped.stack;
    if (dead == nullptr)
      return;
    StackFigures f;
    add_stack_figures(dead, &f);
    {
      CaptureRelaxed relaxed; // unmapping must not fail under another thread's capture mode
      if (reaped.segments && reaped.segments->hooked)
        (void)rmmc_resource_set_memory_hooks(dead, nullptr);
      rmmc_resource_release(dead);
    }
    std::lock_guard<std::mutex> g(d.mutex);
    d.retired.grows += f.grows;
    d.retired.shrinks += f.shrinks + f.regions;
    d.pool_reserved.sample({reaped.id.first, reaped.id.second}, 0);
  }
  void snapshot_device(DeviceIndex device, MempoolId_t only,
                       std::vector<SegmentInfo>* out);
  [[noreturn]] void out_of_memory(size_t size, DeviceIndex device, cudaStream_t stream,
                                  const std::string& why);

 public:
  // Adds a trace entry (and tells the trackers) if history is on.
  // `metadata`: the entry's user metadata instead of setUserMetadata's.
  void record(TraceEntry::Action action, DeviceIndex device, size_t addr, size_t size,
              cudaStream_t stream, MempoolId_t pool,
              std::shared_ptr<c10::GatheredContext> context,
              const std::string* metadata = nullptr) {
    if (!tracing_)
      return;
    static const char* const names[] = {"alloc",         "free_requested", "free_completed",
                                        "segment_alloc", "segment_free",   "segment_map",
                                        "segment_unmap", "snapshot",       "oom",
                                        "annotate"};
    std::lock_guard<std::mutex> g(history_mutex_);
    if (!skip_.empty() && static_cast<size_t>(action) < sizeof names / sizeof *names &&
        skip_.count(names[action]) != 0)
      return;
    (void)metadata;
    TraceEntry te(action, device, addr, size, stream, pool, c10::getApproximateTime(),
                  when_ >= CCA::RecordContext::ALLOC ? std::move(context) : nullptr,
                  compile_contexts_.empty() ? std::string("N/A") : compile_contexts_.back()
#if RMMC_TORCH_AT_LEAST(2, 10)
                      ,
                  metadata != nullptr ? *metadata : user_metadata_
#endif
    );
    for (auto& t : trackers_)
      t(te);
    if (!history_)
      return;
    if (trace_.size() < max_entries_) {
      trace_.push_back(std::move(te));
    } else {
      trace_[trace_next_] = std::move(te);
      trace_next_ = (trace_next_ + 1) % max_entries_;
    }
  }
  // The context PyTorch's recorder gives now (the Python and C++ frames),
  // if history keeps contexts.
  std::shared_ptr<c10::GatheredContext> context() {
    CCA::CreateContextFn fn = nullptr;
    {
      std::lock_guard<std::mutex> g(history_mutex_);
      if (when_ >= CCA::RecordContext::STATE)
        fn = recorder_;
    }
    return fn != nullptr ? fn() : nullptr;
  }
  bool record_frees() {
    std::lock_guard<std::mutex> g(history_mutex_);
    return history_ && when_ == CCA::RecordContext::ALL;
  }

 private:
  static constexpr int kMaxDevices = 64; // rmmc's registry holds 64
  std::array<DeviceState, kMaxDevices> devices_;
  std::atomic<int> count_{0};
  std::atomic<bool> initialized_{false};
  bool enabled_ = true;

  std::mutex history_mutex_;
  std::atomic<bool> history_{false};
  std::atomic<bool> tracing_{false}; // history_ or a tracker attached
  CCA::CreateContextFn recorder_ = nullptr;
  CCA::RecordContext when_ = CCA::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::unordered_set<std::string> skip_;
  std::vector<TraceEntry> trace_;
  size_t trace_next_ = 0;
  std::vector<CCA::OutOfMemoryObserver> oom_observers_;
  std::vector<OomRejectionFn> rejection_observers_;
  std::vector<CCA::AllocatorTraceTracker> trackers_;
  std::string user_metadata_;                // setUserMetadata: on each trace entry
  std::vector<std::string> compile_contexts_; // pushCompileContext, innermost last
  std::vector<AnnotationEntryT> annotations_; // recordAnnotation, a ring as trace_
  size_t annotations_next_ = 0;
  std::string last_oom_; // rmmc's part of the last OutOfMemoryError
  std::mutex config_mutex_;
  std::string shareable_config_, original_config_; // set_configs
  std::atomic<bool> shareable_{false};
  c10::ApproximateClockToUnixTimeConverter clock_;
};

CheckpointState::~CheckpointState() {
  if (the_allocator != nullptr)
    the_allocator->release_checkpoint(this);
}

void raw_delete_fn(void* ptr) {
  the_allocator->free_block(ptr);
}

void* RmmcAllocator::alloc_block(size_t size, DeviceIndex device, cudaStream_t stream) {
  if (size == 0)
    return nullptr;
  // As PyTorch's allocator, before anything else.
  TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte,
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  DeviceState& d = dev(device);
  if (d.ndeferred.load(std::memory_order_relaxed) != 0)
    give_back_deferred(d);
  if (d.nmarked.load(std::memory_order_relaxed) != 0)
    reuse_in_capture(d, stream); // graph_capture_record_stream_reuse
  if (d.npending.load(std::memory_order_relaxed) != 0)
    give_back_pending(d, false); // PyTorch's process_events

  const size_t bytes = round_size(size); // what rmmc hands out
  Pool* pool = nullptr;
  rmmc_resource_t* res = nullptr;
  SegmentTable* table = nullptr;
  std::shared_ptr<CCA::CUDAAllocator> allocator;
  bool need_stack = false;
  std::string spec;
  bool no_split = false;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    for (auto it = d.routes.rbegin(); it != d.routes.rend(); ++it) {
      if (it->filter(stream)) {
        if (it->kind == Route::UNKNOWN) {
          it->kind = stream_capturing(stream) ? Route::CAPTURE : Route::OTHER;
          it->stream = stream;
        }
        pool = &pool_locked(d, device, it->id);
        break;
      }
    }
    if (pool != nullptr) {
      if (pool->stack == nullptr) {
        need_stack = true;
        spec = pool->spec;
        no_split = pool->no_split;
        allocator = pool->allocator;
      } else {
        res = pool->stack;
        table = pool->segments.get();
      }
      pool->live++; // keeps the pool (and its stack) while the block is made
    } else {
      res = d.stack; // held by the device until the process ends
      table = &d.segments;
    }
  }
  if (pool == nullptr && res == nullptr) {
    rmmc_resource_t* s = stack_of(device); // builds it on the device's first use
    res = s;
    rmmc_resource_release(s); // d.stack keeps its own reference
  }
  if (need_stack) {
    rmmc_resource_t* built = nullptr;
    std::shared_ptr<SegmentTable> segments = new_segments(device, pool->id);
    try {
      built = build_pool_stack(device, spec, segments.get(), no_split, allocator);
    } catch (...) {
      std::lock_guard<std::mutex> g(d.mutex);
      pool->live--;
      throw;
    }
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (pool->stack == nullptr) {
        pool->stack = built;
        pool->segments = std::move(segments);
        built = nullptr;
      }
      res = pool->stack;
      table = pool->segments.get();
    }
    rmmc_resource_release(built); // another thread built it first
  }

  void* p = nullptr;
  std::string why;
  bool by_fraction = false; // the memory fraction refused it
  rmmc_status_t st = try_stack(d, res, table, bytes, stream, true, &p, &why, &by_fraction);
  if (st == RMMC_ERROR_OUT_OF_MEMORY) {
    // Retry once after every cache of the device gave back what it can
    // and released pools were destroyed (PyTorch's retry after freeing
    // cached blocks), unless a capture may be underway (PyTorch skips it
    // then too: it synchronizes).
    std::vector<rmmc_resource_t*> stacks;
    std::vector<Reaped> dead;
    bool retry = false;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (!capture_possible(d)) {
        retry = true;
        d.counters.num_alloc_retries++;
        dead = reap_dormant_locked(d);
        if (d.stack != nullptr)
          stacks.push_back(rmmc_resource_retain(d.stack));
        for (auto& kv : d.pools) {
          if (kv.second->stack != nullptr && kv.second->use_count == 0)
            stacks.push_back(rmmc_resource_retain(kv.second->stack));
        }
      }
    }
    if (retry)
      give_back_pending(d, true); // blocks waiting for recorded streams, once done
    for (Reaped& r : dead)
      destroy_pool_stack(d, std::move(r));
    for (rmmc_resource_t* s : stacks) {
      rmmc_resource_release_cached(s);
      rmmc_resource_release(s);
    }
    if (retry) {
      by_fraction = false;
      st = try_stack(d, res, table, bytes, stream, true, &p, &why, &by_fraction);
    }
  }
  if (st == RMMC_ERROR_OUT_OF_MEMORY && pool == nullptr) {
    // Then what the pools marked use_on_oom cache, as PyTorch: their free
    // memory only, never a growth of theirs.
    std::vector<Pool*> alts;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      for (auto& kv : d.pools) {
        if (kv.second->use_on_oom && kv.second->stack != nullptr) {
          kv.second->live++; // alive while tried
          alts.push_back(kv.second.get());
        }
      }
    }
    Pool* chosen = nullptr;
    for (Pool* alt : alts) {
      std::string ignored;
      if (chosen == nullptr &&
          try_stack(d, alt->stack, alt->segments.get(), bytes, stream, false, &p, &ignored,
                    nullptr) == RMMC_SUCCESS)
        chosen = alt;
    }
    {
      std::lock_guard<std::mutex> g(d.mutex);
      for (Pool* alt : alts)
        if (alt != chosen)
          alt->live--; // chosen keeps its count for the block
    }
    if (chosen != nullptr) {
      pool = chosen;
      res = chosen->stack;
      table = chosen->segments.get();
      st = RMMC_SUCCESS;
    }
  }
  if (st != RMMC_SUCCESS) {
    size_t out_now = 0;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (pool != nullptr)
        pool->live--;
      if (st == RMMC_ERROR_OUT_OF_MEMORY) {
        d.counters.num_ooms++;
        d.counters.lifetime_ooms++;
        if (by_fraction)
          d.counters.num_oom_rejections++;
      }
      out_now = static_cast<size_t>(d.counters.allocated_bytes[0].current);
    }
    if (st == RMMC_ERROR_OUT_OF_MEMORY) {
      if (by_fraction) {
        // Refused by the memory fraction: PyTorch's preemptive rejection
        // (throw_on_cudamalloc_oom), whose observers hear of it, then the
        // out-of-memory error as for any refusal.
        std::vector<OomRejectionFn> observers;
        {
          std::lock_guard<std::mutex> g(history_mutex_);
          observers = rejection_observers_;
        }
        size_t free = 0, total = 0;
        if (!observers.empty()) {
          c10::cuda::CUDAGuard guard(device);
          if (cudaMemGetInfo(&free, &total) != cudaSuccess)
            (void)cudaGetLastError();
        }
        for (auto& o : observers)
          o(device, size, out_now, total);
      }
      out_of_memory(size, device, stream, why);
    }
    TORCH_CHECK(false, "rmmc: allocating ", size, " bytes on device ",
                static_cast<int>(device), " failed: ", why);
  }

  Block b;
  b.size = size;
  b.stream = stream;
  b.device = device;
  b.pool = pool;
  b.res = res;
  b.table = table;
  b.unhooked = !table->hooked.load(std::memory_order_relaxed);
  std::shared_ptr<c10::GatheredContext> ctx = history_ ? context() : nullptr;
  b.context = ctx;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    count_block(d.counters, size, true);
    count_active(d.counters, size, true);
    table->out += static_cast<int64_t>(bytes);
    if (b.unhooked)
      d.unhooked.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    d.blocks.emplace(p, std::move(b));
  }
  record(TraceEntry::ALLOC, device, reinterpret_cast<size_t>(p), size, stream,
         pool != nullptr ? pool->id : MempoolId_t{0, 0}, std::move(ctx));
  return p;
}

// One try of stack `res` (whose table is t) for `bytes` on `stream`.
// `grow`: may the stack take memory from the device for it (else only what
// it caches free: the use_on_oom fallback). Under a memory fraction a
// request whose growth must pass the device's limit is refused before the
// stack is asked (at least bytes less what the stack caches free must be
// taken), and one that made the stack grow past it is given back, with
// what the growth took (unless a capture may be underway): PyTorch's
// fraction bounds the bytes its allocator holds, reserved memory included.
// *by_fraction (may be NULL) is set when the fraction refused.
rmmc_status_t RmmcAllocator::try_stack(DeviceState& d, rmmc_resource_t* res, SegmentTable* t,
                                       size_t bytes, cudaStream_t stream, bool grow, void** out,
                                       std::string* why, bool* by_fraction) {
  const bool limited = d.fraction_set.load(std::memory_order_relaxed);
  if (grow && !limited) { // the common case
    rmmc_status_t st = rmmc_resource_allocate(res, bytes, RMMC_DEFAULT_ALIGNMENT, stream, out);
    if (st != RMMC_SUCCESS)
      *why = last_error();
    return as_oom(st);
  }
  const bool hooked = t->hooked.load(std::memory_order_relaxed);
  size_t limit = 0;
  double fraction = 0;
  int64_t out_t = 0;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    limit = d.limit;
    fraction = d.fraction;
    out_t = t->out;
  }
  auto refused = [&](const char* what) {
    if (grow && by_fraction != nullptr)
      *by_fraction = true;
    *why = grow ? "the memory fraction " + std::to_string(fraction) + " allows " +
                      format_size(limit) + " on this device, of which rmmc's stacks reserve " +
                      format_size(static_cast<uint64_t>(std::max<int64_t>(0, device_reserved(d)))) +
                      " (" + what + ")"
                : std::string("the pool caches too little free memory for it (") + what + ")";
    return RMMC_ERROR_OUT_OF_MEMORY;
  };
  const int64_t held0 = hooked ? t->held.load(std::memory_order_relaxed) : 0;
  const int64_t cached = std::max<int64_t>(0, held0 - out_t);
  const int64_t need = static_cast<int64_t>(bytes) > cached ? static_cast<int64_t>(bytes) - cached : 0;
  if (!grow && need > 0)
    return refused("it would have to grow");
  if (grow && need > 0 && device_reserved(d) + need > static_cast<int64_t>(limit))
    return refused("the request needs more");
  rmmc_status_t st = rmmc_resource_allocate(res, bytes, RMMC_DEFAULT_ALIGNMENT, stream, out);
  if (st != RMMC_SUCCESS) {
    *why = last_error();
    return as_oom(st);
  }
  const bool grew = hooked ? t->held.load(std::memory_order_relaxed) > held0 : true;
  const bool over = !grow ? grew
                          : grew && device_reserved(d) + (hooked ? 0 : static_cast<int64_t>(bytes)) >
                                        static_cast<int64_t>(limit);
  if (!over)
    return RMMC_SUCCESS;
  // Taken back: the block, then the memory its growth took.
  (void)rmmc_resource_deallocate(res, *out, bytes, RMMC_DEFAULT_ALIGNMENT, stream);
  *out = nullptr;
  bool may_release = false;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    may_release = !capture_possible(d);
  }
  if (may_release)
    (void)rmmc_resource_release_cached(res);
  rmmc_clear_last_error();
  return refused(grow ? "its growth passed that" : "it grew");
}

// PyTorch let go of ptr: back to rmmc, unless a checkpoint holds it.
void RmmcAllocator::free_block(void* ptr) {
  if (ptr == nullptr)
    return;
  DeviceState* d = nullptr;
  Block b;
  MempoolId_t id{0, 0};
  bool keep = false;
  const int n = ndev(), first = first_device();
  for (int k = 0; k < n; k++) {
    DeviceState* ds = &devices_[(first + k) % n];
    std::lock_guard<std::mutex> g(ds->mutex);
    auto it = ds->blocks.find(ptr);
    if (it == ds->blocks.end())
      continue;
    d = ds;
    Block& blk = it->second;
    TORCH_CHECK(!blk.zombie, "rmmc: ", ptr, " freed twice");
    count_block(d->counters, blk.size, false);
    if (blk.pool != nullptr)
      id = blk.pool->id;
    if (blk.checkpoints > 0) {
      blk.zombie = true; // a checkpoint may bring it back
      blk.active = false;
      count_active(d->counters, blk.size, false);
      keep = true;
      b.size = blk.size;
      b.stream = blk.stream;
      b.device = blk.device;
    } else {
      b = std::move(blk);
      ds->blocks.erase(it);
    }
    break;
  }
  TORCH_CHECK(d != nullptr, "rmmc: freeing ", ptr, ", which rmmc did not hand out");
  if (tracing_)
    record(TraceEntry::FREE_REQUESTED, b.device, reinterpret_cast<size_t>(ptr), b.size,
           b.stream, id, record_frees() ? context() : nullptr);
  if (!keep)
    release_block(*d, ptr, std::move(b));
}

// A zombie no checkpoint holds any more goes back to rmmc.
void RmmcAllocator::give_back(void* ptr) {
  for (int i = 0; i < ndev(); i++) {
    DeviceState& ds = devices_[i];
    Block b;
    {
      std::lock_guard<std::mutex> g(ds.mutex);
      auto it = ds.blocks.find(ptr);
      if (it == ds.blocks.end())
        continue;
      b = std::move(it->second);
      ds.blocks.erase(it);
    }
    release_block(ds, ptr, std::move(b));
    return;
  }
}

// Gives back the blocks whose release waited for captures to end, once no
// capture may be underway on the device (release_block keeps one whose
// streams are still being captured, or records its events now).
void RmmcAllocator::give_back_deferred(DeviceState& d) {
  std::vector<Deferred> ready;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    if (capture_possible(d) || d.deferred.empty())
      return;
    ready.swap(d.deferred);
    d.ndeferred = 0;
    d.nmarked = 0;
    d.visited.clear();
  }
  for (Deferred& df : ready)
    release_block(d, df.ptr, std::move(df.block));
}

// graph_capture_record_stream_reuse (torch.cuda.memory._set_allocator_settings,
// PYTORCH_CUDA_ALLOC_CONF): during a capture, a block freed with recorded
// streams is reusable on its own stream, before the capture ends, once the
// capture graph orders that stream's next work after every one of the
// block's free markers (the work its streams had queued at the free), as
// PyTorch decides it: the markers must all be ancestors of the stream's
// current terminal nodes. The walk up from the terminals (graph queries,
// legal during a capture; no event) is kept per capture and stream and
// never repeated. The block then goes back to its stack on its stream,
// where the next allocation of its size on that stream finds it.
void RmmcAllocator::reuse_in_capture(DeviceState& d, cudaStream_t stream) {
  if (!CCA::CUDAAllocatorConfig::graph_capture_record_stream_reuse())
    return;
  std::vector<Deferred> ready;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    bool mine = false;
    for (const Deferred& df : d.deferred)
      mine = mine || (!df.markers.empty() && df.block.stream == stream);
    if (!mine)
      return;
    CaptureInfo ci;
    if (!capture_info(stream, &ci) || ci.status != cudaStreamCaptureStatusActive ||
        ci.nterminals == 0)
      return;
    std::unordered_set<cudaGraphNode_t>& seen = d.visited[{ci.id, stream}];
    std::vector<cudaGraphNode_t> todo(ci.terminals, ci.terminals + ci.nterminals);
    while (!todo.empty()) {
      cudaGraphNode_t n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second)
        continue;
      for (cudaGraphNode_t parent : node_parents(n))
        todo.push_back(parent);
    }
    for (auto it = d.deferred.begin(); it != d.deferred.end();) {
      bool all = !it->markers.empty() && it->block.stream == stream;
      for (size_t k = 0; all && k < it->markers.size(); k++)
        all = seen.count(it->markers[k]) != 0;
      if (!all) {
        ++it;
        continue;
      }
      ready.push_back(std::move(*it));
      it = d.deferred.erase(it);
    }
    d.ndeferred = d.deferred.size();
    d.nmarked -= ready.size();
  }
  for (Deferred& df : ready) {
    df.block.streams.clear(); // the graph orders them: nothing to wait for
    finish_release(d, df.ptr, std::move(df.block));
  }
}

// Gives back the blocks freed with recorded streams whose events show that
// work done (`wait`: waits for it: emptyCache, an out-of-memory retry).
// Nothing while a capture may be underway: an event query is one of the
// calls a global-mode capture forbids (PyTorch skips its process_events
// then too). The events go back to the device's free list.
void RmmcAllocator::give_back_pending(DeviceState& d, bool wait) {
  std::vector<Pending> mine;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    if (d.pending.empty() || capture_possible(d))
      return;
    mine.swap(d.pending);
    d.npending = 0;
  }
  std::vector<Pending> ready, later;
  CaptureRelaxed relaxed; // a capture rmmc was not told of stays intact
  for (Pending& pd : mine) {
    bool done = true;
    for (cudaEvent_t ev : pd.events) {
      const cudaError_t e = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
      if (e != cudaSuccess)
        (void)cudaGetLastError(); // not ready, or an error: the block waits on
      if (e != cudaSuccess) {
        done = false;
        break;
      }
    }
    (done ? ready : later).push_back(std::move(pd));
  }
  {
    std::lock_guard<std::mutex> g(d.mutex);
    for (Pending& pd : ready)
      d.free_events.insert(d.free_events.end(), pd.events.begin(), pd.events.end());
    for (Pending& pd : later)
      d.pending.push_back(std::move(pd));
    d.npending = d.pending.size();
  }
  for (Pending& pd : ready)
    finish_release(d, pd.ptr, std::move(pd.block));
}

// Returns a block (out of the map) to the stack it came from. A block with
// recorded streams (recordStream) is not handed out again before the work
// those streams had queued when it was freed is done, PyTorch's rule: an
// event is recorded on each and the block waits, still active, until the
// next allocations find them complete (give_back_pending). One whose
// streams are being captured waits (deferred) until no capture may be
// underway: an event recorded in a capture tells nothing outside it
// (PyTorch defers those frees the same way). Runs in destructors: warns,
// never throws.
void RmmcAllocator::release_block(DeviceState& d, void* ptr, Block&& b) {
  if (b.streams.empty())
    return finish_release(d, ptr, std::move(b));
  c10::cuda::CUDAGuard guard(b.device);
  bool defer = stream_capturing(b.stream);
  for (size_t k = 0; k < b.streams.size() && !defer; k++)
    defer = stream_capturing(b.streams[k]);
  std::vector<cudaGraphNode_t> markers;
  if (defer && CCA::CUDAAllocatorConfig::graph_capture_record_stream_reuse())
    markers = free_markers(b);
  Pending pd;
  for (size_t k = 0; k < b.streams.size() && !defer; k++) {
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> g(d.mutex);
      if (!d.free_events.empty()) {
        ev = d.free_events.back();
        d.free_events.pop_back();
      }
    }
    if (ev == nullptr && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      ev = nullptr;
    }
    if (ev != nullptr && cudaEventRecord(ev, b.streams[k]) == cudaSuccess) {
      pd.events.push_back(ev);
      continue;
    }
    (void)cudaGetLastError();
    if (ev != nullptr)
      (void)cudaEventDestroy(ev);
    // No event: the free must not race that work; wait for all of it,
    // unless a capture may be underway (then later).
    {
      std::lock_guard<std::mutex> g(d.mutex);
      defer = capture_possible(d);
    }
    if (!defer && cudaDeviceSynchronize() != cudaSuccess) {
      (void)cudaGetLastError();
      TORCH_WARN("rmmc: freeing ", ptr, ": cannot order it after a recorded stream");
    }
    break;
  }
  const bool synchronized = !defer && pd.events.size() < b.streams.size();
  {
    std::lock_guard<std::mutex> g(d.mutex);
    if (defer || synchronized) // the events recorded so far serve no more
      d.free_events.insert(d.free_events.end(), pd.events.begin(), pd.events.end());
    if (defer) {
      if (!markers.empty())
        d.nmarked++;
      d.deferred.push_back(Deferred{ptr, std::move(b), std::move(markers)});
      d.ndeferred = d.deferred.size();
      return;
    }
    if (!synchronized) {
      pd.ptr = ptr;
      pd.block = std::move(b);
      d.pending.push_back(std::move(pd));
      d.npending = d.pending.size();
      return;
    }
  }
  finish_release(d, ptr, std::move(b)); // the device was synchronized: nothing to wait for
}

// The end of a block's release: its descriptors closed, its memory back to
// its stack (or its allocator), the counts, its pool reaped if that was
// its last block.
void RmmcAllocator::finish_release(DeviceState& d, void* ptr, Block&& b) {
  for (int fd : b.ipc_fds)
    close(fd);
  rmmc_status_t st = RMMC_SUCCESS;
  std::string why;
  if (b.res != nullptr) {
    st = rmmc_resource_deallocate(b.res, ptr, round_size(b.size), RMMC_DEFAULT_ALIGNMENT,
                                  b.stream);
    if (st != RMMC_SUCCESS)
      why = last_error();
  }
  Reaped dead;
  MempoolId_t id{0, 0};
  {
    std::lock_guard<std::mutex> g(d.mutex);
    if (b.active)
      count_active(d.counters, b.size, false);
    const int64_t rounded = static_cast<int64_t>(round_size(b.size));
    if (b.table != nullptr)
      b.table->out -= rounded;
    if (b.unhooked)
      d.unhooked.fetch_sub(rounded, std::memory_order_relaxed);
    if (b.pool != nullptr) {
      id = b.pool->id;
      b.pool->live--;
      dead = reap_locked(d, d.pools.find(id));
    }
  }
  if (tracing_) // before the pool's segment_free entries, if it dies now
    record(TraceEntry::FREE_COMPLETED, b.device, reinterpret_cast<size_t>(ptr), b.size,
           b.stream, id, nullptr);
  destroy_pool_stack(d, std::move(dead));
  if (st != RMMC_SUCCESS)
    TORCH_WARN("rmmc: freeing ", ptr, " failed: ", why);
}

void RmmcAllocator::out_of_memory(size_t size, DeviceIndex device, cudaStream_t stream,
                                  const std::string& why) {
  size_t free = 0, total = 0;
  {
    c10::cuda::CUDAGuard guard(device);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess)
      (void)cudaGetLastError();
  }
  DeviceStats s = getDeviceStats(device);
  const size_t allocated = static_cast<size_t>(s.allocated_bytes[0].current);
  const size_t reserved = static_cast<size_t>(s.reserved_bytes[0].current);
  record(TraceEntry::OOM, device, free, size, stream, {0, 0}, nullptr);
  std::vector<CCA::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> g(history_mutex_);
    observers = oom_observers_;
    last_oom_ = why;
  }
  for (auto& o : observers)
    o(device, allocated, total, free);
  std::string proc;
  if (total != 0 && total - free > 0)
    proc = " Including non-PyTorch memory, this process has " + format_size(total - free) +
           " memory in use.";
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                   format_size(size), ". GPU ", static_cast<int>(device),
                   " has a total capacity of ", format_size(total), " of which ",
                   format_size(free), " is free.", proc,
                   " Of the allocated memory ", format_size(allocated),
                   " is allocated by PyTorch, and ",
                   format_size(reserved > allocated ? reserved - allocated : 0),
                   " is reserved by PyTorch but unallocated (allocator: rmmc). rmmc: ", why);
}

// ---- segments through the memory hooks ----

// Tells the trace trackers (and the history, if on) about a segment. The
// hooks run inside rmmc, under the pool's lock: nothing may escape.
void tell_segment(TraceEntry::Action action, const SegmentTable* t, void* ptr, size_t bytes) {
  if (the_allocator == nullptr)
    return;
  try {
    the_allocator->record(action, t->device, reinterpret_cast<size_t>(ptr), bytes, nullptr,
                          t->pool, nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rmmc: a trace tracker failed on %s of %p (%zu bytes): %s\n",
                 action == TraceEntry::SEGMENT_ALLOC ? "segment_alloc" : "segment_free", ptr,
                 bytes, e.what());
  } catch (...) {
    std::fprintf(stderr, "rmmc: a trace tracker failed on a segment of %p\n", ptr);
  }
}

void count_held(SegmentTable* t, int64_t delta) {
  t->held.fetch_add(delta, std::memory_order_relaxed);
  if (t->device_held != nullptr)
    t->device_held->fetch_add(delta, std::memory_order_relaxed);
}

void segment_acquired(void* ptr, size_t bytes, void* user) {
  auto* t = static_cast<SegmentTable*>(user);
  count_held(t, static_cast<int64_t>(bytes));
  t->ranges.acquired(ptr, bytes);
  tell_segment(TraceEntry::SEGMENT_ALLOC, t, ptr, bytes);
}

void segment_released(void* ptr, size_t bytes, void* user) {
  auto* t = static_cast<SegmentTable*>(user);
  tell_segment(TraceEntry::SEGMENT_FREE, t, ptr, bytes); // before the pages go
  t->ranges.released(ptr, bytes);
  count_held(t, -static_cast<int64_t>(bytes));
}

// Puts the table's hooks on the stack (on its pool: the layer that takes
// memory from the system). A stack without a pool (plain cuda, cuda_async)
// takes none: its snapshot falls back to the memory under each block.
void install_segment_hooks(rmmc_resource_t* stack, SegmentTable* t) {
  bool expandable = false;
  for (rmmc_resource_t* r = stack; r != nullptr && !expandable; r = rmmc_resource_upstream(r)) {
    uint64_t v = 0;
    expandable = rmmc_resource_get_field(r, "page", &v); // the pool's virtual-memory backend
  }
  t->expandable = expandable;
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = segment_acquired;
  h.on_release = segment_released;
  h.user = t;
  const bool hooked = rmmc_resource_set_memory_hooks(stack, &h) == RMMC_SUCCESS;
  if (!hooked)
    rmmc_clear_last_error();
  t->hooked = hooked;
}

// rmmc.set_memory_hooks(device=) while the backend holds the default
// stack's hook slot: the user's hooks ride on the backend's, with the same
// contract (the old ones hear on_release and the new ones on_acquire for
// every range held now, before this returns).
rmmc_status_t RmmcAllocator::set_user_hooks(DeviceIndex device, const rmmc_memory_hooks_t* hooks) {
  if (hooks != nullptr && hooks->size < sizeof(rmmc_memory_hooks_t))
    return RMMC_ERROR_INVALID_ARGUMENT;
  rmmc_resource_t* s = stack_of(device);
  SegmentTable& t = dev(device).segments;
  rmmc_status_t st = RMMC_SUCCESS;
  if (t.hooked) {
    RangeHooks h;
    if (hooks != nullptr)
      h = {hooks->on_acquire, hooks->on_release, hooks->user};
    t.ranges.set_user(h);
  } else {
    st = rmmc_resource_set_memory_hooks(s, hooks); // no pool: what rmmc says
  }
  rmmc_resource_release(s);
  return st;
}

// Segments as PyTorch's snapshot has them. A stack whose pool took the
// hooks: its segments are the ranges the hooks reported (every chunk or
// page mapping it holds, free ones too, adding up to its reserved bytes),
// PyTorch's blocks laid into them (layout_segments). Blocks of a stack
// without hooks: the memory under each (rmmc_resource_get_allocation,
// walked down to what the stack took from the system), the blocks in it in
// address order, the gaps between them inactive.
void RmmcAllocator::snapshot_device(DeviceIndex device, MempoolId_t only,
                                    std::vector<SegmentInfo>* out) {
  DeviceState& d = devices_[device];
  struct Item {
    uintptr_t addr;
    size_t size;
    cudaStream_t stream;
    rmmc_resource_t* res;
    MempoolId_t pool;
    std::shared_ptr<c10::GatheredContext> ctx;
  };
  struct View {
    SegmentTable* table;
    std::shared_ptr<SegmentTable> keep; // a private pool's, alive while read
    rmmc_resource_t* res;               // the stack (identity only)
    MempoolId_t pool;
  };
  const bool all = only == MempoolId_t{0, 0};
  std::vector<Item> items;
  std::vector<View> views;
  {
    std::lock_guard<std::mutex> g(d.mutex);
    if (all && d.stack != nullptr)
      views.push_back({&d.segments, nullptr, d.stack, {0, 0}});
    for (auto& kv : d.pools) {
      Pool& p = *kv.second;
      if (p.stack != nullptr && p.segments && (all || p.id == only))
        views.push_back({p.segments.get(), p.segments, p.stack, p.id});
    }
    for (auto& kv : d.blocks) {
      if (kv.second.zombie)
        continue;
      MempoolId_t pid = kv.second.pool != nullptr ? kv.second.pool->id : MempoolId_t{0, 0};
      if (!all && pid != only)
        continue;
      items.push_back({reinterpret_cast<uintptr_t>(kv.first), kv.second.size, kv.second.stream,
                       rmmc_resource_retain(kv.second.res), pid, kv.second.context});
    }
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.addr < b.addr; });
  const size_t first = out->size();
  std::vector<bool> laid(items.size(), false);
  for (View& v : views) {
    if (!v.table->hooked)
      continue;
    const bool expandable = v.table->expandable;
    const std::vector<Range> ranges = v.table->ranges.list();
    std::vector<LiveBlock> blocks;
    std::vector<size_t> which; // blocks[k] is items[which[k]]
    for (size_t k = 0; k < items.size(); k++) {
      if (items[k].res == v.res) {
        blocks.push_back({items[k].addr, round_size(items[k].size), items[k].size});
        which.push_back(k);
      }
    }
    std::vector<size_t> outside;
    std::vector<SegmentLayout> layouts = layout_segments(ranges, blocks, &outside);
    for (size_t k : which)
      laid[k] = true;
    for (size_t k : outside)
      laid[which[k]] = false;
    for (SegmentLayout& l : layouts) {
      SegmentInfo seg;
      seg.device = device;
      seg.address = l.addr;
      seg.total_size = l.size;
      seg.is_large = true;
      seg.is_expandable = expandable;
      seg.owner_private_pool_id = v.pool;
#if RMMC_TORCH_AT_LEAST(2, 11)
      seg.registration_counter = l.seq;
#endif
      bool streamed = false;
      for (const Piece& pc : l.pieces) {
        CCA::BlockInfo blk;
        blk.size = pc.size;
        if (pc.block >= 0) {
          const Item& it = items[which[static_cast<size_t>(pc.block)]];
          blk.requested_size = pc.requested;
          blk.allocated = true;
          blk.active = true;
          blk.context_when_allocated = it.ctx;
          seg.allocated_size += pc.size;
          seg.active_size += pc.size;
          seg.requested_size += pc.requested;
          if (!streamed) {
            seg.stream = reinterpret_cast<decltype(seg.stream)>(it.stream);
            streamed = true;
          }
        }
        seg.blocks.push_back(std::move(blk));
      }
      out->push_back(std::move(seg));
    }
  }

  // The rest: the memory under each block.
  std::map<uintptr_t, size_t> index; // segment address -> position in out
  for (size_t k = 0; k < items.size(); k++) {
    if (laid[k])
      continue;
    Item& it = items[k];
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    uintptr_t base = it.addr;
    size_t bytes = round_size(it.size);
    bool expandable = false;
    if (rmmc_resource_get_allocation(it.res, reinterpret_cast<void*>(it.addr), &a) ==
        RMMC_SUCCESS) {
      // Walk down to the memory the stack took from the system.
      rmmc_allocation_t cur = a;
      while (cur.backing == RMMC_BACKING_BLOCK && cur.resource != nullptr) {
        rmmc_resource_t* up = rmmc_resource_upstream(cur.resource);
        rmmc_allocation_t next = RMMC_ALLOCATION_INIT;
        if (up == nullptr ||
            rmmc_resource_get_allocation(up, cur.upstream.ptr, &next) != RMMC_SUCCESS)
          break;
        cur = next;
      }
      if (cur.upstream.ptr != nullptr && cur.upstream.bytes != 0) {
        base = reinterpret_cast<uintptr_t>(cur.upstream.ptr);
        bytes = cur.upstream.bytes;
        expandable = cur.backing == RMMC_BACKING_MAPPINGS;
      }
    } else {
      rmmc_clear_last_error();
    }
    auto found = index.find(base);
    if (found == index.end() && out->size() > first) {
      // A block may begin before the last segment's end if segments overlap
      // (mappings spanning several blocks): merge into the one that covers.
      SegmentInfo& last = out->back();
      if (index.count(last.address) != 0 && last.address <= base &&
          base < last.address + last.total_size)
        found = index.find(last.address);
    }
    if (found == index.end()) {
      SegmentInfo seg;
      seg.device = device;
      seg.address = base;
      seg.total_size = bytes;
      seg.stream = reinterpret_cast<decltype(seg.stream)>(it.stream);
      seg.is_large = true;
      seg.is_expandable = expandable;
      seg.owner_private_pool_id = it.pool;
      seg.context_when_allocated = it.ctx;
#if RMMC_TORCH_AT_LEAST(2, 11)
      seg.registration_counter = static_cast<int32_t>(out->size()); // register_mem_pool's order
#endif
      index[base] = out->size();
      out->push_back(std::move(seg));
      found = index.find(base);
    }
    SegmentInfo& seg = (*out)[found->second];
    uintptr_t end = seg.address;
    for (auto& b : seg.blocks)
      end += b.size;
    if (it.addr < end)
      continue; // cannot happen for disjoint blocks; never list one twice
    if (it.addr > end) {
      CCA::BlockInfo gap;
      gap.size = it.addr - end;
      seg.blocks.push_back(gap);
    }
    CCA::BlockInfo blk;
    blk.size = round_size(it.size);
    blk.requested_size = it.size;
    blk.allocated = true;
    blk.active = true;
    blk.context_when_allocated = it.ctx;
    seg.blocks.push_back(blk);
    seg.allocated_size += blk.size;
    seg.active_size += blk.size;
    seg.requested_size += it.size;
    if (it.addr + blk.size > seg.address + seg.total_size)
      seg.total_size = it.addr + blk.size - seg.address;
  }
  for (auto& kv : index) {
    SegmentInfo& seg = (*out)[kv.second];
    size_t used = 0;
    for (auto& b : seg.blocks)
      used += b.size;
    if (used < seg.total_size) {
      CCA::BlockInfo tail;
      tail.size = seg.total_size - used;
      seg.blocks.push_back(tail);
    }
  }
  for (Item& it : items)
    rmmc_resource_release(it.res);
  std::sort(out->begin() + static_cast<std::ptrdiff_t>(first), out->end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
}

// ---- IPC ----
// The handle torch.multiprocessing passes: "rmmc-ipc1", the exporter's pid,
// the number of descriptors and their numbers in the exporter (the importer
// takes them with pidfd_getfd, as PyTorch's expandable segments do), then the
// rmmc handle's meaningful bytes.
constexpr char kIpcMagic[] = "rmmc-ipc1";

CCA::ShareableHandle RmmcAllocator::shareIpcHandle(void* ptr) {
  DeviceState* d = find_device(ptr);
  TORCH_CHECK(d != nullptr, "rmmc: shareIpcHandle: ", ptr, " is not a block rmmc handed out");
  rmmc_resource_t* res = nullptr;
  {
    std::lock_guard<std::mutex> g(d->mutex);
    Block& b = d->blocks.at(ptr);
    if (!b.ipc.empty())
      return {0, b.ipc};
    res = rmmc_resource_retain(b.res);
  }
  rmmc_ipc_handle_t h;
  std::vector<int> fds(RMMC_IPC_MAX_FDS);
  size_t nfds = 0;
  rmmc_status_t st = rmmc_ipc_export(res, ptr, &h, fds.data(), fds.size(), &nfds);
  std::string why = last_error();
  rmmc_resource_release(res);
  TORCH_CHECK(st == RMMC_SUCCESS, "rmmc: cannot share this CUDA tensor: ", why,
              " (share memory from `pool(expandable=false) > cuda` or `pool > cuda(ipc=true)`)");
  rmmc_ipc_info_t info = RMMC_IPC_INFO_INIT;
  TORCH_CHECK(rmmc_ipc_handle_info(&h, &info) == RMMC_SUCCESS, "rmmc: shareIpcHandle: ",
              last_error());
  fds.resize(nfds);
  std::string s(kIpcMagic, sizeof kIpcMagic);
  int32_t pid = static_cast<int32_t>(getpid());
  uint32_t n = static_cast<uint32_t>(nfds);
  s.append(reinterpret_cast<const char*>(&pid), sizeof pid);
  s.append(reinterpret_cast<const char*>(&n), sizeof n);
  for (int fd : fds) {
    int32_t v = fd;
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  s.append(reinterpret_cast<const char*>(h.bytes), info.handle_bytes);
  std::lock_guard<std::mutex> g(d->mutex);
  Block& b = d->blocks.at(ptr);
  if (!b.ipc.empty()) { // another thread shared it meanwhile
    for (int fd : fds)
      close(fd);
    return {0, b.ipc};
  }
  b.ipc = s;
  b.ipc_fds = std::move(fds);
  return {0, s};
}

std::shared_ptr<void> RmmcAllocator::getIpcDevPtr(std::string handle) {
  const size_t head = sizeof kIpcMagic + 8;
  TORCH_CHECK(handle.size() > head && std::memcmp(handle.data(), kIpcMagic, sizeof kIpcMagic) == 0,
              "rmmc: getIpcDevPtr: not an rmmc handle (was the tensor shared by a process "
              "whose CUDA allocator is not rmmc's native backend?)");
  int32_t pid = 0;
  uint32_t n = 0;
  std::memcpy(&pid, handle.data() + sizeof kIpcMagic, sizeof pid);
  std::memcpy(&n, handle.data() + sizeof kIpcMagic + 4, sizeof n);
  TORCH_CHECK(n <= RMMC_IPC_MAX_FDS && handle.size() >= head + 4 * size_t(n),
              "rmmc: getIpcDevPtr: damaged handle");
  rmmc_ipc_handle_t h;
  std::memset(&h, 0, sizeof h);
  size_t rest = handle.size() - head - 4 * size_t(n);
  TORCH_CHECK(rest <= sizeof h.bytes, "rmmc: getIpcDevPtr: damaged handle");
  std::memcpy(h.bytes, handle.data() + head + 4 * size_t(n), rest);
  std::vector<int> fds;
  std::string failure;
  if (n > 0) {
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      failure = "pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno);
    } else {
      for (uint32_t k = 0; k < n && failure.empty(); k++) {
        int32_t remote = 0;
        std::memcpy(&remote, handle.data() + head + 4 * k, sizeof remote);
        int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, remote, 0));
        if (fd < 0)
          failure = std::string("pidfd_getfd: ") + std::strerror(errno) +
                    " (the importer may not read the exporter's descriptors: ptrace "
                    "permission; share from `pool(expandable=false) > cuda` instead)";
        else
          fds.push_back(fd);
      }
      close(pidfd);
    }
  }
  void* p = nullptr;
  rmmc_status_t st = RMMC_SUCCESS;
  if (failure.empty()) {
    st = rmmc_ipc_import(&h, fds.data(), fds.size(), &p);
    if (st != RMMC_SUCCESS)
      failure = last_error();
  }
  for (int fd : fds)
    close(fd);
  TORCH_CHECK(failure.empty(), "rmmc: getIpcDevPtr: ", failure);
  return std::shared_ptr<void>(p, [](void* q) { rmmc_ipc_close(q); });
}

// Never destroyed: PyTorch frees tensors during exit, after static
// destructors may have run (its own allocator is never destroyed either).
RmmcAllocator& instance = *new RmmcAllocator;

} // namespace rmmc_torch

// ---- the C entry points rmmc.torch calls through ctypes ----
extern "C" {

// Installs the backend as PyTorch's CUDA allocator. Returns 0, or -1 with
// the reason in buf (PyTorch already initialized its allocator).
__attribute__((visibility("default"))) int rmmc_torch_native_install(char* buf, size_t len) {
  try {
    namespace CCA = c10::cuda::CUDACachingAllocator;
    CCA::CUDAAllocator* current = CCA::allocator.load();
    if (current == &rmmc_torch::instance)
      return 0;
    TORCH_CHECK(current == nullptr || !current->initialized(),
                "PyTorch has initialized its CUDA allocator already (",
                current != nullptr ? current->name() : std::string("none"),
                "): install rmmc before any CUDA use");
    rmmc_torch::the_allocator = &rmmc_torch::instance;
    CCA::allocator.store(&rmmc_torch::instance);
    c10::SetAllocator(c10::DeviceType::CUDA, &rmmc_torch::instance);
    return 0;
  } catch (const std::exception& e) {
    if (buf != nullptr && len > 0)
      std::snprintf(buf, len, "%s", e.what());
    return -1;
  }
}

// The stack of private pool (id0, id1) on `device` (one reference the
// caller releases), or NULL if the pool has none (yet) or does not exist.
__attribute__((visibility("default"))) rmmc_resource_t* rmmc_torch_native_pool_resource(
    int device, uint64_t id0, uint64_t id1) {
  try {
    return rmmc_torch::instance.pool_stack(static_cast<c10::DeviceIndex>(device), {id0, id1});
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The spec the calling thread's next private pools get (MemPool, a
// capture's pool) instead of the device's default; NULL or "" for the
// default again. The spec is built when the pool is, so a bad one fails
// there (rmmc.torch.pool_spec validates it first).
__attribute__((visibility("default"))) void rmmc_torch_native_set_pool_spec(const char* spec) {
  rmmc_torch::tls_pool_spec = spec != nullptr ? spec : "";
}

// The stack that handed out block `ptr` (one reference the caller
// releases), or NULL if the backend did not hand it out (rmmc.ipc's
// share_tensor exports a MemPool's tensors from their own stack).
__attribute__((visibility("default"))) rmmc_resource_t* rmmc_torch_native_block_resource(
    void* ptr) {
  try {
    return rmmc_torch::instance.block_stack(ptr);
  } catch (const std::exception&) {
    return nullptr;
  }
}

// Private pools alive on `device` (-1 for a bad device).
__attribute__((visibility("default"))) long rmmc_torch_native_pool_count(int device) {
  try {
    return static_cast<long>(rmmc_torch::instance.pool_count(static_cast<c10::DeviceIndex>(device)));
  } catch (const std::exception&) {
    return -1;
  }
}

// pools_describe's line for `device` into buf (n bytes, NUL-terminated);
// returns its length (-1 for a bad device), as snprintf.
__attribute__((visibility("default"))) long rmmc_torch_native_pools_describe(int device,
                                                                             char* buf,
                                                                             size_t n) {
  try {
    const std::string s =
        rmmc_torch::instance.pools_describe(static_cast<c10::DeviceIndex>(device));
    if (buf != nullptr && n > 0)
      snprintf(buf, n, "%s", s.c_str());
    return static_cast<long>(s.size());
  } catch (const std::exception&) {
    return -1;
  }
}

// Bytes out to PyTorch on `device`, each block rounded to 512 (-1 for a bad
// device).
__attribute__((visibility("default"))) long long rmmc_torch_native_bytes_out(int device) {
  try {
    return static_cast<long long>(
        rmmc_torch::instance.bytes_out(static_cast<c10::DeviceIndex>(device)));
  } catch (const std::exception&) {
    return -1;
  }
}

// rmmc.torch.stats() for `device` into out[0..n) (RmmcAllocator::plugin_stats
// gives the order). Returns how many it wrote, or -1 for a bad device.
__attribute__((visibility("default"))) int rmmc_torch_native_stats(int device, long long* out,
                                                                    int n) {
  try {
    long long v[rmmc_torch::RmmcAllocator::kPluginStats];
    rmmc_torch::instance.plugin_stats(static_cast<c10::DeviceIndex>(device), v);
    const int k = std::min(n, rmmc_torch::RmmcAllocator::kPluginStats);
    std::copy(v, v + k, out);
    return k;
  } catch (const std::exception&) {
    return -1;
  }
}

// rmmc's message for the last allocation the backend refused, copied into
// buf (NUL-terminated when len > 0). Returns its length without the NUL.
__attribute__((visibility("default"))) size_t rmmc_torch_native_last_error(char* buf,
                                                                         size_t len) {
  const std::string e = rmmc_torch::instance.last_oom_message();
  if (buf != nullptr && len > 0)
    std::snprintf(buf, len, "%s", e.c_str());
  return e.size();
}

// Memory hooks on device `device`'s default stack, riding on the backend's
// own (which keep the snapshot's segments and tell PyTorch's trace trackers):
// what rmmc.set_memory_hooks(device=) calls while the backend is installed.
// Statuses as rmmc_resource_set_memory_hooks (RMMC_ERROR_INVALID_ARGUMENT
// for a bad device too).
__attribute__((visibility("default"))) rmmc_status_t rmmc_torch_native_set_memory_hooks(
    int device, const rmmc_memory_hooks_t* hooks) {
  try {
    return rmmc_torch::instance.set_user_hooks(static_cast<c10::DeviceIndex>(device), hooks);
  } catch (const std::exception&) {
    return RMMC_ERROR_INVALID_ARGUMENT;
  }
}

// `config` (RMMC_ALLOC_CONF's form) with the pages of every cuda layer
// under a pool made shareable where it does not say (config_with_defaults),
// copied into buf (NUL-terminated when len > 0). Returns its length.
__attribute__((visibility("default"))) size_t rmmc_torch_native_shareable_config(
    const char* config, char* buf, size_t len) {
  const std::string out = rmmc_torch::config_with_defaults(config != nullptr ? config : "");
  if (buf != nullptr && len > 0)
    std::snprintf(buf, len, "%s", out.c_str());
  return out.size();
}

// rmmc.torch.use() made the process configuration `shareable` from
// `original`: the stacks the backend builds share their pages from now on,
// and where a device cannot, they are built from `original`.
__attribute__((visibility("default"))) void rmmc_torch_native_set_configs(const char* shareable,
                                                                           const char* original) {
  rmmc_torch::instance.set_configs(shareable, original);
}

// Which PyTorch version the backend was compiled for ("2.11").
__attribute__((visibility("default"))) const char* rmmc_torch_native_torch_version(void) {
  return TORCH_VERSION;
}

} // extern "C"

#endif // RMMC_TORCH_NATIVE_SELFTEST
