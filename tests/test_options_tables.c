/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Options described once, as data (docs/design.md, "Stack specs"): each layer's
 * X-macro table of options, held against the public header's options struct and its positional _INIT
 * macro (every field covered by one row, each row's default equal to the
 * macro's), against the help the parser prints, and through the generic
 * builder (rmmc__spec_fill) on real stacks. Host suite.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "test_main.h"
#include "test_util.h"
/* The alias table itself (internal, so compiled in here rather than linked). */
#include "stack/spec_aliases.c"

/* One row of a table, as the test sees it. */
typedef struct row {
  const char *field, *key, *stype, *ftype;
  size_t offset, size;
  bool default_equal; /* the row's default == the _INIT macro's value */
  const char *def;
  bool ranged;           /* min and max not both 0 */
  long long lo;          /* integer fields: the range */
  unsigned long long hi;
  double dlo, dhi;       /* every field: the range as doubles */
} row_t;

#define ROW_OF(T, init, ctype, field_, cdef_, lo_, hi_, key_, stype_, ftype_, tdef_, unit_, help_) \
  {#field_, key_, #stype_, #ftype_, offsetof(T, field_), sizeof(((T *)0)->field_),              \
   (init).field_ == (cdef_), tdef_, (lo_) != 0 || (hi_) != 0, (long long)(lo_),                 \
   (unsigned long long)(hi_), (double)(lo_), (double)(hi_)},

/* A double as its shortest text that reads back the same (the help's). */
static void shortest(char *buf, size_t len, double v) {
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, len, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return;
  }
}

/* Does the row's spec type fit its field type, and the field type the
 * field's size? */
static bool types_agree(const row_t *r) {
  if (strcmp(r->stype, "NOSPEC") == 0) return r->key == NULL && strcmp(r->ftype, "NONE") == 0;
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

/* Holds layer `layer`'s table (n rows, one per field after `size`) against
 * its options struct (size `struct_size`, which must be `abi_size` on LP64
 * targets: the layout of a released struct never changes), its _INIT macro
 * and the help the parser prints. */
static void check_table(const char *layer, const row_t *rows, size_t n, size_t struct_size,
                        size_t abi_size) {
  char help[8192];
  size_t need = 0;
  ck_assert_int_eq(rmmc_stack_help_resource(layer, help, sizeof help, &need), RMMC_SUCCESS);
  ck_assert_uint_lt(need, sizeof help);
  /* Layout: the rows are the struct's fields in order, after `size`, with
   * nothing between them but padding and nothing past the end. */
  size_t at = sizeof(size_t);
  for (size_t i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    ck_assert_msg(r->offset >= at && r->offset - at < r->size,
                  "%s: %s at offset %zu, the field before it ends at %zu", layer, r->field,
                  r->offset, at);
    at = r->offset + r->size;
  }
  ck_assert_uint_le(at, struct_size);
  ck_assert_uint_lt(struct_size - at, sizeof(size_t)); /* no field without a row at the end */
  if (sizeof(size_t) == 8 && sizeof(void *) == 8)
    ck_assert_msg(struct_size == abi_size, "%s: the options struct is %zu bytes, was %zu", layer,
                  struct_size, abi_size);
  for (size_t i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    ck_assert_msg(r->default_equal, "%s: %s's default differs from the _INIT macro's", layer,
                  r->field);
    ck_assert_msg(types_agree(r), "%s: %s is a %s field of %zu bytes, read as %s", layer, r->field,
                  r->ftype, r->size, r->stype);
    if (r->key == NULL) continue; /* no spec option: nothing in the help */
    ck_assert_msg(r->key[0] != '\0' && r->def != NULL, "%s: %s has no key or default", layer,
                  r->field);
    for (size_t j = 0; j < i; j++)
      ck_assert_msg(rows[j].key == NULL || strcmp(rows[j].key, r->key) != 0, "%s: key %s twice",
                    layer, r->key);
    /* The help the parser prints comes from the row: key, default, range. */
    ck_assert_msg(!r->ranged || r->dlo <= r->dhi, "%s: %s's min is above its max", layer,
                  r->field);
    /* The help shows the range of a value a spec writes as a number: a
     * bool or a word (BOOL, STRING) has none to show. */
    char want[256], lo[32], hi[32];
    bool shown = r->ranged && strcmp(r->stype, "BOOL") != 0 && strcmp(r->stype, "STRING") != 0;
    if (shown && strcmp(r->ftype, "DOUBLE") == 0) {
      shortest(lo, sizeof lo, r->dlo);
      shortest(hi, sizeof hi, r->dhi);
    } else {
      snprintf(lo, sizeof lo, "%lld", r->lo);
      snprintf(hi, sizeof hi, "%llu", r->hi);
    }
    if (shown)
      snprintf(want, sizeof want, "(default %s; %s to %s)", r->def, lo, hi);
    else
      snprintf(want, sizeof want, "(default %s)", r->def);
    char line[64];
    snprintf(line, sizeof line, "\n  %-20s ", r->key);
    const char *at_line = strstr(help, line);
    ck_assert_msg(at_line != NULL, "%s: help has no line for %s:\n%s", layer, r->key, help);
    const char *end = strchr(at_line + 1, '\n');
    ck_assert_msg(end != NULL && strstr(at_line, want) != NULL && strstr(at_line, want) < end,
                  "%s: help line of %s lacks '%s':\n%s", layer, r->key, want, help);
  }
}

/* Holds the table of layer `name` (options type rmmc_<name>_options_t,
 * table RMMC_<NAME>_OPTIONS) against its header. */
#define CHECK_TABLE(name, T, TABLE, INIT, abi_size)                                            \
  do {                                                                                         \
    const T init = INIT;                                                                       \
    ck_assert_uint_eq(init.size, sizeof(T));                                                   \
    const row_t rows[] = {TABLE(THIS_ROW)};                                                    \
    check_table(name, rows, sizeof rows / sizeof rows[0], sizeof(T), abi_size);                \
  } while (0)
#define THIS_ROW(...) ROW_OF(__typeof__(init), init, __VA_ARGS__)

START_TEST(test_options_pool_table_matches_the_header) {
  CHECK_TABLE("pool", rmmc_pool_options_t, RMMC_POOL_OPTIONS, RMMC_POOL_OPTIONS_INIT, 152);
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
  CHECK_TABLE("aligned", rmmc_aligned_options_t, RMMC_ALIGNED_OPTIONS, RMMC_ALIGNED_OPTIONS_INIT, 24);
}
END_TEST

START_TEST(test_options_fixed_size_table_matches_the_header) {
  CHECK_TABLE("fixed_size", rmmc_fixed_size_options_t, RMMC_FIXED_SIZE_OPTIONS, RMMC_FIXED_SIZE_OPTIONS_INIT, 24);
}
END_TEST

START_TEST(test_options_arena_table_matches_the_header) {
  CHECK_TABLE("arena", rmmc_arena_options_t, RMMC_ARENA_OPTIONS, RMMC_ARENA_OPTIONS_INIT, 48);
}
END_TEST

START_TEST(test_options_binning_table_matches_the_header) {
  CHECK_TABLE("binning", rmmc_binning_options_t, RMMC_BINNING_OPTIONS, RMMC_BINNING_OPTIONS_INIT, 48);
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
  CHECK_TABLE("sim", rmmc_sim_options_t, RMMC_SIM_OPTIONS, RMMC_SIM_OPTIONS_INIT, 24);
}
END_TEST

START_TEST(test_options_tracking_table_matches_the_header) {
  CHECK_TABLE("tracking", rmmc_tracking_options_t, RMMC_TRACKING_OPTIONS, RMMC_TRACKING_OPTIONS_INIT, 16);
}
END_TEST

START_TEST(test_options_logging_table_matches_the_header) {
  CHECK_TABLE("logging", rmmc_logging_options_t, RMMC_LOGGING_OPTIONS, RMMC_LOGGING_OPTIONS_INIT, 16);
}
END_TEST

START_TEST(test_options_managed_table_matches_the_header) {
  CHECK_TABLE("managed", rmmc_managed_options_t, RMMC_MANAGED_OPTIONS, RMMC_MANAGED_OPTIONS_INIT, 16);
}
END_TEST

START_TEST(test_options_cuda_table_matches_the_header) {
  CHECK_TABLE("cuda", rmmc_cuda_options_t, RMMC_CUDA_OPTIONS, RMMC_CUDA_OPTIONS_INIT, 16);
}
END_TEST

START_TEST(test_options_cuda_async_table_matches_the_header) {
  CHECK_TABLE("cuda_async", rmmc_cuda_async_options_t, RMMC_CUDA_ASYNC_OPTIONS, RMMC_CUDA_ASYNC_OPTIONS_INIT, 24);
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
  /* Numbers and sizes meet their rows' ranges in the builder too, in the
   * same words, the value quoted as written. */
  spec_fails("pool(release_band=-1) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "pool: release_band=-1 is out of range (0 to 1000)");
  spec_fails("pool(gc_threshold=2) > host", RMMC_ERROR_INVALID_ARGUMENT,
             "pool: gc_threshold=2 is out of range (0 to 1)");
  /* expandable=true: a bool into an int field, 1 (host has virtual memory:
   * the pool takes it; fixed_size does not, and says so). */
  spec_fails("pool(expandable=true) > fixed_size > host", RMMC_ERROR_NOT_SUPPORTED,
             "expandable needs an upstream with virtual memory");
}
END_TEST

START_TEST(test_options_pool_create_checks_ranges_from_the_table) {
  /* A C caller's options meet the same ranges as a spec's, in the create. */
  rmmc_resource_t *host = NULL, *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.stream_heaps = 2000;
  ck_assert_int_eq(rmmc_pool_resource_create(host, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_str_eq(rmmc_last_error_message(),
                   "pool_resource_create: stream_heaps=2000 is out of range (0 to 1024)");
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.event_interval = 0;
  ck_assert_int_eq(rmmc_pool_resource_create(host, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_str_eq(rmmc_last_error_message(),
                   "pool_resource_create: event_interval=0 is out of range (1 to 4294967295)");
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.stream_heaps = 1024;
  ck_assert_int_eq(rmmc_pool_resource_create(host, &o, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  rmmc_resource_release(host);
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
  ck_assert_uint_eq(field(r, "small_chunk"), 128 << 10);
  ck_assert_uint_eq(field(r, "cache_size"), 256 << 10);
  ck_assert_uint_eq(field(r, "maximum_size"), 64 << 20);
  uint64_t page;
  ck_assert(!rmmc_resource_get_field(r, "page", &page)); /* chunks: no virtual memory */
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool(max=50%, expandable=true) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert(rmmc_resource_get_field(r, "page", &page)); /* virtual memory */
  ck_assert_uint_gt(field(r, "maximum_size"), 0);
  rmmc_resource_release(r);
}
END_TEST

/* Creates with options `o` over `up`: the status, and for a refusal the
 * whole message; what a success made is released. */
#define CREATE_IS(create, up, o, status, message)                                              \
  do {                                                                                         \
    rmmc_resource_t *made_ = (rmmc_resource_t *)1;                                             \
    rmmc_status_t st_ = create(up, &(o), &made_);                                              \
    ck_assert_msg(st_ == (status), "%s:%d: %s (%s)", __FILE__, __LINE__, rmmc_status_name(st_), \
                  rmmc_last_error_message());                                                  \
    if (st_ == RMMC_SUCCESS) {                                                                 \
      rmmc_resource_release(made_);                                                            \
    } else {                                                                                   \
      ck_assert_ptr_null(made_);                                                               \
      if ((message) != NULL) ck_assert_str_eq(rmmc_last_error_message(), (message));          \
    }                                                                                          \
  } while (0)

/* One pool option set to `value` over a fresh INIT: the create's answer. */
#define POOL_WITH(up, field_, value, status, message)                                          \
  do {                                                                                         \
    rmmc_pool_options_t o_ = RMMC_POOL_OPTIONS_INIT;                                           \
    o_.field_ = (value);                                                                       \
    CREATE_IS(rmmc_pool_resource_create, up, o_, status, message);                             \
  } while (0)

#define OK RMMC_SUCCESS
#define BAD RMMC_ERROR_INVALID_ARGUMENT
#define BELOW(x) nextafter((x), -INFINITY)
#define ABOVE(x) nextafter((x), INFINITY)

START_TEST(test_options_pool_double_ranges_come_from_the_table) {
  /* Each double's range holds at its bounds and refuses the next double
   * outside them, with the table's message; the value is printed in full. */
  rmmc_resource_t *host = NULL;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  POOL_WITH(host, gc_threshold, 0.0, OK, NULL);
  POOL_WITH(host, gc_threshold, 1.0, OK, NULL);
  POOL_WITH(host, gc_threshold, BELOW(0.0), BAD,
            "pool_resource_create: gc_threshold=-4.94065645841247e-324 is out of range (0 to 1)");
  POOL_WITH(host, gc_threshold, ABOVE(1.0), BAD,
            "pool_resource_create: gc_threshold=1.0000000000000002 is out of range (0 to 1)");
  POOL_WITH(host, gc_threshold, 1.5, BAD,
            "pool_resource_create: gc_threshold=1.5 is out of range (0 to 1)");
  POOL_WITH(host, gc_threshold, NAN, BAD,
            "pool_resource_create: gc_threshold=nan is out of range (0 to 1)");
  POOL_WITH(host, release_slack, 0.0, OK, NULL);
  POOL_WITH(host, release_slack, 1e6, OK, NULL);
  POOL_WITH(host, release_slack, -0.01, BAD,
            "pool_resource_create: release_slack=-0.01 is out of range (0 to 1000000)");
  POOL_WITH(host, release_slack, ABOVE(1e6), BAD,
            "pool_resource_create: release_slack=1000000.0000000001 is out of range (0 to 1000000)");
  POOL_WITH(host, split_limit, 0.0, OK, NULL);
  POOL_WITH(host, split_limit, 1.0, OK, NULL);
  POOL_WITH(host, split_limit, 1e6, OK, NULL);
  POOL_WITH(host, split_limit, BELOW(0.0), BAD,
            "pool_resource_create: split_limit=-4.94065645841247e-324 is out of range (0 to 1000000)");
  POOL_WITH(host, split_limit, ABOVE(1e6), BAD,
            "pool_resource_create: split_limit=1000000.0000000001 is out of range (0 to 1000000)");
  /* Inside the range, refused by the rule beside it: 0 is off, else >= 1. */
  POOL_WITH(host, split_limit, BELOW(1.0), BAD,
            "pool_resource_create: split_limit must be 0 (off) or at least 1");
  POOL_WITH(host, release_band, 0.0, OK, NULL);
  POOL_WITH(host, release_band, 1000.0, OK, NULL);
  POOL_WITH(host, release_band, BELOW(0.0), BAD,
            "pool_resource_create: release_band=-4.94065645841247e-324 is out of range (0 to 1000)");
  POOL_WITH(host, release_band, ABOVE(1000.0), BAD,
            "pool_resource_create: release_band=1000.0000000000001 is out of range (0 to 1000)");
  rmmc_resource_release(host);
}
END_TEST

START_TEST(test_options_pool_integer_ranges_come_from_the_table) {
  rmmc_resource_t *host = NULL;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  POOL_WITH(host, growth_granularity, 256, OK, NULL);
  POOL_WITH(host, growth_granularity, (size_t)1 << 30, OK, NULL);
  POOL_WITH(host, growth_granularity, 255, BAD,
            "pool_resource_create: growth_granularity=255 is out of range (256 to 1073741824)");
  POOL_WITH(host, growth_granularity, ((size_t)1 << 30) + 1, BAD,
            "pool_resource_create: growth_granularity=1073741825 is out of range (256 to "
            "1073741824)");
  POOL_WITH(host, growth_granularity, 3000, BAD,
            "pool_resource_create: growth_granularity must be a power of two");
  POOL_WITH(host, small_chunk, (size_t)1 << 30, OK, NULL);
  POOL_WITH(host, small_chunk, ((size_t)64 << 10) - 1, BAD,
            "pool_resource_create: small_chunk=65535 is out of range (65536 to 1073741824)");
  POOL_WITH(host, small_chunk, ((size_t)1 << 30) + 1, BAD,
            "pool_resource_create: small_chunk=1073741825 is out of range (65536 to 1073741824)");
  /* 64 KiB is in range, but below the default small_max (1 MiB). */
  POOL_WITH(host, small_chunk, (size_t)64 << 10, BAD,
            "pool_resource_create: small_chunk must be a power of two and at least small_max");
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = o.small_max = (size_t)64 << 10;
  CREATE_IS(rmmc_pool_resource_create, host, o, OK, NULL);
  POOL_WITH(host, expandable, -1, OK, NULL);
  POOL_WITH(host, expandable, 1, OK, NULL);
  POOL_WITH(host, expandable, -2, BAD,
            "pool_resource_create: expandable=-2 is out of range (-1 to 1)");
  POOL_WITH(host, expandable, 2, BAD, "pool_resource_create: expandable=2 is out of range (-1 to 1)");
  POOL_WITH(host, initial_size, ((size_t)1 << 47) + 1, BAD,
            "pool_resource_create: initial_size=140737488355329 is out of range (0 to "
            "140737488355328)");
  rmmc_resource_release(host);
  /* 128 TiB passes the range and is asked of the upstream (which has not
   * that much: out of memory, not a refused option). */
  rmmc_resource_t *spy = new_spy();
  spy_set_capacity(spy_of(spy), (size_t)1 << 20);
  o = (rmmc_pool_options_t)RMMC_POOL_OPTIONS_INIT;
  o.initial_size = (size_t)1 << 47;
  CREATE_IS(rmmc_pool_resource_create, spy, o, RMMC_ERROR_OUT_OF_MEMORY, NULL);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 1);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_options_other_creates_check_ranges_from_their_tables) {
  rmmc_resource_t *host = NULL;
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  rmmc_arena_options_t a = RMMC_ARENA_OPTIONS_INIT;
  a.superblock_size = (size_t)64 << 10;
  CREATE_IS(rmmc_arena_resource_create, host, a, OK, NULL);
  a.superblock_size = (size_t)1 << 30;
  CREATE_IS(rmmc_arena_resource_create, host, a, OK, NULL);
  a.superblock_size = ((size_t)64 << 10) - 1;
  CREATE_IS(rmmc_arena_resource_create, host, a, BAD,
            "arena_resource_create: superblock_size=65535 is out of range (65536 to 1073741824)");
  a.superblock_size = ((size_t)1 << 30) + 1;
  CREATE_IS(rmmc_arena_resource_create, host, a, BAD,
            "arena_resource_create: superblock_size=1073741825 is out of range (65536 to "
            "1073741824)");
  a = (rmmc_arena_options_t)RMMC_ARENA_OPTIONS_INIT;
  a.chunk_size = (size_t)1 << 47;
  CREATE_IS(rmmc_arena_resource_create, host, a, OK, NULL);
  a.chunk_size = ((size_t)1 << 47) + 1;
  CREATE_IS(rmmc_arena_resource_create, host, a, BAD,
            "arena_resource_create: chunk_size=140737488355329 is out of range (0 to "
            "140737488355328)");

  rmmc_binning_options_t b = RMMC_BINNING_OPTIONS_INIT;
  b.chunk_size = 1;
  CREATE_IS(rmmc_binning_resource_create, host, b, OK, NULL);
  b.chunk_size = SIZE_MAX;
  CREATE_IS(rmmc_binning_resource_create, host, b, OK, NULL);
  b.chunk_size = 0;
  CREATE_IS(rmmc_binning_resource_create, host, b, BAD,
            "binning_resource_create: chunk_size=0 is out of range (1 to 18446744073709551615)");

  rmmc_fixed_size_options_t f = RMMC_FIXED_SIZE_OPTIONS_INIT;
  f.block_size = 1;
  CREATE_IS(rmmc_fixed_size_resource_create, host, f, OK, NULL);
  f.block_size = 0;
  CREATE_IS(rmmc_fixed_size_resource_create, host, f, BAD,
            "fixed_size_resource_create: block_size=0 is out of range (1 to "
            "18446744073709551615)");
  /* SIZE_MAX is in range; a chunk of such blocks is what cannot be. */
  f.block_size = SIZE_MAX;
  CREATE_IS(rmmc_fixed_size_resource_create, host, f, BAD,
            "fixed_size_resource_create: 128 blocks of 18446744073709551615 bytes overflow a "
            "chunk");
  f = (rmmc_fixed_size_options_t)RMMC_FIXED_SIZE_OPTIONS_INIT;
  f.block_size = 256;
  f.blocks_per_chunk = 1;
  CREATE_IS(rmmc_fixed_size_resource_create, host, f, OK, NULL);
  f.blocks_per_chunk = 0;
  CREATE_IS(rmmc_fixed_size_resource_create, host, f, BAD,
            "fixed_size_resource_create: blocks_per_chunk=0 is out of range (1 to 1048576)");

  /* The depth's range holds whether or not backtraces are on (the table's
   * and the spec's rule; the create once checked it only with them on). */
  for (int on = 0; on < 2; on++) {
    rmmc_tracking_options_t t = RMMC_TRACKING_OPTIONS_INIT;
    t.backtrace = on;
    t.backtrace_depth = 1;
    CREATE_IS(rmmc_tracking_adaptor_create, host, t, OK, NULL);
    t.backtrace_depth = 256;
    CREATE_IS(rmmc_tracking_adaptor_create, host, t, OK, NULL);
    t.backtrace_depth = 0;
    CREATE_IS(rmmc_tracking_adaptor_create, host, t, BAD,
              "tracking_adaptor_create: backtrace_depth=0 is out of range (1 to 256)");
    t.backtrace_depth = 257;
    CREATE_IS(rmmc_tracking_adaptor_create, host, t, BAD,
              "tracking_adaptor_create: backtrace_depth=257 is out of range (1 to 256)");
  }
  ck_assert_int_eq(rmmc_resource_refcount(host), 1);
  rmmc_resource_release(host);
}
END_TEST

/* Builds `spec` and releases it. */
static void spec_builds(const char *spec) {
  rmmc_resource_t *r = NULL;
  ck_assert_msg(rmmc_stack_create(spec, -1, &r) == RMMC_SUCCESS, "%s: %s", spec,
                rmmc_last_error_message());
  rmmc_resource_release(r);
}

START_TEST(test_options_builders_check_moved_ranges) {
  /* The spec builder holds sizes and numbers to the same rows, quoting the
   * value as written; the bounds themselves build. */
  spec_builds("pool(gc_threshold=1, release_slack=0, split_limit=1000000, release_band=1000, "
              "granularity=256, small_chunk=64KiB, small_max=64KiB) > host");
  spec_builds("pool(gc_threshold=0, release_slack=1e6, split_limit=0, release_band=0, "
              "granularity=1GiB, small_chunk=1GiB, initial=0) > host");
  spec_fails("pool(gc_threshold=1.0000001) > host", BAD,
             "pool: gc_threshold=1.0000001 is out of range (0 to 1)");
  spec_fails("pool(release_slack=-0.01) > host", BAD,
             "pool: release_slack=-0.01 is out of range (0 to 1000000)");
  spec_fails("pool(split_limit=1000001) > host", BAD,
             "pool: split_limit=1000001 is out of range (0 to 1000000)");
  spec_fails("pool(release_band=1000.5) > host", BAD,
             "pool: release_band=1000.5 is out of range (0 to 1000)");
  spec_fails("pool(granularity=255) > host", BAD,
             "pool: granularity=255 is out of range (256 to 1073741824)");
  spec_fails("pool(small_chunk=2GiB) > host", BAD,
             "pool: small_chunk=2GiB is out of range (65536 to 1073741824)");
  spec_fails("pool(initial=129TiB) > host", BAD,
             "pool: initial=129TiB is out of range (0 to 140737488355328)");
  spec_fails("arena(superblock=32KiB) > host", BAD,
             "arena: superblock=32KiB is out of range (65536 to 1073741824)");
  spec_fails("arena(chunk=129TiB) > host", BAD,
             "arena: chunk=129TiB is out of range (0 to 140737488355328)");
  spec_fails("binning(chunk=0) > host", BAD,
             "binning: chunk=0 is out of range (1 to 18446744073709551615)");
  spec_fails("fixed_size(block=0) > host", BAD,
             "fixed_size: block=0 is out of range (1 to 18446744073709551615)");
  spec_builds("arena(superblock=64KiB, chunk=128TiB) > host");
  spec_builds("binning(chunk=1) > host");
  spec_builds("fixed_size(block=1) > host");
  /* The help shows the same bounds (a double's as its shortest text; a
   * bool's, expandable's -1 to 1, not, as a spec writes no number). */
  char help[8192];
  ck_assert_int_eq(rmmc_stack_help_resource("pool", help, sizeof help, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(strstr(help, "(default 0.02; 0 to 1000000)"));
  ck_assert_ptr_nonnull(strstr(help, "(default 4; 0 to 1000)"));
  ck_assert_ptr_nonnull(strstr(help, "(default 2MiB; 256 to 1073741824)"));
  ck_assert_ptr_null(strstr(help, "-1 to 1"));
  ck_assert_int_eq(rmmc_stack_help_resource("binning", help, sizeof help, NULL), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(strstr(help, "(default 2MiB; 1 to 18446744073709551615)"));
}
END_TEST

/* Every alias row names an option of its layer's public table, by the
 * key the table gives it, and an alias that is no option's key of that
 * layer nor another row's; each alias and each `none` parses. */
#define ALIAS_KEY(type, field, def, lo, hi, key, ...) key,
static const char *const pool_keys[] = {RMMC_POOL_OPTIONS(ALIAS_KEY)};
static const char *const arena_keys[] = {RMMC_ARENA_OPTIONS(ALIAS_KEY)};
#undef ALIAS_KEY

static bool has_key(const char *const *keys, size_t n, const char *word) {
  for (size_t i = 0; i < n; i++)
    if (keys[i] != NULL && strcmp(keys[i], word) == 0) return true;
  return false;
}

START_TEST(test_options_aliases_name_real_options) {
  size_t rows = 0;
  for (const rmmc__spec_alias_t *a = rmmc__spec_aliases; a->layer != NULL; a++, rows++) {
    bool pool = strcmp(a->layer, "pool") == 0;
    ck_assert_msg(pool || strcmp(a->layer, "arena") == 0, "alias row for layer %s", a->layer);
    const char *const *keys = pool ? pool_keys : arena_keys;
    size_t n = pool ? sizeof pool_keys / sizeof *pool_keys : sizeof arena_keys / sizeof *arena_keys;
    ck_assert_msg(has_key(keys, n, a->name), "%s has no option %s", a->layer, a->name);
    char spec[128];
    if (a->alias != NULL) {
      ck_assert_msg(!has_key(keys, n, a->alias), "%s: alias %s is an option", a->layer, a->alias);
      for (const rmmc__spec_alias_t *b = rmmc__spec_aliases; b != a; b++)
        ck_assert_msg(b->alias == NULL || strcmp(b->layer, a->layer) != 0 ||
                          strcmp(b->alias, a->alias) != 0,
                      "%s: alias %s twice", a->layer, a->alias);
      snprintf(spec, sizeof spec, "%s(%s=1MiB) > host", a->layer, a->alias);
      ck_assert_msg(rmmc_stack_validate(spec) == RMMC_SUCCESS, "%s: %s", spec,
                    rmmc_last_error_message());
    }
    if (a->no_limit) {
      snprintf(spec, sizeof spec, "%s(%s=none) > host", a->layer, a->name);
      ck_assert_msg(rmmc_stack_validate(spec) == RMMC_SUCCESS, "%s: %s", spec,
                    rmmc_last_error_message());
    }
  }
  ck_assert_uint_eq(rows, 4);
}
END_TEST

int main(void) {
  Suite *s = suite_create("options_tables");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_options_pool_table_matches_the_header);
  tcase_add_test(tc, test_options_aliases_name_real_options);
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
  tcase_add_test(tc, test_options_pool_builder_checks_ranges_from_the_table);
  tcase_add_test(tc, test_options_pool_create_checks_ranges_from_the_table);
  tcase_add_test(tc, test_options_pool_builder_fills_every_kind);
  tcase_add_test(tc, test_options_pool_double_ranges_come_from_the_table);
  tcase_add_test(tc, test_options_pool_integer_ranges_come_from_the_table);
  tcase_add_test(tc, test_options_other_creates_check_ranges_from_their_tables);
  tcase_add_test(tc, test_options_builders_check_moved_ranges);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
