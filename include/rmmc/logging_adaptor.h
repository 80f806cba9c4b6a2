/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The logging adaptor: one CSV line per allocation event, in RMM's format.
 *
 * The log starts with RMM's header and has one line per event:
 *
 *   Thread,Time,Action,Pointer,Size,Stream
 *   48213,14:03:07.123456,allocate,0x7f3a5c000000,1048576,0x0
 *   48213,14:03:07.123901,free,0x7f3a5c000000,1048576,0x0
 *   48214,14:03:07.124010,allocate failure,0x0,1099511627776,0x55d0c2a1e6f0
 *
 * Thread is the operating-system thread id (what RMM's spdlog %t writes);
 * Time is the local wall-clock time of day with microseconds, as RMM
 * writes it (or, with RMMC_LOGGING_TIME_MICROSECONDS, integer microseconds
 * since the Unix epoch); Action is `allocate`, `free` or `allocate failure`;
 * Pointer is hexadecimal with 0x (0x0 for a failure); Size is the byte
 * count the caller asked for; Stream is the cudaStream_t's value in
 * hexadecimal with 0x (0x0 for the legacy default stream). RMM's replay
 * benchmark (log_parser.hpp) reads these logs: it parses Pointer in base 16
 * and Thread, Size and Stream with std::stoul, and ignores Time.
 *
 * A `free` line is written before the upstream is called (as RMM does), so
 * that in the log a free always comes before any later allocation that
 * gets the same address; a free the upstream refuses still has its line.
 * An `allocate` line is written after the upstream returned.
 *
 * Lines are formatted on the caller's stack without stdio and appended to a
 * shared buffer under a short mutex, so lines from many threads never
 * interleave; the buffer is written out when full, at
 * rmmc_logging_adaptor_flush(), at destroy, or after every event with
 * `flush_each`. A failed write never fails an allocation: it is counted and
 * reported by the next flush.
 *
 * Stack spec: `logging(path=/tmp/alloc.csv, flush=true, time=us)`.
 * Thread-safe; streams are passed to the upstream unchanged.
 */
#ifndef RMMC_LOGGING_ADAPTOR_H
#define RMMC_LOGGING_ADAPTOR_H

#include <stdbool.h>
#include <stdio.h> /* FILE, for rmmc_logging_adaptor_create_file */

#include "rmmc/options.h"
#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the Time column is written. */
typedef enum rmmc_logging_time {
  RMMC_LOGGING_TIME_CLOCK = 0,        /* 14:03:07.123456, local time of day (RMM's format) */
  RMMC_LOGGING_TIME_MICROSECONDS = 1, /* 1718200987123456, microseconds since the epoch */
} rmmc_logging_time_t;

/* The logging options, once, in struct order: each row gives the field's
 * C type, name, default (the _INIT value), range for the create (min, max;
 * 0, 0: none), then its stack-spec option (rmmc/options.h: the columns). */
#define RMMC_LOGGING_OPTIONS(X)                                                                    \
  /* write every line out at once (default false) */                                               \
  X(bool, flush_each, false, 0, 0, "flush", BOOL, BOOL, "false: at flush and destroy", "",         \
    "write every line out at once")                                                                \
  /* default RMMC_LOGGING_TIME_CLOCK */                                                            \
  X(rmmc_logging_time_t, time, RMMC_LOGGING_TIME_CLOCK, 0, 0, "time", STRING, NONE, "clock", "",   \
    "clock (RMM's HH:MM:SS.us) or us (microseconds since epoch)")

typedef struct rmmc_logging_options {
  size_t size; /* sizeof(rmmc_logging_options_t) */
  RMMC_LOGGING_OPTIONS(RMMC_OPTION_FIELD)
} rmmc_logging_options_t;

#define RMMC_LOGGING_OPTIONS_INIT \
  {sizeof(rmmc_logging_options_t) RMMC_LOGGING_OPTIONS(RMMC_OPTION_DEFAULT)}

/* Creates a logging adaptor over `upstream` (retained) that writes to the
 * file at `path`, created or truncated (as RMM does), and closed at
 * destroy; the header line is written first. NULL options mean defaults.
 * One reference in *out. RMMC_ERROR_INVALID_ARGUMENT for a NULL upstream,
 * path or out, or an unknown time format; RMMC_ERROR_IO if the file cannot
 * be opened (the message names it and says why); RMMC_ERROR_OUT_OF_MEMORY.
 * Two adaptors must not write to one path. */
RMMC_EXPORT rmmc_status_t rmmc_logging_adaptor_create(rmmc_resource_t *upstream, const char *path,
                                                      const rmmc_logging_options_t *options,
                                                      rmmc_resource_t **out);

/* The same, writing to `file`, which is borrowed: it must stay open until
 * the adaptor is destroyed (which flushes it but does not close it), and
 * nobody else should write to it meanwhile. */
RMMC_EXPORT rmmc_status_t rmmc_logging_adaptor_create_file(rmmc_resource_t *upstream, FILE *file,
                                                           const rmmc_logging_options_t *options,
                                                           rmmc_resource_t **out);

/* Writes out every line logged so far (and fflush()es a FILE).
 * RMMC_ERROR_INVALID_ARGUMENT if r is not a logging adaptor; RMMC_ERROR_IO
 * if a write failed since the last flush (the message says how many and
 * why; those lines are lost). Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_logging_adaptor_flush(rmmc_resource_t *r);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_LOGGING_ADAPTOR_H */
