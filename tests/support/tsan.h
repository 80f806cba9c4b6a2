/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RMMC_TEST_TSAN: 1 in a ThreadSanitizer build (scripts/test's TSan pass),
 * where every memory access costs tens of times more. Tests scale their
 * single-threaded bulk down there (the ASan, valgrind and normal builds run
 * it in full) and leave out what races on purpose.
 */
#ifndef RMMC_TEST_TSAN_H
#define RMMC_TEST_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define RMMC_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RMMC_TEST_TSAN 1
#endif
#endif
#ifndef RMMC_TEST_TSAN
#define RMMC_TEST_TSAN 0
#endif

#endif
