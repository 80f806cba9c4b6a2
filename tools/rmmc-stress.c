/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc-stress: many threads on many streams allocate and free random sizes
 * through whole stacks, fill every block with a tagged pattern and check
 * it before it is freed.
 *
 * Per stack, T threads each own S streams (non-blocking CUDA streams, or
 * opaque keys in host mode) and up to L live blocks. Each step allocates a
 * random size on a random stream of the thread and fills the block there,
 * or frees a random live block after checking its pattern. A quarter of the
 * frees move the block to another of the thread's streams first (an event
 * recorded on the old stream, the new stream waits on it, check and free on
 * the new stream); one in sixteen hands the block to another thread through
 * a shared mailbox (the same event handshake), which checks and frees it on
 * one of its own streams later. Blocks freed on one stream and reused on
 * another, by the same or another thread, come from the stack itself.
 *
 * Verification is stream-ordered and never waits on the host: device
 * memory is filled and checked by kernels (tests/support/gpu_kernels.cu)
 * that add mismatches to a per-thread device counter read once at the end;
 * host memory is filled and checked by the CPU with the same pattern
 * function (tests/support/pattern.h). At the end every block is freed, the
 * device synchronized, and the stack must be back to 0: the statistics
 * layer on top (current bytes and count 0, totals equal to what this
 * program did) and every layer's "in_use" and "outstanding" figures; then
 * release_cached is called and each layer's "reserved" is reported.
 *
 * The exit status says whether every stack passed: no corruption, no leak,
 * no status other than a clean out of memory, no misaligned pointer. The
 * program lives with the other tools and links the test kernels of
 * tests/support/; without nvcc it is built host-only.
 *
 * A device per thread (--devices 0,1): each listed device gets its own
 * stack, built from the --stack text for that device (one spec, or
 * per-device items as RMMC_ALLOC_CONF takes them: 'pool > cuda; 1:
 * pool(max=40GiB) > cuda'), and set in the registry as that device's for
 * the run; thread i works on device i mod n, its streams and kernels
 * there. A block handed to a thread of another device is checked by its
 * giver first and freed by the taker while the taker's device is current:
 * through rmmc_deallocate (the registry finds the stack that holds it)
 * where every stack can tell which block holds a pointer, otherwise
 * straight to its stack. Each device's stack must end at zero on its own:
 * a block freed to another device's stack fails the run.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "pattern.h"
#include "rmmc/rmmc.h"
#include "cli.h"
#if RMMC_STRESS_HAVE_KERNELS
#include "gpu_kernels.h"
#endif

enum exit_code {
  EXIT_OK = 0,
  EXIT_FAILED = 1,  /* a stack failed: corruption, leak, unexpected status */
  EXIT_USAGE = 2,   /* bad command line */
  EXIT_IO = 3,      /* the --json file could not be written */
  EXIT_NO_GPU = 77, /* --gpu on a machine (or build) without one */
};

#define MAX_STACKS 32
#define MAX_DEVICES 16 /* --devices lists at most this many */
#define MAX_THREADS 256
#define MAX_STREAMS 64
#define MAX_LIVE 4096
#define MAILBOX_CAP 64
#define LARGE_EVERY 256   /* one allocation in this many is a large one */
#define ZERO_EVERY 1024   /* one in this many requests 0 bytes */
#define INJECT_EVERY 1000 /* --inject-corruption: thread 0's 1st, 1001st, ... */
#define DENSE_WORDS 512   /* sparse CPU fill: 4 KiB at each end checked whole */
#define SPARSE_STRIDE 512 /* and one word per 4 KiB between them */
#define PROGRESS_STEP 1024 /* a worker publishes its op count this often */

static const char *const gpu_default_stacks[] = {
    "statistics > pool > cuda",
    "statistics > pool(expandable=true) > cuda",
    "statistics > binning > pool > cuda",
    "statistics > arena > cuda",
    "statistics > cuda_async",
    /* The limit is met now and then (a few large blocks live at once): its
     * clean out-of-memory failures are part of the test (oom column). */
    "statistics > limiting(limit=1GiB) > tracking > pool > cuda",
    "statistics > aligned(alignment=4KiB, threshold=64KiB) > binning > pool > cuda",
    NULL,
};

static const char *const host_default_stacks[] = {
    "statistics > pool > host",
    "statistics > pool(expandable=true, page=2MiB) > host",
    "statistics > binning > pool > host",
    "statistics > arena > host",
    "statistics > limiting(limit=1GiB) > tracking > pool > host",
    "statistics > aligned(alignment=4KiB, threshold=64KiB) > binning > pool > host",
    NULL,
};

static const char usage_text[] =
    "Usage: rmmc-stress [options]\n"
    "Allocates and frees random sizes from many threads and streams through whole\n"
    "stacks, fills every block with a tagged pattern and checks it before the free,\n"
    "then checks that the stack is back to 0.\n"
    "\n"
    "  --stack SPEC       a stack, outermost first (repeatable); put 'statistics' on\n"
    "                     top for the leak figures. Default: statistics over pool,\n"
    "                     pool(expandable=true), binning > pool, arena, cuda_async, limiting > tracking >\n"
    "                     pool and aligned > binning > pool, over cuda (GPU mode) or\n"
    "                     host (host mode, no cuda_async)\n"
    "  --threads N        threads per stack (default 16)\n"
    "  --streams N        streams per thread (default 4)\n"
    "  --ops N            allocate and free calls per stack, all threads together\n"
    "                     (default 1000000; the final frees come on top)\n"
    "  --live N           most live blocks per thread (default 64)\n"
    "  --max-bytes SIZE   sizes are log-uniform from 1 B to this (default 4MiB)\n"
    "  --large-bytes SIZE one allocation in 256 is uniform above --max-bytes up to\n"
    "                     this (default 64MiB; 0: none)\n"
    "  --seed N           random seed (default 1)\n"
    "  --devices LIST     a device per thread: each device of LIST (e.g. 0,1) gets\n"
    "                     its own stack from --stack, which may carry per-device\n"
    "                     items ('pool > cuda; 1: pool(max=40GiB) > cuda', as\n"
    "                     RMMC_ALLOC_CONF), set in the registry for the run;\n"
    "                     thread i runs on device i mod n; blocks handed across\n"
    "                     devices are freed while the taker's device is current\n"
    "  --fill full|sparse how the CPU fills host memory: every word, or 4 KiB at\n"
    "                     each end and one word per 4 KiB between (default sparse;\n"
    "                     kernels always fill every byte)\n"
    "  --host             host mode: CPU fill and check, streams are opaque keys,\n"
    "                     the default stacks run over host memory; no CUDA call\n"
    "  --gpu              GPU mode, or exit 77 when there is no GPU or the program\n"
    "                     was built without the kernels. Default: GPU mode when\n"
    "                     possible, else host mode (said on stdout)\n"
    "  --inject-corruption  corrupt one byte of thread 0's 1st, 1001st, ...\n"
    "                     allocation after its fill: the run must then fail\n"
    "  --json FILE        also write the results as one JSON object\n"
    "  --quiet            no progress lines on stderr\n"
    "  --progress S       while a stack runs, a progress line on stderr every S\n"
    "                     seconds (default 2)\n"
    "  -h, --help         this text\n"
    "  --version          print the version and exit\n"
    "\n"
    "Exit status: 0 every stack passed; 1 a stack failed (corruption, leak, a\n"
    "status other than a clean out of memory, a misaligned pointer, a CUDA error);\n"
    "2 bad command line; 3 the --json file could not be written; 77 --gpu without\n"
    "a GPU, or --devices naming a device this machine lacks.\n";

typedef enum mode { MODE_AUTO, MODE_HOST, MODE_GPU } run_mode_t;

typedef struct options {
  const char *specs[MAX_STACKS];
  int nspecs;
  int threads, streams, live;
  uint64_t ops;
  size_t max_bytes, large_bytes;
  uint64_t seed;
  const char *json_path;
  int devices[MAX_DEVICES]; /* --devices; ndevices 0: one stack, the current device */
  int ndevices;
  run_mode_t mode;
  bool sparse, inject, quiet;
  double progress_s; /* seconds between progress lines */
} options_t;

/* One live block. `s` indexes the owning thread's streams; `dev` the
 * run's stacks (the one it came from). */
typedef struct entry {
  void *p;
  size_t n, align;
  uint64_t tag;
  int s, dev;
} entry_t;

typedef struct counts {
  uint64_t ops;           /* allocate and deallocate calls */
  uint64_t allocs, frees; /* successful ones, of at least 1 byte */
  uint64_t bytes;         /* bytes allocated in all */
  uint64_t zero;          /* 0-byte requests (NULL back, freed as NULL) */
  uint64_t aligned;       /* allocations with an alignment above 256 */
  uint64_t moves;         /* blocks checked and freed on another stream */
  uint64_t handoffs;      /* blocks handed to another thread */
  uint64_t oom;           /* clean out-of-memory failures */
  uint64_t align_refused; /* NOT_SUPPORTED for an alignment above 256 */
  uint64_t misaligned;    /* pointers not aligned as promised */
  uint64_t injected;      /* --inject-corruption */
  uint64_t cross;         /* blocks of another device's stack freed by this thread */
  uint64_t cpu_bad;       /* wrong units found by the CPU check */
  uint64_t unexpected;    /* any other failure */
} counts_t;

struct run;

typedef struct worker {
  struct run *run;
  int index;
  int dev;            /* its stack: run->rs[dev], on device run->devs[dev] */
  rmmc_resource_t *r; /* run->rs[dev] */
  uint64_t rng;
  uint64_t target; /* ops to make before the final frees */
  uint64_t progress; /* c.ops, published (atomically) every PROGRESS_STEP ops for the main thread */
  cudaStream_t *streams;
  cudaEvent_t *events; /* one per stream (CUDA streams only) */
  unsigned long long *d_errors; /* this thread's device counter */
  entry_t *live;
  int nlive;
  counts_t c;
  char error[512]; /* the first failure */
} worker_t;

typedef struct mail {
  entry_t e;
  cudaEvent_t event; /* recorded on the block's stream at the handoff */
} mail_t;

typedef struct run {
  const options_t *o;
  rmmc_resource_t *rs[MAX_DEVICES]; /* a stack per device (one without --devices) */
  int devs[MAX_DEVICES];            /* their CUDA devices */
  int ndev;
  bool via_registry; /* blocks crossing devices go back through rmmc_deallocate */
  bool cuda;    /* real CUDA streams and events */
  bool kernels; /* device memory: fill and check with kernels */
  int align_off;
  int stop;
  cudaStream_t *streams; /* threads x streams */
  cudaEvent_t *events;
  char *keys; /* opaque stream keys in host mode */
  unsigned long long *d_errors[MAX_DEVICES]; /* threads + 1 counters on each device */
  pthread_mutex_t mail_lock;
  mail_t mail[MAILBOX_CAP];
  int nmail;
  worker_t *workers; /* threads + 1: the last is the main thread's drain */
  int finished;      /* workers that have returned (atomic) */
  int index, count;  /* this stack's place in the run, for progress lines */
} run_t;

typedef struct layer_figures {
  char name[32];
  int device; /* the CUDA device of the stack it belongs to */
  bool has_in_use, has_outstanding, has_reserved, has_cached;
  uint64_t in_use, outstanding, reserved; /* after release_cached */
  uint64_t cached; /* "reserved" before release_cached, nothing in use */
} layer_t;

#define MAX_LAYERS 16

/* One device's stack in a run with --devices. */
typedef struct device_result {
  int device;
  char spec[512];     /* what --stack said for it */
  bool has_statistics;
  int64_t leaked_bytes, leaked_count;
  uint64_t stat_allocations, stat_deallocations;
} device_result_t;

typedef struct result {
  const char *spec;
  bool ran, passed;
  device_result_t devices[MAX_DEVICES];
  int ndev;
  const char *verify; /* "kernel" or "cpu" */
  const char *cross_path; /* blocks freed across devices: "rmmc_deallocate" or "owner stack" */
  counts_t c;
  uint64_t corruptions; /* device counters + CPU checks */
  bool has_statistics;
  int64_t leaked_bytes, leaked_count;
  uint64_t stat_allocations, stat_deallocations;
  layer_t layers[MAX_LAYERS * MAX_DEVICES]; /* each device's stack, outermost first */
  int nlayers;
  double wall_s;
  char error[1024]; /* why it failed; "" when it passed */
} result_t;

/* ---- small helpers ---- */

static uint64_t splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t next(worker_t *w) { return splitmix(&w->rng); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool stopped(const run_t *run) { return __atomic_load_n(&run->stop, __ATOMIC_RELAXED) != 0; }

static void fail(worker_t *w, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Counts an unexpected failure, keeps the thread's first message and
 * stops every thread of the run (each still frees what it holds). */
static void fail(worker_t *w, const char *fmt, ...) {
  w->c.unexpected++;
  if (w->error[0] == '\0') {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
  }
  __atomic_store_n(&w->run->stop, 1, __ATOMIC_RELAXED);
}

static bool cuda_ok(worker_t *w, cudaError_t err, const char *what) {
  if (err == cudaSuccess) return true;
  fail(w, "%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
  return false;
}

/* Writes (write) or checks the pattern tagged `tag` over n bytes at p on
 * the CPU; returns the wrong units (words, the tail counted once). Sparse:
 * DENSE_WORDS words at each end, every SPARSE_STRIDE-th word between, so an
 * overlap of two live blocks still lands on a checked word. */
static uint64_t host_pass(void *p, size_t n, uint64_t tag, bool sparse, bool write) {
  uint64_t *w = p;
  size_t words = n / 8;
  uint64_t bad = 0;
  for (size_t i = 0; i < words;) {
    uint64_t want = pattern_word(tag, i);
    if (write) w[i] = want;
    else bad += w[i] != want;
    size_t step = 1;
    if (sparse && i >= DENSE_WORDS && i + DENSE_WORDS < words) {
      step = words - DENSE_WORDS - i; /* land on the start of the last dense part */
      if (step > SPARSE_STRIDE) step = SPARSE_STRIDE;
    }
    i += step;
  }
  if (n % 8 != 0) {
    unsigned char *b = (unsigned char *)p + 8 * words;
    uint64_t want = pattern_word(tag, words);
    bool wrong = false;
    for (unsigned j = 0; j < n % 8; j++) {
      if (write) b[j] = pattern_byte_of(want, j);
      else wrong |= b[j] != pattern_byte_of(want, j);
    }
    bad += wrong;
  }
  return bad;
}

/* ---- the operations ---- */

/* A size: log-uniform from 1 B to max_bytes, or one in LARGE_EVERY uniform
 * above max_bytes up to large_bytes. */
static size_t pick_size(worker_t *w) {
  const options_t *o = w->run->o;
  uint64_t r = next(w);
  if (o->large_bytes > o->max_bytes && r % LARGE_EVERY == 0)
    return o->max_bytes + 1 + (size_t)(next(w) % (o->large_bytes - o->max_bytes));
  double u = (double)(next(w) >> 11) * 0x1p-53;
  double n = exp2(u * log2((double)o->max_bytes + 1.0));
  if (n < 1.0) return 1;
  if (n >= (double)o->max_bytes) return o->max_bytes;
  return (size_t)n;
}

/* Fills a new block on its stream (and corrupts it when injecting). */
static void fill(worker_t *w, const entry_t *e) {
  run_t *run = w->run;
  bool inject = run->o->inject && w->index == 0 && w->c.allocs % INJECT_EVERY == 1;
  if (run->kernels) {
#if RMMC_STRESS_HAVE_KERNELS
    cudaStream_t s = w->streams[e->s];
    if (!cuda_ok(w, gpu_fill_tagged(e->p, e->n, e->tag, s), "fill kernel launch")) return;
    if (inject && cuda_ok(w, gpu_corrupt_byte(e->p, s), "corrupting kernel launch"))
      w->c.injected++;
#endif
    return;
  }
  host_pass(e->p, e->n, e->tag, run->o->sparse, true);
  if (inject) {
    *(unsigned char *)e->p ^= 0xffu;
    w->c.injected++;
  }
}

/* Checks e's pattern on stream `to` of the thread (a kernel adding to its
 * device counter, or the CPU). */
static void check(worker_t *w, const entry_t *e, cudaStream_t to) {
  (void)to; /* host-only builds */
  if (w->run->kernels) {
#if RMMC_STRESS_HAVE_KERNELS
    cuda_ok(w, gpu_check_tagged(e->p, e->n, e->tag, w->d_errors, to), "check kernel launch");
#endif
  } else {
    w->c.cpu_bad += host_pass(e->p, e->n, e->tag, w->run->o->sparse, false);
  }
}

/* Checks e's pattern on stream `target` of the thread, moving it there from
 * its own stream first when they differ, then frees it on `target`. */
static void check_and_free(worker_t *w, const entry_t *e, int target) {
  run_t *run = w->run;
  cudaStream_t to = w->streams[target];
  if (target != e->s) {
    w->c.moves++;
    if (run->cuda &&
        (!cuda_ok(w, cudaEventRecord(w->events[e->s], w->streams[e->s]), "cudaEventRecord") ||
         !cuda_ok(w, cudaStreamWaitEvent(to, w->events[e->s], 0), "cudaStreamWaitEvent")))
      to = w->streams[e->s]; /* free where it is: still ordered after its fill */
  }
  check(w, e, to);
  w->c.ops++;
  rmmc_status_t st = rmmc_resource_deallocate(w->r, e->p, e->n, e->align, to);
  if (st != RMMC_SUCCESS) {
    fail(w, "deallocate(%p, %zu bytes, alignment %zu) returned %s: %s", e->p, e->n, e->align,
         rmmc_status_name(st), rmmc_last_error_message());
    return;
  }
  w->c.frees++;
}

static void request_zero(worker_t *w, cudaStream_t s) {
  void *p = (void *)w; /* must come back NULL */
  rmmc_status_t st = rmmc_resource_allocate(w->r, 0, RMMC_DEFAULT_ALIGNMENT, s, &p);
  w->c.ops++;
  if (st != RMMC_SUCCESS || p != NULL) {
    fail(w, "allocate(0 bytes) returned %s and %p (want SUCCESS and NULL): %s",
         rmmc_status_name(st), p, rmmc_last_error_message());
    return;
  }
  st = rmmc_resource_deallocate(w->r, NULL, 0, RMMC_DEFAULT_ALIGNMENT, s);
  w->c.ops++;
  if (st != RMMC_SUCCESS) {
    fail(w, "deallocate(NULL) returned %s: %s", rmmc_status_name(st), rmmc_last_error_message());
    return;
  }
  w->c.zero++;
}

static void do_alloc(worker_t *w) {
  run_t *run = w->run;
  uint64_t r = next(w);
  int s = (int)((r >> 32) % (uint64_t)run->o->streams);
  if (r % ZERO_EVERY == 0) {
    request_zero(w, w->streams[s]);
    return;
  }
  size_t n = pick_size(w), align = RMMC_DEFAULT_ALIGNMENT;
  if (((r >> 10) & 15) == 0 && !__atomic_load_n(&run->align_off, __ATOMIC_RELAXED))
    align = (size_t)512 << ((r >> 14) & 7); /* 512 B .. 64 KiB */
  void *p = (void *)w;
  rmmc_status_t st = rmmc_resource_allocate(w->r, n, align, w->streams[s], &p);
  w->c.ops++;
  if (st == RMMC_ERROR_OUT_OF_MEMORY && p == NULL) {
    w->c.oom++;
    return;
  }
  if (st == RMMC_ERROR_NOT_SUPPORTED && align > RMMC_DEFAULT_ALIGNMENT && p == NULL) {
    /* Base CUDA resources refuse alignments above 256 (design.md). */
    w->c.align_refused++;
    __atomic_store_n(&run->align_off, 1, __ATOMIC_RELAXED);
    return;
  }
  if (st != RMMC_SUCCESS || p == NULL) {
    fail(w, "allocate(%zu bytes, alignment %zu) returned %s and %p: %s", n, align,
         rmmc_status_name(st), p, rmmc_last_error_message());
    return;
  }
  if ((uintptr_t)p % align != 0) w->c.misaligned++; /* a failure; the block is still used */
  w->c.allocs++;
  w->c.bytes += n;
  w->c.aligned += align > RMMC_DEFAULT_ALIGNMENT;
  entry_t *e = &w->live[w->nlive++];
  *e = (entry_t){.p = p, .n = n, .align = align, .tag = next(w), .s = s, .dev = w->dev};
  fill(w, e);
}

/* Hands e to whichever thread takes it next; false when the mailbox is
 * full or the event could not be recorded (the caller frees e itself).
 * With several devices its pattern is checked first (cross_free). */
static bool mailbox_put(worker_t *w, const entry_t *e) {
  run_t *run = w->run;
  cudaEvent_t ev = NULL;
  /* A thread of another device may take it, and frees it unchecked: the
   * check is made here, before the event. */
  if (run->ndev > 1) check(w, e, w->streams[e->s]);
  if (run->cuda) {
    ev = w->events[e->s];
    if (!cuda_ok(w, cudaEventRecord(ev, w->streams[e->s]), "cudaEventRecord (handoff)"))
      return false;
  }
  pthread_mutex_lock(&run->mail_lock);
  bool room = run->nmail < MAILBOX_CAP;
  if (room) run->mail[run->nmail++] = (mail_t){.e = *e, .event = ev};
  pthread_mutex_unlock(&run->mail_lock);
  w->c.handoffs += room;
  return room;
}

/* Takes a block from the mailbox onto stream s of this thread: s waits for
 * the giver's stream as it was at the handoff. */
static bool adopt(worker_t *w, const mail_t *m, int s) {
  if (w->run->cuda && !cuda_ok(w, cudaStreamWaitEvent(w->streams[s], m->event, 0),
                               "cudaStreamWaitEvent (handoff)"))
    return false;
  entry_t *e = &w->live[w->nlive++];
  *e = m->e;
  e->s = s;
  return true;
}

/* Frees a block of another device's stack that was handed to w (its giver
 * checked it before recording the event): once the event is reached, on
 * the host, while w's device is current, through rmmc_deallocate where the
 * registry can find its stack, else straight to its stack. */
static void cross_free(worker_t *w, const mail_t *m) {
  run_t *run = w->run;
  const entry_t *e = &m->e;
  if (run->cuda &&
      !cuda_ok(w, cudaEventSynchronize(m->event), "cudaEventSynchronize (handoff across devices)"))
    return;
  w->c.ops++;
  rmmc_status_t st = run->via_registry && e->align == RMMC_DEFAULT_ALIGNMENT
                         ? rmmc_deallocate(e->p, e->n, NULL)
                         : rmmc_resource_deallocate(run->rs[e->dev], e->p, e->n, e->align, NULL);
  if (st != RMMC_SUCCESS) {
    fail(w, "freeing a block of device %d's stack (%p, %zu bytes) from device %d: %s: %s",
         run->devs[e->dev], e->p, e->n, run->devs[w->dev], rmmc_status_name(st),
         rmmc_last_error_message());
    return;
  }
  w->c.frees++;
  w->c.cross++;
}

static bool mailbox_take(worker_t *w) {
  run_t *run = w->run;
  mail_t m;
  pthread_mutex_lock(&run->mail_lock);
  bool got = run->nmail > 0;
  if (got) {
    int i = (int)(next(w) % (uint64_t)run->nmail);
    m = run->mail[i];
    run->mail[i] = run->mail[--run->nmail];
  }
  pthread_mutex_unlock(&run->mail_lock);
  if (!got) return false;
  if (m.e.dev != w->dev) {
    cross_free(w, &m);
    return true;
  }
  int s = (int)(next(w) % (uint64_t)run->o->streams);
  if (!adopt(w, &m, s)) {
    /* Freed where the giver left it, after the device is idle: the only
     * safe order left without the event. */
    cuda_ok(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    entry_t *e = &w->live[w->nlive++];
    *e = m.e;
    e->s = s;
  }
  return true;
}

static void do_free(worker_t *w) {
  uint64_t r = next(w);
  int i = (int)(r % (uint64_t)w->nlive);
  entry_t e = w->live[i];
  w->live[i] = w->live[--w->nlive];
  unsigned what = (unsigned)((r >> 32) & 63);
  if (what < 4 && mailbox_put(w, &e)) return; /* 1 in 16: to another thread */
  int target = e.s, S = w->run->o->streams;
  if (what >= 48 && S > 1) /* 1 in 4: to another stream of this thread */
    target = (e.s + 1 + (int)((r >> 40) % (uint64_t)(S - 1))) % S;
  check_and_free(w, &e, target);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  run_t *run = w->run;
  int L = run->o->live;
  if (run->cuda) cuda_ok(w, cudaSetDevice(run->devs[w->dev]), "cudaSetDevice");
  while (w->c.ops < w->target && !stopped(run)) {
    if (w->c.ops % PROGRESS_STEP == 0) __atomic_store_n(&w->progress, w->c.ops, __ATOMIC_RELAXED);
    uint64_t r = next(w);
    if (w->nlive < L && r % 32 == 0 && mailbox_take(w)) continue;
    if (w->nlive == 0 || (w->nlive < L && ((r >> 8) & 1))) do_alloc(w);
    else do_free(w);
  }
  while (w->nlive > 0) {
    entry_t e = w->live[--w->nlive];
    check_and_free(w, &e, e.s);
  }
  __atomic_store_n(&w->progress, w->c.ops, __ATOMIC_RELAXED);
  __atomic_add_fetch(&run->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Until the `started` workers have returned, prints on stderr every
 * --progress seconds how far the stack is (a stack can take tens of
 * seconds on a GPU, which would otherwise look like a hang). */
static void report_progress(run_t *run, int started, double t0) {
  const options_t *o = run->o;
  double next_report = t0 + o->progress_s;
  while (__atomic_load_n(&run->finished, __ATOMIC_ACQUIRE) < started) {
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    double t = now_s();
    if (o->quiet || t < next_report) continue;
    next_report = t + o->progress_s;
    uint64_t done = 0;
    for (int i = 0; i < started; i++) done += __atomic_load_n(&run->workers[i].progress, __ATOMIC_RELAXED);
    fprintf(stderr, "rmmc-stress: [%d/%d] %.0f%% (%llu of %llu ops), %.1f s\n", run->index + 1,
            run->count, o->ops ? 100.0 * (double)done / (double)o->ops : 100.0,
            (unsigned long long)done, (unsigned long long)o->ops, t - t0);
  }
}

/* ---- one stack ---- */

static void add_counts(counts_t *a, const counts_t *b) {
  a->ops += b->ops, a->allocs += b->allocs, a->frees += b->frees, a->bytes += b->bytes;
  a->zero += b->zero, a->aligned += b->aligned, a->moves += b->moves;
  a->handoffs += b->handoffs, a->oom += b->oom, a->align_refused += b->align_refused;
  a->misaligned += b->misaligned, a->injected += b->injected, a->cpu_bad += b->cpu_bad;
  a->unexpected += b->unexpected, a->cross += b->cross;
}

static void result_error(result_t *res, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Appends one reason to the stack's failure text. */
static void result_error(result_t *res, const char *fmt, ...) {
  size_t len = strlen(res->error);
  if (len + 4 >= sizeof res->error) return;
  if (len > 0) len += (size_t)snprintf(res->error + len, sizeof res->error - len, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->error + len, sizeof res->error - len, fmt, ap);
  va_end(ap);
}

/* The device of thread t (the drain, t = threads, uses thread 0's). */
static int thread_device(const run_t *run, int t) {
  return run->devs[(t % run->o->threads) % run->ndev];
}

/* Each thread's streams and events on its device; a counter per thread on
 * every device (a kernel adds to a counter of its own device). */
static bool setup_cuda(run_t *run, result_t *res) {
  int T = run->o->threads, S = run->o->streams;
  size_t counters = (size_t)(T + 1) * sizeof(unsigned long long);
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < T * S && err == cudaSuccess; i++) {
    err = cudaSetDevice(thread_device(run, i / S));
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&run->streams[i], cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&run->events[i], cudaEventDisableTiming);
  }
  for (int k = 0; k < run->ndev && err == cudaSuccess; k++) {
    err = cudaSetDevice(run->devs[k]);
    if (err == cudaSuccess) err = cudaMalloc((void **)&run->d_errors[k], counters);
    if (err == cudaSuccess) err = cudaMemset(run->d_errors[k], 0, counters);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
  }
  if (err == cudaSuccess) err = cudaSetDevice(run->devs[0]);
  if (err != cudaSuccess)
    result_error(res, "setting up streams and counters: %s (%s)", cudaGetErrorName(err),
                 cudaGetErrorString(err));
  return err == cudaSuccess;
}

static void teardown_cuda(run_t *run) {
  int S = run->o->streams, n = run->o->threads * S;
  for (int i = 0; i < n; i++) {
    (void)cudaSetDevice(thread_device(run, i / S));
    if (run->events[i] != NULL) (void)cudaEventDestroy(run->events[i]);
    if (run->streams[i] != NULL) (void)cudaStreamDestroy(run->streams[i]);
  }
  for (int k = 0; k < run->ndev; k++) {
    (void)cudaSetDevice(run->devs[k]);
    if (run->d_errors[k] != NULL) (void)cudaFree(run->d_errors[k]);
  }
  (void)cudaSetDevice(run->devs[0]);
}

/* Waits for every device of the run. */
static void sync_devices(worker_t *w, const char *what) {
  for (int k = 0; k < w->run->ndev; k++)
    if (cuda_ok(w, cudaSetDevice(w->run->devs[k]), "cudaSetDevice"))
      cuda_ok(w, cudaDeviceSynchronize(), what);
  cuda_ok(w, cudaSetDevice(w->run->devs[w->dev]), "cudaSetDevice");
}

static void layer_cb(void *ctx, const rmmc_field_t *f) {
  layer_t *l = ctx;
  if (f->kind == RMMC_FIELD_TEXT) return;
  if (strcmp(f->key, "in_use") == 0) l->has_in_use = true, l->in_use = f->value;
  else if (strcmp(f->key, "outstanding") == 0) l->has_outstanding = true, l->outstanding = f->value;
  else if (strcmp(f->key, "reserved") == 0) l->has_reserved = true, l->reserved = f->value;
}

/* After everything was freed and the devices are idle, each device's
 * stack on its own: the statistics layer on top must be back to 0; after
 * release_cached, every layer's "in_use" and "outstanding" must be 0 too
 * ("reserved" is reported, not judged: a layer may keep memory). A block
 * freed to another device's stack shows here as a leak of its own. */
static void check_stack(run_t *run, result_t *res, int k) {
  rmmc_resource_t *top = run->rs[k];
  device_result_t *d = &res->devices[k];
  char who[48] = "";
  if (run->ndev > 1) snprintf(who, sizeof who, "device %d's ", run->devs[k]);
  if (strcmp(rmmc_resource_name(top), "statistics") == 0) {
    rmmc_statistics_t s = RMMC_STATISTICS_INIT;
    rmmc_status_t st = rmmc_statistics_adaptor_get(top, &s);
    if (st != RMMC_SUCCESS) {
      result_error(res, "rmmc_statistics_adaptor_get returned %s", rmmc_status_name(st));
    } else {
      d->has_statistics = true;
      d->leaked_bytes = s.current_bytes;
      d->leaked_count = s.current_count;
      d->stat_allocations = s.total_count;
      d->stat_deallocations = s.deallocations;
      if (s.current_bytes != 0 || s.current_count != 0)
        result_error(res, "leak: %sstatistics shows %lld bytes in %lld allocations at the end",
                     who, (long long)s.current_bytes, (long long)s.current_count);
    }
  }
  /* Layers below the top may hold memory as a cache (binning keeps its
   * bins' chunks from the pool under it): give it back first. */
  int first = res->nlayers, n = 0;
  for (rmmc_resource_t *l = top; l != NULL && n < MAX_LAYERS; l = rmmc_resource_upstream(l)) {
    layer_t *f = &res->layers[first + n++];
    rmmc_resource_describe(l, layer_cb, f);
    f->has_cached = f->has_reserved;
    f->cached = f->reserved;
    f->has_reserved = false;
  }
  rmmc_status_t st = rmmc_resource_release_cached(top);
  if (st != RMMC_SUCCESS)
    result_error(res, "%srelease_cached returned %s: %s", who, rmmc_status_name(st),
                 rmmc_last_error_message());
  n = 0;
  for (rmmc_resource_t *l = top; l != NULL && n < MAX_LAYERS; l = rmmc_resource_upstream(l)) {
    layer_t *f = &res->layers[first + n++];
    snprintf(f->name, sizeof f->name, "%s", rmmc_resource_name(l));
    f->device = run->devs[k];
    rmmc_resource_describe(l, layer_cb, f);
    if ((f->has_in_use && f->in_use != 0) || (f->has_outstanding && f->outstanding != 0))
      result_error(res,
                   "leak: %slayer %d (%s) reports in_use %llu, outstanding %llu after everything "
                   "was freed and release_cached",
                   who, n, f->name, (unsigned long long)f->in_use,
                   (unsigned long long)f->outstanding);
  }
  res->nlayers = first + n;
}

/* Every device's stack, then their statistics together against what the
 * program did. */
static void check_leaks(run_t *run, result_t *res) {
  bool all = true;
  for (int k = 0; k < run->ndev; k++) {
    check_stack(run, res, k);
    const device_result_t *d = &res->devices[k];
    all &= d->has_statistics;
    res->leaked_bytes += d->leaked_bytes, res->leaked_count += d->leaked_count;
    res->stat_allocations += d->stat_allocations, res->stat_deallocations += d->stat_deallocations;
  }
  res->has_statistics = all;
  if (all && (res->stat_allocations != res->c.allocs || res->stat_deallocations != res->c.frees))
    result_error(res,
                 "statistics counted %llu allocations and %llu deallocations; the program made "
                 "%llu and %llu",
                 (unsigned long long)res->stat_allocations,
                 (unsigned long long)res->stat_deallocations, (unsigned long long)res->c.allocs,
                 (unsigned long long)res->c.frees);
}

/* Runs the threads and the final checks on a built stack. */
static void run_threads(run_t *run, result_t *res) {
  const options_t *o = run->o;
  int T = o->threads;
  pthread_t tids[MAX_THREADS];
  int started = 0;
  uint64_t per_thread = (o->ops + (uint64_t)T - 1) / (uint64_t)T;
  double t0 = now_s();
  for (; started < T; started++) {
    worker_t *w = &run->workers[started];
    w->target = per_thread;
    int err = pthread_create(&tids[started], NULL, worker_main, w);
    if (err != 0) {
      result_error(res, "pthread_create: %s", strerror(err));
      __atomic_store_n(&run->stop, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  report_progress(run, started, t0);
  for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
  /* What is left in the mailbox: freed by this thread on thread 0's
   * stream 0, after waiting for the giver's event (another device's block
   * as any taker frees it). */
  worker_t *d = &run->workers[T];
  for (int i = 0; i < run->nmail; i++) {
    if (run->mail[i].e.dev != d->dev) {
      cross_free(d, &run->mail[i]);
    } else if (adopt(d, &run->mail[i], 0)) {
      entry_t e = d->live[--d->nlive];
      check_and_free(d, &e, 0);
    } else {
      d->nlive = 0;
      sync_devices(d, "cudaDeviceSynchronize");
      check_and_free(d, &run->mail[i].e, run->mail[i].e.s);
    }
  }
  run->nmail = 0;
  if (run->cuda) sync_devices(d, "cudaDeviceSynchronize at the end");
  res->wall_s = now_s() - t0;

  for (int i = 0; i <= T; i++) {
    add_counts(&res->c, &run->workers[i].c);
    if (run->workers[i].error[0] != '\0')
      result_error(res, "thread %d: %s", i, run->workers[i].error);
  }
  res->corruptions = res->c.cpu_bad;
  for (int k = 0; run->cuda && k < run->ndev; k++) {
    unsigned long long h[MAX_THREADS + 1];
    cudaError_t err = cudaMemcpy(h, run->d_errors[k], (size_t)(T + 1) * sizeof h[0],
                                 cudaMemcpyDeviceToHost);
    if (err != cudaSuccess)
      result_error(res, "reading the corruption counters: %s", cudaGetErrorName(err));
    else
      for (int i = 0; i <= T; i++) res->corruptions += h[i];
  }
  if (res->corruptions != 0)
    result_error(res, "%llu corrupted units (%llu injected)",
                 (unsigned long long)res->corruptions, (unsigned long long)res->c.injected);
  if (res->c.misaligned != 0)
    result_error(res, "%llu pointers not aligned as promised",
                 (unsigned long long)res->c.misaligned);
  if (res->c.allocs != res->c.frees)
    result_error(res, "the program freed %llu of %llu blocks", (unsigned long long)res->c.frees,
                 (unsigned long long)res->c.allocs);
  check_leaks(run, res);
}

/* Builds the run's stacks into rs: one on the current device, or with
 * --devices one per listed device, from what `config` says for it. False
 * (the reason in res) when one cannot be built or they differ in memory
 * kind; the caller releases what rs holds. */
static bool build_stacks(const options_t *o, const char *config, rmmc_resource_t **rs, int *devs,
                         result_t *res) {
  res->ndev = o->ndevices > 0 ? o->ndevices : 1;
  for (int k = 0; k < res->ndev; k++) {
    device_result_t *d = &res->devices[k];
    int dev = o->ndevices > 0 ? o->devices[k] : -1, pick = dev;
    if (pick < 0 && rmmc_get_current_device(&pick) != RMMC_SUCCESS) pick = 0;
    rmmc_status_t st = rmmc_default_config_device_spec(config, pick, d->spec, sizeof d->spec);
    if (st == RMMC_SUCCESS) st = rmmc_stack_create(d->spec, dev, &rs[k]);
    if (st != RMMC_SUCCESS) {
      result_error(res, "building the stack%s: %s: %s", dev >= 0 ? " of a device" : "",
                   rmmc_status_name(st), rmmc_last_error_message());
      return false;
    }
    int own = rmmc_resource_device(rs[k]);
    devs[k] = d->device = dev >= 0 ? dev : own >= 0 ? own : 0;
    if (rmmc_resource_memory_kind(rs[k]) != rmmc_resource_memory_kind(rs[0])) {
      result_error(res, "device %d's stack hands out %s memory, device %d's %s: one kind per run",
                   devs[k], rmmc_memory_kind_name(rmmc_resource_memory_kind(rs[k])), devs[0],
                   rmmc_memory_kind_name(rmmc_resource_memory_kind(rs[0])));
      return false;
    }
  }
  return true;
}

/* --devices: each stack becomes its device's in the registry for the run,
 * so rmmc_deallocate finds it (prev keeps what was there). Blocks that
 * cross devices go back through rmmc_deallocate when every stack can tell
 * which of its blocks holds a pointer (asked of a probe block) and the
 * freeing thread's current device has a stack (without CUDA the current
 * device is 0); otherwise straight to their stack. */
static bool install(run_t *run, rmmc_resource_t **prev, result_t *res) {
  bool tells = true, has_current = run->cuda;
  for (int k = 0; k < run->ndev; k++) {
    rmmc_status_t st = rmmc_set_device_resource(run->devs[k], run->rs[k], &prev[k]);
    if (st != RMMC_SUCCESS) {
      result_error(res, "setting device %d's stack in the registry: %s", run->devs[k],
                   rmmc_last_error_message());
      while (k-- > 0) (void)rmmc_set_device_resource(run->devs[k], prev[k], &prev[k]);
      return false;
    }
    void *p = NULL;
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    tells &= rmmc_resource_allocate(run->rs[k], 4096, RMMC_DEFAULT_ALIGNMENT, NULL, &p) ==
                 RMMC_SUCCESS &&
             rmmc_resource_get_allocation(run->rs[k], p, &a) == RMMC_SUCCESS;
    if (p != NULL) {
      counts_t *c = &run->workers[run->o->threads].c; /* the drain's: counted as the program's */
      c->ops += 2, c->allocs++, c->bytes += 4096;
      if (rmmc_resource_deallocate(run->rs[k], p, 4096, RMMC_DEFAULT_ALIGNMENT, NULL) == 0) c->frees++;
    }
    has_current |= run->devs[k] == 0;
  }
  run->via_registry = tells && has_current;
  return true;
}

/* Puts back what the registry held before install; releases it. */
static void uninstall(run_t *run, rmmc_resource_t **prev) {
  for (int k = 0; k < run->ndev; k++) {
    (void)rmmc_set_device_resource(run->devs[k], prev[k], NULL);
    rmmc_resource_release(prev[k]);
  }
}

static void run_stack(const options_t *o, int index, const char *spec, bool gpu, result_t *res) {
  memset(res, 0, sizeof *res);
  res->spec = spec;
  rmmc_resource_t *rs[MAX_DEVICES] = {NULL}, *prev[MAX_DEVICES] = {NULL};
  int devs[MAX_DEVICES] = {0};
  bool installed = false;
  if (!build_stacks(o, spec, rs, devs, res)) goto release_stacks;
  rmmc_memory_kind_t kind = rmmc_resource_memory_kind(rs[0]);
  bool kernels = kind != RMMC_MEMORY_HOST;
  res->verify = kernels ? "kernel" : "cpu";
  if (kernels && !gpu) {
    result_error(res, "the stack hands out %s memory, which host mode cannot fill: run in GPU mode",
                 rmmc_memory_kind_name(kind));
    goto release_stacks;
  }
  int T = o->threads, S = o->streams;
  run_t *run = calloc(1, sizeof *run);
  cudaStream_t *streams = calloc((size_t)(T * S), sizeof *streams);
  cudaEvent_t *events = calloc((size_t)(T * S), sizeof *events);
  char *keys = calloc((size_t)(T * S), 1);
  worker_t *workers = calloc((size_t)T + 1, sizeof *workers);
  entry_t *live = calloc((size_t)(T + 1) * (size_t)o->live, sizeof *live);
  if (!run || !streams || !events || !keys || !workers || !live) {
    result_error(res, "out of host memory for the run");
    goto free_arrays;
  }
  *run = (run_t){.o = o, .ndev = res->ndev, .cuda = gpu, .kernels = kernels, .streams = streams,
                 .events = events, .keys = keys, .workers = workers, .index = index,
                 .count = o->nspecs};
  memcpy(run->rs, rs, sizeof rs);
  memcpy(run->devs, devs, sizeof devs);
  pthread_mutex_init(&run->mail_lock, NULL);
  if (o->ndevices > 0 && !(installed = install(run, prev, res))) goto teardown;
  if (gpu) {
    if (!setup_cuda(run, res)) goto teardown;
  } else {
    for (int i = 0; i < T * S; i++) streams[i] = (cudaStream_t)(void *)&keys[i];
  }
  for (int i = 0; i <= T; i++) {
    worker_t *w = &workers[i];
    int home = i < T ? i : 0; /* the drain uses thread 0's streams */
    w->run = run;
    w->index = i;
    w->dev = home % run->ndev;
    w->r = run->rs[w->dev];
    w->rng = o->seed ^ ((uint64_t)(index + 1) << 40) ^ ((uint64_t)(i + 1) << 20);
    (void)next(w);
    w->streams = &streams[home * S];
    w->events = &events[home * S];
    w->d_errors = gpu ? &run->d_errors[w->dev][i] : NULL;
    w->live = &live[(size_t)i * (size_t)o->live];
  }
  res->ran = true;
  if (run->ndev > 1) res->cross_path = run->via_registry ? "rmmc_deallocate" : "owner stack";
  run_threads(run, res);
teardown:
  /* The stacks go before the streams: their per-stream state must not
   * outlive them. */
  if (installed) uninstall(run, prev);
  for (int k = 0; k < res->ndev; k++) {
    rmmc_resource_release(rs[k]);
    rs[k] = NULL;
  }
  if (gpu) teardown_cuda(run);
  pthread_mutex_destroy(&run->mail_lock);
free_arrays:
  free(live);
  free(workers);
  free(keys);
  free(events);
  free(streams);
  free(run);
release_stacks:
  for (int k = 0; k < MAX_DEVICES; k++) rmmc_resource_release(rs[k]);
  res->passed = res->ran && res->error[0] == '\0';
}

/* ---- output ---- */

typedef struct run_info {
  const char *mode;
  char device[300];
  bool passed;
} run_info_t;

static bool write_json(const char *path, const options_t *o, const run_info_t *info,
                       const result_t *res, int n) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return false;
  fprintf(f, "{\n \"schema_version\": %d,\n \"program\": \"rmmc-stress\",\n \"mode\": \"%s\",\n"
          " \"device\": ", CLI_JSON_SCHEMA_VERSION, info->mode);
  cli_json_string(f, info->device);
  fprintf(f,
          ",\n \"threads\": %d,\n \"streams_per_thread\": %d,\n \"ops_per_stack\": %llu,\n"
          " \"live_per_thread\": %d,\n \"max_bytes\": %zu,\n \"large_bytes\": %zu,\n"
          " \"large_every\": %d,\n \"seed\": %llu,\n \"cpu_fill\": \"%s\",\n"
          " \"inject_corruption\": %s,\n \"passed\": %s,\n \"devices\": ",
          o->threads, o->streams, (unsigned long long)o->ops, o->live, o->max_bytes,
          o->large_bytes, LARGE_EVERY, (unsigned long long)o->seed,
          o->sparse ? "sparse" : "full", o->inject ? "true" : "false",
          info->passed ? "true" : "false");
  if (o->ndevices == 0) fputs("null", f);
  for (int k = 0; k < o->ndevices; k++) fprintf(f, "%s%d", k ? ", " : "[", o->devices[k]);
  fprintf(f, "%s,\n \"stacks\": [", o->ndevices ? "]" : "");
  for (int i = 0; i < n; i++) {
    const result_t *r = &res[i];
    const counts_t *c = &r->c;
    fprintf(f, "%s\n  {\"stack\": ", i ? "," : "");
    cli_json_string(f, r->spec);
    fprintf(f, ", \"passed\": %s, \"ran\": %s, \"verify\": \"%s\",\n", r->passed ? "true" : "false",
            r->ran ? "true" : "false", r->verify ? r->verify : "none");
    fprintf(f,
            "   \"ops\": %llu, \"allocations\": %llu, \"deallocations\": %llu, "
            "\"bytes_allocated\": %llu, \"zero_byte_requests\": %llu, \"aligned\": %llu,\n"
            "   \"moved_streams\": %llu, \"handed_to_threads\": %llu, \"oom\": %llu, "
            "\"alignment_refused\": %llu, \"misaligned\": %llu,\n"
            "   \"corruptions\": %llu, \"injected\": %llu, \"unexpected\": %llu,\n",
            (unsigned long long)c->ops, (unsigned long long)c->allocs,
            (unsigned long long)c->frees, (unsigned long long)c->bytes,
            (unsigned long long)c->zero, (unsigned long long)c->aligned,
            (unsigned long long)c->moves, (unsigned long long)c->handoffs,
            (unsigned long long)c->oom, (unsigned long long)c->align_refused,
            (unsigned long long)c->misaligned, (unsigned long long)r->corruptions,
            (unsigned long long)c->injected, (unsigned long long)c->unexpected);
    if (r->has_statistics)
      fprintf(f,
              "   \"leaked_bytes\": %lld, \"leaked_count\": %lld, \"statistics_allocations\": %llu, "
              "\"statistics_deallocations\": %llu,\n",
              (long long)r->leaked_bytes, (long long)r->leaked_count,
              (unsigned long long)r->stat_allocations, (unsigned long long)r->stat_deallocations);
    else
      fprintf(f, "   \"leaked_bytes\": null, \"leaked_count\": null,\n");
    if (o->ndevices > 0) {
      fprintf(f, "   \"cross_device_frees\": %llu, \"cross_device_path\": ",
              (unsigned long long)c->cross);
      if (r->cross_path != NULL) cli_json_string(f, r->cross_path);
      else fputs("null", f);
      fprintf(f, ",\n   \"per_device\": [");
      for (int k = 0; k < r->ndev; k++) {
        const device_result_t *d = &r->devices[k];
        fprintf(f, "%s{\"device\": %d, \"spec\": ", k ? ", " : "", d->device);
        cli_json_string(f, d->spec);
        if (d->has_statistics)
          fprintf(f,
                  ", \"statistics_allocations\": %llu, \"statistics_deallocations\": %llu, "
                  "\"leaked_bytes\": %lld",
                  (unsigned long long)d->stat_allocations,
                  (unsigned long long)d->stat_deallocations, (long long)d->leaked_bytes);
        fputc('}', f);
      }
      fprintf(f, "],\n");
    }
    fprintf(f, "   \"layers\": [");
    for (int k = 0; k < r->nlayers; k++) {
      const layer_t *l = &r->layers[k];
      fprintf(f, "%s{\"name\": ", k ? ", " : "");
      cli_json_string(f, l->name);
      fprintf(f, ", \"device\": %d", l->device);
      if (l->has_in_use) fprintf(f, ", \"in_use\": %llu", (unsigned long long)l->in_use);
      if (l->has_outstanding)
        fprintf(f, ", \"outstanding\": %llu", (unsigned long long)l->outstanding);
      if (l->has_cached)
        fprintf(f, ", \"reserved_before_release\": %llu", (unsigned long long)l->cached);
      if (l->has_reserved) fprintf(f, ", \"reserved\": %llu", (unsigned long long)l->reserved);
      fputc('}', f);
    }
    fprintf(f, "],\n   \"wall_s\": %.3f, \"ops_per_s\": %.0f, \"error\": ", r->wall_s,
            r->wall_s > 0 ? (double)c->ops / r->wall_s : 0.0);
    if (r->error[0] != '\0') cli_json_string(f, r->error);
    else fputs("null", f);
    fputc('}', f);
  }
  fputs("\n ]\n}\n", f);
  bool ok = !ferror(f);
  return (fclose(f) == 0) && ok;
}

static void print_row(int width, const result_t *r) {
  const counts_t *c = &r->c;
  char leak[48];
  if (!r->ran) snprintf(leak, sizeof leak, "-");
  else if (r->has_statistics)
    snprintf(leak, sizeof leak, "%lldB/%lld", (long long)r->leaked_bytes, (long long)r->leaked_count);
  else snprintf(leak, sizeof leak, "n/a");
  printf("%-*s %9llu %8llu %8.1f %7llu %6llu %5llu %7llu %10s %7.2f %8.0f  %s\n", width, r->spec,
         (unsigned long long)c->ops, (unsigned long long)c->allocs,
         (double)c->bytes / (double)((size_t)1 << 30), (unsigned long long)c->moves,
         (unsigned long long)c->handoffs, (unsigned long long)c->oom,
         (unsigned long long)r->corruptions, leak, r->wall_s,
         r->wall_s > 0 ? (double)c->ops / r->wall_s / 1e3 : 0.0, r->passed ? "ok" : "FAILED");
}

/* ---- command line ---- */

enum {
  OPT_STACK = 256, OPT_THREADS, OPT_STREAMS, OPT_OPS, OPT_LIVE, OPT_MAX_BYTES, OPT_LARGE_BYTES,
  OPT_SEED, OPT_FILL, OPT_HOST, OPT_GPU, OPT_INJECT, OPT_JSON, OPT_QUIET, OPT_VERSION, OPT_PROGRESS,
  OPT_DEVICES,
};

static const struct option long_options[] = {
    {"stack", required_argument, NULL, OPT_STACK},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"streams", required_argument, NULL, OPT_STREAMS},
    {"ops", required_argument, NULL, OPT_OPS},
    {"live", required_argument, NULL, OPT_LIVE},
    {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
    {"large-bytes", required_argument, NULL, OPT_LARGE_BYTES},
    {"seed", required_argument, NULL, OPT_SEED},
    {"fill", required_argument, NULL, OPT_FILL},
    {"host", no_argument, NULL, OPT_HOST},
    {"gpu", no_argument, NULL, OPT_GPU},
    {"inject-corruption", no_argument, NULL, OPT_INJECT},
    {"json", required_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"progress", required_argument, NULL, OPT_PROGRESS},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* --devices: distinct device ids in [0, 64), comma-separated. */
static int parse_devices(const char *text, options_t *o) {
  o->ndevices = 0;
  for (const char *p = text;;) {
    char *end;
    errno = 0;
    long d = strtol(p, &end, 10);
    if (end == p || errno != 0 || d < 0 || d >= 64 || (*end != ',' && *end != '\0'))
      return cli_usage_error("--devices wants device ids from 0 to 63 separated by commas, not "
                             "'%s'",
                             text);
    for (int k = 0; k < o->ndevices; k++)
      if (o->devices[k] == d) return cli_usage_error("--devices names device %ld twice", d);
    if (o->ndevices == MAX_DEVICES)
      return cli_usage_error("--devices names more than %d devices", MAX_DEVICES);
    o->devices[o->ndevices++] = (int)d;
    if (*end == '\0') return -1;
    p = end + 1;
  }
}

/* A --stack text: one spec, or per-device items ("pool > cuda; 1: ...", as
 * RMMC_ALLOC_CONF takes them). */
static bool stack_text_ok(const char *text) {
  bool items = strchr(text, ';') != NULL || isdigit((unsigned char)text[0]) || text[0] == '*';
  char spec[1024];
  return items ? rmmc_default_config_device_spec(text, 0, spec, sizeof spec) == RMMC_SUCCESS
               : rmmc_stack_validate(text) == RMMC_SUCCESS;
}

/* Parses argv into o; returns -1 to go on, or an exit status. */
static int parse_options(int argc, char **argv, options_t *o) {
  unsigned long long v;
  *o = (options_t){.threads = 16, .streams = 4, .live = 64, .ops = 1000000,
                   .max_bytes = (size_t)4 << 20, .large_bytes = (size_t)64 << 20, .seed = 1,
                   .mode = MODE_AUTO, .sparse = true, .progress_s = 2.0};
  opterr = 0;
  int c, rc;
  while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
    switch (c) {
    case OPT_STACK:
      if (o->nspecs == MAX_STACKS) return cli_usage_error("at most %d --stack options", MAX_STACKS);
      if (!stack_text_ok(optarg)) return cli_usage_error("--stack: %s", rmmc_last_error_message());
      o->specs[o->nspecs++] = optarg;
      break;
    case OPT_THREADS:
      if (!cli_parse_count("--threads", optarg, 1, MAX_THREADS, &v)) return EXIT_USAGE;
      o->threads = (int)v;
      break;
    case OPT_STREAMS:
      if (!cli_parse_count("--streams", optarg, 1, MAX_STREAMS, &v)) return EXIT_USAGE;
      o->streams = (int)v;
      break;
    case OPT_OPS:
      if (!cli_parse_count("--ops", optarg, 1, 10000000000ull, &v)) return EXIT_USAGE;
      o->ops = v;
      break;
    case OPT_LIVE:
      if (!cli_parse_count("--live", optarg, 1, MAX_LIVE, &v)) return EXIT_USAGE;
      o->live = (int)v;
      break;
    case OPT_MAX_BYTES:
      if (!cli_parse_bytes("--max-bytes", optarg, true, &o->max_bytes)) return EXIT_USAGE;
      if (o->max_bytes == 0) return cli_usage_error("--max-bytes: 0 bytes allocates nothing");
      break;
    case OPT_LARGE_BYTES:
      if (!cli_parse_bytes("--large-bytes", optarg, true, &o->large_bytes)) return EXIT_USAGE;
      break;
    case OPT_SEED:
      if (!cli_parse_count("--seed", optarg, 0, UINT64_MAX, &v)) return EXIT_USAGE;
      o->seed = v;
      break;
    case OPT_FILL:
      if (strcmp(optarg, "full") == 0) o->sparse = false;
      else if (strcmp(optarg, "sparse") == 0) o->sparse = true;
      else return cli_usage_error("--fill wants full or sparse, not '%s'", optarg);
      break;
    case OPT_HOST:
    case OPT_GPU: {
      run_mode_t m = c == OPT_HOST ? MODE_HOST : MODE_GPU;
      if (o->mode != MODE_AUTO && o->mode != m) return cli_usage_error("--host and --gpu exclude each other");
      o->mode = m;
      break;
    }
    case OPT_DEVICES:
      if ((rc = parse_devices(optarg, o)) >= 0) return rc;
      break;
    case OPT_INJECT: o->inject = true; break;
    case OPT_JSON: o->json_path = optarg; break;
    case OPT_QUIET: o->quiet = true; break;
    case OPT_PROGRESS: {
      char *end;
      errno = 0;
      o->progress_s = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || errno != 0 || !(o->progress_s >= 0.01 && o->progress_s <= 3600))
        return cli_usage_error("--progress wants seconds from 0.01 to 3600, not '%s'", optarg);
      break;
    }
    case 'h': fputs(usage_text, stdout); return EXIT_OK;
    case OPT_VERSION: return cli_print_version();
    default: return cli_bad_option(c, argv);
    }
  }
  if (optind < argc) return cli_usage_error("unexpected argument '%s' (stacks go after --stack)", argv[optind]);
  if (o->large_bytes != 0 && o->large_bytes <= o->max_bytes)
    return cli_usage_error("--large-bytes must be 0 or above --max-bytes");
  if (o->ndevices > o->threads)
    return cli_usage_error("--devices names %d devices for %d threads: a device per thread needs "
                           "at least as many threads",
                           o->ndevices, o->threads);
  return -1;
}

/* "device 0: NAME" for the current device, or each --devices device. */
static void describe_devices(const options_t *o, int current, char *buf, size_t len) {
  int n = o->ndevices > 0 ? o->ndevices : 1;
  size_t at = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && at < len; k++) {
    int dev = o->ndevices > 0 ? o->devices[k] : current;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      at += (size_t)snprintf(buf + at, len - at, "%sdevice %d: %s", k ? ", " : "", dev, prop.name);
    else
      at += (size_t)snprintf(buf + at, len - at, "%sdevice %d", k ? ", " : "", dev);
  }
}

int main(int argc, char **argv) {
  cli_program = "rmmc-stress";
  options_t o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;

  run_info_t info = {.mode = "host", .device = "host (CPU fill and check)"};
  bool gpu = false;
  if (o.mode != MODE_HOST) {
    bool kernels = RMMC_STRESS_HAVE_KERNELS != 0;
    int devices = rmmc_device_count();
    if (devices > 0 && kernels) {
      gpu = true;
      info.mode = "gpu";
      int dev = 0;
      (void)cudaGetDevice(&dev);
      describe_devices(&o, dev, info.device, sizeof info.device);
    } else {
      const char *why = devices == 0 ? "no CUDA device" : "built without the CUDA kernels (no nvcc)";
      if (o.mode == MODE_GPU) {
        fprintf(stderr, "rmmc-stress: --gpu: %s\n", why);
        return EXIT_NO_GPU;
      }
      printf("# %s: host mode (CPU fill and check over host memory)\n", why);
    }
  }
  /* The registry knows a machine's real devices, in host mode too: without
   * a GPU any device id names a host stack, with one only the real ones. */
  int ndev = rmmc_device_count();
  for (int k = 0; ndev > 0 && k < o.ndevices; k++)
    if (o.devices[k] >= ndev) {
      fprintf(stderr, "rmmc-stress: --devices names device %d; this machine has %d\n",
              o.devices[k], ndev);
      return EXIT_NO_GPU;
    }
  const char *const *defaults = gpu ? gpu_default_stacks : host_default_stacks;
  if (o.nspecs == 0)
    for (const char *const *s = defaults; *s != NULL; s++) o.specs[o.nspecs++] = *s;

  int width = 5;
  for (int i = 0; i < o.nspecs; i++) {
    int n = (int)strlen(o.specs[i]);
    if (n > width) width = n;
  }
  if (width > 80) width = 80;
  char max[32], large[64] = "";
  cli_format_size(o.max_bytes, max, sizeof max);
  if (o.large_bytes != 0) {
    char top[32];
    cli_format_size(o.large_bytes, top, sizeof top);
    snprintf(large, sizeof large, ", 1 in %d up to %s", LARGE_EVERY, top);
  }
  char per[64] = "";
  if (o.ndevices > 0) snprintf(per, sizeof per, " (thread i on device i mod %d)", o.ndevices);
  printf("# rmmc-stress: %s mode, %s; %d threads%s x %d streams, %llu ops per stack, sizes "
         "1B-%s log-uniform%s, %d live per thread, seed %llu, CPU fill %s%s\n",
         info.mode, info.device, o.threads, per, o.streams, (unsigned long long)o.ops, max, large,
         o.live, (unsigned long long)o.seed, o.sparse ? "sparse" : "full",
         o.inject ? ", INJECTING CORRUPTION" : "");
  printf("%-*s %9s %8s %8s %7s %6s %5s %7s %10s %7s %8s  %s\n", width, "stack", "ops", "allocs",
         "GiB", "moved", "handed", "oom", "corrupt", "leaked", "wall s", "kops/s", "result");
  fflush(stdout);

  result_t *res = calloc((size_t)o.nspecs, sizeof *res);
  if (res == NULL) {
    fprintf(stderr, "rmmc-stress: out of memory\n");
    return EXIT_FAILED;
  }
  info.passed = true;
  for (int i = 0; i < o.nspecs; i++) {
    if (!o.quiet) fprintf(stderr, "rmmc-stress: [%d/%d] %s\n", i + 1, o.nspecs, o.specs[i]);
    run_stack(&o, i, o.specs[i], gpu, &res[i]);
    print_row(width, &res[i]);
    fflush(stdout);
    info.passed &= res[i].passed;
  }
  uint64_t ops = 0, corruptions = 0;
  double wall = 0;
  for (int i = 0; i < o.nspecs; i++) {
    ops += res[i].c.ops, corruptions += res[i].corruptions, wall += res[i].wall_s;
    if (!res[i].passed) printf("# FAILED %s: %s\n", res[i].spec, res[i].error);
    if (res[i].c.align_refused != 0)
      printf("# %s: refused alignments above 256 B (NOT_SUPPORTED, as documented); later "
             "requests used 256\n", res[i].spec);
  }
  printf("# total: %llu ops, %llu corruptions, %.2f s; %s\n", (unsigned long long)ops,
         (unsigned long long)corruptions, wall, info.passed ? "PASSED" : "FAILED");
  rc = info.passed ? EXIT_OK : EXIT_FAILED;
  if (o.json_path != NULL && !write_json(o.json_path, &o, &info, res, o.nspecs)) {
    fprintf(stderr, "rmmc-stress: cannot write %s: %s\n", o.json_path, strerror(errno));
    rc = EXIT_IO;
  }
  free(res);
  return rc;
}
