/* test_sim_blas.c: tests of the simulator's cuBLAS / cuBLASLt / NCCL stand-ins
 * (cudasim/src/sim_blas.cpp, sim_nccl.cpp) against an independent naive double GEMM and a
 * rank-order reduction computed here. Exits non-zero when anything is wrong.
 *
 * Build and run by hand (from the repository root), with the runtime stub below:
 *   g++ -std=c++17 -O2 -Wall -Wextra -pthread -Icudasim/include -Icudasim/src \
 *       -c cudasim/src/sim_blas.cpp -o /tmp/sim_blas.o
 *   g++ -std=c++17 -O2 -Wall -Wextra -pthread -Icudasim/include -Icudasim/src \
 *       -c cudasim/src/sim_nccl.cpp -o /tmp/sim_nccl.o
 *   gcc -std=c11 -O2 -Wall -Wextra -pthread -Icudasim/include -Icudasim/src \
 *       cudasim/tests/test_sim_blas.c /tmp/sim_blas.o /tmp/sim_nccl.o -lstdc++ -lm \
 *       -o /tmp/test_sim_blas && /tmp/test_sim_blas
 * With the real runtime (cudasim/src/sim.cpp) define KD_SIM_TEST_WITH_RUNTIME and link it
 * instead of the stub. KD_SIM_NO_SPEED_LIMIT=1 turns the two speed limits (optimised builds, CPU
 * time) into mere prints, for a debug build of the stand-ins. The test provokes memcheck /
 * initcheck / blas / nccl reports on purpose and counts them itself; it does not ask for a clean
 * kd_sim_summary(). */
#define _GNU_SOURCE
#include <fenv.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "kd_sim.h"
#include "nccl.h"

/* ======== THROWAWAY RUNTIME STUB (stands in for cudasim/src/sim.cpp; not part of the test) ====
 * Device memory = 256-byte aligned host memory with a shadow byte per byte for initcheck. Only
 * what the stand-ins and this test call; honours the contract of sim_internal.h. */
#ifndef KD_SIM_TEST_WITH_RUNTIME
#include "sim_internal.h"

typedef struct {
    char *base;
    size_t size;
    unsigned char *init;
} stub_alloc;

#define STUB_MAX 4096
static stub_alloc stub_allocs[STUB_MAX];
static int stub_n;
static pthread_mutex_t stub_mu = PTHREAD_MUTEX_INITIALIZER;
static long stub_reports, stub_by[8];
static const char *stub_names[8] = {"memcheck", "racecheck", "synccheck", "initcheck",
                                    "launch",   "blas",      "nccl",      "other"};
static cudaError_t stub_sticky = cudaSuccess;

static int stub_checker(const char *c) {
    for (int i = 0; i < 7; ++i)
        if (strcmp(c, stub_names[i]) == 0) return i;
    return 7;
}

void kd_sim_report(const char *checker, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&stub_mu);
    stub_reports++;
    stub_by[stub_checker(checker)]++;
    fprintf(stderr, "cuda-sim %s: ", checker);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&stub_mu);
}

long kd_sim_report_count(void) {
    pthread_mutex_lock(&stub_mu);
    long n = stub_reports;
    pthread_mutex_unlock(&stub_mu);
    return n;
}

long kd_sim_report_count_of(const char *checker) {
    pthread_mutex_lock(&stub_mu);
    long n = stub_by[stub_checker(checker)];
    pthread_mutex_unlock(&stub_mu);
    return n;
}

/* The allocation holding [p, p + bytes), or NULL; call with stub_mu held. */
static stub_alloc *stub_find(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (int i = 0; i < stub_n; ++i) {
        stub_alloc *a = &stub_allocs[i];
        if (c >= a->base && c <= a->base + a->size && bytes <= (size_t)(a->base + a->size - c))
            return a;
    }
    return NULL;
}

int kd_sim_dev_check(const void *p, size_t bytes, const char *who) {
    if (bytes == 0) return 1;
    pthread_mutex_lock(&stub_mu);
    int ok = stub_find(p, bytes) != NULL;
    pthread_mutex_unlock(&stub_mu);
    if (!ok)
        kd_sim_report("memcheck", "%s: [%p, +%zu) is not inside one allocation", who, p, bytes);
    return ok;
}

int kd_sim_dev_check_init(const void *p, size_t bytes, const char *who) {
    if (bytes == 0) return 1;
    pthread_mutex_lock(&stub_mu);
    stub_alloc *a = stub_find(p, bytes);
    size_t bad = bytes;
    if (a) {
        const size_t off = (size_t)((const char *)p - a->base);
        for (size_t i = 0; i < bytes && bad == bytes; ++i)
            if (!a->init[off + i]) bad = i;
    }
    pthread_mutex_unlock(&stub_mu);
    if (a && bad == bytes) return 1;
    kd_sim_report("initcheck", "%s: byte %zu of [%p, +%zu) read before written", who, bad, p,
                  bytes);
    return 0;
}

void kd_sim_dev_mark_init(void *p, size_t bytes) {
    if (bytes == 0) return;
    pthread_mutex_lock(&stub_mu);
    stub_alloc *a = stub_find(p, bytes);
    if (a) memset(a->init + ((char *)p - a->base), 1, bytes);
    pthread_mutex_unlock(&stub_mu);
}

void kd_sim_set_error(cudaError_t e) {
    pthread_mutex_lock(&stub_mu);
    if (stub_sticky == cudaSuccess) stub_sticky = e;
    pthread_mutex_unlock(&stub_mu);
}

cudaError_t cudaGetLastError(void) {
    pthread_mutex_lock(&stub_mu);
    cudaError_t e = stub_sticky;
    stub_sticky = cudaSuccess;
    pthread_mutex_unlock(&stub_mu);
    return e;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    const size_t sz = (bytes + 255) / 256 * 256 + 256;
    char *b = (char *)aligned_alloc(256, sz);
    unsigned char *init = (unsigned char *)calloc(bytes ? bytes : 1, 1);
    pthread_mutex_lock(&stub_mu);
    int ok = b && init && stub_n < STUB_MAX;
    if (ok) stub_allocs[stub_n++] = (stub_alloc){b, bytes, init};
    pthread_mutex_unlock(&stub_mu);
    if (!ok) {
        free(b);
        free(init);
        return cudaErrorMemoryAllocation;
    }
    memset(b, 0xA5, sz); /* garbage, as fresh device memory may hold */
    *p = b;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&stub_mu);
    int i = 0, found;
    while (i < stub_n && stub_allocs[i].base != (char *)p) ++i;
    found = i < stub_n;
    if (found) {
        free(stub_allocs[i].base);
        free(stub_allocs[i].init);
        stub_allocs[i] = stub_allocs[--stub_n];
    }
    pthread_mutex_unlock(&stub_mu);
    return found ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    memcpy(dst, src, bytes);
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
        kd_sim_dev_mark_init(dst, bytes);
    return cudaSuccess;
}

#endif /* KD_SIM_TEST_WITH_RUNTIME */
/* ======== END OF THE STUB =======================================================================
 */

/* Whether the runtime initchecks: the stub always does; libkdsim does once its access hooks are on,
 * which is never in its ASan build (see main). */
static int g_initcheck = 1;

#if defined(KD_SIM_TEST_WITH_RUNTIME) && !defined(__SANITIZE_ADDRESS__) &&                         \
    !defined(__SANITIZE_THREAD__)
/* libkdsim's: an instrumented object calls it when loaded, which turns the access hooks (and
 * initcheck with them) on. This test is no such object, so it calls it itself. */
void __tsan_init(void);
#define KD_TEST_HOOKS_ON() __tsan_init()
#else
#define KD_TEST_HOOKS_ON() ((void)0)
#endif

/* ---- bookkeeping -------------------------------------------------------------------------------
 */

static int n_pass, n_fail;

static void check(int ok, const char *fmt, ...) {
    if (ok) {
        n_pass++;
        return;
    }
    n_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL: ");
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

/* Non-uniform values: uniform in [-1, 1) times 2^e, e in [-4, 3]. */
static float rand_val(void) {
    const int e = (int)(urand() * 8) - 4;
    return (float)ldexp(2.0 * urand() - 1.0, e);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU time of this thread: the speed limits hold on a loaded machine too. */
static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- independent number formats ----------------------------------------------------------------
 */

static uint16_t f32_to_bf16(float f) { /* round to nearest even, the usual bit trick (no NaN) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* double -> bf16, nearest even, by another route than the stand-in's: the bf16 below |v| by
 * truncation, its upper neighbour, and a comparison of the two distances (finite, in range). */
static uint16_t f64_to_bf16(double v) {
    const int old = fegetround();
    fesetround(FE_TOWARDZERO);
    volatile float t = (float)fabs(v);
    fesetround(old);
    uint32_t u;
    float ft = t;
    memcpy(&u, &ft, 4);
    const uint32_t lo = u >> 16, hi = lo + 1;
    const double dl = fabs(v) - bf16_to_f32((uint16_t)lo), dh = bf16_to_f32((uint16_t)hi) - fabs(v);
    const uint32_t r = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return (uint16_t)(r | (signbit(v) ? 0x8000u : 0));
}

/* ---- test matrices
 * -------------------------------------------------------------------------------- */

/* A column-major matrix as stored on the device, and its exact values on the host. */
typedef struct {
    cudaDataType_t t;
    int rows, cols, ld;
    double *val; /* ld * cols, the value of each stored element */
    void *dev;
} tmat;

static size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* Writes the host value v at element idx of the typed buffer buf (bf16 or fp32). */
static double put(void *buf, cudaDataType_t t, size_t idx, double v) {
    if (t == CUDA_R_32F) {
        ((float *)buf)[idx] = (float)v;
        return (float)v;
    }
    ((uint16_t *)buf)[idx] = f32_to_bf16((float)v);
    return bf16_to_f32(f32_to_bf16((float)v));
}

enum { FILL_RANDOM, FILL_NAN, FILL_NONE };

/* rows x cols with ld = rows + pad; device buffer cols * ld elements. The padding is never
 * written (so initcheck must not need it) unless sentinel: then the whole buffer first holds
 * 1234.5 (to see that a GEMM writes nothing there). Columns are uploaded one by one. */
static void tmat_make(tmat *m, cudaDataType_t t, int rows, int cols, int pad, int fill,
                      int sentinel) {
    m->t = t;
    m->rows = rows;
    m->cols = cols;
    m->ld = rows + pad;
    const size_t n = (size_t)m->ld * (size_t)cols, es = esize(t);
    m->val = (double *)calloc(n + 1, sizeof(double));
    void *host = calloc(n + 1, es);
    if (cudaMalloc(&m->dev, n * es + 1) != cudaSuccess) abort();
    for (size_t i = 0; i < n; ++i) m->val[i] = put(host, t, i, 1234.5);
    if (sentinel) cudaMemcpy(m->dev, host, n * es, cudaMemcpyHostToDevice);
    for (int j = 0; j < cols && fill != FILL_NONE; ++j) {
        for (int i = 0; i < rows; ++i) {
            const size_t idx = (size_t)j * m->ld + i;
            m->val[idx] = put(host, t, idx, fill == FILL_NAN ? NAN : rand_val());
        }
        const size_t off = (size_t)j * m->ld * es;
        cudaMemcpy((char *)m->dev + off, (char *)host + off, (size_t)rows * es,
                   cudaMemcpyHostToDevice);
    }
    free(host);
}

static void tmat_free(tmat *m) {
    cudaFree(m->dev);
    free(m->val);
}

/* Every stored element as a double (reads the whole buffer back). */
static double *tmat_read(const tmat *m) {
    const size_t n = (size_t)m->ld * (size_t)m->cols, es = esize(m->t);
    void *host = malloc(n * es + 1);
    double *out = (double *)malloc((n + 1) * sizeof(double));
    cudaMemcpy(host, m->dev, n * es, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; ++i)
        out[i] = m->t == CUDA_R_32F ? ((float *)host)[i] : bf16_to_f32(((uint16_t *)host)[i]);
    free(host);
    return out;
}

/* ---- the naive reference ----------------------------------------------------------------------
 */

/* expect (ldd x n as D) = alpha op(A) op(B) + beta C rounded to D's type: a triple loop in double,
 * k ascending; C not read when beta == 0; D's padding keeps its value. */
static double *naive_gemm(int ta, int tb, int m, int n, int k, double alpha, const tmat *A,
                          const tmat *B, double beta, const tmat *C, const tmat *D) {
    double *e = (double *)malloc(((size_t)D->ld * n + 1) * sizeof(double));
    memcpy(e, D->val, (size_t)D->ld * n * sizeof(double));
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double s = 0.0;
            for (int p = 0; p < k; ++p) {
                const double a = ta ? A->val[(size_t)i * A->ld + p] : A->val[(size_t)p * A->ld + i];
                const double b = tb ? B->val[(size_t)p * B->ld + j] : B->val[(size_t)j * B->ld + p];
                s += a * b;
            }
            double v = alpha * s;
            if (beta != 0.0) v += beta * C->val[(size_t)j * C->ld + i];
            e[(size_t)j * D->ld + i] =
                D->t == CUDA_R_32F ? (double)(float)v : (double)bf16_to_f32(f64_to_bf16(v));
        }
    return e;
}

/* Number of elements (padding included) where D on the device differs from expect (bitwise, NaN
 * equal to NaN). */
static long count_diff(const tmat *D, const double *expect) {
    double *got = tmat_read(D);
    long bad = 0;
    for (size_t i = 0; i < (size_t)D->ld * (size_t)D->cols; ++i) {
        const int same = (isnan(got[i]) && isnan(expect[i])) || got[i] == expect[i];
        bad += !same;
    }
    free(got);
    return bad;
}

/* ---- driving cuBLASLt the way src/cuda/gemm.cu does --------------------------------------------
 */

static uint32_t ptr_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) a >>= 1;
    return a;
}

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulPreference_t pref;
} lt_objs;

typedef struct {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int set_transa;    /* 0: leave TRANSA at its default (a deliberately wrong descriptor) */
    uint32_t align[4]; /* promised alignment of A, B, C, D; 0: the pointer's true alignment */
    uint64_t max_ws;
} lt_opts;

static const lt_opts LT_DEFAULT = {CUBLAS_COMPUTE_32F, CUDA_R_32F, 1, {0, 0, 0, 0}, 1 << 20};

/* Descriptors for D = alpha op(A) op(B) + beta C from the stored shapes of the tmats. */
static cublasStatus_t lt_setup(lt_objs *o, int ta, int tb, const tmat *A, const tmat *B,
                               const tmat *C, const tmat *D, const lt_opts *opt) {
    const int32_t t[2] = {ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N};
    const void *ptr[4] = {A->dev, B->dev, C->dev, D->dev};
    memset(o, 0, sizeof *o);
    cublasStatus_t s = cublasLtMatmulDescCreate(&o->op, opt->compute, opt->scale);
    if (!s && opt->set_transa)
        s = cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSA, &t[0], 4);
    if (!s) s = cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSB, &t[1], 4);
    if (!s) s = cublasLtMatrixLayoutCreate(&o->la, A->t, A->rows, A->cols, A->ld);
    if (!s) s = cublasLtMatrixLayoutCreate(&o->lb, B->t, B->rows, B->cols, B->ld);
    if (!s) s = cublasLtMatrixLayoutCreate(&o->lc, C->t, C->rows, C->cols, C->ld);
    if (!s) s = cublasLtMatrixLayoutCreate(&o->ld, D->t, D->rows, D->cols, D->ld);
    if (!s) s = cublasLtMatmulPreferenceCreate(&o->pref);
    if (!s)
        s = cublasLtMatmulPreferenceSetAttribute(o->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &opt->max_ws, 8);
    for (int i = 0; i < 4 && !s; ++i) {
        const uint32_t a = opt->align[i] ? opt->align[i] : ptr_align(ptr[i]);
        s = cublasLtMatmulPreferenceSetAttribute(
            o->pref,
            (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
            &a, 4);
    }
    return s;
}

static void lt_free(lt_objs *o) {
    cublasLtMatmulPreferenceDestroy(o->pref);
    cublasLtMatrixLayoutDestroy(o->ld);
    cublasLtMatrixLayoutDestroy(o->lc);
    cublasLtMatrixLayoutDestroy(o->lb);
    cublasLtMatrixLayoutDestroy(o->la);
    cublasLtMatmulDescDestroy(o->op);
}

/* Heuristic then matmul; *heur_status / *nres tell what the heuristic said. Returns the matmul's
 * status, or the heuristic's when it gave no algorithm. */
static cublasStatus_t lt_gemm(cublasLtHandle_t lt, int ta, int tb, float alpha, const tmat *A,
                              const tmat *B, float beta, const tmat *C, const tmat *D,
                              const lt_opts *opt, cublasStatus_t *heur_status, int *nres) {
    lt_objs o;
    cublasLtMatmulHeuristicResult_t h;
    void *ws = NULL;
    *nres = 0;
    cublasStatus_t s = lt_setup(&o, ta, tb, A, B, C, D, opt);
    if (!s)
        s = cublasLtMatmulAlgoGetHeuristic(lt, o.op, o.la, o.lb, o.lc, o.ld, o.pref, 1, &h, nres);
    *heur_status = s;
    if (!s && *nres > 0) {
        if (cudaMalloc(&ws, 4096) != cudaSuccess) abort();
        s = cublasLtMatmul(lt, o.op, &alpha, A->dev, o.la, B->dev, o.lb, &beta, C->dev, o.lc,
                           D->dev, o.ld, &h.algo, ws, 4096, NULL);
        cudaFree(ws);
    }
    lt_free(&o);
    return s;
}

/* ---- the GEMM combinations
 * ------------------------------------------------------------------------ */

typedef struct {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
} handles;

/* One combination through one API: m 37, n 29, k 45, padded lds, C == D (in place) except for
 * cuBLASLt with beta 0, where C is a separate buffer never written. fp32 inputs with a bf16
 * output is no cuBLAS combination: NOT_SUPPORTED is expected. */
static void gemm_case(const handles *hd, int use_lt, int ta, int tb, cudaDataType_t at,
                      cudaDataType_t dt, float beta) {
    const int m = 37, n = 29, k = 45;
    const float alpha = ta ? 0.5f : 1.0f;
    const int served = !(at == CUDA_R_32F && dt == CUDA_R_16BF);
    tmat A, B, D, Cs;
    tmat_make(&A, at, ta ? k : m, ta ? m : k, 3, FILL_RANDOM, 0);
    tmat_make(&B, at, tb ? n : k, tb ? k : n, 2, FILL_RANDOM, 0);
    tmat_make(&D, dt, m, n, 5, beta != 0.0f ? FILL_RANDOM : FILL_NAN, 1);
    const int sep_c = use_lt && beta == 0.0f;
    if (sep_c) tmat_make(&Cs, dt, m, n, 5, FILL_NONE, 0);
    const tmat *C = sep_c ? &Cs : &D;
    double *expect = naive_gemm(ta, tb, m, n, k, alpha, &A, &B, beta, C, &D);
    const long reports0 = kd_sim_report_count();
    long lt0, ex0, lt1, ex1;
    kd_sim_gemm_counts(&lt0, &ex0);
    cublasStatus_t s, hs = CUBLAS_STATUS_SUCCESS;
    int nres = 1;
    if (use_lt) {
        s = lt_gemm(hd->lt, ta, tb, alpha, &A, &B, beta, C, &D, &LT_DEFAULT, &hs, &nres);
    } else {
        s = cublasGemmEx(hd->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                         m, n, k, &alpha, A.dev, at, A.ld, B.dev, at, B.ld, &beta, D.dev, dt, D.ld,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    kd_sim_gemm_counts(&lt1, &ex1);
    const char *api = use_lt ? "cublasLtMatmul" : "cublasGemmEx";
    const int ta_c = ta ? 'T' : 'N', tb_c = tb ? 'T' : 'N', a16 = at == CUDA_R_16BF ? 16 : 32,
              d16 = dt == CUDA_R_16BF ? 16 : 32;
    if (!served) {
        check(s == CUBLAS_STATUS_NOT_SUPPORTED, "%s %c%c in%d out%d: status %d, want NOT_SUPPORTED",
              api, ta_c, tb_c, a16, d16, (int)s);
    } else {
        const long bad = s == CUBLAS_STATUS_SUCCESS ? count_diff(&D, expect) : -1;
        check(s == CUBLAS_STATUS_SUCCESS && nres == 1 && bad == 0,
              "%s %c%c in%d out%d beta %g: status %d (heuristic %d, %d algos), %ld elements differ",
              api, ta_c, tb_c, a16, d16, beta, (int)s, (int)hs, nres, bad);
        check(kd_sim_report_count() == reports0, "%s %c%c in%d out%d beta %g: checker reports", api,
              ta_c, tb_c, a16, d16, beta);
        check(use_lt ? (lt1 == lt0 + 1 && ex1 == ex0) : (ex1 == ex0 + 1 && lt1 == lt0),
              "%s: gemm counts %ld/%ld -> %ld/%ld", api, lt0, ex0, lt1, ex1);
    }
    free(expect);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
    if (sep_c) tmat_free(&Cs);
}

static void test_combinations(const handles *hd) {
    const cudaDataType_t types[2] = {CUDA_R_32F, CUDA_R_16BF};
    for (int api = 0; api < 2; ++api)
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb)
                for (int at = 0; at < 2; ++at)
                    for (int dt = 0; dt < 2; ++dt)
                        for (int b = 0; b < 3; ++b) /* beta 0, 1, and -0.5 (exact scaling) */
                            gemm_case(hd, api, ta, tb, types[at], types[dt],
                                      b < 2 ? (float)b : -0.5f);
}

/* ---- descriptors and arguments cuBLAS refuses
 * ------------------------------------------------------ */

static void test_lt_refusals(const handles *hd) {
    const int m = 37, n = 29, k = 45;
    tmat A, B, D, As, Ds;
    tmat_make(&A, CUDA_R_32F, k, m, 3, FILL_RANDOM, 0); /* stored for op T */
    tmat_make(&B, CUDA_R_32F, k, n, 2, FILL_RANDOM, 0);
    tmat_make(&D, CUDA_R_32F, m, n, 5, FILL_RANDOM, 1);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t hs, s;
    int nres;
    lt_opts o = LT_DEFAULT;
    o.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    s = lt_gemm(hd->lt, 1, 0, one, &A, &B, zero, &D, &D, &o, &hs, &nres);
    check(hs == CUBLAS_STATUS_NOT_SUPPORTED, "Lt TF32 compute: heuristic %d", (int)hs);
    o = LT_DEFAULT;
    o.scale = CUDA_R_64F;
    s = lt_gemm(hd->lt, 1, 0, one, &A, &B, zero, &D, &D, &o, &hs, &nres);
    check(hs == CUBLAS_STATUS_NOT_SUPPORTED, "Lt fp64 scale type: heuristic %d", (int)hs);
    /* the wrong transpose for these shapes: TRANSA left at N while A is stored k x m */
    const long blas0 = kd_sim_report_count_of("blas");
    o = LT_DEFAULT;
    o.set_transa = 0;
    s = lt_gemm(hd->lt, 1, 0, one, &A, &B, zero, &D, &D, &o, &hs, &nres);
    check(hs == CUBLAS_STATUS_INVALID_VALUE && kd_sim_report_count_of("blas") > blas0,
          "Lt shapes disagreeing with TRANSA: heuristic %d", (int)hs);
    /* square A: the shapes agree, so the GEMM runs, and the comparison must catch it */
    tmat_make(&As, CUDA_R_32F, 32, 32, 1, FILL_RANDOM, 0);
    tmat_make(&Ds, CUDA_R_32F, 32, n, 0, FILL_NAN, 1);
    tmat Bs = B;
    Bs.rows = 32; /* the first 32 rows of B: k = 32 */
    double *expect = naive_gemm(1, 0, 32, n, 32, 1.0, &As, &Bs, 0.0, &Ds, &Ds);
    s = lt_gemm(hd->lt, 1, 0, one, &As, &Bs, zero, &Ds, &Ds, &o, &hs, &nres);
    check(s == CUBLAS_STATUS_SUCCESS && count_diff(&Ds, expect) > 0,
          "a missing TRANSA on square A must give a result the comparison rejects (status %d)",
          (int)s);
    free(expect);
    /* a leading dimension below the rows */
    tmat Abad = A;
    Abad.ld = A.rows - 1;
    s = lt_gemm(hd->lt, 1, 0, one, &Abad, &B, zero, &D, &D, &LT_DEFAULT, &hs, &nres);
    check(hs == CUBLAS_STATUS_INVALID_VALUE, "Lt ld < rows: heuristic %d", (int)hs);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
    tmat_free(&As);
    tmat_free(&Ds);
}

static void test_gemm_ex_refusals(const handles *hd) {
    const int m = 37, n = 29, k = 45;
    tmat A, B, D;
    tmat_make(&A, CUDA_R_32F, k, m, 3, FILL_RANDOM, 0); /* stored for op T */
    tmat_make(&B, CUDA_R_32F, k, n, 2, FILL_RANDOM, 0);
    tmat_make(&D, CUDA_R_32F, m, n, 5, FILL_RANDOM, 1);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
#define GEMM_EX(h, ta, mm, lda, al, ct, alg)                                                       \
    cublasGemmEx(h, ta, N, mm, n, k, al, A.dev, CUDA_R_32F, lda, B.dev, CUDA_R_32F, B.ld, &zero,   \
                 D.dev, CUDA_R_32F, D.ld, ct, alg)
    s = GEMM_EX(hd->blas, T, m, A.ld, &one, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, "GemmEx TF32 compute: %d", (int)s);
    s = GEMM_EX(hd->blas, T, m, A.ld, &one, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, "GemmEx fp64 compute: %d", (int)s);
    s = GEMM_EX(hd->blas, T, m, A.ld, &one, CUBLAS_COMPUTE_32F, (cublasGemmAlgo_t)5);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, "GemmEx explicit algo: %d", (int)s);
    s = GEMM_EX(hd->blas, T, m, k - 1, &one, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_INVALID_VALUE, "GemmEx lda < k for op T: %d", (int)s);
    s = GEMM_EX(hd->blas, T, -1, A.ld, &one, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_INVALID_VALUE, "GemmEx m < 0: %d", (int)s);
    s = GEMM_EX(hd->blas, T, m, A.ld, NULL, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_INVALID_VALUE, "GemmEx alpha NULL: %d", (int)s);
    s = GEMM_EX(NULL, T, m, A.ld, &one, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_NOT_INITIALIZED, "GemmEx NULL handle: %d", (int)s);
#undef GEMM_EX
    s = cublasGemmEx(hd->blas, T, N, m, n, k, &one, A.dev, CUDA_R_32F, A.ld, B.dev, CUDA_R_16BF,
                     B.ld, &zero, D.dev, CUDA_R_32F, D.ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, "GemmEx A fp32 with B bf16: %d", (int)s);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
}

/* Attributes: stored, read back, unknown ones and wrong sizes refused, dead objects caught. */
static void test_attributes(const handles *hd) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l;
    int32_t v = 0, row = CUBLASLT_ORDER_ROW;
    size_t w = 0;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    check(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &v, 4, &w) == 0 &&
              v == CUBLAS_COMPUTE_32F && w == 4,
          "desc keeps its compute type (%d)", (int)v);
    check(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &v, 4, &w) == 0 &&
              v == CUDA_R_32F,
          "desc keeps its scale type (%d)", (int)v);
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &v, 8) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "a wrong attribute size is INVALID_VALUE");
    check(cublasLtMatmulDescSetAttribute(op, (cublasLtMatmulDescAttributes_t)17, &v, 4) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "an attribute not modelled is NOT_SUPPORTED");
    cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 8, 8, 8);
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, 4);
    cublasLtMatmulPreference_t p;
    cublasLtMatmulPreferenceCreate(&p);
    cublasLtMatmulHeuristicResult_t h;
    int nres = -1;
    check(cublasLtMatmulAlgoGetHeuristic(hd->lt, op, l, l, l, l, p, 1, &h, &nres) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "row-major layout is NOT_SUPPORTED");
    check(cublasLtMatmulAlgoGetHeuristic(NULL, op, l, l, l, l, p, 1, &h, &nres) ==
              CUBLAS_STATUS_NOT_INITIALIZED,
          "NULL Lt handle is NOT_INITIALIZED");
    check(cublasLtMatmulAlgoGetHeuristic(hd->lt, op, l, NULL, l, l, p, 1, &h, &nres) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "NULL layout is INVALID_VALUE");
    const long blas0 = kd_sim_report_count_of("blas");
    cublasLtMatrixLayoutDestroy(l);
    check(cublasLtMatmulAlgoGetHeuristic(hd->lt, op, l, l, l, l, p, 1, &h, &nres) ==
                  CUBLAS_STATUS_INVALID_VALUE &&
              kd_sim_report_count_of("blas") > blas0,
          "a destroyed layout is INVALID_VALUE with a report");
    cublasLtMatmulPreferenceDestroy(p);
    cublasLtMatmulDescDestroy(op);
}

static void test_algo_value(const handles *hd, const tmat *A, const tmat *Av, const tmat *B,
                            const tmat *D);

/* ---- the no-heuristic switch, promised alignments, the algorithm value -------------------------
 */

static void test_heuristic_and_alignment(const handles *hd) {
    const int m = 16, n = 8, k = 12;
    tmat A, B, D;
    tmat_make(&A, CUDA_R_32F, m + 1, k, 0, FILL_RANDOM, 0); /* one spare row for the offset view */
    tmat_make(&B, CUDA_R_32F, k, n, 0, FILL_RANDOM, 0);
    tmat_make(&D, CUDA_R_32F, m, n, 0, FILL_NAN, 1);
    A.rows = m; /* A: m x k with ld m + 1; its spare row makes room for the offset view */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t hs, s;
    int nres;
    kd_sim_set_no_lt_heuristic(1);
    s = lt_gemm(hd->lt, 0, 0, one, &A, &B, zero, &D, &D, &LT_DEFAULT, &hs, &nres);
    check(hs == CUBLAS_STATUS_SUCCESS && nres == 0, "switch on: heuristic %d, %d algos", (int)hs,
          nres);
    kd_sim_set_no_lt_heuristic(0);
    lt_opts o = LT_DEFAULT;
    o.max_ws = 0; /* the reference needs no workspace: still one algorithm */
    s = lt_gemm(hd->lt, 0, 0, one, &A, &B, zero, &D, &D, &o, &hs, &nres);
    check(s == CUBLAS_STATUS_SUCCESS && nres == 1, "switch off, max workspace 0: %d, %d algos",
          (int)s, nres);
    /* A seen from its second element: 4-byte aligned, m x k with ld m + 1 */
    tmat Av = A;
    Av.dev = (char *)A.dev + 4;
    Av.val = A.val + 1;
    Av.rows = m;
    Av.ld = m + 1;
    const long reports0 = kd_sim_report_count();
    o = LT_DEFAULT;
    o.align[0] = 16; /* a promise the pointer breaks */
    s = lt_gemm(hd->lt, 0, 0, one, &Av, &B, zero, &D, &D, &o, &hs, &nres);
    check(hs == CUBLAS_STATUS_SUCCESS && nres == 1 && s == CUBLAS_STATUS_NOT_SUPPORTED,
          "A less aligned than promised: heuristic %d (%d algos), matmul %d, want NOT_SUPPORTED",
          (int)hs, nres, (int)s);
    check(kd_sim_report_count() == reports0, "a broken alignment promise is no checker report");
    double *expect = naive_gemm(0, 0, m, n, k, 1.0, &Av, &B, 0.0, &D, &D);
    s = lt_gemm(hd->lt, 0, 0, one, &Av, &B, zero, &D, &D, &LT_DEFAULT, &hs, &nres);
    check(s == CUBLAS_STATUS_SUCCESS && count_diff(&D, expect) == 0,
          "A with its true 4-byte alignment promised: %d", (int)s);
    free(expect);
    test_algo_value(hd, &A, &Av, &B, &D);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
}

/* algo NULL means the default preference (256-byte alignment); an algorithm value must come
 * from the heuristic. A: 256-byte aligned, Av: 4-byte aligned, both m x k. */
static void test_algo_value(const handles *hd, const tmat *A, const tmat *Av, const tmat *B,
                            const tmat *D) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    lt_objs ob;
    lt_setup(&ob, 0, 0, Av, B, D, D, &LT_DEFAULT);
    s = cublasLtMatmul(hd->lt, ob.op, &one, Av->dev, ob.la, B->dev, ob.lb, &zero, D->dev, ob.lc,
                       D->dev, ob.ld, NULL, NULL, 0, NULL);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, "algo NULL with a 4-byte aligned A: %d", (int)s);
    lt_free(&ob);
    lt_setup(&ob, 0, 0, A, B, D, D, &LT_DEFAULT);
    s = cublasLtMatmul(hd->lt, ob.op, &one, A->dev, ob.la, B->dev, ob.lb, &zero, D->dev, ob.lc,
                       D->dev, ob.ld, NULL, NULL, 0, NULL);
    check(s == CUBLAS_STATUS_SUCCESS, "algo NULL with 256-byte aligned pointers: %d", (int)s);
    cublasLtMatmulAlgo_t junk;
    memset(&junk, 0x5a, sizeof junk);
    s = cublasLtMatmul(hd->lt, ob.op, &one, A->dev, ob.la, B->dev, ob.lb, &zero, D->dev, ob.lc,
                       D->dev, ob.ld, &junk, NULL, 0, NULL);
    check(s == CUBLAS_STATUS_INVALID_VALUE, "an algorithm not from the heuristic: %d", (int)s);
    lt_free(&ob);
}

/* ---- memcheck, initcheck, aliasing, the workspace
 * ------------------------------------------------- */

/* cublasGemmEx, N N, fp32, D (m x n) = A B + beta D. */
static cublasStatus_t gemm_nn(const handles *hd, const tmat *A, const tmat *B, float beta,
                              const tmat *D) {
    const float one = 1.0f;
    return cublasGemmEx(hd->blas, CUBLAS_OP_N, CUBLAS_OP_N, D->rows, D->cols, A->cols, &one, A->dev,
                        A->t, A->ld, B->dev, B->t, B->ld, &beta, D->dev, D->t, D->ld,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void test_workspace(const handles *hd, const tmat *A, const tmat *B, const tmat *D);

static void test_memory(const handles *hd) {
    tmat A, B, D, U, Dn;
    tmat_make(&A, CUDA_R_32F, 20, 10, 0, FILL_RANDOM, 0);
    tmat_make(&B, CUDA_R_32F, 10, 6, 1, FILL_RANDOM, 0);
    tmat_make(&D, CUDA_R_32F, 20, 6, 2, FILL_RANDOM, 1);
    tmat_make(&U, CUDA_R_32F, 20, 10, 0, FILL_NONE, 0);
    tmat_make(&Dn, CUDA_R_32F, 20, 6, 2, FILL_NONE, 0);
    (void)cudaGetLastError();
    long mc = kd_sim_report_count_of("memcheck"), ic = kd_sim_report_count_of("initcheck");
    tmat Ao = A;
    Ao.dev = (char *)A.dev + 8; /* the last column runs 8 bytes past the allocation */
    cublasStatus_t s = gemm_nn(hd, &Ao, &B, 0.0f, &D);
    check(s == CUBLAS_STATUS_EXECUTION_FAILED && kd_sim_report_count_of("memcheck") == mc + 1 &&
              cudaGetLastError() == cudaErrorIllegalAddress,
          "A past its allocation: %d, a memcheck report and the sticky error", (int)s);
    /* without initcheck (libkdsim's ASan build) the reads of unwritten memory just succeed */
    const cublasStatus_t unwritten = g_initcheck ? CUBLAS_STATUS_EXECUTION_FAILED : 0;
    s = gemm_nn(hd, &U, &B, 0.0f, &D);
    check(s == unwritten && kd_sim_report_count_of("initcheck") == ic + g_initcheck,
          "A never written: %d and an initcheck report", (int)s);
    s = gemm_nn(hd, &A, &B, 1.0f, &Dn);
    check(s == unwritten && kd_sim_report_count_of("initcheck") == ic + 2 * g_initcheck,
          "beta 1 with C never written: %d and an initcheck report", (int)s);
    ic = kd_sim_report_count_of("initcheck");
    s = gemm_nn(hd, &A, &B, 0.0f, &Dn);
    check(s == CUBLAS_STATUS_SUCCESS && kd_sim_report_count_of("initcheck") == ic,
          "beta 0 with C never written: %d, no report", (int)s);
    s = gemm_nn(hd, &A, &B, 1.0f, &Dn); /* D's columns were marked written (padding is not) */
    check(s == CUBLAS_STATUS_SUCCESS && kd_sim_report_count_of("initcheck") == ic,
          "beta 1 after D was written: %d, no report", (int)s);
    const long blas0 = kd_sim_report_count_of("blas");
    tmat Dal = A; /* D over A's memory */
    Dal.rows = 20;
    Dal.cols = 6;
    s = gemm_nn(hd, &A, &B, 0.0f, &Dal);
    check(s == CUBLAS_STATUS_INVALID_VALUE && kd_sim_report_count_of("blas") == blas0 + 1,
          "D overlapping A: %d and a blas report", (int)s);
    tmat_free(&U);
    tmat_free(&Dn);
    test_workspace(hd, &A, &B, &D);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
}

/* The workspace: checked when set and when used; cublasSetStream drops it (gemm.cu relies on
 * that order). D = A B must work with the handle's workspace. */
static void test_workspace(const handles *hd, const tmat *A, const tmat *B, const tmat *D) {
    cublasStatus_t s;
    long mc;
    void *ws = NULL;
    cudaMalloc(&ws, 8192);
    check(cublasSetWorkspace(hd->blas, (char *)ws + 16, 4096) == CUBLAS_STATUS_INVALID_VALUE,
          "a workspace not 256-byte aligned is INVALID_VALUE");
    check(cublasSetWorkspace(hd->blas, ws, 8192) == CUBLAS_STATUS_SUCCESS, "set a workspace");
    cudaFree(ws);
    mc = kd_sim_report_count_of("memcheck");
    s = gemm_nn(hd, A, B, 0.0f, D);
    check(s == CUBLAS_STATUS_EXECUTION_FAILED && kd_sim_report_count_of("memcheck") == mc + 1 &&
              cudaGetLastError() == cudaErrorIllegalAddress,
          "a freed workspace still set: %d", (int)s);
    cudaMalloc(&ws, 8192);
    cublasSetWorkspace(hd->blas, ws, 8192);
    cublasSetStream(hd->blas, NULL);
    cudaFree(ws);
    s = gemm_nn(hd, A, B, 0.0f, D);
    check(s == CUBLAS_STATUS_SUCCESS, "cublasSetStream dropped the freed workspace: %d", (int)s);
}

/* ---- one rounding from double, to bf16 and fp16 -------------------------------------------------
 */

/* The 16-bit result of the 1 x 1 x k GEMM a . b, everything in type t (bf16 or fp16). */
static uint16_t dot16(const handles *hd, cudaDataType_t t, const uint16_t *a, const uint16_t *b,
                      int k) {
    void *da, *db, *dd;
    cudaMalloc(&da, 2 * (size_t)k);
    cudaMalloc(&db, 2 * (size_t)k);
    cudaMalloc(&dd, 2);
    cudaMemcpy(da, a, 2 * (size_t)k, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, 2 * (size_t)k, cudaMemcpyHostToDevice);
    const float one = 1.0f, zero = 0.0f;
    uint16_t out = 0xdead;
    if (cublasGemmEx(hd->blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, k, &one, da, t, 1, db, t, k, &zero,
                     dd, t, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS)
        cudaMemcpy(&out, dd, 2, cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
    return out;
}

static uint16_t bf(double v) { return f32_to_bf16((float)v); }

static void test_rounding(const handles *hd) {
    const double p4 = 0x1p-4, p15 = 0x1p-15, p7 = 0x1p-7;
    /* 1 + 2^-8 + 2^-30: above the tie, so up; rounding to fp32 first would tie and go down */
    uint16_t a1[3] = {bf(1), bf(p4), bf(p15)}, b1[3] = {bf(1), bf(p4), bf(p15)};
    uint16_t r = dot16(hd, CUDA_R_16BF, a1, b1, 3);
    check(r == 0x3f81, "bf16 1 + 2^-8 + 2^-30 -> 0x3f81, got 0x%04x", r);
    uint16_t a2[2] = {bf(1), bf(p4)}, b2[2] = {bf(1), bf(p4)}; /* 1 + 2^-8: tie, to even */
    r = dot16(hd, CUDA_R_16BF, a2, b2, 2);
    check(r == 0x3f80, "bf16 1 + 2^-8 -> 0x3f80, got 0x%04x", r);
    uint16_t a3[2] = {bf(1 + p7), bf(p4)}; /* 1 + 2^-7 + 2^-8: tie, to even (up) */
    r = dot16(hd, CUDA_R_16BF, a3, b2, 2);
    check(r == 0x3f82, "bf16 1 + 2^-7 + 2^-8 -> 0x3f82, got 0x%04x", r);
    uint16_t a4[1] = {bf(0x1p64)}, b4[1] = {bf(0x1p64)};
    r = dot16(hd, CUDA_R_16BF, a4, b4, 1);
    check(r == 0x7f80, "bf16 2^128 -> inf, got 0x%04x", r);
    /* fp16 (encodings by hand): 1 0x3c00, 2^-6 0x2400, 2^-5 0x2800, 2^-15 0x0200 (subnormal) */
    uint16_t h1[3] = {0x3c00, 0x2400, 0x0200}, g1[3] = {0x3c00, 0x2800, 0x0200};
    r = dot16(hd, CUDA_R_16F, h1, g1, 3);
    check(r == 0x3c01, "fp16 1 + 2^-11 + 2^-30 -> 0x3c01, got 0x%04x", r);
    uint16_t h2[1] = {0x1400}, g2[1] = {0x1400}; /* 2^-10 squared: the subnormal 2^-20 */
    r = dot16(hd, CUDA_R_16F, h2, g2, 1);
    check(r == 0x0010, "fp16 2^-20 -> 0x0010, got 0x%04x", r);
    uint16_t h3[1] = {0x5c00}, g3[1] = {0x5c00}, h4[1] = {0x5bf8}; /* 256, 255 */
    r = dot16(hd, CUDA_R_16F, h3, g3, 1);
    check(r == 0x7c00, "fp16 65536 -> inf, got 0x%04x", r);
    r = dot16(hd, CUDA_R_16F, h4, g3, 1);
    check(r == 0x7bf8, "fp16 65280 -> 0x7bf8, got 0x%04x", r);
}

/* The sum of each element is plain, in double, k ascending, across the k blocks: 2^60, then 255
 * ones (each lost against 2^60), -2^60, three ones -> 3 (another order gives 255 or 0). */
static void test_sum_order(const handles *hd) {
    enum { K = 260 };
    float a[K], b[K], out = -1.0f;
    for (int p = 0; p < K; ++p) {
        a[p] = 1.0f;
        b[p] = 1.0f;
    }
    a[0] = b[0] = 0x1p30f;
    a[256] = -0x1p30f;
    b[256] = 0x1p30f;
    void *da, *db, *dd;
    cudaMalloc(&da, sizeof a);
    cudaMalloc(&db, sizeof b);
    cudaMalloc(&dd, 4);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(hd->blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, K, &one, da,
                                    CUDA_R_32F, 1, db, CUDA_R_32F, K, &zero, dd, CUDA_R_32F, 1,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(&out, dd, 4, cudaMemcpyDeviceToHost);
    check(s == CUBLAS_STATUS_SUCCESS && out == 3.0f, "sum in k order: %d, got %g, want 3", (int)s,
          out);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
}

/* ---- speed at the sizes the library's tests use, with spot checks -------------------------------
 */

/* The limits assume an optimised build of the stand-ins: not under a sanitizer (detected when
 * this file is built with the same flags), nor with KD_SIM_NO_SPEED_LIMIT=1 (a debug build). */
static int speed_limits_apply(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return 0;
#else
    const char *e = getenv("KD_SIM_NO_SPEED_LIMIT");
    return !(e && strcmp(e, "1") == 0);
#endif
}

static void speed_case(const handles *hd, cudaDataType_t at, int m, int n, int k, double limit_s) {
    tmat A, B, D;
    tmat_make(&A, at, k, m, 0, FILL_RANDOM, 0); /* op T, as the logits GEMM */
    tmat_make(&B, at, k, n, 0, FILL_RANDOM, 0);
    tmat_make(&D, CUDA_R_32F, m, n, 0, FILL_NAN, 1);
    cublasStatus_t hs;
    int nres;
    const double t0 = now_s(), c0 = cpu_s();
    cublasStatus_t s = lt_gemm(hd->lt, 1, 0, 1.0f, &A, &B, 0.0f, &D, &D, &LT_DEFAULT, &hs, &nres);
    const double wall = now_s() - t0, dt = cpu_s() - c0;
    double *got = tmat_read(&D);
    int bad = 0;
    for (int t = 0; t < 64; ++t) {
        const int i = (int)(urand() * m), j = (int)(urand() * n);
        double sum = 0.0;
        for (int p = 0; p < k; ++p) sum += A.val[(size_t)i * k + p] * B.val[(size_t)j * k + p];
        bad += got[(size_t)j * m + i] != (double)(float)sum;
    }
    printf("  %s GEMM %d x %d x %d: %.3f s CPU, %.3f s wall\n", at == CUDA_R_32F ? "fp32" : "bf16",
           m, n, k, dt, wall);
    check(s == CUBLAS_STATUS_SUCCESS && bad == 0, "large GEMM: status %d, %d of 64 samples wrong",
          (int)s, bad);
    if (speed_limits_apply())
        check(dt < limit_s, "%d x %d x %d took %.3f s CPU (limit %.1f s)", m, n, k, dt, limit_s);
    free(got);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D);
}

/* ---- several threads, each with its own handles, at once
 * -------------------------------------------- */

typedef struct {
    const tmat *A, *B;
    const double *expect;
    int use_lt;
    long wrong; /* GEMMs that failed or differ */
} conc_arg;

static void *conc_thread(void *p) {
    conc_arg *c = (conc_arg *)p;
    handles hd;
    tmat D;
    cublasCreate(&hd.blas);
    cublasLtCreate(&hd.lt);
    D.t = CUDA_R_32F;
    D.rows = c->A->rows;
    D.cols = c->B->cols;
    D.ld = D.rows;
    D.val = NULL;
    cudaMalloc(&D.dev, (size_t)D.ld * (size_t)D.cols * 4);
    for (int it = 0; it < 8; ++it) {
        cublasStatus_t hs, s;
        int nres;
        if (c->use_lt)
            s = lt_gemm(hd.lt, 0, 0, 1.0f, c->A, c->B, 0.0f, &D, &D, &LT_DEFAULT, &hs, &nres);
        else
            s = gemm_nn(&hd, c->A, c->B, 0.0f, &D);
        c->wrong += s != CUBLAS_STATUS_SUCCESS || count_diff(&D, c->expect) != 0;
    }
    cudaFree(D.dev);
    cublasLtDestroy(hd.lt);
    cublasDestroy(hd.blas);
    return NULL;
}

static void test_concurrency(void) {
    tmat A, B, D0;
    tmat_make(&A, CUDA_R_32F, 64, 96, 0, FILL_RANDOM, 0);
    tmat_make(&B, CUDA_R_32F, 96, 48, 0, FILL_RANDOM, 0);
    tmat_make(&D0, CUDA_R_32F, 64, 48, 0, FILL_NONE, 0);
    double *expect = naive_gemm(0, 0, 64, 48, 96, 1.0, &A, &B, 0.0, &D0, &D0);
    conc_arg args[4];
    pthread_t th[4];
    for (int t = 0; t < 4; ++t) {
        args[t] = (conc_arg){&A, &B, expect, t & 1, 0};
        pthread_create(&th[t], NULL, conc_thread, &args[t]);
    }
    for (int t = 0; t < 4; ++t) {
        pthread_join(th[t], NULL);
        check(args[t].wrong == 0, "thread %d (%s): %ld GEMMs wrong", t,
              args[t].use_lt ? "cuBLASLt" : "cublasGemmEx", args[t].wrong);
    }
    free(expect);
    tmat_free(&A);
    tmat_free(&B);
    tmat_free(&D0);
}

/* ---- NCCL: ranks as threads
 * ------------------------------------------------------------------------- */

#define NR 3
#define NCOUNT 1000

enum { NC_GOOD, NC_MISMATCH, NC_ABSENT, NC_BADPTR, NC_UNINIT, NC_INITRANK };

typedef struct {
    ncclComm_t comm;
    ncclUniqueId id;
    int rank, mode;
    ncclResult_t res; /* the first non-success result, or ncclSuccess */
    long wrong;       /* elements of a result that differ from the expectation */
} nc_arg;

static float nc_f(int r, int i) {
    return (float)(((i * 7 + r * 13) % 17) - 8) * 0.37f * (float)(1 + r);
}
static double nc_d(int r, int i) { return sin(0.1 * i + r) * (r + 1); }

/* The good case: float sum in place, double max out of place, int32 sum; checks every element
 * against the rank-order reduction. */
static void nc_good(nc_arg *a, void *f, void *d_in, void *d_out, void *n32) {
    float hf[NCOUNT], ef[NCOUNT];
    double hd_[NCOUNT], ed[NCOUNT];
    int32_t hi[NCOUNT];
    for (int i = 0; i < NCOUNT; ++i) {
        hf[i] = nc_f(a->rank, i);
        hd_[i] = nc_d(a->rank, i);
        hi[i] = i * (a->rank + 1) - 7;
        ef[i] = (nc_f(0, i) + nc_f(1, i)) + nc_f(2, i);
        ed[i] = fmax(fmax(nc_d(0, i), nc_d(1, i)), nc_d(2, i));
    }
    cudaMemcpy(f, hf, sizeof hf, cudaMemcpyHostToDevice);
    cudaMemcpy(d_in, hd_, sizeof hd_, cudaMemcpyHostToDevice);
    cudaMemcpy(n32, hi, sizeof hi, cudaMemcpyHostToDevice);
    ncclResult_t r[3];
    r[0] = ncclAllReduce(f, f, NCOUNT, ncclFloat32, ncclSum, a->comm, NULL);
    r[1] = ncclAllReduce(d_in, d_out, NCOUNT, ncclFloat64, ncclMax, a->comm, NULL);
    r[2] = ncclAllReduce(n32, n32, NCOUNT, ncclInt32, ncclSum, a->comm, NULL);
    for (int i = 0; i < 3; ++i)
        if (a->res == ncclSuccess) a->res = r[i];
    cudaMemcpy(hf, f, sizeof hf, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd_, d_out, sizeof hd_, cudaMemcpyDeviceToHost);
    cudaMemcpy(hi, n32, sizeof hi, cudaMemcpyDeviceToHost);
    for (int i = 0; i < NCOUNT; ++i)
        a->wrong += (hf[i] != ef[i]) + (hd_[i] != ed[i]) + (hi[i] != i * 6 - 21);
}

static void *nc_thread(void *p) {
    nc_arg *a = (nc_arg *)p;
    if (a->mode == NC_INITRANK) a->res = ncclCommInitRank(&a->comm, NR, a->id, a->rank);
    if (a->res != ncclSuccess) return NULL;
    void *f, *d_in, *d_out, *n32;
    cudaMalloc(&f, NCOUNT * 4);
    cudaMalloc(&d_in, NCOUNT * 8);
    cudaMalloc(&d_out, NCOUNT * 8);
    cudaMalloc(&n32, NCOUNT * 4);
    if (a->mode == NC_GOOD || a->mode == NC_INITRANK) {
        nc_good(a, f, d_in, d_out, n32);
    } else if (!(a->mode == NC_ABSENT && a->rank == 2)) {
        float hf[NCOUNT] = {0};
        size_t count = a->mode == NC_MISMATCH && a->rank == 2 ? NCOUNT - 1 : NCOUNT;
        const float *send = (const float *)f;
        if (a->mode == NC_BADPTR && a->rank == 1) send += 10; /* runs 40 bytes past the end */
        if (a->mode != NC_UNINIT || a->rank != 0)
            cudaMemcpy(f, hf, sizeof hf, cudaMemcpyHostToDevice);
        a->res = ncclAllReduce(send, d_in, count, ncclFloat32, ncclSum, a->comm, NULL);
    }
    cudaFree(f);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(n32);
    if (a->mode == NC_INITRANK) ncclCommDestroy(a->comm);
    return NULL;
}

/* Runs the NR ranks of `mode` on comms (NULL: they join with ncclCommInitRank); returns seconds. */
static double nc_run(int mode, ncclComm_t *comms, nc_arg *args) {
    pthread_t th[NR];
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    const double t0 = now_s();
    for (int r = 0; r < NR; ++r) {
        memset(&args[r], 0, sizeof args[r]);
        args[r].comm = comms ? comms[r] : NULL;
        args[r].id = id;
        args[r].rank = r;
        args[r].mode = mode;
        pthread_create(&th[r], NULL, nc_thread, &args[r]);
    }
    for (int r = 0; r < NR; ++r) pthread_join(th[r], NULL);
    return now_s() - t0;
}

static ncclComm_t *nc_comms(ncclComm_t *c) {
    const int devs[NR] = {0, 0, 0};
    check(ncclCommInitAll(c, NR, devs) == ncclSuccess, "ncclCommInitAll");
    return c;
}

static void nc_destroy(ncclComm_t *c) {
    for (int r = 0; r < NR; ++r) ncclCommDestroy(c[r]);
}

static void test_nccl(void) {
    ncclComm_t c[NR];
    nc_arg a[NR];
    int cnt = 0, rk = -1;
    nc_comms(c);
    check(ncclCommCount(c[1], &cnt) == ncclSuccess && cnt == NR &&
              ncclCommUserRank(c[1], &rk) == ncclSuccess && rk == 1,
          "ncclCommCount %d, ncclCommUserRank %d", cnt, rk);
    nc_run(NC_GOOD, c, a);
    for (int r = 0; r < NR; ++r)
        check(a[r].res == ncclSuccess && a[r].wrong == 0,
              "all-reduce sum/max of float, double, int32: rank %d result %d, %ld wrong", r,
              (int)a[r].res, a[r].wrong);
    long nr0 = kd_sim_report_count_of("nccl");
    double secs = nc_run(NC_MISMATCH, c, a);
    for (int r = 0; r < NR; ++r)
        check(a[r].res == ncclInvalidUsage, "mismatched count: rank %d got %d", r, (int)a[r].res);
    check(kd_sim_report_count_of("nccl") > nr0 && secs < 5.0,
          "mismatched count: a report, no wait (%.2f s)", secs);
    long mc = kd_sim_report_count_of("memcheck");
    nc_run(NC_BADPTR, c, a);
    check(a[1].res == ncclUnhandledCudaError && a[0].res == ncclRemoteError &&
              a[2].res == ncclRemoteError && kd_sim_report_count_of("memcheck") == mc + 1 &&
              cudaGetLastError() == cudaErrorIllegalAddress,
          "a send buffer past its allocation: %d %d %d", (int)a[0].res, (int)a[1].res,
          (int)a[2].res);
    long ic = kd_sim_report_count_of("initcheck");
    nc_run(NC_UNINIT, c, a);
    check(g_initcheck ? a[0].res == ncclInvalidUsage && a[1].res == ncclRemoteError &&
                            kd_sim_report_count_of("initcheck") == ic + 1
                      : a[0].res == ncclSuccess && a[1].res == ncclSuccess,
          "a send buffer never written: %d %d %d", (int)a[0].res, (int)a[1].res, (int)a[2].res);
    nc_run(NC_GOOD, c, a); /* the communicator still works after refused collectives */
    check(a[0].res == ncclSuccess && a[0].wrong == 0 && a[2].wrong == 0,
          "all-reduce after the errors: %d", (int)a[0].res);
    nr0 = kd_sim_report_count_of("nccl");
    secs = nc_run(NC_ABSENT, c, a); /* rank 2 never calls: 300 ms limit (set in main) */
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c[0], &async);
    check(a[0].res == ncclSystemError && a[1].res == ncclSystemError &&
              kd_sim_report_count_of("nccl") == nr0 + 1 && async == ncclSystemError && secs < 5.0,
          "a rank that never arrives: %d %d after %.2f s", (int)a[0].res, (int)a[1].res, secs);
    nc_destroy(c);
    nc_run(NC_INITRANK, NULL, a);
    for (int r = 0; r < NR; ++r)
        check(a[r].res == ncclSuccess && a[r].wrong == 0,
              "ncclGetUniqueId + ncclCommInitRank from threads: rank %d result %d, %ld wrong", r,
              (int)a[r].res, a[r].wrong);
    check(ncclCommCount(NULL, &cnt) == ncclInvalidArgument, "ncclCommCount(NULL)");
    check(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "group calls");
    check(strlen(ncclGetErrorString(ncclInvalidUsage)) > 0, "ncclGetErrorString");
}

int main(void) {
    setenv("KD_SIM_NCCL_TIMEOUT_MS", "300", 1); /* read once, at the first wait */
    KD_TEST_HOOKS_ON();
#if defined(KD_SIM_TEST_WITH_RUNTIME) && defined(__SANITIZE_ADDRESS__)
    g_initcheck = 0;
#endif
    handles hd;
    if (cublasCreate(&hd.blas) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&hd.lt) != 0) {
        printf("cannot create handles\n");
        return 1;
    }
    check(cublasCreate(NULL) == CUBLAS_STATUS_INVALID_VALUE, "cublasCreate(NULL)");
    test_combinations(&hd);
    test_lt_refusals(&hd);
    test_gemm_ex_refusals(&hd);
    test_attributes(&hd);
    test_heuristic_and_alignment(&hd);
    test_memory(&hd);
    test_rounding(&hd);
    test_sum_order(&hd);
    speed_case(&hd, CUDA_R_32F, 512, 2048, 512, 1.0);
    speed_case(&hd, CUDA_R_16BF, 2048, 512, 1024, 2.0);
    test_concurrency();
    test_nccl();
    cublasLtDestroy(hd.lt);
    cublasDestroy(hd.blas);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
