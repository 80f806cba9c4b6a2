/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replaying a log on a stack (replay_engine.h describes the contract).
 *
 * The stack is built by the one spec parser with a hook that puts a meter
 * between the base layer and the layer above: the meter forwards every
 * call and counts the bytes outstanding through it, so "peak reserved" is
 * what the stack took from its base whatever the layers are. Events index
 * allocation slots directly (the reader paired frees with allocations), so
 * the loop does one call, two clock reads and a store per event.
 *
 * Several logged threads replay on as many threads, strictly in log order:
 * the thread that ran event i hands the turn to the owner of event i+1 by
 * storing i+1 in `turn` and waking that owner if it sleeps (it spins a
 * little before sleeping on its own condition variable). Events of one
 * thread in a row need no hand-off.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "replay_engine.h"
#include "base/spec.h" /* rmmc__stack_create_hooked */

_Static_assert(REPLAY_MESSAGE_MAX >= RMMC__MESSAGE_MAX,
               "first_failure must hold rmmc's longest message whole");

/* ---- the meter: counts bytes outstanding through it ---- */

/* Memory taken from the base (allocations and mapped pages) and the time
 * spent in the base's calls. */
typedef struct meter {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
  uint64_t current; /* atomic */
  uint64_t peak;    /* atomic */
  uint64_t calls;   /* atomic: calls into the base */
  uint64_t ns;      /* atomic: time inside them */
} meter_t;

static void meter_add(meter_t *m, uint64_t bytes) {
  uint64_t now = __atomic_add_fetch(&m->current, bytes, __ATOMIC_RELAXED);
  uint64_t peak = __atomic_load_n(&m->peak, __ATOMIC_RELAXED);
  while (peak < now && !__atomic_compare_exchange_n(&m->peak, &peak, now, true, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
  }
}

/* What a metered call does to the bytes taken from the base once it
 * succeeds. */
typedef enum { METER_KEEPS, METER_TAKES, METER_GIVES } meter_effect_t;

/* Ends a call into the base that began at t0 and returned st: counts the
 * call and its time, then (on success only) the bytes it took or gave
 * back. Returns st, so each forwarder is its call and this; t0 is read
 * before the call (in a statement of its own) and the clock again here. */
static rmmc_status_t meter_done(meter_t *m, uint64_t t0, rmmc_status_t st, meter_effect_t effect,
                                uint64_t bytes) {
  __atomic_add_fetch(&m->ns, now_ns() - t0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&m->calls, 1, __ATOMIC_RELAXED);
  if (st != RMMC_SUCCESS) return st;
  if (effect == METER_TAKES) meter_add(m, bytes);
  if (effect == METER_GIVES) __atomic_sub_fetch(&m->current, bytes, __ATOMIC_RELAXED);
  return st;
}

static rmmc_status_t meter_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_allocate(m->upstream, bytes, alignment, stream, out),
                    METER_TAKES, bytes);
}

static rmmc_status_t meter_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_deallocate(m->upstream, ptr, bytes, alignment, stream),
                    METER_GIVES, bytes);
}

/* Virtual memory passes through (so an expandable pool works over the
 * meter); mapped pages count as taken. */
static size_t meter_vm_page_size(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const meter_t *)r)->upstream);
}

static rmmc_status_t meter_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      void **out) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_vm_reserve(m->upstream, bytes, alignment, out),
                    METER_KEEPS, 0);
}

static rmmc_status_t meter_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_vm_unreserve(m->upstream, ptr, bytes), METER_KEEPS, 0);
}

static rmmc_status_t meter_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_vm_map(m->upstream, ptr, bytes), METER_TAKES, bytes);
}

static rmmc_status_t meter_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  meter_t *m = (meter_t *)r;
  uint64_t t0 = now_ns();
  return meter_done(m, t0, rmmc_resource_vm_unmap(m->upstream, ptr, bytes), METER_GIVES, bytes);
}

static void meter_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  meter_t *m = (meter_t *)r;
  rmmc_field_t f = {"reserved", RMMC_FIELD_BYTES, __atomic_load_n(&m->current, __ATOMIC_RELAXED),
                    NULL};
  emit(ctx, &f);
  f.key = "peak";
  f.value = __atomic_load_n(&m->peak, __ATOMIC_RELAXED);
  emit(ctx, &f);
}

static rmmc_resource_t *meter_upstream(const rmmc_resource_t *r) {
  return ((const meter_t *)r)->upstream;
}

static void meter_destroy(rmmc_resource_t *r) {
  meter_t *m = (meter_t *)r;
  rmmc_resource_release(m->upstream);
  free(m);
}

static const rmmc_resource_ops_t meter_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "meter",
    .allocate = meter_allocate,
    .deallocate = meter_deallocate,
    .describe = meter_describe,
    .destroy = meter_destroy,
    .upstream = meter_upstream,
    .vm_page_size = meter_vm_page_size,
    .vm_reserve = meter_vm_reserve,
    .vm_unreserve = meter_vm_unreserve,
    .vm_map = meter_vm_map,
    .vm_unmap = meter_vm_unmap,
};

typedef struct hook_ctx {
  meter_t *meter;       /* borrowed: the stack holds it */
  rmmc_resource_t *base; /* borrowed: the meter holds it */
} hook_ctx_t;

static rmmc_status_t meter_hook(void *ctx, rmmc_resource_t *base, rmmc_resource_t **out) {
  hook_ctx_t *h = ctx;
  meter_t *m = calloc(1, sizeof *m);
  if (m == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "replay: no host memory");
  rmmc_resource_init(&m->base, &meter_ops, rmmc_resource_memory_kind(base),
                     rmmc_resource_device(base));
  m->upstream = rmmc_resource_retain(base);
  h->meter = m;
  h->base = base;
  *out = &m->base;
  return RMMC_SUCCESS;
}

/* ---- the replay ---- */

typedef struct run run_t;

typedef struct worker {
  run_t *run;
  uint16_t index;
  const size_t *events; /* this thread's event indices, in order */
  size_t nevents;
  pthread_t tid;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool sleeping; /* under mu */
  uint64_t ns, calls, failures, free_errors, skipped_frees;
  char first_failure[REPLAY_MESSAGE_MAX];
  size_t first_failure_event;
} worker_t;

struct run {
  const replay_log_t *log;
  rmmc_resource_t *r;
  meter_t *meter;
  cudaStream_t *streams;
  void **slots;
  uint64_t *series;
  size_t nbuckets;
  bool gpu;
  int device;
  size_t turn;  /* atomic: the next event to run, when handed off */
  bool aborted; /* atomic */
  worker_t *workers;
};

#define NO_TURN SIZE_MAX
#define SPINS 4000

/* The least time between two clock reads: subtracted once per call. */
static uint64_t timer_overhead(void) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 2000; i++) {
    uint64_t a = now_ns(), b = now_ns();
    if (b - a < best) best = b - a;
  }
  return best;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void run_event(run_t *run, worker_t *w, size_t i) {
  const replay_event_t *e = &run->log->events[i];
  cudaStream_t stream = run->streams[e->stream];
  if (e->action == REPLAY_ALLOCATE) {
    void *p = NULL;
    uint64_t t0 = now_ns();
    rmmc_status_t st = rmmc_resource_allocate(run->r, e->size, RMMC_DEFAULT_ALIGNMENT, stream, &p);
    w->ns += now_ns() - t0;
    w->calls++;
    if (st != RMMC_SUCCESS) {
      if (w->failures++ == 0) {
        snprintf(w->first_failure, sizeof w->first_failure, "%s", rmmc_last_error_message());
        w->first_failure_event = i;
      }
      p = NULL;
    }
    run->slots[e->slot] = p;
  } else {
    void *p = run->slots[e->slot];
    if (p != NULL) {
      uint64_t t0 = now_ns();
      rmmc_status_t st = rmmc_resource_deallocate(run->r, p, e->size, RMMC_DEFAULT_ALIGNMENT, stream);
      w->ns += now_ns() - t0;
      w->calls++;
      if (st != RMMC_SUCCESS) w->free_errors++;
      run->slots[e->slot] = NULL;
    } else if (e->size != 0) {
      w->skipped_frees++; /* its allocation failed */
    }
  }
  if (run->series != NULL) {
    uint64_t v = __atomic_load_n(&run->meter->current, __ATOMIC_RELAXED);
    size_t b = (size_t)((uint64_t)i * run->nbuckets / run->log->nevents);
    if (v > run->series[b]) run->series[b] = v;
  }
}

/* Waits until event i is this thread's turn; false if the replay was
 * abandoned. */
static bool wait_turn(run_t *run, worker_t *w, size_t i) {
  for (int k = 0; k < SPINS; k++) {
    if (__atomic_load_n(&run->turn, __ATOMIC_ACQUIRE) == i) return true;
    cpu_relax();
  }
  pthread_mutex_lock(&w->mu);
  w->sleeping = true;
  while (__atomic_load_n(&run->turn, __ATOMIC_ACQUIRE) != i &&
         !__atomic_load_n(&run->aborted, __ATOMIC_ACQUIRE))
    pthread_cond_wait(&w->cv, &w->mu);
  w->sleeping = false;
  pthread_mutex_unlock(&w->mu);
  return __atomic_load_n(&run->turn, __ATOMIC_ACQUIRE) == i;
}

/* Gives the turn to the owner of event `next`. The store comes before the
 * owner's mutex is taken, and the owner checks `turn` under that mutex, so
 * a wake-up cannot be lost. */
static void pass_turn(run_t *run, size_t next) {
  worker_t *o = &run->workers[run->log->events[next].thread];
  __atomic_store_n(&run->turn, next, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&o->mu);
  if (o->sleeping) pthread_cond_signal(&o->cv);
  pthread_mutex_unlock(&o->mu);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  run_t *run = w->run;
  const replay_event_t *ev = run->log->events;
  size_t n = run->log->nevents;
  if (run->gpu && cudaSetDevice(run->device) != cudaSuccess) (void)cudaGetLastError();
  for (size_t k = 0; k < w->nevents; k++) {
    size_t i = w->events[k];
    if ((i == 0 || ev[i - 1].thread != w->index) && !wait_turn(run, w, i)) return NULL;
    run_event(run, w, i);
    if (i + 1 < n && ev[i + 1].thread != w->index) pass_turn(run, i + 1);
  }
  return NULL;
}

static void abandon(run_t *run, uint32_t started) {
  __atomic_store_n(&run->aborted, true, __ATOMIC_SEQ_CST);
  for (uint32_t t = 0; t < started; t++) {
    pthread_mutex_lock(&run->workers[t].mu);
    pthread_cond_broadcast(&run->workers[t].cv);
    pthread_mutex_unlock(&run->workers[t].mu);
  }
}

/* Runs the events on one thread per logged thread. */
static rmmc_status_t run_threads(run_t *run, worker_t *workers, uint32_t nthreads) {
  const replay_log_t *log = run->log;
  size_t *order = malloc(log->nevents * sizeof *order);
  size_t *fill = calloc(nthreads, sizeof *fill);
  if (order == NULL || fill == NULL) {
    free(order);
    free(fill);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "replay: no host memory for the threads");
  }
  for (size_t i = 0; i < log->nevents; i++) workers[log->events[i].thread].nevents++;
  size_t offset = 0;
  for (uint32_t t = 0; t < nthreads; t++) {
    workers[t].events = order + offset;
    offset += workers[t].nevents;
  }
  for (size_t i = 0; i < log->nevents; i++) {
    uint16_t t = log->events[i].thread;
    order[(workers[t].events - order) + fill[t]++] = i;
  }
  free(fill);
  rmmc_status_t st = RMMC_SUCCESS;
  uint32_t started = 0;
  run->turn = NO_TURN; /* nobody runs until every thread exists */
  for (; started < nthreads; started++) {
    if (pthread_create(&workers[started].tid, NULL, worker_main, &workers[started]) != 0) {
      st = rmmc_set_error(RMMC_ERROR_INTERNAL, "replay: cannot start thread %u of %u", started + 1,
                          nthreads);
      abandon(run, started);
      break;
    }
  }
  if (st == RMMC_SUCCESS && log->nevents > 0) pass_turn(run, 0);
  for (uint32_t t = 0; t < started; t++) pthread_join(workers[t].tid, NULL);
  free(order);
  return st;
}

static rmmc_status_t cuda_failed(cudaError_t err, const char *what) {
  return rmmc_set_cuda_error(err, what);
}

/* Maps logged streams: real streams for device memory on a GPU, the logged
 * values as keys otherwise. */
static rmmc_status_t map_streams(run_t *run, rmmc_memory_kind_t kind, bool *real) {
  const replay_log_t *log = run->log;
  *real = kind != RMMC_MEMORY_HOST && rmmc_device_count() > 0;
  for (uint32_t s = 0; s < log->nstreams; s++) {
    uint64_t id = log->stream_ids[s];
    if (!*real) {
      run->streams[s] = (cudaStream_t)(uintptr_t)id;
    } else if (id == 0) {
      run->streams[s] = NULL;
    } else if (id == (uint64_t)(uintptr_t)cudaStreamLegacy) {
      run->streams[s] = cudaStreamLegacy;
    } else if (id == (uint64_t)(uintptr_t)cudaStreamPerThread) {
      run->streams[s] = cudaStreamPerThread;
    } else {
      cudaError_t err = cudaStreamCreateWithFlags(&run->streams[s], cudaStreamNonBlocking);
      if (err != cudaSuccess) {
        run->streams[s] = NULL;
        return cuda_failed(err, "replay: cudaStreamCreateWithFlags");
      }
    }
  }
  return RMMC_SUCCESS;
}

static bool is_created_stream(cudaStream_t s) {
  return s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread;
}

/* What the log leaves live goes back, untimed. */
static void free_leftovers(run_t *run, replay_result_t *res) {
  const replay_log_t *log = run->log;
  for (size_t i = 0; i < log->nevents; i++) {
    const replay_event_t *e = &log->events[i];
    if (e->action != REPLAY_ALLOCATE || run->slots[e->slot] == NULL) continue;
    if (rmmc_resource_deallocate(run->r, run->slots[e->slot], e->size, RMMC_DEFAULT_ALIGNMENT,
                                 run->streams[e->stream]) != RMMC_SUCCESS)
      res->free_errors++;
    run->slots[e->slot] = NULL;
  }
}

static rmmc_status_t replay_on(const replay_log_t *log, rmmc_resource_t *r, meter_t *meter,
                               rmmc_resource_t *base, const replay_options_t *opts,
                               replay_result_t *res) {
  run_t run;
  memset(&run, 0, sizeof run);
  run.log = log;
  run.r = r;
  run.meter = meter;
  res->kind = rmmc_resource_memory_kind(r);
  res->events = log->nevents;
  bool threaded = opts->threads && log->nthreads > 1;
  uint32_t nworkers = threaded ? log->nthreads : 1;
  res->threads = nworkers;
  run.slots = calloc(log->nslots ? log->nslots : 1, sizeof *run.slots);
  run.streams = calloc(log->nstreams ? log->nstreams : 1, sizeof *run.streams);
  run.workers = calloc(nworkers, sizeof *run.workers);
  size_t nb = opts->buckets < log->nevents ? opts->buckets : log->nevents;
  if (meter != NULL && nb > 0) {
    run.series = calloc(nb, sizeof *run.series);
    run.nbuckets = nb;
  }
  rmmc_status_t st = RMMC_SUCCESS;
  int saved_device = -1;
  if (run.slots == NULL || run.streams == NULL || run.workers == NULL ||
      (run.nbuckets > 0 && run.series == NULL)) {
    st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "replay: no host memory");
    goto out;
  }
  run.gpu = res->kind != RMMC_MEMORY_HOST && rmmc_device_count() > 0;
  if (run.gpu) {
    run.device = rmmc_resource_device(r);
    cudaError_t err = cudaGetDevice(&saved_device);
    if (err == cudaSuccess && run.device >= 0) err = cudaSetDevice(run.device);
    if (err != cudaSuccess) {
      saved_device = -1;
      st = cuda_failed(err, "replay: cudaSetDevice");
      goto out;
    }
  }
  st = map_streams(&run, res->kind, &res->real_streams);
  if (st != RMMC_SUCCESS) goto out;
  uint64_t overhead = timer_overhead();
  for (uint32_t t = 0; t < nworkers; t++) {
    worker_t *w = &run.workers[t];
    w->run = &run;
    w->index = (uint16_t)t;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
  }
  /* A warm replay runs the log once untimed on the same stack first (what
   * it leaves live goes back in between): the timed pass then sees the
   * stack as a second epoch would. Peak reserved covers both passes. */
  uint64_t up_calls0 = 0, up_ns0 = 0;
  for (int pass = opts->warm ? 0 : 1; pass < 2 && st == RMMC_SUCCESS; pass++) {
    if (pass == 1 && opts->warm) {
      free_leftovers(&run, res);
      for (uint32_t t = 0; t < nworkers; t++) {
        worker_t *w = &run.workers[t];
        w->ns = w->calls = w->failures = w->free_errors = w->skipped_frees = 0;
        w->nevents = 0;
        w->first_failure[0] = '\0';
      }
      res->free_errors = 0;
      if (run.series != NULL) memset(run.series, 0, run.nbuckets * sizeof *run.series);
      if (meter != NULL) {
        up_calls0 = __atomic_load_n(&meter->calls, __ATOMIC_RELAXED);
        up_ns0 = __atomic_load_n(&meter->ns, __ATOMIC_RELAXED);
      }
    }
    if (opts->epoch != NULL) opts->epoch(opts->epoch_ctx, pass);
    if (threaded) {
      st = run_threads(&run, run.workers, nworkers);
    } else {
      for (size_t i = 0; i < log->nevents; i++) run_event(&run, &run.workers[0], i);
    }
  }
  if (meter != NULL) {
    res->has_reserved = true;
    res->end_reserved = __atomic_load_n(&meter->current, __ATOMIC_RELAXED);
  }
  if (opts->status != NULL) {
    fprintf(opts->status, "after the last event of %s:\n", res->stack);
    (void)rmmc_resource_print_status(r, opts->status);
  }
  free_leftovers(&run, res);
  size_t first_event = SIZE_MAX;
  for (uint32_t t = 0; t < nworkers; t++) {
    worker_t *w = &run.workers[t];
    res->calls += w->calls;
    res->failures += w->failures;
    res->free_errors += w->free_errors;
    res->skipped_frees += w->skipped_frees;
    res->total_ns += w->ns;
    if (w->failures > 0 && w->first_failure_event < first_event) {
      first_event = w->first_failure_event;
      snprintf(res->first_failure, sizeof res->first_failure, "event %zu: %s", first_event,
               w->first_failure);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
  }
  uint64_t cost = overhead * res->calls;
  res->total_ns = res->total_ns > cost ? res->total_ns - cost : 0;
  res->ns_per_call = res->calls ? (double)res->total_ns / (double)res->calls : 0.0;
  if (meter != NULL) {
    res->upstream_calls = __atomic_load_n(&meter->calls, __ATOMIC_RELAXED) - up_calls0;
    res->upstream_ns = __atomic_load_n(&meter->ns, __ATOMIC_RELAXED) - up_ns0;
  }
  uint64_t own = res->total_ns > res->upstream_ns ? res->total_ns - res->upstream_ns : 0;
  res->own_ns_per_call = res->calls ? (double)own / (double)res->calls : 0.0;
  res->repeats = 1;
  res->warm = opts->warm;
  res->ns_per_call_min = res->ns_per_call;
  if (meter != NULL) res->peak_reserved = __atomic_load_n(&meter->peak, __ATOMIC_RELAXED);
  if (base != NULL) res->has_base_peak = rmmc_resource_get_field(base, "peak", &res->base_peak);
  res->reserved_series = run.series;
  res->nbuckets = run.nbuckets;
  run.series = NULL;
out:
  if (run.gpu && run.streams != NULL) {
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess && st == RMMC_SUCCESS) st = cuda_failed(err, "replay: cudaDeviceSynchronize");
    for (uint32_t s = 0; s < log->nstreams; s++)
      if (is_created_stream(run.streams[s])) {
        err = cudaStreamDestroy(run.streams[s]);
        if (err != cudaSuccess && st == RMMC_SUCCESS) st = cuda_failed(err, "replay: cudaStreamDestroy");
      }
    if (saved_device >= 0 && cudaSetDevice(saved_device) != cudaSuccess) (void)cudaGetLastError();
  }
  free(run.series);
  free(run.slots);
  free(run.streams);
  free(run.workers);
  if (st != RMMC_SUCCESS && res->error[0] == '\0')
    snprintf(res->error, sizeof res->error, "%s", rmmc_last_error_message());
  return st;
}

static void copy_options(const replay_options_t *in, replay_options_t *out) {
  replay_options_t d = REPLAY_OPTIONS_INIT;
  *out = d;
  if (in != NULL) memcpy(out, in, in->size < sizeof *out ? in->size : sizeof *out);
}

rmmc_status_t replay_run(const replay_log_t *log, const char *spec,
                         const replay_options_t *options, replay_result_t *out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_run: out is NULL");
  memset(out, 0, sizeof *out);
  if (log == NULL || spec == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_run: NULL argument");
  replay_options_t opts;
  copy_options(options, &opts);
  out->stack = strdup(spec);
  if (out->stack == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "replay: no host memory");
  hook_ctx_t h = {NULL, NULL};
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc__stack_create_hooked(spec, opts.device, meter_hook, &h, &r);
  if (st != RMMC_SUCCESS) {
    snprintf(out->error, sizeof out->error, "%s", rmmc_last_error_message());
    return st;
  }
  snprintf(out->base, sizeof out->base, "%s", rmmc_resource_name(h.base));
  out->simulated = strcmp(out->base, "sim") == 0;
  st = replay_on(log, r, h.meter, h.base, &opts, out);
  rmmc_resource_release(r);
  return st;
}

rmmc_status_t replay_run_resource(const replay_log_t *log, rmmc_resource_t *r,
                                  const replay_options_t *options, replay_result_t *out) {
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_run_resource: out is NULL");
  memset(out, 0, sizeof *out);
  if (log == NULL || r == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_run_resource: NULL argument");
  replay_options_t opts;
  copy_options(options, &opts);
  out->stack = strdup(rmmc_resource_name(r));
  if (out->stack == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "replay: no host memory");
  rmmc_resource_t *base = r;
  while (rmmc_resource_upstream(base) != NULL) base = rmmc_resource_upstream(base);
  snprintf(out->base, sizeof out->base, "%s", rmmc_resource_name(base));
  out->simulated = strcmp(out->base, "sim") == 0;
  return replay_on(log, r, NULL, base, &opts, out);
}

void replay_result_fini(replay_result_t *result) {
  if (result == NULL) return;
  free(result->stack);
  free(result->reserved_series);
  result->stack = NULL;
  result->reserved_series = NULL;
}
