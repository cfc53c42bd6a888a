/* The careful form of a dense row on the GPU, for the rows the fast passes cannot serve
 * (non-finite entries and wide rows, docs/MATH.md section 10): src/common/row_wide.h's
 * formulas, which the CPU's src/cpu/row_special.h uses too, run by a whole block in double.
 * Used by distill_logits.cu, fld.cu and fld_vp.cu; everything here is inline device code. */
#ifndef KDLOSS_ROW_SPECIAL_CUH
#define KDLOSS_ROW_SPECIAL_CUH

#include "div_math.h"
#include "row_wide.h" /* kd_row_wide, kd_wide_lp, kd_wide_dz: the CPU's too */
#include "kd_cuda.cuh"

/* Wide rows: the fast passes form (z - m) / T as (z - m) * (1/T) in fp32, and z - m rounds to
 * -inf once m - z >= 2^128 - 2^103, which needs a row maximum m >= 2^103 (z >= -FLT_MAX):
 * rows whose maximum is >= 2^102 (kd_row_wide) go through ((double)z - m) * (1/T), exact to
 * double rounding and never overflowing, each log-prob rounded to fp32 once.
 *
 * Poisoned rows (the NaN policy, kdloss.h): a NaN or +inf logit makes the row's normalizer NaN
 * (exp of NaN, or of inf - inf); the row's divergence and its sum of g are then NaN, so every
 * gradient element gs (g - Q sum g) is NaN too. A gradient factor of 0 writes zeros. */

#ifdef __CUDACC__
/* f(c, z) for each column c of a row of v, one column a thread (blockDim.x apart): the careful
 * form's passes, which are rare, read element by element. */
template <class F>
__device__ __forceinline__ void kd_cu_each(int64_t v, const F &f) {
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) f(c);
}
#endif /* __CUDACC__ */

#endif /* KDLOSS_ROW_SPECIAL_CUH */
