/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The replay engine (tools/replay_engine.h): reading logs (formats, every
 * kind of bad line with its line number, lenient counts, gzip through zlib
 * and through the gzip command), replaying them (exact live and reserved
 * figures, failures, threads in log order, streams), the hook around the
 * base layer, and the JSON and SVG reports. Host suite: host and sim
 * stacks only.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay_engine.h"
#include "base/spec.h" /* rmmc__stack_create_hooked */
#include "spy.h"
#include "test_main.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

/* A small log with every kind of good line; peak live 4000 after line 3. */
static const char *const small_log =
    HEADER
    "0,100,allocate,0x1000,1000,0x0\n"
    "0,101,allocate,0x2000,3000,0x0\n"
    "0,102,free,0x1000,1000,0x0\n"
    "0,103,allocate,0x3000,500,0x0\n"
    "0,104,allocate failure,0x0,99999,0x0\n"
    "0,105,free,0x2000,3000,0x0\n"
    "0,106,allocate,0x1000,200,0x0\n";

static replay_log_t *parse_ok(const char *text, bool lenient) {
  replay_read_options_t o = REPLAY_READ_OPTIONS_INIT;
  o.lenient = lenient;
  replay_log_t *log = NULL;
  rmmc_status_t st = replay_log_parse(text, strlen(text), "t.csv", &o, &log);
  ck_assert_msg(st == RMMC_SUCCESS, "parse failed: %s", rmmc_last_error_message());
  return log;
}

START_TEST(test_replay_reads_a_small_log_exactly) {
  replay_log_t *log = parse_ok(small_log, false);
  ck_assert_uint_eq(log->nevents, 6);
  ck_assert_uint_eq(log->allocations, 4);
  ck_assert_uint_eq(log->frees, 2);
  ck_assert_uint_eq(log->nslots, 4);
  ck_assert_uint_eq(log->logged_failures, 1);
  ck_assert_uint_eq(log->peak_live, 4000);
  ck_assert_uint_eq(log->peak_event, 1);
  ck_assert_uint_eq(log->live_at_end, 700);
  ck_assert_uint_eq(log->outstanding_at_end, 2);
  ck_assert_uint_eq(log->nthreads, 1);
  ck_assert_uint_eq(log->nstreams, 1);
  ck_assert_uint_eq(log->lines, 8);
  ck_assert(log->has_time);
  ck_assert_int_eq(log->first_time_us, 100);
  ck_assert_int_eq(log->last_time_us, 106);
  /* The free of 0x1000 pairs with its allocation; the later 0x1000 is new. */
  ck_assert_uint_eq(log->events[2].action, REPLAY_FREE);
  ck_assert_uint_eq(log->events[2].slot, log->events[0].slot);
  ck_assert_uint_eq(log->events[2].size, 1000);
  ck_assert_uint_ne(log->events[5].slot, log->events[0].slot);
  uint64_t live[6];
  replay_log_live_series(log, 6, live);
  uint64_t want[6] = {1000, 4000, 3000, 3500, 500, 700};
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(live[i], want[i]);
  uint64_t two[2];
  replay_log_live_series(log, 2, two);
  ck_assert_uint_eq(two[0], 4000);
  ck_assert_uint_eq(two[1], 3500);
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_host_and_sim_give_exact_figures) {
  replay_log_t *log = parse_ok(small_log, false);
  replay_options_t o = REPLAY_OPTIONS_INIT;
  o.buckets = 100; /* capped at the 6 events: one point per event */
  const char *specs[] = {"host", "sim", "sim(capacity=4KiB)"};
  for (int s = 0; s < 3; s++) {
    replay_result_t r;
    ck_assert_int_eq(replay_run(log, specs[s], &o, &r), RMMC_SUCCESS);
    ck_assert_str_eq(r.error, "");
    ck_assert_str_eq(r.stack, specs[s]);
    ck_assert_str_eq(r.base, s == 0 ? "host" : "sim");
    ck_assert(r.simulated == (s > 0));
    ck_assert_int_eq(r.kind, RMMC_MEMORY_HOST);
    ck_assert(!r.real_streams);
    ck_assert_uint_eq(r.events, 6);
    ck_assert_uint_eq(r.calls, 6);
    ck_assert_uint_eq(r.failures, 0);
    ck_assert_uint_eq(r.free_errors, 0);
    ck_assert_uint_eq(r.threads, 1);
    ck_assert(r.has_reserved);
    /* A plain upstream takes exactly what is asked: reserved == live. */
    ck_assert_uint_eq(r.peak_reserved, 4000);
    ck_assert_uint_eq(r.end_reserved, 700);
    ck_assert_uint_eq(r.nbuckets, 6);
    uint64_t want[6] = {1000, 4000, 3000, 3500, 500, 700};
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(r.reserved_series[i], want[i]);
    /* sim reports its own peak in its granularity: 1024 + 3072. */
    ck_assert(r.has_base_peak == (s > 0));
    if (s > 0) ck_assert_uint_eq(r.base_peak, 4096);
    ck_assert(r.ns_per_call >= 0.0);
    replay_result_fini(&r);
  }
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_counts_failures_and_skips_their_frees) {
  replay_log_t *log = parse_ok(small_log, false);
  replay_result_t r;
  /* 3 KiB: the 3000-byte allocation (3072 rounded) does not fit next to 1024. */
  ck_assert_int_eq(replay_run(log, "sim(capacity=3KiB)", NULL, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(r.failures, 1);
  ck_assert_uint_eq(r.skipped_frees, 1);
  ck_assert_uint_eq(r.calls, 5);
  ck_assert_uint_eq(r.peak_reserved, 1000); /* 1000, then 0, 500, 500 + 200 */
  ck_assert_uint_eq(r.base_peak, 1024);
  ck_assert_msg(strstr(r.first_failure, "event 1:") != NULL, "%s", r.first_failure);
  ck_assert_msg(strstr(r.first_failure, "simulated capacity") != NULL, "%s", r.first_failure);
  ck_assert_ptr_null(r.reserved_series); /* no buckets asked */
  replay_result_fini(&r);
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_rejects_bad_stacks) {
  replay_log_t *log = parse_ok(small_log, false);
  replay_result_t r;
  ck_assert_int_eq(replay_run(log, "hots", NULL, &r), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(r.error, "unknown resource 'hots'") != NULL, "%s", r.error);
  replay_result_fini(&r);
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(replay_run(log, "cuda", NULL, &r), RMMC_ERROR_NO_DEVICE);
    ck_assert_msg(strstr(r.error, "no CUDA device") != NULL, "%s", r.error);
    replay_result_fini(&r);
  }
  ck_assert_int_eq(replay_run(NULL, "host", NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(replay_run(log, "host", NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  replay_log_free(log);
}
END_TEST

/* ---- bad logs ---- */

/* Parses HEADER + body strictly: expects RMMC_ERROR_PARSE whose message
 * names line `line` and contains `needle`. */
static void expect_bad(const char *body, int line, const char *needle) {
  char text[1024], where[32];
  snprintf(text, sizeof text, "%s%s", HEADER, body);
  replay_log_t *log = (replay_log_t *)1;
  rmmc_status_t st = replay_log_parse(text, strlen(text), "bad.csv", NULL, &log);
  ck_assert_msg(st == RMMC_ERROR_PARSE, "'%s' parsed (status %d)", body, st);
  ck_assert_ptr_null(log);
  const char *m = rmmc_last_error_message();
  snprintf(where, sizeof where, "bad.csv:%d: ", line);
  ck_assert_msg(strstr(m, where) != NULL, "'%s': message '%s' lacks '%s'", body, m, where);
  ck_assert_msg(strstr(m, needle) != NULL, "'%s': message '%s' lacks '%s'", body, m, needle);
}

START_TEST(test_replay_bad_lines_name_their_line) {
  const char *ok = "0,1,allocate,0x1000,64,0x0\n";
  char body[512];
  snprintf(body, sizeof body, "%s0,2,alloc,0x2000,64,0x0\n", ok);
  expect_bad(body, 3, "malformed line: unknown action 'alloc'");
  expect_bad("0,1,allocate,0xZZ,64,0x0\n", 2, "malformed line: pointer '0xZZ' is not hex");
  expect_bad("0,1,allocate,0x1000,64,stream\n", 2, "stream 'stream' is not hex");
  expect_bad("x,1,allocate,0x1000,64,0x0\n", 2, "thread 'x' is not a number");
  expect_bad("0,12:xx,allocate,0x1000,64,0x0\n", 2, "time '12:xx'");
  expect_bad("0,1,allocate,0x0,64,0x0\n", 2, "null pointer");
  expect_bad("0,1,allocate,0x1000,64,0x0,extra\n", 2, "more fields, the header has 6");
  snprintf(body, sizeof body, "%s\n0,2,allocate,0x2000\n", ok);
  expect_bad(body, 4, "missing columns: 4 fields, the header has 6");
  expect_bad("0,1,allocate,0x1000,abc,0x0\n", 2, "bad size: size 'abc' is not a byte count");
  expect_bad("0,1,allocate,0x1000,-5,0x0\n", 2, "bad size");
  expect_bad("0,1,allocate,0x1000,99999999999999999999999,0x0\n", 2, "bad size");
  expect_bad("0,1,allocate,0x1000,,0x0\n", 2, "bad size");
  expect_bad("0,1,free,0x1000,64,0x0\n", 2, "free of an unknown pointer: 0x1000 was not allocated");
  snprintf(body, sizeof body, "%s0,2,free,0x1000,64,0x0\n0,3,free,0x1000,64,0x0\n", ok);
  expect_bad(body, 4, "unknown pointer");
  snprintf(body, sizeof body, "%s0,2,allocate,0x1000,128,0x0\n", ok);
  expect_bad(body, 3, "already live: 0x1000 is still live (allocated with 64 bytes");
  snprintf(body, sizeof body, "%s0,2,free,0x1000,65,0x0\n", ok);
  expect_bad(body, 3, "0x1000 was allocated with 64 bytes, freed with 65");
  /* Issue 11, F6: what the replay cannot represent, one allocation or the
   * live total. */
  expect_bad("0,1,allocate,0x1000,9223372036854775809,0x0\n", 2,
             "bad size: 9223372036854775809 bytes is more than the replay can represent (4 EiB");
  expect_bad("0,1,allocate,0x1000,4611686018427387905,0x0\n", 2, "more than the replay");
  snprintf(body, sizeof body, "%s0,2,allocate,0x2000,4611686018427387841,0x0\n", ok);
  expect_bad(body, 3, "4611686018427387841 bytes would take the live bytes past what the replay");

  /* Header problems are fatal, lenient or not. */
  replay_read_options_t lenient = REPLAY_READ_OPTIONS_INIT;
  lenient.lenient = true;
  replay_log_t *log;
  const char *no_size = "Thread,Time,Action,Pointer,Stream\n0,1,allocate,0x1000,0x0\n";
  ck_assert_int_eq(replay_log_parse(no_size, strlen(no_size), "h.csv", &lenient, &log), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "h.csv:1: missing columns: the header has no 'Size' column") != NULL,
                "%s", rmmc_last_error_message());
  const char *twice = "Action,Pointer,Size,size\n";
  ck_assert_int_eq(replay_log_parse(twice, strlen(twice), "h.csv", &lenient, &log), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "names column 'Size' twice"));
  ck_assert_int_eq(replay_log_parse("", 0, "e.csv", &lenient, &log), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "e.csv: empty log"));
  ck_assert_int_eq(replay_log_parse("\n  \n", 4, "e.csv", NULL, &log), RMMC_ERROR_PARSE);
}
END_TEST

START_TEST(test_replay_live_bytes_stay_representable) {
  /* Up to 2^62 live is read exactly (64 B + 2^62 - 64 B); the line that
   * would go past is skipped when lenient, with its free. */
  const char *text = HEADER
      "0,1,allocate,0x1000,64,0x0\n"
      "0,2,allocate,0x2000,4611686018427387840,0x0\n"
      "0,3,allocate,0x3000,1,0x0\n"
      "0,4,free,0x3000,1,0x0\n"
      "0,5,free,0x2000,4611686018427387840,0x0\n"
      "0,6,allocate,0x3000,1,0x0\n";
  replay_log_t *log = parse_ok(text, true);
  ck_assert_uint_eq(log->peak_live, (uint64_t)1 << 62);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_BAD_SIZE], 1);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_UNKNOWN_POINTER], 1);
  ck_assert_uint_eq(log->nevents, 4);
  ck_assert_uint_eq(log->live_at_end, 65);
  uint64_t series[4];
  replay_log_live_series(log, 4, series);
  ck_assert_uint_eq(series[1], (uint64_t)1 << 62);
  ck_assert_uint_eq(series[3], 65);
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_lenient_counts_each_kind) {
  const char *text =
      HEADER
      "0,1,allocate,0x1000,64,0x0\n"      /* 2 ok */
      "0,2,alloc,0x2000,64,0x0\n"         /* 3 malformed */
      "0,3,allocate,0x3000\n"             /* 4 missing columns */
      "0,4,allocate,0x4000,lots,0x0\n"    /* 5 bad size */
      "0,5,free,0x5000,64,0x0\n"          /* 6 unknown pointer */
      "0,6,allocate,0x1000,32,0x0\n"      /* 7 duplicate pointer */
      "0,7,allocate,0x6000,100,0x0\n"     /* 8 ok */
      "0,8,free,0x6000,99,0x0\n"          /* 9 size mismatch: kept, with 100 */
      "0,9,free,0x1000,64,0x0\n"          /* 10 ok */
      "0,10,free,0x1000,64,0x0\n"         /* 11 unknown pointer (freed) */
      "0,11,allocate,0xZ,64,0x0\n";       /* 12 malformed */
  replay_read_options_t o = REPLAY_READ_OPTIONS_INIT;
  o.lenient = true;
  char *warnings = NULL;
  size_t wlen = 0;
  o.warnings = open_memstream(&warnings, &wlen);
  o.max_warnings = 3;
  replay_log_t *log;
  ck_assert_int_eq(replay_log_parse(text, strlen(text), "l.csv", &o, &log), RMMC_SUCCESS);
  fclose(o.warnings);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_MALFORMED], 2);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_MISSING_COLUMNS], 1);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_BAD_SIZE], 1);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_UNKNOWN_POINTER], 2);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_DUPLICATE_POINTER], 1);
  ck_assert_uint_eq(log->skipped[REPLAY_ISSUE_SIZE_MISMATCH], 1);
  ck_assert_uint_eq(log->nevents, 4);
  ck_assert_uint_eq(log->events[2].size, 100); /* the mismatched free uses its allocation's size */
  ck_assert_uint_eq(log->peak_live, 164);
  ck_assert_uint_eq(log->live_at_end, 0);
  ck_assert_msg(strstr(warnings, "l.csv:3: skipped (malformed line): unknown action 'alloc'") != NULL, "%s", warnings);
  ck_assert_msg(strstr(warnings, "l.csv:4: skipped (missing columns)") != NULL, "%s", warnings);
  ck_assert_msg(strstr(warnings, "l.csv:5: skipped (bad size)") != NULL, "%s", warnings);
  ck_assert_msg(strstr(warnings, "l.csv:6:") == NULL, "%s", warnings);
  ck_assert_msg(strstr(warnings, "5 more skipped lines not shown") != NULL, "%s", warnings);
  free(warnings);
  /* The issue table names each kind. */
  ck_assert_str_eq(replay_issue_key(REPLAY_ISSUE_DUPLICATE_POINTER), "duplicate_pointer");
  ck_assert_str_eq(replay_issue_text(REPLAY_ISSUE_MISSING_COLUMNS), "missing columns");
  ck_assert_str_eq(replay_issue_key(REPLAY_ISSUE_COUNT), "unknown");
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_reads_rmm_formats) {
  /* As RMM's logging adaptor writes: OS thread ids, HH:MM:SS.ffffff, %p
   * pointers, "(nil)" on failure, streams without 0x; columns in another
   * order, CRLF line ends and spaces are tolerated. */
  const char *text =
      "Thread,Time,Action,Pointer,Size,Stream\r\n"
      "140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0\r\n"
      "140573312345999,23:59:59.999500,allocate,7f8a40000400,2048,7f8a38001020\r\n"
      "140573312345856,23:59:59:999900,allocate failure,(nil),1048576,0\r\n"
      "140573312345856, 1634567890.5 ,deallocate,0x7f8a40000000,1024,0x0\r\n"
      "140573312345999,00:00:01.25,free,0X7F8A40000400,2048,0x7f8a38001020";
  replay_log_t *log = parse_ok(text, false);
  ck_assert_uint_eq(log->nevents, 4);
  ck_assert_uint_eq(log->logged_failures, 1);
  ck_assert_uint_eq(log->nthreads, 2);
  ck_assert_uint_eq(log->thread_ids[0], 140573312345856u);
  ck_assert_uint_eq(log->thread_ids[1], 140573312345999u);
  ck_assert_uint_eq(log->nstreams, 2);
  ck_assert_uint_eq(log->stream_ids[1], 0x7f8a38001020u);
  ck_assert_uint_eq(log->peak_live, 3072);
  ck_assert_uint_eq(log->live_at_end, 0);
  ck_assert_int_eq(log->first_time_us, (int64_t)86399 * 1000000 + 999000);
  ck_assert_int_eq(log->last_time_us, 1250000);
  replay_log_free(log);

  const char *reordered = "Size,Pointer,Action\n64,0x40,allocate\n64,0x40,free\n";
  log = parse_ok(reordered, false);
  ck_assert_uint_eq(log->nevents, 2);
  ck_assert(!log->has_time);
  ck_assert_uint_eq(log->thread_ids[0], 0);
  replay_log_free(log);

  /* Zero-byte allocations (null or not) and frees of NULL are no-ops. */
  const char *zeros = HEADER "0,1,allocate,(nil),0,0x0\n0,2,free,0x0,0,0x0\n"
                             "0,3,allocate,0x100,0,0x0\n0,4,free,0x100,0,0x0\n";
  log = parse_ok(zeros, false);
  ck_assert_uint_eq(log->null_events, 2);
  ck_assert_uint_eq(log->nevents, 2);
  replay_result_t r;
  ck_assert_int_eq(replay_run(log, "host", NULL, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(r.failures, 0);
  ck_assert_uint_eq(r.skipped_frees, 0);
  ck_assert_uint_eq(r.peak_reserved, 0);
  replay_result_fini(&r);
  replay_log_free(log);

  const char *bad_times[] = {"24:00:00.0", "1:2", "1:60:00.0", "1.2.3", "12:00:00.1234567890", "1:02:03x"};
  for (size_t i = 0; i < sizeof bad_times / sizeof bad_times[0]; i++) {
    char body[128];
    snprintf(body, sizeof body, "0,%s,allocate,0x1000,64,0x0\n", bad_times[i]);
    expect_bad(body, 2, "is neither microseconds nor HH:MM:SS.ffffff");
  }
}
END_TEST

/* ---- threads ---- */

/* A resource that forwards to an upstream and records, for each allocate,
 * the calling thread and the size, in call order. */
typedef struct recorder {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
  pthread_mutex_t lock;
  pthread_t who[64];
  size_t bytes[64];
  cudaStream_t stream[64];
  int n;
} recorder_t;

static rmmc_status_t rec_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                  cudaStream_t stream, void **out) {
  recorder_t *x = (recorder_t *)r;
  pthread_mutex_lock(&x->lock);
  if (x->n < 64) {
    x->who[x->n] = pthread_self();
    x->stream[x->n] = stream;
    x->bytes[x->n++] = bytes;
  }
  pthread_mutex_unlock(&x->lock);
  return rmmc_resource_allocate(x->upstream, bytes, alignment, stream, out);
}

static rmmc_status_t rec_deallocate(rmmc_resource_t *r, void *p, size_t bytes, size_t alignment,
                                    cudaStream_t stream) {
  return rmmc_resource_deallocate(((recorder_t *)r)->upstream, p, bytes, alignment, stream);
}

static rmmc_resource_t *rec_upstream(const rmmc_resource_t *r) {
  return ((const recorder_t *)r)->upstream;
}

static void rec_destroy(rmmc_resource_t *r) {
  recorder_t *x = (recorder_t *)r;
  rmmc_resource_release(x->upstream);
  pthread_mutex_destroy(&x->lock);
  free(x);
}

static const rmmc_resource_ops_t rec_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "recorder",
    .allocate = rec_allocate,
    .deallocate = rec_deallocate,
    .destroy = rec_destroy,
    .upstream = rec_upstream,
};

static recorder_t *recorder_new(rmmc_resource_t *upstream) {
  recorder_t *x = calloc(1, sizeof *x);
  ck_assert_ptr_nonnull(x);
  rmmc_resource_init(&x->base, &rec_ops, RMMC_MEMORY_HOST, -1);
  x->upstream = upstream;
  pthread_mutex_init(&x->lock, NULL);
  return x;
}

/* Three threads; sizes give the log order (1, 2, 3, ...); 0x1000 and 0x3000
 * are freed by another thread than allocated them. */
static const char *const threaded_log =
    HEADER
    "7,1,allocate,0x1000,1,0xa\n"
    "7,2,allocate,0x2000,2,0xa\n"
    "8,3,allocate,0x3000,3,0xb\n"
    "9,4,free,0x1000,1,0xc\n"
    "9,5,allocate,0x4000,4,0xc\n"
    "7,6,free,0x3000,3,0xa\n"
    "8,7,allocate,0x5000,5,0xb\n"
    "8,8,allocate,0x6000,6,0xb\n"
    "7,9,allocate,0x7000,7,0xa\n"
    "9,10,free,0x4000,4,0xc\n"
    "8,11,allocate,0x8000,8,0xb\n";

START_TEST(test_replay_threads_follow_the_log_order) {
  replay_log_t *log = parse_ok(threaded_log, false);
  ck_assert_uint_eq(log->nthreads, 3);
  ck_assert_uint_eq(log->nstreams, 3);
  for (int round = 0; round < 20; round++) {
    rmmc_resource_t *sim;
    ck_assert_int_eq(rmmc_sim_resource_create(NULL, &sim), RMMC_SUCCESS);
    recorder_t *rec = recorder_new(sim);
    replay_result_t r;
    ck_assert_int_eq(replay_run_resource(log, &rec->base, NULL, &r), RMMC_SUCCESS);
    ck_assert_uint_eq(r.threads, 3);
    ck_assert_uint_eq(r.failures, 0);
    ck_assert_uint_eq(r.free_errors, 0);
    ck_assert(!r.has_reserved);
    ck_assert_str_eq(r.base, "sim");
    ck_assert(r.simulated);
    ck_assert_int_eq(rec->n, 8);
    /* In log order, each logged thread on one OS thread of its own, its
     * logged stream passed through as a key (host memory). */
    static const int logged[8] = {7, 7, 8, 9, 8, 8, 7, 8};
    static const uintptr_t streams[8] = {0xa, 0xa, 0xb, 0xc, 0xb, 0xb, 0xa, 0xb};
    pthread_t of[10];
    bool seen[10] = {false};
    for (int i = 0; i < 8; i++) {
      ck_assert_uint_eq(rec->bytes[i], (size_t)i + 1);
      ck_assert_ptr_eq(rec->stream[i], (cudaStream_t)streams[i]);
      int t = logged[i];
      if (!seen[t]) {
        of[t] = rec->who[i];
        seen[t] = true;
        ck_assert(!pthread_equal(of[t], pthread_self()));
      }
      ck_assert(pthread_equal(rec->who[i], of[t]));
    }
    ck_assert(!pthread_equal(of[7], of[8]) && !pthread_equal(of[8], of[9]) &&
              !pthread_equal(of[7], of[9]));
    replay_result_fini(&r);
    /* The leftovers went back: the sim holds nothing. */
    uint64_t in_use = 1;
    ck_assert(rmmc_resource_get_field(sim, "in_use", &in_use));
    ck_assert_uint_eq(in_use, 0);
    rmmc_resource_release(&rec->base);
  }
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_threaded_figures_equal_single_threaded) {
  replay_log_t *log = parse_ok(threaded_log, false);
  replay_options_t one = REPLAY_OPTIONS_INIT, many = REPLAY_OPTIONS_INIT;
  one.threads = false;
  one.buckets = many.buckets = 11;
  replay_result_t a, b;
  ck_assert_int_eq(replay_run(log, "sim", &one, &a), RMMC_SUCCESS);
  ck_assert_int_eq(replay_run(log, "sim", &many, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(a.threads, 1);
  ck_assert_uint_eq(b.threads, 3);
  ck_assert_uint_eq(a.peak_reserved, log->peak_live);
  ck_assert_uint_eq(b.peak_reserved, log->peak_live);
  ck_assert_uint_eq(a.end_reserved, b.end_reserved);
  ck_assert_uint_eq(a.calls, b.calls);
  uint64_t live[11];
  replay_log_live_series(log, 11, live);
  for (int i = 0; i < 11; i++) {
    ck_assert_uint_eq(a.reserved_series[i], live[i]);
    ck_assert_uint_eq(b.reserved_series[i], live[i]);
  }
  replay_result_fini(&a);
  replay_result_fini(&b);
  replay_log_free(log);
}
END_TEST

/* A longer random multi-threaded log: same figures on 1 or 4 threads. */
START_TEST(test_replay_threaded_random_log) {
  size_t cap = 1 << 20, len = 0;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  len += (size_t)snprintf(text, cap, HEADER);
  uint64_t live_ptr[64] = {0};
  unsigned seed = 99;
  uint64_t next = 0x10000;
  for (int i = 0; i < 5000; i++) {
    seed = seed * 1103515245u + 12345u;
    int slot = (int)((seed >> 16) % 64), thread = (int)((seed >> 8) % 4);
    if (live_ptr[slot] == 0) {
      live_ptr[slot] = next;
      next += 0x1000;
      len += (size_t)snprintf(text + len, cap - len, "%d,%d,allocate,0x%llx,%d,0x0\n", thread, i,
                              (unsigned long long)live_ptr[slot], 256 * (slot + 1));
    } else {
      len += (size_t)snprintf(text + len, cap - len, "%d,%d,free,0x%llx,%d,0x0\n", thread, i,
                              (unsigned long long)live_ptr[slot], 256 * (slot + 1));
      live_ptr[slot] = 0;
    }
  }
  replay_log_t *log = parse_ok(text, false);
  free(text);
  ck_assert_uint_eq(log->nthreads, 4);
  replay_options_t one = REPLAY_OPTIONS_INIT, many = REPLAY_OPTIONS_INIT;
  one.threads = false;
  one.buckets = many.buckets = 500;
  replay_result_t a, b;
  ck_assert_int_eq(replay_run(log, "sim(alignment=4KiB)", &one, &a), RMMC_SUCCESS);
  ck_assert_int_eq(replay_run(log, "sim(alignment=4KiB)", &many, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(b.threads, 4);
  ck_assert_uint_eq(a.peak_reserved, log->peak_live);
  ck_assert_uint_eq(b.peak_reserved, log->peak_live);
  ck_assert_uint_eq(a.base_peak, b.base_peak);
  ck_assert_uint_eq(b.calls, log->nevents);
  ck_assert_uint_eq(b.free_errors, 0);
  ck_assert_int_eq(memcmp(a.reserved_series, b.reserved_series, 500 * sizeof(uint64_t)), 0);
  replay_result_fini(&a);
  replay_result_fini(&b);
  replay_log_free(log);
}
END_TEST

/* ---- files and gzip ---- */

static void write_file(const char *path, const char *text, bool gz) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "gzip -c > '%s'", path);
  FILE *f = gz ? popen(cmd, "w") : fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  ck_assert_int_eq(gz ? pclose(f) : fclose(f), 0);
}

START_TEST(test_replay_reads_plain_and_gzip_files) {
  char dir[] = "/tmp/rmmc_replay_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char plain[128], gz[128], cut[128], quote[128];
  snprintf(plain, sizeof plain, "%s/log.csv", dir);
  snprintf(gz, sizeof gz, "%s/log.csv.gz", dir);
  snprintf(cut, sizeof cut, "%s/cut.csv.gz", dir);
  snprintf(quote, sizeof quote, "%s/it's.csv.gz", dir);
  write_file(plain, small_log, false);
  write_file(gz, small_log, true);
  /* A copy under a name the shell must quote, and one cut short. */
  FILE *in = fopen(gz, "rb"), *out = fopen(cut, "wb"), *q = fopen(quote, "wb");
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf, in);
  ck_assert_uint_gt(n, 20);
  ck_assert_uint_eq(fwrite(buf, 1, n - 12, out), n - 12);
  ck_assert_uint_eq(fwrite(buf, 1, n, q), n);
  fclose(in);
  fclose(out);
  fclose(q);
  replay_input_t inputs[] = {REPLAY_INPUT_AUTO, REPLAY_INPUT_COMMAND};
  for (int i = 0; i < 2; i++) {
    replay_read_options_t o = REPLAY_READ_OPTIONS_INIT;
    o.input = inputs[i];
    const char *paths[] = {plain, gz, quote};
    for (int k = 0; k < 3; k++) {
      replay_log_t *log;
      ck_assert_msg(replay_log_read(paths[k], &o, &log) == RMMC_SUCCESS, "%s: %s", paths[k],
                    rmmc_last_error_message());
      ck_assert_str_eq(log->name, paths[k]);
      ck_assert_uint_eq(log->nevents, 6);
      ck_assert_uint_eq(log->peak_live, 4000);
      ck_assert_uint_eq(log->logged_failures, 1);
      replay_log_free(log);
    }
    replay_log_t *log = (replay_log_t *)1;
    ck_assert_int_eq(replay_log_read(cut, &o, &log), RMMC_ERROR_IO);
    ck_assert_ptr_null(log);
    ck_assert_msg(strstr(rmmc_last_error_message(), "cut.csv.gz") != NULL, "%s",
                  rmmc_last_error_message());
  }
  replay_log_t *log;
  ck_assert_int_eq(replay_log_read("/nonexistent/x.csv", NULL, &log), RMMC_ERROR_IO);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "/nonexistent/x.csv: cannot open"));
  ck_assert_int_eq(replay_log_read(NULL, NULL, &log), RMMC_ERROR_INVALID_ARGUMENT);
  unlink(plain);
  unlink(gz);
  unlink(cut);
  unlink(quote);
  rmdir(dir);
}
END_TEST

/* ---- the hook around the base layer ---- */

typedef struct hook_probe {
  rmmc_resource_t *base; /* retained by the probe */
  int calls;
  rmmc_status_t fail;
} hook_probe_t;

static rmmc_status_t probe_hook(void *ctx, rmmc_resource_t *base, rmmc_resource_t **out) {
  hook_probe_t *h = ctx;
  h->calls++;
  h->base = rmmc_resource_retain(base);
  if (h->fail != RMMC_SUCCESS) return rmmc_set_error(h->fail, "probe refuses");
  /* Wrap the base in a recorder, which takes the probe's extra reference. */
  recorder_t *rec = recorder_new(rmmc_resource_retain(base));
  *out = &rec->base;
  return RMMC_SUCCESS;
}

START_TEST(test_replay_hook_wraps_the_base_layer) {
  hook_probe_t h = {NULL, 0, RMMC_SUCCESS};
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc__stack_create_hooked("sim(capacity=1MiB)", -1, probe_hook, &h, &r), RMMC_SUCCESS);
  ck_assert_int_eq(h.calls, 1);
  ck_assert_str_eq(rmmc_resource_name(h.base), "sim");
  /* The hook's resource is the stack when the base is the only layer. */
  ck_assert_str_eq(rmmc_resource_name(r), "recorder");
  ck_assert_ptr_eq(rmmc_resource_upstream(r), h.base);
  ck_assert_int_eq(rmmc_resource_refcount(h.base), 2); /* the recorder's and the probe's */
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(((recorder_t *)r)->n, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_resource_refcount(h.base), 1);
  rmmc_resource_release(h.base);

  /* A failing hook fails the build, keeps nothing and says where. */
  h = (hook_probe_t){NULL, 0, RMMC_ERROR_OUT_OF_MEMORY};
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc__stack_create_hooked("sim", -1, probe_hook, &h, &r), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "probe refuses (wrapping the base layer 'sim' of \"sim\")") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_refcount(h.base), 1); /* only the probe's own reference is left */
  rmmc_resource_release(h.base);

  /* A parse error calls no hook. */
  h = (hook_probe_t){NULL, 0, RMMC_SUCCESS};
  ck_assert_int_eq(rmmc__stack_create_hooked("sim >", -1, probe_hook, &h, &r), RMMC_ERROR_PARSE);
  ck_assert_int_eq(h.calls, 0);
  /* Without a hook it is rmmc_stack_create. */
  ck_assert_int_eq(rmmc__stack_create_hooked("host", -1, NULL, NULL, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "host");
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_replay_meter_sits_between_base_and_stack) {
  /* replay_run_resource on a spy: failures injected by the spy count as
   * failures, and the streams of the log reach the resource as keys. */
  const char *text = HEADER "0,1,allocate,0x1000,1000,0x77\n0,2,allocate,0x2000,2000,0x77\n"
                            "0,3,free,0x2000,2000,0x77\n0,4,free,0x1000,1000,0x77\n";
  replay_log_t *log = parse_ok(text, false);
  rmmc_resource_t *spy;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  spy_fail_nth(spy_of(spy), 2);
  replay_result_t r;
  ck_assert_int_eq(replay_run_resource(log, spy, NULL, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(r.failures, 1);
  ck_assert_uint_eq(r.skipped_frees, 1);
  ck_assert_uint_eq(r.calls, 3);
  ck_assert_str_eq(r.stack, "spy");
  ck_assert_msg(strstr(r.first_failure, "event 1: out of memory") != NULL, "%s", r.first_failure);
  spy_counts_t c = spy_counts(spy_of(spy));
  ck_assert_uint_eq(c.allocate_calls, 2);
  ck_assert_uint_eq(c.deallocate_calls, 1);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_ptr_eq(c.last_stream, (cudaStream_t)0x77);
  replay_result_fini(&r);
  rmmc_resource_release(spy);
  replay_log_free(log);
}
END_TEST

/* ---- reports ---- */

static char *capture(rmmc_status_t (*write)(FILE *, const replay_log_t *, const replay_result_t *, size_t),
                     const replay_log_t *log, const replay_result_t *res, size_t n) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(write(f, log, res, n), RMMC_SUCCESS);
  fclose(f);
  return buf;
}

static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p != NULL; p = strstr(p + 1, needle)) n++;
  return n;
}

START_TEST(test_replay_svg_axis_takes_any_value) {
  /* A stack may report any figure: the axis code must not loop or wrap
   * (a step doubling past 2^63 became 0 and never reached the top). */
  replay_log_t *log = parse_ok(small_log, false);
  static const uint64_t tops[] = {UINT64_MAX, (uint64_t)1 << 63, ((uint64_t)1 << 63) + 1,
                                  ((uint64_t)7 << 61) + 1, 5000};
  static const char *const labels[] = {">16 EiB</text>", ">8 EiB</text>", ">10 EiB</text>",
                                       ">16 EiB</text>", ">5 KiB</text>"};
  for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++) {
    uint64_t series[2] = {tops[i], 0};
    replay_result_t r;
    memset(&r, 0, sizeof r);
    r.stack = (char *)"huge";
    r.reserved_series = series;
    r.nbuckets = 2;
    r.has_reserved = true;
    r.peak_reserved = tops[i];
    char *svg = capture(replay_write_svg, log, &r, 1);
    ck_assert_msg(strstr(svg, labels[i]) != NULL, "top %llu: no '%s' in the axis",
                  (unsigned long long)tops[i], labels[i]);
    ck_assert_ptr_nonnull(strstr(svg, "</svg>\n"));
    ck_assert_ptr_null(strstr(svg, "nan"));
    ck_assert_ptr_null(strstr(svg, "inf"));
    free(svg);
  }
  replay_log_free(log);
}
END_TEST

/* The epoch callback: once before the timed pass of a cold replay, before
 * each pass of a warm one, untimed pass first. */
typedef struct epoch_seen {
  int calls, passes[4];
} epoch_seen_t;

static void on_epoch(void *ctx, int pass) {
  epoch_seen_t *e = ctx;
  if (e->calls < 4) e->passes[e->calls] = pass;
  e->calls++;
}

START_TEST(test_replay_epoch_callback) {
  replay_log_t *log = parse_ok(small_log, false);
  for (int warm = 0; warm <= 1; warm++) {
    epoch_seen_t seen = {0, {-1, -1, -1, -1}};
    replay_options_t o = REPLAY_OPTIONS_INIT;
    o.warm = warm;
    o.epoch = on_epoch;
    o.epoch_ctx = &seen;
    replay_result_t res;
    ck_assert_int_eq(replay_run(log, "host", &o, &res), RMMC_SUCCESS);
    ck_assert_int_eq(seen.calls, warm ? 2 : 1);
    ck_assert_int_eq(seen.passes[0], warm ? 0 : 1);
    if (warm) ck_assert_int_eq(seen.passes[1], 1);
    replay_result_fini(&res);
  }
  replay_log_free(log);
}
END_TEST

START_TEST(test_replay_json_and_svg_reports) {
  replay_log_t *log = parse_ok(small_log, false);
  replay_options_t o = REPLAY_OPTIONS_INIT;
  o.buckets = 1000;
  replay_result_t res[3];
  ck_assert_int_eq(replay_run(log, "host", &o, &res[0]), RMMC_SUCCESS);
  ck_assert_int_eq(replay_run(log, "sim(capacity=3KiB)", &o, &res[1]), RMMC_SUCCESS);
  ck_assert_int_eq(replay_run(log, "nope <&>", &o, &res[2]), RMMC_ERROR_PARSE);

  char *json = capture(replay_write_json, log, res, 3);
  ck_assert_msg(strstr(json, "{\"schema_version\": 1, \"stack\": \"host\", \"log\": \"t.csv\", "
                             "\"upstream\": \"host\", \"upstream_kind\": \"host\", "
                             "\"simulated\": false") != NULL,
                "%s", json);
  ck_assert_int_eq(count(json, "{\"schema_version\": 1, \"stack\": "), 3);
  ck_assert_int_eq(count(json, "\"peak_live_bytes\": 4000,"), 2);
  ck_assert_ptr_nonnull(strstr(json, "\"peak_reserved_bytes\": 4000, \"end_reserved_bytes\": 700, \"ratio\": 1.000000"));
  ck_assert_ptr_nonnull(strstr(json, "\"peak_reserved_bytes\": 1000, \"end_reserved_bytes\": 700, \"ratio\": 0.250000"));
  ck_assert_ptr_nonnull(strstr(json, "\"events\": 6, \"calls\": 5, \"failures\": 1"));
  ck_assert_ptr_nonnull(strstr(json, "\"logged_failures\": 1"));
  ck_assert_ptr_nonnull(strstr(json, "\"upstream_reported_peak_bytes\": 1024"));
  ck_assert_int_eq(count(json, "\"threads\": 1,"), 2);
  ck_assert_int_eq(count(json, "\"ns_per_call\": "), 2);
  ck_assert_int_eq(count(json, "\"skipped\": {\"malformed\": 0, \"missing_columns\": 0, \"bad_size\": 0, "
                               "\"unknown_pointer\": 0, \"duplicate_pointer\": 0, \"size_mismatch\": 0}"), 2);
  ck_assert_ptr_nonnull(strstr(json, "\"stack\": \"nope <&>\", \"log\": \"t.csv\", \"error\": \"stack spec: unknown resource 'nope'"));
  ck_assert_ptr_nonnull(strstr(json, "\\n")); /* the caret line, escaped */
  ck_assert_int_eq(json[0], '[');
  free(json);

  char *svg = capture(replay_write_svg, log, res, 3);
  /* One path per drawn line: each replayed stack, then live on top. */
  ck_assert_int_eq(count(svg, "<path"), 3);
  ck_assert_int_eq(count(svg, "<path class=\"series\""), 3);
  const char *live = strstr(svg, "<path class=\"series\" data-series=\"live\"");
  const char *host = strstr(svg, "<path class=\"series\" data-series=\"reserved\" data-stack=\"host\"");
  const char *sim = strstr(svg, "data-stack=\"sim(capacity=3KiB)\"");
  ck_assert(live != NULL && host != NULL && sim != NULL && host < sim && sim < live);
  ck_assert_ptr_null(strstr(svg, "nope"));
  ck_assert_ptr_nonnull(strstr(svg, ">event index</text>"));
  ck_assert_ptr_nonnull(strstr(svg, ">bytes</text>"));
  ck_assert_ptr_nonnull(strstr(svg, ">4 KiB</text>")); /* the top tick: 4000 rounds up to 4 KiB */
  ck_assert_ptr_nonnull(strstr(svg, "live: what the application held (peak 3.91 KiB)"));
  ck_assert_ptr_nonnull(strstr(svg, "reserved by sim(capacity=3KiB) (peak 1000 B, 0.250x live, with failures, simulated)"));
  ck_assert_ptr_nonnull(strstr(svg, "</svg>\n"));
  free(svg);

  char *table = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&table, &len);
  replay_write_table(f, log, res, 3);
  fclose(f);
  ck_assert_msg(strstr(table, "host") != NULL && strstr(table, "1.000x") != NULL, "%s", table);
  ck_assert_msg(strstr(table, "sim(capacity=3KiB): 1 allocations failed") != NULL, "%s", table);
  ck_assert_msg(strstr(table, "\nnope <&> ") != NULL && strstr(table, " error: stack spec") != NULL,
                "%s", table);
  free(table);
  for (int i = 0; i < 3; i++) replay_result_fini(&res[i]);
  replay_log_free(log);

  char b[32];
  ck_assert_str_eq(replay_format_bytes(512, b, sizeof b), "512 B");
  ck_assert_str_eq(replay_format_bytes(11383464991u, b, sizeof b), "10.60 GiB");
}
END_TEST

int main(void) {
  Suite *s = suite_create("replay");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_replay_reads_a_small_log_exactly);
  tcase_add_test(tc, test_replay_host_and_sim_give_exact_figures);
  tcase_add_test(tc, test_replay_counts_failures_and_skips_their_frees);
  tcase_add_test(tc, test_replay_rejects_bad_stacks);
  tcase_add_test(tc, test_replay_bad_lines_name_their_line);
  tcase_add_test(tc, test_replay_lenient_counts_each_kind);
  tcase_add_test(tc, test_replay_reads_rmm_formats);
  tcase_add_test(tc, test_replay_threads_follow_the_log_order);
  tcase_add_test(tc, test_replay_threaded_figures_equal_single_threaded);
  tcase_add_test(tc, test_replay_threaded_random_log);
  tcase_add_test(tc, test_replay_reads_plain_and_gzip_files);
  tcase_add_test(tc, test_replay_hook_wraps_the_base_layer);
  tcase_add_test(tc, test_replay_meter_sits_between_base_and_stack);
  tcase_add_test(tc, test_replay_epoch_callback);
  tcase_add_test(tc, test_replay_json_and_svg_reports);
  tcase_add_test(tc, test_replay_live_bytes_stay_representable);
  tcase_add_test(tc, test_replay_svg_axis_takes_any_value);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
