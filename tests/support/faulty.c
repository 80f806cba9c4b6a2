/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The faulty resource (see faulty.h).
 */
#include "faulty.h"

#include <pthread.h>
#include <stdlib.h>

enum { OP_ALLOCATE = FAULTY_ALLOCATE, OP_DEALLOCATE = FAULTY_DEALLOCATE,
       OP_RELEASE = FAULTY_RELEASE, OP_PEER = FAULTY_PEER, OP_VM_RESERVE = FAULTY_VM_RESERVE,
       OP_VM_MAP = FAULTY_VM_MAP, OP_VM_UNMAP = FAULTY_VM_UNMAP, OP_COUNT };

struct faulty {
  rmmc_resource_t base;
  rmmc_resource_t *upstream;
  pthread_mutex_t lock;
  rmmc_status_t status[OP_COUNT];
  uint64_t remaining[OP_COUNT];
  uint64_t calls[OP_COUNT];
  rmmc_status_t every_status[OP_COUNT];
  uint64_t every[OP_COUNT], since_every[OP_COUNT]; /* every Nth; calls since armed */
  rmmc_status_t nth_status[OP_COUNT];
  uint64_t nth[OP_COUNT], since_nth[OP_COUNT]; /* only the Nth; calls since armed */
  uint64_t injected[OP_COUNT];
};

/* Counts the call and says whether it is to fail, and with what. */
static rmmc_status_t injected(faulty_t *f, int op) {
  pthread_mutex_lock(&f->lock);
  f->calls[op]++;
  rmmc_status_t st = RMMC_SUCCESS;
  if (f->remaining[op] > 0) {
    f->remaining[op]--;
    st = f->status[op];
  }
  if (f->every[op] != 0 && ++f->since_every[op] % f->every[op] == 0 && st == RMMC_SUCCESS)
    st = f->every_status[op];
  if (f->nth[op] != 0 && ++f->since_nth[op] == f->nth[op] && st == RMMC_SUCCESS)
    st = f->nth_status[op];
  if (st != RMMC_SUCCESS) f->injected[op]++;
  pthread_mutex_unlock(&f->lock);
  return st == RMMC_SUCCESS ? st : rmmc_set_error(st, "faulty: injected %s", rmmc_status_name(st));
}

static rmmc_status_t faulty_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                     cudaStream_t stream, void **out) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_ALLOCATE);
  return st != RMMC_SUCCESS ? st : rmmc_resource_allocate(f->upstream, bytes, alignment, stream, out);
}

static rmmc_status_t faulty_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                       size_t alignment, cudaStream_t stream) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_DEALLOCATE);
  return st != RMMC_SUCCESS ? st : rmmc_resource_deallocate(f->upstream, ptr, bytes, alignment, stream);
}

static rmmc_status_t faulty_release(rmmc_resource_t *r) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_RELEASE);
  return st != RMMC_SUCCESS ? st : rmmc_resource_release_cached(f->upstream);
}

static rmmc_status_t faulty_enable_peer_access(rmmc_resource_t *r, int peer_device) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_PEER);
  return st != RMMC_SUCCESS ? st : rmmc_resource_enable_peer_access(f->upstream, peer_device);
}

static rmmc_resource_t *faulty_upstream(const rmmc_resource_t *r) {
  return ((const faulty_t *)r)->upstream;
}

static void faulty_destroy(rmmc_resource_t *r) {
  faulty_t *f = (faulty_t *)r;
  rmmc_resource_release(f->upstream);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

/* ---- virtual memory (faulty_vm_create) ---- */

static size_t faulty_vm_page_size(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const faulty_t *)r)->upstream);
}

static rmmc_status_t faulty_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                       void **out) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_VM_RESERVE);
  return st != RMMC_SUCCESS ? st : rmmc_resource_vm_reserve(f->upstream, bytes, alignment, out);
}

static rmmc_status_t faulty_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  return rmmc_resource_vm_unreserve(((faulty_t *)r)->upstream, ptr, bytes);
}

static rmmc_status_t faulty_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_VM_MAP);
  return st != RMMC_SUCCESS ? st : rmmc_resource_vm_map(f->upstream, ptr, bytes);
}

static rmmc_status_t faulty_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  faulty_t *f = (faulty_t *)r;
  rmmc_status_t st = injected(f, OP_VM_UNMAP);
  return st != RMMC_SUCCESS ? st : rmmc_resource_vm_unmap(f->upstream, ptr, bytes);
}

static rmmc_status_t faulty_vm_set_access(rmmc_resource_t *r, void *ptr, size_t bytes, int device,
                                          bool readwrite) {
  return rmmc_resource_vm_set_access(((faulty_t *)r)->upstream, ptr, bytes, device, readwrite);
}

/* The slots both kinds have. */
#define FAULTY_SLOTS                                                           \
  .version = RMMC_RESOURCE_OPS_VERSION, .name = "faulty", .allocate = faulty_allocate, \
  .deallocate = faulty_deallocate, .release_cached = faulty_release,           \
  .destroy = faulty_destroy, .upstream = faulty_upstream,                      \
  .enable_peer_access = faulty_enable_peer_access

static const rmmc_resource_ops_t faulty_ops = {FAULTY_SLOTS};

static const rmmc_resource_ops_t faulty_vm_ops = {
    FAULTY_SLOTS,
    .vm_page_size = faulty_vm_page_size,
    .vm_reserve = faulty_vm_reserve,
    .vm_unreserve = faulty_vm_unreserve,
    .vm_map = faulty_vm_map,
    .vm_unmap = faulty_vm_unmap,
    .vm_set_access = faulty_vm_set_access,
};

static rmmc_status_t make(rmmc_resource_t *upstream, const rmmc_resource_ops_t *ops,
                          rmmc_resource_t **out) {
  faulty_t *f = calloc(1, sizeof *f);
  if (f == NULL) return RMMC_ERROR_OUT_OF_MEMORY;
  rmmc_resource_init(&f->base, ops, rmmc_resource_memory_kind(upstream),
                     rmmc_resource_device(upstream));
  f->upstream = rmmc_resource_retain(upstream);
  pthread_mutex_init(&f->lock, NULL);
  *out = &f->base;
  return RMMC_SUCCESS;
}

rmmc_status_t faulty_create(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  return make(upstream, &faulty_ops, out);
}

rmmc_status_t faulty_vm_create(rmmc_resource_t *upstream, rmmc_resource_t **out) {
  if (rmmc_resource_vm_page_size(upstream) == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED, "faulty_vm: %s has no virtual memory",
                          rmmc_resource_name(upstream));
  return make(upstream, &faulty_vm_ops, out);
}

faulty_t *faulty_of(rmmc_resource_t *r) {
  return r != NULL && (r->ops == &faulty_ops || r->ops == &faulty_vm_ops) ? (faulty_t *)r : NULL;
}

static void arm(faulty_t *f, int op, rmmc_status_t status, uint64_t count) {
  pthread_mutex_lock(&f->lock);
  f->status[op] = status;
  f->remaining[op] = count;
  pthread_mutex_unlock(&f->lock);
}

void faulty_fail_allocate(faulty_t *f, rmmc_status_t status, uint64_t count) {
  arm(f, OP_ALLOCATE, status, count);
}
void faulty_fail_deallocate(faulty_t *f, rmmc_status_t status, uint64_t count) {
  arm(f, OP_DEALLOCATE, status, count);
}
void faulty_fail_release(faulty_t *f, rmmc_status_t status, uint64_t count) {
  arm(f, OP_RELEASE, status, count);
}
void faulty_fail_peer_access(faulty_t *f, rmmc_status_t status, uint64_t count) {
  arm(f, OP_PEER, status, count);
}
void faulty_fail_next(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t count) {
  arm(f, (int)op, status, count);
}

/* Arms a counted injection: its status, its N, its count of calls since. */
static void arm_counted(faulty_t *f, rmmc_status_t *status_of, uint64_t *n_of, uint64_t *since_of,
                        rmmc_status_t status, uint64_t n) {
  pthread_mutex_lock(&f->lock);
  *status_of = status;
  *n_of = n;
  *since_of = 0;
  pthread_mutex_unlock(&f->lock);
}

void faulty_fail_every(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t n) {
  arm_counted(f, &f->every_status[op], &f->every[op], &f->since_every[op], status, n);
}

void faulty_fail_nth(faulty_t *f, faulty_op_t op, rmmc_status_t status, uint64_t n) {
  arm_counted(f, &f->nth_status[op], &f->nth[op], &f->since_nth[op], status, n);
}

void faulty_disarm(faulty_t *f) {
  pthread_mutex_lock(&f->lock);
  for (int op = 0; op < OP_COUNT; op++) f->remaining[op] = f->every[op] = f->nth[op] = 0;
  pthread_mutex_unlock(&f->lock);
}

faulty_counts_t faulty_counts(faulty_t *f) {
  pthread_mutex_lock(&f->lock);
  faulty_counts_t c = {f->calls[OP_ALLOCATE],       f->calls[OP_DEALLOCATE],
                       f->calls[OP_RELEASE],        f->injected[OP_ALLOCATE],
                       f->injected[OP_DEALLOCATE],  f->injected[OP_RELEASE],
                       f->calls[OP_PEER],           f->injected[OP_PEER],
                       f->calls[OP_VM_RESERVE],     f->calls[OP_VM_MAP],
                       f->calls[OP_VM_UNMAP],       f->injected[OP_VM_RESERVE],
                       f->injected[OP_VM_MAP],      f->injected[OP_VM_UNMAP]};
  pthread_mutex_unlock(&f->lock);
  return c;
}
