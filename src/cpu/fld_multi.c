/* Several teachers in one fused call on the CPU (kdloss.h, kdloss_fused_linear_distill_multi;
 * docs/MATH.md section 13): the entry point (the heads' own checks are src/common's,
 * kd_check_teacher_heads). The rows run through the chunked loop of fld.c, whose several-heads teacher form forms each run of rows' logits with its
 * own head. */
#include "args.h"
#include "check.h"
#include "fld.h"

kdloss_status kdloss_fused_linear_distill_multi(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt,
    const kdloss_teacher_heads *teachers, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_call call;
    kd_fld_plan plan;
    kdloss_status st = KDLOSS_OK;
    /* every head through the single-teacher checks (its view, dtype, aliasing), then their own */
    for (int64_t j = 0; st == KDLOSS_OK && teachers && teachers->wt && j < teachers->n; j++) {
        const void *b = teachers->bias ? teachers->bias[j] : NULL;
        kd_fld_teacher t = {ht, xt, teachers->wt[j], b, NULL, 0};
        st = kd_fld_check(params, bt, hs, v, v, xs, ws, bs, &t, labels, out, workspace,
                          workspace_bytes, &call, &plan);
    }
    if (st == KDLOSS_OK) st = kd_check_teacher_heads(teachers, bt, hs, v, out);
    if (st != KDLOSS_OK) return st;
    call.heads = teachers;
    return kd_fld_execute(&call, &plan, workspace);
}
