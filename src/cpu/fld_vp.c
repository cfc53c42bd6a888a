/* The vocabulary-parallel fused losses (kdloss.h, docs/MATH.md section 9): each rank checks
 * its own arguments, every rank learns in the agreement (vp.h: two collectives) whether all of
 * them agree (blocks contiguous in rank order and covering the vocabulary, the same BT / Hs /
 * teacher shape, setup and parameters) and which chunk size they share, and only then does any
 * rank write. The chunk loop is the single-process one (fld.c) with the phases' statistics and
 * dxs all-reduced per chunk. */
#include <stdlib.h>

#include "fld.h"
#include "vp.h"
#include "check.h"

/* The agreement's all-reduce on the CPU: the callback on the host buffer itself. */
static kdloss_status reduce_host(void *rctx, double *buf, int64_t n) {
    const kdloss_comm *c = (const kdloss_comm *)rctx;
    return c->allreduce(c->ctx, buf, n, KDLOSS_F64, KDLOSS_COMM_MAX) ? KDLOSS_ERR_COMM : KDLOSS_OK;
}

static kdloss_status agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                           int64_t hs, int64_t shape, const kd_vp_terms *terms, int64_t *chunk) {
    return kd_vp_agree_terms(sh, v, st, bt, hs, shape, terms, chunk, reduce_host,
                             (void *)sh->comm);
}

/* The fingerprints of a checked call (vp.h): what every rank must share besides the shapes. */
static kd_vp_terms call_terms(const kd_fld_call *k, const kd_fld_teacher *t) {
    const kdloss_fused_linear_distill_params *p = &k->p;
    kdloss_dtype t0 = t->topk ? t->topk->ids.dtype : t->xt.dtype;
    kdloss_dtype t1 = t->topk ? t->topk->logprobs.dtype : t->wt.dtype;
    kd_vp_terms terms;
    terms.setup = kd_vp_setup_hash(k->xs.dtype, t0, t1, k->bs, t->topk ? NULL : t->bias,
                                   k->labels, p->weight_hard_loss, p->weight_soft_loss, &k->out,
                                   k->n_valid);
    terms.setup = kd_vp_weights_hash(terms.setup, p->row_weights, k->bt); /* replicated */
    terms.params = kd_vp_params_hash(&p->div, p->temperature, p->weight_hard_loss,
                                     p->weight_soft_loss, p->t2_scale, p->ignore_index,
                                     p->grad_scale, t->topk ? t->tail : -1);
    terms.params = kd_vp_maps_hash(terms.params, &p->student_map, t->topk ? NULL : &p->teacher_map);
    return terms;
}

/* Check, agree, run. shape is Ht (dense) or K (sparse), which every rank must share. Everything
 * that can fail before the first chunk (the arguments, the workspace's allocation, the GEMM
 * layer's scratch) is settled before the agreement and reported through it, so that after it
 * every rank makes the same collectives: the chunk loop's. */
static kdloss_status fused_vp(const kdloss_fused_linear_distill_params *p,
                              const kdloss_vocab_shard *sh, int64_t bt, int64_t hs, int64_t v,
                              kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                              const kd_fld_teacher *t, int64_t shape, kdloss_labels labels,
                              kdloss_fused_linear_distill_out *out, void *workspace,
                              size_t workspace_bytes) {
    kdloss_status st = kd_vp_check_comm(sh);
    if (st != KDLOSS_OK) return st;
    kd_fld_call call;
    kd_fld_plan plan;
    kd_vp_terms terms = {0, 0};
    void *mem = NULL;
    plan.chunk = 1;
    st = kd_vp_check_shard(sh, v);
    if (st == KDLOSS_OK)
        st = kd_fld_check(p, bt, hs, v, sh->v_total, xs, ws, bs, t, labels, out, workspace,
                          workspace_bytes, &call, &plan);
    if (st == KDLOSS_OK && !workspace && !(mem = malloc(plan.bytes)))
        st = KDLOSS_ERR_OUT_OF_MEMORY;
    if (st == KDLOSS_OK) st = kd_fld_prepare(&call, &plan);
    if (st == KDLOSS_OK) terms = call_terms(&call, t);
    int64_t chunk = st == KDLOSS_OK ? plan.chunk : 1;
    st = agree(sh, v, st, bt, hs, shape, &terms, &chunk);
    if (st == KDLOSS_OK) {
        plan.chunk = chunk; /* in [1, this rank's] (checked): its workspace regions still hold it */
        call.comm = sh->comm;
        call.v_lo = sh->v_begin;
        st = kd_fld_execute(&call, &plan, workspace ? workspace : mem);
    }
    free(mem);
    return st;
}

kdloss_status kdloss_fused_linear_distill_vp(
    const kdloss_fused_linear_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    return fused_vp(params, shard, bt, hs, v, xs, ws, bs, &t, ht, labels, out, workspace,
                    workspace_bytes);
}

kdloss_status kdloss_fused_linear_topk_distill_vp(
    const kdloss_fused_linear_topk_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kdloss_fused_linear_distill_params p;
    kdloss_status st = params ? kd_topk_check_fused_params(params) : KDLOSS_ERR_NULL_POINTER;
    if (st == KDLOSS_OK) p = kd_topk_fld_params(params);
    else kdloss_fused_linear_distill_params_default(&p); /* reported through the agreement */
    kd_fld_teacher t = {0, {NULL, KDLOSS_F32, 0}, {NULL, KDLOSS_F32, 0}, NULL, &teacher,
                       st == KDLOSS_OK ? (int)params->tail : 0};
    if (st != KDLOSS_OK) { /* still meet the other ranks in the agreement */
        kdloss_status cs = kd_vp_check_comm(shard);
        if (cs != KDLOSS_OK) return cs;
        int64_t chunk = 1;
        return agree(shard, v, st, bt, hs, teacher.k, NULL, &chunk);
    }
    return fused_vp(&p, shard, bt, hs, v, xs, ws, bs, &t, teacher.k, labels, out, workspace,
                    workspace_bytes);
}
