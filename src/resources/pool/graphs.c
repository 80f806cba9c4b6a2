/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool core's CUDA graph pools (rmmc_pool_graph_begin in
 * include/rmmc/pool_resource.h; docs/design.md, "Capture safety and graph
 * pools"): a graph pool is a pool_owner_t without a stream. Its
 * allocations take its free blocks, then clean memory (nothing may make a
 * capture wait), then growth.
 */
#include "core.h"

static pool_owner_t *graph_find(pool_t *p, uint64_t id0, uint64_t id1) {
  for (pool_owner_t *g = p->graphs; g != NULL; g = g->next)
    if (!g->released && g->gid[0] == id0 && g->gid[1] == id1) return g;
  return NULL;
}

/* Frees a released graph pool's struct once nothing of it is left. */
void rmmc__pool_graph_forget(pool_t *p, pool_owner_t *g) {
  if (!g->released || g->used_bytes > 0 || g->idx->count > 0) return;
  for (pool_owner_t **l = &p->graphs; *l != NULL; l = &(*l)->next)
    if (*l == g) {
      *l = g->next;
      break;
    }
  free(g->idx);
  free(g);
}

/* Released graph pools give their free blocks back (the device is idle:
 * the caller synchronized it). */
void rmmc__pool_graph_drain(pool_t *p) {
  for (pool_owner_t *g = p->graphs, *next; g != NULL; g = next) {
    next = g->next;
    if (!g->released) continue;
    while (g->qhead != NULL) {
      pool_block_t *b = g->qhead;
      rmmc__pool_unlink_free(p, b);
      b->owner = NULL;
      rmmc__pool_put_free(p, b);
    }
    rmmc__pool_graph_forget(p, g);
  }
}

/* The graph pool a call on `stream` is routed to, or NULL. */
POOL_NOINLINE pool_owner_t *rmmc__pool_graph_route(pool_t *p, cudaStream_t stream) {
  const void *key = rmmc__stream_key_fast(stream);
  unsigned long long cid = 0;
  bool capturing = false;
  if (p->cuda && __atomic_load_n(&p->graphs_by_capture, __ATOMIC_RELAXED) > 0) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamGetCaptureInfo(stream, &cs, &cid, NULL, NULL, NULL, NULL) != cudaSuccess)
      (void)cudaGetLastError();
    else capturing = cs == cudaStreamCaptureStatusActive;
  }
  pool_owner_t *found = NULL;
  rmmc__lock(&p->lock);
  for (pool_owner_t *g = p->graphs; g != NULL && found == NULL; g = g->next)
    if (g->begun > 0 && ((g->route_key != NULL && g->route_key == key) ||
                         (capturing && g->capture == cid)))
      found = g;
  if (found == NULL && capturing) { /* the first allocation of a capture this thread began */
    uint64_t tid = rmmc__thread_id();
    for (pool_owner_t *g = p->graphs; g != NULL && found == NULL; g = g->next)
      if (g->begun > 0 && g->route_key == NULL && g->capture == 0 && g->pending_thread == tid) {
        g->capture = cid;
        found = g;
      }
  }
  rmmc__unlock(&p->lock);
  return found;
}

POOL_NOINLINE rmmc_status_t rmmc__pool_graph_allocate(pool_t *p, pool_owner_t *g, cudaStream_t stream,
                                                  size_t n, size_t align, size_t bytes,
                                                  void **out) {
  size_t need = n + (align - POOL_GRANULE);
  if (need > POOL_MAX_REQUEST) return rmmc__pool_oom(p, bytes, stream, "larger than any pool can hold");
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  if (!pool_meta_room(&p->meta)) {
    st = rmmc__pool_no_host_memory();
    goto unlock;
  }
  rmmc__tlsf_node_t *x = rmmc__tlsf_find(g->idx, need);
  if (x == NULL) x = rmmc__tlsf_find(&p->clean, need);
  if (x == NULL) { /* other streams' finished frees */
    rmmc__pool_consolidate(p, true);
    x = rmmc__tlsf_find(&p->clean, need);
  }
  pool_block_t *b;
  if (x != NULL) {
    b = pool_block_of(x);
    rmmc__pool_unlink_free(p, b);
  } else if ((st = p->be->grow(p, NULL, stream, n, align, POOL_GROW_ANY, &b)) != RMMC_SUCCESS) {
    if (st == RMMC_ERROR_OUT_OF_MEMORY) st = rmmc__pool_oom(p, bytes, stream, rmmc_last_error_message());
    goto unlock;
  } else {
    p->grows++;
  }
  st = large_hand_out(p, b, n, align, bytes, g, out);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

pool_t *rmmc__pool_in(rmmc_resource_t *r) {
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (is_pool(r)) return (pool_t *)r;
  return NULL;
}

rmmc_status_t rmmc__pool_no_layer(const char *what, const rmmc_resource_t *stack) {
  return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "%s: %s has no pool layer", what,
                        stack == NULL ? "NULL" : rmmc_resource_name(stack));
}

/* The router of caching layers above a pool (base/graph_route.h):
 * does a call on `stream` through `stack` reach a pool that sends it to a
 * graph pool, or that is paused (sleep.c: it refuses the call, which the
 * layer must not serve from its cache of the pool's unmapped memory)? */
static bool graph_routes_call(rmmc_resource_t *stack, cudaStream_t stream) {
  pool_t *p = rmmc__pool_in(stack);
  return p != NULL && __atomic_load_n(&p->graphs_routing, __ATOMIC_RELAXED) > 0 &&
         (__atomic_load_n(&p->paused, __ATOMIC_RELAXED) || rmmc__pool_graph_route(p, stream) != NULL);
}

/* Counts one graph pool more (+1) or less (-1) being routed to, or a
 * pause (rmmc__pool_count_route). */
void rmmc__pool_count_route(pool_t *p, int delta) {
  if (delta > 0) rmmc__set_graph_router(graph_routes_call);
  __atomic_add_fetch(&p->graphs_routing, delta, __ATOMIC_RELAXED);
  __atomic_add_fetch(&rmmc__graph_routes, delta, __ATOMIC_RELAXED);
}

/* Counts g's routing begun (+1) or ended (-1), routed by capture also as
 * a capture rmmc knows of (shared lock held). */
static void graph_count(pool_t *p, const pool_owner_t *g, int delta) {
  if (g->route_key == NULL) {
    p->graphs_by_capture += delta;
    __atomic_add_fetch(&rmmc__captures_underway, delta, __ATOMIC_RELAXED);
  }
  rmmc__pool_count_route(p, delta);
}

/* g stops being routed to (shared lock held). */
static void graph_unroute(pool_t *p, pool_owner_t *g) {
  graph_count(p, g, -1);
  g->begun = 0;
  g->route_key = NULL;
  g->capture = 0;
  g->pending_thread = 0;
}

RMMC_API rmmc_status_t rmmc_pool_graph_begin(rmmc_resource_t *stack, uint64_t id0, uint64_t id1,
                                             bool by_stream, cudaStream_t stream) {
  pool_t *p = rmmc__pool_in(stack);
  if (p == NULL) return rmmc__pool_no_layer("pool_graph_begin", stack);
  if (!by_stream && !p->cuda)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_graph_begin: routing by capture needs device memory; route a "
                          "host pool by stream");
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g == NULL) {
    g = calloc(1, sizeof *g);
    if (g == NULL || (g->idx = calloc(1, sizeof *g->idx)) == NULL) {
      free(g);
      st = rmmc__pool_no_host_memory();
      goto unlock;
    }
    g->gid[0] = id0;
    g->gid[1] = id1;
    g->next = p->graphs;
    p->graphs = g;
  } else if (g->begun > 0) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "pool_graph_begin: graph pool (%llu, %llu) is already being routed to",
                        (unsigned long long)id0, (unsigned long long)id1);
    goto unlock;
  }
  g->begun = 1;
  g->capture = 0;
  g->route_key = by_stream ? rmmc__stream_key(stream) : NULL;
  g->pending_thread = by_stream ? 0 : rmmc__thread_id();
  graph_count(p, g, 1);
unlock:
  rmmc__unlock(&p->lock);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_graph_end(rmmc_resource_t *stack, uint64_t id0, uint64_t id1) {
  pool_t *p = rmmc__pool_in(stack);
  if (p == NULL) return rmmc__pool_no_layer("pool_graph_end", stack);
  rmmc_status_t st = RMMC_SUCCESS;
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g != NULL && g->begun > 0) graph_unroute(p, g);
  else
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                        "pool_graph_end: graph pool (%llu, %llu) is not being routed to",
                        (unsigned long long)id0, (unsigned long long)id1);
  rmmc__unlock(&p->lock);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_graph_release(rmmc_resource_t *stack, uint64_t id0, uint64_t id1) {
  pool_t *p = rmmc__pool_in(stack);
  if (p == NULL) return rmmc__pool_no_layer("pool_graph_release", stack);
  rmmc__lock(&p->lock);
  pool_owner_t *g = graph_find(p, id0, id1);
  if (g == NULL) {
    rmmc__unlock(&p->lock);
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_graph_release: no graph pool (%llu, %llu)",
                          (unsigned long long)id0, (unsigned long long)id1);
  }
  if (g->begun > 0) graph_unroute(p, g);
  g->released = true;
  rmmc__pool_graph_forget(p, g);
  rmmc__unlock(&p->lock);
  /* Replays may still run: the free blocks go back once the device is
   * idle (an explicit call, so it may synchronize). */
  if (rmmc__stream_set_sync(&p->streams) == RMMC_SUCCESS) {
    rmmc__lock(&p->lock);
    rmmc__pool_graph_drain(p);
    rmmc__unlock(&p->lock);
  }
  return RMMC_SUCCESS;
}
