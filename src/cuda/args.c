/* The CUDA backend's argument-check rules, and the kd_args_* names its entry points call (args.h):
 * each is src/common's check with these rules; nothing here checks anything itself. */
#include "args.h"

static const kd_rules CUDA_RULES = {
    .host_memory = 0,     /* labels and ids are device memory: the kernels check their values */
    .ws_align = 16,       /* the workspace is required, its regions read with 16-byte loads */
    .fld_dtypes_first = 1,
};

kdloss_status kd_args_kl(const kdloss_kl_params *p, int64_t bt, int64_t v, kdloss_cmat input,
                         kdloss_cmat target, const float *loss, const float *row_loss,
                         kdloss_mat elem_loss, kdloss_mat grad, kd_kl_geom *g, kd_spanset *spans) {
    return kd_check_kl(&CUDA_RULES, p, bt, v, input, target, loss, row_loss, elem_loss, grad, g,
                       spans);
}

kdloss_status kd_args_distill(const kdloss_distill_params *p, int64_t bt, int64_t v,
                              kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                              const float *loss, const float *row_loss, kdloss_mat grad,
                              kd_distill_geom *g, kd_spanset *spans) {
    int64_t n_valid; /* the labels are not read here */
    return kd_check_distill(&CUDA_RULES, p, bt, v, student, teacher, labels, loss, row_loss, grad,
                            g, &n_valid, spans);
}

kdloss_status kd_args_distill_logits(const kdloss_distill_logits_params *p, int64_t bt,
                                     int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                     kdloss_labels labels, const float *loss,
                                     const float *row_loss, kdloss_mat grad, kd_distill_geom *g,
                                     kd_spanset *spans) {
    int64_t n_valid;
    return kd_check_distill_logits(&CUDA_RULES, p, bt, v, student, teacher, labels, loss,
                                   row_loss, grad, g, &n_valid, spans);
}

kdloss_status kd_args_topk_logits(const kdloss_topk_distill_params *p, int64_t bt, int64_t v,
                                  kdloss_cmat student, kdloss_topk_teacher teacher,
                                  kdloss_labels labels, const float *loss, const float *row_loss,
                                  kdloss_mat grad, kd_topk_geom *g, kd_spanset *spans) {
    int64_t n_valid;
    return kd_check_topk_logits(&CUDA_RULES, p, bt, v, student, teacher, labels, loss, row_loss,
                                grad, g, &n_valid, spans);
}

kdloss_status kd_args_fld_params(const kdloss_fused_linear_distill_params *p) {
    return kd_check_fld_params(&CUDA_RULES, p);
}

kdloss_status kd_args_fld_sizes(int64_t bt, int64_t hs, int64_t ht, int64_t v) {
    return kd_fld_check_sizes(bt, hs, ht, v);
}

kdloss_status kd_args_fld(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs,
                         int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                         kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias,
                         kdloss_labels labels, const kdloss_fused_linear_distill_out *out,
                         kd_fld_geom *g, kd_spanset *spans) {
    const kd_fld_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    kd_fld_checked c;
    kdloss_status st = kd_check_fld(&CUDA_RULES, p, bt, hs, v, v, xs, ws, bs, &t, labels, out, &c,
                                   spans);
    if (st != KDLOSS_OK) return st;
    *g = (kd_fld_geom){c.ld_xs, c.ld_ws, c.ld_xt, c.ld_wt, c.ld_dxs, c.ld_dws, c.want_grad};
    return KDLOSS_OK;
}

kdloss_status kd_args_fltk(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                           int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                           kdloss_topk_teacher teacher, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, kd_topk_geom *g,
                           kd_spanset *spans) {
    kd_fld_checked c;
    kdloss_status st = kd_check_fltk(&CUDA_RULES, p, bt, hs, v, xs, ws, bs, teacher, labels, out,
                                     &c, spans);
    if (st != KDLOSS_OK) return st;
    *g = (kd_topk_geom){c.ld_ids, c.ld_lp, 0, 0, c.ld_xs, c.ld_ws, c.ld_dxs, c.ld_dws, c.want_grad};
    return KDLOSS_OK;
}

kdloss_status kd_args_workspace(const void *ws, size_t bytes, size_t need,
                                const kd_spanset *spans) {
    return kd_check_workspace(&CUDA_RULES, ws, bytes, need, spans);
}

kdloss_status kd_args_fld_workspace(const void *ws, size_t bytes, size_t need,
                                   const kd_spanset *spans) {
    return kd_check_fld_workspace(&CUDA_RULES, ws, bytes, need, spans);
}
