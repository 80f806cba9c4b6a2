/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The other names stack specs may write for options (base/spec.h,
 * rmmc__spec_alias_t). Each option's name is its field's in the public
 * options struct; a word specs took before it had that name stays here, so
 * specs users have keep parsing to the same options. The README's "Stack
 * specs" lists the same words.
 */
#include <stdint.h>

#include "base/spec.h"

const rmmc__spec_alias_t rmmc__spec_aliases[] = {
    /* The pool: 0 and SIZE_MAX both mean no limit; SIZE_MAX is the default. */
    {.layer = "pool", .name = "maximum_size", .alias = "max", .no_limit = true,
     .no_limit_value = SIZE_MAX},
    {.layer = "pool", .name = "cache_size", .alias = "cache"},
    /* The arena: 0 (the default) and SIZE_MAX both mean no limit. */
    {.layer = "arena", .name = "max_size", .alias = "max", .no_limit = true, .no_limit_value = 0},
    {.layer = "arena", .name = "superblock_size", .alias = "superblock"},
    {.layer = NULL},
};
