/* The vocabulary-parallel entry points on one GPU, ranks as threads (tag "vp"):
 * kdloss_cuda_fused_linear_distill_vp and kdloss_cuda_fused_linear_topk_distill_vp with 2 and 3
 * ranks that are threads of this process on one device, each with its own stream, context,
 * block of the heads (uneven), outputs and workspace, against the single-process CUDA call on the
 * whole heads: losses and row outputs rtol 1e-6, gradients (dxs, the rank's dws / dbs block)
 * 1e-5 relative + 1e-5 x the largest entry (two bf16 roundings apart with bf16 operands), as
 * tests/mpi/test_vp.c. The communicator is the test's own: it checks that every rank makes the
 * same all-reduce calls (count, dtype, op) and records rank 0's sequence, which must be the
 * documented protocol (the agreement's two collectives, then per chunk MAX 2, SUM 4 (4 + K),
 * SUM 2 (dense), the dxs SUM); it can also tamper with what the ranks read back from one call
 * (tests/test_vp_agree.c's faults). The harness (vp_run_case) also serves the NaN section. */
#include "cuda_test.h"
#include "vp.h" /* the agreement buffer's slots (src/common), for the communicator's faults */
#ifdef KDLOSS_TEST_NCCL
#include "kdloss_nccl.h" /* built where CMake found NCCL: the adapter compiles and links here */
#endif

/* res = every rank's in[] reduced in rank order (fp32 sums in fp32, as NCCL and MPI do). */
static void vp_reduce(void *res, void *const *in, int size, int64_t n, kdloss_dtype dt,
                      kdloss_comm_op op) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == KDLOSS_F64) {
            double a = ((const double *)in[0])[i];
            for (int q = 1; q < size; q++) {
                double x = ((const double *)in[q])[i];
                a = op == KDLOSS_COMM_MAX ? (x > a ? x : a) : a + x;
            }
            ((double *)res)[i] = a;
        } else {
            float a = ((const float *)in[0])[i];
            for (int q = 1; q < size; q++) {
                float x = ((const float *)in[q])[i];
                a = op == KDLOSS_COMM_MAX ? (x > a ? x : a) : a + x;
            }
            ((float *)res)[i] = a;
        }
    }
}

/* kdloss_comm.allreduce of a device buffer: to the host on the rank's stream, reduced with the
 * other ranks, (tampered with when the world says so,) back. A call that another rank does not
 * make the same way fails (returns 1). */
static int vp_allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    vp_rank *me = (vp_rank *)ctx;
    vp_world *w = me->w;
    const int r = me->comm.rank, call = me->ncalls++;
    const size_t bytes = (size_t)(n > 0 ? n : 0) * (dt == KDLOSS_F64 ? 8u : 4u);
    void *mine = xmalloc(bytes), *res = xmalloc(bytes);
    int ok = n >= 0 && (dt == KDLOSS_F64 || dt == KDLOSS_F32) &&
             cudaMemcpyAsync(mine, buf, bytes, cudaMemcpyDeviceToHost, me->st) == cudaSuccess &&
             cudaStreamSynchronize(me->st) == cudaSuccess;
    w->in[r] = mine;
    w->call[r] = (vp_call_rec){ok ? n : -1, (int)dt, (int)op};
    pthread_barrier_wait(&w->bar);
    for (int q = 0; q < w->size; q++)
        ok &= w->call[q].n == n && w->call[q].dt == (int)dt && w->call[q].op == (int)op;
    if (ok) vp_reduce(res, w->in, w->size, n, dt, op);
    const vp_tamper *t = &w->tamper;
    if (ok && t->on && t->call == call && (t->rank < 0 || t->rank == r) && dt == KDLOSS_F64 &&
        t->slot >= 0 && t->slot < n)
        ((double *)res)[t->slot] = t->val;
    if (r == 0 && w->ncalls < VP_MAX_CALLS) w->log[w->ncalls] = w->call[0];
    if (r == 0) w->ncalls++;
    pthread_barrier_wait(&w->bar); /* every rank has read every input */
    ok = ok && cudaMemcpyAsync(buf, res, bytes, cudaMemcpyHostToDevice, me->st) == cudaSuccess &&
         cudaStreamSynchronize(me->st) == cudaSuccess;
    free(mine);
    free(res);
    return !ok;
}

static int vp_hard(const vp_case *c) { return c->topk ? c->tp.weight_hard_loss > 0.0 : 1; }

void vp_out_alloc(vp_out *o, const vp_case *c, int64_t rows) {
    const size_t es = kdloss_dtype_size(c->dt);
    o->d_sc = dalloc(3 * sizeof(float));
    o->d_rows = dalloc((size_t)(4 * c->bt) * sizeof(float));
    o->d_dxs = dalloc((size_t)(c->bt * c->hs) * es);
    o->d_dws = dalloc((size_t)(rows * c->hs) * es);
    o->d_dbs = c->bias ? dalloc((size_t)rows * es) : NULL;
    dpoison(o->d_sc, 3 * sizeof(float));
    dpoison(o->d_rows, (size_t)(4 * c->bt) * sizeof(float));
    dpoison(o->d_dxs, (size_t)(c->bt * c->hs) * es);
    dpoison(o->d_dws, (size_t)(rows * c->hs) * es);
    if (o->d_dbs) dpoison(o->d_dbs, (size_t)rows * es);
    o->rows = xmalloc((size_t)(4 * c->bt) * sizeof(float));
    o->dxs = xmalloc((size_t)(c->bt * c->hs) * es);
    o->dws = xmalloc((size_t)(rows * c->hs) * es);
    o->dbs = xmalloc((size_t)rows * es);
}

static kdloss_fused_linear_distill_out vp_view(const vp_out *o, const vp_case *c) {
    const int hard = vp_hard(c);
    kdloss_fused_linear_distill_out d;
    memset(&d, 0, sizeof d);
    d.loss = o->d_sc;
    d.soft_loss = o->d_sc + 1;
    d.hard_loss = hard ? o->d_sc + 2 : NULL;
    d.dxs = (kdloss_mat){o->d_dxs, c->dt, 0};
    d.dws = (kdloss_mat){o->d_dws, c->dt, 0};
    d.dbs = o->d_dbs;
    d.row_soft = o->d_rows;
    d.row_hard = hard ? o->d_rows + c->bt : NULL;
    d.row_lse = hard ? o->d_rows + 2 * c->bt : NULL;
    d.row_entropy = c->ent ? o->d_rows + 3 * c->bt : NULL;
    return d;
}

void vp_out_fetch(vp_out *o, const vp_case *c, int64_t rows) {
    const size_t es = kdloss_dtype_size(c->dt);
    d2h(o->sc, o->d_sc, 3 * sizeof(float));
    d2h(o->rows, o->d_rows, (size_t)(4 * c->bt) * sizeof(float));
    d2h(o->dxs, o->d_dxs, (size_t)(c->bt * c->hs) * es);
    d2h(o->dws, o->d_dws, (size_t)(rows * c->hs) * es);
    if (o->d_dbs) d2h(o->dbs, o->d_dbs, (size_t)rows * es);
}

void vp_out_free(vp_out *o) {
    CK(cudaFree(o->d_sc));
    CK(cudaFree(o->d_rows));
    CK(cudaFree(o->d_dxs));
    CK(cudaFree(o->d_dws));
    if (o->d_dbs) CK(cudaFree(o->d_dbs));
    free(o->rows), free(o->dxs), free(o->dws), free(o->dbs);
}

/* Rank r's block of v rows: uneven, every block non-empty (r+1 shares of 1+2+..+size). */
static void vp_block(int64_t v, int rank, int size, int64_t *lo, int64_t *n) {
    int64_t tot = (int64_t)size * (size + 1) / 2, acc = 0;
    for (int q = 0; q < rank; q++) acc += q + 1;
    *lo = v * acc / tot;
    *n = v * (acc + rank + 1) / tot - *lo;
}

/* A dense operand (rows x cols of N(0, sd)) in the case's dtype, on the device. */
static void *vp_put(kt_rng *g, const vp_case *c, int64_t rows, int64_t cols, double sd) {
    double *x = xmalloc((size_t)(rows * cols) * sizeof(double));
    fill_normal(g, x, rows * cols, sd);
    void *p = kt_pack(x, rows, cols, cols, c->dt);
    void *d = dupload(p, (size_t)(rows * cols) * kdloss_dtype_size(c->dt));
    free(p), free(x);
    return d;
}

/* Top-k ids distinct per row over the whole vocabulary (so every rank holds some), two unused
 * slots when 3 < K < V, log-probs decreasing from -1. */
static void vp_teacher_make(kt_rng *g, const vp_case *c, vp_data *d) {
    const int64_t bt = c->bt, k = c->k, kk = k > 0 ? k : 1;
    int32_t *ids = xmalloc((size_t)(bt * kk) * 4);
    float *lp = xmalloc((size_t)(bt * kk) * 4);
    memset(ids, 0xFF, (size_t)(bt * kk) * 4); /* -1: a dense case never reads them */
    memset(lp, 0, (size_t)(bt * kk) * 4);
    for (int64_t r = 0; r < bt; r++) {
        int32_t *row = ids + r * k;
        for (int64_t j = 0; j < k; j++) {
            int dup;
            do { /* rejection: k <= v */
                row[j] = (int32_t)kt_randint(g, c->v);
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= row[i] == row[j];
            } while (dup);
            lp[r * k + j] = (float)(-1.0 - 0.3 * (double)j - 0.1 * kt_uniform(g));
        }
        if (k > 3 && k < c->v) row[1] = row[k - 1] = -1;
    }
    d->ids = dupload(ids, (size_t)(bt * kk) * 4);
    d->lp = dupload(lp, (size_t)(bt * kk) * 4);
    free(ids), free(lp);
}

/* Operands as tests/mpi/test_vp.c draws them (logits of spread ~3, as this test's fused cases):
 * labels with every fifth row ignored; the top-k teacher (vp_teacher_make). */
static void vp_data_make(kt_rng *g, const vp_case *c, vp_data *d) {
    const int64_t bt = c->bt, hs = c->hs, ht = c->ht > 0 ? c->ht : 1, v = c->v;
    d->xs = vp_put(g, c, bt, hs, 1.0);
    d->ws = vp_put(g, c, v, hs, 3.0 / sqrt((double)hs));
    d->bs = vp_put(g, c, 1, v, 0.5);
    d->xt = vp_put(g, c, bt, ht, 1.0);
    d->wt = vp_put(g, c, v, ht, 3.0 / sqrt((double)ht));
    d->bt = vp_put(g, c, 1, v, 0.5);
    int64_t *lab = xmalloc((size_t)bt * sizeof(int64_t));
    for (int64_t r = 0; r < bt; r++) lab[r] = r % 5 == 3 ? -100 : kt_randint(g, v);
    d->lab = dupload(lab, (size_t)bt * sizeof(int64_t));
    free(lab);
    vp_teacher_make(g, c, d);
}

void vp_data_free(vp_data *d) {
    void *all[] = {d->xs, d->ws, d->bs, d->xt, d->wt, d->bt, d->lab, d->ids, d->lp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CK(cudaFree(all[i]));
}

static kdloss_topk_teacher vp_teacher(const vp_case *c, const vp_data *d) {
    kdloss_topk_teacher t = {c->k, {d->ids, KDLOSS_I32, 0}, {d->lp, KDLOSS_F32, 0}};
    return t;
}

kdloss_status vp_whole(const vp_case *c, const vp_data *d, vp_out *o) {
    kdloss_fused_linear_distill_out out = vp_view(o, c);
    kdloss_cmat xs = {d->xs, c->dt, 0}, ws = {d->ws, c->dt, 0};
    kdloss_labels lab = {c->topk && !c->labels ? NULL : d->lab, KDLOSS_I64};
    size_t wsb = 0;
    kdloss_status s =
        c->topk ? kdloss_cuda_fused_linear_topk_distill_workspace_size(&c->tp, c->bt, c->hs, c->v,
                                                                       c->k, c->dt, 1, &wsb)
                : kdloss_cuda_fused_linear_distill_workspace_size(&c->dp, c->bt, c->hs, c->ht,
                                                                  c->v, c->dt, 1, &wsb);
    if (s != KDLOSS_OK) return s;
    void *wk = dalloc(wsb);
    if (c->topk)
        s = kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &c->tp, c->bt, c->hs, c->v, xs, ws,
                                                  c->bias ? d->bs : NULL, vp_teacher(c, d), lab,
                                                  &out, wk, wsb);
    else
        s = kdloss_cuda_fused_linear_distill(g_ctx, g_st, &c->dp, c->bt, c->hs, c->ht, c->v, xs,
                                             ws, c->bias ? d->bs : NULL,
                                             (kdloss_cmat){d->xt, c->dt, 0},
                                             (kdloss_cmat){d->wt, c->dt, 0},
                                             c->bias ? d->bt : NULL, lab, &out, wk, wsb);
    CK(cudaStreamSynchronize(g_st));
    CK(cudaFree(wk));
    return s;
}

static kdloss_status vp_job_call(vp_job *j, void *wk, size_t wsb) {
    const vp_case *c = j->c;
    const vp_data *d = j->d;
    const size_t es = kdloss_dtype_size(c->dt);
    kdloss_fused_linear_distill_out out = vp_view(&j->o, c);
    if (j->no_dxs) out.dxs.data = NULL;
    if (j->row_entropy) out.row_entropy = j->row_entropy;
    kdloss_cmat xs = {d->xs, c->dt, 0},
                ws = {(char *)d->ws + (size_t)(j->lo * c->hs) * es, c->dt, 0};
    const void *bs = c->bias ? (const char *)d->bs + (size_t)j->lo * es : NULL;
    kdloss_labels lab = {c->topk && !c->labels ? NULL : d->lab, KDLOSS_I64};
    if (c->topk)
        return kdloss_cuda_fused_linear_topk_distill_vp(j->ctx, j->st, &j->tp, &j->shard, c->bt,
                                                        c->hs, j->n, xs, ws, bs, vp_teacher(c, d),
                                                        lab, &out, wk, wsb);
    kdloss_cmat xt = {d->xt, c->dt, 0};
    kdloss_cmat wt = {(char *)d->wt + (size_t)(j->lo * c->ht) * es, c->dt, 0};
    const void *btb = c->bias ? (const char *)d->bt + (size_t)j->lo * es : NULL;
    return kdloss_cuda_fused_linear_distill_vp(j->ctx, j->st, &j->dp, &j->shard, c->bt, c->hs,
                                               c->ht, j->n, xs, ws, bs, xt, wt, btb, lab, &out,
                                               wk, wsb);
}

/* A rank's thread: its stream and context (unless given), workspace, the call, the wait. */
static void *vp_job_run(void *arg) {
    vp_job *j = (vp_job *)arg;
    const vp_case *c = j->c;
    int own_st = !j->st, own_ctx = !j->ctx;
    if (own_st) CK(cudaStreamCreateWithFlags(&j->st, cudaStreamNonBlocking));
    if (own_ctx && kdloss_cuda_context_create(0, &j->ctx) != KDLOSS_OK) {
        j->status = KDLOSS_ERR_INTERNAL;
        return NULL;
    }
    if (j->rank) j->rank->st = j->st;
    size_t wsb = 0;
    kdloss_status s = c->topk ? kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(
                                    &c->tp, c->bt, c->hs, j->n, c->k, c->dt, 1, &wsb)
                              : kdloss_cuda_fused_linear_distill_vp_workspace_size(
                                    &c->dp, c->bt, c->hs, c->ht, j->n, c->dt, 1, &wsb);
    void *wk = dalloc(s == KDLOSS_OK ? wsb : 256);
    j->status = vp_job_call(j, wk, wsb - (j->ws_short ? 1 : 0));
    CK(cudaStreamSynchronize(j->st));
    j->word = j->status == KDLOSS_OK ? read_status(wk) : 0;
    CK(cudaFree(wk));
    if (own_ctx) kdloss_cuda_context_destroy(j->ctx);
    if (own_st) CK(cudaStreamDestroy(j->st));
    return NULL;
}

/* Every rank of `size` on its own thread, with the test's communicator (tampering as tp says,
 * NULL: honest). */
static void vp_run_ranks(vp_job *jobs, int size, vp_world *w, vp_rank *ranks,
                         const vp_tamper *tp) {
    pthread_t th[VP_MAX_RANKS];
    memset(w, 0, sizeof *w);
    w->size = size;
    if (tp) w->tamper = *tp;
    pthread_barrier_init(&w->bar, NULL, (unsigned)size);
    for (int r = 0; r < size; r++) {
        ranks[r].comm = (kdloss_comm){r, size, vp_allreduce, &ranks[r]};
        ranks[r].w = w;
        ranks[r].ncalls = 0;
        jobs[r].comm = &ranks[r].comm;
        jobs[r].shard.comm = jobs[r].comm;
        jobs[r].rank = &ranks[r];
        if (pthread_create(&th[r], NULL, vp_job_run, &jobs[r]) != 0) {
            printf("vp: pthread_create failed\n");
            exit(1);
        }
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w->bar);
}

/* The ranks of a case: each its uneven block and shard (its communicator comes with the run),
 * the case's params, fresh poisoned outputs. */
static void vp_jobs_init(vp_job *jobs, int size, const vp_case *c, const vp_data *d) {
    memset(jobs, 0, (size_t)size * sizeof *jobs);
    for (int r = 0; r < size; r++) {
        vp_job *j = &jobs[r];
        j->c = c, j->d = d, j->dp = c->dp, j->tp = c->tp;
        vp_block(c->v, r, size, &j->lo, &j->n);
        j->shard = (kdloss_vocab_shard){NULL, c->v, j->lo};
        vp_out_alloc(&j->o, c, j->n);
    }
}

void vp_run_case(const char *tag, const vp_case *c, const vp_data *d, int size, vp_out *whole,
                 vp_world *w, vp_rank_fn fn, void *arg) {
    int whole_ok = 0;
    if (whole) {
        vp_out_alloc(whole, c, c->v);
        const kdloss_status s = vp_whole(c, d, whole);
        whole_ok = KT_CHECK(s == KDLOSS_OK, "%s: whole call %s", tag, kdloss_status_string(s));
        vp_out_fetch(whole, c, c->v);
    }
    vp_job jobs[VP_MAX_RANKS];
    vp_rank ranks[VP_MAX_RANKS];
    vp_world own;
    vp_jobs_init(jobs, size, c, d);
    vp_run_ranks(jobs, size, w ? w : &own, ranks, NULL);
    for (int r = 0; r < size; r++) {
        vp_job *j = &jobs[r];
        char rt[200];
        snprintf(rt, sizeof rt, "%s rank %d", tag, r);
        if (j->status == KDLOSS_OK) vp_out_fetch(&j->o, c, j->n);
        fn(rt, c, j, whole_ok ? whole : NULL, arg);
        vp_out_free(&j->o);
    }
}

/* max |a - b| <= tol max |b| + tol |b| element by element (dtype dt, n elements). */
static void vp_close(const char *tag, const char *what, const void *a, const void *b, int64_t n,
                     kdloss_dtype dt) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(kt_get(b, dt, 0, 0, i)));
    const double tol = dt == KDLOSS_BF16 ? 2 * kt_eps(dt) : 1e-5; /* bf16: one rounding apart */
    for (int64_t i = 0; i < n; i++)
        if (!kt_close(kt_get(a, dt, 0, 0, i), kt_get(b, dt, 0, 0, i), tol * mx, tol, "%s %s [%lld]",
                      tag, what, (long long)i))
            return;
}

/* A rank's results against the whole call's (its block of dws / dbs). */
static void vp_compare(const char *tag, const vp_case *c, vp_job *j, const vp_out *w, void *arg) {
    const size_t es = kdloss_dtype_size(c->dt);
    const int hard = vp_hard(c);
    const vp_out *q = &j->o;
    KT_CHECK(j->status == KDLOSS_OK && j->word == KDLOSS_OK, "%s: %s, status word %d", tag,
             kdloss_status_string(j->status), (int)j->word);
    if (j->status != KDLOSS_OK || !w) return;
    kt_close(q->sc[0], w->sc[0], 1e-30, 1e-6, "%s loss", tag);
    kt_close(q->sc[1], w->sc[1], 1e-30, 1e-6, "%s soft", tag);
    if (hard) kt_close(q->sc[2], w->sc[2], 1e-30, 1e-6, "%s hard", tag);
    for (int64_t r = 0; r < c->bt; r++) {
        kt_close(q->rows[r], w->rows[r], 1e-6, 1e-6, "%s row_soft[%lld]", tag, (long long)r);
        if (!hard) continue;
        kt_close(q->rows[c->bt + r], w->rows[c->bt + r], 1e-6, 1e-6, "%s row_hard", tag);
        kt_close(q->rows[2 * c->bt + r], w->rows[2 * c->bt + r], 1e-6, 1e-6, "%s row_lse", tag);
    }
    /* the entropy: E / S + log S from the reduced double sums against the single-process
     * kernel's fp32 -Q x sums (docs/MATH.md 12.1: the same quantity, roundings apart) */
    for (int64_t r = 0; c->ent && r < c->bt; r++)
        kt_close(q->rows[3 * c->bt + r], w->rows[3 * c->bt + r], 64 * U32 * (1.0 + log(c->v)),
                 1e-5, "%s row_entropy[%lld]", tag, (long long)r);
    vp_close(tag, "dxs", q->dxs, w->dxs, c->bt * c->hs, c->dt);
    vp_close(tag, "dws", q->dws, (const char *)w->dws + (size_t)(j->lo * c->hs) * es,
             j->n * c->hs, c->dt);
    if (c->bias)
        vp_close(tag, "dbs", q->dbs, (const char *)w->dbs + (size_t)j->lo * es, j->n, c->dt);
    (void)arg;
}

/* Rank 0's all-reduces: the agreement (MAX of 2 size + 12 doubles, then the confirmation's MAX
 * of 3), then per chunk (the case's chunk_size, which every rank shares) MAX 2 rows, SUM (4 or
 * 4 + K, one more with the entropy) rows, SUM 2 rows (dense), SUM rows x Hs fp32 (dxs). */
static void vp_check_protocol(const char *tag, const vp_case *c, const vp_world *w) {
    vp_call_rec want[VP_MAX_CALLS];
    int n = 0;
    want[n++] = (vp_call_rec){2 * (int64_t)w->size + 12, KDLOSS_F64, KDLOSS_COMM_MAX};
    want[n++] = (vp_call_rec){3, KDLOSS_F64, KDLOSS_COMM_MAX};
    const int64_t chunk = c->topk ? c->tp.chunk_size : c->dp.chunk_size;
    for (int64_t r0 = 0; chunk > 0 && r0 < c->bt && n + 4 <= VP_MAX_CALLS; r0 += chunk) {
        const int64_t m = c->bt - r0 < chunk ? c->bt - r0 : chunk;
        want[n++] = (vp_call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_MAX};
        want[n++] = (vp_call_rec){(4 + (c->topk ? c->k : 0) + c->ent) * m, KDLOSS_F64,
                                  KDLOSS_COMM_SUM};
        if (!c->topk) want[n++] = (vp_call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_SUM};
        want[n++] = (vp_call_rec){m * c->hs, KDLOSS_F32, KDLOSS_COMM_SUM};
    }
    if (chunk <= 0) { /* automatic chunk: the agreement's two collectives at least */
        KT_CHECK(w->ncalls >= 2 && !memcmp(&w->log[0], &want[0], 2 * sizeof want[0]),
                 "%s: the agreement first", tag);
        return;
    }
    int same = w->ncalls == n;
    for (int i = 0; same && i < n; i++)
        same = w->log[i].n == want[i].n && w->log[i].dt == want[i].dt && w->log[i].op == want[i].op;
    KT_CHECK(same, "%s: %d all-reduces, the protocol has %d (or they differ)", tag, w->ncalls, n);
}

/* One case with `size` ranks: the whole call, the ranks, the comparisons, the protocol. */
static void test_vp_case(kt_rng *rng, const vp_case *c, int size) {
    char tag[160];
    snprintf(tag, sizeof tag, "vp %s ranks=%d", c->tag, size);
    vp_data d;
    vp_data_make(rng, c, &d);
    vp_out whole;
    vp_world w;
    vp_run_case(tag, c, &d, size, &whole, &w, vp_compare, NULL);
    vp_check_protocol(tag, c, &w);
    vp_out_free(&whole);
    vp_data_free(&d);
}

/* ---- the agreement's faults ---- */

enum { K_BAD_T, K_GAP, K_SHORT_WS, K_OTHER_T, K_NO_DXS, K_S_CAP, K_S_SCALE, K_T_CAP, K_WEIGHTS,
       K_BAD_W, K_OTHER_W, K_ENTROPY, K_CHUNK_1E6, K_CHUNK_0, K_CHUNK_NAN, K_N };
static const char *const VP_FAULTS[K_N] = {
    "bad temperature", "gap", "short workspace", "another temperature", "no dxs",
    "another student softcap", "another student scale", "another teacher softcap",
    "NaN row_weights on every rank", "a NaN row weight on the last rank",
    "other row_weights on the last rank", "row_entropy on the last rank",
    "chunk tampered to 1e6", "chunk tampered to 0", "chunk tampered to NaN"};

/* Rank r's status under fault `kind`. */
static kdloss_status vp_fault_want(int kind, int r, int size) {
    const int last = r == size - 1;
    switch (kind) {
    case K_BAD_T: return last ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_PEER;
    case K_SHORT_WS: return last ? KDLOSS_ERR_WORKSPACE_TOO_SMALL : KDLOSS_ERR_PEER;
    case K_GAP: return size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK;
    case K_OTHER_T: case K_S_CAP: case K_S_SCALE: case K_T_CAP:
        return size > 1 ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_OK;
    case K_NO_DXS: return size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK;
    /* the weights are read to the host and checked there (each rank its own), and their values
     * join the setup's fingerprint */
    case K_WEIGHTS: return KDLOSS_ERR_INVALID_PARAM;
    case K_BAD_W: return last ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_PEER;
    case K_OTHER_W: return size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK;
    case K_ENTROPY: /* the last rank alone asks for it: it sizes the SUM */
        return size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK;
    default: return KDLOSS_ERR_COMM;
    }
}

/* The fault on the ranks' arguments (the tampering is the communicator's); extra: bt poisoned
 * device floats (NaN row weights), bt more for row_entropy, then bt weights of 1 and bt of 1
 * but for a 0.5 in row 0. */
static void vp_fault_apply(int kind, vp_job *jobs, int size, float *extra) {
    for (int r = 0; r < size; r++) {
        vp_job *j = &jobs[r];
        const int last = r == size - 1;
        if (kind == K_BAD_T && last) j->dp.temperature = j->tp.temperature = -1.0;
        if (kind == K_GAP && r > 0) j->shard.v_begin++, j->n--; /* a gap before each block */
        j->ws_short = kind == K_SHORT_WS && last;
        if (kind == K_OTHER_T && last) j->dp.temperature = j->tp.temperature = 1.5;
        j->no_dxs = kind == K_NO_DXS && last;
        if (kind == K_S_CAP && last) j->dp.student_map.softcap = j->tp.student_map.softcap = 30.0;
        if (kind == K_S_SCALE && last) j->dp.student_map.scale = j->tp.student_map.scale = 0.5;
        if (kind == K_T_CAP && last) j->dp.teacher_map.softcap = 30.0;
        if (kind == K_WEIGHTS || (kind == K_BAD_W && last))
            j->dp.row_weights = j->tp.row_weights = extra;
        if (kind == K_BAD_W && !last) j->dp.row_weights = j->tp.row_weights = extra + 2 * j->c->bt;
        if (kind == K_OTHER_W)
            j->dp.row_weights = j->tp.row_weights = extra + (last ? 3 : 2) * j->c->bt;
        if (kind == K_ENTROPY && last) j->row_entropy = extra + j->c->bt;
    }
}

/* One fault on `size` ranks: each rank's status, nothing written on error, the agreement's two
 * collectives and no other. */
static void vp_fault_run(const vp_case *c, const vp_data *d, int size, int kind,
                         const char *teacher) {
    vp_job jobs[VP_MAX_RANKS];
    vp_rank ranks[VP_MAX_RANKS];
    vp_world w;
    vp_tamper tp = {0, 0, -1, 0, 0.0};
    if (kind >= K_CHUNK_1E6) { /* the agreement's -chunk slot, on every rank */
        const double val = kind == K_CHUNK_1E6 ? 1e6 : kind == K_CHUNK_0 ? 0.0 : NAN;
        tp = (vp_tamper){1, 0, -1, 2 * (int64_t)size + KD_VP_AG_NEG_CHUNK, -val};
    }
    vp_jobs_init(jobs, size, c, d);
    float *extra = dalloc((size_t)(4 * c->bt) * sizeof(float));
    float *ones = xmalloc((size_t)(2 * c->bt) * sizeof(float));
    for (int64_t i = 0; i < 2 * c->bt; i++) ones[i] = i == c->bt ? 0.5f : 1.0f;
    dpoison(extra, (size_t)(2 * c->bt) * sizeof(float));
    h2d(extra + 2 * c->bt, ones, (size_t)(2 * c->bt) * sizeof(float));
    free(ones);
    vp_fault_apply(kind, jobs, size, extra);
    vp_run_ranks(jobs, size, &w, ranks, &tp);
    KT_CHECK(dpoisoned(extra, (size_t)(2 * c->bt) * sizeof(float)),
             "vp agreement %s %s ranks=%d: row_entropy not written", teacher, VP_FAULTS[kind],
             size);
    CK(cudaFree(extra));
    for (int r = 0; r < size; r++) {
        const vp_job *j = &jobs[r];
        const kdloss_status want = vp_fault_want(kind, r, size);
        KT_CHECK(j->status == want, "vp agreement %s %s ranks=%d rank %d: got %d want %d", teacher,
                 VP_FAULTS[kind], size, r, (int)j->status, (int)want);
        if (want != KDLOSS_OK)
            KT_CHECK(dpoisoned(j->o.d_sc, 3 * sizeof(float)) &&
                         dpoisoned(j->o.d_rows, (size_t)(4 * c->bt) * sizeof(float)) &&
                         dpoisoned(j->o.d_dxs, (size_t)(c->bt * c->hs) * 4) &&
                         dpoisoned(j->o.d_dws, (size_t)(j->n * c->hs) * 4) &&
                         dpoisoned(j->o.d_dbs, (size_t)j->n * 4),
                     "vp agreement %s %s ranks=%d rank %d: nothing written", teacher,
                     VP_FAULTS[kind], size, r);
        KT_CHECK(ranks[r].ncalls == 2, "vp agreement %s %s ranks=%d rank %d: %d collectives, "
                 "want the agreement's 2", teacher, VP_FAULTS[kind], size, r, ranks[r].ncalls);
        vp_out_free(&jobs[r].o);
    }
    KT_CHECK(w.ncalls == 2, "vp agreement %s %s ranks=%d: the agreement's two collectives, got %d",
             teacher, VP_FAULTS[kind], size, w.ncalls);
}

/* The agreement (vp.h; tests/test_vp_agree.c has the CPU's full set): a bad temperature on the
 * last rank gives it INVALID_PARAM and the others PEER; blocks that leave a gap give every rank
 * SHAPE_MISMATCH; a workspace one byte short on the last rank gives it WORKSPACE_TOO_SMALL and
 * the others PEER; the last rank with another (valid) temperature: INVALID_PARAM on every rank;
 * the last rank without dxs: SHAPE_MISMATCH on every rank; the last rank with another student
 * softcap or scale, or (dense) teacher softcap: INVALID_PARAM on every rank; NaN row_weights on
 * every rank: INVALID_PARAM on every rank (each rank checks its own, on the host); a NaN weight
 * on the last rank only: INVALID_PARAM there, PEER on the others; valid weights that differ on
 * the last rank: SHAPE_MISMATCH on every rank (their values are in the fingerprint); row_entropy
 * on the last rank only: SHAPE_MISMATCH on every rank (it sizes the SUM);
 * the agreed chunk tampered by the
 * communicator on every rank to 1e6, 0 or NaN: KDLOSS_ERR_COMM on every rank. Every rank makes
 * both of the agreement's collectives and no other, and nothing is written anywhere. Dense
 * teacher, or (topk) the sparse one (bucket, CE, K 6). */
static void test_vp_agreement(kt_rng *rng, int size, int topk) {
    vp_case c;
    memset(&c, 0, sizeof c);
    c.tag = "agreement";
    c.bt = 8, c.hs = 16, c.ht = 16, c.v = 97, c.dt = KDLOSS_F32, c.bias = 1;
    kdloss_fused_linear_distill_params_default(&c.dp);
    kdloss_fused_linear_topk_distill_params_default(&c.tp);
    if (topk) {
        c.topk = 1, c.k = 6, c.labels = 1;
        c.tp.weight_hard_loss = 0.5;
    }
    vp_data d;
    vp_data_make(rng, &c, &d);
    for (int kind = 0; kind < K_N; kind++)
        if (!(topk && kind == K_T_CAP)) /* the top-k teacher's log-probs come mapped */
            vp_fault_run(&c, &d, size, kind, topk ? "topk" : "dense");
    vp_data_free(&d);
}

/* The cases: dense JSD with bias in 5 chunks and logit maps on both heads; forward KL at T 2
 * with t2_scale in bf16, automatic chunk; the top-k teacher with each tail (bucket CE T 1.5 with
 * a student logit map, renorm_both without labels, renorm_teacher CE); K = V with TVD. */
static void vp_cases(vp_case c[9], const float *w) {
    memset(c, 0, 9 * sizeof *c);
    c[0].tag = "dense jsd bias chunk 8";
    c[0].bt = 37, c[0].hs = 24, c[0].ht = 20, c[0].v = 301, c[0].dt = KDLOSS_F32, c[0].bias = 1;
    kdloss_fused_linear_distill_params_default(&c[0].dp); /* JSD 0.5, w 0.5 / 0.5 */
    c[0].dp.chunk_size = 8; /* five chunks, the last short */
    c[0].dp.student_map = (kdloss_logit_map){1.3, 4.0}; /* the heads' logit maps */
    c[0].dp.teacher_map = (kdloss_logit_map){0.8, 3.0};
    c[1] = c[0];
    c[1].dp.student_map = c[1].dp.teacher_map = (kdloss_logit_map){1.0, 0.0};
    c[1].tag = "dense fwd T2 t2 bf16 auto chunk";
    c[1].bt = 21, c[1].hs = 32, c[1].ht = 16, c[1].v = 250, c[1].dt = KDLOSS_BF16, c[1].bias = 0;
    c[1].dp.div.divergence = KDLOSS_DIV_FORWARD_KL;
    c[1].dp.temperature = 2.0, c[1].dp.t2_scale = 1, c[1].dp.chunk_size = 0;
    static const char *tags[3] = {"topk bucket CE T1.5 chunk 7",
                                  "topk renorm_both no labels chunk 7",
                                  "topk renorm_teacher CE chunk 7"};
    for (int tail = 0; tail < 3; tail++) {
        vp_case *t = &c[2 + tail];
        t->tag = tags[tail], t->topk = 1;
        t->bt = 29, t->hs = 24, t->v = 307, t->k = 9, t->dt = KDLOSS_F32, t->bias = 1;
        kdloss_fused_linear_topk_distill_params_default(&t->tp);
        t->tp.tail = (kdloss_topk_tail)tail;
        t->tp.div.divergence = tail == 2 ? KDLOSS_DIV_FORWARD_KL : KDLOSS_DIV_JSD;
        t->tp.chunk_size = 7;
        t->labels = tail != 1;
        t->tp.weight_hard_loss = tail != 1 ? 0.5 : 0.0;
        t->tp.temperature = tail == 0 ? 1.5 : 1.0;
        if (tail == 0) t->tp.student_map = (kdloss_logit_map){1.2, 5.0};
    }
    c[5] = c[2];
    c[5].tp.student_map = (kdloss_logit_map){1.0, 0.0};
    c[5].tag = "topk bucket K=V tvd";
    c[5].bt = 16, c[5].hs = 32, c[5].v = 64, c[5].k = 64, c[5].tp.chunk_size = 0;
    c[5].tp.div.divergence = KDLOSS_DIV_TVD;
    /* per-row weights (docs/MATH.md 12.1; w: zeros, non-integers, replicated on every rank) */
    c[6] = c[0];
    c[6].tag = "dense jsd bias chunk 8 weights entropy";
    c[6].dp.row_weights = w;
    c[6].ent = 1;
    c[7] = c[2];
    c[7].tag = "topk bucket CE T1.5 chunk 7 weights entropy";
    c[7].tp.row_weights = w;
    c[7].ent = 1;
    c[8] = c[3]; /* renorm_both, no labels: R is the rest's, the entropy over every column */
    c[8].tag = "topk renorm_both no labels chunk 7 entropy";
    c[8].ent = 1;
}

void test_vp(kt_rng *rng) {
    vp_case c[9];
    float hw[64];
    for (int i = 0; i < 64; i++) hw[i] = i % 5 == 2 ? 0.0f : (float)(0.25 + 2.5 * kt_uniform(rng));
    float *w = dupload(hw, sizeof hw); /* bt <= 64 in every case */
    vp_cases(c, w);
    const int fails = kt_failures;
    for (int size = 2; size <= VP_MAX_RANKS; size++) {
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) test_vp_case(rng, &c[i], size);
        test_vp_agreement(rng, size, 0);
        test_vp_agreement(rng, size, 1);
    }
    printf("vp: %d cases x 2..%d ranks as threads, and the agreement: %d failures\n",
           (int)(sizeof c / sizeof c[0]), VP_MAX_RANKS, kt_failures - fails);
    CK(cudaFree(w));
}

#ifdef KDLOSS_TEST_NCCL
/* The NCCL adapter (include/kdloss_nccl.h) with one rank on one device: ncclAllReduce on g_st,
 * the vocabulary-parallel call on the whole heads against the single-process one. */
void test_vp_nccl(kt_rng *rng) {
    ncclComm_t nc;
    int dev = 0;
    ncclResult_t nr = ncclCommInitAll(&nc, 1, &dev);
    if (!KT_CHECK(nr == ncclSuccess, "vp nccl: ncclCommInitAll: %s", ncclGetErrorString(nr)))
        return;
    kdloss_nccl_comm nccl;
    kdloss_status s = kdloss_comm_from_nccl(nc, g_st, &nccl);
    KT_CHECK(s == KDLOSS_OK && nccl.comm.rank == 0 && nccl.comm.size == 1, "vp nccl: comm");
    vp_case all[9];
    vp_cases(all, NULL);
    vp_case c = all[0]; /* dense JSD with bias, chunk 8 */
    c.tag = "nccl one rank dense jsd chunk 8";
    vp_data d;
    vp_data_make(rng, &c, &d);
    vp_out whole;
    vp_out_alloc(&whole, &c, c.v);
    KT_CHECK(vp_whole(&c, &d, &whole) == KDLOSS_OK, "vp nccl: whole call");
    vp_out_fetch(&whole, &c, c.v);
    vp_job j;
    memset(&j, 0, sizeof j);
    j.c = &c, j.d = &d, j.dp = c.dp, j.lo = 0, j.n = c.v, j.st = g_st, j.ctx = g_ctx;
    j.shard = (kdloss_vocab_shard){&nccl.comm, c.v, 0};
    vp_out_alloc(&j.o, &c, c.v);
    vp_job_run(&j);
    if (j.status == KDLOSS_OK) vp_out_fetch(&j.o, &c, c.v);
    vp_compare("vp nccl", &c, &j, &whole, NULL);
    vp_out_free(&j.o);
    vp_out_free(&whole);
    vp_data_free(&d);
    ncclCommDestroy(nc);
    printf("vp: the NCCL adapter with one rank ran\n");
}
#endif
