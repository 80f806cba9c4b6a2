// SPDX-License-Identifier: Apache-2.0
/* rmmc-ab: two builds of librmmc timed in one process, burst by burst.
 *
 *   rmmc-ab [options] LIB_A LIB_B
 *
 * Why. Timing two builds in alternating processes (scripts/gpu-compare)
 * does not resolve a few percent on the GPU machines: over 18 rounds on
 * one H100 the per-round ratio of glibc's malloc, code neither build
 * touches, ran from 0.41 to 3.9 (docs/design.md, "Tools"). The machine's
 * speed moves between processes and within seconds. Here both libraries
 * are loaded into one process (dlopen, RTLD_LOCAL: each keeps its own
 * globals, thread caches and symbols; librmmc binds its own calls with
 * -Bsymbolic-functions) and take turns in short bursts (--ops calls per
 * thread, about a millisecond), the order flipping every burst. A burst's
 * ratio B/A compares two runs a millisecond apart, so what drifts slower
 * than that cancels, and the median over hundreds of bursts resolves well
 * under 1% where a process-level median resolves 10-20%.
 *
 * What each burst does is rmmc-bench's case (tools/bench_engine.c): pair
 * (allocate S bytes, free them) or random (L live blocks per thread; each
 * step frees a random live block and allocates a size uniform in
 * [min, max] in its place), on one non-blocking stream per thread (an
 * opaque key per thread on host stacks), with the same seeded sequence for
 * A and B, timed from a barrier to the last thread's end, with a
 * cudaStreamSynchronize of each thread's stream inside, memory never
 * touched. ns/call = wall / calls per thread (rmmc-bench's wall * threads /
 * calls). `--log` replays an RMM log instead: a burst is one pass, on one
 * thread (or, with --logged-threads, on a thread per logged thread in the
 * log's order across threads, each call timed as rmmc-replay times them,
 * since the hand-offs would swamp a wall clock). Both stacks are built
 * from the same spec, each by its own library, and must hand every block
 * back: a failed call stops the run.
 *
 * Output: per library its median ns/call and the address of its
 * rmmc_resource_allocate (two distinct libraries), then B/A: the ratio of
 * the medians, the median of the per-burst ratios, its 95% bootstrap
 * interval and the share of bursts where B was faster. --json writes the
 * same as one JSON object. Exit status: 0 done; 1 a library, stack or call
 * failed (the message says which); 2 bad command line.
 *
 * The code placement of each library stays as its build put it; to
 * average over placements, relink both with a pad and run again
 * (scripts/gpu-compare does). The same library given twice is one handle:
 * an A/A run that measures the method's own noise; a copy of it at another
 * path loads twice. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "rmmc/resource.h"

#include "bench_clock.h" /* now_ns, next_random: rmmc-bench's clock and sequences */

/* One loaded library and the stack it built. */
typedef struct {
  const char *path;
  void *dl;
  rmmc_status_t (*stack_create)(const char *, int, rmmc_resource_t **);
  rmmc_status_t (*allocate)(rmmc_resource_t *, size_t, size_t, cudaStream_t, void **);
  rmmc_status_t (*deallocate)(rmmc_resource_t *, void *, size_t, size_t, cudaStream_t);
  void (*release)(rmmc_resource_t *);
  const char *(*status_name)(rmmc_status_t);
  const char *(*last_error)(void);
  rmmc_resource_t *r;
} lib_t;

typedef struct {
  bool random; /* else pair */
  size_t size, min, max;
  int live, threads, bursts, warmup;
  long ops; /* calls per thread per burst, even */
  uint64_t seed;
} ab_case_t;

/* --log: a log in RMM's CSV format, resolved once into events on slots
 * (a slot is one live block of the log: its pointer's place while live). */
typedef struct {
  uint32_t slot;
  uint8_t free; /* 1: deallocate, 0: allocate */
  uint8_t stream;
  uint16_t thread; /* the logged thread (an index) */
  size_t size;
} ab_event_t;

enum { AB_MAX_STREAMS = 64, AB_MAX_THREADS = 256 };

typedef struct {
  ab_event_t *ev;
  size_t nev, nslots;
  ab_event_t *left; /* the slots live at the log's end, as their last allocation */
  size_t nleft;
  uint64_t stream_ids[AB_MAX_STREAMS];
  cudaStream_t streams[AB_MAX_STREAMS];
  bool created[AB_MAX_STREAMS];
  int nstreams;
  uint64_t thread_ids[AB_MAX_THREADS];
  int nthreads;
  size_t skipped; /* frees of pointers the log never handed out, failures */
} ab_log_t;

typedef struct worker worker_t;

typedef struct {
  lib_t lib[2];
  ab_case_t c;
  bool gpu;
  const char *log_path;
  ab_log_t log;
  bool logged_threads; /* --logged-threads: a worker per logged thread */
  void **slots[2];     /* --log: each library's blocks of the log's slots */
  size_t turn;         /* atomic, --logged-threads: the next event to run */
  bool aborted;        /* atomic: a call failed; nobody waits for a turn */
  worker_t *w;
  pthread_barrier_t start, end;
  double *ns[2]; /* per timed burst */
} ab_t;

struct worker {
  ab_t *ab;
  int index;
  pthread_t thread;
  cudaStream_t stream;
  bool own_stream;
  size_t steps;       /* length of the op sequence (cycled) */
  uint32_t *victim;   /* random: which live block each step replaces */
  size_t *sizes;      /* random: the size it allocates in its place */
  void **live[2];     /* random: each library's live blocks */
  size_t *live_size[2];
  size_t pos[2];      /* each library's place in the sequence */
  size_t *mine;       /* --logged-threads: this thread's events, in log order */
  size_t nmine;
  uint64_t call_ns;   /* --logged-threads: time inside the calls this burst */
  char error[512];
  bool failed;
};

static void fail(worker_t *w, const lib_t *l, const char *what, size_t bytes, rmmc_status_t st) {
  if (w->failed) return;
  w->failed = true;
  snprintf(w->error, sizeof w->error, "thread %d, %s: %s(%zu bytes) failed with %s: %s", w->index,
           l->path, what, bytes, l->status_name(st), l->last_error());
}

static inline bool alloc(worker_t *w, const lib_t *l, size_t bytes, cudaStream_t stream,
                         void **p) {
  rmmc_status_t st = l->allocate(l->r, bytes, RMMC_DEFAULT_ALIGNMENT, stream, p);
  if (st == RMMC_SUCCESS) return true;
  fail(w, l, "allocate", bytes, st);
  return false;
}

static inline bool dealloc(worker_t *w, const lib_t *l, void *p, size_t bytes,
                           cudaStream_t stream) {
  rmmc_status_t st = l->deallocate(l->r, p, bytes, RMMC_DEFAULT_ALIGNMENT, stream);
  if (st == RMMC_SUCCESS) return true;
  fail(w, l, "deallocate", bytes, st);
  return false;
}

/* One event of a log on library l. */
static inline bool run_event(worker_t *w, const lib_t *l, const ab_event_t *e, void **slot) {
  cudaStream_t stream = w->ab->log.streams[e->stream];
  if (e->free) {
    if (!dealloc(w, l, slot[e->slot], e->size, stream)) return false;
    slot[e->slot] = NULL;
    return true;
  }
  return alloc(w, l, e->size, stream, &slot[e->slot]);
}

/* Waits until event i is next; false once a call failed anywhere. */
static bool wait_turn(ab_t *ab, size_t i) {
  for (unsigned k = 0; __atomic_load_n(&ab->turn, __ATOMIC_ACQUIRE) != i; k++) {
    if (__atomic_load_n(&ab->aborted, __ATOMIC_ACQUIRE)) return false;
    if (k < 4000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      sched_yield();
    }
  }
  return true;
}

/* One burst of --ops calls on library s: the timed loop. */
static void burst(worker_t *w, int s) {
  const ab_t *ab = w->ab;
  const lib_t *l = &ab->lib[s];
  long steps = ab->c.ops / 2;
  if (w->failed) return;
  if (ab->log.ev != NULL && !ab->logged_threads) {
    const ab_event_t *e = ab->log.ev, *end = e + ab->log.nev;
    for (; e < end; e++)
      if (!run_event(w, l, e, ab->slots[s])) return;
  } else if (ab->log.ev != NULL) {
    /* In the log's order across threads: the thread that ran event i hands
     * the turn to the owner of event i+1 (as rmmc-replay does). The hand-offs
     * would swamp the calls in a wall-clock figure, so the calls alone are
     * timed, as rmmc-replay times them. */
    const ab_event_t *ev = ab->log.ev;
    w->call_ns = 0;
    for (size_t k = 0; k < w->nmine; k++) {
      size_t i = w->mine[k];
      if ((i == 0 || ev[i - 1].thread != w->index) && !wait_turn(w->ab, i)) return;
      uint64_t t0 = now_ns();
      bool ok = run_event(w, l, &ev[i], ab->slots[s]);
      w->call_ns += now_ns() - t0;
      if (!ok) {
        __atomic_store_n(&w->ab->aborted, true, __ATOMIC_RELEASE);
        return;
      }
      if (i + 1 < ab->log.nev && ev[i + 1].thread != w->index)
        __atomic_store_n(&w->ab->turn, i + 1, __ATOMIC_RELEASE);
    }
  } else if (!ab->c.random) {
    size_t bytes = ab->c.size;
    for (long i = 0; i < steps; i++) {
      void *p;
      if (!alloc(w, l, bytes, w->stream, &p) || !dealloc(w, l, p, bytes, w->stream)) return;
    }
  } else {
    void **live = w->live[s];
    size_t *live_size = w->live_size[s];
    size_t pos = w->pos[s];
    for (long i = 0; i < steps; i++) {
      uint32_t j = w->victim[pos];
      if (!dealloc(w, l, live[j], live_size[j], w->stream)) return;
      live[j] = NULL;
      if (!alloc(w, l, w->sizes[pos], w->stream, &live[j])) return;
      live_size[j] = w->sizes[pos];
      if (++pos == w->steps) pos = 0;
    }
    w->pos[s] = pos;
  }
  if (ab->gpu && (ab->log.ev != NULL ? cudaDeviceSynchronize() : cudaStreamSynchronize(w->stream)) !=
                     cudaSuccess && !w->failed) {
    w->failed = true;
    snprintf(w->error, sizeof w->error, "thread %d: synchronizing failed", w->index);
  }
}

/* --log: what a pass left live goes back, untimed, so each pass starts
 * from the same state (a warm pool, nothing live). */
static void leftovers(worker_t *w, int s) {
  const ab_t *ab = w->ab;
  if (w->index != 0) return; /* the slots are shared: one thread frees them */
  for (size_t i = 0; i < ab->log.nleft; i++) {
    const ab_event_t *e = &ab->log.left[i];
    void **p = &ab->slots[s][e->slot];
    if (*p != NULL) dealloc(w, &ab->lib[s], *p, e->size, ab->log.streams[e->stream]);
    *p = NULL;
  }
}

/* Burst b's first library: A on even bursts, B on odd ones. */
static int first_of(int b) { return b & 1; }

static void *worker_main(void *arg) {
  worker_t *w = arg;
  ab_t *ab = w->ab;
  for (int b = 0; b < ab->c.warmup + ab->c.bursts; b++) {
    for (int o = 0; o < 2; o++) {
      pthread_barrier_wait(&ab->start);
      int s = o == 0 ? first_of(b) : 1 - first_of(b);
      burst(w, s);
      pthread_barrier_wait(&ab->end);
      leftovers(w, s);
    }
  }
  return NULL;
}

/* The index of `id` among the n ids seen so far, added if new; -1 when
 * there is no room for it. */
static int id_index(uint64_t *ids, int *n, int max, uint64_t id) {
  int i = 0;
  while (i < *n && ids[i] != id) i++;
  if (i < *n) return i;
  if (*n == max) return -1;
  ids[(*n)++] = id;
  return i;
}

/* Reads an RMM CSV log (Thread,Time,Action,Pointer,Size,Stream; plain
 * text) into events on slots. A free of a pointer that is not live, or an
 * allocation of one that is, is skipped and counted; "allocate failure"
 * lines are skipped. */
static bool load_log(ab_log_t *log, const char *path, char *err, size_t len) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    snprintf(err, len, "cannot read %s: %s", path, strerror(errno));
    return false;
  }
  size_t lines = 0, cap = 16;
  int ch;
  while ((ch = getc(f)) != EOF) lines += ch == '\n';
  rewind(f);
  while (cap < 2 * lines + 16) cap *= 2;
  struct entry { uint64_t key; uint32_t slot; uint8_t state; } *map = calloc(cap, sizeof *map);
  uint32_t *spare = malloc((lines + 1) * sizeof *spare); /* slots free for reuse */
  size_t *slot_size = malloc((lines + 1) * sizeof *slot_size);
  uint8_t *slot_stream = malloc(lines + 1);
  log->ev = malloc((lines + 1) * sizeof *log->ev);
  bool ok = map != NULL && spare != NULL && slot_size != NULL && slot_stream != NULL &&
            log->ev != NULL;
  size_t nspare = 0;
  char line[512];
  if (!ok) snprintf(err, len, "out of host memory for %s", path);
  if (ok && (fgets(line, sizeof line, f) == NULL ||
             strncmp(line, "Thread,Time,Action,Pointer,Size,Stream", 38) != 0)) {
    snprintf(err, len, "%s: not an RMM CSV log (header Thread,Time,Action,Pointer,Size,Stream)",
             path);
    ok = false;
  }
  for (size_t no = 2; ok && fgets(line, sizeof line, f) != NULL; no++) {
    char *field[6], *save = NULL;
    int n = 0;
    for (char *t = strtok_r(line, ",\r\n", &save); t != NULL && n < 6; t = strtok_r(NULL, ",\r\n", &save))
      field[n++] = t;
    if (n == 0) continue;
    if (n < 6) {
      snprintf(err, len, "%s:%zu: %d fields, not 6", path, no, n);
      ok = false;
      break;
    }
    bool is_free = !strcmp(field[2], "free");
    if (!is_free && strcmp(field[2], "allocate") != 0) { /* allocate failure */
      log->skipped++;
      continue;
    }
    uint64_t key = strtoull(field[3], NULL, 16), sid = strtoull(field[5], NULL, 16);
    size_t size = (size_t)strtoull(field[4], NULL, 10);
    int ti = id_index(log->thread_ids, &log->nthreads, AB_MAX_THREADS, strtoull(field[0], NULL, 10));
    int si = id_index(log->stream_ids, &log->nstreams, AB_MAX_STREAMS, sid);
    if (ti < 0 || si < 0) {
      snprintf(err, len, "%s:%zu: more than %d %s", path, no, ti < 0 ? AB_MAX_THREADS : AB_MAX_STREAMS,
               ti < 0 ? "threads" : "streams");
      ok = false;
      break;
    }
    size_t h = (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 20) & (cap - 1), tomb = cap;
    while (map[h].state != 0 && !(map[h].state == 1 && map[h].key == key)) {
      if (map[h].state == 2 && tomb == cap) tomb = h;
      h = (h + 1) & (cap - 1);
    }
    ab_event_t *e = &log->ev[log->nev];
    if (is_free) {
      if (map[h].state != 1 || size == 0) {
        log->skipped++;
        continue;
      }
      map[h].state = 2;
      *e = (ab_event_t){map[h].slot, 1, slot_stream[map[h].slot], (uint16_t)ti,
                        slot_size[map[h].slot]};
      spare[nspare++] = map[h].slot;
    } else {
      if (map[h].state == 1 || size == 0) {
        log->skipped++;
        continue;
      }
      if (tomb != cap) h = tomb;
      uint32_t slot = nspare > 0 ? spare[--nspare] : (uint32_t)log->nslots++;
      map[h] = (struct entry){key, slot, 1};
      slot_size[slot] = size;
      slot_stream[slot] = (uint8_t)si;
      *e = (ab_event_t){slot, 0, (uint8_t)si, (uint16_t)ti, size};
    }
    log->nev++;
  }
  if (ok) {
    log->left = malloc((log->nslots + 1) * sizeof *log->left);
    ok = log->left != NULL;
    for (size_t i = 0; ok && i < cap; i++)
      if (map[i].state == 1)
        log->left[log->nleft++] =
            (ab_event_t){map[i].slot, 0, slot_stream[map[i].slot], 0, slot_size[map[i].slot]};
    if (!ok) snprintf(err, len, "out of host memory for %s", path);
  }
  if (ok && log->nev == 0) {
    snprintf(err, len, "%s: no events", path);
    ok = false;
  }
  fclose(f);
  free(map);
  free(spare);
  free(slot_size);
  free(slot_stream);
  return ok;
}

/* The log's streams as rmmc-replay maps them: real non-blocking streams on
 * a GPU (0 the legacy default stream), the logged values as keys without. */
static bool map_streams(ab_t *ab, char *err, size_t len) {
  ab_log_t *log = &ab->log;
  for (int s = 0; s < log->nstreams; s++) {
    uint64_t id = log->stream_ids[s];
    if (!ab->gpu) {
      log->streams[s] = (cudaStream_t)(uintptr_t)id;
    } else if (id == 0) {
      log->streams[s] = NULL;
    } else if (id == (uint64_t)(uintptr_t)cudaStreamLegacy ||
               id == (uint64_t)(uintptr_t)cudaStreamPerThread) {
      log->streams[s] = (cudaStream_t)(uintptr_t)id;
    } else if (cudaStreamCreateWithFlags(&log->streams[s], cudaStreamNonBlocking) == cudaSuccess) {
      log->created[s] = true;
    } else {
      snprintf(err, len, "cudaStreamCreateWithFlags failed");
      return false;
    }
  }
  return true;
}

static void free_log(ab_log_t *log) {
  for (int s = 0; s < log->nstreams; s++)
    if (log->created[s]) cudaStreamDestroy(log->streams[s]);
  free(log->ev);
  free(log->left);
}

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("rmmc-ab: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(rmmc-ab --help for usage)\n", stderr);
  return 2;
}

static const char usage[] =
    "usage: rmmc-ab [options] LIB_A LIB_B\n"
    "Times two builds of librmmc in one process, in alternating bursts.\n"
    "  --stack SPEC   the stack each library builds (default 'pool > cuda' with a\n"
    "                 GPU, 'pool > host' without)\n"
    "  --pattern P    pair (default) or random\n"
    "  --size BYTES   pair: the size (default 256)\n"
    "  --min BYTES    random: smallest size (default 256)\n"
    "  --max BYTES    random: largest size (default 4194304)\n"
    "  --live N       random: live blocks per thread (default 1000)\n"
    "  --threads N    threads, each on its own stream (default 1)\n"
    "  --log FILE     instead of a pattern, replay an RMM CSV log (plain text) on one\n"
    "                 thread, on its logged streams; a burst is one pass of the log,\n"
    "                 and what it leaves live is freed untimed\n"
    "  --logged-threads  with --log: a thread per logged thread, in the log's order\n"
    "                 across threads (as rmmc-replay)\n"
    "  --ops N        calls per thread per burst (default 20000; rounded up to even)\n"
    "  --bursts N     timed bursts per library (default 300; 10 untimed first)\n"
    "  --seed N       sequence seed (default 1)\n"
    "  --placement N  draw where the stacks' host structs fall from seed N (a live\n"
    "                 host block of random size before each; odd N builds B first;\n"
    "                 default 0: A then B, no blocks)\n"
    "  --json FILE    also write the result as one JSON object\n";

static bool parse_count(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = (long)v;
  return true;
}

static bool load(lib_t *l, const char *path, char *err, size_t len) {
  l->path = path;
  /* A name without a slash is a file here, not a search of the library path. */
  char here[4096];
  if (strchr(path, '/') == NULL && snprintf(here, sizeof here, "./%s", path) < (int)sizeof here)
    l->dl = dlopen(here, RTLD_NOW | RTLD_LOCAL);
  else
    l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (l->dl == NULL) {
    snprintf(err, len, "cannot load %s: %s", path, dlerror());
    return false;
  }
#define SYM(field, name)                                                           \
  do {                                                                             \
    *(void **)&l->field = dlsym(l->dl, name);                                      \
    if (l->field == NULL) {                                                        \
      snprintf(err, len, "%s has no %s: not a librmmc build", path, name);         \
      return false;                                                                \
    }                                                                              \
  } while (0)
  SYM(stack_create, "rmmc_stack_create");
  SYM(allocate, "rmmc_resource_allocate");
  SYM(deallocate, "rmmc_resource_deallocate");
  SYM(release, "rmmc_resource_release");
  SYM(status_name, "rmmc_status_name");
  SYM(last_error, "rmmc_last_error_message");
#undef SYM
  return true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double *t = malloc((size_t)n * sizeof *t);
  if (t == NULL) return 0;
  memcpy(t, v, (size_t)n * sizeof *t);
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  double m = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  free(t);
  return m;
}

/* 95% bootstrap interval of the median of v (2,000 resamples, seeded). */
static void interval(const double *v, int n, double *lo, double *hi) {
  enum { R = 2000 };
  double *meds = malloc(R * sizeof *meds), *s = malloc((size_t)n * sizeof *s);
  *lo = *hi = 0;
  if (meds != NULL && s != NULL) {
    uint64_t st = 1;
    for (int r = 0; r < R; r++) {
      for (int i = 0; i < n; i++) s[i] = v[next_random(&st) % (uint64_t)n];
      meds[r] = median(s, n);
    }
    qsort(meds, R, sizeof *meds, cmp_double);
    *lo = meds[R * 25 / 1000];
    *hi = meds[R * 975 / 1000 - 1];
  }
  free(meds);
  free(s);
}

/* The op sequence and, for random, both libraries' first live blocks. */
static bool setup_worker(ab_t *ab, worker_t *w, char *err, size_t len) {
  const ab_case_t *c = &ab->c;
  if (ab->log.ev != NULL) { /* the log's own streams and the run's slots */
    if (!ab->logged_threads) return true;
    for (size_t i = 0; i < ab->log.nev; i++) w->nmine += ab->log.ev[i].thread == w->index;
    w->mine = malloc((w->nmine + 1) * sizeof *w->mine);
    if (w->mine == NULL) {
      snprintf(err, len, "out of host memory for the log's threads");
      return false;
    }
    size_t k = 0;
    for (size_t i = 0; i < ab->log.nev; i++)
      if (ab->log.ev[i].thread == w->index) w->mine[k++] = i;
    return true;
  }
  if (ab->gpu) {
    if (cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking) != cudaSuccess) {
      snprintf(err, len, "cudaStreamCreateWithFlags failed");
      return false;
    }
    w->own_stream = true;
  } else {
    w->stream = (cudaStream_t)(void *)w; /* distinct, never a special handle */
  }
  if (!c->random) return true;
  uint64_t st = c->seed + (uint64_t)w->index;
  w->steps = 65536;
  w->victim = malloc(w->steps * sizeof *w->victim);
  w->sizes = malloc(w->steps * sizeof *w->sizes);
  size_t *first = malloc((size_t)c->live * sizeof *first);
  bool ok = w->victim != NULL && w->sizes != NULL && first != NULL;
  uint64_t span = (uint64_t)(c->max - c->min) + 1;
  for (int j = 0; ok && j < c->live; j++) first[j] = c->min + (size_t)(next_random(&st) % span);
  for (size_t i = 0; ok && i < w->steps; i++) {
    w->victim[i] = (uint32_t)(next_random(&st) % (uint64_t)c->live);
    w->sizes[i] = c->min + (size_t)(next_random(&st) % span);
  }
  for (int s = 0; ok && s < 2; s++) {
    w->live[s] = calloc((size_t)c->live, sizeof(void *));
    w->live_size[s] = calloc((size_t)c->live, sizeof(size_t));
    ok = w->live[s] != NULL && w->live_size[s] != NULL;
    for (int j = 0; ok && j < c->live; j++) {
      ok = alloc(w, &ab->lib[s], first[j], w->stream, &w->live[s][j]);
      if (ok) w->live_size[s][j] = first[j];
    }
  }
  free(first);
  if (!ok) snprintf(err, len, "%s", w->failed ? w->error : "out of host memory for the sequences");
  return ok;
}

/* Frees what setup_worker made; false if a free failed. */
static bool teardown_worker(ab_t *ab, worker_t *w) {
  bool ok = true;
  for (int s = 0; s < 2; s++) {
    for (int j = 0; w->live[s] != NULL && j < ab->c.live; j++)
      if (w->live[s][j] != NULL)
        ok = dealloc(w, &ab->lib[s], w->live[s][j], w->live_size[s][j], w->stream) && ok;
    free(w->live[s]);
    free(w->live_size[s]);
  }
  if (w->index == 0) { /* the log's slots: what a failed pass left live */
    for (int s = 0; s < 2; s++) {
      for (size_t j = 0; ab->slots[s] != NULL && j < ab->log.nslots; j++) {
        if (ab->slots[s][j] == NULL) continue;
        const ab_event_t *e = NULL; /* the slot's last allocation */
        for (size_t i = ab->log.nev; i-- > 0 && e == NULL;)
          if (ab->log.ev[i].slot == j && !ab->log.ev[i].free) e = &ab->log.ev[i];
        if (e != NULL)
          ok = dealloc(w, &ab->lib[s], ab->slots[s][j], e->size, ab->log.streams[e->stream]) && ok;
        ab->slots[s][j] = NULL;
      }
    }
  }
  free(w->mine);
  free(w->victim);
  free(w->sizes);
  if (w->own_stream) {
    cudaStreamSynchronize(w->stream);
    cudaStreamDestroy(w->stream);
  }
  return ok;
}

int main(int argc, char **argv) {
  ab_t ab = {0};
  ab.c = (ab_case_t){.size = 256, .min = 256, .max = 4u << 20, .live = 1000, .threads = 1,
                     .bursts = 300, .warmup = 10, .ops = 20000, .seed = 1};
  const char *spec = NULL, *json = NULL, *paths[2] = {NULL, NULL};
  uint64_t placement = 0;
  void *pads[2] = {NULL, NULL};
  int npaths = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    long v;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage, stdout);
      return 0;
    }
    if (a[0] != '-') {
      if (npaths == 2) return usage_error("more than two libraries ('%s')", a);
      paths[npaths++] = a;
      continue;
    }
    if (!strcmp(a, "--logged-threads")) {
      ab.logged_threads = true;
      continue;
    }
    if (i + 1 >= argc) return usage_error("%s needs a value", a);
    const char *val = argv[++i];
    if (!strcmp(a, "--stack")) spec = val;
    else if (!strcmp(a, "--log")) ab.log_path = val;
    else if (!strcmp(a, "--json")) json = val;
    else if (!strcmp(a, "--pattern")) {
      if (!strcmp(val, "pair")) ab.c.random = false;
      else if (!strcmp(val, "random")) ab.c.random = true;
      else return usage_error("--pattern takes pair or random, not '%s'", val);
    } else if (!strcmp(a, "--size") && parse_count(val, 1, 1L << 40, &v)) ab.c.size = (size_t)v;
    else if (!strcmp(a, "--min") && parse_count(val, 1, 1L << 40, &v)) ab.c.min = (size_t)v;
    else if (!strcmp(a, "--max") && parse_count(val, 1, 1L << 40, &v)) ab.c.max = (size_t)v;
    else if (!strcmp(a, "--live") && parse_count(val, 1, 1 << 20, &v)) ab.c.live = (int)v;
    else if (!strcmp(a, "--threads") && parse_count(val, 1, 256, &v)) ab.c.threads = (int)v;
    else if (!strcmp(a, "--ops") && parse_count(val, 2, 1L << 30, &v)) ab.c.ops = (v + 1) & ~1L;
    else if (!strcmp(a, "--bursts") && parse_count(val, 1, 1 << 20, &v)) ab.c.bursts = (int)v;
    else if (!strcmp(a, "--seed") && parse_count(val, 0, INT64_MAX, &v)) ab.c.seed = (uint64_t)v;
    else if (!strcmp(a, "--placement") && parse_count(val, 0, INT64_MAX, &v)) placement = (uint64_t)v;
    else if (!strcmp(a, "--size") || !strcmp(a, "--min") || !strcmp(a, "--max") ||
             !strcmp(a, "--live") || !strcmp(a, "--threads") || !strcmp(a, "--ops") ||
             !strcmp(a, "--bursts") || !strcmp(a, "--seed") || !strcmp(a, "--placement"))
      return usage_error("bad value for %s: '%s'", a, val);
    else return usage_error("unknown option '%s'", a);
  }
  if (npaths != 2) return usage_error("give two libraries, LIB_A and LIB_B");
  if (ab.c.random && ab.c.min > ab.c.max) return usage_error("--min is above --max");
  if (ab.log_path != NULL && ab.c.threads != 1)
    return usage_error("--log replays on one thread, or with --logged-threads on the log's");
  if (ab.logged_threads && ab.log_path == NULL) return usage_error("--logged-threads needs --log");

  char err[600];
  int rc = 1, made = 0, started = 0;
  for (int s = 0; s < 2; s++)
    if (!load(&ab.lib[s], paths[s], err, sizeof err)) goto out;
  int ndev = 0;
  ab.gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
  if (spec == NULL) spec = ab.gpu ? "pool > cuda" : "pool > host";
  if (ab.log_path != NULL && (!load_log(&ab.log, ab.log_path, err, sizeof err) ||
                              !map_streams(&ab, err, sizeof err)))
    goto out;
  if (ab.log_path != NULL) {
    ab.c.ops = (long)ab.log.nev; /* a burst: one pass */
    if (ab.logged_threads) ab.c.threads = ab.log.nthreads;
    ab.slots[0] = calloc(ab.log.nslots + 1, sizeof(void *));
    ab.slots[1] = calloc(ab.log.nslots + 1, sizeof(void *));
    if (ab.slots[0] == NULL || ab.slots[1] == NULL) {
      snprintf(err, sizeof err, "out of host memory for the log's slots");
      goto out;
    }
  }
  /* Data placement: with --placement, each stack is built after a live
   * host block of a random size (0-64 KiB), and an odd seed builds B's
   * first, so that where the stacks' structs fall is drawn per process
   * too. */
  uint64_t pst = placement;
  for (; made < 2; made++) {
    lib_t *l = &ab.lib[placement & 1 ? 1 - made : made];
    if (placement != 0) {
      pads[made] = malloc(1 + 16 * (size_t)(next_random(&pst) % 4096));
      if (pads[made] == NULL) {
        snprintf(err, sizeof err, "out of host memory");
        goto out;
      }
    }
    rmmc_status_t st = l->stack_create(spec, -1, &l->r);
    if (st != RMMC_SUCCESS) {
      snprintf(err, sizeof err, "%s: '%s' failed with %s: %s", l->path, spec, l->status_name(st),
               l->last_error());
      goto out;
    }
  }
  ab.w = calloc((size_t)ab.c.threads, sizeof *ab.w);
  ab.ns[0] = calloc((size_t)ab.c.bursts, sizeof(double));
  ab.ns[1] = calloc((size_t)ab.c.bursts, sizeof(double));
  if (ab.w == NULL || ab.ns[0] == NULL || ab.ns[1] == NULL) {
    snprintf(err, sizeof err, "out of host memory");
    goto out;
  }
  int ready = 0;
  for (; ready < ab.c.threads; ready++) {
    ab.w[ready].ab = &ab;
    ab.w[ready].index = ready;
    if (!setup_worker(&ab, &ab.w[ready], err, sizeof err)) {
      ready++; /* its half-made state is torn down below */
      goto workers;
    }
  }
  if (pthread_barrier_init(&ab.start, NULL, (unsigned)ab.c.threads + 1) != 0 ||
      pthread_barrier_init(&ab.end, NULL, (unsigned)ab.c.threads + 1) != 0) {
    fprintf(stderr, "rmmc-ab: pthread_barrier_init failed\n");
    exit(1);
  }
  /* The least time between two clock reads, taken off each timed call. */
  uint64_t clock_ns = UINT64_MAX;
  for (int i = 0; i < 2000; i++) {
    uint64_t a = now_ns(), b = now_ns();
    if (b - a < clock_ns) clock_ns = b - a;
  }
  for (; started < ab.c.threads; started++)
    if (pthread_create(&ab.w[started].thread, NULL, worker_main, &ab.w[started]) != 0) break;
  if (started < ab.c.threads) {
    /* The barriers count every thread: without all of them nothing can run. */
    fprintf(stderr, "rmmc-ab: cannot start thread %d of %d\n", started + 1, ab.c.threads);
    exit(1);
  }
  for (int b = 0; b < ab.c.warmup + ab.c.bursts; b++) {
    for (int o = 0; o < 2; o++) {
      int s = o == 0 ? first_of(b) : 1 - first_of(b);
      __atomic_store_n(&ab.turn, 0, __ATOMIC_RELEASE); /* --logged-threads: event 0 first */
      pthread_barrier_wait(&ab.start);
      uint64_t t0 = now_ns();
      pthread_barrier_wait(&ab.end);
      uint64_t t1 = now_ns();
      if (b < ab.c.warmup) continue;
      double took = (double)(t1 - t0);
      if (ab.logged_threads) { /* the calls' own time, less the clock's */
        took = -(double)clock_ns * (double)ab.c.ops;
        for (int i = 0; i < ab.c.threads; i++) took += (double)ab.w[i].call_ns;
      }
      ab.ns[s][b - ab.c.warmup] = took / (double)ab.c.ops;
    }
  }
  for (int i = 0; i < started; i++) pthread_join(ab.w[i].thread, NULL);
  pthread_barrier_destroy(&ab.start);
  pthread_barrier_destroy(&ab.end);
  rc = 0;
  for (int i = 0; i < ab.c.threads && rc == 0; i++)
    if (ab.w[i].failed) {
      snprintf(err, sizeof err, "%s", ab.w[i].error);
      rc = 1;
    }

workers:
  for (int i = 0; i < ready; i++) {
    if (!teardown_worker(&ab, &ab.w[i]) && rc == 0) {
      snprintf(err, sizeof err, "%s", ab.w[i].error);
      rc = 1;
    }
  }
  if (rc == 0) {
    int n = ab.c.bursts;
    double *ratio = malloc((size_t)n * sizeof *ratio);
    if (ratio == NULL) {
      snprintf(err, sizeof err, "out of host memory");
      rc = 1;
      goto out;
    }
    int faster = 0;
    for (int b = 0; b < n; b++) {
      ratio[b] = ab.ns[1][b] / ab.ns[0][b];
      faster += ratio[b] < 1;
    }
    double ma = median(ab.ns[0], n), mb = median(ab.ns[1], n), mr = median(ratio, n), lo, hi;
    interval(ratio, n, &lo, &hi);
    char name[96];
    if (ab.log_path != NULL) {
      const char *base = strrchr(ab.log_path, '/');
      snprintf(name, sizeof name, "replay %s%s", base != NULL ? base + 1 : ab.log_path,
               ab.logged_threads ? ", logged threads" : "");
    } else if (ab.c.random)
      snprintf(name, sizeof name, "random %zu-%zu live %d t%d", ab.c.min, ab.c.max, ab.c.live,
               ab.c.threads);
    else
      snprintf(name, sizeof name, "pair %zu t%d", ab.c.size, ab.c.threads);
    for (int s = 0; s < 2; s++) {
      printf("%c: %s (rmmc_resource_allocate at %p)\n", 'A' + s, ab.lib[s].path,
             *(void **)&ab.lib[s].allocate);
    }
    printf("%s on '%s', %d bursts of %ld calls per thread, order flipping each burst:\n", name,
           spec, n, ab.c.ops);
    printf("  A %.2f ns/call, B %.2f ns/call; B/A: medians %.3f, per burst %.3f "
           "(95%% interval %.3f-%.3f), B faster in %d of %d bursts\n",
           ma, mb, mb / ma, mr, lo, hi, faster, n);
    if (json != NULL) {
      FILE *f = fopen(json, "w");
      if (f == NULL) {
        snprintf(err, sizeof err, "cannot write %s: %s", json, strerror(errno));
        rc = 1;
      } else {
        fprintf(f,
                "{\"case\": \"%s\", \"stack\": \"%s\", \"bursts\": %d, \"ops\": %ld, "
                "\"a\": \"%s\", \"b\": \"%s\", \"a_ns_per_call\": %.4f, \"b_ns_per_call\": %.4f, "
                "\"ratio_of_medians\": %.5f, \"median_ratio\": %.5f, \"interval95\": [%.5f, %.5f], "
                "\"b_faster_bursts\": %d, \"placement\": %llu, \"log_events\": %zu, "
                "\"log_skipped\": %zu, \"log_slots\": %zu, \"log_streams\": %d, \"log_threads\": %d}\n",
                name, spec, n, ab.c.ops, paths[0], paths[1], ma, mb, mb / ma, mr, lo, hi, faster,
                (unsigned long long)placement, ab.log.nev, ab.log.skipped, ab.log.nslots,
                ab.log.nstreams, ab.logged_threads ? ab.log.nthreads : 1);
        fclose(f);
      }
    }
    free(ratio);
  }
out:
  for (int s = 0; s < 2; s++) {
    if (ab.lib[s].r != NULL) ab.lib[s].release(ab.lib[s].r);
    free(pads[s]);
  }
  free_log(&ab.log);
  free(ab.slots[0]);
  free(ab.slots[1]);
  free(ab.w);
  free(ab.ns[0]);
  free(ab.ns[1]);
  if (rc != 0) fprintf(stderr, "rmmc-ab: %s\n", err);
  return rc;
}
