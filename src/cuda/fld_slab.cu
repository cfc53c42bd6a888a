/* The fused loss's single-read row pass on sm_90 and later (docs/MATH.md section 11.2): a
 * thread-block cluster per row of the chunk, each block holding its slice of the row's logits in
 * shared memory, so the row is read from device memory once instead of three
 * times (fld.cu's fld_row_kernel: lse, divergence, dzs). The passes and their per-element
 * functions are fld_row_kernel's (fld_dz, kd_div_elem, the online log-sum-exp); only where the
 * logits live and how the blocks' partial sums meet (distributed shared memory, rank order)
 * differ. Rows that need the careful form are flagged and left to fld_row_kernel. Per-row
 * weights (docs/MATH.md 12.1) as fld_row_kernel takes them (fld_weigh); the entropy it does not
 * form: calls asking for it run fld_row_kernel alone (fld.cu). */
/* fld_rows.cuh first: div_elem.h's locals would shadow cuda_fp16.h's half (tk_rows.cuh) */
#include "fld_rows.cuh"

#include <cooperative_groups.h>

/* Shared memory of one block: its slice of zs and zt (fp32, biases added), then its partial
 * sums, which the cluster's other blocks read after a cluster barrier. */
typedef struct fld_slab_part {
    kd_lse a, b, h;     /* log-sum-exp states of zs / T, zt / T, zs */
    double soft, g;     /* the divergence and sum of g over the slice */
} fld_slab_part;

/* The device code exists for sm_90 and later (and the simulator); the sm_80 build keeps an empty
 * kernel that the host never launches (fld_slab_shape). */
#if defined(KD_SIM_CUDA) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define FLD_SLAB_DEVICE 1
#else
#define FLD_SLAB_DEVICE 0
#endif

#if FLD_SLAB_DEVICE
/* Columns [c_lo, c_lo + n) of a row (fld_load: biases added) into s / t of shared memory. */
template <int DS, int DT>
__device__ __forceinline__ void fld_slab_load(const fld_row_args &a, const float *zs,
                                             const float *zt, int64_t c_lo, int64_t n, float *s,
                                             float *t) {
    for (int64_t j = (int64_t)threadIdx.x * 8; j < n; j += FLD_TILE) {
        const int m = n - j >= 8 ? 8 : (int)(n - j);
        fld_load<DS>(zs, a.bs, c_lo + j, m, s + j);
        if (a.do_soft) fld_load<DT>(zt, a.bt, c_lo + j, m, t + j);
    }
}

/* The slice's log-sum-exp states (fld_lse_pass's sums, from shared memory) into P. */
__device__ __forceinline__ void fld_slab_lse(const fld_row_args &a, const float *s,
                                            const float *t, int64_t n, kd_lse *lred,
                                            fld_slab_part *P) {
    const int needA = fld_need_a(a), needH = fld_need_h(a);
    kd_lse sA = {-INFINITY, 0.0f}, sB = {-INFINITY, 0.0f}, sH = {-INFINITY, 0.0f};
    for (int64_t j = (int64_t)threadIdx.x * 8; j < n; j += FLD_TILE) {
        const int m = n - j >= 8 ? 8 : (int)(n - j);
        float u[8], w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            u[k] = k < m ? s[j + k] * a.inv_t : 0.0f;
            w[k] = k < m && a.do_soft ? t[j + k] * a.inv_t : 0.0f;
        }
        if (needH) kd_lse_add8(&sH, s + j, m);
        if (needA) kd_lse_add8(&sA, u, m);
        if (a.do_soft) kd_lse_add8(&sB, w, m);
    }
    if (needA) sA = kd_block_lse_state(sA, lred, 1.0f); /* the conditions are the block's */
    if (a.do_soft) sB = kd_block_lse_state(sB, lred, 1.0f);
    if (needH) sH = kd_block_lse_state(sH, lred, 1.0f);
    if (threadIdx.x == 0) P->a = sA, P->b = sB, P->h = sH;
}

/* The row's three log-sum-exps from every block's part (distributed shared memory), merged in
 * rank order from the empty state (whose merge is exact): every block forms the same bits. */
__device__ __forceinline__ fld_lses fld_slab_lses(const fld_row_args &a,
                                                 const cooperative_groups::cluster_group &cl,
                                                 fld_slab_part *mine) {
    kd_lse A = {-INFINITY, 0.0f}, B = A, H = A;
    for (unsigned r = 0; r < cl.num_blocks(); r++) {
        const fld_slab_part *p = cl.map_shared_rank(mine, r);
        A = kd_lse_merge(A, p->a, 1.0f);
        B = kd_lse_merge(B, p->b, 1.0f);
        H = kd_lse_merge(H, p->h, 1.0f);
    }
    fld_lses L;
    L.a = fld_need_a(a) ? kd_lse_value(A) : 0.0f;
    L.b = a.do_soft ? kd_lse_value(B) : 0.0f;
    L.h = fld_need_h(a) ? kd_lse_value(H) : L.a;
    return L;
}

/* The slice's divergence and sum of g (fld_soft_pass's sums) into P. */
__device__ __forceinline__ void fld_slab_soft(const fld_row_args &a, const float *s,
                                             const float *t, int64_t n, const fld_lses &L,
                                             double *red, fld_slab_part *P) {
    float accl = 0.0f, accg = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float g;
        accl += kd_div_elem(&a.coef, s[j] * a.inv_t - L.a, t[j] * a.inv_t - L.b, &g);
        accg += g;
    }
    const double soft = kd_block_sum((double)accl, red), g = kd_block_sum((double)accg, red);
    if (threadIdx.x == 0) P->soft = soft, P->g = g;
}

/* dzs of the slice from shared memory into the row (in place of its logits: a bf16 row occupies
 * the first half of the fp32 row, whose slices every block of the cluster read before the first
 * cluster barrier). */
template <int DS>
__device__ __forceinline__ void fld_slab_dz(const fld_row_args &a, float *zs, const float *s,
                                           const float *t, int64_t c_lo, int64_t n, int64_t gr,
                                           int64_t y, const fld_lses &L, float S) {
    float ca, cb;
    fld_factors(a, &ca, &cb);
    fld_weigh(a, gr, &ca, &cb);
    for (int64_t j = (int64_t)threadIdx.x * 8; j < n; j += FLD_TILE) {
        const int m = n - j >= 8 ? 8 : (int)(n - j);
        float d[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float sk = k < m ? s[j + k] : 0.0f, tk = k < m && a.do_soft ? t[j + k] : 0.0f;
            d[k] = fld_dz(a, ca, cb, sk, L.h, c_lo + j + k == y, sk * a.inv_t - L.a,
                          tk * a.inv_t - L.b, S);
            if (a.map_s.cap > 0.0f) d[k] *= kd_map_dcap(&a.map_s, sk);
        }
        if (m == 8) {
            kd_st8<DS>((void *)zs, c_lo + j, d);
        } else {
            for (int k = 0; k < m; k++) kd_st<DS>((void *)zs, c_lo + j + k, d[k]);
        }
    }
}

#endif /* FLD_SLAB_DEVICE */

/* One cluster of cl.num_blocks() blocks per chunk row (grid = rows x blocks); block r of a
 * cluster owns columns [r w, min(v, (r + 1) w)). The passes of fld_row_kernel, the row read
 * once: load the slice; its lse states, cluster barrier, the row's lses; a NaN tempered
 * normalizer flags the row for fld_row_kernel's careful form and leaves it; the slice's
 * divergence and sum of g, cluster barrier, the row's; the row's results (rank 0); dzs; a last
 * cluster barrier keeps each block's shared memory until every block has read it. */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fld_slab_kernel(fld_row_args a, int64_t w) {
#if FLD_SLAB_DEVICE
    namespace cg = cooperative_groups;
    __shared__ double red[32];
    __shared__ kd_lse lred[32];
    KD_DYN_SMEM(float, sh, 16);
    const cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    const int64_t r = blockIdx.x / cl.num_blocks(), gr = a.row0 + r, c_lo = (int64_t)rank * w;
    const int64_t n = a.v - c_lo < w ? (a.v - c_lo > 0 ? a.v - c_lo : 0) : w;
    float *zs = a.zs + r * a.ldz, *s = sh, *t = sh + w;
    const float *zt = a.zt ? a.zt + r * a.ldz : NULL;
    fld_slab_part *part = (fld_slab_part *)(sh + (a.do_soft ? 2 : 1) * w);
    const int64_t y = kd_label(a.labels, a.lab64, gr);
    const int wk = kd_weight_kind(a.w, gr); /* weight 0: ignored; bad: as a bad label */
    if (!(y != a.ignore && y >= 0 && y < a.v) || wk != 0) { /* every block: its columns */
        const bool bad = wk == 2 || (y != a.ignore && (y < 0 || y >= a.v));
        fld_skip_slice<DS>(a, (void *)zs, c_lo, n, gr, bad, rank == 0);
        return;
    }
    float zy = 0.0f; /* the label's own logit, read before any block writes dzs */
    if (rank == 0 && threadIdx.x == 0 && a.do_hard) zy = fld_logit<DS>(zs, a.bs, y);
    fld_slab_load<DS, DT>(a, zs, zt, c_lo, n, s, t);
    __syncthreads();
    fld_slab_lse(a, s, t, n, lred, part);
    cl.sync();
    const fld_lses L = fld_slab_lses(a, cl, part);
    if (a.do_soft && (isnan(L.a) || isnan(L.b))) { /* the careful form: fld_row_kernel */
        if (rank == 0 && threadIdx.x == 0) a.only[r] = 1;
        cl.sync();
        return;
    }
    if (a.do_soft) fld_slab_soft(a, s, t, n, L, red, part);
    cl.sync();
    double soft = 0.0, S = 0.0;
    for (unsigned i = 0; a.do_soft && i < cl.num_blocks(); i++) {
        const fld_slab_part *p = cl.map_shared_rank(part, i);
        soft += p->soft, S += p->g;
    }
    if (rank == 0)
        fld_put_row(a, gr, soft, a.do_hard ? (double)(L.h - zy) : 0.0, a.do_hard ? L.h : 0.0f);
    if (a.do_grad) fld_slab_dz<DS>(a, zs, s, t, c_lo, n, gr, y, L, a.grad_soft ? (float)S : 0.0f);
    cl.sync();
#endif
}

/* Blocks a row: 1 to 8 (the portable cluster size), about 2048 columns each; the columns each
 * holds, a multiple of 8; shared memory: the slices, then the part. */
fld_slab fld_slab_shape(const kdloss_cuda_context *ctx, int64_t v, int do_soft) {
    fld_slab sl = {0, 0, 0};
    if (ctx->cc_major < 9) return sl; /* clusters: sm_90 and later */
    const int64_t nb = (v + 2047) / 2048 < 8 ? (v + 2047) / 2048 : 8;
    const int64_t w = ((v + nb - 1) / nb + 7) / 8 * 8;
    const size_t bytes = (size_t)w * sizeof(float) * (do_soft ? 2 : 1) + sizeof(fld_slab_part);
    if (bytes > FLD_SLAB_MAX_SMEM) return sl;
    sl.blocks = (int)nb, sl.cols = w, sl.smem = bytes;
    return sl;
}

kdloss_status fld_slab_launch(kdloss_dtype ds, kdloss_dtype dt, int64_t rows,
                              const fld_row_args &a, const fld_slab &sl, cudaStream_t st) {
    const unsigned grid = kd_grid(rows * sl.blocks), nb = (unsigned)sl.blocks;
    const int64_t cols = sl.cols;
    const size_t smem = sl.smem;
    if (ds == KDLOSS_BF16 && dt == KDLOSS_BF16) {
        kd_smem_optin(fld_slab_kernel<KDLOSS_BF16, KDLOSS_BF16>, smem);
        KD_LAUNCH_CLUSTER(grid, FLD_ROW_THREADS, smem, st, nb, fld_slab_kernel<KDLOSS_BF16, KDLOSS_BF16>)(a, cols);
    } else if (ds == KDLOSS_BF16) {
        kd_smem_optin(fld_slab_kernel<KDLOSS_BF16, KDLOSS_F32>, smem);
        KD_LAUNCH_CLUSTER(grid, FLD_ROW_THREADS, smem, st, nb, fld_slab_kernel<KDLOSS_BF16, KDLOSS_F32>)(a, cols);
    } else if (dt == KDLOSS_BF16) {
        kd_smem_optin(fld_slab_kernel<KDLOSS_F32, KDLOSS_BF16>, smem);
        KD_LAUNCH_CLUSTER(grid, FLD_ROW_THREADS, smem, st, nb, fld_slab_kernel<KDLOSS_F32, KDLOSS_BF16>)(a, cols);
    } else {
        kd_smem_optin(fld_slab_kernel<KDLOSS_F32, KDLOSS_F32>, smem);
        KD_LAUNCH_CLUSTER(grid, FLD_ROW_THREADS, smem, st, nb, fld_slab_kernel<KDLOSS_F32, KDLOSS_F32>)(a, cols);
    }
    return kd_launch_status();
}
