/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault injection across every layer (issue 7).
 *
 * Each sub-allocator, each adaptor and a few stacks of them run a
 * deterministic random workload (allocate, write, read back, free,
 * release_cached, on three stream keys) over a faulty resource
 * (support/faulty.h) that fails every Nth upstream allocate and, in the
 * second mode, every Nth upstream deallocate and release_cached too, for
 * N = 1..64, 100, 1000 and 10000 (fewer with RMMC_TEST_QUICK=1, which the
 * valgrind pass sets). The faulty resource sits on a spy (which
 * catches leaks, double, foreign and wrong-size frees) or, for requests of
 * hundreds of MiB, on sim (no data). After every step:
 *  - a failed call returned out of memory or the injected status, with a
 *    message, and an allocate that failed gave NULL;
 *  - every block the caller holds still has its data (checked when freed,
 *    every 16 steps and after every failure);
 *  - the layers' books match the caller's (tracking, statistics, limiting,
 *    a sub-allocator's "reserved" against the spy's bytes, the spy's count
 *    for stacks of adaptors only), and rmmc_pool_resource_check passes
 *    (after each step that reached the upstream or failed, and every 8th:
 *    it walks every block);
 *  - the spy saw no bad free.
 * Then injection stops: everything the caller holds is freed (a free that
 * failed under injection left the block allocated, and succeeds now), and
 * release_cached gives every byte back to the spy; a fresh workload must
 * succeed call by call; releasing the stack destroys the spy with nothing
 * outstanding. A last test runs 8 threads over thread-safe stacks.
 *
 * The contract checked for a failed upstream deallocate: the layer that
 * called it keeps what it tried to give back (a pool its chunk, a
 * fixed_size/arena its chunk, an adaptor the caller's block and its
 * record) and returns the status; nothing is lost and nothing is freed
 * twice, as the spy's books show at the end. (Destroy cannot report one:
 * there, as before, what the upstream refused stays with the upstream.)
 */
#include <check.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "faulty.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "vmspy.h"
#include "test_main.h"
#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define LIVE_MAX 24
#define FAULT_STEPS 200
#define FRESH_STEPS 80

/* ---- the stacks ---- */

typedef rmmc_status_t (*builder_t)(rmmc_resource_t *up, rmmc_resource_t **out);

/* Small chunks and growths, so the sub-allocators go upstream often. */
static rmmc_status_t b_pool(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.min_growth = 1 * MiB;
  o.growth_granularity = 64 * KiB;
  o.small_max = 16 * KiB;
  o.small_chunk = 128 * KiB;
  return rmmc_pool_resource_create(up, &o, out);
}
static rmmc_status_t b_pool_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_pool_resource_create(up, NULL, out);
}
/* Virtual memory checked by a vmspy whose mappings come from the layer
 * below (faulty): a failed allocate is a refused mapping, a failed
 * deallocate a refused unmapping. */
static rmmc_status_t b_vmspy(rmmc_resource_t *up, rmmc_resource_t **out) {
  return vmspy_create(up, 4 * KiB, out);
}
/* The pool's virtual-memory backend: small mappings, small spans, no cache,
 * several reservations, so it maps, unmaps and reserves often. */
static rmmc_status_t b_pool_vm(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  o.page_size = 64 * KiB;
  o.address_space = 8 * MiB;
  o.small_max = 16 * KiB;
  o.small_chunk = 128 * KiB;
  o.cache_size = 128 * KiB;
  return rmmc_pool_resource_create(up, &o, out);
}
static rmmc_status_t b_fixed_size(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = 4 * KiB;
  o.blocks_per_chunk = 8;
  return rmmc_fixed_size_resource_create(up, &o, out);
}
/* Room for a 4 KiB request the aligned adaptor pads to 4 KiB alignment. */
static rmmc_status_t b_fixed_size_8k(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = 8 * KiB;
  o.blocks_per_chunk = 8;
  return rmmc_fixed_size_resource_create(up, &o, out);
}
static rmmc_status_t b_binning(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
  o.max_bin = 32 * KiB;
  o.chunk_size = 64 * KiB;
  return rmmc_binning_resource_create(up, &o, out);
}
static rmmc_status_t b_arena(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  o.superblock_size = 64 * KiB;
  o.chunk_size = 256 * KiB;
  o.keep_superblocks = 1;
  o.large_cache_size = 256 * KiB;
  return rmmc_arena_resource_create(up, &o, out);
}
static rmmc_status_t b_arena_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_arena_resource_create(up, NULL, out);
}
static rmmc_status_t b_limiting(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_limiting_adaptor_create(up, (size_t)64 << 30, out);
}
static rmmc_status_t b_tracking(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_tracking_adaptor_create(up, NULL, out);
}
static rmmc_status_t b_statistics(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_statistics_adaptor_create(up, out);
}
/* The log goes to a temporary file the test reads back (one stack at a
 * time per process: Check runs the tests one after another). */
static FILE *log_file;
static rmmc_status_t b_logging(rmmc_resource_t *up, rmmc_resource_t **out) {
  log_file = tmpfile();
  if (log_file == NULL) return RMMC_ERROR_IO;
  rmmc_status_t st = rmmc_logging_adaptor_create_file(up, log_file, NULL, out);
  if (st != RMMC_SUCCESS) {
    fclose(log_file);
    log_file = NULL;
  }
  return st;
}
static rmmc_status_t b_failure_callback(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_failure_callback_adaptor_create_release_cached(up, 2, out);
}
static rmmc_status_t b_aligned(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.alignment = 4 * KiB;
  o.threshold = 4 * KiB;
  return rmmc_aligned_adaptor_create(up, &o, out);
}
static rmmc_status_t b_thread_safe(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_thread_safe_adaptor_create(up, out);
}
static rmmc_status_t b_prefetch(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_prefetch_adaptor_create(up, out);
}

typedef enum base_kind {
  BASE_SPY,        /* host spy: data written and read back */
  BASE_DEVICE_SPY, /* spy reporting device memory (still host memory): prefetch */
  BASE_SIM,        /* sim: address ranges only, large requests, no data */
} base_kind_t;

typedef struct scenario {
  const char *name;
  builder_t layers[6]; /* bottom first, NULL-terminated */
  base_kind_t base;
  size_t big;       /* largest request */
  size_t max_align; /* largest alignment asked for */
  size_t small;     /* most requests are at most this */
} scenario_t;

static const scenario_t scenarios[] = {
    {"pool", {b_pool}, BASE_SPY, 3 * MiB, 64 * KiB, 4 * KiB},
    {"fixed_size", {b_fixed_size}, BASE_SPY, 4 * KiB, 4 * KiB, 4 * KiB},
    {"binning", {b_binning}, BASE_SPY, 256 * KiB, 4 * KiB, 4 * KiB},
    {"arena", {b_arena}, BASE_SPY, 512 * KiB, 64 * KiB, 4 * KiB},
    {"limiting", {b_limiting}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"tracking", {b_tracking}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"statistics", {b_statistics}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"logging", {b_logging}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"failure_callback", {b_failure_callback}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"aligned", {b_aligned}, BASE_SPY, 256 * KiB, 64 * KiB, 8 * KiB},
    {"thread_safe", {b_thread_safe}, BASE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"prefetch (device pass-through)", {b_prefetch}, BASE_DEVICE_SPY, 256 * KiB, 8 * KiB, 4 * KiB},
    {"statistics>limiting>binning>pool", {b_pool, b_binning, b_limiting, b_statistics}, BASE_SPY,
     2 * MiB, 8 * KiB, 4 * KiB},
    {"tracking>arena", {b_arena, b_tracking}, BASE_SPY, 512 * KiB, 64 * KiB, 4 * KiB},
    {"logging>failure_callback>pool", {b_pool, b_failure_callback, b_logging}, BASE_SPY, 3 * MiB,
     8 * KiB, 4 * KiB},
    {"aligned>thread_safe>fixed_size", {b_fixed_size_8k, b_thread_safe, b_aligned}, BASE_SPY, 4 * KiB,
     4 * KiB, 4 * KiB},
    {"tracking>aligned>pool", {b_pool, b_aligned, b_tracking}, BASE_SPY, 2 * MiB, 64 * KiB, 8 * KiB},
    {"pool (virtual memory)", {b_vmspy, b_pool_vm}, BASE_SPY, 3 * MiB, 64 * KiB, 4 * KiB},
    {"statistics>pool (virtual memory)", {b_vmspy, b_pool_vm, b_statistics}, BASE_SPY, 12 * MiB,
     64 * KiB, 8 * KiB},
    {"pool (sim)", {b_pool_default}, BASE_SIM, 768 * MiB, 1 * MiB, 64 * KiB},
    {"arena (sim)", {b_arena_default}, BASE_SIM, 256 * MiB, 1 * MiB, 64 * KiB},
    {"statistics>binning>pool (sim)", {b_pool_default, b_binning, b_statistics}, BASE_SIM,
     512 * MiB, 8 * KiB, 16 * KiB},
};
#define NSCENARIOS ((int)(sizeof scenarios / sizeof scenarios[0]))

/* A stack over faulty over its base; `top` holds the only reference to the
 * layers, the test holds faulty and base too. */
typedef struct stack {
  rmmc_resource_t *top, *faulty, *base;
} stack_t_;

static void stack_build(const scenario_t *sc, stack_t_ *s) {
  if (sc->base == BASE_SIM)
    ck_assert_int_eq(rmmc_sim_resource_create(NULL, &s->base), RMMC_SUCCESS);
  else
    ck_assert_int_eq(spy_create(sc->base == BASE_SPY ? RMMC_MEMORY_HOST : RMMC_MEMORY_DEVICE, &s->base),
                     RMMC_SUCCESS);
  ck_assert_int_eq(faulty_create(s->base, &s->faulty), RMMC_SUCCESS);
  rmmc_resource_t *cur = rmmc_resource_retain(s->faulty);
  for (const builder_t *b = sc->layers; *b != NULL; b++) {
    rmmc_resource_t *next = NULL;
    rmmc_status_t st = (*b)(cur, &next);
    ck_assert_msg(st == RMMC_SUCCESS, "%s: building a layer: %s", sc->name, rmmc_last_error_message());
    rmmc_resource_release(cur);
    cur = next;
  }
  s->top = cur;
}

/* ---- the workload and its books ---- */

typedef struct block {
  void *p;
  size_t bytes, align;
  cudaStream_t stream;
  uint64_t tag;
} block_t;

static const cudaStream_t streams[3] = {NULL, (cudaStream_t)(uintptr_t)0x5100,
                                        (cudaStream_t)(uintptr_t)0x5200};

/* One caller: its blocks, its counts and the first thing that went wrong
 * (threads record instead of asserting; the main thread asserts). */
typedef struct run {
  const scenario_t *sc;
  stack_t_ *s;
  bool data;           /* the memory may be written */
  bool exact;          /* no other caller: the layers' books must match ours */
  bool injecting;      /* a failure is legitimate */
  rmmc_status_t alloc_status, other_status; /* injected (other: SUCCESS for none) */
  uint64_t rng, next_tag;
  block_t live[LIVE_MAX];
  size_t nlive;
  uint64_t alloc_calls, free_calls, failures, steps;
  cudaStream_t own_stream; /* threads: a stream key of their own (0: the three above) */
  char err[512];
} run_t;

static bool flag(run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool flag(run_t *r, const char *fmt, ...) {
  if (r->err[0] == '\0') {
    int n = snprintf(r->err, sizeof r->err, "%s, step %llu: ", r->sc->name,
                     (unsigned long long)r->steps);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof r->err) vsnprintf(r->err + n, sizeof r->err - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return false;
}
#define EXPECT(r, cond, ...) ((cond) ? true : flag((r), __VA_ARGS__))

static uint64_t rnd(run_t *r) { /* xorshift64* */
  r->rng ^= r->rng >> 12;
  r->rng ^= r->rng << 25;
  r->rng ^= r->rng >> 27;
  return r->rng * 0x2545F4914F6CDD1DULL;
}

static size_t pick_size(run_t *r) {
  uint64_t x = rnd(r) % 100;
  size_t top = x < 65 ? r->sc->small : x < 92 ? 16 * r->sc->small : r->sc->big;
  if (top > r->sc->big) top = r->sc->big;
  return 1 + (size_t)(rnd(r) % top);
}

static size_t pick_align(run_t *r) {
  if (rnd(r) % 4 != 0) return RMMC_DEFAULT_ALIGNMENT;
  size_t a = RMMC_DEFAULT_ALIGNMENT;
  while (a < r->sc->max_align && rnd(r) % 2) a *= 2;
  return a;
}

static cudaStream_t pick_stream(run_t *r) {
  return r->own_stream != NULL ? r->own_stream : streams[rnd(r) % 3];
}

/* Writes (or checks) the block's pattern: every word of small blocks; the
 * first and last 4 KiB and one word per 4 KiB of large ones. */
static bool pattern(run_t *r, const block_t *b, bool write) {
  if (!r->data) return true;
  uint64_t *w = b->p;
  size_t n = b->bytes / 8;
  uint64_t seed = b->tag * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < n;) {
    uint64_t v = seed ^ i;
    if (write) w[i] = v;
    else if (w[i] != v)
      return flag(r, "block %p (%zu bytes, tag %llu) corrupted at word %zu", b->p, b->bytes,
                  (unsigned long long)b->tag, i);
    i = n <= 2048 || i < 512 || i + 512 >= n ? i + 1 : (i + 512 < n - 512 ? i + 512 : n - 512);
  }
  unsigned char *tail = (unsigned char *)b->p + n * 8;
  for (size_t i = 0; i < b->bytes % 8; i++) {
    if (write) tail[i] = (unsigned char)b->tag;
    else if (tail[i] != (unsigned char)b->tag) return flag(r, "block %p tail corrupted", b->p);
  }
  return true;
}

static bool check_all(run_t *r) {
  for (size_t i = 0; i < r->nlive; i++)
    if (!pattern(r, &r->live[i], false)) return false;
  return true;
}

/* A failed call: a status this mode allows, a message, and nothing the
 * caller holds changed. */
static bool failed(run_t *r, rmmc_status_t st, bool is_alloc, const char *what) {
  r->failures++;
  bool allowed = r->injecting &&
                 ((is_alloc && (st == RMMC_ERROR_OUT_OF_MEMORY || st == r->alloc_status)) ||
                  (r->other_status != RMMC_SUCCESS && st == r->other_status));
  return EXPECT(r, allowed, "%s returned %s (%s)%s", what, rmmc_status_name(st),
                rmmc_last_error_message(), r->injecting ? "" : " with no fault injected") &&
         EXPECT(r, rmmc_last_error_message()[0] != '\0', "%s returned %s with no message", what,
                rmmc_status_name(st)) &&
         check_all(r);
}

static bool do_alloc(run_t *r) {
  block_t b = {.bytes = pick_size(r), .align = pick_align(r), .stream = pick_stream(r)};
  void *p = (void *)&b;
  rmmc_clear_last_error();
  r->alloc_calls++;
  rmmc_status_t st = rmmc_resource_allocate(r->s->top, b.bytes, b.align, b.stream, &p);
  if (st != RMMC_SUCCESS)
    return EXPECT(r, p == NULL, "a failed allocate gave %p", p) &&
           failed(r, st, true, "allocate");
  size_t align = b.align > RMMC_DEFAULT_ALIGNMENT ? b.align : RMMC_DEFAULT_ALIGNMENT;
  if (!EXPECT(r, p != NULL && (uintptr_t)p % align == 0, "allocate(%zu, %zu) gave %p", b.bytes,
              b.align, p))
    return false;
  b.p = p;
  b.tag = ++r->next_tag;
  pattern(r, &b, true);
  r->live[r->nlive++] = b;
  return true;
}

static bool do_free(run_t *r, size_t i) {
  block_t b = r->live[i];
  if (!pattern(r, &b, false)) return false;
  /* Mostly on the allocating stream, sometimes on another one. */
  cudaStream_t stream = r->own_stream == NULL && rnd(r) % 5 == 0 ? streams[rnd(r) % 3] : b.stream;
  rmmc_clear_last_error();
  r->free_calls++;
  rmmc_status_t st = rmmc_resource_deallocate(r->s->top, b.p, b.bytes, b.align, stream);
  if (st != RMMC_SUCCESS) return failed(r, st, false, "deallocate"); /* the caller still holds it */
  r->live[i] = r->live[--r->nlive];
  return true;
}

static bool do_release(run_t *r) {
  rmmc_clear_last_error();
  rmmc_status_t st = rmmc_resource_release_cached(r->s->top);
  return st == RMMC_SUCCESS || failed(r, st, false, "release_cached");
}

static bool is_suballocator(const char *name) {
  return !strcmp(name, "pool") || !strcmp(name, "fixed_size") || !strcmp(name, "binning") ||
         !strcmp(name, "arena");
}

/* The layers' books against the callers' (exact: no call in flight, and
 * `nlive`, `bytes`, `rounded` are every caller's; deep: the pool's own
 * checker too, which walks every block). */
static bool check_stack(run_t *r, bool exact, bool deep, size_t nlive, size_t bytes,
                        size_t rounded) {
  bool pass_through = true, suballocator = false;
  for (rmmc_resource_t *l = r->s->top; l != r->s->faulty; l = rmmc_resource_upstream(l)) {
    const char *name = rmmc_resource_name(l);
    if (deep && !strcmp(name, "pool")) {
      rmmc_status_t st = rmmc_pool_resource_check(l);
      if (!EXPECT(r, st == RMMC_SUCCESS, "pool check: %s", rmmc_last_error_message())) return false;
    }
    if (!exact) continue;
    if (pass_through && !strcmp(name, "tracking")) {
      size_t n = rmmc_tracking_adaptor_get_outstanding_count(l);
      size_t b = rmmc_tracking_adaptor_get_outstanding_bytes(l);
      if (!EXPECT(r, n == nlive && b == bytes, "tracking: %zu blocks, %zu bytes; caller: %zu, %zu", n,
                  b, nlive, bytes))
        return false;
    }
    if (pass_through && !strcmp(name, "statistics")) {
      rmmc_statistics_t s = RMMC_STATISTICS_INIT;
      ck_assert_int_eq(rmmc_statistics_adaptor_get(l, &s), RMMC_SUCCESS);
      if (!EXPECT(r, s.current_count == (int64_t)nlive && s.current_bytes == (int64_t)bytes,
                  "statistics: %lld blocks, %lld bytes; caller: %zu, %zu",
                  (long long)s.current_count, (long long)s.current_bytes, nlive, bytes))
        return false;
    }
    if (pass_through && !strcmp(name, "limiting")) {
      size_t used = rmmc_limiting_adaptor_get_used(l);
      if (!EXPECT(r, used == rounded, "limiting: %zu used; caller: %zu", used, rounded)) return false;
    }
    if (!strcmp(name, "pool") && !strcmp(rmmc_resource_name(rmmc_resource_upstream(l)), "vmspy")) {
      /* Virtual memory: what the pool counts is what the vmspy has mapped,
       * which is what the spy holds for it; no call was malformed. */
      rmmc_resource_t *vm = rmmc_resource_upstream(l);
      vmspy_counts_t v = vmspy_counts(vm);
      uint64_t reserved = field(l, "reserved");
      uint64_t held = spy_counts(spy_of(r->s->base)).outstanding_bytes;
      if (!EXPECT(r, v.errors == 0, "the vmspy refused %llu malformed calls",
                  (unsigned long long)v.errors) ||
          !EXPECT(r, reserved == v.mapped_bytes && (!exact || held == v.mapped_bytes),
                  "pool reserves %llu bytes, the vmspy maps %zu, the spy holds %llu",
                  (unsigned long long)reserved, v.mapped_bytes, (unsigned long long)held))
        return false;
    }
    if (is_suballocator(name)) {
      suballocator = true;
      if (rmmc_resource_upstream(l) == r->s->faulty && r->sc->base != BASE_SIM) {
        uint64_t reserved = field(l, "reserved");
        uint64_t direct = 0; /* binning's "reserved" is its bins'; it serves the rest directly */
        if (rmmc_resource_get_field(l, "upstream_in_use", &direct)) reserved += direct;
        uint64_t held = spy_counts(spy_of(r->s->base)).outstanding_bytes;
        if (!EXPECT(r, reserved == held, "%s reserves %llu bytes, the spy has %llu out", name,
                    (unsigned long long)reserved, (unsigned long long)held))
          return false;
      }
    }
    if (strcmp(name, "statistics") && strcmp(name, "tracking") && strcmp(name, "limiting") &&
        strcmp(name, "vmspy") &&
        strcmp(name, "logging") && strcmp(name, "failure_callback") && strcmp(name, "thread_safe") &&
        strcmp(name, "prefetch"))
      pass_through = false;
  }
  if (r->sc->base == BASE_SIM) return true;
  spy_counts_t c = spy_counts(spy_of(r->s->base));
  if (!EXPECT(r, c.deallocate_errors == 0, "the spy saw %llu bad frees",
              (unsigned long long)c.deallocate_errors))
    return false;
  return !exact || suballocator ||
         EXPECT(r, c.outstanding == nlive, "the spy has %llu blocks out; caller: %zu",
                (unsigned long long)c.outstanding, nlive);
}

static void books(const run_t *runs, size_t nruns, size_t *n, size_t *bytes, size_t *rounded) {
  *n = *bytes = *rounded = 0;
  for (size_t k = 0; k < nruns; k++)
    for (size_t i = 0; i < runs[k].nlive; i++) {
      const block_t *b = &runs[k].live[i];
      size_t a = b->align > RMMC_DEFAULT_ALIGNMENT ? b->align : RMMC_DEFAULT_ALIGNMENT;
      (*n)++;
      *bytes += b->bytes;
      *rounded += (b->bytes + a - 1) / a * a;
    }
}

static uint64_t upstream_calls(faulty_t *f) {
  faulty_counts_t c = faulty_counts(f);
  return c.allocate_calls + c.deallocate_calls + c.release_calls;
}

static bool workload(run_t *r, int steps) {
  faulty_t *f = faulty_of(r->s->faulty);
  for (int k = 0; k < steps; k++, r->steps++) {
    uint64_t x = rnd(r) % 100, failures = r->failures, upstream = upstream_calls(f);
    bool ok;
    if (r->nlive == 0 || (x < 55 && r->nlive < LIVE_MAX)) ok = do_alloc(r);
    else if (x < 97) ok = do_free(r, (size_t)(rnd(r) % r->nlive));
    else ok = do_release(r);
    if (ok && k % 16 == 15) ok = check_all(r);
    size_t n, bytes, rounded;
    books(r, 1, &n, &bytes, &rounded);
    /* The pool's checker walks every block: after each step that reached
     * the upstream (where faults strike) or failed, and every 8th. */
    bool deep = k % 8 == 7 || r->failures != failures || upstream_calls(f) != upstream;
    if (!ok || !check_stack(r, r->exact, deep, n, bytes, rounded)) return false;
  }
  return true;
}

/* Frees everything the callers hold, with injection off: must succeed. */
static bool drain(run_t *r) {
  r->injecting = false;
  if (!check_all(r)) return false;
  while (r->nlive > 0)
    if (!do_free(r, r->nlive - 1)) return false;
  return true;
}

static size_t count_lines(FILE *f) {
  rewind(f);
  size_t n = 0;
  for (int ch; (ch = fgetc(f)) != EOF;) n += ch == '\n';
  return n;
}

/* Everything freed: release_cached succeeds and the base holds nothing;
 * the stack is released and the spy destroyed with it. */
static void finish_stack(run_t *r, stack_t_ *s, uint64_t allocs, uint64_t frees) {
  ck_assert_msg(rmmc_resource_release_cached(s->top) == RMMC_SUCCESS, "%s: release_cached: %s",
                r->sc->name, rmmc_last_error_message());
  ck_assert_msg(check_stack(r, true, true, 0, 0, 0), "%s", r->err);
  if (r->sc->base == BASE_SIM)
    ck_assert_uint_eq(field(s->base, "outstanding"), 0);
  else
    ck_assert_uint_eq(spy_counts(spy_of(s->base)).outstanding, 0);
  rmmc_resource_release(s->top);
  if (log_file != NULL) {
    /* The header, then one line per allocate (failed ones too) and free. */
    ck_assert_uint_eq(count_lines(log_file), 1 + allocs + frees);
    fclose(log_file);
    log_file = NULL;
  }
  ck_assert_int_eq(rmmc_resource_refcount(s->faulty), 1);
  rmmc_resource_release(s->faulty);
  ck_assert_int_eq(rmmc_resource_refcount(s->base), 1);
  if (r->sc->base != BASE_SIM) {
    spy_counts_t c = spy_counts(spy_of(s->base));
    ck_assert_uint_eq(c.outstanding, 0);
    ck_assert_uint_eq(c.deallocate_errors, 0);
    uint64_t destroyed = spy_destroyed_total();
    rmmc_resource_release(s->base);
    ck_assert_uint_eq(spy_destroyed_total(), destroyed + 1);
  } else {
    rmmc_resource_release(s->base);
  }
}

/* ---- the tests ---- */

/* The N to run: 1..64, 100, 1000, 10000; with RMMC_TEST_QUICK set (the
 * valgrind pass, 20-50x slower) 1..8 and a spread of larger N. */
static size_t n_values(uint64_t *n) {
  static const uint64_t quick[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 100, 1000, 10000};
  const char *q = getenv("RMMC_TEST_QUICK");
  if (q != NULL && *q != '\0' && strcmp(q, "0") != 0) {
    memcpy(n, quick, sizeof quick);
    return sizeof quick / sizeof quick[0];
  }
  size_t k = 0;
  for (uint64_t i = 1; i <= 64; i++) n[k++] = i;
  n[k++] = 100;
  n[k++] = 1000;
  n[k++] = 10000;
  return k;
}

typedef struct totals {
  uint64_t injected, seen;
} totals_t;

/* One scenario, one N, one mode (all: deallocate and release_cached fail
 * too, with RMMC_ERROR_CUDA; allocate fails with out of memory, or with
 * RMMC_ERROR_CUDA for odd N, which sub-allocators must not retry). */
static void one_run(const scenario_t *sc, uint64_t n, bool all, totals_t *t) {
  stack_t_ s;
  stack_build(sc, &s);
  run_t *r = calloc(1, sizeof *r);
  ck_assert_ptr_nonnull(r);
  *r = (run_t){.sc = sc, .s = &s, .data = sc->base != BASE_SIM, .exact = true, .injecting = true,
               .rng = 0x9E3779B97F4A7C15ULL ^ (n * 1000003 + (all ? 7 : 0)),
               .alloc_status = all && n % 2 ? RMMC_ERROR_CUDA : RMMC_ERROR_OUT_OF_MEMORY,
               .other_status = all ? RMMC_ERROR_CUDA : RMMC_SUCCESS};
  faulty_t *f = faulty_of(s.faulty);
  faulty_fail_every(f, FAULTY_ALLOCATE, r->alloc_status, n);
  if (all) {
    faulty_fail_every(f, FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, n);
    faulty_fail_every(f, FAULTY_RELEASE, RMMC_ERROR_CUDA, n);
  }
  bool ok = workload(r, FAULT_STEPS);
  faulty_disarm(f);
  ck_assert_msg(ok, "N=%llu%s: %s", (unsigned long long)n, all ? " (all kinds)" : "", r->err);
  faulty_counts_t fc = faulty_counts(f);
  t->injected += fc.allocate_injected + fc.deallocate_injected + fc.release_injected;
  t->seen += r->failures;
  /* Faults stop: free what the caller holds, give everything back, then a
   * fresh workload must succeed call by call. */
  ck_assert_msg(drain(r), "N=%llu after injection: %s", (unsigned long long)n, r->err);
  ck_assert_msg(rmmc_resource_release_cached(s.top) == RMMC_SUCCESS, "%s: %s", sc->name,
                rmmc_last_error_message());
  ck_assert_msg(check_stack(r, true, true, 0, 0, 0), "%s", r->err);
  if (sc->base != BASE_SIM)
    ck_assert_msg(spy_counts(spy_of(s.base)).outstanding == 0,
                  "%s, N=%llu%s: %llu blocks still held after everything was freed and released",
                  sc->name, (unsigned long long)n, all ? " (all kinds)" : "",
                  (unsigned long long)spy_counts(spy_of(s.base)).outstanding);
  r->failures = 0;
  ck_assert_msg(workload(r, FRESH_STEPS) && drain(r), "N=%llu, fresh workload: %s",
                (unsigned long long)n, r->err);
  ck_assert_uint_eq(r->failures, 0);
  finish_stack(r, &s, r->alloc_calls, r->free_calls);
  free(r);
}

START_TEST(test_fault_injection_every_nth) {
  const scenario_t *sc = &scenarios[_i];
  totals_t t = {0, 0};
  uint64_t n[80];
  size_t count = n_values(n);
  for (size_t i = 0; i < count; i++) {
    one_run(sc, n[i], false, &t);
    one_run(sc, n[i], true, &t);
  }
  /* The injections happened and some reached the caller. */
  ck_assert_msg(t.injected > 0, "%s: no fault was ever injected", sc->name);
  ck_assert_msg(t.seen > 0, "%s: no failure ever reached the caller", sc->name);
}
END_TEST

/* A failed upstream deallocate inside a sub-allocator's release_cached: the
 * chunk stays cached and is given back by the next release_cached, once. */
START_TEST(test_fault_injection_release_keeps_chunk) {
  static const builder_t subs[] = {b_pool, b_fixed_size, b_binning, b_arena, b_vmspy};
  scenario_t sc = {"release", {subs[_i]}, BASE_SPY, 4 * KiB, 256, 4 * KiB};
  sc.name = _i == 0 ? "pool" : _i == 1 ? "fixed_size" : _i == 2 ? "binning" : _i == 3 ? "arena"
                                                                             : "pool (virtual memory)";
  if (_i == 4) sc.layers[1] = b_pool_vm;
  stack_t_ s;
  stack_build(&sc, &s);
  spy_t *spy = spy_of(s.base);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(s.top, 4 * KiB, 256, NULL, &p), RMMC_SUCCESS);
  memset(p, 0x5a, 4 * KiB);
  ck_assert_int_eq(rmmc_resource_deallocate(s.top, p, 4 * KiB, 256, NULL), RMMC_SUCCESS);
  spy_counts_t before = spy_counts(spy);
  ck_assert_uint_gt(before.outstanding, 0);
  faulty_fail_deallocate(faulty_of(s.faulty), RMMC_ERROR_CUDA, 1);
  rmmc_clear_last_error();
  ck_assert_int_eq(rmmc_resource_release_cached(s.top), RMMC_ERROR_CUDA);
  ck_assert_str_eq(rmmc_last_error_message(), "faulty: injected ERROR_CUDA");
  spy_counts_t mid = spy_counts(spy);
  /* Nothing was lost: the figure still counts what the spy still holds. */
  ck_assert_uint_eq(field(s.top, "reserved"), mid.outstanding_bytes);
  ck_assert_uint_gt(mid.outstanding, 0);
  /* It still serves, from the kept chunk, and gives it back next time. */
  ck_assert_int_eq(rmmc_resource_allocate(s.top, 4 * KiB, 256, NULL, &p), RMMC_SUCCESS);
  memset(p, 0xa5, 4 * KiB);
  ck_assert_int_eq(rmmc_resource_deallocate(s.top, p, 4 * KiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(s.top), RMMC_SUCCESS);
  spy_counts_t after = spy_counts(spy);
  ck_assert_uint_eq(after.outstanding, 0);
  ck_assert_uint_eq(after.deallocate_errors, 0);
  ck_assert_uint_eq(field(s.top, "reserved"), 0);
  run_t r = {.sc = &sc, .s = &s, .exact = true};
  finish_stack(&r, &s, 0, 0);
}
END_TEST

/* ---- 8 threads over thread-safe stacks ---- */

#define NTHREADS 8

static void *thread_main(void *arg) {
  run_t *r = arg;
  workload(r, FAULT_STEPS);
  return NULL;
}

static const scenario_t mt_scenarios[] = {
    {"mt statistics>limiting>binning>pool", {b_pool, b_binning, b_limiting, b_statistics}, BASE_SPY,
     2 * MiB, 8 * KiB, 4 * KiB},
    {"mt tracking>arena", {b_arena, b_tracking}, BASE_SPY, 512 * KiB, 64 * KiB, 4 * KiB},
    {"mt logging>failure_callback>aligned>fixed_size", {b_fixed_size_8k, b_aligned, b_failure_callback, b_logging},
     BASE_SPY, 4 * KiB, 4 * KiB, 4 * KiB},
    {"mt thread_safe>pool", {b_pool, b_thread_safe}, BASE_SPY, 3 * MiB, 64 * KiB, 4 * KiB},
    {"mt pool", {b_pool}, BASE_SPY, 3 * MiB, 64 * KiB, 4 * KiB},
    {"mt pool (virtual memory)", {b_vmspy, b_pool_vm}, BASE_SPY, 3 * MiB, 64 * KiB, 4 * KiB},
};

START_TEST(test_fault_injection_threads) {
  const scenario_t *sc = &mt_scenarios[_i];
  static const uint64_t ns[] = {1, 2, 3, 5, 8, 13, 64, 1000};
  uint64_t seen = 0;
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    stack_t_ s;
    stack_build(sc, &s);
    faulty_t *f = faulty_of(s.faulty);
    faulty_fail_every(f, FAULTY_ALLOCATE, RMMC_ERROR_OUT_OF_MEMORY, ns[k]);
    faulty_fail_every(f, FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, ns[k]);
    faulty_fail_every(f, FAULTY_RELEASE, RMMC_ERROR_CUDA, ns[k]);
    run_t *runs = calloc(NTHREADS, sizeof *runs);
    ck_assert_ptr_nonnull(runs);
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
      runs[t] = (run_t){.sc = sc, .s = &s, .data = true, .exact = false, .injecting = true,
                        .rng = 0x51ED2701ULL * (uint64_t)(t + 1) + ns[k],
                        .alloc_status = RMMC_ERROR_OUT_OF_MEMORY, .other_status = RMMC_ERROR_CUDA,
                        .own_stream = (cudaStream_t)(uintptr_t)(0x7000 + 0x100 * t)};
      ck_assert_int_eq(pthread_create(&th[t], NULL, thread_main, &runs[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++) ck_assert_int_eq(pthread_join(th[t], NULL), 0);
    faulty_disarm(f);
    uint64_t allocs = 0, frees = 0;
    for (int t = 0; t < NTHREADS; t++) {
      ck_assert_msg(runs[t].err[0] == '\0', "N=%llu thread %d: %s", (unsigned long long)ns[k], t,
                    runs[t].err);
      seen += runs[t].failures;
    }
    size_t n, bytes, rounded;
    books(runs, NTHREADS, &n, &bytes, &rounded);
    ck_assert_msg(check_stack(&runs[0], true, true, n, bytes, rounded), "N=%llu: %s",
                  (unsigned long long)ns[k], runs[0].err);
    for (int t = 0; t < NTHREADS; t++) {
      ck_assert_msg(drain(&runs[t]), "N=%llu thread %d: %s", (unsigned long long)ns[k], t, runs[t].err);
      allocs += runs[t].alloc_calls;
      frees += runs[t].free_calls;
    }
    finish_stack(&runs[0], &s, allocs, frees);
    free(runs);
  }
  ck_assert_uint_gt(seen, 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fault_injection");
  TCase *tc = tcase_create("every_nth");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_fault_injection_every_nth, 0, NSCENARIOS);
  tcase_add_loop_test(tc, test_fault_injection_release_keeps_chunk, 0, 5);
  tcase_add_loop_test(tc, test_fault_injection_threads, 0,
                      (int)(sizeof mt_scenarios / sizeof mt_scenarios[0]));
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
