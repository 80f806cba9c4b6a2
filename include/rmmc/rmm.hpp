/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc and RMM (RAPIDS Memory Manager) both ways, in C++17, header only.
 *
 * Needs RMM's headers (the librmm package: RMM 25.12 and later, whose
 * resources are CCCL `cuda::mr` resources) beside rmmc's; links only
 * against librmmc (nothing of librmm's is called here). Not part of the C
 * umbrella rmmc.h.
 *
 *   rmmc::rmm_resource        an RMM device memory resource over an rmmc
 *                             stack: `cuda::mr::resource_with<...,
 *                             cuda::mr::device_accessible>`, so an
 *                             rmm::device_async_resource_ref, RMM's
 *                             per-device registry and everything that
 *                             allocates through RMM (rmm::device_buffer,
 *                             cuDF, ...) can use an rmmc stack.
 *   rmmc::rmm_upstream_create an rmmc resource over any RMM resource, so
 *                             RMM's resources can sit under rmmc's layers.
 *
 *     rmmc_resource_t *stack;
 *     rmmc_stack_create("statistics > pool > cuda", -1, &stack);
 *     rmmc::rmm_resource mr{stack};            // takes its own reference
 *     rmmc_resource_release(stack);
 *     rmm::mr::set_current_device_resource(mr); // RMM allocates through rmmc
 *
 * Both directions are stream-ordered as both libraries define it (memory is
 * ready on the allocating stream; a freed block may be reused on the
 * freeing stream) and call no Python and take no lock of their own.
 * Failures: rmm_resource::allocate throws rmm::out_of_memory when rmmc says
 * RMMC_ERROR_OUT_OF_MEMORY and rmm::bad_alloc for any other failure, each
 * with rmmc's message (RMM's own resources throw the same types);
 * deallocate is noexcept, as RMM's is: a refused free leaves rmmc's message
 * on the thread (rmmc_last_error_message()). In the other direction RMM's
 * exceptions become statuses: rmm::out_of_memory (and std::bad_alloc)
 * RMMC_ERROR_OUT_OF_MEMORY, rmm::bad_alloc RMMC_ERROR_CUDA, a logic or
 * argument error RMMC_ERROR_INVALID_ARGUMENT, anything else
 * RMMC_ERROR_INTERNAL, each with the exception's what().
 */
#ifndef RMMC_RMM_HPP
#define RMMC_RMM_HPP

#include <cstddef>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda/memory_resource>
#include <cuda/stream_ref>
#include <cuda_runtime_api.h>
#include <rmm/aligned.hpp>
#include <rmm/error.hpp>
#include <rmm/resource_ref.hpp>

#include "rmmc/resource.h"
#include "rmmc/resource_ops.h"
#include "rmmc/status.h"

namespace rmmc {

/* An RMM resource over an rmmc stack. Holds one reference to the stack
 * (copies hold one each; equal when they hold the same stack or equal
 * stacks, rmmc_resource_is_equal). Thread-safe as the stack is. */
class rmm_resource {
 public:
  /* Takes its own reference to `stack` (which must not be NULL: throws
   * rmm::logic_error). */
  explicit rmm_resource(rmmc_resource_t *stack) : stack_(stack) {
    if (stack_ == nullptr) throw rmm::logic_error("rmmc::rmm_resource: NULL stack");
    rmmc_resource_retain(stack_);
  }
  rmm_resource(rmm_resource const &o) noexcept : stack_(rmmc_resource_retain(o.stack_)) {}
  rmm_resource(rmm_resource &&o) noexcept : stack_(std::exchange(o.stack_, nullptr)) {}
  rmm_resource &operator=(rmm_resource o) noexcept {
    std::swap(stack_, o.stack_);
    return *this;
  }
  ~rmm_resource() { rmmc_resource_release(stack_); }

  /* `bytes` ready for use on `stream` (rmmc_resource_allocate). */
  void *allocate(cuda::stream_ref stream, std::size_t bytes,
                 std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) {
    void *p = nullptr;
    rmmc_status_t st = rmmc_resource_allocate(stack_, bytes, alignment, stream.get(), &p);
    if (st != RMMC_SUCCESS) throw_for(st);
    return p;
  }

  /* Gives the block back, reusable on `stream` at once. */
  void deallocate(cuda::stream_ref stream, void *ptr, std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept {
    (void)rmmc_resource_deallocate(stack_, ptr, bytes, alignment, stream.get());
  }

  /* On the legacy default stream, waited for when the memory is device
   * accessible: usable on any stream at once. */
  void *allocate_sync(std::size_t bytes, std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) {
    void *p = allocate(cuda::stream_ref{cudaStream_t{}}, bytes, alignment);
    cudaError_t err = p != nullptr && device_accessible() ? cudaStreamSynchronize(cudaStream_t{})
                                                          : cudaSuccess;
    if (err != cudaSuccess) {
      (void)cudaGetLastError(); /* not sticky: leave no error behind */
      deallocate(cuda::stream_ref{cudaStream_t{}}, p, bytes, alignment);
      throw rmm::bad_alloc(std::string("rmmc: allocate_sync: ") + cudaGetErrorString(err));
    }
    return p;
  }

  /* Waits for the device (the block may be in use on any stream), then
   * frees on the legacy default stream. */
  void deallocate_sync(void *ptr, std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept {
    if (ptr != nullptr && device_accessible()) (void)cudaDeviceSynchronize();
    deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, bytes, alignment);
  }

  bool operator==(rmm_resource const &o) const noexcept {
    return rmmc_resource_is_equal(stack_, o.stack_);
  }
  bool operator!=(rmm_resource const &o) const noexcept { return !(*this == o); }

  friend void get_property(rmm_resource const &, cuda::mr::device_accessible) noexcept {}

  /* The stack (borrowed: valid while this object lives). */
  rmmc_resource_t *stack() const noexcept { return stack_; }

 private:
  bool device_accessible() const noexcept {
    return rmmc_memory_kind_is_device_accessible(rmmc_resource_memory_kind(stack_));
  }

  [[noreturn]] static void throw_for(rmmc_status_t st) {
    std::string what = std::string("rmmc: ") + rmmc_last_error_message();
    if (st == RMMC_ERROR_OUT_OF_MEMORY) throw rmm::out_of_memory(what);
    throw rmm::bad_alloc(what);
  }

  rmmc_resource_t *stack_;
};

static_assert(cuda::mr::resource_with<rmm_resource, cuda::mr::device_accessible>,
              "rmmc::rmm_resource is not a cuda::mr resource");

namespace detail {

/* What an rmmc resource over an RMM resource holds: the RMM resource
 * (type-erased; a resource_ref inside it stays non-owning) and what to call
 * when the rmmc resource goes (the owner of a referenced resource drops it). */
struct rmm_upstream_state {
  cuda::mr::any_resource<cuda::mr::device_accessible> res;
  void (*on_destroy)(void *ctx);
  void *ctx;
  ~rmm_upstream_state() {
    if (on_destroy != nullptr) on_destroy(ctx);
  }
};

struct rmm_upstream {
  rmmc_resource_t base; /* first member (resource_ops.h) */
  rmm_upstream_state *state;
};

inline rmm_upstream_state &state_of(rmmc_resource_t *r) {
  return *reinterpret_cast<rmm_upstream *>(r)->state;
}

inline rmmc_status_t rmm_upstream_allocate(rmmc_resource_t *r, size_t bytes, size_t alignment,
                                           cudaStream_t stream, void **out) {
  try {
    *out = state_of(r).res.allocate(cuda::stream_ref{stream}, bytes, alignment);
    return RMMC_SUCCESS;
  } catch (rmm::out_of_memory const &e) {
    return rmmc_set_oom_error(r, bytes, stream, "the RMM resource: %s", e.what());
  } catch (rmm::bad_alloc const &e) {
    return rmmc_set_error(RMMC_ERROR_CUDA, "rmm: allocating %zu bytes: %s", bytes, e.what());
  } catch (std::bad_alloc const &e) {
    return rmmc_set_oom_error(r, bytes, stream, "the RMM resource: %s", e.what());
  } catch (std::logic_error const &e) {
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "rmm: allocating %zu bytes: %s", bytes,
                          e.what());
  } catch (std::exception const &e) {
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "rmm: allocating %zu bytes: %s", bytes, e.what());
  } catch (...) {
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "rmm: allocating %zu bytes: a non-standard "
                          "exception", bytes);
  }
}

inline rmmc_status_t rmm_upstream_deallocate(rmmc_resource_t *r, void *ptr, size_t bytes,
                                             size_t alignment, cudaStream_t stream) {
  state_of(r).res.deallocate(cuda::stream_ref{stream}, ptr, bytes, alignment); /* noexcept */
  return RMMC_SUCCESS;
}

inline bool rmm_upstream_is_equal(const rmmc_resource_t *a, const rmmc_resource_t *b) {
  auto *x = reinterpret_cast<const rmm_upstream *>(a);
  auto *y = reinterpret_cast<const rmm_upstream *>(b);
  return x->state->res == y->state->res;
}

inline void rmm_upstream_destroy(rmmc_resource_t *r) {
  auto *u = reinterpret_cast<rmm_upstream *>(r);
  delete u->state;
  delete u;
}

/* Version 1 slots only: RMM's resources have no virtual memory, peers or
 * hooks for rmmc to drive; a pool over this one takes chunks. */
inline const rmmc_resource_ops_t *rmm_upstream_ops() {
  static const rmmc_resource_ops_t ops = [] {
    rmmc_resource_ops_t o{};
    o.version = RMMC_RESOURCE_OPS_VERSION;
    o.name = "rmm";
    o.allocate = rmm_upstream_allocate;
    o.deallocate = rmm_upstream_deallocate;
    o.is_equal = rmm_upstream_is_equal;
    o.destroy = rmm_upstream_destroy;
    return o;
  }();
  return &ops;
}

}  // namespace detail

/* An rmmc resource (one reference, in *out) over the RMM resource
 * `upstream`: an any_resource holds a resource by value, or a
 * device_async_resource_ref without owning it (then the referenced resource
 * must outlive the rmmc resource; `on_destroy(ctx)`, if given, is called
 * when the rmmc resource is destroyed, so its owner can let it go). `kind`
 * and `device` say what memory it hands out (RMMC_MEMORY_DEVICE and the
 * device the RMM resource was made on, for RMM's device resources).
 * Returns RMMC_SUCCESS, RMMC_ERROR_INVALID_ARGUMENT for a NULL out or a
 * kind that is not one, RMMC_ERROR_OUT_OF_MEMORY when the host has no
 * memory for the wrapper. */
inline rmmc_status_t rmm_upstream_create(cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
                                         rmmc_memory_kind_t kind, int device, rmmc_resource_t **out,
                                         void (*on_destroy)(void *ctx) = nullptr,
                                         void *ctx = nullptr) noexcept {
  if (out == nullptr) return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "rmm_upstream_create: NULL out");
  if (kind < RMMC_MEMORY_DEVICE || kind > RMMC_MEMORY_MANAGED)
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT, "rmm_upstream_create: %d is not a memory kind",
                          static_cast<int>(kind));
  auto *u = new (std::nothrow) detail::rmm_upstream;
  detail::rmm_upstream_state *s = nullptr;
  if (u != nullptr) {
    try {
      s = new detail::rmm_upstream_state{std::move(upstream), on_destroy, ctx};
    } catch (...) {
      s = nullptr;
    }
  }
  if (s == nullptr) {
    delete u;
    return rmmc_set_error(RMMC_ERROR_OUT_OF_MEMORY, "rmm_upstream_create: no host memory");
  }
  u->state = s;
  rmmc_resource_init(&u->base, detail::rmm_upstream_ops(), kind, device);
  *out = &u->base;
  return RMMC_SUCCESS;
}

}  // namespace rmmc

#endif /* RMMC_RMM_HPP */
