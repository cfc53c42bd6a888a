/* The argument checks of the fused losses (kdloss_fused_linear_distill, _jsd, _topk_distill and
 * their _vp forms) and of every workspace, for every backend, in args.h's order. */
#include "args.h"

#include <stdint.h>

/* A student or teacher operand pair (hidden states x, LM head w): F32 or BF16, both the same
 * (the GEMMs take one type for both). */
static kdloss_status pair_dtype(const char *xn, kdloss_dtype x, const char *wn, kdloss_dtype w) {
    if ((x == KDLOSS_F32 || x == KDLOSS_BF16) && w == x) return KDLOSS_OK;
    kd_detail("%s is %s and %s %s: both fp32 or both bf16", xn, kdloss_dtype_name(x), wn,
              kdloss_dtype_name(w));
    return KDLOSS_ERR_INVALID_DTYPE;
}

/* A (rows x cols) matrix `name` read or written through a GEMM: kd_check_fmat, and its ld
 * within a 32-bit int (CBLAS and cuBLAS take int). */
static kdloss_status gemm_view(const char *name, int64_t rows, int64_t cols, const void *data,
                               kdloss_dtype dt, int64_t ld_in, int64_t *ld, kd_span *span) {
    kdloss_status st = kd_check_fmat(rows, cols, data, dt, ld_in, ld, span);
    if (st == KDLOSS_OK && *ld > INT32_MAX) {
        kd_detail("ld %lld does not fit a 32-bit int (a GEMM operand)", (long long)*ld);
        st = KDLOSS_ERR_UNSUPPORTED;
    }
    return kd_named(name, st);
}

kdloss_status kd_check_fld_params(const kd_rules *r, const kdloss_fused_linear_distill_params *p) {
    (void)r; /* the same parameters on every backend */
    kd_detail_clear();
    if (!p) return kd_named("params", KDLOSS_ERR_NULL_POINTER);
    return kd_fld_check_params(p);
}

/* The dense teacher's views, its pair's dtypes first, into spans. */
static kdloss_status dense_teacher(int64_t bt, int64_t v, const kd_fld_teacher *t,
                                   kd_fld_checked *c, kd_spanset *spans) {
    kdloss_status st = pair_dtype("teacher_input", t->xt.dtype, "teacher_weight", t->wt.dtype);
    kd_span s_xt, s_wt;
    if (st == KDLOSS_OK)
        st = gemm_view("teacher_input", bt, t->ht, t->xt.data, t->xt.dtype, t->xt.ld, &c->ld_xt,
                       &s_xt);
    if (st == KDLOSS_OK)
        st = gemm_view("teacher_weight", v, t->ht, t->wt.data, t->wt.dtype, t->wt.ld, &c->ld_wt,
                       &s_wt);
    const size_t et = kdloss_dtype_size(t->xt.dtype);
    if (st == KDLOSS_OK) st = kd_check_aligned("teacher_bias", t->bias, et);
    if (st != KDLOSS_OK) return st;
    kd_spans_add(spans, "teacher_input", s_xt);
    kd_spans_add(spans, "teacher_weight", s_wt);
    kd_spans_add(spans, "teacher_bias", kd_vec_span(t->bias, v, et));
    return KDLOSS_OK;
}

/* The sparse teacher's views, and its ids' values where the host can read them, into spans. */
static kdloss_status sparse_teacher(const kd_rules *r, int64_t bt, int64_t v_ids,
                                    kdloss_topk_teacher k, kd_fld_checked *c, kd_spanset *spans) {
    kd_span s_ids, s_lp;
    kdloss_status st = kd_topk_check_teacher(k, bt, &s_ids, &s_lp, &c->ld_ids, &c->ld_lp);
    if (st == KDLOSS_OK && r->host_memory) {
        k.ids.ld = c->ld_ids;
        st = kd_topk_check_ids(k, bt, v_ids);
    }
    if (st != KDLOSS_OK) return st;
    kd_spans_add(spans, "teacher ids", s_ids);
    kd_spans_add(spans, "teacher logprobs", s_lp);
    return KDLOSS_OK;
}

/* Labels: required with a dense teacher; without them (sparse) every row is kept and nothing
 * may need them. Counted into *n_valid where the host can read them (else BT). */
static kdloss_status fld_labels(const kd_rules *r, const kdloss_fused_linear_distill_params *p,
                               int sparse, kdloss_labels labels,
                               const kdloss_fused_linear_distill_out *o, int64_t bt,
                               int64_t v_ids, int64_t *n_valid) {
    *n_valid = bt;
    if (!labels.data && sparse) {
        if (p->weight_hard_loss <= 0.0 && !o->hard_loss && !o->row_hard) return KDLOSS_OK;
        kd_detail("no labels: weight_hard_loss (%g), hard_loss and row_hard need them",
                  p->weight_hard_loss);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    if (r->host_memory) return kd_check_labels(labels, bt, v_ids, p->ignore_index, n_valid);
    return kd_check_label_view(labels, 1);
}

/* Per-row weights (docs/MATH.md section 12), where the host can read them: each finite and >= 0
 * (kd_check_row_weights), and a row of weight 0 taken out of *n_valid as an ignored row is
 * (labels checked first: their kept rows are counted there). On a device the backend checks
 * and counts them itself. */
static kdloss_status fld_weights(const kd_rules *r, const kdloss_fused_linear_distill_params *p,
                                kdloss_labels labels, int64_t bt, int64_t *n_valid) {
    const float *w = p->row_weights;
    if (!w || !r->host_memory) return KDLOSS_OK;
    kdloss_status st = kd_check_row_weights(w, bt);
    if (st != KDLOSS_OK) return st;
    for (int64_t i = 0; i < bt; i++)
        if (w[i] == 0.0f && (!labels.data || kd_label_at(labels, i) != p->ignore_index))
            (*n_valid)--;
    return KDLOSS_OK;
}

/* The gradient output `name` (rows x hs) of operand `of` (dtype dt) through a GEMM. */
static kdloss_status grad_out(const char *name, const char *of, kdloss_dtype dt, int64_t rows,
                              int64_t hs, kdloss_mat m, int64_t *ld, kd_span *sp) {
    *ld = 0;
    *sp = kd_vec_span(NULL, 0, 1);
    if (!m.data) return KDLOSS_OK;
    if (m.dtype != dt) {
        kd_detail("%s: dtype %s, expected %s like %s", name, kdloss_dtype_name(m.dtype),
                  kdloss_dtype_name(dt), of);
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    return gemm_view(name, rows, hs, m.data, m.dtype, m.ld, ld, sp);
}

/* The outputs (after the inputs in spans): at least one, dxs (BT x Hs) and dws (V x Hs) in
 * their operands' dtypes, dbs only with a bias, every pointer aligned. */
static kdloss_status fld_outputs(const kdloss_fused_linear_distill_out *o, int64_t bt,
                                int64_t hs, int64_t v, kdloss_dtype xdt, kdloss_dtype wdt,
                                int has_bias, kd_fld_checked *c, kd_spanset *spans) {
    const int grad = o->dxs.data || o->dws.data || o->dbs;
    if (!grad && !o->loss && !o->soft_loss && !o->hard_loss && !o->row_soft && !o->row_hard &&
        !o->row_lse && !o->row_entropy) {
        kd_detail("out: every output (losses, row terms, entropy, gradients) is NULL");
        return KDLOSS_ERR_NO_OUTPUT;
    }
    kd_span s_dxs, s_dws;
    kdloss_status st = grad_out("dxs", "student_input", xdt, bt, hs, o->dxs, &c->ld_dxs, &s_dxs);
    if (st == KDLOSS_OK)
        st = grad_out("dws", "student_weight", wdt, v, hs, o->dws, &c->ld_dws, &s_dws);
    if (st != KDLOSS_OK) return st;
    if (o->dbs && !has_bias) {
        kd_detail("dbs asked for, but the student has no bias");
        return KDLOSS_ERR_SHAPE_MISMATCH;
    }
    const size_t es = kdloss_dtype_size(xdt);
    static const char *const name[] = {"dbs",      "loss",     "soft_loss", "hard_loss",
                                       "row_soft", "row_hard", "row_lse",   "row_entropy"};
    const void *ptr[] = {o->dbs,      o->loss,     o->soft_loss, o->hard_loss,
                         o->row_soft, o->row_hard, o->row_lse,   o->row_entropy};
    const int64_t len[] = {v, 1, 1, 1, bt, bt, bt, bt};
    for (int i = 0; i < 8; i++)
        if ((st = kd_check_aligned(name[i], ptr[i], i ? sizeof(float) : es)) != KDLOSS_OK)
            return st;
    kd_spans_add(spans, "dxs", s_dxs);
    kd_spans_add(spans, "dws", s_dws);
    for (int i = 0; i < 8; i++)
        kd_spans_add(spans, name[i], kd_vec_span(ptr[i], len[i], i ? sizeof(float) : es));
    c->want_grad = grad;
    return KDLOSS_OK;
}

/* Steps 1 (sizes) to 4 of either fused loss once its parameters have passed. */
static kdloss_status fld_operands(const kd_rules *r, const kdloss_fused_linear_distill_params *p,
                                 int64_t bt, int64_t hs, int64_t v, int64_t v_ids,
                                 kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                                 const kd_fld_teacher *t, kdloss_labels labels,
                                 const kdloss_fused_linear_distill_out *out, kd_fld_checked *c,
                                 kd_spanset *spans) {
    const int sparse = t->topk != NULL;
    kdloss_status st = kd_fld_check_sizes(bt, hs, sparse ? hs : t->ht, v);
    if (st == KDLOSS_OK) st = pair_dtype("student_input", xs.dtype, "student_weight", ws.dtype);
    kd_span s_xs, s_ws;
    if (st == KDLOSS_OK)
        st = gemm_view("student_input", bt, hs, xs.data, xs.dtype, xs.ld, &c->ld_xs, &s_xs);
    if (st == KDLOSS_OK)
        st = gemm_view("student_weight", v, hs, ws.data, ws.dtype, ws.ld, &c->ld_ws, &s_ws);
    if (st != KDLOSS_OK) return st;
    spans->n = 0;
    kd_spans_add(spans, "student_input", s_xs);
    kd_spans_add(spans, "student_weight", s_ws);
    c->ld_xt = c->ld_wt = c->ld_ids = c->ld_lp = 0;
    st = sparse ? sparse_teacher(r, bt, v_ids, *t->topk, c, spans)
                : dense_teacher(bt, v, t, c, spans);
    const size_t es = kdloss_dtype_size(xs.dtype);
    if (st == KDLOSS_OK) st = kd_check_aligned("student_bias", bs, es);
    if (st == KDLOSS_OK) st = fld_labels(r, p, sparse, labels, out, bt, v_ids, &c->n_valid);
    if (st == KDLOSS_OK)
        st = kd_check_aligned("row_weights", p->row_weights, sizeof(float));
    if (st == KDLOSS_OK) st = fld_weights(r, p, labels, bt, &c->n_valid);
    if (st != KDLOSS_OK) return st;
    kd_spans_add(spans, "student_bias", kd_vec_span(bs, v, es));
    kd_spans_add(spans, "labels", kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype)));
    kd_spans_add(spans, "row_weights", kd_vec_span(p->row_weights, bt, sizeof(float)));
    spans->n_in = spans->n;
    return fld_outputs(out, bt, hs, v, xs.dtype, ws.dtype, bs != NULL, c, spans);
}

kdloss_status kd_check_fld(const kd_rules *r, const kdloss_fused_linear_distill_params *p,
                          int64_t bt, int64_t hs, int64_t v, int64_t v_ids, kdloss_cmat xs,
                          kdloss_cmat ws, const void *bs, const kd_fld_teacher *t,
                          kdloss_labels labels, const kdloss_fused_linear_distill_out *out,
                          kd_fld_checked *c, kd_spanset *spans) {
    kd_detail_clear();
    if (!p || !out) return kd_named(!p ? "params" : "out", KDLOSS_ERR_NULL_POINTER);
    kdloss_status st = kd_check_fld_params(r, p);
    if (st != KDLOSS_OK) return st;
    return fld_operands(r, p, bt, hs, v, v_ids, xs, ws, bs, t, labels, out, c, spans);
}

kdloss_status kd_check_fltk(const kd_rules *r, const kdloss_fused_linear_topk_distill_params *p,
                            int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                            const void *bs, kdloss_topk_teacher teacher, kdloss_labels labels,
                            const kdloss_fused_linear_distill_out *out, kd_fld_checked *c,
                            kd_spanset *spans) {
    kd_detail_clear();
    if (!p || !out) return kd_named(!p ? "params" : "out", KDLOSS_ERR_NULL_POINTER);
    kdloss_status st = kd_topk_check_fused_params(p); /* its tail, then the dense checks */
    if (st != KDLOSS_OK) return st;
    const kdloss_fused_linear_distill_params d = kd_topk_fld_params(p);
    const kd_fld_teacher t = {0, {NULL, KDLOSS_F32, 0}, {NULL, KDLOSS_F32, 0}, NULL, &teacher,
                             (int)p->tail};
    return fld_operands(r, &d, bt, hs, v, v, xs, ws, bs, &t, labels, out, c, spans);
}

/* ---- the workspace ----------------------------------------------------------------------- */

/* The workspace itself: present and aligned where the backend requires it, large enough. */
static kdloss_status ws_self(const kd_rules *r, const void *ws, size_t bytes, size_t need) {
    if (!ws && !r->ws_align) return KDLOSS_OK; /* optional: the backend allocates one */
    if (!ws) {
        kd_detail("workspace: NULL; this call needs %zu bytes (its *_workspace_size)", need);
        return KDLOSS_ERR_NULL_POINTER;
    }
    if (r->ws_align && (uintptr_t)ws % r->ws_align != 0) {
        kd_detail("workspace: address %p is not a multiple of %zu", ws, r->ws_align);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    if (bytes < need) {
        kd_detail("workspace of %zu bytes, this call needs %zu", bytes, need);
        return KDLOSS_ERR_WORKSPACE_TOO_SMALL;
    }
    return KDLOSS_OK;
}

/* The workspace's first `need` bytes against every operand: only those count, a larger buffer
 * may hold the caller's other data. */
static kdloss_status ws_disjoint(const void *ws, size_t need, const kd_spanset *spans) {
    if (!ws) return KDLOSS_OK;
    if ((uint64_t)need > (uint64_t)(UINTPTR_MAX - (uintptr_t)ws)) {
        kd_detail("workspace: %zu bytes from %p pass the end of the address space", need, ws);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    kd_span w = {(const char *)ws, (const char *)ws + need};
    for (int i = 0; i < spans->n; i++)
        if (kd_spans_overlap(w, spans->s[i])) {
            kd_detail("workspace overlaps %s", spans->name[i]);
            return KDLOSS_ERR_ALIASING;
        }
    return KDLOSS_OK;
}

kdloss_status kd_check_workspace(const kd_rules *r, const void *ws, size_t bytes, size_t need,
                                 const kd_spanset *spans) {
    kdloss_status st = ws_self(r, ws, bytes, need);
    return st != KDLOSS_OK ? st : ws_disjoint(ws, need, spans);
}

kdloss_status kd_check_fld_workspace(const kd_rules *r, const void *ws, size_t bytes, size_t need,
                                    const kd_spanset *spans) {
    kdloss_status st = ws_self(r, ws, bytes, need);
    /* the operands' overlaps after the workspace's size, as the CPU always reported them */
    if (st == KDLOSS_OK) st = kd_spans_disjoint(spans, -1);
    return st != KDLOSS_OK ? st : ws_disjoint(ws, need, spans);
}

/* ---- several teachers (kdloss_teacher_heads, docs/MATH.md section 13) ---- */

static kd_span out_mat_span(kdloss_mat m, int64_t rows, int64_t cols) {
    int64_t ld = m.ld ? m.ld : cols;
    return kd_vec_span(m.data, (rows - 1) * ld + cols, kdloss_dtype_size(m.dtype));
}

kdloss_status kd_check_teacher_heads(const kdloss_teacher_heads *h, int64_t bt, int64_t hs,
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
