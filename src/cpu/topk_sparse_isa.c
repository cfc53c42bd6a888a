/* Generic source of the sparse renorm_both path (topk.h, docs/MATH.md section 8), compiled once
 * per ISA of the registry, scalar included (isa.h; KD_SFX names the entry points). The work is dot
 * products and axpys over the hidden size: plain loops that the compiler vectorizes for the
 * file's instruction set (omp simd), in a fixed order, so each path is deterministic. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "omp_team.h"
#include "topk.h"
#include "topk_row.h"

/* Hidden columns per OpenMP block of the scatter. */
#define TS_HBLOCK 128
/* Below this many multiply-adds a chunk runs on the calling thread (as KD_FLD_PAR_MIN). */
#define TS_PAR_MIN (1 << 16)

static inline float KD_SFX(dot)(const float *x, const char *w, int bf16, int64_t n) {
    float s = 0.0f;
    if (bf16) {
        const uint16_t *b = (const uint16_t *)w;
#pragma omp simd reduction(+ : s)
        for (int64_t h = 0; h < n; h++) s += x[h] * kd_bf16_to_f32(b[h]);
    } else {
        const float *f = (const float *)w;
#pragma omp simd reduction(+ : s)
        for (int64_t h = 0; h < n; h++) s += x[h] * f[h];
    }
    return s;
}

/* y[0..n) += c w[0..n), w fp32 or bf16. */
static inline void KD_SFX(axpy)(float *y, float c, const char *w, int bf16, int64_t n) {
    if (bf16) {
        const uint16_t *b = (const uint16_t *)w;
#pragma omp simd
        for (int64_t h = 0; h < n; h++) y[h] += c * kd_bf16_to_f32(b[h]);
    } else {
        const float *f = (const float *)w;
#pragma omp simd
        for (int64_t h = 0; h < n; h++) y[h] += c * f[h];
    }
}

/* The student's row i of the chunk as fp32. */
static inline const float *KD_SFX(x_row)(const kd_topk_sparse *a, int64_t i) {
    return a->x32 ? a->x32 + i * a->hs : (const float *)a->xs + (a->row0 + i) * a->ldx;
}

/* Row i: the selected logits, the row loss, gk = d loss / d zs_k, col[] ended by -1 (col[K] is
 * the row kernels' count slot, unused here), dxs row. */
static void KD_SFX(row)(const kd_topk_sparse *a, int64_t i) {
    int64_t r = a->row0 + i, kk = a->topk->k, hs = a->hs, n = 0;
    int bf16 = a->xdt == KDLOSS_BF16;
    size_t es = bf16 ? 2 : 4;
    int64_t *col = (int64_t *)(a->tk + (size_t)i * kd_topk_row_scratch(kk));
    float *zk = (float *)(col + kk + 1), *lp = zk + kk, *gk = lp + kk;
    const float *x = KD_SFX(x_row)(a, i);
    int kept = (!a->labels.data || kd_label_at(a->labels, r) != a->ignore_index) &&
               kd_row_weight_keeps(a->w, r);
    float gs = a->w ? a->gs * a->w[r] : a->gs; /* the row's weight scales its gradient */
    int is64 = a->topk->ids.dtype == KDLOSS_I64;
    for (int64_t j = 0; kept && j < kk; j++) {
        int64_t id = kd_topk_id(a->topk->ids.data, is64, a->topk->ids.ld, r, j);
        if (id < 0) continue;
        col[n] = id;
        lp[n] = kd_topk_logprob(a->topk, r, j);
        zk[n] = KD_SFX(dot)(x, a->ws + (size_t)(id * a->ldw) * es, bf16, hs) + (a->bs ? a->bs[id] : 0.0f);
        n++;
    }
    for (int64_t k = n; k < kk; k++) col[k] = -1;
    double c_rest;
    a->row_soft[i] = kd_topk_row(&a->coef, KD_TAIL_RENORM_BOTH, n, zk, lp, a->inv_t, -INFINITY,
                                 gk, &c_rest);
    for (int64_t k = 0; k < n; k++) gk[k] = gs != 0.0f ? gk[k] * gs : 0.0f; /* 0: zeros */
    /* col[K] (the count slot, unused here): 1 for a poisoned row (kd_topk_row's NaN c_rest) with
     * a gradient, whose dws / dbs the caller then fills with NaN (the dense path's NaN dz row) */
    col[kk] = gs != 0.0f && isnan(c_rest);
    if (!a->dxs.data) return;
    float *d = bf16 ? a->d32 + i * hs : (float *)a->dxs.data + r * a->dxs.ld;
    memset(d, 0, (size_t)hs * sizeof(float));
    /* a factor of 0 writes zeros: no axpy (0 x a NaN weight would be NaN) */
    for (int64_t k = 0; gs != 0.0f && k < n; k++)
        KD_SFX(axpy)(d, gk[k], a->ws + (size_t)(col[k] * a->ldw) * es, bf16, hs);
}

void KD_SFX(kd_topk_sparse_rows)(const kd_topk_sparse *a) {
    if (a->n > 1 && a->n * a->topk->k * a->hs >= TS_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++) KD_SFX(row)(a, i);
    } else {
        for (int64_t i = 0; i < a->n; i++) KD_SFX(row)(a, i);
    }
}

/* dws[id][h0, h1) += gk xs_row[h0, h1) over the chunk's rows and slots in order. */
static void KD_SFX(scatter_block)(const kd_topk_sparse *a, int64_t h0) {
    int64_t kk = a->topk->k, h1 = h0 + TS_HBLOCK < a->hs ? h0 + TS_HBLOCK : a->hs;
    for (int64_t i = 0; i < a->n; i++) {
        const int64_t *col = (const int64_t *)(a->tk + (size_t)i * kd_topk_row_scratch(kk));
        const float *gk = (const float *)(col + kk + 1) + 2 * kk, *x = KD_SFX(x_row)(a, i) + h0;
        for (int64_t k = 0; k < kk && col[k] >= 0; k++)
            KD_SFX(axpy)(a->dws + col[k] * a->ldd + h0, gk[k], (const char *)x, 0, h1 - h0);
    }
}

void KD_SFX(kd_topk_sparse_scatter)(const kd_topk_sparse *a) {
    int64_t kk = a->topk->k;
    if (a->dws) {
        if (a->n * kk * a->hs >= TS_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
            for (int64_t h0 = 0; h0 < a->hs; h0 += TS_HBLOCK) KD_SFX(scatter_block)(a, h0);
        } else {
            for (int64_t h0 = 0; h0 < a->hs; h0 += TS_HBLOCK) KD_SFX(scatter_block)(a, h0);
        }
    }
    if (!a->dbs) return;
    for (int64_t i = 0; i < a->n; i++) {
        const int64_t *col = (const int64_t *)(a->tk + (size_t)i * kd_topk_row_scratch(kk));
        const float *gk = (const float *)(col + kk + 1) + 2 * kk;
        for (int64_t k = 0; k < kk && col[k] >= 0; k++) a->dbs[col[k]] += gk[k];
    }
}
