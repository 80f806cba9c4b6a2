/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Round trip: a program's allocations go through statistics > logging >
 * host; the log the logging adaptor wrote is read and replayed; the log's
 * figures and the replay's (measured by a statistics adaptor over the
 * replay stack) equal the statistics adaptor's figures from the original
 * run. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "replay_engine.h"
#include "rmmc/rmmc.h"
#include "test_main.h"

typedef struct program {
  rmmc_resource_t *r;
  unsigned seed;
  int ops;
  cudaStream_t streams[3];
  void *kept[3]; /* what the program "leaks": freed with free() after the log is closed */
  int nkept;
} program_t;

/* A program: random sizes from 1 B to 2 MiB, up to 64 live, three streams,
 * everything freed at the end except a few blocks it "leaks". */
static void *run_program(void *arg) {
  program_t *p = arg;
  void *live[64];
  size_t sizes[64];
  int n = 0;
  unsigned s = p->seed;
  for (int i = 0; i < p->ops; i++) {
    s = s * 1103515245u + 12345u;
    if (n < 64 && (n == 0 || (s >> 16) % 3)) {
      size_t bytes = 1 + (s >> 5) % (2u << 20);
      if (rmmc_resource_allocate(p->r, bytes, 256, p->streams[(s >> 3) % 3], &live[n]) != RMMC_SUCCESS)
        return (void *)1;
      sizes[n++] = bytes;
    } else {
      int k = (int)((s >> 8) % (unsigned)n);
      if (rmmc_resource_deallocate(p->r, live[k], sizes[k], 256, p->streams[(s >> 3) % 3]) != RMMC_SUCCESS)
        return (void *)2;
      live[k] = live[--n];
      sizes[k] = sizes[n];
    }
  }
  for (int k = 0; k < n && k < 3; k++) p->kept[p->nkept++] = live[k];
  for (int k = 3; k < n; k++) /* keep three live: the log ends with them */
    if (rmmc_resource_deallocate(p->r, live[k], sizes[k], 256, p->streams[0]) != RMMC_SUCCESS)
      return (void *)3;
  return NULL;
}

static void record(const char *path, int nthreads, rmmc_statistics_t *stats) {
  rmmc_resource_t *host, *log, *st;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_create(host, path, NULL, &log), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(log, &st), RMMC_SUCCESS);
  rmmc_resource_release(host);
  rmmc_resource_release(log);
  program_t prog[4];
  pthread_t th[4];
  for (int t = 0; t < nthreads; t++) {
    prog[t] = (program_t){st, 99u + (unsigned)t * 31u, 3000,
                          {(cudaStream_t)0x100, (cudaStream_t)0x200, (cudaStream_t)0x300},
                          {NULL, NULL, NULL}, 0};
    ck_assert_int_eq(pthread_create(&th[t], NULL, run_program, &prog[t]), 0);
  }
  for (int t = 0; t < nthreads; t++) {
    void *rv;
    pthread_join(th[t], &rv);
    ck_assert_ptr_null(rv);
  }
  *stats = (rmmc_statistics_t)RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(st, stats), RMMC_SUCCESS);
  /* The program "leaked" three blocks per thread; releasing the stack
   * closes the log (those blocks stay with the host, as a leak would). */
  rmmc_resource_release(st);
  for (int t = 0; t < nthreads; t++)
    for (int k = 0; k < prog[t].nkept; k++) free(prog[t].kept[k]); /* host memory */
}

static void roundtrip(int nthreads) {
  char path[] = "/tmp/rmmc-roundtrip-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  rmmc_statistics_t orig;
  record(path, nthreads, &orig);

  replay_log_t *log;
  replay_read_options_t ro = REPLAY_READ_OPTIONS_INIT;
  ck_assert_int_eq(replay_log_read(path, &ro, &log), RMMC_SUCCESS);
  ck_assert_uint_eq(log->nthreads, (uint32_t)nthreads);
  ck_assert_uint_eq(log->nstreams, 3);
  ck_assert_uint_eq(log->allocations, orig.total_count);
  ck_assert_uint_eq(log->frees, orig.deallocations);
  ck_assert_uint_eq(log->live_at_end, (uint64_t)orig.current_bytes);
  ck_assert_uint_eq(log->outstanding_at_end, (uint64_t)orig.current_count);
  if (nthreads == 1) ck_assert_uint_eq(log->peak_live, (uint64_t)orig.peak_bytes);
  else ck_assert_uint_le(log->peak_live, (uint64_t)orig.peak_bytes + (2u << 20) * (unsigned)nthreads);

  /* Replay on statistics > host: the replay's statistics are the log's. */
  rmmc_resource_t *host, *st;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(host, &st), RMMC_SUCCESS);
  replay_options_t opts = REPLAY_OPTIONS_INIT;
  replay_result_t res;
  ck_assert_int_eq(replay_run_resource(log, st, &opts, &res), RMMC_SUCCESS);
  ck_assert_uint_eq(res.events, log->allocations + log->frees);
  ck_assert_uint_eq(res.failures, 0);
  ck_assert_uint_eq(res.free_errors, 0);
  rmmc_statistics_t rep = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(st, &rep), RMMC_SUCCESS);
  ck_assert_uint_eq(rep.total_count, orig.total_count);
  ck_assert_uint_eq(rep.total_bytes, orig.total_bytes);
  ck_assert_uint_eq((uint64_t)rep.peak_bytes, log->peak_live);
  if (nthreads == 1) {
    ck_assert_int_eq(rep.peak_bytes, orig.peak_bytes);
    ck_assert_int_eq(rep.peak_count, orig.peak_count);
  }
  replay_result_fini(&res);

  /* And through the tool's own path (spec, meter): peak reserved of a
   * plain upstream is the peak live. */
  ck_assert_int_eq(replay_run(log, "host", &opts, &res), RMMC_SUCCESS);
  ck_assert(res.has_reserved);
  ck_assert_uint_eq(res.peak_reserved, log->peak_live);
  replay_result_fini(&res);

  rmmc_resource_release(st);
  rmmc_resource_release(host);
  replay_log_free(log);
  unlink(path);
}

START_TEST(test_roundtrip_one_thread) { roundtrip(1); }
END_TEST

START_TEST(test_roundtrip_threads) { roundtrip(4); }
END_TEST

int main(void) {
  Suite *s = suite_create("replay_roundtrip");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_roundtrip_one_thread);
  tcase_add_test(tc, test_roundtrip_threads);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
