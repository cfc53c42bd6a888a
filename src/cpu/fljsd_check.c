/* Argument checks of kdloss_fused_linear_distill (and its JSD wrapper): everything that can fail is found here, before
 * the driver writes a single byte the caller owns. */
#include "check.h"
#include "ew_common.h" /* kd_ew_check_overlap */
#include "fljsd.h"

/* A student or teacher operand pair: F32 or BF16, both the same. */
static kdloss_status check_pair_dtype(kdloss_dtype x, kdloss_dtype w) {
    if (x != KDLOSS_F32 && x != KDLOSS_BF16) return KDLOSS_ERR_INVALID_DTYPE;
    return w == x ? KDLOSS_OK : KDLOSS_ERR_INVALID_DTYPE;
}

/* A (rows x cols) matrix read or written through a GEMM: kd_check_fmat, and ld within a CBLAS
 * int. Writes the effective ld into *ld. */
static kdloss_status check_gemm_mat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                                    int64_t *ld, kd_span *span) {
    kdloss_status st = kd_check_fmat(rows, cols, data, dt, *ld, ld, span);
    if (st != KDLOSS_OK) return st;
    return *ld > INT32_MAX ? KDLOSS_ERR_UNSUPPORTED : KDLOSS_OK;
}

kdloss_status kd_fljsd_check(const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
                             int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                             kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias,
                             kdloss_labels labels, const kdloss_fused_linear_distill_out *out,
                             const void *workspace, size_t workspace_bytes, kd_fljsd_call *call,
                             kd_fljsd_plan *plan) {
    if (!params || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_fld_check_params(params);
    if (st == KDLOSS_OK) st = kd_fljsd_check_sizes(bt, hs, ht, v);
    if (st == KDLOSS_OK) st = check_pair_dtype(xs.dtype, ws.dtype);
    if (st == KDLOSS_OK) st = check_pair_dtype(xt.dtype, wt.dtype);
    if (st != KDLOSS_OK) return st;

    /* inputs: spans 0..6 = xs, ws, bs, xt, wt, bt, labels */
    kd_span in[8];
    st = check_gemm_mat(bt, hs, xs.data, xs.dtype, &xs.ld, &in[0]);
    if (st == KDLOSS_OK) st = check_gemm_mat(v, hs, ws.data, ws.dtype, &ws.ld, &in[1]);
    if (st == KDLOSS_OK) st = check_gemm_mat(bt, ht, xt.data, xt.dtype, &xt.ld, &in[3]);
    if (st == KDLOSS_OK) st = check_gemm_mat(v, ht, wt.data, wt.dtype, &wt.ld, &in[4]);
    if (st != KDLOSS_OK) return st;
    size_t es = kdloss_dtype_size(xs.dtype), et = kdloss_dtype_size(xt.dtype);
    if (!kd_aligned(bs, es) || !kd_aligned(bt_bias, et)) return KDLOSS_ERR_MISALIGNED;
    in[2] = kd_vec_span(bs, v, es);
    in[5] = kd_vec_span(bt_bias, v, et);
    int64_t n_valid = 0;
    st = kd_check_labels(labels, bt, v, params->ignore_index, &n_valid);
    if (st != KDLOSS_OK) return st;
    in[6] = kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype));

    /* outputs: spans 0..5 = loss, soft_loss, hard_loss, dxs, dws, dbs */
    kdloss_fused_linear_distill_out o = *out;
    kd_span os[9];
    os[0] = kd_vec_span(o.loss, 1, sizeof(float));
    os[1] = kd_vec_span(o.soft_loss, 1, sizeof(float));
    os[2] = kd_vec_span(o.hard_loss, 1, sizeof(float));
    os[3] = os[4] = kd_vec_span(NULL, 0, 1);
    int grad = o.dxs.data || o.dws.data || o.dbs;
    if (!grad && !o.loss && !o.soft_loss && !o.hard_loss && !o.row_soft && !o.row_hard &&
        !o.row_lse)
        return KDLOSS_ERR_NO_OUTPUT;
    if (o.dxs.data) {
        if (o.dxs.dtype != xs.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = check_gemm_mat(bt, hs, o.dxs.data, o.dxs.dtype, &o.dxs.ld, &os[3]);
        if (st != KDLOSS_OK) return st;
    }
    if (o.dws.data) {
        if (o.dws.dtype != ws.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = check_gemm_mat(v, hs, o.dws.data, o.dws.dtype, &o.dws.ld, &os[4]);
        if (st != KDLOSS_OK) return st;
    }
    if (o.dbs && !bs) return KDLOSS_ERR_SHAPE_MISMATCH;
    if (!kd_aligned(o.dbs, es) || !kd_aligned(o.loss, sizeof(float)) ||
        !kd_aligned(o.soft_loss, sizeof(float)) || !kd_aligned(o.hard_loss, sizeof(float)) ||
        !kd_aligned(o.row_soft, sizeof(float)) || !kd_aligned(o.row_hard, sizeof(float)) ||
        !kd_aligned(o.row_lse, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    os[5] = kd_vec_span(o.dbs, v, es);
    os[6] = kd_vec_span(o.row_soft, bt, sizeof(float));
    os[7] = kd_vec_span(o.row_hard, bt, sizeof(float));
    os[8] = kd_vec_span(o.row_lse, bt, sizeof(float));

    st = kd_fljsd_plan_make(params, bt, hs, ht, v, xs.dtype, grad, plan);
    if (st != KDLOSS_OK) return st;
    if (workspace && workspace_bytes < plan->bytes) return KDLOSS_ERR_WORKSPACE_TOO_SMALL;
    in[7] = kd_vec_span(workspace, workspace ? (int64_t)plan->bytes : 0, 1);
    /* the workspace is written too: it may overlap neither inputs nor outputs */
    st = kd_ew_check_overlap(in, 8, os, 9, 0);
    if (st == KDLOSS_OK) st = kd_ew_check_overlap(in, 7, &in[7], 1, 0);
    if (st != KDLOSS_OK) return st;

    call->p = *params;
    call->bt = bt;
    call->hs = hs;
    call->ht = ht;
    call->v = v;
    call->xs = xs;
    call->ws = ws;
    call->xt = xt;
    call->wt = wt;
    call->bs = bs;
    call->bt_bias = bt_bias;
    call->labels = labels;
    call->out = o;
    call->n_valid = n_valid;
    call->grad = grad;
    return KDLOSS_OK;
}
