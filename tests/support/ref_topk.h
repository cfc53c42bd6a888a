/* Double-precision reference of the sparse top-k teacher losses (docs/MATH.md section 8),
 * written from the definitions there and NOT from src/common/topk_row.h (it calls no library
 * code): the oracle kdloss_topk_distill_logits and kdloss_fused_linear_topk_distill are tested
 * against (tests/test_topk.c, tests/fuzz/fuzz_api.c).
 *
 * Every tail mode is written as one construction: the student's log-probs of a few BINS, each
 * bin a set of columns, normalized over a DOMAIN of columns,
 *     x_b = lse(u_j : j in b) - lse(u_j : j in domain),   u = z / T,
 * and the teacher's log-prob y_b of each bin; the row loss is D = sum_b e(x_b, y_b) with e the
 * divergence's element function (ref_div_elem, tests/support/reference.h). The modes:
 *   bucket          bins {k} for k in S and, when a column lies outside S, the tail bin
 *                   (the columns outside S); domain: all V columns. y_k = lp_k,
 *                   y_tail = log(max(-expm1(lse(lp_S)), 2^-126)).
 *   renorm_both     bins {k} for k in S; domain S. y_k = lp_k - lse(lp_S).
 *   renorm_teacher  bins {k} for k in S; domain all V. y_k = lp_k - lse(lp_S). (forward KL)
 * The gradient is the chain rule of that construction, the same for every mode:
 *     dx_b/du_j = [j in b] exp(u_j - lse_b) - [j in domain] exp(u_j - lse_domain)
 *     dD/du_j   = sum_{b containing j} g_b exp(u_j - lse_b) - [j in domain] Q_j sum_b g_b
 * (g_b = de/dx at bin b), and dD/dz = dD/du / T. test_topk.c checks this derivation against
 * central differences of the loss.
 *
 * Besides the values the reference returns error scales, in the style of reference.h:
 *   mag     the size of what an fp32 evaluation of the loss rounds: per bin |e(x_b, y_b)| plus
 *           2 (P_b + Q_b) (2 + |x_b| + |y_b| + lw): the weights times the log-differences'
 *           size (the fp32 log-probs carry an absolute error of about u (|x| + |y| + the log
 *           mixture weights lw)), once for the term and once for the log-probs' own error;
 *           a log-prob of -inf counts 0 there (its weight is 0).
 *   cond    an ABSOLUTE uncertainty of the loss that does not scale with fp32 rounding: the
 *           teacher's tail 1 - sum_S P is formed in double from |S| values and has an absolute
 *           error of about (|S| + 2) 2^-53; where the tail is tiny (top-k mass within 1e-9 of 1)
 *           that is a large relative error of y_tail (the definition is ill-conditioned there),
 *           and where it straddles the 2^-126 floor either side may be taken. cond is
 *           |de/dy_tail| <= (P + Q)(2 + |x| + |y| + lw) times that spread of y_tail. 0 in the
 *           renormalizing modes.
 *   dz_mag  per logit, the size of the terms of dD/dz (cancellation included), the scale of an
 *           fp32 evaluation's error: sum over the bins holding j of w_bj (|g_b| + (P_b + Q_b) e_b)
 *           (2 + |log w_bj|) plus Q_j (sum_b (|g_b| + (P_b + Q_b) e_b) + |G| (2 + |x_j|)), / T.
 *   dz_cond per logit, the absolute uncertainty of dD/dz: the teacher tail's (above) through
 *           g_tail, and TVD's subgradient: where a bin's P and Q agree to fp32 resolution
 *           (|x_b - y_b| <= 64 u (2 + |x_b| + |y_b|)) the library may take either side of the
 *           kink, so g_b is known only within [-Q_b/2, Q_b/2].
 *
 * A row with no used slot has D = 0 and a zero gradient. A renormalized teacher with every
 * used log-prob -inf has no defined loss (0/0): the reference returns NaN (the tests never
 * build such a row; the fuzzer skips it). Ids are assumed valid (distinct, in [0, V) or -1). */
#ifndef KDLOSS_REF_TOPK_H
#define KDLOSS_REF_TOPK_H

#include <stdint.h>

#include "kdloss.h"

/* The teacher tail's floor (MATH.md section 8): the smallest normal fp32. */
#define REF_TOPK_TAIL_FLOOR 0x1p-126

typedef struct ref_topk_row_out {
    double loss; /* D */
    double mag;  /* error scale of the loss (see above) */
    double cond; /* absolute uncertainty of the loss (see above) */
    int n_used;  /* |S| */
    int has_tail;/* 1 when the bucket has its tail bin */
} ref_topk_row_out;

/* One row. z [v] untempered student logits; ids [k] (-1 = unused), lp [k] the teacher's log-probs
 * (read at used slots only); t the temperature. dz, dz_mag, dz_cond: [v] each, or NULL. */
ref_topk_row_out ref_topk_row(const kdloss_div_params *d, kdloss_topk_tail tail, const double *z,
                              int64_t v, const int64_t *ids, const double *lp, int64_t k, double t,
                              double *dz, double *dz_mag, double *dz_cond);

/* The fused-linear form on given logits (docs/MATH.md sections 4 and 8):
 *   loss = (w_hard CE_sum + w_soft soft_sum (t2_scale ? T^2 : 1)) / max(1, n_valid)
 * with CE on the untempered logits (lse(z) - z[label]) and soft the row loss above. */
typedef struct ref_topk_cfg {
    kdloss_div_params div;
    kdloss_topk_tail tail;
    double temperature, w_hard, w_soft, grad_scale;
    int t2_scale;
    int64_t ignore_index;
} ref_topk_cfg;

typedef struct ref_topk_fused_out {
    double loss, soft, hard;    /* soft, hard: already divided by n_valid, before their weights */
    int64_t n_valid;
} ref_topk_fused_out;

/* Per row of the fused form (0 on ignored rows). */
typedef struct ref_topk_fused_row {
    double soft, soft_mag, soft_cond; /* D (no weight, no T^2), its error scale and uncertainty */
    double soft_sens;                 /* sum_j dz_mag_j of D alone: |dD| <= soft_sens max_j |dz_j|
                                         for a perturbation dz of the logits (first order)      */
    double hard, lse;                 /* lse(z) - z[label] (0 without labels), lse(z) untempered */
} ref_topk_fused_row;

/* zs (bt x v) contiguous; ids, lp (bt x k) contiguous; labels [bt] or NULL (every row kept).
 * rows [bt] or NULL. dz (bt x v) or NULL: d loss / d zs times grad_scale; dz_mag, dz_cond
 * (bt x v) or NULL: its error scale (the soft part's dz_mag plus, for the hard part,
 * w_hard (p_j + [j = label]) with p = softmax(z)) and absolute uncertainty, both times
 * |grad_scale| / n_valid and the soft part's weight. */
void ref_topk_fused(const ref_topk_cfg *c, int64_t bt, int64_t v, int64_t k, const double *zs,
                    const int64_t *ids, const double *lp, const int64_t *labels,
                    ref_topk_fused_out *out, ref_topk_fused_row *rows, double *dz,
                    double *dz_mag, double *dz_cond);

/* Tolerances of the fused form's outputs in fp32 (u = 2^-24), for test_topk and the fuzzer:
 *   err[r]      a bound on the fp32 logits' error in row r: (H + 1) u max_j (sum_h |x_rh| |w_jh|
 *               + |b_j|), the worst-case error of an fp32 dot product of H terms plus the bias
 *               (ref_topk_logit_err, from the float64 operands);
 *   row soft    256 u soft_mag + soft_cond + soft_sens err (the row's own rounding, the teacher
 *               tail's spread, and the logits' error carried to first order);
 *   row hard    2 err + 8 u (1 + |lse| + |z_label|);   row lse   err + 8 u (1 + |lse|);
 *   soft, hard, loss   the row bounds summed over kept rows, weighted as the outputs are
 *               ((t2_scale ? T^2 : 1) w_soft, w_hard), / max(1, n_valid), + 4 u |value|.
 * Row arrays may be NULL. */
void ref_topk_logit_err(int64_t bt, int64_t h, int64_t v, const double *x, const double *w,
                        const double *b, double *err);

typedef struct ref_topk_tols {
    double loss, soft, hard;
} ref_topk_tols;

void ref_topk_fused_tols(const ref_topk_cfg *c, int64_t bt, int64_t v, const double *zs,
                         const int64_t *labels, const ref_topk_fused_out *o,
                         const ref_topk_fused_row *rows, const double *err, ref_topk_tols *t,
                         double *row_soft_tol, double *row_hard_tol, double *row_lse_tol);

#endif
