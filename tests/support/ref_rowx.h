/* Per-row weights and the student's entropy (docs/MATH.md section 12) in the tests: the weights
 * the tests draw and the float64 entropy they are checked against. */
#ifndef KDLOSS_REF_ROWX_H
#define KDLOSS_REF_ROWX_H

#include <stdint.h>

#include "testutil.h"

/* Fills w[bt] with weights of every kind, cycled by row from a random start: exactly 0 (an
 * ignored row), exactly 1, large (1e3 to 4e3), small (1e-4 to 4e-4), and uniform in [0.05, 3). */
void kt_gen_row_weights(kt_rng *rng, float *w, int64_t bt);

/* The student's entropy H = -sum Q log Q of Q = softmax(z / T) over one row of v logits, in
 * double from ref_log_softmax (0 log 0 = 0). *tol, when not NULL: the bound an fp32 evaluation
 * is checked against, 256 u sum_k Q_k (2 + |x_k|) (2 + |x_k| + log v) + 2^-140: the fp32
 * log-prob x = (z - m) / T - log S carries an absolute error of a few u (1 + |x| + log S) (its
 * difference, product and normalizer each rounded), which moves the term -Q x by that times
 * Q |1 + x|; Q itself (an exp times a scale) a few u relative, times |Q x|; and the fp32 lane
 * sums over tiles of 1024 columns add at most ~128 u of the terms' magnitude (as the losses'
 * 256 u, reference.h). */
double ref_entropy(const double *z, int64_t v, double t, double *tol);

#endif
