/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The exporter's registry of shared blocks and the importer's staleness
 * check (exports.h). The table every handle points into is a memfd of
 * the exporting process mapped shared: word 0..7 a header (magic, table
 * id, slot count, pid), then one word per slot holding the generation of
 * the export that owns it, 0 when none. Only this process writes it;
 * importers map it read-only through /proc/PID/fd/FD, which the kernel
 * allows a process of the same user (the check a debugger's attach would
 * pass at read level), and fall back to trusting the handle when it does
 * not (then CUDA itself is the only check left: an IPC handle of memory
 * given back fails to open).
 *
 * The descriptor a handle names may be anything once its exporter is gone
 * (the pid reused) or when the handle is forged: a FIFO with no writer,
 * whose open would wait forever, a device, a socket, a file that shrinks
 * under a mapping (SIGBUS on the read). So the importer stats the path
 * first and opens only a regular file, without blocking (O_NONBLOCK,
 * O_NOCTTY), checks that the file it opened is the one it stat'ed, and maps
 * it only if it is a memfd sealed against shrinking (the exporter seals its
 * table so): anything else is a stale handle. The path is looked at
 * without the registry's lock held.
 *
 * The private side keeps, per slot, the block and the layer that handed it
 * out; a pointer map finds a slot from a freed pointer. A forked child
 * starts with no exports (pthread_atfork): the table it inherited is its
 * parent's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/exports.h"
#include "base/ptrmap.h"

#define HEADER_WORDS 8u
#define SLOTS 65536u /* slot 0 is never handed out: a handle's slot is never 0 */
#define TABLE_MAGIC UINT64_C(0x5345545850434d52) /* "RMCPXTES" read as a little-endian word */
#define TABLE_BYTES (((HEADER_WORDS + SLOTS) * sizeof(uint64_t) + 4095) & ~(size_t)4095)
#define FILTER 4096u
#define PEERS 32

typedef struct entry {
  uintptr_t base, user;
  size_t bytes;
  const rmmc_resource_t *owner;
  uint64_t gen; /* 0: free */
} entry_t;

/* An importer's mapping of another process's table. */
typedef struct peer {
  uint32_t pid;
  uint64_t id;
  dev_t dev;
  ino_t ino;
  const uint64_t *words;
  uint64_t used; /* for eviction: a clock */
} peer_t;

int rmmc__exports_count;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static uint32_t filter[FILTER]; /* exported pointers hashing here; atomic */
static struct {
  pid_t pid; /* made the table; 0: none yet */
  int fd;
  uint64_t id;
  uint64_t *words;
  entry_t *entries;
  uint32_t cap, next_unused; /* slots [1, next_unused) have been handed out */
  uint32_t *free_slots;
  uint32_t nfree;
  rmmc__ptrmap_t by_ptr; /* base and exported pointer -> slot (as a pointer) */
  uint64_t next_gen;
  peer_t peers[PEERS];
  uint64_t clock;
} ex;

static inline unsigned filter_of(uintptr_t p) {
  return (unsigned)((((uint64_t)p >> 8) * UINT64_C(0x9E3779B97F4A7C15)) >> 52) & (FILTER - 1);
}

/* ---- fork ---- */

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }

/* The child: its parent's exports are not its own, nor is the table. */
static void after_fork_child(void) {
  if (ex.words != NULL) munmap(ex.words, TABLE_BYTES);
  if (ex.pid != 0) close(ex.fd);
  for (int i = 0; i < PEERS; i++)
    if (ex.peers[i].words != NULL) munmap((void *)ex.peers[i].words, TABLE_BYTES);
  free(ex.entries);
  free(ex.free_slots);
  rmmc__ptrmap_fini(&ex.by_ptr);
  memset(&ex, 0, sizeof ex);
  memset(filter, 0, sizeof filter);
  rmmc__exports_count = 0;
  pthread_mutex_unlock(&lock);
}

static void register_atfork(void) {
  (void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- the table (lock held) ---- */

static rmmc_status_t make_table(void) {
  if (ex.pid != 0) return RMMC_SUCCESS;
  pthread_once(&atfork_once, register_atfork);
  int fd = memfd_create("rmmc-ipc-exports", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return rmmc_set_error(RMMC_ERROR_IO, "ipc: memfd_create for the export table failed: %s",
                          strerror(errno));
  /* Sealed at its size: an importer's mapping can never run past the end. */
  if (ftruncate(fd, (off_t)TABLE_BYTES) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(fd);
    return rmmc_set_error(RMMC_ERROR_IO, "ipc: sizing and sealing the export table failed: %s",
                          strerror(e));
  }
  void *m = mmap(NULL, TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    close(fd);
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc: mapping the export table failed: %s",
                          strerror(e));
  }
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
  }
  ex.words = m;
  ex.words[1] = id | 1; /* never 0 */
  ex.words[2] = SLOTS;
  ex.words[3] = (uint64_t)getpid();
  __atomic_store_n(&ex.words[0], TABLE_MAGIC, __ATOMIC_RELEASE);
  ex.fd = fd;
  ex.id = id | 1;
  ex.pid = getpid();
  ex.next_unused = 1;
  rmmc__ptrmap_init(&ex.by_ptr);
  return RMMC_SUCCESS;
}

static bool ensure_capacity(uint32_t slot) {
  if (slot < ex.cap) return true;
  uint32_t cap = ex.cap ? ex.cap * 2 : 256;
  while (cap <= slot) cap *= 2;
  if (cap > SLOTS) cap = SLOTS;
  entry_t *e = realloc(ex.entries, cap * sizeof *e);
  if (e == NULL) return false;
  memset(e + ex.cap, 0, (cap - ex.cap) * sizeof *e);
  uint32_t *f = realloc(ex.free_slots, cap * sizeof *f);
  if (f == NULL) {
    ex.entries = e; /* keep what grew; the capacity stays */
    return false;
  }
  ex.entries = e;
  ex.free_slots = f;
  ex.cap = cap;
  return true;
}

static void unkey(uintptr_t p) {
  rmmc__ptrmap_entry_t *m = rmmc__ptrmap_find(&ex.by_ptr, (void *)p);
  if (m != NULL) rmmc__ptrmap_remove(&ex.by_ptr, m);
  __atomic_sub_fetch(&filter[filter_of(p)], 1, __ATOMIC_RELAXED);
}

static bool key(uintptr_t p, uint32_t slot) {
  if (!rmmc__ptrmap_insert(&ex.by_ptr, (void *)p, (void *)(uintptr_t)slot, 0)) return false;
  __atomic_add_fetch(&filter[filter_of(p)], 1, __ATOMIC_RELAXED);
  return true;
}

static void revoke_slot(uint32_t slot) {
  entry_t *e = &ex.entries[slot];
  __atomic_store_n(&ex.words[HEADER_WORDS + slot], 0, __ATOMIC_RELEASE);
  unkey(e->base);
  if (e->user != e->base) unkey(e->user);
  e->gen = 0;
  ex.free_slots[ex.nfree++] = slot;
  __atomic_sub_fetch(&rmmc__exports_count, 1, __ATOMIC_RELAXED);
}

/* The live slot keyed by p, or 0. */
static uint32_t slot_of(uintptr_t p) {
  if (ex.pid == 0 || p == 0) return 0;
  rmmc__ptrmap_entry_t *m = rmmc__ptrmap_find(&ex.by_ptr, (void *)p);
  return m != NULL ? (uint32_t)(uintptr_t)m->value : 0;
}

static void fill_ref(uint32_t slot, rmmc__export_ref_t *ref) {
  memset(ref, 0, sizeof *ref); /* padding too: a ref may be written out whole */
  ref->pid = (uint32_t)ex.pid;
  ref->table_fd = (uint32_t)ex.fd;
  ref->table_id = ex.id;
  ref->slot = slot;
  ref->generation = ex.entries[slot].gen;
}

rmmc_status_t rmmc__exports_add(const void *base, const void *user, size_t bytes,
                                const rmmc_resource_t *owner, rmmc__export_ref_t *ref) {
  uintptr_t b = (uintptr_t)base, u = (uintptr_t)user;
  pthread_mutex_lock(&lock);
  rmmc_status_t st = make_table();
  if (st != RMMC_SUCCESS) goto out;
  uint32_t slot = slot_of(b);
  if (slot != 0) {
    entry_t *e = &ex.entries[slot];
    if (e->base == b && e->bytes == bytes && e->owner == owner) {
      /* The same block exported again: the same export. */
      if (u != e->base && e->user == e->base && slot_of(u) == 0 && key(u, slot)) e->user = u;
      fill_ref(slot, ref);
      goto out;
    }
    revoke_slot(slot); /* its block was freed where we could not see it */
  }
  uint32_t other = u != b ? slot_of(u) : 0;
  if (other != 0) revoke_slot(other); /* u lies in our live block: that block is gone */
  if (ex.nfree > 0) {
    slot = ex.free_slots[--ex.nfree];
  } else if (ex.next_unused < SLOTS && ensure_capacity(ex.next_unused)) {
    slot = ex.next_unused++;
  } else {
    st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY,
                        ex.next_unused < SLOTS
                            ? "ipc: no host memory for the export registry"
                            : "ipc: %u blocks are exported at once, the most one process can: "
                              "free or revoke some (rmmc_ipc_revoke)",
                        SLOTS - 1);
    goto out;
  }
  if (!key(b, slot) || (u != b && !key(u, slot))) {
    if (slot_of(b) == slot) unkey(b);
    ex.free_slots[ex.nfree++] = slot;
    st = rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "ipc: no host memory for the export registry");
    goto out;
  }
  ex.entries[slot] = (entry_t){b, u, bytes, owner, ++ex.next_gen};
  __atomic_store_n(&ex.words[HEADER_WORDS + slot], ex.entries[slot].gen, __ATOMIC_RELEASE);
  __atomic_add_fetch(&rmmc__exports_count, 1, __ATOMIC_RELAXED);
  fill_ref(slot, ref);
out:
  pthread_mutex_unlock(&lock);
  return st;
}

void rmmc__exports_on_free(const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  if (__atomic_load_n(&filter[filter_of(p)], __ATOMIC_RELAXED) == 0) return;
  pthread_mutex_lock(&lock);
  uint32_t slot = slot_of(p);
  if (slot != 0) revoke_slot(slot);
  pthread_mutex_unlock(&lock);
}

void rmmc__exports_forget_owner(const rmmc_resource_t *owner) {
  pthread_mutex_lock(&lock);
  for (uint32_t s = 1; ex.pid != 0 && s < ex.next_unused; s++)
    if (ex.entries[s].gen != 0 && ex.entries[s].owner == owner) revoke_slot(s);
  pthread_mutex_unlock(&lock);
}

rmmc_status_t rmmc__exports_revoke(const void *ptr) {
  pthread_mutex_lock(&lock);
  uint32_t slot = slot_of((uintptr_t)ptr);
  if (slot != 0) revoke_slot(slot);
  pthread_mutex_unlock(&lock);
  return slot != 0 ? RMMC_SUCCESS
                   : rmmc_set_error(RMMC_ERROR_UNKNOWN_POINTER,
                                    "ipc_revoke: %p is not a block (or the pointer of one) that "
                                    "this process has exported",
                                    ptr);
}

size_t rmmc__exports_live(void) {
  return (size_t)__atomic_load_n(&rmmc__exports_count, __ATOMIC_RELAXED);
}

void rmmc__exports_table(uint32_t *pid, uint32_t *fd, uint64_t *id) {
  pthread_mutex_lock(&lock);
  *pid = (uint32_t)ex.pid;
  *fd = ex.pid != 0 ? (uint32_t)ex.fd : 0;
  *id = ex.id;
  pthread_mutex_unlock(&lock);
}

/* ---- the importer's check ---- */

static rmmc_status_t stale_word(const rmmc__export_ref_t *ref, uint64_t now) {
  if (now == 0)
    return rmmc_set_error(RMMC_ERROR_STALE,
                          "ipc: stale handle: the exporter (pid %u) has freed the block or "
                          "revoked its export (slot %u, generation %llu)",
                          ref->pid, ref->slot, (unsigned long long)ref->generation);
  return rmmc_set_error(RMMC_ERROR_STALE,
                        "ipc: stale handle: the exporter (pid %u) freed that block and has "
                        "exported another in its place since (generation %llu, now %llu)",
                        ref->pid, (unsigned long long)ref->generation,
                        (unsigned long long)now);
}

static const char *file_type(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO or pipe" : S_ISSOCK(m) ? "a socket" : S_ISDIR(m) ? "a directory"
       : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISLNK(m) ? "a symbolic link" : "not a regular file";
}

static rmmc_status_t not_a_table(const rmmc__export_ref_t *ref, const char *what) {
  return rmmc_set_error(RMMC_ERROR_STALE,
                        "ipc: stale handle: descriptor %u of pid %u is %s, not an rmmc export "
                        "table (the exporter has exited and the pid is another process's, or "
                        "the handle is forged)",
                        ref->table_fd, ref->pid, what);
}

/* Opens the export table ref names, never blocking (no lock held):
 * RMMC_SUCCESS with *fd and *sb, or *fd = -1 when it cannot be read (no
 * permission: cannot tell); RMMC_ERROR_STALE when the process is gone or
 * the descriptor is not a sealed memfd of the table's size. */
static rmmc_status_t open_table(const rmmc__export_ref_t *ref, int *fd, struct stat *sb) {
  *fd = -1;
  char path[64];
  snprintf(path, sizeof path, "/proc/%u/fd/%u", ref->pid, ref->table_fd);
  struct stat before;
  if (stat(path, &before) != 0) {
    if (errno == EACCES || errno == EPERM) return RMMC_SUCCESS; /* cannot tell */
    return rmmc_set_error(RMMC_ERROR_STALE,
                          "ipc: stale handle: the exporter (pid %u) has exited (its export "
                          "table cannot be opened: %s)",
                          ref->pid, strerror(errno));
  }
  if (!S_ISREG(before.st_mode)) return not_a_table(ref, file_type(before.st_mode));
  int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0) {
    if (errno == EACCES || errno == EPERM) return RMMC_SUCCESS; /* cannot tell */
    return rmmc_set_error(RMMC_ERROR_STALE,
                          "ipc: stale handle: the exporter (pid %u) has exited (its export "
                          "table cannot be opened: %s)",
                          ref->pid, strerror(errno));
  }
  const char *bad = NULL;
  int seals = -1;
  if (fstat(f, sb) != 0 || !S_ISREG(sb->st_mode) || sb->st_dev != before.st_dev ||
      sb->st_ino != before.st_ino)
    bad = "a file that changed while it was opened";
  else if ((size_t)sb->st_size < TABLE_BYTES)
    bad = "a file too small";
  else if ((seals = fcntl(f, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK))
    bad = "a file that may shrink (not a sealed memfd)";
  if (bad != NULL) {
    close(f);
    return not_a_table(ref, bad);
  }
  *fd = f;
  return RMMC_SUCCESS;
}

/* The table in `fd` (open_table's), mapped read-only and cached (lock
 * held): *words, or NULL when it cannot be mapped (cannot tell);
 * RMMC_ERROR_STALE when it is not the table the handle names. */
static rmmc_status_t peer_words(const rmmc__export_ref_t *ref, int fd, const struct stat *sb,
                                const uint64_t **words) {
  *words = NULL;
  peer_t *hit = NULL, *victim = &ex.peers[0];
  for (int i = 0; i < PEERS; i++) {
    peer_t *q = &ex.peers[i];
    if (q->words != NULL && q->dev == sb->st_dev && q->ino == sb->st_ino) hit = q;
    if (q->words == NULL || q->used < victim->used) victim = q;
  }
  if (hit == NULL) {
    void *m = mmap(NULL, TABLE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return RMMC_SUCCESS; /* cannot tell */
    if (victim->words != NULL) munmap((void *)victim->words, TABLE_BYTES);
    hit = victim;
    *hit = (peer_t){ref->pid, ((const uint64_t *)m)[1], sb->st_dev, sb->st_ino, m, 0};
  }
  hit->used = ++ex.clock;
  if (__atomic_load_n(&hit->words[0], __ATOMIC_ACQUIRE) != TABLE_MAGIC ||
      hit->words[1] != ref->table_id)
    return rmmc_set_error(RMMC_ERROR_STALE,
                          "ipc: stale handle: the export table of pid %u is not the one the "
                          "handle names (the exporter has exited and the pid or descriptor is "
                          "another's)",
                          ref->pid);
  *words = hit->words;
  return RMMC_SUCCESS;
}

rmmc_status_t rmmc__exports_check(const rmmc__export_ref_t *ref, bool *verified) {
  *verified = false;
  if (ref->slot == 0 || ref->slot >= SLOTS || ref->generation == 0)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "ipc: the handle names export slot %u, generation %llu: not a slot "
                          "an export can hold",
                          ref->slot, (unsigned long long)ref->generation);
  pthread_mutex_lock(&lock);
  const uint64_t *words = NULL;
  rmmc_status_t st = RMMC_SUCCESS;
  int fd = -1;
  if (ex.pid != 0 && ref->pid == (uint32_t)ex.pid) {
    if (ref->table_id != ex.id)
      st = rmmc_set_error(RMMC_ERROR_STALE,
                          "ipc: stale handle: it names this process (pid %u) but another export "
                          "table (made by an exporter that has exited)",
                          ref->pid);
    words = ex.words;
  } else {
    /* Another process's descriptor: looked at without the lock. */
    pthread_mutex_unlock(&lock);
    struct stat sb;
    st = open_table(ref, &fd, &sb);
    pthread_mutex_lock(&lock);
    if (st == RMMC_SUCCESS && fd >= 0) st = peer_words(ref, fd, &sb, &words);
  }
  if (st == RMMC_SUCCESS && words != NULL) {
    uint64_t now = __atomic_load_n(&words[HEADER_WORDS + ref->slot], __ATOMIC_ACQUIRE);
    *verified = true;
    if (now != ref->generation) st = stale_word(ref, now);
  }
  pthread_mutex_unlock(&lock);
  if (fd >= 0) close(fd);
  return st;
}
