/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Options described once, as data (docs/design.md, "Stack specs"): each layer's
 * X-macro table of options, held against the public header's options struct and its positional _INIT
 * macro (every field covered by one row, each row's default equal to the
 * macro's), against the help the parser prints, and through the generic
 * builder (rmmc__spec_fill) on real stacks. Host suite.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adaptors/aligned_options.h"
#include "adaptors/logging_options.h"
#include "adaptors/tracking_options.h"
#include "resources/arena_options.h"
#include "resources/binning_options.h"
#include "resources/cuda_async_options.h"
#include "resources/cuda_options.h"
#include "resources/fixed_size_options.h"
#include "resources/managed_options.h"
#include "resources/pool/options.h"
#include "resources/sim_options.h"
#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"

/* One row of a table, as the test sees it. */
typedef struct row {
  const char *field, *key, *stype, *ftype;
  size_t offset, size;
  bool default_equal; /* the row's C default == the _INIT macro's value */
  const char *def;
  long long lo, hi;
} row_t;

#define ROW_OF(T, init, field_, key_, stype_, ftype_, cdef_, tdef_, lo_, hi_, unit_, help_)     \
  {#field_, key_, #stype_, #ftype_, offsetof(T, field_), sizeof(((T *)0)->field_),              \
   (init).field_ == (cdef_), tdef_, lo_, hi_},

/* A field of the struct that is no option of the spec (the table's header
 * says why). */
#define EXTRA_ROW(T, field_)                                                                   \
  {#field_, NULL, "", "", offsetof(T, field_), sizeof(((T *)0)->field_), true, NULL, 0, 0},

static int by_offset(const void *a, const void *b) {
  const row_t *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Does the row's spec type fit its field type, and the field type the
 * field's size? */
static bool types_agree(const row_t *r) {
  if (strcmp(r->ftype, "SIZE") == 0)
    return r->size == sizeof(size_t) &&
           (strcmp(r->stype, "BYTES") == 0 || strcmp(r->stype, "BYTES_PCT") == 0 ||
            strcmp(r->stype, "INT") == 0);
  if (strcmp(r->ftype, "DOUBLE") == 0)
    return r->size == sizeof(double) && strcmp(r->stype, "DOUBLE") == 0;
  if (strcmp(r->ftype, "BOOL") == 0) return r->size == sizeof(bool) && strcmp(r->stype, "BOOL") == 0;
  if (strcmp(r->ftype, "INT") == 0)
    return r->size == sizeof(int) && (strcmp(r->stype, "INT") == 0 || strcmp(r->stype, "BOOL") == 0);
  if (strcmp(r->ftype, "NONE") == 0) /* text the build parses itself */
    return strcmp(r->stype, "STRING") == 0;
  if (strcmp(r->ftype, "UNSIGNED") == 0)
    return r->size == sizeof(unsigned) && strcmp(r->stype, "INT") == 0;
  return false;
}

/* The number of values a positional _INIT macro lists (its text, as the
 * preprocessor expands it): top-level commas inside its braces, plus one. */
static size_t init_values(const char *text) {
  const char *p = strchr(text, '{');
  ck_assert_ptr_nonnull(p);
  size_t n = 1;
  int depth = 0;
  for (p++; *p != '\0' && !(depth == 0 && *p == '}'); p++) {
    if (*p == '(' || *p == '{') depth++;
    else if (*p == ')' || *p == '}') depth--;
    else if (*p == ',' && depth == 0) n++;
  }
  return n;
}

/* Holds layer `layer`'s table (n rows, then `extra` rows of fields that are
 * no spec option, key NULL) against its options struct (size
 * `struct_size`; the first member is `size`) and its positional _INIT
 * macro (`init_text`, which lists every field). */
static void check_table(const char *layer, row_t *rows, size_t n, size_t extra,
                        size_t struct_size, const char *init_text) {
  char help[8192];
  size_t need = 0;
  ck_assert_int_eq(rmmc_stack_help_resource(layer, help, sizeof help, &need), RMMC_SUCCESS);
  ck_assert_uint_lt(need, sizeof help);
  for (size_t i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    ck_assert_msg(r->default_equal, "%s: %s's default differs from the _INIT macro's", layer,
                  r->field);
    ck_assert_msg(types_agree(r), "%s: %s is a %s field of %zu bytes, read as %s", layer, r->field,
                  r->ftype, r->size, r->stype);
    ck_assert_msg(r->key[0] != '\0' && r->def != NULL, "%s: %s has no key or default", layer,
                  r->field);
    for (size_t j = 0; j < i; j++)
      ck_assert_msg(strcmp(rows[j].key, r->key) != 0, "%s: key %s twice", layer, r->key);
    /* The help the parser prints comes from the row: key, default, range. */
    char want[256];
    if (r->lo != 0 || r->hi != 0)
      snprintf(want, sizeof want, "(default %s; %lld to %lld)", r->def, r->lo, r->hi);
    else
      snprintf(want, sizeof want, "(default %s)", r->def);
    char line[64];
    snprintf(line, sizeof line, "\n  %-20s ", r->key);
    const char *at = strstr(help, line);
    ck_assert_msg(at != NULL, "%s: help has no line for %s:\n%s", layer, r->key, help);
    const char *end = strchr(at + 1, '\n');
    ck_assert_msg(end != NULL && strstr(at, want) != NULL && strstr(at, want) < end,
                  "%s: help line of %s lacks '%s':\n%s", layer, r->key, want, help);
  }
  /* Every field has one row: as many rows (and `size`) as the positional
   * _INIT lists values, no two on one field, none overlapping, all inside
   * the struct after `size`. */
  size_t total = n + extra;
  ck_assert_msg(total + 1 == init_values(init_text), "%s: %zu rows, the _INIT macro lists %zu "
                "fields besides size: %s", layer, total, init_values(init_text) - 1, init_text);
  qsort(rows, total, sizeof *rows, by_offset);
  size_t at = sizeof(size_t);
  for (size_t i = 0; i < total; i++) {
    ck_assert_msg(rows[i].offset >= at, "%s: %s overlaps the field before it", layer,
                  rows[i].field);
    at = rows[i].offset + rows[i].size;
  }
  ck_assert_uint_le(at, struct_size);
}

#define STRINGIZE(...) #__VA_ARGS__
#define EXPANDED(...) STRINGIZE(__VA_ARGS__)

START_TEST(test_options_pool_table_matches_the_header) {
  const rmmc_pool_options_t init = RMMC_POOL_OPTIONS_INIT;
#define POOL_ROW(...) ROW_OF(rmmc_pool_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__POOL_OPTIONS(POOL_ROW)};
#undef POOL_ROW
  check_table("pool", rows, sizeof rows / sizeof rows[0], 0, sizeof(rmmc_pool_options_t),
              EXPANDED(RMMC_POOL_OPTIONS_INIT));
}
END_TEST

/* Builds `spec`; fails with `status` and a message holding `needle`. */
static void spec_fails(const char *spec, rmmc_status_t status, const char *needle) {
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), status);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "%s: '%s' lacks '%s'", spec,
                rmmc_last_error_message(), needle);
}

START_TEST(test_options_aligned_table_matches_the_header) {
  const rmmc_aligned_options_t init = RMMC_ALIGNED_OPTIONS_INIT;
#define ALIGNED_ROW(...) ROW_OF(rmmc_aligned_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__ALIGNED_OPTIONS(ALIGNED_ROW)};
#undef ALIGNED_ROW
  check_table("aligned", rows, sizeof rows / sizeof rows[0], 0, sizeof init,
              EXPANDED(RMMC_ALIGNED_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_fixed_size_table_matches_the_header) {
  const rmmc_fixed_size_options_t init = RMMC_FIXED_SIZE_OPTIONS_INIT;
#define FS_ROW(...) ROW_OF(rmmc_fixed_size_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__FIXED_SIZE_OPTIONS(FS_ROW)};
#undef FS_ROW
  check_table("fixed_size", rows, sizeof rows / sizeof rows[0], 0, sizeof init,
              EXPANDED(RMMC_FIXED_SIZE_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_arena_table_matches_the_header) {
  const rmmc_arena_options_t init = RMMC_ARENA_OPTIONS_INIT;
#define ARENA_ROW(...) ROW_OF(rmmc_arena_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__ARENA_OPTIONS(ARENA_ROW) EXTRA_ROW(rmmc_arena_options_t, large_cache_size)};
#undef ARENA_ROW
  check_table("arena", rows, sizeof rows / sizeof rows[0] - 1, 1, sizeof init,
              EXPANDED(RMMC_ARENA_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_binning_table_matches_the_header) {
  const rmmc_binning_options_t init = RMMC_BINNING_OPTIONS_INIT;
#define BINNING_ROW(...) ROW_OF(rmmc_binning_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__BINNING_OPTIONS(BINNING_ROW) EXTRA_ROW(rmmc_binning_options_t, nbins)};
#undef BINNING_ROW
  check_table("binning", rows, sizeof rows / sizeof rows[0] - 1, 1, sizeof init,
              EXPANDED(RMMC_BINNING_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_other_builders_fill_from_their_tables) {
  /* Counts into size_t fields with the table's range, sizes, a percentage
   * and a text option the build parses itself. */
  spec_fails("fixed_size(blocks_per_chunk=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "fixed_size: blocks_per_chunk=0 is out of range (1 to 1048576)");
  spec_fails("arena(keep=-1) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "arena: keep=-1 is out of range (0 to 9223372036854775807)");
  spec_fails("aligned(alignment=3KiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "power of two");
  spec_fails("binning(bins=4KiB:1KiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "bins must ascend");
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("aligned(alignment=8KiB, threshold=0) > fixed_size(block=64KiB, "
                                     "blocks_per_chunk=4) > arena(superblock=1MiB, max=50%, "
                                     "keep=2) > binning(min=512, max=8KiB, chunk=1MiB) > host",
                                     -1, &r),
                   RMMC_SUCCESS);
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % (8 << 10), 0); /* threshold=0: every allocation aligned */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_options_sim_table_matches_the_header) {
  const rmmc_sim_options_t init = RMMC_SIM_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_sim_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__SIM_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("sim", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_SIM_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_tracking_table_matches_the_header) {
  const rmmc_tracking_options_t init = RMMC_TRACKING_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_tracking_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__TRACKING_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("tracking", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_TRACKING_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_logging_table_matches_the_header) {
  const rmmc_logging_options_t init = RMMC_LOGGING_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_logging_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__LOGGING_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("logging", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_LOGGING_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_managed_table_matches_the_header) {
  const rmmc_managed_options_t init = RMMC_MANAGED_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_managed_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__MANAGED_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("managed", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_MANAGED_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_cuda_table_matches_the_header) {
  const rmmc_cuda_options_t init = RMMC_CUDA_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_cuda_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__CUDA_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("cuda", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_CUDA_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_cuda_async_table_matches_the_header) {
  const rmmc_cuda_async_options_t init = RMMC_CUDA_ASYNC_OPTIONS_INIT;
#define THIS_ROW(...) ROW_OF(rmmc_cuda_async_options_t, init, __VA_ARGS__)
  row_t rows[] = {RMMC__CUDA_ASYNC_OPTIONS(THIS_ROW)};
#undef THIS_ROW
  check_table("cuda_async", rows, sizeof rows / sizeof rows[0], 0, sizeof init, EXPANDED(RMMC_CUDA_ASYNC_OPTIONS_INIT));
}
END_TEST

START_TEST(test_options_more_builders_fill_from_their_tables) {
  /* An int field with the table's range, a bool, sizes; a hand row (path)
   * beside the table's. */
  spec_fails("tracking(depth=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "tracking: depth=0 is out of range (1 to 256)");
  spec_fails("logging(path=/nonexistent/x.csv, flush=true, time=hours) > host",
             RMMC_ERROR_INVALID_ARGUMENT,
             "logging: time=hours is neither 'clock' nor 'us'");
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("tracking(backtrace=true, depth=4) > sim(capacity=1MiB)", -1,
                                     &r),
                   RMMC_SUCCESS);
  void *p = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, 512 << 10, 256, NULL, &p), RMMC_SUCCESS);
  void *q = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 768 << 10, 256, NULL, &q), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 512 << 10, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_options_table_check_counts_the_fields) {
  /* The field count the check holds the rows to is not vacuous: the
XX, a struct of three
   * values 3, a nested brace or call one each. */
  ck_assert_uint_eq(init_values(EXPANDED(RMMC_POOL_OPTIONS_INIT)), 21);
  ck_assert_uint_eq(init_values("{sizeof(x), 0, (size_t)1 << 20}"), 3);
  ck_assert_uint_eq(init_values("{f(a, b), {1, 2}}"), 2);
}
END_TEST

START_TEST(test_options_pool_builder_checks_ranges_from_the_table) {
  spec_fails("pool(stream_heaps=2000) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "pool: stream_heaps=2000 is out of range (0 to 1024)");
  spec_fails("pool(event_interval=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "pool: event_interval=0 is out of range (1 to 4294967295)");
  spec_fails("pool(checkpoint_every=131072) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "pool: checkpoint_every=131072 is out of range (0 to 65536)");
  /* In range for the table, refused by the create (a power of two). */
  spec_fails("pool(checkpoint_every=48) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "checkpoint_every must be 0 (none) or a power of two from 2 to 65536");
  spec_fails("pool(checkpoint_every=1) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "checkpoint_every must be 0 (none) or a power of two from 2 to 65536");
  spec_fails("pool(release_band=-1) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "release_band must be from 0 to 1000");
  /* A fraction reaches the struct (the create checks it). */
  spec_fails("pool(gc_threshold=2) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "gc_threshold must be a fraction from 0 to 1");
  /* expandable=true: a bool into an int field, 1 (host has virtual memory:
   * the pool takes it; fixed_size does not, and says so). */
  spec_fails("pool(expandable=true) > fixed_size > host", RMMC_ERROR_NOT_SUPPORTED,
             "expandable needs an upstream with virtual memory");
}
END_TEST

START_TEST(test_options_pool_builder_fills_every_kind) {
  /* Sizes, a percentage, a bool into an int, an unsigned: each lands in
   * its field (the figures that report them). */
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("pool(small_max=64KiB, small_chunk=128KiB, cache=256KiB, "
                                     "max=64MiB, expandable=false, stream_heaps=3, "
                                     "release_before_grow=false, event_interval=5) > host",
                                     -1, &r),
                   RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "small_max"), 64 << 10);
  ck_assert_uint_eq(field(r, "span_size"), 128 << 10);
  ck_assert_uint_eq(field(r, "heap_cache"), 256 << 10);
  ck_assert_uint_eq(field(r, "limit"), 64 << 20);
  uint64_t page;
  ck_assert(!rmmc_resource_get_field(r, "page", &page)); /* chunks: no virtual memory */
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool(max=50%, expandable=true) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(r, "page", &page)); /* virtual memory */
  ck_assert_uint_gt(field(r, "limit"), 0);
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("options_tables");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_options_pool_table_matches_the_header);
  tcase_add_test(tc, test_options_aligned_table_matches_the_header);
  tcase_add_test(tc, test_options_fixed_size_table_matches_the_header);
  tcase_add_test(tc, test_options_arena_table_matches_the_header);
  tcase_add_test(tc, test_options_binning_table_matches_the_header);
  tcase_add_test(tc, test_options_other_builders_fill_from_their_tables);
  tcase_add_test(tc, test_options_sim_table_matches_the_header);
  tcase_add_test(tc, test_options_tracking_table_matches_the_header);
  tcase_add_test(tc, test_options_logging_table_matches_the_header);
  tcase_add_test(tc, test_options_managed_table_matches_the_header);
  tcase_add_test(tc, test_options_cuda_table_matches_the_header);
  tcase_add_test(tc, test_options_cuda_async_table_matches_the_header);
  tcase_add_test(tc, test_options_more_builders_fill_from_their_tables);
  tcase_add_test(tc, test_options_table_check_counts_the_fields);
  tcase_add_test(tc, test_options_pool_builder_checks_ranges_from_the_table);
  tcase_add_test(tc, test_options_pool_builder_fills_every_kind);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
