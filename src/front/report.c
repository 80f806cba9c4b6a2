/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory status report (see include/rmmc/report.h).
 *
 * The text is built in a growing host buffer and then written out, so the
 * FILE and the char-buffer forms share every line of formatting. Each layer
 * is read through rmmc_resource_describe() only: the report works for any
 * resource and never allocates from the stack it describes.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"
#include "rmmc/registry.h"
#include "rmmc/report.h"

#define REPORT_MAX_DEPTH 64

typedef struct text {
  char *data;
  size_t len, cap;
  bool failed; /* host memory ran out */
} text_t;

static void put(text_t *t, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void put(text_t *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if (t->data != NULL && (size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap : 1024;
    while (cap - t->len <= (size_t)n) cap *= 2;
    char *data = realloc(t->data, cap);
    if (data == NULL) {
      t->failed = true;
      return;
    }
    t->data = data;
    t->cap = cap;
  }
}

typedef struct layer_ctx {
  text_t *t;
  int fields;
} layer_ctx_t;

static void put_field(void *ctx, const rmmc_field_t *f) {
  layer_ctx_t *l = ctx;
  char b[32];
  const char *key = f->key != NULL ? f->key : "?";
  switch (f->kind) {
  case RMMC_FIELD_BYTES:
    put(l->t, "         %-14s %s\n", key, rmmc__format_bytes(f->value, b, sizeof b));
    break;
  case RMMC_FIELD_COUNT:
    put(l->t, "         %-14s %llu\n", key, (unsigned long long)f->value);
    break;
  case RMMC_FIELD_TEXT:
  default:
    put(l->t, "         %-14s %s\n", key, f->text != NULL ? f->text : "");
    break;
  }
  l->fields++;
}

static void put_device_memory(text_t *t, int device) {
  size_t free_b, total_b;
  char a[32], b[32], c[32];
  if (!rmmc__cuda_available()) {
    put(t, "  device memory: no CUDA device\n");
    return;
  }
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  rmmc_status_t st = rmmc_device_memory_info(device, &free_b, &total_b);
  if (st != RMMC_SUCCESS) {
    put(t, "  device memory: unknown (%s)\n", rmmc_last_error_message());
    rmmc__error_restore(&saved); /* a report is not a failure of the caller's */
    return;
  }
  put(t, "  device memory: %s used, %s free, %s total\n",
      rmmc__format_bytes(total_b - free_b, a, sizeof a), rmmc__format_bytes(free_b, b, sizeof b),
      rmmc__format_bytes(total_b, c, sizeof c));
}

static void put_stack(text_t *t, rmmc_resource_t *r) {
  put(t, "  stack (outermost first):\n");
  for (int depth = 0; r != NULL; depth++, r = rmmc_resource_upstream(r)) {
    if (depth == REPORT_MAX_DEPTH) {
      put(t, "    ... (more than %d layers)\n", REPORT_MAX_DEPTH);
      return;
    }
    put(t, "    %d. %s [%s memory", depth + 1, rmmc_resource_name(r),
        rmmc_memory_kind_name(rmmc_resource_memory_kind(r)));
    if (rmmc_resource_device(r) >= 0) put(t, ", device %d", rmmc_resource_device(r));
    put(t, "]\n");
    layer_ctx_t l = {t, 0};
    rmmc_resource_describe(r, put_field, &l);
    if (l.fields == 0) put(t, "         (no figures)\n");
  }
}

/* Builds the report of `r`'s stack, or of device `device`'s when r is NULL. */
static rmmc_status_t build(text_t *t, rmmc_resource_t *r, int device) {
  memset(t, 0, sizeof *t);
  if (r != NULL) {
    put(t, "rmmc resource status: %s\n", rmmc_resource_name(r));
    if (rmmc_resource_device(r) >= 0) put_device_memory(t, rmmc_resource_device(r));
    put_stack(t, r);
  } else {
    rmmc_status_t st = rmmc__resolve_device(device, &device);
    if (st != RMMC_SUCCESS) return st;
    put(t, "rmmc memory status: device %d\n", device);
    put_device_memory(t, device);
    rmmc__error_state_t saved;
    rmmc__error_save(&saved);
    st = rmmc_retain_device_resource(device, &r);
    if (st == RMMC_SUCCESS) {
      put_stack(t, r);
      rmmc_resource_release(r);
    } else {
      put(t, "  resource: none (%s: %s)\n", rmmc_status_name(st), rmmc_last_error_message());
      rmmc__error_restore(&saved);
    }
  }
  if (t->failed) {
    free(t->data);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "memory status: no host memory for the report");
  }
  return RMMC_SUCCESS;
}

static rmmc_status_t write_file(text_t *t, FILE *out) {
  bool ok = t->len == 0 || fwrite(t->data, 1, t->len, out) == t->len;
  free(t->data);
  if (!ok || fflush(out) != 0)
    return rmmc_set_error(RMMC_ERROR_IO, "memory status: writing the report failed");
  return RMMC_SUCCESS;
}

static rmmc_status_t write_buffer(text_t *t, char *buf, size_t len, size_t *needed) {
  if (needed != NULL) *needed = t->len;
  if (len > 0) {
    size_t n = t->len < len - 1 ? t->len : len - 1;
    if (n > 0) memcpy(buf, t->data, n);
    buf[n] = '\0';
  }
  free(t->data);
  return RMMC_SUCCESS;
}

static rmmc_status_t check_buffer(const char *what, const char *buf, size_t len) {
  if (buf == NULL && len > 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: buf is NULL but len is %zu", what, len);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_memory_status(int device, FILE *out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "memory_status: FILE is NULL");
  text_t t;
  rmmc_status_t st = build(&t, NULL, device);
  return st == RMMC_SUCCESS ? write_file(&t, out) : st;
}

RMMC_API rmmc_status_t rmmc_resource_print_status(rmmc_resource_t *r, FILE *out) {
  if (r == NULL || out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "resource_print_status: %s is NULL",
                          r == NULL ? "resource" : "FILE");
  text_t t;
  rmmc_status_t st = build(&t, r, -1);
  return st == RMMC_SUCCESS ? write_file(&t, out) : st;
}

RMMC_API rmmc_status_t rmmc_memory_status_string(int device, char *buf, size_t len,
                                                 size_t *needed) {
  rmmc_status_t st = check_buffer("memory_status_string", buf, len);
  if (st != RMMC_SUCCESS) return st;
  text_t t;
  st = build(&t, NULL, device);
  return st == RMMC_SUCCESS ? write_buffer(&t, buf, len, needed) : st;
}

RMMC_API rmmc_status_t rmmc_resource_status_string(rmmc_resource_t *r, char *buf, size_t len,
                                                   size_t *needed) {
  rmmc_status_t st = check_buffer("resource_status_string", buf, len);
  if (st != RMMC_SUCCESS) return st;
  if (r == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "resource_status_string: resource is NULL");
  text_t t;
  st = build(&t, r, -1);
  return st == RMMC_SUCCESS ? write_buffer(&t, buf, len, needed) : st;
}
