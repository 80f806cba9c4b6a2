/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading an allocation log (replay_engine.h describes the format).
 *
 * The input is read in chunks (through zlib, or a `gzip -dc` pipe, or
 * stdio) and split into lines; each line is cut into its fields at the
 * columns the header named and checked. An open-addressing map from logged
 * pointer to allocation slot pairs every free with its allocation at read
 * time, so the replay itself does no lookups. Everything is linear in the
 * size of the log.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "replay_engine.h"

#ifdef RMMC_REPLAY_HAVE_ZLIB
#include <zlib.h>
#endif

#define CHUNK ((size_t)1 << 20)

static const char *const issue_keys[] = {
#define ISSUE_KEY_(name, key, text) key,
    REPLAY_ISSUE_MAP(ISSUE_KEY_)
#undef ISSUE_KEY_
};
static const char *const issue_texts[] = {
#define ISSUE_TEXT_(name, key, text) text,
    REPLAY_ISSUE_MAP(ISSUE_TEXT_)
#undef ISSUE_TEXT_
};

const char *replay_issue_key(replay_issue_t issue) {
  return (unsigned)issue < REPLAY_ISSUE_COUNT ? issue_keys[issue] : "unknown";
}

const char *replay_issue_text(replay_issue_t issue) {
  return (unsigned)issue < REPLAY_ISSUE_COUNT ? issue_texts[issue] : "unknown issue";
}

bool replay_have_zlib(void) {
#ifdef RMMC_REPLAY_HAVE_ZLIB
  return true;
#else
  return false;
#endif
}

/* ---- a map from 64-bit keys to 32-bit values (linear probing) ---- */

#define MAP_EMPTY UINT32_MAX

typedef struct map_entry {
  uint64_t key;
  uint32_t val; /* MAP_EMPTY: free slot */
} map_entry_t;

typedef struct map {
  map_entry_t *slots;
  size_t mask, count;
} map_t;

static size_t map_hash(uint64_t key, size_t mask) {
  key ^= key >> 31;
  key *= UINT64_C(0x9e3779b97f4a7c15);
  key ^= key >> 29;
  return (size_t)key & mask;
}

static bool map_init(map_t *m, size_t cap) {
  m->slots = malloc(cap * sizeof *m->slots);
  if (m->slots == NULL) return false;
  for (size_t i = 0; i < cap; i++) m->slots[i].val = MAP_EMPTY;
  m->mask = cap - 1;
  m->count = 0;
  return true;
}

/* The slot holding key, or the empty slot where it would go. */
static size_t map_slot(const map_t *m, uint64_t key) {
  size_t i = map_hash(key, m->mask);
  while (m->slots[i].val != MAP_EMPTY && m->slots[i].key != key) i = (i + 1) & m->mask;
  return i;
}

static bool map_put(map_t *m, uint64_t key, uint32_t val) {
  if ((m->count + 1) * 2 > m->mask + 1) {
    map_t bigger;
    if (!map_init(&bigger, (m->mask + 1) * 2)) return false;
    for (size_t i = 0; i <= m->mask; i++)
      if (m->slots[i].val != MAP_EMPTY) bigger.slots[map_slot(&bigger, m->slots[i].key)] = m->slots[i];
    bigger.count = m->count;
    free(m->slots);
    *m = bigger;
  }
  size_t i = map_slot(m, key);
  if (m->slots[i].val == MAP_EMPTY) m->count++;
  m->slots[i].key = key;
  m->slots[i].val = val;
  return true;
}

static uint32_t map_get(const map_t *m, uint64_t key) { return m->slots[map_slot(m, key)].val; }

/* Backward-shift deletion keeps every cluster reachable without tombstones. */
static void map_remove(map_t *m, uint64_t key) {
  size_t i = map_slot(m, key);
  if (m->slots[i].val == MAP_EMPTY) return;
  size_t j = i;
  for (;;) {
    j = (j + 1) & m->mask;
    if (m->slots[j].val == MAP_EMPTY) break;
    size_t home = map_hash(m->slots[j].key, m->mask);
    bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      m->slots[i] = m->slots[j];
      i = j;
    }
  }
  m->slots[i].val = MAP_EMPTY;
  m->count--;
}

/* ---- input ---- */

typedef struct reader {
  const char *path;
  FILE *file; /* plain file, or a pipe when piped */
  bool piped;
#ifdef RMMC_REPLAY_HAVE_ZLIB
  gzFile gz;
#endif
  const char *mem; /* replay_log_parse: the text itself */
  size_t mem_len, mem_pos;
} reader_t;

/* Quotes `path` for sh into buf (single quotes, ' as '\''). */
static bool shell_quote(const char *path, char *buf, size_t len) {
  size_t n = 0;
  if (len < 3) return false;
  buf[n++] = '\'';
  for (const char *p = path; *p; p++) {
    const char *piece = *p == '\'' ? "'\\''" : NULL;
    size_t plen = piece ? 4 : 1;
    if (n + plen + 2 > len) return false;
    if (piece)
      memcpy(buf + n, piece, plen);
    else
      buf[n] = *p;
    n += plen;
  }
  buf[n++] = '\'';
  buf[n] = '\0';
  return true;
}

static bool is_gzip_file(FILE *f) {
  unsigned char magic[2] = {0, 0};
  size_t got = fread(magic, 1, 2, f);
  rewind(f);
  return got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

static rmmc_status_t reader_open(reader_t *r, const char *path, replay_input_t input) {
  memset(r, 0, sizeof *r);
  r->path = path;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return rmmc_set_error(RMMC_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
  bool gz = is_gzip_file(f);
#ifdef RMMC_REPLAY_HAVE_ZLIB
  if (input == REPLAY_INPUT_AUTO) {
    fclose(f);
    r->gz = gzopen(path, "rb");
    if (r->gz == NULL)
      return rmmc_set_error(RMMC_ERROR_IO, "%s: cannot open: %s", path,
                            errno ? strerror(errno) : "zlib could not allocate");
    gzbuffer(r->gz, (unsigned)CHUNK);
    return RMMC_SUCCESS;
  }
#endif
  (void)input;
  if (!gz) {
    r->file = f;
    return RMMC_SUCCESS;
  }
  fclose(f);
  char quoted[4200], cmd[4300];
  if (!shell_quote(path, quoted, sizeof quoted))
    return rmmc_set_error(RMMC_ERROR_IO, "%s: path too long to pass to gzip", path);
  snprintf(cmd, sizeof cmd, "gzip -dc -- %s", quoted);
  r->file = popen(cmd, "r");
  if (r->file == NULL)
    return rmmc_set_error(RMMC_ERROR_IO, "%s: cannot run '%s': %s", path, cmd, strerror(errno));
  r->piped = true;
  return RMMC_SUCCESS;
}

/* Reads up to len bytes; 0 at the end; -1 on error (message set). */
static long reader_read(reader_t *r, char *buf, size_t len) {
  if (r->mem != NULL) {
    size_t n = r->mem_len - r->mem_pos < len ? r->mem_len - r->mem_pos : len;
    memcpy(buf, r->mem + r->mem_pos, n);
    r->mem_pos += n;
    return (long)n;
  }
#ifdef RMMC_REPLAY_HAVE_ZLIB
  if (r->gz != NULL) {
    int n = gzread(r->gz, buf, (unsigned)len);
    int zerr = Z_OK;
    const char *msg = gzerror(r->gz, &zerr);
    if (n < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
      rmmc_set_error(RMMC_ERROR_IO, "%s: cannot decompress: %s", r->path, msg);
      return -1;
    }
    return n;
  }
#endif
  size_t n = fread(buf, 1, len, r->file);
  if (n == 0 && ferror(r->file)) {
    rmmc_set_error(RMMC_ERROR_IO, "%s: read error: %s", r->path, strerror(errno));
    return -1;
  }
  return (long)n;
}

/* Closes; reports a failed decompression command (truncated input), which
 * also explains a parse error in the last line it gave. */
static rmmc_status_t reader_close(reader_t *r, rmmc_status_t st) {
#ifdef RMMC_REPLAY_HAVE_ZLIB
  if (r->gz != NULL) gzclose(r->gz);
#endif
  if (r->file != NULL && r->piped) {
    int rc = pclose(r->file);
    if (rc != 0 && (st == RMMC_SUCCESS || st == RMMC_ERROR_PARSE))
      st = rmmc_set_error(RMMC_ERROR_IO, "%s: 'gzip -dc' failed (status %d): not a complete gzip file?",
                          r->path, rc);
  } else if (r->file != NULL) {
    fclose(r->file);
  }
  return st;
}

/* ---- fields ---- */

enum { COL_THREAD, COL_TIME, COL_ACTION, COL_POINTER, COL_SIZE, COL_STREAM, NCOLS };
static const char *const column_names[NCOLS] = {"Thread", "Time", "Action",
                                                "Pointer", "Size", "Stream"};
static const bool column_required[NCOLS] = {false, false, true, true, true, false};

typedef struct field {
  const char *p;
  size_t len;
} field_t;

static bool field_is(field_t f, const char *word) {
  size_t n = strlen(word);
  return f.len == n && strncasecmp(f.p, word, n) == 0;
}

/* Decimal, no sign, fits in 64 bits. */
static bool parse_dec(field_t f, uint64_t *out) {
  if (f.len == 0 || f.len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < f.len; i++) {
    unsigned d = (unsigned)(f.p[i] - '0');
    if (d > 9 || v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

/* Hex with or without 0x; "(nil)" is 0. */
static bool parse_hex(field_t f, uint64_t *out) {
  if (field_is(f, "(nil)")) {
    *out = 0;
    return true;
  }
  if (f.len > 2 && f.p[0] == '0' && (f.p[1] == 'x' || f.p[1] == 'X')) f.p += 2, f.len -= 2;
  if (f.len == 0 || f.len > 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < f.len; i++) {
    int c = (unsigned char)f.p[i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

/* Up to 9 fraction digits, returned in microseconds. */
static bool parse_fraction_us(field_t f, int64_t *out) {
  if (f.len == 0 || f.len > 9) return false;
  int64_t v = 0;
  for (size_t i = 0; i < 6; i++) {
    if (i < f.len) {
      unsigned d = (unsigned)(f.p[i] - '0');
      if (d > 9) return false;
      v = v * 10 + d;
    } else {
      v *= 10;
    }
  }
  for (size_t i = 6; i < f.len; i++)
    if ((unsigned)(f.p[i] - '0') > 9) return false;
  *out = v;
  return true;
}

/* Integer microseconds; HH:MM:SS.ffffff or HH:MM:SS:ffffff; S.ffffff. */
static bool parse_time(field_t f, int64_t *out) {
  uint64_t v;
  if (parse_dec(f, &v)) {
    if (v > INT64_MAX) return false;
    *out = (int64_t)v;
    return true;
  }
  const char *colon = memchr(f.p, ':', f.len);
  if (colon == NULL) {
    const char *dot = memchr(f.p, '.', f.len);
    int64_t frac;
    if (dot == NULL || !parse_dec((field_t){f.p, (size_t)(dot - f.p)}, &v) ||
        v > (uint64_t)INT64_MAX / 1000000 - 1 ||
        !parse_fraction_us((field_t){dot + 1, f.len - (size_t)(dot + 1 - f.p)}, &frac))
      return false;
    *out = (int64_t)v * 1000000 + frac;
    return true;
  }
  /* H:M:S, then '.' or ':' and the fraction. */
  uint64_t part[3];
  const char *p = f.p, *end = f.p + f.len;
  for (int k = 0; k < 3; k++) {
    const char *q = p;
    while (q < end && isdigit((unsigned char)*q)) q++;
    if (q == p || q - p > 2 || !parse_dec((field_t){p, (size_t)(q - p)}, &part[k])) return false;
    p = q;
    if (k < 2) {
      if (p == end || *p != ':') return false;
      p++;
    }
  }
  if (part[0] > 23 || part[1] > 59 || part[2] > 60) return false;
  int64_t frac = 0;
  if (p < end) {
    if (*p != '.' && *p != ':') return false;
    if (!parse_fraction_us((field_t){p + 1, (size_t)(end - p - 1)}, &frac)) return false;
  }
  *out = (int64_t)((part[0] * 60 + part[1]) * 60 + part[2]) * 1000000 + frac;
  return true;
}

/* ---- the parser ---- */

typedef struct parser {
  replay_log_t *log;
  const replay_read_options_t *opts;
  int col[NCOLS];      /* field index of each column, -1 if absent */
  int nfields;         /* fields in the header */
  bool have_header;
  uint64_t line;
  map_t pointers;      /* logged pointer -> slot, live allocations only */
  map_t threads;       /* logged thread -> index */
  map_t streams;       /* logged stream -> index */
  uint64_t *slot_size; /* size of each slot's allocation */
  size_t events_cap, threads_cap, streams_cap, slots_cap;
  uint64_t live;
  unsigned warned;
  uint64_t bytes_read;   /* decompressed bytes so far, for progress lines */
  double next_progress;  /* monotonic seconds of the next progress line; 0: none yet */
} parser_t;

/* Records a bad line: an error (strict) or a count and maybe a warning. */
static rmmc_status_t bad_line(parser_t *p, replay_issue_t issue, const char *text, size_t len,
                              const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

static rmmc_status_t bad_line(parser_t *p, replay_issue_t issue, const char *text, size_t len,
                              const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  int shown = len > 120 ? 120 : (int)len;
  if (!p->opts->lenient)
    return rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: %s: %s\n  %.*s%s", p->log->name,
                          (unsigned long long)p->line, replay_issue_text(issue), what, shown,
                          text, len > 120 ? "..." : "");
  p->log->skipped[issue]++;
  if (p->opts->warnings != NULL && p->warned < p->opts->max_warnings)
    fprintf(p->opts->warnings, "%s:%llu: skipped (%s): %s\n", p->log->name,
            (unsigned long long)p->line, replay_issue_text(issue), what);
  p->warned++;
  return RMMC_SUCCESS;
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap ? *cap : 1024;
  while (n < need) n *= 2;
  void *a = realloc(*arr, n * elem);
  if (a == NULL) return false;
  *arr = a;
  *cap = n;
  return true;
}

static rmmc_status_t no_memory(parser_t *p) {
  return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s:%llu: no host memory to hold the log",
                        p->log->name, (unsigned long long)p->line);
}

/* Splits a line at commas into at most max fields (spaces around trimmed);
 * returns the number of fields. */
static int split(const char *s, size_t len, field_t *fields, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && s[i] != ',') continue;
    if (n == max) return max + 1;
    size_t a = start, b = i;
    while (a < b && isspace((unsigned char)s[a])) a++;
    while (b > a && isspace((unsigned char)s[b - 1])) b--;
    fields[n++] = (field_t){s + a, b - a};
    start = i + 1;
  }
  return n;
}

#define MAX_FIELDS 32

static rmmc_status_t parse_header(parser_t *p, const char *s, size_t len) {
  field_t f[MAX_FIELDS];
  int n = split(s, len, f, MAX_FIELDS);
  if (n > MAX_FIELDS)
    return rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: header has more than %d columns",
                          p->log->name, (unsigned long long)p->line, MAX_FIELDS);
  for (int c = 0; c < NCOLS; c++) p->col[c] = -1;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < NCOLS; c++)
      if (field_is(f[i], column_names[c])) {
        if (p->col[c] != -1)
          return rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: header names column '%s' twice",
                                p->log->name, (unsigned long long)p->line, column_names[c]);
        p->col[c] = i;
      }
  for (int c = 0; c < NCOLS; c++)
    if (column_required[c] && p->col[c] == -1) {
      int shown = len > 120 ? 120 : (int)len;
      return rmmc_set_error(RMMC_ERROR_PARSE,
                            "%s:%llu: missing columns: the header has no '%s' column (an RMM "
                            "log starts with Thread,Time,Action,Pointer,Size,Stream)\n  %.*s",
                            p->log->name, (unsigned long long)p->line, column_names[c], shown, s);
    }
  p->nfields = n;
  p->have_header = true;
  return RMMC_SUCCESS;
}

/* The dense index of a logged thread or stream, adding it if new. */
static rmmc_status_t intern(parser_t *p, map_t *m, uint64_t **ids, uint32_t *n, size_t *cap,
                            uint64_t id, uint32_t *out) {
  uint32_t v = map_get(m, id);
  if (v != MAP_EMPTY) {
    *out = v;
    return RMMC_SUCCESS;
  }
  if (!grow((void **)ids, cap, (size_t)*n + 1, sizeof **ids) || !map_put(m, id, *n))
    return no_memory(p);
  (*ids)[*n] = id;
  *out = (*n)++;
  return RMMC_SUCCESS;
}

static rmmc_status_t parse_line(parser_t *p, const char *s, size_t len) {
  replay_log_t *log = p->log;
  field_t f[MAX_FIELDS];
  int n = split(s, len, f, MAX_FIELDS);
  if (n < p->nfields)
    return bad_line(p, REPLAY_ISSUE_MISSING_COLUMNS, s, len, "%d field%s, the header has %d", n,
                    n == 1 ? "" : "s", p->nfields);
  if (n > p->nfields)
    return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len, "%s fields, the header has %d",
                    n > MAX_FIELDS ? "too many" : "more", p->nfields);
  field_t action = f[p->col[COL_ACTION]];
  int act; /* 0 allocate, 1 free, 2 allocate failure */
  if (field_is(action, "allocate")) act = 0;
  else if (field_is(action, "free") || field_is(action, "deallocate")) act = 1;
  else if (field_is(action, "allocate failure")) act = 2;
  else
    return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len,
                    "unknown action '%.*s' (allocate, free or allocate failure)", (int)action.len,
                    action.p);
  uint64_t ptr, size, thread = 0, stream = 0;
  int64_t t = 0;
  field_t fp = f[p->col[COL_POINTER]], fs = f[p->col[COL_SIZE]];
  if (!parse_hex(fp, &ptr))
    return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len, "pointer '%.*s' is not hex", (int)fp.len,
                    fp.p);
  if (!parse_dec(fs, &size))
    return bad_line(p, REPLAY_ISSUE_BAD_SIZE, s, len, "size '%.*s' is not a byte count",
                    (int)fs.len, fs.p);
  if (p->col[COL_THREAD] >= 0) {
    field_t ft = f[p->col[COL_THREAD]];
    if (!parse_dec(ft, &thread) &&
        !(ft.len > 2 && ft.p[0] == '0' && (ft.p[1] == 'x' || ft.p[1] == 'X') && parse_hex(ft, &thread)))
      return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len, "thread '%.*s' is not a number",
                      (int)ft.len, ft.p);
  }
  if (p->col[COL_STREAM] >= 0) {
    field_t fst = f[p->col[COL_STREAM]];
    if (!parse_hex(fst, &stream))
      return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len, "stream '%.*s' is not hex",
                      (int)fst.len, fst.p);
  }
  if (p->col[COL_TIME] >= 0) {
    field_t ftm = f[p->col[COL_TIME]];
    if (!parse_time(ftm, &t))
      return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len,
                      "time '%.*s' is neither microseconds nor HH:MM:SS.ffffff", (int)ftm.len,
                      ftm.p);
  }
  if (act == 2) {
    log->logged_failures++;
    goto timed;
  }
  if (ptr == 0) {
    if (act == 0 && size != 0)
      return bad_line(p, REPLAY_ISSUE_MALFORMED, s, len,
                      "allocation of %llu bytes returned a null pointer (log it as 'allocate "
                      "failure')",
                      (unsigned long long)size);
    log->null_events++;
    goto timed;
  }
  if (act == 0 && size > REPLAY_MAX_BYTES - p->live)
    return bad_line(p, REPLAY_ISSUE_BAD_SIZE, s, len,
                    size > REPLAY_MAX_BYTES
                        ? "%llu bytes is more than the replay can represent (4 EiB, 2^62 bytes)"
                        : "%llu bytes would take the live bytes past what the replay can "
                          "represent (4 EiB, 2^62 bytes)",
                    (unsigned long long)size);
  uint32_t slot = map_get(&p->pointers, ptr);
  if (act == 0) {
    if (slot != MAP_EMPTY)
      return bad_line(p, REPLAY_ISSUE_DUPLICATE_POINTER, s, len,
                      "0x%llx is still live (allocated with %llu bytes, not yet freed)",
                      (unsigned long long)ptr, (unsigned long long)p->slot_size[slot]);
    if (log->nslots == MAP_EMPTY - 1)
      return rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: more than %u allocations", log->name,
                            (unsigned long long)p->line, (unsigned)(MAP_EMPTY - 1));
    slot = log->nslots;
    if (!grow((void **)&p->slot_size, &p->slots_cap, (size_t)slot + 1, sizeof *p->slot_size) ||
        !map_put(&p->pointers, ptr, slot))
      return no_memory(p);
    p->slot_size[slot] = size;
    log->nslots++;
  } else {
    if (slot == MAP_EMPTY)
      return bad_line(p, REPLAY_ISSUE_UNKNOWN_POINTER, s, len,
                      "0x%llx was not allocated earlier in the log, or was freed already",
                      (unsigned long long)ptr);
    if (p->slot_size[slot] != size) {
      rmmc_status_t st = bad_line(p, REPLAY_ISSUE_SIZE_MISMATCH, s, len,
                                  "0x%llx was allocated with %llu bytes, freed with %llu%s",
                                  (unsigned long long)ptr, (unsigned long long)p->slot_size[slot],
                                  (unsigned long long)size,
                                  p->opts->lenient ? " (replayed with the allocation's size)" : "");
      if (st != RMMC_SUCCESS) return st;
      size = p->slot_size[slot];
    }
    map_remove(&p->pointers, ptr);
  }
  uint32_t ti, si;
  rmmc_status_t st =
      intern(p, &p->threads, &log->thread_ids, &log->nthreads, &p->threads_cap, thread, &ti);
  if (st == RMMC_SUCCESS)
    st = intern(p, &p->streams, &log->stream_ids, &log->nstreams, &p->streams_cap, stream, &si);
  if (st != RMMC_SUCCESS) return st;
  if (log->nthreads > REPLAY_MAX_THREADS)
    return rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: more than %d threads", log->name,
                          (unsigned long long)p->line, REPLAY_MAX_THREADS);
  if (!grow((void **)&log->events, &p->events_cap, log->nevents + 1, sizeof *log->events))
    return no_memory(p);
  log->events[log->nevents] = (replay_event_t){
      .size = size, .slot = slot, .stream = si, .thread = (uint16_t)ti, .action = (uint8_t)act};
  log->nevents++;
  if (act == REPLAY_ALLOCATE) {
    log->allocations++;
    p->live += size;
    if (p->live > log->peak_live) {
      log->peak_live = p->live;
      log->peak_event = log->nevents - 1;
    }
  } else {
    log->frees++;
    p->live -= size;
  }
timed:
  if (p->col[COL_TIME] >= 0) {
    if (!log->has_time) log->first_time_us = t;
    log->has_time = true;
    log->last_time_us = t;
  }
  return RMMC_SUCCESS;
}

static rmmc_status_t handle_line(parser_t *p, const char *s, size_t len) {
  p->line++;
  p->log->lines = p->line;
  if (len > 0 && s[len - 1] == '\r') len--;
  size_t i = 0;
  while (i < len && isspace((unsigned char)s[i])) i++;
  if (i == len) return RMMC_SUCCESS; /* blank */
  if (!p->have_header) return parse_header(p, s, len);
  return parse_line(p, s, len);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A progress line on opts->progress about once a second while reading and
 * one at the end: long logs take minutes to read. Checked once per 1 MiB
 * chunk, so it costs nothing per line. */
static void progress(parser_t *p, bool last) {
  FILE *f = p->opts->progress;
  if (f == NULL) return;
  double t = now_seconds();
  if (p->next_progress == 0) p->next_progress = t + 1.0;
  if (!last && t < p->next_progress) return;
  p->next_progress = t + 1.0;
  fprintf(f, "rmmc-replay: reading %s: %.1f MiB, %llu events%s\n", p->log->name,
          (double)p->bytes_read / (1 << 20), (unsigned long long)p->log->nevents,
          last ? ", done" : "");
  fflush(f);
}

static rmmc_status_t parse_all(parser_t *p, reader_t *r) {
  size_t cap = CHUNK * 2, have = 0;
  char *buf = malloc(cap);
  if (buf == NULL) return no_memory(p);
  rmmc_status_t st = RMMC_SUCCESS;
  for (;;) {
    if (cap - have < CHUNK) {
      /* A line longer than the buffer: grow (up to a sane bound). */
      if (cap >= ((size_t)64 << 20)) {
        st = rmmc_set_error(RMMC_ERROR_PARSE, "%s:%llu: line longer than 64 MiB", p->log->name,
                            (unsigned long long)p->line + 1);
        break;
      }
      char *b = realloc(buf, cap * 2);
      if (b == NULL) {
        st = no_memory(p);
        break;
      }
      buf = b;
      cap *= 2;
    }
    long got = reader_read(r, buf + have, CHUNK);
    if (got < 0) {
      st = RMMC_ERROR_IO;
      break;
    }
    have += (size_t)got;
    p->bytes_read += (uint64_t)got;
    progress(p, false);
    size_t start = 0;
    for (;;) {
      char *nl = memchr(buf + start, '\n', have - start);
      if (nl == NULL) break;
      st = handle_line(p, buf + start, (size_t)(nl - (buf + start)));
      if (st != RMMC_SUCCESS) goto out;
      start = (size_t)(nl - buf) + 1;
    }
    memmove(buf, buf + start, have - start);
    have -= start;
    if (got == 0) {
      if (have > 0) st = handle_line(p, buf, have); /* last line without a newline */
      break;
    }
  }
out:
  free(buf);
  if (st == RMMC_SUCCESS) progress(p, true);
  if (st == RMMC_SUCCESS && !p->have_header)
    st = rmmc_set_error(RMMC_ERROR_PARSE,
                        "%s: empty log: expected a header line such as "
                        "Thread,Time,Action,Pointer,Size,Stream",
                        p->log->name);
  return st;
}

void replay_log_free(replay_log_t *log) {
  if (log == NULL) return;
  free(log->name);
  free(log->events);
  free(log->thread_ids);
  free(log->stream_ids);
  free(log);
}

static rmmc_status_t read_log(reader_t *r, const char *name, const replay_read_options_t *options,
                              replay_log_t **out) {
  replay_read_options_t opts = REPLAY_READ_OPTIONS_INIT;
  if (options != NULL) opts = *options;
  parser_t p;
  memset(&p, 0, sizeof p);
  p.opts = &opts;
  p.log = calloc(1, sizeof *p.log);
  rmmc_status_t st = RMMC_SUCCESS;
  if (p.log == NULL || (p.log->name = strdup(name)) == NULL) {
    free(p.log);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", name);
  }
  if (!map_init(&p.pointers, 1024) || !map_init(&p.threads, 64) || !map_init(&p.streams, 64))
    st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "%s: no host memory", name);
  if (st == RMMC_SUCCESS) st = parse_all(&p, r);
  if (st == RMMC_SUCCESS && opts.lenient && opts.warnings != NULL &&
      p.warned > opts.max_warnings)
    fprintf(opts.warnings, "%s: %u more skipped lines not shown\n", name,
            p.warned - opts.max_warnings);
  p.log->live_at_end = p.live;
  p.log->outstanding_at_end = p.pointers.count;
  free(p.pointers.slots);
  free(p.threads.slots);
  free(p.streams.slots);
  free(p.slot_size);
  if (st != RMMC_SUCCESS) {
    replay_log_free(p.log);
    return st;
  }
  *out = p.log;
  return RMMC_SUCCESS;
}

rmmc_status_t replay_log_read(const char *path, const replay_read_options_t *options,
                              replay_log_t **out) {
  if (path == NULL || out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_log_read: NULL argument");
  *out = NULL;
  reader_t r;
  rmmc_status_t st = reader_open(&r, path, options ? options->input : REPLAY_INPUT_AUTO);
  if (st != RMMC_SUCCESS) return st;
  st = read_log(&r, path, options, out);
  st = reader_close(&r, st);
  if (st != RMMC_SUCCESS && *out != NULL) {
    replay_log_free(*out);
    *out = NULL;
  }
  return st;
}

rmmc_status_t replay_log_parse(const char *text, size_t len, const char *name,
                               const replay_read_options_t *options, replay_log_t **out) {
  if (text == NULL || out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "replay_log_parse: NULL argument");
  *out = NULL;
  reader_t r;
  memset(&r, 0, sizeof r);
  r.mem = text;
  r.mem_len = len;
  r.path = name ? name : "(log)";
  return read_log(&r, r.path, options, out);
}

void replay_log_live_series(const replay_log_t *log, size_t nbuckets, uint64_t *out) {
  memset(out, 0, nbuckets * sizeof *out);
  uint64_t live = 0;
  for (size_t i = 0; i < log->nevents; i++) {
    const replay_event_t *e = &log->events[i];
    live = e->action == REPLAY_ALLOCATE ? live + e->size : live - e->size;
    size_t b = (size_t)((uint64_t)i * nbuckets / log->nevents);
    if (live > out[b]) out[b] = live;
  }
}
