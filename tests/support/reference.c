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
