/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A host-only program, linked statically against librmmc.a by the layering
 * check (tests/test_layers.py, docs/design.md "Layers"): it builds
 * `statistics > pool > host` by hand, allocates, frees and reads the figures
 * and a status. What the linker pulls out of the archive for it is the
 * measure of the library's layering: a resource, an adaptor and the status
 * functions must not drag in the spec parser, the registry or every other
 * resource. Exit status 0 when the figures are right.
 */
#include <stdio.h>

#include "rmmc/host_resource.h"
#include "rmmc/pool_resource.h"
#include "rmmc/statistics_adaptor.h"
#include "rmmc/status.h"

int main(void) {
  rmmc_resource_t *host = NULL, *pool = NULL, *stats = NULL;
  void *p = NULL;
  int rc = 1;
  rmmc_statistics_t s = RMMC_STATISTICS_INIT;
  rmmc_status_t st = rmmc_host_resource_create(&host);
  if (st == RMMC_SUCCESS) st = rmmc_pool_resource_create(host, NULL, &pool);
  if (st == RMMC_SUCCESS) st = rmmc_statistics_adaptor_create(pool, &stats);
  if (st == RMMC_SUCCESS) st = rmmc_resource_allocate(stats, 1000, 256, NULL, &p);
  if (st == RMMC_SUCCESS) st = rmmc_statistics_adaptor_get(stats, &s);
  if (st != RMMC_SUCCESS) {
    fprintf(stderr, "%s: %s\n", rmmc_status_name(st), rmmc_last_error_message());
    goto release;
  }
  if (p == NULL || s.current_bytes != 1000 || s.current_count != 1) {
    fprintf(stderr, "after one allocation: %p, %lld bytes in %lld allocations\n", p,
            (long long)s.current_bytes, (long long)s.current_count);
    goto release;
  }
  st = rmmc_resource_deallocate(stats, p, 1000, 256, NULL);
  if (st == RMMC_SUCCESS) st = rmmc_statistics_adaptor_get(stats, &s);
  if (st != RMMC_SUCCESS || s.current_bytes != 0 || s.deallocations != 1) {
    fprintf(stderr, "after the free: %s, %lld bytes\n", rmmc_status_name(st),
            (long long)s.current_bytes);
    goto release;
  }
  /* A failure's status and message: 0 bytes with a NULL out-pointer. */
  st = rmmc_resource_allocate(stats, 0, 256, NULL, NULL);
  if (st != RMMC_ERROR_INVALID_ARGUMENT || rmmc_last_error_message()[0] == '\0') {
    fprintf(stderr, "a NULL out-pointer gave %s\n", rmmc_status_name(st));
    goto release;
  }
  rc = 0;
release:
  rmmc_resource_release(stats);
  rmmc_resource_release(pool);
  rmmc_resource_release(host);
  return rc;
}
