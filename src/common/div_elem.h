/* The divergence family's per-element loss and gradient, written once (docs/MATH.md section 7)
 * and compiled by every backend: the scalar CPU path and CUDA (div_math.h), the SIMD layer
 * (div_simd.h). No include guard: a backend defines the value, mask and constant types and the
 * arithmetic macros listed below, then includes this file and gets one function per row of
 * KD_DIV_OPS, KDE_T KDE(op)(const KDE_K *k, KDE_T x, KDE_T y, KDE_T *g): the loss term at
 * student log-prob x, teacher log-prob y, with *g = d(term)/dx. */

/* The includer defines:
 *   KDE_T, KDE_M      the value and mask types (float and int; or the SIMD layer's vf and vm)
 *   KDE_K             the constants' type (fields ca, cb as KDE_T; see div_coef.h)
 *   KDE(name)         the name this backend gives element function `name`
 *   KDE_FN            the functions' qualifiers (static inline, __host__ __device__, ...)
 *   KE_ADD KE_SUB KE_MUL KE_DIV KE_MIN KE_MAX KE_ABS KE_NEG   arithmetic
 *   KE_EXP            exp; KE_EXP_NONPOS / KE_EXP_NONNAN / KE_EXP_IN: exp on x <= 0 / on non-NaN
 *                     x / on x in [-110, 89] (the SIMD layer has cheaper forms; scalar and CUDA
 *                     use expf for all four)
 *   KE_NABS_MIN(a, c) -min(|a|, c) for a constant c > 0, with a NaN giving -c
 *   KE_LOG1P_UNIT     log1p on [0, 1]
 *   KE_C(c)           the constant c; KE_GT KE_GE KE_LT: compares; KE_SEL(m, a, b): m ? a : b;
 *                     KE_KEEP(m, a): m ? a : 0 (NaN in a does not leak through a false m)
 * With KDE_PQ defined, the functions take the probabilities as well,
 *   KDE_T KDE(op)(const KDE_K *k, KDE_T x, KDE_T y, KDE_T pp, KDE_T qq, KDE_T *g),
 * pp = P = e^y and qq = Q = e^x, which a caller that has them (the logits kernel forms them in
 * its softmax pass) passes instead of the exps being taken here; KDE_K then also has the mixture
 * weights wa = e^-ca, wb = e^-cb. Same formulas, fewer transcendentals.
 *
 * Mixtures: a = y - ca, b = x - cb are the logs of the teacher's and the student's shares of M,
 * d = a - b. With e = exp(-|d|) <= 1 and s = log1p(e) (never overflow, never NaN for finite d):
 *   log M = max(a, b) + s,   softplus(d) = log(1 + e^d) = max(d, 0) + s,
 *   softplus(-d) = s - min(d, 0),   sigmoid(d) = (d >= 0 ? 1 : e) / (1 + e).
 * A term is multiplied by its weight (P, Q or a share of M) and kept only where that weight is
 * positive, so a zero probability (log-prob -inf, or far below exp's range) contributes 0, not
 * 0 * inf = NaN. */

#ifdef KDE_PQ
#define KDE_ARGS (const KDE_K *k, KDE_T x, KDE_T y, KDE_T pp, KDE_T qq, KDE_T *g)
#define KDE_USE_PQ() ((void)pp, (void)qq)
#define KDE_P(y) (pp)
#define KDE_Q(x) (qq)
#define KDE_WMAX(a, b) KE_MAX(KE_MUL(pp, k->wa), KE_MUL(qq, k->wb)) /* e^max(a, b) */
#else
#define KDE_ARGS (const KDE_K *k, KDE_T x, KDE_T y, KDE_T *g)
#define KDE_USE_PQ() ((void)0)
#define KDE_P(y) KE_EXP(y)
#define KDE_Q(x) KE_EXP(x)
#define KDE_WMAX(a, b) KE_EXP_NONNAN(KE_MAX(a, b))
#endif

/* KL(P||Q) term P (y - x); d/dx = -P. */
KDE_FN KDE_T KDE(fwd) KDE_ARGS {
    (void)k;
    KDE_USE_PQ();
    KDE_T p = KDE_P(y);
    *g = KE_NEG(p);
    return KE_KEEP(KE_GT(p, KE_C(0.0f)), KE_MUL(p, KE_SUB(y, x)));
}

/* KL(Q||P) term Q (x - y); d/dx = Q (x - y + 1). */
KDE_FN KDE_T KDE(rev) KDE_ARGS {
    (void)k;
    KDE_USE_PQ();
    KDE_T q = KDE_Q(x);
    KDE_M pos = KE_GT(q, KE_C(0.0f));
    KDE_T diff = KE_SUB(x, y);
    *g = KE_KEEP(pos, KE_MUL(q, KE_ADD(diff, KE_C(1.0f))));
    return KE_KEEP(pos, KE_MUL(q, diff));
}

/* JSD(beta), beta in (0, 1), ca = -log beta, cb = -log(1-beta):
 *   beta P (y - log M) = e^a (ca - softplus(-d)),  (1-beta) Q (x - log M) = e^b (cb - softplus(d))
 * and d/dx of the sum = (1-beta) Q (x - log M) (the terms through M cancel). The softplus form
 * (rather than y - log M) is stationary in d, so the rounding of a, b, d does not reach the loss
 * to first order (measured 10x smaller loss error at beta 0.1 / 0.9).
 * Written by the larger share (weight wM = e^max(a,b), constant cM) and the smaller (wm = wM e,
 * cm), with e = e^-|d| and s = log1p(e): the larger's term is wM (cM - s), the smaller's
 * wm (cm - s - |d|): three transcendentals an element and no masks. |d| is clamped at 110,
 * where e (and with it wm) is already 0 in float, so both factors stay finite also for -inf
 * log-probs (|d| = inf, or NaN when both are -inf: the clamp maps it to 110 too), and a zero
 * weight gives 0, never 0 * inf. */
KDE_FN KDE_T KDE(jsd) KDE_ARGS {
    KDE_USE_PQ();
    KDE_T a = KE_SUB(y, k->ca), b = KE_SUB(x, k->cb);
    KDE_T nd = KE_NABS_MIN(KE_SUB(a, b), KE_C(110.0f)); /* -|d| */
    KDE_T e = KE_EXP_IN(nd), s = KE_LOG1P_UNIT(e);
    KDE_M age = KE_GE(a, b); /* the teacher's share is the larger */
    KDE_T wM = KDE_WMAX(a, b), wm = KE_MUL(wM, e);
    KDE_T tM = KE_MUL(wM, KE_SUB(KE_SEL(age, k->ca, k->cb), s));
    KDE_T tm = KE_MUL(wm, KE_ADD(KE_SUB(KE_SEL(age, k->cb, k->ca), s), nd));
    *g = KE_SEL(age, tm, tM); /* the student's term */
    return KE_ADD(tM, tm);
}

/* Skew forward KL(P||M), M = alpha P + (1-alpha) Q, ca = -log alpha, cb = -log(1-alpha)
 * (alpha = 1: cb = inf, b = -inf, M = P, term 0):
 *   P (y - log M) = P (ca - softplus(-d));  d/dx = -P (1-alpha) Q / M = -P sigmoid(-d).
 * e = e^-|d| with |d| clamped at 110 (e is 0 in float from 104 on; a NaN d gives e = 0);
 * -sigmoid(-d) = (d >= 0 ? e : 1) / (-1 - e), the negation folded into the divisor. */
KDE_FN KDE_T KDE(skf) KDE_ARGS {
    KDE_USE_PQ();
    KDE_T a = KE_SUB(y, k->ca), b = KE_SUB(x, k->cb);
    KDE_T d = KE_SUB(a, b), zero = KE_C(0.0f), one = KE_C(1.0f);
    KDE_T e = KE_EXP_IN(KE_NABS_MIN(d, KE_C(110.0f)));
    KDE_T s = KE_LOG1P_UNIT(e);
    KDE_T p = KDE_P(y);
    KDE_T nsig = KE_DIV(KE_SEL(KE_GE(d, zero), e, one), KE_SUB(KE_C(-1.0f), e));
    *g = KE_MUL(p, nsig); /* finite nsig: a zero P gives 0 */
    return KE_KEEP(KE_GT(p, zero), KE_MUL(p, KE_ADD(KE_SUB(k->ca, s), KE_MIN(d, zero))));
}

/* Skew reverse KL(Q||M), M = alpha Q + (1-alpha) P, ca = -log(1-alpha), cb = -log alpha
 * (alpha = 1: ca = inf, a = -inf, M = Q, term 0):
 *   Q (x - log M) = Q (cb - softplus(d));
 *   d/dx = Q (x - log M) + Q (1 - alpha Q / M) = Q (cb - softplus(d) + sigmoid(d)). */
KDE_FN KDE_T KDE(skr) KDE_ARGS {
    KDE_USE_PQ();
    KDE_T a = KE_SUB(y, k->ca), b = KE_SUB(x, k->cb);
    KDE_T d = KE_SUB(a, b), zero = KE_C(0.0f), one = KE_C(1.0f);
    KDE_T e = KE_EXP_IN(KE_NABS_MIN(d, KE_C(110.0f)));
    KDE_T s = KE_LOG1P_UNIT(e);
    KDE_T q = KDE_Q(x);
    KDE_M pos = KE_GT(q, zero);
    KDE_T r = KE_SUB(KE_SUB(k->cb, s), KE_MAX(d, zero));             /* x - log M */
    KDE_T sig = KE_DIV(KE_SEL(KE_GE(d, zero), one, e), KE_ADD(one, e)); /* sigmoid(d) */
    *g = KE_KEEP(pos, KE_MUL(q, KE_ADD(r, sig)));
    return KE_KEEP(pos, KE_MUL(q, r));
}

/* Total variation 1/2 |P - Q|; d/dx = 1/2 Q sign(Q - P), 0 at ties. */
KDE_FN KDE_T KDE(tvd) KDE_ARGS {
    (void)k;
    KDE_USE_PQ();
    KDE_T p = KDE_P(y), q = KDE_Q(x), zero = KE_C(0.0f), half = KE_C(0.5f);
    KDE_T diff = KE_SUB(q, p), hq = KE_MUL(half, q);
    *g = KE_SEL(KE_GT(diff, zero), hq, KE_SEL(KE_LT(diff, zero), KE_NEG(hq), zero));
    return KE_MUL(half, KE_ABS(diff));
}

/* The student's entropy term -Q x at its log-prob x, Q = e^x (docs/MATH.md section 12): the row
 * sum of these is H(Q). 0 where Q = 0 (0 log 0 = 0), so a log-prob of -inf adds 0, not NaN. A
 * caller that has Q passes it; no exp is taken here. */
KDE_FN KDE_T KDE(entropy)(KDE_T x, KDE_T qq) {
    return KE_KEEP(KE_GT(qq, KE_C(0.0f)), KE_NEG(KE_MUL(qq, x)));
}

#undef KDE_ARGS
#undef KDE_USE_PQ
#undef KDE_P
#undef KDE_Q
#undef KDE_WMAX
