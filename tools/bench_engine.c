/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rmmc-bench measurement engine (see bench_engine.h for what is timed).
 *
 * Threads are started once per measurement and kept for the warm-up and
 * every timed run, so per-thread state a resource keeps (arenas, caches)
 * stays warm across runs, as it would in a real program. The main thread
 * and the workers meet at two barriers per run ("go" and "done"); the
 * workers alone meet at two more around the timed section, so no thread's
 * fill or drain overlaps another thread's timed calls. Op sequences are
 * generated before the threads start, so no random-number work is timed.
 */
#include "bench_engine.h"
#include "bench_clock.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "rmmc/status.h"

typedef struct slot {
  void *ptr;
  size_t bytes;
} slot_t;

struct engine;

typedef struct worker {
  struct engine *e;
  int index;
  pthread_t thread;
  cudaStream_t stream; /* a real stream (GPU stacks) or an opaque key */
  bool own_stream;
  /* The op sequence (random pattern): the fill, then one victim slot and
   * one new size per step. */
  size_t *fill_sizes;
  uint32_t *victims;
  size_t *step_sizes;
  slot_t *slots;
  /* The last run. */
  uint64_t t_start, t_end;
  size_t done; /* calls completed in the timed (or warm-up) section */
  bool failed;
  char error[BENCH_ERROR_LEN];
} worker_t;

typedef struct engine {
  rmmc_resource_t *r; /* NULL: malloc/free baseline */
  bool gpu;
  int device;
  const bench_case_t *c;
  int threads;
  /* What the main thread asks of the next run. */
  size_t ops;
  uint64_t limit_ns;
  bool quit;
  /* Start-up handshake: workers wait until every thread exists. */
  pthread_mutex_t start_lock;
  pthread_cond_t start_cond;
  int start_state; /* 0 waiting, 1 go, -1 abort */
  pthread_barrier_t outer; /* main + workers */
  pthread_barrier_t inner; /* workers */
  worker_t *workers;
} engine_t;

static size_t random_size(uint64_t *state, const bench_case_t *c) {
  uint64_t span = (uint64_t)(c->max_bytes - c->min_bytes) + 1;
  return c->min_bytes + (size_t)(span == 0 ? next_random(state) : next_random(state) % span);
}

/* Keeps the compiler from eliding a malloc/free pair whose pointer is
 * otherwise unused (GCC removes such pairs at -O2). */
static inline void keep_pointer(void *p) {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ volatile("" : : "g"(p) : "memory");
#else
  static void *volatile sink;
  sink = p;
#endif
}

static void worker_fail(worker_t *w, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Records the first failure of this worker's run. */
static void worker_fail(worker_t *w, const char *fmt, ...) {
  if (w->failed) return;
  w->failed = true;
  int n = snprintf(w->error, sizeof w->error, "thread %d: ", w->index);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->error + n, sizeof w->error - (size_t)n, fmt, ap);
  va_end(ap);
}

static inline bool do_allocate(worker_t *w, size_t bytes, void **p) {
  rmmc_resource_t *r = w->e->r;
  if (r == NULL) {
    *p = malloc(bytes);
    if (*p != NULL) {
      keep_pointer(*p);
      return true;
    }
    worker_fail(w, "malloc(%zu) returned NULL", bytes);
    return false;
  }
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, RMMC_DEFAULT_ALIGNMENT, w->stream, p);
  if (st == RMMC_SUCCESS) return true;
  worker_fail(w, "allocate(%zu bytes) failed with %s: %s", bytes, rmmc_status_name(st),
              rmmc_last_error_message());
  return false;
}

static inline bool do_deallocate(worker_t *w, void *p, size_t bytes) {
  rmmc_resource_t *r = w->e->r;
  if (r == NULL) {
    free(p);
    return true;
  }
  rmmc_status_t st = rmmc_resource_deallocate(r, p, bytes, RMMC_DEFAULT_ALIGNMENT, w->stream);
  if (st == RMMC_SUCCESS) return true;
  worker_fail(w, "deallocate(%p, %zu bytes) failed with %s: %s", p, bytes, rmmc_status_name(st),
              rmmc_last_error_message());
  return false;
}

static bool sync_stream(worker_t *w, const char *when) {
  if (!w->e->gpu) return true;
  cudaError_t err = cudaStreamSynchronize(w->stream);
  if (err == cudaSuccess) return true;
  worker_fail(w, "cudaStreamSynchronize %s: %s", when, cudaGetErrorString(err));
  return false;
}

/* True once a warm-up thread has used up its budget (checked every 64
 * iterations, so the clock read costs nothing measurable). */
static inline bool over_budget(const worker_t *w, size_t i) {
  uint64_t limit = w->e->limit_ns;
  return limit != 0 && (i & 63) == 63 && now_ns() - w->t_start > limit;
}

static void timed_pair(worker_t *w, size_t steps) {
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

static void timed_random(worker_t *w, size_t steps) {
  size_t i;
  for (i = 0; i < steps; i++) {
    slot_t *s = &w->slots[w->victims[i]];
    if (!do_deallocate(w, s->ptr, s->bytes)) break;
    s->ptr = NULL;
    s->bytes = w->step_sizes[i];
    if (!do_allocate(w, s->bytes, &s->ptr)) break;
    if (over_budget(w, i)) {
      i++;
      break;
    }
  }
  w->done = 2 * i;
}

/* One run of this worker: fill, timed section, drain. */
static void worker_run(worker_t *w) {
  engine_t *e = w->e;
  const bench_case_t *c = e->c;
  w->done = 0;
  if (c->pattern == BENCH_RANDOM) {
    for (size_t i = 0; i < c->live; i++) {
      w->slots[i].bytes = w->fill_sizes[i];
      if (!do_allocate(w, w->slots[i].bytes, &w->slots[i].ptr)) break;
    }
  }
  if (!w->failed) sync_stream(w, "after the fill");
  pthread_barrier_wait(&e->inner);
  w->t_start = now_ns();
  if (!w->failed) {
    if (c->pattern == BENCH_PAIR) timed_pair(w, e->ops / 2);
    else timed_random(w, e->ops / 2);
    if (!w->failed) sync_stream(w, "at the end of the timed calls");
  }
  w->t_end = now_ns();
  pthread_barrier_wait(&e->inner);
  if (c->pattern == BENCH_RANDOM) {
    for (size_t i = 0; i < c->live; i++) {
      if (w->slots[i].ptr == NULL) continue;
      if (do_deallocate(w, w->slots[i].ptr, w->slots[i].bytes)) w->slots[i].ptr = NULL;
    }
  }
  sync_stream(w, "after the drain");
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  engine_t *e = w->e;
  pthread_mutex_lock(&e->start_lock);
  while (e->start_state == 0) pthread_cond_wait(&e->start_cond, &e->start_lock);
  int state = e->start_state;
  pthread_mutex_unlock(&e->start_lock);
  if (state < 0) return NULL;
  if (e->gpu) {
    cudaError_t err = cudaSetDevice(e->device);
    if (err != cudaSuccess) worker_fail(w, "cudaSetDevice(%d): %s", e->device, cudaGetErrorString(err));
  }
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
  return NULL;
}

static bool generate_sequence(worker_t *w, const bench_case_t *c, const bench_params_t *p) {
  if (c->pattern != BENCH_RANDOM) return true;
  size_t steps = p->ops / 2;
  w->fill_sizes = malloc(c->live * sizeof *w->fill_sizes);
  w->slots = calloc(c->live, sizeof *w->slots);
  w->victims = malloc(steps * sizeof *w->victims);
  w->step_sizes = malloc(steps * sizeof *w->step_sizes);
  if (!w->fill_sizes || !w->slots || !w->victims || !w->step_sizes) return false;
  uint64_t state = p->seed + (uint64_t)w->index;
  for (size_t i = 0; i < c->live; i++) w->fill_sizes[i] = random_size(&state, c);
  for (size_t i = 0; i < steps; i++) {
    w->victims[i] = (uint32_t)(next_random(&state) % c->live);
    w->step_sizes[i] = random_size(&state, c);
  }
  return true;
}

/* The stack's own figures after a run: what it reports as in use must be
 * back to 0 once every block was freed. */
static bool check_figures(const engine_t *e, char *err, size_t len) {
  if (e->r == NULL) return true;
  static const char *const keys[] = {"in_use", "outstanding"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    uint64_t v;
    if (rmmc_resource_get_field(e->r, keys[i], &v) && v != 0) {
      snprintf(err, len, "after every block was freed, %s reports %s = %llu (expected 0)",
               rmmc_resource_name(e->r), keys[i], (unsigned long long)v);
      return false;
    }
  }
  return true;
}

/* Runs every worker once; returns false (message in err) on a failure.
 * *wall_ns is the span from the first start to the last stop; *done_min
 * the fewest calls a thread completed. */
static bool engine_run(engine_t *e, size_t ops, uint64_t limit_ns, uint64_t *wall_ns,
                       size_t *done_min, char *err, size_t len) {
  e->ops = ops;
  e->limit_ns = limit_ns;
  pthread_barrier_wait(&e->outer); /* go */
  pthread_barrier_wait(&e->outer); /* done */
  uint64_t first = UINT64_MAX, last = 0;
  size_t dmin = SIZE_MAX;
  for (int i = 0; i < e->threads; i++) {
    worker_t *w = &e->workers[i];
    if (w->failed) {
      snprintf(err, len, "%s", w->error);
      return false;
    }
    if (w->t_start < first) first = w->t_start;
    if (w->t_end > last) last = w->t_end;
    if (w->done < dmin) dmin = w->done;
  }
  if (e->gpu) {
    cudaError_t cerr = cudaDeviceSynchronize();
    if (cerr != cudaSuccess) {
      snprintf(err, len, "cudaDeviceSynchronize after a run: %s", cudaGetErrorString(cerr));
      return false;
    }
  }
  if (!check_figures(e, err, len)) return false;
  *wall_ns = last > first ? last - first : 1;
  *done_min = dmin;
  return true;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static bool check_arguments(const bench_case_t *c, const bench_params_t *p, char *err, size_t len) {
  const char *why = NULL;
  if (c == NULL || p == NULL) why = "NULL case or params";
  else if (c->pattern != BENCH_PAIR && c->pattern != BENCH_RANDOM) why = "unknown pattern";
  else if (c->min_bytes == 0 || c->max_bytes < c->min_bytes) why = "sizes must satisfy 0 < min <= max";
  else if (c->pattern == BENCH_PAIR && c->min_bytes != c->max_bytes) why = "pair wants min == max";
  else if (c->pattern == BENCH_RANDOM && (c->live == 0 || c->live > UINT32_MAX))
    why = "random wants 1 <= live <= 2^32-1";
  else if (p->threads < 1 || p->threads > BENCH_MAX_THREADS) why = "threads out of range";
  else if (p->ops < 2 || p->ops > BENCH_MAX_OPS || p->ops % 2 != 0) why = "ops must be even, 2 .. 10^7";
  else if (p->repeat < 1 || p->repeat > BENCH_MAX_REPEAT) why = "repeat out of range";
  else if (!(p->budget_s >= 0)) why = "budget must be >= 0";
  if (why != NULL) snprintf(err, len, "bench_measure: %s", why);
  return why == NULL;
}

bool bench_uses_gpu(const rmmc_resource_t *r) {
  return r != NULL && rmmc_resource_memory_kind(r) != RMMC_MEMORY_HOST;
}

void bench_measure(rmmc_resource_t *r, const bench_case_t *c, const bench_params_t *p,
                   bench_result_t *out) {
  memset(out, 0, sizeof *out);
  if (!check_arguments(c, p, out->error, sizeof out->error)) {
    rmmc_resource_release(r);
    return;
  }
  engine_t e = {.r = r, .gpu = bench_uses_gpu(r), .device = rmmc_resource_device(r), .c = c,
                .threads = p->threads};
  char *err = out->error;
  size_t len = sizeof out->error;
  int saved_device = -1, started = 0, barriers = 0;
  if (e.gpu) {
    cudaError_t cerr = cudaGetDevice(&saved_device);
    if (cerr == cudaSuccess && e.device < 0) e.device = saved_device; /* pinned: no device */
    if (cerr == cudaSuccess) cerr = cudaSetDevice(e.device);
    if (cerr != cudaSuccess) {
      snprintf(err, len, "cannot make device %d current: %s", e.device, cudaGetErrorString(cerr));
      rmmc_resource_release(r);
      return;
    }
  }
  e.workers = calloc((size_t)p->threads, sizeof *e.workers);
  if (e.workers == NULL) {
    snprintf(err, len, "out of host memory for %d threads", p->threads);
    goto restore_device;
  }
  for (int i = 0; i < p->threads; i++) {
    worker_t *w = &e.workers[i];
    w->e = &e;
    w->index = i;
    if (!generate_sequence(w, c, p)) {
      snprintf(err, len, "out of host memory for the op sequences");
      goto free_workers;
    }
    if (p->one_stream && i > 0) {
      w->stream = e.workers[0].stream; /* thread 0 owns it */
    } else if (e.gpu) {
      cudaError_t cerr = cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking);
      if (cerr != cudaSuccess) {
        snprintf(err, len, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(cerr));
        goto free_workers;
      }
      w->own_stream = true;
    } else {
      w->stream = (cudaStream_t)(void *)w; /* distinct, never a special handle */
    }
  }
  pthread_mutex_init(&e.start_lock, NULL);
  pthread_cond_init(&e.start_cond, NULL);
  if (pthread_barrier_init(&e.outer, NULL, (unsigned)p->threads + 1) == 0) barriers++;
  if (barriers == 1 && pthread_barrier_init(&e.inner, NULL, (unsigned)p->threads) == 0) barriers++;
  if (barriers < 2) {
    snprintf(err, len, "pthread_barrier_init failed");
    goto destroy_sync;
  }
  for (; started < p->threads; started++) {
    if (pthread_create(&e.workers[started].thread, NULL, worker_main, &e.workers[started]) != 0) {
      snprintf(err, len, "cannot start thread %d of %d", started + 1, p->threads);
      break;
    }
  }
  pthread_mutex_lock(&e.start_lock);
  e.start_state = started == p->threads ? 1 : -1;
  pthread_cond_broadcast(&e.start_cond);
  pthread_mutex_unlock(&e.start_lock);
  if (started < p->threads) goto join;

  uint64_t wall;
  size_t done, ops = p->ops;
  uint64_t limit = (uint64_t)(p->budget_s * 1e9);
  if (!engine_run(&e, ops, limit, &wall, &done, err, len)) goto stop;
  if (limit != 0 && done < ops) { /* slow or still growing: warm up again, then size the runs */
    if (!engine_run(&e, ops, limit, &wall, &done, err, len)) goto stop;
    if (done < ops) ops = done < 2 ? 2 : done & ~(size_t)1;
  }
  out->ops = ops;
  for (int run = 0; run < p->repeat; run++) {
    if (!engine_run(&e, ops, 0, &wall, &done, err, len)) goto stop;
    out->ns[out->runs++] = (double)wall / (double)ops;
  }
  double sorted[BENCH_MAX_REPEAT];
  memcpy(sorted, out->ns, (size_t)out->runs * sizeof sorted[0]);
  qsort(sorted, (size_t)out->runs, sizeof sorted[0], compare_double);
  int n = out->runs;
  out->median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  out->min = sorted[0];
  out->max = sorted[n - 1];
  out->ops_per_s = (double)p->threads * 1e9 / out->median;
  out->ok = true;
  out->error[0] = '\0';

stop:
  e.quit = true;
  pthread_barrier_wait(&e.outer);
join:
  for (int i = 0; i < started; i++) pthread_join(e.workers[i].thread, NULL);
destroy_sync:
  if (barriers > 1) pthread_barrier_destroy(&e.inner);
  if (barriers > 0) pthread_barrier_destroy(&e.outer);
  pthread_cond_destroy(&e.start_cond);
  pthread_mutex_destroy(&e.start_lock);
free_workers:
  /* The stack goes first: its per-stream state must not outlive a stream. */
  rmmc_resource_release(r);
  r = NULL;
  for (int i = 0; i < p->threads; i++) {
    worker_t *w = &e.workers[i];
    if (w->own_stream) (void)cudaStreamDestroy(w->stream);
    free(w->fill_sizes);
    free(w->slots);
    free(w->victims);
    free(w->step_sizes);
  }
  free(e.workers);
restore_device:
  rmmc_resource_release(r); /* when the workers could not be allocated */
  if (saved_device >= 0) (void)cudaSetDevice(saved_device);
}
