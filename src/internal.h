/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal helpers shared by the core, the resources and the adaptors, one
 * header per concern under src/internal/ (this file only gathers them).
 * Never installed. Non-static internal functions are named rmmc__*.
 *
 *   internal/compiler.h     export macro, branch hints, TLS model, alignment
 *   internal/atomics.h      relaxed 64-bit counters for figures
 *   internal/errors.h       error state save/restore, OOM and pointer messages
 *   internal/fields.h       describe fields, byte formatting, thread id
 *   internal/figures.h      the standard figure keys, once (X-macro map)
 *   internal/device.h       current device, peers, base-resource helpers
 *   internal/adaptor.h      the adaptor base and its pass-through slots
 *   internal/upstream.h     call depth, the out-of-memory rule, and the rule
 *                           for calling an upstream (which of three verbs)
 *   internal/graph_route.h  graph pools through caching layers
 *   internal/options.h      the one check for a caller's options struct
 */
#ifndef RMMC_INTERNAL_H
#define RMMC_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal/adaptor.h"
#include "internal/atomics.h"
#include "internal/compiler.h"
#include "internal/device.h"
#include "internal/errors.h"
#include "internal/fields.h"
#include "internal/figures.h"
#include "internal/graph_route.h"
#include "internal/options.h"
#include "internal/upstream.h"
#include "rmmc/report.h"
#include "rmmc/resource_ops.h"

#endif /* RMMC_INTERNAL_H */
