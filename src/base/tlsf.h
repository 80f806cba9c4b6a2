/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A two-level segregated-fit index of free ranges (internal; header-only so
 * its operations inline into the allocators' hot paths).
 *
 * Sizes are multiples of 256 bytes. Below 8 KiB each 256-byte size has a
 * bin of its own; above, each power of two is split into 32 bins, so the
 * blocks of one bin differ by at most 1/32 of their size. Two levels of
 * bitmaps find the first non-empty bin at or above a size with a few bit
 * scans: a search is O(1), never a walk of a free list.
 *
 * The index is intrusive: a range embeds an rmmc__tlsf_node_t (its size and
 * the links of its bin's list) and the index only links nodes. Within a bin
 * nodes are kept last in, first out. Not thread-safe: the owner locks.
 */
#ifndef RMMC_TLSF_H
#define RMMC_TLSF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RMMC__TLSF_GRANULE_LOG2 8u
#define RMMC__TLSF_SL_LOG2 5u
#define RMMC__TLSF_SL_COUNT 32u
#define RMMC__TLSF_FL_SHIFT (RMMC__TLSF_GRANULE_LOG2 + RMMC__TLSF_SL_LOG2)
#define RMMC__TLSF_FL_COUNT 40u /* sizes below 2^52 */
/* The largest size a search may ask for: its bin and the next exist. */
#define RMMC__TLSF_MAX_SIZE ((size_t)1 << 48)

typedef struct rmmc__tlsf_node {
  size_t size;
  struct rmmc__tlsf_node *prev, *next;
} rmmc__tlsf_node_t;

typedef struct rmmc__tlsf {
  uint64_t fl_map;
  uint32_t sl_map[RMMC__TLSF_FL_COUNT];
  rmmc__tlsf_node_t *heads[RMMC__TLSF_FL_COUNT][RMMC__TLSF_SL_COUNT];
  size_t bytes, count; /* what the index holds */
} rmmc__tlsf_t;

static inline unsigned rmmc__log2_floor(size_t x) {
  return 63u - (unsigned)__builtin_clzll((unsigned long long)x);
}

static inline void rmmc__tlsf_bin(size_t size, unsigned *fl, unsigned *sl) {
  if (size < ((size_t)1 << RMMC__TLSF_FL_SHIFT)) {
    *fl = 0;
    *sl = (unsigned)(size >> RMMC__TLSF_GRANULE_LOG2);
    return;
  }
  unsigned t = rmmc__log2_floor(size);
  *fl = t - (RMMC__TLSF_FL_SHIFT - 1);
  *sl = (unsigned)(size >> (t - RMMC__TLSF_SL_LOG2)) & (RMMC__TLSF_SL_COUNT - 1);
}

static inline void rmmc__tlsf_insert(rmmc__tlsf_t *x, rmmc__tlsf_node_t *n) {
  unsigned fl, sl;
  rmmc__tlsf_bin(n->size, &fl, &sl);
  rmmc__tlsf_node_t *h = x->heads[fl][sl];
  n->prev = NULL;
  n->next = h;
  if (h != NULL) h->prev = n;
  x->heads[fl][sl] = n;
  x->fl_map |= (uint64_t)1 << fl;
  x->sl_map[fl] |= 1u << sl;
  x->bytes += n->size;
  x->count++;
}

static inline void rmmc__tlsf_remove(rmmc__tlsf_t *x, rmmc__tlsf_node_t *n) {
  if (n->next != NULL) n->next->prev = n->prev;
  if (n->prev != NULL) {
    n->prev->next = n->next;
  } else {
    unsigned fl, sl;
    rmmc__tlsf_bin(n->size, &fl, &sl);
    x->heads[fl][sl] = n->next;
    if (n->next == NULL && (x->sl_map[fl] &= ~(1u << sl)) == 0)
      x->fl_map &= ~((uint64_t)1 << fl);
  }
  x->bytes -= n->size;
  x->count--;
}

/* A node of at least `need` bytes (need <= RMMC__TLSF_MAX_SIZE), or NULL:
 * the head of need's own bin if it fits, else the head of the first
 * non-empty bin above (all of whose nodes fit). The node found is at most
 * about 1/16 larger than need whenever the index holds one that close. */
static inline rmmc__tlsf_node_t *rmmc__tlsf_find(const rmmc__tlsf_t *x, size_t need) {
  if (x->count == 0) return NULL;
  unsigned fl, sl;
  rmmc__tlsf_bin(need, &fl, &sl);
  rmmc__tlsf_node_t *h = x->heads[fl][sl];
  if (h != NULL && h->size >= need) return h;
  uint32_t slm = sl + 1 < RMMC__TLSF_SL_COUNT ? x->sl_map[fl] & (~0u << (sl + 1)) : 0;
  if (slm == 0) {
    uint64_t flm = fl + 1 < 64 ? x->fl_map & (~(uint64_t)0 << (fl + 1)) : 0;
    if (flm == 0) return NULL;
    fl = (unsigned)__builtin_ctzll(flm);
    slm = x->sl_map[fl];
  }
  return x->heads[fl][__builtin_ctz(slm)];
}

/* As rmmc__tlsf_find, and where that finds none, a node of need's own bin
 * that fits after all (the search looks only at each bin's head): for slow
 * paths, which must not grow while a fitting block is free. */
static inline rmmc__tlsf_node_t *rmmc__tlsf_find_fit(const rmmc__tlsf_t *x, size_t need) {
  rmmc__tlsf_node_t *n = rmmc__tlsf_find(x, need);
  if (n != NULL || x->count == 0) return n;
  unsigned fl, sl;
  rmmc__tlsf_bin(need, &fl, &sl);
  for (n = x->heads[fl][sl]; n != NULL; n = n->next)
    if (n->size >= need) return n;
  return NULL;
}

/* Some node of a non-empty index (the head of its lowest non-empty bin). */
static inline rmmc__tlsf_node_t *rmmc__tlsf_any(const rmmc__tlsf_t *x) {
  unsigned fl = (unsigned)__builtin_ctzll(x->fl_map);
  return x->heads[fl][__builtin_ctz(x->sl_map[fl])];
}

/* The size of the largest node (0 if empty): the largest of its highest
 * bin, whose list is walked. */
static inline size_t rmmc__tlsf_largest(const rmmc__tlsf_t *x) {
  if (x->count == 0) return 0;
  unsigned fl = rmmc__log2_floor(x->fl_map);
  unsigned sl = 31u - (unsigned)__builtin_clz(x->sl_map[fl]);
  size_t best = 0;
  for (const rmmc__tlsf_node_t *n = x->heads[fl][sl]; n != NULL; n = n->next)
    if (n->size > best) best = n->size;
  return best;
}

/* Checks the bitmaps and counts against the lists, and that each node sits
 * in the bin of its size (for invariant checks; linear). */
static inline bool rmmc__tlsf_valid(const rmmc__tlsf_t *x) {
  size_t bytes = 0, count = 0;
  for (unsigned fl = 0; fl < RMMC__TLSF_FL_COUNT; fl++) {
    bool fl_bit = (x->fl_map >> fl) & 1;
    if (fl_bit != (x->sl_map[fl] != 0)) return false;
    for (unsigned sl = 0; sl < RMMC__TLSF_SL_COUNT; sl++) {
      const rmmc__tlsf_node_t *h = x->heads[fl][sl];
      if (((x->sl_map[fl] >> sl) & 1) != (h != NULL)) return false;
      for (const rmmc__tlsf_node_t *n = h, *p = NULL; n != NULL; p = n, n = n->next) {
        unsigned f, s;
        rmmc__tlsf_bin(n->size, &f, &s);
        if (f != fl || s != sl || n->prev != p) return false;
        bytes += n->size;
        count++;
      }
    }
  }
  return bytes == x->bytes && count == x->count;
}

#endif /* RMMC_TLSF_H */
