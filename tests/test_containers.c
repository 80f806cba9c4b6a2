/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Containers on the CPU: buffer, vector and scalar over a host spy (no CUDA
 * call is made for host memory), and the stream helpers' argument checks.
 * Contents are written and read back after every operation that may
 * reallocate; the spy counts allocations, streams and outstanding blocks.
 * Host suite.
 */
#include <stdint.h>
#include <string.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

#define STREAM_A ((cudaStream_t)0x10)
#define STREAM_B ((cudaStream_t)0x20)

static rmmc_resource_t *new_spy(void) {
  rmmc_resource_t *r;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &r), RMMC_SUCCESS);
  return r;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 131);
}

/* Reads the buffer back and checks bytes [0, n) follow fill(seed). */
static void expect_pattern(const rmmc_buffer_t *b, size_t n, unsigned seed) {
  unsigned char *h = malloc(n ? n : 1);
  ck_assert_int_eq(rmmc_buffer_copy_to_host(b, 0, h, n), RMMC_SUCCESS);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(h[i] == (unsigned char)(seed + i * 131), "byte %zu: %u", i, h[i]);
  free(h);
}

static void expect_null(const rmmc_buffer_t *b) {
  ck_assert(rmmc_buffer_is_null(b));
  ck_assert_ptr_null(b->data);
  ck_assert_uint_eq(b->size, 0);
  ck_assert_uint_eq(b->capacity, 0);
}

START_TEST(test_buffer_create_copy_in_and_out) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_buffer_t b = RMMC_BUFFER_INIT;
  ck_assert_int_eq(rmmc_buffer_create(&b, 1000, STREAM_A, r), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(b.data);
  ck_assert_uint_eq(b.size, 1000);
  ck_assert_uint_eq(b.capacity, 1000);
  ck_assert_ptr_eq(b.stream, STREAM_A);
  ck_assert_int_eq(b.device, -1);
  ck_assert_int_eq(rmmc_resource_refcount(r), 2); /* the buffer holds one */
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_uint_eq(c.last_bytes, 1000);
  ck_assert_ptr_eq(c.last_stream, STREAM_A);
  unsigned char in[1000], out[1000];
  fill(in, sizeof in, 7);
  ck_assert_int_eq(rmmc_buffer_copy_from_host(&b, 0, in, sizeof in), RMMC_SUCCESS);
  expect_pattern(&b, 1000, 7);
  /* Partial copies at an offset, both ways and async. */
  ck_assert_int_eq(rmmc_buffer_copy_from_host_async(&b, 500, in, 100), RMMC_SUCCESS);
  memset(out, 0, sizeof out);
  ck_assert_int_eq(rmmc_buffer_copy_to_host_async(&b, 500, out, 100), RMMC_SUCCESS);
  ck_assert_int_eq(memcmp(out, in, 100), 0);
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&b, 999, out, 1), RMMC_SUCCESS);
  ck_assert_uint_eq(out[0], in[999]);
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&b, 1000, out, 0), RMMC_SUCCESS); /* empty range */
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  expect_null(&b);
  c = spy_counts(s);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  ck_assert_ptr_eq(c.last_stream, STREAM_A);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS); /* null: no-op */
  ck_assert_int_eq(rmmc_buffer_destroy(NULL), RMMC_SUCCESS);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_create_from_and_size_zero) {
  rmmc_resource_t *r = new_spy();
  unsigned char in[300];
  fill(in, sizeof in, 3);
  rmmc_buffer_t b;
  ck_assert_int_eq(rmmc_buffer_create_from(&b, in, sizeof in, STREAM_B, r), RMMC_SUCCESS);
  expect_pattern(&b, sizeof in, 3);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  /* Size 0: no memory, but a live buffer that can grow later. */
  ck_assert_int_eq(rmmc_buffer_create(&b, 0, STREAM_B, r), RMMC_SUCCESS);
  ck_assert(!rmmc_buffer_is_null(&b));
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(spy_counts(spy_of(r)).allocate_calls, 1);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 64), RMMC_SUCCESS);
  ck_assert_ptr_nonnull(b.data);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_create_from(&b, NULL, 0, STREAM_B, r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  /* A NULL source with bytes: refused before anything is allocated. */
  uint64_t calls = spy_counts(spy_of(r)).allocate_calls;
  ck_assert_int_eq(rmmc_buffer_create_from(&b, NULL, 10, STREAM_B, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "source is NULL with 10 bytes"));
  expect_null(&b);
  ck_assert_uint_eq(spy_counts(spy_of(r)).allocate_calls, calls);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_resize_keeps_contents) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_buffer_t b;
  unsigned char in[100];
  fill(in, sizeof in, 11);
  ck_assert_int_eq(rmmc_buffer_create_from(&b, in, 100, STREAM_A, r), RMMC_SUCCESS);
  void *first = b.data;
  /* Within the capacity only the size changes. */
  ck_assert_int_eq(rmmc_buffer_resize(&b, 50), RMMC_SUCCESS);
  ck_assert_uint_eq(b.size, 50);
  ck_assert_uint_eq(b.capacity, 100);
  ck_assert_ptr_eq(b.data, first);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 100), RMMC_SUCCESS);
  ck_assert_ptr_eq(b.data, first);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  expect_pattern(&b, 100, 11);
  /* Above it: a new block of exactly the new size, contents copied, the old
   * block returned on the buffer's stream. */
  ck_assert_int_eq(rmmc_buffer_resize(&b, 4000), RMMC_SUCCESS);
  ck_assert_uint_eq(b.size, 4000);
  ck_assert_uint_eq(b.capacity, 4000);
  spy_counts_t c = spy_counts(s);
  ck_assert_uint_eq(c.allocate_calls, 2);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_uint_eq(c.outstanding_bytes, 4000);
  ck_assert_ptr_eq(c.last_ptr, first); /* the old block was the last freed */
  ck_assert_uint_eq(c.last_bytes, 100);
  ck_assert_ptr_eq(c.last_stream, STREAM_A);
  expect_pattern(&b, 100, 11);
  /* Shrinking the size and growing it again keeps the first bytes. */
  ck_assert_int_eq(rmmc_buffer_resize(&b, 30), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 5000), RMMC_SUCCESS);
  expect_pattern(&b, 30, 11);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_uint_eq(spy_counts(s).deallocate_errors, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_reserve_and_shrink_to_fit) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_buffer_t b;
  unsigned char in[256];
  fill(in, sizeof in, 5);
  ck_assert_int_eq(rmmc_buffer_create_from(&b, in, 256, STREAM_A, r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_reserve(&b, 10000), RMMC_SUCCESS);
  ck_assert_uint_eq(b.size, 256);
  ck_assert_uint_eq(b.capacity, 10000);
  expect_pattern(&b, 256, 5);
  uint64_t calls = spy_counts(s).allocate_calls;
  ck_assert_int_eq(rmmc_buffer_reserve(&b, 500), RMMC_SUCCESS); /* below: nothing */
  ck_assert_uint_eq(b.capacity, 10000);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, calls);
  ck_assert_int_eq(rmmc_buffer_shrink_to_fit(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(b.capacity, 256);
  ck_assert_uint_eq(spy_counts(s).outstanding_bytes, 256);
  expect_pattern(&b, 256, 5);
  calls = spy_counts(s).allocate_calls;
  ck_assert_int_eq(rmmc_buffer_shrink_to_fit(&b), RMMC_SUCCESS); /* already fits */
  ck_assert_uint_eq(spy_counts(s).allocate_calls, calls);
  /* Size 0 then shrink: the memory goes, the buffer stays usable. */
  ck_assert_int_eq(rmmc_buffer_resize(&b, 0), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_shrink_to_fit(&b), RMMC_SUCCESS);
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.capacity, 0);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert(!rmmc_buffer_is_null(&b));
  ck_assert_int_eq(rmmc_buffer_resize(&b, 10), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 1);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

/* Every field of a equals b's (memcmp would read the struct's padding,
 * which is uninitialized: valgrind reports it). */
static void expect_same_buffer(const rmmc_buffer_t *a, const rmmc_buffer_t *b) {
  ck_assert_ptr_eq(a->data, b->data);
  ck_assert_uint_eq(a->size, b->size);
  ck_assert_uint_eq(a->capacity, b->capacity);
  ck_assert_ptr_eq(a->stream, b->stream);
  ck_assert_ptr_eq(a->resource, b->resource);
  ck_assert_int_eq(a->device, b->device);
}

START_TEST(test_buffer_failures_change_nothing) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_buffer_t b;
  unsigned char in[128];
  fill(in, sizeof in, 9);
  ck_assert_int_eq(rmmc_buffer_create_from(&b, in, 128, STREAM_A, r), RMMC_SUCCESS);
  rmmc_buffer_t before = b;
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 1 << 20), RMMC_ERROR_OUT_OF_MEMORY);
  expect_same_buffer(&b, &before);
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_reserve(&b, 1 << 20), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 100), RMMC_SUCCESS);
  before = b;
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_shrink_to_fit(&b), RMMC_ERROR_OUT_OF_MEMORY);
  expect_same_buffer(&b, &before);
  expect_pattern(&b, 100, 9);
  ck_assert_uint_eq(spy_counts(s).outstanding, 1);
  /* A create that fails keeps nothing: no reference, no memory. */
  rmmc_buffer_t c;
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_create(&c, 64, STREAM_A, r), RMMC_ERROR_OUT_OF_MEMORY);
  expect_null(&c);
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_create_from(&c, in, 64, STREAM_A, r), RMMC_ERROR_OUT_OF_MEMORY);
  expect_null(&c);
  spy_fail_nth(s, 1);
  ck_assert_int_eq(rmmc_buffer_create_copy(&c, &b, STREAM_A, r), RMMC_ERROR_OUT_OF_MEMORY);
  expect_null(&c);
  ck_assert_int_eq(rmmc_resource_refcount(r), 2); /* only b's */
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_bad_input) {
  rmmc_resource_t *r = new_spy();
  unsigned char h[64];
  rmmc_buffer_t b, nb = RMMC_BUFFER_INIT;
  ck_assert_int_eq(rmmc_buffer_create(NULL, 10, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_create(&b, 32, NULL, r), RMMC_SUCCESS);
  /* Out-of-range transfers, including offsets that would overflow. */
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&b, 0, h, 33), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "out of range"));
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&b, 33, h, 0), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_copy_from_host(&b, 16, h, SIZE_MAX), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_copy_from_host(&b, SIZE_MAX, h, 2), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&b, 0, NULL, 4), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "NULL with 4 bytes"));
  ck_assert_int_eq(rmmc_buffer_copy_from_host_async(&b, 0, NULL, 4), RMMC_ERROR_INVALID_ARGUMENT);
  /* A null buffer is refused by every operation but destroy. */
  ck_assert_int_eq(rmmc_buffer_resize(&nb, 8), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "null"));
  ck_assert_int_eq(rmmc_buffer_reserve(&nb, 8), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_shrink_to_fit(&nb), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_set_stream(&nb, STREAM_A), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_copy_to_host(&nb, 0, h, 0), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_resize(NULL, 8), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_create_copy(&nb, NULL, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_create_copy(&b, &b, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_create_copy(NULL, &b, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_buffer_move(NULL, &b), RMMC_ERROR_INVALID_ARGUMENT);
  /* A size that overflows when rounded is the resource wrapper's refusal. */
  ck_assert_int_eq(rmmc_buffer_resize(&b, SIZE_MAX - 10), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(b.size, 32);
  /* None of it lost anything. */
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 1);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_refuses_unknown_memory_kind) {
  rmmc_resource_t *odd;
  ck_assert_int_eq(spy_create((rmmc_memory_kind_t)99, &odd), RMMC_SUCCESS);
  rmmc_buffer_t b;
  ck_assert_int_eq(rmmc_buffer_create(&b, 10, NULL, odd), RMMC_ERROR_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "memory kind 99"));
  expect_null(&b);
  ck_assert_uint_eq(spy_counts(spy_of(odd)).allocate_calls, 0);
  ck_assert_int_eq(rmmc_resource_refcount(odd), 1);
  rmmc_resource_release(odd);
}
END_TEST

START_TEST(test_buffer_move_and_set_stream) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_buffer_t a, b;
  unsigned char in[200];
  fill(in, sizeof in, 21);
  ck_assert_int_eq(rmmc_buffer_create_from(&a, in, 200, STREAM_A, r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_create(&b, 50, STREAM_B, r), RMMC_SUCCESS);
  void *a_data = a.data, *b_data = b.data;
  /* Moving into a live buffer frees its old memory on its own stream. */
  ck_assert_int_eq(rmmc_buffer_move(&b, &a), RMMC_SUCCESS);
  spy_counts_t c = spy_counts(s);
  ck_assert_ptr_eq(c.last_ptr, b_data);
  ck_assert_ptr_eq(c.last_stream, STREAM_B);
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_ptr_eq(b.data, a_data);
  ck_assert_uint_eq(b.size, 200);
  ck_assert_ptr_eq(b.stream, STREAM_A);
  expect_null(&a);
  expect_pattern(&b, 200, 21);
  ck_assert_int_eq(rmmc_buffer_move(&b, &b), RMMC_SUCCESS); /* self: nothing */
  ck_assert_ptr_eq(b.data, a_data);
  /* The stream given last is the one destroy uses. */
  ck_assert_int_eq(rmmc_buffer_set_stream(&b, STREAM_B), RMMC_SUCCESS);
  ck_assert_ptr_eq(b.stream, STREAM_B);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 1000), RMMC_SUCCESS);
  c = spy_counts(s);
  ck_assert_ptr_eq(c.last_ptr, a_data); /* the old block, freed on the new stream */
  ck_assert_ptr_eq(c.last_stream, STREAM_B);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  c = spy_counts(s);
  ck_assert_ptr_eq(c.last_stream, STREAM_B);
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_buffer_create_copy_is_deep) {
  rmmc_resource_t *r1 = new_spy(), *r2 = new_spy();
  rmmc_buffer_t a, b;
  unsigned char in[500], out[500];
  fill(in, sizeof in, 33);
  ck_assert_int_eq(rmmc_buffer_create_from(&a, in, 500, STREAM_A, r1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_reserve(&a, 2000), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_create_copy(&b, &a, STREAM_B, r2), RMMC_SUCCESS);
  ck_assert_ptr_ne(b.data, a.data);
  ck_assert_uint_eq(b.size, 500);
  ck_assert_uint_eq(b.capacity, 500); /* the copy fits its size */
  ck_assert_ptr_eq(b.resource, r2);
  ck_assert_ptr_eq(b.stream, STREAM_B);
  ck_assert_uint_eq(spy_counts(spy_of(r2)).outstanding_bytes, 500);
  expect_pattern(&b, 500, 33);
  /* Writing the copy leaves the original alone. */
  memset(out, 0, sizeof out);
  ck_assert_int_eq(rmmc_buffer_copy_from_host(&b, 0, out, 500), RMMC_SUCCESS);
  expect_pattern(&a, 500, 33);
  ck_assert_int_eq(rmmc_buffer_destroy(&a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(r1)).outstanding, 0);
  ck_assert_uint_eq(spy_counts(spy_of(r2)).outstanding, 0);
  rmmc_resource_release(r1);
  rmmc_resource_release(r2);
}
END_TEST

START_TEST(test_buffer_defaults_to_the_registry) {
  rmmc_resource_t *r = new_spy();
  ck_assert_int_eq(rmmc_set_current_device_resource(r, NULL), RMMC_SUCCESS);
  rmmc_buffer_t b;
  ck_assert_int_eq(rmmc_buffer_create(&b, 300, STREAM_A, NULL), RMMC_SUCCESS);
  ck_assert_ptr_eq(b.resource, r);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 1);
  /* The buffer keeps its resource after the registry lets it go. */
  rmmc_registry_clear();
  ck_assert_int_eq(rmmc_resource_refcount(r), 2);
  ck_assert_int_eq(rmmc_buffer_resize(&b, 600), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_buffer_destroy(&b), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
  /* Without a GPU and with nothing set, the registry says so. */
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(rmmc_buffer_create(&b, 10, NULL, NULL), RMMC_ERROR_NO_DEVICE);
    expect_null(&b);
  }
}
END_TEST

/* ---- vector ---- */

START_TEST(test_vector_elements_get_and_set) {
  rmmc_resource_t *r = new_spy();
  rmmc_vector_t v = RMMC_VECTOR_INIT;
  ck_assert_uint_eq(rmmc_vector_size(&v), 0);
  ck_assert_int_eq(rmmc_vector_create(&v, 100, sizeof(int64_t), STREAM_A, r), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_size(&v), 100);
  ck_assert_uint_eq(rmmc_vector_capacity(&v), 100);
  ck_assert_uint_eq(v.buffer.size, 800);
  ck_assert_ptr_eq(rmmc_vector_stream(&v), STREAM_A);
  for (int64_t i = 0; i < 100; i++)
    ck_assert_int_eq(rmmc_vector_set(&v, (size_t)i, &(int64_t){i * i - 7}, sizeof(int64_t)),
                     RMMC_SUCCESS);
  int64_t x = 0;
  ck_assert_int_eq(rmmc_vector_set_async(&v, 3, &(int64_t){-42}, sizeof x), RMMC_SUCCESS);
  for (size_t i = 0; i < 100; i++) {
    ck_assert_int_eq(rmmc_vector_get(&v, i, &x, sizeof x), RMMC_SUCCESS);
    ck_assert_int_eq(x, i == 3 ? -42 : (int64_t)(i * i) - 7);
  }
  /* Host memory: the typed data pointer is readable here. */
  ck_assert_int_eq(RMMC_VECTOR_DATA(&v, int64_t)[10], 93);
  /* Bulk copies by element. */
  int64_t block[10];
  ck_assert_int_eq(rmmc_vector_copy_to_host(&v, 90, block, 10), RMMC_SUCCESS);
  ck_assert_int_eq(block[9], 99 * 99 - 7);
  for (int i = 0; i < 10; i++) block[i] = 1000 + i;
  ck_assert_int_eq(rmmc_vector_copy_from_host(&v, 0, block, 10), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_get(&v, 9, &x, sizeof x), RMMC_SUCCESS);
  ck_assert_int_eq(x, 1009);
  ck_assert_int_eq(rmmc_vector_destroy(&v), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_size(&v), 0);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_vector_bad_input) {
  rmmc_resource_t *r = new_spy();
  spy_t *s = spy_of(r);
  rmmc_vector_t v;
  int32_t x = 5;
  int64_t wide = 5;
  /* Size overflow and zero element size never reach the resource. */
  ck_assert_int_eq(rmmc_vector_create(&v, SIZE_MAX / 2, 4, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "overflow"));
  ck_assert(rmmc_buffer_is_null(&v.buffer));
  ck_assert_int_eq(rmmc_vector_create(&v, 10, 0, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_create_from(&v, NULL, 10, 4, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_create(NULL, 10, 4, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 0);
  ck_assert_int_eq(rmmc_vector_create(&v, 10, sizeof x, NULL, r), RMMC_SUCCESS);
  /* Out-of-range index, wrong value size, NULL value. */
  ck_assert_int_eq(rmmc_vector_set(&v, 10, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "index 10 is out of range"));
  ck_assert_int_eq(rmmc_vector_get(&v, SIZE_MAX, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_set_async(&v, 10, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_set(&v, 0, &wide, sizeof wide), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "8 bytes for elements of 4 bytes"));
  ck_assert_int_eq(rmmc_vector_get(&v, 0, NULL, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_copy_to_host(&v, 5, &x, 6), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_copy_from_host(&v, 11, &x, 0), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_copy_from_host(&v, 0, NULL, 1), RMMC_ERROR_INVALID_ARGUMENT);
  /* Overflowing resize and reserve leave the vector as it was. */
  ck_assert_int_eq(rmmc_vector_resize(&v, SIZE_MAX / 2), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_reserve(&v, SIZE_MAX / 3), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_uint_eq(rmmc_vector_size(&v), 10);
  ck_assert_uint_eq(spy_counts(s).allocate_calls, 1);
  ck_assert_int_eq(rmmc_vector_destroy(&v), RMMC_SUCCESS);
  /* Null vectors. */
  ck_assert_int_eq(rmmc_vector_resize(&v, 1), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_get(&v, 0, &x, sizeof x), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_shrink_to_fit(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_set_stream(&v, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_destroy(NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(s).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

START_TEST(test_vector_resize_reserve_shrink_move_copy) {
  rmmc_resource_t *r = new_spy();
  float in[64];
  for (int i = 0; i < 64; i++) in[i] = (float)i * 0.5f;
  rmmc_vector_t v, w = RMMC_VECTOR_INIT, c;
  ck_assert_int_eq(rmmc_vector_create_from(&v, in, 64, sizeof(float), STREAM_A, r), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_reserve(&v, 1000), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_capacity(&v), 1000);
  ck_assert_uint_eq(rmmc_vector_size(&v), 64);
  ck_assert_int_eq(rmmc_vector_resize(&v, 2000), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_size(&v), 2000);
  ck_assert_int_eq(rmmc_vector_set(&v, 1999, &(float){7.0f}, sizeof(float)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_resize(&v, 64), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_shrink_to_fit(&v), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_capacity(&v), 64);
  float out[64];
  ck_assert_int_eq(rmmc_vector_copy_to_host(&v, 0, out, 64), RMMC_SUCCESS);
  ck_assert_int_eq(memcmp(in, out, sizeof in), 0);
  /* Copy, then move the original away. */
  ck_assert_int_eq(rmmc_vector_create_copy(&c, &v, STREAM_B, r), RMMC_SUCCESS);
  ck_assert_uint_eq(c.element_size, sizeof(float));
  ck_assert_uint_eq(rmmc_vector_size(&c), 64);
  ck_assert_int_eq(rmmc_vector_create_copy(&c, &c, STREAM_B, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_move(&w, &v), RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_vector_size(&v), 0);
  ck_assert(rmmc_buffer_is_null(&v.buffer));
  ck_assert_uint_eq(rmmc_vector_size(&w), 64);
  ck_assert_int_eq(rmmc_vector_set_stream(&w, STREAM_B), RMMC_SUCCESS);
  float x;
  ck_assert_int_eq(rmmc_vector_get(&w, 63, &x, sizeof x), RMMC_SUCCESS);
  ck_assert(x == 31.5f);
  ck_assert_int_eq(rmmc_vector_get(&c, 63, &x, sizeof x), RMMC_SUCCESS);
  ck_assert(x == 31.5f);
  ck_assert_int_eq(rmmc_vector_move(&w, &w), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_move(NULL, &w), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_vector_destroy(&w), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_vector_destroy(&c), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

/* ---- scalar ---- */

START_TEST(test_scalar_get_set_and_bad_input) {
  rmmc_resource_t *r = new_spy();
  rmmc_scalar_t s = RMMC_SCALAR_INIT, t = RMMC_SCALAR_INIT;
  ck_assert_int_eq(rmmc_scalar_create_from(&s, &(double){3.25}, sizeof(double), STREAM_A, r),
                   RMMC_SUCCESS);
  ck_assert_uint_eq(rmmc_scalar_size(&s), sizeof(double));
  double d = 0;
  ck_assert_int_eq(rmmc_scalar_get(&s, &d, sizeof d), RMMC_SUCCESS);
  ck_assert(d == 3.25);
  ck_assert_int_eq(rmmc_scalar_set(&s, &(double){-1.5}, sizeof(double)), RMMC_SUCCESS);
  ck_assert(*RMMC_SCALAR_DATA(&s, double) == -1.5);
  ck_assert_int_eq(rmmc_scalar_set_async(&s, &(double){8.0}, sizeof(double)), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_scalar_get(&s, &d, sizeof d), RMMC_SUCCESS);
  ck_assert(d == 8.0);
  ck_assert_ptr_eq(rmmc_scalar_data(&s), s.buffer.data);
  /* Wrong sizes and NULLs. */
  float f;
  ck_assert_int_eq(rmmc_scalar_get(&s, &f, sizeof f), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "4 bytes for a scalar of 8 bytes"));
  ck_assert_int_eq(rmmc_scalar_set(&s, NULL, sizeof d), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_get(NULL, &d, sizeof d), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_create(&t, 0, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert(rmmc_buffer_is_null(&t.buffer));
  ck_assert_int_eq(rmmc_scalar_create_from(&t, NULL, 8, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_create(NULL, 8, NULL, r), RMMC_ERROR_INVALID_ARGUMENT);
  /* A failed allocation keeps nothing. */
  spy_fail_nth(spy_of(r), 1);
  ck_assert_int_eq(rmmc_scalar_create_from(&t, &d, sizeof d, NULL, r), RMMC_ERROR_OUT_OF_MEMORY);
  ck_assert(rmmc_buffer_is_null(&t.buffer));
  /* Move and stream change. */
  ck_assert_int_eq(rmmc_scalar_move(&t, &s), RMMC_SUCCESS);
  ck_assert(rmmc_buffer_is_null(&s.buffer));
  ck_assert_int_eq(rmmc_scalar_get(&s, &d, sizeof d), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_set_stream(&t, STREAM_B), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_scalar_get(&t, &d, sizeof d), RMMC_SUCCESS);
  ck_assert(d == 8.0);
  ck_assert_int_eq(rmmc_scalar_move(NULL, &t), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_set_stream(NULL, STREAM_B), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_scalar_destroy(&t), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_scalar_destroy(&s), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_scalar_destroy(NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(r)).outstanding, 0);
  ck_assert_int_eq(rmmc_resource_refcount(r), 1);
  rmmc_resource_release(r);
}
END_TEST

/* ---- streams: argument checks (the GPU program runs the rest) ---- */

START_TEST(test_streams_check_arguments) {
  cudaStream_t s = (cudaStream_t)1;
  ck_assert_int_eq(rmmc_stream_create(0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stream_create(0x8, &s), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(rmmc_stream_destroy(NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stream_destroy(cudaStreamPerThread), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stream_wait(STREAM_A, STREAM_A), RMMC_SUCCESS); /* same: nothing */
  rmmc_stream_pool_t *p = (rmmc_stream_pool_t *)1;
  ck_assert_int_eq(rmmc_stream_pool_create(4, 0, -1, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_stream_pool_create(5000, 0, -1, &p), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(rmmc_stream_pool_create(4, 0x4, -1, &p), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_stream_pool_destroy(NULL);
  if (rmmc_device_count() == 0) {
    ck_assert_int_eq(rmmc_stream_create(cudaStreamNonBlocking, &s), RMMC_ERROR_NO_DEVICE);
    ck_assert_int_eq(rmmc_stream_synchronize(NULL), RMMC_ERROR_NO_DEVICE);
    ck_assert_int_eq(rmmc_stream_wait(STREAM_A, STREAM_B), RMMC_ERROR_NO_DEVICE);
    ck_assert_int_eq(rmmc_stream_pool_create(4, 0, -1, &p), RMMC_ERROR_NO_DEVICE);
    ck_assert_ptr_null(p);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("containers");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_buffer_create_copy_in_and_out);
  tcase_add_test(tc, test_buffer_create_from_and_size_zero);
  tcase_add_test(tc, test_buffer_resize_keeps_contents);
  tcase_add_test(tc, test_buffer_reserve_and_shrink_to_fit);
  tcase_add_test(tc, test_buffer_failures_change_nothing);
  tcase_add_test(tc, test_buffer_bad_input);
  tcase_add_test(tc, test_buffer_refuses_unknown_memory_kind);
  tcase_add_test(tc, test_buffer_move_and_set_stream);
  tcase_add_test(tc, test_buffer_create_copy_is_deep);
  tcase_add_test(tc, test_buffer_defaults_to_the_registry);
  tcase_add_test(tc, test_vector_elements_get_and_set);
  tcase_add_test(tc, test_vector_bad_input);
  tcase_add_test(tc, test_vector_resize_reserve_shrink_move_copy);
  tcase_add_test(tc, test_scalar_get_set_and_bad_input);
  tcase_add_test(tc, test_streams_check_arguments);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
