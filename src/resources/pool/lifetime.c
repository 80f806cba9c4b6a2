/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's lifetime (core.h): locking every heap, release_cached,
 * destroy, the options checked and resolved, the backend chosen, create.
 */
#include "core.h"

static uint64_t next_pool_id;

/* Locks every live heap, then the shared heap: heap locks come first, so
 * the heaps are listed, locked, and listed again under the shared lock
 * until none was made, retired or reused meanwhile (heaps_gen). One pass
 * at a time (snap_lock, held until unlock_all) owns the heaps' snext. */
void rmmc__pool_lock_all(pool_t *p) {
  pthread_mutex_lock(&p->snap_lock);
  for (;;) {
    rmmc__lock(&p->lock);
    uint64_t gen = p->heaps_gen;
    rmmc__unlock(&p->lock);
    pool_sheap_t *first = rmmc__pool_heaps_snapshot(p);
    for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__lock(&x->lock);
    rmmc__lock(&p->lock);
    if (p->heaps_gen == gen) {
      p->snap_first = first;
      return;
    }
    rmmc__unlock(&p->lock);
    for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__unlock(&x->lock);
  }
}

void rmmc__pool_unlock_all(pool_t *p) {
  pool_sheap_t *first = p->snap_first;
  rmmc__unlock(&p->lock);
  for (pool_sheap_t *x = first; x != NULL; x = x->snext) rmmc__unlock(&x->lock);
  pthread_mutex_unlock(&p->snap_lock);
}

rmmc_status_t rmmc__pool_release_cached(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  /* An explicit call: the device may be synchronized (unless a known
   * capture is underway), after which every free is finished. */
  rmmc_status_t st = rmmc__stream_set_sync(&p->streams);
  if (st != RMMC_SUCCESS && st != RMMC_ERROR_NOT_SUPPORTED) return st;
  pthread_mutex_lock(&p->snap_lock);
  for (pool_sheap_t *x = rmmc__pool_heaps_snapshot(p); x != NULL; x = x->snext) {
    rmmc__lock(&x->lock);
    if (x->owner != NULL) { /* not retired meanwhile */
      (void)rmmc__pool_retire_foreign(p, x, NULL, false);
      rmmc__lock(&p->lock);
      (void)rmmc__pool_heap_release_idle(p, x, 0, NULL, false);
      rmmc__unlock(&p->lock);
    }
    rmmc__unlock(&x->lock);
  }
  pthread_mutex_unlock(&p->snap_lock);
  rmmc__lock(&p->lock);
  if (st == RMMC_SUCCESS) rmmc__pool_graph_drain(p);
  rmmc__pool_consolidate(p, true);
  st = p->be->trim(p, 0);
  rmmc__unlock(&p->lock);
  if (p->sleep != NULL) p->sleep->drop(p, false);
  st = POOL_EXPENSIVE(p, st, "release_cached");
  return st == RMMC_SUCCESS ? rmmc_resource_release_cached(p->base.upstream) : st;
}

void rmmc__pool_destroy(rmmc_resource_t *r) {
  pool_t *p = (pool_t *)r;
  if (p->cuda && p->regions != NULL) (void)rmmc__stream_set_sync(&p->streams);
  if (p->be != NULL) p->be->fini(p);
  if (p->sleep != NULL) p->sleep->drop(p, true);
  if (p->paused) rmmc__pool_count_route(p, -1); /* destroyed while paused: the process count stays true */
  if (p->below != NULL) __atomic_sub_fetch(&p->below->pools_above, 1, __ATOMIC_RELAXED);
  for (int spare = 0; spare < 2; spare++)
    for (pool_sheap_t *x = spare ? p->spare_heaps : p->heaps, *xnext; x != NULL; x = xnext) {
      xnext = spare ? x->onext : x->hnext;
      for (pool_region_t *sp = x->spans, *next; sp != NULL; sp = next) {
        next = sp->next;
        free(sp);
      }
      rmmc__pool_meta_fini(&x->meta);
      rmmc__ptrmap_fini(&x->used);
      free(x);
    }
  for (pool_owner_t *g = p->graphs, *next; g != NULL; g = next) {
    next = g->next;
    if (g->begun > 0) { /* destroyed while routed: the process counts stay true */
      if (g->route_key == NULL) __atomic_sub_fetch(&rmmc__captures_underway, 1, __ATOMIC_RELAXED);
      rmmc__pool_count_route(p, -1);
    }
    free(g->idx);
    free(g);
  }
  for (uint32_t i = 0; i < rmmc__stream_set_count(&p->streams); i++)
    free(((pool_owner_t *)rmmc__stream_slot_user(rmmc__stream_set_at(&p->streams, i)))->idx);
  rmmc__pool_meta_fini(&p->meta);
  rmmc__ptrmap_fini(&p->used);
  rmmc__ptrmap_fini(&p->spans);
  rmmc__stream_set_fini(&p->streams);
  pthread_mutex_destroy(&p->snap_lock);
  rmmc__adaptor_fini(&p->base);
  free(p);
}

/* Checks the options and resolves them into p: the rules no range of
 * RMMC_POOL_OPTIONS says (powers of two, one option against another, the
 * values meaning "off" or "default" outside a range). */
static rmmc_status_t apply_options(pool_t *p, const rmmc_pool_options_t *o) {
  const char *bad = NULL;
  if (!rmmc__is_pow2(o->growth_granularity))
    bad = "growth_granularity must be a power of two";
  else if (!rmmc__is_pow2(o->small_chunk) ||
           rmmc__align_up(o->small_max, POOL_GRANULE) > o->small_chunk)
    bad = "small_chunk must be a power of two and at least small_max";
  else if (o->split_limit > 0.0 && o->split_limit < 1.0)
    bad = "split_limit must be 0 (off) or at least 1";
  else if (o->min_growth != RMMC_POOL_MIN_GROWTH_DEFAULT && o->min_growth > POOL_MAX_REQUEST)
    bad = "min_growth must be at most 128 TiB (or RMMC_POOL_MIN_GROWTH_DEFAULT)";
  else if (o->checkpoint_every != 0 &&
           (o->checkpoint_every < 2 || !rmmc__is_pow2(o->checkpoint_every)))
    bad = "checkpoint_every must be 0 (none) or a power of two from 2 to 65536";
  if (bad != NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_resource_create: %s", bad);
  p->maximum_size = o->maximum_size == 0 || o->maximum_size == SIZE_MAX
                    ? SIZE_MAX
                    : o->maximum_size & ~(POOL_GRANULE - 1);
  if (o->initial_size > p->maximum_size)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: initial_size %zu is above maximum_size %zu",
                          o->initial_size, p->maximum_size);
  p->granularity = o->growth_granularity;
  p->min_growth = o->min_growth;
  p->small_max = o->small_max > 0 ? rmmc__align_up(o->small_max, POOL_GRANULE) : 0;
  p->small_chunk = o->small_chunk;
  p->cache_size = o->cache_size;
  p->stream_heaps = o->stream_heaps;
  if (p->stream_heaps == 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->stream_heaps = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus;
  }
  p->release_before_grow = o->release_before_grow;
  p->sync_before_peak = o->sync_before_peak;
  /* Its waits go one checkpoint mark at a time (policy.c, grow_past_budget). */
  if (p->sync_before_peak && o->checkpoint_every > 0)
    rmmc__stream_set_marks(&p->streams, (uint32_t)__builtin_ctz(o->checkpoint_every));
  p->slack = o->release_slack;
  p->band_max = o->release_band;
  p->band = p->band_max < 3.0 ? p->band_max : 3.0;
  p->split_limit = o->split_limit;
  p->event_interval = o->event_interval;
  p->event_bytes = o->event_bytes;
  p->gc_limit = SIZE_MAX;
  if (o->gc_threshold > 0.0) {
    size_t basis = p->maximum_size, total = 0, unused;
    rmmc_memory_kind_t kind = p->base.base.kind;
    if (basis == SIZE_MAX && (kind == RMMC_MEMORY_DEVICE || kind == RMMC_MEMORY_MANAGED)) {
      rmmc_status_t st = rmmc_device_memory_info(p->base.base.device, &unused, &total);
      if (st != RMMC_SUCCESS) return st;
      basis = total;
    } else if (basis == SIZE_MAX) {
      basis = rmmc__host_memory_total();
      if (basis == 0)
        return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                              "pool_resource_create: gc_threshold needs the host memory size, "
                              "which is unknown: set maximum_size");
    }
    p->gc_limit = (size_t)((double)basis * o->gc_threshold);
  }
  return RMMC_SUCCESS;
}

/* The backends' defaults that the options' _INIT leaves to them
 * (RMMC_POOL_MIN_GROWTH_DEFAULT, page_size 0). */
#define CHUNKS_MIN_GROWTH ((size_t)32 << 20)
#define VM_MAPPING ((size_t)32 << 20)

/* Chooses the backend and sets its options. */
static rmmc_status_t choose_backend(pool_t *p, const rmmc_pool_options_t *o) {
  rmmc_resource_t *up = p->base.upstream;
  size_t up_page = rmmc_resource_vm_page_size(up);
  if (o->expandable == 1 && up_page == 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_resource_create: expandable needs an upstream with virtual "
                          "memory (cuda, host, sim); %s has none",
                          rmmc_resource_name(up));
  if (o->expandable == 0 || up_page == 0) {
    p->be = &rmmc__pool_chunks;
    if (p->min_growth == RMMC_POOL_MIN_GROWTH_DEFAULT) p->min_growth = CHUNKS_MIN_GROWTH;
    if (p->min_growth == 0) p->min_growth = p->granularity;
    p->min_growth = rmmc__align_up(p->min_growth, p->granularity);
    return RMMC_SUCCESS;
  }
  size_t seg = o->page_size != 0 ? o->page_size : VM_MAPPING < up_page ? up_page : VM_MAPPING;
  if (seg < up_page || seg % up_page != 0 || seg > ((size_t)1 << 40))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: page_size %zu must be a multiple of %s's page "
                          "(%zu) up to 1 TiB",
                          seg, rmmc_resource_name(up), up_page);
  size_t space = o->address_space;
  if (space == 0 && p->maximum_size != SIZE_MAX) space = p->maximum_size;
  if (space == 0) {
    size_t total = 0, unused;
    if (p->base.base.kind != RMMC_MEMORY_HOST) {
      rmmc_status_t st = rmmc_device_memory_info(p->base.base.device, &unused, &total);
      if (st != RMMC_SUCCESS) return st;
    } else {
      total = rmmc__host_memory_total();
    }
    space = total > 0 && total <= POOL_MAX_REQUEST / 2 ? 2 * total : (size_t)64 << 30;
  }
  if (space > POOL_MAX_REQUEST)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_create: address_space %zu is above 128 TiB", space);
  p->be = &rmmc__pool_vm;
  p->page = up_page;
  p->segment = seg;
  p->segment_scales = o->page_size == 0;
  size_t align = p->small_chunk > up_page ? p->small_chunk : up_page;
  p->address_space = rmmc__align_up(space, align);
  p->min_growth =
      o->min_growth == RMMC_POOL_MIN_GROWTH_DEFAULT ? 0 : rmmc__align_up(o->min_growth, up_page);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_pool_resource_create(rmmc_resource_t *upstream,
                                                 const rmmc_pool_options_t *options,
                                                 rmmc_resource_t **out) {
  return rmmc__pool_create(upstream, options, false, out);
}

rmmc_status_t rmmc__pool_create(rmmc_resource_t *upstream, const rmmc_pool_options_t *options,
                                bool arena, rmmc_resource_t **out) {
  rmmc_status_t st = rmmc__check_create("pool_resource_create", upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  RMMC__TAKE_OPTIONS(st, "pool_resource_create", &o, options, RMMC_POOL_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  pool_t *p = calloc(1, sizeof *p);
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "pool_resource_create: no host memory");
  rmmc__adaptor_init(&p->base, arena ? &rmmc__pool_arena_ops : &rmmc__pool_ops, upstream);
  p->id = __atomic_add_fetch(&next_pool_id, 1, __ATOMIC_RELAXED);
  p->cuda = upstream->kind != RMMC_MEMORY_HOST;
  rmmc__ptrmap_init(&p->used);
  rmmc__ptrmap_init(&p->spans);
  pthread_mutex_init(&p->snap_lock, NULL);
  rmmc__stream_set_init(&p->streams, upstream, sizeof(pool_owner_t));
  st = apply_options(p, &o);
  if (st == RMMC_SUCCESS) st = choose_backend(p, &o);
  if (st == RMMC_SUCCESS && (p->below = rmmc__pool_in(upstream)) != NULL) /* it may not pause now */
    __atomic_add_fetch(&p->below->pools_above, 1, __ATOMIC_RELAXED);
  if (st == RMMC_SUCCESS && !pool_meta_room(&p->meta)) st = rmmc__pool_no_host_memory();
  if (st == RMMC_SUCCESS && o.initial_size > 0) {
    pool_block_t *b; /* the initial size is what is asked for: not min_growth */
    st = p->be->grow(p, NULL, NULL, rmmc__align_up(o.initial_size, POOL_GRANULE), POOL_GRANULE,
                     POOL_GROW_EXACT, &b);
    if (st == RMMC_SUCCESS) {
      b->owner = NULL; /* ready for every stream (the backend made sure) */
      rmmc__pool_put_free(p, b);
    }
  }
  if (st == RMMC_SUCCESS) *out = &p->base.base;
  else rmmc__pool_destroy(&p->base.base);
  return st;
}

bool rmmc__pool_is_arena(const rmmc_resource_t *r) { return r != NULL && r->ops == &rmmc__pool_arena_ops; }
