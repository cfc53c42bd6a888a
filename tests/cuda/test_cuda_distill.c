/* The divergence family on log-probs: kdloss_cuda_distill over the case grid of
 * tests/support/cases.h (the one tests/test_distill.c runs on the CPU), kdloss_cuda_jsd over the
 * grid's JSD cases, against float64 references (ref_div_elem of tests/support/reference.h, and a
 * JSD(beta) reference written here for the wrapper) and the CPU functions; then per divergence a
 * bad label, padded + misaligned operands and the gradient in place, and a long row. */
#include "cuda_test.h"

typedef struct div_case {
    int64_t bt, v;
    kdloss_dtype ds, dt; /* student (and gradient), teacher */
    int jsd;             /* 1: kdloss_cuda_jsd with d.beta (its own reference) */
    kdloss_div_params d;
    int labels;          /* ct_labels_make's mode, dtype, bad */
    kdloss_dtype ldt;
    int bad;
    int64_t pad;         /* extra columns on every ld */
    int misalign, in_place;
} div_case;

/* One call's operands and outputs. */
typedef struct div_run {
    const div_case *c;
    kdloss_jsd_params p;
    kdloss_distill_params pd;
    ct_mat s, t;
    ct_labels L;
    ct_rows o;
} div_run;

static kdloss_status div_call(void *arg) {
    const div_run *r = arg;
    const div_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    kdloss_cmat cs = {r->s.d, c->ds, ld}, ct = {r->t.d, c->dt, ld};
    kdloss_mat gr = {r->o.g.d, c->ds, ld};
    if (c->jsd)
        return kdloss_cuda_jsd(g_ctx, g_st, &r->p, c->bt, c->v, cs, ct, r->L.dev, r->o.loss,
                               r->o.row, gr, r->o.ws, r->o.wsb);
    return kdloss_cuda_distill(g_ctx, g_st, &r->pd, c->bt, c->v, cs, ct, r->L.dev, r->o.loss,
                               r->o.row, gr, r->o.ws, r->o.wsb);
}

/* The reference: rg (scaled), rrow (NaN on a bad row), slack (TVD ties: either subgradient);
 * returns the loss (NaN with a bad label), *abs_tot the summed error scales. */
static double div_ref(const div_run *r, const double *x, const double *y, double *rg,
                      double *rrow, double *slack, double *abs_tot) {
    const div_case *c = r->c;
    const double scale = 1.25 / (r->L.nv > 0 ? (double)r->L.nv : 1.0);
    double tot = 0;
    *abs_tot = 0;
    for (int64_t row = 0; row < c->bt; row++) {
        const int64_t y0 = r->L.lab[row];
        const int skip = c->labels && y0 == -100,
                  bad = c->labels && !skip && (y0 < 0 || y0 >= c->v);
        double rs = 0;
        for (int64_t k = 0; k < c->v; k++) {
            const int64_t i = row * c->v + k;
            double g = 0, l = 0, mag = 0;
            if (!skip && !bad) /* the wrapper: its own reference, the family's error scale */
                l = ref_div_elem(&c->d, x[i], y[i], &g, &mag);
            if (!skip && !bad && c->jsd) l = cu_ref_jsd_elem(c->d.beta, x[i], y[i], &g);
            rg[i] = g * scale;
            slack[i] = tvd_tie(&c->d, x[i], y[i]) ? 1.25 * exp(x[i]) : 0.0;
            rs += l;
            *abs_tot += fabs(l) > mag ? fabs(l) : mag;
        }
        rrow[row] = bad ? NAN : rs;
        if (!skip && !bad) tot += rs;
    }
    return r->L.bad ? NAN : tot / (r->L.nv > 0 ? (double)r->L.nv : 1.0);
}

/* kdloss_distill (kdloss_jsd) on the host copies. */
static void div_vs_cpu(const char *tag, const div_run *r, const double *gg, const double *slack,
                       float hl, double loss_atol) {
    const div_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    void *cg = xmalloc(r->o.g.bytes);
    float *crow = xmalloc((size_t)c->bt * 4), cl = 0;
    kdloss_cmat hs = {r->s.h, c->ds, ld}, ht = {r->t.h, c->dt, ld};
    kdloss_mat hg = {cg, c->ds, ld};
    kdloss_status s = c->jsd
                          ? kdloss_jsd(&r->p, c->bt, c->v, hs, ht, r->L.host, &cl, crow, hg)
                          : kdloss_distill(&r->pd, c->bt, c->v, hs, ht, r->L.host, &cl, crow, hg);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s))
        ct_vs_cpu(tag, &r->o, gg, cg, slack, 1.0, 1e-5, c->ds == KDLOSS_F16 ? 6e-8 : 0, hl, cl,
                  loss_atol);
    free(cg);
    free(crow);
}

static void div_check(const char *tag, const div_run *r, const double *x, const double *y) {
    const div_case *c = r->c;
    const int64_t n = c->bt * c->v;
    double *rg = xmalloc((size_t)n * 8), *sl = xmalloc((size_t)n * 8);
    double *rrow = xmalloc((size_t)c->bt * 8), abs_tot;
    const double want = div_ref(r, x, y, rg, rrow, sl, &abs_tot);
    const double nvd = r->L.nv > 0 ? (double)r->L.nv : 1.0, scale = 1.25 / nvd;
    /* the mixtures' log-differences cancel to 0 where P = Q: fp32 rounding of the mixture
     * weights' logs (lw) then stays as an absolute error of a few u x (1 + lw) x scale */
    const double mix_atol = 64 * U32 * (1 + kt_div_log_weights(&c->d)) * scale;
    const ct_want w = {r->L.bad ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK, rg, sl,
                       1e-5 * max_abs(rg, n) + mix_atol + (c->ds == KDLOSS_F16 ? 6e-8 : 0),
                       2 * kt_eps(c->ds) + 1e-5, rrow, 1e-5 * abs_tot / (double)c->bt + 1e-30,
                       want, 1e-5 * abs_tot / nvd + 1e-30};
    float hl;
    double *gg = ct_check_rows(tag, &r->o, &w, div_call, (void *)r, &hl);
    if ((c->jsd ? kdloss_jsd != NULL : kdloss_distill != NULL) && !c->misalign && !r->L.bad)
        div_vs_cpu(tag, r, gg, sl, hl, w.loss_atol);
    free(gg), free(rg), free(sl), free(rrow);
}

/* -inf entries everywhere except where they make the loss infinite (and every tolerance
 * meaningless): student -inf under forward KL, teacher -inf under reverse KL. */
static void div_inputs(kt_rng *rng, const div_case *c, double *x, double *y) {
    kt_gen_logprobs(rng, x, c->bt, c->v, !kt_div_fwd_like(&c->d), 0);
    kt_gen_logprobs(rng, y, c->bt, c->v, !kt_div_rev_like(&c->d), 3);
    kt_round_to(x, c->bt * c->v, c->ds);
    kt_round_to(y, c->bt * c->v, c->dt);
}

static void test_div_case(kt_rng *rng, const div_case *c) {
    char tag[200];
    snprintf(tag, sizeof tag,
             "%s %s bt=%lld v=%lld s=%s t=%s beta=%g alpha=%g labels=%d/%s%s pad=%lld mis=%d ip=%d",
             c->jsd ? "jsd" : "distill", kdloss_divergence_name(c->d.divergence), (long long)c->bt,
             (long long)c->v, kt_dtype_name(c->ds), kt_dtype_name(c->dt), c->d.beta, c->d.alpha,
             c->labels, kt_dtype_name(c->ldt), c->bad ? " bad" : "", (long long)c->pad,
             c->misalign, c->in_place);
    const int64_t ld = c->v + c->pad, n = c->bt * c->v;
    double *x = xmalloc((size_t)n * 8), *y = xmalloc((size_t)n * 8);
    div_inputs(rng, c, x, y);
    div_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.p.beta = c->d.beta, r.p.ignore_index = -100, r.p.grad_scale = 1.25;
    kdloss_distill_params_default(&r.pd);
    r.pd.div = c->d, r.pd.ignore_index = -100, r.pd.grad_scale = 1.25;
    r.L = ct_labels_make(rng, c->labels, c->ldt, c->bad, c->bt, c->v);
    r.s = ct_in(x, c->bt, c->v, ld, c->ds, c->misalign);
    r.t = ct_in(y, c->bt, c->v, ld, c->dt, c->misalign);
    size_t wsb = 0;
    KT_CHECK((c->jsd ? kdloss_cuda_jsd_workspace_size(c->bt, c->v, &wsb)
                     : kdloss_cuda_distill_workspace_size(c->bt, c->v, &wsb)) == KDLOSS_OK,
             "%s: ws size", tag);
    ct_rows_alloc(&r.o, c->bt, c->v, ld, c->ds, c->misalign, c->in_place ? &r.s : NULL, 1, wsb);
    kdloss_status s = div_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) div_check(tag, &r, x, y);
    ct_rows_free(&r.o);
    ct_free(&r.s), ct_free(&r.t);
    ct_labels_free(&r.L);
    free(x), free(y);
}

/* A grid case of cases.h; padded ones keep 16-byte rows (8 columns more): the vector path. */
static div_case div_from_grid(const kt_case *g, int jsd) {
    const div_case c = {g->bt, g->v, g->ds, g->dt, jsd, g->d, g->labels, g->ldt, 0,
                        g->pad ? 8 : 0, 0, 0};
    return c;
}

/* kdloss_cuda_jsd: the grid's JSD cases (beta 0, 0.1, 0.5, 1) with each teacher dtype (every
 * beta x student dtype x teacher dtype x label mode), then beta 0.3 / 0.7 with padding,
 * misaligned operands, in place, a bad label, and a long row. */
void test_jsd(kt_rng *rng) {
    int n = 0;
    KT_FOR_EACH_CASE(g) {
        if (g.d.divergence != KDLOSS_DIV_JSD) continue;
        for (int t = 0; t < 3; t++, n++) {
            div_case c = div_from_grid(&g, 1);
            c.dt = KT_DTYPES[t];
            if (!kt_quick() || n % 7 == 0) test_div_case(rng, &c);
        }
    }
    static const div_case sp[] = {
        {8, 300, KDLOSS_BF16, KDLOSS_BF16, 1, {KDLOSS_DIV_JSD, 0.5, 0.1}, KT_LAB_SOME, KDLOSS_I32, 1, 0, 0, 0},
        {7, 4099, KDLOSS_BF16, KDLOSS_F32, 1, {KDLOSS_DIV_JSD, 0.3, 0.1}, KT_LAB_SOME, KDLOSS_I64, 0, 5, 0, 0},
        {7, 4099, KDLOSS_F16, KDLOSS_F16, 1, {KDLOSS_DIV_JSD, 0.7, 0.1}, KT_LAB_SOME, KDLOSS_I32, 0, 3, 1, 0},
        {9, 513, KDLOSS_F32, KDLOSS_F32, 1, {KDLOSS_DIV_JSD, 0.5, 0.1}, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 1},
        {9, 513, KDLOSS_BF16, KDLOSS_F32, 1, {KDLOSS_DIV_JSD, 1.0, 0.1}, KT_LAB_NONE, KDLOSS_I64, 0, 8, 0, 1},
        {3, 100000, KDLOSS_BF16, KDLOSS_BF16, 1, {KDLOSS_DIV_JSD, 0.5, 0.1}, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_div_case(rng, &sp[i]);
}

/* kdloss_cuda_distill: the whole grid; per divergence a bad label, padded + misaligned, and in
 * place (padded); a long row (several tiles a thread). */
void test_distill(kt_rng *rng) {
    KT_FOR_EACH_CASE(g) {
        if (kt_quick() && g.n % 4) continue;
        const div_case c = div_from_grid(&g, 0);
        test_div_case(rng, &c);
    }
    for (int i = 0; i < KT_NDIV_CASES; i++) {
        if (kt_quick() && i % 3) continue;
        const kdloss_div_params d = KT_DIV_CASES[i];
        const div_case sp[] = {
            {8, 300, KDLOSS_BF16, KDLOSS_BF16, 0, d, KT_LAB_SOME, KDLOSS_I32, 1, 0, 0, 0},
            {7, 4099, KDLOSS_F16, KDLOSS_F16, 0, d, KT_LAB_SOME, KDLOSS_I32, 0, 3, 1, 0},
            {9, 513, KDLOSS_BF16, KDLOSS_F32, 0, d, KT_LAB_SOME, KDLOSS_I64, 0, 8, 0, 1},
        };
        for (size_t j = 0; j < sizeof sp / sizeof sp[0]; j++) test_div_case(rng, &sp[j]);
    }
    const div_case big = {3, 100000, KDLOSS_BF16, KDLOSS_BF16, 0, KT_DIV_CASES[12], KT_LAB_SOME,
                          KDLOSS_I64, 0, 0, 0, 0};
    test_div_case(rng, &big);
}
