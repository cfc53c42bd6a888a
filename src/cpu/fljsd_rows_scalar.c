/* Portable scalar row kernel of the fused-linear distillation loss: the same four passes as
 * fljsd_rows_impl.h in the same order of operations, one element at a time, with libm and the
 * per-element JSD of div_math.h. It is the path every machine has, and the one the vector
 * paths are compared against in the tests. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "div_math.h"
#include "fljsd_rows.h"

/* Adds the bias (when given) to z[0..v) in place and returns the row max. */
static float fold_max(float *z, const float *b, int64_t v) {
    float m = -INFINITY;
    for (int64_t c = 0; c < v; c++) {
        if (b) z[c] += b[c];
        m = fmaxf(m, z[c]);
    }
    return m;
}

/* sum over the row of exp((z - m) s): fp32 within a tile, double across tiles. */
static double sum_exp(const float *z, int64_t v, float m, float s) {
    double sum = 0.0;
    for (int64_t t0 = 0; t0 < v; t0 += KD_FLJSD_TILE) {
        int64_t t1 = v - t0 > KD_FLJSD_TILE ? t0 + KD_FLJSD_TILE : v;
        float acc = 0.0f;
        for (int64_t c = t0; c < t1; c++) acc += expf((z[c] - m) * s);
        sum += (double)acc;
    }
    return sum;
}

/* Pass 3: the row's divergence on X = (zs - ms) it - lss, Y = (zt - mt) it - lst; when store_g,
 * g = dJSD/dX goes over zt and its row sum to *sum_g. */
static double div_pass(const kd_div_coef *k, const float *zs, float *zt, int64_t v, float ms, float mt,
                       float it, float lss, float lst, int store_g, double *sum_g) {
    double loss = 0.0, gsum = 0.0;
    for (int64_t t0 = 0; t0 < v; t0 += KD_FLJSD_TILE) {
        int64_t t1 = v - t0 > KD_FLJSD_TILE ? t0 + KD_FLJSD_TILE : v;
        float lacc = 0.0f, gacc = 0.0f;
        for (int64_t c = t0; c < t1; c++) {
            float g, x = (zs[c] - ms) * it - lss, y = (zt[c] - mt) * it - lst;
            lacc += kd_div_elem(k, x, y, &g);
            if (store_g) {
                zt[c] = g;
                gacc += g;
            }
        }
        loss += (double)lacc;
        gsum += (double)gacc;
    }
    *sum_g = gsum;
    return loss;
}

/* z = c1 exp((z - m1) s1 - l1) + c2 exp(z - m2 - l2): the sparse teacher's gradient pass. */
static void rest_grad(float *z, int64_t v, float c1, float m1, float s1, float l1, float c2,
                      float m2, float l2) {
    for (int64_t c = 0; c < v; c++) {
        float d = 0.0f;
        if (c1 != 0.0f) d = c1 * expf((z[c] - m1) * s1 - l1);
        if (c2 != 0.0f) d += c2 * expf((z[c] - m2) - l2);
        z[c] = d;
    }
}

#define TK_ROW topk_row
#define TK_FOLD_MAX fold_max
#define TK_SUM_EXP sum_exp
#define TK_REST_GRAD rest_grad
#include "fljsd_topk_impl.h"

/* Everything for row i of the chunk. */
static void one_row(const kd_fljsd_rows *a, int64_t i) {
    if (a->topk) {
        topk_row(a, i);
        return;
    }
    int64_t v = a->v;
    float *zs = a->zs + i * v;
    float *zt = a->soft ? a->zt + i * v : NULL;
    int64_t y = a->labels.data ? kd_label_at(a->labels, a->row0 + i) : -1;
    a->row_soft[i] = 0.0;
    a->row_hard[i] = 0.0;
    if (a->row_lse) a->row_lse[i] = 0.0f;
    if (a->labels.data && y == a->ignore_index) {
        if (a->grad) memset(zs, 0, (size_t)v * sizeof(float));
        return;
    }
    float it = a->inv_t;
    float ms = fold_max(zs, a->bs, v);
    float mt = a->soft ? fold_max(zt, a->bt, v) : 0.0f;
    float zy = a->hard ? zs[y] : 0.0f; /* labels exist when the cross-entropy is on */
    double lss = a->soft ? log(sum_exp(zs, v, ms, it)) : 0.0;
    double lst = a->soft ? log(sum_exp(zt, v, mt, it)) : 0.0;
    int share = a->soft && it == 1.0f; /* softmax(zs) = softmax(zs/T) */
    double lsh = !a->hard ? 0.0 : share ? lss : log(sum_exp(zs, v, ms, 1.0f));
    if (a->hard) a->row_hard[i] = ((double)ms - (double)zy) + lsh;
    if (a->row_lse) a->row_lse[i] = (float)((double)ms + lsh);
    double sum_g = 0.0;
    int store_g = a->grad && a->gs != 0.0f;
    if (a->soft)
        a->row_soft[i] = div_pass(&a->coef, zs, zt, v, ms, mt, it, (float)lss, (float)lst, store_g,
                                  &sum_g);
    if (!a->grad) return;
    /* pass 4: dzs = gs (g - q sum_g) + gh p, q = softmax(zs/T), p = softmax(zs) */
    float sg = (float)sum_g, flss = (float)lss, flsh = (float)lsh;
    int share_q = share && a->gs != 0.0f;
    for (int64_t c = 0; c < v; c++) {
        float d = 0.0f, q = 0.0f;
        if (a->gs != 0.0f) {
            q = expf((zs[c] - ms) * it - flss);
            d = a->gs * (zt[c] - q * sg);
        }
        if (a->gh != 0.0f) d += a->gh * (share_q ? q : expf((zs[c] - ms) - flsh));
        zs[c] = d;
    }
    if (a->gh != 0.0f) zs[y] -= a->gh;
}

void kd_fljsd_rows_scalar(const kd_fljsd_rows *a) {
    /* no parallel region at all when serial: libgomp mallocs a team for an if(0) region */
    if (a->n > 1 && a->n * a->v >= KD_FLJSD_PAR_MIN) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++) one_row(a, i);
    } else {
        for (int64_t i = 0; i < a->n; i++) one_row(a, i);
    }
}
