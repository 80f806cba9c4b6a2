/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory status report: the printed text of a stack of adaptors over a
 * spy is parsed back (each layer in order, its figures, human-readable
 * sizes, plain counts), users' resources with no describe slot, the
 * registry form with and without a resource set ("no CUDA device" here),
 * the char-buffer form's truncation, and every error status. Host suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static bool starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Reads what a FILE-printing call wrote. */
static char *capture_stack(rmmc_resource_t *r) {
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(rmmc_resource_print_status(r, f), RMMC_SUCCESS);
  long n = ftell(f);
  ck_assert_int_gt(n, 0);
  rewind(f);
  char *text = calloc((size_t)n + 1, 1);
  ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return text;
}

/* The part of the report for layer `index` ("2. aligned [...]" up to the
 * next layer), copied; fails if the layer's heading is not there. */
static char *section(const char *text, int index, const char *name) {
  char head[64];
  snprintf(head, sizeof head, "    %d. %s [", index, name);
  const char *start = strstr(text, head);
  ck_assert_msg(start != NULL, "no '%s' in:\n%s", head, text);
  snprintf(head, sizeof head, "    %d. ", index + 1);
  const char *end = strstr(start, head);
  size_t n = end ? (size_t)(end - start) : strlen(start);
  char *s = calloc(n + 1, 1);
  memcpy(s, start, n);
  return s;
}

static void expect_line(const char *sec, const char *key, const char *value) {
  char line[128];
  snprintf(line, sizeof line, "         %-14s %s\n", key, value);
  ck_assert_msg(strstr(sec, line) != NULL, "no line '%s' in:\n%s", line, sec);
}

START_TEST(test_report_lists_every_layer_with_figures) {
  rmmc_resource_t *spy, *fc, *al, *ts;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(spy, 2, &fc), RMMC_SUCCESS);
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.threshold = 0;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(fc, &o, &al), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(al, &ts), RMMC_SUCCESS);
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(ts, 3 * MiB, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(ts, 512 * KiB, 256, NULL, &b), RMMC_SUCCESS);
  /* One recovered failure shows in the failure_callback's counts. */
  spy_fail_nth(spy_of(spy), 1);
  void *c;
  ck_assert_int_eq(rmmc_resource_allocate(ts, 1000, 256, NULL, &c), RMMC_SUCCESS);

  char *text = capture_stack(ts);
  ck_assert_msg(starts_with(text, "rmmc resource status: thread_safe\n"), "%s", text);
  ck_assert_ptr_null(strstr(text, "device memory")); /* host memory: no device line */
  ck_assert_ptr_nonnull(strstr(text, "  stack (outermost first):\n"));
  const char *names[] = {"thread_safe", "aligned", "failure_callback", "spy"};
  const char *prev = text;
  for (int i = 0; i < 4; i++) {
    char head[64];
    snprintf(head, sizeof head, "    %d. %s [host memory]\n", i + 1, names[i]);
    const char *at = strstr(text, head);
    ck_assert_msg(at != NULL && at > prev, "layer %d '%s' missing or out of order:\n%s", i + 1,
                  names[i], text);
    prev = at;
  }
  ck_assert_ptr_null(strstr(text, "    5. "));

  char *sec = section(text, 1, "thread_safe");
  ck_assert_ptr_nonnull(strstr(sec, "contended"));
  free(sec);
  sec = section(text, 2, "aligned");
  expect_line(sec, "alignment", "4.00 KiB");
  expect_line(sec, "threshold", "0 B");
  expect_line(sec, "outstanding", "3");
  expect_line(sec, "overhead", "11.25 KiB"); /* 3 x (4096 - 256) */
  free(sec);
  sec = section(text, 3, "failure_callback");
  expect_line(sec, "on_failure", "release_cached");
  expect_line(sec, "retries", "2");
  expect_line(sec, "callbacks", "1");
  expect_line(sec, "recovered", "1");
  expect_line(sec, "gave_up", "0");
  free(sec);
  sec = section(text, 4, "spy");
  /* 3.5 MiB + 1000 B + 3 x 3840 B of slack = 3682536 B = 3.51 MiB */
  expect_line(sec, "in_use", "3.51 MiB");
  expect_line(sec, "outstanding", "3");
  free(sec);
  /* Sizes are human-readable, never raw byte counts. */
  ck_assert_ptr_null(strstr(text, "3682536"));
  ck_assert_ptr_null(strstr(text, "11520"));

  /* The buffer form writes the same text. */
  size_t need = 0;
  ck_assert_int_eq(rmmc_resource_status_string(ts, NULL, 0, &need), RMMC_SUCCESS);
  ck_assert_uint_eq(need, strlen(text));
  char *buf = malloc(need + 1);
  ck_assert_int_eq(rmmc_resource_status_string(ts, buf, need + 1, NULL), RMMC_SUCCESS);
  ck_assert_str_eq(buf, text);
  char small[16];
  memset(small, 'x', sizeof small);
  size_t need2 = 0;
  ck_assert_int_eq(rmmc_resource_status_string(ts, small, sizeof small, &need2), RMMC_SUCCESS);
  ck_assert_uint_eq(need2, need);
  ck_assert_uint_eq(strlen(small), sizeof small - 1);
  ck_assert(strncmp(small, text, sizeof small - 1) == 0);
  free(buf);
  free(text);

  ck_assert_int_eq(rmmc_resource_deallocate(ts, a, 3 * MiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(ts, b, 512 * KiB, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(ts, c, 1000, 256, NULL), RMMC_SUCCESS);
  /* Figures follow the stack: nothing outstanding now. */
  text = capture_stack(ts);
  sec = section(text, 4, "spy");
  expect_line(sec, "in_use", "0 B");
  expect_line(sec, "outstanding", "0");
  free(sec);
  free(text);
  rmmc_resource_release(ts);
  rmmc_resource_release(al);
  rmmc_resource_release(fc);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

/* ---- a user's resource with no describe slot ---- */
static rmmc_status_t plain_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  (void)r, (void)stream;
  return posix_memalign(out, alignment, bytes) == 0 ? RMMC_SUCCESS : RMMC_ERROR_OUT_OF_MEMORY;
}
static rmmc_status_t plain_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  (void)r, (void)bytes, (void)alignment, (void)stream;
  free(ptr);
  return RMMC_SUCCESS;
}
static void plain_destroy(rmmc_resource_t *r) { free(r); }
static const rmmc_resource_ops_t plain_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "mine",
    .allocate = plain_allocate,
    .deallocate = plain_deallocate,
    .destroy = plain_destroy,
};

static rmmc_resource_t *plain_new(rmmc_memory_kind_t kind, int device) {
  rmmc_resource_t *r = malloc(sizeof *r);
  rmmc_resource_init(r, &plain_ops, kind, device);
  return r;
}

START_TEST(test_report_users_resource_without_describe) {
  rmmc_resource_t *mine = plain_new(RMMC_MEMORY_HOST, -1);
  char *text = capture_stack(mine);
  ck_assert_msg(strstr(text, "    1. mine [host memory]\n         (no figures)\n") != NULL, "%s", text);
  free(text);
  rmmc_resource_t *ts;
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(mine, &ts), RMMC_SUCCESS);
  rmmc_resource_release(mine);
  text = capture_stack(ts);
  ck_assert_msg(strstr(text, "    2. mine [host memory]\n         (no figures)\n") != NULL, "%s", text);
  free(text);
  rmmc_resource_release(ts);

  /* A device-kind resource gets the device line: here, no device. */
  rmmc_resource_t *dev = plain_new(RMMC_MEMORY_DEVICE, 0);
  text = capture_stack(dev);
  ck_assert_ptr_nonnull(strstr(text, "    1. mine [device memory, device 0]\n"));
  if (rmmc_device_count() == 0)
    ck_assert_msg(strstr(text, "  device memory: no CUDA device\n") != NULL, "%s", text);
  else
    ck_assert_msg(strstr(text, "  device memory: ") && strstr(text, " total\n"), "%s", text);
  free(text);
  rmmc_resource_release(dev);
}
END_TEST

START_TEST(test_report_memory_status_of_a_device) {
  char buf[4096];
  size_t need = 0;
  if (rmmc_device_count() == 0) {
    /* Nothing set and no GPU: the report says so, and succeeds, and leaves
     * the caller's last error alone. */
    rmmc_registry_clear();
    (void)rmmc_set_error(RMMC_ERROR_CUDA, "the caller's own error");
    ck_assert_int_eq(rmmc_memory_status_string(-1, buf, sizeof buf, &need), RMMC_SUCCESS);
    ck_assert_msg(strstr(buf, "rmmc memory status: device 0\n"
                              "  device memory: no CUDA device\n"
                              "  resource: none (ERROR_NO_DEVICE: ") == buf,
                  "%s", buf);
    ck_assert_str_eq(rmmc_last_error_message(), "the caller's own error");
  }
  /* With a host stack set for device 0. */
  rmmc_resource_t *spy, *al, *prev;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_aligned_adaptor_create(spy, NULL, &al), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, al, &prev), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(al, 2 * MiB, 256, NULL, &p), RMMC_SUCCESS);
  FILE *f = tmpfile();
  ck_assert_int_eq(rmmc_memory_status(0, f), RMMC_SUCCESS);
  long n = ftell(f);
  rewind(f);
  char *text = calloc((size_t)n + 1, 1);
  ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  ck_assert_msg(starts_with(text, "rmmc memory status: device 0\n  device memory: "), "%s", text);
  if (rmmc_device_count() == 0) ck_assert_ptr_nonnull(strstr(text, "no CUDA device\n"));
  ck_assert_ptr_nonnull(strstr(text, "    1. aligned [host memory]\n"));
  ck_assert_ptr_nonnull(strstr(text, "    2. spy [host memory]\n"));
  ck_assert_ptr_nonnull(strstr(text, "in_use         2.00 MiB\n")); /* 2 MiB + 3840 B */
  ck_assert_int_eq(rmmc_memory_status_string(0, buf, sizeof buf, &need), RMMC_SUCCESS);
  ck_assert_str_eq(buf, text);
  ck_assert_uint_eq(need, strlen(text));
  free(text);
  ck_assert_int_eq(rmmc_resource_deallocate(al, p, 2 * MiB, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_t *back;
  ck_assert_int_eq(rmmc_set_device_resource(0, prev, &back), RMMC_SUCCESS);
  ck_assert_ptr_eq(back, al);
  rmmc_resource_release(back);
  rmmc_resource_release(prev);
  rmmc_resource_release(al);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_report_errors) {
  rmmc_resource_t *spy;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  char buf[64];
  size_t need = 7;
  ck_assert_int_eq(rmmc_memory_status(0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_memory_status(RMMC_REGISTRY_MAX_DEVICES, stdout), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_memory_status(-7, stdout), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_memory_status_string(1000, buf, sizeof buf, &need), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(need, 7);
  ck_assert_int_eq(rmmc_memory_status_string(0, NULL, 10, &need), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_print_status(NULL, stdout), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_print_status(spy, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_status_string(NULL, buf, sizeof buf, &need), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_status_string(spy, NULL, 5, &need), RMMC_ERROR_INVALID_ARGUMENT);
  /* A stream that cannot be written. */
  FILE *ro = fopen("/dev/null", "r");
  ck_assert_ptr_nonnull(ro);
  ck_assert_int_eq(rmmc_resource_print_status(spy, ro), RMMC_ERROR_IO);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "writing the report failed"));
  fclose(ro);
  /* len 0 writes nothing, not even the NUL. */
  buf[0] = 'z';
  ck_assert_int_eq(rmmc_resource_status_string(spy, buf, 0, &need), RMMC_SUCCESS);
  ck_assert_int_eq(buf[0], 'z');
  ck_assert_uint_gt(need, 0);
  buf[0] = 'z';
  ck_assert_int_eq(rmmc_resource_status_string(spy, buf, 1, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(buf[0], '\0');
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_report_deep_stack_is_cut) {
  rmmc_resource_t *top;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &top), RMMC_SUCCESS);
  for (int i = 0; i < 70; i++) {
    rmmc_resource_t *next;
    ck_assert_int_eq(rmmc_thread_safe_adaptor_create(top, &next), RMMC_SUCCESS);
    rmmc_resource_release(top);
    top = next;
  }
  char *text = capture_stack(top);
  ck_assert_ptr_nonnull(strstr(text, "    64. thread_safe ["));
  ck_assert_ptr_null(strstr(text, "    65. "));
  ck_assert_ptr_nonnull(strstr(text, "    ... (more than 64 layers)\n"));
  free(text);
  rmmc_resource_release(top);
}
END_TEST

int main(void) {
  Suite *s = suite_create("report");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_report_lists_every_layer_with_figures);
  tcase_add_test(tc, test_report_users_resource_without_describe);
  tcase_add_test(tc, test_report_memory_status_of_a_device);
  tcase_add_test(tc, test_report_errors);
  tcase_add_test(tc, test_report_deep_stack_is_cut);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
