/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer access (rmmc_resource_enable_peer_access, rmmc_resource_vm_set_access)
 * without a GPU. An expandable pool over vmspy (which keeps, per mapped
 * range, the devices granted access to it, as the driver does) grants
 * every mapping it holds when a peer is enabled and every mapping it makes
 * afterwards, whatever grows it (a large request, regrowth after trimming,
 * several threads at once); a refused grant takes its growth back and a
 * refused grant of what is held takes back the grants made, so the pool
 * and its hooks are as they were. A chunk pool, adaptors and the other
 * sub-allocators pass the call down to the base (a spy, which records it);
 * an upstream that cannot grant pages, host and sim memory, tables of
 * version 3 and bad arguments are refused with clear statuses. Host suite.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "faulty.h"
#include "pool_util.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"
#include "test_util.h"
#include "vmspy.h"

#define SEG (64 * KiB) /* the pool's page= (bytes per mapping) over vmspy's 4 KiB pages */

#define OK(x) ck_assert_msg((x) == RMMC_SUCCESS, "%s: %s", #x, rmmc_last_error_message())

/* A failure with `status` whose message holds `needle`. */
#define FAILS_WITH(x, status, needle)                                                              \
  do {                                                                                             \
    rmmc_status_t st_ = (x);                                                                       \
    ck_assert_msg(st_ == (status), "%s returned %s, not %s: %s", #x, rmmc_status_name(st_),       \
                  rmmc_status_name(status), rmmc_last_error_message());                            \
    ck_assert_msg(strstr(rmmc_last_error_message(), (needle)) != NULL, "%s: '%s' lacks '%s'", #x, \
                  rmmc_last_error_message(), (needle));                                            \
  } while (0)

/* The spy got every byte back and saw no bad free; released. */
static void finish_spy(rmmc_resource_t *spy) {
  spy_counts_t c = spy_counts(spy_of(spy));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(spy);
}

/* pool(expandable=true, page=SEG) > up. */
static rmmc_resource_t *vm_pool(rmmc_resource_t *up) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 1;
  o.page_size = SEG;
  o.small_max = 0;
  o.address_space = 256 * MiB;
  rmmc_resource_t *p = NULL;
  OK(rmmc_pool_resource_create(up, &o, &p));
  return p;
}

/* pool(expandable=true, page=SEG) > vmspy (4 KiB pages) > spy. */
typedef struct fix {
  rmmc_resource_t *spy, *vm, *pool;
} fix_t;

static fix_t fix_open(void) {
  fix_t f = {new_spy(), NULL, NULL};
  OK(vmspy_create(f.spy, 4 * KiB, &f.vm));
  f.pool = vm_pool(f.vm);
  return f;
}

/* The pool goes; vmspy refused no call as malformed (a grant over part of
 * a mapping, over unmapped pages) and holds nothing mapped; the spy got
 * every byte back. */
static void fix_close(fix_t *f) {
  rmmc_resource_release(f->pool);
  ck_assert_uint_eq(vmspy_counts(f->vm).errors, 0);
  ck_assert_uint_eq(vmspy_counts(f->vm).mapped_bytes, 0);
  rmmc_resource_release(f->vm);
  finish_spy(f->spy);
}

/* Every range vmspy has mapped is reachable from device d, and there are
 * `want` of them at least. */
static void all_reachable(rmmc_resource_t *vm, int d, size_t want) {
  size_t mapped = 0, missing = vmspy_unreachable(vm, d, &mapped);
  ck_assert_msg(missing == 0, "%zu of %zu mappings are not granted to device %d", missing, mapped,
                d);
  ck_assert_uint_ge(mapped, want);
}

static void *alloc_ok(rmmc_resource_t *r, size_t bytes) {
  void *p = NULL;
  OK(rmmc_resource_allocate(r, bytes, 256, NULL, &p));
  ck_assert_ptr_nonnull(p);
  return p;
}

static void free_ok(rmmc_resource_t *r, void *p, size_t bytes) {
  OK(rmmc_resource_deallocate(r, p, bytes, 256, NULL));
}

/* The hooks' view of what the pool holds: bytes acquired minus released. */
typedef struct held {
  size_t bytes;
  uint64_t acquires, releases;
} held_t;
static void on_acquire(void *p, size_t n, void *user) {
  (void)p;
  held_t *h = user;
  h->bytes += n;
  h->acquires++;
}
static void on_release(void *p, size_t n, void *user) {
  (void)p;
  held_t *h = user;
  h->bytes -= n;
  h->releases++;
}
static void hook(rmmc_resource_t *pool, held_t *h) {
  rmmc_memory_hooks_t k = RMMC_MEMORY_HOOKS_INIT;
  k.on_acquire = on_acquire;
  k.on_release = on_release;
  k.user = h;
  OK(rmmc_resource_set_memory_hooks(pool, &k));
}

/* The pool's "peers" text ("" when it reports none). */
static const char *peers_of(rmmc_resource_t *pool, char *buf, size_t len) {
  if (!pool_text(pool, "peers", buf, len)) buf[0] = '\0';
  return buf;
}

/* ---- the expandable pool ---- */

/* Mappings held when the peer is enabled are granted, so are the mappings
 * of every later growth (a larger request, regrowth after release_cached);
 * a second peer gets them all too; enabling a peer again costs nothing. */
START_TEST(test_peer_vm_pool_grants_held_and_later_mappings) {
  fix_t f = fix_open();
  rmmc_resource_t *vm = f.vm, *pool = f.pool;
  void *a = alloc_ok(pool, 3 * SEG), *b = alloc_ok(pool, 40 * KiB);
  size_t held = field(pool, "mappings");
  ck_assert_uint_ge(held, 3);
  ck_assert_uint_eq(vmspy_unreachable(vm, 1, &(size_t){0}), held); /* nothing granted yet */

  OK(rmmc_resource_enable_peer_access(pool, 1));
  all_reachable(vm, 1, held);
  ck_assert_uint_eq(vmspy_counts(vm).grants, held);
  ck_assert_uint_eq(vmspy_counts(vm).peers_enabled, (uint64_t)1 << 1); /* passed down */
  char text[64];
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "1");

  /* Growth after the call: a request larger than all that is free. */
  void *c = alloc_ok(pool, 7 * SEG + 1000);
  ck_assert_uint_gt(field(pool, "mappings"), held);
  all_reachable(vm, 1, held + 7);
  pool_fill(c, 7 * SEG + 1000, 5);
  ck_assert(pool_filled(c, 7 * SEG + 1000, 5));

  /* Everything back to vmspy, then new mappings at the same addresses: the
   * driver forgets access with a mapping, so each must be granted anew. */
  free_ok(pool, a, 3 * SEG);
  free_ok(pool, c, 7 * SEG + 1000);
  OK(rmmc_resource_release_cached(pool));
  ck_assert_uint_gt(vmspy_counts(vm).unmaps, 0);
  uint64_t grants = vmspy_counts(vm).grants;
  void *d = alloc_ok(pool, 5 * SEG);
  all_reachable(vm, 1, 5);
  ck_assert_uint_ge(vmspy_counts(vm).grants, grants + 5);

  /* A second peer: every mapping reachable from both. */
  OK(rmmc_resource_enable_peer_access(pool, 3));
  all_reachable(vm, 1, 5);
  all_reachable(vm, 3, 5);
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "1,3");
  void *e = alloc_ok(pool, 4 * SEG);
  all_reachable(vm, 1, 9);
  all_reachable(vm, 3, 9);

  /* Again: no grant, no error. */
  grants = vmspy_counts(vm).grants;
  OK(rmmc_resource_enable_peer_access(pool, 1));
  ck_assert_uint_eq(vmspy_counts(vm).grants, grants);
  ck_assert_uint_eq(vmspy_counts(vm).peer_enables, 3);
  size_t mapped = 0;
  ck_assert_uint_eq(vmspy_unreachable(vm, 2, &mapped), mapped); /* device 2 was never named */

  free_ok(pool, b, 40 * KiB);
  free_ok(pool, d, 5 * SEG);
  free_ok(pool, e, 4 * SEG);
  CHECK_POOL(pool);
  OK(rmmc_resource_release_cached(pool));
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  fix_close(&f);
}
END_TEST

/* Enabled on a pool that holds nothing: nothing to grant, and its first
 * mappings (with several segments in one growth) are granted as made. */
START_TEST(test_peer_vm_pool_enabled_before_any_mapping) {
  fix_t f = fix_open();
  rmmc_resource_t *vm = f.vm, *pool = f.pool;
  OK(rmmc_resource_enable_peer_access(pool, 2));
  ck_assert_uint_eq(vmspy_counts(vm).grants, 0);
  ck_assert_uint_eq(field(pool, "mappings"), 0);
  void *p = alloc_ok(pool, 6 * SEG);
  ck_assert_uint_ge(field(pool, "mappings"), 6);
  all_reachable(vm, 2, 6);
  ck_assert_uint_eq(vmspy_counts(vm).grants, field(pool, "mappings"));
  free_ok(pool, p, 6 * SEG);
  fix_close(&f);
}
END_TEST

/* A growth whose grant is refused goes back whole: the mapping refused and
 * those this growth made before it are unmapped, the hooks heard of no
 * range that stayed, the pool reserves what it did before; the status is
 * the upstream's. The next request grows and is granted. */
START_TEST(test_peer_vm_refused_grant_takes_the_growth_back) {
  for (uint64_t nth = 1; nth <= 3; nth++) {
    fix_t f = fix_open();
    rmmc_resource_t *vm = f.vm, *pool = f.pool;
    held_t h = {0};
    hook(pool, &h);
    void *keep = alloc_ok(pool, SEG);
    OK(rmmc_resource_enable_peer_access(pool, 1));
    size_t reserved = field(pool, "reserved"), mapped = vmspy_counts(vm).mapped_bytes;
    uint64_t maps = vmspy_counts(vm).maps;

    vmspy_fail_set_access(vm, nth, 1); /* the nth mapping of a 3-segment growth */
    void *p = (void *)1;
    FAILS_WITH(rmmc_resource_allocate(pool, 3 * SEG, 256, NULL, &p), RMMC_ERROR_CUDA,
               "injected vm_set_access failure");
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(vmspy_counts(vm).access_failures, 1);
    ck_assert_uint_eq(vmspy_counts(vm).maps, maps + nth); /* mapped up to the refusal */
    ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, mapped);
    ck_assert_uint_eq(field(pool, "reserved"), reserved);
    ck_assert_uint_eq(h.bytes, reserved);
    ck_assert_uint_eq(h.acquires - 1, h.releases); /* the kept segment only */
    ck_assert_uint_eq(h.releases, nth - 1);
    CHECK_POOL(pool);
    all_reachable(vm, 1, 1);

    p = alloc_ok(pool, 3 * SEG);
    all_reachable(vm, 1, 4);
    ck_assert_uint_eq(h.bytes, field(pool, "reserved"));
    free_ok(pool, p, 3 * SEG);
    free_ok(pool, keep, SEG);
    fix_close(&f);
    ck_assert_uint_eq(h.bytes, 0);
  }
}
END_TEST

/* A refused grant whose mapping cannot be unmapped either (the upstream
 * keeps it: a faulty free under vmspy): the status is the grant's and the
 * message says which range stays mapped outside the pool's books; the pool
 * itself is whole and reserves what it did. */
START_TEST(test_peer_vm_refused_grant_and_unmap_says_what_stays) {
  rmmc_resource_t *spy = new_spy(), *fy, *vm, *pool;
  OK(faulty_create(spy, &fy));
  OK(vmspy_create(fy, 4 * KiB, &vm));
  pool = vm_pool(vm);
  void *keep = alloc_ok(pool, SEG);
  OK(rmmc_resource_enable_peer_access(pool, 1));
  size_t reserved = field(pool, "reserved");
  vmspy_fail_set_access(vm, 1, 1);
  faulty_fail_deallocate(faulty_of(fy), RMMC_ERROR_CUDA, 1);
  void *p = NULL;
  FAILS_WITH(rmmc_resource_allocate(pool, SEG, 256, NULL, &p), RMMC_ERROR_CUDA,
             "injected vm_set_access failure (unmapping it failed too");
  char where[64];
  snprintf(where, sizeof where, "%p + %zu bytes stay mapped", (void *)((char *)keep + SEG), SEG);
  ck_assert_msg(strstr(rmmc_last_error_message(), where), "%s lacks '%s'",
                rmmc_last_error_message(), where);
  CHECK_POOL(pool);
  ck_assert_uint_eq(field(pool, "reserved"), reserved);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, reserved + SEG); /* as the message says */
  OK(rmmc_resource_vm_unmap(vm, (char *)keep + SEG, SEG));          /* the caller's to undo */
  free_ok(pool, keep, SEG);
  rmmc_resource_release(pool);
  ck_assert_uint_eq(vmspy_counts(vm).mapped_bytes, 0);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  rmmc_resource_release(vm);
  rmmc_resource_release(fy);
  finish_spy(spy);
}
END_TEST

/* Granting what is held, refused at the nth mapping: the n - 1 granted
 * before are taken back, the peer is not recorded (later mappings are not
 * granted to it), the status and message are the upstream's. */
START_TEST(test_peer_vm_refused_grant_of_held_mappings_takes_back) {
  fix_t f = fix_open();
  rmmc_resource_t *vm = f.vm, *pool = f.pool;
  void *p = alloc_ok(pool, 4 * SEG);
  ck_assert_uint_eq(field(pool, "mappings"), 4);
  vmspy_fail_set_access(vm, 3, 1);
  FAILS_WITH(rmmc_resource_enable_peer_access(pool, 5), RMMC_ERROR_CUDA,
             "injected vm_set_access failure");
  vmspy_counts_t c = vmspy_counts(vm);
  ck_assert_uint_eq(c.grants, 2);
  ck_assert_uint_eq(c.revokes, 2);
  size_t mapped = 0;
  ck_assert_uint_eq(vmspy_unreachable(vm, 5, &mapped), 4);
  char text[64];
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "");
  void *q = alloc_ok(pool, 2 * SEG); /* not granted: device 5 is no peer */
  ck_assert_uint_eq(vmspy_counts(vm).grants, 2);
  ck_assert_uint_eq(vmspy_unreachable(vm, 5, &mapped), 6);

  /* Asked again, it works, for all six. */
  OK(rmmc_resource_enable_peer_access(pool, 5));
  all_reachable(vm, 5, 6);
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "5");
  free_ok(pool, p, 4 * SEG);
  free_ok(pool, q, 2 * SEG);
  CHECK_POOL(pool);
  fix_close(&f);
}
END_TEST

/* The take-back refused too (calls 3 and 4 fail: the grant of the third
 * mapping, then taking the first back): the first stays reachable from the
 * peer and the message says how many; the status is the grant's. */
START_TEST(test_peer_vm_refused_take_back_says_what_stays) {
  fix_t f = fix_open();
  rmmc_resource_t *vm = f.vm, *pool = f.pool;
  void *p = alloc_ok(pool, 4 * SEG);
  vmspy_fail_set_access(vm, 3, 2);
  FAILS_WITH(rmmc_resource_enable_peer_access(pool, 5), RMMC_ERROR_CUDA,
             "injected vm_set_access failure (device 5 keeps access to 1 of the pool's mappings");
  vmspy_counts_t c = vmspy_counts(vm);
  ck_assert_uint_eq(c.access_failures, 2);
  ck_assert_uint_eq(c.grants, 2);
  ck_assert_uint_eq(c.revokes, 1);
  size_t mapped = 0;
  ck_assert_uint_eq(vmspy_unreachable(vm, 5, &mapped), 3);
  char text[64];
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "");
  free_ok(pool, p, 4 * SEG);
  fix_close(&f);
}
END_TEST

/* Threads grow and trim the pool while peers are enabled one by one: no
 * mapping made around an enable escapes it. */
typedef struct grower {
  rmmc_resource_t *pool;
  unsigned seed;
  int errors;
} grower_t;

static void *grow_and_trim(void *arg) {
  grower_t *g = arg;
  enum { LIVE = 16 };
  void *p[LIVE] = {0};
  size_t n[LIVE] = {0};
  for (int it = 0; it < pool_steps(3000); it++) {
    unsigned k = (g->seed = g->seed * 1103515245u + 12345u) >> 8;
    int i = (int)(k % LIVE);
    if (p[i] != NULL) {
      g->errors += rmmc_resource_deallocate(g->pool, p[i], n[i], 256, NULL) != RMMC_SUCCESS;
      p[i] = NULL;
    } else {
      n[i] = 256 + (k >> 4) % (3 * SEG);
      g->errors += rmmc_resource_allocate(g->pool, n[i], 256, NULL, &p[i]) != RMMC_SUCCESS;
    }
    if (it % 200 == 199) g->errors += rmmc_resource_release_cached(g->pool) != RMMC_SUCCESS;
  }
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL) g->errors += rmmc_resource_deallocate(g->pool, p[i], n[i], 256, NULL) != 0;
  return NULL;
}

START_TEST(test_peer_vm_enable_races_growth) {
  fix_t f = fix_open();
  rmmc_resource_t *vm = f.vm, *pool = f.pool;
  pthread_t t[4];
  grower_t g[4];
  for (int i = 0; i < 4; i++) {
    g[i] = (grower_t){pool, 17u * (unsigned)i + 1, 0};
    pthread_create(&t[i], NULL, grow_and_trim, &g[i]);
  }
  for (int d = 1; d <= 6; d++) {
    OK(rmmc_resource_enable_peer_access(pool, d));
    for (volatile int spin = 0; spin < 200000; spin++) {
    }
  }
  void *p = alloc_ok(pool, 9 * SEG); /* mapped while the others run, or after */
  /* Checked once the others are done: while they run, a segment one of them
   * is mapping is briefly mapped and not yet granted (map_segment grants
   * right after the map, before the pool hands it out), which vmspy sees;
   * and a failed check must not leave this frame while they use g[]. */
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int d = 1; d <= 6; d++) all_reachable(vm, d, 9);
  free_ok(pool, p, 9 * SEG);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(g[i].errors, 0);
  for (int d = 1; d <= 6; d++) all_reachable(vm, d, 0);
  ck_assert_uint_gt(vmspy_counts(vm).unmaps, 0);
  CHECK_POOL(pool);
  fix_close(&f);
}
END_TEST

/* Over a limiting adaptor (which has the virtual-memory slots): the grants
 * pass through it to vmspy. */
START_TEST(test_peer_vm_pool_over_an_adaptor) {
  rmmc_resource_t *spy = new_spy(), *vm, *lim, *pool, *top;
  OK(vmspy_create(spy, 4 * KiB, &vm));
  OK(rmmc_limiting_adaptor_create(vm, 64 * MiB, &lim));
  pool = vm_pool(lim);
  OK(rmmc_statistics_adaptor_create(pool, &top));
  void *p = alloc_ok(top, 2 * SEG);
  OK(rmmc_resource_enable_peer_access(top, 1));
  all_reachable(vm, 1, 2);
  void *q = alloc_ok(top, 3 * SEG);
  all_reachable(vm, 1, 5);
  ck_assert_uint_eq(vmspy_counts(vm).peers_enabled, (uint64_t)1 << 1);
  free_ok(top, p, 2 * SEG);
  free_ok(top, q, 3 * SEG);
  rmmc_resource_release(top);
  rmmc_resource_release(pool);
  rmmc_resource_release(lim);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  rmmc_resource_release(vm);
  finish_spy(spy);
}
END_TEST

/* ---- passing down ---- */

static rmmc_status_t b_pool_chunks(rmmc_resource_t *up, rmmc_resource_t **out) {
  rmmc_pool_options_t o = RMMC_POOL_OPTIONS_INIT;
  o.expandable = 0;
  return rmmc_pool_resource_create(up, &o, out);
}
static rmmc_status_t b_fixed_size(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_fixed_size_resource_create(up, NULL, out);
}
static rmmc_status_t b_binning(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_binning_resource_create(up, NULL, out);
}
static rmmc_status_t b_arena(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_arena_resource_create(up, NULL, out);
}
static rmmc_status_t b_limiting(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_limiting_adaptor_create(up, (size_t)1 << 30, out);
}
static rmmc_status_t b_tracking(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_tracking_adaptor_create(up, NULL, out);
}
static rmmc_status_t b_statistics(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_statistics_adaptor_create(up, out);
}
static rmmc_status_t b_logging(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_logging_adaptor_create(up, "/dev/null", NULL, out);
}
static rmmc_status_t b_failure_callback(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_failure_callback_adaptor_create_release_cached(up, 2, out);
}
static rmmc_status_t b_aligned(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_aligned_adaptor_create(up, NULL, out);
}
static rmmc_status_t b_thread_safe(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_thread_safe_adaptor_create(up, out);
}
static rmmc_status_t b_prefetch(rmmc_resource_t *up, rmmc_resource_t **out) {
  return rmmc_prefetch_adaptor_create(up, out);
}
static rmmc_status_t b_faulty(rmmc_resource_t *up, rmmc_resource_t **out) {
  return faulty_create(up, out);
}

typedef rmmc_status_t (*builder_t)(rmmc_resource_t *up, rmmc_resource_t **out);
typedef struct layer_case {
  const char *name;
  builder_t build;
  rmmc_memory_kind_t base_kind; /* prefetch needs a spy that says device memory */
} layer_case_t;

static const layer_case_t layers[] = {
    {"pool(expandable=false)", b_pool_chunks, RMMC_MEMORY_HOST},
    {"fixed_size", b_fixed_size, RMMC_MEMORY_HOST},
    {"binning", b_binning, RMMC_MEMORY_HOST},
    {"arena", b_arena, RMMC_MEMORY_HOST},
    {"limiting", b_limiting, RMMC_MEMORY_HOST},
    {"tracking", b_tracking, RMMC_MEMORY_HOST},
    {"statistics", b_statistics, RMMC_MEMORY_HOST},
    {"logging", b_logging, RMMC_MEMORY_HOST},
    {"failure_callback", b_failure_callback, RMMC_MEMORY_HOST},
    {"aligned", b_aligned, RMMC_MEMORY_HOST},
    {"thread_safe", b_thread_safe, RMMC_MEMORY_HOST},
    {"prefetch", b_prefetch, RMMC_MEMORY_DEVICE},
    {"faulty (a user's adaptor with the slot)", b_faulty, RMMC_MEMORY_HOST},
};

/* Every layer hands the call to the base once, with the device, and serves
 * allocations as before; a refusal of the base comes back unchanged. */
START_TEST(test_peer_every_layer_passes_down) {
  const layer_case_t *c = &layers[_i];
  rmmc_resource_t *spy, *r = NULL;
  ck_assert_int_eq(spy_create(c->base_kind, &spy), RMMC_SUCCESS);
  ck_assert_msg(c->build(spy, &r) == RMMC_SUCCESS, "%s: %s", c->name, rmmc_last_error_message());
  int peer = c->base_kind == RMMC_MEMORY_HOST ? 0 : 1; /* the device spy is device 0's */
  void *p = alloc_ok(r, 5000);
  OK(rmmc_resource_enable_peer_access(r, peer));
  spy_counts_t s = spy_counts(spy_of(spy));
  ck_assert_msg(s.peer_calls == 1 && s.last_peer == peer, "%s: %llu calls, last device %d",
                c->name, (unsigned long long)s.peer_calls, s.last_peer);
  ck_assert_uint_eq(s.peers, (uint64_t)1 << peer);
  spy_fail_peer_access(spy_of(spy), RMMC_ERROR_NOT_SUPPORTED);
  FAILS_WITH(rmmc_resource_enable_peer_access(r, 7), RMMC_ERROR_NOT_SUPPORTED,
             "spy: injected ERROR_NOT_SUPPORTED");
  ck_assert_uint_eq(spy_counts(spy_of(spy)).peers, (uint64_t)1 << peer);
  void *q = alloc_ok(r, 70000);
  free_ok(r, q, 70000);
  free_ok(r, p, 5000);
  finish(r, spy);
}
END_TEST

/* A user's adaptor that fails the call: the failure comes back, the base
 * below never hears of it; a chunk pool above records no peer. */
START_TEST(test_peer_refusal_above_the_base) {
  rmmc_resource_t *spy = new_spy(), *f, *pool;
  OK(faulty_create(spy, &f));
  OK(b_pool_chunks(f, &pool));
  faulty_fail_peer_access(faulty_of(f), RMMC_ERROR_CUDA, 1);
  FAILS_WITH(rmmc_resource_enable_peer_access(pool, 2), RMMC_ERROR_CUDA,
             "faulty: injected ERROR_CUDA");
  ck_assert_uint_eq(faulty_counts(faulty_of(f)).peer_injected, 1);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).peer_calls, 0);
  char text[64];
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "");
  OK(rmmc_resource_enable_peer_access(pool, 2));
  ck_assert_str_eq(peers_of(pool, text, sizeof text), "2");
  ck_assert_uint_eq(spy_counts(spy_of(spy)).peers, (uint64_t)1 << 2);
  rmmc_resource_release(pool);
  rmmc_resource_release(f);
  finish_spy(spy);
}
END_TEST

/* ---- what cannot be done ---- */

/* A table of version 3 is read as such: its slot past version 3 is never
 * called, whatever it holds (a table built against an older header has
 * nothing there). */
static int v3_calls;
static rmmc_status_t v3_enable(rmmc_resource_t *r, int d) {
  (void)r, (void)d;
  v3_calls++;
  return RMMC_ERROR_INTERNAL;
}
static rmmc_status_t v3_set_access(rmmc_resource_t *r, void *p, size_t n, int d, bool rw) {
  (void)r, (void)p, (void)n, (void)d, (void)rw;
  v3_calls++;
  return RMMC_ERROR_INTERNAL;
}
typedef struct v3 {
  rmmc_resource_t base;
  rmmc_resource_t *up;
} v3_t;
static rmmc_status_t v3_allocate(rmmc_resource_t *r, size_t b, size_t a, cudaStream_t s,
                                 void **out) {
  return rmmc_resource_allocate(((v3_t *)r)->up, b, a, s, out);
}
static rmmc_status_t v3_deallocate(rmmc_resource_t *r, void *p, size_t b, size_t a,
                                   cudaStream_t s) {
  return rmmc_resource_deallocate(((v3_t *)r)->up, p, b, a, s);
}
static void v3_destroy(rmmc_resource_t *r) {
  rmmc_resource_release(((v3_t *)r)->up);
  free(r);
}
static rmmc_resource_t *v3_upstream(const rmmc_resource_t *r) { return ((const v3_t *)r)->up; }
static size_t v3_page(const rmmc_resource_t *r) {
  return rmmc_resource_vm_page_size(((const v3_t *)r)->up);
}
static rmmc_status_t v3_reserve(rmmc_resource_t *r, size_t b, size_t a, void **out) {
  return rmmc_resource_vm_reserve(((v3_t *)r)->up, b, a, out);
}
static rmmc_status_t v3_unreserve(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_unreserve(((v3_t *)r)->up, p, b);
}
static rmmc_status_t v3_map(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_map(((v3_t *)r)->up, p, b);
}
static rmmc_status_t v3_unmap(rmmc_resource_t *r, void *p, size_t b) {
  return rmmc_resource_vm_unmap(((v3_t *)r)->up, p, b);
}
static const rmmc_resource_ops_t v3_ops = {
    .version = 3, .name = "v3", .allocate = v3_allocate, .deallocate = v3_deallocate,
    .destroy = v3_destroy, .upstream = v3_upstream, .vm_page_size = v3_page,
    .vm_reserve = v3_reserve, .vm_unreserve = v3_unreserve, .vm_map = v3_map, .vm_unmap = v3_unmap,
    .enable_peer_access = v3_enable, .vm_set_access = v3_set_access};

static rmmc_resource_t *v3_over(rmmc_resource_t *up) {
  v3_t *v = calloc(1, sizeof *v);
  ck_assert_ptr_nonnull(v);
  rmmc_resource_init(&v->base, &v3_ops, rmmc_resource_memory_kind(up), rmmc_resource_device(up));
  v->up = rmmc_resource_retain(up);
  return &v->base;
}

START_TEST(test_peer_version_3_tables) {
  /* An adaptor of version 3 over a spy: passed by, the spy takes it. */
  rmmc_resource_t *spy = new_spy(), *v = v3_over(spy);
  OK(rmmc_resource_enable_peer_access(v, 1));
  ck_assert_uint_eq(spy_counts(spy_of(spy)).peer_calls, 1);
  rmmc_resource_release(v);
  finish_spy(spy);
  /* Virtual memory of version 3 under a pool: the pool cannot grant its
   * pages, and says so before anything changes, holding pages or not. */
  rmmc_resource_t *spy2 = new_spy(), *vm, *pool;
  OK(vmspy_create(spy2, 4 * KiB, &vm));
  v = v3_over(vm);
  pool = vm_pool(v);
  for (int round = 0; round < 2; round++) {
    FAILS_WITH(rmmc_resource_enable_peer_access(pool, 1), RMMC_ERROR_NOT_SUPPORTED,
               "its upstream, v3, cannot grant");
    ck_assert_uint_eq(vmspy_counts(vm).peer_enables, 0);
    void *p = alloc_ok(pool, 2 * SEG);
    free_ok(pool, p, 2 * SEG);
  }
  FAILS_WITH(rmmc_resource_vm_set_access(v, (void *)(uintptr_t)(64 * KiB), 64 * KiB, 1, true),
             RMMC_ERROR_NOT_SUPPORTED, "v3 cannot give other devices access");
  ck_assert_int_eq(v3_calls, 0);
  rmmc_resource_release(pool);
  rmmc_resource_release(v);
  rmmc_resource_release(vm);
  finish_spy(spy2);
}
END_TEST

/* Memory no device can reach, and stacks that cannot grant their pages. */
START_TEST(test_peer_host_memory_is_refused) {
  const char *specs[] = {"host", "sim", "statistics > pool(expandable=false) > host",
                         "statistics > binning > fixed_size > sim"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    rmmc_resource_t *r = NULL;
    OK(rmmc_stack_create(specs[i], -1, &r));
    FAILS_WITH(rmmc_resource_enable_peer_access(r, 1), RMMC_ERROR_NOT_SUPPORTED,
               "hands out host memory, which kernels cannot reach");
    rmmc_resource_release(r);
  }
  /* The expandable pool (the arena is one) over host or sim: refused by
   * the pool, which names the upstream, before it holds anything or after. */
  const char *vm_specs[] = {"pool(expandable=true) > host", "pool(expandable=true) > sim",
                            "statistics > binning > arena > sim"};
  for (size_t i = 0; i < 3; i++) {
    rmmc_resource_t *r = NULL;
    OK(rmmc_stack_create(vm_specs[i], -1, &r));
    FAILS_WITH(rmmc_resource_enable_peer_access(r, 1), RMMC_ERROR_NOT_SUPPORTED,
               "cannot grant other devices its pages");
    void *p = alloc_ok(r, 3 * MiB);
    FAILS_WITH(rmmc_resource_enable_peer_access(r, 1), RMMC_ERROR_NOT_SUPPORTED,
               i == 0 ? "upstream, host" : "upstream, sim");
    free_ok(r, p, 3 * MiB);
    rmmc_resource_release(r);
  }
}
END_TEST

START_TEST(test_peer_bad_input) {
  FAILS_WITH(rmmc_resource_enable_peer_access(NULL, 1), RMMC_ERROR_INVALID_ARGUMENT,
             "resource is NULL");
  rmmc_resource_t *spy = new_spy(), *vm, *pool, *dev;
  FAILS_WITH(rmmc_resource_enable_peer_access(spy, -1), RMMC_ERROR_INVALID_ARGUMENT,
             "device -1 is out of range [0, 64)");
  FAILS_WITH(rmmc_resource_enable_peer_access(spy, 64), RMMC_ERROR_INVALID_ARGUMENT,
             "device 64 is out of range");
  ck_assert_uint_eq(spy_counts(spy_of(spy)).peer_calls, 0);
  /* Its own device: a spy that says it is device 0's. */
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &dev), RMMC_SUCCESS);
  FAILS_WITH(rmmc_resource_enable_peer_access(dev, 0), RMMC_ERROR_INVALID_ARGUMENT,
             "device 0 cannot be its own peer");
  ck_assert_uint_eq(spy_counts(spy_of(dev)).peer_calls, 0);
  finish_spy(dev);

  OK(vmspy_create(spy, 4 * KiB, &vm));
  pool = vm_pool(vm);
  void *p = alloc_ok(pool, SEG);
  FAILS_WITH(rmmc_resource_vm_set_access(NULL, p, SEG, 1, true), RMMC_ERROR_INVALID_ARGUMENT,
             "resource is NULL");
  FAILS_WITH(rmmc_resource_vm_set_access(vm, NULL, SEG, 1, true), RMMC_ERROR_INVALID_ARGUMENT,
             "pointer is NULL");
  FAILS_WITH(rmmc_resource_vm_set_access(vm, (char *)p + 256, SEG, 1, true),
             RMMC_ERROR_INVALID_ARGUMENT, "whole");
  FAILS_WITH(rmmc_resource_vm_set_access(vm, p, 0, 1, true), RMMC_ERROR_INVALID_ARGUMENT,
             "non-empty");
  FAILS_WITH(rmmc_resource_vm_set_access(vm, p, SEG, -2, true), RMMC_ERROR_INVALID_ARGUMENT,
             "out of range");
  FAILS_WITH(rmmc_resource_vm_set_access(pool, p, SEG, 1, true), RMMC_ERROR_NOT_SUPPORTED,
             "pool has no virtual memory");
  ck_assert_uint_eq(vmspy_counts(vm).grants + vmspy_counts(vm).errors, 0);
  /* Through the wrapper, whole mappings: granted, then taken back. */
  OK(rmmc_resource_vm_set_access(vm, p, SEG, 4, true));
  all_reachable(vm, 4, 1);
  OK(rmmc_resource_vm_set_access(vm, p, SEG, 4, false));
  size_t mapped = 0;
  ck_assert_uint_eq(vmspy_unreachable(vm, 4, &mapped), mapped);
  free_ok(pool, p, SEG);
  rmmc_resource_release(pool);
  rmmc_resource_release(vm);
  /* No GPU here: asking CUDA which devices are peers says none. */
  if (rmmc_device_count() == 0) {
    ck_assert(!rmmc_device_can_access_peer(0, 1));
    ck_assert(!rmmc_device_can_access_peer(1, 0));
  }
  ck_assert(!rmmc_device_can_access_peer(0, 0));
  ck_assert(!rmmc_device_can_access_peer(-1, 0));
  ck_assert(!rmmc_device_can_access_peer(0, 64));
  finish_spy(spy);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("peer");
  TCase *tc = tcase_create("peer_access");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_peer_vm_pool_grants_held_and_later_mappings);
  tcase_add_test(tc, test_peer_vm_pool_enabled_before_any_mapping);
  tcase_add_test(tc, test_peer_vm_refused_grant_takes_the_growth_back);
  tcase_add_test(tc, test_peer_vm_refused_grant_and_unmap_says_what_stays);
  tcase_add_test(tc, test_peer_vm_refused_grant_of_held_mappings_takes_back);
  tcase_add_test(tc, test_peer_vm_refused_take_back_says_what_stays);
  tcase_add_test(tc, test_peer_vm_enable_races_growth);
  tcase_add_test(tc, test_peer_vm_pool_over_an_adaptor);
  tcase_add_loop_test(tc, test_peer_every_layer_passes_down, 0,
                      (int)(sizeof layers / sizeof layers[0]));
  tcase_add_test(tc, test_peer_refusal_above_the_base);
  tcase_add_test(tc, test_peer_version_3_tables);
  tcase_add_test(tc, test_peer_host_memory_is_refused);
  tcase_add_test(tc, test_peer_bad_input);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return rmmc_test_run(suite(), false); }
