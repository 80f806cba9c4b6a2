/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hints for the stack-spec parser's messages: the registered resource or
 * option closest to a misspelled one ("did you mean 'initial'?"), and what
 * to write instead of a decimal size unit (GB) that rmmc refuses as
 * ambiguous. Pure string work over the spec table.
 */
#include <ctype.h>
#include <string.h>

#include "base/spec.h"
#include "base/suggest.h"

/* Optimal string alignment distance (Levenshtein plus adjacent swaps),
 * case-insensitive; words longer than 63 characters are never close. */
static size_t distance(const char *a, size_t n, const char *b, size_t m) {
  size_t d[64][64];
  if (n >= 64 || m >= 64) return SIZE_MAX;
  for (size_t i = 0; i <= n; i++) d[i][0] = i;
  for (size_t j = 0; j <= m; j++) d[0][j] = j;
  for (size_t i = 1; i <= n; i++) {
    for (size_t j = 1; j <= m; j++) {
      size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      size_t v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  }
  return d[n][m];
}

/* Keeps `name` in *best if it is closer to the word than what is there and
 * close enough: at most a third of the word's letters (at least 1) off. */
static void consider(const char *word, size_t len, const char *name, const char **best,
                     size_t *best_d) {
  size_t d = distance(word, len, name, strlen(name));
  size_t limit = len / 3 > 1 ? len / 3 : 1;
  if (d <= limit && d < *best_d) {
    *best = name;
    *best_d = d;
  }
}

const char *rmmc__suggest_resource(const char *word, size_t len) {
  const char *best = NULL;
  size_t best_d = SIZE_MAX;
  for (const rmmc__spec_entry_t *const *e = rmmc__spec_entries; *e != NULL; e++)
    consider(word, len, (*e)->name, &best, &best_d);
  return best;
}

const char *rmmc__suggest_option(const rmmc__spec_entry_t *entry, const char *word, size_t len) {
  const char *best = NULL;
  size_t best_d = SIZE_MAX;
  for (const rmmc__spec_option_t *o = entry->options; o != NULL && o->name != NULL; o++)
    consider(word, len, o->name, &best, &best_d);
  for (const rmmc__spec_alias_t *a = rmmc__spec_aliases; a->layer != NULL; a++)
    if (strcmp(a->layer, entry->name) == 0 && a->alias != NULL) consider(word, len, a->alias, &best, &best_d);
  return best;
}

const char *rmmc__size_unit_hint(const char *text, size_t len) {
  /* The unit: the letters at the end. */
  size_t u = len;
  while (u > 0 && isalpha((unsigned char)text[u - 1])) u--;
  size_t ulen = len - u;
  static const char *const decimal[] = {"KB", "MB", "GB", "TB", "kB", "kiB"};
  for (size_t i = 0; i < sizeof decimal / sizeof decimal[0]; i++)
    if (ulen == strlen(decimal[i]) && strncmp(text + u, decimal[i], ulen) == 0)
      return " (KB, MB, GB and TB are refused as ambiguous: sizes are binary, so write KiB, "
             "MiB, GiB or TiB, or the number of bytes)";
  return "";
}
