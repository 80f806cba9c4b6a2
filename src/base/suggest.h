/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hints for the stack-spec parser's messages (internal; suggest.c).
 */
#ifndef RMMC_SUGGEST_H
#define RMMC_SUGGEST_H

#include <stddef.h>

#include "base/spec.h"

/* The registered resource name closest to word[0, len), or NULL if none is
 * close (within a third of its letters, case and adjacent swaps counted). */
const char *rmmc__suggest_resource(const char *word, size_t len);

/* The same among `entry`'s options. */
const char *rmmc__suggest_option(const rmmc__spec_entry_t *entry, const char *word, size_t len);

/* For a size written with a decimal unit (1GB), a parenthesized sentence
 * (with a leading space) saying what to write instead; "" otherwise. */
const char *rmmc__size_unit_hint(const char *text, size_t len);

#endif /* RMMC_SUGGEST_H */
