/* The divergence registry (KD_DIVERGENCES: every public divergence, its name, parameter and
 * coefficient builder) and the element operations it maps to (KD_DIV_OPS), shared by the CPU
 * (scalar and SIMD) and CUDA paths; the element math itself is in div_elem.h.
 *
 * Every element operation sees x = student log-prob, y = teacher log-prob and, for the mixtures,
 * a = y - ca (log of the teacher's share of M), b = x - cb (log of the student's share), so
 * M = e^a + e^b. Adding a divergence (docs/ARCHITECTURE.md): its kdloss_divergence value
 * (kdloss.h), a row in KD_DIVERGENCES with its builder (here), its element function (a row in
 * KD_DIV_OPS and div_elem.h) unless an existing one serves, its float64 reference
 * (tests/support/reference.c) and docs/MATH.md. Names, checks, the CLI, make bench, Python and
 * the tests' case table enumerate the registry. */
#ifndef KDLOSS_DIV_COEF_H
#define KDLOSS_DIV_COEF_H

#include <math.h>

#include "kdloss.h"

/* X(ENUM, name): every element operation. Each path expands this list into one specialised
 * loop per operation, so the operation is a compile-time constant inside the loops. */
#define KD_DIV_OPS(X)                                                                          \
    X(FWD, fwd)   /* KL(P||Q): P (y - x)                                  */                   \
    X(REV, rev)   /* KL(Q||P): Q (x - y)                                  */                   \
    X(JSD, jsd)   /* beta KL(P||M) + (1-beta) KL(Q||M), beta in (0, 1)    */                   \
    X(SKF, skf)   /* KL(P||M), M = alpha P + (1-alpha) Q, alpha in (0, 1] */                   \
    X(SKR, skr)   /* KL(Q||M), M = alpha Q + (1-alpha) P, alpha in (0, 1] */                   \
    X(TVD, tvd)   /* 1/2 |P - Q|                                          */

enum {
#define KD_DIV_ENUM(E, n) KD_OP_##E,
    KD_DIV_OPS(KD_DIV_ENUM)
#undef KD_DIV_ENUM
    KD_OP_COUNT
};

/* Constants of one call: the operation and the negated log mixture weights (ca = -log of the
 * teacher's weight in M, cb = -log of the student's), computed once in double on the host. */
typedef struct kd_div_coef {
    int op;
    float ca, cb;
    float wa, wb; /* e^-ca, e^-cb: the weights themselves (div_elem.h's KDE_PQ form) */
} kd_div_coef;

/* A mixture's constants from w, the teacher's weight in M (student's 1 - w), or the student's
 * when student_w: the negated logs in double, -log(1 - w) through log1p (exact for small w).
 * A weight 1 on the teacher (skew forward at alpha 1: M = P) gives cb = +inf, which the
 * element function handles. */
static inline kd_div_coef kd_coef_mixture(int op, double w, int student_w) {
    float lw = (float)-log(w), l1w = (float)-log1p(-w);
    kd_div_coef c = {op, student_w ? l1w : lw, student_w ? lw : l1w,
                     (float)(student_w ? 1.0 - w : w), (float)(student_w ? w : 1.0 - w)};
    return c;
}

static inline kd_div_coef kd_coef_plain(int op) {
    kd_div_coef c = {op, 0.0f, 0.0f, 0.0f, 0.0f};
    return c;
}

/* The builders, one per public divergence, for checked parameters. The end points of beta and
 * alpha where a mixture weight is 0 (whose -log is +inf) become the plain KL they equal, so the
 * element functions never see an infinite constant that would meet another infinity. */
static inline kd_div_coef kd_coef_forward_kl(const kdloss_div_params *d) {
    (void)d;
    return kd_coef_plain(KD_OP_FWD);
}

static inline kd_div_coef kd_coef_reverse_kl(const kdloss_div_params *d) {
    (void)d;
    return kd_coef_plain(KD_OP_REV);
}

static inline kd_div_coef kd_coef_jsd(const kdloss_div_params *d) { /* M = beta P + (1-beta) Q */
    if (d->beta == 0.0 || d->beta == 1.0) return kd_coef_plain(d->beta == 0.0 ? KD_OP_FWD : KD_OP_REV);
    return kd_coef_mixture(KD_OP_JSD, d->beta, 0);
}

static inline kd_div_coef kd_coef_skew_forward_kl(const kdloss_div_params *d) {
    /* M = alpha P + (1-alpha) Q */
    return d->alpha == 0.0 ? kd_coef_plain(KD_OP_FWD) : kd_coef_mixture(KD_OP_SKF, d->alpha, 0);
}

static inline kd_div_coef kd_coef_skew_reverse_kl(const kdloss_div_params *d) {
    /* M = alpha Q + (1-alpha) P: alpha is the student's weight */
    return d->alpha == 0.0 ? kd_coef_plain(KD_OP_REV) : kd_coef_mixture(KD_OP_SKR, d->alpha, 1);
}

static inline kd_div_coef kd_coef_tvd(const kdloss_div_params *d) {
    (void)d;
    return kd_coef_plain(KD_OP_TVD);
}

/* X(ENUM, name, PARAM, builder): every public divergence, in kdloss_divergence order.
 *   ENUM     its kdloss_divergence suffix (KDLOSS_DIV_<ENUM>);
 *   name     its string in the C API (kdloss_divergence_name / _from_name), the CLI and Python;
 *   PARAM    the parameter it reads: NONE, BETA or ALPHA (each in [0, 1]; kd_div_check);
 *   builder  its kd_div_coef from checked parameters (above). */
#define KD_DIVERGENCES(X)                                                                      \
    X(FORWARD_KL, "forward_kl", NONE, kd_coef_forward_kl)                                      \
    X(REVERSE_KL, "reverse_kl", NONE, kd_coef_reverse_kl)                                      \
    X(JSD, "jsd", BETA, kd_coef_jsd)                                                           \
    X(SKEW_FORWARD_KL, "skew_forward_kl", ALPHA, kd_coef_skew_forward_kl)                      \
    X(SKEW_REVERSE_KL, "skew_reverse_kl", ALPHA, kd_coef_skew_reverse_kl)                      \
    X(TVD, "tvd", NONE, kd_coef_tvd)

/* The operation for a checked kdloss_div_params. */
static inline kd_div_coef kd_div_coef_make(const kdloss_div_params *d) {
    switch (d->divergence) {
#define KD_DIV_BUILD(E, n, P, builder)                                                         \
    case KDLOSS_DIV_##E: return builder(d);
        KD_DIVERGENCES(KD_DIV_BUILD)
#undef KD_DIV_BUILD
    default: return kd_coef_forward_kl(d); /* not reached: checked */
    }
}

#endif /* KDLOSS_DIV_COEF_H */
