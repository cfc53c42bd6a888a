#include "ew_common.h"

#include "dispatch.h"

kdloss_status kd_ew_check_pair(int64_t bt, int64_t v, kdloss_cmat x, kdloss_cmat t, kdloss_mat g,
                               kd_ew_job *job, kd_span spans[3]) {
    kdloss_status st;
    kd_detail_clear();
    if ((st = kd_named("input", kd_check_fmat(bt, v, x.data, x.dtype, x.ld, &job->ldx, &spans[0]))))
        return st;
    if ((st = kd_named("target", kd_check_fmat(bt, v, t.data, t.dtype, t.ld, &job->ldt, &spans[1]))))
        return st;
    job->v = v;
    job->x = x.data;
    job->xdt = x.dtype;
    job->t = t.data;
    job->tdt = t.dtype;
    job->g = NULL;
    job->ldg = 0;
    spans[2].lo = spans[2].hi = NULL;
    if (g.data) {
        if (g.dtype != x.dtype) {
            kd_detail("grad: dtype %s, expected %s like the input", kdloss_dtype_name(g.dtype),
                      kdloss_dtype_name(x.dtype));
            return KDLOSS_ERR_INVALID_DTYPE;
        }
        if ((st = kd_named("grad", kd_check_fmat(bt, v, g.data, g.dtype, g.ld, &job->ldg, &spans[2]))))
            return st;
        job->g = g.data;
    }
    return KDLOSS_OK;
}

kdloss_status kd_ew_check_overlap(const kd_span *ins, int n_in, const kd_span *outs, int n_out,
                                  int grad_in_place) {
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++) {
            if (o == 0 && i == 0 && grad_in_place) continue;
            if (kd_spans_overlap(outs[o], ins[i])) return KDLOSS_ERR_ALIASING;
        }
        for (int p = o + 1; p < n_out; p++)
            if (kd_spans_overlap(outs[o], outs[p])) return KDLOSS_ERR_ALIASING;
    }
    return KDLOSS_OK;
}

kd_row_fn kd_kl_row_fn(void) { return kd_cpu_kernels()->kl_row; }

kd_row_fn kd_div_row_fn(void) { return kd_cpu_kernels()->div_row; }

/* The student (BT x V) and its gradient into the job; spans [0] student, [1] gradient. */
static kdloss_status check_student(int64_t bt, int64_t v, kdloss_cmat x, kdloss_mat g,
                                   kd_ew_job *job, kd_span sp[2]) {
    kdloss_status st;
    if ((st = kd_named("student", kd_check_fmat(bt, v, x.data, x.dtype, x.ld, &job->ldx, &sp[0]))))
        return st;
    job->v = v;
    job->x = x.data;
    job->xdt = x.dtype;
    job->g = NULL;
    job->ldg = 0;
    sp[1].lo = sp[1].hi = NULL;
    if (g.data) {
        if (g.dtype != x.dtype) {
            kd_detail("grad: dtype %s, expected %s like the student", kdloss_dtype_name(g.dtype),
                      kdloss_dtype_name(x.dtype));
            return KDLOSS_ERR_INVALID_DTYPE;
        }
        if ((st = kd_named("grad", kd_check_fmat(bt, v, g.data, g.dtype, g.ld, &job->ldg, &sp[1]))))
            return st;
        job->g = g.data;
    }
    return KDLOSS_OK;
}

kdloss_status kd_ew_check_rows(int64_t bt, int64_t v, kdloss_cmat student,
                               const kd_span *teacher, int n_teacher, kdloss_labels labels,
                               int64_t ignore_index, const float *loss, const float *row_loss,
                               kdloss_mat grad, kd_ew_job *job, int64_t *n_valid) {
    kd_span ins[4], outs[3], sp[2];
    kdloss_status st = check_student(bt, v, student, grad, job, sp);
    if (st) return st;
    *n_valid = bt;
    if (labels.data) {
        if ((st = kd_check_labels(labels, bt, v, ignore_index, n_valid))) return st;
        job->labels = labels;
        job->ignore_index = ignore_index;
    }
    if (!loss && !row_loss && !grad.data) return KDLOSS_ERR_NO_OUTPUT;
    if (!kd_aligned(loss, sizeof(float)) || !kd_aligned(row_loss, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    int n_in = 0;
    ins[n_in++] = sp[0];
    for (int i = 0; i < n_teacher && i < 2; i++) ins[n_in++] = teacher[i];
    ins[n_in++] = kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype));
    outs[0] = sp[1];
    outs[1] = kd_vec_span(row_loss, bt, sizeof(float));
    outs[2] = kd_vec_span(loss, 1, sizeof(float));
    int in_place = grad.data && grad.data == student.data && job->ldg == job->ldx;
    return kd_ew_check_overlap(ins, n_in, outs, 3, in_place);
}

kdloss_status kd_ew_check_distill(int64_t bt, int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                  kdloss_labels labels, int64_t ignore_index, const float *loss,
                                  const float *row_loss, kdloss_mat grad, kd_ew_job *job,
                                  int64_t *n_valid) {
    kd_span tsp;
    kd_detail_clear();
    kdloss_status st = kd_named("student", kd_check_fmat(bt, v, student.data, student.dtype,
                                                        student.ld, &job->ldx, &tsp));
    if (st) return st; /* the student first, as kd_ew_check_pair reports */
    if ((st = kd_named("teacher", kd_check_fmat(bt, v, teacher.data, teacher.dtype, teacher.ld,
                                                &job->ldt, &tsp))))
        return st;
    job->t = teacher.data;
    job->tdt = teacher.dtype;
    return kd_ew_check_rows(bt, v, student, &tsp, 1, labels, ignore_index, loss, row_loss, grad,
                            job, n_valid);
}
