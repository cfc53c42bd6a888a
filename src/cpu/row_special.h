/* The careful scalar form of a dense row's V-wide passes, for the rows the fast kernels cannot
 * serve (docs/MATH.md section 10). Included by fld_row_phases.h (scalar and vector
 * fused rows) and logits_rows_vec.c (the vector logits kernel); each TU gets its own static copy. */
#ifndef KDLOSS_ROW_SPECIAL_H
#define KDLOSS_ROW_SPECIAL_H

/* Wide rows: the fast passes form the tempered differences as (z - m) * it in fp32. z - m rounds
 * to -inf only when m - z >= 2^128 - 2^103, and z >= -FLT_MAX, so only a row maximum m >= 2^103
 * can do it (KD_ROW_WIDE: 2^102, with margin). Such a row (logits spanning more than FLT_MAX) is
 * formed here in double, (double)z - m being exact to double rounding and never overflowing:
 * X = (float)(((double)zs - ms) it - lss), the same X the fast form gives wherever that one does
 * not overflow (to fp32 rounding). X itself rounds to -inf only when the tempered span exceeds
 * FLT_MAX (T < 2), where no fp32 can hold it.
 *
 * Poisoned rows (the NaN policy, kdloss.h): a NaN or +inf logit makes the row's normalizer NaN
 * (exp of NaN, or of inf - inf), which the callers test once per row; the row's divergence and
 * its sum of g are then NaN, so that every gradient element gs (g - Q sum g) is NaN too
 * (0 * NaN is NaN). A gradient factor of 0 still writes zeros. */

#include <math.h>
#include <stdint.h>

#include "div_math.h"
#include "row_wide.h" /* kd_row_wide, kd_wide_lp, kd_wide_dz: shared with CUDA */

/* sum over the row of exp(((double)z - m) s), in double. */
static inline double kd_wide_sum_exp(const float *z, int64_t v, double m, double s) {
    double sum = 0.0;
    for (int64_t c = 0; c < v; c++) sum += exp(((double)z[c] - m) * s);
    return sum;
}

/* kd_wide_sum_exp, and into *ent the sum of the entropy elements -e^u u, u = ((double)z - m) s
 * (docs/MATH.md section 12; 0 where e^u is 0). */
static inline double kd_wide_sum_exp_ent(const float *z, int64_t v, double m, double s,
                                         double *ent) {
    double sum = 0.0, h = 0.0;
    for (int64_t c = 0; c < v; c++) {
        double u = ((double)z[c] - m) * s, e = exp(u);
        sum += e;
        if (e > 0.0) h -= e * u;
    }
    *ent = h;
    return sum;
}

/* The divergence's terms on X = ((double)zs - ms) it - lss, Y = ((double)zt - mt) it - lst
 * (each rounded to fp32 once, then div_math.h's element): returns their sum; when g is not
 * NULL, g = dD/dX there (g may be zt) and its sum into *sum_g. */
static inline double kd_wide_div(const kd_div_coef *k, const float *zs, const float *zt,
                                 float *g, int64_t v, double ms, double mt, double it,
                                 double lss, double lst, double *sum_g) {
    double loss = 0.0, gsum = 0.0;
    for (int64_t c = 0; c < v; c++) {
        float gc, x = kd_wide_lp(zs[c], ms, it, lss), y = kd_wide_lp(zt[c], mt, it, lst);
        loss += (double)kd_div_elem(k, x, y, &gc);
        if (g) {
            g[c] = gc;
            gsum += (double)gc;
        }
    }
    *sum_g = gsum;
    return loss;
}

#endif /* KDLOSS_ROW_SPECIAL_H */
