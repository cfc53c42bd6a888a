/* The sparse-teacher row of the fused loss's row kernel (docs/MATH.md section 8), written once
 * for the scalar kernel (fljsd_rows_scalar.c) and the vector ones (fljsd_rows_impl.h). The
 * includer names the function TK_ROW and provides the V-wide passes:
 *   TK_FOLD_MAX(z, b, v)     adds the bias b (or NULL) to z in place, returns the row max
 *   TK_SUM_EXP(z, v, m, s)   sum over the row of exp((z - m) s), double
 *   TK_REST_GRAD(z, v, c1, m1, s1, l1, c2, m2, l2)
 *                            z = c1 exp((z - m1) s1 - l1) + c2 exp(z - m2 - l2) in place (a term
 *                            whose c is 0 is skipped; a -inf element gives 0)
 * Per row: the used slots S are gathered (logits with their bias, the teacher's log-probs) and
 * masked to -inf in the row first, so every V-wide pass sees only the columns outside S: their
 * max (the bias added in the same pass) and tempered sum-exp give R = lse(zs_j / T : j not in S).
 * kd_topk_row (topk_row.h) does all the work on S; the gradient pass writes the columns outside
 * S, then the slots and the label's -1 are written over them. */
#include <math.h>
#include <string.h>

#include "topk.h"
#include "topk_row.h"

/* Gathers row r's used slots in slot order: col[n] = id, zk[n] = z[id] + b[id] (the bias as
 * TK_FOLD_MAX adds it), lp[n] = its log-prob; masks z[id] = -inf. Returns n = |S|. */
static inline int64_t tk_gather(const kdloss_topk_teacher *t, int64_t r, float *z, const float *b,
                                int64_t *col, float *zk, float *lp) {
    int is64 = t->ids.dtype == KDLOSS_I64;
    int64_t n = 0;
    for (int64_t j = 0; j < t->k; j++) {
        int64_t id = kd_topk_id(t->ids.data, is64, t->ids.ld, r, j);
        if (id < 0) continue; /* -1: unused (the ids were checked) */
        col[n] = id;
        zk[n] = b ? z[id] + b[id] : z[id];
        lp[n] = kd_topk_logprob(t, r, j);
        z[id] = -INFINITY;
        n++;
    }
    return n;
}

/* Row i of the chunk (a->topk set). */
static void TK_ROW(const kd_fljsd_rows *a, int64_t i) {
    int64_t v = a->v, r = a->row0 + i, kk = a->topk->k;
    float *z = a->zs + i * v;
    int64_t y = a->labels.data ? kd_label_at(a->labels, r) : -1;
    a->row_soft[i] = 0.0;
    a->row_hard[i] = 0.0;
    if (a->row_lse) a->row_lse[i] = 0.0f;
    if (a->labels.data && y == a->ignore_index) {
        if (a->grad) memset(z, 0, (size_t)v * sizeof(float));
        return;
    }
    int64_t *col = (int64_t *)(a->tk + (size_t)i * kd_topk_row_scratch(kk));
    float *zk = (float *)(col + kk), *lp = zk + kk, *gk = lp + kk;
    float it = a->inv_t;
    /* labels exist when the cross-entropy is on; read before the mask */
    float zy = a->hard ? (a->bs ? z[y] + a->bs[y] : z[y]) : 0.0f;
    int64_t n = tk_gather(a->topk, r, z, a->bs, col, zk, lp);
    float mr = TK_FOLD_MAX(z, a->bs, v), m = mr; /* mr: -inf when S holds every column */
    for (int64_t k = 0; k < n; k++) m = zk[k] > m ? zk[k] : m;
    double lr = 0.0, rest = -INFINITY;
    if (mr > -INFINITY) {
        lr = log(TK_SUM_EXP(z, v, mr, it));
        rest = (double)mr * it + lr;
    }
    double lse1 = 0.0; /* untempered log-sum-exp over all V columns */
    if (a->hard || a->row_lse) {
        double rest1 = rest; /* the same sum when T = 1 */
        if (it != 1.0f && mr > -INFINITY) rest1 = (double)mr + log(TK_SUM_EXP(z, v, mr, 1.0f));
        lse1 = kd_topk_logaddexp(rest1, kd_topk_lse(zk, n, 1.0));
    }
    if (a->hard) a->row_hard[i] = lse1 - (double)zy;
    if (a->row_lse) a->row_lse[i] = (float)lse1;
    double c_rest = 0.0;
    int soft = a->soft && a->gs != 0.0f;
    if (a->soft)
        a->row_soft[i] = kd_topk_row(&a->coef, a->tail, n, zk, lp, it, rest, gk, &c_rest);
    if (!a->grad) return;
    float c1 = soft && mr > -INFINITY ? (float)(a->gs * c_rest) : 0.0f;
    TK_REST_GRAD(z, v, c1, mr, it, (float)lr, a->gh, m, (float)(lse1 - (double)m));
    for (int64_t k = 0; k < n; k++) {
        float d = soft ? a->gs * gk[k] : 0.0f;
        if (a->gh != 0.0f) d += a->gh * (float)exp((double)zk[k] - lse1);
        z[col[k]] = d;
    }
    if (a->gh != 0.0f) z[y] -= a->gh;
}
