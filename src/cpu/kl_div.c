/* kdloss_kl_div on the CPU: the shared checks (src/common/args.c), then one parallel pass over the
 * rows that writes the gradient (and elementwise / per-row losses) while it sums the loss. */
#include <math.h>

#include "ew_common.h"
#include "check.h"

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
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_kl_geom g;
    kd_spanset spans;
    kdloss_status st = kd_check_kl(&kd_cpu_rules, p, bt, v, input, target, loss, row_loss,
                                   elem_loss, grad, &g, &spans); /* src/common/args.c */
    if (st) return st;

    kd_ew_job job = {0};
    kd_ew_job_operands(&job, v, input, g.ld_in, target, g.ld_t, grad, g.ld_g);
    job.elem = elem_loss.data;
    job.lde = g.ld_el;
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
