/* Shared by the fused-linear JSD tests: run the library on a kt_fld_problem with fresh,
 * poisoned, padded outputs, compare outputs with the reference or with each other.
 * Header-only (static functions) because every tests/test_*.c is its own program. */
#ifndef KDLOSS_FLD_COMMON_H
#define KDLOSS_FLD_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss.h"
#include "ref_fld.h"
#include "testutil.h"

/* What one library call produced. Gradient buffers carry padding (ld > cols) that must keep
 * its poison. */
typedef struct fl_res {
    kdloss_status st;
    float loss, soft, hard;
    void *dxs, *dws, *dbs; /* NULL when not asked for */
    int64_t ld_dxs, ld_dws;
} fl_res;

static void fl_res_free(fl_res *r) {
    free(r->dxs);
    free(r->dws);
    free(r->dbs);
    memset(r, 0, sizeof(*r));
}

static void *fl_poisoned(int64_t n, kdloss_dtype dt) {
    void *b = malloc((size_t)n * kdloss_dtype_size(dt) + 16);
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    kt_poison(b, n, dt);
    return b;
}

/* Calls kdloss_fused_linear_jsd on p with every output (grad = 0: the three losses only;
 * dbs only when p has a bias). */
static fl_res fl_run(const kt_fld_problem *p, const kdloss_fljsd_params *prm, int grad,
                     int label32, void *workspace, size_t workspace_bytes) {
    fl_res r;
    memset(&r, 0, sizeof(r));
    kt_poison(&r.loss, 1, KDLOSS_F32);
    kt_poison(&r.soft, 1, KDLOSS_F32);
    kt_poison(&r.hard, 1, KDLOSS_F32);
    kdloss_fljsd_out o;
    memset(&o, 0, sizeof(o));
    o.loss = &r.loss;
    o.soft_loss = &r.soft;
    o.hard_loss = &r.hard;
    if (grad) {
        r.ld_dxs = p->hs + 2;
        r.ld_dws = p->hs + 1;
        r.dxs = fl_poisoned(p->bt * r.ld_dxs, p->ds);
        r.dws = fl_poisoned(p->v * r.ld_dws, p->ds);
        o.dxs = (kdloss_mat){r.dxs, p->ds, r.ld_dxs};
        o.dws = (kdloss_mat){r.dws, p->ds, r.ld_dws};
        if (p->bias_s) o.dbs = r.dbs = fl_poisoned(p->v, p->ds);
    }
    kdloss_cmat xs = {p->pxs, p->ds, p->ld_xs}, ws = {p->pws, p->ds, p->ld_ws};
    kdloss_cmat xt = {p->pxt, p->dt, p->ld_xt}, wt = {p->pwt, p->dt, p->ld_wt};
    kdloss_labels lab = {label32 ? (const void *)p->labels32 : (const void *)p->labels,
                         label32 ? KDLOSS_I32 : KDLOSS_I64};
    r.st = kdloss_fused_linear_jsd(prm, p->bt, p->hs, p->ht, p->v, xs, ws, p->pbias_s, xt, wt, p->pbias_t,
                                   lab, &o, workspace, workspace_bytes);
    return r;
}

/* The padding columns [cols, ld) of every row still hold the poison. */
static int fl_padding_intact(const void *m, kdloss_dtype dt, int64_t rows, int64_t cols,
                             int64_t ld) {
    size_t es = kdloss_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++) {
        /* kt_poison's pattern depends on the byte offset modulo the element size only */
        if (!kt_is_poison((const char *)m + (size_t)(r * ld + cols) * es, ld - cols, dt)) return 0;
    }
    return 1;
}

/* fp32 exps underflow below 2^-126 and the terms they drop are lost; 1e-30 absolute covers
 * any sum of such terms times weights, and is far below every gradient scale the tests see. */
#define FL_ATOL 1e-30

/* Largest error seen by fl_cmp_mat on fp32 outputs, as a fraction of its bound (printed at the
 * end); bf16 outputs are not counted: their cast alone takes up to 2^-8 |want|, all of rtol. */
static double fl_worst_seen = 0.0;

/* got (rows x cols, ld, dtype dt) against want (contiguous double), elementwise:
 * |got - want| <= tol * mag + rtol * |want| + FL_ATOL, mag the element's error scale from the
 * reference (kt_ref_fld_grads with absolute = 1), on rows r % stride == 0. One check
 * per matrix; the worst element is reported. */
static void fl_cmp_mat(const char *ctx, const char *name, const void *got, kdloss_dtype dt,
                       int64_t ld, const double *want, const double *mag, int64_t rows,
                       int64_t cols, int64_t stride, double tol, double rtol) {
    int64_t bad = 0, wr = 0, wc = 0;
    double worst = -1.0;
    for (int64_t r = 0; r < rows; r += stride)
        for (int64_t c = 0; c < cols; c++) {
            double g = kt_get(got, dt, ld, r, c), w = want[r * cols + c];
            double lim = tol * mag[r * cols + c] + rtol * fabs(w) + FL_ATOL;
            double err = fabs(g - w) / lim;
            if (!(err <= 1.0)) bad++;
            if (!(err <= worst)) { /* NaN counts as worst */
                worst = err;
                wr = r;
                wc = c;
            }
        }
    if (dt == KDLOSS_F32 && worst > fl_worst_seen) fl_worst_seen = worst;
    if (getenv("FL_DEBUG") && worst > 0.2) /* FL_DEBUG=1: show every matrix near its bound */
        printf("DBG %s %s: %.3g of the bound at (%lld,%lld) got %.9g want %.9g mag %.3g\n", ctx,
               name, worst, (long long)wr, (long long)wc, kt_get(got, dt, ld, wr, wc),
               want[wr * cols + wc], mag[wr * cols + wc]);
    KT_CHECK(bad == 0, "%s %s: %lld of %lld elements off; worst (%lld,%lld) got %.9g want %.9g "
             "mag %.3g (%.3g of the bound)", ctx, name, (long long)bad,
             (long long)((rows + stride - 1) / stride * cols),
             (long long)wr, (long long)wc, kt_get(got, dt, ld, wr, wc), want[wr * cols + wc],
             mag[wr * cols + wc], worst);
    if (ld > cols) KT_CHECK(fl_padding_intact(got, dt, rows, cols, ld), "%s %s: padding written",
                            ctx, name);
}

/* Largest |a - b| / max|b| over two library outputs of the same shape. */
static double fl_rel_diff(const void *a, const void *b, kdloss_dtype dt, int64_t ld, int64_t rows,
                          int64_t cols) {
    double mx = 0.0, d = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double x = kt_get(a, dt, ld, r, c), y = kt_get(b, dt, ld, r, c);
            mx = fmax(mx, fabs(y));
            d = fmax(d, fabs(x - y));
            if (isnan(x) || isnan(y)) d = INFINITY;
        }
    return mx > 0.0 ? d / mx : d;
}

/* Bitwise equality of two results of the same problem. */
static int fl_same_bits(const kt_fld_problem *p, const fl_res *a, const fl_res *b) {
    if (memcmp(&a->loss, &b->loss, 4) || memcmp(&a->soft, &b->soft, 4) ||
        memcmp(&a->hard, &b->hard, 4))
        return 0;
    size_t es = kdloss_dtype_size(p->ds);
    if (!a->dxs != !b->dxs || !a->dbs != !b->dbs) return 0;
    if (a->dxs && memcmp(a->dxs, b->dxs, (size_t)(p->bt * a->ld_dxs) * es)) return 0;
    if (a->dws && memcmp(a->dws, b->dws, (size_t)(p->v * a->ld_dws) * es)) return 0;
    if (a->dbs && memcmp(a->dbs, b->dbs, (size_t)p->v * es)) return 0;
    return 1;
}

#endif
