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

/* Shapes: input, target, elem_loss, grad (BT x V); row_loss [BT]; loss [1]. */
kdloss_status kdloss_kl_div(const kdloss_kl_params *p, int64_t bt, int64_t v, kdloss_cmat input,
                            kdloss_cmat target, float *loss, float *row_loss,
                            kdloss_mat elem_loss, kdloss_mat grad) {
    kdloss_status st = kd_kl_check_args(p, bt, v, loss != NULL, elem_loss.data != NULL);
    if (st) return st;

    kd_ew_job job = {0};
    kd_span ins[2], outs[4], sp[3];
    if ((st = kd_ew_check_pair(bt, v, input, target, grad, &job, sp))) return st;
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
    if (!kd_aligned(loss, sizeof(float)) || !kd_aligned(row_loss, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    int in_place = grad.data && grad.data == input.data && job.ldg == job.ldx;
    if ((st = kd_ew_check_overlap(ins, 2, outs, 4, in_place))) return st;

    double scale = kd_kl_reduction_scale(p->reduction, bt, v);
    job.gscale = (float)(scale * p->grad_scale);
    job.want_loss = loss || row_loss;
    job.stream_grad = grad.data && bt * v * (int64_t)kdloss_dtype_size(job.xdt) > KD_STREAM_BYTES;
    job.log_target = p->log_target;
    job.eps = (float)p->eps;
    double total = kd_rows_sum(bt, kd_kl_row_fn(), &job, row_loss);
    if (loss) *loss = (float)(total * scale);
    return KDLOSS_OK;
}
