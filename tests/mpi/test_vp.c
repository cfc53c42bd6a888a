/* The vocabulary-parallel fused losses under MPI (run by ctest with mpirun -np 2 and -np 3,
 * --oversubscribe): every rank draws the same inputs (rank 0's seed, broadcast), holds an
 * uneven block of the LM heads, calls the _vp function through include/kdloss_mpi.h, and checks
 * its results against the single-process call it also makes on the whole heads:
 *   loss, soft/hard losses, row outputs   rtol 1e-6 (the blocks change only the order in which
 *                                          fp32 tile sums and the ranks' doubles are added)
 *   dxs, dws, dbs (its block)             atol 1e-5 x the largest |value| + rtol 1e-5 (the dxs
 *                                          sum over ranks is another fp32 summation order)
 * Cases: dense JSD / forward KL with cross-entropy, T 2, t2_scale, bias, several chunks, ignored
 * rows, bf16 operands; the sparse teacher in every tail mode, ids on every rank, unused slots,
 * no labels; and the agreement: a rank with a bad argument (its status, KDLOSS_ERR_PEER on the
 * others, nothing written), blocks that do not tile the vocabulary (SHAPE_MISMATCH), and ranks
 * that disagree: one rank with v_total + 1 or without dxs (SHAPE_MISMATCH everywhere),
 * or with another temperature (INVALID_PARAM everywhere), nothing written. With per-row weights
 * (exact zeros included) and the entropy (docs/MATH.md section 12): dense reverse KL and JSD
 * (fp32, bf16), the sparse teacher in every tail; the entropy at rtol 1e-6 like the losses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss_mpi.h"
#include "testutil.h"

typedef struct shape {
    int64_t bt, hs, ht, v, k;
    kdloss_dtype dt;
} shape;

/* Rank r's block of v rows: uneven, every block non-empty (r+1 shares of 1+2+..+size). */
static void block(int64_t v, int rank, int size, int64_t *lo, int64_t *n) {
    int64_t tot = (int64_t)size * (size + 1) / 2, acc = 0;
    for (int r = 0; r < rank; r++) acc += r + 1;
    *lo = v * acc / tot;
    *n = v * (acc + rank + 1) / tot - *lo;
}

static void *randmat(kt_rng *g, int64_t rows, int64_t cols, double scale, kdloss_dtype dt) {
    double *d = malloc((size_t)(rows * cols) * sizeof(double));
    for (int64_t i = 0; i < rows * cols; i++) d[i] = scale * kt_normal(g);
    void *p = kt_pack(d, rows, cols, cols, dt);
    free(d);
    return p;
}

static double get(const void *p, kdloss_dtype dt, int64_t i) { return kt_get(p, dt, 0, 0, i); }

/* max |a - b| <= 1e-5 max |b| + 1e-5 |b| element by element; a at offset oa of its buffer */
static void close_vec(const char *what, const void *a, const void *b, int64_t n, kdloss_dtype dt,
                      const char *tag) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(get(b, dt, i)));
    double tol_u = dt == KDLOSS_BF16 ? 2 * kt_eps(dt) : 1e-5; /* bf16: one rounding apart */
    for (int64_t i = 0; i < n; i++)
        if (!kt_close(get(a, dt, i), get(b, dt, i), tol_u * mx, tol_u, "%s %s [%lld]", tag, what,
                      (long long)i))
            return;
}

typedef struct outs {
    float loss, soft, hard;
    void *dxs, *dws, *dbs;
    float *row_soft, *row_hard, *row_lse, *row_ent;
} outs;

/* The cases with the student's entropy asked for (row_entropy; docs/MATH.md section 12). */
static int g_ent = 0;

static void outs_alloc(outs *o, const shape *s, int64_t v, int bias) {
    size_t es = kdloss_dtype_size(s->dt);
    o->dxs = calloc((size_t)(s->bt * s->hs), es);
    o->dws = calloc((size_t)(v * s->hs), es);
    o->dbs = bias ? calloc((size_t)v, es) : NULL;
    o->row_soft = calloc((size_t)s->bt, 4);
    o->row_hard = calloc((size_t)s->bt, 4);
    o->row_lse = calloc((size_t)s->bt, 4);
    o->row_ent = calloc((size_t)s->bt, 4);
}

static void outs_free(outs *o) {
    free(o->dxs);
    free(o->dws);
    free(o->dbs);
    free(o->row_soft);
    free(o->row_hard);
    free(o->row_lse);
    free(o->row_ent);
}

static kdloss_fused_linear_distill_out view(outs *o, const shape *s, int hard) {
    kdloss_fused_linear_distill_out d = {&o->loss,
                                         &o->soft,
                                         hard ? &o->hard : NULL,
                                         {o->dxs, s->dt, 0},
                                         {o->dws, s->dt, 0},
                                         o->dbs,
                                         o->row_soft,
                                         hard ? o->row_hard : NULL,
                                         hard ? o->row_lse : NULL, g_ent ? o->row_ent : NULL};
    return d;
}

/* vp results (this rank's block lo, n) against the whole-vocabulary call's */
static void compare(const outs *p, const outs *w, const shape *s, int64_t lo, int64_t n, int hard,
                    const char *tag) {
    size_t es = kdloss_dtype_size(s->dt);
    kt_close(p->loss, w->loss, 1e-30, 1e-6, "%s loss", tag);
    kt_close(p->soft, w->soft, 1e-30, 1e-6, "%s soft", tag);
    if (hard) kt_close(p->hard, w->hard, 1e-30, 1e-6, "%s hard", tag);
    for (int64_t r = 0; r < s->bt; r++) {
        kt_close(p->row_soft[r], w->row_soft[r], 1e-6, 1e-6, "%s row_soft[%lld]", tag, (long long)r);
        if (g_ent)
            kt_close(p->row_ent[r], w->row_ent[r], 1e-7, 1e-6, "%s row_entropy[%lld]", tag,
                     (long long)r);
        if (hard) {
            kt_close(p->row_hard[r], w->row_hard[r], 1e-6, 1e-6, "%s row_hard", tag);
            kt_close(p->row_lse[r], w->row_lse[r], 1e-6, 1e-6, "%s row_lse", tag);
        }
    }
    close_vec("dxs", p->dxs, w->dxs, s->bt * s->hs, s->dt, tag);
    close_vec("dws", p->dws, (const char *)w->dws + (size_t)(lo * s->hs) * es, n * s->hs, s->dt,
              tag);
    if (p->dbs) close_vec("dbs", p->dbs, (const char *)w->dbs + (size_t)lo * es, n, s->dt, tag);
}

static int64_t *labels_for(kt_rng *g, const shape *s) {
    int64_t *y = malloc((size_t)s->bt * sizeof(int64_t));
    for (int64_t r = 0; r < s->bt; r++) y[r] = r % 5 == 3 ? -100 : kt_randint(g, s->v);
    return y;
}

static void dense_case(kt_rng *g, const kdloss_mpi_comm *c, const shape *s,
                       const kdloss_fused_linear_distill_params *p, int bias, const char *tag) {
    size_t es = kdloss_dtype_size(s->dt);
    void *xs = randmat(g, s->bt, s->hs, 1.0, s->dt), *ws = randmat(g, s->v, s->hs, 0.3, s->dt);
    void *xt = randmat(g, s->bt, s->ht, 1.0, s->dt), *wt = randmat(g, s->v, s->ht, 0.3, s->dt);
    void *bs = bias ? randmat(g, 1, s->v, 0.5, s->dt) : NULL;
    void *bt = bias ? randmat(g, 1, s->v, 0.5, s->dt) : NULL;
    int64_t *y = labels_for(g, s), lo, n;
    block(s->v, c->comm.rank, c->comm.size, &lo, &n);
    kdloss_labels lab = {y, KDLOSS_I64};
    outs w, q;
    outs_alloc(&w, s, s->v, bias);
    outs_alloc(&q, s, n, bias);
    kdloss_fused_linear_distill_out ow = view(&w, s, 1), oq = view(&q, s, 1);
    kdloss_status st = kdloss_fused_linear_distill(p, s->bt, s->hs, s->ht, s->v,
                                                   (kdloss_cmat){xs, s->dt, 0},
                                                   (kdloss_cmat){ws, s->dt, 0}, bs,
                                                   (kdloss_cmat){xt, s->dt, 0},
                                                   (kdloss_cmat){wt, s->dt, 0}, bt, lab, &ow, NULL, 0);
    KT_CHECK(st == KDLOSS_OK, "%s whole: %s", tag, kdloss_status_string(st));
    kdloss_vocab_shard sh = {&c->comm, s->v, lo};
    st = kdloss_fused_linear_distill_vp(
        p, &sh, s->bt, s->hs, s->ht, n, (kdloss_cmat){xs, s->dt, 0},
        (kdloss_cmat){(char *)ws + (size_t)(lo * s->hs) * es, s->dt, 0},
        bias ? (char *)bs + (size_t)lo * es : NULL, (kdloss_cmat){xt, s->dt, 0},
        (kdloss_cmat){(char *)wt + (size_t)(lo * s->ht) * es, s->dt, 0},
        bias ? (char *)bt + (size_t)lo * es : NULL, lab, &oq, NULL, 0);
    KT_CHECK(st == KDLOSS_OK, "%s vp: %s", tag, kdloss_status_string(st));
    if (st == KDLOSS_OK) compare(&q, &w, s, lo, n, 1, tag);
    outs_free(&w);
    outs_free(&q);
    free(xs), free(ws), free(xt), free(wt), free(bs), free(bt), free(y);
}

/* teacher ids: distinct per row, drawn over the whole vocabulary (so every rank holds some),
 * two unused slots when K > 3; log-probs decreasing from -1 */
static void topk_teacher(kt_rng *g, const shape *s, int32_t *ids, float *lp) {
    for (int64_t r = 0; r < s->bt; r++) {
        int32_t *row = ids + r * s->k;
        for (int64_t j = 0; j < s->k; j++) {
            int dup;
            do { /* rejection: k <= v */
                row[j] = (int32_t)kt_randint(g, s->v);
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= row[i] == row[j];
            } while (dup);
            lp[r * s->k + j] = (float)(-1.0 - 0.3 * (double)j - 0.1 * kt_uniform(g));
        }
        if (s->k > 3 && s->k < s->v) row[1] = row[s->k - 1] = -1;
    }
}

static void topk_case(kt_rng *g, const kdloss_mpi_comm *c, const shape *s,
                      const kdloss_fused_linear_topk_distill_params *p, int with_labels,
                      const char *tag) {
    size_t es = kdloss_dtype_size(s->dt);
    void *xs = randmat(g, s->bt, s->hs, 1.0, s->dt), *ws = randmat(g, s->v, s->hs, 0.3, s->dt);
    void *bs = randmat(g, 1, s->v, 0.5, s->dt);
    int32_t *ids = malloc((size_t)(s->bt * s->k) * 4);
    float *lp = malloc((size_t)(s->bt * s->k) * 4);
    topk_teacher(g, s, ids, lp);
    int64_t *y = labels_for(g, s), lo, n;
    block(s->v, c->comm.rank, c->comm.size, &lo, &n);
    kdloss_labels lab = {with_labels ? y : NULL, KDLOSS_I64};
    kdloss_topk_teacher t = {s->k, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
    int hard = p->weight_hard_loss > 0.0;
    outs w, q;
    outs_alloc(&w, s, s->v, 1);
    outs_alloc(&q, s, n, 1);
    kdloss_fused_linear_distill_out ow = view(&w, s, hard), oq = view(&q, s, hard);
    kdloss_status st = kdloss_fused_linear_topk_distill(p, s->bt, s->hs, s->v,
                                                        (kdloss_cmat){xs, s->dt, 0},
                                                        (kdloss_cmat){ws, s->dt, 0}, bs, t, lab,
                                                        &ow, NULL, 0);
    KT_CHECK(st == KDLOSS_OK, "%s whole: %s", tag, kdloss_status_string(st));
    kdloss_vocab_shard sh = {&c->comm, s->v, lo};
    st = kdloss_fused_linear_topk_distill_vp(
        p, &sh, s->bt, s->hs, n, (kdloss_cmat){xs, s->dt, 0},
        (kdloss_cmat){(char *)ws + (size_t)(lo * s->hs) * es, s->dt, 0},
        (char *)bs + (size_t)lo * es, t, lab, &oq, NULL, 0);
    KT_CHECK(st == KDLOSS_OK, "%s vp: %s", tag, kdloss_status_string(st));
    if (st == KDLOSS_OK) compare(&q, &w, s, lo, n, hard, tag);
    outs_free(&w);
    outs_free(&q);
    free(xs), free(ws), free(bs), free(ids), free(lp), free(y);
}

/* A bad argument on the last rank: it gets its own status, the others KDLOSS_ERR_PEER, and
 * nobody's outputs change. Then blocks that leave a gap: SHAPE_MISMATCH everywhere. */
static void agreement_cases(kt_rng *g, const kdloss_mpi_comm *c) {
    shape s = {8, 16, 16, 97, 0, KDLOSS_F32};
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    void *xs = randmat(g, s.bt, s.hs, 1.0, s.dt), *ws = randmat(g, s.v, s.hs, 0.3, s.dt);
    int64_t *y = labels_for(g, &s), lo, n;
    block(s.v, c->comm.rank, c->comm.size, &lo, &n);
    float loss = 12345.0f;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &loss;
    kdloss_vocab_shard sh = {&c->comm, s.v, lo};
    int last = c->comm.rank == c->comm.size - 1;
    kdloss_fused_linear_distill_params bad = p;
    bad.temperature = last ? -1.0 : 1.0;
    kdloss_status st = kdloss_fused_linear_distill_vp(
        &bad, &sh, s.bt, s.hs, s.hs, n, (kdloss_cmat){xs, s.dt, 0},
        (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_cmat){xs, s.dt, 0},
        (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_labels){y, KDLOSS_I64}, &o,
        NULL, 0);
    kdloss_status want = last ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_PEER;
    KT_CHECK(st == want, "bad temperature on the last rank: got %d want %d", st, want);
    KT_CHECK(loss == 12345.0f, "nothing written after a rejected call");
    kdloss_vocab_shard gap = {&c->comm, s.v, lo + (c->comm.rank > 0)};
    st = kdloss_fused_linear_distill_vp(
        &p, &gap, s.bt, s.hs, s.hs, n - (c->comm.rank > 0), (kdloss_cmat){xs, s.dt, 0},
        (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_cmat){xs, s.dt, 0},
        (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_labels){y, KDLOSS_I64}, &o,
        NULL, 0);
    KT_CHECK(st == (c->comm.size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK),
             "blocks that leave a gap: got %d", st);
    KT_CHECK(c->comm.size == 1 || loss == 12345.0f, "nothing written after a mismatch");
    /* ranks that disagree return, every one of them, with nothing written. The last
     * rank's v_total one more (its block reaching it), or no dxs, or another temperature. */
    if (c->comm.size > 1) {
        float *dxs = malloc((size_t)(s.bt * s.hs) * sizeof(float));
        float *ws1 = malloc((size_t)((s.v + 1) * s.hs) * sizeof(float));
        memcpy(ws1, ws, (size_t)(s.v * s.hs) * sizeof(float));
        for (int64_t i = s.v * s.hs; i < (s.v + 1) * s.hs; i++) ws1[i] = 0.01f;
        for (int kind = 0; kind < 3; kind++) {
            for (int64_t i = 0; i < s.bt * s.hs; i++) dxs[i] = 777.0f;
            kdloss_fused_linear_distill_out od = o;
            od.dxs = (kdloss_mat){kind == 1 && last ? NULL : dxs, KDLOSS_F32, 0};
            kdloss_vocab_shard shv = {&c->comm, kind == 0 && last ? s.v + 1 : s.v, lo};
            int64_t nv = kind == 0 && last ? n + 1 : n;
            kdloss_fused_linear_distill_params pk = p;
            if (kind == 2 && last) pk.temperature = 2.0;
            st = kdloss_fused_linear_distill_vp(
                &pk, &shv, s.bt, s.hs, s.hs, nv, (kdloss_cmat){xs, s.dt, 0},
                (kdloss_cmat){ws1 + lo * s.hs, s.dt, 0}, NULL, (kdloss_cmat){xs, s.dt, 0},
                (kdloss_cmat){ws1 + lo * s.hs, s.dt, 0}, NULL, (kdloss_labels){y, KDLOSS_I64},
                &od, NULL, 0);
            kdloss_status wk = kind == 2 ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_SHAPE_MISMATCH;
            static const char *names[3] = {"v_total + 1", "no dxs", "another temperature"};
            KT_CHECK(st == wk, "one rank with %s: got %d want %d", names[kind], st, wk);
            int untouched = loss == 12345.0f;
            for (int64_t i = 0; i < s.bt * s.hs; i++) untouched &= dxs[i] == 777.0f;
            KT_CHECK(untouched, "one rank with %s: nothing written", names[kind]);
        }
        free(dxs), free(ws1);
    }
    /* a rank outside [0, size) cannot take part: rejected at once, before any collective */
    kdloss_comm odd = c->comm;
    int ranks[2] = {-1, c->comm.size + 100};
    for (int i = 0; i < 2; i++) {
        odd.rank = ranks[i];
        kdloss_vocab_shard sho = {&odd, s.v, lo};
        st = kdloss_fused_linear_distill_vp(
            &p, &sho, s.bt, s.hs, s.hs, n, (kdloss_cmat){xs, s.dt, 0},
            (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_cmat){xs, s.dt, 0},
            (kdloss_cmat){(float *)ws + lo * s.hs, s.dt, 0}, NULL, (kdloss_labels){y, KDLOSS_I64},
            &o, NULL, 0);
        KT_CHECK(st == KDLOSS_ERR_INVALID_PARAM && loss == 12345.0f, "rank %d: got %d", ranks[i],
                 st);
    }
    free(xs), free(ws), free(y);
}

/* Per-row weights (replicated, exact zeros among them) and the entropy (docs/MATH.md section 12):
 * dense reverse KL (fp32, chunked) and JSD (bf16), the sparse teacher in every tail. */
static void weighted_cases(kt_rng *g, const kdloss_mpi_comm *c, const shape *d1, const shape *d2,
                           const shape *k1, kdloss_fused_linear_distill_params dp,
                           kdloss_fused_linear_topk_distill_params tp) {
    char tag[128];
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = i % 6 == 4 ? 0.0f : (float)(0.2 + 2.0 * kt_uniform(g));
    g_ent = 1;
    dp.div.divergence = KDLOSS_DIV_REVERSE_KL;
    dp.row_weights = w;
    dense_case(g, c, d1, &dp, 1, "dense rev weights entropy chunked");
    dp.div.divergence = KDLOSS_DIV_JSD;
    dense_case(g, c, d2, &dp, 1, "dense jsd weights entropy bf16");
    tp.row_weights = w;
    for (int tail = 0; tail < 3; tail++) {
        tp.tail = (kdloss_topk_tail)tail;
        tp.div.divergence = tail == 2 ? KDLOSS_DIV_FORWARD_KL : KDLOSS_DIV_REVERSE_KL;
        snprintf(tag, sizeof tag, "topk %s weights entropy", kdloss_topk_tail_name(tp.tail));
        topk_case(g, c, k1, &tp, 1, tag);
    }
    g_ent = 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    kdloss_mpi_comm c;
    if (kdloss_comm_from_mpi(MPI_COMM_WORLD, &c) != KDLOSS_OK) return 2;
    unsigned long long seed = c.comm.rank == 0 ? kt_base_seed() : 0;
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    kt_rng g;
    kt_rng_seed(&g, seed);
    char tag[128];

    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_distill_params_default(&dp);
    shape d1 = {37, 24, 20, 301, 0, KDLOSS_F32};
    dense_case(&g, &c, &d1, &dp, 1, "dense jsd"); /* default: JSD 0.5, w 0.5 / 0.5 */
    dp.div.divergence = KDLOSS_DIV_FORWARD_KL;
    dp.temperature = 2.0;
    dp.t2_scale = 1;
    dp.chunk_size = 8; /* five chunks, the last short */
    dense_case(&g, &c, &d1, &dp, 1, "dense fwd T2 chunked");
    dp.div.divergence = KDLOSS_DIV_SKEW_REVERSE_KL;
    shape d2 = {21, 32, 16, 250, 0, KDLOSS_BF16};
    dense_case(&g, &c, &d2, &dp, 0, "dense skew-rev bf16");

    kdloss_fused_linear_topk_distill_params tp;
    kdloss_fused_linear_topk_distill_params_default(&tp);
    shape k1 = {29, 24, 0, 307, 9, KDLOSS_F32};
    for (int tail = 0; tail < 3; tail++) {
        tp.tail = (kdloss_topk_tail)tail;
        tp.div.divergence = tail == 2 ? KDLOSS_DIV_FORWARD_KL : KDLOSS_DIV_JSD;
        tp.weight_hard_loss = 0.0;
        tp.temperature = 1.0;
        tp.chunk_size = 0;
        snprintf(tag, sizeof tag, "topk %s soft only, no labels", kdloss_topk_tail_name(tp.tail));
        topk_case(&g, &c, &k1, &tp, 0, tag);
        tp.weight_hard_loss = 0.5;
        tp.temperature = 1.5;
        tp.chunk_size = 7;
        snprintf(tag, sizeof tag, "topk %s with CE, T 1.5, chunked", kdloss_topk_tail_name(tp.tail));
        topk_case(&g, &c, &k1, &tp, 1, tag);
    }
    shape k2 = {16, 32, 0, 64, 64, KDLOSS_F32}; /* K = V: no tail bin */
    tp.tail = KDLOSS_TAIL_BUCKET;
    tp.div.divergence = KDLOSS_DIV_TVD;
    topk_case(&g, &c, &k2, &tp, 1, "topk bucket K = V tvd");
    weighted_cases(&g, &c, &d1, &d2, &k1, dp, tp);

    agreement_cases(&g, &c);
    /* every rank's verdict: the test fails when any rank failed */
    int fails = kt_failures, all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int code = c.comm.rank == 0 ? kt_finish("test_vp") : (kt_finish("test_vp (rank)"), 0);
    MPI_Finalize();
    return all ? 1 : code;
}
