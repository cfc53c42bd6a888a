#include "reference.h"

#include <math.h>


double ref_kl_elem(int log_target, double eps, double y, double t, double *grad, double *mag) {
    if (log_target) {
        double et = exp(t);
        *grad = -et;
        double l = et > 0 ? et * (t - y) : 0.0;
        *mag = ref_wmul(et, 1 + fabs(t) + fabs(y)) + fabs(l);
        return l;
    }
    *grad = -t;
    double l = t != 0 ? t * (log(t > eps ? t : eps) - y) : 0.0;
    *mag = ref_wmul(fabs(t), 1 + fabs(log(t > eps ? t : eps)) + fabs(y)) + fabs(l);
    return l;
}

double ref_jsd_elem(double beta, double x, double y, double *grad, double *mag) {
    double p = exp(y), q = exp(x);
    if (beta == 0.0) { /* KL(P || Q) */
        *grad = -p;
        double l = p > 0 ? p * (y - x) : 0.0;
        *mag = ref_wmul(p, 1 + fabs(x) + fabs(y)) + fabs(l);
        return l;
    }
    if (beta == 1.0) { /* KL(Q || P) */
        double l = q > 0 ? q * (x - y) : 0.0;
        *grad = q > 0 ? q * (x - y + 1.0) : 0.0;
        *mag = ref_wmul(q, 1 + fabs(x) + fabs(y)) + fabs(l);
        return l;
    }
    double a = log(beta) + y, b = log1p(-beta) + x;
    double m = a > b ? a : b;
    if (m == -INFINITY) {
        *grad = 0.0;
        *mag = 0.0;
        return 0.0;
    }
    double lm = m + log(exp(a - m) + exp(b - m)); /* log M, M = beta P + (1-beta) Q */
    double ta = p > 0 ? beta * p * (y - lm) : 0.0;
    double tb = q > 0 ? (1 - beta) * q * (x - lm) : 0.0;
    *grad = tb;
    *mag = ref_wmul(p, 1 + fabs(x) + fabs(y)) + ref_wmul(q, 1 + fabs(x) + fabs(y)) + fabs(ta) + fabs(tb);
    return ta + tb;
}

/* log(e^u + e^w) in double, -inf when both are -inf. */
static double ref_logaddexp(double u, double w) {
    double m = u > w ? u : w;
    if (m == -INFINITY) return -INFINITY;
    return m + log(exp(u - m) + exp(w - m));
}

/* KL(P || alpha P + (1-alpha) Q) element, from the definition: P (y - log M). */
static double ref_skew_fwd(double alpha, double x, double y, double *grad, double *mag) {
    double p = exp(y), q = exp(x);
    if (alpha == 0.0) return ref_jsd_elem(0.0, x, y, grad, mag);
    double la = log(alpha), lb = log1p(-alpha); /* lb = -inf at alpha = 1 */
    double lm = ref_logaddexp(la + y, lb + x);
    double l = p > 0 ? p * (y - lm) : 0.0;
    /* d/dx: -P dlogM/dx = -P (1-alpha) Q / M */
    *grad = p > 0 ? -p * exp(lb + x - lm) : 0.0;
    *mag = ref_wmul(p, 2 + fabs(x) + fabs(y) + fabs(la)) + ref_wmul(q, 1.0) + fabs(l);
    return l;
}

/* KL(Q || alpha Q + (1-alpha) P) element: Q (x - log M). */
static double ref_skew_rev(double alpha, double x, double y, double *grad, double *mag) {
    double p = exp(y), q = exp(x);
    if (alpha == 0.0) return ref_jsd_elem(1.0, x, y, grad, mag);
    double la = log(alpha), lb = log1p(-alpha);
    double lm = ref_logaddexp(la + x, lb + y);
    double l = q > 0 ? q * (x - lm) : 0.0;
    /* d/dx: Q (x - log M) + Q (1 - alpha Q / M) */
    *grad = q > 0 ? q * (x - lm) + q * (1.0 - exp(la + x - lm)) : 0.0;
    *mag = ref_wmul(q, 2 + fabs(x) + fabs(y) + fabs(la)) + ref_wmul(p, 1.0) + fabs(l);
    return l;
}

double ref_div_elem(const kdloss_div_params *d, double x, double y, double *grad, double *mag) {
    double p = exp(y), q = exp(x);
    switch (d->divergence) {
    case KDLOSS_DIV_FORWARD_KL: return ref_jsd_elem(0.0, x, y, grad, mag);
    case KDLOSS_DIV_REVERSE_KL: return ref_jsd_elem(1.0, x, y, grad, mag);
    case KDLOSS_DIV_JSD: return ref_jsd_elem(d->beta, x, y, grad, mag);
    case KDLOSS_DIV_SKEW_FORWARD_KL: return ref_skew_fwd(d->alpha, x, y, grad, mag);
    case KDLOSS_DIV_SKEW_REVERSE_KL: return ref_skew_rev(d->alpha, x, y, grad, mag);
    case KDLOSS_DIV_TVD: {
        double diff = q - p;
        *grad = diff > 0 ? 0.5 * q : diff < 0 ? -0.5 * q : 0.0;
        *mag = p + q;
        return 0.5 * fabs(diff);
    }
    case KDLOSS_DIV_COUNT: break; /* not a divergence; no default: -Wswitch names a missing one */
    }
    *grad = *mag = NAN;
    return NAN;
}

void ref_log_softmax(const double *z, int64_t v, double t, double *out) {
    double m = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < v; c++) m = fmax(m, z[c] / t);
    for (int64_t c = 0; c < v; c++) s += exp(z[c] / t - m);
    double lse = m + log(s);
    for (int64_t c = 0; c < v; c++) out[c] = z[c] / t - lse;
}
