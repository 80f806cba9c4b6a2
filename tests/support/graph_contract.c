/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The graph-pool contract (graph_contract.h). Streams are keys over host
 * memory: routing by stream is what a capture does on a GPU.
 */
#include "graph_contract.h"

#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool_util.h"
#include "rmmc/pool_resource.h"
#include "test_util.h"

#define S(n) ((cudaStream_t)(uintptr_t)(n))

typedef struct blk {
  unsigned char *p;
  size_t n;
  uint64_t when; /* a ticket: when it was got (or asked for) */
} blk_t;

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static int overlaps_any(const void *p, size_t n, const blk_t *g, int ng) {
  for (int i = 0; i < ng; i++)
    if (overlaps(p, n, g[i].p, g[i].n)) return i;
  return -1;
}

static void fill(blk_t *b, unsigned seed) {
  size_t step = b->n / 61 + 1;
  for (size_t i = 0; i + 1 < b->n; i += step) b->p[i] = (unsigned char)(seed + i);
  b->p[b->n - 1] = (unsigned char)(seed ^ 0xa5);
}

static bool intact(const blk_t *b, unsigned seed) {
  size_t step = b->n / 61 + 1;
  for (size_t i = 0; i + 1 < b->n; i += step)
    if (b->p[i] != (unsigned char)(seed + i)) return false;
  return b->p[b->n - 1] == (unsigned char)(seed ^ 0xa5);
}

rmmc_resource_t *graph_contract_pool_of(rmmc_resource_t *r) {
  uint64_t v;
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (rmmc_resource_get_field(r, "graph_pools", &v)) return r;
  return NULL;
}

static void alloc(rmmc_resource_t *r, blk_t *b, size_t n, cudaStream_t s, const char *name) {
  void *p = NULL;
  rmmc_status_t st = rmmc_resource_allocate(r, n, 256, s, &p);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: allocate %zu: %s", name, n, rmmc_last_error_message());
  *b = (blk_t){p, n, 0};
}

static void dealloc(rmmc_resource_t *r, const blk_t *b, cudaStream_t s, const char *name) {
  rmmc_status_t st = rmmc_resource_deallocate(r, b->p, b->n, 256, s);
  ck_assert_msg(st == RMMC_SUCCESS, "%s: deallocate %p/%zu: %s", name, (void *)b->p, b->n,
                rmmc_last_error_message());
}

void graph_contract_run(rmmc_resource_t *r, size_t max_request, const char *name) {
  rmmc_resource_t *pool = graph_contract_pool_of(r);
  ck_assert_msg(pool != NULL, "%s: no pool layer", name);
  static const size_t all[] = {256, 1000, 4096, 65536, 200000, (size_t)1 << 20, (size_t)3 << 20};
  enum { MAXN = sizeof all / sizeof all[0], ROUNDS = 3 };
  size_t sizes[MAXN];
  int ns = 0;
  for (int i = 0; i < MAXN; i++)
    if (all[i] <= max_request) sizes[ns++] = all[i];
  ck_assert_int_gt(ns, 0);
  blk_t warm[2 * MAXN], g[3 * MAXN], other[8 * MAXN];
  int ng = 0, nother = 0;
  /* The caches hold memory from before the graph, on the stream that will
   * be routed and on another. */
  for (int i = 0; i < ns; i++) {
    alloc(r, &warm[2 * i], sizes[i], S(41), name);
    alloc(r, &warm[2 * i + 1], sizes[i], S(42), name);
  }
  for (int i = 0; i < 2 * ns; i++) dealloc(r, &warm[i], S(41 + i % 2), name);
  uint64_t graph_bytes0 = field(pool, "graph_bytes");
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 71, 72, true, S(41)), RMMC_SUCCESS);
  /* The "capture": every size twice; the first of each freed inside it and
   * asked for again (reuse inside the graph is allowed). */
  for (int i = 0; i < ns; i++) {
    alloc(r, &g[ng], sizes[i], S(41), name);
    fill(&g[ng++], 1);
    alloc(r, &g[ng], sizes[i], S(41), name);
    fill(&g[ng++], 2);
  }
  for (int i = 0; i < ng; i += 2) dealloc(r, &g[i], S(41), name);
  int first_round = ng;
  for (int i = 0; i < ns; i++) { /* g[ng] may reuse a freed block: it stays in the graph */
    alloc(r, &g[ng], sizes[i], S(41), name);
    fill(&g[ng++], 3);
  }
  /* Another stream meanwhile never gets the graph's memory. */
  for (int i = 0; i < ns; i++) {
    blk_t *o = &other[nother++];
    alloc(r, o, sizes[i], S(42), name);
    int k = overlaps_any(o->p, o->n, g, ng);
    ck_assert_msg(k < 0, "%s: stream 42 got %p+%zu inside graph block %p+%zu while routed", name,
                  (void *)o->p, o->n, (void *)(k >= 0 ? g[k].p : NULL), k >= 0 ? g[k].n : 0);
    fill(o, 9);
  }
  ck_assert_int_eq(rmmc_pool_graph_end(r, 71, 72), RMMC_SUCCESS);
  uint64_t graph_bytes = field(pool, "graph_bytes");
  size_t got = 0;
  for (int i = 0; i < ng; i++)
    if (i >= first_round || i % 2 == 1) got += g[i].n; /* the ones still out */
  ck_assert_msg(graph_bytes >= graph_bytes0 + got, "%s: the graph pool holds %llu bytes, the graph "
                "got %zu", name, (unsigned long long)(graph_bytes - graph_bytes0), got);
  /* After the capture, while the graph lives: the same sizes on the routed
   * stream (the finding: its block came back there) and on others. */
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < ns; i++) {
      for (int s = 41; s <= 43; s++) {
        blk_t *o = &other[nother++];
        alloc(r, o, sizes[i], S(s), name);
        int k = overlaps_any(o->p, o->n, g, ng);
        ck_assert_msg(k < 0, "%s: after the graph ended, stream %d got %p+%zu inside graph block "
                      "%p+%zu (round %d)", name, s, (void *)o->p, o->n,
                      (void *)(k >= 0 ? g[k].p : NULL), k >= 0 ? g[k].n : 0, round);
        fill(o, (unsigned)(10 + s));
      }
    }
    if (round == 0) /* the graph's outputs freed after it, on another stream */
      for (int i = 0; i < ng; i++) {
        if (i < first_round && i % 2 == 0) continue; /* freed inside */
        ck_assert_msg(intact(&g[i], i < first_round ? 2 : 3), "%s: graph block %d overwritten",
                      name, i);
        dealloc(r, &g[i], S(43), name);
      }
    for (int j = nother - 3 * ns; j < nother; j++) dealloc(r, &other[j], S(41 + j % 3), name);
    nother -= 3 * ns;
  }
  ck_assert_uint_eq(field(pool, "graph_bytes"), graph_bytes);
  ck_assert_int_eq(rmmc_pool_graph_release(r, 71, 72), RMMC_SUCCESS);
  for (int i = 0; i < nother; i++) {
    ck_assert(intact(&other[i], 9));
    dealloc(r, &other[i], S(42), name);
  }
  ck_assert_uint_eq(field(pool, "graph_pools"), 0);
  ck_assert_uint_eq(field(pool, "graph_bytes"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  ck_assert_int_eq(rmmc_pool_resource_check(pool), RMMC_SUCCESS);
}

/* ---- one routed thread beside others ---- */

enum { OPS = 1000, CAP = OPS, LIVE = 16 };

typedef struct gworker {
  rmmc_resource_t *r;
  cudaStream_t stream;
  size_t max_request;
  uint64_t *clock; /* atomic tickets */
  unsigned seed;
  blk_t *got; /* every block it got, with the ticket taken after (routed) or before */
  int ngot;
  bool routed;
  int bad; /* 1 allocate failed, 2 deallocate failed, 3 data overwritten */
} gworker_t;

static void *gworker_main(void *arg) {
  gworker_t *w = arg;
  blk_t live[LIVE];
  unsigned tag[LIVE];
  memset(live, 0, sizeof live);
  unsigned seed = w->seed;
  size_t cap = w->max_request < ((size_t)64 << 10) ? w->max_request : ((size_t)64 << 10);
  int ops = pool_steps(OPS); /* a fifth under valgrind */
  for (int op = 0; op < ops && w->bad == 0; op++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 16) % LIVE);
    if (live[k].p != NULL) {
      if (!intact(&live[k], tag[k])) w->bad = 3;
      if (rmmc_resource_deallocate(w->r, live[k].p, live[k].n, 256, w->stream) != RMMC_SUCCESS)
        w->bad = 2;
      live[k].p = NULL;
      continue;
    }
    size_t n = 256 + (size_t)(seed >> 4) % cap;
    if (n > w->max_request) n = w->max_request;
    uint64_t before = __atomic_add_fetch(w->clock, 1, __ATOMIC_SEQ_CST);
    void *p;
    if (rmmc_resource_allocate(w->r, n, 256, w->stream, &p) != RMMC_SUCCESS) {
      w->bad = 1;
      break;
    }
    uint64_t after = __atomic_add_fetch(w->clock, 1, __ATOMIC_SEQ_CST);
    live[k] = (blk_t){p, n, 0};
    tag[k] = seed;
    fill(&live[k], tag[k]);
    if (w->ngot < CAP) w->got[w->ngot++] = (blk_t){p, n, w->routed ? after : before};
  }
  for (int k = 0; k < LIVE; k++)
    if (live[k].p != NULL) {
      if (!intact(&live[k], tag[k])) w->bad = 3;
      if (rmmc_resource_deallocate(w->r, live[k].p, live[k].n, 256, w->stream) != RMMC_SUCCESS)
        w->bad = 2;
    }
  return NULL;
}

void graph_contract_threads(rmmc_resource_t *r, size_t max_request, int nothers,
                            const char *name) {
  enum { MAXT = 8 };
  ck_assert_int_le(nothers, MAXT - 1);
  rmmc_resource_t *pool = graph_contract_pool_of(r);
  ck_assert_msg(pool != NULL, "%s: no pool layer", name);
  uint64_t clock = 0;
  gworker_t w[MAXT];
  pthread_t th[MAXT];
  int n = nothers + 1;
  ck_assert_int_eq(rmmc_pool_graph_begin(r, 81, 82, true, S(61)), RMMC_SUCCESS);
  for (int i = 0; i < n; i++) {
    w[i] = (gworker_t){r, S(61 + i), max_request, &clock, 7u + 131u * (unsigned)i, NULL, 0,
                       i == 0, 0};
    w[i].got = calloc(CAP, sizeof(blk_t));
    ck_assert_ptr_nonnull(w[i].got);
    ck_assert_int_eq(pthread_create(&th[i], NULL, gworker_main, &w[i]), 0);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++)
    ck_assert_msg(w[i].bad == 0, "%s: worker %d failed (%d): %s", name, i, w[i].bad,
                  rmmc_last_error_message());
  ck_assert_int_eq(rmmc_pool_graph_end(r, 81, 82), RMMC_SUCCESS);
  /* Memory the graph got is its own from then on: no other thread got any
   * of it after (it may have had it before, freed and clean). */
  for (int i = 1; i < n; i++)
    for (int a = 0; a < w[i].ngot; a++)
      for (int b = 0; b < w[0].ngot; b++)
        ck_assert_msg(!(w[i].got[a].when > w[0].got[b].when &&
                        overlaps(w[i].got[a].p, w[i].got[a].n, w[0].got[b].p, w[0].got[b].n)),
                      "%s: thread %d got %p+%zu inside the graph's %p+%zu", name, i,
                      (void *)w[i].got[a].p, w[i].got[a].n, (void *)w[0].got[b].p, w[0].got[b].n);
  /* And after the routing ends, the routed stream and the others still
   * never get it while the graph lives. */
  for (int s = 61; s < 61 + n; s++)
    for (int k = 0; k < 16; k++) {
      blk_t o;
      alloc(r, &o, 256 + (size_t)k * 4096 < max_request ? 256 + (size_t)k * 4096 : max_request,
            S(s), name);
      int hit = overlaps_any(o.p, o.n, w[0].got, w[0].ngot);
      ck_assert_msg(hit < 0, "%s: stream %d got graph memory %p after the routing ended", name, s,
                    (void *)o.p);
      dealloc(r, &o, S(s), name);
    }
  ck_assert_int_eq(rmmc_pool_graph_release(r, 81, 82), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "graph_pools"), 0);
  ck_assert_int_eq(rmmc_resource_release_cached(r), RMMC_SUCCESS);
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  for (int i = 0; i < n; i++) free(w[i].got);
}
