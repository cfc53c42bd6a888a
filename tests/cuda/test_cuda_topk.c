/* The sparse top-k teacher: kdloss_cuda_topk_distill_logits (tag "topk") over the case grid of
 * tests/support/cases.h (tests/test_topk.c's, on the CPU) with the bucket, renorm_both and, for
 * forward KL, renorm_teacher tails, and kdloss_cuda_fused_linear_topk_distill (tag "fltopk"),
 * against a float64 reference (ref_topk_row, tests/support/ref_topk.h, written from
 * docs/MATH.md 8, not from topk_row.h) and the CPU functions: rows of top-k, random, shuffled
 * and all-unused slots (NaN log-probs in unused slots, never read), -inf log-probs where the
 * divergence allows, S = V, invalid ids, labels of every kind, padding, misaligned, in place,
 * the fused loss's dense and sparse paths, chunking, bias, forward only, dxs only, bits.
 * Per-row weights and the entropy on the logits loss (docs/MATH.md section 12): weights with
 * zeros and non-integers among ignored labels, every tail, the entropy over all V columns (a
 * double reference: -sum Q log Q of log_softmax(z / T)), bad weights with and without bad
 * labels or ids (the status word's order: labels, weights, ids), weights of 1 the bits of NULL
 * and weights in {0, 1} the bits of those rows masked through ignore_index. */
#include <float.h>

#include "cuda_test.h"

/* The slots of one row: the teacher's full distribution log_softmax(zt / T) in double, then by
 * kind (row index based): 0 the top k in order; 1 k random distinct ids, slots 1 and k-2
 * unused; 2 every slot unused; 3 the top k shuffled, the last slot's log-prob -inf (where the
 * divergence allows it and another slot is used); 4 every id of the row when k >= v (S = V, no
 * tail), else as 0. lp rounded to lpdt; unused slots hold NaN (never read). */
static void tk_gen_slots(kt_rng *rng, int64_t v, int64_t k, double T, int kind, int allow_ninf,
                         kdloss_dtype lpdt, int64_t *ids, double *lp) {
    double *zt = xmalloc((size_t)v * 8);
    char *used = calloc((size_t)v, 1);
    for (int64_t c = 0; c < v; c++) zt[c] = 2.5 * kt_normal(rng) + (c == 1 % v ? 8.0 : 0.0);
    const double lz = logsumexp(zt, v, 1.0 / T);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        if (kind == 1) {
            do best = kt_randint(rng, v); while (used[best] && j < v);
        } else {
            for (int64_t c = 0; c < v; c++)
                if (!used[c] && (best < 0 || zt[c] > zt[best])) best = c;
        }
        if (best < 0 || used[best] || kind == 2 || (kind == 1 && (j == 1 || j == k - 2))) {
            ids[j] = -1, lp[j] = NAN;
            continue;
        }
        used[best] = 1;
        ids[j] = best;
        lp[j] = zt[best] / T - lz;
    }
    if (kind == 3)
        for (int64_t j = k - 1; j > 0; j--) { /* shuffle */
            const int64_t i = kt_randint(rng, j + 1);
            const int64_t ti = ids[i];
            const double tl = lp[i];
            ids[i] = ids[j], lp[i] = lp[j], ids[j] = ti, lp[j] = tl;
        }
    int n_used = 0; /* a renormalized teacher needs a finite log-prob (ref_topk.h) */
    for (int64_t j = 0; j < k; j++) n_used += ids[j] >= 0;
    if (kind == 3 && allow_ninf && ids[k - 1] >= 0 && n_used > 1) lp[k - 1] = -INFINITY;
    kt_round_to(lp, k, lpdt);
    free(zt);
    free(used);
}

/* Invalid ids in row bt / 2 (kinds: 1 an id = v, 2 a repeated id, 3 the id -2). */
static void tk_break_ids(int64_t *ids, double *lp, int64_t bt, int64_t v, int64_t k, int kind) {
    int64_t *row = ids + (bt / 2) * k;
    if (kind == 1) row[0] = v;
    if (kind == 2 && k >= 2) {
        row[0] = row[1] = 3 % v;
        lp[(bt / 2) * k] = lp[(bt / 2) * k + 1] = -2.0;
    }
    if (kind == 3) row[k - 1] = -2;
}

/* The row kinds the GPU reports (kdloss.h): 0 counted, 1 ignored, 2 bad label, 3 bad ids. */
static int tk_row_kind(const int64_t *ids, int64_t k, int64_t v, int has_labels, int64_t y) {
    for (int64_t j = 0; j < k; j++) {
        if (ids[j] == -1) continue;
        if (ids[j] < 0 || ids[j] >= v) return 3;
        for (int64_t i = 0; i < j; i++)
            if (ids[i] == ids[j]) return 3;
    }
    if (!has_labels) return 0;
    return y == -100 ? 1 : (y >= 0 && y < v) ? 0 : 2;
}

/* The teacher of a case: slots per row (tk_gen_slots's kinds by row), broken ids, its host and
 * device copies (ids of idt, log-probs of lpdt, both with row stride ld), and the row kinds
 * against the labels. */
typedef struct tk_teacher {
    int64_t *ids;
    double *lp;
    ct_mat mid, mlp;
    int *kind;
    int64_t nv; /* counted rows */
} tk_teacher;

static void tk_teacher_make(kt_rng *rng, tk_teacher *t, int64_t bt, int64_t v, int64_t k,
                            int64_t ld, double T, const kdloss_div_params *d, kdloss_dtype idt,
                            kdloss_dtype lpdt, int bad_id, const ct_labels *L) {
    t->ids = xmalloc((size_t)(bt * k) * 8), t->lp = xmalloc((size_t)(bt * k) * 8);
    for (int64_t r = 0; r < bt; r++)
        tk_gen_slots(rng, v, k, T, (int)(r % 5), !kt_div_rev_like(d), lpdt, t->ids + r * k,
                     t->lp + r * k);
    tk_break_ids(t->ids, t->lp, bt, v, k, bad_id);
    const size_t ie = kdloss_dtype_size(idt);
    char *h = xmalloc((size_t)(bt * ld) * ie);
    memset(h, 0x5A, (size_t)(bt * ld) * ie);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t j = 0; j < k; j++) {
            if (idt == KDLOSS_I64) ((int64_t *)h)[r * ld + j] = t->ids[r * k + j];
            else ((int32_t *)h)[r * ld + j] = (int32_t)t->ids[r * k + j];
        }
    t->mid = ct_out(bt, ld, idt, 0);
    t->mid.h = h;
    h2d(t->mid.d, h, t->mid.bytes);
    t->mlp = ct_in(t->lp, bt, k, ld, lpdt, 0);
    t->kind = xmalloc((size_t)bt * sizeof(int));
    t->nv = 0;
    for (int64_t r = 0; r < bt; r++) {
        t->kind[r] = tk_row_kind(t->ids + r * k, k, v, L->mode != KT_LAB_NONE, L->lab[r]);
        t->nv += t->kind[r] == 0;
    }
}

static void tk_teacher_free(tk_teacher *t) {
    ct_free(&t->mid), ct_free(&t->mlp);
    free(t->ids), free(t->lp), free(t->kind);
}

/* The status word a case expects: the code of the CPU function, which checks the labels first
 * in the logits loss and the ids first in the fused loss (ids_first). */
static int32_t tk_want_status(const tk_teacher *t, const ct_labels *L, int64_t bt, int64_t v,
                              int ids_first, const float *w) {
    int bad_id = 0, bad_label = 0, bad_w = 0;
    for (int64_t r = 0; r < bt; r++) {
        bad_id |= t->kind[r] == 3;
        bad_label |=
            L->mode != KT_LAB_NONE && L->lab[r] != -100 && (L->lab[r] < 0 || L->lab[r] >= v);
        bad_w |= w && !(w[r] >= 0.0f && w[r] <= FLT_MAX);
    }
    if (bad_id && (ids_first || (!bad_label && !bad_w))) return KDLOSS_ERR_INVALID_ID;
    if (bad_label) return KDLOSS_ERR_LABEL_OUT_OF_RANGE;
    return bad_w ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_OK;
}

static const char *tk_tail_name(int tail) {
    static const char *n[] = {"bucket", "renorm_both", "renorm_teacher"};
    return n[tail];
}

/* ---- the loss on logits ---- */

typedef struct tk_case {
    int64_t bt, v, k;
    kdloss_dtype ds, lpdt, idt; /* student (and gradient), teacher log-probs, ids */
    int div;                    /* index into KT_DIV_CASES */
    int tail;
    double T;
    int labels;                 /* ct_labels_make's mode, dtype, bad */
    kdloss_dtype ldt;
    int bad;
    int bad_id;                 /* tk_break_ids's kinds, 0 none */
    int64_t pad;                /* extra columns on every ld (student, gradient, teacher) */
    int misalign, in_place;
    int wmode; /* row weights: 0 none, 1 zeros and non-integers, 2 that and bad ones, 3 all 1
                  (checked against NULL, bitwise), 4 in {0, 1} (against masked labels) */
    int ent;   /* ask for the entropy */
} tk_case;

typedef struct tk_run {
    const tk_case *c;
    kdloss_topk_distill_params p;
    ct_mat s;
    ct_labels L;
    tk_teacher te;
    ct_rows o;
    float *hw, *dw; /* row weights, host and device (NULL: none) */
    float *dent;    /* the entropy's device output (NULL: not asked) */
} tk_run;

/* Row r's weight under wmode (tk_case): 1 every fifth row from row 2 zero, the others in
 * [0.25, 2.75); 2 that with a NaN on row 1 and -1 on the second-to-last; 3 one; 4 every third
 * row zero, the others one. */
static float tk_weight(kt_rng *rng, int mode, int64_t r, int64_t bt) {
    if (mode == 3) return 1.0f;
    if (mode == 4) return r % 3 == 0 ? 0.0f : 1.0f;
    if (mode == 2 && r == 1) return NAN;
    if (mode == 2 && r == bt - 2) return -1.0f;
    return r % 5 == 2 ? 0.0f : (float)(0.25 + 2.5 * kt_uniform(rng));
}

/* The weights of a run: its row kinds (te.kind, te.nv) with them: a bad weight makes a row bad
 * (kind 4) unless its label or ids are (kinds 2, 3), a weight 0 ignores it. */
static void tk_weights_make(kt_rng *rng, tk_run *r) {
    const tk_case *c = r->c;
    if (c->ent) {
        r->dent = dalloc((size_t)c->bt * 4);
        dpoison(r->dent, (size_t)c->bt * 4);
    }
    if (!c->wmode) return;
    r->hw = xmalloc((size_t)c->bt * 4);
    r->te.nv = 0;
    for (int64_t k = 0; k < c->bt; k++) {
        const float w = r->hw[k] = tk_weight(rng, c->wmode, k, c->bt);
        int *kind = &r->te.kind[k];
        if (*kind < 2 && !(w >= 0.0f && w <= FLT_MAX)) *kind = 4;
        if (*kind == 0 && w == 0.0f) *kind = 1;
        r->te.nv += *kind == 0;
    }
    r->dw = dupload(r->hw, (size_t)c->bt * 4);
}

static void tk_weights_free(tk_run *r) {
    if (r->dw) CK(cudaFree(r->dw));
    if (r->dent) CK(cudaFree(r->dent));
    free(r->hw);
}

static kdloss_status tk_call(void *arg) {
    const tk_run *r = arg;
    const tk_case *c = r->c;
    const int64_t ld = c->v + c->pad, ldt = c->k + c->pad;
    const kdloss_topk_teacher t = {c->k, {r->te.mid.d, c->idt, ldt}, {r->te.mlp.d, c->lpdt, ldt}};
    kdloss_topk_distill_params p = r->p;
    p.row_weights = r->dw, p.row_entropy = r->dent;
    return kdloss_cuda_topk_distill_logits(g_ctx, g_st, &p, c->bt, c->v,
                                           (kdloss_cmat){r->s.d, c->ds, ld}, t, r->L.dev,
                                           r->o.loss, r->o.row, (kdloss_mat){r->o.g.d, c->ds, ld},
                                           r->o.ws, r->o.wsb);
}

/* The entropy of row z (v logits) at T: -sum Q log Q of log_softmax(z / T), in double. */
static double tk_ref_ent(const double *z, int64_t v, double T) {
    const double l = logsumexp(z, v, 1.0 / T);
    double h = 0.0;
    for (int64_t j = 0; j < v; j++) h -= exp(z[j] / T - l) * (z[j] / T - l);
    return h;
}

/* The reference: grad (bt x v), row [bt] and ent [bt] (NaN on bad rows, 0 on ignored ones), the
 * loss; *abs_tot the summed error scales of the row losses. A kept row's gradient and loss term
 * are its weight times the unweighted ones (docs/MATH.md section 12). */
static double tk_ref_logits(const tk_run *r, const double *z, double *grad, double *row,
                            double *ent, double *abs_tot) {
    const tk_case *c = r->c;
    const int64_t bt = c->bt, v = c->v, k = c->k;
    int bad = 0;
    for (int64_t i = 0; i < bt; i++) bad |= r->te.kind[i] >= 2;
    const double nvd = r->te.nv > 0 ? (double)r->te.nv : 1.0, scale = 1.25 / nvd; /* 1/T in dz */
    double tot = 0.0;
    *abs_tot = 0.0;
    for (int64_t i = 0; i < bt; i++) {
        double *gr = grad + i * v;
        for (int64_t j = 0; j < v; j++) gr[j] = 0.0;
        row[i] = ent[i] = r->te.kind[i] == 1 ? 0.0 : NAN;
        if (r->te.kind[i] != 0) continue;
        const ref_topk_row_out o =
            ref_topk_row(&KT_DIV_CASES[c->div], (kdloss_topk_tail)c->tail, z + i * v, v,
                         r->te.ids + i * k, r->te.lp + i * k, k, c->T, gr, NULL, NULL);
        const double w = r->hw ? (double)r->hw[i] : 1.0;
        row[i] = o.loss;
        ent[i] = tk_ref_ent(z + i * v, v, c->T);
        for (int64_t j = 0; j < v; j++) gr[j] *= scale * w;
        tot += w * row[i];
        *abs_tot += w * o.mag;
    }
    return bad ? NAN : tot / nvd;
}

/* The entropy's output against want [bt] (rtol 1e-5, and 64 u (1 + log V) absolute: the fp32
 * groups' rounding over V terms of size up to 1 / e). */
static void tk_cmp_ent(const char *tag, const char *what, const tk_run *r, const double *want) {
    float *h = dfetch(r->dent, (size_t)r->c->bt * 4);
    double *hd = to_double(h, KDLOSS_F32, 1, r->c->bt, r->c->bt);
    char w[300];
    snprintf(w, sizeof w, "%s row_entropy %s", tag, what);
    cmp_arr(w, hd, want, r->c->bt, 64 * U32 * (1.0 + log((double)r->c->v)), 1e-5);
    free(h), free(hd);
}

/* The exact cases of docs/MATH.md section 12 after a checked call: weights of 1 (wmode 3) give
 * the bits of NULL weights; weights in {0, 1} (wmode 4) those of the same rows masked through
 * ignore_index (labels given) or, without labels, ignore_index labels on them and 0 elsewhere. */
static void tk_exact(const char *tag, tk_run *r) {
    const tk_case *c = r->c;
    if (c->wmode != 3 && c->wmode != 4) return;
    const int64_t bt = c->bt;
    void *g1 = dfetch(r->o.g.d, r->o.g.bytes);
    float *row1 = dfetch(r->o.row, (size_t)bt * 4), *ent1 = dfetch(r->dent, (size_t)bt * 4), l1;
    d2h(&l1, r->o.loss, 4);
    float *dw = r->dw;
    const kdloss_labels keep = r->L.dev;
    void *masked = NULL;
    if (c->wmode == 4) {
        const kdloss_dtype lt = c->labels != KT_LAB_NONE ? c->ldt : KDLOSS_I64;
        const size_t ls = kdloss_dtype_size(lt);
        char *h = xmalloc((size_t)bt * ls);
        for (int64_t k = 0; k < bt; k++) {
            const int64_t y = r->hw[k] == 0.0f ? -100 : c->labels != KT_LAB_NONE ? r->L.lab[k] : 0;
            if (lt == KDLOSS_I64) ((int64_t *)h)[k] = y;
            else ((int32_t *)h)[k] = (int32_t)y;
        }
        masked = dupload(h, (size_t)bt * ls);
        free(h);
        r->L.dev = (kdloss_labels){masked, lt};
    }
    r->dw = NULL;
    KT_CHECK(tk_call(r) == KDLOSS_OK, "%s: the exact case's call", tag);
    CK(cudaStreamSynchronize(g_st));
    r->dw = dw, r->L.dev = keep;
    void *g2 = dfetch(r->o.g.d, r->o.g.bytes);
    float *row2 = dfetch(r->o.row, (size_t)bt * 4), *ent2 = dfetch(r->dent, (size_t)bt * 4), l2;
    d2h(&l2, r->o.loss, 4);
    char what[300];
    snprintf(what, sizeof what, "%s %s: grad", tag, c->wmode == 3 ? "= NULL" : "= masked");
    cmp_bits(what, g1, g2, r->o.g.bytes);
    KT_CHECK(!memcmp(row1, row2, (size_t)bt * 4) && !memcmp(ent1, ent2, (size_t)bt * 4) &&
                 !memcmp(&l1, &l2, 4),
             "%s %s: loss, row losses or entropy differ", tag, c->wmode == 3 ? "= NULL" : "= masked");
    if (masked) CK(cudaFree(masked));
    free(g1), free(g2), free(row1), free(row2), free(ent1), free(ent2);
}

/* kdloss_topk_distill_logits on the host copies (valid inputs). */
static void tk_vs_cpu(const char *tag, const tk_run *r, const double *gg, float hl,
                      double loss_atol) {
    const tk_case *c = r->c;
    const int64_t ld = c->v + c->pad, ldt = c->k + c->pad;
    void *cg = xmalloc(r->o.g.bytes);
    float cl = 0, *crow = xmalloc((size_t)c->bt * 4), *cent = xmalloc((size_t)c->bt * 4);
    const kdloss_topk_teacher ht = {c->k, {r->te.mid.h, c->idt, ldt}, {r->te.mlp.h, c->lpdt, ldt}};
    kdloss_topk_distill_params p = r->p;
    p.row_weights = r->hw, p.row_entropy = r->dent ? cent : NULL;
    kdloss_status s =
        kdloss_topk_distill_logits(&p, c->bt, c->v, (kdloss_cmat){r->s.h, c->ds, ld}, ht,
                                   r->L.host, &cl, crow, (kdloss_mat){cg, c->ds, ld});
    /* + two subnormal steps of the dtype: fp16 gradients near 1e-6 are subnormal there, and two
     * fp32 values a rounding apart may round to neighbouring steps */
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s))
        ct_vs_cpu(tag, &r->o, gg, cg, NULL, 0, 1e-5, kt_tiny(c->ds), hl, cl, loss_atol);
    if (s == KDLOSS_OK && r->dent) {
        double *cd = to_double(cent, KDLOSS_F32, 1, c->bt, c->bt);
        tk_cmp_ent(tag, "vs CPU", r, cd);
        free(cd);
    }
    free(cg), free(crow), free(cent);
}

static void tk_check(const char *tag, tk_run *r, const double *z) {
    const tk_case *c = r->c;
    const int64_t n = c->bt * c->v;
    double *rg = xmalloc((size_t)n * 8), *rrow = xmalloc((size_t)c->bt * 8), abs_tot;
    double *rent = xmalloc((size_t)c->bt * 8);
    const double want = tk_ref_logits(r, z, rg, rrow, rent, &abs_tot);
    const double nvd = r->te.nv > 0 ? (double)r->te.nv : 1.0, wmax = r->hw ? 2.75 : 1.0;
    const double lw = kt_div_log_weights(&KT_DIV_CASES[c->div]);
    const double mix_atol = 64 * U32 * (1 + lw) * 1.25 * wmax / (c->T * nvd);
    const int32_t status = tk_want_status(&r->te, &r->L, c->bt, c->v, 0, r->hw);
    const ct_want w = {status, rg, NULL, 1e-5 * max_abs(rg, n) + mix_atol + kt_tiny(c->ds),
                       2 * kt_eps(c->ds) + 1e-5, rrow, 1e-5 * abs_tot / (double)c->bt + 1e-30,
                       want, 1e-5 * abs_tot / nvd + 1e-30};
    float hl;
    double *gg = ct_check_rows(tag, &r->o, &w, tk_call, r, &hl);
    if (!c->in_place) { /* the student's logits are an input: never written (nor masked) */
        void *hx = dfetch(r->s.d, r->s.bytes);
        KT_CHECK(!memcmp(r->s.h, hx, r->s.bytes), "%s: student logits written", tag);
        free(hx);
    }
    if (r->dent) tk_cmp_ent(tag, "vs reference", r, rent);
    if (kdloss_topk_distill_logits && status == KDLOSS_OK && !c->misalign && !c->in_place)
        tk_vs_cpu(tag, r, gg, hl, w.loss_atol);
    if (!c->in_place) tk_exact(tag, r);
    free(gg), free(rg), free(rrow), free(rent);
}

static void test_tk_logits_case(kt_rng *rng, const tk_case *c) {
    const kdloss_div_params d = KT_DIV_CASES[c->div];
    char tag[240];
    snprintf(tag, sizeof tag,
             "topk %s %s beta=%g alpha=%g bt=%lld v=%lld k=%lld s=%s lp=%s ids=%s T=%g "
             "labels=%d/%s%s bad_id=%d pad=%lld mis=%d ip=%d w=%d ent=%d",
             tk_tail_name(c->tail), kdloss_divergence_name(d.divergence), d.beta, d.alpha,
             (long long)c->bt, (long long)c->v, (long long)c->k, kt_dtype_name(c->ds),
             kt_dtype_name(c->lpdt), kt_dtype_name(c->idt), c->T, c->labels,
             kt_dtype_name(c->ldt), c->bad ? " bad" : "", c->bad_id, (long long)c->pad,
             c->misalign, c->in_place, c->wmode, c->ent);
    const int64_t ld = c->v + c->pad;
    double *z = gen_logits(rng, c->bt, c->v, c->ds);
    tk_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.L = ct_labels_make(rng, c->labels, c->ldt, c->bad, c->bt, c->v);
    tk_teacher_make(rng, &r.te, c->bt, c->v, c->k, c->k + c->pad, c->T, &d, c->idt, c->lpdt,
                    c->bad_id, &r.L);
    r.s = ct_in(z, c->bt, c->v, ld, c->ds, c->misalign);
    tk_weights_make(rng, &r);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(c->bt, c->v, c->k, &wsb) == KDLOSS_OK,
             "%s: ws size", tag);
    ct_rows_alloc(&r.o, c->bt, c->v, ld, c->ds, c->misalign, c->in_place ? &r.s : NULL, 1, wsb);
    r.p.div = d, r.p.tail = (kdloss_topk_tail)c->tail, r.p.temperature = c->T;
    r.p.ignore_index = -100, r.p.grad_scale = 1.25;
    kdloss_status s = tk_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) tk_check(tag, &r, z);
    ct_rows_free(&r.o);
    ct_free(&r.s);
    tk_teacher_free(&r.te);
    ct_labels_free(&r.L);
    tk_weights_free(&r);
    free(z);
}

/* A grid case: bucket / renorm_both (and renorm_teacher for forward KL) by the case, the teacher's
 * log-probs in the grid's teacher dtype, ids in the other integer dtype than the labels', K 8
 * (16 from one CUDA tile up), padded ones with 16-byte rows. */
static tk_case tk_from_grid(const kt_case *g) {
    const int fwd = g->d.divergence == KDLOSS_DIV_FORWARD_KL;
    const tk_case c = {g->bt, g->v, g->v >= 4096 ? 16 : 8, g->ds, g->dt,
                       g->ldt == KDLOSS_I64 ? KDLOSS_I32 : KDLOSS_I64, g->div,
                       (g->shape + g->n % 3) % (fwd ? 3 : 2), g->t, g->labels, g->ldt, 0, 0,
                       g->pad ? 8 : 0, 0, 0, 0, 0};
    return c;
}

/* Per-row weights and the entropy (docs/MATH.md section 12), per divergence and tail: weights
 * with zeros and non-integers among ignored labels and the entropy; a multi-tile row in place;
 * without labels; bad weights (with a bad label, or bad ids); weights of 1 against NULL and
 * {0, 1} against masked labels, with and without labels. */
static void tk_weight_cases(kt_rng *rng) {
    for (int div = 0; div < KT_NDIV_CASES; div++) {
        const int fwd = KT_DIV_CASES[div].divergence == KDLOSS_DIV_FORWARD_KL;
        const int tail = div % (fwd ? 3 : 2);
        const double T = KT_TEMPS[div % 3];
        const kdloss_dtype ds = KT_DTYPES[div % 3];
        const tk_case wc[] = {
            {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 1, 1},
            {7, 4099, 16, ds, KDLOSS_BF16, KDLOSS_I32, div, (tail + 1) % 2, T, KT_LAB_SOME, KDLOSS_I32, 0, 0, 0, 0, 1, 1, 1},
            {10, 257, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_NONE, KDLOSS_I64, 0, 0, 8, 0, 0, 1, 1},
            {12, 200, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_SOME, KDLOSS_I64, div % 2, 0, 0, 0, 0, 2, 1},
            {12, 200, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_NONE, KDLOSS_I64, 0, 1 + div % 3, 0, 0, 0, 2, 0},
            {11, 331, 8, ds, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 3, 1},
            {11, 331, 8, ds, KDLOSS_F32, KDLOSS_I32, div, tail, T, KT_LAB_SOME, KDLOSS_I32, 0, 0, 0, 0, 0, 4, 1},
            {11, 331, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, div, tail, T, KT_LAB_NONE, KDLOSS_I64, 0, 0, 0, 0, 0, 4, 1},
        };
        for (size_t j = 0; j < sizeof wc / sizeof wc[0]; j++)
            if (j == 0 || !kt_quick() || div % 3 == 0) test_tk_logits_case(rng, &wc[j]);
    }
}

void test_topk_logits(kt_rng *rng) {
    KT_FOR_EACH_CASE(g) {
        if (kt_quick() && g.n % 11) continue;
        const tk_case c = tk_from_grid(&g);
        test_tk_logits_case(rng, &c);
    }
    static const tk_case sp[] = {
        /* S = V in most rows (k > v): no tail */
        {10, 6, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 4, 0, 1.5, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 0, 0},
        {10, 6, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 4, 1, 1.5, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 0, 0},
        {10, 6, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 2, 1.5, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 0, 0},
        /* labels: one out of range; invalid ids of each kind in row bt / 2 (with all labels
         * ignored: an ignored row's ids count too); an out-of-range label and invalid ids */
        {8, 300, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I32, 0, 1, 1.0, KT_LAB_SOME, KDLOSS_I32, 1, 0, 0, 0, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 0, 1.0, KT_LAB_NONE, KDLOSS_I64, 0, 1, 0, 0, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I32, 1, 1, 2.0, KT_LAB_SOME, KDLOSS_I64, 0, 2, 0, 0, 0, 0, 0},
        {13, 300, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I64, 14, 0, 1.0, KT_LAB_ALL, KDLOSS_I64, 0, 3, 0, 0, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 2, 1.0, KT_LAB_SOME, KDLOSS_I32, 1, 1, 0, 0, 0, 0, 0},
        /* padding, misaligned, in place, across tiles with a larger k, fp16 log-probs */
        {7, 4099, 16, KDLOSS_BF16, KDLOSS_F16, KDLOSS_I32, 7, 0, 1.0, KT_LAB_SOME, KDLOSS_I64, 0, 0, 5, 1, 0, 0, 0},
        {7, 4099, 16, KDLOSS_F16, KDLOSS_F32, KDLOSS_I64, 12, 1, 2.0, KT_LAB_SOME, KDLOSS_I32, 0, 0, 3, 1, 0, 0, 0},
        {9, 513, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 2, 0, 1.0, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 1, 0, 0},
        {9, 513, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I64, 0, 2, 0.7, KT_LAB_NONE, KDLOSS_I64, 0, 0, 8, 0, 1, 0, 0},
        {4, 9001, 64, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 0, 1.0, KT_LAB_SOME, KDLOSS_I64, 0, 0, 0, 0, 0, 0, 0},
        {4, 9001, 64, KDLOSS_BF16, KDLOSS_BF16, KDLOSS_I32, 11, 1, 1.0, KT_LAB_NONE, KDLOSS_I64, 0, 0, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_tk_logits_case(rng, &sp[i]);
    tk_weight_cases(rng);
}

/* ---- the fused loss ---- */

typedef struct fltk_case {
    int64_t bt, hs, v, k;
    kdloss_dtype ds, lpdt;
    int div, tail;
    double T, w_hard, w_soft;
    int t2, bias;
    int64_t chunk, pad;
    int labels;   /* ct_labels_kind's kinds 0, 1, 3, 4 (0: w_hard must be 0) */
    int bad_id;   /* tk_break_ids's kinds */
    int fwd_only; /* 1: losses only; 2: dxs only (no dws / dbs) */
    int rows;     /* 1: row_lse (and row_hard with labels): renorm_both then runs dense */
    int wmode;    /* row weights, tk_case's modes */
    int ent;      /* the entropy (renorm_both then runs dense) */
} fltk_case;

typedef struct fltk_run {
    const fltk_case *c;
    double *xs, *ws, *bs;
    ct_mat mxs, mws, mbs;
    ct_labels L;
    tk_teacher te;
    void *gdx, *gdw, *gdb;
    float *gl, *grows;
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_distill_out o;
    void *wk;
    size_t wkb;
    int host; /* the call's operands: 1 the host copies (the CPU function) */
    float *hw, *dw; /* row weights, host and device (NULL: none) */
} fltk_run;

/* The call's operands, on the device or (host) the host copies. */
static void fltk_operands(const fltk_run *r, int host, kdloss_cmat *xs, kdloss_cmat *ws,
                          const void **bs, kdloss_topk_teacher *t) {
    const fltk_case *c = r->c;
    const int64_t ldh = c->hs + c->pad, ldt = c->k + c->pad;
    *xs = (kdloss_cmat){host ? r->mxs.h : r->mxs.d, c->ds, ldh};
    *ws = (kdloss_cmat){host ? r->mws.h : r->mws.d, c->ds, ldh};
    *bs = c->bias ? (host ? r->mbs.h : r->mbs.d) : NULL;
    *t = (kdloss_topk_teacher){c->k, {host ? r->te.mid.h : r->te.mid.d, KDLOSS_I64, ldt},
                               {host ? r->te.mlp.h : r->te.mlp.d, c->lpdt, ldt}};
}

static kdloss_status fltk_call(void *arg) {
    fltk_run *r = arg;
    kdloss_cmat xs, ws;
    const void *bs;
    kdloss_topk_teacher t;
    fltk_operands(r, 0, &xs, &ws, &bs, &t);
    return kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &r->p, r->c->bt, r->c->hs, r->c->v,
                                                 xs, ws, bs, t, r->L.dev, &r->o, r->wk, r->wkb);
}

/* Float64 reference: zs = xs ws^T + bs, per counted row the CE and ref_topk_row, dz (bt x v)
 * with the loss's factors; rr (3 x bt) row_soft, row_hard, row_lse; L[3] loss, soft, hard.
 * Returns the summed magnitudes of the soft terms. */
static double fltk_ref(const fltk_run *r, double *dz, double *rr, double L[3]) {
    const fltk_case *c = r->c;
    const int64_t bt = c->bt, hs = c->hs, v = c->v, k = c->k;
    int bad = 0;
    for (int64_t i = 0; i < bt; i++) bad |= r->te.kind[i] >= 2;
    const double nvd = r->te.nv > 0 ? (double)r->te.nv : 1.0, t2f = c->t2 ? c->T * c->T : 1.0;
    double *zs = xmalloc((size_t)v * 8), *dd = xmalloc((size_t)v * 8), soft = 0, hard = 0,
           abs_soft = 0;
    for (int64_t i = 0; i < bt; i++) {
        const int64_t y = r->L.lab[i];
        const double w = r->hw ? (double)r->hw[i] : 1.0; /* MATH.md 12.1: dz and terms times w */
        const double ca = w * c->w_hard * 0.5 / nvd, cb = w * c->w_soft * 0.5 * t2f / nvd;
        rr[i] = rr[bt + i] = rr[2 * bt + i] = rr[3 * bt + i] = r->te.kind[i] == 1 ? 0.0 : NAN;
        for (int64_t j = 0; j < v; j++) dz[i * v + j] = 0.0;
        if (r->te.kind[i] != 0) continue;
        for (int64_t j = 0; j < v; j++) {
            double a = c->bias ? r->bs[j] : 0.0;
            for (int64_t h = 0; h < hs; h++) a += r->xs[i * hs + h] * r->ws[j * hs + h];
            zs[j] = a;
        }
        const double lh = logsumexp(zs, v, 1.0), h = c->labels ? lh - zs[y] : 0.0;
        const ref_topk_row_out o =
            ref_topk_row(&KT_DIV_CASES[c->div], (kdloss_topk_tail)c->tail, zs, v, r->te.ids + i * k,
                         r->te.lp + i * k, k, c->T, dd, NULL, NULL);
        for (int64_t j = 0; j < v; j++) /* dd = dD/dzs, the 1/T included */
            dz[i * v + j] = ca * (exp(zs[j] - lh) - (c->labels && j == y ? 1.0 : 0.0)) + cb * dd[j];
        rr[i] = o.loss, rr[bt + i] = h, rr[2 * bt + i] = lh;
        rr[3 * bt + i] = tk_ref_ent(zs, v, c->T);
        soft += w * o.loss, hard += w * h, abs_soft += w * o.mag;
    }
    L[1] = bad ? NAN : soft * t2f / nvd;
    L[2] = bad ? NAN : hard / nvd;
    L[0] = bad ? NAN : c->w_hard * L[2] + c->w_soft * L[1];
    free(zs), free(dd);
    return abs_soft * t2f;
}

/* The losses and the row outputs against the reference. */
static void fltk_check_losses(const char *tag, const fltk_run *r, const double *rr,
                              const double L[3], double abs_soft, float hl[3]) {
    const fltk_case *c = r->c;
    const double lt = c->ds == KDLOSS_BF16 ? 1e-3 : 1e-4,
                 nvd = r->te.nv > 0 ? (double)r->te.nv : 1.0;
    d2h(hl, r->o.loss, 12);
    static const char *ln[3] = {"loss", "soft_loss", "hard_loss"};
    for (int i = 0; i < (c->labels ? 3 : 2); i++) /* no hard_loss without labels */
        kt_close(hl[i], L[i], 1e-5 * abs_soft / nvd + 1e-6, lt, "%s %s", tag, ln[i]);
    /* row_soft, row_hard, row_lse, row_entropy */
    float *hr = dfetch(r->o.row_soft, (size_t)c->bt * 16);
    static const char *rn[4] = {"row_soft", "row_hard", "row_lse", "row_entropy"};
    for (int o = 0; o < 4; o++) {
        if ((o == 1 && !c->labels) || (o && o < 3 && !c->rows) || (o == 3 && !c->ent)) continue;
        if (o == 3) { /* the entropy's tolerance: tk_cmp_ent's, and the GEMM's (lt) */
            for (int64_t i = 0; i < c->bt; i++)
                kt_close(hr[3 * c->bt + i], rr[3 * c->bt + i],
                         64 * U32 * (1.0 + log((double)c->v)), lt, "%s row_entropy[%lld]", tag,
                         (long long)i);
            continue;
        }
        for (int64_t i = 0; i < c->bt; i++)
            kt_close(hr[o * c->bt + i], rr[o * c->bt + i],
                     o ? 1e-6 : 1e-5 * abs_soft / c->bt + 1e-6, lt, "%s %s[%lld]", tag, rn[o],
                     (long long)i);
    }
    free(hr);
}

/* The CPU function on the host copies (only when every id and label is valid): losses and
 * gradients against the GPU's (h1 dxs, h2 dws; NULL when not asked). */
static void fltk_vs_cpu(const char *tag, const fltk_run *r, const void *h1, const void *h2,
                        double abs_soft) {
    const fltk_case *c = r->c;
    const int64_t ldh = c->hs + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    const double lt = c->ds == KDLOSS_BF16 ? 1e-3 : 1e-4, tol = c->ds == KDLOSS_BF16 ? 3e-2 : 2e-4;
    const double nvd = r->te.nv > 0 ? (double)r->te.nv : 1.0;
    float cl[3], gl[3], *cent = xmalloc((size_t)c->bt * 4);
    kdloss_fused_linear_distill_out o = r->o;
    o.loss = cl, o.soft_loss = cl + 1, o.hard_loss = c->labels ? cl + 2 : NULL;
    o.row_soft = o.row_hard = o.row_lse = NULL, o.dbs = NULL;
    o.row_entropy = c->ent ? cent : NULL;
    kdloss_fused_linear_topk_distill_params p = r->p;
    p.row_weights = r->hw;
    void *cpu[2] = {h1 ? xmalloc((size_t)(c->bt * ldh) * es) : NULL,
                    h2 ? xmalloc((size_t)(c->v * ldh) * es) : NULL};
    o.dxs.data = cpu[0], o.dws.data = cpu[1];
    kdloss_cmat xs, ws;
    const void *bs;
    kdloss_topk_teacher t;
    fltk_operands(r, 1, &xs, &ws, &bs, &t);
    kdloss_status s = kdloss_fused_linear_topk_distill(&p, c->bt, c->hs, c->v, xs, ws, bs, t,
                                                       r->L.host, &o, NULL, 0);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
        d2h(gl, r->o.loss, 12);
        for (int i = 0; i < (c->labels ? 3 : 2); i++)
            kt_close(gl[i], cl[i], 1e-5 * abs_soft / nvd + 1e-6, lt, "%s loss[%d] vs CPU", tag, i);
        const void *gpu[2] = {h1, h2};
        for (int w = 0; w < 2; w++) {
            if (!cpu[w]) continue;
            const int64_t rows = w ? c->v : c->bt;
            double *x = to_double(gpu[w], c->ds, rows, c->hs, ldh),
                   *y = to_double(cpu[w], c->ds, rows, c->hs, ldh);
            char what[300];
            snprintf(what, sizeof what, "%s %s vs CPU", tag, w ? "dws" : "dxs");
            cmp_norm(what, x, y, rows * c->hs, tol);
            free(x), free(y);
        }
        float *ge = c->ent ? dfetch(r->o.row_entropy, (size_t)c->bt * 4) : NULL;
        for (int64_t i = 0; ge && i < c->bt; i++)
            kt_close(ge[i], cent[i], 64 * U32 * (1.0 + log((double)c->v)), lt,
                     "%s row_entropy[%lld] vs CPU", tag, (long long)i);
        free(ge);
    }
    free(cpu[0]), free(cpu[1]), free(cent);
}

/* docs/MATH.md 12.1's exact cases from a checked call's outputs (h1 dxs, h2 dws, h3 dbs, each
 * NULL when not asked; hl the losses): weights of 1 (wmode 3) give the bits of NULL weights,
 * weights in {0, 1} (wmode 4) those of the rows masked through ignore_index (labels 0 on the
 * others without labels; the cross-entropy is then off: w_hard 0). */
static void fltk_exact(const char *tag, fltk_run *r, const void *h1, const void *h2,
                       const void *h3, const float *hl) {
    const fltk_case *c = r->c;
    const int64_t bt = c->bt, ldh = c->hs + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    float *hr = dfetch(r->grows, (size_t)bt * 16);
    const kdloss_labels keep = r->L.dev;
    void *masked = NULL;
    if (c->wmode == 4) {
        const kdloss_dtype lt = c->labels ? r->L.dev.dtype : KDLOSS_I64;
        const size_t ls = kdloss_dtype_size(lt);
        char *h = xmalloc((size_t)bt * ls);
        for (int64_t i = 0; i < bt; i++) {
            const int64_t y = r->hw[i] == 0.0f ? -100 : c->labels ? r->L.lab[i] : 0;
            if (ls == 8) ((int64_t *)h)[i] = y;
            else ((int32_t *)h)[i] = (int32_t)y;
        }
        masked = dupload(h, (size_t)bt * ls);
        free(h);
        r->L.dev = (kdloss_labels){masked, lt};
    }
    r->p.row_weights = NULL;
    KT_CHECK(fltk_call(r) == KDLOSS_OK, "%s: the exact case's call", tag);
    CK(cudaStreamSynchronize(g_st));
    r->p.row_weights = r->dw, r->L.dev = keep;
    const int one = c->wmode == 3;
    if (h1) ct_same_bits(tag, one ? "dxs (w 1 = NULL)" : "dxs ({0,1} = masked)", r->o.dxs.data, h1,
                         (size_t)(bt * ldh) * es);
    if (h2) ct_same_bits(tag, one ? "dws (w 1 = NULL)" : "dws ({0,1} = masked)", r->o.dws.data, h2,
                         (size_t)(c->v * ldh) * es);
    if (h3) ct_same_bits(tag, one ? "dbs (w 1 = NULL)" : "dbs ({0,1} = masked)", r->o.dbs, h3,
                         (size_t)c->v * es);
    ct_same_bits(tag, one ? "rows (w 1 = NULL)" : "rows ({0,1} = masked)", r->grows, hr,
                 (size_t)bt * 16);
    ct_same_bits(tag, one ? "losses (w 1 = NULL)" : "losses ({0,1} = masked)", r->gl, hl,
                 c->labels ? 12 : 8);
    if (masked) CK(cudaFree(masked));
    free(hr);
}

/* The gradients asked for against the reference; the same call again: the same bits; the CPU. */
static void fltk_check_grads(const char *tag, fltk_run *r, const double *dz, const float hl[3],
                             double abs_soft, int32_t want_status) {
    const fltk_case *c = r->c;
    const int64_t bt = c->bt, hs = c->hs, v = c->v, ldh = hs + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    const double tol = c->ds == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
    double *rdx = xmalloc((size_t)(bt * hs) * 8), *rdw = xmalloc((size_t)(v * hs) * 8);
    double *rdb = xmalloc((size_t)v * 8);
    ct_ref_grads(bt, hs, v, dz, r->xs, r->ws, rdx, rdw, rdb);
    void *h1 = NULL, *h2 = NULL, *h3 = NULL;
    if (r->o.dxs.data) h1 = ct_cmp_grad(tag, "dxs", r->o.dxs.data, c->ds, bt, hs, ldh, rdx, tol);
    if (r->o.dws.data) h2 = ct_cmp_grad(tag, "dws", r->o.dws.data, c->ds, v, hs, ldh, rdw, tol);
    if (r->o.dbs) h3 = ct_cmp_grad(tag, "dbs", r->o.dbs, c->ds, 1, v, v, rdb, tol);
    KT_CHECK(fltk_call(r) == KDLOSS_OK, "%s: second call", tag);
    CK(cudaStreamSynchronize(g_st));
    float hl2[3];
    d2h(hl2, r->o.loss, 12);
    KT_CHECK(memcmp(hl, hl2, c->labels ? 12 : 8) == 0, "%s: losses differ between runs", tag);
    if (h1) ct_same_bits(tag, "dxs", r->o.dxs.data, h1, (size_t)(bt * ldh) * es);
    if (h2) ct_same_bits(tag, "dws", r->o.dws.data, h2, (size_t)(v * ldh) * es);
    if (h3) ct_same_bits(tag, "dbs", r->o.dbs, h3, (size_t)v * es);
    if (kdloss_fused_linear_topk_distill && want_status == KDLOSS_OK)
        fltk_vs_cpu(tag, r, h1, h2, abs_soft);
    if (c->wmode == 3 || c->wmode == 4) fltk_exact(tag, r, h1, h2, h3, hl);
    free(h1), free(h2), free(h3), free(rdx), free(rdw), free(rdb);
}

/* Operands as the dense fused test's (xs N(0, 1), ws of spread 3 / sqrt(hs), bs N(0, 0.5)), the
 * teacher's slots from tk_gen_slots on the reference's own logits' scale. */
static void fltk_inputs(kt_rng *rng, fltk_run *r) {
    const fltk_case *c = r->c;
    const int64_t bt = c->bt, hs = c->hs, v = c->v, ldh = hs + c->pad;
    r->xs = xmalloc((size_t)(bt * hs) * 8), r->ws = xmalloc((size_t)(v * hs) * 8);
    r->bs = xmalloc((size_t)v * 8);
    fill_normal(rng, r->xs, bt * hs, 1.0);
    fill_normal(rng, r->ws, v * hs, 3.0 / sqrt((double)hs));
    fill_normal(rng, r->bs, v, 0.5);
    kt_round_to(r->xs, bt * hs, c->ds);
    kt_round_to(r->ws, v * hs, c->ds);
    kt_round_to(r->bs, v, c->ds);
    r->L = ct_labels_kind(rng, c->labels, bt, v);
    tk_teacher_make(rng, &r->te, bt, v, c->k, c->k + c->pad, c->T, &KT_DIV_CASES[c->div],
                    KDLOSS_I64, c->lpdt, c->bad_id, &r->L);
    if (c->wmode) { /* the row kinds with the weights, as tk_weights_make */
        r->hw = xmalloc((size_t)bt * 4);
        r->te.nv = 0;
        for (int64_t i = 0; i < bt; i++) {
            const float w = r->hw[i] = tk_weight(rng, c->wmode, i, bt);
            int *kind = &r->te.kind[i];
            if (*kind < 2 && !(w >= 0.0f && w <= FLT_MAX)) *kind = 4;
            if (*kind == 0 && w == 0.0f) *kind = 1;
            r->te.nv += *kind == 0;
        }
        r->dw = dupload(r->hw, (size_t)bt * 4);
    }
    r->mxs = ct_in(r->xs, bt, hs, ldh, c->ds, 0), r->mws = ct_in(r->ws, v, hs, ldh, c->ds, 0);
    r->mbs = ct_in(r->bs, 1, v, v, c->ds, 0);
}

/* Parameters, poisoned outputs (those the case asks for), the workspace. */
static void fltk_setup(const char *tag, fltk_run *r) {
    const fltk_case *c = r->c;
    const int64_t bt = c->bt, ldh = c->hs + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    kdloss_fused_linear_topk_distill_params_default(&r->p);
    r->p.div = KT_DIV_CASES[c->div], r->p.tail = (kdloss_topk_tail)c->tail, r->p.temperature = c->T;
    r->p.weight_hard_loss = c->w_hard, r->p.weight_soft_loss = c->w_soft, r->p.t2_scale = c->t2;
    r->p.ignore_index = -100, r->p.chunk_size = c->chunk, r->p.grad_scale = 0.5;
    r->p.row_weights = r->dw;
    r->gdx = dalloc((size_t)(bt * ldh) * es), r->gdw = dalloc((size_t)(c->v * ldh) * es);
    r->gdb = dalloc((size_t)c->v * es), r->gl = dalloc(12), r->grows = dalloc((size_t)bt * 16);
    dpoison(r->gdx, (size_t)(bt * ldh) * es), dpoison(r->gdw, (size_t)(c->v * ldh) * es);
    dpoison(r->gdb, (size_t)c->v * es), dpoison(r->gl, 12), dpoison(r->grows, (size_t)bt * 16);
    memset(&r->o, 0, sizeof r->o);
    r->o.loss = r->gl, r->o.soft_loss = r->gl + 1, r->o.hard_loss = c->labels ? r->gl + 2 : NULL;
    r->o.row_soft = r->grows;
    r->o.row_hard = c->rows && c->labels ? r->grows + bt : NULL;
    r->o.row_lse = c->rows ? r->grows + 2 * bt : NULL;
    r->o.row_entropy = c->ent ? r->grows + 3 * bt : NULL;
    if (c->fwd_only != 1) r->o.dxs = (kdloss_mat){r->gdx, c->ds, ldh};
    if (!c->fwd_only) r->o.dws = (kdloss_mat){r->gdw, c->ds, ldh};
    if (!c->fwd_only && c->bias) r->o.dbs = r->gdb;
    kdloss_status s = kdloss_cuda_fused_linear_topk_distill_workspace_size(
        &r->p, bt, c->hs, c->v, c->k, c->ds, c->fwd_only != 1, &r->wkb);
    KT_CHECK(s == KDLOSS_OK, "%s: ws size %d", tag, (int)s);
    r->wk = dalloc(r->wkb);
}

static void fltk_check(const char *tag, fltk_run *r) {
    const fltk_case *c = r->c;
    const int32_t want_status = tk_want_status(&r->te, &r->L, c->bt, c->v, 1, r->hw);
    KT_CHECK(read_status(r->wk) == want_status, "%s: device status word %d", tag,
             (int)read_status(r->wk));
    double *dz = xmalloc((size_t)(c->bt * c->v) * 8), *rr = xmalloc((size_t)c->bt * 32), L[3];
    float hl[3];
    const double abs_soft = fltk_ref(r, dz, rr, L);
    fltk_check_losses(tag, r, rr, L, abs_soft, hl);
    fltk_check_grads(tag, r, dz, hl, abs_soft, want_status);
    free(dz), free(rr);
}

static void test_fltk_case(kt_rng *rng, const fltk_case *c) {
    const kdloss_div_params d = KT_DIV_CASES[c->div];
    char tag[260];
    snprintf(tag, sizeof tag,
             "fltopk %s %s beta=%g alpha=%g bt=%lld hs=%lld v=%lld k=%lld s=%s lp=%s T=%g wh=%g "
             "ws=%g t2=%d bias=%d chunk=%lld pad=%lld labels=%d bad_id=%d fwd=%d rows=%d w=%d "
             "ent=%d",
             tk_tail_name(c->tail), kdloss_divergence_name(d.divergence), d.beta, d.alpha,
             (long long)c->bt, (long long)c->hs, (long long)c->v, (long long)c->k,
             kt_dtype_name(c->ds), kt_dtype_name(c->lpdt), c->T, c->w_hard, c->w_soft, c->t2,
             c->bias, (long long)c->chunk, (long long)c->pad, c->labels, c->bad_id, c->fwd_only,
             c->rows, c->wmode, c->ent);
    fltk_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    fltk_inputs(rng, &r);
    fltk_setup(tag, &r);
    kdloss_status s = fltk_call(&r);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) fltk_check(tag, &r);
    void *dev[] = {r.gdx, r.gdw, r.gdb, r.gl, r.grows, r.wk};
    for (int i = 0; i < 6; i++) CK(cudaFree(dev[i]));
    ct_free(&r.mxs), ct_free(&r.mws), ct_free(&r.mbs);
    tk_teacher_free(&r.te);
    ct_labels_free(&r.L);
    if (r.dw) CK(cudaFree(r.dw));
    free(r.hw);
    free(r.xs), free(r.ws), free(r.bs);
}

/* Per-row weights and the entropy (docs/MATH.md 12.1), per divergence: bucket (dense) and
 * renorm_both (the sparse path without labels and the entropy, else dense) with weights of
 * zeros and non-integers, among ignored labels, with the CE, with the entropy; bad weights with
 * bad ids (the fused loss's order: ids first) and with a bad label; weights of 1 against NULL
 * and {0, 1} against masked labels on both paths. */
static void fltk_weight_cases(kt_rng *rng) {
    for (int i = 0; i < KT_NDIV_CASES; i++) {
        if (kt_quick() && i % 4) continue;
        const kdloss_dtype ds = KT_DTYPES[i % 2];
        const double T = i % 2 ? 2.0 : 1.0;
        const fltk_case c[] = {
            {29, 24, 300, 8, ds, KDLOSS_F32, i, 0, T, 0.5, 1.0, i % 2, 1, 7, 0, 1, 0, 0, 1, 1, 1},
            {29, 24, 300, 8, ds, KDLOSS_F32, i, 1, T, 0.0, 1.0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0},
            {29, 24, 300, 8, ds, KDLOSS_F32, i, 1, T, 0.0, 1.0, 1, 0, 5, 0, 0, 0, 0, 0, 1, 1},
            {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, i, 0, 1.0, 0.5, 0.5, 0, 1, 5, 0, 4, 0, 0, 0, 2, 1},
            {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, i, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 0, 1 + i % 3, 0, 0, 2, 0},
            {17, 16, 200, 8, ds, KDLOSS_F32, i, 0, T, 0.5, 0.5, 0, 1, 6, 0, 1, 0, 0, 1, 3, i % 2},
            {17, 16, 200, 8, ds, KDLOSS_F32, i, 1, T, 0.0, 1.0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 0},
            {17, 16, 200, 8, ds, KDLOSS_F32, i, 1, T, 0.0, 1.0, 1, 1, 0, 0, 0, 0, 0, 0, 3, 0},
            {17, 16, 200, 8, ds, KDLOSS_F32, i, 0, T, 0.0, 1.0, 1, 1, 4, 0, 0, 0, 0, 0, 4, 1},
        };
        for (size_t j = 0; j < sizeof c / sizeof c[0]; j++)
            if (j == 0 || !kt_quick()) test_fltk_case(rng, &c[j]);
    }
}

/* Every divergence case with the bucket (dense) and renorm_both (the sparse path, and dense
 * when row_lse is asked for), renorm_teacher, dtypes, T, t2_scale, weights, chunking, bias,
 * padding, labels (none, ignored, all ignored, out of range), invalid ids, forward only. */
void test_topk_fused(kt_rng *rng) {
    static const int64_t chunks[] = {0, 16, 1, 7};
    int n = 0;
    for (int i = 0; i < KT_NDIV_CASES; i++)
        for (int tail = 0; tail < 2; tail++, n++) {
            if (kt_quick() && n % 5) continue;
            const int labels = n % 3 == 2 ? 0 : 1; /* no labels: no cross-entropy */
            fltk_case c = {29, 24, 300, 8, KT_DTYPES[n % 2], KDLOSS_F32, i, tail,
                           n % 4 == 1 ? 2.0 : 1.0, labels && tail == 0 ? 0.5 : 0.0, 1.0,
                           (n / 2) % 2, n % 3 != 1, chunks[n % 4], 0, labels, 0, 0, n % 5 == 4,
                           0, 0};
            test_fltk_case(rng, &c);
        }
    static const fltk_case sp[] = {
        /* renorm_teacher; renorm_both dense (row_lse) with CE; renorm_both sparse, bf16 log-probs,
           padded */
        {29, 24, 300, 8, KDLOSS_F32, KDLOSS_F32, 0, 2, 1.5, 0.5, 0.5, 1, 1, 7, 0, 1, 0, 0, 1, 0, 0},
        {29, 24, 300, 8, KDLOSS_BF16, KDLOSS_BF16, 4, 1, 1.0, 0.5, 0.5, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0},
        {29, 24, 300, 8, KDLOSS_BF16, KDLOSS_BF16, 4, 1, 2.0, 0.0, 1.0, 1, 1, 0, 3, 1, 0, 0, 0, 0, 0},
        /* all ignored; one label out of range; invalid ids (dense, sparse, without labels) */
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 5, 0, 3, 0, 0, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 1, 1, 1.0, 0.0, 1.0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 5, 0, 1, 1, 0, 1, 0, 0},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 2, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 1, 2, 0, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 14, 0, 1.0, 0.0, 1.0, 0, 1, 3, 0, 0, 3, 0, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 4, 2, 0, 0, 0, 0},
        /* forward only; dxs only (sparse: no pairs); V across tiles, k 64; S = V (k > v) */
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 2.0, 0.5, 0.5, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 1, 0, 2, 0, 0, 0},
        {9, 16, 4100, 64, KDLOSS_BF16, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 4, 3, 1, 0, 0, 1, 0, 0},
        {9, 16, 4100, 64, KDLOSS_F32, KDLOSS_F32, 12, 1, 1.5, 0.0, 1.0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0},
        {10, 8, 6, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0},
        {10, 8, 6, 8, KDLOSS_F32, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 3, 0, 1, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_fltk_case(rng, &sp[i]);
    fltk_weight_cases(rng);
}
