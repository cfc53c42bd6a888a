/* Double-precision reference implementations: the oracle every fast path is checked against.
 * Written from the textbook formulas of docs/MATH.md (log M by a plain logaddexp in double),
 * deliberately NOT from the float formulation the kernels use, so a mistake in that
 * reformulation shows up as a mismatch. They stay forever.
 *
 * Each element function also returns a "magnitude" m >= |loss term| that bounds how much
 * fp32 rounding can move that term: the weights times (1 + |x| + |y|) (the log-differences
 * are formed from values of that size) plus the terms' absolute values. Tolerances are then
 * stated relative to the summed magnitude, which is what float summation error is relative to.
 *
 * Tolerance table (u = 2^-24, the fp32 unit roundoff), used by test_kl_div.c / test_jsd.c:
 * | quantity             | dtype      | tolerance                                | why                                           |
 * |----------------------|------------|------------------------------------------|-----------------------------------------------|
 * | loss, row loss       | all inputs | 256 u * sum(magnitude) + 1e-30           | fp32 lane sums over <= 128 terms per tile     |
 * |                      |            |                                          | (<= 128 u), 3 exp/log calls of <= 2 ULP and ~8|
 * |                      |            |                                          | roundings per element (<= 16 u); inputs are   |
 * |                      |            |                                          | exact (the reference reads the rounded values)|
 * | gradient element     | fp32       | 16 u * (|g| + weight*(1+|x|+|y|)) * scale| per-element rounding only, no summation       |
 * | gradient element     | bf16       | the fp32 bound + 2^-8 |g|                | one RNE cast to bf16 (half an ulp = 2^-9 rel) |
 * | gradient element     | fp16       | the fp32 bound + 2^-11 |g| + 2^-24 abs  | one RNE cast to fp16 (and its subnormal step) |
 * | gradient element     | any        | plus kt_tiny(dtype) absolute, plus       | results that underflow to subnormals / zero,  |
 * |                      |            | 2^-148 (1+|x|+|y|) * scale               | and a subnormal exp() times (x - y + 1)       |
 * | reference vs its own | double     | 1e-6 relative (central differences,      | truncation O(h^2) and cancellation O(u_d/h)   |
 * | finite differences   |            | h = 1e-5)                                |                                               |
 */
#ifndef KDLOSS_REFERENCE_H
#define KDLOSS_REFERENCE_H

#include <stdint.h>

#include "kdloss.h"

/* KLDivLoss element (PyTorch semantics): returns the loss term, *grad = d/dy, *mag its magnitude. */
double ref_kl_elem(int log_target, double eps, double y, double t, double *grad, double *mag);

/* JSD(beta) element on log-probs x (student), y (teacher): loss term, *grad = d/dx, *mag. */
double ref_jsd_elem(double beta, double x, double y, double *grad, double *mag);

/* Any divergence of the family (kdloss.h) on log-probs x (student), y (teacher): the loss term,
 * *grad = d/dx (x a free variable), *mag. Mixtures by a plain logaddexp in double. */
double ref_div_elem(const kdloss_div_params *d, double x, double y, double *grad, double *mag);

/* out[c] = log_softmax(z / t)[c] over one row of v, in double (max, then the log-sum-exp). */
void ref_log_softmax(const double *z, int64_t v, double t, double *out);

/* w * s with 0 * inf = 0 (a zero weight bounds nothing). */
static inline double ref_wmul(double w, double s) { return w == 0.0 ? 0.0 : w * s; }

#endif
