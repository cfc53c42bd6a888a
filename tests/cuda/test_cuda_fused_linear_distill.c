/* The fused-linear losses with a dense teacher: kdloss_cuda_fused_linear_jsd (tag "fld_jsd") and
 * kdloss_cuda_fused_linear_distill (tag "fldistill", every divergence case with t2_scale and the
 * per-row outputs) against a float64 reference written here (logits in double, the divergence's
 * elements, dz, then dxs / dws / dbs) and against the CPU functions: losses rtol 1e-4 (1e-3 with
 * bf16 operands), gradients normwise 1e-4 fp32 / 1.5e-2 bf16; chunking, biases, a tile
 * boundary, the smallest budget, a bad label, forward only, run-to-run bits. Per-row weights and
 * the entropy on kdloss_cuda_fused_linear_distill (docs/MATH.md 12.1; the reference: a kept
 * row's dz and loss terms times its weight, n_valid the kept rows, H = -sum Q log Q of
 * log_softmax(zs / T) in double): per divergence weights with zeros and non-integers among
 * ignored labels, the entropy, chunking, biases, a tile boundary; the entropy alone; bad weights
 * (with and without a bad label); weights of 1 the bits of NULL and weights in {0, 1} the bits of
 * those rows masked through ignore_index, with and without the entropy. */
#include <float.h>

#include "cuda_test.h"

typedef struct fl_case {
    int64_t bt, hs, ht, v;
    kdloss_dtype ds, dt;
    double beta, temperature, w_hard, w_soft;
    int bias;      /* both biases given (and dbs wanted) */
    int64_t chunk; /* params.chunk_size */
    size_t budget; /* params.memory_budget; 1: the smallest (one-row chunks) */
    int64_t pad;   /* extra columns on every ld */
    int bad_label; /* one label = v */
    int forward_only;
    /* 0: kdloss_cuda_fused_linear_jsd (divergence JSD(beta)); 1: kdloss_cuda_fused_linear_distill
     * with divergence div (beta, alpha), t2_scale t2, and the per-row outputs */
    int distill;
    kdloss_divergence div;
    double alpha;
    int t2;
    int wmode; /* distill: row weights 0 none, 1 zeros and non-integers, 2 that and bad ones,
                  3 all 1 (bitwise against NULL), 4 in {0, 1} (bitwise against masked labels) */
    int ent;   /* distill: the entropy (2: alone, no other output) */
} fl_case;

/* One call: the operands in double (rounded to their dtypes), packed on the host and the
 * device, the outputs, the parameters of both entry points. */
typedef struct fl_run {
    const fl_case *k;
    double *xs, *ws, *xt, *wt, *bs, *btb;
    ct_labels L;
    ct_mat mxs, mws, mxt, mwt, mbs, mbt;
    void *gdxs, *gdws, *gdbs;
    float *gl, *grows; /* loss, soft, hard; row_soft, row_hard, row_lse */
    kdloss_fljsd_params p;
    kdloss_fused_linear_distill_params pd;
    kdloss_fljsd_out out;
    kdloss_fused_linear_distill_out outd;
    void *wk;
    size_t wsb;
    float *hw, *dw; /* row weights, host and device (NULL: none) */
} fl_run;

/* Row r's weight under wmode (fl_case). */
static float fl_weight(kt_rng *rng, int mode, int64_t r, int64_t bt) {
    if (mode == 3) return 1.0f;
    if (mode == 4) return r % 3 == 0 ? 0.0f : 1.0f;
    if (mode == 2 && r == 2) return NAN;
    if (mode == 2 && r == bt - 1) return -2.0f;
    return r % 5 == 3 ? 0.0f : (float)(0.25 + 2.5 * kt_uniform(rng));
}

/* 0 kept, 1 ignored (label or weight 0), 2 bad (label out of range, weight not finite >= 0). */
static int fl_kind(const fl_run *r, int64_t row) {
    const int64_t y = r->L.lab[row];
    const float w = r->hw ? r->hw[row] : 1.0f;
    if ((y != -100 && (y < 0 || y >= r->k->v)) || !(w >= 0.0f && w <= FLT_MAX)) return 2;
    return y == -100 || w == 0.0f;
}

/* The reference: losses, row outputs (4 x bt: soft, hard, lse, entropy), dz (bt x v) and the
 * error scales. */
typedef struct fl_ref {
    double loss, soft, hard, abs_soft, abs_row, nv;
    double *rrow, *dz;
} fl_ref;

void ct_ref_grads(int64_t bt, int64_t hs, int64_t v, const double *dz, const double *xs,
                  const double *ws, double *rdx, double *rdw, double *rdb) {
    memset(rdx, 0, (size_t)(bt * hs) * 8);
    memset(rdw, 0, (size_t)(v * hs) * 8);
    memset(rdb, 0, (size_t)v * 8);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t i = 0; i < v; i++) {
            const double g = dz[r * v + i];
            if (g == 0) continue;
            for (int64_t j = 0; j < hs; j++) {
                rdx[r * hs + j] += g * ws[i * hs + j];
                rdw[i * hs + j] += g * xs[r * hs + j];
            }
            rdb[i] += g;
        }
}

void *ct_cmp_grad(const char *tag, const char *name, const void *d, kdloss_dtype dt, int64_t rows,
                  int64_t cols, int64_t ld, const double *ref, double tol) {
    void *h = dfetch(d, (size_t)(rows * ld) * kdloss_dtype_size(dt));
    if (ld > cols)
        KT_CHECK(pad_untouched(h, dt, rows, cols, ld), "%s: %s padding written", tag, name);
    double *got = to_double(h, dt, rows, cols, ld);
    char what[300];
    snprintf(what, sizeof what, "%s %s", tag, name);
    cmp_norm(what, got, ref, rows * cols, tol);
    free(got);
    return h;
}

void ct_same_bits(const char *tag, const char *name, const void *d, const void *h, size_t n) {
    void *b = dfetch(d, n);
    char what[300];
    snprintf(what, sizeof what, "%s %s", tag, name);
    cmp_bits(what, h, b, n);
    free(b);
}

static void fl_inputs(kt_rng *rng, fl_run *r) {
    const fl_case *k = r->k;
    const int64_t bt = k->bt, hs = k->hs, ht = k->ht, v = k->v;
    r->xs = xmalloc((size_t)(bt * hs) * 8), r->ws = xmalloc((size_t)(v * hs) * 8);
    r->xt = xmalloc((size_t)(bt * ht) * 8), r->wt = xmalloc((size_t)(v * ht) * 8);
    r->bs = xmalloc((size_t)v * 8), r->btb = xmalloc((size_t)v * 8);
    fill_normal(rng, r->xs, bt * hs, 1.0);
    fill_normal(rng, r->ws, v * hs, 3.0 / sqrt((double)hs)); /* logits of spread ~3 */
    fill_normal(rng, r->xt, bt * ht, 1.0);
    fill_normal(rng, r->wt, v * ht, 3.0 / sqrt((double)ht));
    fill_normal(rng, r->bs, v, 0.5);
    fill_normal(rng, r->btb, v, 0.5);
    kt_round_to(r->xs, bt * hs, k->ds);
    kt_round_to(r->ws, v * hs, k->ds);
    kt_round_to(r->bs, v, k->ds);
    kt_round_to(r->xt, bt * ht, k->dt);
    kt_round_to(r->wt, v * ht, k->dt);
    kt_round_to(r->btb, v, k->dt);
    r->L = ct_labels_make(rng, KT_LAB_SOME, bt % 2 ? KDLOSS_I32 : KDLOSS_I64, k->bad_label, bt, v);
    if (k->wmode) {
        r->hw = xmalloc((size_t)bt * 4);
        for (int64_t i = 0; i < bt; i++) r->hw[i] = fl_weight(rng, k->wmode, i, bt);
        r->dw = dupload(r->hw, (size_t)bt * 4);
    }
    const int64_t lds = hs + k->pad, ldt = ht + k->pad;
    r->mxs = ct_in(r->xs, bt, hs, lds, k->ds, 0), r->mws = ct_in(r->ws, v, hs, lds, k->ds, 0);
    r->mxt = ct_in(r->xt, bt, ht, ldt, k->dt, 0), r->mwt = ct_in(r->wt, v, ht, ldt, k->dt, 0);
    r->mbs = ct_in(r->bs, 1, v, v, k->ds, 0), r->mbt = ct_in(r->btb, 1, v, v, k->dt, 0);
}

/* Both entry points' parameters; budget 1 asks for the smallest one (one-row chunks). */
static void fl_params(fl_run *r) {
    const fl_case *k = r->k;
    kdloss_fljsd_params *p = &r->p;
    kdloss_fused_linear_distill_params *pd = &r->pd;
    p->beta = k->beta, p->temperature = k->temperature;
    p->weight_hard_loss = k->w_hard, p->weight_soft_loss = k->w_soft;
    p->ignore_index = -100, p->chunk_size = k->chunk, p->memory_budget = k->budget;
    p->grad_scale = 0.5;
    if (k->budget == 1)
        kdloss_fljsd_min_budget(p, k->bt, k->hs, k->ht, k->v, k->ds, 1, &p->memory_budget);
    kdloss_fused_linear_distill_params_default(pd);
    pd->div.divergence = k->distill ? k->div : KDLOSS_DIV_JSD;
    pd->div.beta = k->beta, pd->div.alpha = k->distill ? k->alpha : 0.1;
    pd->temperature = k->temperature, pd->t2_scale = k->t2;
    pd->weight_hard_loss = k->w_hard, pd->weight_soft_loss = k->w_soft;
    pd->ignore_index = -100, pd->chunk_size = k->chunk, pd->memory_budget = p->memory_budget;
    pd->grad_scale = 0.5;
    pd->row_weights = r->dw;
    if (k->budget == 1)
        kdloss_fused_linear_distill_min_budget(pd, k->bt, k->hs, k->ht, k->v, k->ds, 1,
                                               &pd->memory_budget);
}

/* Poisoned outputs, both entry points' views of them, the workspace. */
static void fl_outputs(const char *tag, fl_run *r) {
    const fl_case *k = r->k;
    const int64_t bt = k->bt, ldxs = k->hs + k->pad;
    const size_t es = kdloss_dtype_size(k->ds);
    r->gdxs = dalloc((size_t)(bt * ldxs) * es), r->gdws = dalloc((size_t)(k->v * ldxs) * es);
    r->gdbs = dalloc((size_t)k->v * es), r->gl = dalloc(12), r->grows = dalloc((size_t)bt * 16);
    dpoison(r->gdxs, (size_t)(bt * ldxs) * es), dpoison(r->gdws, (size_t)(k->v * ldxs) * es);
    dpoison(r->gdbs, (size_t)k->v * es), dpoison(r->gl, 12), dpoison(r->grows, (size_t)bt * 16);
    memset(&r->out, 0, sizeof r->out);
    r->out.loss = r->gl, r->out.soft_loss = r->gl + 1, r->out.hard_loss = r->gl + 2;
    if (!k->forward_only) {
        r->out.dxs = (kdloss_mat){r->gdxs, k->ds, ldxs};
        r->out.dws = (kdloss_mat){r->gdws, k->ds, ldxs};
        r->out.dbs = k->bias ? r->gdbs : NULL;
    }
    memset(&r->outd, 0, sizeof r->outd);
    r->outd.loss = r->out.loss, r->outd.soft_loss = r->out.soft_loss;
    r->outd.hard_loss = r->out.hard_loss;
    r->outd.dxs = r->out.dxs, r->outd.dws = r->out.dws, r->outd.dbs = r->out.dbs;
    r->outd.row_soft = r->grows, r->outd.row_hard = r->grows + bt,
    r->outd.row_lse = r->grows + 2 * bt;
    r->outd.row_entropy = k->ent ? r->grows + 3 * bt : NULL;
    if (k->ent == 2) { /* the entropy alone */
        kdloss_fused_linear_distill_out alone;
        memset(&alone, 0, sizeof alone);
        alone.row_entropy = r->outd.row_entropy;
        r->outd = alone;
    }
    kdloss_status s = k->distill
                          ? kdloss_cuda_fused_linear_distill_workspace_size(
                                &r->pd, bt, k->hs, k->ht, k->v, k->ds, !k->forward_only, &r->wsb)
                          : kdloss_cuda_fljsd_workspace_size(&r->p, bt, k->hs, k->ht, k->v, k->ds,
                                                             !k->forward_only, &r->wsb);
    KT_CHECK(s == KDLOSS_OK, "%s: ws size %d", tag, (int)s);
    r->wk = dalloc(r->wsb);
}

static kdloss_status fl_call(void *arg) {
    fl_run *r = arg;
    const fl_case *k = r->k;
    const kdloss_cmat xs = {r->mxs.d, k->ds, k->hs + k->pad},
                      ws = {r->mws.d, k->ds, k->hs + k->pad};
    const kdloss_cmat xt = {r->mxt.d, k->dt, k->ht + k->pad},
                      wt = {r->mwt.d, k->dt, k->ht + k->pad};
    const void *bs = k->bias ? r->mbs.d : NULL, *bt = k->bias ? r->mbt.d : NULL;
    if (k->distill)
        return kdloss_cuda_fused_linear_distill(g_ctx, g_st, &r->pd, k->bt, k->hs, k->ht, k->v, xs,
                                                ws, bs, xt, wt, bt, r->L.dev, &r->outd, r->wk,
                                                r->wsb);
    return kdloss_cuda_fused_linear_jsd(g_ctx, g_st, &r->p, k->bt, k->hs, k->ht, k->v, xs, ws, bs,
                                        xt, wt, bt, r->L.dev, &r->out, r->wk, r->wsb);
}

/* Row r's logits zs, zt (bias included) in double. */
static void fl_logits(const fl_run *r, int64_t row, double *zs, double *zt) {
    const fl_case *k = r->k;
    for (int64_t c = 0; c < k->v; c++) {
        double a1 = k->bias ? r->bs[c] : 0, a2 = k->bias ? r->btb[c] : 0;
        for (int64_t j = 0; j < k->hs; j++) a1 += r->xs[row * k->hs + j] * r->ws[c * k->hs + j];
        for (int64_t j = 0; j < k->ht; j++) a2 += r->xt[row * k->ht + j] * r->wt[c * k->ht + j];
        zs[c] = a1, zt[c] = a2;
    }
}

/* One counted row: its soft loss (returned), hard loss and lse into ref->rrow, dz's row. */
static double fl_ref_row(const fl_run *r, fl_ref *f, int64_t row, double *zs, double *zt,
                         double *g) {
    const fl_case *k = r->k;
    const int64_t v = k->v, y = r->L.lab[row];
    const double T = k->temperature, t2f = k->distill && k->t2 ? T * T : 1.0;
    const double w = r->hw ? (double)r->hw[row] : 1.0;
    const double ca = w * k->w_hard * 0.5 / f->nv, cb = w * k->w_soft * 0.5 * t2f / (f->nv * T);
    fl_logits(r, row, zs, zt);
    const double lh = logsumexp(zs, v, 1.0), la = logsumexp(zs, v, 1.0 / T);
    const double lb = logsumexp(zt, v, 1.0 / T);
    double S = 0, js = 0, h = 0;
    for (int64_t c = 0; c < v; c++) h -= exp(zs[c] / T - la) * (zs[c] / T - la);
    f->rrow[3 * k->bt + row] = h;
    for (int64_t c = 0; c < v; c++) {
        double mag = 0, l;
        if (k->distill) l = ref_div_elem(&r->pd.div, zs[c] / T - la, zt[c] / T - lb, &g[c], &mag);
        else l = cu_ref_jsd_elem(k->beta, zs[c] / T - la, zt[c] / T - lb, &g[c]);
        js += l;
        f->abs_soft += fabs(l) > mag ? fabs(l) : mag;
        S += g[c];
    }
    f->rrow[k->bt + row] = lh - zs[y], f->rrow[2 * k->bt + row] = lh;
    for (int64_t c = 0; c < v; c++)
        f->dz[row * v + c] = ca * (exp(zs[c] - lh) - (c == y ? 1.0 : 0.0)) +
                             cb * (g[c] - exp(zs[c] / T - la) * S);
    return js;
}

static void fl_reference(const fl_run *r, fl_ref *f) {
    const fl_case *k = r->k;
    const double T = k->temperature, t2f = k->distill && k->t2 ? T * T : 1.0;
    int64_t nk = 0, bad = 0;
    for (int64_t row = 0; row < k->bt; row++) nk += fl_kind(r, row) == 0;
    f->nv = nk > 0 ? (double)nk : 1.0;
    f->rrow = calloc((size_t)k->bt * 4, 8), f->dz = calloc((size_t)(k->bt * k->v), 8);
    f->abs_soft = 0;
    double *zs = xmalloc((size_t)k->v * 8), *zt = xmalloc((size_t)k->v * 8);
    double *g = xmalloc((size_t)k->v * 8), soft = 0, hard = 0;
    for (int64_t row = 0; row < k->bt; row++) {
        const int kind = fl_kind(r, row);
        bad |= kind == 2;
        for (int o = 0; kind == 2 && o < 4; o++) f->rrow[o * k->bt + row] = NAN;
        if (kind) continue;
        const double w = r->hw ? (double)r->hw[row] : 1.0, a0 = f->abs_soft;
        f->rrow[row] = fl_ref_row(r, f, row, zs, zt, g);
        f->abs_soft = a0 + w * (f->abs_soft - a0);
        soft += w * f->rrow[row], hard += w * f->rrow[k->bt + row];
    }
    f->abs_row = f->abs_soft;
    f->soft = soft * t2f / f->nv, f->hard = hard / f->nv, f->abs_soft *= t2f;
    f->loss = k->w_hard * f->hard + k->w_soft * f->soft;
    if (bad) f->loss = f->soft = f->hard = NAN;
    free(zs), free(zt), free(g);
}

static double fl_loss_tol(const fl_case *k) { /* fp32 GEMM of bf16 data */
    return k->ds == KDLOSS_BF16 || k->dt == KDLOSS_BF16 ? 1e-3 : 1e-4;
}

/* The losses; the per-row outputs (distill). */
static void fl_check_losses(const char *tag, const fl_run *r, const fl_ref *f, float hl[3]) {
    const fl_case *k = r->k;
    const double lt = fl_loss_tol(k), atol = 1e-5 * f->abs_soft / f->nv + 1e-6;
    d2h(hl, r->gl, 12);
    if (k->ent != 2) {
        kt_close(hl[1], f->soft, atol, lt, "%s soft_loss", tag);
        kt_close(hl[2], f->hard, 1e-6, lt, "%s hard_loss", tag);
        kt_close(hl[0], f->loss, atol, lt, "%s loss", tag);
    }
    if (!k->distill || k->bad_label) return;
    float *hr = dfetch(r->grows, (size_t)k->bt * 16);
    static const char *rn[4] = {"row_soft", "row_hard", "row_lse", "row_entropy"};
    /* the entropy: rtol 1e-5 plus 64 u (1 + log V) absolute, as on logits, and the GEMM's */
    for (int o = k->ent == 2 ? 3 : 0; o < (k->ent ? 4 : 3); o++)
        for (int64_t row = 0; row < k->bt; row++)
            kt_close(hr[o * k->bt + row], f->rrow[o * k->bt + row],
                     o == 3 ? 64 * U32 * (1.0 + log((double)k->v))
                     : o    ? 1e-6
                            : 1e-5 * f->abs_row / (double)k->bt + 1e-6,
                     lt, "%s %s[%lld]", tag, rn[o], (long long)row);
    free(hr);
}

/* The CPU function on the host copies: the loss, dxs and dws against the GPU's (h1, h2). */
static void fl_vs_cpu(const char *tag, const fl_run *r, const fl_ref *f, float hl0,
                      const void *h1, const void *h2, double tol) {
    const fl_case *k = r->k;
    const int64_t ldh = k->hs + k->pad;
    const size_t es = kdloss_dtype_size(k->ds);
    void *c1 = xmalloc((size_t)(k->bt * ldh) * es), *c2 = xmalloc((size_t)(k->v * ldh) * es);
    float cl[3], *cent = xmalloc((size_t)k->bt * 4);
    kdloss_fused_linear_distill_out co;
    memset(&co, 0, sizeof co);
    co.loss = cl, co.soft_loss = cl + 1, co.hard_loss = cl + 2;
    co.row_entropy = k->ent ? cent : NULL;
    kdloss_fused_linear_distill_params pc = r->pd;
    pc.row_weights = r->hw;
    co.dxs = (kdloss_mat){c1, k->ds, ldh}, co.dws = (kdloss_mat){c2, k->ds, ldh};
    kdloss_fljsd_out cj = {co.loss, co.soft_loss, co.hard_loss, co.dxs, co.dws, NULL};
    const kdloss_cmat xs = {r->mxs.h, k->ds, ldh}, ws = {r->mws.h, k->ds, ldh};
    const kdloss_cmat xt = {r->mxt.h, k->dt, k->ht + k->pad},
                      wt = {r->mwt.h, k->dt, k->ht + k->pad};
    const void *bs = k->bias ? r->mbs.h : NULL, *bt = k->bias ? r->mbt.h : NULL;
    kdloss_status s = k->distill
                          ? kdloss_fused_linear_distill(&pc, k->bt, k->hs, k->ht, k->v, xs, ws,
                                                        bs, xt, wt, bt, r->L.host, &co, NULL, 0)
                          : kdloss_fused_linear_jsd(&r->p, k->bt, k->hs, k->ht, k->v, xs, ws, bs,
                                                    xt, wt, bt, r->L.host, &cj, NULL, 0);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
        kt_close(hl0, cl[0], 1e-5 * f->abs_soft / f->nv + 1e-6, fl_loss_tol(k), "%s loss vs CPU",
                 tag);
        const void *gpu[2] = {h1, h2}, *cpu[2] = {c1, c2};
        for (int w = 0; w < 2; w++) {
            const int64_t rows = w ? k->v : k->bt;
            double *a = to_double(gpu[w], k->ds, rows, k->hs, ldh),
                   *b = to_double(cpu[w], k->ds, rows, k->hs, ldh);
            char what[300];
            snprintf(what, sizeof what, "%s %s vs CPU", tag, w ? "dws" : "dxs");
            cmp_norm(what, a, b, rows * k->hs, 2 * tol);
            free(a), free(b);
        }
        float *ge = k->ent ? dfetch(r->grows + 3 * k->bt, (size_t)k->bt * 4) : NULL;
        for (int64_t row = 0; ge && row < k->bt; row++)
            kt_close(ge[row], cent[row], 64 * U32 * (1.0 + log((double)k->v)), fl_loss_tol(k),
                     "%s row_entropy[%lld] vs CPU", tag, (long long)row);
        free(ge);
    }
    free(c1), free(c2), free(cent);
}

/* docs/MATH.md 12.1's exact cases, from a checked call's outputs (h1 dxs, h2 dws, h3 dbs or NULL,
 * hr the row outputs, hl the losses): weights of 1 (wmode 3) give the bits of NULL weights,
 * weights in {0, 1} (wmode 4) the bits of those rows masked through ignore_index. */
static void fl_exact(const char *tag, fl_run *r, const void *h1, const void *h2, const void *h3,
                     const void *hr, const float *hl) {
    const fl_case *k = r->k;
    const int64_t bt = k->bt, ldh = k->hs + k->pad;
    const size_t es = kdloss_dtype_size(k->ds), ls = kdloss_dtype_size(r->L.dev.dtype);
    const kdloss_labels keep = r->L.dev;
    void *masked = NULL;
    if (k->wmode == 4) {
        char *h = xmalloc((size_t)bt * ls);
        for (int64_t i = 0; i < bt; i++) {
            const int64_t y = r->hw[i] == 0.0f ? -100 : r->L.lab[i];
            if (ls == 8) ((int64_t *)h)[i] = y;
            else ((int32_t *)h)[i] = (int32_t)y;
        }
        masked = dupload(h, (size_t)bt * ls);
        free(h);
        r->L.dev.data = masked;
    }
    r->pd.row_weights = NULL;
    KT_CHECK(fl_call(r) == KDLOSS_OK, "%s: the exact case's call", tag);
    CK(cudaStreamSynchronize(g_st));
    r->pd.row_weights = r->dw, r->L.dev = keep;
    const int one = k->wmode == 3;
    ct_same_bits(tag, one ? "dxs (weights 1 = NULL)" : "dxs ({0,1} = masked)", r->gdxs, h1,
                 (size_t)(bt * ldh) * es);
    ct_same_bits(tag, one ? "dws (weights 1 = NULL)" : "dws ({0,1} = masked)", r->gdws, h2,
                 (size_t)(k->v * ldh) * es);
    if (h3)
        ct_same_bits(tag, one ? "dbs (weights 1 = NULL)" : "dbs ({0,1} = masked)", r->gdbs, h3,
                     (size_t)k->v * es);
    ct_same_bits(tag, one ? "rows (weights 1 = NULL)" : "rows ({0,1} = masked)", r->grows, hr,
                 (size_t)bt * (k->ent ? 16 : 12));
    ct_same_bits(tag, one ? "losses (weights 1 = NULL)" : "losses ({0,1} = masked)", r->gl, hl,
                 12);
    if (masked) CK(cudaFree(masked));
}

/* dxs, dws (dbs) normwise against the reference, then the same call again: the same bits. */
static void fl_check_grads(const char *tag, fl_run *r, const fl_ref *f, const float hl[3]) {
    const fl_case *k = r->k;
    const int64_t bt = k->bt, hs = k->hs, v = k->v, ldh = hs + k->pad;
    const size_t es = kdloss_dtype_size(k->ds);
    double *rdx = xmalloc((size_t)(bt * hs) * 8), *rdw = xmalloc((size_t)(v * hs) * 8);
    double *rdb = xmalloc((size_t)v * 8);
    ct_ref_grads(bt, hs, v, f->dz, r->xs, r->ws, rdx, rdw, rdb);
    const double tol = k->ds == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
    void *h1 = ct_cmp_grad(tag, "dxs", r->gdxs, k->ds, bt, hs, ldh, rdx, tol);
    void *h2 = ct_cmp_grad(tag, "dws", r->gdws, k->ds, v, hs, ldh, rdw, tol);
    void *h3 = k->bias ? ct_cmp_grad(tag, "dbs", r->gdbs, k->ds, 1, v, v, rdb, tol) : NULL;
    void *hr = dfetch(r->grows, (size_t)bt * 16);
    KT_CHECK(fl_call(r) == KDLOSS_OK, "%s: second call", tag);
    CK(cudaStreamSynchronize(g_st));
    ct_same_bits(tag, "dxs", r->gdxs, h1, (size_t)(bt * ldh) * es);
    ct_same_bits(tag, "dws", r->gdws, h2, (size_t)(v * ldh) * es);
    if (h3) ct_same_bits(tag, "dbs", r->gdbs, h3, (size_t)v * es);
    if (k->distill) ct_same_bits(tag, "row outputs", r->grows, hr, (size_t)bt * (k->ent ? 16 : 12));
    ct_same_bits(tag, "losses", r->gl, hl, 12);
    if (k->wmode == 3 || k->wmode == 4) fl_exact(tag, r, h1, h2, h3, hr, hl);
    free(h3), free(hr);
    if ((k->distill ? kdloss_fused_linear_distill != NULL : kdloss_fused_linear_jsd != NULL) &&
        !k->bad_label && k->wmode != 2)
        fl_vs_cpu(tag, r, f, hl[0], h1, h2, tol);
    free(h1), free(h2), free(rdx), free(rdw), free(rdb);
}

/* The operands are inputs: never written. */
static void fl_inputs_untouched(const char *tag, const fl_run *r) {
    const ct_mat *m[] = {&r->mxs, &r->mws, &r->mxt, &r->mwt, &r->mbs, &r->mbt};
    int same = 1;
    for (int i = 0; i < 6; i++) {
        void *h = dfetch(m[i]->d, m[i]->bytes);
        same &= !memcmp(h, m[i]->h, m[i]->bytes);
        free(h);
    }
    KT_CHECK(same, "%s: an input was written", tag);
}

static void fl_free(fl_run *r) {
    ct_mat *m[] = {&r->mxs, &r->mws, &r->mxt, &r->mwt, &r->mbs, &r->mbt};
    for (int i = 0; i < 6; i++) ct_free(m[i]);
    void *d[] = {r->gdxs, r->gdws, r->gdbs, r->gl, r->grows, r->wk};
    for (int i = 0; i < 6; i++) CK(cudaFree(d[i]));
    ct_labels_free(&r->L);
    if (r->dw) CK(cudaFree(r->dw));
    free(r->hw);
    free(r->xs), free(r->ws), free(r->xt), free(r->wt), free(r->bs), free(r->btb);
}

static void test_fl_case(kt_rng *rng, const fl_case *k) {
    char tag[240];
    snprintf(tag, sizeof tag,
             "%s %s alpha=%g t2=%d bt=%lld hs=%lld ht=%lld v=%lld s=%s t=%s beta=%g T=%g wh=%g "
             "ws=%g bias=%d chunk=%lld budget=%zu pad=%lld bad=%d fwd=%d w=%d ent=%d",
             k->distill ? "fldistill" : "fld_jsd",
             kdloss_divergence_name(k->distill ? k->div : KDLOSS_DIV_JSD), k->alpha, k->t2,
             (long long)k->bt, (long long)k->hs, (long long)k->ht, (long long)k->v,
             kt_dtype_name(k->ds), kt_dtype_name(k->dt), k->beta, k->temperature, k->w_hard,
             k->w_soft, k->bias, (long long)k->chunk, k->budget, (long long)k->pad, k->bad_label,
             k->forward_only, k->wmode, k->ent);
    fl_run r;
    memset(&r, 0, sizeof r);
    r.k = k;
    fl_inputs(rng, &r);
    fl_params(&r);
    fl_outputs(tag, &r);
    kdloss_status s = fl_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) {
        const int32_t want = k->bad_label    ? KDLOSS_ERR_LABEL_OUT_OF_RANGE
                             : k->wmode == 2 ? KDLOSS_ERR_INVALID_PARAM
                                             : KDLOSS_OK;
        KT_CHECK(read_status(r.wk) == want, "%s: device status word %d, want %d", tag,
                 (int)read_status(r.wk), (int)want);
        fl_ref f;
        float hl[3];
        fl_reference(&r, &f);
        fl_check_losses(tag, &r, &f, hl);
        fl_inputs_untouched(tag, &r);
        if (!k->forward_only && k->ent != 2) fl_check_grads(tag, &r, &f, hl);
        free(f.rrow), free(f.dz);
    }
    fl_free(&r);
}

static const kdloss_dtype FL_PAIRS[3][2] = {
    {KDLOSS_F32, KDLOSS_F32}, {KDLOSS_BF16, KDLOSS_BF16}, {KDLOSS_BF16, KDLOSS_F32}};
static const double FL_WTS[3][2] = {{0.5, 0.5}, {0.0, 1.0}, {1.0, 0.0}};
static const int64_t FL_CHUNKS[4] = {0, 16, 1, 7};

/* kdloss_cuda_fused_linear_jsd: dtype pair x beta x T, then more than one 4096-column tile (in
 * place narrowing across tiles), padded lds, the smallest budget, a bad label, forward only. */
void test_fl(kt_rng *rng) {
    static const double betas[] = {0.0, 0.5, 1.0}, temps[] = {1.0, 2.0};
    int k = 0;
    for (int d = 0; d < 3; d++)
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < 2; t++, k++) {
                fl_case c = {37, 24, 40, 300, FL_PAIRS[d][0], FL_PAIRS[d][1], betas[b], temps[t],
                             FL_WTS[k % 3][0], FL_WTS[k % 3][1], k % 2, FL_CHUNKS[k % 4], 0, 0, 0,
                             0, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0};
                if (!kt_quick() || k % 5 == 0) test_fl_case(rng, &c);
            }
    static const fl_case sp[] = {
        {9, 16, 24, 4100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 1, 4, 0, 3, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0},
        {9, 16, 24, 9001, KDLOSS_F32, KDLOSS_BF16, 0.3, 1.5, 0.5, 0.5, 1, 0, 1, 0, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0},
        {12, 16, 16, 100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 5, 0, 0, 1, 0, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0},
        {12, 16, 16, 100, KDLOSS_F32, KDLOSS_F32, 0.5, 2.0, 0.5, 0.5, 1, 0, 0, 0, 0, 1, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0},
        {130, 64, 32, 1000, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 64, 0, 0, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_fl_case(rng, &sp[i]);
}

/* Per-row weights and the entropy (docs/MATH.md 12.1), per divergence: weights with zeros and
 * non-integers plus the entropy (dtype pairs, T, t2_scale, biases, chunking cycled); a tile
 * boundary; the entropy alone; bad weights with and without a bad label; weights of 1 against
 * NULL and {0, 1} against masked labels, with and without the entropy (the slab kernel on sm_90
 * serves calls without it). */
static void fld_weight_cases(kt_rng *rng) {
    for (int i = 0; i < KT_NDIV_CASES; i++) {
        if (kt_quick() && i % 4) continue;
        const kdloss_div_params dv = KT_DIV_CASES[i];
        const int d = i % 3;
        const double T = i % 2 ? 2.0 : 1.0;
        const fl_case c[] = {
            {29, 24, 40, 300, FL_PAIRS[d][0], FL_PAIRS[d][1], dv.beta, T, 0.5, 0.5, i % 2,
             FL_CHUNKS[i % 4], 0, 0, 0, 0, 1, dv.divergence, dv.alpha, i % 2, 1, 1},
            {9, 16, 24, 4100, KDLOSS_BF16, KDLOSS_BF16, dv.beta, 1.5, 0.3, 0.7, 1, 4, 0, 3, 0, 0,
             1, dv.divergence, dv.alpha, 1, 1, i % 2},
            {13, 16, 16, 200, KDLOSS_F32, KDLOSS_F32, dv.beta, T, 0.5, 0.5, 1, 5, 0, 0, i % 2, 0,
             1, dv.divergence, dv.alpha, 0, 2, 1},
            {17, 16, 16, 300, FL_PAIRS[d][0], FL_PAIRS[d][1], dv.beta, T, 0.5, 0.5, 1, 0, 0, 0, 0,
             0, 1, dv.divergence, dv.alpha, 1, 3, i % 2},
            {17, 16, 16, 300, FL_PAIRS[d][0], FL_PAIRS[d][1], dv.beta, T, 0.5, 0.5, 1, 6, 0, 0, 0,
             0, 1, dv.divergence, dv.alpha, 0, 4, (i + 1) % 2},
        };
        for (size_t j = 0; j < sizeof c / sizeof c[0]; j++)
            if (j == 0 || !kt_quick()) test_fl_case(rng, &c[j]);
    }
    /* the entropy alone */
    const fl_case e = {11, 16, 16, 500, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.5, 0.5, 0.5, 1, 0, 0, 0,
                       0, 1, 1, KDLOSS_DIV_FORWARD_KL, 0.1, 0, 1, 2};
    test_fl_case(rng, &e);
}

/* kdloss_cuda_fused_linear_distill: every divergence case x dtype pair, T, t2_scale, weights,
 * chunking and biases cycled; per divergence a tile boundary with padding; the smallest budget,
 * a bad label, forward only. */
void test_fld(kt_rng *rng) {
    int k = 0;
    for (int i = 0; i < KT_NDIV_CASES; i++)
        for (int d = 0; d < 3; d++, k++) {
            if (kt_quick() && k % 5) continue;
            const kdloss_div_params dv = KT_DIV_CASES[i];
            fl_case c = {37,
                         24,
                         40,
                         300,
                         FL_PAIRS[d][0],
                         FL_PAIRS[d][1],
                         dv.beta,
                         k % 2 ? 2.0 : 1.0,
                         FL_WTS[k % 3][0],
                         FL_WTS[k % 3][1],
                         k % 2,
                         FL_CHUNKS[k % 4],
                         0,
                         0,
                         0,
                         0,
                         1,
                         dv.divergence,
                         dv.alpha,
                         (k / 2) % 2,
                         0,
                         0};
            test_fl_case(rng, &c);
        }
    for (int i = 0; i < KT_NDIV_CASES; i += kt_quick() ? 4 : 1) {
        const kdloss_div_params dv = KT_DIV_CASES[i];
        fl_case c1 = {9, 16, 24, 4100, KDLOSS_BF16, KDLOSS_BF16, dv.beta, 1.5, 0.5, 0.5, 1,
                      4, 0, 3, 0, 0, 1, dv.divergence, dv.alpha, 1, 0, 0};
        test_fl_case(rng, &c1);
    }
    static const fl_case sp[] = {
        {9, 16, 24, 9001, KDLOSS_F32, KDLOSS_BF16, 0.3, 1.5, 0.5, 0.5, 1, 0, 1, 0, 0, 0, 1, KDLOSS_DIV_SKEW_REVERSE_KL, 0.3, 1, 0, 0},
        {12, 16, 16, 100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 5, 0, 0, 1, 0, 1, KDLOSS_DIV_TVD, 0.1, 0, 0, 0},
        {12, 16, 16, 100, KDLOSS_F32, KDLOSS_F32, 0.5, 2.0, 0.5, 0.5, 1, 0, 0, 0, 0, 1, 1, KDLOSS_DIV_REVERSE_KL, 0.1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_fl_case(rng, &sp[i]);
    fld_weight_cases(rng);
}
