/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-device registry on the CPU: set/get/previous, lifetime, device
 * checks, many threads, convenience calls. Host suite: these tests set a
 * host resource explicitly, which works with or without a GPU.
 */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rmmc/rmmc.h"
#include "spy.h"
#include "test_main.h"

START_TEST(test_registry_set_returns_previous) {
  rmmc_resource_t *a, *b, *prev = (rmmc_resource_t *)1;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &a), RMMC_SUCCESS);
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &b), RMMC_SUCCESS);
  rmmc_registry_clear();
  ck_assert_int_eq(rmmc_set_device_resource(0, a, &prev), RMMC_SUCCESS);
  ck_assert_ptr_null(prev);
  ck_assert_int_eq(rmmc_resource_refcount(a), 2);
  rmmc_resource_t *got;
  ck_assert_int_eq(rmmc_get_device_resource(0, &got), RMMC_SUCCESS);
  ck_assert_ptr_eq(got, a);
  ck_assert_int_eq(rmmc_resource_refcount(a), 2); /* get borrows */
  ck_assert_int_eq(rmmc_set_device_resource(0, b, &prev), RMMC_SUCCESS);
  ck_assert_ptr_eq(prev, a);
  ck_assert_int_eq(rmmc_resource_refcount(a), 2); /* the registry's reference moved to us */
  rmmc_resource_release(prev);
  ck_assert_int_eq(rmmc_resource_refcount(a), 1);
  /* previous == NULL releases the old one for us. */
  ck_assert_int_eq(rmmc_set_device_resource(0, a, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_refcount(b), 1);
  rmmc_registry_clear();
  ck_assert_int_eq(rmmc_resource_refcount(a), 1);
  rmmc_resource_release(a);
  rmmc_resource_release(b);
}
END_TEST

START_TEST(test_registry_checks_ids_and_devices) {
  rmmc_resource_t *r, *dev1;
  ck_assert_int_eq(rmmc_get_device_resource(-1, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_get_device_resource(RMMC_REGISTRY_MAX_DEVICES, &r), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_get_device_resource(0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_set_device_resource(-3, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  /* A device-kind resource of device 0 cannot serve another device. */
  ck_assert_int_eq(spy_create(RMMC_MEMORY_DEVICE, &dev1), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_resource_device(dev1), 0);
  if (rmmc_device_count() != 1) {
    ck_assert_int_eq(rmmc_set_device_resource(1, dev1, NULL), RMMC_ERROR_INCOMPATIBLE);
    ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "device 0 cannot serve device 1"));
    ck_assert_int_eq(rmmc_resource_refcount(dev1), 1);
  }
  rmmc_resource_release(dev1);
}
END_TEST

START_TEST(test_registry_without_gpu_says_so) {
  if (rmmc_device_count() > 0) return;
  rmmc_registry_clear();
  int dev = -5;
  ck_assert_int_eq(rmmc_get_current_device(&dev), RMMC_SUCCESS);
  ck_assert_int_eq(dev, 0);
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_get_current_device_resource(&r), RMMC_ERROR_NO_DEVICE);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(rmmc_last_error_message(), "no CUDA device"));
  void *p = (void *)1;
  ck_assert_int_eq(rmmc_allocate(100, NULL, &p), RMMC_ERROR_NO_DEVICE);
  ck_assert_ptr_null(p);
}
END_TEST

START_TEST(test_registry_convenience_calls_use_current) {
  rmmc_resource_t *s;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &s), RMMC_SUCCESS);
  rmmc_resource_t *prev;
  ck_assert_int_eq(rmmc_set_current_device_resource(s, &prev), RMMC_SUCCESS);
  void *p;
  ck_assert_int_eq(rmmc_allocate(1000, (cudaStream_t)0x30, &p), RMMC_SUCCESS);
  spy_counts_t c = spy_counts(spy_of(s));
  ck_assert_uint_eq(c.outstanding, 1);
  ck_assert_ptr_eq(c.last_stream, (cudaStream_t)0x30);
  ck_assert_int_eq(rmmc_deallocate(p, 1000, (cudaStream_t)0x30), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(s)).outstanding, 0);
  ck_assert_int_eq(rmmc_deallocate(NULL, 0, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_allocate(10, NULL, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  rmmc_resource_t *mine;
  ck_assert_int_eq(rmmc_set_current_device_resource(prev, &mine), RMMC_SUCCESS);
  ck_assert_ptr_eq(mine, s);
  rmmc_resource_release(mine);
  rmmc_resource_release(prev);
  rmmc_resource_release(s);
}
END_TEST

static rmmc_resource_t *g_res[4];

static void *hammer(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int i = 0; i < 20000; i++) {
    seed = seed * 1103515245u + 12345u;
    if ((seed >> 16) % 8 == 0) {
      rmmc_resource_t *prev;
      if (rmmc_set_device_resource(0, g_res[(seed >> 8) % 4], &prev) != RMMC_SUCCESS) return (void *)1;
      rmmc_resource_release(prev);
    } else {
      rmmc_resource_t *r;
      if (rmmc_get_device_resource(0, &r) != RMMC_SUCCESS) return (void *)2;
      if (r != g_res[0] && r != g_res[1] && r != g_res[2] && r != g_res[3]) return (void *)3;
    }
  }
  return NULL;
}

START_TEST(test_registry_many_threads) {
  for (int i = 0; i < 4; i++) ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &g_res[i]), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, g_res[0], NULL), RMMC_SUCCESS);
  pthread_t t[8];
  for (uintptr_t i = 0; i < 8; i++) pthread_create(&t[i], NULL, hammer, (void *)(i + 1));
  for (int i = 0; i < 8; i++) {
    void *rv;
    pthread_join(t[i], &rv);
    ck_assert_ptr_null(rv);
  }
  rmmc_registry_clear();
  /* Every reference the registry took came back. */
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(rmmc_resource_refcount(g_res[i]), 1);
    rmmc_resource_release(g_res[i]);
  }
}
END_TEST

/* Per-device stacks (host memory stands in for devices 0-3 without a GPU,
 * where every device id up to 63 may hold a resource): rmmc_deallocate
 * returns a block to the stack that holds it whatever device is current. */
START_TEST(test_registry_frees_to_the_owning_device) {
  if (rmmc_device_count() > 0) return; /* device ids past the GPUs are refused there */
  rmmc_registry_clear();
  rmmc_resource_t *r[4];
  for (int d = 0; d < 4; d++) {
    ck_assert_int_eq(rmmc_stack_create("pool(address_space=64MiB) > host", -1, &r[d]),
                     RMMC_SUCCESS);
    ck_assert_int_eq(rmmc_set_device_resource(d, r[d], NULL), RMMC_SUCCESS);
  }
  void *p[4];
  for (int d = 0; d < 4; d++) {
    rmmc_resource_t *got;
    ck_assert_int_eq(rmmc_get_device_resource(d, &got), RMMC_SUCCESS);
    ck_assert_ptr_eq(got, r[d]);
    ck_assert_int_eq(rmmc_resource_allocate(got, 1000 + 1000 * (size_t)d, 256, NULL, &p[d]),
                     RMMC_SUCCESS);
  }
  /* The current device is 0 (no GPU): each block still goes home. */
  for (int d = 3; d >= 0; d--) {
    ck_assert_int_eq(rmmc_deallocate(p[d], 1000 + 1000 * (size_t)d, NULL), RMMC_SUCCESS);
    uint64_t in_use = 1;
    ck_assert(rmmc_resource_get_field(r[d], "in_use", &in_use));
    ck_assert_uint_eq(in_use, 0);
  }
  /* A pointer no device's stack holds: the current one says so. */
  char local;
  ck_assert_int_eq(rmmc_deallocate(&local, 10, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  /* A stack that cannot tell (a spy) on the current device takes the free. */
  rmmc_resource_t *spy;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &spy), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_set_device_resource(0, spy, NULL), RMMC_SUCCESS);
  void *q;
  ck_assert_int_eq(rmmc_allocate(500, NULL, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_deallocate(q, 500, NULL), RMMC_SUCCESS);
  ck_assert_uint_eq(spy_counts(spy_of(spy)).outstanding, 0);
  /* A block of device 2 while device 0's stack cannot tell: given to 0,
   * which refuses it, and device 2 keeps it. */
  ck_assert_int_eq(rmmc_resource_allocate(r[2], 64, 256, NULL, &q), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_deallocate(q, 64, NULL), RMMC_ERROR_UNKNOWN_POINTER);
  ck_assert_int_eq(rmmc_resource_deallocate(r[2], q, 64, 256, NULL), RMMC_SUCCESS);
  rmmc_registry_clear();
  for (int d = 0; d < 4; d++) rmmc_resource_release(r[d]);
  rmmc_resource_release(spy);
}
END_TEST

/* rmmc_retain_device_resource (issue 25, F8): a new reference each time,
 * the resource of the moment; a set waits for retains under way, and a
 * child forked while other threads retain can still set (the counters of
 * threads that do not exist there start at zero). */
static int retain_stop;

static void *retain_loop(void *arg) {
  (void)arg;
  while (!__atomic_load_n(&retain_stop, __ATOMIC_ACQUIRE)) {
    rmmc_resource_t *r = NULL;
    if (rmmc_retain_device_resource(0, &r) != RMMC_SUCCESS || r == NULL) return (void *)1;
    rmmc_resource_release(r);
  }
  return NULL;
}

START_TEST(test_registry_retain_and_fork) {
  rmmc_resource_t *a, *b, *got;
  ck_assert_int_eq(rmmc_host_resource_create(&a), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_host_resource_create(&b), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_retain_device_resource(0, NULL), RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_int_eq(rmmc_retain_device_resource(RMMC_REGISTRY_MAX_DEVICES, &got),
                   RMMC_ERROR_INVALID_ARGUMENT);
  ck_assert_ptr_null(got);
  ck_assert_int_eq(rmmc_set_device_resource(0, a, NULL), RMMC_SUCCESS);
  ck_assert_int_eq(rmmc_retain_device_resource(0, &got), RMMC_SUCCESS);
  ck_assert_ptr_eq(got, a);
  ck_assert_int_eq(rmmc_resource_refcount(a), 3); /* ours, the registry's, this one */
  rmmc_resource_release(got);
  ck_assert_int_eq(rmmc_retain_current_device_resource(&got), RMMC_SUCCESS);
  ck_assert_ptr_eq(got, a);
  rmmc_resource_release(got);
  enum { T = 2 };
  pthread_t th[T];
  __atomic_store_n(&retain_stop, 0, __ATOMIC_RELEASE);
  for (int i = 0; i < T; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, retain_loop, NULL), 0);
  for (int round = 0; round < 40; round++) {
    ck_assert_int_eq(rmmc_set_device_resource(0, round % 2 ? a : b, NULL), RMMC_SUCCESS);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
      alarm(10); /* a set that waits for a thread the child lacks never returns */
      _exit(rmmc_set_device_resource(0, a, NULL) == RMMC_SUCCESS ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", round,
                  status);
  }
  __atomic_store_n(&retain_stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < T; i++) {
    void *rv;
    pthread_join(th[i], &rv);
    ck_assert_ptr_null(rv);
  }
  rmmc_registry_clear();
  ck_assert_int_eq(rmmc_resource_refcount(a), 1);
  ck_assert_int_eq(rmmc_resource_refcount(b), 1);
  rmmc_resource_release(a);
  rmmc_resource_release(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, test_registry_set_returns_previous);
  tcase_add_test(tc, test_registry_checks_ids_and_devices);
  tcase_add_test(tc, test_registry_without_gpu_says_so);
  tcase_add_test(tc, test_registry_convenience_calls_use_current);
  tcase_add_test(tc, test_registry_many_threads);
  tcase_add_test(tc, test_registry_frees_to_the_owning_device);
  tcase_add_test(tc, test_registry_retain_and_fork);
  suite_add_tcase(s, tc);
  return rmmc_test_run(s, false);
}
