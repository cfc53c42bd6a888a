/* The divergence family on logits (kdloss_cuda_distill_logits, tag "dlogits"): the case grid of
 * tests/support/cases.h (the one tests/test_distill_logits.c runs on the CPU) against a float64
 * reference written here (log_softmax(z / T) in double, ref_div_elem, dz = (g - Q sum g) / T)
 * with the top-k logits loss's tolerances, and against kdloss_distill_logits; inputs untouched,
 * run-to-run bits, forward-only losses bitwise the full call's; then per divergence a bad label,
 * padded + misaligned operands and the gradient in place, and long rows. */
#include "cuda_test.h"

typedef struct dl_case {
    int64_t bt, v;
    kdloss_dtype ds, dt; /* student (and gradient), teacher */
    kdloss_div_params d;
    double T;
    int labels; /* ct_labels_make's mode, dtype, bad */
    kdloss_dtype ldt;
    int bad;
    int64_t pad; /* extra columns on every ld */
    int misalign, in_place;
} dl_case;

typedef struct dl_run {
    const dl_case *c;
    kdloss_distill_logits_params p;
    ct_mat s, t;
    ct_labels L;
    ct_rows o;
    int no_grad; /* the forward-only call */
} dl_run;

static kdloss_status dl_call(void *arg) {
    const dl_run *r = arg;
    const dl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    kdloss_cmat s = {r->s.d, c->ds, ld}, t = {r->t.d, c->dt, ld};
    kdloss_mat g = {r->no_grad ? NULL : r->o.g.d, c->ds, ld};
    return kdloss_cuda_distill_logits(g_ctx, g_st, &r->p, c->bt, c->v, s, t, r->L.dev, r->o.loss,
                                      r->o.row, g, r->o.ws, r->o.wsb);
}

/* One row of the reference (docs/MATH.md 7.4, not the kernels' forms): X = log_softmax(zs / T),
 * Y = log_softmax(zt / T) in double, ref_div_elem, dz = (g - Q sum g) / T times `scale`; the
 * slack, what the fp32 chain rule may add to the elementwise tolerance through S = sum g: its
 * summation (64 u times the row's term magnitudes |g| + (P + Q)(2 + |x| + |y| + lw),
 * test_distill_logits's bound: the CPU's scalar path sums S sequentially over the row) reaches
 * element j as Q_j dS; and TVD's subgradient may take either sign where P and Q agree to fp32
 * rounding (tvd_tie), which moves that element by up to Q_k and S by Q_k. Returns the row's
 * loss, adds its error scale to *abs_tot. */
static double dl_ref_row(const dl_case *c, const double *s, const double *t, double scale,
                         double *gr, double *sl, double *abs_tot) {
    const int64_t v = c->v;
    const double lw = kt_div_log_weights(&c->d);
    const double ls = logsumexp(s, v, 1.0 / c->T), lt = logsumexp(t, v, 1.0 / c->T);
    double *g = xmalloc((size_t)v * 8), *x = xmalloc((size_t)v * 8);
    double loss = 0.0, sum_g = 0.0, dsum = 0.0;
    for (int64_t k = 0; k < v; k++) {
        double mag;
        const double y = t[k] / c->T - lt;
        x[k] = s[k] / c->T - ls;
        const double l = ref_div_elem(&c->d, x[k], y, &g[k], &mag);
        loss += l;
        sum_g += g[k];
        *abs_tot += fabs(l) > mag ? fabs(l) : mag;
        dsum +=
            64 * U32 * (fabs(g[k]) + ref_wmul(exp(x[k]) + exp(y), 2 + fabs(x[k]) + fabs(y) + lw));
        sl[k] = 0.0;
        if (tvd_tie(&c->d, x[k], y)) sl[k] = exp(x[k]), dsum += exp(x[k]);
    }
    for (int64_t k = 0; k < v; k++) {
        gr[k] = (g[k] - exp(x[k]) * sum_g) * scale;
        sl[k] = (sl[k] + exp(x[k]) * dsum) * scale;
    }
    free(g), free(x);
    return loss;
}

/* grad (bt x v), row [bt] (0 when ignored, NaN for a bad label), slack (bt x v); returns the
 * loss (NaN with a bad label), *abs_tot the counted rows' error scales. */
static double dl_ref(const dl_run *r, const double *zs, const double *zt, double *grad,
                     double *row, double *slack, double *abs_tot) {
    const dl_case *c = r->c;
    const double nvd = r->L.nv > 0 ? (double)r->L.nv : 1.0, scale = 1.25 / (c->T * nvd);
    double tot = 0.0;
    *abs_tot = 0.0;
    for (int64_t i = 0; i < c->bt * c->v; i++) grad[i] = slack[i] = 0.0;
    for (int64_t k = 0; k < c->bt; k++) {
        const int64_t y = r->L.lab[k];
        row[k] = c->labels && y != -100 && (y < 0 || y >= c->v) ? NAN : 0.0;
        if (c->labels && (y == -100 || y < 0 || y >= c->v)) continue;
        row[k] = dl_ref_row(c, zs + k * c->v, zt + k * c->v, scale, grad + k * c->v,
                            slack + k * c->v, abs_tot);
        tot += row[k];
    }
    return r->L.bad ? NAN : tot / nvd;
}

/* Without the gradient: the same loss and row losses, bitwise (the loss pass does not depend on
 * whether a gradient is wanted). */
static void dl_forward_only(const char *tag, dl_run *r) {
    const int64_t bt = r->c->bt;
    float l1, l2, *r1 = dfetch(r->o.row, (size_t)bt * 4), *r2;
    d2h(&l1, r->o.loss, 4);
    dpoison(r->o.loss, 4);
    dpoison(r->o.row, (size_t)bt * 4);
    r->no_grad = 1;
    KT_CHECK(dl_call(r) == KDLOSS_OK, "%s: forward-only call", tag);
    r->no_grad = 0;
    CK(cudaStreamSynchronize(g_st));
    d2h(&l2, r->o.loss, 4);
    r2 = dfetch(r->o.row, (size_t)bt * 4);
    KT_CHECK(!memcmp(&l1, &l2, 4) && !memcmp(r1, r2, (size_t)bt * 4),
             "%s: losses without the gradient differ", tag);
    free(r1), free(r2);
}

/* Inputs are never written. */
static void dl_inputs_untouched(const char *tag, const dl_run *r) {
    void *h = dfetch(r->s.d, r->s.bytes);
    KT_CHECK(!memcmp(r->s.h, h, r->s.bytes), "%s: student logits written", tag);
    free(h);
    h = dfetch(r->t.d, r->t.bytes);
    KT_CHECK(!memcmp(r->t.h, h, r->t.bytes), "%s: teacher logits written", tag);
    free(h);
}

/* kdloss_distill_logits on the host copies (a case without bad labels). */
static void dl_vs_cpu(const char *tag, const dl_run *r, const double *gg, const double *slack,
                      float hl, double loss_atol) {
    const dl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    void *cg = xmalloc(r->o.g.bytes);
    float cl = 0, *crow = xmalloc((size_t)c->bt * 4);
    kdloss_cmat cs = {r->s.h, c->ds, ld}, ct = {r->t.h, c->dt, ld};
    kdloss_mat cgm = {cg, c->ds, ld};
    kdloss_status s = kdloss_distill_logits(&r->p, c->bt, c->v, cs, ct, r->L.host, &cl, crow, cgm);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s))
        ct_vs_cpu(tag, &r->o, gg, cg, slack, 2.0, 1e-5, kt_tiny(c->ds), hl, cl, loss_atol);
    free(cg), free(crow);
}

static void dl_check(const char *tag, dl_run *r, const double *zs, const double *zt) {
    const dl_case *c = r->c;
    const int64_t n = c->bt * c->v;
    double *rg = xmalloc((size_t)n * 8), *sl = xmalloc((size_t)n * 8);
    double *rrow = xmalloc((size_t)c->bt * 8), abs_tot;
    const double want = dl_ref(r, zs, zt, rg, rrow, sl, &abs_tot);
    const double nvd = r->L.nv > 0 ? (double)r->L.nv : 1.0;
    const double mix_atol = 64 * U32 * (1 + kt_div_log_weights(&c->d)) * 1.25 / (c->T * nvd);
    const ct_want w = {r->L.bad ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK, rg, sl,
                       1e-5 * max_abs(rg, n) + mix_atol + kt_tiny(c->ds), 2 * kt_eps(c->ds) + 1e-5,
                       rrow, 1e-5 * abs_tot / (double)c->bt + 1e-30, want,
                       1e-5 * abs_tot / nvd + 1e-30};
    float hl;
    double *gg = ct_check_rows(tag, &r->o, &w, dl_call, r, &hl);
    if (!c->in_place) {
        dl_inputs_untouched(tag, r);
        dl_forward_only(tag, r);
    }
    if (kdloss_distill_logits && !r->L.bad && !c->misalign && !c->in_place)
        dl_vs_cpu(tag, r, gg, sl, hl, w.loss_atol);
    free(gg), free(rg), free(sl), free(rrow);
}

static void test_dl_case(kt_rng *rng, const dl_case *c) {
    char tag[240];
    snprintf(tag, sizeof tag,
             "dlogits %s beta=%g alpha=%g bt=%lld v=%lld s=%s t=%s T=%g labels=%d/%s%s pad=%lld "
             "mis=%d ip=%d",
             kdloss_divergence_name(c->d.divergence), c->d.beta, c->d.alpha, (long long)c->bt,
             (long long)c->v, kt_dtype_name(c->ds), kt_dtype_name(c->dt), c->T, c->labels,
             kt_dtype_name(c->ldt), c->bad ? " bad" : "", (long long)c->pad, c->misalign,
             c->in_place);
    const int64_t ld = c->v + c->pad;
    double *zs = gen_logits(rng, c->bt, c->v, c->ds), *zt = gen_logits(rng, c->bt, c->v, c->dt);
    dl_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    kdloss_distill_logits_params_default(&r.p);
    r.p.div = c->d, r.p.temperature = c->T, r.p.grad_scale = 1.25;
    r.L = ct_labels_make(rng, c->labels, c->ldt, c->bad, c->bt, c->v);
    r.s = ct_in(zs, c->bt, c->v, ld, c->ds, c->misalign);
    r.t = ct_in(zt, c->bt, c->v, ld, c->dt, c->misalign);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(c->bt, c->v, &wsb) == KDLOSS_OK,
             "%s: ws size", tag);
    ct_rows_alloc(&r.o, c->bt, c->v, ld, c->ds, c->misalign, c->in_place ? &r.s : NULL, 1, wsb);
    kdloss_status s = dl_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) dl_check(tag, &r, zs, zt);
    ct_rows_free(&r.o);
    ct_free(&r.s), ct_free(&r.t);
    ct_labels_free(&r.L);
    free(zs), free(zt);
}

void test_distill_logits(kt_rng *rng) {
    KT_FOR_EACH_CASE(g) { /* padded ones keep 16-byte rows: the vector path */
        if (kt_quick() && g.n % 13) continue;
        const dl_case c = {g.bt, g.v, g.ds, g.dt, g.d, g.t, g.labels, g.ldt, 0, g.pad ? 8 : 0,
                           0, 0};
        test_dl_case(rng, &c);
    }
    for (int i = 0; i < KT_NDIV_CASES; i++) { /* a bad label; padding + misaligned; in place */
        const kdloss_div_params d = KT_DIV_CASES[i];
        const dl_case sp[] = {
            {8, 300, KDLOSS_BF16, KDLOSS_F32, d, KT_TEMPS[i % 3], KT_LAB_SOME, KDLOSS_I32, 1, 0, 0, 0},
            {7, 4099, KT_DTYPES[i % 3], KT_DTYPES[(i + 1) % 3], d, KT_TEMPS[(i + 1) % 3],
             KT_LAB_SOME, KDLOSS_I32, 0, 5, 1, 0},
            {9, 513, KT_DTYPES[(i + 2) % 3], KDLOSS_F32, d, KT_TEMPS[(i + 2) % 3], KT_LAB_SOME,
             KDLOSS_I64, 0, i % 2 ? 8 : 0, 0, 1},
        };
        for (size_t j = 0; j < sizeof sp / sizeof sp[0]; j++)
            if (j == 0 || !kt_quick() || i % 3 == 0) test_dl_case(rng, &sp[j]);
    }
    /* a long row (several tiles of every thread), in place too */
    const dl_case big[] = {
        {3, 100000, KDLOSS_BF16, KDLOSS_BF16, KT_DIV_CASES[4], 0.7, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0},
        {3, 100000, KDLOSS_F32, KDLOSS_F16, KT_DIV_CASES[14], 2.0, KT_LAB_NONE, KDLOSS_I64, 0, 3, 0, 1},
    };
    for (size_t j = 0; j < 2; j++) test_dl_case(rng, &big[j]);
}
