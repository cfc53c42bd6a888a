/* The careful form of a dense row's elements, for the rows the fast passes cannot serve
 * (docs/MATH.md section 10), written once for the CPU (src/cpu/row_special.h) and the CUDA
 * kernels (src/cuda/row_special.cuh), host and device.
 *
 * The fast passes form (z - m) / T as (z - m) * (1/T) in fp32, and z - m rounds to -inf once
 * m - z >= 2^128 - 2^103, which needs a row maximum m >= 2^103 (z >= -FLT_MAX): rows whose
 * maximum is >= 2^102 (kd_row_wide, with margin) take ((double)z - m) * (1/T), exact to double
 * rounding and never overflowing, each log-prob rounded to fp32 once. */
#ifndef KDLOSS_ROW_WIDE_H
#define KDLOSS_ROW_WIDE_H

#include "div_math.h" /* KD_HDM */

#define KD_ROW_WIDE 0x1p102f

/* 1 if a row whose maximum is m needs the careful form (a NaN maximum too: it then carries the
 * NaN through). -inf (a row of -inf logits) does not. */
KD_HDM int kd_row_wide(float m) { return !(m < KD_ROW_WIDE); }

/* A log-prob in the careful form: ((double)z - m) it - ls, rounded to fp32 once. */
KD_HDM float kd_wide_lp(float z, double m, double it, double ls) {
    return (float)(((double)z - m) * it - ls);
}

/* One gradient element gs (g - Q sum_g) + gh p at logit z, Q = e^(((double)z - ms) it - lss),
 * p = e^((double)z - ms - lsh) (Q when share). A factor of 0 contributes nothing (so a poisoned
 * row's gradient is 0 at factor 0, NaN otherwise). */
KD_HDM float kd_wide_dz(float z, float g, double ms, double it, double lss, double sum_g,
                        float gs, float gh, double lsh, int share) {
    double q = 0.0, d = 0.0;
    if (gs != 0.0f) {
        q = exp(((double)z - ms) * it - lss);
        d = (double)gs * ((double)g - q * sum_g);
    }
    if (gh != 0.0f) d += (double)gh * (share ? q : exp(((double)z - ms) - lsh));
    return (float)d;
}

#endif /* KDLOSS_ROW_WIDE_H */
