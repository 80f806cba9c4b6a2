/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graph pools through caching layers (design rule 13).
 *
 * A layer that caches memory above a pool (fixed_size, and binning through
 * its bins) must not keep a graph pool's blocks in its cache, nor hand a
 * capture blocks of its cache: it passes the calls the pool routes to a
 * graph pool straight to its upstream. rmmc__graph_routes counts the graph
 * pools being routed to in the process; while it is 0 the question costs
 * one load. The pool installs the router (rmmc__graph_router: true when a
 * call on `stream` through `stack` reaches a pool that routes it to a graph
 * pool) before it first counts a route, so the layers below the pool in
 * the link order are not called from here (docs/design.md, "Layers").
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
