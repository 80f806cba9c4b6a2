/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc_resource_get_allocation: which block of a stack holds a pointer, and
 * what memory lies under it. Pools over host memory (chunks and virtual
 * memory, checked by vmspy), small blocks in stream heaps and large ones in
 * the shared heap, first bytes and interior pointers, blocks freed (also on
 * another stream, still pending), adaptors passing the question down, the
 * layers that cannot tell (NOT_SUPPORTED), bad arguments, a resource of
 * version 2, and queries racing allocations on other threads. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"
#include "vmspy.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define STREAM(n) ((cudaStream_t)(uintptr_t)(n))

static rmmc_resource_t *pool_over(rmmc_resource_t *up, int expandable, size_t page) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = expandable;
  o.page_size = page;
  o.address_space = 256 * MiB;
  rmmc_resource_t *p = NULL;
  ck_assert_msg(rmmc_pool_resource_create(up, &o, &p) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  return p;
}

static rmmc_allocation_t query(rmmc_resource_t *r, const void *ptr) {
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  rmmc_status_t st = rmmc_resource_get_allocation(r, ptr, &a);
  ck_assert_msg(st == RMMC_SUCCESS, "get_allocation(%p): %s", ptr, rmmc_last_error_message());
  return a;
}

static void expect_unknown(rmmc_resource_t *r, const void *ptr) {
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  ck_assert_int_eq(rmmc_resource_get_allocation(r, ptr, &a), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_ptr_null(a.base);
  ck_assert_ptr_null(a.resource);
  ck_assert_uint_eq(a.bytes, 0);
}

/* Chunks: small and large blocks, first byte and any byte inside, resource
 * and backing; freed blocks and bytes past the request are nobody's. */
START_TEST(test_pool_chunks) {
  rmmc_resource_t *spy = new_spy();
  rmmc_resource_t *pool = pool_over(spy, 0, 0);
  size_t sizes[] = {256, 1000, 64 * KiB, MiB, 3 * MiB + 100, 40 * MiB};
  void *p[6];
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(pool, sizes[i], 256, STREAM(i % 2 + 1), &p[i]),
                     RMMC_SUCCESS);
    size_t offs[] = {0, 1, sizes[i] / 2, sizes[i] - 1};
    for (int k = 0; k < 4; k++) {
      rmmc_allocation_t a = query(pool, (char *)p[i] + offs[k]);
      ck_assert_ptr_eq(a.base, p[i]);
      ck_assert_uint_eq(a.bytes, sizes[i]);
      ck_assert_ptr_eq(a.resource, pool);
      ck_assert_int_eq(a.backing, RMMC_BACKING_BLOCK);
      ck_assert_uint_eq(a.nmappings, 0);
      /* The chunk holds the block and is one of the spy's live blocks. */
      ck_assert((uintptr_t)a.upstream.ptr <= (uintptr_t)p[i]);
      ck_assert((uintptr_t)p[i] + sizes[i] <= (uintptr_t)a.upstream.ptr + a.upstream.bytes);
      ck_assert_uint_ge(a.upstream.bytes, 32 * MiB);
    }
    /* Past the bytes asked for (the block's rounding) is not the block's. */
    if (sizes[i] % 256 != 0) expect_unknown(pool, (char *)p[i] + sizes[i]);
  }
  /* The pool's chunks are what the spy handed out: their count matches. */
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, field(pool, "regions"));
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(pool, p[i], sizes[i], 256, STREAM(i % 2 + 1)),
                     RMMC_SUCCESS);
  for (int i = 0; i < 6; i++) {
    expect_unknown(pool, p[i]);
    expect_unknown(pool, (char *)p[i] + sizes[i] / 2);
  }
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "not inside a block"));
  char local;
  expect_unknown(pool, &local);
  finish(pool, spy);
}
END_TEST

/* A small block freed on another stream is pending there (not yet reusable
 * by its heap), yet no longer allocated: unknown. */
START_TEST(test_foreign_free_is_gone) {
  rmmc_resource_t *spy = new_spy();
  rmmc_resource_t *pool = pool_over(spy, 0, 0);
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 4096, 256, STREAM(1), &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 4096, 256, STREAM(1), &b), RMMC_SUCCESS);
  ck_assert_ptr_eq(query(pool, (char *)a + 10).base, a);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, a, 4096, 256, STREAM(2)), RMMC_SUCCESS);
  expect_unknown(pool, a);
  ck_assert_ptr_eq(query(pool, b).base, b);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, b, 4096, 256, STREAM(1)), RMMC_SUCCESS);
  finish(pool, spy);
}
END_TEST

/* Virtual memory: the mappings under a block, each one vm_map call, in
 * order and adjacent, covering it; max_mappings smaller than the count
 * writes that many and still counts all. */
START_TEST(test_pool_mappings) {
  rmmc_resource_t *spy = new_spy(), *vm;
  ck_assert_int_eq(vmspy_create(spy, 4 * KiB, &vm), RMMC_SUCCESS);
  rmmc_resource_t *pool = pool_over(vm, 1, 64 * KiB);
  void *big, *small;
  ck_assert_int_eq(rmmc_resource_allocate(pool, MiB + 512, 256, NULL, &big), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 300, 256, NULL, &small), RMMC_SUCCESS);
  rmmc_range_t m[64];
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  a.mappings = m;
  a.max_mappings = 64;
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, (char *)big + 5000, &a), RMMC_SUCCESS);
  ck_assert_ptr_eq(a.base, big);
  ck_assert_uint_eq(a.bytes, MiB + 512);
  ck_assert_int_eq(a.backing, RMMC_BACKING_MAPPINGS);
  ck_assert_uint_ge(a.nmappings, 17); /* 1 MiB + 512 B over 64 KiB mappings */
  ck_assert_uint_le(a.nmappings, 64);
  ck_assert_ptr_eq(a.upstream.ptr, m[0].ptr);
  uintptr_t at = (uintptr_t)m[0].ptr;
  ck_assert(at <= (uintptr_t)big);
  for (size_t i = 0; i < a.nmappings; i++) {
    ck_assert_uint_eq((uintptr_t)m[i].ptr, at);
    ck_assert_uint_eq(m[i].bytes % (4 * KiB), 0);
    ck_assert_uint_le(m[i].bytes, 64 * KiB);
    at += m[i].bytes;
  }
  ck_assert_uint_eq(at, (uintptr_t)a.upstream.ptr + a.upstream.bytes);
  ck_assert(at >= (uintptr_t)big + MiB + 512);
  ck_assert((uintptr_t)m[a.nmappings - 1].ptr < (uintptr_t)big + MiB + 512);
  /* Fewer slots than mappings: the first ones, and the whole count. */
  rmmc_range_t few[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
  rmmc_allocation_t b = RMMC_ALLOCATION_INIT;
  b.mappings = few;
  b.max_mappings = 2;
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, big, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(b.nmappings, a.nmappings);
  ck_assert_ptr_eq(few[0].ptr, m[0].ptr);
  ck_assert_ptr_eq(few[1].ptr, m[1].ptr);
  ck_assert_ptr_null(few[2].ptr);
  /* No room given: counted only. */
  rmmc_allocation_t c = query(pool, small);
  ck_assert_int_eq(c.backing, RMMC_BACKING_MAPPINGS);
  ck_assert_uint_ge(c.nmappings, 1);
  ck_assert((uintptr_t)c.upstream.ptr <= (uintptr_t)small);
  ck_assert((uintptr_t)small + 300 <= (uintptr_t)c.upstream.ptr + c.upstream.bytes);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, big, MiB + 512, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, small, 300, 256, NULL), RMMC_SUCCESS);
  expect_unknown(pool, big);
  rmmc_resource_release(pool);
  rmmc_resource_release(vm);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

/* Adaptors pass the question down; the answer names the pool. */
START_TEST(test_adaptors_forward) {
  const char *specs[] = {"statistics > pool(address_space=64MiB) > host",
                         "limiting(limit=1GiB) > pool(address_space=64MiB) > host",
                         "tracking > logging(path=/dev/null) > pool(address_space=64MiB) > host",
                         "thread_safe > failure_callback > "
                         "pool(expandable=true, address_space=64MiB) > host",
                         "aligned(alignment=4096) > pool(expandable=false) > host",
                         "statistics > arena > host"}; /* the arena is a pool */
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    rmmc_resource_t *r = NULL;
    ck_assert_msg(rmmc_stack_create(specs[i], -1, &r) == RMMC_SUCCESS, "%s: %s", specs[i],
                  rmmc_last_error_message());
    void *p;
    ck_assert_int_eq(rmmc_resource_allocate(r, 10000, 256, NULL, &p), RMMC_SUCCESS);
    rmmc_allocation_t a = query(r, (char *)p + 9999);
    rmmc_resource_t *owner = r;
    while (strcmp(rmmc_resource_name(owner), "pool") != 0 &&
           strcmp(rmmc_resource_name(owner), "arena") != 0)
      owner = rmmc_resource_upstream(owner);
    ck_assert_ptr_eq(a.resource, owner);
    ck_assert((uintptr_t)a.base <= (uintptr_t)p);
    ck_assert((uintptr_t)p + 10000 <= (uintptr_t)a.base + a.bytes);
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 10000, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(r);
  }
}
END_TEST

/* Layers that cannot tell say so, naming themselves. */
START_TEST(test_not_supported) {
  const char *specs[] = {"host", "fixed_size > host", "binning > host", "statistics > sim"};
  const char *names[] = {"host", "fixed_size", "binning", "sim"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    rmmc_resource_t *r = NULL;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    void *p;
    ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
    rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
    ck_assert_int_eq(rmmc_resource_get_allocation(r, p, &a), RMMC_ERROR_NOT_SUPPORTED);
    ck_assert_msg(strstr(rmmc_last_error_message(), names[i]) != NULL, "%s",
                  rmmc_last_error_message());
    ck_assert_ptr_null(a.resource);
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(r);
  }
}
END_TEST

/* A table of version 2 has no get_allocation slot to read. */
static rmmc_status_t v2_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                 cudaStream_t stream, void **out) {
  (void)r, (void)bytes, (void)alignment, (void)stream;
  *out = (void *)(uintptr_t)0x1000;
  return RMMC_SUCCESS;
}
static rmmc_status_t v2_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes, size_t alignment,
                                   cudaStream_t stream) {
  (void)r, (void)ptr, (void)bytes, (void)alignment, (void)stream;
  return RMMC_SUCCESS;
}
static void v2_destroy(rmmc_resource_t *r) { free(r); }

START_TEST(test_version_2_table) {
  /* Laid out as a version-2 table: the slots past version 2 are never read. */
  static rmmc_resource_ops_t v2 = {.version = 2, .name = "old", .allocate = v2_allocate,
                                   .deallocate = v2_deallocate, .destroy = v2_destroy};
  v2.get_allocation = (rmmc_status_t(*)(rmmc_resource_t *, const void *, rmmc_allocation_t *))1;
  rmmc_resource_t *r = calloc(1, sizeof *r);
  rmmc_resource_init(r, &v2, RMMC_MEMORY_HOST, -1);
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  ck_assert_int_eq(rmmc_resource_get_allocation(r, (void *)0x1000, &a), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "old"));
  rmmc_memory_hooks_t h = RMMC_MEMORY_HOOKS_INIT;
  ck_assert_int_eq(rmmc_resource_set_memory_hooks(r, &h), RMMC_ERROR_NOT_SUPPORTED);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_bad_arguments) {
  rmmc_resource_t *spy = new_spy();
  rmmc_resource_t *pool = pool_over(spy, 0, 0);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 4096, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, p, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_get_allocation(NULL, p, &a), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, NULL, &a), RMMC_ERROR_INVALID_ARGUMENT);
  a.max_mappings = 4;
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, p, &a), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "max_mappings"));
  rmmc_allocation_t unset = {0};
  ck_assert_int_eq(rmmc_resource_get_allocation(pool, p, &unset), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "RMMC_ALLOCATION_INIT"));
  ck_assert_int_eq(rmmc_resource_deallocate(pool, p, 4096, 256, NULL), RMMC_SUCCESS);
  finish(pool, spy);
}
END_TEST

/* Queries on one thread's live blocks while other threads allocate and free
 * on their own streams (spans come and go): always the right block. */
typedef struct worker {
  rmmc_resource_t *pool;
  int id;
  unsigned seed;
  int errors;
} worker_t;

static void *work(void *arg) {
  worker_t *w = arg;
  enum { LIVE = 32 };
  void *p[LIVE] = {0};
  size_t n[LIVE] = {0};
  for (int it = 0; it < 4000; it++) {
    unsigned k = (w->seed = w->seed * 1103515245u + 12345u) >> 8;
    int i = (int)(k % LIVE);
    if (p[i] != NULL) {
      rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
      if (rmmc_resource_get_allocation(w->pool, (char *)p[i] + n[i] - 1, &a) != RMMC_SUCCESS ||
          a.base != p[i] || a.bytes != n[i])
        w->errors++;
      if (rmmc_resource_deallocate(w->pool, p[i], n[i], 256, STREAM(w->id + 1)) != RMMC_SUCCESS)
        w->errors++;
      p[i] = NULL;
    } else {
      n[i] = 256 + (k >> 4) % (k % 7 == 0 ? 3 * MiB : 64 * KiB);
      if (rmmc_resource_allocate(w->pool, n[i], 256, STREAM(w->id + 1), &p[i]) != RMMC_SUCCESS)
        w->errors++;
    }
  }
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL) (void)rmmc_resource_deallocate(w->pool, p[i], n[i], 256, STREAM(w->id + 1));
  return NULL;
}

START_TEST(test_queries_race_allocations) {
  for (int expandable = 0; expandable < 2; expandable++) {
    rmmc_resource_t *up = NULL;
    ck_assert_int_eq(rmmc_host_resource_create(&up), RMMC_SUCCESS);
    rmmc_resource_t *pool = pool_over(up, expandable, 0);
    pthread_t t[6];
    worker_t w[6];
    for (int i = 0; i < 6; i++) {
      w[i] = (worker_t){pool, i, 17u * (unsigned)i + 1, 0};
      pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 6; i++) {
      pthread_join(t[i], NULL);
      ck_assert_int_eq(w[i].errors, 0);
    }
    ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
    rmmc_resource_release(pool);
    rmmc_resource_release(up);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("allocation");
  TCase *tc = tcase_create("get_allocation");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pool_chunks);
  tcase_add_test(tc, test_foreign_free_is_gone);
  tcase_add_test(tc, test_pool_mappings);
  tcase_add_test(tc, test_adaptors_forward);
  tcase_add_test(tc, test_not_supported);
  tcase_add_test(tc, test_version_2_table);
  tcase_add_test(tc, test_bad_arguments);
  tcase_add_test(tc, test_queries_race_allocations);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
