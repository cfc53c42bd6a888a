/* The vocabulary-parallel agreement under faults, with the ranks as threads of
 * this process and the test's own communicator: a rendezvous all-reduce that reduces every
 * rank's buffer in rank order, refuses calls whose count, dtype or op differ between ranks (as
 * MPI would fail them), logs each rank's calls, and gives up after a timeout (so that a hang is a
 * failure, never a stuck test: a scenario passes only if no rank ever waited that long). A hook
 * may tamper with the result one rank reads back from a given call.
 *
 * Every scenario runs both _vp entry points' rules on 2 and 3 ranks with uneven blocks; outputs
 * are poisoned before the call and must be unchanged after any error:
 *   - the honest call: every rank OK, equal to the single-process call (loss rtol 1e-6), with the
 *     documented protocol (agreement of 2 size + 12 doubles, confirmation of 3, then per chunk);
 *   - D1: the agreed chunk tampered on every rank to 1e6, 0, NaN, -1, 2.5; to 9 on one rank
 *     against plans of 4; to 3 on one rank only (legal alone, but unlike the others'); the error
 *     flag NaN; a block slot NaN; the confirmation tampered on every rank: KDLOSS_ERR_COMM on
 *     every rank;
 *   - D2: one rank with v_total + 1 and its block reaching it: SHAPE_MISMATCH on every rank;
 *   - D3: one rank without dxs, without any gradient, with every label ignored (its early
 *     exit), without labels' ... bias, with bf16 operands: SHAPE_MISMATCH on every rank; one rank
 *     with another temperature, divergence, beta, weight, t2_scale, ignore_index or grad_scale
 *     (top-k: tail), another student logit map (softcap, scale; a scale of 0 is 1, so that one
 *     agrees) or teacher map: INVALID_PARAM on every rank;
 *   - a bad argument on one rank: its own status, PEER on the others; a callback that fails on
 *     every rank: COMM; chunk sizes that differ between ranks: OK (the smallest is used);
 *   - row weights (with zeros) and the entropy on every rank: OK, equal to the single-process
 *     call (loss and entropy rtol 1e-6, dxs 1e-5), the SUM of the sums one double a row longer;
 *     weights on one rank only, weights that differ in one row on one rank, or the entropy on one
 *     rank only: SHAPE_MISMATCH on every rank (docs/MATH.md section 12); the entropy alone (no
 *     loss part) on every rank: OK, equal to the single-process call.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "vp.h"

#define MAXR 3
#define MAXLOG 256
#define TIMEOUT_S 5

typedef struct call_rec {
    int64_t n;
    kdloss_dtype dt;
    kdloss_comm_op op;
} call_rec;

struct world;
/* Tampers with what rank `rank` reads back from its call number `call` (n elements). */
typedef void (*tamper_fn)(const struct world *w, int rank, int call, void *buf, int64_t n);

typedef struct world {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned gen;
    int broken;    /* a rank waited TIMEOUT_S: every later call fails */
    int timed_out; /* set when that happened: the scenario failed */
    void *bufs[MAXR];
    call_rec cur[MAXR];
    int ncalls[MAXR];
    call_rec log[MAXR][MAXLOG];
    int fail_all;  /* every callback returns -1 without reducing */
    tamper_fn tamper;
    double tval;   /* the tampering's value */
    int trank;     /* the rank tampered with, -1 for every rank */
} world;

typedef struct rank_ctx {
    world *w;
    int rank;
} rank_ctx;

/* Every rank of the world arrives, or the wait times out (returns -1, the world broken). */
static int rendezvous(world *w) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += TIMEOUT_S;
    pthread_mutex_lock(&w->mu);
    if (w->broken) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    unsigned g = w->gen;
    if (++w->arrived == w->size) {
        w->arrived = 0;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    while (g == w->gen && !w->broken) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) {
            w->broken = w->timed_out = 1;
            pthread_cond_broadcast(&w->cv);
        }
    }
    int ok = g != w->gen;
    pthread_mutex_unlock(&w->mu);
    return ok ? 0 : -1;
}

static int allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    rank_ctx *rc = (rank_ctx *)ctx;
    world *w = rc->w;
    int me = rc->rank, call = w->ncalls[me];
    if (call < MAXLOG) w->log[me][call] = (call_rec){n, dt, op};
    w->ncalls[me]++;
    if (w->fail_all) return -1;
    w->bufs[me] = buf;
    w->cur[me] = (call_rec){n, dt, op};
    if (rendezvous(w)) return -1;
    int same = 1;
    for (int r = 0; r < w->size; r++)
        same &= w->cur[r].n == n && w->cur[r].dt == dt && w->cur[r].op == op;
    size_t es = dt == KDLOSS_F64 ? 8 : 4;
    void *tmp = malloc((size_t)n * es + 8);
    if (same) { /* every rank reduces every buffer in rank order: the same bits everywhere */
        for (int64_t i = 0; i < n; i++) {
            double acc = 0.0;
            for (int r = 0; r < w->size; r++) {
                double x = dt == KDLOSS_F64 ? ((double *)w->bufs[r])[i]
                                            : (double)((float *)w->bufs[r])[i];
                acc = r == 0 ? x : op == KDLOSS_COMM_MAX ? (x > acc ? x : acc) : acc + x;
            }
            if (dt == KDLOSS_F64) ((double *)tmp)[i] = acc;
            else ((float *)tmp)[i] = (float)acc;
        }
    }
    int rc2 = rendezvous(w); /* every rank has read every buffer */
    if (same && !rc2) memcpy(buf, tmp, (size_t)n * es);
    free(tmp);
    if (!same || rc2) return -1;
    if (w->tamper && (w->trank < 0 || w->trank == me)) w->tamper(w, me, call, buf, n);
    return 0;
}

/* ---- tampering ---- */

/* call 0 (the agreement): its -chunk slot becomes -tval */
static void t_chunk(const world *w, int rank, int call, void *buf, int64_t n) {
    (void)rank, (void)n;
    if (call == 0) ((double *)buf)[2 * w->size + KD_VP_AG_NEG_CHUNK] = -w->tval;
}

static void t_error_flag(const world *w, int rank, int call, void *buf, int64_t n) {
    (void)rank, (void)n;
    if (call == 0) ((double *)buf)[2 * w->size + KD_VP_AG_ERROR] = w->tval;
}

/* the last rank's block size */
static void t_block(const world *w, int rank, int call, void *buf, int64_t n) {
    (void)rank, (void)n;
    if (call == 0) ((double *)buf)[2 * (w->size - 1) + 1] = w->tval;
}

/* call 1 (the confirmation): the verdict flag */
static void t_confirm(const world *w, int rank, int call, void *buf, int64_t n) {
    (void)w, (void)rank, (void)n;
    if (call == 1) ((double *)buf)[0] = w->tval;
}

/* ---- the data and the ranks ---- */

enum { BT = 12, HS = 16, HT = 12, V = 97, K = 6 };

typedef struct data {
    void *xs[2], *ws[2], *xt[2], *wt[2], *bs[2], *bt[2]; /* [0] fp32, [1] bf16; V + 1 rows */
    int64_t lab[BT], lab_ignored[BT], lab_kept[BT];
    int32_t ids[BT * K];
    float lp[BT * K];
    float w[BT], w_other[BT]; /* row weights (exact zeros included); w_other differs in one */
} data;

typedef struct outs {
    float sc[3];
    float rows[3 * BT];
    float dxs[BT * HS];
    float dws[(V + 1) * HS];
    float dbs[V + 1];
    float ent[BT];
} outs;

static void outs_poison(outs *o) { kt_poison(o, (int64_t)(sizeof *o / 4), KDLOSS_F32); }
static int outs_untouched(const outs *o) { return kt_is_poison(o, (int64_t)(sizeof *o / 4), KDLOSS_F32); }

typedef struct job {
    int rank, topk;
    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_vocab_shard shard;
    int64_t lo, n;
    kdloss_dtype dt;
    int no_dxs, no_grad, ignore_all, no_bias, kept, ent, ent_only;
    kdloss_comm comm;
    rank_ctx rc;
    const data *d;
    outs o;
    kdloss_status status;
} job;

static void blocks(int64_t v, int rank, int size, int64_t *lo, int64_t *n) {
    int64_t tot = (int64_t)size * (size + 1) / 2, acc = 0;
    for (int r = 0; r < rank; r++) acc += r + 1;
    *lo = v * acc / tot;
    *n = v * (acc + rank + 1) / tot - *lo;
}

static kdloss_fused_linear_distill_out view(outs *o, kdloss_dtype dt, int dxs, int grad, int bias) {
    kdloss_fused_linear_distill_out out = {&o->sc[0], &o->sc[1], &o->sc[2],
                                           {grad && dxs ? o->dxs : NULL, dt, 0},
                                           {grad ? o->dws : NULL, dt, 0},
                                           grad && bias ? o->dbs : NULL,
                                           o->rows, o->rows + BT, o->rows + 2 * BT, NULL};
    return out;
}

static void *job_run(void *arg) {
    job *j = (job *)arg;
    const data *d = j->d;
    int t = j->dt == KDLOSS_BF16;
    size_t es = kdloss_dtype_size(j->dt);
    kdloss_cmat xs = {d->xs[t], j->dt, 0};
    kdloss_cmat ws = {(char *)d->ws[t] + (size_t)(j->lo * HS) * es, j->dt, 0};
    const void *bs = j->no_bias ? NULL : (char *)d->bs[t] + (size_t)j->lo * es;
    kdloss_labels lab = {j->ignore_all ? d->lab_ignored : j->kept ? d->lab_kept : d->lab, KDLOSS_I64};
    kdloss_fused_linear_distill_out out = view(&j->o, j->dt, !j->no_dxs, !j->no_grad, !j->no_bias);
    if (j->ent) out.row_entropy = j->o.ent;
    if (j->ent_only) out = (kdloss_fused_linear_distill_out){.row_entropy = j->o.ent};
    if (j->topk) {
        kdloss_topk_teacher tk = {K, {d->ids, KDLOSS_I32, 0}, {d->lp, KDLOSS_F32, 0}};
        j->status = kdloss_fused_linear_topk_distill_vp(&j->tp, &j->shard, BT, HS, j->n, xs, ws,
                                                        bs, tk, lab, &out, NULL, 0);
    } else {
        kdloss_cmat xt = {d->xt[t], j->dt, 0};
        kdloss_cmat wt = {(char *)d->wt[t] + (size_t)(j->lo * HT) * es, j->dt, 0};
        const void *btb = j->no_bias ? NULL : (char *)d->bt[t] + (size_t)j->lo * es;
        j->status = kdloss_fused_linear_distill_vp(&j->dp, &j->shard, BT, HS, HT, j->n, xs, ws, bs,
                                                   xt, wt, btb, lab, &out, NULL, 0);
    }
    return NULL;
}

typedef void (*setup_fn)(job *j, int size, world *w);

typedef struct scenario {
    const char *name;
    setup_fn setup;
    int topk_ok; /* also run with the top-k teacher */
    kdloss_status want_fault, want_other; /* fault: the last rank; want_other: every other rank */
} scenario;

static void jobs_init(job *jobs, int size, int topk, const data *d, world *w) {
    memset(w, 0, sizeof *w);
    w->size = size;
    w->trank = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (int r = 0; r < size; r++) {
        job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->rank = r;
        j->topk = topk;
        j->d = d;
        j->dt = KDLOSS_F32;
        kdloss_fused_linear_distill_params_default(&j->dp);
        j->dp.div.divergence = KDLOSS_DIV_FORWARD_KL;
        j->dp.temperature = 2.0;
        j->dp.chunk_size = 4;
        kdloss_fused_linear_topk_distill_params_default(&j->tp);
        j->tp.weight_hard_loss = 0.5;
        j->tp.temperature = 1.5;
        j->tp.chunk_size = 4;
        blocks(V, r, size, &j->lo, &j->n);
        j->rc = (rank_ctx){w, r};
        j->comm = (kdloss_comm){r, size, allreduce, &j->rc};
        j->shard = (kdloss_vocab_shard){&j->comm, V, j->lo};
        outs_poison(&j->o);
    }
}

static void jobs_run(job *jobs, int size) {
    pthread_t th[MAXR];
    for (int r = 0; r < size; r++)
        if (pthread_create(&th[r], NULL, job_run, &jobs[r])) {
            printf("pthread_create failed\n");
            exit(2);
        }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
}

/* the last rank is "the rank at fault" */
#define LAST(j, size) ((j)->rank == (size) - 1)

static void s_honest(job *j, int size, world *w) { (void)j, (void)size, (void)w; }
static void s_chunks_differ(job *j, int size, world *w) {
    (void)size, (void)w;
    j->dp.chunk_size = j->tp.chunk_size = 3 + 2 * j->rank;
}
static void s_fail_all(job *j, int size, world *w) { (void)j, (void)size, w->fail_all = 1; }
static void s_chunk(world *w, double v) { w->tamper = t_chunk, w->tval = v; }
static void s_chunk_1e6(job *j, int size, world *w) { (void)j, (void)size, s_chunk(w, 1e6); }
static void s_chunk_0(job *j, int size, world *w) { (void)j, (void)size, s_chunk(w, 0.0); }
static void s_chunk_nan(job *j, int size, world *w) { (void)j, (void)size, s_chunk(w, NAN); }
static void s_chunk_neg(job *j, int size, world *w) { (void)j, (void)size, s_chunk(w, -1.0); }
static void s_chunk_frac(job *j, int size, world *w) { (void)j, (void)size, s_chunk(w, 2.5); }
static void s_chunk_9_one(job *j, int size, world *w) {
    (void)j;
    s_chunk(w, 9.0);
    w->trank = size - 1;
}
static void s_chunk_3_one(job *j, int size, world *w) {
    (void)j;
    s_chunk(w, 3.0);
    w->trank = size - 1;
}
static void s_flag_nan(job *j, int size, world *w) {
    (void)j, (void)size;
    w->tamper = t_error_flag, w->tval = NAN;
}
static void s_block_nan(job *j, int size, world *w) {
    (void)j, (void)size;
    w->tamper = t_block, w->tval = NAN;
}
static void s_confirm(job *j, int size, world *w) {
    (void)j, (void)size;
    w->tamper = t_confirm, w->tval = 1.0;
}
static void s_vtotal(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->shard.v_total = V + 1, j->n++; /* its block reaches V + 1 */
}
static void s_no_dxs(job *j, int size, world *w) { (void)w, j->no_dxs = LAST(j, size); }
static void s_no_grad(job *j, int size, world *w) { (void)w, j->no_grad = LAST(j, size); }
static void s_ignore_all(job *j, int size, world *w) { (void)w, j->ignore_all = LAST(j, size); }
static void s_no_bias(job *j, int size, world *w) { (void)w, j->no_bias = LAST(j, size); }
static void s_bf16(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dt = KDLOSS_BF16;
}
static void s_temperature(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.temperature = j->tp.temperature = 1.0;
}
static void s_divergence(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.div.divergence = j->tp.div.divergence = KDLOSS_DIV_REVERSE_KL;
}
static void s_beta(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.div.beta = j->tp.div.beta = 0.25;
}
static void s_weight(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.weight_soft_loss = j->tp.weight_soft_loss = 0.75;
}
static void s_t2(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.t2_scale = j->tp.t2_scale = 1;
}
static void s_ignore_index(job *j, int size, world *w) {
    (void)w;
    j->kept = 1; /* labels all in [0, V): -1 ignores none of them, -100 none either */
    if (LAST(j, size)) j->dp.ignore_index = j->tp.ignore_index = -1;
}
static void s_grad_scale(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.grad_scale = j->tp.grad_scale = 0.5;
}
static void s_student_cap(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.student_map.softcap = j->tp.student_map.softcap = 30.0;
}
static void s_student_scale(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.student_map.scale = j->tp.student_map.scale = 0.5;
}
static void s_teacher_cap(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.teacher_map.softcap = 30.0;
}
static void s_scale_zero(job *j, int size, world *w) { /* 0 reads as 1: the same map */
    (void)w;
    if (LAST(j, size)) j->dp.student_map.scale = j->tp.student_map.scale = 0.0;
}
static void s_tail(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->tp.tail = KDLOSS_TAIL_RENORM_BOTH;
}
/* Row weights (replicated) and the entropy on every rank: OK, equal to the single process. */
static void s_wt_ent(job *j, int size, world *w) {
    (void)size, (void)w;
    j->dp.row_weights = j->tp.row_weights = j->d->w;
    j->ent = 1;
}
static void s_wt_one(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.row_weights = j->tp.row_weights = j->d->w;
}
static void s_wt_differ(job *j, int size, world *w) {
    (void)w;
    j->dp.row_weights = j->tp.row_weights = LAST(j, size) ? j->d->w_other : j->d->w;
}
static void s_ent_one(job *j, int size, world *w) { (void)w, j->ent = LAST(j, size); }
/* The entropy alone (no loss part weighted or asked for): the tempered pass still runs. */
static void s_ent_alone(job *j, int size, world *w) {
    s_wt_ent(j, size, w);
    j->ent_only = 1;
    j->dp.weight_soft_loss = j->dp.weight_hard_loss = 0.0;
    j->tp.weight_soft_loss = j->tp.weight_hard_loss = 0.0;
}

static void s_bad_arg(job *j, int size, world *w) {
    (void)w;
    if (LAST(j, size)) j->dp.temperature = j->tp.temperature = -1.0;
}

/* The single-process call on the whole heads, for the honest scenario. */
static kdloss_status whole(const job *j0, const data *d, outs *o) {
    kdloss_labels lab = {d->lab, KDLOSS_I64};
    kdloss_fused_linear_distill_out out = view(o, KDLOSS_F32, 1, 1, 1);
    if (j0->ent) out.row_entropy = o->ent; /* j0's params carry its row weights */
    if (j0->ent_only) out = (kdloss_fused_linear_distill_out){.row_entropy = o->ent};
    kdloss_cmat xs = {d->xs[0], KDLOSS_F32, 0}, ws = {d->ws[0], KDLOSS_F32, 0};
    if (j0->topk) {
        kdloss_topk_teacher tk = {K, {d->ids, KDLOSS_I32, 0}, {d->lp, KDLOSS_F32, 0}};
        return kdloss_fused_linear_topk_distill(&j0->tp, BT, HS, V, xs, ws, d->bs[0], tk, lab,
                                                &out, NULL, 0);
    }
    return kdloss_fused_linear_distill(&j0->dp, BT, HS, HT, V, xs, ws, d->bs[0],
                                       (kdloss_cmat){d->xt[0], KDLOSS_F32, 0},
                                       (kdloss_cmat){d->wt[0], KDLOSS_F32, 0}, d->bt[0], lab, &out,
                                       NULL, 0);
}

/* Rank 0's calls: the agreement, the confirmation, then 3 (top-k) or 4 per chunk of 4 rows; the
 * SUM of the sums one double a row longer with the entropy (kdloss.h). */
static void check_protocol(const char *tag, const world *w, int topk, int ent) {
    call_rec want[64];
    int n = 0;
    want[n++] = (call_rec){2 * (int64_t)w->size + 12, KDLOSS_F64, KDLOSS_COMM_MAX};
    want[n++] = (call_rec){3, KDLOSS_F64, KDLOSS_COMM_MAX};
    for (int64_t r0 = 0; r0 < BT; r0 += 4) {
        int64_t m = BT - r0 < 4 ? BT - r0 : 4;
        want[n++] = (call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_MAX};
        want[n++] = (call_rec){(4 + (topk ? K : 0) + ent) * m, KDLOSS_F64, KDLOSS_COMM_SUM};
        if (!topk) want[n++] = (call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_SUM};
        want[n++] = (call_rec){m * HS, KDLOSS_F32, KDLOSS_COMM_SUM};
    }
    int same = w->ncalls[0] == n;
    for (int i = 0; same && i < n; i++)
        same = w->log[0][i].n == want[i].n && w->log[0][i].dt == want[i].dt &&
               w->log[0][i].op == want[i].op;
    KT_CHECK(same, "%s: rank 0 made %d all-reduces, the protocol has %d (or they differ)", tag,
             w->ncalls[0], n);
}

/* The honest scenarios against the single-process call: the loss (1e-6), the entropy (1e-6) and
 * dxs (1e-5), and the documented protocol (with the entropy alone: the entropy and no gradient). */
static void check_whole(const char *tag, const job *jobs, int size, const data *d,
                        const world *w, int topk) {
    int only = jobs[0].ent_only;
    if (!only) check_protocol(tag, w, topk, jobs[0].ent);
    outs o;
    outs_poison(&o);
    kdloss_status s = whole(&jobs[0], d, &o);
    KT_CHECK(s == KDLOSS_OK, "%s: whole call %d", tag, (int)s);
    for (int r = 0; r < size && s == KDLOSS_OK; r++) {
        if (!only) kt_close(jobs[r].o.sc[0], o.sc[0], 1e-30, 1e-6, "%s rank %d loss", tag, r);
        for (int64_t i = 0; jobs[r].ent && i < BT; i++)
            if (!kt_close(jobs[r].o.ent[i], o.ent[i], 1e-7, 1e-6, "%s rank %d entropy %lld", tag,
                          r, (long long)i))
                break;
        for (int64_t i = 0; !only && i < BT * HS; i++)
            if (!kt_close(jobs[r].o.dxs[i], o.dxs[i], 1e-5, 1e-5, "%s rank %d dxs", tag, r))
                break;
    }
}

static void run_scenario(const scenario *sc, int size, int topk, const data *d) {
    char tag[160];
    snprintf(tag, sizeof tag, "%s %s ranks=%d", sc->name, topk ? "topk" : "dense", size);
    job jobs[MAXR];
    world w;
    jobs_init(jobs, size, topk, d, &w);
    for (int r = 0; r < size; r++) sc->setup(&jobs[r], size, &w);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    jobs_run(jobs, size);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    KT_CHECK(!w.timed_out, "%s: a rank waited %d s in a collective (a hang), %.1f s in all", tag,
             TIMEOUT_S, secs);
    for (int r = 0; r < size; r++) {
        job *j = &jobs[r];
        kdloss_status want = r == size - 1 ? sc->want_fault : sc->want_other;
        KT_CHECK(j->status == want, "%s rank %d: got %d (%s), want %d", tag, r, (int)j->status,
                 kdloss_status_string(j->status), (int)want);
        if (want != KDLOSS_OK)
            KT_CHECK(outs_untouched(&j->o), "%s rank %d: outputs written after an error", tag, r);
    }
    /* every rank made the same calls */
    for (int r = 1; r < size && !w.timed_out; r++) {
        int same = w.ncalls[r] == w.ncalls[0];
        for (int i = 0; same && i < w.ncalls[0] && i < MAXLOG; i++)
            same = !memcmp(&w.log[r][i], &w.log[0][i], sizeof w.log[0][i]);
        KT_CHECK(same, "%s: rank %d's all-reduces differ from rank 0's", tag, r);
    }
    if (sc->setup == s_honest || sc->setup == s_wt_ent || sc->setup == s_ent_alone)
        check_whole(tag, jobs, size, d, &w, topk);
    if (sc->setup == s_chunks_differ)
        for (int r = 1; r < size; r++)
            KT_CHECK(jobs[r].o.sc[0] == jobs[0].o.sc[0], "%s: rank %d's loss differs", tag, r);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
}

static void data_make(kt_rng *g, data *d) {
    const int64_t rows[6] = {BT, V + 1, BT, V + 1, 1, 1}, cols[6] = {HS, HS, HT, HT, V + 1, V + 1};
    const double scale[6] = {1.0, 0.3, 1.0, 0.3, 0.5, 0.5};
    void **dst[6] = {d->xs, d->ws, d->xt, d->wt, d->bs, d->bt};
    for (int m = 0; m < 6; m++) {
        double *x = malloc((size_t)(rows[m] * cols[m]) * sizeof(double));
        for (int64_t i = 0; i < rows[m] * cols[m]; i++) x[i] = scale[m] * kt_normal(g);
        dst[m][0] = kt_pack(x, rows[m], cols[m], cols[m], KDLOSS_F32);
        dst[m][1] = kt_pack(x, rows[m], cols[m], cols[m], KDLOSS_BF16);
        free(x);
    }
    for (int64_t r = 0; r < BT; r++) {
        d->lab[r] = r % 5 == 3 ? -100 : kt_randint(g, V);
        d->lab_ignored[r] = -100;
        d->lab_kept[r] = kt_randint(g, V);
        d->w[r] = d->w_other[r] = r % 4 == 1 ? 0.0f : (float)(0.2 + 2.0 * kt_uniform(g));
        for (int64_t k = 0; k < K; k++) {
            int dup;
            do {
                d->ids[r * K + k] = (int32_t)kt_randint(g, V);
                dup = 0;
                for (int64_t i = 0; i < k; i++) dup |= d->ids[r * K + i] == d->ids[r * K + k];
            } while (dup);
            d->lp[r * K + k] = (float)(-1.0 - 0.4 * (double)k);
        }
    }
}

static void data_free(data *d) {
    void **m[6] = {d->xs, d->ws, d->xt, d->wt, d->bs, d->bt};
    for (int i = 0; i < 6; i++) free(m[i][0]), free(m[i][1]);
}

int main(void) {
    kt_rng g;
    kt_rng_seed(&g, kt_base_seed());
    data d;
    data_make(&g, &d);
    d.w_other[BT - 2] = d.w[BT - 2] * 1.5f + 0.25f;
    const kdloss_status OK = KDLOSS_OK, COMM = KDLOSS_ERR_COMM, SHAPE = KDLOSS_ERR_SHAPE_MISMATCH,
                        PARAM = KDLOSS_ERR_INVALID_PARAM;
    const scenario sc[] = {
        {"honest", s_honest, 1, OK, OK},
        {"chunk sizes differ", s_chunks_differ, 1, OK, OK},
        {"callback fails", s_fail_all, 1, COMM, COMM},
        {"D1 chunk 1e6", s_chunk_1e6, 1, COMM, COMM},
        {"D1 chunk 0", s_chunk_0, 1, COMM, COMM},
        {"D1 chunk NaN", s_chunk_nan, 1, COMM, COMM},
        {"D1 chunk -1", s_chunk_neg, 1, COMM, COMM},
        {"D1 chunk 2.5", s_chunk_frac, 1, COMM, COMM},
        {"D1 chunk 9 on one rank (plans of 4)", s_chunk_9_one, 1, COMM, COMM},
        {"D1 chunk 3 on one rank", s_chunk_3_one, 1, COMM, COMM},
        {"error flag NaN", s_flag_nan, 1, COMM, COMM},
        {"block slot NaN", s_block_nan, 1, COMM, COMM},
        {"confirmation flag tampered", s_confirm, 1, COMM, COMM},
        {"D2 v_total + 1 on one rank", s_vtotal, 1, SHAPE, SHAPE},
        {"D3 one rank without dxs", s_no_dxs, 1, SHAPE, SHAPE},
        {"D3 one rank without gradients", s_no_grad, 1, SHAPE, SHAPE},
        {"D3 one rank with every label ignored", s_ignore_all, 1, SHAPE, SHAPE},
        {"one rank without biases", s_no_bias, 1, SHAPE, SHAPE},
        {"one rank in bf16", s_bf16, 1, SHAPE, SHAPE},
        {"D3 temperature", s_temperature, 1, PARAM, PARAM},
        {"D3 divergence", s_divergence, 1, PARAM, PARAM},
        {"D3 beta", s_beta, 1, PARAM, PARAM},
        {"D3 weight", s_weight, 1, PARAM, PARAM},
        {"D3 t2_scale", s_t2, 1, PARAM, PARAM},
        {"D3 ignore_index", s_ignore_index, 1, PARAM, PARAM},
        {"D3 grad_scale", s_grad_scale, 1, PARAM, PARAM},
        {"bad argument on one rank", s_bad_arg, 1, PARAM, KDLOSS_ERR_PEER},
        {"student softcap on one rank", s_student_cap, 1, PARAM, PARAM},
        {"student scale on one rank", s_student_scale, 1, PARAM, PARAM},
        {"student scale 0 (read as 1) on one rank", s_scale_zero, 1, OK, OK},
        {"teacher softcap on one rank", s_teacher_cap, 0, PARAM, PARAM},
        {"row weights and entropy on every rank", s_wt_ent, 1, OK, OK},
        {"row weights on one rank only", s_wt_one, 1, SHAPE, SHAPE},
        {"row weights that differ on one rank", s_wt_differ, 1, SHAPE, SHAPE},
        {"row entropy on one rank only", s_ent_one, 1, SHAPE, SHAPE},
        {"row entropy alone (no loss part) on every rank", s_ent_alone, 1, OK, OK},
    };
    const int nsc = (int)(sizeof sc / sizeof sc[0]);
    for (int size = 2; size <= MAXR; size++)
        for (int i = 0; i < nsc; i++) {
            run_scenario(&sc[i], size, 0, &d);
            if (sc[i].topk_ok) run_scenario(&sc[i], size, 1, &d);
        }
    /* top-k only: another tail on one rank (bucket against renorm_both) */
    const scenario tail = {"D3 tail", s_tail, 1, PARAM, PARAM};
    for (int size = 2; size <= MAXR; size++) run_scenario(&tail, size, 1, &d);
    data_free(&d);
    return kt_finish("test_vp_agree");
}
