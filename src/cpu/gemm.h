/* The GEMM layer every CPU GEMM of kdloss goes through (providers, tiling, bf16 policy).
 * The public side (kdloss_gemm_*) is declared in kdloss.h; this is what the kernels call. */
#ifndef KD_GEMM_H
#define KD_GEMM_H

#include <stdint.h>

#include "kdloss.h"

/* One row-major product C (m x n, ldc) = alpha op(A) op(B) + beta C; op(A) is m x k (A stored
 * k x m, lda, when ta), op(B) is k x n (B stored n x k, ldb, when tb). */
typedef struct kd_gemm {
    int ta, tb;
    int64_t m, n, k;
    float alpha;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    float beta;
    float *c;
    int64_t ldc;
} kd_gemm;

/* The same with bf16 operands (raw uint16 bits) and an fp32 C: C = op(A) op(B) + beta C,
 * beta 0 (C not read) or 1 (accumulate; alpha is always 1). */
typedef struct kd_gemm_bf16 {
    int ta, tb;
    int64_t m, n, k;
    const uint16_t *a;
    int64_t lda;
    const uint16_t *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    float beta;
} kd_gemm_bf16;

/* The provider the next call uses (never AUTO): KDLOSS_GEMM env var, else oneDNN (builtin in a
 * build without oneDNN). */
kdloss_gemm_provider kd_gemm_provider_in_use(void);

/* The extent of one product: C is m x n, the inner dimension k (transposes and strides do not
 * matter here). */
typedef struct kd_gemm_shape {
    int64_t m, n, k;
} kd_gemm_shape;

/*
 * Makes sure that no kd_sgemm of these shapes, or of smaller ones (every dimension <=), run
 * later from this thread can fail for lack of memory: reserves this thread's scratch for the
 * allocation-free fallback GEMM (gemm_fb.h) that redoes a tile whose oneDNN call could not
 * allocate its packing buffers. Call it before anything is written, with every product the
 * call will run. KDLOSS_OK, or KDLOSS_ERR_OUT_OF_MEMORY with nothing else changed.
 *
 * The scratch is kept for the thread's life (freed when it ends) and only grown, so a warm
 * thread's call allocates nothing here: at most 2.2 MB (KD_FB_MC, KD_FB_KC, KD_FB_NC bound it),
 * (|m| + 32 + |n| + 32) * |k| floats with |m| = min(m, 1020), |n| = min(n, 1024), |k| =
 * min(k, 256); where bf16 products may run natively (kd_gemm_bf16_run), also the widened operand
 * blocks of their fallback, (|m| + |n|) * |k| floats more. Not covered, so a no-op: the
 * OpenBLAS provider (it exits inside a failed allocation).
 */
kdloss_status kd_gemm_prepare(const kd_gemm_shape *shapes, int n);

/* Runs g with the provider in use; KDLOSS_OK, _OUT_OF_MEMORY or _BLAS. With oneDNN, after a
 * kd_gemm_prepare covering g from this thread, it never returns _OUT_OF_MEMORY (and never
 * allocates beyond oneDNN's own buffers): a tile oneDNN cannot allocate for is computed by the
 * fallback, to the same accuracy but not bitwise the same. */
kdloss_status kd_sgemm(const kd_gemm *g);

/*
 * C (m x n, ldc) = A (m x k, lda) B^T with B bf16 (n x k, ldb; raw bits), widened inside the
 * product: a fixed grid of column tiles (their rows of B at most 4 MiB of fp32 and two slots of
 * the scratch: from k and the scratch size alone, never the thread count), each run by one
 * thread that widens its rows of B into its slot of `scratch` and multiplies them there at
 * once, so no pass over B and no barrier comes before the multiplies, and one thread widens
 * while another multiplies. scratch holds `floats` floats; at most as many threads run as it
 * holds slots. With oneDNN only (the fallback of
 * kd_sgemm covers a tile that cannot allocate); KDLOSS_ERR_UNSUPPORTED when another provider is
 * in use or the scratch holds fewer than two slots of 16 rows (the caller widens B itself then).
 */
kdloss_status kd_sgemm_nt_b16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                              const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                              float *scratch, size_t floats);

/* 1 when bf16 x bf16 products should run natively (kd_gemm_bf16_run) rather than be widened to
 * fp32: as kdloss_gemm_set_bf16 forced, else AUTO's choice, measured once per process (gemm.c:
 * native bf16 against widen + sgemm on one thread, cached). Thread-safe. */
int kd_gemm_bf16_native(void);
/* 1 when the fused losses' backward GEMMs run natively from dZ rounded to bf16: the logits
 * GEMMs are native (kd_gemm_bf16_native) and kdloss_gemm_set_bf16_grad did not ask for EXACT. */
int kd_gemm_bf16_grad_native(void);
/* C = op(A) op(B) + beta C in fp32 from bf16 operands (kd_gemm_bf16), natively (oneDNN's bf16
 * gemm), on the tile grid of kd_sgemm (thread-count independent); after a kd_gemm_prepare
 * covering g, never _OUT_OF_MEMORY (as kd_sgemm: a tile that cannot allocate is redone by the
 * fallback on widened blocks). */
kdloss_status kd_gemm_bf16_run(const kd_gemm_bf16 *g);

/* The tile grid kd_sgemm uses for an m x n x k product on `procs` processors: *pm x *pn tiles
 * of at most *tm x *tn. Exposed for the tests (it must not depend on the thread count). */
void kd_gemm_grid(int64_t m, int64_t n, int64_t k, int procs, int64_t *tm, int64_t *tn);

#endif
