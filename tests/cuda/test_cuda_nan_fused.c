/* The NaN policy of the fused losses and their wide rows (docs/MATH.md section 10; part of the
 * "nan" section, test_cuda_nan.c has the row losses): kdloss_cuda_fused_linear_distill (a NaN in one row of xs
 * or xt: row_soft, loss and that dxs row NaN, the others as the clean call's; grad_scale 0: dxs
 * zeros), kdloss_cuda_fused_linear_topk_distill (a NaN used log-prob, bucket and renorm_both),
 * kdloss_cuda_fused_linear_distill_vp and _topk_distill_vp (2 ranks: a NaN or +inf in one row;
 * row_lse and row_hard NaN on every rank). Where a gradient is 0 (nan_zero_grad), the fused
 * losses against the CPU functions element by element: renorm_both's dxs from S alone without
 * the cross-entropy's gradient (a NaN weight row outside S), zero-gradient rows with NaN xs out
 * of dws, both gradient factors 0 (zeros, no GEMM), the sparse path's NaN dws / dbs.
 * D4: logits spanning more than FLT_MAX ([3e38, -3e38, 0] and the teacher swapped, and [1e38,
 * -2.5e38, 3e38]) at T 4, 1e3, 1e30 (and 1 for the fused losses): kdloss_cuda_distill_logits
 * (forward / reverse KL, JSD), the fused dense loss (Hs = Ht = 1, the heads hold the logits) and
 * its vocabulary-parallel form (2 ranks), and the top-k bucket with K = V, against the CPU
 * functions (loss to 1e-5 relative, gradients to 1e-5 of their largest element), and the
 * documented 7.5e37 (forward KL, uniform teacher, T 4). */
#include "cuda_test.h"

/* The fused losses' outputs of a NaN-policy call, on the host. */
typedef struct nan_fout {
    float loss, soft, rs[NB], *dxs;
} nan_fout;

/* Host fp32 operands of a fused call: xs (bt x hs), ws (v x hs), xt / wt (dense teacher) or ids
 * / lp (bt x k, top-k), labels (NULL: none). */
typedef struct nan_fin {
    int64_t bt, hs, ht, v, k;
    const float *xs, *ws, *xt, *wt;
    const int32_t *ids;
    const float *lp;
    const int64_t *lab;
} nan_fin;

/* kdloss_cuda_fused_linear_distill (in->ids NULL) or _topk_distill on the device copies. */
static kdloss_status nan_fused_run(const void *params, const nan_fin *in, void *const dev[7],
                                   kdloss_fused_linear_distill_out *out, void **wk) {
    const kdloss_labels L = {dev[6], KDLOSS_I64};
    const kdloss_cmat cxs = {dev[0], KDLOSS_F32, 0}, cws = {dev[1], KDLOSS_F32, 0};
    size_t wsb = 0;
    if (in->ids) {
        const kdloss_fused_linear_topk_distill_params *p = params;
        kdloss_cuda_fused_linear_topk_distill_workspace_size(p, in->bt, in->hs, in->v, in->k,
                                                             KDLOSS_F32, 1, &wsb);
        *wk = dalloc(wsb);
        const kdloss_topk_teacher t = {in->k, {dev[4], KDLOSS_I32, 0}, {dev[5], KDLOSS_F32, 0}};
        return kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, p, in->bt, in->hs, in->v, cxs,
                                                     cws, NULL, t, L, out, *wk, wsb);
    }
    const kdloss_fused_linear_distill_params *p = params;
    kdloss_cuda_fused_linear_distill_workspace_size(p, in->bt, in->hs, in->ht, in->v, KDLOSS_F32,
                                                    1, &wsb);
    *wk = dalloc(wsb);
    return kdloss_cuda_fused_linear_distill(g_ctx, g_st, p, in->bt, in->hs, in->ht, in->v, cxs, cws,
                                            NULL, (kdloss_cmat){dev[2], KDLOSS_F32, 0},
                                            (kdloss_cmat){dev[3], KDLOSS_F32, 0}, NULL, L, out, *wk,
                                            wsb);
}

/* One fused call on host operands: loss, soft loss, row_soft and dxs (bt x hs) into o. */
static kdloss_status nan_fused_call(const void *params, const nan_fin *in, nan_fout *o) {
    const int64_t bt = in->bt, hs = in->hs;
    void *dev[7] = {dupload(in->xs, (size_t)(bt * hs) * 4),
                    dupload(in->ws, (size_t)(in->v * hs) * 4),
                    in->xt ? dupload(in->xt, (size_t)(bt * in->ht) * 4) : NULL,
                    in->wt ? dupload(in->wt, (size_t)(in->v * in->ht) * 4) : NULL,
                    in->ids ? dupload(in->ids, (size_t)(bt * in->k) * 4) : NULL,
                    in->lp ? dupload(in->lp, (size_t)(bt * in->k) * 4) : NULL,
                    in->lab ? dupload(in->lab, (size_t)bt * 8) : NULL};
    float *dsc = dalloc(4 * (2 + bt));
    void *ddx = dalloc((size_t)(bt * hs) * 4), *wk = NULL;
    kdloss_fused_linear_distill_out out;
    memset(&out, 0, sizeof out);
    out.loss = dsc, out.soft_loss = dsc + 1, out.row_soft = dsc + 2;
    out.dxs = (kdloss_mat){ddx, KDLOSS_F32, 0};
    const kdloss_status st = nan_fused_run(params, in, dev, &out, &wk);
    float *h = xmalloc(4 * (2 + bt));
    ddown(h, dsc, 4 * (2 + bt));
    o->loss = h[0], o->soft = h[1];
    memcpy(o->rs, h + 2, sizeof(float) * (bt < NB ? bt : NB));
    free(h);
    ddown(o->dxs, ddx, (size_t)(bt * hs) * 4);
    for (int i = 0; i < 7; i++)
        if (dev[i]) CK(cudaFree(dev[i]));
    CK(cudaFree(wk));
    return st;
}

enum { NF_V = 300, NF_HS = 4, NF_HT = 3 };

/* Random fp32 operands of the fused NaN cases: xs, xt in [-0.5, 0.5), ws, wt in [-1, 1). */
static void nan_fused_operands(kt_rng *rng, float *xs, float *ws, float *xt, float *wt) {
    for (int64_t i = 0; i < NB * NF_HS; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < NF_V * NF_HS; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < NB * NF_HT; i++) xt[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < NF_V * NF_HT; i++) wt[i] = (float)(2 * kt_uniform(rng) - 1);
}

/* 1 if every element of row r of dxs (hs wide) is NaN. */
static int nan_dxs_row(const float *dx, int64_t hs, int64_t r) {
    int all = 1;
    for (int64_t i = 0; i < hs; i++) all &= isnan(dx[r * hs + i]);
    return all;
}

/* The dense fused loss, divergence dv, a NaN in row 1 of xs (who 0) or xt (who 1): against the
 * clean call; on forward KL also grad_scale 0 (zeros). */
static void nan_fused_dense(int who, int dv, const nan_fin *in0) {
    enum { HS = NF_HS, HT = NF_HT };
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.div.divergence = (kdloss_divergence)dv;
    p.temperature = 2.0;
    float xs1[NB * HS], xt1[NB * HT], dx[2][NB * HS], dz[NB * HS];
    memcpy(xs1, in0->xs, sizeof xs1);
    memcpy(xt1, in0->xt, sizeof xt1);
    nan_fout o[2] = {{.dxs = dx[0]}, {.dxs = dx[1]}}, z = {.dxs = dz};
    nan_fin in = *in0;
    in.xs = xs1, in.xt = xt1;
    KT_CHECK(nan_fused_call(&p, in0, &o[0]) == KDLOSS_OK, "nan fused: clean status");
    (who ? xt1 : xs1)[1 * (who ? HT : HS) + 1] = NAN;
    KT_CHECK(nan_fused_call(&p, &in, &o[1]) == KDLOSS_OK, "nan fused: status");
    char what[96];
    snprintf(what, sizeof what, "fused dense NaN in %s div %d", who ? "xt" : "xs", dv);
    if (dv == 0) { /* grad_scale 0: zeros */
        kdloss_fused_linear_distill_params p0 = p;
        p0.grad_scale = 0.0;
        nan_fused_call(&p0, &in, &z);
        int zero = 1;
        for (int64_t i = 0; i < HS; i++) zero &= dz[HS + i] == 0.0f;
        KT_CHECK(isnan(z.loss) && zero, "nan %s: grad_scale 0 must write zeros", what);
    }
    KT_CHECK(isnan(o[1].loss) && isnan(o[1].rs[1]), "nan %s: loss %g row %g, want NaN", what,
             o[1].loss, o[1].rs[1]);
    KT_CHECK(nan_dxs_row(dx[1], HS, 1), "nan %s: dxs row not NaN", what);
    KT_CHECK(!memcmp(o[1].rs, o[0].rs, 4) && !memcmp(o[1].rs + 2, o[0].rs + 2, 4),
             "nan %s: clean rows' losses changed", what);
    int ok = 1;
    for (int64_t r = 0; r < NB; r += 2)
        for (int64_t i = 0; i < HS; i++)
            ok &= fabsf(dx[1][r * HS + i] - dx[0][r * HS + i]) <=
                  1e-6f * (1 + fabsf(dx[0][r * HS + i]));
    KT_CHECK(ok, "nan %s: clean rows' dxs changed", what);
}

/* The fused top-k loss: a NaN used log-prob in row 1, bucket and renorm_both (the sparse path). */
static void nan_fused_topk(const nan_fin *in0) {
    enum { HS = NF_HS };
    int32_t ids[NB * 4];
    float lp[NB * 4], dx[NB * HS];
    for (int64_t i = 0; i < NB * 4; i++) ids[i] = (int32_t)(5 * i), lp[i] = -1.0f - (float)(i % 4);
    lp[4 + 2] = NAN;
    nan_fin in = *in0;
    in.k = 4, in.xt = in.wt = NULL, in.ids = ids, in.lp = lp, in.lab = NULL;
    for (int tail = 0; tail < 2; tail++) {
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        p.tail = (kdloss_topk_tail)tail;
        nan_fout o = {.dxs = dx};
        KT_CHECK(nan_fused_call(&p, &in, &o) == KDLOSS_OK, "nan fused topk status");
        KT_CHECK(isnan(o.loss) && isnan(o.rs[1]) && nan_dxs_row(dx, HS, 1) && isfinite(o.rs[0]) &&
                     isfinite(o.rs[2]) && isfinite(dx[0]) && isfinite(dx[2 * HS]),
                 "nan fused topk tail %d: NaN log-prob not propagated", tail);
    }
}

void nan_fused(kt_rng *rng) {
    float xs[NB * NF_HS], ws[NF_V * NF_HS], xt[NB * NF_HT], wt[NF_V * NF_HT];
    nan_fused_operands(rng, xs, ws, xt, wt);
    const int64_t lab[NB] = {3, 7, 11};
    const nan_fin in = {NB, NF_HS, NF_HT, NF_V, 0, xs, ws, xt, wt, NULL, NULL, lab};
    for (int who = 0; who < 2; who++)
        for (int dv = 0; dv <= 5; dv++) nan_fused_dense(who, dv, &in);
    nan_fused_topk(&in);
}

/* ---- the vocabulary-parallel losses, 2 ranks ---- */

/* A rank of the dense loss against the whole call: loss, row_soft and dxs element by element
 * (NaN where the whole call's is; to 1e-5 of the largest otherwise). */
static void nan_vp_rank(const char *tag, const vp_case *c, vp_job *j, const vp_out *whole,
                        void *arg) {
    KT_CHECK(j->status == KDLOSS_OK, "nan %s: %s", tag, kdloss_status_string(j->status));
    if (j->status != KDLOSS_OK || !whole) return;
    const int64_t bt = c->bt, n = c->bt * c->hs;
    const float *wd = whole->dxs, *qd = j->o.dxs;
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(wd[i])) mx = fmax(mx, fabs(wd[i]));
    int bad = !close1(j->o.sc[0], whole->sc[0], 1e-30, 1e-5);
    for (int64_t i = 0; i < bt; i++) bad |= !close1(j->o.rows[i], whole->rows[i], 1e-6, 1e-5);
    for (int64_t i = 0; i < n; i++)
        if (!close1(qd[i], wd[i], 1e-5 * mx, 1e-5)) {
            printf("  dxs[%lld]: %g vs %g\n", (long long)i, qd[i], wd[i]);
            bad = 1;
        }
    KT_CHECK(!bad, "nan %s: differs from the whole call (loss %g vs %g, row_soft %g %g %g vs %g %g "
             "%g)", tag, j->o.sc[0], whole->sc[0], j->o.rows[0], j->o.rows[bt > 1],
             j->o.rows[bt - 1], whole->rows[0], whole->rows[bt > 1], whole->rows[bt - 1]);
    (void)arg;
}

/* The vocabulary-parallel dense loss with 2 ranks on host fp32 operands against the
 * single-process call, whose row_soft and dxs come back in rs_whole, dxs_whole. */
static void nan_vp(const char *tag, const kdloss_fused_linear_distill_params *p, const nan_fin *in,
                   float *rs_whole, float *dxs_whole) {
    vp_case c;
    memset(&c, 0, sizeof c);
    c.tag = tag;
    c.bt = in->bt, c.hs = in->hs, c.ht = in->ht, c.v = in->v, c.dt = KDLOSS_F32;
    c.dp = *p;
    vp_data d;
    memset(&d, 0, sizeof d);
    d.xs = dupload(in->xs, (size_t)(c.bt * c.hs) * 4);
    d.ws = dupload(in->ws, (size_t)(c.v * c.hs) * 4);
    d.xt = dupload(in->xt, (size_t)(c.bt * c.ht) * 4);
    d.wt = dupload(in->wt, (size_t)(c.v * c.ht) * 4);
    d.lab = dupload(in->lab, (size_t)c.bt * 8);
    d.bs = dalloc(4), d.bt = dalloc(4), d.ids = dalloc(4), d.lp = dalloc(4);
    char t[160];
    snprintf(t, sizeof t, "nan %s", tag);
    vp_out whole;
    vp_run_case(t, &c, &d, 2, &whole, NULL, nan_vp_rank, NULL);
    memcpy(rs_whole, whole.rows, sizeof(float) * c.bt);
    memcpy(dxs_whole, whole.dxs, sizeof(float) * c.bt * c.hs);
    vp_out_free(&whole);
    vp_data_free(&d);
}

/* A NaN in row 1 of xs (JSD, T 1) or a +inf in row 1 of xt (reverse KL, T 2). */
void nan_vp_cases(kt_rng *rng) {
    enum { HS = NF_HS, HT = NF_HT };
    float xs[NB * HS], ws[NF_V * HS], xt[NB * HT], wt[NF_V * HT], rs[NB], dx[NB * HS];
    nan_fused_operands(rng, xs, ws, xt, wt);
    const int64_t lab[NB] = {3, 7, 11};
    for (int who = 0; who < 2; who++) {
        kdloss_fused_linear_distill_params p;
        kdloss_fused_linear_distill_params_default(&p);
        p.div.divergence = who ? KDLOSS_DIV_REVERSE_KL : KDLOSS_DIV_JSD;
        p.temperature = who ? 2.0 : 1.0;
        float xs1[NB * HS], xt1[NB * HT];
        memcpy(xs1, xs, sizeof xs1);
        memcpy(xt1, xt, sizeof xt1);
        (who ? xt1 : xs1)[1 * (who ? HT : HS) + 2] = who ? INFINITY : NAN;
        char tag[64];
        snprintf(tag, sizeof tag, "vp fused %s in %s", who ? "+inf" : "NaN", who ? "xt" : "xs");
        const nan_fin in = {NB, HS, HT, NF_V, 0, xs1, ws, xt1, wt, NULL, NULL, lab};
        nan_vp(tag, &p, &in, rs, dx);
        KT_CHECK(isnan(rs[1]) && nan_dxs_row(dx, HS, 1) && isfinite(rs[0]) && isfinite(rs[2]) &&
                     isfinite(dx[0]),
                 "nan %s: the whole call's row 1 not NaN", tag);
    }
}

/* A rank of the top-k loss: its row outputs as the whole call's. */
static void nan_vp_topk_rank(const char *tag, const vp_case *c, vp_job *j, const vp_out *whole,
                             void *arg) {
    KT_CHECK(j->status == KDLOSS_OK, "%s: %s", tag, kdloss_status_string(j->status));
    if (j->status != KDLOSS_OK || !whole) return;
    int bad = 0;
    for (int64_t i = 0; i < 3 * NB; i++) bad |= !close1(j->o.rows[i], whole->rows[i], 1e-6, 1e-5);
    KT_CHECK(!bad, "%s: row outputs differ from the whole call (row_lse[1] %g vs %g, row_hard[1] "
             "%g vs %g)", tag, j->o.rows[2 * NB + 1], whole->rows[2 * NB + 1], j->o.rows[NB + 1],
             whole->rows[NB + 1]);
    (void)c, (void)arg;
}

/* The vocabulary-parallel top-k loss, 2 ranks, a NaN in row 1's xs (every logit of the row NaN)
 * and row 1 without a used slot, weight_hard_loss 0.5 (row_lse, cross-entropy): row_lse and
 * row_hard NaN on every rank, as the single-process call's and the CPU's. The ranks' maxima
 * outside S were fmaxf's, which drop NaN: -inf, the row's sums skipped, row_lse -inf. */
void nan_vp_topk(kt_rng *rng) {
    enum { V = NF_V, HS = NF_HS, K = 3 };
    float xs[NB * HS], ws[V * HS], lp[NB * K];
    const int32_t ids[NB * K] = {5, 40, 250, -1, -1, -1, 7, 180, 299};
    const int64_t lab[NB] = {3, 7, 11};
    for (int64_t i = 0; i < NB * HS; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HS; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < NB * K; i++) lp[i] = (float)(-0.5 - 2 * kt_uniform(rng));
    xs[1 * HS + 2] = NAN;
    for (int tail = 0; tail < 3; tail++) {
        vp_case c;
        memset(&c, 0, sizeof c);
        c.topk = 1, c.bt = NB, c.hs = HS, c.v = V, c.k = K, c.dt = KDLOSS_F32, c.labels = 1;
        kdloss_fused_linear_topk_distill_params_default(&c.tp);
        c.tp.tail = (kdloss_topk_tail)tail;
        c.tp.weight_hard_loss = 0.5;
        vp_data d = {dupload(xs, sizeof xs),
                     dupload(ws, sizeof ws),
                     dalloc(4),
                     dalloc(4),
                     dalloc(4),
                     dalloc(4),
                     dupload(lab, sizeof lab),
                     dupload(ids, sizeof ids),
                     dupload(lp, sizeof lp)};
        char tag[64];
        snprintf(tag, sizeof tag, "nan vp top-k tail %d", tail);
        c.tag = tag;
        vp_out whole;
        vp_run_case(tag, &c, &d, 2, &whole, NULL, nan_vp_topk_rank, NULL);
        KT_CHECK(isnan(whole.rows[2 * NB + 1]) && isnan(whole.rows[NB + 1]) &&
                     isfinite(whole.rows[2 * NB]),
                 "%s: the whole call's row_lse %g (want NaN)", tag, whole.rows[2 * NB + 1]);
        vp_out_free(&whole);
        vp_data_free(&d);
    }
}

/* ---- D4: rows spanning more than FLT_MAX ---- */

/* kdloss_cuda_distill_logits against kdloss_distill_logits on one row s, t; returns the loss
 * and the gradient's largest magnitude (*gmax). */
static float wide_logits(const char *what, const float *s, const float *t, int div, double T,
                         double *gmax) {
    float g[3], cg[3], loss, closs;
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div.divergence = (kdloss_divergence)div;
    p.temperature = T;
    KT_CHECK(nan_dl_call(&p, 1, 3, KDLOSS_F32, s, t, &loss, NULL, g) == KDLOSS_OK &&
                 kdloss_distill_logits(&p, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0},
                                       (kdloss_cmat){t, KDLOSS_F32, 0},
                                       (kdloss_labels){NULL, KDLOSS_I64}, &closs, NULL,
                                       (kdloss_mat){cg, KDLOSS_F32, 0}) == KDLOSS_OK,
             "nan %s: status", what);
    *gmax = 0;
    for (int j = 0; j < 3; j++) *gmax = fmax(*gmax, fabs(cg[j]));
    kt_close(loss, closs, 0, 1e-5, "nan %s: loss vs CPU", what);
    for (int j = 0; j < 3; j++)
        kt_close(g[j], cg[j], 1e-5 * *gmax, 0, "nan %s: dz[%d] vs CPU", what, j);
    return loss;
}

/* The fused loss with Hs = Ht = 1, xs = xt = 1 (the heads hold the logits) against the CPU's;
 * its vocabulary-parallel form (2 ranks) against the single-process call when vp. */
static void wide_fused(const char *what, const float *s, const float *t, int div, double T,
                       double gmax, int vp) {
    static const float one[1] = {1.0f};
    static const int64_t lab[1] = {0};
    kdloss_fused_linear_distill_params fp;
    kdloss_fused_linear_distill_params_default(&fp);
    fp.div.divergence = (kdloss_divergence)div;
    fp.temperature = T, fp.weight_hard_loss = 0.0, fp.weight_soft_loss = 1.0;
    float dxs, cdxs, csoft;
    nan_fout o = {.dxs = &dxs};
    const nan_fin in = {1, 1, 1, 3, 0, one, s, one, t, NULL, NULL, lab};
    KT_CHECK(nan_fused_call(&fp, &in, &o) == KDLOSS_OK, "nan %s: fused status", what);
    kdloss_fused_linear_distill_out co;
    memset(&co, 0, sizeof co);
    co.soft_loss = &csoft;
    co.dxs = (kdloss_mat){&cdxs, KDLOSS_F32, 0};
    const kdloss_cmat c1 = {one, KDLOSS_F32, 0}, cs = {s, KDLOSS_F32, 0}, ct = {t, KDLOSS_F32, 0};
    KT_CHECK(kdloss_fused_linear_distill(&fp, 1, 1, 1, 3, c1, cs, NULL, c1, ct, NULL,
                                         (kdloss_labels){lab, KDLOSS_I64}, &co, NULL,
                                         0) == KDLOSS_OK,
             "nan %s: CPU fused status", what);
    kt_close(o.soft, csoft, 0, 1e-5, "nan %s: fused soft vs CPU", what);
    kt_close(dxs, cdxs, 1e-5 * gmax * 3e38, 1e-5, "nan %s: fused dxs vs CPU", what);
    if (vp) {
        float rs[1], dx[1];
        char tag[120];
        snprintf(tag, sizeof tag, "vp %s", what);
        nan_vp(tag, &fp, &in, rs, dx);
    }
}

/* The top-k bucket with K = V: the dense loss on log_softmax(zt / T); against the CPU's, and
 * (dense, not NaN: T != 1) against the dense loss. */
static void wide_topk(const char *what, const float *s, const double *zt, double T, float dense) {
    int32_t ids[3] = {0, 1, 2};
    float lp[3], tl, ctl, tg[3], ctg[3];
    double mt = -INFINITY, st = 0, tm = 0;
    for (int j = 0; j < 3; j++) mt = fmax(mt, zt[j]);
    for (int j = 0; j < 3; j++) st += exp((zt[j] - mt) / T);
    for (int j = 0; j < 3; j++) lp[j] = (float)((zt[j] - mt) / T - log(st));
    kdloss_topk_distill_params tp;
    kdloss_topk_distill_params_default(&tp);
    tp.temperature = T;
    const kdloss_topk_teacher tk = {3, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
    KT_CHECK(nan_tk_call(&tp, 1, 3, 3, s, ids, lp, &tl, NULL, tg) == KDLOSS_OK &&
                 kdloss_topk_distill_logits(&tp, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0}, tk,
                                            (kdloss_labels){NULL, KDLOSS_I64}, &ctl, NULL,
                                            (kdloss_mat){ctg, KDLOSS_F32, 0}) == KDLOSS_OK,
             "nan %s: topk status", what);
    kt_close(tl, ctl, 0, 1e-5, "nan %s: topk loss vs CPU", what);
    if (T != 1.0) kt_close(tl, dense, 0, 1e-5, "nan %s: topk K = V vs dense", what);
    for (int j = 0; j < 3; j++) tm = fmax(tm, fabs(ctg[j]));
    for (int j = 0; j < 3; j++)
        kt_close(tg[j], ctg[j], 1e-5 * tm, 0, "nan %s: topk dz[%d] vs CPU", what, j);
}

/* Rows x T x divergence; the vocabulary-parallel form at T 4 (every divergence on the last row:
 * the time the simulator takes), the top-k loss for forward KL. */
void nan_wide(void) {
    if (!kdloss_distill_logits || !kdloss_fused_linear_distill || !kdloss_topk_distill_logits) {
        printf("nan wide: skipped (this build has no CPU functions)\n");
        return;
    }
    static const double a[3] = {3e38, -3e38, 0}, b[3] = {0, 0, 0}, c[3] = {1e38, -2.5e38, 3e38};
    const double *rows[3][2] = {{a, b}, {b, a}, {c, a}};
    static const double ts[4] = {4, 1e3, 1e30, 1};
    static const int divs[3] = {KDLOSS_DIV_FORWARD_KL, KDLOSS_DIV_REVERSE_KL, KDLOSS_DIV_JSD};
    for (int ri = 0; ri < 3; ri++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++) {
                float s[3], t[3];
                for (int j = 0; j < 3; j++)
                    s[j] = (float)rows[ri][0][j], t[j] = (float)rows[ri][1][j];
                char what[96];
                snprintf(what, sizeof what, "wide row %d T %g div %d", ri, ts[ti], divs[di]);
                double gmax;
                const float loss = wide_logits(what, s, t, divs[di], ts[ti], &gmax);
                if (ri == 0 && ti == 0 && di == 0) /* docs/MATH.md 10 */
                    kt_close(loss, 7.5e37, 0, 1e-6, "nan %s: the documented 7.5e37", what);
                wide_fused(what, s, t, divs[di], ts[ti], gmax, ti == 0 && (di == 0 || ri == 2));
                if (divs[di] == KDLOSS_DIV_FORWARD_KL)
                    wide_topk(what, s, rows[ri][1], ts[ti], loss);
            }
}

/* ---- the fused losses where a gradient is 0, against the CPU ---- */

/* The last CUDA items of the NaN policy, the fused losses against the CPU functions where a gradient is 0
 * (docs/MATH.md 10; src/cpu/fld.c):
 *  (1) renorm_both without the cross-entropy's gradient on the full-vocabulary path
 * (weight_hard_loss 0 with labels and a hard_loss output, or without labels and a row_lse output;
 * the vocabulary-parallel call always): dxs from the columns in S alone, so a NaN weight row
 * outside every S is not read (the dxs GEMM's 0 x NaN made every dxs NaN); (2) a row whose gradient
 * is 0 by the rules (an ignored row; a top-k row without a used slot and without the
 * cross-entropy's gradient) and whose xs holds a NaN stays out of the dws GEMM (0 x NaN made dws
 * NaN); (3) both gradient factors 0 (grad_scale 0, or both weights 0 with the losses asked for):
 * zero dxs / dws / dbs without the GEMMs (a NaN weight row or xs row made them NaN), the sparse
 *      renorm_both path too.
 * Single-process calls and the vocabulary-parallel ones (2 ranks) on NB rows of fixed fp32
 * operands, against the CPU function on the same operands: every output element by element, NaN
 * where the CPU's is, within 1e-4 relative + 1e-4 of the largest finite element otherwise. */
typedef struct par_case {
    const char *tag;
    int topk, tail;          /* top-k teacher (tail: kdloss_topk_tail) or dense */
    int64_t hs, ht, v, k;    /* NB rows */
    const float *xs, *ws, *bs, *xt, *wt, *btb;
    const int32_t *ids;      /* NB x k */
    const float *lp;
    const int64_t *lab;      /* NULL: no labels (top-k) */
    double w_hard, w_soft, grad_scale, temperature;
    int want_hard, want_lse; /* hard_loss and row_hard; row_lse */
} par_case;

/* One call's outputs on the host: loss, soft, hard; row_soft, row_hard, row_lse; gradients. */
typedef struct par_res {
    float sc[3], rows[3 * NB];
    float *dxs, *dws, *dbs;
} par_res;

static kdloss_fused_linear_distill_params par_dp(const par_case *c) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.div.divergence = KDLOSS_DIV_FORWARD_KL;
    p.weight_hard_loss = c->w_hard, p.weight_soft_loss = c->w_soft;
    p.grad_scale = c->grad_scale, p.temperature = c->temperature;
    return p;
}

static kdloss_fused_linear_topk_distill_params par_tp(const par_case *c) {
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params_default(&p);
    p.tail = (kdloss_topk_tail)c->tail;
    p.weight_hard_loss = c->w_hard, p.weight_soft_loss = c->w_soft;
    p.grad_scale = c->grad_scale, p.temperature = c->temperature;
    return p;
}

/* The case's outputs at sc, rows and the gradients (host or device). */
static kdloss_fused_linear_distill_out par_view(const par_case *c, float *sc, float *rows,
                                                void *dxs, void *dws, void *dbs) {
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = sc, o.soft_loss = sc + 1, o.hard_loss = c->want_hard ? sc + 2 : NULL;
    o.row_soft = rows, o.row_hard = c->want_hard ? rows + NB : NULL;
    o.row_lse = c->want_lse ? rows + 2 * NB : NULL;
    o.dxs = (kdloss_mat){dxs, KDLOSS_F32, 0};
    o.dws = (kdloss_mat){dws, KDLOSS_F32, 0};
    o.dbs = dbs;
    return o;
}

static void par_res_alloc(const par_case *c, par_res *o) {
    memset(o, 0, sizeof *o);
    o->dxs = xmalloc((size_t)(NB * c->hs) * 4);
    o->dws = xmalloc((size_t)(c->v * c->hs) * 4);
    o->dbs = xmalloc((size_t)c->v * 4);
}

static void par_res_free(par_res *o) { free(o->dxs), free(o->dws), free(o->dbs); }

/* The call on xs / ws / bs and the teacher's operands (host or device: d NULL for the host),
 * CPU (cpu) or single-process CUDA. */
static kdloss_status par_call(const par_case *c, const vp_data *d,
                              kdloss_fused_linear_distill_out *out, void *wk, size_t wsb) {
    const kdloss_cmat xs = {d ? d->xs : c->xs, KDLOSS_F32, 0},
                      ws = {d ? d->ws : c->ws, KDLOSS_F32, 0};
    const void *bs = d ? d->bs : c->bs;
    const kdloss_labels lab = {c->lab ? (d ? d->lab : c->lab) : NULL, KDLOSS_I64};
    if (c->topk) {
        const kdloss_fused_linear_topk_distill_params p = par_tp(c);
        const kdloss_topk_teacher t = {c->k, {d ? d->ids : c->ids, KDLOSS_I32, 0},
                                       {d ? d->lp : c->lp, KDLOSS_F32, 0}};
        if (!d)
            return kdloss_fused_linear_topk_distill(&p, NB, c->hs, c->v, xs, ws, bs, t, lab, out,
                                                    NULL, 0);
        return kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &p, NB, c->hs, c->v, xs, ws, bs,
                                                     t, lab, out, wk, wsb);
    }
    const kdloss_fused_linear_distill_params p = par_dp(c);
    const kdloss_cmat xt = {d ? d->xt : c->xt, KDLOSS_F32, 0},
                      wt = {d ? d->wt : c->wt, KDLOSS_F32, 0};
    const void *btb = d ? d->bt : c->btb;
    if (!d)
        return kdloss_fused_linear_distill(&p, NB, c->hs, c->ht, c->v, xs, ws, bs, xt, wt, btb, lab,
                                           out, NULL, 0);
    return kdloss_cuda_fused_linear_distill(g_ctx, g_st, &p, NB, c->hs, c->ht, c->v, xs, ws, bs, xt,
                                            wt, btb, lab, out, wk, wsb);
}

static kdloss_status par_cpu(const par_case *c, par_res *o) {
    kdloss_fused_linear_distill_out out = par_view(c, o->sc, o->rows, o->dxs, o->dws, o->dbs);
    return par_call(c, NULL, &out, NULL, 0);
}

/* The case's operands on the device, as the vocabulary-parallel harness keeps them (every
 * pointer an allocation). */
static void par_upload(const par_case *c, vp_data *d) {
    memset(d, 0, sizeof *d);
    d->xs = dupload(c->xs, (size_t)(NB * c->hs) * 4);
    d->ws = dupload(c->ws, (size_t)(c->v * c->hs) * 4);
    d->bs = dupload(c->bs, (size_t)c->v * 4);
    d->xt = c->topk ? dalloc(4) : dupload(c->xt, (size_t)(NB * c->ht) * 4);
    d->wt = c->topk ? dalloc(4) : dupload(c->wt, (size_t)(c->v * c->ht) * 4);
    d->bt = c->topk ? dalloc(4) : dupload(c->btb, (size_t)c->v * 4);
    d->lab = c->lab ? dupload(c->lab, NB * 8) : dalloc(4);
    d->ids = c->topk ? dupload(c->ids, (size_t)(NB * c->k) * 4) : dalloc(4);
    d->lp = c->topk ? dupload(c->lp, (size_t)(NB * c->k) * 4) : dalloc(4);
}

/* The single-process CUDA call. */
static kdloss_status par_cuda(const par_case *c, par_res *o) {
    vp_data d;
    par_upload(c, &d);
    float *dsc = dalloc(3 * 4), *drows = dalloc(3 * NB * 4);
    void *ddx = dalloc((size_t)(NB * c->hs) * 4), *ddw = dalloc((size_t)(c->v * c->hs) * 4);
    void *ddb = dalloc((size_t)c->v * 4);
    dpoison(ddx, (size_t)(NB * c->hs) * 4);
    dpoison(ddw, (size_t)(c->v * c->hs) * 4);
    dpoison(ddb, (size_t)c->v * 4);
    kdloss_fused_linear_distill_out out = par_view(c, dsc, drows, ddx, ddw, ddb);
    size_t wsb = 0;
    if (c->topk) {
        const kdloss_fused_linear_topk_distill_params p = par_tp(c);
        kdloss_cuda_fused_linear_topk_distill_workspace_size(&p, NB, c->hs, c->v, c->k, KDLOSS_F32,
                                                             1, &wsb);
    } else {
        const kdloss_fused_linear_distill_params p = par_dp(c);
        kdloss_cuda_fused_linear_distill_workspace_size(&p, NB, c->hs, c->ht, c->v, KDLOSS_F32, 1,
                                                        &wsb);
    }
    void *wk = dalloc(wsb);
    const kdloss_status st = par_call(c, &d, &out, wk, wsb);
    ddown(o->sc, dsc, sizeof o->sc);
    ddown(o->rows, drows, sizeof o->rows);
    ddown(o->dxs, ddx, (size_t)(NB * c->hs) * 4);
    ddown(o->dws, ddw, (size_t)(c->v * c->hs) * 4);
    ddown(o->dbs, ddb, (size_t)c->v * 4);
    CK(cudaFree(wk));
    vp_data_free(&d);
    return st;
}

/* n floats of got against want (the CPU's): NaN where want is, else within 1e-4. */
static void par_cmp1(const char *tag, const char *what, const float *got, const float *want,
                     int64_t n) {
    double *g = xmalloc((size_t)n * sizeof(double)), *w = xmalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) g[i] = got[i], w[i] = want[i];
    char name[200];
    snprintf(name, sizeof name, "nan %s: %s vs CPU", tag, what);
    cmp_arr(name, g, w, n, 1e-4 * max_abs(w, n) + 1e-30, 1e-4);
    free(g), free(w);
}

/* A call's outputs against the CPU's; dws and dbs of vocabulary rows [lo, lo + n). The loss is
 * left out without labels: there the CPU's row_hard is the row's lse (a NaN one when row_lse is
 * asked for), which its total loss adds times weight_hard_loss 0, and CUDA's is 0. */
static void par_cmp(const char *tag, const par_case *c, const par_res *got, const par_res *cpu,
                    int64_t lo, int64_t n) {
    if (c->lab) par_cmp1(tag, "loss", got->sc, cpu->sc, 1);
    par_cmp1(tag, "soft_loss", got->sc + 1, cpu->sc + 1, 1);
    par_cmp1(tag, "row_soft", got->rows, cpu->rows, NB);
    if (c->want_hard) {
        par_cmp1(tag, "hard_loss", got->sc + 2, cpu->sc + 2, 1);
        par_cmp1(tag, "row_hard", got->rows + NB, cpu->rows + NB, NB);
    }
    if (c->want_lse) par_cmp1(tag, "row_lse", got->rows + 2 * NB, cpu->rows + 2 * NB, NB);
    par_cmp1(tag, "dxs", got->dxs, cpu->dxs, NB * c->hs);
    par_cmp1(tag, "dws", got->dws, cpu->dws + lo * c->hs, n * c->hs);
    par_cmp1(tag, "dbs", got->dbs, cpu->dbs + lo, n);
}

/* A rank of a case on 2 ranks against the CPU's results (arg: the case and the CPU's par_res). */
typedef struct par_vp_arg {
    const par_case *c;
    const par_res *cpu;
} par_vp_arg;

static void par_vp_rank(const char *tag, const vp_case *vc, vp_job *j, const vp_out *whole,
                        void *arg) {
    const par_vp_arg *a = arg;
    KT_CHECK(j->status == KDLOSS_OK && j->word == KDLOSS_OK, "nan %s: %s, status word %d", tag,
             kdloss_status_string(j->status), (int)j->word);
    if (j->status != KDLOSS_OK) return;
    par_res got;
    memcpy(got.sc, j->o.sc, sizeof got.sc);
    memcpy(got.rows, j->o.rows, sizeof got.rows);
    got.dxs = j->o.dxs, got.dws = j->o.dws, got.dbs = j->o.dbs;
    par_cmp(tag, a->c, &got, a->cpu, j->lo, j->n);
    (void)vc, (void)whole;
}

/* The case single-process (vp 0) or on 2 ranks (vp 1; the vocabulary-parallel outputs: hard ones
 * with a dense teacher or a cross-entropy weight, as the harness's vp_view) against the CPU. */
static void par_run(const par_case *c0, int vp) {
    par_case c = *c0;
    if (vp) c.want_hard = c.want_lse = !c.topk || c.w_hard > 0.0;
    char tag[160];
    snprintf(tag, sizeof tag, "%s%s", c.tag, vp ? " (vp, 2 ranks)" : "");
    par_res cpu, got;
    par_res_alloc(&c, &cpu);
    par_res_alloc(&c, &got);
    KT_CHECK(par_cpu(&c, &cpu) == KDLOSS_OK, "nan %s: CPU status", tag);
    if (!vp) {
        const kdloss_status st = par_cuda(&c, &got);
        KT_CHECK(st == KDLOSS_OK, "nan %s: status %s", tag, kdloss_status_string(st));
        par_cmp(tag, &c, &got, &cpu, 0, c.v);
    } else {
        vp_case vc;
        memset(&vc, 0, sizeof vc);
        vc.tag = tag;
        vc.topk = c.topk, vc.bt = NB, vc.hs = c.hs, vc.ht = c.ht, vc.v = c.v, vc.k = c.k;
        vc.dt = KDLOSS_F32, vc.bias = 1, vc.labels = c.lab != NULL;
        vc.dp = par_dp(&c), vc.tp = par_tp(&c);
        vp_data d;
        par_upload(&c, &d);
        par_vp_arg a = {&c, &cpu};
        vp_run_case(tag, &vc, &d, 2, NULL, NULL, par_vp_rank, &a);
        vp_data_free(&d);
    }
    par_res_free(&cpu);
    par_res_free(&got);
}

/* The cases of nan_zero_grad on the base (top-k renorm_both, w_hard 0, w_soft 1, T 1.5, labels,
 * every operand clean): which operands, weights and outputs differ, and where they run. */
enum { PZ_WS_NAN = 1, PZ_WS_NAN_S = 2 };  /* ws: a NaN row outside every S / in row 0's S */
enum { PZ_XS_NAN = 1, PZ_XS_NAN2 = 2 };   /* xs: row 1 NaN / rows 0 and 1 NaN */
enum { PZ_LAB_NONE = 1, PZ_LAB_IGN = 2 }; /* labels: none / row 1 ignored */
enum { PZ_SINGLE = 1, PZ_VP = 2 };
typedef struct par_mod {
    const char *tag;
    int topk, tail, ws, xs, lab, ids_empty, lp_nan;
    double w_hard, w_soft, grad_scale;
    int want_hard, want_lse, runs;
} par_mod;

#define PZ_RB KDLOSS_TAIL_RENORM_BOTH
#define PZ_BU KDLOSS_TAIL_BUCKET
static const par_mod PAR_MODS[] = {
    /* (1) renorm_both without the cross-entropy's gradient, a NaN weight row outside every S */
    {"(1) top-k renorm_both w_hard 0, hard_loss asked, NaN ws outside S",
     1, PZ_RB, PZ_WS_NAN, 0, 0, 0, 0, 0.0, 1.0, 1.0, 1, 0, PZ_SINGLE},
    {"(1) top-k renorm_both without labels, row_lse asked, NaN ws outside S",
     1, PZ_RB, PZ_WS_NAN, 0, PZ_LAB_NONE, 0, 0, 0.0, 1.0, 1.0, 0, 1, PZ_SINGLE},
    {"(1) top-k renorm_both w_hard 0, NaN ws outside S",
     1, PZ_RB, PZ_WS_NAN, 0, 0, 0, 0, 0.0, 1.0, 1.0, 0, 0, PZ_VP},
    {"(1) top-k renorm_both without labels, NaN ws outside S",
     1, PZ_RB, PZ_WS_NAN, 0, PZ_LAB_NONE, 0, 0, 0.0, 1.0, 1.0, 0, 0, PZ_VP},
    /* (2) a row whose gradient is 0 by the rules holds a NaN in xs */
    {"(2) dense, ignored row with NaN xs",
     0, PZ_RB, 0, PZ_XS_NAN, PZ_LAB_IGN, 0, 0, 0.5, 0.5, 1.0, 1, 1, PZ_SINGLE | PZ_VP},
    {"(2) top-k bucket w_hard 0.5, ignored row with NaN xs",
     1, PZ_BU, 0, PZ_XS_NAN, PZ_LAB_IGN, 0, 0, 0.5, 1.0, 1.0, 1, 0, PZ_SINGLE | PZ_VP},
    {"(2) top-k bucket w_hard 0, a row without a used slot with NaN xs",
     1, PZ_BU, 0, PZ_XS_NAN, 0, 1, 0, 0.0, 1.0, 1.0, 0, 0, PZ_SINGLE | PZ_VP},
    {"(2) top-k renorm_both w_hard 0, row_lse asked, a row without a used slot with NaN xs",
     1, PZ_RB, 0, PZ_XS_NAN, 0, 1, 0, 0.0, 1.0, 1.0, 0, 1, PZ_SINGLE},
    /* (3) both gradient factors 0: zeros, whatever the weights and hidden states hold */
    {"(3) dense, grad_scale 0, NaN ws and xs",
     0, PZ_RB, PZ_WS_NAN, PZ_XS_NAN, PZ_LAB_IGN, 0, 0, 0.5, 0.5, 0.0, 1, 0, PZ_SINGLE | PZ_VP},
    {"(3) top-k bucket, grad_scale 0, NaN ws and xs",
     1, PZ_BU, PZ_WS_NAN, PZ_XS_NAN, 0, 0, 0, 0.0, 1.0, 0.0, 1, 0, PZ_SINGLE | PZ_VP},
    {"(3) top-k renorm_both sparse path, grad_scale 0, NaN ws in S and xs",
     1, PZ_RB, PZ_WS_NAN_S, PZ_XS_NAN, 0, 0, 0, 0.0, 1.0, 0.0, 0, 0, PZ_SINGLE},
    {"(3) top-k renorm_both full path, grad_scale 0, NaN ws in S and xs",
     1, PZ_RB, PZ_WS_NAN_S, PZ_XS_NAN, 0, 0, 0, 0.0, 1.0, 0.0, 0, 1, PZ_SINGLE | PZ_VP},
    {"(3) dense, both weights 0, NaN ws and xs",
     0, PZ_RB, PZ_WS_NAN, PZ_XS_NAN2, PZ_LAB_IGN, 0, 0, 0.0, 0.0, 1.0, 1, 0, PZ_SINGLE | PZ_VP},
    {"(3) top-k bucket, both weights 0, NaN ws and xs",
     1, PZ_BU, PZ_WS_NAN, PZ_XS_NAN2, 0, 0, 0, 0.0, 0.0, 1.0, 1, 0, PZ_SINGLE | PZ_VP},
    {"(3) top-k renorm_both sparse path, both weights 0, NaN ws in S and xs",
     1, PZ_RB, PZ_WS_NAN_S, PZ_XS_NAN2, 0, 0, 0, 0.0, 0.0, 1.0, 0, 0, PZ_SINGLE},
    {"(3) top-k renorm_both full path, both weights 0, NaN ws in S and xs",
     1, PZ_RB, PZ_WS_NAN_S, PZ_XS_NAN2, 0, 0, 0, 0.0, 0.0, 1.0, 0, 1, PZ_SINGLE | PZ_VP},
    /* the NaN policy on renorm_both's sparse path: a NaN used log-prob in row 1 makes its
     * gradient NaN outside S too, so dws and dbs are NaN everywhere (the CPU's run_sparse fills
     * them; the CUDA sparse path had NaN in row 1's ids' rows only); the full path and the
     * vocabulary-parallel call as cross-checks */
    {"top-k renorm_both sparse path, NaN log-prob in row 1",
     1, PZ_RB, 0, 0, 0, 0, 1, 0.0, 1.0, 1.0, 0, 0, PZ_SINGLE | PZ_VP},
    {"top-k renorm_both full path, NaN log-prob in row 1",
     1, PZ_RB, 0, 0, 0, 0, 1, 0.0, 1.0, 1.0, 0, 1, PZ_SINGLE},
};

enum { PZ_V = 300, PZ_HS = 4, PZ_HT = 3, PZ_K = 4 };

/* The fixed operands and their NaN variants. */
typedef struct par_ops {
    float xs[NB * PZ_HS], ws[PZ_V * PZ_HS], bs[PZ_V], xt[NB * PZ_HT], wt[PZ_V * PZ_HT], btb[PZ_V];
    float lp[NB * PZ_K], lp_nan[NB * PZ_K], ws_nan[PZ_V * PZ_HS], ws_nan_s[PZ_V * PZ_HS];
    float xs_nan[NB * PZ_HS], xs_nan2[NB * PZ_HS];
} par_ops;

static void par_ops_make(par_ops *o) {
    enum { V = PZ_V, HS = PZ_HS, HT = PZ_HT, K = PZ_K };
    for (int64_t i = 0; i < NB * HS; i++) o->xs[i] = (float)(0.5 * sin(1.3 * (double)i + 0.2));
    for (int64_t i = 0; i < V * HS; i++) o->ws[i] = (float)sin(0.7 * (double)i + 1.1);
    for (int64_t i = 0; i < NB * HT; i++) o->xt[i] = (float)(0.5 * cos(0.9 * (double)i + 0.4));
    for (int64_t i = 0; i < V * HT; i++) o->wt[i] = (float)cos(0.3 * (double)i + 0.5);
    for (int64_t i = 0; i < V; i++)
        o->bs[i] = (float)(0.1 * cos((double)i)), o->btb[i] = (float)(0.1 * sin((double)i));
    for (int64_t i = 0; i < NB * K; i++) o->lp[i] = -1.0f - 0.5f * (float)(i % K);
    memcpy(o->lp_nan, o->lp, sizeof o->lp);
    memcpy(o->ws_nan, o->ws, sizeof o->ws);
    memcpy(o->ws_nan_s, o->ws, sizeof o->ws);
    memcpy(o->xs_nan, o->xs, sizeof o->xs);
    o->lp_nan[1 * K + 2] = NAN;
    o->ws_nan[210 * HS + 1] = NAN;  /* a weight row outside every S */
    o->ws_nan_s[40 * HS + 2] = NAN; /* a weight row in row 0's S */
    o->xs_nan[1 * HS + 3] = NAN;    /* row 1's hidden state */
    memcpy(o->xs_nan2, o->xs_nan, sizeof o->xs);
    o->xs_nan2[0 * HS + 1] = NAN;   /* a kept row too */
}

void nan_zero_grad(void) {
    if (!kdloss_fused_linear_distill || !kdloss_fused_linear_topk_distill) {
        printf("nan zero gradients: skipped (this build has no CPU functions)\n");
        return;
    }
    static par_ops o;
    par_ops_make(&o);
    /* every row's S has ids on both ranks of vp_block (rank 0: columns [0, 100)); no S holds 210 */
    static const int32_t ids[NB * PZ_K] = {5, 40, 150, 280, 7, 120, 199, 260, 3, 90, 230, 299};
    static const int32_t ids_empty[NB * PZ_K] = {5, 40, 150, 280, -1, -1, -1, -1, 3, 90, 230, 299};
    static const int64_t lab[NB] = {3, 7, 11}, lab_ign[NB] = {3, -100, 11};
    const float *wss[3] = {o.ws, o.ws_nan, o.ws_nan_s}, *xss[3] = {o.xs, o.xs_nan, o.xs_nan2};
    const int64_t *labs[3] = {lab, NULL, lab_ign};
    for (size_t i = 0; i < sizeof PAR_MODS / sizeof PAR_MODS[0]; i++) {
        const par_mod *m = &PAR_MODS[i];
        const par_case c = {m->tag, m->topk, m->tail, PZ_HS, PZ_HT, PZ_V, PZ_K, xss[m->xs],
                            wss[m->ws], o.bs, o.xt, o.wt, o.btb, m->ids_empty ? ids_empty : ids,
                            m->lp_nan ? o.lp_nan : o.lp, labs[m->lab], m->w_hard, m->w_soft,
                            m->grad_scale, 1.5, m->want_hard, m->want_lse};
        if (m->runs & PZ_SINGLE) par_run(&c, 0);
        if (m->runs & PZ_VP) par_run(&c, 1);
    }
}
