/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Framework plug-ins (see plugins.h): PyTorch's CUDAPluggableAllocator and
 * CuPy's CFunctionAllocator entry points.
 *
 * Both share one allocate path and one free path. Every block handed out
 * is kept in a sharded open-addressing hash map keyed by pointer (64 shards,
 * each with its own mutex, linear probing with backward-shift deletion, so
 * no tombstones), holding what the free needs: size, stream, device, the
 * resource (retained, so a registry change does not send the block to the
 * wrong resource) and the streams PyTorch recorded for it. Per-device
 * figures are relaxed atomics; the limit is enforced by reserving the bytes
 * with an atomic add before the resource is asked and giving them back if
 * the limit or the resource says no. Nothing here aborts or throws: every
 * failure returns NULL (or returns) after recording its message.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"
#include "base/ipc_handle.h"
#include "rmmc/defaults.h"
#include "rmmc/plugins.h"
#include "rmmc/pool_resource.h"
#include "rmmc/registry.h"
#include "rmmc/stream.h"

#define SHARD_BITS 6
#define SHARDS (1u << SHARD_BITS)
#define MAX_RECORDED 16
#define OTHER_DEVICE RMMC_MAX_DEVICES /* counts for device ids out of range */

typedef struct block {
  void *ptr; /* NULL: empty slot */
  size_t size;
  cudaStream_t stream;
  rmmc_resource_t *resource; /* retained */
  int device;
  int nrecorded;          /* -1: too many, wait for the device at free */
  cudaStream_t *recorded; /* malloc'ed on the first record_stream */
} block_t;

typedef struct shard {
  pthread_mutex_t lock;
  block_t *slots;
  size_t cap; /* a power of two, or 0 */
  size_t count;
} shard_t;

typedef struct device_figures {
  uint64_t allocations, allocation_failures, deallocations, deallocation_failures;
  uint64_t unknown_frees, recorded_streams, live_blocks, bytes_in_use, peak_bytes, limit;
} device_figures_t;

static shard_t shards[SHARDS];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static device_figures_t figures[RMMC_MAX_DEVICES + 1];
static uint64_t total_in_use, total_peak;
static uint64_t used_devices; /* bit d: the plug-ins allocated on device d */
static int torch_device_count; /* from rmmc_torch_init; 0: not told */

static pthread_mutex_t last_error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

static void init_shards(void) {
  for (unsigned i = 0; i < SHARDS; i++) pthread_mutex_init(&shards[i].lock, NULL);
}

/* ---- the map ---- */

static uint64_t hash_ptr(const void *p) {
  return ((uint64_t)(uintptr_t)p >> 8) * UINT64_C(0x9E3779B97F4A7C15);
}

static shard_t *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }

static size_t home_of(uint64_t h, size_t cap) { return (size_t)(h ^ (h >> 29)) & (cap - 1); }

/* The slot holding p, or cap if none. Caller holds the shard's lock. */
static size_t find_slot(const shard_t *s, const void *p, uint64_t h) {
  if (s->cap == 0) return 0;
  for (size_t i = home_of(h, s->cap);; i = (i + 1) & (s->cap - 1)) {
    if (s->slots[i].ptr == p) return i;
    if (s->slots[i].ptr == NULL) return s->cap;
  }
}

static void place(block_t *slots, size_t cap, const block_t *b) {
  size_t i = home_of(hash_ptr(b->ptr), cap);
  while (slots[i].ptr != NULL) i = (i + 1) & (cap - 1);
  slots[i] = *b;
}

/* Doubles the table (load stays at most 3/4). Caller holds the lock. */
static bool grow(shard_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  block_t *slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return false;
  for (size_t i = 0; i < s->cap; i++)
    if (s->slots[i].ptr != NULL) place(slots, cap, &s->slots[i]);
  free(s->slots);
  s->slots = slots;
  s->cap = cap;
  return true;
}

static bool map_insert(const block_t *b) {
  shard_t *s = shard_of(hash_ptr(b->ptr));
  pthread_mutex_lock(&s->lock);
  bool ok = (s->count + 1) * 4 <= s->cap * 3 || grow(s);
  if (ok) {
    place(s->slots, s->cap, b);
    s->count++;
  }
  pthread_mutex_unlock(&s->lock);
  return ok;
}

/* Removes p's block into *out; false if p is not in the map. */
static bool map_remove(const void *p, block_t *out) {
  uint64_t h = hash_ptr(p);
  shard_t *s = shard_of(h);
  pthread_mutex_lock(&s->lock);
  size_t i = find_slot(s, p, h);
  bool found = i < s->cap;
  if (found) {
    *out = s->slots[i];
    /* Backward-shift deletion: pull later members of the probe run into
     * the hole when their home does not lie cyclically in (hole, j]. */
    size_t mask = s->cap - 1;
    for (size_t j = (i + 1) & mask; s->slots[j].ptr != NULL; j = (j + 1) & mask) {
      size_t home = home_of(hash_ptr(s->slots[j].ptr), s->cap);
      if (((j - home) & mask) >= ((j - i) & mask)) {
        s->slots[i] = s->slots[j];
        i = j;
      }
    }
    s->slots[i].ptr = NULL;
    s->count--;
  }
  pthread_mutex_unlock(&s->lock);
  return found;
}

/* ---- figures and failures ---- */

static device_figures_t *figures_of(int device) {
  return &figures[device >= 0 && device < RMMC_MAX_DEVICES ? device : OTHER_DEVICE];
}

/* Keeps this thread's last message process-wide too. */
static void note_failure(void) {
  pthread_mutex_lock(&last_error_lock);
  snprintf(last_error, sizeof last_error, "%s", rmmc_last_error_message());
  pthread_mutex_unlock(&last_error_lock);
}

static bool device_ok(int device, const char *who) {
  int n = __atomic_load_n(&torch_device_count, __ATOMIC_RELAXED);
  if (device >= 0 && device < RMMC_MAX_DEVICES && (n == 0 || device < n)) return true;
  rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range", who, device);
  return false;
}

/* ---- the shared allocate and free paths ---- */

static void *plugin_alloc(size_t size, int device, cudaStream_t stream, const char *who) {
  if (size == 0) return NULL;
  pthread_once(&init_once, init_shards);
  device_figures_t *f = figures_of(device);
  rmmc_resource_t *r = NULL;
  void *p = NULL;
  if (!device_ok(device, who)) goto failed;
  /* Atomic with a set on another thread: a borrowed
   * pointer retained afterwards may already be freed. */
  if (rmmc_retain_device_resource(device, &r) != RMMC_SUCCESS) goto failed;
  uint64_t limit = __atomic_load_n(&f->limit, __ATOMIC_RELAXED);
  uint64_t now = rmmc__atomic_add_u64(&f->bytes_in_use, size);
  if (limit != 0 && now > limit) {
    char a[32], b[32], c[32];
    rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                   "out of memory: %s: %s on device %d would exceed the plug-in limit of %s "
                   "(%s in use)",
                   who, rmmc__format_bytes(size, a, sizeof a), device,
                   rmmc__format_bytes(limit, b, sizeof b),
                   rmmc__format_bytes(now - size, c, sizeof c));
    goto give_back_bytes;
  }
  if (rmmc_resource_allocate(r, size, RMMC_DEFAULT_ALIGNMENT, stream, &p) != RMMC_SUCCESS)
    goto give_back_bytes;
  block_t b = {p, size, stream, r, device, 0, NULL};
  if (!map_insert(&b)) {
    (void)rmmc_resource_deallocate(r, p, size, RMMC_DEFAULT_ALIGNMENT, stream);
    rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory for the block map", who);
    goto give_back_bytes;
  }
  rmmc__atomic_add_u64(&f->allocations, 1);
  rmmc__atomic_add_u64(&f->live_blocks, 1);
  rmmc__atomic_max_u64(&f->peak_bytes, now);
  rmmc__atomic_max_u64(&total_peak, rmmc__atomic_add_u64(&total_in_use, size));
  if (!(__atomic_load_n(&used_devices, __ATOMIC_RELAXED) & (UINT64_C(1) << device)))
    __atomic_fetch_or(&used_devices, UINT64_C(1) << device, __ATOMIC_RELAXED);
  return p;

give_back_bytes:
  rmmc__atomic_sub_u64(&f->bytes_in_use, size);
  rmmc_resource_release(r);
failed:
  rmmc__atomic_add_u64(&f->allocation_failures, 1);
  note_failure();
  return NULL;
}

/* Orders b's stream after every stream recorded for it, so the resource
 * may reuse the block on b's stream at once. Host memory needs nothing. */
static rmmc_status_t order_recorded(const block_t *b) {
  if (b->nrecorded == 0 || b->resource->kind == RMMC_MEMORY_HOST) return RMMC_SUCCESS;
  int saved;
  rmmc_status_t st = rmmc__device_push(b->device, &saved);
  if (st != RMMC_SUCCESS) return st;
  for (int i = 0; st == RMMC_SUCCESS && i < b->nrecorded; i++)
    st = rmmc_stream_wait(b->stream, b->recorded[i]);
  if (b->nrecorded < 0 || st != RMMC_SUCCESS) {
    /* Too many streams, or no events: wait for everything instead. */
    cudaError_t err = cudaDeviceSynchronize();
    st = err == cudaSuccess ? RMMC_SUCCESS : rmmc_set_cuda_error(err, "cudaDeviceSynchronize");
  }
  rmmc__device_pop(saved);
  return st;
}

static void plugin_free(void *ptr, int device, const char *who) {
  if (ptr == NULL) return;
  pthread_once(&init_once, init_shards);
  block_t b;
  if (!map_remove(ptr, &b)) {
    rmmc__atomic_add_u64(&figures_of(device)->unknown_frees, 1);
    rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                   "%s: %p (device %d) was not allocated through rmmc's plug-ins or was freed "
                   "already; it is left alone",
                   who, ptr, device);
    note_failure();
    return;
  }
  device_figures_t *f = figures_of(b.device);
  rmmc_status_t st = order_recorded(&b);
  if (st == RMMC_SUCCESS)
    st = rmmc_resource_deallocate(b.resource, ptr, b.size, RMMC_DEFAULT_ALIGNMENT, b.stream);
  else
    rmmc__append_error(" (%s: %p is kept, not freed, since it may still be in use)", who, ptr);
  if (st == RMMC_SUCCESS) {
    rmmc__atomic_add_u64(&f->deallocations, 1);
  } else {
    rmmc__atomic_add_u64(&f->deallocation_failures, 1);
    note_failure();
  }
  rmmc__atomic_sub_u64(&f->live_blocks, 1);
  rmmc__atomic_sub_u64(&f->bytes_in_use, b.size);
  rmmc__atomic_sub_u64(&total_in_use, b.size);
  rmmc_resource_release(b.resource);
  free(b.recorded);
}

/* ---- PyTorch ---- */

/* PyTorch's CUDAPluggableAllocator does not check the pointer its alloc
 * function returns: a NULL becomes a tensor at address 0, and the first
 * kernel on it an illegal address (PyTorch 2.11; RMM's plug-in throws
 * std::bad_alloc, pytorch/pytorch#133280). A C library cannot throw, but
 * the process that calls this has libstdc++ loaded (PyTorch is C++): with
 * raising on (rmmc.torch.use() turns it on), a failed allocation throws a
 * std::runtime_error carrying rmmc's message through libstdc++'s own
 * calls, found with dlopen(RTLD_NOLOAD), which PyTorch turns into a
 * RuntimeError. The frames between the throw and PyTorch's catch are this
 * function and plugin_alloc, which hold no lock and own nothing by then;
 * x86-64 and AArch64 C code has unwind tables by default. */
static int torch_raises;

RMMC_API void rmmc_torch_raise_on_failure(int on) {
  __atomic_store_n(&torch_raises, on != 0, __ATOMIC_RELAXED);
}

/* A function of libstdc++ by name (ISO C has no cast from dlsym's object
 * pointer to a function pointer: copied, as POSIX allows). */
#define CXX_FN(h, name, fn) \
  do { \
    void *sym_ = dlsym(h, name); \
    if (sym_ != NULL) memcpy(&(fn), &sym_, sizeof(fn)); \
  } while (0)

static void raise_in_torch(const char *message) {
  void *cxx = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
  if (cxx == NULL) return;
  void *(*allocate)(size_t) = NULL;
  void (*throw_it)(void *, void *, void (*)(void *)) = NULL;
  void (*construct)(void *, const char *) = NULL;
  void (*destroy)(void *) = NULL;
  CXX_FN(cxx, "__cxa_allocate_exception", allocate);
  CXX_FN(cxx, "__cxa_throw", throw_it);
  CXX_FN(cxx, "_ZNSt13runtime_errorC1EPKc", construct);
  CXX_FN(cxx, "_ZNSt13runtime_errorD1Ev", destroy);
  void *type = dlsym(cxx, "_ZTISt13runtime_error");
  dlclose(cxx); /* NOLOAD: the process keeps it loaded */
  if (allocate == NULL || throw_it == NULL || construct == NULL || destroy == NULL || type == NULL)
    return;
  void *e = allocate(64); /* sizeof(std::runtime_error) is 16 in libstdc++ */
  construct(e, message);
  throw_it(e, type, destroy);
}

RMMC_API void *rmmc_torch_alloc(size_t size, int device, cudaStream_t stream) {
  void *p = plugin_alloc(size, device, stream, "rmmc_torch_alloc");
  if (RMMC_UNLIKELY(p == NULL && size > 0) && __atomic_load_n(&torch_raises, __ATOMIC_RELAXED))
    raise_in_torch(rmmc_last_error_message());
  return p;
}

RMMC_API void rmmc_torch_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  (void)size, (void)stream; /* the map's record wins */
  plugin_free(ptr, device, "rmmc_torch_free");
}

RMMC_API void rmmc_torch_init(int device_count) {
  pthread_once(&init_once, init_shards);
  if (device_count > 0) __atomic_store_n(&torch_device_count, device_count, __ATOMIC_RELAXED);
  const char *message;
  rmmc_status_t st = rmmc_default_config_status(NULL, &message);
  if (st != RMMC_SUCCESS) {
    rmmc_set_error(st, "%s", message);
    note_failure();
  }
}

RMMC_API void rmmc_torch_empty_cache(void) {
  if (rmmc_plugin_release_cached() != RMMC_SUCCESS) note_failure();
}

RMMC_API void rmmc_torch_set_memory_fraction(double fraction, int device) {
  size_t free_b, total_b;
  rmmc_status_t st;
  if (!(fraction > 0.0 && fraction <= 1.0))
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "rmmc_torch_set_memory_fraction: %g is not in (0, 1]", fraction);
  else
    st = rmmc_device_memory_info(device, &free_b, &total_b);
  if (st == RMMC_SUCCESS) st = rmmc_plugin_set_limit(device, (size_t)((double)total_b * fraction));
  if (st != RMMC_SUCCESS) note_failure();
}

/* CUDA graph pools (set_begin_allocate_to_pool and friends). PyTorch calls
 * them through a C++ std::function of signature (int, MempoolId_t,
 * std::function<bool(cudaStream_t)>): on the x86-64 and AArch64 C++ ABIs a
 * MempoolId_t (a pair of two 64-bit integers, trivially copyable) travels
 * by value as two integer arguments and the std::function (not trivially
 * copyable) by reference, so these C functions receive them as written.
 * The filter is not called (C cannot): PyTorch's filter selects the
 * streams of the capture the calling thread begins next, which is what
 * routing by capture does. Failures are recorded (rmmc_plugin_last_error). */
static void graph_hook(int device, rmmc_status_t (*fn)(rmmc_resource_t *, uint64_t, uint64_t),
                       uint64_t id0, uint64_t id1, const char *who) {
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = device_ok(device, who) ? rmmc_retain_device_resource(device, &r) : RMMC_ERROR_INVALID_ARGUMENT;
  if (st == RMMC_SUCCESS) st = fn(r, id0, id1);
  if (st != RMMC_SUCCESS) note_failure();
  rmmc_resource_release(r);
}

RMMC_API void rmmc_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1,
                                                const void *filter) {
  (void)filter;
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = device_ok(device, "rmmc_torch_begin_allocate_to_pool")
                         ? rmmc_retain_device_resource(device, &r)
                         : RMMC_ERROR_INVALID_ARGUMENT;
  if (st == RMMC_SUCCESS) st = rmmc_pool_graph_begin(r, id0, id1, false, NULL);
  if (st != RMMC_SUCCESS) note_failure();
  rmmc_resource_release(r);
}

RMMC_API void rmmc_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1) {
  graph_hook(device, rmmc_pool_graph_end, id0, id1, "rmmc_torch_end_allocate_to_pool");
}

RMMC_API void rmmc_torch_release_pool(int device, uint64_t id0, uint64_t id1) {
  graph_hook(device, rmmc_pool_graph_release, id0, id1, "rmmc_torch_release_pool");
}

RMMC_API void rmmc_torch_record_stream(void *ptr, cudaStream_t stream) {
  pthread_once(&init_once, init_shards);
  uint64_t h = hash_ptr(ptr);
  shard_t *s = shard_of(h);
  pthread_mutex_lock(&s->lock);
  size_t i = find_slot(s, ptr, h);
  block_t *b = i < s->cap ? &s->slots[i] : NULL;
  bool fresh = b != NULL && stream != b->stream && b->nrecorded >= 0;
  for (int k = 0; fresh && k < b->nrecorded; k++) fresh = b->recorded[k] != stream;
  if (fresh) {
    if (b->recorded == NULL) b->recorded = malloc(MAX_RECORDED * sizeof *b->recorded);
    if (b->recorded == NULL || b->nrecorded == MAX_RECORDED)
      b->nrecorded = -1; /* the free waits for the whole device */
    else
      b->recorded[b->nrecorded++] = stream;
    rmmc__atomic_add_u64(&figures_of(b->device)->recorded_streams, 1);
  }
  pthread_mutex_unlock(&s->lock);
  if (b == NULL) {
    rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                   "rmmc_torch_record_stream: %p was not allocated through rmmc's plug-ins", ptr);
    note_failure();
  }
}

RMMC_API void *rmmc_torch_base_alloc(void *ptr, size_t *size) {
  pthread_once(&init_once, init_shards);
  if (size != NULL) *size = 0;
  uint64_t h = hash_ptr(ptr);
  shard_t *s = shard_of(h);
  pthread_mutex_lock(&s->lock);
  size_t i = find_slot(s, ptr, h);
  rmmc_resource_t *r = i < s->cap ? rmmc_resource_retain(s->slots[i].resource) : NULL;
  size_t bytes = i < s->cap ? s->slots[i].size : 0;
  pthread_mutex_unlock(&s->lock);
  if (r == NULL) {
    rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                   "rmmc_torch_base_alloc: %p was not allocated through rmmc's plug-ins", ptr);
    note_failure();
    return ptr;
  }
  void *base = ptr;
  size_t n = bytes;
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  if (rmmc__ipc_base_allocation(r, ptr, &base, &n) != RMMC_SUCCESS) {
    base = ptr; /* no allocation of its own holds it: the block is the base */
    n = bytes;
  }
  rmmc__error_restore(&saved);
  rmmc_resource_release(r);
  if (size != NULL) *size = n;
  return base;
}

/* ---- CuPy ---- */

RMMC_API void *rmmc_cupy_malloc(void *param, size_t size, int device) {
  return plugin_alloc(size, device, (cudaStream_t)param, "rmmc_cupy_malloc");
}

RMMC_API void rmmc_cupy_free(void *param, void *ptr, int device) {
  (void)param; /* the stream recorded at allocation is used */
  plugin_free(ptr, device, "rmmc_cupy_free");
}

/* ---- figures and control ---- */

static rmmc_status_t check_device(int device, bool all_ok, const char *what) {
  if ((all_ok && device == -1) || (device >= 0 && device < RMMC_MAX_DEVICES)) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range", what, device);
}

static void add_figures(rmmc_plugin_stats_t *out, device_figures_t *f) {
  out->allocations += rmmc__atomic_load_u64(&f->allocations);
  out->allocation_failures += rmmc__atomic_load_u64(&f->allocation_failures);
  out->deallocations += rmmc__atomic_load_u64(&f->deallocations);
  out->deallocation_failures += rmmc__atomic_load_u64(&f->deallocation_failures);
  out->unknown_frees += rmmc__atomic_load_u64(&f->unknown_frees);
  out->recorded_streams += rmmc__atomic_load_u64(&f->recorded_streams);
  out->live_blocks += rmmc__atomic_load_u64(&f->live_blocks);
  out->bytes_in_use += rmmc__atomic_load_u64(&f->bytes_in_use);
}

RMMC_API rmmc_status_t rmmc_plugin_get_stats(int device, rmmc_plugin_stats_t *out) {
  if (out == NULL || out->size < sizeof(rmmc_plugin_stats_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "plugin_get_stats: NULL or too small (initialize with "
                          "RMMC_PLUGIN_STATS_INIT)");
  rmmc_status_t st = check_device(device, true, "plugin_get_stats");
  if (st != RMMC_SUCCESS) return st;
  size_t size = out->size;
  memset(out, 0, sizeof *out);
  out->size = size;
  if (device >= 0) {
    add_figures(out, &figures[device]);
    out->peak_bytes = rmmc__atomic_load_u64(&figures[device].peak_bytes);
    out->limit = rmmc__atomic_load_u64(&figures[device].limit);
  } else {
    for (int d = 0; d <= OTHER_DEVICE; d++) add_figures(out, &figures[d]);
    out->peak_bytes = rmmc__atomic_load_u64(&total_peak);
  }
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_plugin_set_limit(int device, size_t bytes) {
  rmmc_status_t st = check_device(device, false, "plugin_set_limit");
  if (st == RMMC_SUCCESS) __atomic_store_n(&figures[device].limit, (uint64_t)bytes, __ATOMIC_RELAXED);
  return st;
}

RMMC_API rmmc_status_t rmmc_plugin_set_memory_hooks(int device, const rmmc_memory_hooks_t *hooks) {
  int dev = device;
  rmmc_status_t st = device == -1 ? rmmc_get_current_device(&dev) : RMMC_SUCCESS;
  rmmc_resource_t *r = NULL;
  if (st == RMMC_SUCCESS) st = rmmc_retain_device_resource(dev, &r);
  if (st == RMMC_SUCCESS) st = rmmc_resource_set_memory_hooks(r, hooks);
  rmmc_resource_release(r);
  return st;
}

RMMC_API rmmc_status_t rmmc_plugin_release_cached(void) {
  rmmc_status_t first = RMMC_SUCCESS;
  uint64_t used = __atomic_load_n(&used_devices, __ATOMIC_RELAXED);
  for (int d = 0; d < RMMC_MAX_DEVICES; d++) {
    if (!(used & (UINT64_C(1) << d))) continue;
    rmmc_resource_t *r = NULL;
    rmmc_status_t st = rmmc_retain_device_resource(d, &r);
    if (st == RMMC_SUCCESS) st = rmmc_resource_release_cached(r);
    rmmc_resource_release(r);
    if (st != RMMC_SUCCESS && first == RMMC_SUCCESS) first = st;
  }
  return first;
}

RMMC_API size_t rmmc_plugin_last_error(char *buf, size_t len) {
  pthread_mutex_lock(&last_error_lock);
  size_t n = strlen(last_error);
  if (buf != NULL && len > 0) snprintf(buf, len, "%s", last_error);
  pthread_mutex_unlock(&last_error_lock);
  return n;
}

RMMC_API void rmmc_plugin_reset_stats(void) {
  for (int d = 0; d <= OTHER_DEVICE; d++) {
    device_figures_t *f = &figures[d];
    __atomic_store_n(&f->allocations, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->allocation_failures, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->deallocations, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->deallocation_failures, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->unknown_frees, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->recorded_streams, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->peak_bytes, rmmc__atomic_load_u64(&f->bytes_in_use), __ATOMIC_RELAXED);
  }
  __atomic_store_n(&total_peak, rmmc__atomic_load_u64(&total_in_use), __ATOMIC_RELAXED);
  pthread_mutex_lock(&last_error_lock);
  last_error[0] = '\0';
  pthread_mutex_unlock(&last_error_lock);
}
