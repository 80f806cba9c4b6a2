/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer harness over whole host-memory stacks built from specs.
 *
 * Input: byte 0 picks a stack from `stacks` below, byte 1 the limit of the
 * limiting layer every stack sits on (`... > limiting(limit=L) > host`: a
 * small limit makes the upstream refuse, like the spy's failure injection,
 * and the layer counts the bytes held from the host so the end can prove
 * nothing leaked). The rest is a sequence of operations (see run_op). After
 * every step the harness checks that each live block is aligned, that no two
 * live blocks overlap, that each block's written pattern is intact, that
 * statuses are the documented ones, and that every pool in the stack passes
 * rmmc_pool_resource_check(). At the end it frees everything, releases the
 * stack and checks the limiting layer's in_use is 0. A failure is abort().
 *
 * Built two ways: with -fsanitize=fuzzer (meson -Dfuzz=true, clang) and as
 * a plain program with fuzz_replay.c, which replays the corpus and the saved
 * crashes in the normal test suite.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rmmc/rmmc.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_FAIL(...)                                                                        \
  do {                                                                                        \
    fprintf(stderr, "fuzz_stacks: %s:%d: ", __FILE__, __LINE__);                              \
    fprintf(stderr, __VA_ARGS__);                                                             \
    fprintf(stderr, " (last error: %s)\n", rmmc_last_error_message());                        \
    abort();                                                                                  \
  } while (0)

/* The stacks, outermost first; each is completed with " > limiting(limit=L) > host".
 * strict: the outermost layer knows every block and its exact size
 * (pool, tracking), so wrong frees must be refused there. Over host (through
 * limiting) a pool uses virtual memory unless expandable=false asks for
 * chunks: both backends are here, with small spans, no span cache and
 * uncovered frees (event_interval) in some. */
static const struct {
  const char *spec;
  int strict;
} stacks[] = {
    {"pool(initial=256KiB, max=16MiB)", 1},
    {"pool(expandable=false, initial=0, max=8MiB, min_growth=64KiB, granularity=64KiB)", 1},
    {"pool(expandable=false, initial=1MiB, max=32MiB, small_max=16KiB, small_chunk=64KiB, cache=0, "
     "split_limit=1)", 1},
    {"fixed_size(block=4KiB, blocks_per_chunk=16)", 0},
    {"binning(min=256B, max=64KiB, chunk=256KiB)", 0},
    {"arena(superblock=256KiB, chunk=1MiB, max=32MiB)", 0},
    {"limiting(limit=4MiB) > pool(initial=256KiB, max=16MiB)", 0},
    {"statistics > pool(initial=256KiB, max=16MiB)", 0},
    {"tracking > pool(initial=256KiB, max=16MiB)", 1},
    {"aligned(alignment=4KiB, threshold=64KiB) > pool(initial=256KiB, max=16MiB)", 0},
    {"failure_callback(retries=2) > pool(initial=256KiB, max=16MiB)", 0},
    {"thread_safe > pool(initial=256KiB, max=16MiB)", 0},
    {"tracking > binning(min=256B, max=64KiB, chunk=256KiB) > pool(expandable=false, initial=256KiB)",
     1},
    {"tracking > fixed_size(block=4KiB, blocks_per_chunk=16)", 1},
    {"tracking > arena(superblock=256KiB, chunk=1MiB)", 1},
    {"statistics > failure_callback > binning(min=256B, max=16KiB) > pool(initial=0, event_interval=64)",
     0},
    {"pool(expandable=true, page=64KiB, address_space=16MiB)", 1},
    {"pool(expandable=true, page=16KiB, release_slack=0, small_max=16KiB, small_chunk=64KiB)", 1},
    {"tracking > pool(expandable=true, page=1MiB, max=8MiB)", 1},
};
#define NSTACKS (sizeof stacks / sizeof stacks[0])

/* Request sizes: the high nibble of the size byte picks one, the low
 * nibble adds 0..120 bytes. */
static const size_t size_classes[16] = {
    0, 1, 16, 100, 255, 256, 257, 1000, 4096, 5000, 65536, 100000,
    (1u << 20) - 1, 1u << 20, 3u << 20, 9u << 20};

#define MAX_LIVE 256
#define PATTERN 16

typedef struct {
  uint8_t *p;
  size_t n, align;
  uintptr_t stream;
  uint8_t seed;
} block_t;

typedef struct {
  rmmc_resource_t *r;
  int strict;
  block_t live[MAX_LIVE]; /* sorted by p */
  size_t nlive;
  uint8_t seq;
} state_t;

static cudaStream_t stream_of(uintptr_t key) { return (cudaStream_t)(key * 0x10); }

static void fill(const block_t *b) {
  size_t k = b->n < PATTERN ? b->n : PATTERN;
  for (size_t i = 0; i < k; i++) b->p[i] = (uint8_t)(b->seed + i);
  for (size_t i = 0; i < k; i++) b->p[b->n - 1 - i] = (uint8_t)(b->seed ^ (0xA5 + i));
}

static void verify(const block_t *b) {
  size_t k = b->n < PATTERN ? b->n : PATTERN;
  for (size_t i = 0; i < k; i++) {
    if (b->p[b->n - 1 - i] != (uint8_t)(b->seed ^ (0xA5 + i)))
      FUZZ_FAIL("block %p (%zu B) tail byte %zu corrupted", (void *)b->p, b->n, i);
    /* The tail is written last: head bytes it covers (blocks under 2 *
     * PATTERN bytes) hold the tail's pattern. */
    if (i < b->n - k && b->p[i] != (uint8_t)(b->seed + i))
      FUZZ_FAIL("block %p (%zu B) head byte %zu corrupted", (void *)b->p, b->n, i);
  }
}

/* Every pool layer of the stack (walking the upstream chain) passes its
 * invariant check. */
static void check_pools(rmmc_resource_t *r) {
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (strcmp(rmmc_resource_name(r), "pool") == 0 && rmmc_pool_resource_check(r) != RMMC_SUCCESS)
      FUZZ_FAIL("pool check failed");
}

/* The limiting layer right above host: it counts the bytes held from the host. */
static rmmc_resource_t *bottom_limiting(rmmc_resource_t *r) {
  rmmc_resource_t *last = NULL;
  for (; r != NULL; r = rmmc_resource_upstream(r))
    if (strcmp(rmmc_resource_name(r), "limiting") == 0) last = r;
  if (last == NULL) FUZZ_FAIL("no limiting layer in the stack");
  return last;
}

static uint64_t bottom_in_use(rmmc_resource_t *r) {
  uint64_t v = 0;
  if (!rmmc_resource_get_field(bottom_limiting(r), "in_use", &v)) FUZZ_FAIL("no in_use field");
  return v;
}

static void check_all(state_t *s) {
  for (size_t i = 0; i < s->nlive; i++) {
    const block_t *b = &s->live[i];
    size_t a = b->align < 256 ? 256 : b->align;
    if ((uintptr_t)b->p % a != 0) FUZZ_FAIL("block %p not aligned to %zu", (void *)b->p, a);
    if (i + 1 < s->nlive && b->p + b->n > s->live[i + 1].p)
      FUZZ_FAIL("blocks %p (%zu B) and %p overlap", (void *)b->p, b->n, (void *)s->live[i + 1].p);
    verify(b);
  }
  check_pools(s->r);
}

static void do_alloc(state_t *s, uint8_t szb, uint8_t ab) {
  size_t n = size_classes[szb >> 4] + (size_t)(szb & 15) * 8;
  size_t align = (size_t)1 << (8 + (ab & 15) % 9);
  uintptr_t key = 1 + ((ab >> 4) & 3);
  void *p = (void *)&p;
  rmmc_status_t st = rmmc_resource_allocate(s->r, n, align, stream_of(key), &p);
  if (st != RMMC_SUCCESS) {
    if (st != RMMC_ERROR_OUT_OF_MEMORY && st != RMMC_ERROR_INVALID_ARGUMENT &&
        st != RMMC_ERROR_NOT_SUPPORTED)
      FUZZ_FAIL("allocate(%zu, %zu) returned %s", n, align, rmmc_status_name(st));
    if (p != NULL) FUZZ_FAIL("failed allocate left *out = %p", p);
    return;
  }
  if (n == 0) {
    if (p != NULL) FUZZ_FAIL("allocate(0) returned %p", p);
    return;
  }
  if (p == NULL) FUZZ_FAIL("allocate(%zu) succeeded with NULL", n);
  if (s->nlive == MAX_LIVE) FUZZ_FAIL("harness: too many live blocks");
  block_t b = {(uint8_t *)p, n, align, key, ++s->seq};
  size_t i = s->nlive;
  while (i > 0 && s->live[i - 1].p > b.p) i--;
  memmove(&s->live[i + 1], &s->live[i], (s->nlive - i) * sizeof b);
  s->live[i] = b;
  s->nlive++;
  fill(&s->live[i]);
}

static void do_free(state_t *s, size_t i, int other_stream) {
  block_t b = s->live[i];
  verify(&b);
  uintptr_t key = other_stream ? 1 + (b.stream % 4) : b.stream;
  rmmc_status_t st = rmmc_resource_deallocate(s->r, b.p, b.n, b.align, stream_of(key));
  if (st != RMMC_SUCCESS) FUZZ_FAIL("deallocate(%p, %zu) returned %s", (void *)b.p, b.n, rmmc_status_name(st));
  memmove(&s->live[i], &s->live[i + 1], (s->nlive - i - 1) * sizeof b);
  s->nlive--;
}

/* A deallocate the stack must refuse: a wrong size or a pointer it never
 * handed out. Nothing may change: the block stays live and intact and the
 * bytes held from the host stay the same. */
static void do_wrong_free(state_t *s, size_t i, uint8_t mode) {
  block_t *b = &s->live[i];
  uint8_t local = 0;
  void *p = b->p;
  size_t n = b->n;
  switch (mode % 4) {
  case 0: n = b->n + 257; break;
  case 1:
    if (b->n < 2) return;
    n = b->n - 1;
    break;
  case 2:
    if (b->n <= 256) return;
    p = b->p + 256; /* inside a live block */
    break;
  default: p = &local; n = 64; break; /* the harness's own stack */
  }
  uint64_t before = bottom_in_use(s->r);
  rmmc_status_t st = rmmc_resource_deallocate(s->r, p, n, b->align, stream_of(b->stream));
  if (st != RMMC_ERROR_UNKNOWN_POINTER && st != RMMC_ERROR_INVALID_ARGUMENT)
    FUZZ_FAIL("wrong deallocate(%p, %zu) of block %p (%zu B) returned %s", p, n, (void *)b->p,
              b->n, rmmc_status_name(st));
  if (bottom_in_use(s->r) != before) FUZZ_FAIL("a refused deallocate changed the bytes held");
  verify(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  static char spec[512];
  size_t limit = data[1] & 0x80 ? (size_t)64 << 20 : (size_t)(1 + (data[1] & 0x7f)) << 17;
  snprintf(spec, sizeof spec, "%s > limiting(limit=%zu) > host", stacks[data[0] % NSTACKS].spec,
           limit);
  static state_t s;
  memset(&s, 0, sizeof s);
  s.strict = stacks[data[0] % NSTACKS].strict;
  rmmc_status_t st = rmmc_stack_create(spec, -1, &s.r);
  if (st == RMMC_ERROR_OUT_OF_MEMORY) return 0; /* the initial size does not fit the limit */
  if (st != RMMC_SUCCESS) FUZZ_FAIL("stack_create(\"%s\") returned %s", spec, rmmc_status_name(st));

  size_t pos = 2;
  while (pos + 3 <= size) {
    uint8_t op = data[pos], a = data[pos + 1], b = data[pos + 2];
    pos += 3;
    switch (op % 8) {
    case 0:
    case 1:
    case 2: do_alloc(&s, a, b); break;
    case 3:
    case 4:
      if (s.nlive > 0) do_free(&s, a % s.nlive, b & 1);
      break;
    case 5:
      if (s.strict && s.nlive > 0) do_wrong_free(&s, a % s.nlive, b);
      break;
    case 6:
      st = rmmc_resource_release_cached(s.r);
      if (st != RMMC_SUCCESS) FUZZ_FAIL("release_cached returned %s", rmmc_status_name(st));
      break;
    default: break; /* a check step: check_all below */
    }
    check_all(&s);
  }

  while (s.nlive > 0) do_free(&s, s.nlive - 1, 0);
  check_all(&s);
  st = rmmc_resource_release_cached(s.r);
  if (st != RMMC_SUCCESS) FUZZ_FAIL("release_cached returned %s", rmmc_status_name(st));
  check_pools(s.r);
  rmmc_resource_t *bottom = rmmc_resource_retain(bottom_limiting(s.r));
  rmmc_resource_release(s.r);
  uint64_t left = 0;
  if (!rmmc_resource_get_field(bottom, "in_use", &left)) FUZZ_FAIL("no in_use field");
  if (left != 0) FUZZ_FAIL("stack \"%s\" leaked %llu bytes of host memory", spec, (unsigned long long)left);
  rmmc_resource_release(bottom);
  return 0;
}
