/* The fused loss's row work in four phases (max, sums, divergence, gradient), written once for
 * the scalar kernel (fld_rows_scalar.c) and the vector ones (fld_rows_vec.c), for the dense
 * teacher and the sparse top-k one (docs/MATH.md sections 4, 8 and 9). One process runs the four
 * back to back on each row while it is in cache (kd_fld_rows_*); the vocabulary-parallel driver
 * runs each over a chunk's rows and all-reduces the statistics in between
 * (kd_fld_rows_phase_*). A process holding the whole vocabulary is the case v_lo = 0 with
 * nothing to reduce, so both run the same code. */

/* The phases end where a vocabulary-parallel rank needs statistics of the other ranks' columns:
 *   1. max      bias added, logit maps applied; the row maxima  -> all-reduce MAX of stat_max
 *   2. sums     sums of exps at those maxima, the label's logit, -> all-reduce SUM of stat_sum
 *               a sparse teacher's gathered logits
 *   3. div      log-normalizers, cross-entropy, the divergence  -> all-reduce SUM of stat_div
 *               (dense: the row's terms and sum g over the local columns)      (dense only)
 *   4. grad     dzs over zs, and the row's soft loss into row_soft
 *
 * The includer defines PH(name) (the functions' names), PH_CTX (the divergence constants' type
 * built from a->coef) and the V-wide passes over a row of v floats:
 *   PH_FOLD_MAX(z, b, v)                adds the bias b (or NULL) in place, returns the max
 *   PH_MAP(z, b, v, map)                z = map(z + b) in place (logit_map.h; b may be NULL)
 *   PH_SUM_EXP(z, v, m, s)              sum of exp((z - m) s), double
 *   PH_SUM_EXP_ENT(z, v, m, s, ent)     the same sum (the same bits), and into *ent the sum of
 *                                       the entropy elements -e^u u, u = (z - m) s, from its exps
 *   PH_DIV(a, k, zs, zt, ms, mt, lss, lst, store_g, sum_g)
 *                                       the divergence's terms on X = (zs - ms) it - lss,
 *                                       Y = (zt - mt) it - lst: returns their sum; when store_g,
 *                                       g = dD/dX over zt and its sum into *sum_g
 *   PH_GRAD(a, zs, zt, v, ms, lss, sum_g, lsh, share)
 *                                       zs = gs (g - q sum_g) + gh softmax(zs), q = softmax(zs/T),
 *                                       over v columns (a row, or a tile of one)
 *   PH_REST_GRAD(z, v, c1, m1, s1, l1, c2, m2, l2)
 *                                       z = c1 exp((z - m1) s1 - l1) + c2 exp(z - m2 - l2) (a
 *                                       term whose c is 0 skipped; a -inf element gives 0)
 *
 * Statistics of row i: mx = stat_max + 2i, sm = stat_sum + n_sum i, dv = stat_div + 2i.
 *   dense:  mx = {max zs, max zt}; sm = {sum e^((zs-ms)/T), sum e^((zt-mt)/T), sum e^(zs-ms)
 *           (CE at T != 1), zs[y]}; dv = {divergence terms, sum g}
 *   sparse: mx = {max of zs outside S, max of zs}; sm = {sum e^((zs-mr)/T) outside S,
 *           sum e^(zs-mr) outside S (T != 1), 0, zs[y], zs at S (|S| values, 0 where another
 *           rank holds the id)}; dv = {c_rest, untempered lse} (not reduced)
 *   with the entropy (a->ent), sm[kd_fld_ent_at(K)] = sum of -e^u u over the columns the first
 *   sum runs over (u its exponent): H = -sum Q log Q follows from it, that sum and the row's
 *   log-normalizer (docs/MATH.md section 12).
 * A row of weight 0 (a->w) is an ignored row; a kept row's gradient factors are w gs, w gh.
 */
#include <math.h>
#include <string.h>

#include "omp_team.h"
#include "row_special.h"
#include "topk.h"
#include "topk_row.h"

/* PH_SUM_EXP, or its careful form for a row whose maximum m needs it (row_special.h: a row
 * spanning more than FLT_MAX, docs/MATH.md section 10): one compare a row. */
#define PH_SUM_EXP_ROW(z, v, m, s)                                                             \
    (kd_row_wide(m) ? kd_wide_sum_exp(z, v, (double)(m), (double)(s)) : PH_SUM_EXP(z, v, m, s))

/* The row's label as a local column, -1 when another rank holds it or there are no labels. */
static inline int64_t ph_label_col(const kd_fld_rows *a, int64_t i) {
    if (!a->labels.data) return -1;
    int64_t y = kd_label_at(a->labels, a->row0 + i) - a->v_lo;
    return y >= 0 && y < a->v ? y : -1;
}

static inline int ph_ignored(const kd_fld_rows *a, int64_t i) {
    return (a->labels.data && kd_label_at(a->labels, a->row0 + i) == a->ignore_index) ||
           !kd_row_weight_keeps(a->w, a->row0 + i);
}

/* Row i's arguments for phase 4: a itself, or, under row weights, a copy in *b whose gradient
 * factors carry the row's weight (the weight scales the row's whole gradient). */
static inline const kd_fld_rows *ph_weighted(const kd_fld_rows *a, int64_t i, kd_fld_rows *b) {
    if (!a->w) return a;
    *b = *a;
    b->gs = a->gs * a->w[a->row0 + i];
    b->gh = a->gh * a->w[a->row0 + i];
    return b;
}

/* The tempered student sum of exps, with the entropy's sum into *ent when it is wanted. */
#define PH_SUM_EXP_S(a, z, v, m, s, h_out)                                                     \
    ((a)->ent ? (kd_row_wide(m) ? kd_wide_sum_exp_ent(z, v, (double)(m), (double)(s), h_out)   \
                                : PH_SUM_EXP_ENT(z, v, m, s, h_out))                           \
              : PH_SUM_EXP_ROW(z, v, m, s))

/* Phase 1 on one row of a head: the bias, then the head's logit map when it has one; the max.
 * The map passes over the row once more, in cache; a row without one is read once, as before. */
static inline float PH(fold)(float *z, const float *b, int64_t v, const kd_logit_map *m) {
    if (!m->on) return PH_FOLD_MAX(z, b, v);
    PH_MAP(z, b, v, m);
    return PH_FOLD_MAX(z, NULL, v);
}

/* Phase 4 under a student softcap runs tile by tile: each tile's factors 1 - (z / cap)^2 are
 * taken from its logits before its gradient replaces them, then multiply it (logit_map.h). */
static inline int ph_capped(const kd_fld_rows *a) { return a->grad && a->map_s.cap > 0.0f; }

static inline void ph_cap_factors(const kd_logit_map *m, const float *z, int64_t n, float *f) {
    for (int64_t c = 0; c < n; c++) f[c] = kd_map_dcap(m, z[c]);
}

static inline void ph_cap_apply(float *z, int64_t n, const float *f) {
    for (int64_t c = 0; c < n; c++) z[c] *= f[c];
}

/* ---- dense teacher ---- */

static void PH(dense_max)(const kd_fld_rows *a, int64_t i) {
    double *mx = a->stat_max + 2 * i;
    mx[0] = mx[1] = -INFINITY;
    if (ph_ignored(a, i)) return;
    mx[0] = PH(fold)(a->zs + i * a->v, a->bias_s, a->v, &a->map_s);
    if (a->soft) mx[1] = PH(fold)(a->zt + i * a->v, a->bias_t, a->v, &a->map_t);
}

static void PH(dense_sums)(const kd_fld_rows *a, int64_t i) {
    double *sm = a->stat_sum + a->n_sum * i;
    const float *zs = a->zs + i * a->v;
    float ms = (float)a->stat_max[2 * i], mt = (float)a->stat_max[2 * i + 1], it = a->inv_t;
    double *ent = sm + kd_fld_ent_at(0);
    sm[0] = sm[1] = sm[2] = sm[3] = 0.0;
    if (a->ent) *ent = 0.0;
    if (ph_ignored(a, i)) return;
    int64_t y = ph_label_col(a, i);
    /* the tempered student pass also when only the entropy wants it */
    if (a->soft || a->ent) sm[0] = PH_SUM_EXP_S(a, zs, a->v, ms, it, ent);
    if (a->soft) sm[1] = PH_SUM_EXP_ROW(a->zt + i * a->v, a->v, mt, it);
    if (a->hard && !(a->soft && it == 1.0f)) sm[2] = PH_SUM_EXP_ROW(zs, a->v, ms, 1.0f);
    if (a->hard && y >= 0) sm[3] = zs[y];
}

/* The normalizers from the reduced sums: lss, lst, and lsh (= lss when T = 1). */
static inline void ph_dense_logs(const kd_fld_rows *a, const double *sm, double *lss,
                                 double *lst, double *lsh) {
    int share = a->soft && a->inv_t == 1.0f;
    *lss = a->soft ? log(sm[0]) : 0.0;
    *lst = a->soft ? log(sm[1]) : 0.0;
    *lsh = !a->hard ? 0.0 : share ? *lss : log(sm[2]);
}

static void PH(dense_div)(const kd_fld_rows *a, const PH_CTX *k, int64_t i) {
    const double *sm = a->stat_sum + a->n_sum * i;
    double *dv = a->stat_div + 2 * i, lss, lst, lsh;
    float ms = (float)a->stat_max[2 * i], mt = (float)a->stat_max[2 * i + 1];
    dv[0] = dv[1] = 0.0;
    a->row_hard[i] = 0.0;
    if (a->row_lse) a->row_lse[i] = 0.0f;
    if (a->row_ent) a->row_ent[i] = 0.0f;
    if (ph_ignored(a, i)) return;
    ph_dense_logs(a, sm, &lss, &lst, &lsh);
    /* H = -sum Q log Q with log Q = u - log S: (sum -e^u u) / S + log S, two non-negative terms */
    if (a->row_ent) a->row_ent[i] = (float)(sm[kd_fld_ent_at(0)] / sm[0] + log(sm[0]));
    if (a->hard) a->row_hard[i] = ((double)ms - sm[3]) + lsh;
    if (a->row_lse) a->row_lse[i] = (float)((double)ms + lsh);
    if (a->soft && (kd_row_wide(ms) || kd_row_wide(mt))) {
        /* logits spanning more than FLT_MAX (or a NaN maximum): the careful form */
        float *zt = a->zt + i * a->v;
        dv[0] = kd_wide_div(&a->coef, a->zs + i * a->v, zt, a->grad && a->gs != 0.0f ? zt : NULL,
                            a->v, ms, mt, (double)a->inv_t, lss, lst, &dv[1]);
    } else if (a->soft) {
        /* Y = (zt - mt') it - lss with mt' = mt + (lst - lss) T: X and Y subtract the same fp32
         * constant, whose rounding then scales P and Q alike (a relative error of the
         * divergence) instead of shifting one against the other (an absolute error of ~1e-7,
         * which at a large T outweighs a divergence of ~1/T^2: docs/MATH.md section 5) */
        double sh = (lst - lss) / (double)a->inv_t, it = (double)a->inv_t;
        float mt2 = (float)((double)mt + sh);
        /* the constant each way leaves between Y and X: mt2's rounding times 1/T, or the two
         * normalizers' roundings; the smaller is taken (mt2's is the larger when |mt| is large
         * against the logits' spread and T small). mt2 - mt is exact in double (two fp32), sh
         * is subtracted after it: (double)mt + sh would drop sh whole when |mt| >> |sh| (mt =
         * 3.8e25, sh = -0.8: mt2 = mt, e_shift 0, so Y was shifted by sh / T and P scaled by
         * e^-(lst - lss), the divergence with it) */
        double e_shift = fabs((((double)mt2 - (double)mt) - sh) * it);
        double e_norm = fabs((lst - (double)(float)lst) - (lss - (double)(float)lss));
        int same = isfinite(mt2) && mt > -INFINITY && e_shift < e_norm;
        dv[0] = PH_DIV(a, k, a->zs + i * a->v, a->zt + i * a->v, ms, same ? mt2 : mt, (float)lss,
                       same ? (float)lss : (float)lst, a->grad && a->gs != 0.0f, &dv[1]);
    }
    /* the NaN policy (kdloss.h): a NaN or +inf logit anywhere in the row (on any rank: the
     * sums are reduced) makes a normalizer NaN; the row's divergence and sum g are then NaN, so
     * that every element of its gradient is (gs (g - q sum g)) */
    if (a->soft && (isnan(lss) || isnan(lst))) dv[0] = dv[1] = NAN;
}

/* Phase 4 of a dense row on its n columns from zs (g: the divergence's gradient there). */
static void PH(dense_grad_cols)(const kd_fld_rows *a, const double *dv, float *zs,
                                const float *g, int64_t n, float ms, double lss, double lsh) {
    int share = a->soft && a->inv_t == 1.0f && a->gs != 0.0f;
    if (kd_row_wide(ms)) { /* the careful form (row_special.h) */
        for (int64_t c = 0; c < n; c++)
            zs[c] = kd_wide_dz(zs[c], a->gs != 0.0f ? g[c] : 0.0f, ms, (double)a->inv_t, lss,
                               dv[1], a->gs, a->gh, lsh, share);
    } else {
        PH_GRAD(a, zs, g, n, ms, (float)lss, dv[1], (float)lsh, share);
    }
}

static void PH(dense_grad)(const kd_fld_rows *a0, int64_t i) {
    const double *sm = a0->stat_sum + a0->n_sum * i, *dv = a0->stat_div + 2 * i;
    float *zs = a0->zs + i * a0->v;
    const float *g = a0->zt ? a0->zt + i * a0->v : NULL;
    double lss, lst, lsh;
    a0->row_soft[i] = dv[0];
    if (!a0->grad) return;
    if (ph_ignored(a0, i)) {
        memset(zs, 0, (size_t)a0->v * sizeof(float));
        return;
    }
    kd_fld_rows wb;
    const kd_fld_rows *a = ph_weighted(a0, i, &wb);
    ph_dense_logs(a, sm, &lss, &lst, &lsh);
    float ms = (float)a->stat_max[2 * i];
    int64_t y = ph_label_col(a, i);
    if (!ph_capped(a)) {
        PH(dense_grad_cols)(a, dv, zs, g, a->v, ms, lss, lsh);
        if (a->gh != 0.0f && y >= 0) zs[y] -= a->gh;
        return;
    }
    float f[KD_FLD_TILE];
    for (int64_t c0 = 0; c0 < a->v; c0 += KD_FLD_TILE) {
        int64_t n = a->v - c0 < KD_FLD_TILE ? a->v - c0 : KD_FLD_TILE;
        ph_cap_factors(&a->map_s, zs + c0, n, f);
        PH(dense_grad_cols)(a, dv, zs + c0, g ? g + c0 : NULL, n, ms, lss, lsh);
        if (a->gh != 0.0f && y >= c0 && y < c0 + n) zs[y] -= a->gh;
        ph_cap_apply(zs + c0, n, f);
    }
}

/* ---- sparse top-k teacher ---- */

/* Row i's slot scratch (topk.h): col[K] local columns (-1: another rank's id), then the count
 * n = |S| in col[K], zk, lp, gk. */
static inline int64_t *ph_tk(const kd_fld_rows *a, int64_t i) {
    return (int64_t *)(a->tk + (size_t)i * kd_topk_row_scratch(a->topk->k));
}

/* Gathers row i's used slots in slot order: the teacher's log-probs, and for the ids this rank
 * holds their logits with the bias b (as PH_FOLD_MAX adds it; NULL once added), then masks those
 * to -inf. */
static void ph_gather(const kd_fld_rows *a, int64_t i, float *z, const float *b) {
    const kdloss_topk_teacher *t = a->topk;
    int64_t kk = t->k, r = a->row0 + i, n = 0, *col = ph_tk(a, i);
    float *zk = (float *)(col + kk + 1), *lp = zk + kk;
    int is64 = t->ids.dtype == KDLOSS_I64;
    for (int64_t j = 0; j < kk; j++) {
        int64_t id = kd_topk_id(t->ids.data, is64, t->ids.ld, r, j) - a->v_lo;
        if (id + a->v_lo < 0) continue; /* -1: unused (the ids were checked) */
        int local = id >= 0 && id < a->v;
        col[n] = local ? id : -1;
        zk[n] = !local ? 0.0f : b ? z[id] + b[id] : z[id];
        lp[n] = kd_topk_logprob(t, r, j);
        if (local) z[id] = -INFINITY;
        n++;
    }
    col[kk] = n;
}

/* The NaN policy (kdloss.h) for the maximum m of the columns outside S (bias added, S masked to
 * -inf): a max drops NaN (fmaxf always; a vector max in the lanes where a number follows it), and
 * where it leaves -inf the row would look as if it had no column outside S (its sums skipped,
 * the NaN lost). So a -inf maximum is checked for a NaN (a pass only on such rows), and a NaN
 * maximum, or one found, is returned as +inf: the sums at +inf are then NaN exactly where a NaN
 * or +inf is (inf - inf), on every path, and a MAX all-reduce of the ranks' maxima cannot drop
 * it as it could a NaN. One compare a row otherwise. */
static inline float ph_keep_nan(const float *z, int64_t v, float m) {
    if (m > -INFINITY) return m;
    if (m == -INFINITY) {
        for (int64_t c = 0; c < v; c++)
            if (isnan(z[c])) return INFINITY;
        return m;
    }
    return INFINITY; /* NaN */
}

static void PH(topk_max)(const kd_fld_rows *a, int64_t i) {
    double *mx = a->stat_max + 2 * i, *sm = a->stat_sum + a->n_sum * i;
    float *z = a->zs + i * a->v;
    mx[0] = mx[1] = -INFINITY;
    if (ph_ignored(a, i)) return;
    int64_t y = ph_label_col(a, i), kk = a->topk->k;
    const float *b = a->bias_s;
    if (a->map_s.on) { /* the bias and the map first: every logit below is the model's */
        PH_MAP(z, b, a->v, &a->map_s);
        b = NULL;
    }
    /* the label's logit, read before the mask (labels exist when the cross-entropy is on) */
    sm[3] = a->hard && y >= 0 ? (b ? z[y] + b[y] : z[y]) : 0.0;
    ph_gather(a, i, z, b);
    const int64_t *col = ph_tk(a, i);
    const float *zk = (const float *)(col + kk + 1);
    /* -inf when S holds every local column; +inf when a NaN or +inf is outside S (ph_keep_nan) */
    float mr = ph_keep_nan(z, a->v, PH_FOLD_MAX(z, b, a->v)), m = mr;
    for (int64_t k = 0; k < col[kk]; k++)
        if (col[k] >= 0 && zk[k] > m) m = zk[k];
    mx[0] = mr;
    mx[1] = m;
}

static void PH(topk_sums)(const kd_fld_rows *a, int64_t i) {
    double *sm = a->stat_sum + a->n_sum * i;
    const float *z = a->zs + i * a->v;
    float mr = (float)a->stat_max[2 * i], it = a->inv_t;
    int64_t kk = a->topk->k;
    sm[0] = sm[1] = sm[2] = 0.0;
    if (a->ent) sm[kd_fld_ent_at(kk)] = 0.0;
    if (ph_ignored(a, i)) return;
    const int64_t *col = ph_tk(a, i);
    const float *zk = (const float *)(col + kk + 1);
    if (!(mr == -INFINITY)) { /* a NaN maximum goes on, so that the NaN reaches the sums */
        sm[0] = PH_SUM_EXP_S(a, z, a->v, mr, it, sm + kd_fld_ent_at(kk));
        if ((a->hard || a->row_lse) && it != 1.0f) sm[1] = PH_SUM_EXP_ROW(z, a->v, mr, 1.0f);
    }
    for (int64_t k = 0; k < col[kk]; k++) sm[4 + k] = zk[k];
}

/* The entropy of a top-k row over all V (docs/MATH.md section 12): L = logaddexp(rest, lse of
 * zk / T) normalizes Q; outside S, log Q = u + c with c = mr / T - L, so that part is
 * e^c (sum -e^u u - c sum e^u) (both terms >= 0: c <= 0); each slot adds -Q log Q. */
static inline double ph_topk_entropy(const kd_fld_rows *a, const double *sm, const float *zk,
                                     int64_t n, float mr, int none, double rest) {
    double l = kd_topk_logaddexp(rest, kd_topk_lse(zk, n, a->inv_t64)), h = 0.0;
    if (!none) {
        double c = (double)mr * a->inv_t64 - l;
        h = exp(c) * (sm[kd_fld_ent_at(a->topk->k)] - c * sm[0]);
    }
    for (int64_t k = 0; k < n; k++) {
        double lq = (double)zk[k] * a->inv_t64 - l, q = exp(lq);
        if (q > 0.0) h -= q * lq;
    }
    return h;
}

static void PH(topk_div)(const kd_fld_rows *a, int64_t i) {
    const double *sm = a->stat_sum + a->n_sum * i;
    double *dv = a->stat_div + 2 * i;
    int64_t kk = a->topk->k, *col = ph_tk(a, i), n = col[kk];
    float *zk = (float *)(col + kk + 1), *lp = zk + kk, *gk = lp + kk;
    float mr = (float)a->stat_max[2 * i], it = a->inv_t;
    dv[0] = dv[1] = 0.0;
    a->row_hard[i] = 0.0;
    a->row_soft[i] = 0.0;
    if (a->row_lse) a->row_lse[i] = 0.0f;
    if (a->row_ent) a->row_ent[i] = 0.0f;
    if (ph_ignored(a, i)) return;
    for (int64_t k = 0; k < n; k++) zk[k] = (float)sm[4 + k]; /* every rank's slots */
    int none = mr == -INFINITY; /* no column outside S (a NaN maximum is not that) */
    double rest = !none ? (double)mr * a->inv_t64 + log(sm[0]) : -INFINITY, lse1 = 0.0;
    if (a->row_ent) a->row_ent[i] = (float)ph_topk_entropy(a, sm, zk, n, mr, none, rest);
    if (a->hard || a->row_lse) {
        double rest1 = it == 1.0f ? rest : !none ? (double)mr + log(sm[1]) : -INFINITY;
        lse1 = kd_topk_logaddexp(rest1, kd_topk_lse(zk, n, 1.0));
    }
    if (a->hard) a->row_hard[i] = lse1 - sm[3];
    if (a->row_lse) a->row_lse[i] = (float)lse1;
    if (a->soft)
        a->row_soft[i] = kd_topk_row(&a->coef, a->tail, n, zk, lp, a->inv_t64, rest, gk, &dv[0]);
    dv[1] = lse1;
}

/* Phase 4 of a top-k row outside S: the row's constants (topk_grad), then its n columns from z
 * (S's own columns, masked to -inf, give 0 there and are written afterwards). */
typedef struct ph_tk_rest {
    float c1, mr, lr, m, l2;
    int nan, wide;
} ph_tk_rest;

static void PH(topk_rest_cols)(const kd_fld_rows *a, const ph_tk_rest *r, float *z, int64_t n) {
    if (r->nan) {
        /* a poisoned row (kd_topk_row's c_rest NaN): NaN in every column outside S (the NaN
         * policy) also where no column outside S is above -inf (none, e.g. an infinite weight
         * row times a negative hidden state), which would otherwise skip them and leave 0 there
         * where the sparse renorm_both path and CUDA give NaN */
        for (int64_t c = 0; c < n; c++) z[c] = NAN;
    } else if (r->wide) { /* the careful form (row_special.h) */
        for (int64_t c = 0; c < n; c++) {
            double d = 0.0;
            if (r->c1 != 0.0f) d = (double)r->c1 * exp(((double)z[c] - r->mr) * a->inv_t64 - r->lr);
            if (a->gh != 0.0f) d += (double)a->gh * exp(((double)z[c] - r->m) - r->l2);
            z[c] = (float)d;
        }
    } else {
        PH_REST_GRAD(z, n, r->c1, r->mr, a->inv_t, r->lr, a->gh, r->m, r->l2);
    }
}

/* Phase 4 outside S under a student softcap, tile by tile (ph_capped); the label's -gh where it
 * lies outside S, before its factor. */
static void PH(topk_rest_capped)(const kd_fld_rows *a, const ph_tk_rest *r, float *z,
                                 int64_t y_rest) {
    float f[KD_FLD_TILE];
    for (int64_t c0 = 0; c0 < a->v; c0 += KD_FLD_TILE) {
        int64_t n = a->v - c0 < KD_FLD_TILE ? a->v - c0 : KD_FLD_TILE;
        ph_cap_factors(&a->map_s, z + c0, n, f);
        PH(topk_rest_cols)(a, r, z + c0, n);
        if (a->gh != 0.0f && y_rest >= c0 && y_rest < c0 + n) z[y_rest] -= a->gh;
        ph_cap_apply(z + c0, n, f);
    }
}

static void PH(topk_grad)(const kd_fld_rows *a0, int64_t i) {
    const double *sm = a0->stat_sum + a0->n_sum * i, *dv = a0->stat_div + 2 * i;
    float *z = a0->zs + i * a0->v;
    if (!a0->grad) return;
    if (ph_ignored(a0, i)) {
        memset(z, 0, (size_t)a0->v * sizeof(float));
        return;
    }
    kd_fld_rows wb;
    const kd_fld_rows *a = ph_weighted(a0, i, &wb);
    int64_t kk = a->topk->k, *col = ph_tk(a, i), n = col[kk], y = ph_label_col(a, i);
    const float *zk = (const float *)(col + kk + 1), *gk = zk + 2 * kk;
    int soft = a->soft && a->gs != 0.0f, capped = ph_capped(a);
    double lse1 = dv[1];
    ph_tk_rest r;
    r.mr = (float)a->stat_max[2 * i];
    r.m = (float)a->stat_max[2 * i + 1];
    int none = r.mr == -INFINITY;
    r.c1 = soft && !none ? (float)(a->gs * dv[0]) : 0.0f;
    r.lr = !none ? (float)log(sm[0]) : 0.0f;
    r.l2 = (float)(lse1 - (double)r.m);
    r.nan = soft && isnan(dv[0]);
    r.wide = kd_row_wide(r.mr) && !none;
    if (capped) {
        int64_t y_rest = y; /* the label's column when it lies outside S */
        for (int64_t k = 0; k < n; k++)
            if (col[k] == y) y_rest = -1;
        PH(topk_rest_capped)(a, &r, z, y_rest);
    } else {
        PH(topk_rest_cols)(a, &r, z, a->v);
    }
    for (int64_t k = 0; k < n; k++) {
        if (col[k] < 0) continue;
        float d = soft ? a->gs * gk[k] : 0.0f;
        if (a->gh != 0.0f) d += a->gh * (float)exp((double)zk[k] - lse1);
        if (capped) d = (a->gh != 0.0f && col[k] == y ? d - a->gh : d) * kd_map_dcap(&a->map_s, zk[k]);
        z[col[k]] = d;
    }
    if (!capped && a->gh != 0.0f && y >= 0) z[y] -= a->gh;
}

/* ---- entry points ---- */

/* Phase `ph` (1..4) of row i. */
static inline void PH(phase)(const kd_fld_rows *a, const PH_CTX *k, int ph, int64_t i) {
    if (a->topk) {
        switch (ph) {
        case 1: PH(topk_max)(a, i); break;
        case 2: PH(topk_sums)(a, i); break;
        case 3: PH(topk_div)(a, i); break;
        default: PH(topk_grad)(a, i); break;
        }
        return;
    }
    switch (ph) {
    case 1: PH(dense_max)(a, i); break;
    case 2: PH(dense_sums)(a, i); break;
    case 3: PH(dense_div)(a, k, i); break;
    default: PH(dense_grad)(a, i); break;
    }
}

/* Whether the chunk is worth an OpenMP team (see KD_FLD_PAR_MIN). */
static inline int ph_parallel(const kd_fld_rows *a) {
    return a->n > 1 && a->n * a->v >= KD_FLD_PAR_MIN && kd_omp_team();
}
