/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sim resource: hands out address ranges of a simulated device, with no
 * memory behind them (sim_resource.h says why and what for).
 *
 * Addresses come from a bump pointer over [SIM_BASE, SIM_END), a range no
 * 64-bit Linux process maps. Open-addressing tables (linear probing,
 * backward-shift deletion, so no tombstones) keep the books: `live` maps
 * each live address to the bytes asked for it (to check deallocate), and
 * `spare` maps each rounded size to a stack of the freed addresses of that
 * size (nodes in one array, linked by index), which the next request of
 * that size takes back. Every key of a table is distinct, so probe runs
 * stay short: an earlier multimap keyed by size put every freed range of
 * one size in one probe cluster, which made free and reuse linear in the
 * number of spare ranges. A freed range at the top of the
 * bump region lowers the bump pointer instead. Every call is O(1) expected
 * under one mutex ("probes" counts the table slots visited, the work); the
 * memory itself is never touched.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sim_options.h"
#include "base/spec.h"
#include "rmmc/sim_resource.h"

_Static_assert(sizeof(uintptr_t) == 8, "the sim resource needs 64-bit pointers");

#define SIM_BASE ((uintptr_t)1 << 48)
#define SIM_END ((uintptr_t)1 << 63)
/* Scanned entries of one size before a request with a large alignment
 * gives up on reuse and takes fresh addresses. */
#define SIM_REUSE_SCAN 8

typedef struct sim_entry {
  uint64_t key; /* 0: empty */
  uint64_t val;
} sim_entry_t;

typedef struct sim_table {
  sim_entry_t *slots;
  size_t mask; /* capacity - 1 (capacity a power of two), 0 if unallocated */
  size_t count;
  uint64_t *probes; /* the owner's count of slots visited */
} sim_table_t;

/* A freed range waiting for reuse, on the stack of its rounded size. */
typedef struct sim_spare {
  uint64_t addr;
  size_t next; /* the next node of its stack, or SIM_NO_NODE */
} sim_spare_t;

#define SIM_NO_NODE SIZE_MAX

typedef struct sim_resource {
  rmmc_resource_t base;
  pthread_mutex_t lock;
  size_t capacity;    /* 0: unlimited */
  size_t granularity; /* power of two >= 256 */
  uintptr_t bump;     /* next fresh address */
  uint64_t in_use;    /* rounded bytes live */
  uint64_t peak;
  sim_table_t live;  /* address -> bytes asked */
  sim_table_t spare; /* rounded size -> top node of its stack of freed ranges */
  sim_table_t vas;   /* virtual memory: reservation address -> bytes */
  sim_table_t maps;  /* virtual memory: mapped range address -> bytes */
  sim_spare_t *nodes; /* the spare stacks' nodes */
  size_t nnodes, cap_nodes;
  size_t free_node; /* unused nodes, linked through next, or SIM_NO_NODE */
  uint64_t address_reserved;
  uint64_t probes;
} sim_resource_t;

/* The simulated device's virtual memory page, as a GPU's. */
#define SIM_VM_PAGE ((size_t)2 << 20)

/* ---- tables ---- */

static size_t table_hash(uint64_t key, size_t mask) {
  key ^= key >> 29;
  key *= UINT64_C(0xbf58476d1ce4e5b9);
  key ^= key >> 32;
  return (size_t)key & mask;
}

/* Makes room for one more entry (load kept at or below one half). */
static bool table_reserve(sim_table_t *t) {
  if (t->mask != 0 && (t->count + 1) * 2 <= t->mask + 1) return true;
  size_t cap = t->mask == 0 ? 64 : (t->mask + 1) * 2;
  sim_entry_t *slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return false;
  for (size_t i = 0; t->mask != 0 && i <= t->mask; i++) {
    if (t->slots[i].key == 0) continue;
    size_t j = table_hash(t->slots[i].key, cap - 1);
    while (slots[j].key != 0) j = (j + 1) & (cap - 1);
    slots[j] = t->slots[i];
  }
  free(t->slots);
  t->slots = slots;
  t->mask = cap - 1;
  return true;
}

/* Inserts after table_reserve() succeeded. */
static void table_insert(sim_table_t *t, uint64_t key, uint64_t val) {
  size_t i = table_hash(key, t->mask);
  uint64_t n = 1;
  for (; t->slots[i].key != 0; n++) i = (i + 1) & t->mask;
  *t->probes += n;
  t->slots[i].key = key;
  t->slots[i].val = val;
  t->count++;
}

/* Removes slot i, shifting later entries of its cluster back so that
 * every entry stays reachable from its home slot. */
static void table_remove_at(sim_table_t *t, size_t i) {
  size_t j = i;
  for (;;) {
    j = (j + 1) & t->mask;
    ++*t->probes;
    if (t->slots[j].key == 0) break;
    size_t home = table_hash(t->slots[j].key, t->mask);
    /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
    bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      t->slots[i] = t->slots[j];
      i = j;
    }
  }
  t->slots[i].key = 0;
  t->count--;
}

/* The slot of `key`, or SIZE_MAX. */
static size_t table_find(const sim_table_t *t, uint64_t key) {
  if (t->mask == 0) return SIZE_MAX;
  for (size_t i = table_hash(key, t->mask);; i = (i + 1) & t->mask) {
    ++*t->probes;
    if (t->slots[i].key == key) return i;
    if (t->slots[i].key == 0) return SIZE_MAX;
  }
}

/* Removes the entry (key, val); false if key is absent or holds another
 * value. */
static bool table_take(sim_table_t *t, uint64_t key, uint64_t val) {
  size_t slot = table_find(t, key);
  if (slot == SIZE_MAX || t->slots[slot].val != val) return false;
  table_remove_at(t, slot);
  return true;
}

/* ---- spare ranges: a stack per rounded size ---- */

/* Makes sure the next spare_push() needs no host memory. */
static bool spare_reserve(sim_resource_t *s) {
  if (!table_reserve(&s->spare)) return false;
  if (s->free_node != SIM_NO_NODE || s->nnodes < s->cap_nodes) return true;
  size_t cap = s->cap_nodes ? s->cap_nodes * 2 : 64;
  sim_spare_t *n = realloc(s->nodes, cap * sizeof *n);
  if (n == NULL) return false;
  s->nodes = n;
  s->cap_nodes = cap;
  return true;
}

/* Keeps the freed range at addr for the next request of `rounded` bytes
 * (after spare_reserve()). */
static void spare_push(sim_resource_t *s, uint64_t rounded, uint64_t addr) {
  size_t node = s->free_node;
  if (node != SIM_NO_NODE) s->free_node = s->nodes[node].next;
  else node = s->nnodes++;
  size_t slot = table_find(&s->spare, rounded);
  s->nodes[node].addr = addr;
  s->nodes[node].next = slot != SIZE_MAX ? (size_t)s->spare.slots[slot].val : SIM_NO_NODE;
  if (slot != SIZE_MAX) s->spare.slots[slot].val = node;
  else table_insert(&s->spare, rounded, node);
}

/* Takes a kept range of `rounded` bytes starting at a multiple of align:
 * the most recently freed one, or (large alignments) one of the first
 * SIM_REUSE_SCAN of its stack. 0 if there is none. */
static uint64_t spare_pop(sim_resource_t *s, uint64_t rounded, uint64_t align) {
  size_t slot = table_find(&s->spare, rounded);
  if (slot == SIZE_MAX) return 0;
  size_t *link = NULL, node = (size_t)s->spare.slots[slot].val;
  for (int scan = 0; (s->nodes[node].addr & (align - 1)) != 0; scan++) {
    link = &s->nodes[node].next;
    node = *link;
    if (node == SIM_NO_NODE || scan + 1 == SIM_REUSE_SCAN) return 0;
  }
  size_t next = s->nodes[node].next;
  if (link != NULL) *link = next;
  else if (next != SIM_NO_NODE) s->spare.slots[slot].val = next;
  else table_remove_at(&s->spare, slot);
  s->nodes[node].next = s->free_node;
  s->free_node = node;
  return s->nodes[node].addr;
}

/* ---- the resource ---- */

static rmmc_status_t sim_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                  cudaStream_t stream, void **out) {
  sim_resource_t *s = (sim_resource_t *)r;
  size_t rounded;
  if (!rmmc__align_up_checked(bytes, s->granularity, &rounded))
    return rmmc_set_oom_error(r, bytes, stream, "larger than the simulated address space");
  uintptr_t align = alignment > s->granularity ? alignment : s->granularity;
  char a[32], b[32];
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  if (s->capacity != 0 && rounded > s->capacity - s->in_use) {
    st = rmmc_set_oom_error(r, bytes, stream, "simulated capacity %s, %s in use",
                            rmmc__format_bytes(s->capacity, a, sizeof a),
                            rmmc__format_bytes(s->in_use, b, sizeof b));
    goto unlock;
  }
  if (!table_reserve(&s->live)) {
    st = rmmc_set_oom_error(r, bytes, stream, "no host memory for the simulator's bookkeeping");
    goto unlock;
  }
  uintptr_t addr = (uintptr_t)spare_pop(s, rounded, align);
  if (addr == 0) {
    addr = rmmc__align_up(s->bump, align);
    if (addr < s->bump || addr >= SIM_END || SIM_END - addr < rounded) {
      st = rmmc_set_oom_error(r, bytes, stream, "simulated address space exhausted");
      goto unlock;
    }
    s->bump = addr + rounded;
  }
  table_insert(&s->live, addr, bytes);
  s->in_use += rounded;
  if (s->in_use > s->peak) s->peak = s->in_use;
  *out = (void *)addr;
unlock:
  pthread_mutex_unlock(&s->lock);
  return st;
}

static rmmc_status_t sim_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                    size_t alignment, cudaStream_t stream) {
  (void)alignment, (void)stream;
  sim_resource_t *s = (sim_resource_t *)r;
  uintptr_t addr = (uintptr_t)ptr;
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  size_t slot = table_find(&s->live, addr);
  if (slot == SIZE_MAX) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "sim: %p is not a live allocation of this resource", ptr);
    goto unlock;
  }
  size_t asked = (size_t)s->live.slots[slot].val;
  if (asked != bytes) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "sim: %p was allocated with %zu bytes, freed with %zu", ptr, asked,
                        bytes);
    goto unlock;
  }
  size_t rounded = rmmc__align_up(bytes, s->granularity);
  table_remove_at(&s->live, slot);
  s->in_use -= rounded;
  if (addr + rounded == s->bump)
    s->bump = addr;
  else if (spare_reserve(s))
    spare_push(s, rounded, addr);
  /* else: no host memory to remember the range; only address space is lost. */
unlock:
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* ---- virtual memory: reservations come from the bump pointer too; a
 * mapped range counts as in use, against the capacity ---- */

static size_t sim_vm_page_size(const rmmc_resource_t *r) {
  const sim_resource_t *s = (const sim_resource_t *)r;
  return s->granularity > SIM_VM_PAGE ? s->granularity : SIM_VM_PAGE;
}

static rmmc_status_t sim_vm_reserve(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                    void **out) {
  sim_resource_t *s = (sim_resource_t *)r;
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  uintptr_t addr = rmmc__align_up(s->bump, alignment);
  if (addr < s->bump || addr >= SIM_END || SIM_END - addr < bytes)
    st = rmmc_set_oom_error(r, bytes, NULL, "simulated address space exhausted");
  else if (!table_reserve(&s->vas))
    st = rmmc_set_oom_error(r, bytes, NULL, "no host memory for the simulator's bookkeeping");
  if (st == RMMC_SUCCESS) {
    s->bump = addr + bytes;
    table_insert(&s->vas, addr, bytes);
    s->address_reserved += bytes;
    *out = (void *)addr;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static rmmc_status_t sim_vm_unreserve(rmmc_resource_t *r, void *ptr, size_t bytes) {
  sim_resource_t *s = (sim_resource_t *)r;
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  if (!table_take(&s->vas, (uintptr_t)ptr, bytes)) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "sim: %p + %zu bytes is not a reservation of this resource", ptr, bytes);
  } else {
    s->address_reserved -= bytes;
    if ((uintptr_t)ptr + bytes == s->bump) s->bump = (uintptr_t)ptr;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static rmmc_status_t sim_vm_map(rmmc_resource_t *r, void *ptr, size_t bytes) {
  sim_resource_t *s = (sim_resource_t *)r;
  char a[32], b[32];
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  if (s->capacity != 0 && bytes > s->capacity - s->in_use)
    st = rmmc_set_oom_error(r, bytes, NULL, "simulated capacity %s, %s in use",
                            rmmc__format_bytes(s->capacity, a, sizeof a),
                            rmmc__format_bytes(s->in_use, b, sizeof b));
  else if (table_find(&s->maps, (uintptr_t)ptr) != SIZE_MAX)
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "sim: %p is mapped already", ptr);
  else if (!table_reserve(&s->maps))
    st = rmmc_set_oom_error(r, bytes, NULL, "no host memory for the simulator's bookkeeping");
  if (st == RMMC_SUCCESS) {
    table_insert(&s->maps, (uintptr_t)ptr, bytes);
    s->in_use += bytes;
    if (s->in_use > s->peak) s->peak = s->in_use;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static rmmc_status_t sim_vm_unmap(rmmc_resource_t *r, void *ptr, size_t bytes) {
  sim_resource_t *s = (sim_resource_t *)r;
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&s->lock);
  if (!table_take(&s->maps, (uintptr_t)ptr, bytes)) {
    st = rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                        "sim: %p + %zu bytes is not a mapped range of this resource", ptr, bytes);
  } else {
    s->in_use -= bytes;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static void sim_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  sim_resource_t *s = (sim_resource_t *)r;
  struct {
    RMMC_SIM_FIGURES(RMMC__FIGURE_VALUE)
    RMMC_SIM_VM_FIGURES(RMMC__FIGURE_VALUE)
  } v = {.limit = s->capacity, .granularity = s->granularity};
  pthread_mutex_lock(&s->lock);
  v.reserved = v.in_use = s->in_use, v.peak = s->peak, v.outstanding = s->live.count;
  v.span = s->bump - SIM_BASE, v.probes = s->probes;
  v.address_reserved = s->address_reserved, v.mapped_ranges = s->maps.count;
  pthread_mutex_unlock(&s->lock);
  RMMC_SIM_FIGURES(RMMC__FIGURE_EMIT)
  if (v.address_reserved > 0) {
    RMMC_SIM_VM_FIGURES(RMMC__FIGURE_EMIT)
  }
}

static void sim_destroy(rmmc_resource_t *r) {
  sim_resource_t *s = (sim_resource_t *)r;
  pthread_mutex_destroy(&s->lock);
  free(s->live.slots);
  free(s->spare.slots);
  free(s->vas.slots);
  free(s->maps.slots);
  free(s->nodes);
  free(s);
}

static const rmmc_resource_ops_t sim_ops = {
    .version = RMMC_RESOURCE_OPS_VERSION,
    .name = "sim",
    .allocate = sim_allocate,
    .deallocate = sim_deallocate,
    .describe = sim_describe,
    .destroy = sim_destroy,
    .vm_page_size = sim_vm_page_size,
    .vm_reserve = sim_vm_reserve,
    .vm_unreserve = sim_vm_unreserve,
    .vm_map = sim_vm_map,
    .vm_unmap = sim_vm_unmap,
};

RMMC_API rmmc_status_t rmmc_sim_resource_create(const rmmc_sim_options_t *options,
                                                rmmc_resource_t **out) {
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "sim_resource_create: out is NULL");
  *out = NULL;
  rmmc_sim_options_t opts = RMMC_SIM_OPTIONS_INIT;
  rmmc_status_t st;
  RMMC__TAKE_OPTIONS(st, "sim_resource_create", &opts, options, RMMC_SIM_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  if (opts.alignment == 0) opts.alignment = RMMC_DEFAULT_ALIGNMENT;
  if (!rmmc__is_pow2(opts.alignment) || opts.alignment < RMMC_DEFAULT_ALIGNMENT)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "sim_resource_create: alignment %zu is not a power of two of at "
                          "least 256",
                          opts.alignment);
  sim_resource_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "sim_resource_create: no host memory");
  if (pthread_mutex_init(&s->lock, NULL) != 0) {
    free(s);
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "sim_resource_create: pthread_mutex_init failed");
  }
  rmmc_resource_init(&s->base, &sim_ops, RMMC_MEMORY_HOST, -1);
  s->capacity = opts.capacity;
  s->granularity = opts.alignment;
  s->bump = SIM_BASE;
  s->free_node = SIM_NO_NODE;
  s->live.probes = s->spare.probes = s->vas.probes = s->maps.probes = &s->probes;
  *out = &s->base;
  return RMMC_SUCCESS;
}

#define SIM_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_sim_options_t, __VA_ARGS__)
static const rmmc__spec_option_t sim_spec_options[] = {
    RMMC__SIM_OPTIONS(SIM_SPEC_ROW){.name = NULL},
};
#undef SIM_SPEC_ROW

static rmmc_status_t sim_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                               int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_sim_options_t opts = RMMC_SIM_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, sim_spec_options, upstream, &opts);
  return st == RMMC_SUCCESS ? rmmc_sim_resource_create(&opts, out) : st;
}

const rmmc__spec_entry_t rmmc__sim_spec = {
    .name = "sim",
    .help = "simulated device: address ranges with no memory behind them (never dereference)",
    .options = sim_spec_options,
    .build = sim_build,
};
