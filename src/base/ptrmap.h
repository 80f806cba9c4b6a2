/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A host-side map from pointers to (pointer, size): open addressing with
 * linear probing and backward-shift deletion, so lookups stay short without
 * tombstones. Adaptors keep their per-allocation bookkeeping here, never in
 * the memory they hand out (device memory is not touched by the CPU).
 * Not thread-safe: the owner locks (and may shard maps to spread locks).
 */
#ifndef RMMC_PTRMAP_H
#define RMMC_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rmmc__ptrmap_entry {
  void *key; /* NULL marks an empty slot */
  void *value;
  size_t size;
} rmmc__ptrmap_entry_t;

typedef struct rmmc__ptrmap {
  rmmc__ptrmap_entry_t *slots;
  size_t mask; /* capacity - 1 (capacity is a power of two), 0 while empty */
  size_t count;
} rmmc__ptrmap_t;

/* An empty map; allocates nothing until the first insert. */
void rmmc__ptrmap_init(rmmc__ptrmap_t *m);
/* Frees the slots (not what the entries point to). */
void rmmc__ptrmap_fini(rmmc__ptrmap_t *m);
/* Grows the map (doubling its capacity); false if host memory runs out. */
bool rmmc__ptrmap_grow(rmmc__ptrmap_t *m);
/* The home slot of key. rmmc's pointers are multiples of 256, so the slot
 * comes from the well-mixed middle bits of key times 2^64/phi (Fibonacci
 * hashing; capacities stay below 2^32). */
static inline size_t rmmc__ptrmap_slot_of(const void *key, size_t mask) {
  return (size_t)(((uint64_t)(uintptr_t)key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & mask;
}

/* The entry for key, or NULL; valid until the next insert or remove.
 * Inline: it is on every sub-allocator's free path. */
static inline rmmc__ptrmap_entry_t *rmmc__ptrmap_find(const rmmc__ptrmap_t *m, const void *key) {
  if (m->slots == NULL) return NULL;
  for (size_t i = rmmc__ptrmap_slot_of(key, m->mask);; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) return &m->slots[i];
    if (m->slots[i].key == NULL) return NULL;
  }
}
/* Adds key (not NULL, not present). Returns false, leaving the map as it
 * was, if host memory for growing it runs out. The map grows when a quarter
 * full, which keeps probe runs (and the shifts of a removal) to a slot or
 * two. Inline: it is on every sub-allocator's allocation path. */
static inline bool rmmc__ptrmap_insert(rmmc__ptrmap_t *m, void *key, void *value, size_t size) {
  if (m->slots == NULL || (m->count + 1) * 4 > m->mask + 1)
    if (!rmmc__ptrmap_grow(m)) return false;
  size_t i = rmmc__ptrmap_slot_of(key, m->mask);
  while (m->slots[i].key != NULL) i = (i + 1) & m->mask;
  m->slots[i].key = key;
  m->slots[i].value = value;
  m->slots[i].size = size;
  m->count++;
  return true;
}

/* Removes an entry rmmc__ptrmap_find returned. Backward shift: each later
 * entry of the probe run moves into the hole unless its home slot lies
 * cyclically in (hole, j], so no tombstones are needed. */
static inline void rmmc__ptrmap_remove(rmmc__ptrmap_t *m, rmmc__ptrmap_entry_t *e) {
  size_t mask = m->mask;
  size_t hole = (size_t)(e - m->slots);
  for (size_t j = (hole + 1) & mask; m->slots[j].key != NULL; j = (j + 1) & mask) {
    size_t home = rmmc__ptrmap_slot_of(m->slots[j].key, mask);
    bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    m->slots[hole] = m->slots[j];
    hole = j;
  }
  m->slots[hole].key = NULL;
  m->count--;
}

#endif /* RMMC_PTRMAP_H */
