/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fixed_size, binning and arena (a mode of the pool) over the cuda resource
 * on a real GPU:
 * data written and checked by kernels on several streams, and stream-ordered
 * reuse: a block written by a slow kernel on stream A and freed on A is
 * handed to stream B (the same pointer, asserted, so the check means
 * something); B overwrites it and every byte must hold B's value, which only
 * happens if B was made to wait for A. Also: a stream destroyed after
 * freeing on it. Suite cuda: exits 77 without a GPU, runs without fork.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_kernels.h"
#include "rmmc/rmmc.h"
#include "test_main.h"

#define CUDA_OK(x) ck_assert_int_eq((x), cudaSuccess)
#define MiB ((size_t)1 << 20)
#define SLOW_NS ((uint64_t)50 * 1000 * 1000)

typedef enum { FIXED_SIZE, BINNING, ARENA_LARGE, ARENA_SMALL } kind_t;

static const char *kind_name(kind_t k) {
  static const char *names[] = {"fixed_size", "binning", "arena (large blocks)", "arena (small blocks)"};
  return names[k];
}

/* Each configured so that a block freed on A can only reach B as the very
 * same block: one block per chunk, or an arena whose limit leaves no
 * other room (1 MiB superblocks: blocks up to 256 KiB are the stream
 * heaps', larger ones the shared heap's). */
static rmmc_resource_t *make(kind_t k, rmmc_resource_t *cuda) {
  rmmc_resource_t *r = NULL;
  rmmc_status_t st = RMMC_ERROR_INTERNAL;
  if (k == FIXED_SIZE) {
    rmmc_fixed_size_options_t o = RMMC_FIXED_SIZE_OPTIONS_INIT;
    o.block_size = MiB;
    o.blocks_per_chunk = 1;
    st = rmmc_fixed_size_resource_create(cuda, &o, &r);
  } else if (k == BINNING) {
    rmmc_binning_options_t o = RMMC_BINNING_OPTIONS_INIT;
    o.chunk_size = MiB; /* the 1 MiB bin takes one block per chunk */
    st = rmmc_binning_resource_create(cuda, &o, &r);
  } else if (k == ARENA_LARGE) {
    rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
    o.superblock_size = MiB;
    o.chunk_size = 2 * MiB;
    o.max_size = 2 * MiB; /* room for exactly two 1 MiB large blocks */
    st = rmmc_arena_resource_create(cuda, &o, &r);
  } else {
    rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
    o.superblock_size = 2 * MiB; /* cuda's page: the least a pool maps */
    o.chunk_size = 2 * MiB;
    o.max_size = 2 * MiB; /* one span in all: B takes A's idle span back */
    st = rmmc_arena_resource_create(cuda, &o, &r);
  }
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %s", kind_name(k), rmmc_last_error_message());
  return r;
}

static rmmc_resource_t *cuda_resource(void) {
  rmmc_resource_t *c;
  ck_assert_int_eq(rmmc_cuda_resource_create(0, &c), RMMC_SUCCESS);
  return c;
}

/* Every byte of the n-byte device block p equals v. */
static void expect_bytes(const void *p, size_t n, unsigned char v, const char *what) {
  unsigned char *h = malloc(n);
  ck_assert_ptr_nonnull(h);
  CUDA_OK(cudaMemcpy(h, p, n, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != v;
  free(h);
  ck_assert_msg(bad == 0, "%s: %zu of %zu bytes are not 0x%02x", what, bad, n, v);
}

/* Several streams, each allocating blocks of several sizes: the arena gets
 * its default options here (the tight ones of make() hold one or two
 * superblocks, too few for four streams' heaps). */
static void roundtrip_on_streams(kind_t k) {
  rmmc_resource_t *cuda = cuda_resource(), *r = NULL;
  if (k == ARENA_LARGE) ck_assert_int_eq(rmmc_arena_resource_create(cuda, NULL, &r), RMMC_SUCCESS);
  else r = make(k, cuda);
  enum { NS = 4, PER = 6 };
  cudaStream_t s[NS];
  for (int i = 0; i < NS; i++) CUDA_OK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
  unsigned long long *errors;
  CUDA_OK(cudaMallocManaged((void **)&errors, sizeof *errors, cudaMemAttachGlobal));
  *errors = 0;
  /* Up to 1 MiB: fixed_size's block; bins from 256 B to 1 MiB; the
   * arena's stream heaps (up to 4 MiB) and a shared-heap block. */
  size_t sizes[PER] = {256, 4096, 70000, 200000, 1000, MiB};
  if (k == ARENA_LARGE) sizes[5] = 5 * MiB + 1000;
  for (int round = 0; round < 3; round++) {
    void *p[NS][PER];
    for (int i = 0; i < NS; i++)
      for (int j = 0; j < PER; j++) {
        rmmc_status_t st = rmmc_resource_allocate(r, sizes[j], 256, s[i], &p[i][j]);
        ck_assert_msg(st == RMMC_SUCCESS, "%s: allocate %zu: %s", kind_name(k), sizes[j],
                      rmmc_last_error_message());
        CUDA_OK(gpu_fill_pattern(p[i][j], sizes[j], (uint32_t)(round * 100 + i * 10 + j), s[i]));
      }
    for (int i = 0; i < NS; i++)
      for (int j = 0; j < PER; j++) {
        CUDA_OK(gpu_check_pattern(p[i][j], sizes[j], (uint32_t)(round * 100 + i * 10 + j), errors, s[i]));
        /* Freed on its stream right after the check is enqueued: stream order
         * keeps the next user of the block behind the check. */
        ck_assert_int_eq(rmmc_resource_deallocate(r, p[i][j], sizes[j], 256, s[i]), RMMC_SUCCESS);
      }
  }
  CUDA_OK(cudaDeviceSynchronize());
  ck_assert_msg(*errors == 0, "%s: %llu bytes wrong", kind_name(k), *errors);
  CUDA_OK(cudaFree(errors));
  for (int i = 0; i < NS; i++) CUDA_OK(cudaStreamDestroy(s[i]));
  rmmc_resource_release(r);
  rmmc_resource_release(cuda);
}

START_TEST(test_gpu_suballoc_roundtrip_on_streams) {
  roundtrip_on_streams(FIXED_SIZE);
  roundtrip_on_streams(BINNING);
  roundtrip_on_streams(ARENA_LARGE); /* a default arena */
}
END_TEST

static void reuse_waits_for_the_freeing_stream(kind_t k) {
  rmmc_resource_t *cuda = cuda_resource(), *r = make(k, cuda);
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  size_t n = k == ARENA_SMALL ? 4096 : MiB;
  void *w = NULL, *x, *y;
  /* B takes a block first: for fixed_size and binning B then had to take a
   * chunk, so A's free records A's event for B; in the arena it takes the
   * other block its limit allows, and A's free of a large block records
   * A's event while two streams use it. A small block's span, idle in A's
   * heap with no event (the free was on its own stream), reaches B after
   * the last resort, a device synchronization. */
  if (k != ARENA_SMALL) ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, b, &w), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, a, &x), RMMC_SUCCESS);
  CUDA_OK(gpu_slow_fill(x, n, 0xaa, SLOW_NS, a));
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, n, 256, a), RMMC_SUCCESS);
  rmmc_status_t st = rmmc_resource_allocate(r, n, 256, b, &y);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: %s", kind_name(k), rmmc_last_error_message());
  ck_assert_msg(y == x, "%s: B got %p, not the block A freed (%p)", kind_name(k), y, x);
  CUDA_OK(cudaMemsetAsync(y, 0x55, n, b));
  CUDA_OK(cudaStreamSynchronize(b));
  CUDA_OK(cudaStreamSynchronize(a));
  expect_bytes(y, n, 0x55, kind_name(k));
  /* How B was held back, as the figures tell. */
  uint64_t waits = 0, syncs = 0;
  rmmc_resource_t *fr = k == BINNING ? rmmc_binning_resource_bin(r, rmmc_binning_resource_bin_for(r, n, 256)) : r;
  ck_assert(rmmc_resource_get_field(fr, "event_waits", &waits));
  ck_assert(rmmc_resource_get_field(fr, "device_syncs", &syncs));
  /* The arena's small block: A's free emptied A's heap, which records A's
   * event (issue 25, F9), so B may wait on it on the GPU; otherwise the
   * last resort synchronizes the device. */
  if (k == ARENA_SMALL) ck_assert_uint_ge(waits + syncs, 1);
  else ck_assert_uint_eq(waits, 1);
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, n, 256, b), RMMC_SUCCESS);
  if (w != NULL) ck_assert_int_eq(rmmc_resource_deallocate(r, w, n, 256, b), RMMC_SUCCESS);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  rmmc_resource_release(r);
  rmmc_resource_release(cuda);
}

START_TEST(test_gpu_suballoc_reuse_waits_for_the_freeing_stream) {
  reuse_waits_for_the_freeing_stream(FIXED_SIZE);
  reuse_waits_for_the_freeing_stream(BINNING);
  reuse_waits_for_the_freeing_stream(ARENA_LARGE);
  reuse_waits_for_the_freeing_stream(ARENA_SMALL);
}
END_TEST

/* A block freed on A while the slow kernel runs, A destroyed at once; C
 * takes the block later: the resource waits on A's event (it outlives A)
 * and never names A again. */
static void freed_on_a_destroyed_stream(kind_t k) {
  rmmc_resource_t *cuda = cuda_resource(), *r = make(k, cuda);
  cudaStream_t a, c;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  size_t n = k == ARENA_SMALL ? 4096 : MiB;
  void *w = NULL, *x, *y;
  if (k != ARENA_SMALL) ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, c, &w), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, a, &x), RMMC_SUCCESS);
  CUDA_OK(gpu_slow_fill(x, n, 0xaa, SLOW_NS, a));
  ck_assert_int_eq(rmmc_resource_deallocate(r, x, n, 256, a), RMMC_SUCCESS);
  CUDA_OK(cudaStreamDestroy(a));
  ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, c, &y), RMMC_SUCCESS);
  ck_assert_ptr_eq(y, x);
  CUDA_OK(cudaMemsetAsync(y, 0x66, n, c));
  CUDA_OK(cudaStreamSynchronize(c));
  CUDA_OK(cudaDeviceSynchronize());
  expect_bytes(y, n, 0x66, kind_name(k));
  ck_assert_int_eq(rmmc_resource_deallocate(r, y, n, 256, c), RMMC_SUCCESS);
  if (w != NULL) ck_assert_int_eq(rmmc_resource_deallocate(r, w, n, 256, c), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  CUDA_OK(cudaStreamDestroy(c));
  rmmc_resource_release(r);
  rmmc_resource_release(cuda);
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
}

START_TEST(test_gpu_suballoc_freed_on_a_destroyed_stream) {
  freed_on_a_destroyed_stream(FIXED_SIZE);
  freed_on_a_destroyed_stream(BINNING);
  freed_on_a_destroyed_stream(ARENA_LARGE);
  freed_on_a_destroyed_stream(ARENA_SMALL);
}
END_TEST

/* Same stream: reuse at once, no event, and the data stays in order. */
START_TEST(test_gpu_suballoc_same_stream_reuse) {
  rmmc_resource_t *cuda = cuda_resource();
  for (kind_t k = FIXED_SIZE; k <= ARENA_SMALL; k++) {
    rmmc_resource_t *r = make(k, cuda);
    cudaStream_t a;
    CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    size_t n = k == ARENA_SMALL ? 4096 : MiB;
    void *x, *y;
    ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, a, &x), RMMC_SUCCESS);
    CUDA_OK(gpu_slow_fill(x, n, 0xaa, SLOW_NS / 5, a));
    ck_assert_int_eq(rmmc_resource_deallocate(r, x, n, 256, a), RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_resource_allocate(r, n, 256, a, &y), RMMC_SUCCESS);
    ck_assert_ptr_eq(y, x);
    CUDA_OK(cudaMemsetAsync(y, 0x77, n, a));
    CUDA_OK(cudaStreamSynchronize(a));
    expect_bytes(y, n, 0x77, kind_name(k));
    uint64_t records = 1, waits = 1;
    rmmc_resource_t *fr = k == BINNING ? rmmc_binning_resource_bin(r, rmmc_binning_resource_bin_for(r, n, 256)) : r;
    ck_assert(rmmc_resource_get_field(fr, "event_waits", &waits));
    ck_assert(rmmc_resource_get_field(fr, "event_records", &records));
    ck_assert_uint_eq(waits, 0);
    /* Large frees record for other streams; a free that empties a stream
     * heap records on its 1st, 2nd, 4th, ... time (issue 25, F9). */
    if (k == ARENA_SMALL) ck_assert_uint_le(records, 1);
    else if (k != ARENA_LARGE) ck_assert_uint_eq(records, 0);
    ck_assert_int_eq(rmmc_resource_deallocate(r, y, n, 256, a), RMMC_SUCCESS);
    CUDA_OK(cudaStreamDestroy(a));
    rmmc_resource_release(r);
  }
  rmmc_resource_release(cuda);
}
END_TEST

/* The out-of-memory rule on the device (issue 11): blocks written by slow
 * kernels on stream A and freed there fill what the stack may take; a
 * larger request on stream B must then be served from the memory the
 * stack's caches give back (after the work on A: B's pattern must read
 * back whole), and leave no CUDA error behind. */
START_TEST(test_gpu_suballoc_out_of_memory_gives_back_cached_memory) {
  static const struct {
    const char *spec;
    int n;
    size_t each, big;
  } cases[] = {
      {"binning > limiting(limit=64MiB) > cuda", 15, 4 * MiB, 8 * MiB},
      {"binning > pool(max=64MiB) > cuda", 14, 4 * MiB, 8 * MiB},
      /* cuda refuses 1 MiB alignment: chunks are padded to 9 MiB, so three
       * 7 MiB blocks fill the 32 MiB maximum */
      {"arena(max=32MiB, superblock=1MiB, chunk=8MiB) > cuda", 3, 7 * MiB, 16 * MiB},
  };
  unsigned long long *errors;
  CUDA_OK(cudaMallocManaged((void **)&errors, sizeof *errors, cudaMemAttachGlobal));
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    rmmc_resource_t *r = NULL;
    ck_assert_msg(rmmc_stack_create(cases[c].spec, 0, &r) == RMMC_SUCCESS, "%s: %s", cases[c].spec,
                  rmmc_last_error_message());
    cudaStream_t a, b;
    CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    void *p[16];
    for (int i = 0; i < cases[c].n; i++) {
      ck_assert_msg(rmmc_resource_allocate(r, cases[c].each, 256, a, &p[i]) == RMMC_SUCCESS,
                    "%s, block %d: %s", cases[c].spec, i, rmmc_last_error_message());
      CUDA_OK(gpu_slow_fill(p[i], cases[c].each, 0xaa, SLOW_NS / 10, a));
    }
    for (int i = 0; i < cases[c].n; i++)
      ck_assert_int_eq(rmmc_resource_deallocate(r, p[i], cases[c].each, 256, a), RMMC_SUCCESS);
    void *q = NULL;
    rmmc_status_t st = rmmc_resource_allocate(r, cases[c].big, 256, b, &q);
    ck_assert_msg(st == RMMC_SUCCESS, "%s: %zu bytes with nothing live: %s", cases[c].spec,
                  cases[c].big, rmmc_last_error_message());
    *errors = 0;
    CUDA_OK(gpu_fill_pattern(q, cases[c].big, 1100u + (uint32_t)c, b));
    CUDA_OK(gpu_check_pattern(q, cases[c].big, 1100u + (uint32_t)c, errors, b));
    CUDA_OK(cudaStreamSynchronize(b));
    ck_assert_msg(*errors == 0, "%s: %llu bytes wrong", cases[c].spec, *errors);
    ck_assert_int_eq(rmmc_resource_deallocate(r, q, cases[c].big, 256, b), RMMC_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamDestroy(a));
    CUDA_OK(cudaStreamDestroy(b));
    rmmc_resource_release(r);
  }
  CUDA_OK(cudaFree(errors));
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_suballoc");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_gpu_suballoc_roundtrip_on_streams);
  tcase_add_test(tc, test_gpu_suballoc_reuse_waits_for_the_freeing_stream);
  tcase_add_test(tc, test_gpu_suballoc_freed_on_a_destroyed_stream);
  tcase_add_test(tc, test_gpu_suballoc_same_stream_reuse);
  tcase_add_test(tc, test_gpu_suballoc_out_of_memory_gives_back_cached_memory);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, true);
}
