/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_api: a stateful fuzzer of the whole public C API (tests/fuzz/README.md).
 *
 * A run builds one stack shape (the table `shapes` below: the conformance
 * battery's pool, chunk pool, arena, binning, fixed_size, limiting,
 * statistics and tracking layers, over host memory and over sim) and drives
 * it with a random sequence of operations drawn from a seed: allocate and
 * deallocate (1 B to 64 MiB, alignments from 1 B to 2 MiB) on up to
 * thousands of stream keys, frees on another stream than the allocating
 * one, blocks handed from one thread to another, graph pools (begin, end,
 * release, routed by stream), pause and resume (backup and discard),
 * release_cached, describe, get_allocation, wrong frees, bad arguments,
 * memory hook swaps, the registry (set, retain) under the PyTorch, CuPy and
 * rmmc_allocate entry points, and upstream refusals injected below the
 * stack (tests/support/faulty.h: allocate, deallocate, release, vm_reserve,
 * vm_map, vm_unmap).
 *
 * The model. Every live block is kept (address, size, alignment, stream,
 * route, graph pool, owning thread) in an address-sorted index: a block
 * handed out that overlaps a live one, or is misaligned, fails at once, as
 * does a block handed out while the pool is paused (whatever layer served
 * it), or a block that lies in memory a live graph pool got back (such
 * memory serves only that graph). On readable stacks (host memory) every
 * block holds a tagged pattern (tests/support/pattern.h) at both ends and
 * every 64 KiB between, checked before each free, after every backup
 * resume and after every failed pause (a failure loses nothing); discard
 * resumes write new patterns. After every step the checks run: every pool
 * layer passes rmmc_pool_resource_check; each layer's figures equal the
 * model's (statistics and tracking exactly, limiting rounded to the
 * alignment, the first caching layer's in_use: the pool's sizes rounded to
 * 256, fixed_size's blocks, binning's bins); the pool's describe agrees
 * with rmmc_pool_resource_figures; the base holds what the pool reserves;
 * the installed memory hooks hold exactly the ranges the pool reserves,
 * each release matching an acquire; the sleep state is the model's; the
 * plug-ins' figures count the model's plug-in blocks; the checked virtual
 * memory (tests/support/vmspy.h) saw no bad call. Statuses are held to the
 * headers: each call may return only what its contract allows in the
 * model's state (an injected status only while injections are armed). At
 * the end everything is freed, the stack released, and the base must hold
 * nothing (spy, vmspy, limiting, sim counts back to zero), the hooks
 * nothing, the registry no reference.
 *
 * Threads. --threads T runs T worker threads in lockstep: the seed picks
 * which thread does each step (one at a time, the checks between steps),
 * so a seed replays exactly, the pool's per-thread heaps included (within
 * the address layout the kernel gives: run under `setarch -R` if a failure
 * depends on it). --real runs them at once (races; a stop-the-world lock
 * serializes pause, resume and the other global operations, and the checks
 * run under it); a failure there prints the seed and each thread's last
 * operations, but the interleaving is not replayable.
 *
 * Failure: the message, the stack, the seed, the step, the last operations
 * and the command that reproduces it, then abort() (a crash prints the same
 * line first). Exit 0 when every run passed.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "faulty.h"
#include "pattern.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "vmspy.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define MAX_THREADS 16
#define NGRAPHS 3
#define GRAPH_KEY 100000u /* graph g routes stream key GRAPH_KEY + g */
#define GRAPH_RANGES 4096 /* freed ranges remembered per graph pool */
#define LOG_LINES 48

/* ---- the stack shapes ---- */

enum base_kind {
  B_VMSPY, /* vmspy(page=4KiB) > faulty > spy: checked virtual memory on host pages */
  B_HOST,  /* faulty_vm > limiting(limit=1GiB) > host: the host resource's virtual memory */
  B_SIM,   /* faulty_vm > sim(capacity=16GiB): no memory behind the addresses */
  B_SPY,   /* faulty > spy: host memory without virtual memory (pools take chunks) */
};
static const char *const base_names[] = {"vmspy > faulty > spy", "faulty > limiting > host",
                                         "faulty > sim", "faulty > spy"};

typedef struct shape {
  const char *spec; /* the layers over the base, outermost first */
  int base;
} shape_t;

static const shape_t shapes[] = {
    {"pool(page=64KiB, stream_heaps=4, small_max=64KiB, small_chunk=256KiB)", B_VMSPY},
    {"pool(expandable=false, initial=0, min_growth=1MiB, granularity=256KiB, stream_heaps=2)",
     B_VMSPY},
    {"arena(superblock=1MiB, chunk=4MiB)", B_VMSPY},
    {"binning(min=256B, max=64KiB, chunk=256KiB) > pool(page=256KiB, stream_heaps=2)", B_VMSPY},
    {"fixed_size(block=4KiB, blocks_per_chunk=16) > pool(stream_heaps=2, page=64KiB)", B_VMSPY},
    {"limiting(limit=192MiB) > pool(page=1MiB, stream_heaps=3, cache=0)", B_VMSPY},
    {"statistics > pool(release_slack=0, small_max=16KiB, small_chunk=64KiB, stream_heaps=8)",
     B_VMSPY},
    {"tracking > pool(page=64KiB, stream_heaps=2, event_interval=8)", B_VMSPY},
    {"tracking > binning(min=256B, max=16KiB, chunk=64KiB) > pool(expandable=false, "
     "min_growth=256KiB, granularity=64KiB, stream_heaps=2)",
     B_VMSPY},
    {"statistics > fixed_size(block=64KiB, blocks_per_chunk=4) > arena(superblock=1MiB)", B_VMSPY},
    {"binning(min=512B, max=256KiB, chunk=1MiB) > arena(superblock=4MiB, keep=0)", B_VMSPY},
    {"statistics > limiting(limit=160MiB) > tracking > binning(max=1MiB, chunk=2MiB) > "
     "pool(stream_heaps=4, small_max=128KiB, small_chunk=512KiB, page=128KiB)",
     B_VMSPY},
    {"failure_callback(retries=2) > thread_safe > pool(page=64KiB, stream_heaps=2)", B_VMSPY},
    {"pool(stream_heaps=2)", B_HOST},
    {"pool(expandable=false, min_growth=2MiB, stream_heaps=4)", B_HOST},
    {"statistics > arena(superblock=2MiB)", B_HOST},
    {"binning(chunk=512KiB) > pool(stream_heaps=2, page=2MiB)", B_HOST},
    {"fixed_size(block=8KiB, blocks_per_chunk=32) > pool(stream_heaps=4)", B_HOST},
    {"tracking > pool(expandable=false, stream_heaps=2, split_limit=1)", B_HOST},
    {"pool(stream_heaps=4, small_max=256KiB, small_chunk=1MiB)", B_SIM},
    {"pool(expandable=false, min_growth=4MiB, stream_heaps=2)", B_SIM},
    {"arena(superblock=1MiB)", B_SIM},
    {"limiting(limit=2GiB) > binning > pool(stream_heaps=2)", B_SIM},
    {"statistics > fixed_size(block=1MiB, blocks_per_chunk=8) > pool(stream_heaps=4)", B_SIM},
    {"tracking > arena(superblock=4MiB, keep=2)", B_SIM},
    {"statistics > binning(max=64KiB, chunk=256KiB)", B_SPY},
    {"tracking > fixed_size(block=4KiB, blocks_per_chunk=16)", B_SPY},
    {"pool(stream_heaps=2, min_growth=1MiB)", B_SPY},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* ---- random numbers: splitmix64 ---- */

typedef struct rng {
  uint64_t s;
} rng_t;

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint64_t rnext(rng_t *r) { return mix64(r->s += 0x9E3779B97F4A7C15ull); }
static uint64_t rbelow(rng_t *r, uint64_t n) { return n == 0 ? 0 : rnext(r) % n; }
static bool rchance(rng_t *r, unsigned percent) { return rbelow(r, 100) < percent; }

/* ---- the model ---- */

enum route { R_DIRECT, R_TORCH, R_CUPY, R_RMMC };
static const char *const route_names[] = {"direct", "torch", "cupy", "rmmc_allocate"};
enum registry_state { REG_NONE, REG_STACK, REG_OTHER };

typedef struct block {
  uint8_t *p;
  size_t n, align;
  unsigned key;  /* stream key of the allocation */
  uint64_t tag;  /* pattern tag (0: no pattern in it) */
  int route;     /* enum route */
  int graph;     /* graph pool index + 1, 0 for none (or after its release) */
  bool routed;   /* allocated for a graph pool (stays after the release) */
  int owner;     /* the thread that frees it */
  size_t opos;   /* its place in the owner's list */
  bool live;
} block_t;

typedef struct range {
  uintptr_t a;
  size_t n;
} range_t;

typedef struct graph {
  bool exists, routed;
  range_t *freed; /* its blocks freed since it began: they serve no one else */
  size_t nfreed;
} graph_t;

typedef struct hookrec {
  pthread_mutex_t lock;
  range_t *r; /* the ranges acquired and not released, unsorted */
  size_t n, cap, bytes;
  uint64_t acquires, releases, errors;
  char error[200];
} hookrec_t;

typedef struct idlist {
  int *v;
  size_t n, cap;
} idlist_t;

typedef struct worker {
  int id;
  rng_t rng;
  pthread_t th;
  sem_t go;
  bool quit;
} worker_t;

typedef struct run {
  /* settings */
  const char *argv0;
  uint64_t seed;
  int shape_index;
  const shape_t *shape;
  int nthreads;
  bool real, trace;
  uint64_t steps;
  unsigned check_every, full_every; /* the checks every N steps; the full ones every M */
  bool last_global;                  /* lockstep: the step was a global operation */
  unsigned nkeys;
  size_t max_live;
  unsigned without; /* operations left out (bit per enum op) */
  char without_text[200];
  double deadline; /* stop time, 0: none */
  /* the stack */
  rmmc_resource_t *top, *pool, *first_cache, *hooked;
  rmmc_resource_t *spy, *vmspy, *flt, *limiting, *sim, *other;
  faulty_t *faulty;
  bool readable, vm_pool, strict, pool_on_base, figures_exact;
  size_t budget;
  size_t small_bias; /* most requests fit this (a fixed_size on top), or 0 */
  /* the model (lock) */
  pthread_mutex_t lock;
  pthread_rwlock_t world; /* --real: shared for a thread's own operations, exclusive for global ones */
  block_t *blk;
  size_t nblk, capblk;
  idlist_t freeslots;
  idlist_t owned[MAX_THREADS];
  int *byaddr;
  size_t naddr, capaddr;
  size_t live_bytes, nlive, plugin_blocks, plugin_bytes;
  bool paused;
  int pause_mode;
  int registry;
  int hooks_cur; /* -1: none, else index into hooks */
  bool faults_armed, cuda_armed, faults_ever, pause_failed_paused;
  graph_t graphs[NGRAPHS];
  worker_t workers[MAX_THREADS];
  sem_t done;
  uint64_t step;      /* steps taken (atomic in --real) */
  int cur_thread;     /* the thread taking the step (lockstep) */
  uint64_t ops[32];   /* operations done, by kind */
  /* the last operations, for a failure's report */
  char log[LOG_LINES][200];
  unsigned logpos;
} run_t;

static run_t g;
static hookrec_t hooks[2];
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static char repro[600];          /* the command line that reproduces this run (less --steps) */
static uint64_t g_step; /* for the crash handler (atomic) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  char line[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g.lock);
  unsigned i = g.logpos++ % LOG_LINES;
  snprintf(g.log[i], sizeof g.log[i], "%s", line);
  pthread_mutex_unlock(&g.lock);
  if (g.trace) fprintf(stderr, "  %s\n", line);
}

static void print_repro(FILE *f, uint64_t step) {
  fprintf(f, "fuzz_api: reproduce with: %s --steps %" PRIu64 "\n", repro, step + 1);
}

#define FAIL(...) fail_at(__LINE__, __VA_ARGS__)
static void fail_at(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail_at(int line, const char *fmt, ...) {
  pthread_mutex_lock(&fail_lock); /* one report; other threads stop here */
  char msg[1000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  uint64_t step = __atomic_load_n(&g.step, __ATOMIC_RELAXED);
  fflush(stdout);
  fprintf(stderr, "\nfuzz_api: FAILED (fuzz_api.c:%d): %s\n", line, msg);
  fprintf(stderr, "fuzz_api: last error message: %s\n", rmmc_last_error_message());
  fprintf(stderr, "fuzz_api: stack %d: %s > %s; seed %" PRIu64 ", step %" PRIu64 "%s\n",
          g.shape_index, g.shape->spec, base_names[g.shape->base], g.seed, step,
          g.real ? " (--real: the interleaving is not replayable)" : "");
  fprintf(stderr, "fuzz_api: the last operations, oldest first:\n");
  unsigned n = g.logpos < LOG_LINES ? g.logpos : LOG_LINES;
  for (unsigned i = g.logpos - n; i != g.logpos; i++)
    fprintf(stderr, "  %s\n", g.log[i % LOG_LINES]);
  print_repro(stderr, step);
  fflush(stderr);
  abort();
}

static void crash_handler(int sig, siginfo_t *info, void *uctx);
static struct sigaction old_segv, old_bus;

static void crash_handler(int sig, siginfo_t *info, void *uctx) {
  char buf[800];
  uint64_t s = __atomic_load_n(&g_step, __ATOMIC_RELAXED) + 1;
  char num[24];
  int k = 0;
  do num[k++] = (char)('0' + s % 10), s /= 10;
  while (s != 0);
  size_t len = 0;
  const char *head = "\nfuzz_api: CRASHED (signal); reproduce with: ";
  for (const char *c = head; *c; c++) buf[len++] = *c;
  for (const char *c = repro; *c && len < sizeof buf - 40; c++) buf[len++] = *c;
  for (const char *c = " --steps "; *c; c++) buf[len++] = *c;
  while (k > 0) buf[len++] = num[--k];
  buf[len++] = '\n';
  ssize_t w = write(2, buf, len);
  (void)w;
  struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
  if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction != NULL) {
    old->sa_sigaction(sig, info, uctx); /* the sanitizer's report */
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && old->sa_handler != NULL) {
    old->sa_handler(sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void install_crash_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = crash_handler;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
}

/* ---- small helpers ---- */

static cudaStream_t stream_of(unsigned key) {
  if (key == 0) return NULL;
  if (key == 1) return cudaStreamPerThread;
  return (cudaStream_t)((uintptr_t)key << 4);
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static uint64_t field_or(rmmc_resource_t *r, const char *key, uint64_t dflt) {
  uint64_t v = dflt;
  rmmc_resource_get_field(r, key, &v);
  return v;
}

static uint64_t need_field(rmmc_resource_t *r, const char *key) {
  uint64_t v = 0;
  if (!rmmc_resource_get_field(r, key, &v))
    FAIL("%s reports no '%s' figure", rmmc_resource_name(r), key);
  return v;
}

static bool is_pool(const rmmc_resource_t *r) {
  const char *n = rmmc_resource_name(r);
  return strcmp(n, "pool") == 0 || strcmp(n, "arena") == 0;
}

static bool is_name(const rmmc_resource_t *r, const char *name) {
  return strcmp(rmmc_resource_name(r), name) == 0;
}

/* A status as its name, for messages. */
static const char *sn(rmmc_status_t st) { return rmmc_status_name(st); }

/* ---- patterns (host stacks) ---- */

#define EDGE 128     /* bytes checked at each end */
#define STRIDE 65536 /* and one word every STRIDE bytes between */

static inline uint8_t pbyte(uint64_t tag, size_t k) {
  return pattern_byte_of(pattern_word(tag, k / 8), (unsigned)(k % 8));
}

/* Writes (check false) or checks the pattern of b; returns the first bad
 * offset, or SIZE_MAX. */
static size_t pattern_pass(const block_t *b, bool check) {
  uint8_t *p = b->p;
  size_t n = b->n;
  size_t head = n < EDGE ? n : EDGE;
  size_t tail_from = n > EDGE ? n - EDGE : 0;
  if (tail_from < head) tail_from = head;
  for (size_t k = 0; k < head; k++) {
    if (!check) p[k] = pbyte(b->tag, k);
    else if (p[k] != pbyte(b->tag, k)) return k;
  }
  for (size_t k = STRIDE; k + 8 <= tail_from; k += STRIDE)
    for (size_t j = k; j < k + 8; j++) {
      if (!check) p[j] = pbyte(b->tag, j);
      else if (p[j] != pbyte(b->tag, j)) return j;
    }
  for (size_t k = tail_from; k < n; k++) {
    if (!check) p[k] = pbyte(b->tag, k);
    else if (p[k] != pbyte(b->tag, k)) return k;
  }
  return SIZE_MAX;
}

static void verify_block(const block_t *b, const char *when) {
  if (b->tag == 0 || !g.readable) return;
  size_t bad = pattern_pass(b, true);
  if (bad != SIZE_MAX)
    FAIL("%s: the data of block %p (%zu B, stream key %u, %s%s) changed at byte %zu: 0x%02x, "
         "0x%02x written",
         when, (void *)b->p, b->n, b->key, route_names[b->route], b->graph ? ", graph pool" : "",
         bad, b->p[bad], pbyte(b->tag, bad));
}

static void fill_block(block_t *b, rng_t *r) {
  if (!g.readable) {
    b->tag = 0;
    return;
  }
  b->tag = rnext(r) | 1;
  pattern_pass(b, false);
}

/* ---- the model's block store (g.lock held) ---- */

static void idl_push(idlist_t *l, int v) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 256;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    if (l->v == NULL) FAIL("host memory for the model ran out");
  }
  l->v[l->n++] = v;
}

static int new_block(void) {
  if (g.freeslots.n > 0) return g.freeslots.v[--g.freeslots.n];
  if (g.nblk == g.capblk) {
    g.capblk = g.capblk ? g.capblk * 2 : 1024;
    g.blk = realloc(g.blk, g.capblk * sizeof *g.blk);
    if (g.blk == NULL) FAIL("host memory for the model ran out");
  }
  return (int)g.nblk++;
}

static size_t addr_lower(uintptr_t a) { /* first index with p >= a */
  size_t lo = 0, hi = g.naddr;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if ((uintptr_t)g.blk[g.byaddr[mid]].p < a) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Enters block b (its fields set) in the model: fails on an overlap. */
static void model_insert(int id) {
  block_t *b = &g.blk[id];
  uintptr_t a = (uintptr_t)b->p;
  size_t i = addr_lower(a);
  if (i < g.naddr) {
    block_t *s = &g.blk[g.byaddr[i]];
    if ((uintptr_t)s->p < a + b->n)
      FAIL("block %p (%zu B, stream key %u) overlaps live block %p (%zu B, stream key %u, %s)",
           (void *)b->p, b->n, b->key, (void *)s->p, s->n, s->key, route_names[s->route]);
  }
  if (i > 0) {
    block_t *s = &g.blk[g.byaddr[i - 1]];
    if ((uintptr_t)s->p + s->n > a)
      FAIL("block %p (%zu B, stream key %u) overlaps live block %p (%zu B, stream key %u, %s)",
           (void *)b->p, b->n, b->key, (void *)s->p, s->n, s->key, route_names[s->route]);
  }
  if (g.naddr == g.capaddr) {
    g.capaddr = g.capaddr ? g.capaddr * 2 : 1024;
    g.byaddr = realloc(g.byaddr, g.capaddr * sizeof *g.byaddr);
    if (g.byaddr == NULL) FAIL("host memory for the model ran out");
  }
  memmove(&g.byaddr[i + 1], &g.byaddr[i], (g.naddr - i) * sizeof *g.byaddr);
  g.byaddr[i] = id;
  g.naddr++;
  idlist_t *o = &g.owned[b->owner];
  b->opos = o->n;
  idl_push(o, id);
  b->live = true;
  g.nlive++;
  g.live_bytes += b->n;
  if (b->route == R_TORCH || b->route == R_CUPY) g.plugin_blocks++, g.plugin_bytes += b->n;
}

static void owner_remove(int id) {
  block_t *b = &g.blk[id];
  idlist_t *o = &g.owned[b->owner];
  int last = o->v[--o->n];
  if (last != id) {
    o->v[b->opos] = last;
    g.blk[last].opos = b->opos;
  }
}

static void model_remove(int id) {
  block_t *b = &g.blk[id];
  size_t i = addr_lower((uintptr_t)b->p);
  if (i >= g.naddr || g.byaddr[i] != id) FAIL("model: block %p not in the index", (void *)b->p);
  memmove(&g.byaddr[i], &g.byaddr[i + 1], (g.naddr - i - 1) * sizeof *g.byaddr);
  g.naddr--;
  owner_remove(id);
  b->live = false;
  g.nlive--;
  g.live_bytes -= b->n;
  if (b->route == R_TORCH || b->route == R_CUPY) g.plugin_blocks--, g.plugin_bytes -= b->n;
}

/* Takes a random block of thread t out of the model (NULL: none); the
 * caller frees it, or puts it back. */
static bool take_block(int t, rng_t *r, block_t *out, int *id_out) {
  pthread_mutex_lock(&g.lock);
  idlist_t *o = &g.owned[t];
  if (o->n == 0) {
    pthread_mutex_unlock(&g.lock);
    return false;
  }
  int id = o->v[rbelow(r, o->n)];
  *out = g.blk[id];
  model_remove(id);
  idl_push(&g.freeslots, id);
  *id_out = id;
  pthread_mutex_unlock(&g.lock);
  return true;
}

static void put_back(const block_t *b) {
  pthread_mutex_lock(&g.lock);
  int id = new_block();
  g.blk[id] = *b;
  model_insert(id);
  pthread_mutex_unlock(&g.lock);
}

/* ---- graph pools: memory they got back serves no one else (g.lock) ---- */

static void graph_forget(int gi) {
  graph_t *gr = &g.graphs[gi];
  gr->nfreed = 0;
}

static void graph_freed(int gi, const block_t *b) {
  graph_t *gr = &g.graphs[gi];
  if (!gr->exists) return;
  if (gr->freed == NULL) gr->freed = calloc(GRAPH_RANGES, sizeof *gr->freed);
  if (gr->freed == NULL) FAIL("host memory for the model ran out");
  if (gr->nfreed == GRAPH_RANGES) { /* forget the oldest half: a weaker check, still sound */
    memmove(gr->freed, gr->freed + GRAPH_RANGES / 2, GRAPH_RANGES / 2 * sizeof *gr->freed);
    gr->nfreed = GRAPH_RANGES / 2;
  }
  gr->freed[gr->nfreed++] = (range_t){(uintptr_t)b->p, b->n};
}

/* A block handed out for graph `graph` (0: none) must not lie in memory
 * another live graph pool got back. */
static void graph_check_new(const block_t *b) {
  for (int gi = 0; gi < NGRAPHS; gi++) {
    graph_t *gr = &g.graphs[gi];
    if (!gr->exists || b->graph == gi + 1) continue;
    for (size_t k = 0; k < gr->nfreed; k++)
      if (gr->freed[k].a < (uintptr_t)b->p + b->n && (uintptr_t)b->p < gr->freed[k].a + gr->freed[k].n)
        FAIL("block %p (%zu B, stream key %u, %s) lies in memory graph pool %d got back "
             "(%p, %zu B) while that graph pool lives",
             (void *)b->p, b->n, b->key, b->graph ? "another graph pool" : "no graph pool", gi,
             (void *)gr->freed[k].a, gr->freed[k].n);
  }
}

static int graph_routing(unsigned key) {
  if (key < GRAPH_KEY || key >= GRAPH_KEY + NGRAPHS) return 0;
  int gi = (int)(key - GRAPH_KEY);
  return g.graphs[gi].routed ? gi + 1 : 0;
}

/* ---- memory hooks: what the pool reports holding ---- */

static void hook_acquire(void *ptr, size_t bytes, void *user) {
  hookrec_t *h = user;
  pthread_mutex_lock(&h->lock);
  h->acquires++;
  uintptr_t a = (uintptr_t)ptr;
  for (size_t i = 0; i < h->n; i++)
    if (h->r[i].a < a + bytes && a < h->r[i].a + h->r[i].n) {
      if (h->errors++ == 0)
        snprintf(h->error, sizeof h->error, "on_acquire(%p, %zu) overlaps held range %p + %zu", ptr,
                 bytes, (void *)h->r[i].a, h->r[i].n);
      break;
    }
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 256;
    h->r = realloc(h->r, h->cap * sizeof *h->r);
  }
  if (h->r != NULL) h->r[h->n++] = (range_t){a, bytes};
  h->bytes += bytes;
  pthread_mutex_unlock(&h->lock);
}

static void hook_release(void *ptr, size_t bytes, void *user) {
  hookrec_t *h = user;
  pthread_mutex_lock(&h->lock);
  h->releases++;
  size_t i = 0;
  while (i < h->n && !(h->r[i].a == (uintptr_t)ptr && h->r[i].n == bytes)) i++;
  if (i == h->n) {
    if (h->errors++ == 0)
      snprintf(h->error, sizeof h->error, "on_release(%p, %zu) of a range never acquired", ptr,
               bytes);
  } else {
    h->r[i] = h->r[--h->n];
    h->bytes -= bytes;
  }
  pthread_mutex_unlock(&h->lock);
}

static void hooks_check(int i, size_t want, const char *when) {
  hookrec_t *h = &hooks[i];
  pthread_mutex_lock(&h->lock);
  uint64_t errors = h->errors;
  size_t bytes = h->bytes, n = h->n;
  pthread_mutex_unlock(&h->lock);
  if (errors != 0) FAIL("memory hooks %d (%s): %s", i, when, h->error);
  if (bytes != want)
    FAIL("memory hooks %d hold %zu bytes in %zu ranges %s, the pool %zu", i, bytes, n, when, want);
}

/* ---- the stack ---- */

static void build_stack(void) {
  rmmc_resource_t *base = NULL, *tmp = NULL;
  rmmc_status_t st = RMMC_SUCCESS;
  g.readable = g.shape->base != B_SIM;
  switch (g.shape->base) {
  case B_VMSPY:
  case B_SPY:
    if (spy_create(RMMC_MEMORY_HOST, &g.spy) != RMMC_SUCCESS) FAIL("spy_create");
    if (faulty_create(g.spy, &g.flt) != RMMC_SUCCESS) FAIL("faulty_create");
    if (g.shape->base == B_VMSPY) {
      if (vmspy_create(g.flt, 4 * KiB, &g.vmspy) != RMMC_SUCCESS) FAIL("vmspy_create");
      base = g.vmspy;
    } else {
      base = g.flt;
    }
    spy_set_capacity(spy_of(g.spy), 512 * MiB);
    g.budget = 160 * MiB;
    break;
  case B_HOST:
    if (rmmc_host_resource_create(&tmp) != RMMC_SUCCESS) FAIL("host_create");
    if (rmmc_limiting_adaptor_create(tmp, GiB, &g.limiting) != RMMC_SUCCESS) FAIL("limiting");
    rmmc_resource_release(tmp);
    if (faulty_vm_create(g.limiting, &g.flt) != RMMC_SUCCESS) FAIL("faulty_vm_create");
    base = g.flt;
    g.budget = 160 * MiB;
    break;
  default: {
    rmmc_sim_options_t so = RMMC_SIM_OPTIONS_INIT;
    so.capacity = 16 * GiB;
    if (rmmc_sim_resource_create(&so, &g.sim) != RMMC_SUCCESS) FAIL("sim_create");
    if (faulty_vm_create(g.sim, &g.flt) != RMMC_SUCCESS) FAIL("faulty_vm_create");
    base = g.flt;
    g.budget = 6 * GiB;
    break;
  }
  }
  g.faulty = faulty_of(g.flt);
  st = rmmc_stack_create_over(g.shape->spec, base, &g.top);
  if (st != RMMC_SUCCESS) FAIL("stack_create_over(\"%s\"): %s", g.shape->spec, sn(st));
  /* What the layers are: the first pool, the first caching layer and
   * whether the model knows its figures (only adaptors that pass blocks
   * through unchanged above it), whether it refuses wrong frees. */
  bool through = true, tracked = false;
  for (rmmc_resource_t *r = g.top; r != NULL && r != g.flt; r = rmmc_resource_upstream(r)) {
    if (g.pool == NULL && is_pool(r)) g.pool = r;
    if (g.first_cache == NULL && (is_pool(r) || is_name(r, "binning") || is_name(r, "fixed_size"))) {
      g.first_cache = r;
      g.figures_exact = through;
      g.strict = through && (tracked || is_pool(r));
    }
    if (is_name(r, "tracking")) tracked = true;
    if (!(is_name(r, "statistics") || is_name(r, "tracking") || is_name(r, "limiting") ||
          is_name(r, "failure_callback") || is_name(r, "thread_safe")))
      through = false;
    if (rmmc_resource_upstream(r) == g.flt && is_pool(r)) g.pool_on_base = true;
  }
  if (g.first_cache == NULL) g.strict = tracked;
  if (g.first_cache != NULL && g.figures_exact && is_name(g.first_cache, "fixed_size"))
    g.small_bias = rmmc_fixed_size_resource_block_size(g.first_cache);
  if (g.pool != NULL) {
    rmmc_pool_sleep_state_t ss = RMMC_POOL_SLEEP_STATE_INIT;
    if (rmmc_pool_sleep_state(g.top, &ss) != RMMC_SUCCESS) FAIL("pool_sleep_state: %s", rmmc_last_error_message());
    g.vm_pool = ss.can_sleep;
  }
  /* The registry's other resource: a plain spy. */
  if (spy_create(RMMC_MEMORY_HOST, &g.other) != RMMC_SUCCESS) FAIL("spy_create");
  g.hooks_cur = -1;
  g.registry = REG_NONE;
  /* With a GPU, nothing set means the device's real default, which the
   * model's made-up streams must not reach: the other resource instead. */
  if (rmmc_device_count() > 0) {
    rmmc_resource_t *prev = NULL;
    if (rmmc_set_device_resource(0, g.other, &prev) != RMMC_SUCCESS) FAIL("set_device_resource");
    rmmc_resource_release(prev);
    g.registry = REG_OTHER;
  }
}

/* What the base holds for the stack now. */
static size_t base_held(void) {
  switch (g.shape->base) {
  case B_VMSPY:
  case B_SPY: return spy_counts(spy_of(g.spy)).outstanding_bytes;
  case B_HOST: return need_field(g.limiting, "in_use");
  default: return need_field(g.sim, "in_use");
  }
}

/* ---- the checks after a step (the world stopped) ---- */

typedef struct sums {
  size_t exact, r256, lim, count, fixed, binned;
} sums_t;

static sums_t model_sums(void) {
  sums_t s = {0};
  rmmc_resource_t *fc = g.first_cache;
  size_t fblock = 0;
  if (fc != NULL && is_name(fc, "fixed_size")) fblock = rmmc_fixed_size_resource_block_size(fc);
  size_t nbins = fc != NULL && is_name(fc, "binning") ? rmmc_binning_resource_bin_count(fc) : 0;
  for (size_t i = 0; i < g.naddr; i++) {
    const block_t *b = &g.blk[g.byaddr[i]];
    size_t a = max_sz(b->align, 256);
    s.exact += b->n;
    s.r256 += round_up(b->n, 256);
    s.lim += round_up(b->n, a);
    s.count++;
    if (fblock != 0 && !b->routed) s.fixed += fblock;
    if (nbins != 0) {
      /* A bin's block counts its bin size; a graph pool's goes through
       * the bin to the upstream and counts in the bin's graph_routed
       * (fixed_size_resource.h), not in in_use; above the bins, the
       * bytes asked for. */
      size_t bi = rmmc_binning_resource_bin_for(fc, b->n, b->align);
      s.binned += bi == nbins ? b->n : b->routed ? 0 : rmmc_binning_resource_bin_size(fc, bi);
    }
  }
  return s;
}

static rmmc_pool_figures_t pool_figures(rmmc_resource_t *r) {
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  if (rmmc_pool_resource_figures(r, &f) != RMMC_SUCCESS)
    FAIL("pool_resource_figures of %s: %s", rmmc_resource_name(r), rmmc_last_error_message());
  return f;
}

/* The checks after a step; `full` adds every pool's rmmc_pool_resource_check
 * and its describe (linear in its blocks and streams). */
static void check_stack(const char *when, bool full) {
  pthread_mutex_lock(&g.lock);
  sums_t s = model_sums();
  size_t plugin_blocks = g.plugin_blocks, plugin_bytes = g.plugin_bytes;
  pthread_mutex_unlock(&g.lock);
  /* Figures of the layers down to the first caching one. */
  for (rmmc_resource_t *r = g.top; r != NULL && g.figures_exact; r = rmmc_resource_upstream(r)) {
    if (is_name(r, "statistics")) {
      rmmc_statistics_t st = RMMC_STATISTICS_INIT;
      if (rmmc_statistics_adaptor_get(r, &st) != RMMC_SUCCESS) FAIL("statistics_adaptor_get");
      if (st.current_bytes != (int64_t)s.exact || st.current_count != (int64_t)s.count)
        FAIL("statistics %s: current %" PRId64 " bytes in %" PRId64 " blocks, the model %zu in %zu",
             when, st.current_bytes, st.current_count, s.exact, s.count);
      if (full && need_field(r, "in_use") != s.exact)
        FAIL("statistics %s: describe's in_use %" PRIu64 ", the model %zu", when,
             need_field(r, "in_use"), s.exact);
    } else if (is_name(r, "tracking")) {
      size_t c = rmmc_tracking_adaptor_get_outstanding_count(r);
      size_t b = rmmc_tracking_adaptor_get_outstanding_bytes(r);
      if (c != s.count || b != s.exact)
        FAIL("tracking %s: %zu blocks of %zu bytes outstanding, the model %zu of %zu", when, c, b,
             s.count, s.exact);
    } else if (is_name(r, "limiting")) {
      uint64_t v = need_field(r, "in_use");
      if (v != s.lim) FAIL("limiting %s: in_use %" PRIu64 ", the model %zu", when, v, s.lim);
    } else if (r == g.first_cache) {
      uint64_t v = is_pool(r) ? pool_figures(r).in_use : need_field(r, "in_use");
      size_t want = is_pool(r) ? s.r256 : is_name(r, "fixed_size") ? s.fixed : s.binned;
      if (v != want)
        FAIL("%s %s: in_use %" PRIu64 ", the model %zu (%zu blocks)", rmmc_resource_name(r), when,
             v, want, s.count);
      break;
    }
  }
  /* Every pool layer: its invariants, its two views of its figures. */
  for (rmmc_resource_t *r = g.top; r != NULL; r = rmmc_resource_upstream(r)) {
    if (!is_pool(r)) continue;
    rmmc_pool_figures_t f = pool_figures(r);
    if (full) {
      if (rmmc_pool_resource_check(r) != RMMC_SUCCESS)
        FAIL("pool_check of %s %s: %s", rmmc_resource_name(r), when, rmmc_last_error_message());
      uint64_t in_use = need_field(r, "in_use"), reserved = need_field(r, "reserved");
      if (in_use != f.in_use || reserved != f.reserved)
        FAIL("%s %s: describe says in_use %" PRIu64 " reserved %" PRIu64
             ", pool_resource_figures %zu and %zu",
             rmmc_resource_name(r), when, in_use, reserved, f.in_use, f.reserved);
    }
    if (!g.paused && f.in_use > f.reserved)
      FAIL("%s %s: in_use %zu above reserved %zu", rmmc_resource_name(r), when, f.in_use,
           f.reserved);
    if (r == g.pool && g.pool_on_base) {
      size_t held = base_held();
      if (held != f.reserved)
        FAIL("%s %s: reserves %zu bytes, the base holds %zu", rmmc_resource_name(r), when,
             f.reserved, held);
    }
    if (r == g.pool && g.hooks_cur >= 0) hooks_check(g.hooks_cur, f.reserved, when);
  }
  if (g.pool != NULL) {
    rmmc_pool_sleep_state_t ss = RMMC_POOL_SLEEP_STATE_INIT;
    if (rmmc_pool_sleep_state(g.top, &ss) != RMMC_SUCCESS) FAIL("pool_sleep_state");
    if (ss.paused != g.paused || (g.paused && ss.mode != g.pause_mode))
      FAIL("sleep state %s: paused %d mode %d, the model paused %d mode %d", when, ss.paused,
           ss.mode, g.paused, g.pause_mode);
  }
  if (g.vmspy != NULL) {
    vmspy_counts_t v = vmspy_counts(g.vmspy);
    if (v.errors != 0) FAIL("vmspy %s: %" PRIu64 " bad virtual-memory calls", when, v.errors);
  }
  if (g.spy != NULL && spy_counts(spy_of(g.spy)).deallocate_errors != 0)
    FAIL("spy %s: a bad free reached the base", when);
  if (spy_counts(spy_of(g.other)).outstanding != 0)
    FAIL("the registry's other resource holds a block %s", when);
  rmmc_plugin_stats_t ps = RMMC_PLUGIN_STATS_INIT;
  if (rmmc_plugin_get_stats(0, &ps) != RMMC_SUCCESS) FAIL("plugin_get_stats");
  if (ps.live_blocks != plugin_blocks || ps.bytes_in_use != plugin_bytes)
    FAIL("plug-in figures %s: %" PRIu64 " blocks of %" PRIu64 " bytes live, the model %zu of %zu",
         when, ps.live_blocks, ps.bytes_in_use, plugin_blocks, plugin_bytes);
  if (ps.unknown_frees != 0) FAIL("plug-ins counted %" PRIu64 " unknown frees", ps.unknown_frees);
  if (ps.deallocation_failures != 0 && !g.faults_ever)
    FAIL("plug-ins counted %" PRIu64 " failed frees", ps.deallocation_failures);
}

static void verify_all(const char *when) {
  if (!g.readable || g.paused) return; /* paused: the pages are gone */
  pthread_mutex_lock(&g.lock);
  for (size_t i = 0; i < g.naddr; i++) verify_block(&g.blk[g.byaddr[i]], when);
  pthread_mutex_unlock(&g.lock);
}

static void refill_all(rng_t *r) {
  pthread_mutex_lock(&g.lock);
  for (size_t i = 0; i < g.naddr; i++) fill_block(&g.blk[g.byaddr[i]], r);
  pthread_mutex_unlock(&g.lock);
}

/* ---- operations ---- */

enum op {
  OP_ALLOC, OP_FREE, OP_FREE_OTHER, OP_GIVE, OP_PLUGIN_ALLOC, OP_WRONG_FREE, OP_GET_ALLOCATION,
  OP_RELEASE_CACHED, OP_DESCRIBE, OP_REGISTRY_LOCAL, OP_BURST,
  /* global: the world stopped (--real) */
  OP_PAUSE, OP_RESUME, OP_GRAPH, OP_HOOKS, OP_FAULT, OP_DISARM, OP_REGISTRY, OP_BAD_INPUT,
  OP_COUNT
};
#define FIRST_GLOBAL OP_PAUSE
static const char *const op_names[] = {
    "alloc", "free", "free_other", "give", "plugin_alloc", "wrong_free", "get_allocation",
    "release_cached", "describe", "registry_local", "burst", "pause", "resume", "graph", "hooks", "fault",
    "disarm", "registry", "bad_input"};

static unsigned draw_key(rng_t *r) {
  unsigned x = (unsigned)rbelow(r, 100);
  if (x < 8) return 0;
  if (x < 12) return 1;
  if (x < 55) return 2 + (unsigned)rbelow(r, 6);
  if (x < 63) { /* a routed graph's stream now and then */
    int gi = (int)rbelow(r, NGRAPHS);
    if (g.graphs[gi].routed) return GRAPH_KEY + (unsigned)gi;
  }
  /* Many streams, the first few hundred of them often: streams come back
   * (from other threads too) after hundreds of others were seen. */
  unsigned k = (unsigned)rbelow(r, g.nkeys);
  if (rchance(r, 50) && g.nkeys > 400) k %= 400;
  return 8 + k;
}

static size_t draw_size(rng_t *r) {
  if (g.small_bias != 0 && rchance(r, 85)) return 1 + (size_t)rbelow(r, g.small_bias);
  unsigned x = (unsigned)rbelow(r, 1000);
  static const size_t edges[] = {1, 255, 256, 257, 4095, 4096, 4097, 65535, 65536, 65537,
                                 (size_t)1 << 20, ((size_t)1 << 20) + 1, (size_t)2 << 20};
  if (x < 60) return edges[rbelow(r, sizeof edges / sizeof edges[0])];
  if (x < 600) return 1 + (size_t)rbelow(r, 4096);
  if (x < 880) return 4097 + (size_t)rbelow(r, MiB);
  if (x < 985) return MiB + (size_t)rbelow(r, 7 * MiB);
  return 8 * MiB + (size_t)rbelow(r, 56 * MiB + 1);
}

static size_t draw_align(rng_t *r) {
  unsigned x = (unsigned)rbelow(r, 100);
  static const size_t rare[] = {512, 1024, 4096, 8192, 65536, MiB, 2 * MiB};
  if (x < 25) return 256;
  if (x < 40) return 1;
  if (x < 55) return 8;
  if (x < 70) return 64;
  if (x < 80) return 128;
  return rare[rbelow(r, sizeof rare / sizeof rare[0])];
}

/* May allocate fail with st here? (The request is valid.) */
static bool alloc_failure_ok(rmmc_status_t st, size_t n, size_t align) {
  if (st == RMMC_ERROR_OUT_OF_MEMORY) return true;
  if (g.faults_armed && st == RMMC_ERROR_CUDA && g.cuda_armed) return true;
  if (st == RMMC_ERROR_NOT_SUPPORTED && g.first_cache != NULL && g.figures_exact &&
      is_name(g.first_cache, "fixed_size")) {
    size_t block = rmmc_fixed_size_resource_block_size(g.first_cache);
    size_t balign = block & (~block + 1);
    if (balign > RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT) balign = RMMC_FIXED_SIZE_MAX_BLOCK_ALIGNMENT;
    return n > block || align > balign;
  }
  return false;
}

static void op_alloc(worker_t *w, int route) {
  rng_t *r = &w->rng;
  size_t n = draw_size(r);
  size_t align = route == R_DIRECT ? draw_align(r) : 256;
  unsigned key = draw_key(r);
  if (rchance(r, 1)) n = 0;
  pthread_mutex_lock(&g.lock);
  bool full = g.nlive >= g.max_live || g.live_bytes + n > g.budget ||
              g.owned[w->id].n >= g.max_live / (size_t)g.nthreads + 1;
  int registry = g.registry, graph = graph_routing(key);
  bool paused = g.paused;
  pthread_mutex_unlock(&g.lock);
  if (full) return;
  if (route != R_DIRECT && route != R_RMMC && registry != REG_STACK && n > 0) {
    /* The plug-ins over the other resource, or none. */
    void *p = route == R_TORCH ? rmmc_torch_alloc(n, 0, stream_of(key))
                               : rmmc_cupy_malloc((void *)stream_of(key), n, 0);
    logf_("t%d %s alloc %zu key %u with the registry on %s: %p", w->id, route_names[route], n, key,
          registry == REG_NONE ? "nothing" : "the other resource", p);
    if (registry == REG_NONE) {
      if (p != NULL) FAIL("the %s plug-in allocated %p with no resource set", route_names[route], p);
      return;
    }
    if (p == NULL) FAIL("the %s plug-in refused %zu bytes from a spy: %s", route_names[route], n,
                        rmmc_last_error_message());
    size_t before = spy_counts(spy_of(g.other)).outstanding;
    if (route == R_TORCH) rmmc_torch_free(p, n, 0, stream_of(key));
    else rmmc_cupy_free((void *)stream_of(key), p, 0);
    if (!g.real && spy_counts(spy_of(g.other)).outstanding + 1 != before) /* (others at once) */
      FAIL("the %s plug-in did not give %p back to the other resource", route_names[route], p);
    return;
  }
  if (route == R_RMMC && registry != REG_STACK) route = R_DIRECT;
  void *p = (void *)&p;
  rmmc_status_t st;
  rmmc_clear_last_error();
  switch (route) {
  case R_DIRECT: st = rmmc_resource_allocate(g.top, n, align, stream_of(key), &p); break;
  case R_RMMC: st = rmmc_allocate(n, stream_of(key), &p); break;
  case R_TORCH:
    p = rmmc_torch_alloc(n, 0, stream_of(key));
    st = p != NULL || n == 0 ? RMMC_SUCCESS : RMMC_ERROR_OUT_OF_MEMORY;
    break;
  default:
    p = rmmc_cupy_malloc((void *)stream_of(key), n, 0);
    st = p != NULL || n == 0 ? RMMC_SUCCESS : RMMC_ERROR_OUT_OF_MEMORY;
    break;
  }
  logf_("t%d alloc %zu align %zu key %u %s%s: %s %p", w->id, n, align, key, route_names[route],
        graph ? " (graph routed)" : "", sn(st), p);
  if (st != RMMC_SUCCESS) {
    if (p != NULL && (route == R_DIRECT || route == R_RMMC))
      FAIL("a failed allocate (%s) left *out = %p", sn(st), p);
    if (route == R_TORCH || route == R_CUPY) {
      char msg[512];
      rmmc_plugin_last_error(msg, sizeof msg);
      if (!g.paused && !g.faults_armed && !alloc_failure_ok(RMMC_ERROR_NOT_SUPPORTED, n, 256) &&
          strstr(msg, "out of memory") == NULL &&
          strstr(msg, "Out of memory") == NULL && strstr(msg, "OUT_OF_MEMORY") == NULL &&
          strstr(msg, "paused") == NULL)
        FAIL("the %s plug-in failed %zu bytes: %s", route_names[route], n, msg);
      return;
    }
    if (!alloc_failure_ok(st, n, align))
      FAIL("allocate(%zu, align %zu, stream key %u) returned %s", n, align, key, sn(st));
    if (rmmc_last_error_message()[0] == '\0') FAIL("a failed allocate (%s) left no message", sn(st));
    return;
  }
  if (n == 0) {
    if (p != NULL) FAIL("allocate(0) returned %p", p);
    return;
  }
  if (p == NULL) FAIL("allocate(%zu) succeeded with NULL", n);
  if (paused)
    FAIL("allocate(%zu, align %zu, stream key %u, %s) handed out %p while the pool is paused", n,
         align, key, route_names[route], p);
  if (route == R_DIRECT && rmmc_last_error_message()[0] != '\0')
    FAIL("a successful allocate left the message '%s'", rmmc_last_error_message());
  if ((uintptr_t)p % max_sz(align, 256) != 0)
    FAIL("block %p of %zu B not aligned to %zu", p, n, max_sz(align, 256));
  block_t b = {.p = p, .n = n, .align = align, .key = key, .route = route, .graph = graph,
               .routed = graph != 0, .owner = w->id};
  pthread_mutex_lock(&g.lock);
  graph_check_new(&b);
  int id = new_block();
  g.blk[id] = b;
  model_insert(id);
  pthread_mutex_unlock(&g.lock);
  /* The pattern is written outside the lock: the block is this thread's. */
  fill_block(&b, r);
  pthread_mutex_lock(&g.lock);
  g.blk[id].tag = b.tag;
  pthread_mutex_unlock(&g.lock);
}

static rmmc_status_t free_route(const block_t *b, unsigned key) {
  cudaStream_t s = stream_of(key);
  switch (b->route) {
  case R_DIRECT: return rmmc_resource_deallocate(g.top, b->p, b->n, b->align, s);
  case R_RMMC:
    if (g.registry == REG_STACK) return rmmc_deallocate(b->p, b->n, s);
    return rmmc_resource_deallocate(g.top, b->p, b->n, 256, s);
  case R_TORCH: rmmc_torch_free(b->p, b->n, 0, s); break;
  default: rmmc_cupy_free((void *)s, b->p, 0); break;
  }
  /* A plug-in's free cannot fail to the framework: when the resource
   * refuses (an injected failure), the plug-in says so on this thread's
   * message and forgets the block, which the stack still holds. */
  return rmmc_last_error_message()[0] == '\0' ? RMMC_SUCCESS : RMMC_ERROR_CUDA;
}

static void op_free(worker_t *w, bool other_stream) {
  block_t b;
  int id;
  if (!take_block(w->id, &w->rng, &b, &id)) return;
  if (!g.paused) verify_block(&b, "before its free");
  unsigned key = b.key;
  if (other_stream) {
    key = draw_key(&w->rng);
    if (key == b.key) key = b.key + 1;
  }
  rmmc_clear_last_error();
  rmmc_status_t st = free_route(&b, key);
  if (st == RMMC_SUCCESS && (b.route == R_DIRECT || b.route == R_RMMC) &&
      rmmc_last_error_message()[0] != '\0')
    FAIL("a successful deallocate(%p, %zu) left the message '%s'", (void *)b.p, b.n,
         rmmc_last_error_message());
  logf_("t%d free %p %zu align %zu key %u->%u %s%s: %s", w->id, (void *)b.p, b.n, b.align, b.key,
        key, route_names[b.route], b.graph ? " (graph)" : "", sn(st));
  if (st != RMMC_SUCCESS) {
    if (!g.faults_armed)
      FAIL("deallocate(%p, %zu, align %zu) on stream key %u returned %s", (void *)b.p, b.n,
           b.align, key, sn(st));
    /* A failure changes nothing: the block is still live (a plug-in's
     * block is the stack's own now: freed through the stack later). */
    if (b.route == R_TORCH || b.route == R_CUPY) b.route = R_DIRECT, b.align = 256;
    put_back(&b);
    return;
  }
  if (b.graph) {
    pthread_mutex_lock(&g.lock);
    graph_freed(b.graph - 1, &b);
    pthread_mutex_unlock(&g.lock);
  }
}

/* Hands one of this thread's blocks to another thread, which frees it. */
static void op_give(worker_t *w) {
  if (g.nthreads < 2) return;
  pthread_mutex_lock(&g.lock);
  idlist_t *o = &g.owned[w->id];
  if (o->n > 0) {
    int id = o->v[rbelow(&w->rng, o->n)];
    int to = (w->id + 1 + (int)rbelow(&w->rng, (uint64_t)g.nthreads - 1)) % g.nthreads;
    owner_remove(id);
    g.blk[id].owner = to;
    g.blk[id].opos = g.owned[to].n;
    idl_push(&g.owned[to], id);
    void *p = g.blk[id].p; /* (g.blk moves when it grows) */
    pthread_mutex_unlock(&g.lock);
    logf_("t%d give %p to t%d", w->id, p, to);
    return;
  }
  pthread_mutex_unlock(&g.lock);
}

/* A deallocate the stack must refuse, changing nothing. */
static void op_wrong_free(worker_t *w) {
  if (!g.strict) return;
  block_t b;
  int id;
  if (!take_block(w->id, &w->rng, &b, &id)) return;
  if (b.route != R_DIRECT) {
    put_back(&b);
    return;
  }
  uint8_t local[64];
  void *p = b.p;
  size_t n = b.n;
  unsigned mode = (unsigned)rbelow(&w->rng, 4);
  switch (mode) {
  case 0: n = b.n + 257; break;
  case 1: n = b.n > 1 ? b.n - 1 : 2; break;
  case 2:
    if (b.n > 256) p = b.p + 256;
    else n = b.n + 4096;
    break;
  default: p = local; n = 64; break;
  }
  size_t held = g.real ? 0 : base_held();
  rmmc_status_t st = rmmc_resource_deallocate(g.top, p, n, b.align, stream_of(b.key));
  logf_("t%d wrong free %p %zu (block %p %zu): %s", w->id, p, n, (void *)b.p, b.n, sn(st));
  if (st != RMMC_ERROR_UNKNOWN_POINTER && st != RMMC_ERROR_INVALID_ARGUMENT)
    FAIL("a wrong deallocate(%p, %zu) of block %p (%zu B) returned %s", p, n, (void *)b.p, b.n,
         sn(st));
  if (rmmc_last_error_message()[0] == '\0') FAIL("a refused deallocate left no message");
  if (!g.real && base_held() != held) FAIL("a refused deallocate changed what the base holds");
  put_back(&b);
  if (!g.paused) verify_block(&b, "after a refused deallocate");
}

static void op_get_allocation(worker_t *w) {
  block_t b;
  int id;
  if (!take_block(w->id, &w->rng, &b, &id)) return;
  size_t off = (size_t)rbelow(&w->rng, b.n);
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  rmmc_status_t st = rmmc_resource_get_allocation(g.top, b.p + off, &a);
  logf_("t%d get_allocation %p+%zu: %s", w->id, (void *)b.p, off, sn(st));
  bool pool_answers = g.first_cache != NULL && is_pool(g.first_cache);
  if (pool_answers) {
    if (st != RMMC_SUCCESS) FAIL("get_allocation(%p + %zu) of a pool's block: %s", (void *)b.p, off, sn(st));
    if (a.base != b.p || a.bytes != b.n || a.resource != g.first_cache)
      FAIL("get_allocation(%p + %zu): base %p bytes %zu from %s, the block is %p %zu", (void *)b.p,
           off, a.base, a.bytes, a.resource ? rmmc_resource_name(a.resource) : "NULL", (void *)b.p,
           b.n);
  } else if (st != RMMC_ERROR_NOT_SUPPORTED && st != RMMC_SUCCESS) {
    FAIL("get_allocation(%p + %zu): %s", (void *)b.p, off, sn(st));
  }
  put_back(&b);
}

static void op_release_cached(worker_t *w) {
  bool plugin = rchance(&w->rng, 20) && g.registry == REG_STACK;
  rmmc_status_t st = plugin ? rmmc_plugin_release_cached() : rmmc_resource_release_cached(g.top);
  logf_("t%d %srelease_cached: %s", w->id, plugin ? "plugin_" : "", sn(st));
  if (st != RMMC_SUCCESS && !g.faults_armed) FAIL("release_cached returned %s", sn(st));
}

typedef struct dctx {
  size_t n;
  bool bad;
} dctx_t;
static void count_field(void *ctx, const rmmc_field_t *f) {
  dctx_t *d = ctx;
  d->n++;
  if (f->key == NULL || (f->kind == RMMC_FIELD_TEXT && f->text == NULL)) d->bad = true;
}

static void op_describe(worker_t *w) {
  size_t n = 0;
  for (rmmc_resource_t *r = g.top; r != NULL; r = rmmc_resource_upstream(r)) {
    dctx_t d = {0, false};
    rmmc_resource_describe(r, count_field, &d);
    if (d.bad) FAIL("describe of %s emitted a field without key or text", rmmc_resource_name(r));
    n += d.n;
  }
  if (g.pool != NULL) {
    rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
    if (rmmc_pool_resource_figures(g.pool, &f) != RMMC_SUCCESS) FAIL("pool_resource_figures");
  }
  logf_("t%d describe: %zu fields", w->id, n);
}

/* Registry calls that a thread makes beside others: retain, and setting
 * the resource it already holds. */
static void op_registry_local(worker_t *w) {
  int reg = g.registry;
  if (reg == REG_NONE) return;
  rmmc_resource_t *want = reg == REG_STACK ? g.top : g.other;
  if (rchance(&w->rng, 30)) {
    rmmc_resource_t *prev = NULL;
    rmmc_status_t st = rmmc_set_device_resource(0, want, &prev);
    logf_("t%d registry set (the same): %s", w->id, sn(st));
    if (st != RMMC_SUCCESS || prev != want) FAIL("set_device_resource(the same): %s, previous %p", sn(st), (void *)prev);
    rmmc_resource_release(prev);
    return;
  }
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_retain_device_resource(0, &r);
  logf_("t%d registry retain: %s", w->id, sn(st));
  if (st != RMMC_SUCCESS || r != want) FAIL("retain_device_resource: %s, %p not %p", sn(st), (void *)r, (void *)want);
  rmmc_resource_release(r);
}

/* A stream per request: one small block allocated, written, checked and
 * freed on each of up to 300 stream keys in a row (from a random one of the
 * many), as a server that makes a stream per request or per thread does;
 * the streams come back later, from other threads too. */
static void op_burst(worker_t *w) {
  rng_t *r = &w->rng;
  unsigned n = 16 + (unsigned)rbelow(r, 285), base = (unsigned)rbelow(r, g.nkeys);
  unsigned served = 0;
  for (unsigned i = 0; i < n; i++) {
    unsigned key = 8 + (base + i) % g.nkeys;
    size_t bytes = 1 + (size_t)rbelow(r, 4096);
    void *p = NULL;
    rmmc_status_t st = rmmc_resource_allocate(g.top, bytes, 256, stream_of(key), &p);
    if (st != RMMC_SUCCESS) {
      if (!alloc_failure_ok(st, bytes, 256))
        FAIL("burst: allocate(%zu) on stream key %u returned %s", bytes, key, sn(st));
      continue;
    }
    if (g.paused) FAIL("burst: allocate(%zu) on stream key %u handed out %p while paused", bytes, key, p);
    if ((uintptr_t)p % 256 != 0) FAIL("burst: %p not aligned to 256", p);
    block_t b = {.p = p, .n = bytes, .align = 256, .key = key, .owner = w->id};
    pthread_mutex_lock(&g.lock);
    graph_check_new(&b);
    int id = new_block();
    g.blk[id] = b;
    model_insert(id); /* (checks the overlap) */
    model_remove(id);
    idl_push(&g.freeslots, id);
    pthread_mutex_unlock(&g.lock);
    fill_block(&b, r);
    verify_block(&b, "in a burst");
    st = rmmc_resource_deallocate(g.top, p, bytes, 256, stream_of(key));
    if (st != RMMC_SUCCESS && !g.faults_armed)
      FAIL("burst: deallocate(%p, %zu) on stream key %u returned %s", p, bytes, key, sn(st));
    if (st != RMMC_SUCCESS) put_back(&b);
    served++;
  }
  logf_("t%d burst of %u streams from key %u: %u served", w->id, n, 8 + base, served);
}

/* ---- global operations (the world stopped) ---- */

static void op_pause(worker_t *w) {
  rng_t *r = &w->rng;
  int mode = rchance(r, 50) ? RMMC_POOL_PAUSE_BACKUP : RMMC_POOL_PAUSE_DISCARD;
  rmmc_status_t want = RMMC_SUCCESS;
  if (g.pool == NULL) want = RMMC_ERROR_INVALID_ARGUMENT;
  else if (g.paused) want = RMMC_ERROR_INVALID_ARGUMENT;
  else if (!g.vm_pool) want = RMMC_ERROR_NOT_SUPPORTED;
  else if (mode == RMMC_POOL_PAUSE_BACKUP && !g.readable) want = RMMC_ERROR_NOT_SUPPORTED;
  size_t held = g.pool != NULL ? pool_figures(g.pool).reserved : 0;
  rmmc_status_t st = rmmc_pool_pause(g.top, (rmmc_pool_pause_mode_t)mode, stream_of(draw_key(r)));
  logf_("t%d pause %s (%zu live blocks): %s", w->id,
        mode == RMMC_POOL_PAUSE_BACKUP ? "backup" : "discard", g.nlive, sn(st));
  if (want != RMMC_SUCCESS) {
    /* Paused already, and backup over sim: either may be said. */
    bool either = g.paused && mode == RMMC_POOL_PAUSE_BACKUP && !g.readable &&
                  st == RMMC_ERROR_NOT_SUPPORTED;
    if (st != want && !either) FAIL("pause returned %s where %s was due", sn(st), sn(want));
    return;
  }
  rmmc_pool_sleep_state_t ss = RMMC_POOL_SLEEP_STATE_INIT;
  if (rmmc_pool_sleep_state(g.top, &ss) != RMMC_SUCCESS) FAIL("pool_sleep_state");
  if (st == RMMC_SUCCESS) {
    if (!ss.paused || ss.mode != mode) FAIL("a pause that succeeded left the pool %s", ss.paused ? "in another mode" : "awake");
    if (ss.held != 0) FAIL("a pause that succeeded left %zu bytes mapped", ss.held);
    g.paused = true;
    g.pause_mode = mode;
    if (g.pool_on_base && base_held() != 0)
      FAIL("after a pause the base still holds %zu bytes for the pool", base_held());
    return;
  }
  if (!g.faults_armed && st != RMMC_ERROR_OUT_OF_MEMORY)
    FAIL("pause returned %s with nothing injected", sn(st));
  if (rmmc_last_error_message()[0] == '\0') FAIL("a failed pause left no message");
  if (!ss.paused) {
    /* Awake as before: every block as it was. */
    verify_all("after a failed pause");
    if (pool_figures(g.pool).reserved != held)
      FAIL("a failed pause left the pool awake with %" PRIu64 " bytes reserved, %zu before",
           pool_figures(g.pool).reserved, held);
    return;
  }
  /* Paused after all (mapping back was refused too): resume retries. */
  if (ss.mode != mode) FAIL("a failed pause left the pool paused in another mode");
  g.paused = true;
  g.pause_mode = mode;
}

static void op_resume(worker_t *w) {
  rng_t *r = &w->rng;
  rmmc_status_t want = RMMC_SUCCESS;
  if (g.pool == NULL) want = RMMC_ERROR_INVALID_ARGUMENT;
  else if (!g.vm_pool) want = RMMC_ERROR_NOT_SUPPORTED;
  else if (!g.paused) want = RMMC_ERROR_INVALID_ARGUMENT;
  rmmc_status_t st = rmmc_pool_resume(g.top, stream_of(draw_key(r)));
  logf_("t%d resume: %s", w->id, sn(st));
  if (want != RMMC_SUCCESS) {
    if (st != want) FAIL("resume returned %s where %s was due", sn(st), sn(want));
    return;
  }
  rmmc_pool_sleep_state_t ss = RMMC_POOL_SLEEP_STATE_INIT;
  if (rmmc_pool_sleep_state(g.top, &ss) != RMMC_SUCCESS) FAIL("pool_sleep_state");
  if (st != RMMC_SUCCESS) {
    if (!g.faults_armed && st != RMMC_ERROR_OUT_OF_MEMORY)
      FAIL("resume returned %s with nothing injected", sn(st));
    if (!ss.paused) FAIL("a failed resume (%s) left the pool awake", sn(st));
    return;
  }
  if (ss.paused) FAIL("a resume that succeeded left the pool paused");
  g.paused = false;
  if (g.pause_mode == RMMC_POOL_PAUSE_BACKUP) verify_all("after a backup pause and resume");
  else refill_all(r); /* discarded: the contents are undefined, write new ones */
  g.pause_mode = 0;
}

static void op_graph(worker_t *w) {
  rng_t *r = &w->rng;
  int gi = (int)rbelow(r, NGRAPHS);
  graph_t *gr = &g.graphs[gi];
  uint64_t id0 = 100 + (uint64_t)gi, id1 = 7;
  unsigned x = (unsigned)rbelow(r, 100);
  rmmc_status_t st, want;
  const char *what;
  if (x < 8) { /* misuse: the status says so, nothing changes */
    unsigned k = (unsigned)rbelow(r, 3);
    if (k == 0) {
      what = "begin by capture";
      st = rmmc_pool_graph_begin(g.top, id0, id1, false, NULL);
      want = g.pool == NULL ? RMMC_ERROR_INVALID_ARGUMENT
             : gr->routed   ? RMMC_ERROR_INVALID_ARGUMENT
                            : RMMC_ERROR_NOT_SUPPORTED;
    } else if (k == 1) {
      what = "end of a pool not routed";
      st = rmmc_pool_graph_end(g.top, 900, 9);
      want = RMMC_ERROR_INVALID_ARGUMENT;
    } else {
      what = "release of an unknown pool";
      st = rmmc_pool_graph_release(g.top, 900, 9);
      want = RMMC_ERROR_INVALID_ARGUMENT;
    }
    logf_("t%d graph %d %s: %s", w->id, gi, what, sn(st));
    /* Routed already and by capture over host memory: either may be said. */
    if (st != want && !(k == 0 && g.pool != NULL && gr->routed && st == RMMC_ERROR_NOT_SUPPORTED))
      FAIL("graph %s returned %s where %s was due", what, sn(st), sn(want));
    return;
  }
  if (!gr->routed && (!gr->exists || x < 55)) {
    what = "begin";
    st = rmmc_pool_graph_begin(g.top, id0, id1, true, stream_of(GRAPH_KEY + (unsigned)gi));
    want = g.pool == NULL ? RMMC_ERROR_INVALID_ARGUMENT : RMMC_SUCCESS;
    if (st == RMMC_SUCCESS) {
      if (!gr->exists) gr->nfreed = 0;
      gr->exists = gr->routed = true;
    }
  } else if (gr->routed && x < 90) {
    what = "end";
    st = rmmc_pool_graph_end(g.top, id0, id1);
    want = RMMC_SUCCESS;
    if (st == RMMC_SUCCESS) gr->routed = false;
  } else if (gr->routed) {
    what = "begin while routed";
    st = rmmc_pool_graph_begin(g.top, id0, id1, true, stream_of(GRAPH_KEY + (unsigned)gi));
    want = RMMC_ERROR_INVALID_ARGUMENT;
  } else {
    what = "release";
    st = rmmc_pool_graph_release(g.top, id0, id1);
    want = RMMC_SUCCESS;
    if (st == RMMC_SUCCESS) {
      gr->exists = false;
      graph_forget(gi);
      pthread_mutex_lock(&g.lock); /* its blocks still out come back as ordinary frees */
      for (size_t i = 0; i < g.naddr; i++)
        if (g.blk[g.byaddr[i]].graph == gi + 1) g.blk[g.byaddr[i]].graph = 0;
      pthread_mutex_unlock(&g.lock);
    }
  }
  logf_("t%d graph %d %s: %s", w->id, gi, what, sn(st));
  if (st != want) FAIL("graph pool %d %s returned %s where %s was due", gi, what, sn(st), sn(want));
}

static void op_hooks(worker_t *w) {
  int to = (int)rbelow(&w->rng, 3) - 1; /* -1: none */
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = hook_acquire;
  h.on_release = hook_release;
  h.user = to >= 0 ? &hooks[to] : NULL;
  rmmc_status_t st = rmmc_resource_set_memory_hooks(g.top, to >= 0 ? &h : NULL);
  logf_("t%d hooks %d -> %d: %s", w->id, g.hooks_cur, to, sn(st));
  if (g.pool == NULL) {
    if (st != RMMC_ERROR_NOT_SUPPORTED) FAIL("set_memory_hooks with no pool: %s", sn(st));
    return;
  }
  if (st != RMMC_SUCCESS) FAIL("set_memory_hooks: %s", sn(st));
  int from = g.hooks_cur;
  g.hooks_cur = to;
  if (from >= 0 && from != to) hooks_check(from, 0, "after they were replaced");
}

static void op_fault(worker_t *w) {
  rng_t *r = &w->rng;
  faulty_t *f = g.faulty;
  bool vm = g.shape->base == B_HOST || g.shape->base == B_SIM;
  unsigned k = (unsigned)rbelow(r, vm ? 10 : 6);
  uint64_t n = 1 + rbelow(r, 3);
  const char *what = "";
  switch (k) {
  case 0: faulty_fail_allocate(f, RMMC_ERROR_OUT_OF_MEMORY, n), what = "allocate OOM next"; break;
  case 1:
    faulty_fail_every(f, FAULTY_ALLOCATE, RMMC_ERROR_OUT_OF_MEMORY, n + 1), what = "allocate OOM every";
    break;
  case 2: faulty_fail_allocate(f, RMMC_ERROR_CUDA, 1), g.cuda_armed = true, what = "allocate CUDA next"; break;
  case 3: faulty_fail_deallocate(f, RMMC_ERROR_CUDA, n), what = "deallocate CUDA next"; break;
  case 4:
    faulty_fail_every(f, FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, n + 1), what = "deallocate CUDA every";
    break;
  case 5: faulty_fail_release(f, RMMC_ERROR_CUDA, 1), what = "release CUDA next"; break;
  case 6: faulty_fail_next(f, FAULTY_VM_MAP, RMMC_ERROR_OUT_OF_MEMORY, n), what = "vm_map OOM next"; break;
  case 7:
    faulty_fail_every(f, FAULTY_VM_MAP, RMMC_ERROR_OUT_OF_MEMORY, n + 1), what = "vm_map OOM every";
    break;
  case 8:
    faulty_fail_every(f, FAULTY_VM_UNMAP, RMMC_ERROR_CUDA, n + 1), what = "vm_unmap CUDA every";
    break;
  default: faulty_fail_next(f, FAULTY_VM_RESERVE, RMMC_ERROR_OUT_OF_MEMORY, 1), what = "vm_reserve OOM next"; break;
  }
  g.faults_armed = g.faults_ever = true;
  logf_("t%d fault: %s %" PRIu64, w->id, what, n);
}

static void op_disarm(worker_t *w) {
  faulty_disarm(g.faulty);
  g.faults_armed = g.cuda_armed = false;
  logf_("t%d disarm", w->id);
}

static void op_registry(worker_t *w) {
  rng_t *r = &w->rng;
  unsigned x = (unsigned)rbelow(r, 100);
  int to = x < 60 ? REG_STACK : x < 85 || rmmc_device_count() > 0 ? REG_OTHER : REG_NONE;
  rmmc_resource_t *res = to == REG_STACK ? g.top : to == REG_OTHER ? g.other : NULL;
  rmmc_resource_t *want_prev = g.registry == REG_STACK ? g.top : g.registry == REG_OTHER ? g.other : NULL;
  rmmc_resource_t *prev = (rmmc_resource_t *)&prev;
  rmmc_status_t st = rmmc_set_device_resource(0, res, &prev);
  logf_("t%d registry %d -> %d: %s", w->id, g.registry, to, sn(st));
  if (st != RMMC_SUCCESS) FAIL("set_device_resource: %s", sn(st));
  if (prev != want_prev) FAIL("set_device_resource handed back %p, not %p", (void *)prev, (void *)want_prev);
  rmmc_resource_release(prev);
  g.registry = to;
  rmmc_resource_t *got = NULL;
  st = rmmc_retain_device_resource(0, &got);
  if (to == REG_NONE) {
    if (st == RMMC_SUCCESS) FAIL("retain_device_resource found %p with nothing set and no GPU", (void *)got);
    return;
  }
  if (st != RMMC_SUCCESS || got != res) FAIL("retain_device_resource: %s, %p not %p", sn(st), (void *)got, (void *)res);
  rmmc_resource_release(got);
}

/* Bad arguments: a clear status, *out NULL, nothing changed (the checks
 * after the step see the figures). */
static void op_bad_input(worker_t *w) {
  rng_t *r = &w->rng;
  void *p = (void *)&p;
  rmmc_status_t st;
  unsigned k = (unsigned)rbelow(r, 6);
  switch (k) {
  case 0:
    st = rmmc_resource_allocate(g.top, 64, 3 << rbelow(r, 8), NULL, &p);
    if (st != RMMC_ERROR_INVALID_ARGUMENT || p != NULL) FAIL("allocate with a bad alignment: %s, %p", sn(st), p);
    break;
  case 1:
    st = rmmc_resource_allocate(g.top, SIZE_MAX - rbelow(r, 4096), 256, NULL, &p);
    if (st == RMMC_SUCCESS || p != NULL) FAIL("allocate(SIZE_MAX - k): %s, %p", sn(st), p);
    break;
  case 2:
    st = rmmc_resource_allocate(g.top, 64, 256, NULL, NULL);
    if (st != RMMC_ERROR_INVALID_ARGUMENT) FAIL("allocate with out NULL: %s", sn(st));
    break;
  case 3:
    st = rmmc_resource_deallocate(g.top, &p, 0, 256, NULL);
    if (st != RMMC_ERROR_INVALID_ARGUMENT) FAIL("deallocate(ptr, 0 bytes): %s", sn(st));
    break;
  case 4:
    st = rmmc_pool_pause(g.top, (rmmc_pool_pause_mode_t)(3 + rbelow(r, 5)), NULL);
    /* A chunk pool may say it cannot sleep at all first. */
    if (st != RMMC_ERROR_INVALID_ARGUMENT &&
        !(st == RMMC_ERROR_NOT_SUPPORTED && g.pool != NULL && !g.vm_pool))
      FAIL("pause with a bad mode: %s", sn(st));
    break;
  default:
    st = rmmc_resource_deallocate(g.top, NULL, 64, 256, NULL);
    if (st != RMMC_SUCCESS) FAIL("deallocate(NULL): %s", sn(st));
    break;
  }
  if (st != RMMC_SUCCESS && rmmc_last_error_message()[0] == '\0') FAIL("bad input %u left no message", k);
  logf_("t%d bad input %u: %s", w->id, k, sn(st));
}

/* ---- choosing and running steps ---- */

static int draw_op(rng_t *r) {
  /* weights; resume is likelier while paused */
  unsigned wts[OP_COUNT] = {
      [OP_ALLOC] = 340, [OP_FREE] = 200, [OP_FREE_OTHER] = 80, [OP_GIVE] = 25,
      [OP_PLUGIN_ALLOC] = 50, [OP_WRONG_FREE] = 15, [OP_GET_ALLOCATION] = 15,
      [OP_RELEASE_CACHED] = 20, [OP_DESCRIBE] = 8, [OP_REGISTRY_LOCAL] = 8, [OP_BURST] = 4,
      [OP_PAUSE] = 10, [OP_RESUME] = 5, [OP_GRAPH] = 30, [OP_HOOKS] = 8, [OP_FAULT] = 12,
      [OP_DISARM] = 20, [OP_REGISTRY] = 8, [OP_BAD_INPUT] = 6};
  if (g.paused) wts[OP_RESUME] = 40;
  for (int i = 0; i < OP_COUNT; i++)
    if (g.without & (1u << i)) wts[i] = 0;
  if (g.without & (1u << OP_ALLOC)) wts[OP_ALLOC] = 1; /* something must happen */
  if (g.faults_armed) wts[OP_DISARM] = 60;
  unsigned total = 0;
  for (int i = 0; i < OP_COUNT; i++) total += wts[i];
  unsigned x = (unsigned)rbelow(r, total);
  for (int i = 0; i < OP_COUNT; i++) {
    if (x < wts[i]) return i;
    x -= wts[i];
  }
  return OP_ALLOC;
}

static void run_op(worker_t *w, int op) {
  switch (op) {
  case OP_ALLOC: op_alloc(w, R_DIRECT); break;
  case OP_FREE: op_free(w, false); break;
  case OP_FREE_OTHER: op_free(w, true); break;
  case OP_GIVE: op_give(w); break;
  case OP_PLUGIN_ALLOC: op_alloc(w, 1 + (int)rbelow(&w->rng, 3)); break;
  case OP_WRONG_FREE: op_wrong_free(w); break;
  case OP_GET_ALLOCATION: op_get_allocation(w); break;
  case OP_RELEASE_CACHED: op_release_cached(w); break;
  case OP_DESCRIBE: op_describe(w); break;
  case OP_REGISTRY_LOCAL: op_registry_local(w); break;
  case OP_BURST: op_burst(w); break;
  case OP_PAUSE: op_pause(w); break;
  case OP_RESUME: op_resume(w); break;
  case OP_GRAPH: op_graph(w); break;
  case OP_HOOKS: op_hooks(w); break;
  case OP_FAULT: op_fault(w); break;
  case OP_DISARM: op_disarm(w); break;
  case OP_REGISTRY: op_registry(w); break;
  default: op_bad_input(w); break;
  }
  __atomic_add_fetch(&g.ops[op], 1, __ATOMIC_RELAXED);
  if (!g.real) g.last_global = op >= FIRST_GLOBAL;
}

static bool out_of_time(void) { return g.deadline != 0 && now_s() > g.deadline; }

/* Lockstep: a worker waits for its turn, takes one step, hands back. */
static void *lockstep_main(void *arg) {
  worker_t *w = arg;
  for (;;) {
    while (sem_wait(&w->go) != 0 && errno == EINTR) {
    }
    if (w->quit) break;
    run_op(w, draw_op(&w->rng));
    sem_post(&g.done);
  }
  return NULL;
}

/* --real: every worker at once; global operations stop the world. */
static void *real_main(void *arg) {
  worker_t *w = arg;
  for (;;) {
    uint64_t s = __atomic_add_fetch(&g.step, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_step, s, __ATOMIC_RELAXED);
    if (s > g.steps || out_of_time()) break;
    /* The choice reads the state global operations write: under the lock. */
    pthread_rwlock_rdlock(&g.world);
    int op = draw_op(&w->rng);
    if (op < FIRST_GLOBAL) run_op(w, op);
    pthread_rwlock_unlock(&g.world);
    if (op >= FIRST_GLOBAL) {
      pthread_rwlock_wrlock(&g.world);
      run_op(w, op);
      check_stack("after a global operation", true);
      pthread_rwlock_unlock(&g.world);
    }
  }
  return NULL;
}

/* Frees every block, resumes, ends the graph pools, takes the hooks off,
 * releases the stack and checks that nothing is left anywhere. */
static void finish_run(void) {
  worker_t *w = &g.workers[0];
  op_disarm(w);
  if (g.paused) {
    op_resume(w);
    if (g.paused) FAIL("resume with nothing injected left the pool paused");
  }
  for (int gi = 0; gi < NGRAPHS; gi++) {
    uint64_t id0 = 100 + (uint64_t)gi;
    if (g.graphs[gi].routed && rmmc_pool_graph_end(g.top, id0, 7) != RMMC_SUCCESS)
      FAIL("graph_end at the end: %s", rmmc_last_error_message());
    g.graphs[gi].routed = false;
  }
  check_stack("at the end", true);
  for (int t = 0; t < g.nthreads; t++) {
    worker_t *x = &g.workers[t];
    while (g.owned[t].n > 0) op_free(x, false);
  }
  for (int gi = 0; gi < NGRAPHS; gi++) {
    if (g.graphs[gi].exists && rmmc_pool_graph_release(g.top, 100 + (uint64_t)gi, 7) != RMMC_SUCCESS)
      FAIL("graph_release at the end: %s", rmmc_last_error_message());
    g.graphs[gi].exists = false;
    graph_forget(gi);
  }
  check_stack("with everything freed", true);
  rmmc_status_t st = rmmc_resource_release_cached(g.top);
  if (st != RMMC_SUCCESS) FAIL("release_cached at the end: %s", sn(st));
  check_stack("after release_cached with everything freed", true);
  if (g.first_cache != NULL && field_or(g.first_cache, "in_use", 0) != 0)
    FAIL("%s still has %" PRIu64 " bytes in use with nothing live", rmmc_resource_name(g.first_cache),
         field_or(g.first_cache, "in_use", 0));
  rmmc_resource_t *prev = NULL;
  if (rmmc_set_device_resource(0, NULL, &prev) != RMMC_SUCCESS) FAIL("set_device_resource(NULL)");
  rmmc_resource_release(prev);
  g.registry = REG_NONE;
  if (rmmc_resource_refcount(g.top) != 1)
    FAIL("the stack holds %ld references at the end, 1 expected", rmmc_resource_refcount(g.top));
  rmmc_resource_release(g.top);
  g.top = g.pool = g.first_cache = NULL;
  if (g.hooks_cur >= 0) hooks_check(g.hooks_cur, 0, "after the stack was released");
  switch (g.shape->base) {
  case B_VMSPY: {
    vmspy_counts_t v = vmspy_counts(g.vmspy);
    if (v.errors != 0 || v.mapped_bytes != 0 || v.reserved_bytes != 0)
      FAIL("vmspy after release: %" PRIu64 " errors, %zu bytes mapped, %zu reserved", v.errors,
           v.mapped_bytes, v.reserved_bytes);
  } /* fall through */
  case B_SPY: {
    spy_counts_t c = spy_counts(spy_of(g.spy));
    if (c.outstanding != 0 || c.deallocate_errors != 0)
      FAIL("spy after release: %" PRIu64 " allocations (%" PRIu64 " bytes) leaked, %" PRIu64
           " bad frees",
           c.outstanding, c.outstanding_bytes, c.deallocate_errors);
    break;
  }
  case B_HOST:
    if (need_field(g.limiting, "in_use") != 0)
      FAIL("limiting over host after release: %" PRIu64 " bytes leaked", need_field(g.limiting, "in_use"));
    break;
  default:
    if (need_field(g.sim, "in_use") != 0 || field_or(g.sim, "outstanding", 0) != 0 ||
        field_or(g.sim, "address_reserved", 0) != 0)
      FAIL("sim after release: %" PRIu64 " bytes in use, %" PRIu64 " ranges, %" PRIu64
           " bytes of address space leaked",
           need_field(g.sim, "in_use"), field_or(g.sim, "outstanding", 0),
           field_or(g.sim, "address_reserved", 0));
    break;
  }
  if (spy_counts(spy_of(g.other)).outstanding != 0) FAIL("the registry's other resource leaked");
  rmmc_resource_release(g.flt);
  rmmc_resource_release(g.vmspy);
  rmmc_resource_release(g.spy);
  rmmc_resource_release(g.limiting);
  rmmc_resource_release(g.sim);
  rmmc_resource_release(g.other);
}

static void reset_hooks(void) {
  for (int i = 0; i < 2; i++) {
    free(hooks[i].r);
    pthread_mutex_destroy(&hooks[i].lock);
    memset(&hooks[i], 0, sizeof hooks[i]);
    pthread_mutex_init(&hooks[i].lock, NULL);
  }
}

/* One run: shape `si`, its sequence drawn from (seed, si). */
static void run_one(const run_t *cfg, int si) {
  g = *cfg;
  g.shape_index = si;
  g.shape = &shapes[si];
  pthread_mutex_init(&g.lock, NULL);
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&g.world, &ra);
  pthread_rwlockattr_destroy(&ra);
  sem_init(&g.done, 0, 0);
  reset_hooks();
  rmmc_plugin_reset_stats();
  uint64_t rs = mix64(g.seed * 0x100000001B3ull + (uint64_t)si + 1);
  rng_t sched = {rs};
  snprintf(repro, sizeof repro,
           "%s --seed %" PRIu64 " --stack %d --threads %d%s --keys %u --max-live %zu --check-every %u --full-every %u%s%s",
           g.argv0, g.seed, si, g.nthreads, g.real ? " --real" : "", g.nkeys, g.max_live,
           g.check_every, g.full_every, g.without ? " --without " : "", g.without_text);
  build_stack();
  double t0 = now_s();
  for (int t = 0; t < g.nthreads; t++) {
    worker_t *w = &g.workers[t];
    w->id = t;
    w->rng.s = mix64(rs + 0x51ED2701u * (uint64_t)(t + 1));
    w->quit = false;
    sem_init(&w->go, 0, 0);
    if (pthread_create(&w->th, NULL, g.real ? real_main : lockstep_main, w) != 0)
      FAIL("pthread_create");
  }
  if (g.real) {
    for (int t = 0; t < g.nthreads; t++) pthread_join(g.workers[t].th, NULL);
    check_stack("after the threads", true);
    verify_all("after the threads");
  } else {
    for (g.step = 0; g.step < g.steps && !out_of_time(); g.step++) {
      __atomic_store_n(&g_step, g.step, __ATOMIC_RELAXED);
      int t = (int)rbelow(&sched, (uint64_t)g.nthreads);
      g.cur_thread = t;
      sem_post(&g.workers[t].go);
      while (sem_wait(&g.done) != 0 && errno == EINTR) {
      }
      if (g.step % g.check_every == 0 || g.step + 1 == g.steps)
        check_stack("after the step", g.last_global || g.step % g.full_every == 0 ||
                                          g.step + 1 == g.steps);
    }
    for (int t = 0; t < g.nthreads; t++) {
      g.workers[t].quit = true;
      sem_post(&g.workers[t].go);
      pthread_join(g.workers[t].th, NULL);
    }
  }
  uint64_t steps = g.step > g.steps ? g.steps : g.step;
  if (g.trace) {
    fprintf(stderr, "fuzz_api: operations:");
    for (int i = 0; i < OP_COUNT; i++) fprintf(stderr, " %s %" PRIu64, op_names[i], g.ops[i]);
    fprintf(stderr, "\n");
  }
  size_t peak_live = g.nlive;
  finish_run();
  if (!g.trace)
    printf("fuzz_api: stack %2d ok: %" PRIu64 " steps in %.1f s (pauses %" PRIu64 ", resumes %" PRIu64
           ", graph ops %" PRIu64 ", faults %" PRIu64 ", %zu live at the end): %s > %s\n",
           si, steps, now_s() - t0, g.ops[OP_PAUSE], g.ops[OP_RESUME], g.ops[OP_GRAPH],
           g.ops[OP_FAULT], peak_live, g.shape->spec, base_names[g.shape->base]);
  fflush(stdout);
  for (int t = 0; t < MAX_THREADS; t++) free(g.owned[t].v);
  free(g.freeslots.v);
  free(g.blk);
  free(g.byaddr);
  for (int gi = 0; gi < NGRAPHS; gi++) free(g.graphs[gi].freed);
  for (int t = 0; t < g.nthreads; t++) sem_destroy(&g.workers[t].go);
  sem_destroy(&g.done);
  pthread_rwlock_destroy(&g.world);
  pthread_mutex_destroy(&g.lock);
}

static void usage(FILE *f) {
  fprintf(f,
          "Usage: fuzz_api [options]\n"
          "A stateful fuzzer of rmmc's C API over whole stacks (tests/fuzz/README.md).\n"
          "  --seed N|time    the seed (default 1; 'time': from the clock, printed)\n"
          "  --seeds N        run N seeds from --seed on (default 1)\n"
          "  --stack K|all    one stack shape (index, see --list) or every one (default all)\n"
          "  --steps N        steps per stack (default 2000)\n"
          "  --time S         stop after S seconds in all (a run stops mid-way)\n"
          "  --threads T      worker threads, 1..%d (default 3)\n"
          "  --real           threads at once (races) instead of lockstep (replayable)\n"
          "  --keys N         stream keys beyond the 8 hot ones (default 2000)\n"
          "  --max-live N     most live blocks (default 1500)\n"
          "  --check-every N  the checks every N steps (default 1)\n"
          "  --full-every N   with every pool's pool_check and describe every N steps, and\n"
          "                   after each global operation (default 8)\n"
          "  --without A,B    leave these operations out (to narrow a failure down):\n"
          "                   alloc free free_other give plugin_alloc wrong_free\n"
          "                   get_allocation release_cached describe registry_local burst pause\n"
          "                   resume graph hooks fault disarm registry bad_input\n"
          "  --trace          print every operation\n"
          "  --list           print the stack shapes\n",
          MAX_THREADS);
}

int main(int argc, char **argv) {
  run_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.argv0 = argv[0];
  cfg.seed = 1;
  cfg.nthreads = 3;
  cfg.steps = 2000;
  cfg.check_every = 1;
  cfg.full_every = 8;
  cfg.nkeys = 2000;
  cfg.max_live = 1500;
  int stack = -1, nseeds = 1;
  double time_limit = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--list") == 0) {
      for (int k = 0; k < NSHAPES; k++) printf("%2d  %s > %s\n", k, shapes[k].spec, base_names[shapes[k].base]);
      return 0;
    } else if (strcmp(a, "--real") == 0) {
      cfg.real = true;
    } else if (strcmp(a, "--trace") == 0) {
      cfg.trace = true;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (v == NULL) {
      usage(stderr);
      return 2;
    } else {
      i++;
      char *end = NULL;
      unsigned long long x = strtoull(v, &end, 10);
      bool num = end != v && *end == '\0';
      if (strcmp(a, "--seed") == 0 && strcmp(v, "time") == 0) {
        cfg.seed = mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)) % 1000000000u;
      } else if (strcmp(a, "--stack") == 0 && strcmp(v, "all") == 0) {
        stack = -1;
      } else if (strcmp(a, "--without") == 0) {
        snprintf(cfg.without_text, sizeof cfg.without_text, "%s", v);
        char list[200];
        snprintf(list, sizeof list, "%s", v);
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
          int k = 0;
          while (k < OP_COUNT && strcmp(op_names[k], t) != 0) k++;
          if (k == OP_COUNT) {
            fprintf(stderr, "fuzz_api: --without: no operation '%s' (--help lists them)\n", t);
            return 2;
          }
          cfg.without |= 1u << k;
        }
      } else if (!num) {
        fprintf(stderr, "fuzz_api: %s wants a number, not '%s'\n", a, v);
        return 2;
      } else if (strcmp(a, "--seed") == 0) {
        cfg.seed = x;
      } else if (strcmp(a, "--seeds") == 0) {
        nseeds = (int)x;
      } else if (strcmp(a, "--stack") == 0) {
        if (x >= (unsigned long long)NSHAPES) {
          fprintf(stderr, "fuzz_api: --stack %llu: there are %d (--list)\n", x, NSHAPES);
          return 2;
        }
        stack = (int)x;
      } else if (strcmp(a, "--steps") == 0) {
        cfg.steps = x;
      } else if (strcmp(a, "--time") == 0) {
        time_limit = (double)x;
      } else if (strcmp(a, "--threads") == 0) {
        if (x < 1 || x > MAX_THREADS) {
          fprintf(stderr, "fuzz_api: --threads from 1 to %d\n", MAX_THREADS);
          return 2;
        }
        cfg.nthreads = (int)x;
      } else if (strcmp(a, "--keys") == 0) {
        cfg.nkeys = x < 1 ? 1 : (unsigned)x;
      } else if (strcmp(a, "--max-live") == 0) {
        cfg.max_live = x < 1 ? 1 : (size_t)x;
      } else if (strcmp(a, "--check-every") == 0) {
        cfg.check_every = x < 1 ? 1 : (unsigned)x;
      } else if (strcmp(a, "--full-every") == 0) {
        cfg.full_every = x < 1 ? 1 : (unsigned)x;
      } else {
        usage(stderr);
        return 2;
      }
    }
  }
  /* The RMMC_TEST_QUICK passes (valgrind, ThreadSanitizer) run a tenth. */
  if (getenv("RMMC_TEST_QUICK") != NULL) cfg.steps = cfg.steps / 10 + 1;
  if (time_limit > 0) cfg.deadline = now_s() + time_limit;
  install_crash_handler();
  printf("fuzz_api: seed %" PRIu64 "%s, %s, %d thread%s%s, %" PRIu64 " steps per stack%s\n",
         cfg.seed, nseeds > 1 ? " and on" : "", stack < 0 ? "every stack" : "one stack",
         cfg.nthreads, cfg.nthreads > 1 ? "s" : "", cfg.real ? " at once (--real)" : " in lockstep",
         cfg.steps, time_limit > 0 ? " within the time limit" : "");
  fflush(stdout);
  uint64_t first = cfg.seed;
  for (int s = 0; s < nseeds && !(cfg.deadline != 0 && now_s() > cfg.deadline); s++) {
    cfg.seed = first + (uint64_t)s;
    for (int k = 0; k < NSHAPES; k++) {
      if (cfg.deadline != 0 && now_s() > cfg.deadline) break;
      if (stack >= 0 && k != stack) continue;
      /* With every stack and a time limit, start where the seed points so
       * that short runs of many seeds cover every shape. */
      int si = stack >= 0 ? stack : (int)((k + (stack < 0 && time_limit > 0 ? cfg.seed : 0)) % NSHAPES);
      run_one(&cfg, si);
    }
  }
  rmmc_registry_clear();
  printf("fuzz_api: passed\n");
  return 0;
}
