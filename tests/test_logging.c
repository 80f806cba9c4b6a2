/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The logging adaptor over a host spy: conformance, lines parsed back the
 * way RMM's replay parser reads them and compared with what was done, the
 * failure row, both time formats, many threads (exact line count, no torn
 * lines, every address freed before it is handed out again), flushing,
 * write and open failures, FILE output, spec. Host suite.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static char tmpdir[64];

static void make_tmpdir(void) {
  if (tmpdir[0] != '\0') return;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/rmmc_logging_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void path_of(char *buf, size_t len, const char *name) {
  make_tmpdir();
  snprintf(buf, len, "%s/%s", tmpdir, name);
}

/* The conformance battery writes to a file that is unlinked at once: the
 * adaptor keeps the descriptor until it is destroyed. */
static rmmc_status_t make_logging(rmmc_resource_t *upstream, rmmc_resource_t **out, bool each) {
  char path[128];
  path_of(path, sizeof path, each ? "conformance_each.csv" : "conformance.csv");
  rmmc_logging_options_t o = RMMC_LOGGING_OPTIONS_INIT;
  o.flush_each = each;
  rmmc_status_t st = rmmc_logging_adaptor_create(upstream, path, &o, out);
  unlink(path);
  return st;
}
static rmmc_status_t make_buffered(rmmc_resource_t *u, rmmc_resource_t **out) { return make_logging(u, out, false); }
static rmmc_status_t make_each(rmmc_resource_t *u, rmmc_resource_t **out) { return make_logging(u, out, true); }

static const conformance_case_t cases[] = {{"logging", make_buffered, 0},
                                           {"logging+flush", make_each, 0}};

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* One parsed line, read as RMM's log_parser.hpp reads it: Thread, Size and
 * Stream with stoul (base 10, must start with a digit), Pointer in base 16. */
typedef struct row {
  unsigned long long thread;
  char time[32];
  char action[32];
  unsigned long long ptr, size, stream, stream_base10;
} row_t;

static bool parse_row(char *line, row_t *r) {
  char *field[6];
  int n = 0;
  for (char *p = line; n < 6; n++) {
    field[n] = p;
    char *comma = strchr(p, ',');
    if (comma == NULL) break;
    *comma = '\0';
    p = comma + 1;
  }
  if (n != 5) return false; /* exactly six fields: five commas */
  char *end;
  if (!isdigit((unsigned char)field[0][0])) return false;
  r->thread = strtoull(field[0], &end, 10);
  if (*end) return false;
  snprintf(r->time, sizeof r->time, "%s", field[1]);
  snprintf(r->action, sizeof r->action, "%s", field[2]);
  if (strncmp(field[3], "0x", 2) != 0) return false;
  r->ptr = strtoull(field[3], &end, 16);
  if (*end) return false;
  r->size = strtoull(field[4], &end, 10);
  if (*end || !isdigit((unsigned char)field[4][0])) return false;
  if (strncmp(field[5], "0x", 2) != 0 || !isdigit((unsigned char)field[5][0])) return false;
  r->stream = strtoull(field[5], &end, 16);
  if (*end) return false;
  r->stream_base10 = strtoull(field[5], NULL, 10); /* what rapidcsv's stoul gets: 0 */
  return true;
}

/* Splits text into lines (in place); returns the count, checks the header. */
static int split_lines(char *text, char ***lines) {
  int n = 0, cap = 1024;
  *lines = malloc((size_t)cap * sizeof **lines);
  for (char *p = text; *p;) {
    char *nl = strchr(p, '\n');
    ck_assert_msg(nl != NULL, "last line is not terminated: '%s'", p);
    *nl = '\0';
    if (n == cap) *lines = realloc(*lines, (size_t)(cap *= 2) * sizeof **lines);
    (*lines)[n++] = p;
    p = nl + 1;
  }
  ck_assert_int_ge(n, 1);
  ck_assert_str_eq((*lines)[0], "Thread,Time,Action,Pointer,Size,Stream");
  return n;
}

static bool is_clock_time(const char *t) {
  /* HH:MM:SS.uuuuuu */
  if (strlen(t) != 15) return false;
  for (int i = 0; i < 15; i++) {
    bool sep = i == 2 || i == 5 || i == 8;
    if (sep ? t[i] != (i == 8 ? '.' : ':') : !isdigit((unsigned char)t[i])) return false;
  }
  return atoi(t) < 24 && atoi(t + 3) < 60 && atoi(t + 6) < 61;
}

static unsigned long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

static uint64_t my_tid(void) { return (uint64_t)syscall(SYS_gettid); }

START_TEST(test_logging_lines_match_what_was_done) {
  rmmc_resource_t *spy, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  char path[128];
  path_of(path, sizeof path, "lines.csv");
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, path, NULL, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "logging");
  void *a, *b, *c = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, (cudaStream_t)0x10, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 4096, NULL, &b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 1000, 256, (cudaStream_t)0x10), RMMC_SUCCESS);
  spy_fail_nth(spy_of(spy), 1);
  ck_assert_int_eq(rmmc_resource_allocate(r, 777, 256, cudaStreamPerThread, &c), RMMC_ERROR_OUT_OF_MEMORY);
  /* The upstream's message is not disturbed by the logging. */
  ck_assert_msg(strstr(rmmc_last_error_message(), "spy failure injected") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 5000, 4096, NULL), RMMC_SUCCESS);
  /* Nothing is written before a flush (the buffer holds it all)... */
  char *text = read_file(path);
  ck_assert_str_eq(text, "");
  free(text);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(r), RMMC_SUCCESS);
  text = read_file(path);
  char **lines;
  int n = split_lines(text, &lines);
  ck_assert_int_eq(n, 6);
  struct { const char *action; void *ptr; size_t size; uintptr_t stream; } want[] = {
      {"allocate", a, 1000, 0x10},
      {"allocate", b, 5000, 0},
      {"free", a, 1000, 0x10},
      {"allocate failure", NULL, 777, (uintptr_t)cudaStreamPerThread},
      {"free", b, 5000, 0},
  };
  for (int i = 1; i < n; i++) {
    row_t row;
    ck_assert_msg(parse_row(lines[i], &row), "line %d: '%s'", i, lines[i]);
    ck_assert_uint_eq(row.thread, my_tid());
    ck_assert_msg(is_clock_time(row.time), "time '%s'", row.time);
    ck_assert_str_eq(row.action, want[i - 1].action);
    ck_assert_uint_eq(row.ptr, (uintptr_t)want[i - 1].ptr);
    ck_assert_uint_eq(row.size, want[i - 1].size);
    ck_assert_uint_eq(row.stream, want[i - 1].stream);
    ck_assert_uint_eq(row.stream_base10, 0);
  }
  free(lines);
  free(text);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(r, "events", &v));
  ck_assert_uint_eq(v, 5);
  ck_assert(rmmc_resource_get_field(r, "write_errors", &v));
  ck_assert_uint_eq(v, 0);
  /* Lines written after a flush are written at destroy. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 64, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 64, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  text = read_file(path);
  n = split_lines(text, &lines);
  ck_assert_int_eq(n, 8);
  ck_assert_ptr_nonnull(strstr(lines[6], ",allocate,"));
  ck_assert_ptr_nonnull(strstr(lines[7], ",free,"));
  free(lines);
  free(text);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  rmmc_resource_release(spy);
  unlink(path);
}
END_TEST

START_TEST(test_logging_microsecond_time) {
  rmmc_resource_t *spy, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  char path[128];
  path_of(path, sizeof path, "us.csv");
  rmmc_logging_options_t o = RMMC_LOGGING_OPTIONS_INIT;
  o.time = RMMC_LOGGING_TIME_MICROSECONDS;
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, path, &o, &r), RMMC_SUCCESS);
  unsigned long long before = now_us();
  void *p[10];
  for (int i = 0; i < 10; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &p[i]), RMMC_SUCCESS);
  for (int i = 0; i < 10; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 100, 256, NULL), RMMC_SUCCESS);
  unsigned long long after = now_us();
  rmmc_resource_release(r);
  char *text = read_file(path);
  char **lines;
  int n = split_lines(text, &lines);
  ck_assert_int_eq(n, 21);
  unsigned long long last = 0;
  for (int i = 1; i < n; i++) {
    row_t row;
    ck_assert(parse_row(lines[i], &row));
    char *end;
    unsigned long long t = strtoull(row.time, &end, 10);
    ck_assert_msg(*end == '\0', "time '%s'", row.time);
    ck_assert_uint_ge(t, before);
    ck_assert_uint_le(t, after);
    ck_assert_uint_ge(t, last); /* one thread: in order */
    last = t;
  }
  free(lines);
  free(text);
  unlink(path);
  rmmc_resource_release(spy);
}
END_TEST

/* ---- many threads ---- */

enum { THREADS = 8, EVENTS = 3000 };

typedef struct worker {
  rmmc_resource_t *r;
  uint64_t tid;
  int id;
} worker_t;

static size_t wsize(int id, int i) { return (size_t)(id * 977 + i * 31) % 10000 + 1; }

static void *log_worker(void *arg) {
  worker_t *w = arg;
  w->tid = my_tid();
  void *held[4] = {0};
  for (int i = 0; i < EVENTS; i++) {
    int k = i % 4;
    if (held[k] != NULL &&
        rmmc_resource_deallocate(w->r, held[k], wsize(w->id, i - 4), 256, (cudaStream_t)(uintptr_t)(w->id + 1)) != RMMC_SUCCESS)
      return (void *)1;
    if (rmmc_resource_allocate(w->r, wsize(w->id, i), 256, (cudaStream_t)(uintptr_t)(w->id + 1), &held[k]) != RMMC_SUCCESS)
      return (void *)1;
  }
  for (int i = EVENTS - 4; i < EVENTS; i++)
    if (rmmc_resource_deallocate(w->r, held[i % 4], wsize(w->id, i), 256, (cudaStream_t)(uintptr_t)(w->id + 1)) != RMMC_SUCCESS)
      return (void *)1;
  return NULL;
}

static int cmp_ull(const void *a, const void *b) {
  unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
  return x < y ? -1 : x > y;
}

START_TEST(test_logging_many_threads) {
  rmmc_resource_t *spy, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  char path[128];
  path_of(path, sizeof path, "threads.csv");
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, path, NULL, &r), RMMC_SUCCESS);
  pthread_t th[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){r, 0, i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, log_worker, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    ck_assert_ptr_null(ret);
  }
  rmmc_resource_release(r); /* flushes and closes */
  char *text = read_file(path);
  char **lines;
  int n = split_lines(text, &lines);
  ck_assert_int_eq(n, 1 + THREADS * EVENTS * 2);
  /* Every line whole; each thread's lines in its own order; and, in file
   * order, no address is handed out while the log still has it live
   * (what a replay needs). */
  int next_alloc[THREADS] = {0}, next_free[THREADS] = {0};
  unsigned long long *live = calloc((size_t)THREADS * 4 + 1, sizeof *live);
  int nlive = 0;
  for (int i = 1; i < n; i++) {
    row_t row;
    ck_assert_msg(parse_row(lines[i], &row), "torn line %d: '%s'", i, lines[i]);
    ck_assert(is_clock_time(row.time));
    int id = (int)row.stream - 1;
    ck_assert_int_ge(id, 0);
    ck_assert_int_lt(id, THREADS);
    ck_assert_uint_eq(row.thread, w[id].tid);
    if (strcmp(row.action, "allocate") == 0) {
      ck_assert_uint_eq(row.size, wsize(id, next_alloc[id]++));
      for (int k = 0; k < nlive; k++) ck_assert_msg(live[k] != row.ptr, "0x%llx handed out while live", row.ptr);
      live[nlive++] = row.ptr;
    } else {
      ck_assert_str_eq(row.action, "free");
      ck_assert_uint_eq(row.size, wsize(id, next_free[id]++));
      int k = 0;
      while (k < nlive && live[k] != row.ptr) k++;
      ck_assert_msg(k < nlive, "free of 0x%llx which the log does not have live", row.ptr);
      live[k] = live[--nlive];
    }
    ck_assert_int_le(nlive, THREADS * 4);
  }
  ck_assert_int_eq(nlive, 0);
  for (int i = 0; i < THREADS; i++) {
    ck_assert_int_eq(next_alloc[i], EVENTS);
    ck_assert_int_eq(next_free[i], EVENTS);
  }
  /* Thread ids are distinct. */
  unsigned long long tids[THREADS];
  for (int i = 0; i < THREADS; i++) tids[i] = w[i].tid;
  qsort(tids, THREADS, sizeof tids[0], cmp_ull);
  for (int i = 1; i < THREADS; i++) ck_assert_uint_ne(tids[i - 1], tids[i]);
  free(live);
  free(lines);
  free(text);
  unlink(path);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_logging_flush_each_and_file_output) {
  rmmc_resource_t *spy, *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(m);
  /* Buffered: nothing reaches the FILE before a flush. */
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(spy, m, NULL, &r), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &p), RMMC_SUCCESS);
  fflush(m);
  ck_assert_uint_eq(len, 0);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(r), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(strstr(buf, "Thread,Time,Action,Pointer,Size,Stream\n"));
  ck_assert_ptr_nonnull(strstr(buf, ",allocate,"));
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100, 256, NULL), RMMC_SUCCESS);
  /* Destroy flushes the FILE and leaves it open. */
  rmmc_resource_release(r);
  ck_assert_ptr_nonnull(strstr(buf, ",free,"));
  ck_assert_int_gt(fprintf(m, "still open\n"), 0);
  fclose(m);
  free(buf);
  /* flush_each: every line is in the FILE when the call returns. */
  m = open_memstream(&buf, &len);
  rmmc_logging_options_t o = RMMC_LOGGING_OPTIONS_INIT;
  o.flush_each = true;
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(spy, m, &o, &r), RMMC_SUCCESS);
  ck_assert_str_eq(buf, "Thread,Time,Action,Pointer,Size,Stream\n");
  size_t before = len;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4242, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_gt(len, before);
  ck_assert_ptr_nonnull(strstr(buf + before, ",4242,0x0\n"));
  before = len;
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4242, 256, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(strstr(buf + before, ",free,"));
  rmmc_resource_release(r);
  fclose(m);
  free(buf);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_logging_write_and_open_failures) {
  rmmc_resource_t *spy, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  /* A file that cannot be opened. */
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, "/nonexistent-dir/x.csv", NULL, &r), RMMC_ERROR_IO);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "cannot open '/nonexistent-dir/x.csv' for writing: No such file") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_logging_adaptor_create(NULL, "/tmp/x", NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(spy, NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_logging_options_t o = RMMC_LOGGING_OPTIONS_INIT;
  o.time = (rmmc_logging_time_t)7;
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(spy, stderr, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(spy), RMMC_ERROR_INVALID_ARGUMENT);
  if (access("/dev/full", W_OK) != 0) {
    rmmc_resource_release(spy);
    return;
  }
  /* Writes fail: allocations still work, the next flush says so once. */
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, "/dev/full", NULL, &r), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 100, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(r), RMMC_ERROR_IO);
  ck_assert_msg(strstr(rmmc_last_error_message(), "writing the log to /dev/full failed 1 time since the last flush (No space left on device)") != NULL,
                "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_logging_adaptor_flush(r), RMMC_SUCCESS);
  uint64_t v;
  ck_assert(rmmc_resource_get_field(r, "write_errors", &v));
  ck_assert_uint_eq(v, 1);
  rmmc_resource_release(r);
  /* With flush_each the header cannot be written: create fails, retains nothing. */
  o = (rmmc_logging_options_t)RMMC_LOGGING_OPTIONS_INIT;
  o.flush_each = true;
  ck_assert_int_eq(rmmc_logging_adaptor_create(spy, "/dev/full", &o, &r), RMMC_ERROR_IO);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_logging_spec) {
  char path[128], spec[256];
  path_of(path, sizeof path, "spec.csv");
  snprintf(spec, sizeof spec, "logging(path=%s, flush=true) > host", path);
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "logging");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 31337, 256, NULL, &p), RMMC_SUCCESS);
  char *text = read_file(path); /* flush=true: already there */
  ck_assert_ptr_nonnull(strstr(text, ",allocate,"));
  ck_assert_ptr_nonnull(strstr(text, ",31337,0x0\n"));
  free(text);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 31337, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  /* A quoted path with a space, microsecond times. */
  path_of(path, sizeof path, "spec us.csv");
  snprintf(spec, sizeof spec, "logging(path=\"%s\", time=us) > host", path);
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 5, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 5, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  text = read_file(path);
  char **lines;
  ck_assert_int_eq(split_lines(text, &lines), 3);
  row_t row;
  ck_assert(parse_row(lines[1], &row));
  ck_assert_uint_gt(strtoull(row.time, NULL, 10), 1000000000000000ull);
  free(lines);
  free(text);
  unlink(path);
  r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("logging > host", -1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "logging needs a file") != NULL, "%s", rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_create("logging(path=/tmp/rmmc_never.csv, time=ns) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "time=ns is neither 'clock' nor 'us'") != NULL, "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(access("/tmp/rmmc_never.csv", F_OK), -1); /* nothing built, nothing created */
  ck_assert_int_eq(rmmc_stack_validate("logging(path=/tmp/x.csv, flush=sometimes) > host"), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_stack_validate("logging(file=/tmp/x.csv) > host"), RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "(it takes: path, flush, time)") != NULL, "%s",
                rmmc_last_error_message());
  path_of(path, sizeof path, "spec.csv");
  unlink(path);
}
END_TEST

static void cleanup(void) {
  if (tmpdir[0] != '\0') rmdir(tmpdir);
}

int main(void) {
  atexit(cleanup);
  Suite *s = suite_create("logging");
  conformance_add(s, cases, 2);
  TCase *tc = tcase_create("logging");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_logging_lines_match_what_was_done);
  tcase_add_test(tc, test_logging_microsecond_time);
  tcase_add_test(tc, test_logging_many_threads);
  tcase_add_test(tc, test_logging_flush_each_and_file_output);
  tcase_add_test(tc, test_logging_write_and_open_failures);
  tcase_add_test(tc, test_logging_spec);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
