/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory hooks (rmmc_resource_set_memory_hooks): a recorder keeps the
 * ranges the hooks report and fails on any release of a range it was not
 * told about or any acquire that overlaps a live one. Under a replay of the
 * real ResNet-50 log (tools' replay engine) and under random runs on
 * several streams, the live ranges equal what the base holds (sim's mapped
 * ranges or allocations, vmspy's and the spy's counts) and the pool's
 * reserved figure, for chunks and virtual memory; mappings that
 * get_allocation lists are ranges the hooks reported; hooks set on a pool
 * that holds memory hear about it, replaced hooks let go of it; an upstream
 * that refuses to take memory back leaves it registered; hooks set through
 * adaptors reach the pool; bad input. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "faulty.h"
#include "replay_engine.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"
#include "vmspy.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define STREAM(n) ((cudaStream_t)(uintptr_t)(n))

static const char *trace_path; /* argv[1]: bench/traces/resnet50_train.csv.gz */

/* ---- the recorder ---- */

typedef struct recorder {
  pthread_mutex_t lock;
  uintptr_t *base;
  size_t *bytes;
  size_t n, cap;
  uint64_t acquires, releases, errors;
  size_t live_bytes;
  char first_error[200];
} recorder_t;

static void rec_error(recorder_t *r, const char *what, void *p, size_t n) {
  if (r->errors++ == 0)
    snprintf(r->first_error, sizeof r->first_error, "%s %p + %zu", what, p, n);
}

static void on_acquire(void *ptr, size_t bytes, void *user) {
  recorder_t *r = user;
  pthread_mutex_lock(&r->lock);
  uintptr_t a = (uintptr_t)ptr;
  for (size_t i = 0; i < r->n; i++)
    if (a < r->base[i] + r->bytes[i] && r->base[i] < a + bytes)
      rec_error(r, "overlapping acquire", ptr, bytes);
  if (bytes == 0) rec_error(r, "empty acquire", ptr, bytes);
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 64;
    r->base = realloc(r->base, r->cap * sizeof *r->base);
    r->bytes = realloc(r->bytes, r->cap * sizeof *r->bytes);
  }
  r->base[r->n] = a;
  r->bytes[r->n++] = bytes;
  r->acquires++;
  r->live_bytes += bytes;
  pthread_mutex_unlock(&r->lock);
}

static void on_release(void *ptr, size_t bytes, void *user) {
  recorder_t *r = user;
  pthread_mutex_lock(&r->lock);
  size_t i = 0;
  while (i < r->n && !(r->base[i] == (uintptr_t)ptr && r->bytes[i] == bytes)) i++;
  if (i == r->n) {
    rec_error(r, "release of a range never acquired", ptr, bytes);
  } else {
    r->base[i] = r->base[r->n - 1];
    r->bytes[i] = r->bytes[r->n - 1];
    r->n--;
    r->live_bytes -= bytes;
  }
  r->releases++;
  pthread_mutex_unlock(&r->lock);
}

static void rec_init(recorder_t *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->lock, NULL);
}

static void rec_fini(recorder_t *r) {
  free(r->base);
  free(r->bytes);
  pthread_mutex_destroy(&r->lock);
}

static bool rec_holds(recorder_t *r, const void *p, size_t n) {
  for (size_t i = 0; i < r->n; i++)
    if (r->base[i] == (uintptr_t)p && r->bytes[i] == n) return true;
  return false;
}

static rmmc_memory_hooks_t hooks_for(recorder_t *r) {
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  h.on_acquire = on_acquire;
  h.on_release = on_release;
  h.user = r;
  return h;
}

static void set_hooks(rmmc_resource_t *r, recorder_t *rec) {
  rmmc_memory_hooks_t h = hooks_for(rec);
  ck_assert_msg(rmmc_resource_set_memory_hooks(r, &h) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
}

#define REC_OK(rec) ck_assert_msg((rec)->errors == 0, "hooks: %s", (rec)->first_error)

static rmmc_resource_t *pool_over(rmmc_resource_t *up, int expandable, size_t page) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = expandable;
  o.page_size = page;
  /* sim reserves nothing real: room for the ResNet-50 log; real address
   * space kept small (valgrind cannot reserve much). */
  bool sim = strcmp(rmmc_resource_name(up), "sim") == 0;
  o.address_space = expandable ? (sim ? (size_t)64 << 30 : (size_t)1 << 30) : 0;
  rmmc_resource_t *p = NULL;
  ck_assert_msg(rmmc_pool_resource_create(up, &o, &p) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  return p;
}

/* ---- under a replay ---- */

/* The ResNet-50 log over sim: what the hooks hold is what sim has mapped
 * (or handed out) and what the pool reports reserved, after the replay,
 * after release_cached and after destruction. */
START_TEST(test_replay_resnet50) {
  ck_assert_ptr_nonnull(trace_path);
  replay_log_t *log = NULL;
  ck_assert_msg(replay_log_read(trace_path, NULL, &log) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  for (int expandable = 0; expandable < 2; expandable++) {
    rmmc_resource_t *sim = NULL;
    ck_assert_int_eq(rmmc_sim_resource_create(NULL, &sim), RMMC_SUCCESS);
    rmmc_resource_t *pool = pool_over(sim, expandable, 0);
    recorder_t rec;
    rec_init(&rec);
    set_hooks(pool, &rec);
    replay_options_t o = REPLAY_OPTIONS_INIT;
    replay_result_t res;
    ck_assert_msg(replay_run_resource(log, pool, &o, &res) == RMMC_SUCCESS, "%s", res.error);
    ck_assert_uint_eq(res.failures, 0);
    replay_result_fini(&res);
    REC_OK(&rec);
    ck_assert_uint_gt(rec.acquires, 0);
    ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
    ck_assert_uint_eq(rec.live_bytes, field(sim, "in_use"));
    ck_assert_uint_eq(rec.n, field(sim, expandable ? "mapped_ranges" : "outstanding"));
    ck_assert_uint_eq(rec.acquires, expandable ? field(pool, "page_maps") : field(pool, "grows"));
    ck_assert_uint_eq(rec.releases,
                      expandable ? field(pool, "page_unmaps") : field(pool, "shrinks"));
    ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
    REC_OK(&rec);
    ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
    ck_assert_uint_eq(rec.live_bytes, field(sim, "in_use"));
    ck_assert_uint_eq(rec.live_bytes, 0);
    rmmc_resource_release(pool);
    ck_assert_uint_eq(rec.acquires, rec.releases);
    REC_OK(&rec);
    rmmc_resource_release(sim);
    rec_fini(&rec);
  }
  replay_log_free(log);
}
END_TEST

/* ---- random runs ---- */

typedef struct run {
  rmmc_resource_t *pool;
  int id;
  unsigned seed;
  int errors;
} run_t;

static void *random_run(void *arg) {
  run_t *w = arg;
  enum { LIVE = 48 };
  void *p[LIVE] = {0};
  size_t n[LIVE] = {0};
  for (int it = 0; it < 3000; it++) {
    unsigned k = (w->seed = w->seed * 1103515245u + 12345u) >> 8;
    int i = (int)(k % LIVE);
    cudaStream_t s = STREAM(1 + (k >> 20) % 3);
    if (p[i] != NULL) {
      memset(p[i], w->id, n[i] < 512 ? n[i] : 512);
      if (rmmc_resource_deallocate(w->pool, p[i], n[i], 256, s) != RMMC_SUCCESS) w->errors++;
      p[i] = NULL;
    } else {
      n[i] = 256 + (k >> 4) % (k % 5 == 0 ? 6 * MiB : 200 * KiB);
      if (rmmc_resource_allocate(w->pool, n[i], 256, s, &p[i]) != RMMC_SUCCESS) w->errors++;
    }
    if (it % 500 == 499 && w->id == 0) (void)rmmc_resource_release_cached(w->pool);
  }
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL) (void)rmmc_resource_deallocate(w->pool, p[i], n[i], 256, NULL);
  return NULL;
}

static void run_threads(rmmc_resource_t *pool, int threads) {
  pthread_t t[8];
  run_t w[8];
  for (int i = 0; i < threads; i++) {
    w[i] = (run_t){pool, i, 7u * (unsigned)i + 3, 0};
    pthread_create(&t[i], NULL, random_run, &w[i]);
  }
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].errors, 0);
  }
}

/* Virtual memory over vmspy: every mapping the pool made or took back. */
START_TEST(test_random_vm) {
  rmmc_resource_t *spy = new_spy(), *vm;
  ck_assert_int_eq(vmspy_create(spy, 4 * KiB, &vm), RMMC_SUCCESS);
  rmmc_resource_t *pool = pool_over(vm, 1, 256 * KiB);
  recorder_t rec;
  rec_init(&rec);
  set_hooks(pool, &rec);
  run_threads(pool, 4);
  REC_OK(&rec);
  vmspy_counts_t c = vmspy_counts(vm);
  ck_assert_uint_eq(c.errors, 0);
  ck_assert_uint_eq(rec.acquires, c.maps);
  ck_assert_uint_eq(rec.releases, c.unmaps);
  ck_assert_uint_eq(rec.live_bytes, c.mapped_bytes);
  ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
  /* One hooked range per mapping the pool counts: what the PyTorch
   * backend's snapshot lists as segments and its GPU tests compare. */
  ck_assert_uint_gt(rec.n, 0);
  ck_assert_uint_eq(rec.n, field(pool, "mappings"));
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS); /* all free: unmapped */
  c = vmspy_counts(vm);
  ck_assert_uint_gt(c.unmaps, 0);
  ck_assert_uint_eq(rec.releases, c.unmaps);
  ck_assert_uint_eq(rec.live_bytes, c.mapped_bytes);
  ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
  rmmc_resource_release(pool);
  c = vmspy_counts(vm);
  ck_assert_uint_eq(rec.acquires, c.maps);
  ck_assert_uint_eq(rec.releases, c.unmaps);
  ck_assert_uint_eq(rec.live_bytes, 0);
  REC_OK(&rec);
  rmmc_resource_release(vm);
  rmmc_resource_release(spy);
  rec_fini(&rec);
}
END_TEST

/* Chunks over a spy: every chunk the pool took or gave back. */
START_TEST(test_random_chunks) {
  rmmc_resource_t *spy = new_spy();
  rmmc_resource_t *pool = pool_over(spy, 0, 0);
  recorder_t rec;
  rec_init(&rec);
  set_hooks(pool, &rec);
  run_threads(pool, 4);
  REC_OK(&rec);
  spy_counts_t c = spy_counts(spy_of(spy));
  ck_assert_uint_eq(rec.acquires, c.allocate_calls - c.allocate_failures);
  ck_assert_uint_eq(rec.releases, c.deallocate_calls);
  ck_assert_uint_eq(rec.live_bytes, c.outstanding_bytes);
  ck_assert_uint_eq(rec.n, c.outstanding);
  ck_assert_uint_gt(rec.n, 0);
  ck_assert_uint_eq(rec.n, field(pool, "regions")); /* one hooked range per chunk */
  ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
  rmmc_resource_release(pool);
  ck_assert_uint_eq(rec.live_bytes, 0);
  ck_assert_uint_eq(rec.acquires, rec.releases);
  REC_OK(&rec);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
  rec_fini(&rec);
}
END_TEST

/* The mappings get_allocation lists are ranges the hooks were told of. */
START_TEST(test_mappings_are_hooked_ranges) {
  rmmc_resource_t *sim = NULL;
  ck_assert_int_eq(rmmc_sim_resource_create(NULL, &sim), RMMC_SUCCESS);
  rmmc_resource_t *pool = pool_over(sim, 1, 4 * MiB);
  recorder_t rec;
  rec_init(&rec);
  set_hooks(pool, &rec);
  void *p[5];
  size_t n[5] = {3 * MiB, 50 * MiB, 1000, 9 * MiB, 700 * KiB};
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(rmmc_resource_allocate(pool, n[i], 256, STREAM(i), &p[i]), RMMC_SUCCESS);
  for (int i = 0; i < 5; i++) {
    rmmc_range_t m[32];
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    a.mappings = m;
    a.max_mappings = 32;
    ck_assert_int_eq(rmmc_resource_get_allocation(pool, p[i], &a), RMMC_SUCCESS);
    ck_assert_uint_ge(a.nmappings, 1);
    for (size_t k = 0; k < a.nmappings; k++)
      ck_assert_msg(rec_holds(&rec, m[k].ptr, m[k].bytes), "mapping %zu of block %d", k, i);
  }
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(pool, p[i], n[i], 256, STREAM(i)), RMMC_SUCCESS);
  rmmc_resource_release(pool);
  REC_OK(&rec);
  ck_assert_uint_eq(rec.live_bytes, 0);
  rmmc_resource_release(sim);
  rec_fini(&rec);
}
END_TEST

/* Hooks set late hear of what is held; replaced or removed hooks let go of
 * it; destruction releases everything through the hooks of the time. */
START_TEST(test_set_replace_remove) {
  for (int expandable = 0; expandable < 2; expandable++) {
    rmmc_resource_t *sim = NULL;
    ck_assert_int_eq(rmmc_sim_resource_create(NULL, &sim), RMMC_SUCCESS);
    rmmc_resource_t *pool = pool_over(sim, expandable, 0);
    void *a, *b;
    ck_assert_int_eq(rmmc_resource_allocate(pool, 100 * MiB, 256, NULL, &a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(pool, 5 * MiB, 256, NULL, &b), RMMC_SUCCESS);
    recorder_t one, two;
    rec_init(&one);
    rec_init(&two);
    set_hooks(pool, &one);
    ck_assert_uint_gt(one.acquires, 0);
    ck_assert_uint_eq(one.releases, 0);
    ck_assert_uint_eq(one.live_bytes, field(pool, "reserved"));
    set_hooks(pool, &two); /* one lets go, two takes over */
    ck_assert_uint_eq(one.live_bytes, 0);
    ck_assert_uint_eq(one.releases, one.acquires);
    ck_assert_uint_eq(two.live_bytes, field(pool, "reserved"));
    ck_assert_int_eq(rmmc_resource_deallocate(pool, a, 100 * MiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
    ck_assert_uint_eq(two.live_bytes, field(pool, "reserved"));
    ck_assert_uint_gt(two.releases, 0);
    /* Removal: two lets go of the rest; nothing more reaches it. */
    ck_assert_int_eq(rmmc_resource_set_memory_hooks(pool, NULL), RMMC_SUCCESS);
    ck_assert_uint_eq(two.live_bytes, 0);
    uint64_t seen = two.acquires + two.releases;
    void *c;
    ck_assert_int_eq(rmmc_resource_allocate(pool, 300 * MiB, 256, NULL, &c), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(pool, c, 300 * MiB, 256, NULL), RMMC_SUCCESS);
    ck_assert_uint_eq(two.acquires + two.releases, seen);
    /* Hooks with callbacks both NULL remove too; one callback alone works. */
    rmmc_memory_hooks_t only = RMMC_MEMORY_HOOKS_INIT;
    only.on_release = on_release;
    only.user = &one;
    rec_fini(&one);
    rec_init(&one);
    ck_assert_int_eq(rmmc_resource_set_memory_hooks(pool, &only), RMMC_SUCCESS);
    ck_assert_uint_eq(one.acquires, 0);
    ck_assert_int_eq(rmmc_resource_deallocate(pool, b, 5 * MiB, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(pool); /* releases what is held: unknown to `one`, so errors */
    ck_assert_uint_gt(one.releases, 0);
    ck_assert_uint_eq(one.errors, one.releases);
    ck_assert_uint_eq(field(sim, "in_use"), 0);
    rmmc_resource_release(sim);
    rec_fini(&two);
    rec_fini(&one);
  }
}
END_TEST

/* Through adaptors and sub-allocators without hooks: the pool takes them. */
START_TEST(test_through_layers) {
  const char *specs[] = {"statistics > pool(address_space=256MiB) > host",
                         "binning > pool(expandable=false) > host",
                         "limiting(limit=1GiB) > fixed_size > pool(address_space=1GiB) > host"};
  for (size_t i = 0; i < 3; i++) {
    rmmc_resource_t *r = NULL;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    recorder_t rec;
    rec_init(&rec);
    set_hooks(r, &rec);
    void *p;
    ck_assert_int_eq(rmmc_resource_allocate(r, 100000, 256, NULL, &p), RMMC_SUCCESS);
    ck_assert_uint_ge(rec.acquires, 1);
    rmmc_resource_t *pool = r;
    while (strcmp(rmmc_resource_name(pool), "pool") != 0) pool = rmmc_resource_upstream(pool);
    ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100000, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(r);
    ck_assert_uint_eq(rec.live_bytes, 0);
    REC_OK(&rec);
    rec_fini(&rec);
  }
}
END_TEST

/* An upstream that refuses to take a chunk back: the hooks hear release,
 * then acquire again, so the registration still matches what is held. */
START_TEST(test_refused_give_back) {
  rmmc_resource_t *spy = new_spy(), *f;
  ck_assert_int_eq(faulty_create(spy, &f), RMMC_SUCCESS);
  rmmc_resource_t *pool = pool_over(f, 0, 0);
  recorder_t rec;
  rec_init(&rec);
  set_hooks(pool, &rec);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 64 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, p, 64 * MiB, 256, NULL), RMMC_SUCCESS);
  faulty_fail_deallocate(faulty_of(f), RMMC_ERROR_CUDA, 1);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_ERROR_CUDA);
  REC_OK(&rec);
  ck_assert_uint_eq(rec.releases, 1);
  ck_assert_uint_eq(rec.acquires, 2);
  ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
  ck_assert_uint_eq(rec.live_bytes, spy_counts(spy_of(spy)).outstanding_bytes);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(rec.live_bytes, 0);
  rmmc_resource_release(pool);
  REC_OK(&rec);
  rmmc_resource_release(f);
  rmmc_resource_release(spy);
  rec_fini(&rec);
}
END_TEST

/* The same for a mapping: a vm layer (written here) whose next unmap fails. */
typedef struct vmfail {
  rmmc_resource_t base;
  rmmc_resource_t *up;
  int fail_unmaps;
} vmfail_t;

static rmmc_status_t vf_allocate(rmmc_resource_t *r, size_t b, size_t a, cudaStream_t s,
                                 void **out) {
  return rmmc_resource_allocate(((vmfail_t *)r)->up, b, a, s, out);
}
static rmmc_status_t vf_deallocate(rmmc_resource_t *r, void *p, size_t b, size_t a,
                                   cudaStream_t s) {
  return rmmc_resource_deallocate(((vmfail_t *)r)->up, p, b, a, s);
}
static void vf_destroy(rmmc_resource_t *r) {
  rmmc_resource_release(((vmfail_t *)r)->up);
  free(r);
}
static rmmc_resource_t *vf_upstream(const rmmc_resource_t *r) { return ((const vmfail_t *)r)->up; }
static size_t vf_page(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const vmfail_t *)r)->up);
}
static rmmc_status_t vf_reserve(rmmc_resource_t *r, size_t b, size_t a, void **out) {
  return rmmc_resource_vm_reserve(((vmfail_t *)r)->up, b, a, out);
}
static rmmc_status_t vf_unreserve(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_unreserve(((vmfail_t *)r)->up, p, b);
}
static rmmc_status_t vf_map(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_map(((vmfail_t *)r)->up, p, b);
}
static rmmc_status_t vf_unmap(rmmc_resource_t *r, void *p, size_t b) {
  vmfail_t *v = (vmfail_t *)r;
  if (v->fail_unmaps > 0) {
    v->fail_unmaps--;
    return rmmc_set_error(RMMC_ERROR_CUDA, "vmfail: injected unmap failure");
  }
  return rmmc_resource_vm_unmap(v->up, p, b);
}
static const rmmc_resource_ops_t vf_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION, .name = "vmfail", .allocate = vf_allocate,
    .deallocate = vf_deallocate, .destroy = vf_destroy, .upstream = vf_upstream,
    .vm_page_size = vf_page, .vm_reserve = vf_reserve, .vm_unreserve = vf_unreserve,
    .vm_map = vf_map, .vm_unmap = vf_unmap};

START_TEST(test_refused_unmap) {
  rmmc_resource_t *sim = NULL;
  ck_assert_int_eq(rmmc_sim_resource_create(NULL, &sim), RMMC_SUCCESS);
  vmfail_t *v = calloc(1, sizeof *v);
  rmmc_resource_init(&v->base, &vf_ops, RMMC_MEMORY_HOST, -1);
  v->up = sim;
  rmmc_resource_t *pool = pool_over(&v->base, 1, 2 * MiB);
  recorder_t rec;
  rec_init(&rec);
  set_hooks(pool, &rec);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, p, 8 * MiB, 256, NULL), RMMC_SUCCESS);
  v->fail_unmaps = 1;
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_ERROR_CUDA);
  REC_OK(&rec);
  ck_assert_uint_eq(rec.live_bytes, field(pool, "reserved"));
  ck_assert_uint_eq(rec.live_bytes, field(sim, "in_use"));
  ck_assert_uint_gt(rec.live_bytes, 0);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(rec.live_bytes, 0);
  ck_assert_uint_eq(field(sim, "in_use"), 0);
  rmmc_resource_release(pool);
  REC_OK(&rec);
  rmmc_resource_release(&v->base);
  rec_fini(&rec);
}
END_TEST

START_TEST(test_bad_input) {
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("statistics > host", -1, &r), RMMC_SUCCESS);
  recorder_t rec;
  rec_init(&rec);
  rmmc_memory_hooks_t h = hooks_for(&rec);
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(r, &h), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "pool"));
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(NULL, &h), RMMC_ERROR_INVALID_ARGUMENT);
  h.size = 0;
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(r, &h), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "RMMC_MEMORY_HOOKS_INIT"));
  rmmc_resource_release(r);
  ck_assert_uint_eq(rec.acquires + rec.releases, 0);
  rec_fini(&rec);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("hooks");
  TCase *tc = tcase_create("memory_hooks");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_replay_resnet50);
  tcase_add_test(tc, test_random_vm);
  tcase_add_test(tc, test_random_chunks);
  tcase_add_test(tc, test_mappings_are_hooked_ranges);
  tcase_add_test(tc, test_set_replace_remove);
  tcase_add_test(tc, test_through_layers);
  tcase_add_test(tc, test_refused_give_back);
  tcase_add_test(tc, test_refused_unmap);
  tcase_add_test(tc, test_bad_input);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  trace_path = argc > 1 ? argv[1] : NULL;
  return rmmc_test_run(suite(), false);
}
