/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stack specs: one textual form that names a whole stack, outermost first.
 *
 *   pool(initial=1GiB, maximum_size=80%) > cuda
 *   statistics > limiting(limit=4GiB) > binning > pool(initial=256MiB) > host
 *
 * A spec is layers separated by '>'; a layer is a resource name with an
 * optional parenthesized list of key=value options. Sizes take B, KiB, MiB,
 * GiB, TiB (and K, M, G, T, the same binary units) and fractions (1.5GiB),
 * with or without a space before the unit (64 MiB); KB, MB, GB and TB are
 * refused, since they mean powers of 1000 to some and of 1024 to others.
 * Options that accept a percentage (maximum_size=80%) resolve it against the free
 * memory of the device the stack serves, or of the host for host-memory
 * stacks. The innermost layer must be a base resource (cuda, managed,
 * pinned, cuda_async, host); every other layer wraps the one to its right.
 * Whitespace between words is ignored. A misspelled resource or option
 * name is answered with the closest one ("did you mean 'host'?").
 *
 * An option is named after its member in the layer's options struct, or a
 * short word for it (initial, page); words specs took before an option had
 * its member's name stay accepted as aliases: pool(max=, cache=) for
 * maximum_size and cache_size, arena(max=, superblock=) for max_size and
 * superblock_size. Writing an option under both names is writing it twice.
 * The size limits of the pool and the arena also take `none` for no limit,
 * whichever number their struct uses for it (SIZE_MAX, 0).
 *
 * The same form is used by rmmc-bench, rmmc-replay and RMMC_ALLOC_CONF.
 */
#ifndef RMMC_SPEC_H
#define RMMC_SPEC_H

#include <stddef.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds the stack `spec` names for `device` (-1: the current device) and
 * stores its outermost layer in *out (one reference; releasing it frees the
 * stack). RMMC_ERROR_PARSE for a malformed spec: the message names the
 * offending word and its column and shows the spec with a caret under it.
 * A layer's own failure (RMMC_ERROR_NO_DEVICE for cuda on a machine with no
 * GPU, RMMC_ERROR_OUT_OF_MEMORY for an initial size that does not fit)
 * comes back as that layer's status; nothing built is kept. */
RMMC_EXPORT rmmc_status_t rmmc_stack_create(const char *spec, int device,
                                            rmmc_resource_t **out);

/* Checks `spec` without building anything (names, options, value types and
 * the order of layers). RMMC_SUCCESS or RMMC_ERROR_PARSE as above. */
RMMC_EXPORT rmmc_status_t rmmc_stack_validate(const char *spec);

/* Parses a byte size as specs write them ("256MiB", "1.5 GiB", "4096").
 * RMMC_ERROR_PARSE for anything else, decimal units (1GB) included. */
RMMC_EXPORT rmmc_status_t rmmc_parse_size(const char *text, size_t *out);

/* Writes a one-line-per-resource list of the names and options specs accept
 * into buf (always terminated); returns the length it needed. */
RMMC_EXPORT size_t rmmc_stack_help(char *buf, size_t len);

/* Writes the manual of one resource `name` ("pool") into buf (always
 * terminated when len > 0; buf may be NULL with len 0): a first line with
 * what it is, then one line per option with its name, the unit or form of
 * its value and what it does with its default. *needed (may be NULL) gets
 * the length of the whole text. RMMC_ERROR_PARSE for an unknown name (the
 * closest one suggested), RMMC_ERROR_INVALID_ARGUMENT for a NULL name. */
RMMC_EXPORT rmmc_status_t rmmc_stack_help_resource(const char *name, char *buf, size_t len,
                                                   size_t *needed);

/* Builds the layers `spec` names on top of an existing resource: `spec` is
 * written like a stack without its base ("statistics > pool(initial=1GiB)")
 * and every layer must take an upstream. `upstream` is borrowed; the
 * innermost new layer retains it, so it lives as long as the new stack.
 * Percentages resolve against the memory `upstream` hands out. *out gets
 * one reference to the outermost new layer. RMMC_ERROR_PARSE for a malformed
 * spec or one that names a base resource; a layer's own failure comes back
 * as its status; nothing built is kept and `upstream` is left as it was.
 * This is how a language binding composes resource objects (Python's
 * rmmc.mr.PoolMemoryResource(upstream, ...)). */
RMMC_EXPORT rmmc_status_t rmmc_stack_create_over(const char *spec, rmmc_resource_t *upstream,
                                                 rmmc_resource_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_SPEC_H */
