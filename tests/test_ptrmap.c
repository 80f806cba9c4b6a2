/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The internal pointer map (src/base/ptrmap.c), compiled into this program:
 * random inserts, lookups and removals checked against a plain array, so
 * growth and backward-shift deletion keep every entry findable. Host suite.
 */
#include <stdint.h>
#include <stdlib.h>

#include "base/ptrmap.h"
#include "test_main.h"

START_TEST(test_ptrmap_matches_reference) {
  enum { N = 20000 };
  rmmc__ptrmap_t m;
  rmmc__ptrmap_init(&m);
  ck_assert_ptr_null(rmmc__ptrmap_find(&m, (void *)256));
  void **keys = calloc(N, sizeof *keys);
  size_t nkeys = 0;
  uint64_t next = 1, seed = 42;
  for (int op = 0; op < 200000; op++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    bool insert = nkeys == 0 || (nkeys < N && (seed >> 60) < 9);
    if (insert) {
      /* Keys are multiples of 256 with clustered high bits, like pointers. */
      void *k = (void *)(uintptr_t)((next++ * 256) | ((seed >> 40) & 0xf) << 32);
      if (rmmc__ptrmap_find(&m, k) != NULL) continue;
      ck_assert(rmmc__ptrmap_insert(&m, k, (char *)k + 1, (size_t)(uintptr_t)k ^ 7));
      keys[nkeys++] = k;
    } else {
      size_t i = (size_t)(seed >> 20) % nkeys;
      rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&m, keys[i]);
      ck_assert_ptr_nonnull(e);
      ck_assert_ptr_eq(e->value, (char *)keys[i] + 1);
      ck_assert_uint_eq(e->size, (size_t)(uintptr_t)keys[i] ^ 7);
      rmmc__ptrmap_remove(&m, e);
      ck_assert_ptr_null(rmmc__ptrmap_find(&m, keys[i]));
      keys[i] = keys[--nkeys];
    }
    ck_assert_uint_eq(m.count, nkeys);
    if (op % 50000 == 0)
      for (size_t i = 0; i < nkeys; i++) ck_assert_ptr_nonnull(rmmc__ptrmap_find(&m, keys[i]));
  }
  for (size_t i = 0; i < nkeys; i++) {
    rmmc__ptrmap_entry_t *e = rmmc__ptrmap_find(&m, keys[i]);
    ck_assert_ptr_nonnull(e);
    rmmc__ptrmap_remove(&m, e);
  }
  ck_assert_uint_eq(m.count, 0);
  rmmc__ptrmap_fini(&m);
  ck_assert_ptr_null(m.slots);
  free(keys);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ptrmap");
  TCase *tc = tcase_create("host");
  /* Check's default of 4 s: about 1 s here normally, but 11 s under ASan
   * on a loaded 2-core machine timed out (a sanitizer pass of scripts/test). */
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_ptrmap_matches_reference);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
