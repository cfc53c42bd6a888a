/* Several teachers in one fused call on the GPU (kdloss_cuda_fused_linear_distill_multi, tag
 * "multi"; docs/MATH.md section 13) against the CPU's kdloss_fused_linear_distill_multi on the
 * same operands (which tests/test_fld_multi.c holds to the per-teacher calls and a float64
 * reference): losses and row outputs rtol 1e-4 (1e-3 with bf16 operands: fp32 GEMMs of bf16
 * data summed in another order), gradients normwise 1e-4 fp32 / 1.5e-2 bf16 (the fused tests'
 * tolerances: a bf16 dz rounded on the GPU). Grouped, interleaved and random heads, biases with
 * a missing one, a teacher softcap, row weights, ignored labels, chunking; a one-head call has
 * the bits of kdloss_cuda_fused_linear_distill; a bad index or NULL heads are refused with
 * nothing written. Also at V 262144 and 248320 (the fused losses' 256k-vocabulary cases). */
#include "cuda_test.h"

enum { MH_N = 3 };

typedef struct mh_case {
    int64_t bt, hs, ht, v;
    kdloss_dtype dt;    /* every operand's */
    int pattern;        /* 0 grouped (runs of 5 rows), 1 interleaved, 2 random */
    int64_t chunk;
    int softcap, weights;
} mh_case;

/* The operands on the host (packed, the dtype) and on the device. */
typedef struct mh_ops {
    const mh_case *k;
    ct_mat xs, ws, bs, xt, wt[MH_N], bt[MH_N];
    ct_labels L;
    int32_t index[64];
    float w[64];
    float *dw;
} mh_ops;

static void mh_make(kt_rng *rng, const mh_case *k, mh_ops *o) {
    const int64_t bt = k->bt, hs = k->hs, ht = k->ht, v = k->v;
    double *x = xmalloc((size_t)(v * (hs > ht ? hs : ht)) * 8);
    o->k = k;
#define MH_IN(m, rows, cols, sd)                                                                \
    do {                                                                                      \
        fill_normal(rng, x, (rows) * (cols), sd);                                             \
        kt_round_to(x, (rows) * (cols), k->dt);                                               \
        m = ct_in(x, rows, cols, cols, k->dt, 0);                                              \
    } while (0)
    MH_IN(o->xs, bt, hs, 1.0);
    MH_IN(o->ws, v, hs, 3.0 / sqrt((double)hs));
    MH_IN(o->bs, 1, v, 0.5);
    MH_IN(o->xt, bt, ht, 1.0);
    for (int j = 0; j < MH_N; j++) {
        MH_IN(o->wt[j], v, ht, (2.0 + j) / sqrt((double)ht)); /* heads of different spreads */
        MH_IN(o->bt[j], 1, v, 0.5);
    }
#undef MH_IN
    free(x);
    o->L = ct_labels_make(rng, KT_LAB_SOME, KDLOSS_I64, 0, bt, v);
    for (int64_t i = 0; i < bt; i++) {
        o->index[i] = k->pattern == 0   ? (int32_t)((i / 5) % MH_N)
                      : k->pattern == 1 ? (int32_t)(i % MH_N)
                                        : (int32_t)kt_randint(rng, MH_N);
        o->w[i] = i % 6 == 2 ? 0.0f : (float)(0.25 + 2.0 * kt_uniform(rng));
    }
    o->dw = k->weights ? dupload(o->w, (size_t)bt * 4) : NULL;
}

static void mh_free(mh_ops *o) {
    ct_free(&o->xs), ct_free(&o->ws), ct_free(&o->bs), ct_free(&o->xt);
    for (int j = 0; j < MH_N; j++) ct_free(&o->wt[j]), ct_free(&o->bt[j]);
    ct_labels_free(&o->L);
    if (o->dw) CK(cudaFree(o->dw));
}

static kdloss_fused_linear_distill_params mh_params(const mh_ops *o, const float *w) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.div.divergence = KDLOSS_DIV_REVERSE_KL;
    p.temperature = 1.5, p.weight_hard_loss = 0.3, p.weight_soft_loss = 0.7;
    p.chunk_size = o->k->chunk;
    p.row_weights = w;
    if (o->k->softcap) p.teacher_map.softcap = 6.0;
    return p;
}

/* Outputs: 3 losses, 4 row outputs, dxs, dws, dbs; on the device (poisoned) or the host. */
typedef struct mh_out {
    float *l, *rows;
    void *dxs, *dws, *dbs;
    kdloss_fused_linear_distill_out out;
} mh_out;

static void mh_out_make(const mh_case *k, int dev, mh_out *m) {
    const size_t es = kdloss_dtype_size(k->dt), nx = (size_t)(k->bt * k->hs) * es;
    const size_t nw = (size_t)(k->v * k->hs) * es, nb = (size_t)k->v * es, nr = (size_t)k->bt * 16;
    void *(*alloc)(size_t) = dev ? dalloc : xmalloc;
    m->l = alloc(12), m->rows = alloc(nr), m->dxs = alloc(nx), m->dws = alloc(nw);
    m->dbs = alloc(nb);
    if (dev) dpoison(m->l, 12), dpoison(m->rows, nr), dpoison(m->dxs, nx), dpoison(m->dws, nw);
    if (dev) dpoison(m->dbs, nb);
    kdloss_fused_linear_distill_out o = {m->l,     m->l + 1,
                                         m->l + 2, {m->dxs, k->dt, 0},
                                         {m->dws, k->dt, 0}, m->dbs,
                                         m->rows,  m->rows + k->bt,
                                         m->rows + 2 * k->bt, m->rows + 3 * k->bt};
    m->out = o;
}

static void mh_out_free(mh_out *m, int dev) {
    void *p[5] = {m->l, m->rows, m->dxs, m->dws, m->dbs};
    for (int i = 0; i < 5; i++) {
        if (dev) CK(cudaFree(p[i]));
        else free(p[i]);
    }
}

/* The call on the device (host 0) or the CPU (host 1), n heads from the first. */
static kdloss_status mh_call(const mh_ops *o, int host, int n, const int32_t *index,
                             mh_out *m, void *ws, size_t wsb) {
    const mh_case *k = o->k;
    kdloss_cmat heads[MH_N];
    const void *bias[MH_N];
    for (int j = 0; j < MH_N; j++) {
        heads[j] = (kdloss_cmat){host ? o->wt[j].h : o->wt[j].d, k->dt, 0};
        bias[j] = j == 1 ? NULL : host ? o->bt[j].h : o->bt[j].d; /* head 1 has none */
    }
    const kdloss_teacher_heads th = {n, heads, bias, index};
    const kdloss_fused_linear_distill_params p =
        mh_params(o, !k->weights ? NULL : host ? o->w : o->dw);
#define MH_M(m) ((kdloss_cmat){host ? (m).h : (m).d, k->dt, 0})
    const kdloss_labels L = host ? (kdloss_labels){o->L.h, KDLOSS_I64} : o->L.dev;
    if (host)
        return kdloss_fused_linear_distill_multi(&p, k->bt, k->hs, k->ht, k->v, MH_M(o->xs),
                                                 MH_M(o->ws), o->bs.h, MH_M(o->xt), &th, L,
                                                 &m->out, NULL, 0);
    kdloss_status s = kdloss_cuda_fused_linear_distill_multi(
        g_ctx, g_st, &p, k->bt, k->hs, k->ht, k->v, MH_M(o->xs), MH_M(o->ws), o->bs.d,
        MH_M(o->xt), &th, L, &m->out, ws, wsb);
#undef MH_M
    CK(cudaStreamSynchronize(g_st));
    return s;
}

static void mh_compare(const char *tag, const mh_case *k, const mh_out *d, const mh_out *h) {
    const double rt = k->dt == KDLOSS_BF16 ? 1e-3 : 1e-4, gt = k->dt == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
    float l[3], *rows = xmalloc((size_t)k->bt * 16);
    d2h(l, d->l, 12), d2h(rows, d->rows, (size_t)k->bt * 16);
    const char *ln[3] = {"loss", "soft_loss", "hard_loss"};
    for (int i = 0; i < 3; i++) kt_close(l[i], h->l[i], 1e-6, rt, "%s %s", tag, ln[i]);
    for (int64_t i = 0; i < 4 * k->bt; i++)
        kt_close(rows[i], h->rows[i], 1e-5, rt, "%s row output %lld", tag, (long long)i);
    free(rows);
    const int64_t dims[3][2] = {{k->bt, k->hs}, {k->v, k->hs}, {1, k->v}};
    const void *dd[3] = {d->dxs, d->dws, d->dbs}, *hh[3] = {h->dxs, h->dws, h->dbs};
    const char *gn[3] = {"dxs", "dws", "dbs"};
    for (int i = 0; i < 3; i++) {
        double *ref = to_double(hh[i], k->dt, dims[i][0], dims[i][1], dims[i][1]);
        void *got = ct_cmp_grad(tag, gn[i], dd[i], k->dt, dims[i][0], dims[i][1], dims[i][1],
                                ref, gt);
        free(ref), free(got);
    }
}

static size_t mh_workspace(const mh_ops *o, void **ws) {
    const kdloss_fused_linear_distill_params p = mh_params(o, NULL);
    size_t b = 0;
    CK(kdloss_cuda_fused_linear_distill_workspace_size(&p, o->k->bt, o->k->hs, o->k->ht,
                                                       o->k->v, o->k->dt, 1, &b) != KDLOSS_OK);
    *ws = dalloc(b);
    return b;
}

/* One head through the multi entry: the single-teacher call's bits. */
static void mh_one_head(const char *tag, const mh_ops *o, void *ws, size_t wsb) {
    const mh_case *k = o->k;
    mh_out a, b;
    mh_out_make(k, 1, &a), mh_out_make(k, 1, &b);
    int32_t *zeros = calloc((size_t)k->bt, 4);
    KT_CHECK(mh_call(o, 0, 1, zeros, &a, ws, wsb) == KDLOSS_OK, "%s one head", tag);
    const kdloss_fused_linear_distill_params p = mh_params(o, o->dw);
    const kdloss_cmat xs = {o->xs.d, k->dt, 0}, w_s = {o->ws.d, k->dt, 0};
    const kdloss_cmat xt = {o->xt.d, k->dt, 0}, wt = {o->wt[0].d, k->dt, 0};
    KT_CHECK(kdloss_cuda_fused_linear_distill(g_ctx, g_st, &p, k->bt, k->hs, k->ht, k->v, xs,
                                              w_s, o->bs.d, xt, wt, o->bt[0].d, o->L.dev, &b.out,
                                              ws, wsb) == KDLOSS_OK,
             "%s single call", tag);
    CK(cudaStreamSynchronize(g_st));
    const size_t es = kdloss_dtype_size(k->dt);
    const size_t n[5] = {12, (size_t)k->bt * 16, (size_t)(k->bt * k->hs) * es,
                         (size_t)(k->v * k->hs) * es, (size_t)k->v * es};
    const void *da[5] = {a.l, a.rows, a.dxs, a.dws, a.dbs}, *db[5] = {b.l, b.rows, b.dxs, b.dws,
                                                                     b.dbs};
    const char *names[5] = {"one head: losses", "one head: row outputs", "one head: dxs",
                            "one head: dws", "one head: dbs"};
    for (int i = 0; i < 5; i++) {
        void *hb = dfetch(db[i], n[i]);
        ct_same_bits(tag, names[i], da[i], hb, n[i]);
        free(hb);
    }
    free(zeros);
    mh_out_free(&a, 1), mh_out_free(&b, 1);
}

/* A bad index (in an ignored row too) and NULL heads: refused, nothing written. */
static void mh_refusals(const char *tag, const mh_ops *o, void *ws, size_t wsb) {
    const mh_case *k = o->k;
    mh_out a;
    mh_out_make(k, 1, &a);
    int32_t bad[64];
    memcpy(bad, o->index, sizeof bad);
    bad[1] = MH_N; /* row 1 is an ignored one (KT_LAB_SOME) */
    KT_CHECK(mh_call(o, 0, MH_N, bad, &a, ws, wsb) == KDLOSS_ERR_INVALID_ID, "%s bad index", tag);
    bad[1] = -1;
    KT_CHECK(mh_call(o, 0, MH_N, bad, &a, ws, wsb) == KDLOSS_ERR_INVALID_ID, "%s index -1", tag);
    KT_CHECK(mh_call(o, 0, 0, o->index, &a, ws, wsb) == KDLOSS_ERR_INVALID_PARAM, "%s n 0", tag);
    const kdloss_fused_linear_distill_params p = mh_params(o, NULL);
    const kdloss_cmat xs = {o->xs.d, k->dt, 0}, w_s = {o->ws.d, k->dt, 0};
    const kdloss_cmat xt = {o->xt.d, k->dt, 0};
    KT_CHECK(kdloss_cuda_fused_linear_distill_multi(g_ctx, g_st, &p, k->bt, k->hs, k->ht, k->v,
                                                    xs, w_s, o->bs.d, xt, NULL, o->L.dev, &a.out,
                                                    ws, wsb) == KDLOSS_ERR_NULL_POINTER,
             "%s NULL heads", tag);
    const size_t es = kdloss_dtype_size(k->dt);
    KT_CHECK(dpoisoned(a.l, 12) && dpoisoned(a.rows, (size_t)k->bt * 16) &&
                 dpoisoned(a.dxs, (size_t)(k->bt * k->hs) * es) &&
                 dpoisoned(a.dws, (size_t)(k->v * k->hs) * es),
             "%s refused calls wrote nothing", tag);
    mh_out_free(&a, 1);
}

static void mh_case_run(kt_rng *rng, const mh_case *k) {
    char tag[160];
    snprintf(tag, sizeof tag, "multi %s pattern %d chunk %lld cap %d w %d", kt_dtype_name(k->dt),
             k->pattern, (long long)k->chunk, k->softcap, k->weights);
    mh_ops o;
    mh_make(rng, k, &o);
    void *ws;
    const size_t wsb = mh_workspace(&o, &ws);
    mh_out d, h;
    mh_out_make(k, 1, &d), mh_out_make(k, 0, &h);
    KT_CHECK(mh_call(&o, 1, MH_N, o.index, &h, NULL, 0) == KDLOSS_OK, "%s CPU call", tag);
    KT_CHECK(mh_call(&o, 0, MH_N, o.index, &d, ws, wsb) == KDLOSS_OK, "%s GPU call", tag);
    mh_compare(tag, k, &d, &h);
    mh_one_head(tag, &o, ws, wsb);
    mh_refusals(tag, &o, ws, wsb);
    mh_out_free(&d, 1), mh_out_free(&h, 0);
    CK(cudaFree(ws));
    mh_free(&o);
}

void test_multi(kt_rng *rng) {
    const kdloss_dtype dts[2] = {KDLOSS_F32, KDLOSS_BF16};
    for (int di = 0; di < 2; di++)
        for (int pat = 0; pat < 3; pat++) {
            const mh_case k = {37, 24, 40, 301, dts[di], pat, pat == 1 ? 0 : 8, pat == 2,
                               pat != 0};
            mh_case_run(rng, &k);
        }
    /* 256k vocabularies (Gemma 4's, Qwen3.5's): the three-pass row kernel, past the slab's V */
    const mh_case big[2] = {{6, 16, 16, 262144, KDLOSS_F32, 2, 0, 1, 1},
                            {5, 16, 16, 248320, KDLOSS_BF16, 0, 2, 0, 1}};
    for (int i = 0; i < 2 && !kt_quick(); i++) mh_case_run(rng, &big[i]); /* 20 s simulated */
}
