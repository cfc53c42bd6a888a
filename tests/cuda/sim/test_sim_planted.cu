/* The CUDA simulator proves it can fail: each kernel here carries one planted defect of the kind
 * compute-sanitizer finds on a GPU, and the test passes only when the simulator reports it with
 * the right checker (and reports nothing for the correct twin of each kernel). Also the launch
 * checks (sm_90 limits) and a cuBLASLt call with a wrong transpose, whose result check must fail.
 * Built only in the simulator's racecheck build (cudasim/, KDLOSS_CUDA_SIM). */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "kd_sim.h"

/* as src/cuda/kd_cuda.cuh spells them for the simulator */
#define KD_LAUNCH(grid, block, smem, stream, ...) \
    kd_sim_launcher(&__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, (grid), (block), (smem), (stream))
#define KD_LAUNCH_CLUSTER(grid, block, smem, stream, cluster, ...) \
    kd_sim_launcher_cluster(&__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, (grid), (block), (smem), (stream), (cluster))
#define KD_DYN_SMEM(type, name, align) type *name = (type *)kd_sim_dyn_smem()

#define THREADS 128

/* out[row] = sum of in[row * n .. row * n + n) over a block; planted: `past` reads one more */
static __global__ void __launch_bounds__(THREADS) row_sum(const float *in, int n, int past, float *out) {
    __shared__ float part[THREADS];
    const int row = blockIdx.x;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n + past; i += blockDim.x) s += in[(size_t)row * n + i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned o = THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = part[0];
}

/* the same reduction with the barrier inside the tree missing when `racy` */
static __global__ void __launch_bounds__(THREADS) tree_sum(const float *in, int racy, float *out) {
    __shared__ float part[THREADS];
    part[threadIdx.x] = in[blockIdx.x * THREADS + threadIdx.x];
    __syncthreads();
    for (unsigned o = THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        if (!racy) __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

/* planted: a barrier inside a branch only some threads take */
static __global__ void __launch_bounds__(THREADS) branch_barrier(float *out, int divergent) {
    __shared__ float v[THREADS];
    v[threadIdx.x] = (float)threadIdx.x;
    if (!divergent || threadIdx.x < 16) __syncthreads();
    __syncthreads();
    out[blockIdx.x * THREADS + threadIdx.x] = v[(threadIdx.x + 1) % THREADS];
}

/* warp sums by shuffles; planted: only half the warp takes part although the mask names all */
static __global__ void __launch_bounds__(THREADS) warp_sum(const float *in, int half, float *out) {
    float v = in[threadIdx.x];
    if (!half || (threadIdx.x & 31) < 16)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) out[threadIdx.x >> 5] = v;
}

/* copies in to out; planted: `in` never written since cudaMalloc (initcheck) */
static __global__ void __launch_bounds__(THREADS) copy(const float *in, float *out, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

/* dynamic shared memory: fill `n` floats of it; planted: n past the launch's size */
static __global__ void __launch_bounds__(THREADS) dyn_fill(int n, float *out) {
    KD_DYN_SMEM(float, buf, 16);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = buf[0];
}

/* a host pointer handed to a kernel (planted: the kernel writes host memory) */
static __global__ void __launch_bounds__(THREADS) write_one(float *out) {
    if (threadIdx.x == 0) out[0] = 1.0f;
}

/* out[row] = sum of the row, read `reads` times (the trace's planted double read: 2) */
static __global__ void __launch_bounds__(THREADS) row_reads(const float *in, int n, int reads, float *out) {
    __shared__ float part[THREADS];
    float s = 0.0f;
    for (int r = 0; r < reads; r++)
        for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[(size_t)blockIdx.x * n + i];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < THREADS; i++) t += part[i];
        out[blockIdx.x] = t / (float)reads;
    }
}

/* Thread-block clusters: each block puts in[blockIdx.x] into its shared memory, and after
 * cluster.sync() thread 0 sums every block's value through distributed shared memory (rank
 * order), reading element `at` of each (0: its own value; planted: past the end). */
static __global__ void __launch_bounds__(THREADS) cluster_sum(const float *in, int at, float *out) {
    KD_DYN_SMEM(float, sh, 16);
    namespace cg = cooperative_groups;
    const cg::cluster_group c = cg::this_cluster();
    if (threadIdx.x == 0) sh[0] = in[blockIdx.x];
    c.sync();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (unsigned r = 0; r < c.num_blocks(); r++) s += c.map_shared_rank(sh, r)[at];
        out[blockIdx.x] = s + (float)c.block_rank() * 1000.0f;
    }
    c.sync(); /* no block's shared memory goes while another may read it */
}

/* ---- the harness -------------------------------------------------------------------------- */

static int g_pass, g_fail;

static void expect(int ok, const char *what) {
    if (ok) g_pass++;
    else g_fail++;
    printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
}

/* Runs body, then expects `checker` to have gained reports (planted) or nothing to have gained
 * any (correct twin). */
#define CASE(checker, planted, what, body)                                                      \
    do {                                                                                        \
        long before_ = kd_sim_report_count_of(checker), all_ = kd_sim_report_count();           \
        body;                                                                                   \
        long got_ = kd_sim_report_count_of(checker) - before_;                                  \
        long any_ = kd_sim_report_count() - all_;                                               \
        expect((planted) ? got_ > 0 : any_ == 0, what);                                         \
    } while (0)

static float *dev_floats(const float *h, size_t n) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * sizeof(float)) != cudaSuccess) abort();
    if (h && cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) abort();
    return d;
}

static void check_memcheck(void) {
    const int rows = 3, n = 200;
    float h[rows * n], got[rows];
    for (int i = 0; i < rows * n; i++) h[i] = (float)(i % 7) - 3.0f;
    float *in = dev_floats(h, rows * n), *out = dev_floats(NULL, rows);
    CASE("memcheck", 0, "row sum in bounds: no report", KD_LAUNCH(rows, THREADS, 0, 0, row_sum)(in, n, 0, out));
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    float want = 0;
    for (int i = 0; i < n; i++) want += h[2 * n + i];
    expect(fabsf(got[2] - want) < 1e-3f, "row sum in bounds: the right sum");
    CASE("memcheck", 1, "row sum one element past the last row: memcheck", KD_LAUNCH(rows, THREADS, 0, 0, row_sum)(in, n, 1, out));
    cudaFree(in);
    CASE("memcheck", 1, "read after cudaFree: memcheck", KD_LAUNCH(1, THREADS, 0, 0, row_sum)(in, n, 0, out));
    float host[4];
    CASE("memcheck", 1, "kernel writes a host pointer: memcheck", KD_LAUNCH(1, THREADS, 0, 0, write_one)(host));
    CASE("memcheck", 0, "dynamic shared memory in bounds: no report", KD_LAUNCH(1, THREADS, 256 * sizeof(float), 0, dyn_fill)(256, out));
    CASE("memcheck", 1, "dynamic shared memory past its size: memcheck", KD_LAUNCH(1, THREADS, 256 * sizeof(float), 0, dyn_fill)(257, out));
    cudaFree(out);
}

static void check_racecheck(void) {
    float h[4 * THREADS], got[4];
    for (int i = 0; i < 4 * THREADS; i++) h[i] = (float)(i % 5);
    float *in = dev_floats(h, 4 * THREADS), *out = dev_floats(NULL, 4);
    CASE("racecheck", 0, "tree reduction with its barriers: no report", KD_LAUNCH(4, THREADS, 0, 0, tree_sum)(in, 0, out));
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    float want = 0;
    for (int i = 0; i < THREADS; i++) want += h[3 * THREADS + i];
    expect(got[3] == want, "tree reduction: the right sum");
    CASE("racecheck", 1, "tree reduction without its __syncthreads: racecheck", KD_LAUNCH(4, THREADS, 0, 0, tree_sum)(in, 1, out));
    cudaFree(in);
    cudaFree(out);
}

static void check_synccheck(void) {
    float h[THREADS], got[THREADS / 32];
    for (int i = 0; i < THREADS; i++) h[i] = (float)i;
    float *in = dev_floats(h, THREADS), *out = dev_floats(NULL, 2 * THREADS);
    CASE("synccheck", 0, "uniform barriers: no report", KD_LAUNCH(2, THREADS, 0, 0, branch_barrier)(out, 0));
    CASE("synccheck", 1, "barrier in a divergent branch: synccheck", KD_LAUNCH(2, THREADS, 0, 0, branch_barrier)(out, 1));
    CASE("synccheck", 0, "full-warp shuffles: no report", KD_LAUNCH(1, THREADS, 0, 0, warp_sum)(in, 0, out));
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    expect(got[1] == (32 + 63) * 16.0f, "warp sums by shuffles: the right sum");
    CASE("synccheck", 1, "shuffle whose mask names lanes that do not arrive: synccheck", KD_LAUNCH(1, THREADS, 0, 0, warp_sum)(in, 1, out));
    cudaFree(in);
    cudaFree(out);
}

static void check_initcheck(void) {
    float *in = dev_floats(NULL, 64), *out = dev_floats(NULL, 64);
    CASE("initcheck", 1, "kernel reads a fresh allocation: initcheck", KD_LAUNCH(1, THREADS, 0, 0, copy)(in, out, 64));
    cudaMemset(in, 0, 64 * sizeof(float));
    CASE("initcheck", 0, "after cudaMemset: no report", KD_LAUNCH(1, THREADS, 0, 0, copy)(in, out, 64));
    cudaFree(in);
    cudaFree(out);
}

static void check_launch(void) {
    float *out = dev_floats(NULL, 4 * THREADS);
    cudaGetLastError();
    KD_LAUNCH(1, 2048, 0, 0, write_one)(out);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads a block: invalid configuration");
    KD_LAUNCH(1, 2 * THREADS, 0, 0, write_one)(out);
    expect(cudaGetLastError() == cudaErrorLaunchOutOfResources, "more threads than __launch_bounds__: out of resources");
    KD_LAUNCH(1, THREADS, 64 * 1024, 0, dyn_fill)(1, out);
    expect(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB dynamic shared memory without the attribute: invalid value");
    expect(cudaFuncSetAttribute(dyn_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess, "attribute raises the limit");
    KD_LAUNCH(1, THREADS, 64 * 1024, 0, dyn_fill)(1, out);
    expect(cudaGetLastError() == cudaSuccess, "64 KiB after the attribute: launches");
    KD_LAUNCH(dim3(1, 70000), THREADS, 0, 0, write_one)(out);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 70000: invalid configuration");
    expect(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
    cudaFree(out);
}

/* D (m x n) = A (m x k) B (k x n), column-major, fp32, through cuBLASLt with the given op of A
 * on a square A (so a wrong transpose still has matching shapes); returns max |D - ref|. */
static double lt_gemm_error(cublasOperation_t ta, int m) {
    float A[16 * 16], B[16 * 16], D[16 * 16];
    for (int i = 0; i < m * m; i++) A[i] = (float)((i * 7) % 11) - 5.0f, B[i] = (float)((i * 3) % 5) - 2.0f;
    float *dA = dev_floats(A, m * m), *dB = dev_floats(B, m * m), *dD = dev_floats(NULL, m * m);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, m, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, m, m, m);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, m, m);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(lt, op, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0);
    cudaMemcpy(D, dD, sizeof(float) * m * m, cudaMemcpyDeviceToHost);
    double err = s == CUBLAS_STATUS_SUCCESS ? 0.0 : INFINITY;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++) {
            double r = 0;
            for (int l = 0; l < m; l++) r += (double)A[i + l * m] * B[l + j * m]; /* op(A) = A */
            err = fmax(err, fabs(D[i + j * m] - r));
        }
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
    return err;
}

static void check_cluster(void) {
    const int n = 32, cl = 4;
    float h[n], got[n];
    for (int i = 0; i < n; i++) h[i] = (float)(i * i % 7);
    float *in = dev_floats(h, n), *out = dev_floats(NULL, n);
    CASE("memcheck", 0, "cluster of 4: shared memory read across the cluster, no report",
         KD_LAUNCH_CLUSTER(n, THREADS, 16 * sizeof(float), 0, cl, cluster_sum)(in, 0, out));
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    int right = 1;
    for (int b = 0; b < n; b++) {
        float want = (float)(b % cl) * 1000.0f;
        for (int r = 0; r < cl; r++) want += h[b / cl * cl + r];
        right &= got[b] == want;
    }
    expect(right, "cluster of 4: every block sums its cluster's values in rank order");
    CASE("memcheck", 1, "cluster of 4: distributed shared memory read past its end: memcheck",
         KD_LAUNCH_CLUSTER(n, THREADS, 16 * sizeof(float), 0, cl, cluster_sum)(in, 16, out));
    KD_LAUNCH_CLUSTER(n, THREADS, 16 * sizeof(float), 0, 3, cluster_sum)(in, 0, out);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "a cluster size that does not divide the grid: invalid configuration");
    cudaFree(in);
    cudaFree(out);
}

static void check_blas(void) {
    kd_sim_trace_begin();
    expect(lt_gemm_error(CUBLAS_OP_N, 16) < 1e-3, "cuBLASLt, right descriptor: matches the reference");
    const long cnt = kd_sim_trace_end();
    int gemms = 0;
    kd_sim_op op;
    for (long i = 0; i < cnt; i++)
        if (kd_sim_trace_get(i, &op) && op.kind == KD_SIM_OP_GEMM)
            gemms += op.flops == 2.0 * 16 * 16 * 16 && op.bytes_read == 2 * 16 * 16 * 4.0 && op.bytes_written == 16 * 16 * 4.0;
    expect(gemms == 1, "trace: the GEMM counts 2 m n k FLOPs, A and B read, D written (beta 0: C not read)");
    expect(lt_gemm_error(CUBLAS_OP_T, 16) > 1.0, "cuBLASLt, wrong transpose: the result check fails");
}

/* The trace's kernel record of one launch of row_reads (rows x n), block sampling k (0: none). */
static kd_sim_op traced_rows(const float *in, int rows, int n, int reads, long k, float *out) {
    kd_sim_op op;
    memset(&op, 0, sizeof op);
    kd_sim_set_sample_blocks(k);
    kd_sim_trace_begin();
    KD_LAUNCH(rows, THREADS, 0, 0, row_reads)(in, n, reads, out);
    long cnt = kd_sim_trace_end();
    kd_sim_set_sample_blocks(0);
    if (cnt != 1 || !kd_sim_trace_get(0, &op)) op.kind = -1;
    return op;
}

/* The trace counts what the kernels do: a planted kernel that reads its 128 KiB rows twice shows
 * twice the bytes (rows larger than the trace's 64 KiB L1 model); a 4 KiB row read twice counts
 * once (the second read hits that L1); block sampling scales back to the same counts; GEMMs,
 * syncs and allocations. */
static void check_trace(void) {
    const int rows = 64, n = 32768;
    float *h = (float *)malloc(sizeof(float) * rows * n);
    for (int i = 0; i < rows * n; i++) h[i] = (float)(i % 5);
    float *in = dev_floats(h, (size_t)rows * n), *out = dev_floats(NULL, (size_t)rows * 32);
    const double row_bytes = (double)rows * n * sizeof(float);
    kd_sim_op once = traced_rows(in, rows, n, 1, 0, out), twice = traced_rows(in, rows, n, 2, 0, out);
    expect(once.kind == KD_SIM_OP_KERNEL && once.bytes_read == row_bytes && once.bytes_written == rows * sizeof(float),
           "trace: a kernel reading its rows once counts rows x n x 4 bytes read, rows x 4 written");
    expect(twice.bytes_read == 2 * row_bytes, "trace: the planted double read counts twice the bytes");
    kd_sim_op sampled = traced_rows(in, rows, n, 1, 4, out);
    expect(sampled.blocks == rows && sampled.blocks_run == 4 && sampled.bytes_read == row_bytes,
           "trace: 4 sampled blocks of 64, counts scaled to the grid");
    kd_sim_op small = traced_rows(in, rows * 32, n / 32, 2, 0, out);
    expect(small.bytes_read == row_bytes, "trace: 4 KiB rows read twice count once (the L1 model)");
    kd_sim_trace_begin();
    float *p = NULL;
    cudaMalloc((void **)&p, 4096);
    cudaMemsetAsync(p, 0, 4096, 0);
    cudaStreamSynchronize(0);
    const long cnt = kd_sim_trace_end();
    kd_sim_op a, m, y;
    expect(cnt == 3 && kd_sim_trace_get(0, &a) && a.kind == KD_SIM_OP_ALLOC && a.bytes_written == 4096 &&
           kd_sim_trace_get(1, &m) && m.kind == KD_SIM_OP_MEMSET && kd_sim_trace_get(2, &y) && y.kind == KD_SIM_OP_SYNC,
           "trace: an allocation, a memset and a host synchronization, in order");
    cudaFree(p);
    cudaFree(in);
    cudaFree(out);
    free(h);
}

int main(void) {
    check_trace();
    check_memcheck();
    check_racecheck();
    check_synccheck();
    check_initcheck();
    check_launch();
    check_blas();
    check_cluster();
    printf("test_sim_planted: every planted defect %s\n", g_fail ? "NOT caught" : "caught");
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
