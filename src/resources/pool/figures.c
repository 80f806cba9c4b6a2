/* SPDX-License-Identifier: Apache-2.0 */
/* The pool core's figures (describe, rmmc_pool_resource_figures) and the
 * invariants of rmmc_pool_resource_check and debug_checks=2. */
#include "core.h"

static rmmc_status_t not_a_pool(const char *what, const rmmc_resource_t *r) {
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s is not a pool", what,
                        r == NULL ? "NULL" : r->ops->name);
}

/* Every figure of RMMC_POOL_FIGURES as a value (TEXT: a string), read
 * together under every lock by gather. */
#define VALUE_TYPE_BYTES size_t
#define VALUE_TYPE_COUNT uint64_t
#define VALUE_TYPE_TEXT const char *
#define VALUE_MEMBER(kind, name, where, doc) VALUE_TYPE_##kind name;
typedef struct values {
  RMMC_POOL_FIGURES(VALUE_MEMBER)
  char band[16], peers_text[200]; /* what the TEXT members point to */
} values_t;
#undef VALUE_MEMBER

/* A row's part, by its `where`, in gather and the struct's copy (describe
 * takes base/figures.h's): read from the streams' figures (S), copied into
 * rmmc_pool_figures_t (C). */
#define ROLE_BOTH(S, C) C
#define ROLE_DESCRIBE(S, C)
#define ROLE_DESCRIBE_IF_SET(S, C)
#define ROLE_STRUCT(S, C) S C
#define READ_ROW(kind, name, where, doc)                                                           \
  ROLE_##where(v->name = rmmc__stream_set_##name(&p->streams);, )
#define SAME(name) v->name = p->name;

static void gather(pool_t *p, values_t *v) {
  *v = (values_t){0};
  rmmc__pool_lock_all(p);
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next) {
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext)
      v->in_use += x->in_use, v->cached += heap_cached_bytes(x), v->spans += x->nspans;
    v->pending += q->idx->bytes;
    size_t l = rmmc__tlsf_largest(q->idx);
    if (l > v->largest_free) v->largest_free = l;
  }
  size_t l = rmmc__tlsf_largest(&p->clean);
  if (l > v->largest_free) v->largest_free = l;
  v->in_use += p->committed - p->span_bytes;
  v->reserved = pool_held(p);
  v->free = v->reserved > v->in_use ? v->reserved - v->in_use : 0;
  v->peak = p->committed_peak;
  v->maximum_size = p->maximum_size != SIZE_MAX ? p->maximum_size : 0; /* 0: none, not reported */
  v->regions = p->nregions;
  v->heaps = p->nheaps;
  SAME(reserved_peak) SAME(small_max) SAME(small_chunk) SAME(cache_size)
  SAME(heaps_retired) SAME(grows) SAME(shrinks) SAME(adoptions)
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next)
    v->graph_pools++, v->graph_bytes += g->used_bytes + g->idx->bytes;
  snprintf(v->band, sizeof v->band, "%.1f", p->band); /* rmmc__pool_admit's band */
  v->release_band = v->band;
  if (p->peers != 0) rmmc__pool_peers_text(p->peers, v->peers_text, sizeof v->peers_text);
  v->peers = v->peers_text;
  RMMC_POOL_FIGURES(READ_ROW)
  rmmc__pool_unlock_all(p);
}

/* describe's rows (base/figures.h): each row's key is its name; STRUCT
 * rows come with the streams' figures (rmmc__stream_set_describe). */
void rmmc__pool_describe(rmmc_resource_t *r, rmmc_field_cb emit, void *ctx) {
  pool_t *p = (pool_t *)r;
  values_t v;
  gather(p, &v);
  RMMC_POOL_FIGURES(RMMC__FIGURE_EMIT)
  rmmc__stream_set_describe(&p->streams, emit, ctx);
  p->be->describe(p, emit, ctx);
  if (p->sleep != NULL) p->sleep->describe(p, emit, ctx);
  rmmc__pool_lock_all(p);
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next) { /* one line per stream */
    size_t in_use = 0, cached = 0, nheaps = 0;
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext)
      in_use += x->in_use, cached += heap_cached_bytes(x), nheaps++;
    char name[40], a[32], b[32], c[32], line[200];
    snprintf(line, sizeof line, "%s in_use=%s cached=%s pending=%s heaps=%zu",
             rmmc__stream_name(q->slot->stream, name, sizeof name),
             rmmc__format_bytes(in_use, a, sizeof a), rmmc__format_bytes(cached, b, sizeof b),
             rmmc__format_bytes(q->idx->bytes, c, sizeof c), nheaps);
    rmmc__emit_text(emit, ctx, "stream", line);
  }
  rmmc__pool_unlock_all(p);
}

#define COPY_ROW(kind, name, where, doc) ROLE_##where(, f.name = v.name;)

RMMC_API rmmc_status_t rmmc_pool_resource_figures(rmmc_resource_t *pool,
                                                  rmmc_pool_figures_t *figures) {
  if (!is_pool(pool)) return not_a_pool("pool_resource_figures", pool);
  if (figures == NULL || figures->size < sizeof(size_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_resource_figures: figures must be set with RMMC_POOL_FIGURES_INIT");
  values_t v;
  gather((pool_t *)pool, &v);
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  RMMC_POOL_FIGURES(COPY_ROW)
  size_t n = figures->size < sizeof f ? figures->size : sizeof f;
  memcpy(figures, &f, n);
  figures->size = n;
  return RMMC_SUCCESS;
}

/* ---- invariants ---- */

#define CHECK POOL_WALK_CHECK
/* b, after prev, begins at `at` in r (a region or a span), granule-aligned and sized. */
#define CHECK_TILE(b, prev, at, r, what)                                                           \
  CHECK(b->addr == at && b->prev == prev && b->region == r, what " %p: blocks do not tile it",     \
        (void *)r->base);                                                                          \
  CHECK(pool_bsize(b) > 0 && pool_bsize(b) % POOL_GRANULE == 0 && b->addr % POOL_GRANULE == 0,     \
        "block %p has size %zu", (void *)b->addr, pool_bsize(b))

static bool check_heap(pool_t *p, pool_sheap_t *h, char *msg, size_t len) {
  size_t free_bytes = 0, nfree = 0, used = 0, nused = 0, idle = 0, foreign = 0;
  for (pool_region_t *sp = h->spans; sp != NULL; sp = sp->next) {
    CHECK(sp->heap == h && sp->parent != NULL && sp->parent->state == B_SPAN &&
              sp->parent->addr == sp->base && pool_bsize(sp->parent) == sp->size,
          "span %p does not match its shared block", (void *)sp->base);
    CHECK(sp->base % p->small_chunk == 0, "span %p is not aligned to %zu", (void *)sp->base,
          p->small_chunk);
    uintptr_t at = sp->base;
    size_t in_span = 0;
    for (pool_block_t *b = sp->first, *prev = NULL; b != NULL; prev = b, b = b->next) {
      CHECK_TILE(b, prev, at, sp, "span");
      if (b->state == B_FREE) {
        CHECK(b->where == W_INDEX || (b->where == W_HOT && h->hot == b), "free block %p is lost",
              (void *)b->addr);
        CHECK(prev == NULL || prev->state != B_FREE || b == h->hot || prev == h->hot,
              "adjacent free blocks at %p", (void *)b->addr);
        free_bytes += pool_bsize(b), nfree += b->where == W_INDEX;
      } else if (b->state == B_USED) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&h->used, (void *)b->addr);
        CHECK(e != NULL && e->value == b, "used block %p is not in its heap's map", (void *)b->addr);
        used += pool_bsize(b), nused++, in_span++;
      } else {
        CHECK(b->state == B_FOREIGN, "block %p of a span has state %d", (void *)b->addr, b->state);
        foreign++, in_span++;
      }
      at += pool_bsize(b);
    }
    CHECK(at == sp->base + sp->size, "span %p: blocks do not tile it", (void *)sp->base);
    CHECK(sp->nused == in_span, "span %p counts %zu used, holds %zu", (void *)sp->base, sp->nused,
          in_span);
    idle += sp->nused == 0;
  }
  CHECK(rmmc__tlsf_valid(&h->idx), "a stream heap's index is inconsistent");
  CHECK(h->idx.count == nfree, "a stream heap's index holds %zu blocks, its spans %zu free",
        h->idx.count, nfree);
  CHECK(h->idx.bytes + (h->hot != NULL ? pool_bsize(h->hot) : 0) == free_bytes,
        "a stream heap's free bytes do not add up");
  CHECK(h->used.count == nused && h->in_use == used, "a stream heap's used blocks do not add up");
  CHECK(h->nidle == idle, "a stream heap counts %zu idle spans, holds %zu", h->nidle, idle);
  CHECK(h->nforeign == foreign, "a stream heap counts %zu foreign frees, holds %zu", h->nforeign,
        foreign);
  return true;
}

/* Owner q's index and its list agree; counts what it indexes. */
static bool check_owner(const pool_owner_t *q, const char *who, size_t *indexed,
                        size_t *indexed_bytes, char *msg, size_t len) {
  CHECK(rmmc__tlsf_valid(q->idx), "%s's index is inconsistent", who);
  size_t listed = 0;
  for (pool_block_t *b = q->qhead; b != NULL; b = b->qnext, listed++)
    CHECK(b->owner == q && b->where == W_INDEX, "%s's list holds a stranger", who);
  CHECK(listed == q->idx->count, "%s's list and index differ", who);
  *indexed += q->idx->count;
  *indexed_bytes += q->idx->bytes;
  return true;
}

bool rmmc__pool_check_locked(pool_t *p, char *msg, size_t len) {
  size_t nfree = 0, free_bytes = 0, committed = 0, spans = 0, nused = 0, heaps = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) {
    uintptr_t at = r->base;
    for (pool_block_t *b = r->first, *prev = NULL; b != NULL; prev = b, b = b->next) {
      CHECK_TILE(b, prev, at, r, "region");
      if (b->state == B_FREE) {
        CHECK(b->where == W_INDEX, "free block %p is in no index", (void *)b->addr);
        CHECK(prev == NULL || prev->state != B_FREE ||
                  (prev->owner != b->owner &&
                   ((prev->owner != NULL && b->owner != NULL) ||
                    (prev->owner != NULL && prev->owner->slot == NULL) ||
                    (b->owner != NULL && b->owner->slot == NULL))),
              "free blocks at %p (owner %p tag %llu) and %p (owner %p tag %llu) should have merged",
              (void *)prev->addr, (void *)prev->owner, (unsigned long long)prev->tag,
              (void *)b->addr, (void *)b->owner, (unsigned long long)b->tag);
        nfree++, free_bytes += pool_bsize(b);
      } else if (b->state == B_USED) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->used, (void *)b->addr);
        CHECK(e != NULL && e->value == b, "used block %p is not in the map", (void *)b->addr);
        committed += pool_bsize(b), nused++;
      } else if (b->state == B_SPAN) {
        rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->spans, (void *)b->addr);
        CHECK(e != NULL && ((pool_region_t *)e->value)->parent == b, "span %p is not in the map",
              (void *)b->addr);
        committed += pool_bsize(b), spans++;
      } else {
        CHECK(b->state == B_UNMAPPED && p->be == &rmmc__pool_vm, "block %p has state %d",
              (void *)b->addr, b->state);
      }
      at += pool_bsize(b);
    }
    CHECK(at == r->base + r->size, "region %p: blocks do not tile it", (void *)r->base);
  }
  size_t indexed = p->clean.count, indexed_bytes = p->clean.bytes;
  CHECK(rmmc__tlsf_valid(&p->clean), "the clean index is inconsistent");
  size_t owners = 0;
  for (pool_owner_t *q = p->owners; q != NULL; q = q->next, owners++) {
    CHECK(q->idx != NULL, "a listed stream has no index");
    CHECK(q->heap != NULL || q->pending, "a stream with neither a heap nor free blocks is listed");
    if (!check_owner(q, "a stream", &indexed, &indexed_bytes, msg, len)) return false;
    size_t nheaps = 0;
    for (pool_sheap_t *x = q->heap; x != NULL; x = x->onext, nheaps++) {
      CHECK(x->owner == q && x->stripe < p->stream_heaps, "a heap is listed under another stream");
      for (pool_sheap_t *y = x->onext; y != NULL; y = y->onext)
        CHECK(y->stripe != x->stripe, "a stream has two heaps of stripe %u", x->stripe);
      if (!check_heap(p, x, msg, len)) return false;
    }
    CHECK(q->listed && q->slot != NULL, "an unlisted stream on the list of owners");
    heaps += nheaps;
  }
  size_t live = 0;
  for (pool_sheap_t *x = p->heaps; x != NULL; x = x->hnext, live++)
    CHECK(x->owner != NULL && x->owner->listed && (x->hnext == NULL ? p->heaps_tail == x
                                                                    : x->hnext->hprev == x),
          "the list of heaps holds a retired heap or is broken");
  CHECK(live == p->nheaps, "%zu heaps on the pool's list, %zu made", live, p->nheaps);
  for (pool_sheap_t *x = p->spare_heaps; x != NULL; x = x->onext)
    CHECK(x->owner == NULL && x->nspans == 0 && x->used.count == 0 && x->idx.count == 0,
          "a retired heap holds memory");
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next) {
    CHECK(g->slot == NULL, "a graph pool has a stream");
    if (!check_owner(g, "a graph pool", &indexed, &indexed_bytes, msg, len)) return false;
  }
  CHECK(heaps == p->nheaps, "%zu heaps listed, %zu made", heaps, p->nheaps);
  CHECK(owners == p->nowners, "%zu streams listed, %zu counted", owners, p->nowners);
  for (pool_owner_t *q = p->pending; q != NULL; q = q->pnext)
    CHECK(q->listed && q->pending, "a pending stream is not listed");
  CHECK(indexed == nfree && indexed_bytes == free_bytes && free_bytes == p->free_bytes,
        "indices hold %zu blocks (%zu bytes), the regions %zu free (%zu bytes)", indexed,
        indexed_bytes, nfree, free_bytes);
  CHECK(committed == p->committed, "committed %zu, blocks add up to %zu", p->committed,
        committed);
  CHECK(nused == p->used.count && spans == p->spans.count, "maps and blocks differ");
  CHECK(spans * p->small_chunk == p->span_bytes, "span bytes do not add up");
  CHECK(p->reserved <= p->maximum_size, "reserved %zu above the maximum %zu", p->reserved,
        p->maximum_size);
  CHECK(p->reserved_peak >= p->reserved && p->committed_peak >= p->committed, "peaks below current");
  return p->be->check(p, msg, len);
}

#undef CHECK

static bool check_all(pool_t *p, char msg[512]) {
  rmmc__pool_lock_all(p);
  bool ok = rmmc__pool_check_locked(p, msg, 512);
  rmmc__pool_unlock_all(p);
  return ok;
}

RMMC_API rmmc_status_t rmmc_pool_resource_check(rmmc_resource_t *pool) {
  if (!is_pool(pool)) return not_a_pool("pool_resource_check", pool);
  char msg[512];
  bool ok = check_all((pool_t *)pool, msg);
  return ok ? RMMC_SUCCESS : rmmc_set_error(RMMC_ERROR_INTERNAL, "pool invariant broken: %s", msg);
}

#if RMMC_DEBUG_CHECKS >= 2
rmmc_status_t rmmc__pool_expensive_check(pool_t *p, rmmc_status_t st, const char *where) {
  char msg[512];
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  if (!check_all(p, msg)) {
    fprintf(stderr, "rmmc: pool invariant broken after %s: %s\n", where, msg);
    abort();
  }
  rmmc__error_restore(&saved);
  return st;
}
#endif
