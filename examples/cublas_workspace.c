/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuBLAS on rmmc memory: the handle's workspace is an rmmc buffer and the
 * matrices are rmmc vectors, all from the current device's registry
 * resource (RMMC_ALLOC_CONF chooses the stack with no code change), all
 * ordered on one stream. C = A * B is computed with cublasSgemm and checked
 * against the CPU.
 *
 *   RMMC_ALLOC_CONF="cuda_async(initial=256MiB)" ./build/examples/cublas_workspace
 *
 * Exits 0 when the product is right, 1 on an error, 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>

#include "rmmc/rmmc.h"

#define M 512
#define N 384
#define K 256
/* cuBLAS asks for 32 MiB of workspace on Hopper and newer (4 MiB before). */
#define WORKSPACE_BYTES ((size_t)32 << 20)

#define CHECK_RMMC(x)                                                                             \
  do {                                                                                             \
    rmmc_status_t st_ = (x);                                                                       \
    if (st_ != RMMC_SUCCESS) {                                                                     \
      fprintf(stderr, "%s: %s: %s\n", #x, rmmc_status_name(st_), rmmc_last_error_message());      \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

#define CHECK_CUBLAS(x)                                                                           \
  do {                                                                                             \
    cublasStatus_t cs_ = (x);                                                                      \
    if (cs_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      fprintf(stderr, "%s: cuBLAS status %d\n", #x, (int)cs_);                                     \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

static void print_field(void *ctx, const rmmc_field_t *f) {
  (void)ctx;
  if (f->kind == RMMC_FIELD_TEXT)
    printf(" %s=%s", f->key, f->text);
  else
    printf(" %s=%llu", f->key, (unsigned long long)f->value);
}

int main(void) {
  if (rmmc_device_count() == 0) {
    fprintf(stderr, "no CUDA device: skipping\n");
    return 77;
  }
  int rc = 1;
  cudaStream_t stream = NULL;
  cublasHandle_t handle = NULL;
  rmmc_buffer_t workspace = RMMC_BUFFER_INIT;
  rmmc_vector_t a = RMMC_VECTOR_INIT, b = RMMC_VECTOR_INIT, c = RMMC_VECTOR_INIT;
  float *ha = malloc(sizeof(float) * M * K), *hb = malloc(sizeof(float) * K * N);
  float *hc = malloc(sizeof(float) * M * N);
  if (ha == NULL || hb == NULL || hc == NULL) goto done;
  /* Column-major, as cuBLAS reads them. */
  for (int i = 0; i < M * K; i++) ha[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (int i = 0; i < K * N; i++) hb[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;

  CHECK_RMMC(rmmc_stream_create(cudaStreamNonBlocking, &stream));
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  /* The workspace: rmmc memory, ordered on the handle's stream. */
  CHECK_RMMC(rmmc_buffer_create(&workspace, WORKSPACE_BYTES, stream, NULL));
  CHECK_CUBLAS(cublasSetWorkspace(handle, workspace.data, workspace.size));

  CHECK_RMMC(rmmc_vector_create_from(&a, ha, (size_t)M * K, sizeof(float), stream, NULL));
  CHECK_RMMC(rmmc_vector_create_from(&b, hb, (size_t)K * N, sizeof(float), stream, NULL));
  CHECK_RMMC(rmmc_vector_create(&c, (size_t)M * N, sizeof(float), stream, NULL));
  const float one = 1.0f, zero = 0.0f;
  CHECK_CUBLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one,
                           RMMC_VECTOR_DATA(&a, float), M, RMMC_VECTOR_DATA(&b, float), K, &zero,
                           RMMC_VECTOR_DATA(&c, float), M));
  CHECK_RMMC(rmmc_vector_copy_to_host(&c, 0, hc, (size_t)M * N)); /* waits for the stream */

  double max_err = 0;
  for (int col = 0; col < N; col++)
    for (int row = 0; row < M; row++) {
      double ref = 0;
      for (int k = 0; k < K; k++) ref += (double)ha[row + k * M] * hb[k + col * K];
      double err = fabs(ref - hc[row + col * M]);
      if (err > max_err) max_err = err;
    }
  rmmc_resource_t *r;
  CHECK_RMMC(rmmc_get_current_device_resource(&r));
  printf("sgemm %dx%dx%d with a %zu MiB rmmc workspace from '%s': max error %.2e\n", M, N, K,
         workspace.size >> 20, rmmc_resource_name(r), max_err);
  for (rmmc_resource_t *l = r; l != NULL; l = rmmc_resource_upstream(l)) {
    printf("  %s:", rmmc_resource_name(l));
    rmmc_resource_describe(l, print_field, NULL);
    printf("\n");
  }
  rc = max_err < 1e-3 ? 0 : 1;
  if (rc != 0) fprintf(stderr, "wrong product: max error %.3e\n", max_err);

done:
  /* The handle may use the workspace until it is destroyed (which waits
   * for the device), so it goes first. */
  if (handle != NULL) cublasDestroy(handle);
  rmmc_vector_destroy(&a);
  rmmc_vector_destroy(&b);
  rmmc_vector_destroy(&c);
  rmmc_buffer_destroy(&workspace);
  if (stream != NULL) {
    cudaStreamSynchronize(stream);
    rmmc_stream_destroy(stream);
  }
  free(ha);
  free(hb);
  free(hc);
  return rc;
}
