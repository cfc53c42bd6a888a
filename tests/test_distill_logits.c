/* kdloss_distill_logits against a double reference written from the formulas: per row
 * X = log_softmax(zs / T), Y = log_softmax(zt / T) (log-sum-exp in double), the divergence's
 * element terms (ref_div_elem) and the chain rule dz = (g - Q sum g) / T. The case grid of
 * tests/support/cases.h (every divergence case x V x student dtype, with the teacher dtype,
 * labels (none, some ignored, all ignored; I64 / I32), temperature and row stride drawn per
 * case; the CUDA test runs the same grid) x CPU path, on rows of every kind (normal, peaked, far
 * below exp's range, flat) shifted by large offsets (logits near -1e4); the lighter divergence
 * set of div_cases.h for the rest: finite differences of the reference and of the
 * library; in place; no-gradient calls; the same bits on 1, 2 and 3 threads; argument checks
 * (nothing written on error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "cases.h"
#include "ref_rowx.h"
#include "reference.h"
#include "testutil.h"

#define U 0x1p-24

typedef kdloss_div_params div_case;
static const div_case DIVS[] = KT_DIV_CASES_LOGITS_INIT;
#define NDIV ((int)(sizeof DIVS / sizeof DIVS[0]))

/* The reference row: returns D(P, Q); dz[k] = dD/dzs[k] (unscaled); mag, gmag: magnitudes of
 * the loss terms and of each gradient element's terms (for tolerances). */
static double ref_row(const kdloss_div_params *d, const double *zs, const double *zt, int64_t v,
                      double t, double *dz, double *gmag, double *mag, double lw) {
    double *x = malloc(sizeof(double) * v), *y = malloc(sizeof(double) * v);
    double *g = malloc(sizeof(double) * v);
    ref_log_softmax(zs, v, t, x);
    ref_log_softmax(zt, v, t, y);
    double loss = 0, sg = 0, m = 0, sgm = 0, xm = 0;
    for (int64_t k = 0; k < v; k++) {
        double mg;
        loss += ref_div_elem(d, x[k], y[k], &g[k], &mg);
        m += mg;
        sg += g[k];
        double w = exp(x[k]) + exp(y[k]);
        /* fp32 X, Y carry an absolute error of about U (|z / T| + |lse|): it enters each term
         * weighted by the probabilities */
        double e = 2 + fabs(x[k]) + fabs(y[k]) + lw;
        m += ref_wmul(w, e);
        gmag[k] = fabs(g[k]) + ref_wmul(w, e);
        sgm += gmag[k];
        xm = fmax(xm, fabs(zs[k] / t));
    }
    for (int64_t k = 0; k < v; k++) {
        double q = exp(x[k]);
        dz[k] = (g[k] - q * sg) / t;
        gmag[k] = (gmag[k] + q * (sgm + fabs(sg) * (2 + fabs(x[k])))) / t;
    }
    *mag = m;
    free(x), free(y), free(g);
    return loss;
}

/* Logits: log-probs of every row kind, scaled, and shifted per row (some near -1e4). */
static void gen_logits(kt_rng *rng, double *z, int64_t bt, int64_t v, int shift, double scale) {
    kt_gen_logprobs(rng, z, bt, v, 0, shift);
    for (int64_t r = 0; r < bt; r++) {
        double off = (r % 3 == 1) ? -1e4 + 17.0 * r : 5.0 * kt_normal(rng);
        for (int64_t k = 0; k < v; k++) z[r * v + k] = z[r * v + k] * scale + off;
    }
}

/* A case of the grid (tests/support/cases.h, which the CUDA test runs too). */
static void check_one(const kt_case *kc, kt_rng *rng, const char *isa) {
    const div_case *dc = &kc->d;
    const int64_t bt = kc->bt, v = kc->v;
    const double t = kc->t;
    const kdloss_dtype xdt = kc->ds, tdt = kc->dt;
    const int label_mode = kc->labels, pad = kc->pad;
    int64_t ldx = v + (pad ? 5 : 0), ldt = v + (pad ? 3 : 0);
    double *zs = malloc(sizeof(double) * bt * v), *zt = malloc(sizeof(double) * bt * v);
    int shift = (int)kt_randint(rng, KT_ROW_KINDS);
    gen_logits(rng, zs, bt, v, shift, 1.0 + kt_uniform(rng));
    gen_logits(rng, zt, bt, v, shift + 2, 1.0 + kt_uniform(rng));
    kt_round_to(zs, bt * v, xdt);
    kt_round_to(zt, bt * v, tdt);
    void *x = kt_pack(zs, bt, v, ldx, xdt), *tt = kt_pack(zt, bt, v, ldt, tdt);
    int64_t *lab = NULL;
    if (label_mode) {
        lab = malloc(sizeof(int64_t) * bt);
        for (int64_t r = 0; r < bt; r++)
            lab[r] = label_mode == 2 || kt_uniform(rng) < 0.3 ? -7 : kt_randint(rng, v);
    }
    void *plab = lab ? kt_pack_labels(lab, bt, kc->ldt) : NULL;
    /* per-row weights in two cases of three, the entropy in one of two (docs/MATH.md 12) */
    float *w = kt_randint(rng, 3) ? malloc(sizeof(float) * bt) : NULL;
    float *ent = kt_randint(rng, 2) ? malloc(sizeof(float) * bt) : NULL;
    if (w) kt_gen_row_weights(rng, w, bt);
    if (ent) for (int64_t r = 0; r < bt; r++) ent[r] = NAN;
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div = *dc;
    p.temperature = t;
    p.ignore_index = -7;
    p.grad_scale = 2.0;
    p.row_weights = w;
    p.row_entropy = ent;
    size_t es = kdloss_dtype_size(xdt);
    void *g = malloc((size_t)(bt * ldx) * es);
    float *rows = malloc(sizeof(float) * bt), loss = NAN;
    kt_poison(g, bt * ldx, xdt);
    kdloss_labels labels = {plab, kc->ldt};
    kdloss_status st = kdloss_distill_logits(&p, bt, v, (kdloss_cmat){x, xdt, ldx},
                                             (kdloss_cmat){tt, tdt, ldt}, labels, &loss, rows,
                                             (kdloss_mat){g, xdt, ldx});
    char tag[200];
    snprintf(tag, sizeof tag,
             "logits %s %s beta=%g alpha=%g T=%g x=%s t=%s labels=%d v=%lld w=%d ent=%d", isa,
             kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, t, kt_dtype_name(xdt),
             kt_dtype_name(tdt), label_mode, (long long)v, w != NULL, ent != NULL);
    if (KT_CHECK(st == KDLOSS_OK, "%s: %s", tag, kdloss_status_string(st))) {
        int64_t nv = 0;
        for (int64_t r = 0; r < bt; r++) nv += (!lab || lab[r] != -7) && (!w || w[r] != 0.0f);
        double denom = nv ? (double)nv : 1.0, total = 0, tmag = 0, lw = kt_div_log_weights(dc);
        double geps = xdt == KDLOSS_F32 ? 0 : kt_eps(xdt), sc = p.grad_scale / denom;
        double *dz = malloc(sizeof(double) * v), *gm = malloc(sizeof(double) * v);
        kdloss_div_params d = *dc;
        int bad = 0;
        for (int64_t r = 0; r < bt; r++) {
            int ign = (lab && lab[r] == -7) || (w && w[r] == 0.0f);
            double rs = 0, rmag = 0, wr = w ? (double)w[r] : 1.0; /* a kept row's weight */
            if (!ign) rs = ref_row(&d, zs + r * v, zt + r * v, v, t, dz, gm, &rmag, lw);
            double *xr = malloc(sizeof(double) * v), *yr = malloc(sizeof(double) * v);
            ref_log_softmax(zs + r * v, v, t, xr);
            ref_log_softmax(zt + r * v, v, t, yr);
            for (int64_t k = 0; k < v; k++) {
                /* weighted: the row's gradient times w (one more fp32 rounding of the factor) */
                /* an exp that underflows inside the kernel (an absolute 2^-149) is scaled by
                 * the weight too, hence kt_tiny w */
                double want = ign ? 0.0 : dz[k] * sc * wr, got = kt_get(g, xdt, ldx, r, k);
                double gtol = ign ? 0.0
                                  : 64 * U * gm[k] * sc * wr + geps * fabs(want) +
                                        kt_tiny(xdt) * fmax(1.0, wr);
                /* TVD: where P and Q agree to fp32 rounding, the subgradient's sign may differ */
                if (!ign && dc->divergence == KDLOSS_DIV_TVD)
                    gtol += 2 * (exp(xr[k]) + exp(yr[k])) * sc * wr / t;
                /* a large weight can take an fp16 gradient past its range: inf, as any fp16 */
                int ovf = xdt == KDLOSS_F16 && isinf(got) && (got > 0) == (want > 0) &&
                          fabs(want) + gtol >= 65504.0;
                if (!ovf && bad < 3 && !kt_close(got, want, gtol, 0,
                                         "%s grad[%lld,%lld]", tag, (long long)r, (long long)k))
                    bad++;
            }
            free(xr), free(yr);
            /* row_loss stays unweighted; the total weighs it */
            kt_close(rows[r], rs, 256 * U * rmag + 1e-30, 0, "%s row_loss[%lld]", tag,
                     (long long)r);
            total += wr * rs, tmag += wr * rmag;
            if (ent) {
                double etol, h = ign ? 0.0 : ref_entropy(zs + r * v, v, t, &etol);
                if (ign) KT_CHECK(ent[r] == 0.0f, "%s entropy[%lld] of an ignored row %g", tag,
                                  (long long)r, ent[r]);
                else kt_close(ent[r], h, etol, 0, "%s entropy[%lld]", tag, (long long)r);
            }
        }
        kt_close(loss, total / denom, (256 * U * tmag + 1e-30) / denom, 0, "%s loss", tag);
        if (label_mode == 2) KT_CHECK(loss == 0.0f, "%s: all ignored gives %g", tag, loss);
        free(dz), free(gm);

        /* no gradient: the same losses (and entropies) bitwise; in place: the same gradient */
        float l2 = NAN, *rows2 = malloc(sizeof(float) * bt);
        float *ent2 = ent ? malloc(sizeof(float) * bt) : NULL;
        p.row_entropy = ent2;
        st = kdloss_distill_logits(&p, bt, v, (kdloss_cmat){x, xdt, ldx},
                                   (kdloss_cmat){tt, tdt, ldt}, labels, &l2, rows2,
                                   (kdloss_mat){NULL, xdt, 0});
        KT_CHECK(st == KDLOSS_OK && !memcmp(&l2, &loss, 4) &&
                     !memcmp(rows2, rows, sizeof(float) * bt),
                 "%s: losses without the gradient differ", tag);
        KT_CHECK(!ent || !memcmp(ent2, ent, sizeof(float) * bt),
                 "%s: entropies without the gradient differ", tag);
        p.row_entropy = ent;
        free(ent2);
        st = kdloss_distill_logits(&p, bt, v, (kdloss_cmat){x, xdt, ldx},
                                   (kdloss_cmat){tt, tdt, ldt}, labels, NULL, NULL,
                                   (kdloss_mat){x, xdt, ldx});
        int same = st == KDLOSS_OK;
        for (int64_t r = 0; r < bt && same; r++)
            same = !memcmp((char *)x + r * ldx * es, (char *)g + r * ldx * es, (size_t)v * es);
        KT_CHECK(same, "%s: in place differs", tag);
        free(rows2);
    }
    free(zs), free(zt), free(x), free(tt), free(lab), free(plab), free(g), free(rows);
    free(w), free(ent);
}

/* Central differences of the reference (double, h = 1e-5) and of the library (fp32, h = 1e-2)
 * against the reference's chain-rule gradient and the library's. */
static void check_finite_differences(kt_rng *rng) {
    enum { BT = 3, V = 7 };
    const double ts[] = {1.0, 2.5, 0.5};
    for (int i = 0; i < NDIV; i++) {
        const div_case *dc = &DIVS[i];
        kdloss_div_params d = *dc;
        double t = ts[i % 3];
        double zd[BT * V], td[BT * V], dz[V], gm[V], dd[V], mag;
        kt_gen_logprobs(rng, zd, BT, V, 0, 0);
        kt_gen_logprobs(rng, td, BT, V, 0, 3);
        float z[BT * V], tf[BT * V], g[BT * V], l0, lp, lm;
        for (int k = 0; k < BT * V; k++) z[k] = (float)zd[k], tf[k] = (float)td[k];
        for (int k = 0; k < BT * V; k++) zd[k] = z[k], td[k] = tf[k];
        kdloss_distill_logits_params p;
        kdloss_distill_logits_params_default(&p);
        p.div = d;
        p.temperature = t;
        kdloss_labels nol = {NULL, KDLOSS_I64};
        kdloss_cmat a = {z, KDLOSS_F32, 0}, b = {tf, KDLOSS_F32, 0};
        kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
        kdloss_distill_logits(&p, BT, V, a, b, nol, &l0, NULL, (kdloss_mat){g, KDLOSS_F32, 0});
        for (int r = 0; r < BT; r++) {
            ref_row(&d, zd + r * V, td + r * V, V, t, dz, gm, &mag, 0);
            for (int c = 0; c < V; c++) {
                int k = r * V + c;
                double h = 1e-5, keep = zd[k];
                zd[k] = keep + h;
                double fp = ref_row(&d, zd + r * V, td + r * V, V, t, dd, gm, &mag, 0);
                zd[k] = keep - h;
                double fm = ref_row(&d, zd + r * V, td + r * V, V, t, dd, gm, &mag, 0);
                zd[k] = keep;
                /* + the double rounding of the loss (a few 2^-53 of its terms' size mag) over
                 * 2h: rows far below exp's range have terms of size 1e4 (a seed failed at 1e-8) */
                if (dc->divergence != KDLOSS_DIV_TVD)
                    kt_close(dz[c], (fp - fm) / (2 * h), 1e-8 + 8 * 0x1p-53 * mag / (2 * h), 1e-5,
                             "reference FD %s beta=%g alpha=%g T=%g [%d]",
                             kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, t, k);
                if (dc->divergence == KDLOSS_DIV_TVD) continue; /* kinks within h */
                float hf = 1e-2f, kf = z[k];
                z[k] = kf + hf;
                kdloss_distill_logits(&p, BT, V, a, b, nol, &lp, NULL, nomat);
                z[k] = kf - hf;
                kdloss_distill_logits(&p, BT, V, a, b, nol, &lm, NULL, nomat);
                z[k] = kf;
                double lfd = ((double)lp - lm) / (2.0 * hf);
                kt_close(g[k], lfd, 2e-3 * (1 + fabs(l0)), 2e-2,
                         "library FD %s beta=%g alpha=%g T=%g [%d]",
                         kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, t, k);
                kt_close(g[k], dz[c] / BT, 1e-5, 1e-3, "library vs reference %s [%d]",
                         kdloss_divergence_name(dc->divergence), k);
            }
        }
    }
}

/* Bad arguments are rejected before anything is written. */
static void check_api(void) {
    enum { BT = 4, V = 33 };
    float z[BT * V], t[BT * V], g[BT * V], rows[BT];
    for (int k = 0; k < BT * V; k++) z[k] = (float)(k % 7) * 0.3f, t[k] = (float)(k % 5) * 0.2f;
    kdloss_labels nol = {NULL, KDLOSS_I64};
    kdloss_cmat a = {z, KDLOSS_F32, 0}, b = {t, KDLOSS_F32, 0};
    kdloss_distill_logits_params p0;
    kdloss_distill_logits_params_default(&p0);
    KT_CHECK(p0.temperature == 1.0 && p0.ignore_index == -100 && p0.grad_scale == 1.0 &&
                 p0.div.divergence == KDLOSS_DIV_FORWARD_KL,
             "defaults");
    const double bad_t[] = {0.0, -1.0, NAN, INFINITY, 1e-300};
    for (int i = 0; i < 5; i++) {
        kdloss_distill_logits_params p = p0;
        p.temperature = bad_t[i];
        float l = 7.0f;
        kt_poison(g, BT * V, KDLOSS_F32);
        kdloss_status st = kdloss_distill_logits(&p, BT, V, a, b, nol, &l, rows,
                                                 (kdloss_mat){g, KDLOSS_F32, 0});
        KT_CHECK(st == KDLOSS_ERR_INVALID_PARAM && l == 7.0f && kt_is_poison(g, BT * V, KDLOSS_F32),
                 "temperature %g rejected, nothing written", bad_t[i]);
    }
    kdloss_distill_logits_params p = p0;
    p.div.alpha = 1.5;
    float l = 7.0f;
    KT_CHECK(kdloss_distill_logits(&p, BT, V, a, b, nol, &l, NULL, (kdloss_mat){NULL, 0, 0}) ==
                     KDLOSS_ERR_INVALID_PARAM && l == 7.0f,
             "alpha 1.5 rejected");
    p = p0;
    p.grad_scale = NAN;
    KT_CHECK(kdloss_distill_logits(&p, BT, V, a, b, nol, &l, NULL, (kdloss_mat){NULL, 0, 0}) ==
                 KDLOSS_ERR_INVALID_PARAM,
             "grad_scale NaN rejected");
    KT_CHECK(kdloss_distill_logits(NULL, BT, V, a, b, nol, &l, NULL, (kdloss_mat){NULL, 0, 0}) ==
                 KDLOSS_ERR_NULL_POINTER,
             "NULL params");
    KT_CHECK(kdloss_distill_logits(&p0, BT, V, a, b, nol, NULL, NULL, (kdloss_mat){NULL, 0, 0}) ==
                 KDLOSS_ERR_NO_OUTPUT,
             "no output");
    KT_CHECK(kdloss_distill_logits(&p0, 0, V, a, b, nol, &l, NULL, (kdloss_mat){NULL, 0, 0}) ==
                 KDLOSS_ERR_INVALID_SIZE,
             "BT 0");
    int64_t lab[BT] = {1, 2, V, 3};
    kdloss_labels bl = {lab, KDLOSS_I64};
    l = 7.0f;
    KT_CHECK(kdloss_distill_logits(&p0, BT, V, a, b, bl, &l, NULL, (kdloss_mat){NULL, 0, 0}) ==
                     KDLOSS_ERR_LABEL_OUT_OF_RANGE && l == 7.0f,
             "label out of range");
    KT_CHECK(kdloss_distill_logits(&p0, BT, V, a, b, nol, &l, (float *)t,
                                   (kdloss_mat){NULL, 0, 0}) == KDLOSS_ERR_ALIASING,
             "row_loss over the teacher");
    KT_CHECK(kdloss_distill_logits(&p0, BT, V, a, b, nol, &l, NULL,
                                   (kdloss_mat){t, KDLOSS_F32, 0}) == KDLOSS_ERR_ALIASING,
             "grad over the teacher");
    KT_CHECK(kdloss_distill_logits(&p0, BT, V, a, b, nol, &l, NULL,
                                   (kdloss_mat){g, KDLOSS_BF16, 0}) == KDLOSS_ERR_INVALID_DTYPE,
             "grad dtype differs from the student's");
    /* T = 1 on log-probs equals kdloss_distill on the same log-probs */
    double zd[BT * V];
    kt_rng rng;
    kt_rng_seed(&rng, 5);
    kt_gen_logprobs(&rng, zd, BT, V, 0, 1);
    for (int k = 0; k < BT * V; k++) z[k] = (float)zd[k];
    kdloss_distill_params dp;
    kdloss_distill_params_default(&dp);
    float l1, l2;
    kdloss_distill_logits(&p0, BT, V, a, b, nol, &l1, NULL, (kdloss_mat){NULL, 0, 0});
    float tl[BT * V];
    double td[BT * V], tmp[V];
    for (int r = 0; r < BT; r++) {
        for (int c = 0; c < V; c++) td[r * V + c] = t[r * V + c];
        ref_log_softmax(td + r * V, V, 1.0, tmp);
        for (int c = 0; c < V; c++) tl[r * V + c] = (float)tmp[c];
    }
    kdloss_distill(&dp, BT, V, a, (kdloss_cmat){tl, KDLOSS_F32, 0}, nol, &l2, NULL,
                   (kdloss_mat){NULL, 0, 0});
    kt_close(l1, l2, 1e-5, 1e-4, "logits T=1 vs kdloss_distill on log-probs");
}

/* Gradients above 32 MiB are written with streaming stores, and each row prefetches the next:
 * the result must equal calls on small pieces (regular stores) up to the ulp by which the
 * pieces' gradient scale differs, and the losses sum to the same value. */
static void check_streamed(kt_rng *rng) {
    int64_t bt = 2100, v = 4133, piece = 100; /* 34.7 MB of fp32 gradient */
    float *x = malloc(sizeof(float) * bt * v), *t = malloc(sizeof(float) * bt * v);
    float *g1 = malloc(sizeof(float) * bt * v), *g2 = malloc(sizeof(float) * bt * v);
    float *r1 = malloc(sizeof(float) * bt), *r2 = malloc(sizeof(float) * bt);
    for (int64_t i = 0; i < bt * v; i++)
        x[i] = (float)(8 * kt_uniform(rng)), t[i] = (float)(8 * kt_uniform(rng));
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.temperature = 2.0;
    kdloss_labels nol = {NULL, KDLOSS_I64};
    for (int i = 0; i < NDIV; i += 3) {
        p.div = DIVS[i];
        p.grad_scale = 1.0;
        kdloss_status st = kdloss_distill_logits(&p, bt, v, (kdloss_cmat){x, KDLOSS_F32, 0},
                                                 (kdloss_cmat){t, KDLOSS_F32, 0}, nol, NULL, r1,
                                                 (kdloss_mat){g1, KDLOSS_F32, 0});
        p.grad_scale = (double)piece / bt;
        for (int64_t r = 0; r < bt && st == KDLOSS_OK; r += piece)
            st = kdloss_distill_logits(&p, piece, v, (kdloss_cmat){x + r * v, KDLOSS_F32, 0},
                                       (kdloss_cmat){t + r * v, KDLOSS_F32, 0}, nol, NULL, r2 + r,
                                       (kdloss_mat){g2 + r * v, KDLOSS_F32, 0});
        int64_t diff = 0;
        for (int64_t e = 0; e < bt * v; e++) diff += fabsf(g1[e] - g2[e]) > 1e-6f * fabsf(g1[e]);
        KT_CHECK(st == KDLOSS_OK && diff == 0 && !memcmp(r1, r2, sizeof(float) * bt),
                 "logits %s: streamed gradient differs in %lld elements (or the row losses)",
                 kdloss_divergence_name(DIVS[i].divergence), (long long)diff);
    }
    free(x), free(t), free(g1), free(g2), free(r1), free(r2);
}

/* Rows run pipelined on the vector paths, each thread through its own span of rows (a row
 * finishes while the next starts; narrower logits widened on the way): 1, 2 and 3 threads must
 * give the same bits (the loss, every row, the gradient), with ignored rows at the spans' ends
 * and in between, on every path and for fp32, bf16 / fp16 and mixed logits, and the losses
 * without the gradient the same bits again. V = 2500: two whole tiles and a tail with a partial
 * vector. */
static void check_threads(kt_rng *rng) {
    enum { BT = 31, V = 2500 };
    static const kdloss_dtype XT[][2] = {{KDLOSS_F32, KDLOSS_F32},
                                          {KDLOSS_BF16, KDLOSS_F16},
                                          {KDLOSS_F16, KDLOSS_F32}};
    double *xd = malloc(sizeof(double) * BT * V), *td = malloc(sizeof(double) * BT * V);
    for (int64_t i = 0; i < BT * V; i++)
        xd[i] = 12 * kt_uniform(rng) - 6, td[i] = 9 * kt_uniform(rng);
    int64_t lab[BT];
    for (int r = 0; r < BT; r++) lab[r] = r; /* ignored: the first and last rows, 10, 15, 16, 20 */
    lab[0] = lab[10] = lab[15] = lab[16] = lab[20] = lab[BT - 1] = -100;
    kdloss_labels labels = {lab, KDLOSS_I64};
    int nt = omp_get_max_threads();
    for (int di = 0; di < 3; di++) {
        kdloss_dtype xdt = XT[di][0], tdt = XT[di][1];
        size_t gb = kdloss_dtype_size(xdt) * BT * V;
        void *x = kt_pack(xd, BT, V, V, xdt), *t = kt_pack(td, BT, V, V, tdt), *g[3];
        for (int k = 0; k < 3; k++) g[k] = malloc(gb);
        kdloss_cmat a = {x, xdt, 0}, b = {t, tdt, 0};
        KT_FOR_EACH_ISA(path, NULL) {
            for (int i = 0; i < NDIV; i++) {
                kdloss_distill_logits_params p;
                kdloss_distill_logits_params_default(&p);
                p.div = DIVS[i];
                p.temperature = i % 2 ? 1.5 : 1.0;
                float rows[3][BT], loss[3], l4 = NAN, rows4[BT];
                kdloss_status st = KDLOSS_OK;
                for (int k = 0; k < 3; k++) {
                    omp_set_num_threads(k + 1);
                    kt_poison(g[k], BT * V, xdt);
                    st |= kdloss_distill_logits(&p, BT, V, a, b, labels, &loss[k], rows[k],
                                                (kdloss_mat){g[k], xdt, 0});
                }
                st |= kdloss_distill_logits(&p, BT, V, a, b, labels, &l4, rows4,
                                            (kdloss_mat){NULL, xdt, 0});
                omp_set_num_threads(nt);
                int same = st == KDLOSS_OK && !memcmp(&l4, &loss[0], 4) &&
                           !memcmp(rows4, rows[0], sizeof rows4);
                for (int k = 1; k < 3; k++)
                    same = same && !memcmp(&loss[k], &loss[0], 4) &&
                           !memcmp(rows[k], rows[0], sizeof rows[0]) && !memcmp(g[k], g[0], gb);
                KT_CHECK(same && isfinite(loss[0]) && loss[0] >= 0,
                         "logits %s %s x=%s t=%s: 1, 2, 3 threads or no gradient give different "
                         "bits",
                         path.name, kdloss_divergence_name(DIVS[i].divergence), kt_dtype_name(xdt),
                         kt_dtype_name(tdt));
            }
        }
        free(x), free(t);
        for (int k = 0; k < 3; k++) free(g[k]);
    }
    free(xd), free(td);
}

/* A teacher logit far above the row (3.8e25) at T = 2.5 on every CPU path: forward KL with
 * P = (0, 0, 1) to double precision. The scalar row kernel (fld_row_phases.h dense_div) once
 * estimated the rounding of the shifted teacher constant mt + (lst - lss) T as (float)(mt + sh) -
 * (mt + sh) in double, where mt + sh drops sh whole: it estimated 0, shifted Y by -lss and gave
 * P[2] = Q's largest probability (0.716): loss 4867.3 for 6797.1, the gradient scaled alike
 * (fuzz_api, h30-crash-6e3f900f). The reference: log-softmax with the maximum subtracted before
 * the division by T (z / T - lse would lose lse against 1.5e25). */
static void check_far_teacher_max(void) {
    enum { V = 3 };
    const float zs[V] = {0.004665374755859375f, -2.30859375f, -16992.0f};
    const float zt[V] = {-2.5518238544464111e-07f, -10.375f, 3.8383394772764476e+25f};
    const double t = 2.5, gsc = -1.25;
    double x[V], y[V], ms = -INFINITY, mt = -INFINITY, ss = 0, st = 0;
    for (int c = 0; c < V; c++) ms = fmax(ms, zs[c]), mt = fmax(mt, zt[c]);
    for (int c = 0; c < V; c++) ss += exp((zs[c] - ms) / t), st += exp((zt[c] - mt) / t);
    double loss = 0, sg = 0, g[V];
    for (int c = 0; c < V; c++) {
        x[c] = (zs[c] - ms) / t - log(ss), y[c] = (zt[c] - mt) / t - log(st);
        double p = exp(y[c]);
        loss += p > 0 ? p * (y[c] - x[c]) : 0.0;
        g[c] = -p, sg += g[c];
    }
    KT_FOR_EACH_ISA(path, "") {
        float l = -1.0f, row = -1.0f, gr[V];
        kdloss_distill_logits_params p;
        kdloss_distill_logits_params_default(&p);
        p.temperature = t, p.grad_scale = gsc;
        kdloss_status s = kdloss_distill_logits(&p, 1, V, (kdloss_cmat){zs, KDLOSS_F32, 0},
                                                (kdloss_cmat){zt, KDLOSS_F32, 0},
                                                (kdloss_labels){NULL, KDLOSS_I64}, &l, &row,
                                                (kdloss_mat){gr, KDLOSS_F32, 0});
        KT_CHECK(s == KDLOSS_OK, "far teacher max (%s): status %d", path.name, (int)s);
        KT_CHECK(fabs(row - loss) <= 1e-6 * loss && fabs(l - loss) <= 1e-6 * loss,
                 "far teacher max (%s): loss %.9g row %.9g want %.9g", path.name, l, row, loss);
        for (int c = 0; c < V; c++) {
            double want = (g[c] - exp(x[c]) * sg) / t * gsc;
            KT_CHECK(fabs(gr[c] - want) <= 1e-6 * fabs(gsc) / t, "far teacher max (%s): grad[%d] %.9g want %.9g",
                     path.name, c, gr[c], want);
        }
    }
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    KT_FOR_EACH_ISA(path, "") KT_FOR_EACH_CASE(c) check_one(&c, &rng, path.name);
    check_finite_differences(&rng);
    check_threads(&rng);
    if (!kt_quick()) check_streamed(&rng);
    check_api();
    check_far_teacher_max();
    return kt_finish("test_distill_logits");
}
