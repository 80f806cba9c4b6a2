/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Symbol visibility. rmmc is built with hidden visibility; only what a
 * public header marks RMMC_EXPORT is part of the library's interface.
 */
#ifndef RMMC_EXPORT_H
#define RMMC_EXPORT_H

#if defined(_WIN32)
#define RMMC_EXPORT
#elif defined(__GNUC__) || defined(__clang__)
#define RMMC_EXPORT __attribute__((visibility("default")))
#else
#define RMMC_EXPORT
#endif

#endif /* RMMC_EXPORT_H */
