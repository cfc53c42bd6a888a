/* The divergence family's element operations and their call constants, shared by the CPU
 * (scalar and SIMD) and CUDA paths. A public divergence (kdloss_divergence + beta, alpha) maps
 * to one element operation with two constants; the element math itself is in div_elem.h.
 *
 * Every element operation sees x = student log-prob, y = teacher log-prob and, for the mixtures,
 * a = y - ca (log of the teacher's share of M), b = x - cb (log of the student's share), so
 * M = e^a + e^b. Adding a divergence: a row in KD_DIV_OPS, its element function in div_elem.h,
 * a case in kd_div_coef_make, the public enum value, a reference and tests. */
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

/* The operation for a checked kdloss_div_params. The end points of beta and alpha where a
 * mixture weight is 0 (whose -log is +inf) become the plain KL they equal, so the element
 * functions never see an infinite constant that would meet another infinity. */
static inline kd_div_coef kd_div_coef_make(const kdloss_div_params *d) {
    kd_div_coef c = {KD_OP_FWD, 0.0f, 0.0f, 0.0f, 0.0f};
    double w; /* the parameter w of the mixture w P + (1-w) Q (JSD, skew forward) or w Q + ... */
    switch (d->divergence) {
    case KDLOSS_DIV_REVERSE_KL: c.op = KD_OP_REV; return c;
    case KDLOSS_DIV_TVD: c.op = KD_OP_TVD; return c;
    case KDLOSS_DIV_JSD:
        w = d->beta;
        if (w == 0.0 || w == 1.0) {
            c.op = w == 0.0 ? KD_OP_FWD : KD_OP_REV;
            return c;
        }
        c.op = KD_OP_JSD;
        break;
    case KDLOSS_DIV_SKEW_FORWARD_KL:
        w = d->alpha;
        if (w == 0.0) return c;
        c.op = KD_OP_SKF;
        break;
    case KDLOSS_DIV_SKEW_REVERSE_KL:
        w = d->alpha;
        if (w == 0.0) {
            c.op = KD_OP_REV;
            return c;
        }
        /* M = alpha Q + (1-alpha) P: the teacher's weight is 1 - alpha */
        c.op = KD_OP_SKR;
        c.ca = (float)-log1p(-w);
        c.cb = (float)-log(w);
        c.wa = (float)(1.0 - w);
        c.wb = (float)w;
        return c;
    default: return c; /* FORWARD_KL */
    }
    /* teacher weight w, student weight 1 - w; -log(1 - w) through log1p (exact for small w).
     * w = 1 (skew forward only) gives cb = +inf: M = P, which the element function handles */
    c.ca = (float)-log(w);
    c.cb = (float)-log1p(-w);
    c.wa = (float)w;
    c.wb = (float)(1.0 - w);
    return c;
}

#endif /* KDLOSS_DIV_COEF_H */
