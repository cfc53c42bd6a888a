/* kdloss_kl_div on the CPU: validation, then one parallel pass over the rows that writes the
 * gradient (and elementwise / per-row losses) while it sums the loss. */
#include <math.h>

#include "ew_common.h"

void kdloss_kl_params_default(kdloss_kl_params *p) {
    if (!p) return;
    p->reduction = KDLOSS_REDUCTION_MEAN;
    p->log_target = 0;
    p->eps = 1e-10;
    p->grad_scale = 1.0;
}

/* Loss scale of a reduction: 1, 1, 1/(BT*V), 1/BT. */
static double reduction_scale(kdloss_reduction r, int64_t bt, int64_t v) {
    switch (r) {
    case KDLOSS_REDUCTION_MEAN: return 1.0 / ((double)bt * (double)v);
    case KDLOSS_REDUCTION_BATCHMEAN: return 1.0 / (double)bt;
    default: return 1.0;
    }
}

/* Shapes: input, target, elem_loss, grad (BT x V); row_loss [BT]; loss [1]. */
kdloss_status kdloss_kl_div(const kdloss_kl_params *p, int64_t bt, int64_t v, kdloss_cmat input,
                            kdloss_cmat target, float *loss, float *row_loss,
                            kdloss_mat elem_loss, kdloss_mat grad) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    if (p->reduction < KDLOSS_REDUCTION_NONE || p->reduction > KDLOSS_REDUCTION_BATCHMEAN)
        return KDLOSS_ERR_INVALID_REDUCTION;
    if ((p->log_target != 0 && p->log_target != 1) || !(p->eps >= 0.0) || !isfinite(p->eps) ||
        !isfinite(p->grad_scale))
        return KDLOSS_ERR_INVALID_PARAM;
    int none = p->reduction == KDLOSS_REDUCTION_NONE;
    /* "none" has no scalar loss; elementwise loss exists only for "none" */
    if ((none && loss) || (!none && elem_loss.data)) return KDLOSS_ERR_INVALID_PARAM;

    kd_ew_job job = {0};
    kd_span ins[2], outs[4], sp[3];
    kdloss_status st = kd_ew_check_pair(bt, v, input, target, grad, &job, sp);
    if (st) return st;
    ins[0] = sp[0];
    ins[1] = sp[1];
    outs[0] = sp[2];
    outs[1] = kd_vec_span(row_loss, bt, sizeof(float));
    outs[2] = kd_vec_span(loss, 1, sizeof(float));
    outs[3].lo = outs[3].hi = NULL;
    if (elem_loss.data) {
        if (elem_loss.dtype != KDLOSS_F32) return KDLOSS_ERR_INVALID_DTYPE;
        if ((st = kd_check_fmat(bt, v, elem_loss.data, elem_loss.dtype, elem_loss.ld, &job.lde,
                                &outs[3])))
            return st;
        job.elem = elem_loss.data;
    }
    if (!loss && !row_loss && !elem_loss.data && !grad.data) return KDLOSS_ERR_NO_OUTPUT;
    int in_place = grad.data && grad.data == input.data && job.ldg == job.ldx;
    if ((st = kd_ew_check_overlap(ins, 2, outs, 4, in_place))) return st;

    double scale = reduction_scale(p->reduction, bt, v);
    job.gscale = (float)(scale * p->grad_scale);
    job.want_loss = loss || row_loss;
    job.stream_grad = grad.data && bt * v * (int64_t)kdloss_dtype_size(job.xdt) > KD_STREAM_BYTES;
    job.log_target = p->log_target;
    job.eps = (float)p->eps;
    double total = kd_rows_sum(bt, kd_kl_row_fn(), &job, row_loss);
    if (loss) *loss = (float)(total * scale);
    return KDLOSS_OK;
}
