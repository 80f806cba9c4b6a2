/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The spy resource (see spy.h).
 */
#include "spy.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct spy_block {
  void *ptr;
  size_t bytes;
} spy_block_t;

struct spy {
  rmmc_resource_t base;
  pthread_mutex_t lock;
  spy_counts_t c;
  uint64_t fail_nth, fail_every, calls_since_arm;
  rmmc_status_t fail_peer;
  size_t capacity;
  spy_block_t *blocks;
  size_t nblocks, cap_blocks;
};

static uint64_t destroyed_total;

static rmmc_status_t spy_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                  cudaStream_t stream, void **out) {
  spy_t *s = (spy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->c.allocate_calls++;
  s->calls_since_arm++;
  s->c.last_bytes = bytes;
  s->c.last_alignment = alignment;
  s->c.last_stream = stream;
  bool fail = (s->fail_nth != 0 && s->calls_since_arm == s->fail_nth) ||
              (s->fail_every != 0 && s->c.allocate_calls % s->fail_every == 0) ||
              s->c.outstanding_bytes + bytes > s->capacity || bytes > s->capacity ||
              alignment > s->capacity; /* no room to place it (and posix_memalign with a
                                            terabyte alignment can take minutes) */
  if (s->fail_nth != 0 && s->calls_since_arm == s->fail_nth) s->fail_nth = 0;
  void *p = NULL;
  if (!fail && s->nblocks == s->cap_blocks) {
    size_t ncap = s->cap_blocks ? s->cap_blocks * 2 : 64;
    spy_block_t *nb = realloc(s->blocks, ncap * sizeof *nb);
    if (nb == NULL) fail = true;
    else {
      s->blocks = nb;
      s->cap_blocks = ncap;
    }
  }
  /* Above PTRDIFF_MAX no allocator can serve it; refusing here also keeps
   * valgrind from reporting a "fishy" (negative) size to posix_memalign. */
  if (!fail && (bytes > PTRDIFF_MAX || posix_memalign(&p, alignment, bytes) != 0)) fail = true;
  if (fail) {
    s->c.allocate_failures++;
    pthread_mutex_unlock(&s->lock);
    return rmmc_set_oom_error(r, bytes, stream, "spy failure injected");
  }
  s->blocks[s->nblocks++] = (spy_block_t){p, bytes};
  s->c.outstanding++;
  s->c.outstanding_bytes += bytes;
  if (s->c.outstanding_bytes > s->c.peak_bytes) s->c.peak_bytes = s->c.outstanding_bytes;
  s->c.last_ptr = p;
  pthread_mutex_unlock(&s->lock);
  *out = p;
  return RMMC_SUCCESS;
}

static rmmc_status_t spy_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                    size_t alignment, cudaStream_t stream) {
  spy_t *s = (spy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->c.deallocate_calls++;
  s->c.last_ptr = ptr;
  s->c.last_bytes = bytes;
  s->c.last_alignment = alignment;
  s->c.last_stream = stream;
  for (size_t i = s->nblocks; i-- > 0;) {
    if (s->blocks[i].ptr != ptr) continue;
    if (s->blocks[i].bytes != bytes) {
      s->c.deallocate_errors++;
      size_t real = s->blocks[i].bytes;
      pthread_mutex_unlock(&s->lock);
      return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "spy: %p has %zu bytes, not %zu", ptr,
                            real, bytes);
    }
    s->blocks[i] = s->blocks[--s->nblocks];
    s->c.outstanding--;
    s->c.outstanding_bytes -= bytes;
    pthread_mutex_unlock(&s->lock);
    free(ptr);
    return RMMC_SUCCESS;
  }
  s->c.deallocate_errors++;
  pthread_mutex_unlock(&s->lock);
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER, "spy: %p was not allocated here", ptr);
}

static rmmc_status_t spy_release_cached(rmmc_resource_t *r) {
  spy_t *s = (spy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->c.release_calls++;
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

static rmmc_status_t spy_enable_peer_access(rmmc_resource_t *r, int peer_device) {
  spy_t *s = (spy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->c.peer_calls++;
  s->c.last_peer = peer_device;
  rmmc_status_t st = s->fail_peer;
  s->fail_peer = RMMC_SUCCESS;
  if (st == RMMC_SUCCESS) s->c.peers |= (uint64_t)1 << peer_device;
  pthread_mutex_unlock(&s->lock);
  return st == RMMC_SUCCESS ? st : rmmc_set_error(st, "spy: injected %s", rmmc_status_name(st));
}

static void spy_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  spy_counts_t c = spy_counts((spy_t *)r);
  rmmc_field_t f = {"in_use", RMMC_FIELD_BYTES, c.outstanding_bytes, NULL};
  emit(ctx, &f);
  f = (rmmc_field_t){"outstanding", RMMC_FIELD_COUNT, c.outstanding, NULL};
  emit(ctx, &f);
}

static void spy_destroy(rmmc_resource_t *r) {
  spy_t *s = (spy_t *)r;
  for (size_t i = 0; i < s->nblocks; i++) free(s->blocks[i].ptr);
  free(s->blocks);
  pthread_mutex_destroy(&s->lock);
  free(s);
  __atomic_add_fetch(&destroyed_total, 1, __ATOMIC_RELAXED);
}

static const rmmc_resource_ops_t spy_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "spy",
    .allocate = spy_allocate,
    .deallocate = spy_deallocate,
    .release_cached = spy_release_cached,
    .describe = spy_describe,
    .destroy = spy_destroy,
    .enable_peer_access = spy_enable_peer_access,
};

rmmc_status_t spy_create(rmmc_memory_kind_t kind, rmmc_resource_t **out) {
  spy_t *s = calloc(1, sizeof *s);
  if (s == NULL) return RMMC_ERROR_OUT_OF_MEMORY;
  rmmc_resource_init(&s->base, &spy_ops, kind, kind == RMMC_MEMORY_HOST ? -1 : 0);
  pthread_mutex_init(&s->lock, NULL);
  s->capacity = SIZE_MAX;
  *out = &s->base;
  return RMMC_SUCCESS;
}

spy_t *spy_of(rmmc_resource_t *r) { return r != NULL && r->ops == &spy_ops ? (spy_t *)r : NULL; }

void spy_fail_nth(spy_t *s, uint64_t n) {
  pthread_mutex_lock(&s->lock);
  s->fail_nth = n;
  s->calls_since_arm = 0;
  pthread_mutex_unlock(&s->lock);
}

void spy_fail_every(spy_t *s, uint64_t n) {
  pthread_mutex_lock(&s->lock);
  s->fail_every = n;
  pthread_mutex_unlock(&s->lock);
}

void spy_set_capacity(spy_t *s, size_t bytes) {
  pthread_mutex_lock(&s->lock);
  s->capacity = bytes;
  pthread_mutex_unlock(&s->lock);
}

void spy_fail_peer_access(spy_t *s, rmmc_status_t status) {
  pthread_mutex_lock(&s->lock);
  s->fail_peer = status;
  pthread_mutex_unlock(&s->lock);
}

spy_counts_t spy_counts(spy_t *s) {
  pthread_mutex_lock(&s->lock);
  spy_counts_t c = s->c;
  pthread_mutex_unlock(&s->lock);
  return c;
}

uint64_t spy_destroyed_total(void) { return __atomic_load_n(&destroyed_total, __ATOMIC_RELAXED); }
