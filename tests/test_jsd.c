/* JSD(beta) against the double reference: beta x student dtype x teacher dtype x labels (none,
 * some ignored, all ignored; int64 and int32) x V x row stride x CPU path, plus variants
 * (forward-only, gradient-only, in place), the beta = 0.5 symmetry, determinism and finite
 * differences. Tolerances: tests/support/reference.h. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define U 0x1p-24

static const double BETAS[] = {0.0, 0.1, 0.5, 0.9, 1.0};

typedef struct {
    int64_t bt, v, ldx, ldt;
    kdloss_dtype xdt, tdt;
    void *x, *t;
    double *xd, *td;
    int label_mode; /* 0 none, 1 some ignored (int64), 2 all ignored (int32) */
    void *labels;
    kdloss_dtype ldt_labels;
} jsd_case;

/* -inf log-probs only where the divergence stays finite: beta = 0 needs Q > 0 wherever P > 0,
 * so -inf goes to the teacher only; beta = 1 the other way round; mixed beta allows both. */
static void make_case(jsd_case *c, kt_rng *rng, int64_t bt, int64_t v, int pad, kdloss_dtype xdt,
                      kdloss_dtype tdt, double beta, int label_mode) {
    memset(c, 0, sizeof *c);
    c->bt = bt, c->v = v, c->xdt = xdt, c->tdt = tdt, c->label_mode = label_mode;
    c->ldx = v + (pad ? 9 : 0);
    c->ldt = v + (pad ? 2 : 0);
    c->xd = malloc(sizeof(double) * bt * v);
    c->td = malloc(sizeof(double) * bt * v);
    int shift = (int)kt_randint(rng, KT_ROW_KINDS);
    kt_gen_logprobs(rng, c->xd, bt, v, beta != 0.0, shift);
    kt_gen_logprobs(rng, c->td, bt, v, beta != 1.0, shift + 2);
    kt_round_to(c->xd, bt * v, xdt);
    kt_round_to(c->td, bt * v, tdt);
    c->x = kt_pack(c->xd, bt, v, c->ldx, xdt);
    c->t = kt_pack(c->td, bt, v, c->ldt, tdt);
    if (label_mode == 1) {
        int64_t *l = malloc(sizeof(int64_t) * bt);
        for (int64_t r = 0; r < bt; r++) l[r] = kt_uniform(rng) < 0.3 ? -100 : kt_randint(rng, v);
        c->labels = l, c->ldt_labels = KDLOSS_I64;
    } else if (label_mode == 2) {
        int32_t *l = malloc(sizeof(int32_t) * bt);
        for (int64_t r = 0; r < bt; r++) l[r] = -100;
        c->labels = l, c->ldt_labels = KDLOSS_I32;
    }
}

static void free_case(jsd_case *c) {
    free(c->x), free(c->t), free(c->xd), free(c->td), free(c->labels);
}

static int ignored(const jsd_case *c, int64_t r) {
    if (!c->labels) return 0;
    return c->ldt_labels == KDLOSS_I64 ? ((int64_t *)c->labels)[r] == -100
                                       : ((int32_t *)c->labels)[r] == -100;
}

static void check_case(const jsd_case *c, double beta, double gscale, const char *isa) {
    int64_t bt = c->bt, v = c->v, ldg = c->ldx;
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    p.beta = beta;
    p.grad_scale = gscale;
    size_t ges = kdloss_dtype_size(c->xdt);
    void *g = malloc((size_t)(bt * ldg) * ges);
    float *rows = malloc(sizeof(float) * bt), loss = NAN;
    kt_poison(g, bt * ldg, c->xdt);
    kdloss_cmat st_ = {c->x, c->xdt, c->ldx}, te = {c->t, c->tdt, c->ldt};
    kdloss_labels lab = {c->labels, c->ldt_labels};
    kdloss_mat gm = {g, c->xdt, ldg};
    kdloss_status st = kdloss_jsd(&p, bt, v, st_, te, lab, &loss, rows, gm);
    char tag[160];
    snprintf(tag, sizeof tag, "jsd %s beta=%g x=%s t=%s labels=%d bt=%lld v=%lld ld=%lld", isa,
             beta, kt_dtype_name(c->xdt), kt_dtype_name(c->tdt), c->label_mode, (long long)bt,
             (long long)v, (long long)c->ldx);
    if (!KT_CHECK(st == KDLOSS_OK, "%s: status %s", tag, kdloss_status_string(st))) goto out;
    int64_t n_valid = 0;
    for (int64_t r = 0; r < bt; r++) n_valid += !ignored(c, r);
    double denom = n_valid ? (double)n_valid : 1.0, total = 0, total_mag = 0;
    double geps = c->xdt == KDLOSS_F32 ? 0 : kt_eps(c->xdt);
    int bad = 0;
    for (int64_t r = 0; r < bt; r++) {
        double rs = 0, rmag = 0;
        int ign = ignored(c, r);
        for (int64_t k = 0; k < v; k++) {
            double gr = 0, mag = 0, x = c->xd[r * v + k], y = c->td[r * v + k];
            double l = ign ? 0.0 : ref_jsd_elem(beta, x, y, &gr, &mag);
            rs += l, rmag += mag;
            double gw = gr * gscale / denom;
            double w = exp(x) + exp(y);
            double gtol = 16 * U * (fabs(gr) + ref_wmul(w, 1 + fabs(x) + fabs(y))) * fabs(gscale) / denom +
                          geps * fabs(gw) + kt_tiny(c->xdt) +
                          0x1p-148 * (1 + fabs(x) + fabs(y)) * fabs(gscale) / denom;
            if (bad < 3 && !kt_close(kt_get(g, c->xdt, ldg, r, k), gw, gtol, 0, "%s grad[%lld,%lld]",
                                     tag, (long long)r, (long long)k))
                bad++;
        }
        kt_close(rows[r], rs, 256 * U * rmag + 1e-30, 0, "%s row_loss[%lld]", tag, (long long)r);
        total += rs, total_mag += rmag;
    }
    kt_close(loss, total / denom, (256 * U * total_mag + 1e-30) / denom, 0, "%s loss", tag);
    if (c->label_mode == 2) KT_CHECK(loss == 0.0f, "%s: all ignored must give loss 0, got %g", tag, loss);
out:
    free(g), free(rows);
}

/* forward-only and gradient-only calls agree bitwise with the full call; in place too. */
static void check_variants(const jsd_case *c, double beta, const char *isa) {
    int64_t bt = c->bt, v = c->v;
    size_t es = kdloss_dtype_size(c->xdt), n = (size_t)(bt * c->ldx) * es;
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    p.beta = beta;
    kdloss_cmat sx = {c->x, c->xdt, c->ldx}, te = {c->t, c->tdt, c->ldt};
    kdloss_labels lab = {c->labels, c->ldt_labels};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    void *g1 = malloc(n), *g2 = malloc(n), *xc = malloc(n);
    memcpy(xc, c->x, n);
    float lf = NAN, lo = NAN, li = NAN;
    kdloss_mat gm1 = {g1, c->xdt, c->ldx}, gm2 = {g2, c->xdt, c->ldx}, gin = {xc, c->xdt, c->ldx};
    kdloss_cmat sxc = {xc, c->xdt, c->ldx};
    KT_CHECK(kdloss_jsd(&p, bt, v, sx, te, lab, &lf, NULL, gm1) == KDLOSS_OK, "jsd full");
    KT_CHECK(kdloss_jsd(&p, bt, v, sx, te, lab, &lo, NULL, nomat) == KDLOSS_OK, "jsd fwd");
    KT_CHECK(kdloss_jsd(&p, bt, v, sx, te, lab, NULL, NULL, gm2) == KDLOSS_OK, "jsd grad only");
    KT_CHECK(kdloss_jsd(&p, bt, v, sxc, te, lab, &li, NULL, gin) == KDLOSS_OK, "jsd in place");
    KT_CHECK(!memcmp(&lf, &lo, 4) && !memcmp(&lf, &li, 4), "%s jsd beta=%g: losses %.9g %.9g %.9g",
             isa, beta, lf, lo, li);
    int same = 1;
    for (int64_t r = 0; r < bt; r++) {
        size_t off = (size_t)(r * c->ldx) * es;
        same &= !memcmp((char *)g1 + off, (char *)g2 + off, (size_t)v * es);
        same &= !memcmp((char *)g1 + off, (char *)xc + off, (size_t)v * es);
    }
    KT_CHECK(same, "%s jsd beta=%g %s: gradient-only / in-place gradient differs", isa, beta,
             kt_dtype_name(c->xdt));
    free(g1), free(g2), free(xc);
}

/* JSD(0.5) is symmetric: swapping student and teacher gives the same loss. */
static void check_symmetry(kt_rng *rng) {
    jsd_case c;
    make_case(&c, rng, 40, 1271, 0, KDLOSS_F32, KDLOSS_F32, 0.5, 0);
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    kdloss_cmat a = {c.x, KDLOSS_F32, 0}, b = {c.t, KDLOSS_F32, 0};
    kdloss_labels nol = {NULL, KDLOSS_I64};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    float l1, l2;
    kdloss_jsd(&p, c.bt, c.v, a, b, nol, &l1, NULL, nomat);
    kdloss_jsd(&p, c.bt, c.v, b, a, nol, &l2, NULL, nomat);
    kt_close(l1, l2, 1e-6, 1e-5, "jsd symmetry at beta 0.5");
    free_case(&c);
}

static void check_determinism(kt_rng *rng) {
    jsd_case c;
    make_case(&c, rng, 301, 1271, 0, KDLOSS_F32, KDLOSS_F32, 0.5, 1);
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    kdloss_cmat a = {c.x, KDLOSS_F32, 0}, b = {c.t, KDLOSS_F32, 0};
    kdloss_labels lab = {c.labels, c.ldt_labels};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    float l[3];
    int nt = omp_get_max_threads();
    for (int i = 0; i < 3; i++) {
        omp_set_num_threads(i == 1 ? 1 : nt);
        kdloss_jsd(&p, c.bt, c.v, a, b, lab, &l[i], NULL, nomat);
    }
    omp_set_num_threads(nt);
    KT_CHECK(!memcmp(&l[0], &l[1], 4) && !memcmp(&l[0], &l[2], 4), "jsd determinism: %.9g %.9g %.9g",
             l[0], l[1], l[2]);
    free_case(&c);
}

/* Central differences: of the reference in double (validates the oracle's gradient formula,
 * h = 1e-5, 1e-6 relative), and of the library's summed loss in fp32 (h = 1e-2). */
static void check_finite_differences(kt_rng *rng) {
    for (int bi = 0; bi < 5; bi++) {
        double beta = BETAS[bi];
        jsd_case c;
        make_case(&c, rng, 4, 7, 0, KDLOSS_F32, KDLOSS_F32, beta, 0);
        kdloss_jsd_params p;
        kdloss_jsd_params_default(&p);
        p.beta = beta;
        float *x = c.x, g[28], l0, lp, lm;
        kdloss_cmat a = {x, KDLOSS_F32, 0}, b = {c.t, KDLOSS_F32, 0};
        kdloss_labels nol = {NULL, KDLOSS_I64};
        kdloss_mat nomat = {NULL, KDLOSS_F32, 0}, gm = {g, KDLOSS_F32, 0};
        kdloss_jsd(&p, 4, 7, a, b, nol, &l0, NULL, gm);
        for (int i = 0; i < 28; i++) {
            double gr, mag, hd = 1e-5, dd;
            if (!isfinite(c.xd[i]) || !isfinite(c.td[i])) continue;
            ref_jsd_elem(beta, c.xd[i], c.td[i], &gr, &mag);
            double fd = (ref_jsd_elem(beta, c.xd[i] + hd, c.td[i], &dd, &mag) -
                         ref_jsd_elem(beta, c.xd[i] - hd, c.td[i], &dd, &mag)) / (2 * hd);
            kt_close(gr, fd, 1e-9, 1e-6, "jsd reference finite difference beta=%g [%d]", beta, i);
            if (c.xd[i] < -50 || c.td[i] < -50) continue; /* fp32 FD too coarse there */
            float h = 1e-2f, keep = x[i];
            x[i] = keep + h;
            kdloss_jsd(&p, 4, 7, a, b, nol, &lp, NULL, nomat);
            x[i] = keep - h;
            kdloss_jsd(&p, 4, 7, a, b, nol, &lm, NULL, nomat);
            x[i] = keep;
            double lfd = ((double)lp - lm) / (2.0 * h) ;
            kt_close(g[i], lfd, 2e-3 * (1 + fabs(l0)), 2e-2, "jsd library finite difference beta=%g [%d]", beta, i);
        }
        free_case(&c);
    }
}

/* Gradients above 32 MiB are streamed (non-temporal stores): bitwise equal to small pieces. */
static void check_streamed(kt_rng *rng) {
    int64_t bt = 2200, v = 4096, piece = 100;
    float *x = malloc(sizeof(float) * bt * v), *t = malloc(sizeof(float) * bt * v);
    float *g1 = malloc(sizeof(float) * bt * v), *g2 = malloc(sizeof(float) * bt * v);
    for (int64_t i = 0; i < bt * v; i++) x[i] = (float)(-12 * kt_uniform(rng)), t[i] = (float)(-12 * kt_uniform(rng));
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    kdloss_labels nol = {NULL, KDLOSS_I64};
    for (int bi = 0; bi < 5; bi += 2) {
        p.beta = BETAS[bi];
        p.grad_scale = 1.0; /* per-element scale 1/bt for the batch ... */
        kdloss_jsd(&p, bt, v, (kdloss_cmat){x, KDLOSS_F32, 0}, (kdloss_cmat){t, KDLOSS_F32, 0}, nol, NULL, NULL,
                   (kdloss_mat){g1, KDLOSS_F32, 0});
        p.grad_scale = (double)piece / bt; /* ... and (piece/bt)/piece for each piece */
        for (int64_t r = 0; r < bt; r += piece)
            kdloss_jsd(&p, piece, v, (kdloss_cmat){x + r * v, KDLOSS_F32, 0}, (kdloss_cmat){t + r * v, KDLOSS_F32, 0},
                       nol, NULL, NULL, (kdloss_mat){g2 + r * v, KDLOSS_F32, 0});
        int64_t diff = 0;
        for (int64_t i = 0; i < bt * v; i++) diff += fabsf(g1[i] - g2[i]) > 1e-6f * fabsf(g1[i]); /* scales may differ by an ulp */
        KT_CHECK(diff == 0, "jsd beta=%g: streamed gradient differs in %lld elements", p.beta, (long long)diff);
    }
    free(x), free(t), free(g1), free(g2);
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    static const int64_t VS[] = {1, 7, 1271, 4096, 128256};
    static const int64_t BTS[] = {37, 29, 23, 33, 3};
    int nv = kt_quick() ? 3 : 5;
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    KT_FOR_EACH_ISA(path, "") {
        for (int vi = 0; vi < nv; vi++)
            for (int xi = 0; xi < 3; xi++)
                for (int same = 0; same < 2; same++)
                    for (int bi = 0; bi < 5; bi++) {
                        if (!same && xi == 0) continue;
                        kdloss_dtype tdt = same ? dts[xi] : KDLOSS_F32;
                        int lm = (vi + xi + bi) % 3;
                        jsd_case c;
                        make_case(&c, &rng, BTS[vi], VS[vi], (vi + bi) % 2, dts[xi], tdt, BETAS[bi], lm);
                        check_case(&c, BETAS[bi], bi == 2 ? 3.0 : 1.0, path.name);
                        if (vi == 2) check_variants(&c, BETAS[bi], path.name);
                        free_case(&c);
                    }
    }
    check_symmetry(&rng);
    check_determinism(&rng);
    check_finite_differences(&rng);
    if (!kt_quick()) check_streamed(&rng);
    return kt_finish("test_jsd");
}
