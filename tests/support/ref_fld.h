/* Double-precision reference of the fused-linear JSD distillation loss (docs/MATH.md section 4),
 * written from the math with plain loops over the full BT x V logits: the oracle the library is
 * tested against. Its own gradients are verified by central differences (test_fld_ref.c).
 * Also: a test problem (random inputs, rounded to the operand dtypes, packed with row strides). */
#ifndef KDLOSS_REF_FLD_H
#define KDLOSS_REF_FLD_H

#include <stdint.h>

#include "kdloss.h"
#include "testutil.h"

typedef struct kt_fld_cfg {
    double beta, temperature, w_hard, w_soft, grad_scale;
    int64_t ignore_index;
} kt_fld_cfg;

/* z (bt x v) = x (bt x h) w^T (w: v x h) + b (b [v] or NULL); all contiguous. */
void kt_ref_logits(int64_t bt, int64_t h, int64_t v, const double *x, const double *w,
                   const double *b, double *z);

/* From full logits zs, zt (bt x v): the loss and its parts (already divided by n_valid) and,
 * when dz is not NULL, dz = dloss/dzs (bt x v) times grad_scale.
 * dz_mag (bt x v, or NULL) gets the size of what dz is made of, the scale of the rounding error
 * any fp32 evaluation of dz makes (cancellation included):
 *   |grad_scale|/n (w_hard (p + onehot) + w_soft/T (|g| + q (|sum g| + 1)))
 * with p = softmax(zs), q = softmax(zs/T), g = dJSD/dX; the q term also covers the error the
 * fp32 logits themselves carry into p, q and g. */
void kt_ref_fld_dz(const kt_fld_cfg *c, int64_t bt, int64_t v, const double *zs,
                   const double *zt, const int64_t *labels, double *loss, double *soft,
                   double *hard, double *dz, double *dz_mag);

/* dxs (bt x hs) = dz ws, dws (v x hs) = dz^T xs, dbs [v] = column sums of dz; any may be NULL.
 * absolute = 1 uses |xs| and |ws| (dz is then a dz_mag): the error scale of each output.
 * Only rows r with r % stride == 0 of dxs and dws are formed (the others are set to 0), so
 * large shapes can be checked on a sample of rows; dbs is always whole. */
void kt_ref_fld_grads(int64_t bt, int64_t hs, int64_t v, const double *dz, const double *xs,
                      const double *ws, int absolute, int64_t stride, double *dxs, double *dws,
                      double *dbs);

/* ---- test problems ---- */
typedef struct kt_fld_problem {
    int64_t bt, hs, ht, v;
    kdloss_dtype ds, dt;   /* student (xs, ws, bs) and teacher (xt, wt, bt) dtypes */
    /* values as the library sees them (rounded to ds / dt), contiguous, double */
    double *xs, *ws, *bias_s, *xt, *wt, *bias_t; /* biases NULL when there are none */
    int64_t *labels;       /* [bt], some rows ignore_index */
    int32_t *labels32;     /* the same labels as int32 */
    int64_t ignore_index;
    /* packed copies in the operand dtypes with these row strides */
    void *pxs, *pws, *pbias_s, *pxt, *pwt, *pbias_t;
    int64_t ld_xs, ld_ws, ld_xt, ld_wt;
} kt_fld_problem;

/* Random problem: logits of spread about `scale` (student and teacher independent), labels in
 * [0, v) with every row r where (r % ignore_every) == 1 ignored (ignore_every 0: none;
 * ignore_every 1: all). pad > 0 gives every matrix a row stride of cols + pad. */
void kt_fld_problem_make(kt_fld_problem *p, kt_rng *rng, int64_t bt, int64_t hs, int64_t ht,
                         int64_t v, kdloss_dtype ds, kdloss_dtype dt, int bias, double scale,
                         int ignore_every, int64_t ignore_index, int64_t pad);
void kt_fld_problem_free(kt_fld_problem *p);

#endif
