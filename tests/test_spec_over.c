/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layers built over an existing resource object (rmmc_stack_create_over,
 * issue 30: what Python's rmmc.mr classes compose with) and one resource's
 * manual (rmmc_stack_help_resource, behind rmmc.stack_help("pool")). The
 * new stack must hold its upstream exactly as long as it lives, take its
 * memory from it, and a failed build must leave the upstream as it was.
 * Host suite.
 */
#include <stdlib.h>
#include <string.h>

#include "faulty.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

static void expect_in(const char *hay, const char *needle) {
  ck_assert_msg(strstr(hay, needle) != NULL, "'%s' lacks '%s'", hay, needle);
}

START_TEST(test_spec_over_builds_on_the_object) {
  rmmc_resource_t *base;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &base), RMMC_SUCCESS);
  spy_t *spy = spy_of(base);
  long refs = rmmc_resource_refcount(base);
  rmmc_resource_t *top = NULL;
  ck_assert_int_eq(rmmc_stack_create_over("statistics > pool(initial=1MiB, small_max=0)", base,
                                          &top),
                   RMMC_SUCCESS);
  ck_assert_ptr_nonnull(top);
  ck_assert_str_eq(rmmc_resource_name(top), "statistics");
  rmmc_resource_t *pool = rmmc_resource_upstream(top);
  ck_assert_str_eq(rmmc_resource_name(pool), "pool");
  ck_assert_ptr_eq(rmmc_resource_upstream(pool), base);
  ck_assert_int_eq(rmmc_resource_refcount(base), refs + 1);
  /* The pool reserved its initial chunk from the spy, and serves from it. */
  spy_counts_t c = spy_counts(spy);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_uint_ge(c.outstanding_bytes, 1u << 20);
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(top, 4096, 256, NULL, &p), RMMC_SUCCESS);
  memset(p, 0x5a, 4096);
  ck_assert_uint_eq(spy_counts(spy).allocate_calls, c.allocate_calls);
  uint64_t in_use = 0;
  ck_assert(rmmc_resource_get_field(top, "in_use", &in_use));
  ck_assert_uint_eq(in_use, 4096);
  ck_assert_int_eq(rmmc_resource_deallocate(top, p, 4096, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(top);
  /* The stack gave its chunk back and dropped its reference. */
  ck_assert_uint_eq(spy_counts(spy).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(base), refs);
  rmmc_resource_release(base);
}
END_TEST

START_TEST(test_spec_over_a_base_resource_is_refused) {
  rmmc_resource_t *base;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &base), RMMC_SUCCESS);
  long refs = rmmc_resource_refcount(base);
  rmmc_resource_t *top = (rmmc_resource_t *)base;
  ck_assert_int_eq(rmmc_stack_create_over("pool > host", base, &top), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(top);
  expect_in(rmmc_last_error_message(), "host is a base resource: layers built over an existing "
                                       "resource are adaptors and sub-allocators only");
  ck_assert_int_eq(rmmc_stack_create_over("pool(inital=1MiB)", base, &top), RMMC_ERROR_PARSE);
  expect_in(rmmc_last_error_message(), "did you mean 'initial'?");
  ck_assert_int_eq(rmmc_stack_create_over("", base, &top), RMMC_ERROR_PARSE);
  ck_assert_int_eq(rmmc_resource_refcount(base), refs);
  rmmc_resource_release(base);
}
END_TEST

START_TEST(test_spec_over_a_failed_layer_keeps_nothing) {
  rmmc_resource_t *base, *f;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &base), RMMC_SUCCESS);
  ck_assert_int_eq(faulty_create(base, &f), RMMC_SUCCESS);
  long refs = rmmc_resource_refcount(f);
  /* The pool's initial chunk fails: the statistics layer above it, already
   * parsed, is never built, and the faulty upstream keeps its count. */
  faulty_fail_allocate(faulty_of(f), RMMC_ERROR_OUT_OF_MEMORY, 1);
  rmmc_resource_t *top = NULL;
  ck_assert_int_eq(rmmc_stack_create_over("statistics > pool(initial=1MiB)", f, &top),
                   RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(top);
  expect_in(rmmc_last_error_message(), "(building layer 2, 'pool', of \"statistics > "
                                       "pool(initial=1MiB)\" over faulty)");
  ck_assert_int_eq(rmmc_resource_refcount(f), refs);
  ck_assert_uint_eq(spy_counts(spy_of(base)).outstanding, 0);
  /* The same upstream still builds once the fault is spent. */
  ck_assert_int_eq(rmmc_stack_create_over("statistics > pool(initial=1MiB)", f, &top),
                   RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(f), refs + 1);
  rmmc_resource_release(top);
  ck_assert_int_eq(rmmc_resource_refcount(f), refs);
  rmmc_resource_release(f);
  rmmc_resource_release(base);
}
END_TEST

START_TEST(test_spec_over_null_arguments) {
  rmmc_resource_t *base, *top = NULL;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &base), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_stack_create_over("pool", NULL, &top), RMMC_ERROR_INVALID_ARGUMENT);
  expect_in(rmmc_last_error_message(), "upstream is NULL");
  ck_assert_int_eq(rmmc_stack_create_over(NULL, base, &top), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stack_create_over("pool", base, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(top);
  rmmc_resource_release(base);
}
END_TEST

START_TEST(test_spec_over_help_of_one_resource) {
  size_t needed = 0;
  ck_assert_int_eq(rmmc_stack_help_resource("pool", NULL, 0, &needed), RMMC_SUCCESS);
  ck_assert_uint_gt(needed, 100);
  char *text = malloc(needed + 1);
  size_t again = 0;
  ck_assert_int_eq(rmmc_stack_help_resource("pool", text, needed + 1, &again), RMMC_SUCCESS);
  ck_assert_uint_eq(again, needed);
  ck_assert_uint_eq(strlen(text), needed);
  ck_assert(strncmp(text, "pool: ", 6) == 0);
  expect_in(text, "(wraps an upstream)\n");
  expect_in(text, "  initial ");
  expect_in(text, "size (bytes; KiB..TiB) or % of free memory");
  expect_in(text, "bytes reserved at creation (default 0; 0 to 140737488355328)\n");
  expect_in(text, "  release_before_grow ");
  expect_in(text, "true/false");
  /* A short buffer holds a terminated prefix; the length is still whole. */
  char small[16];
  ck_assert_int_eq(rmmc_stack_help_resource("pool", small, sizeof small, &again), RMMC_SUCCESS);
  ck_assert_uint_eq(again, needed);
  ck_assert_uint_eq(strlen(small), sizeof small - 1);
  ck_assert(strncmp(small, text, sizeof small - 1) == 0);
  free(text);
  char buf[512];
  ck_assert_int_eq(rmmc_stack_help_resource("host", buf, sizeof buf, NULL), RMMC_SUCCESS);
  expect_in(buf, "(a base resource)\n");
  ck_assert_int_eq(rmmc_stack_help_resource("pol", buf, sizeof buf, NULL), RMMC_ERROR_PARSE);
  expect_in(rmmc_last_error_message(), "unknown resource 'pol'; did you mean 'pool'?");
  ck_assert_int_eq(rmmc_stack_help_resource("frobnicator", buf, sizeof buf, NULL),
                   RMMC_ERROR_PARSE);
  expect_in(rmmc_last_error_message(), "(rmmc_stack_help() lists them all)");
  ck_assert_int_eq(rmmc_stack_help_resource(NULL, buf, sizeof buf, NULL),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stack_help_resource("pool", NULL, 8, NULL), RMMC_ERROR_INVALID_ARGUMENT);
}
END_TEST

/* Every option of every resource says its default (or that it has none):
 * rmmc.stack_help(name) is where a Python user reads them. */
START_TEST(test_spec_over_every_option_states_its_default) {
  size_t n = rmmc_stack_help(NULL, 0);
  char *all = malloc(n + 1);
  rmmc_stack_help(all, n + 1);
  int resources = 0, options = 0;
  for (char *line = strtok(all, "\n"); line != NULL; line = strtok(NULL, "\n")) {
    char name[64];
    if (sscanf(line, " %63s", name) != 1) continue;
    char text[8192];
    ck_assert_int_eq(rmmc_stack_help_resource(name, text, sizeof text, NULL), RMMC_SUCCESS);
    resources++;
    char *save = NULL;
    strtok_r(text, "\n", &save); /* the resource's own line */
    for (char *o = strtok_r(NULL, "\n", &save); o != NULL; o = strtok_r(NULL, "\n", &save)) {
      if (strcmp(o, "  (no options)") == 0) continue;
      options++;
      ck_assert_msg(strstr(o, "default") != NULL, "%s: no default in '%s'", name, o);
    }
  }
  free(all);
  ck_assert_int_ge(resources, 18);
  ck_assert_int_ge(options, 40);
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec_over");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_spec_over_builds_on_the_object);
  tcase_add_test(tc, test_spec_over_a_base_resource_is_refused);
  tcase_add_test(tc, test_spec_over_a_failed_layer_keeps_nothing);
  tcase_add_test(tc, test_spec_over_null_arguments);
  tcase_add_test(tc, test_spec_over_help_of_one_resource);
  tcase_add_test(tc, test_spec_over_every_option_states_its_default);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
