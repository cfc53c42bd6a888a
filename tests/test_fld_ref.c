/* Checks of the double-precision fused-linear JSD reference itself (tests/support/ref_fld.c),
 * so the oracle of test_fld.c is known to be right:
 *  - its gradients (dxs, dws, dbs) against central differences of its own loss, on a tiny shape,
 *    over beta, T, the weights, grad_scale and ignored rows;
 *  - its losses against closed forms on a 2-token vocabulary;
 *  - the JSD symmetry at beta = 0.5 (swapping student and teacher keeps the soft loss).
 * Tolerances: central differences with step h = 1e-5 have truncation error ~ h^2 f''' ~ 1e-10
 * and rounding error ~ 1e-16 / h ~ 1e-11, so |fd - grad| <= 1e-8 + 1e-6 |grad| has wide margin
 * while any wrong term (a missing 1/T, a sign, a missing n_valid) is off by far more. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_fld.h"
#include "testutil.h"

enum { BT = 6, HS = 3, HT = 4, V = 7 };

typedef struct tiny {
    double xs[BT * HS], ws[V * HS], bs[V], xt[BT * HT], wt[V * HT], bt[V];
    int64_t labels[BT];
} tiny;

static double loss_of(const tiny *t, const kt_fld_cfg *c) {
    double zs[BT * V], zt[BT * V], loss, soft, hard;
    kt_ref_logits(BT, HS, V, t->xs, t->ws, t->bs, zs);
    kt_ref_logits(BT, HT, V, t->xt, t->wt, t->bt, zt);
    kt_ref_fld_dz(c, BT, V, zs, zt, t->labels, &loss, &soft, &hard, NULL, NULL);
    return loss;
}

/* d loss / d x[i] by central differences, x being one of t's arrays. */
static double fd(tiny *t, const kt_fld_cfg *c, double *x, int64_t i) {
    const double h = 1e-5;
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = loss_of(t, c);
    x[i] = x0 - h;
    double lm = loss_of(t, c);
    x[i] = x0;
    return (lp - lm) / (2.0 * h);
}

static void fd_check(kt_rng *rng, const kt_fld_cfg *c) {
    tiny t;
    for (int i = 0; i < BT * HS; i++) t.xs[i] = kt_normal(rng);
    for (int i = 0; i < V * HS; i++) t.ws[i] = 1.5 * kt_normal(rng);
    for (int i = 0; i < BT * HT; i++) t.xt[i] = kt_normal(rng);
    for (int i = 0; i < V * HT; i++) t.wt[i] = 1.5 * kt_normal(rng);
    for (int i = 0; i < V; i++) {
        t.bs[i] = kt_normal(rng);
        t.bt[i] = kt_normal(rng);
    }
    for (int i = 0; i < BT; i++) t.labels[i] = i == 2 ? c->ignore_index : kt_randint(rng, V);

    double zs[BT * V], zt[BT * V], dz[BT * V], loss, soft, hard;
    double dxs[BT * HS], dws[V * HS], dbs[V];
    kt_ref_logits(BT, HS, V, t.xs, t.ws, t.bs, zs);
    kt_ref_logits(BT, HT, V, t.xt, t.wt, t.bt, zt);
    kt_ref_fld_dz(c, BT, V, zs, zt, t.labels, &loss, &soft, &hard, dz, NULL);
    kt_ref_fld_grads(BT, HS, V, dz, t.xs, t.ws, 0, 1, dxs, dws, dbs);
    kt_close(loss, c->w_hard * hard + c->w_soft * soft, 0, 1e-15, "loss = weighted parts");

    char what[160];
    snprintf(what, sizeof what, "beta %g T %g w %g/%g gs %g", c->beta, c->temperature, c->w_hard,
             c->w_soft, c->grad_scale);
    for (int i = 0; i < BT * HS; i++)
        kt_close(dxs[i], c->grad_scale * fd(&t, c, t.xs, i), 1e-8, 1e-6, "%s dxs[%d]", what, i);
    for (int i = 0; i < V * HS; i++)
        kt_close(dws[i], c->grad_scale * fd(&t, c, t.ws, i), 1e-8, 1e-6, "%s dws[%d]", what, i);
    for (int i = 0; i < V; i++)
        kt_close(dbs[i], c->grad_scale * fd(&t, c, t.bs, i), 1e-8, 1e-6, "%s dbs[%d]", what, i);
    /* the ignored row has no gradient */
    for (int k = 0; k < HS; k++) KT_CHECK(dxs[2 * HS + k] == 0.0, "%s ignored row grad", what);
}

/* V = 2, one row: zs = (0, 0) so Q = (1/2, 1/2); zt = (0, log 3) so P = (1/4, 3/4); label 1. */
static void closed_forms(void) {
    double zs[2] = {0.0, 0.0}, zt[2] = {0.0, log(3.0)}, loss, soft, hard;
    int64_t label[1] = {1};
    double q[2] = {0.5, 0.5}, p[2] = {0.25, 0.75};
    double want[3] = {
        p[0] * log(p[0] / q[0]) + p[1] * log(p[1] / q[1]), /* beta 0: KL(P||Q) */
        0.0,                                               /* beta 0.5: below */
        q[0] * log(q[0] / p[0]) + q[1] * log(q[1] / p[1]), /* beta 1: KL(Q||P) */
    };
    double m[2] = {0.5 * p[0] + 0.5 * q[0], 0.5 * p[1] + 0.5 * q[1]};
    want[1] = 0.5 * (p[0] * log(p[0] / m[0]) + p[1] * log(p[1] / m[1])) +
              0.5 * (q[0] * log(q[0] / m[0]) + q[1] * log(q[1] / m[1]));
    double betas[3] = {0.0, 0.5, 1.0};
    for (int i = 0; i < 3; i++) {
        kt_fld_cfg c = {betas[i], 1.0, 0.25, 0.75, 1.0, -100};
        kt_ref_fld_dz(&c, 1, 2, zs, zt, label, &loss, &soft, &hard, NULL, NULL);
        kt_close(soft, want[i], 0, 1e-14, "closed form JSD beta %g", betas[i]);
        kt_close(hard, log(2.0), 0, 1e-14, "closed form CE beta %g", betas[i]);
        kt_close(loss, 0.25 * log(2.0) + 0.75 * want[i], 0, 1e-14, "closed form loss");
    }
    /* temperature 2 on the same logits: Q stays uniform, P becomes softmax(0, log(3)/2) */
    double p2 = 1.0 / (1.0 + sqrt(3.0)), p2b = 1.0 - p2;
    kt_fld_cfg c = {0.0, 2.0, 0.0, 1.0, 1.0, -100};
    kt_ref_fld_dz(&c, 1, 2, zs, zt, label, &loss, &soft, &hard, NULL, NULL);
    kt_close(soft, p2 * log(p2 / 0.5) + p2b * log(p2b / 0.5), 0, 1e-14, "closed form T = 2");
}

/* JSD(0.5) is symmetric: swapping the two logit sets keeps the soft loss. */
static void symmetry(kt_rng *rng) {
    enum { R = 5, C = 11 };
    double a[R * C], b[R * C], l1, s1, h1, l2, s2, h2;
    int64_t labels[R] = {0, 1, 2, 3, 4};
    for (int i = 0; i < R * C; i++) {
        a[i] = 3.0 * kt_normal(rng);
        b[i] = 3.0 * kt_normal(rng);
    }
    kt_fld_cfg c = {0.5, 1.7, 0.0, 1.0, 1.0, -100};
    kt_ref_fld_dz(&c, R, C, a, b, labels, &l1, &s1, &h1, NULL, NULL);
    kt_ref_fld_dz(&c, R, C, b, a, labels, &l2, &s2, &h2, NULL, NULL);
    kt_close(s1, s2, 0, 1e-13, "JSD(0.5) symmetry");
}

int main(void) {
    /* (names a kdloss symbol, so the link keeps libkdloss, which kdtestsupport needs) */
    printf("reference checks, kdloss %s\n", kdloss_version());
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    static const double betas[] = {0.0, 0.3, 0.5, 1.0}, temps[] = {0.7, 1.0, 2.0};
    static const double wpairs[3][2] = {{1.0, 0.0}, {0.0, 1.0}, {0.4, 0.6}};
    for (int ib = 0; ib < 4; ib++)
        for (int it = 0; it < 3; it++)
            for (int iw = 0; iw < 3; iw++) {
                kt_fld_cfg c = {betas[ib], temps[it], wpairs[iw][0], wpairs[iw][1],
                                iw == 2 ? 1.3 : 1.0, iw == 1 ? 4 : -100};
                fd_check(&rng, &c);
            }
    closed_forms();
    symmetry(&rng);
    return kt_finish("test_fld_ref");
}
