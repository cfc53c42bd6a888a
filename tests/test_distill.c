/* kdloss_distill, every divergence of the family, against the double reference (ref_div_elem,
 * written from the definitions): the case grid of tests/support/cases.h (divergence and its
 * beta / alpha edges x V x student dtype, with the teacher dtype, labels (none, some ignored,
 * all ignored; I64 / I32) and row strides drawn per case; the CUDA test runs the same grid) x
 * CPU path, plus
 * rows far below exp's range, finite differences of reference and library, and the wrappers
 * (kdloss_jsd equals kdloss_distill with JSD). Tolerances: tests/README.md (the table of
 * tests/support/reference.h, with the mixture weights' logs in the magnitude). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "cases.h"
#include "testutil.h"

#define U 0x1p-24

typedef kdloss_div_params div_case;
#define DIVS KT_DIV_CASES
#define NDIV KT_NDIV_CASES

/* A case of the grid (tests/support/cases.h, which the CUDA test runs too). -inf log-probs where
 * they keep the divergence finite: not in the student for forward KL (P > 0 needs Q > 0), not
 * in the teacher for reverse KL. */
static void check_one(const kt_case *kc, kt_rng *rng, const char *isa) {
    const div_case *dc = &kc->d;
    const int64_t bt = kc->bt, v = kc->v;
    const kdloss_dtype xdt = kc->ds, tdt = kc->dt;
    const int label_mode = kc->labels, pad = kc->pad;
    int64_t ldx = v + (pad ? 5 : 0), ldt = v + (pad ? 3 : 0);
    double *xd = malloc(sizeof(double) * bt * v), *td = malloc(sizeof(double) * bt * v);
    int shift = (int)kt_randint(rng, KT_ROW_KINDS);
    kt_gen_logprobs(rng, xd, bt, v, !kt_div_fwd_like(dc), shift);
    kt_gen_logprobs(rng, td, bt, v, !kt_div_rev_like(dc), shift + 2);
    kt_round_to(xd, bt * v, xdt);
    kt_round_to(td, bt * v, tdt);
    void *x = kt_pack(xd, bt, v, ldx, xdt), *t = kt_pack(td, bt, v, ldt, tdt);
    int64_t *lab = NULL;
    if (label_mode) {
        lab = malloc(sizeof(int64_t) * bt);
        for (int64_t r = 0; r < bt; r++)
            lab[r] = label_mode == 2 || kt_uniform(rng) < 0.3 ? -100 : kt_randint(rng, v);
    }
    kdloss_distill_params p;
    kdloss_distill_params_default(&p);
    p.div = *dc;
    p.grad_scale = 2.0;
    size_t es = kdloss_dtype_size(xdt);
    void *g = malloc((size_t)(bt * ldx) * es);
    float *rows = malloc(sizeof(float) * bt), loss = NAN;
    kt_poison(g, bt * ldx, xdt);
    void *plab = lab ? kt_pack_labels(lab, bt, kc->ldt) : NULL;
    kdloss_labels labels = {plab, kc->ldt};
    kdloss_status st = kdloss_distill(&p, bt, v, (kdloss_cmat){x, xdt, ldx},
                                      (kdloss_cmat){t, tdt, ldt}, labels, &loss, rows,
                                      (kdloss_mat){g, xdt, ldx});
    char tag[200];
    snprintf(tag, sizeof tag, "distill %s %s beta=%g alpha=%g x=%s t=%s labels=%d/%s v=%lld pad=%d",
             isa, kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, kt_dtype_name(xdt),
             kt_dtype_name(tdt), label_mode, kt_dtype_name(kc->ldt), (long long)v, pad);
    if (KT_CHECK(st == KDLOSS_OK, "%s: %s", tag, kdloss_status_string(st))) {
        int64_t nv = 0;
        for (int64_t r = 0; r < bt; r++) nv += !lab || lab[r] != -100;
        double denom = nv ? (double)nv : 1.0, total = 0, tmag = 0, lw = kt_div_log_weights(dc);
        double geps = xdt == KDLOSS_F32 ? 0 : kt_eps(xdt);
        int bad = 0;
        kdloss_div_params d = *dc;
        for (int64_t r = 0; r < bt; r++) {
            int ign = lab && lab[r] == -100;
            double rs = 0, rmag = 0;
            for (int64_t k = 0; k < v; k++) {
                double gr = 0, mag = 0, xv = xd[r * v + k], yv = td[r * v + k];
                double l = ign ? 0.0 : ref_div_elem(&d, xv, yv, &gr, &mag);
                rs += l, rmag += mag;
                double gw = gr * p.grad_scale / denom, w = exp(xv) + exp(yv);
                double gtol = 16 * U * (fabs(gr) + ref_wmul(w, 2 + fabs(xv) + fabs(yv) + lw)) *
                                  p.grad_scale / denom +
                              geps * fabs(gw) + kt_tiny(xdt) +
                              0x1p-148 * (1 + fabs(xv) + fabs(yv)) * p.grad_scale / denom;
                /* TVD: where P and Q agree to fp32 rounding, the sign (the subgradient) may differ */
                if (dc->divergence == KDLOSS_DIV_TVD && fabs(exp(xv) - exp(yv)) <= 1e-5 * w)
                    gtol += exp(xv) * p.grad_scale / denom;
                if (bad < 3 && !kt_close(kt_get(g, xdt, ldx, r, k), gw, gtol, 0,
                                         "%s grad[%lld,%lld]", tag, (long long)r, (long long)k))
                    bad++;
            }
            kt_close(rows[r], rs, 256 * U * rmag + 1e-30, 0, "%s row_loss[%lld]", tag,
                     (long long)r);
            total += rs, tmag += rmag;
        }
        kt_close(loss, total / denom, (256 * U * tmag + 1e-30) / denom, 0, "%s loss", tag);
        if (label_mode == 2) KT_CHECK(loss == 0.0f, "%s: all ignored gives %g", tag, loss);
    }
    free(xd), free(td), free(x), free(t), free(lab), free(plab), free(g), free(rows);
}

/* Rows whose log-probs lie far below exp's range (-1e4 .. -3e4) and one row of plain values:
 * every output finite, every divergence. */
static void check_far_below(void) {
    enum { V = 67 };
    float x[2 * V], t[2 * V], g[2 * V], rows[2], loss;
    for (int k = 0; k < V; k++) {
        x[k] = -1e4f - 97.0f * k, t[k] = -2e4f + 13.0f * k;
        x[V + k] = -4.2f - 0.01f * k, t[V + k] = k == 3 ? -3e4f : -4.0f - 0.02f * k;
    }
    for (int i = 0; i < NDIV; i++) {
        kdloss_distill_params p;
        kdloss_distill_params_default(&p);
        p.div = DIVS[i];
        kdloss_labels nol = {NULL, KDLOSS_I64};
        kdloss_status st = kdloss_distill(&p, 2, V, (kdloss_cmat){x, KDLOSS_F32, 0},
                                          (kdloss_cmat){t, KDLOSS_F32, 0}, nol, &loss, rows,
                                          (kdloss_mat){g, KDLOSS_F32, 0});
        int fin = st == KDLOSS_OK && isfinite(loss) && isfinite(rows[0]) && isfinite(rows[1]);
        for (int k = 0; k < 2 * V; k++) fin &= isfinite(g[k]);
        KT_CHECK(fin, "far below exp's range: %s beta=%g alpha=%g not finite",
                 kdloss_divergence_name(DIVS[i].divergence), DIVS[i].beta, DIVS[i].alpha);
        KT_CHECK(rows[0] == 0.0f, "far below: %s row of zero probabilities has loss %g",
                 kdloss_divergence_name(DIVS[i].divergence), rows[0]);
    }
}

/* Central differences: of the reference in double (its gradient formula, h = 1e-5, 1e-6
 * relative) and of the library's loss in fp32 (h = 1e-2). */
static void check_finite_differences(kt_rng *rng) {
    enum { BT = 3, V = 7 };
    for (int i = 0; i < NDIV; i++) {
        const div_case *dc = &DIVS[i];
        kdloss_div_params d = *dc;
        double xd[BT * V], td[BT * V];
        kt_gen_logprobs(rng, xd, BT, V, 0, 0);
        kt_gen_logprobs(rng, td, BT, V, 0, 3);
        float x[BT * V], t[BT * V], g[BT * V], l0, lp, lm;
        for (int k = 0; k < BT * V; k++) x[k] = (float)xd[k], t[k] = (float)td[k];
        for (int k = 0; k < BT * V; k++) xd[k] = x[k], td[k] = t[k];
        kdloss_distill_params p;
        kdloss_distill_params_default(&p);
        p.div = d;
        kdloss_labels nol = {NULL, KDLOSS_I64};
        kdloss_cmat a = {x, KDLOSS_F32, 0}, b = {t, KDLOSS_F32, 0};
        kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
        kdloss_distill(&p, BT, V, a, b, nol, &l0, NULL, (kdloss_mat){g, KDLOSS_F32, 0});
        for (int k = 0; k < BT * V; k++) {
            double gr, mag, dd, h = 1e-5;
            ref_div_elem(&d, xd[k], td[k], &gr, &mag);
            double fd = (ref_div_elem(&d, xd[k] + h, td[k], &dd, &mag) -
                         ref_div_elem(&d, xd[k] - h, td[k], &dd, &mag)) / (2 * h);
            if (dc->divergence != KDLOSS_DIV_TVD || fabs(exp(xd[k]) - exp(td[k])) > 1e-4)
                kt_close(gr, fd, 1e-9, 1e-6, "reference FD %s beta=%g alpha=%g [%d]",
                         kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, k);
            if (xd[k] < -30 || td[k] < -30) continue; /* fp32 FD too coarse there */
            if (dc->divergence == KDLOSS_DIV_TVD && fabs(exp(xd[k]) - exp(td[k])) < 0.05 * exp(xd[k]))
                continue; /* a kink within h */
            float hf = 1e-2f, keep = x[k];
            x[k] = keep + hf;
            kdloss_distill(&p, BT, V, a, b, nol, &lp, NULL, nomat);
            x[k] = keep - hf;
            kdloss_distill(&p, BT, V, a, b, nol, &lm, NULL, nomat);
            x[k] = keep;
            double lfd = ((double)lp - lm) / (2.0 * hf);
            kt_close(g[k], lfd, 2e-3 * (1 + fabs(l0)), 2e-2, "library FD %s beta=%g alpha=%g [%d]",
                     kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, k);
        }
    }
}

/* kdloss_jsd is kdloss_distill with JSD(beta), bitwise; names round-trip; bad parameters. */
static void check_api(kt_rng *rng) {
    enum { BT = 5, V = 300 };
    double xd[BT * V], td[BT * V];
    kt_gen_logprobs(rng, xd, BT, V, 0, 0);
    kt_gen_logprobs(rng, td, BT, V, 0, 1);
    float x[BT * V], t[BT * V], g1[BT * V], g2[BT * V], l1, l2;
    for (int k = 0; k < BT * V; k++) x[k] = (float)xd[k], t[k] = (float)td[k];
    kdloss_labels nol = {NULL, KDLOSS_I64};
    kdloss_jsd_params jp;
    kdloss_jsd_params_default(&jp);
    jp.beta = 0.3;
    kdloss_distill_params p;
    kdloss_distill_params_default(&p);
    p.div.divergence = KDLOSS_DIV_JSD;
    p.div.beta = 0.3;
    kdloss_cmat a = {x, KDLOSS_F32, 0}, b = {t, KDLOSS_F32, 0};
    kdloss_jsd(&jp, BT, V, a, b, nol, &l1, NULL, (kdloss_mat){g1, KDLOSS_F32, 0});
    kdloss_distill(&p, BT, V, a, b, nol, &l2, NULL, (kdloss_mat){g2, KDLOSS_F32, 0});
    KT_CHECK(!memcmp(&l1, &l2, 4) && !memcmp(g1, g2, sizeof g1), "kdloss_jsd == distill JSD");
    for (int i = 0; i < KDLOSS_DIV_COUNT; i++) {
        kdloss_divergence d = (kdloss_divergence)-1;
        KT_CHECK(kdloss_divergence_from_name(kdloss_divergence_name((kdloss_divergence)i), &d) ==
                         KDLOSS_OK && d == (kdloss_divergence)i,
                 "divergence name round trip %d", i);
    }
    KT_CHECK(!strcmp(kdloss_divergence_name(KDLOSS_DIV_COUNT), "unknown"),
             "KDLOSS_DIV_COUNT is not a divergence");
    kdloss_divergence d;
    KT_CHECK(kdloss_divergence_from_name("kl", &d) == KDLOSS_ERR_INVALID_PARAM, "unknown name");
    const double bad[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        float lz = 7.0f;
        kdloss_distill_params q = p;
        q.div.alpha = bad[i];
        KT_CHECK(kdloss_distill(&q, BT, V, a, b, nol, &lz, NULL, (kdloss_mat){NULL, 0, 0}) ==
                         KDLOSS_ERR_INVALID_PARAM && lz == 7.0f,
                 "alpha %g rejected, nothing written", bad[i]);
        q = p;
        q.div.beta = bad[i];
        KT_CHECK(kdloss_distill(&q, BT, V, a, b, nol, &lz, NULL, (kdloss_mat){NULL, 0, 0}) ==
                         KDLOSS_ERR_INVALID_PARAM && lz == 7.0f,
                 "beta %g rejected, nothing written", bad[i]);
    }
    kdloss_distill_params q = p;
    q.div.divergence = KDLOSS_DIV_COUNT;
    KT_CHECK(kdloss_distill(&q, BT, V, a, b, nol, &l1, NULL, (kdloss_mat){NULL, 0, 0}) ==
                 KDLOSS_ERR_INVALID_PARAM,
             "unknown divergence rejected");
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    KT_FOR_EACH_ISA(path, "") {
        KT_FOR_EACH_CASE(c) check_one(&c, &rng, path.name);
        check_far_below();
    }
    check_finite_differences(&rng);
    check_api(&rng);
    return kt_finish("test_distill");
}
