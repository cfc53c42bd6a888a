/* The elementwise losses on log-probs (kl_div.cu: KLDivLoss, distill.cu: the divergence family), the
 * parts they share. Both read two (bt x v) operands tile by tile (kd_cuda.cuh: KD_EW_TILE, the
 * kd_ew_plan workspace), apply an element function, write the gradient (KL also its elementwise
 * loss) and sum the loss of each (row, tile) block into the plan's partial sums. Here, once: the
 * loop over the tiles, a tile's loads, element loop and stores, the NaN policy's row flag and
 * the block sum, the workspace's sizing and placing (the dtype dispatch of the launch is
 * kd_cuda.cuh's kd_launch_dtypes, which distill_logits.cu uses too). Each .cu
 * keeps what is its own: its arguments, its element function, what a label does (distill.cu), its
 * kernel's launch and the order of its passes. */
#ifndef KDLOSS_EW_TILE_CUH
#define KDLOSS_EW_TILE_CUH

#include "kd_cuda.cuh"

/* The *_workspace_size query of a (bt x v) elementwise loss. */
static inline kdloss_status kd_ew_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    if (!bytes) return KDLOSS_ERR_NULL_POINTER;
    kd_ew_plan p;
    kdloss_status s = kd_ew_plan_make(bt, v, NULL, &p);
    if (s != KDLOSS_OK) return s;
    *bytes = p.total;
    return KDLOSS_OK;
}

/* A checked call's plan: sized, the caller's workspace checked against it and the operands'
 * spans (kd_check_workspace, in the argument checks' order), then placed in that workspace. */
static inline kdloss_status kd_ew_plan_place(int64_t bt, int64_t v, void *workspace,
                                             size_t workspace_bytes, const kd_spanset *spans,
                                             kd_ew_plan *plan) {
    kdloss_status s = kd_ew_plan_make(bt, v, NULL, plan);
    if (s == KDLOSS_OK)
        s = kd_check_workspace(&kd_cuda_rules, workspace, workspace_bytes, plan->total, spans);
    if (s == KDLOSS_OK) kd_ew_plan_make(bt, v, workspace, plan);
    return s;
}

#ifdef __CUDACC__
/* f(b, row, cbase) for every (row, tile) block b of the grid-stride loop over bt * ntiles blocks;
 * cbase: the first column of this thread's first group. Every thread of a block makes the same
 * trips, so f may reach a barrier (kd_ew_tile_end). */
template <class F>
__device__ __forceinline__ void kd_ew_for_tiles(int64_t bt, int64_t ntiles, const F &f) {
    const int64_t nblk = bt * ntiles;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const int64_t row = b / ntiles;
        f(b, row, (b - row * ntiles) * KD_EW_TILE + (int64_t)threadIdx.x * 8);
    }
}

/* First column of a thread's group g: a group of the block's threads covers KD_EW_THREADS * 8
 * consecutive columns, so each warp's accesses of a group are contiguous. */
__device__ __forceinline__ int64_t kd_ew_col(int64_t cbase, int g) {
    return cbase + (int64_t)g * KD_EW_THREADS * 8;
}

/* Columns of a group starting at c0 that lie in the row (0 to 8). */
__device__ __forceinline__ int kd_ew_count(int64_t v, int64_t c0) {
    const int64_t rem = v - c0;
    return rem <= 0 ? 0 : rem >= 8 ? 8 : (int)rem;
}

/* One row of the operands and outputs: each array and the element offset of the row in it. */
typedef struct kd_ew_row {
    const void *x;  /* first operand, dtype DX: the student's log-probs (KL: its input) */
    int64_t ox;
    const void *y;  /* second operand, dtype DY: the teacher's log-probs (KL: its target) */
    int64_t oy;
    void *grad;     /* the gradient with respect to x, dtype DX, or NULL */
    int64_t og;
    float *elem;    /* the elementwise loss, fp32, or NULL */
    int64_t oe;
} kd_ew_row;

/* This thread's share of one tile of row r: all loads first (several independent 16-byte
 * requests in flight), then per element l = f(x, y, &g), the gradient g * gscale (zeros when
 * gscale is 0, also where g is infinite: inf x 0 would be NaN on a row nothing flags) and l into
 * the outputs. Returns the fp32 sum of the thread's l; adds (x + y) 2^-100 of every element to
 * *ck (two FMAs, the tail's zeros included: the NaN policy's check, kd_ew_tile_end). VEC: every
 * pointer and row pitch is 16-byte aligned, so full groups use vector accesses; the values and
 * the order of the sums are the same either way. */
template <int DX, int DY, bool VEC, class F>
__device__ __forceinline__ float kd_ew_tile(const kd_ew_row &r, int64_t cbase, int64_t v,
                                            float gscale, float *ck, const F &f) {
    float x[KD_EW_GROUPS][8], y[KD_EW_GROUPS][8];
    int n[KD_EW_GROUPS];
#pragma unroll
    for (int g = 0; g < KD_EW_GROUPS; g++) {
        const int64_t c0 = kd_ew_col(cbase, g);
        n[g] = kd_ew_count(v, c0);
        kd_ld8n<DX, VEC>(r.x, r.ox + c0, n[g], x[g]);
        kd_ld8n<DY, VEC>(r.y, r.oy + c0, n[g], y[g]);
    }
    float acc = 0.0f;
#pragma unroll
    for (int g = 0; g < KD_EW_GROUPS; g++) {
        if (n[g] == 0) continue;
        const int64_t c0 = kd_ew_col(cbase, g);
        float gr[8], el[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float gj;
            *ck = fmaf(y[g][j], KD_CK_SCALE, fmaf(x[g][j], KD_CK_SCALE, *ck));
            el[j] = f(x[g][j], y[g][j], &gj);
            gr[j] = gscale == 0.0f ? 0.0f : gj * gscale;
            if (j < n[g]) acc += el[j];
        }
        if (r.grad) kd_st8n<DX, VEC>(r.grad, r.og + c0, n[g], gr);
        if (r.elem) kd_st8n<KDLOSS_F32, VEC>(r.elem, r.oe + c0, n[g], el);
    }
    return acc;
}

/* The end of block b's tile of `row`: a thread that read a NaN or +inf (ck not below +inf) flags
 * the row, which kd_cuda_poison_rows rewrites after the kernel (flags NULL: not wanted); with
 * part, the block's sum of acc into part[b] (fixed order). part is the same in every thread, so
 * the barrier inside kd_block_sum is reached by all of them. */
__device__ __forceinline__ void kd_ew_tile_end(unsigned int *flags, int64_t row, float ck,
                                               double *part, int64_t b, float acc, double *red) {
    if (flags && !(ck < INFINITY)) atomicOr(&flags[row], 1u);
    if (part) {
        const double s = kd_block_sum((double)acc, red);
        if (threadIdx.x == 0) part[b] = s;
    }
}
#endif /* __CUDACC__ */

#endif /* KDLOSS_EW_TILE_CUH */
