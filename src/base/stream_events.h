/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream identities and their events, for resources that reuse memory in
 * stream order (fixed_size, binning's bins; any pool, the arena among them).
 *
 * A stream set maps stream handles to slots, one per stream the resource
 * has seen. Two handles name the same slot exactly when they are the same
 * stream: NULL and cudaStreamLegacy share one slot, and
 * cudaStreamPerThread gets one slot per calling thread (it is a different
 * stream in every thread). Slots live until the set is finalized, so a
 * slot pointer may be kept as a tag on free memory.
 *
 * For device-accessible memory each slot owns a CUDA event (created with
 * the slot, destroyed with the set). The owner records it on the slot's
 * stream while it is in a call on that stream (so the handle is alive) and
 * another stream waits on it before reusing memory freed there: the event
 * outlives the stream, so a stream destroyed after freeing never has to be
 * named again. The one hazard left is CUDA handing a destroyed stream's
 * handle to a new stream: the new stream then counts as the old one, as in
 * RMM.
 *
 * For host memory (RMMC_MEMORY_HOST) streams are opaque keys and no CUDA
 * call is ever made: record, wait and sync succeed at once. They are still
 * counted, so CPU tests observe the same policy a GPU run follows.
 *
 * Epochs. Each record of a slot's event closes an epoch: a free made on the
 * stream before a record is covered by it. rmmc__stream_slot_tag() gives a
 * free the epoch of the next record to start, so "tag <= epoch_recorded"
 * means an event record issued after the free covers it (another stream
 * may wait on the event), and "tag <= epoch_done" that the work queued
 * before the free has finished (any stream may reuse the memory, and it
 * may go back to the driver). epoch_done advances when a query of the
 * event finds it complete, at a device synchronization, and at once for
 * host memory (covering costs nothing there, so host-memory resources
 * follow the device policy with every record completing immediately).
 *
 * A busy GPU finishes records late. For host memory the environment
 * variable RMMC_HOST_EVENT_LAG=N (read when a set is made; default 0) lets
 * a record finish only N records later on its stream, or at a device
 * synchronization, so that a replay over sim meets the stale knowledge a
 * GPU run does (FSDP2's logs: lag 0 reserves 4,396 MiB, lag 4 4,494 MiB,
 * which is what the H100s measured: docs/design.md, "Growth and giving back"). A tool for
 * studying the pool's policy on the host; it changes nothing else.
 *
 * Graph capture. Nothing here is ever issued on a stream that is being
 * captured: record and wait check the stream first and decline; a query
 * (which CUDA forbids while any thread captures in global mode) runs under
 * a relaxed capture-mode guard, as PyTorch does for cudaMalloc, so it
 * neither fails nor invalidates another thread's capture; and the device
 * is not synchronized while a capture rmmc knows of is underway
 * (rmmc__captures_underway: graph pools routed by capture).
 *
 * Locking: get() takes the set's own lock (innermost: it calls nothing
 * that locks). record/wait/sync take no lock. count/at read the slot array
 * and need the owner to exclude concurrent get() calls (fixed_size calls
 * everything under its own lock).
 */
#ifndef RMMC_STREAM_EVENTS_H
#define RMMC_STREAM_EVENTS_H

#include "base/internal.h"
#include "base/ptrmap.h"

/* Checkpoints ("marks") a slot keeps when its set asks for them
 * (rmmc__stream_set_marks): besides the event every record moves, every
 * 2^mark_shift-th record also records one of RMMC__SLOT_MARKS events in turn,
 * so that the host can wait for an earlier point of a busy stream than its
 * last record (rmmc__stream_slot_finish_mark). */
#define RMMC__SLOT_MARKS 8u

typedef struct rmmc__stream_slot {
  cudaStream_t stream; /* the handle (per-thread streams: cudaStreamPerThread) */
  cudaEvent_t event;   /* device kinds only; NULL for host memory */
  cudaEvent_t marks[RMMC__SLOT_MARKS]; /* atomic; device kinds, made on first use */
  uint64_t mark_epoch[RMMC__SLOT_MARKS]; /* atomic: the epoch each mark closed; 0: none */
  uint32_t id;         /* order of first use: 0, 1, 2, ... (for messages) */
  bool recorded;       /* atomic: the event was recorded at least once */
  /* Epochs (atomic; see "Epochs" above): records started, the highest
   * epoch whose record was issued, the highest known complete. */
  uint64_t epoch_next, epoch_recorded, epoch_done;
  int want; /* atomic: another stream waits for this one's frees to be covered */
} rmmc__stream_slot_t;

typedef struct rmmc__stream_set {
  pthread_mutex_t lock;
  bool host;        /* no CUDA at all */
  uint64_t host_lag; /* host: how many records late records finish (RMMC_HOST_EVENT_LAG) */
  uint32_t mark_shift; /* 0: no marks; else a mark every 2^mark_shift-th record */
  int device;       /* the device whose events these are */
  size_t user_size; /* zeroed owner bytes after each slot (rmmc__stream_slot_user) */
  rmmc__ptrmap_t map;
  rmmc__stream_slot_t **slots;
  uint32_t nslots, cap;
  /* relaxed counters, for describe */
  uint64_t records, waits, syncs, stream_syncs, queries, finishes;
} rmmc__stream_set_t;

/* Owner data starts at this alignment after the slot. */
#define RMMC__SLOT_USER_OFFSET                                                 \
  ((sizeof(rmmc__stream_slot_t) + 15) & ~(size_t)15)

/* Prepares a set for memory of r's kind and device (r: the resource
 * itself or its upstream). Allocates nothing. */
void rmmc__stream_set_init(rmmc__stream_set_t *s, const rmmc_resource_t *r, size_t user_size);

/* Asks every slot made from now on to keep marks, one per 2^shift records
 * (shift >= 1; call before the first get()). Marks cost one more event
 * record per 2^shift, and a slot makes its mark events as it first needs
 * them (at most RMMC__SLOT_MARKS; none for a stream of fewer records). */
void rmmc__stream_set_marks(rmmc__stream_set_t *s, uint32_t shift);

/* Destroys every slot and its event. */
void rmmc__stream_set_fini(rmmc__stream_set_t *s);

/* The slot of `stream`, created on first use (with its event for device
 * memory). Thread-safe. RMMC_ERROR_OUT_OF_MEMORY without host memory;
 * RMMC_ERROR_CUDA if the event cannot be created. */
rmmc_status_t rmmc__stream_set_get(rmmc__stream_set_t *s, cudaStream_t stream,
                                   rmmc__stream_slot_t **out);

/* The identity get() keys a handle by: compare it to find a slot without
 * the lookup (a per-owner cache). Never NULL. */
const void *rmmc__stream_key(cudaStream_t stream);
/* The same, inline for the handles that need no thread-local lookup. */
static inline const void *rmmc__stream_key_fast(cudaStream_t stream) {
  if (stream == NULL || stream == cudaStreamLegacy) return (const void *)(uintptr_t)1;
  if (stream == cudaStreamPerThread) return rmmc__stream_key(stream);
  return (const void *)stream;
}

/* The owner bytes of a slot. */
static inline void *rmmc__stream_slot_user(rmmc__stream_slot_t *slot) {
  return (char *)slot + RMMC__SLOT_USER_OFFSET;
}

/* Number of slots and the i-th (see Locking above). */
static inline uint32_t rmmc__stream_set_count(const rmmc__stream_set_t *s) {
  return __atomic_load_n(&s->nslots, __ATOMIC_ACQUIRE);
}
static inline rmmc__stream_slot_t *rmmc__stream_set_at(const rmmc__stream_set_t *s, uint32_t i) {
  return s->slots[i];
}

/* Records slot's event on `stream`, which must be the slot's stream and
 * alive (the caller is inside a call made on it). Afterwards the event
 * covers all work enqueued on the stream so far. */
rmmc_status_t rmmc__stream_slot_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                       cudaStream_t stream);

/* As rmmc__stream_slot_record, for callers that go on without the event
 * when recording fails: returns whether it was recorded and leaves this
 * thread's error state as it was. */
bool rmmc__stream_slot_try_record(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot,
                                  cudaStream_t stream);

/* Makes `consumer` (alive) wait for the last record of producer's event,
 * which must have been recorded (a never-recorded event would not wait). */
rmmc_status_t rmmc__stream_slot_wait(rmmc__stream_set_t *s, const rmmc__stream_slot_t *producer,
                                     cudaStream_t consumer);

static inline bool rmmc__stream_slot_recorded(const rmmc__stream_slot_t *slot) {
  return __atomic_load_n(&slot->recorded, __ATOMIC_ACQUIRE);
}

/* Waits for all work on the set's device (cudaDeviceSynchronize): after
 * it, memory freed on any stream may be reused on any stream, and every
 * slot's epoch_done covers every free made before the call. The heavy
 * fallback, for out-of-memory paths and releasing memory upstream; refused
 * (RMMC_ERROR_NOT_SUPPORTED) while a known graph capture is underway. */
rmmc_status_t rmmc__stream_set_sync(rmmc__stream_set_t *s);

/* Waits for the work enqueued so far on `stream` (alive), e.g. after
 * allocating on it memory that every stream will share. */
rmmc_status_t rmmc__stream_set_sync_stream(rmmc__stream_set_t *s, cudaStream_t stream);

/* ---- epochs ---- */

/* The epoch a free made now on slot's stream waits for. */
static inline uint64_t rmmc__stream_slot_tag(const rmmc__stream_slot_t *slot) {
  return __atomic_load_n(&slot->epoch_next, __ATOMIC_ACQUIRE) + 1;
}
/* Is a free tagged `tag` covered by a recorded event (others may wait)? */
static inline bool rmmc__stream_slot_covered(const rmmc__stream_slot_t *slot, uint64_t tag) {
  return __atomic_load_n(&slot->epoch_recorded, __ATOMIC_ACQUIRE) >= tag;
}
/* Is the work before a free tagged `tag` known to be finished? No call. */
static inline bool rmmc__stream_slot_known_done(const rmmc__stream_slot_t *slot, uint64_t tag) {
  return __atomic_load_n(&slot->epoch_done, __ATOMIC_ACQUIRE) >= tag;
}
/* Is all the work before slot's last record known finished? No call. */
static inline bool rmmc__stream_slot_known_idle(const rmmc__stream_slot_t *slot) {
  uint64_t rec = __atomic_load_n(&slot->epoch_recorded, __ATOMIC_ACQUIRE);
  return rmmc__stream_slot_known_done(slot, rec);
}
/* As known_done, asking CUDA (one cuEventQuery, under a relaxed capture
 * mode) when the tag is covered but not yet known finished. Never fails: an
 * error reads as not finished. */
bool rmmc__stream_slot_done(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot, uint64_t tag);
/* Blocks the host until the work before slot's oldest mark not yet known
 * finished has finished (the nearest point of the stream's work, so the
 * shortest wait), or before its last record when no such mark is left
 * (cudaEventSynchronize under a relaxed capture mode); every free that
 * point covers is then known finished. Called again, it goes one mark
 * further each time. Returns whether anything recorded was not yet known
 * finished and now is: false once everything recorded is known finished,
 * and while a known graph capture is underway. Counted as event_syncs. */
bool rmmc__stream_slot_finish_mark(rmmc__stream_set_t *s, rmmc__stream_slot_t *slot);

/* ---- graph capture ---- */

/* Captures that rmmc knows to be underway in this process (graph pools
 * routed by the capture a thread begins). */
extern int rmmc__captures_underway;
/* Is `stream` being captured? (cuStreamIsCapturing, 26-31 ns at any
 * thread count on the H100; the runtime's cudaStreamGetCaptureInfo without
 * the driver table or without a current context.) An error reads as true,
 * the safe answer. */
bool rmmc__stream_is_capturing(cudaStream_t stream);
/* Switches the calling thread to the relaxed capture mode, so a call that
 * would be unsafe during another thread's global-mode capture (a query, a
 * driver allocation) neither fails nor invalidates that capture. */
int rmmc__capture_relax(void);
void rmmc__capture_restore(int mode);

/* The set's counters as figures, once, in the order describe reports them
 * (after "streams", the number of streams): X(key, counter), the counter a
 * member of rmmc__stream_set_t. A figures struct with rows of the same keys
 * (the pool's STRUCT rows) reads each through rmmc__stream_set_<key>. */
#define RMMC__STREAM_SET_FIGURES(X) \
  X(event_records, records)         \
  X(event_waits, waits)             \
  X(device_syncs, syncs)            \
  X(stream_syncs, stream_syncs)     \
  X(event_queries, queries)         \
  X(event_syncs, finishes)

#define RMMC__STREAM_SET_READER(key, counter)                                  \
  static inline uint64_t rmmc__stream_set_##key(const rmmc__stream_set_t *s) { \
    return rmmc__atomic_load_u64(&s->counter);                                 \
  }
RMMC__STREAM_SET_FIGURES(RMMC__STREAM_SET_READER)
#undef RMMC__STREAM_SET_READER

/* Emits streams, then the figures of RMMC__STREAM_SET_FIGURES. */
void rmmc__stream_set_describe(rmmc__stream_set_t *s, rmmc_field_cb emit, void *ctx);

#endif /* RMMC_STREAM_EVENTS_H */
