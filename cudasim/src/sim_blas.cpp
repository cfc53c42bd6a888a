/* sim_blas.cpp: the cuBLAS and cuBLASLt stand-ins of the CUDA simulator (cublas_v2.h,
 * cublasLt.h). Both serve a GEMM with one reference: operands converted to double, every output
 * element a plain sum in double over k in ascending order (products of fp32 / bf16 / fp16 values
 * are exact in double, so the result does not depend on blocking or on FMA contraction), then
 * alpha, beta and one rounding to the output type (round to nearest even).
 *
 * This is a test oracle: what kdloss does not need is refused with the status cuBLAS documents,
 * every operand is memchecked and initchecked (through sim.cpp) before the GEMM runs, and the
 * calls are synchronous and thread-safe (each thread with its own handles). */
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>
#include <unordered_set>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "sim_internal.h"

/* ---- the objects behind the handles and descriptors -------------------------------------- */

struct kd_sim_cublas_context {
    cudaStream_t stream;
    void *ws; /* NULL: the library's own pool */
    size_t ws_bytes;
};

struct kd_sim_lt_context {
    int unused;
};

struct kd_sim_lt_matmul_desc {
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epilogue;
    void *bias;
};

struct kd_sim_lt_layout {
    uint32_t type;
    int32_t order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t batch_stride;
};

struct kd_sim_lt_pref {
    uint32_t search;
    uint64_t max_ws;
    uint32_t align[4]; /* promised alignment of A, B, C, D in bytes */
};

namespace {

/* ---- live objects: a destroyed or never-created handle is caught without reading it ------- */

std::mutex g_live_mu;
std::unordered_set<const void *> *g_live; /* leaked on purpose: no destruction-order issues */

void live_add(const void *p) {
    std::lock_guard<std::mutex> lk(g_live_mu);
    if (!g_live) g_live = new std::unordered_set<const void *>;
    g_live->insert(p);
}

bool live_del(const void *p) {
    std::lock_guard<std::mutex> lk(g_live_mu);
    return g_live && g_live->erase(p) == 1;
}

bool live_has(const void *p) {
    std::lock_guard<std::mutex> lk(g_live_mu);
    return g_live && g_live->count(p) == 1;
}

/* NULL -> `if_null` quietly (an API misuse cuBLAS answers with a status); a pointer that is not a
 * live object of ours -> a report (a use after destroy) and `if_null` as well. */
cublasStatus_t check_obj(const void *p, const char *what, const char *api, cublasStatus_t if_null) {
    if (!p) return if_null;
    if (live_has(p)) return CUBLAS_STATUS_SUCCESS;
    kd_sim_report("blas", "%s: %s %p is not live (destroyed, or never created)", api, what, p);
    return if_null;
}

template <class T>
cublasStatus_t create_obj(T **out, const T &init) {
    if (!out) return CUBLAS_STATUS_INVALID_VALUE;
    T *o = (T *)malloc(sizeof(T));
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    *o = init;
    live_add(o);
    *out = o;
    return CUBLAS_STATUS_SUCCESS;
}

/* Destroying NULL is allowed (cuBLASLt); destroying a dead object is reported. */
cublasStatus_t destroy_obj(void *p, const char *what, cublasStatus_t if_null) {
    if (!p) return if_null;
    if (!live_del(p)) {
        kd_sim_report("blas", "%s destroy: %p is not live (destroyed twice?)", what, p);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- counters and the no-heuristic switch -------------------------------------------------- */

std::atomic<long> g_lt_count{0}, g_ex_count{0};
std::atomic<int> g_no_heur{-1}; /* -1: the environment not read yet */

bool no_heuristic() {
    int v = g_no_heur.load();
    if (v < 0) {
        const char *e = getenv("KD_SIM_NO_LT_HEURISTIC");
        int want = (e && e[0] == '1' && e[1] == '\0') ? 1 : 0;
        g_no_heur.compare_exchange_strong(v, want); /* a kd_sim_set_no_lt_heuristic wins */
        v = g_no_heur.load();
    }
    return v == 1;
}

/* ---- types and number formats --------------------------------------------------------------- */

size_t type_size(int t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
    }
}

/* The pairs cuBLAS serves with CUBLAS_COMPUTE_32F (A type == B type, C type == D type). */
bool type_pair_ok(int ab, int cd) {
    if (ab == CUDA_R_32F) return cd == CUDA_R_32F;
    if (ab == CUDA_R_16BF) return cd == CUDA_R_16BF || cd == CUDA_R_32F;
    if (ab == CUDA_R_16F) return cd == CUDA_R_16F || cd == CUDA_R_32F;
    return false;
}

double bf16_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double f16_to_double(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double a;
    if (e == 0)
        a = std::ldexp((double)m, -24);
    else if (e == 31)
        a = m ? NAN : INFINITY;
    else
        a = std::ldexp((double)(1024 + m), e - 25);
    return (h & 0x8000) ? -a : a;
}

/* v rounded to `sig` significant bits, no quantum below 2^qmin (the subnormals), ties to even;
 * the scaling by powers of two is exact, so this is one rounding from double. */
double round_sig(double v, int sig, int qmin) {
    if (!std::isfinite(v) || v == 0.0) return v;
    int e;
    (void)std::frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    const int q = e - sig < qmin ? qmin : e - sig;
    return std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
}

uint16_t double_to_bf16(double v) {
    if (std::isnan(v)) return std::signbit(v) ? 0xffc0 : 0x7fc0;
    const float f = (float)round_sig(v, 8, -133); /* exact, or 2^128 -> inf */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

uint16_t double_to_f16(double v) {
    if (std::isnan(v)) return std::signbit(v) ? 0xfe00 : 0x7e00;
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::fabs(round_sig(v, 11, -24));
    if (a >= 65536.0) return sign | 0x7c00; /* past 65504 + half an ulp: inf */
    if (a < 0x1p-14) return sign | (uint16_t)std::ldexp(a, 24);
    int e;
    (void)std::frexp(a, &e);
    const uint16_t mant = (uint16_t)(std::ldexp(a, 11 - e) - 1024.0);
    return sign | (uint16_t)((e - 1 + 15) << 10) | mant;
}

/* out[0..n) <- n consecutive elements of type t at p. */
void load_run(const void *p, int t, int64_t n, double *out) {
    if (t == CUDA_R_32F) {
        const float *s = (const float *)p;
        for (int64_t i = 0; i < n; ++i) out[i] = s[i];
    } else if (t == CUDA_R_16BF) {
        const uint16_t *s = (const uint16_t *)p;
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_double(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)p;
        for (int64_t i = 0; i < n; ++i) out[i] = f16_to_double(s[i]);
    }
}

/* n consecutive elements of type t at p <- in[0..n), one rounding each. */
void store_run(void *p, int t, int64_t n, const double *in) {
    if (t == CUDA_R_32F) {
        float *d = (float *)p;
        for (int64_t i = 0; i < n; ++i) d[i] = (float)in[i];
    } else if (t == CUDA_R_16BF) {
        uint16_t *d = (uint16_t *)p;
        for (int64_t i = 0; i < n; ++i) d[i] = double_to_bf16(in[i]);
    } else {
        uint16_t *d = (uint16_t *)p;
        for (int64_t i = 0; i < n; ++i) d[i] = double_to_f16(in[i]);
    }
}

/* ---- one GEMM, as both APIs describe it ------------------------------------------------------ */

/* A column-major matrix as stored: rows x cols, leading dimension ld (elements). */
struct kd_mat {
    const void *p;
    int t;
    int64_t rows, cols, ld;
};

/* D (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C; C and D are m x n. */
struct kd_gemm {
    const char *api;
    int ta, tb; /* 1: transposed */
    int64_t m, n, k;
    kd_mat a, b, c, d;
    double alpha, beta;
};

const char *mat_name(int i) { return i == 0 ? "A" : i == 1 ? "B" : i == 2 ? "C" : "D"; }

/* Bytes from the pointer to the last element: ((cols-1) ld + rows) elements; false on overflow. */
bool footprint(const kd_mat &x, size_t *bytes) {
    *bytes = 0;
    if (x.rows == 0 || x.cols == 0) return true;
    int64_t span;
    if (__builtin_mul_overflow(x.cols - 1, x.ld, &span) ||
        __builtin_add_overflow(span, x.rows, &span))
        return false;
    return !__builtin_mul_overflow((size_t)span, type_size(x.t), bytes);
}

/* Byte offset of x's column j from p. */
int64_t col_off(const kd_mat &x, int64_t j) { return j * x.ld * (int64_t)type_size(x.t); }

/* floor(a / b) for b > 0. */
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Whether an element of y shares a byte with an element of x (padding between columns excluded):
 * for each column of y, the columns of x that could meet it are found by division. */
bool mats_overlap(const kd_mat &x, const kd_mat &y) {
    size_t bx, by;
    if (!footprint(x, &bx) || !footprint(y, &by) || bx == 0 || by == 0) return false;
    const intptr_t x0 = (intptr_t)x.p, y0 = (intptr_t)y.p;
    if (y0 >= x0 + (intptr_t)bx || x0 >= y0 + (intptr_t)by) return false;
    const int64_t xlen = x.rows * (int64_t)type_size(x.t), ylen = y.rows * (int64_t)type_size(y.t);
    const int64_t stride = x.ld * (int64_t)type_size(x.t);
    for (int64_t j = 0; j < y.cols; ++j) {
        const int64_t s = (int64_t)(y0 - x0) + col_off(y, j); /* y's column j: [s, s + ylen) */
        int64_t lo = floor_div(s - xlen, stride) + 1, hi = floor_div(s + ylen - 1, stride);
        if (lo < 0) lo = 0;
        if (hi > x.cols - 1) hi = x.cols - 1;
        if (lo <= hi) return true;
    }
    return false;
}

/* The operands the GEMM touches: A and B only when there is a product to form, C only when
 * beta != 0 (cuBLAS does not read C then; it may hold NaN or garbage). */
void used_operands(const kd_gemm &g, bool used[4]) {
    const bool out = g.m > 0 && g.n > 0;
    used[0] = used[1] = out && g.k > 0 && g.alpha != 0.0;
    used[2] = out && g.beta != 0.0;
    used[3] = out;
}

/* A device fault the GPU would turn into an error: sticky error + EXECUTION_FAILED. */
cublasStatus_t device_fault() {
    kd_sim_set_error(cudaErrorIllegalAddress);
    return CUBLAS_STATUS_EXECUTION_FAILED;
}

/* memcheck: every used operand's whole footprint inside one live allocation, its pointer aligned
 * to its elements; then no output element shares memory with an input (except C == D). */
cublasStatus_t check_placement(const kd_gemm &g) {
    const kd_mat *x[4] = {&g.a, &g.b, &g.c, &g.d};
    bool used[4];
    used_operands(g, used);
    char who[96];
    for (int i = 0; i < 4; ++i) {
        size_t bytes;
        if (!used[i]) continue;
        snprintf(who, sizeof who, "%s %s", g.api, mat_name(i));
        if (!footprint(*x[i], &bytes)) {
            kd_sim_report("memcheck", "%s: footprint overflows", who);
            return device_fault();
        }
        if (!kd_sim_dev_check(x[i]->p, bytes, who)) return device_fault();
        if ((uintptr_t)x[i]->p % type_size(x[i]->t) != 0) {
            kd_sim_report("memcheck", "%s: %p is misaligned for its %zu-byte elements", who,
                          x[i]->p, type_size(x[i]->t));
            return device_fault();
        }
    }
    for (int i = 0; i < 3; ++i) {
        if (!used[i] || (i == 2 && g.c.p == g.d.p) || !mats_overlap(*x[i], g.d)) continue;
        kd_sim_report("blas", "%s: D overlaps %s (the result would depend on the kernel)", g.api,
                      mat_name(i));
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* initcheck: every element read (A, B, and C when beta != 0), column by column, so the padding
 * between columns need not be written. */
cublasStatus_t check_init(const kd_gemm &g) {
    const kd_mat *x[3] = {&g.a, &g.b, &g.c};
    bool used[4];
    used_operands(g, used);
    char who[96];
    for (int i = 0; i < 3; ++i) {
        if (!used[i]) continue;
        snprintf(who, sizeof who, "%s %s", g.api, mat_name(i));
        const size_t len = (size_t)x[i]->rows * type_size(x[i]->t);
        for (int64_t j = 0; j < x[i]->cols; ++j)
            if (!kd_sim_dev_check_init((const char *)x[i]->p + col_off(*x[i], j), len, who))
                return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the reference product ------------------------------------------------------------------ */

const int64_t KC = 256; /* k block: a 4-column strip of B (8 KiB) stays in L1 */
const int64_t MC = 64;  /* row block: 64 x KC of A (128 KiB) stays in L2 */

/* out: M (R x K) in blocks of 4 rows, each block K x 4 (k-major, row index fastest), rows past
 * R zero. s holds M as R x K (column kk of s = M[:, kk]) when rk, else as K x R (its column r =
 * M[r, :]). col: scratch of max(R, K) doubles. */
void pack(const kd_mat &s, bool rk, int64_t R, int64_t K, double *out, double *col) {
    const int64_t r4 = (R + 3) / 4 * 4;
    memset(out, 0, sizeof(double) * (size_t)(r4 * K));
    if (rk) {
        for (int64_t kk = 0; kk < K; ++kk) {
            load_run((const char *)s.p + col_off(s, kk), s.t, R, col);
            for (int64_t r = 0; r < R; ++r) out[((r >> 2) * K + kk) * 4 + (r & 3)] = col[r];
        }
    } else {
        for (int64_t r = 0; r < R; ++r) {
            load_run((const char *)s.p + col_off(s, r), s.t, K, col);
            double *o = out + (r >> 2) * K * 4 + (r & 3);
            for (int64_t kk = 0; kk < K; ++kk) o[kk * 4] = col[kk];
        }
    }
}

/* Two doubles, lane by lane IEEE arithmetic (GCC / Clang vector extension): the same sums as the
 * scalar code, computed two at a time. */
typedef double v2d __attribute__((vector_size(16)));

/* c (4 x 4, column stride ldc) += a (kc x 4) b (kc x 4)^T: 16 independent sums, each over k in
 * ascending order. */
void micro(const double *a, const double *b, int64_t kc, double *c, int64_t ldc) {
    v2d t[4][2];
    for (int j = 0; j < 4; ++j) {
        memcpy(&t[j][0], c + j * ldc, sizeof(v2d));
        memcpy(&t[j][1], c + j * ldc + 2, sizeof(v2d));
    }
    for (int64_t p = 0; p < kc; ++p, a += 4, b += 4) {
        v2d a0, a1;
        memcpy(&a0, a, sizeof a0);
        memcpy(&a1, a + 2, sizeof a1);
        for (int j = 0; j < 4; ++j) {
            const v2d bj = {b[j], b[j]};
            t[j][0] += a0 * bj;
            t[j][1] += a1 * bj;
        }
    }
    for (int j = 0; j < 4; ++j) {
        memcpy(c + j * ldc, &t[j][0], sizeof(v2d));
        memcpy(c + j * ldc + 2, &t[j][1], sizeof(v2d));
    }
}

/* acc (m4 x n4, column-major, zeroed) = Ap Bp^T; Ap: m4 x K packed, Bp: n4 x K packed. The k
 * blocks run in ascending order, so each sum keeps its order whatever the blocking. */
void multiply(const double *ap, const double *bp, int64_t m4, int64_t n4, int64_t K, double *acc) {
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        for (int64_t i0 = 0; i0 < m4; i0 += MC) {
            const int64_t i1 = m4 - i0 < MC ? m4 : i0 + MC;
            for (int64_t j = 0; j < n4; j += 4)
                for (int64_t i = i0; i < i1; i += 4)
                    micro(ap + ((i >> 2) * K + k0) * 4, bp + ((j >> 2) * K + k0) * 4, kc,
                          acc + i + j * m4, m4);
        }
    }
}

/* D[:, j] = alpha acc[:, j] + beta C[:, j] (C not read when beta == 0), rounded once to D's type;
 * marks D initialised column by column. C's column is read whole before D's is written (C == D). */
void epilogue(const kd_gemm &g, const double *acc, int64_t m4, double *col) {
    const size_t dsz = type_size(g.d.t);
    for (int64_t j = 0; j < g.n; ++j) {
        const double *s = acc + j * m4;
        if (g.beta != 0.0) load_run((const char *)g.c.p + col_off(g.c, j), g.c.t, g.m, col);
        for (int64_t i = 0; i < g.m; ++i) {
            double v = g.alpha * s[i];
            if (g.beta != 0.0) v += g.beta * col[i];
            col[i] = v;
        }
        char *dj = (char *)g.d.p + col_off(g.d, j);
        store_run(dj, g.d.t, g.m, col);
        kd_sim_dev_mark_init(dj, (size_t)g.m * dsz);
    }
}

/* The trace's record of a GEMM: 2 m n k FLOPs; A and B read once, C read when beta != 0, D
 * written (what a tiled GEMM moves at least: the model's floor for its traffic). */
void trace_gemm(const kd_gemm &g) {
    if (!kd_sim_tracing()) return;
    kd_sim_op op;
    memset(&op, 0, sizeof op);
    const double mk = (double)g.m * (double)g.k, kn = (double)g.k * (double)g.n,
                 mn = (double)g.m * (double)g.n;
    op.kind = KD_SIM_OP_GEMM;
    op.name = g.api;
    op.m = g.m, op.n = g.n, op.k = g.k;
    op.elem_bytes = (int)type_size(g.a.t);
    op.flops = 2.0 * mk * (double)g.n;
    op.bytes_read = mk * (double)type_size(g.a.t) + kn * (double)type_size(g.b.t) +
                    (g.beta != 0.0 ? mn * (double)type_size(g.c.t) : 0.0);
    op.bytes_written = mn * (double)type_size(g.d.t);
    kd_sim_trace_add(&op);
}

/* Model mode's counted GEMM: D gets finite, non-uniform values in O(m n): eight column patterns
 * in [-4, 4) from a hash of the row, the other columns copies of them. */
void fill_counted(const kd_gemm &g) {
    const size_t dsz = type_size(g.d.t);
    std::vector<double> col((size_t)g.m);
    for (int64_t j = 0; j < g.n; ++j) {
        char *dj = (char *)g.d.p + col_off(g.d, j);
        if (j >= 8) { /* as fast as memcpy */
            memcpy(dj, (const char *)g.d.p + col_off(g.d, j % 8), (size_t)g.m * dsz);
            continue;
        }
        for (int64_t i = 0; i < g.m; ++i) {
            uint64_t h = ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)j << 40);
            h ^= h >> 29;
            col[(size_t)i] = (double)(h % 8192) / 1024.0 - 4.0;
        }
        store_run(dj, g.d.t, g.m, col.data());
    }
    for (int64_t j = 0; j < g.n; ++j)
        kd_sim_dev_mark_init((char *)g.d.p + col_off(g.d, j), (size_t)g.m * dsz);
}

/* Runs a validated GEMM: checks memory, forms the product, writes D. */
cublasStatus_t run_gemm(const kd_gemm &g) {
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t s = check_placement(g);
    if (s == CUBLAS_STATUS_SUCCESS) s = check_init(g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    trace_gemm(g);
    if (kd_sim_gemm_count_only()) { /* an accumulation in place keeps the values it has */
        if (g.beta == 0.0 || g.c.p != g.d.p) fill_counted(g);
        return CUBLAS_STATUS_SUCCESS;
    }
    const bool product = g.k > 0 && g.alpha != 0.0;
    const int64_t m4 = (g.m + 3) / 4 * 4, n4 = (g.n + 3) / 4 * 4, K = product ? g.k : 0;
    const int64_t ncol = g.m > g.n ? g.m : g.n;
    double *acc = (double *)calloc((size_t)(m4 * n4), sizeof(double));
    double *ap = (double *)malloc(sizeof(double) * (size_t)(m4 * K + 1));
    double *bp = (double *)malloc(sizeof(double) * (size_t)(n4 * K + 1));
    double *col = (double *)malloc(sizeof(double) * (size_t)((ncol > K ? ncol : K) + 1));
    if (acc && ap && bp && col) {
        if (product) {
            pack(g.a, !g.ta, g.m, K, ap, col);     /* op(A) = A: A is stored m x k */
            pack(g.b, g.tb != 0, g.n, K, bp, col); /* op(B)^T = B when transposed: n x k */
            multiply(ap, bp, m4, n4, K, acc);
        }
        epilogue(g, acc, m4, col);
    } else {
        s = CUBLAS_STATUS_ALLOC_FAILED;
    }
    free(acc);
    free(ap);
    free(bp);
    free(col);
    return s;
}

/* ---- cuBLASLt descriptors: attributes by address and size ----------------------------------- */

struct attr_ref {
    void *p;
    size_t size;
};

attr_ref desc_attr(kd_sim_lt_matmul_desc *d, int attr) {
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return {&d->compute, 4};
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return {&d->scale, 4};
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return {&d->pointer_mode, 4};
    case CUBLASLT_MATMUL_DESC_TRANSA: return {&d->transa, 4};
    case CUBLASLT_MATMUL_DESC_TRANSB: return {&d->transb, 4};
    case CUBLASLT_MATMUL_DESC_TRANSC: return {&d->transc, 4};
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return {&d->fill, 4};
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return {&d->epilogue, 4};
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return {&d->bias, sizeof(void *)};
    default: return {nullptr, 0};
    }
}

attr_ref layout_attr(kd_sim_lt_layout *l, int attr) {
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return {&l->type, 4};
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return {&l->order, 4};
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return {&l->rows, 8};
    case CUBLASLT_MATRIX_LAYOUT_COLS: return {&l->cols, 8};
    case CUBLASLT_MATRIX_LAYOUT_LD: return {&l->ld, 8};
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return {&l->batch, 4};
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return {&l->batch_stride, 8};
    default: return {nullptr, 0};
    }
}

attr_ref pref_attr(kd_sim_lt_pref *p, int attr) {
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return {&p->search, 4};
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return {&p->max_ws, 8};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return {&p->align[0], 4};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return {&p->align[1], 4};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return {&p->align[2], 4};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return {&p->align[3], 4};
    default: return {nullptr, 0};
    }
}

/* An attribute the stand-in does not model is NOT_SUPPORTED (never silently dropped); a buffer
 * of the wrong size is INVALID_VALUE, as cuBLASLt documents. */
cublasStatus_t attr_set(attr_ref r, const void *buf, size_t size) {
    if (!r.p) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!buf || size != r.size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(r.p, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

/* size 0: *written = the size needed; else buf must hold exactly the attribute. */
cublasStatus_t attr_get(attr_ref r, void *buf, size_t size, size_t *written) {
    if (!r.p) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (size == 0) {
        if (!written) return CUBLAS_STATUS_INVALID_VALUE;
        *written = r.size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != r.size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, r.p, size);
    if (written) *written = r.size;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt: from descriptors to a GEMM -------------------------------------------------- */

/* Everything of the operation descriptor that the reference does not implement is refused. */
cublasStatus_t lt_check_desc(const kd_sim_lt_matmul_desc *d, const char *api) {
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F ||
        d->pointer_mode != CUBLASLT_POINTER_MODE_HOST || d->transc != CUBLAS_OP_N ||
        d->fill != CUBLAS_FILL_MODE_FULL || d->epilogue != CUBLASLT_EPILOGUE_DEFAULT || d->bias) {
        kd_sim_report("blas",
                      "%s: operation descriptor not served (compute %d, scale %d, pointer "
                      "mode %d, transc %d, fill %d, epilogue %u, bias %p)",
                      api, (int)d->compute, (int)d->scale, (int)d->pointer_mode, (int)d->transc,
                      (int)d->fill, (unsigned)d->epilogue, d->bias);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const int32_t t[2] = {d->transa, d->transb};
    for (int i = 0; i < 2; ++i) {
        if (t[i] == CUBLAS_OP_N || t[i] == CUBLAS_OP_T) continue;
        return t[i] == CUBLAS_OP_C ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* One layout as a matrix: column order, no batch, a type we know, ld >= max(1, rows), rows and
 * cols an int32 can hold (what cuBLASLt serves). */
cublasStatus_t lt_layout_mat(const kd_sim_lt_layout *l, kd_mat *x) {
    if (l->order != CUBLASLT_ORDER_COL || l->batch != 1 || type_size((int)l->type) == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->rows > INT32_MAX || l->cols > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->ld < 1 || l->ld < (int64_t)l->rows) return CUBLAS_STATUS_INVALID_VALUE;
    x->p = nullptr;
    x->t = (int)l->type;
    x->rows = (int64_t)l->rows;
    x->cols = (int64_t)l->cols;
    x->ld = l->ld;
    return CUBLAS_STATUS_SUCCESS;
}

/* Checks that every object is live, then fills g (shapes, types, transposes; no pointers). */
cublasStatus_t lt_plan(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                       cublasLtMatrixLayout_t ld, const char *api, kd_gemm *g) {
    cublasStatus_t s = check_obj(h, "handle", api, CUBLAS_STATUS_NOT_INITIALIZED);
    const void *objs[5] = {op, la, lb, lc, ld};
    const char *names[5] = {"operation descriptor", "A layout", "B layout", "C layout", "D layout"};
    for (int i = 0; i < 5 && s == CUBLAS_STATUS_SUCCESS; ++i)
        s = check_obj(objs[i], names[i], api, CUBLAS_STATUS_INVALID_VALUE);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_check_desc(op, api);
    const kd_sim_lt_layout *ls[4] = {la, lb, lc, ld};
    kd_mat *xs[4] = {&g->a, &g->b, &g->c, &g->d};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i) s = lt_layout_mat(ls[i], xs[i]);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    g->api = api;
    g->ta = op->transa != CUBLAS_OP_N;
    g->tb = op->transb != CUBLAS_OP_N;
    g->m = g->d.rows;
    g->n = g->d.cols;
    g->k = g->ta ? g->a.rows : g->a.cols;
    if (g->a.t != g->b.t || g->c.t != g->d.t || !type_pair_ok(g->a.t, g->d.t))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const int64_t am = g->ta ? g->a.cols : g->a.rows;
    const int64_t bk = g->tb ? g->b.cols : g->b.rows, bn = g->tb ? g->b.rows : g->b.cols;
    if (am != g->m || bk != g->k || bn != g->n || g->c.rows != g->m || g->c.cols != g->n) {
        kd_sim_report("blas",
                      "%s: shapes disagree: op(A) %lld x %lld, op(B) %lld x %lld, C %lld "
                      "x %lld, D %lld x %lld",
                      api, (long long)am, (long long)g->k, (long long)bk, (long long)bn,
                      (long long)g->c.rows, (long long)g->c.cols, (long long)g->m, (long long)g->n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The algorithm value: a tag, the workspace it needs, the alignments it was chosen for. */
const uint64_t ALGO_TAG = 0x6b6473696d4c7431ull; /* "kdsimLt1" */

void algo_make(const kd_sim_lt_pref *p, cublasLtMatmulAlgo_t *a) {
    memset(a, 0, sizeof *a);
    a->data[0] = ALGO_TAG;
    a->data[1] = 0; /* workspace bytes */
    for (int i = 0; i < 4; ++i) a->data[2 + i] = p->align[i];
}

bool pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

const kd_sim_lt_pref DEFAULT_PREF = {0, 0, {256, 256, 256, 256}};

/* Whether the algorithm's promised alignments hold for the four pointers. */
bool algo_alignment_holds(const cublasLtMatmulAlgo_t *a, const void *const ptr[4]) {
    for (int i = 0; i < 4; ++i)
        if (ptr[i] && (a->data[2 + i] == 0 || (uintptr_t)ptr[i] % a->data[2 + i] != 0))
            return false;
    return true;
}

/* The heuristic's verdict for a planned GEMM: 1 result, or 0 when the preference rules it out. */
cublasStatus_t lt_heuristic_count(const kd_gemm &g, const kd_sim_lt_pref *p, int *count) {
    *count = 0;
    const size_t es[4] = {type_size(g.a.t), type_size(g.b.t), type_size(g.c.t), type_size(g.d.t)};
    for (int i = 0; i < 4; ++i) {
        if (!pow2(p->align[i])) return CUBLAS_STATUS_INVALID_VALUE;
        if (p->align[i] < es[i]) return CUBLAS_STATUS_SUCCESS; /* no kernel reads that */
    }
    const uint64_t need_ws = 0; /* the reference needs no workspace */
    if (no_heuristic() || need_ws > p->max_ws) return CUBLAS_STATUS_SUCCESS;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* cublasLtMatmul after planning: scalars, algorithm, workspace, alignment, then the GEMM. */
cublasStatus_t lt_execute(kd_gemm *g, const void *alpha, const void *beta,
                          const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes) {
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    g->alpha = *(const float *)alpha; /* pointer mode host, scale type fp32 */
    g->beta = *(const float *)beta;
    cublasLtMatmulAlgo_t dflt;
    if (!algo) { /* cuBLASLt runs its heuristic with the default preference */
        algo_make(&DEFAULT_PREF, &dflt);
        algo = &dflt;
    }
    if (algo->data[0] != ALGO_TAG) {
        kd_sim_report("blas", "%s: the algorithm was not made by the heuristic", g->api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (ws_bytes < algo->data[1]) return CUBLAS_STATUS_INVALID_VALUE;
    if (ws && ws_bytes > 0 && !kd_sim_dev_check(ws, ws_bytes, "cublasLtMatmul workspace"))
        return device_fault();
    const void *ptr[4] = {g->a.p, g->b.p, g->c.p, g->d.p};
    if (!algo_alignment_holds(algo, ptr)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (g->c.p == g->d.p && g->c.ld != g->d.ld) return CUBLAS_STATUS_INVALID_VALUE;
    if (!g->c.p && g->beta != 0.0) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = run_gemm(*g);
    if (s == CUBLAS_STATUS_SUCCESS) g_lt_count.fetch_add(1);
    return s;
}

/* ---- classic cuBLAS -------------------------------------------------------------------------- */

/* Argument checks of cublasGemmEx in the order cuBLAS documents them. */
cublasStatus_t gemm_ex_args(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc,
                            const void *alpha, const void *beta, int at, int bt, int ct,
                            int compute, int algo) {
    const int ops_ok =
        (ta >= CUBLAS_OP_N && ta <= CUBLAS_OP_C) && (tb >= CUBLAS_OP_N && tb <= CUBLAS_OP_C);
    if (!ops_ok || m < 0 || n < 0 || k < 0 || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    const int ar = ta == CUBLAS_OP_N ? m : k, br = tb == CUBLAS_OP_N ? k : n;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (at != bt || !type_pair_ok(at, ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

} /* namespace */

/* ==== the C API ================================================================================
 */

extern "C" {

KD_SIM_API void kd_sim_set_no_lt_heuristic(int on) {
    (void)no_heuristic(); /* the environment is read once; the call overrides it from now on */
    g_no_heur.store(on ? 1 : 0);
}

KD_SIM_API void kd_sim_gemm_counts(long *lt, long *gemm_ex) {
    if (lt) *lt = g_lt_count.load();
    if (gemm_ex) *gemm_ex = g_ex_count.load();
}

KD_SIM_API cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    return create_obj(handle, kd_sim_cublas_context{nullptr, nullptr, 0});
}

KD_SIM_API cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    return destroy_obj(handle, "cublasDestroy", CUBLAS_STATUS_NOT_INITIALIZED);
}

KD_SIM_API cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    cublasStatus_t s =
        check_obj(handle, "handle", "cublasSetStream", CUBLAS_STATUS_NOT_INITIALIZED);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    handle->stream = stream;
    handle->ws = nullptr; /* cuBLAS: unconditionally back to the default workspace pool */
    handle->ws_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

KD_SIM_API cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
    cublasStatus_t s =
        check_obj(handle, "handle", "cublasGetStream", CUBLAS_STATUS_NOT_INITIALIZED);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* workspace: device memory of workspaceSizeInBytes, 256-byte aligned (cuBLAS: else
 * INVALID_VALUE); NULL with size 0 returns to the library's own pool. */
KD_SIM_API cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace,
                                             size_t workspaceSizeInBytes) {
    cublasStatus_t s =
        check_obj(handle, "handle", "cublasSetWorkspace", CUBLAS_STATUS_NOT_INITIALIZED);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!workspace && workspaceSizeInBytes > 0) return CUBLAS_STATUS_INVALID_VALUE;
    if ((uintptr_t)workspace % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (workspace && !kd_sim_dev_check(workspace, workspaceSizeInBytes, "cublasSetWorkspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->ws = workspace;
    handle->ws_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

/* C (m x n, ldc) = alpha op(A) op(B) + beta C. Shapes: A stored (transa N ? m x k : k x m),
 * B stored (transb N ? k x n : n x k), all column-major. */
KD_SIM_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                       cublasOperation_t transb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType_t Atype,
                                       int lda, const void *B, cudaDataType_t Btype, int ldb,
                                       const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                                       cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    const char *api = "cublasGemmEx";
    cublasStatus_t s = check_obj(handle, "handle", api, CUBLAS_STATUS_NOT_INITIALIZED);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = gemm_ex_args(transa, transb, m, n, k, lda, ldb, ldc, alpha, beta, Atype, Btype, Ctype,
                         computeType, algo);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    /* a real cuBLAS may write its whole workspace: it must still be live */
    if (handle->ws && !kd_sim_dev_check(handle->ws, handle->ws_bytes, "cublasGemmEx workspace"))
        return device_fault();
    kd_gemm g;
    g.api = api;
    g.ta = transa != CUBLAS_OP_N; /* OP_C on real data is OP_T */
    g.tb = transb != CUBLAS_OP_N;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = {A, Atype, g.ta ? k : m, g.ta ? m : k, lda};
    g.b = {B, Btype, g.tb ? n : k, g.tb ? k : n, ldb};
    g.c = {C, Ctype, m, n, ldc};
    g.d = g.c;
    g.alpha = *(const float *)alpha;
    g.beta = *(const float *)beta;
    s = run_gemm(g);
    if (s == CUBLAS_STATUS_SUCCESS) g_ex_count.fetch_add(1);
    return s;
}

KD_SIM_API const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

KD_SIM_API const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the feature required is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "a license error";
    }
    return "unknown status";
}

/* ---- cuBLASLt ---------------------------------------------------------------------------------
 */

KD_SIM_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    return create_obj(lightHandle, kd_sim_lt_context{0});
}

KD_SIM_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    return destroy_obj(lightHandle, "cublasLtDestroy", CUBLAS_STATUS_NOT_INITIALIZED);
}

KD_SIM_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                   cublasComputeType_t computeType,
                                                   cudaDataType_t scaleType) {
    const kd_sim_lt_matmul_desc init = {(int32_t)computeType,
                                        (int32_t)scaleType,
                                        CUBLASLT_POINTER_MODE_HOST,
                                        CUBLAS_OP_N,
                                        CUBLAS_OP_N,
                                        CUBLAS_OP_N,
                                        CUBLAS_FILL_MODE_FULL,
                                        CUBLASLT_EPILOGUE_DEFAULT,
                                        nullptr};
    return create_obj(matmulDesc, init);
}

KD_SIM_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    return destroy_obj(matmulDesc, "cublasLtMatmulDescDestroy", CUBLAS_STATUS_SUCCESS);
}

KD_SIM_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t sizeInBytes) {
    cublasStatus_t s = check_obj(matmulDesc, "operation descriptor",
                                 "cublasLtMatmulDescSetAttribute", CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS ? s : attr_set(desc_attr(matmulDesc, attr), buf, sizeInBytes);
}

KD_SIM_API cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         void *buf, size_t sizeInBytes,
                                                         size_t *sizeWritten) {
    cublasStatus_t s = check_obj(matmulDesc, "operation descriptor",
                                 "cublasLtMatmulDescGetAttribute", CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS
               ? s
               : attr_get(desc_attr(matmulDesc, attr), buf, sizeInBytes, sizeWritten);
}

/* rows x cols, column-major, leading dimension ld (checked when the layout is used). */
KD_SIM_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                     cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
    const kd_sim_lt_layout init = {(uint32_t)type, CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0};
    return create_obj(matLayout, init);
}

KD_SIM_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    return destroy_obj(matLayout, "cublasLtMatrixLayoutDestroy", CUBLAS_STATUS_SUCCESS);
}

KD_SIM_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                           cublasLtMatrixLayoutAttribute_t attr,
                                                           const void *buf, size_t sizeInBytes) {
    cublasStatus_t s = check_obj(matLayout, "layout", "cublasLtMatrixLayoutSetAttribute",
                                 CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS ? s
                                      : attr_set(layout_attr(matLayout, attr), buf, sizeInBytes);
}

KD_SIM_API cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                           cublasLtMatrixLayoutAttribute_t attr,
                                                           void *buf, size_t sizeInBytes,
                                                           size_t *sizeWritten) {
    cublasStatus_t s = check_obj(matLayout, "layout", "cublasLtMatrixLayoutGetAttribute",
                                 CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS
               ? s
               : attr_get(layout_attr(matLayout, attr), buf, sizeInBytes, sizeWritten);
}

KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    return create_obj(pref, DEFAULT_PREF);
}

KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return destroy_obj(pref, "cublasLtMatmulPreferenceDestroy", CUBLAS_STATUS_SUCCESS);
}

KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t sizeInBytes) {
    cublasStatus_t s = check_obj(pref, "preference", "cublasLtMatmulPreferenceSetAttribute",
                                 CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS ? s : attr_set(pref_attr(pref, attr), buf, sizeInBytes);
}

KD_SIM_API cublasStatus_t cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void *buf,
    size_t sizeInBytes, size_t *sizeWritten) {
    cublasStatus_t s = check_obj(pref, "preference", "cublasLtMatmulPreferenceGetAttribute",
                                 CUBLAS_STATUS_INVALID_VALUE);
    return s != CUBLAS_STATUS_SUCCESS
               ? s
               : attr_get(pref_attr(pref, attr), buf, sizeInBytes, sizeWritten);
}

KD_SIM_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount) {
    const char *api = "cublasLtMatmulAlgoGetHeuristic";
    kd_gemm g;
    cublasStatus_t s = lt_plan(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, api, &g);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = check_obj(preference, "preference", api, CUBLAS_STATUS_INVALID_VALUE);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    int count = 0;
    s = lt_heuristic_count(g, preference, &count);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (count > 0) {
        cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
        memset(r, 0, sizeof *r);
        algo_make(preference, &r->algo);
        r->workspaceSize = (size_t)r->algo.data[1];
        r->state = CUBLAS_STATUS_SUCCESS;
        r->wavesCount = 1.0f;
    }
    *returnAlgoCount = count;
    return CUBLAS_STATUS_SUCCESS;
}

KD_SIM_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle,
                                         cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                         cublasLtMatrixLayout_t Bdesc, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                         cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace,
                                         size_t workspaceSizeInBytes, cudaStream_t stream) {
    (void)stream; /* the simulator runs the GEMM now, which is in stream order */
    kd_gemm g;
    cublasStatus_t s =
        lt_plan(lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, "cublasLtMatmul", &g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    g.a.p = A;
    g.b.p = B;
    g.c.p = C;
    g.d.p = D;
    return lt_execute(&g, alpha, beta, algo, workspace, workspaceSizeInBytes);
}

} /* extern "C" */
