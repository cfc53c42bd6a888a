/* The argument checks of the losses on rows (kdloss_kl_div, _distill, _distill_logits,
 * _topk_distill_logits) for every backend, in args.h's order, and the span helpers the fused
 * checks (args_fld.c) share. */
#include "args.h"

#include <stdint.h>

/* The per-row weights (input) and entropy (output) of the losses on logits (docs/MATH.md
 * section 12); both NULL for kdloss_distill. */
typedef struct kd_row_extras {
    const float *w;
    const float *ent;
} kd_row_extras;

void kd_spans_add(kd_spanset *s, const char *name, kd_span sp) {
    /* 20 slots: the largest call (fused-linear) has 16 operands */
    if (s->n < (int)(sizeof s->s / sizeof s->s[0])) {
        s->name[s->n] = name;
        s->s[s->n++] = sp;
    }
}

kdloss_status kd_spans_disjoint(const kd_spanset *s, int in_place) {
    for (int o = s->n_in; o < s->n; o++)
        for (int i = 0; i < s->n; i++) {
            /* inputs against each other are fine (they are only read); outputs pairwise once */
            if (i >= s->n_in && i <= o) continue;
            if (o == in_place && i == 0) continue;
            if (kd_spans_overlap(s->s[o], s->s[i])) {
                kd_detail("%s overlaps %s", s->name[o], s->name[i]);
                return KDLOSS_ERR_ALIASING;
            }
        }
    return KDLOSS_OK;
}

kdloss_status kd_check_aligned(const char *name, const void *p, size_t align) {
    if (kd_aligned(p, align)) return KDLOSS_OK;
    kd_detail("%s: address %p is not a multiple of %zu", name, p, align);
    return KDLOSS_ERR_MISALIGNED;
}

/* BT and V positive. */
static kdloss_status rows_sizes(int64_t bt, int64_t v) {
    if (bt > 0 && v > 0) return KDLOSS_OK;
    kd_detail("bt %lld, v %lld: sizes must be positive", (long long)bt, (long long)v);
    return KDLOSS_ERR_INVALID_SIZE;
}

/* The NULL params and sizes the losses on dense rows check first (the detail cleared: their
 * first check). */
static kdloss_status rows_head(const void *p, int64_t bt, int64_t v) {
    kd_detail_clear();
    return p ? rows_sizes(bt, v) : kd_named("params", KDLOSS_ERR_NULL_POINTER);
}

/* A (BT x V) operand `name`: kd_check_fmat, its detail naming it. */
static kdloss_status rows_view(const char *name, int64_t bt, int64_t v, const void *data,
                               kdloss_dtype dt, int64_t ld, int64_t *ld_out, kd_span *sp) {
    return kd_named(name, kd_check_fmat(bt, v, data, dt, ld, ld_out, sp));
}

/* The optional gradient of operand `of` (dtype odt): of its dtype, (BT x V). */
static kdloss_status grad_view(const char *of, kdloss_dtype odt, int64_t bt, int64_t v,
                               kdloss_mat g, int64_t *ld, kd_span *sp) {
    *ld = 0;
    *sp = kd_vec_span(NULL, 0, 1);
    if (!g.data) return KDLOSS_OK;
    if (g.dtype != odt) {
        kd_detail("grad: dtype %s, expected %s like the %s", kdloss_dtype_name(g.dtype),
                  kdloss_dtype_name(odt), of);
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    return rows_view("grad", bt, v, g.data, g.dtype, g.ld, ld, sp);
}

/* The scalar and per-row loss outputs' alignment. */
static kdloss_status loss_align(const float *loss, const float *row_loss) {
    kdloss_status st = kd_check_aligned("loss", loss, sizeof(float));
    return st != KDLOSS_OK ? st : kd_check_aligned("row_loss", row_loss, sizeof(float));
}

kdloss_status kd_check_kl(const kd_rules *r, const kdloss_kl_params *p, int64_t bt, int64_t v,
                          kdloss_cmat input, kdloss_cmat target, const float *loss,
                          const float *row_loss, kdloss_mat elem_loss, kdloss_mat grad,
                          kd_kl_geom *g, kd_spanset *spans) {
    kdloss_status st = kd_kl_check_args(p, bt, v, loss != NULL, elem_loss.data != NULL);
    kd_span s_in, s_t, s_g, s_el = kd_vec_span(NULL, 0, 1);
    if (st == KDLOSS_OK)
        st = rows_view("input", bt, v, input.data, input.dtype, input.ld, &g->ld_in, &s_in);
    if (st == KDLOSS_OK)
        st = rows_view("target", bt, v, target.data, target.dtype, target.ld, &g->ld_t, &s_t);
    if (st == KDLOSS_OK) st = grad_view("input", input.dtype, bt, v, grad, &g->ld_g, &s_g);
    if (st != KDLOSS_OK) return st;
    g->ld_el = 0;
    if (elem_loss.data && elem_loss.dtype != KDLOSS_F32) {
        kd_detail("elem_loss: dtype %s, expected fp32", kdloss_dtype_name(elem_loss.dtype));
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    if (elem_loss.data &&
        (st = rows_view("elem_loss", bt, v, elem_loss.data, elem_loss.dtype, elem_loss.ld,
                        &g->ld_el, &s_el)) != KDLOSS_OK)
        return st;
    if (!loss && !row_loss && !elem_loss.data && !grad.data) {
        kd_detail("loss, row_loss, elem_loss and grad are all NULL");
        return KDLOSS_ERR_NO_OUTPUT;
    }
    if ((st = loss_align(loss, row_loss)) != KDLOSS_OK) return st;
    spans->n = 0;
    kd_spans_add(spans, "input", s_in);
    kd_spans_add(spans, "target", s_t);
    spans->n_in = spans->n;
    kd_spans_add(spans, "grad", s_g); /* may be the input itself, same ld */
    kd_spans_add(spans, "row_loss", kd_vec_span(row_loss, bt, sizeof(float)));
    kd_spans_add(spans, "loss", kd_vec_span(loss, 1, sizeof(float)));
    kd_spans_add(spans, "elem_loss", s_el);
    const int in_place = grad.data && grad.data == input.data && g->ld_g == g->ld_in;
    return kd_spans_disjoint(spans, in_place ? spans->n_in : -1);
}

/* Per-row weights (docs/MATH.md section 12), aligned; where the host can read them, each finite
 * and >= 0 (kd_check_row_weights) and a row of weight 0 taken out of *n_valid as an ignored row
 * is (labels checked first: their kept rows are counted there). On a device the backend checks
 * and counts them itself. */
static kdloss_status row_weights(const kd_rules *r, const float *w, int64_t bt,
                                 kdloss_labels labels, int64_t ignore_index, int64_t *n_valid) {
    kdloss_status st = kd_check_aligned("row_weights", w, sizeof(float));
    if (st != KDLOSS_OK || !w || !r->host_memory) return st;
    if ((st = kd_check_row_weights(w, bt)) != KDLOSS_OK) return st;
    for (int64_t i = 0; i < bt; i++)
        if (w[i] == 0.0f && (!labels.data || kd_label_at(labels, i) != ignore_index))
            (*n_valid)--;
    return KDLOSS_OK;
}

/* The rest of a loss on rows once its teacher's views (spans of ins[1, n_in)) and the
 * student's (ins[0], effective ld ld_s) have passed: the gradient, labels (aligned when
 * `align`; counted when host memory), the row weights (row_weights), at least one output (the
 * entropy counts), their alignment, the overlaps (the weights an input, the entropy an output). */
static kdloss_status rows_rest(const kd_rules *r, int align, int64_t bt, int64_t v,
                               kdloss_cmat student, int64_t ld_s, const kd_spanset *ins,
                               kdloss_labels labels, int64_t ignore_index, const kd_row_extras *x,
                               const float *loss, const float *row_loss, kdloss_mat grad,
                               int64_t *ld_g, int64_t *n_valid, kd_spanset *spans) {
    kd_span s_g;
    kdloss_status st = grad_view("student", student.dtype, bt, v, grad, ld_g, &s_g);
    *n_valid = bt;
    if (st == KDLOSS_OK && labels.data)
        st = r->host_memory ? kd_check_labels(labels, bt, v, ignore_index, n_valid)
                            : kd_check_label_view(labels, align);
    if (st == KDLOSS_OK) st = row_weights(r, x->w, bt, labels, ignore_index, n_valid);
    if (st != KDLOSS_OK) return st;
    if (!loss && !row_loss && !grad.data && !x->ent) {
        kd_detail("loss, row_loss, grad and row_entropy are all NULL");
        return KDLOSS_ERR_NO_OUTPUT;
    }
    if (align && (st = loss_align(loss, row_loss)) != KDLOSS_OK) return st;
    if (align && (st = kd_check_aligned("row_entropy", x->ent, sizeof(float))) != KDLOSS_OK)
        return st;
    *spans = *ins;
    kd_spans_add(spans, "labels", kd_vec_span(labels.data, bt, kdloss_dtype_size(labels.dtype)));
    kd_spans_add(spans, "row_weights", kd_vec_span(x->w, bt, sizeof(float)));
    spans->n_in = spans->n;
    kd_spans_add(spans, "grad", s_g); /* may be the student itself, same ld */
    kd_spans_add(spans, "row_loss", kd_vec_span(row_loss, bt, sizeof(float)));
    kd_spans_add(spans, "loss", kd_vec_span(loss, 1, sizeof(float)));
    kd_spans_add(spans, "row_entropy", kd_vec_span(x->ent, bt, sizeof(float)));
    const int in_place = grad.data && grad.data == student.data && *ld_g == ld_s;
    return kd_spans_disjoint(spans, in_place ? spans->n_in : -1);
}

/* kdloss_distill and kdloss_distill_logits once their parameters have passed: student,
 * teacher, then rows_rest. */
static kdloss_status dense_rows(const kd_rules *r, int align, int64_t bt, int64_t v,
                                kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                                int64_t ignore_index, const kd_row_extras *x,
                                const float *loss, const float *row_loss,
                                kdloss_mat grad, kd_distill_geom *g, int64_t *n_valid,
                                kd_spanset *spans) {
    kd_spanset ins = {.n = 0};
    kd_span s_s, s_t;
    kdloss_status st =
        rows_view("student", bt, v, student.data, student.dtype, student.ld, &g->ld_s, &s_s);
    if (st == KDLOSS_OK)
        st = rows_view("teacher", bt, v, teacher.data, teacher.dtype, teacher.ld, &g->ld_t, &s_t);
    if (st != KDLOSS_OK) return st;
    kd_spans_add(&ins, "student", s_s);
    kd_spans_add(&ins, "teacher", s_t);
    return rows_rest(r, align, bt, v, student, g->ld_s, &ins, labels, ignore_index, x, loss,
                     row_loss, grad, &g->ld_g, n_valid, spans);
}

kdloss_status kd_check_distill(const kd_rules *r, const kdloss_distill_params *p, int64_t bt,
                               int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                               kdloss_labels labels, const float *loss, const float *row_loss,
                               kdloss_mat grad, kd_distill_geom *g, int64_t *n_valid,
                               kd_spanset *spans) {
    kdloss_status st = rows_head(p, bt, v);
    if (st == KDLOSS_OK) st = kd_distill_check_params(p);
    if (st != KDLOSS_OK) return st;
    const kd_row_extras none = {NULL, NULL}; /* kdloss_distill has neither */
    return dense_rows(r, 1, bt, v, student, teacher, labels, p->ignore_index, &none, loss,
                      row_loss, grad, g, n_valid, spans);
}

kdloss_status kd_check_distill_logits(const kd_rules *r, const kdloss_distill_logits_params *p,
                                      int64_t bt, int64_t v, kdloss_cmat student,
                                      kdloss_cmat teacher, kdloss_labels labels,
                                      const float *loss, const float *row_loss, kdloss_mat grad,
                                      kd_distill_geom *g, int64_t *n_valid, kd_spanset *spans) {
    kdloss_status st = rows_head(p, bt, v);
    if (st == KDLOSS_OK) st = kd_distill_logits_check_params(p);
    if (st != KDLOSS_OK) return st;
    const kd_row_extras x = {p->row_weights, p->row_entropy};
    return dense_rows(r, 1, bt, v, student, teacher, labels, p->ignore_index, &x, loss, row_loss,
                      grad, g, n_valid, spans);
}

kdloss_status kd_check_topk_logits(const kd_rules *r, const kdloss_topk_distill_params *p,
                                   int64_t bt, int64_t v, kdloss_cmat student,
                                   kdloss_topk_teacher teacher, kdloss_labels labels,
                                   const float *loss, const float *row_loss, kdloss_mat grad,
                                   kd_topk_geom *g, int64_t *n_valid, kd_spanset *spans) {
    kdloss_status st = kd_topk_check_logits_params(p); /* clears the detail */
    if (st == KDLOSS_OK) st = rows_sizes(bt, v);
    kd_spanset ins = {.n = 0};
    kd_span s_s, s_ids, s_lp;
    if (st == KDLOSS_OK)
        st = kd_topk_check_teacher(teacher, bt, &s_ids, &s_lp, &g->ld_ids, &g->ld_lp);
    if (st == KDLOSS_OK)
        st = rows_view("student", bt, v, student.data, student.dtype, student.ld, &g->ld_s, &s_s);
    if (st != KDLOSS_OK) return st;
    kd_spans_add(&ins, "student", s_s);
    kd_spans_add(&ins, "teacher ids", s_ids);
    kd_spans_add(&ins, "teacher logprobs", s_lp);
    g->want_grad = grad.data != NULL;
    const kd_row_extras x = {p->row_weights, p->row_entropy};
    st = rows_rest(r, 1, bt, v, student, g->ld_s, &ins, labels, p->ignore_index, &x, loss,
                   row_loss, grad, &g->ld_g, n_valid, spans);
    /* the ids' values last: the order the CPU always had (their check allocates for large V) */
    if (st == KDLOSS_OK && r->host_memory) {
        teacher.ids.ld = g->ld_ids;
        st = kd_topk_check_ids(teacher, bt, v);
    }
    return st;
}
