// SPDX-License-Identifier: Apache-2.0
// The glue between rmmc.rmm (Python) and RMM's Python package: C functions
// over include/rmmc/rmm.hpp, loaded with ctypes. rmmc.rmm compiles this
// file against the installed librmm's headers the first time it is used
// (as rmmc.torch compiles its backend against the installed torch) and
// caches the library per RMM version.
//
// RMM's Python resources (rmm.mr.DeviceMemoryResource, a Cython class) keep
// the C++ resource they stand for in one field, `c_ref`: an
// std::optional<cython_device_async_resource_ref>, right after the object
// header and the Cython method table (rmm/librmm/memory_resource.pxd and
// rmm/pylibrmm/memory_resource/_memory_resource.pxd, RMM 25.12 and later).
// rmmc.rmm makes a Python subclass of DeviceMemoryResource and writes that
// field through rmmc_rmm_bind(), so rmm.mr.set_current_device_resource()
// and every RMM adaptor take it like one of RMM's own; it reads the field of
// RMM's own objects through rmmc_rmm_upstream_create(). The field's size and
// alignment are checked against the class's __basicsize__ before any write
// (rmmc_rmm_field_layout), and every entry point catches what C++ throws.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "rmmc/rmm.hpp"

namespace {

// RMM's own wrapper (rmm/librmm/memory_resource.pxd), laid out the same.
struct cython_device_async_resource_ref {
  std::optional<rmm::device_async_resource_ref> ref;
};
using c_ref_field = std::optional<cython_device_async_resource_ref>;

thread_local std::string tl_error;

int fail(std::string what) {
  tl_error = std::move(what);
  return -1;
}

}  // namespace

// The library is built with hidden visibility (the RMM and CCCL code it
// instantiates stays its own); these are its interface.
#pragma GCC visibility push(default)
extern "C" {

// The last failure of these functions on this thread.
const char *rmmc_rmm_bridge_error(void) { return tl_error.c_str(); }

// RMM's version as compiled ("26.10.0").
const char *rmmc_rmm_bridge_rmm_version(void) {
  return RMM_VERSION;
}

// sizeof and alignof of DeviceMemoryResource.c_ref as this file sees it.
void rmmc_rmm_field_layout(size_t *size, size_t *align) {
  *size = sizeof(c_ref_field);
  *align = alignof(c_ref_field);
}

// A new rmmc::rmm_resource over `stack` (which it retains), or NULL.
void *rmmc_rmm_resource_new(rmmc_resource_t *stack) {
  try {
    return new rmmc::rmm_resource(stack);
  } catch (std::exception const &e) {
    fail(e.what());
    return nullptr;
  }
}

void rmmc_rmm_resource_delete(void *res) { delete static_cast<rmmc::rmm_resource *>(res); }

// Points the c_ref field at `field` (a constructed, empty or not, optional)
// at the rmm_resource `res`.
int rmmc_rmm_bind(void *field, void *res) {
  try {
    auto *f = static_cast<c_ref_field *>(field);
    *f = cython_device_async_resource_ref{
        rmm::device_async_resource_ref{*static_cast<rmmc::rmm_resource *>(res)}};
    return 0;
  } catch (std::exception const &e) {
    return fail(e.what());
  }
}

// Empties the c_ref field (before the rmm_resource it names goes).
void rmmc_rmm_unbind(void *field) { static_cast<c_ref_field *>(field)->reset(); }

// 1 when the c_ref field at `field` names a resource.
int rmmc_rmm_field_has_value(const void *field) {
  auto const *f = static_cast<const c_ref_field *>(field);
  return f->has_value() && (*f)->ref.has_value() ? 1 : 0;
}

// 1 when the c_ref field names the rmm_resource `res`.
int rmmc_rmm_field_is(const void *field, void *res) {
  if (!rmmc_rmm_field_has_value(field)) return 0;
  auto const *f = static_cast<const c_ref_field *>(field);
  rmm::device_async_resource_ref mine{*static_cast<rmmc::rmm_resource *>(res)};
  return *(*f)->ref == mine ? 1 : 0;
}

// An rmmc resource over the RMM resource whose c_ref field is at `field`
// (not owned: on_destroy(ctx) runs when the rmmc resource goes, so Python
// can let the RMM object go then). Returns an rmmc status.
int rmmc_rmm_upstream_create(const void *field, int kind, int device, void (*on_destroy)(void *),
                             void *ctx, rmmc_resource_t **out) {
  if (!rmmc_rmm_field_has_value(field))
    return rmmc_set_error(RMMC_ERROR_INVALID_ARGUMENT,
                          "rmmc.rmm: the RMM resource object holds no resource");
  try {
    auto const *f = static_cast<const c_ref_field *>(field);
    cuda::mr::any_resource<cuda::mr::device_accessible> any{*(*f)->ref};
    return rmmc::rmm_upstream_create(std::move(any), static_cast<rmmc_memory_kind_t>(kind), device,
                                     out, on_destroy, ctx);
  } catch (std::exception const &e) {
    return rmmc_set_error(RMMC_ERROR_INTERNAL, "rmmc.rmm: %s", e.what());
  }
}

// RMM's benchmark loop (rmm's random_allocations and
// multi_stream_allocations time one resource_ref): `pairs` allocate/free
// pairs of `bytes` on `stream` through the resource whose c_ref field is at
// `field`, or straight through the rmmc stack when field is NULL. Returns
// the nanoseconds per pair, or a negative number after a failure (its
// message in rmmc_rmm_bridge_error).
double rmmc_rmm_bench_pairs(const void *field, rmmc_resource_t *stack, size_t bytes, long pairs,
                            cudaStream_t stream) {
  using clock = std::chrono::steady_clock;
  try {
    if (field != nullptr) {
      if (!rmmc_rmm_field_has_value(field)) return fail("the RMM resource holds nothing"), -1.0;
      rmm::device_async_resource_ref ref = *(*static_cast<const c_ref_field *>(field))->ref;
      cuda::stream_ref s{stream};
      auto t0 = clock::now();
      for (long i = 0; i < pairs; i++) {
        void *p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
        ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      return std::chrono::duration<double, std::nano>(clock::now() - t0).count() /
             static_cast<double>(pairs);
    }
    auto t0 = clock::now();
    for (long i = 0; i < pairs; i++) {
      void *p = nullptr;
      if (rmmc_resource_allocate(stack, bytes, RMMC_DEFAULT_ALIGNMENT, stream, &p) != RMMC_SUCCESS)
        return fail(rmmc_last_error_message()), -1.0;
      rmmc_resource_deallocate(stack, p, bytes, RMMC_DEFAULT_ALIGNMENT, stream);
    }
    return std::chrono::duration<double, std::nano>(clock::now() - t0).count() /
           static_cast<double>(pairs);
  } catch (std::exception const &e) {
    return fail(e.what()), -1.0;
  }
}

}  // extern "C"
#pragma GCC visibility pop

#ifdef RMMC_RMM_BRIDGE_SELFTEST
// Built by scripts/rmm-bridge-check against rmmc's host stacks (no GPU, no
// librmm): both directions through RMM's own resource_ref and any_resource,
// RMM's exception types, and the c_ref field's layout.
#include "rmmc/spec.h"

static int failures = 0;
#define CHECK(c)                                                        \
  do {                                                                  \
    if (!(c)) {                                                         \
      std::fprintf(stderr, "selftest: %s:%d: %s\n", __FILE__, __LINE__, #c); \
      failures++;                                                       \
    }                                                                   \
  } while (0)

int main() {
  rmmc_resource_t *stack = nullptr;
  CHECK(rmmc_stack_create("statistics > pool(initial=1MiB) > host", -1, &stack) == RMMC_SUCCESS);
  if (stack == nullptr) return 1;
  // rmmc under RMM: through a device_async_resource_ref and an any_resource.
  {
    rmmc::rmm_resource mr{stack};
    CHECK(rmmc_resource_refcount(stack) == 2);
    rmm::device_async_resource_ref ref{mr};
    void *p = ref.allocate(cuda::stream_ref{cudaStream_t{}}, 1000, 256);
    CHECK(p != nullptr && reinterpret_cast<uintptr_t>(p) % 256 == 0);
    std::memset(p, 7, 1000);
    uint64_t live = 0;
    CHECK(rmmc_resource_get_field(stack, "in_use", &live) && live == 1000);
    ref.deallocate(cuda::stream_ref{cudaStream_t{}}, p, 1000, 256);
    CHECK(rmmc_resource_get_field(stack, "in_use", &live) && live == 0);
    cuda::mr::any_resource<cuda::mr::device_accessible> any{mr};
    CHECK(rmmc_resource_refcount(stack) == 3);  // the copy inside holds one
    bool threw = false;
    try {
      (void)any.allocate(cuda::stream_ref{cudaStream_t{}}, size_t{1} << 62, 256);
    } catch (rmm::out_of_memory const &e) {
      threw = std::strstr(e.what(), "rmmc: ") != nullptr;
    }
    CHECK(threw);
    // The field as RMM's Cython class holds it.
    c_ref_field field;
    CHECK(!rmmc_rmm_field_has_value(&field));
    CHECK(rmmc_rmm_bind(&field, &mr) == 0 && rmmc_rmm_field_has_value(&field));
    CHECK(rmmc_rmm_field_is(&field, &mr) == 1);
    CHECK(rmmc_rmm_bench_pairs(&field, nullptr, 4096, 1000, cudaStream_t{}) > 0);
    CHECK(rmmc_rmm_bench_pairs(nullptr, stack, 4096, 1000, cudaStream_t{}) > 0);
    // RMM's resource (here rmmc's, through RMM's types) under an rmmc pool.
    rmmc_resource_t *up = nullptr, *pool = nullptr;
    static int destroyed = 0;
    CHECK(rmmc_rmm_upstream_create(&field, RMMC_MEMORY_HOST, -1,
                                   [](void *ctx) { *static_cast<int *>(ctx) += 1; }, &destroyed,
                                   &up) == RMMC_SUCCESS);
    CHECK(std::strcmp(rmmc_resource_name(up), "rmm") == 0);
    CHECK(rmmc_stack_create_over("limiting(limit=64KiB) > pool(initial=0)", up, &pool) == RMMC_SUCCESS);
    void *q = nullptr;
    CHECK(rmmc_resource_allocate(pool, 4096, 256, nullptr, &q) == RMMC_SUCCESS && q != nullptr);
    CHECK(rmmc_resource_get_field(stack, "in_use", &live) && live >= 4096);
    rmmc_resource_deallocate(pool, q, 4096, 256, nullptr);
    // An RMM out-of-memory exception below comes up as rmmc's status.
    CHECK(rmmc_resource_allocate(up, size_t{1} << 62, 256, nullptr, &q) == RMMC_ERROR_OUT_OF_MEMORY);
    CHECK(std::strstr(rmmc_last_error_message(), "the RMM resource: ") != nullptr);
    CHECK(std::strstr(rmmc_last_error_message(), "rmmc: out of memory: pool resource") != nullptr);
    rmmc_resource_release(pool);
    rmmc_resource_release(up);
    CHECK(destroyed == 1);
    CHECK(rmmc_rmm_upstream_create(&field, 9, -1, nullptr, nullptr, &up) == RMMC_ERROR_INVALID_ARGUMENT);
    rmmc_rmm_unbind(&field);
    CHECK(!rmmc_rmm_field_has_value(&field));
    CHECK(rmmc_rmm_upstream_create(&field, RMMC_MEMORY_HOST, -1, nullptr, nullptr, &up) ==
          RMMC_ERROR_INVALID_ARGUMENT);
  }
  CHECK(rmmc_resource_refcount(stack) == 1);
  rmmc_resource_release(stack);
  size_t size = 0, align = 0;
  rmmc_rmm_field_layout(&size, &align);
  std::printf("rmm bridge selftest (RMM %s headers): %s; c_ref field %zu bytes, align %zu\n",
              rmmc_rmm_bridge_rmm_version(), failures ? "FAILED" : "ok", size, align);
  return failures ? 1 : 0;
}
#endif
