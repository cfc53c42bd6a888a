/* gpu-model's own proof that the traffic it models is counted: a row kernel that reads its row
 * once and a planted twin that reads it twice; the simulator's trace must show twice the bytes
 * (cudasim/README.md, "The trace"). Compiled as the simulator compiles src/cuda. */
#include <cuda_runtime.h>
#include <string.h>

#include "kd_sim.h"

#define KD_LAUNCH(grid, block, smem, stream, ...) \
    kd_sim_launcher(&__VA_ARGS__, #__VA_ARGS__, __FILE__, __LINE__, (grid), (block), (smem), (stream))

/* out[row] = max of the row (rows x n floats), the row read `passes` times */
static __global__ void __launch_bounds__(256) gm_row_max(const float *in, long n, int passes, float *out) {
    __shared__ float part[256];
    float m = -1e30f;
    for (int p = 0; p < passes; p++)
        for (long i = threadIdx.x; i < n; i += blockDim.x) {
            const float x = in[(long)blockIdx.x * n + i];
            m = x > m ? x : m;
        }
    part[threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < 256; i++) m = part[i] > m ? part[i] : m;
        out[blockIdx.x] = m;
    }
}

/* Device bytes read by one traced launch of gm_row_max; -1 when the trace did not record it. */
static double gm_traced_read(const float *in, long rows, long n, int passes, float *out) {
    kd_sim_op op;
    kd_sim_trace_begin();
    KD_LAUNCH((unsigned)rows, 256, 0, 0, gm_row_max)(in, n, passes, out);
    const long cnt = kd_sim_trace_end();
    return cnt == 1 && kd_sim_trace_get(0, &op) && op.kind == KD_SIM_OP_KERNEL ? op.bytes_read : -1.0;
}

/* 1 when the planted double read shows exactly twice the single read's bytes (and the single read
 * exactly the row's bytes); also under the model's block sampling. Rows of 256 KiB: more than the
 * trace's L1 model holds, as the fused loss's rows are. */
extern "C" int gm_planted_double_read_caught(long sample) {
    const long rows = 32, n = 65536;
    float *in = NULL, *out = NULL;
    if (cudaMalloc((void **)&in, sizeof(float) * rows * n) != cudaSuccess ||
        cudaMalloc((void **)&out, sizeof(float) * rows) != cudaSuccess)
        return 0;
    cudaMemset(in, 0, sizeof(float) * rows * n);
    kd_sim_set_sample_blocks(sample);
    const double once = gm_traced_read(in, rows, n, 1, out), twice = gm_traced_read(in, rows, n, 2, out);
    kd_sim_set_sample_blocks(0);
    cudaFree(in);
    cudaFree(out);
    return once == (double)(rows * n) * sizeof(float) && twice == 2.0 * once;
}
