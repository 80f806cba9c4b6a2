/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sleep mode (rmmc_pool_pause / rmmc_pool_resume, issue 29) with no GPU,
 * over a checked virtual-memory upstream (pool > vmspy > faulty > spy: real
 * host pages, every call checked, faults injected below the mappings) and
 * over host and sim: every mapping unmapped by a pause and mapped again at
 * the same address by resume; backed-up blocks (large ones, small ones in
 * stream heaps on several streams) read back equal, discarded ones come
 * back as fresh pages and are never copied; hooks hear each mapping go and
 * come back, once, in address order; allocation refused while paused,
 * frees accepted; figures and describe; release_cached while paused; no
 * host memory for the backup;
 * refusals halfway through a pause or a resume leave the pool awake or
 * paused, whole (rmmc_pool_resource_check), nothing leaked; graph pools'
 * blocks sleep too and routing works after; threads freeing and allocating
 * while pauses and resumes run; chunk pools and
 * upstreams without virtual memory refused with NOT_SUPPORTED; several
 * pools independent; through adaptors; bad input. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>
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

#define PAGE (64 * KiB) /* page= (most bytes per mapping) */

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

/* A request that must be refused because the pool below is paused. */
static void refused_while_paused(rmmc_resource_t *r, const char *spec, size_t bytes,
                                 cudaStream_t s) {
  void *p = (void *)1;
  rmmc_status_t st = rmmc_resource_allocate(r, bytes, 256, s, &p);
  ck_assert_msg(st == RMMC_ERROR_OUT_OF_MEMORY, "%s: %zu bytes while paused: %s (%s)", spec, bytes,
                rmmc_status_name(st), rmmc_last_error_message());
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(rmmc_last_error_message(), "paused") != NULL, "%s: %s", spec,
                rmmc_last_error_message());
}

/* ---- hooks recorder: every event in order ---- */

typedef struct event {
  int acquire;
  uintptr_t addr;
  size_t bytes;
} event_t;

typedef struct rec {
  event_t ev[1 << 18];
  size_t n;
} rec_t;

static void rec_add(rec_t *r, int acquire, void *p, size_t n) {
  ck_assert_uint_lt(r->n, sizeof r->ev / sizeof r->ev[0]);
  r->ev[r->n++] = (event_t){acquire, (uintptr_t)p, n};
}
static void on_acq(void *p, size_t n, void *u) { rec_add(u, 1, p, n); }
static void on_rel(void *p, size_t n, void *u) { rec_add(u, 0, p, n); }

/* What is held now, by the hooks' count: acquires less releases. */
static size_t hooks_held(const rec_t *r) {
  size_t held = 0;
  for (size_t i = 0; i < r->n; i++) held += r->ev[i].acquire ? r->ev[i].bytes : -r->ev[i].bytes;
  return held;
}

/* ---- fixture ---- */

typedef struct fix {
  rmmc_resource_t *spy, *fy, *vm, *pool;
  rec_t *rec;
} fix_t;

static void fix_open(fix_t *f, rmmc_pool_options_t *o) {
  f->spy = new_spy();
  ck_assert_int_eq(faulty_create(f->spy, &f->fy), RMMC_SUCCESS);
  ck_assert_int_eq(vmspy_create(f->fy, 4 * KiB, &f->vm), RMMC_SUCCESS);
  o->expandable = 1;
  o->page_size = PAGE;
  o->address_space = 256 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(f->vm, o, &f->pool), RMMC_SUCCESS);
  f->rec = calloc(1, sizeof *f->rec);
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = on_acq;
  h.on_release = on_rel;
  h.user = f->rec;
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(f->pool, &h), RMMC_SUCCESS);
}

static void fix_close(fix_t *f) {
  rmmc_resource_release(f->pool);
  vmspy_counts_t c = vmspy_counts(f->vm);
  ck_assert_uint_eq(c.errors, 0);
  ck_assert_uint_eq(c.mapped_bytes, 0);
  rmmc_resource_release(f->vm);
  rmmc_resource_release(f->fy);
  finish(NULL, f->spy);
  free(f->rec);
}

static rmmc_pool_sleep_state_t state(rmmc_resource_t *r) {
  rmmc_pool_sleep_state_t s = RMMC_POOL_SLEEP_STATE_INIT;
  ck_assert_int_eq(rmmc_pool_sleep_state(r, &s), RMMC_SUCCESS);
  return s;
}

/* Live blocks of several sizes and streams, each filled with its own
 * pattern. */
typedef struct live {
  void *p[16];
  size_t n[16];
  cudaStream_t s[16];
  int count;
} live_t;

static void live_make(rmmc_resource_t *pool, live_t *l) {
  static const size_t sizes[] = {300 * KiB, 4 * KiB, 2 * MiB + 768, 256, 64 * KiB,
                                 700 * KiB, 5 * PAGE, 1 * MiB + 4 * KiB};
  l->count = 0;
  for (int i = 0; i < 8; i++) {
    cudaStream_t s = STREAM(i % 3);
    l->p[i] = alloc_ok(pool, sizes[i], s);
    l->n[i] = sizes[i];
    l->s[i] = s;
    pool_fill(l->p[i], sizes[i], 100 + (unsigned)i);
    l->count++;
  }
}

static void live_check(const live_t *l, int skip) {
  for (int i = 0; i < l->count; i++)
    if (i != skip && l->p[i] != NULL)
      ck_assert_msg(pool_filled(l->p[i], l->n[i], 100 + (unsigned)i), "block %d (%zu bytes) differs",
                    i, l->n[i]);
}

static void live_free(rmmc_resource_t *pool, live_t *l) {
  for (int i = 0; i < l->count; i++)
    if (l->p[i] != NULL) free_ok(pool, l->p[i], l->n[i], l->s[i]);
}

/* The events from `from` on: all releases (then, if `acq`, acquires) of
 * the same ranges, strictly ascending, `count` of each. */
static void expect_ranges(const rec_t *r, size_t from, int acquire, size_t count, uintptr_t *addrs,
                          size_t *sizes) {
  ck_assert_uint_eq(r->n - from, count);
  for (size_t i = 0; i < count; i++) {
    const event_t *e = &r->ev[from + i];
    ck_assert_int_eq(e->acquire, acquire);
    if (i > 0) ck_assert_uint_gt(e->addr, r->ev[from + i - 1].addr);
    if (addrs[i] == 0) {
      addrs[i] = e->addr;
      sizes[i] = e->bytes;
    } else {
      ck_assert_uint_eq(e->addr, addrs[i]);
      ck_assert_uint_eq(e->bytes, sizes[i]);
    }
  }
}

/* ---- tests ---- */

START_TEST(test_pool_sleep_backup_restores_at_the_same_addresses) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  live_t l;
  live_make(f.pool, &l);
  size_t reserved = field(f.pool, "reserved"), in_use = field(f.pool, "in_use");
  vmspy_counts_t c0 = vmspy_counts(f.vm);
  ck_assert_uint_eq(c0.mapped_bytes, reserved);
  size_t nmaps = c0.maps - c0.unmaps; /* mappings held */
  ck_assert_uint_gt(nmaps, 4);
  size_t from = f.rec->n;
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  /* Every mapping went back, each announced once, lowest first. */
  vmspy_counts_t c1 = vmspy_counts(f.vm);
  ck_assert_uint_eq(c1.mapped_bytes, 0);
  ck_assert_uint_eq(c1.unmaps - c0.unmaps, nmaps);
  ck_assert_uint_eq(c1.reserved_bytes, c0.reserved_bytes); /* address space kept */
  uintptr_t *addrs = calloc(nmaps, sizeof *addrs);
  size_t *sizes = calloc(nmaps, sizeof *sizes), sum = 0;
  expect_ranges(f.rec, from, 0, nmaps, addrs, sizes);
  for (size_t i = 0; i < nmaps; i++) sum += sizes[i];
  ck_assert_uint_eq(sum, reserved);
  /* Figures. */
  rmmc_pool_sleep_state_t s = state(f.pool);
  ck_assert(s.can_sleep && s.paused);
  ck_assert_int_eq(s.mode, RMMC_POOL_PAUSE_BACKUP);
  ck_assert_uint_eq(s.held, 0);
  ck_assert_uint_eq(s.unmapped, reserved);
  ck_assert_uint_ge(s.backed_up, in_use);      /* every live byte ... */
  ck_assert_uint_le(s.backed_up, in_use + 8 * 64 * KiB); /* ... and small gaps at most */
  ck_assert_uint_ge(s.host_bytes, s.backed_up);
  ck_assert_uint_le(s.backup_ranges, 8);
  ck_assert_uint_eq(s.pauses, 1);
  ck_assert_uint_eq(field(f.pool, "reserved"), 0);
  ck_assert_uint_eq(field(f.pool, "in_use"), in_use);
  ck_assert_uint_eq(field(f.pool, "paused_bytes"), reserved);
  ck_assert_uint_eq(field(f.pool, "backed_up"), s.backed_up);
  char text[32];
  ck_assert(pool_text(f.pool, "sleep", text, sizeof text));
  ck_assert_str_eq(text, "backup");
  ck_assert_uint_eq(pool_figures(f.pool).reserved, 0);
  CHECK_POOL(f.pool);
  /* Allocation refused, small and large, on any stream. */
  for (int k = 0; k < 3; k++) {
    void *p = (void *)1;
    size_t n = k == 0 ? 256 : k == 1 ? 100 * KiB : 3 * MiB;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, n, 256, STREAM(k), &p),
                     RMMC_ERROR_OUT_OF_MEMORY);
    ck_assert_ptr_null(p);
    char want[160];
    snprintf(want, sizeof want,
             "pool: cannot allocate %zu bytes: the pool is paused (rmmc_pool_pause) and holds no "
             "memory until rmmc_pool_resume (",
             n);
    const char *msg = rmmc_last_error_message();
    ck_assert_msg(strncmp(msg, want, strlen(want)) == 0, "%s", msg);
    const char *off = msg + strlen(want), *end = strstr(off, " of its pages are given back)");
    ck_assert_msg(end != NULL && strchr(off, ')') > end, "%s", msg); /* "(<size> of ...)" */
  }
  ck_assert_uint_eq(vmspy_counts(f.vm).maps, c1.maps); /* nothing mapped for them */
  /* Resume: the same mappings, announced, the data back. */
  from = f.rec->n;
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  expect_ranges(f.rec, from, 1, nmaps, addrs, sizes);
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, reserved);
  ck_assert_uint_eq(field(f.pool, "reserved"), reserved);
  live_check(&l, -1);
  s = state(f.pool);
  ck_assert(!s.paused);
  ck_assert_int_eq(s.mode, 0);
  ck_assert_uint_eq(s.unmapped, 0);
  ck_assert_uint_eq(s.backed_up, 0);
  ck_assert_uint_gt(s.host_bytes, 0); /* kept for the next pause */
  ck_assert_uint_eq(s.resumes, 1);
  ck_assert(pool_text(f.pool, "sleep", text, sizeof text));
  ck_assert_str_eq(text, "awake");
  CHECK_POOL(f.pool);
  /* Working: new blocks, and a second cycle. */
  void *q = alloc_ok(f.pool, 200 * KiB, NULL);
  pool_fill(q, 200 * KiB, 5);
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, STREAM(1)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, STREAM(2)), RMMC_SUCCESS);
  ck_assert(pool_filled(q, 200 * KiB, 5));
  live_check(&l, -1);
  free_ok(f.pool, q, 200 * KiB, NULL);
  live_free(f.pool, &l);
  /* release_cached lets the backup buffer go. */
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(state(f.pool).host_bytes, 0);
  ck_assert_uint_eq(state(f.pool).pauses, 2);
  CHECK_POOL(f.pool);
  free(addrs);
  free(sizes);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_sleep_discard_copies_nothing) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  live_t l;
  live_make(f.pool, &l);
  size_t reserved = field(f.pool, "reserved");
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_SUCCESS);
  rmmc_pool_sleep_state_t s = state(f.pool);
  ck_assert_int_eq(s.mode, RMMC_POOL_PAUSE_DISCARD);
  ck_assert_uint_eq(s.backed_up, 0);
  ck_assert_uint_eq(s.backup_ranges, 0);
  ck_assert_uint_eq(s.host_bytes, 0); /* no buffer was ever taken */
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, 0);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, reserved);
  /* Fresh pages (the vmspy's are zeros): the old contents did not come
   * back, and the blocks are usable at their addresses. */
  for (int i = 0; i < l.count; i++) {
    const unsigned char *b = l.p[i];
    ck_assert(!pool_filled(l.p[i], l.n[i], 100 + (unsigned)i));
    ck_assert_uint_eq(b[0], 0);
    ck_assert_uint_eq(b[l.n[i] - 1], 0);
    pool_fill(l.p[i], l.n[i], 100 + (unsigned)i);
  }
  live_check(&l, -1);
  CHECK_POOL(f.pool);
  live_free(f.pool, &l);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_sleep_frees_while_paused) {
  /* Frees are accepted while paused; release_cached then drops the
   * mappings lying in free memory, so resume maps less; the blocks still
   * live come back equal. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *a = alloc_ok(f.pool, 10 * PAGE, NULL), *b = alloc_ok(f.pool, 20 * PAGE, NULL);
  void *c = alloc_ok(f.pool, 3 * PAGE, STREAM(1));
  pool_fill(a, 10 * PAGE, 1);
  pool_fill(b, 20 * PAGE, 2);
  pool_fill(c, 3 * PAGE, 3);
  ck_assert_uint_eq(field(f.pool, "reserved"), 33 * PAGE);
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  free_ok(f.pool, b, 20 * PAGE, NULL);
  ck_assert_uint_eq(field(f.pool, "in_use"), 13 * PAGE);
  CHECK_POOL(f.pool);
  uint64_t maps = vmspy_counts(f.vm).maps;
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(f.vm).errors, 0); /* nothing unmapped twice */
  ck_assert_uint_eq(state(f.pool).unmapped, 13 * PAGE);
  ck_assert_uint_gt(state(f.pool).host_bytes, 0); /* paused: the backup stays */
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(f.vm).maps - maps, 13); /* 13 pages of 64 KiB */
  ck_assert_uint_eq(field(f.pool, "reserved"), 13 * PAGE);
  ck_assert(pool_filled(a, 10 * PAGE, 1));
  ck_assert(pool_filled(c, 3 * PAGE, 3));
  CHECK_POOL(f.pool);
  /* The hooks' balance: what is held now is registered. */
  ck_assert_uint_eq(hooks_held(f.rec), 13 * PAGE);
  free_ok(f.pool, a, 10 * PAGE, NULL);
  free_ok(f.pool, c, 3 * PAGE, STREAM(1));
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_sleep_unmap_refused_halfway_wakes_the_pool) {
  /* The upstream refuses the kth unmapping of a pause: the pool maps back
   * the k-1 that went, restores them, and is awake as before. */
  for (uint64_t k = 1; k <= 4; k++) {
    fix_t f;
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    fix_open(&f, &o);
    live_t l;
    live_make(f.pool, &l);
    size_t reserved = field(f.pool, "reserved");
    vmspy_counts_t c0 = vmspy_counts(f.vm);
    size_t nmaps = c0.maps - c0.unmaps;
    size_t from = f.rec->n;
    faulty_fail_every(faulty_of(f.fy), FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, k);
    rmmc_status_t st = rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL);
    faulty_disarm(faulty_of(f.fy));
    ck_assert_int_eq(st, RMMC_ERROR_CUDA);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "injected"));
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "awake as before"));
    ck_assert(!state(f.pool).paused);
    ck_assert_uint_eq(state(f.pool).unmapped, 0);
    ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, reserved);
    ck_assert_uint_eq(field(f.pool, "reserved"), reserved);
    /* Hooks: each mapping went and came back, or was refused (announced
     * gone, then held again). */
    ck_assert_uint_eq(f.rec->n - from, 2 * nmaps);
    ck_assert_uint_eq(faulty_counts(faulty_of(f.fy)).deallocate_injected, nmaps / k);
    live_check(&l, -1);
    CHECK_POOL(f.pool);
    void *p = alloc_ok(f.pool, 2 * PAGE, NULL);
    free_ok(f.pool, p, 2 * PAGE, NULL);
    /* And it can sleep afterwards. */
    ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
    ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, 0);
    ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
    live_check(&l, -1);
    live_free(f.pool, &l);
    fix_close(&f);
  }
}
END_TEST

START_TEST(test_pool_sleep_unmap_and_map_back_refused_stays_paused) {
  /* Every 3rd unmapping is refused and mapping back is refused too: the
   * pool stays paused, the refused mappings held (counted in reserved), the
   * others given back, and resume later brings all of it back. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  live_t l;
  live_make(f.pool, &l);
  size_t reserved = field(f.pool, "reserved");
  faulty_fail_every(faulty_of(f.fy), FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, 3);
  spy_fail_nth(spy_of(f.spy), 1); /* the first mapping back */
  rmmc_status_t st = rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL);
  faulty_disarm(faulty_of(f.fy));
  ck_assert_int_eq(st, RMMC_ERROR_CUDA);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "stays paused"));
  rmmc_pool_sleep_state_t s = state(f.pool);
  ck_assert(s.paused);
  uint64_t refused = faulty_counts(faulty_of(f.fy)).deallocate_injected;
  ck_assert_uint_ge(refused, 2);
  ck_assert_uint_gt(s.held, 0); /* the ones the upstream kept */
  ck_assert_uint_le(s.held, refused * PAGE);
  ck_assert_uint_eq(s.unmapped + s.held, reserved);
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, s.held);
  ck_assert_uint_eq(field(f.pool, "reserved"), s.held);
  CHECK_POOL(f.pool);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 256, 256, NULL, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, reserved);
  live_check(&l, -1);
  CHECK_POOL(f.pool);
  live_free(f.pool, &l);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_sleep_map_refused_halfway_stays_paused) {
  /* The kth mapping of a resume is refused: the ones it made go again, the
   * pool stays paused with its backup, and a later resume restores all. */
  for (uint64_t k = 1; k <= 4; k++) {
    fix_t f;
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    fix_open(&f, &o);
    live_t l;
    live_make(f.pool, &l);
    size_t reserved = field(f.pool, "reserved");
    ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
    size_t from = f.rec->n;
    vmspy_counts_t c0 = vmspy_counts(f.vm);
    spy_fail_nth(spy_of(f.spy), k);
    rmmc_status_t st = rmmc_pool_resume(f.pool, NULL);
    ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "stays paused"));
    vmspy_counts_t c1 = vmspy_counts(f.vm);
    ck_assert_uint_eq(c1.mapped_bytes, 0);
    ck_assert_uint_eq(c1.maps - c0.maps, k - 1);
    ck_assert_uint_eq(c1.unmaps - c0.unmaps, k - 1);
    ck_assert_uint_eq(f.rec->n - from, 2 * (k - 1)); /* each acquire matched by a release */
    rmmc_pool_sleep_state_t s = state(f.pool);
    ck_assert(s.paused);
    ck_assert_uint_eq(s.unmapped, reserved);
    ck_assert_uint_gt(s.backed_up, 0);
    CHECK_POOL(f.pool);
    ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
    live_check(&l, -1);
    CHECK_POOL(f.pool);
    live_free(f.pool, &l);
    fix_close(&f);
  }
}
END_TEST

/* ---- issue 41, F15: a failed pause or resume loses nothing ---- */

static const char *mode_text(int mode) { return mode == RMMC_POOL_PAUSE_BACKUP ? "backup" : "discard"; }

START_TEST(test_pool_sleep_finding_discard_refused_second_of_three) {
  /* The finding: three live 1 MiB blocks on three mappings, a discard pause
   * whose upstream refuses the 2nd of the 3 unmaps: it said "awake as
   * before" and 2 of the 3 blocks came back zeroed. Now the first block's
   * page had gone (its contents cannot come back), so the pause goes on:
   * the pool is paused, says so, holds the refused mapping, and resume
   * brings it back; a refusal of the 1st unmap leaves it awake, intact. */
  for (uint64_t k = 1; k <= 3; k++) {
    fix_t f;
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.small_max = 0;
    fix_open(&f, &o);
    void *b[3];
    for (int i = 0; i < 3; i++) {
      b[i] = alloc_ok(f.pool, 16 * PAGE, NULL);
      pool_fill(b[i], 16 * PAGE, 7u + (unsigned)i);
    }
    ck_assert_uint_eq(field(f.pool, "mappings"), 48); /* 16 per block: k = 17 is the second block */
    uint64_t nth = k == 1 ? 1 : k == 2 ? 17 : 33;
    faulty_fail_nth(faulty_of(f.fy), FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, nth);
    rmmc_status_t st = rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_DISCARD, NULL);
    faulty_disarm(faulty_of(f.fy));
    ck_assert_int_eq(st, RMMC_ERROR_CUDA);
    rmmc_pool_sleep_state_t s = state(f.pool);
    if (nth == 1) { /* nothing of a live block had gone: back as before */
      ck_assert_msg(!s.paused, "%s", rmmc_last_error_message());
      ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "awake as before"));
      for (int i = 0; i < 3; i++)
        ck_assert_msg(pool_filled(b[i], 16 * PAGE, 7u + (unsigned)i), "block %d lost", i);
    } else {
      ck_assert_msg(s.paused, "k=%llu: awake, yet pages under live blocks went: %s",
                    (unsigned long long)k, rmmc_last_error_message());
      ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "paused (discard)"));
      ck_assert_int_eq(s.mode, RMMC_POOL_PAUSE_DISCARD);
      ck_assert_uint_eq(s.held, PAGE); /* the one the upstream kept */
      ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, PAGE);
      refused_while_paused(f.pool, "pool", 256, NULL);
      CHECK_POOL(f.pool);
      ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
    }
    ck_assert_uint_eq(hooks_held(f.rec), 48 * PAGE);
    CHECK_POOL(f.pool);
    for (int i = 0; i < 3; i++) {
      pool_fill(b[i], 16 * PAGE, 70u + (unsigned)i); /* usable at their addresses */
      ck_assert(pool_filled(b[i], 16 * PAGE, 70u + (unsigned)i));
      free_ok(f.pool, b[i], 16 * PAGE, NULL);
    }
    fix_close(&f);
  }
}
END_TEST

/* A pool for every-k runs: spans of four mappings, blocks on both sides of
 * small_max on two streams, free mappings between live ones and at the
 * top (release_before_grow=false keeps them): about 30 mappings. */
typedef struct kset {
  fix_t f;
  void *p[6];
  size_t n[6];
  size_t reserved;
  uint64_t nmaps;
} kset_t;

static const size_t kset_sizes[6] = {4 * KiB, 40 * KiB, 3 * PAGE + 4 * KiB, 6 * PAGE, 2 * PAGE, 5 * PAGE};

static void kset_open(kset_t *k) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 64 * KiB;
  o.small_chunk = 256 * KiB;
  o.release_before_grow = false;
  fix_open(&k->f, &o);
  for (int i = 0; i < 6; i++) {
    k->n[i] = kset_sizes[i];
    k->p[i] = alloc_ok(k->f.pool, k->n[i], STREAM(i % 2));
    pool_fill(k->p[i], k->n[i], 20u + (unsigned)i);
  }
  free_ok(k->f.pool, k->p[3], k->n[3], STREAM(1)); /* free mappings between live ones ... */
  k->p[3] = NULL;
  void *top = alloc_ok(k->f.pool, 4 * PAGE, NULL);
  free_ok(k->f.pool, top, 4 * PAGE, NULL); /* ... and at the top */
  k->reserved = field(k->f.pool, "reserved");
  k->nmaps = field(k->f.pool, "mappings");
}

static bool kset_intact(const kset_t *k) {
  for (int i = 0; i < 6; i++)
    if (k->p[i] != NULL && !pool_filled(k->p[i], k->n[i], 20u + (unsigned)i)) return false;
  return true;
}

/* The pool is whole and works: every invariant, what is mapped is what
 * the hooks hold, blocks written and read at their addresses, a clean
 * backup cycle; then everything is freed and nothing leaks. */
static void kset_close(kset_t *k) {
  /* (A refusal while paused ran the out-of-memory rule, whose release_cached
   * may have dropped free mappings: reserved as it is now.) */
  size_t reserved = field(k->f.pool, "reserved");
  ck_assert_uint_le(reserved, k->reserved);
  ck_assert_uint_eq(vmspy_counts(k->f.vm).mapped_bytes, reserved);
  ck_assert_uint_eq(hooks_held(k->f.rec), reserved);
  CHECK_POOL(k->f.pool);
  for (int i = 0; i < 6; i++)
    if (k->p[i] != NULL) pool_fill(k->p[i], k->n[i], 20u + (unsigned)i);
  ck_assert_int_eq(rmmc_pool_pause(k->f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resume(k->f.pool, NULL), RMMC_SUCCESS);
  ck_assert(kset_intact(k));
  for (int i = 0; i < 6; i++)
    if (k->p[i] != NULL) free_ok(k->f.pool, k->p[i], k->n[i], STREAM(i % 2));
  fix_close(&k->f);
}

START_TEST(test_pool_sleep_refused_unmap_at_every_k_loses_nothing) {
  /* The kth unmap of a pause refused, for every k and both modes. The pool
   * is then either awake with every live block's data as it was, or
   * (discard, once a page under a live block had gone) paused as the
   * message says, holding the mapping the upstream kept, and resume brings
   * it back. */
  for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++) {
    int awake = 0, paused = 0;
    for (uint64_t k = 1;; k++) {
      kset_t ks;
      kset_open(&ks);
      faulty_fail_nth(faulty_of(ks.f.fy), FAULTY_DEALLOCATE, RMMC_ERROR_CUDA, k);
      rmmc_status_t st = rmmc_pool_pause(ks.f.pool, (rmmc_pool_pause_mode_t)mode, NULL);
      faulty_disarm(faulty_of(ks.f.fy));
      rmmc_pool_sleep_state_t s = state(ks.f.pool);
      bool last = k > ks.nmaps;
      if (last) {
        ck_assert_int_eq(st, RMMC_SUCCESS);
        ck_assert(s.paused);
        ck_assert_int_eq(rmmc_pool_resume(ks.f.pool, NULL), RMMC_SUCCESS);
      } else {
        ck_assert_msg(st == RMMC_ERROR_CUDA, "%s k=%llu: %s", mode_text(mode),
                      (unsigned long long)k, rmmc_status_name(st));
        CHECK_POOL(ks.f.pool);
        if (!s.paused) {
          awake++;
          ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "awake as before"));
          ck_assert_uint_eq(vmspy_counts(ks.f.vm).mapped_bytes, ks.reserved);
          ck_assert_msg(kset_intact(&ks), "%s k=%llu: awake, data lost", mode_text(mode),
                        (unsigned long long)k);
        } else {
          paused++;
          ck_assert_msg(mode == RMMC_POOL_PAUSE_DISCARD, "backup k=%llu: paused: %s",
                        (unsigned long long)k, rmmc_last_error_message());
          ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "paused (discard)"));
          ck_assert(s.held > 0 && s.held <= PAGE); /* the one mapping the upstream kept */
          ck_assert_uint_eq(s.held + s.unmapped, ks.reserved);
          refused_while_paused(ks.f.pool, "pool", 4096, STREAM(1));
          ck_assert_int_eq(rmmc_pool_resume(ks.f.pool, NULL), RMMC_SUCCESS);
        }
      }
      kset_close(&ks);
      if (last) break;
    }
    if (mode == RMMC_POOL_PAUSE_BACKUP) ck_assert_int_eq(paused, 0);
    else ck_assert_msg(awake > 1 && paused > 1, "discard: %d awake, %d paused", awake, paused);
  }
}
END_TEST

START_TEST(test_pool_sleep_refused_map_at_every_k_loses_nothing) {
  /* The kth mapping of a resume refused, for every k and both modes: the
   * pool stays paused (nothing mapped, the backup kept), whole, and the
   * next resume brings every live block back (its data after a backup). */
  for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++)
    for (uint64_t k = 1;; k++) {
      kset_t ks;
      kset_open(&ks);
      ck_assert_int_eq(rmmc_pool_pause(ks.f.pool, (rmmc_pool_pause_mode_t)mode, NULL),
                       RMMC_SUCCESS);
      spy_fail_nth(spy_of(ks.f.spy), k);
      rmmc_status_t st = rmmc_pool_resume(ks.f.pool, NULL);
      spy_fail_nth(spy_of(ks.f.spy), 0);
      bool last = k > ks.nmaps;
      if (!last) {
        ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
        ck_assert(state(ks.f.pool).paused);
        ck_assert_uint_eq(vmspy_counts(ks.f.vm).mapped_bytes, 0);
        ck_assert_uint_eq(hooks_held(ks.f.rec), 0);
        CHECK_POOL(ks.f.pool);
        ck_assert_int_eq(rmmc_pool_resume(ks.f.pool, NULL), RMMC_SUCCESS);
      } else {
        ck_assert_int_eq(st, RMMC_SUCCESS);
      }
      if (mode == RMMC_POOL_PAUSE_BACKUP) ck_assert(kset_intact(&ks));
      kset_close(&ks);
      if (last) break;
    }
}
END_TEST

START_TEST(test_pool_sleep_no_host_memory_for_the_backup) {
  /* The backup's host buffer cannot be had (the address-space limit of
   * this forked test process is lowered): out of memory, nothing unmapped,
   * the pool awake and whole; with the limit back it pauses. Not under
   * sanitizers, which need address space of their own. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return;
#endif
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *a = alloc_ok(f.pool, 48 * MiB, NULL);
  pool_fill(a, 48 * MiB, 31);
  size_t reserved = field(f.pool, "reserved");
  uint64_t events = f.rec->n, unmaps = vmspy_counts(f.vm).unmaps;
  struct rlimit old, low;
  ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
  FILE *st = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  ck_assert_int_eq(fscanf(st, "%lu", &pages), 1);
  fclose(st);
  low = old;
  low.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + 8 * MiB;
  ck_assert_int_eq(setrlimit(RLIMIT_AS, &low), 0);
  rmmc_status_t r = rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL);
  ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
  ck_assert_int_eq(r, RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "nothing changed"));
  ck_assert(!state(f.pool).paused);
  ck_assert_uint_eq(vmspy_counts(f.vm).unmaps, unmaps);
  ck_assert_uint_eq(vmspy_counts(f.vm).mapped_bytes, reserved);
  ck_assert_uint_eq(f.rec->n, events);
  ck_assert(pool_filled(a, 48 * MiB, 31));
  void *b = alloc_ok(f.pool, 1 * MiB, NULL);
  free_ok(f.pool, b, 1 * MiB, NULL);
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  ck_assert(pool_filled(a, 48 * MiB, 31));
  free_ok(f.pool, a, 48 * MiB, NULL);
  fix_close(&f);
}
END_TEST

START_TEST(test_pool_sleep_over_sim_and_bad_input) {
  /* Backup over sim (its addresses have no memory) and bad calls: refused,
   * the pool awake and untouched; discard over sim works. */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=true) > sim", -1, &r), RMMC_SUCCESS);
  void *a = alloc_ok(r, 8 * MiB, NULL);
  size_t reserved = field(r, "reserved");
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "sim"));
  ck_assert(!state(r).paused);
  ck_assert_int_eq(rmmc_pool_pause(r, (rmmc_pool_pause_mode_t)7, NULL),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "not paused"));
  /* Discard works over sim: its mapped ranges go and come back. */
  rmmc_resource_t *sim = rmmc_resource_upstream(r);
  ck_assert_uint_eq(field(sim, "in_use"), reserved);
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(sim, "in_use"), 0);
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "paused already"));
  ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(sim, "in_use"), reserved);
  CHECK_POOL(r);
  free_ok(r, a, 8 * MiB, NULL);
  rmmc_resource_release(r);
  /* Bad input. */
  rmmc_pool_sleep_state_t s = RMMC_POOL_SLEEP_STATE_INIT;
  ck_assert_int_eq(rmmc_pool_pause(NULL, RMMC_POOL_PAUSE_DISCARD, NULL),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_resume(NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_pool_sleep_state(NULL, &s), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_t *h;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &h), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_pause(h, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no pool layer"));
  ck_assert_int_eq(rmmc_pool_sleep_state(h, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_release(h);
}
END_TEST

START_TEST(test_pool_sleep_chunk_pools_refused) {
  /* expandable=0 over a virtual-memory upstream, and a pool over an
   * upstream without virtual memory: NOT_SUPPORTED, naming why; the pool
   * keeps working, nothing unmapped. */
  const char *specs[] = {"pool(expandable=false) > host", "pool > statistics > host"};
  const char *why[] = {"expandable=0", "no virtual memory"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *r;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    void *a = alloc_ok(r, 3 * MiB, NULL);
    pool_fill(a, 3 * MiB, 4);
    for (int mode = 1; mode <= 2; mode++) {
      ck_assert_int_eq(rmmc_pool_pause(r, (rmmc_pool_pause_mode_t)mode, NULL),
                       RMMC_ERROR_NOT_SUPPORTED);
      ck_assert_msg(strstr(rmmc_last_error_message(), why[i]) != NULL &&
                        strstr(rmmc_last_error_message(), "chunks") != NULL,
                    "%s: %s", specs[i], rmmc_last_error_message());
    }
    ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_ERROR_NOT_SUPPORTED);
    rmmc_pool_sleep_state_t s = state(r);
    ck_assert(!s.can_sleep && !s.paused);
    ck_assert(pool_filled(a, 3 * MiB, 4));
    void *b = alloc_ok(r, 1 * MiB, NULL);
    free_ok(r, b, 1 * MiB, NULL);
    CHECK_POOL(r);
    free_ok(r, a, 3 * MiB, NULL);
    rmmc_resource_release(r);
  }
}
END_TEST

/* ---- issue 41, F14: caching layers over a paused pool ---- */

START_TEST(test_pool_sleep_caching_layers_hand_out_nothing_while_paused) {
  /* The finding: allocate 256 B from binning or fixed_size over a pool,
   * free it, pause, allocate 256 B: it came from the layer's free list, on
   * a page the pause had unmapped (writing it crashed). Now every size on
   * every stream is refused with the pool's own message while paused, frees
   * are taken, and after resume the layers serve again, live blocks intact
   * after a backup. The arena is the pool itself. */
  static const char *const specs[] = {
      "binning > pool > host",
      "fixed_size(block=4096) > pool > host",
      "binning > limiting(limit=1GiB) > pool > host",
      "fixed_size(block=64KiB) > statistics > pool(small_max=0) > host",
      "arena > host",
      "binning > arena > host",
  };
  static const size_t sizes[] = {256, 1000, 4096, 64 * KiB, 1 * MiB, 3 * MiB};
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(specs[_i], -1, &r), RMMC_SUCCESS);
  size_t block = 0;
  for (rmmc_resource_t *x = r; x != NULL && block == 0; x = rmmc_resource_upstream(x))
    if (strcmp(rmmc_resource_name(x), "fixed_size") == 0) block = rmmc_fixed_size_resource_block_size(x);
  void *kept[6] = {0}, *freed[6] = {0};
  for (int i = 0; i < 6; i++) {
    if (block != 0 && sizes[i] > block) continue;
    kept[i] = alloc_ok(r, sizes[i], STREAM(i % 2));
    pool_fill(kept[i], sizes[i], 10u + (unsigned)i);
    freed[i] = alloc_ok(r, sizes[i], STREAM(i % 2));
  }
  for (int i = 0; i < 6; i++)
    if (freed[i] != NULL) free_ok(r, freed[i], sizes[i], STREAM(i % 2)); /* in the layer's lists */
  for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++) {
    ck_assert_msg(rmmc_pool_pause(r, (rmmc_pool_pause_mode_t)mode, NULL) == RMMC_SUCCESS, "%s: %s",
                  specs[_i], rmmc_last_error_message());
    for (int i = 0; i < 6; i++)
      if (kept[i] != NULL)
        for (int k = 0; k < 3; k++) refused_while_paused(r, specs[_i], sizes[i], STREAM(k));
    /* A free while paused goes into the layer's list: still refused. */
    if (mode == RMMC_POOL_PAUSE_DISCARD && kept[0] != NULL) {
      free_ok(r, kept[0], sizes[0], STREAM(0));
      kept[0] = NULL;
      refused_while_paused(r, specs[_i], sizes[0], STREAM(0));
    }
    ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_SUCCESS);
    for (int i = 0; i < 6; i++) {
      if (kept[i] == NULL) continue;
      if (mode == RMMC_POOL_PAUSE_BACKUP)
        ck_assert_msg(pool_filled(kept[i], sizes[i], 10u + (unsigned)i), "%s: block %d differs",
                      specs[_i], i);
      void *q = alloc_ok(r, sizes[i], STREAM(i % 2)); /* served again after resume */
      pool_fill(q, sizes[i], 99);
      ck_assert(pool_filled(q, sizes[i], 99));
      free_ok(r, q, sizes[i], STREAM(i % 2));
    }
  }
  for (int i = 0; i < 6; i++)
    if (kept[i] != NULL) free_ok(r, kept[i], sizes[i], STREAM(i % 2));
  for (rmmc_resource_t *x = r; x != NULL; x = rmmc_resource_upstream(x))
    if (strcmp(rmmc_resource_name(x), "pool") == 0 || strcmp(rmmc_resource_name(x), "arena") == 0)
      CHECK_POOL(x);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_pool_sleep_pool_over_a_pool_cannot_pause) {
  /* A pool over a pool caches the lower pool's memory as a layer does, and
   * its hot path does not ask below: pausing the lower pool while one is
   * stacked over it is refused, nothing changed; once the upper pool is
   * gone the lower one pauses. The stack's top (a chunk pool) cannot pause
   * either. */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=false) > pool > host", -1, &r), RMMC_SUCCESS);
  rmmc_resource_t *lower = rmmc_resource_retain(rmmc_resource_upstream(r));
  void *a = alloc_ok(r, 256, NULL);
  free_ok(r, a, 256, NULL);
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_ERROR_NOT_SUPPORTED);
  for (int mode = RMMC_POOL_PAUSE_BACKUP; mode <= RMMC_POOL_PAUSE_DISCARD; mode++) {
    ck_assert_int_eq(rmmc_pool_pause(lower, (rmmc_pool_pause_mode_t)mode, NULL),
                     RMMC_ERROR_NOT_SUPPORTED);
    ck_assert_msg(strstr(rmmc_last_error_message(), "1 pool over this one") != NULL, "%s",
                  rmmc_last_error_message());
  }
  ck_assert(!state(lower).paused);
  a = alloc_ok(r, 256, NULL);
  pool_fill(a, 256, 3);
  ck_assert(pool_filled(a, 256, 3));
  free_ok(r, a, 256, NULL);
  CHECK_POOL(lower);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_pool_pause(lower, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resume(lower, NULL), RMMC_SUCCESS);
  rmmc_resource_release(lower);
}
END_TEST

START_TEST(test_pool_sleep_pools_are_independent) {
  /* Weights and cache: two pools over one vmspy, paused and resumed in
   * turn through adaptor stacks; the one awake keeps working. */
  rmmc_resource_t *spy = new_spy(), *vm, *wp, *cp, *weights, *cache;
  ck_assert_int_eq(vmspy_create(spy, 4 * KiB, &vm), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  o.page_size = PAGE;
  o.address_space = 64 * MiB;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &wp), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &cp), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(wp, &weights), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(cp, 64 * MiB, &cache), RMMC_SUCCESS);
  void *w = alloc_ok(weights, 6 * MiB, NULL), *c = alloc_ok(cache, 5 * MiB, NULL);
  pool_fill(w, 6 * MiB, 11);
  pool_fill(c, 5 * MiB, 12);
  size_t wr = field(wp, "reserved"), cr = field(cp, "reserved");
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, wr + cr);
  ck_assert_int_eq(rmmc_pool_pause(weights, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, cr);
  ck_assert(state(weights).paused && !state(cache).paused);
  ck_assert(pool_filled(c, 5 * MiB, 12));
  void *c2 = alloc_ok(cache, 2 * MiB, NULL); /* the cache pool still serves */
  ck_assert_int_eq(rmmc_pool_pause(cache, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  ck_assert_int_eq(rmmc_pool_resume(cache, NULL), RMMC_SUCCESS); /* out of order */
  ck_assert(state(weights).paused && !state(cache).paused);
  ck_assert_int_eq(rmmc_pool_resume(weights, NULL), RMMC_SUCCESS);
  ck_assert(pool_filled(w, 6 * MiB, 11));
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, field(wp, "reserved") + field(cp, "reserved"));
  CHECK_POOL(wp);
  CHECK_POOL(cp);
  free_ok(weights, w, 6 * MiB, NULL);
  free_ok(cache, c, 5 * MiB, NULL);
  free_ok(cache, c2, 2 * MiB, NULL);
  rmmc_resource_release(weights);
  rmmc_resource_release(cache);
  rmmc_resource_release(wp);
  rmmc_resource_release(cp);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  rmmc_resource_release(vm);
  finish(NULL, spy);
}
END_TEST

START_TEST(test_pool_sleep_hooks_and_peers_set_while_paused) {
  /* Hooks replaced while paused hear nothing of the mappings that are off
   * and hear them come back; a peer enabled while paused is granted each
   * mapping as resume maps it. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *a = alloc_ok(f.pool, 4 * PAGE, NULL);
  pool_fill(a, 4 * PAGE, 8);
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  rec_t *second = calloc(1, sizeof *second);
  size_t from = f.rec->n;
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = on_acq;
  h.on_release = on_rel;
  h.user = second;
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(f.pool, &h), RMMC_SUCCESS);
  ck_assert_uint_eq(f.rec->n, from); /* nothing held: nothing to let go */
  ck_assert_uint_eq(second->n, 0);
  ck_assert_int_eq(rmmc_resource_enable_peer_access(f.pool, 3), RMMC_SUCCESS);
  ck_assert_uint_eq(vmspy_counts(f.vm).errors, 0); /* no grant of unmapped pages */
  ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(second->n, 4);
  size_t mapped = 0;
  ck_assert_uint_eq(vmspy_unreachable(f.vm, 3, &mapped), 0);
  ck_assert_uint_eq(mapped, 4);
  ck_assert(pool_filled(a, 4 * PAGE, 8));
  free_ok(f.pool, a, 4 * PAGE, NULL);
  rmmc_resource_release(f.pool);
  f.pool = NULL;
  ck_assert_uint_eq(second->n, 8); /* destruction: released what it heard */
  free(second);
  vmspy_counts_t c = vmspy_counts(f.vm);
  ck_assert_uint_eq(c.errors, 0);
  ck_assert_uint_eq(c.mapped_bytes, 0);
  rmmc_resource_release(f.vm);
  rmmc_resource_release(f.fy);
  finish(NULL, f.spy);
  free(f.rec);
}
END_TEST

START_TEST(test_pool_sleep_destroy_while_paused_leaks_nothing) {
  for (int mode = 1; mode <= 2; mode++) {
    fix_t f;
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    fix_open(&f, &o);
    live_t l;
    live_make(f.pool, &l);
    ck_assert_int_eq(rmmc_pool_pause(f.pool, (rmmc_pool_pause_mode_t)mode, NULL), RMMC_SUCCESS);
    size_t before = f.rec->n;
    fix_close(&f); /* vmspy: nothing mapped, no bad call; spy: nothing outstanding */
    (void)before;
  }
}
END_TEST

START_TEST(test_pool_sleep_over_host_with_threads_after) {
  /* Over the host resource (real virtual memory): a cycle, then threads on
   * their own streams use the pool as before. */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=true, page=2MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  live_t l;
  live_make(r, &l);
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_SUCCESS);
  live_check(&l, -1);
  live_free(r, &l);
  pool_run_t run = {.seed = 7u, .steps = 3000, .max_live = 48, .nstreams = 2,
                    .small_max = 1 * MiB, .max_bytes = 8 * MiB, .max_align = 64 * KiB,
                    .real = true, .release_every = 1000};
  pool_mt_result_t res = pool_threaded_run(r, &run, 4);
  ck_assert_msg(res.failures == 0, "%s", res.first);
  /* And a second cycle with nothing live: discard, nothing copied. */
  ck_assert_int_eq(rmmc_pool_pause(r, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(state(r).backed_up, 0);
  ck_assert_int_eq(rmmc_pool_resume(r, NULL), RMMC_SUCCESS);
  CHECK_POOL(r);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_pool_sleep_graph_pools_sleep_too) {
  /* A graph pool's blocks (routed by stream, as a capture would be) are
   * live blocks like any: backed up and restored. While paused a routed
   * allocation is refused too; after resume routing works as before. */
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  fix_open(&f, &o);
  ck_assert_int_eq(rmmc_pool_graph_begin(f.pool, 7, 1, true, STREAM(5)), RMMC_SUCCESS);
  void *g = alloc_ok(f.pool, 3 * PAGE + 512, STREAM(5)), *h = alloc_ok(f.pool, 2048, STREAM(5));
  pool_fill(g, 3 * PAGE + 512, 21);
  pool_fill(h, 2048, 22);
  ck_assert_uint_gt(field(f.pool, "graph_bytes"), 3 * PAGE);
  ck_assert_int_eq(rmmc_pool_pause(f.pool, RMMC_POOL_PAUSE_BACKUP, NULL), RMMC_SUCCESS);
  ck_assert_uint_ge(state(f.pool).backed_up, 3 * PAGE + 512 + 2048);
  void *x = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4096, 256, STREAM(5), &x),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(x);
  ck_assert_int_eq(rmmc_pool_resume(f.pool, STREAM(5)), RMMC_SUCCESS);
  ck_assert(pool_filled(g, 3 * PAGE + 512, 21));
  ck_assert(pool_filled(h, 2048, 22));
  size_t before = field(f.pool, "graph_bytes");
  void *k = alloc_ok(f.pool, 4096, STREAM(5)); /* routed to the graph pool again */
  ck_assert_uint_gt(field(f.pool, "graph_bytes"), before);
  CHECK_POOL(f.pool);
  free_ok(f.pool, k, 4096, STREAM(5));
  free_ok(f.pool, g, 3 * PAGE + 512, STREAM(5));
  free_ok(f.pool, h, 2048, STREAM(5));
  ck_assert_int_eq(rmmc_pool_graph_end(f.pool, 7, 1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_graph_release(f.pool, 7, 1), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  fix_close(&f);
}
END_TEST

/* Threads that free (and try to allocate) while the main thread pauses
 * and resumes; they never touch the memory, which may be unmapped. */
typedef struct churn {
  rmmc_resource_t *pool;
  void *p[64];
  size_t n[64];
  int id, refused, served, bad;
} churn_t;

static void *churn_run(void *arg) {
  churn_t *c = arg;
  cudaStream_t s = STREAM(10 + c->id);
  for (int i = 0; i < 64; i++) {
    void *q = NULL;
    size_t n = (size_t)(i % 7 + 1) * 5000 + (i % 3 == 0 ? 300 * KiB : 0);
    rmmc_status_t st = rmmc_resource_allocate(c->pool, n, 256, s, &q);
    if (st == RMMC_SUCCESS) {
      c->served++;
      if (rmmc_resource_deallocate(c->pool, q, n, 256, s) != RMMC_SUCCESS) c->bad++;
    } else if (st == RMMC_ERROR_OUT_OF_MEMORY &&
               strstr(rmmc_last_error_message(), "paused") != NULL) {
      c->refused++;
    } else {
      c->bad++;
    }
    if (rmmc_resource_deallocate(c->pool, c->p[i], c->n[i], 256, s) != RMMC_SUCCESS) c->bad++;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

START_TEST(test_pool_sleep_frees_race_with_pause_and_resume) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = 256 * KiB;
  o.small_max = 64 * KiB;
  fix_open(&f, &o);
  churn_t c[4];
  pthread_t t[4];
  for (int k = 0; k < 4; k++) {
    c[k] = (churn_t){.pool = f.pool, .id = k};
    for (int i = 0; i < 64; i++) {
      c[k].n[i] = (size_t)(i * 37 % 50 + 1) * 3000 + (i % 5 == 0 ? 200 * KiB : 0);
      c[k].p[i] = alloc_ok(f.pool, c[k].n[i], STREAM(10 + k));
    }
  }
  for (int k = 0; k < 4; k++) ck_assert_int_eq(pthread_create(&t[k], NULL, churn_run, &c[k]), 0);
  int cycles = 0;
  for (; cycles < 40; cycles++) {
    rmmc_pool_pause_mode_t m = cycles % 2 ? RMMC_POOL_PAUSE_DISCARD : RMMC_POOL_PAUSE_BACKUP;
    ck_assert_int_eq(rmmc_pool_pause(f.pool, m, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
    ck_assert_int_eq(rmmc_pool_resume(f.pool, NULL), RMMC_SUCCESS);
    CHECK_POOL(f.pool);
  }
  for (int k = 0; k < 4; k++) ck_assert_int_eq(pthread_join(t[k], NULL), 0);
  int refused = 0;
  for (int k = 0; k < 4; k++) {
    ck_assert_int_eq(c[k].bad, 0);
    ck_assert_int_eq(c[k].served + c[k].refused, 64);
    refused += c[k].refused;
  }
  ck_assert_uint_eq(field(f.pool, "in_use"), 0);
  ck_assert_uint_eq(state(f.pool).pauses, (uint64_t)cycles);
  CHECK_POOL(f.pool);
  printf("race: %d of 256 allocations met a pause\n", refused); /* timing decides */
  fix_close(&f);
}
END_TEST

/* ---- the conformance battery over caching layers on a pool that sleeps ---- */

/* A pool that can sleep over vmspy > faulty > up (so the battery can
 * refuse its unmaps and maps); `arena`: in the arena's mode. */
static rmmc_status_t sleeping_pool(rmmc_resource_t *up, bool arena, rmmc_resource_t **out) {
  rmmc_resource_t *fy = NULL, *vm = NULL;
  rmmc_status_t st = faulty_create(up, &fy);
  if (st == RMMC_SUCCESS) st = vmspy_create(fy, 4 * KiB, &vm);
  if (st == RMMC_SUCCESS && arena) {
    rmmc_arena_options_t a = RMMC_ARENA_OPTIONS_INIT;
    st = rmmc_arena_resource_create(vm, &a, out);
  } else if (st == RMMC_SUCCESS) {
    rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
    o.page_size = PAGE;
    o.address_space = 256 * MiB;
    st = rmmc_pool_resource_create(vm, &o, out);
  }
  rmmc_resource_release(vm);
  rmmc_resource_release(fy);
  return st;
}

/* binning(max=16KiB) over the pool, or fixed_size(block=64KiB) over the
 * arena. Bins up to 16 KiB: the battery's 30,000 streams cost each bin a
 * stream slot, and its 64 KiB blocks go to the pool. */
static rmmc_status_t cached_over_sleeping(rmmc_resource_t *up, bool arena, rmmc_resource_t **out) {
  rmmc_resource_t *pool;
  rmmc_status_t st = sleeping_pool(up, arena, &pool);
  if (st != RMMC_SUCCESS) return st;
  rmmc_binning_options_t b = RMMC_BINNING_OPTIONS_INIT;
  rmmc_fixed_size_options_t f = RMMC_FIXED_SIZE_OPTIONS_INIT;
  b.max_bin = 16 * KiB;
  f.block_size = 64 * KiB;
  st = arena ? rmmc_fixed_size_resource_create(pool, &f, out)
             : rmmc_binning_resource_create(pool, &b, out);
  rmmc_resource_release(pool);
  return st;
}

static rmmc_status_t make_binning_over_pool(rmmc_resource_t *up, rmmc_resource_t **out) {
  return cached_over_sleeping(up, false, out);
}

static rmmc_status_t make_fixed_size_over_arena(rmmc_resource_t *up, rmmc_resource_t **out) {
  return cached_over_sleeping(up, true, out);
}

static const conformance_case_t conformance_cases[] = {
    {"binning(max=16KiB) > pool(page=64KiB) > vmspy > faulty", make_binning_over_pool, 0},
    {"fixed_size(block=64KiB) > arena > vmspy > faulty", make_fixed_size_over_arena, 64 * KiB},
};

static Suite *suite(void) {
  Suite *s = suite_create("pool_sleep");
  conformance_add(s, conformance_cases, 2);
  TCase *tc = tcase_create("sleep");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pool_sleep_backup_restores_at_the_same_addresses);
  tcase_add_test(tc, test_pool_sleep_discard_copies_nothing);
  tcase_add_test(tc, test_pool_sleep_frees_while_paused);
  tcase_add_test(tc, test_pool_sleep_unmap_refused_halfway_wakes_the_pool);
  tcase_add_test(tc, test_pool_sleep_unmap_and_map_back_refused_stays_paused);
  tcase_add_test(tc, test_pool_sleep_map_refused_halfway_stays_paused);
  tcase_add_test(tc, test_pool_sleep_no_host_memory_for_the_backup);
  tcase_add_test(tc, test_pool_sleep_finding_discard_refused_second_of_three);
  tcase_add_test(tc, test_pool_sleep_refused_unmap_at_every_k_loses_nothing);
  tcase_add_test(tc, test_pool_sleep_refused_map_at_every_k_loses_nothing);
  tcase_add_test(tc, test_pool_sleep_over_sim_and_bad_input);
  tcase_add_test(tc, test_pool_sleep_chunk_pools_refused);
  tcase_add_test(tc, test_pool_sleep_pools_are_independent);
  tcase_add_loop_test(tc, test_pool_sleep_caching_layers_hand_out_nothing_while_paused, 0, 6);
  tcase_add_test(tc, test_pool_sleep_pool_over_a_pool_cannot_pause);
  tcase_add_test(tc, test_pool_sleep_hooks_and_peers_set_while_paused);
  tcase_add_test(tc, test_pool_sleep_destroy_while_paused_leaks_nothing);
  tcase_add_test(tc, test_pool_sleep_over_host_with_threads_after);
  tcase_add_test(tc, test_pool_sleep_graph_pools_sleep_too);
  tcase_add_test(tc, test_pool_sleep_frees_race_with_pause_and_resume);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
