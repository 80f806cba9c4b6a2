/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's cheap checks (src/resources/pool/check.h, debug_checks >= 1):
 * a pool corrupted on purpose (its internals reached through the static
 * library) aborts on its next slow path, with a message that names the
 * invariant, the block and file:line; a sound pool's slow paths pass them.
 * Each corruption runs in a child process whose stderr comes back through
 * a pipe, so the test sees the abort and reads the message.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "resources/pool/core.h"
#include "resources/pool/vm.h"
#include "rmmc/rmmc.h"
#include "vmspy.h"

typedef void (*scenario_fn)(void);

/* Runs fn in a child; true if it died of SIGABRT, its stderr in out. */
static bool aborts(scenario_fn fn, char *out, size_t len) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], STDERR_FILENO);
    fn();
    _exit(0);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t k;
  while (n + 1 < len && (k = read(fd[0], out + n, len - 1 - n)) > 0) n += (size_t)k;
  out[n] = '\0';
  close(fd[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

/* A pool over host memory in chunks, holding one wholly free chunk (a
 * large block allocated and freed) and one span lent to a stream heap
 * (a small block allocated and freed). */
static rmmc_resource_t *host_pool(void) {
  rmmc_resource_t *host = NULL, *pool = NULL;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 0;
  ck_assert_int_eq(rmmc_pool_resource_create(host, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(host);
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 1000, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 1000, 256, NULL), RMMC_SUCCESS);
  void *big = NULL; /* past what the span's chunk has left: a chunk of its own */
  ck_assert_int_eq(rmmc_resource_allocate(pool, 64 << 20, 256, NULL, &big), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, big, 64 << 20, 256, NULL), RMMC_SUCCESS);
  return pool;
}

/* The region whose first block is wholly free (the large chunk). */
static pool_region_t *free_chunk(pool_t *p) {
  for (pool_region_t *r = p->regions; r != NULL; r = r->next)
    if (r->first->state == B_FREE && r->first->next == NULL) return r;
  ck_abort_msg("no wholly free chunk");
  return NULL;
}

/* ---- a sound pool ---- */

START_TEST(test_sound_pool_passes_its_slow_paths) {
  rmmc_resource_t *pool = host_pool();
  /* Growth, span lending and return, trimming: every slow path checked. */
  void *q[16];
  for (int i = 0; i < 16; i++)
    ck_assert_int_eq(rmmc_resource_allocate(pool, (size_t)(i + 1) << 20, 256, NULL, &q[i]),
                     RMMC_SUCCESS);
  for (int i = 0; i < 16; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(pool, q[i], (size_t)(i + 1) << 20, 256, NULL),
                     RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  ck_assert_uint_eq(((pool_t *)pool)->reserved, 0);
  rmmc_resource_release(pool);
}
END_TEST

/* ---- corruptions ---- */

/* A free chunk's block no longer begins its region: the trim of
 * release_cached checks the block it gives back. */
static void moved_block(void) {
  rmmc_resource_t *pool = host_pool();
  pool_t *p = (pool_t *)pool;
  pool_block_t *b = free_chunk(p)->first;
  b->addr += POOL_GRANULE;
  b->node.size -= POOL_GRANULE;
  (void)rmmc_resource_release_cached(pool);
}

START_TEST(test_moved_block_aborts_with_the_invariant) {
  char msg[4096];
  ck_assert_msg(aborts(moved_block, msg, sizeof msg), "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, "rmmc: pool ") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "invariant broken at ") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "chunks.c:") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "the region's first block begins it") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "(free, where 0") != NULL, "%s", msg); /* the block's state */
}
END_TEST

/* reserved counts less than a chunk the trim gives back: the counter would
 * wrap. */
static void reserved_too_small(void) {
  rmmc_resource_t *pool = host_pool();
  ((pool_t *)pool)->reserved = POOL_GRANULE;
  (void)rmmc_resource_release_cached(pool);
}

START_TEST(test_counter_underflow_aborts) {
  char msg[4096];
  ck_assert_msg(aborts(reserved_too_small, msg, sizeof msg), "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, "(p->reserved) >= (r->size)") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "chunks.c:") != NULL, "%s", msg);
}
END_TEST

/* A span going back whose shared-heap block is marked free (it must be a
 * span): release_cached takes the stream heap's idle span back. */
static void span_parent_free(void) {
  rmmc_resource_t *pool = host_pool();
  pool_t *p = (pool_t *)pool;
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 1000, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(p->heaps);
  ck_assert_ptr_nonnull(p->heaps->spans);
  p->heaps->spans->parent->state = B_FREE;
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 1000, 256, NULL), RMMC_SUCCESS);
  (void)rmmc_resource_release_cached(pool);
}

START_TEST(test_span_state_aborts) {
  char msg[4096];
  ck_assert_msg(aborts(span_parent_free, msg, sizeof msg), "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, "the block is in the state the step expects") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "stream_heaps.c:") != NULL, "%s", msg);
}
END_TEST

/* The report goes through the library's error path too: a handler of
 * rmmc_set_error sees it (here: the message set before the abort, read in
 * a SIGABRT handler of the child). */
static void on_abort(int sig) {
  (void)sig;
  const char *m = rmmc_last_error_message();
  if (strstr(m, "invariant broken") != NULL && rmmc_last_cuda_error() == cudaSuccess)
    (void)!write(STDERR_FILENO, "\nlast error set\n", 16);
  signal(SIGABRT, SIG_DFL);
  raise(SIGABRT);
}

static void moved_block_handled(void) {
  signal(SIGABRT, on_abort);
  moved_block();
}

START_TEST(test_report_sets_the_thread_error) {
  char msg[4096];
  ck_assert_msg(aborts(moved_block_handled, msg, sizeof msg), "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, "\nlast error set\n") != NULL, "%s", msg);
}
END_TEST

/* A pool over virtual memory (vmspy > host), 64 KiB pages. */
static rmmc_resource_t *vm_pool(void) {
  rmmc_resource_t *host = NULL, *vm = NULL, *pool = NULL;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  ck_assert_int_eq(vmspy_create(host, 64 << 10, &vm), RMMC_SUCCESS);
  rmmc_resource_release(host);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  ck_assert_int_eq(rmmc_pool_resource_create(vm, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(vm);
  return pool;
}

/* A hole that a mapping covers: the trim's unmapping of the block beside
 * it checks the hole it makes, merged with that one. */
static void mapped_hole(void) {
  rmmc_resource_t *pool = vm_pool();
  pool_t *p = (pool_t *)pool;
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 8 << 20, 256, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(p->holes);
  pool_region_t *r = p->holes->region;
  ck_assert_uint_gt(r->nsegs, 0);
  /* The books say a page inside the hole after the free block is mapped
   * (nothing is: the trim never unmaps it, it lies under no free block). */
  pool_block_t *u = p->holes;
  ck_assert_uint_gt(pool_bsize(u), 32 * p->page);
  ck_assert(rmmc__pool_seg_insert(r, u->addr + 16 * p->page, p->page));
  (void)rmmc_resource_release_cached(pool);
}

START_TEST(test_mapped_hole_aborts) {
  char msg[4096];
  ck_assert_msg(aborts(mapped_hole, msg, sizeof msg), "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, "vm.c:") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "a hole is on no mapping") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "(unmapped, where 0") != NULL, "%s", msg);
}
END_TEST

/* An allocation that passed allocate's unlocked pause gate before a pause
 * took effect reaches the growth with the pool paused: refused there,
 * nothing mapped (here the gate is passed by setting the pause mark
 * alone, as the pause does under every lock after the gate was read). */
START_TEST(test_growth_of_a_paused_pool_is_refused) {
  rmmc_resource_t *pool = vm_pool();
  pool_t *p = (pool_t *)pool;
  size_t reserved = p->reserved;
  uint64_t maps = p->page_maps;
  __atomic_store_n(&p->paused, 1, __ATOMIC_RELAXED);
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  ck_assert_msg(strstr(rmmc_last_error_message(), "paused") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(p->reserved, reserved);
  ck_assert_uint_eq(p->page_maps, maps);
  __atomic_store_n(&p->paused, 0, __ATOMIC_RELAXED);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 8 << 20, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  rmmc_resource_release(pool);
}
END_TEST

/* The same race through the fast paths: an allocation that passed the gate
 * before a discard pause took the heap's hot block or a free large block,
 * whose pages the pause had unmapped. The pause puts hot blocks back in
 * their heaps, and both the heap search and the shared heap refuse while
 * paused (here the gate is lowered again after the pause, as the racing
 * call saw it). */
START_TEST(test_allocation_that_raced_a_pause_is_refused) {
  rmmc_resource_t *pool = vm_pool();
  pool_t *p = (pool_t *)pool;
  void *small = NULL, *big = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 1000, 256, NULL, &small), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &big), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, small, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, big, 8 << 20, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_pause(pool, RMMC_POOL_PAUSE_DISCARD, NULL), RMMC_SUCCESS);
  rmmc__pool_count_route(p, -1); /* the racing call read the gate open */
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 1000, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  ck_assert_msg(strstr(rmmc_last_error_message(), "paused") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  ck_assert_msg(strstr(rmmc_last_error_message(), "paused") != NULL, "%s",
                rmmc_last_error_message());
  rmmc__pool_count_route(p, 1);
  ck_assert_int_eq(rmmc_pool_resume(pool, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 1000, 256, NULL, &q), RMMC_SUCCESS);
  memset(q, 7, 1000); /* mapped again */
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(pool, 8 << 20, 256, NULL, &q), RMMC_SUCCESS);
  memset(q, 7, 8 << 20);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 8 << 20, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  rmmc_resource_release(pool);
}
END_TEST

/* A small request out of memory drops its heap's lock between lending
 * (step 3) and its retry (step 4). Streams made there (the seam) retire
 * its heap, the oldest and idle; the retry goes on in the stream's heap
 * now, within the same call, and ends in a plain out-of-memory. */
static rmmc_resource_t *retry_pool;
static int retry_seam_calls;

static rmmc_status_t small_on(rmmc_resource_t *r, uintptr_t key, void **q) {
  return rmmc_resource_allocate(r, 1024, 256, (cudaStream_t)key, q);
}

static void retire_in_retry(pool_t *p) {
  (void)p;
  if (retry_seam_calls++ > 0) return;
  void *q;
  for (uintptr_t i = 0; i < 4; i++)
    ck_assert_int_eq(small_on(retry_pool, 0x900000 + i * 16, &q), RMMC_ERROR_OUT_OF_MEMORY);
}

static uint64_t pool_figure(rmmc_resource_t *r, const char *key) {
  uint64_t v = 0;
  ck_assert_msg(rmmc_resource_get_field(r, key, &v), "no figure %s", key);
  return v;
}

START_TEST(test_retry_goes_on_in_the_streams_heap_now) {
  rmmc_resource_t *host = NULL, *pool = NULL;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 0;
  o.initial_size = o.maximum_size = 16 << 20;
  o.stream_heaps = 1;
  ck_assert_int_eq(rmmc_pool_resource_create(host, &o, &pool), RMMC_SUCCESS);
  rmmc_resource_release(host);
  void *big = NULL, *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 16 << 20, 256, NULL, &big), RMMC_SUCCESS);
  const uintptr_t a = 0x7100;
  ck_assert_int_eq(small_on(pool, a, &q), RMMC_ERROR_OUT_OF_MEMORY); /* a's heap, the oldest */
  for (uintptr_t k = 0x10000; pool_figure(pool, "heaps") < 256; k += 16)
    ck_assert_int_eq(small_on(pool, k, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(pool_figure(pool, "heaps_retired"), 0);
  retry_pool = pool;
  retry_seam_calls = 0;
  rmmc__pool_before_retry = retire_in_retry;
  ck_assert_int_eq(small_on(pool, a, &q), RMMC_ERROR_OUT_OF_MEMORY);
  rmmc__pool_before_retry = NULL;
  ck_assert_int_eq(retry_seam_calls, 5); /* the outer call, then each call made in it */
  ck_assert_uint_ge(pool_figure(pool, "heaps_retired"), 2);
  ck_assert_uint_le(pool_figure(pool, "heaps"), 256);
  ck_assert_msg(strstr(rmmc_last_error_message(), "out of memory") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, big, 16 << 20, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(small_on(pool, a, &q), RMMC_SUCCESS); /* room again, on a's heap now */
  memset(q, 5, 1024);
  ck_assert_int_eq(((unsigned char *)q)[1023], 5);
  ck_assert_int_eq(rmmc_resource_deallocate(pool, q, 1024, 256, (cudaStream_t)a), RMMC_SUCCESS);
  ck_assert_uint_eq(pool_figure(pool, "in_use"), 0);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
  rmmc_resource_release(pool);
}
END_TEST

/* Check's own fork mode sees the same abort as a signal (run only when
 * Check forks: with CK_FORK=no, as under valgrind, the abort would end the
 * whole runner). */
START_TEST(test_abort_is_sigabrt) { moved_block(); }
END_TEST

static Suite *suite(bool check_forks) {
  Suite *s = suite_create("pool_checks");
  TCase *tc = tcase_create("cheap");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_sound_pool_passes_its_slow_paths);
  tcase_add_test(tc, test_moved_block_aborts_with_the_invariant);
  tcase_add_test(tc, test_counter_underflow_aborts);
  tcase_add_test(tc, test_span_state_aborts);
  tcase_add_test(tc, test_report_sets_the_thread_error);
  tcase_add_test(tc, test_mapped_hole_aborts);
  tcase_add_test(tc, test_growth_of_a_paused_pool_is_refused);
  tcase_add_test(tc, test_allocation_that_raced_a_pause_is_refused);
  tcase_add_test(tc, test_retry_goes_on_in_the_streams_heap_now);
  if (check_forks) tcase_add_test_raise_signal(tc, test_abort_is_sigabrt, SIGABRT);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
#if RMMC_DEBUG_CHECKS < 1
  fprintf(stderr, "debug_checks=0: no cheap checks to test\n");
  return 77;
#else
  const char *fork_env = getenv("CK_FORK");
  bool check_forks = fork_env == NULL || strcmp(fork_env, "no") != 0;
  SRunner *sr = srunner_create(suite(check_forks));
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
#endif
}
