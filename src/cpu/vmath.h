/* kdloss's own vector exp, log, log1p and tanh, inlined into the kernels (included by simd.h):
 * a few ULP each, short dependency chains, no calls (SLEEF's out-of-line functions made the JSD
 * compute-bound: BENCHMARKS.md, "Vector exp / log: SLEEF versus our own").
 * Error bounds, checked by tests/vmath_check.h over dense sweeps against double libm:
 *   vf_exp        <= 2 ULP on [-87.3, 88.7], subnormal results within 1.5 steps; exp(-inf) = 0,
 *                 exp(+inf) = inf, NaN -> NaN; vf_exp_nonpos / _nonnan / _in: its bits, with
 *                 fewer clamps, on their domains
 *   vf_log        <= 2 ULP for x > 0 incl. subnormals; log(0) = -inf, log(<0) = NaN
 *   vf_log1p_unit <= 2 ULP on [0, 1];   vf_tanh <= 4 ULP, +-inf -> +-1 */
#ifndef KDLOSS_VMATH_H
#define KDLOSS_VMATH_H

/* exp: x = n ln2 + r, |r| <= ln2/2, with ln2 split in a 15-bit head (n r exact) and a tail;
 * AVX2: e^r by its degree-7 Taylor polynomial (truncation < 0.1 ULP, Estrin's scheme); 2^n as
 * two power-of-two factors so results down to the subnormals round once, correctly scaled.
 * AVX-512: a fitted degree-6 polynomial and vscalefps (see there).
 * log: x = 2^k m, m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact); log(1+f) = f - f^2/2 + f^3 P(f)
 * with a fitted degree-7 P (kd_vlog1p_core); k ln2 added in head/tail parts. */
#define KD_LN2_HI 0.693145751953125f        /* 0x3f317200: 15 significant bits */
#define KD_LN2_LO 1.428606820309417232e-06f /* ln2 - KD_LN2_HI */

#if defined(KD_LAYER_AVX512)
/* AVX-512: vscalefps applies 2^n to p with one correctly rounded result (also when it is
 * subnormal, and inf / 0 beyond the range), replacing the integer exponent arithmetic and the
 * two scaling multiplies; n = round(x / ln2) by adding and subtracting 1.5 * 2^23 (an FMA and a
 * subtraction, where vrndscaleps costs two uops after the multiply); e^r by 1 + r + r^2 Q(r), Q
 * of degree 4 fitted (relative-error weighted least squares on Chebyshev nodes, iterated towards
 * minimax) on [-ln2/2, ln2/2] with the coefficients rounded to float: truncation 0.075 ULP,
 * Horner (6 FMAs; the last two add r and 1 exactly where Estrin's 1 + r would round: 0.9
 * ULP against 1.7). x must already lie in [-110, 89] or be NaN.
 * Cost of subnormal results (x < -87.3): vscalefps takes a microcode assist on some CPUs when
 * its result is subnormal, as do multiplies and FMAs reading a subnormal; inputs whose exps land
 * there (log-probs below -87) run much slower on every path (figures: BENCHMARKS.md). */
KD_INLINE vf kd_vexp_clamped(vf x) {
    vf sh = vf_set1(0x1.8p23f);
    vf n = vf_sub(vf_fmadd(x, vf_set1(1.44269504088896341f), sh), sh);
    vf r = vf_fmadd(n, vf_set1(-KD_LN2_HI), x);
    r = vf_fmadd(n, vf_set1(-KD_LN2_LO), r);
    vf q = vf_fmadd(vf_set1(0x1.6a23ecp-10f), r, vf_set1(0x1.123a54p-7f));
    q = vf_fmadd(q, r, vf_set1(0x1.5558f4p-5f));
    q = vf_fmadd(q, r, vf_set1(0x1.55549p-3f));
    q = vf_fmadd(q, r, vf_set1(0x1.fffffcp-2f));
    q = vf_fmadd(q, r, vf_set1(1.0f));
    vf p = vf_fmadd(q, r, vf_set1(1.0f));
    return _mm512_scalef_ps(p, n);
}
KD_INLINE vf vf_exp(vf x) {
    /* the clamp keeps r finite for +-inf; max(lo, x) / min(hi, .) return x itself when x is NaN */
    return kd_vexp_clamped(vf_min(vf_set1(89.0f), vf_max(vf_set1(-110.0f), x)));
}
/* exp(x) for x <= 0 or NaN (one clamp fewer); the same results as vf_exp there. */
KD_INLINE vf vf_exp_nonpos(vf x) { return kd_vexp_clamped(vf_max(vf_set1(-110.0f), x)); }
/* exp(x) for x not NaN (a NaN gives 0 or inf): one vrangeps clamps to [-110, 110] (sign(x) *
 * min(|x|, 110), which maps a NaN to +-110); the same results as vf_exp elsewhere. */
KD_INLINE vf vf_exp_nonnan(vf x) { return kd_vexp_clamped(_mm512_range_ps(x, vf_set1(110.0f), 0x02)); }
#else
/* x in [-110, 89] or NaN: n in [-159, 128] keeps both scale factors 2^n1, 2^n2 normal */
KD_INLINE vf kd_vexp_clamped(vf x) {
    vf sh = vf_set1(0x1.8p23f); /* n = round(x / ln2) by adding and subtracting 1.5 * 2^23 */
    vf n = vf_sub(vf_fmadd(x, vf_set1(1.44269504088896341f), sh), sh);
    vf r = vf_fmadd(n, vf_set1(-KD_LN2_HI), x);
    r = vf_fmadd(n, vf_set1(-KD_LN2_LO), r);
    /* Estrin's scheme (not Horner): the JSD chains exp -> log1p per element, and a short
     * dependency chain is what lets the out-of-order core overlap consecutive vectors. */
    vf r2 = vf_mul(r, r), r4 = vf_mul(r2, r2);
    vf q0 = vf_add(vf_set1(1.0f), r);
    vf q1 = vf_fmadd(r, vf_set1(1.0f / 6), vf_set1(0.5f));
    vf q2 = vf_fmadd(r, vf_set1(1.0f / 120), vf_set1(1.0f / 24));
    vf q3 = vf_fmadd(r, vf_set1(1.0f / 5040), vf_set1(1.0f / 720));
    vf p = vf_fmadd(vf_fmadd(q3, r2, q2), r4, vf_fmadd(q1, r2, q0));
    vi ni = vf_to_vi(n); /* n in [-159, 128] */
    vi n1 = vi_srai(ni, 1), n2 = vi_sub(ni, n1);
    vf s1 = vi_as_vf(vi_slli(vi_add(n1, vi_set1(127)), 23));
    vf s2 = vi_as_vf(vi_slli(vi_add(n2, vi_set1(127)), 23));
    return vf_mul(vf_mul(p, s1), s2);
}
KD_INLINE vf vf_exp(vf x) {
    /* clamp keeps 2^n in range; max(lo, x) / min(hi, .) return x itself when x is NaN */
    return kd_vexp_clamped(vf_min(vf_set1(89.0f), vf_max(vf_set1(-110.0f), x)));
}
/* exp(x) for x <= 0 or NaN; exp(x) for x not NaN */
KD_INLINE vf vf_exp_nonpos(vf x) { return vf_exp(x); }
KD_INLINE vf vf_exp_nonnan(vf x) { return vf_exp(x); }
#endif
/* exp(x) for x already in [-110, 89] (no clamp; the JSD's exp(-min(|d|, 110))): the same
 * results as vf_exp there. */
KD_INLINE vf vf_exp_in(vf x) { return kd_vexp_clamped(x); }

/* tanh(x) (the fused losses' softcap, logit_map.h). Below |x| = 0.3125 the odd Taylor polynomial
 * to x^11 (the first term left out, 21844/6081075 x^13, is < 2^-28 of x there); above,
 * (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.535, where 1 - e has no cancellation. A few ULP
 * either way (tests/vmath_check.h bounds it at 4); the sign of x restored; +-inf gives +-1,
 * NaN stays NaN. */
KD_INLINE vf vf_tanh(vf x) {
    vf a = vf_abs(x), one = vf_set1(1.0f), x2 = vf_mul(a, a);
    vf e = vf_exp(vf_mul(vf_set1(-2.0f), a));
    vf big = vf_div(vf_sub(one, e), vf_add(one, e));
    vf q = vf_fmadd(vf_set1(-0.0088632355f), x2, vf_set1(0.021869488f));
    q = vf_fmadd(q, x2, vf_set1(-0.053968254f));
    q = vf_fmadd(q, x2, vf_set1(0.13333333f));
    q = vf_fmadd(q, x2, vf_set1(-0.33333333f));
    vf t = vf_select(vm_lt(a, vf_set1(0.3125f)), vf_fmadd(vf_mul(a, x2), q, a), big);
    return vf_select(vm_lt(x, vf_zero()), vf_neg(t), t);
}

/* log(1 + f) for f in [-0.2929, 0.4143] as f - f^2/2 + f^3 P(f), P of degree 7 fitted in
 * 40-digit arithmetic (Chebyshev-node weighted least squares, tools: mpmath/numpy) to
 * (log1p(f) - f + f^2/2) / f^3; truncation 0.17 ULP. No division: a divide's latency sat on
 * the JSD's critical path. */
KD_INLINE vf kd_vlog1p_core(vf f) {
    vf f2 = vf_mul(f, f), f4 = vf_mul(f2, f2); /* Estrin's scheme, as in vf_exp */
    vf p01 = vf_fmadd(f, vf_set1(-0.2500057421846484f), vf_set1(0.3333332649583791f));
    vf p23 = vf_fmadd(f, vf_set1(-0.16631595791845313f), vf_set1(0.2000145172492526f));
    vf p45 = vf_fmadd(f, vf_set1(-0.13084134074362894f), vf_set1(0.14201879722209834f));
    vf p67 = vf_fmadd(f, vf_set1(-0.0779401415129489f), vf_set1(0.12731978663003957f));
    vf p = vf_fmadd(vf_fmadd(p67, f2, p45), f4, vf_fmadd(p23, f2, p01));
    return vf_fmadd(f2, vf_fmadd(p, f, vf_set1(-0.5f)), f);
}

KD_INLINE vf vf_log(vf x) {
    vm sub = vm_lt(x, vf_set1(1.17549435e-38f)); /* subnormal, zero or negative */
    vf xs = vf_select(sub, vf_mul(x, vf_set1(8388608.0f)), x); /* * 2^23 */
    vi bits = vf_as_vi(xs);
    vf k = vi_to_vf(vi_sub(vi_srli(bits, 23), vi_set1(127)));
    vf m = vi_as_vf(vi_or(vi_and(bits, vi_set1(0x007fffff)), vi_set1(0x3f800000))); /* [1, 2) */
    vm big = vm_gt(m, vf_set1(1.41421356f));
    m = vf_select(big, vf_mul(m, vf_set1(0.5f)), m);
    k = vf_add(k, vf_keep(big, vf_set1(1.0f)));
    k = vf_sub(k, vf_keep(sub, vf_set1(23.0f)));
    vf f = vf_sub(m, vf_set1(1.0f));
    vf r = vf_fmadd(k, vf_set1(KD_LN2_HI), vf_fmadd(k, vf_set1(KD_LN2_LO), kd_vlog1p_core(f)));
    r = vf_select(vm_eq(x, vf_zero()), vf_set1(-INFINITY), r);
    r = vf_select(vm_or(vm_lt(x, vf_zero()), vm_unord(x)), vf_set1(NAN), r);
    return vf_select(vm_eq(x, vf_set1(INFINITY)), x, r);
}

/* log(x) for x in [FLT_MIN, FLT_MAX] only (no subnormal, zero, negative, inf or NaN handling:
 * 8 fewer operations). The KL kernel uses it on max(t, eps) when eps >= FLT_MIN; there a NaN t
 * becomes eps (x86 max returns its second operand) and the NaN still reaches the loss through
 * the factor t, and t = inf gives 88.7 instead of inf, which the factor t turns into inf. */
KD_INLINE vf vf_log_normal(vf x) {
    vi bits = vf_as_vi(x);
    vf k = vi_to_vf(vi_sub(vi_srli(bits, 23), vi_set1(127)));
    vf m = vi_as_vf(vi_or(vi_and(bits, vi_set1(0x007fffff)), vi_set1(0x3f800000)));
    vm big = vm_gt(m, vf_set1(1.41421356f));
    m = vf_select(big, vf_mul(m, vf_set1(0.5f)), m);
    k = vf_add(k, vf_keep(big, vf_set1(1.0f)));
    vf f = vf_sub(m, vf_set1(1.0f));
    return vf_fmadd(k, vf_set1(KD_LN2_HI), vf_fmadd(k, vf_set1(KD_LN2_LO), kd_vlog1p_core(f)));
}

/* log(1 + e) for e in [0, 1]: above sqrt(2) - 1, 1 + e = 2 (1 + (e - 1) / 2). */
KD_INLINE vf vf_log1p_unit(vf e) {
    vm big = vm_gt(e, vf_set1(0.41421356f));
    vf f = vf_mask_fmadd(big, e, vf_set1(0.5f), vf_set1(-0.5f)); /* e/2 - 1/2: exact */
    return vf_mask_add(big, kd_vlog1p_core(f), vf_set1(0.693147180559945309f));
}

#endif
