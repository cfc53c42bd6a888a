/* Per-element divergence math, shared by the scalar CPU path and the CUDA kernels (host and
 * device), so the CPU tests exercise the exact formulas the GPU runs.
 *
 * JSD(beta) on log-probs x (student) and y (teacher), with a = log(beta) + y, b = log(1-beta) + x
 * and d = a - b. The mixture is never formed as a sum of exps (it underflows to 0 below -87 and
 * gives NaN); instead, with softplus(z) = log(1 + e^z):
 *   log M - a = softplus(-d),  log M - b = softplus(d)
 *   beta P (y - log M)      = e^a (-log beta     - softplus(-d))
 *   (1-beta) Q (x - log M)  = e^b (-log(1-beta) - softplus(d))
 * Both softplus values share one exp(-|d|) and one log1p, and e^min(a,b) = e^max * exp(-|d|):
 * three transcendentals per element. Terms whose weight e^a or e^b is 0 contribute exactly 0,
 * so -inf log-probs give 0 (0 log 0 = 0) instead of NaN. */
#ifndef KDLOSS_DIV_MATH_H
#define KDLOSS_DIV_MATH_H

#include <math.h>

#ifdef __CUDACC__
#define KD_HDM static __host__ __device__ __forceinline__
#else
#define KD_HDM static inline
#endif

enum { KD_JSD_FORWARD_KL = 0, KD_JSD_REVERSE_KL = 1, KD_JSD_MIXED = 2 };

/* Constants of one JSD call, computed once on the host. */
typedef struct kd_jsd_coef {
    int mode;          /* KD_JSD_* */
    float neg_log_b;   /* -log(beta)   (mixed mode only) */
    float neg_log_1mb; /* -log(1-beta) (mixed mode only) */
} kd_jsd_coef;

static inline kd_jsd_coef kd_jsd_coef_make(double beta) {
    kd_jsd_coef c;
    c.mode = beta == 0.0 ? KD_JSD_FORWARD_KL : beta == 1.0 ? KD_JSD_REVERSE_KL : KD_JSD_MIXED;
    c.neg_log_b = c.mode == KD_JSD_MIXED ? (float)-log(beta) : 0.0f;
    c.neg_log_1mb = c.mode == KD_JSD_MIXED ? (float)-log1p(-beta) : 0.0f;
    return c;
}

/* One element of JSD(beta): returns the loss term, writes dloss/dx to *grad. */
KD_HDM float kd_jsd_elem(kd_jsd_coef c, float x, float y, float *grad) {
    if (c.mode == KD_JSD_FORWARD_KL) { /* P (y - x), d/dx = -P */
        float p = expf(y);
        *grad = -p;
        return p > 0.0f ? p * (y - x) : 0.0f;
    }
    if (c.mode == KD_JSD_REVERSE_KL) { /* Q (x - y), d/dx = Q (x - y + 1) */
        float q = expf(x);
        *grad = q > 0.0f ? q * (x - y + 1.0f) : 0.0f;
        return q > 0.0f ? q * (x - y) : 0.0f;
    }
    float a = y - c.neg_log_b, b = x - c.neg_log_1mb;
    float d = a - b, m = fmaxf(a, b);
    float e = expf(-fabsf(d)); /* NaN only when a = b = +-inf */
    float s = log1pf(e);
    float em = expf(m);
    float wa = a >= b ? em : em * e, wb = a >= b ? em * e : em;
    float ta = wa > 0.0f ? wa * (c.neg_log_b - (fmaxf(-d, 0.0f) + s)) : 0.0f;
    float tb = wb > 0.0f ? wb * (c.neg_log_1mb - (fmaxf(d, 0.0f) + s)) : 0.0f;
    *grad = tb;
    return ta + tb;
}

/* One element of KLDivLoss: returns the loss term, writes dloss/dy to *grad. */
KD_HDM float kd_kl_elem(int log_target, float eps, float y, float t, float *grad) {
    if (log_target) {
        float et = expf(t);
        *grad = -et;
        return et > 0.0f ? et * (t - y) : 0.0f;
    }
    *grad = -t;
    return t != 0.0f ? t * (logf(fmaxf(t, eps)) - y) : 0.0f;
}

#endif /* KDLOSS_DIV_MATH_H */
