/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small helpers the Check programs share (static inline: each program uses
 * what it needs). Assertions fail the calling test.
 */
#ifndef RMMC_TEST_UTIL_H
#define RMMC_TEST_UTIL_H

#include <check.h>
#include <stdint.h>
#include <string.h>

#include "faulty.h"
#include "rmmc/rmmc.h"
#include "spy.h"
#include "vmspy.h"

/* A figure the resource must report (describe), e.g. "reserved". */
static inline uint64_t field(rmmc_resource_t *r, const char *key) {
  uint64_t v = UINT64_MAX;
  ck_assert_msg(rmmc_resource_get_field(r, key, &v), "no field '%s'", key);
  return v;
}

/* A fresh host spy (tests/support/spy.h). */
static inline rmmc_resource_t *new_spy(void) {
  rmmc_resource_t *s;
  ck_assert_int_eq(spy_create(RMMC_MEMORY_HOST, &s), RMMC_SUCCESS);
  return s;
}

/* Releases r, then checks the spy under it got every byte back and saw no
 * bad free, and releases the spy. */
static inline void finish(rmmc_resource_t *r, rmmc_resource_t *spy) {
  rmmc_resource_release(r);
  spy_counts_t c = spy_counts(spy_of(spy));
  ck_assert_uint_eq(c.outstanding, 0);
  ck_assert_uint_eq(c.deallocate_errors, 0);
  rmmc_resource_release(spy);
}

/* A checked virtual-memory base: vmspy (pages of `page`) over faulty over a
 * fresh spy; *spy and *fy get the lower two (the caller's references). */
static inline rmmc_resource_t *new_vm_base(size_t page, rmmc_resource_t **spy,
                                           rmmc_resource_t **fy) {
  rmmc_resource_t *vm;
  *spy = new_spy();
  ck_assert_int_eq(faulty_create(*spy, fy), RMMC_SUCCESS);
  ck_assert_int_eq(vmspy_create(*fy, page, &vm), RMMC_SUCCESS);
  return vm;
}

/* Releases r, then checks that the vmspy under it saw no bad call, and
 * releases the base new_vm_base made, checking the spy (finish). */
static inline void finish_vm(rmmc_resource_t *r, rmmc_resource_t *vm, rmmc_resource_t *fy,
                             rmmc_resource_t *spy) {
  rmmc_resource_release(r);
  ck_assert_uint_eq(vmspy_counts(vm).errors, 0);
  rmmc_resource_release(vm);
  rmmc_resource_release(fy);
  finish(NULL, spy);
}

/* Building `spec` fails with `status` and a message containing `needle`,
 * and leaves nothing behind. */
static inline void expect_spec_error(const char *spec, rmmc_status_t status, const char *needle) {
  rmmc_resource_t *r = (rmmc_resource_t *)1;
  ck_assert_int_eq(rmmc_stack_create(spec, -1, &r), status);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(rmmc_last_error_message(), needle) != NULL, "'%s': '%s' lacks '%s'", spec,
                rmmc_last_error_message(), needle);
}

#endif
