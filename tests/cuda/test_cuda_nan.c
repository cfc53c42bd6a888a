/* The NaN policy and wide rows (docs/MATH.md section 10; tag "nan", KDLOSS_TEST_ONLY=nan runs this
 * section alone): tests/test_nan_policy.c's cases on the CUDA entry points. D6: calls of 3 rows
 * whose middle row holds one NaN (or a +inf logit, or a +inf log-prob): the middle row's loss,
 * the total loss and every element of the middle row's gradient NaN, rows 0 and 2 (row loss and
 * gradient) bitwise those of the same call with a clean middle row; an ignored poisoned row is
 * not read; grad_scale 0 writes zeros. Here the row losses: kdloss_cuda_distill (six
 * divergences, four poisons, fp32 / bf16, V 37 and 4099: two tiles a row, so the flag of one
 * tile must reach the other), kdloss_cuda_jsd, kdloss_cuda_kl_div (probability and log targets;
 * elem_loss too; the gradient-only call does not read the input), kdloss_cuda_distill_logits
 * (six divergences, T 1 and 2, fp32 / bf16, V 37 and 1100), kdloss_cuda_topk_distill_logits
 * (three tails: NaN / +inf used log-prob, NaN student at S and outside S; an unused slot's NaN,
 * and renorm_both's outside S, not read), and a gradient factor of 0 where the unscaled element
 * is infinite. The fused losses, the vocabulary-parallel ones and D4's wide rows:
 * test_cuda_nan_fused.c. */
#include "cuda_test.h"

static int nan_row_all(const void *g, kdloss_dtype dt, int64_t v, int64_t r) {
    for (int64_t c = 0; c < v; c++)
        if (!isnan(kt_get(g, dt, v, r, c))) return 0;
    return 1;
}

static int nan_row_zero(const void *g, kdloss_dtype dt, int64_t v, int64_t r) {
    for (int64_t c = 0; c < v; c++)
        if (kt_get(g, dt, v, r, c) != 0.0) return 0;
    return 1;
}

/* A poisoned call (loss, rl [NB], g: NB x v of dt, host) against the clean one (rl0, g0): row 1
 * NaN, rows 0 and 2 bitwise the clean call's. g NULL: no gradient to check. */
static void nan_check(const char *what, int64_t v, kdloss_dtype dt, float loss, const float *rl,
                      const void *g, const float *rl0, const void *g0) {
    KT_CHECK(isnan(loss), "nan %s: loss %g, want NaN", what, loss);
    KT_CHECK(isnan(rl[1]), "nan %s: row loss %g, want NaN", what, rl[1]);
    KT_CHECK(!memcmp(rl, rl0, 4) && !memcmp(rl + 2, rl0 + 2, 4),
             "nan %s: clean rows' losses changed (%g %g vs %g %g)", what, rl[0], rl[2], rl0[0],
             rl0[2]);
    if (!g) return;
    const size_t row = (size_t)v * kdloss_dtype_size(dt);
    KT_CHECK(nan_row_all(g, dt, v, 1), "nan %s: the poisoned row's gradient is not all NaN", what);
    KT_CHECK(!memcmp(g, g0, row) &&
                 !memcmp((const char *)g + 2 * row, (const char *)g0 + 2 * row, row),
             "nan %s: clean rows' gradients changed", what);
}

typedef struct nan_poison {
    const char *name;
    int who;              /* 0 student, 1 teacher */
    double val;
    double teacher_there; /* NAN: leave the teacher's value; else set it there too */
} nan_poison;

/* NB x v operands (student x, teacher y) of a poisoned-row family, the poisoned element's column
 * in row 1, the clean call's results and the buffers of the poisoned calls. */
typedef struct nan_rows {
    int64_t v, col;
    kdloss_dtype dt;
    double *x, *y, *x1, *y1;
    void *s0, *t0; /* the clean operands packed in dt */
    void *g0, *g1; /* gradients: the clean call's, a poisoned call's */
    float l0, rl0[NB];
} nan_rows;

static void nan_rows_make(kt_rng *rng, nan_rows *o, int64_t v, int64_t col, int logp) {
    memset(o, 0, sizeof *o);
    o->v = v, o->col = col;
    o->x = xmalloc(sizeof(double) * NB * v), o->y = xmalloc(sizeof(double) * NB * v);
    o->x1 = xmalloc(sizeof(double) * NB * v), o->y1 = xmalloc(sizeof(double) * NB * v);
    kt_uniform_rows(rng, o->x, NB, v, logp);
    kt_uniform_rows(rng, o->y, NB, v, logp);
    o->g0 = xmalloc(4 * NB * v), o->g1 = xmalloc(4 * NB * v);
}

/* The clean operands packed in dt. */
static void nan_rows_pack(nan_rows *o, kdloss_dtype dt) {
    free(o->s0), free(o->t0);
    o->dt = dt;
    o->s0 = kt_pack(o->x, NB, o->v, o->v, dt), o->t0 = kt_pack(o->y, NB, o->v, o->v, dt);
}

static void nan_rows_free(nan_rows *o) {
    free(o->x), free(o->y), free(o->x1), free(o->y1), free(o->s0), free(o->t0), free(o->g0),
        free(o->g1);
}

/* The operands with poison p in row 1, packed in o's dtype (the caller frees *s, *t). */
static void nan_poisoned(nan_rows *o, const nan_poison *p, void **s, void **t) {
    const int64_t n = NB * o->v, at = o->v + o->col;
    memcpy(o->x1, o->x, sizeof(double) * n);
    memcpy(o->y1, o->y, sizeof(double) * n);
    (p->who ? o->y1 : o->x1)[at] = p->val;
    if (!isnan(p->teacher_there)) o->y1[at] = p->teacher_there;
    *s = kt_pack(o->x1, NB, o->v, o->v, o->dt), *t = kt_pack(o->y1, NB, o->v, o->v, o->dt);
}

/* ---- kdloss_cuda_distill, kdloss_cuda_jsd ---- */

/* kdloss_cuda_distill (jsd: kdloss_cuda_jsd with p's beta and grad_scale) on host operands (NB x v
 * of dt); lab NULL: no labels; g NULL: no gradient. */
static kdloss_status nan_distill(const kdloss_distill_params *p, int jsd, int64_t v,
                                 kdloss_dtype dt, const void *s, const void *t, const int64_t *lab,
                                 float *loss, float *rl, void *g) {
    const size_t n = (size_t)(NB * v) * kdloss_dtype_size(dt);
    void *ds = dupload(s, n), *dt_ = dupload(t, n), *dg = g ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + NB));
    int64_t *dlab = lab ? dupload(lab, NB * sizeof(int64_t)) : NULL;
    size_t wsb = 0;
    kdloss_cuda_distill_workspace_size(NB, v, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_cmat cs = {ds, dt, 0}, ct = {dt_, dt, 0};
    const kdloss_labels L = {dlab, KDLOSS_I64};
    const kdloss_mat gm = {dg, dt, 0};
    kdloss_jsd_params jp;
    kdloss_jsd_params_default(&jp);
    jp.beta = p->div.beta, jp.grad_scale = p->grad_scale;
    kdloss_status st =
        jsd ? kdloss_cuda_jsd(g_ctx, g_st, &jp, NB, v, cs, ct, L, dl, dl + 1, gm, wk, wsb)
            : kdloss_cuda_distill(g_ctx, g_st, p, NB, v, cs, ct, L, dl, dl + 1, gm, wk, wsb);
    float h[1 + NB];
    ddown(h, dl, sizeof h);
    *loss = h[0];
    memcpy(rl, h + 1, sizeof(float) * NB);
    if (g) ddown(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
    if (dlab) CK(cudaFree(dlab));
    return st;
}

/* A poisoned row that is ignored is never read; grad_scale 0 writes zeros. */
static void nan_distill_extras(const char *what, const kdloss_distill_params *p, nan_rows *o,
                               const void *s1, const void *t1) {
    const int64_t lab[NB] = {0, -100, 1};
    float l1, rl1[NB];
    nan_distill(p, 0, o->v, o->dt, s1, t1, lab, &l1, rl1, o->g1);
    KT_CHECK(isfinite(l1) && rl1[1] == 0.0f && nan_row_zero(o->g1, o->dt, o->v, 1),
             "nan %s: ignored row read (loss %g)", what, l1);
    kdloss_distill_params p0 = *p;
    p0.grad_scale = 0.0;
    nan_distill(&p0, 0, o->v, o->dt, s1, t1, NULL, &l1, rl1, o->g1);
    KT_CHECK(isnan(l1) && nan_row_zero(o->g1, o->dt, o->v, 1),
             "nan %s: grad_scale 0 must write zeros", what);
}

/* Divergence dv on o's operands: the clean call, then each poison (V 4099: every other one);
 * the JSD wrapper too; the extras on fp32 for the NaN student and the +inf teacher. */
static void nan_logprobs_div(nan_rows *o, int dv) {
    static const nan_poison ps[] = {{"NaN student", 0, NAN, NAN},
                                    {"NaN teacher", 1, NAN, NAN},
                                    {"NaN student where P = 0", 0, NAN, -INFINITY},
                                    {"+inf teacher", 1, INFINITY, NAN}};
    kdloss_distill_params p;
    kdloss_distill_params_default(&p);
    p.div.divergence = (kdloss_divergence)dv;
    KT_CHECK(nan_distill(&p, 0, o->v, o->dt, o->s0, o->t0, NULL, &o->l0, o->rl0, o->g0) ==
                 KDLOSS_OK,
             "nan distill clean");
    for (int pi = 0; pi < 4; pi++) {
        if (o->v > 1000 && pi % 2) continue;
        void *s1, *t1;
        nan_poisoned(o, &ps[pi], &s1, &t1);
        float l1, rl1[NB];
        char what[160];
        snprintf(what, sizeof what, "distill %s div %d V %lld %s", ps[pi].name, dv,
                 (long long)o->v, kt_dtype_name(o->dt));
        KT_CHECK(nan_distill(&p, 0, o->v, o->dt, s1, t1, NULL, &l1, rl1, o->g1) == KDLOSS_OK,
                 "nan %s: status", what);
        nan_check(what, o->v, o->dt, l1, rl1, o->g1, o->rl0, o->g0);
        if (dv == KDLOSS_DIV_JSD) { /* the wrapper */
            nan_distill(&p, 1, o->v, o->dt, s1, t1, NULL, &l1, rl1, o->g1);
            snprintf(what, sizeof what, "jsd %s V %lld %s", ps[pi].name, (long long)o->v,
                     kt_dtype_name(o->dt));
            nan_check(what, o->v, o->dt, l1, rl1, o->g1, o->rl0, o->g0);
        }
        if (o->dt == KDLOSS_F32 && (pi == 0 || pi == 3)) nan_distill_extras(what, &p, o, s1, t1);
        free(s1), free(t1);
    }
}

/* V 37, and V 4099 (the NaN in the first tile; three divergences) x fp32 / bf16. */
static void nan_logprobs(kt_rng *rng) {
    static const int64_t vs[2] = {37, 4099};
    for (int vi = 0; vi < 2; vi++) {
        nan_rows o;
        nan_rows_make(rng, &o, vs[vi], vi ? 5 : vs[vi] - 3, 1);
        for (int dti = 0; dti < 2; dti++) {
            nan_rows_pack(&o, dti ? KDLOSS_BF16 : KDLOSS_F32);
            for (int dv = 0; dv <= 5; dv += vi ? 2 : 1) nan_logprobs_div(&o, dv);
        }
        nan_rows_free(&o);
    }
}

/* ---- kdloss_cuda_kl_div ---- */

/* kdloss_cuda_kl_div on fp32 host operands (NB x v): mode 1 reduction SUM (loss, row_loss),
 * 2 reduction NONE (row_loss, elem_loss e), 0 the gradient alone; g NULL: no gradient. */
static void nan_kl_call(const kdloss_kl_params *kp0, int64_t v, const float *s, const float *t,
                        int mode, float *loss, float *rl, float *e, float *g) {
    kdloss_kl_params kp = *kp0;
    kp.reduction = mode == 2 ? KDLOSS_REDUCTION_NONE : KDLOSS_REDUCTION_SUM;
    const size_t n = (size_t)(NB * v) * 4;
    void *ds = dupload(s, n), *dt_ = dupload(t, n), *dg = g ? dalloc(n) : NULL;
    void *de = mode == 2 ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + NB));
    size_t wsb = 0;
    kdloss_cuda_kl_div_workspace_size(NB, v, &wsb);
    void *wk = dalloc(wsb);
    kdloss_status st = kdloss_cuda_kl_div(g_ctx, g_st, &kp, NB, v, (kdloss_cmat){ds, KDLOSS_F32, 0},
                                          (kdloss_cmat){dt_, KDLOSS_F32, 0}, mode == 1 ? dl : NULL,
                                          mode ? dl + 1 : NULL, (kdloss_mat){de, KDLOSS_F32, 0},
                                          (kdloss_mat){dg, KDLOSS_F32, 0}, wk, wsb);
    KT_CHECK(st == KDLOSS_OK, "nan kl_div: status %d", (int)st);
    float h[1 + NB];
    ddown(h, dl, sizeof h);
    if (loss) *loss = mode == 1 ? h[0] : __builtin_nanf("");
    if (rl) memcpy(rl, h + 1, sizeof(float) * NB);
    if (g) ddown(g, dg, n);
    if (de) ddown(e, de, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
}

enum { NAN_KL_V = 37 };

/* Case pi (0: a NaN input; 1: a NaN target; 2: a NaN input where t = 0, the clean call having
 * 0 there with that target) on s, t: the loss call, reduction none, the gradient alone (which
 * does not read the input, kdloss.h), grad_scale 0 (zeros). */
static void nan_kl_case(int lt, int pi, float *s, float *t) {
    enum { V = NAN_KL_V };
    float g0[NB * V], g1[NB * V], e0[NB * V], e1[NB * V], l0, l1, rl0[NB], rl1[NB];
    kdloss_kl_params kp;
    kdloss_kl_params_default(&kp);
    kp.log_target = lt;
    if (pi == 2) t[V + 3] = lt ? -INFINITY : 0.0f;
    nan_kl_call(&kp, V, s, t, 1, &l0, rl0, NULL, g0);
    nan_kl_call(&kp, V, s, t, 2, NULL, NULL, e0, NULL);
    if (pi == 1) t[V + 3] = NAN;
    else s[V + 3] = NAN;
    nan_kl_call(&kp, V, s, t, 1, &l1, rl1, NULL, g1);
    char what[96];
    snprintf(what, sizeof what, "kl_div log_target %d case %d", lt, pi);
    nan_check(what, V, KDLOSS_F32, l1, rl1, g1, rl0, g0);
    nan_kl_call(&kp, V, s, t, 2, NULL, rl1, e1, NULL); /* reduction none */
    KT_CHECK(isnan(rl1[1]) && nan_row_all(e1, KDLOSS_F32, V, 1) && !memcmp(e1, e0, 4 * V) &&
                 !memcmp(e1 + 2 * V, e0 + 2 * V, 4 * V),
             "nan %s: elem_loss", what);
    if (pi != 1) {
        float g2[NB * V];
        nan_kl_call(&kp, V, s, t, 0, NULL, NULL, NULL, g2);
        KT_CHECK(!memcmp(g2, g0, sizeof g2), "nan %s: the gradient-only call read the input", what);
    }
    kp.grad_scale = 0.0;
    nan_kl_call(&kp, V, s, t, 1, &l1, rl1, NULL, g1);
    KT_CHECK(isnan(l1) && nan_row_zero(g1, KDLOSS_F32, V, 1),
             "nan %s: grad_scale 0 must write zeros", what);
}

static void nan_kl(kt_rng *rng) {
    enum { V = NAN_KL_V };
    double x[NB * V], y[NB * V];
    kt_uniform_rows(rng, x, NB, V, 1);
    kt_uniform_rows(rng, y, NB, V, 1);
    for (int lt = 0; lt < 2; lt++)
        for (int pi = 0; pi < 3; pi++) {
            float s[NB * V], t[NB * V];
            for (int64_t i = 0; i < NB * V; i++)
                s[i] = (float)x[i], t[i] = lt ? (float)y[i] : (float)exp(y[i]);
            nan_kl_case(lt, pi, s, t);
        }
}

/* ---- kdloss_cuda_distill_logits ---- */

kdloss_status nan_dl_call(const kdloss_distill_logits_params *p, int64_t bt, int64_t v,
                          kdloss_dtype dt, const void *s, const void *t, float *loss, float *rl,
                          void *g) {
    const size_t n = (size_t)(bt * v) * kdloss_dtype_size(dt);
    void *ds = dupload(s, n), *dt_ = dupload(t, n), *dg = g ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + bt));
    size_t wsb = 0;
    kdloss_cuda_distill_logits_workspace_size(bt, v, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_labels L = {NULL, KDLOSS_I64};
    kdloss_status st = kdloss_cuda_distill_logits(
        g_ctx, g_st, p, bt, v, (kdloss_cmat){ds, dt, 0}, (kdloss_cmat){dt_, dt, 0}, L, dl,
        rl ? dl + 1 : NULL, (kdloss_mat){dg, dt, 0}, wk, wsb);
    float *h = xmalloc(4 * (1 + bt));
    ddown(h, dl, 4 * (1 + bt));
    *loss = h[0];
    if (rl) memcpy(rl, h + 1, sizeof(float) * bt);
    free(h);
    if (g) ddown(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
    return st;
}

/* Divergence dv at T on o's operands: the clean call, each poison; on fp32 for the NaN student
 * and the +inf teacher also the forward-only call and grad_scale 0 (zeros). */
static void nan_logits_div(nan_rows *o, int dv, double T) {
    static const nan_poison ps[] = {{"NaN student", 0, NAN, NAN},
                                    {"NaN teacher", 1, NAN, NAN},
                                    {"+inf student", 0, INFINITY, NAN},
                                    {"+inf teacher", 1, INFINITY, NAN}};
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div.divergence = (kdloss_divergence)dv;
    p.temperature = T;
    nan_dl_call(&p, NB, o->v, o->dt, o->s0, o->t0, &o->l0, o->rl0, o->g0);
    for (int pi = 0; pi < 4; pi++) {
        void *s1, *t1;
        nan_poisoned(o, &ps[pi], &s1, &t1);
        float l1, rl1[NB];
        char what[160];
        snprintf(what, sizeof what, "distill_logits %s div %d T %g V %lld %s", ps[pi].name, dv,
                 T, (long long)o->v, kt_dtype_name(o->dt));
        KT_CHECK(nan_dl_call(&p, NB, o->v, o->dt, s1, t1, &l1, rl1, o->g1) == KDLOSS_OK,
                 "nan %s: status", what);
        nan_check(what, o->v, o->dt, l1, rl1, o->g1, o->rl0, o->g0);
        if (o->dt == KDLOSS_F32 && (pi == 0 || pi == 3)) {
            nan_dl_call(&p, NB, o->v, o->dt, s1, t1, &l1, rl1, NULL); /* forward only */
            KT_CHECK(isnan(l1) && isnan(rl1[1]) && !memcmp(rl1, o->rl0, 4), "nan %s: forward only",
                     what);
            kdloss_distill_logits_params p0 = p;
            p0.grad_scale = 0.0;
            nan_dl_call(&p0, NB, o->v, o->dt, s1, t1, &l1, rl1, o->g1);
            KT_CHECK(isnan(l1) && nan_row_zero(o->g1, o->dt, o->v, 1),
                     "nan %s: grad_scale 0 must write zeros", what);
        }
        free(s1), free(t1);
    }
}

/* V 37: every divergence at T 1 and 2 in fp32, at T 1 in bf16; V 1100 (the time the simulator
 * takes): three divergences at T 2 in fp32. */
static void nan_logits(kt_rng *rng) {
    static const int64_t vs[2] = {37, 1100};
    for (int vi = 0; vi < 2; vi++) {
        nan_rows o;
        nan_rows_make(rng, &o, vs[vi], vs[vi] - 3, 0);
        for (int dti = 0; dti < (vi ? 1 : 2); dti++) {
            nan_rows_pack(&o, dti ? KDLOSS_BF16 : KDLOSS_F32);
            for (int dv = 0; dv <= 5; dv += vi ? 2 : 1)
                for (int ti = vi; ti < (dti ? 1 : 2); ti++) nan_logits_div(&o, dv, ti ? 2.0 : 1.0);
        }
        nan_rows_free(&o);
    }
}

/* ---- kdloss_cuda_topk_distill_logits ---- */

kdloss_status nan_tk_call(const kdloss_topk_distill_params *p, int64_t bt, int64_t v, int64_t k,
                          const float *s, const int32_t *ids, const float *lp, float *loss,
                          float *rl, float *g) {
    const size_t n = (size_t)(bt * v) * 4, nk = (size_t)(bt * k) * 4;
    void *ds = dupload(s, n), *di = dupload(ids, nk), *dp = dupload(lp, nk), *dg = dalloc(n);
    float *dl = dalloc(4 * (1 + bt));
    size_t wsb = 0;
    kdloss_cuda_topk_distill_logits_workspace_size(bt, v, k, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_topk_teacher t = {k, {di, KDLOSS_I32, 0}, {dp, KDLOSS_F32, 0}};
    kdloss_status st = kdloss_cuda_topk_distill_logits(
        g_ctx, g_st, p, bt, v, (kdloss_cmat){ds, KDLOSS_F32, 0}, t,
        (kdloss_labels){NULL, KDLOSS_I64}, dl, dl + 1, (kdloss_mat){dg, KDLOSS_F32, 0}, wk, wsb);
    float *h = xmalloc(4 * (1 + bt));
    ddown(h, dl, 4 * (1 + bt));
    *loss = h[0];
    if (rl) memcpy(rl, h + 1, sizeof(float) * bt);
    free(h);
    ddown(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(di));
    CK(cudaFree(dp));
    CK(cudaFree(wk));
    return st;
}

enum { NAN_TK_V = 40, NAN_TK_K = 6 };
enum { LP_NAN, LP_INF, S_NAN_IN, S_NAN_OUT, UNUSED, NAN_TK_CASES };

/* Case c of tail / divergence p on the clean operands (s0, ids, lp0; its results l0 / rl0 / g0). */
static void nan_topk_case(const kdloss_topk_distill_params *p, int c, const float *s0,
                          const int32_t *ids, const float *lp0, const float *rl0, const float *g0) {
    enum { V = NAN_TK_V, K = NAN_TK_K };
    static const char *names[] = {"NaN log-prob", "+inf log-prob", "NaN student at S",
                                  "NaN student outside S", "NaN unused slot only"};
    float s1[NB * V], lp1[NB * K], g1[NB * V], l1, rl1[NB];
    memcpy(s1, s0, sizeof s1);
    memcpy(lp1, lp0, sizeof lp1);
    if (c == LP_NAN) lp1[1 * K + 2] = NAN;
    if (c == LP_INF) lp1[1 * K + 2] = INFINITY;
    if (c == S_NAN_IN) s1[1 * V + ids[1 * K + 1]] = NAN;
    if (c == S_NAN_OUT) s1[1 * V + 39] = NAN;
    nan_tk_call(p, NB, V, K, s1, ids, lp1, &l1, rl1, g1);
    char what[128];
    snprintf(what, sizeof what, "topk %s tail %d div %d", names[c], (int)p->tail,
             (int)p->div.divergence);
    if (c != UNUSED && !(c == S_NAN_OUT && p->tail == 1)) {
        nan_check(what, V, KDLOSS_F32, l1, rl1, g1, rl0, g0);
        return;
    }
    /* not read */
    KT_CHECK(isfinite(l1) && !memcmp(rl1, rl0, sizeof rl1), "nan %s: an unread NaN changed the "
             "losses (%g)", what, l1);
    int fin = 1;
    for (int64_t j = 0; j < V; j++)
        fin &= c == UNUSED ? g1[V + j] == g0[V + j] : j == 39 || isfinite(g1[V + j]);
    KT_CHECK(fin, "nan %s: gradient", what);
}

static void nan_topk(kt_rng *rng) {
    enum { V = NAN_TK_V, K = NAN_TK_K };
    double x[NB * V];
    kt_uniform_rows(rng, x, NB, V, 0);
    float s0[NB * V], g0[NB * V], lp0[NB * K];
    int32_t ids[NB * K];
    for (int64_t i = 0; i < NB * V; i++) s0[i] = (float)x[i];
    for (int64_t r = 0; r < NB; r++)
        for (int64_t j = 0; j < K; j++) {
            ids[r * K + j] = (int32_t)(3 * j + r);
            lp0[r * K + j] = (float)(-1.0 - 0.5 * (double)j);
        }
    ids[1 * K + 5] = -1; /* an unused slot in the poisoned row */
    lp0[1 * K + 5] = NAN;
    for (int tail = 0; tail < 3; tail++)
        for (int dv = 0; dv <= (tail == 2 ? 0 : 5); dv++) {
            kdloss_topk_distill_params p;
            kdloss_topk_distill_params_default(&p);
            p.div.divergence = (kdloss_divergence)dv;
            p.tail = (kdloss_topk_tail)tail;
            p.temperature = 1.5;
            float l0, rl0[NB];
            KT_CHECK(nan_tk_call(&p, NB, V, K, s0, ids, lp0, &l0, rl0, g0) == KDLOSS_OK,
                     "nan topk clean");
            for (int c = 0; c < NAN_TK_CASES; c++) nan_topk_case(&p, c, s0, ids, lp0, rl0, g0);
        }
}

/* A gradient factor of 0 writes zeros on rows nothing flags (kdloss.h), also where the unscaled
 * element is infinite: kdloss_cuda_distill reverse KL at a teacher's -inf log-prob (e^x (x - y +
 * 1) = inf), kdloss_cuda_jsd at beta 1 there, kdloss_cuda_kl_div with a log target of 100
 * (-e^100 overflows), loss and gradient or the gradient alone. The kernels formed inf x 0 = NaN. */
static void nan_grad_scale_zero(void) {
    enum { V = 37 };
    float x[NB * V], y[NB * V], g[NB * V], l, rl[NB];
    for (int64_t i = 0; i < NB * V; i++)
        x[i] = -0.5f - 0.5f * (float)(i % 3), y[i] = i % 2 ? -0.1f : -INFINITY;
    for (int jsd = 0; jsd < 2; jsd++) {
        kdloss_distill_params p;
        kdloss_distill_params_default(&p);
        p.div.divergence = KDLOSS_DIV_REVERSE_KL;
        p.div.beta = 1.0; /* kdloss_cuda_jsd's */
        p.grad_scale = 0.0;
        kdloss_status st = nan_distill(&p, jsd, V, KDLOSS_F32, x, y, NULL, &l, rl, g);
        int zero = 1;
        for (int64_t r = 0; r < NB; r++) zero &= nan_row_zero(g, KDLOSS_F32, V, r);
        KT_CHECK(st == KDLOSS_OK && zero, "nan %s reverse KL at a -inf teacher, grad_scale 0: "
                 "gradient %g %g, want zeros", jsd ? "jsd beta 1" : "distill", g[0], g[1]);
    }
    for (int mode = 0; mode < 2; mode++) { /* 1: loss and gradient, 0: the gradient alone */
        for (int64_t i = 0; i < NB * V; i++) x[i] = -1.0f, y[i] = i % 5 ? -2.0f : 100.0f;
        kdloss_kl_params kp;
        kdloss_kl_params_default(&kp);
        kp.log_target = 1;
        kp.grad_scale = 0.0;
        nan_kl_call(&kp, V, x, y, mode, mode ? &l : NULL, mode ? rl : NULL, NULL, g);
        int zero = 1;
        for (int64_t r = 0; r < NB; r++) zero &= nan_row_zero(g, KDLOSS_F32, V, r);
        KT_CHECK(zero, "nan kl_div log target 100, grad_scale 0 (mode %d): gradient %g, want zeros",
                 mode, g[0]);
    }
}

void test_nan(kt_rng *rng) {
    const int fails = kt_failures, checks = kt_checks;
    nan_logprobs(rng);
    nan_kl(rng);
    nan_logits(rng);
    nan_topk(rng);
    nan_fused(rng);
    nan_vp_cases(rng);
    nan_vp_topk(rng);
    nan_grad_scale_zero();
    nan_zero_grad();
    nan_wide();
    printf("nan: the NaN policy and wide rows, %d checks: %d failures\n", kt_checks - checks,
           kt_failures - fails);
}
