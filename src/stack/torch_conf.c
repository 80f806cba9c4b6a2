/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Recognising PyTorch's allocator options where rmmc wants a stack spec.
 *
 * People set RMMC_ALLOC_CONF the way they set PYTORCH_CUDA_ALLOC_CONF:
 * `expandable_segments:True`, `backend:cudaMallocAsync,max_split_size_mb:128`.
 * That is comma-separated key:value pairs, never a valid stack spec (no
 * resource has a ':' in its name), so a value made only of such pairs is
 * taken for PyTorch's syntax, and the message names the rmmc spelling of
 * the whole value and what each key becomes. Pure string work: no CUDA, no
 * allocation beyond the caller's buffer.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/internal.h"

/* What one of PyTorch's keys becomes in rmmc (NULL: nothing to say). */
typedef struct torch_key {
  const char *key;
  const char *note;
} torch_key_t;

static const torch_key_t torch_keys[] = {
    {"expandable_segments",
     "expandable_segments:True is what pool > cuda does by default (virtual memory over one "
     "address space; expandable=false takes chunks instead)"},
    {"backend", "backend:cudaMallocAsync is cuda_async, backend:native is pool > cuda"},
    {"max_split_size_mb",
     "max_split_size_mb has no rmmc option: the pool's split_limit keeps large free chunks "
     "whole instead"},
    {"garbage_collection_threshold",
     "garbage_collection_threshold is the pool's gc_threshold (a fraction)"},
    {"roundup_power2_divisions",
     "roundup_power2_divisions has no rmmc option: binning > pool > cuda serves small sizes "
     "from size classes"},
    {"pinned_use_cuda_host_register", "pinned_use_cuda_host_register has no rmmc option"},
    {"pinned_num_register_threads", "pinned_num_register_threads has no rmmc option"},
    {"release_lock_on_cudamalloc", "release_lock_on_cudamalloc has no rmmc option"},
};

/* The value's next "key:value" item at *s: key in [*k, *k + *klen), value
 * in [*v, *v + *vlen); advances *s past the item and its comma. False if
 * the text there is not such an item. */
static bool next_item(const char **s, const char **k, size_t *klen, const char **v, size_t *vlen) {
  const char *p = *s;
  while (isspace((unsigned char)*p)) p++;
  *k = p;
  while (isalnum((unsigned char)*p) || *p == '_') p++;
  *klen = (size_t)(p - *k);
  while (isspace((unsigned char)*p)) p++;
  if (*klen == 0 || *p != ':') return false;
  p++;
  while (isspace((unsigned char)*p)) p++;
  *v = p;
  while (*p != '\0' && *p != ',' && !isspace((unsigned char)*p)) p++;
  *vlen = (size_t)(p - *v);
  while (isspace((unsigned char)*p)) p++;
  if (*vlen == 0 || (*p != '\0' && *p != ',')) return false;
  *s = *p == ',' ? p + 1 : p;
  return true;
}

static bool item_is(const char *k, size_t klen, const char *name) {
  return klen == strlen(name) && strncmp(k, name, klen) == 0;
}

static bool value_is(const char *v, size_t vlen, const char *word) {
  return vlen == strlen(word) && strncasecmp(v, word, vlen) == 0;
}

bool rmmc__torch_conf_hint(const char *conf, char *buf, size_t len) {
  if (conf == NULL || buf == NULL || len == 0) return false;
  buf[0] = '\0';
  /* First pass: is the whole value key:value items? What do they ask? */
  const char *s = conf, *k, *v;
  size_t klen, vlen;
  int items = 0;
  bool expandable = false, async = false;
  while (*s != '\0') {
    if (!next_item(&s, &k, &klen, &v, &vlen)) return false;
    items++;
    if (item_is(k, klen, "expandable_segments") && value_is(v, vlen, "true")) expandable = true;
    if (item_is(k, klen, "backend") && value_is(v, vlen, "cudaMallocAsync")) async = true;
  }
  if (items == 0) return false;
  (void)expandable; /* the pool's default */
  const char *spec = async ? "cuda_async" : "pool > cuda";
  size_t n = (size_t)snprintf(buf, len,
                              "this is PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax (key:value); "
                              "RMMC_ALLOC_CONF takes a stack spec. The rmmc spelling: "
                              "RMMC_ALLOC_CONF='%s'",
                              spec);
  /* Second pass: a note per key, each once. */
  for (size_t i = 0; i < sizeof torch_keys / sizeof torch_keys[0]; i++) {
    bool seen = false;
    for (s = conf; *s != '\0' && next_item(&s, &k, &klen, &v, &vlen);)
      seen = seen || item_is(k, klen, torch_keys[i].key);
    if (seen && n < len) n += (size_t)snprintf(buf + n, len - n, "; %s", torch_keys[i].note);
  }
  for (s = conf; *s != '\0' && next_item(&s, &k, &klen, &v, &vlen);) {
    bool known = false;
    for (size_t i = 0; i < sizeof torch_keys / sizeof torch_keys[0]; i++)
      known = known || item_is(k, klen, torch_keys[i].key);
    if (!known && n < len)
      n += (size_t)snprintf(buf + n, len - n, "; '%.*s' is not a PyTorch option rmmc knows",
                            (int)klen, k);
  }
  return true;
}
