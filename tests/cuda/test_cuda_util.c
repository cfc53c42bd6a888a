/* The CUDA test's helpers (cuda_test.h): memory and copies, comparisons, packed operands and
 * labels, and the checks every row loss shares (status word, gradient, padding, row losses,
 * loss, run-to-run bits, the CPU function). */
#include "cuda_test.h"

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("out of host memory\n");
        exit(1);
    }
    return p;
}

void *dalloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n ? n : 1));
    return p;
}

/* The library runs on g_st, a non-blocking stream, which does not wait for the legacy default
 * stream that cudaMemcpy/cudaMemset use (and a pageable host-to-device copy may still be in
 * flight when cudaMemcpy returns): the setup helpers therefore end with a device-wide sync, and
 * results are read only after cudaStreamSynchronize(g_st). */
void h2d(void *d, const void *h, size_t n) {
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

void d2h(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

void dpoison(void *d, size_t n) {
    CK(cudaMemset(d, 0xFF, n));
    CK(cudaDeviceSynchronize());
}

void *dupload(const void *h, size_t n) {
    void *d = dalloc(n);
    h2d(d, h, n);
    return d;
}

void ddown(void *h, void *d, size_t n) {
    CK(cudaStreamSynchronize(g_st));
    d2h(h, d, n);
    CK(cudaFree(d));
}

void *dfetch(const void *d, size_t n) {
    void *h = xmalloc(n);
    d2h(h, d, n);
    return h;
}

int dpoisoned(const void *d, size_t n) {
    unsigned char *h = dfetch(d, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= h[i] == 0xFF;
    free(h);
    return ok;
}

int32_t read_status(const void *dws) {
    int32_t s = 0;
    d2h(&s, dws, sizeof s);
    return s;
}

double *to_double(const void *p, kdloss_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    double *o = xmalloc((size_t)(rows * cols) * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) o[r * cols + c] = kt_get(p, dt, ld, r, c);
    return o;
}

double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

int close1(double got, double want, double atol, double rtol) {
    if (isnan(want) || isinf(want)) return (isnan(want) && isnan(got)) || got == want;
    return isfinite(got) && fabs(got - want) <= atol + rtol * fabs(want);
}

void cmp_arr(const char *what, const double *got, const double *ref, int64_t n, double atol,
             double rtol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!close1(got[i], ref[i], atol, rtol)) {
            if (bad < 3)
                printf("  %s[%lld]: got %.9g want %.9g\n", what, (long long)i, got[i], ref[i]);
            bad++;
        }
    }
    KT_CHECK(bad == 0, "%s: %lld of %lld elements off (atol %.3g rtol %.3g)", what,
             (long long)bad, (long long)n, atol, rtol);
}

void cmp_norm(const char *what, const double *got, const double *ref, int64_t n, double tol) {
    double num = 0, den = 0;
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) nonfinite++;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    KT_CHECK(nonfinite == 0 && rel <= tol, "%s: normwise error %.3g (tol %.3g), %lld non-finite",
             what, rel, tol, (long long)nonfinite);
}

/* 1 if the padding columns [v, ld) of every row still hold the 0xFF poison. */
int pad_untouched(const void *h, kdloss_dtype dt, int64_t bt, int64_t v, int64_t ld) {
    const size_t es = kdloss_dtype_size(dt);
    const unsigned char *b = h;
    for (int64_t r = 0; r < bt; r++)
        for (size_t i = (size_t)(r * ld + v) * es; i < (size_t)((r + 1) * ld) * es; i++)
            if (b[i] != 0xFF) return 0;
    return 1;
}

void cmp_bits(const char *what, const void *a, const void *b, size_t n) {
    KT_CHECK(memcmp(a, b, n) == 0, "%s: two runs differ bitwise", what);
}

double logsumexp(const double *z, int64_t n, double scale) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = z[i] * scale > m ? z[i] * scale : m;
    if (m == -INFINITY) return m;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp(z[i] * scale - m);
    return m + log(s);
}

void fill_normal(kt_rng *rng, double *x, int64_t n, double sd) {
    for (int64_t i = 0; i < n; i++) x[i] = sd * kt_normal(rng);
}

double *gen_logits(kt_rng *rng, int64_t bt, int64_t v, kdloss_dtype dt) {
    double *z = xmalloc((size_t)(bt * v) * 8);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t c = 0; c < v; c++)
            z[r * v + c] = 2.0 * kt_normal(rng) + (r % 3 == 1 ? 25.0 : 0.0) +
                           (r % 3 == 2 && c == (r * 7) % v ? 12.0 : 0.0);
    kt_round_to(z, bt * v, dt);
    return z;
}

int tvd_tie(const kdloss_div_params *d, double x, double y) {
    double p = exp(y), q = exp(x);
    return d->divergence == KDLOSS_DIV_TVD && fabs(p - q) <= 1e-5 * (p + q);
}

/* JSD(beta) elementwise on log-probs x (student), y (teacher): returns l, writes dl/dx. */
double cu_ref_jsd_elem(double beta, double x, double y, double *g) {
    if (beta == 0.0) {
        double p = exp(y);
        *g = -p;
        return p > 0 ? p * (y - x) : 0.0;
    }
    if (beta == 1.0) {
        double q = exp(x);
        *g = q > 0 ? q * (x - y + 1.0) : 0.0;
        return q > 0 ? q * (x - y) : 0.0;
    }
    double a = log(beta) + y, b = log1p(-beta) + x;
    double m = a > b ? a : b;
    double lm = m == -INFINITY ? -INFINITY : m + log(exp(a - m) + exp(b - m));
    double p = exp(y), q = exp(x);
    double ta = p > 0 ? beta * p * (y - lm) : 0.0;
    double tb = q > 0 ? (1.0 - beta) * q * (x - lm) : 0.0;
    *g = tb;
    return ta + tb;
}

/* ---- packed operands and labels ---- */

ct_mat ct_in(const double *x, int64_t rows, int64_t cols, int64_t ld, kdloss_dtype dt,
             int misalign) {
    ct_mat m = ct_out(rows, ld, dt, misalign);
    m.h = kt_pack(x, rows, cols, ld, dt);
    h2d(m.d, m.h, m.bytes);
    return m;
}

ct_mat ct_out(int64_t rows, int64_t ld, kdloss_dtype dt, int misalign) {
    ct_mat m;
    m.h = NULL;
    m.bytes = (size_t)(rows * ld) * kdloss_dtype_size(dt);
    m.base = dalloc(m.bytes + 16);
    m.d = m.base + (misalign ? kdloss_dtype_size(dt) : 0);
    dpoison(m.d, m.bytes);
    return m;
}

void ct_free(ct_mat *m) {
    if (m->base) CK(cudaFree(m->base));
    free(m->h);
    m->base = NULL, m->h = NULL;
}

ct_labels ct_labels_make(kt_rng *rng, int mode, kdloss_dtype dt, int bad, int64_t bt, int64_t v) {
    ct_labels L;
    memset(&L, 0, sizeof L);
    L.mode = mode;
    L.bad = bad && mode != KT_LAB_NONE;
    L.dev.dtype = L.host.dtype = dt;
    L.lab = xmalloc((size_t)bt * 8);
    for (int64_t r = 0; r < bt; r++)
        L.lab[r] = mode == KT_LAB_NONE                       ? 0
                   : mode == KT_LAB_ALL || r % 4 == 1 ? -100
                                                             : kt_randint(rng, v);
    if (L.bad) L.lab[bt - 1] = v;
    for (int64_t r = 0; r < bt; r++)
        L.nv += mode == KT_LAB_NONE || (L.lab[r] != -100 && L.lab[r] >= 0 && L.lab[r] < v);
    if (mode == KT_LAB_NONE) return L;
    const size_t ls = kdloss_dtype_size(dt);
    char *h = xmalloc((size_t)bt * ls);
    for (int64_t r = 0; r < bt; r++) {
        if (dt == KDLOSS_I64) ((int64_t *)h)[r] = L.lab[r];
        else ((int32_t *)h)[r] = (int32_t)L.lab[r];
    }
    L.h = h;
    L.host.data = h;
    L.dev.data = dupload(h, (size_t)bt * ls);
    return L;
}

ct_labels ct_labels_kind(kt_rng *rng, int kind, int64_t bt, int64_t v) {
    static const int mode[5] = {KT_LAB_NONE, KT_LAB_SOME, KT_LAB_SOME, KT_LAB_ALL, KT_LAB_SOME};
    const kdloss_dtype dt = kind == 2 || kind == 4 ? KDLOSS_I32 : KDLOSS_I64;
    return ct_labels_make(rng, mode[kind], dt, kind == 4, bt, v);
}

void ct_labels_free(ct_labels *L) {
    if (L->dev.data) CK(cudaFree((void *)L->dev.data));
    free(L->lab);
    free(L->h);
}

/* ---- a row loss's outputs and checks ---- */

void ct_rows_alloc(ct_rows *o, int64_t bt, int64_t v, int64_t ld, kdloss_dtype dg, int misalign,
                   const ct_mat *over, int want_loss, size_t wsb) {
    memset(o, 0, sizeof *o);
    o->bt = bt, o->v = v, o->ld = ld, o->dg = dg;
    o->in_place = over != NULL;
    if (over) {
        o->g.d = over->d, o->g.bytes = over->bytes; /* g.base NULL: the student's to free */
    } else {
        o->g = ct_out(bt, ld, dg, misalign);
    }
    o->loss = want_loss ? dalloc(4) : NULL;
    if (o->loss) dpoison(o->loss, 4);
    o->row = dalloc((size_t)bt * 4);
    dpoison(o->row, (size_t)bt * 4);
    o->wsb = wsb;
    o->ws = dalloc(wsb);
}

void ct_rows_free(ct_rows *o) {
    ct_free(&o->g);
    if (o->loss) CK(cudaFree(o->loss));
    CK(cudaFree(o->row));
    CK(cudaFree(o->ws));
}

/* The same call again: the same gradient, loss and row losses, bit for bit. */
static void ct_rerun(const char *tag, const ct_rows *o, ct_call call, void *arg, const void *hg,
                     const float *hrow, float hl) {
    KT_CHECK(call(arg) == KDLOSS_OK, "%s: second call", tag);
    CK(cudaStreamSynchronize(g_st));
    void *hg2 = dfetch(o->g.d, o->g.bytes);
    float *hrow2 = dfetch(o->row, (size_t)o->bt * 4), hl2 = 0;
    if (o->loss) d2h(&hl2, o->loss, 4);
    char what[300];
    snprintf(what, sizeof what, "%s grad", tag);
    cmp_bits(what, hg, hg2, o->g.bytes);
    KT_CHECK(!memcmp(&hl, &hl2, 4) && !memcmp(hrow, hrow2, (size_t)o->bt * 4),
             "%s: the loss or the row losses differ between runs", tag);
    free(hg2);
    free(hrow2);
}

double *ct_check_rows(const char *tag, const ct_rows *o, const ct_want *w, ct_call call,
                      void *arg, float *hl) {
    const int64_t bt = o->bt, n = bt * o->v;
    char what[300];
    const int32_t word = read_status(o->ws);
    KT_CHECK(word == w->status, "%s: device status word %d, want %d", tag, (int)word,
             (int)w->status);
    void *hg = dfetch(o->g.d, o->g.bytes);
    double *gg = to_double(hg, o->dg, bt, o->v, o->ld),
           *adj = to_double(hg, o->dg, bt, o->v, o->ld);
    for (int64_t i = 0; w->slack && i < n; i++) /* either subgradient at a TVD tie */
        if (fabs(adj[i] - w->grad[i]) <= w->slack[i]) adj[i] = w->grad[i];
    snprintf(what, sizeof what, "%s grad", tag);
    cmp_arr(what, adj, w->grad, n, w->g_atol, w->g_rtol);
    if (!o->in_place)
        KT_CHECK(pad_untouched(hg, o->dg, bt, o->v, o->ld), "%s: grad padding written", tag);
    float *hrow = dfetch(o->row, (size_t)bt * 4);
    double *grow = to_double(hrow, KDLOSS_F32, 1, bt, bt);
    snprintf(what, sizeof what, "%s row_loss", tag);
    cmp_arr(what, grow, w->row, bt, w->row_atol, 1e-4);
    *hl = 0;
    if (o->loss) {
        d2h(hl, o->loss, 4);
        kt_close(*hl, w->loss, w->loss_atol, 1e-4, "%s loss", tag);
    }
    if (!o->in_place) ct_rerun(tag, o, call, arg, hg, hrow, *hl);
    free(hg), free(adj), free(hrow), free(grow);
    return gg;
}

void ct_vs_cpu(const char *tag, const ct_rows *o, const double *gg, const void *cg,
               const double *slack, double mult, double g_rel, double g_abs, float hl, float cl,
               double loss_atol) {
    const int64_t n = o->bt * o->v;
    double *cgg = to_double(cg, o->dg, o->bt, o->v, o->ld), *g = xmalloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) /* either side of a TVD tie */
        g[i] = slack && fabs(gg[i] - cgg[i]) <= mult * slack[i] ? cgg[i] : gg[i];
    char what[300];
    snprintf(what, sizeof what, "%s grad vs CPU", tag);
    cmp_arr(what, g, cgg, n, g_rel * max_abs(cgg, n) + g_abs, 2 * kt_eps(o->dg) + 1e-5);
    if (o->loss) kt_close(hl, cl, loss_atol, 1e-4, "%s loss vs CPU", tag);
    free(cgg), free(g);
}
