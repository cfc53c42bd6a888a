/* The heads' logit maps (kdloss_logit_map: Cohere's logit_scale, Gemma 2's softcap) on the CUDA
 * fused losses: kdloss_cuda_fused_linear_distill (every divergence; maps on the student, the
 * teacher or both; with the cross-entropy, T, biases, fp32 and bf16, several chunks) and
 * kdloss_cuda_fused_linear_topk_distill (bucket and renorm_both tails: renorm_both under a map
 * takes the full-vocabulary path) against the CPU functions with the same maps, which
 * tests/test_logit_map.c holds to a float64 reference. Tolerances: the losses 2e-5 + 1e-4 |want|
 * (1e-3 with bf16 operands: the two backends' GEMMs sum in other orders), as the fused tests';
 * the gradients normwise 1e-4 (fp32) / 1.5e-2 (bf16, one cast each way), the fused tests' bounds:
 * the map adds the tanh's few ULP (CUDA's tanhf, the CPU's vf_tanh) to logits that both sides
 * form in fp32. The identity maps {0, 0} and {1, 0} give the bits of a call without maps. */
#include "cuda_test.h"

typedef struct lm_case {
    kdloss_dtype dt;
    kdloss_logit_map s, t;
    int64_t chunk;
} lm_case;

static const lm_case LM_CASES[] = {
    {KDLOSS_F32, {1.0, 4.0}, {1.0, 0.0}, 0},
    {KDLOSS_F32, {1.6, 0.0}, {0.7, 3.0}, 5},
    {KDLOSS_F32, {2.0, 30.0}, {1.0, 2.5}, 0},
    {KDLOSS_BF16, {1.3, 5.0}, {1.0, 6.0}, 3},
};
#define LM_N (int)(sizeof LM_CASES / sizeof LM_CASES[0])

enum { LM_BT = 11, LM_HS = 24, LM_HT = 40, LM_V = 203, LM_K = 6 };

typedef struct lm_ops {
    double *xs, *ws, *xt, *wt, *bs, *btb;
    ct_mat mxs, mws, mxt, mwt, mbs, mbt;
    ct_labels L;
    kdloss_dtype dt;
} lm_ops;

static void lm_ops_make(kt_rng *rng, kdloss_dtype dt, lm_ops *o) {
    const int64_t n[6] = {LM_BT * LM_HS, LM_V * LM_HS, LM_BT * LM_HT, LM_V * LM_HT, LM_V, LM_V};
    const double sd[6] = {1.0, 6.0 / sqrt(LM_HS), 1.0, 6.0 / sqrt(LM_HT), 0.5, 0.5};
    double **p[6] = {&o->xs, &o->ws, &o->xt, &o->wt, &o->bs, &o->btb};
    for (int i = 0; i < 6; i++) { /* logits of spread ~6: the caps saturate */
        *p[i] = xmalloc((size_t)n[i] * 8);
        fill_normal(rng, *p[i], n[i], sd[i]);
        kt_round_to(*p[i], n[i], dt);
    }
    o->dt = dt;
    o->mxs = ct_in(o->xs, LM_BT, LM_HS, LM_HS, dt, 0);
    o->mws = ct_in(o->ws, LM_V, LM_HS, LM_HS, dt, 0);
    o->mxt = ct_in(o->xt, LM_BT, LM_HT, LM_HT, dt, 0);
    o->mwt = ct_in(o->wt, LM_V, LM_HT, LM_HT, dt, 0);
    o->mbs = ct_in(o->bs, 1, LM_V, LM_V, dt, 0);
    o->mbt = ct_in(o->btb, 1, LM_V, LM_V, dt, 0);
    o->L = ct_labels_make(rng, KT_LAB_SOME, KDLOSS_I64, 0, LM_BT, LM_V);
}

static void lm_ops_free(lm_ops *o) {
    ct_mat *m[6] = {&o->mxs, &o->mws, &o->mxt, &o->mwt, &o->mbs, &o->mbt};
    for (int i = 0; i < 6; i++) ct_free(m[i]);
    free(o->xs), free(o->ws), free(o->xt), free(o->wt), free(o->bs), free(o->btb);
    ct_labels_free(&o->L);
}

/* What one call produced, on the host: the loss and dxs, dws (as doubles). */
typedef struct lm_res {
    kdloss_status st;
    float loss;
    double *dxs, *dws;
} lm_res;

static void lm_res_free(lm_res *r) { free(r->dxs), free(r->dws); }

/* A dense or top-k fused call on the GPU (dev) or the CPU; teacher NULL: dense. */
static lm_res lm_call(const lm_ops *o, const kdloss_fused_linear_distill_params *pd,
                      const kdloss_fused_linear_topk_distill_params *pk,
                      const kdloss_topk_teacher *dteach, const kdloss_topk_teacher *hteach,
                      int dev) {
    const size_t es = kdloss_dtype_size(o->dt);
    const size_t nx = (size_t)LM_BT * LM_HS * es, nw = (size_t)LM_V * LM_HS * es;
    lm_res r = {KDLOSS_OK, 0.0f, NULL, NULL};
    void *dxs = dev ? dalloc(nx) : xmalloc(nx), *dws = dev ? dalloc(nw) : xmalloc(nw);
    float *loss = dev ? dalloc(4) : xmalloc(4);
    kdloss_fused_linear_distill_out out;
    memset(&out, 0, sizeof out);
    out.loss = loss;
    out.dxs = (kdloss_mat){dxs, o->dt, LM_HS};
    out.dws = (kdloss_mat){dws, o->dt, LM_HS};
    kdloss_cmat xs = {dev ? o->mxs.d : o->mxs.h, o->dt, LM_HS};
    kdloss_cmat ws = {dev ? o->mws.d : o->mws.h, o->dt, LM_HS};
    kdloss_cmat xt = {dev ? o->mxt.d : o->mxt.h, o->dt, LM_HT};
    kdloss_cmat wt = {dev ? o->mwt.d : o->mwt.h, o->dt, LM_HT};
    const void *bs = dev ? o->mbs.d : o->mbs.h, *bt = dev ? o->mbt.d : o->mbt.h;
    kdloss_labels lab = dev ? o->L.dev : o->L.host;
    size_t wsb = 0;
    void *wk = NULL;
    if (dev && pk) {
        kdloss_cuda_fused_linear_topk_distill_workspace_size(pk, LM_BT, LM_HS, LM_V, LM_K, o->dt, 1,
                                                             &wsb);
        wk = dalloc(wsb);
        r.st = kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, pk, LM_BT, LM_HS, LM_V, xs, ws,
                                                     bs, *dteach, lab, &out, wk, wsb);
    } else if (dev) {
        kdloss_cuda_fused_linear_distill_workspace_size(pd, LM_BT, LM_HS, LM_HT, LM_V, o->dt, 1,
                                                        &wsb);
        wk = dalloc(wsb);
        r.st = kdloss_cuda_fused_linear_distill(g_ctx, g_st, pd, LM_BT, LM_HS, LM_HT, LM_V, xs, ws,
                                                bs, xt, wt, bt, lab, &out, wk, wsb);
    } else if (pk) {
        r.st = kdloss_fused_linear_topk_distill(pk, LM_BT, LM_HS, LM_V, xs, ws, bs, *hteach, lab,
                                                &out, NULL, 0);
    } else {
        r.st = kdloss_fused_linear_distill(pd, LM_BT, LM_HS, LM_HT, LM_V, xs, ws, bs, xt, wt, bt,
                                           lab, &out, NULL, 0);
    }
    if (dev) CK(cudaStreamSynchronize(g_st));
    void *hx = dev ? dfetch(dxs, nx) : dxs, *hw = dev ? dfetch(dws, nw) : dws;
    if (dev) d2h(&r.loss, loss, 4);
    else r.loss = *loss;
    r.dxs = to_double(hx, o->dt, LM_BT, LM_HS, LM_HS);
    r.dws = to_double(hw, o->dt, LM_V, LM_HS, LM_HS);
    free(hx), free(hw);
    if (dev) {
        CK(cudaFree(dxs));
        CK(cudaFree(dws));
        CK(cudaFree(loss));
        CK(cudaFree(wk));
    } else {
        free(loss);
    }
    return r;
}

static void lm_compare(const char *tag, kdloss_dtype dt, const lm_res *g, const lm_res *w) {
    if (!KT_CHECK(g->st == KDLOSS_OK && w->st == KDLOSS_OK, "%s: status %d (CPU %d)", tag, g->st,
                  w->st))
        return;
    const double bf = dt == KDLOSS_BF16;
    KT_CHECK(close1(g->loss, w->loss, 2e-5, bf ? 1e-3 : 1e-4), "%s loss %.9g, CPU %.9g", tag,
             (double)g->loss, (double)w->loss);
    char what[160];
    snprintf(what, sizeof what, "%s dxs", tag);
    cmp_norm(what, g->dxs, w->dxs, LM_BT * LM_HS, bf ? 1.5e-2 : 1e-4);
    snprintf(what, sizeof what, "%s dws", tag);
    cmp_norm(what, g->dws, w->dws, LM_V * LM_HS, bf ? 1.5e-2 : 1e-4);
}

static void lm_dense(const lm_ops *o, const lm_case *c, int ci) {
    for (int d = 0; d < KDLOSS_DIV_COUNT; d++) {
        kdloss_fused_linear_distill_params p;
        kdloss_fused_linear_distill_params_default(&p);
        p.div.divergence = (kdloss_divergence)d;
        p.temperature = 1.7, p.weight_hard_loss = 0.3, p.weight_soft_loss = 0.7;
        p.grad_scale = 0.8, p.chunk_size = c->chunk;
        p.student_map = c->s, p.teacher_map = c->t;
        char tag[96];
        snprintf(tag, sizeof tag, "logit_map dense case %d %s", ci,
                 kdloss_divergence_name((kdloss_divergence)d));
        lm_res g = lm_call(o, &p, NULL, NULL, NULL, 1), w = lm_call(o, &p, NULL, NULL, NULL, 0);
        lm_compare(tag, o->dt, &g, &w);
        lm_res_free(&g), lm_res_free(&w);
    }
}

static void lm_topk(const lm_ops *o, const lm_case *c, int ci, kt_rng *rng) {
    int64_t ids[LM_BT * LM_K];
    float lps[LM_BT * LM_K];
    for (int64_t r = 0; r < LM_BT; r++) /* distinct ids, log-probs of a top-k teacher */
        for (int64_t j = 0; j < LM_K; j++) {
            ids[r * LM_K + j] = (r * 17 + j * 31 + kt_randint(rng, 5)) % LM_V;
            lps[r * LM_K + j] = (float)(-0.5 - 0.8 * (double)j);
        }
    void *dids = dupload(ids, sizeof ids), *dlps = dupload(lps, sizeof lps);
    kdloss_topk_teacher ht = {LM_K, {ids, KDLOSS_I64, LM_K}, {lps, KDLOSS_F32, LM_K}};
    kdloss_topk_teacher dtc = {LM_K, {dids, KDLOSS_I64, LM_K}, {dlps, KDLOSS_F32, LM_K}};
    const kdloss_topk_tail tails[2] = {KDLOSS_TAIL_BUCKET, KDLOSS_TAIL_RENORM_BOTH};
    for (int ti = 0; ti < 2; ti++) {
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        p.div.divergence = KDLOSS_DIV_JSD;
        p.tail = tails[ti];
        p.temperature = 1.4, p.grad_scale = 0.9, p.chunk_size = c->chunk;
        p.weight_hard_loss = ti ? 0.0 : 0.25; /* renorm_both without CE: the sparse-path case */
        p.student_map = c->s;
        char tag[96];
        snprintf(tag, sizeof tag, "logit_map topk case %d tail %d", ci, ti);
        lm_res g = lm_call(o, NULL, &p, &dtc, &ht, 1), w = lm_call(o, NULL, &p, &dtc, &ht, 0);
        lm_compare(tag, o->dt, &g, &w);
        lm_res_free(&g), lm_res_free(&w);
    }
    CK(cudaFree(dids));
    CK(cudaFree(dlps));
}

/* {0, 0} and {1, 0} on both heads: the bits of the default call. */
static void lm_identity(const lm_ops *o) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.weight_hard_loss = 0.4;
    lm_res base = lm_call(o, &p, NULL, NULL, NULL, 1);
    const kdloss_logit_map ids[2] = {{0.0, 0.0}, {1.0, 0.0}};
    for (int i = 0; i < 2; i++) {
        p.student_map = p.teacher_map = ids[i];
        lm_res g = lm_call(o, &p, NULL, NULL, NULL, 1);
        KT_CHECK(g.loss == base.loss &&
                     !memcmp(g.dxs, base.dxs, (size_t)LM_BT * LM_HS * 8) &&
                     !memcmp(g.dws, base.dws, (size_t)LM_V * LM_HS * 8),
                 "logit_map identity %d: not the bits of the default call", i);
        lm_res_free(&g);
    }
    lm_res_free(&base);
}

void test_logit_maps(kt_rng *rng) {
    if (!kdloss_fused_linear_distill || !kdloss_fused_linear_topk_distill) {
        printf("logit maps: no CPU functions in this build, skipped\n");
        return;
    }
    for (int ci = 0; ci < LM_N; ci++) {
        lm_ops o;
        lm_ops_make(rng, LM_CASES[ci].dt, &o);
        lm_dense(&o, &LM_CASES[ci], ci);
        lm_topk(&o, &LM_CASES[ci], ci, rng);
        if (ci == 0) lm_identity(&o);
        lm_ops_free(&o);
    }
}
