/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process default from the environment, on the CPU:
 * rmmc_default_config_resolve() (a pure function of the two variables) on
 * good, blank and broken values, the resolved spec built as a host stack,
 * and, in a fresh process per test (Check's fork mode), the environment
 * read once with a broken value reported once on stderr and through
 * rmmc_default_config_status(), strict lookups (the parse status from the
 * registry and the plug-ins) unless RMMC_ALLOC_CONF_FALLBACK=1, PyTorch's
 * syntax recognised, and rmmc_set_default_spec(). Host suite.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

static void expect_resolves(const char *conf, const char *no_caching, const char *spec) {
  char buf[256];
  rmmc_status_t st = rmmc_default_config_resolve(conf, no_caching, buf, sizeof buf);
  ck_assert_msg(st == RMMC_SUCCESS, "'%s'/'%s': %s", conf ? conf : "(unset)",
                no_caching ? no_caching : "(unset)", rmmc_last_error_message());
  ck_assert_str_eq(buf, spec);
}

static void expect_fallback(const char *conf, const char *no_caching, const char *needle) {
  char buf[256] = "garbage";
  ck_assert_int_eq(rmmc_default_config_resolve(conf, no_caching, buf, sizeof buf), RMMC_ERROR_PARSE);
  ck_assert_str_eq(buf, RMMC_DEFAULT_SPEC);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, needle) != NULL, "message '%s' lacks '%s'", m, needle);
}

START_TEST(test_defaults_resolve_good_and_blank) {
  expect_resolves(NULL, NULL, "cuda");
  expect_resolves("", NULL, "cuda");
  expect_resolves("  \t ", "", "cuda");
  expect_resolves("host", NULL, "host");
  expect_resolves("cuda_async(initial=1GiB, release_threshold=80%)", NULL,
                  "cuda_async(initial=1GiB, release_threshold=80%)");
  expect_resolves("managed(prefetch=true)", "0", "managed(prefetch=true)");
  expect_resolves("host", "off", "host");
  expect_resolves("host", "No", "host");
  /* RMMC_NO_CACHING wins over any spec. */
  expect_resolves("host", "1", "cuda");
  expect_resolves("cuda_async", "TRUE", "cuda");
  expect_resolves("managed", "yes", "cuda");
  expect_resolves("nonsense >", "on", "cuda"); /* not even parsed */
}
END_TEST

START_TEST(test_defaults_resolve_reports_bad_values) {
  expect_fallback("hots", NULL, "RMMC_ALLOC_CONF is not a valid stack spec");
  expect_fallback("hots", NULL, "unknown resource 'hots'");
  expect_fallback("cuda > host", NULL, "cuda is a base resource");
  expect_fallback("cuda_async(initial=12XB)", "0", "^");
  expect_fallback("host", "maybe", "RMMC_NO_CACHING=\"maybe\" is not a switch");
  /* Buffers too small and NULLs. */
  char small[8];
  ck_assert_int_eq(rmmc_default_config_resolve("host", NULL, NULL, 10), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_default_config_resolve("host", NULL, small, 3), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_default_config_resolve("cuda_async(initial=1GiB)", NULL, small, sizeof small),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "needs 25 bytes"));
  ck_assert_int_eq(rmmc_default_config_resolve("managed", NULL, small, sizeof small), RMMC_SUCCESS);
  ck_assert_str_eq(small, "managed");
}
END_TEST

START_TEST(test_defaults_resolved_spec_builds_a_host_stack) {
  char spec[128];
  ck_assert_int_eq(rmmc_default_config_resolve(" host ", "0", spec, sizeof spec), RMMC_SUCCESS);
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(spec, 0, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "host");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  memset(p, 0x3c, 4096);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* The environment is read once per process: these run only when Check
 * forks a fresh process for each test. */
static bool forked(void) {
  const char *f = getenv("CK_FORK");
  return f == NULL || strcmp(f, "no") != 0;
}

/* Sends stderr to a fresh temporary file; returns its descriptor. */
static int capture_stderr(void) {
  char path[] = "/tmp/rmmc_test_stderr_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  fflush(stderr);
  ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
  return fd;
}

static char *read_all(int fd) {
  static char buf[8192];
  fflush(stderr);
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  ck_assert_int_ge(n, 0);
  buf[n] = '\0';
  return buf;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

START_TEST(test_defaults_environment_broken_spec_reported_once) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "pool > hots", 1);
  unsetenv("RMMC_NO_CACHING");
  int fd = capture_stderr();
  const char *spec = NULL, *message = NULL;
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_ERROR_PARSE);
  ck_assert_str_eq(spec, "cuda");
  ck_assert_ptr_nonnull(strstr(message, "RMMC_ALLOC_CONF is not a valid stack spec"));
  /* Asking again reads nothing and prints nothing more. */
  setenv("RMMC_ALLOC_CONF", "host", 1);
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_ERROR_PARSE);
  ck_assert_str_eq(spec, "cuda");
  const char *out = read_all(fd);
  ck_assert_int_eq(count_of(out, "rmmc: RMMC_ALLOC_CONF is not a valid stack spec"), 1);
  ck_assert_int_eq(count_of(out, "plain cuda resource instead"), 1);
  ck_assert_ptr_nonnull(strstr(out, "^"));
  close(fd);
}
END_TEST

START_TEST(test_defaults_environment_good_spec_is_quiet) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "managed(prefetch=true)", 1);
  setenv("RMMC_NO_CACHING", "0", 1);
  int fd = capture_stderr();
  const char *spec = NULL, *message = NULL;
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "managed(prefetch=true)");
  ck_assert_str_eq(message, "");
  ck_assert_str_eq(read_all(fd), "");
  close(fd);
}
END_TEST

START_TEST(test_defaults_environment_no_caching_wins) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "cuda_async(initial=1GiB)", 1);
  setenv("RMMC_NO_CACHING", "1", 1);
  const char *spec = NULL;
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "cuda");
}
END_TEST

START_TEST(test_defaults_environment_bad_switch) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "host", 1);
  setenv("RMMC_NO_CACHING", "sometimes", 1);
  int fd = capture_stderr();
  const char *spec = NULL, *message = NULL;
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_ERROR_PARSE);
  ck_assert_str_eq(spec, "cuda");
  ck_assert_ptr_nonnull(strstr(message, "RMMC_NO_CACHING=\"sometimes\""));
  ck_assert_int_eq(count_of(read_all(fd), "RMMC_NO_CACHING"), 1);
  close(fd);
}
END_TEST

/* Strict by default: a broken RMMC_ALLOC_CONF makes every lookup that would
 * build a default return the parse status, GPU or not, and the plug-ins
 * hand out nothing and say why. */
START_TEST(test_defaults_strict_lookups_fail_with_the_parse_status) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "pool > hots", 1);
  unsetenv("RMMC_NO_CACHING");
  unsetenv("RMMC_ALLOC_CONF_FALLBACK");
  int fd = capture_stderr();
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_allocate(1024, NULL, &p), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(p);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "RMMC_ALLOC_CONF is not a valid stack spec"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "unknown resource 'hots'"));
  rmmc_clear_last_error();
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_get_device_resource(0, &r), RMMC_ERROR_PARSE); /* again, not once */
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "RMMC_ALLOC_CONF is not a valid stack spec"));
  rmmc_plugin_reset_stats();
  ck_assert_ptr_null(rmmc_torch_alloc(4096, 0, NULL));
  char why[2048];
  rmmc_plugin_last_error(why, sizeof why);
  ck_assert_ptr_nonnull(strstr(why, "RMMC_ALLOC_CONF is not a valid stack spec"));
  rmmc_plugin_stats_t st = RMMC_PLUGIN_STATS_INIT;
  ck_assert_int_eq(rmmc_plugin_get_stats(0, &st), RMMC_SUCCESS);
  ck_assert_uint_eq(st.allocation_failures, 1);
  const char *out = read_all(fd);
  ck_assert_int_eq(count_of(out, "rmmc: RMMC_ALLOC_CONF is not a valid stack spec"), 1);
  ck_assert_int_eq(count_of(out, "allocations through the registry fail with this error"), 1);
  /* A resource set explicitly is used: the configuration only concerns defaults. */
  rmmc_resource_t *host;
  ck_assert_int_eq(rmmc_host_resource_create(&host), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, host, NULL), RMMC_SUCCESS);
  rmmc_resource_release(host);
  ck_assert_int_eq(rmmc_get_device_resource(0, &r), RMMC_SUCCESS);
  ck_assert_ptr_eq(r, host);
  rmmc_registry_clear();
  close(fd);
}
END_TEST

/* RMMC_ALLOC_CONF_FALLBACK=1: the old behaviour, the plain cuda resource
 * (NO_DEVICE without a GPU), said once on stderr. */
START_TEST(test_defaults_fallback_is_an_explicit_opt_in) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "pool > hots", 1);
  setenv("RMMC_ALLOC_CONF_FALLBACK", "1", 1);
  unsetenv("RMMC_NO_CACHING");
  int fd = capture_stderr();
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_get_device_resource(0, &r);
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(st, RMMC_ERROR_NO_DEVICE);
  } else {
    ck_assert_int_eq(st, RMMC_SUCCESS);
    ck_assert_str_eq(rmmc_resource_name(r), "cuda");
  }
  const char *spec;
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_ERROR_PARSE);
  ck_assert_str_eq(spec, "cuda");
  ck_assert_int_eq(count_of(read_all(fd), "every device uses the plain cuda resource instead "
                                          "(RMMC_ALLOC_CONF_FALLBACK=1)"),
                   1);
  close(fd);
}
END_TEST

START_TEST(test_defaults_fallback_switch_must_parse) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "host", 1);
  setenv("RMMC_ALLOC_CONF_FALLBACK", "perhaps", 1);
  int fd = capture_stderr();
  const char *spec, *message;
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(message, "RMMC_ALLOC_CONF_FALLBACK=\"perhaps\" is not a switch"));
  void *p;
  ck_assert_int_eq(rmmc_allocate(64, NULL, &p), RMMC_ERROR_PARSE); /* strict, since not opted in */
  close(fd);
}
END_TEST

/* PyTorch's syntax is recognised, and the message gives the rmmc spelling,
 * which must itself parse; every option a note names must exist. */
START_TEST(test_defaults_pytorch_syntax_names_the_rmmc_spelling) {
  expect_fallback("expandable_segments:True", NULL, "RMMC_ALLOC_CONF='pool > cuda'");
  expect_fallback("expandable_segments:True", NULL, "what pool > cuda does by default");
  expect_fallback("expandable_segments:True", NULL, "PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax");
  expect_fallback("backend:cudaMallocAsync, max_split_size_mb:128,frobnicate:1", NULL,
                  "RMMC_ALLOC_CONF='cuda_async'");
  expect_fallback("backend:cudaMallocAsync,max_split_size_mb:128,frobnicate:1", NULL,
                  "max_split_size_mb has no rmmc option: the pool's split_limit");
  expect_fallback("backend:cudaMallocAsync,max_split_size_mb:128,frobnicate:1", NULL,
                  "'frobnicate' is not a PyTorch option rmmc knows");
  expect_fallback("garbage_collection_threshold:0.6", NULL, "RMMC_ALLOC_CONF='pool > cuda'");
  expect_fallback("garbage_collection_threshold:0.6", NULL, "the pool's gc_threshold");
  expect_fallback("roundup_power2_divisions:4", NULL, "binning > pool > cuda");
  /* Not PyTorch's syntax: no hint. */
  char buf[64];
  ck_assert_int_eq(rmmc_default_config_resolve("pool > hots", NULL, buf, sizeof buf), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(strstr(rmmc_last_error_message(), "PyTorch"));
  ck_assert_int_eq(rmmc_default_config_resolve("pool:3 > cuda", NULL, buf, sizeof buf), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(strstr(rmmc_last_error_message(), "PyTorch"));
  const char *named[] = {"pool(expandable=false) > cuda", "cuda_async", "pool > cuda",
                         "pool(gc_threshold=0.6) > cuda",
                         "pool(split_limit=8) > cuda", "pool(release_slack=0.05) > cuda",
                         "binning > pool > cuda"};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    ck_assert_msg(rmmc_stack_validate(named[i]) == RMMC_SUCCESS, "%s: %s", named[i],
                  rmmc_last_error_message());
}
END_TEST

/* rmmc_set_default_spec(): replaces the environment's spec (a broken one
 * too), refuses what does not parse, and RMMC_NO_CACHING still wins. */
START_TEST(test_defaults_set_default_spec_replaces_the_environment) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "pool > hots", 1);
  unsetenv("RMMC_NO_CACHING");
  unsetenv("RMMC_ALLOC_CONF_FALLBACK");
  int fd = capture_stderr();
  const char *spec, *message;
  ck_assert_int_eq(rmmc_set_default_spec(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_set_default_spec("expandable_segments:True"), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "set_default_spec is not a valid stack spec"));
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "'pool > cuda'"));
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_ERROR_PARSE); /* unchanged */
  ck_assert_int_eq(rmmc_set_default_spec("statistics > pool > cuda"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "statistics > pool > cuda");
  ck_assert_str_eq(message, "");
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_get_device_resource(0, &r);
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(st, RMMC_ERROR_NO_DEVICE); /* no longer the parse error */
  } else {
    ck_assert_int_eq(st, RMMC_SUCCESS);
    ck_assert_str_eq(rmmc_resource_name(r), "statistics");
    rmmc_registry_clear();
  }
  close(fd);
}
END_TEST

START_TEST(test_defaults_set_default_spec_yields_to_no_caching) {
  if (!forked()) return;
  unsetenv("RMMC_ALLOC_CONF");
  setenv("RMMC_NO_CACHING", "1", 1);
  const char *spec;
  ck_assert_int_eq(rmmc_set_default_spec("pool > cuda"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "cuda");
}
END_TEST

/* ---- one spec per device ---- */

static void expect_device_spec(const char *conf, int device, const char *spec) {
  char buf[256] = "garbage";
  rmmc_status_t st = rmmc_default_config_device_spec(conf, device, buf, sizeof buf);
  ck_assert_msg(st == RMMC_SUCCESS, "'%s', device %d: %s", conf, device, rmmc_last_error_message());
  ck_assert_msg(strcmp(buf, spec) == 0, "'%s', device %d: '%s', not '%s'", conf, device, buf, spec);
}

static void expect_per_device_error(const char *conf, const char *needle) {
  char buf[256] = "garbage";
  ck_assert_int_eq(rmmc_default_config_resolve(conf, NULL, buf, sizeof buf), RMMC_ERROR_PARSE);
  ck_assert_str_eq(buf, RMMC_DEFAULT_SPEC);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s': '%s' lacks '%s'", conf,
                rmmc_last_error_message(), needle);
  ck_assert_int_eq(rmmc_default_config_device_spec(conf, 0, buf, sizeof buf), RMMC_ERROR_PARSE);
  ck_assert_str_eq(buf, "");
}

START_TEST(test_defaults_per_device_items) {
  /* One spec: every device. */
  for (int d = 0; d < 64; d += 21) expect_device_spec("pool > host", d, "pool > host");
  expect_device_spec("", 5, "cuda");
  /* Items: named devices, every other device, devices named nowhere. */
  const char *conf = "statistics > pool > host; 1: pool(max=40GiB) > cuda ; 3-4,6 : host";
  expect_resolves(conf, NULL, conf);
  expect_device_spec(conf, 0, "statistics > pool > host");
  expect_device_spec(conf, 1, "pool(max=40GiB) > cuda");
  expect_device_spec(conf, 2, "statistics > pool > host");
  expect_device_spec(conf, 3, "host");
  expect_device_spec(conf, 4, "host");
  expect_device_spec(conf, 5, "statistics > pool > host");
  expect_device_spec(conf, 6, "host");
  expect_device_spec(conf, 63, "statistics > pool > host");
  const char *named = "0: pool > cuda; 2: cuda_async;";
  expect_device_spec(named, 0, "pool > cuda");
  expect_device_spec(named, 1, "cuda");
  expect_device_spec(named, 2, "cuda_async");
  expect_device_spec("*: host; 1: sim", 0, "host");
  expect_device_spec("1: sim; *: host", 1, "sim");
  expect_device_spec("1: sim; *: host", 7, "host");
  /* ';' inside a quoted option value is not a separator. */
  expect_device_spec("0: logging(path=\"/tmp/a;b\") > host; 1: host", 0,
                     "logging(path=\"/tmp/a;b\") > host");
  /* Arguments. */
  char buf[8];
  ck_assert_int_eq(rmmc_default_config_device_spec(conf, 64, buf, sizeof buf),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_default_config_device_spec(conf, -1, buf, sizeof buf),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_default_config_device_spec(conf, 0, buf, sizeof buf),
                   RMMC_ERROR_INVALID_ARGUMENT); /* 24 bytes do not fit */
  ck_assert_int_eq(rmmc_default_config_device_spec(NULL, 0, buf, sizeof buf),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_default_config_device_spec(conf, 0, NULL, 8), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_defaults_per_device_errors) {
  expect_per_device_error("0,2: host; 1-3: cuda", "names device 2 in two items");
  expect_per_device_error("0: host; 0: cuda", "names device 0 in two items");
  expect_per_device_error("0-0,0: host", "names device 0 twice");
  expect_per_device_error("host; cuda", "two items for every device");
  expect_per_device_error("*: host; pool > host", "two items for every device");
  expect_per_device_error("0 host", "`DEVICES: SPEC`");
  expect_per_device_error("3-1: host", "LOW <= HIGH");
  expect_per_device_error("64: host", "device 64 is past the last one rmmc tracks (63)");
  expect_per_device_error("1:", "no spec after ':'");
  expect_per_device_error("1: hots; host", "item `1:`");
  expect_per_device_error("1: hots; host", "did you mean 'host'");
  expect_per_device_error("host; 1: pool > hots", "unknown resource 'hots'");
  expect_per_device_error("cuda; 2: hots", "(item `2:`) is not a valid stack spec");
  expect_per_device_error("pool > host; 0: expandable_segments:True",
                          "PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax");
}
END_TEST

/* The environment's per-device value: read once, reported whole, and a
 * device's default built from its item (on a GPU: device 0's). */
START_TEST(test_defaults_environment_per_device) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "1: cuda; statistics > pool > cuda", 1);
  unsetenv("RMMC_NO_CACHING");
  unsetenv("RMMC_ALLOC_CONF_FALLBACK");
  const char *spec, *message;
  ck_assert_int_eq(rmmc_default_config_status(&spec, &message), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "1: cuda; statistics > pool > cuda");
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = rmmc_get_device_resource(0, &r);
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(st, RMMC_ERROR_NO_DEVICE);
  } else {
    ck_assert_int_eq(st, RMMC_SUCCESS);
    ck_assert_str_eq(rmmc_resource_name(r), "statistics");
    rmmc_registry_clear();
  }
  /* From code: per-device items too. */
  ck_assert_int_eq(rmmc_set_default_spec("0: pool > cuda; 1: hots"), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "set_default_spec (item `1:`)"));
  ck_assert_int_eq(rmmc_set_default_spec("0: pool > cuda; 1: cuda"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_default_config_status(&spec, NULL), RMMC_SUCCESS);
  ck_assert_str_eq(spec, "0: pool > cuda; 1: cuda");
}
END_TEST

START_TEST(test_defaults_environment_per_device_broken) {
  if (!forked()) return;
  setenv("RMMC_ALLOC_CONF", "0: pool > cuda; 0: cuda", 1);
  unsetenv("RMMC_NO_CACHING");
  unsetenv("RMMC_ALLOC_CONF_FALLBACK");
  int fd = capture_stderr();
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  /* Device 3 is a host stack's id without a GPU; with one, only a real
   * device gets as far as the configuration. */
  int dev = rmmc_device_count() > 0 ? 0 : 3;
  ck_assert_int_eq(rmmc_get_device_resource(dev, &r), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "names device 0 in two items"));
  ck_assert_ptr_null(rmmc_torch_alloc(100, 0, NULL));
  close(fd);
}
END_TEST

int main(void) {
  Suite *s = suite_create("defaults");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_defaults_resolve_good_and_blank);
  tcase_add_test(tc, test_defaults_resolve_reports_bad_values);
  tcase_add_test(tc, test_defaults_resolved_spec_builds_a_host_stack);
  tcase_add_test(tc, test_defaults_environment_broken_spec_reported_once);
  tcase_add_test(tc, test_defaults_environment_good_spec_is_quiet);
  tcase_add_test(tc, test_defaults_environment_no_caching_wins);
  tcase_add_test(tc, test_defaults_environment_bad_switch);
  tcase_add_test(tc, test_defaults_strict_lookups_fail_with_the_parse_status);
  tcase_add_test(tc, test_defaults_fallback_is_an_explicit_opt_in);
  tcase_add_test(tc, test_defaults_fallback_switch_must_parse);
  tcase_add_test(tc, test_defaults_pytorch_syntax_names_the_rmmc_spelling);
  tcase_add_test(tc, test_defaults_set_default_spec_replaces_the_environment);
  tcase_add_test(tc, test_defaults_set_default_spec_yields_to_no_caching);
  tcase_add_test(tc, test_defaults_per_device_items);
  tcase_add_test(tc, test_defaults_per_device_errors);
  tcase_add_test(tc, test_defaults_environment_per_device);
  tcase_add_test(tc, test_defaults_environment_per_device_broken);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
