/* kdloss_fused_linear_distill_multi (several teachers, one per row; docs/MATH.md section 13) on
 * every CPU path:
 *  - against the float64 reference (ref_fld: each row's teacher logits from its own head), JSD
 *    beta 0 / 0.5 / 1 with cross-entropy, T 1 and 2, 1 to 3 heads with and without biases, fp32
 *    and bf16, teacher index grouped in runs, alternating row by row, or random, chunks of 3 rows
 *    (runs crossing chunk ends) and automatic: losses 1e-4 relative, gradients normwise 1e-4
 *    (fp32) / 1.5e-2 (bf16: dz rounded to bf16 on the native path), test_fld's budgets;
 *  - against the single-teacher calls, one per head on its own rows (the others ignored), with
 *    grad_scale n_j / N, summed: the definition of the combined call, within 1e-6
 *    relative (loss) and 1e-6 of the largest entry (gradients): only summation orders differ;
 *  - the same identity with per-row weights (some 0: those rows leave n_valid);
 *  - one head equals kdloss_fused_linear_distill bitwise in fp32 when its weights are fp32;
 *  - errors (NULL teachers, n 0, an index out of range in an ignored row too, a head of another
 *    dtype, the index over an output): the status, nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss.h"
#include "ref_fld.h"
#include "testutil.h"

#define MAXH 3

typedef struct mt_case {
    int64_t bt, hs, ht, v, chunk;
    int heads, bias, pattern; /* pattern 0: runs of 5, 1: alternating, 2: random */
    kdloss_dtype dt;
    double beta, temperature;
} mt_case;

typedef struct mt_out {
    float loss, soft, hard;
    float *dxs, *dws, *dbs, *row_soft;
} mt_out;

static void out_alloc(mt_out *o, const mt_case *c) {
    o->dxs = calloc((size_t)(c->bt * c->hs), sizeof(float));
    o->dws = calloc((size_t)(c->v * c->hs), sizeof(float));
    o->dbs = calloc((size_t)c->v, sizeof(float));
    o->row_soft = calloc((size_t)c->bt, sizeof(float));
}

static void out_free(mt_out *o) {
    free(o->dxs);
    free(o->dws);
    free(o->dbs);
    free(o->row_soft);
}

/* The C view of o; the gradients in fp32 (the student is widened to fp32 in this test's outputs
 * only when it is fp32: bf16 students get bf16 gradients, read back below). */
static kdloss_fused_linear_distill_out out_view(mt_out *o, kdloss_dtype dt, int bias) {
    kdloss_fused_linear_distill_out d;
    memset(&d, 0, sizeof d);
    d.loss = &o->loss;
    d.soft_loss = &o->soft;
    d.hard_loss = &o->hard;
    d.dxs = (kdloss_mat){o->dxs, dt, 0};
    d.dws = (kdloss_mat){o->dws, dt, 0};
    d.dbs = bias ? o->dbs : NULL;
    d.row_soft = o->row_soft;
    return d;
}

/* Per-row weights every call of a case's weighted pass takes (NULL: none); docs/MATH.md 12. */
static const float *g_weights;

/* Whether row r counts in n_valid: not ignored, and of positive weight when weighted. */
static int kept(const int64_t *labels, int64_t ig, int64_t r) {
    return labels[r] != ig && (!g_weights || g_weights[r] > 0.0f);
}

static kdloss_fused_linear_distill_params params_of(const mt_case *c, int64_t ignore_index,
                                                    double grad_scale) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.div.divergence = KDLOSS_DIV_JSD;
    p.div.beta = c->beta;
    p.temperature = c->temperature;
    p.ignore_index = ignore_index;
    p.chunk_size = c->chunk;
    p.grad_scale = grad_scale;
    p.row_weights = g_weights;
    return p;
}

static void make_index(kt_rng *rng, const mt_case *c, int32_t *idx) {
    for (int64_t r = 0; r < c->bt; r++)
        idx[r] = c->pattern == 0   ? (int32_t)((r / 5) % c->heads)
                 : c->pattern == 1 ? (int32_t)(r % c->heads)
                                   : (int32_t)kt_randint(rng, c->heads);
}

/* Element i of a packed gradient (fp32 buffer or bf16 in the same bytes). */
static double grad_at(const float *g, kdloss_dtype dt, int64_t i) {
    return kt_get(g, dt, 0, 0, i);
}

/* max |got - want| <= tol * max |want| over n elements. */
static void close_norm(const float *got, kdloss_dtype dt, const double *want, int64_t n,
                       double tol, const char *what, const char *isa) {
    double mx = 0.0, err = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) err = fmax(err, fabs(grad_at(got, dt, i) - want[i]));
    KT_CHECK(err <= tol * mx + 1e-30, "%s %s: max error %.3g > %.3g x %.3g", isa, what, err, tol,
             mx);
}

/* The reference: zt row r from head idx[r] in double, then ref_fld. */
static void reference(const mt_case *c, kt_fld_problem *pr, const int32_t *idx, double *loss,
                      double *soft, double *hard, double *dxs, double *dws, double *dbs) {
    int64_t bt = c->bt, v = c->v;
    double *zs = malloc(sizeof(double) * (size_t)(bt * v));
    double *zt = malloc(sizeof(double) * (size_t)(bt * v));
    double *zj = malloc(sizeof(double) * (size_t)(bt * v));
    double *dz = malloc(sizeof(double) * (size_t)(bt * v));
    kt_ref_logits(bt, c->hs, v, pr[0].xs, pr[0].ws, pr[0].bias_s, zs);
    for (int j = 0; j < c->heads; j++) {
        kt_ref_logits(bt, c->ht, v, pr[0].xt, pr[j].wt, c->bias ? pr[j].bias_t : NULL, zj);
        for (int64_t r = 0; r < bt; r++)
            if (idx[r] == j) memcpy(zt + r * v, zj + r * v, sizeof(double) * (size_t)v);
    }
    kt_fld_cfg cfg = {c->beta, c->temperature, 0.5, 0.5, 1.0, pr[0].ignore_index};
    kt_ref_fld_dz(&cfg, bt, v, zs, zt, pr[0].labels, loss, soft, hard, dz, NULL);
    kt_ref_fld_grads(bt, c->hs, v, dz, pr[0].xs, pr[0].ws, 0, 1, dxs, dws, dbs);
    free(zs);
    free(zt);
    free(zj);
    free(dz);
}

static kdloss_status run_multi(const mt_case *c, kt_fld_problem *pr, const int32_t *idx,
                               mt_out *o) {
    kdloss_cmat wt[MAXH];
    const void *bias[MAXH];
    for (int j = 0; j < c->heads; j++) {
        wt[j] = (kdloss_cmat){pr[j].pwt, c->dt, pr[j].ld_wt};
        bias[j] = pr[j].pbias_t;
    }
    kdloss_teacher_heads h = {c->heads, wt, c->bias ? bias : NULL, idx};
    kdloss_fused_linear_distill_params p = params_of(c, pr[0].ignore_index, 1.0);
    kdloss_fused_linear_distill_out d = out_view(o, c->dt, c->bias);
    kdloss_labels lab = {pr[0].labels, KDLOSS_I64};
    return kdloss_fused_linear_distill_multi(
        &p, c->bt, c->hs, c->ht, c->v, (kdloss_cmat){pr[0].pxs, c->dt, pr[0].ld_xs},
        (kdloss_cmat){pr[0].pws, c->dt, pr[0].ld_ws}, c->bias ? pr[0].pbias_s : NULL,
        (kdloss_cmat){pr[0].pxt, c->dt, pr[0].ld_xt}, &h, lab, &d, NULL, 0);
}

/* The per-head calls on their own rows, gradients scaled by n_j / N, summed in double. */
static int run_split(const mt_case *c, kt_fld_problem *pr, const int32_t *idx, double *loss,
                     double *dxs, double *dws, double *dbs) {
    int64_t bt = c->bt, n_all = 0, ig = pr[0].ignore_index;
    int64_t *lab = malloc(sizeof(int64_t) * (size_t)bt);
    for (int64_t r = 0; r < bt; r++) n_all += kept(pr[0].labels, ig, r);
    memset(dxs, 0, sizeof(double) * (size_t)(bt * c->hs));
    memset(dws, 0, sizeof(double) * (size_t)(c->v * c->hs));
    memset(dbs, 0, sizeof(double) * (size_t)c->v);
    *loss = 0.0;
    int ok = 1;
    for (int j = 0; j < c->heads && ok; j++) {
        int64_t nj = 0;
        for (int64_t r = 0; r < bt; r++) {
            lab[r] = idx[r] == j ? pr[0].labels[r] : ig;
            nj += kept(lab, ig, r);
        }
        if (nj == 0) continue;
        mt_out o;
        out_alloc(&o, c);
        kdloss_fused_linear_distill_params p = params_of(c, ig, (double)nj / (double)n_all);
        kdloss_fused_linear_distill_out d = out_view(&o, c->dt, c->bias);
        kdloss_status st = kdloss_fused_linear_distill(
            &p, bt, c->hs, c->ht, c->v, (kdloss_cmat){pr[0].pxs, c->dt, pr[0].ld_xs},
            (kdloss_cmat){pr[0].pws, c->dt, pr[0].ld_ws}, c->bias ? pr[0].pbias_s : NULL,
            (kdloss_cmat){pr[0].pxt, c->dt, pr[0].ld_xt},
            (kdloss_cmat){pr[j].pwt, c->dt, pr[j].ld_wt},
            c->bias ? pr[j].pbias_t : NULL, (kdloss_labels){lab, KDLOSS_I64}, &d, NULL, 0);
        ok = KT_CHECK(st == KDLOSS_OK, "split call head %d: status %d", j, (int)st);
        *loss += (double)o.loss * (double)nj / (double)n_all;
        for (int64_t i = 0; i < bt * c->hs; i++) dxs[i] += grad_at(o.dxs, c->dt, i);
        for (int64_t i = 0; i < c->v * c->hs; i++) dws[i] += grad_at(o.dws, c->dt, i);
        for (int64_t i = 0; c->bias && i < c->v; i++) dbs[i] += grad_at(o.dbs, c->dt, i);
        out_free(&o);
    }
    free(lab);
    return ok;
}

/* With per-row weights (some 0, the rest in [0.1, 3)): the combined call against the split calls
 * with the same weights (the float64 reference has no weights; test_fld_weights checks the
 * weighted loss itself). rx, rw, rb: scratch of the reference's sizes. */
static void check_weighted(const mt_case *c, kt_fld_problem *pr, const int32_t *idx,
                           const char *what, double *rx, double *rw, double *rb) {
    float *w = malloc(sizeof(float) * (size_t)c->bt);
    for (int64_t r = 0; r < c->bt; r++)
        w[r] = r % 7 == 3 ? 0.0f : (float)(0.1 + 0.97 * (double)(r % 3) + 0.01 * (double)r);
    g_weights = w;
    mt_out o;
    out_alloc(&o, c);
    kdloss_status st = run_multi(c, pr, idx, &o);
    double sl;
    if (KT_CHECK(st == KDLOSS_OK, "%s weighted: status %d", what, (int)st) &&
        run_split(c, pr, idx, &sl, rx, rw, rb)) {
        double stol = c->dt == KDLOSS_BF16 ? 2.0 * 0x1p-8 : 1e-6;
        kt_close(o.loss, sl, 1e-7, 1e-6, "%s weighted loss vs split calls", what);
        close_norm(o.dxs, c->dt, rx, c->bt * c->hs, stol, "weighted dxs vs split calls", what);
        close_norm(o.dws, c->dt, rw, c->v * c->hs, stol, "weighted dws vs split calls", what);
    }
    g_weights = NULL;
    out_free(&o);
    free(w);
}

static void check_case(kt_rng *rng, const mt_case *c, const char *isa) {
    kt_fld_problem pr[MAXH];
    for (int j = 0; j < c->heads; j++)
        kt_fld_problem_make(&pr[j], rng, c->bt, c->hs, c->ht, c->v, c->dt, c->dt, c->bias, 3.0,
                            j == 0 ? 4 : 0, -100, j == 0 ? 3 : 0);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)c->bt);
    make_index(rng, c, idx);
    int64_t nx = c->bt * c->hs, nw = c->v * c->hs;
    double *rx = malloc(sizeof(double) * (size_t)nx), *rw = malloc(sizeof(double) * (size_t)nw);
    double *rb = malloc(sizeof(double) * (size_t)c->v);
    double loss, soft, hard;
    reference(c, pr, idx, &loss, &soft, &hard, rx, rw, rb);
    mt_out o;
    out_alloc(&o, c);
    kdloss_status st = run_multi(c, pr, idx, &o);
    char what[160];
    snprintf(what, sizeof what, "%s heads %d bias %d pattern %d %s beta %g T %g chunk %lld", isa,
             c->heads, c->bias, c->pattern, kt_dtype_name(c->dt), c->beta, c->temperature,
             (long long)c->chunk);
    if (KT_CHECK(st == KDLOSS_OK, "%s: status %d (%s)", what, (int)st, kdloss_error_detail())) {
        double gtol = c->dt == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
        double ltol = c->dt == KDLOSS_BF16 ? 1e-3 : 1e-4;
        kt_close(o.loss, loss, 1e-6, ltol, "%s loss", what);
        kt_close(o.soft, soft, 1e-6, ltol, "%s soft", what);
        kt_close(o.hard, hard, 1e-6, ltol, "%s hard", what);
        close_norm(o.dxs, c->dt, rx, nx, gtol, "dxs vs float64", what);
        close_norm(o.dws, c->dt, rw, nw, gtol, "dws vs float64", what);
        if (c->bias) close_norm(o.dbs, c->dt, rb, c->v, gtol, "dbs vs float64", what);
        double sl;
        if (run_split(c, pr, idx, &sl, rx, rw, rb)) {
            /* the split calls' bf16 gradients are rounded per call, then summed */
            double stol = c->dt == KDLOSS_BF16 ? 2.0 * 0x1p-8 : 1e-6;
            kt_close(o.loss, sl, 1e-7, 1e-6, "%s loss vs split calls", what);
            close_norm(o.dxs, c->dt, rx, nx, stol, "dxs vs split calls", what);
            close_norm(o.dws, c->dt, rw, nw, stol, "dws vs split calls", what);
            if (c->bias) close_norm(o.dbs, c->dt, rb, c->v, stol, "dbs vs split calls", what);
        }
    }
    out_free(&o);
    check_weighted(c, pr, idx, what, rx, rw, rb);
    free(rx);
    free(rw);
    free(rb);
    free(idx);
    for (int j = 0; j < c->heads; j++) kt_fld_problem_free(&pr[j]);
}

/* One head of fp32 weights: the same bits as the single-teacher call (the same GEMMs). */
static void check_one_head_bitwise(kt_rng *rng, const char *isa) {
    mt_case c = {23, 16, 24, 300, 4, 1, 1, 0, KDLOSS_F32, 0.5, 1.0};
    kt_fld_problem pr;
    kt_fld_problem_make(&pr, rng, c.bt, c.hs, c.ht, c.v, c.dt, c.dt, 1, 3.0, 4, -100, 0);
    int32_t *idx = calloc((size_t)c.bt, sizeof(int32_t));
    mt_out a, b;
    out_alloc(&a, &c);
    out_alloc(&b, &c);
    kdloss_status s1 = run_multi(&c, &pr, idx, &a);
    kdloss_fused_linear_distill_params p = params_of(&c, pr.ignore_index, 1.0);
    kdloss_fused_linear_distill_out d = out_view(&b, c.dt, 1);
    kdloss_status s2 = kdloss_fused_linear_distill(
        &p, c.bt, c.hs, c.ht, c.v, (kdloss_cmat){pr.pxs, c.dt, 0}, (kdloss_cmat){pr.pws, c.dt, 0},
        pr.pbias_s, (kdloss_cmat){pr.pxt, c.dt, 0}, (kdloss_cmat){pr.pwt, c.dt, 0}, pr.pbias_t,
        (kdloss_labels){pr.labels, KDLOSS_I64}, &d, NULL, 0);
    KT_CHECK(s1 == KDLOSS_OK && s2 == KDLOSS_OK, "%s one head: status %d %d", isa, s1, s2);
    KT_CHECK(a.loss == b.loss && !memcmp(a.dxs, b.dxs, sizeof(float) * (size_t)(c.bt * c.hs)) &&
                 !memcmp(a.dws, b.dws, sizeof(float) * (size_t)(c.v * c.hs)) &&
                 !memcmp(a.row_soft, b.row_soft, sizeof(float) * (size_t)c.bt),
             "%s one head: not bitwise the single-teacher call (loss %.9g vs %.9g)", isa, a.loss,
             b.loss);
    out_free(&a);
    out_free(&b);
    free(idx);
    kt_fld_problem_free(&pr);
}

/* Each refused call leaves every output as it was (poisoned here). */
static void expect_refused(const char *what, kdloss_status want,
                           const kdloss_fused_linear_distill_params *p,
                           const mt_case *c, kt_fld_problem *pr, const kdloss_teacher_heads *h,
                           mt_out *o) {
    kt_poison(o->dxs, c->bt * c->hs, KDLOSS_F32);
    kt_poison(o->row_soft, c->bt, KDLOSS_F32);
    kt_poison(&o->loss, 1, KDLOSS_F32);
    kdloss_fused_linear_distill_out d = out_view(o, KDLOSS_F32, 0);
    kdloss_status st = kdloss_fused_linear_distill_multi(
        p, c->bt, c->hs, c->ht, c->v, (kdloss_cmat){pr->pxs, KDLOSS_F32, pr->ld_xs},
        (kdloss_cmat){pr->pws, KDLOSS_F32, pr->ld_ws}, NULL,
        (kdloss_cmat){pr->pxt, KDLOSS_F32, pr->ld_xt}, h,
        (kdloss_labels){pr->labels, KDLOSS_I64}, &d, NULL, 0);
    KT_CHECK(st == want, "%s: status %d, want %d (%s)", what, (int)st, (int)want,
             kdloss_error_detail());
    KT_CHECK(kt_is_poison(o->dxs, c->bt * c->hs, KDLOSS_F32) &&
                 kt_is_poison(o->row_soft, c->bt, KDLOSS_F32) &&
                 kt_is_poison(&o->loss, 1, KDLOSS_F32),
             "%s: an output was written", what);
}

static void check_errors(kt_rng *rng) {
    mt_case c = {12, 8, 8, 40, 0, 2, 0, 1, KDLOSS_F32, 0.5, 1.0};
    kt_fld_problem pr, other;
    kt_fld_problem_make(&pr, rng, c.bt, c.hs, c.ht, c.v, c.dt, c.dt, 0, 3.0, 4, -100, 0);
    kt_fld_problem_make(&other, rng, c.bt, c.hs, c.ht, c.v, c.dt, KDLOSS_BF16, 0, 3.0, 0, -100, 0);
    int32_t idx[12];
    make_index(rng, &c, idx);
    kdloss_cmat wt[2] = {{pr.pwt, KDLOSS_F32, 0}, {pr.pwt, KDLOSS_F32, 0}};
    kdloss_teacher_heads h = {2, wt, NULL, idx};
    kdloss_fused_linear_distill_params p = params_of(&c, pr.ignore_index, 1.0);
    mt_out o;
    out_alloc(&o, &c);
    expect_refused("NULL teachers", KDLOSS_ERR_NULL_POINTER, &p, &c, &pr, NULL, &o);
    kdloss_teacher_heads z = h;
    z.n = 0;
    expect_refused("no head", KDLOSS_ERR_INVALID_PARAM, &p, &c, &pr, &z, &o);
    z = h;
    z.index = NULL;
    expect_refused("NULL index", KDLOSS_ERR_NULL_POINTER, &p, &c, &pr, &z, &o);
    int32_t bad[12];
    memcpy(bad, idx, sizeof bad);
    bad[1] = 2; /* row 1 is ignored (ignore_every 4): its index is checked all the same */
    z = h;
    z.index = bad;
    expect_refused("index 2 of 2 heads in an ignored row", KDLOSS_ERR_INVALID_ID, &p, &c, &pr, &z,
                   &o);
    bad[1] = -1;
    expect_refused("index -1", KDLOSS_ERR_INVALID_ID, &p, &c, &pr, &z, &o);
    kdloss_cmat wt2[2] = {{pr.pwt, KDLOSS_F32, 0}, {other.pwt, KDLOSS_BF16, 0}};
    z = h;
    z.wt = wt2;
    expect_refused("a bf16 head beside fp32 xt", KDLOSS_ERR_INVALID_DTYPE, &p, &c, &pr, &z, &o);
    /* the index vector inside row_soft: an input the call would overwrite */
    int32_t *alias = (int32_t *)o.row_soft;
    memcpy(alias, idx, sizeof idx);
    z = h;
    z.index = alias;
    kdloss_fused_linear_distill_out d = out_view(&o, KDLOSS_F32, 0);
    kdloss_status st = kdloss_fused_linear_distill_multi(
        &p, c.bt, c.hs, c.ht, c.v, (kdloss_cmat){pr.pxs, KDLOSS_F32, 0},
        (kdloss_cmat){pr.pws, KDLOSS_F32, 0}, NULL, (kdloss_cmat){pr.pxt, KDLOSS_F32, 0}, &z,
        (kdloss_labels){pr.labels, KDLOSS_I64}, &d, NULL, 0);
    KT_CHECK(st == KDLOSS_ERR_ALIASING && !memcmp(alias, idx, sizeof idx),
             "index over row_soft: status %d, want ALIASING, index unchanged", (int)st);
    out_free(&o);
    kt_fld_problem_free(&pr);
    kt_fld_problem_free(&other);
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    const int quick = kt_quick();
    const mt_case cases[] = {
        {29, 16, 24, 300, 3, 2, 0, 0, KDLOSS_F32, 0.5, 1.0},
        {29, 16, 24, 300, 3, 3, 1, 1, KDLOSS_F32, 0.0, 2.0},
        {31, 8, 12, 517, 0, 3, 1, 2, KDLOSS_F32, 1.0, 1.0},
        {29, 16, 24, 300, 4, 2, 1, 2, KDLOSS_BF16, 0.5, 2.0},
        {17, 16, 16, 1000, 3, 3, 0, 1, KDLOSS_BF16, 1.0, 1.0},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    KT_FOR_EACH_ISA(it, "") {
        for (int i = 0; i < n; i++)
            if (!quick || i % 2 == 0) check_case(&rng, &cases[i], it.name);
        check_one_head_bitwise(&rng, it.name);
    }
    check_errors(&rng);
    return kt_finish("test_fld_multi");
}
