/* Per-row weights and the student's entropy in the fused losses on the CPU (kdloss.h, docs/MATH.md
 * section 12): kdloss_fused_linear_distill and kdloss_fused_linear_topk_distill.
 *   - against the float64 reference (tests/support/ref_fld.c, row by row, each kept row's terms
 *     and dz times its weight, over n_valid = the rows kept): random non-uniform weights with
 *     exact zeros, labels with ignored rows, forward KL, reverse KL and JSD(0.5), fp32 and bf16,
 *     several chunks, biases, every CPU path; losses (abs 1e-6, rel 1e-4: test_fld's), the row
 *     outputs unweighted, the gradients at test_fld's bounds (1e-4 of each element's error scale,
 *     2^-8 relative in bf16);
 *   - the entropy against float64 H(softmax(zs / T)) (abs 1e-5 + rel 1e-5: fp32 logits carry
 *     ~1e-6 relative, times |log Q| of at most ~20 here), 0 on ignored rows, also when the soft
 *     and hard parts are both off (the entropy alone), and after a student logit map (scale,
 *     softcap);
 *   - bitwise: NULL weights against all-ones; weights in {0, 1} against masking the same rows
 *     with ignore_index; asking for the entropy changes no other output;
 *   - central differences of the weighted loss in xs against dxs;
 *   - bad weights (negative, NaN, inf: INVALID_PARAM; misaligned: MISALIGNED) and row_entropy
 *     over row_weights (ALIASING) refused, nothing written;
 *   - top-k (dense and sparse renorm_both paths): NULL vs ones and {0, 1} vs masking bitwise,
 *     the weighted loss equal to sum w row_soft / n_valid (rel 1e-6) and each dxs row equal to
 *     w times the masked call's (rel 1e-5 of the largest), the entropy against float64.
 * The vocabulary-parallel forms: tests/test_vp_agree.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* fld_common.h's helpers this test skips */
#include "fld_common.h"
#include "reference.h"

#define TOL_LOSS_REL 1e-4
#define TOL_LOSS_ABS 1e-6
#define TOL_GRAD 1e-4
#define TOL_ENT 1e-5

enum { BT = 29, HS = 24, HT = 20, K = 5 };

/* One call's outputs (every one poisoned first). */
typedef struct wres {
    kdloss_status st;
    float sc[3];
    float rows[4 * BT]; /* row_soft, row_hard, row_lse, row_entropy */
    void *dxs, *dws, *dbs;
    int64_t ld_dxs, ld_dws;
} wres;

static void wres_free(wres *r) {
    free(r->dxs);
    free(r->dws);
    free(r->dbs);
}

typedef struct call_opt {
    const int64_t *labels;
    int grad, ent;
    const kdloss_topk_teacher *topk; /* NULL: the dense teacher */
} call_opt;

static kdloss_fused_linear_distill_out w_out(const kt_fld_problem *p, wres *r, const call_opt *c) {
    memset(r, 0, sizeof *r);
    kt_poison(r->sc, 3, KDLOSS_F32);
    kt_poison(r->rows, 4 * BT, KDLOSS_F32);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &r->sc[0];
    o.soft_loss = &r->sc[1];
    o.hard_loss = &r->sc[2];
    o.row_soft = r->rows;
    o.row_hard = r->rows + BT;
    o.row_entropy = c->ent ? r->rows + 3 * BT : NULL;
    if (c->grad) {
        r->ld_dxs = p->hs + 2;
        r->ld_dws = p->hs + 1;
        r->dxs = fl_poisoned(p->bt * r->ld_dxs, p->ds);
        r->dws = fl_poisoned(p->v * r->ld_dws, p->ds);
        o.dxs = (kdloss_mat){r->dxs, p->ds, r->ld_dxs};
        o.dws = (kdloss_mat){r->dws, p->ds, r->ld_dws};
        if (p->bias_s) o.dbs = r->dbs = fl_poisoned(p->v, p->ds);
    }
    return o;
}

/* The dense call (prm) or the top-k one (tprm) on p. */
static wres w_run(const kt_fld_problem *p, const kdloss_fused_linear_distill_params *prm,
                  const kdloss_fused_linear_topk_distill_params *tprm, const call_opt *c) {
    wres r;
    kdloss_fused_linear_distill_out o = w_out(p, &r, c);
    kdloss_cmat xs = {p->pxs, p->ds, p->ld_xs}, ws = {p->pws, p->ds, p->ld_ws};
    kdloss_labels lab = {c->labels, KDLOSS_I64};
    if (c->topk) {
        o.row_hard = NULL; /* no cross-entropy output: renorm_both may take the sparse path */
        o.hard_loss = NULL;
        r.st = kdloss_fused_linear_topk_distill(tprm, p->bt, p->hs, p->v, xs, ws, p->pbias_s,
                                                *c->topk, lab, &o, NULL, 0);
    } else {
        kdloss_cmat xt = {p->pxt, p->dt, p->ld_xt}, wt = {p->pwt, p->dt, p->ld_wt};
        r.st = kdloss_fused_linear_distill(prm, p->bt, p->hs, p->ht, p->v, xs, ws, p->pbias_s, xt,
                                           wt, p->pbias_t, lab, &o, NULL, 0);
    }
    return r;
}

static int w_same_bits(const kt_fld_problem *p, const wres *a, const wres *b, int ent) {
    size_t es = kdloss_dtype_size(p->ds);
    if (a->st != KDLOSS_OK || b->st != KDLOSS_OK) return 0;
    if (memcmp(a->sc, b->sc, sizeof a->sc) || memcmp(a->rows, b->rows, (ent ? 4 : 2) * BT * 4))
        return 0;
    if (a->dxs && memcmp(a->dxs, b->dxs, (size_t)(p->bt * a->ld_dxs) * es)) return 0;
    if (a->dws && memcmp(a->dws, b->dws, (size_t)(p->v * a->ld_dws) * es)) return 0;
    if (a->dbs && memcmp(a->dbs, b->dbs, (size_t)p->v * es)) return 0;
    return 1;
}

/* ---- the float64 reference with weights ---- */

typedef struct wref {
    double loss, soft, hard;
    double rsoft[BT], rhard[BT], ent[BT];
    double *dxs, *dws, *dbs, *mxs, *mws, *mbs;
} wref;

/* Row by row through kt_ref_fld_dz (one row: n_valid 1), each kept row's terms and dz times w
 * over the weighted call's n_valid; the entropy from log_softmax(zs / T). */
static void wref_make(const kt_fld_problem *p, const kt_fld_cfg *cf, const float *w,
                      const double *zs, const double *zt, wref *r) {
    int64_t v = p->v, nv = 0;
    double *dz = calloc((size_t)(p->bt * v), sizeof(double));
    double *mag = calloc((size_t)(p->bt * v), sizeof(double)), *x = malloc((size_t)v * 8);
    for (int64_t i = 0; i < p->bt; i++) nv += p->labels[i] != p->ignore_index && (!w || w[i] != 0.0f);
    double n = nv > 0 ? (double)nv : 1.0, ss = 0.0, hs = 0.0;
    for (int64_t i = 0; i < p->bt; i++) {
        double l, s, h, wi = w ? (double)w[i] : 1.0;
        r->rsoft[i] = r->rhard[i] = r->ent[i] = 0.0;
        if (p->labels[i] == p->ignore_index || wi == 0.0) continue;
        kt_ref_fld_dz(cf, 1, v, zs + i * v, zt + i * v, &p->labels[i], &l, &s, &h, dz + i * v,
                      mag + i * v);
        r->rsoft[i] = s;
        r->rhard[i] = h;
        ss += wi * s;
        hs += wi * h;
        for (int64_t c = 0; c < v; c++) dz[i * v + c] *= wi / n, mag[i * v + c] *= wi / n;
        ref_log_softmax(zs + i * v, v, cf->temperature, x);
        for (int64_t c = 0; c < v; c++) r->ent[i] -= x[c] > -INFINITY ? exp(x[c]) * x[c] : 0.0;
    }
    r->soft = ss / n;
    r->hard = hs / n;
    r->loss = cf->w_hard * r->hard + cf->w_soft * r->soft;
    double **m[6] = {&r->dxs, &r->dws, &r->dbs, &r->mxs, &r->mws, &r->mbs};
    int64_t len[6] = {p->bt * p->hs, v * p->hs, v, p->bt * p->hs, v * p->hs, v};
    for (int i = 0; i < 6; i++) *m[i] = calloc((size_t)len[i], sizeof(double));
    kt_ref_fld_grads(p->bt, p->hs, v, dz, p->xs, p->ws, 0, 1, r->dxs, r->dws, r->dbs);
    kt_ref_fld_grads(p->bt, p->hs, v, mag, p->xs, p->ws, 1, 1, r->mxs, r->mws, r->mbs);
    free(dz);
    free(mag);
    free(x);
}

static void wref_free(wref *r) {
    double *m[6] = {r->dxs, r->dws, r->dbs, r->mxs, r->mws, r->mbs};
    for (int i = 0; i < 6; i++) free(m[i]);
}

static void check_ent(const char *ctx, const float *got, const double *want, int64_t bt) {
    for (int64_t i = 0; i < bt; i++)
        if (!kt_close(got[i], want[i], TOL_ENT, TOL_ENT, "%s entropy row %lld", ctx, (long long)i))
            break;
}

static void check_ref(const char *ctx, const kt_fld_problem *p, const wres *g, const wref *w,
                      int ent) {
    if (!KT_CHECK(g->st == KDLOSS_OK, "%s: status %d", ctx, (int)g->st)) return;
    kt_close(g->sc[0], w->loss, TOL_LOSS_ABS, TOL_LOSS_REL, "%s loss", ctx);
    kt_close(g->sc[1], w->soft, TOL_LOSS_ABS, TOL_LOSS_REL, "%s soft", ctx);
    kt_close(g->sc[2], w->hard, TOL_LOSS_ABS, TOL_LOSS_REL, "%s hard", ctx);
    for (int64_t i = 0; i < p->bt; i++) { /* the row outputs stay unweighted */
        kt_close(g->rows[i], w->rsoft[i], TOL_LOSS_ABS, TOL_LOSS_REL, "%s row_soft %lld", ctx,
                 (long long)i);
        kt_close(g->rows[BT + i], w->rhard[i], TOL_LOSS_ABS, TOL_LOSS_REL, "%s row_hard %lld",
                 ctx, (long long)i);
    }
    if (ent) check_ent(ctx, g->rows + 3 * BT, w->ent, p->bt);
    if (!g->dxs) return;
    double rt = p->ds == KDLOSS_BF16 ? 0x1p-8 : 0.0, dz = 0.0;
    kdloss_bf16_gemm_info bi; /* native bf16 backward: test_fld's 2^-8 of the error scale */
    if (p->ds == KDLOSS_BF16 && kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && bi.grad_native)
        dz = 0x1p-8;
    fl_cmp_mat(ctx, "dxs", g->dxs, p->ds, g->ld_dxs, w->dxs, w->mxs, p->bt, p->hs, 1,
               TOL_GRAD + dz, rt);
    fl_cmp_mat(ctx, "dws", g->dws, p->ds, g->ld_dws, w->dws, w->mws, p->v, p->hs, 1,
               TOL_GRAD + dz, rt);
    if (g->dbs) fl_cmp_mat(ctx, "dbs", g->dbs, p->ds, p->v, w->dbs, w->mbs, 1, p->v, 1, TOL_GRAD, rt);
}

/* ---- the dense teacher ---- */

/* Weights in [0.1, 2.5), non-uniform, every row r % 5 == 2 exactly 0. */
static void weights_make(kt_rng *g, float *w, int zero_one) {
    for (int64_t i = 0; i < BT; i++) {
        w[i] = zero_one ? (float)(kt_uniform(g) < 0.7) : (float)(0.1 + 2.4 * kt_uniform(g));
        if (i % 5 == 2) w[i] = 0.0f;
    }
}

static void set_div(kdloss_fused_linear_distill_params *prm, kt_fld_cfg *cf, int d) {
    static const kdloss_divergence dv[3] = {KDLOSS_DIV_FORWARD_KL, KDLOSS_DIV_REVERSE_KL,
                                            KDLOSS_DIV_JSD};
    static const double beta[3] = {0.0, 1.0, 0.5}; /* the reference's JSD(beta) of each */
    prm->div.divergence = dv[d];
    prm->div.beta = 0.5;
    cf->beta = beta[d];
}

static void dense_grid(kt_rng *g, kdloss_dtype dt, int64_t v) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, v, dt, dt, 1, 3.0, 4, -100, 3);
    double *zs = malloc((size_t)(BT * v) * 8), *zt = malloc((size_t)(BT * v) * 8);
    kt_ref_logits(BT, HS, v, p.xs, p.ws, p.bias_s, zs);
    kt_ref_logits(BT, HT, v, p.xt, p.wt, p.bias_t, zt);
    float w[BT];
    weights_make(g, w, 0);
    for (int d = 0; d < 3; d++)
        for (int ci = 0; ci < 2; ci++) {
            double t = (d + ci) % 2 ? 2.0 : 1.0;
            kt_fld_cfg cf = {0.0, t, 0.3, 0.7, ci ? 1.5 : 1.0, -100};
            kdloss_fused_linear_distill_params prm;
            kdloss_fused_linear_distill_params_default(&prm);
            set_div(&prm, &cf, d);
            prm.temperature = t;
            prm.weight_hard_loss = cf.w_hard;
            prm.weight_soft_loss = cf.w_soft;
            prm.grad_scale = cf.grad_scale;
            prm.chunk_size = ci ? 7 : 0;
            prm.row_weights = w;
            wref ref;
            wref_make(&p, &cf, w, zs, zt, &ref);
            call_opt c = {p.labels, 1, 1, NULL};
            KT_FOR_EACH_ISA(path, NULL) {
                char ctx[160];
                snprintf(ctx, sizeof ctx, "dense %s V %lld div %d T %g chunk %lld %s",
                         kdloss_dtype_name(dt), (long long)v, d, t, (long long)prm.chunk_size,
                         path.name);
                wres r = w_run(&p, &prm, NULL, &c);
                check_ref(ctx, &p, &r, &ref, 1);
                wres_free(&r);
            }
            wref_free(&ref);
        }
    free(zs);
    free(zt);
    kt_fld_problem_free(&p);
}

static void entropy_alone(const kt_fld_problem *pp, kdloss_fused_linear_distill_params *pr,
                          const float *w);

/* Bitwise identities on one problem, every path: NULL = ones; {0, 1} = masking; the entropy
 * changes nothing else; and the entropy alone (soft and hard parts off) against float64. */
static void dense_identities(kt_rng *g, kdloss_dtype dt) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, 301, dt, dt, 1, 3.0, 4, -100, 0);
    float ones[BT], w01[BT], w[BT];
    int64_t masked[BT];
    weights_make(g, w01, 1);
    weights_make(g, w, 0);
    for (int64_t i = 0; i < BT; i++) {
        ones[i] = 1.0f;
        masked[i] = w01[i] == 0.0f ? -100 : p.labels[i];
    }
    kdloss_fused_linear_distill_params prm;
    kdloss_fused_linear_distill_params_default(&prm);
    prm.div.divergence = KDLOSS_DIV_REVERSE_KL;
    prm.temperature = 1.7;
    prm.chunk_size = 6;
    call_opt c = {p.labels, 1, 0, NULL}, cm = {masked, 1, 0, NULL}, ce = {p.labels, 1, 1, NULL};
    KT_FOR_EACH_ISA(path, NULL) {
        prm.row_weights = NULL;
        wres a = w_run(&p, &prm, NULL, &c), m = w_run(&p, &prm, NULL, &cm);
        prm.row_weights = ones;
        wres b = w_run(&p, &prm, NULL, &c);
        prm.row_weights = w01;
        wres z = w_run(&p, &prm, NULL, &c);
        prm.row_weights = w;
        wres e0 = w_run(&p, &prm, NULL, &c), e1 = w_run(&p, &prm, NULL, &ce);
        KT_CHECK(w_same_bits(&p, &a, &b, 0), "%s %s: NULL weights differ from all-ones",
                 kdloss_dtype_name(dt), path.name);
        KT_CHECK(w_same_bits(&p, &m, &z, 0), "%s %s: weights {0,1} differ from masking",
                 kdloss_dtype_name(dt), path.name);
        KT_CHECK(w_same_bits(&p, &e0, &e1, 0), "%s %s: the entropy changed another output",
                 kdloss_dtype_name(dt), path.name);
        wres_free(&a), wres_free(&m), wres_free(&b), wres_free(&z), wres_free(&e0),
            wres_free(&e1);
    }
    entropy_alone(&p, &prm, w);
    kt_fld_problem_free(&p);
}

/* The entropy alone: no soft or hard part, no gradient (the tempered pass still runs). */
static void entropy_alone(const kt_fld_problem *pp, kdloss_fused_linear_distill_params *pr,
                          const float *w) {
    const kt_fld_problem p = *pp;
    kdloss_fused_linear_distill_params prm = *pr;
    call_opt ce = {p.labels, 1, 1, NULL};
    kdloss_dtype dt = p.ds;
    double *zs = malloc((size_t)(BT * p.v) * 8), *zt = malloc((size_t)(BT * p.v) * 8);
    kt_ref_logits(BT, HS, p.v, p.xs, p.ws, p.bias_s, zs);
    kt_ref_logits(BT, HT, p.v, p.xt, p.wt, p.bias_t, zt);
    kt_fld_cfg cf = {1.0, 1.7, 0.0, 0.0, 1.0, -100};
    wref ref;
    wref_make(&p, &cf, w, zs, zt, &ref);
    prm.weight_hard_loss = prm.weight_soft_loss = 0.0;
    prm.row_weights = w;
    KT_FOR_EACH_ISA(path, NULL) {
        wres r;
        kdloss_fused_linear_distill_out o = w_out(&p, &r, &ce);
        o.loss = o.soft_loss = o.hard_loss = NULL;
        o.row_soft = o.row_hard = NULL;
        kdloss_cmat xs = {p.pxs, p.ds, p.ld_xs}, ws = {p.pws, p.ds, p.ld_ws};
        kdloss_cmat xt = {p.pxt, p.dt, p.ld_xt}, wt = {p.pwt, p.dt, p.ld_wt};
        o.dxs.data = o.dws.data = NULL;
        o.dbs = NULL;
        r.st = kdloss_fused_linear_distill(&prm, BT, HS, HT, p.v, xs, ws, p.pbias_s, xt, wt,
                                           p.pbias_t, (kdloss_labels){p.labels, KDLOSS_I64}, &o,
                                           NULL, 0);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "entropy alone %s %s", kdloss_dtype_name(dt), path.name);
        if (KT_CHECK(r.st == KDLOSS_OK, "%s: status %d", ctx, (int)r.st))
            check_ent(ctx, r.rows + 3 * BT, ref.ent, BT);
        wres_free(&r);
    }
    wref_free(&ref);
    free(zs);
    free(zt);
}

/* The entropy after the student's logit map (scale, then softcap, then T: kdloss.h), every path,
 * against float64 H(softmax(cap tanh(s u / cap) / T)) and H(softmax(s u / T)). */
static void entropy_mapped(kt_rng *g, kdloss_dtype dt) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, 333, dt, dt, 1, 4.0, 4, -100, 0);
    double *zs = malloc((size_t)(BT * p.v) * 8), *x = malloc((size_t)p.v * 8), ent[BT];
    float w[BT];
    weights_make(g, w, 0);
    kt_ref_logits(BT, HS, p.v, p.xs, p.ws, p.bias_s, zs);
    for (int cap = 0; cap < 2; cap++) {
        kdloss_fused_linear_distill_params prm;
        kdloss_fused_linear_distill_params_default(&prm);
        prm.student_map = (kdloss_logit_map){1.3, cap ? 5.0 : 0.0};
        prm.temperature = 0.8;
        prm.row_weights = w;
        for (int64_t i = 0; i < BT; i++) {
            ent[i] = 0.0;
            if (p.labels[i] == -100 || w[i] == 0.0f) continue;
            double *z = malloc((size_t)p.v * 8);
            for (int64_t c = 0; c < p.v; c++) {
                double u = 1.3 * zs[i * p.v + c];
                z[c] = cap ? 5.0 * tanh(u / 5.0) : u;
            }
            ref_log_softmax(z, p.v, prm.temperature, x);
            for (int64_t c = 0; c < p.v; c++) ent[i] -= exp(x[c]) * x[c];
            free(z);
        }
        call_opt c = {p.labels, 1, 1, NULL};
        KT_FOR_EACH_ISA(path, NULL) {
            char ctx[96];
            snprintf(ctx, sizeof ctx, "entropy mapped cap %d %s %s", cap, kdloss_dtype_name(dt),
                     path.name);
            wres r = w_run(&p, &prm, NULL, &c);
            if (KT_CHECK(r.st == KDLOSS_OK, "%s: status %d", ctx, (int)r.st))
                check_ent(ctx, r.rows + 3 * BT, ent, BT);
            wres_free(&r);
        }
    }
    free(zs);
    free(x);
    kt_fld_problem_free(&p);
}

/* Central differences of the weighted loss in xs (fp32) against dxs: |fd - dxs| <= 2e-3 of the
 * largest |dxs| (the step's O(h^2) term) + the rounding of two fp32 losses over 2h. */
static void dense_fd(kt_rng *g) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, 203, KDLOSS_F32, KDLOSS_F32, 1, 2.0, 4, -100, 0);
    float w[BT];
    weights_make(g, w, 0);
    kdloss_fused_linear_distill_params prm;
    kdloss_fused_linear_distill_params_default(&prm);
    prm.div.divergence = KDLOSS_DIV_JSD;
    prm.temperature = 2.0;
    prm.chunk_size = 8;
    prm.row_weights = w;
    call_opt c = {p.labels, 1, 0, NULL};
    wres r = w_run(&p, &prm, NULL, &c);
    double gmax = 0.0, h = 1e-2;
    for (int64_t i = 0; i < BT * HS; i++)
        gmax = fmax(gmax, fabs(kt_get(r.dxs, KDLOSS_F32, r.ld_dxs, i / HS, i % HS)));
    float *x = (float *)p.pxs;
    for (int k = 0; k < 12; k++) {
        int64_t i = kt_randint(g, BT), j = kt_randint(g, HS);
        float x0 = x[i * p.ld_xs + j];
        call_opt c0 = {p.labels, 0, 0, NULL};
        x[i * p.ld_xs + j] = x0 + (float)h;
        wres up = w_run(&p, &prm, NULL, &c0);
        x[i * p.ld_xs + j] = x0 - (float)h;
        wres dn = w_run(&p, &prm, NULL, &c0);
        double step = (double)(x0 + (float)h) - (double)(x0 - (float)h);
        x[i * p.ld_xs + j] = x0;
        double fd = ((double)up.sc[0] - (double)dn.sc[0]) / step;
        double got = kt_get(r.dxs, KDLOSS_F32, r.ld_dxs, i, j);
        double lim = 2e-3 * gmax + 4.0 * FLT_EPSILON * fabs((double)up.sc[0]) / step;
        KT_CHECK(fabs(fd - got) <= lim, "fd dxs[%lld][%lld]: fd %.7g, dxs %.7g (bound %.3g)%s",
                 (long long)i, (long long)j, fd, got, lim, w[i] == 0.0f ? " (weight 0)" : "");
        wres_free(&up), wres_free(&dn);
    }
    wres_free(&r);
    kt_fld_problem_free(&p);
}

/* Bad weights: INVALID_PARAM (misaligned: its own code) and nothing written. */
static void bad_weights(kt_rng *g) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, 64, KDLOSS_F32, KDLOSS_F32, 1, 2.0, 4, -100, 0);
    static float buf[BT + 1];
    const float bad[3] = {-1.0f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        for (int64_t i = 0; i <= BT; i++) buf[i] = 1.0f;
        const float *w = buf;
        if (k < 3) buf[BT - 3] = bad[k];
        else w = (const float *)((const char *)buf + 2); /* misaligned */
        kdloss_fused_linear_distill_params prm;
        kdloss_fused_linear_distill_params_default(&prm);
        prm.row_weights = w;
        call_opt c = {p.labels, 1, 1, NULL};
        wres r = w_run(&p, &prm, NULL, &c);
        KT_CHECK(r.st == (k < 3 ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_MISALIGNED),
                 "bad weights %d: status %d", k, (int)r.st);
        KT_CHECK(kt_is_poison(r.sc, 3, KDLOSS_F32) && kt_is_poison(r.rows, 4 * BT, KDLOSS_F32) &&
                     kt_is_poison(r.dxs, BT * r.ld_dxs, KDLOSS_F32) &&
                     kt_is_poison(r.dws, p.v * r.ld_dws, KDLOSS_F32),
                 "bad weights %d: an output was written", k);
        wres_free(&r);
    }
    /* the entropy written over the weights: aliasing, nothing written */
    for (int64_t i = 0; i < BT; i++) buf[i] = 1.0f;
    kdloss_fused_linear_distill_params prm;
    kdloss_fused_linear_distill_params_default(&prm);
    prm.row_weights = buf;
    call_opt c = {p.labels, 0, 1, NULL};
    wres r;
    kdloss_fused_linear_distill_out o = w_out(&p, &r, &c);
    o.row_entropy = buf + 1;
    kdloss_status st = kdloss_fused_linear_distill(
        &prm, BT, HS, HT, p.v, (kdloss_cmat){p.pxs, p.ds, p.ld_xs},
        (kdloss_cmat){p.pws, p.ds, p.ld_ws}, p.pbias_s, (kdloss_cmat){p.pxt, p.dt, p.ld_xt},
        (kdloss_cmat){p.pwt, p.dt, p.ld_wt}, p.pbias_t, (kdloss_labels){p.labels, KDLOSS_I64}, &o,
        NULL, 0);
    KT_CHECK(st == KDLOSS_ERR_ALIASING, "row_entropy over row_weights: status %d", (int)st);
    KT_CHECK(kt_is_poison(r.sc, 3, KDLOSS_F32) && buf[1] == 1.0f,
             "row_entropy over row_weights: an output was written");
    kt_fld_problem_free(&p);
}

/* ---- the top-k teacher ---- */

/* Distinct ids per row, decreasing log-probs. */
static void topk_make(kt_rng *g, int64_t v, int32_t *ids, float *lp) {
    for (int64_t r = 0; r < BT; r++)
        for (int64_t k = 0; k < K; k++) {
            int dup;
            do {
                ids[r * K + k] = (int32_t)kt_randint(g, v);
                dup = 0;
                for (int64_t i = 0; i < k; i++) dup |= ids[r * K + i] == ids[r * K + k];
            } while (dup);
            lp[r * K + k] = (float)(-0.5 - 0.6 * (double)k - 0.1 * kt_uniform(g));
        }
}

/* One CPU path's top-k checks (see the file's comment); ent: float64 entropies. */
static void topk_path(const char *ctx, const kt_fld_problem *pp,
                      kdloss_fused_linear_topk_distill_params prm, const kdloss_topk_teacher *tk,
                      const float *w01, const float *w, const int64_t *masked, const double *ent) {
    const kt_fld_problem p = *pp;
    kdloss_dtype dt = p.ds;
    float ones[BT];
    for (int64_t i = 0; i < BT; i++) ones[i] = 1.0f;
    call_opt c = {p.labels, 1, 0, tk}, cm = {masked, 1, 0, tk}, ce = {p.labels, 1, 1, tk};
    prm.row_weights = NULL;
    wres a = w_run(&p, NULL, &prm, &c), m = w_run(&p, NULL, &prm, &cm);
    prm.row_weights = ones;
    wres b = w_run(&p, NULL, &prm, &c);
    prm.row_weights = w01;
    wres z = w_run(&p, NULL, &prm, &c);
    prm.row_weights = w;
    wres y = w_run(&p, NULL, &prm, &c), e = w_run(&p, NULL, &prm, &ce);
    KT_CHECK(w_same_bits(&p, &a, &b, 0), "%s: NULL weights differ from all-ones", ctx);
    KT_CHECK(w_same_bits(&p, &m, &z, 0), "%s: weights {0,1} differ from masking", ctx);
    KT_CHECK(y.st == KDLOSS_OK && e.st == KDLOSS_OK, "%s: status %d %d", ctx, y.st, e.st);
    /* the weighted soft loss from the unweighted row outputs of the same call */
    double ss = 0.0, nv = 0.0;
    for (int64_t i = 0; i < BT; i++) {
        ss += (double)w[i] * y.rows[i];
        nv += p.labels[i] != -100 && w[i] != 0.0f;
    }
    kt_close(y.sc[1], ss / nv, 1e-7, 1e-6, "%s: soft = sum w row_soft / n_valid", ctx);
    /* each dxs row: w times the masked call's (the same rows kept, so the same n_valid) */
    prm.row_weights = NULL;
    int64_t mk[BT];
    for (int64_t i = 0; i < BT; i++) mk[i] = w[i] == 0.0f ? -100 : p.labels[i];
    call_opt cw = {mk, 1, 0, tk};
    wres u = w_run(&p, NULL, &prm, &cw);
    double dmax = 0.0, derr = 0.0;
    for (int64_t i = 0; i < BT; i++)
        for (int64_t h = 0; h < HS; h++) {
            double want = (double)w[i] * kt_get(u.dxs, dt, u.ld_dxs, i, h);
            dmax = fmax(dmax, fabs(want));
            derr = fmax(derr, fabs(kt_get(y.dxs, dt, y.ld_dxs, i, h) - want));
        }
    double lim = (dt == KDLOSS_BF16 ? 0x1p-7 : 1e-5) * dmax; /* bf16: two casts */
    KT_CHECK(derr <= lim, "%s: dxs rows not w times the masked call's: %.3g > %.3g", ctx, derr,
             lim);
    check_ent(ctx, e.rows + 3 * BT, ent, BT);
    wres_free(&a), wres_free(&m), wres_free(&b), wres_free(&z), wres_free(&y), wres_free(&e),
        wres_free(&u);
}

static void topk_checks(kt_rng *g, kdloss_dtype dt, int tail) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, g, BT, HS, HT, 157, dt, dt, 1, 3.0, 4, -100, 0);
    int32_t ids[BT * K];
    float lp[BT * K], w01[BT], w[BT];
    int64_t masked[BT];
    topk_make(g, p.v, ids, lp);
    kdloss_topk_teacher tk = {K, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
    weights_make(g, w01, 1);
    weights_make(g, w, 0);
    for (int64_t i = 0; i < BT; i++) masked[i] = w01[i] == 0.0f ? -100 : p.labels[i];
    kdloss_fused_linear_topk_distill_params prm;
    kdloss_fused_linear_topk_distill_params_default(&prm);
    prm.tail = (kdloss_topk_tail)tail;
    prm.div.divergence = KDLOSS_DIV_REVERSE_KL;
    prm.temperature = 1.5;
    prm.weight_hard_loss = tail == KDLOSS_TAIL_RENORM_BOTH ? 0.0 : 0.25; /* sparse path */
    prm.chunk_size = 8;
    double *zs = malloc((size_t)(BT * p.v) * 8), *x = malloc((size_t)p.v * 8), ent[BT];
    kt_ref_logits(BT, HS, p.v, p.xs, p.ws, p.bias_s, zs);
    for (int64_t i = 0; i < BT; i++) {
        ent[i] = 0.0;
        if (p.labels[i] == -100 || w[i] == 0.0f) continue;
        ref_log_softmax(zs + i * p.v, p.v, prm.temperature, x);
        for (int64_t c = 0; c < p.v; c++) ent[i] -= exp(x[c]) * x[c];
    }
    KT_FOR_EACH_ISA(path, NULL) {
        char ctx[128];
        snprintf(ctx, sizeof ctx, "topk %s tail %d %s", kdloss_dtype_name(dt), tail, path.name);
        topk_path(ctx, &p, prm, &tk, w01, w, masked, ent);
    }
    free(zs);
    free(x);
    kt_fld_problem_free(&p);
}

int main(void) {
    kt_rng g;
    kt_rng_seed(&g, kt_base_seed());
    const kdloss_dtype dts[2] = {KDLOSS_F32, KDLOSS_BF16};
    for (int d = 0; d < 2; d++) {
        dense_grid(&g, dts[d], 97);
        dense_grid(&g, dts[d], 1100); /* two tiles of KD_FLD_TILE, a partial vector */
        dense_identities(&g, dts[d]);
        entropy_mapped(&g, dts[d]);
        topk_checks(&g, dts[d], KDLOSS_TAIL_BUCKET);
        topk_checks(&g, dts[d], KDLOSS_TAIL_RENORM_BOTH);
    }
    dense_fd(&g);
    bad_weights(&g);
    printf("largest gradient error: %.3g of its bound\n", fl_worst_seen);
    return kt_finish("test_fld_weights");
}
