// SPDX-License-Identifier: Apache-2.0
/*
 * peers: the allocators rmmc is compared with, measured by rmmc-bench's and
 * rmmc-replay's own engines (tools/bench_engine.c, tools/replay_engine.c,
 * linked in): each peer is wrapped as an rmmc resource, so the op
 * sequences, threads, streams, clocks and checks are those of the tools.
 *
 *   cca                 PyTorch's CUDA caching allocator (c10), through
 *                       raw_alloc_with_stream(size, stream) / raw_delete(ptr)
 *   cca_expandable      the same with expandable segments (the process must
 *                       run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
 *                       checked at start)
 *   cuda_async          cudaMallocFromPoolAsync / cudaFreeAsync on the device's
 *                       default pool, release threshold set to UINT64_MAX
 *   cuda_async_default  the same pool with its release threshold left as the
 *                       driver has it: what rmmc-bench's baseline
 *                       cuda_async(default_pool=true) calls
 *   cudaMalloc          cudaMalloc / cudaFree
 *
 * One allocator per process (the caching allocator reads its configuration
 * from the environment once); scripts/peers runs them all and merges the
 * JSON. Each bench row and each replay gets a fresh wrapper; creating it
 * empties the peer's cache and resets its peak, destroying it empties the
 * cache again (emptyCache, cudaMemPoolTrimTo), as rmmc-bench builds a fresh
 * stack per row.
 *
 * The wrapper's describe reports the peer's own figures: "in_use" (bytes
 * handed out: c10's allocated_bytes, the pool's UsedMemCurrent, cudaMalloc's
 * outstanding bytes), "reserved" and "peak" (c10's reserved_bytes, the
 * pool's ReservedMem{Current,High}, cudaMalloc's outstanding bytes) and,
 * where counted, "upstream_calls" (c10's num_device_alloc + num_device_free,
 * cudaMalloc's calls). bench_measure checks "in_use" is 0 after every run;
 * a replay reports "peak" as peak reserved (warm: over both epochs), and
 * the timed epoch's own figures through the engine's epoch callback.
 */
#include <algorithm>
#include <string>
#include <vector>

extern "C" {
#include "bench_engine.h"
#include "cli.h"
#include "replay_engine.h"
#include "rmmc/resource_ops.h"
}

#ifndef PEERS_NO_TORCH
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#endif

namespace {

enum Kind { CCA, CCA_EXPANDABLE, CUDA_ASYNC, CUDA_ASYNC_DEFAULT, CUDA_MALLOC };
const char *const kNames[] = {"cca", "cca_expandable", "cuda_async", "cuda_async_default",
                              "cudaMalloc"};

struct Peer {
  rmmc_resource_t base;
  rmmc_resource_ops_t ops;
  Kind kind;
  cudaMemPool_t pool;
  uint64_t current, peak, calls; /* cudaMalloc's, atomic */
};

Peer *peer_of(rmmc_resource_t *r) { return reinterpret_cast<Peer *>(r); }

rmmc_status_t cuda_failed(cudaError_t e, const char *what) {
  (void)cudaGetLastError();
  return rmmc_set_cuda_error(e, what);
}

#ifndef PEERS_NO_TORCH
namespace CCA_ = c10::cuda::CUDACachingAllocator;

/* c10 reports failures as exceptions; the wrapper turns them into statuses. */
template <typename F>
rmmc_status_t c10_call(const char *what, F f) {
  try {
    f();
    return RMMC_SUCCESS;
  } catch (const c10::OutOfMemoryError &x) {
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: %s", what, x.what_without_backtrace());
  } catch (const c10::Error &x) {
    return rmmc_set_error(RMMC_ERROR_CUDA, "%s: %s", what, x.what_without_backtrace());
  } catch (const std::exception &x) {
    return rmmc_set_error(RMMC_ERROR_CUDA, "%s: %s", what, x.what());
  }
}

bool c10_stats(int device, c10::CachingDeviceAllocator::DeviceStats *s) {
  return c10_call("getDeviceStats", [&] { *s = CCA_::getDeviceStats((c10::DeviceIndex)device); }) ==
         RMMC_SUCCESS;
}
#endif

rmmc_status_t peer_allocate(rmmc_resource_t *r, size_t bytes, size_t, cudaStream_t stream,
                            void **out) {
  Peer *p = peer_of(r);
  cudaError_t e;
  switch (p->kind) {
#ifndef PEERS_NO_TORCH
    case CCA:
    case CCA_EXPANDABLE:
      return c10_call("raw_alloc_with_stream",
                      [&] { *out = CCA_::raw_alloc_with_stream(bytes, stream); });
#endif
    case CUDA_ASYNC:
    case CUDA_ASYNC_DEFAULT:
      e = cudaMallocFromPoolAsync(out, bytes, p->pool, stream);
      return e == cudaSuccess ? RMMC_SUCCESS : cuda_failed(e, "cudaMallocFromPoolAsync");
    default:
      e = cudaMalloc(out, bytes);
      __atomic_fetch_add(&p->calls, 1, __ATOMIC_RELAXED);
      if (e != cudaSuccess) return cuda_failed(e, "cudaMalloc");
      uint64_t now = __atomic_add_fetch(&p->current, bytes, __ATOMIC_RELAXED);
      uint64_t peak = __atomic_load_n(&p->peak, __ATOMIC_RELAXED);
      while (peak < now && !__atomic_compare_exchange_n(&p->peak, &peak, now, true,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      }
      return RMMC_SUCCESS;
  }
}

rmmc_status_t peer_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t,
                              cudaStream_t stream) {
  Peer *p = peer_of(r);
  cudaError_t e;
  switch (p->kind) {
#ifndef PEERS_NO_TORCH
    case CCA:
    case CCA_EXPANDABLE:
      return c10_call("raw_delete", [&] { CCA_::raw_delete(ptr); });
#endif
    case CUDA_ASYNC:
    case CUDA_ASYNC_DEFAULT:
      e = cudaFreeAsync(ptr, stream);
      return e == cudaSuccess ? RMMC_SUCCESS : cuda_failed(e, "cudaFreeAsync");
    default:
      e = cudaFree(ptr);
      __atomic_fetch_add(&p->calls, 1, __ATOMIC_RELAXED);
      if (e != cudaSuccess) return cuda_failed(e, "cudaFree");
      __atomic_fetch_sub(&p->current, bytes, __ATOMIC_RELAXED);
      return RMMC_SUCCESS;
  }
}

void emit(rmmc_field_cb cb, void *ctx, const char *key, rmmc_field_kind_t kind, uint64_t v) {
  rmmc_field_t f = {key, kind, v, nullptr};
  cb(ctx, &f);
}

void peer_describe(rmmc_resource_t *r, rmmc_field_cb cb, void *ctx) {
  Peer *p = peer_of(r);
  uint64_t used, reserved, high;
  switch (p->kind) {
#ifndef PEERS_NO_TORCH
    case CCA:
    case CCA_EXPANDABLE: {
      c10::CachingDeviceAllocator::DeviceStats s;
      if (!c10_stats(r->device, &s)) return;
      emit(cb, ctx, "in_use", RMMC_FIELD_BYTES, (uint64_t)s.allocated_bytes[0].current);
      emit(cb, ctx, "reserved", RMMC_FIELD_BYTES, (uint64_t)s.reserved_bytes[0].current);
      emit(cb, ctx, "peak", RMMC_FIELD_BYTES, (uint64_t)s.reserved_bytes[0].peak);
      emit(cb, ctx, "upstream_calls", RMMC_FIELD_COUNT,
           (uint64_t)(s.num_device_alloc + s.num_device_free));
      emit(cb, ctx, "alloc_retries", RMMC_FIELD_COUNT, (uint64_t)s.num_alloc_retries);
      emit(cb, ctx, "sync_all_streams", RMMC_FIELD_COUNT, (uint64_t)s.num_sync_all_streams);
      return;
    }
#endif
    case CUDA_ASYNC:
    case CUDA_ASYNC_DEFAULT:
      if (cudaMemPoolGetAttribute(p->pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess ||
          cudaMemPoolGetAttribute(p->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) !=
              cudaSuccess ||
          cudaMemPoolGetAttribute(p->pool, cudaMemPoolAttrReservedMemHigh, &high) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      emit(cb, ctx, "in_use", RMMC_FIELD_BYTES, used);
      emit(cb, ctx, "reserved", RMMC_FIELD_BYTES, reserved);
      emit(cb, ctx, "peak", RMMC_FIELD_BYTES, high);
      return;
    default:
      used = __atomic_load_n(&p->current, __ATOMIC_RELAXED);
      emit(cb, ctx, "in_use", RMMC_FIELD_BYTES, used);
      emit(cb, ctx, "reserved", RMMC_FIELD_BYTES, used);
      emit(cb, ctx, "peak", RMMC_FIELD_BYTES, __atomic_load_n(&p->peak, __ATOMIC_RELAXED));
      emit(cb, ctx, "upstream_calls", RMMC_FIELD_COUNT, __atomic_load_n(&p->calls, __ATOMIC_RELAXED));
      return;
  }
}

/* The peak ("peak") restarted from the current figure. */
rmmc_status_t peer_reset_peak(Peer *p) {
  uint64_t zero = 0; /* a pool's high-water marks reset to the current values */
  cudaError_t e = cudaSuccess;
  switch (p->kind) {
#ifndef PEERS_NO_TORCH
    case CCA:
    case CCA_EXPANDABLE:
      return c10_call("resetPeakStats",
                      [&] { CCA_::resetPeakStats((c10::DeviceIndex)p->base.device); });
#endif
    case CUDA_ASYNC:
    case CUDA_ASYNC_DEFAULT:
      e = cudaMemPoolSetAttribute(p->pool, cudaMemPoolAttrReservedMemHigh, &zero);
      if (e == cudaSuccess) e = cudaMemPoolSetAttribute(p->pool, cudaMemPoolAttrUsedMemHigh, &zero);
      return e == cudaSuccess ? RMMC_SUCCESS : cuda_failed(e, "cudaMemPoolSetAttribute(high)");
    default:
      __atomic_store_n(&p->peak, __atomic_load_n(&p->current, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
      return RMMC_SUCCESS;
  }
}

/* Everything cached given back (after the device is idle), then the peak
 * restarted. */
rmmc_status_t peer_empty(Peer *p) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return cuda_failed(e, "cudaDeviceSynchronize");
  rmmc_status_t st = RMMC_SUCCESS;
  if (p->kind == CUDA_ASYNC || p->kind == CUDA_ASYNC_DEFAULT) {
    e = cudaMemPoolTrimTo(p->pool, 0);
    if (e != cudaSuccess) return cuda_failed(e, "cudaMemPoolTrimTo");
  }
#ifndef PEERS_NO_TORCH
  if (p->kind == CCA || p->kind == CCA_EXPANDABLE) st = c10_call("emptyCache", [] { CCA_::emptyCache(); });
#endif
  return st == RMMC_SUCCESS ? peer_reset_peak(p) : st;
}

void peer_destroy(rmmc_resource_t *r) {
  Peer *p = peer_of(r);
  if (peer_empty(p) != RMMC_SUCCESS)
    fprintf(stderr, "peers: emptying %s's cache failed: %s\n", p->ops.name, rmmc_last_error_message());
  delete p;
}

/* Readies the allocator once per process and checks it is the one named;
 * *detail says what exactly runs. */
rmmc_status_t peer_setup(Kind kind, int device, std::string *detail) {
  if (kind == CUDA_ASYNC || kind == CUDA_ASYNC_DEFAULT) {
    int supported = 0;
    cudaMemPool_t pool;
    uint64_t before = 0, threshold = UINT64_MAX;
    cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
    if (e != cudaSuccess) return cuda_failed(e, "cudaDeviceGetAttribute(MemoryPoolsSupported)");
    if (!supported) return rmmc_set_error(RMMC_ERROR_CUDA, "device %d has no memory pools", device);
    e = cudaDeviceGetDefaultMemPool(&pool, device);
    if (e == cudaSuccess) e = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &before);
    if (e == cudaSuccess && kind == CUDA_ASYNC)
      e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e != cudaSuccess) return cuda_failed(e, "the default pool's release threshold");
    *detail = std::string("cudaMallocFromPoolAsync/cudaFreeAsync on the device's default pool, "
                          "release threshold ") +
              (kind == CUDA_ASYNC ? "set to UINT64_MAX" : "left as it was") + " (it was " +
              std::to_string(before) + ")";
    return RMMC_SUCCESS;
  }
  if (kind == CUDA_MALLOC) {
    *detail = "cudaMalloc/cudaFree";
    return RMMC_SUCCESS;
  }
#ifdef PEERS_NO_TORCH
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "built without PyTorch (-DPEERS_NO_TORCH)");
#else
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cuda_failed(e, "cudaGetDeviceCount");
  bool expandable = kind == CCA_EXPANDABLE;
  std::string backend;
  bool configured = false;
  rmmc_status_t st = c10_call("the caching allocator", [&] {
    CCA_::init(count); /* what torch.cuda's lazy init does; a no-op when done */
    backend = CCA_::get()->name();
    configured = c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
  });
  if (st != RMMC_SUCCESS) return st;
  if (backend == "cudaMallocAsync")
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "PyTorch's CUDA allocator backend is 'cudaMallocAsync', not the caching "
                          "allocator: unset backend: in PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF");
  if (configured != expandable)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "expandable segments are %s in this process but '%s' wants them %s",
                          configured ? "on" : "off", kNames[kind],
                          expandable ? "on (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
                                     : "off (unset PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF)");
  /* A probe: a block on a stream the allocator did not create must land in
   * a segment of the kind asked for. */
  cudaStream_t probe;
  e = cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_failed(e, "cudaStreamCreateWithFlags");
  std::string note = "; note: the probe allocation is in no segment of the snapshot";
  st = c10_call("the probe", [&] {
    void *p = CCA_::raw_alloc_with_stream((size_t)4 << 20, probe);
    for (const auto &seg : CCA_::snapshot().segments)
      if ((size_t)p >= seg.address && (size_t)p < seg.address + seg.total_size)
        note = seg.is_expandable != expandable ? "; WRONG SEGMENT KIND"
               : seg.stream != (void *)probe   ? "; note: the snapshot names another stream"
                                               : "";
    CCA_::raw_delete(p);
  });
  (void)cudaStreamSynchronize(probe);
  (void)cudaStreamDestroy(probe);
  if (st == RMMC_SUCCESS && note == "; WRONG SEGMENT KIND")
    st = rmmc_set_error(RMMC_ERROR_INTERNAL, "the caching allocator made the wrong kind of segment "
                                             "for '%s'", kNames[kind]);
  const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF"), *conf2 = getenv("PYTORCH_ALLOC_CONF");
  *detail = "PyTorch CUDA caching allocator (backend " + backend + ", expandable segments " +
            (expandable ? "on" : "off") + "), raw_alloc_with_stream/raw_delete; "
            "PYTORCH_CUDA_ALLOC_CONF=" + (conf ? conf : "(unset)") +
            " PYTORCH_ALLOC_CONF=" + (conf2 ? conf2 : "(unset)") + note;
  return st;
#endif
}

/* A fresh wrapper (one reference), the peer's cache emptied first. */
rmmc_status_t peer_create(Kind kind, int device, rmmc_resource_t **out) {
  Peer *p = new Peer();
  p->kind = kind;
  p->ops.version = RMMC_RESOURCE_OPS_VERSION;
  p->ops.name = kNames[kind];
  p->ops.allocate = peer_allocate;
  p->ops.deallocate = peer_deallocate;
  p->ops.describe = peer_describe;
  p->ops.destroy = peer_destroy;
  rmmc_resource_init(&p->base, &p->ops, RMMC_MEMORY_DEVICE, device);
  cudaError_t e = cudaSuccess;
  if (kind == CUDA_ASYNC || kind == CUDA_ASYNC_DEFAULT) e = cudaDeviceGetDefaultMemPool(&p->pool, device);
  rmmc_status_t st = e == cudaSuccess ? peer_empty(p) : cuda_failed(e, "cudaDeviceGetDefaultMemPool");
  if (st != RMMC_SUCCESS) {
    delete p;
    return st;
  }
  *out = &p->base;
  return RMMC_SUCCESS;
}

uint64_t field(rmmc_resource_t *r, const char *key, bool *has = nullptr) {
  uint64_t v = 0;
  bool ok = rmmc_resource_get_field(r, key, &v);
  if (has != nullptr) *has = ok;
  return v;
}

/* ---- the command line ---- */

struct Case {
  bench_case_t c;
  std::string label;
};

struct Options {
  bool bench = true;
  Kind kind = CUDA_MALLOC;
  int device = 0;
  std::vector<int> threads;
  std::vector<Case> cases;
  bench_params_t p = {0, 100000, -1, 1, 0.25, false};
  bool cold = false, warm = false, single = false, quiet = false;
  const char *json = nullptr;
  std::vector<const char *> logs;
  std::string device_name, detail;
};

const char kUsage[] =
    "usage: peers bench|replay --allocator NAME [options] [LOG...]\n"
    "  --allocator NAME  cca, cca_expandable, cuda_async, cuda_async_default or cudaMalloc\n"
    "  --device N        the GPU (default 0)\n"
    "  --json FILE       the records as JSON\n"
    "  --quiet           no progress lines\n"
    "bench (rmmc-bench's engine):\n"
    "  --case pair:SIZE | random:MIN-MAX:LIVE   (repeatable; default pair:256, pair:1MiB,\n"
    "                    random:256-4MiB:1000, random:256-1MiB:200)\n"
    "  --threads LIST    thread counts (default 1,4,16)\n"
    "  --ops N --repeat N --seed N --budget SEC   as rmmc-bench (100000, 5, 1, 0.25)\n"
    "replay (rmmc-replay's engine), one record per log and epoch:\n"
    "  --epochs LIST     cold, warm or both (default cold,warm)\n"
    "  --repeat N        replays per epoch kind: ns figures are medians, memory figures\n"
    "                    the first's (default 1)\n"
    "  --single-thread   every event on one thread\n";

bool add_case(const char *text, std::vector<Case> *out) {
  std::string s = text;
  Case c = {};
  char a[32], b[32];
  size_t colon = s.find(':'), dash = s.find('-'), colon2 = s.rfind(':');
  if (s.compare(0, 5, "pair:") == 0) {
    if (!cli_parse_bytes("--case", text + 5, false, &c.c.min_bytes)) return false;
    c.c.pattern = BENCH_PAIR;
    c.c.max_bytes = c.c.min_bytes;
    cli_format_size(c.c.min_bytes, a, sizeof a);
    c.label = std::string("pair ") + a;
  } else if (s.compare(0, 7, "random:") == 0 && dash != std::string::npos && colon2 > dash) {
    unsigned long long live;
    if (!cli_parse_bytes("--case", s.substr(colon + 1, dash - colon - 1).c_str(), false,
                         &c.c.min_bytes) ||
        !cli_parse_bytes("--case", s.substr(dash + 1, colon2 - dash - 1).c_str(), false,
                         &c.c.max_bytes) ||
        !cli_parse_count("--case", text + colon2 + 1, 1, 1000000, &live))
      return false;
    c.c.pattern = BENCH_RANDOM;
    c.c.live = (size_t)live;
    cli_format_size(c.c.min_bytes, a, sizeof a);
    cli_format_size(c.c.max_bytes, b, sizeof b);
    c.label = std::string("random ") + a + "-" + b + " live " + std::to_string(live);
  } else {
    cli_usage_error("--case wants pair:SIZE or random:MIN-MAX:LIVE, not '%s'", text);
    return false;
  }
  out->push_back(c);
  return true;
}

/* -1 to go on, else the exit status. */
int parse_options(int argc, char **argv, Options *o) {
  static const struct option longs[] = {
      {"allocator", required_argument, nullptr, 'a'}, {"device", required_argument, nullptr, 'd'},
      {"json", required_argument, nullptr, 'j'},      {"quiet", no_argument, nullptr, 'q'},
      {"case", required_argument, nullptr, 'c'},      {"threads", required_argument, nullptr, 't'},
      {"ops", required_argument, nullptr, 'o'},       {"repeat", required_argument, nullptr, 'r'},
      {"seed", required_argument, nullptr, 's'},      {"budget", required_argument, nullptr, 'b'},
      {"epochs", required_argument, nullptr, 'e'},    {"single-thread", no_argument, nullptr, '1'},
      {"help", no_argument, nullptr, 'h'},            {nullptr, 0, nullptr, 0}};
  cli_program = "peers";
  if (argc < 2 || (strcmp(argv[1], "bench") != 0 && strcmp(argv[1], "replay") != 0)) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
      fputs(kUsage, stdout);
      return 0;
    }
    return cli_usage_error("the first argument is bench or replay");
  }
  o->bench = strcmp(argv[1], "bench") == 0;
  bool have_allocator = false;
  unsigned long long v;
  optind = 2;
  for (int ch; (ch = getopt_long(argc, argv, "", longs, nullptr)) != -1;) {
    std::string arg = optarg ? optarg : "";
    switch (ch) {
      case 'a': {
        const char *const *end = kNames + sizeof kNames / sizeof *kNames;
        const char *const *n = std::find_if(kNames, end, [&](const char *x) { return arg == x; });
        if (n == end) return cli_usage_error("unknown allocator '%s'", optarg);
        o->kind = (Kind)(n - kNames);
        have_allocator = true;
        break;
      }
      case 'd':
        if (!cli_parse_count("--device", optarg, 0, 1023, &v)) return CLI_EXIT_USAGE;
        o->device = (int)v;
        break;
      case 'j': o->json = optarg; break;
      case 'q': o->quiet = true; break;
      case 'c':
        if (!add_case(optarg, &o->cases)) return CLI_EXIT_USAGE;
        break;
      case 't':
        for (size_t at = 0; at <= arg.size();) {
          size_t comma = std::min(arg.find(',', at), arg.size());
          if (!cli_parse_count("--threads", arg.substr(at, comma - at).c_str(), 1,
                               BENCH_MAX_THREADS, &v))
            return CLI_EXIT_USAGE;
          o->threads.push_back((int)v);
          at = comma + 1;
        }
        break;
      case 'o':
        if (!cli_parse_count("--ops", optarg, 2, BENCH_MAX_OPS, &v)) return CLI_EXIT_USAGE;
        o->p.ops = (size_t)v & ~(size_t)1;
        break;
      case 'r':
        if (!cli_parse_count("--repeat", optarg, 1, BENCH_MAX_REPEAT, &v)) return CLI_EXIT_USAGE;
        o->p.repeat = (int)v;
        break;
      case 's':
        if (!cli_parse_count("--seed", optarg, 0, UINT64_MAX, &v)) return CLI_EXIT_USAGE;
        o->p.seed = v;
        break;
      case 'b': {
        char *end;
        o->p.budget_s = strtod(optarg, &end);
        if (*end != '\0' || !(o->p.budget_s >= 0 && o->p.budget_s <= 3600))
          return cli_usage_error("--budget wants seconds from 0 to 3600, not '%s'", optarg);
        break;
      }
      case 'e':
        o->cold = arg.find("cold") != std::string::npos;
        o->warm = arg.find("warm") != std::string::npos;
        if (!o->cold && !o->warm) return cli_usage_error("--epochs wants cold, warm or both");
        break;
      case '1': o->single = true; break;
      case 'h': fputs(kUsage, stdout); return 0;
      default: return CLI_EXIT_USAGE;
    }
  }
  if (!have_allocator) return cli_usage_error("--allocator is required");
  for (int i = optind; i < argc; i++) o->logs.push_back(argv[i]);
  if (o->bench) {
    if (!o->logs.empty()) return cli_usage_error("bench takes no logs");
    if (o->cases.empty())
      for (const char *c : {"pair:256", "pair:1MiB", "random:256-4MiB:1000", "random:256-1MiB:200"})
        add_case(c, &o->cases);
    if (o->threads.empty()) o->threads = {1, 4, 16};
    if (o->p.repeat < 0) o->p.repeat = 5;
  } else {
    if (o->logs.empty()) return cli_usage_error("replay: no log given");
    if (!o->cold && !o->warm) o->cold = o->warm = true;
    if (o->p.repeat < 0) o->p.repeat = 1;
  }
  return -1;
}

FILE *open_json(const Options &o) {
  if (o.json == nullptr) return nullptr;
  FILE *f = fopen(o.json, "w");
  if (f == nullptr) fprintf(stderr, "peers: cannot write --json %s: %s\n", o.json, strerror(errno));
  return f;
}

void json_common(FILE *f, const Options &o) {
  fputs("\"allocator\": ", f);
  cli_json_string(f, kNames[o.kind]);
  fputs(", \"allocator_detail\": ", f);
  cli_json_string(f, o.detail.c_str());
  fputs(", \"device\": ", f);
  cli_json_string(f, o.device_name.c_str());
  fprintf(f, ", \"device_id\": %d", o.device);
}

int run_bench(const Options &o) {
  struct Row {
    const Case *c;
    int threads;
    bench_result_t res;
  };
  std::vector<Row> rows;
  for (const Case &c : o.cases)
    for (int t : o.threads) rows.push_back(Row{&c, t, {}});
  int rc = 0;
  printf("# peers bench | %s | %s | seed %llu, %d runs, %zu ops per thread and run, budget %g s\n"
         "# %s\n%-18s  %-24s  %3s  %9s  %10s  %10s  %12s\n",
         kNames[o.kind], o.device_name.c_str(), (unsigned long long)o.p.seed, o.p.repeat, o.p.ops,
         o.p.budget_s, o.detail.c_str(), "allocator", "pattern", "thr", "ops", "ns/call", "min",
         "ops/s");
  for (Row &r : rows) {
    bench_params_t p = o.p;
    p.threads = r.threads;
    rmmc_resource_t *res = nullptr;
    if (peer_create(o.kind, o.device, &res) != RMMC_SUCCESS) {
      snprintf(r.res.error, sizeof r.res.error, "%s", rmmc_last_error_message());
    } else {
      bench_measure(res, &r.c->c, &p, &r.res); /* takes over the reference */
    }
    if (!r.res.ok) {
      rc = 1;
      printf("%-18s  %-24s  %3d  FAILED: %s\n", kNames[o.kind], r.c->label.c_str(), r.threads,
             r.res.error);
    } else {
      printf("%-18s  %-24s  %3d  %8zu%s  %10.1f  %10.1f  %12.0f\n", kNames[o.kind],
             r.c->label.c_str(), r.threads, r.res.ops, r.res.ops < o.p.ops ? "*" : " ",
             r.res.median, r.res.min, r.res.ops_per_s);
    }
    fflush(stdout);
  }
  printf("# ns/call: median of %d runs of wall time * threads / calls; *: cut by the budget\n",
         o.p.repeat);
  FILE *f = open_json(o);
  if (o.json != nullptr && f == nullptr) return 3;
  if (f == nullptr) return rc;
  fputs("[\n", f);
  for (size_t i = 0; i < rows.size(); i++) {
    const Row &r = rows[i];
    const bench_case_t &c = r.c->c;
    fputs("  {\"stack\": ", f);
    cli_json_string(f, kNames[o.kind]);
    fputs(", ", f);
    json_common(f, o);
    fprintf(f, ", \"memory\": \"device\", \"pattern\": \"%s\", \"label\": ",
            c.pattern == BENCH_PAIR ? "pair" : "random");
    cli_json_string(f, r.c->label.c_str());
    fprintf(f, ", \"threads\": %d, \"ops\": %zu, \"ops_requested\": %zu, \"runs\": %d", r.threads,
            r.res.ops, o.p.ops, r.res.runs);
    if (r.res.ok) {
      fprintf(f, ", \"ns_per_call\": %.3f, \"min\": %.3f, \"max\": %.3f, \"ns_runs\": [",
              r.res.median, r.res.min, r.res.max);
      for (int k = 0; k < r.res.runs; k++) fprintf(f, "%s%.3f", k ? ", " : "", r.res.ns[k]);
      fprintf(f, "], \"ops_per_s\": %.1f", r.res.ops_per_s);
    } else {
      fputs(", \"ns_per_call\": null, \"min\": null, \"max\": null, \"ns_runs\": [], "
            "\"ops_per_s\": null", f);
    }
    fprintf(f, ", \"size_min\": %zu, \"size_max\": %zu, \"live\": %zu, \"seed\": %llu, "
               "\"budget_s\": %g, \"status\": \"%s\", \"error\": ",
            c.min_bytes, c.max_bytes, c.live, (unsigned long long)o.p.seed, o.p.budget_s,
            r.res.ok ? "ok" : "failed");
    if (r.res.ok) fputs("null", f);
    else cli_json_string(f, r.res.error);
    fprintf(f, "}%s\n", i + 1 < rows.size() ? "," : "");
  }
  fputs("]\n", f);
  return fclose(f) == 0 ? rc : 3;
}

/* The timed epoch's own figures, read by the engine's epoch callback. */
struct Epoch {
  rmmc_resource_t *r;
  uint64_t reserved_at_start, timed_start_reserved, timed_start_calls, untimed_peak;
  rmmc_status_t st;
};

/* Before each pass: the reserved bytes then; before the timed one also the
 * upstream count and the untimed pass's peak, and the peak restarts. */
void on_epoch(void *ctx, int pass) {
  Epoch *e = static_cast<Epoch *>(ctx);
  uint64_t reserved = field(e->r, "reserved");
  if (pass == 0) e->reserved_at_start = reserved;
  if (pass != 1) return;
  e->timed_start_reserved = reserved;
  e->timed_start_calls = field(e->r, "upstream_calls");
  e->untimed_peak = field(e->r, "peak");
  e->st = peer_reset_peak(peer_of(e->r));
}

struct ReplayRow {
  replay_result_t res;
  const replay_log_t *log;
  uint64_t reserved_at_start, timed_peak, timed_growth;
  bool has_calls;
  rmmc_status_t st;
};

/* One log and epoch kind, o.p.repeat times, each on a fresh wrapper. */
void replay_row(const Options &o, const replay_log_t *log, bool warm, ReplayRow *row) {
  std::vector<double> ns;
  for (int k = 0; k < o.p.repeat; k++) {
    replay_result_t res;
    rmmc_resource_t *r = nullptr;
    rmmc_status_t st = peer_create(o.kind, o.device, &r);
    if (st != RMMC_SUCCESS) {
      memset(&res, 0, sizeof res);
      snprintf(res.error, sizeof res.error, "%s", rmmc_last_error_message());
    } else {
      Epoch e = {r, 0, 0, 0, 0, RMMC_SUCCESS};
      replay_options_t opts = REPLAY_OPTIONS_INIT;
      opts.device = o.device;
      opts.threads = !o.single;
      opts.warm = warm;
      opts.epoch = on_epoch;
      opts.epoch_ctx = &e;
      st = replay_run_resource(log, r, &opts, &res);
      if (st == RMMC_SUCCESS && e.st != RMMC_SUCCESS) {
        st = e.st;
        snprintf(res.error, sizeof res.error, "%s", rmmc_last_error_message());
      }
      if (st == RMMC_SUCCESS && k == 0) {
        /* Peak reserved over both epochs; the timed epoch's own too. */
        row->timed_peak = field(r, "peak");
        res.has_reserved = true;
        res.peak_reserved = std::max(row->timed_peak, e.untimed_peak);
        res.end_reserved = field(r, "reserved");
        res.upstream_calls = field(r, "upstream_calls", &row->has_calls) - e.timed_start_calls;
        row->reserved_at_start = warm ? e.reserved_at_start : e.timed_start_reserved;
        row->timed_growth = row->timed_peak > e.timed_start_reserved
                                ? row->timed_peak - e.timed_start_reserved
                                : 0;
      }
      rmmc_resource_release(r);
    }
    if (k == 0) {
      row->res = res;
      row->st = st;
    } else {
      replay_result_fini(&res);
    }
    if (st != RMMC_SUCCESS) break;
    ns.push_back(res.ns_per_call);
  }
  if (row->st == RMMC_SUCCESS && !ns.empty()) {
    std::sort(ns.begin(), ns.end());
    row->res.repeats = (unsigned)ns.size();
    row->res.ns_per_call_min = ns[0];
    row->res.ns_per_call = ns[ns.size() / 2];
  }
}

int run_replay(const Options &o) {
  std::vector<replay_log_t *> logs;
  std::vector<ReplayRow> rows;
  int rc = 0;
  for (const char *path : o.logs) {
    replay_read_options_t ro = REPLAY_READ_OPTIONS_INIT;
    replay_log_t *log = nullptr;
    if (replay_log_read(path, &ro, &log) != RMMC_SUCCESS) {
      fprintf(stderr, "peers: %s\n", rmmc_last_error_message());
      rc = CLI_EXIT_USAGE;
      break;
    }
    logs.push_back(log);
  }
  printf("# peers replay | %s | %s | %d replay%s per epoch kind\n# %s\n", kNames[o.kind],
         o.device_name.c_str(), o.p.repeat, o.p.repeat == 1 ? "" : "s", o.detail.c_str());
  for (size_t i = 0; i < logs.size() && rc == 0; i++) {
    std::vector<replay_result_t> results;
    for (int warm = o.cold ? 0 : 1; warm <= (o.warm ? 1 : 0); warm++) {
      ReplayRow row = {};
      row.log = logs[i];
      replay_row(o, logs[i], warm == 1, &row);
      if (row.st != RMMC_SUCCESS) {
        fprintf(stderr, "peers: %s | %s | %s: %s\n", kNames[o.kind], logs[i]->name,
                warm ? "warm" : "cold", row.res.error);
        rc = 1;
      }
      rows.push_back(row);
      results.push_back(row.res);
    }
    replay_write_table(stdout, logs[i], results.data(), results.size());
    fflush(stdout);
  }
  FILE *f = rc == 0 ? open_json(o) : nullptr;
  if (f != nullptr) {
    /* The engine's records ("records"), and what only peers knows about
     * each ("extra", in the same order): scripts/peers merges them. */
    fputs("{\"records\": [", f);
    for (size_t i = 0; i < rows.size(); i++) {
      fputs(i ? ",\n" : "\n", f);
      if (replay_write_json(f, rows[i].log, &rows[i].res, 1) != RMMC_SUCCESS) rc = 3;
    }
    fputs("],\n \"extra\": [", f);
    for (size_t i = 0; i < rows.size(); i++) {
      const ReplayRow &r = rows[i];
      double live = (double)r.log->peak_live;
      fprintf(f, "%s\n  {", i ? "," : "");
      json_common(f, o);
      fprintf(f, ", \"reserved_at_start_bytes\": %llu, \"timed_epoch_peak_reserved_bytes\": %llu, "
                 "\"timed_epoch_reserved_growth_bytes\": %llu, \"timed_epoch_ratio\": ",
              (unsigned long long)r.reserved_at_start, (unsigned long long)r.timed_peak,
              (unsigned long long)r.timed_growth);
      if (live > 0) fprintf(f, "%.6f", (double)r.timed_peak / live);
      else fputs("null", f);
      if (!r.has_calls) fputs(", \"upstream_calls\": null", f);
      fputs("}", f);
    }
    fputs("]}\n", f);
    if (fclose(f) != 0) rc = 3;
  } else if (o.json != nullptr && rc == 0) {
    rc = 3;
  }
  for (ReplayRow &r : rows) replay_result_fini(&r.res);
  for (replay_log_t *log : logs) replay_log_free(log);
  return rc;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;
  cudaDeviceProp prop;
  cudaError_t e = cudaSetDevice(o.device);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, o.device);
  if (e != cudaSuccess) {
    fprintf(stderr, "peers: no GPU %d: %s\n", o.device, cudaGetErrorString(e));
    return 77;
  }
  o.device_name = prop.name;
  if (peer_setup(o.kind, o.device, &o.detail) != RMMC_SUCCESS) {
    fprintf(stderr, "peers: %s: %s\n", kNames[o.kind], rmmc_last_error_message());
    return 1;
  }
  return o.bench ? run_bench(o) : run_replay(o);
}
