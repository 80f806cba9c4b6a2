/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Compiler macros and integer helpers every file of src/ may use: the export
 * macro, branch hints, cold paths, initial-exec thread-locals, container_of,
 * power-of-two alignment. No library types; includes only the C headers.
 */
#ifndef RMMC_INTERNAL_COMPILER_H
#define RMMC_INTERNAL_COMPILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmmc/export.h"

#define RMMC_API RMMC_EXPORT

#if defined(__GNUC__) || defined(__clang__)
#define RMMC_COLD __attribute__((cold, noinline))
/* The allocate/free paths: GCC groups hot functions in .text.hot, so their
 * placement no longer moves with every unrelated change (two builds
 * compared in one process: docs/performance.md, "Comparing two builds"). */
#define RMMC_HOT __attribute__((hot))
#define RMMC_LIKELY(x) __builtin_expect(!!(x), 1)
#define RMMC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define RMMC_COLD
#define RMMC_HOT
#define RMMC_LIKELY(x) (x)
#define RMMC_UNLIKELY(x) (x)
#endif

/* initial-exec: the hot path must not call __tls_get_addr; a few bytes fit
 * the static TLS surplus even when the library is dlopen'ed (PyTorch does),
 * which bounds the library's whole TLS block (internal/call_depth.h). */
#if defined(__GNUC__) || defined(__clang__)
#define RMMC_TLS_FAST __attribute__((tls_model("initial-exec")))
#else
#define RMMC_TLS_FAST
#endif

#define RMMC_CONTAINER_OF(ptr, type, member)                                   \
  ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline bool rmmc__is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Rounds x up to a multiple of the power of two a; the caller makes sure it
 * does not overflow (rmmc__align_up_checked does). */
static inline size_t rmmc__align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

static inline bool rmmc__align_up_checked(size_t x, size_t a, size_t *out) {
  if (x > SIZE_MAX - (a - 1)) return false;
  *out = rmmc__align_up(x, a);
  return true;
}

#endif /* RMMC_INTERNAL_COMPILER_H */
