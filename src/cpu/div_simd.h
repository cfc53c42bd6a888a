/* The divergence family on vectors: div_elem.h's formulas (the same ones the scalar path and
 * CUDA run, src/common/div_math.h) with the SIMD layer's operations, lane by lane in the same
 * order of operations, so the scalar path (tested against the double reference) and the vector
 * paths agree to a few ULP. Plus the KLDivLoss probability-target element. Include after simd.h. */
#ifndef KDLOSS_DIV_SIMD_H
#define KDLOSS_DIV_SIMD_H

#include "div_math.h"
#include "simd.h"

/* Broadcast constants of one call (div_coef.h). */
typedef struct kd_vdiv {
    int op;
    vf ca, cb, wa, wb;
} kd_vdiv;

KD_INLINE kd_vdiv kd_vdiv_make(kd_div_coef c) {
    kd_vdiv k;
    k.op = c.op;
    k.ca = vf_set1(c.ca);
    k.cb = vf_set1(c.cb);
    k.wa = vf_set1(c.wa);
    k.wb = vf_set1(c.wb);
    return k;
}

/* ---- the family on vectors: div_elem.h with vf operations ---- */
#define KDE_T vf
#define KDE_M vm
#define KDE_K kd_vdiv
#define KDE(name) kd_v_##name
#define KDE_FN KD_INLINE
#define KE_ADD vf_add
#define KE_SUB vf_sub
#define KE_MUL vf_mul
#define KE_DIV vf_div
#define KE_MIN vf_min
#define KE_MAX vf_max
#define KE_ABS vf_abs
#define KE_NEG vf_neg
#define KE_EXP vf_exp
#define KE_EXP_NONPOS vf_exp_nonpos /* cheaper exp for x <= 0 (vmath.h) */
#define KE_EXP_NONNAN vf_exp_nonnan /* cheaper exp for non-NaN x (vmath.h) */
#define KE_EXP_IN vf_exp_in         /* exp without a clamp, x in [-110, 89] (vmath.h) */
#define KE_NABS_MIN vf_nabs_min
#define KE_LOG1P_UNIT vf_log1p_unit
#define KE_C(c) vf_set1(c)
#define KE_GT vm_gt
#define KE_GE vm_ge
#define KE_LT(a, b) vm_gt(b, a)
#define KE_SEL vf_select
#define KE_KEEP vf_keep
#include "div_elem.h"
/* ... and again with the probabilities given (kd_vpq_fwd, ...: the logits kernel's form) */
#undef KDE
#define KDE(name) kd_vpq_##name
#define KDE_PQ 1
#include "div_elem.h"
#undef KDE_PQ
#include "div_elem_end.h"

/* KLDivLoss element with probability target: t (log(max(t, eps)) - y), 0 where t == 0; grad -t. */
KD_INLINE vf kd_vkl_prob(vf y, vf t, vf eps, vf *grad) {
    *grad = vf_neg(t);
    return vf_keep(vm_ne(t, vf_zero()), vf_mul(t, vf_sub(vf_log(vf_max(t, eps)), y)));
}

/* The same with eps >= FLT_MIN, so log's argument is always a normal float (or inf). */
KD_INLINE vf kd_vkl_prob_normal(vf y, vf t, vf eps, vf *grad) {
    *grad = vf_neg(t);
    return vf_keep(vm_ne(t, vf_zero()), vf_mul(t, vf_sub(vf_log_normal(vf_max(t, eps)), y)));
}

#endif
