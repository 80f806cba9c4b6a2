/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance battery: the behaviour every resource and adaptor shares
 * (RMM's shared resource tests), run over a host spy upstream so it needs
 * no GPU. A test program lists its cases and calls conformance_add(); each
 * case's factory builds the resource under test on the upstream it is given.
 */
#ifndef RMMC_TEST_CONFORMANCE_H
#define RMMC_TEST_CONFORMANCE_H

#include <check.h>

#include "rmmc/resource.h"

/* Builds the resource under test on `upstream` (a host spy); the factory
 * takes its own reference to the upstream as any adaptor does. */
typedef rmmc_status_t (*conformance_factory_fn)(rmmc_resource_t *upstream,
                                                rmmc_resource_t **out);

typedef struct conformance_case {
  const char *name;
  conformance_factory_fn make;
  size_t max_request; /* largest single request the resource serves (0: 8 MiB) */
} conformance_case_t;

/* Adds one TCase "conformance" running every check on every case. `cases`
 * must outlive the run. */
void conformance_add(Suite *s, const conformance_case_t *cases, int ncases);

#endif
