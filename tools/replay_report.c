/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reports of a replay: the text table, JSON records and an SVG chart,
 * written with the C standard library only.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "replay_engine.h"

const char *replay_format_bytes(uint64_t bytes, char *buf, size_t len) {
  return rmmc_format_bytes(bytes, buf, len);
}

static double ratio_of(const replay_log_t *log, const replay_result_t *r) {
  return log->peak_live ? (double)r->peak_reserved / (double)log->peak_live : 0.0;
}

static uint64_t skipped_total(const replay_log_t *log) {
  uint64_t n = 0;
  for (int i = 0; i < REPLAY_ISSUE_COUNT; i++) n += log->skipped[i];
  return n;
}

/* ---- table ---- */

void replay_write_table(FILE *f, const replay_log_t *log, const replay_result_t *results,
                        size_t n) {
  int w = 5;
  for (size_t i = 0; i < n; i++) {
    int len = (int)strlen(results[i].stack);
    if (len > w) w = len;
  }
  if (w > 48) w = 48;
  fprintf(f, "%-*s  %-8s %10s %8s %12s %14s %8s %9s %9s %9s\n", w, "stack", "upstream", "events",
          "failures", "peak live", "peak reserved", "ratio", "ns/call", "own ns", "upstream");
  char a[32], b[32];
  for (size_t i = 0; i < n; i++) {
    const replay_result_t *r = &results[i];
    if (r->error[0] != '\0') {
      fprintf(f, "%-*s  error: %s\n", w, r->stack, r->error);
      continue;
    }
    replay_format_bytes(log->peak_live, a, sizeof a);
    if (r->has_reserved)
      replay_format_bytes(r->peak_reserved, b, sizeof b);
    else
      snprintf(b, sizeof b, "-");
    fprintf(f, "%-*s  %-8s %10llu %8llu %12s %14s %7.3fx %9.1f %9.1f %9llu%s\n", w, r->stack,
            r->base, (unsigned long long)r->events, (unsigned long long)r->failures, a, b,
            r->has_reserved ? ratio_of(log, r) : 0.0, r->ns_per_call, r->own_ns_per_call,
            (unsigned long long)r->upstream_calls, r->simulated ? "  (simulated)" : "");
  }
  unsigned repeats = n > 0 ? results[0].repeats : 1;
  fprintf(f, "# ns/call: mean time per allocate/deallocate call%s; own ns: the same without the "
             "time spent in the base's calls; upstream: calls into the base (allocations, "
             "frees, page maps)\n",
          repeats > 1 ? " (median of the replays)" : "");
  if (n > 0 && results[0].warm)
    fputs("# warm: each stack replayed the log once untimed before the timed replay; peak "
          "reserved covers both\n",
          f);
  for (size_t i = 0; i < n; i++) {
    const replay_result_t *r = &results[i];
    if (r->failures > 0)
      fprintf(f, "%s: %llu allocations failed (peak live is the log's, with them; the first: %s)\n", r->stack,
              (unsigned long long)r->failures, r->first_failure);
    if (r->free_errors > 0)
      fprintf(f, "%s: %llu deallocations refused by the stack\n", r->stack,
              (unsigned long long)r->free_errors);
  }
}

/* ---- JSON ---- */


rmmc_status_t replay_write_json(FILE *f, const replay_log_t *log, const replay_result_t *results,
                                size_t n) {
  fputs("[\n", f);
  for (size_t i = 0; i < n; i++) {
    const replay_result_t *r = &results[i];
    fprintf(f, "  {\"schema_version\": %d, \"stack\": ", CLI_JSON_SCHEMA_VERSION);
    cli_json_string(f, r->stack);
    fputs(", \"log\": ", f);
    cli_json_string(f, log->name);
    if (r->error[0] != '\0') {
      fputs(", \"error\": ", f);
      cli_json_string(f, r->error);
      fprintf(f, "}%s\n", i + 1 < n ? "," : "");
      continue;
    }
    fputs(", \"upstream\": ", f);
    cli_json_string(f, r->base);
    fputs(", \"upstream_kind\": ", f);
    cli_json_string(f, rmmc_memory_kind_name(r->kind));
    fprintf(f, ", \"simulated\": %s, \"real_streams\": %s", r->simulated ? "true" : "false",
            r->real_streams ? "true" : "false");
    fprintf(f, ",\n   \"threads\": %u, \"logged_threads\": %u, \"streams\": %u", r->threads,
            log->nthreads, log->nstreams);
    fprintf(f, ", \"events\": %llu, \"calls\": %llu, \"failures\": %llu",
            (unsigned long long)r->events, (unsigned long long)r->calls,
            (unsigned long long)r->failures);
    fprintf(f, ", \"free_errors\": %llu, \"skipped_frees\": %llu, \"logged_failures\": %llu",
            (unsigned long long)r->free_errors, (unsigned long long)r->skipped_frees,
            (unsigned long long)log->logged_failures);
    fprintf(f, ",\n   \"peak_live_bytes\": %llu", (unsigned long long)log->peak_live);
    if (r->has_reserved) {
      fprintf(f, ", \"peak_reserved_bytes\": %llu, \"end_reserved_bytes\": %llu",
              (unsigned long long)r->peak_reserved, (unsigned long long)r->end_reserved);
      if (log->peak_live)
        fprintf(f, ", \"ratio\": %.6f", ratio_of(log, r));
      else
        fputs(", \"ratio\": null", f);
    } else {
      fputs(", \"peak_reserved_bytes\": null, \"end_reserved_bytes\": null, \"ratio\": null", f);
    }
    if (r->has_base_peak)
      fprintf(f, ", \"upstream_reported_peak_bytes\": %llu", (unsigned long long)r->base_peak);
    fprintf(f, ", \"live_at_end_bytes\": %llu, \"outstanding_at_end\": %llu",
            (unsigned long long)log->live_at_end, (unsigned long long)log->outstanding_at_end);
    fprintf(f, ",\n   \"ns_per_call\": %.1f, \"total_call_ns\": %llu", r->ns_per_call,
            (unsigned long long)r->total_ns);
    fprintf(f, ", \"own_ns_per_call\": %.1f, \"upstream_calls\": %llu, \"upstream_ns\": %llu",
            r->own_ns_per_call, (unsigned long long)r->upstream_calls,
            (unsigned long long)r->upstream_ns);
    fprintf(f, ", \"repeats\": %u, \"ns_per_call_min\": %.1f, \"warm\": %s", r->repeats,
            r->ns_per_call_min, r->warm ? "true" : "false");
    if (r->failures > 0) {
      fputs(", \"first_failure\": ", f);
      cli_json_string(f, r->first_failure);
    }
    fprintf(f, ",\n   \"null_events\": %llu, \"skipped_total\": %llu, \"skipped\": {",
            (unsigned long long)log->null_events, (unsigned long long)skipped_total(log));
    for (int k = 0; k < REPLAY_ISSUE_COUNT; k++)
      fprintf(f, "%s\"%s\": %llu", k ? ", " : "", replay_issue_key((replay_issue_t)k),
              (unsigned long long)log->skipped[k]);
    fprintf(f, "}}%s\n", i + 1 < n ? "," : "");
  }
  fputs("]\n", f);
  return ferror(f) ? rmmc_set_error(RMMC_ERROR_IO, "writing JSON failed") : RMMC_SUCCESS;
}

/* ---- SVG ---- */

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&apos;", f); break;
    default:
      if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
  }
}

/* An axis label: "0", "512 MiB", "1.5 GiB" (a double: the top tick may be
 * 2^64). */
static void tick_label(double v, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
  int u = 0;
  double x = v;
  while (x >= 1024.0 && u < 7) {
    x /= 1024.0;
    u++;
  }
  if (v == 0)
    snprintf(buf, len, "0");
  else
    snprintf(buf, len, "%.4g %s", x, units[u]);
}

#define SVG_W 960
#define PLOT_X0 100.0
#define PLOT_X1 930.0
#define PLOT_Y0 56.0
#define PLOT_Y1 396.0

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};

typedef struct axes {
  double ymax;     /* bytes at the top of the plot */
  double nevents;  /* events at the right end */
} axes_t;

static double px_x(const axes_t *a, double event) {
  return PLOT_X0 + (PLOT_X1 - PLOT_X0) * (a->nevents > 0 ? event / a->nevents : 0.0);
}

static double px_y(const axes_t *a, double v) {
  return PLOT_Y1 - (PLOT_Y1 - PLOT_Y0) * (v / a->ymax);
}

/* One series as a path: a point at the start of each bucket and one at the
 * right end. */
static void series_path(FILE *f, const axes_t *a, const uint64_t *v, size_t nb, size_t nevents) {
  fputs(" d=\"", f);
  for (size_t b = 0; b < nb; b++) {
    double e = (double)b * (double)nevents / (double)nb;
    fprintf(f, "%s%.1f %.1f", b ? " L" : "M", px_x(a, e), px_y(a, (double)v[b]));
  }
  if (nb > 0)
    fprintf(f, " L%.1f %.1f", px_x(a, (double)nevents), px_y(a, (double)v[nb - 1]));
  else
    fprintf(f, "M%.1f %.1f L%.1f %.1f", PLOT_X0, PLOT_Y1, PLOT_X1, PLOT_Y1);
  fputc('"', f);
}

static bool drawable(const replay_result_t *r, size_t nb) {
  return r->error[0] == '\0' && r->reserved_series != NULL && r->nbuckets == nb;
}

rmmc_status_t replay_write_svg(FILE *f, const replay_log_t *log, const replay_result_t *results,
                               size_t n) {
  size_t nb = 0;
  for (size_t i = 0; i < n && nb == 0; i++)
    if (results[i].error[0] == '\0' && results[i].reserved_series != NULL) nb = results[i].nbuckets;
  if (nb == 0) nb = log->nevents < 1000 ? log->nevents : 1000;
  uint64_t *live = calloc(nb ? nb : 1, sizeof *live);
  if (live == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "SVG: no host memory");
  if (nb > 0) replay_log_live_series(log, nb, live);

  uint64_t top = 0;
  for (size_t b = 0; b < nb; b++) top = live[b] > top ? live[b] : top;
  size_t drawn = 0;
  for (size_t i = 0; i < n; i++) {
    if (!drawable(&results[i], nb)) continue;
    drawn++;
    for (size_t b = 0; b < nb; b++)
      if (results[i].reserved_series[b] > top) top = results[i].reserved_series[b];
  }
  /* A power-of-two step giving at most 8 intervals, for any top: the step
   * stops at 2^61, whose 8 intervals reach 2^64, so nothing overflows (the
   * replay refuses logs above REPLAY_MAX_BYTES, but a stack may report
   * anything). Tick values are doubles for the same reason. */
  uint64_t step = 256;
  while (step < ((uint64_t)1 << 61) && step * 8 < top) step *= 2;
  uint64_t ticks = top == 0 ? 4 : top / step + (top % step != 0);
  axes_t a = {(double)ticks * (double)step, (double)log->nevents};
  int height = (int)PLOT_Y1 + 62 + (int)(drawn + 1) * 18 + 8;

  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
          SVG_W, height, SVG_W, height);
  fputs("<title>rmmc-replay: ", f);
  xml_text(f, log->name);
  fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", f);
  fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"15\" font-weight=\"bold\">", PLOT_X0);
  const char *slash = strrchr(log->name, '/');
  xml_text(f, slash != NULL ? slash + 1 : log->name);
  fprintf(f, ": live and reserved bytes over %zu events</text>\n", log->nevents);

  /* Axes, grid and tick labels: lines and text only, no paths. */
  fputs("<g class=\"axes\" stroke=\"#000\" stroke-width=\"1\">\n", f);
  char label[32];
  for (uint64_t t = 0; t <= ticks; t++) {
    double y = px_y(&a, (double)t * (double)step);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
            PLOT_X0, y, PLOT_X1, y);
    tick_label((double)t * (double)step, label, sizeof label);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\">%s</text>\n",
            PLOT_X0 - 6, y + 4, label);
  }
  /* 1, 2 or 5 times a power of ten, giving at most 10 intervals. */
  double target = (double)log->nevents / 10, xstep = 1;
  for (double mag = 1;; mag *= 10) {
    if (mag >= target || 2 * mag >= target || 5 * mag >= target) {
      xstep = mag >= target ? mag : 2 * mag >= target ? 2 * mag : 5 * mag;
      break;
    }
  }
  for (double e = 0; e <= (double)log->nevents; e += xstep) {
    double x = px_x(&a, e);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, PLOT_Y1, x,
            PLOT_Y1 + 5);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" stroke=\"none\">%.0f</text>\n",
            x, PLOT_Y1 + 19, e);
  }
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", PLOT_X0, PLOT_Y0,
          PLOT_X0, PLOT_Y1);
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", PLOT_X0, PLOT_Y1,
          PLOT_X1, PLOT_Y1);
  fputs("</g>\n", f);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">event index</text>\n",
          (PLOT_X0 + PLOT_X1) / 2, PLOT_Y1 + 40);
  fprintf(f,
          "<text x=\"24\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 24 %.1f)\">"
          "bytes</text>\n",
          (PLOT_Y0 + PLOT_Y1) / 2, (PLOT_Y0 + PLOT_Y1) / 2);

  /* The series: one reserved line per stack, then live (shared) on top: a
   * stack that reserves what is live (the base alone) would hide it. */
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (!drawable(&results[i], nb)) continue;
    fputs("<path class=\"series\" data-series=\"reserved\" data-stack=\"", f);
    xml_text(f, results[i].stack);
    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"",
            palette[k++ % (sizeof palette / sizeof palette[0])]);
    series_path(f, &a, results[i].reserved_series, nb, log->nevents);
    fputs("/>\n", f);
  }
  fputs("<path class=\"series\" data-series=\"live\" fill=\"none\" stroke=\"#000\" "
        "stroke-width=\"3\" stroke-opacity=\"0.45\"",
        f);
  series_path(f, &a, live, nb, log->nevents);
  fputs("/>\n", f);

  /* Legend. */
  fputs("<g class=\"legend\">\n", f);
  double ly = PLOT_Y1 + 62;
  char pb[32];
  fprintf(f,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
          "stroke-width=\"3\" stroke-opacity=\"0.45\"/>\n",
          PLOT_X0, ly - 4, PLOT_X0 + 28, ly - 4);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">live: what the application held (peak %s)</text>\n",
          PLOT_X0 + 36, ly, replay_format_bytes(log->peak_live, pb, sizeof pb));
  k = 0;
  for (size_t i = 0; i < n; i++) {
    const replay_result_t *r = &results[i];
    if (!drawable(r, nb)) continue;
    ly += 18;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"2\"/>\n",
            PLOT_X0, ly - 4, PLOT_X0 + 28, ly - 4, palette[k++ % (sizeof palette / sizeof palette[0])]);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">reserved by ", PLOT_X0 + 36, ly);
    xml_text(f, r->stack);
    fprintf(f, " (peak %s, %.3fx live%s%s)</text>\n",
            replay_format_bytes(r->peak_reserved, pb, sizeof pb), ratio_of(log, r),
            r->failures ? ", with failures" : "", r->simulated ? ", simulated" : "");
  }
  fputs("</g>\n</svg>\n", f);
  free(live);
  return ferror(f) ? rmmc_set_error(RMMC_ERROR_IO, "writing SVG failed") : RMMC_SUCCESS;
}
