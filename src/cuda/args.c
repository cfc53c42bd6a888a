/* Host-side argument checks of the CUDA entry points (see args.h). The order of the checks is
 * the CPU functions' (src/cpu/kl_div.c, distill.c, distill_logits.c, fld_check.c), so that a call
 * with several faults gets the same code from both backends; the CUDA-only faults (context,
 * workspace alignment, a NULL workspace) come where the CPU checks its own workspace, or last.
 * Label values are device memory and are checked on the device (kdloss.h). */
#include "args.h"

#include <math.h>
#include <stdint.h>

static void spans_add(kd_spanset *s, kd_span sp) {
    /* 20 slots: the largest call (fused-linear) has 16 operands */
    if (s->n < (int)(sizeof s->s / sizeof s->s[0])) s->s[s->n++] = sp;
}

/* 1 if any span in the list (except empty ones) overlaps `a`. */
static int overlaps_any(kd_span a, const kd_span *list, int n) {
    for (int i = 0; i < n; i++)
        if (kd_spans_overlap(a, list[i])) return 1;
    return 0;
}

kdloss_status kd_args_kl(const kdloss_kl_params *p, int64_t bt, int64_t v, kdloss_cmat input,
                         kdloss_cmat target, const float *loss, const float *row_loss,
                         kdloss_mat elem_loss, kdloss_mat grad, kd_kl_geom *g, kd_spanset *spans) {
    kdloss_status st0 = kd_kl_check_args(p, bt, v, loss != NULL, elem_loss.data != NULL);
    if (st0 != KDLOSS_OK) return st0;

    kd_span s_in, s_t, s_el = {0, 0}, s_g = {0, 0};
    kdloss_status st = kd_check_fmat(bt, v, input.data, input.dtype, input.ld, &g->ld_in, &s_in);
    if (st != KDLOSS_OK) return st;
    st = kd_check_fmat(bt, v, target.data, target.dtype, target.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;
    g->ld_el = 0;
    g->ld_g = 0;
    if (grad.data) {
        if (grad.dtype != input.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, grad.data, grad.dtype, grad.ld, &g->ld_g, &s_g);
        if (st != KDLOSS_OK) return st;
    }
    if (elem_loss.data) {
        if (elem_loss.dtype != KDLOSS_F32) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, elem_loss.data, elem_loss.dtype, elem_loss.ld, &g->ld_el, &s_el);
        if (st != KDLOSS_OK) return st;
    }
    if (!loss && !row_loss && !elem_loss.data && !grad.data) return KDLOSS_ERR_NO_OUTPUT;

    kd_span s_loss = kd_vec_span(loss, 1, sizeof(float));
    kd_span s_row = kd_vec_span(row_loss, bt, sizeof(float));
    /* grad may overwrite the input exactly (same start, same ld); any other overlap is an error */
    int in_place = grad.data && grad.data == input.data && g->ld_g == g->ld_in;
    if (!in_place && kd_spans_overlap(s_g, s_in)) return KDLOSS_ERR_ALIASING;
    {
        kd_span l1[] = {s_t};
        if (overlaps_any(s_g, l1, 1)) return KDLOSS_ERR_ALIASING;
        kd_span l2[] = {s_in, s_t, s_g};
        if (overlaps_any(s_el, l2, 3)) return KDLOSS_ERR_ALIASING;
        kd_span l3[] = {s_in, s_t, s_g, s_el, s_row};
        if (overlaps_any(s_loss, l3, 5)) return KDLOSS_ERR_ALIASING;
        kd_span l4[] = {s_in, s_t, s_g, s_el};
        if (overlaps_any(s_row, l4, 4)) return KDLOSS_ERR_ALIASING;
    }
    spans->n = 0;
    spans_add(spans, s_in);
    spans_add(spans, s_t);
    spans->n_in = spans->n;
    spans_add(spans, s_el);
    spans_add(spans, s_g);
    spans_add(spans, s_loss);
    spans_add(spans, s_row);
    return KDLOSS_OK;
}

kdloss_status kd_args_distill(const kdloss_distill_params *p, int64_t bt, int64_t v, kdloss_cmat student,
                          kdloss_cmat teacher, kdloss_labels labels, const float *loss,
                          const float *row_loss, kdloss_mat grad, kd_jsd_geom *g,
                          kd_spanset *spans) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    kdloss_status st0 = kd_distill_check_params(p); /* the CPU's check (src/common) */
    if (st0 != KDLOSS_OK) return st0;

    kd_span s_s, s_t, s_g = {0, 0};
    kdloss_status st =
        kd_check_fmat(bt, v, student.data, student.dtype, student.ld, &g->ld_s, &s_s);
    if (st != KDLOSS_OK) return st;
    st = kd_check_fmat(bt, v, teacher.data, teacher.dtype, teacher.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;
    g->ld_g = 0;
    if (grad.data) {
        if (grad.dtype != student.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, grad.data, grad.dtype, grad.ld, &g->ld_g, &s_g);
        if (st != KDLOSS_OK) return st;
    }
    /* labels are optional here; when given, their dtype must be an integer one. Their values
     * live on the device and are checked there (see kdloss_cuda_jsd in kdloss.h). */
    if (labels.data && labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32)
        return KDLOSS_ERR_INVALID_DTYPE;
    if (!loss && !row_loss && !grad.data) return KDLOSS_ERR_NO_OUTPUT;

    kd_span s_lab = kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype));
    kd_span s_loss = kd_vec_span(loss, 1, sizeof(float));
    kd_span s_row = kd_vec_span(row_loss, bt, sizeof(float));
    int in_place = grad.data && grad.data == student.data && g->ld_g == g->ld_s;
    if (!in_place && kd_spans_overlap(s_g, s_s)) return KDLOSS_ERR_ALIASING;
    {
        kd_span l1[] = {s_t, s_lab};
        if (overlaps_any(s_g, l1, 2)) return KDLOSS_ERR_ALIASING;
        kd_span l2[] = {s_s, s_t, s_lab, s_g, s_row};
        if (overlaps_any(s_loss, l2, 5)) return KDLOSS_ERR_ALIASING;
        kd_span l3[] = {s_s, s_t, s_lab, s_g};
        if (overlaps_any(s_row, l3, 4)) return KDLOSS_ERR_ALIASING;
    }
    spans->n = 0;
    spans_add(spans, s_s);
    spans_add(spans, s_t);
    spans_add(spans, s_lab);
    spans->n_in = spans->n;
    spans_add(spans, s_g);
    spans_add(spans, s_loss);
    spans_add(spans, s_row);
    return KDLOSS_OK;
}

/* The CUDA fused kernels do not apply logit maps yet (kdloss.h): a map other than the identity
 * is KDLOSS_ERR_UNSUPPORTED, never a silently different loss. */
static kdloss_status no_map(kdloss_logit_map m, const char *who) {
    if ((m.scale == 0.0 || m.scale == 1.0) && m.softcap == 0.0) return KDLOSS_OK;
    kd_detail("%s (scale %g, softcap %g): the CUDA backend does not apply logit maps yet", who,
              m.scale, m.softcap);
    return KDLOSS_ERR_UNSUPPORTED;
}

/* Thin wrappers: the checks themselves are the CPU's (src/common/check.c), so both backends
 * return the same codes. */
kdloss_status kd_args_fl_params(const kdloss_fused_linear_distill_params *p) {
    kdloss_status st = p ? kd_fld_check_params(p) : KDLOSS_ERR_NULL_POINTER;
    if (st == KDLOSS_OK) st = no_map(p->student_map, "student_map");
    if (st == KDLOSS_OK) st = no_map(p->teacher_map, "teacher_map");
    return st;
}

kdloss_status kd_args_fl_sizes(int64_t bt, int64_t hs, int64_t ht, int64_t v) {
    return kd_fld_check_sizes(bt, hs, ht, v);
}

/* A student or teacher operand pair: F32 or BF16, both the same. */
static kdloss_status fl_pair_dtype(kdloss_dtype x, kdloss_dtype w) {
    if (x != KDLOSS_F32 && x != KDLOSS_BF16) return KDLOSS_ERR_INVALID_DTYPE;
    return w == x ? KDLOSS_OK : KDLOSS_ERR_INVALID_DTYPE;
}

/* A GEMM operand: kd_check_fmat, and its ld within a 32-bit int. */
static kdloss_status fl_mat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                            int64_t ld_in, int64_t *ld, kd_span *sp) {
    kdloss_status st = kd_check_fmat(rows, cols, data, dt, ld_in, ld, sp);
    if (st != KDLOSS_OK) return st;
    return *ld > INT32_MAX ? KDLOSS_ERR_UNSUPPORTED : KDLOSS_OK;
}

/* The fused losses' outputs (shared by the dense and top-k checks, in the CPU's order): at least
 * one, dxs (BT x Hs) and dws (V x Hs) in their operands' dtypes, dbs only with a bias, every
 * pointer aligned. Writes the effective lds, whether gradients are wanted, and the spans. */
static kdloss_status fl_outputs(const kdloss_fused_linear_distill_out *out, int64_t bt,
                                int64_t hs, int64_t v, kdloss_dtype xdt, kdloss_dtype wdt,
                                int has_bias, int64_t *ld_dxs, int64_t *ld_dws, int *want_grad,
                                kd_span *s_dxs, kd_span *s_dws) {
    kdloss_status st;
    const int grad = out->dxs.data || out->dws.data || out->dbs;
    if (!grad && !out->loss && !out->soft_loss && !out->hard_loss && !out->row_soft &&
        !out->row_hard && !out->row_lse)
        return KDLOSS_ERR_NO_OUTPUT;
    *s_dxs = *s_dws = (kd_span){0, 0};
    *ld_dxs = *ld_dws = 0;
    if (out->dxs.data) {
        if (out->dxs.dtype != xdt) return KDLOSS_ERR_INVALID_DTYPE;
        st = fl_mat(bt, hs, out->dxs.data, out->dxs.dtype, out->dxs.ld, ld_dxs, s_dxs);
        if (st != KDLOSS_OK) return st;
    }
    if (out->dws.data) {
        if (out->dws.dtype != wdt) return KDLOSS_ERR_INVALID_DTYPE;
        st = fl_mat(v, hs, out->dws.data, out->dws.dtype, out->dws.ld, ld_dws, s_dws);
        if (st != KDLOSS_OK) return st;
    }
    if (out->dbs && !has_bias) return KDLOSS_ERR_SHAPE_MISMATCH;
    if (!kd_aligned(out->dbs, kdloss_dtype_size(xdt)) || !kd_aligned(out->loss, sizeof(float)) ||
        !kd_aligned(out->soft_loss, sizeof(float)) || !kd_aligned(out->hard_loss, sizeof(float)) ||
        !kd_aligned(out->row_soft, sizeof(float)) || !kd_aligned(out->row_hard, sizeof(float)) ||
        !kd_aligned(out->row_lse, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    *want_grad = grad;
    return KDLOSS_OK;
}

/* The fused losses' output spans after the inputs' (dbs elements of es bytes). */
static void fl_out_spans(kd_spanset *spans, const kdloss_fused_linear_distill_out *out,
                         int64_t bt, int64_t v, size_t es, kd_span s_dxs, kd_span s_dws) {
    spans_add(spans, s_dxs);
    spans_add(spans, s_dws);
    spans_add(spans, kd_vec_span(out->dbs, v, es));
    spans_add(spans, kd_vec_span(out->loss, 1, sizeof(float)));
    spans_add(spans, kd_vec_span(out->soft_loss, 1, sizeof(float)));
    spans_add(spans, kd_vec_span(out->hard_loss, 1, sizeof(float)));
    spans_add(spans, kd_vec_span(out->row_soft, bt, sizeof(float)));
    spans_add(spans, kd_vec_span(out->row_hard, bt, sizeof(float)));
    spans_add(spans, kd_vec_span(out->row_lse, bt, sizeof(float)));
}

kdloss_status kd_args_fl(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs, int64_t ht,
                         int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt,
                         kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
                         const kdloss_fused_linear_distill_out *out, kd_fl_geom *g,
                         kd_spanset *spans) {
    if (!p || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_args_fl_params(p);
    if (st == KDLOSS_OK) st = kd_args_fl_sizes(bt, hs, ht, v);
    if (st == KDLOSS_OK) st = fl_pair_dtype(xs.dtype, ws.dtype);
    if (st == KDLOSS_OK) st = fl_pair_dtype(xt.dtype, wt.dtype);
    if (st != KDLOSS_OK) return st;

    kd_span s_xs, s_ws, s_xt, s_wt;
    if ((st = fl_mat(bt, hs, xs.data, xs.dtype, xs.ld, &g->ld_xs, &s_xs)) != KDLOSS_OK) return st;
    if ((st = fl_mat(v, hs, ws.data, ws.dtype, ws.ld, &g->ld_ws, &s_ws)) != KDLOSS_OK) return st;
    if ((st = fl_mat(bt, ht, xt.data, xt.dtype, xt.ld, &g->ld_xt, &s_xt)) != KDLOSS_OK) return st;
    if ((st = fl_mat(v, ht, wt.data, wt.dtype, wt.ld, &g->ld_wt, &s_wt)) != KDLOSS_OK) return st;
    /* biases and scalar / per-row outputs aligned to their element size, as the CPU's
     * kd_fld_check (tests/cuda/test_cuda.c "fldistill row_soft misaligned") */
    if (!kd_aligned(bs, kdloss_dtype_size(xs.dtype)) ||
        !kd_aligned(bt_bias, kdloss_dtype_size(xt.dtype)))
        return KDLOSS_ERR_MISALIGNED;
    /* labels are required; their values live on the device and are checked there */
    if (!labels.data) return KDLOSS_ERR_NULL_POINTER;
    if (labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32) return KDLOSS_ERR_INVALID_DTYPE;

    kd_span s_dxs, s_dws;
    st = fl_outputs(out, bt, hs, v, xs.dtype, ws.dtype, bs != NULL, &g->ld_dxs, &g->ld_dws,
                    &g->want_grad, &s_dxs, &s_dws);
    if (st != KDLOSS_OK) return st;

    size_t es_s = kdloss_dtype_size(xs.dtype), es_t = kdloss_dtype_size(xt.dtype);
    /* inputs first, then outputs; the overlaps are checked with the workspace (as on the CPU,
     * a too-small workspace is reported before an overlap) */
    spans->n = 0;
    spans_add(spans, s_xs);
    spans_add(spans, s_ws);
    spans_add(spans, kd_vec_span(bs, v, es_s));
    spans_add(spans, s_xt);
    spans_add(spans, s_wt);
    spans_add(spans, kd_vec_span(bt_bias, v, es_t));
    spans_add(spans, kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype)));
    spans->n_in = spans->n;
    fl_out_spans(spans, out, bt, v, es_s, s_dxs, s_dws);
    return KDLOSS_OK;
}

kdloss_status kd_args_fl_workspace(const void *ws, size_t bytes, size_t need,
                                   const kd_spanset *spans) {
    if (!ws) return KDLOSS_ERR_NULL_POINTER;
    if ((uintptr_t)ws % 16u != 0) return KDLOSS_ERR_INVALID_PARAM;
    if (bytes < need) return KDLOSS_ERR_WORKSPACE_TOO_SMALL;
    /* every output against every input and every other output */
    for (int o = spans->n_in; o < spans->n; o++) {
        if (overlaps_any(spans->s[o], spans->s, spans->n_in)) return KDLOSS_ERR_ALIASING;
        if (overlaps_any(spans->s[o], spans->s + o + 1, spans->n - o - 1))
            return KDLOSS_ERR_ALIASING;
    }
    return kd_args_workspace(ws, bytes, need, spans);
}

kdloss_status kd_args_workspace(const void *ws, size_t bytes, size_t need, const kd_spanset *spans) {
    if (!ws) return KDLOSS_ERR_NULL_POINTER;
    if ((uintptr_t)ws % 16u != 0) return KDLOSS_ERR_INVALID_PARAM;
    if (bytes < need) return KDLOSS_ERR_WORKSPACE_TOO_SMALL;
    if ((uint64_t)need > (uint64_t)(UINTPTR_MAX - (uintptr_t)ws)) return KDLOSS_ERR_INVALID_SIZE;
    /* only the bytes the call uses count: a larger buffer may hold the caller's other data */
    kd_span w = {(const char *)ws, (const char *)ws + need};
    if (overlaps_any(w, spans->s, spans->n)) return KDLOSS_ERR_ALIASING;
    return KDLOSS_OK;
}

/* ---- the losses on logits (dense teacher, sparse top-k teacher) ---------------------------- */

/* Every output span against every input and every later output; output `skip_o` may coincide
 * with input `skip_i` (an in-place gradient; -1: none). */
static kdloss_status spans_disjoint(const kd_spanset *s, int skip_o, int skip_i) {
    for (int o = s->n_in; o < s->n; o++) {
        for (int i = 0; i < s->n_in; i++)
            if (!(o == skip_o && i == skip_i) && kd_spans_overlap(s->s[o], s->s[i]))
                return KDLOSS_ERR_ALIASING;
        if (overlaps_any(s->s[o], s->s + o + 1, s->n - o - 1)) return KDLOSS_ERR_ALIASING;
    }
    return KDLOSS_OK;
}

/* The student, gradient, labels and outputs of a loss on logits, after its teacher's checks
 * (the CPU's kd_ew_check_rows order: student, gradient, labels' dtype and alignment, at least
 * one output, outputs' alignment, overlaps). teacher: the n_teacher spans the teacher reads,
 * inputs after the student's. Writes the effective lds and every span (the gradient is the
 * first output and may be the student itself, same ld). */
static kdloss_status logits_rows(int64_t bt, int64_t v, kdloss_cmat student,
                                 const kd_span *teacher, int n_teacher, kdloss_labels labels,
                                 const float *loss, const float *row_loss, kdloss_mat grad,
                                 int64_t *ld_s, int64_t *ld_g, kd_spanset *spans) {
    kd_span s_s, s_g = {0, 0};
    kdloss_status st = kd_check_fmat(bt, v, student.data, student.dtype, student.ld, ld_s, &s_s);
    if (st != KDLOSS_OK) return st;
    *ld_g = 0;
    if (grad.data) {
        if (grad.dtype != student.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, grad.data, grad.dtype, grad.ld, ld_g, &s_g);
        if (st != KDLOSS_OK) return st;
    }
    /* label values live on the device and are checked there (kdloss.h) */
    if (labels.data && labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32)
        return KDLOSS_ERR_INVALID_DTYPE;
    if (labels.data && !kd_aligned(labels.data, kdloss_dtype_size(labels.dtype)))
        return KDLOSS_ERR_MISALIGNED;
    if (!loss && !row_loss && !grad.data) return KDLOSS_ERR_NO_OUTPUT;
    if (!kd_aligned(loss, sizeof(float)) || !kd_aligned(row_loss, sizeof(float)))
        return KDLOSS_ERR_MISALIGNED;
    spans->n = 0;
    spans_add(spans, s_s); /* input 0 */
    for (int i = 0; i < n_teacher; i++) spans_add(spans, teacher[i]);
    spans_add(spans, kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype)));
    spans->n_in = spans->n;
    spans_add(spans, s_g); /* output n_in: may be the student itself, same ld */
    spans_add(spans, kd_vec_span(row_loss, bt, sizeof(float)));
    spans_add(spans, kd_vec_span(loss, 1, sizeof(float)));
    const int in_place = grad.data && grad.data == student.data && *ld_g == *ld_s;
    return spans_disjoint(spans, in_place ? spans->n_in : -1, 0);
}

kdloss_status kd_args_distill_logits(const kdloss_distill_logits_params *p, int64_t bt,
                                     int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                     kdloss_labels labels, const float *loss,
                                     const float *row_loss, kdloss_mat grad, kd_jsd_geom *g,
                                     kd_spanset *spans) {
    /* the CPU's order (src/cpu/distill_logits.c): parameters, sizes, student, teacher, rest */
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    kdloss_status st = kd_distill_logits_check_params(p); /* src/common, shared */
    if (st != KDLOSS_OK) return st;
    kd_span s_s, s_t;
    st = kd_check_fmat(bt, v, student.data, student.dtype, student.ld, &g->ld_s, &s_s);
    if (st == KDLOSS_OK)
        st = kd_check_fmat(bt, v, teacher.data, teacher.dtype, teacher.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;
    return logits_rows(bt, v, student, &s_t, 1, labels, loss, row_loss, grad, &g->ld_s, &g->ld_g,
                       spans);
}

kdloss_status kd_args_topk_logits(const kdloss_topk_distill_params *p, int64_t bt, int64_t v,
                                  kdloss_cmat student, kdloss_topk_teacher teacher,
                                  kdloss_labels labels, const float *loss, const float *row_loss,
                                  kdloss_mat grad, kd_topk_geom *g, kd_spanset *spans) {
    /* the CPU's order (src/cpu/distill_logits.c): parameters, sizes, teacher, student */
    kdloss_status st = kd_topk_check_logits_params(p); /* src/common/topk.c, shared */
    if (st != KDLOSS_OK) return st;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    kd_span s_t[2];
    st = kd_topk_check_teacher(teacher, bt, &s_t[0], &s_t[1], &g->ld_ids, &g->ld_lp);
    if (st != KDLOSS_OK) return st;
    g->want_grad = grad.data != NULL;
    return logits_rows(bt, v, student, s_t, 2, labels, loss, row_loss, grad, &g->ld_s, &g->ld_g,
                       spans);
}

/* ---- the fused sparse top-k teacher ------------------------------------------------------- */

kdloss_status kd_args_fltk(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                           int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                           kdloss_topk_teacher teacher, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, kd_topk_geom *g,
                           kd_spanset *spans) {
    /* the CPU's order (src/cpu/fld_check.c) */
    if (!p || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_topk_check_fused_params(p); /* src/common/topk.c, shared */
    if (st == KDLOSS_OK) st = no_map(p->student_map, "student_map");
    if (st == KDLOSS_OK) st = kd_args_fl_sizes(bt, hs, hs, v);
    if (st == KDLOSS_OK) st = fl_pair_dtype(xs.dtype, ws.dtype);
    if (st != KDLOSS_OK) return st;
    kd_span s_xs, s_ws, s_ids, s_lp;
    if ((st = fl_mat(bt, hs, xs.data, xs.dtype, xs.ld, &g->ld_xs, &s_xs)) != KDLOSS_OK) return st;
    if ((st = fl_mat(v, hs, ws.data, ws.dtype, ws.ld, &g->ld_ws, &s_ws)) != KDLOSS_OK) return st;
    st = kd_topk_check_teacher(teacher, bt, &s_ids, &s_lp, &g->ld_ids, &g->ld_lp);
    if (st != KDLOSS_OK) return st;
    const size_t es = kdloss_dtype_size(xs.dtype);
    if (!kd_aligned(bs, es)) return KDLOSS_ERR_MISALIGNED;
    /* labels are optional: without them every row is kept and no cross-entropy exists */
    if (!labels.data && (p->weight_hard_loss > 0.0 || out->hard_loss || out->row_hard))
        return KDLOSS_ERR_INVALID_PARAM;
    if (labels.data && labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32)
        return KDLOSS_ERR_INVALID_DTYPE;
    if (labels.data && !kd_aligned(labels.data, kdloss_dtype_size(labels.dtype)))
        return KDLOSS_ERR_MISALIGNED;

    kd_span s_dxs, s_dws;
    st = fl_outputs(out, bt, hs, v, xs.dtype, ws.dtype, bs != NULL, &g->ld_dxs, &g->ld_dws,
                    &g->want_grad, &s_dxs, &s_dws);
    if (st != KDLOSS_OK) return st;

    spans->n = 0;
    spans_add(spans, s_xs);
    spans_add(spans, s_ws);
    spans_add(spans, kd_vec_span(bs, v, es));
    spans_add(spans, s_ids);
    spans_add(spans, s_lp);
    spans_add(spans, kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype)));
    spans->n_in = spans->n;
    fl_out_spans(spans, out, bt, v, es, s_dxs, s_dws);
    return KDLOSS_OK;
}
