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
/* Adds key (not NULL, not present). Returns false, leaving the map as it
 * was, if host memory for growing it runs out. */
bool rmmc__ptrmap_insert(rmmc__ptrmap_t *m, void *key, void *value, size_t size);
/* The entry for key, or NULL; valid until the next insert or remove. */
rmmc__ptrmap_entry_t *rmmc__ptrmap_find(const rmmc__ptrmap_t *m, const void *key);
/* Removes an entry rmmc__ptrmap_find returned. */
void rmmc__ptrmap_remove(rmmc__ptrmap_t *m, rmmc__ptrmap_entry_t *e);

#endif /* RMMC_PTRMAP_H */
