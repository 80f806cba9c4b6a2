/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The replay engine behind rmmc-replay, compiled into the tool and into
 * tests/test_replay.c (not installed, not part of the library).
 *
 * Three steps. replay_log_read() parses an allocation log in RMM's CSV
 * format into a compact event array, checking it as it goes (every free
 * matches a live allocation, no pointer is live twice, sizes parse), so
 * replaying needs no lookups. replay_run() builds a stack from a spec with
 * a meter around its base layer, replays every event on it and measures
 * what the stack took from its base (peak reserved), failures and the time
 * per call; it never reads or writes the memory it gets, so it runs on the
 * sim resource too. replay_write_json/svg/table() report the results.
 *
 * The log. A header line names the columns (any order, names matched
 * without regard to case); Action, Pointer and Size are required, Thread,
 * Time and Stream optional (0 when absent). Action is `allocate`, `free`
 * (or `deallocate`) or `allocate failure`; Pointer and Stream are hex with
 * or without 0x (`(nil)` is 0); Size and Thread are decimal; Time is
 * integer microseconds (rmmc's and the project's traces), RMM's
 * `HH:MM:SS.ffffff` (spdlog's `%H:%M:%S.%f`, also with ':' before the
 * microseconds as RMM's replay benchmark reads it), or seconds with a
 * fraction. Time is checked and only used to report the span of the log:
 * events replay in the order of the lines. `allocate failure` lines are
 * counted, not replayed (as RMM's replay benchmark does). Lines whose
 * pointer is 0 (an allocation of 0 bytes, a free of NULL) are no-ops,
 * counted and not replayed.
 *
 * Threads. A log with several threads replays on one thread per logged
 * thread, in the global order of the log: a thread runs its next event
 * only once the event before it (on any thread) has completed, and hands
 * the turn straight to the owner of the next event. Figures therefore come
 * out the same on every run, and each layer still sees the calling thread
 * the application used (per-thread caches, per-stream lists).
 *
 * Streams. Logged streams map to real CUDA streams (0: the legacy default
 * stream, 1: cudaStreamLegacy, 2: cudaStreamPerThread, others: one new
 * non-blocking stream each) when the stack's memory is not host memory and
 * a GPU is present; over host memory (host, sim) the logged values are
 * passed through as opaque keys.
 *
 * Errors come back as an rmmc_status_t with the detail in
 * rmmc_last_error_message(), as in the library. Not thread-safe: one
 * thread drives the engine (it starts its own replay threads).
 */
#ifndef RMMC_REPLAY_ENGINE_H
#define RMMC_REPLAY_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rmmc/rmmc.h"

/* The most threads a log may name. */
#define REPLAY_MAX_THREADS 1024

/* The largest allocation, and the most bytes live at once, a log may have
 * (4 EiB): every stack it can be replayed on (sim's address space holds
 * 2^63 - 2^48 bytes) serves that much, and every figure derived from live
 * bytes fits 64 bits. A line going past it is a bad size. */
#define REPLAY_MAX_BYTES ((uint64_t)1 << 62)

/* X(NAME, key, description): what a bad line can be. `key` names the count
 * in JSON. */
#define REPLAY_ISSUE_MAP(X)                                                                     \
  X(MALFORMED, "malformed", "malformed line")                                                  \
  X(MISSING_COLUMNS, "missing_columns", "missing columns")                                     \
  X(BAD_SIZE, "bad_size", "bad size")                                                          \
  X(UNKNOWN_POINTER, "unknown_pointer", "free of an unknown pointer")                          \
  X(DUPLICATE_POINTER, "duplicate_pointer", "allocation of a pointer that is already live")    \
  X(SIZE_MISMATCH, "size_mismatch", "free with another size than its allocation")

typedef enum replay_issue {
#define REPLAY_ISSUE_ENUM_(name, key, text) REPLAY_ISSUE_##name,
  REPLAY_ISSUE_MAP(REPLAY_ISSUE_ENUM_)
#undef REPLAY_ISSUE_ENUM_
  REPLAY_ISSUE_COUNT
} replay_issue_t;

/* The JSON key ("unknown_pointer") and description of an issue. */
const char *replay_issue_key(replay_issue_t issue);
const char *replay_issue_text(replay_issue_t issue);

enum { REPLAY_ALLOCATE = 0, REPLAY_FREE = 1 };

/* One replayed event. For a free, `size` is its allocation's size. */
typedef struct replay_event {
  uint64_t size;
  uint32_t slot;   /* the allocation it creates or ends: 0 .. nslots-1 */
  uint32_t stream; /* index into stream_ids */
  uint16_t thread; /* index into thread_ids */
  uint8_t action;  /* REPLAY_ALLOCATE or REPLAY_FREE */
} replay_event_t;

typedef struct replay_log {
  char *name;              /* the path (or name) given, for messages */
  replay_event_t *events;  /* in the order of the log */
  size_t nevents;
  uint32_t nslots;         /* allocations (each allocate event has one) */
  uint64_t *thread_ids;    /* logged thread ids, by first appearance */
  uint32_t nthreads;
  uint64_t *stream_ids;    /* logged stream values, by first appearance */
  uint32_t nstreams;
  uint64_t allocations, frees;
  uint64_t logged_failures;   /* `allocate failure` lines */
  uint64_t null_events;       /* lines with pointer 0: no-ops */
  uint64_t peak_live;         /* the highest sum of live bytes: the floor */
  size_t peak_event;          /* the event after which it was first reached */
  uint64_t live_at_end;       /* bytes still live after the last line */
  uint64_t outstanding_at_end;
  uint64_t skipped[REPLAY_ISSUE_COUNT]; /* lines skipped (lenient mode) */
  uint64_t lines;             /* lines read, the header included */
  bool has_time;
  int64_t first_time_us, last_time_us;
} replay_log_t;

/* How the input is decompressed: zlib where it was built in (it also reads
 * plain files), or `gzip -dc` through popen for a gzip file. AUTO picks
 * zlib when available; COMMAND forces the command (tests use it). */
typedef enum replay_input {
  REPLAY_INPUT_AUTO = 0,
  REPLAY_INPUT_COMMAND = 1,
} replay_input_t;

typedef struct replay_read_options {
  size_t size;           /* sizeof(replay_read_options_t) */
  bool lenient;          /* count and skip bad lines instead of failing */
  replay_input_t input;
  FILE *warnings;        /* lenient mode names skipped lines here (NULL: no) */
  unsigned max_warnings; /* at most this many (then a count) */
  FILE *progress;        /* about once a second while reading, a line on how far (NULL: no) */
} replay_read_options_t;

#define REPLAY_READ_OPTIONS_INIT \
  {sizeof(replay_read_options_t), false, REPLAY_INPUT_AUTO, NULL, 10, NULL}

/* True if the engine was built with zlib. */
bool replay_have_zlib(void);

/* Reads and checks the log at `path` (plain or gzip, by content). On
 * success *out holds the log (free with replay_log_free). RMMC_ERROR_IO if
 * the file cannot be read or decompressed; RMMC_ERROR_PARSE for a missing
 * or incomplete header, or, unless lenient, the first bad line: the message
 * reads "PATH:LINE: what" and quotes the line; RMMC_ERROR_OUT_OF_MEMORY. */
rmmc_status_t replay_log_read(const char *path, const replay_read_options_t *options,
                              replay_log_t **out);

/* The same for a log held in memory (`len` bytes of `text`); `name` is used
 * in messages. */
rmmc_status_t replay_log_parse(const char *text, size_t len, const char *name,
                               const replay_read_options_t *options, replay_log_t **out);

void replay_log_free(replay_log_t *log);

/* The live bytes of the log in `nbuckets` buckets of events: bucket b holds
 * the highest live sum after any event e with e * nbuckets / nevents == b.
 * nbuckets must not exceed nevents. */
void replay_log_live_series(const replay_log_t *log, size_t nbuckets, uint64_t *out);

typedef struct replay_options {
  size_t size;       /* sizeof(replay_options_t) */
  int device;        /* GPU for device stacks (-1: current) */
  size_t buckets;    /* points of the reserved series (0: none; capped at nevents) */
  bool threads;      /* one thread per logged thread (false: all on the caller's) */
  FILE *status;      /* the stack's status report after the last event goes here (NULL: none) */
  bool warm;         /* replay once untimed on the same stack before the timed replay */
  /* Called on the driving thread before each pass, with no call in flight
   * and nothing of the log live: pass 0 is a warm replay's untimed one,
   * pass 1 the timed one (so a resource's own figures can be read or reset
   * at an epoch's start). NULL: none. */
  void (*epoch)(void *ctx, int pass);
  void *epoch_ctx;
} replay_options_t;

#define REPLAY_OPTIONS_INIT {sizeof(replay_options_t), -1, 0, true, NULL, false, NULL, NULL}

/* The longest message rmmc keeps (its thread-local error message, whose
 * out-of-memory form lists every layer's figures): first_failure holds it
 * whole (replay_engine.c checks the two agree). */
#define REPLAY_MESSAGE_MAX 1024

typedef struct replay_result {
  char *stack;               /* the spec, or the resource's name */
  char base[32];             /* the base (innermost) layer's name */
  rmmc_memory_kind_t kind;   /* memory kind of the stack */
  bool simulated;            /* the base is sim: no memory behind the pointers */
  bool real_streams;         /* logged streams were mapped to CUDA streams */
  uint32_t threads;          /* replay threads used */
  uint64_t events;           /* events replayed */
  uint64_t calls;            /* allocate/deallocate calls made and timed */
  uint64_t failures;         /* allocations the stack refused */
  uint64_t free_errors;      /* deallocations the stack refused */
  uint64_t skipped_frees;    /* frees not made: their allocation had failed */
  bool has_reserved;         /* the figures below were measured */
  uint64_t peak_reserved;    /* highest bytes taken from the base at once */
  uint64_t end_reserved;     /* bytes taken from the base after the last event */
  bool has_base_peak;
  uint64_t base_peak;        /* the base's own "peak" figure, if it reports one */
  uint64_t total_ns;         /* time inside the calls, timer cost removed */
  double ns_per_call;
  uint64_t upstream_calls;   /* calls the stack made into its base (metered stacks) */
  uint64_t upstream_ns;      /* time inside them (part of total_ns) */
  double own_ns_per_call;    /* (total_ns - upstream_ns) / calls: the stack's own cost */
  unsigned repeats;          /* replays timed (rmmc-replay --repeat): ns figures are medians */
  double ns_per_call_min;    /* the fastest replay's ns_per_call */
  bool warm;                 /* timed on a stack that had replayed the log once already */
  uint64_t *reserved_series; /* nbuckets points (as replay_log_live_series) */
  size_t nbuckets;
  char first_failure[REPLAY_MESSAGE_MAX + 32]; /* the first refused allocation: event and message */
  char error[512];           /* why the stack could not be replayed ("" if it was) */
} replay_result_t;

/* Builds the stack `spec` (rmmc_stack_create's form) with a meter between
 * its base and the layer above, replays `log` on it, frees what the log
 * leaves live, releases the stack and fills *out (release with
 * replay_result_fini). Allocation failures are results, not errors.
 * Returns the stack's build status (with out->error set) or
 * RMMC_ERROR_OUT_OF_MEMORY / RMMC_ERROR_CUDA / RMMC_ERROR_INTERNAL if the
 * replay itself cannot run. */
rmmc_status_t replay_run(const replay_log_t *log, const char *spec,
                         const replay_options_t *options, replay_result_t *out);

/* Replays on a resource the caller built (borrowed); without a meter, so
 * has_reserved is false. For tests that stack adaptors by hand. */
rmmc_status_t replay_run_resource(const replay_log_t *log, rmmc_resource_t *r,
                                  const replay_options_t *options, replay_result_t *out);

void replay_result_fini(replay_result_t *result);

/* Human-readable bytes ("10.60 GiB", "512 B") into buf; returns buf. */
const char *replay_format_bytes(uint64_t bytes, char *buf, size_t len);

/* The reports. Each writes to `f` and returns RMMC_ERROR_IO if writing
 * fails. Results with an error are listed as such (JSON, table) or left
 * out (SVG). */
void replay_write_table(FILE *f, const replay_log_t *log, const replay_result_t *results,
                        size_t n);
/* A JSON array, one record per result: stack, upstream, upstream_kind,
 * simulated, threads, events, calls, failures, logged_failures,
 * peak_live_bytes, peak_reserved_bytes, ratio, ns_per_call, skipped {kind:
 * count}, and more (tools/rmmc-replay.c's usage lists them). */
rmmc_status_t replay_write_json(FILE *f, const replay_log_t *log,
                                const replay_result_t *results, size_t n);
/* An SVG chart of bytes over the event index: exactly one <path
 * class="series"> per drawn line and no other <path>: first the live line
 * (data-series="live", shared by every stack), then one reserved line per
 * replayed result (data-series="reserved", data-stack="SPEC") in order;
 * labelled axes with human-readable sizes and a legend. Results need a
 * reserved series (options.buckets > 0). */
rmmc_status_t replay_write_svg(FILE *f, const replay_log_t *log,
                               const replay_result_t *results, size_t n);

#endif /* RMMC_REPLAY_ENGINE_H */
