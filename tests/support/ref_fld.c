#include "ref_fld.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "ref_fld: out of memory\n");
        exit(2);
    }
    return p;
}

void kt_ref_logits(int64_t bt, int64_t h, int64_t v, const double *x, const double *w,
                   const double *b, double *z) {
    /* z[i][c] = b[c] + sum_k x[i][k] w[c][k], with w transposed first so the inner loop runs
     * along c (each z element still sums k in order); 8 rows share each row of w^T. */
    double *wt = xcalloc((size_t)(h * v), sizeof(double));
    for (int64_t c = 0; c < v; c++)
        for (int64_t k = 0; k < h; k++) wt[k * v + c] = w[c * h + k];
    for (int64_t i0 = 0; i0 < bt; i0 += 8) {
        int64_t i1 = i0 + 8 < bt ? i0 + 8 : bt;
        for (int64_t i = i0; i < i1; i++)
            for (int64_t c = 0; c < v; c++) z[i * v + c] = b ? b[c] : 0.0;
        for (int64_t k = 0; k < h; k++)
            for (int64_t i = i0; i < i1; i++) {
                double xik = x[i * h + k];
                double *zi = z + i * v;
                const double *wk = wt + k * v;
                for (int64_t c = 0; c < v; c++) zi[c] += xik * wk[c];
            }
    }
    free(wt);
}

/* One element of JSD(beta) on student log-prob x and teacher log-prob y; *g = d/dx.
 *   M = beta P + (1-beta) Q, JSD = beta P (y - log M) + (1-beta) Q (x - log M)
 *   d/dx = (1-beta) Q (x - log M)   (the d log M / dx terms cancel)
 * beta = 0 and 1 are the forward and reverse KL; a zero-weight term is 0 (0 log 0 = 0). */
static double jsd_elem(double beta, double x, double y, double *g) {
    double p = exp(y), q = exp(x);
    if (beta == 0.0) {
        *g = -p;
        return p > 0.0 ? p * (y - x) : 0.0;
    }
    if (beta == 1.0) {
        *g = q > 0.0 ? q * (x - y + 1.0) : 0.0;
        return q > 0.0 ? q * (x - y) : 0.0;
    }
    double a = log(beta) + y, b = log1p(-beta) + x; /* log of the two mixture parts */
    double m = fmax(a, b), log_m = m + log(exp(a - m) + exp(b - m));
    double ta = beta * p > 0.0 ? beta * p * (y - log_m) : 0.0;
    double tb = (1.0 - beta) * q > 0.0 ? (1.0 - beta) * q * (x - log_m) : 0.0;
    *g = tb;
    return ta + tb;
}

void kt_ref_fld_dz(const kt_fld_cfg *cf, int64_t bt, int64_t v, const double *zs,
                   const double *zt, const int64_t *labels, double *loss, double *soft,
                   double *hard, double *dz, double *dz_mag) {
    double *x = xcalloc((size_t)v, sizeof(double)), *y = xcalloc((size_t)v, sizeof(double));
    double *g = xcalloc((size_t)v, sizeof(double)), *lp = xcalloc((size_t)v, sizeof(double));
    int64_t n_valid = 0;
    for (int64_t i = 0; i < bt; i++) n_valid += labels[i] != cf->ignore_index;
    double n = n_valid > 0 ? (double)n_valid : 1.0, t = cf->temperature;
    double soft_sum = 0.0, hard_sum = 0.0;
    for (int64_t i = 0; i < bt; i++) {
        const double *zsi = zs + i * v, *zti = zt + i * v;
        if (labels[i] == cf->ignore_index) {
            if (dz) memset(dz + i * v, 0, (size_t)v * sizeof(double));
            if (dz_mag) memset(dz_mag + i * v, 0, (size_t)v * sizeof(double));
            continue;
        }
        ref_log_softmax(zsi, v, t, x);
        ref_log_softmax(zti, v, t, y);
        ref_log_softmax(zsi, v, 1.0, lp); /* untempered, for the cross-entropy */
        double sg = 0.0;
        for (int64_t c = 0; c < v; c++) {
            soft_sum += jsd_elem(cf->beta, x[c], y[c], &g[c]);
            sg += g[c];
        }
        hard_sum -= lp[labels[i]];
        if (!dz) continue;
        /* d/dzs of w_hard CE + w_soft JSD, through log_softmax:
         *   CE: softmax(zs) - onehot;  JSD: (1/T) (g - softmax(zs/T) sum(g)) */
        for (int64_t c = 0; c < v; c++) {
            double dh = exp(lp[c]) - (c == labels[i] ? 1.0 : 0.0);
            double ds = (g[c] - exp(x[c]) * sg) / t;
            dz[i * v + c] = cf->grad_scale * (cf->w_hard * dh + cf->w_soft * ds) / n;
            if (!dz_mag) continue;
            double mh = exp(lp[c]) + (c == labels[i] ? 1.0 : 0.0);
            double ms = (fabs(g[c]) + exp(x[c]) * (fabs(sg) + 1.0)) / t;
            dz_mag[i * v + c] = fabs(cf->grad_scale) * (cf->w_hard * mh + cf->w_soft * ms) / n;
        }
    }
    *soft = soft_sum / n;
    *hard = hard_sum / n;
    *loss = cf->w_hard * *hard + cf->w_soft * *soft;
    free(x);
    free(y);
    free(g);
    free(lp);
}

void kt_ref_fld_grads(int64_t bt, int64_t hs, int64_t v, const double *dz, const double *xs,
                      const double *ws, int absolute, int64_t stride, double *dxs, double *dws,
                      double *dbs) {
    double *ax = NULL, *aw = NULL;
    if (absolute) {
        ax = xcalloc((size_t)(bt * hs), sizeof(double));
        aw = xcalloc((size_t)(v * hs), sizeof(double));
        for (int64_t i = 0; i < bt * hs; i++) ax[i] = fabs(xs[i]);
        for (int64_t i = 0; i < v * hs; i++) aw[i] = fabs(ws[i]);
        xs = ax;
        ws = aw;
    }
    /* Blocks of 8 output rows share each streamed row of the other operand; every element
     * still sums its terms in index order. */
    if (dxs) { /* dxs[i][k] = sum_c dz[i][c] ws[c][k] */
        memset(dxs, 0, (size_t)(bt * hs) * sizeof(double));
        for (int64_t i0 = 0; i0 < bt; i0 += 8 * stride)
            for (int64_t c = 0; c < v; c++)
                for (int64_t i = i0; i < i0 + 8 * stride && i < bt; i += stride) {
                    double d = dz[i * v + c];
                    for (int64_t k = 0; k < hs; k++) dxs[i * hs + k] += d * ws[c * hs + k];
                }
    }
    if (dws) { /* dws[c][k] = sum_i dz[i][c] xs[i][k] */
        memset(dws, 0, (size_t)(v * hs) * sizeof(double));
        for (int64_t c0 = 0; c0 < v; c0 += 8 * stride)
            for (int64_t i = 0; i < bt; i++)
                for (int64_t c = c0; c < c0 + 8 * stride && c < v; c += stride) {
                    double d = dz[i * v + c];
                    for (int64_t k = 0; k < hs; k++) dws[c * hs + k] += d * xs[i * hs + k];
                }
    }
    if (dbs) {
        for (int64_t c = 0; c < v; c++) dbs[c] = 0.0;
        for (int64_t i = 0; i < bt; i++)
            for (int64_t c = 0; c < v; c++) dbs[c] += dz[i * v + c];
    }
    free(ax);
    free(aw);
}

/* ---- test problems ---- */

/* n values drawn N(0, sd^2) and rounded to what dt holds. */
static double *normal_vec(kt_rng *rng, int64_t n, double sd, kdloss_dtype dt) {
    double *x = xcalloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++) x[i] = sd * kt_normal(rng);
    kt_round_to(x, n, dt);
    return x;
}

void kt_fld_problem_make(kt_fld_problem *p, kt_rng *rng, int64_t bt, int64_t hs, int64_t ht,
                         int64_t v, kdloss_dtype ds, kdloss_dtype dt, int bias, double scale,
                         int ignore_every, int64_t ignore_index, int64_t pad) {
    memset(p, 0, sizeof(*p));
    p->bt = bt;
    p->hs = hs;
    p->ht = ht;
    p->v = v;
    p->ds = ds;
    p->dt = dt;
    p->ignore_index = ignore_index;
    /* x ~ N(0,1), w ~ N(0, scale^2 / H): logits ~ N(0, scale^2) (plus the bias) */
    p->xs = normal_vec(rng, bt * hs, 1.0, ds);
    p->ws = normal_vec(rng, v * hs, scale / sqrt((double)hs), ds);
    p->xt = normal_vec(rng, bt * ht, 1.0, dt);
    p->wt = normal_vec(rng, v * ht, scale / sqrt((double)ht), dt);
    if (bias) {
        p->bias_s = normal_vec(rng, v, 1.0, ds);
        p->bias_t = normal_vec(rng, v, 1.0, dt);
    }
    p->labels = xcalloc((size_t)bt, sizeof(int64_t));
    p->labels32 = xcalloc((size_t)bt, sizeof(int32_t));
    for (int64_t r = 0; r < bt; r++) {
        int ign = ignore_every == 1 || (ignore_every > 1 && r % ignore_every == 1);
        p->labels[r] = ign ? ignore_index : kt_randint(rng, v);
        p->labels32[r] = (int32_t)p->labels[r];
    }
    p->ld_xs = hs + pad;
    p->ld_ws = hs + pad;
    p->ld_xt = ht + pad;
    p->ld_wt = ht + pad;
    p->pxs = kt_pack(p->xs, bt, hs, p->ld_xs, ds);
    p->pws = kt_pack(p->ws, v, hs, p->ld_ws, ds);
    p->pxt = kt_pack(p->xt, bt, ht, p->ld_xt, dt);
    p->pwt = kt_pack(p->wt, v, ht, p->ld_wt, dt);
    if (bias) {
        p->pbias_s = kt_pack(p->bias_s, 1, v, v, ds);
        p->pbias_t = kt_pack(p->bias_t, 1, v, v, dt);
    }
}

void kt_fld_problem_free(kt_fld_problem *p) {
    void *all[] = {p->xs, p->ws, p->bias_s, p->xt, p->wt, p->bias_t, p->labels, p->labels32,
                   p->pxs, p->pws, p->pbias_s, p->pxt, p->pwt, p->pbias_t};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    memset(p, 0, sizeof(*p));
}
