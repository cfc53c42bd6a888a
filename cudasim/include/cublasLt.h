/* cublasLt.h of the CUDA simulator (cudasim/): the part of cuBLASLt that kdloss calls, served on
 * the CPU by cudasim/src/sim_blas.cpp. C and C++. Names and numeric values follow cuBLASLt.
 *
 * Descriptors are real objects that keep every attribute set on them. What the stand-in serves:
 * compute type CUBLAS_COMPUTE_32F with scale type CUDA_R_32F, pointer mode host, the default
 * epilogue, TRANSA / TRANSB in {N, T}, column-major layouts without batching, Atype == Btype,
 * Ctype == Dtype, and the type pairs of cublasGemmEx (cublas_v2.h). Anything else makes
 * cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul return CUBLAS_STATUS_NOT_SUPPORTED (or
 * CUBLAS_STATUS_INVALID_VALUE for shapes that disagree), so a wrong descriptor cannot pass.
 *
 * The algorithm the heuristic returns remembers the alignments the preference promised;
 * cublasLtMatmul refuses (CUBLAS_STATUS_NOT_SUPPORTED) a pointer less aligned than promised. */
#ifndef KD_SIM_CUBLASLT_H
#define KD_SIM_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cublas_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_sim_lt_context *cublasLtHandle_t;
typedef struct kd_sim_lt_matmul_desc *cublasLtMatmulDesc_t;
typedef struct kd_sim_lt_layout *cublasLtMatrixLayout_t;
typedef struct kd_sim_lt_pref *cublasLtMatmulPreference_t;

/* Semi-opaque, a value type as in cuBLASLt: the caller copies it around. */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize; /* workspace the algorithm needs */
    cublasStatus_t state; /* CUBLAS_STATUS_SUCCESS for every result returned */
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_POINTER_MODE_HOST = 0,
    CUBLASLT_POINTER_MODE_DEVICE = 1
} cublasLtPointerMode_t;

typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1 } cublasLtEpilogue_t;

typedef enum { CUBLASLT_ORDER_COL = 0, CUBLASLT_ORDER_ROW = 1 } cublasLtOrder_t;

/* Attribute value types as in cuBLASLt: sizeInBytes must match them exactly. */
typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0, /* int32_t (cublasComputeType_t) */
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,   /* int32_t (cudaDataType_t) */
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2, /* int32_t, default CUBLASLT_POINTER_MODE_HOST */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,       /* int32_t (cublasOperation_t), default N */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,       /* int32_t, default N */
    CUBLASLT_MATMUL_DESC_TRANSC = 5,       /* int32_t, default N (the only one served) */
    CUBLASLT_MATMUL_DESC_FILL_MODE = 6,    /* int32_t, default CUBLAS_FILL_MODE_FULL */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,     /* uint32_t, default CUBLASLT_EPILOGUE_DEFAULT */
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8  /* void *, default NULL (the only one served) */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                /* uint32_t (cudaDataType_t) */
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,               /* int32_t, default CUBLASLT_ORDER_COL */
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,                /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_LD = 4,                  /* int64_t */
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,         /* int32_t, default 1 (the only one served) */
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 /* int64_t, default 0 */
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,           /* uint32_t, default 0 (best fit) */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,   /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8  /* uint32_t, default 256 */
} cublasLtMatmulPreferenceAttributes_t;

KD_SIM_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
KD_SIM_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

KD_SIM_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                   cublasComputeType_t computeType,
                                                   cudaDataType_t scaleType);
KD_SIM_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
KD_SIM_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t sizeInBytes);
KD_SIM_API cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         void *buf, size_t sizeInBytes,
                                                         size_t *sizeWritten);

KD_SIM_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                     cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld);
KD_SIM_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
KD_SIM_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                           cublasLtMatrixLayoutAttribute_t attr,
                                                           const void *buf, size_t sizeInBytes);
KD_SIM_API cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                           cublasLtMatrixLayoutAttribute_t attr,
                                                           void *buf, size_t sizeInBytes,
                                                           size_t *sizeWritten);

KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t sizeInBytes);
KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void *buf,
    size_t sizeInBytes, size_t *sizeWritten);

/* At most one result (the reference GEMM, workspace 0). *returnAlgoCount = 0 (and SUCCESS) when
 * the switch kd_sim_set_no_lt_heuristic is on or the preference forbids what it needs. */
KD_SIM_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount);

/* D = alpha op(A) op(B) + beta C. algo NULL: the default preference (256-byte alignments, no
 * workspace) applies. C == D is allowed when Cdesc and Ddesc have the same leading dimension. */
KD_SIM_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle,
                                         cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                         cublasLtMatrixLayout_t Bdesc, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                         cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace,
                                         size_t workspaceSizeInBytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
