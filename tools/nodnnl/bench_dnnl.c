/* kb_dnnl_bf16_matmul (tools/bench_dnnl.h) in a build without oneDNN (CMake -DKDLOSS_GEMM=builtin):
 * there is no oneDNN matmul to time, so the bench's oneDNN floor row reports it as not run. */
#include "bench_dnnl.h"

#include <stdio.h>

int kb_dnnl_bf16_matmul(int ta, int tb, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                        char *impl, size_t impl_len) {
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc;
    if (impl && impl_len) snprintf(impl, impl_len, "none (built without oneDNN)");
    return -1;
}
