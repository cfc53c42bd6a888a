/* Internal to the CUDA backend: the context, its argument-check rules, error mapping, device
 * selection, the workspace header, dtype loads/stores, and deterministic block reductions.
 * Included by every .cu file; everything here is inline (no relocatable device code needed). */
#ifndef KDLOSS_KD_CUDA_CUH
#define KDLOSS_KD_CUDA_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "args.h" /* src/common's checks: every entry point calls them with kd_cuda_rules */
#include "kdloss.h"

/* ---- one launch form for nvcc and the CUDA simulator (cudasim/) ------------------------------
 * The simulator compiles these files with the host g++, which has no triple-chevron launch: every
 * launch is written KD_LAUNCH(grid, block, smem, stream, kernel<T...>)(args...) and every
 * dynamic shared array KD_DYN_SMEM(type, name, align). Under nvcc they expand to the plain CUDA
 * forms; under the simulator (KD_SIM_CUDA, from its cuda_runtime_api.h) to its launcher, which
 * is told the kernel's text and the launch site (__FILE__, __LINE__: keep the KD_LAUNCH(...)
 * head on one line, cudasim/tools/kd_sim_scan.c registers the sites by that line). */
#ifdef KD_SIM_CUDA
#define KD_LAUNCH(grid, block, smem, stream, ...) \
    kd_sim_launcher(&__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, (grid), (block), (smem), (stream))
#define KD_LAUNCH_CLUSTER(grid, block, smem, stream, cluster, ...) \
    kd_sim_launcher_cluster(&__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, (grid), (block), (smem), (stream), (cluster))
#define KD_DYN_SMEM(type, name, align) type *name = (type *)kd_sim_dyn_smem()
#else
#define KD_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#define KD_LAUNCH_CLUSTER(grid, block, smem, stream, cluster, ...) \
    kd_cluster_launcher(__VA_ARGS__, (grid), (block), (smem), (stream), (cluster))
/* A launch in thread-block clusters of `cluster` blocks along x (sm_90): cudaLaunchKernelEx with
 * the cluster dimension attribute. Its error becomes the last error, as a <<<>>> launch's does. */
template <class... P>
struct kd_cluster_launch {
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t st;
    unsigned cluster;
    template <class... A>
    void operator()(A &&...a) const {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = cluster, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, fn, std::forward<A>(a)...);
    }
};
template <class... P>
static inline kd_cluster_launch<P...> kd_cluster_launcher(void (*fn)(P...), dim3 grid, dim3 block,
                                                          size_t smem, cudaStream_t st,
                                                          unsigned cluster) {
    return kd_cluster_launch<P...>{fn, grid, block, smem, st, cluster};
}
#define KD_DYN_SMEM(type, name, align) extern __shared__ __align__(align) type name[]
#endif

struct kdloss_cuda_context {
    int device;
    int sm_count;
    int cc_major;
    size_t total_mem;     /* the device's memory: the fused losses' default budget */
    cublasHandle_t blas;  /* used only when cuBLASLt offers no algorithm for a GEMM */
    cublasLtHandle_t lt;
    double *vp_agree;     /* device buffer of the vocabulary-parallel agreement (vp.h) */
};

/* The fused losses' working-space budget when the caller passes memory_budget 0 (docs/MATH.md
 * section 11.1): 1/32 of the device's memory, between 256 MiB and 2 GiB.
 * A function of the device alone, so a workspace query and the call agree, and results are
 * bitwise the same run to run. device -1: the current device. */
size_t kd_cuda_default_budget(int device);

/* The CUDA backend's rules for src/common's argument checks (context.cu): operands are device
 * memory, the workspace is required and 16-byte aligned. */
extern const kd_rules kd_cuda_rules;

/* ---- error mapping: never exit, never print ------------------------------------------------ */

static inline kdloss_status kd_cuda_status(cudaError_t e) {
    if (e == cudaSuccess) return KDLOSS_OK;
    if (e == cudaErrorMemoryAllocation) return KDLOSS_ERR_OUT_OF_MEMORY;
    return KDLOSS_ERR_CUDA;
}

static inline kdloss_status kd_blas_status(cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return KDLOSS_OK;
    if (s == CUBLAS_STATUS_ALLOC_FAILED) return KDLOSS_ERR_OUT_OF_MEMORY;
    return KDLOSS_ERR_CUDA;
}

/* After a launch: configuration errors show up here, without a synchronization. */
static inline kdloss_status kd_launch_status(void) { return kd_cuda_status(cudaGetLastError()); }

/* Raises kernel fn's dynamic shared memory limit to `bytes` where that is over the default
 * 48 KiB (up to 227 KiB on sm_90); a refusal shows in the launch's status. */
template <class F>
static inline void kd_smem_optin(F *fn, size_t bytes) {
    if (bytes > 48 * 1024)
        (void)cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* ---- run on the context's device, restore the caller's current device afterwards ---------- */

typedef struct kd_dev_guard {
    int prev;
    int changed;
} kd_dev_guard;

static inline kdloss_status kd_dev_enter(const kdloss_cuda_context *ctx, kd_dev_guard *g) {
    g->changed = 0;
    cudaError_t e = cudaGetDevice(&g->prev);
    if (e != cudaSuccess) return kd_cuda_status(e);
    if (g->prev != ctx->device) {
        e = cudaSetDevice(ctx->device);
        if (e != cudaSuccess) return kd_cuda_status(e);
        g->changed = 1;
    }
    return KDLOSS_OK;
}

static inline void kd_dev_leave(const kd_dev_guard *g) {
    if (g->changed) (void)cudaSetDevice(g->prev);
}

/* ---- workspace ---------------------------------------------------------------------------- */

/* The first bytes of every CUDA workspace (the caller's pointer, 16-byte aligned). `status` is
 * documented in kdloss.h; the counters are written by the label kernel of the same call. */
typedef struct kd_ws_header {
    int32_t status;                /* kdloss_status, written by the last kernel of the call */
    int32_t reserved;
    unsigned long long n_valid;    /* rows kept: label in [0, V) (or none), weight > 0 (or none) */
    unsigned long long n_bad;      /* rows whose label is neither ignore_index nor in [0, V) */
    unsigned long long n_bad_w;    /* rows whose weight is not finite and >= 0 (any label) */
} kd_ws_header;

#define KD_WS_HEADER_BYTES 256u
#define KD_WS_ALIGN 256u

/* Carves consecutive 256-byte-aligned regions out of the workspace body. Used twice per call with
 * the same sequence: once with base = 0 to size it, once with the real pointer. */
typedef struct kd_carver {
    uintptr_t base;
    size_t off;
} kd_carver;

static inline size_t kd_round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline void *kd_carve(kd_carver *c, size_t bytes) {
    c->off = kd_round_up(c->off, KD_WS_ALIGN);
    void *p = (void *)(c->base + c->off);
    c->off += bytes;
    return p;
}

/* Start of the body: the header occupies [ws, ws + 256); the body starts at the next 256-byte
 * boundary at or after ws + 256. Sizes include 256 bytes of slack for that rounding. */
static inline kd_carver kd_carver_for(void *ws) {
    kd_carver c;
    uintptr_t b = (uintptr_t)ws + KD_WS_HEADER_BYTES;
    c.base = ws ? (b + KD_WS_ALIGN - 1) / KD_WS_ALIGN * KD_WS_ALIGN : 0;
    c.off = 0;
    return c;
}

static inline size_t kd_ws_total(const kd_carver *sizing) {
    return KD_WS_HEADER_BYTES + KD_WS_ALIGN + kd_round_up(sizing->off, KD_WS_ALIGN);
}

/* 16-byte alignment of a pointer and a row pitch in bytes: the vector paths need both. */
static inline int kd_aligned16(const void *p, int64_t ld, size_t es) {
    return p == NULL || ((uintptr_t)p % 16u == 0 && ((uint64_t)ld * es) % 16u == 0);
}

/* ---- device helpers ----------------------------------------------------------------------- */
#ifdef __CUDACC__

/* Loads element i of a float-like array of dtype DT as fp32. */
template <int DT>
__device__ __forceinline__ float kd_ld(const void *p, int64_t i) {
    if (DT == KDLOSS_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (DT == KDLOSS_BF16) return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* Stores fp32 x as element i of dtype DT, rounding to nearest even. */
template <int DT>
__device__ __forceinline__ void kd_st(void *p, int64_t i, float x) {
    if (DT == KDLOSS_F32) {
        ((float *)p)[i] = x;
    } else if (DT == KDLOSS_BF16) {
        ((uint16_t *)p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    } else {
        ((uint16_t *)p)[i] = __half_as_ushort(__float2half_rn(x));
    }
}

__device__ __forceinline__ float kd_lo16(uint32_t w, int dt) {
    return dt == KDLOSS_BF16 ? __uint_as_float(w << 16)
                             : __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
}
__device__ __forceinline__ float kd_hi16(uint32_t w, int dt) {
    return dt == KDLOSS_BF16 ? __uint_as_float(w & 0xffff0000u)
                             : __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

/* Loads elements i..i+7; the address of element i must be 16-byte aligned. Plain (coherent)
 * loads on purpose: in-place calls write the same array in the same kernel. */
template <int DT>
__device__ __forceinline__ void kd_ld8(const void *p, int64_t i, float out[8]) {
    if (DT == KDLOSS_F32) {
        const float4 *q = (const float4 *)((const float *)p + i);
        float4 a = q[0], b = q[1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else {
        uint4 w = *(const uint4 *)((const uint16_t *)p + i);
        out[0] = kd_lo16(w.x, DT); out[1] = kd_hi16(w.x, DT);
        out[2] = kd_lo16(w.y, DT); out[3] = kd_hi16(w.y, DT);
        out[4] = kd_lo16(w.z, DT); out[5] = kd_hi16(w.z, DT);
        out[6] = kd_lo16(w.w, DT); out[7] = kd_hi16(w.w, DT);
    }
}

template <int DT>
__device__ __forceinline__ uint32_t kd_pack2(float a, float b) {
    uint32_t lo, hi;
    if (DT == KDLOSS_BF16) {
        lo = __bfloat16_as_ushort(__float2bfloat16_rn(a));
        hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
    } else {
        lo = __half_as_ushort(__float2half_rn(a));
        hi = __half_as_ushort(__float2half_rn(b));
    }
    return lo | (hi << 16);
}

/* Stores elements i..i+7; same alignment rule as kd_ld8. */
template <int DT>
__device__ __forceinline__ void kd_st8(void *p, int64_t i, const float in[8]) {
    if (DT == KDLOSS_F32) {
        float4 *q = (float4 *)((float *)p + i);
        q[0] = make_float4(in[0], in[1], in[2], in[3]);
        q[1] = make_float4(in[4], in[5], in[6], in[7]);
    } else {
        uint4 w;
        w.x = kd_pack2<DT>(in[0], in[1]);
        w.y = kd_pack2<DT>(in[2], in[3]);
        w.z = kd_pack2<DT>(in[4], in[5]);
        w.w = kd_pack2<DT>(in[6], in[7]);
        *(uint4 *)((uint16_t *)p + i) = w;
    }
}

/* Elements o..o+n-1 (n <= 8) of a DT array as fp32, the rest of out 0. VEC: element o is
 * 16-byte aligned, so a full group (n == 8) is one or two 16-byte loads. */
template <int DT, bool VEC>
__device__ __forceinline__ void kd_ld8n(const void *p, int64_t o, int n, float out[8]) {
    if (VEC && n == 8) {
        kd_ld8<DT>(p, o, out);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) out[j] = j < n ? kd_ld<DT>(p, o + j) : 0.0f;
    }
}

/* Stores in[0..n) as elements o..o+n-1 of a DT array; same rule as kd_ld8n. */
template <int DT, bool VEC>
__device__ __forceinline__ void kd_st8n(void *p, int64_t o, int n, const float in[8]) {
    if (VEC && n == 8) {
        kd_st8<DT>(p, o, in);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n) kd_st<DT>(p, o + j, in[j]);
    }
}

/* Label of row r (I64 or I32), widened. */
__device__ __forceinline__ int64_t kd_label(const void *labels, int is64, int64_t r) {
    return is64 ? ((const int64_t *)labels)[r] : (int64_t)((const int32_t *)labels)[r];
}

/* Row r's weight (docs/MATH.md section 12): 0 kept (no weights, or finite and > 0), 1 weight 0
 * (an ignored row), 2 not finite or < 0 (a bad row: the status word reports it, as a bad
 * label). -0 is 0, as on the CPU. */
__device__ __forceinline__ int kd_weight_kind(const float *w, int64_t r) {
    if (!w) return 0;
    const float x = w[r];
    return x > 0.0f && x <= 3.402823466e38f ? 0 : x == 0.0f ? 1 : 2;
}

/* Sum over the block, in a fixed order (shuffle tree in each warp, then warp 0 over the warps):
 * the same inputs give the same bits on every run. The result is valid in thread 0 only.
 * T: double (the losses' sums) or unsigned long long (counts: exact, so any order would do).
 * `red` is shared scratch of 32 T. Must be called by every thread of the block; it ends with a
 * barrier so the scratch can be reused right away. */
template <typename T>
__device__ __forceinline__ T kd_block_sum(T x, T *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < nwarps ? red[lane] : (T)0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    }
    __syncthreads();
    return x;
}

/* Like kd_block_sum, but every thread gets the result (one extra barrier). */
__device__ __forceinline__ double kd_block_sum_all(double x, double *red) {
    double s = kd_block_sum(x, red);
    if (threadIdx.x == 0) red[0] = s;
    __syncthreads();
    s = red[0];
    __syncthreads();
    return s;
}

/* Max over the block (exact: any order gives the same bits; NaN lanes are dropped, as fmaxf
 * does); every thread gets it. `red` is shared scratch of 32 floats. Must be called by every
 * thread of the block; it ends with a barrier so the scratch can be reused right away. */
__device__ __forceinline__ float kd_block_max(float x, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, o));
    if (lane == 0) red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < nwarps ? red[lane] : -INFINITY;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, o));
        if (lane == 0) red[0] = x;
    }
    __syncthreads();
    x = red[0];
    __syncthreads();
    return x;
}

/* Online log-sum-exp state of values x scaled by sc > 0 (the temperature's 1/T, or 1):
 * sum exp(sc x_i) = l * exp(sc m), m the largest x_i. m = -inf and l = 0 when empty. Forming
 * sc (x - m) rather than sc x - sc m keeps the precision of rows far from 0 (logits near -1e4),
 * as the CPU's row passes do. */
typedef struct kd_lse {
    float m;
    float l;
} kd_lse;

/* Adds n values at once: one rescale per group instead of per element. -inf values add 0; an
 * all -inf state stays (m = -inf, l = 0) instead of forming exp(-inf - -inf) = NaN.
 * The NaN policy (kdloss.h): a NaN value makes l NaN and keeps it so (a NaN or +inf value gives
 * exp(NaN) or exp(inf - inf)); while m = -inf, l is 0 or that NaN, so a NaN among values that
 * fmaxf dropped (a group of -inf and NaN only, checked in that rare branch) is not lost. */
__device__ __forceinline__ void kd_lse_add8s(kd_lse *s, const float x[8], int n, float sc) {
    float gm = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n) gm = fmaxf(gm, x[j]);
    float nm = fmaxf(s->m, gm);
    if (nm == -INFINITY) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n && x[j] != x[j]) s->l = x[j];
        return;
    }
    float l = s->m == -INFINITY ? s->l : s->l * expf((s->m - nm) * sc);
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n) l += expf((x[j] - nm) * sc);
    s->m = nm;
    s->l = l;
}

__device__ __forceinline__ void kd_lse_add8(kd_lse *s, const float x[8], int n) {
    kd_lse_add8s(s, x, n, 1.0f); /* (x - m) * 1 is exact: the unscaled sums */
}

/* Merges two states (an empty one's l, 0 or NaN, is added as it is: the NaN policy). */
__device__ __forceinline__ kd_lse kd_lse_merge(kd_lse a, kd_lse b, float sc) {
    float m = fmaxf(a.m, b.m);
    kd_lse r;
    r.m = m;
    if (m == -INFINITY) {
        r.l = a.l + b.l;
        return r;
    }
    r.l = (a.m == -INFINITY ? a.l : a.l * expf((a.m - m) * sc)) +
          (b.m == -INFINITY ? b.l : b.l * expf((b.m - m) * sc));
    return r;
}

/* The merged state over the block, fixed combination order; every thread gets it.
 * `red` is shared scratch of 32 kd_lse. Ends with a barrier. */
__device__ __forceinline__ kd_lse kd_block_lse_state(kd_lse s, kd_lse *red, float sc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        kd_lse t;
        t.m = __shfl_down_sync(0xffffffffu, s.m, o);
        t.l = __shfl_down_sync(0xffffffffu, s.l, o);
        s = kd_lse_merge(s, t, sc);
    }
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (warp == 0) {
        if (lane < nwarps) {
            s = red[lane];
        } else {
            s.m = -INFINITY;
            s.l = 0.0f;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            kd_lse t;
            t.m = __shfl_down_sync(0xffffffffu, s.m, o);
            t.l = __shfl_down_sync(0xffffffffu, s.l, o);
            s = kd_lse_merge(s, t, sc);
        }
        if (lane == 0) red[0] = s;
    }
    __syncthreads();
    kd_lse r = red[0];
    __syncthreads();
    return r;
}

/* log(sum exp) of a state: an empty (all -inf) one gives -inf (l = 0), NaN when a NaN was
 * dropped by the max. */
__device__ __forceinline__ float kd_lse_value(kd_lse r) {
    return r.m == -INFINITY ? -INFINITY + r.l : r.m + logf(r.l);
}

/* log(sum exp) of unscaled values over the block; every thread gets it. Ends with a barrier. */
__device__ __forceinline__ float kd_block_lse(kd_lse s, kd_lse *red) {
    return kd_lse_value(kd_block_lse_state(s, red, 1.0f));
}

/* ---- small kernels of the fused losses (fld.cu, vp.cu) -----------------------
 * static: each .cu file gets its own copy (no relocatable device code). */

/* acc[c] = (first ? 0 : acc[c]) + sum over r < rows of dz[r * pitch + c], r ascending.
 * Shapes: dz (rows x v, pitch) dtype DS; acc [v] fp32. One thread per column: coalesced. */
template <int DS>
static __global__ void __launch_bounds__(256)
kd_colsum_kernel(const void *dz, int64_t pitch, int64_t rows, int64_t v, float *acc, int first) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < v;
         c += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
#pragma unroll 8
        for (int64_t r = 0; r < rows; r++) s += kd_ld<DS>(dz, r * pitch + c);
        acc[c] = first ? s : acc[c] + s;
    }
}

/* out (rows x cols, ld_out) in dtype DO = acc (rows x cols, ld_acc) fp32, rounded once. Blocks
 * over rows (grid-stride), threads over a row's columns: no division an element; with vec (both
 * row starts 16-byte aligned: kd_aligned16) groups of 8 by vector loads and stores, the tail one
 * by one. */
template <int DO>
static __global__ void __launch_bounds__(256)
kd_cast_kernel(const float *acc, int64_t ld_acc, void *out, int64_t ld_out, int64_t rows,
               int64_t cols, int vec) {
    const int64_t full = vec ? cols / 8 * 8 : 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *a = acc + r * ld_acc;
        const int64_t o = r * ld_out;
        for (int64_t c = (int64_t)threadIdx.x * 8; c < full; c += (int64_t)blockDim.x * 8) {
            float v[8];
            kd_ld8<KDLOSS_F32>(a, c, v);
            kd_st8<DO>(out, o + c, v);
        }
        for (int64_t c = full + threadIdx.x; c < cols; c += blockDim.x) kd_st<DO>(out, o + c, a[c]);
    }
}

/* kd_cast_kernel over rows x cols on st: its grid and its vector test. */
template <int DO>
static inline void kd_cast_launch(cudaStream_t st, const float *acc, int64_t ld_acc, void *out,
                                  int64_t ld_out, int64_t rows, int64_t cols) {
    const int vec = kd_aligned16(acc, ld_acc, 4) && kd_aligned16(out, ld_out, kdloss_dtype_size((kdloss_dtype)DO));
    KD_LAUNCH((unsigned)(rows < 1 ? 1 : rows < 65536 ? rows : 65536), 256, 0, st, kd_cast_kernel<DO>)(acc, ld_acc, out, ld_out, rows, cols, vec);
}

#endif /* __CUDACC__ */

/* ---- shared launchers (rowsum.cu) ---------------------------------------------------------- */

/* Zeroes the header counters, then counts valid and out-of-range labels of bt rows into them
 * (integer atomics: exact, so deterministic). Shapes: labels [bt]. */
kdloss_status kd_cuda_count_labels(cudaStream_t st, const void *labels, int is64, int64_t bt,
                                   int64_t v, int64_t ignore_index, kd_ws_header *hdr);
/* The same with per-row weights w [bt] (NULL: none; labels may be NULL: every label kept): a row
 * is counted in n_valid when its label and its weight keep it (kd_weight_kind 0); n_bad_w counts
 * the bad weights of every row, ignored ones included (the CPU checks them all). */
kdloss_status kd_cuda_count_rows(cudaStream_t st, const void *labels, int is64, int64_t bt,
                                 int64_t v, int64_t ignore_index, const float *w,
                                 kd_ws_header *hdr);

/* Second and third passes of the elementwise losses. part is (bt x ntiles) doubles of block
 * partial sums; writes row_loss [bt] (optional) and, when loss is not NULL,
 *   loss = sum * host_factor, or sum / host_factor (host_divides), or sum / max(1, n_valid)
 *   (use_n_valid: hdr->n_valid, counted on the device).
 * Writes hdr->status always (LABEL_OUT_OF_RANGE and NaN loss when hdr->n_bad > 0 and
 * use_n_valid; else INVALID_PARAM and NaN loss when hdr->n_bad_w > 0: the CPU checks labels
 * before weights). blk is scratch of kd_rows_blocks(bt) doubles. */
kdloss_status kd_cuda_finish_rows(cudaStream_t st, const double *part, int64_t bt, int64_t ntiles,
                                  float *row_loss, float *loss, double *blk, double host_factor,
                                  int host_divides, int use_n_valid, kd_ws_header *hdr);
/* The same, the loss summing w[r] times row r's sum (in double; w NULL: 1, the same bits as
 * kd_cuda_finish_rows); row_loss stays unweighted (docs/MATH.md section 12). */
kdloss_status kd_cuda_finish_rows_w(cudaStream_t st, const double *part, int64_t bt,
                                    int64_t ntiles, const float *w, float *row_loss, float *loss,
                                    double *blk, double host_factor, int host_divides,
                                    int use_n_valid, kd_ws_header *hdr);

/* The NaN policy on log-prob inputs (kdloss.h; docs/MATH.md 10), after the main kernel of an
 * elementwise loss: every thread of it sums (x + y) 2^-100 over its elements (two FMAs each; no
 * finite row overflows the sum) and sets its row's flag when that sum is NaN or +inf, i.e. when
 * it read a NaN or +inf. Here each flagged row r gets every element of its gradient (dtype gdt,
 * ld_g; NULL: none) NaN, or 0 when the gradient factor is 0 (the factor: gscale, or with
 * labels (hdr not NULL) grad_scale / max(1, n_valid) rounded to fp32, as the main kernel's),
 * every element of elem (fp32, ld_e; NULL: none) NaN, and part[r ntiles] NaN (part NULL:
 * none), so that the row's loss is NaN. flags [bt] were zeroed (kd_cuda_clear_flags) before
 * the main kernel. The row kernels with one block a row (distill_logits.cu, fld_rows.cuh) test
 * their normalizers instead and need none of this. */
kdloss_status kd_cuda_clear_flags(cudaStream_t st, unsigned int *flags, int64_t bt);
kdloss_status kd_cuda_poison_rows(cudaStream_t st, const unsigned int *flags, int64_t bt,
                                  int64_t v, void *grad, kdloss_dtype gdt, int64_t ld_g,
                                  float gscale, double grad_scale, const kd_ws_header *hdr,
                                  float *elem, int64_t ld_e, double *part, int64_t ntiles);

/* 2^-100: the scale of the NaN policy's row sums (a float literal, exact). */
#define KD_CK_SCALE 7.8886090522101180541e-31f

/* One GEMM (gemm.cu): D (m x n, ldd) = op(A) op(B) + beta D, column-major, fp32 accumulation;
 * ws is GEMM scratch inside the caller's workspace (256-byte aligned). */
kdloss_status kd_gemm(kdloss_cuda_context *ctx, cudaStream_t st, void *ws, size_t ws_bytes,
                      cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const void *A, cudaDataType_t at, int64_t lda, const void *B,
                      cudaDataType_t bt, int64_t ldb, float beta, void *D, cudaDataType_t dt,
                      int64_t ldd);

#define KD_ROWS_THREADS 256
static inline int64_t kd_rows_blocks(int64_t bt) {
    return (bt + KD_ROWS_THREADS - 1) / KD_ROWS_THREADS;
}

/* ---- elementwise losses (KL, JSD): tiling and workspace plan --------------------------------- */

/* A block of KD_EW_THREADS threads handles one tile of KD_EW_TILE columns of one row; each thread
 * owns KD_EW_GROUPS groups of 8 consecutive columns (16-byte vectors for 2-byte dtypes, two for
 * fp32). The tile count per row does not depend on the dtype or the alignment, so neither
 * changes the order of the sums. */
#define KD_EW_THREADS 256
#define KD_EW_GROUPS 2
#define KD_EW_TILE (KD_EW_THREADS * 8 * KD_EW_GROUPS)

typedef struct kd_ew_plan {
    kd_ws_header *hdr;
    double *part; /* (bt x ntiles) block partial sums */
    double *blk;  /* kd_rows_blocks(bt) partial sums of rows */
    unsigned int *flags; /* [bt] the NaN policy's row flags (kd_cuda_poison_rows) */
    int64_t ntiles;
    size_t total; /* workspace bytes */
} kd_ew_plan;

/* Sizes the workspace of a (bt x v) elementwise loss; with ws != NULL also places its parts. */
static inline kdloss_status kd_ew_plan_make(int64_t bt, int64_t v, void *ws, kd_ew_plan *p) {
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    int64_t ntiles = v / KD_EW_TILE + (v % KD_EW_TILE != 0);
    if ((uint64_t)bt > ((uint64_t)1 << 58) / (uint64_t)ntiles) return KDLOSS_ERR_INVALID_SIZE;
    kd_carver c = kd_carver_for(ws);
    p->hdr = (kd_ws_header *)ws;
    p->ntiles = ntiles;
    p->part = (double *)kd_carve(&c, (size_t)(bt * ntiles) * sizeof(double));
    p->blk = (double *)kd_carve(&c, (size_t)kd_rows_blocks(bt) * sizeof(double));
    p->flags = (unsigned int *)kd_carve(&c, (size_t)bt * sizeof(unsigned int));
    p->total = kd_ws_total(&c);
    return KDLOSS_OK;
}

/* Grid size for a 1-D launch over n blocks: the kernels loop when n exceeds the grid limit. */
static inline unsigned int kd_grid(int64_t n) {
    return n < 1 ? 1u : n > 0x7fffffffLL ? 0x7fffffffu : (unsigned int)n;
}

/* Blocks of `threads` for a grid-stride loop over n elements, at most 65536 of them. */
static inline unsigned int kd_grid_1d(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return kd_grid(b > 65536 ? 65536 : b);
}

#ifdef __cplusplus
/* The fields every (student, teacher, labels) row kernel of the elementwise plan takes, filled
 * from a checked call: A has s, ld_s, t, ld_t, grad, ld_g (effective lds), labels, lab64,
 * ignore, hdr, part (the plan's), bt, v. */
template <typename A>
static inline void kd_pair_args_fill(A *a, kdloss_cmat s, int64_t ld_s, kdloss_cmat t,
                                     int64_t ld_t, kdloss_mat g, int64_t ld_g,
                                     kdloss_labels labels, int64_t ignore, const kd_ew_plan &plan,
                                     int64_t bt, int64_t v) {
    a->s = s.data;
    a->ld_s = ld_s;
    a->t = t.data;
    a->ld_t = ld_t;
    a->grad = g.data;
    a->ld_g = ld_g;
    a->labels = labels.data;
    a->lab64 = labels.dtype == KDLOSS_I64;
    a->ignore = ignore;
    a->hdr = plan.hdr;
    a->part = plan.part;
    a->bt = bt;
    a->v = v;
}

/* The launch of a kernel templated on two operands' dtypes <DX, DY, VEC> (any float dtype each;
 * VEC: the accesses are 16-byte aligned) for the call's dx, dy and vec: calls
 * l.template launch<DX, DY, VEC>(). L is the file's own launcher, whose KD_LAUNCH names its
 * kernel (the simulator's registry reads each launch site's kernel from its text). */
template <int DX, int DY, class L>
static void kd_launch_vec(bool vec, const L &l) {
    if (vec) l.template launch<DX, DY, true>();
    else l.template launch<DX, DY, false>();
}

template <int DX, class L>
static void kd_launch_dy(int dy, bool vec, const L &l) {
    switch (dy) {
    case KDLOSS_F32: kd_launch_vec<DX, KDLOSS_F32>(vec, l); break;
    case KDLOSS_BF16: kd_launch_vec<DX, KDLOSS_BF16>(vec, l); break;
    default: kd_launch_vec<DX, KDLOSS_F16>(vec, l); break;
    }
}

template <class L>
static void kd_launch_dtypes(int dx, int dy, bool vec, const L &l) {
    switch (dx) {
    case KDLOSS_F32: kd_launch_dy<KDLOSS_F32>(dy, vec, l); break;
    case KDLOSS_BF16: kd_launch_dy<KDLOSS_BF16>(dy, vec, l); break;
    default: kd_launch_dy<KDLOSS_F16>(dy, vec, l); break;
    }
}
#endif

#endif /* KDLOSS_KD_CUDA_CUH */
