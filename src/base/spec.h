/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stack-spec parser's registration interface (internal).
 *
 * Each resource and adaptor defines one rmmc__spec_entry_t next to its code
 * (named rmmc__<name>_spec) and is listed once in spec_table.c. The parser
 * checks names, option names and value types, and calls `build` innermost
 * layer first, with the layer below as `upstream` (NULL for base resources).
 */
#ifndef RMMC_SPEC_INTERNAL_H
#define RMMC_SPEC_INTERNAL_H

#include <stddef.h>

#include "base/internal.h"

typedef enum rmmc__opt_type {
  RMMC__OPT_BYTES,      /* 1024, 64KiB, 1.5GiB (B, KiB, MiB, GiB, TiB; K/M/G too) */
  RMMC__OPT_BYTES_PCT,  /* bytes, or a percentage: 80% */
  RMMC__OPT_INT,        /* a signed integer */
  RMMC__OPT_DOUBLE,     /* a number */
  RMMC__OPT_BOOL,       /* true/false, on/off, yes/no, 1/0 */
  RMMC__OPT_STRING,     /* a word or "a quoted string" */
} rmmc__opt_type_t;

/* Where the generic builder (rmmc__spec_fill) stores an option: the C type
 * of its field in the layer's options struct. */
typedef enum rmmc__field_type {
  RMMC__FIELD_NONE = 0, /* not in a struct: the entry's build reads the option itself */
  RMMC__FIELD_SIZE,     /* size_t, from BYTES or BYTES_PCT, or a count from INT (in [lo, hi]) */
  RMMC__FIELD_DOUBLE,   /* double, from DOUBLE */
  RMMC__FIELD_BOOL,     /* bool, from BOOL */
  RMMC__FIELD_INT,      /* int, from INT (in [lo, hi]) or BOOL (1 or 0) */
  RMMC__FIELD_UNSIGNED, /* unsigned, from INT (in [lo, hi]) */
} rmmc__field_type_t;

/* One option a layer takes. The first three members are what the parser
 * needs; the rest describe the option as data (an X-macro row per option,
 * RMMC__SPEC_OPTION), from which the generic builder, the help text and the
 * test of the table against the public header come. */
typedef struct rmmc__spec_option {
  const char *name;
  rmmc__opt_type_t type;
  const char *help;
  rmmc__field_type_t field; /* NONE: not described as data */
  size_t offset;            /* of the field in the options struct */
  bool ranged;              /* the row has a range (its min and max are not both 0) */
  long long lo;             /* integer fields: the range, exact (size_t's top included) */
  unsigned long long hi;
  double dlo, dhi;          /* DOUBLE fields: the range */
  const char *def;          /* the default, as the help prints it (NULL: none said) */
  const char *unit;         /* what the number counts, for the help ("" or NULL: none) */
} rmmc__spec_option_t;

/* One row of an options table (include/rmmc/options.h, the columns) as a
 * spec option of the layer whose options struct is T; a row whose spec is
 * NOSPEC (a field no spec sets) makes none. */
#define RMMC__SPEC_OPTION(T, ctype, field_, cdef, lo_, hi_, key, stype, ftype, tdef, unit_,    \
                          help_)                                                               \
  RMMC__SPEC_IF_##stype({.name = key,                                                          \
                         .type = RMMC__OPT_##stype,                                            \
                         .help = help_,                                                        \
                         .field = RMMC__FIELD_##ftype,                                         \
                         .offset = offsetof(T, field_),                                        \
                         .ranged = (lo_) != 0 || (hi_) != 0,                                   \
                         RMMC__SPEC_RANGE_##ftype(lo_, hi_),                                   \
                         .def = tdef,                                                          \
                         .unit = unit_},)
/* The range columns into the members of the field's kind of number. */
#define RMMC__SPEC_RANGE_DOUBLE(lo_, hi_) .dlo = (lo_), .dhi = (hi_)
#define RMMC__SPEC_RANGE_SIZE(lo_, hi_) .lo = (lo_), .hi = (hi_)
#define RMMC__SPEC_RANGE_INT(lo_, hi_) .lo = (lo_), .hi = (hi_)
#define RMMC__SPEC_RANGE_UNSIGNED(lo_, hi_) .lo = (lo_), .hi = (hi_)
#define RMMC__SPEC_RANGE_BOOL(lo_, hi_) .lo = (lo_), .hi = (hi_)
#define RMMC__SPEC_RANGE_NONE(lo_, hi_) .lo = (lo_), .hi = (hi_)
#define RMMC__SPEC_IF_BYTES(...) __VA_ARGS__
#define RMMC__SPEC_IF_BYTES_PCT(...) __VA_ARGS__
#define RMMC__SPEC_IF_INT(...) __VA_ARGS__
#define RMMC__SPEC_IF_DOUBLE(...) __VA_ARGS__
#define RMMC__SPEC_IF_BOOL(...) __VA_ARGS__
#define RMMC__SPEC_IF_STRING(...) __VA_ARGS__
#define RMMC__SPEC_IF_NOSPEC(...)

#define RMMC__SPEC_MAX_ARGS 24
/* The longest spec, in characters: it bounds every value too (a logging
 * path, a list of 64 bins). */
#define RMMC__SPEC_MAX_LENGTH 4096

typedef struct rmmc__spec_value {
  const rmmc__spec_option_t *option;
  const char *key;   /* the option's name as written: option->name, or one of its aliases */
  bool is_percent;
  bool boolean;
  long long integer; /* RMMC__OPT_INT, exact */
  size_t bytes;      /* RMMC__OPT_BYTES(_PCT) without '%', exact */
  double number;     /* RMMC__OPT_DOUBLE, or the percentage */
  const char *text;  /* the value as written (NUL-terminated; valid during build) */
} rmmc__spec_value_t;

typedef struct rmmc__spec_args {
  const char *layer; /* the resource's name, for messages */
  int count;
  rmmc__spec_value_t values[RMMC__SPEC_MAX_ARGS];
} rmmc__spec_args_t;

/* Another name a spec may write for an option, kept where a word has been
 * public: `max` for the pool's maximum_size. The parser takes it as the
 * option itself (so giving both is giving it twice); the help lists it.
 * With no_limit set, the option also takes the value `none` (any letter
 * case), stored as no_limit_value: one spelling for "no limit" whatever
 * sentinel the layer's field uses. A row may have a NULL alias, for the
 * value `none` alone. Every layer's rows are in one table
 * (rmmc__spec_aliases, spec_aliases.c), so the words users may have are
 * listed in one place. */
typedef struct rmmc__spec_alias {
  const char *layer; /* the entry's name; NULL ends the table */
  const char *name;  /* the option's name (rmmc__spec_option_t.name) */
  const char *alias; /* the other name, or NULL */
  bool no_limit;
  size_t no_limit_value;
} rmmc__spec_alias_t;

extern const rmmc__spec_alias_t rmmc__spec_aliases[];

typedef struct rmmc__spec_entry {
  const char *name;
  const char *help;
  bool needs_upstream;                 /* false for base resources */
  const rmmc__spec_option_t *options;  /* terminated by {NULL} */
  rmmc_status_t (*build)(const rmmc__spec_args_t *args, rmmc_resource_t *upstream,
                         int device, rmmc_resource_t **out);
} rmmc__spec_entry_t;

/* Accessors (spec_options.c, apart from the parser so that a resource does
 * not link it): each returns true if the option was given and stores it.
 * Values are exact: the parser refuses an integer outside long long, a size
 * of 2^64 bytes or more and a number that is not finite, quoting what was
 * written (RMMC_ERROR_PARSE). */
const rmmc__spec_value_t *rmmc__spec_find(const rmmc__spec_args_t *args, const char *name);
bool rmmc__spec_int(const rmmc__spec_args_t *args, const char *name, long long *out);
/* An integer option the layer takes in [lo, hi]: RMMC_SUCCESS with *out
 * set (left alone if the option is absent), or RMMC_ERROR_INVALID_ARGUMENT
 * with "<layer>: <name>=<value as written> is out of range (<lo> to <hi>)".
 * The one range check of every integer option. */
rmmc_status_t rmmc__spec_int_in(const rmmc__spec_args_t *args, const char *name, long long lo,
                                long long hi, long long *out);
bool rmmc__spec_double(const rmmc__spec_args_t *args, const char *name, double *out);
bool rmmc__spec_bool(const rmmc__spec_args_t *args, const char *name, bool *out);
const char *rmmc__spec_string(const rmmc__spec_args_t *args, const char *name);

/* The range of a row described as data, as the help and the messages
 * write it ("256 to 1073741824", "0 to 1"), into buf; "" for a row without
 * one, or whose values a spec does not write as numbers (BOOL, STRING). */
void rmmc__spec_range_text(const rmmc__spec_option_t *o, char *buf, size_t len);

/* The generic builder: stores every option of `table` that args hold into
 * the options struct at `options` (the field of each row; rows without one
 * are the caller's), with the row's range checked (integers through
 * rmmc__spec_int_in; sizes, after a percentage is resolved, and numbers in
 * the same words: "<layer>: <name>=<value as written> is out of range
 * (<min> to <max>)") and the percentages of rmmc__spec_bytes. Fields of options not given keep their
 * values. RMMC_SUCCESS, or the first error (message set). */
rmmc_status_t rmmc__spec_fill(const rmmc__spec_args_t *args, const rmmc__spec_option_t *table,
                              const rmmc_resource_t *upstream, void *options);

/* A bytes or percentage option, resolved: a percentage is of the free
 * memory of the device `upstream` serves (device-kind memory) or of the
 * host's physical memory (host-kind memory). Returns RMMC_SUCCESS and leaves
 * *out alone if the option is absent. */
rmmc_status_t rmmc__spec_bytes(const rmmc__spec_args_t *args, const char *name,
                               const rmmc_resource_t *upstream, size_t *out);

/* Parses "64KiB", "1.5GiB", "1024", "64 MiB" (bytes; binary units; no
 * percentage; spec_options.c): RMMC_SUCCESS, or RMMC_ERROR_PARSE with
 * *too_large (may be NULL) saying whether the text was a size, only one of
 * 2^64 bytes or more. Sets no message. */
rmmc_status_t rmmc__parse_bytes(const char *text, size_t len, size_t *out, bool *too_large);

/* Called once by rmmc__stack_create_hooked() with the innermost (base)
 * layer, borrowed, just after it is built; stores in *out a new reference to
 * the resource the next layer is to be built on (typically a wrapper that
 * retains `base`). A failure status stops the build: nothing is kept. */
typedef rmmc_status_t (*rmmc__stack_hook_fn)(void *ctx, rmmc_resource_t *base,
                                              rmmc_resource_t **out);

/* rmmc_stack_create() with `hook` (may be NULL) placed around the base
 * layer, so a tool can see everything the stack takes from its base
 * resource (rmmc-replay counts it). Exported for the project's own tools
 * only: declared here, not in a public header, and may change. */
RMMC_API rmmc_status_t rmmc__stack_create_hooked(const char *spec, int device,
                                                 rmmc__stack_hook_fn hook, void *ctx,
                                                 rmmc_resource_t **out);

/* The table of every registered entry, NULL-terminated (spec_table.c). */
extern const rmmc__spec_entry_t *const rmmc__spec_entries[];

#endif /* RMMC_SPEC_INTERNAL_H */
