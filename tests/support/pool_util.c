/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared pieces of the pool's test programs (see pool_util.h).
 */
#include "pool_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

int pool_steps(int n) {
  const char *q = getenv("RMMC_TEST_QUICK");
  if (q == NULL || *q == '\0' || strcmp(q, "0") == 0) return n;
  return n / 5 > 0 ? n / 5 : 1;
}

void pool_fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 97) b[i] = (unsigned char)(seed + i);
  b[n - 1] = (unsigned char)(seed * 7 + 1);
}

bool pool_filled(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 1 < n; i += 97) /* the last byte has its own value */
    if (b[i] != (unsigned char)(seed + i)) return false;
  return b[n - 1] == (unsigned char)(seed * 7 + 1);
}

rmmc_pool_figures_t pool_figures(rmmc_resource_t *pool) {
  rmmc_pool_figures_t f = RMMC_POOL_FIGURES_INIT;
  ck_assert_msg(rmmc_pool_resource_figures(pool, &f) == RMMC_SUCCESS, "%s",
                rmmc_last_error_message());
  ck_assert_uint_eq(f.size, sizeof f);
  return f;
}

/* ---- per-stream lines ---- */

typedef struct lines {
  int n;
  const char *want;
  bool found;
  pool_stream_line_t line;
  bool parsed;
} lines_t;

static double unit_of(const char *u) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  for (int i = 0; i < 5; i++)
    if (strcmp(u, units[i]) == 0) return (double)((uint64_t)1 << (10 * i));
  return -1.0;
}

static void collect_line(void *ctx, const rmmc_field_t *f) {
  lines_t *t = ctx;
  if (f->kind != RMMC_FIELD_TEXT || strcmp(f->key, "stream") != 0) return;
  t->n++;
  char name[64], u1[8], u2[8], u3[8];
  double a, b, c;
  if (sscanf(f->text, "%63s in_use=%lf %7s cached=%lf %7s pending=%lf %7s", name, &a, u1, &b, u2,
             &c, u3) != 7)
    return;
  if (t->want == NULL || strcmp(name, t->want) != 0 || t->found) return;
  t->found = true;
  t->parsed = unit_of(u1) > 0 && unit_of(u2) > 0 && unit_of(u3) > 0;
  t->line = (pool_stream_line_t){a * unit_of(u1), b * unit_of(u2), c * unit_of(u3)};
}

bool pool_stream_line(rmmc_resource_t *pool, cudaStream_t stream, pool_stream_line_t *out) {
  char name[32];
  if (stream == NULL || stream == cudaStreamLegacy)
    snprintf(name, sizeof name, "default");
  else if (stream == cudaStreamPerThread)
    snprintf(name, sizeof name, "per-thread");
  else
    snprintf(name, sizeof name, "%p", (void *)stream);
  lines_t t = {0, name, false, {0, 0, 0}, false};
  rmmc_resource_describe(pool, collect_line, &t);
  if (!t.found) return false;
  ck_assert_msg(t.parsed, "the stream line of %s does not parse", name);
  *out = t.line;
  return true;
}

int pool_stream_lines(rmmc_resource_t *pool) {
  lines_t t = {0, NULL, false, {0, 0, 0}, false};
  rmmc_resource_describe(pool, collect_line, &t);
  return t.n;
}

typedef struct text {
  const char *key;
  char *buf;
  size_t len;
  bool found;
} text_t;

static void collect_text(void *ctx, const rmmc_field_t *f) {
  text_t *t = ctx;
  if (f->kind != RMMC_FIELD_TEXT || strcmp(f->key, t->key) != 0 || t->found) return;
  t->found = true;
  snprintf(t->buf, t->len, "%s", f->text);
}

bool pool_text(rmmc_resource_t *pool, const char *key, char *buf, size_t len) {
  text_t t = {key, buf, len, false};
  rmmc_resource_describe(pool, collect_text, &t);
  return t.found;
}

/* ---- random runs ---- */

typedef struct live {
  char *p;
  size_t n, align;
  unsigned seed;
  cudaStream_t stream;
} live_t;

/* xorshift32: deterministic per seed, no shared state between threads. */
static unsigned next_rand(unsigned *s) {
  unsigned x = *s ? *s : 0x9e3779b9u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *s = x;
  return x;
}

static unsigned log2_floor(size_t v) {
  unsigned l = 0;
  while (v > 1) v >>= 1, l++;
  return l;
}

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* A request size: half at most small_max (log-spread from 1 B), half above
 * it (log-spread up to max_bytes). */
static size_t pick_size(unsigned *s, const pool_run_t *c) {
  size_t lo = c->small_max, hi = c->max_bytes;
  if (lo > 0 && (next_rand(s) % 2 == 0 || hi <= lo)) {
    size_t cap = (size_t)1 << (next_rand(s) % (log2_floor(lo) + 1));
    return 1 + next_rand(s) % (cap < lo ? cap : lo);
  }
  size_t span = hi - lo;
  size_t cap = (size_t)1 << (next_rand(s) % (log2_floor(span) + 1));
  return lo + 1 + next_rand(s) % (cap < span ? cap : span);
}

static size_t pick_align(unsigned *s, const pool_run_t *c) {
  if (c->max_align <= 256 || next_rand(s) % 8 != 0) return 256;
  return (size_t)1 << (next_rand(s) % (log2_floor(c->max_align) + 1));
}

/* STREAM(1..nstreams), and one time in ten the default stream. */
static cudaStream_t pick_stream(unsigned *s, const pool_run_t *c) {
  unsigned k = next_rand(s) % (unsigned)(c->nstreams * 10);
  return k < (unsigned)c->nstreams * 9 ? STREAM(1 + k % (unsigned)c->nstreams) : NULL;
}

static int cmp_live(const void *a, const void *b) {
  const live_t *x = a, *y = b;
  return x->p < y->p ? -1 : x->p > y->p;
}

/* No two live blocks overlap (sorted copy). */
static bool disjoint(const live_t *live, int n) {
  if (n < 2) return true;
  live_t *s = malloc((size_t)n * sizeof *s);
  memcpy(s, live, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_live);
  bool ok = true;
  for (int i = 1; i < n && ok; i++) ok = s[i - 1].p + s[i - 1].n <= s[i].p;
  free(s);
  return ok;
}

pool_run_result_t pool_random_run(rmmc_resource_t *pool, const pool_run_t *c) {
  pool_run_result_t res = {0};
  live_t *live = calloc((size_t)c->max_live, sizeof *live);
  ck_assert_ptr_nonnull(live);
  unsigned seed = c->seed;
  int n = 0, steps = pool_steps(c->steps);
  size_t live_bytes = 0;
  for (int step = 0; step < steps; step++) {
    unsigned r = next_rand(&seed);
    if (n == 0 || (n < c->max_live && r % 5 < 3)) {
      size_t bytes = pick_size(&seed, c), align = pick_align(&seed, c);
      cudaStream_t s = pick_stream(&seed, c);
      void *p = (void *)1;
      rmmc_status_t st = rmmc_resource_allocate(pool, bytes, align, s, &p);
      if (st == RMMC_ERROR_OUT_OF_MEMORY && c->oom_ok) {
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(rmmc_last_error_message(), "out of memory") != NULL, "%s",
                      rmmc_last_error_message());
        res.ooms++;
      } else {
        ck_assert_msg(st == RMMC_SUCCESS, "step %d: allocate %zu (alignment %zu): %s", step,
                      bytes, align, rmmc_last_error_message());
        ck_assert_uint_eq((uintptr_t)p % (align < 256 ? 256 : align), 0);
        if (c->real) pool_fill(p, bytes, r);
        live[n++] = (live_t){p, bytes, align, r, s};
        live_bytes += round256(bytes);
        if (live_bytes > res.peak_live) res.peak_live = live_bytes;
        res.allocs++;
      }
    } else {
      int k = (int)(next_rand(&seed) % (unsigned)n);
      live_t b = live[k];
      if (c->real) ck_assert_msg(pool_filled(b.p, b.n, b.seed), "step %d: data changed", step);
      cudaStream_t s = b.stream;
      if (next_rand(&seed) % 3 == 0) {
        s = pick_stream(&seed, c);
        res.foreign_frees += s != b.stream;
      }
      ck_assert_msg(rmmc_resource_deallocate(pool, b.p, b.n, b.align, s) == RMMC_SUCCESS,
                    "step %d: free %p + %zu: %s", step, (void *)b.p, b.n,
                    rmmc_last_error_message());
      live[k] = live[--n];
      live_bytes -= round256(b.n);
      res.frees++;
    }
    if (c->release_every > 0 && next_rand(&seed) % (unsigned)c->release_every == 0) {
      ck_assert_int_eq(rmmc_resource_release_cached(pool), RMMC_SUCCESS);
      res.releases++;
    }
    ck_assert_msg(rmmc_pool_resource_check(pool) == RMMC_SUCCESS, "step %d: %s", step,
                  rmmc_last_error_message());
    rmmc_pool_figures_t f = pool_figures(pool);
    ck_assert_msg(f.in_use == live_bytes, "step %d: in_use %zu, live %zu", step, f.in_use,
                  live_bytes);
    ck_assert_uint_le(f.in_use, f.reserved);
    ck_assert_uint_le(f.cached + f.pending, f.reserved - f.in_use);
    if (c->maximum > 0) ck_assert_uint_le(f.reserved, c->maximum);
    if (step % 16 == 0) {
      ck_assert_uint_eq(field(pool, "in_use"), f.in_use);
      ck_assert_uint_eq(field(pool, "reserved"), f.reserved);
      ck_assert_uint_eq(field(pool, "free"), f.reserved - f.in_use);
      ck_assert_uint_eq(field(pool, "cached"), f.cached);
      ck_assert_uint_eq(field(pool, "pending"), f.pending);
      ck_assert_uint_ge(field(pool, "peak"), f.in_use);
      ck_assert_uint_ge(field(pool, "reserved_peak"), f.reserved);
      ck_assert_uint_le(field(pool, "largest_free"), f.reserved - f.in_use);
    }
    if (step % 64 == 0) {
      ck_assert_msg(disjoint(live, n), "step %d: live blocks overlap", step);
      if (c->real)
        for (int i = 0; i < n; i++)
          ck_assert_msg(pool_filled(live[i].p, live[i].n, live[i].seed),
                        "step %d: data of a live block changed", step);
    }
  }
  ck_assert(disjoint(live, n));
  for (int i = 0; i < n; i++) {
    if (c->real) ck_assert(pool_filled(live[i].p, live[i].n, live[i].seed));
    ck_assert_int_eq(
        rmmc_resource_deallocate(pool, live[i].p, live[i].n, live[i].align, live[i].stream),
        RMMC_SUCCESS);
  }
  CHECK_POOL(pool);
  ck_assert_uint_eq(pool_figures(pool).in_use, 0);
  free(live);
  return res;
}

/* ---- the same on many threads ---- */

enum { MAILBOX = 64 };

typedef struct shared {
  rmmc_resource_t *pool;
  const pool_run_t *c;
  int nthreads;
  pthread_mutex_t lock; /* the mailbox and the result */
  live_t mailbox[MAILBOX];
  int nmail;
  pool_mt_result_t res;
} shared_t;

typedef struct worker {
  shared_t *sh;
  int index;
} worker_t;

static void mt_fail(shared_t *sh, const char *what, int step) {
  pthread_mutex_lock(&sh->lock);
  if (sh->res.failures++ == 0)
    snprintf(sh->res.first, sizeof sh->res.first, "%s at step %d (last message: %s)", what, step,
             rmmc_last_error_message());
  pthread_mutex_unlock(&sh->lock);
}

static void count(shared_t *sh, int *field_) {
  pthread_mutex_lock(&sh->lock);
  (*field_)++;
  pthread_mutex_unlock(&sh->lock);
}

/* The stream keys thread i allocates on; any of them, or another thread's,
 * may free. */
static cudaStream_t alloc_stream(int i, unsigned *s) {
  if (i % 2 == 1 && next_rand(s) % 3 != 0) return STREAM(1 + next_rand(s) % 2);
  return i % 4 == 2 ? cudaStreamPerThread : STREAM(100 + i);
}

/* Any key: shared, another thread's, this thread's per-thread stream or the
 * default stream. */
static cudaStream_t any_stream(const shared_t *sh, unsigned *s) {
  unsigned k = next_rand(s) % (unsigned)(sh->nthreads + 4);
  if (k < 2) return STREAM(1 + k);
  if (k == 2) return cudaStreamPerThread;
  if (k == 3) return NULL;
  return STREAM(100 + (k - 4));
}

static void free_block(shared_t *sh, const live_t *b, cudaStream_t s, int step) {
  const pool_run_t *c = sh->c;
  if (c->real && !pool_filled(b->p, b->n, b->seed)) mt_fail(sh, "data changed", step);
  if (rmmc_resource_deallocate(sh->pool, b->p, b->n, b->align, s) != RMMC_SUCCESS)
    mt_fail(sh, "free", step);
  if (s != b->stream) count(sh, &sh->res.foreign_frees);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  shared_t *sh = w->sh;
  const pool_run_t *c = sh->c;
  live_t *live = calloc((size_t)c->max_live, sizeof *live);
  unsigned seed = c->seed * 2654435761u + (unsigned)w->index * 40503u + 1u;
  int n = 0, steps = pool_steps(c->steps);
  for (int step = 0; step < steps && live != NULL; step++) {
    unsigned r = next_rand(&seed);
    if (n == 0 || (n < c->max_live && r % 5 < 3)) {
      size_t bytes = pick_size(&seed, c), align = pick_align(&seed, c);
      cudaStream_t s = alloc_stream(w->index, &seed);
      void *p = (void *)1;
      rmmc_status_t st = rmmc_resource_allocate(sh->pool, bytes, align, s, &p);
      if (st == RMMC_ERROR_OUT_OF_MEMORY && c->oom_ok) {
        if (p != NULL) mt_fail(sh, "out of memory with a pointer", step);
        count(sh, &sh->res.ooms);
      } else if (st != RMMC_SUCCESS) {
        mt_fail(sh, "allocate", step);
      } else {
        if ((uintptr_t)p % (align < 256 ? 256 : align) != 0)
          mt_fail(sh, "misaligned", step);
        if (c->real) pool_fill(p, bytes, r);
        live[n++] = (live_t){p, bytes, align, r, s};
      }
    } else {
      int k = (int)(next_rand(&seed) % (unsigned)n);
      live_t b = live[k];
      live[k] = live[--n];
      unsigned how = next_rand(&seed) % 30;
      if (how == 0) { /* hand it to another thread */
        pthread_mutex_lock(&sh->lock);
        bool posted = sh->nmail < MAILBOX;
        if (posted) sh->mailbox[sh->nmail++] = b;
        pthread_mutex_unlock(&sh->lock);
        if (posted) continue;
      }
      free_block(sh, &b, next_rand(&seed) % 3 == 0 ? any_stream(sh, &seed) : b.stream, step);
    }
    if (r % 30 == 1) { /* free a block another thread allocated */
      live_t b;
      pthread_mutex_lock(&sh->lock);
      bool got = sh->nmail > 0;
      if (got) b = sh->mailbox[--sh->nmail];
      pthread_mutex_unlock(&sh->lock);
      if (got) {
        count(sh, &sh->res.handoffs);
        free_block(sh, &b, next_rand(&seed) % 2 ? b.stream : alloc_stream(w->index, &seed), step);
      }
    }
    if (r % 211 == 7) {
      if (rmmc_pool_resource_check(sh->pool) != RMMC_SUCCESS)
        mt_fail(sh, "check", step);
      count(sh, &sh->res.checks);
    }
    if (c->release_every > 0 && next_rand(&seed) % (unsigned)c->release_every == 0) {
      if (rmmc_resource_release_cached(sh->pool) != RMMC_SUCCESS)
        mt_fail(sh, "release_cached", step);
      count(sh, &sh->res.releases);
    }
  }
  if (live == NULL) mt_fail(sh, "no host memory", 0);
  for (int i = 0; i < n; i++) free_block(sh, &live[i], live[i].stream, steps);
  free(live);
  return NULL;
}

pool_mt_result_t pool_threaded_run(rmmc_resource_t *pool, const pool_run_t *c, int nthreads) {
  shared_t *sh = calloc(1, sizeof *sh);
  ck_assert_ptr_nonnull(sh);
  sh->pool = pool;
  sh->c = c;
  sh->nthreads = nthreads;
  pthread_mutex_init(&sh->lock, NULL);
  pthread_t *th = calloc((size_t)nthreads, sizeof *th);
  worker_t *w = calloc((size_t)nthreads, sizeof *w);
  for (int i = 0; i < nthreads; i++) {
    w[i] = (worker_t){sh, i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < sh->nmail; i++) free_block(sh, &sh->mailbox[i], STREAM(1), -1);
  pool_mt_result_t res = sh->res;
  pthread_mutex_destroy(&sh->lock);
  free(w);
  free(th);
  free(sh);
  ck_assert_msg(res.failures == 0, "%d failures; the first: %s", res.failures, res.first);
  CHECK_POOL(pool);
  ck_assert_uint_eq(pool_figures(pool).in_use, 0);
  ck_assert_uint_eq(field(pool, "in_use"), 0);
  return res;
}
