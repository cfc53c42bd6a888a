/* kdloss_distill on the CPU (and kdloss_jsd, its JSD wrapper): validation (labels included)
 * before anything is written, then one parallel pass over the rows that writes the gradient
 * while it sums the loss. The divergence's element math is div_elem.h's. */
#include <math.h>

#include "ew_common.h"
#include "check.h"

void kdloss_jsd_params_default(kdloss_jsd_params *p) {
    if (!p) return;
    p->beta = 0.5;
    p->ignore_index = -100;
    p->grad_scale = 1.0;
}

/* Shapes: student, teacher, grad (BT x V); labels, row_loss [BT]; loss [1]. */
kdloss_status kdloss_distill(const kdloss_distill_params *p, int64_t bt, int64_t v,
                             kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                             float *loss, float *row_loss, kdloss_mat grad) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_distill_geom g;
    kd_spanset spans;
    int64_t n_valid;
    kdloss_status st = kd_check_distill(&kd_cpu_rules, p, bt, v, student, teacher, labels, loss,
                                        row_loss, grad, &g, &n_valid, &spans); /* src/common */
    if (st) return st;

    kd_ew_job job = {0};
    kd_ew_job_operands(&job, v, student, g.ld_s, teacher, g.ld_t, grad, g.ld_g);
    kd_ew_job_labels(&job, labels, p->ignore_index);
    double denom = n_valid > 0 ? (double)n_valid : 1.0; /* all ignored: loss 0, grad 0 */
    job.gscale = (float)(p->grad_scale / denom);
    job.want_loss = loss || row_loss;
    job.stream_grad = grad.data && bt * v * (int64_t)kdloss_dtype_size(job.xdt) > KD_STREAM_BYTES;
    job.coef = kd_div_coef_make(&p->div);
    double total = kd_rows_sum(bt, kd_div_row_fn(), &job, row_loss);
    if (loss) *loss = (float)(total / denom);
    return KDLOSS_OK;
}

kdloss_status kdloss_jsd(const kdloss_jsd_params *p, int64_t bt, int64_t v, kdloss_cmat student,
                         kdloss_cmat teacher, kdloss_labels labels, float *loss, float *row_loss,
                         kdloss_mat grad) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    kdloss_distill_params d = kd_distill_from_jsd(p);
    return kdloss_distill(&d, bt, v, student, teacher, labels, loss, row_loss, grad);
}
