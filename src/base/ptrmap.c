/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pointer map (see ptrmap.h): what is not on a hot path. Lookups,
 * inserts and removals are inline in the header.
 */
#include "base/ptrmap.h"

#include <stdint.h>
#include <stdlib.h>

#define PTRMAP_MIN_CAPACITY 64

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
  size_t i = rmmc__ptrmap_slot_of(e->key, mask);
  while (slots[i].key != NULL) i = (i + 1) & mask;
  slots[i] = *e;
}

bool rmmc__ptrmap_grow(rmmc__ptrmap_t *m) {
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
