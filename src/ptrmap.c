/*
 * The pointer map (see ptrmap.h). Capacity doubles when the map is half
 * full, which keeps probe sequences a few slots long; pointers are mixed
 * with a 64-bit finalizer because rmmc's are all multiples of 256.
 */
#include "ptrmap.h"

#include <stdint.h>
#include <stdlib.h>

#define PTRMAP_MIN_CAPACITY 64

static size_t slot_of(const void *key, size_t mask) {
  uint64_t h = (uint64_t)(uintptr_t)key;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (size_t)h & mask;
}

void rmmc__ptrmap_init(rmmc__ptrmap_t *m) {
  m->slots = NULL;
  m->mask = 0;
  m->count = 0;
}

void rmmc__ptrmap_fini(rmmc__ptrmap_t *m) {
  free(m->slots);
  rmmc__ptrmap_init(m);
}

static void place(rmmc__ptrmap_entry_t *slots, size_t mask, const rmmc__ptrmap_entry_t *e) {
  size_t i = slot_of(e->key, mask);
  while (slots[i].key != NULL) i = (i + 1) & mask;
  slots[i] = *e;
}

static bool grow(rmmc__ptrmap_t *m) {
  size_t cap = m->slots == NULL ? PTRMAP_MIN_CAPACITY : (m->mask + 1) * 2;
  if (cap > SIZE_MAX / sizeof(rmmc__ptrmap_entry_t)) return false;
  rmmc__ptrmap_entry_t *slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return false;
  if (m->slots != NULL)
    for (size_t i = 0; i <= m->mask; i++)
      if (m->slots[i].key != NULL) place(slots, cap - 1, &m->slots[i]);
  free(m->slots);
  m->slots = slots;
  m->mask = cap - 1;
  return true;
}

bool rmmc__ptrmap_insert(rmmc__ptrmap_t *m, void *key, void *value, size_t size) {
  if (m->slots == NULL || (m->count + 1) * 2 > m->mask + 1)
    if (!grow(m)) return false;
  rmmc__ptrmap_entry_t e = {key, value, size};
  place(m->slots, m->mask, &e);
  m->count++;
  return true;
}

rmmc__ptrmap_entry_t *rmmc__ptrmap_find(const rmmc__ptrmap_t *m, const void *key) {
  if (m->slots == NULL) return NULL;
  for (size_t i = slot_of(key, m->mask);; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) return &m->slots[i];
    if (m->slots[i].key == NULL) return NULL;
  }
}

void rmmc__ptrmap_remove(rmmc__ptrmap_t *m, rmmc__ptrmap_entry_t *e) {
  size_t mask = m->mask;
  size_t hole = (size_t)(e - m->slots);
  /* Backward shift: move each later entry of the probe run into the hole
   * unless its home slot lies cyclically in (hole, j]. */
  for (size_t j = (hole + 1) & mask; m->slots[j].key != NULL; j = (j + 1) & mask) {
    size_t home = slot_of(m->slots[j].key, mask);
    bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    m->slots[hole] = m->slots[j];
    hole = j;
  }
  m->slots[hole].key = NULL;
  m->count--;
}
