/* The careful form of a dense row on the GPU, for the rows the fast passes cannot serve (issue
 * 25, D4 and D6; docs/MATH.md 10): the CPU's src/cpu/row_special.h, element for element, run by
 * a whole block (one block a row) in double. Used by distill_logits.cu, fused_linear_jsd.cu
 * and fld_vp.cu; everything here is inline device code.
 *
 * Wide rows: the fast passes form (z - m) / T as (z - m) * (1/T) in fp32, and z - m rounds to
 * -inf once m - z >= 2^128 - 2^103, which needs a row maximum m >= 2^103 (z >= -FLT_MAX):
 * rows whose maximum is >= 2^102 (kd_cu_row_wide) go through ((double)z - m) * (1/T), exact to
 * double rounding and never overflowing, each log-prob rounded to fp32 once.
 *
 * Poisoned rows (the NaN policy, kdloss.h): a NaN or +inf logit makes the row's normalizer NaN
 * (exp of NaN, or of inf - inf); the row's divergence and its sum of g are then NaN, so every
 * gradient element gs (g - Q sum g) is NaN too. A gradient factor of 0 writes zeros. */
#ifndef KDLOSS_ROW_SPECIAL_CUH
#define KDLOSS_ROW_SPECIAL_CUH

#include "div_math.h"
#include "kd_cuda.cuh"

/* 2^102 (exact as a decimal float literal): KD_ROW_WIDE of src/cpu/row_special.h. */
#define KD_CU_ROW_WIDE 5.0706024009129176059868128215e30f

#ifdef __CUDACC__
/* 1 if a row whose maximum is m needs the careful form (a NaN maximum too); -inf does not. */
__device__ __forceinline__ bool kd_cu_row_wide(float m) { return !(m < KD_CU_ROW_WIDE); }

/* A log-prob in the careful form: ((double)z - m) it - ls, rounded to fp32 once. */
__device__ __forceinline__ float kd_cu_wide_lp(float z, double m, double it, double ls) {
    return (float)(((double)z - m) * it - ls);
}

/* One gradient element gs (g - Q sum_g) + gh p at logit z, Q = e^(((double)z - ms) it - lss),
 * p = e^((double)z - ms - lsh) (Q when share): kd_wide_dz of row_special.h. A factor of 0
 * contributes nothing (so a poisoned row's gradient is 0 at factor 0, NaN otherwise). */
__device__ __forceinline__ float kd_cu_wide_dz(float z, float g, double ms, double it, double lss,
                                               double sum_g, float gs, float gh, double lsh,
                                               bool share) {
    double q = 0.0, d = 0.0;
    if (gs != 0.0f) {
        q = exp(((double)z - ms) * it - lss);
        d = (double)gs * ((double)g - q * sum_g);
    }
    if (gh != 0.0f) d += (double)gh * (share ? q : exp(((double)z - ms) - lsh));
    return (float)d;
}

/* f(c, z) for each column c of a row of v, one column a thread (blockDim.x apart): the careful
 * form's passes, which are rare, read element by element. */
template <class F>
__device__ __forceinline__ void kd_cu_each(int64_t v, const F &f) {
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) f(c);
}
#endif /* __CUDACC__ */

#endif /* KDLOSS_ROW_SPECIAL_CUH */
