/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory status report: a stack's figures, layer by layer, in the
 * spirit of CUDA.jl's memory_status() and PyTorch's memory_summary().
 *
 * For each layer, outermost first, the report prints its name, the kind of
 * memory and the device, then each figure the layer reports about itself
 * through rmmc_resource_describe() (limits, in use, peak, reserved, largest
 * free block, outstanding allocations: whatever it emits), one per line;
 * sizes human-readable ("1.50 GiB"), counts plain. A layer with no figures
 * (a user's resource with no describe slot) says "(no figures)". It never
 * allocates from the resources it reports on. Example:
 *
 *   rmmc memory status: device 0
 *     device memory: 1.25 GiB used, 78.00 GiB free, 79.25 GiB total
 *     stack (outermost first):
 *       1. aligned [device memory, device 0]
 *            alignment      4.00 KiB
 *            outstanding    2
 *       2. cuda [device memory, device 0]
 *            (no figures)
 *
 * On a machine without a GPU the device line reads "device memory: no CUDA
 * device". The text is for people and may change between versions; read
 * figures programmatically with rmmc_resource_get_field().
 *
 * The reports read each layer through rmmc_resource_describe() and are as
 * thread-safe as the layers' describe slots (every built-in one is).
 * Statuses: RMMC_SUCCESS; RMMC_ERROR_INVALID_ARGUMENT for NULL arguments
 * or a bad device id; RMMC_ERROR_OUT_OF_MEMORY if host memory for the text
 * runs out; RMMC_ERROR_IO if writing to the FILE fails.
 */
#ifndef RMMC_REPORT_H
#define RMMC_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rmmc/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes `bytes` human-readably into buf ("256 B", "1.50 KiB", "10.60 GiB":
 * binary units, two decimals above 1 KiB) and returns buf. Always
 * terminates buf when len > 0. Thread-safe. */
RMMC_EXPORT const char *rmmc_format_bytes(uint64_t bytes, char *buf, size_t len);

/* Prints device `device`'s (-1: the current device's) memory: the free
 * and total memory of the device, then the whole stack of its current
 * resource from the registry (registry.h). Getting that resource builds the
 * device's default on first use, as any rmmc_get_device_resource() does; if
 * there is none (no GPU and none set) or it cannot be built, the report
 * says why in its text and still succeeds. */
RMMC_EXPORT rmmc_status_t rmmc_memory_status(int device, FILE *out);

/* Prints the stack whose outermost layer is `r` (borrowed), any resource
 * including users' own, and the free and total memory of its device if it
 * belongs to one. */
RMMC_EXPORT rmmc_status_t rmmc_resource_print_status(rmmc_resource_t *r, FILE *out);

/* The same texts written into buf (for bindings): at most len - 1
 * characters and a terminating NUL (nothing if len is 0; buf may then be
 * NULL). The whole text's length, without the NUL, goes to *needed when
 * needed is not NULL, so a caller whose buffer was short allocates
 * *needed + 1 bytes and calls again. Truncation is not an error. */
RMMC_EXPORT rmmc_status_t rmmc_memory_status_string(int device, char *buf, size_t len,
                                                    size_t *needed);
RMMC_EXPORT rmmc_status_t rmmc_resource_status_string(rmmc_resource_t *r, char *buf, size_t len,
                                                      size_t *needed);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_REPORT_H */
