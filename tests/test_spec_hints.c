/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the stack-spec parser tells a person who got a spec slightly wrong
 * (issue 14): "did you mean" for a misspelled resource or option (and no
 * guess for a word close to nothing), a space between a size and its unit
 * accepted (initial=64 MiB, max=80 %), and decimal units (1GB) refused with
 * what to write instead. Host suite.
 */
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"

static const char *parse_message(const char *spec) {
  ck_assert_msg(rmmc_stack_validate(spec) == RMMC_ERROR_PARSE, "'%s' parsed", spec);
  return rmmc_last_error_message();
}

static void expect_in(const char *hay, const char *needle) {
  ck_assert_msg(strstr(hay, needle) != NULL, "'%s' lacks '%s'", hay, needle);
}

START_TEST(test_spec_hints_did_you_mean_a_resource) {
  expect_in(parse_message("pool > hots"), "unknown resource 'hots'; did you mean 'host'?");
  expect_in(parse_message("pol > cuda"), "unknown resource 'pol'; did you mean 'pool'?");
  expect_in(parse_message("statistcs > pool > host"), "did you mean 'statistics'?");
  expect_in(parse_message("Binning > pool > host"), "did you mean 'binning'?");
  expect_in(parse_message("cuda_asnyc"), "did you mean 'cuda_async'?");
  const char *far = parse_message("frobnicator > host");
  expect_in(far, "unknown resource 'frobnicator' (rmmc-bench --list or Python's "
                 "rmmc.stack_help() names them all)");
  ck_assert_ptr_null(strstr(far, "did you mean"));
  /* The caret still points at the word. */
  expect_in(parse_message("pool > hots"), "\n  pool > hots\n         ^^^^");
}
END_TEST

START_TEST(test_spec_hints_did_you_mean_an_option) {
  expect_in(parse_message("pool(inital=1GiB) > host"),
            "pool has no option 'inital'; did you mean 'initial'?");
  expect_in(parse_message("limiting(limt=1GiB) > host"), "did you mean 'limit'?");
  const char *far = parse_message("pool(colour=blue) > host");
  expect_in(far, "pool has no option 'colour' (it takes: initial, maximum_size, ");
  ck_assert_ptr_null(strstr(far, "did you mean"));
}
END_TEST

/* The pool's whole option list, with its last name whole (a fixed buffer
 * once cut it at "release_ba"), with and without a guess. */
START_TEST(test_spec_hints_option_list_is_whole) {
  expect_in(parse_message("pool(colour=blue) > host"),
            ", checkpoint_every, release_band) at column 6");
  expect_in(parse_message("pool(inital=1GiB) > host"),
            "did you mean 'initial'? (it takes: initial, maximum_size, min_growth, ");
  expect_in(parse_message("pool(inital=1GiB) > host"), "checkpoint_every, release_band) at column 6");
}
END_TEST

START_TEST(test_spec_hints_space_before_a_unit) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("pool(initial = 64 MiB , max=1 GiB) > host", -1, &r),
                   RMMC_SUCCESS);
  uint64_t reserved = 0;
  ck_assert(rmmc_resource_get_field(r, "reserved", &reserved));
  ck_assert_uint_ge(reserved, 64u << 20);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_validate("limiting(limit=50 %) > host"), RMMC_SUCCESS);
  size_t v;
  ck_assert_int_eq(rmmc_parse_size("64 MiB", &v), RMMC_SUCCESS);
  ck_assert_uint_eq(v, 64u << 20);
  ck_assert_int_eq(rmmc_parse_size("1.5\tGiB", &v), RMMC_SUCCESS);
  ck_assert_uint_eq(v, (size_t)3 << 29);
  /* Two numbers are still two words. */
  expect_in(parse_message("pool(initial=64 128) > host"), "expected ',' or ')'");
  expect_in(parse_message("pool(initial=64 MiB MiB) > host"), "expected ',' or ')'");
}
END_TEST

START_TEST(test_spec_hints_decimal_units_refused) {
  const char *units[] = {"1KB", "1MB", "1GB", "2TB", "64 MB"};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    size_t v = 7;
    ck_assert_int_eq(rmmc_parse_size(units[i], &v), RMMC_ERROR_PARSE);
    ck_assert_uint_eq(v, 7);
    expect_in(rmmc_last_error_message(), "refused as ambiguous: sizes are binary, so write KiB");
  }
  expect_in(parse_message("pool(initial=1GB) > host"), "'1GB' is not a size");
  expect_in(parse_message("pool(initial=1GB) > host"), "write KiB, MiB, GiB or TiB");
  /* Not a decimal unit: no such hint. */
  size_t v;
  ck_assert_int_eq(rmmc_parse_size("12XB", &v), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(strstr(rmmc_last_error_message(), "ambiguous"));
  ck_assert_int_eq(rmmc_parse_size("1G", &v), RMMC_SUCCESS); /* documented: K, M, G, T are binary */
  ck_assert_uint_eq(v, 1u << 30);
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec_hints");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_spec_hints_did_you_mean_a_resource);
  tcase_add_test(tc, test_spec_hints_did_you_mean_an_option);
  tcase_add_test(tc, test_spec_hints_option_list_is_whole);
  tcase_add_test(tc, test_spec_hints_space_before_a_unit);
  tcase_add_test(tc, test_spec_hints_decimal_units_refused);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
