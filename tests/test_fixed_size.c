/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fixed_size: conformance, refill from the upstream, refusal of requests
 * larger than the block, release of wholly free chunks, stream-ordered
 * reuse (same stream without events, another stream after an event, the
 * synchronizing fallback when the upstream is out of memory), bad frees,
 * padded chunks when the upstream refuses alignment, spec options. All
 * over a host spy: streams are opaque keys. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"

#define S1 ((cudaStream_t)0x1000)
#define S2 ((cudaStream_t)0x2000)
#define S3 ((cudaStream_t)0x3000)

static rmmc_resource_t *make(rmmc_resource_t *up, size_t block, size_t per_chunk) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = block;
  o.blocks_per_chunk = per_chunk;
  rmmc_resource_t *r = NULL;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(up, &o, &r), RMMC_SUCCESS);
  return r;
}

/* Releases r, then checks the spy got everything back and releases it. */
static rmmc_status_t make_1mib(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.blocks_per_chunk = 8;
  return rmmc_fixed_size_resource_create(up, &o, out);
}

static rmmc_status_t make_4mib(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = (size_t)4 << 20;
  o.blocks_per_chunk = 2;
  return rmmc_fixed_size_resource_create(up, &o, out);
}

static rmmc_status_t make_48k(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = 12 * 4096 - 100; /* rounded to 48 KiB: not a power of two */
  o.blocks_per_chunk = 5;
  return rmmc_fixed_size_resource_create(up, &o, out);
}

START_TEST(test_fixed_size_refill_counts_upstream_calls) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 4);
  spy_t *s = spy_of(spy);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 0); /* nothing taken at creation */
  void *p[9];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  ck_assert_uint_eq(spy_counts(s).last_bytes, 4 * 4096);
  ck_assert_uint_eq(spy_counts(s).last_alignment, 4096);
  ck_assert_ptr_eq(spy_counts(s).last_stream, S1); /* the chunk is taken on the requesting stream */
  /* Blocks are consecutive, aligned, and distinct. */
  for (int i = 0; i < 4; i++) {
    ck_assert_uint_eq((uintptr_t)p[i] % 4096, 0);
    if (i) ck_assert_ptr_eq((char *)p[i], (char *)p[i - 1] + 4096);
  }
  ck_assert_int_eq(rmmc_resource_allocate(r, 100, 256, S1, &p[4]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  ck_assert_uint_eq(field(r, "chunks"), 2);
  ck_assert_uint_eq(field(r, "blocks"), 8);
  ck_assert_uint_eq(field(r, "free_blocks"), 3);
  ck_assert_uint_eq(field(r, "in_use"), 5 * 4096);
  ck_assert_uint_eq(field(r, "reserved"), 8 * 4096);
  ck_assert_uint_eq(field(r, "peak"), 5 * 4096);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], i == 4 ? 100 : 4096, 256, S1), RMMC_SUCCESS);
  /* Everything is reused: no more upstream calls for 8 blocks. */
  for (int i = 0; i < 8; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 1, 256, S1, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 2);
  ck_assert_int_eq(rmmc_resource_allocate(r, 1, 256, S1, &p[8]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 3);
  for (int i = 0; i < 9; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 1, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_uint_eq(field(r, "peak"), 8 * 4096 + 4096);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_refuses_larger_than_block) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 4);
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4097, 256, S1, &p), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_null(p);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "4097 bytes") && strstr(m, "block size 4.00 KiB (4096 bytes)"), "%s", m);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 8192, S1, &p), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_msg(strstr(rmmc_last_error_message(), "alignment 8192") != NULL, "%s", rmmc_last_error_message());
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 0);
  /* Exactly the block size and its alignment are served. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 4096, S1, &p), RMMC_SUCCESS);
  ck_assert_uint_eq((uintptr_t)p % 4096, 0);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 4096, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(r), 4096);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_alignment(r), 4096);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(spy), 0);
  /* An odd block size is rounded to 256 and aligned to its largest power of two. */
  rmmc_resource_t *odd = make(spy, 3 * 256 - 5, 2);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(odd), 768);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_alignment(odd), 256);
  ck_assert_int_eq(rmmc_resource_allocate(odd, 700, 512, S1, &p), RMMC_ERROR_NOT_SUPPORTED);
  rmmc_resource_release(odd);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_release_cached_returns_wholly_free_chunks) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 1024, 4);
  spy_t *s = spy_of(spy);
  void *p[12];
  for (int i = 0; i < 12; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S1, &p[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 3);
  /* Free everything but block 5 (second chunk), some on another stream. */
  for (int i = 0; i < 12; i++)
    if (i != 5) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 1000, 256, i % 2 ? S1 : S2), RMMC_SUCCESS);
  uint64_t releases = spy_counts(s).release_calls;
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_uint_eq(c.outstanding_bytes, 4 * 1024);
  ck_assert_uint_eq(c.release_calls, releases + 1); /* forwarded to the upstream */
  ck_assert_uint_eq(field(r, "chunks"), 1);
  ck_assert_uint_eq(field(r, "free_blocks"), 3);
  ck_assert_uint_eq(field(r, "reserved"), 4 * 1024);
  ck_assert_uint_eq(field(r, "device_syncs"), 1); /* blocks may have had work in flight */
  /* The kept chunk still works: its free blocks serve both streams. */
  void *q[3];
  for (int i = 0; i < 3; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S3, &q[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 3);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, q[i], 1000, 256, S3), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[5], 1000, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_uint_eq(field(r, "chunks"), 0);
  /* Nothing free: release takes no sync. */
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "device_syncs"), 2);
  /* And it grows again afterwards. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 1000, 256, S1, &q[0]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q[0], 1000, 256, S1), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_same_stream_reuse_makes_no_event) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 4);
  void *p, *q;
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &p), RMMC_SUCCESS);
    if (i) ck_assert_ptr_eq(p, q); /* LIFO: the block just freed */
    ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, S1), RMMC_SUCCESS);
    q = p;
  }
  ck_assert_uint_eq(field(r, "streams"), 1);
  ck_assert_uint_eq(field(r, "event_records"), 0);
  ck_assert_uint_eq(field(r, "event_waits"), 0);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_other_stream_waits_on_event) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 1);
  void *w, *x, *y;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &w), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &x), RMMC_SUCCESS);
  /* S2 had to take a chunk (it is short of blocks): the free on S1
   * records S1's event for it. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  /* S2's list is empty: it takes S1's block after waiting on the event. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &y), RMMC_SUCCESS);
  ck_assert_ptr_eq(y, x);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 2);
  /* Now it is S2's: freed and reused on S2 without a wait. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 4096, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &y), RMMC_SUCCESS);
  ck_assert_ptr_eq(y, x);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 4096, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, w, 4096, 256, S2), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_uncovered_block_stays_with_its_stream) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 1);
  void *x, *y, *z;
  /* One stream only: the free records nothing, so no other stream may
   * take the block: S2 grows instead. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 0);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &y), RMMC_SUCCESS);
  ck_assert_ptr_ne(y, x);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 2);
  ck_assert_uint_eq(field(r, "event_waits"), 0);
  /* S1 still reuses its own block at once. */
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &z), RMMC_SUCCESS);
  ck_assert_ptr_eq(z, x);
  /* S2 had to grow: it is starving, so S1's next free covers its list. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, z, 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  /* S2's own free ends its starving: nobody needs events any more. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 4096, 256, S2), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_streams_that_share_nothing_record_nothing) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 4);
  void *p[4];
  cudaStream_t st[2] = {S1, S2};
  for (int round = 0; round < 50; round++)
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < 4; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, st[k], &p[i]), RMMC_SUCCESS);
      for (int i = 0; i < 4; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 4096, 256, st[k]), RMMC_SUCCESS);
    }
  ck_assert_uint_eq(field(r, "streams"), 2);
  ck_assert_uint_eq(field(r, "chunks"), 2);
  ck_assert_uint_eq(field(r, "event_records"), 0);
  ck_assert_uint_eq(field(r, "event_waits"), 0);
  /* S2 needs a fifth block: it takes a chunk and starves; S1's next free
   * is covered and S2's next shortage takes S1's blocks after a wait. */
  void *q[8];
  for (int i = 0; i < 5; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &q[i]), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "chunks"), 3);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &p[0]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[0], 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_records"), 1);
  for (int i = 5; i < 8; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &q[i]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &p[1]), RMMC_SUCCESS);
  ck_assert_uint_eq(field(r, "event_waits"), 1);
  ck_assert_uint_eq(field(r, "chunks"), 3);
  for (int i = 0; i < 8; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, q[i], 4096, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p[1], 4096, 256, S2), RMMC_SUCCESS);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_out_of_memory_synchronizes_and_reuses) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 1);
  spy_t *s = spy_of(spy);
  void *x, *y;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &x), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, 4096, 256, S1), RMMC_SUCCESS);
  spy_set_capacity(s, 4096); /* no second chunk */
  void *unused;
  ck_assert_int_eq(rmmc_resource_allocate(NULL, 1, 256, S1, &unused), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S2, &y), RMMC_SUCCESS);
  ck_assert_ptr_eq(y, x);
  /* The failure it overcame does not show: the last error is still ours. */
  ck_assert_msg(strstr(rmmc_last_error_message(), "resource is NULL"), "%s", rmmc_last_error_message());
  ck_assert_uint_eq(field(r, "device_syncs"), 1);
  ck_assert_uint_eq(spy_counts(s).allocate_failures, 1);
  /* Nothing free anywhere: a clean out-of-memory naming the chunk. */
  void *z = (void *)1;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &z), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_ptr_null(z);
  const char *m = rmmc_last_error_message();
  ck_assert_msg(strstr(m, "fixed_size (4.00 KiB blocks) could not take a 4.00 KiB chunk from spy"), "%s", m);
  ck_assert_msg(strstr(m, "stack: fixed_size (reserved 4.00 KiB, in use 4.00 KiB)"), "%s", m);
  ck_assert_uint_eq(field(r, "device_syncs"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, 4096, 256, S2), RMMC_SUCCESS);
  spy_set_capacity(s, SIZE_MAX);
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_bad_frees_change_nothing) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 4096, 4);
  void *p, *q;
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &q), RMMC_SUCCESS);
  char local[512];
  void *foreign = malloc(4096);
  /* A pointer from elsewhere, an interior pointer, one past the chunk. */
  void *bad[] = {foreign, local, (char *)p + 256, (char *)p + 4 * 4096, (char *)p - 4096};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(rmmc_resource_deallocate(r, bad[i], 4096, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
    ck_assert_msg(strstr(rmmc_last_error_message(), "not the start of one of its blocks"), "%s",
                  rmmc_last_error_message());
  }
  /* A size or alignment no block could have had. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 8192, 256, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 1 << 16, S1), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_uint_eq(field(r, "in_use"), 2 * 4096);
  /* Double free. */
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 4096, 256, S2), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_msg(strstr(rmmc_last_error_message(), "already free"), "%s", rmmc_last_error_message());
  ck_assert_uint_eq(field(r, "in_use"), 4096);
  ck_assert_uint_eq(field(r, "free_blocks"), 3);
  ck_assert_uint_eq(field(r, "streams"), 1); /* the refused free created nothing */
  /* Still consistent: all four blocks come back, distinct. */
  void *all[4];
  all[0] = q;
  for (int i = 1; i < 4; i++) ck_assert_int_eq(rmmc_resource_allocate(r, 4096, 256, S1, &all[i]), RMMC_SUCCESS);
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++) ck_assert_ptr_ne(all[i], all[j]);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, all[i], 4096, 256, S1), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).allocate_calls, 1);
  free(foreign);
  finish(r, spy);
}
END_TEST

/* An upstream that refuses alignments above 256, as the base CUDA
 * resources do, over a spy. */
typedef struct picky {
  rmmc_resource_t base;
  rmmc_resource_t *up;
} picky_t;

static rmmc_status_t picky_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  if (alignment > 256) return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "picky: alignment %zu", alignment);
  return rmmc_resource_allocate(((picky_t *)r)->up, bytes, alignment, stream, out);
}

static rmmc_status_t picky_deallocate(rmmc_resource_t *r, void *p, size_t bytes, size_t alignment,
                                      cudaStream_t stream) {
  return rmmc_resource_deallocate(((picky_t *)r)->up, p, bytes, alignment, stream);
}

static void picky_destroy(rmmc_resource_t *r) {
  rmmc_resource_release(((picky_t *)r)->up);
  free(r);
}

static const rmmc_resource_ops_t picky_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "picky",
    .allocate = picky_allocate,
    .deallocate = picky_deallocate,
    .destroy = picky_destroy,
};

START_TEST(test_fixed_size_pads_chunks_when_upstream_refuses_alignment) {
  rmmc_resource_t *spy = new_spy();
  picky_t *pk = calloc(1, sizeof *pk);
  rmmc_resource_init(&pk->base, &picky_ops, RMMC_MEMORY_HOST, -1);
  pk->up = rmmc_resource_retain(spy);
  rmmc_resource_t *r = make(&pk->base, 8192, 3);
  rmmc_resource_release(&pk->base);
  void *p[4];
  rmmc_clear_last_error();
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(rmmc_resource_allocate(r, 8192, 4096, S1, &p[i]), RMMC_SUCCESS);
    ck_assert_uint_eq((uintptr_t)p[i] % 4096, 0);
    memset(p[i], i, 8192);
  }
  ck_assert_str_eq(rmmc_last_error_message(), ""); /* the refused alignment is not reported */
  spy_counts_t c = spy_counts(spy_of(spy));
  ck_assert_uint_eq(c.allocate_calls, 2);
  ck_assert_uint_eq(c.last_bytes, 3 * 8192 + 4096 - 256);
  ck_assert_uint_eq(c.last_alignment, 256);
  ck_assert_uint_eq(field(r, "reserved"), 2 * (3 * 8192 + 4096 - 256));
  for (int i = 0; i < 4; i++) ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], 8192, 4096, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  finish(r, spy);
}
END_TEST

static void *hammer(void *arg) {
  rmmc_resource_t *r = arg;
  cudaStream_t st = (cudaStream_t)(uintptr_t)(0x100000 + ((uintptr_t)pthread_self() & 0xff00));
  unsigned char *p[16];
  for (int round = 0; round < 2000; round++) {
    int n = 1 + round % 16;
    for (int i = 0; i < n; i++) {
      if (rmmc_resource_allocate(r, 2048, 256, st, (void **)&p[i]) != RMMC_SUCCESS) return (void *)1;
      memset(p[i], (unsigned char)(round + i), 2048);
    }
    for (int i = 0; i < n; i++) {
      if (p[i][0] != (unsigned char)(round + i) || p[i][2047] != (unsigned char)(round + i)) return (void *)2;
      if (rmmc_resource_deallocate(r, p[i], 2048, 256, round % 3 ? st : S1) != RMMC_SUCCESS) return (void *)3;
    }
  }
  return NULL;
}

START_TEST(test_fixed_size_threads_on_their_streams) {
  rmmc_resource_t *spy = new_spy(), *r = make(spy, 2048, 8);
  enum { T = 8 };
  pthread_t th[T];
  for (int i = 0; i < T; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, hammer, r), 0);
  for (int i = 0; i < T; i++) {
    void *res;
    pthread_join(th[i], &res);
    ck_assert_ptr_null(res);
  }
  ck_assert_uint_eq(field(r, "in_use"), 0);
  ck_assert_uint_eq(field(r, "free_blocks"), field(r, "blocks"));
  finish(r, spy);
}
END_TEST

START_TEST(test_fixed_size_create_checks_arguments) {
  rmmc_resource_t *spy = new_spy(), *r = (rmmc_resource_t *)1;
  rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(NULL, NULL, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  o.block_size = 0;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  o = (rmmc_fixed_size_options_t)RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.blocks_per_chunk = 0;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  o = (rmmc_fixed_size_options_t)RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = SIZE_MAX / 1024;
  o.blocks_per_chunk = 1024;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rmmc_last_error_message(), "overflow") != NULL, "%s", rmmc_last_error_message());
  /* At most 2^20 blocks a chunk: each has a host descriptor, made when the
   * chunk is taken (issue 41: 2^28 of them took 8 GiB and 11 s). */
  o = (rmmc_fixed_size_options_t)RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.block_size = 256;
  o.blocks_per_chunk = RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK + 1;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_str_eq(rmmc_last_error_message(),
                   "fixed_size_resource_create: blocks_per_chunk=1048577 is out of range (1 to "
                   "1048576)");
  o.blocks_per_chunk = RMMC_FIXED_SIZE_MAX_BLOCKS_PER_CHUNK;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_SUCCESS);
  rmmc_resource_release(r);
  o = (rmmc_fixed_size_options_t)RMMC_FIXED_SIZE_OPTIONS_INIT;
  o.size = 0;
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, &o, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 1); /* failed creates retain nothing */
  /* Defaults: 1 MiB blocks, 128 per chunk; upstream retained. */
  ck_assert_int_eq(rmmc_fixed_size_resource_create(spy, NULL, &r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(spy), 2);
  ck_assert_str_eq(rmmc_resource_name(r), "fixed_size");
  ck_assert_ptr_eq(rmmc_resource_upstream(r), spy);
  ck_assert_uint_eq(field(r, "block_size"), 1 << 20);
  ck_assert_uint_eq(field(r, "blocks_per_chunk"), 128);
  finish(r, spy);
}
END_TEST

/* A stack whose upstream gives one chunk only: stream B gets the block A
 * freed (no event covered it) after the device synchronization. The same
 * case runs on a GPU in test_gpu_pool's stream-order table. */
START_TEST(test_fixed_size_over_a_full_limiting_adaptor) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("fixed_size(block=2MiB, blocks_per_chunk=1) > limiting(limit=2MiB) > host",
                                     -1, &r), RMMC_SUCCESS);
  void *p, *q;
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 << 20, 256, S1, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 2 << 20, 256, S1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, 2 << 20, 256, S2, &q), RMMC_SUCCESS);
  ck_assert_ptr_eq(q, p);
  ck_assert_uint_eq(field(r, "device_syncs"), 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, q, 2 << 20, 256, S2), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(rmmc_resource_upstream(r), "in_use"), 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_fixed_size_spec) {
  rmmc_resource_t *r;
  ck_assert_int_eq(rmmc_stack_create("fixed_size(block=64KiB, blocks_per_chunk=4) > host", -1, &r), RMMC_SUCCESS);
  ck_assert_str_eq(rmmc_resource_name(r), "fixed_size");
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(r), 65536);
  ck_assert_uint_eq(field(r, "blocks_per_chunk"), 4);
  void *p;
  ck_assert_int_eq(rmmc_resource_allocate(r, 65536, 256, NULL, &p), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_deallocate(r, p, 65536, 256, NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
  ck_assert_int_eq(rmmc_stack_create("fixed_size > host", -1, &r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_fixed_size_resource_block_size(r), 1 << 20);
  rmmc_resource_release(r);
  expect_spec_error("fixed_size(block=12XB) > host", RMMC_ERROR_PARSE, "'12XB' is not a size");
  expect_spec_error("fixed_size(block=12XB) > host", RMMC_ERROR_PARSE, "column 18");
  expect_spec_error("fixed_size(blocks_per_chunk=many) > host", RMMC_ERROR_PARSE, "'many' is not an integer");
  expect_spec_error("fixed_size(blocks=4) > host", RMMC_ERROR_PARSE, "it takes: block, blocks_per_chunk");
  expect_spec_error("fixed_size(block=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
                    "fixed_size: block=0 is out of range (1 to 18446744073709551615)");
  expect_spec_error("fixed_size(blocks_per_chunk=0) > host", RMMC_ERROR_INVALID_ARGUMENT,
                    "blocks_per_chunk=0 is out of range (1 to 1048576)");
  expect_spec_error("fixed_size(blocks_per_chunk=-3) > host", RMMC_ERROR_INVALID_ARGUMENT,
                    "blocks_per_chunk=-3 is out of range");
  /* Issue 11, F5: the value as written, not a wrapped one. */
  expect_spec_error("fixed_size(blocks_per_chunk=18446744073709551615) > host", RMMC_ERROR_PARSE,
                    "blocks_per_chunk=18446744073709551615 is out of range (integers are 64-bit)");
  expect_spec_error("fixed_size(block=18446744073709551616) > host", RMMC_ERROR_PARSE,
                    "block=18446744073709551616 is out of range (sizes are below 16 EiB)");
  expect_spec_error("fixed_size", RMMC_ERROR_PARSE, "fixed_size needs an upstream");
}
END_TEST

/* Issue 11: a new stream handle per call took a new chunk per handle (no
 * stream ever covered its frees for the next). Past 64 streams, with half
 * the blocks free on other streams, a synchronization serves instead of a
 * new chunk: the first 64 handles take a chunk each, as before, and no
 * more. binning's bins are fixed_size: the same bound. Over sim. */
START_TEST(test_fixed_size_new_stream_per_call_stays_bounded) {
  static const char *const specs[] = {"fixed_size(block=64KiB) > sim", "binning > sim"};
  static const uint64_t bound[] = {65 * 8 * (uint64_t)1 << 20, 65 * 2 * (uint64_t)1 << 20};
  for (int i = 0; i < 2; i++) {
    rmmc_resource_t *r;
    ck_assert_int_eq(rmmc_stack_create(specs[i], -1, &r), RMMC_SUCCESS);
    for (int k = 0; k < 2000; k++) {
      cudaStream_t s = (cudaStream_t)(uintptr_t)(0x10000 + 16 * (uintptr_t)k);
      void *p;
      ck_assert_int_eq(rmmc_resource_allocate(r, 65536, 256, s, &p), RMMC_SUCCESS);
      ck_assert_int_eq(rmmc_resource_deallocate(r, p, 65536, 256, s), RMMC_SUCCESS);
    }
    ck_assert_msg(field(r, "reserved") <= bound[i], "%s: %llu bytes reserved", specs[i],
                  (unsigned long long)field(r, "reserved"));
    ck_assert_uint_ge(field(r, "device_syncs"), 1);
    rmmc_resource_release(r);
  }
}
END_TEST

int main(void) {
  static const conformance_case_t cases[] = {
      {"fixed_size 1MiB", make_1mib, (size_t)1 << 20},
      {"fixed_size 4MiB", make_4mib, (size_t)4 << 20},
      {"fixed_size 48KiB", make_48k, 12 * 4096},
  };
  Suite *s = suite_create("fixed_size");
  conformance_add(s, cases, 3);
  TCase *tc = tcase_create("fixed_size");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_fixed_size_refill_counts_upstream_calls);
  tcase_add_test(tc, test_fixed_size_refuses_larger_than_block);
  tcase_add_test(tc, test_fixed_size_release_cached_returns_wholly_free_chunks);
  tcase_add_test(tc, test_fixed_size_same_stream_reuse_makes_no_event);
  tcase_add_test(tc, test_fixed_size_other_stream_waits_on_event);
  tcase_add_test(tc, test_fixed_size_uncovered_block_stays_with_its_stream);
  tcase_add_test(tc, test_fixed_size_streams_that_share_nothing_record_nothing);
  tcase_add_test(tc, test_fixed_size_out_of_memory_synchronizes_and_reuses);
  tcase_add_test(tc, test_fixed_size_bad_frees_change_nothing);
  tcase_add_test(tc, test_fixed_size_pads_chunks_when_upstream_refuses_alignment);
  tcase_add_test(tc, test_fixed_size_threads_on_their_streams);
  tcase_add_test(tc, test_fixed_size_create_checks_arguments);
  tcase_add_test(tc, test_fixed_size_spec);
  tcase_add_test(tc, test_fixed_size_over_a_full_limiting_adaptor);
  tcase_add_test(tc, test_fixed_size_new_stream_per_call_stays_bounded);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
