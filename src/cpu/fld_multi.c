/* Several teachers in one fused call on the CPU (kdloss.h, kdloss_fused_linear_distill_multi;
 * docs/MATH.md section 13): the entry point and the heads' own checks. The rows run through the
 * chunked loop of fld.c, whose several-heads teacher form forms each run of rows' logits with its
 * own head. */
#include "check.h"
#include "fld.h"

/* The heads' own checks (kdloss_teacher_heads): present, n >= 1, every index in [0, n), the
 * index vector apart from every output. The heads' views are checked by kd_fld_check. */
static kd_span out_mat_span(kdloss_mat m, int64_t rows, int64_t cols) {
    int64_t ld = m.ld ? m.ld : cols;
    return kd_vec_span(m.data, (rows - 1) * ld + cols, kdloss_dtype_size(m.dtype));
}

static kdloss_status heads_check(const kdloss_teacher_heads *h, int64_t bt, int64_t hs,
                                 int64_t v, const kdloss_fused_linear_distill_out *o) {
    if (!h) return kd_named("teachers", KDLOSS_ERR_NULL_POINTER);
    if (!h->wt || !h->index) return kd_named(!h->wt ? "teachers->wt" : "teachers->index",
                                             KDLOSS_ERR_NULL_POINTER);
    if (h->n < 1 || h->n > INT32_MAX) {
        kd_detail("teachers->n = %lld: at least one head, at most 2^31 - 1", (long long)h->n);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    for (int64_t r = 0; r < bt; r++)
        if (h->index[r] < 0 || h->index[r] >= h->n) {
            kd_detail("teachers->index[%lld] = %d is not in [0, %lld)", (long long)r,
                      (int)h->index[r], (long long)h->n);
            return KDLOSS_ERR_INVALID_ID;
        }
    kd_span in = kd_vec_span(h->index, bt, sizeof(int32_t));
    const float *rows[6] = {o->loss, o->soft_loss, o->hard_loss, o->row_soft, o->row_hard,
                            o->row_lse};
    int64_t lens[6] = {1, 1, 1, bt, bt, bt};
    int bad = 0;
    for (int i = 0; i < 6; i++) bad |= kd_spans_overlap(in, kd_vec_span(rows[i], lens[i], 4));
    bad |= kd_spans_overlap(in, out_mat_span(o->dxs, bt, hs));
    bad |= kd_spans_overlap(in, out_mat_span(o->dws, v, hs));
    bad |= kd_spans_overlap(in, kd_vec_span(o->dbs, v, kdloss_dtype_size(o->dws.dtype)));
    if (!bad) return KDLOSS_OK;
    kd_detail("teachers->index overlaps an output");
    return KDLOSS_ERR_ALIASING;
}

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
    if (st == KDLOSS_OK) st = heads_check(teachers, bt, hs, v, out);
    if (st != KDLOSS_OK) return st;
    call.heads = teachers;
    return kd_fld_execute(&call, &plan, workspace);
}
