/* One GEMM through cuBLASLt (fp32 accumulation, fp32 or bf16 operands, fp32 or bf16 output),
 * with the caller's workspace and stream. Column-major terms, as cuBLAS speaks them:
 *   D (m x n, ldd) = op(A) (m x k) * op(B) (k x n) + beta * D
 * A row-major matrix with leading dimension ld is the column-major transpose with the same ld,
 * which is how fused_linear_jsd.cu maps its row-major operands.
 * cuBLASLt's heuristic is told the true alignment of every pointer (it otherwise assumes 256
 * bytes and the launch fails on a row slice that is less aligned). If it offers no algorithm,
 * cublasGemmEx (which picks its own) runs instead, on the same workspace. */
#include <limits.h>

#include "kd_cuda.cuh"

static uint32_t kd_ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a) != 0) a >>= 1;
    return a;
}

static kdloss_status kd_gemm_fallback(kdloss_cuda_context *ctx, cudaStream_t st, void *ws,
                                      size_t ws_bytes, cublasOperation_t ta, cublasOperation_t tb,
                                      int64_t m, int64_t n, int64_t k, const void *A,
                                      cudaDataType_t at, int64_t lda, const void *B,
                                      cudaDataType_t bt, int64_t ldb, float beta, void *D,
                                      cudaDataType_t dt, int64_t ldd) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldd > INT_MAX)
        return KDLOSS_ERR_UNSUPPORTED;
    /* cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first */
    kdloss_status s = kd_blas_status(cublasSetStream(ctx->blas, st));
    if (s == KDLOSS_OK) s = kd_blas_status(cublasSetWorkspace(ctx->blas, ws, ws_bytes));
    if (s != KDLOSS_OK) return s;
    const float alpha = 1.0f;
    return kd_blas_status(cublasGemmEx(ctx->blas, ta, tb, (int)m, (int)n, (int)k, &alpha, A, at,
                                       (int)lda, B, bt, (int)ldb, &beta, D, dt, (int)ldd,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

kdloss_status kd_gemm(kdloss_cuda_context *ctx, cudaStream_t st, void *ws, size_t ws_bytes,
                      cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const void *A, cudaDataType_t at, int64_t lda, const void *B,
                      cudaDataType_t bt, int64_t ldb, float beta, void *D, cudaDataType_t dt,
                      int64_t ldd) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    const float alpha = 1.0f;
    /* fp32 operands use true fp32 math (no TF32): CUBLAS_COMPUTE_32F in both cases */
    cublasStatus_t bs = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&la, at, (uint64_t)(ta == CUBLAS_OP_N ? m : k),
                                        (uint64_t)(ta == CUBLAS_OP_N ? k : m), lda);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&lb, bt, (uint64_t)(tb == CUBLAS_OP_N ? k : n),
                                        (uint64_t)(tb == CUBLAS_OP_N ? n : k), ldb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&ld, dt, (uint64_t)m, (uint64_t)n, ldd);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasLtMatmulPreferenceCreate(&pref);
    if (bs == CUBLAS_STATUS_SUCCESS) {
        uint64_t wsb = ws_bytes;
        uint32_t aa = kd_ptr_align(A), ab = kd_ptr_align(B), ad = kd_ptr_align(D);
        bs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &wsb, sizeof wsb);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
    }
    kdloss_status s = kd_blas_status(bs);
    if (s == KDLOSS_OK) {
        int nres = 0;
        /* C and D are the same buffer (beta = 1 accumulates in place) */
        bs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur, &nres);
        found = bs == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (found) {
            bs = cublasLtMatmul(ctx->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld,
                                &heur.algo, ws, ws_bytes, st);
            if (bs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
            else s = kd_blas_status(bs);
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (s == KDLOSS_OK && !found)
        s = kd_gemm_fallback(ctx, st, ws, ws_bytes, ta, tb, m, n, k, A, at, lda, B, bt, ldb, beta,
                             D, dt, ldd);
    return s;
}
