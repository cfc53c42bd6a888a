/* cublas_v2.h of the CUDA simulator (cudasim/): the part of cuBLAS that kdloss calls, served on
 * the CPU by cudasim/src/sim_blas.cpp. C and C++. Names and numeric values follow cuBLAS, so a
 * status printed by a test means the same as on a GPU; only what kdloss needs is declared, and
 * anything else the stand-in is handed at run time is refused (CUBLAS_STATUS_NOT_SUPPORTED).
 *
 * Semantics kept from cuBLAS: column-major matrices, pointer mode host (alpha and beta are host
 * floats), C is not read when beta == 0, cublasSetStream resets the workspace to the library's own
 * pool. The simulator runs every call synchronously, in stream order. */
#ifndef KD_SIM_CUBLAS_V2_H
#define KD_SIM_CUBLAS_V2_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "kd_sim.h"
#include "library_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

/* For real data CUBLAS_OP_C means the same as CUBLAS_OP_T (cuBLAS documents it for the classic
 * API); cuBLASLt in the simulator takes N and T only. */
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
    CUBLAS_FILL_MODE_LOWER = 0,
    CUBLAS_FILL_MODE_UPPER = 1,
    CUBLAS_FILL_MODE_FULL = 2
} cublasFillMode_t;

typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

/* Only CUBLAS_COMPUTE_32F (true fp32, no TF32) is served; the others are named so that a caller
 * passing one gets CUBLAS_STATUS_NOT_SUPPORTED rather than a compile error elsewhere. */
typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_64F_PEDANTIC = 71,
    CUBLAS_COMPUTE_32I = 72,
    CUBLAS_COMPUTE_32I_PEDANTIC = 73,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

/* cublasGemmEx serves the two "let cuBLAS choose" values; an explicit ALGOn is refused. */
typedef enum {
    CUBLAS_GEMM_DEFAULT = -1,
    CUBLAS_GEMM_DFALT = -1,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
    CUBLAS_GEMM_DFALT_TENSOR_OP = 99
} cublasGemmAlgo_t;

typedef struct kd_sim_cublas_context *cublasHandle_t;

KD_SIM_API cublasStatus_t cublasCreate(cublasHandle_t *handle);
KD_SIM_API cublasStatus_t cublasDestroy(cublasHandle_t handle);
/* Records the stream and, as cuBLAS does, drops a workspace set by cublasSetWorkspace. */
KD_SIM_API cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
KD_SIM_API cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
/* workspace: device memory, 256-byte aligned (else CUBLAS_STATUS_INVALID_VALUE), or NULL with
 * size 0 for the library's own pool. */
KD_SIM_API cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace,
                                             size_t workspaceSizeInBytes);

/* C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major; alpha, beta: host floats.
 * Served: computeType CUBLAS_COMPUTE_32F; Atype == Btype; A/B 32F -> C 32F, A/B 16BF -> C 16BF or
 * 32F, A/B 16F -> C 16F or 32F. */
KD_SIM_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                       cublasOperation_t transb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType_t Atype,
                                       int lda, const void *B, cudaDataType_t Btype, int ldb,
                                       const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                                       cublasComputeType_t computeType, cublasGemmAlgo_t algo);

KD_SIM_API const char *cublasGetStatusName(cublasStatus_t status);
KD_SIM_API const char *cublasGetStatusString(cublasStatus_t status);

#ifdef __cplusplus
}
#endif
#endif
