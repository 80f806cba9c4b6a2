/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's virtual-memory backend (vm.c): its end (everything unmapped
 * and unreserved at destroy), its figures and its invariants, apart from
 * the growth and trimming that the pool's calls run.
 */
#include <stdio.h>

#include "check.h"
#include "vm.h"

void rmmc__pool_vm_fini(pool_t *p) {
  while (p->regions != NULL) {
    pool_region_t *r = p->regions;
    for (size_t i = 0; i < r->nsegs; i++) {
      if (r->segs[i].off != SEG_ON) continue; /* paused: gone already, announced */
      pool_hook_release(p, r->segs[i].addr, r->segs[i].size);
      (void)rmmc_resource_vm_unmap(p->base.upstream, (void *)r->segs[i].addr, r->segs[i].size);
    }
    (void)rmmc_resource_vm_unreserve(p->base.upstream, (void *)r->base, r->size);
    rmmc__pool_remove_region(p, r);
  }
}

void rmmc__pool_vm_describe(pool_t *p, rmmc_field_cb emit, void *ctx) {
  size_t segs = 0, space = 0;
  rmmc__lock(&p->lock);
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) segs += r->nsegs, space += r->size;
  uint64_t maps = p->page_maps, unmaps = p->page_unmaps, refusals = p->refusal_trims,
           budget = p->budget_trims;
  rmmc__unlock(&p->lock);
  rmmc__emit_text(emit, ctx, "backend", "virtual memory");
  rmmc__emit_bytes(emit, ctx, "page", p->page);
  rmmc__emit_bytes(emit, ctx, "address_space", space);
  rmmc__emit_count(emit, ctx, "mappings", segs);
  rmmc__emit_count(emit, ctx, "page_maps", maps);
  rmmc__emit_count(emit, ctx, "page_unmaps", unmaps);
  rmmc__emit_count(emit, ctx, "budget_trims", budget);
  rmmc__emit_count(emit, ctx, "refusal_trims", refusals);
}

bool rmmc__pool_vm_check(pool_t *p, char *msg, size_t len) {
  size_t mapped = 0, holes = 0, off = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) {
    for (size_t i = 0; i < r->nsegs; i++) {
      const pool_seg_t *s = &r->segs[i];
      POOL_WALK_CHECK(s->addr >= r->base && s->addr + s->size <= r->base + r->size &&
                          s->addr % p->page == 0 && s->size % p->page == 0 &&
                          (i == 0 || r->segs[i - 1].addr + r->segs[i - 1].size <= s->addr),
                      "mapping %p + %zu is out of place", (void *)s->addr, s->size);
      mapped += s->size;
      POOL_WALK_CHECK(s->off == SEG_ON || (s->off == SEG_OFF && p->paused),
                      "mapping %p + %zu is %s while the pool is %s", (void *)s->addr, s->size,
                      s->off == SEG_OFF ? "off" : "half woken", p->paused ? "paused" : "awake");
      if (s->off == SEG_OFF) off += s->size;
    }
    for (pool_block_t *b = r->first; b != NULL; b = b->next) {
      bool unmapped = b->state == B_UNMAPPED;
      holes += unmapped;
      POOL_WALK_CHECK(pool_segs_cover(r, b->addr, pool_bend(b), !unmapped, false),
                      "block %p + %zu (state %d) is %s", (void *)b->addr, pool_bsize(b), b->state,
                      unmapped ? "mapped" : "not wholly mapped");
      POOL_WALK_CHECK(!unmapped || b->next == NULL || b->next->state != B_UNMAPPED,
                      "holes at %p and %p should have merged", (void *)b->addr,
                      (void *)b->next->addr);
    }
  }
  size_t listed = 0;
  for (pool_block_t *u = p->holes; u != NULL; u = u->qnext) listed++;
  POOL_WALK_CHECK(off == p->off_bytes, "%zu bytes of mappings are off, the pool counts %zu", off,
                  p->off_bytes);
  POOL_WALK_CHECK(mapped == p->reserved && listed == holes,
                  "reserved %zu, mappings add up to %zu; %zu holes, %zu listed", p->reserved,
                  mapped, holes, listed);
  return true;
}
