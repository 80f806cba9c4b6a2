/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-device registry (the device helpers are in device.c).
 *
 * Each slot is an atomic pointer: get is one load on the hot path and takes
 * the lock only to build a default on first use; set swaps under the lock.
 * Nothing here calls CUDA until a function that needs a device is called.
 *
 * Get-and-retain (rmmc_retain_device_resource, what the plug-ins and
 * rmmc_allocate use) must never retain a resource that a set on another
 * thread has replaced and its caller released meanwhile (loading the
 * borrowed pointer and then retaining it let that happen). A reader counts
 * itself in while it loads the slot and retains what it found; set, after
 * the swap, waits until every reader counted in before it has counted
 * itself out, and only then hands the previous resource back. The counters
 * are sharded per thread (a cache line each, so readers on different
 * threads touch no common line but the resource's own count) and come in
 * two generations: set moves new readers to the other generation before
 * it waits, so a stream of readers cannot keep it waiting. A reader's
 * window holds two loads and an atomic increment, nothing that blocks, so
 * the wait is short. The order is sequentially consistent: a reader that
 * counted itself in after set read its counter at zero loads the slot
 * after the swap, so it finds the new resource.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/internal.h"
#include "rmmc/registry.h"

_Static_assert(RMMC_REGISTRY_MAX_DEVICES == RMMC_MAX_DEVICES, "one device limit");

static rmmc_resource_t *slots[RMMC_MAX_DEVICES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static int nset; /* slots holding a resource (atomic reads; written under the lock) */

#define READER_SHARDS 64
typedef struct reader_count {
  int n; /* atomic */
  char pad[64 - sizeof(int)];
} reader_count_t;
static reader_count_t readers[2][READER_SHARDS];
static int reader_generation; /* atomic: 0 or 1; flipped by set under the lock */
static unsigned next_shard;   /* atomic */
static _Thread_local unsigned my_shard RMMC_TLS_FAST; /* shard + 1; 0: not chosen yet */

/* A child forked while another thread was counted in would wait for it
 * forever at its first set: only the forking thread goes on, and it is
 * never counted in across fork(). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void readers_reset_in_child(void) { memset(readers, 0, sizeof readers); }
static void register_atfork(void) { (void)pthread_atfork(NULL, NULL, readers_reset_in_child); }

static RMMC_COLD unsigned choose_shard(void) {
  pthread_once(&atfork_once, register_atfork);
  return __atomic_fetch_add(&next_shard, 1, __ATOMIC_RELAXED) % READER_SHARDS + 1;
}

/* Counts the calling thread in; returns the counter to count out of. */
static inline int *reader_enter(void) {
  unsigned k = my_shard;
  if (RMMC_UNLIKELY(k == 0)) my_shard = k = choose_shard();
  int gen = __atomic_load_n(&reader_generation, __ATOMIC_SEQ_CST);
  int *n = &readers[gen][k - 1].n;
  __atomic_add_fetch(n, 1, __ATOMIC_SEQ_CST);
  return n;
}

static inline void reader_exit(int *n) { __atomic_sub_fetch(n, 1, __ATOMIC_RELEASE); }

/* After a swap (lock held): moves new readers to the other generation and
 * waits until the readers of both that may have loaded the old pointer are
 * out. A reader in the new generation may also be waited for once; it
 * loaded the new pointer, and its window is short. */
static void readers_drain(void) {
  int old = __atomic_load_n(&reader_generation, __ATOMIC_RELAXED);
  __atomic_store_n(&reader_generation, old ^ 1, __ATOMIC_SEQ_CST);
  for (int g = 0; g < 2; g++)
    for (int i = 0; i < READER_SHARDS; i++)
      while (__atomic_load_n(&readers[old ^ g][i].n, __ATOMIC_SEQ_CST) != 0) sched_yield();
}

/* Keeps nset in step with slot `device` going from `was` to `now` (lock held). */
static void count_slot(const rmmc_resource_t *was, const rmmc_resource_t *now) {
  if ((was == NULL) != (now == NULL))
    __atomic_add_fetch(&nset, now != NULL ? 1 : -1, __ATOMIC_RELAXED);
}

static rmmc_status_t check_id(int device) {
  if (device < 0 || device >= RMMC_MAX_DEVICES)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "device %d is out of range [0, %d)", device, RMMC_MAX_DEVICES);
  int n = rmmc_device_count();
  if (n > 0 && device >= n)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "device %d does not exist (this machine has %d)", device, n);
  return RMMC_SUCCESS;
}

/* Device `device`'s resource (built on first use), retained when `retain`.
 * The slow path retains under the lock, which set takes to swap. */
static rmmc_status_t get_slot(int device, bool retain, rmmc_resource_t **out) {
  rmmc_resource_t *r;
  if (retain) {
    int *n = reader_enter();
    r = rmmc_resource_retain(__atomic_load_n(&slots[device], __ATOMIC_SEQ_CST));
    reader_exit(n);
  } else {
    r = __atomic_load_n(&slots[device], __ATOMIC_ACQUIRE);
  }
  if (RMMC_LIKELY(r != NULL)) {
    *out = r;
    return RMMC_SUCCESS;
  }
  rmmc_status_t st = RMMC_SUCCESS;
  pthread_mutex_lock(&registry_lock);
  r = slots[device];
  if (r == NULL) {
    st = rmmc__default_config_check(); /* a broken RMMC_ALLOC_CONF fails first, GPU or not */
    if (st == RMMC_SUCCESS && !rmmc__cuda_available()) {
      st = rmmc_set_error(RMMC_ERROR_NO_DEVICE,
                          "no CUDA device is available, so device %d has no default resource: "
                          "set one (a host resource, say) with rmmc_set_device_resource()",
                          device);
    } else if (st == RMMC_SUCCESS) {
      st = rmmc__create_default_resource(device, &r);
      if (st == RMMC_SUCCESS) {
        count_slot(NULL, r);
        __atomic_store_n(&slots[device], r, __ATOMIC_RELEASE);
      }
    }
  }
  if (st == RMMC_SUCCESS && retain) rmmc_resource_retain(r);
  pthread_mutex_unlock(&registry_lock);
  if (st == RMMC_SUCCESS) *out = r;
  return st;
}

RMMC_API rmmc_status_t rmmc_get_device_resource(int device, rmmc_resource_t **out) {
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "get_device_resource: out is NULL");
  *out = NULL;
  rmmc_status_t st = check_id(device);
  return st != RMMC_SUCCESS ? st : get_slot(device, false, out);
}

RMMC_API rmmc_status_t rmmc_retain_device_resource(int device, rmmc_resource_t **out) {
  if (out == NULL)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "retain_device_resource: out is NULL");
  *out = NULL;
  rmmc_status_t st = check_id(device);
  return st != RMMC_SUCCESS ? st : get_slot(device, true, out);
}

RMMC_API rmmc_status_t rmmc_set_device_resource(int device, rmmc_resource_t *r,
                                                rmmc_resource_t **previous) {
  if (previous != NULL) *previous = NULL;
  rmmc_status_t st = check_id(device);
  if (st != RMMC_SUCCESS) return st;
  if (r != NULL && r->device >= 0 && r->device != device)
    return rmmc_set_error(RMMC_ERROR_INCOMPATIBLE,
                          "set_device_resource: a %s resource of device %d cannot serve device %d",
                          r->ops->name, r->device, device);
  rmmc_resource_retain(r);
  pthread_mutex_lock(&registry_lock);
  rmmc_resource_t *old = slots[device];
  count_slot(old, r);
  __atomic_store_n(&slots[device], r, __ATOMIC_SEQ_CST);
  if (old != NULL) readers_drain(); /* no reader retains `old` from now on */
  pthread_mutex_unlock(&registry_lock);
  if (previous != NULL)
    *previous = old;
  else
    rmmc_resource_release(old);
  return RMMC_SUCCESS;
}

RMMC_API rmmc_status_t rmmc_get_current_device_resource(rmmc_resource_t **out) {
  int dev;
  if (out != NULL) *out = NULL;
  rmmc_status_t st = rmmc_get_current_device(&dev);
  return st != RMMC_SUCCESS ? st : rmmc_get_device_resource(dev, out);
}

RMMC_API rmmc_status_t rmmc_retain_current_device_resource(rmmc_resource_t **out) {
  int dev;
  if (out != NULL) *out = NULL;
  rmmc_status_t st = rmmc_get_current_device(&dev);
  return st != RMMC_SUCCESS ? st : rmmc_retain_device_resource(dev, out);
}

RMMC_API rmmc_status_t rmmc_set_current_device_resource(rmmc_resource_t *r,
                                                        rmmc_resource_t **previous) {
  int dev;
  if (previous != NULL) *previous = NULL;
  rmmc_status_t st = rmmc_get_current_device(&dev);
  return st != RMMC_SUCCESS ? st : rmmc_set_device_resource(dev, r, previous);
}

RMMC_API void rmmc_registry_clear(void) {
  rmmc_resource_t *held[RMMC_MAX_DEVICES];
  pthread_mutex_lock(&registry_lock);
  for (int i = 0; i < RMMC_MAX_DEVICES; i++) {
    held[i] = slots[i];
    __atomic_store_n(&slots[i], NULL, __ATOMIC_SEQ_CST);
  }
  __atomic_store_n(&nset, 0, __ATOMIC_RELAXED);
  readers_drain();
  pthread_mutex_unlock(&registry_lock);
  for (int i = 0; i < RMMC_MAX_DEVICES; i++) rmmc_resource_release(held[i]);
}

RMMC_API rmmc_status_t rmmc_allocate(size_t bytes, cudaStream_t stream, void **out) {
  rmmc_resource_t *r;
  if (out == NULL) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "allocate: out-pointer is NULL");
  rmmc_status_t st = rmmc_retain_current_device_resource(&r);
  if (st != RMMC_SUCCESS) {
    *out = NULL;
    return st;
  }
  st = rmmc_resource_allocate(r, bytes, RMMC_DEFAULT_ALIGNMENT, stream, out);
  rmmc_resource_release(r);
  return st;
}

/* Several devices have stacks: the one whose stack holds ptr, the current
 * device's first. A stack that cannot tell (rmmc_resource_get_allocation
 * says NOT_SUPPORTED) is taken at its word that the block is its own when
 * it is the current one; when no stack claims the block, the current one
 * gets the free and says what it makes of it. */
static RMMC_COLD rmmc_resource_t *owner_of(rmmc_resource_t *current, const void *ptr) {
  rmmc__error_state_t saved;
  rmmc__error_save(&saved);
  rmmc_allocation_t a = RMMC_ALLOCATION_INIT;
  rmmc_resource_t *owner = current;
  if (rmmc_resource_get_allocation(current, ptr, &a) == RMMC_ERROR_UNKNOWN_POINTER) {
    for (int d = 0; d < RMMC_MAX_DEVICES; d++) {
      int *n = reader_enter();
      rmmc_resource_t *r = rmmc_resource_retain(__atomic_load_n(&slots[d], __ATOMIC_SEQ_CST));
      reader_exit(n);
      if (r != NULL && r != current && rmmc_resource_get_allocation(r, ptr, &a) == RMMC_SUCCESS) {
        owner = r;
        break;
      }
      rmmc_resource_release(r);
    }
  }
  if (owner == current) rmmc_resource_retain(owner);
  rmmc__error_restore(&saved);
  return owner; /* retained */
}

RMMC_API rmmc_status_t rmmc_deallocate(void *ptr, size_t bytes, cudaStream_t stream) {
  rmmc_resource_t *r;
  if (ptr == NULL) return RMMC_SUCCESS;
  rmmc_status_t st = rmmc_retain_current_device_resource(&r);
  if (st != RMMC_SUCCESS) return st;
  if (RMMC_UNLIKELY(__atomic_load_n(&nset, __ATOMIC_RELAXED) > 1)) {
    rmmc_resource_t *owner = owner_of(r, ptr);
    rmmc_resource_release(r);
    r = owner;
  }
  st = rmmc_resource_deallocate(r, ptr, bytes, RMMC_DEFAULT_ALIGNMENT, stream);
  rmmc_resource_release(r);
  return st;
}
