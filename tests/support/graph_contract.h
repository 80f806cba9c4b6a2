/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The graph-pool contract (include/rmmc/pool_resource.h, "CUDA graphs:
 * private pools"; design rule 13), held against any stack with a pool layer
 * below, whatever caches above it: routed by stream over host memory, what
 * a capture does on a GPU. Shared by the conformance battery and
 * tests/test_pool_graph.c.
 */
#ifndef RMMC_TEST_GRAPH_CONTRACT_H
#define RMMC_TEST_GRAPH_CONTRACT_H

#include <stdbool.h>
#include <stddef.h>

#include "rmmc/resource.h"

/* The stack's pool layer (the first layer with "graph_pools"), or NULL. */
rmmc_resource_t *graph_contract_pool_of(rmmc_resource_t *r);

/* Blocks of every size up to max_request (and 4 KiB, the finding's) are
 * allocated on a routed stream, some freed inside the "capture", the rest
 * freed after it; between begin and release no allocation on any stream
 * (the routed one included, after the routing ends) may overlap a block
 * the graph got, the graph pool's bytes cover what the graph got, and
 * after the release and the frees everything goes back. Fails the calling
 * test. */
void graph_contract_run(rmmc_resource_t *r, size_t max_request, const char *name);

/* One thread routes its stream and allocates and frees while `nothers`
 * threads allocate and free on their own streams: no other thread ever
 * gets a block overlapping one the graph got (while routed and after), and
 * live blocks never overlap. */
void graph_contract_threads(rmmc_resource_t *r, size_t max_request, int nothers,
                            const char *name);

#endif
