/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Options tables: how each resource's options are written once.
 *
 * Every options struct of the library (rmmc_pool_options_t and the others)
 * is made from one X-macro table in its header, RMMC_<NAME>_OPTIONS(X):
 * one row per field after `size`, in struct order, each row documented
 * where it is written. A row has the columns
 *
 *   X(type, field, default, min, max, key, spec, store, help_default, unit, help)
 *
 * type and field declare the member; default is its value in the _INIT
 * macro; min and max bound what the create accepts, in the field's own
 * kind of number (integers exact to the type's ends, SIZE_MAX included;
 * doubles as doubles: 0.0, 1.0), and the spec parser and the help take the
 * same bounds (0, 0: no range is checked); key is the word stack specs use (`pool(initial=1GiB)`; NULL:
 * the field is no spec option), spec how a spec writes the value (BYTES,
 * BYTES_PCT, INT, DOUBLE, BOOL, STRING; NOSPEC for no option), store how the
 * library stores it in the field (SIZE, DOUBLE, BOOL, INT, UNSIGNED; NONE:
 * the layer reads it itself), and help_default, unit and help are what the
 * stack help (rmmc_stack_help_resource) prints for it.
 *
 * The two expansions here make the struct's members and its _INIT
 * initializer; the library makes its spec tables, help and range checks
 * from the same rows.
 */
#ifndef RMMC_OPTIONS_H
#define RMMC_OPTIONS_H

/* A row as a struct member: `type field;`. */
#define RMMC_OPTION_FIELD(type, field, ...) type field;

/* A row as the next value of a positional _INIT initializer: `, default`. */
#define RMMC_OPTION_DEFAULT(type, field, default_, ...) , default_

#endif /* RMMC_OPTIONS_H */
