/* The vocabulary-parallel fused losses (kdloss.h, docs/MATH.md section 9): each rank checks
 * its own arguments, every rank learns in one collective whether all of them agree (blocks
 * contiguous in rank order and covering the vocabulary, the same BT / Hs / teacher shape) and
 * which chunk size they share, and only then does any rank write. The chunk loop is the
 * single-process one (fld.c) with the phases' statistics and dxs all-reduced per chunk. */
#include "fld.h"
#include "vp.h"

/* The agreement's all-reduce on the CPU: the callback on the host buffer itself. */
static kdloss_status reduce_host(void *rctx, double *buf, int64_t n) {
    const kdloss_comm *c = (const kdloss_comm *)rctx;
    return c->allreduce(c->ctx, buf, n, KDLOSS_F64, KDLOSS_COMM_MAX) ? KDLOSS_ERR_COMM : KDLOSS_OK;
}

static kdloss_status agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                           int64_t hs, int64_t shape, int64_t *chunk) {
    return kd_vp_agree(sh, v, st, bt, hs, shape, chunk, reduce_host, (void *)sh->comm);
}

/* Check, agree, run. shape is Ht (dense) or K (sparse), which every rank must share. */
static kdloss_status fused_vp(const kdloss_fused_linear_distill_params *p,
                              const kdloss_vocab_shard *sh, int64_t bt, int64_t hs, int64_t v,
                              kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                              const kd_fl_teacher *t, int64_t shape, kdloss_labels labels,
                              kdloss_fused_linear_distill_out *out, void *workspace,
                              size_t workspace_bytes) {
    kdloss_status st = kd_vp_check_comm(sh);
    if (st != KDLOSS_OK) return st;
    kd_fld_call call;
    kd_fld_plan plan;
    plan.chunk = 1;
    st = kd_vp_check_shard(sh, v);
    if (st == KDLOSS_OK)
        st = kd_fld_check(p, bt, hs, v, sh->v_total, xs, ws, bs, t, labels, out, workspace,
                          workspace_bytes, &call, &plan);
    int64_t chunk = plan.chunk;
    st = agree(sh, v, st, bt, hs, shape, &chunk);
    if (st != KDLOSS_OK) return st;
    plan.chunk = chunk; /* <= this rank's: its workspace regions still hold it */
    call.comm = sh->comm;
    call.v_lo = sh->v_begin;
    return kd_fld_execute(&call, &plan, workspace);
}

kdloss_status kdloss_fused_linear_distill_vp(
    const kdloss_fused_linear_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_fl_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    return fused_vp(params, shard, bt, hs, v, xs, ws, bs, &t, ht, labels, out, workspace,
                    workspace_bytes);
}

kdloss_status kdloss_fused_linear_topk_distill_vp(
    const kdloss_fused_linear_topk_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kdloss_fused_linear_distill_params p;
    kdloss_status st = params ? kd_topk_check_fused_params(params) : KDLOSS_ERR_NULL_POINTER;
    if (st == KDLOSS_OK) p = kd_topk_fld_params(params);
    else kdloss_fused_linear_distill_params_default(&p); /* reported through the agreement */
    kd_fl_teacher t = {0, {NULL, KDLOSS_F32, 0}, {NULL, KDLOSS_F32, 0}, NULL, &teacher,
                       st == KDLOSS_OK ? (int)params->tail : 0};
    if (st != KDLOSS_OK) { /* still meet the other ranks in the agreement */
        kdloss_status cs = kd_vp_check_comm(shard);
        if (cs != KDLOSS_OK) return cs;
        int64_t chunk = 1;
        return agree(shard, v, st, bt, hs, teacher.k, &chunk);
    }
    return fused_vp(&p, shard, bt, hs, v, xs, ws, bs, &t, teacher.k, labels, out, workspace,
                    workspace_bytes);
}
