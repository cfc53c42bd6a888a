/* kdloss_cuda_kl_div (torch's KLDivLoss) against a float64 reference written here and against
 * kdloss_kl_div: reduction x log_target x input dtype x target dtype over V from one column to
 * three tiles, then padded, misaligned (the scalar path), in place and a long row. */
#include "cuda_test.h"

typedef struct kl_case {
    int64_t bt, v;
    kdloss_dtype di, dt; /* input (and gradient), target */
    int log_target;
    kdloss_reduction red;
    int64_t pad; /* extra columns per row */
    int misalign, in_place;
} kl_case;

/* One call's operands and outputs. */
typedef struct kl_run {
    const kl_case *c;
    kdloss_kl_params p;
    ct_mat in, tg, el; /* el: the element losses (reduction none) */
    ct_rows o;
} kl_run;

static const char *red_name(kdloss_reduction r) {
    static const char *n[] = {"none", "sum", "mean", "batchmean"};
    return n[r];
}

/* KL elementwise: returns l, writes dl/dy (unscaled). */
static double cu_ref_kl_elem(int log_target, double eps, double y, double t, double *g) {
    if (log_target) {
        double et = exp(t);
        *g = -et;
        return et > 0 ? et * (t - y) : 0.0;
    }
    *g = -t;
    return t != 0 ? t * (log(t > eps ? t : eps) - y) : 0.0;
}

static kdloss_status kl_call(void *arg) {
    const kl_run *r = arg;
    const kl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    kdloss_cmat in = {r->in.d, c->di, ld}, tg = {r->tg.d, c->dt, ld};
    kdloss_mat el = {r->el.base ? r->el.d : NULL, KDLOSS_F32, ld}, gr = {r->o.g.d, c->di, ld};
    return kdloss_cuda_kl_div(g_ctx, g_st, &r->p, c->bt, c->v, in, tg, r->o.loss, r->o.row, el, gr,
                              r->o.ws, r->o.wsb);
}

static double kl_denom(const kl_case *c) {
    return c->red == KDLOSS_REDUCTION_MEAN        ? (double)c->bt * (double)c->v
           : c->red == KDLOSS_REDUCTION_BATCHMEAN ? (double)c->bt
                                                  : 1.0;
}

/* The reference: rg (scaled gradient), rl (element losses), rrow; returns the summed loss and
 * in *abs_tot the sum of |terms|. */
static double kl_ref(const kl_case *c, const double *y, const double *t, double *rg, double *rl,
                     double *rrow, double *abs_tot) {
    const double scale = 0.75 / kl_denom(c), feps = (double)(float)1e-10;
    double tot = 0;
    *abs_tot = 0;
    for (int64_t r = 0; r < c->bt; r++) {
        double rs = 0;
        for (int64_t k = 0; k < c->v; k++) {
            const int64_t i = r * c->v + k;
            double g;
            rl[i] = cu_ref_kl_elem(c->log_target, feps, y[i], t[i], &g);
            rg[i] = g * scale;
            rs += rl[i];
            *abs_tot += fabs(rl[i]);
        }
        rrow[r] = rs;
        tot += rs;
    }
    return tot;
}

/* The element losses (reduction none) against the reference, padding untouched. */
static void kl_check_elem(const char *tag, const kl_run *r, const double *rl) {
    const kl_case *c = r->c;
    const int64_t n = c->bt * c->v;
    float *he = dfetch(r->el.d, r->el.bytes);
    double *ee = to_double(he, KDLOSS_F32, c->bt, c->v, c->v + c->pad);
    char what[300];
    snprintf(what, sizeof what, "%s elem_loss", tag);
    cmp_arr(what, ee, rl, n, 1e-5 * max_abs(rl, n), 1e-5);
    KT_CHECK(pad_untouched(he, KDLOSS_F32, c->bt, c->v, c->v + c->pad),
             "%s: elem_loss padding written", tag);
    free(ee);
    free(he);
}

/* kdloss_kl_div on the host copies. */
static void kl_vs_cpu(const char *tag, const kl_run *r, const double *gg, float hl,
                      double abs_tot) {
    const kl_case *c = r->c;
    const int64_t ld = c->v + c->pad;
    void *cg = xmalloc(r->o.g.bytes);
    float *ce = r->el.base ? xmalloc(r->el.bytes) : NULL, *crow = xmalloc((size_t)c->bt * 4),
          cl = 0;
    kdloss_cmat cin = {r->in.h, c->di, ld}, ctg = {r->tg.h, c->dt, ld};
    kdloss_mat cel = {ce, KDLOSS_F32, ld}, cgr = {cg, c->di, ld};
    kdloss_status s =
        kdloss_kl_div(&r->p, c->bt, c->v, cin, ctg, r->o.loss ? &cl : NULL, crow, cel, cgr);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s))
        ct_vs_cpu(tag, &r->o, gg, cg, NULL, 0, 1e-6, c->di == KDLOSS_F16 ? 6e-8 : 0, hl, cl,
                  1e-5 * abs_tot / kl_denom(c) + 1e-30);
    free(cg), free(ce), free(crow);
}

static void kl_check(const char *tag, kl_run *r, const double *y, const double *t) {
    const kl_case *c = r->c;
    const int64_t n = c->bt * c->v;
    double *rg = xmalloc((size_t)n * 8), *rl = xmalloc((size_t)n * 8);
    double *rrow = xmalloc((size_t)c->bt * 8), abs_tot;
    const double tot = kl_ref(c, y, t, rg, rl, rrow, &abs_tot), denom = kl_denom(c);
    const ct_want w = {KDLOSS_OK, rg, NULL,
                       1e-6 * max_abs(rg, n) + (c->di == KDLOSS_F16 ? 6e-8 : 0),
                       2 * kt_eps(c->di) + 1e-5, rrow, 1e-5 * abs_tot / (double)c->bt + 1e-30,
                       tot / denom, 1e-5 * abs_tot / denom + 1e-30};
    float hl;
    double *gg = ct_check_rows(tag, &r->o, &w, kl_call, r, &hl);
    if (r->el.base) kl_check_elem(tag, r, rl);
    if (kdloss_kl_div && !c->misalign) kl_vs_cpu(tag, r, gg, hl, abs_tot);
    free(gg), free(rg), free(rl), free(rrow);
}

static void test_kl_case(kt_rng *rng, const kl_case *c) {
    char tag[160];
    snprintf(tag, sizeof tag, "kl bt=%lld v=%lld in=%s t=%s log_target=%d %s pad=%lld mis=%d ip=%d",
             (long long)c->bt, (long long)c->v, kt_dtype_name(c->di), kt_dtype_name(c->dt),
             c->log_target, red_name(c->red), (long long)c->pad, c->misalign, c->in_place);
    const int64_t ld = c->v + c->pad, n = c->bt * c->v;
    double *y = xmalloc((size_t)n * 8), *t = xmalloc((size_t)n * 8);
    kt_gen_logprobs(rng, y, c->bt, c->v, 0, 0);
    kt_gen_logprobs(rng, t, c->bt, c->v, 1, 2);
    if (!c->log_target)
        for (int64_t i = 0; i < n; i++) t[i] = exp(t[i]);
    kt_round_to(y, n, c->di);
    kt_round_to(t, n, c->dt);
    kl_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.p.reduction = c->red, r.p.log_target = c->log_target, r.p.eps = 1e-10, r.p.grad_scale = 0.75;
    r.in = ct_in(y, c->bt, c->v, ld, c->di, c->misalign);
    r.tg = ct_in(t, c->bt, c->v, ld, c->dt, c->misalign);
    if (c->red == KDLOSS_REDUCTION_NONE) r.el = ct_out(c->bt, ld, KDLOSS_F32, 0);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(c->bt, c->v, &wsb) == KDLOSS_OK, "%s: ws size", tag);
    ct_rows_alloc(&r.o, c->bt, c->v, ld, c->di, c->misalign, c->in_place ? &r.in : NULL,
                  c->red != KDLOSS_REDUCTION_NONE, wsb);
    kdloss_status s = kl_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) kl_check(tag, &r, y, t);
    ct_rows_free(&r.o);
    ct_free(&r.in), ct_free(&r.tg), ct_free(&r.el);
    free(y), free(t);
}

void test_kl(kt_rng *rng) {
    static const int64_t vs[] = {1, 37, 4096, 9001};
    int k = 0;
    for (int red = 0; red < 4; red++)
        for (int lt = 0; lt < 2; lt++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++, k++) {
                    const kl_case c = {19, vs[k % 4], KT_DTYPES[i], KT_DTYPES[j], lt,
                                       (kdloss_reduction)red, 0, 0, 0};
                    if (!kt_quick() || k % 7 == 0) test_kl_case(rng, &c);
                }
    /* strided, misaligned (scalar path), in place, a larger tile count */
    static const kl_case sp[] = {
        {7, 4099, KDLOSS_BF16, KDLOSS_F32, 0, KDLOSS_REDUCTION_BATCHMEAN, 5, 0, 0},
        {7, 4099, KDLOSS_F16, KDLOSS_BF16, 1, KDLOSS_REDUCTION_SUM, 3, 1, 0},
        {7, 1000, KDLOSS_F32, KDLOSS_F32, 0, KDLOSS_REDUCTION_MEAN, 0, 1, 0},
        {9, 513, KDLOSS_F32, KDLOSS_F32, 1, KDLOSS_REDUCTION_BATCHMEAN, 0, 0, 1},
        {9, 513, KDLOSS_BF16, KDLOSS_BF16, 0, KDLOSS_REDUCTION_SUM, 8, 0, 1},
        {3, 100000, KDLOSS_BF16, KDLOSS_F32, 0, KDLOSS_REDUCTION_BATCHMEAN, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_kl_case(rng, &sp[i]);
}
