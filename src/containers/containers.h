/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal helpers shared by the container files (never installed).
 */
#ifndef RMMC_CONTAINERS_INTERNAL_H
#define RMMC_CONTAINERS_INTERNAL_H

#include "base/internal.h"

/* As rmmc_stream_wait(), for a `waited_on` stream of device
 * `waited_device` (-1: the current device) that may differ from the
 * current device, which `waiter` belongs to: the event is made and
 * recorded with waited_device current, and waited for with the caller's
 * device current (CUDA lets a stream wait for another device's event). */
rmmc_status_t rmmc__stream_wait_from(cudaStream_t waiter, cudaStream_t waited_on,
                                     int waited_device);

#endif /* RMMC_CONTAINERS_INTERNAL_H */
