/* Portable build of the GEMM layer's allocation-free fallback (gemm_fb.h): the same blocking,
 * packing and order of operations as gemm_fb_vec.c with a 4 x 8 tile of scalars. */
#include <math.h>

#include "gemm_fb.h"

#define FB_MR 4
#define FB_NR 8

static int64_t fb_min(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t fb_block(int64_t n, int64_t cap, int64_t q) {
    int64_t nb = (n + cap - 1) / cap;
    int64_t b = (n + nb - 1) / nb;
    return (b + q - 1) / q * q;
}

static void pack_a(int ta, const float *a, int64_t lda, int64_t mc, int64_t kc, float *ap) {
    for (int64_t p = 0; p < mc; p += FB_MR) {
        int64_t mr = fb_min(FB_MR, mc - p);
        float *dst = ap + p * kc;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = 0; i < FB_MR; i++)
                dst[k * FB_MR + i] = i >= mr ? 0.0f
                                     : ta    ? a[k * lda + p + i]
                                             : a[(p + i) * lda + k];
    }
}

static void pack_b(int tb, const float *b, int64_t ldb, int64_t kc, int64_t nc, float *bp) {
    for (int64_t q = 0; q < nc; q += FB_NR) {
        int64_t nr = fb_min(FB_NR, nc - q);
        float *dst = bp + q * kc;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < FB_NR; j++)
                dst[k * FB_NR + j] = j >= nr ? 0.0f
                                     : tb    ? b[(q + j) * ldb + k]
                                             : b[k * ldb + q + j];
    }
}

static void tile(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, float alpha,
                 float beta, int64_t mr, int64_t nr) {
    float acc[FB_MR][FB_NR] = {{0.0f}};
    for (int64_t k = 0; k < kc; k++, ap += FB_MR, bp += FB_NR)
        for (int i = 0; i < FB_MR; i++)
            for (int j = 0; j < FB_NR; j++) acc[i][j] = fmaf(ap[i], bp[j], acc[i][j]);
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            float *p = c + i * ldc + j, r = alpha * acc[i][j];
            *p = beta != 0.0f ? fmaf(beta, *p, r) : r;
        }
}

void kd_gemm_fb_scalar(const kd_gemm *g, float *scratch) {
    int64_t m = g->m, n = g->n, k = g->k;
    int64_t mcb = fb_block(m, KD_FB_MC, FB_MR), ncb = fb_block(n, KD_FB_NC, FB_NR);
    int64_t kcb = fb_block(k, KD_FB_KC, 1);
    size_t kcap = (size_t)(k < KD_FB_KC ? k : KD_FB_KC);
    size_t mcap = (size_t)(m < KD_FB_MC ? m : KD_FB_MC);
    float *ap = scratch, *bp = scratch + ((mcap + 32) * kcap + 32 + 15) / 16 * 16;
    for (int64_t ic = 0; ic < m; ic += mcb) {
        int64_t mc = fb_min(mcb, m - ic);
        for (int64_t pc = 0; pc < k; pc += kcb) {
            int64_t kc = fb_min(kcb, k - pc);
            float beta = pc == 0 ? g->beta : 1.0f;
            pack_a(g->ta, g->ta ? g->a + pc * g->lda + ic : g->a + ic * g->lda + pc, g->lda, mc,
                   kc, ap);
            for (int64_t jc = 0; jc < n; jc += ncb) {
                int64_t nc = fb_min(ncb, n - jc);
                pack_b(g->tb, g->tb ? g->b + jc * g->ldb + pc : g->b + pc * g->ldb + jc, g->ldb,
                       kc, nc, bp);
                for (int64_t ir = 0; ir < mc; ir += FB_MR)
                    for (int64_t jr = 0; jr < nc; jr += FB_NR)
                        tile(kc, ap + ir * kc, bp + jr * kc, g->c + (ic + ir) * g->ldc + jc + jr,
                             g->ldc, g->alpha, beta, fb_min(FB_MR, mc - ir),
                             fb_min(FB_NR, nc - jr));
            }
        }
    }
}
