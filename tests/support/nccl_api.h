/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few NCCL entry points tests/test_gpu_nccl.c calls, declared as
 * function pointer types for dlsym (the GPU machine's libnccl comes from
 * PyTorch's wheel, without a header). The types are nccl.h's: ncclResult_t
 * is an enum of non-negative values, which the C ABI passes as unsigned
 * int. tests/meson.build compiles these against nccl.h where the toolkit
 * has it, so a mismatch fails the build.
 */
#ifndef RMMC_TESTS_NCCL_API_H
#define RMMC_TESTS_NCCL_API_H

#include <stddef.h>

#include <cuda_runtime_api.h>

typedef struct ncclComm *nccl_comm_t;
typedef unsigned int nccl_result_t;
enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

typedef nccl_result_t (*comm_init_all_fn)(nccl_comm_t *comms, int ndev, const int *devlist);
typedef nccl_result_t (*comm_destroy_fn)(nccl_comm_t comm);
typedef nccl_result_t (*comm_register_fn)(const nccl_comm_t comm, void *buff, size_t size,
                                          void **handle);
typedef nccl_result_t (*comm_deregister_fn)(const nccl_comm_t comm, void *handle);
typedef nccl_result_t (*all_reduce_fn)(const void *sendbuff, void *recvbuff, size_t count,
                                       unsigned int datatype, unsigned int op, nccl_comm_t comm, cudaStream_t stream);
typedef nccl_result_t (*all_gather_fn)(const void *sendbuff, void *recvbuff, size_t sendcount,
                                       unsigned int datatype, nccl_comm_t comm, cudaStream_t stream);
typedef nccl_result_t (*reduce_scatter_fn)(const void *sendbuff, void *recvbuff, size_t recvcount,
                                           unsigned int datatype, unsigned int op, nccl_comm_t comm,
                                           cudaStream_t stream);
typedef nccl_result_t (*group_fn)(void);
typedef const char *(*error_string_fn)(nccl_result_t result);

#endif
