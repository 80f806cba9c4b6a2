/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal helpers shared by the core, the resources and the adaptors, one
 * header per concern under src/base/ (this file only gathers them).
 * Never installed. Non-static internal functions are named rmmc__*.
 *
 *   base/compiler.h     export macro, branch hints, TLS model, alignment
 *   base/atomics.h      relaxed 64-bit counters for figures
 *   base/errors.h       error state save/restore, OOM and pointer messages
 *   base/fields.h       describe fields, byte formatting, thread id
 *   base/figures.h      the standard figure keys, once (X-macro map)
 *   base/device.h       current device, peers, base-resource helpers
 *   base/adaptor.h      the adaptor base and its pass-through slots
 *   base/upstream.h     call depth, the out-of-memory rule, and the rule
 *                           for calling an upstream (which of three verbs)
 *   base/graph_route.h  graph pools through caching layers
 *   base/options.h      the one check for a caller's options struct
 */
#ifndef RMMC_INTERNAL_H
#define RMMC_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/adaptor.h"
#include "base/atomics.h"
#include "base/compiler.h"
#include "base/device.h"
#include "base/errors.h"
#include "base/fields.h"
#include "base/figures.h"
#include "base/graph_route.h"
#include "base/options.h"
#include "base/upstream.h"
#include "rmmc/report.h"
#include "rmmc/resource_ops.h"

#endif /* RMMC_INTERNAL_H */
