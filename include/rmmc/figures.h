/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Figures tables: how a resource's figures are written once.
 *
 * A resource with a figures struct (rmmc_pool_figures_t) makes it from one
 * X-macro table in its header, RMMC_<NAME>_FIGURES(X): one row per figure,
 * in the order its describe slot reports them (rmmc_resource_describe), each
 * row documented where it is written. A row has the columns
 *
 *   X(kind, name, where, doc)
 *
 * kind is how the figure is reported: BYTES (a byte count, a size_t member),
 * COUNT (a count, a uint64_t member) or TEXT (describe only); it names the
 * rmmc_field_kind_t describe gives it (RMMC_FIELD_##kind). name is both the
 * key describe reports (rmmc_resource_get_field(r, "name", ...)) and the
 * member's name. where says which of the two has it:
 *
 *   BOTH              a member of the struct, reported by describe here
 *   STRUCT            a member of the struct only: describe reports it with
 *                     the figures of the streams, after this table's
 *   DESCRIBE          reported by describe here, no member
 *   DESCRIBE_IF_SET   as DESCRIBE, but only while it is set (not 0; TEXT:
 *                     not empty); the doc says when that is
 *
 * doc says what the figure means. The expansions here make the struct's
 * members and its _INIT initializer; the library makes describe from the
 * same rows, so a figure's key, kind and place are written only in its row.
 *
 * Keyed rows. A struct released before its describe keys were chosen
 * (rmmc_statistics_t: current_bytes is reported as in_use) has rows with
 * two more columns,
 *
 *   X(kind, type, name, key, where, doc)
 *
 * type is the member's type (it need not be the kind's: a current figure
 * may be signed; describe reports it as 0 below 0), name the member's name
 * and key the key describe reports; where and doc are as above (a
 * DESCRIBE row's type is that of its value, uint64_t). The _KEYED
 * expansions make the struct and its initializer from them.
 *
 * A resource without a figures struct writes its describe as a table of
 * DESCRIBE and DESCRIBE_IF_SET rows (RMMC_FIXED_SIZE_FIGURES): the same
 * rows, in the same order, with nothing to make here; its header documents
 * each figure in its row.
 */
#ifndef RMMC_FIGURES_H
#define RMMC_FIGURES_H

#include <stddef.h>
#include <stdint.h>

/* A kind's member type (TEXT figures have no member). */
#define RMMC_FIGURE_TYPE_BYTES size_t
#define RMMC_FIGURE_TYPE_COUNT uint64_t

/* A row as a struct member, `type name;`, for BOTH and STRUCT rows. */
#define RMMC_FIGURE_FIELD(kind, name, where, doc) RMMC_FIGURE_FIELD_##where(kind, name)
#define RMMC_FIGURE_FIELD_BOTH(kind, name) RMMC_FIGURE_TYPE_##kind name;
#define RMMC_FIGURE_FIELD_STRUCT(kind, name) RMMC_FIGURE_TYPE_##kind name;
#define RMMC_FIGURE_FIELD_DESCRIBE(kind, name)
#define RMMC_FIGURE_FIELD_DESCRIBE_IF_SET(kind, name)

/* A row as the next value of a positional _INIT initializer, `, 0`, for
 * the rows that are members. */
#define RMMC_FIGURE_ZERO(kind, name, where, doc) RMMC_FIGURE_ZERO_##where
#define RMMC_FIGURE_ZERO_BOTH , 0
#define RMMC_FIGURE_ZERO_STRUCT , 0
#define RMMC_FIGURE_ZERO_DESCRIBE
#define RMMC_FIGURE_ZERO_DESCRIBE_IF_SET

/* The same for keyed rows. */
#define RMMC_FIGURE_KEYED_FIELD(kind, type, name, key, where, doc) \
  RMMC_FIGURE_KEYED_FIELD_##where(type, name)
#define RMMC_FIGURE_KEYED_FIELD_BOTH(type, name) type name;
#define RMMC_FIGURE_KEYED_FIELD_STRUCT(type, name) type name;
#define RMMC_FIGURE_KEYED_FIELD_DESCRIBE(type, name)
#define RMMC_FIGURE_KEYED_FIELD_DESCRIBE_IF_SET(type, name)
#define RMMC_FIGURE_KEYED_ZERO(kind, type, name, key, where, doc) RMMC_FIGURE_ZERO_##where

#endif /* RMMC_FIGURES_H */
