/* libkdloss.so, the CPU library: every CUDA entry point exists and says it is unsupported. The
 * real ones are in libkdloss_cuda.so (CMakeLists.txt, docs/ARCHITECTURE.md "Two libraries"). */
#include "kdloss.h"
#include "check.h"

int kdloss_cuda_available(void) { return 0; }

kdloss_status kdloss_cuda_context_create(int device, kdloss_cuda_context **ctx) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    (void)device;
    if (ctx) *ctx = NULL;
    return KDLOSS_ERR_UNSUPPORTED;
}

void kdloss_cuda_context_destroy(kdloss_cuda_context *ctx) { (void)ctx; }

kdloss_status kdloss_cuda_kl_div_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_kl_div(kdloss_cuda_context *ctx, void *stream,
                                 const kdloss_kl_params *params, int64_t bt, int64_t v,
                                 kdloss_cmat input, kdloss_cmat target, float *loss,
                                 float *row_loss, kdloss_mat elem_loss, kdloss_mat grad,
                                 void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_jsd_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_jsd(kdloss_cuda_context *ctx, void *stream,
                              const kdloss_jsd_params *params, int64_t bt, int64_t v,
                              kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                              float *loss, float *row_loss, kdloss_mat grad, void *workspace,
                              size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fljsd_workspace_size(const kdloss_fljsd_params *params, int64_t bt,
                                               int64_t hs, int64_t ht, int64_t v,
                                               kdloss_dtype student_dtype, int want_grad,
                                               size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_jsd(kdloss_cuda_context *ctx, void *stream,
                                           const kdloss_fljsd_params *params, int64_t bt,
                                           int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs,
                                           kdloss_cmat ws, const void *bs, kdloss_cmat xt,
                                           kdloss_cmat wt, const void *bt_bias,
                                           kdloss_labels labels, kdloss_fljsd_out *out,
                                           void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_distill_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_distill(kdloss_cuda_context *ctx, void *stream,
                                  const kdloss_distill_params *params, int64_t bt, int64_t v,
                                  kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                                  float *loss, float *row_loss, kdloss_mat grad, void *workspace,
                                  size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_distill_logits_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_distill_logits(kdloss_cuda_context *ctx, void *stream,
                                         const kdloss_distill_logits_params *params, int64_t bt,
                                         int64_t v, kdloss_cmat student_logits,
                                         kdloss_cmat teacher_logits, kdloss_labels labels,
                                         float *loss, float *row_loss, kdloss_mat grad,
                                         void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_distill_multi(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, const kdloss_teacher_heads *teachers, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_topk_distill_logits_workspace_size(int64_t bt, int64_t v, int64_t k,
                                                            size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_topk_distill_logits(
    kdloss_cuda_context *ctx, void *stream, const kdloss_topk_distill_params *params, int64_t bt,
    int64_t v, kdloss_cmat student_logits, kdloss_topk_teacher teacher, kdloss_labels labels,
    float *loss, float *row_loss, kdloss_mat grad, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_topk_distill_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_topk_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_distill_vp_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t ht, int64_t v,
    kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt, kdloss_cmat wt,
    const void *bt_bias, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}

kdloss_status kdloss_cuda_fused_linear_topk_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs,
    kdloss_cmat ws, const void *bs, kdloss_topk_teacher teacher, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return KDLOSS_ERR_UNSUPPORTED;
}
