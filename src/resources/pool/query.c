/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's answers from outside its allocate and free paths:
 * get_allocation, set_memory_hooks and enable_peer_access (resource.h has
 * their contracts). No hot path; every lookup takes the locks it reads under.
 */
#include <stdio.h>

#include "pool_internal.h"

enum { FOUND = 0, MISSING = 1, RETRY = 2 };

/* Fills *out for used block b, which lies in region `region` (a chunk or a
 * reservation: for a span's block, the region of the span's parent). */
static void describe_block(pool_t *p, const pool_block_t *b, const pool_region_t *region,
                           rmmc_allocation_t *out) {
  out->base = (void *)b->addr;
  out->bytes = b->requested;
  out->resource = &p->base.base;
  if (p->be != &rmmc__pool_vm) {
    out->backing = RMMC_BACKING_BLOCK;
    out->upstream = (rmmc_range_t){(void *)region->base, region->size};
    return;
  }
  /* Every page under a used block is mapped: the segments overlapping it are adjacent. */
  uintptr_t a1 = b->addr + b->requested, first = 0, end = 0;
  size_t n = 0;
  for (size_t i = pool_seg_search(region, b->addr, true);
       i < region->nsegs && region->segs[i].addr < a1; i++, n++) {
    const pool_seg_t *s = &region->segs[i];
    if (n == 0) first = s->addr;
    end = s->addr + s->size;
    if (n < out->max_mappings) out->mappings[n] = (rmmc_range_t){(void *)s->addr, s->size};
  }
  out->backing = RMMC_BACKING_MAPPINGS;
  out->nmappings = n;
  out->upstream = (rmmc_range_t){(void *)first, end - first};
}

/* The used block holding address a, of `region` (see describe_block): by
 * its first byte in map `used`, else by walking the blocks from `first`.
 * FOUND (out filled) if a used block holds a below its requested end,
 * MISSING otherwise. */
static int find_in(pool_t *p, rmmc__ptrmap_t *used, pool_block_t *first,
                   const pool_region_t *region, uintptr_t a, rmmc_allocation_t *out) {
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(used, (void *)a);
  pool_block_t *b = e != NULL ? e->value : NULL;
  for (pool_block_t *x = first; b == NULL && x != NULL && x->addr <= a; x = x->next) {
    if (a >= pool_bend(x)) continue;
    if (x->state != B_USED || a >= x->addr + x->requested) return MISSING;
    b = x;
  }
  if (b == NULL) return MISSING;
  describe_block(p, b, region, out);
  return FOUND;
}

/* A large block (shared lock held), in the region holding a. */
static int find_large(pool_t *p, uintptr_t a, rmmc_allocation_t *out) {
  for (pool_region_t *r = p->regions; r != NULL; r = r->next)
    if (a >= r->base && a - r->base < r->size) return find_in(p, &p->used, r->first, r, a, out);
  return MISSING;
}

/* A block of a span: spans are aligned to their size, so the span holding
 * a starts at a rounded down. Takes the span's heap lock, then the shared
 * lock (the pool's lock order), and looks again: the span may have gone
 * back meanwhile (RETRY). */
static int find_small(pool_t *p, uintptr_t a, rmmc_allocation_t *out) {
  uintptr_t base = a & ~(uintptr_t)(p->small_chunk - 1);
  if (base == 0) return MISSING; /* the map's empty key */
  rmmc__lock(&p->lock);
  rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->spans, (void *)base);
  pool_sheap_t *h = e != NULL ? ((pool_region_t *)e->value)->heap : NULL;
  int found = h == NULL ? find_large(p, a, out) : RETRY;
  rmmc__unlock(&p->lock);
  if (h == NULL) return found;
  rmmc__lock(&h->lock);
  rmmc__lock(&p->lock);
  e = rmmc__ptrmap_find(&p->spans, (void *)base);
  pool_region_t *sp = e != NULL ? e->value : NULL;
  if (sp != NULL && sp->heap == h)
    found = find_in(p, &h->used, sp->first, sp->parent->region, a, out);
  rmmc__unlock(&p->lock);
  rmmc__unlock(&h->lock);
  return found;
}

rmmc_status_t rmmc__pool_get_allocation(rmmc_resource_t *r, const void *ptr,
                                        rmmc_allocation_t *out) {
  pool_t *p = (pool_t *)r;
  int found = RETRY;
  for (int attempt = 0; attempt < 4 && found == RETRY; attempt++)
    found = find_small(p, (uintptr_t)ptr, out);
  if (found == FOUND) return RMMC_SUCCESS;
  return rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "pool: %p is not inside a block this pool has handed out (it is free "
                        "memory of the pool, was freed already, or is not the pool's)",
                        ptr);
}

/* ---- memory hooks ---- */

/* Calls `cb` for every range the pool holds from its upstream: its chunks,
 * or every mapping of its reservations. Shared lock held. */
static void each_range(pool_t *p, rmmc_memory_hook_cb cb, void *user) {
  if (cb == NULL) return;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) {
    if (p->be != &rmmc__pool_vm) {
      cb((void *)r->base, r->size, user);
      continue;
    }
    for (size_t i = 0; i < r->nsegs; i++)
      if (r->segs[i].off == SEG_ON) /* paused: one that is off is not held */
        cb((void *)r->segs[i].addr, r->segs[i].size, user);
  }
}

rmmc_status_t rmmc__pool_set_memory_hooks(rmmc_resource_t *r, const rmmc_memory_hooks_t *hooks) {
  pool_t *p = (pool_t *)r;
  rmmc_memory_hooks_t none = RMMC_MEMORY_HOOKS_INIT;
  rmmc__lock(&p->lock);
  each_range(p, p->hooks.on_release, p->hooks.user);
  p->hooks = hooks != NULL ? *hooks : none;
  each_range(p, p->hooks.on_acquire, p->hooks.user);
  rmmc__unlock(&p->lock);
  return RMMC_SUCCESS;
}

/* ---- peer access ---- */

/* Whether the upstream can grant pages is checked first, so that a refusal
 * changes nothing. Then the upstream: it checks the two devices and makes
 * its own memory reachable (a chunk is the upstream's memory). Then, under
 * the shared lock that every growth takes, the mappings the pool made
 * itself are granted and the peer joins the set that every later mapping
 * is granted to (vm.c), so no mapping falls between the two. */
rmmc_status_t rmmc__pool_enable_peer_access(rmmc_resource_t *r, int peer_device) {
  pool_t *p = (pool_t *)r;
  if (p->be->grant != NULL && !rmmc__vm_can_set_access(p->base.upstream))
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool: device %d cannot be given access to this pool's pages: its "
                          "upstream, %s, cannot grant other devices its pages (no vm_set_access "
                          "slot, ops table version 4)",
                          peer_device, rmmc_resource_name(p->base.upstream));
  rmmc_status_t st = rmmc_resource_enable_peer_access(p->base.upstream, peer_device);
  if (st != RMMC_SUCCESS) return st;
  uint64_t bit = (uint64_t)1 << peer_device;
  rmmc__lock(&p->lock);
  if ((p->peers & bit) == 0) {
    if (p->be->grant != NULL) st = p->be->grant(p, peer_device);
    if (st == RMMC_SUCCESS) p->peers |= bit;
  }
  rmmc__unlock(&p->lock);
  return st;
}

void rmmc__pool_peers_text(uint64_t peers, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (uint64_t m = peers; m != 0 && at < len; m &= m - 1)
    at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? "," : "", __builtin_ctzll(m));
}
