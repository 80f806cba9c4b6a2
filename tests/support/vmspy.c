/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The vmspy resource (see vmspy.h).
 */
#include "vmspy.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct range {
  uintptr_t addr;
  size_t bytes;
  void *token;    /* maps: the upstream allocation paired with it */
  uint64_t peers; /* maps: the devices granted access (bit d) */
} range_t;

typedef struct vmspy {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
  size_t page;
  pthread_mutex_t lock;
  vmspy_counts_t c;
  range_t *res, *maps; /* reservations, mapped ranges */
  size_t nres, nmaps, capres, capmaps;
  uint64_t fail_access;  /* the vm_set_access call (counted down) that fails first; 0: none */
  uint64_t fail_count;   /* how many fail from there */
} vmspy_t;

static const rmmc_resource_ops_t vmspy_ops;

static bool push(range_t **v, size_t *n, size_t *cap, range_t r) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    range_t *nv = realloc(*v, ncap * sizeof *nv);
    if (nv == NULL) return false;
    *v = nv;
    *cap = ncap;
  }
  (*v)[(*n)++] = r;
  return true;
}

static rmmc_status_t refuse(vmspy_t *s, const char *what, const void *p, size_t bytes) {
  s->c.errors++;
  pthread_mutex_unlock(&s->lock);
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "vmspy: %s: %p + %zu", what, p, bytes);
}

static bool overlaps(const range_t *r, uintptr_t a, size_t n) {
  return a < r->addr + r->bytes && r->addr < a + n;
}

static rmmc_status_t vmspy_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    cudaStream_t stream, void **out) {
  return rmmc_resource_allocate(((vmspy_t *)r)->upstream, bytes, alignment, stream, out);
}

static rmmc_status_t vmspy_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                      size_t alignment, cudaStream_t stream) {
  return rmmc_resource_deallocate(((vmspy_t *)r)->upstream, ptr, bytes, alignment, stream);
}

static size_t vmspy_page_size(const rmmc_resource_t *r) { return ((const vmspy_t *)r)->page; }

static rmmc_status_t vmspy_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                   void **out) {
  vmspy_t *s = (vmspy_t *)r;
  if (alignment < s->page || alignment % s->page != 0) {
    pthread_mutex_lock(&s->lock);
    return refuse(s, "reserve with a bad alignment", NULL, alignment);
  }
  /* Over-reserve to align. */
  void *p = mmap(NULL, bytes + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "vmspy: mmap failed");
  uintptr_t a = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
  if (a > (uintptr_t)p) munmap(p, a - (uintptr_t)p);
  munmap((void *)(a + bytes), (uintptr_t)p + bytes + alignment - (a + bytes));
  pthread_mutex_lock(&s->lock);
  if (!push(&s->res, &s->nres, &s->capres, (range_t){a, bytes, NULL, 0})) {
    pthread_mutex_unlock(&s->lock);
    munmap((void *)a, bytes);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "vmspy: no host memory");
  }
  s->c.reserves++;
  s->c.reserved_bytes += bytes;
  pthread_mutex_unlock(&s->lock);
  *out = (void *)a;
  return RMMC_SUCCESS;
}

static rmmc_status_t vmspy_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  vmspy_t *s = (vmspy_t *)r;
  uintptr_t a = (uintptr_t)ptr;
  pthread_mutex_lock(&s->lock);
  size_t i = 0;
  while (i < s->nres && !(s->res[i].addr == a && s->res[i].bytes == bytes)) i++;
  if (i == s->nres) return refuse(s, "unreserve of no reservation", ptr, bytes);
  for (size_t k = 0; k < s->nmaps; k++)
    if (overlaps(&s->maps[k], a, bytes)) return refuse(s, "unreserve with pages mapped", ptr, bytes);
  s->res[i] = s->res[--s->nres];
  s->c.unreserves++;
  s->c.reserved_bytes -= bytes;
  pthread_mutex_unlock(&s->lock);
  munmap(ptr, bytes);
  return RMMC_SUCCESS;
}

static rmmc_status_t vmspy_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  vmspy_t *s = (vmspy_t *)r;
  uintptr_t a = (uintptr_t)ptr;
  pthread_mutex_lock(&s->lock);
  size_t i = 0;
  while (i < s->nres && !(a >= s->res[i].addr && a + bytes <= s->res[i].addr + s->res[i].bytes)) i++;
  if (i == s->nres) return refuse(s, "map outside every reservation", ptr, bytes);
  for (size_t k = 0; k < s->nmaps; k++)
    if (overlaps(&s->maps[k], a, bytes)) return refuse(s, "map of a mapped range", ptr, bytes);
  pthread_mutex_unlock(&s->lock);
  void *token = NULL;
  rmmc_status_t st = rmmc_resource_allocate(s->upstream, bytes, 256, NULL, &token);
  pthread_mutex_lock(&s->lock);
  if (st == RMMC_SUCCESS && !push(&s->maps, &s->nmaps, &s->capmaps, (range_t){a, bytes, token, 0}))
    st = RMMC_ERROR_OUT_OF_MEMORY;
  if (st == RMMC_SUCCESS && mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) {
    s->nmaps--;
    st = RMMC_ERROR_OUT_OF_MEMORY;
  }
  if (st != RMMC_SUCCESS) {
    s->c.map_failures++;
    pthread_mutex_unlock(&s->lock);
    if (token != NULL) (void)rmmc_resource_deallocate(s->upstream, token, bytes, 256, NULL);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "vmspy: mapping %zu bytes refused", bytes);
  }
  s->c.maps++;
  s->c.mapped_bytes += bytes;
  if (s->c.mapped_bytes > s->c.peak_mapped_bytes) s->c.peak_mapped_bytes = s->c.mapped_bytes;
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

static rmmc_status_t vmspy_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  vmspy_t *s = (vmspy_t *)r;
  uintptr_t a = (uintptr_t)ptr;
  pthread_mutex_lock(&s->lock);
  size_t i = 0;
  while (i < s->nmaps && !(s->maps[i].addr == a && s->maps[i].bytes == bytes)) i++;
  if (i == s->nmaps) return refuse(s, "unmap of no mapped range", ptr, bytes);
  void *token = s->maps[i].token;
  pthread_mutex_unlock(&s->lock);
  /* The upstream first: if it refuses (fault injection), the range stays
   * mapped, as a driver's failed unmap leaves it, and nothing leaks. */
  rmmc_status_t st = rmmc_resource_deallocate(s->upstream, token, bytes, 256, NULL);
  if (st != RMMC_SUCCESS) return st;
  pthread_mutex_lock(&s->lock);
  for (i = 0; i < s->nmaps && !(s->maps[i].addr == a && s->maps[i].token == token); i++) {
  }
  if (i == s->nmaps) return refuse(s, "the same range unmapped twice at once", ptr, bytes);
  s->maps[i] = s->maps[--s->nmaps];
  s->c.unmaps++;
  s->c.mapped_bytes -= bytes;
  madvise(ptr, bytes, MADV_DONTNEED);
  mprotect(ptr, bytes, PROT_NONE);
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

/* Grants or takes back d's access to [ptr, ptr + bytes): whole mapped
 * ranges, contiguous (their sizes add up to bytes and each lies inside). */
static rmmc_status_t vmspy_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int d,
                                      bool readwrite) {
  vmspy_t *s = (vmspy_t *)r;
  uintptr_t a = (uintptr_t)ptr;
  pthread_mutex_lock(&s->lock);
  if (s->fail_access != 0 && --s->fail_access == 0 && s->fail_count > 0) {
    if (--s->fail_count > 0) s->fail_access = 1; /* the next call fails too */
    s->c.access_failures++;
    pthread_mutex_unlock(&s->lock);
    return rmmc_set_error(RMMC_ERROR_CUDA, "vmspy: injected vm_set_access failure");
  }
  size_t covered = 0;
  for (size_t k = 0; k < s->nmaps; k++) {
    if (!overlaps(&s->maps[k], a, bytes)) continue;
    if (s->maps[k].addr < a || s->maps[k].addr + s->maps[k].bytes > a + bytes)
      return refuse(s, "set_access over part of a mapping", ptr, bytes);
    covered += s->maps[k].bytes;
  }
  if (covered != bytes) return refuse(s, "set_access over unmapped pages", ptr, bytes);
  uint64_t bit = (uint64_t)1 << d;
  for (size_t k = 0; k < s->nmaps; k++)
    if (overlaps(&s->maps[k], a, bytes))
      s->maps[k].peers = readwrite ? s->maps[k].peers | bit : s->maps[k].peers & ~bit;
  if (readwrite) s->c.grants++;
  else s->c.revokes++;
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

static rmmc_status_t vmspy_enable_peer_access(rmmc_resource_t *r, int d) {
  vmspy_t *s = (vmspy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->c.peer_enables++;
  s->c.peers_enabled |= (uint64_t)1 << d;
  pthread_mutex_unlock(&s->lock);
  return RMMC_SUCCESS;
}

static rmmc_resource_t *vmspy_upstream(const rmmc_resource_t *r) {
  return ((const vmspy_t *)r)->upstream;
}

static void vmspy_destroy(rmmc_resource_t *r) {
  vmspy_t *s = (vmspy_t *)r;
  /* What the layer above left behind stays visible as upstream leaks. */
  rmmc_resource_release(s->upstream);
  free(s->res);
  free(s->maps);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static const rmmc_resource_ops_t vmspy_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "vmspy",
    .allocate = vmspy_allocate,
    .deallocate = vmspy_deallocate,
    .destroy = vmspy_destroy,
    .upstream = vmspy_upstream,
    .vm_page_size = vmspy_page_size,
    .vm_reserve = vmspy_reserve,
    .vm_unreserve = vmspy_unreserve,
    .vm_map = vmspy_map,
    .vm_unmap = vmspy_unmap,
    .enable_peer_access = vmspy_enable_peer_access,
    .vm_set_access = vmspy_set_access,
};

rmmc_status_t vmspy_create(rmmc_resource_t *upstream, size_t page, rmmc_resource_t **out) {
  vmspy_t *s = calloc(1, sizeof *s);
  if (s == NULL) return RMMC_ERROR_OUT_OF_MEMORY;
  rmmc_resource_init(&s->base, &vmspy_ops, RMMC_MEMORY_HOST, -1);
  pthread_mutex_init(&s->lock, NULL);
  s->upstream = rmmc_resource_retain(upstream);
  s->page = page;
  *out = &s->base;
  return RMMC_SUCCESS;
}

vmspy_counts_t vmspy_counts(rmmc_resource_t *r) {
  vmspy_counts_t c;
  memset(&c, 0, sizeof c);
  if (r == NULL || r->ops != &vmspy_ops) return c;
  vmspy_t *s = (vmspy_t *)r;
  pthread_mutex_lock(&s->lock);
  c = s->c;
  pthread_mutex_unlock(&s->lock);
  return c;
}

void vmspy_fail_set_access(rmmc_resource_t *r, uint64_t nth, uint64_t count) {
  if (r == NULL || r->ops != &vmspy_ops) return;
  vmspy_t *s = (vmspy_t *)r;
  pthread_mutex_lock(&s->lock);
  s->fail_access = nth;
  s->fail_count = count;
  pthread_mutex_unlock(&s->lock);
}

size_t vmspy_unreachable(rmmc_resource_t *r, int d, size_t *mapped) {
  size_t n = 0;
  *mapped = 0;
  if (r == NULL || r->ops != &vmspy_ops) return 0;
  vmspy_t *s = (vmspy_t *)r;
  pthread_mutex_lock(&s->lock);
  for (size_t k = 0; k < s->nmaps; k++) n += (s->maps[k].peers >> d & 1) == 0;
  *mapped = s->nmaps;
  pthread_mutex_unlock(&s->lock);
  return n;
}
