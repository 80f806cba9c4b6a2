/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A small mutex for short critical sections (internal).
 *
 * Uncontended, taking it is one compare-and-swap and dropping it one
 * exchange, inlined: about a quarter of a pthread mutex's cost, which
 * matters on allocator hot paths of a few dozen nanoseconds. A waiter spins
 * briefly, then sleeps on a futex (Linux; elsewhere it yields), so a holder
 * doing something slow (an upstream allocation, a device synchronization)
 * costs the waiters no CPU. The algorithm is mutex 3 of Drepper's "Futexes
 * Are Tricky": state 0 free, 1 held, 2 held and maybe waited for. Not
 * recursive; zero-initialized means unlocked.
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

static inline void rmmc__lock_sleep(int *state) {
#ifdef __linux__
  (void)syscall(SYS_futex, state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
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
 * sleep until the holder's unlock wakes us. */
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

static inline void rmmc__unlock(rmmc__lock_t *l) {
  if (__builtin_expect(__atomic_exchange_n(&l->state, 0, __ATOMIC_RELEASE) == 2, 0))
    rmmc__lock_wake(&l->state);
}

#endif /* RMMC_LOCK_PTHREAD */

#endif /* RMMC_LOCK_H */
