/* kd_fld_check: the checked form of a CPU fused call (kdloss_fused_linear_distill, its JSD and
 * top-k forms, their _vp forms). The checks are src/common/args_fld.c's with the CPU's rules;
 * this file adds the CPU's plan between them and fills the call the driver runs. */
#include "ew_common.h" /* kd_cpu_rules */
#include "fld.h"

/* The plan's errors with their detail (fld_plan.c sets none). */
static kdloss_status plan_detail(kdloss_status st, const kdloss_fused_linear_distill_params *p,
                                 const kd_fld_plan *plan) {
    if (st == KDLOSS_ERR_BUDGET_TOO_SMALL)
        kd_detail("memory_budget %zu is below %zu, the least that holds a one-row chunk "
                  "(kdloss_fljsd_min_budget)", p->memory_budget, plan->min_budget);
    else if (st != KDLOSS_OK)
        kd_detail("the workspace's byte count does not fit a size_t for these sizes");
    return st;
}

/* *call from a checked call (c: its effective lds, rows kept, gradients wanted). */
static void fill_call(kd_fld_call *call, const kdloss_fused_linear_distill_params *params,
                      int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                      const void *bs, const kd_fld_teacher *t, kdloss_labels labels,
                      const kdloss_fused_linear_distill_out *out, const kd_fld_checked *c) {
    const int sparse = t->topk != NULL;
    call->p = *params;
    call->bt = bt;
    call->hs = hs;
    call->ht = sparse ? 0 : t->ht;
    call->v = v;
    call->xs = (kdloss_cmat){xs.data, xs.dtype, c->ld_xs};
    call->ws = (kdloss_cmat){ws.data, ws.dtype, c->ld_ws};
    call->xt = (kdloss_cmat){t->xt.data, t->xt.dtype, sparse ? t->xt.ld : c->ld_xt};
    call->wt = (kdloss_cmat){t->wt.data, t->wt.dtype, sparse ? t->wt.ld : c->ld_wt};
    call->bs = bs;
    call->bt_bias = t->bias;
    call->topk.k = 0;
    if (sparse) {
        call->topk = *t->topk;
        call->topk.ids.ld = c->ld_ids;
        call->topk.logprobs.ld = c->ld_lp;
    }
    call->tail = t->tail;
    call->labels = labels;
    call->out = *out;
    if (out->dxs.data) call->out.dxs.ld = c->ld_dxs;
    if (out->dws.data) call->out.dws.ld = c->ld_dws;
    call->n_valid = c->n_valid;
    call->grad = c->want_grad;
    call->comm = NULL;
    call->v_lo = 0;
    call->heads = NULL;
}

kdloss_status kd_fld_check(const kdloss_fused_linear_distill_params *params, int64_t bt,
                           int64_t hs, int64_t v, int64_t v_ids, kdloss_cmat xs, kdloss_cmat ws,
                           const void *bs, const kd_fld_teacher *t, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, const void *workspace,
                           size_t workspace_bytes, kd_fld_call *call, kd_fld_plan *plan) {
    kd_fld_checked c;
    kd_spanset spans;
    kdloss_status st = kd_check_fld(&kd_cpu_rules, params, bt, hs, v, v_ids, xs, ws, bs, t,
                                   labels, out, &c, &spans);
    if (st != KDLOSS_OK) return st;
    const int sparse = t->topk != NULL;
    st = kd_fld_plan_make(params, bt, hs, sparse ? 0 : t->ht, v, sparse ? t->topk->k : 0,
                          xs.dtype, c.want_grad, plan);
    if (st != KDLOSS_OK) return plan_detail(st, params, plan);
    /* the workspace is written too: it may overlap neither inputs nor outputs */
    st = kd_check_fld_workspace(&kd_cpu_rules, workspace, workspace_bytes, plan->bytes, &spans);
    if (st != KDLOSS_OK) return st;
    fill_call(call, params, bt, hs, v, xs, ws, bs, t, labels, out, &c);
    return KDLOSS_OK;
}
