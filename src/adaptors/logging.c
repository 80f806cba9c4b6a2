/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The logging adaptor (see logging_adaptor.h).
 *
 * Each event is formatted into a buffer on the caller's stack with a few
 * hand-written integer conversions (no stdio, no locale, no lock), then
 * appended to the adaptor's 64 KiB buffer under a mutex held for a memcpy;
 * when the buffer is full it is written out (write(2) for a file the
 * adaptor opened, fwrite for a borrowed FILE) while the mutex is still
 * held, which keeps lines whole and in order. The time of day is formatted
 * with localtime_r once per second per thread and cached.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "logging_options.h"
#include "base/spec.h"
#include "rmmc/logging_adaptor.h"

#define BUFFER_SIZE ((size_t)64 << 10)
#define LINE_MAX_CHARS 160

static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";

typedef struct logging {
  rmmc__adaptor_t a;
  bool flush_each;
  rmmc_logging_time_t time;
  int fd;     /* owned, or -1 */
  FILE *file; /* borrowed, or NULL */
  char *name; /* for messages: the path, or "a FILE" */
  pthread_mutex_t lock;
  /* under the lock: */
  char *buf;
  size_t len;
  uint64_t events;
  uint64_t errors_total, errors_unreported;
  int last_errno;
} logging_t;

/* ---- formatting ---- */

/* Two digits per division: microsecond times have 16. */
static inline char *put_dec(char *p, uint64_t v) {
  static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233"
                              "34353637383940414243444546474849505152535455565758596061626364656667"
                              "6869707172737475767778798081828384858687888990919293949596979899";
  char tmp[20];
  int n = 20;
  while (v >= 100) {
    unsigned d = (unsigned)(v % 100) * 2;
    v /= 100;
    tmp[--n] = pairs[d + 1];
    tmp[--n] = pairs[d];
  }
  if (v >= 10) {
    tmp[--n] = pairs[v * 2 + 1];
    tmp[--n] = pairs[v * 2];
  } else {
    tmp[--n] = (char)('0' + v);
  }
  memcpy(p, tmp + n, (size_t)(20 - n));
  return p + (20 - n);
}

static inline char *put_hex(char *p, uint64_t v) {
  char tmp[16];
  int n = 0;
  *p++ = '0';
  *p++ = 'x';
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0);
  while (n > 0) *p++ = tmp[--n];
  return p;
}

static inline char *put_str(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}

/* The clock text of the last second this thread logged (initial-exec: no
 * __tls_get_addr per line). */
static _Thread_local time_t tl_second RMMC_TLS_FAST = (time_t)-1;
static _Thread_local char tl_clock[9] RMMC_TLS_FAST; /* "HH:MM:SS." of tl_second */

static char *put_time(char *p, rmmc_logging_time_t format) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t us = (uint64_t)(ts.tv_nsec / 1000);
  if (format == RMMC_LOGGING_TIME_MICROSECONDS) return put_dec(p, (uint64_t)ts.tv_sec * 1000000u + us);
  if (RMMC_UNLIKELY(ts.tv_sec != tl_second)) {
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    tl_clock[0] = (char)('0' + tm.tm_hour / 10), tl_clock[1] = (char)('0' + tm.tm_hour % 10);
    tl_clock[2] = ':';
    tl_clock[3] = (char)('0' + tm.tm_min / 10), tl_clock[4] = (char)('0' + tm.tm_min % 10);
    tl_clock[5] = ':';
    tl_clock[6] = (char)('0' + tm.tm_sec / 10), tl_clock[7] = (char)('0' + tm.tm_sec % 10);
    tl_clock[8] = '.';
    tl_second = ts.tv_sec;
  }
  p = put_str(p, tl_clock, 9);
  for (int d = 5; d >= 0; d--, us /= 10) p[d] = (char)('0' + us % 10);
  return p + 6;
}

typedef enum action { ACTION_ALLOCATE, ACTION_FREE, ACTION_FAILURE } action_t;

/* Formats one event line into line (LINE_MAX_CHARS) and returns its length. */
static size_t format_line(const logging_t *l, char *line, action_t action, const void *ptr,
                          size_t bytes, cudaStream_t stream) {
  static const struct {
    const char *text;
    size_t len;
  } actions[] = {{",allocate,", 10}, {",free,", 6}, {",allocate failure,", 18}};
  char *p = put_dec(line, rmmc__thread_id());
  *p++ = ',';
  p = put_time(p, l->time);
  p = put_str(p, actions[action].text, actions[action].len);
  p = put_hex(p, (uint64_t)(uintptr_t)ptr);
  *p++ = ',';
  p = put_dec(p, bytes);
  *p++ = ',';
  p = put_hex(p, (uint64_t)(uintptr_t)stream);
  *p++ = '\n';
  return (size_t)(p - line);
}

/* ---- output ---- */

/* Writes the buffer out and empties it; a failure is counted, the lines
 * are dropped. Lock held. */
static void drain(logging_t *l) {
  const char *p = l->buf;
  size_t left = l->len;
  int err = 0;
  if (l->file != NULL) {
    if (left > 0 && fwrite(p, 1, left, l->file) != left) err = errno ? errno : EIO;
  } else {
    while (left > 0) {
      ssize_t n = write(l->fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      p += n;
      left -= (size_t)n;
    }
  }
  if (err != 0) {
    l->errors_total++;
    l->errors_unreported++;
    l->last_errno = err;
  }
  l->len = 0;
}

static void append(logging_t *l, const char *line, size_t n) {
  pthread_mutex_lock(&l->lock);
  if (RMMC_UNLIKELY(l->len + n > BUFFER_SIZE)) drain(l);
  memcpy(l->buf + l->len, line, n);
  l->len += n;
  l->events++;
  if (l->flush_each) {
    drain(l);
    if (l->file != NULL && fflush(l->file) != 0) {
      l->errors_total++;
      l->errors_unreported++;
      l->last_errno = errno;
    }
  }
  pthread_mutex_unlock(&l->lock);
}

static void log_event(logging_t *l, action_t action, const void *ptr, size_t bytes,
                      cudaStream_t stream) {
  char line[LINE_MAX_CHARS];
  append(l, line, format_line(l, line, action, ptr, bytes, stream));
}

/* ---- the resource ---- */

static rmmc_status_t logging_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                      cudaStream_t stream, void **out) {
  logging_t *l = (logging_t *)r;
  rmmc_status_t st = rmmc__forward_allocate(&l->a, bytes, alignment, stream, out);
  log_event(l, st == RMMC_SUCCESS ? ACTION_ALLOCATE : ACTION_FAILURE, *out, bytes, stream);
  return st;
}

static rmmc_status_t logging_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                        size_t alignment, cudaStream_t stream) {
  logging_t *l = (logging_t *)r;
  log_event(l, ACTION_FREE, ptr, bytes, stream);
  return rmmc__forward_deallocate(&l->a, ptr, bytes, alignment, stream);
}

/* What describe reports, in order (rmmc/figures.h: the rows). */
#define LOGGING_FIGURES(X)                       \
  X(TEXT, path, DESCRIBE, "the log's path")      \
  X(COUNT, events, DESCRIBE, "lines logged")     \
  X(COUNT, write_errors, DESCRIBE, "writes and flushes of the log that failed")

static void logging_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  logging_t *l = (logging_t *)r;
  struct {
    LOGGING_FIGURES(RMMC__FIGURE_VALUE)
  } v = {.path = l->name};
  pthread_mutex_lock(&l->lock);
  v.events = l->events, v.write_errors = l->errors_total;
  pthread_mutex_unlock(&l->lock);
  LOGGING_FIGURES(RMMC__FIGURE_EMIT)
}

/* Drains and flushes; reports the failures not reported yet. Lock held. */
static rmmc_status_t flush_locked(logging_t *l, const char *what) {
  drain(l);
  if (l->file != NULL && fflush(l->file) != 0) {
    l->errors_total++;
    l->errors_unreported++;
    l->last_errno = errno;
  }
  if (l->errors_unreported == 0) return RMMC_SUCCESS;
  uint64_t n = l->errors_unreported;
  l->errors_unreported = 0;
  return rmmc_set_error(RMMC_ERROR_IO,
                        "%s: writing the log to %s failed %llu time%s since the last flush (%s); "
                        "the lines of those writes are lost",
                        what, l->name, (unsigned long long)n, n == 1 ? "" : "s",
                        strerror(l->last_errno));
}

static void logging_destroy(rmmc_resource_t *r) {
  logging_t *l = (logging_t *)r;
  pthread_mutex_lock(&l->lock);
  (void)flush_locked(l, "logging adaptor destroy");
  pthread_mutex_unlock(&l->lock);
  if (l->fd >= 0) close(l->fd);
  pthread_mutex_destroy(&l->lock);
  free(l->buf);
  free(l->name);
  rmmc__adaptor_destroy(r);
}

static const rmmc_resource_ops_t logging_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "logging",
    .allocate = logging_allocate,
    .deallocate = logging_deallocate,
    .describe = logging_describe,
    .destroy = logging_destroy,
    .upstream = rmmc__adaptor_upstream,
    .get_allocation = rmmc__adaptor_get_allocation,
};

RMMC_API rmmc_status_t rmmc_logging_adaptor_flush(rmmc_resource_t *r) {
  rmmc_status_t st = rmmc__check_kind(r, &logging_ops, "logging_adaptor_flush");
  if (st != RMMC_SUCCESS) return st;
  logging_t *l = (logging_t *)r;
  pthread_mutex_lock(&l->lock);
  st = flush_locked(l, "logging_adaptor_flush");
  pthread_mutex_unlock(&l->lock);
  return st;
}

/* Builds the adaptor around an open output (fd owned, or file borrowed);
 * on failure closes fd and retains nothing. */
static rmmc_status_t create(const char *what, rmmc_resource_t *upstream, int fd, FILE *file,
                            const char *name, const rmmc_logging_options_t *options,
                            rmmc_resource_t **out) {
  rmmc_logging_options_t opts = RMMC_LOGGING_OPTIONS_INIT;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, what, &opts, options, RMMC_LOGGING_OPTIONS);
  if (st != RMMC_SUCCESS) goto close_fd;
  if (opts.time != RMMC_LOGGING_TIME_CLOCK && opts.time != RMMC_LOGGING_TIME_MICROSECONDS) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: unknown time format %d", what,
                        (int)opts.time);
    goto close_fd;
  }
  st = rmmc__adaptor_new(what, &logging_ops, upstream, sizeof(logging_t), out);
  if (st != RMMC_SUCCESS) goto close_fd;
  logging_t *l = (logging_t *)*out;
  l->flush_each = opts.flush_each;
  l->time = opts.time;
  l->fd = fd;
  l->file = file;
  l->buf = malloc(BUFFER_SIZE);
  l->name = strdup(name);
  if (l->buf == NULL || l->name == NULL) {
    free(l->buf);
    free(l->name);
    rmmc__adaptor_destroy(*out);
    *out = NULL;
    st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", what);
    goto close_fd;
  }
  pthread_mutex_init(&l->lock, NULL);
  pthread_mutex_lock(&l->lock);
  memcpy(l->buf, header, sizeof header - 1);
  l->len = sizeof header - 1;
  if (opts.flush_each) st = flush_locked(l, what);
  pthread_mutex_unlock(&l->lock);
  if (st != RMMC_SUCCESS) {
    rmmc_resource_release(*out);
    *out = NULL;
  }
  return st;

close_fd:
  if (fd >= 0) close(fd);
  return st;
}

RMMC_API rmmc_status_t rmmc_logging_adaptor_create(rmmc_resource_t *upstream, const char *path,
                                                   const rmmc_logging_options_t *options,
                                                   rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("logging_adaptor_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  if (path == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "logging_adaptor_create: path is NULL");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return rmmc_set_error(RMMC_ERROR_IO, "logging_adaptor_create: cannot open '%s' for writing: %s",
                          path, strerror(errno));
  return create("logging_adaptor_create", upstream, fd, NULL, path, options, out);
}

RMMC_API rmmc_status_t rmmc_logging_adaptor_create_file(rmmc_resource_t *upstream, FILE *file,
                                                        const rmmc_logging_options_t *options,
                                                        rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("logging_adaptor_create_file", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  if (file == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "logging_adaptor_create_file: file is NULL");
  return create("logging_adaptor_create_file", upstream, -1, file, "a FILE", options, out);
}

#define LOGGING_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_logging_options_t, __VA_ARGS__)
static const rmmc__spec_option_t logging_spec_options[] = {
    /* Not a field: the create's own argument. */
    {.name = "path", .type = RMMC__OPT_STRING,
     .help = "the CSV file to write, created or truncated (required, no default)"},
    RMMC__LOGGING_OPTIONS(LOGGING_SPEC_ROW){.name = NULL},
};
#undef LOGGING_SPEC_ROW

static rmmc_status_t logging_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                   int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_logging_options_t opts = RMMC_LOGGING_OPTIONS_INIT;
  const char *path = rmmc__spec_string(args, "path");
  if (path == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "logging needs a file: write logging(path=/tmp/alloc.csv)");
  rmmc_status_t st = rmmc__spec_fill(args, logging_spec_options, upstream, &opts);
  if (st != RMMC_SUCCESS) return st;
  const char *time = rmmc__spec_string(args, "time");
  if (time != NULL && strcmp(time, "us") == 0)
    opts.time = RMMC_LOGGING_TIME_MICROSECONDS;
  else if (time != NULL && strcmp(time, "clock") != 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "logging: time=%s is neither 'clock' nor 'us'", time);
  return rmmc_logging_adaptor_create(upstream, path, &opts, out);
}

const rmmc__spec_entry_t rmmc__logging_spec = {
    .name = "logging",
    .help = "writes one CSV line per event in RMM's log format (replayable)",
    .needs_upstream = true,
    .options = logging_spec_options,
    .build = logging_build,
};
