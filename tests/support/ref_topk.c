#include "ref_topk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "ref_topk: out of memory\n");
        exit(2);
    }
    return p;
}

/* |log w| + |log(1 - w)| of the mixture weight (0 without one): the constants the mixtures add
 * to their log-differences (as test_distill_logits counts them). */
static double log_weights(const kdloss_div_params *d) {
    double w = d->divergence == KDLOSS_DIV_JSD            ? d->beta
               : d->divergence == KDLOSS_DIV_SKEW_FORWARD_KL ||
                       d->divergence == KDLOSS_DIV_SKEW_REVERSE_KL
                   ? d->alpha
                   : 0.0;
    return w > 0 && w < 1 ? fabs(log(w)) + fabs(log1p(-w)) : 0.0;
}

/* log sum_j exp(u_j) over the columns with mask[j] == want (mask NULL: all); -inf if none. */
static double lse_cols(const double *u, int64_t v, const unsigned char *mask, int want) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < v; j++)
        if (!mask || mask[j] == want) m = fmax(m, u[j]);
    if (m == -INFINITY) return -INFINITY;
    for (int64_t j = 0; j < v; j++)
        if (!mask || mask[j] == want) s += exp(u[j] - m);
    return m + log(s);
}

/* log sum_k exp(a_k) of n values as max + log1p(sum of the others' exp(a - max)): accurate
 * to a few units of 2^-53 in absolute terms where the sum is near 1, which is where the
 * teacher's tail 1 - sum P (formed from it by -expm1) needs it. -inf when every a_k is -inf. */
static double lse_log1p(const double *a, int n) {
    int im = -1;
    for (int k = 0; k < n; k++)
        if (a[k] > -INFINITY && (im < 0 || a[k] > a[im])) im = k;
    if (im < 0) return -INFINITY;
    double s = 0.0;
    for (int k = 0; k < n; k++)
        if (k != im) s += exp(a[k] - a[im]);
    return a[im] + log1p(s);
}

ref_topk_row_out ref_topk_row(const kdloss_div_params *d, kdloss_topk_tail tail, const double *z,
                              int64_t v, const int64_t *ids, const double *lp, int64_t k, double t,
                              double *dz, double *dz_mag, double *dz_cond) {
    ref_topk_row_out o = {0.0, 0.0, 0.0, 0, 0};
    for (int64_t j = 0; j < v; j++) {
        if (dz) dz[j] = 0.0;
        if (dz_mag) dz_mag[j] = 0.0;
        if (dz_cond) dz_cond[j] = 0.0;
    }
    /* S: the used slots, in slot order */
    int n = 0;
    int64_t *sid = xcalloc((size_t)k, sizeof(int64_t));
    double *slp = xcalloc((size_t)k, sizeof(double));
    for (int64_t s = 0; s < k; s++)
        if (ids[s] != -1) sid[n] = ids[s], slp[n] = lp[s], n++;
    o.n_used = n;
    if (n == 0) {
        free(sid), free(slp);
        return o;
    }
    double *u = xcalloc((size_t)v, sizeof(double));
    unsigned char *in_s = xcalloc((size_t)v, 1);
    int *bin_of = xcalloc((size_t)v, sizeof(int));
    for (int64_t j = 0; j < v; j++) u[j] = z[j] / t, bin_of[j] = -1;
    for (int b = 0; b < n; b++) in_s[sid[b]] = 1, bin_of[sid[b]] = b;

    double lse_all = lse_cols(u, v, NULL, 0);   /* L */
    double lse_in = lse_cols(u, v, in_s, 1);    /* lse(u_S) */
    double lse_rest = lse_cols(u, v, in_s, 0);  /* R, -inf when S holds every column */
    int has_tail = tail == KDLOSS_TAIL_BUCKET && n < v;
    int dom_is_s = tail == KDLOSS_TAIL_RENORM_BOTH;
    double norm = dom_is_s ? lse_in : lse_all;  /* the domain's normalizer */
    double lse_p = lse_log1p(slp, n);           /* log sum_S P */
    o.has_tail = has_tail;
    if (tail != KDLOSS_TAIL_BUCKET && lse_p == -INFINITY) { /* 0/0: undefined */
        o.loss = NAN;
        for (int64_t j = 0; j < v; j++)
            if (dz) dz[j] = NAN;
        free(sid), free(slp), free(u), free(in_s), free(bin_of);
        return o;
    }
    int nb = n + has_tail;
    double *x = xcalloc((size_t)nb, sizeof(double)), *y = xcalloc((size_t)nb, sizeof(double));
    double *lse_b = xcalloc((size_t)nb, sizeof(double)), *g = xcalloc((size_t)nb, sizeof(double));
    double *gm = xcalloc((size_t)nb, sizeof(double)), *gc = xcalloc((size_t)nb, sizeof(double));
    double dy_tail = 0.0;
    for (int b = 0; b < n; b++) {
        lse_b[b] = u[sid[b]];
        x[b] = u[sid[b]] - norm;
        y[b] = tail == KDLOSS_TAIL_BUCKET ? slp[b] : slp[b] - lse_p;
    }
    if (has_tail) {
        double tp = -expm1(lse_p); /* 1 - sum_S P */
        lse_b[n] = lse_rest;
        x[n] = lse_rest - lse_all;
        y[n] = log(fmax(tp, REF_TOPK_TAIL_FLOOR));
        /* spread of y_tail from the double evaluation of tp (see ref_topk.h) */
        double dt = (n + 2) * 0x1p-52;
        double ylo = log(fmax(tp - dt, REF_TOPK_TAIL_FLOOR));
        double yhi = log(fmax(tp + dt, REF_TOPK_TAIL_FLOOR));
        dy_tail = fmax(yhi - y[n], y[n] - ylo);
    }
    double lw = log_weights(d), loss = 0.0, mag = 0.0, cond = 0.0;
    double G = 0.0, GM = 0.0, GC = 0.0;
    for (int b = 0; b < nb; b++) {
        double m, l = ref_div_elem(d, x[b], y[b], &g[b], &m);
        /* ref_div_elem's m weighs both log-probs by both weights, so it is infinite for a
         * teacher log-prob of -inf against a positive Q even where the term is finite (JSD,
         * skew reverse KL: M >= w Q). A -inf log-prob has weight 0: only finite ones count. */
        double w = exp(x[b]) + exp(y[b]);
        double e = 2.0 + (isfinite(x[b]) ? fabs(x[b]) : 0.0) + (isfinite(y[b]) ? fabs(y[b]) : 0.0) + lw;
        loss += l;
        mag += fabs(l) + 2.0 * ref_wmul(w, e);
        gm[b] = fabs(g[b]) + ref_wmul(w, e);
        if (b == n) { /* the tail bin: |de/dy| and |dg/dy| are at most w e, with w the largest
                         weight over y's spread: P_tail itself is only known within (n + 2) 2^-52,
                         so a tail far below that can come out as large as the spread */
            double whi = exp(x[b]) + exp(y[b] + dy_tail);
            cond += ref_wmul(ref_wmul(whi, e), dy_tail);
            gc[b] += ref_wmul(ref_wmul(whi, e), dy_tail);
        }
        if (d->divergence == KDLOSS_DIV_TVD &&
            fabs(x[b] - y[b]) <= 64 * 0x1p-24 * (2.0 + fabs(x[b]) + fabs(y[b])))
            gc[b] += exp(x[b]); /* either side of the kink: g within [-Q/2, Q/2] */
        G += g[b], GM += gm[b], GC += gc[b];
    }
    o.loss = loss, o.mag = mag, o.cond = cond;
    for (int64_t j = 0; j < v; j++) {
        int b = bin_of[j];
        if (b < 0 && has_tail) b = n;
        double gj = 0.0, mj = 0.0, cj = 0.0;
        if (b >= 0) { /* j in bin b: g_b exp(u_j - lse_b) */
            double lw_j = u[j] - lse_b[b], wj = exp(lw_j);
            gj += g[b] * wj;
            mj += wj * gm[b] * (2.0 + fabs(lw_j));
            cj += wj * gc[b];
        }
        if (!dom_is_s || in_s[j]) { /* j in the domain: - Q_j G */
            double xj = u[j] - norm, qj = exp(xj);
            gj -= qj * G;
            mj += qj * (GM + fabs(G) * (2.0 + fabs(xj)));
            cj += qj * GC;
        }
        if (dz) dz[j] = gj / t;
        if (dz_mag) dz_mag[j] = mj / t;
        if (dz_cond) dz_cond[j] = cj / t;
    }
    free(sid), free(slp), free(u), free(in_s), free(bin_of);
    free(x), free(y), free(lse_b), free(g), free(gm), free(gc);
    return o;
}

void ref_topk_fused(const ref_topk_cfg *c, int64_t bt, int64_t v, int64_t k, const double *zs,
                    const int64_t *ids, const double *lp, const int64_t *labels,
                    ref_topk_fused_out *out, ref_topk_fused_row *rows, double *dz,
                    double *dz_mag, double *dz_cond) {
    int64_t n_valid = 0;
    for (int64_t r = 0; r < bt; r++) n_valid += !labels || labels[r] != c->ignore_index;
    double den = n_valid ? (double)n_valid : 1.0, t = c->temperature;
    double f = c->t2_scale ? t * t : 1.0, gs = c->grad_scale / den, ags = fabs(gs);
    double soft_sum = 0.0, hard_sum = 0.0;
    double *ds = xcalloc((size_t)v, sizeof(double)), *dm = xcalloc((size_t)v, sizeof(double));
    double *dc = xcalloc((size_t)v, sizeof(double));
    for (int64_t r = 0; r < bt; r++) {
        const double *z = zs + r * v;
        int keep = !labels || labels[r] != c->ignore_index;
        ref_topk_fused_row ri = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        if (keep) {
            ref_topk_row_out ro =
                ref_topk_row(&c->div, c->tail, z, v, ids + r * k, lp + r * k, k, t, ds, dm, dc);
            ri.soft = ro.loss, ri.soft_mag = ro.mag, ri.soft_cond = ro.cond;
            for (int64_t j = 0; j < v; j++) ri.soft_sens += dm[j];
            ri.lse = lse_cols(z, v, NULL, 0);
            if (labels) ri.hard = ri.lse - z[labels[r]];
            soft_sum += ri.soft, hard_sum += ri.hard;
        }
        if (rows) rows[r] = ri;
        for (int64_t j = 0; j < v; j++) {
            double gj = 0.0, mj = 0.0, cj = 0.0;
            if (keep) {
                double p = labels ? exp(z[j] - ri.lse) : 0.0;
                double oh = labels && j == labels[r] ? 1.0 : 0.0;
                gj = gs * (c->w_hard * (p - oh) + c->w_soft * f * ds[j]);
                mj = ags * (c->w_hard * (p + oh) + c->w_soft * f * dm[j]);
                cj = ags * c->w_soft * f * dc[j];
            }
            if (dz) dz[r * v + j] = gj;
            if (dz_mag) dz_mag[r * v + j] = mj;
            if (dz_cond) dz_cond[r * v + j] = cj;
        }
    }
    out->n_valid = n_valid;
    out->soft = f * soft_sum / den;
    out->hard = hard_sum / den;
    out->loss = (c->w_hard * hard_sum + c->w_soft * f * soft_sum) / den;
    free(ds), free(dm), free(dc);
}

void ref_topk_logit_err(int64_t bt, int64_t h, int64_t v, const double *x, const double *w,
                        const double *b, double *err) {
    for (int64_t r = 0; r < bt; r++) {
        double worst = 0.0;
        for (int64_t c = 0; c < v; c++) {
            double s = b ? fabs(b[c]) : 0.0;
            for (int64_t k = 0; k < h; k++) s += fabs(x[r * h + k]) * fabs(w[c * h + k]);
            worst = fmax(worst, s);
        }
        err[r] = (double)(h + 1) * 0x1p-24 * worst;
    }
}

void ref_topk_fused_tols(const ref_topk_cfg *c, int64_t bt, int64_t v, const double *zs,
                         const int64_t *labels, const ref_topk_fused_out *o,
                         const ref_topk_fused_row *rows, const double *err, ref_topk_tols *t,
                         double *row_soft_tol, double *row_hard_tol, double *row_lse_tol) {
    const double u = 0x1p-24;
    double fs = c->t2_scale ? c->temperature * c->temperature : 1.0, ss = 0.0, sh = 0.0;
    double den = o->n_valid ? (double)o->n_valid : 1.0;
    for (int64_t r = 0; r < bt; r++) {
        const ref_topk_fused_row *ri = &rows[r];
        int keep = !labels || labels[r] != c->ignore_index;
        double zy = labels && keep ? fabs(zs[r * v + labels[r]]) : 0.0;
        double ts = keep ? 256 * u * ri->soft_mag + ri->soft_cond + ri->soft_sens * err[r] : 0.0;
        double th = keep ? 2 * err[r] + 8 * u * (1 + fabs(ri->lse) + zy) : 0.0;
        if (row_soft_tol) row_soft_tol[r] = ts;
        if (row_hard_tol) row_hard_tol[r] = th;
        if (row_lse_tol) row_lse_tol[r] = keep ? err[r] + 8 * u * (1 + fabs(ri->lse)) : 0.0;
        ss += ts, sh += th;
    }
    t->soft = fs * ss / den + 4 * u * fabs(o->soft) + 1e-30;
    t->hard = sh / den + 4 * u * fabs(o->hard) + 1e-30;
    t->loss = (c->w_soft * fs * ss + c->w_hard * sh) / den + 4 * u * fabs(o->loss) + 1e-30;
}
