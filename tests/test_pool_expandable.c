/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's virtual-memory backend (expandable, the default over an
 * upstream with virtual memory) over a checked virtual-memory upstream
 * (tests/support/vmspy.h over a spy), over host (real memory) and over sim
 * (figures only), with no GPU: the conformance battery; the choice of
 * backend; every invariant after every step of random runs on one thread
 * and on many, with a maximum and capped upstreams; growth in place within
 * the budget; pages given back by release_cached and before mapping more,
 * with the data of live blocks kept; hysteresis (phases repeat with no
 * mapping); pressure under limiting; a thread's idle spans reused after it
 * exits; failed mappings (cured by the last resort or not); the maximum;
 * more reservations; the figures; bad options; the virtual-memory calls;
 * destroy with live blocks; the spec over host and sim. Host suite.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"
#include "faulty.h"
#include "pool_util.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"
#include "vmspy.h"

#define PAGE (64 * KiB) /* the pool's page= (most bytes per mapping) in these tests */

/* A pool with expandable=1 and `o`'s other options over a vmspy (4 KiB
 * pages) over `up`; page= is PAGE unless `o` sets another than the
 * default; *vm gets the vmspy (borrowed: the pool holds it). */
static rmmc_status_t make_over(rmmc_resource_t *up, rmmc_pool_options_t *o, rmmc_resource_t **vm,
                               rmmc_resource_t **out) {
  rmmc_resource_t *v;
  rmmc_status_t st = vmspy_create(up, 4 * KiB, &v);
  if (st != RMMC_SUCCESS) return st;
  o->expandable = 1;
  rmmc_pool_options_t defaults = RMMC_POOL_OPTIONS_INIT;
  if (o->page_size == defaults.page_size) o->page_size = PAGE;
  if (o->address_space == 0) o->address_space = 256 * MiB;
  st = rmmc_pool_resource_create(v, o, out);
  if (vm != NULL) *vm = v;
  rmmc_resource_release(v);
  return st;
}

/* ---- conformance ---- */

/* make_over with a faulty layer between the vmspy and `up`, so that the
 * battery can refuse the pool's unmaps and maps (its sleep checks). */
static rmmc_status_t make_conf(rmmc_resource_t *up, rmmc_pool_options_t *o, rmmc_resource_t **out) {
  rmmc_resource_t *fy;
  rmmc_status_t st = faulty_create(up, &fy);
  if (st != RMMC_SUCCESS) return st;
  st = make_over(fy, o, NULL, out);
  rmmc_resource_release(fy);
  return st;
}

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  return make_conf(up, &o, out);
}

static rmmc_status_t make_tight(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.release_slack = 0.0;
  o.small_max = 16 * KiB;
  o.small_chunk = 128 * KiB;
  o.cache_size = 0;
  o.address_space = 16 * MiB; /* requests past it take more reservations */
  return make_conf(up, &o, out);
}

static rmmc_status_t make_unseparated(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.initial_size = 1 * MiB;
  o.event_interval = 64;
  return make_conf(up, &o, out);
}

static const conformance_case_t cases[] = {
    {"pool(expandable=true,page=64KiB)", make_default, 0},
    {"pool(expandable=true,release_slack=0,small_max=16KiB,cache=0,address_space=16MiB)",
     make_tight, 0},
    {"pool(expandable=true,small_max=0,release_before_grow=false,initial=1MiB,event_interval=64)",
     make_unseparated, 0},
};

/* ---- fixture: pool > vmspy > spy ---- */

typedef struct fix {
  rmmc_resource_t *spy, *vm, *pool;
} fix_t;

static void fix_open(fix_t *f, rmmc_pool_options_t *o) {
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f->spy), RMMC_SUCCESS);
  rmmc_status_t st = make_over(f->spy, o, &f->vm, &f->pool);
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  CHECK_POOL(f->pool);
}

/* The caller freed its blocks. Everything goes back, no upstream call was
 * refused as malformed, nothing leaks. */
static void fix_close(fix_t *f) {
  CHECK_POOL(f->pool);
  ck_assert_int_eq(rmmc_resource_release_cached(f->pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f->pool, "reserved"), 0);
  ck_assert_uint_eq(field(f->pool, "mappings"), 0);
  ck_assert_uint_eq(vmspy_counts(f->vm).mapped_bytes, 0);
  ck_assert_uint_eq(vmspy_counts(f->vm).errors, 0);
  rmmc_resource_release(f->pool);
  spy_counts_t c = spy_counts(spy_of(f->spy));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(f->spy);
}

static void *alloc_ok(rmmc_resource_t *r, size_t bytes, cudaStream_t s) {
  void *p = NULL;
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, 256, s, &p);
  ck_assert_msg(st == RMMC_SUCCESS, "allocate %zu: %s", bytes, rmmc_last_error_message());
  return p;
}

static void free_ok(rmmc_resource_t *r, void *p, size_t bytes, cudaStream_t s) {
  rmmc_status_t st = rmmc_resource_deallocate(r, p, bytes, 256, s);
  ck_assert_msg(st == RMMC_SUCCESS, "free %p + %zu: %s", p, bytes, rmmc_last_error_message());
}

static void expect_backend(rmmc_resource_t *pool, const char *want) {
  char got[32] = "";
  ck_assert(pool_text(pool, "backend", got, sizeof got));
  ck_assert_str_eq(got, want);
}

/* ---- the backend ---- */

START_TEST(test_pool_vm_backend_follows_the_upstream) {
  /* expandable=-1 (the default): virtual memory over host, sim, a vmspy and
   * limiting over host; chunks over a spy or an adaptor without virtual
   * memory; expandable=0: chunks over anything. */
  static const struct {
    const char *spec, *backend;
  } cases_[] = {
      {"pool > host", "virtual memory"},
      {"pool > sim", "virtual memory"},
      {"pool > limiting(limit=64MiB) > host", "virtual memory"},
      {"pool > statistics > host", "chunks"},
      {"pool(expandable=false) > host", "chunks"},
      {"pool(expandable=false) > sim", "chunks"},
      {"pool(expandable=true) > host", "virtual memory"},
  };
  for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0]; i++) {
    rmmc_resource_t *r;
    ck_assert_msg(rmmc_stack_create(cases_[i].spec, -1, &r) == RMMC_SUCCESS, "%s: %s",
                  cases_[i].spec, rmmc_last_error_message());
    expect_backend(r, cases_[i].backend);
    void *p = alloc_ok(r, 3 * MiB, NULL);
    free_ok(r, p, 3 * MiB, NULL);
    uint64_t unused;
    ck_assert_int_eq(rmmc_resource_get_field(r, "page_maps", &unused),
                     strcmp(cases_[i].backend, "virtual memory") == 0);
    rmmc_resource_release(r);
  }
  /* Over a vmspy: -1 maps pages, 0 takes chunks with allocate. */
  for (int e = -1; e <= 0; e++) {
    rmmc_resource_t *spy = new_spy(), *vm, *pool;
    ck_assert_int_eq(vmspy_create(spy, 4 * KiB, &vm), RMMC_SUCCESS);
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.expandable = e;
    ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &pool), RMMC_SUCCESS);
    void *p = alloc_ok(pool, 3 * MiB, NULL);
    ck_assert_uint_eq(vmspy_counts(vm).maps > 0, e == -1);
    ck_assert_uint_eq(vmspy_counts(vm).reserves, e == -1 ? 1 : 0);
    expect_backend(pool, e == -1 ? "virtual memory" : "chunks");
    free_ok(pool, p, 3 * MiB, NULL);
    rmmc_resource_release(pool);
    ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
    ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
    rmmc_resource_release(vm);
    finish(NULL, spy);
  }
}
END_TEST

/* ---- invariants: random runs ---- */

START_TEST(test_pool_vm_random_run_keeps_invariants) {
  pool_run_t run = {.seed = 11u, .steps = 2500, .max_live = 120, .nstreams = 3,
                    .small_max = 1 * MiB, .max_bytes = 12 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 300};
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  pool_run_result_t r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.foreign_frees, pool_steps(2500) / 25);
  ck_assert_uint_gt(field(f.pool, "page_unmaps"), 0);
  fix_close(&f);

  /* Tight: no slack, small spans, no cache, several reservations. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.release_slack = 0.0;
  o.small_max = 32 * KiB;
  o.small_chunk = 256 * KiB;
  o.cache_size = 0;
  o.address_space = 32 * MiB;
  fix_open(&f, &o);
  run = (pool_run_t){.seed = 12u, .steps = 2500, .max_live = 48, .nstreams = 4,
                     .small_max = 32 * KiB, .max_bytes = 3 * MiB, .max_align = 64 * KiB,
                     .real = true, .release_every = 500};
  (void)pool_random_run(f.pool, &run);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_random_run_over_host_and_sim) {
  /* Default options over host (real pages) and sim (figures only, larger
   * requests). */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(page=1MiB) > host", -1, &r), RMMC_SUCCESS);
  pool_run_t run = {.seed = 21u, .steps = 2000, .max_live = 100, .nstreams = 3,
                    .small_max = 1 * MiB, .max_bytes = 24 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 300};
  (void)pool_random_run(r, &run);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  rmmc_resource_release(r);

  ck_assert_int_eq(rmmc_stack_create("pool > sim", -1, &r), RMMC_SUCCESS);
  rmmc_resource_t *sim = rmmc_resource_upstream(r);
  run = (pool_run_t){.seed = 22u, .steps = 2000, .max_live = 100, .nstreams = 4,
                     .small_max = 1 * MiB, .max_bytes = 512 * MiB, .max_align = 64 * KiB,
                     .real = false, .release_every = 300};
  (void)pool_random_run(r, &run);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  ck_assert_uint_eq(field(sim, "in_use"), 0);
  rmmc_resource_release(r);

  /* Growths of up to 2 GiB on a full device: the default page's larger
   * segments (up to 256 MiB here), given back and refused. */
  ck_assert_int_eq(rmmc_stack_create("pool > sim(capacity=6GiB)", -1, &r), RMMC_SUCCESS);
  sim = rmmc_resource_upstream(r);
  run = (pool_run_t){.seed = 23u, .steps = 1500, .max_live = 12, .nstreams = 3,
                     .small_max = 1 * MiB, .max_bytes = (size_t)2 << 30, .max_align = 64 * KiB,
                     .real = false, .oom_ok = true, .release_every = 200};
  (void)pool_random_run(r, &run);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_gt(field(r, "page_unmaps"), 0); /* (a quick run may give back only here) */
  ck_assert_uint_eq(field(r, "reserved"), 0);
  ck_assert_uint_eq(field(sim, "in_use"), 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_pool_vm_random_run_with_maximum_keeps_invariants) {
  /* A maximum over the vmspy. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.maximum_size = 16 * MiB;
  o.small_chunk = 1 * MiB;
  o.small_max = 128 * KiB;
  fix_open(&f, &o);
  pool_run_t run = {.seed = 31u, .steps = 2500, .max_live = 80, .nstreams = 3,
                    .small_max = 128 * KiB, .max_bytes = 6 * MiB, .max_align = 64 * KiB,
                    .real = true, .oom_ok = true, .release_every = 500,
                    .maximum = 16 * MiB};
  pool_run_result_t r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.ooms, 0);
  ck_assert_uint_le(field(f.pool, "reserved_peak"), 16 * MiB);
  ck_assert_uint_le(vmspy_counts(f.vm).peak_mapped_bytes, 16 * MiB);
  fix_close(&f);

  /* A capped upstream: the spy under the vmspy refuses past 20 MiB. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  spy_set_capacity(spy_of(f.spy), 20 * MiB);
  run.seed = 32u;
  run.small_max = 1 * MiB;
  run.max_bytes = 8 * MiB;
  run.maximum = 20 * MiB;
  r = pool_random_run(f.pool, &run);
  ck_assert_int_gt(r.ooms, 0);
  /* Refused growths gave back what they lacked (vm.c) amid the rest. */
  ck_assert_uint_gt(field(f.pool, "refusal_trims"), 0);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  fix_close(&f);

  /* sim with a capacity, and limiting over host. */
  const char *specs[] = {"pool > sim(capacity=256MiB)", "pool > limiting(limit=24MiB) > host"};
  const size_t caps[] = {256 * MiB, 24 * MiB}, big[] = {96 * MiB, 8 * MiB};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *p;
    ck_assert_msg(rmmc_stack_create(specs[k], -1, &p) == RMMC_SUCCESS, "%s: %s", specs[k],
                  rmmc_last_error_message());
    run = (pool_run_t){.seed = 33u + (unsigned)k, .steps = 2000, .max_live = 60, .nstreams = 3,
                       .small_max = 1 * MiB, .max_bytes = big[k], .max_align = 64 * KiB,
                       .real = k == 1, .oom_ok = true, .release_every = 400,
                       .maximum = caps[k]};
    r = pool_random_run(p, &run);
    ck_assert_int_gt(r.ooms, 0);
    ck_assert_int_eq(rmmc_resource_release_cached(p), RMMC_SUCCESS);
    ck_assert_uint_eq(field(p, "reserved"), 0);
    rmmc_resource_release(p);
  }
}
END_TEST

START_TEST(test_pool_vm_threads_keep_invariants) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = 256 * KiB;
  o.small_max = 64 * KiB;
  o.cache_size = 512 * KiB;
  fix_open(&f, &o);
  pool_run_t run = {.seed = 41u, .steps = 6000, .max_live = 64, .nstreams = 2,
                    .small_max = 64 * KiB, .max_bytes = 4 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 2000};
  pool_mt_result_t r = pool_threaded_run(f.pool, &run, 8);
  ck_assert_int_gt(r.checks, pool_steps(40));
  ck_assert_int_gt(r.handoffs, pool_steps(40));
  fix_close(&f);

  /* Over host, with a maximum. */
  rmmc_resource_t *p;
  ck_assert_int_eq(rmmc_stack_create("pool(max=48MiB, small_chunk=1MiB, small_max=128KiB) > host",
                                     -1, &p),
                   RMMC_SUCCESS);
  run = (pool_run_t){.seed = 42u, .steps = 5000, .max_live = 48, .nstreams = 2,
                     .small_max = 128 * KiB, .max_bytes = 8 * MiB, .max_align = 64 * KiB,
                     .real = true, .oom_ok = true, .release_every = 1500};
  r = pool_threaded_run(p, &run, 8);
  ck_assert_int_gt(r.ooms, 0);
  ck_assert_uint_le(field(p, "reserved_peak"), 48 * MiB);
  rmmc_resource_release(p);
}
END_TEST

START_TEST(test_pool_vm_large_alignments) {
  /* Alignments from 32 B to 64 MiB, past the span and the reservation's
   * own alignment, small and large requests: aligned, data kept, and the
   * pool whole. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.address_space = 32 * MiB;
  fix_open(&f, &o);
  void *p[22];
  for (int i = 0; i < 22; i++) {
    size_t align = (size_t)1 << (i + 5), bytes = i % 2 ? 1000 + (size_t)i * 777 : 3 * MiB + 1;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, bytes, align, STREAM(i % 3), &p[i]),
                     RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p[i] % (align < 256 ? 256 : align), 0);
    pool_fill(p[i], bytes, (unsigned)i);
    CHECK_POOL(f.pool);
  }
  for (int i = 0; i < 22; i++) {
    size_t align = (size_t)1 << (i + 5), bytes = i % 2 ? 1000 + (size_t)i * 777 : 3 * MiB + 1;
    ck_assert(pool_filled(p[i], bytes, (unsigned)i));
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], bytes, align, STREAM(i % 3)),
                     RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
  fix_close(&f);
}
END_TEST

/* ---- growth and giving back ---- */

START_TEST(test_pool_vm_grows_in_place_within_budget) {
  /* A growing workload (a KV cache reallocated larger each step while a
   * scratch block comes and goes) stays in one reservation and, at every
   * step, within (1 + slack) x the peak handed out plus what whole mappings
   * that reach past the live blocks keep (two mappings of at most page=
   * bytes at each end of the three live blocks). */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *cache = NULL;
  size_t cache_n = 0;
  for (unsigned step = 1; step <= 60; step++) {
    size_t n = step * 200 * KiB + 4096;
    void *p = alloc_ok(f.pool, n, NULL);
    pool_fill(p, n, step);
    size_t sn = (61 - step) * 50 * KiB;
    void *scratch = alloc_ok(f.pool, sn, NULL);
    pool_fill(scratch, sn, step + 100);
    if (cache != NULL) {
      ck_assert(pool_filled(cache, cache_n, step - 1));
      free_ok(f.pool, cache, cache_n, NULL);
    }
    ck_assert(pool_filled(scratch, sn, step + 100));
    free_ok(f.pool, scratch, sn, NULL);
    cache = p;
    cache_n = n;
    CHECK_POOL(f.pool);
    uint64_t peak = field(f.pool, "peak"), reserved = field(f.pool, "reserved");
    /* The budget (1.02x) while the peak rises, the steady-state band (1 +
     * 3 x slack) when a step needs no new peak. */
    ck_assert_msg(reserved <= (uint64_t)(1.06 * (double)peak) + 6 * PAGE,
                  "step %u: reserved %llu, peak %llu", step, (unsigned long long)reserved,
                  (unsigned long long)peak);
  }
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  ck_assert_uint_eq(vmspy_counts(f.vm).reserves, 1);
  ck_assert_uint_gt(field(f.pool, "page_unmaps"), 0);
  ck_assert(pool_filled(cache, cache_n, 60));
  free_ok(f.pool, cache, cache_n, NULL);
  fix_close(&f);
}
END_TEST

/* The default page (32 MiB): a large growth maps at most 8 segments, each
 * up to 1 GiB, so refilling a device after empty_cache costs few mapping
 * calls; it still goes back an eighth at a time, and a given page= is the
 * most per mapping, as before. Over sim (no memory behind it). */
static void segments_of_growth(size_t page, size_t n, uint64_t want_maps) {
  rmmc_sim_options_t so = RMMC_SIM_OPTIONS_INIT;
  rmmc_resource_t *sim, *pool;
  ck_assert_int_eq(rmmc_sim_resource_create(&so, &sim), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  o.page_size = page;
  o.small_max = 0;
  o.address_space = (size_t)64 << 30;
  ck_assert_int_eq(rmmc_pool_resource_create(sim, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(sim);
  void *p = alloc_ok(pool, n, NULL);
  CHECK_POOL(pool);
  ck_assert_uint_eq(field(pool, "page_maps"), want_maps);
  ck_assert_uint_eq(field(pool, "mappings"), want_maps);
  ck_assert_uint_eq(field(pool, "reserved"), n);
  free_ok(pool, p, n, NULL);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "page_unmaps"), want_maps); /* every segment went back */
  ck_assert_uint_eq(field(pool, "reserved"), 0);
  rmmc_resource_release(pool);
}

START_TEST(test_pool_vm_default_page_scales_with_the_growth) {
  segments_of_growth(0, 40 * MiB, 2);                /* 32 MiB + 8 MiB, as a fixed page */
  segments_of_growth(0, 1024 * MiB, 8);              /* 8 x 128 MiB, not 32 x 32 MiB */
  segments_of_growth(0, 1000 * MiB, 8);              /* 7 x 125 MiB + the rest */
  segments_of_growth(0, (size_t)12 << 30, 12);       /* 1 GiB each at most */
  segments_of_growth(32 * MiB, 1024 * MiB, 32);      /* page= given: 32 MiB each */
}
END_TEST

START_TEST(test_pool_vm_budget_trim_spares_the_growth_hole) {
  /* [G free 2 MiB][A live 1 MiB][F free 1 MiB][hole], F freed before G,
   * peak 4 MiB: a 3 MiB request grows past the budget at the hole, into F.
   * The budget asks vm_grow for a trim to 2.08 MiB, which vm_grow runs
   * keeping F and the hole: 31 of G's 32 mappings go back (highest first),
   * F's 16 (older, so first in line otherwise) stay, and the block extends
   * F in place, mapping only its 2 MiB shortfall (3 MiB if F had gone). */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *g = alloc_ok(f.pool, 2 * MiB, NULL);
  void *a = alloc_ok(f.pool, MiB, NULL);
  void *fb = alloc_ok(f.pool, MiB, NULL);
  ck_assert((uintptr_t)g < (uintptr_t)a && (uintptr_t)a < (uintptr_t)fb);
  free_ok(f.pool, fb, MiB, NULL);
  free_ok(f.pool, g, 2 * MiB, NULL);
  ck_assert_uint_eq(field(f.pool, "reserved"), 4 * MiB);
  uint64_t unmaps = field(f.pool, "page_unmaps"), maps = field(f.pool, "page_maps");
  void *big = alloc_ok(f.pool, 3 * MiB, NULL);
  CHECK_POOL(f.pool);
  ck_assert_ptr_eq(big, fb);
  ck_assert_uint_eq(field(f.pool, "page_unmaps") - unmaps, 2 * MiB / PAGE - 1);
  ck_assert_uint_eq(field(f.pool, "page_maps") - maps, 2 * MiB / PAGE);
  ck_assert_uint_eq(field(f.pool, "reserved"), 4 * MiB + PAGE);
  free_ok(f.pool, big, 3 * MiB, NULL);
  free_ok(f.pool, a, MiB, NULL);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_steady_band_widens_until_rounds_settle) {
  /* Peak 50 MiB; each round holds B (20 MiB) and needs D (18.75 MiB)
   * where A and C (15 MiB each) were: 53.75 MiB reserved, past the fixed
   * band's 1.06x (53 MiB). At release_band=3 every round gives back (A's
   * pages) and maps again; at the default the band widens by half a slack
   * per give-back (3.5, 4: 1.08x, 54 MiB) and after that the rounds map
   * and unmap nothing. Data survives every move. */
  for (int fixed = 1; fixed >= 0; fixed--) {
    fix_t f;
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    if (fixed) o.release_band = 3.0;
    fix_open(&f, &o);
    const size_t na = 15 * MiB, nb = 20 * MiB, nd = 18 * MiB + 768 * KiB;
    void *peak = alloc_ok(f.pool, 50 * MiB, NULL);
    free_ok(f.pool, peak, 50 * MiB, NULL);
    uint64_t moves_late = 0, shrinks_before = 0;
    for (unsigned round = 1; round <= 8; round++) {
      uint64_t maps = field(f.pool, "page_maps"), unmaps = field(f.pool, "page_unmaps");
      void *a = alloc_ok(f.pool, na, NULL), *b = alloc_ok(f.pool, nb, NULL);
      void *c = alloc_ok(f.pool, na, NULL);
      pool_fill(b, nb, round);
      free_ok(f.pool, a, na, NULL);
      free_ok(f.pool, c, na, NULL);
      void *d = alloc_ok(f.pool, nd, NULL);
      pool_fill(d, nd, round + 100);
      CHECK_POOL(f.pool);
      ck_assert(pool_filled(b, nb, round));
      ck_assert(pool_filled(d, nd, round + 100));
      ck_assert_uint_le(field(f.pool, "reserved"), (uint64_t)(1.08 * (double)(50 * MiB)));
      free_ok(f.pool, b, nb, NULL);
      free_ok(f.pool, d, nd, NULL);
      ck_assert_uint_eq(field(f.pool, "peak"), 50 * MiB);
      if (round == 4) shrinks_before = field(f.pool, "shrinks");
      if (round > 4)
        moves_late += field(f.pool, "page_maps") - maps + field(f.pool, "page_unmaps") - unmaps;
    }
    uint64_t shrinks_late = field(f.pool, "shrinks") - shrinks_before;
    char band[16] = "";
    ck_assert(pool_text(f.pool, "release_band", band, sizeof band));
    if (fixed) {
      ck_assert_msg(shrinks_late >= 4 && moves_late > 0, "fixed band: %llu give-backs late",
                    (unsigned long long)shrinks_late);
      ck_assert_str_eq(band, "3.0");
    } else {
      ck_assert_msg(shrinks_late == 0 && moves_late == 0,
                    "widening band: %llu give-backs, %llu page calls in rounds 5-8",
                    (unsigned long long)shrinks_late, (unsigned long long)moves_late);
      ck_assert_str_eq(band, "4.0");
      ck_assert_uint_ge(field(f.pool, "reserved"), 53 * MiB);
    }
    fix_close(&f);
  }
}
END_TEST

START_TEST(test_pool_vm_release_cached_keeps_live_pages) {
  /* release_cached unmaps every mapping that lies in free memory and keeps
   * the ones under live blocks, whose data survives: what stays mapped is
   * at most each live block plus a mapping (at most page= bytes) reaching
   * past each of its ends. The pool serves again afterwards. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 16 * KiB; /* the blocks below are large */
  o.small_chunk = 64 * KiB;
  fix_open(&f, &o);
  void *p[40];
  size_t n[40];
  for (int i = 0; i < 40; i++) {
    n[i] = (size_t)(i % 7 + 1) * 37 * KiB + (size_t)i * 1000;
    p[i] = alloc_ok(f.pool, n[i], STREAM(i % 3));
    pool_fill(p[i], n[i], (unsigned)i);
  }
  for (int i = 0; i < 40; i += 2) free_ok(f.pool, p[i], n[i], STREAM(i % 3));
  uint64_t before = field(f.pool, "reserved"), maps = field(f.pool, "page_maps");
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  uint64_t after = field(f.pool, "reserved");
  ck_assert_uint_lt(after, before);
  ck_assert_uint_eq(after, vmspy_counts(f.vm).mapped_bytes);
  ck_assert_uint_eq(field(f.pool, "mappings"),
                    vmspy_counts(f.vm).maps - vmspy_counts(f.vm).unmaps);
  ck_assert_uint_eq(field(f.pool, "page_maps"), maps);
  ck_assert_uint_eq(field(f.pool, "page_unmaps"), vmspy_counts(f.vm).unmaps);
  size_t bound = 0;
  for (int i = 1; i < 40; i += 2) bound += (n[i] + 255) / 256 * 256 + 2 * PAGE;
  ck_assert_msg(after <= bound, "%llu bytes mapped for live blocks bounded by %zu",
                (unsigned long long)after, bound);
  for (int i = 1; i < 40; i += 2) ck_assert(pool_filled(p[i], n[i], (unsigned)i));
  /* Serves again, over the pages it gave back. */
  for (int i = 0; i < 40; i += 2) {
    p[i] = alloc_ok(f.pool, n[i], STREAM(i % 3));
    pool_fill(p[i], n[i], (unsigned)i + 50);
  }
  CHECK_POOL(f.pool);
  for (int i = 0; i < 40; i++) {
    ck_assert(pool_filled(p[i], n[i], (unsigned)i + (i % 2 ? 0 : 50)));
    free_ok(f.pool, p[i], n[i], STREAM(i % 3));
  }
  fix_close(&f);
}
END_TEST

/* One cycle: large blocks on two streams, small ones, larger ones. */
static void phase_cycle(rmmc_resource_t *pool, int cycle) {
  void *p[64];
  size_t n[64];
  for (int i = 0; i < 24; i++) {
    n[i] = (size_t)(2 + i % 5) * MiB + (size_t)i * 4096;
    p[i] = alloc_ok(pool, n[i], STREAM(1 + i % 2));
    pool_fill(p[i], n[i], (unsigned)(cycle + i));
  }
  for (int i = 0; i < 24; i++) {
    ck_assert(pool_filled(p[i], n[i], (unsigned)(cycle + i)));
    free_ok(pool, p[i], n[i], STREAM(1 + i % 2));
  }
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 64; i++) {
      n[i] = 1000 + (size_t)((i * 7919 + round * 104729) % (512 * 1024));
      p[i] = alloc_ok(pool, n[i], STREAM(1 + i % 2));
    }
    for (int i = 0; i < 64; i++) free_ok(pool, p[i], n[i], STREAM(1 + (i / 2) % 2));
  }
  for (int i = 0; i < 8; i++) {
    n[i] = (size_t)(9 + i) * MiB;
    p[i] = alloc_ok(pool, n[i], STREAM(2 - i % 2));
  }
  for (int i = 0; i < 8; i++) free_ok(pool, p[i], n[i], STREAM(2 - i % 2));
}

START_TEST(test_pool_vm_phases_repeat_without_mappings) {
  /* After the first cycle of phases no page is mapped or unmapped. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.page_size = 2 * MiB;
  fix_open(&f, &o);
  /* After the first round the phases find mapped memory for everything but
   * the last phase's largest blocks, which need the spans the small phase
   * scattered through the address space back in one piece: a few pages
   * (at most 4 here) go and come back per round, and reserved stays within
   * the steady-state band. Large and small blocks share one address space
   * on purpose (docs/design.md, "Growth and giving back (hysteresis)"): this is its cost. */
  phase_cycle(f.pool, 0);
  vmspy_counts_t c0 = vmspy_counts(f.vm);
  uint64_t peak = field(f.pool, "peak");
  for (int cycle = 1; cycle <= 4; cycle++) {
    phase_cycle(f.pool, cycle);
    CHECK_POOL(f.pool);
    vmspy_counts_t d = vmspy_counts(f.vm);
    ck_assert_msg(d.maps - c0.maps <= 4 * (uint64_t)cycle && d.unmaps - c0.unmaps <= 4 * (uint64_t)cycle,
                  "cycle %d: %llu maps, %llu unmaps after the first cycle", cycle,
                  (unsigned long long)(d.maps - c0.maps), (unsigned long long)(d.unmaps - c0.unmaps));
    ck_assert_uint_eq(field(f.pool, "peak"), peak);
    ck_assert_uint_le(field(f.pool, "reserved"), (uint64_t)(1.06 * (double)peak) + 2 * MiB);
  }
  vmspy_counts_t c = vmspy_counts(f.vm);
  uint64_t maps = field(f.pool, "page_maps"), unmaps = field(f.pool, "page_unmaps");
  ck_assert_uint_eq(maps, c.maps);
  ck_assert_uint_eq(unmaps, c.unmaps);
  ck_assert_uint_eq(vmspy_counts(f.vm).reserves, 1);
  ck_assert_uint_eq(field(f.pool, "device_syncs"), 0);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_pressure_under_limiting_gives_back) {
  /* pool > limiting(limit=48MiB) > host, virtual memory: idle spans of a
   * stream, large blocks pending on another (not covered) and free pages
   * all serve a request that needs them rather than out of memory, and the
   * limit holds. */
  rmmc_resource_t *pool;
  ck_assert_int_eq(
      rmmc_stack_create("pool(event_interval=1000, release_before_grow=false, page=2MiB, "
                        "cache=16MiB) > "
                        "limiting(limit=48MiB) > host",
                        -1, &pool),
      RMMC_SUCCESS);
  rmmc_resource_t *lim = rmmc_resource_upstream(pool);
  void *b[16];
  for (int i = 0; i < 16; i++) b[i] = alloc_ok(pool, 1 * MiB, STREAM(1));
  for (int i = 0; i < 16; i++) free_ok(pool, b[i], 1 * MiB, STREAM(1));
  ck_assert_uint_eq(field(pool, "cached"), 16 * MiB);
  void *l[4];
  for (int i = 0; i < 4; i++) l[i] = alloc_ok(pool, 6 * MiB, STREAM(2));
  for (int i = 0; i < 4; i++) free_ok(pool, l[i], 6 * MiB, STREAM(2));
  ck_assert_uint_ge(field(pool, "pending"), 24 * MiB);
  void *big = alloc_ok(pool, 44 * MiB, STREAM(3));
  pool_fill(big, 44 * MiB, 4);
  CHECK_POOL(pool);
  ck_assert_uint_le(field(pool, "reserved"), 48 * MiB);
  ck_assert_uint_le(rmmc_limiting_adaptor_get_used(lim), 48 * MiB);
  ck_assert(pool_filled(big, 44 * MiB, 4));
  free_ok(pool, big, 44 * MiB, STREAM(3));
  for (int i = 0; i < 16; i++) b[i] = alloc_ok(pool, 1 * MiB, STREAM(1));
  for (int i = 0; i < 16; i++) free_ok(pool, b[i], 1 * MiB, STREAM(1));
  CHECK_POOL(pool);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(lim), 0);
  rmmc_resource_release(pool);
}
END_TEST

typedef struct span_user {
  rmmc_resource_t *pool;
  int failures;
} span_user_t;

static void *span_user_main(void *arg) {
  span_user_t *u = arg;
  void *b[12];
  for (int i = 0; i < 12; i++)
    if (rmmc_resource_allocate(u->pool, 1 * MiB, 256, cudaStreamPerThread, &b[i]) != RMMC_SUCCESS)
      u->failures++;
  for (int i = 0; i < 12; i++)
    if (rmmc_resource_deallocate(u->pool, b[i], 1 * MiB, 256, cudaStreamPerThread) != RMMC_SUCCESS)
      u->failures++;
  return NULL;
}

START_TEST(test_pool_vm_exited_thread_gives_back_its_spans) {
  /* A thread fills three spans on its per-thread stream and exits; with no
   * more room upstream, the main thread's requests are served from them
   * with no new mapping. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.cache_size = 16 * MiB;
  fix_open(&f, &o);
  span_user_t u = {f.pool, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, span_user_main, &u), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_int_eq(u.failures, 0);
  ck_assert_uint_eq(field(f.pool, "cached"), 12 * MiB);
  ck_assert_uint_eq(field(f.pool, "reserved"), 12 * MiB);
  spy_set_capacity(spy_of(f.spy), spy_counts(spy_of(f.spy)).outstanding_bytes);
  void *big = alloc_ok(f.pool, 8 * MiB, cudaStreamPerThread);
  void *small = alloc_ok(f.pool, 512 * KiB, NULL);
  pool_fill(big, 8 * MiB, 1);
  pool_fill(small, 512 * KiB, 2);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "reserved"), 12 * MiB);
  ck_assert_uint_le(vmspy_counts(f.vm).peak_mapped_bytes, 12 * MiB);
  ck_assert(pool_filled(big, 8 * MiB, 1) && pool_filled(small, 512 * KiB, 2));
  free_ok(f.pool, big, 8 * MiB, cudaStreamPerThread);
  free_ok(f.pool, small, 512 * KiB, NULL);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_refused_growth_gives_back_what_it_lacks) {
  /* The upstream is full and three finished 1 MiB frees lie between live
   * blocks: a 2 MiB request needs a growth the upstream refuses, so the
   * pool gives back as many pages of those frees as the growth maps (2 MiB,
   * not all 3) and maps again. No budget (release_before_grow=false): the
   * refusal alone gives back. The live blocks keep their data. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  fix_open(&f, &o);
  enum { N = 6 };
  void *b[N];
  for (int i = 0; i < N; i++) b[i] = alloc_ok(f.pool, 1 * MiB, NULL);
  spy_set_capacity(spy_of(f.spy), spy_counts(spy_of(f.spy)).outstanding_bytes);
  uint64_t reserved = field(f.pool, "reserved");
  for (int i = 1; i < N; i += 2) pool_fill(b[i], 1 * MiB, (unsigned)i);
  for (int i = 0; i < N; i += 2) free_ok(f.pool, b[i], 1 * MiB, NULL);
  uint64_t unmaps = field(f.pool, "page_unmaps"), refusals = field(f.pool, "refusal_trims");
  void *big = alloc_ok(f.pool, 2 * MiB, NULL);
  pool_fill(big, 2 * MiB, 9);
  CHECK_POOL(f.pool);
  ck_assert_uint_eq(field(f.pool, "refusal_trims") - refusals, 1);
  ck_assert_uint_eq(field(f.pool, "page_unmaps") - unmaps, 2 * MiB / PAGE);
  ck_assert_uint_eq(field(f.pool, "reserved"), reserved);
  ck_assert_uint_eq(field(f.pool, "free"), 1 * MiB); /* one free block stays mapped */
  for (int i = 1; i < N; i += 2) ck_assert(pool_filled(b[i], 1 * MiB, (unsigned)i));
  ck_assert(pool_filled(big, 2 * MiB, 9));
  /* Nothing left to give back for another 2 MiB: refused, nothing lost. */
  void *no = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * MiB, 256, NULL, &no), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(no);
  CHECK_POOL(f.pool);
  ck_assert(pool_filled(big, 2 * MiB, 9));
  free_ok(f.pool, big, 2 * MiB, NULL);
  for (int i = 1; i < N; i += 2) free_ok(f.pool, b[i], 1 * MiB, NULL);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_returned_span_serves_the_next_span) {
  /* cache=0: a stream heap gives a span back to the shared heap as soon as
   * it is wholly free. One stream frees its only small block (its span goes
   * back, between nothing and a live large block) and allocates it again:
   * the span-sized, span-aligned free block must serve the new span. Each
   * cycle must not map more memory nor reserve more address space. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.cache_size = 0;
  fix_open(&f, &o);
  void *s = alloc_ok(f.pool, 1 * MiB, STREAM(1));
  void *l = alloc_ok(f.pool, 4 * MiB, STREAM(1));
  uint64_t reserved = field(f.pool, "reserved");
  ck_assert_uint_eq(reserved, 8 * MiB);
  for (int cycle = 0; cycle < 6; cycle++) {
    free_ok(f.pool, s, 1 * MiB, STREAM(1));
    s = alloc_ok(f.pool, 1 * MiB, STREAM(1));
    pool_fill(s, 1 * MiB, (unsigned)cycle);
    CHECK_POOL(f.pool);
    ck_assert_msg(field(f.pool, "reserved") <= reserved && field(f.pool, "regions") == 1,
                  "cycle %d: reserved %llu bytes in %llu reservations for 5 MiB live", cycle,
                  (unsigned long long)field(f.pool, "reserved"),
                  (unsigned long long)field(f.pool, "regions"));
  }
  free_ok(f.pool, s, 1 * MiB, STREAM(1));
  free_ok(f.pool, l, 4 * MiB, STREAM(1));
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_maximum_holds_when_trimming_moves_the_placement) {
  /* maximum 16 pages: x (8 pages) live, a free block of 6 pages after it
   * beside unmapped address space. A 10-page request would extend the free
   * block by 4 pages (18 > 16): the pool trims the free block to make
   * room, after which the placement needs 10 pages; it must not map them
   * past the maximum (8 + 10 > 16 pages: out of memory). */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.maximum_size = 16 * PAGE;
  o.release_before_grow = false;
  fix_open(&f, &o);
  void *x = alloc_ok(f.pool, 8 * PAGE, NULL);
  void *y = alloc_ok(f.pool, 6 * PAGE, NULL);
  pool_fill(x, 8 * PAGE, 1);
  free_ok(f.pool, y, 6 * PAGE, NULL);
  ck_assert_uint_eq(field(f.pool, "reserved"), 14 * PAGE);
  void *c = (void *)1;
  rmmc_status_t st = rmmc_resource_allocate(f.pool, 10 * PAGE, 256, NULL, &c);
  ck_assert_msg(vmspy_counts(f.vm).peak_mapped_bytes <= 16 * PAGE,
                "status %d: %zu bytes mapped at once, maximum %zu", st,
                vmspy_counts(f.vm).peak_mapped_bytes, 16 * PAGE);
  ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  CHECK_POOL(f.pool);
  ck_assert(pool_filled(x, 8 * PAGE, 1));
  free_ok(f.pool, x, 8 * PAGE, NULL);
  fix_close(&f);
}
END_TEST

/* A thread that calls release_cached when told to (from a memory hook,
 * inside the pool's growth): its device synchronization runs before it
 * takes any of the pool's locks, so every stream's frees become known
 * finished while the growth still holds the shared lock. */
typedef struct syncer {
  rmmc_resource_t *pool;
  int armed, go, started; /* atomics */
  rmmc_status_t status;
} syncer_t;

static void *syncer_main(void *arg) {
  syncer_t *y = arg;
  while (!__atomic_load_n(&y->go, __ATOMIC_ACQUIRE)) sched_yield();
  __atomic_store_n(&y->started, 1, __ATOMIC_RELEASE);
  y->status = rmmc_resource_release_cached(y->pool);
  return NULL;
}

/* on_release: the first unmap after the test arms it sets the syncer off
 * and gives its synchronization time to finish (it then waits for the
 * shared lock this thread holds). */
static void syncer_hook(void *ptr, size_t bytes, void *user) {
  (void)ptr;
  (void)bytes;
  syncer_t *y = user;
  if (!__atomic_exchange_n(&y->armed, 0, __ATOMIC_ACQ_REL)) return;
  __atomic_store_n(&y->go, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&y->started, __ATOMIC_ACQUIRE)) sched_yield();
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

START_TEST(test_pool_vm_neighbour_finished_during_the_growth_serves_it) {
  /* The cause of the "no room after trimming" once seen in CI (commit
   * 4c6c024 reserved a new region instead). [A1 live][F free, stream O]
   * [A2 live][L free, stream Q, 8 MiB][hole]: stream O asks 8 MiB. L is Q's
   * and not known finished, so the growth places the block in the hole,
   * then trims F to the budget. Meanwhile another thread's release_cached
   * synchronizes the streams (before taking any pool lock): L is now
   * finished, so O may use it, and it holds the block alone. Placing again
   * found no place at the hole ("it fits beside it") and none elsewhere:
   * an internal error, then a needless reservation and 8 MiB more mapped.
   * The growth now takes L itself: no region, no mapping. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.event_interval = 1u << 30; /* no frees covered: L and F stay unfinished */
  o.event_bytes = SIZE_MAX;
  o.sync_before_peak = false;
  fix_open(&f, &o);
  const cudaStream_t so = STREAM(1), sq = STREAM(2);
  void *a1 = alloc_ok(f.pool, 4 * MiB, so), *fb = alloc_ok(f.pool, 4 * MiB, so);
  void *a2 = alloc_ok(f.pool, 4 * MiB, so), *l = alloc_ok(f.pool, 8 * MiB, sq);
  ck_assert((uintptr_t)a1 < (uintptr_t)fb && (uintptr_t)fb < (uintptr_t)a2 &&
            (uintptr_t)a2 < (uintptr_t)l);
  pool_fill(a1, 4 * MiB, 1);
  pool_fill(a2, 4 * MiB, 2);
  free_ok(f.pool, fb, 4 * MiB, so);
  free_ok(f.pool, l, 8 * MiB, sq);
  ck_assert_uint_eq(field(f.pool, "reserved"), 20 * MiB);
  syncer_t y = {f.pool, 0, 0, 0, RMMC_SUCCESS};
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_release = syncer_hook;
  h.user = &y;
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(f.pool, &h), RMMC_SUCCESS);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, syncer_main, &y), 0);
  uint64_t maps = vmspy_counts(f.vm).maps;
  __atomic_store_n(&y.armed, 1, __ATOMIC_RELEASE);
  void *b = alloc_ok(f.pool, 8 * MiB, so);
  ck_assert_msg(__atomic_load_n(&y.go, __ATOMIC_ACQUIRE), "the growth trimmed nothing");
  pthread_join(th, NULL);
  ck_assert_int_eq(y.status, RMMC_SUCCESS);
  ck_assert_ptr_eq(b, l); /* L itself, once finished */
  ck_assert_uint_eq(vmspy_counts(f.vm).reserves, 1);
  ck_assert_uint_eq(vmspy_counts(f.vm).maps, maps);
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  pool_fill(b, 8 * MiB, 3);
  ck_assert(pool_filled(a1, 4 * MiB, 1) && pool_filled(a2, 4 * MiB, 2) && pool_filled(b, 8 * MiB, 3));
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(f.pool, NULL), RMMC_SUCCESS);
  free_ok(f.pool, b, 8 * MiB, so);
  free_ok(f.pool, a1, 4 * MiB, so);
  free_ok(f.pool, a2, 4 * MiB, so);
  fix_close(&f);
}
END_TEST

/* ---- failures, the maximum, reservations ---- */

START_TEST(test_pool_vm_map_failure_is_clean) {
  /* A refused mapping, on the first page or in the middle of a large block,
   * that the last resort cannot cure: a clean out-of-memory status, the
   * pages mapped for the block taken back, the pool intact, and the next
   * request served once the upstream has room. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  spy_t *s = spy_of(f.spy);
  for (size_t room = 0; room <= 6; room++) {
    void *keep = alloc_ok(f.pool, 100 * KiB, NULL);
    pool_fill(keep, 100 * KiB, 7);
    /* `room` more pages fit upstream, then mapping fails. */
    spy_set_capacity(s, spy_counts(s).outstanding_bytes + room * PAGE);
    uint64_t before = field(f.pool, "reserved"), failures = vmspy_counts(f.vm).map_failures;
    void *p = (void *)1;
    rmmc_status_t st = rmmc_resource_allocate(f.pool, 10 * PAGE, 256, NULL, &p);
    ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "out of memory"));
    ck_assert_uint_gt(vmspy_counts(f.vm).map_failures, failures);
    ck_assert_uint_le(field(f.pool, "reserved"), before);
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(field(f.pool, "reserved"), vmspy_counts(f.vm).mapped_bytes);
    ck_assert_uint_eq(field(f.pool, "in_use"), 100 * KiB);
    ck_assert(pool_filled(keep, 100 * KiB, 7));
    spy_set_capacity(s, SIZE_MAX);
    p = alloc_ok(f.pool, 10 * PAGE, NULL);
    pool_fill(p, 10 * PAGE, 9);
    ck_assert(pool_filled(p, 10 * PAGE, 9));
    free_ok(f.pool, p, 10 * PAGE, NULL);
    free_ok(f.pool, keep, 100 * KiB, NULL);
    ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
    ck_assert_uint_eq(field(f.pool, "reserved"), 0);
  }
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_map_failure_retried) {
  /* One refused mapping (the nth of the growth) that the pool's retry
   * cures: the request succeeds and the pool is whole. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  for (uint64_t nth = 1; nth <= 4; nth++) {
    uint64_t failures = vmspy_counts(f.vm).map_failures;
    spy_fail_nth(spy_of(f.spy), nth);
    void *p = alloc_ok(f.pool, 6 * PAGE, NULL);
    pool_fill(p, 6 * PAGE, 3);
    ck_assert(pool_filled(p, 6 * PAGE, 3));
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(vmspy_counts(f.vm).map_failures, failures + 1);
    ck_assert_uint_eq(field(f.pool, "reserved"), 6 * PAGE);
    free_ok(f.pool, p, 6 * PAGE, NULL);
    ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
    ck_assert_uint_eq(field(f.pool, "reserved"), 0);
  }
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_failed_rollback_keeps_its_mapping) {
  /* pool > vmspy > faulty > spy. A growth of 3 mappings whose third is
   * refused takes back the two it made; the first of those unmappings is
   * refused too, so that range stays mapped. The pool must keep counting
   * it (reserved = mapped) and never map it again: the request then
   * succeeds (the refusals were one-off), no call to the vmspy is
   * malformed, and everything goes back in the end. */
  rmmc_resource_t *spy = new_spy(), *fy, *vm, *pool;
  ck_assert_int_eq(faulty_create(spy, &fy), RMMC_SUCCESS);
  ck_assert_int_eq(vmspy_create(fy, 4 * KiB, &vm), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  o.page_size = PAGE;
  o.small_max = 0;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &pool), RMMC_SUCCESS);
  spy_fail_nth(spy_of(spy), 3);
  faulty_fail_deallocate(faulty_of(fy), RMMC_ERROR_CUDA, 1);
  void *p = (void *)1;
  rmmc_status_t st = rmmc_resource_allocate(pool, 3 * PAGE, 256, NULL, &p);
  ck_assert_msg(vmspy_counts(vm).errors == 0, "status %d (%s): the pool mapped a mapped range",
                st, rmmc_last_error_message());
  ck_assert_msg(st == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(faulty_counts(faulty_of(fy)).deallocate_injected, 1);
  CHECK_POOL(pool);
  ck_assert_uint_eq(field(pool, "reserved"), vmspy_counts(vm).mapped_bytes);
  pool_fill(p, 3 * PAGE, 1);
  ck_assert(pool_filled(p, 3 * PAGE, 1));
  free_ok(pool, p, 3 * PAGE, NULL);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  rmmc_resource_release(pool);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  rmmc_resource_release(vm);
  rmmc_resource_release(fy);
  finish(NULL, spy);
}
END_TEST

START_TEST(test_pool_vm_last_resort_unmaps_free_pages) {
  /* The upstream holds only 32 pages; free pages elsewhere go back (even
   * with release_before_grow off) so that a request fits. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  fix_open(&f, &o);
  spy_set_capacity(spy_of(f.spy), 32 * PAGE);
  void *a = alloc_ok(f.pool, 20 * PAGE, NULL);
  void *keep = alloc_ok(f.pool, 4 * PAGE, NULL); /* after a: a's pages cannot grow in place */
  free_ok(f.pool, a, 20 * PAGE, NULL);
  pool_fill(keep, 4 * PAGE, 1);
  void *b = alloc_ok(f.pool, 24 * PAGE, NULL);
  pool_fill(b, 24 * PAGE, 2);
  CHECK_POOL(f.pool);
  ck_assert_uint_le(vmspy_counts(f.vm).mapped_bytes, 32 * PAGE);
  void *c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 8 * PAGE, 256, NULL, &c),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  CHECK_POOL(f.pool);
  ck_assert(pool_filled(keep, 4 * PAGE, 1) && pool_filled(b, 24 * PAGE, 2));
  free_ok(f.pool, keep, 4 * PAGE, NULL);
  free_ok(f.pool, b, 24 * PAGE, NULL);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_maximum_bounds_mapped_bytes) {
  /* The maximum bounds mapped bytes: free pages go first, then out of memory
   * with the pool's figures. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.maximum_size = 16 * PAGE;
  fix_open(&f, &o);
  ck_assert_uint_eq(field(f.pool, "limit"), 16 * PAGE);
  void *a = alloc_ok(f.pool, 12 * PAGE, NULL);
  free_ok(f.pool, a, 12 * PAGE, NULL);
  a = alloc_ok(f.pool, 2 * PAGE, STREAM(2));
  void *b = alloc_ok(f.pool, 14 * PAGE, STREAM(3));
  ck_assert_uint_le(field(f.pool, "reserved"), 16 * PAGE);
  ck_assert_uint_le(vmspy_counts(f.vm).peak_mapped_bytes, 16 * PAGE);
  void *c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, PAGE, 256, STREAM(4), &c),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "(65536 bytes)") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "pool reserved 1.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "maximum 1.00 MiB") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stream 0x104") != NULL, "%s", m);
  CHECK_POOL(f.pool);
  free_ok(f.pool, a, 2 * PAGE, STREAM(2));
  free_ok(f.pool, b, 14 * PAGE, STREAM(3));
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_more_reservations) {
  /* Address space running out takes another reservation; a request larger
   * than the reservation size gets one of its own. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.address_space = 1 * MiB;
  o.small_max = 64 * KiB;
  o.small_chunk = 256 * KiB;
  fix_open(&f, &o);
  void *a = alloc_ok(f.pool, 900 * KiB, NULL);
  void *b = alloc_ok(f.pool, 900 * KiB, NULL);
  void *c = alloc_ok(f.pool, 5 * MiB, NULL);
  pool_fill(a, 900 * KiB, 1), pool_fill(b, 900 * KiB, 2), pool_fill(c, 5 * MiB, 3);
  ck_assert_uint_ge(field(f.pool, "regions"), 3);
  ck_assert_uint_eq(field(f.pool, "regions"), vmspy_counts(f.vm).reserves);
  ck_assert_uint_ge(field(f.pool, "address_space"), 7 * MiB);
  CHECK_POOL(f.pool);
  ck_assert(pool_filled(a, 900 * KiB, 1) && pool_filled(b, 900 * KiB, 2) &&
            pool_filled(c, 5 * MiB, 3));
  free_ok(f.pool, a, 900 * KiB, NULL);
  free_ok(f.pool, b, 900 * KiB, NULL);
  free_ok(f.pool, c, 5 * MiB, NULL);
  fix_close(&f);
  /* The reservations went back at destroy (the vmspy refuses an unreserve
   * with pages mapped, and fix_close saw no error). */
}
END_TEST

START_TEST(test_pool_vm_describes_its_figures) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 1 * MiB + 4096;
  fix_open(&f, &o);
  expect_backend(f.pool, "virtual memory");
  /* initial= maps what it asks, in the upstream's 4 KiB pages. */
  ck_assert_uint_eq(field(f.pool, "reserved"), 1 * MiB + 4096);
  ck_assert_uint_eq(field(f.pool, "page"), 4 * KiB);
  ck_assert_uint_eq(field(f.pool, "address_space"), 256 * MiB);
  ck_assert_uint_eq(field(f.pool, "regions"), 1);
  ck_assert_uint_eq(field(f.pool, "mappings"), vmspy_counts(f.vm).maps);
  ck_assert_uint_eq(field(f.pool, "page_maps"), vmspy_counts(f.vm).maps);
  ck_assert_uint_eq(field(f.pool, "page_unmaps"), 0);
  /* A growth maps the shortfall beside the free initial block, at most
   * page= bytes per mapping. */
  uint64_t maps = vmspy_counts(f.vm).maps;
  void *p = alloc_ok(f.pool, 2 * MiB, NULL);
  ck_assert_uint_eq(field(f.pool, "reserved"), 2 * MiB);
  ck_assert_uint_eq(vmspy_counts(f.vm).maps - maps, (2 * MiB - (1 * MiB + 4096) + PAGE - 1) / PAGE);
  ck_assert_uint_eq(field(f.pool, "page_maps"), vmspy_counts(f.vm).maps);
  ck_assert_uint_eq(field(f.pool, "mappings"), vmspy_counts(f.vm).maps);
  ck_assert_uint_eq(field(f.pool, "reserved"), vmspy_counts(f.vm).mapped_bytes);
  free_ok(f.pool, p, 2 * MiB, NULL);
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f.pool, "mappings"), 0);
  ck_assert_uint_eq(field(f.pool, "page_unmaps"), vmspy_counts(f.vm).unmaps);
  ck_assert_uint_eq(field(f.pool, "shrinks"), field(f.pool, "page_unmaps"));
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_initial_size_is_not_min_growth) {
  /* initial= maps what it asks, not min_growth; the first growth past it
   * maps min_growth beside the initial block. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 1 * MiB + 4096;
  o.min_growth = 8 * MiB;
  fix_open(&f, &o);
  expect_backend(f.pool, "virtual memory");
  ck_assert_uint_eq(field(f.pool, "reserved"), 1 * MiB + 4096);
  void *p = alloc_ok(f.pool, 4 * MiB, NULL);
  ck_assert_uint_eq(field(f.pool, "reserved"), 1 * MiB + 4096 + 8 * MiB);
  ck_assert_uint_eq(field(f.pool, "reserved"), vmspy_counts(f.vm).mapped_bytes);
  free_ok(f.pool, p, 4 * MiB, NULL);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_vm_destroy_returns_everything_with_live_blocks) {
  /* Live blocks, idle spans and pending frees at destroy: every mapping and
   * reservation goes back, checked by the vmspy, and the spy holds
   * nothing. */
  rmmc_resource_t *spy = new_spy(), *vm, *pool;
  ck_assert_int_eq(vmspy_create(spy, 4 * KiB, &vm), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.address_space = 8 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &pool), RMMC_SUCCESS);
  (void)alloc_ok(pool, 3 * MiB, NULL);
  (void)alloc_ok(pool, 100, STREAM(3));
  (void)alloc_ok(pool, 12 * MiB, STREAM(4)); /* a second reservation */
  void *x = alloc_ok(pool, 200, STREAM(4));
  free_ok(pool, x, 200, STREAM(5));
  x = alloc_ok(pool, 2 * MiB, STREAM(6));
  free_ok(pool, x, 2 * MiB, STREAM(6));
  ck_assert_uint_ge(vmspy_counts(vm).reserves, 2);
  rmmc_resource_release(pool);
  vmspy_counts_t c = vmspy_counts(vm);
  ck_assert_uint_eq(c.mapped_bytes, 0);
  ck_assert_uint_eq(c.reserved_bytes, 0);
  ck_assert_uint_eq(c.unreserves, c.reserves);
  ck_assert_uint_eq(c.errors, 0);
  rmmc_resource_release(vm);
  finish(NULL, spy);
}
END_TEST

START_TEST(test_pool_vm_bad_frees_lose_nothing) {
  /* Pointers the pool never handed out (inside the reservation too: mapped
   * free memory, unmapped address space, inside blocks and spans), wrong
   * sizes and double frees, small and large, on the block's stream and
   * others: RMMC_ERROR_UNKNOWN_POINTER with a message, nothing changed, no
   * malformed call to the vmspy, and everything goes back in the end. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  void *s1 = alloc_ok(f.pool, 3000, STREAM(1)), *l1 = alloc_ok(f.pool, 5 * MiB, STREAM(1));
  void *l2 = alloc_ok(f.pool, 2 * MiB, STREAM(2));
  pool_fill(s1, 3000, 1);
  pool_fill(l1, 5 * MiB, 2);
  pool_fill(l2, 2 * MiB, 3);
  void *gone = alloc_ok(f.pool, 3 * MiB, STREAM(2));
  free_ok(f.pool, gone, 3 * MiB, STREAM(2));
  rmmc_pool_figures_t before = pool_figures(f.pool);
  char *space_end = (char *)l1 + 64 * MiB; /* unmapped address space of the reservation */
  struct bad {
    void *p;
    size_t n;
    cudaStream_t s;
    const char *text;
  } bad[] = {
      {gone, 3 * MiB, STREAM(2), "not allocated by this pool"},       /* mapped, free */
      {space_end, 4096, STREAM(1), "not allocated by this pool"},     /* not mapped */
      {(char *)s1 + 4096, 256, STREAM(1), "not allocated by this pool"}, /* in a span */
      {(char *)s1 + 256, 256, STREAM(3), "not allocated by this pool"},
      {(char *)l1 + 1 * MiB, 2 * MiB, STREAM(1), "not allocated by this pool"},
      {s1, 2999, STREAM(1), "allocated with 3000 bytes, not 2999"},
      {s1, 3000, STREAM(1), NULL}, /* the right free, then the same again */
      {s1, 3000, STREAM(1), "or was freed already"},
      {s1, 3000, STREAM(2), "or was freed already"},
      {l1, 5 * MiB + 256, STREAM(2), "allocated with 5242880 bytes, not 5243136"},
      {l2, 2 * MiB, STREAM(1), NULL}, /* freed on another stream, then again */
      {l2, 2 * MiB, STREAM(2), "or was freed already"},
      {l2, 2 * MiB, STREAM(1), "or was freed already"},
  };
  size_t in_use = before.in_use;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (bad[i].text == NULL) {
      free_ok(f.pool, bad[i].p, bad[i].n, bad[i].s);
      in_use -= (bad[i].n + 255) / 256 * 256;
    } else {
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, bad[i].p, bad[i].n, 256, bad[i].s),
                       RMMC_ERROR_UNKNOWN_POINTER);
      ck_assert_msg(strstr(rmmc_last_error_message(), bad[i].text) != NULL,
                    "%zu: '%s' lacks '%s'", i, rmmc_last_error_message(), bad[i].text);
    }
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(pool_figures(f.pool).in_use, in_use);
  }
  ck_assert(pool_filled(l1, 5 * MiB, 2));
  ck_assert_uint_eq(vmspy_counts(f.vm).errors, 0);
  free_ok(f.pool, l1, 5 * MiB, STREAM(1));
  ck_assert_uint_eq(pool_figures(f.pool).in_use, 0);
  fix_close(&f);
}
END_TEST

/* ---- options ---- */

START_TEST(test_pool_vm_bad_options) {
  /* Bad options and an upstream without virtual memory: a clear status, a
   * message naming the problem, nothing retained. */
  rmmc_resource_t *spy, *vm, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &r), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "virtual memory"));
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_int_eq(vmspy_create(spy, 64 * KiB, &vm), RMMC_SUCCESS);
  size_t bad_pages[] = {96 * KiB, 100 * KiB + 1, (size_t)2 << 40};
  for (int i = 0; i < 3; i++) {
    o.page_size = bad_pages[i];
    r = (rmmc_resource_t *)1;
    ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "page_size"));
    ck_assert_int_eq(rmmc_resource_refcount(vm), 1);
  }
  o.page_size = 0;
  o.address_space = (size_t)1 << 60;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "address_space"));
  ck_assert_uint_eq(vmspy_counts(vm).reserves, 0);
  /* initial= the upstream cannot map: out of memory, the reservation given
   * back. */
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.initial_size = 4 * MiB;
  spy_set_capacity(spy_of(spy), 1 * MiB);
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &r), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(r);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  ck_assert_uint_eq(vmspy_counts(vm).reserved_bytes, 0);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  ck_assert_int_eq(rmmc_resource_refcount(vm), 1);
  rmmc_resource_release(vm);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

/* The public virtual-memory calls check their arguments before any slot
 * runs. */
START_TEST(test_vm_calls_check_arguments) {
  rmmc_resource_t *spy, *vm;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(vmspy_create(spy, 64 * KiB, &vm), RMMC_SUCCESS);
  void *p = (void *)1;
  ck_assert_uint_eq(rmmc_resource_vm_page_size(NULL), 0);
  ck_assert_uint_eq(rmmc_resource_vm_page_size(spy), 0);
  ck_assert_uint_eq(rmmc_resource_vm_page_size(vm), 64 * KiB);
  ck_assert_int_eq(rmmc_resource_vm_reserve(spy, 64 * KiB, 0, &p), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_resource_vm_reserve(NULL, 64 * KiB, 0, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_reserve(vm, 64 * KiB, 0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_reserve(vm, 0, 0, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_reserve(vm, 100 * KiB, 0, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_reserve(vm, 1 * MiB, 96 * KiB, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_reserve(vm, 1 * MiB, 256 * KiB, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % (256 * KiB), 0);
  char *base = p;
  ck_assert_int_eq(rmmc_resource_vm_map(vm, NULL, 64 * KiB), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_map(vm, base + 4096, 64 * KiB), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_map(vm, base, 1000), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_unmap(vm, NULL, 64 * KiB), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_vm_unreserve(vm, NULL, 1 * MiB), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0); /* none of those reached the slots */
  ck_assert_int_eq(rmmc_resource_vm_map(vm, base, 128 * KiB), RMMC_SUCCESS);
  memset(base, 0x5a, 128 * KiB);
  ck_assert_int_eq(rmmc_resource_vm_unmap(vm, base, 128 * KiB), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_vm_unreserve(vm, base, 1 * MiB), RMMC_SUCCESS);
  rmmc_resource_release(vm);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

/* The host resource's own virtual memory: mapped pages hold data,
 * unmapped ones come back zeroed. */
START_TEST(test_host_vm) {
  rmmc_resource_t *h;
  ck_assert_int_eq(rmmc_host_resource_create(&h), RMMC_SUCCESS);
  size_t page = rmmc_resource_vm_page_size(h);
  ck_assert_uint_ge(page, 4096);
  void *p;
  ck_assert_int_eq(rmmc_resource_vm_reserve(h, 64 * page, 16 * page, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % (16 * page), 0);
  ck_assert_int_eq(rmmc_resource_vm_map(h, p, 4 * page), RMMC_SUCCESS);
  memset(p, 0x77, 4 * page);
  ck_assert_int_eq(((unsigned char *)p)[4 * page - 1], 0x77);
  ck_assert_int_eq(rmmc_resource_vm_unmap(h, p, 4 * page), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_vm_map(h, p, 4 * page), RMMC_SUCCESS);
  ck_assert_int_eq(((unsigned char *)p)[0], 0);
  ck_assert_int_eq(rmmc_resource_vm_unmap(h, p, 4 * page), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_vm_unreserve(h, p, 64 * page), RMMC_SUCCESS);
  rmmc_resource_release(h);
}
END_TEST

/* Specs: over host (real memory) and sim (figures only), with the pool's
 * virtual-memory figures in its description. */
START_TEST(test_pool_vm_spec_over_host_and_sim) {
  const char *specs[] = {"pool(expandable=true, page=1MiB) > host",
                         "pool(expandable=true, address_space=1GiB) > sim"};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r;
    ck_assert_msg(rmmc_stack_create(specs[k], -1, &r) == RMMC_SUCCESS, "%s: %s", specs[k],
                  rmmc_last_error_message());
    void *p[8];
    for (int i = 0; i < 8; i++) {
      p[i] = alloc_ok(r, (size_t)(i + 1) * 3 * MiB, NULL);
      if (k == 0) memset(p[i], i, (size_t)(i + 1) * 3 * MiB);
    }
    ck_assert_uint_ge(field(r, "page_maps"), 1);
    ck_assert_uint_ge(field(r, "reserved"), 108 * MiB);
    ck_assert_uint_ge(field(r, "address_space"), field(r, "reserved"));
    CHECK_POOL(r);
    for (int i = 0; i < 8; i++) free_ok(r, p[i], (size_t)(i + 1) * 3 * MiB, NULL);
    ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
    ck_assert_uint_eq(field(r, "reserved"), 0);
    rmmc_resource_t *base = rmmc_resource_upstream(r);
    if (k == 1) ck_assert_uint_eq(field(base, "in_use"), 0);
    rmmc_resource_release(r);
  }
  /* Through a limiting adaptor: mapped pages count against its limit. */
  rmmc_resource_t *r;
  ck_assert_int_eq(
      rmmc_stack_create("pool(expandable=true, page=1MiB) > limiting(limit=8MiB) > host", -1, &r),
      RMMC_SUCCESS);
  rmmc_resource_t *lim = rmmc_resource_upstream(r);
  void *a = alloc_ok(r, 5 * MiB, NULL), *b = (void *)1;
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(lim), 5 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4 * MiB, 256, NULL, &b), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(b);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "limit 8.00 MiB"));
  CHECK_POOL(r);
  free_ok(r, a, 5 * MiB, NULL);
  b = alloc_ok(r, 7 * MiB, NULL);
  memset(b, 1, 7 * MiB);
  free_ok(r, b, 7 * MiB, NULL);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(lim), 0);
  rmmc_resource_release(r);
  /* An adaptor without virtual memory below: refused at creation. */
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=true) > statistics > host", -1, &r),
                   RMMC_ERROR_NOT_SUPPORTED);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("pool_expandable");
  conformance_add(s, cases, (int)(sizeof cases / sizeof cases[0]));
  TCase *tc = tcase_create("expandable");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_pool_vm_backend_follows_the_upstream);
  tcase_add_test(tc, test_pool_vm_random_run_keeps_invariants);
  tcase_add_test(tc, test_pool_vm_random_run_over_host_and_sim);
  tcase_add_test(tc, test_pool_vm_random_run_with_maximum_keeps_invariants);
  tcase_add_test(tc, test_pool_vm_threads_keep_invariants);
  tcase_add_test(tc, test_pool_vm_large_alignments);
  tcase_add_test(tc, test_pool_vm_grows_in_place_within_budget);
  tcase_add_test(tc, test_pool_vm_budget_trim_spares_the_growth_hole);
  tcase_add_test(tc, test_pool_vm_default_page_scales_with_the_growth);
  tcase_add_test(tc, test_pool_vm_steady_band_widens_until_rounds_settle);
  tcase_add_test(tc, test_pool_vm_release_cached_keeps_live_pages);
  tcase_add_test(tc, test_pool_vm_phases_repeat_without_mappings);
  tcase_add_test(tc, test_pool_vm_pressure_under_limiting_gives_back);
  tcase_add_test(tc, test_pool_vm_exited_thread_gives_back_its_spans);
  tcase_add_test(tc, test_pool_vm_refused_growth_gives_back_what_it_lacks);
  tcase_add_test(tc, test_pool_vm_returned_span_serves_the_next_span);
  tcase_add_test(tc, test_pool_vm_neighbour_finished_during_the_growth_serves_it);
  tcase_add_test(tc, test_pool_vm_maximum_holds_when_trimming_moves_the_placement);
  tcase_add_test(tc, test_pool_vm_map_failure_is_clean);
  tcase_add_test(tc, test_pool_vm_map_failure_retried);
  tcase_add_test(tc, test_pool_vm_failed_rollback_keeps_its_mapping);
  tcase_add_test(tc, test_pool_vm_last_resort_unmaps_free_pages);
  tcase_add_test(tc, test_pool_vm_maximum_bounds_mapped_bytes);
  tcase_add_test(tc, test_pool_vm_more_reservations);
  tcase_add_test(tc, test_pool_vm_describes_its_figures);
  tcase_add_test(tc, test_pool_vm_initial_size_is_not_min_growth);
  tcase_add_test(tc, test_pool_vm_destroy_returns_everything_with_live_blocks);
  tcase_add_test(tc, test_pool_vm_bad_frees_lose_nothing);
  tcase_add_test(tc, test_pool_vm_bad_options);
  tcase_add_test(tc, test_vm_calls_check_arguments);
  tcase_add_test(tc, test_host_vm);
  tcase_add_test(tc, test_pool_vm_spec_over_host_and_sim);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
