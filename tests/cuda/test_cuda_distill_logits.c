/* The divergence family on logits (kdloss_cuda_distill_logits, tag "dlogits"): the case grid of
 * tests/support/cases.h (the one tests/test_distill_logits.c runs on the CPU) against a float64
 * reference written here (log_softmax(z / T) in double, ref_div_elem, dz = (g - Q sum g) / T)
 * with the top-k logits loss's tolerances, and against kdloss_distill_logits; inputs untouched,
 * run-to-run bits, forward-only losses bitwise the full call's; then per divergence a bad label,
 * padded + misaligned operands and the gradient in place, and long rows. Per-row weights and the
 * entropy (docs/MATH.md section 12; the reference: a kept row's gradient and loss term times
 * its weight, n_valid the kept rows, H = -sum Q log Q in double): per divergence weights with
 * zeros and non-integers, ignored labels among them, the entropy, in place and not, against the
 * reference and kdloss_distill_logits; weights of 1 the bits of NULL, weights in {0, 1} the bits
 * of masking those rows with ignore_index; bad weights through the status word. */
#include <float.h>

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
    int wmode; /* row weights: 0 none, 1 with zeros and non-integers, 2 that and bad ones */
    int ent;   /* ask for the entropy */
} dl_case;

typedef struct dl_run {
    const dl_case *c;
    kdloss_distill_logits_params p;
    ct_mat s, t;
    ct_labels L;
    ct_rows o;
    int no_grad; /* the forward-only call */
    float *hw, *dw; /* row weights, host and device (NULL: none) */
    float *dent;    /* the entropy's device output (NULL: not asked) */
    int64_t nk;     /* rows kept: label and weight */
} dl_run;

/* Row r's weight under `mode`: every fifth row (from row 2) 0, the others in [0.25, 2.75);
 * mode 2 also a NaN on the second-to-last row and -0.5 on row 1 (an ignored row with labels:
 * the CPU checks every weight). */
static float dl_weight(kt_rng *rng, int mode, int64_t r, int64_t bt) {
    if (mode == 2 && r == bt - 2) return NAN;
    if (mode == 2 && r == 1) return -0.5f;
    return r % 5 == 2 ? 0.0f : (float)(0.25 + 2.5 * kt_uniform(rng));
}

/* 0 kept, 1 ignored (label or weight 0), 2 bad (label or weight), as the kernels classify. */
static int dl_kind(const dl_run *r, int64_t k) {
    const dl_case *c = r->c;
    const int64_t y = r->L.lab[k];
    const float w = r->hw ? r->hw[k] : 1.0f;
    if ((c->labels && y != -100 && (y < 0 || y >= c->v)) || !(w >= 0.0f && w <= FLT_MAX))
        return 2;
    return (c->labels && y == -100) || w == 0.0f;
}

static kdloss_status dl_call(void *arg) {
    const dl_run *r = arg;
    const dl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    kdloss_cmat s = {r->s.d, c->ds, ld}, t = {r->t.d, c->dt, ld};
    kdloss_mat g = {r->no_grad ? NULL : r->o.g.d, c->ds, ld};
    kdloss_distill_logits_params p = r->p;
    p.row_weights = r->dw, p.row_entropy = r->dent;
    return kdloss_cuda_distill_logits(g_ctx, g_st, &p, c->bt, c->v, s, t, r->L.dev, r->o.loss,
                                      r->o.row, g, r->o.ws, r->o.wsb);
}

/* One row of the reference (docs/MATH.md 7.4, not the kernels' forms): X = log_softmax(zs / T),
 * Y = log_softmax(zt / T) in double, ref_div_elem, dz = (g - Q sum g) / T times `scale`; the
 * slack, what the fp32 chain rule may add to the elementwise tolerance through S = sum g: its
 * summation (64 u times the row's term magnitudes |g| + (P + Q)(2 + |x| + |y| + lw),
 * test_distill_logits's bound: the CPU's scalar path sums S sequentially over the row) reaches
 * element j as Q_j dS; and TVD's subgradient may take either sign where P and Q agree to fp32
 * rounding (tvd_tie), which moves that element by up to Q_k and S by Q_k. Returns the row's
 * loss, adds its error scale to *abs_tot, and its entropy -sum Q X into *h. */
static double dl_ref_row(const dl_case *c, const double *s, const double *t, double scale,
                         double *gr, double *sl, double *abs_tot, double *h) {
    const int64_t v = c->v;
    const double lw = kt_div_log_weights(&c->d);
    const double ls = logsumexp(s, v, 1.0 / c->T), lt = logsumexp(t, v, 1.0 / c->T);
    double *g = xmalloc((size_t)v * 8), *x = xmalloc((size_t)v * 8);
    double loss = 0.0, sum_g = 0.0, dsum = 0.0;
    for (int64_t k = 0; k < v; k++) {
        double mag;
        const double y = t[k] / c->T - lt;
        x[k] = s[k] / c->T - ls;
        *h -= exp(x[k]) * x[k];
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

/* grad (bt x v), row [bt] (0 when ignored, NaN for a bad label or weight), ent [bt] (the same),
 * slack (bt x v); returns the loss (NaN with a bad row), *abs_tot the kept rows' error scales
 * times their weights. A kept row's gradient and loss term are its weight times the unweighted
 * ones (docs/MATH.md section 12), n_valid the kept rows. */
static double dl_ref(const dl_run *r, const double *zs, const double *zt, double *grad,
                     double *row, double *ent, double *slack, double *abs_tot) {
    const dl_case *c = r->c;
    const double nvd = r->nk > 0 ? (double)r->nk : 1.0;
    double tot = 0.0;
    int bad = 0;
    *abs_tot = 0.0;
    for (int64_t i = 0; i < c->bt * c->v; i++) grad[i] = slack[i] = 0.0;
    for (int64_t k = 0; k < c->bt; k++) {
        const int kind = dl_kind(r, k);
        const double w = r->hw ? (double)r->hw[k] : 1.0;
        row[k] = ent[k] = kind == 2 ? NAN : 0.0;
        bad |= kind == 2;
        if (kind) continue;
        double a = 0.0, h = 0.0;
        row[k] = dl_ref_row(c, zs + k * c->v, zt + k * c->v, 1.25 * w / (c->T * nvd),
                            grad + k * c->v, slack + k * c->v, &a, &h);
        ent[k] = h;
        *abs_tot += w * a;
        tot += w * row[k];
    }
    return bad ? NAN : tot / nvd;
}

/* The entropy's output against the reference ent (rtol 1e-5 plus the fp32 sum's rounding over
 * V terms of size up to 1 / e: 64 u log V absolute). */
static void dl_check_ent(const char *tag, const dl_run *r, const double *ent) {
    if (!r->dent) return;
    float *h = dfetch(r->dent, (size_t)r->c->bt * 4);
    double *hd = to_double(h, KDLOSS_F32, 1, r->c->bt, r->c->bt);
    char what[300];
    snprintf(what, sizeof what, "%s row_entropy", tag);
    cmp_arr(what, hd, ent, r->c->bt, 64 * U32 * (1.0 + log((double)r->c->v)), 1e-5);
    free(h), free(hd);
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

/* kdloss_distill_logits on the host copies (a case without bad labels or weights), the same
 * weights, and its entropy. */
static void dl_vs_cpu(const char *tag, const dl_run *r, const double *gg, const double *slack,
                      float hl, double loss_atol) {
    const dl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    void *cg = xmalloc(r->o.g.bytes);
    float cl = 0, *crow = xmalloc((size_t)c->bt * 4), *cent = xmalloc((size_t)c->bt * 4);
    kdloss_cmat cs = {r->s.h, c->ds, ld}, ct = {r->t.h, c->dt, ld};
    kdloss_mat cgm = {cg, c->ds, ld};
    kdloss_distill_logits_params p = r->p;
    p.row_weights = r->hw, p.row_entropy = r->dent ? cent : NULL;
    kdloss_status s = kdloss_distill_logits(&p, c->bt, c->v, cs, ct, r->L.host, &cl, crow, cgm);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s))
        ct_vs_cpu(tag, &r->o, gg, cg, slack, 2.0, 1e-5, kt_tiny(c->ds), hl, cl, loss_atol);
    if (s == KDLOSS_OK && r->dent) {
        float *h = dfetch(r->dent, (size_t)c->bt * 4);
        double *hd = to_double(h, KDLOSS_F32, 1, c->bt, c->bt);
        double *cd = to_double(cent, KDLOSS_F32, 1, c->bt, c->bt);
        char what[300];
        snprintf(what, sizeof what, "%s row_entropy vs CPU", tag);
        cmp_arr(what, hd, cd, c->bt, 64 * U32 * (1.0 + log((double)c->v)), 1e-5);
        free(h), free(hd), free(cd);
    }
    free(cg), free(crow), free(cent);
}

static void dl_check(const char *tag, dl_run *r, const double *zs, const double *zt) {
    const dl_case *c = r->c;
    const int64_t n = c->bt * c->v;
    double *rg = xmalloc((size_t)n * 8), *sl = xmalloc((size_t)n * 8);
    double *rrow = xmalloc((size_t)c->bt * 8), *rent = xmalloc((size_t)c->bt * 8), abs_tot;
    const double want = dl_ref(r, zs, zt, rg, rrow, rent, sl, &abs_tot);
    const double nvd = r->nk > 0 ? (double)r->nk : 1.0, wmax = r->hw ? 2.75 : 1.0;
    const double mix_atol =
        64 * U32 * (1 + kt_div_log_weights(&c->d)) * 1.25 * wmax / (c->T * nvd);
    const int32_t word = r->L.bad        ? KDLOSS_ERR_LABEL_OUT_OF_RANGE
                         : c->wmode == 2 ? KDLOSS_ERR_INVALID_PARAM
                                         : KDLOSS_OK;
    const ct_want w = {word, rg, sl,
                       1e-5 * max_abs(rg, n) + mix_atol + kt_tiny(c->ds), 2 * kt_eps(c->ds) + 1e-5,
                       rrow, 1e-5 * abs_tot / (double)c->bt + 1e-30, want,
                       1e-5 * abs_tot / nvd + 1e-30};
    float hl;
    double *gg = ct_check_rows(tag, &r->o, &w, dl_call, r, &hl);
    dl_check_ent(tag, r, rent);
    if (!c->in_place) {
        dl_inputs_untouched(tag, r);
        dl_forward_only(tag, r);
    }
    if (kdloss_distill_logits && word == KDLOSS_OK && !c->misalign && !c->in_place)
        dl_vs_cpu(tag, r, gg, sl, hl, w.loss_atol);
    free(gg), free(rg), free(sl), free(rrow), free(rent);
}

/* The case's weights (host and device) and entropy buffer (poisoned), and its kept rows. */
static void dl_extras_make(kt_rng *rng, dl_run *r) {
    const dl_case *c = r->c;
    if (c->wmode) {
        r->hw = xmalloc((size_t)c->bt * 4);
        for (int64_t k = 0; k < c->bt; k++) r->hw[k] = dl_weight(rng, c->wmode, k, c->bt);
        r->dw = dupload(r->hw, (size_t)c->bt * 4);
    }
    if (c->ent) {
        r->dent = dalloc((size_t)c->bt * 4);
        dpoison(r->dent, (size_t)c->bt * 4);
    }
    r->nk = 0;
    for (int64_t k = 0; k < c->bt; k++) r->nk += dl_kind(r, k) == 0;
}

static void dl_extras_free(dl_run *r) {
    if (r->dw) CK(cudaFree(r->dw));
    if (r->dent) CK(cudaFree(r->dent));
    free(r->hw);
}

static void test_dl_case(kt_rng *rng, const dl_case *c) {
    char tag[240];
    snprintf(tag, sizeof tag,
             "dlogits %s beta=%g alpha=%g bt=%lld v=%lld s=%s t=%s T=%g labels=%d/%s%s pad=%lld "
             "mis=%d ip=%d w=%d ent=%d",
             kdloss_divergence_name(c->d.divergence), c->d.beta, c->d.alpha, (long long)c->bt,
             (long long)c->v, kt_dtype_name(c->ds), kt_dtype_name(c->dt), c->T, c->labels,
             kt_dtype_name(c->ldt), c->bad ? " bad" : "", (long long)c->pad, c->misalign,
             c->in_place, c->wmode, c->ent);
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
    dl_extras_make(rng, &r);
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
    dl_extras_free(&r);
    free(zs), free(zt);
}

/* One call's outputs, fetched: gradient, row losses, loss, entropy (bt x v fp32, no padding). */
typedef struct dl_outs {
    void *g;
    float *row, *ent, loss;
} dl_outs;

/* kdloss_cuda_distill_logits on the device logits s, t (bt x v, dtype dt) with labels L (I64
 * host values lab, or NULL: none) and weights w (host, or NULL), the entropy asked for (alone:
 * no other output, the others fetched poisoned). */
static dl_outs dl_run_outs(const kdloss_distill_logits_params *p0, int64_t bt, int64_t v,
                           kdloss_dtype dt, const ct_mat *s, const ct_mat *t, const int64_t *lab,
                           const float *w, int alone) {
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(bt, v, &wsb) == KDLOSS_OK, "ws size");
    const size_t gb = (size_t)(bt * v) * kdloss_dtype_size(dt);
    void *g = dalloc(gb), *ws = dalloc(wsb), *dl = lab ? dupload(lab, (size_t)bt * 8) : NULL;
    float *row = dalloc((size_t)bt * 4), *ent = dalloc((size_t)bt * 4), *loss = dalloc(4);
    float *dw = w ? dupload(w, (size_t)bt * 4) : NULL;
    dpoison(g, gb), dpoison(row, (size_t)bt * 4), dpoison(ent, (size_t)bt * 4);
    kdloss_distill_logits_params p = *p0;
    p.row_weights = dw, p.row_entropy = ent;
    const kdloss_labels L = {dl, KDLOSS_I64};
    kdloss_status st = kdloss_cuda_distill_logits(g_ctx, g_st, &p, bt, v,
                                                  (kdloss_cmat){s->d, dt, v},
                                                  (kdloss_cmat){t->d, dt, v}, L,
                                                  alone ? NULL : loss, alone ? NULL : row,
                                                  (kdloss_mat){alone ? NULL : g, dt, v}, ws, wsb);
    CK(cudaStreamSynchronize(g_st));
    KT_CHECK(st == KDLOSS_OK && read_status(ws) == KDLOSS_OK, "dlogits bits: status %d", (int)st);
    dl_outs o = {dfetch(g, gb), dfetch(row, (size_t)bt * 4), dfetch(ent, (size_t)bt * 4), 0};
    d2h(&o.loss, loss, 4);
    CK(cudaFree(g));
    CK(cudaFree(ws));
    CK(cudaFree(row));
    CK(cudaFree(ent));
    CK(cudaFree(loss));
    if (dl) CK(cudaFree(dl));
    if (dw) CK(cudaFree(dw));
    return o;
}

static int dpoisoned_host(const void *h, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)h)[i] != 0xFF) return 0;
    return 1;
}

static void dl_same_outs(const char *tag, dl_outs a, dl_outs b, size_t gb, int64_t bt) {
    char what[200];
    snprintf(what, sizeof what, "%s grad", tag);
    cmp_bits(what, a.g, b.g, gb);
    snprintf(what, sizeof what, "%s row_loss", tag);
    cmp_bits(what, a.row, b.row, (size_t)bt * 4);
    snprintf(what, sizeof what, "%s row_entropy", tag);
    cmp_bits(what, a.ent, b.ent, (size_t)bt * 4);
    snprintf(what, sizeof what, "%s loss", tag);
    cmp_bits(what, &a.loss, &b.loss, 4);
    free(a.g), free(a.row), free(a.ent), free(b.g), free(b.row), free(b.ent);
}

/* docs/MATH.md section 12's exact cases: weights of 1 give the bits of NULL, and weights in
 * {0, 1} the bits of those rows masked through ignore_index, with and without labels. */
static void dl_weight_bits(kt_rng *rng, const kdloss_div_params *d, kdloss_dtype dt) {
    const int64_t bt = 11, v = 1031;
    double *zs = gen_logits(rng, bt, v, dt), *zt = gen_logits(rng, bt, v, dt);
    ct_mat s = ct_in(zs, bt, v, v, dt, 0), t = ct_in(zt, bt, v, v, dt, 0);
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div = *d, p.temperature = 1.5, p.grad_scale = 0.75;
    int64_t lab[11], masked[11], all[11];
    float ones[11], mask[11];
    for (int64_t r = 0; r < bt; r++) {
        lab[r] = r % 4 == 1 ? -100 : kt_randint(rng, v);
        ones[r] = 1.0f, mask[r] = r % 3 == 0 ? 0.0f : 1.0f;
        masked[r] = mask[r] == 0.0f ? -100 : lab[r];
        all[r] = mask[r] == 0.0f ? -100 : 0;
    }
    const size_t gb = (size_t)(bt * v) * kdloss_dtype_size(dt);
    char tag[200];
    const char *dn = kdloss_divergence_name(d->divergence);
    snprintf(tag, sizeof tag, "dlogits %s %s weights 1 = NULL", dn, kt_dtype_name(dt));
    dl_same_outs(tag, dl_run_outs(&p, bt, v, dt, &s, &t, lab, ones, 0),
                 dl_run_outs(&p, bt, v, dt, &s, &t, lab, NULL, 0), gb, bt);
    snprintf(tag, sizeof tag, "dlogits %s %s weights 1 = NULL, no labels", dn, kt_dtype_name(dt));
    dl_same_outs(tag, dl_run_outs(&p, bt, v, dt, &s, &t, NULL, ones, 0),
                 dl_run_outs(&p, bt, v, dt, &s, &t, NULL, NULL, 0), gb, bt);
    snprintf(tag, sizeof tag, "dlogits %s %s weights {0,1} = ignore_index", dn, kt_dtype_name(dt));
    dl_same_outs(tag, dl_run_outs(&p, bt, v, dt, &s, &t, lab, mask, 0),
                 dl_run_outs(&p, bt, v, dt, &s, &t, masked, NULL, 0), gb, bt);
    snprintf(tag, sizeof tag, "dlogits %s %s weights {0,1} = ignore_index, no labels", dn,
             kt_dtype_name(dt));
    p.ignore_index = -100;
    dl_same_outs(tag, dl_run_outs(&p, bt, v, dt, &s, &t, NULL, mask, 0),
                 dl_run_outs(&p, bt, v, dt, &s, &t, all, NULL, 0), gb, bt);
    /* the entropy alone: the full call's bits (the row pass does not depend on the outputs) */
    dl_outs a = dl_run_outs(&p, bt, v, dt, &s, &t, lab, mask, 1);
    dl_outs b = dl_run_outs(&p, bt, v, dt, &s, &t, lab, mask, 0);
    snprintf(tag, sizeof tag, "dlogits %s %s row_entropy alone", dn, kt_dtype_name(dt));
    cmp_bits(tag, a.ent, b.ent, (size_t)bt * 4);
    KT_CHECK(dpoisoned_host(a.g, gb) && dpoisoned_host(a.row, (size_t)bt * 4),
             "%s: nothing else written", tag);
    free(a.g), free(a.row), free(a.ent), free(b.g), free(b.row), free(b.ent);
    ct_free(&s), ct_free(&t);
    free(zs), free(zt);
}

/* Per divergence: weights (zeros, non-integers) with ignored labels and the entropy, in place
 * with I32 labels over a multi-tile row, without labels and without a gradient's padding, bad
 * weights (with and without a bad label), and section 12's exact cases. */
static void dl_weight_cases(kt_rng *rng) {
    for (int i = 0; i < KT_NDIV_CASES; i++) {
        const kdloss_div_params d = KT_DIV_CASES[i];
        const double T = KT_TEMPS[i % 3];
        const dl_case wc[] = {
            {13, 300, KDLOSS_F32, KDLOSS_BF16, d, T, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 1, 1},
            {9, 4099, KT_DTYPES[i % 3], KDLOSS_F32, d, T, KT_LAB_SOME, KDLOSS_I32, 0, 0, 0, 1, 1, 1},
            {10, 777, KDLOSS_BF16, KDLOSS_F16, d, T, KT_LAB_NONE, KDLOSS_I64, 0, 8, 0, 0, 1, 0},
            {12, 200, KDLOSS_F32, KDLOSS_F32, d, T, KT_LAB_SOME, KDLOSS_I64, i % 2, 0, 0, 0, 2, 1},
        };
        for (size_t j = 0; j < sizeof wc / sizeof wc[0]; j++)
            if (j == 0 || !kt_quick() || i % 3 == 0) test_dl_case(rng, &wc[j]);
        if (!kt_quick() || i % 3 == 0) dl_weight_bits(rng, &d, KT_DTYPES[i % 3]);
    }
}

void test_distill_logits(kt_rng *rng) {
    KT_FOR_EACH_CASE(g) { /* padded ones keep 16-byte rows: the vector path */
        if (kt_quick() && g.n % 13) continue;
        const dl_case c = {g.bt, g.v, g.ds, g.dt, g.d, g.t, g.labels, g.ldt, 0, g.pad ? 8 : 0,
                           0, 0, 0, 0};
        test_dl_case(rng, &c);
    }
    for (int i = 0; i < KT_NDIV_CASES; i++) { /* a bad label; padding + misaligned; in place */
        const kdloss_div_params d = KT_DIV_CASES[i];
        const dl_case sp[] = {
            {8, 300, KDLOSS_BF16, KDLOSS_F32, d, KT_TEMPS[i % 3], KT_LAB_SOME, KDLOSS_I32, 1, 0, 0, 0, 0, 0},
            {7, 4099, KT_DTYPES[i % 3], KT_DTYPES[(i + 1) % 3], d, KT_TEMPS[(i + 1) % 3],
             KT_LAB_SOME, KDLOSS_I32, 0, 5, 1, 0, 0, 0},
            {9, 513, KT_DTYPES[(i + 2) % 3], KDLOSS_F32, d, KT_TEMPS[(i + 2) % 3], KT_LAB_SOME,
             KDLOSS_I64, 0, i % 2 ? 8 : 0, 0, 1, 0, 0},
        };
        for (size_t j = 0; j < sizeof sp / sizeof sp[0]; j++)
            if (j == 0 || !kt_quick() || i % 3 == 0) test_dl_case(rng, &sp[j]);
    }
    /* a long row (several tiles of every thread), in place too; weighted, with the entropy */
    const dl_case big[] = {
        {3, 100000, KDLOSS_BF16, KDLOSS_BF16, KT_DIV_CASES[4], 0.7, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 0},
        {3, 100000, KDLOSS_F32, KDLOSS_F16, KT_DIV_CASES[14], 2.0, KT_LAB_NONE, KDLOSS_I64, 0, 3, 0, 1, 0, 0},
        {4, 100000, KDLOSS_F32, KDLOSS_BF16, KT_DIV_CASES[7], 1.0, KT_LAB_NONE, KDLOSS_I64, 0, 0, 0, 0, 1, 1},
    };
    for (size_t j = 0; j < sizeof big / sizeof big[0]; j++) test_dl_case(rng, &big[j]);
    dl_weight_cases(rng);
}
