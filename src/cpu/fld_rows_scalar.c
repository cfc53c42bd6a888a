/* Portable scalar row kernel of the fused-linear distillation loss: the same four passes as
 * fld_rows_vec.c in the same order of operations, one element at a time, with libm and the
 * per-element JSD of div_math.h. It is the path every machine has, and the one the vector
 * paths are compared against in the tests. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "div_math.h"
#include "fld_rows.h"

/* Adds the bias (when given) to z[0..v) in place and returns the row max. */
static float fold_max(float *z, const float *b, int64_t v) {
    float m = -INFINITY;
    for (int64_t c = 0; c < v; c++) {
        if (b) z[c] += b[c];
        m = fmaxf(m, z[c]);
    }
    return m;
}

/* z = map(z + b) in place (logit_map.h; b may be NULL). */
static void map_row(float *z, const float *b, int64_t v, const kd_logit_map *m) {
    for (int64_t c = 0; c < v; c++) z[c] = kd_map_z(m, b ? z[c] + b[c] : z[c]);
}

/* sum over the row of exp((z - m) s), in double: one scalar accumulator would sum a tile's 1024
 * terms in sequence, whose fp32 error (up to ~1000 u of the terms' magnitude, where the vector
 * paths' 16 lanes sum 64 each) the tests' bounds do not allow for. */
static double sum_exp(const float *z, int64_t v, float m, float s) {
    double sum = 0.0;
    for (int64_t c = 0; c < v; c++) sum += (double)expf((z[c] - m) * s);
    return sum;
}

/* sum_exp (the same sum), and into *ent the sum of the entropy elements -e^u u at u = (z - m) s
 * (div_math.h's kd_s_entropy, from the same exp): one multiply-add more an element. */
static double sum_exp_ent(const float *z, int64_t v, float m, float s, double *ent) {
    double sum = 0.0, h = 0.0;
    for (int64_t c = 0; c < v; c++) {
        float u = (z[c] - m) * s, e = expf(u);
        sum += (double)e;
        h += (double)kd_s_entropy(u, e);
    }
    *ent = h;
    return sum;
}

/* Pass 3: the row's divergence on X = (zs - ms) it - lss, Y = (zt - mt) it - lst; when store_g,
 * g = dJSD/dX goes over zt and its row sum to *sum_g. Sums in double (see sum_exp). */
static double div_pass(const kd_div_coef *k, const float *zs, float *zt, int64_t v, float ms, float mt,
                       float it, float lss, float lst, int store_g, double *sum_g) {
    double loss = 0.0, gsum = 0.0;
    for (int64_t c = 0; c < v; c++) {
        float g, x = (zs[c] - ms) * it - lss, y = (zt[c] - mt) * it - lst;
        loss += (double)kd_div_elem(k, x, y, &g);
        if (store_g) {
            zt[c] = g;
            gsum += (double)g;
        }
    }
    *sum_g = gsum;
    return loss;
}

/* Pass 4 over v columns of a dense row: dzs = gs (g - q sum_g) + gh p, q = softmax(zs/T),
 * p = softmax(zs). */
static void grad_pass(const kd_fld_rows *a, float *zs, const float *zt, int64_t v, float ms,
                      float lss, double sum_g, float lsh, int share) {
    float sg = (float)sum_g, it = a->inv_t;
    for (int64_t c = 0; c < v; c++) {
        float d = 0.0f, q = 0.0f;
        if (a->gs != 0.0f) {
            q = expf((zs[c] - ms) * it - lss);
            d = a->gs * (zt[c] - q * sg);
        }
        if (a->gh != 0.0f) d += a->gh * (share ? q : expf((zs[c] - ms) - lsh));
        zs[c] = d;
    }
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

#define PH(name) ph_##name
#define PH_CTX kd_div_coef
#define PH_FOLD_MAX fold_max
#define PH_MAP map_row
#define PH_SUM_EXP sum_exp
#define PH_SUM_EXP_ENT sum_exp_ent
#define PH_DIV(a, k, zs, zt, ms, mt, lss, lst, store_g, sum_g)                                 \
    div_pass(k, zs, zt, (a)->v, ms, mt, (a)->inv_t, lss, lst, store_g, sum_g)
#define PH_GRAD grad_pass
#define PH_REST_GRAD rest_grad
#include "fld_row_phases.h"

void kd_fld_rows_scalar(const kd_fld_rows *a) {
    /* no parallel region at all when serial: libgomp mallocs a team for an if(0) region */
    if (ph_parallel(a)) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++)
            for (int ph = 1; ph <= 4; ph++) ph_phase(a, &a->coef, ph, i);
    } else {
        for (int64_t i = 0; i < a->n; i++)
            for (int ph = 1; ph <= 4; ph++) ph_phase(a, &a->coef, ph, i);
    }
}

void kd_fld_rows_phase_scalar(const kd_fld_rows *a, int ph) {
    if (ph_parallel(a)) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++) ph_phase(a, &a->coef, ph, i);
    } else {
        for (int64_t i = 0; i < a->n; i++) ph_phase(a, &a->coef, ph, i);
    }
}
