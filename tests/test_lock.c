/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The internal lock (src/base/lock.h), compiled into this program: mutual
 * exclusion under contention (a plain counter and an occupancy flag checked
 * inside), waiters that went to sleep on the futex all get the lock once a
 * long holder drops it, and try-lock's answers. Host suite; the TSan pass
 * builds the same calls over a pthread mutex.
 */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "base/lock.h"
#include "test_main.h"

static rmmc__lock_t lock = RMMC__LOCK_INIT;
static uint64_t counter;   /* written only under the lock */
static int inside;         /* 1 while a thread holds the lock */
static int overlaps;       /* times a thread found another inside */

enum { THREADS = 6, ROUNDS = 100000 };

static void *hammer(void *arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS; i++) {
    rmmc__lock(&lock);
    if (__atomic_exchange_n(&inside, 1, __ATOMIC_RELAXED) != 0)
      __atomic_add_fetch(&overlaps, 1, __ATOMIC_RELAXED);
    counter++;
    if (i % 997 == 0) /* now and then a longer hold, so waiters sleep */
      for (volatile int k = 0; k < 20000; k++) {
      }
    __atomic_store_n(&inside, 0, __ATOMIC_RELAXED);
    rmmc__unlock(&lock);
  }
  return NULL;
}

START_TEST(test_lock_excludes) {
  pthread_t t[THREADS];
  counter = 0;
  overlaps = 0;
  for (int i = 0; i < THREADS; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, NULL), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(overlaps, 0);
  ck_assert_uint_eq(counter, (uint64_t)THREADS * ROUNDS);
  ck_assert(rmmc__lock_try(&lock)); /* left free */
  rmmc__unlock(&lock);
}
END_TEST

static int acquired;

static void *waiter(void *arg) {
  (void)arg;
  rmmc__lock(&lock);
  acquired++;
  rmmc__unlock(&lock);
  return NULL;
}

START_TEST(test_lock_wakes_sleepers) {
  pthread_t t[THREADS];
  acquired = 0;
  rmmc__lock(&lock);
  for (int i = 0; i < THREADS; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, waiter, NULL), 0);
  /* Long enough for every waiter to spin out and sleep on the futex. */
  struct timespec hold = {0, 50 * 1000 * 1000};
  nanosleep(&hold, NULL);
  ck_assert(!rmmc__lock_try(&lock));
  ck_assert_int_eq(acquired, 0);
  rmmc__unlock(&lock);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(acquired, THREADS);
  ck_assert(rmmc__lock_try(&lock));
  ck_assert(!rmmc__lock_try(&lock)); /* not recursive */
  rmmc__unlock(&lock);
}
END_TEST

int main(void) {
  Suite *s = suite_create("lock");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 120); /* under valgrind and the sanitizers on 2 cores */
  tcase_add_test(tc, test_lock_excludes);
  tcase_add_test(tc, test_lock_wakes_sleepers);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
