/* The CUDA entry points' argument checks: src/common/args.c's and args_fld.c's with the CUDA
 * backend's rules (args.c), under the names and signatures the .cu files call. Everything is
 * checked before the first launch, so on any error nothing is written; device memory (label and
 * id values) is never read here: the kernels check it (kdloss.h). */
#ifndef KDLOSS_CUDA_ARGS_H
#define KDLOSS_CUDA_ARGS_H

#include "../common/args.h" /* kd_spanset, the geometry structs, the shared checks */

#ifdef __cplusplus
extern "C" {
#endif

kdloss_status kd_args_kl(const kdloss_kl_params *p, int64_t bt, int64_t v, kdloss_cmat input,
                         kdloss_cmat target, const float *loss, const float *row_loss,
                         kdloss_mat elem_loss, kdloss_mat grad, kd_kl_geom *g, kd_spanset *spans);

kdloss_status kd_args_distill(const kdloss_distill_params *p, int64_t bt, int64_t v,
                              kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                              const float *loss, const float *row_loss, kdloss_mat grad,
                              kd_distill_geom *g, kd_spanset *spans);

/* Everything of kdloss_cuda_distill_logits but the workspace, overlaps included (as the
 * elementwise calls: the CPU function has no workspace). */
kdloss_status kd_args_distill_logits(const kdloss_distill_logits_params *p, int64_t bt,
                                     int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                     kdloss_labels labels, const float *loss,
                                     const float *row_loss, kdloss_mat grad, kd_distill_geom *g,
                                     kd_spanset *spans);

/* Parameter and size checks of the fused-linear loss alone (the workspace-size query uses them
 * too). Sizes above INT32_MAX are KDLOSS_ERR_UNSUPPORTED, as on the CPU. */
kdloss_status kd_args_fld_params(const kdloss_fused_linear_distill_params *p);
kdloss_status kd_args_fld_sizes(int64_t bt, int64_t hs, int64_t ht, int64_t v);

/* Everything but the overlaps; kd_args_fld_workspace checks those after the workspace size. */
kdloss_status kd_args_fld(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs,
                         int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                         kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias,
                         kdloss_labels labels, const kdloss_fused_linear_distill_out *out,
                         kd_fld_geom *g, kd_spanset *spans);

/* Everything of kdloss_cuda_topk_distill_logits but the workspace, overlaps included (as the
 * elementwise calls: the CPU function has no workspace). */
kdloss_status kd_args_topk_logits(const kdloss_topk_distill_params *p, int64_t bt, int64_t v,
                                  kdloss_cmat student, kdloss_topk_teacher teacher,
                                  kdloss_labels labels, const float *loss, const float *row_loss,
                                  kdloss_mat grad, kd_topk_geom *g, kd_spanset *spans);

/* Everything of kdloss_cuda_fused_linear_topk_distill but the overlaps and the workspace
 * (kd_args_fld_workspace checks those, as for the dense fused loss). */
kdloss_status kd_args_fltk(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                           int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                           kdloss_topk_teacher teacher, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, kd_topk_geom *g,
                           kd_spanset *spans);

/* Workspace checks common to every CUDA call: NULL -> NULL_POINTER, not 16-byte aligned ->
 * INVALID_PARAM, smaller than `need` -> WORKSPACE_TOO_SMALL, overlapping any operand -> ALIASING.
 * KL and JSD check their operands' overlaps before (the CPU functions have no workspace). */
kdloss_status kd_args_workspace(const void *ws, size_t bytes, size_t need, const kd_spanset *spans);

/* Fused-linear: the workspace's NULL/alignment/size checks, then the overlaps among operands
 * (outputs against inputs and each other), then the workspace against all of them. */
kdloss_status kd_args_fld_workspace(const void *ws, size_t bytes, size_t need,
                                   const kd_spanset *spans);

#ifdef __cplusplus
}
#endif

#endif
