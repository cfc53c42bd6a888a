/* The CPU's argument-check rules, and the elementwise job filled from a checked call. */
#include "ew_common.h"

#include "dispatch.h"

const kd_rules kd_cpu_rules = {
    .host_memory = 1,
    .ws_align = 0,
};

void kd_ew_job_operands(kd_ew_job *job, int64_t v, kdloss_cmat x, int64_t ldx, kdloss_cmat t,
                        int64_t ldt, kdloss_mat g, int64_t ldg) {
    job->v = v;
    job->x = x.data;
    job->xdt = x.dtype;
    job->ldx = ldx;
    job->t = t.data;
    job->tdt = t.dtype;
    job->ldt = ldt;
    job->g = g.data;
    job->ldg = g.data ? ldg : 0;
}

void kd_ew_job_labels(kd_ew_job *job, kdloss_labels labels, int64_t ignore_index) {
    if (!labels.data) return; /* the job's zeroed labels: every row kept */
    job->labels = labels;
    job->ignore_index = ignore_index;
}

kd_row_fn kd_kl_row_fn(void) { return kd_cpu_kernels()->kl_row; }

kd_row_fn kd_div_row_fn(void) { return kd_cpu_kernels()->div_row; }
