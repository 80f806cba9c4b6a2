/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The standard figure keys, once: the names the describe slots report and
 * the core reads back (resource.h lists what each means). Each key's string
 * is written here only; files emit and look up figures by the macro name,
 * RMMC__FIG(IN_USE), a string literal (so it also fits static tables). The
 * core reads a figure by key through rmmc__figure_of, which maps a
 * reported key (from any resource, user-written ones included) to its
 * rmmc__figure_t, or RMMC__FIG_COUNT for a key outside this map.
 */
#ifndef RMMC_INTERNAL_FIGURES_H
#define RMMC_INTERNAL_FIGURES_H

#include <string.h>

#define RMMC__FIG_KEY_RESERVED "reserved"       /* bytes held from the upstream */
#define RMMC__FIG_KEY_IN_USE "in_use"           /* bytes handed out and not freed */
#define RMMC__FIG_KEY_CACHED "cached"           /* what release_cached can give back */
#define RMMC__FIG_KEY_FREE "free"               /* reserved less in_use */
#define RMMC__FIG_KEY_PEAK "peak"               /* the highest in_use */
#define RMMC__FIG_KEY_TOTAL "total"             /* bytes ever handed out */
#define RMMC__FIG_KEY_OUTSTANDING "outstanding" /* blocks handed out and not freed */
#define RMMC__FIG_KEY_ALLOCATIONS "allocations" /* blocks ever handed out */

/* The map: one X(NAME) row per key above. */
#define RMMC__FIGURES(X) \
  X(RESERVED)            \
  X(IN_USE)              \
  X(CACHED)              \
  X(FREE)                \
  X(PEAK)                \
  X(TOTAL)               \
  X(OUTSTANDING)         \
  X(ALLOCATIONS)

#define RMMC__FIG(name) RMMC__FIG_KEY_##name

#define RMMC__FIG_ENUM_ROW(name) RMMC__FIG_##name,
typedef enum rmmc__figure { RMMC__FIGURES(RMMC__FIG_ENUM_ROW) RMMC__FIG_COUNT } rmmc__figure_t;
#undef RMMC__FIG_ENUM_ROW

/* The figure `key` names, or RMMC__FIG_COUNT. For the cold paths that read
 * a stack's figures (the out-of-memory rule and message, the release
 * check), never a hot path. */
static inline rmmc__figure_t rmmc__figure_of(const char *key) {
#define RMMC__FIG_LOOKUP_ROW(name) \
  if (strcmp(key, RMMC__FIG_KEY_##name) == 0) return RMMC__FIG_##name;
  RMMC__FIGURES(RMMC__FIG_LOOKUP_ROW)
#undef RMMC__FIG_LOOKUP_ROW
  return RMMC__FIG_COUNT;
}

/* describe from a figures table (rmmc/figures.h). RMMC__FIGURE_VALUE makes
 * a struct with one member per row (BYTES and COUNT: uint64_t; TEXT: const
 * char *); with that struct as `v` and describe's `emit` and `ctx` in
 * scope, TABLE(RMMC__FIGURE_EMIT) reports its rows, in order: BOTH and
 * DESCRIBE rows always, DESCRIBE_IF_SET rows while not 0 (TEXT: not NULL
 * or empty), STRUCT rows never. The _KEYED forms take keyed rows (the
 * member is named `name`, the key is `key`). */
#define RMMC__FIGURE_VALUE_TYPE_BYTES uint64_t
#define RMMC__FIGURE_VALUE_TYPE_COUNT uint64_t
#define RMMC__FIGURE_VALUE_TYPE_TEXT const char *
#define RMMC__FIGURE_VALUE(kind, name, where, doc) RMMC__FIGURE_VALUE_TYPE_##kind name;
#define RMMC__FIGURE_KEYED_VALUE(kind, type, name, key, where, doc) \
  RMMC__FIGURE_VALUE_TYPE_##kind name;
#define RMMC__FIGURE_EMIT(kind, name, where, doc) RMMC__FIGURE_EMIT_##where(kind, #name, v.name)
#define RMMC__FIGURE_KEYED_EMIT(kind, type, name, key, where, doc) \
  RMMC__FIGURE_EMIT_##where(kind, #key, v.name)
#define RMMC__FIGURE_EMIT_BOTH(kind, key, x) RMMC__FIGURE_EMIT_##kind(key, x)
#define RMMC__FIGURE_EMIT_DESCRIBE(kind, key, x) RMMC__FIGURE_EMIT_##kind(key, x)
#define RMMC__FIGURE_EMIT_DESCRIBE_IF_SET(kind, key, x) \
  if (RMMC__FIGURE_IS_SET_##kind(x)) RMMC__FIGURE_EMIT_##kind(key, x)
#define RMMC__FIGURE_EMIT_STRUCT(kind, key, x)
#define RMMC__FIGURE_EMIT_BYTES(key, x) rmmc__emit_bytes(emit, ctx, key, x);
#define RMMC__FIGURE_EMIT_COUNT(key, x) rmmc__emit_count(emit, ctx, key, x);
#define RMMC__FIGURE_EMIT_TEXT(key, x) rmmc__emit_text(emit, ctx, key, x);
#define RMMC__FIGURE_IS_SET_BYTES(x) ((x) != 0)
#define RMMC__FIGURE_IS_SET_COUNT(x) ((x) != 0)
#define RMMC__FIGURE_IS_SET_TEXT(x) ((x) != NULL && (x)[0] != '\0')

#endif /* RMMC_INTERNAL_FIGURES_H */
