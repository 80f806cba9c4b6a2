/* SPDX-License-Identifier: Apache-2.0 */
/*
 * failure_callback, aligned, thread_safe and prefetch together: their
 * stack-spec names and options (parsed, type-checked, built, refused), and
 * stacks of all four released in every order (nothing leaks, the upstream
 * is destroyed exactly once, after the last reference). Host suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

static void expect_parse_error(const char *spec, const char *needle) {
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_ERROR_PARSE);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s': '%s' lacks '%s'", spec,
                rmmc_last_error_message(), needle);
  ck_assert_int_eq(rmmc_stack_validate(spec), RMMC_ERROR_PARSE);
}

static void expect_build_error(const char *spec, rmmc_status_t st, const char *needle) {
  ck_assert_int_eq(rmmc_stack_validate(spec), RMMC_SUCCESS);
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), st);
  ck_assert_ptr_null(r);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, needle) != NULL && strstr(m, "building layer") != NULL,
                "'%s': '%s' lacks '%s'", spec, m, needle);
}

START_TEST(test_specs_parse_and_check_options) {
  const char *ok[] = {
      "failure_callback > host",
      "failure_callback(retries=3) > host",
      "aligned > host",
      "aligned(alignment=64KiB, threshold=0) > host",
      "aligned( alignment = 4096 , threshold = 1.5MiB ) > host",
      "thread_safe > host",
      "thread_safe() > host",
      "prefetch > managed(prefetch=false)",
      "prefetch > cuda",
      "thread_safe > failure_callback > aligned(alignment=8KiB) > prefetch > managed",
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    ck_assert_msg(rmmc_stack_validate(ok[i]) == RMMC_SUCCESS, "'%s': %s", ok[i],
                  rmmc_last_error_message());
  expect_parse_error("aligned(align=4096) > host",
                     "aligned has no option 'align' (it takes: alignment, threshold)");
  expect_parse_error("aligned(alignment=12XB) > host", "'12XB' is not a size");
  expect_parse_error("aligned(threshold=50%) > host", "not a size");
  expect_parse_error("failure_callback(retries=two) > host", "'two' is not an integer");
  expect_parse_error("failure_callback(tries=2) > host", "failure_callback has no option 'tries'");
  expect_parse_error("thread_safe(lock=1) > host", "thread_safe has no option 'lock'");
  expect_parse_error("thread_safe", "thread_safe needs an upstream");
  expect_parse_error("host > aligned", "host is a base resource");
  /* Values that parse but a layer refuses: its status, named layer. */
  expect_build_error("aligned(alignment=3000) > host", RMMC_ERROR_INVALID_ARGUMENT,
                     "alignment 3000 is not a power of two");
  expect_build_error("aligned(alignment=0) > host", RMMC_ERROR_INVALID_ARGUMENT, "power of two");
  expect_build_error("failure_callback(retries=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
                     "retries=0 is out of range (1 to 2147483647)");
  expect_build_error("failure_callback(retries=-2) > host", RMMC_ERROR_INVALID_ARGUMENT,
                     "retries=-2 is out of range");
  /* Issue 11, F5: quoted as written (it was misquoted as a wrapped int). */
  expect_build_error("failure_callback(retries=99999999999) > host", RMMC_ERROR_INVALID_ARGUMENT,
                     "retries=99999999999 is out of range (1 to 2147483647)");
  expect_parse_error("failure_callback(retries=-99999999999999999999) > host",
                     "retries=-99999999999999999999 is out of range (integers are 64-bit)");
  expect_build_error("thread_safe > prefetch > host", RMMC_ERROR_INCOMPATIBLE,
                     "cannot be prefetched");
}
END_TEST

START_TEST(test_specs_build_with_options) {
  rmmc_resource_t *r;
  const char *spec =
      "thread_safe > failure_callback(retries=3) > aligned(alignment=8KiB, threshold=4KiB) > host";
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  const char *names[] = {"thread_safe", "failure_callback", "aligned", "host"};
  rmmc_resource_t *l = r;
  for (int i = 0; i < 4; i++, l = rmmc_resource_upstream(l)) {
    ck_assert_ptr_nonnull(l);
    ck_assert_str_eq(rmmc_resource_name(l), names[i]);
    ck_assert_int_eq(rmmc_resource_refcount(l), 1); /* only the layer above holds it */
  }
  ck_assert_ptr_null(l);
  rmmc_resource_t *fc = rmmc_resource_upstream(r), *al = rmmc_resource_upstream(fc);
  ck_assert_uint_eq(field(fc, "retries"), 3);
  ck_assert_uint_eq(field(al, "alignment"), 8192);
  ck_assert_uint_eq(field(al, "threshold"), 4096);
  void *p, *q;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % 8192, 0);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4000, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_uint_eq(field(al, "outstanding"), 1);
  memset(p, 1, 5000);
  memset(q, 2, 4000);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 5000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 4000, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(field(al, "outstanding"), 0);
  rmmc_resource_release(r);
  /* Defaults from the spec match the C defaults. */
  ck_assert_int_eq(rmmc_stack_create("failure_callback > aligned > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "retries"), 1);
  ck_assert_str_eq(rmmc_resource_name(rmmc_resource_upstream(r)), "aligned");
  ck_assert_uint_eq(field(rmmc_resource_upstream(r), "alignment"), 4096);
  ck_assert_uint_eq(field(rmmc_resource_upstream(r), "threshold"), (uint64_t)1 << 20);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_specs_listed_in_help) {
  size_t need = rmmc_stack_help(NULL, 0);
  char *buf = malloc(need + 1);
  rmmc_stack_help(buf, need + 1);
  const char *lines[] = {"failure_callback", "retries", "aligned", "alignment, threshold",
                         "thread_safe", "prefetch"};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
    ck_assert_msg(strstr(buf, lines[i]) != NULL, "help lacks '%s':\n%s", lines[i], buf);
  free(buf);
}
END_TEST

enum { LAYERS = 5 };

/* Builds spy(device kind) < prefetch < failure_callback < aligned <
 * thread_safe, keeping a reference to every layer, with traffic through
 * the top and the middle. */
static void build_stack(rmmc_resource_t *layer[LAYERS]) {
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &layer[0]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_prefetch_adaptor_create(layer[0], &layer[1]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create_release_cached(layer[1], 1, &layer[2]),
                   RMMC_SUCCESS);
  rmmc_aligned_options_t o = RMMC_ALIGNED_OPTIONS_INIT;
  o.threshold = 1000;
  ck_assert_int_eq(rmmc_aligned_adaptor_create(layer[2], &o, &layer[3]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_thread_safe_adaptor_create(layer[3], &layer[4]), RMMC_SUCCESS);
  void *p[LAYERS];
  for (int i = 0; i < LAYERS; i++)
    ck_assert_int_eq(rmmc_resource_allocate(layer[i], 3000, 256, NULL, &p[i]), RMMC_SUCCESS);
  for (int i = 0; i < LAYERS; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(layer[i], p[i], 3000, 256, NULL), RMMC_SUCCESS);
}

START_TEST(test_stacks_release_in_any_order) {
  int order[LAYERS] = {0, 1, 2, 3, 4};
  int permutations = 0;
  for (;;) {
    rmmc_resource_t *layer[LAYERS];
    build_stack(layer);
    spy_t *s = spy_of(layer[0]);
    ck_assert_uint_eq(spy_counts(s).outstanding, 0);
    ck_assert_uint_eq(spy_counts(s).deallocate_errors, 0);
    uint64_t destroyed = spy_destroyed_total();
    for (int i = 0; i < LAYERS; i++) {
      if (i == LAYERS - 1) ck_assert_uint_eq(spy_counts(s).outstanding, 0);
      rmmc_resource_release(layer[order[i]]);
      ck_assert_uint_eq(spy_destroyed_total(), destroyed + (i == LAYERS - 1 ? 1 : 0));
    }
    permutations++;
    /* Next permutation in lexicographic order. */
    int k = LAYERS - 2;
    while (k >= 0 && order[k] > order[k + 1]) k--;
    if (k < 0) break;
    int l = LAYERS - 1;
    while (order[l] < order[k]) l--;
    int t = order[k];
    order[k] = order[l];
    order[l] = t;
    for (int a = k + 1, b = LAYERS - 1; a < b; a++, b--) t = order[a], order[a] = order[b], order[b] = t;
  }
  ck_assert_int_eq(permutations, 120);
}
END_TEST

START_TEST(test_stacks_built_by_spec_release_in_any_order) {
  /* Retain each layer of a spec-built stack, then drop the spec's
   * reference first: every layer stays valid until its own release. */
  rmmc_resource_t *top;
  ck_assert_int_eq(rmmc_stack_create("thread_safe > aligned(threshold=0) > failure_callback > host",
                                     -1, &top),
                   RMMC_SUCCESS);
  rmmc_resource_t *layer[4];
  layer[0] = rmmc_resource_retain(top);
  for (int i = 1; i < 4; i++) layer[i] = rmmc_resource_retain(rmmc_resource_upstream(layer[i - 1]));
  rmmc_resource_release(top);
  const int order[4] = {2, 0, 3, 1};
  for (int i = 0; i < 4; i++) {
    /* The layers not yet released still serve. */
    for (int j = i; j < 4; j++) {
      void *p;
      rmmc_resource_t *r = layer[order[j]];
      ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 512, NULL, &p), RMMC_SUCCESS);
      ck_assert_uint_eq((uintptr_t)p % 512, 0);
      ck_assert_int_eq(rmmc_resource_deallocate(r, p, 5000, 512, NULL), RMMC_SUCCESS);
    }
    rmmc_resource_release(layer[order[i]]);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("adaptor_specs");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_specs_parse_and_check_options);
  tcase_add_test(tc, test_specs_build_with_options);
  tcase_add_test(tc, test_specs_listed_in_help);
  tcase_add_test(tc, test_stacks_release_in_any_order);
  tcase_add_test(tc, test_stacks_built_by_spec_release_in_any_order);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
