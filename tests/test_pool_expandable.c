/*
 * The pool with expandable=true over a checked virtual-memory upstream
 * (tests/support/vmspy.h over a spy; no GPU): the conformance battery,
 * growth in place within the budget, pages given back by release_cached
 * and before mapping more, data kept while other pages go, the maximum,
 * failed mappings (first page, a middle page, the last resort), address
 * space running out, several streams, every invariant after every step of
 * a long random run, bad options, and the spec over sim and host. Host
 * suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"
#include "vmspy.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define PAGE (64 * KiB)
#define STREAM(n) ((cudaStream_t)(uintptr_t)(n))

#define CHECK_POOL(r)                                                          \
  do {                                                                         \
    rmmc_status_t check_st_ = rmmc_pool_resource_check(r);                     \
    ck_assert_msg(check_st_ == RMMC_SUCCESS, "%s", rmmc_last_error_message()); \
  } while (0)

/* A small deterministic generator (xorshift). */
static unsigned next_rand(unsigned *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

/* A pool with expandable=true and `o`'s other options over a vmspy over
 * `up`; *vm gets the vmspy (borrowed: the pool holds it). */
static rmmc_status_t make_over(rmmc_resource_t *up, rmmc_pool_options_t *o, rmmc_resource_t **vm,
                               rmmc_resource_t **out) {
  rmmc_resource_t *v;
  rmmc_status_t st = vmspy_create(up, 4 * KiB, &v);
  if (st != RMMC_SUCCESS) return st;
  o->expandable = true;
  if (o->page_size == 0) o->page_size = PAGE;
  if (o->address_space == 0) o->address_space = 256 * MiB;
  st = rmmc_pool_resource_create(v, o, out);
  if (vm != NULL) *vm = v;
  rmmc_resource_release(v);
  return st;
}

/* ---- conformance ---- */

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  return make_over(up, &o, NULL, out);
}

static rmmc_status_t make_tight(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.release_slack = 0.0;
  o.small_max = 16 * KiB;
  o.small_chunk = 128 * KiB;
  o.address_space = 16 * MiB; /* requests past it take more reservations */
  return make_over(up, &o, NULL, out);
}

static rmmc_status_t make_unseparated(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.initial_size = 1 * MiB;
  return make_over(up, &o, NULL, out);
}

static const conformance_case_t cases[] = {
    {"pool(expandable=true,page=64KiB)", make_default, 0},
    {"pool(expandable=true,release_slack=0,small_max=16KiB,address_space=16MiB)", make_tight, 0},
    {"pool(expandable=true,small_max=0,release_before_grow=false,initial=1MiB)", make_unseparated,
     0},
};

/* ---- fixture: pool > vmspy > spy ---- */

typedef struct fix {
  rmmc_resource_t *spy, *vm, *pool;
} fix_t;

static void fix_open(fix_t *f, rmmc_pool_options_t *o) {
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &f->spy), RMMC_SUCCESS);
  ck_assert_int_eq(make_over(f->spy, o, &f->vm, &f->pool), RMMC_SUCCESS);
}

/* Frees nothing: the caller freed its blocks. Everything goes back, no
 * upstream call was refused as malformed, nothing leaks. */
static void fix_close(fix_t *f) {
  CHECK_POOL(f->pool);
  ck_assert_int_eq(rmmc_resource_release_cached(f->pool), RMMC_SUCCESS);
  ck_assert_uint_eq(field(f->pool, "reserved"), 0);
  ck_assert_uint_eq(vmspy_counts(f->vm).mapped_bytes, 0);
  ck_assert_uint_eq(vmspy_counts(f->vm).errors, 0);
  rmmc_resource_release(f->pool);
  spy_counts_t c = spy_counts(spy_of(f->spy));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(f->spy);
}

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 509) b[i] = (unsigned char)(seed * 31 + i);
  b[n - 1] = (unsigned char)(seed ^ 0xa5);
}

static bool filled(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 509)
    if (b[i] != (unsigned char)(seed * 31 + i)) return false;
  return b[n - 1] == (unsigned char)(seed ^ 0xa5);
}

/* A growing workload (a KV cache reallocated larger each step while a
 * scratch block comes and goes) stays in one reservation and within the
 * budget, where chunks would strand the old sizes. */
START_TEST(test_grows_in_place_within_budget) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  void *cache = NULL;
  size_t cache_n = 0, peak_live = 0;
  for (unsigned step = 1; step <= 60; step++) {
    size_t n = step * 200 * KiB + 4096;
    void *p, *scratch;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, n, 256, NULL, &p), RMMC_SUCCESS);
    fill(p, n, step);
    size_t sn = (61 - step) * 50 * KiB;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, sn, 256, NULL, &scratch), RMMC_SUCCESS);
    fill(scratch, sn, step + 100);
    size_t live = n + sn + cache_n;
    if (live > peak_live) peak_live = live;
    if (cache != NULL) {
      ck_assert(filled(cache, cache_n, step - 1));
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, cache, cache_n, 256, NULL), RMMC_SUCCESS);
    }
    ck_assert(filled(scratch, sn, step + 100));
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, scratch, sn, 256, NULL), RMMC_SUCCESS);
    cache = p;
    cache_n = n;
    CHECK_POOL(f.pool);
    /* Budget: 1.05 x the peak in use, plus the pages a block end touches. */
    ck_assert_uint_le(field(f.pool, "reserved"), peak_live * 105 / 100 + 4 * PAGE);
  }
  ck_assert_uint_eq(field(f.pool, "chunks"), 1);
  ck_assert_uint_eq(vmspy_counts(f.vm).reserves, 1);
  ck_assert_uint_gt(field(f.pool, "page_unmaps"), 0);
  ck_assert(filled(cache, cache_n, 60));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, cache, cache_n, 256, NULL), RMMC_SUCCESS);
  fix_close(&f);
}
END_TEST

/* release_cached unmaps every free page and keeps the pages under live
 * blocks, whose data survives; the pool serves again afterwards. */
START_TEST(test_release_cached_keeps_live_pages) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 16 * KiB; /* the blocks below are large: no slabs */
  o.small_chunk = 64 * KiB;
  fix_open(&f, &o);
  void *p[40];
  size_t n[40];
  for (int i = 0; i < 40; i++) {
    n[i] = (size_t)(i % 7 + 1) * 37 * KiB + (size_t)i * 1000;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, n[i], 256, STREAM(i % 3), &p[i]), RMMC_SUCCESS);
    fill(p[i], n[i], (unsigned)i);
  }
  for (int i = 0; i < 40; i += 2)
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], n[i], 256, STREAM(i % 3)), RMMC_SUCCESS);
  size_t before = field(f.pool, "reserved");
  ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  CHECK_POOL(f.pool);
  size_t after = field(f.pool, "reserved");
  ck_assert_uint_lt(after, before);
  ck_assert_uint_eq(after, vmspy_counts(f.vm).mapped_bytes);
  /* What is still mapped is what the live blocks touch. */
  size_t live_pages = 0;
  for (int i = 1; i < 40; i += 2) live_pages += n[i] / PAGE + 2;
  ck_assert_uint_le(after, live_pages * PAGE);
  for (int i = 1; i < 40; i += 2) ck_assert(filled(p[i], n[i], (unsigned)i));
  /* Serves again, over the pages it gave back. */
  for (int i = 0; i < 40; i += 2) {
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, n[i], 256, STREAM(i % 3), &p[i]), RMMC_SUCCESS);
    fill(p[i], n[i], (unsigned)i + 50);
  }
  CHECK_POOL(f.pool);
  for (int i = 0; i < 40; i++) {
    ck_assert(filled(p[i], n[i], (unsigned)i + (i % 2 ? 0 : 50)));
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], n[i], 256, STREAM(i % 3)), RMMC_SUCCESS);
  }
  fix_close(&f);
}
END_TEST

/* A refused mapping, on the first page or in the middle of a large block,
 * that the last resort cannot cure: a clean out-of-memory status, the pool
 * intact, the pages mapped so far counted (and given back later), and the
 * next request served. */
START_TEST(test_map_failure_is_clean) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  spy_t *s = spy_of(f.spy);
  for (size_t room = 0; room <= 6; room++) {
    void *keep;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 100 * KiB, 256, NULL, &keep), RMMC_SUCCESS);
    fill(keep, 100 * KiB, 7);
    /* `room` more pages fit upstream, then mapping fails. */
    spy_set_capacity(s, spy_counts(s).outstanding_bytes + room * PAGE);
    size_t before = field(f.pool, "reserved");
    void *p = (void *)1;
    rmmc_status_t st = rmmc_resource_allocate(f.pool, 10 * PAGE, 256, NULL, &p);
    /* The pages mapped for the refused block went back. */
    ck_assert_uint_le(field(f.pool, "reserved"), before);
    ck_assert_int_eq(st, RMMC_ERROR_OUT_OF_MEMORY);
    ck_assert_ptr_null(p);
    ck_assert_str_ne(rmmc_last_error_message(), "");
    CHECK_POOL(f.pool);
    ck_assert_uint_eq(field(f.pool, "reserved"), vmspy_counts(f.vm).mapped_bytes);
    ck_assert_uint_eq(field(f.pool, "in_use"), 100 * KiB);
    ck_assert(filled(keep, 100 * KiB, 7));
    spy_set_capacity(s, SIZE_MAX);
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 10 * PAGE, 256, NULL, &p), RMMC_SUCCESS);
    fill(p, 10 * PAGE, 9);
    ck_assert(filled(p, 10 * PAGE, 9));
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, 10 * PAGE, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, keep, 100 * KiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  }
  ck_assert_uint_ge(vmspy_counts(f.vm).map_failures, 14); /* each once, then the last resort */
  fix_close(&f);
}
END_TEST

/* One refused mapping that the last resort cures (it gives back free pages
 * and maps again): the request succeeds. */
START_TEST(test_map_failure_retried) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  fix_open(&f, &o);
  for (uint64_t nth = 1; nth <= 4; nth++) {
    spy_fail_nth(spy_of(f.spy), nth);
    void *p;
    ck_assert_int_eq(rmmc_resource_allocate(f.pool, 6 * PAGE, 256, NULL, &p), RMMC_SUCCESS);
    fill(p, 6 * PAGE, 3);
    ck_assert(filled(p, 6 * PAGE, 3));
    CHECK_POOL(f.pool);
    ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p, 6 * PAGE, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
    ck_assert_uint_eq(vmspy_counts(f.vm).map_failures, nth);
  }
  fix_close(&f);
}
END_TEST

/* The last resort: the upstream holds only so much; free pages elsewhere go
 * back (even with release_before_grow off) so that a request fits. */
START_TEST(test_last_resort_unmaps_free_pages) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  fix_open(&f, &o);
  spy_set_capacity(spy_of(f.spy), 32 * PAGE);
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 20 * PAGE, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 20 * PAGE, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 4 * PAGE, 256, NULL, &a), RMMC_SUCCESS);
  fill(a, 4 * PAGE, 1);
  /* 24 pages do not fit beside the 20 still mapped, only after unmapping. */
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 24 * PAGE, 256, NULL, &b), RMMC_SUCCESS);
  fill(b, 24 * PAGE, 2);
  CHECK_POOL(f.pool);
  ck_assert_uint_le(vmspy_counts(f.vm).mapped_bytes, 32 * PAGE);
  void *c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 8 * PAGE, 256, NULL, &c), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  CHECK_POOL(f.pool);
  ck_assert(filled(a, 4 * PAGE, 1) && filled(b, 24 * PAGE, 2));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 4 * PAGE, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 24 * PAGE, 256, NULL), RMMC_SUCCESS);
  spy_set_capacity(spy_of(f.spy), SIZE_MAX);
  fix_close(&f);
}
END_TEST

/* The maximum bounds mapped bytes: free pages go first, then out of memory
 * with the pool's figures. */
START_TEST(test_maximum_bounds_mapped_bytes) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_max = 0;
  o.release_before_grow = false;
  o.maximum_size = 16 * PAGE;
  fix_open(&f, &o);
  void *a, *b, *c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 12 * PAGE, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 12 * PAGE, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 2 * PAGE, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 14 * PAGE, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_uint_le(field(f.pool, "reserved"), 16 * PAGE);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, PAGE, 256, NULL, &c), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(c);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "maximum"));
  CHECK_POOL(f.pool);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 2 * PAGE, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 14 * PAGE, 256, NULL), RMMC_SUCCESS);
  fix_close(&f);
}
END_TEST

/* Address space running out takes another reservation; a request larger
 * than the reservation size gets one of its own. */
START_TEST(test_more_reservations) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.address_space = 1 * MiB;
  fix_open(&f, &o);
  void *a, *b, *c;
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 900 * KiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 900 * KiB, 256, NULL, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(f.pool, 5 * MiB, 256, NULL, &c), RMMC_SUCCESS);
  fill(a, 900 * KiB, 1), fill(b, 900 * KiB, 2), fill(c, 5 * MiB, 3);
  ck_assert_uint_ge(field(f.pool, "chunks"), 3);
  ck_assert_uint_eq(field(f.pool, "chunks"), vmspy_counts(f.vm).reserves);
  CHECK_POOL(f.pool);
  ck_assert(filled(a, 900 * KiB, 1) && filled(b, 900 * KiB, 2) && filled(c, 5 * MiB, 3));
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, a, 900 * KiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, b, 900 * KiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(f.pool, c, 5 * MiB, 256, NULL), RMMC_SUCCESS);
  fix_close(&f);
  /* The reservations went back at destroy (the vmspy refuses an unreserve
   * with pages mapped, and fix_close saw no error). */
}
END_TEST

/* A long random run on 4 streams with a tight budget: every invariant
 * after every step, every live block's data intact, alignments honoured. */
START_TEST(test_random_streams_invariants) {
  fix_t f;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.release_slack = 0.0;
  o.small_max = 32 * KiB;
  o.small_chunk = 256 * KiB;
  fix_open(&f, &o);
  enum { LIVE = 48, STEPS = 3000 };
  void *p[LIVE] = {0};
  size_t n[LIVE] = {0};
  int strm[LIVE] = {0};
  unsigned seed = 12345;
  for (int step = 0; step < STEPS; step++) {
    int i = (int)(next_rand(&seed) % LIVE);
    if (p[i] != NULL) {
      ck_assert_msg(filled(p[i], n[i], (unsigned)i), "block %d corrupted at step %d", i, step);
      int fs = next_rand(&seed) % 4 == 0 ? (int)(next_rand(&seed) % 4) : strm[i];
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], n[i], 256, STREAM(fs)), RMMC_SUCCESS);
      p[i] = NULL;
    } else {
      unsigned k = next_rand(&seed) % 100;
      n[i] = k < 60 ? 1 + next_rand(&seed) % (40 * KiB) : 1 + next_rand(&seed) % (3 * MiB);
      size_t align = (size_t)256 << (next_rand(&seed) % 6);
      strm[i] = (int)(next_rand(&seed) % 4);
      ck_assert_int_eq(rmmc_resource_allocate(f.pool, n[i], align, STREAM(strm[i]), &p[i]),
                       RMMC_SUCCESS);
      ck_assert_uint_eq((uintptr_t)p[i] % align, 0);
      fill(p[i], n[i], (unsigned)i);
    }
    if (getenv("DEBUG_EXP")) {
      CHECK_POOL(f.pool);
      for (int j = 0; j < LIVE; j++)
        ck_assert_msg(p[j] == NULL || filled(p[j], n[j], (unsigned)j), "block %d (%p + %zu) bad after step %d (slot %d %s %zu)", j, p[j], n[j], step, i, p[i] ? "alloc" : "free", n[i]);
    } else if (step % 7 == 0) CHECK_POOL(f.pool);
    if (step % 500 == 499) ck_assert_int_eq(rmmc_resource_release_cached(f.pool), RMMC_SUCCESS);
  }
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL) {
      ck_assert(filled(p[i], n[i], (unsigned)i));
      ck_assert_int_eq(rmmc_resource_deallocate(f.pool, p[i], n[i], 256, STREAM(strm[i])),
                       RMMC_SUCCESS);
    }
  ck_assert_uint_gt(field(f.pool, "page_unmaps"), 0);
  fix_close(&f);
}
END_TEST

/* Bad options and an upstream without virtual memory: a clear status, a
 * message naming the problem, nothing retained. */
START_TEST(test_bad_options) {
  rmmc_resource_t *spy, *vm, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = true;
  ck_assert_int_eq(rmmc_pool_resource_create(spy, &o, &r), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "virtual memory"));
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_int_eq(vmspy_create(spy, 64 * KiB, &vm), RMMC_SUCCESS);
  size_t bad_pages[] = {4 * KiB, 96 * KiB, (size_t)2 << 30};
  for (int i = 0; i < 3; i++) {
    o.page_size = bad_pages[i];
    ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "page_size"));
    ck_assert_int_eq(rmmc_resource_refcount(vm), 1);
  }
  o.page_size = 0;
  o.address_space = (size_t)1 << 60;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "address_space"));
  ck_assert_uint_eq(vmspy_counts(vm).reserves, 0);
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
START_TEST(test_spec_over_host_and_sim) {
  const char *specs[] = {"pool(expandable=true, page=1MiB) > host",
                         "pool(expandable=true, address_space=1GiB) > sim"};
  for (int k = 0; k < 2; k++) {
    rmmc_resource_t *r;
    ck_assert_msg(rmmc_stack_create(specs[k], -1, &r) == RMMC_SUCCESS, "%s: %s", specs[k],
                  rmmc_last_error_message());
    void *p[8];
    for (int i = 0; i < 8; i++) {
      ck_assert_int_eq(rmmc_resource_allocate(r, (size_t)(i + 1) * 3 * MiB, 256, NULL, &p[i]),
                       RMMC_SUCCESS);
      if (k == 0) memset(p[i], i, (size_t)(i + 1) * 3 * MiB);
    }
    ck_assert_uint_ge(field(r, "page_maps"), 1);
    ck_assert_uint_ge(field(r, "reserved"), 108 * MiB);
    ck_assert_uint_ge(field(r, "address_space"), field(r, "reserved"));
    CHECK_POOL(r);
    for (int i = 0; i < 8; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], (size_t)(i + 1) * 3 * MiB, 256, NULL),
                       RMMC_SUCCESS);
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
  void *a, *b = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(lim), 5 * MiB);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4 * MiB, 256, NULL, &b), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(b);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "limit 8.00 MiB"));
  CHECK_POOL(r);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 5 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 7 * MiB, 256, NULL, &b), RMMC_SUCCESS);
  memset(b, 1, 7 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 7 * MiB, 256, NULL), RMMC_SUCCESS);
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
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_grows_in_place_within_budget);
  tcase_add_test(tc, test_release_cached_keeps_live_pages);
  tcase_add_test(tc, test_map_failure_is_clean);
  tcase_add_test(tc, test_map_failure_retried);
  tcase_add_test(tc, test_last_resort_unmaps_free_pages);
  tcase_add_test(tc, test_maximum_bounds_mapped_bytes);
  tcase_add_test(tc, test_more_reservations);
  tcase_add_test(tc, test_random_streams_invariants);
  tcase_add_test(tc, test_bad_options);
  tcase_add_test(tc, test_vm_calls_check_arguments);
  tcase_add_test(tc, test_host_vm);
  tcase_add_test(tc, test_spec_over_host_and_sim);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
