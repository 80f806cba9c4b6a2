/* SPDX-License-Identifier: Apache-2.0 */
/*
 * arena: conformance, size classes, many threads on their own streams,
 * blocks freed by other threads and on other streams, superblocks given
 * back at thread exit and on out of memory (then retried), destruction
 * with threads alive and thread exit after destruction, bad frees, spec
 * options. Host suite, over a host spy: streams are opaque keys, and the
 * event/sync counters show what a GPU run would do.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

#define S1 ((cudaStream_t)0x1000)
#define S2 ((cudaStream_t)0x2000)
#define S3 ((cudaStream_t)0x3000)
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Small superblocks so tests move many of them: 64 KiB superblocks
 * (classes up to 16 KiB), chunks of 4. */
static rmmc_resource_t *make_small(rmmc_resource_t *up, size_t keep, size_t max, size_t cache) {
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  o.superblock_size = 64 * KiB;
  o.chunk_size = 256 * KiB;
  o.keep_superblocks = keep;
  o.max_size = max;
  o.large_cache_size = cache;
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_arena_resource_create(up, &o, &r), RMMC_SUCCESS);
  return r;
}

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_arena_resource_create(up, NULL, out);
}

static rmmc_status_t make_tiny(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  o.superblock_size = 64 * KiB;
  o.chunk_size = MiB;
  o.keep_superblocks = 0;
  return rmmc_arena_resource_create(up, &o, out);
}

START_TEST(test_arena_size_classes) {
  rmmc_resource_t *spy = new_spy(), *r;
  ck_assert_int_eq(rmmc_arena_resource_create(spy, NULL, &r), RMMC_SUCCESS);
  struct { size_t bytes, align, size; } c[] = {
      {1, 256, 256},          {256, 1, 256},        {257, 256, 512},     {1000, 256, 1024},
      {1025, 256, 1280},      {2048, 256, 2048},    {2049, 256, 2560},   {5000, 256, 5120},
      {100, 4096, 4096},      {5000, 4096, 8192},   {MiB, 256, MiB},     {MiB + 1, 256, 1280 * KiB},
      {3 * MiB, 256, 3 * MiB}, {100, 2 * MiB, 256}, {0, 256, 0},         {1, 3, 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    ck_assert_msg(rmmc_arena_resource_block_size(r, c[i].bytes, c[i].align) == c[i].size,
                  "%zu/%zu: %zu, not %zu", c[i].bytes, c[i].align,
                  rmmc_arena_resource_block_size(r, c[i].bytes, c[i].align), c[i].size);
  ck_assert_uint_eq(rmmc_arena_resource_block_size(spy, 100, 256), 0);
  /* Nothing is taken before the first allocate; then one 256 MiB chunk. */
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 0);
  void *p, *big;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).last_bytes, 256 * MiB);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).last_alignment, 4 * MiB);
  ck_assert_uint_eq(field(r, "superblocks"), 1);
  ck_assert_uint_eq(field(r, "in_use"), 1024);
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 2 * MiB, S1, &big), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)big % (2 * MiB), 0);
  ck_assert_uint_eq(field(r, "large_allocations"), 1);
  ck_assert_uint_eq(field(r, "in_use"), 1024 + 256);
  ck_assert_int_eq(rmmc_resource_deallocate(r, big, 100, 2 * MiB, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 1);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_same_stream_reuse_makes_no_cuda_call) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  void *p, *keep, *q[2] = {NULL, NULL};
  ck_assert_int_eq(rmmc_resource_allocate(r, 700, 256, S1, &keep), RMMC_SUCCESS);
  for (int i = 0; i < 1000; i++) {
    size_t n = i % 2 ? 700 : 100 * KiB;
    ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, S1, &p), RMMC_SUCCESS);
    if (i >= 2) ck_assert_ptr_eq(p, q[i % 2]); /* the block just freed, small or large */
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, n, 256, S1), RMMC_SUCCESS);
    q[i % 2] = p;
  }
  ck_assert_int_eq(rmmc_resource_deallocate(r, keep, 700, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_waits"), 0);
  ck_assert_uint_eq(field(r, "device_syncs"), 0);
  /* Large blocks freed on their stream are cached by the arena. */
  ck_assert_uint_eq(field(r, "event_records"), 0);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 112 * KiB);
  ck_assert_uint_eq(field(r, "streams"), 1);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_free_on_another_stream_waits_before_reuse) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  void *x, *y, *z;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &y), RMMC_SUCCESS);
  /* Freed on S2: S2's event is recorded, the block waits for S1 to wait. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 3000, 256, S2), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  ck_assert_uint_eq(field(r, "in_use"), 3072);
  /* Pending: a second free is a double free. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 3000, 256, S3), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "already free"), "%s", rmmc_last_error_message());
  /* S1's next allocate waits on S2's event and reuses the block. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &z), RMMC_SUCCESS);
  ck_assert_ptr_eq(z, x);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, z, 3000, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 3000, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  finish(r, spy);
}
END_TEST

/* A block freed on another stream waits for its owner's next allocate; if
 * none comes, release_cached must still release it and give the chunk
 * back (it used to stay pending, so the chunk stayed until destroy). */
START_TEST(test_arena_release_cached_takes_pending_frees) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  void *x, *y;
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &y), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 3000, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 3000, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  /* Still serves, and the block freed before is not handed out twice. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, S1, &y), RMMC_SUCCESS);
  ck_assert_ptr_ne(x, y);
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 3000, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 3000, 256, S1), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_large_block_crosses_streams_after_event) {
  /* One 256 KiB chunk and no more: the clean space is used up, so S2 can
   * only get the block S1 freed, after waiting on S1's event. */
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 256 * KiB, 0);
  void *l1, *l2, *l3, *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 128 * KiB, 256, S2, &l2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 128 * KiB, 256, S1, &l1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, l1, 128 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  ck_assert_int_eq(rmmc_resource_allocate(r, 128 * KiB, 256, S2, &l3), RMMC_SUCCESS);
  ck_assert_ptr_eq(l3, l1);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  ck_assert_uint_eq(field(r, "device_syncs"), 0);
  /* Full, and nothing to reclaim: a clean out-of-memory naming the limit. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, S1, &p), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rmmc_last_error_message(), "limit of 256.00 KiB"), "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, l3, 128 * KiB, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, l2, 128 * KiB, 256, S2), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 1);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_out_of_memory_reclaims_superblocks_and_retries) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  spy_t *s = spy_of(spy);
  void *p[16], *q;
  /* 16 KiB blocks, 4 per superblock: fill all 4 superblocks of the chunk on S1. */
  for (int i = 0; i < 16; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 16 * KiB, 256, S1, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "superblocks"), 4);
  ck_assert_uint_eq(field(r, "global_free"), 0);
  for (int i = 0; i < 16; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 16 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "cached_superblocks"), 4); /* S1's arena keeps them */
  spy_set_capacity(s, spy_counts(s).outstanding_bytes);
  /* S2's arena needs a superblock: the upstream refuses, S1's arena gives
   * its four back, the device is synchronized (they were freed on S1) and
   * the allocation succeeds, leaving the thread's last error alone. */
  rmmc_clear_last_error();
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, S2, &q), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_last_error_message(), "");
  ck_assert_uint_eq(spy_counts(s).allocate_failures, 2); /* a chunk, then one superblock */
  ck_assert_uint_eq(field(r, "device_syncs"), 1);
  ck_assert_uint_eq(field(r, "superblocks"), 1);
  ck_assert_uint_eq(field(r, "cached_superblocks"), 0);
  ck_assert_uint_eq(field(r, "global_free"), 3 * 64 * KiB);
  /* A large request that cannot fit anywhere fails cleanly after one retry
   * of its own and one of the stack (the out-of-memory rule: the arena
   * still caches 192 KiB, so the stack gives it back, which reaches the
   * spy, and tries again). */
  void *big = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 512 * KiB, 256, S2, &big), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(big);
  ck_assert_uint_eq(spy_counts(s).release_calls, 1);
  ck_assert_msg(strstr(rmmc_last_error_message(), "arena could not take"), "%s", rmmc_last_error_message());
  ck_assert_msg(strstr(rmmc_last_error_message(), "arena gave back its cached memory (and its "
                                                  "upstream's) and the request was retried"),
                "%s", rmmc_last_error_message());
  ck_assert_msg(strstr(rmmc_last_error_message(), "stack: arena (reserved 256.00 KiB"), "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 5000, 256, S2), RMMC_SUCCESS);
  spy_set_capacity(s, SIZE_MAX);
  /* release_cached gives the whole chunk back once every superblock is free. */
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_uint_eq(field(r, "reserved"), 0);
  ck_assert_uint_eq(field(r, "chunks"), 0);
  ck_assert_uint_eq(spy_counts(s).release_calls, 2);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_large_blocks_cached_per_stream) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, 256 * KiB);
  void *a, *b, *c[3];
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S1, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 100 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 112 * KiB);
  uint64_t gfree = field(r, "global_free");
  /* Same class on the same stream: the cached block, global arena untouched. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 110 * KiB, 256, S1, &b), RMMC_SUCCESS);
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 0);
  ck_assert_uint_eq(field(r, "global_free"), gfree);
  ck_assert_uint_eq(field(r, "large_allocations"), 1);
  /* Another stream does not see S1's cache. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S2, &c[0]), RMMC_SUCCESS);
  ck_assert_ptr_ne(c[0], a);
  /* Freed on another stream than its arena's: back to the global arena,
   * covered by S1's event. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, c[0], 100 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 110 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 110 * KiB, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "already free"), "%s", rmmc_last_error_message());
  /* The cache holds 256 KiB: two 112 KiB blocks; the third goes back. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S1, &c[0]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S1, &c[1]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S1, &c[2]), RMMC_SUCCESS);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, c[i], 100 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 224 * KiB);
  ck_assert_uint_eq(field(r, "event_records"), 2);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  /* release_cached takes the caches back and returns whole chunks. */
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 0);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  finish(r, spy);
}
END_TEST

typedef struct exit_arg {
  rmmc_resource_t *r;
  cudaStream_t stream;
  int keep_one; /* leave one block allocated at exit */
  void *kept;
} exit_arg_t;

static void *alloc_then_exit(void *arg) {
  exit_arg_t *e = arg;
  void *p[40], *big;
  /* A large block freed on the thread's stream stays cached until exit. */
  if (rmmc_resource_allocate(e->r, 100 * KiB, 256, e->stream, &big) != RMMC_SUCCESS ||
      rmmc_resource_deallocate(e->r, big, 100 * KiB, 256, e->stream) != RMMC_SUCCESS)
    return (void *)3;
  for (int i = 0; i < 40; i++)
    if (rmmc_resource_allocate(e->r, (size_t)(i % 2 ? 16 : 4) * KiB, 256, e->stream, &p[i]) != RMMC_SUCCESS)
      return (void *)1;
  for (int i = e->keep_one; i < 40; i++)
    if (rmmc_resource_deallocate(e->r, p[i], (size_t)(i % 2 ? 16 : 4) * KiB, 256, e->stream) != RMMC_SUCCESS)
      return (void *)2;
  e->kept = e->keep_one ? p[0] : NULL;
  return NULL;
}

START_TEST(test_arena_thread_exit_returns_superblocks) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 8, 0, MiB);
  exit_arg_t e = {r, S1, 0, NULL};
  pthread_t t;
  void *res;
  /* 20 blocks of 16 KiB (5 superblocks) and 20 of 4 KiB (2): all freed, the
   * arena keeps them while its thread lives; at exit they go back. */
  ck_assert_int_eq(pthread_create(&t, NULL, alloc_then_exit, &e), 0);
  pthread_join(t, &res);
  ck_assert_ptr_null(res);
  ck_assert_uint_eq(field(r, "superblocks"), 0);
  ck_assert_uint_eq(field(r, "arenas"), 0);
  ck_assert_uint_eq(field(r, "global_free"), field(r, "reserved"));
  ck_assert_uint_eq(field(r, "in_use"), 0);
  /* A thread that exits holding a block: its superblock stays until the
   * block is freed (here by this thread, on another stream). */
  e.keep_one = 1;
  ck_assert_int_eq(pthread_create(&t, NULL, alloc_then_exit, &e), 0);
  pthread_join(t, &res);
  ck_assert_ptr_null(res);
  ck_assert_uint_eq(field(r, "superblocks"), 1);
  ck_assert_uint_eq(field(r, "detached_arenas"), 1);
  ck_assert_uint_eq(field(r, "in_use"), 4 * KiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, e.kept, 4 * KiB, 256, S2), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "superblocks"), 0);
  ck_assert_uint_eq(field(r, "detached_arenas"), 0);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, e.kept, 4 * KiB, 256, S2), RMMC_ERROR_UNKNOWN_POINTER);
  /* The dead thread's arena struct is reused by the next thread. */
  e.keep_one = 0;
  ck_assert_int_eq(pthread_create(&t, NULL, alloc_then_exit, &e), 0);
  pthread_join(t, &res);
  ck_assert_ptr_null(res);
  ck_assert_uint_eq(field(r, "superblocks"), 0);
  /* It found room in what the first thread left (all but the mixed one). */
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 3);
  finish(r, spy);
}
END_TEST

typedef struct gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  int stage;
} gate_t;

static void gate_set(gate_t *g, int stage) {
  pthread_mutex_lock(&g->m);
  g->stage = stage;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

static void gate_wait(gate_t *g, int stage) {
  pthread_mutex_lock(&g->m);
  while (g->stage < stage) pthread_cond_wait(&g->c, &g->m);
  pthread_mutex_unlock(&g->m);
}

typedef struct outlive_arg {
  rmmc_resource_t *r;
  gate_t *g;
  int ok;
} outlive_arg_t;

static void *outlive(void *arg) {
  outlive_arg_t *o = arg;
  void *p;
  o->ok = rmmc_resource_allocate(o->r, 1000, 256, S1, &p) == RMMC_SUCCESS &&
          rmmc_resource_deallocate(o->r, p, 1000, 256, S1) == RMMC_SUCCESS &&
          rmmc_resource_allocate(o->r, 1000, 256, S2, &p) == RMMC_SUCCESS &&
          rmmc_resource_deallocate(o->r, p, 1000, 256, S2) == RMMC_SUCCESS;
  gate_set(o->g, 1);
  gate_wait(o->g, 2); /* the resource is destroyed meanwhile */
  /* A new resource on this thread after the old one died. */
  rmmc_resource_t *spy, *r2;
  if (spy_create(RMMC_MEMORY_HOST, &spy) != RMMC_SUCCESS) return NULL;
  if (rmmc_arena_resource_create(spy, NULL, &r2) == RMMC_SUCCESS) {
    o->ok &= rmmc_resource_allocate(r2, 1000, 256, S1, &p) == RMMC_SUCCESS &&
             rmmc_resource_deallocate(r2, p, 1000, 256, S1) == RMMC_SUCCESS;
    rmmc_resource_release(r2);
  }
  rmmc_resource_release(spy);
  return NULL; /* exits after both resources are gone */
}

START_TEST(test_arena_destroyed_while_threads_live) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  outlive_arg_t o = {r, &g, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, outlive, &o), 0);
  gate_wait(&g, 1);
  ck_assert_uint_eq(field(r, "arenas"), 2);
  finish(r, spy); /* destroys the arena resource under the living thread */
  gate_set(&g, 2);
  pthread_join(t, NULL);
  ck_assert_int_eq(o.ok, 1);
}
END_TEST

typedef struct mt_arg {
  rmmc_resource_t *r;
  unsigned id;
  int failures;
} mt_arg_t;

static void *own_stream_worker(void *arg) {
  mt_arg_t *m = arg;
  cudaStream_t st = (cudaStream_t)(uintptr_t)(0x10000 * (m->id + 1));
  enum { N = 64 };
  unsigned char *p[N] = {0};
  size_t n[N];
  unsigned seed = m->id * 7919u + 1;
  for (int op = 0; op < 20000; op++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 8) % N);
    if (p[k] != NULL) {
      if (p[k][0] != (unsigned char)m->id || p[k][n[k] - 1] != (unsigned char)k) m->failures++;
      if (rmmc_resource_deallocate(m->r, p[k], n[k], 256, st) != RMMC_SUCCESS) m->failures++;
      p[k] = NULL;
    } else {
      n[k] = 2 + (seed >> 4) % (seed & 1 ? 2048 : 200 * 1024);
      if (rmmc_resource_allocate(m->r, n[k], 256, st, (void **)&p[k]) != RMMC_SUCCESS) {
        m->failures++;
        p[k] = NULL;
        continue;
      }
      p[k][0] = (unsigned char)m->id;
      p[k][n[k] - 1] = (unsigned char)k;
    }
  }
  for (int k = 0; k < N; k++)
    if (p[k] != NULL && rmmc_resource_deallocate(m->r, p[k], n[k], 256, st) != RMMC_SUCCESS) m->failures++;
  return NULL;
}

START_TEST(test_arena_sixteen_threads_on_their_streams) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 2, 0, MiB);
  enum { T = 16 };
  pthread_t th[T];
  mt_arg_t args[T];
  for (unsigned i = 0; i < T; i++) {
    args[i] = (mt_arg_t){r, i, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, own_stream_worker, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(args[i].failures, 0);
  }
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_uint_eq(field(r, "superblocks"), 0); /* all threads exited */
  ck_assert_uint_eq(field(r, "device_syncs"), 0); /* never short of memory */
  finish(r, spy);
}
END_TEST

/* Producers allocate on their stream, consumers free on theirs: every free
 * is a remote, cross-stream one. */
typedef struct handoff {
  pthread_mutex_t m;
  void *slots[256];
  size_t sizes[256];
  int head, tail, done;
} handoff_t;

typedef struct pc_arg {
  rmmc_resource_t *r;
  handoff_t *h;
  unsigned id;
  int failures;
} pc_arg_t;

static void *producer(void *arg) {
  pc_arg_t *a = arg;
  cudaStream_t st = (cudaStream_t)(uintptr_t)(0x100000 * (a->id + 1));
  for (int i = 0; i < 3000; i++) {
    size_t n = 100 + (size_t)(i * 37 % 9000);
    unsigned char *p;
    if (rmmc_resource_allocate(a->r, n, 256, st, (void **)&p) != RMMC_SUCCESS) {
      a->failures++;
      continue;
    }
    memset(p, (int)(n & 0xff), n);
    for (;;) {
      pthread_mutex_lock(&a->h->m);
      if (a->h->head - a->h->tail < 256) break;
      pthread_mutex_unlock(&a->h->m);
      sched_yield();
    }
    a->h->slots[a->h->head % 256] = p;
    a->h->sizes[a->h->head % 256] = n;
    a->h->head++;
    pthread_mutex_unlock(&a->h->m);
  }
  return NULL;
}

static void *consumer(void *arg) {
  pc_arg_t *a = arg;
  cudaStream_t st = (cudaStream_t)(uintptr_t)(0x7000000 + 0x1000 * a->id);
  for (;;) {
    pthread_mutex_lock(&a->h->m);
    if (a->h->tail == a->h->head) {
      int done = a->h->done;
      pthread_mutex_unlock(&a->h->m);
      if (done) return NULL;
      sched_yield();
      continue;
    }
    unsigned char *p = a->h->slots[a->h->tail % 256];
    size_t n = a->h->sizes[a->h->tail % 256];
    a->h->tail++;
    pthread_mutex_unlock(&a->h->m);
    if (p[0] != (unsigned char)(n & 0xff) || p[n - 1] != (unsigned char)(n & 0xff)) a->failures++;
    if (rmmc_resource_deallocate(a->r, p, n, 256, st) != RMMC_SUCCESS) a->failures++;
  }
}

START_TEST(test_arena_blocks_freed_by_other_threads_on_other_streams) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 2, 0, MiB);
  handoff_t h;
  memset(&h, 0, sizeof h);
  pthread_mutex_init(&h.m, NULL);
  enum { P = 3, C = 3 };
  pthread_t tp[P], tc[C];
  pc_arg_t ap[P], ac[C];
  for (unsigned i = 0; i < P; i++) {
    ap[i] = (pc_arg_t){r, &h, i, 0};
    ck_assert_int_eq(pthread_create(&tp[i], NULL, producer, &ap[i]), 0);
  }
  for (unsigned i = 0; i < C; i++) {
    ac[i] = (pc_arg_t){r, &h, i, 0};
    ck_assert_int_eq(pthread_create(&tc[i], NULL, consumer, &ac[i]), 0);
  }
  for (int i = 0; i < P; i++) pthread_join(tp[i], NULL);
  pthread_mutex_lock(&h.m);
  h.done = 1;
  pthread_mutex_unlock(&h.m);
  for (int i = 0; i < C; i++) pthread_join(tc[i], NULL);
  for (int i = 0; i < P; i++) ck_assert_int_eq(ap[i].failures, 0);
  for (int i = 0; i < C; i++) ck_assert_int_eq(ac[i].failures, 0);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_uint_ge(field(r, "event_records"), 1);
  ck_assert_uint_eq(field(r, "superblocks"), 0);
  pthread_mutex_destroy(&h.m);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_bad_frees_change_nothing) {
  rmmc_resource_t *spy = new_spy(), *r = make_small(spy, 4, 0, MiB);
  void *p, *q, *big;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S1, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 100 * KiB, 256, S1, &big), RMMC_SUCCESS);
  void *foreign = malloc(1000);
  struct { void *p; size_t n; const char *needle; } bad[] = {
      {foreign, 1000, "not a block of this arena"},
      {(char *)q + 256, 1000, "not the start of a block"},
      {q, 5000, "superblock of 1024-byte blocks"},
      {big, 1000, "not a block of this arena"},
      {p, 100 * KiB, "not a large block"},
      {big, 90 * KiB, "has 114688 bytes, not the 98304"},
      {foreign, 100 * KiB, "not a large block"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(r, bad[i].p, bad[i].n, 256, i % 2 ? S1 : S2),
                     RMMC_ERROR_UNKNOWN_POINTER);
    ck_assert_msg(strstr(rmmc_last_error_message(), bad[i].needle), "%zu: %s", i,
                  rmmc_last_error_message());
  }
  ck_assert_uint_eq(field(r, "in_use"), 2048 + 112 * KiB); /* 100 KiB rounds to 112 */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "already free"), "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, big, 100 * KiB, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, big, 100 * KiB, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 1000, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  free(foreign);
  finish(r, spy);
}
END_TEST

START_TEST(test_arena_create_checks_arguments) {
  rmmc_resource_t *spy = new_spy(), *r = (rmmc_resource_t *)1;
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  ck_assert_int_eq(rmmc_arena_resource_create(NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_arena_resource_create(spy, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  size_t bad_sb[] = {0, 3 * MiB, 32 * KiB, (size_t)2 << 30};
  for (size_t i = 0; i < 4; i++) {
    o.superblock_size = bad_sb[i];
    ck_assert_int_eq(rmmc_arena_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(rmmc_last_error_message(), "power of two from 64 KiB to 1 GiB"), "%s",
                  rmmc_last_error_message());
  }
  o = (rmmc_arena_options_t)RMMC_ARENA_OPTIONS_INIT;
  o.chunk_size = 0;
  ck_assert_int_eq(rmmc_arena_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  o = (rmmc_arena_options_t)RMMC_ARENA_OPTIONS_INIT;
  o.max_size = MiB;
  ck_assert_int_eq(rmmc_arena_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  o.size = 0;
  ck_assert_int_eq(rmmc_arena_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  /* chunk_size is rounded up to whole superblocks. */
  o = (rmmc_arena_options_t)RMMC_ARENA_OPTIONS_INIT;
  o.chunk_size = 5 * MiB;
  ck_assert_int_eq(rmmc_arena_resource_create(spy, &o, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "arena");
  ck_assert_ptr_eq(rmmc_resource_upstream(r), spy);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).last_bytes, 8 * MiB);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1, 256, NULL), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

/* One superblock of room: a large block freed on S1 reaches S2 after an
 * event wait (cache=0) or, cached by S1's arena, after the out-of-memory
 * reclaim and a device synchronization (also in test_gpu_pool's table). */
START_TEST(test_arena_one_block_of_room_crosses_streams) {
  const char *specs[] = {"arena(superblock=1MiB, chunk=1MiB, max=1MiB, cache=0) > host",
                         "arena(superblock=1MiB, chunk=1MiB, max=1MiB) > host"};
  const char *counter[] = {"event_waits", "device_syncs"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *r;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    void *p, *q;
    ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, S1, &p), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, MiB, 256, S1), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, S2, &q), RMMC_SUCCESS);
    ck_assert_ptr_eq(q, p);
    ck_assert_uint_eq(field(r, counter[i]), 1);
    ck_assert_int_eq(rmmc_resource_deallocate(r, q, MiB, 256, S2), RMMC_SUCCESS);
    rmmc_resource_release(r);
  }
}
END_TEST

START_TEST(test_arena_spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("arena > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "superblock_size"), 4 * MiB);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("arena(superblock=1MiB, chunk=16MiB, max=64MiB, keep=0, cache=0) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "superblock_size"), MiB);
  void *p[8];
  for (int i = 0; i < 8; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 256 * KiB, 256, NULL, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "reserved"), 16 * MiB);
  ck_assert_uint_eq(field(r, "superblocks"), 2);
  for (int i = 0; i < 8; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 256 * KiB, 256, NULL), RMMC_SUCCESS);
  /* keep=0: only the class's last superblock stays. */
  ck_assert_uint_eq(field(r, "superblocks"), 1);
  ck_assert_uint_eq(field(r, "cached_superblocks"), 1);
  /* The second superblock went back with an event; with cache=0 a freed
   * large block does too. */
  ck_assert_uint_eq(field(r, "event_records"), 1);
  ck_assert_int_eq(rmmc_resource_allocate(r, 300 * KiB, 256, NULL, &p[0]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[0], 300 * KiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "cached_large_bytes"), 0);
  ck_assert_uint_eq(field(r, "event_records"), 2);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("arena(max=5%) > host", -1, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("binning(max=64KiB) > arena > host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(rmmc_resource_upstream(r)), "arena");
  rmmc_resource_release(r);
  expect_spec_error("arena(superblock=3MiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "superblock size 3145728");
  expect_spec_error("arena(superblock=4XB) > host", RMMC_ERROR_PARSE, "column 18");
  expect_spec_error("arena(keep=-1) > host", RMMC_ERROR_INVALID_ARGUMENT,
                    "keep=-1 is out of range (0 to 9223372036854775807)");
  expect_spec_error("arena(keep=two) > host", RMMC_ERROR_PARSE, "'two' is not an integer");
  expect_spec_error("arena(chunk=0) > host", RMMC_ERROR_INVALID_ARGUMENT, "chunk size 0");
  expect_spec_error("arena(max=1MiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "below one superblock");
  expect_spec_error("arena(max=200%) > host", RMMC_ERROR_PARSE, "percentage in (0, 100]");
  expect_spec_error("arena(size=1GiB) > host", RMMC_ERROR_PARSE, "it takes: superblock, chunk, max, keep, cache");
  expect_spec_error("arena(cache=lots) > host", RMMC_ERROR_PARSE, "'lots' is not a size");
}
END_TEST

/* Issue 11: a new stream handle per call made an arena per handle, each
 * caching a superblock (125 GiB reserved for 64 MiB live after 64k
 * handles). A thread keeps 64 arenas; older ones are detached and their
 * memory reused, and the global arena synchronizes rather than grow when
 * half of it is stranded: what 64 arenas cache (here two superblocks and a
 * large block each) is the bound, however many handles come. Over sim:
 * nothing is touched. */
START_TEST(test_arena_new_stream_per_call_stays_bounded) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("arena(chunk=16MiB) > sim", -1, &r), RMMC_SUCCESS);
  static const size_t sizes[] = {8 * KiB, MiB, 3 * MiB}; /* small, small, large */
  uint64_t reserved_at_600 = 0;
  for (int k = 0; k < 3000; k++) {
    if (k == 600) reserved_at_600 = field(r, "reserved");
    cudaStream_t s = (cudaStream_t)(uintptr_t)(0x10000 + 16 * (uintptr_t)k);
    size_t n = sizes[k % 3];
    void *p;
    ck_assert_msg(rmmc_resource_allocate(r, n, 256, s, &p) == RMMC_SUCCESS, "%s",
                  rmmc_last_error_message());
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, n, 256, s), RMMC_SUCCESS);
  }
  ck_assert_uint_le(field(r, "reserved"), reserved_at_600 + 16 * MiB);
  ck_assert_uint_le(field(r, "reserved"), 64 * (2 * 4 + 3) * MiB + 32 * MiB);
  ck_assert_uint_le(field(r, "arenas"), 64);
  ck_assert_uint_ge(field(r, "device_syncs"), 1);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  static const conformance_case_t cases[] = {
      {"arena default", make_default, 0},
      {"arena tiny superblocks", make_tiny, 0},
  };
  Suite *s = suite_create("arena");
  conformance_add(s, cases, 2);
  TCase *tc = tcase_create("arena");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_arena_size_classes);
  tcase_add_test(tc, test_arena_same_stream_reuse_makes_no_cuda_call);
  tcase_add_test(tc, test_arena_free_on_another_stream_waits_before_reuse);
  tcase_add_test(tc, test_arena_release_cached_takes_pending_frees);
  tcase_add_test(tc, test_arena_large_block_crosses_streams_after_event);
  tcase_add_test(tc, test_arena_out_of_memory_reclaims_superblocks_and_retries);
  tcase_add_test(tc, test_arena_large_blocks_cached_per_stream);
  tcase_add_test(tc, test_arena_thread_exit_returns_superblocks);
  tcase_add_test(tc, test_arena_destroyed_while_threads_live);
  tcase_add_test(tc, test_arena_sixteen_threads_on_their_streams);
  tcase_add_test(tc, test_arena_blocks_freed_by_other_threads_on_other_streams);
  tcase_add_test(tc, test_arena_bad_frees_change_nothing);
  tcase_add_test(tc, test_arena_create_checks_arguments);
  tcase_add_test(tc, test_arena_spec);
  tcase_add_test(tc, test_arena_one_block_of_room_crosses_streams);
  tcase_add_test(tc, test_arena_new_stream_per_call_stays_bounded);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
