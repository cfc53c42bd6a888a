/* One GEMM through cuBLASLt (fp32 accumulation, fp32 or bf16 operands, fp32 or bf16 output),
 * with the caller's workspace and stream. Column-major terms, as cuBLAS speaks them:
 *   D (m x n, ldd) = op(A) (m x k) * op(B) (k x n) + beta * D
 * A row-major matrix with leading dimension ld is the column-major transpose with the same ld,
 * which is how fld.cu maps its row-major operands.
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

/* The cuBLASLt descriptors of one GEMM: the operation, the layouts of A, B and D (C is D), the
 * algorithm preference. Created in this order, destroyed in the reverse one. */
typedef struct kd_lt_desc {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
} kd_lt_desc;

/* The preference: the caller's workspace bound, and the true alignment of every pointer (the
 * heuristic otherwise assumes 256 bytes, and the launch fails on a less aligned row slice). */
static cublasStatus_t kd_lt_prefs(cublasLtMatmulPreference_t pref, size_t ws_bytes,
                                  const void *A, const void *B, const void *D) {
    uint64_t wsb = ws_bytes;
    uint32_t aa = kd_ptr_align(A), ab = kd_ptr_align(B), ad = kd_ptr_align(D);
    cublasStatus_t bs = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &aa, sizeof aa);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &ab, sizeof ab);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &ad, sizeof ad);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &ad, sizeof ad);
    return bs;
}

/* Creates d's descriptors for D (m x n) = op(A) op(B) + beta D; stops at the first failure,
 * leaving what was created in d for kd_lt_destroy (d starts zeroed). */
static cublasStatus_t kd_lt_describe(kd_lt_desc *d, size_t ws_bytes, cublasOperation_t ta,
                                     cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                     const void *A, cudaDataType_t at, int64_t lda, const void *B,
                                     cudaDataType_t bt, int64_t ldb, const void *D,
                                     cudaDataType_t dt, int64_t ldd) {
    /* fp32 operands use true fp32 math (no TF32): CUBLAS_COMPUTE_32F in both cases */
    cublasStatus_t bs = cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&d->la, at, (uint64_t)(ta == CUBLAS_OP_N ? m : k),
                                        (uint64_t)(ta == CUBLAS_OP_N ? k : m), lda);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&d->lb, bt, (uint64_t)(tb == CUBLAS_OP_N ? k : n),
                                        (uint64_t)(tb == CUBLAS_OP_N ? n : k), ldb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasLtMatrixLayoutCreate(&d->ld, dt, (uint64_t)m, (uint64_t)n, ldd);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasLtMatmulPreferenceCreate(&d->pref);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = kd_lt_prefs(d->pref, ws_bytes, A, B, D);
    return bs;
}

static void kd_lt_destroy(const kd_lt_desc *d) {
    if (d->pref) cublasLtMatmulPreferenceDestroy(d->pref);
    if (d->ld) cublasLtMatrixLayoutDestroy(d->ld);
    if (d->lb) cublasLtMatrixLayoutDestroy(d->lb);
    if (d->la) cublasLtMatrixLayoutDestroy(d->la);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

kdloss_status kd_gemm(kdloss_cuda_context *ctx, cudaStream_t st, void *ws, size_t ws_bytes,
                      cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const void *A, cudaDataType_t at, int64_t lda, const void *B,
                      cudaDataType_t bt, int64_t ldb, float beta, void *D, cudaDataType_t dt,
                      int64_t ldd) {
    kd_lt_desc d = {NULL, NULL, NULL, NULL, NULL};
    int found = 0;
    const float alpha = 1.0f;
    cublasStatus_t bs =
        kd_lt_describe(&d, ws_bytes, ta, tb, m, n, k, A, at, lda, B, bt, ldb, D, dt, ldd);
    kdloss_status s = kd_blas_status(bs);
    if (s == KDLOSS_OK) {
        cublasLtMatmulHeuristicResult_t heur;
        int nres = 0;
        /* C and D are the same buffer (beta = 1 accumulates in place) */
        bs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, d.op, d.la, d.lb, d.ld, d.ld, d.pref, 1,
                                            &heur, &nres);
        found = bs == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (found) {
            bs = cublasLtMatmul(ctx->lt, d.op, &alpha, A, d.la, B, d.lb, &beta, D, d.ld, D, d.ld,
                                &heur.algo, ws, ws_bytes, st);
            if (bs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
            else s = kd_blas_status(bs);
        }
    }
    kd_lt_destroy(&d);
    if (s == KDLOSS_OK && !found)
        s = kd_gemm_fallback(ctx, st, ws, ws_bytes, ta, tb, m, n, k, A, at, lda, B, bt, ldb, beta,
                             D, dt, ldd);
    return s;
}
