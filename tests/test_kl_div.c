/* KL divergence against the double reference: every reduction x log_target x input dtype x
 * target dtype x V x row stride x CPU path, plus forward-only / gradient-only / in-place calls,
 * determinism, finite differences and 64-bit offsets. Tolerances: tests/support/reference.h. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "reference.h"
#include "testutil.h"

#define U 0x1p-24

static const kdloss_reduction REDS[] = {KDLOSS_REDUCTION_NONE, KDLOSS_REDUCTION_SUM,
                                        KDLOSS_REDUCTION_MEAN, KDLOSS_REDUCTION_BATCHMEAN};
static const char *RED_NAMES[] = {"none", "sum", "mean", "batchmean"};

typedef struct {
    int64_t bt, v, ldx, ldt;
    kdloss_dtype xdt, tdt;
    int log_target;
    void *x, *t;       /* packed inputs */
    double *xd, *td;   /* the exact values the library sees, as double */
} kl_case;

/* Input: student log-probs, never -inf (KL(t||y) is infinite there). Target: probabilities
 * (with exact zeros) or log-probs (with -inf). */
static void make_case(kl_case *c, kt_rng *rng, int64_t bt, int64_t v, int pad, kdloss_dtype xdt,
                      kdloss_dtype tdt, int log_target) {
    c->bt = bt, c->v = v, c->xdt = xdt, c->tdt = tdt, c->log_target = log_target;
    c->ldx = v + (pad ? 3 : 0);
    c->ldt = v + (pad ? 17 : 0);
    c->xd = malloc(sizeof(double) * bt * v);
    c->td = malloc(sizeof(double) * bt * v);
    int shift = (int)kt_randint(rng, KT_ROW_KINDS);
    kt_gen_logprobs(rng, c->xd, bt, v, 0, shift);
    kt_gen_logprobs(rng, c->td, bt, v, 1, shift + 1);
    if (!log_target)
        for (int64_t i = 0; i < bt * v; i++) c->td[i] = exp(c->td[i]);
    kt_round_to(c->xd, bt * v, xdt);
    kt_round_to(c->td, bt * v, tdt);
    c->x = kt_pack(c->xd, bt, v, c->ldx, xdt);
    c->t = kt_pack(c->td, bt, v, c->ldt, tdt);
}

static void free_case(kl_case *c) {
    free(c->x), free(c->t), free(c->xd), free(c->td);
}

static double red_scale(kdloss_reduction r, int64_t bt, int64_t v) {
    return r == KDLOSS_REDUCTION_MEAN ? 1.0 / ((double)bt * v)
           : r == KDLOSS_REDUCTION_BATCHMEAN ? 1.0 / bt : 1.0;
}

/* Runs one configuration and compares loss, row loss, elementwise loss and gradient. */
static void check_case(const kl_case *c, kdloss_reduction red, double gscale, double eps, const char *isa) {
    int64_t bt = c->bt, v = c->v, ldg = v + (c->ldx != v ? 5 : 0);
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = red;
    p.log_target = c->log_target;
    p.grad_scale = gscale;
    p.eps = eps;
    size_t ges = kdloss_dtype_size(c->xdt);
    void *g = malloc((size_t)(bt * ldg) * ges);
    float *rows = malloc(sizeof(float) * bt), *elem = NULL, loss = NAN;
    kt_poison(g, bt * ldg, c->xdt);
    int none = red == KDLOSS_REDUCTION_NONE;
    if (none) elem = malloc(sizeof(float) * bt * v);
    kdloss_cmat in = {c->x, c->xdt, c->ldx}, tg = {c->t, c->tdt, c->ldt};
    kdloss_mat gm = {g, c->xdt, ldg}, em = {elem, KDLOSS_F32, 0};
    kdloss_status st = kdloss_kl_div(&p, bt, v, in, tg, none ? NULL : &loss, rows, em, gm);
    char tag[160];
    snprintf(tag, sizeof tag, "kl %s red=%s lt=%d eps=%g x=%s t=%s bt=%lld v=%lld ld=%lld", isa,
             RED_NAMES[red], c->log_target, eps, kt_dtype_name(c->xdt), kt_dtype_name(c->tdt),
             (long long)bt, (long long)v, (long long)c->ldx);
    if (!KT_CHECK(st == KDLOSS_OK, "%s: status %s", tag, kdloss_status_string(st))) goto out;

    double scale = red_scale(red, bt, v), total = 0, total_mag = 0;
    double geps = c->xdt == KDLOSS_F32 ? 0 : kt_eps(c->xdt);
    int bad_g = 0, bad_e = 0;
    for (int64_t r = 0; r < bt; r++) {
        double rs = 0, rmag = 0;
        for (int64_t k = 0; k < v; k++) {
            double gr, mag, x = c->xd[r * v + k], t = c->td[r * v + k];
            double l = ref_kl_elem(c->log_target, eps, x, t, &gr, &mag);
            rs += l, rmag += mag;
            double w = c->log_target ? exp(t) : fabs(t);
            double gw = gr * scale * gscale;
            double gtol = 16 * U * (fabs(gr) + ref_wmul(w, 1 + fabs(x) + fabs(t))) * scale * fabs(gscale) +
                          geps * fabs(gw) + kt_tiny(c->xdt) +
                          0x1p-148 * (1 + fabs(x) + fabs(t)) * scale * fabs(gscale);
            double gg = kt_get(g, c->xdt, ldg, r, k);
            if (bad_g < 3 && !kt_close(gg, gw, gtol, 0, "%s grad[%lld,%lld]", tag, (long long)r, (long long)k))
                bad_g++;
            if (none && bad_e < 3 &&
                !kt_close(elem[r * v + k], l, 16 * U * mag + 1e-37, 0, "%s elem[%lld,%lld]", tag,
                          (long long)r, (long long)k))
                bad_e++;
        }
        kt_close(rows[r], rs, 256 * U * rmag + 1e-30, 0, "%s row_loss[%lld]", tag, (long long)r);
        total += rs, total_mag += rmag;
    }
    if (!none) kt_close(loss, total * scale, (256 * U * total_mag + 1e-30) * scale, 0, "%s loss", tag);
    /* the padding between rows of the gradient is never written */
    if (ldg > v) KT_CHECK(kt_is_poison((char *)g + v * ges, ldg - v, c->xdt), "%s: grad padding written", tag);
out:
    free(g), free(rows), free(elem);
}

/* Forward-only, gradient-only and in-place calls give the same numbers as the full call. */
static void check_variants(const kl_case *c, const char *isa) {
    int64_t bt = c->bt, v = c->v;
    size_t es = kdloss_dtype_size(c->xdt);
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    p.log_target = c->log_target;
    kdloss_cmat in = {c->x, c->xdt, c->ldx}, tg = {c->t, c->tdt, c->ldt};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    void *g1 = malloc((size_t)(bt * c->ldx) * es), *g2 = malloc((size_t)(bt * c->ldx) * es);
    void *xcopy = malloc((size_t)(bt * c->ldx) * es);
    memcpy(xcopy, c->x, (size_t)(bt * c->ldx) * es);
    float l_full = NAN, l_fwd = NAN, l_again = NAN;
    kdloss_mat gm1 = {g1, c->xdt, c->ldx}, gm2 = {g2, c->xdt, c->ldx};
    KT_CHECK(kdloss_kl_div(&p, bt, v, in, tg, &l_full, NULL, nomat, gm1) == KDLOSS_OK, "kl full");
    KT_CHECK(kdloss_kl_div(&p, bt, v, in, tg, &l_fwd, NULL, nomat, nomat) == KDLOSS_OK, "kl fwd");
    KT_CHECK(kdloss_kl_div(&p, bt, v, in, tg, NULL, NULL, nomat, gm2) == KDLOSS_OK, "kl grad only");
    KT_CHECK(memcmp(&l_full, &l_fwd, 4) == 0, "%s kl lt=%d: forward-only loss %.9g != full %.9g",
             isa, c->log_target, l_fwd, l_full);
    int same = 1;
    for (int64_t r = 0; r < bt; r++)
        same &= !memcmp((char *)g1 + r * c->ldx * es, (char *)g2 + r * c->ldx * es, (size_t)v * es);
    KT_CHECK(same, "%s kl lt=%d %s: gradient-only differs from full", isa, c->log_target,
             kt_dtype_name(c->xdt));
    /* in place: the gradient overwrites a copy of the input */
    kdloss_cmat inc = {xcopy, c->xdt, c->ldx};
    kdloss_mat gin = {xcopy, c->xdt, c->ldx};
    KT_CHECK(kdloss_kl_div(&p, bt, v, inc, tg, &l_again, NULL, nomat, gin) == KDLOSS_OK, "kl in place");
    KT_CHECK(memcmp(&l_again, &l_full, 4) == 0, "%s kl in-place loss differs", isa);
    same = 1;
    for (int64_t r = 0; r < bt; r++)
        same &= !memcmp((char *)g1 + r * c->ldx * es, (char *)xcopy + r * c->ldx * es, (size_t)v * es);
    KT_CHECK(same, "%s kl in-place gradient differs", isa);
    free(g1), free(g2), free(xcopy);
}

/* Same inputs, one thread vs all threads, twice: bitwise identical loss and gradient. */
static void check_determinism(kt_rng *rng) {
    kl_case c;
    make_case(&c, rng, 301, 1271, 0, KDLOSS_F32, KDLOSS_F32, 0);
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    kdloss_cmat in = {c.x, c.xdt, 0}, tg = {c.t, c.tdt, 0};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    float l[3];
    int nt = omp_get_max_threads();
    for (int i = 0; i < 3; i++) {
        omp_set_num_threads(i == 1 ? 1 : nt);
        kdloss_kl_div(&p, c.bt, c.v, in, tg, &l[i], NULL, nomat, nomat);
    }
    omp_set_num_threads(nt);
    KT_CHECK(!memcmp(&l[0], &l[1], 4) && !memcmp(&l[0], &l[2], 4),
             "kl determinism: %.9g %.9g %.9g", l[0], l[1], l[2]);
    free_case(&c);
}

/* The gradient of the summed loss by central differences through the library itself (fp32,
 * so h is large: error O(u / h) + O(h^2) stays under 1e-3 relative), and through the reference
 * in double (h = 1e-5, 1e-6 relative). */
static void check_finite_differences(kt_rng *rng) {
    kl_case c;
    make_case(&c, rng, 4, 7, 0, KDLOSS_F32, KDLOSS_F32, 1);
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_SUM;
    p.log_target = 1;
    float *x = c.x, g[28], lp, lm;
    kdloss_cmat in = {x, KDLOSS_F32, 0}, tg = {c.t, c.tdt, 0};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0}, gm = {g, KDLOSS_F32, 0};
    float l0;
    kdloss_kl_div(&p, 4, 7, in, tg, &l0, NULL, nomat, gm);
    for (int i = 0; i < 28; i++) {
        if (c.xd[i] < -50) continue; /* the very negative rows: loss in the 1e4s, fp32 FD too coarse */
        float h = 1e-2f, keep = x[i];
        x[i] = keep + h;
        kdloss_kl_div(&p, 4, 7, in, tg, &lp, NULL, nomat, nomat);
        x[i] = keep - h;
        kdloss_kl_div(&p, 4, 7, in, tg, &lm, NULL, nomat, nomat);
        x[i] = keep;
        double fd = ((double)lp - lm) / (2.0 * h);
        kt_close(g[i], fd, 1e-3 * (1 + fabs(l0)), 1e-3, "kl library finite difference [%d]", i);
        double gr, mag, lpd, lmd, hd = 1e-5;
        ref_kl_elem(1, 1e-10, c.xd[i], c.td[i], &gr, &mag);
        lpd = ref_kl_elem(1, 1e-10, c.xd[i] + hd, c.td[i], &(double){0}, &mag);
        lmd = ref_kl_elem(1, 1e-10, c.xd[i] - hd, c.td[i], &(double){0}, &mag);
        kt_close(gr, (lpd - lmd) / (2 * hd), 1e-9, 1e-6, "kl reference finite difference [%d]", i);
        ref_kl_elem(0, 1e-10, c.xd[i], exp(c.td[i]), &gr, &mag);
        lpd = ref_kl_elem(0, 1e-10, c.xd[i] + hd, exp(c.td[i]), &(double){0}, &mag);
        lmd = ref_kl_elem(0, 1e-10, c.xd[i] - hd, exp(c.td[i]), &(double){0}, &mag);
        kt_close(gr, (lpd - lmd) / (2 * hd), 1e-9, 1e-6, "kl reference (prob) finite difference [%d]", i);
    }
    free_case(&c);
}

/* A row stride above 2^31 elements: offsets must be 64-bit. The matrix is mapped, not
 * touched, so only the rows' pages become real memory. */
static void check_64bit_offsets(kt_rng *rng) {
    int64_t v = 33, ld = ((int64_t)1 << 31) + 7, bt = 2;
    size_t bytes = (size_t)((bt - 1) * ld + v) * 2;
    uint16_t *x = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (x == MAP_FAILED) {
        printf("skip 64-bit offsets: mmap failed\n");
        return;
    }
    double xd[66], td[66];
    kt_gen_logprobs(rng, xd, 2, v, 0, 0);
    kt_gen_logprobs(rng, td, 2, v, 0, 1);
    kt_round_to(xd, 66, KDLOSS_BF16);
    void *packed = kt_pack(xd, 2, v, v, KDLOSS_BF16);
    memcpy(x, packed, (size_t)v * 2);
    memcpy(x + ld, (uint16_t *)packed + v, (size_t)v * 2);
    float t[66], g[66], loss;
    for (int i = 0; i < 66; i++) t[i] = (float)exp(td[i]), td[i] = t[i];
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_SUM;
    kdloss_cmat in = {x, KDLOSS_BF16, ld}, tg = {t, KDLOSS_F32, 0};
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    uint16_t gb[66];
    kdloss_mat gm = {gb, KDLOSS_BF16, 0};
    kdloss_status st = kdloss_kl_div(&p, 2, v, in, tg, &loss, NULL, nomat, gm);
    KT_CHECK(st == KDLOSS_OK, "64-bit offsets: %s", kdloss_status_string(st));
    double want = 0, mag = 0, gr, m;
    for (int i = 0; i < 66; i++) want += ref_kl_elem(0, 1e-10, xd[i], td[i], &gr, &m), mag += m;
    kt_close(loss, want, 256 * U * mag, 0, "64-bit offsets loss");
    (void)g;
    munmap(x, bytes);
    free(packed);
}

/* A gradient above 32 MiB is written with non-temporal stores: it must equal, bit for bit, the
 * gradient computed in small pieces (which use ordinary stores). */
static void check_streamed(kt_rng *rng) {
    int64_t bt = 2200, v = 4096, piece = 100;
    float *x = malloc(sizeof(float) * bt * v), *t = malloc(sizeof(float) * bt * v);
    float *g1 = malloc(sizeof(float) * bt * v), *g2 = malloc(sizeof(float) * bt * v);
    for (int64_t i = 0; i < bt * v; i++) x[i] = (float)(-10 * kt_uniform(rng)), t[i] = (float)kt_uniform(rng) / v;
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_SUM;
    kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
    for (int lt = 0; lt < 2; lt++) {
        p.log_target = lt;
        float l;
        kdloss_kl_div(&p, bt, v, (kdloss_cmat){x, KDLOSS_F32, 0}, (kdloss_cmat){t, KDLOSS_F32, 0}, &l, NULL,
                      nomat, (kdloss_mat){g1, KDLOSS_F32, 0});
        for (int64_t r = 0; r < bt; r += piece)
            kdloss_kl_div(&p, piece, v, (kdloss_cmat){x + r * v, KDLOSS_F32, 0},
                          (kdloss_cmat){t + r * v, KDLOSS_F32, 0}, &l, NULL, nomat,
                          (kdloss_mat){g2 + r * v, KDLOSS_F32, 0});
        KT_CHECK(!memcmp(g1, g2, sizeof(float) * bt * v), "kl lt=%d: streamed gradient differs", lt);
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
                    for (int lt = 0; lt < 2; lt++) {
                        kdloss_dtype tdt = same ? dts[xi] : KDLOSS_F32;
                        if (!same && xi == 0) continue; /* fp32/fp32 is the same-dtype case */
                        kl_case c;
                        make_case(&c, &rng, BTS[vi], VS[vi], (vi + xi + lt) % 2, dts[xi], tdt, lt);
                        for (int ri = 0; ri < 4; ri++)
                            check_case(&c, REDS[ri], ri == 2 ? -2.5 : 1.0,
                                       ri == 1 ? 0.0 : 1e-10, path.name);
                        if (vi == 2) check_variants(&c, path.name);
                        free_case(&c);
                    }
    }
    check_determinism(&rng);
    check_finite_differences(&rng);
    if (!kt_quick()) check_64bit_offsets(&rng), check_streamed(&rng);
    return kt_finish("test_kl_div");
}
