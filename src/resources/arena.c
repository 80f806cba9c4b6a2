/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The arena resource (see include/rmmc/arena_resource.h): a mode of the
 * pool. The pool's stream heaps are what RMM's per-thread arenas
 * were for (no shared lock on the common path), and its one address space
 * keeps free memory of every stream mergeable, which the arena's own
 * superblocks and per-arena caches did not: 1.5-14x the live bytes on the
 * replayed logs, where this mode holds 1.02-1.31x (docs/design.md, "The
 * arena is a mode of the pool"). What is left here is the mapping of the
 * arena's options onto the pool's.
 */
#include <limits.h>

#include "arena_options.h"
#include "base/spec.h"
#include "pool/pool_internal.h"
#include "rmmc/arena_resource.h"

RMMC_API rmmc_status_t rmmc_arena_resource_create(rmmc_resource_t *upstream,
                                                  const rmmc_arena_options_t *options,
                                                  rmmc_resource_t **out) {
  const char *what = "arena_resource_create";
  rmmc_status_t st = rmmc__check_create(what, upstream, out);
  if (st != RMMC_SUCCESS) return st;
  rmmc_arena_options_t a = RMMC_ARENA_OPTIONS_INIT;
  RMMC__TAKE_OPTIONS(st, what, &a, options, RMMC_ARENA_OPTIONS);
  if (st != RMMC_SUCCESS) return st;
  size_t sb = a.superblock_size;
  if (!rmmc__is_pow2(sb))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: superblock size %zu is not a power of two", what, sb);
  if (a.max_size != 0 && a.max_size < sb)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: max size %zu is below one superblock (%zu)", what, a.max_size, sb);
  if (a.keep_superblocks > POOL_MAX_REQUEST / sb)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "%s: keep_superblocks %zu times %zu bytes is above 128 TiB", what,
                          a.keep_superblocks, sb);
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.small_chunk = sb;     /* a superblock is a span of a stream heap */
  o.small_max = sb / 4;   /* the arena's classes went up to a quarter superblock */
  o.cache_size = a.keep_superblocks * sb;
  if (a.chunk_size != 0) o.min_growth = a.chunk_size;
  if (a.max_size != 0) o.maximum_size = a.max_size;
  return rmmc__pool_create(upstream, &o, true, out);
}

RMMC_API size_t rmmc_arena_resource_block_size(const rmmc_resource_t *r, size_t bytes,
                                               size_t alignment) {
  if (!rmmc__pool_is_arena(r)) {
    (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                         "arena_resource_block_size: the resource is a %s, not an arena",
                         r == NULL ? "NULL" : rmmc_resource_name(r));
    return 0;
  }
  if (!rmmc__is_pow2(alignment)) {
    (void)rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                         "arena_resource_block_size: alignment %zu is not a power of two", alignment);
    return 0;
  }
  /* The pool carves every block at its exact size in granules, aligned
   * where it is placed: alignment costs no bytes of the block. */
  return bytes == 0 || bytes > POOL_MAX_REQUEST ? 0 : rmmc__align_up(bytes, POOL_GRANULE);
}

/* ---- stack spec ---- */

#define ARENA_SPEC_ROW(...) RMMC__SPEC_OPTION(rmmc_arena_options_t, __VA_ARGS__)
static const rmmc__spec_option_t arena_spec_options[] = {
    RMMC__ARENA_OPTIONS(ARENA_SPEC_ROW){.name = NULL},
};
#undef ARENA_SPEC_ROW

static rmmc_status_t arena_build(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                                 int device, rmmc_resource_t **out) {
  (void)device;
  rmmc_arena_options_t o = RMMC_ARENA_OPTIONS_INIT;
  rmmc_status_t st = rmmc__spec_fill(args, arena_spec_options, upstream, &o);
  return st == RMMC_SUCCESS ? rmmc_arena_resource_create(upstream, &o, out) : st;
}

const rmmc__spec_entry_t rmmc__arena_spec = {
    .name = "arena",
    .help = "the pool with stream heaps for blocks up to a quarter superblock (many threads)",
    .needs_upstream = true,
    .options = arena_spec_options,
    .build = arena_build,
};
