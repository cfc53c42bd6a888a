/* Vector twins of src/common/div_math.h: the same formulas, lane by lane, in the same order of
 * operations, so the scalar path (tested against the double reference) and the vector paths
 * agree to a few ULP. Include after simd.h. */
#ifndef KDLOSS_DIV_SIMD_H
#define KDLOSS_DIV_SIMD_H

#include "div_math.h"
#include "simd.h"

/* Broadcast constants of one JSD call. */
typedef struct kd_vjsd {
    int mode;
    vf neg_log_b, neg_log_1mb;
} kd_vjsd;

KD_INLINE kd_vjsd kd_vjsd_make(kd_jsd_coef c) {
    kd_vjsd k;
    k.mode = c.mode;
    k.neg_log_b = vf_set1(c.neg_log_b);
    k.neg_log_1mb = vf_set1(c.neg_log_1mb);
    return k;
}

/* Forward KL, P (y - x); grad -P. */
KD_INLINE vf kd_vjsd_fwd(vf x, vf y, vf *grad) {
    vf p = vf_exp(y);
    *grad = vf_neg(p);
    return vf_keep(vm_gt(p, vf_zero()), vf_mul(p, vf_sub(y, x)));
}

/* Reverse KL, Q (x - y); grad Q (x - y + 1). */
KD_INLINE vf kd_vjsd_rev(vf x, vf y, vf *grad) {
    vf q = vf_exp(x);
    vm pos = vm_gt(q, vf_zero());
    vf diff = vf_sub(x, y);
    *grad = vf_keep(pos, vf_mul(q, vf_add(diff, vf_set1(1.0f))));
    return vf_keep(pos, vf_mul(q, diff));
}

/* Mixed beta in (0, 1): see div_math.h for the derivation. The terms stay in the softplus form
 * (-log beta - softplus(-d), not y - log M): it is stationary in d, so the rounding of a, b and d
 * does not reach the loss to first order (the y - log M form, 3 operations shorter, measured a
 * 10x larger loss error at beta 0.1 / 0.9). */
KD_INLINE vf kd_vjsd_mix(const kd_vjsd *k, vf x, vf y, vf *grad) {
    vf a = vf_sub(y, k->neg_log_b), b = vf_sub(x, k->neg_log_1mb);
    vf d = vf_sub(a, b), m = vf_max(a, b);
    vf e = vf_exp_nonpos(vf_neg(vf_abs(d)));
    vf s = vf_log1p_unit(e);
    vf em = vf_exp_nonnan(m), eme = vf_mul(em, e);
    vm age = vm_ge(a, b);
    vf wa = vf_select(age, em, eme), wb = vf_select(age, eme, em);
    vf zero = vf_zero();
    /* s - min(d, 0) is max(-d, 0) + s of div_math.h, bit for bit, without the negation */
    vf ta = vf_keep(vm_gt(wa, zero), vf_mul(wa, vf_sub(k->neg_log_b, vf_sub(s, vf_min(d, zero)))));
    vf tb = vf_keep(vm_gt(wb, zero), vf_mul(wb, vf_sub(k->neg_log_1mb, vf_add(vf_max(d, zero), s))));
    *grad = tb;
    return vf_add(ta, tb);
}

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

/* KLDivLoss element with log target: e^t (t - y), 0 where e^t == 0; grad -e^t. */
KD_INLINE vf kd_vkl_log(vf y, vf t, vf *grad) {
    vf et = vf_exp(t);
    *grad = vf_neg(et);
    return vf_keep(vm_gt(et, vf_zero()), vf_mul(et, vf_sub(t, y)));
}

#endif
