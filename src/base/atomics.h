/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Relaxed atomic 64-bit counters: statistics and figures that any thread may
 * read at any time without a lock. Relaxed because a figure is a snapshot,
 * never a synchronization point; anything that orders memory takes a lock
 * (lock.h) or uses its own acquire/release atomics in place.
 */
#ifndef RMMC_INTERNAL_ATOMICS_H
#define RMMC_INTERNAL_ATOMICS_H

#include <stdbool.h>
#include <stdint.h>

static inline uint64_t rmmc__atomic_load_u64(const uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline uint64_t rmmc__atomic_add_u64(uint64_t *p, uint64_t v) {
  return __atomic_add_fetch(p, v, __ATOMIC_RELAXED);
}
static inline uint64_t rmmc__atomic_sub_u64(uint64_t *p, uint64_t v) {
  return __atomic_sub_fetch(p, v, __ATOMIC_RELAXED);
}
/* Raises *p to at least v. */
static inline void rmmc__atomic_max_u64(uint64_t *p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v &&
         !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

#endif /* RMMC_INTERNAL_ATOMICS_H */
