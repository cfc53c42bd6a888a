/* The CPU's side of the elementwise losses (KL, the divergence family): its argument-check rules
 * (the checks themselves are src/common/args.c's), filling a job from a checked call, and the
 * row functions of the path in force. */
#ifndef KDLOSS_CPU_EW_COMMON_H
#define KDLOSS_CPU_EW_COMMON_H

#include "args.h"
#include "elementwise.h"

/* The CPU's kd_rules: host memory (labels' and ids' values checked), every logit map applied,
 * the workspace optional (allocated when absent), every pointer aligned. */
extern const kd_rules kd_cpu_rules;

/* The job's operands from checked views (effective lds): x (BT x V), t (NULL for a sparse
 * teacher), the optional gradient g of x's dtype. */
void kd_ew_job_operands(kd_ew_job *job, int64_t v, kdloss_cmat x, int64_t ldx, kdloss_cmat t,
                        int64_t ldt, kdloss_mat g, int64_t ldg);

/* The job's labels (data NULL: every row kept). */
void kd_ew_job_labels(kd_ew_job *job, kdloss_labels labels, int64_t ignore_index);

/* The row function of the path in force. */
kd_row_fn kd_kl_row_fn(void);
kd_row_fn kd_div_row_fn(void);

#endif
