/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graph pools and paused pools through caching layers (design rule 13).
 *
 * A layer that caches memory above a pool (fixed_size, and binning through
 * its bins) must not keep a graph pool's blocks in its cache, nor hand a
 * capture blocks of its cache, nor hand out any block of its cache while
 * the pool is paused (the pool has unmapped it): it passes the calls the
 * pool routes to a graph pool, and every call while the pool is paused,
 * straight to its upstream (the paused pool refuses them with its own
 * message). rmmc__graph_routes counts the graph pools being routed to and
 * the pools paused in the process; while it is 0 the question costs one
 * load. The pool installs the router (rmmc__graph_router: true when a call
 * on `stream` through `stack` reaches a pool that routes it to a graph pool
 * or is paused) before it first counts a route, so the layers below the
 * pool in the link order are not called from here (docs/design.md,
 * "Layers").
 */
#ifndef RMMC_INTERNAL_GRAPH_ROUTE_H
#define RMMC_INTERNAL_GRAPH_ROUTE_H

#include <stdbool.h>

#include "compiler.h"
#include "rmmc/resource.h"

typedef bool (*rmmc__graph_router_fn)(rmmc_resource_t *stack, cudaStream_t stream);
extern int rmmc__graph_routes;
void rmmc__set_graph_router(rmmc__graph_router_fn fn);
bool rmmc__graph_routed_slow(rmmc_resource_t *stack, cudaStream_t stream);
static inline bool rmmc__graph_routed(rmmc_resource_t *stack, cudaStream_t stream) {
  return RMMC_UNLIKELY(__atomic_load_n(&rmmc__graph_routes, __ATOMIC_RELAXED) > 0) &&
         rmmc__graph_routed_slow(stack, stream);
}

#endif /* RMMC_INTERNAL_GRAPH_ROUTE_H */
