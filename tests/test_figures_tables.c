/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Figures described once, as data (rmmc/figures.h): the pool's table,
 * RMMC_POOL_FIGURES, held against the public figures struct it makes (its
 * members in row order, their types from the rows' kinds, the released
 * layout and the _INIT bytes), against what describe reports on real pools
 * (exactly the table's keys and kinds, in its order, then the streams'
 * figures) and against rmmc_pool_resource_figures (a member and its key
 * report the same value). Host suite.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/figures.h"
#include "base/stream_events.h"
#include "rmmc/rmmc.h"
#include "test_main.h"

/* One row of the pool's table, as the test sees it. */
typedef struct frow {
  const char *name, *where, *doc;
  rmmc_field_kind_t kind;
  bool member;
  size_t offset, size;
} frow_t;

#define MEMBER_BOTH(name) \
  true, offsetof(rmmc_pool_figures_t, name), sizeof(((rmmc_pool_figures_t *)0)->name)
#define MEMBER_STRUCT(name) MEMBER_BOTH(name)
#define MEMBER_DESCRIBE(name) false, 0, 0
#define MEMBER_DESCRIBE_IF_SET(name) false, 0, 0
#define FROW(kind, name, where, doc) {#name, #where, doc, RMMC_FIELD_##kind, MEMBER_##where(name)},

static const frow_t pool_rows[] = {RMMC_POOL_FIGURES(FROW)};
#define NROWS (sizeof pool_rows / sizeof *pool_rows)

/* The keys the stream set reports after "streams", in order. */
#define STREAM_KEY(key, counter) #key,
static const char *const stream_keys[] = {RMMC__STREAM_SET_FIGURES(STREAM_KEY)};
#define NSTREAM_KEYS (sizeof stream_keys / sizeof *stream_keys)

/* What describe reported, in order. */
typedef struct seen {
  size_t n;
  char key[128][32];
  rmmc_field_kind_t kind[128];
  uint64_t value[128];
} seen_t;

static void record(void *ctx, const rmmc_field_t *f) {
  seen_t *s = ctx;
  ck_assert_uint_lt(s->n, 128);
  ck_assert_uint_lt(strlen(f->key), sizeof s->key[0]);
  strcpy(s->key[s->n], f->key);
  s->kind[s->n] = f->kind;
  s->value[s->n] = f->value;
  s->n++;
}

/* Finds the logging adaptor's "path" field with a text. */
static void record_path(void *ctx, const rmmc_field_t *f) {
  if (strcmp(f->key, "path") == 0 && f->text != NULL && strstr(f->text, "log.csv") != NULL)
    *(bool *)ctx = true;
}

static const uint64_t *seen_value(const seen_t *s, const char *key) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->key[i], key) == 0) return &s->value[i];
  return NULL;
}

START_TEST(test_figures_pool_table_makes_the_struct) {
  /* The members are the BOTH and STRUCT rows, in row order, packed after
   * `size`, each of its kind's type. */
  size_t at = sizeof(size_t), members = 0;
  for (size_t i = 0; i < NROWS; i++) {
    const frow_t *r = &pool_rows[i];
    if (!r->member) continue;
    ck_assert_msg(r->offset == at, "%s at offset %zu, expected %zu", r->name, r->offset, at);
    ck_assert(r->kind == RMMC_FIELD_BYTES || r->kind == RMMC_FIELD_COUNT);
    ck_assert_uint_eq(r->size, r->kind == RMMC_FIELD_BYTES ? sizeof(size_t) : sizeof(uint64_t));
    at += r->size;
    members++;
  }
  ck_assert_uint_eq(sizeof(rmmc_pool_figures_t), at);
  ck_assert_uint_eq(members, 11);
  /* The released layout (LP64): a member never moves. */
  if (sizeof(size_t) == 8) {
    ck_assert_uint_eq(sizeof(rmmc_pool_figures_t), 96);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, reserved), 8);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, pending), 32);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, grows), 40);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, device_syncs), 56);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, event_queries), 80);
    ck_assert_uint_eq(offsetof(rmmc_pool_figures_t, event_syncs), 88);
  }
  /* _INIT: the size, then zeros. */
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  ck_assert_uint_eq(f.size, sizeof f);
  const unsigned char *b = (const unsigned char *)&f;
  for (size_t i = sizeof(size_t); i < sizeof f; i++) ck_assert_uint_eq(b[i], 0);
}
END_TEST

START_TEST(test_figures_pool_rows_are_well_formed) {
  for (size_t i = 0; i < NROWS; i++) {
    const frow_t *r = &pool_rows[i];
    ck_assert_msg(r->doc[0] != '\0', "%s has no doc", r->name);
    for (size_t j = 0; j < i; j++) ck_assert_str_ne(pool_rows[j].name, r->name);
    /* A TEXT figure has no member to hold it. */
    if (r->kind == RMMC_FIELD_TEXT) ck_assert(!r->member);
    /* A STRUCT row is reported with the streams' figures. */
    if (strcmp(r->where, "STRUCT") == 0) {
      bool found = false;
      for (size_t k = 0; k < NSTREAM_KEYS; k++) found |= strcmp(stream_keys[k], r->name) == 0;
      ck_assert_msg(found, "%s is no figure of the streams", r->name);
      ck_assert(r->kind == RMMC_FIELD_COUNT);
    }
  }
  /* The standard figures the core reads back (the out-of-memory rule, the
   * release check) are rows. */
  const rmmc__figure_t standard[] = {RMMC__FIG_RESERVED, RMMC__FIG_IN_USE, RMMC__FIG_CACHED,
                                     RMMC__FIG_FREE, RMMC__FIG_PEAK};
  for (size_t k = 0; k < sizeof standard / sizeof *standard; k++) {
    bool found = false;
    for (size_t i = 0; i < NROWS; i++)
      found |= rmmc__figure_of(pool_rows[i].name) == standard[k] &&
               strcmp(pool_rows[i].where, "STRUCT") != 0;
    ck_assert_msg(found, "standard figure %d is not reported from the table", (int)standard[k]);
  }
  ck_assert_int_eq(rmmc__figure_of(RMMC__FIG(CACHED)), RMMC__FIG_CACHED);
  /* The keys as released, in order: Python and the tools read them by
   * name, and reports print them in this order. maximum_size, small_chunk
   * and cache_size were limit, span_size and heap_cache before they took
   * their options' names (get_field still finds them by the old keys). */
  static const char *const released[] = {
      "reserved", "in_use", "free", "peak", "reserved_peak", "largest_free", "maximum_size",
      "small_max", "small_chunk", "cache_size", "cached", "pending", "regions", "graph_pools",
      "graph_bytes", "spans", "heaps", "heaps_retired", "grows", "shrinks", "adoptions",
      "release_band", "peers", "device_syncs", "event_records", "event_waits", "event_queries",
      "event_syncs"};
  ck_assert_uint_eq(NROWS, sizeof released / sizeof *released);
  for (size_t i = 0; i < NROWS; i++) ck_assert_str_eq(pool_rows[i].name, released[i]);
  static const char *const released_streams[] = {"event_records", "event_waits", "device_syncs",
                                                 "stream_syncs", "event_queries", "event_syncs"};
  ck_assert_uint_eq(NSTREAM_KEYS, sizeof released_streams / sizeof *released_streams);
  for (size_t k = 0; k < NSTREAM_KEYS; k++) ck_assert_str_eq(stream_keys[k], released_streams[k]);
}
END_TEST

/* Two streams' handles (the host resources never use them). */
#define STREAM(n) ((cudaStream_t)(uintptr_t)(0x100 + 8 * (n)))

/* Holds describe of the pool `spec` (with some memory in use on two
 * streams) against the table; `limited`: whether the pool has a maximum. */
static void check_describe(const char *spec, bool limited) {
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), RMMC_SUCCESS);
  void *p[4] = {NULL};
  size_t sizes[4] = {1000, 3 << 20, 256, 200 << 10};
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(rmmc_resource_allocate(r, sizes[i], 256, STREAM(i % 2), &p[i]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[0], sizes[0], 256, STREAM(0)), RMMC_SUCCESS);
  seen_t s = {0};
  rmmc_resource_describe(r, record, &s);
  /* The table's rows, in order, with their kinds; a row reported only when
   * set is there exactly when it is. */
  size_t at = 0;
  for (size_t i = 0; i < NROWS; i++) {
    const frow_t *row = &pool_rows[i];
    if (strcmp(row->where, "STRUCT") == 0) continue;
    if (strcmp(row->where, "DESCRIBE_IF_SET") == 0) {
      bool set = strcmp(row->name, "maximum_size") == 0 && limited; /* peers: never on the host */
      if (!set) {
        ck_assert_msg(at >= s.n || strcmp(s.key[at], row->name) != 0, "%s: %s reported unset",
                      spec, row->name);
        continue;
      }
    }
    ck_assert_uint_lt(at, s.n);
    ck_assert_msg(strcmp(s.key[at], row->name) == 0, "%s: key %zu is %s, the table says %s", spec,
                  at, s.key[at], row->name);
    ck_assert_int_eq(s.kind[at], row->kind);
    at++;
  }
  /* Then the streams' figures. */
  ck_assert_uint_lt(at + NSTREAM_KEYS, s.n);
  ck_assert_str_eq(s.key[at], "streams");
  ck_assert_uint_eq(s.value[at], 2);
  for (size_t k = 0; k < NSTREAM_KEYS; k++) {
    ck_assert_str_eq(s.key[at + 1 + k], stream_keys[k]);
    ck_assert_int_eq(s.kind[at + 1 + k], RMMC_FIELD_COUNT);
  }
  ck_assert_str_eq(s.key[at + 1 + NSTREAM_KEYS], "backend");
  if (limited) ck_assert_uint_eq(*seen_value(&s, "maximum_size"), 64 << 20);
  /* Each member holds what describe reports under its key (nothing moved
   * in between). */
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  ck_assert_int_eq(rmmc_pool_resource_figures(r, &f), RMMC_SUCCESS);
  const unsigned char *base = (const unsigned char *)&f;
  size_t members = 0;
  for (size_t i = 0; i < NROWS; i++) {
    const frow_t *row = &pool_rows[i];
    if (!row->member) continue;
    uint64_t v;
    if (row->size == sizeof(uint64_t)) {
      memcpy(&v, base + row->offset, sizeof v);
    } else {
      size_t z;
      memcpy(&z, base + row->offset, sizeof z);
      v = z;
    }
    const uint64_t *d = seen_value(&s, row->name);
    ck_assert_msg(d != NULL, "%s: member %s is not reported", spec, row->name);
    ck_assert_msg(*d == v, "%s: %s is %llu in the struct, %llu in describe", spec, row->name,
                  (unsigned long long)v, (unsigned long long)*d);
    members++;
  }
  ck_assert_uint_eq(members, 11);
  ck_assert_uint_gt(f.reserved, 0);
  ck_assert_uint_ge(f.in_use, sizes[1] + sizes[2] + sizes[3]);
  for (int i = 1; i < 4; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], sizes[i], 256, STREAM(i % 2)), RMMC_SUCCESS);
  rmmc_resource_release(r);
}

START_TEST(test_figures_pool_describe_reports_the_table) {
  check_describe("pool > host", false);
  check_describe("pool(max=64MiB) > host", true);
  check_describe("pool(expandable=true, max=64MiB) > sim", true);
  check_describe("pool(small_max=0) > sim", false);
}
END_TEST

/* ---- the statistics adaptor's keyed table ---- */

typedef struct krow {
  const char *name, *key, *where, *doc;
  rmmc_field_kind_t kind;
  bool member, is_signed;
  size_t offset, size;
} krow_t;

#define KMEMBER_BOTH(type, name) \
  true, !((type)-1 > 0), offsetof(rmmc_statistics_t, name), sizeof(((rmmc_statistics_t *)0)->name)
#define KMEMBER_DESCRIBE(type, name) false, false, 0, 0
#define KROW(kind, type, name, key, where, doc) \
  {#name, #key, #where, doc, RMMC_FIELD_##kind, KMEMBER_##where(type, name)},

static const krow_t stat_rows[] = {RMMC_STATISTICS_FIGURES(KROW)};
#define NSTAT_ROWS (sizeof stat_rows / sizeof *stat_rows)

START_TEST(test_figures_statistics_table_makes_the_struct) {
  size_t at = sizeof(size_t), members = 0;
  for (size_t i = 0; i < NSTAT_ROWS; i++) {
    const krow_t *r = &stat_rows[i];
    ck_assert_msg(r->doc[0] != '\0', "%s has no doc", r->name);
    for (size_t j = 0; j < i; j++) ck_assert_str_ne(stat_rows[j].key, r->key);
    if (!r->member) {
      ck_assert_str_eq(r->name, r->key);
      continue;
    }
    ck_assert_msg(r->offset == at, "%s at offset %zu, expected %zu", r->name, r->offset, at);
    ck_assert_uint_eq(r->size, sizeof(uint64_t));
    at += r->size;
    members++;
  }
  ck_assert_uint_eq(sizeof(rmmc_statistics_t), at);
  ck_assert_uint_eq(members, 7);
  /* The released layout and signedness: a member never moves. */
  ck_assert_uint_eq(offsetof(rmmc_statistics_t, current_bytes), sizeof(size_t));
  ck_assert_uint_eq(offsetof(rmmc_statistics_t, deallocations), sizeof(size_t) + 6 * 8);
  rmmc_statistics_t f = RMMC_STATISTICS_INIT;
  ck_assert_uint_eq(f.size, sizeof f);
  for (size_t i = 0; i < NSTAT_ROWS; i++)
    if (stat_rows[i].member)
      ck_assert_msg(stat_rows[i].is_signed == (strncmp(stat_rows[i].name, "current_", 8) == 0 ||
                                               strncmp(stat_rows[i].name, "peak_", 5) == 0),
                    "%s has the wrong signedness", stat_rows[i].name);
  rmmc_statistics_t z = RMMC_STATISTICS_INIT;
  const unsigned char *b = (const unsigned char *)&z;
  for (size_t i = sizeof(size_t); i < sizeof z; i++) ck_assert_uint_eq(b[i], 0);
  /* The keys and members as released, in order. */
  static const char *const keys[] = {"in_use", "peak", "total", "outstanding", "peak_outstanding",
                                     "allocations", "deallocations", "scopes", "slow_path"};
  static const char *const names[] = {"current_bytes", "peak_bytes", "total_bytes",
                                      "current_count", "peak_count", "total_count",
                                      "deallocations", "scopes", "slow_path"};
  ck_assert_uint_eq(NSTAT_ROWS, sizeof keys / sizeof *keys);
  for (size_t i = 0; i < NSTAT_ROWS; i++) {
    ck_assert_str_eq(stat_rows[i].key, keys[i]);
    ck_assert_str_eq(stat_rows[i].name, names[i]);
    ck_assert_int_eq(stat_rows[i].kind, i < 3 ? RMMC_FIELD_BYTES : RMMC_FIELD_COUNT);
  }
  /* The standard keys the core reads back come from the table. */
  const rmmc__figure_t standard[] = {RMMC__FIG_IN_USE, RMMC__FIG_PEAK, RMMC__FIG_TOTAL,
                                     RMMC__FIG_OUTSTANDING, RMMC__FIG_ALLOCATIONS};
  for (size_t k = 0; k < sizeof standard / sizeof *standard; k++)
    ck_assert_int_eq(rmmc__figure_of(stat_rows[k == 4 ? 5 : k].key), standard[k]);
}
END_TEST

/* describe reports exactly the rows, keyed, in order, and each member's
 * value (not below 0) under its key; scopes and slow_path as they are. */
START_TEST(test_figures_statistics_describe_reports_the_table) {
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("statistics > host", -1, &r), RMMC_SUCCESS);
  void *p[3] = {NULL};
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(rmmc_resource_allocate(r, 1000 * (i + 1), 256, NULL, &p[i]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[0], 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_push(r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[1], 2000, 256, NULL), RMMC_SUCCESS);
  seen_t s = {0};
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(s.n, NSTAT_ROWS);
  for (size_t i = 0; i < NSTAT_ROWS; i++) {
    ck_assert_str_eq(s.key[i], stat_rows[i].key);
    ck_assert_int_eq(s.kind[i], stat_rows[i].kind);
  }
  /* The innermost scope's members are below 0 (it freed what its outer
   * scope allocated); popped, the outermost holds the whole adaptor's. */
  rmmc_statistics_t f = RMMC_STATISTICS_INIT;
  ck_assert_int_eq(rmmc_statistics_adaptor_get(r, &f), RMMC_SUCCESS);
  ck_assert_int_lt(f.current_bytes, 0);
  ck_assert_uint_eq(*seen_value(&s, "scopes"), 1);
  ck_assert_int_eq(rmmc_statistics_adaptor_pop(r, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(r, &f), RMMC_SUCCESS);
  const unsigned char *base = (const unsigned char *)&f;
  for (size_t i = 0; i < NSTAT_ROWS; i++) {
    const krow_t *row = &stat_rows[i];
    if (!row->member) continue;
    int64_t v;
    memcpy(&v, base + row->offset, sizeof v);
    ck_assert_msg(v >= 0, "%s is below 0", row->name);
    ck_assert_msg(s.value[i] == (uint64_t)v, "%s is %lld in the struct, %s %llu in describe",
                  row->name, (long long)v, row->key, (unsigned long long)s.value[i]);
  }
  ck_assert_uint_eq(f.current_bytes, 3000);
  ck_assert_uint_eq(f.peak_bytes, 6000);
  ck_assert_uint_eq(f.total_count, 3);
  ck_assert_uint_eq(f.deallocations, 2);
  ck_assert_uint_eq(*seen_value(&s, "slow_path"), 0);
  /* A deallocation of more than is outstanding takes the slow path and the
   * whole adaptor's current figures below 0: describe reports 0. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[2], 3000, 256, NULL), RMMC_SUCCESS);
  void *q = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(rmmc_resource_upstream(r), 512, 256, NULL, &q),
                   RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 512, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_statistics_adaptor_get(r, &f), RMMC_SUCCESS);
  ck_assert_int_lt(f.current_bytes, 0);
  ck_assert_int_lt(f.current_count, 0);
  memset(&s, 0, sizeof s);
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(s.n, NSTAT_ROWS);
  ck_assert_uint_eq(*seen_value(&s, "in_use"), 0);
  ck_assert_uint_eq(*seen_value(&s, "outstanding"), 0);
  ck_assert_uint_eq(*seen_value(&s, "deallocations"), 4);
  ck_assert_uint_eq(*seen_value(&s, "slow_path"), 1);
  ck_assert_uint_eq(*seen_value(&s, "scopes"), 0);
  rmmc_resource_release(r);
}
END_TEST

/* ---- tables of DESCRIBE rows (resources without a figures struct) ---- */

typedef struct drow {
  const char *name;
  rmmc_field_kind_t kind;
  const char *where, *doc;
} drow_t;
#define DROW(kind, name, where, doc) {#name, RMMC_FIELD_##kind, #where, doc},
#define N(rows) (sizeof rows / sizeof *rows)

/* A table is well formed and holds the keys and kinds as released, each
 * written "B name" (BYTES), "C name" (COUNT) or "T name" (TEXT). */
static void check_table(const drow_t *rows, size_t n, const char *const *released,
                        size_t nreleased) {
  ck_assert_uint_eq(n, nreleased);
  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(rows[i].doc[0] != '\0', "%s has no doc", rows[i].name);
    ck_assert(strcmp(rows[i].where, "DESCRIBE") == 0 ||
              strcmp(rows[i].where, "DESCRIBE_IF_SET") == 0);
    for (size_t j = 0; j < i; j++) ck_assert_str_ne(rows[j].name, rows[i].name);
    ck_assert_str_eq(rows[i].name, released[i] + 2);
    ck_assert_int_eq(rows[i].kind, released[i][0] == 'B'   ? RMMC_FIELD_BYTES
                                   : released[i][0] == 'C' ? RMMC_FIELD_COUNT
                                                           : RMMC_FIELD_TEXT);
  }
}

/* Holds what describe reported from index `at` on against the rows, in
 * order with their kinds; a DESCRIBE_IF_SET row is there exactly when it
 * is named in `set` (NULL-terminated). Returns the index after them. */
static size_t check_reported(const seen_t *s, size_t at, const drow_t *rows, size_t n,
                             const char *const *set) {
  for (size_t i = 0; i < n; i++) {
    if (strcmp(rows[i].where, "DESCRIBE_IF_SET") == 0) {
      bool is_set = false;
      for (const char *const *k = set; k != NULL && *k != NULL; k++)
        is_set |= strcmp(*k, rows[i].name) == 0;
      if (!is_set) {
        ck_assert_msg(at >= s->n || strcmp(s->key[at], rows[i].name) != 0, "%s reported unset",
                      rows[i].name);
        continue;
      }
    }
    ck_assert_msg(at < s->n, "%s is not reported", rows[i].name);
    ck_assert_msg(strcmp(s->key[at], rows[i].name) == 0, "key %zu is %s, the table says %s", at,
                  s->key[at], rows[i].name);
    ck_assert_int_eq(s->kind[at], rows[i].kind);
    at++;
  }
  return at;
}

/* Holds the streams' figures at `at`, the last of describe. */
static void check_streams_last(const seen_t *s, size_t at) {
  ck_assert_uint_eq(s->n, at + 1 + NSTREAM_KEYS);
  ck_assert_str_eq(s->key[at], "streams");
  for (size_t k = 0; k < NSTREAM_KEYS; k++) ck_assert_str_eq(s->key[at + 1 + k], stream_keys[k]);
}

static const drow_t fixed_size_rows[] = {RMMC_FIXED_SIZE_FIGURES(DROW)};

START_TEST(test_figures_fixed_size_describe_reports_the_table) {
  static const char *const released[] = {
      "B block_size", "C blocks_per_chunk", "B reserved", "B in_use", "B cached", "B peak",
      "C chunks", "C blocks", "C free_blocks", "B largest_free", "B graph_routed"};
  check_table(fixed_size_rows, N(fixed_size_rows), released, N(released));
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("fixed_size(block=64KiB, blocks_per_chunk=4) > host", -1, &r),
                   RMMC_SUCCESS);
  void *p[3] = {NULL};
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, STREAM(0), &p[i]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[0], 1000, 256, STREAM(0)), RMMC_SUCCESS);
  seen_t s = {0};
  rmmc_resource_describe(r, record, &s);
  check_streams_last(&s, check_reported(&s, 0, fixed_size_rows, N(fixed_size_rows), NULL));
  ck_assert_uint_eq(*seen_value(&s, "block_size"), 64 << 10);
  ck_assert_uint_eq(*seen_value(&s, "in_use"), 2 * (64 << 10));
  ck_assert_uint_eq(*seen_value(&s, "peak"), 3 * (64 << 10));
  ck_assert_uint_eq(*seen_value(&s, "cached"), 2 * (64 << 10));
  ck_assert_uint_eq(*seen_value(&s, "blocks"), 4);
  ck_assert_uint_eq(*seen_value(&s, "free_blocks"), 2);
  ck_assert_uint_eq(*seen_value(&s, "largest_free"), 64 << 10);
  for (int i = 1; i < 3; i++)
    ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 1000, 256, STREAM(0)), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

/* Describes `r` and holds it against `released` exactly (the tables of
 * limiting, tracking and logging stay in their .c files). */
static seen_t describe_is(rmmc_resource_t *r, const char *const *released, size_t n) {
  seen_t s = {0};
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(s.n, n);
  for (size_t i = 0; i < n; i++) {
    ck_assert_str_eq(s.key[i], released[i] + 2);
    ck_assert_int_eq(s.kind[i], released[i][0] == 'B'   ? RMMC_FIELD_BYTES
                                : released[i][0] == 'C' ? RMMC_FIELD_COUNT
                                                        : RMMC_FIELD_TEXT);
  }
  return s;
}

START_TEST(test_figures_adaptors_in_c_report_as_released) {
  rmmc_resource_t *r = NULL, *host = NULL;
  void *p = NULL;
  ck_assert_int_eq(rmmc_stack_create("limiting(limit=1MiB) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1024, 256, NULL, &p), RMMC_SUCCESS);
  static const char *const limiting[] = {"B limit", "B in_use"};
  seen_t s = describe_is(r, limiting, N(limiting));
  ck_assert_uint_eq(s.value[0], 1 << 20);
  ck_assert_uint_eq(s.value[1], 1024);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1024, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);

  ck_assert_int_eq(rmmc_stack_create("tracking > host", -1, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 999, 256, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  static const char *const tracking[] = {"B in_use", "C outstanding", "C errors"};
  s = describe_is(r, tracking, N(tracking));
  ck_assert_uint_eq(s.value[0], 1000);
  ck_assert_uint_eq(s.value[1], 1);
  ck_assert_uint_eq(s.value[2], 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);

  char dir[] = "/tmp/rmmc_figures_XXXXXX", path[64];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/log.csv", dir);
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_logging_adaptor_create(host, path, NULL, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  static const char *const logging[] = {"T path", "C events", "C write_errors"};
  bool found_path = false;
  s = describe_is(r, logging, N(logging));
  ck_assert_uint_eq(s.value[1], 2);
  ck_assert_uint_eq(s.value[2], 0);
  rmmc_resource_describe(r, record_path, &found_path);
  ck_assert(found_path);
  rmmc_resource_release(r);
  rmmc_resource_release(host);
  unlink(path);
  rmdir(dir);
}
END_TEST

static const drow_t aligned_rows[] = {RMMC_ALIGNED_FIGURES(DROW)};
static const drow_t failure_rows[] = {RMMC_FAILURE_CALLBACK_FIGURES(DROW)};
static const drow_t sim_rows[] = {RMMC_SIM_FIGURES(DROW)};
static const drow_t sim_vm_rows[] = {RMMC_SIM_VM_FIGURES(DROW)};

static bool never(size_t bytes, void *user) {
  (void)bytes, (void)user;
  return false;
}

START_TEST(test_figures_header_tables_drive_describe) {
  static const char *const aligned[] = {"B alignment", "B threshold", "C outstanding",
                                        "B overhead"};
  static const char *const failure[] = {"T on_failure", "C retries", "C callbacks", "C recovered",
                                        "C gave_up"};
  static const char *const sim[] = {"B reserved",    "B in_use", "B peak",        "B limit",
                                    "C outstanding", "B span",   "B granularity", "C probes"};
  static const char *const sim_vm[] = {"B address_reserved", "C mapped_ranges"};
  check_table(aligned_rows, N(aligned_rows), aligned, N(aligned));
  check_table(failure_rows, N(failure_rows), failure, N(failure));
  check_table(sim_rows, N(sim_rows), sim, N(sim));
  check_table(sim_vm_rows, N(sim_vm_rows), sim_vm, N(sim_vm));

  rmmc_resource_t *r = NULL, *host = NULL;
  void *p = NULL;
  seen_t s = {0};
  ck_assert_int_eq(rmmc_stack_create("aligned(alignment=8KiB, threshold=0) > host", -1, &r),
                   RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(check_reported(&s, 0, aligned_rows, N(aligned_rows), NULL), s.n);
  ck_assert_uint_eq(*seen_value(&s, "alignment"), 8 << 10);
  ck_assert_uint_eq(*seen_value(&s, "outstanding"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);

  /* retries: the built-in form's only. */
  static const char *const retries[] = {"retries", NULL};
  ck_assert_int_eq(rmmc_stack_create("failure_callback(retries=3) > host", -1, &r), RMMC_SUCCESS);
  memset(&s, 0, sizeof s);
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(check_reported(&s, 0, failure_rows, N(failure_rows), retries), s.n);
  ck_assert_uint_eq(*seen_value(&s, "retries"), 3);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("host", -1, &host), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_failure_callback_adaptor_create(host, never, NULL, &r), RMMC_SUCCESS);
  memset(&s, 0, sizeof s);
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(check_reported(&s, 0, failure_rows, N(failure_rows), NULL), s.n);
  ck_assert_ptr_null(seen_value(&s, "retries"));
  rmmc_resource_release(r);
  rmmc_resource_release(host);

  /* limit only with a capacity; the VM figures only once a reservation
   * was made (an expandable pool above makes one). */
  static const char *const limit[] = {"limit", NULL};
  ck_assert_int_eq(rmmc_stack_create("sim", -1, &r), RMMC_SUCCESS);
  memset(&s, 0, sizeof s);
  rmmc_resource_describe(r, record, &s);
  ck_assert_uint_eq(check_reported(&s, 0, sim_rows, N(sim_rows), NULL), s.n);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("pool(expandable=true) > sim(capacity=64MiB)", -1, &r),
                   RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &p), RMMC_SUCCESS);
  memset(&s, 0, sizeof s);
  rmmc_resource_describe(rmmc_resource_upstream(r), record, &s);
  size_t at = check_reported(&s, 0, sim_rows, N(sim_rows), limit);
  ck_assert_uint_eq(check_reported(&s, at, sim_vm_rows, N(sim_vm_rows), NULL), s.n);
  ck_assert_uint_eq(*seen_value(&s, "limit"), 64 << 20);
  ck_assert_uint_gt(*seen_value(&s, "address_reserved"), 0);
  ck_assert_uint_gt(*seen_value(&s, "mapped_ranges"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 1000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

static const drow_t binning_head_rows[] = {RMMC_BINNING_HEAD_FIGURES(DROW)};
static const drow_t binning_bin_rows[] = {RMMC_BINNING_BIN_FIGURES(DROW)};
static const drow_t binning_rows[] = {RMMC_BINNING_FIGURES(DROW)};

START_TEST(test_figures_binning_describe_reports_the_tables) {
  static const char *const head[] = {"C bins"};
  static const char *const bin[] = {"B reserved", "B in_use", "C chunks", "C free_blocks"};
  static const char *const rest[] = {"B reserved", "B in_use", "B cached", "B upstream_in_use",
                                     "C upstream_allocations"};
  check_table(binning_head_rows, N(binning_head_rows), head, N(head));
  check_table(binning_bin_rows, N(binning_bin_rows), bin, N(bin));
  check_table(binning_rows, N(binning_rows), rest, N(rest));
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_stack_create("binning(min=512, max=64KiB, chunk=1MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  void *small = NULL, *large = NULL;
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, NULL, &small), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1 << 20, 256, NULL, &large), RMMC_SUCCESS);
  seen_t s = {0};
  rmmc_resource_describe(r, record, &s);
  size_t at = check_reported(&s, 0, binning_head_rows, N(binning_head_rows), NULL);
  uint64_t nbins = s.value[0], bin_in_use = 0;
  ck_assert_uint_gt(nbins, 1);
  size_t last = 0;
  for (uint64_t j = 0; j < nbins; j++) {
    size_t bytes = 0;
    ck_assert_uint_lt(at, s.n);
    ck_assert_int_eq(sscanf(s.key[at], "bin_%zu_", &bytes), 1);
    ck_assert_uint_gt(bytes, last); /* smallest first */
    last = bytes;
    for (size_t i = 0; i < N(binning_bin_rows); i++, at++) {
      char want[64];
      snprintf(want, sizeof want, "bin_%zu_%s", bytes, binning_bin_rows[i].name);
      ck_assert_uint_lt(at, s.n);
      ck_assert_str_eq(s.key[at], want);
      ck_assert_int_eq(s.kind[at], binning_bin_rows[i].kind);
      if (i == 1) bin_in_use += s.value[at];
    }
  }
  at = check_reported(&s, at, binning_rows, N(binning_rows), NULL);
  static const char *const summed[] = {"event_records", "event_waits", "device_syncs",
                                       "stream_syncs"};
  ck_assert_uint_eq(s.n, at + N(summed));
  for (size_t k = 0; k < N(summed); k++) ck_assert_str_eq(s.key[at + k], summed[k]);
  ck_assert_uint_eq(bin_in_use, 1024);
  ck_assert_uint_eq(*seen_value(&s, "upstream_in_use"), 1 << 20);
  ck_assert_uint_eq(*seen_value(&s, "upstream_allocations"), 1);
  ck_assert_uint_eq(*seen_value(&s, "in_use"), 1024 + (1 << 20));
  ck_assert_int_eq(rmmc_resource_deallocate(r, small, 1000, 256, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, large, 1 << 20, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("figures_tables");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_figures_pool_table_makes_the_struct);
  tcase_add_test(tc, test_figures_pool_rows_are_well_formed);
  tcase_add_test(tc, test_figures_pool_describe_reports_the_table);
  tcase_add_test(tc, test_figures_statistics_table_makes_the_struct);
  tcase_add_test(tc, test_figures_statistics_describe_reports_the_table);
  tcase_add_test(tc, test_figures_fixed_size_describe_reports_the_table);
  tcase_add_test(tc, test_figures_adaptors_in_c_report_as_released);
  tcase_add_test(tc, test_figures_header_tables_drive_describe);
  tcase_add_test(tc, test_figures_binning_describe_reports_the_tables);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
