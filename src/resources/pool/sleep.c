/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sleep mode: rmmc_pool_pause and rmmc_pool_resume (pool_resource.h has the
 * contract, docs/design.md, "Sleep mode", the reasons). The books stay, the
 * backend unmaps every mapping and resume maps each again at its address.
 * The backup buffer is kept for the next pause; a resume's copies read it
 * until they finish, so whatever writes or frees it first waits for them
 * (an event). Allocation is refused while paused through allocate's one
 * slow-path gate (graphs_routing counts the pause): the hot path pays nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/exports.h"
#include "pool_internal.h"

/* Live ranges closer than this are backed up as one (design.md). */
#define SLEEP_GAP ((size_t)64 << 10)

typedef struct sleep_range {
  uintptr_t addr;
  size_t bytes;
  size_t at; /* offset in the backup buffer */
  const pool_region_t *region;
} sleep_range_t;

struct pool_sleep {
  pool_sleep_head_t head; /* first: p->sleep points here */
  rmmc_pool_pause_mode_t mode; /* of the pause in effect; 0 while awake */
  sleep_range_t *ranges;
  size_t nranges, cap;
  size_t backed_up; /* bytes of the ranges */
  void *host;       /* the backup buffer (pinned for device memory), kept */
  size_t host_bytes;
  cudaEvent_t copied; /* recorded after a resume's copies (device memory) */
  bool copying;       /* ... and not yet waited for */
  uint64_t pauses, resumes;
};

/* Can the pool's memory be read and written by copies? Not over sim, whose
 * addresses have nothing behind them. */
static bool memory_is_real(const pool_t *p) {
  const rmmc_resource_t *r = p->base.upstream;
  while (rmmc_resource_upstream(r) != NULL) r = rmmc_resource_upstream(r);
  return strcmp(rmmc_resource_name(r), "sim") != 0;
}

/* Nothing backed up: nothing to copy back on resume or on the way back. */
static void forget_backup(struct pool_sleep *s) {
  s->nranges = 0;
  s->backed_up = 0;
}

static bool range_push(struct pool_sleep *s, uintptr_t a, size_t n, const pool_region_t *r) {
  if (s->nranges > 0) {
    sleep_range_t *l = &s->ranges[s->nranges - 1];
    if (l->region == r && a >= l->addr + l->bytes && a - (l->addr + l->bytes) <= SLEEP_GAP) {
      l->bytes = a + n - l->addr;
      return true;
    }
  }
  if (s->nranges == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    sleep_range_t *v = realloc(s->ranges, cap * sizeof *v);
    if (v == NULL) return false;
    s->ranges = v;
    s->cap = cap;
  }
  s->ranges[s->nranges++] = (sleep_range_t){a, n, 0, r};
  return true;
}

/* Lists the live blocks of every region in address order (every lock
 * held): blocks handed out of the shared heap, and those of each span. */
static bool collect_live(pool_t *p, struct pool_sleep *s) {
  s->nranges = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next)
    for (pool_block_t *b = r->first; b != NULL; b = b->next) {
      if (b->state == B_USED && !range_push(s, b->addr, pool_bsize(b), r)) return false;
      if (b->state != B_SPAN) continue;
      rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&p->spans, (void *)b->addr);
      if (e == NULL) continue;
      for (pool_block_t *x = ((pool_region_t *)e->value)->first; x != NULL; x = x->next)
        if (x->state == B_USED && !range_push(s, x->addr, pool_bsize(x), r)) return false;
    }
  size_t at = 0;
  for (size_t i = 0; i < s->nranges; i++) s->ranges[i].at = at, at += s->ranges[i].bytes;
  s->backed_up = at;
  return true;
}

/* Marks each mapping a live range (collect_live's, in the same order)
 * touches: a discard pause gives those back last. */
static void mark_live(pool_t *p, const struct pool_sleep *s) {
  size_t k = 0;
  for (pool_region_t *r = p->regions; r != NULL; r = r->next) {
    size_t at = k;
    while (k < s->nranges && s->ranges[k].region == r) k++;
    for (size_t i = 0; i < r->nsegs; i++) {
      pool_seg_t *g = &r->segs[i];
      while (at < k && s->ranges[at].addr + s->ranges[at].bytes <= g->addr) at++;
      g->live = at < k && s->ranges[at].addr < g->addr + g->size;
    }
  }
}

/* Waits for the copies of the last resume, which read the buffer. */
static rmmc_status_t copies_done(struct pool_sleep *s) {
  if (!s->copying) return RMMC_SUCCESS;
  cudaError_t err = cudaEventSynchronize(s->copied);
  if (err != cudaSuccess)
    return rmmc_set_cuda_error(err, "pool sleep: waiting for the restore copies");
  s->copying = false;
  return RMMC_SUCCESS;
}

static void host_free(pool_t *p, struct pool_sleep *s) {
  if (s->host == NULL) return;
  if (p->cuda) (void)cudaFreeHost(s->host);
  else free(s->host);
  s->host = NULL;
  s->host_bytes = 0;
}

/* A backup buffer of at least `bytes` (the kept one if large enough). */
static rmmc_status_t host_room(pool_t *p, struct pool_sleep *s, size_t bytes) {
  if (bytes <= s->host_bytes) return RMMC_SUCCESS;
  host_free(p, s);
  char b[32];
  if (p->cuda) {
    cudaError_t err = cudaHostAlloc(&s->host, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      s->host = NULL;
      (void)cudaGetLastError();
      return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                            "pool_pause: no pinned host memory for a backup of %s "
                            "(cudaHostAlloc: %s); nothing changed",
                            rmmc__format_bytes(bytes, b, sizeof b), cudaGetErrorString(err));
    }
  } else if ((s->host = malloc(bytes)) == NULL) {
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                          "pool_pause: no host memory for a backup of %s; nothing changed",
                          rmmc__format_bytes(bytes, b, sizeof b));
  }
  s->host_bytes = bytes;
  return RMMC_SUCCESS;
}

/* Copies the backup out (to_host: waits for the copies) or back on
 * `stream` (only onto mappings now held: release_cached may drop some while
 * paused; the event marks the copies' end). */
static rmmc_status_t copy_ranges(pool_t *p, struct pool_sleep *s, bool to_host,
                                 cudaStream_t stream) {
  rmmc_status_t st = RMMC_SUCCESS;
  int saved = 0;
  if (p->cuda && (st = rmmc__device_push(p->base.base.device, &saved)) != RMMC_SUCCESS) return st;
  cudaError_t err = cudaSuccess;
  for (size_t k = 0; k < s->nranges && err == cudaSuccess; k++) {
    const sleep_range_t *x = &s->ranges[k];
    const pool_region_t *r = x->region;
    for (size_t i = pool_seg_search(r, x->addr, true); i < r->nsegs && r->segs[i].addr < x->addr + x->bytes; i++) {
      uintptr_t a = r->segs[i].addr > x->addr ? r->segs[i].addr : x->addr;
      uintptr_t e = r->segs[i].addr + r->segs[i].size;
      if (e > x->addr + x->bytes) e = x->addr + x->bytes;
      if (!to_host && r->segs[i].off != SEG_ON) continue;
      char *h = (char *)s->host + x->at + (a - x->addr);
      void *dst = to_host ? (void *)h : (void *)a;
      const void *src = to_host ? (const void *)a : (const void *)h;
      if (!p->cuda) memcpy(dst, src, e - a);
      else if ((err = cudaMemcpyAsync(dst, src, e - a,
                                      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                      stream)) != cudaSuccess)
        break;
    }
  }
  if (p->cuda) {
    if (err == cudaSuccess && to_host) err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess && !to_host && s->nranges > 0) {
      if (s->copied == NULL)
        err = cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming);
      if (err == cudaSuccess && (err = cudaEventRecord(s->copied, stream)) == cudaSuccess)
        s->copying = true;
    }
    if (err != cudaSuccess) {
      st = rmmc_set_cuda_error(err, to_host ? "pool sleep: copying the backup to the host"
                                            : "pool sleep: copying the backup back");
      if (!to_host) (void)cudaStreamSynchronize(stream); /* nothing may still read or write */
    }
    rmmc__device_pop(saved);
  }
  return st;
}

static void sleep_describe(pool_t *p, rmmc_field_cb emit, void *ctx) {
  rmmc_pool_sleep_state_t f = RMMC_POOL_SLEEP_STATE_INIT;
  if (rmmc_pool_sleep_state(&p->base.base, &f) != RMMC_SUCCESS) return;
  rmmc__emit_text(emit, ctx, "sleep",
                  !f.paused ? "awake" : f.mode == RMMC_POOL_PAUSE_BACKUP ? "backup" : "discard");
  rmmc__emit_bytes(emit, ctx, "paused_bytes", f.unmapped);
  rmmc__emit_bytes(emit, ctx, "backed_up", f.backed_up);
  rmmc__emit_bytes(emit, ctx, "backup_host", f.host_bytes);
  rmmc__emit_count(emit, ctx, "pauses", f.pauses);
  rmmc__emit_count(emit, ctx, "resumes", f.resumes);
}

static void sleep_drop(pool_t *p, bool destroying) {
  struct pool_sleep *s = (struct pool_sleep *)p->sleep;
  rmmc__lock(&p->lock);
  if (destroying || !p->paused) {
    if (copies_done(s) != RMMC_SUCCESS) s->copying = false; /* the stream failed: nothing runs */
    host_free(p, s);
  }
  rmmc__unlock(&p->lock);
  if (!destroying) return;
  if (s->copied != NULL) (void)cudaEventDestroy(s->copied);
  free(s->ranges);
  free(s);
  p->sleep = NULL;
}

static rmmc_status_t sleep_new(pool_t *p) {
  struct pool_sleep *s = calloc(1, sizeof *s);
  if (s == NULL) return rmmc__pool_no_host_memory();
  s->head.drop = sleep_drop;
  s->head.describe = sleep_describe;
  p->sleep = &s->head;
  return RMMC_SUCCESS;
}

/* Paused in `mode`, or awake (0). */
static void gate(pool_t *p, struct pool_sleep *s, rmmc_pool_pause_mode_t mode) {
  s->mode = mode;
  __atomic_store_n(&p->paused, mode != 0, __ATOMIC_RELAXED);
  rmmc__pool_count_route(p, mode != 0 ? 1 : -1);
}

static pool_t *sleep_pool(rmmc_resource_t *stack, const char *what, rmmc_status_t *st) {
  pool_t *p = rmmc__pool_in(stack);
  if (p == NULL) {
    *st = rmmc__pool_no_layer(what, stack);
  } else if (p->be->sleep == NULL) {
    *st = rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                         "%s: this pool takes chunks from its upstream (%s%s), and chunks cannot "
                         "be given back and taken again at the same addresses: only a pool with "
                         "the virtual-memory backend (expandable, over an upstream with virtual "
                         "memory: cuda, host, sim) can sleep; nothing changed",
                         what, rmmc_resource_name(p->base.upstream),
                         rmmc_resource_vm_page_size(p->base.upstream) == 0
                             ? ", which has no virtual memory"
                             : ", expandable=0");
    p = NULL;
  } else {
    *st = RMMC_SUCCESS;
  }
  return p;
}

RMMC_API rmmc_status_t rmmc_pool_pause(rmmc_resource_t *stack, rmmc_pool_pause_mode_t mode,
                                       cudaStream_t stream) {
  rmmc_status_t st;
  pool_t *p = sleep_pool(stack, "pool_pause", &st);
  if (p == NULL) return st;
  if (mode != RMMC_POOL_PAUSE_BACKUP && mode != RMMC_POOL_PAUSE_DISCARD)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_pause: mode %d is neither RMMC_POOL_PAUSE_BACKUP nor "
                          "RMMC_POOL_PAUSE_DISCARD",
                          (int)mode);
  int above = __atomic_load_n(&p->pools_above, __ATOMIC_RELAXED);
  if (above > 0)
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_pause: %d pool%s over this one take%s memory from it and cache "
                          "it, and would hand out pages a pause unmaps (design rule 13); pause "
                          "a stack with one pool layer; nothing changed",
                          above, above == 1 ? "" : "s", above == 1 ? "s" : "");
  if (mode == RMMC_POOL_PAUSE_BACKUP && !memory_is_real(p))
    return rmmc_set_error(RMMC_ERROR_NOT_SUPPORTED,
                          "pool_pause: the pool's upstream is sim, whose addresses have no memory "
                          "behind them to back up; pause it with RMMC_POOL_PAUSE_DISCARD");
  /* Every stream's work on the pool's memory finishes before a page goes
   * (design.md, "Sleep mode"), every free's pending work too. */
  st = rmmc__stream_set_sync(&p->streams); /* host: epochs only, its status ignored */
  if (p->cuda && st != RMMC_SUCCESS) return st;
  rmmc__pool_lock_all(p);
  if (p->paused) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_pause: the pool is paused already");
    goto unlock;
  }
  if (p->sleep == NULL && (st = sleep_new(p)) != RMMC_SUCCESS) goto unlock;
  struct pool_sleep *s = (struct pool_sleep *)p->sleep;
  if ((st = copies_done(s)) != RMMC_SUCCESS) goto unlock;
  /* The live blocks: copied out (backup), or marking their mappings. */
  if (!collect_live(p, s))
    st = rmmc__pool_no_host_memory();
  else if (mode == RMMC_POOL_PAUSE_BACKUP && (st = host_room(p, s, s->backed_up)) == RMMC_SUCCESS)
    st = copy_ranges(p, s, true, stream);
  else if (mode == RMMC_POOL_PAUSE_DISCARD)
    mark_live(p, s);
  if (st != RMMC_SUCCESS || mode == RMMC_POOL_PAUSE_DISCARD) forget_backup(s);
  if (st != RMMC_SUCCESS) goto unlock;
  gate(p, s, mode);
  rmmc__pool_heaps_cool(p);
  size_t gone = 0, live_gone = 0;
  char b[32];
  st = p->be->sleep(p, mode == RMMC_POOL_PAUSE_BACKUP ? POOL_SLEEP_ALL : POOL_SLEEP_FREE, &gone);
  if (st == RMMC_SUCCESS && mode == RMMC_POOL_PAUSE_DISCARD)
    st = p->be->sleep(p, POOL_SLEEP_LIVE, &live_gone);
  if (st != RMMC_SUCCESS && live_gone > 0) {
    /* Pages under live blocks went: their contents cannot come back, so
     * the pause goes on to the end (discard asked for them to go). */
    rmmc__append_error(" (pool_pause: the pool is paused (discard): pages under live blocks "
                       "had gone when the upstream refused, and their contents cannot come "
                       "back; %s it kept stays held until rmmc_pool_resume, which maps the "
                       "rest)",
                       rmmc__format_bytes(pool_held(p), b, sizeof b));
  } else if (st != RMMC_SUCCESS) {
    /* Back to awake: map what went, restore it. */
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    rmmc_status_t back = p->be->wake(p);
    if (back == RMMC_SUCCESS) back = copy_ranges(p, s, false, stream);
    char detail[256];
    snprintf(detail, sizeof detail, "%s", rmmc_last_error_message());
    rmmc__error_restore(&why);
    if (back == RMMC_SUCCESS) {
      gate(p, s, 0);
      forget_backup(s);
      rmmc__append_error(" (pool_pause: the pool is awake as before: what was unmapped is "
                         "mapped again%s)",
                         mode == RMMC_POOL_PAUSE_BACKUP ? " and restored" : "");
      goto unlock;
    }
    rmmc__append_error(" (pool_pause: mapping back failed too: %s; the pool stays paused "
                       "with %s still held%s: rmmc_pool_resume retries)",
                       detail, rmmc__format_bytes(pool_held(p), b, sizeof b),
                       mode == RMMC_POOL_PAUSE_BACKUP ? " and its backup kept"
                                                      : " (no live block's page had gone)");
  }
  s->pauses++;
  /* Another process's import maps the old pages, which the driver keeps
   * until it closes them, and never sees the new ones: every export of the
   * pool's blocks is revoked, so importers see their handles stale. */
  if (rmmc__exports_live() > 0) rmmc__exports_forget_owner(&p->base.base);
unlock:
  rmmc__pool_unlock_all(p);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_resume(rmmc_resource_t *stack, cudaStream_t stream) {
  rmmc_status_t st;
  pool_t *p = sleep_pool(stack, "pool_resume", &st);
  if (p == NULL) return st;
  rmmc__pool_lock_all(p);
  struct pool_sleep *s = (struct pool_sleep *)p->sleep;
  if (!p->paused) {
    st = rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "pool_resume: the pool is not paused");
    goto unlock;
  }
  if ((st = p->be->wake(p)) != RMMC_SUCCESS) {
    char b[32];
    rmmc__append_error(" (pool_resume: the pool stays paused, %s of mappings to map again%s; "
                       "try again once memory is free)",
                       rmmc__format_bytes(p->off_bytes, b, sizeof b),
                       s->mode == RMMC_POOL_PAUSE_BACKUP ? ", its backup kept" : "");
    goto unlock;
  }
  if ((st = copy_ranges(p, s, false, stream)) != RMMC_SUCCESS) {
    rmmc__error_state_t why;
    rmmc__error_save(&why);
    size_t gone = 0;
    rmmc_status_t again = p->be->sleep(p, POOL_SLEEP_ALL, &gone);
    rmmc__error_restore(&why);
    rmmc__append_error(again == RMMC_SUCCESS
                           ? " (pool_resume: the pool stays paused, its backup kept)"
                           : " (pool_resume: the pool stays paused, its backup kept; some "
                             "mappings could not be unmapped again and stay held)");
    goto unlock;
  }
  gate(p, s, 0);
  s->resumes++;
unlock:
  rmmc__pool_unlock_all(p);
  return st;
}

RMMC_API rmmc_status_t rmmc_pool_sleep_state(rmmc_resource_t *stack,
                                             rmmc_pool_sleep_state_t *out) {
  if (out == NULL || out->size < sizeof(size_t))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "pool_sleep_state: out must be set with RMMC_POOL_SLEEP_STATE_INIT");
  pool_t *p = rmmc__pool_in(stack);
  if (p == NULL) return rmmc__pool_no_layer("pool_sleep_state", stack);
  rmmc_pool_sleep_state_t f = RMMC_POOL_SLEEP_STATE_INIT;
  rmmc__lock(&p->lock);
  const struct pool_sleep *s = (const struct pool_sleep *)p->sleep;
  f.can_sleep = p->be->sleep != NULL;
  f.paused = p->paused != 0;
  f.held = pool_held(p);
  f.unmapped = p->off_bytes;
  if (s != NULL) {
    f.mode = p->paused ? s->mode : 0;
    f.backed_up = p->paused ? s->backed_up : 0;
    f.backup_ranges = p->paused ? s->nranges : 0;
    f.host_bytes = s->host_bytes;
    f.pauses = s->pauses;
    f.resumes = s->resumes;
  }
  rmmc__unlock(&p->lock);
  size_t n = out->size < sizeof f ? out->size : sizeof f;
  memcpy(out, &f, n);
  out->size = n;
  return RMMC_SUCCESS;
}
