/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc-bench: times allocator stacks side by side, in one run, on identical
 * seeded op sequences, with the baselines (cudaMalloc, cudaMallocAsync on
 * the default pool, malloc called directly) in the same table.
 *
 * This file is the command line, the stack and case lists and the output
 * (table and JSON); bench_engine.c does the measuring and its header says
 * exactly what is timed. Stacks are named in the stack-spec language
 * (rmmc/spec.h), so every resource registered with the parser can be
 * benchmarked without changes here.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench_engine.h"
#include "cli.h"
#include "rmmc/rmmc.h"

enum exit_code {
  EXIT_OK = 0,
  EXIT_FAILED = 1, /* a measurement failed */
  EXIT_USAGE = 2,  /* bad command line or spec */
  EXIT_IO = 3,     /* the --json file could not be written */
};

#define MALLOC_NAME "malloc"
#define MAX_STACKS 64
#define MAX_CASES 64
#define MAX_THREAD_COUNTS 16

/* In pieces: ISO C limits one string literal to 4095 characters. */
static const char *const usage_text[] = {
    "Usage: rmmc-bench [options]\n"
    "Times allocator stacks side by side on identical seeded op sequences.\n"
    "\n"
    "Stacks\n"
    "  --stack SPEC      a stack in the stack-spec form, outermost first, e.g.\n"
    "                    'pool > host' or 'statistics > pool(initial=1GiB) > cuda';\n"
    "                    repeatable. '" MALLOC_NAME "' is the built-in baseline calling\n"
    "                    malloc/free directly. Default: host and the sub-allocators\n"
    "                    this build has over cuda (GPU) or host (no GPU); default\n"
    "                    specs this build lacks are skipped with a note.\n"
    "  --skip-invalid    skip a --stack that does not parse (with a note) instead\n"
    "                    of stopping with exit status 2\n"
    "  --baseline NAME   the stack the ratio column divides by (default: the first\n"
    "                    baseline: cuda with a GPU, " MALLOC_NAME " without)\n"
    "  --list            list the resources and options specs accept, and exit\n"
    "Baselines always run: cuda (cudaMalloc/cudaFree), cuda_async(default_pool=true)\n"
    "(cudaMallocAsync/cudaFreeAsync on the device's default pool) and " MALLOC_NAME ".\n"
    "Without a GPU the CUDA baselines are skipped with a note, and so is every\n"
    "stack that needs a GPU.\n"
    "\n"
    ,
    "Cases\n"
    "  --pattern LIST    pair, random (comma-separated or repeated). Default: both,\n"
    "                    or only the one whose options below were given.\n"
    "                    pair: allocate S bytes then free them, repeatedly.\n"
    "                    random: keep L blocks live; each step frees a random live\n"
    "                    block and allocates a size uniform in [min, max] in its place\n"
    "                    (as RMM's random_allocations benchmark).\n"
    "  --size BYTES      pair size, repeatable (default 256 and 1MiB)\n"
    "  --min BYTES       random: smallest size   } given any of these: one random\n"
    "  --max BYTES       random: largest size    } case (defaults 256, 4MiB, 1000);\n"
    "  --live N          random: live blocks     } otherwise 256B-4MiB with 1000\n"
    "                    per thread              } live and 1KiB-64MiB with 200 live\n"
    "  Sizes take B, KiB, MiB, GiB, TiB (256, 64KiB, 1.5MiB).\n"
    "\n"
    "Runs\n"
    "  --threads LIST    thread counts, e.g. 1,16 (default 1). Each thread has its\n"
    "                    own stream (non-blocking CUDA stream on GPU stacks, a\n"
    "                    distinct opaque key on host stacks) and its own sequence\n"
    "                    (seed + thread index).\n"
    "  --one-stream      every thread on one stream instead (thread 0's): threads\n"
    "                    share the stream's state in a stack that keys it by stream\n"
    "  --ops N           calls per thread per timed run (default 100000; rounded\n"
    "                    up to even: a pair or a step is two calls)\n"
    "  --repeat N        timed runs; the median is reported (default 5)\n"
    "  --seed N          sequence seed (default 1)\n"
    "  --budget SEC      time budget of one run (default 0.25; 0: none): a stack\n"
    "                    slower than that runs fewer ops (a prefix of the same\n"
    "                    sequence), marked * in the table\n"
    "  --json FILE       also write the results as a JSON array, one record per\n"
    "                    stack, case and thread count\n"
    "  --quiet           no progress lines on stderr\n"
    "  -h, --help        this text\n"
    "  --version         print the version and exit\n"
    "\n"
    ,
    "What is timed\n"
    "  Per run and thread: the random pattern first fills its live blocks\n"
    "  (untimed); all threads then start together; the clock covers the ops\n"
    "  calls and, on GPU stacks, a cudaStreamSynchronize of the thread's stream\n"
    "  (so work cudaMallocAsync/cudaFreeAsync enqueue is inside); the drain is\n"
    "  untimed. Memory is never touched: bookkeeping cost is what is measured.\n"
    "  ns/call = wall * threads / calls (a call is one allocate or one free);\n"
    "  ops/s = calls of all threads / wall. One untimed warm-up run comes first.\n"
    "  After every run the device is synchronized and the stack's \"in_use\" and\n"
    "  \"outstanding\" figures (where it reports them) must be back to 0.\n"
    "\n"
    "Exit status\n"
    "  0  every measurement passed (stacks skipped for lack of a GPU, or with\n"
    "     --skip-invalid for a bad spec, are not failures)\n"
    "  1  a measurement failed: an allocation or free failed, a CUDA call failed,\n"
    "     a stack's figures were not back to 0, or a stack could not be built;\n"
    "     the table shows FAILED and stderr the whole message\n"
    "  2  bad command line: unknown option, bad value, a --stack spec that does\n"
    "     not parse (the message points at the word), an unknown --baseline\n"
    "  3  the --json file could not be written\n",
    NULL,
};

typedef struct bench_stack {
  const char *spec; /* as given; MALLOC_NAME for the direct baseline */
  bool is_malloc;
  bool baseline;    /* one of the built-in baselines */
  bool unavailable; /* needs a GPU this machine lacks */
} bench_stack_t;

typedef struct bench_case_entry {
  bench_case_t c;
  char label[96];
} case_entry_t;

typedef struct row {
  int stack, kase, threads;
  bool measured;
  bench_result_t res;
  bool has_ratio, has_scaling;
  double ratio, scaling;
  const char *memory;
} row_t;

typedef struct options {
  bench_stack_t stacks[MAX_STACKS];
  int nstacks;
  const char *given_specs[MAX_STACKS];
  int ngiven;
  case_entry_t cases[MAX_CASES];
  int ncases;
  size_t sizes[MAX_CASES];
  int nsizes;
  bool pattern_pair, pattern_random, pattern_given;
  bool random_given;
  size_t min_bytes, max_bytes, live;
  int threads[MAX_THREAD_COUNTS];
  int nthreads;
  size_t ops;
  int repeat;
  uint64_t seed;
  double budget_s;
  bool one_stream;
  const char *json_path;
  const char *baseline_name;
  int baseline;
  bool skip_invalid, quiet;
} options_t;

static void note(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Notes (skipped stacks and baselines) wait until the header is printed,
 * so a command line that turns out bad prints nothing on stdout. */
static char *pending_notes;
static size_t pending_len;
static bool notes_direct;

/* A "# ..." line on stdout, before the table. */
static void note(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (notes_direct) {
    printf("# %s\n", line);
    fflush(stdout);
    return;
  }
  size_t n = strlen(line);
  char *grown = realloc(pending_notes, pending_len + n + 4);
  if (grown == NULL) return; /* a note is not worth failing for */
  pending_notes = grown;
  pending_len += (size_t)sprintf(pending_notes + pending_len, "# %s\n", line);
}

static void flush_notes(void) {
  if (pending_notes != NULL) fputs(pending_notes, stdout);
  free(pending_notes);
  pending_notes = NULL;
  notes_direct = true;
  fflush(stdout);
}

/* The first line of a (possibly multi-line) message. */
static const char *first_line(const char *msg, char *buf, size_t len) {
  size_t n = strcspn(msg, "\n");
  if (n >= len) n = len - 1;
  memcpy(buf, msg, n);
  buf[n] = '\0';
  return buf;
}

/* Spec comparison that ignores whitespace, as the parser does. */
static bool same_spec(const char *a, const char *b) {
  for (;;) {
    while (isspace((unsigned char)*a)) a++;
    while (isspace((unsigned char)*b)) b++;
    if (*a != *b) return false;
    if (*a == '\0') return true;
    a++, b++;
  }
}

static bool parse_threads(const char *text, options_t *o) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    unsigned long long t;
    if (!cli_parse_count("--threads", tok, 1, BENCH_MAX_THREADS, &t)) return false;
    bool seen = false;
    for (int i = 0; i < o->nthreads; i++) seen |= o->threads[i] == (int)t;
    if (seen) continue;
    if (o->nthreads == MAX_THREAD_COUNTS) {
      cli_usage_error("--threads: at most %d thread counts", MAX_THREAD_COUNTS);
      return false;
    }
    o->threads[o->nthreads++] = (int)t;
  }
  return true;
}

static bool parse_patterns(const char *text, options_t *o) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  o->pattern_given = true;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcmp(tok, "pair") == 0) o->pattern_pair = true;
    else if (strcmp(tok, "random") == 0) o->pattern_random = true;
    else {
      cli_usage_error("--pattern: '%s' is not a pattern (pair, random)", tok);
      return false;
    }
  }
  return true;
}

enum {
  OPT_STACK = 256, OPT_BASELINE, OPT_PATTERN, OPT_SIZE, OPT_MIN, OPT_MAX, OPT_LIVE, OPT_OPS,
  OPT_REPEAT, OPT_SEED, OPT_THREADS, OPT_ONE_STREAM, OPT_BUDGET, OPT_JSON, OPT_SKIP_INVALID, OPT_LIST, OPT_QUIET, OPT_VERSION,
};

static const struct option long_options[] = {
    {"stack", required_argument, NULL, OPT_STACK},
    {"baseline", required_argument, NULL, OPT_BASELINE},
    {"pattern", required_argument, NULL, OPT_PATTERN},
    {"size", required_argument, NULL, OPT_SIZE},
    {"min", required_argument, NULL, OPT_MIN},
    {"max", required_argument, NULL, OPT_MAX},
    {"live", required_argument, NULL, OPT_LIVE},
    {"ops", required_argument, NULL, OPT_OPS},
    {"repeat", required_argument, NULL, OPT_REPEAT},
    {"seed", required_argument, NULL, OPT_SEED},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"one-stream", no_argument, NULL, OPT_ONE_STREAM},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"json", required_argument, NULL, OPT_JSON},
    {"skip-invalid", no_argument, NULL, OPT_SKIP_INVALID},
    {"list", no_argument, NULL, OPT_LIST},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static int print_list(void) {
  size_t need = rmmc_stack_help(NULL, 0) + 1;
  char *buf = malloc(need);
  if (buf == NULL) return EXIT_IO;
  rmmc_stack_help(buf, need);
  printf("Resources a stack spec accepts (outermost first: 'pool(initial=1GiB) > cuda'):\n%s",
         buf);
  printf("Built-in baseline (not a spec):\n  %-18s malloc/free called directly\n", MALLOC_NAME);
  free(buf);
  return EXIT_OK;
}

/* Parses argv into o; returns -1 to go on, or an exit status. */
static int parse_options(int argc, char **argv, options_t *o) {
  unsigned long long v;
  bool min_given = false, max_given = false;
  o->min_bytes = 256;
  o->max_bytes = (size_t)4 << 20;
  o->live = 1000;
  o->ops = 100000;
  o->repeat = 5;
  o->seed = 1;
  o->budget_s = 0.25;
  o->baseline = -1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
    switch (c) {
    case OPT_STACK:
      if (o->ngiven == MAX_STACKS) return cli_usage_error("at most %d --stack options", MAX_STACKS);
      o->given_specs[o->ngiven++] = optarg;
      break;
    case OPT_BASELINE: o->baseline_name = optarg; break;
    case OPT_PATTERN:
      if (!parse_patterns(optarg, o)) return EXIT_USAGE;
      break;
    case OPT_SIZE:
      if (o->nsizes == MAX_CASES) return cli_usage_error("at most %d --size options", MAX_CASES);
      if (!cli_parse_bytes("--size", optarg, false, &o->sizes[o->nsizes])) return EXIT_USAGE;
      o->nsizes++;
      break;
    case OPT_MIN:
      if (!cli_parse_bytes("--min", optarg, false, &o->min_bytes)) return EXIT_USAGE;
      o->random_given = min_given = true;
      break;
    case OPT_MAX:
      if (!cli_parse_bytes("--max", optarg, false, &o->max_bytes)) return EXIT_USAGE;
      o->random_given = max_given = true;
      break;
    case OPT_LIVE:
      if (!cli_parse_count("--live", optarg, 1, 10000000, &v)) return EXIT_USAGE;
      o->live = (size_t)v;
      o->random_given = true;
      break;
    case OPT_OPS:
      if (!cli_parse_count("--ops", optarg, 1, BENCH_MAX_OPS, &v)) return EXIT_USAGE;
      o->ops = (size_t)(v + (v & 1)); /* a pair or a step is two calls */
      break;
    case OPT_REPEAT:
      if (!cli_parse_count("--repeat", optarg, 1, BENCH_MAX_REPEAT, &v)) return EXIT_USAGE;
      o->repeat = (int)v;
      break;
    case OPT_SEED:
      if (!cli_parse_count("--seed", optarg, 0, UINT64_MAX, &v)) return EXIT_USAGE;
      o->seed = (uint64_t)v;
      break;
    case OPT_THREADS:
      if (!parse_threads(optarg, o)) return EXIT_USAGE;
      break;
    case OPT_ONE_STREAM: o->one_stream = true; break;
    case OPT_BUDGET: {
      char *end;
      o->budget_s = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || !(o->budget_s >= 0 && o->budget_s <= 3600))
        return cli_usage_error("--budget wants seconds from 0 to 3600, not '%s'", optarg);
      break;
    }
    case OPT_JSON: o->json_path = optarg; break;
    case OPT_SKIP_INVALID: o->skip_invalid = true; break;
    case OPT_QUIET: o->quiet = true; break;
    case OPT_LIST: return print_list();
    case 'h':
      for (const char *const *t = usage_text; *t != NULL; t++) fputs(*t, stdout);
      return EXIT_OK;
    case OPT_VERSION: return cli_print_version();
    default: return cli_bad_option(c, argv);
    }
  }
  if (optind < argc) return cli_usage_error("unexpected argument '%s' (stacks go after --stack)", argv[optind]);
  if (min_given && !max_given && o->min_bytes > o->max_bytes) o->max_bytes = o->min_bytes;
  if (max_given && !min_given && o->min_bytes > o->max_bytes) o->min_bytes = o->max_bytes;
  if (o->min_bytes > o->max_bytes) return cli_usage_error("--min is larger than --max");
  if (o->nthreads == 0) o->threads[o->nthreads++] = 1;
  if (!o->pattern_given) {
    bool pair_opts = o->nsizes > 0;
    o->pattern_pair = pair_opts || !o->random_given;
    o->pattern_random = o->random_given || !pair_opts;
  }
  return -1;
}

static void add_case(options_t *o, bench_pattern_t pattern, size_t min, size_t max, size_t live) {
  case_entry_t *e = &o->cases[o->ncases++];
  char a[32], b[32];
  e->c = (bench_case_t){.pattern = pattern, .min_bytes = min, .max_bytes = max, .live = live};
  cli_format_size(min, a, sizeof a);
  cli_format_size(max, b, sizeof b);
  if (pattern == BENCH_PAIR) snprintf(e->label, sizeof e->label, "pair %s", a);
  else snprintf(e->label, sizeof e->label, "random %s-%s live %zu", a, b, live);
}

static void build_cases(options_t *o) {
  if (o->pattern_pair) {
    if (o->nsizes == 0) {
      o->sizes[o->nsizes++] = 256;
      o->sizes[o->nsizes++] = (size_t)1 << 20;
    }
    for (int i = 0; i < o->nsizes; i++) add_case(o, BENCH_PAIR, o->sizes[i], o->sizes[i], 0);
  }
  if (o->pattern_random) {
    if (o->random_given) {
      add_case(o, BENCH_RANDOM, o->min_bytes, o->max_bytes, o->live);
    } else { /* the project's target cases */
      add_case(o, BENCH_RANDOM, 256, (size_t)4 << 20, 1000);
      add_case(o, BENCH_RANDOM, 1024, (size_t)64 << 20, 200);
    }
  }
}

static int find_stack(const options_t *o, const char *spec) {
  for (int i = 0; i < o->nstacks; i++)
    if (same_spec(o->stacks[i].spec, spec)) return i;
  return -1;
}

static void add_stack(options_t *o, const char *spec, bool baseline) {
  if (find_stack(o, spec) >= 0 || o->nstacks == MAX_STACKS) return;
  bench_stack_t *s = &o->stacks[o->nstacks++];
  s->spec = spec;
  s->is_malloc = same_spec(spec, MALLOC_NAME);
  s->baseline = baseline;
}

/* The baselines, then the given stacks (or the defaults). A given spec that
 * does not parse stops the program (exit 2) unless --skip-invalid; a
 * default one this build lacks is skipped with a note. */
static int build_stacks(options_t *o, bool gpu) {
  char line[512];
  if (gpu) {
    add_stack(o, "cuda", true);
    add_stack(o, "cuda_async(default_pool=true)", true);
  } else {
    note("no CUDA device: skipping the cuda (cudaMalloc) and cuda_async(default_pool=true) "
         "(cudaMallocAsync) baselines");
  }
  add_stack(o, MALLOC_NAME, true);
  static const char *const gpu_defaults[] = {"host", "pool > cuda", "binning > pool > cuda",
                                             "arena > cuda"};
  static const char *const host_defaults[] = {"host", "pool > host", "binning > pool > host",
                                              "arena > host"};
  bool given = o->ngiven > 0;
  int n = given ? o->ngiven : 4;
  for (int i = 0; i < n; i++) {
    const char *spec = given ? o->given_specs[i] : gpu ? gpu_defaults[i] : host_defaults[i];
    if (same_spec(spec, MALLOC_NAME) || rmmc_stack_validate(spec) == RMMC_SUCCESS) {
      add_stack(o, spec, false);
    } else if (!given) {
      note("skipped default stack '%s' (not in this build): %s", spec,
           first_line(rmmc_last_error_message(), line, sizeof line));
    } else if (o->skip_invalid) {
      note("skipped '%s': %s", spec, first_line(rmmc_last_error_message(), line, sizeof line));
    } else {
      fprintf(stderr, "rmmc-bench: bad --stack '%s':\n%s\n(rmmc-bench --list shows the resources "
              "and their options)\n", spec, rmmc_last_error_message());
      return EXIT_USAGE;
    }
  }
  if (o->baseline_name != NULL) {
    o->baseline = find_stack(o, o->baseline_name);
    if (o->baseline < 0)
      return cli_usage_error("--baseline '%s' is not one of the stacks (give it with --stack too)",
                         o->baseline_name);
  } else {
    o->baseline = 0;
  }
  return -1;
}

static void cpu_name(char *buf, size_t len) {
  snprintf(buf, len, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    char *p = strchr(line, ':');
    if (p == NULL) break;
    p++;
    while (*p == ' ') p++;
    p[strcspn(p, "\n")] = '\0';
    snprintf(buf, len, "%s", p);
    break;
  }
  fclose(f);
}

typedef struct run_info {
  char device[256];
  int device_id;
  char cpu[256];
} run_info_t;

static void json_row(FILE *f, const options_t *o, const run_info_t *info, const row_t *r) {
  const bench_stack_t *s = &o->stacks[r->stack];
  const case_entry_t *c = &o->cases[r->kase];
  const bench_result_t *res = &r->res;
  fprintf(f, "  {\"schema_version\": %d, \"stack\": ", CLI_JSON_SCHEMA_VERSION);
  cli_json_string(f, s->spec);
  fprintf(f, ", \"baseline\": %s, \"memory\": \"%s\", \"pattern\": \"%s\", \"label\": ",
          s->baseline ? "true" : "false", r->memory,
          c->c.pattern == BENCH_PAIR ? "pair" : "random");
  cli_json_string(f, c->label);
  fprintf(f, ", \"threads\": %d, \"ops\": %zu, \"ops_requested\": %zu, \"runs\": %d", r->threads,
          res->ops, o->ops, res->runs);
  if (res->ok) {
    fprintf(f, ", \"ns_per_call\": %.3f, \"min\": %.3f, \"max\": %.3f, \"ns_runs\": [", res->median,
            res->min, res->max);
    for (int i = 0; i < res->runs; i++) fprintf(f, "%s%.3f", i ? ", " : "", res->ns[i]);
    fprintf(f, "], \"ops_per_s\": %.1f", res->ops_per_s);
  } else {
    fputs(", \"ns_per_call\": null, \"min\": null, \"max\": null, \"ns_runs\": [], "
          "\"ops_per_s\": null", f);
  }
  if (r->has_ratio) fprintf(f, ", \"ratio\": %.6g", r->ratio);
  else fputs(", \"ratio\": null", f);
  fputs(", \"ratio_to\": ", f);
  cli_json_string(f, o->stacks[o->baseline].spec);
  if (r->has_scaling) fprintf(f, ", \"scaling_vs_1_thread\": %.4g", r->scaling);
  else fputs(", \"scaling_vs_1_thread\": null", f);
  if (c->c.pattern == BENCH_PAIR) fprintf(f, ", \"sizes\": [%zu]", c->c.min_bytes);
  else fprintf(f, ", \"sizes\": [%zu, %zu]", c->c.min_bytes, c->c.max_bytes);
  fprintf(f, ", \"size_min\": %zu, \"size_max\": %zu, \"live\": %zu, \"seed\": %llu, "
          "\"budget_s\": %g, \"one_stream\": %s, \"device\": ",
          c->c.min_bytes, c->c.max_bytes, c->c.live, (unsigned long long)o->seed, o->budget_s,
          o->one_stream ? "true" : "false");
  cli_json_string(f, info->device);
  fprintf(f, ", \"device_id\": %d, \"cpu\": ", info->device_id);
  cli_json_string(f, info->cpu);
  fprintf(f, ", \"status\": \"%s\", \"error\": ", res->ok ? "ok" : "failed");
  if (res->ok) fputs("null", f);
  else cli_json_string(f, res->error);
  fputs("}", f);
}

static bool write_json(FILE *f, const options_t *o, const run_info_t *info, const row_t *rows,
                       int nrows) {
  fputs("[\n", f);
  bool first = true;
  for (int i = 0; i < nrows; i++) {
    if (!rows[i].measured) continue;
    if (!first) fputs(",\n", f);
    json_row(f, o, info, &rows[i]);
    first = false;
  }
  fputs("\n]\n", f);
  return fflush(f) == 0 && !ferror(f);
}

/* Three significant digits however small: 0.000571, 0.500, 12.30. */
static void format_ratio(double x, char *buf, size_t len) {
  int decimals = 2;
  if (x > 0 && x < 1) {
    decimals = 2 - (int)floor(log10(x));
    if (decimals > 9) decimals = 9;
  }
  snprintf(buf, len, "%.*f", decimals, x);
}

static void print_table(const options_t *o, const row_t *rows, int nrows) {
  int sw = 5, pw = 7;
  bool budget_cut = false;
  for (int i = 0; i < nrows; i++) {
    int n = rows[i].measured ? (int)strlen(o->stacks[rows[i].stack].spec) : 0;
    if (n > sw) sw = n;
  }
  for (int i = 0; i < o->ncases; i++) {
    int n = (int)strlen(o->cases[i].label);
    if (n > pw) pw = n;
  }
  printf("%-*s  %-*s  %3s  %9s  %10s  %10s  %12s  %10s  %6s\n", sw, "stack", pw, "pattern", "thr",
         "ops", "ns/call", "min", "ops/s", "ratio", "xT1");
  int last_case = -1, last_threads = -1;
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    if (!r->measured) continue;
    if (last_case >= 0 && (r->kase != last_case || r->threads != last_threads)) putchar('\n');
    last_case = r->kase;
    last_threads = r->threads;
    const char *spec = o->stacks[r->stack].spec, *label = o->cases[r->kase].label;
    if (!r->res.ok) {
      char line[512];
      printf("%-*s  %-*s  %3d  FAILED: %s\n", sw, spec, pw, label, r->threads,
             first_line(r->res.error, line, sizeof line));
      continue;
    }
    char ops[32], ratio[32] = "-", scaling[32] = "-";
    bool cut = r->res.ops < o->ops;
    budget_cut |= cut;
    snprintf(ops, sizeof ops, "%zu%s", r->res.ops, cut ? "*" : "");
    if (r->has_ratio) format_ratio(r->ratio, ratio, sizeof ratio);
    if (r->has_scaling) snprintf(scaling, sizeof scaling, "%.2f", r->scaling);
    printf("%-*s  %-*s  %3d  %9s  %10.1f  %10.1f  %12.0f  %10s  %6s\n", sw, spec, pw, label,
           r->threads, ops, r->res.median, r->res.min, r->res.ops_per_s, ratio, scaling);
  }
  printf("# ns/call: median of %d runs of wall time * threads / calls (a call is one allocate or "
         "one free); min: the fastest run\n", o->repeat);
  printf("# ratio: ns/call divided by that of '%s' for the same pattern and threads (below 1 is "
         "faster)\n", o->stacks[o->baseline].spec);
  printf("# xT1: aggregate ops/s divided by the same stack's ops/s with 1 thread\n");
  if (budget_cut)
    printf("# *: fewer calls per run than --ops %zu: the stack ran longer than the %g s budget\n",
           o->ops, o->budget_s);
}

/* Ratios to the baseline and scaling over the 1-thread row. */
static void derive(const options_t *o, row_t *rows, int nrows) {
  for (int i = 0; i < nrows; i++) {
    row_t *r = &rows[i];
    if (!r->measured || !r->res.ok) continue;
    for (int j = 0; j < nrows; j++) {
      const row_t *b = &rows[j];
      if (!b->measured || !b->res.ok || b->kase != r->kase) continue;
      if (b->stack == o->baseline && b->threads == r->threads) {
        r->has_ratio = true;
        r->ratio = r->res.median / b->res.median;
      }
      if (b->stack == r->stack && b->threads == 1 && r->threads != 1) {
        r->has_scaling = true;
        r->scaling = r->res.ops_per_s / b->res.ops_per_s;
      }
    }
  }
}

static void measure_row(options_t *o, row_t *row, int index, int total) {
  bench_stack_t *s = &o->stacks[row->stack];
  const case_entry_t *c = &o->cases[row->kase];
  char line[512];
  rmmc_resource_t *r = NULL;
  row->memory = "host";
  if (!s->is_malloc) {
    rmmc_status_t st = rmmc_stack_create(s->spec, -1, &r);
    if (st == RMMC_ERROR_NO_DEVICE) {
      s->unavailable = true;
      note("skipped '%s': %s", s->spec, first_line(rmmc_last_error_message(), line, sizeof line));
      return;
    }
    row->measured = true;
    if (st != RMMC_SUCCESS) {
      snprintf(row->res.error, sizeof row->res.error, "building the stack failed with %s: %s",
               rmmc_status_name(st), rmmc_last_error_message());
      fprintf(stderr, "rmmc-bench: '%s' | %s | %d threads: FAILED: %s\n", s->spec, c->label,
              row->threads, row->res.error);
      return;
    }
    row->memory = rmmc_memory_kind_name(rmmc_resource_memory_kind(r));
  }
  row->measured = true;
  bench_params_t p = {.threads = row->threads, .ops = o->ops, .repeat = o->repeat, .seed = o->seed,
                      .budget_s = o->budget_s, .one_stream = o->one_stream};
  bench_measure(r, &c->c, &p, &row->res); /* releases r */
  if (!row->res.ok)
    fprintf(stderr, "rmmc-bench: '%s' | %s | %d threads: FAILED: %s\n", s->spec, c->label,
            row->threads, row->res.error);
  else if (!o->quiet)
    fprintf(stderr, "[%d/%d] %s | %s | %d thr: %.1f ns/call (%zu ops)\n", index, total, s->spec,
            c->label, row->threads, row->res.median, row->res.ops);
}

int main(int argc, char **argv) {
  cli_program = "rmmc-bench";
  static options_t o;
  int rc = parse_options(argc, argv, &o);
  if (rc >= 0) return rc;
  bool gpu = rmmc_device_count() > 0;
  run_info_t info = {.device = "none", .device_id = -1};
  cpu_name(info.cpu, sizeof info.cpu);
  if (gpu) {
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&info.device_id) == cudaSuccess &&
        cudaGetDeviceProperties(&prop, info.device_id) == cudaSuccess)
      snprintf(info.device, sizeof info.device, "%s", prop.name);
    else
      snprintf(info.device, sizeof info.device, "unknown GPU");
  }
  rc = build_stacks(&o, gpu);
  if (rc >= 0) return rc;
  build_cases(&o);
  FILE *json = NULL;
  if (o.json_path != NULL && (json = fopen(o.json_path, "w")) == NULL) {
    fprintf(stderr, "rmmc-bench: cannot write --json %s: %s\n", o.json_path, strerror(errno));
    return EXIT_IO;
  }
  printf("# rmmc-bench %s | device: %s", RMMC_VERSION_STRING, info.device);
  if (gpu) printf(" (%d)", info.device_id);
  printf(" | cpu: %s | seed %llu, %d runs, %zu ops per thread and run, budget %g s%s\n", info.cpu,
         (unsigned long long)o.seed, o.repeat, o.ops, o.budget_s,
         o.one_stream ? ", every thread on one stream" : "");
  flush_notes();
  int nrows = o.ncases * o.nthreads * o.nstacks;
  row_t *rows = calloc((size_t)nrows, sizeof *rows);
  if (rows == NULL) {
    fprintf(stderr, "rmmc-bench: out of host memory\n");
    if (json) fclose(json);
    return EXIT_IO;
  }
  int k = 0;
  for (int ci = 0; ci < o.ncases; ci++)
    for (int ti = 0; ti < o.nthreads; ti++)
      for (int si = 0; si < o.nstacks; si++, k++) {
        rows[k] = (row_t){.stack = si, .kase = ci, .threads = o.threads[ti]};
        if (!o.stacks[si].unavailable) measure_row(&o, &rows[k], k + 1, nrows);
      }
  derive(&o, rows, nrows);
  print_table(&o, rows, nrows);
  rc = EXIT_OK;
  for (int i = 0; i < nrows; i++)
    if (rows[i].measured && !rows[i].res.ok) rc = EXIT_FAILED;
  if (json != NULL) {
    bool written = write_json(json, &o, &info, rows, nrows);
    if (fclose(json) != 0 || !written) {
      fprintf(stderr, "rmmc-bench: writing --json %s failed\n", o.json_path);
      rc = EXIT_IO;
    }
  }
  free(rows);
  return rc;
}
