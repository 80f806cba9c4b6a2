/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rmmc: composable GPU memory resources for C.
 *
 * The umbrella header: includes every public header. See resource.h for
 * the interface every resource shares, registry.h for the per-device
 * registry, and one header per resource and adaptor.
 */
#ifndef RMMC_RMMC_H
#define RMMC_RMMC_H

#include "rmmc/version.h"
#include "rmmc/status.h"
#include "rmmc/resource.h"
#include "rmmc/resource_ops.h"
#include "rmmc/registry.h"
#include "rmmc/spec.h"
#include "rmmc/host_resource.h"
#include "rmmc/cuda_resource.h"
#include "rmmc/managed_resource.h"
#include "rmmc/pinned_resource.h"
#include "rmmc/cuda_async_resource.h"
#include "rmmc/buffer.h"
#include "rmmc/vector.h"
#include "rmmc/scalar.h"
#include "rmmc/stream.h"
#include "rmmc/defaults.h"
#include "rmmc/plugins.h"
#include "rmmc/sim_resource.h"
#include "rmmc/failure_callback_adaptor.h"
#include "rmmc/aligned_adaptor.h"
#include "rmmc/thread_safe_adaptor.h"
#include "rmmc/prefetch_adaptor.h"
#include "rmmc/report.h"
#include "rmmc/limiting_adaptor.h"
#include "rmmc/statistics_adaptor.h"
#include "rmmc/tracking_adaptor.h"
#include "rmmc/logging_adaptor.h"
#include "rmmc/pool_resource.h"
#include "rmmc/fixed_size_resource.h"
#include "rmmc/binning_resource.h"
#include "rmmc/arena_resource.h"
#include "rmmc/ipc.h"

#endif /* RMMC_RMMC_H */
