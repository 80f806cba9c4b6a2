/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The spy resource: a malloc-backed resource for tests that counts its
 * calls, records the last arguments, keeps every outstanding allocation (so
 * it catches double frees, foreign pointers, wrong sizes and leaks) and
 * fails on demand: the Nth allocate from now, or every Nth (SQLite's fault
 * simulator, jemalloc's hooks). It takes enable_peer_access as a base
 * resource would, recording the peers (its memory is the host's: nothing
 * is granted). Thread-safe.
 */
#ifndef RMMC_TEST_SPY_H
#define RMMC_TEST_SPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/resource_ops.h"

typedef struct spy spy_t;

typedef struct spy_counts {
  uint64_t allocate_calls;   /* every allocate call, failed ones too */
  uint64_t allocate_failures;
  uint64_t deallocate_calls;
  uint64_t deallocate_errors; /* unknown pointer or wrong size */
  uint64_t release_calls;
  uint64_t outstanding;       /* allocations not yet returned */
  uint64_t outstanding_bytes;
  uint64_t peak_bytes;
  size_t last_bytes, last_alignment;
  cudaStream_t last_stream;
  void *last_ptr;
  uint64_t peer_calls; /* enable_peer_access calls, failed ones too */
  int last_peer;       /* the device the last one named */
  uint64_t peers;      /* the devices enabled (bit d) */
} spy_counts_t;

/* Creates a spy of memory kind `kind` (RMMC_MEMORY_HOST for real host
 * memory; another kind still hands out host memory but reports that kind).
 * `*spy` is a handle valid until the resource is destroyed, unless it was
 * kept with spy_keep(). */
rmmc_status_t spy_create(rmmc_memory_kind_t kind, rmmc_resource_t **out);
/* The spy behind a resource made by spy_create. */
spy_t *spy_of(rmmc_resource_t *r);

/* The Nth allocate call from now fails with RMMC_ERROR_OUT_OF_MEMORY
 * (0: never). */
void spy_fail_nth(spy_t *s, uint64_t n);
/* Every Nth allocate call fails (0: never). */
void spy_fail_every(spy_t *s, uint64_t n);
/* Allocations above `bytes` fail with out of memory (SIZE_MAX: none). */
void spy_set_capacity(spy_t *s, size_t bytes);
/* The next enable_peer_access call fails with `status` ("spy: injected
 * ..."), changing nothing. */
void spy_fail_peer_access(spy_t *s, rmmc_status_t status);
/* A snapshot of the counters. */
spy_counts_t spy_counts(spy_t *s);

/* Destruction is observable: the number of spies destroyed so far in this
 * process. */
uint64_t spy_destroyed_total(void);

#endif
