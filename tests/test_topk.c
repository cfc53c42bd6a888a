/* The sparse top-k teacher (docs/MATH.md section 8): kdloss_topk_distill_logits and
 * kdloss_fused_linear_topk_distill against the float64 reference of tests/support/ref_topk.c
 * (written from the definitions, not from src/common/topk_row.h).
 *
 *  1. kdloss_topk_distill_logits: the case grid of tests/support/cases.h (15 divergence cases x
 *     V (1, 9, 1100, 4096, 4133, 9001) x student dtype, the grid the CUDA test runs) x tail modes
 *     (renorm_teacher with forward KL only) x K (1, 8, 64, and K = V for V = 9), with
 *     the teacher's dtype (F32 / BF16 / F16), the ids' (I32 / I64), labels (none, some ignored,
 *     all ignored), T (1, 2, 0.7), grad_scale, row strides, top-k or random ids, unused slots
 *     (-1 in random slots, a row with every slot unused) cycled over the grid, on every CPU path.
 *     Student logits of every row kind (normal, peaked, far below exp's range, flat) shifted by
 *     large offsets (rows near -1e4); teacher log-probs are log_softmax of random teacher logits
 *     of every kind (some -inf where the divergence stays finite), gathered at the top-k ids or
 *     at random ids, rounded to their dtype; unused slots hold NaN (never read). Loss, row loss
 *     and gradient vs the reference; forward-only losses and the in-place gradient bitwise.
 *  2. K = V, bucket: equals kdloss_distill_logits on dense teacher logits T lp (no tail bin).
 *  3. kdloss_fused_linear_topk_distill vs the reference on float64 logits (F32 / BF16 operands,
 *     bias or not, chunk 3 / 16 / automatic, a small memory budget, caller workspace, labels
 *     NULL, row outputs, t2_scale, forward only); renorm_both's sparse path vs the reference and
 *     vs the full path.
 *  4. Central differences of the reference (double) and of the library (fp32), every tail mode.
 *  5. Argument errors of both entry points and the size query: outputs poisoned and inputs
 *     snapshotted, both byte-identical after every rejected call.
 *  6. Results bitwise identical with 1 and 2 OpenMP threads.
 *  7. kdloss_topk_tail_name / kdloss_topk_tail_from_name.
 *
 * Tolerances (u = 2^-24). mag, cond, dz_mag, dz_cond are the reference's (tests/support/ref_topk.h):
 *  | quantity                 | bound                                        | why
 *  | row loss                 | 256 u mag + cond                             | as tests/README.md's table: fp32 lane sums and ~8
 *  |                          |                                              | roundings + 3 transcendentals per element, on at most
 *  |                          |                                              | K + 1 bins plus the V-wide log-sum-exps; cond: the
 *  |                          |                                              | teacher tail's double evaluation where it is tiny
 *  | loss                     | sum of the row bounds / max(1, n_valid)      | the rows' errors add
 *  | logit gradient element   | (64 u dz_mag + dz_cond) |scale|              | per-element rounding of g - Q G (test_distill_logits'
 *  |                          | + 2^-8 / 2^-11 |want| (bf16 / fp16 output)   | bound; dz_mag holds the terms' size, so cancellation
 *  |                          | + two subnormal steps of the output dtype    | is covered), one RNE cast, results that underflow
 *  | ignored rows, empty rows | exactly 0 (loss and gradient)                | the header's contract
 *  | K = V bucket vs dense    | (512 u + |lse(lp)|) mag, gradient            | each within its bound of the same reference; the dense
 *  |                          | (128 u + |lse(lp)|) dz_mag + 2 dz_cond       | call renormalizes lp by lse(lp) (|lse| ~ u, fp32 lp)
 *  | fused rows / losses      | the row bound + sens dz + (hard: 2 dz + 8 u  | dz = Hs u sum_h |xs_h| |ws_jh| + u |bs_j| bounds the
 *  |                          | (1 + |lse| + |z_y|)); lse: dz + 8 u (1+|lse|)| fp32 GEMM's logit error (gamma_Hs); sens = sum_j
 *  |                          |                                              | dz_mag_j >= sum_j |dD/dz_j| carries it to first order
 *  | fused dxs, dws, dbs      | |.| of (1e-4 dz_mag + dz_cond) through the   | test_fld's bound: GEMMs of V (<= 300) or BT terms
 *  |                          | linear layer (+ 2^-8 |want| for bf16)        | (gamma_300 = 1.8e-5) on dz's own fp32 error and the
 *  |                          |                                              | logits' error (~1e-6 relative)
 *  | sparse vs full path      | the sum of both bounds                       | both within their bound of the reference
 *  | FD of the reference      | 1e-8 + 1e-6 relative, h = 1e-5 (double)      | truncation O(h^2), cancellation O(2^-53 / h)
 *  | FD of the library        | 2e-3 (1 + |loss|) + 2e-2 relative, h = 1e-2  | fp32 loss rounding / h (test_distill_logits)
 *  | 1 vs 2 threads, no-grad  | bitwise                                      | fixed-order reductions by design (kdloss.h)
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "ref_fld.h"
#include "ref_rowx.h"
#include "ref_topk.h"
#include "reference.h"
#include "testutil.h"

#define U 0x1p-24
#define IGN (-7)

/* ------------------------------------------------------------------------------------------ */
/* cases                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef kdloss_div_params div_case;
static const div_case DIVS[] = KT_DIV_CASES_LOGITS_INIT;
#define NDIV ((int)(sizeof DIVS / sizeof DIVS[0]))

/* Tail modes a divergence runs with: bucket and renorm_both; renorm_teacher for forward KL. */
static int n_tails(const div_case *c) { return c->divergence == KDLOSS_DIV_FORWARD_KL ? 3 : 2; }

static const char *tail_name(int tail) { return kdloss_topk_tail_name((kdloss_topk_tail)tail); }

/* The largest error seen per kind of check, as a fraction of its bound (printed at the end: how
 * much room the bounds leave). */
enum { W_GRAD, W_GRAD16, W_LOSS, W_DENSE, W_FUSED_LOSS, W_FUSED_GRAD, W_KINDS };
static const char *W_NAMES[W_KINDS] = {"logits gradient (fp32)",
                                       ("logits gradient (bf16 / fp16: the cast alone may take "
                                        "all of 2^-8 / 2^-11 |want|)"),
                                       "logits (row) loss",
                                       "K = V vs dense", "fused losses and rows",
                                       "fused dxs / dws / dbs (fp32)"};
static double worst_seen[W_KINDS];
static double track(int kind, double got, double want, double tol) {
    if (isfinite(got) && isfinite(want) && tol > 0) {
        double r = fabs(got - want) / tol;
        if (r > worst_seen[kind]) worst_seen[kind] = r;
    }
    return got;
}
/* kt_close with absolute tolerance tol, recording the fraction of it used */
#define CLOSE(kind, got, want, tol, ...)                                                       \
    kt_close(track((kind), (got), (want), (tol)), (want), (tol), 0, __VA_ARGS__)

/* ------------------------------------------------------------------------------------------ */
/* inputs                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_topk: out of memory\n");
        exit(2);
    }
    return p;
}
#define DALLOC(n) ((double *)xmalloc(sizeof(double) * (size_t)(n)))

/* Student logits: log-probs of every row kind, scaled, and shifted per row (some near -1e4). */
static void gen_logits(kt_rng *rng, double *z, int64_t bt, int64_t v, int shift, double scale) {
    kt_gen_logprobs(rng, z, bt, v, 0, shift);
    for (int64_t r = 0; r < bt; r++) {
        double off = (r % 3 == 1) ? -1e4 + 17.0 * r : 5.0 * kt_normal(rng);
        for (int64_t c = 0; c < v; c++) z[r * v + c] = z[r * v + c] * scale + off;
    }
}

/* A sparse teacher and its packed copies. */
typedef struct teacher {
    int64_t bt, k;
    int64_t *ids;  /* bt x k, -1 = unused */
    double *lp;    /* bt x k, the values as the library reads them; NaN in unused slots */
    kdloss_dtype idt, ldt;
    int64_t ld_ids, ld_lp;
    void *pids, *plp;
} teacher;

static const double *g_sort_key;
static int by_key_desc(const void *a, const void *b) {
    double x = g_sort_key[*(const int64_t *)a], y = g_sort_key[*(const int64_t *)b];
    return x > y ? -1 : x < y ? 1 : (*(const int64_t *)a > *(const int64_t *)b) - (*(const int64_t *)a < *(const int64_t *)b);
}

/* From full teacher log-probs (bt x v): per row the K best ids (random_ids 0) or K random ids
 * (random_ids 1), placed in random slots (slots beyond V are -1); then each used slot but the
 * one holding the row's first pick becomes -1 with probability `unused`; row empty_row (if
 * >= 0) has every slot -1. ids packed as idt with ld k + pad (padding -2, an invalid id: the
 * library must not read it), log-probs rounded to ldt and packed with ld k + pad + 1. */
static void teacher_make(teacher *t, kt_rng *rng, const double *full, int64_t bt, int64_t v,
                         int64_t k, int random_ids, double unused, int64_t empty_row,
                         kdloss_dtype idt, kdloss_dtype ldt, int64_t pad) {
    t->bt = bt, t->k = k, t->idt = idt, t->ldt = ldt;
    t->ids = xmalloc(sizeof(int64_t) * (size_t)(bt * k));
    t->lp = DALLOC(bt * k);
    int64_t *order = xmalloc(sizeof(int64_t) * (size_t)v), *slot = xmalloc(sizeof(int64_t) * (size_t)k);
    for (int64_t r = 0; r < bt; r++) {
        const double *f = full + r * v;
        for (int64_t c = 0; c < v; c++) order[c] = c;
        if (random_ids) {
            for (int64_t c = v - 1; c > 0; c--) {
                int64_t j = kt_randint(rng, c + 1), tmp = order[c];
                order[c] = order[j], order[j] = tmp;
            }
        } else {
            g_sort_key = f;
            qsort(order, (size_t)v, sizeof(int64_t), by_key_desc);
        }
        for (int64_t s = 0; s < k; s++) slot[s] = s;
        for (int64_t s = k - 1; s > 0; s--) {
            int64_t j = kt_randint(rng, s + 1), tmp = slot[s];
            slot[s] = slot[j], slot[j] = tmp;
        }
        int64_t *ids = t->ids + r * k;
        double *lp = t->lp + r * k;
        for (int64_t s = 0; s < k; s++) ids[s] = -1;
        int64_t m = k < v ? k : v;
        for (int64_t i = 0; i < m; i++) ids[slot[i]] = order[i];
        for (int64_t i = 1; i < m; i++)
            if (kt_uniform(rng) < unused) ids[slot[i]] = -1;
        if (r == empty_row)
            for (int64_t s = 0; s < k; s++) ids[s] = -1;
        for (int64_t s = 0; s < k; s++) lp[s] = ids[s] >= 0 ? f[ids[s]] : NAN;
    }
    kt_round_to(t->lp, bt * k, ldt);
    for (int64_t i = 0; i < bt * k; i++)
        if (t->ids[i] < 0) t->lp[i] = NAN;
    t->ld_ids = k + pad;
    t->ld_lp = k + pad + (pad ? 1 : 0);
    size_t es = kdloss_dtype_size(idt);
    t->pids = xmalloc((size_t)(bt * t->ld_ids) * es);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t s = 0; s < t->ld_ids; s++) {
            int64_t id = s < k ? t->ids[r * k + s] : -2;
            if (idt == KDLOSS_I32) ((int32_t *)t->pids)[r * t->ld_ids + s] = (int32_t)id;
            else ((int64_t *)t->pids)[r * t->ld_ids + s] = id;
        }
    t->plp = kt_pack(t->lp, bt, k, t->ld_lp, ldt);
    free(order), free(slot);
}

static void teacher_free(teacher *t) {
    free(t->ids), free(t->lp), free(t->pids), free(t->plp);
    memset(t, 0, sizeof *t);
}

static kdloss_topk_teacher teacher_view(const teacher *t) {
    kdloss_topk_teacher v = {t->k, {t->pids, t->idt, t->ld_ids}, {t->plp, t->ldt, t->ld_lp}};
    return v;
}

/* log_softmax of each row of z (bt x v) at temperature t, in double. */
static void log_softmax_rows(const double *z, int64_t bt, int64_t v, double t, double *out) {
    for (int64_t r = 0; r < bt; r++) ref_log_softmax(z + r * v, v, t, out + r * v);
}

/* The padding columns [cols, ld) of every row still hold kt_poison's pattern. */
static int padding_intact(const void *m, kdloss_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    size_t es = kdloss_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++)
        if (!kt_is_poison((const char *)m + (size_t)(r * ld + cols) * es, ld - cols, dt)) return 0;
    return 1;
}

/* Row r of a packed (ld) matrix is all exact zeros. */
static int row_zero(const void *m, kdloss_dtype dt, int64_t ld, int64_t r, int64_t cols) {
    for (int64_t c = 0; c < cols; c++)
        if (kt_get(m, dt, ld, r, c) != 0.0) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* 1. kdloss_topk_distill_logits vs the reference                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct logits_case {
    const div_case *dc;
    int tail;
    int64_t bt, v, k;
    int pad;
    double t, grad_scale;
    kdloss_dtype xdt, ldt, idt;
    int label_mode; /* 0 none, 1 some ignored, 2 all ignored; labels' dtype differs from the ids' */
    int random_ids, unused_mode;
} logits_case;

static void check_logits(const logits_case *lc, kt_rng *rng, const char *isa) {
    const div_case *dc = lc->dc;
    int64_t bt = lc->bt, v = lc->v, k = lc->k;
    int64_t ldx = v + (lc->pad ? 5 : 0);
    kdloss_dtype xdt = lc->xdt;
    double *zs = DALLOC(bt * v), *full = DALLOC(bt * v);
    int shift = (int)kt_randint(rng, KT_ROW_KINDS);
    gen_logits(rng, zs, bt, v, shift, 1.0 + kt_uniform(rng));
    kt_round_to(zs, bt * v, xdt);
    void *x = kt_pack(zs, bt, v, ldx, xdt);
    int allow_ninf = !lc->random_ids && !kt_div_rev_like(dc);
    kt_gen_logprobs(rng, full, bt, v, allow_ninf, shift + 2);
    teacher te;
    teacher_make(&te, rng, full, bt, v, k, lc->random_ids, lc->unused_mode ? 0.25 : 0.0,
                 lc->unused_mode && bt > 2 ? 2 : -1, lc->idt, lc->ldt, lc->pad ? 2 : 0);
    kdloss_dtype labdt = lc->idt == KDLOSS_I32 ? KDLOSS_I64 : KDLOSS_I32;
    int64_t *lab64 = xmalloc(sizeof(int64_t) * (size_t)bt);
    int32_t *lab32 = xmalloc(sizeof(int32_t) * (size_t)bt);
    for (int64_t r = 0; r < bt; r++) {
        lab64[r] = lc->label_mode == 2 || (lc->label_mode == 1 && kt_uniform(rng) < 0.3)
                       ? IGN
                       : kt_randint(rng, v);
        lab32[r] = (int32_t)lab64[r];
    }
    kdloss_labels labels = {NULL, labdt};
    if (lc->label_mode) labels.data = labdt == KDLOSS_I32 ? (const void *)lab32 : (const void *)lab64;

    kdloss_topk_distill_params p;
    kdloss_topk_distill_params_default(&p);
    p.div = *dc;
    p.tail = (kdloss_topk_tail)lc->tail;
    p.temperature = lc->t;
    p.ignore_index = IGN;
    p.grad_scale = lc->grad_scale;
    /* per-row weights in two cases of three, the entropy in one of two (docs/MATH.md 12) */
    float *w = kt_randint(rng, 3) ? xmalloc(sizeof(float) * (size_t)bt) : NULL;
    float *ent = kt_randint(rng, 2) ? xmalloc(sizeof(float) * (size_t)bt) : NULL;
    if (w) kt_gen_row_weights(rng, w, bt);
    if (ent) kt_poison(ent, bt, KDLOSS_F32);
    p.row_weights = w;
    p.row_entropy = ent;
    size_t es = kdloss_dtype_size(xdt);
    void *g = xmalloc((size_t)(bt * ldx) * es);
    float *rows = xmalloc(sizeof(float) * (size_t)bt), loss = NAN;
    kt_poison(g, bt * ldx, xdt);
    kt_poison(rows, bt, KDLOSS_F32);
    kdloss_cmat cx = {x, xdt, ldx};
    kdloss_topk_teacher tv = teacher_view(&te);
    /* every input is const: snapshots of the packed student and teacher */
    size_t xbytes = (size_t)(bt * ldx) * kdloss_dtype_size(xdt);
    size_t ibytes = (size_t)(bt * te.ld_ids) * kdloss_dtype_size(te.idt);
    size_t lbytes = (size_t)(bt * te.ld_lp) * kdloss_dtype_size(te.ldt);
    void *x_snap = xmalloc(xbytes), *i_snap = xmalloc(ibytes), *l_snap = xmalloc(lbytes);
    memcpy(x_snap, x, xbytes), memcpy(i_snap, te.pids, ibytes), memcpy(l_snap, te.plp, lbytes);
    kdloss_status st = kdloss_topk_distill_logits(&p, bt, v, cx, tv, labels, &loss, rows,
                                                  (kdloss_mat){g, xdt, ldx});
    char tag[320];
    snprintf(tag, sizeof tag,
             "logits %s %s beta=%g alpha=%g tail=%s T=%g gs=%g x=%s lp=%s ids=%s labels=%d "
             "v=%lld k=%lld bt=%lld %s unused=%d pad=%d w=%d ent=%d",
             isa, kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, tail_name(lc->tail), lc->t,
             lc->grad_scale, kt_dtype_name(xdt), kt_dtype_name(lc->ldt), kt_dtype_name(lc->idt),
             lc->label_mode, (long long)v, (long long)k, (long long)bt,
             lc->random_ids ? "random-ids" : "top-ids", lc->unused_mode, lc->pad, w != NULL,
             ent != NULL);
    if (KT_CHECK(st == KDLOSS_OK, "%s: %s", tag, kdloss_status_string(st))) {
        int64_t nv = 0;
        for (int64_t r = 0; r < bt; r++)
            nv += (!lc->label_mode || lab64[r] != IGN) && (!w || w[r] != 0.0f);
        double denom = nv ? (double)nv : 1.0, total = 0.0, ttol = 0.0;
        double geps = xdt == KDLOSS_F32 ? 0.0 : kt_eps(xdt), sc = p.grad_scale / denom;
        double *dz = DALLOC(v), *dm = DALLOC(v), *dcn = DALLOC(v);
        kdloss_div_params d = *dc;
        int bad = 0;
        for (int64_t r = 0; r < bt; r++) {
            int ign = (lc->label_mode && lab64[r] == IGN) || (w && w[r] == 0.0f);
            double wr = w ? (double)w[r] : 1.0; /* a kept row's weight */
            if (ent) { /* over all V, whatever the teacher's slots */
                double etol, h = ign ? 0.0 : ref_entropy(zs + r * v, v, lc->t, &etol);
                if (ign) KT_CHECK(ent[r] == 0.0f, "%s entropy[%lld] of an ignored row %g", tag,
                                  (long long)r, ent[r]);
                else kt_close(ent[r], h, etol, 0, "%s entropy[%lld]", tag, (long long)r);
            }
            ref_topk_row_out ro = {0.0, 0.0, 0.0, 0, 0};
            if (!ign)
                ro = ref_topk_row(&d, p.tail, zs + r * v, v, te.ids + r * k, te.lp + r * k, k,
                                  lc->t, dz, dm, dcn);
            if (ign || ro.n_used == 0) { /* ignored rows and rows without a used slot: exact 0 */
                KT_CHECK(rows[r] == 0.0f && row_zero(g, xdt, ldx, r, v),
                         "%s: row %lld (%s) not exactly 0 (row loss %g)", tag, (long long)r,
                         ign ? "ignored" : "no used slot", rows[r]);
                continue;
            }
            for (int64_t c = 0; c < v; c++) {
                /* the row's gradient times its weight; an exp that underflows inside the
                 * kernel (an absolute 2^-149) is scaled by the weight too, hence kt_tiny w */
                double want = dz[c] * sc * wr, got = kt_get(g, xdt, ldx, r, c);
                double gtol = (64 * U * dm[c] + dcn[c]) * fabs(sc) * wr + geps * fabs(want) +
                              kt_tiny(xdt) * fmax(1.0, wr);
                /* a large weight can take an fp16 gradient past its range: inf, as any fp16 */
                int ovf = xdt == KDLOSS_F16 && isinf(got) && (got > 0) == (want > 0) &&
                          fabs(want) + gtol >= 65504.0;
                if (!ovf && bad < 3 && !CLOSE(xdt == KDLOSS_F32 ? W_GRAD : W_GRAD16, got, want, gtol,
                                         "%s grad[%lld,%lld]", tag, (long long)r, (long long)c))
                    bad++;
            }
            double rtol = 256 * U * ro.mag + ro.cond + 1e-30;
            CLOSE(W_LOSS, rows[r], ro.loss, rtol, "%s row_loss[%lld] (|S| %d, tail bin %d)", tag,
                     (long long)r, ro.n_used, ro.has_tail);
            total += wr * ro.loss, ttol += wr * rtol; /* row_loss unweighted, the total not */
        }
        CLOSE(W_LOSS, loss, total / denom, ttol / denom + 1e-30, "%s loss", tag);
        if (lc->label_mode == 2) KT_CHECK(loss == 0.0f, "%s: all ignored gives %g", tag, loss);
        KT_CHECK(ldx == v || padding_intact(g, xdt, bt, v, ldx), "%s: gradient padding written", tag);
        free(dz), free(dm), free(dcn);

        /* no gradient: the same losses (and entropies) bitwise; in place: the same gradient */
        float l2 = NAN, *rows2 = xmalloc(sizeof(float) * (size_t)bt);
        float *ent2 = ent ? xmalloc(sizeof(float) * (size_t)bt) : NULL;
        p.row_entropy = ent2;
        st = kdloss_topk_distill_logits(&p, bt, v, cx, tv, labels, &l2, rows2,
                                        (kdloss_mat){NULL, xdt, 0});
        KT_CHECK(st == KDLOSS_OK && !memcmp(&l2, &loss, 4) &&
                     !memcmp(rows2, rows, sizeof(float) * (size_t)bt),
                 "%s: losses without the gradient differ", tag);
        KT_CHECK(!ent || !memcmp(ent2, ent, sizeof(float) * (size_t)bt),
                 "%s: entropies without the gradient differ", tag);
        p.row_entropy = ent;
        free(ent2);
        KT_CHECK(!memcmp(x_snap, x, xbytes) && !memcmp(i_snap, te.pids, ibytes) &&
                     !memcmp(l_snap, te.plp, lbytes),
                 "%s: an input was written (student %d, ids %d, logprobs %d)", tag,
                 memcmp(x_snap, x, xbytes) != 0, memcmp(i_snap, te.pids, ibytes) != 0,
                 memcmp(l_snap, te.plp, lbytes) != 0);
        memcpy(x, x_snap, xbytes); /* the in-place call starts from the intended logits */
        st = kdloss_topk_distill_logits(&p, bt, v, cx, tv, labels, NULL, NULL,
                                        (kdloss_mat){x, xdt, ldx});
        int same = st == KDLOSS_OK;
        for (int64_t r = 0; r < bt && same; r++)
            same = !memcmp((char *)x + r * ldx * es, (char *)g + r * ldx * es, (size_t)v * es);
        KT_CHECK(same, "%s: in place differs", tag);
        free(rows2);
    }
    teacher_free(&te);
    free(zs), free(full), free(x), free(lab64), free(lab32), free(g), free(rows);
    free(x_snap), free(i_snap), free(l_snap), free(w), free(ent);
}

/* The grid on one CPU path: the case grid of tests/support/cases.h (divergence x V x student
 * dtype; the CUDA test runs the same grid) x every tail the divergence takes x K, the other
 * parameters cycled so that each value meets each divergence, tail and shape. */
static void grid_logits(kt_rng *rng, const char *isa) {
    static const double GS[] = {2.0, 0.5, -1.5};
    int n = 0;
    KT_FOR_EACH_CASE(c) { /* quick: V up to 1100 */
        const int i = c.div, vi = c.shape, xi = c.n % 3; /* c.ds is KT_DTYPES[xi] */
        for (int tail = 0; tail < n_tails(&c.d); tail++) {
            const int64_t ks[4] = {1, 8, 64, c.v};
            const int nk = c.v == 9 ? 4 : 3; /* K = V: V = 9 (V = 1 is K = 1) */
            for (int ki = 0; ki < nk; ki++, n++) {
                /* quick (sanitizer) runs: one student dtype per combination, all three across
                 * the grid */
                if (kt_quick() && (xi + ki + vi + tail) % 3 != i % 3) continue;
                logits_case lc;
                lc.dc = &c.d;
                lc.tail = tail;
                lc.bt = c.bt;
                lc.v = c.v;
                lc.k = ks[ki];
                lc.pad = (i + vi + ki + xi) % 2;
                lc.t = KT_TEMPS[(i + tail + vi + xi + ki) % 3];
                lc.grad_scale = GS[n % 3];
                lc.xdt = c.ds;
                lc.ldt = KT_DTYPES[(xi + vi + ki + tail) % 3];
                lc.idt = (i + ki + xi) % 2 ? KDLOSS_I64 : KDLOSS_I32;
                lc.label_mode = (i + 2 * vi + xi + ki + tail) % 3;
                lc.random_ids = (vi + xi + ki + i / 2) % 3 == 0;
                /* K = V with every slot used: S holds every id, no tail bin */
                lc.unused_mode = lc.k == lc.v ? 0 : (i + xi + ki + tail) % 2;
                check_logits(&lc, rng, isa);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* 2. K = V, bucket: the dense divergence                                                      */
/* ------------------------------------------------------------------------------------------ */

/* With every id in S there is no tail bin (MATH.md 8), so the bucket's loss is the dense
 * divergence of the teacher's log-probs: kdloss_distill_logits with teacher logits T lp (T = 1
 * and 2, exact in fp32), which renormalizes them by lse(lp) (about u for fp32 log-probs). Ids in
 * a random slot order per row. Every divergence case. */
static void check_dense(kt_rng *rng) {
    static const int64_t VS[] = {9, 1100};
    for (int i = 0; i < NDIV; i++)
        for (int vi = 0; vi < 2; vi++) {
            const div_case *dc = &DIVS[i];
            int64_t bt = 6, v = VS[vi], k = v;
            double t = (i + vi) % 2 ? 2.0 : 1.0;
            double *zs = DALLOC(bt * v), *full = DALLOC(bt * v), *tl = DALLOC(bt * v);
            gen_logits(rng, zs, bt, v, i, 1.0 + kt_uniform(rng));
            kt_round_to(zs, bt * v, KDLOSS_F32);
            kt_gen_logprobs(rng, full, bt, v, 0, i + 1);
            teacher te;
            teacher_make(&te, rng, full, bt, v, k, 1, 0.0, -1, KDLOSS_I64, KDLOSS_F32, 0);
            for (int64_t r = 0; r < bt; r++)
                for (int64_t s = 0; s < k; s++) tl[r * v + te.ids[r * k + s]] = te.lp[r * k + s] * t;
            float *z32 = kt_pack(zs, bt, v, v, KDLOSS_F32), *t32 = kt_pack(tl, bt, v, v, KDLOSS_F32);
            float *g1 = xmalloc(sizeof(float) * (size_t)(bt * v)), *g2 = xmalloc(sizeof(float) * (size_t)(bt * v));
            float r1[6], r2[6], l1 = NAN, l2 = NAN;
            kdloss_labels nol = {NULL, KDLOSS_I64};
            kdloss_topk_distill_params p;
            kdloss_topk_distill_params_default(&p);
            p.div = *dc;
            p.temperature = t;
            kdloss_distill_logits_params pd;
            kdloss_distill_logits_params_default(&pd);
            pd.div = *dc;
            pd.temperature = t;
            kdloss_status s1 = kdloss_topk_distill_logits(&p, bt, v, (kdloss_cmat){z32, KDLOSS_F32, 0},
                                                          teacher_view(&te), nol, &l1, r1,
                                                          (kdloss_mat){g1, KDLOSS_F32, 0});
            kdloss_status s2 = kdloss_distill_logits(&pd, bt, v, (kdloss_cmat){z32, KDLOSS_F32, 0},
                                                     (kdloss_cmat){t32, KDLOSS_F32, 0}, nol, &l2,
                                                     r2, (kdloss_mat){g2, KDLOSS_F32, 0});
            char tag[160];
            snprintf(tag, sizeof tag, "K=V bucket vs dense %s beta=%g alpha=%g v=%lld T=%g",
                     kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, (long long)v, t);
            if (KT_CHECK(s1 == KDLOSS_OK && s2 == KDLOSS_OK, "%s: status %d %d", tag, s1, s2)) {
                kdloss_div_params d = *dc;
                double *dz = DALLOC(v), *dm = DALLOC(v), *dcn = DALLOC(v), ltol = 0.0;
                int bad = 0;
                for (int64_t r = 0; r < bt; r++) {
                    ref_topk_row_out ro = ref_topk_row(&d, KDLOSS_TAIL_BUCKET, zs + r * v, v,
                                                       te.ids + r * k, te.lp + r * k, k, t, dz, dm, dcn);
                    KT_CHECK(!ro.has_tail && ro.n_used == v, "%s: S holds every id", tag);
                    double m = -INFINITY, s = 0.0; /* lse(lp): the dense call's renormalization */
                    for (int64_t c = 0; c < k; c++) m = fmax(m, te.lp[r * k + c]);
                    for (int64_t c = 0; c < k; c++) s += exp(te.lp[r * k + c] - m);
                    double shift = fabs(m + log(s));
                    double rt = (512 * U + shift) * ro.mag + 2 * ro.cond + 1e-30;
                    CLOSE(W_DENSE, r1[r], r2[r], rt, "%s row_loss[%lld]", tag, (long long)r);
                    ltol += rt;
                    for (int64_t c = 0; c < v; c++) {
                        double gt = (128 * U + shift) * dm[c] / bt + 2 * dcn[c] / bt + 0x1p-147;
                        if (bad < 3 && !CLOSE(W_DENSE, g1[r * v + c], g2[r * v + c], gt,
                                                 "%s grad[%lld,%lld]", tag, (long long)r, (long long)c))
                            bad++;
                    }
                }
                CLOSE(W_DENSE, l1, l2, ltol / bt, "%s loss", tag);
                free(dz), free(dm), free(dcn);
            }
            teacher_free(&te);
            free(zs), free(full), free(tl), free(z32), free(t32), free(g1), free(g2);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* 4. finite differences                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Central differences of the reference's loss (double, h = 1e-5) against its chain-rule
 * gradient, and of the library's loss (fp32, h = 1e-2) against the library's gradient, for every
 * (divergence, tail mode) but TVD (kinks within h). Rows: K best ids; K - 1 of them and an unused
 * slot; K random ids. V = 7 with K = 4 (a tail bin), and V = K = 4 (none). */
static void check_finite_differences(kt_rng *rng) {
    enum { BT = 3, VMAX = 7, K = 4 };
    const double ts[] = {1.0, 2.5, 0.5};
    int n = 0;
    for (int i = 0; i < NDIV; i++)
        for (int tail = 0; tail < n_tails(&DIVS[i]); tail++)
            for (int vv = 0; vv < 2; vv++, n++) {
                const div_case *dc = &DIVS[i];
                if (dc->divergence == KDLOSS_DIV_TVD) continue;
                int64_t v = vv ? K : VMAX;
                kdloss_div_params d = *dc;
                double t = ts[n % 3];
                double zd[BT * VMAX], full[BT * VMAX], dz[VMAX], dd[VMAX], dzm[VMAX], dzc[VMAX];
                kt_gen_logprobs(rng, zd, BT, v, 0, n);
                kt_gen_logprobs(rng, full, BT, v, 0, n + 2);
                for (int c = 0; c < BT * v; c++) zd[c] = (float)(2.0 * zd[c]);
                teacher te;
                teacher_make(&te, rng, full, BT, v, K, 0, 0.0, -1, KDLOSS_I32, KDLOSS_F32, 0);
                /* row 1: one unused slot; row 2: random ids */
                for (int s = 0; s < K; s++)
                    if (te.ids[K + s] >= 0 && te.ids[K + s] != te.ids[K]) {
                        te.ids[K + s] = -1, te.lp[K + s] = NAN;
                        ((int32_t *)te.pids)[K + s] = -1;
                        ((float *)te.plp)[K + s] = NAN;
                        break;
                    }
                teacher tr;
                teacher_make(&tr, rng, full, BT, v, K, 1, 0.0, -1, KDLOSS_I32, KDLOSS_F32, 0);
                for (int s = 0; s < K; s++) {
                    te.ids[2 * K + s] = tr.ids[2 * K + s], te.lp[2 * K + s] = tr.lp[2 * K + s];
                    ((int32_t *)te.pids)[2 * K + s] = (int32_t)tr.ids[2 * K + s];
                    ((float *)te.plp)[2 * K + s] = (float)tr.lp[2 * K + s];
                }
                teacher_free(&tr);
                float z[BT * VMAX], zc[BT * VMAX], g[BT * VMAX], l0 = NAN, lp = NAN, lm = NAN;
                for (int c = 0; c < BT * v; c++) z[c] = (float)zd[c];
                kdloss_topk_distill_params p;
                kdloss_topk_distill_params_default(&p);
                p.div = d;
                p.tail = (kdloss_topk_tail)tail;
                p.temperature = t;
                kdloss_labels nol = {NULL, KDLOSS_I64};
                kdloss_cmat a = {z, KDLOSS_F32, 0}, ac = {zc, KDLOSS_F32, 0};
                kdloss_topk_teacher tv = teacher_view(&te);
                kdloss_mat nomat = {NULL, KDLOSS_F32, 0};
                kdloss_status st = kdloss_topk_distill_logits(&p, BT, v, a, tv, nol, &l0, NULL,
                                                              (kdloss_mat){g, KDLOSS_F32, 0});
                char tag[160];
                snprintf(tag, sizeof tag, "%s beta=%g alpha=%g tail=%s T=%g v=%lld",
                         kdloss_divergence_name(dc->divergence), dc->beta, dc->alpha, tail_name(tail), t,
                         (long long)v);
                KT_CHECK(st == KDLOSS_OK, "FD %s: %s", tag, kdloss_status_string(st));
                for (int r = 0; r < BT; r++) {
                    const int64_t *ids = te.ids + r * K;
                    const double *lpr = te.lp + r * K;
                    double mag = ref_topk_row(&d, p.tail, zd + r * v, v, ids, lpr, K, t, dz, dzm, dzc).mag;
                    for (int c = 0; c < v; c++) {
                        int e = r * (int)v + c;
                        double h = 1e-3, keep = zd[e];
                        zd[e] = keep + h;
                        double fp = ref_topk_row(&d, p.tail, zd + r * v, v, ids, lpr, K, t, dd, NULL, NULL).loss;
                        zd[e] = keep - h;
                        double fm = ref_topk_row(&d, p.tail, zd + r * v, v, ids, lpr, K, t, dd, NULL, NULL).loss;
                        zd[e] = keep + 2 * h;
                        double fp2 = ref_topk_row(&d, p.tail, zd + r * v, v, ids, lpr, K, t, dd, NULL, NULL).loss;
                        zd[e] = keep - 2 * h;
                        double fm2 = ref_topk_row(&d, p.tail, zd + r * v, v, ids, lpr, K, t, dd, NULL, NULL).loss;
                        zd[e] = keep;
                        /* Richardson's fourth-order difference, so the step can be 1e-3: at 1e-5
                         * the double rounding of a row far below exp's range (logits near -2000,
                         * terms of size 1e4) exceeded the bound's estimate of it. Bound: that
                         * rounding (a few 2^-53 of the terms' size mag) times the stencil's
                         * 18 / 12h; the truncation (h^4 / 30 times the fifth derivative) is
                         * below 1e-11 at these temperatures */
                        double fd = (8 * (fp - fm) - (fp2 - fm2)) / (12 * h);
                        kt_close(dz[c], fd, 1e-8 + 8 * 0x1p-53 * mag * 1.5 / h, 1e-6,
                                 "reference FD %s [%d,%d]", tag, r, c);
                        /* the library on a fresh copy of the logits for each evaluation (its
                         * inputs must stay untouched; the grid checks that separately) */
                        float hf = 1e-2f;
                        memcpy(zc, z, sizeof z);
                        zc[e] = z[e] + hf;
                        kdloss_topk_distill_logits(&p, BT, v, ac, tv, nol, &lp, NULL, nomat);
                        memcpy(zc, z, sizeof z);
                        zc[e] = z[e] - hf;
                        kdloss_topk_distill_logits(&p, BT, v, ac, tv, nol, &lm, NULL, nomat);
                        double lfd = ((double)lp - lm) / (2.0 * hf);
                        kt_close(g[e], lfd, 2e-3 * (1 + fabs(l0)), 2e-2, "library FD %s [%d,%d]", tag, r, c);
                        /* + the gradient bound of the header table: where the teacher's tail
                         * 1 - sum_S P is tiny its log is ill-conditioned (dz_cond), which made
                         * reverse-KL-like bucket rows at small V fail about one run in 20 */
                        kt_close(g[e], dz[c] / BT, 1e-5 + (64 * 0x1p-24 * dzm[c] + dzc[c]) / BT, 1e-3,
                                 "library vs reference %s [%d,%d]", tag, r, c);
                    }
                }
                teacher_free(&te);
            }
}

/* ------------------------------------------------------------------------------------------ */
/* 3. kdloss_fused_linear_topk_distill vs the reference                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct fz_setup {
    kt_fld_problem p;   /* xs, ws, bs, labels (its teacher hidden layer is not used)           */
    teacher te;
    double *zs;         /* float64 logits xs ws^T + bs (bt x v)                                 */
    double *dzl;        /* [bt] bound on the fp32 logits' error in row r (see the table above) */
} fz_setup;

/* A problem: logits ~ N(0, 2.5^2); teacher logits 0.7 zs + N(0, 2^2), every third row peaked
 * (+12 on one column), log_softmax at T, top-k ids in random slots, 20% unused slots, row 4
 * without a used slot; rows r % ignore_every == 1 ignored. */
static void fz_make(fz_setup *f, kt_rng *rng, int64_t bt, int64_t hs, int64_t v, int64_t k,
                    kdloss_dtype dt, int bias, double t, kdloss_dtype idt, kdloss_dtype ldt,
                    int ignore_every) {
    kt_fld_problem_make(&f->p, rng, bt, hs, 2, v, dt, KDLOSS_F32, bias, 2.5, ignore_every, IGN, 3);
    f->zs = DALLOC(bt * v);
    kt_ref_logits(bt, hs, v, f->p.xs, f->p.ws, f->p.bias_s, f->zs);
    double *zt = DALLOC(bt * v), *full = DALLOC(bt * v);
    for (int64_t r = 0; r < bt; r++) {
        for (int64_t c = 0; c < v; c++) zt[r * v + c] = 0.7 * f->zs[r * v + c] + 2.0 * kt_normal(rng);
        if (r % 3 == 0) zt[r * v + kt_randint(rng, v)] += 12.0;
    }
    log_softmax_rows(zt, bt, v, t, full);
    teacher_make(&f->te, rng, full, bt, v, k, 0, 0.2, bt > 4 ? 4 : -1, idt, ldt, 1);
    f->dzl = DALLOC(bt);
    ref_topk_logit_err(bt, hs, v, f->p.xs, f->p.ws, f->p.bias_s, f->dzl);
    free(zt), free(full);
}

static void fz_free(fz_setup *f) {
    kt_fld_problem_free(&f->p);
    teacher_free(&f->te);
    free(f->zs), free(f->dzl);
}

enum {
    FZ_HARD = 1,       /* ask for hard_loss                                  */
    FZ_ROWSOFT = 2,    /* row_soft                                           */
    FZ_ROWHARD = 4,    /* row_hard                                           */
    FZ_ROWLSE = 8,     /* row_lse                                            */
    FZ_GRAD = 16,      /* dxs, dws (and dbs with a bias)                     */
    FZ_WORKSPACE = 32, /* the caller's workspace, of the queried size        */
    FZ_NOLABELS = 64,  /* labels.data = NULL                                 */
    FZ_LABEL32 = 128   /* I32 labels (I64 otherwise)                         */
};

typedef struct fz_out {
    kdloss_status st;
    float loss, soft, hard;
    float *row_soft, *row_hard, *row_lse;
    void *dxs, *dws, *dbs;
    int64_t ld_dxs, ld_dws;
} fz_out;

static void *poisoned(int64_t n, kdloss_dtype dt) {
    void *b = xmalloc((size_t)n * kdloss_dtype_size(dt) + 16);
    kt_poison(b, n, dt);
    return b;
}

static fz_out fz_run(const fz_setup *f, const kdloss_fused_linear_topk_distill_params *prm,
                     int flags) {
    const kt_fld_problem *p = &f->p;
    fz_out o;
    memset(&o, 0, sizeof o);
    kt_poison(&o.loss, 1, KDLOSS_F32);
    kt_poison(&o.soft, 1, KDLOSS_F32);
    kt_poison(&o.hard, 1, KDLOSS_F32);
    kdloss_fused_linear_distill_out out;
    memset(&out, 0, sizeof out);
    out.loss = &o.loss;
    out.soft_loss = &o.soft;
    if (flags & FZ_HARD) out.hard_loss = &o.hard;
    if (flags & FZ_ROWSOFT) out.row_soft = o.row_soft = poisoned(p->bt, KDLOSS_F32);
    if (flags & FZ_ROWHARD) out.row_hard = o.row_hard = poisoned(p->bt, KDLOSS_F32);
    if (flags & FZ_ROWLSE) out.row_lse = o.row_lse = poisoned(p->bt, KDLOSS_F32);
    if (flags & FZ_GRAD) {
        o.ld_dxs = p->hs + 2;
        o.ld_dws = p->hs + 1;
        o.dxs = poisoned(p->bt * o.ld_dxs, p->ds);
        o.dws = poisoned(p->v * o.ld_dws, p->ds);
        out.dxs = (kdloss_mat){o.dxs, p->ds, o.ld_dxs};
        out.dws = (kdloss_mat){o.dws, p->ds, o.ld_dws};
        if (p->bias_s) out.dbs = o.dbs = poisoned(p->v, p->ds);
    }
    kdloss_labels lab = {NULL, KDLOSS_I64};
    if (!(flags & FZ_NOLABELS)) {
        lab.dtype = flags & FZ_LABEL32 ? KDLOSS_I32 : KDLOSS_I64;
        lab.data = flags & FZ_LABEL32 ? (const void *)p->labels32 : (const void *)p->labels;
    }
    /* the caller's workspace: NaN throughout and in 64-byte guards on both sides, so a read of
     * workspace bytes the call did not write first, or of bytes outside it, shows as NaN; the
     * guards must be intact afterwards */
    enum { GUARD = 64 };
    unsigned char *wbuf = NULL;
    void *work = NULL;
    size_t work_bytes = 0;
    if (flags & FZ_WORKSPACE) {
        kdloss_status ws = kdloss_fused_linear_topk_distill_workspace_size(
            prm, p->bt, p->hs, p->v, f->te.k, p->ds, (flags & FZ_GRAD) != 0, &work_bytes);
        KT_CHECK(ws == KDLOSS_OK, "workspace size query: %s", kdloss_status_string(ws));
        wbuf = xmalloc(work_bytes + 2 * GUARD + 64);
        for (size_t b = 0; b + 4 <= work_bytes + 2 * GUARD + 64; b += 4) {
            float nan = NAN;
            memcpy(wbuf + b, &nan, 4);
        }
        work = wbuf + GUARD;
    }
    /* every input is const: snapshots */
    size_t es = kdloss_dtype_size(p->ds);
    const void *ins[] = {p->pxs, p->pws, p->pbias_s, f->te.pids, f->te.plp, p->labels, p->labels32};
    size_t insz[] = {(size_t)(p->bt * p->ld_xs) * es, (size_t)(p->v * p->ld_ws) * es,
                     p->pbias_s ? (size_t)p->v * es : 0,
                     (size_t)(p->bt * f->te.ld_ids) * kdloss_dtype_size(f->te.idt),
                     (size_t)(p->bt * f->te.ld_lp) * kdloss_dtype_size(f->te.ldt),
                     sizeof(int64_t) * (size_t)p->bt, sizeof(int32_t) * (size_t)p->bt};
    void *snap[7];
    for (int i = 0; i < 7; i++) snap[i] = xmalloc(insz[i]), memcpy(snap[i], ins[i] ? ins[i] : "", insz[i]);
    o.st = kdloss_fused_linear_topk_distill(prm, p->bt, p->hs, p->v,
                                            (kdloss_cmat){p->pxs, p->ds, p->ld_xs},
                                            (kdloss_cmat){p->pws, p->ds, p->ld_ws}, p->pbias_s,
                                            teacher_view(&f->te), lab, &out, work, work_bytes);
    int untouched = 1;
    for (int i = 0; i < 7; i++) untouched = untouched && (!insz[i] || !memcmp(snap[i], ins[i], insz[i])), free(snap[i]);
    KT_CHECK(untouched, "fused: an input was written");
    if (wbuf) {
        int intact = 1;
        for (size_t b = 0; b < GUARD; b += 4) {
            float lo, hi;
            memcpy(&lo, wbuf + b, 4), memcpy(&hi, wbuf + GUARD + ((work_bytes + 3) & ~(size_t)3) + b, 4);
            intact = intact && isnan(lo) && isnan(hi);
        }
        KT_CHECK(intact, "fused: bytes written outside the caller's workspace");
        free(wbuf);
    }
    return o;
}

static void fz_out_free(fz_out *o) {
    free(o->row_soft), free(o->row_hard), free(o->row_lse), free(o->dxs), free(o->dws), free(o->dbs);
    memset(o, 0, sizeof *o);
}

/* The reference of one configuration and its tolerances. */
typedef struct fz_ref {
    ref_topk_fused_out o;
    ref_topk_fused_row *rows;
    double tol_loss, tol_soft, tol_hard;
    double *tol_row_soft, *tol_row_hard, *tol_row_lse;
    double *dxs, *dws, *dbs, *txs, *tws, *tbs; /* gradients and their absolute tolerances */
} fz_ref;

static fz_ref fz_reference(const fz_setup *f, const kdloss_fused_linear_topk_distill_params *prm,
                           int flags) {
    const kt_fld_problem *p = &f->p;
    int64_t bt = p->bt, v = p->v, hs = p->hs;
    ref_topk_cfg c = {prm->div, prm->tail, prm->temperature, prm->weight_hard_loss,
                      prm->weight_soft_loss, prm->grad_scale, prm->t2_scale, prm->ignore_index};
    const int64_t *labels = flags & FZ_NOLABELS ? NULL : p->labels;
    fz_ref w;
    memset(&w, 0, sizeof w);
    w.rows = xmalloc(sizeof(ref_topk_fused_row) * (size_t)bt);
    double *dz = DALLOC(bt * v), *dm = DALLOC(bt * v), *dc = DALLOC(bt * v);
    ref_topk_fused(&c, bt, v, f->te.k, f->zs, f->te.ids, f->te.lp, labels, &w.o, w.rows, dz, dm, dc);
    w.tol_row_soft = DALLOC(bt), w.tol_row_hard = DALLOC(bt), w.tol_row_lse = DALLOC(bt);
    ref_topk_tols tt;
    ref_topk_fused_tols(&c, bt, v, f->zs, labels, &w.o, w.rows, f->dzl, &tt, w.tol_row_soft,
                        w.tol_row_hard, w.tol_row_lse);
    w.tol_loss = tt.loss, w.tol_soft = tt.soft, w.tol_hard = tt.hard;
    for (int64_t i = 0; i < bt * v; i++) dm[i] = 1e-4 * dm[i] + dc[i];
    w.dxs = DALLOC(bt * hs), w.dws = DALLOC(v * hs), w.dbs = DALLOC(v);
    w.txs = DALLOC(bt * hs), w.tws = DALLOC(v * hs), w.tbs = DALLOC(v);
    kt_ref_fld_grads(bt, hs, v, dz, p->xs, p->ws, 0, 1, w.dxs, w.dws, w.dbs);
    kt_ref_fld_grads(bt, hs, v, dm, p->xs, p->ws, 1, 1, w.txs, w.tws, w.tbs);
    /* A bf16 student whose backward GEMMs run natively (AUTO's choice where native bf16 measured
     * faster, as with AVX512_BF16) multiplies dZ rounded to bf16: 2^-8 |dz| an element more on
     * dxs and dws (docs/MATH.md 4, "bf16 operands"); dbs sums the fp32 dZ. */
    kdloss_bf16_gemm_info bi;
    if (p->ds == KDLOSS_BF16 && kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && bi.grad_native) {
        double *ex = DALLOC(bt * hs), *ew = DALLOC(v * hs), *eb = DALLOC(v);
        for (int64_t i = 0; i < bt * v; i++) dm[i] = 0x1p-8 * fabs(dz[i]);
        kt_ref_fld_grads(bt, hs, v, dm, p->xs, p->ws, 1, 1, ex, ew, eb);
        for (int64_t i = 0; i < bt * hs; i++) w.txs[i] += ex[i];
        for (int64_t i = 0; i < v * hs; i++) w.tws[i] += ew[i];
        free(ex), free(ew), free(eb);
    }
    free(dz), free(dm), free(dc);
    return w;
}

static void fz_ref_free(fz_ref *w) {
    double *all[] = {w->tol_row_soft, w->tol_row_hard, w->tol_row_lse, w->dxs, w->dws, w->dbs, w->txs, w->tws, w->tbs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(w->rows);
}

/* got (rows x cols, ld, dt) vs want within tol (absolute, per element) + rtol |want| + 1e-30;
 * one check per matrix, the worst element reported. */
static void cmp_mat(const char *ctx, const char *name, const void *got, kdloss_dtype dt, int64_t ld,
                    const double *want, const double *tol, double scale_tol, int64_t rows,
                    int64_t cols, double rtol) {
    int64_t bad = 0, wr = 0, wc = 0;
    double worst = -1.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double g = kt_get(got, dt, ld, r, c), w = want[r * cols + c];
            double lim = scale_tol * tol[r * cols + c] + rtol * fabs(w) + 1e-30;
            double err = fabs(g - w) / lim;
            if (!(err <= 1.0)) bad++;
            if (!(err <= worst)) worst = err, wr = r, wc = c;
        }
    if (dt == KDLOSS_F32 && worst > worst_seen[W_FUSED_GRAD]) worst_seen[W_FUSED_GRAD] = worst;
    KT_CHECK(bad == 0, "%s %s: %lld of %lld elements off; worst (%lld,%lld) got %.9g want %.9g tol %.3g (%.3g of it)",
             ctx, name, (long long)bad, (long long)(rows * cols), (long long)wr, (long long)wc,
             kt_get(got, dt, ld, wr, wc), want[wr * cols + wc],
             scale_tol * tol[wr * cols + wc] + rtol * fabs(want[wr * cols + wc]), worst);
}

/* One library result against the reference; tol_scale 2 when comparing two library results
 * (each within its bound). `want` may be another library result's values instead of the
 * reference: then pass them through `alt` (NULL: the reference). */
static void fz_check(const char *ctx, const fz_setup *f, const fz_ref *w, const fz_out *o, int flags,
                     const fz_out *alt) {
    const kt_fld_problem *p = &f->p;
    if (!KT_CHECK(o->st == KDLOSS_OK, "%s: %s", ctx, kdloss_status_string(o->st))) return;
    double ts = alt ? 2.0 : 1.0;
    CLOSE(W_FUSED_LOSS, o->loss, alt ? alt->loss : w->o.loss, ts * w->tol_loss, "%s loss", ctx);
    CLOSE(W_FUSED_LOSS, o->soft, alt ? alt->soft : w->o.soft, ts * w->tol_soft, "%s soft_loss", ctx);
    if (flags & FZ_HARD) CLOSE(W_FUSED_LOSS, o->hard, alt ? alt->hard : w->o.hard, ts * w->tol_hard, "%s hard_loss", ctx);
    for (int64_t r = 0; r < p->bt; r++) {
        if (o->row_soft)
            CLOSE(W_FUSED_LOSS, o->row_soft[r], alt ? alt->row_soft[r] : w->rows[r].soft, ts * w->tol_row_soft[r] + 1e-30,
                     "%s row_soft[%lld]", ctx, (long long)r);
        if (o->row_hard)
            CLOSE(W_FUSED_LOSS, o->row_hard[r], w->rows[r].hard, w->tol_row_hard[r] + 1e-30, "%s row_hard[%lld]", ctx, (long long)r);
        if (o->row_lse)
            CLOSE(W_FUSED_LOSS, o->row_lse[r], w->rows[r].lse, w->tol_row_lse[r] + 1e-30, "%s row_lse[%lld]", ctx, (long long)r);
    }
    if (!o->dxs) return;
    double rt = p->ds == KDLOSS_BF16 ? 0x1p-8 : 0.0; /* one cast to bf16 */
    if (alt) { /* library vs library: both within their bounds, two casts */
        double *a = DALLOC(p->bt * p->hs), *b = DALLOC(p->v * p->hs), *c = DALLOC(p->v);
        for (int64_t r = 0; r < p->bt; r++)
            for (int64_t h = 0; h < p->hs; h++) a[r * p->hs + h] = kt_get(alt->dxs, p->ds, alt->ld_dxs, r, h);
        for (int64_t r = 0; r < p->v; r++)
            for (int64_t h = 0; h < p->hs; h++) b[r * p->hs + h] = kt_get(alt->dws, p->ds, alt->ld_dws, r, h);
        for (int64_t r = 0; r < p->v && alt->dbs; r++) c[r] = kt_get(alt->dbs, p->ds, 0, 0, r);
        cmp_mat(ctx, "dxs vs", o->dxs, p->ds, o->ld_dxs, a, w->txs, 2.0, p->bt, p->hs, 2 * rt);
        cmp_mat(ctx, "dws vs", o->dws, p->ds, o->ld_dws, b, w->tws, 2.0, p->v, p->hs, 2 * rt);
        if (o->dbs) cmp_mat(ctx, "dbs vs", o->dbs, p->ds, p->v, c, w->tbs, 2.0, 1, p->v, 2 * rt);
        free(a), free(b), free(c);
    } else {
        cmp_mat(ctx, "dxs", o->dxs, p->ds, o->ld_dxs, w->dxs, w->txs, 1.0, p->bt, p->hs, rt);
        cmp_mat(ctx, "dws", o->dws, p->ds, o->ld_dws, w->dws, w->tws, 1.0, p->v, p->hs, rt);
        if (o->dbs) cmp_mat(ctx, "dbs", o->dbs, p->ds, p->v, w->dbs, w->tbs, 1.0, 1, p->v, rt);
    }
    KT_CHECK(padding_intact(o->dxs, p->ds, p->bt, p->hs, o->ld_dxs) &&
                 padding_intact(o->dws, p->ds, p->v, p->hs, o->ld_dws),
             "%s: gradient padding written", ctx);
}

/* The losses and row outputs of two calls bitwise equal; the first difference is printed. */
static int fz_same_losses(const fz_out *a, const fz_out *b, int64_t bt, int flags) {
    if (a->st != KDLOSS_OK || b->st != KDLOSS_OK) return 0;
    const float *pa[] = {&a->loss, &a->soft, &a->hard, a->row_soft, a->row_hard, a->row_lse};
    const float *pb[] = {&b->loss, &b->soft, &b->hard, b->row_soft, b->row_hard, b->row_lse};
    static const char *names[] = {"loss", "soft_loss", "hard_loss", "row_soft", "row_hard", "row_lse"};
    for (int i = 0; i < 6; i++) {
        if (i == 2 && !(flags & FZ_HARD)) continue;
        if (!pa[i] || !pb[i]) continue;
        int64_t n = i < 3 ? 1 : bt;
        for (int64_t r = 0; r < n; r++)
            if (memcmp(&pa[i][r], &pb[i][r], 4)) {
                printf("  %s[%lld]: %.9g vs %.9g\n", names[i], (long long)r, pa[i][r], pb[i][r]);
                return 0;
            }
    }
    return 1;
}

static void grid_fused(kt_rng *rng) {
    kdloss_cpu_isa isas[KDLOSS_ISA_COUNT];
    int nisa = 0;
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++)
        if (kdloss_cpu_isa_supported((kdloss_cpu_isa)i)) isas[nisa++] = (kdloss_cpu_isa)i;
    static const int64_t chunks[] = {3, 16, 0, 0};
    static const double TS[] = {1.0, 2.0, 0.7}, GS[] = {1.0, 0.75, -2.5}, WH[] = {0.5, 0.0, 1.0};
    const kdloss_dtype ldts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    int n = 0;
    for (int i = 0; i < NDIV; i++)
        for (int tail = 0; tail < n_tails(&DIVS[i]); tail++)
            for (int di = 0; di < 2; di++, n++) {
                if (kt_quick() && n % 3) continue;
                const div_case *dc = &DIVS[i];
                kdloss_dtype dt = di ? KDLOSS_BF16 : KDLOSS_F32;
                int small = n % 5 == 2;
                int64_t bt = small ? 7 : 13, hs = small ? 8 : 24, v = small ? 9 : 300;
                int64_t k = small ? (n % 2 ? 9 : 12) : (n % 2 ? 16 : 8);
                int bias = (n + di) % 2;
                double t = TS[(n + tail) % 3];
                int flags = FZ_GRAD | FZ_ROWSOFT | FZ_ROWLSE;
                if (n % 4 == 1) flags |= FZ_NOLABELS;
                else flags |= FZ_HARD | FZ_ROWHARD | (n % 3 == 0 ? FZ_LABEL32 : 0);
                if (n % 6 == 5) flags |= FZ_WORKSPACE;
                kdloss_fused_linear_topk_distill_params prm;
                kdloss_fused_linear_topk_distill_params_default(&prm);
                prm.div = *dc;
                prm.tail = (kdloss_topk_tail)tail;
                prm.temperature = t;
                prm.weight_hard_loss = flags & FZ_NOLABELS ? 0.0 : WH[n % 3];
                prm.weight_soft_loss = (n / 2) % 2 ? 0.5 : 1.0;
                prm.t2_scale = (n / 3) % 2;
                prm.ignore_index = IGN;
                prm.chunk_size = chunks[n % 4];
                /* automatic chunk under a small budget: 16 KiB holds the fixed buffers (~5 KiB at V 300)
                 * and about 5 rows of ~2 KiB, so 13 rows run in 3 chunks */
                prm.memory_budget = n % 4 == 3 ? (size_t)16 << 10 : 0;
                prm.grad_scale = GS[(n / 4) % 3];
                kdloss_cpu_set_isa(isas[n % nisa]);
                fz_setup f;
                fz_make(&f, rng, bt, hs, v, k, dt, bias, t, (n % 2) ? KDLOSS_I64 : KDLOSS_I32,
                        ldts[(n / 2) % 3], 3);
                char ctx[320];
                snprintf(ctx, sizeof ctx,
                         "fused %s %s beta=%g alpha=%g tail=%s %s bias=%d v=%lld k=%lld T=%g "
                         "w=%g/%g t2=%d gs=%g chunk=%lld budget=%zu labels=%s lp=%s ws=%d",
                         kdloss_cpu_isa_name(isas[n % nisa]), kdloss_divergence_name(dc->divergence),
                         dc->beta, dc->alpha, tail_name(tail), kt_dtype_name(dt), bias,
                         (long long)v, (long long)k, t, prm.weight_hard_loss,
                         prm.weight_soft_loss, prm.t2_scale, prm.grad_scale,
                         (long long)prm.chunk_size, prm.memory_budget,
                         flags & FZ_NOLABELS ? "none" : flags & FZ_LABEL32 ? "i32" : "i64",
                         kt_dtype_name(f.te.ldt), (flags & FZ_WORKSPACE) != 0);
                fz_ref w = fz_reference(&f, &prm, flags);
                fz_out o = fz_run(&f, &prm, flags);
                fz_check(ctx, &f, &w, &o, flags, NULL);
                /* forward only: the same losses and rows, bit for bit */
                fz_out fw = fz_run(&f, &prm, flags & ~FZ_GRAD);
                KT_CHECK(fz_same_losses(&o, &fw, bt, flags), "%s: forward-only losses differ", ctx);
                fz_out_free(&fw);
                fz_out_free(&o);
                fz_ref_free(&w);
                if (tail == KDLOSS_TAIL_RENORM_BOTH) {
                    /* no cross-entropy, no row_lse: the sparse path; row_lse: the full path */
                    prm.weight_hard_loss = 0.0;
                    int sf = (flags & (FZ_NOLABELS | FZ_LABEL32 | FZ_WORKSPACE)) | FZ_GRAD | FZ_ROWSOFT;
                    fz_ref ws = fz_reference(&f, &prm, sf);
                    fz_out sp = fz_run(&f, &prm, sf);
                    fz_out fl = fz_run(&f, &prm, sf | FZ_ROWLSE);
                    char c2[360];
                    snprintf(c2, sizeof c2, "%s [sparse path]", ctx);
                    fz_check(c2, &f, &ws, &sp, sf, NULL);
                    snprintf(c2, sizeof c2, "%s [full path, row_lse]", ctx);
                    fz_check(c2, &f, &ws, &fl, sf | FZ_ROWLSE, NULL);
                    snprintf(c2, sizeof c2, "%s [sparse vs full path]", ctx);
                    if (sp.st == KDLOSS_OK && fl.st == KDLOSS_OK) fz_check(c2, &f, &ws, &sp, sf, &fl);
                    fz_out spf = fz_run(&f, &prm, sf & ~FZ_GRAD);
                    KT_CHECK(fz_same_losses(&sp, &spf, bt, sf), "%s: sparse forward-only losses differ", ctx);
                    fz_out_free(&spf);
                    fz_out_free(&sp), fz_out_free(&fl);
                    fz_ref_free(&ws);
                }
                fz_free(&f);
            }
    kdloss_cpu_set_isa(KDLOSS_ISA_AUTO);
}

/* ------------------------------------------------------------------------------------------ */
/* 5. argument errors: nothing written                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Every input and output of the error checks lives in one of two blocks, snapshotted before each
 * call: a rejected call must leave both byte-identical (outputs start poisoned). */
enum { EB = 4, EV = 33, EK = 5, EH = 8 };
typedef struct e_inputs {
    float z[EB * EV];
    int64_t ids[EB * EK];
    int32_t ids32[EB * EK];
    float lp[EB * EK + 4];
    int64_t lab[EB];
    float xs[EB * EH], ws[EV * EH], bs[EV];
} e_inputs;
typedef struct e_outputs {
    float loss, soft, hard;
    float rows[EB], row2[EB], row3[EB];
    float g[EB * EV];
    float dxs[EB * EH], dws[EV * EH], dbs[EV];
    unsigned char work[1 << 16];
} e_outputs;
static e_inputs *E_in, *E_in_snap;
static e_outputs *E_out, *E_out_snap;

static void e_snap(void) {
    memcpy(E_in_snap, E_in, sizeof *E_in);
    memcpy(E_out_snap, E_out, sizeof *E_out);
}
static void e_expect(kdloss_status want, kdloss_status got, const char *what) {
    int same = !memcmp(E_in, E_in_snap, sizeof *E_in) && !memcmp(E_out, E_out_snap, sizeof *E_out);
    KT_CHECK(got == want && (want == KDLOSS_OK || same), "%s: got %d (%s), want %d; %s", what, got,
             kdloss_status_string(got), want, same ? "nothing written" : "MEMORY WRITTEN");
    if (got == KDLOSS_OK) kt_poison(E_out, (int64_t)(sizeof *E_out / 4), KDLOSS_F32);
}
#define EXPECT(want, call, what)                                                               \
    do {                                                                                       \
        e_snap();                                                                              \
        kdloss_status st_ = (call);                                                            \
        e_expect((want), st_, (what));                                                         \
    } while (0)

typedef struct la { /* the arguments of one kdloss_topk_distill_logits call */
    kdloss_topk_distill_params p;
    int null_params;
    int64_t bt, v;
    kdloss_cmat z;
    kdloss_topk_teacher t;
    kdloss_labels lab;
    float *loss, *rows;
    kdloss_mat g;
} la;
static kdloss_status call_la(la a) {
    return kdloss_topk_distill_logits(a.null_params ? NULL : &a.p, a.bt, a.v, a.z, a.t, a.lab,
                                      a.loss, a.rows, a.g);
}

static void e_setup(void) {
    E_in = xmalloc(sizeof *E_in), E_in_snap = xmalloc(sizeof *E_in);
    E_out = xmalloc(sizeof *E_out), E_out_snap = xmalloc(sizeof *E_out);
    memset(E_in, 0, sizeof *E_in);
    for (int i = 0; i < EB * EV; i++) E_in->z[i] = (float)((i * 7) % 11) * 0.3f - 1.0f;
    for (int r = 0; r < EB; r++)
        for (int s = 0; s < EK; s++) {
            E_in->ids[r * EK + s] = (r + 3 * s) % EV;
            E_in->ids32[r * EK + s] = (int32_t)E_in->ids[r * EK + s];
            E_in->lp[r * EK + s] = -1.0f - 0.5f * (float)s;
        }
    for (int r = 0; r < EB; r++) E_in->lab[r] = r == 1 ? IGN : r;
    for (int i = 0; i < EB * EH; i++) E_in->xs[i] = (float)((i * 5) % 7) * 0.2f - 0.6f;
    for (int i = 0; i < EV * EH; i++) E_in->ws[i] = (float)((i * 3) % 13) * 0.05f - 0.3f;
    for (int i = 0; i < EV; i++) E_in->bs[i] = (float)(i % 5) * 0.1f;
    kt_poison(E_out, (int64_t)(sizeof *E_out / 4), KDLOSS_F32);
}

static void check_errors_logits(void) {
    la a0;
    kdloss_topk_distill_params_default(&a0.p);
    KT_CHECK(a0.p.div.divergence == KDLOSS_DIV_FORWARD_KL && a0.p.tail == KDLOSS_TAIL_BUCKET &&
                 a0.p.temperature == 1.0 && a0.p.ignore_index == -100 && a0.p.grad_scale == 1.0,
             "kdloss_topk_distill_params defaults");
    a0.p.ignore_index = IGN;
    a0.null_params = 0;
    a0.bt = EB, a0.v = EV;
    a0.z = (kdloss_cmat){E_in->z, KDLOSS_F32, 0};
    a0.t = (kdloss_topk_teacher){EK, {E_in->ids, KDLOSS_I64, 0}, {E_in->lp, KDLOSS_F32, 0}};
    a0.lab = (kdloss_labels){E_in->lab, KDLOSS_I64};
    a0.loss = &E_out->loss, a0.rows = E_out->rows;
    a0.g = (kdloss_mat){E_out->g, KDLOSS_F32, 0};
    la a = a0;
    EXPECT(KDLOSS_OK, call_la(a), "logits: the valid call");
    /* ids */
    E_in->ids[2 * EK + 3] = EV;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: id = V");
    E_in->ids[2 * EK + 3] = -2;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: id = -2");
    E_in->ids[2 * EK + 3] = INT64_MIN;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: id = INT64_MIN");
    E_in->ids[2 * EK + 3] = E_in->ids[2 * EK + 1];
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: an id repeated in one row");
    E_in->ids[2 * EK + 3] = (2 + 9) % EV;
    E_in->ids[1 * EK + 4] = E_in->ids[1 * EK + 0]; /* row 1 is ignored: still checked */
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: an id repeated in an ignored row");
    E_in->ids[1 * EK + 4] = (1 + 12) % EV;
    E_in->ids[3 * EK + 0] = -1, E_in->ids[3 * EK + 2] = -1; /* -1 twice: unused, allowed */
    EXPECT(KDLOSS_OK, call_la(a), "logits: -1 in two slots of a row accepted");
    E_in->ids[3 * EK + 0] = 3, E_in->ids[3 * EK + 2] = (3 + 6) % EV;
    a.t.ids.dtype = KDLOSS_I32, a.t.ids.data = E_in->ids32;
    E_in->ids32[0] = EV;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_la(a), "logits: I32 id = V");
    E_in->ids32[0] = 0;
    EXPECT(KDLOSS_OK, call_la(a), "logits: I32 ids accepted");
    /* a padded ids matrix: the padding is not read */
    a = a0;
    a.t.k = EK - 1; /* ld EK: slot EK-1 is padding */
    a.t.ids.ld = EK, a.t.logprobs.ld = EK;
    E_in->ids[EK + EK - 1] = -2;
    EXPECT(KDLOSS_OK, call_la(a), "logits: an invalid id in the padding is not read");
    E_in->ids[EK + EK - 1] = (1 + 12) % EV;
    /* sizes, strides */
    a = a0, a.t.k = 0;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: K = 0");
    a.t.k = -3;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: K = -3");
    a = a0, a.t.k = INT64_MAX;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: K = INT64_MAX (bytes overflow)");
    a = a0, a.t.k = (int64_t)1 << 61;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: K = 2^61 (bytes overflow)");
    a = a0, a.bt = 0;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: BT = 0");
    a = a0, a.v = 0;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_la(a), "logits: V = 0");
    a = a0, a.t.ids.ld = EK - 1;
    EXPECT(KDLOSS_ERR_INVALID_STRIDE, call_la(a), "logits: ids ld < K");
    a = a0, a.t.logprobs.ld = EK - 1;
    EXPECT(KDLOSS_ERR_INVALID_STRIDE, call_la(a), "logits: logprobs ld < K");
    a = a0, a.t.logprobs.ld = -1;
    EXPECT(KDLOSS_ERR_INVALID_STRIDE, call_la(a), "logits: logprobs ld < 0");
    /* parameters */
    const int bad_tails[] = {3, -1, 1000};
    for (int i = 0; i < 3; i++) {
        a = a0, a.p.tail = (kdloss_topk_tail)bad_tails[i];
        EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), "logits: unknown tail");
    }
    for (int i = 1; i < NDIV; i++) {
        if (DIVS[i].divergence == KDLOSS_DIV_FORWARD_KL) continue;
        a = a0, a.p.tail = KDLOSS_TAIL_RENORM_TEACHER, a.p.div = DIVS[i];
        char w[96];
        snprintf(w, sizeof w, "logits: renorm_teacher with %s beta=%g alpha=%g",
                 kdloss_divergence_name(DIVS[i].divergence), DIVS[i].beta, DIVS[i].alpha);
        EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), w);
    }
    a = a0, a.p.tail = KDLOSS_TAIL_RENORM_TEACHER;
    EXPECT(KDLOSS_OK, call_la(a), "logits: renorm_teacher with forward KL accepted");
    const double bad_t[] = {0.0, -0.0, -1.0, NAN, INFINITY, 1e-300};
    for (int i = 0; i < 6; i++) {
        a = a0, a.p.temperature = bad_t[i];
        char w[64];
        snprintf(w, sizeof w, "logits: temperature %g", bad_t[i]);
        EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), w);
    }
    a = a0, a.p.grad_scale = 1e38, a.p.temperature = 1e-3;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), "logits: grad_scale / T beyond fp32");
    a = a0, a.p.grad_scale = NAN;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), "logits: grad_scale NaN");
    a = a0, a.p.div.alpha = 1.5;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), "logits: alpha 1.5");
    a = a0, a.p.div.divergence = (kdloss_divergence)17;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_la(a), "logits: unknown divergence");
    /* dtypes */
    const kdloss_dtype bad_ids[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16, (kdloss_dtype)9};
    for (int i = 0; i < 4; i++) {
        a = a0, a.t.ids.dtype = bad_ids[i];
        EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_la(a), "logits: ids of a float dtype");
    }
    a = a0, a.t.logprobs.dtype = KDLOSS_I32;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_la(a), "logits: logprobs I32");
    a = a0, a.t.logprobs.dtype = KDLOSS_I64;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_la(a), "logits: logprobs I64");
    a = a0, a.g.dtype = KDLOSS_BF16;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_la(a), "logits: grad dtype differs from the student's");
    a = a0, a.lab.dtype = KDLOSS_F32;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_la(a), "logits: labels F32");
    /* NULL pointers, no output, labels */
    a = a0, a.null_params = 1;
    EXPECT(KDLOSS_ERR_NULL_POINTER, call_la(a), "logits: params NULL");
    a = a0, a.t.ids.data = NULL;
    EXPECT(KDLOSS_ERR_NULL_POINTER, call_la(a), "logits: ids NULL");
    a = a0, a.t.logprobs.data = NULL;
    EXPECT(KDLOSS_ERR_NULL_POINTER, call_la(a), "logits: logprobs NULL");
    a = a0, a.z.data = NULL;
    EXPECT(KDLOSS_ERR_NULL_POINTER, call_la(a), "logits: student NULL");
    a = a0, a.loss = NULL, a.rows = NULL, a.g.data = NULL;
    EXPECT(KDLOSS_ERR_NO_OUTPUT, call_la(a), "logits: no output");
    E_in->lab[2] = EV;
    EXPECT(KDLOSS_ERR_LABEL_OUT_OF_RANGE, call_la(a0), "logits: label = V");
    E_in->lab[2] = 2;
    /* alignment */
    a = a0, a.t.ids.data = (const char *)E_in->ids + 4;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: I64 ids at 4 bytes");
    a = a0, a.t.ids.data = (const char *)E_in->ids32 + 2, a.t.ids.dtype = KDLOSS_I32;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: I32 ids at 2 bytes");
    a = a0, a.t.logprobs.data = (const char *)E_in->lp + 2;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: F32 logprobs at 2 bytes");
    a = a0, a.t.logprobs.data = (const char *)E_in->lp + 1, a.t.logprobs.dtype = KDLOSS_BF16;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: BF16 logprobs at 1 byte");
    a = a0, a.z.data = (const char *)E_in->z + 2;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: student at 2 bytes");
    a = a0, a.rows = (float *)((char *)E_out->rows + 1);
    EXPECT(KDLOSS_ERR_MISALIGNED, call_la(a), "logits: row_loss at 1 byte");
    /* aliasing */
    a = a0, a.g = (kdloss_mat){E_in->lp, KDLOSS_F32, EK};
    a.bt = 1, a.v = EK; /* grad exactly over the log-probs of row 0 */
    for (int s = 0; s < EK; s++) E_in->ids[s] = s;
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: grad over the logprobs");
    a = a0, a.g = (kdloss_mat){(float *)E_in->lp + 3, KDLOSS_F32, 0};
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: grad overlapping the logprobs");
    a = a0, a.g = (kdloss_mat){(float *)(void *)E_in->ids, KDLOSS_F32, 0};
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: grad overlapping the ids");
    a = a0, a.rows = E_in->lp + 1;
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: row_loss over the logprobs");
    a = a0, a.loss = (float *)(void *)&E_in->ids[7];
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: loss inside the ids");
    a = a0, a.loss = E_out->g + 5;
    EXPECT(KDLOSS_ERR_ALIASING, call_la(a), "logits: loss inside the gradient");
    for (int r = 0; r < 1; r++)
        for (int s = 0; s < EK; s++) E_in->ids[r * EK + s] = (r + 3 * s) % EV;
    EXPECT(KDLOSS_OK, call_la(a0), "logits: the valid call again");
}

typedef struct fa { /* the arguments of one kdloss_fused_linear_topk_distill call */
    kdloss_fused_linear_topk_distill_params p;
    int64_t bt, hs, v;
    kdloss_cmat xs, ws;
    const void *bs;
    kdloss_topk_teacher t;
    kdloss_labels lab;
    kdloss_fused_linear_distill_out o;
    void *work;
    size_t work_bytes;
} fa;
static kdloss_status call_fa(fa a) {
    return kdloss_fused_linear_topk_distill(&a.p, a.bt, a.hs, a.v, a.xs, a.ws, a.bs, a.t, a.lab,
                                            &a.o, a.work, a.work_bytes);
}

static void check_errors_fused(void) {
    fa a0;
    memset(&a0, 0, sizeof a0);
    kdloss_fused_linear_topk_distill_params_default(&a0.p);
    KT_CHECK(a0.p.div.divergence == KDLOSS_DIV_FORWARD_KL && a0.p.tail == KDLOSS_TAIL_BUCKET &&
                 a0.p.temperature == 1.0 && a0.p.weight_hard_loss == 0.0 &&
                 a0.p.weight_soft_loss == 1.0 && a0.p.t2_scale == 0 && a0.p.ignore_index == -100 &&
                 a0.p.chunk_size == 0 && a0.p.memory_budget == 0 && a0.p.grad_scale == 1.0,
             "kdloss_fused_linear_topk_distill_params defaults");
    a0.p.ignore_index = IGN;
    a0.p.weight_hard_loss = 0.5;
    a0.bt = EB, a0.hs = EH, a0.v = EV;
    a0.xs = (kdloss_cmat){E_in->xs, KDLOSS_F32, 0};
    a0.ws = (kdloss_cmat){E_in->ws, KDLOSS_F32, 0};
    a0.bs = E_in->bs;
    a0.t = (kdloss_topk_teacher){EK, {E_in->ids, KDLOSS_I64, 0}, {E_in->lp, KDLOSS_F32, 0}};
    a0.lab = (kdloss_labels){E_in->lab, KDLOSS_I64};
    a0.o.loss = &E_out->loss, a0.o.soft_loss = &E_out->soft, a0.o.hard_loss = &E_out->hard;
    a0.o.row_soft = E_out->rows, a0.o.row_hard = E_out->row2, a0.o.row_lse = E_out->row3;
    a0.o.dxs = (kdloss_mat){E_out->dxs, KDLOSS_F32, 0};
    a0.o.dws = (kdloss_mat){E_out->dws, KDLOSS_F32, 0};
    a0.o.dbs = E_out->dbs;
    fa a = a0;
    EXPECT(KDLOSS_OK, call_fa(a), "fused: the valid call");
    E_in->ids[2 * EK + 3] = EV;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_fa(a), "fused: id = V");
    E_in->ids[2 * EK + 3] = -2;
    EXPECT(KDLOSS_ERR_INVALID_ID, call_fa(a), "fused: id = -2");
    E_in->ids[2 * EK + 3] = E_in->ids[2 * EK + 4];
    EXPECT(KDLOSS_ERR_INVALID_ID, call_fa(a), "fused: an id repeated in one row");
    a.p.tail = KDLOSS_TAIL_RENORM_BOTH, a.p.weight_hard_loss = 0.0;
    a.o.hard_loss = NULL, a.o.row_hard = NULL, a.o.row_lse = NULL; /* the sparse path */
    EXPECT(KDLOSS_ERR_INVALID_ID, call_fa(a), "fused: an id repeated in one row (sparse path)");
    E_in->ids[2 * EK + 3] = (2 + 9) % EV;
    E_in->ids[1 * EK + 0] = E_in->ids[1 * EK + 2]; /* row 1 is ignored */
    EXPECT(KDLOSS_ERR_INVALID_ID, call_fa(a0), "fused: an id repeated in an ignored row");
    E_in->ids[1 * EK + 0] = 1;
    a = a0, a.t.k = 0;
    EXPECT(KDLOSS_ERR_INVALID_SIZE, call_fa(a), "fused: K = 0");
    a = a0, a.p.tail = (kdloss_topk_tail)3;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: unknown tail");
    a = a0, a.p.tail = KDLOSS_TAIL_RENORM_TEACHER, a.p.div.divergence = KDLOSS_DIV_JSD;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: renorm_teacher with JSD");
    a = a0, a.p.tail = KDLOSS_TAIL_RENORM_TEACHER, a.p.div.divergence = KDLOSS_DIV_TVD;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: renorm_teacher with TVD");
    /* labels NULL: weight_hard_loss must be 0 and no cross-entropy output asked for */
    a = a0, a.lab.data = NULL;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: labels NULL with weight_hard_loss > 0");
    a.p.weight_hard_loss = 0.0;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: labels NULL with hard_loss and row_hard");
    a.o.hard_loss = NULL;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: labels NULL with row_hard");
    a.o.row_hard = NULL;
    EXPECT(KDLOSS_OK, call_fa(a), "fused: labels NULL, weight_hard_loss 0, no CE output");
    /* dtypes */
    a = a0, a.t.ids.dtype = KDLOSS_F32;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_fa(a), "fused: ids F32");
    a = a0, a.t.logprobs.dtype = KDLOSS_I32;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_fa(a), "fused: logprobs I32");
    a = a0, a.xs.dtype = KDLOSS_F16, a.ws.dtype = KDLOSS_F16;
    EXPECT(KDLOSS_ERR_INVALID_DTYPE, call_fa(a), "fused: F16 operands");
    /* alignment, aliasing, strides */
    a = a0, a.t.ids.data = (const char *)E_in->ids + 4;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_fa(a), "fused: I64 ids at 4 bytes");
    a = a0, a.t.logprobs.data = (const char *)E_in->lp + 2;
    EXPECT(KDLOSS_ERR_MISALIGNED, call_fa(a), "fused: logprobs at 2 bytes");
    a = a0, a.o.dxs.data = E_in->lp;
    EXPECT(KDLOSS_ERR_ALIASING, call_fa(a), "fused: dxs over the logprobs");
    a = a0, a.o.row_soft = (float *)(void *)E_in->ids;
    EXPECT(KDLOSS_ERR_ALIASING, call_fa(a), "fused: row_soft over the ids");
    a = a0, a.o.loss = E_in->lp + 2;
    EXPECT(KDLOSS_ERR_ALIASING, call_fa(a), "fused: loss inside the logprobs");
    a = a0, a.t.ids.ld = EK - 1;
    EXPECT(KDLOSS_ERR_INVALID_STRIDE, call_fa(a), "fused: ids ld < K");
    a = a0, a.t.ids.data = NULL;
    EXPECT(KDLOSS_ERR_NULL_POINTER, call_fa(a), "fused: ids NULL");
    /* temperature, weights */
    const double bad_t[] = {0.0, -2.0, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        a = a0, a.p.temperature = bad_t[i];
        EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: temperature <= 0 or not finite");
    }
    a = a0, a.p.weight_soft_loss = -1.0;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: weight_soft_loss < 0");
    a = a0, a.p.t2_scale = 2;
    EXPECT(KDLOSS_ERR_INVALID_PARAM, call_fa(a), "fused: t2_scale 2");
    /* workspace and its size query */
    size_t bytes = 7;
    kdloss_status st = kdloss_fused_linear_topk_distill_workspace_size(&a0.p, EB, EH, EV, EK,
                                                                       KDLOSS_F32, 1, &bytes);
    KT_CHECK(st == KDLOSS_OK && bytes != 7, "fused: workspace size query (%s)", kdloss_status_string(st));
    if (st == KDLOSS_OK && bytes > 0 && bytes <= sizeof E_out->work) {
        a = a0, a.work = E_out->work, a.work_bytes = bytes - 1;
        EXPECT(KDLOSS_ERR_WORKSPACE_TOO_SMALL, call_fa(a), "fused: workspace one byte short");
        a.work_bytes = bytes;
        EXPECT(KDLOSS_OK, call_fa(a), "fused: workspace of the queried size");
        a.work = E_in->lp;
        EXPECT(KDLOSS_ERR_ALIASING, call_fa(a), "fused: workspace over the logprobs");
    }
    kdloss_fused_linear_topk_distill_params pq = a0.p;
    size_t b2 = 7;
    KT_CHECK(kdloss_fused_linear_topk_distill_workspace_size(&pq, EB, EH, EV, 0, KDLOSS_F32, 1, &b2) ==
                     KDLOSS_ERR_INVALID_SIZE && b2 == 7,
             "workspace size: K = 0 rejected, nothing written");
    /* sizes whose bytes overflow: rejected without overflowing inside (the UBSan run checks) */
    const int64_t huge[] = {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 61, (int64_t)1 << 40};
    for (int i = 0; i < 4; i++) {
        b2 = 7;
        kdloss_status s1 = kdloss_fused_linear_topk_distill_workspace_size(&pq, EB, EH, EV, huge[i], KDLOSS_F32, 1, &b2);
        KT_CHECK((s1 == KDLOSS_ERR_INVALID_SIZE && b2 == 7) || (s1 == KDLOSS_OK && i == 3 && b2 != 7),
                 "workspace size: K = %lld gives %d (bytes %zu)", (long long)huge[i], s1, b2);
        b2 = 7;
        s1 = kdloss_fused_linear_topk_distill_workspace_size(&pq, huge[i], EH, EV, EK, KDLOSS_BF16, 1, &b2);
        KT_CHECK((s1 == KDLOSS_ERR_INVALID_SIZE && b2 == 7) || (s1 == KDLOSS_OK && b2 != 7),
                 "workspace size: BT = %lld gives %d (bytes %zu)", (long long)huge[i], s1, b2);
    }
    b2 = 7;
    pq.tail = (kdloss_topk_tail)5;
    KT_CHECK(kdloss_fused_linear_topk_distill_workspace_size(&pq, EB, EH, EV, EK, KDLOSS_F32, 1, &b2) ==
                     KDLOSS_ERR_INVALID_PARAM && b2 == 7,
             "workspace size: unknown tail rejected, nothing written");
    KT_CHECK(kdloss_fused_linear_topk_distill_workspace_size(&a0.p, EB, EH, EV, EK, KDLOSS_F32, 1, NULL) ==
                 KDLOSS_ERR_NULL_POINTER,
             "workspace size: bytes NULL");
    KT_CHECK(kdloss_fused_linear_topk_distill_workspace_size(NULL, EB, EH, EV, EK, KDLOSS_F32, 1, &b2) ==
                     KDLOSS_ERR_NULL_POINTER && b2 == 7,
             "workspace size: params NULL");
    EXPECT(KDLOSS_OK, call_fa(a0), "fused: the valid call again");
}

/* ------------------------------------------------------------------------------------------ */
/* 6. thread-count independence; 7. names                                                      */
/* ------------------------------------------------------------------------------------------ */

static void check_threads(kt_rng *rng) {
    int save = omp_get_max_threads();
    /* the logits entry point: BT 64, V 1100, K 16, every tail mode */
    {
        int64_t bt = 64, v = 1100, k = 16;
        double *zs = DALLOC(bt * v), *full = DALLOC(bt * v);
        gen_logits(rng, zs, bt, v, 0, 1.5);
        kt_gen_logprobs(rng, full, bt, v, 0, 1);
        float *z = kt_pack(zs, bt, v, v, KDLOSS_F32);
        teacher te;
        teacher_make(&te, rng, full, bt, v, k, 0, 0.2, 3, KDLOSS_I64, KDLOSS_BF16, 0);
        for (int tail = 0; tail < 3; tail++)
            for (int di = 0; di < 2; di++) {
                kdloss_topk_distill_params p;
                kdloss_topk_distill_params_default(&p);
                p.tail = (kdloss_topk_tail)tail;
                p.div = DIVS[tail == 2 ? 0 : di ? 3 : 7];
                p.temperature = 0.7;
                float l[2], *rows[2], *g[2];
                for (int th = 0; th < 2; th++) {
                    omp_set_num_threads(th + 1);
                    rows[th] = xmalloc(sizeof(float) * (size_t)bt);
                    g[th] = xmalloc(sizeof(float) * (size_t)(bt * v));
                    kdloss_labels nol = {NULL, KDLOSS_I64};
                    KT_CHECK(kdloss_topk_distill_logits(&p, bt, v, (kdloss_cmat){z, KDLOSS_F32, 0},
                                                        teacher_view(&te), nol, &l[th], rows[th],
                                                        (kdloss_mat){g[th], KDLOSS_F32, 0}) == KDLOSS_OK,
                             "threads: logits call");
                }
                KT_CHECK(!memcmp(&l[0], &l[1], 4) && !memcmp(rows[0], rows[1], sizeof(float) * (size_t)bt) &&
                             !memcmp(g[0], g[1], sizeof(float) * (size_t)(bt * v)),
                         "logits %s %s: 1 and 2 threads differ", tail_name(tail),
                         kdloss_divergence_name(p.div.divergence));
                for (int th = 0; th < 2; th++) free(rows[th]), free(g[th]);
            }
        teacher_free(&te);
        free(zs), free(full), free(z);
    }
    /* the fused entry point: BT 64, Hs 32, V 300, K 16; bucket and the sparse renorm_both path */
    for (int di = 0; di < 2; di++)
        for (int mode = 0; mode < 2; mode++) {
            fz_setup f;
            fz_make(&f, rng, 64, 32, 300, 16, di ? KDLOSS_BF16 : KDLOSS_F32, 1, 1.5, KDLOSS_I32,
                    KDLOSS_F32, 5);
            kdloss_fused_linear_topk_distill_params prm;
            kdloss_fused_linear_topk_distill_params_default(&prm);
            prm.div = DIVS[3];
            prm.tail = mode ? KDLOSS_TAIL_RENORM_BOTH : KDLOSS_TAIL_BUCKET;
            prm.temperature = 1.5;
            prm.weight_hard_loss = mode ? 0.0 : 0.5;
            prm.ignore_index = IGN;
            prm.chunk_size = 16;
            int flags = FZ_GRAD | FZ_ROWSOFT | (mode ? 0 : FZ_HARD | FZ_ROWHARD | FZ_ROWLSE);
            fz_out o[2];
            for (int th = 0; th < 2; th++) {
                omp_set_num_threads(th + 1);
                o[th] = fz_run(&f, &prm, flags);
            }
            size_t es = kdloss_dtype_size(f.p.ds);
            int same = fz_same_losses(&o[0], &o[1], 64, flags) &&
                       !memcmp(o[0].dxs, o[1].dxs, es * (size_t)(64 * o[0].ld_dxs)) &&
                       !memcmp(o[0].dws, o[1].dws, es * (size_t)(300 * o[0].ld_dws)) &&
                       !memcmp(o[0].dbs, o[1].dbs, es * 300);
            KT_CHECK(same, "fused %s %s: 1 and 2 threads differ", kt_dtype_name(f.p.ds),
                     mode ? "renorm_both (sparse path)" : "bucket");
            fz_out_free(&o[0]), fz_out_free(&o[1]);
            fz_free(&f);
        }
    omp_set_num_threads(save);
}

static void check_names(void) {
    static const char *names[] = {"bucket", "renorm_both", "renorm_teacher"};
    for (int t = 0; t < 3; t++) {
        const char *n = kdloss_topk_tail_name((kdloss_topk_tail)t);
        kdloss_topk_tail back = (kdloss_topk_tail)99;
        KT_CHECK(n && !strcmp(n, names[t]), "tail %d is named '%s'", t, n ? n : "(null)");
        KT_CHECK(kdloss_topk_tail_from_name(names[t], &back) == KDLOSS_OK && back == (kdloss_topk_tail)t,
                 "'%s' names tail %d", names[t], t);
    }
    KT_CHECK(!strcmp(kdloss_topk_tail_name((kdloss_topk_tail)3), "unknown") &&
                 !strcmp(kdloss_topk_tail_name((kdloss_topk_tail)-1), "unknown"),
             "unknown tails are named 'unknown'");
    kdloss_topk_tail t = KDLOSS_TAIL_RENORM_BOTH;
    KT_CHECK(kdloss_topk_tail_from_name("Bucket", &t) == KDLOSS_ERR_INVALID_PARAM &&
                 kdloss_topk_tail_from_name("", &t) == KDLOSS_ERR_INVALID_PARAM &&
                 kdloss_topk_tail_from_name("unknown", &t) == KDLOSS_ERR_INVALID_PARAM &&
                 t == KDLOSS_TAIL_RENORM_BOTH,
             "bad tail names rejected, nothing written");
    KT_CHECK(kdloss_topk_tail_from_name(NULL, &t) != KDLOSS_OK && t == KDLOSS_TAIL_RENORM_BOTH,
             "tail name NULL rejected");
    KT_CHECK(strstr(kdloss_status_string(KDLOSS_ERR_INVALID_ID), "id") != NULL,
             "KDLOSS_ERR_INVALID_ID has its message ('%s')", kdloss_status_string(KDLOSS_ERR_INVALID_ID));
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    KT_FOR_EACH_ISA(path, "logits, ") grid_logits(&rng, path.name);
    int before = kt_checks;
    check_dense(&rng);
    printf("K = V bucket vs dense: %d checks\n", kt_checks - before);
    before = kt_checks;
    grid_fused(&rng);
    printf("fused: %d checks\n", kt_checks - before);
    before = kt_checks;
    check_finite_differences(&rng);
    printf("finite differences: %d checks\n", kt_checks - before);
    before = kt_checks;
    e_setup();
    check_errors_logits();
    check_errors_fused();
    printf("errors: %d checks\n", kt_checks - before);
    free(E_in), free(E_in_snap), free(E_out), free(E_out_snap);
    check_threads(&rng);
    check_names();
    for (int i = 0; i < W_KINDS; i++)
        printf("largest error seen, %s: %.3g of its bound\n", W_NAMES[i], worst_seen[i]);
    return kt_finish("test_topk");
}
