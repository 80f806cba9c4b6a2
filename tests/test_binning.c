/* SPDX-License-Identifier: Apache-2.0 */
/*
 * binning: conformance, which bin (or the upstream) serves which size and
 * alignment (spy counts and per-bin figures), custom bins and bad bin
 * lists, frees with the wrong size, release_cached, spec options. Host
 * suite, over a host spy.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

#define S1 ((cudaStream_t)0x1000)
#define MiB ((size_t)1 << 20)

static rmmc_status_t make_default(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_binning_resource_create(up, NULL, out);
}

static rmmc_status_t make_custom(rmmc_resource_t *up, rmmc_resource_t **out) {
  static const size_t bins[] = {256, 768, 4096, 3 << 14, 1 << 20};
  rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
  o.bins = bins;
  o.nbins = 5;
  o.chunk_size = 256 << 10;
  return rmmc_binning_resource_create(up, &o, out);
}

START_TEST(test_binning_routes_by_size_class) {
  rmmc_resource_t *spy = new_spy(), *r;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 15);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 0), 256);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 12), MiB);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 14), 4 * MiB);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 15), 0);
  struct { size_t bytes, align, bin; } routes[] = {
      {1, 256, 0},         {256, 256, 0},        {257, 1, 1},          {512, 256, 1},
      {513, 256, 2},       {4096, 256, 4},       {4097, 256, 5},       {MiB - 1, 256, 12},
      {MiB, 256, 12},      {MiB + 1, 256, 13},   {4 * MiB, 256, 14},   {4 * MiB + 1, 256, 15},
      {100, 4096, 4},      {5000, 4096, 5},      {100, 8192, 15},      {SIZE_MAX, 256, 15},
      {(size_t)1 << 63, 256, 15}};
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
    ck_assert_msg(rmmc_binning_resource_bin_for(r, routes[i].bytes, routes[i].align) == routes[i].bin,
                  "%zu/%zu went to %zu, not %zu", routes[i].bytes, routes[i].align,
                  rmmc_binning_resource_bin_for(r, routes[i].bytes, routes[i].align), routes[i].bin);
  /* 300 bytes: the 512 bin takes a 2 MiB chunk of 4096 blocks. */
  void *a, *b, *c, *d;
  ck_assert_int_eq(rmmc_resource_allocate(r, 300, 256, S1, &a), RMMC_SUCCESS);
  spy_counts_t sc = spy_counts(s);
  ck_assert_uint_eq(sc.allocate_calls, 1);
  ck_assert_uint_eq(sc.last_bytes, 2 * MiB);
  ck_assert_uint_eq(field(r, "bin_512_in_use"), 512);
  ck_assert_uint_eq(field(r, "bin_512_chunks"), 1);
  ck_assert_uint_eq(field(r, "bin_512_free_blocks"), 4095);
  ck_assert_uint_eq(field(r, "bin_256_in_use"), 0);
  /* Same class again: no upstream call. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 400, 256, S1, &b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  ck_assert_uint_eq(field(r, "bin_512_in_use"), 1024);
  /* 1 MiB exactly: the largest bin, chunks of 2 blocks. */
  ck_assert_int_eq(rmmc_resource_allocate(r, MiB, 256, S1, &c), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  ck_assert_uint_eq(spy_counts(s).last_bytes, 2 * MiB);
  ck_assert_uint_eq(field(r, "bin_1048576_in_use"), MiB);
  /* Above the largest bin: straight to the upstream, exactly sized. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 4 * MiB + 1, 256, S1, &d), RMMC_SUCCESS);
  sc = spy_counts(s);
  ck_assert_uint_eq(sc.allocate_calls, 3);
  ck_assert_uint_eq(sc.last_bytes, 4 * MiB + 1);
  ck_assert_ptr_eq(sc.last_ptr, d);
  ck_assert_uint_eq(field(r, "upstream_in_use"), 4 * MiB + 1);
  ck_assert_uint_eq(field(r, "upstream_allocations"), 1);
  ck_assert_uint_eq(field(r, "reserved"), 4 * MiB);
  ck_assert_uint_eq(field(r, "in_use"), 1024 + MiB + 4 * MiB + 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, d, 4 * MiB + 1, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 2);
  ck_assert_uint_eq(field(r, "upstream_allocations"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, a, 300, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, b, 400, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, c, MiB, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  /* Each bin is a fixed_size resource over the same upstream. */
  rmmc_resource_t *bin = rmmc_binning_resource_bin(r, 1);
  ck_assert_str_eq(rmmc_resource_name(bin), "fixed_size");
  ck_assert_ptr_eq(rmmc_resource_upstream(bin), spy);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(bin), 512);
  ck_assert_ptr_null(rmmc_binning_resource_bin(r, 15));
  ck_assert_ptr_null(rmmc_binning_resource_bin(spy, 0));
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(spy), 0);
  finish(r, spy);
}
END_TEST

START_TEST(test_binning_custom_bins) {
  rmmc_resource_t *spy = new_spy(), *r;
  ck_assert_int_eq(make_custom(spy, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 5);
  size_t want[] = {256, 768, 4096, 49152, MiB};
  for (size_t i = 0; i < 5; i++) ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, i), want[i]);
  /* 768 is aligned to 256 only, 49152 to 4096: alignment skips bins. */
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 600, 256), 1);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 600, 512), 2);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 5000, 256), 3);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 50000, 256), 4);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 2 * MiB, 256), 5);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 600, 512, S1, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % 512, 0);
  ck_assert_uint_eq(field(r, "bin_4096_in_use"), 4096);
  ck_assert_uint_eq(field(r, "bin_768_in_use"), 0);
  /* chunk_size 256 KiB: 64 blocks of 4 KiB per chunk. */
  ck_assert_uint_eq(spy_counts(spy_of(spy)).last_bytes, 256 << 10);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 600, 512, S1), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

START_TEST(test_binning_bad_bin_lists) {
  rmmc_resource_t *spy = new_spy(), *r = (rmmc_resource_t *)1;
  rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
  static const size_t descending[] = {4096, 256}, zero[] = {256, 0}, same[] = {300, 512};
  static size_t many[RMMC_BINNING_MAX_BINS + 1];
  for (size_t i = 0; i <= RMMC_BINNING_MAX_BINS; i++) many[i] = (i + 1) * 256;
  struct { const size_t *bins; size_t n; const char *needle; } bad[] = {
      {descending, 2, "must ascend"}, {zero, 2, "bin 1 has size 0"}, {same, 2, "must ascend"},
      {many, RMMC_BINNING_MAX_BINS + 1, "65 bins given"}, {many, 0, "0 bins given"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.bins = bad[i].bins;
    o.nbins = bad[i].n;
    ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(rmmc_last_error_message(), bad[i].needle), "%s", rmmc_last_error_message());
  }
  o = (rmmc_binning_options_t)RMMC_BINNING_OPTIONS_INIT;
  o.min_bin = 300;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "powers of two"), "%s", rmmc_last_error_message());
  o.min_bin = 8192;
  o.max_bin = 4096;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "below min_bin"), "%s", rmmc_last_error_message());
  o = (rmmc_binning_options_t)RMMC_BINNING_OPTIONS_INIT;
  o.chunk_size = 0;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  o.size = 0;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_binning_resource_create(NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1);
  /* Small min is raised to 256; 64 bins is the most. */
  o = (rmmc_binning_options_t)RMMC_BINNING_OPTIONS_INIT;
  o.min_bin = 16;
  o.max_bin = 1024;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 3);
  rmmc_resource_release(r);
  o.bins = many;
  o.nbins = RMMC_BINNING_MAX_BINS;
  ck_assert_int_eq(rmmc_binning_resource_create(spy, &o, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 64 * 256, 256), 63);
  ck_assert_uint_eq(rmmc_binning_resource_bin_for(r, 64 * 256 + 1, 256), 64);
  /* Every bin holds the whole octave it is reached from. */
  for (size_t bytes = 1; bytes <= 64 * 256; bytes += 7) {
    size_t i = rmmc_binning_resource_bin_for(r, bytes, 256);
    ck_assert_uint_ge(rmmc_binning_resource_bin_size(r, i), bytes);
    if (i) ck_assert_uint_lt(rmmc_binning_resource_bin_size(r, i - 1), bytes);
  }
  finish(r, spy);
}
END_TEST

START_TEST(test_binning_wrong_size_is_caught_by_the_bin) {
  rmmc_resource_t *spy = new_spy(), *r;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, &r), RMMC_SUCCESS);
  void *p0, *p, *big;
  /* p is the second block, so it is not the bin chunk's own address either. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 256, 256, S1, &p0), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 256, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 5 * MiB, 256, S1, &big), RMMC_SUCCESS);
  /* Routed to the 4 KiB bin, which never handed p out. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  /* Routed above the bins: binning's own map of upstream blocks refuses
   * it, so the upstream never sees it (host could not tell). */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 6 * MiB, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(spy_counts(s).deallocate_errors, 0);
  /* A big block freed with a binned size: the bin refuses it. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, big, 1000, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(field(r, "in_use"), 512 + 5 * MiB);
  /* Same bin, same block: a double free is refused too. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 200, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 256, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r, big, 5 * MiB, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p0, 256, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  rmmc_resource_release(r);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(spy);
}
END_TEST

START_TEST(test_binning_release_cached) {
  rmmc_resource_t *spy = new_spy(), *r;
  spy_t *s = spy_of(spy);
  ck_assert_int_eq(rmmc_binning_resource_create(spy, NULL, &r), RMMC_SUCCESS);
  void *p[6];
  size_t sizes[6] = {256, 1000, 70000, MiB, 5 * MiB, 256};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(rmmc_resource_allocate(r, sizes[i], 256, S1, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 5); /* 4 bin chunks + 1 direct */
  for (int i = 0; i < 5; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], sizes[i], 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 4);
  uint64_t calls = spy_counts(s).release_calls;
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  /* The 256 bin still holds p[5]: its chunk stays; the others went back. */
  ck_assert_uint_eq(spy_counts(s).outstanding, 1);
  ck_assert_uint_eq(spy_counts(s).release_calls, calls + 1); /* forwarded once */
  ck_assert_uint_eq(field(r, "reserved"), 2 * MiB);
  ck_assert_uint_eq(field(r, "bin_256_chunks"), 1);
  ck_assert_uint_eq(field(r, "bin_1024_chunks"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[5], 256, 256, S1), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

/* As fixed_size's: the 2 MiB bin over an upstream with room for one chunk
 * (also in test_gpu_pool's stream-order table); the bins' stream counters
 * show summed on the binning. */
START_TEST(test_binning_over_a_full_limiting_adaptor) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("binning(chunk=2MiB) > limiting(limit=2MiB) > host", -1, &r),
                   RMMC_SUCCESS);
  void *p, *q;
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 * MiB, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 * MiB, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 * MiB, 256, (cudaStream_t)0x2000, &q), RMMC_SUCCESS);
  ck_assert_ptr_eq(q, p);
  ck_assert_uint_eq(field(r, "device_syncs"), 1);
  ck_assert_uint_eq(field(r, "event_waits"), 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 2 * MiB, 256, (cudaStream_t)0x2000), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_binning_spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("binning > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 15);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("binning(min=512, max=64KiB, chunk=1MiB) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 8);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 0), 512);
  ck_assert_uint_eq(field(rmmc_binning_resource_bin(r, 0), "blocks_per_chunk"), 2048);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("binning(bins=256B:4KiB:64KiB) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_binning_resource_bin_count(r), 3);
  ck_assert_uint_eq(rmmc_binning_resource_bin_size(r, 2), 65536);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 5000, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "bin_65536_in_use"), 65536);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 5000, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  expect_spec_error("binning(bins=256B:xyz) > host", RMMC_ERROR_PARSE, "bins=256B:xyz: 'xyz' is not a bin size");
  expect_spec_error("binning(bins=256B::4KiB) > host", RMMC_ERROR_PARSE, "'' is not a bin size");
  expect_spec_error("binning(bins=0:4KiB) > host", RMMC_ERROR_PARSE, "'0' is not a bin size");
  expect_spec_error("binning(bins=4KiB:1KiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "must ascend: 1024");
  expect_spec_error("binning(bins=1KiB, min=256) > host", RMMC_ERROR_PARSE, "not both");
  expect_spec_error("binning(min=300) > host", RMMC_ERROR_INVALID_ARGUMENT, "min_bin (300)");
  expect_spec_error("binning(min=4KiB, max=1KiB) > host", RMMC_ERROR_INVALID_ARGUMENT, "below min_bin");
  expect_spec_error("binning(chunk=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
                    "binning: chunk=0 is out of range (1 to 18446744073709551615)");
  expect_spec_error("binning(max=1XB) > host", RMMC_ERROR_PARSE, "column 13");
  expect_spec_error("binning(mx=1MiB) > host", RMMC_ERROR_PARSE, "it takes: min, max, bins, chunk");
}
END_TEST

START_TEST(test_binning_large_chunk_costs_a_bounded_chunk) {
  /* Issue 41: binning(chunk=64GiB) > sim spent 8 GiB of host memory and 11
   * s on one 256 B request (the 256 B bin's chunk of 2^28 blocks, each with
   * a host descriptor), and chunk=1TiB never finished. A bin now takes at
   * most 2^20 blocks at a time: the small bins' chunks are capped, the
   * large bins' follow chunk= as before. */
  static const char *const specs[] = {"binning(chunk=64GiB) > sim", "binning(chunk=1TiB) > sim"};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *r;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    rmmc_resource_t *small = rmmc_binning_resource_bin(r, 0), *large = rmmc_binning_resource_bin(r, 14);
    ck_assert_uint_eq(field(small, "blocks_per_chunk"), RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK);
    ck_assert_uint_eq(field(large, "blocks_per_chunk"), (i == 0 ? (size_t)64 << 30 : (size_t)1 << 40) >> 22);
    void *p;
    ck_assert_int_eq(rmmc_resource_allocate(r, 256, 256, NULL, &p), RMMC_SUCCESS);
    ck_assert_uint_eq(field(small, "reserved"), 256 * RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK);
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 256, 256, NULL), RMMC_SUCCESS);
    rmmc_resource_release(r);
  }
}
END_TEST

int main(void) {
  static const conformance_case_t cases[] = {
      {"binning default", make_default, 0},
      {"binning custom", make_custom, 0},
  };
  Suite *s = suite_create("binning");
  conformance_add(s, cases, 2);
  TCase *tc = tcase_create("binning");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_binning_routes_by_size_class);
  tcase_add_test(tc, test_binning_custom_bins);
  tcase_add_test(tc, test_binning_bad_bin_lists);
  tcase_add_test(tc, test_binning_wrong_size_is_caught_by_the_bin);
  tcase_add_test(tc, test_binning_release_cached);
  tcase_add_test(tc, test_binning_spec);
  tcase_add_test(tc, test_binning_large_chunk_costs_a_bounded_chunk);
  tcase_add_test(tc, test_binning_over_a_full_limiting_adaptor);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
