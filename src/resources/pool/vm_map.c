/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The virtual-memory backend's mappings (vm.h): a reservation's sorted
 * segments, the upstream's calls with the memory hooks, peers, and sleep
 * mode's unmapping and mapping again at the same addresses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"
#include "vm.h"

/* ---- segments: the mapped ranges of a reservation, sorted ---- */

bool rmmc__pool_seg_insert(pool_region_t *r, uintptr_t addr, size_t size) {
  if (r->nsegs == r->capsegs) {
    size_t cap = r->capsegs ? 2 * r->capsegs : 16;
    pool_seg_t *s = realloc(r->segs, cap * sizeof *s);
    if (s == NULL) return false;
    r->segs = s;
    r->capsegs = cap;
  }
  size_t i = pool_seg_lower_bound(r, addr);
  memmove(r->segs + i + 1, r->segs + i, (r->nsegs - i) * sizeof *r->segs);
  r->segs[i] = (pool_seg_t){addr, size, SEG_ON, 0};
  r->nsegs++;
  return true;
}

void rmmc__pool_seg_remove(pool_region_t *r, size_t i) {
  memmove(r->segs + i, r->segs + i + 1, (r->nsegs - i - 1) * sizeof *r->segs);
  r->nsegs--;
}

/* The upstream's map (d < 0, on), unmap (d < 0, !on) or access call for
 * device d, counted; a call during another thread's capture is allowed. */
static rmmc_status_t vm_call(pool_t *p, uintptr_t a, size_t n, int d, bool on) {
  int mode = p->cuda ? rmmc__capture_relax() : -1;
  rmmc_resource_t *up = p->base.upstream;
  rmmc_status_t st = d >= 0 ? rmmc_resource_vm_set_access(up, (void *)a, n, d, on)
                     : on   ? rmmc_resource_vm_map(up, (void *)a, n)
                            : rmmc_resource_vm_unmap(up, (void *)a, n);
  rmmc__capture_restore(mode);
  return st;
}

/* Unmaps [a, a + n), which the hooks were told of: they hear it go, and
 * hear it held again if the upstream refuses to unmap it. */
rmmc_status_t rmmc__pool_vm_unmap_announced(pool_t *p, uintptr_t a, size_t n) {
  pool_hook_release(p, a, n);
  rmmc_status_t st = vm_call(p, a, n, -1, false);
  if (st != RMMC_SUCCESS) pool_hook_acquire(p, a, n); /* still held */
  return st;
}

/* Maps [a, a + n) (listed as a segment of r unless r is NULL) and grants
 * it to every peer; on failure unlisted and unmapped, or *stays when the
 * upstream refuses that too. */
static rmmc_status_t map_granted(pool_t *p, pool_region_t *r, uintptr_t a, size_t n, bool *stays) {
  *stays = false;
  rmmc_status_t st = vm_call(p, a, n, -1, true);
  if (st != RMMC_SUCCESS) return st;
  if (r != NULL && !rmmc__pool_seg_insert(r, a, n)) st = rmmc__pool_no_host_memory();
  for (uint64_t m = p->peers; m != 0 && st == RMMC_SUCCESS; m &= m - 1)
    st = vm_call(p, a, n, __builtin_ctzll(m), true);
  if (st != RMMC_SUCCESS) {
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    size_t i = r != NULL ? pool_seg_lower_bound(r, a) : 0;
    if (r != NULL && i < r->nsegs && r->segs[i].addr == a) rmmc__pool_seg_remove(r, i);
    *stays = vm_call(p, a, n, -1, false) != RMMC_SUCCESS;
    rmmc__error_restore(&why);
  }
  return st;
}

rmmc_status_t rmmc__pool_vm_map_segment(pool_t *p, pool_region_t *r, uintptr_t a, size_t n) {
  bool stays;
  rmmc_status_t st = map_granted(p, r, a, n, &stays);
  if (stays)
    rmmc__append_error(" (unmapping it failed too: %p + %zu bytes stay mapped, outside the "
                       "pool's books)",
                       (void *)a, n);
  return st;
}
/* ---- peers ---- */

/* Grants device d every segment held, in order; on a refusal takes back
 * what it granted (the message counts what it could not). Shared lock. */
rmmc_status_t rmmc__pool_vm_grant(pool_t *p, int d) {
  pool_region_t *r;
  size_t i = 0;
  rmmc_status_t st = RMMC_SUCCESS;
  for (r = p->regions; r != NULL; r = r->next)
    for (i = 0; i < r->nsegs; i++)
      if (r->segs[i].off == SEG_ON && /* one that is off is granted when it is mapped again */
          (st = vm_call(p, r->segs[i].addr, r->segs[i].size, d, true)) != RMMC_SUCCESS)
        goto take_back;
  return RMMC_SUCCESS;
take_back: {
  rmmc__error_state_t why;
  rmmc__error_save(&why);
  size_t kept = 0;
  for (pool_region_t *q = p->regions;; q = q->next) {
    size_t end = q == r ? i : q->nsegs;
    for (size_t k = 0; k < end; k++)
      if (q->segs[k].off == SEG_ON)
        kept += vm_call(p, q->segs[k].addr, q->segs[k].size, d, false) != RMMC_SUCCESS;
    if (q == r) break;
  }
  rmmc__error_restore(&why);
  if (kept != 0)
    rmmc__append_error(" (device %d keeps access to %zu of the pool's mappings: taking it back "
                       "failed too)",
                       d, kept);
  return st;
}
}

/* ---- sleep mode (sleep.c) ---- */

/* Unmaps mapping s, announced, and marks it off. */
static rmmc_status_t seg_off(pool_t *p, pool_seg_t *s) {
  rmmc_status_t st = rmmc__pool_vm_unmap_announced(p, s->addr, s->size);
  if (st != RMMC_SUCCESS) return st;
  s->off = SEG_OFF;
  p->off_bytes += s->size;
  p->page_unmaps++;
  return RMMC_SUCCESS;
}

/* pool_backend_t.sleep, lowest first. POOL_SLEEP_LIVE stops at a refusal
 * met before any of its mappings went: the pause can then still go back
 * with every live block intact. */
rmmc_status_t rmmc__pool_vm_sleep(pool_t *p, int which, size_t *gone) {
  rmmc_status_t first = RMMC_SUCCESS;
  rmmc__error_state_t why;
  size_t refused = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next)
    for (size_t i = 0; i < r->nsegs; i++) {
      pool_seg_t *s = &r->segs[i];
      if (s->off != SEG_ON || (which != POOL_SLEEP_ALL && s->live != (which == POOL_SLEEP_LIVE)))
        continue;
      rmmc_status_t st = seg_off(p, s);
      if (st == RMMC_SUCCESS) *gone += s->size;
      else if (refused++ == 0) first = st, rmmc__error_save(&why);
      if (st != RMMC_SUCCESS && which == POOL_SLEEP_LIVE && *gone == 0) goto done;
    }
done:
  if (first != RMMC_SUCCESS) {
    rmmc__error_restore(&why);
    rmmc__append_error(" (the upstream refused to unmap %zu of the pool's mappings)", refused);
  }
  return first;
}

/* pool_backend_t.wake, lowest first; SEG_WOKEN marks what this call
 * mapped, which a refusal unmaps again. */
rmmc_status_t rmmc__pool_vm_wake(pool_t *p) {
  rmmc_status_t st = RMMC_SUCCESS;
  for (pool_region_t *r = p->regions; r != NULL && st == RMMC_SUCCESS; r = r->next)
    for (size_t i = 0; i < r->nsegs && st == RMMC_SUCCESS; i++) {
      pool_seg_t *s = &r->segs[i];
      if (s->off != SEG_OFF) continue;
      bool stays;
      st = map_granted(p, NULL, s->addr, s->size, &stays);
      if (st != RMMC_SUCCESS && !stays) break;
      s->off = st == RMMC_SUCCESS ? SEG_WOKEN : SEG_ON; /* one that stays is held: on */
      p->off_bytes -= s->size;
      p->page_maps++;
      pool_hook_acquire(p, s->addr, s->size);
    }
  rmmc__error_state_t why;
  if (st != RMMC_SUCCESS) rmmc__error_save(&why);
  size_t kept = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next)
    for (size_t i = 0; i < r->nsegs; i++) {
      pool_seg_t *s = &r->segs[i];
      if (s->off != SEG_WOKEN) continue;
      if (st == RMMC_SUCCESS) s->off = SEG_ON;
      else if (seg_off(p, s) != RMMC_SUCCESS) s->off = SEG_ON, kept++;
    }
  if (st != RMMC_SUCCESS) {
    rmmc__error_restore(&why);
    if (kept != 0)
      rmmc__append_error(" (%zu mappings made again stay mapped: unmapping them failed too)", kept);
  }
  return st;
}
