/* Several teachers in one fused call on the GPU (kdloss.h, kdloss_cuda_fused_linear_distill_multi;
 * docs/MATH.md section 13): the entry point. Each head passes the single-teacher call's checks,
 * then the heads' own (src/common's kd_check_teacher_heads); the rows run through fld.cu's chunk
 * loop, whose teacher step forms each run of rows' logits with its own head (fld_heads_logits). */
#include "fld_rows.cuh"

/* Shapes: as kdloss_cuda_fused_linear_distill, with teachers->wt[j] (v x ht) and bias[j] [v] in
 * device memory and teachers->index [bt] in host memory. */
kdloss_status kdloss_cuda_fused_linear_distill_multi(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, const kdloss_teacher_heads *teachers, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_fld_checked g;
    const int64_t n = teachers && teachers->wt ? teachers->n : 0;
    /* every head's argument spans, for the workspace's overlap check (fld_dense_run) */
    kd_spanset *spans = (kd_spanset *)malloc((size_t)(n > 0 ? n : 1) * sizeof(kd_spanset));
    kdloss_cmat *wt = (kdloss_cmat *)malloc((size_t)(n > 0 ? n : 1) * sizeof(kdloss_cmat));
    kdloss_status s = spans && wt ? KDLOSS_OK : KDLOSS_ERR_OUT_OF_MEMORY;
    /* every head through the single-teacher checks (its view, dtype, aliasing), then their own */
    for (int64_t j = 0; s == KDLOSS_OK && j < n; j++) {
        const kd_fld_teacher t = {ht, xt, teachers->wt[j],
                                  teachers->bias ? teachers->bias[j] : NULL, NULL, 0};
        s = kd_check_fld(&kd_cuda_rules, params, bt, hs, v, v, xs, ws, bs, &t, labels, out, &g,
                         &spans[j]);
        /* the effective ld, as kd_check_fld resolved it (g.ld_wt) */
        wt[j] = {teachers->wt[j].data, teachers->wt[j].dtype, g.ld_wt};
    }
    if (s == KDLOSS_OK) s = kd_check_teacher_heads(teachers, bt, hs, v, out);
    if (s == KDLOSS_OK) {
        const fld_heads H = {n, wt, teachers->bias, teachers->index};
        const kdloss_cmat none = {NULL, KDLOSS_F32, 0};
        const fld_dense_call c = {ctx,    stream, params,    bt,   hs,  ht, v,  xs, ws,
                                  bs,     xt,     none,      NULL, &H,  labels,
                                  out,    workspace, workspace_bytes};
        s = fld_dense_run(c, g, spans, n);
    }
    free(spans);
    free(wt);
    return s;
}
