/* Per-row weights and the student's entropy (docs/MATH.md section 12) of the losses on logits,
 * kdloss_distill_logits (dense teacher) and kdloss_topk_distill_logits (every tail), on every CPU
 * path, beside the case grids of test_distill_logits and test_topk (which check weighted losses,
 * gradients and entropies against the float64 references): what those grids cannot state.
 *   - defaults: weights NULL and all 1 give the same bits, and so do calls with and without the
 *     entropy (the kernel's entropy instantiation leaves the loss alone);
 *   - weights {0, 1} equal masking those rows through ignore_index, bitwise (loss, row_loss,
 *     gradient; the entropy 0 on those rows, the same bits elsewhere);
 *   - finite differences of the weighted loss (the library's fp32 loss, h = 1e-2, 2e-2
 *     relative + 3e-3 (1 + loss) absolute, about test_distill_logits' library FD) against its
 *     gradient (times grad_scale 1.5);
 *   - the entropy alone (no other output) equals the full call's; on wide rows (logits spanning
 *     more than FLT_MAX, the careful form of section 10) against the float64 entropy;
 *   - bad weights (negative, NaN, +inf, -inf) refused with INVALID_PARAM, nothing written, the
 *     detail naming row_weights[i]; misaligned weights or entropy refused; a weight array that
 *     overlaps an output, or an entropy overlapping an input or output: ALIASING. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "div_cases.h"
#include "ref_rowx.h"
#include "reference.h"
#include "testutil.h"

static const kdloss_div_params DIVS[] = KT_DIV_CASES_LOGITS_INIT;
#define NDIV ((int)(sizeof DIVS / sizeof DIVS[0]))
#define IGN (-7)

/* A dense or top-k call on fp32 logits z (bt x v, ld v): teacher zt (dense) or ids / lp (k > 0,
 * the top k of zt's log-softmax), tail (top-k), labels lab or NULL. */
typedef struct call {
    int64_t bt, v, k;
    kdloss_div_params div;
    int tail;
    double t;
    float *z, *zt, *lp;
    int64_t *ids, *lab;
} call;

static kdloss_status run(const call *c, const float *w, float *ent, const int64_t *lab,
                         float *loss, float *rows, float *g) {
    kdloss_labels l = {lab, KDLOSS_I64};
    kdloss_cmat zs = {c->z, KDLOSS_F32, c->v};
    kdloss_mat gm = {g, KDLOSS_F32, c->v};
    if (!c->k) {
        kdloss_distill_logits_params p;
        kdloss_distill_logits_params_default(&p);
        p.div = c->div, p.temperature = c->t, p.ignore_index = IGN, p.grad_scale = 1.5;
        p.row_weights = w, p.row_entropy = ent;
        return kdloss_distill_logits(&p, c->bt, c->v, zs, (kdloss_cmat){c->zt, KDLOSS_F32, c->v},
                                     l, loss, rows, gm);
    }
    kdloss_topk_distill_params p;
    kdloss_topk_distill_params_default(&p);
    p.div = c->div, p.tail = (kdloss_topk_tail)c->tail, p.temperature = c->t;
    p.ignore_index = IGN, p.grad_scale = 1.5, p.row_weights = w, p.row_entropy = ent;
    kdloss_topk_teacher tk = {c->k, {c->ids, KDLOSS_I64, c->k}, {c->lp, KDLOSS_F32, c->k}};
    return kdloss_topk_distill_logits(&p, c->bt, c->v, zs, tk, l, loss, rows, gm);
}

/* Fresh logits (normal rows of random scale and offset), a teacher, labels with some ignored. */
static void make(call *c, kt_rng *rng, int64_t bt, int64_t v, int64_t k) {
    c->bt = bt, c->v = v, c->k = k;
    c->z = malloc(sizeof(float) * bt * v), c->zt = malloc(sizeof(float) * bt * v);
    c->lab = malloc(sizeof(int64_t) * bt);
    double *row = malloc(sizeof(double) * v), *lsm = malloc(sizeof(double) * v);
    for (int64_t r = 0; r < bt; r++) {
        double sc = 0.5 + 3 * kt_uniform(rng), off = 20 * kt_normal(rng);
        for (int64_t j = 0; j < v; j++) {
            c->z[r * v + j] = (float)(sc * kt_normal(rng) + off);
            c->zt[r * v + j] = (float)(sc * kt_normal(rng));
        }
        c->lab[r] = kt_uniform(rng) < 0.25 ? IGN : kt_randint(rng, v);
    }
    c->ids = NULL, c->lp = NULL;
    if (k) { /* the teacher's top k ids (any k distinct ids do: the first k of a shuffle) */
        c->ids = malloc(sizeof(int64_t) * bt * k), c->lp = malloc(sizeof(float) * bt * k);
        int64_t *perm = malloc(sizeof(int64_t) * v);
        for (int64_t r = 0; r < bt; r++) {
            for (int64_t j = 0; j < v; j++) perm[j] = j, row[j] = c->zt[r * v + j];
            ref_log_softmax(row, v, 1.0, lsm);
            for (int64_t j = 0; j < k; j++) {
                int64_t s = j + kt_randint(rng, v - j), tmp = perm[j];
                perm[j] = perm[s], perm[s] = tmp;
                c->ids[r * k + j] = perm[j];
                c->lp[r * k + j] = (float)lsm[perm[j]];
            }
        }
        free(perm);
    }
    free(row), free(lsm);
}

static void unmake(call *c) { free(c->z), free(c->zt), free(c->lab), free(c->ids), free(c->lp); }

/* The outputs of one call, poisoned first. */
typedef struct outs {
    float loss, *rows, *g, *ent;
    kdloss_status st;
} outs;

static outs call_all(const call *c, const float *w, int want_ent, const int64_t *lab) {
    outs o;
    o.rows = malloc(sizeof(float) * c->bt), o.g = malloc(sizeof(float) * c->bt * c->v);
    o.ent = want_ent ? malloc(sizeof(float) * c->bt) : NULL;
    kt_poison(o.rows, c->bt, KDLOSS_F32), kt_poison(o.g, c->bt * c->v, KDLOSS_F32);
    if (o.ent) kt_poison(o.ent, c->bt, KDLOSS_F32);
    o.loss = NAN;
    o.st = run(c, w, o.ent, lab, &o.loss, o.rows, o.g);
    return o;
}

static void outs_free(outs *o) { free(o->rows), free(o->g), free(o->ent); }

static int same(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

/* NULL and all-1 weights, with and without the entropy: the same bits; {0, 1} weights equal
 * those rows masked through ignore_index. */
static void check_defaults_and_mask(const call *c, kt_rng *rng, const char *tag) {
    int64_t bt = c->bt, v = c->v;
    size_t gb = sizeof(float) * bt * v, rb = sizeof(float) * bt;
    float *ones = malloc(rb), *mask = malloc(rb);
    int64_t *lab2 = malloc(sizeof(int64_t) * bt);
    for (int64_t r = 0; r < bt; r++) {
        ones[r] = 1.0f;
        mask[r] = kt_uniform(rng) < 0.4 ? 0.0f : 1.0f;
        lab2[r] = mask[r] == 0.0f ? IGN : c->lab[r];
    }
    outs a = call_all(c, NULL, 0, c->lab), b = call_all(c, ones, 0, c->lab);
    outs e = call_all(c, NULL, 1, c->lab), m = call_all(c, mask, 1, c->lab);
    outs i = call_all(c, NULL, 1, lab2);
    KT_CHECK(!a.st && !b.st && !e.st && !m.st && !i.st, "%s: a call failed", tag);
    KT_CHECK(same(&a.loss, &b.loss, 4) && same(a.rows, b.rows, rb) && same(a.g, b.g, gb),
             "%s: all-1 weights differ from NULL", tag);
    KT_CHECK(same(&a.loss, &e.loss, 4) && same(a.rows, e.rows, rb) && same(a.g, e.g, gb),
             "%s: asking for the entropy changes the loss or gradient", tag);
    KT_CHECK(same(&m.loss, &i.loss, 4) && same(m.rows, i.rows, rb) && same(m.g, i.g, gb) &&
                 same(m.ent, i.ent, rb),
             "%s: {0,1} weights differ from masking through ignore_index", tag);
    for (int64_t r = 0; r < bt; r++) {
        int kept = c->lab[r] != IGN && mask[r] != 0.0f;
        KT_CHECK(kept ? same(&m.ent[r], &e.ent[r], 4) : m.ent[r] == 0.0f,
                 "%s: entropy[%lld] %g (kept %d) vs unweighted %g", tag, (long long)r, m.ent[r],
                 kept, e.ent[r]);
    }
    /* the entropy alone: no other output, the same entropies */
    float *h = malloc(rb);
    kt_poison(h, bt, KDLOSS_F32);
    kdloss_status st = run(c, mask, h, c->lab, NULL, NULL, NULL);
    KT_CHECK(st == KDLOSS_OK && same(h, m.ent, rb), "%s: entropy alone %s / differs", tag,
             kdloss_status_string(st));
    free(h);
    outs_free(&a), outs_free(&b), outs_free(&e), outs_free(&m), outs_free(&i);
    free(ones), free(mask), free(lab2);
}

/* Central differences of the weighted fp32 loss against its gradient, a few columns per row. */
static void check_fd(call *c, kt_rng *rng, const char *tag) {
    if (c->div.divergence == KDLOSS_DIV_TVD) return; /* kinks within h */
    int64_t bt = c->bt, v = c->v;
    float *w = malloc(sizeof(float) * bt);
    kt_gen_row_weights(rng, w, bt);
    for (int64_t r = 0; r < bt; r++) w[r] = w[r] > 10.0f ? w[r] * 1e-3f : w[r]; /* O(1) loss */
    outs o = call_all(c, w, 0, c->lab);
    KT_CHECK(o.st == KDLOSS_OK, "%s FD: %s", tag, kdloss_status_string(o.st));
    for (int64_t r = 0; r < bt && !o.st; r++)
        for (int n = 0; n < 3; n++) {
            int64_t j = kt_randint(rng, v);
            float keep = c->z[r * v + j], hf = 1e-2f, lp, lm;
            c->z[r * v + j] = keep + hf;
            run(c, w, NULL, c->lab, &lp, NULL, NULL);
            c->z[r * v + j] = keep - hf;
            run(c, w, NULL, c->lab, &lm, NULL, NULL);
            c->z[r * v + j] = keep;
            double fd = 1.5 * ((double)lp - lm) / (2.0 * hf); /* grad_scale 1.5 (run) */
            kt_close(o.g[r * v + j], fd, 3e-3 * (1 + fabs(o.loss)), 2e-2,
                     "%s FD grad[%lld,%lld] (w %g)", tag, (long long)r, (long long)j, w[r]);
        }
    outs_free(&o);
    free(w);
}

/* Bad weights, misaligned and overlapping arrays: refused, nothing written. */
static void check_errors(const call *c, const char *tag) {
    int64_t bt = c->bt, v = c->v;
    size_t rb = sizeof(float) * bt;
    const float bad[] = {-1.0f, NAN, INFINITY, -INFINITY, -1e-45f};
    float *w = malloc(rb + 8), *buf = malloc(sizeof(float) * (3 * bt + 2));
    for (int b = 0; b < (int)(sizeof bad / sizeof bad[0]); b++) {
        int64_t at = (b * 3 + 1) % bt;
        for (int64_t r = 0; r < bt; r++) w[r] = 0.5f;
        w[at] = bad[b];
        outs o = call_all(c, w, 1, c->lab);
        char want[64];
        snprintf(want, sizeof want, "row_weights[%lld]", (long long)at);
        KT_CHECK(o.st == KDLOSS_ERR_INVALID_PARAM && strstr(kdloss_error_detail(), want) &&
                     isnan(o.loss) && kt_is_poison(o.rows, bt, KDLOSS_F32) &&
                     kt_is_poison(o.g, bt * v, KDLOSS_F32) && kt_is_poison(o.ent, bt, KDLOSS_F32),
                 "%s: weight %g at %lld: %s (%s), or something written", tag, bad[b],
                 (long long)at, kdloss_status_string(o.st), kdloss_error_detail());
        outs_free(&o);
    }
    for (int64_t r = 0; r < bt; r++) w[r] = 1.0f;
    /* valid weights everywhere in buf (so that only the overlap is wrong): unchanged after */
    float loss = NAN, *rows = buf, *ent = buf + bt;
    for (int64_t i = 0; i < 3 * bt + 2; i++) buf[i] = 1.0f;
    /* misaligned weights / entropy */
    const float *wm = (const float *)((const char *)w + 1);
    kdloss_status st = run(c, wm, NULL, c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_MISALIGNED, "%s: misaligned weights: %s", tag,
             kdloss_status_string(st));
    st = run(c, NULL, (float *)((char *)ent + 1), c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_MISALIGNED, "%s: misaligned entropy: %s", tag,
             kdloss_status_string(st));
    /* overlaps: weights with row_loss; entropy with row_loss, the student, the weights */
    st = run(c, rows + 1, NULL, c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_ALIASING, "%s: weights over row_loss: %s", tag,
             kdloss_status_string(st));
    st = run(c, NULL, rows + 1, c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_ALIASING, "%s: entropy over row_loss: %s", tag,
             kdloss_status_string(st));
    st = run(c, NULL, c->z, c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_ALIASING, "%s: entropy over the student: %s", tag,
             kdloss_status_string(st));
    st = run(c, w, w, c->lab, &loss, rows, NULL);
    KT_CHECK(st == KDLOSS_ERR_ALIASING, "%s: entropy over the weights: %s", tag,
             kdloss_status_string(st));
    int intact = isnan(loss);
    for (int64_t i = 0; i < 3 * bt + 2; i++) intact &= buf[i] == 1.0f;
    KT_CHECK(intact, "%s: a refused call wrote", tag);
    free(w), free(buf);
}

/* Wide rows (logits spanning more than FLT_MAX; T 1e38 keeps their tempered span O(1)) and
 * ordinary ones: the entropy against the float64 one, weights on. */
static void check_wide(kt_rng *rng, const char *isa) {
    const int64_t bt = 4, v = 300;
    call c = {0};
    make(&c, rng, bt, v, 0);
    c.div = DIVS[0], c.t = 1e38;
    for (int64_t r = 0; r < bt; r++)
        for (int64_t j = 0; j < v; j++)
            if (r % 2 == 0) c.z[r * v + j] = (float)(3e38 * (2 * kt_uniform(rng) - 1));
            else c.z[r * v + j] = (float)(1e38 * kt_normal(rng));
    float w[4] = {2.0f, 0.5f, 1.0f, 3.0f};
    outs o = call_all(&c, w, 1, NULL);
    double *zd = malloc(sizeof(double) * v);
    for (int64_t r = 0; r < bt && KT_CHECK(o.st == KDLOSS_OK, "wide %s: %s", isa,
                                           kdloss_status_string(o.st));
         r++) {
        for (int64_t j = 0; j < v; j++) zd[j] = c.z[r * v + j];
        double tol, h = ref_entropy(zd, v, c.t, &tol);
        kt_close(o.ent[r], h, tol, 0, "wide %s entropy[%lld]", isa, (long long)r);
    }
    free(zd);
    outs_free(&o);
    unmake(&c);
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    const int64_t shapes[][2] = {{5, 1}, {9, 37}, {6, 1100}, {4, 2500}};
    const int nshape = (int)(sizeof shapes / sizeof shapes[0]);
    KT_FOR_EACH_ISA(path, "") {
        for (int d = 0; d < NDIV; d++)
            for (int s = 0; s < nshape; s++) {
                int64_t bt = shapes[s][0], v = shapes[s][1];
                int ntail = DIVS[d].divergence == KDLOSS_DIV_FORWARD_KL ? 3 : 2;
                for (int tl = -1; tl < ntail; tl++) { /* -1: the dense teacher */
                    call c;
                    make(&c, &rng, bt, v, tl < 0 ? 0 : (v < 8 ? v : 8));
                    c.div = DIVS[d], c.tail = tl < 0 ? 0 : tl;
                    c.t = (const double[]){1.0, 2.0, 0.7}[(d + s) % 3];
                    char tag[160];
                    snprintf(tag, sizeof tag, "%s %s beta=%g alpha=%g %s%s T=%g v=%lld",
                             path.name, kdloss_divergence_name(c.div.divergence), c.div.beta,
                             c.div.alpha, tl < 0 ? "dense" : "topk ",
                             tl < 0 ? "" : kdloss_topk_tail_name((kdloss_topk_tail)tl), c.t,
                             (long long)v);
                    check_defaults_and_mask(&c, &rng, tag);
                    if (s == 1) check_fd(&c, &rng, tag);
                    if (s == 1 && d < 2) check_errors(&c, tag);
                    unmake(&c);
                }
            }
        check_wide(&rng, path.name);
    }
    return kt_finish("test_row_weights");
}
