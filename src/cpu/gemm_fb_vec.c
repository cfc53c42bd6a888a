/* Generic vector source of the GEMM layer's allocation-free fallback (gemm_fb.h), compiled once
 * per ISA with a vector layer (isa.h). The
 * register tile is FB_MR rows x FB_NV vectors of C: 12 x 32 with AVX-512 (24 accumulators of
 * the 32 registers), 6 x 16 with AVX2 (12 of 16). */
#include <string.h>

#include "gemm_fb.h"
#include "simd.h"

#if defined(KD_LAYER_AVX512)
#define FB_MR 12
#else
#define FB_MR 6
#endif
#define FB_NV 2
#define FB_NR (FB_NV * VL)

static int64_t KD_SFX(fb_min)(int64_t a, int64_t b) { return a < b ? a : b; }

/* Balanced blocks: the fewest blocks of at most cap, of equal size rounded up to q. */
static int64_t KD_SFX(fb_block)(int64_t n, int64_t cap, int64_t q) {
    int64_t nb = (n + cap - 1) / cap;
    int64_t b = (n + nb - 1) / nb;
    return (b + q - 1) / q * q;
}

#if defined(KD_LAYER_AVX512)
/* 16 x 16 transpose of r[0..15] in place. */
KD_INLINE void fb_tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512 a = t[4 * i], b = t[4 * i + 1], c = t[4 * i + 2], d = t[4 * i + 3];
        r[4 * i] = _mm512_shuffle_ps(a, c, 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(a, c, 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(b, d, 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(b, d, 0xEE);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            __m512 a = r[8 * i + j], b = r[8 * i + 4 + j];
            t[8 * i + j] = _mm512_shuffle_f32x4(a, b, 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(a, b, 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    }
}

KD_INLINE __mmask16 fb_mask(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xFFFF : n > 0 ? (1u << n) - 1 : 0);
}

/* rows (< 16 taken, the rest zero) x kc of a row-major matrix (row stride ld), transposed into
 * dst: dst[k * step + i] = src[i * ld + k] for i < 16, 16 floats stored per k (so up to 16 - step
 * floats past the last k's lanes are overwritten: callers go in increasing order and leave room) */
static void fb_transpose_rows(const float *src, int64_t ld, int rows, int64_t kc, float *dst,
                              int64_t step) {
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        int kk = (int)(kc - k0 < 16 ? kc - k0 : 16);
        __mmask16 km = fb_mask(kk);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_maskz_loadu_ps(km, src + i * ld + k0) : _mm512_setzero_ps();
        fb_tr16(r);
        for (int k = 0; k < kk; k++) _mm512_storeu_ps(dst + (k0 + k) * step, r[k]);
    }
}
#endif

/* Packs op(A) rows [0, mc) x [0, kc) (a points at its first element) into FB_MR-row panels:
 * ap[p * FB_MR * kc + k * FB_MR + i] = op(A)(p * FB_MR + i, k), zero past mc. */
static void KD_SFX(fb_pack_a)(int ta, const float *a, int64_t lda, int64_t mc, int64_t kc,
                              float *ap) {
    if (ta) { /* A stored k x m: each k is a contiguous row of op(A)'s column */
        for (int64_t k = 0; k < kc; k++) {
            const float *src = a + k * lda;
            for (int64_t p = 0; p < mc; p += FB_MR) {
                int64_t mr = KD_SFX(fb_min)(FB_MR, mc - p);
                float *dst = ap + p * kc + k * FB_MR;
#if defined(KD_LAYER_AVX512)
                _mm512_mask_storeu_ps(dst, fb_mask(FB_MR),
                                      _mm512_maskz_loadu_ps(fb_mask(mr), src + p));
#else
                for (int64_t i = 0; i < FB_MR; i++) dst[i] = i < mr ? src[p + i] : 0.0f;
#endif
            }
        }
        return;
    }
    for (int64_t p = 0; p < mc; p += FB_MR) {
        int64_t mr = KD_SFX(fb_min)(FB_MR, mc - p);
        float *dst = ap + p * kc;
#if defined(KD_LAYER_AVX512)
        fb_transpose_rows(a + p * lda, lda, (int)mr, kc, dst, FB_MR);
#else
        for (int64_t i = 0; i < FB_MR; i++) {
            const float *src = a + (p + i) * lda;
            if (i < mr)
                for (int64_t k = 0; k < kc; k++) dst[k * FB_MR + i] = src[k];
            else
                for (int64_t k = 0; k < kc; k++) dst[k * FB_MR + i] = 0.0f;
        }
#endif
    }
}

/* Packs op(B) rows [0, kc) x columns [0, nc) into FB_NR-column panels:
 * bp[q * FB_NR * kc + k * FB_NR + j] = op(B)(k, q * FB_NR + j), zero past nc. */
static void KD_SFX(fb_pack_b)(int tb, const float *b, int64_t ldb, int64_t kc, int64_t nc,
                              float *bp) {
    for (int64_t q = 0; q < nc; q += FB_NR) {
        int64_t nr = KD_SFX(fb_min)(FB_NR, nc - q);
        float *dst = bp + q * kc;
        if (!tb) { /* B stored k x n */
            for (int64_t k = 0; k < kc; k++) {
                const float *src = b + k * ldb + q;
                float *d = dst + k * FB_NR;
                if (nr == FB_NR)
                    for (int v = 0; v < FB_NV; v++) vf_store(d + v * VL, vf_load(src + v * VL));
                else
                    for (int64_t j = 0; j < FB_NR; j++) d[j] = j < nr ? src[j] : 0.0f;
            }
            continue;
        }
        /* B stored n x k: column j of op(B) is row q + j */
#if defined(KD_LAYER_AVX512)
        for (int h = 0; h < FB_NV; h++)
            fb_transpose_rows(b + (q + 16 * h) * ldb, ldb, (int)(nr - 16 * h), kc, dst + 16 * h,
                              FB_NR);
#else
        for (int64_t j = 0; j < FB_NR; j++) {
            const float *src = b + (q + j) * ldb;
            if (j < nr)
                for (int64_t k = 0; k < kc; k++) dst[k * FB_NR + j] = src[k];
            else
                for (int64_t k = 0; k < kc; k++) dst[k * FB_NR + j] = 0.0f;
        }
#endif
    }
}

/* One FB_MR x FB_NR tile of C (mr x nr of it stored): acc = sum over k of the panels' outer
 * products, then C = alpha acc + beta C (beta 0: C not read). The edge path rounds the same. */
static void KD_SFX(fb_tile)(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                            float alpha, float beta, int64_t mr, int64_t nr) {
    vf acc[FB_MR][FB_NV];
    for (int i = 0; i < FB_MR; i++)
        for (int v = 0; v < FB_NV; v++) acc[i][v] = vf_zero();
    for (int64_t k = 0; k < kc; k++) {
        vf bv[FB_NV];
        for (int v = 0; v < FB_NV; v++) bv[v] = vf_load(bp + v * VL);
#pragma GCC unroll 16
        for (int i = 0; i < FB_MR; i++) {
            vf av = vf_set1(ap[i]);
            for (int v = 0; v < FB_NV; v++) acc[i][v] = vf_fmadd(av, bv[v], acc[i][v]);
        }
        ap += FB_MR;
        bp += FB_NR;
    }
    vf va = vf_set1(alpha), vb = vf_set1(beta);
    if (mr == FB_MR && nr == FB_NR) {
        for (int i = 0; i < FB_MR; i++)
            for (int v = 0; v < FB_NV; v++) {
                float *p = c + i * ldc + v * VL;
                vf r = vf_mul(va, acc[i][v]);
                if (beta != 0.0f) r = vf_fmadd(vb, vf_load(p), r);
                vf_store(p, r);
            }
        return;
    }
    float t[FB_MR][FB_NR];
    for (int i = 0; i < FB_MR; i++)
        for (int v = 0; v < FB_NV; v++) vf_store(&t[i][v * VL], vf_mul(va, acc[i][v]));
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            float *p = c + i * ldc + j;
            *p = beta != 0.0f ? fmaf(beta, *p, t[i][j]) : t[i][j];
        }
}

void KD_SFX(kd_gemm_fb)(const kd_gemm *g, float *scratch) {
    int64_t m = g->m, n = g->n, k = g->k;
    int64_t mcb = KD_SFX(fb_block)(m, KD_FB_MC, FB_MR), ncb = KD_SFX(fb_block)(n, KD_FB_NC, FB_NR);
    int64_t kcb = KD_SFX(fb_block)(k, KD_FB_KC, 1);
    size_t kcap = (size_t)(k < KD_FB_KC ? k : KD_FB_KC);
    size_t mcap = (size_t)(m < KD_FB_MC ? m : KD_FB_MC);
    float *ap = scratch, *bp = scratch + ((mcap + 32) * kcap + 32 + 15) / 16 * 16;
    for (int64_t ic = 0; ic < m; ic += mcb) {
        int64_t mc = KD_SFX(fb_min)(mcb, m - ic);
        for (int64_t pc = 0; pc < k; pc += kcb) {
            int64_t kc = KD_SFX(fb_min)(kcb, k - pc);
            float beta = pc == 0 ? g->beta : 1.0f;
            KD_SFX(fb_pack_a)(g->ta, g->ta ? g->a + pc * g->lda + ic : g->a + ic * g->lda + pc,
                              g->lda, mc, kc, ap);
            for (int64_t jc = 0; jc < n; jc += ncb) {
                int64_t nc = KD_SFX(fb_min)(ncb, n - jc);
                KD_SFX(fb_pack_b)(g->tb, g->tb ? g->b + jc * g->ldb + pc : g->b + pc * g->ldb + jc,
                                  g->ldb, kc, nc, bp);
                for (int64_t ir = 0; ir < mc; ir += FB_MR)
                    for (int64_t jr = 0; jr < nc; jr += FB_NR)
                        KD_SFX(fb_tile)(kc, ap + ir * kc, bp + jr * kc,
                                        g->c + (ic + ir) * g->ldc + jc + jr, g->ldc, g->alpha, beta,
                                        KD_SFX(fb_min)(FB_MR, mc - ir),
                                        KD_SFX(fb_min)(FB_NR, nc - jr));
            }
        }
    }
}
