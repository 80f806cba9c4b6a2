/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver's own entry points (internal; device.c loads them).
 *
 * Every driver call of rmmc comes through cudaGetDriverEntryPointByVersion,
 * so nothing links against libcuda and a machine without a driver still
 * loads the library. rmmc__driver_load loads a list of them (the virtual
 * memory calls of src/resources/cuda.c, the table below).
 *
 * The table holds the calls a stream-ordered free, reuse or device check
 * makes on a hot path. The runtime's versions go through an entry point
 * that does not scale with threads: on the H100 (bench/cuda_costs.c
 * threads; per call and thread at 1, 4 and 16 threads at once, each on its
 * own stream) cudaGetDevice took 49, 383 and 1,707 ns and
 * cudaStreamGetCaptureInfo 106, 458 and 2,041 ns, where cuCtxGetDevice took
 * 17-34 ns and cuStreamIsCapturing 26-31 ns at every count; cuEventRecord
 * 269, 956 and 4,664 ns against cudaEventRecord's 376, 1,053 and 5,031
 * (docs/design.md, "Driver calls on the stream-ordered path").
 */
#ifndef RMMC_DRIVER_H
#define RMMC_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "base/internal.h"

typedef struct rmmc__driver_sym {
  const char *name;
  void **fn;
  unsigned version; /* the ABI version asked for (cudaTypedefs.h's _vNNNN) */
} rmmc__driver_sym_t;

/* Loads each of syms; false at the first one the driver lacks, with why
 * naming it. */
bool rmmc__driver_load(const rmmc__driver_sym_t *syms, size_t n, char *why, size_t why_len);

typedef struct rmmc__driver {
  PFN_cuCtxGetDevice_v2000 ctx_get_device;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuStreamIsCapturing_v10000 stream_is_capturing;
  PFN_cuEventRecord_v2000 event_record;
  PFN_cuEventQuery_v2000 event_query;
  PFN_cuStreamWaitEvent_v3020 stream_wait_event;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_capture_mode;
  PFN_cuGetErrorName_v6000 error_name;
  PFN_cuGetErrorString_v6000 error_string;
  int ndevices;
  CUdevice devices[RMMC_MAX_DEVICES]; /* the driver's handle of each runtime device */
} rmmc__driver_t;

/* The table, loaded on first use; NULL without a GPU or when the driver
 * lacks one of its calls (callers then use the runtime's). */
const rmmc__driver_t *rmmc__driver(void);

/* Sets the thread's error to "<what> failed: <driver's text> (<name>, <code>)"
 * and returns RMMC_ERROR_CUDA (RMMC_ERROR_OUT_OF_MEMORY for
 * CUDA_ERROR_OUT_OF_MEMORY). */
rmmc_status_t rmmc__set_driver_error(CUresult res, const char *what);

#endif /* RMMC_DRIVER_H */
