/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's virtual-memory backend (docs/design.md, "Growth backends"): a
 * region is an address-space reservation of the upstream, mapped into as
 * the pool grows; unmapped space is a block of state B_UNMAPPED (a hole),
 * every other block lies on mapped memory. Growth maps the shortfall, in
 * pages, at the hole needing least mapped, counting the free blocks beside
 * it that the stream may use (lowest address on a tie), so a growing block
 * extends its free neighbour in place. Trimming unmaps whole segments
 * inside finished free blocks, those freed longest ago first. Each segment
 * is granted to every peer as it is mapped, before anything else sees it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pool_internal.h"
#include "vm.h"

/* A growth's mappings: at most this many, up to this size (segment_of). */
#define VM_SEGMENTS_PER_GROWTH 8u
#define VM_SEGMENT_MAX ((size_t)1 << 30)

/* ---- holes ---- */

static void hole_add(pool_t *p, pool_block_t *u) {
  u->where = W_OUT;
  u->owner = NULL;
  u->qprev = NULL;
  u->qnext = p->holes;
  if (p->holes != NULL) p->holes->qprev = u;
  p->holes = u;
}

static void hole_remove(pool_t *p, pool_block_t *u) {
  if (u->qprev != NULL) u->qprev->qnext = u->qnext;
  else p->holes = u->qnext;
  if (u->qnext != NULL) u->qnext->qprev = u->qprev;
}

/* Merges hole u with the holes beside it (u is on the hole list). */
static pool_block_t *hole_merge(pool_t *p, pool_block_t *u) {
  for (int side = 0; side < 2; side++) {
    pool_block_t *n = side == 0 ? u->prev : u->next;
    if (n == NULL || n->state != B_UNMAPPED) continue;
    hole_remove(p, n);
    pool_absorb(u, n, side);
    rmmc__pool_drop_block(p, n);
  }
  return u;
}

/* ---- trimming ---- */

/* Unmaps segment i of r, which lies inside free block b (unindexed);
 * returns the free block after it (unindexed, owner kept) or NULL. The
 * pieces before it are indexed again. */
static rmmc_status_t unmap_seg(pool_t *p, pool_region_t *r, size_t i, pool_block_t *b,
                               pool_block_t **rest) {
  uintptr_t s0 = r->segs[i].addr, s1 = s0 + r->segs[i].size;
  POOL_CHECK(p, b, rmmc__pool_block_ok, b, B_FREE);
  POOL_ASSERT(p, b, b->where == W_OUT && b->region == r && s0 >= b->addr && s1 <= pool_bend(b));
  if (!rmmc__pool_room(p)) return rmmc__pool_no_host_memory();
  /* Paused (release_cached): one that is off was announced gone already. */
  bool off = r->segs[i].off != SEG_ON;
  rmmc_status_t st = off ? RMMC_SUCCESS : rmmc__pool_vm_unmap_announced(p, s0, r->segs[i].size);
  if (st != RMMC_SUCCESS) return st;
  POOL_SUB(p, p->reserved, r->segs[i].size);
  if (off) POOL_SUB(p, p->off_bytes, r->segs[i].size);
  else p->page_unmaps++;
  p->shrinks++;
  rmmc__pool_seg_remove(r, i);
  pool_block_t *mid = b;
  if (s0 > b->addr) {
    mid = rmmc__pool_split(p, b, s0);
    rmmc__pool_link_free(p, b);
  }
  *rest = s1 < pool_bend(mid) ? rmmc__pool_split(p, mid, s1) : NULL;
  mid->state = B_UNMAPPED;
  mid->tag = 0;
  hole_add(p, mid);
  mid = hole_merge(p, mid);
  POOL_CHECK(p, mid, rmmc__pool_hole_ok, mid);
  return RMMC_SUCCESS;
}

/* Unmaps segments wholly inside finished free blocks until reserved <=
 * goal, of the blocks freed longest ago first (a steady state reuses what
 * it freed recently). A block cut at its segment keeps the struct for the
 * front, so its candidates go highest first. */
typedef struct trim_cand {
  pool_block_t *b;
  uintptr_t seg; /* the segment's address */
  uint64_t freed;
} trim_cand_t;

static int older_first(const void *x, const void *y) {
  const trim_cand_t *a = x, *b = y;
  if (a->freed != b->freed) return a->freed < b->freed ? -1 : 1;
  return a->seg > b->seg ? -1 : a->seg < b->seg; /* within a block: highest first */
}

static rmmc_status_t vm_trim_keeping(pool_t *p, size_t goal, uintptr_t keep_lo,
                                     uintptr_t keep_hi) {
  rmmc_status_t st = RMMC_SUCCESS;
  for (pool_region_t *r = p->regions; r != NULL && p->reserved > goal && st == RMMC_SUCCESS;
       r = r->next) {
    if (r->nsegs == 0) continue;
    trim_cand_t *c = malloc(r->nsegs * sizeof *c);
    if (c == NULL) return rmmc__pool_no_host_memory();
    size_t n = 0;
    for (pool_block_t *b = r->first; b != NULL; b = b->next) {
      if (b->state != B_FREE || b->where != W_INDEX) continue;
      if (b->addr < keep_hi && pool_bend(b) > keep_lo) continue;
      size_t i = pool_seg_lower_bound(r, b->addr), j = i;
      while (j < r->nsegs && r->segs[j].addr + r->segs[j].size <= pool_bend(b)) j++;
      if (j == i || !rmmc__pool_settled(p, b, true)) continue;
      for (; i < j; i++) c[n++] = (trim_cand_t){b, r->segs[i].addr, b->freed};
    }
    qsort(c, n, sizeof *c, older_first);
    for (size_t k = 0; k < n && p->reserved > goal; k++) {
      pool_block_t *b = c[k].b, *rest = NULL;
      size_t i = pool_seg_lower_bound(r, c[k].seg);
      rmmc__pool_unlink_free(p, b);
      st = unmap_seg(p, r, i, b, &rest);
      if (st != RMMC_SUCCESS) {
        rmmc__pool_link_free(p, b);
        break;
      }
      if (rest != NULL) rmmc__pool_link_free(p, rest);
      /* b ends before the segment (indexed again), or became the hole. */
    }
    free(c);
  }
  return st;
}

static rmmc_status_t vm_trim(pool_t *p, size_t goal) { return vm_trim_keeping(p, goal, 0, 0); }

/* ---- growth ---- */

static inline bool usable_free(pool_t *p, pool_block_t *n, pool_owner_t *o) {
  return n != NULL && n->state == B_FREE && n->where == W_INDEX && rmmc__pool_usable(p, n, o);
}

typedef struct place {
  pool_block_t *u; /* the hole */
  uintptr_t m0, m1; /* what to map */
  pool_block_t *beside; /* m0 == m1: the free block beside u that holds the block alone */
} place_t;

/* Does free block b hold `need` bytes at an `align`-aligned address? */
static bool holds(const pool_block_t *b, size_t need, size_t align) {
  uintptr_t a = rmmc__align_up(b->addr, align);
  return a >= b->addr && a <= pool_bend(b) && pool_bend(b) - a >= need;
}

/* What hole u needs mapped for `need` bytes at an `align`-aligned address,
 * with the free blocks beside it that o may use (false: no room), at least
 * `min` bytes where the hole has them. A usable neighbour that holds the
 * block alone maps nothing (beside): it became usable after the caller's
 * search (other threads learn of finished work without the shared lock),
 * or that search rounds alignment up. */
static bool place_at(pool_t *p, pool_block_t *u, pool_owner_t *o, size_t need, size_t align,
                     size_t min, place_t *out) {
  pool_block_t *left = usable_free(p, u->prev, o) ? u->prev : NULL;
  pool_block_t *right = usable_free(p, u->next, o) ? u->next : NULL;
  pool_block_t *alone = left != NULL && holds(left, need, align)     ? left
                        : right != NULL && holds(right, need, align) ? right
                                                                     : NULL;
  if (alone != NULL) {
    *out = (place_t){u, u->addr, u->addr, alone};
    return true;
  }
  uintptr_t lo = left != NULL ? left->addr : u->addr;
  uintptr_t hi = right != NULL ? pool_bend(right) : pool_bend(u);
  uintptr_t s = rmmc__align_up(lo, align);
  if (s < lo || s > hi || hi - s < need) return false;
  /* From the left: the block starts as low as it can. */
  uintptr_t m0 = s > u->addr ? s & ~(uintptr_t)(p->page - 1) : u->addr;
  uintptr_t e = s + need < pool_bend(u) ? s + need : pool_bend(u);
  uintptr_t m1 = rmmc__align_up(e, p->page);
  if (m0 < u->addr) m0 = u->addr;
  /* From the right: the block ends where the free block after the hole
   * does, so only the hole's top is mapped (cheaper beside a large one). */
  if (right != NULL) {
    uintptr_t rs = (pool_bend(right) - need) & ~(uintptr_t)(align - 1);
    if (rs >= lo) {
      uintptr_t r0 = rs > u->addr ? rs & ~(uintptr_t)(p->page - 1) : u->addr;
      if (r0 < u->addr) r0 = u->addr;
      if (m1 <= m0 || pool_bend(u) - r0 < m1 - m0) m0 = r0, m1 = pool_bend(u);
    }
  }
  if (m1 <= m0) return false; /* (beside, above) */
  if (min > 0 && m1 - m0 < min) m1 = m0 + min < pool_bend(u) ? m0 + min : pool_bend(u);
  *out = (place_t){u, m0, m1, NULL};
  return true;
}

/* The hole needing least mapped; false if none can hold the block. */
static bool best_place(pool_t *p, pool_owner_t *o, size_t need, size_t align, size_t min,
                       place_t *best) {
  bool found = false;
  for (pool_block_t *u = p->holes; u != NULL; u = u->qnext) {
    place_t c;
    if (!place_at(p, u, o, need, align, min, &c)) continue;
    size_t cost = c.m1 - c.m0, bcost = best->m1 - best->m0;
    if (!found || cost < bcost || (cost == bcost && c.m0 < best->m0)) *best = c, found = true;
  }
  return found;
}

static rmmc_status_t reserve_region(pool_t *p, size_t need, size_t align) {
  size_t a = p->small_chunk > p->page ? p->small_chunk : p->page;
  if (align > a) a = align;
  size_t bytes = rmmc__align_up(need + align, a);
  if (bytes < p->address_space) bytes = p->address_space;
  void *base = NULL;
  rmmc_status_t st = rmmc_resource_vm_reserve(p->base.upstream, bytes, a, &base);
  if (st != RMMC_SUCCESS) return st;
  pool_region_t *r = rmmc__pool_add_region(p, (uintptr_t)base, bytes, B_UNMAPPED);
  if (r == NULL) {
    (void)rmmc_resource_vm_unreserve(p->base.upstream, base, bytes);
    return rmmc__pool_no_host_memory();
  }
  hole_add(p, r->first);
  POOL_CHECK(p, r->first, rmmc__pool_hole_ok, r->first);
  return RMMC_SUCCESS;
}

/* The most bytes one mapping of a growth of g bytes covers (design.md,
 * "Why 32 MiB mappings"): with the default page a growth maps in at most
 * VM_SEGMENTS_PER_GROWTH segments; an explicit page= is the most. */
static size_t segment_of(const pool_t *p, size_t g) {
  if (!p->segment_scales) return p->segment;
  size_t s = rmmc__align_up(g / VM_SEGMENTS_PER_GROWTH, p->page);
  if (s > VM_SEGMENT_MAX) s = rmmc__align_up(VM_SEGMENT_MAX, p->page);
  return s > p->segment ? s : p->segment;
}

/* Accounts [m0, m1) of hole u as mapped and turns it into a clean free
 * block merged with the usable free blocks beside it. */
static pool_block_t *carve_mapped(pool_t *p, pool_owner_t *o, place_t pl) {
  p->reserved += pl.m1 - pl.m0;
  if (p->reserved > p->reserved_peak) p->reserved_peak = p->reserved;
  pool_block_t *x = pl.u;
  hole_remove(p, x);
  if (pl.m0 > x->addr) {
    pool_block_t *back = rmmc__pool_split(p, x, pl.m0);
    hole_add(p, x);
    x = back;
  }
  if (pl.m1 < pool_bend(x)) hole_add(p, rmmc__pool_split(p, x, pl.m1));
  x->state = B_FREE;
  x->owner = NULL;
  x->tag = 0;
  x->where = W_OUT;
  for (int side = 0; side < 2; side++) {
    pool_block_t *n = side == 0 ? x->prev : x->next;
    if (!usable_free(p, n, o)) continue;
    rmmc__pool_unlink_free(p, n);
    if (n->owner != NULL && !rmmc__pool_settled(p, n, false)) {
      x->owner = n->owner;
      x->tag = n->tag;
    }
    pool_absorb(x, n, side);
    rmmc__pool_drop_block(p, n);
  }
  return x;
}

/* Maps [m0, m1) of hole u, in segments, and carves it (carve_mapped). */
static rmmc_status_t map_place(pool_t *p, pool_owner_t *o, place_t pl, pool_block_t **out) {
  pool_region_t *r = pl.u->region;
  uintptr_t a = pl.m0;
  if (!rmmc__pool_room(p)) return rmmc__pool_no_host_memory();
  rmmc_status_t st = RMMC_SUCCESS;
  size_t seg = segment_of(p, pl.m1 - pl.m0);
  while (a < pl.m1) {
    size_t n = pl.m1 - a < seg ? pl.m1 - a : seg;
    st = rmmc__pool_vm_map_segment(p, r, a, n);
    if (st != RMMC_SUCCESS) break;
    pool_hook_acquire(p, a, n);
    p->page_maps++;
    a += n;
  }
  if (st != RMMC_SUCCESS) {
    /* Take back what this growth mapped, highest first (the hole's struct
     * keeps the part below each cut). A piece the upstream refuses to unmap
     * stays, as free memory, so reserved stays honest. */
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    size_t i = pool_seg_lower_bound(r, pl.m0), j = i;
    while (j < r->nsegs && r->segs[j].addr < a) j++;
    while (j-- > i) {
      uintptr_t k0 = r->segs[j].addr;
      size_t n = r->segs[j].size;
      if (rmmc__pool_vm_unmap_announced(p, k0, n) == RMMC_SUCCESS) {
        rmmc__pool_seg_remove(r, j);
        continue;
      }
      if (rmmc__pool_room(p))
        rmmc__pool_put_free(p, carve_mapped(p, o, (place_t){pl.u, k0, k0 + n, NULL}));
    }
    rmmc__error_restore(&why);
    return st;
  }
  *out = carve_mapped(p, o, pl);
  return RMMC_SUCCESS;
}

/* The free block beside a hole that holds the request alone (place_at),
 * out of its index as a growth's block is, clean if another stream's
 * (usable: that work is finished). No growth: the caller's count is undone. */
static rmmc_status_t take_beside(pool_t *p, pool_owner_t *o, pool_block_t *b, pool_block_t **out) {
  rmmc__pool_unlink_free(p, b);
  if (b->owner != NULL && b->owner != o) {
    b->owner = NULL;
    b->tag = 0;
  }
  p->grows--; /* every caller of a successful grow counts one */
  *out = b;
  return RMMC_SUCCESS;
}

/* Where a growth goes: the best hole, else a new reservation (refused
 * within the budget once the pool has one). */
static rmmc_status_t place(pool_t *p, pool_owner_t *o, size_t need, size_t align, size_t min,
                           bool within, place_t *pl) {
  if (best_place(p, o, need, align, min, pl)) return RMMC_SUCCESS;
  if (within && p->regions != NULL)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: its address space is full");
  rmmc_status_t st = reserve_region(p, need, align);
  if (st != RMMC_SUCCESS) return st;
  if (!best_place(p, o, need, align, min, pl))
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "pool: no room in a new reservation");
  return RMMC_SUCCESS;
}

/* What a trim that keeps hole u and its neighbours must leave as it was. */
typedef struct kept {
  const pool_block_t *u, *prev, *next;
  uintptr_t addr;
  size_t size;
} kept_t;

static kept_t kept_of(const pool_block_t *u) {
  return (kept_t){u, u->prev, u->next, u->addr, pool_bsize(u)};
}

/* The trim kept the place: it touches no block overlapping [u->prev,
 * u->next], and its holes never merge with u's neighbours (not holes:
 * holes always merge). */
static bool place_kept(const kept_t *k) {
  const pool_block_t *u = k->u;
  return u->state == B_UNMAPPED && u->prev == k->prev && u->next == k->next &&
         u->addr == k->addr && pool_bsize(u) == k->size &&
         (k->prev == NULL || (k->prev->next == u && k->prev->state != B_UNMAPPED)) &&
         (k->next == NULL || (k->next->prev == u && k->next->state != B_UNMAPPED));
}

/* Trims to `goal`, leaving hole u and the blocks beside it as they are:
 * unmapping what a growth there would map back is churn. */
static rmmc_status_t trim_keeping_hole(pool_t *p, size_t goal, const pool_block_t *u) {
  return vm_trim_keeping(p, goal, u->prev != NULL ? u->prev->addr : u->addr,
                         u->next != NULL ? pool_bend(u->next) : pool_bend(u));
}

/* The upstream refused to map pl (the device is full): gives back as much
 * finished free memory elsewhere and maps again, before the last resort
 * synchronizes (design.md, "A refused growth"). The trim keeps the hole,
 * so it still has a place that maps no more. OUT_OF_MEMORY when nothing
 * went back or the upstream refuses again. */
static rmmc_status_t map_after_giving_back(pool_t *p, pool_owner_t *o, cudaStream_t stream,
                                           size_t need, size_t align, size_t min, place_t pl,
                                           pool_block_t **out) {
  size_t add = pl.m1 - pl.m0;
  /* o's own frees under an event first, so those whose work is done count
   * as finished (as the budget's trim covers them: rmmc__pool_admit). */
  if (o != NULL && o->uncovered > 0) rmmc__pool_cover(p, o, stream);
  uint64_t shrinks = p->shrinks;
  rmmc__error_state_t why;
  rmmc__error_save(&why);
  (void)trim_keeping_hole(p, p->reserved > add ? p->reserved - add : 0, pl.u);
  rmmc__error_restore(&why);
  if (p->shrinks == shrinks) return RMMC_ERROR_OUT_OF_MEMORY;
  p->refusal_trims++;
  if (!best_place(p, o, need, align, min, &pl))
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "pool: no place after trimming (a bug)");
  if (pl.beside != NULL) return take_beside(p, o, pl.beside, out);
  return map_place(p, o, pl, out);
}

static rmmc_status_t vm_grow_at(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t need,
                                size_t align, unsigned how, pool_block_t **out) {
  bool within = how & POOL_GROW_WITHIN;
  size_t min = how & POOL_GROW_EXACT ? 0 : p->min_growth;
  place_t pl = {0};
  rmmc_status_t st = place(p, o, need, align, min, within, &pl);
  if (st != RMMC_SUCCESS) return st;
  if (pl.beside != NULL) return take_beside(p, o, pl.beside, out);
  uint64_t shrinks = p->shrinks;
  size_t goal;
  pool_admit_t a = rmmc__pool_admit(p, o, stream, pl.m1 - pl.m0, need, within, &goal);
  if (a == POOL_ADMIT_TRIM) {
    kept_t k = kept_of(pl.u);
    p->budget_trims++;
    (void)trim_keeping_hole(p, goal, pl.u);
    if (RMMC_DEBUG_CHECKS >= 1 && !place_kept(&k))
      return rmmc_set_error(RMMC_ERROR_INTERNAL,
                            "pool: the budget's trim changed the hole at %p it had to keep, or "
                            "its neighbours (a bug)",
                            (void *)k.addr);
    a = rmmc__pool_admit_max(p, pl.m1 - pl.m0);
  }
  if (a != POOL_ADMIT_YES)
    return within ? rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool: over its budget")
                  : RMMC_ERROR_OUT_OF_MEMORY;
  if (p->shrinks != shrinks) { /* trimming moved things: place again, admit again */
    /* design.md, "A growth's place survives its trim". */
    if (!best_place(p, o, need, align, min, &pl))
      return rmmc_set_error(RMMC_ERROR_INTERNAL, "pool: no place after trimming (a bug)");
    if (pl.beside != NULL) return take_beside(p, o, pl.beside, out);
    if (rmmc__pool_admit_max(p, pl.m1 - pl.m0) != POOL_ADMIT_YES) return RMMC_ERROR_OUT_OF_MEMORY;
  }
  /* A refusal whose take-back the upstream refused too changed the hole
   * (map_place keeps what stays mapped): then no second try. */
  kept_t hole = kept_of(pl.u);
  st = map_place(p, o, pl, out);
  if (st == RMMC_ERROR_OUT_OF_MEMORY && !within && place_kept(&hole))
    st = map_after_giving_back(p, o, stream, need, align, min, pl, out);
  return st;
}

static rmmc_status_t vm_grow(pool_t *p, pool_owner_t *o, cudaStream_t stream, size_t need,
                             size_t align, unsigned how, pool_block_t **out) {
  /* An allocation that passed allocate's gate just before a pause would
   * merge with free blocks whose mappings are off. The pause sets `paused`
   * under every lock, so this read is exact. */
  if (RMMC_UNLIKELY(__atomic_load_n(&p->paused, __ATOMIC_RELAXED)))
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                          "pool: cannot grow by %zu bytes: the pool is paused (rmmc_pool_pause) "
                          "and holds no memory until rmmc_pool_resume",
                          need);
  rmmc_status_t st = vm_grow_at(p, o, stream, need, align, how, out);
  if (st == RMMC_SUCCESS) POOL_CHECK(p, *out, rmmc__pool_grown_ok, *out, o, need, true);
  return st;
}

/* ---- the end (every mapping unmapped and unreserved), figures, invariants ---- */

static void vm_fini(pool_t *p) {
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

static void vm_describe(pool_t *p, rmmc_field_cb emit, void *ctx) {
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

static bool vm_check(pool_t *p, char *msg, size_t len) {
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

const pool_backend_t rmmc__pool_vm = {
    .name = "virtual memory",
    .grow = vm_grow,
    .trim = vm_trim,
    .fini = vm_fini,
    .describe = vm_describe,
    .check = vm_check,
    .grant = rmmc__pool_vm_grant,
    .sleep = rmmc__pool_vm_sleep,
    .wake = rmmc__pool_vm_wake,
};
