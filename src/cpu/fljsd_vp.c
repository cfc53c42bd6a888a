/* The vocabulary-parallel fused losses (kdloss.h, docs/MATH.md section 9): each rank checks
 * its own arguments, every rank learns in one collective whether all of them agree (blocks
 * contiguous in rank order and covering the vocabulary, the same BT / Hs / teacher shape) and
 * which chunk size they share, and only then does any rank write. The chunk loop is the
 * single-process one (fljsd.c) with the phases' statistics and dxs all-reduced per chunk. */
#include <math.h>
#include <stdlib.h>

#include "fljsd.h"

/* Slots of the agreement buffer after the 2 size block slots (begin, rows) of every rank. */
enum { AG_ERROR, AG_NEG_CHUNK, AG_BT, AG_NEG_BT, AG_HS, AG_NEG_HS, AG_SHAPE, AG_NEG_SHAPE, AG_N };

/* The agreement collective: one MAX over 2 size + AG_N doubles. st is this rank's own check
 * result; on success *chunk becomes the smallest chunk of all ranks. */
static kdloss_status agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                           int64_t hs, int64_t shape, int64_t *chunk) {
    const kdloss_comm *c = sh->comm;
    double stack[2 * 64 + AG_N], *b = stack;
    int64_t n = 2 * (int64_t)c->size + AG_N;
    if (c->size > 64 && !(b = malloc((size_t)n * sizeof(double)))) return KDLOSS_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) b[i] = -INFINITY;
    double *ag = b + 2 * c->size;
    b[2 * c->rank] = (double)sh->v_begin;
    b[2 * c->rank + 1] = (double)v;
    ag[AG_ERROR] = st != KDLOSS_OK;
    ag[AG_NEG_CHUNK] = -(double)*chunk;
    ag[AG_BT] = (double)bt;
    ag[AG_NEG_BT] = -(double)bt;
    ag[AG_HS] = (double)hs;
    ag[AG_NEG_HS] = -(double)hs;
    ag[AG_SHAPE] = (double)shape;
    ag[AG_NEG_SHAPE] = -(double)shape;
    kdloss_status out = KDLOSS_OK;
    if (c->allreduce(c->ctx, b, n, KDLOSS_F64, KDLOSS_COMM_MAX)) out = KDLOSS_ERR_COMM;
    else if (st != KDLOSS_OK) out = st;
    else if (ag[AG_ERROR] != 0.0) out = KDLOSS_ERR_PEER;
    else if (ag[AG_BT] != -ag[AG_NEG_BT] || ag[AG_HS] != -ag[AG_NEG_HS] ||
             ag[AG_SHAPE] != -ag[AG_NEG_SHAPE])
        out = KDLOSS_ERR_SHAPE_MISMATCH;
    double end = 0.0; /* the blocks in rank order must tile [0, v_total) */
    for (int r = 0; out == KDLOSS_OK && r < c->size; r++) {
        if (b[2 * r] != end) out = KDLOSS_ERR_SHAPE_MISMATCH;
        end += b[2 * r + 1];
    }
    if (out == KDLOSS_OK && end != (double)sh->v_total) out = KDLOSS_ERR_SHAPE_MISMATCH;
    if (out == KDLOSS_OK) *chunk = (int64_t)-ag[AG_NEG_CHUNK];
    if (b != stack) free(b);
    return out;
}

/* A communicator this rank can take part in: present, with a rank inside its size. Without
 * one the call returns at once (the other ranks then wait in the agreement: kdloss.h). */
static kdloss_status check_comm(const kdloss_vocab_shard *sh) {
    if (!sh || !sh->comm || !sh->comm->allreduce) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_comm *c = sh->comm;
    return c->size >= 1 && c->rank >= 0 && c->rank < c->size && c->size <= (1 << 24)
               ? KDLOSS_OK
               : KDLOSS_ERR_INVALID_PARAM;
}

/* The shard itself: what can be checked before the collective. */
static kdloss_status check_shard(const kdloss_vocab_shard *sh, int64_t v) {
    if (sh->v_total <= 0 || sh->v_begin < 0 || v <= 0 || sh->v_begin > sh->v_total - v)
        return KDLOSS_ERR_INVALID_SIZE;
    return sh->v_total > INT32_MAX ? KDLOSS_ERR_UNSUPPORTED : KDLOSS_OK;
}

/* Check, agree, run. shape is Ht (dense) or K (sparse), which every rank must share. */
static kdloss_status fused_vp(const kdloss_fused_linear_distill_params *p,
                              const kdloss_vocab_shard *sh, int64_t bt, int64_t hs, int64_t v,
                              kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                              const kd_fl_teacher *t, int64_t shape, kdloss_labels labels,
                              kdloss_fused_linear_distill_out *out, void *workspace,
                              size_t workspace_bytes) {
    kdloss_status st = check_comm(sh);
    if (st != KDLOSS_OK) return st;
    kd_fljsd_call call;
    kd_fljsd_plan plan;
    plan.chunk = 1;
    st = check_shard(sh, v);
    if (st == KDLOSS_OK)
        st = kd_fljsd_check(p, bt, hs, v, sh->v_total, xs, ws, bs, t, labels, out, workspace,
                            workspace_bytes, &call, &plan);
    int64_t chunk = plan.chunk;
    st = agree(sh, v, st, bt, hs, shape, &chunk);
    if (st != KDLOSS_OK) return st;
    plan.chunk = chunk; /* <= this rank's: its workspace regions still hold it */
    call.comm = sh->comm;
    call.v_lo = sh->v_begin;
    return kd_fljsd_execute(&call, &plan, workspace);
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
        kdloss_status cs = check_comm(shard);
        if (cs != KDLOSS_OK) return cs;
        int64_t chunk = 1;
        return agree(shard, v, st, bt, hs, teacher.k, &chunk);
    }
    return fused_vp(&p, shard, bt, hs, v, xs, ws, bs, &t, teacher.k, labels, out, workspace,
                    workspace_bytes);
}
