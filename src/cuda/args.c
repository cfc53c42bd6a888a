/* Host-side argument checks of the CUDA entry points (see args.h). Order of checks, the same for
 * every function: params and required pointers, parameter ranges, sizes, input views, "no
 * output", output dtypes and views, aliasing; the CUDA caller adds the workspace last. */
#include "args.h"

#include <math.h>
#include <stdint.h>

static void spans_add(kd_spanset *s, kd_span sp) {
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
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (p->reduction < KDLOSS_REDUCTION_NONE || p->reduction > KDLOSS_REDUCTION_BATCHMEAN)
        return KDLOSS_ERR_INVALID_REDUCTION;
    if (!(p->eps >= 0.0) || !isfinite(p->grad_scale)) return KDLOSS_ERR_INVALID_PARAM;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;

    kd_span s_in, s_t, s_el = {0, 0}, s_g = {0, 0};
    kdloss_status st = kd_check_fmat(bt, v, input.data, input.dtype, input.ld, &g->ld_in, &s_in);
    if (st != KDLOSS_OK) return st;
    st = kd_check_fmat(bt, v, target.data, target.dtype, target.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;

    if (!loss && !row_loss && !elem_loss.data && !grad.data) return KDLOSS_ERR_NO_OUTPUT;
    int none = p->reduction == KDLOSS_REDUCTION_NONE;
    /* a reduced scalar under NONE, or an elementwise loss under a reduction, contradicts it */
    if ((loss && none) || (elem_loss.data && !none)) return KDLOSS_ERR_INVALID_REDUCTION;

    g->ld_el = 0;
    g->ld_g = 0;
    if (elem_loss.data) {
        if (elem_loss.dtype != KDLOSS_F32) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, elem_loss.data, elem_loss.dtype, elem_loss.ld, &g->ld_el, &s_el);
        if (st != KDLOSS_OK) return st;
    }
    if (grad.data) {
        if (grad.dtype != input.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, grad.data, grad.dtype, grad.ld, &g->ld_g, &s_g);
        if (st != KDLOSS_OK) return st;
    }

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
    spans_add(spans, s_el);
    spans_add(spans, s_g);
    spans_add(spans, s_loss);
    spans_add(spans, s_row);
    return KDLOSS_OK;
}

kdloss_status kd_args_jsd(const kdloss_jsd_params *p, int64_t bt, int64_t v, kdloss_cmat student,
                          kdloss_cmat teacher, kdloss_labels labels, const float *loss,
                          const float *row_loss, kdloss_mat grad, kd_jsd_geom *g,
                          kd_spanset *spans) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (!(p->beta >= 0.0 && p->beta <= 1.0) || !isfinite(p->grad_scale))
        return KDLOSS_ERR_INVALID_PARAM;
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;

    kd_span s_s, s_t, s_g = {0, 0};
    kdloss_status st =
        kd_check_fmat(bt, v, student.data, student.dtype, student.ld, &g->ld_s, &s_s);
    if (st != KDLOSS_OK) return st;
    st = kd_check_fmat(bt, v, teacher.data, teacher.dtype, teacher.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;
    /* labels are optional here; when given, their dtype must be an integer one. Their values
     * live on the device and are checked there (see kdloss_cuda_jsd in kdloss.h). */
    if (labels.data && labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32)
        return KDLOSS_ERR_INVALID_DTYPE;

    if (!loss && !row_loss && !grad.data) return KDLOSS_ERR_NO_OUTPUT;
    g->ld_g = 0;
    if (grad.data) {
        if (grad.dtype != student.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, v, grad.data, grad.dtype, grad.ld, &g->ld_g, &s_g);
        if (st != KDLOSS_OK) return st;
    }

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
    spans_add(spans, s_g);
    spans_add(spans, s_loss);
    spans_add(spans, s_row);
    return KDLOSS_OK;
}

kdloss_status kd_args_fl_params(const kdloss_fljsd_params *p) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    if (!(p->beta >= 0.0 && p->beta <= 1.0)) return KDLOSS_ERR_INVALID_PARAM;
    if (!(p->temperature > 0.0) || !isfinite(p->temperature)) return KDLOSS_ERR_INVALID_PARAM;
    if (!(p->weight_hard_loss >= 0.0) || !isfinite(p->weight_hard_loss))
        return KDLOSS_ERR_INVALID_PARAM;
    if (!(p->weight_soft_loss >= 0.0) || !isfinite(p->weight_soft_loss))
        return KDLOSS_ERR_INVALID_PARAM;
    if (p->chunk_size < 0 || !isfinite(p->grad_scale)) return KDLOSS_ERR_INVALID_PARAM;
    return KDLOSS_OK;
}

/* A fused-linear operand: float matrix of F32 or BF16 only. */
static kdloss_status fl_mat(int64_t rows, int64_t cols, kdloss_cmat m, int64_t *ld, kd_span *sp) {
    kdloss_status st = kd_check_fmat(rows, cols, m.data, m.dtype, m.ld, ld, sp);
    if (st != KDLOSS_OK) return st;
    if (m.dtype != KDLOSS_F32 && m.dtype != KDLOSS_BF16) return KDLOSS_ERR_INVALID_DTYPE;
    return KDLOSS_OK;
}

kdloss_status kd_args_fl(const kdloss_fljsd_params *p, int64_t bt, int64_t hs, int64_t ht,
                         int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt,
                         kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
                         const kdloss_fljsd_out *out, kd_fl_geom *g, kd_spanset *spans) {
    if (!p || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_args_fl_params(p);
    if (st != KDLOSS_OK) return st;
    if (bt <= 0 || hs <= 0 || ht <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;

    kd_span s_xs, s_ws, s_xt, s_wt;
    if ((st = fl_mat(bt, hs, xs, &g->ld_xs, &s_xs)) != KDLOSS_OK) return st;
    if ((st = fl_mat(v, hs, ws, &g->ld_ws, &s_ws)) != KDLOSS_OK) return st;
    if ((st = fl_mat(bt, ht, xt, &g->ld_xt, &s_xt)) != KDLOSS_OK) return st;
    if ((st = fl_mat(v, ht, wt, &g->ld_wt, &s_wt)) != KDLOSS_OK) return st;
    if (xs.dtype != ws.dtype || xt.dtype != wt.dtype) return KDLOSS_ERR_INVALID_DTYPE;
    if (!labels.data) return KDLOSS_ERR_NULL_POINTER;
    if (labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32) return KDLOSS_ERR_INVALID_DTYPE;

    if (!out->loss && !out->soft_loss && !out->hard_loss && !out->dxs.data && !out->dws.data &&
        !out->dbs)
        return KDLOSS_ERR_NO_OUTPUT;
    if (out->dbs && !bs) return KDLOSS_ERR_SHAPE_MISMATCH;

    kd_span s_dxs = {0, 0}, s_dws = {0, 0};
    g->ld_dxs = 0;
    g->ld_dws = 0;
    if (out->dxs.data) {
        if (out->dxs.dtype != xs.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(bt, hs, out->dxs.data, out->dxs.dtype, out->dxs.ld, &g->ld_dxs, &s_dxs);
        if (st != KDLOSS_OK) return st;
    }
    if (out->dws.data) {
        if (out->dws.dtype != ws.dtype) return KDLOSS_ERR_INVALID_DTYPE;
        st = kd_check_fmat(v, hs, out->dws.data, out->dws.dtype, out->dws.ld, &g->ld_dws, &s_dws);
        if (st != KDLOSS_OK) return st;
    }
    g->want_grad = out->dxs.data || out->dws.data || out->dbs;

    size_t es_s = kdloss_dtype_size(ws.dtype), es_t = kdloss_dtype_size(wt.dtype);
    kd_span s_bs = kd_vec_span(bs, v, es_s), s_bt = kd_vec_span(bt_bias, v, es_t);
    kd_span s_lab = kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype));
    kd_span s_dbs = kd_vec_span(out->dbs, v, es_s);
    kd_span s_loss = kd_vec_span(out->loss, 1, sizeof(float));
    kd_span s_soft = kd_vec_span(out->soft_loss, 1, sizeof(float));
    kd_span s_hard = kd_vec_span(out->hard_loss, 1, sizeof(float));

    /* no in-place form here: every output must be disjoint from every input and from the others */
    kd_span ins[] = {s_xs, s_ws, s_bs, s_xt, s_wt, s_bt, s_lab};
    kd_span outs[] = {s_dxs, s_dws, s_dbs, s_loss, s_soft, s_hard};
    int nin = (int)(sizeof ins / sizeof ins[0]), nout = (int)(sizeof outs / sizeof outs[0]);
    for (int i = 0; i < nout; i++) {
        if (overlaps_any(outs[i], ins, nin)) return KDLOSS_ERR_ALIASING;
        if (overlaps_any(outs[i], outs + i + 1, nout - i - 1)) return KDLOSS_ERR_ALIASING;
    }
    spans->n = 0;
    for (int i = 0; i < nin; i++) spans_add(spans, ins[i]);
    for (int i = 0; i < nout; i++) spans_add(spans, outs[i]);
    return KDLOSS_OK;
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
