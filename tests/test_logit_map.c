/* The heads' logit maps of the fused losses (kdloss_logit_map: Cohere's logit_scale, Gemma 2's
 * final_logit_softcapping), on every CPU path this machine runs:
 *  A. the dense fused loss (JSD(beta), cross-entropy, temperature) against the float64
 *     reference: logits formed in double, mapped in double, then tests/support/ref_fld.c; the
 *     reference dz times the map's dz/du = s (1 - (z/cap)^2).
 *  B. every divergence: the fused loss against kdloss_distill_logits on the mapped logits
 *     (formed and mapped in double, rounded to fp32), the gradient through the map in double.
 *  C. the fused top-k loss (bucket and renorm_both tails) against kdloss_topk_distill_logits the
 *     same way; renorm_both with a map takes the full-vocabulary path.
 *  D. the identity: maps {0, 0} and {1, 0} give the bits of the default call.
 *  E. central differences of the library's own loss against its dxs.
 *  F. bad maps: KDLOSS_ERR_INVALID_PARAM, nothing written.
 *
 * Tolerances (got vs reference):
 *  quantity            | bound                                  | why
 *  losses (A)          | 2e-5 + 1e-4 |want|                     | test_fld's 1e-6 + 1e-4 |want|, plus
 *                      |                                        | the tanh's <= 4 ULP of |z| <= cap
 *                      |                                        | (vmath.h): cap 2^-21 = 1.4e-5 at
 *                      |                                        | cap 30 on each logit / T
 *  dxs, dws, dbs (A)   | 1e-4 mag', mag' = s (|f| mag + 0.01    | test_fld's bound through the map,
 *                      | |dz'|), f = 1 - (z/cap)^2              | plus f's own error: 2|t| |dt| with
 *                      |                                        | dt <= 4 ULP: < 1e-6 = 1e-4 x 0.01
 *  B, C losses         | 2e-5 + 2e-4 |want|                     | two fp32 paths on logits rounded
 *                      |                                        | once: the A bound for each
 *  B, C dxs            | 2e-3 max |dxs|                         | an fp32 GEMM over H and V against
 *                      |                                        | the double product of fp32 dz'
 *  E                   | 1e-3 max |dxs| (h = 1e-2 |x|)          | the fp32 loss's rounding / h and
 *                      |                                        | the h^2 truncation
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fld_common.h is header-only; this test uses part of it */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "fld_common.h"

typedef struct map2 {
    kdloss_logit_map s, t;
} map2;

/* The maps tried: scale only, cap only (saturating: the logits' spread is ~6), both, and one
 * on the teacher alone. */
static const map2 MAPS[] = {
    {{1.7, 0.0}, {1.0, 0.0}},
    {{1.0, 5.0}, {0.0, 8.0}},
    {{2.0, 30.0}, {0.6, 3.0}},
    {{0.0, 0.0}, {1.3, 2.5}},
};
#define N_MAPS (int)(sizeof MAPS / sizeof MAPS[0])

static double map_z(kdloss_logit_map m, double u) {
    double s = m.scale == 0.0 ? 1.0 : m.scale;
    return m.softcap > 0.0 ? m.softcap * tanh(s * u / m.softcap) : s * u;
}

/* dz/du at the mapped z. */
static double map_dz(kdloss_logit_map m, double z) {
    double s = m.scale == 0.0 ? 1.0 : m.scale, t = m.softcap > 0.0 ? z / m.softcap : 0.0;
    return s * (1.0 - t * t);
}

/* The mapped logits of both heads in double (bt x v each). */
static void ref_mapped(const kt_fld_problem *p, const map2 *m, double *zs, double *zt) {
    kt_ref_logits(p->bt, p->hs, p->v, p->xs, p->ws, p->bias_s, zs);
    kt_ref_logits(p->bt, p->ht, p->v, p->xt, p->wt, p->bias_t, zt);
    for (int64_t i = 0; i < p->bt * p->v; i++) {
        zs[i] = map_z(m->s, zs[i]);
        zt[i] = map_z(m->t, zt[i]);
    }
}

static kdloss_fused_linear_distill_params prm_make(kdloss_divergence d, double beta, double T,
                                                   double w_hard, double w_soft, const map2 *m) {
    kdloss_fused_linear_distill_params pr;
    kdloss_fused_linear_distill_params_default(&pr);
    pr.div.divergence = d;
    pr.div.beta = beta;
    pr.temperature = T;
    pr.weight_hard_loss = w_hard;
    pr.weight_soft_loss = w_soft;
    pr.grad_scale = 1.3;
    if (m) {
        pr.student_map = m->s;
        pr.teacher_map = m->t;
    }
    return pr;
}

/* The dense fused loss on p with every output. */
static fl_res run_dense(const kt_fld_problem *p, const kdloss_fused_linear_distill_params *pr) {
    fl_res r;
    memset(&r, 0, sizeof r);
    r.ld_dxs = p->hs + 2;
    r.ld_dws = p->hs + 1;
    r.dxs = fl_poisoned(p->bt * r.ld_dxs, p->ds);
    r.dws = fl_poisoned(p->v * r.ld_dws, p->ds);
    if (p->bias_s) r.dbs = fl_poisoned(p->v, p->ds);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &r.loss;
    o.soft_loss = &r.soft;
    o.hard_loss = &r.hard;
    o.dxs = (kdloss_mat){r.dxs, p->ds, r.ld_dxs};
    o.dws = (kdloss_mat){r.dws, p->ds, r.ld_dws};
    o.dbs = r.dbs;
    r.st = kdloss_fused_linear_distill(
        pr, p->bt, p->hs, p->ht, p->v, (kdloss_cmat){p->pxs, p->ds, p->ld_xs},
        (kdloss_cmat){p->pws, p->ds, p->ld_ws}, p->pbias_s, (kdloss_cmat){p->pxt, p->dt, p->ld_xt},
        (kdloss_cmat){p->pwt, p->dt, p->ld_wt}, p->pbias_t,
        (kdloss_labels){p->labels, KDLOSS_I64}, &o, NULL, 0);
    return r;
}

/* ---- A: the float64 reference ---- */

static void check_ref(const char *ctx, const kt_fld_problem *p, const map2 *m,
                      const kt_fld_cfg *c, const fl_res *g) {
    int64_t n = p->bt * p->v;
    double *zs = calloc((size_t)n, 8), *zt = calloc((size_t)n, 8), *dz = calloc((size_t)n, 8),
           *mag = calloc((size_t)n, 8);
    double loss, soft, hard;
    ref_mapped(p, m, zs, zt);
    kt_ref_fld_dz(c, p->bt, p->v, zs, zt, p->labels, &loss, &soft, &hard, dz, mag);
    for (int64_t i = 0; i < n; i++) { /* through the map; mag' as the table above */
        double d = map_dz(m->s, zs[i]), s = m->s.scale == 0.0 ? 1.0 : m->s.scale;
        mag[i] = s * (fabs(d / s) * mag[i] + 0.01 * fabs(dz[i]));
        dz[i] *= d;
    }
    kt_close(g->loss, loss, 2e-5, 1e-4, "%s loss", ctx);
    kt_close(g->soft, soft, 2e-5, 1e-4, "%s soft", ctx);
    kt_close(g->hard, hard, 2e-5, 1e-4, "%s hard", ctx);
    double *w[6];
    int64_t sz[6] = {p->bt * p->hs, p->v * p->hs, p->v, p->bt * p->hs, p->v * p->hs, p->v};
    for (int i = 0; i < 6; i++) w[i] = calloc((size_t)sz[i], 8);
    kt_ref_fld_grads(p->bt, p->hs, p->v, dz, p->xs, p->ws, 0, 1, w[0], w[1], w[2]);
    kt_ref_fld_grads(p->bt, p->hs, p->v, mag, p->xs, p->ws, 1, 1, w[3], w[4], w[5]);
    fl_cmp_mat(ctx, "dxs", g->dxs, p->ds, g->ld_dxs, w[0], w[3], p->bt, p->hs, 1, 1e-4, 0.0);
    fl_cmp_mat(ctx, "dws", g->dws, p->ds, g->ld_dws, w[1], w[4], p->v, p->hs, 1, 1e-4, 0.0);
    fl_cmp_mat(ctx, "dbs", g->dbs, p->ds, p->v, w[2], w[5], 1, p->v, 1, 1e-4, 0.0);
    for (int i = 0; i < 6; i++) free(w[i]);
    free(zs), free(zt), free(dz), free(mag);
}

static void vs_reference(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 9, 32, 48, 333, KDLOSS_F32, KDLOSS_F32, 1, 6.0, 4, -100, 0);
    const double betas[] = {0.5, 0.0, 1.0}, temps[] = {1.0, 2.5};
    KT_FOR_EACH_ISA(it, "A ") {
        for (int mi = 0; mi < N_MAPS; mi++)
            for (int bi = 0; bi < 3; bi++)
                for (int ti = 0; ti < 2; ti++) {
                    kt_fld_cfg c = {betas[bi], temps[ti], 0.3, 0.7, 1.3, -100};
                    kdloss_fused_linear_distill_params pr =
                        prm_make(KDLOSS_DIV_JSD, c.beta, c.temperature, 0.3, 0.7, &MAPS[mi]);
                    char ctx[96];
                    snprintf(ctx, sizeof ctx, "A %s map %d beta %g T %g", it.name, mi, c.beta,
                             c.temperature);
                    fl_res g = run_dense(&p, &pr);
                    if (KT_CHECK(g.st == KDLOSS_OK, "%s: status %d", ctx, g.st))
                        check_ref(ctx, &p, &MAPS[mi], &c, &g);
                    fl_res_free(&g);
                }
    }
    kt_fld_problem_free(&p);
}

/* ---- B, C: the logits losses on the mapped logits ---- */

/* got (dxs, ld) against want = (dz' f) ws in double, within 2e-3 of max |want|. */
static void check_dxs(const char *ctx, const kt_fld_problem *p, const float *dzl,
                      const double *zs, kdloss_logit_map ms, const fl_res *g) {
    double *want = calloc((size_t)(p->bt * p->hs), 8), mx = 0.0, err = 0.0;
    for (int64_t r = 0; r < p->bt; r++)
        for (int64_t c = 0; c < p->v; c++) {
            double d = (double)dzl[r * p->v + c] * map_dz(ms, zs[r * p->v + c]);
            for (int64_t h = 0; h < p->hs; h++) want[r * p->hs + h] += d * p->ws[c * p->hs + h];
        }
    for (int64_t r = 0; r < p->bt; r++)
        for (int64_t h = 0; h < p->hs; h++) {
            double w = want[r * p->hs + h], x = kt_get(g->dxs, p->ds, g->ld_dxs, r, h);
            mx = fmax(mx, fabs(w));
            err = fmax(err, isnan(x) ? INFINITY : fabs(x - w));
        }
    KT_CHECK(err <= 2e-3 * mx + 1e-30, "%s dxs: max error %.3g, max |dxs| %.3g", ctx, err, mx);
    free(want);
}

static float *to_f32(const double *z, int64_t n) {
    float *f = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) f[i] = (float)z[i];
    return f;
}

static void every_divergence(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 6, 24, 40, 257, KDLOSS_F32, KDLOSS_F32, 1, 6.0, 3, -100, 0);
    int64_t n = p.bt * p.v;
    double *zs = calloc((size_t)n, 8), *zt = calloc((size_t)n, 8);
    float *dzl = malloc((size_t)n * 4);
    KT_FOR_EACH_ISA(it, "B ") {
        for (int mi = 0; mi < N_MAPS; mi++) {
            ref_mapped(&p, &MAPS[mi], zs, zt);
            float *fs = to_f32(zs, n), *ft = to_f32(zt, n);
            for (int d = 0; d < KDLOSS_DIV_COUNT; d++) {
                kdloss_fused_linear_distill_params pr =
                    prm_make((kdloss_divergence)d, 0.3, 1.7, 0.0, 1.0, &MAPS[mi]);
                kdloss_distill_logits_params lp;
                kdloss_distill_logits_params_default(&lp);
                lp.div = pr.div;
                lp.temperature = pr.temperature;
                lp.grad_scale = pr.grad_scale;
                float want;
                kdloss_status st = kdloss_distill_logits(
                    &lp, p.bt, p.v, (kdloss_cmat){fs, KDLOSS_F32, p.v},
                    (kdloss_cmat){ft, KDLOSS_F32, p.v}, (kdloss_labels){p.labels, KDLOSS_I64},
                    &want, NULL, (kdloss_mat){dzl, KDLOSS_F32, p.v});
                char ctx[96];
                snprintf(ctx, sizeof ctx, "B %s map %d %s", it.name, mi,
                         kdloss_divergence_name((kdloss_divergence)d));
                fl_res g = run_dense(&p, &pr);
                if (KT_CHECK(st == KDLOSS_OK && g.st == KDLOSS_OK, "%s: status %d %d", ctx, st,
                             g.st)) {
                    kt_close(g.loss, want, 2e-5, 2e-4, "%s loss", ctx);
                    check_dxs(ctx, &p, dzl, zs, MAPS[mi].s, &g);
                }
                fl_res_free(&g);
            }
            free(fs), free(ft);
        }
    }
    free(zs), free(zt), free(dzl);
    kt_fld_problem_free(&p);
}

/* The fused top-k loss with student map ms on p's student, the teacher t. */
static fl_res run_topk(const kt_fld_problem *p, kdloss_divergence d, kdloss_topk_tail tail,
                       kdloss_logit_map ms, kdloss_topk_teacher t, double w_hard) {
    kdloss_fused_linear_topk_distill_params pr;
    kdloss_fused_linear_topk_distill_params_default(&pr);
    pr.div.divergence = d;
    pr.tail = tail;
    pr.temperature = 1.5;
    pr.weight_hard_loss = w_hard;
    pr.grad_scale = 0.8;
    pr.student_map = ms;
    fl_res r;
    memset(&r, 0, sizeof r);
    r.ld_dxs = p->hs;
    r.dxs = fl_poisoned(p->bt * r.ld_dxs, p->ds);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &r.loss;
    o.dxs = (kdloss_mat){r.dxs, p->ds, r.ld_dxs};
    r.st = kdloss_fused_linear_topk_distill(&pr, p->bt, p->hs, p->v,
                                            (kdloss_cmat){p->pxs, p->ds, p->ld_xs},
                                            (kdloss_cmat){p->pws, p->ds, p->ld_ws}, p->pbias_s, t,
                                            (kdloss_labels){p->labels, KDLOSS_I64}, &o, NULL, 0);
    return r;
}

/* A top-k teacher from the double teacher logits zt: each row's K largest, log-softmax over V. */
static void topk_from(const double *zt, int64_t bt, int64_t v, int64_t k, int64_t *ids,
                      float *lps) {
    for (int64_t r = 0; r < bt; r++) {
        const double *z = zt + r * v;
        double m = -INFINITY, s = 0.0;
        for (int64_t c = 0; c < v; c++) m = fmax(m, z[c]);
        for (int64_t c = 0; c < v; c++) s += exp(z[c] - m);
        for (int64_t j = 0; j < k; j++) { /* the j-th largest, by selection */
            int64_t best = -1;
            for (int64_t c = 0; c < v; c++) {
                int used = 0;
                for (int64_t q = 0; q < j; q++) used |= ids[r * k + q] == c;
                if (!used && (best < 0 || z[c] > z[best])) best = c;
            }
            ids[r * k + j] = best;
            lps[r * k + j] = (float)(z[best] - m - log(s));
        }
    }
}

static void topk_maps(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 5, 20, 20, 203, KDLOSS_F32, KDLOSS_F32, 1, 6.0, 3, -100, 0);
    const int64_t K = 8;
    int64_t n = p.bt * p.v, *ids = malloc((size_t)(p.bt * K) * 8);
    double *zs = calloc((size_t)n, 8), *zt = calloc((size_t)n, 8);
    float *lps = malloc((size_t)(p.bt * K) * 4), *dzl = malloc((size_t)n * 4);
    ref_mapped(&p, &MAPS[0], zs, zt); /* the teacher: the top K of its logits (unmapped here) */
    topk_from(zt, p.bt, p.v, K, ids, lps);
    kdloss_topk_teacher t = {K, {ids, KDLOSS_I64, K}, {lps, KDLOSS_F32, K}};
    const kdloss_topk_tail tails[] = {KDLOSS_TAIL_BUCKET, KDLOSS_TAIL_RENORM_BOTH};
    KT_FOR_EACH_ISA(it, "C ") {
        for (int mi = 0; mi < N_MAPS; mi++) {
            ref_mapped(&p, &MAPS[mi], zs, zt);
            float *fs = to_f32(zs, n);
            for (int ti = 0; ti < 2; ti++)
                for (int d = 0; d < KDLOSS_DIV_COUNT; d += 2) {
                    kdloss_topk_distill_params lp;
                    kdloss_topk_distill_params_default(&lp);
                    lp.div.divergence = (kdloss_divergence)d;
                    lp.tail = tails[ti];
                    lp.temperature = 1.5;
                    lp.grad_scale = 0.8;
                    float want;
                    kdloss_status st = kdloss_topk_distill_logits(
                        &lp, p.bt, p.v, (kdloss_cmat){fs, KDLOSS_F32, p.v}, t,
                        (kdloss_labels){p.labels, KDLOSS_I64}, &want, NULL,
                        (kdloss_mat){dzl, KDLOSS_F32, p.v});
                    char ctx[96];
                    snprintf(ctx, sizeof ctx, "C %s map %d %s tail %d", it.name, mi,
                             kdloss_divergence_name((kdloss_divergence)d), ti);
                    fl_res g = run_topk(&p, (kdloss_divergence)d, tails[ti], MAPS[mi].s, t, 0.0);
                    if (KT_CHECK(st == KDLOSS_OK && g.st == KDLOSS_OK, "%s: status %d %d", ctx,
                                 st, g.st)) {
                        kt_close(g.loss, want, 2e-5, 2e-4, "%s loss", ctx);
                        check_dxs(ctx, &p, dzl, zs, MAPS[mi].s, &g);
                    }
                    fl_res_free(&g);
                }
            free(fs);
        }
    }
    free(ids), free(zs), free(zt), free(lps), free(dzl);
    kt_fld_problem_free(&p);
}

/* ---- D: the identity ---- */

static int same_res(const kt_fld_problem *p, const fl_res *a, const fl_res *b) {
    return a->st == KDLOSS_OK && b->st == KDLOSS_OK && fl_same_bits(p, a, b);
}

static void identity(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 7, 16, 24, 150, KDLOSS_F32, KDLOSS_F32, 1, 4.0, 3, -100, 0);
    const map2 ids[] = {{{0.0, 0.0}, {0.0, 0.0}}, {{1.0, 0.0}, {1.0, 0.0}}};
    KT_FOR_EACH_ISA(it, "D ") {
        kdloss_fused_linear_distill_params pr = prm_make(KDLOSS_DIV_REVERSE_KL, 0.5, 2.0, 0.4,
                                                         0.6, NULL);
        fl_res base = run_dense(&p, &pr);
        for (int i = 0; i < 2; i++) {
            pr.student_map = ids[i].s;
            pr.teacher_map = ids[i].t;
            fl_res g = run_dense(&p, &pr);
            KT_CHECK(same_res(&p, &base, &g), "D %s: identity map %d changes the bits", it.name,
                     i);
            fl_res_free(&g);
        }
        fl_res_free(&base);
    }
    kt_fld_problem_free(&p);
}

/* ---- E: central differences ---- */

static double loss_at(const kt_fld_problem *p, const kdloss_fused_linear_distill_params *pr) {
    float loss;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &loss;
    kdloss_status st = kdloss_fused_linear_distill(
        pr, p->bt, p->hs, p->ht, p->v, (kdloss_cmat){p->pxs, p->ds, p->ld_xs},
        (kdloss_cmat){p->pws, p->ds, p->ld_ws}, p->pbias_s, (kdloss_cmat){p->pxt, p->dt, p->ld_xt},
        (kdloss_cmat){p->pwt, p->dt, p->ld_wt}, p->pbias_t,
        (kdloss_labels){p->labels, KDLOSS_I64}, &o, NULL, 0);
    return st == KDLOSS_OK ? (double)loss : NAN;
}

static void finite_differences(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 3, 8, 8, 50, KDLOSS_F32, KDLOSS_F32, 0, 6.0, 0, -100, 0);
    const map2 m = {{1.5, 4.0}, {1.0, 6.0}};
    kdloss_fused_linear_distill_params pr = prm_make(KDLOSS_DIV_SKEW_REVERSE_KL, 0.5, 2.0, 0.5,
                                                     1.0, &m);
    pr.grad_scale = 1.0;
    fl_res g = run_dense(&p, &pr);
    float *x = p.pxs;
    double mx = 0.0, err = 0.0;
    for (int64_t r = 0; r < p.bt; r++)
        for (int64_t h = 0; h < p.hs; h++)
            mx = fmax(mx, fabs(kt_get(g.dxs, p.ds, g.ld_dxs, r, h)));
    for (int64_t r = 0; r < p.bt; r++)
        for (int64_t h = 0; h < p.hs; h++) {
            float *e = x + r * p.ld_xs + h, x0 = *e, step = 1e-2f * fmaxf(fabsf(x0), 0.1f);
            *e = x0 + step;
            double up = loss_at(&p, &pr);
            *e = x0 - step;
            double dn = loss_at(&p, &pr);
            *e = x0;
            double fd = (up - dn) / (2.0 * step), got = kt_get(g.dxs, p.ds, g.ld_dxs, r, h);
            /* the bound: 1e-3 of the largest gradient (the central difference's truncation),
             * plus the rounding of the two fp32 losses (and of the fp32 logits under them) over
             * 2 step: an ulp of each, doubled; at a loss of ~3 and a step of 1e-3 that alone is
             * ~7e-4, more than 1e-3 of a small gradient */
            const double noise = 2.0 * FLT_EPSILON * (fabs(up) + fabs(dn)) / (2.0 * step);
            const double d = isnan(fd - got) ? INFINITY : fabs(fd - got) - noise;
            err = fmax(err, d);
        }
    KT_CHECK(g.st == KDLOSS_OK && err <= 1e-3 * mx,
             "E central differences: status %d, max error beyond the losses' rounding %.3g "
             "against max |dxs| %.3g", g.st, err, mx);
    printf("E central differences: max error %.3g of max |dxs| %.3g\n", err, mx);
    fl_res_free(&g);
    kt_fld_problem_free(&p);
}

/* ---- F: bad maps ---- */

static void bad_maps(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 2, 8, 8, 20, KDLOSS_F32, KDLOSS_F32, 0, 2.0, 0, -100, 0);
    const kdloss_logit_map bad[] = {{-1.0, 0.0}, {NAN, 0.0}, {1e39, 0.0}, {1.0, -2.0},
                                    {1.0, INFINITY}, {1.0, 1e-40}, {1e30, 1e-10}, {1.0, NAN}};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
        for (int who = 0; who < 2; who++) {
            map2 m = {{1.0, 0.0}, {1.0, 0.0}};
            if (who) m.t = bad[i];
            else m.s = bad[i];
            kdloss_fused_linear_distill_params pr = prm_make(KDLOSS_DIV_JSD, 0.5, 1.0, 0.5, 0.5,
                                                             &m);
            fl_res g = run_dense(&p, &pr);
            KT_CHECK(g.st == KDLOSS_ERR_INVALID_PARAM && kt_is_poison(g.dxs, p.bt * g.ld_dxs,
                                                                       p.ds),
                     "F %s map {%g, %g}: status %d, or outputs written", who ? "teacher" : "student",
                     bad[i].scale, bad[i].softcap, g.st);
            fl_res_free(&g);
        }
    /* grad_scale times the student's scale past fp32 */
    map2 m = {{1e30, 0.0}, {1.0, 0.0}};
    kdloss_fused_linear_distill_params pr = prm_make(KDLOSS_DIV_JSD, 0.5, 1.0, 0.5, 0.5, &m);
    pr.grad_scale = 1e10;
    fl_res g = run_dense(&p, &pr);
    KT_CHECK(g.st == KDLOSS_ERR_INVALID_PARAM, "F grad_scale x scale 1e40: status %d", g.st);
    fl_res_free(&g);
    kt_fld_problem_free(&p);
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    vs_reference(&rng);
    every_divergence(&rng);
    topk_maps(&rng);
    identity(&rng);
    finite_differences(&rng);
    bad_maps(&rng);
    printf("largest gradient error (A): %.3g of its bound\n", fl_worst_seen);
    return kt_finish("test_logit_map");
}
