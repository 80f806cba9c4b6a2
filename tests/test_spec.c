/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stack specs: parsing, errors that point at the offending word, sizes,
 * building host stacks. Host suite.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

static void expect_parse_error(const char *spec, const char *needle, int column) {
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(r);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, needle) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, needle);
  char col[32];
  snprintf(col, sizeof col, "column %d", column);
  ck_assert_msg(strstr(m, col) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, col);
  ck_assert_msg(strchr(m, '^') != NULL, "no caret in '%s'", m);
  ck_assert_int_eq(rmmc_stack_validate(spec), RMMC_ERROR_PARSE);
}

START_TEST(test_spec_errors_point_at_the_word) {
  expect_parse_error("", "empty spec", 1);
  expect_parse_error("hots", "unknown resource 'hots'", 1);
  expect_parse_error("host > ", "base resource", 1);
  expect_parse_error("cuda > host", "cuda is a base resource", 1);
  expect_parse_error("managed(prefetch=maybe) > host", "'maybe' is not true or false", 18);
  expect_parse_error("managed(fetch=true)", "managed has no option 'fetch' (it takes: prefetch)", 9);
  expect_parse_error("managed(prefetch=true, prefetch=false)", "given twice", 24);
  expect_parse_error("managed(prefetch true)", "expected '='", 18);
  expect_parse_error("managed(prefetch=true", "expected ',' or ')'", 22);
  expect_parse_error("host host", "expected '>'", 6);
  expect_parse_error("cuda_async(initial=12XB)", "'12XB' is not a size", 20);
  expect_parse_error("cuda_async(initial=150%)", "percentage in (0, 100]", 20);
  ck_assert_int_eq(rmmc_stack_validate(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stack_create("host", -1, NULL), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_spec_valid_forms) {
  ck_assert_int_eq(rmmc_stack_validate("host"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("  host  "), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("host()"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("managed( prefetch = on )"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("cuda_async(initial=1.5GiB, release_threshold=80%)"), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_validate("cuda_async(default_pool=true)"), RMMC_SUCCESS);
}
END_TEST

START_TEST(test_spec_builds_host) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "host");
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  if (rmmc_device_count() == 0) {
    r = (rmmc_resource_t *)1;
    ck_assert_int_eq(rmmc_stack_create("cuda", -1, &r), RMMC_ERROR_NO_DEVICE);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "'cuda'"));
  }
}
END_TEST

START_TEST(test_parse_size) {
  size_t v;
  struct { const char *t; size_t v; } ok[] = {
      {"0", 0}, {"1024", 1024}, {"1B", 1}, {"64KiB", 65536}, {"64K", 65536},
      {"256MiB", 256u << 20}, {"1.5GiB", (size_t)3 << 29}, {"2TiB", (size_t)2 << 40}, {"1 GiB", 1u << 30}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ck_assert_int_eq(rmmc_parse_size(ok[i].t, &v), RMMC_SUCCESS);
    ck_assert_uint_eq(v, ok[i].v);
  }
  const char *bad[] = {"", "abc", "-1", "1.5", "12XB", "1GB", "99999999999TiB", "0.1B"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(rmmc_parse_size(bad[i], &v) == RMMC_ERROR_PARSE, "'%s' parsed", bad[i]);
  ck_assert_int_eq(rmmc_parse_size(NULL, &v), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

/* Issue 11, F5: a value of the right form outside what its option's type
 * holds is refused quoting what was written and saying "out of range";
 * values inside it are exact (no detour through a double). */
START_TEST(test_spec_out_of_range_values_are_quoted) {
  expect_parse_error("pool(max=99999999999999999999) > host",
                     "max=99999999999999999999 is out of range (sizes are below 16 EiB)", 10);
  expect_parse_error("pool(initial=16384PiB) > host", "'16384PiB' is not a size", 14);
  expect_parse_error("pool(initial=16777216TiB) > host",
                     "initial=16777216TiB is out of range (sizes are below 16 EiB)", 14);
  expect_parse_error("pool(min_growth=1e30) > host",
                     "min_growth=1e30 is out of range (sizes are below 16 EiB)", 17);
  expect_parse_error("pool(split_limit=1e999) > host",
                     "split_limit=1e999 is out of range (not a finite number)", 18);
  expect_parse_error("pool(event_interval=9223372036854775808) > host",
                     "event_interval=9223372036854775808 is out of range (integers are 64-bit)", 21);
  /* In the type's range, outside the layer's: the layer's message, exact. */
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("binning(bins=256B:99999999999999999999B) > host", -1, &r),
                   RMMC_ERROR_PARSE);
  ck_assert_msg(strstr(rmmc_last_error_message(), "'99999999999999999999B' is out of range"), "%s",
                rmmc_last_error_message());
  ck_assert_int_eq(rmmc_stack_create("pool(event_interval=4294967296) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), "event_interval=4294967296 is out of range"),
                "%s", rmmc_last_error_message());
  /* Exact above 2^53: a double would round these. */
  ck_assert_int_eq(rmmc_stack_create("sim(capacity=9007199254740993)", -1, &r), RMMC_SUCCESS);
  uint64_t v = 0;
  ck_assert(rmmc_resource_get_field(r, "limit", &v));
  ck_assert_uint_eq(v, UINT64_C(9007199254740993));
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=18446744073709551615) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(r, "limit", &v));
  ck_assert_uint_eq(v, UINT64_MAX);
  rmmc_resource_release(r);
  size_t z;
  ck_assert_int_eq(rmmc_parse_size("18446744073709551615", &z), RMMC_SUCCESS);
  ck_assert_uint_eq(z, SIZE_MAX);
  ck_assert_int_eq(rmmc_parse_size("16777215TiB", &z), RMMC_SUCCESS);
  ck_assert_uint_eq(z, (size_t)16777215 << 40);
  ck_assert_int_eq(rmmc_parse_size("18446744073709551616", &z), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "is out of range"));
  ck_assert_int_eq(rmmc_parse_size("12XB", &z), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "is not a size"));
}
END_TEST

/* Values are bounded by the spec's own length (4096), not by 255
 * characters: 64 bins of large sizes, a long logging path. */
START_TEST(test_spec_long_values) {
  char spec[4200];
  int n = snprintf(spec, sizeof spec, "binning(bins=");
  for (int i = 0; i < 64; i++)
    n += snprintf(spec + n, sizeof spec - (size_t)n, "%s%zuB", i ? ":" : "",
                  ((size_t)1 << 30) + (size_t)i * 65536);
  snprintf(spec + n, sizeof spec - (size_t)n, ") > host");
  ck_assert_uint_gt(strlen(spec), 700);
  rmmc_resource_t *r;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 64);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 63), ((size_t)1 << 30) + 63 * 65536);
  rmmc_resource_release(r);

  /* A logging path of about 900 characters, in nested directories. */
  char dir[1200];
  snprintf(dir, sizeof dir, "/tmp/rmmc_spec_long_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char top[1200];
  snprintf(top, sizeof top, "%s", dir);
  char made[8][1200];
  for (int i = 0; i < 8; i++) {
    size_t len = strlen(dir);
    dir[len++] = '/';
    memset(dir + len, 'a' + i, 100);
    dir[len + 100] = '\0';
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(made[i], sizeof made[i], "%s", dir);
  }
  char path[1300];
  snprintf(path, sizeof path, "%s/log.csv", dir);
  snprintf(spec, sizeof spec, "logging(path=\"%s\", flush=true) > host", path);
  ck_assert_uint_gt(strlen(path), 800);
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s", rmmc_last_error_message());
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char line[256];
  int lines = 0;
  while (fgets(line, sizeof line, f) != NULL) lines++;
  fclose(f);
  ck_assert_int_eq(lines, 3); /* header, allocate, free */
  ck_assert_int_eq(unlink(path), 0);
  for (int i = 7; i >= 0; i--) ck_assert_int_eq(rmdir(made[i]), 0);
  ck_assert_int_eq(rmdir(top), 0);

  /* The spec's own bound is still there, and says so. */
  memset(spec, ' ', 4097);
  memcpy(spec + 4093, "host", 5);
  ck_assert_int_eq(rmmc_stack_validate(spec), RMMC_ERROR_PARSE);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "longer than 4096 characters"));
}
END_TEST

START_TEST(test_stack_help_lists_everything) {
  size_t need = rmmc_stack_help(NULL, 0);
  ck_assert_uint_gt(need, 0);
  char *buf = malloc(need + 1);
  ck_assert_uint_eq(rmmc_stack_help(buf, need + 1), need);
  const char *names[] = {"cuda", "managed", "pinned", "cuda_async", "host"};
  for (size_t i = 0; i < 5; i++) ck_assert_ptr_nonnull(strstr(buf, names[i]));
  ck_assert_ptr_nonnull(strstr(buf, "prefetch"));
  char small[8];
  ck_assert_uint_eq(rmmc_stack_help(small, sizeof small), need);
  ck_assert_uint_eq(strlen(small), 7);
  free(buf);
}
END_TEST

/* Every figure describe reports for `spec` (a pool or arena over host
 * memory, unused), as "key=value" lines into buf. */
typedef struct {
  char *buf;
  size_t len, n;
} figures_text_t;

static void add_figure(void *ctx, const rmmc_field_t *f) {
  figures_text_t *t = ctx;
  int w = f->kind == RMMC_FIELD_TEXT
              ? snprintf(t->buf + t->n, t->len - t->n, "%s=%s\n", f->key, f->text)
              : snprintf(t->buf + t->n, t->len - t->n, "%s=%llu\n", f->key,
                         (unsigned long long)f->value);
  ck_assert_int_gt(w, 0);
  ck_assert_uint_lt(t->n + (size_t)w, t->len);
  t->n += (size_t)w;
}

static void figures_of(const char *spec, char *buf, size_t len) {
  rmmc_resource_t *r = NULL;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s: %s", spec,
                rmmc_last_error_message());
  figures_text_t t = {buf, len, 0};
  buf[0] = '\0';
  rmmc_resource_describe(r, add_figure, &t);
  rmmc_resource_release(r);
}

static void expect_same_stack(const char *a, const char *b) {
  static char fa[8192], fb[8192];
  figures_of(a, fa, sizeof fa);
  figures_of(b, fb, sizeof fb);
  ck_assert_msg(strcmp(fa, fb) == 0, "'%s' and '%s' differ:\n%s\n--\n%s", a, b, fa, fb);
}

static uint64_t figure(const char *spec, const char *key, bool *found) {
  rmmc_resource_t *r = NULL;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s: %s", spec,
                rmmc_last_error_message());
  uint64_t v = 0;
  *found = rmmc_resource_get_field(r, key, &v);
  rmmc_resource_release(r);
  return v;
}

/* Words specs took before the options had their members' names still
 * give the same options. */
START_TEST(test_spec_aliases_give_the_same_options) {
  expect_same_stack("pool(max=64MiB, cache=256KiB) > host",
                    "pool(maximum_size=64MiB, cache_size=256KiB) > host");
  expect_same_stack("arena(superblock=1MiB, max=64MiB) > host",
                    "arena(superblock_size=1MiB, max_size=64MiB) > host");
  bool found;
  ck_assert_uint_eq(figure("pool(max=64MiB) > host", "maximum_size", &found), 64 << 20);
  ck_assert(found);
  ck_assert_uint_eq(figure("pool(cache=256KiB) > host", "cache_size", &found), 256 << 10);
  ck_assert_uint_eq(figure("arena(superblock=1MiB) > host", "small_chunk", &found), 1 << 20);
  ck_assert_uint_eq(figure("arena(max_size=32MiB) > host", "maximum_size", &found), 32 << 20);
  ck_assert(found);
  /* One option under two names is given twice. */
  expect_parse_error("pool(max=1GiB, maximum_size=2GiB) > host",
                     "option 'maximum_size' given twice (as 'max' before", 16);
  expect_parse_error("arena(superblock_size=1MiB, superblock=2MiB) > host",
                     "option 'superblock' given twice (as 'superblock_size' before", 29);
  expect_parse_error("pool(cache=1MiB, cache=2MiB) > host", "option 'cache' given twice", 18);
  /* Messages quote the name as written. */
  expect_parse_error("pool(max=200%) > host", "'max' wants a percentage", 10);
  expect_parse_error("pool(maximum_size=200%) > host", "'maximum_size' wants a percentage", 19);
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("arena(superblock=32KiB) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "arena: superblock=32KiB is out of"));
  ck_assert_int_eq(rmmc_stack_create("arena(superblock_size=32KiB) > host", -1, &r),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "arena: superblock_size=32KiB is out"));
  /* An alias belongs to its layer: binning's max is its own option. */
  expect_parse_error("fixed_size(max=1MiB) > host", "fixed_size has no option 'max'", 12);
  /* A misspelled alias is suggested as written. */
  expect_parse_error("pool(mxa=1GiB) > host", "did you mean 'max'?", 6);
}
END_TEST

/* `none`: no limit, in the pool's and the arena's size limits alike,
 * whatever number their structs use for it. */
START_TEST(test_spec_none_is_no_limit) {
  const char *none[] = {"pool(max=none) > host", "pool(maximum_size=None) > host",
                        "arena(max=NONE) > host", "arena(max_size=none) > host"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    bool found = true;
    (void)figure(none[i], "maximum_size", &found);
    ck_assert_msg(!found, "%s: a maximum_size is reported", none[i]);
  }
  expect_same_stack("pool(max=none) > host", "pool > host");
  expect_same_stack("pool(max=0) > host", "pool > host");
  expect_same_stack("arena(max=none) > host", "arena > host");
  expect_same_stack("arena(max=18446744073709551615) > host", "arena > host");
  /* It is no size elsewhere. */
  expect_parse_error("pool(initial=none) > host", "'none' is not a size", 14);
  expect_parse_error("pool(cache_size=none) > host", "'none' is not a size", 17);
  expect_parse_error("pool(max=nothing) > host", "'nothing' is not a size", 10);
  /* A stack with none can take all its upstream serves. */
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(max=none, expandable=false) > host", -1, &r),
                   RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, (size_t)64 << 20, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, (size_t)64 << 20, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* The help names each option's aliases and `none`. */
START_TEST(test_spec_help_lists_aliases) {
  char buf[16384];
  ck_assert_int_eq(rmmc_stack_help_resource("pool", buf, sizeof buf, NULL), RMMC_SUCCESS);
  const char *line = strstr(buf, "\n  maximum_size ");
  ck_assert_ptr_nonnull(line);
  const char *end = strchr(line + 1, '\n');
  ck_assert_ptr_nonnull(strstr(line, "(also written max; none: no limit)\n"));
  ck_assert(strstr(line, "(also written max; none: no limit)\n") + 35 == end + 1);
  ck_assert_ptr_nonnull(strstr(buf, "(also written cache)\n"));
  ck_assert_int_eq(rmmc_stack_help_resource("arena", buf, sizeof buf, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(strstr(buf, "(also written superblock)\n"));
  ck_assert_ptr_nonnull(strstr(buf, "(also written max; none: no limit)\n"));
  ck_assert_int_eq(rmmc_stack_help_resource("binning", buf, sizeof buf, NULL), RMMC_SUCCESS);
  ck_assert_ptr_null(strstr(buf, "also written"));
}
END_TEST

/* The pool's figures named after its options; the keys they had before
 * still find them through get_field. */
START_TEST(test_spec_renamed_figures_found_by_old_keys) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(maximum_size=64MiB, small_chunk=128KiB, small_max=64KiB, "
                                     "cache_size=256KiB) > host",
                                     -1, &r),
                   RMMC_SUCCESS);
  const char *keys[][2] = {{"maximum_size", "limit"},
                           {"small_chunk", "span_size"},
                           {"cache_size", "heap_cache"}};
  const uint64_t want[] = {64 << 20, 128 << 10, 256 << 10};
  for (size_t i = 0; i < 3; i++) {
    uint64_t now = 0, old = 0;
    ck_assert(rmmc_resource_get_field(r, keys[i][0], &now));
    ck_assert(rmmc_resource_get_field(r, keys[i][1], &old));
    ck_assert_uint_eq(now, want[i]);
    ck_assert_uint_eq(old, want[i]);
  }
  rmmc_resource_release(r);
  /* An unlimited pool has neither; the limiting adaptor keeps its own limit. */
  ck_assert_int_eq(rmmc_stack_create("pool > host", -1, &r), RMMC_SUCCESS);
  uint64_t v = 7;
  ck_assert(!rmmc_resource_get_field(r, "limit", &v));
  ck_assert(!rmmc_resource_get_field(r, "maximum_size", &v));
  ck_assert_uint_eq(v, 7);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=1MiB) > pool(max=4MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(r, "limit", &v));
  ck_assert_uint_eq(v, 1 << 20);
  ck_assert(!rmmc_resource_get_field(r, "maximum_size", &v));
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_spec_errors_point_at_the_word);
  tcase_add_test(tc, test_spec_valid_forms);
  tcase_add_test(tc, test_spec_builds_host);
  tcase_add_test(tc, test_parse_size);
  tcase_add_test(tc, test_stack_help_lists_everything);
  tcase_add_test(tc, test_spec_out_of_range_values_are_quoted);
  tcase_add_test(tc, test_spec_long_values);
  tcase_add_test(tc, test_spec_aliases_give_the_same_options);
  tcase_add_test(tc, test_spec_none_is_no_limit);
  tcase_add_test(tc, test_spec_help_lists_aliases);
  tcase_add_test(tc, test_spec_renamed_figures_found_by_old_keys);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
