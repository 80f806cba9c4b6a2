/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stacks of the limiting, statistics, tracking and logging adaptors:
 * figures at every layer, failures seen by each layer, references dropped
 * in every order without leaks, the same stack from a spec. Host suite.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

enum { LAYERS = 5 }; /* statistics > limiting > tracking > logging > spy */

typedef struct stack {
  rmmc_resource_t *layer[LAYERS]; /* [0] statistics ... [4] spy; one reference each */
  FILE *log;
  char *log_text;
  size_t log_len;
} chain_t;

static void build(chain_t *s, size_t limit) {
  memset(s, 0, sizeof *s);
  s->log = open_memstream(&s->log_text, &s->log_len);
  ck_assert_ptr_nonnull(s->log);
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &s->layer[4]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_create_file(s->layer[4], s->log, NULL, &s->layer[3]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_tracking_adaptor_create(s->layer[3], NULL, &s->layer[2]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_limiting_adaptor_create(s->layer[2], limit, &s->layer[1]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_create(s->layer[1], &s->layer[0]), RMMC_SUCCESS);
  for (int i = 0; i < LAYERS - 1; i++) ck_assert_int_eq(rmmc_resource_refcount(s->layer[i + 1]), 2);
}

static int count_substr(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

START_TEST(test_stack_figures_and_failures) {
  chain_t s;
  build(&s, 64 << 10);
  rmmc_resource_t *top = s.layer[0];
  spy_t *spy = spy_of(s.layer[4]);
  void *p[4];
  size_t sizes[4] = {1000, 20000, 256, 10};
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(rmmc_resource_allocate(top, sizes[i], 256, NULL, &p[i]), RMMC_SUCCESS);
  rmmc_statistics_t st = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(top, &st), RMMC_SUCCESS);
  ck_assert_int_eq(st.current_bytes, 21266);
  ck_assert_int_eq(st.current_count, 4);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(s.layer[1]), 1024 + 20224 + 256 + 256);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(s.layer[2]), 4);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_bytes(s.layer[2]), 21266);
  ck_assert_uint_eq(spy_counts(spy).outstanding_bytes, 21266);
  /* Over the limit: refused at the limiting layer; the OOM message carries
   * every layer's figures; nothing below saw it. */
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(top, 60000, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(q);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "limiting resource could not allocate 58.59 KiB (60000 bytes)") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "stack: statistics (in use 20.77 KiB) > limiting (in use 21.25 KiB) > "
                          "tracking (in use 20.77 KiB) > logging > spy (in use 20.77 KiB)") != NULL,
                "%s", m);
  ck_assert_uint_eq(spy_counts(spy).allocate_calls, 4);
  /* The upstream fails: logged as a failure row, rolled back, not counted. */
  spy_fail_nth(spy, 1);
  ck_assert_int_eq(rmmc_resource_allocate(top, 3000, 256, (cudaStream_t)0x40, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(s.layer[1]), 1024 + 20224 + 256 + 256);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_outstanding_count(s.layer[2]), 4);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(top, &st), RMMC_SUCCESS);
  ck_assert_uint_eq(st.total_count, 4);
  /* A wrong-size free is stopped by tracking before logging and the spy. */
  ck_assert_int_eq(rmmc_resource_deallocate(top, p[0], 999, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(rmmc_tracking_adaptor_get_error_count(s.layer[2]), 1);
  ck_assert_uint_eq(spy_counts(spy).deallocate_calls, 0);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(top, &st), RMMC_SUCCESS);
  ck_assert_uint_eq(st.deallocations, 0);
  ck_assert_uint_eq(rmmc_limiting_adaptor_get_used(s.layer[1]), 1024 + 20224 + 256 + 256);
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(top, p[i], sizes[i], 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_flush(s.layer[3]), RMMC_SUCCESS);
  ck_assert_int_eq(count_substr(s.log_text, ",allocate,"), 4);
  ck_assert_int_eq(count_substr(s.log_text, ",allocate failure,0x0,3000,0x40\n"), 1);
  ck_assert_int_eq(count_substr(s.log_text, ",free,"), 4);
  ck_assert_uint_eq(spy_counts(spy).outstanding, 0);
  uint64_t before = spy_destroyed_total();
  for (int i = 0; i < LAYERS; i++) rmmc_resource_release(s.layer[i]);
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
  fclose(s.log);
  free(s.log_text);
}
END_TEST

/* Drops the five references in the order of permutation k (of 120) while
 * allocations are live until the last moment they can be freed: the spy is
 * destroyed exactly once, at the last release, with nothing outstanding. */
START_TEST(test_stack_release_in_any_order) {
  int order[LAYERS] = {0, 1, 2, 3, 4};
  /* The k-th permutation (factorial number system). */
  int k = _i, pool[LAYERS] = {0, 1, 2, 3, 4}, left = LAYERS;
  for (int i = 0; i < LAYERS; i++) {
    int f = 1;
    for (int j = 2; j < left; j++) f *= j;
    int pick = k / f;
    k %= f;
    order[i] = pool[pick];
    for (int j = pick; j < left - 1; j++) pool[j] = pool[j + 1];
    left--;
  }
  chain_t s;
  build(&s, 1 << 20);
  spy_t *spy = spy_of(s.layer[4]);
  void *p[8];
  for (int i = 0; i < 8; i++)
    ck_assert_int_eq(rmmc_resource_allocate(s.layer[0], (size_t)(i + 1) * 100, 256, NULL, &p[i]), RMMC_SUCCESS);
  for (int i = 0; i < 8; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(s.layer[0], p[i], (size_t)(i + 1) * 100, 256, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy).outstanding, 0);
  uint64_t before = spy_destroyed_total();
  for (int i = 0; i < LAYERS; i++) {
    ck_assert_uint_eq(spy_destroyed_total(), before);
    rmmc_resource_release(s.layer[order[i]]);
  }
  ck_assert_uint_eq(spy_destroyed_total(), before + 1);
  /* The log was flushed to the FILE when the logging layer went. */
  fflush(s.log);
  ck_assert_int_eq(count_substr(s.log_text, ",free,"), 8);
  fclose(s.log);
  free(s.log_text);
}
END_TEST

START_TEST(test_stack_from_spec) {
  char path[] = "/tmp/rmmc_stack_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  char spec[256];
  snprintf(spec, sizeof spec,
           "statistics > limiting(limit=1MiB) > tracking(backtrace=true) > logging(path=%s) > host", path);
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  const char *names[] = {"statistics", "limiting", "tracking", "logging", "host"};
  rmmc_resource_t *l = r;
  for (int i = 0; i < 5; i++, l = rmmc_resource_upstream(l)) ck_assert_str_eq(rmmc_resource_name(l), names[i]);
  ck_assert_ptr_null(l);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1 << 20, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1, 256, NULL, &(void *){NULL}), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1 << 20, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  ck_assert_int_eq(n, 3); /* header, allocate, free: the refused one never got there */
  unlink(path);
}
END_TEST

/* The whole stack passes the conformance battery too. */
static rmmc_status_t make_stack(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  rmmc_resource_t *a, *b, *c;
  char path[] = "/tmp/rmmc_stack_conf_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return RMMC_ERROR_IO;
  close(fd);
  rmmc_status_t st = rmmc_logging_adaptor_create(upstream, path, NULL, &a);
  unlink(path);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc_tracking_adaptor_create(a, NULL, &b);
  rmmc_resource_release(a);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc_limiting_adaptor_create(b, (size_t)1 << 30, &c);
  rmmc_resource_release(b);
  if (st != RMMC_SUCCESS) return st;
  st = rmmc_statistics_adaptor_create(c, out);
  rmmc_resource_release(c);
  return st;
}

static const conformance_case_t cases[] = {{"statistics>limiting>tracking>logging", make_stack, 0}};

int main(void) {
  Suite *s = suite_create("adaptor_stacks");
  conformance_add(s, cases, 1);
  TCase *tc = tcase_create("stacks");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_stack_figures_and_failures);
  tcase_add_loop_test(tc, test_stack_release_in_any_order, 0, 120);
  tcase_add_test(tc, test_stack_from_spec);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
