/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stack-spec parser: `name(key=value, ...) > name > ...`.
 *
 * Parsing and building are separate: the whole spec is parsed and checked
 * against the registered entries first (so a typo in the outermost layer
 * builds nothing), then the layers are built innermost first. Every error
 * message quotes the spec with a caret under the offending word.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmc/registry.h"
#include "rmmc/spec.h"
#include "base/spec.h"
#include "base/suggest.h"

#define MAX_LAYERS 16

typedef struct layer {
  const rmmc__spec_entry_t *entry;
  size_t column; /* of the name, for messages */
  rmmc__spec_args_t args;
} layer_t;

typedef struct parser {
  const char *spec;
  size_t pos;
  bool over; /* rmmc_stack_create_over: layers above an existing resource, no base */
  int nlayers;
  layer_t layers[MAX_LAYERS];
  /* The values' texts, each NUL-terminated: together no longer than the
   * spec plus one NUL per value. */
  size_t ntext;
  char text[RMMC__SPEC_MAX_LENGTH + MAX_LAYERS * RMMC__SPEC_MAX_ARGS];
} parser_t;

/* Records a parse error at [col, col+len) with the spec and a caret line. */
static rmmc_status_t parse_error(const parser_t *p, size_t col, size_t len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static rmmc_status_t parse_error(const parser_t *p, size_t col, size_t len, const char *fmt, ...) {
  char what[640], caret[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  size_t n = 0;
  for (size_t i = 0; i < col && n + 1 < sizeof caret; i++) caret[n++] = ' ';
  if (len == 0) len = 1;
  for (size_t i = 0; i < len && n + 1 < sizeof caret; i++) caret[n++] = '^';
  caret[n] = '\0';
  return rmmc_set_error(RMMC_ERROR_PARSE, "stack spec: %s at column %zu\n  %s\n  %s", what,
                        col + 1, p->spec, caret);
}

static void skip_space(parser_t *p) {
  while (isspace((unsigned char)p->spec[p->pos])) p->pos++;
}

static bool is_word_char(char c) {
  return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-' || c == '+' || c == '%' ||
         c == ':' || c == '/';
}

/* Reads a word (name or value) and returns its length. */
static size_t read_word(parser_t *p) {
  size_t start = p->pos;
  while (is_word_char(p->spec[p->pos])) p->pos++;
  return p->pos - start;
}

static const rmmc__spec_entry_t *find_entry(const char *name, size_t len) {
  for (const rmmc__spec_entry_t *const *e = rmmc__spec_entries; *e != NULL; e++)
    if (strlen((*e)->name) == len && strncmp((*e)->name, name, len) == 0) return *e;
  return NULL;
}

static bool same_word(const char *word, const char *name, size_t len) {
  return name != NULL && strlen(name) == len && strncmp(name, word, len) == 0;
}

static const rmmc__spec_option_t *option_named(const rmmc__spec_entry_t *e, const char *name) {
  for (const rmmc__spec_option_t *o = e->options; o != NULL && o->name != NULL; o++)
    if (strcmp(o->name, name) == 0) return o;
  return NULL;
}

/* The option a spec names by its name or by one of its aliases; *key is set
 * to the name as the entry spells it (static text). */
static const rmmc__spec_option_t *find_option(const rmmc__spec_entry_t *e, const char *name,
                                              size_t len, const char **key) {
  for (const rmmc__spec_option_t *o = e->options; o != NULL && o->name != NULL; o++)
    if (same_word(name, o->name, len)) {
      *key = o->name;
      return o;
    }
  for (const rmmc__spec_alias_t *a = rmmc__spec_aliases; a->layer != NULL; a++)
    if (strcmp(a->layer, e->name) == 0 && same_word(name, a->alias, len)) {
      *key = a->alias;
      return option_named(e, a->name);
    }
  return NULL;
}

/* Whether t is the word `none`, in any letter case. */
static bool is_none(const char *t) {
  static const char none[] = "none";
  for (size_t i = 0; i < sizeof none; i++)
    if (tolower((unsigned char)t[i]) != none[i]) return false;
  return true;
}

/* The entry's alias row for option o with no_limit set, or NULL. */
static const rmmc__spec_alias_t *no_limit_of(const rmmc__spec_entry_t *e,
                                              const rmmc__spec_option_t *o) {
  for (const rmmc__spec_alias_t *a = rmmc__spec_aliases; a->layer != NULL; a++)
    if (strcmp(a->layer, e->name) == 0 && a->no_limit && strcmp(a->name, o->name) == 0) return a;
  return NULL;
}

/* The aliases of option o, ", "-separated, into buf ("" for none). */
static void list_aliases(const rmmc__spec_entry_t *e, const rmmc__spec_option_t *o, char *buf,
                         size_t len) {
  size_t n = 0;
  if (len > 0) buf[0] = '\0';
  for (const rmmc__spec_alias_t *a = rmmc__spec_aliases; a->layer != NULL; a++)
    if (strcmp(a->layer, e->name) == 0 && a->alias != NULL && strcmp(a->name, o->name) == 0 &&
        n < len)
      n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", a->alias);
}

/* The resource's option names, comma-separated, into buf (len >= 8). A
 * name is never cut: where the next one would not fit with room for
 * ", ..." after it, the list ends in ", ..." instead. */
static void list_options(const rmmc__spec_entry_t *e, char *buf, size_t len) {
  static const char more[] = ", ...";
  size_t n = 0;
  buf[0] = '\0';
  for (const rmmc__spec_option_t *o = e->options; o != NULL && o->name != NULL; o++) {
    size_t need = (n ? 2 : 0) + strlen(o->name);
    bool last = o[1].name == NULL;
    if (n + need + (last ? 0 : sizeof more - 1) >= len) {
      memcpy(buf + n, more + (n ? 0 : 2), sizeof more - (n ? 0 : 2));
      return;
    }
    n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", o->name);
  }
  if (n == 0) snprintf(buf, len, "none");
}

RMMC_API rmmc_status_t rmmc_parse_size(const char *text, size_t *out) {
  if (text == NULL || out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "parse_size: NULL argument");
  bool too_large;
  if (rmmc__parse_bytes(text, strlen(text), out, &too_large) == RMMC_SUCCESS) return RMMC_SUCCESS;
  if (too_large)
    return rmmc_set_error(RMMC_ERROR_PARSE, "'%s' is out of range: sizes are below 16 EiB", text);
  return rmmc_set_error(RMMC_ERROR_PARSE,
                        "'%s' is not a size (write 1024, 64KiB, 256MiB, 1.5GiB)%s", text,
                        rmmc__size_unit_hint(text, strlen(text)));
}

static const char *type_hint(rmmc__opt_type_t t) {
  switch (t) {
  case RMMC__OPT_BYTES: return "a size such as 256MiB";
  case RMMC__OPT_BYTES_PCT: return "a size such as 256MiB or a percentage such as 80%";
  case RMMC__OPT_INT: return "an integer";
  case RMMC__OPT_DOUBLE: return "a number";
  case RMMC__OPT_BOOL: return "true or false";
  case RMMC__OPT_STRING: return "a word or a quoted string";
  }
  return "a value";
}

/* The error for a value of option o that is of the right form but out of
 * range: quotes the value as written. */
static rmmc_status_t out_of_range(const parser_t *p, const rmmc__spec_value_t *v, size_t col,
                                  size_t len, const char *range) {
  return parse_error(p, col, len, "%s=%.*s is out of range (%s)", v->key, (int)len,
                     p->spec + col, range);
}

/* Converts the value text at [col, col+len) for option o into v; t is a
 * NUL-terminated copy of it that v keeps. */
static rmmc_status_t parse_value(const parser_t *p, const rmmc__spec_entry_t *e,
                                 const rmmc__spec_option_t *o, size_t col, size_t len,
                                 const char *t, rmmc__spec_value_t *v) {
  v->option = o;
  v->text = t;
  char *end;
  const rmmc__spec_alias_t *none = no_limit_of(e, o);
  if (none != NULL && is_none(t)) {
    v->bytes = none->no_limit_value;
    return RMMC_SUCCESS;
  }
  switch (o->type) {
  case RMMC__OPT_BYTES_PCT:
    if (len > 1 && t[len - 1] == '%') {
      double pct = strtod(t, &end);
      while (end < t + len - 1 && isspace((unsigned char)*end)) end++; /* "80 %" */
      if (end != t + len - 1 || !(pct > 0.0 && pct <= 100.0))
        return parse_error(p, col, len, "'%s' wants a percentage in (0, 100]", v->key);
      v->is_percent = true;
      v->number = pct;
      return RMMC_SUCCESS;
    }
    /* fall through */
  case RMMC__OPT_BYTES: {
    bool too_large;
    if (rmmc__parse_bytes(t, len, &v->bytes, &too_large) == RMMC_SUCCESS) return RMMC_SUCCESS;
    if (too_large) return out_of_range(p, v, col, len, "sizes are below 16 EiB");
    return parse_error(p, col, len, "'%s' is not %s%s", t, type_hint(o->type),
                       rmmc__size_unit_hint(t, len));
  }
  case RMMC__OPT_INT:
    errno = 0;
    v->integer = strtoll(t, &end, 10);
    if (end == t || *end != '\0')
      return parse_error(p, col, len, "'%s' is not %s", t, type_hint(o->type));
    if (errno == ERANGE) return out_of_range(p, v, col, len, "integers are 64-bit");
    return RMMC_SUCCESS;
  case RMMC__OPT_DOUBLE: {
    errno = 0;
    double x = strtod(t, &end);
    if (end == t || *end != '\0' || isnan(x))
      return parse_error(p, col, len, "'%s' is not %s", t, type_hint(o->type));
    if (errno == ERANGE || isinf(x)) return out_of_range(p, v, col, len, "not a finite number");
    v->number = x;
    return RMMC_SUCCESS;
  }
  case RMMC__OPT_BOOL:
    if (!strcmp(t, "true") || !strcmp(t, "on") || !strcmp(t, "yes") || !strcmp(t, "1"))
      v->boolean = true;
    else if (!strcmp(t, "false") || !strcmp(t, "off") || !strcmp(t, "no") || !strcmp(t, "0"))
      v->boolean = false;
    else
      return parse_error(p, col, len, "'%s' is not %s", t, type_hint(o->type));
    return RMMC_SUCCESS;
  case RMMC__OPT_STRING:
    return RMMC_SUCCESS;
  }
  return parse_error(p, col, len, "option '%s' has an unknown type", o->name);
}

/* A NUL-terminated copy of [col, col+len) of the spec, kept in the parser
 * (parse_spec bounds the spec, so it always fits). */
static const char *keep_text(parser_t *p, size_t col, size_t len) {
  char *t = p->text + p->ntext;
  memcpy(t, p->spec + col, len);
  t[len] = '\0';
  p->ntext += len + 1;
  return t;
}

static rmmc_status_t parse_options(parser_t *p, layer_t *l) {
  p->pos++; /* '(' */
  skip_space(p);
  if (p->spec[p->pos] == ')') {
    p->pos++;
    return RMMC_SUCCESS;
  }
  for (;;) {
    skip_space(p);
    size_t kcol = p->pos;
    size_t klen = read_word(p);
    if (klen == 0) return parse_error(p, kcol, 1, "expected an option name");
    const char *key = NULL;
    const rmmc__spec_option_t *o = find_option(l->entry, p->spec + kcol, klen, &key);
    if (o == NULL) {
      char names[384];
      list_options(l->entry, names, sizeof names);
      const char *near = rmmc__suggest_option(l->entry, p->spec + kcol, klen);
      if (near != NULL)
        return parse_error(p, kcol, klen, "%s has no option '%.*s'; did you mean '%s'? (it takes: %s)",
                           l->entry->name, (int)klen, p->spec + kcol, near, names);
      return parse_error(p, kcol, klen, "%s has no option '%.*s' (it takes: %s)", l->entry->name,
                         (int)klen, p->spec + kcol, names);
    }
    const rmmc__spec_value_t *before = rmmc__spec_find(&l->args, o->name);
    if (before != NULL && strcmp(before->key, key) == 0)
      return parse_error(p, kcol, klen, "option '%s' given twice", key);
    if (before != NULL)
      return parse_error(p, kcol, klen,
                         "option '%s' given twice (as '%s' before: another name for it)", key,
                         before->key);
    if (l->args.count == RMMC__SPEC_MAX_ARGS)
      return parse_error(p, kcol, klen, "too many options");
    skip_space(p);
    if (p->spec[p->pos] != '=')
      return parse_error(p, p->pos, 1, "expected '=' after '%s'", key);
    p->pos++;
    skip_space(p);
    size_t vcol = p->pos, vlen;
    if (p->spec[p->pos] == '"') {
      const char *close = strchr(p->spec + p->pos + 1, '"');
      if (close == NULL) return parse_error(p, vcol, 1, "unterminated quoted string");
      vcol++;
      vlen = (size_t)(close - (p->spec + vcol));
      p->pos = (size_t)(close - p->spec) + 1;
    } else {
      vlen = read_word(p);
      /* A size may keep a space before its unit: initial=64 MiB, max=80 %. */
      size_t q = p->pos;
      while (isspace((unsigned char)p->spec[q])) q++;
      if ((o->type == RMMC__OPT_BYTES || o->type == RMMC__OPT_BYTES_PCT) && vlen > 0 && q > p->pos &&
          (isalpha((unsigned char)p->spec[q]) || p->spec[q] == '%')) {
        p->pos = q;
        vlen = p->pos - vcol + read_word(p);
      }
    }
    if (vlen == 0) return parse_error(p, vcol, 1, "expected a value for '%s'", key);
    l->args.values[l->args.count].key = key;
    rmmc_status_t st = parse_value(p, l->entry, o, vcol, vlen, keep_text(p, vcol, vlen),
                                   &l->args.values[l->args.count]);
    if (st != RMMC_SUCCESS) return st;
    l->args.count++;
    skip_space(p);
    if (p->spec[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->spec[p->pos] == ')') {
      p->pos++;
      return RMMC_SUCCESS;
    }
    return parse_error(p, p->pos, 1, "expected ',' or ')'");
  }
}

static rmmc_status_t parse(parser_t *p) {
  for (;;) {
    skip_space(p);
    size_t col = p->pos;
    size_t len = read_word(p);
    if (len == 0) {
      if (p->spec[col] == '\0')
        return parse_error(p, col, 1, p->nlayers ? "expected a resource after '>'" : "empty spec");
      return parse_error(p, col, 1, "expected a resource name, found '%c'", p->spec[col]);
    }
    const rmmc__spec_entry_t *e = find_entry(p->spec + col, len);
    if (e == NULL) {
      const char *near = rmmc__suggest_resource(p->spec + col, len);
      if (near != NULL)
        return parse_error(p, col, len, "unknown resource '%.*s'; did you mean '%s'?", (int)len,
                           p->spec + col, near);
      return parse_error(p, col, len, "unknown resource '%.*s' (rmmc-bench --list or Python's rmmc.stack_help() names them all)",
                         (int)len, p->spec + col);
    }
    if (p->nlayers == MAX_LAYERS) return parse_error(p, col, len, "too many layers");
    if (p->over && !e->needs_upstream)
      return parse_error(p, col, len,
                         "%s is a base resource: layers built over an existing resource are "
                         "adaptors and sub-allocators only",
                         e->name);
    layer_t *l = &p->layers[p->nlayers++];
    memset(l, 0, sizeof *l);
    l->entry = e;
    l->column = col;
    l->args.layer = e->name;
    skip_space(p);
    if (p->spec[p->pos] == '(') {
      rmmc_status_t st = parse_options(p, l);
      if (st != RMMC_SUCCESS) return st;
      skip_space(p);
    }
    char c = p->spec[p->pos];
    if (c == '\0') break;
    if (c != '>') return parse_error(p, p->pos, 1, "expected '>' or the end of the spec");
    if (!e->needs_upstream)
      return parse_error(p, col, len, "%s is a base resource and takes no upstream", e->name);
    p->pos++;
  }
  layer_t *last = &p->layers[p->nlayers - 1];
  if (last->entry->needs_upstream && !p->over)
    return parse_error(p, last->column, strlen(last->entry->name),
                       "%s needs an upstream: end the spec with a base resource such as "
                       "'> cuda' or '> host'",
                       last->entry->name);
  return RMMC_SUCCESS;
}

static rmmc_status_t parse_spec(parser_t *p, const char *spec, bool over) {
  memset(p, 0, sizeof *p);
  p->spec = spec;
  p->over = over;
  if (strlen(spec) > RMMC__SPEC_MAX_LENGTH)
    return rmmc_set_error(RMMC_ERROR_PARSE, "stack spec: longer than %d characters",
                          RMMC__SPEC_MAX_LENGTH);
  return parse(p);
}

RMMC_API rmmc_status_t rmmc_stack_validate(const char *spec) {
  if (spec == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack spec is NULL");
  parser_t *p = malloc(sizeof *p);
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stack spec: no host memory");
  rmmc_status_t st = parse_spec(p, spec, false);
  free(p);
  return st;
}

RMMC_API rmmc_status_t rmmc_stack_create(const char *spec, int device, rmmc_resource_t **out) {
  return rmmc__stack_create_hooked(spec, device, NULL, NULL, out);
}

RMMC_API rmmc_status_t rmmc__stack_create_hooked(const char *spec, int device,
                                                 rmmc__stack_hook_fn hook, void *ctx,
                                                 rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack_create: out is NULL");
  *out = NULL;
  if (spec == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack spec is NULL");
  parser_t *p = malloc(sizeof *p);
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stack spec: no host memory");
  rmmc_status_t st = parse_spec(p, spec, false);
  if (st == RMMC_SUCCESS && device == -1 && rmmc__cuda_available())
    st = rmmc_get_current_device(&device);
  rmmc_resource_t *upstream = NULL;
  for (int i = p->nlayers - 1; st == RMMC_SUCCESS && i >= 0; i--) {
    rmmc_resource_t *r = NULL;
    st = p->layers[i].entry->build(&p->layers[i].args, upstream, device, &r);
    rmmc_resource_release(upstream); /* the new layer holds its own reference */
    upstream = st == RMMC_SUCCESS ? r : NULL;
    if (st != RMMC_SUCCESS)
      rmmc__append_error(" (building layer %d, '%s', of \"%s\")", i + 1, p->layers[i].entry->name,
                         spec);
    if (st == RMMC_SUCCESS && hook != NULL && i == p->nlayers - 1) {
      rmmc_resource_t *wrapped = NULL;
      st = hook(ctx, r, &wrapped);
      rmmc_resource_release(r); /* the wrapper holds its own reference, if it wants one */
      upstream = st == RMMC_SUCCESS ? wrapped : NULL;
      if (st == RMMC_SUCCESS && wrapped == NULL)
        st = rmmc_set_error(RMMC_ERROR_INTERNAL, "stack hook returned no resource");
      if (st != RMMC_SUCCESS)
        rmmc__append_error(" (wrapping the base layer '%s' of \"%s\")", p->layers[i].entry->name,
                           spec);
    }
  }
  free(p);
  if (st == RMMC_SUCCESS) *out = upstream;
  return st;
}

/* Parses `spec` in over-mode and builds its layers innermost first on
 * `upstream`, which the innermost layer retains. */
RMMC_API rmmc_status_t rmmc_stack_create_over(const char *spec, rmmc_resource_t *upstream,
                                              rmmc_resource_t **out) {
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack_create_over: out is NULL");
  *out = NULL;
  if (spec == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack spec is NULL");
  if (upstream == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack_create_over: upstream is NULL");
  parser_t *p = malloc(sizeof *p);
  if (p == NULL) return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "stack spec: no host memory");
  rmmc_status_t st = parse_spec(p, spec, true);
  int device = rmmc_resource_device(upstream);
  rmmc_resource_t *below = rmmc_resource_retain(upstream);
  for (int i = p->nlayers - 1; st == RMMC_SUCCESS && i >= 0; i--) {
    rmmc_resource_t *r = NULL;
    st = p->layers[i].entry->build(&p->layers[i].args, below, device, &r);
    if (st != RMMC_SUCCESS)
      rmmc__append_error(" (building layer %d, '%s', of \"%s\" over %s)", i + 1,
                         p->layers[i].entry->name, spec, rmmc_resource_name(upstream));
    rmmc_resource_release(below); /* the new layer holds its own reference */
    below = st == RMMC_SUCCESS ? r : NULL;
  }
  free(p);
  if (st == RMMC_SUCCESS) *out = below;
  else rmmc_resource_release(below);
  return st;
}

/* One option of a help listing: what its value is, in words. */
static const char *type_unit(rmmc__opt_type_t t) {
  switch (t) {
  case RMMC__OPT_BYTES: return "size (bytes; KiB, MiB, GiB, TiB)";
  case RMMC__OPT_BYTES_PCT: return "size (bytes; KiB..TiB) or % of free memory";
  case RMMC__OPT_INT: return "integer";
  case RMMC__OPT_DOUBLE: return "number";
  case RMMC__OPT_BOOL: return "true/false";
  case RMMC__OPT_STRING: return "text";
  }
  return "value";
}

/* Appends line (m characters) to buf as far as it fits, keeping it
 * terminated; *n counts what the whole text needs. */
static void append_line(char *buf, size_t len, size_t *n, const char *line, int w, size_t cap) {
  size_t m = w < 0 ? 0 : (size_t)w < cap ? (size_t)w : cap - 1;
  if (buf != NULL && *n + 1 < len) {
    size_t fit = len - 1 - *n < m ? len - 1 - *n : m;
    memcpy(buf + *n, line, fit);
    buf[*n + fit] = '\0';
  }
  *n += m;
}

RMMC_API rmmc_status_t rmmc_stack_help_resource(const char *name, char *buf, size_t len,
                                                size_t *needed) {
  if (name == NULL || (buf == NULL && len > 0))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "stack_help_resource: NULL argument");
  const rmmc__spec_entry_t *e = find_entry(name, strlen(name));
  if (e == NULL) {
    const char *near = rmmc__suggest_resource(name, strlen(name));
    if (near != NULL)
      return rmmc_set_error(RMMC_ERROR_PARSE, "unknown resource '%s'; did you mean '%s'?", name,
                            near);
    return rmmc_set_error(RMMC_ERROR_PARSE,
                          "unknown resource '%s' (rmmc_stack_help() lists them all)", name);
  }
  size_t n = 0;
  char line[1024];
  if (buf != NULL && len > 0) buf[0] = '\0';
  int w = snprintf(line, sizeof line, "%s: %s (%s)\n", e->name, e->help,
                   e->needs_upstream ? "wraps an upstream" : "a base resource");
  append_line(buf, len, &n, line, w, sizeof line);
  const rmmc__spec_option_t *o = e->options;
  for (; o != NULL && o->name != NULL; o++) {
    /* A row described as data (spec.h, RMMC__SPEC_OPTION) also says its
     * unit, default and range. */
    char type[64], range[96] = "", bounds[80];
    snprintf(type, sizeof type, o->unit != NULL && o->unit[0] != '\0' ? "%s (%s)" : "%s",
             type_unit(o->type), o->unit);
    rmmc__spec_range_text(o, bounds, sizeof bounds);
    if (bounds[0] != '\0') snprintf(range, sizeof range, "; %s", bounds);
    /* The other names a spec may write, and `none` where it means no limit. */
    char aliases[128], extra[192] = "";
    list_aliases(e, o, aliases, sizeof aliases);
    bool none = no_limit_of(e, o) != NULL;
    if (aliases[0] != '\0' || none)
      snprintf(extra, sizeof extra, " (%s%s%s%s)", aliases[0] != '\0' ? "also written " : "",
               aliases, aliases[0] != '\0' && none ? "; " : "", none ? "none: no limit" : "");
    if (o->def != NULL)
      w = snprintf(line, sizeof line, "  %-20s %-44s %s (default %s%s)%s\n", o->name, type,
                   o->help, o->def, range, extra);
    else
      w = snprintf(line, sizeof line, "  %-20s %-44s %s%s\n", o->name, type, o->help, extra);
    append_line(buf, len, &n, line, w, sizeof line);
  }
  if (o == e->options) append_line(buf, len, &n, "  (no options)\n", 15, sizeof line);
  if (needed != NULL) *needed = n;
  return RMMC_SUCCESS;
}

RMMC_API size_t rmmc_stack_help(char *buf, size_t len) {
  size_t n = 0;
  if (buf != NULL && len > 0) buf[0] = '\0';
  for (const rmmc__spec_entry_t *const *e = rmmc__spec_entries; *e != NULL; e++) {
    char opts[512], line[1024];
    list_options(*e, opts, sizeof opts);
    int w = snprintf(line, sizeof line, "  %-18s %s (options: %s)\n", (*e)->name, (*e)->help, opts);
    size_t m = w < 0 ? 0 : (size_t)w < sizeof line ? (size_t)w : sizeof line - 1;
    if (buf != NULL && n + 1 < len) {
      size_t fit = len - 1 - n < m ? len - 1 - n : m;
      memcpy(buf + n, line, fit);
      buf[n + fit] = '\0';
    }
    n += m;
  }
  return n;
}
