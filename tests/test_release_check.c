/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RMMC_CHECK_RELEASE=1 (issue 14): releasing the last reference to a stack
 * whose blocks are still out says so once on stderr, naming the outermost
 * layer with live blocks and their count and bytes; a clean release, or no
 * RMMC_CHECK_RELEASE, prints nothing (rmmc never prints unless asked). The
 * environment is read once per process: Check's fork mode gives each test
 * its own. Host suite.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

static bool forked(void) {
  const char *f = getenv("CK_FORK");
  return f == NULL || strcmp(f, "no") != 0;
}

/* Sends stderr to a fresh temporary file; returns its descriptor. */
static int capture_stderr(void) {
  char path[] = "/tmp/rmmc_test_release_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  fflush(stderr);
  ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
  return fd;
}

static const char *read_all(int fd) {
  static char buf[8192];
  fflush(stderr);
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  ck_assert_int_ge(n, 0);
  buf[n] = '\0';
  return buf;
}

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static rmmc_resource_t *stack(const char *spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  return r;
}

START_TEST(test_release_check_reports_live_blocks_once) {
  if (!forked()) return;
  setenv("RMMC_CHECK_RELEASE", "1", 1);
  int fd = capture_stderr();
  rmmc_resource_t *r = stack("statistics > pool > host");
  void *a, *b;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 3000, 256, NULL, &b), RMMC_SUCCESS);
  rmmc_resource_release(r);
  const char *out = read_all(fd);
  ck_assert_int_eq(lines(out), 1); /* the statistics layer, not the pool again */
  ck_assert_msg(strstr(out, "rmmc: releasing the last reference to a statistics resource with "
                            "2 blocks, 3.91 KiB still allocated through it") != NULL,
                "%s", out);
  close(fd);
}
END_TEST

START_TEST(test_release_check_names_the_outermost_layer_with_blocks) {
  if (!forked()) return;
  setenv("RMMC_CHECK_RELEASE", "1", 1);
  int fd = capture_stderr();
  /* Blocks taken from the pool directly, under a statistics layer that saw none. */
  rmmc_resource_t *top = stack("statistics > pool > host");
  rmmc_resource_t *pool = rmmc_resource_upstream(top);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(pool, 512, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_resource_release(top);
  const char *out = read_all(fd);
  ck_assert_int_eq(lines(out), 1);
  ck_assert_msg(strstr(out, "a pool resource with 512 B still allocated") != NULL, "%s", out);
  close(fd);
}
END_TEST

START_TEST(test_release_check_quiet_when_clean_or_not_asked) {
  if (!forked()) return;
  setenv("RMMC_CHECK_RELEASE", "1", 1);
  int fd = capture_stderr();
  rmmc_resource_t *r = stack("statistics > pool > host");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_resource_t *extra = rmmc_resource_retain(r);
  rmmc_resource_release(r); /* not the last reference: nothing */
  ck_assert_str_eq(read_all(fd), "");
  ck_assert_int_eq(rmmc_resource_deallocate(extra, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(extra); /* last, but clean */
  ck_assert_str_eq(read_all(fd), "");
  close(fd);
}
END_TEST

START_TEST(test_release_check_off_by_default) {
  if (!forked()) return;
  unsetenv("RMMC_CHECK_RELEASE");
  int fd = capture_stderr();
  rmmc_resource_t *r = stack("pool > host");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_str_eq(read_all(fd), "");
  close(fd);
}
END_TEST

int main(void) {
  Suite *s = suite_create("release_check");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_release_check_reports_live_blocks_once);
  tcase_add_test(tc, test_release_check_names_the_outermost_layer_with_blocks);
  tcase_add_test(tc, test_release_check_quiet_when_clean_or_not_asked);
  tcase_add_test(tc, test_release_check_off_by_default);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
