/*
 * Stack specs: parsing, errors that point at the offending word, sizes,
 * building host stacks. Host suite.
 */
#include <string.h>

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

int main(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_spec_errors_point_at_the_word);
  tcase_add_test(tc, test_spec_valid_forms);
  tcase_add_test(tc, test_spec_builds_host);
  tcase_add_test(tc, test_parse_size);
  tcase_add_test(tc, test_stack_help_lists_everything);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
