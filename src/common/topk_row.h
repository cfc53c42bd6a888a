/* One row of the sparse top-k teacher loss (docs/MATH.md section 8), written once for every
 * path: the CPU row kernels (scalar, AVX2, AVX-512), the sparse renorm_both path and the CUDA
 * kernels all call kd_topk_row() on the row's |S| gathered values.
 *
 * The caller does the V-wide work (the row max, and R = lse(u_j : j not in S), the student's
 * tempered log-sum-exp over the columns outside S, from a max and a sum-exp over the row with S
 * masked) and the V-wide gradient pass; this file does everything that touches only S: the
 * normalizers, the teacher's tail, the element terms of the chosen divergence (div_math.h) and
 * the per-slot gradients. Normalizers and sums are in double; each element term in fp32, as in
 * the dense kernels. */
#ifndef KDLOSS_TOPK_ROW_H
#define KDLOSS_TOPK_ROW_H

#include <math.h>
#include <stdint.h>

#include "div_math.h"

/* The tail modes (the values of kdloss_topk_tail). */
enum { KD_TAIL_BUCKET = 0, KD_TAIL_RENORM_BOTH = 1, KD_TAIL_RENORM_TEACHER = 2 };

/* The smallest teacher tail mass the bucket uses: 2^-126, the smallest normal fp32 (see MATH.md 8). */
#define KD_TOPK_TAIL_FLOOR 0x1p-126

/* Id in slot j of row r of an (BT x K) id matrix of dtype I32 or I64 with leading dimension ld. */
KD_HDM int64_t kd_topk_id(const void *ids, int is64, int64_t ld, int64_t r, int64_t j) {
    return is64 ? ((const int64_t *)ids)[r * ld + j] : (int64_t)((const int32_t *)ids)[r * ld + j];
}

/* log sum exp of v[0..n) * s in double; -inf when n == 0 or every term is -inf; NaN when a
 * term is NaN (fmax would drop it) or +inf. */
KD_HDM double kd_topk_lse(const float *v, int64_t n, double s) {
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double u = (double)v[j] * s;
        if (isnan(u)) return u;
        m = fmax(m, u);
    }
    if (m == -INFINITY) return -INFINITY;
    for (int64_t j = 0; j < n; j++) sum += exp((double)v[j] * s - m);
    return m + log(sum);
}

/* log(a + b) from log a and log b, either may be -inf; NaN when either is (fmax would drop it). */
KD_HDM double kd_topk_logaddexp(double la, double lb) {
    if (isnan(la) || isnan(lb)) return la + lb;
    double m = fmax(la, lb);
    if (m == -INFINITY) return -INFINITY;
    return m + log(exp(la - m) + exp(lb - m));
}

/*
 * One row. Inputs:
 *   n         |S|, the used slots (compacted, in slot order)
 *   zk [n]    the student's logits at S (bias added), untempered
 *   lp [n]    the teacher's log-probs at S (fp32)
 *   inv_t     1 / T rounded to fp32 (as the V-wide passes use it): a float times a float is
 *             exact in double, so u_k = zk inv_t is the same number however the compiler
 *             contracts it (an FMA in x_k = u_k - norm would otherwise see the unrounded
 *             product, and at large logits |u| 2^-53 against norm's rounding is a loss of O(1):
 *             found by the fuzzer with 1/T in double)
 *   rest_lse  R = log sum_{j not in S} exp(zs_j / T), -inf when S holds every id (bucket and
 *             renorm_teacher; renorm_both ignores it)
 * Outputs: returns the row's loss D; gk[k] = dD/du_k at each slot (u = zs / T); *c_rest the
 * coefficient of the columns outside S: dD/du_j = *c_rest * exp(u_j - R) there (0 for
 * renorm_both, and when there is no column outside S).
 * gk may not alias zk or lp.
 */
KD_HDM double kd_topk_row(const kd_div_coef *c, int tail, int64_t n, const float *zk,
                          const float *lp, double inv_t, double rest_lse, float *gk,
                          double *c_rest) {
    double it = inv_t;
    double lse_s = kd_topk_lse(zk, n, it);  /* lse(u_S) */
    double lse_p = kd_topk_lse(lp, n, 1.0); /* log sum_S P */
    int renorm_s = tail == KD_TAIL_RENORM_BOTH;
    int renorm_t = tail != KD_TAIL_BUCKET;
    int has_tail = tail == KD_TAIL_BUCKET && rest_lse > -INFINITY;
    *c_rest = 0.0;
    /* the NaN policy (kdloss.h): a NaN or +inf among the row's student logits (at S, or outside
     * it where the tail reads them: rest_lse) or its used slots' log-probs makes the row's loss,
     * every gk and the rest's coefficient NaN, so that the whole gradient row is (renorm_both
     * reads the student at S only; a row with no used slot still contributes 0). So does, under
     * renorm_both, a student whose logits at S are all -inf: its softmax over S is 0 / 0 (the
     * loss would be NaN, the slots' gradients NaN and the rest's coefficient 0, so the two
     * paths' dws, 0 x inf outside S on the full-vocabulary one, would differ) */
    if (n > 0 && (isnan(lse_s) || lse_s == INFINITY || isnan(lse_p) || lse_p == INFINITY ||
        (renorm_s && lse_s == -INFINITY) ||
        (!renorm_s && (isnan(rest_lse) || rest_lse == INFINITY)))) {
        for (int64_t k = 0; k < n; k++) gk[k] = NAN;
        *c_rest = NAN;
        return NAN;
    }
    /* an empty S, or a renormalized teacher with no mass on S: nothing to compare */
    if (n == 0 || (renorm_t && lse_p == -INFINITY)) {
        for (int64_t k = 0; k < n; k++) gk[k] = 0.0f;
        return 0.0;
    }
    /* the student's normalizer: over S alone (renorm_both) or over all V columns */
    double norm_s = renorm_s ? lse_s : kd_topk_logaddexp(lse_s, rest_lse);
    double norm_p = renorm_t ? lse_p : 0.0;
    double loss = 0.0, gsum = 0.0;
    for (int64_t k = 0; k < n; k++) {
        float g, x = (float)((double)zk[k] * it - norm_s), y = (float)((double)lp[k] - norm_p);
        loss += (double)kd_div_elem(c, x, y, &g);
        gk[k] = g;
        gsum += (double)g;
    }
    double g_tail = 0.0, q_tail = 0.0;
    if (has_tail) {
        double t = -expm1(lse_p); /* 1 - sum_S P, accurate where it is small */
        float g, x = (float)(rest_lse - norm_s);
        float y = (float)log(t > KD_TOPK_TAIL_FLOOR ? t : KD_TOPK_TAIL_FLOOR);
        loss += (double)kd_div_elem(c, x, y, &g);
        g_tail = (double)g;
        gsum += g_tail;
    }
    if (!renorm_s && rest_lse > -INFINITY) q_tail = exp(rest_lse - norm_s);
    for (int64_t k = 0; k < n; k++)
        gk[k] = (float)((double)gk[k] - exp((double)zk[k] * it - norm_s) * gsum);
    if (!renorm_s && rest_lse > -INFINITY) *c_rest = g_tail - q_tail * gsum;
    return loss;
}

#endif /* KDLOSS_TOPK_ROW_H */
