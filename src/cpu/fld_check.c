/* Argument checks of kdloss_fused_linear_distill (and its JSD wrapper): everything that can fail is found here, before
 * the driver writes a single byte the caller owns. */
#include "check.h"
#include "ew_common.h" /* kd_ew_check_overlap */
#include "fld.h"
#include "topk.h"

/* A student or teacher operand pair (hidden states x, LM head w): F32 or BF16, both the same. */
static kdloss_status check_pair_dtype(const char *xn, kdloss_dtype x, const char *wn,
                                      kdloss_dtype w) {
    if ((x == KDLOSS_F32 || x == KDLOSS_BF16) && w == x) return KDLOSS_OK;
    kd_detail("%s is %s and %s %s: both fp32 or both bf16", xn, kdloss_dtype_name(x), wn,
              kdloss_dtype_name(w));
    return KDLOSS_ERR_INVALID_DTYPE;
}

/* A (rows x cols) matrix `name` read or written through a GEMM: kd_check_fmat, and ld within a
 * CBLAS int. Writes the effective ld into *ld. */
static kdloss_status check_gemm_mat(const char *name, int64_t rows, int64_t cols,
                                    const void *data, kdloss_dtype dt, int64_t *ld,
                                    kd_span *span) {
    kdloss_status st = kd_check_fmat(rows, cols, data, dt, *ld, ld, span);
    if (st == KDLOSS_OK && *ld > INT32_MAX) {
        kd_detail("ld %lld does not fit a 32-bit int (a GEMM operand)", (long long)*ld);
        st = KDLOSS_ERR_UNSUPPORTED;
    }
    return kd_named(name, st);
}

/* The teacher's operands into spans in[3..5] (dense: xt, wt, bt; sparse: ids, log-probs) and the
 * call; a sparse teacher's ids are checked by value. */
static kdloss_status check_teacher(const kd_fl_teacher *t, int64_t bt, int64_t v,
                                   int64_t v_ids, kd_span in[3], kd_fld_call *call) {
    kdloss_status st;
    call->xt = t->xt;
    call->wt = t->wt;
    call->bt_bias = t->bias;
    call->topk.k = 0;
    call->tail = t->tail;
    if (t->topk) {
        kdloss_topk_teacher k = *t->topk;
        st = kd_topk_check_teacher(k, bt, &in[0], &in[1], &k.ids.ld, &k.logprobs.ld);
        if (st == KDLOSS_OK) st = kd_topk_check_ids(k, bt, v_ids);
        in[2] = kd_vec_span(NULL, 0, 1);
        call->topk = k;
        return st;
    }
    st = check_pair_dtype("teacher_input", t->xt.dtype, "teacher_weight", t->wt.dtype);
    if (st == KDLOSS_OK)
        st = check_gemm_mat("teacher_input", bt, t->ht, t->xt.data, t->xt.dtype, &call->xt.ld,
                            &in[0]);
    if (st == KDLOSS_OK)
        st = check_gemm_mat("teacher_weight", v, t->ht, t->wt.data, t->wt.dtype, &call->wt.ld,
                            &in[1]);
    if (st != KDLOSS_OK) return st;
    size_t et = kdloss_dtype_size(t->xt.dtype);
    if (!kd_aligned(t->bias, et)) return kd_named("teacher_bias", KDLOSS_ERR_MISALIGNED);
    in[2] = kd_vec_span(t->bias, v, et);
    return KDLOSS_OK;
}

/* Labels: required with a dense teacher; without them (sparse) every row is kept and nothing
 * may need them. */
static kdloss_status check_labels(const kdloss_fused_linear_distill_params *p, int sparse,
                                  kdloss_labels labels, const kdloss_fused_linear_distill_out *o,
                                  int64_t bt, int64_t v, int64_t *n_valid) {
    if (labels.data || !sparse) return kd_check_labels(labels, bt, v, p->ignore_index, n_valid);
    if (p->weight_hard_loss > 0.0 || o->hard_loss || o->row_hard) {
        kd_detail("no labels: weight_hard_loss (%g), hard_loss and row_hard need them",
                  p->weight_hard_loss);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    *n_valid = bt;
    return KDLOSS_OK;
}

/* The outputs into spans os[0..8] (loss, soft_loss, hard_loss, dxs, dws, dbs, row_soft,
 * row_hard, row_lse), with their effective lds in *o. */
static kdloss_status check_outputs(kdloss_fused_linear_distill_out *o, int64_t bt, int64_t hs,
                                   int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                                   kd_span os[9]) {
    kdloss_status st;
    size_t es = kdloss_dtype_size(xs.dtype);
    os[0] = kd_vec_span(o->loss, 1, sizeof(float));
    os[1] = kd_vec_span(o->soft_loss, 1, sizeof(float));
    os[2] = kd_vec_span(o->hard_loss, 1, sizeof(float));
    os[3] = os[4] = kd_vec_span(NULL, 0, 1);
    int grad = o->dxs.data || o->dws.data || o->dbs;
    if (!grad && !o->loss && !o->soft_loss && !o->hard_loss && !o->row_soft && !o->row_hard &&
        !o->row_lse)
        return KDLOSS_ERR_NO_OUTPUT;
    if (o->dxs.data) {
        if (o->dxs.dtype != xs.dtype) {
            kd_detail("dxs: dtype %s, expected %s like student_input", kdloss_dtype_name(o->dxs.dtype),
                      kdloss_dtype_name(xs.dtype));
            return KDLOSS_ERR_INVALID_DTYPE;
        }
        st = check_gemm_mat("dxs", bt, hs, o->dxs.data, o->dxs.dtype, &o->dxs.ld, &os[3]);
        if (st != KDLOSS_OK) return st;
    }
    if (o->dws.data) {
        if (o->dws.dtype != ws.dtype) {
            kd_detail("dws: dtype %s, expected %s like student_weight", kdloss_dtype_name(o->dws.dtype),
                      kdloss_dtype_name(ws.dtype));
            return KDLOSS_ERR_INVALID_DTYPE;
        }
        st = check_gemm_mat("dws", v, hs, o->dws.data, o->dws.dtype, &o->dws.ld, &os[4]);
        if (st != KDLOSS_OK) return st;
    }
    if (o->dbs && !bs) {
        kd_detail("dbs asked for, but the student has no bias");
        return KDLOSS_ERR_SHAPE_MISMATCH;
    }
    if (!kd_aligned(o->dbs, es) || !kd_aligned(o->loss, sizeof(float)) ||
        !kd_aligned(o->soft_loss, sizeof(float)) || !kd_aligned(o->hard_loss, sizeof(float)) ||
        !kd_aligned(o->row_soft, sizeof(float)) || !kd_aligned(o->row_hard, sizeof(float)) ||
        !kd_aligned(o->row_lse, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    os[5] = kd_vec_span(o->dbs, v, es);
    os[6] = kd_vec_span(o->row_soft, bt, sizeof(float));
    os[7] = kd_vec_span(o->row_hard, bt, sizeof(float));
    os[8] = kd_vec_span(o->row_lse, bt, sizeof(float));
    return KDLOSS_OK;
}

/* The student's operands (xs, ws, bs into spans in[0..2], their effective lds into *xs, *ws)
 * and the teacher's (in[3..5]). */
static kdloss_status check_student(int64_t bt, int64_t hs, int64_t v, int64_t v_ids,
                                   kdloss_cmat *xs, kdloss_cmat *ws, const void *bs,
                                   const kd_fl_teacher *t, kd_span in[8], kd_fld_call *call) {
    kdloss_status st = check_gemm_mat("student_input", bt, hs, xs->data, xs->dtype, &xs->ld, &in[0]);
    if (st == KDLOSS_OK)
        st = check_gemm_mat("student_weight", v, hs, ws->data, ws->dtype, &ws->ld, &in[1]);
    if (st == KDLOSS_OK) st = check_teacher(t, bt, v, v_ids, &in[3], call);
    if (st != KDLOSS_OK) return st;
    if (!kd_aligned(bs, kdloss_dtype_size(xs->dtype)))
        return kd_named("student_bias", KDLOSS_ERR_MISALIGNED);
    in[2] = kd_vec_span(bs, v, kdloss_dtype_size(xs->dtype));
    return KDLOSS_OK;
}

kdloss_status kd_fld_check(const kdloss_fused_linear_distill_params *params, int64_t bt,
                           int64_t hs, int64_t v, int64_t v_ids, kdloss_cmat xs, kdloss_cmat ws,
                           const void *bs, const kd_fl_teacher *t, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, const void *workspace,
                           size_t workspace_bytes, kd_fld_call *call, kd_fld_plan *plan) {
    kd_detail_clear();
    if (!params || !out) return kd_named(!params ? "params" : "out", KDLOSS_ERR_NULL_POINTER);
    int sparse = t->topk != NULL;
    kdloss_status st = kd_fld_check_params(params);
    if (st == KDLOSS_OK) st = kd_fld_check_sizes(bt, hs, sparse ? hs : t->ht, v);
    if (st == KDLOSS_OK)
        st = check_pair_dtype("student_input", xs.dtype, "student_weight", ws.dtype);
    if (st != KDLOSS_OK) return st;

    /* inputs: spans 0..6 = xs, ws, bs, teacher (3), labels; 7 = the workspace */
    kd_span in[8];
    st = check_student(bt, hs, v, v_ids, &xs, &ws, bs, t, in, call);
    if (st != KDLOSS_OK) return st;
    int64_t n_valid = 0;
    st = check_labels(params, sparse, labels, out, bt, v_ids, &n_valid);
    if (st != KDLOSS_OK) return st;
    in[6] = kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype));

    kdloss_fused_linear_distill_out o = *out;
    kd_span os[9];
    st = check_outputs(&o, bt, hs, v, xs, ws, bs, os);
    if (st != KDLOSS_OK) return st;
    int grad = o.dxs.data || o.dws.data || o.dbs;
    st = kd_fld_plan_make(params, bt, hs, sparse ? 0 : t->ht, v, sparse ? t->topk->k : 0,
                          xs.dtype, grad, plan);
    if (st != KDLOSS_OK) return st;
    if (workspace && workspace_bytes < plan->bytes) {
        kd_detail("workspace of %zu bytes, this call needs %zu", workspace_bytes, plan->bytes);
        return KDLOSS_ERR_WORKSPACE_TOO_SMALL;
    }
    in[7] = kd_vec_span(workspace, workspace ? (int64_t)plan->bytes : 0, 1);
    /* the workspace is written too: it may overlap neither inputs nor outputs */
    st = kd_ew_check_overlap(in, 8, os, 9, 0);
    if (st == KDLOSS_OK) st = kd_ew_check_overlap(in, 7, &in[7], 1, 0);
    if (st != KDLOSS_OK) return st;

    call->p = *params;
    call->bt = bt;
    call->hs = hs;
    call->ht = sparse ? 0 : t->ht;
    call->v = v;
    call->xs = xs;
    call->ws = ws;
    call->bs = bs;
    call->labels = labels;
    call->out = o;
    call->n_valid = n_valid;
    call->grad = grad;
    call->comm = NULL;
    call->v_lo = 0;
    return KDLOSS_OK;
}
