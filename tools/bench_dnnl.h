/* oneDNN's bf16 matmul called directly (tools/bench_dnnl.c), for the bench's bf16 GEMM floor. */
#ifndef KB_DNNL_H
#define KB_DNNL_H
#include <stddef.h>
#include <stdint.h>
/* C (m x n fp32, ldc) = op(A) op(B), bf16 operands stored as kdloss_gemm_bf16 takes them, one
 * threaded oneDNN matmul primitive (oneDNN picks its kernel and splits the work over the
 * process's OpenMP threads). Returns 0, or -1 when oneDNN cannot create or run it. impl (may be
 * NULL) gets oneDNN's implementation name. */
int kb_dnnl_bf16_matmul(int ta, int tb, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                        char *impl, size_t impl_len);
#endif
