/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A small mutex for short critical sections (internal).
 *
 * Uncontended, taking it is one compare-and-swap and dropping it a load
 * and a release store, inlined. The pool's 256 B allocate/free pair spent
 * about two thirds of its time on the lock's two read-modify-writes when
 * dropping it was an exchange; a store costs almost nothing. A waiter spins
 * briefly, then sleeps on a futex (Linux; elsewhere it yields), so a holder
 * doing something slow (an upstream allocation, a device synchronization)
 * costs the waiters no CPU. The states are those of mutex 3 of Drepper's
 * "Futexes Are Tricky": 0 free, 1 held, 2 held and maybe waited for. Not
 * recursive; zero-initialized means unlocked.
 *
 * Only an atomic read-modify-write that reads 0 takes the lock, and only
 * the holder stores 0, so exclusion is that of the exchange version. What
 * the plain store gives up is the exchange's report of a waiter that came
 * between the holder's load and its store: that waiter's mark is
 * overwritten and nobody wakes it. Such a waiter has entered the kernel and
 * found the word still 2 within that window of one instruction (in
 * practice only when the holder is preempted right there), and it sleeps
 * at most RMMC__LOCK_NAP_NS before it looks again: a lost wake-up costs a
 * millisecond, never a hang.
 *
 * Built with -Dlock=pthread (RMMC_LOCK_PTHREAD), the same calls map onto a
 * pthread mutex, which ThreadSanitizer, helgrind and DRD understand as a
 * lock (lock-order checks, "held" in reports): scripts/test's TSan pass
 * uses it. A zero-initialized glibc mutex is an unlocked default mutex, so
 * the rule above holds for both, and neither needs destroying.
 */
#ifndef RMMC_LOCK_H
#define RMMC_LOCK_H

#include <stdbool.h>

#if RMMC_LOCK_PTHREAD
#include <pthread.h>

typedef struct rmmc__lock {
  pthread_mutex_t mutex;
} rmmc__lock_t;

#define RMMC__LOCK_INIT {PTHREAD_MUTEX_INITIALIZER}

static inline void rmmc__lock(rmmc__lock_t *l) { (void)pthread_mutex_lock(&l->mutex); }
static inline bool rmmc__lock_try(rmmc__lock_t *l) { return pthread_mutex_trylock(&l->mutex) == 0; }
static inline void rmmc__unlock(rmmc__lock_t *l) { (void)pthread_mutex_unlock(&l->mutex); }

#else /* the futex lock */

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#else
#include <sched.h>
#endif

typedef struct rmmc__lock {
  int state;
} rmmc__lock_t;

#define RMMC__LOCK_INIT {0}

#if defined(__x86_64__) || defined(__i386__)
#define RMMC__CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RMMC__CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define RMMC__CPU_RELAX() ((void)0)
#endif

/* The longest a waiter sleeps before it looks at the lock again. */
#define RMMC__LOCK_NAP_NS 1000000L

static inline void rmmc__lock_sleep(int *state) {
#ifdef __linux__
  struct timespec nap = {0, RMMC__LOCK_NAP_NS};
  (void)syscall(SYS_futex, state, FUTEX_WAIT_PRIVATE, 2, &nap, NULL, 0);
#else
  (void)state;
  sched_yield();
#endif
}

static inline void rmmc__lock_wake(int *state) {
#ifdef __linux__
  (void)syscall(SYS_futex, state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
  (void)state;
#endif
}

/* The contended path: spin a little, then mark the lock waited-for and
 * sleep until the holder's unlock wakes us (or the nap ends). */
static inline void rmmc__lock_contended(rmmc__lock_t *l) {
  for (int i = 0; i < 128; i++) {
    int c = __atomic_load_n(&l->state, __ATOMIC_RELAXED);
    if (c == 0 && __atomic_compare_exchange_n(&l->state, &c, 1, false, __ATOMIC_ACQUIRE,
                                              __ATOMIC_RELAXED))
      return;
    RMMC__CPU_RELAX();
  }
  while (__atomic_exchange_n(&l->state, 2, __ATOMIC_ACQUIRE) != 0) rmmc__lock_sleep(&l->state);
}

static inline void rmmc__lock(rmmc__lock_t *l) {
  int c = 0;
  if (__builtin_expect(__atomic_compare_exchange_n(&l->state, &c, 1, false, __ATOMIC_ACQUIRE,
                                                   __ATOMIC_RELAXED),
                       1))
    return;
  rmmc__lock_contended(l);
}

/* Takes the lock if it is free; never waits. */
static inline bool rmmc__lock_try(rmmc__lock_t *l) {
  int c = 0;
  return __atomic_compare_exchange_n(&l->state, &c, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Drops the lock: a load, then a release store (header comment). */
static inline void rmmc__unlock(rmmc__lock_t *l) {
  bool waited = __atomic_load_n(&l->state, __ATOMIC_RELAXED) == 2;
  __atomic_store_n(&l->state, 0, __ATOMIC_RELEASE);
  if (__builtin_expect(waited, 0)) rmmc__lock_wake(&l->state);
}

#endif /* RMMC_LOCK_PTHREAD */

#endif /* RMMC_LOCK_H */
