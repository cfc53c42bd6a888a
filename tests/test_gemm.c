/* The GEMM layer (kdloss_gemm_*): every loadable provider against a double reference on all
 * four transpose cases, padded strides, alpha/beta, edge shapes; beta = 0 ignores NaN in C;
 * the default provider's results do not depend on the thread count; argument errors. The same
 * for the allocation-free fallback that redoes a oneDNN tile that ran out of memory (gemm_fb.h;
 * KDLOSS_GEMM_FALLBACK=always sends every tile there), on each instruction set the CPU has, with
 * shapes whose tiles span several of its row, column and inner-dimension blocks.
 *
 * Tolerance: any order of summing k products in fp32 is within gamma_k * sum_i |a_i b_i| of
 * the exact dot product, gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy and Stability
 * of Numerical Algorithms, 2nd ed., section 3.5); the alpha product, the beta term and the
 * final addition add three more roundings. The check uses that bound with k + 3 in place of
 * k: it holds for every correct implementation and a wrong element or a missed term breaks it
 * by orders of magnitude.
 * The bf16 GEMM choice (kdloss_gemm_bf16_query): measured once, also when several threads ask
 * at once, cached, consistent with its rates, and forced modes on top of it.
 * kdloss_gemm_bf16 (native bf16 x bf16 -> fp32, where oneDNN has it, or emulated where it does
 * not): a product of two bf16 numbers is exact in fp32, so the same gamma_k bound holds with the
 * operands' bf16 values, on every transpose case, beta 0 (NaN in C ignored) and 1, padded
 * strides; thread-count independent; its argument errors. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss.h"
#include "testutil.h"

typedef struct gcase {
    int ta, tb;
    int64_t m, n, k, pad;
    float alpha, beta;
} gcase;

static float *frand(kt_rng *r, int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(kt_normal(r) * (i % 5 == 0 ? 8.0 : 1.0));
    return p;
}

/* Element (i, j) of op(X) for X stored row-major with ld, transposed when t: fp32 and bf16
 * (raw bits) storage. */
typedef double (*elem_fn)(const void *x, int t, int64_t ld, int64_t i, int64_t j);

static double at(const void *x, int t, int64_t ld, int64_t i, int64_t j) {
    const float *f = x;
    return t ? f[j * ld + i] : f[i * ld + j];
}

static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

static double at_bf16(const void *x, int t, int64_t ld, int64_t i, int64_t j) {
    const uint16_t *h = x;
    return from_bf16(t ? h[j * ld + i] : h[i * ld + j]);
}

/* Case c's storage: A ar x ac (lda), B br x bc (ldb), C m x n (ldc), padded by c->pad. */
typedef struct glayout {
    int64_t ar, ac, br, bc, lda, ldb, ldc;
} glayout;

static glayout layout_of(const gcase *c) {
    glayout l;
    l.ar = c->ta ? c->k : c->m, l.ac = c->ta ? c->m : c->k;
    l.br = c->tb ? c->n : c->k, l.bc = c->tb ? c->k : c->n;
    l.lda = (l.ac > 1 ? l.ac : 1) + c->pad, l.ldb = (l.bc > 1 ? l.bc : 1) + c->pad;
    l.ldc = c->n + c->pad;
    return l;
}

/* A fresh C (*cm) and its copy before the call (*c0): NaN when beta = 0, which must ignore C. */
static void fresh_c(kt_rng *rng, const gcase *c, const glayout *l, float **cm, float **c0) {
    *cm = frand(rng, c->m * l->ldc);
    *c0 = malloc(sizeof(float) * (size_t)(c->m * l->ldc > 0 ? c->m * l->ldc : 1));
    if (c->beta == 0.0f) /* beta = 0 must ignore C: NaN there must not leak through */
        for (int64_t i = 0; i < c->m * l->ldc; i++) (*cm)[i] = NAN;
    memcpy(*c0, *cm, sizeof(float) * (size_t)(c->m * l->ldc));
}

/* Every element of C against the double reference alpha op(A) op(B) + beta C0, within
 * gamma_(k + rounds) times its terms' magnitude (the header's bound; rounds: the roundings
 * beyond the k products' sum), and its padding untouched. */
static void check_c(const char *ctx, const gcase *c, const glayout *l, elem_fn el, const void *a,
                    const void *b, const float *cm, const float *c0, int rounds) {
    const double u = 0x1p-24, g = (double)(c->k + rounds) * u / (1.0 - (double)(c->k + rounds) * u);
    int64_t bad = 0, pad_bad = 0, ldc = l->ldc;
    for (int64_t i = 0; i < c->m; i++) {
        for (int64_t j = 0; j < c->n; j++) {
            double s = 0.0, mag = 0.0;
            for (int64_t q = 0; q < c->k; q++) {
                double t = el(a, c->ta, l->lda, i, q) * el(b, c->tb, l->ldb, q, j);
                s += t;
                mag += fabs(t);
            }
            double old = c->beta == 0.0f ? 0.0 : (double)c0[i * ldc + j];
            double want = (double)c->alpha * s + (double)c->beta * old;
            double lim = g * (fabs((double)c->alpha) * mag + fabs((double)c->beta * old)) + 1e-37;
            if (!(fabs((double)cm[i * ldc + j] - want) <= lim)) bad++;
        }
        for (int64_t j = c->n; j < ldc; j++) /* padding: untouched */
            if (memcmp(&cm[i * ldc + j], &c0[i * ldc + j], sizeof(float))) pad_bad++;
    }
    KT_CHECK(bad == 0, "%s: %lld of %lld elements outside the fp32 summation bound", ctx,
             (long long)bad, (long long)(c->m * c->n));
    KT_CHECK(pad_bad == 0, "%s: %lld padding elements written", ctx, (long long)pad_bad);
}

/* Runs case c with provider p and checks every element against the double reference. */
static void check_case(kt_rng *rng, kdloss_gemm_provider p, const char *pname, const gcase *c) {
    glayout l = layout_of(c);
    float *a = frand(rng, l.ar * l.lda), *b = frand(rng, l.br * l.ldb), *cm, *c0;
    fresh_c(rng, c, &l, &cm, &c0);
    kdloss_status st = kdloss_gemm_f32(p, c->ta, c->tb, c->m, c->n, c->k, c->alpha, a, l.lda, b,
                                       l.ldb, c->beta, cm, l.ldc);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s %c%c m %lld n %lld k %lld pad %lld alpha %g beta %g", pname,
             c->ta ? 'T' : 'N', c->tb ? 'T' : 'N', (long long)c->m, (long long)c->n,
             (long long)c->k, (long long)c->pad, c->alpha, c->beta);
    /* the alpha product, the beta term and the final addition: three roundings more */
    if (KT_CHECK(st == KDLOSS_OK, "%s: status %s", ctx, kdloss_status_string(st)))
        check_c(ctx, c, &l, at, a, b, cm, c0, 3);
    free(a);
    free(b);
    free(cm);
    free(c0);
}

static void providers_vs_reference(kt_rng *rng) {
    static const kdloss_gemm_provider all[] = {KDLOSS_GEMM_ONEDNN, KDLOSS_GEMM_BUILTIN,
                                               KDLOSS_GEMM_OPENBLAS};
    static const int64_t dims[][3] = {{1, 1, 1},    {3, 70, 5},    {17, 64, 33},
                                      {130, 257, 96}, {256, 300, 1}, {64, 2100, 40},
                                      {5, 7, 0}};
    for (size_t ip = 0; ip < sizeof all / sizeof all[0]; ip++) {
        kdloss_gemm_info info;
        if (kdloss_gemm_query(all[ip], &info) != KDLOSS_OK) {
            printf("provider %d not loadable here: skipped\n", (int)all[ip]);
            continue;
        }
        printf("provider %s %s, kernel %s%s\n", info.name, info.version, info.kernel,
               info.generic ? " (generic)" : "");
        int cnt = 0;
        for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++)
            for (int t = 0; t < 4; t++, cnt++) {
                gcase c = {t & 1, t >> 1, dims[id][0], dims[id][1], dims[id][2], cnt % 3,
                           cnt % 4 == 3 ? -0.5f : 1.0f, cnt % 2 ? 0.75f : 0.0f};
                check_case(rng, all[ip], info.name, &c);
            }
    }
}

/* The default provider: bitwise the same C with 1, 2 and 3 threads, on shapes that split into
 * several tiles along M, along N, and on a long K. */
static void thread_count_independence(kt_rng *rng) {
    kdloss_gemm_info info;
    if (!KT_CHECK(kdloss_gemm_query(KDLOSS_GEMM_AUTO, &info) == KDLOSS_OK, "query AUTO")) return;
    if (!info.thread_independent) {
        printf("provider %s does not promise thread-count independence: skipped\n", info.name);
        return;
    }
    static const int64_t dims[][3] = {{512, 4096, 96}, {2048, 128, 64}, {96, 80, 20000}};
    int save = omp_get_max_threads();
    for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++) {
        int64_t m = dims[id][0], n = dims[id][1], k = dims[id][2];
        float *a = frand(rng, m * k), *b = frand(rng, k * n);
        float *c[3];
        for (int t = 0; t < 3; t++) {
            c[t] = malloc(sizeof(float) * (size_t)(m * n));
            omp_set_num_threads(t + 1);
            kdloss_status st =
                kdloss_gemm_f32(KDLOSS_GEMM_AUTO, 0, id == 1, m, n, k, 1.0f, a, k, b,
                                id == 1 ? k : n, 0.0f, c[t], n);
            KT_CHECK(st == KDLOSS_OK, "threads %d: status %s", t + 1, kdloss_status_string(st));
        }
        omp_set_num_threads(save);
        for (int t = 1; t < 3; t++)
            KT_CHECK(!memcmp(c[0], c[t], sizeof(float) * (size_t)(m * n)),
                     "%s %lldx%lldx%lld: %d threads differ from 1 thread", info.name,
                     (long long)m, (long long)n, (long long)k, t + 1);
        free(a);
        free(b);
        for (int t = 0; t < 3; t++) free(c[t]);
    }
}

static void argument_errors(void) {
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {7, 7, 7, 7};
    KT_CHECK(kdloss_gemm_f32((kdloss_gemm_provider)9, 0, 0, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2) ==
                 KDLOSS_ERR_INVALID_PARAM, "unknown provider");
    KT_CHECK(kdloss_gemm_f32(0, 2, 0, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2) == KDLOSS_ERR_INVALID_PARAM,
             "trans_a 2");
    KT_CHECK(kdloss_gemm_f32(0, 0, 0, -1, 2, 2, 1, a, 2, b, 2, 0, c, 2) == KDLOSS_ERR_INVALID_SIZE,
             "m < 0");
    KT_CHECK(kdloss_gemm_f32(0, 0, 0, 2, 2, 2, 1, NULL, 2, b, 2, 0, c, 2) ==
                 KDLOSS_ERR_NULL_POINTER, "a NULL");
    KT_CHECK(kdloss_gemm_f32(0, 0, 0, 2, 2, 2, 1, a, 1, b, 2, 0, c, 2) ==
                 KDLOSS_ERR_INVALID_STRIDE, "lda < k");
    KT_CHECK(kdloss_gemm_f32(0, 0, 1, 2, 2, 3, 1, a, 3, b, 2, 0, c, 2) ==
                 KDLOSS_ERR_INVALID_STRIDE, "ldb < k with trans_b");
    float ab[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    KT_CHECK(kdloss_gemm_f32(0, 0, 0, 2, 2, 2, 1, ab, 2, b, 2, 0, ab + 2, 2) ==
                 KDLOSS_ERR_ALIASING, "C overlapping A");
    KT_CHECK(ab[2] == 3.0f && ab[5] == 6.0f, "C written on the aliasing error");
    for (int i = 0; i < 4; i++) KT_CHECK(c[i] == 7.0f, "C written on error");
    kdloss_gemm_info info;
    KT_CHECK(kdloss_gemm_query(0, NULL) == KDLOSS_ERR_NULL_POINTER, "query NULL");
    KT_CHECK(kdloss_gemm_set_provider((kdloss_gemm_provider)-1) == KDLOSS_ERR_INVALID_PARAM,
             "set_provider -1");
    KT_CHECK(kdloss_gemm_set_bf16((kdloss_bf16_gemm)7) == KDLOSS_ERR_INVALID_PARAM,
             "set_bf16 7");
    /* the default is oneDNN (builtin in a build without it, which then has no oneDNN), and it
     * is never a generic kernel on an AVX2 / AVX-512 CPU */
    kdloss_gemm_info dnnl;
    int has_dnnl = kdloss_gemm_query(KDLOSS_GEMM_ONEDNN, &dnnl) == KDLOSS_OK;
    KT_CHECK(kdloss_gemm_query(KDLOSS_GEMM_AUTO, &info) == KDLOSS_OK &&
                 info.provider == (has_dnnl ? KDLOSS_GEMM_ONEDNN : KDLOSS_GEMM_BUILTIN) &&
                 !info.generic,
             "default provider: %s kernel %s generic %d", info.name, info.kernel, info.generic);
    if (kdloss_gemm_set_provider(KDLOSS_GEMM_OPENBLAS) == KDLOSS_OK) {
        KT_CHECK(kdloss_gemm_query(KDLOSS_GEMM_AUTO, &info) == KDLOSS_OK &&
                     info.provider == KDLOSS_GEMM_OPENBLAS, "set_provider openblas");
        KT_CHECK(kdloss_gemm_set_provider(KDLOSS_GEMM_AUTO) == KDLOSS_OK, "back to AUTO");
    }
}

/* The fallback, forced, on every instruction set the CPU has: the reference check on small and
 * edge shapes and on tiles larger than its blocks (KD_FB_MC 1020 rows, KD_FB_NC 1024 columns,
 * KD_FB_KC 256 of k: the grid cuts C into at most 2 tiles per processor, so m = 4200 and
 * n = 4200 give tiles wider than a block on machines with up to 2 processors, and several
 * blocks of k always); bitwise the same with 1, 2 and 3 threads. */
static void fallback(kt_rng *rng) {
    static const int64_t dims[][3] = {{1, 1, 1},     {3, 70, 5},     {17, 64, 33},  {130, 257, 96},
                                      {4200, 40, 600}, {20, 4200, 300}, {37, 45, 1000}};
    kdloss_gemm_info info;
    if (kdloss_gemm_query(KDLOSS_GEMM_ONEDNN, &info) != KDLOSS_OK) return;
    kdloss_cpu_isa save = kdloss_cpu_get_isa();
    setenv("KDLOSS_GEMM_FALLBACK", "always", 1);
    for (int ii = KDLOSS_ISA_SCALAR; ii < KDLOSS_ISA_COUNT; ii++) {
        const char *name = kdloss_cpu_isa_name((kdloss_cpu_isa)ii);
        if (kdloss_cpu_set_isa((kdloss_cpu_isa)ii) != KDLOSS_OK) {
            printf("fallback %s: not on this CPU, skipped\n", name);
            continue;
        }
        char pname[40];
        snprintf(pname, sizeof pname, "fallback-%s", name);
        int cnt = 0;
        for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++)
            for (int t = 0; t < 4; t++, cnt++) {
                gcase c = {t & 1, t >> 1, dims[id][0], dims[id][1], dims[id][2], cnt % 3,
                           cnt % 4 == 3 ? -0.5f : 1.0f, cnt % 2 ? 0.75f : 0.0f};
                check_case(rng, KDLOSS_GEMM_ONEDNN, pname, &c);
            }
        /* thread-count independence: the default provider's check runs the fallback now */
        thread_count_independence(rng);
    }
    unsetenv("KDLOSS_GEMM_FALLBACK");
    kdloss_cpu_set_isa(save);
}

/* The bf16 GEMM choice: measured once per process, the first time from several
 * threads at once, cached (the same rates and choice on every later query), and the choice the
 * measured rates imply; forced modes change what runs, not the measurement. Runs first, so that
 * nothing has measured yet. */
static void bf16_choice(void) {
    enum { NT = 4 };
    kdloss_bf16_gemm_info q[NT], again;
    kdloss_status st[NT];
    KT_CHECK(kdloss_gemm_bf16_query(NULL) == KDLOSS_ERR_NULL_POINTER, "bf16 query NULL");
#pragma omp parallel for num_threads(NT) schedule(static, 1)
    for (int t = 0; t < NT; t++) st[t] = kdloss_gemm_bf16_query(&q[t]);
    for (int t = 0; t < NT; t++)
        if (!KT_CHECK(st[t] == KDLOSS_OK, "bf16 query %d: status %d", t, st[t])) return;
    const kdloss_bf16_gemm_info *b = &q[0];
    printf("bf16 GEMM: native %.1f GFLOP/s (%s), widen + sgemm %.1f GFLOP/s, choice %s\n",
           b->native_gflops, b->kernel, b->widen_gflops, b->auto_native ? "native" : "widen");
    KT_CHECK(b->measurements == 1, "bf16 measured %d times", b->measurements);
    KT_CHECK(b->widen_gflops > 0.0, "no sgemm rate");
    KT_CHECK(b->mode == KDLOSS_BF16_GEMM_AUTO && b->grad == KDLOSS_BF16_GRAD_AUTO &&
                 b->native == b->auto_native && b->grad_native == b->auto_native,
             "defaults: mode %d grad %d native %d grad_native %d auto %d", b->mode, b->grad,
             b->native, b->grad_native, b->auto_native);
    int want = b->available && !b->reference && b->native_gflops > 0.0 &&
               b->native_gflops >= b->margin * b->widen_gflops;
    KT_CHECK(b->auto_native == want, "choice %d, but the rates %.1f / %.1f (margin %.2f) say %d",
             b->auto_native, b->native_gflops, b->widen_gflops, b->margin, want);
    KT_CHECK(b->available || (b->native_gflops == 0.0 && !b->auto_native),
             "no bf16 matmul, yet a native rate or choice");
    for (int t = 1; t < NT; t++)
        KT_CHECK(!memcmp(&q[t], b, sizeof *b), "bf16 query %d differs from query 0", t);
    for (int rep = 0; rep < 3; rep++) {
        KT_CHECK(kdloss_gemm_bf16_query(&again) == KDLOSS_OK && !memcmp(&again, b, sizeof *b),
                 "bf16 query %d: not the cached answer", rep);
    }
    KT_CHECK(kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_WIDEN) == KDLOSS_OK, "set WIDEN");
    KT_CHECK(kdloss_gemm_bf16_query(&again) == KDLOSS_OK && !again.native &&
                 !again.grad_native && again.mode == KDLOSS_BF16_GEMM_WIDEN &&
                 again.measurements == 1 && again.native_gflops == b->native_gflops &&
                 again.widen_gflops == b->widen_gflops && again.auto_native == b->auto_native,
             "WIDEN: native %d, measurements %d", again.native, again.measurements);
    kdloss_gemm_info gi;
    KT_CHECK(kdloss_gemm_query(KDLOSS_GEMM_AUTO, &gi) == KDLOSS_OK && !gi.bf16_native,
             "WIDEN: kdloss_gemm_query says bf16 native");
    kdloss_status sn = kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_NATIVE);
    KT_CHECK(sn == (b->available ? KDLOSS_OK : KDLOSS_ERR_UNSUPPORTED),
             "set NATIVE: status %d with a bf16 matmul available %d", sn, b->available);
    if (sn == KDLOSS_OK)
        KT_CHECK(kdloss_gemm_bf16_query(&again) == KDLOSS_OK && again.native &&
                     again.grad_native && again.measurements == 1,
                 "NATIVE: native %d grad_native %d", again.native, again.grad_native);
    KT_CHECK(kdloss_gemm_set_bf16_grad((kdloss_bf16_grad)-1) == KDLOSS_ERR_INVALID_PARAM,
             "set_bf16_grad -1");
    KT_CHECK(kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_AUTO) == KDLOSS_OK, "back to AUTO");
    KT_CHECK(kdloss_gemm_bf16_query(&again) == KDLOSS_OK && !memcmp(&again, b, sizeof *b),
             "AUTO again: not the cached answer");
}

/* bf16 bits of x, rounded to nearest even (x finite). */
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t *brand(kt_rng *r, int64_t n) {
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = to_bf16((float)(kt_normal(r) * (i % 5 == 0 ? 8.0 : 1.0)));
    return p;
}

/* Case c (alpha 1, beta 0 or 1) by kdloss_gemm_bf16, checked as check_case: a product of two
 * bf16 numbers is exact in fp32, so only the k-term sum and the beta addition round. */
static void check_bf16_case(kt_rng *rng, const gcase *c) {
    glayout l = layout_of(c);
    uint16_t *a = brand(rng, l.ar * l.lda), *b = brand(rng, l.br * l.ldb);
    float *cm, *c0;
    fresh_c(rng, c, &l, &cm, &c0);
    kdloss_status st = kdloss_gemm_bf16(KDLOSS_GEMM_AUTO, c->ta, c->tb, c->m, c->n, c->k, a,
                                        l.lda, b, l.ldb, c->beta, cm, l.ldc);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "bf16 %c%c m %lld n %lld k %lld pad %lld beta %g",
             c->ta ? 'T' : 'N', c->tb ? 'T' : 'N', (long long)c->m, (long long)c->n,
             (long long)c->k, (long long)c->pad, c->beta);
    if (KT_CHECK(st == KDLOSS_OK, "%s: status %s", ctx, kdloss_status_string(st)))
        check_c(ctx, c, &l, at_bf16, a, b, cm, c0, 2);
    free(a);
    free(b);
    free(cm);
    free(c0);
}

/* kdloss_gemm_bf16: against the reference (natively, or emulated where oneDNN has no bf16
 * matmul: KDLOSS_GEMM_BF16_EMULATE=1 for this section only), thread-count independence, errors. */
static void bf16_gemm(kt_rng *rng) {
    kdloss_bf16_gemm_info q;
    KT_CHECK(kdloss_gemm_bf16_query(&q) == KDLOSS_OK, "bf16 query");
    uint16_t one[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
    float c[4] = {0};
    kdloss_status st = kdloss_gemm_bf16(KDLOSS_GEMM_ONEDNN, 0, 0, 2, 2, 2, one, 2, one, 2, 0.0f, c, 2);
    int emulated = 0;
    if (!q.available || q.reference) {
        KT_CHECK(st == KDLOSS_ERR_UNSUPPORTED, "no bf16 matmul here, yet status %d", st);
        setenv("KDLOSS_GEMM_BF16_EMULATE", "1", 1);
        emulated = 1;
    }
    printf("kdloss_gemm_bf16: %s\n", emulated ? "emulated (no native bf16 here)" : q.kernel);
    static const int64_t dims[][3] = {{1, 1, 1},     {3, 70, 5},    {17, 64, 33}, {130, 257, 96},
                                      {256, 300, 1}, {64, 2100, 40}, {5, 7, 0},   {300, 1030, 700}};
    int cnt = 0;
    for (size_t id = 0; id < sizeof dims / sizeof dims[0]; id++)
        for (int t = 0; t < 4; t++, cnt++) {
            gcase cs = {t & 1, t >> 1, dims[id][0], dims[id][1], dims[id][2], cnt % 3, 1.0f,
                        cnt % 2 ? 1.0f : 0.0f};
            check_bf16_case(rng, &cs);
        }
    /* the native tiles' allocation-free fallback (what a tile whose gemm could not allocate
     * runs), forced: widened operand blocks across KD_FB_MC / KD_FB_NC / KD_FB_KC edges */
    static const int64_t fdims[][3] = {{1, 1, 1}, {17, 64, 33}, {1100, 40, 300}, {20, 1100, 600}};
    setenv("KDLOSS_GEMM_FALLBACK", "always", 1);
    for (size_t id = 0; id < sizeof fdims / sizeof fdims[0]; id++)
        for (int t = 0; t < 4; t++, cnt++) {
            gcase cs = {t & 1, t >> 1, fdims[id][0], fdims[id][1], fdims[id][2], cnt % 3, 1.0f,
                        cnt % 2 ? 1.0f : 0.0f};
            check_bf16_case(rng, &cs);
        }
    unsetenv("KDLOSS_GEMM_FALLBACK");
    /* thread-count independence: the same bits with 1, 2 and 3 threads */
    const int64_t m = 300, n = 1500, k = 400;
    uint16_t *a = brand(rng, m * k), *b = brand(rng, n * k);
    float *r[3];
    int save = omp_get_max_threads();
    for (int i = 0; i < 3; i++) {
        r[i] = malloc(sizeof(float) * (size_t)(m * n));
        omp_set_num_threads(i + 1);
        KT_CHECK(kdloss_gemm_bf16(KDLOSS_GEMM_AUTO, 0, 1, m, n, k, a, k, b, k, 0.0f, r[i], n) ==
                     KDLOSS_OK, "bf16 %d threads", i + 1);
    }
    omp_set_num_threads(save);
    KT_CHECK(!memcmp(r[0], r[1], sizeof(float) * (size_t)(m * n)) &&
                 !memcmp(r[0], r[2], sizeof(float) * (size_t)(m * n)),
             "bf16 GEMM: results differ between 1, 2 and 3 threads");
    for (int i = 0; i < 3; i++) free(r[i]);
    free(a);
    free(b);
    /* argument errors: nothing written */
    float keep[4] = {7, 7, 7, 7};
    KT_CHECK(kdloss_gemm_bf16(0, 0, 0, 2, 2, 2, one, 2, one, 2, 0.5f, keep, 2) ==
                 KDLOSS_ERR_INVALID_PARAM, "bf16 beta 0.5");
    KT_CHECK(kdloss_gemm_bf16(0, 0, 0, 2, 2, 2, NULL, 2, one, 2, 0.0f, keep, 2) ==
                 KDLOSS_ERR_NULL_POINTER, "bf16 NULL a");
    KT_CHECK(kdloss_gemm_bf16(0, 0, 0, 2, 2, 2, one, 1, one, 2, 0.0f, keep, 2) ==
                 KDLOSS_ERR_INVALID_STRIDE, "bf16 lda 1");
    KT_CHECK(kdloss_gemm_bf16((kdloss_gemm_provider)9, 0, 0, 2, 2, 2, one, 2, one, 2, 0.0f, keep,
                              2) == KDLOSS_ERR_INVALID_PARAM, "bf16 provider 9");
    KT_CHECK(kdloss_gemm_bf16(0, 0, 0, 2, 2, 2, (const uint16_t *)keep, 2, one, 2, 0.0f, keep, 2) ==
                 KDLOSS_ERR_ALIASING, "bf16 C overlapping A");
    KT_CHECK(keep[0] == 7 && keep[1] == 7 && keep[2] == 7 && keep[3] == 7,
             "bf16 argument errors wrote C");
    if (emulated) unsetenv("KDLOSS_GEMM_BF16_EMULATE");
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    bf16_choice();
    argument_errors();
    providers_vs_reference(&rng);
    thread_count_independence(&rng);
    fallback(&rng);
    bf16_gemm(&rng);
    return kt_finish("test_gemm");
}
