/* The weights and the float64 entropy of ref_rowx.h. */
#include "ref_rowx.h"

#include <math.h>
#include <stdlib.h>

#include "reference.h"

void kt_gen_row_weights(kt_rng *rng, float *w, int64_t bt) {
    int64_t s = kt_randint(rng, 5);
    for (int64_t r = 0; r < bt; r++) {
        double u = kt_uniform(rng);
        switch ((r + s) % 5) {
        case 0: w[r] = 0.0f; break;
        case 1: w[r] = 1.0f; break;
        case 2: w[r] = (float)(1e3 * (1.0 + 3.0 * u)); break;
        case 3: w[r] = (float)(1e-4 * (1.0 + 3.0 * u)); break;
        default: w[r] = (float)(0.05 + 2.95 * u); break;
        }
    }
}

double ref_entropy(const double *z, int64_t v, double t, double *tol) {
    double *x = malloc(sizeof(double) * (size_t)v), h = 0.0, mag = 0.0;
    ref_log_softmax(z, v, t, x);
    for (int64_t k = 0; k < v; k++) {
        double q = exp(x[k]);
        if (q == 0.0) continue; /* 0 log 0 = 0 (x may be -inf) */
        h -= q * x[k];
        mag += q * (2.0 + fabs(x[k])) * (2.0 + fabs(x[k]) + log((double)v));
    }
    free(x);
    if (tol) *tol = 256.0 * 0x1p-24 * mag + 0x1p-140;
    return h;
}
