/* The divergence cases every test of the family runs (tests/test_distill.c, tests/cuda/test_cuda.c):
 * each divergence of kdloss_divergence and its alpha / beta end points (JSD at beta 0 and 1,
 * skew KL at alpha 0 and 1). Header-only: each test is its own program. */
#ifndef KDLOSS_TEST_DIV_CASES_H
#define KDLOSS_TEST_DIV_CASES_H

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

#endif
