/* GPU timing driver for bench/gpu_check.sh. Times, with CUDA events and an L2 flush before every
 * repeat (median, p20, p80 of the repeats, after warm-up):
 *   1. kdloss_cuda_kl_div, BT 16384, V 4096, fp32, batchmean, loss + gradient
 *   2. kdloss_cuda_fused_linear_jsd, BT 8192, Hs 2048, Ht 4096, V 128256, bf16 (the seed shape:
 *      rand inputs, nn.Linear-style weights, no bias, labels in [0, V), beta 0.5, T 1,
 *      weights 0.5/0.5), loss + dxs + dws, at several memory budgets
 *   3. the four bare GEMMs of that workload at full size (zs, zt, dxs, dws), cuBLAS, bf16 in,
 *      fp32 accumulation: the floor the fused loss is compared with
 *   4. the sparse top-k teacher at BENCHMARKS.md's top-k shape (BT 2048, H 1024, V 32768, K 64, fp32):
 *      kdloss_cuda_fused_linear_topk_distill forward KL bucket (loss + dxs + dws; its three bare
 *      fp32 GEMMs as the floor), renorm_both on the sparse path, the same on the dense path (a
 *      row_lse output forces it; the two must agree), and kdloss_cuda_topk_distill_logits on
 *      2048 x 32768 fp32 logits
 *   5. kdloss_cuda_distill_logits on 2048 x 32768 fp32 student and teacher logits, T 2, loss +
 *      gradient, forward KL and JSD; and forward KL at the KL seed shape 16384 x 4096, T 1 (KL
 *      from logits on both sides: what torch_bench.py times as "from logits")
 * and the device memory each workload holds (inputs + outputs + workspace, counted at cudaMalloc).
 * Usage: gpu_bench [summary.json]. Exit code 0 only if every call succeeded and every loss is
 * finite. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss.h"

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__,       \
                    __LINE__);                                                                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define KS(x)                                                                                 \
    do {                                                                                      \
        kdloss_status s_ = (x);                                                               \
        if (s_ != KDLOSS_OK) {                                                                \
            fprintf(stderr, "kdloss error %s at %s:%d\n", kdloss_status_string(s_), __FILE__,   \
                    __LINE__);                                                                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define BK(x)                                                                                 \
    do {                                                                                      \
        cublasStatus_t s_ = (x);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);        \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static cudaStream_t g_st;
static size_t g_live, g_peak; /* bytes held through dmalloc */

static void *dmalloc(size_t n) {
    void *p;
    CK(cudaMalloc(&p, n));
    g_live += n;
    if (g_live > g_peak) g_peak = g_live;
    return p;
}
static void dfree(void *p, size_t n) {
    CK(cudaFree(p));
    g_live -= n;
}

/* ---- deterministic device-side data ---- */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float u01(uint64_t seed, int64_t i) {
    return (float)((mix64(seed ^ (uint64_t)i * 0xd1b54a32d192ed03ull) >> 40) + 0.5) * (1.0f / 16777216.0f);
}
__global__ void fill_normal_f32(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = sqrtf(-2.0f * logf(u01(seed, 2 * i))) * cospif(2.0f * u01(seed, 2 * i + 1));
}
__global__ void fill_uniform_bf16(uint16_t *p, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = lo + (hi - lo) * u01(seed, i);
        uint32_t u = __float_as_uint(x);
        u += 0x7fffu + ((u >> 16) & 1u);
        p[i] = (uint16_t)(u >> 16);
    }
}
__global__ void fill_labels(int64_t *p, int64_t n, int64_t v, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = (int64_t)(mix64(seed + (uint64_t)i) % (uint64_t)v);
}
/* one block per row, in place: log_softmax (to_prob = 0) or softmax (to_prob = 1) */
__global__ void row_softmax(float *x, int64_t v, int to_prob) {
    __shared__ float red[32];
    float *r = x + blockIdx.x * v;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) m = fmaxf(m, r[c]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) s += expf(r[c] - m);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
    const float lse = m + logf(s);
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) r[c] = to_prob ? expf(r[c] - lse) : r[c] - lse;
}

__global__ void fill_uniform_f32(float *p, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = lo + (hi - lo) * u01(seed, i);
}
/* ids of row r: (r 7919 + j 509) mod v, distinct within a row for a power-of-two v; each slot
 * log(0.9 / k): the teacher's top k hold 90% of its mass */
__global__ void fill_topk(int64_t *ids, float *lp, int64_t bt, int64_t k, int64_t v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bt * k; i += (int64_t)gridDim.x * blockDim.x) {
        ids[i] = ((i / k) * 7919 + (i % k) * 509) % v;
        lp[i] = logf(0.9f / (float)k);
    }
}

static unsigned grid_for(int64_t n) { int64_t b = (n + 255) / 256; return (unsigned)(b > 65535 * 4 ? 65535 * 4 : b); }

/* ---- timing ---- */
static void *g_flush;
static size_t g_flush_bytes;

typedef void (*op_fn)(void *);
typedef struct timing {
    double med, p20, p80;
} timing;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double quant(const double *s, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)pos;
    double f = pos - i;
    return i + 1 < n ? s[i] * (1 - f) + s[i + 1] * f : s[n - 1];
}

static timing time_op(op_fn fn, void *arg, int warm, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < warm; i++) fn(arg);
    CK(cudaStreamSynchronize(g_st));
    double *ms = (double *)malloc(sizeof(double) * reps);
    for (int i = 0; i < reps; i++) {
        /* evict the previous repeat's data from L2 (60 MB on an H200) */
        CK(cudaMemsetAsync(g_flush, i & 0xff, g_flush_bytes, g_st));
        CK(cudaEventRecord(e0, g_st));
        fn(arg);
        CK(cudaEventRecord(e1, g_st));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms[i] = t;
    }
    qsort(ms, reps, sizeof(double), cmp_d);
    timing r = {quant(ms, reps, 0.5), quant(ms, reps, 0.2), quant(ms, reps, 0.8)};
    free(ms);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return r;
}

/* ---- workload 1: KL ---- */
typedef struct kl_w {
    kdloss_cuda_context *ctx;
    int64_t bt, v;
    float *y, *t, *g, *loss;
    void *ws;
    size_t wsb;
} kl_w;

static void kl_op(void *p) {
    kl_w *w = (kl_w *)p;
    kdloss_kl_params prm;
    prm.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    prm.log_target = 0;
    prm.eps = 1e-10;
    prm.grad_scale = 1.0;
    kdloss_cmat in = {w->y, KDLOSS_F32, 0}, tg = {w->t, KDLOSS_F32, 0};
    kdloss_mat el = {NULL, KDLOSS_F32, 0}, gr = {w->g, KDLOSS_F32, 0};
    KS(kdloss_cuda_kl_div(w->ctx, g_st, &prm, w->bt, w->v, in, tg, w->loss, NULL, el, gr, w->ws, w->wsb));
}

/* ---- workload 2: fused-linear JSD ---- */
typedef struct fl_w {
    kdloss_cuda_context *ctx;
    int64_t bt, hs, ht, v;
    void *xs, *ws, *xt, *wt, *dxs, *dws;
    int64_t *lab;
    float *loss;
    void *wk;
    size_t wkb;
    size_t budget;
} fl_w;

static kdloss_fljsd_params fl_params(size_t budget) {
    kdloss_fljsd_params p;
    p.beta = 0.5;
    p.temperature = 1.0;
    p.weight_hard_loss = 0.5;
    p.weight_soft_loss = 0.5;
    p.ignore_index = -100;
    p.chunk_size = 0;
    p.memory_budget = budget;
    p.grad_scale = 1.0;
    return p;
}

static void fl_op(void *arg) {
    fl_w *w = (fl_w *)arg;
    kdloss_fljsd_params p = fl_params(w->budget);
    kdloss_fljsd_out o;
    memset(&o, 0, sizeof o);
    o.loss = w->loss;
    o.dxs.data = w->dxs;
    o.dxs.dtype = KDLOSS_BF16;
    o.dws.data = w->dws;
    o.dws.dtype = KDLOSS_BF16;
    kdloss_cmat xs = {w->xs, KDLOSS_BF16, 0}, ws = {w->ws, KDLOSS_BF16, 0};
    kdloss_cmat xt = {w->xt, KDLOSS_BF16, 0}, wt = {w->wt, KDLOSS_BF16, 0};
    kdloss_labels L = {w->lab, KDLOSS_I64};
    KS(kdloss_cuda_fused_linear_jsd(w->ctx, g_st, &p, w->bt, w->hs, w->ht, w->v, xs, ws, NULL, xt,
                                    wt, NULL, L, &o, w->wk, w->wkb));
}

/* ---- workload 3: the four bare GEMMs (row-major shapes as in fld.cu) ---- */
typedef struct gemm_w {
    cublasHandle_t h;
    int which; /* 0 zs, 1 zt, 2 dxs, 3 dws, 4 all four */
    fl_w *f;
    float *z;   /* (bt x v) fp32 logits */
    void *dz;   /* (bt x v) bf16 logit gradient */
    float *dw;  /* (v x hs) fp32 */
} gemm_w;

static void gemm_one(gemm_w *g, int which) {
    const float one = 1.0f, zero = 0.0f;
    fl_w *f = g->f;
    int bt = (int)f->bt, hs = (int)f->hs, ht = (int)f->ht, v = (int)f->v;
    switch (which) {
    case 0: /* zs^T (v x bt) = ws^T xs^T */
        BK(cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, v, bt, hs, &one, f->ws, CUDA_R_16BF, hs,
                        f->xs, CUDA_R_16BF, hs, &zero, g->z, CUDA_R_32F, v, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        break;
    case 1:
        BK(cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, v, bt, ht, &one, f->wt, CUDA_R_16BF, ht,
                        f->xt, CUDA_R_16BF, ht, &zero, g->z, CUDA_R_32F, v, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        break;
    case 2: /* dxs^T (hs x bt) = ws^T(col) dz^T */
        BK(cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, hs, bt, v, &one, f->ws, CUDA_R_16BF, hs,
                        g->dz, CUDA_R_16BF, v, &zero, f->dxs, CUDA_R_16BF, hs, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        break;
    default: /* dws^T (hs x v) = xs^T(col) dz */
        BK(cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_T, hs, v, bt, &one, f->xs, CUDA_R_16BF, hs,
                        g->dz, CUDA_R_16BF, v, &zero, g->dw, CUDA_R_32F, hs, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        break;
    }
}

static void gemm_op(void *arg) {
    gemm_w *g = (gemm_w *)arg;
    if (g->which < 4) gemm_one(g, g->which);
    else
        for (int i = 0; i < 4; i++) gemm_one(g, i);
}

/* ---- workload 4: the sparse top-k teacher ---- */
typedef struct tk_w {
    kdloss_cuda_context *ctx;
    int64_t bt, hs, v, k;
    float *xs, *ws, *dxs, *dws, *lp, *loss, *lse, *z, *g;
    int64_t *ids;
    void *wk;
    size_t wkb;
    kdloss_topk_tail tail;
    int row_lse; /* ask row_lse: renorm_both then runs the dense path */
} tk_w;

static kdloss_fused_linear_topk_distill_params tk_params(kdloss_topk_tail tail) {
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params_default(&p); /* forward KL, T 1, w_soft 1 */
    p.tail = tail;
    return p;
}

static void tk_op(void *arg) {
    tk_w *w = (tk_w *)arg;
    kdloss_fused_linear_topk_distill_params p = tk_params(w->tail);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = w->loss;
    o.dxs = (kdloss_mat){w->dxs, KDLOSS_F32, 0};
    o.dws = (kdloss_mat){w->dws, KDLOSS_F32, 0};
    o.row_lse = w->row_lse ? w->lse : NULL;
    kdloss_cmat xs = {w->xs, KDLOSS_F32, 0}, ws = {w->ws, KDLOSS_F32, 0};
    kdloss_topk_teacher t = {w->k, {w->ids, KDLOSS_I64, 0}, {w->lp, KDLOSS_F32, 0}};
    kdloss_labels L = {NULL, KDLOSS_I64};
    KS(kdloss_cuda_fused_linear_topk_distill(w->ctx, g_st, &p, w->bt, w->hs, w->v, xs, ws, NULL,
                                             t, L, &o, w->wk, w->wkb));
}

static void tk_logits_op(void *arg) {
    tk_w *w = (tk_w *)arg;
    kdloss_topk_distill_params p;
    kdloss_topk_distill_params_default(&p);
    kdloss_cmat z = {w->z, KDLOSS_F32, 0};
    kdloss_topk_teacher t = {w->k, {w->ids, KDLOSS_I64, 0}, {w->lp, KDLOSS_F32, 0}};
    kdloss_labels L = {NULL, KDLOSS_I64};
    kdloss_mat g = {w->g, KDLOSS_F32, 0};
    KS(kdloss_cuda_topk_distill_logits(w->ctx, g_st, &p, w->bt, w->v, z, t, L, w->loss, NULL, g,
                                       w->wk, w->wkb));
}

/* ||a - b|| / ||b|| over n device floats (copied to the host). */
static double rel_diff(const float *a, const float *b, size_t n) {
    float *ha = (float *)malloc(n * 4), *hb = (float *)malloc(n * 4);
    CK(cudaMemcpy(ha, a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, n * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)ha[i] - hb[i];
        num += d * d;
        den += (double)hb[i] * hb[i];
    }
    free(ha);
    free(hb);
    return sqrt(num / (den > 0 ? den : 1));
}

/* One result: a line on stdout and an entry of the JSON summary. */
static FILE *g_js;
static int g_first_row = 1;
static void row_out(const char *name, timing tm, size_t mem, const char *extra) {
    printf("%-44s %9.3f ms  [p20 %.3f, p80 %.3f]  mem %7.0f MB  %s\n", name, tm.med, tm.p20,
           tm.p80, (double)mem / 1e6, extra);
    if (g_js)
        fprintf(g_js, "%s    {\"name\": \"%s\", \"ms\": %.4f, \"p20\": %.4f, \"p80\": %.4f, "
                      "\"mem_mb\": %.1f}",
                g_first_row ? "" : ",\n", name, tm.med, tm.p20, tm.p80, (double)mem / 1e6);
    g_first_row = 0;
}

/* The last call's status word is 0 and its loss finite. */
static int tk_sane(const tk_w *w, const char *what) {
    float loss;
    int32_t st;
    CK(cudaMemcpy(&loss, w->loss, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&st, w->wk, 4, cudaMemcpyDeviceToHost));
    if (isfinite(loss) && st == 0) return 1;
    printf("%s: loss %g, status word %d\n", what, loss, (int)st);
    return 0;
}

/* Times one fused top-k configuration with a workspace of its own size. */
static timing tk_time(tk_w *w, const char *name, int *ok) {
    kdloss_fused_linear_topk_distill_params p = tk_params(w->tail);
    KS(kdloss_cuda_fused_linear_topk_distill_workspace_size(&p, w->bt, w->hs, w->v, w->k,
                                                           KDLOSS_F32, 1, &w->wkb));
    w->wk = dmalloc(w->wkb);
    timing t = time_op(tk_op, w, 2, 10);
    *ok &= tk_sane(w, name);
    const double gemm_flop = 3.0 * 2.0 * w->bt * w->v * w->hs;
    char extra[160];
    snprintf(extra, sizeof extra, "workspace %.0f MB, %.1f TFLOP/s of the 3 dense GEMMs",
             w->wkb / 1e6, gemm_flop / (t.med * 1e-3) / 1e12);
    row_out(name, t, g_peak, extra);
    dfree(w->wk, w->wkb);
    return t;
}

/* renorm_both on its sparse path against the dense path (row_lse asked): the same loss, dxs and
 * dws up to summation order. */
static void tk_sparse_vs_dense(tk_w *w, int *ok) {
    const size_t bx = (size_t)(w->bt * w->hs) * 4, bw = (size_t)(w->v * w->hs) * 4;
    float *dx2 = (float *)dmalloc(bx), *dw2 = (float *)dmalloc(bw), l1, l2;
    w->tail = KDLOSS_TAIL_RENORM_BOTH;
    w->row_lse = 0;
    tk_time(w, "kdloss fused topk renorm_both sparse", ok);
    CK(cudaMemcpy(&l1, w->loss, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dx2, w->dxs, bx, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(dw2, w->dws, bw, cudaMemcpyDeviceToDevice));
    w->row_lse = 1;
    tk_time(w, "kdloss fused topk renorm_both dense", ok);
    CK(cudaMemcpy(&l2, w->loss, 4, cudaMemcpyDeviceToHost));
    const double ex = rel_diff(dx2, w->dxs, bx / 4), ew = rel_diff(dw2, w->dws, bw / 4);
    const double el = fabs((double)l1 - l2) / fabs((double)l2);
    const int agree = el < 1e-5 && ex < 1e-4 && ew < 1e-4;
    printf("renorm_both sparse vs dense: loss %.3g, dxs %.3g, dws %.3g (relative): %s\n", el, ex,
           ew, agree ? "agree" : "DIFFER");
    *ok &= agree;
    w->row_lse = 0;
    dfree(dx2, bx);
    dfree(dw2, bw);
}

/* kdloss_cuda_topk_distill_logits on (bt x v) fp32 logits, loss + gradient. */
static void tk_time_logits(tk_w *w, int *ok) {
    const size_t bz = (size_t)(w->bt * w->v) * 4;
    w->z = (float *)dmalloc(bz);
    w->g = (float *)dmalloc(bz);
    fill_normal_f32<<<grid_for(bz / 4), 256, 0, g_st>>>(w->z, bz / 4, 21);
    CK(cudaGetLastError());
    KS(kdloss_cuda_topk_distill_logits_workspace_size(w->bt, w->v, w->k, &w->wkb));
    w->wk = dmalloc(w->wkb);
    timing t = time_op(tk_logits_op, w, 3, 20);
    *ok &= tk_sane(w, "topk logits");
    char extra[96];
    snprintf(extra, sizeof extra, "%.0f GB/s effective (%.0f MB read + written)",
             2.0 * bz / (t.med * 1e6), 2.0 * bz / 1e6);
    row_out("kdloss topk_distill_logits 2048x32768 fp32", t, g_peak, extra);
    dfree(w->wk, w->wkb);
    dfree(w->z, bz);
    dfree(w->g, bz);
}

/* The three fp32 GEMMs of the dense path at full size (cuBLAS, no TF32): its floor. */
static void tk_gemm_floor(tk_w *w) {
    cublasHandle_t h;
    BK(cublasCreate(&h));
    BK(cublasSetStream(h, g_st));
    const size_t bz = (size_t)(w->bt * w->v) * 4;
    w->z = (float *)dmalloc(bz);
    CK(cudaMemsetAsync(w->z, 0, bz, g_st));
    const int bt = (int)w->bt, hs = (int)w->hs, v = (int)w->v;
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double ms[5];
    for (int i = 0; i < 6; i++) {
        CK(cudaEventRecord(e0, g_st));
        BK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, v, bt, hs, &one, w->ws, CUDA_R_32F, hs, w->xs,
                        CUDA_R_32F, hs, &zero, w->z, CUDA_R_32F, v, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        BK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, bt, v, &one, w->ws, CUDA_R_32F, hs, w->z,
                        CUDA_R_32F, v, &zero, w->dxs, CUDA_R_32F, hs, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        BK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, hs, v, bt, &one, w->xs, CUDA_R_32F, hs, w->z,
                        CUDA_R_32F, v, &zero, w->dws, CUDA_R_32F, hs, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        CK(cudaEventRecord(e1, g_st));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i) ms[i - 1] = t; /* the first is warm-up */
    }
    qsort(ms, 5, sizeof(double), cmp_d);
    timing tm = {ms[2], ms[1], ms[3]};
    char extra[64];
    snprintf(extra, sizeof extra, "%.1f TFLOP/s", 6.0 * bt * (double)v * hs / (tm.med * 1e-3) / 1e12);
    row_out("bare fp32 GEMMs zs, dxs, dws (topk shape)", tm, g_peak, extra);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    BK(cublasDestroy(h));
    dfree(w->z, bz);
}

/* The top-k bench shape (BENCHMARKS.md): BT 2048, H 1024, V 32768, K 64, fp32. Returns 0 on a
 * failure. */
static int bench_topk(kdloss_cuda_context *ctx) {
    tk_w w;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    w.bt = 2048, w.hs = 1024, w.v = 32768, w.k = 64;
    const size_t bx = (size_t)(w.bt * w.hs) * 4, bw = (size_t)(w.v * w.hs) * 4;
    const size_t nk = (size_t)(w.bt * w.k);
    g_peak = g_live;
    w.xs = (float *)dmalloc(bx);
    w.ws = (float *)dmalloc(bw);
    w.dxs = (float *)dmalloc(bx);
    w.dws = (float *)dmalloc(bw);
    w.ids = (int64_t *)dmalloc(nk * 8);
    w.lp = (float *)dmalloc(nk * 4);
    w.loss = (float *)dmalloc(4);
    w.lse = (float *)dmalloc((size_t)w.bt * 4);
    const float a = 1.0f / sqrtf((float)w.hs); /* nn.Linear's init */
    fill_normal_f32<<<grid_for(bx / 4), 256, 0, g_st>>>(w.xs, bx / 4, 31);
    fill_uniform_f32<<<grid_for(bw / 4), 256, 0, g_st>>>(w.ws, bw / 4, -a, a, 32);
    fill_topk<<<grid_for(nk), 256, 0, g_st>>>(w.ids, w.lp, w.bt, w.k, w.v);
    CK(cudaGetLastError());
    int ok = 1;
    w.tail = KDLOSS_TAIL_BUCKET;
    tk_time(&w, "kdloss fused topk fwd_kl bucket fp32", &ok);
    tk_sparse_vs_dense(&w, &ok);
    tk_gemm_floor(&w);
    tk_time_logits(&w, &ok);
    dfree(w.xs, bx);
    dfree(w.ws, bw);
    dfree(w.dxs, bx);
    dfree(w.dws, bw);
    dfree(w.ids, nk * 8);
    dfree(w.lp, nk * 4);
    dfree(w.loss, 4);
    dfree(w.lse, (size_t)w.bt * 4);
    return ok;
}

/* ---- workload 5: the divergence family on dense logits ---- */
typedef struct dl_w {
    kdloss_cuda_context *ctx;
    int64_t bt, v;
    kdloss_divergence div;
    double temp;
    float *zs, *zt, *g, *loss;
    void *wk;
    size_t wkb;
} dl_w;

static void dl_op(void *arg) {
    dl_w *w = (dl_w *)arg;
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div.divergence = w->div;
    p.temperature = w->temp;
    kdloss_cmat zs = {w->zs, KDLOSS_F32, 0}, zt = {w->zt, KDLOSS_F32, 0};
    kdloss_labels L = {NULL, KDLOSS_I64};
    kdloss_mat g = {w->g, KDLOSS_F32, 0};
    KS(kdloss_cuda_distill_logits(w->ctx, g_st, &p, w->bt, w->v, zs, zt, L, w->loss, NULL, g,
                                  w->wk, w->wkb));
}

/* kdloss_cuda_distill_logits on (bt x v) fp32 logits, temperature T, loss + gradient, forward KL
 * (and JSD when ndiv is 2): three passes over both rows (the second and third from L2 when a row
 * fits), one write. */
static int bench_distill_logits(kdloss_cuda_context *ctx, int64_t bt, int64_t v, double temp,
                                int ndiv) {
    dl_w w;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    w.bt = bt, w.v = v, w.temp = temp;
    const size_t bz = (size_t)(w.bt * w.v) * 4;
    g_peak = g_live;
    w.zs = (float *)dmalloc(bz);
    w.zt = (float *)dmalloc(bz);
    w.g = (float *)dmalloc(bz);
    w.loss = (float *)dmalloc(4);
    fill_normal_f32<<<grid_for(bz / 4), 256, 0, g_st>>>(w.zs, bz / 4, 41);
    fill_normal_f32<<<grid_for(bz / 4), 256, 0, g_st>>>(w.zt, bz / 4, 42);
    CK(cudaGetLastError());
    KS(kdloss_cuda_distill_logits_workspace_size(w.bt, w.v, &w.wkb));
    w.wk = dmalloc(w.wkb);
    int ok = 1;
    const kdloss_divergence divs[] = {KDLOSS_DIV_FORWARD_KL, KDLOSS_DIV_JSD};
    for (int i = 0; i < ndiv; i++) {
        w.div = divs[i];
        timing t = time_op(dl_op, &w, 3, 20);
        float loss;
        int32_t st;
        CK(cudaMemcpy(&loss, w.loss, 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&st, w.wk, 4, cudaMemcpyDeviceToHost));
        if (!isfinite(loss) || st != 0) {
            printf("distill_logits %s: loss %g, status word %d\n", kdloss_divergence_name(w.div),
                   loss, (int)st);
            ok = 0;
        }
        char name[96], extra[128];
        snprintf(name, sizeof name, "kdloss distill_logits %s %lldx%lld fp32 T%g",
                 kdloss_divergence_name(w.div), (long long)bt, (long long)v, temp);
        snprintf(extra, sizeof extra,
                 "%.0f GB/s effective (%.0f MB read once + written), loss %.6g",
                 3.0 * bz / (t.med * 1e6), 3.0 * bz / 1e6, loss);
        row_out(name, t, g_peak, extra);
    }
    dfree(w.wk, w.wkb);
    dfree(w.zs, bz);
    dfree(w.zt, bz);
    dfree(w.g, bz);
    dfree(w.loss, 4);
    return ok;
}

static size_t dev_used(void) {
    size_t fr, tot;
    CK(cudaMemGetInfo(&fr, &tot));
    return tot - fr;
}

int main(int argc, char **argv) {
    const char *json = argc > 1 ? argv[1] : NULL;
    if (!kdloss_cuda_available()) {
        printf("gpu_bench: no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    kdloss_cuda_context *ctx;
    KS(kdloss_cuda_context_create(0, &ctx));
    CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    g_flush_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&g_flush, g_flush_bytes));
    const size_t base_used = dev_used();
    int ok = 1;
    FILE *js = json ? fopen(json, "w") : NULL;
    g_js = js;
    if (js) fprintf(js, "{\n  \"device\": \"%s\",\n  \"sm_count\": %d,\n  \"results\": [\n", prop.name, prop.multiProcessorCount);
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    /* ---- 1. KL ---- */
    {
        kl_w w;
        w.ctx = ctx;
        w.bt = 16384;
        w.v = 4096;
        size_t n = (size_t)(w.bt * w.v), by = n * 4;
        g_peak = g_live;
        w.y = (float *)dmalloc(by);
        w.t = (float *)dmalloc(by);
        w.g = (float *)dmalloc(by);
        w.loss = (float *)dmalloc(4);
        KS(kdloss_cuda_kl_div_workspace_size(w.bt, w.v, &w.wsb));
        w.ws = dmalloc(w.wsb);
        fill_normal_f32<<<grid_for(n), 256, 0, g_st>>>(w.y, n, 1);
        fill_normal_f32<<<grid_for(n), 256, 0, g_st>>>(w.t, n, 2);
        row_softmax<<<(unsigned)w.bt, 256, 0, g_st>>>(w.y, w.v, 0);
        row_softmax<<<(unsigned)w.bt, 256, 0, g_st>>>(w.t, w.v, 1);
        CK(cudaGetLastError());
        timing t = time_op(kl_op, &w, 5, 50);
        float loss;
        CK(cudaMemcpy(&loss, w.loss, 4, cudaMemcpyDeviceToHost));
        char extra[128];
        snprintf(extra, sizeof extra, "%.0f GB/s effective (805 MB), loss %.6g", 3.0 * by / (t.med * 1e6), loss);
        row_out("kdloss kl_div full 16384x4096 fp32", t, g_peak, extra);
        if (!isfinite(loss)) ok = 0;
        dfree(w.y, by);
        dfree(w.t, by);
        dfree(w.g, by);
        dfree(w.loss, 4);
        dfree(w.ws, w.wsb);
    }

    /* ---- 2. fused-linear JSD at the seed shape, and 3. its bare GEMMs ---- */
    {
        fl_w w;
        memset(&w, 0, sizeof w);
        w.ctx = ctx;
        w.bt = 8192;
        w.hs = 2048;
        w.ht = 4096;
        w.v = 128256;
        size_t bxs = (size_t)(w.bt * w.hs) * 2, bws = (size_t)(w.v * w.hs) * 2;
        size_t bxt = (size_t)(w.bt * w.ht) * 2, bwt = (size_t)(w.v * w.ht) * 2;
        size_t blab = (size_t)w.bt * 8;
        g_peak = g_live;
        w.xs = dmalloc(bxs);
        w.ws = dmalloc(bws);
        w.xt = dmalloc(bxt);
        w.wt = dmalloc(bwt);
        w.lab = (int64_t *)dmalloc(blab);
        w.dxs = dmalloc(bxs);
        w.dws = dmalloc(bws);
        w.loss = (float *)dmalloc(4);
        /* torch.rand inputs; nn.Linear default init U(-1/sqrt(in), 1/sqrt(in)) */
        fill_uniform_bf16<<<grid_for(bxs / 2), 256, 0, g_st>>>((uint16_t *)w.xs, bxs / 2, 0.f, 1.f, 11);
        fill_uniform_bf16<<<grid_for(bxt / 2), 256, 0, g_st>>>((uint16_t *)w.xt, bxt / 2, 0.f, 1.f, 12);
        float as = 1.0f / sqrtf((float)w.hs), at = 1.0f / sqrtf((float)w.ht);
        fill_uniform_bf16<<<grid_for(bws / 2), 256, 0, g_st>>>((uint16_t *)w.ws, bws / 2, -as, as, 13);
        fill_uniform_bf16<<<grid_for(bwt / 2), 256, 0, g_st>>>((uint16_t *)w.wt, bwt / 2, -at, at, 14);
        fill_labels<<<grid_for(w.bt), 256, 0, g_st>>>(w.lab, w.bt, w.v, 15);
        CK(cudaGetLastError());

        const size_t budgets[] = {0, (size_t)1 << 30, (size_t)2 << 30};
        for (int b = 0; b < 3; b++) {
            w.budget = budgets[b];
            kdloss_fljsd_params p = fl_params(w.budget);
            KS(kdloss_cuda_fljsd_workspace_size(&p, w.bt, w.hs, w.ht, w.v, KDLOSS_BF16, 1, &w.wkb));
            g_peak = g_live;
            w.wk = dmalloc(w.wkb);
            size_t used0 = dev_used();
            timing t = time_op(fl_op, &w, 2, 10);
            float loss;
            int32_t status;
            CK(cudaMemcpy(&loss, w.loss, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&status, w.wk, 4, cudaMemcpyDeviceToHost));
            char name[96], extra[160];
            snprintf(name, sizeof name, "kdloss fused_linear_jsd budget %zu MiB", (w.budget ? w.budget : (size_t)256 << 20) >> 20);
            snprintf(extra, sizeof extra, "workspace %.0f MB, loss %.6g, status %d, %.0f TFLOP/s (21.5 TFLOP), dev used +%.0f MB",
                     w.wkb / 1e6, loss, (int)status, 21.52e12 / (t.med * 1e-3) / 1e12,
                     (double)(used0 - base_used) / 1e6);
            row_out(name, t, g_peak, extra);
            if (!isfinite(loss) || status != 0) ok = 0;
            dfree(w.wk, w.wkb);
        }

        gemm_w g;
        memset(&g, 0, sizeof g);
        g.f = &w;
        BK(cublasCreate(&g.h));
        BK(cublasSetStream(g.h, g_st));
        size_t bz = (size_t)(w.bt * w.v) * 4, bdz = (size_t)(w.bt * w.v) * 2, bdw = (size_t)(w.v * w.hs) * 4;
        g_peak = g_live;
        g.z = (float *)dmalloc(bz);
        g.dz = dmalloc(bdz);
        g.dw = (float *)dmalloc(bdw);
        /* a non-zero gradient of logit size, like dzs (|values| ~ 1e-5) */
        fill_uniform_bf16<<<grid_for(bdz / 2), 256, 0, g_st>>>((uint16_t *)g.dz, bdz / 2, -1e-5f, 1e-5f, 16);
        CK(cudaGetLastError());
        const char *names[] = {"bare GEMM zs = xs ws^T (fp32 out)", "bare GEMM zt = xt wt^T (fp32 out)",
                               "bare GEMM dxs = dz ws (bf16 out)", "bare GEMM dws = dz^T xs (fp32 out)",
                               "bare GEMMs, all four"};
        const double flops[] = {2.0 * 8192 * 128256 * 2048, 2.0 * 8192 * 128256 * 4096,
                                2.0 * 8192 * 128256 * 2048, 2.0 * 8192 * 128256 * 2048, 0};
        for (int i = 0; i < 5; i++) {
            g.which = i;
            timing t = time_op(gemm_op, &g, 2, 10);
            char extra[96] = "";
            double f = i < 4 ? flops[i] : flops[0] + flops[1] + flops[2] + flops[3];
            snprintf(extra, sizeof extra, "%.0f TFLOP/s", f / (t.med * 1e-3) / 1e12);
            row_out(names[i], t, g_peak, extra);
        }
        BK(cublasDestroy(g.h));
        dfree(g.z, bz);
        dfree(g.dz, bdz);
        dfree(g.dw, bdw);
        dfree(w.xs, bxs);
        dfree(w.ws, bws);
        dfree(w.xt, bxt);
        dfree(w.wt, bwt);
        dfree(w.lab, blab);
        dfree(w.dxs, bxs);
        dfree(w.dws, bws);
        dfree(w.loss, 4);
    }
    /* ---- 4. the sparse top-k teacher ---- */
    if (!bench_topk(ctx)) ok = 0;
    /* ---- 5. the divergence family on dense logits ---- */
    if (!bench_distill_logits(ctx, 16384, 4096, 1.0, 1)) ok = 0; /* KL from logits, seed shape */
    if (!bench_distill_logits(ctx, 2048, 32768, 2.0, 2)) ok = 0;
    if (js) {
        fprintf(js, "\n  ],\n  \"ok\": %s\n}\n", ok ? "true" : "false");
        fclose(js);
    }
    CK(cudaFree(g_flush));
    CK(cudaStreamDestroy(g_st));
    kdloss_cuda_context_destroy(ctx);
    printf("gpu_bench: %s\n", ok ? "ok" : "FAILED (a loss is not finite or a status word is set)");
    return ok ? 0 : 1;
}
