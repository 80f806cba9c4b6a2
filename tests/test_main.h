/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The main() every Check test program shares: runs the suite the program
 * builds, in fork mode for host-only programs and without fork for GPU
 * programs (fork mode breaks CUDA), and exits 77 (skipped) when a GPU
 * program finds no device.
 */
#ifndef RMMC_TEST_MAIN_H
#define RMMC_TEST_MAIN_H

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "rmmc/registry.h"
#include "tsan.h"

static inline int rmmc_test_run(Suite *s, bool needs_gpu) {
  if (needs_gpu && rmmc_device_count() == 0) {
    fprintf(stderr, "no CUDA device: skipping this GPU test program\n");
    SRunner *unused = srunner_create(s);
    srunner_free(unused);
    return 77;
  }
  SRunner *sr = srunner_create(s);
  if (needs_gpu) srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
