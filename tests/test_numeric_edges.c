/* Numeric edges of the parameters, the same on every loss on logits (one rule, kd_fp32_normal_pos
 * in src/common/check.h): a temperature is accepted by the fused dense loss, the fused JSD, the
 * fused top-k loss, distill_logits and top-k logits alike, or refused by all with
 * KDLOSS_ERR_INVALID_PARAM and nothing written: refused T = 5.9e-39 (subnormal: the logit gaps / T
 * overflow), 3.5e38, 1e39, 1e300 (no fp32), accepted FLT_MIN, 2.5e38, 1 (their losses finite on
 * finite logits). A softcap of 1e-38 (subnormal) is refused, FLT_MIN accepted. A hidden size of 0
 * (a (3, 0) student input) is INVALID_SIZE with a detail naming the hidden size. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kdloss.h"
#include "testutil.h"

enum { BT = 3, HS = 4, V = 8, K = 2 };

static float xs[BT * HS], ws[V * HS], xt[BT * HS], wt[V * HS], zs[BT * V], zt[BT * V];
static float lp[BT * K];
static int64_t ids[BT * K], labels[BT];

/* The five losses on logits at temperature t and student softcap cap (the fused ones; the
 * others take no map), hidden size hs; their statuses into st[5], their losses into loss[5]. */
static void run_all(double t, double cap, int64_t hs, kdloss_status st[5], float loss[5]) {
    kdloss_labels lab = {labels, KDLOSS_I64};
    kdloss_cmat cxs = {xs, KDLOSS_F32, HS}, cws = {ws, KDLOSS_F32, HS};
    kdloss_cmat cxt = {xt, KDLOSS_F32, HS}, cwt = {wt, KDLOSS_F32, HS};
    kdloss_topk_teacher tk = {K, {ids, KDLOSS_I64, K}, {lp, KDLOSS_F32, K}};
    kdloss_mat none = {NULL, KDLOSS_F32, 0};
    for (int i = 0; i < 5; i++) loss[i] = -7.0f;
    kdloss_fused_linear_distill_params fd;
    kdloss_fused_linear_distill_params_default(&fd);
    fd.temperature = t;
    fd.student_map.softcap = cap;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &loss[0];
    st[0] = kdloss_fused_linear_distill(&fd, BT, hs, HS, V, cxs, cws, NULL, cxt, cwt, NULL, lab, &o,
                                        NULL, 0);
    kdloss_fljsd_params fj;
    kdloss_fljsd_params_default(&fj);
    fj.temperature = t;
    kdloss_fljsd_out oj;
    memset(&oj, 0, sizeof oj);
    oj.loss = &loss[1];
    st[1] = cap == 0.0 ? kdloss_fused_linear_jsd(&fj, BT, hs, HS, V, cxs, cws, NULL, cxt, cwt, NULL,
                                                 lab, &oj, NULL, 0)
                       : st[0]; /* no map on the JSD's parameters */
    if (cap != 0.0) loss[1] = loss[0];
    kdloss_fused_linear_topk_distill_params ft;
    kdloss_fused_linear_topk_distill_params_default(&ft);
    ft.temperature = t;
    ft.student_map.softcap = cap;
    o.loss = &loss[2];
    st[2] = kdloss_fused_linear_topk_distill(&ft, BT, hs, V, cxs, cws, NULL, tk, lab, &o, NULL, 0);
    kdloss_distill_logits_params dl;
    kdloss_distill_logits_params_default(&dl);
    dl.temperature = t;
    kdloss_cmat czs = {zs, KDLOSS_F32, V}, czt = {zt, KDLOSS_F32, V};
    st[3] = kdloss_distill_logits(&dl, BT, V, czs, czt, lab, &loss[3], NULL, none);
    kdloss_topk_distill_params tp;
    kdloss_topk_distill_params_default(&tp);
    tp.temperature = t;
    st[4] = kdloss_topk_distill_logits(&tp, BT, V, czs, tk, lab, &loss[4], NULL, none);
}

static const char *const NAMES[5] = {"fused_linear_distill", "fused_linear_jsd",
                                     "fused_linear_topk_distill", "distill_logits",
                                     "topk_distill_logits"};

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    for (int i = 0; i < BT * HS; i++) xs[i] = (float)kt_normal(&rng), xt[i] = (float)kt_normal(&rng);
    for (int i = 0; i < V * HS; i++) ws[i] = (float)kt_normal(&rng), wt[i] = (float)kt_normal(&rng);
    for (int i = 0; i < BT * V; i++) zs[i] = (float)kt_normal(&rng), zt[i] = (float)kt_normal(&rng);
    for (int r = 0; r < BT; r++) {
        labels[r] = r % V;
        for (int k = 0; k < K; k++) ids[r * K + k] = (r + 3 * k) % V, lp[r * K + k] = -1.0f - (float)k;
    }
    kdloss_status st[5];
    float loss[5];
    static const double refused[] = {5.9e-39, 3.5e38, 1e39, 1e300};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        run_all(refused[i], 0.0, HS, st, loss);
        for (int f = 0; f < 5; f++)
            KT_CHECK(st[f] == KDLOSS_ERR_INVALID_PARAM && loss[f] == -7.0f,
                     "%s at T = %g: status %d, loss %g (want INVALID_PARAM, nothing written)",
                     NAMES[f], refused[i], (int)st[f], loss[f]);
    }
    static const double accepted[] = {FLT_MIN, 2.5e38, 1.0};
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        run_all(accepted[i], 0.0, HS, st, loss);
        for (int f = 0; f < 5; f++)
            KT_CHECK(st[f] == KDLOSS_OK && (isfinite(loss[f]) || accepted[i] < 1e-30),
                     "%s at T = %g: status %d, loss %g (want OK, a finite loss)", NAMES[f],
                     accepted[i], (int)st[f], loss[f]);
    }
    run_all(1.0, 1e-38, HS, st, loss); /* a subnormal softcap */
    for (int f = 0; f < 3; f++)
        KT_CHECK(st[f] == KDLOSS_ERR_INVALID_PARAM && loss[f] == -7.0f,
                 "%s with softcap 1e-38: status %d (want INVALID_PARAM, nothing written)", NAMES[f],
                 (int)st[f]);
    run_all(1.0, FLT_MIN, HS, st, loss);
    for (int f = 0; f < 3; f++)
        KT_CHECK(st[f] == KDLOSS_OK, "%s with softcap FLT_MIN: status %d", NAMES[f], (int)st[f]);
    run_all(1.0, 0.0, 0, st, loss); /* a (3, 0) student input */
    for (int f = 0; f < 3; f++) {
        run_all(1.0, 0.0, 0, st, loss);
        KT_CHECK(st[f] == KDLOSS_ERR_INVALID_SIZE, "%s with hs 0: status %d", NAMES[f], (int)st[f]);
    }
    kdloss_fused_linear_distill_params fd;
    kdloss_fused_linear_distill_params_default(&fd);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    float l;
    o.loss = &l;
    kdloss_cmat c = {xs, KDLOSS_F32, 1};
    kdloss_status s = kdloss_fused_linear_distill(&fd, BT, 0, HS, V, c, c, NULL, c, c, NULL,
                                                  (kdloss_labels){labels, KDLOSS_I64}, &o, NULL, 0);
    KT_CHECK(s == KDLOSS_ERR_INVALID_SIZE && strstr(kdloss_error_detail(), "hidden size"),
             "hs 0: status %d, detail [%s] (want one naming the hidden size)", (int)s,
             kdloss_error_detail());
    return kt_finish("test_numeric_edges");
}
