/* The argument checks of every operation, one implementation for the CPU and CUDA backends
 * (args.c: the losses on rows; args_fld.c: the fused losses and the workspace). A backend passes
 * its kd_rules: what it can read on the host and what it requires of a workspace. Every failing
 * check sets kdloss_error_detail's text naming the argument (and row / value). Device memory is
 * never read; nothing the caller owns is written. */
#ifndef KDLOSS_ARGS_H
#define KDLOSS_ARGS_H

#include "check.h"
#include "kdloss.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The order of the checks, the same for every operation and backend (a call with several faults
 * gets the first one's status); each operation skips the steps it has no argument for:
 *   1. parameters, sizes: NULL params (and out) first; the losses on dense rows then check
 *      their sizes (positive) before the parameters' values (KL: which outputs its reduction
 *      allows), the top-k and fused losses the values before the sizes (and the GEMM
 *      dimensions within a 32-bit int);
 *   2. operand views, in argument order (but: the top-k teacher before the student of the
 *      logits loss, the fused student's bias after the teacher), each by dtype, shape,
 *      alignment, stride, extent (a fused loss's hidden states and LM head as a pair: the
 *      pair's dtypes, then each view; the student's pair before the teacher's); a loss on rows
 *      checks its gradient (then KL's elem_loss) here too, the fused losses theirs with the
 *      outputs (4);
 *   3. labels: dtype, alignment, then their values (host memory only);
 *   4. outputs: at least one; the fused gradients' views; every pointer aligned;
 *   5. aliasing: no output overlaps an input or another output (a gradient may be its operand
 *      in place: same address, same ld);
 *   6. workspace: present and aligned (where required), large enough, inside the address space,
 *      overlapping no operand.
 * A top-k teacher's ids are checked by value (host memory only) last for the logits loss, with
 * the teacher's views (2) for the fused loss. The fused losses check 5 with 6, after their plan.
 */

/* What differs between backends. */
typedef struct kd_rules {
    int host_memory;     /* operands are host memory: labels' and ids' values checked here; on a
                            device the kernels check them (kdloss.h) */
    size_t ws_align;     /* > 0: the workspace is required and aligned to this (the CUDA kernels'
                            16-byte loads); 0: optional (the CPU allocates one), any alignment */
} kd_rules;

/* Every byte range a call reads or writes, each with its argument's name: s[0, n_in) inputs,
 * s[n_in, n) outputs. The workspace is checked against all of them. */
typedef struct kd_spanset {
    kd_span s[20];
    const char *name[20];
    int n;
    int n_in;
} kd_spanset;

/* Effective leading dimensions (ld = 0 resolved) of a KL call. */
typedef struct kd_kl_geom {
    int64_t ld_in, ld_t, ld_el, ld_g;
} kd_kl_geom;

/* Effective leading dimensions of a divergence call (kdloss_distill, _distill_logits). */
typedef struct kd_distill_geom {
    int64_t ld_s, ld_t, ld_g;
} kd_distill_geom;

/* Effective leading dimensions of a top-k call on logits (kdloss_topk_distill_logits; the fused
 * losses' are in kd_fld_checked), and whether it computes a gradient. */
typedef struct kd_topk_geom {
    int64_t ld_ids, ld_lp; /* teacher ids and log-probs (rows of k) */
    int64_t ld_s, ld_g;    /* student logits, gradient */
    int want_grad;         /* grad requested */
} kd_topk_geom;

/* The teacher of a fused call: dense (hidden states and LM head) or sparse (top-k ids and
 * log-probs, docs/MATH.md section 8). */
typedef struct kd_fld_teacher {
    int64_t ht;                      /* dense: teacher hidden size; 0 when sparse */
    kdloss_cmat xt, wt;              /* dense: (BT x Ht), (V x Ht) */
    const void *bias;                /* dense: [V] optional */
    const kdloss_topk_teacher *topk; /* sparse: the teacher, or NULL when dense */
    int tail;                        /* sparse: KD_TAIL_* */
} kd_fld_teacher;

/* A checked fused call: every view's effective ld, the rows kept, whether gradients are wanted. */
typedef struct kd_fld_checked {
    int64_t ld_xs, ld_ws, ld_xt, ld_wt, ld_ids, ld_lp, ld_dxs, ld_dws;
    int64_t n_valid; /* rows whose label is not ignore_index (BT when not read: device labels) */
    int want_grad;
} kd_fld_checked;

/* ---- the losses on rows (args.c). Shapes: operands, grad, elem_loss (BT x V); labels,
 * row_loss [BT]; loss [1]. *n_valid: rows kept (BT unless labels are host memory). ---- */
kdloss_status kd_check_kl(const kd_rules *r, const kdloss_kl_params *p, int64_t bt, int64_t v,
                          kdloss_cmat input, kdloss_cmat target, const float *loss,
                          const float *row_loss, kdloss_mat elem_loss, kdloss_mat grad,
                          kd_kl_geom *g, kd_spanset *spans);
kdloss_status kd_check_distill(const kd_rules *r, const kdloss_distill_params *p, int64_t bt,
                               int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                               kdloss_labels labels, const float *loss, const float *row_loss,
                               kdloss_mat grad, kd_distill_geom *g, int64_t *n_valid,
                               kd_spanset *spans);
kdloss_status kd_check_distill_logits(const kd_rules *r, const kdloss_distill_logits_params *p,
                                      int64_t bt, int64_t v, kdloss_cmat student,
                                      kdloss_cmat teacher, kdloss_labels labels,
                                      const float *loss, const float *row_loss, kdloss_mat grad,
                                      kd_distill_geom *g, int64_t *n_valid, kd_spanset *spans);
/* Writes ld_ids, ld_lp, ld_s, ld_g and want_grad of *g. */
kdloss_status kd_check_topk_logits(const kd_rules *r, const kdloss_topk_distill_params *p,
                                   int64_t bt, int64_t v, kdloss_cmat student,
                                   kdloss_topk_teacher teacher, kdloss_labels labels,
                                   const float *loss, const float *row_loss, kdloss_mat grad,
                                   kd_topk_geom *g, int64_t *n_valid, kd_spanset *spans);

/* ---- the fused losses (args_fld.c) ---- */
/* Step 1 of the dense fused loss's parameters alone (its workspace-size queries use it too). */
kdloss_status kd_check_fld_params(const kd_rules *r, const kdloss_fused_linear_distill_params *p);
/* Steps 1-4 of a fused call with either teacher, p being the dense form of its parameters (a
 * top-k call's, kd_topk_fld_params, its tail checked by the caller). Labels' and ids' values
 * range over [0, v_ids) (v, or the whole vocabulary of a vocabulary-parallel call). */
kdloss_status kd_check_fld(const kd_rules *r, const kdloss_fused_linear_distill_params *p,
                          int64_t bt, int64_t hs, int64_t v, int64_t v_ids, kdloss_cmat xs,
                          kdloss_cmat ws, const void *bs, const kd_fld_teacher *t,
                          kdloss_labels labels, const kdloss_fused_linear_distill_out *out,
                          kd_fld_checked *c, kd_spanset *spans);
/* The same for the top-k parameters (their tail first). */
kdloss_status kd_check_fltk(const kd_rules *r, const kdloss_fused_linear_topk_distill_params *p,
                            int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                            const void *bs, kdloss_topk_teacher teacher, kdloss_labels labels,
                            const kdloss_fused_linear_distill_out *out, kd_fld_checked *c,
                            kd_spanset *spans);
/* Several teachers (kdloss_teacher_heads), on every backend: present, n >= 1, every index (host
 * memory on every backend) in [0, n), the index vector apart from every output. Each head's view
 * is checked as the single-teacher call checks wt (kd_check_fld, once per head). */
kdloss_status kd_check_teacher_heads(const kdloss_teacher_heads *h, int64_t bt, int64_t hs,
                                     int64_t v, const kdloss_fused_linear_distill_out *o);
/* Steps 5 and 6 of a fused call: `need` bytes of workspace (its plan's). */
kdloss_status kd_check_fld_workspace(const kd_rules *r, const void *ws, size_t bytes, size_t need,
                                    const kd_spanset *spans);
/* Step 6 alone (the losses on rows check 5 themselves: the CPU functions have no workspace). */
kdloss_status kd_check_workspace(const kd_rules *r, const void *ws, size_t bytes, size_t need,
                                 const kd_spanset *spans);

/* Helpers of args.c and args_fld.c. */
void kd_spans_add(kd_spanset *s, const char *name, kd_span sp);
/* ALIASING when an output overlaps an input or a later output; output `in_place` (an index of
 * s, -1: none) may coincide with input 0. */
kdloss_status kd_spans_disjoint(const kd_spanset *s, int in_place);
/* MISALIGNED (detail naming `name`) unless p is a multiple of `align` bytes. */
kdloss_status kd_check_aligned(const char *name, const void *p, size_t align);

#ifdef __cplusplus
}
#endif

#endif /* KDLOSS_ARGS_H */
