/* The NaN policy and wide rows (docs/MATH.md section 10), on every CPU path (KT_FOR_EACH_ISA).
 *
 * D6, the NaN policy (kdloss.h, "Non-finite inputs"): in a call of 3 rows whose middle row holds
 * one NaN (or a +inf logit, or a +inf log-prob) the middle row's loss, the total loss and every
 * element of the middle row's gradient are NaN, and rows 0 and 2 (loss and gradient) are bitwise
 * those of the same call with a clean middle row (n_valid is the same). For kdloss_distill (the
 * six divergences, NaN in the student, in the teacher, in the student where the teacher is -inf,
 * +inf in the teacher; fp32 and bf16), kdloss_jsd, kdloss_kl_div (probability and log targets),
 * kdloss_distill_logits (six divergences; NaN student / teacher logit, +inf logit; fp32 and
 * bf16; V 37 and 1100), kdloss_topk_distill_logits (bucket, renorm_both, renorm_teacher: NaN
 * used log-prob, +inf used log-prob, NaN student logit at S and outside S; a NaN in an unused slot
 * or, for renorm_both, outside S is not read: finite), kdloss_fused_linear_distill (a NaN in one
 * row of xs, and of xt: row_soft NaN there, loss NaN, that dxs row NaN, the other rows' row_soft
 * and dxs as the clean call's) and kdloss_fused_linear_topk_distill (a NaN used log-prob). An
 * ignored row's NaN is never read (finite loss, zero gradient). grad_scale 0 writes zeros.
 *
 * D4: logits spanning more than FLT_MAX ([3e38, -3e38, 0] and the teacher swapped) at T 4, 1e3,
 * 1e30: kdloss_distill_logits (forward / reverse KL, JSD) against a double reference, loss to
 * 1e-5 relative, gradient to 1e-5 of its largest element; the fused dense loss (Hs = 1, ws holds
 * the logits) against the same reference; the top-k bucket with K = V equal to the dense loss. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define BT 3

static const kdloss_labels NOLAB = {NULL, KDLOSS_I64};

static int all_nan(const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isnan(g[i])) return 0;
    return 1;
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* fp32 copy of a bf16 / fp32 buffer of n elements */
static void to_f32(const void *p, kdloss_dtype dt, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = (float)kt_get(p, dt, 0, 0, i);
}

/* Checks a poisoned call (loss, rl, g: BT x v in dtype dt) against the clean call (loss0, rl0,
 * g0): row 1 NaN, rows 0 and 2 the clean call's. */
static void check_poisoned(const char *what, int64_t v, kdloss_dtype dt, float loss, const float *rl,
                           const void *g, const float *rl0, const void *g0) {
    float *a = malloc(sizeof(float) * BT * v), *b = malloc(sizeof(float) * BT * v);
    to_f32(g, dt, BT * v, a);
    to_f32(g0, dt, BT * v, b);
    KT_CHECK(isnan(loss), "%s: loss %g, want NaN", what, loss);
    KT_CHECK(isnan(rl[1]), "%s: row loss %g, want NaN", what, rl[1]);
    KT_CHECK(all_nan(a + v, v), "%s: the poisoned row's gradient is not all NaN", what);
    KT_CHECK(same_bits(rl, rl0, 1) && same_bits(rl + 2, rl0 + 2, 1),
             "%s: clean rows' losses changed (%g %g vs %g %g)", what, rl[0], rl[2], rl0[0], rl0[2]);
    KT_CHECK(same_bits(a, b, v) && same_bits(a + 2 * v, b + 2 * v, v),
             "%s: clean rows' gradients changed", what);
    free(a);
    free(b);
}

/* The poisoned value put at element (1, col) of the student (who 0) or the teacher (who 1). */
typedef struct poison {
    const char *name;
    int who;
    double val;
    double teacher_there; /* NAN: leave the teacher's value; else set it there too */
} poison;

static void distill_logprobs(kt_rng *rng) {
    const int64_t v = 37;
    const poison ps[] = {{"NaN student", 0, NAN, NAN},
                         {"NaN teacher", 1, NAN, NAN},
                         {"NaN student where P = 0", 0, NAN, -INFINITY},
                         {"+inf teacher", 1, INFINITY, NAN}};
    double *x = malloc(sizeof(double) * BT * v), *y = malloc(sizeof(double) * BT * v);
    kt_uniform_rows(rng, x, BT, v, 1);
    kt_uniform_rows(rng, y, BT, v, 1);
    for (int dti = 0; dti < 2; dti++) {
        kdloss_dtype dt = dti ? KDLOSS_BF16 : KDLOSS_F32;
        for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
            for (int dv = 0; dv <= 5; dv++) {
                double *x1 = malloc(sizeof(double) * BT * v), *y1 = malloc(sizeof(double) * BT * v);
                memcpy(x1, x, sizeof(double) * BT * v);
                memcpy(y1, y, sizeof(double) * BT * v);
                (ps[pi].who ? y1 : x1)[v + 5] = ps[pi].val;
                if (!isnan(ps[pi].teacher_there)) y1[v + 5] = ps[pi].teacher_there;
                void *s0 = kt_pack(x, BT, v, v, dt), *t0 = kt_pack(y, BT, v, v, dt);
                void *s1 = kt_pack(x1, BT, v, v, dt), *t1 = kt_pack(y1, BT, v, v, dt);
                void *g0 = malloc(4 * BT * v), *g1 = malloc(4 * BT * v);
                float l0, l1, rl0[BT], rl1[BT];
                kdloss_distill_params p;
                kdloss_distill_params_default(&p);
                p.div.divergence = (kdloss_divergence)dv;
                KT_CHECK(kdloss_distill(&p, BT, v, (kdloss_cmat){s0, dt, 0}, (kdloss_cmat){t0, dt, 0},
                                        NOLAB, &l0, rl0, (kdloss_mat){g0, dt, 0}) == KDLOSS_OK,
                         "distill clean");
                KT_CHECK(kdloss_distill(&p, BT, v, (kdloss_cmat){s1, dt, 0}, (kdloss_cmat){t1, dt, 0},
                                        NOLAB, &l1, rl1, (kdloss_mat){g1, dt, 0}) == KDLOSS_OK,
                         "distill poisoned");
                char what[160];
                snprintf(what, sizeof what, "distill %s div %d %s", ps[pi].name, dv,
                         kt_dtype_name(dt));
                check_poisoned(what, v, dt, l1, rl1, g1, rl0, g0);
                if (dv == KDLOSS_DIV_JSD) { /* the wrapper */
                    kdloss_jsd_params jp;
                    kdloss_jsd_params_default(&jp);
                    float lj, rlj[BT];
                    kdloss_jsd(&jp, BT, v, (kdloss_cmat){s1, dt, 0}, (kdloss_cmat){t1, dt, 0}, NOLAB,
                               &lj, rlj, (kdloss_mat){g1, dt, 0});
                    snprintf(what, sizeof what, "jsd %s %s", ps[pi].name, kt_dtype_name(dt));
                    check_poisoned(what, v, dt, lj, rlj, g1, rl0, g0);
                }
                /* an ignored poisoned row is never read */
                int64_t lab[BT] = {0, -100, 1};
                memset(g1, 0x55, 4 * BT * v);
                KT_CHECK(kdloss_distill(&p, BT, v, (kdloss_cmat){s1, dt, 0}, (kdloss_cmat){t1, dt, 0},
                                        (kdloss_labels){lab, KDLOSS_I64}, &l1, rl1,
                                        (kdloss_mat){g1, dt, 0}) == KDLOSS_OK &&
                             isfinite(l1) && rl1[1] == 0.0f && kt_get(g1, dt, v, 1, 5) == 0.0,
                         "%s: ignored row read (loss %g)", what, l1);
                /* grad_scale 0: zeros */
                p.grad_scale = 0.0;
                kdloss_distill(&p, BT, v, (kdloss_cmat){s1, dt, 0}, (kdloss_cmat){t1, dt, 0}, NOLAB,
                               &l1, rl1, (kdloss_mat){g1, dt, 0});
                KT_CHECK(isnan(l1) && kt_get(g1, dt, v, 1, 5) == 0.0 && kt_get(g1, dt, v, 1, 0) == 0.0,
                         "%s: grad_scale 0 must write zeros", what);
                free(x1), free(y1), free(s0), free(t0), free(s1), free(t1), free(g0), free(g1);
            }
    }
    /* kl_div: probability and log targets, a NaN input, a NaN target, a NaN input where t = 0 */
    for (int lt = 0; lt < 2; lt++)
        for (int pi = 0; pi < 3; pi++) {
            float s[BT * 37], t[BT * 37], g0[BT * 37], g1[BT * 37], l0, l1, rl0[BT], rl1[BT];
            for (int64_t i = 0; i < BT * v; i++) {
                s[i] = (float)x[i];
                t[i] = lt ? (float)y[i] : (float)exp(y[i]);
            }
            kdloss_kl_params kp;
            kdloss_kl_params_default(&kp);
            kp.log_target = lt;
            kp.reduction = KDLOSS_REDUCTION_SUM;
            kdloss_kl_div(&kp, BT, v, (kdloss_cmat){s, KDLOSS_F32, 0}, (kdloss_cmat){t, KDLOSS_F32, 0},
                          &l0, rl0, (kdloss_mat){NULL, KDLOSS_F32, 0}, (kdloss_mat){g0, KDLOSS_F32, 0});
            if (pi == 0) s[v + 3] = NAN;
            if (pi == 1) t[v + 3] = NAN;
            if (pi == 2) s[v + 3] = NAN, t[v + 3] = lt ? -INFINITY : 0.0f;
            if (pi == 2) t[v + 3] = lt ? -INFINITY : 0.0f;
            if (pi == 2) { /* the clean call with the same zero target */
                float s2[BT * 37];
                memcpy(s2, s, sizeof s2);
                s2[v + 3] = 0.0f;
                kdloss_kl_div(&kp, BT, v, (kdloss_cmat){s2, KDLOSS_F32, 0},
                              (kdloss_cmat){t, KDLOSS_F32, 0}, &l0, rl0,
                              (kdloss_mat){NULL, KDLOSS_F32, 0}, (kdloss_mat){g0, KDLOSS_F32, 0});
            }
            kdloss_kl_div(&kp, BT, v, (kdloss_cmat){s, KDLOSS_F32, 0}, (kdloss_cmat){t, KDLOSS_F32, 0},
                          &l1, rl1, (kdloss_mat){NULL, KDLOSS_F32, 0}, (kdloss_mat){g1, KDLOSS_F32, 0});
            char what[96];
            snprintf(what, sizeof what, "kl_div log_target %d case %d", lt, pi);
            check_poisoned(what, v, KDLOSS_F32, l1, rl1, g1, rl0, g0);
        }
    free(x);
    free(y);
}

static void distill_logits(kt_rng *rng) {
    const poison ps[] = {{"NaN student", 0, NAN, NAN},
                         {"NaN teacher", 1, NAN, NAN},
                         {"+inf student", 0, INFINITY, NAN},
                         {"+inf teacher", 1, INFINITY, NAN}};
    const int64_t vs[] = {37, 1100};
    for (int vi = 0; vi < 2; vi++) {
        int64_t v = vs[vi];
        double *x = malloc(sizeof(double) * BT * v), *y = malloc(sizeof(double) * BT * v);
        kt_uniform_rows(rng, x, BT, v, 0);
        kt_uniform_rows(rng, y, BT, v, 0);
        for (int dti = 0; dti < 2; dti++) {
            kdloss_dtype dt = dti ? KDLOSS_BF16 : KDLOSS_F32;
            for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
                for (int dv = 0; dv <= 5; dv++)
                    for (int ti = 0; ti < 2; ti++) {
                        double *x1 = malloc(sizeof(double) * BT * v);
                        double *y1 = malloc(sizeof(double) * BT * v);
                        memcpy(x1, x, sizeof(double) * BT * v);
                        memcpy(y1, y, sizeof(double) * BT * v);
                        (ps[pi].who ? y1 : x1)[v + v - 3] = ps[pi].val;
                        void *s0 = kt_pack(x, BT, v, v, dt), *t0 = kt_pack(y, BT, v, v, dt);
                        void *s1 = kt_pack(x1, BT, v, v, dt), *t1 = kt_pack(y1, BT, v, v, dt);
                        void *g0 = malloc(4 * BT * v), *g1 = malloc(4 * BT * v);
                        float l0, l1, rl0[BT], rl1[BT];
                        kdloss_distill_logits_params p;
                        kdloss_distill_logits_params_default(&p);
                        p.div.divergence = (kdloss_divergence)dv;
                        p.temperature = ti ? 2.0 : 1.0;
                        kdloss_distill_logits(&p, BT, v, (kdloss_cmat){s0, dt, 0},
                                              (kdloss_cmat){t0, dt, 0}, NOLAB, &l0, rl0,
                                              (kdloss_mat){g0, dt, 0});
                        kdloss_distill_logits(&p, BT, v, (kdloss_cmat){s1, dt, 0},
                                              (kdloss_cmat){t1, dt, 0}, NOLAB, &l1, rl1,
                                              (kdloss_mat){g1, dt, 0});
                        char what[160];
                        snprintf(what, sizeof what, "distill_logits %s div %d T %g V %lld %s",
                                 ps[pi].name, dv, p.temperature, (long long)v, kt_dtype_name(dt));
                        check_poisoned(what, v, dt, l1, rl1, g1, rl0, g0);
                        /* forward only: the same losses */
                        float l2, rl2[BT];
                        kdloss_distill_logits(&p, BT, v, (kdloss_cmat){s1, dt, 0},
                                              (kdloss_cmat){t1, dt, 0}, NOLAB, &l2, rl2,
                                              (kdloss_mat){NULL, dt, 0});
                        KT_CHECK(isnan(l2) && isnan(rl2[1]) && same_bits(rl2, rl0, 1),
                                 "%s: forward only", what);
                        p.grad_scale = 0.0;
                        kdloss_distill_logits(&p, BT, v, (kdloss_cmat){s1, dt, 0},
                                              (kdloss_cmat){t1, dt, 0}, NOLAB, &l2, rl2,
                                              (kdloss_mat){g1, dt, 0});
                        KT_CHECK(isnan(l2) && kt_get(g1, dt, v, 1, 0) == 0.0,
                                 "%s: grad_scale 0 must write zeros", what);
                        free(x1), free(y1), free(s0), free(t0), free(s1), free(t1), free(g0),
                            free(g1);
                    }
        }
        free(x);
        free(y);
    }
}

static void topk(kt_rng *rng) {
    const int64_t v = 40, k = 6;
    double *x = malloc(sizeof(double) * BT * v);
    kt_uniform_rows(rng, x, BT, v, 0);
    float s0[BT * 40], s1[BT * 40], g0[BT * 40], g1[BT * 40], lp0[BT * 6], lp1[BT * 6];
    int32_t ids[BT * 6];
    for (int64_t i = 0; i < BT * v; i++) s0[i] = (float)x[i];
    for (int64_t r = 0; r < BT; r++)
        for (int64_t j = 0; j < k; j++) {
            ids[r * k + j] = (int32_t)(3 * j + r);
            lp0[r * k + j] = (float)(-1.0 - 0.5 * (double)j);
        }
    ids[1 * k + 5] = -1; /* an unused slot in the poisoned row */
    lp0[1 * k + 5] = NAN;
    enum { LP_NAN, LP_INF, S_NAN_IN, S_NAN_OUT, UNUSED, NCASE };
    const char *names[] = {"NaN log-prob", "+inf log-prob", "NaN student at S",
                           "NaN student outside S", "NaN unused slot only"};
    for (int tail = 0; tail < 3; tail++)
        for (int dv = 0; dv <= 5; dv++) {
            if (tail == 2 && dv != 0) continue;
            for (int c = 0; c < NCASE; c++) {
                memcpy(s1, s0, sizeof s1);
                memcpy(lp1, lp0, sizeof lp1);
                if (c == LP_NAN) lp1[1 * k + 2] = NAN;
                if (c == LP_INF) lp1[1 * k + 2] = INFINITY;
                if (c == S_NAN_IN) s1[1 * v + ids[1 * k + 1]] = NAN;
                if (c == S_NAN_OUT) s1[1 * v + 39] = NAN;
                kdloss_topk_distill_params p;
                kdloss_topk_distill_params_default(&p);
                p.div.divergence = (kdloss_divergence)dv;
                p.tail = (kdloss_topk_tail)tail;
                p.temperature = 1.5;
                kdloss_topk_teacher t0 = {k, {ids, KDLOSS_I32, 0}, {lp0, KDLOSS_F32, 0}};
                kdloss_topk_teacher t1 = {k, {ids, KDLOSS_I32, 0}, {lp1, KDLOSS_F32, 0}};
                float l0, l1, rl0[BT], rl1[BT];
                KT_CHECK(kdloss_topk_distill_logits(&p, BT, v, (kdloss_cmat){s0, KDLOSS_F32, 0}, t0,
                                                    NOLAB, &l0, rl0,
                                                    (kdloss_mat){g0, KDLOSS_F32, 0}) == KDLOSS_OK,
                         "topk clean");
                kdloss_topk_distill_logits(&p, BT, v, (kdloss_cmat){s1, KDLOSS_F32, 0}, t1, NOLAB,
                                           &l1, rl1, (kdloss_mat){g1, KDLOSS_F32, 0});
                char what[128];
                snprintf(what, sizeof what, "topk %s tail %d div %d", names[c], tail, dv);
                if (c == UNUSED || (c == S_NAN_OUT && tail == 1)) { /* not read */
                    KT_CHECK(isfinite(l1) && same_bits(rl1, rl0, BT),
                             "%s: an unread NaN changed the losses (%g)", what, l1);
                    int fin = 1;
                    for (int64_t j = 0; j < v; j++) fin &= c == UNUSED ? g1[v + j] == g0[v + j]
                                                         : j == 39 || isfinite(g1[v + j]);
                    KT_CHECK(fin, "%s: gradient", what);
                } else {
                    check_poisoned(what, v, KDLOSS_F32, l1, rl1, g1, rl0, g0);
                }
            }
        }
    free(x);
}

/* fused dense: xs (BT x 4), ws (V x 4), xt (BT x 3), wt (V x 3); a NaN in row 1 of xs or xt */
static void fused(kt_rng *rng) {
    const int64_t v = 300, hs = 4, ht = 3;
    float xs[BT * 4], ws[300 * 4], xt[BT * 3], wt[300 * 3];
    for (int64_t i = 0; i < BT * hs; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < v * hs; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < BT * ht; i++) xt[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < v * ht; i++) wt[i] = (float)(2 * kt_uniform(rng) - 1);
    int64_t lab[BT] = {3, 7, 11};
    for (int who = 0; who < 2; who++)
        for (int dv = 0; dv <= 5; dv++) {
            kdloss_fused_linear_distill_params p;
            kdloss_fused_linear_distill_params_default(&p);
            p.div.divergence = (kdloss_divergence)dv;
            p.temperature = 2.0;
            float l[2], rs[2][BT], dxs[2][BT * 4];
            for (int run = 0; run < 2; run++) {
                float xs1[BT * 4], xt1[BT * 3];
                memcpy(xs1, xs, sizeof xs1);
                memcpy(xt1, xt, sizeof xt1);
                if (run) (who ? xt1 : xs1)[1 * (who ? ht : hs) + 1] = NAN;
                kdloss_fused_linear_distill_out o;
                memset(&o, 0, sizeof o);
                o.loss = &l[run];
                o.row_soft = rs[run];
                o.dxs = (kdloss_mat){dxs[run], KDLOSS_F32, 0};
                kdloss_status st = kdloss_fused_linear_distill(
                    &p, BT, hs, ht, v, (kdloss_cmat){xs1, KDLOSS_F32, 0},
                    (kdloss_cmat){ws, KDLOSS_F32, 0}, NULL, (kdloss_cmat){xt1, KDLOSS_F32, 0},
                    (kdloss_cmat){wt, KDLOSS_F32, 0}, NULL, (kdloss_labels){lab, KDLOSS_I64}, &o,
                    NULL, 0);
                KT_CHECK(st == KDLOSS_OK, "fused: status %d", (int)st);
            }
            char what[96];
            snprintf(what, sizeof what, "fused dense NaN in %s div %d", who ? "xt" : "xs", dv);
            KT_CHECK(isnan(l[1]) && isnan(rs[1][1]), "%s: loss %g row %g, want NaN", what, l[1],
                     rs[1][1]);
            KT_CHECK(all_nan(dxs[1] + hs, hs), "%s: dxs row not NaN", what);
            KT_CHECK(same_bits(rs[1], rs[0], 1) && same_bits(rs[1] + 2, rs[0] + 2, 1),
                     "%s: clean rows' losses changed", what);
            int ok = 1;
            for (int64_t i = 0; i < hs; i++)
                ok &= fabsf(dxs[1][i] - dxs[0][i]) <= 1e-6f * (1 + fabsf(dxs[0][i])) &&
                      fabsf(dxs[1][2 * hs + i] - dxs[0][2 * hs + i]) <= 1e-6f * (1 + fabsf(dxs[0][2 * hs + i]));
            KT_CHECK(ok, "%s: clean rows' dxs changed", what);
        }
    /* fused top-k bucket: a NaN used log-prob in row 1 */
    int32_t ids[BT * 4];
    float lp[BT * 4];
    for (int64_t i = 0; i < BT * 4; i++) ids[i] = (int32_t)(5 * i), lp[i] = -1.0f - (float)(i % 4);
    for (int run = 0; run < 2; run++) {
        static float l[2], rs[2][BT], dxs[2][BT * 4];
        if (run) lp[4 + 2] = NAN;
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        kdloss_fused_linear_distill_out o;
        memset(&o, 0, sizeof o);
        o.loss = &l[run];
        o.row_soft = rs[run];
        o.dxs = (kdloss_mat){dxs[run], KDLOSS_F32, 0};
        kdloss_topk_teacher t = {4, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
        for (int tail = 0; tail < 2; tail++) {
            p.tail = (kdloss_topk_tail)tail; /* renorm_both: the sparse path */
            KT_CHECK(kdloss_fused_linear_topk_distill(&p, BT, hs, v, (kdloss_cmat){xs, KDLOSS_F32, 0},
                                                      (kdloss_cmat){ws, KDLOSS_F32, 0}, NULL, t,
                                                      NOLAB, &o, NULL, 0) == KDLOSS_OK,
                     "fused topk status");
            if (run)
                KT_CHECK(isnan(l[1]) && isnan(rs[1][1]) && all_nan(dxs[1] + hs, hs) &&
                             isfinite(rs[1][0]) && isfinite(rs[1][2]) && isfinite(dxs[1][0]),
                         "fused topk tail %d: NaN log-prob not propagated", tail);
        }
    }
}

/* D4: a row spanning more than FLT_MAX */
static void ref_row(const double *zs, const double *zt, int64_t v, double T, int div, double *loss,
                    double *dz) {
    double ms = -INFINITY, mt = -INFINITY, ss = 0, st = 0, x[8], y[8], g[8], sg = 0;
    for (int64_t j = 0; j < v; j++) ms = fmax(ms, zs[j]), mt = fmax(mt, zt[j]);
    for (int64_t j = 0; j < v; j++) ss += exp((zs[j] - ms) / T), st += exp((zt[j] - mt) / T);
    *loss = 0;
    for (int64_t j = 0; j < v; j++) {
        x[j] = (zs[j] - ms) / T - log(ss);
        y[j] = (zt[j] - mt) / T - log(st);
        double p = exp(y[j]), q = exp(x[j]);
        if (div == 0) *loss += p > 0 ? p * (y[j] - x[j]) : 0, g[j] = -p;
        else if (div == 1) *loss += q > 0 ? q * (x[j] - y[j]) : 0, g[j] = q > 0 ? q * (x[j] - y[j] + 1) : 0;
        else { /* JSD 0.5 */
            double m = 0.5 * (p + q), lm = log(m);
            *loss += 0.5 * ((p > 0 ? p * (y[j] - lm) : 0) + (q > 0 ? q * (x[j] - lm) : 0));
            g[j] = q > 0 ? 0.5 * q * (x[j] - lm) : 0;
        }
        sg += g[j];
    }
    for (int64_t j = 0; j < v; j++) dz[j] = (g[j] - exp(x[j]) * sg) / T;
}

static void wide(void) {
    const double a[3] = {3e38, -3e38, 0}, b[3] = {0, 0, 0}, c[3] = {1e38, -2.5e38, 3e38};
    const double *rows[3][2] = {{a, b}, {b, a}, {c, a}};
    const double ts[3] = {4, 1e3, 1e30};
    const int divs[3] = {KDLOSS_DIV_FORWARD_KL, KDLOSS_DIV_REVERSE_KL, KDLOSS_DIV_JSD};
    for (int ri = 0; ri < 3; ri++)
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < 3; di++) {
                const double *zs = rows[ri][0], *zt = rows[ri][1];
                double rl, rdz[3], gmax = 0;
                ref_row(zs, zt, 3, ts[ti], di, &rl, rdz);
                for (int j = 0; j < 3; j++) gmax = fmax(gmax, fabs(rdz[j]));
                float s[3], t[3], g[3], loss;
                for (int j = 0; j < 3; j++) s[j] = (float)zs[j], t[j] = (float)zt[j];
                kdloss_distill_logits_params p;
                kdloss_distill_logits_params_default(&p);
                p.div.divergence = (kdloss_divergence)divs[di];
                p.temperature = ts[ti];
                KT_CHECK(kdloss_distill_logits(&p, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0},
                                               (kdloss_cmat){t, KDLOSS_F32, 0}, NOLAB, &loss, NULL,
                                               (kdloss_mat){g, KDLOSS_F32, 0}) == KDLOSS_OK,
                         "wide status");
                kt_close(loss, rl, 0, 1e-5, "wide row %d T %g div %d: loss", ri, ts[ti], divs[di]);
                for (int j = 0; j < 3; j++)
                    kt_close(g[j], rdz[j], 1e-5 * gmax, 0, "wide row %d T %g div %d: dz[%d]", ri,
                             ts[ti], divs[di], j);
                /* the fused loss: Hs = Ht = 1, xs = xt = 1, ws / wt the logits */
                float one = 1.0f, soft;
                int64_t lab = 0;
                kdloss_fused_linear_distill_params fp;
                kdloss_fused_linear_distill_params_default(&fp);
                fp.div.divergence = (kdloss_divergence)divs[di];
                fp.temperature = ts[ti];
                kdloss_fused_linear_distill_out o;
                memset(&o, 0, sizeof o);
                o.soft_loss = &soft;
                float dxs;
                o.dxs = (kdloss_mat){&dxs, KDLOSS_F32, 0};
                fp.weight_hard_loss = 0.0;
                fp.weight_soft_loss = 1.0;
                KT_CHECK(kdloss_fused_linear_distill(&fp, 1, 1, 1, 3, (kdloss_cmat){&one, KDLOSS_F32, 0},
                                                     (kdloss_cmat){s, KDLOSS_F32, 0}, NULL,
                                                     (kdloss_cmat){&one, KDLOSS_F32, 0},
                                                     (kdloss_cmat){t, KDLOSS_F32, 0}, NULL,
                                                     (kdloss_labels){&lab, KDLOSS_I64}, &o, NULL,
                                                     0) == KDLOSS_OK,
                         "wide fused status");
                double rdx = rdz[0] * s[0] + rdz[1] * s[1] + rdz[2] * s[2];
                kt_close(soft, rl, 0, 1e-5, "wide fused row %d T %g div %d: soft", ri, ts[ti], divs[di]);
                kt_close(dxs, rdx, 1e-5 * gmax * 3e38, 0, "wide fused row %d T %g div %d: dxs", ri,
                         ts[ti], divs[di]);
                /* top-k bucket with K = V: the dense loss on log_softmax(zt / T) */
                if (divs[di] == KDLOSS_DIV_FORWARD_KL) {
                    int32_t ids[3] = {0, 1, 2};
                    float lp[3], tl, tg[3];
                    double mt = -INFINITY, st = 0;
                    for (int j = 0; j < 3; j++) mt = fmax(mt, zt[j]);
                    for (int j = 0; j < 3; j++) st += exp((zt[j] - mt) / ts[ti]);
                    for (int j = 0; j < 3; j++) lp[j] = (float)((zt[j] - mt) / ts[ti] - log(st));
                    kdloss_topk_distill_params tp;
                    kdloss_topk_distill_params_default(&tp);
                    tp.temperature = ts[ti];
                    kdloss_topk_teacher tk = {3, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
                    KT_CHECK(kdloss_topk_distill_logits(&tp, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0},
                                                        tk, NOLAB, &tl, NULL,
                                                        (kdloss_mat){tg, KDLOSS_F32, 0}) == KDLOSS_OK,
                             "wide topk status");
                    kt_close(tl, rl, 0, 1e-5, "wide topk row %d T %g: loss", ri, ts[ti]);
                }
            }
}


/* ---- the fuzzer's findings (tests/fuzz/fuzz_api.c), each on every CPU path ---- */

/* grad_scale 0 writes zeros, also where the unscaled element is infinite: reverse KL with a
 * teacher's -inf log-prob against a finite student one (Q (X - Y + 1) = +inf; inf x 0 was
 * NaN), fp32 and bf16, V 2 and 1100 (the vector body and tail); kdloss_kl_div with a log
 * target of 100 (-exp(100) = -inf), loss and gradient, and gradient alone. */
static uint16_t d7_bf16(float f) { /* truncated: exact for the values used */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static void d7_grad_scale_zero(void) {
    enum { V = 1100 };
    static float x[V], y[V], g[V], gl[V];
    static uint16_t xb[V], yb[V], gb[V];
    for (int64_t v = 2; v <= V; v += V - 2)
        for (int bf = 0; bf < 2; bf++) {
            for (int64_t c = 0; c < v; c++) {
                x[c] = -0.5f - 0.5f * (float)(c % 3);
                y[c] = c % 2 ? -0.1f : -INFINITY;
                g[c] = 7.0f;
                xb[c] = d7_bf16(x[c]), yb[c] = d7_bf16(y[c]), gb[c] = 0x40e0;
            }
            kdloss_distill_params p;
            kdloss_distill_params_default(&p);
            p.div.divergence = KDLOSS_DIV_REVERSE_KL;
            p.grad_scale = 0.0;
            kdloss_dtype dt = bf ? KDLOSS_BF16 : KDLOSS_F32;
            float loss;
            kdloss_status st = kdloss_distill(&p, 1, v, (kdloss_cmat){bf ? (void *)xb : x, dt, 0},
                                              (kdloss_cmat){bf ? (void *)yb : y, dt, 0}, NOLAB, &loss,
                                              NULL, (kdloss_mat){bf ? (void *)gb : g, dt, 0});
            int zero = 1;
            for (int64_t c = 0; c < v; c++) zero &= kt_get(bf ? (void *)gb : g, dt, 0, 0, c) == 0.0;
            KT_CHECK(st == KDLOSS_OK && zero, "D7 distill reverse KL grad_scale 0 (v %lld bf16 %d): "
                     "gradient not all zeros (%g)", (long long)v, bf, kt_get(bf ? (void *)gb : g, dt, 0, 0, 0));
        }
    /* in place (grad.data == student.data), grad_scale 0: the loss of the row as read, then zeros */
    for (int kl = 0; kl < 2; kl++) {
        for (int64_t c = 0; c < V; c++) x[c] = -0.5f - 0.001f * (float)c, y[c] = -1.0f - 0.002f * (float)c;
        memcpy(gl, x, sizeof gl);
        float l0, l1;
        kdloss_status s0, s1;
        if (kl) {
            kdloss_kl_params q;
            kdloss_kl_params_default(&q);
            q.log_target = 1, q.grad_scale = 0.0;
            kdloss_mat none = {NULL, KDLOSS_F32, 0};
            s0 = kdloss_kl_div(&q, 1, V, (kdloss_cmat){x, KDLOSS_F32, 0}, (kdloss_cmat){y, KDLOSS_F32, 0}, &l0, NULL, none, none);
            s1 = kdloss_kl_div(&q, 1, V, (kdloss_cmat){gl, KDLOSS_F32, 0}, (kdloss_cmat){y, KDLOSS_F32, 0}, &l1, NULL, none,
                               (kdloss_mat){gl, KDLOSS_F32, 0});
        } else {
            kdloss_distill_params p;
            kdloss_distill_params_default(&p);
            p.grad_scale = 0.0;
            s0 = kdloss_distill(&p, 1, V, (kdloss_cmat){x, KDLOSS_F32, 0}, (kdloss_cmat){y, KDLOSS_F32, 0}, NOLAB, &l0,
                                NULL, (kdloss_mat){NULL, KDLOSS_F32, 0});
            s1 = kdloss_distill(&p, 1, V, (kdloss_cmat){gl, KDLOSS_F32, 0}, (kdloss_cmat){y, KDLOSS_F32, 0}, NOLAB, &l1,
                                NULL, (kdloss_mat){gl, KDLOSS_F32, 0});
        }
        int zero = 1;
        for (int64_t c = 0; c < V; c++) zero &= gl[c] == 0.0f;
        KT_CHECK(s0 == KDLOSS_OK && s1 == KDLOSS_OK && same_bits(&l0, &l1, 1) && zero,
                 "D7 %s in place, grad_scale 0: loss %g (not in place %g), gradient %g", kl ? "kl_div" : "distill",
                 l1, l0, gl[0]);
    }
    for (int mode = 0; mode < 2; mode++) { /* 0: loss and gradient, 1: gradient alone */
        for (int64_t c = 0; c < V; c++) x[c] = -1.0f, y[c] = c % 5 ? -2.0f : 100.0f, gl[c] = 7.0f;
        kdloss_kl_params q;
        kdloss_kl_params_default(&q);
        q.log_target = 1;
        q.grad_scale = 0.0;
        float loss;
        kdloss_status st = kdloss_kl_div(&q, 1, V, (kdloss_cmat){x, KDLOSS_F32, 0},
                                         (kdloss_cmat){y, KDLOSS_F32, 0}, mode ? NULL : &loss, NULL,
                                         (kdloss_mat){NULL, KDLOSS_F32, 0},
                                         (kdloss_mat){gl, KDLOSS_F32, 0});
        int zero = 1;
        for (int64_t c = 0; c < V; c++) zero &= gl[c] == 0.0f;
        KT_CHECK(st == KDLOSS_OK && zero, "D7 kl_div log target 100, grad_scale 0 (mode %d): gradient %g, want 0",
                 mode, gl[0]);
    }
}

/* The identity all-reduce of one rank (the _vp entry on the whole vocabulary). */
static int d7_ar(void *c, void *b, int64_t n, kdloss_dtype d, kdloss_comm_op o) {
    (void)c, (void)b, (void)n, (void)d, (void)o;
    return 0;
}

enum { D7_BT = 3, D7_HS = 2, D7_V = 8, D7_K = 2 };
typedef struct {
    float loss, rs[D7_BT], lse[D7_BT], dxs[D7_BT * D7_HS], dws[D7_V * D7_HS], dbs[D7_V];
    kdloss_status st;
} d7_out;

/* One fused top-k call (vp: the _vp entry with one rank), every output but hard asked for when
 * `all` (row_lse: not the sparse path), else loss, row_soft, dxs, dws, dbs. */
static void d7_fused(const kdloss_fused_linear_topk_distill_params *p, int vp, int all, const float *xs,
                     const float *ws, const float *bs, const int32_t *ids, const float *lp, d7_out *r) {
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    memset(r, 0x7f, sizeof *r);
    o.loss = &r->loss, o.row_soft = r->rs, o.row_lse = all ? r->lse : NULL;
    o.dxs = (kdloss_mat){r->dxs, KDLOSS_F32, 0}, o.dws = (kdloss_mat){r->dws, KDLOSS_F32, 0};
    o.dbs = bs ? r->dbs : NULL;
    kdloss_topk_teacher t = {D7_K, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
    kdloss_comm c = {0, 1, d7_ar, NULL};
    kdloss_vocab_shard sh = {&c, D7_V, 0};
    kdloss_cmat X = {xs, KDLOSS_F32, 0}, W = {ws, KDLOSS_F32, 0};
    r->st = vp ? kdloss_fused_linear_topk_distill_vp(p, &sh, D7_BT, D7_HS, D7_V, X, W, bs, t, NOLAB, &o, NULL, 0)
               : kdloss_fused_linear_topk_distill(p, D7_BT, D7_HS, D7_V, X, W, bs, t, NOLAB, &o, NULL, 0);
}

static int d7_close(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && !(fabsf(a[i] - b[i]) <= 1e-5f * (1 + fabsf(b[i])))) return 0;
    return 1;
}

/* The fused top-k loss: (2) a row whose logits are all NaN (a NaN in its xs): row_soft NaN, its
 * dxs row and all of dws / dbs NaN, and row_lse NaN also when the row has no used slot, on
 * every path (the scalar max dropped the NaN); (3a) renorm_both, a NaN weight row outside every
 * row's S: the single-process (sparse) call and the _vp one agree, finite; (3b) renorm_both, a
 * NaN used log-prob: dws / dbs all NaN in both; (3c) weight_soft_loss 0 and weight_hard_loss 0:
 * loss 0 and zero gradients, whatever S reads (a NaN weight row in S), in both. */
static void d7_topk_fused(void) {
    float xs[D7_BT * D7_HS] = {1.0f, 0.5f, -0.5f, 0.25f, 0.75f, -1.0f}, ws[D7_V * D7_HS], bs[D7_V];
    float lp[D7_BT * D7_K] = {-1.0f, -2.0f, -0.5f, -1.5f, -0.25f, -3.0f};
    int32_t ids[D7_BT * D7_K] = {3, 0, 5, 2, 0, 5};
    for (int i = 0; i < D7_V * D7_HS; i++) ws[i] = 0.1f * (float)(i % 5) - 0.2f;
    for (int i = 0; i < D7_V; i++) bs[i] = 0.05f * (float)i;
    d7_out a, b;
    /* (2) */
    for (int tail = 0; tail < 3; tail++)
        for (int noslot = 0; noslot < 2; noslot++) {
            kdloss_fused_linear_topk_distill_params p;
            kdloss_fused_linear_topk_distill_params_default(&p);
            p.tail = (kdloss_topk_tail)tail;
            float x1[D7_BT * D7_HS];
            int32_t id1[D7_BT * D7_K];
            memcpy(x1, xs, sizeof x1);
            memcpy(id1, ids, sizeof id1);
            x1[1 * D7_HS] = NAN;
            if (noslot) id1[1 * D7_K] = id1[1 * D7_K + 1] = -1;
            d7_fused(&p, 0, 1, x1, ws, bs, id1, lp, &a);
            KT_CHECK(a.st == KDLOSS_OK && isnan(a.lse[1]) && isfinite(a.lse[0]) && isfinite(a.rs[0]),
                     "D7 fused top-k tail %d, all-NaN row (no used slot %d): row_lse %g %g, want NaN", tail,
                     noslot, a.lse[1], a.lse[0]);
            if (noslot) /* the soft part reads nothing there (kdloss.h): 0 */
                KT_CHECK(a.rs[1] == 0.0f, "D7 fused top-k tail %d, all-NaN row, no used slot: row_soft %g",
                         tail, a.rs[1]);
            else
                KT_CHECK(isnan(a.loss) && isnan(a.rs[1]) && all_nan(a.dxs + D7_HS, D7_HS) &&
                             all_nan(a.dws, D7_V * D7_HS) && all_nan(a.dbs, D7_V),
                         "D7 fused top-k tail %d, all-NaN row: loss %g row_soft %g dws[1] %g dbs[7] %g, want NaN",
                         tail, a.loss, a.rs[1], a.dws[1], a.dbs[7]);
        }
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params_default(&p);
    p.tail = KDLOSS_TAIL_RENORM_BOTH;
    p.temperature = 1.5;
    /* (3a): vocabulary row 7 is in no row's S */
    float w1[D7_V * D7_HS];
    memcpy(w1, ws, sizeof w1);
    w1[7 * D7_HS + 1] = NAN;
    d7_fused(&p, 0, 0, xs, w1, bs, ids, lp, &a);
    d7_fused(&p, 1, 0, xs, w1, bs, ids, lp, &b);
    KT_CHECK(a.st == KDLOSS_OK && b.st == KDLOSS_OK && isfinite(a.loss) && isfinite(b.loss) &&
                 d7_close(b.dxs, a.dxs, D7_BT * D7_HS) && isfinite(b.dxs[0]) && isfinite(b.dxs[1]) &&
                 d7_close(b.dws, a.dws, D7_V * D7_HS) && d7_close(b.dbs, a.dbs, D7_V),
             "D7 renorm_both, NaN weight row outside S: single %g dxs %g %g, vp %g dxs %g %g", a.loss,
             a.dxs[0], a.dxs[1], b.loss, b.dxs[0], b.dxs[1]);
    /* (3b) */
    float lp1[D7_BT * D7_K];
    memcpy(lp1, lp, sizeof lp1);
    lp1[1 * D7_K + 1] = NAN;
    d7_fused(&p, 0, 0, xs, ws, bs, ids, lp1, &a);
    d7_fused(&p, 1, 0, xs, ws, bs, ids, lp1, &b);
    KT_CHECK(a.st == KDLOSS_OK && b.st == KDLOSS_OK && isnan(a.rs[1]) && isnan(b.rs[1]) &&
                 all_nan(a.dxs + D7_HS, D7_HS) && all_nan(a.dws, D7_V * D7_HS) && all_nan(a.dbs, D7_V) &&
                 all_nan(b.dws, D7_V * D7_HS) && all_nan(b.dbs, D7_V) && d7_close(b.dxs, a.dxs, D7_BT * D7_HS),
             "D7 renorm_both, NaN used log-prob: single dws[0] %g dbs[7] %g, vp dws[0] %g dbs[7] %g (want NaN)",
             a.dws[0], a.dbs[7], b.dws[0], b.dbs[7]);
    /* (3d) a row whose gradient is 0 by the rules, its xs unread, holding a NaN: a top-k row with
     * no used slot (renorm_both: single (sparse) and _vp agree, dws finite), and an ignored row
     * of the dense fused loss (dws finite): the full path's dws GEMM skips such rows' xs */
    {
        float x1[D7_BT * D7_HS];
        int32_t id1[D7_BT * D7_K];
        memcpy(x1, xs, sizeof x1);
        memcpy(id1, ids, sizeof id1);
        x1[1 * D7_HS + 1] = NAN;
        id1[1 * D7_K] = id1[1 * D7_K + 1] = -1;
        d7_fused(&p, 0, 0, x1, ws, bs, id1, lp, &a);
        d7_fused(&p, 1, 0, x1, ws, bs, id1, lp, &b);
        int fin = 1;
        for (int i = 0; i < D7_V * D7_HS; i++) fin &= isfinite(a.dws[i]) && isfinite(b.dws[i]);
        KT_CHECK(a.st == KDLOSS_OK && b.st == KDLOSS_OK && fin && d7_close(b.dws, a.dws, D7_V * D7_HS) &&
                     d7_close(b.dxs, a.dxs, D7_BT * D7_HS) && a.rs[1] == 0.0f,
                 "D7 renorm_both, NaN xs in a row with no used slot: dws single %g vp %g", a.dws[0], b.dws[0]);
        kdloss_fused_linear_distill_params dp;
        kdloss_fused_linear_distill_params_default(&dp);
        int64_t lab[D7_BT] = {3, -100, 5};
        kdloss_fused_linear_distill_out o;
        memset(&o, 0, sizeof o);
        o.loss = &a.loss, o.dws = (kdloss_mat){a.dws, KDLOSS_F32, 0}, o.dbs = a.dbs;
        kdloss_status st = kdloss_fused_linear_distill(
            &dp, D7_BT, D7_HS, D7_HS, D7_V, (kdloss_cmat){x1, KDLOSS_F32, 0}, (kdloss_cmat){ws, KDLOSS_F32, 0}, bs,
            (kdloss_cmat){xs, KDLOSS_F32, 0}, (kdloss_cmat){ws, KDLOSS_F32, 0}, NULL, (kdloss_labels){lab, KDLOSS_I64},
            &o, NULL, 0);
        fin = isfinite(a.loss);
        for (int i = 0; i < D7_V * D7_HS; i++) fin &= isfinite(a.dws[i]);
        KT_CHECK(st == KDLOSS_OK && fin, "D7 fused dense, NaN xs in an ignored row: loss %g dws[1] %g, want finite",
                 a.loss, a.dws[1]);
    }
    /* (3e) renorm_both, a row whose student logits at S are all -inf (xs -inf): softmax over S
     * undefined, the row NaN in every element in both (dws all NaN) */
    {
        float x1[D7_BT * D7_HS], w2[D7_V * D7_HS];
        memcpy(x1, xs, sizeof x1);
        memcpy(w2, ws, sizeof w2);
        x1[1 * D7_HS] = -INFINITY, x1[1 * D7_HS + 1] = 0.0f;
        w2[5 * D7_HS] = 1.0f, w2[2 * D7_HS] = 0.5f; /* row 1's S = {5, 2}: logits -inf */
        d7_fused(&p, 0, 0, x1, w2, NULL, ids, lp, &a);
        d7_fused(&p, 1, 0, x1, w2, NULL, ids, lp, &b);
        KT_CHECK(a.st == KDLOSS_OK && b.st == KDLOSS_OK && isnan(a.rs[1]) && isnan(b.rs[1]) &&
                     all_nan(a.dws, D7_V * D7_HS) && all_nan(b.dws, D7_V * D7_HS),
                 "D7 renorm_both, student -inf at S: row_soft %g / %g, dws[0] single %g vp %g (want NaN)", a.rs[1],
                 b.rs[1], a.dws[0], b.dws[0]);
    }
    /* (3f) every row's S = {5, 2}; the other weight rows hold +inf times a negative hidden
     * state (their logits -inf, so no column outside S is above -inf), and row 1 a NaN used
     * log-prob: the poisoned row's gradient is NaN outside S too, so dws / dbs are NaN in every
     * element on every path (the full-vocabulary phases skipped those columns and left dws 0
     * there; fuzz artifact tri-crash-93f302a6) */
    {
        float x2[D7_BT * D7_HS] = {-1.0f, 0.5f, -0.5f, 0.25f, -0.75f, -1.0f}, w2[D7_V * D7_HS];
        int32_t id1[D7_BT * D7_K] = {5, 2, 5, 2, 2, 5};
        float lp2[D7_BT * D7_K];
        memcpy(w2, ws, sizeof w2);
        memcpy(lp2, lp, sizeof lp2);
        for (int j = 0; j < D7_V; j++)
            if (j != 2 && j != 5) w2[j * D7_HS] = INFINITY, w2[j * D7_HS + 1] = 0.0f;
        lp2[1 * D7_K + 1] = NAN;
        for (int tail = 0; tail < 3; tail++)
            for (int mode = 0; mode < 3; mode++) { /* single sparse / single full / _vp */
                kdloss_fused_linear_topk_distill_params q;
                kdloss_fused_linear_topk_distill_params_default(&q);
                q.tail = (kdloss_topk_tail)tail;
                q.temperature = 1.5;
                d7_fused(&q, mode == 2, mode == 1, x2, w2, bs, id1, lp2, &a);
                KT_CHECK(a.st == KDLOSS_OK && isnan(a.loss) && isnan(a.rs[1]) && isfinite(a.rs[0]) &&
                             isfinite(a.rs[2]) && all_nan(a.dxs + D7_HS, D7_HS) &&
                             all_nan(a.dws, D7_V * D7_HS) && all_nan(a.dbs, D7_V),
                         "D7 tail %d mode %d, +inf weights (logits -inf outside S), NaN used log-prob: "
                         "row_soft %g %g, dws[0] %g dbs[0] %g (want NaN)", tail, mode, a.rs[1], a.rs[0],
                         a.dws[0], a.dbs[0]);
            }
    }
    /* (3c): vocabulary row 3 is in row 0's S */
    p.weight_soft_loss = 0.0, p.weight_hard_loss = 0.0;
    memcpy(w1, ws, sizeof w1);
    w1[3 * D7_HS] = NAN;
    for (int vp = 0; vp < 2; vp++) {
        kdloss_fused_linear_distill_out o;
        memset(&o, 0, sizeof o);
        memset(&a, 0x7f, sizeof a);
        o.loss = &a.loss, o.dxs = (kdloss_mat){a.dxs, KDLOSS_F32, 0}, o.dws = (kdloss_mat){a.dws, KDLOSS_F32, 0};
        o.dbs = a.dbs;
        kdloss_topk_teacher t = {D7_K, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
        kdloss_comm c = {0, 1, d7_ar, NULL};
        kdloss_vocab_shard sh = {&c, D7_V, 0};
        kdloss_cmat X = {xs, KDLOSS_F32, 0}, W = {w1, KDLOSS_F32, 0};
        kdloss_status st = vp ? kdloss_fused_linear_topk_distill_vp(&p, &sh, D7_BT, D7_HS, D7_V, X, W, bs, t, NOLAB, &o, NULL, 0)
                              : kdloss_fused_linear_topk_distill(&p, D7_BT, D7_HS, D7_V, X, W, bs, t, NOLAB, &o, NULL, 0);
        int zero = a.loss == 0.0f;
        for (int i = 0; i < D7_BT * D7_HS; i++) zero &= a.dxs[i] == 0.0f;
        for (int i = 0; i < D7_V * D7_HS; i++) zero &= a.dws[i] == 0.0f;
        for (int i = 0; i < D7_V; i++) zero &= a.dbs[i] == 0.0f;
        KT_CHECK(st == KDLOSS_OK && zero, "D7 renorm_both weights 0 (vp %d): loss %g dxs %g, want 0", vp,
                 a.loss, a.dxs[0]);
    }
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    KT_FOR_EACH_ISA(it, "") {
        distill_logprobs(&rng);
        distill_logits(&rng);
        topk(&rng);
        fused(&rng);
        wide();
        d7_grad_scale_zero();
        d7_topk_fused();
    }
    return kt_finish("test_nan_policy");
}
