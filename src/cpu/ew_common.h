/* Shared argument handling of the elementwise losses (KL, JSD) on the CPU. */
#ifndef KDLOSS_CPU_EW_COMMON_H
#define KDLOSS_CPU_EW_COMMON_H

#include "check.h"
#include "elementwise.h"

/* Checks the (BT x V) input pair and the optional gradient (dtype of x; may equal x exactly),
 * filling the job's x/t/g fields. `spans` gets the input spans [0], [1] and the gradient [2]. */
kdloss_status kd_ew_check_pair(int64_t bt, int64_t v, kdloss_cmat x, kdloss_cmat t, kdloss_mat g,
                               kd_ew_job *job, kd_span spans[3]);

/* ALIASING if any output span overlaps an input span or another output span. The gradient
 * (outs[0]) may coincide exactly with the first input (in place), which `grad_in_place` says. */
kdloss_status kd_ew_check_overlap(const kd_span *ins, int n_in, const kd_span *outs, int n_out,
                                  int grad_in_place);

/* Every operand check of the divergence-family calls (kdloss_distill, kdloss_distill_logits):
 * the student/teacher pair and gradient (kd_ew_check_pair), labels (counting the kept rows into
 * *n_valid, BT without labels), at least one output, aligned float outputs, and no output
 * overlapping an input or another output (the gradient may be the student in place). Fills the
 * job's operand and label fields. Shapes: student, teacher, grad (BT x V); labels, row_loss
 * [BT]; loss [1]. */
kdloss_status kd_ew_check_distill(int64_t bt, int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                  kdloss_labels labels, int64_t ignore_index, const float *loss,
                                  const float *row_loss, kdloss_mat grad, kd_ew_job *job,
                                  int64_t *n_valid);

/* The same checks with the teacher's operands given as spans (n_teacher <= 2, checked by the
 * caller; the sparse top-k teacher's ids and log-probs): the student, gradient, labels and
 * outputs into the job, and no output overlapping the student, the teacher or the labels. */
kdloss_status kd_ew_check_rows(int64_t bt, int64_t v, kdloss_cmat student,
                               const kd_span *teacher, int n_teacher, kdloss_labels labels,
                               int64_t ignore_index, const float *loss, const float *row_loss,
                               kdloss_mat grad, kd_ew_job *job, int64_t *n_valid);

/* The row function of the path in force. */
kd_row_fn kd_kl_row_fn(void);
kd_row_fn kd_div_row_fn(void);

#endif
