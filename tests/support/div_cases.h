/* The divergence cases every test of the family runs (tests/test_distill.c, tests/cuda/test_cuda.c):
 * each divergence of kdloss_divergence and its alpha / beta end points (JSD at beta 0 and 1,
 * skew KL at alpha 0 and 1). Header-only: each test is its own program. */
#ifndef KDLOSS_TEST_DIV_CASES_H
#define KDLOSS_TEST_DIV_CASES_H

#include <math.h>

#include "kdloss.h"

static const kdloss_div_params KT_DIV_CASES[] = {
    {KDLOSS_DIV_FORWARD_KL, 0.5, 0.1},      {KDLOSS_DIV_REVERSE_KL, 0.5, 0.1},
    {KDLOSS_DIV_JSD, 0.0, 0.1},             {KDLOSS_DIV_JSD, 0.1, 0.1},
    {KDLOSS_DIV_JSD, 0.5, 0.1},             {KDLOSS_DIV_JSD, 1.0, 0.1},
    {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 0.0}, {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 0.1},
    {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 0.9}, {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 1.0},
    {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 0.0}, {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 0.1},
    {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 0.9}, {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 1.0},
    {KDLOSS_DIV_TVD, 0.5, 0.1},
};
#define KT_NDIV_CASES ((int)(sizeof KT_DIV_CASES / sizeof KT_DIV_CASES[0]))

/* The ten of them the logits tests run (test_distill_logits, test_topk), as an initializer so a
 * test that does not use it has no unused array: forward / reverse KL, JSD beta 0 / 0.5 / 1, skew
 * forward KL alpha 0.1 / 1, skew reverse KL alpha 0.1 / 0, TVD. */
#define KT_DIV_CASES_LOGITS_INIT                                                               \
    {                                                                                          \
        {KDLOSS_DIV_FORWARD_KL, 0.5, 0.1},      {KDLOSS_DIV_REVERSE_KL, 0.5, 0.1},             \
        {KDLOSS_DIV_JSD, 0.0, 0.1},             {KDLOSS_DIV_JSD, 0.5, 0.1},                    \
        {KDLOSS_DIV_JSD, 1.0, 0.1},             {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 0.1},        \
        {KDLOSS_DIV_SKEW_FORWARD_KL, 0.5, 1.0}, {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 0.1},        \
        {KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 0.0}, {KDLOSS_DIV_TVD, 0.5, 0.1},                    \
    }

/* |log| of the mixture weights, the JSD's beta or else alpha (finite ones): they join every
 * mixture term's log-differences in the tests' tolerances. */
static inline double kt_div_log_weights(const kdloss_div_params *c) {
    double w = c->divergence == KDLOSS_DIV_JSD ? c->beta : c->alpha, s = 0;
    if (w > 0 && w < 1) s = fabs(log(w)) + fabs(log1p(-w));
    return s;
}

/* The cases that are reverse KL: where a teacher log-prob of -inf under Q > 0 is infinite. */
static inline int kt_div_rev_like(const kdloss_div_params *c) {
    return c->divergence == KDLOSS_DIV_REVERSE_KL ||
           (c->divergence == KDLOSS_DIV_JSD && c->beta == 1.0) ||
           (c->divergence == KDLOSS_DIV_SKEW_REVERSE_KL && c->alpha == 0.0);
}

#endif
