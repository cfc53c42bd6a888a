/* The divergence cases every test of the family runs, generated from the registry
 * (KD_DIVERGENCES, src/common/div_coef.h), so a new divergence is tested without an edit here:
 * each divergence once if it takes no parameter, else at its parameter's end points and inside
 * (JSD's beta 0 / 0.1 / 0.5 / 1, the skew KLs' alpha 0 / 0.1 / 0.9 / 1; the unused one at its
 * default). KT_DIV_CASES: the case grid of cases.h (the CPU and CUDA tests of the family) and
 * the CUDA tests' fused losses. Header-only: each test is its own program. */
#ifndef KDLOSS_TEST_DIV_CASES_H
#define KDLOSS_TEST_DIV_CASES_H

#include <math.h>

#include "div_coef.h"
#include "kdloss.h"

#define KT_DIV_PTS_NONE(E) {KDLOSS_DIV_##E, 0.5, 0.1},
#define KT_DIV_PTS_BETA(E)                                                                     \
    {KDLOSS_DIV_##E, 0.0, 0.1}, {KDLOSS_DIV_##E, 0.1, 0.1}, {KDLOSS_DIV_##E, 0.5, 0.1},        \
        {KDLOSS_DIV_##E, 1.0, 0.1},
#define KT_DIV_PTS_ALPHA(E)                                                                    \
    {KDLOSS_DIV_##E, 0.5, 0.0}, {KDLOSS_DIV_##E, 0.5, 0.1}, {KDLOSS_DIV_##E, 0.5, 0.9},        \
        {KDLOSS_DIV_##E, 0.5, 1.0},
#define KT_DIV_CASE_ROW(E, name, P, b) KT_DIV_PTS_##P(E)

static const kdloss_div_params KT_DIV_CASES[] = {KD_DIVERGENCES(KT_DIV_CASE_ROW)};
#define KT_NDIV_CASES ((int)(sizeof KT_DIV_CASES / sizeof KT_DIV_CASES[0]))

/* The lighter set the logits tests run beside the case grid (test_distill_logits, test_topk:
 * finite differences, thread counts, the fused loss), as an initializer so a test that does not
 * use it has no unused array: each divergence once if it takes no parameter, else at both end
 * points and one inside (beta 0 / 0.5 / 1, alpha 0 / 0.1 / 1). */
#define KT_DIV_LPTS_NONE(E) {KDLOSS_DIV_##E, 0.5, 0.1},
#define KT_DIV_LPTS_BETA(E)                                                                    \
    {KDLOSS_DIV_##E, 0.0, 0.1}, {KDLOSS_DIV_##E, 0.5, 0.1}, {KDLOSS_DIV_##E, 1.0, 0.1},
#define KT_DIV_LPTS_ALPHA(E)                                                                   \
    {KDLOSS_DIV_##E, 0.5, 0.0}, {KDLOSS_DIV_##E, 0.5, 0.1}, {KDLOSS_DIV_##E, 0.5, 1.0},
#define KT_DIV_LCASE_ROW(E, name, P, b) KT_DIV_LPTS_##P(E)
#define KT_DIV_CASES_LOGITS_INIT {KD_DIVERGENCES(KT_DIV_LCASE_ROW)}

/* The parameter a case's divergence reads (the registry's PARAM): 'b' beta, 'a' alpha, 0 none. */
static inline int kt_div_param(const kdloss_div_params *c) {
    switch (c->divergence) {
#define KT_DIV_PARAM_NONE 0
#define KT_DIV_PARAM_BETA 'b'
#define KT_DIV_PARAM_ALPHA 'a'
#define KT_DIV_PARAM_ROW(E, name, P, b) case KDLOSS_DIV_##E: return KT_DIV_PARAM_##P;
        KD_DIVERGENCES(KT_DIV_PARAM_ROW)
    default: return 0;
    }
}

/* |log| of the mixture weights, the JSD's beta or else alpha (finite ones): they join every
 * mixture term's log-differences in the tests' tolerances. */
static inline double kt_div_log_weights(const kdloss_div_params *c) {
    int p = kt_div_param(c);
    double w = p == 'b' ? c->beta : c->alpha, s = 0;
    if (p && w > 0 && w < 1) s = fabs(log(w)) + fabs(log1p(-w));
    return s;
}

/* The cases that are forward KL: where a student log-prob of -inf under P > 0 is infinite. */
static inline int kt_div_fwd_like(const kdloss_div_params *c) {
    return c->divergence == KDLOSS_DIV_FORWARD_KL ||
           (c->divergence == KDLOSS_DIV_JSD && c->beta == 0.0) ||
           (c->divergence == KDLOSS_DIV_SKEW_FORWARD_KL && c->alpha == 0.0);
}

/* The cases that are reverse KL: where a teacher log-prob of -inf under Q > 0 is infinite. */
static inline int kt_div_rev_like(const kdloss_div_params *c) {
    return c->divergence == KDLOSS_DIV_REVERSE_KL ||
           (c->divergence == KDLOSS_DIV_JSD && c->beta == 1.0) ||
           (c->divergence == KDLOSS_DIV_SKEW_REVERSE_KL && c->alpha == 0.0);
}

#endif
