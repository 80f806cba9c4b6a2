/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc-replay: replays an allocation log in RMM's CSV format against
 * memory-resource stacks and reports, per stack, what the application held
 * at its peak (live), what the stack took from its upstream at its peak
 * (reserved), their ratio, failures and the time per call.
 *
 * The work is done by the replay engine (replay_engine.h); this file reads
 * the command line, picks the default stacks for the machine and writes
 * the reports.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "replay_engine.h"

#define MAX_STACKS 64

static void usage(FILE *f) {
  fputs(
      "usage: rmmc-replay [--stack SPEC]... [--json FILE] [--svg FILE] [options] LOG\n"
      "\n"
      "Replays LOG, an allocation log in RMM's CSV format (header\n"
      "Thread,Time,Action,Pointer,Size,Stream; actions allocate, free, allocate failure;\n"
      "plain or gzip), against each stack and reports per stack: events replayed,\n"
      "failed allocations, peak live bytes (what the application held: the floor),\n"
      "peak reserved bytes (what the stack took from its base upstream), their ratio\n"
      "and the mean time per allocate/deallocate call. The memory is never touched.\n"
      "\n"
      "  --stack SPEC     a stack to replay on, outermost first (repeatable), e.g.\n"
      "                   'pool(initial=1GiB) > cuda' or 'sim(capacity=80GiB)'\n"
      "  --upstream SPEC  the base the default stacks use (default: cuda on a GPU,\n"
      "                   host without one; sim when the log's peak does not fit)\n"
      "  --json FILE      write an array of records, one per stack: stack, log,\n"
      "                   upstream, upstream_kind, simulated, real_streams, threads,\n"
      "                   logged_threads, streams, events, calls, failures, free_errors,\n"
      "                   skipped_frees, logged_failures, peak_live_bytes,\n"
      "                   peak_reserved_bytes, end_reserved_bytes, ratio,\n"
      "                   upstream_reported_peak_bytes (if the base reports one),\n"
      "                   live_at_end_bytes, outstanding_at_end, ns_per_call,\n"
      "                   total_call_ns, first_failure, null_events, skipped_total,\n"
      "                   skipped {malformed, missing_columns, bad_size,\n"
      "                   unknown_pointer, duplicate_pointer, size_mismatch};\n"
      "                   a stack that could not be built has stack, log and error\n"
      "  --svg FILE       draw live and reserved bytes over the event index\n"
      "  --lenient        skip bad lines, counting them by kind, instead of stopping\n"
      "  --single-thread  replay every event on one thread (default: one per logged\n"
      "                   thread, in the log's global order)\n"
      "  --device N       the GPU for device stacks (default: the current one)\n"
      "  --warm           replay the log once untimed on each stack before the timed\n"
      "                   replay (the steady state of a second epoch); peak reserved\n"
      "                   covers both\n"
      "  --status         print each stack's status report (every layer's figures)\n"
      "                   after the last event\n"
      "  --repeat N       replay each stack N times, each on a fresh stack, and report\n"
      "                   the median time per call (memory figures: the first replay;\n"
      "                   default 1)\n"
      "  --list           list the resources and options stack specs accept\n"
      "  --progress       progress lines on stderr while reading the log and before\n"
      "                   each stack's replay (default: when stderr is a terminal)\n"
      "  --no-progress    no progress lines\n"
      "  -q, --quiet      print only errors (and no progress lines)\n"
      "  -h, --help       this text\n"
      "  --version        print the version and exit\n"
      "\n"
      "Default stacks: the base alone (ratio 1: a plain upstream takes exactly what is\n"
      "asked), then pool, pool(expandable=true) and arena over it. Exit status: 0, 1 if a\n"
      "stack could not be built or replayed, 2 for bad usage, a bad log or an output\n"
      "file that cannot be written (--json and --svg are opened before the replay).\n",
      f);
}

static size_t host_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

/* Says (unless quiet) that the log's peak exceeds `what`, `memory` bytes,
 * so the default stacks replay over the simulated upstream. */
static void say_sim(const replay_log_t *log, const char *prefix, const char *what, size_t memory,
                    bool quiet) {
  char a[32], b[32];
  if (!quiet)
    printf("%sthe log's peak (%s) exceeds %s (%s): replaying over a simulated upstream (sim: "
           "address ranges, no memory)\n",
           prefix, replay_format_bytes(log->peak_live, a, sizeof a), what,
           replay_format_bytes(memory, b, sizeof b));
}

/* Picks the base for the default stacks and says why. */
static const char *pick_base(const replay_log_t *log, int device, bool quiet) {
  if (rmmc_device_count() > 0) {
    size_t free_b = 0, total_b = 0;
    if (rmmc_device_memory_info(device, &free_b, &total_b) == RMMC_SUCCESS &&
        log->peak_live > free_b) {
      say_sim(log, "", "the GPU's free memory", free_b, quiet);
      return "sim";
    }
    if (!quiet) printf("GPU present: replaying over cuda memory\n");
    return "cuda";
  }
  size_t host = host_memory();
  if (host > 0 && log->peak_live > host / 2) {
    say_sim(log, "no GPU; ", "half the host's memory", host, quiet);
    return "sim";
  }
  if (!quiet) printf("no GPU: replaying over host memory\n");
  return "host";
}

static void describe_log(const replay_log_t *log) {
  char a[32];
  printf("%s: %zu events (%llu allocations, %llu frees) on %u thread%s and %u stream%s; "
         "peak live %s at event %zu",
         log->name, log->nevents, (unsigned long long)log->allocations,
         (unsigned long long)log->frees, log->nthreads, log->nthreads == 1 ? "" : "s",
         log->nstreams, log->nstreams == 1 ? "" : "s",
         replay_format_bytes(log->peak_live, a, sizeof a), log->peak_event);
  if (log->has_time && log->last_time_us >= log->first_time_us)
    printf("; spans %.3f s", (double)(log->last_time_us - log->first_time_us) / 1e6);
  printf("\n");
  if (log->logged_failures)
    printf("  %llu 'allocate failure' lines (failed in the application) are not replayed\n",
           (unsigned long long)log->logged_failures);
  if (log->null_events)
    printf("  %llu lines with a null pointer (0-byte allocations, frees of NULL) are no-ops\n",
           (unsigned long long)log->null_events);
  if (log->outstanding_at_end)
    printf("  %llu allocations (%s) are still live at the end of the log: freed after the "
           "replay, untimed\n",
           (unsigned long long)log->outstanding_at_end,
           replay_format_bytes(log->live_at_end, a, sizeof a));
  for (int k = 0; k < REPLAY_ISSUE_COUNT; k++)
    if (log->skipped[k])
      printf("  skipped %llu line%s: %s\n", (unsigned long long)log->skipped[k],
             log->skipped[k] == 1 ? "" : "s", replay_issue_text((replay_issue_t)k));
}

typedef rmmc_status_t (*report_fn)(FILE *f, const replay_log_t *log,
                                   const replay_result_t *results, size_t n);

/* Opens an output file before the replay, so a path that cannot be written
 * fails at once rather than after minutes of replaying. NULL after saying
 * why. */
static FILE *open_output(const char *flag, const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) fprintf(stderr, "rmmc-replay: %s: cannot write %s: %s\n", flag, path, strerror(errno));
  return f;
}

/* Writes a report into f (from open_output) and closes it. */
static bool write_report(FILE *f, const char *path, report_fn write, const replay_log_t *log,
                         const replay_result_t *results, size_t n) {
  bool ok = write(f, log, results, n) == RMMC_SUCCESS;
  ok = fclose(f) == 0 && ok;
  if (!ok) fprintf(stderr, "rmmc-replay: writing %s failed\n", path);
  return ok;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Replays `spec` repeat - 1 more times, each on a fresh stack, and puts the
 * medians (and the fastest) of the time figures into *first. */
static bool median_of_repeats(const replay_log_t *log, const char *spec,
                              const replay_options_t *opts, unsigned repeat,
                              replay_result_t *first) {
  double *all = malloc(2 * (size_t)repeat * sizeof *all);
  if (all == NULL) return false;
  double *own = all + repeat;
  all[0] = first->ns_per_call;
  own[0] = first->own_ns_per_call;
  replay_options_t o = *opts;
  o.buckets = 0;
  o.status = NULL;
  bool ok = true;
  for (unsigned k = 1; k < repeat && ok; k++) {
    replay_result_t r;
    ok = replay_run(log, spec, &o, &r) == RMMC_SUCCESS;
    all[k] = r.ns_per_call;
    own[k] = r.own_ns_per_call;
    replay_result_fini(&r);
  }
  if (ok) {
    qsort(all, repeat, sizeof *all, cmp_double);
    qsort(own, repeat, sizeof *own, cmp_double);
    first->ns_per_call = all[repeat / 2];
    first->own_ns_per_call = own[repeat / 2];
    first->ns_per_call_min = all[0];
    first->repeats = repeat;
  }
  free(all);
  return ok;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"stack", required_argument, NULL, 's'},  {"upstream", required_argument, NULL, 'u'},
      {"json", required_argument, NULL, 'j'},   {"svg", required_argument, NULL, 'g'},
      {"lenient", no_argument, NULL, 'l'},      {"single-thread", no_argument, NULL, '1'},
      {"device", required_argument, NULL, 'd'}, {"list", no_argument, NULL, 'L'},
      {"quiet", no_argument, NULL, 'q'},        {"help", no_argument, NULL, 'h'},
      {"repeat", required_argument, NULL, 'r'},
      {"status", no_argument, NULL, 'S'},
      {"warm", no_argument, NULL, 'W'},
      {"version", no_argument, NULL, 'V'},
      {"progress", no_argument, NULL, 'P'},
      {"no-progress", no_argument, NULL, 'N'},
      {NULL, 0, NULL, 0},
  };
  const char *stacks[MAX_STACKS];
  int nstacks = 0;
  const char *upstream = NULL, *json_path = NULL, *svg_path = NULL;
  bool lenient = false, single = false, quiet = false, status_report = false, warm = false;
  int device = -1, c;
  int show_progress = -1; /* -1: when stderr is a terminal */
  long repeat = 1;
  cli_program = "rmmc-replay";
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":qh", longopts, NULL)) != -1) {
    switch (c) {
    case 's':
      if (nstacks == MAX_STACKS) return cli_usage_error("at most %d --stack options", MAX_STACKS);
      stacks[nstacks++] = optarg;
      break;
    case 'u': upstream = optarg; break;
    case 'j': json_path = optarg; break;
    case 'g': svg_path = optarg; break;
    case 'l': lenient = true; break;
    case '1': single = true; break;
    case 'd': {
      char *end;
      long d = strtol(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || d < 0 || d >= RMMC_REGISTRY_MAX_DEVICES)
        return cli_usage_error("--device wants a device number, not '%s'", optarg);
      device = (int)d;
      break;
    }
    case 'L': {
      size_t need = rmmc_stack_help(NULL, 0) + 1;
      char *help = malloc(need);
      if (help == NULL) return 2;
      rmmc_stack_help(help, need);
      fputs(help, stdout);
      free(help);
      return 0;
    }
    case 'q': quiet = true; break;
    case 'S': status_report = true; break;
    case 'W': warm = true; break;
    case 'P': show_progress = 1; break;
    case 'N': show_progress = 0; break;
    case 'r': {
      char *end;
      repeat = strtol(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || repeat < 1 || repeat > 1000)
        return cli_usage_error("--repeat wants a count from 1 to 1000, not '%s'", optarg);
      break;
    }
    case 'h': usage(stdout); return 0;
    case 'V': return cli_print_version();
    default: return cli_bad_option(c, argv);
    }
  }
  if (optind == argc) return cli_usage_error("no log given");
  if (optind < argc - 1) return cli_usage_error("one log only ('%s' is a second)", argv[optind + 1]);
  const char *path = argv[optind];
  for (int i = 0; i < nstacks; i++)
    if (rmmc_stack_validate(stacks[i]) != RMMC_SUCCESS)
      return cli_usage_error("--stack: %s", rmmc_last_error_message());
  if (upstream != NULL && rmmc_stack_validate(upstream) != RMMC_SUCCESS)
    return cli_usage_error("--upstream: %s", rmmc_last_error_message());
  FILE *json_file = NULL, *svg_file = NULL;
  if (json_path != NULL && (json_file = open_output("--json", json_path)) == NULL) return 2;
  if (svg_path != NULL && (svg_file = open_output("--svg", svg_path)) == NULL) {
    if (json_file != NULL) fclose(json_file);
    return 2;
  }

  replay_read_options_t ropts = REPLAY_READ_OPTIONS_INIT;
  ropts.lenient = lenient;
  ropts.warnings = stderr;
  if (show_progress < 0) show_progress = !quiet && isatty(fileno(stderr));
  if (quiet) show_progress = 0;
  ropts.progress = show_progress ? stderr : NULL;
  replay_log_t *log;
  rmmc_status_t st = replay_log_read(path, &ropts, &log);
  if (st != RMMC_SUCCESS) {
    fprintf(stderr, "rmmc-replay: %s\n", rmmc_last_error_message());
    if (st == RMMC_ERROR_PARSE && !lenient && strstr(rmmc_last_error_message(), "header") == NULL)
      fprintf(stderr, "rmmc-replay: --lenient skips bad lines and counts them\n");
    if (json_file != NULL) fclose(json_file);
    if (svg_file != NULL) fclose(svg_file);
    return 2;
  }
  if (!quiet) describe_log(log);

  /* The default stacks: the base, then each sub-allocator this build has. */
  char specs[4][4200]; /* a spec is at most 4096 characters */
  if (nstacks == 0) {
    const char *base = upstream != NULL ? upstream : pick_base(log, device, quiet);
    const char *forms[] = {"%s", "pool > %s", "pool(expandable=true) > %s", "arena > %s"};
    for (int i = 0; i < 4; i++) {
      snprintf(specs[i], sizeof specs[i], forms[i], base);
      if (i == 0 || rmmc_stack_validate(specs[i]) == RMMC_SUCCESS) stacks[nstacks++] = specs[i];
    }
  } else if (!quiet && rmmc_device_count() == 0) {
    printf("no GPU: only stacks over host memory (host, sim) can be replayed here\n");
  }

  replay_result_t *results = calloc((size_t)nstacks, sizeof *results);
  if (results == NULL) {
    fprintf(stderr, "rmmc-replay: no host memory\n");
    replay_log_free(log);
    if (json_file != NULL) fclose(json_file);
    if (svg_file != NULL) fclose(svg_file);
    return 2;
  }
  replay_options_t opts = REPLAY_OPTIONS_INIT;
  opts.device = device;
  opts.threads = !single;
  opts.buckets = svg_path != NULL ? 1000 : 0;
  opts.status = status_report ? stdout : NULL;
  opts.warm = warm;
  int status = 0;
  for (int i = 0; i < nstacks; i++) {
    if (show_progress) {
      fprintf(stderr, "rmmc-replay: replaying [%d/%d] %s: %zu events, %ld time(s)%s\n", i + 1,
              nstacks, stacks[i], log->nevents, repeat, warm ? ", each after a warm-up" : "");
      fflush(stderr);
    }
    if (replay_run(log, stacks[i], &opts, &results[i]) != RMMC_SUCCESS) {
      fprintf(stderr, "rmmc-replay: %s: %s\n", stacks[i], results[i].error);
      status = 1;
    } else if (repeat > 1 && !median_of_repeats(log, stacks[i], &opts, (unsigned)repeat, &results[i])) {
      fprintf(stderr, "rmmc-replay: %s: a repeated replay failed: %s\n", stacks[i],
              rmmc_last_error_message());
      status = 1;
    } else if (!quiet && results[i].simulated) {
      printf("%s: simulated upstream: the pointers have no memory behind them\n", stacks[i]);
    }
  }
  if (!quiet) replay_write_table(stdout, log, results, (size_t)nstacks);

  if (json_file != NULL &&
      !write_report(json_file, json_path, replay_write_json, log, results, (size_t)nstacks))
    status = 2;
  if (svg_file != NULL &&
      !write_report(svg_file, svg_path, replay_write_svg, log, results, (size_t)nstacks))
    status = 2;
  for (int i = 0; i < nstacks; i++) replay_result_fini(&results[i]);
  free(results);
  replay_log_free(log);
  return status;
}
