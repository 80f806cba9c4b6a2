/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writing your own resource: a "bump" arena that hands out memory from one
 * block taken from an upstream and frees it all at once when destroyed,
 * the kind of resource a short-lived phase of a program wants. It shows the
 * ops table, the embedded base, upstream ownership, figures for reports and
 * error reporting. Runs on any machine (host upstream).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rmmc/rmmc.h"

typedef struct bump {
  rmmc_resource_t base; /* first member: what rmmc sees */
  rmmc_resource_t *upstream;
  char *block;
  size_t capacity, used, peak;
} bump_t;

static rmmc_status_t bump_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   cudaStream_t stream, void **out) {
  bump_t *b = (bump_t *)r;
  /* Not thread-safe by design: stack a thread_safe adaptor on it to share it. */
  uintptr_t base = (uintptr_t)b->block;
  size_t start = (size_t)(((base + b->used + alignment - 1) & ~(uintptr_t)(alignment - 1)) - base);
  if (start > b->capacity || bytes > b->capacity - start)
    return rmmc_set_oom_error(r, bytes, stream, "bump arena has %zu of %zu bytes left",
                              b->capacity - b->used, b->capacity);
  b->used = start + bytes;
  if (b->used > b->peak) b->peak = b->used;
  *out = b->block + start;
  return RMMC_SUCCESS;
}

static rmmc_status_t bump_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                     size_t alignment, cudaStream_t stream) {
  bump_t *b = (bump_t *)r;
  (void)bytes, (void)alignment, (void)stream;
  if ((char *)ptr < b->block || (char *)ptr >= b->block + b->capacity)
    return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "bump: %p is not from this arena", ptr);
  return RMMC_SUCCESS; /* memory comes back when the arena goes */
}

static void bump_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  bump_t *b = (bump_t *)r;
  rmmc_field_t f[] = {{"reserved", RMMC_FIELD_BYTES, b->capacity, NULL},
                      {"in_use", RMMC_FIELD_BYTES, b->used, NULL},
                      {"peak", RMMC_FIELD_BYTES, b->peak, NULL}};
  for (size_t i = 0; i < 3; i++) emit(ctx, &f[i]);
}

static rmmc_resource_t *bump_upstream(const rmmc_resource_t *r) {
  return ((const bump_t *)r)->upstream;
}

static void bump_destroy(rmmc_resource_t *r) {
  bump_t *b = (bump_t *)r;
  (void)rmmc_resource_deallocate(b->upstream, b->block, b->capacity, 256, NULL);
  rmmc_resource_release(b->upstream); /* we held a reference */
  free(b);
}

static const rmmc_resource_ops_t bump_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "bump",
    .allocate = bump_allocate,
    .deallocate = bump_deallocate,
    .describe = bump_describe,
    .destroy = bump_destroy,
    .upstream = bump_upstream,
};

static rmmc_status_t bump_create(rmmc_resource_t *upstream, size_t capacity, rmmc_resource_t **out) {
  bump_t *b = calloc(1, sizeof *b);
  if (b == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "bump: no host memory");
  rmmc_status_t st = rmmc_resource_allocate(upstream, capacity, 256, NULL, (void **)&b->block);
  if (st != RMMC_SUCCESS) {
    free(b); /* a failed create retains nothing */
    return st;
  }
  rmmc_resource_init(&b->base, &bump_ops, rmmc_resource_memory_kind(upstream),
                     rmmc_resource_device(upstream));
  b->upstream = rmmc_resource_retain(upstream);
  b->capacity = capacity;
  *out = &b->base;
  return RMMC_SUCCESS;
}

int main(void) {
  rmmc_resource_t *host = NULL, *bump = NULL;
  if (rmmc_host_resource_create(&host) != RMMC_SUCCESS ||
      bump_create(host, 1 << 20, &bump) != RMMC_SUCCESS) {
    fprintf(stderr, "setup failed: %s\n", rmmc_last_error_message());
    return 1;
  }
  rmmc_resource_release(host); /* the bump arena keeps it alive */

  void *a, *b, *c;
  rmmc_resource_allocate(bump, 1000, 256, NULL, &a);
  rmmc_resource_allocate(bump, 5000, 4096, NULL, &b);
  printf("a=%p b=%p (4096-aligned: %s)\n", a, b, ((size_t)b % 4096) == 0 ? "yes" : "no");
  rmmc_status_t st = rmmc_resource_allocate(bump, 2 << 20, 256, NULL, &c);
  printf("2 MiB more: %s\n  %s\n", rmmc_status_name(st), rmmc_last_error_message());
  uint64_t used = 0;
  rmmc_resource_get_field(bump, "in_use", &used);
  printf("in use: %llu bytes\n", (unsigned long long)used);
  rmmc_resource_deallocate(bump, a, 1000, 256, NULL);
  rmmc_resource_deallocate(bump, b, 5000, 4096, NULL);
  rmmc_resource_release(bump); /* frees the block and the host resource */
  return st == RMMC_ERROR_OUT_OF_MEMORY && used > 0 && (uintptr_t)b % 4096 == 0 ? 0 : 1;
}
