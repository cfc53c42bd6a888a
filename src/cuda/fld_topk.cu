/* The fused-linear loss against a sparse top-k teacher on the GPU, single-process (kdloss.h:
 * kdloss_cuda_fused_linear_topk_distill and its _workspace_size; docs/MATH.md section 8), as
 * src/cpu/fld_topk.c is on the CPU: the entry points, the chunk plan, the dense path's chunk
 * loop and the sparse renorm_both path with its kernels. The row checks, the dense row kernel
 * and the final reduction are topk.cu's (tk_rows.cuh declares them); topk_vp.cu, the
 * vocabulary-parallel form, shares the dense plan and the row fields here. */
#include "tk_rows.cuh"

/* Launches of a call, on the caller's stream:
 *   1. tk_check_launch (topk.cu): per row, the label's kind and the ids' validity, into one flag
 *      byte per row and the header counters.
 *   2. dense rows: per chunk, zs = xs_c ws^T (cuBLASLt), then tk_row_launch_fused (topk.cu's
 *      tk_row_kernel, dz in place over the chunk's logits);
 *      sparse rows (renorm_both without cross-entropy or row_lse): tk_sparse_kernel forms
 *      zs_k = xs . ws_k + bs_k for the used slots only, and dxs = sum_k dz_k ws_k.
 *   3. gradients: dense: cuBLAS dxs / dws GEMMs and column sums, as fld.cu (dxs from the columns
 *      in S alone for renorm_both without the cross-entropy's gradient: tk_dx_s_kernel);
 *      sparse: dws / dbs rows gathered per vocabulary row from a CSR index of the (row, slot)
 *      pairs (tk_count / tk_scan / tk_place / tk_rank kernels), summed in row order.
 *   4. tk_final_launch (topk.cu): the scalar losses in a fixed order, and the status word.
 * No float atomics: every sum has a fixed order, so results are bitwise reproducible. The only
 * atomics are integer ones (counters, CSR counts), whose results do not depend on their order;
 * the CSR slots they hand out are put in row order by tk_rank_kernel. */

/* ---- 2. sparse rows (renorm_both without cross-entropy or row_lse) --------------------------- */

typedef struct tk_sparse_args {
    const void *xs;       /* (bt x hs, ld_xs), dtype DS */
    int64_t ld_xs;
    const void *ws;       /* (v x hs, ld_ws), dtype DS */
    int64_t ld_ws;
    const void *bias;     /* [v] DS or NULL */
    const void *ids;
    int ids64;
    int64_t ld_ids;
    const void *lp;
    int lpdt;
    int64_t ld_lp;
    const uint8_t *flags;
    tk_header *hdr;       /* n_valid; poisoned (set here, zeroed before the launch) */
    int64_t bt, hs, k;
    double inv_t64;       /* 1 / T rounded to fp32, as a double (kd_topk_row) */
    kd_div_coef coef;
    int grad_soft;
    double w_soft, grad_scale, temperature, soft_fac;
    double *row_soft;     /* [bt] workspace */
    float *out_soft;      /* caller's [bt] or NULL */
    const float *w;       /* [bt] row weights, or NULL: 1 */
    float *dz;            /* (bt x k) dz of the used slots, compacted per row (0 after), or NULL */
    int32_t *pcol;        /* (bt x k) their ids (-1 after) */
    void *dxs;            /* (bt x hs, ld_dxs) DS or NULL */
    int64_t ld_dxs;
    char *gslot;
    size_t slot_stride;
    int slots_smem;
} tk_sparse_args;

/* xs[row] . ws[id] over hs, one warp: lanes stride the hidden columns, then a fixed shuffle tree.
 * Valid in every lane. */
template <int DS>
__device__ __forceinline__ float tk_dot(const tk_sparse_args &a, int64_t row, int64_t id) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int64_t h = lane; h < a.hs; h += 32)
        acc += kd_ld<DS>(a.xs, row * a.ld_xs + h) * kd_ld<DS>(a.ws, id * a.ld_ws + h);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

/* Warps over the slots: the logits zs_k = xs . ws_k + bs_k of the used ones. */
template <int DS>
__device__ void tk_sparse_gather(const tk_sparse_args &a, int64_t r, tk_slots s) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t j = warp; j < a.k; j += nw) {
        const int64_t id = kd_topk_id(a.ids, a.ids64, a.ld_ids, r, j);
        if (id < 0) { /* the whole warp */
            if ((threadIdx.x & 31) == 0) s.col[j] = -1;
            continue;
        }
        const float z = tk_dot<DS>(a, r, id);
        if ((threadIdx.x & 31) == 0) {
            s.col[j] = id;
            s.z[j] = a.bias ? z + kd_ld<DS>(a.bias, id) : z;
            s.lp[j] = tk_ld_any(a.lp, a.lpdt, r * a.ld_lp + j);
        }
    }
}

/* Thread 0: compact, kd_topk_row (renorm_both: no rest), the row loss; g becomes dz = cb g. */
__device__ void tk_sparse_math(const tk_sparse_args &a, int64_t r, tk_slots s, int64_t *n_out) {
    const int64_t n = tk_compact(s, a.k);
    double crest = 0.0;
    const double d = kd_topk_row(&a.coef, KD_TAIL_RENORM_BOTH, n, s.z, s.lp, a.inv_t64,
                                 -INFINITY, s.g, &crest);
    const unsigned long long nv = a.hdr->n_valid;
    const double nvd = nv > 0 ? (double)nv : 1.0;
    const float cb = a.grad_soft
                         ? (float)(a.w_soft * a.grad_scale * a.soft_fac / (nvd * a.temperature))
                         : 0.0f;
    const float cw = a.w ? cb * a.w[r] : cb; /* the row weight, once in fp32 (MATH.md 12.1) */
    for (int64_t k = 0; k < n; k++) s.g[k] *= cw;
    a.row_soft[r] = d;
    if (a.out_soft) a.out_soft[r] = (float)d;
    /* the NaN policy: a poisoned row (kd_topk_row's NaN c_rest) with a gradient is NaN outside S
     * too, as the full-vocabulary path's dz row, so dws and dbs are NaN everywhere
     * (tk_dw_kernel fills them; the CPU's run_sparse likewise) */
    if (cw != 0.0f && isnan(crest)) atomicOr(&a.hdr->poisoned, 1u);
    /* a factor of 0 writes zeros: no slot reaches dxs, dws or dbs (0 x a NaN weight or hidden
     * state would be NaN; the CPU's sparse rows skip their axpys and scatter) */
    *n_out = cw != 0.0f ? n : 0;
}

/* dxs[r] = sum over the used slots, in order, of dz_k ws[id_k] (threads over hidden columns);
 * the row's (dz, id) pairs for the weight gradient. n = 0 (and dz NULL) zeroes the row. */
template <int DS>
__device__ void tk_sparse_dx(const tk_sparse_args &a, int64_t r, tk_slots s, int64_t n) {
    if (a.dxs)
        for (int64_t h = threadIdx.x; h < a.hs; h += blockDim.x) {
            float acc = 0.0f;
            for (int64_t k = 0; k < n; k++) acc += s.g[k] * kd_ld<DS>(a.ws, s.col[k] * a.ld_ws + h);
            kd_st<DS>(a.dxs, r * a.ld_dxs + h, acc);
        }
    if (a.dz)
        for (int64_t k = threadIdx.x; k < a.k; k += blockDim.x) {
            a.dz[r * a.k + k] = k < n ? s.g[k] : 0.0f;
            a.pcol[r * a.k + k] = k < n ? (int32_t)s.col[k] : -1;
        }
}

/* One block per row (grid-stride). DS: dtype of xs, ws, bs, dxs. */
template <int DS>
__global__ void __launch_bounds__(TK_SP_THREADS) tk_sparse_kernel(tk_sparse_args a) {
    KD_DYN_SMEM(char, tk_smem, 16);
    __shared__ int64_t n_sh;
    const tk_slots s = tk_slots_at(
        a.slots_smem ? tk_smem : a.gslot + (size_t)blockIdx.x * a.slot_stride, a.k);
    for (int64_t r = blockIdx.x; r < a.bt; r += gridDim.x) {
        const int kind = a.flags[r];
        if (kind != TK_ROW_OK) {
            if (threadIdx.x == 0) {
                const double x = kind == TK_ROW_IGNORED ? 0.0 : tk_qnan();
                a.row_soft[r] = x;
                if (a.out_soft) a.out_soft[r] = (float)x;
            }
            tk_sparse_dx<DS>(a, r, s, 0);
            continue;
        }
        tk_sparse_gather<DS>(a, r, s);
        __syncthreads();
        if (threadIdx.x == 0) tk_sparse_math(a, r, s, &n_sh);
        __syncthreads();
        tk_sparse_dx<DS>(a, r, s, n_sh);
        __syncthreads(); /* the slots are the next row's */
    }
}

/* ---- 3. dense: renorm_both's dxs from the columns in S (tk_dx_s_launch) ---------------------- */

typedef struct tk_dx_args {
    const void *ids;
    int ids64;
    int64_t ld_ids, k;
    const uint8_t *flags;
    int64_t row0, rows, v_lo, v, hs;
    const void *dz;   /* the chunk's dz, pitch dz_pitch elements; dtype bf16 or fp32 (bf) */
    int64_t dz_pitch;
    const void *ws;   /* (v x hs, ld_ws), same dtype */
    int64_t ld_ws;
    int bf;
    void *dx;         /* (rows x hs, ld_dx), bf16 or fp32 (dx_bf) */
    int64_t ld_dx;
    int dx_bf;
} tk_dx_args;

/* One block per chunk row (grid-stride), threads over the hidden columns, each summing the row's
 * slots in slot order in fp32 (the CPU's order), rounded once. The dtypes are uniform branches. */
__global__ void __launch_bounds__(TK_SP_THREADS) tk_dx_s_kernel(tk_dx_args a) {
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const int64_t gr = a.row0 + r;
        const bool ok = a.flags[gr] == TK_ROW_OK; /* the same for the whole block */
        for (int64_t h = threadIdx.x; h < a.hs; h += blockDim.x) {
            float acc = 0.0f;
            for (int64_t j = 0; ok && j < a.k; j++) {
                const int64_t id = kd_topk_id(a.ids, a.ids64, a.ld_ids, gr, j), c = id - a.v_lo;
                if (id < 0 || c < 0 || c >= a.v) continue; /* unused, or another rank's */
                const float d = a.bf ? kd_ld<KDLOSS_BF16>(a.dz, r * a.dz_pitch + c)
                                     : kd_ld<KDLOSS_F32>(a.dz, r * a.dz_pitch + c);
                const float w = a.bf ? kd_ld<KDLOSS_BF16>(a.ws, c * a.ld_ws + h)
                                     : kd_ld<KDLOSS_F32>(a.ws, c * a.ld_ws + h);
                acc += d * w;
            }
            if (a.dx_bf) kd_st<KDLOSS_BF16>(a.dx, r * a.ld_dx + h, acc);
            else kd_st<KDLOSS_F32>(a.dx, r * a.ld_dx + h, acc);
        }
    }
}

kdloss_status tk_dx_s_launch(cudaStream_t st, const tk_row_args &a, kdloss_dtype sdt,
                             const void *dz, int64_t dz_pitch, const void *ws, int64_t ld_ws,
                             int64_t v_lo, int64_t hs, void *dx, int64_t ld_dx, int dx_bf) {
    const tk_dx_args d = {a.ids, a.ids64, a.ld_ids, a.k, a.flags, a.row0, a.rows, v_lo, a.v, hs,
                          dz, dz_pitch, ws, ld_ws, sdt == KDLOSS_BF16, dx, ld_dx, dx_bf};
    KD_LAUNCH(kd_grid(a.rows > 65536 ? 65536 : a.rows), TK_SP_THREADS, 0, st, tk_dx_s_kernel)(d);
    return kd_launch_status();
}

/* ---- 3. sparse: the weight gradient, a CSR index of the (row, slot) pairs by id -------------
 * np = bt k pairs p = r k + j (compacted slots, pcol[p] = -1 when unused); count [v + 1],
 * offs [v + 1], rank0 / e0 / e1 [np] are uint32 (the plan keeps np below 2^31). */

/* count[id] += 1 per used pair, rank0[p] = the count before: a slot in the id's segment, in an
 * arbitrary order (tk_rank_kernel sorts each segment). Integer atomics: exact counts. */
__global__ void __launch_bounds__(256)
tk_count_kernel(const int32_t *pcol, int64_t np, uint32_t *count, uint32_t *rank0) {
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < np;
         p += (int64_t)gridDim.x * blockDim.x)
        if (pcol[p] >= 0) rank0[p] = atomicAdd(&count[pcol[p]], 1u);
}

/* offs[i] = sum of count[0..i), i <= n - 1 (n = v + 1, count[v] = 0: offs[v] is the total).
 * One block: each thread sums a contiguous range, a scan over the threads, then the ranges. */
__global__ void __launch_bounds__(1024)
tk_scan_kernel(const uint32_t *count, int64_t n, uint32_t *offs) {
    __shared__ uint32_t part[1024];
    const int t = threadIdx.x;
    const int64_t per = (n + 1023) / 1024, lo = t * per, hi = lo + per < n ? lo + per : n;
    uint32_t sum = 0;
    for (int64_t i = lo; i < hi; i++) sum += count[i];
    part[t] = sum;
    __syncthreads();
    for (int o = 1; o < 1024; o <<= 1) { /* inclusive scan of the 1024 range sums */
        const uint32_t x = t >= o ? part[t - o] : 0u;
        __syncthreads();
        part[t] += x;
        __syncthreads();
    }
    uint32_t run = t ? part[t - 1] : 0u;
    for (int64_t i = lo; i < hi; i++) {
        offs[i] = run;
        run += count[i];
    }
}

/* e0[offs[id] + rank0[p]] = p for every used pair. */
__global__ void __launch_bounds__(256)
tk_place_kernel(const int32_t *pcol, int64_t np, const uint32_t *offs, const uint32_t *rank0,
                uint32_t *e0) {
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < np;
         p += (int64_t)gridDim.x * blockDim.x)
        if (pcol[p] >= 0) e0[offs[pcol[p]] + rank0[p]] = (uint32_t)p;
}

/* e1 = each segment of e0 in ascending pair order, i.e. row order (an id is used once per row):
 * the rank of an entry is the number of smaller entries in its segment (quadratic in the
 * segment's length, which is at most bt: the rows sharing one id). */
__global__ void __launch_bounds__(256)
tk_rank_kernel(const int32_t *pcol, int64_t v, const uint32_t *offs, const uint32_t *e0,
               uint32_t *e1) {
    const int64_t used = offs[v]; /* e0[0, used) is filled */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < used;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t p = e0[i];
        const int32_t id = pcol[p];
        const uint32_t lo = offs[id], hi = offs[id + 1];
        uint32_t rank = 0;
        for (uint32_t j = lo; j < hi; j++) rank += e0[j] < p;
        e1[lo + rank] = p;
    }
}

/* Per vocabulary row c (blocks, grid-stride), threads over the hidden columns:
 *   dws[c] = sum over c's pairs in row order of dz_p xs[row(p)],  dbs[c] = sum of their dz_p
 * in dtype DS, rounded once; 0 for ids no row uses; NaN everywhere when a row with a gradient
 * was poisoned (*poisoned, the NaN policy). Each row of dws is written once. */
template <int DS>
__global__ void __launch_bounds__(256)
tk_dw_kernel(const uint32_t *offs, const uint32_t *e1, const float *dz, int64_t k,
             const void *xs, int64_t ld_xs, int64_t hs, int64_t v, void *dws, int64_t ld_dws,
             void *dbs, const uint32_t *poisoned) {
    if (*poisoned) { /* the same in every thread */
        const float qnan = __int_as_float(0x7fc00000);
        for (int64_t c = blockIdx.x; c < v; c += gridDim.x) {
            for (int64_t h = threadIdx.x; dws && h < hs; h += blockDim.x)
                kd_st<DS>(dws, c * ld_dws + h, qnan);
            if (dbs && threadIdx.x == 0) kd_st<DS>(dbs, c, qnan);
        }
        return;
    }
    for (int64_t c = blockIdx.x; c < v; c += gridDim.x) {
        const uint32_t lo = offs[c], hi = offs[c + 1];
        for (int64_t h = threadIdx.x; dws && h < hs; h += blockDim.x) {
            float acc = 0.0f;
            for (uint32_t j = lo; j < hi; j++) {
                const uint32_t p = e1[j];
                acc += dz[p] * kd_ld<DS>(xs, (int64_t)(p / (uint32_t)k) * ld_xs + h);
            }
            kd_st<DS>(dws, c * ld_dws + h, acc);
        }
        if (dbs && threadIdx.x == 0) {
            float acc = 0.0f;
            for (uint32_t j = lo; j < hi; j++) acc += dz[e1[j]];
            kd_st<DS>(dbs, c, acc);
        }
    }
}

/* ---- host side: workspace plans --------------------------------------------------------------
 * Workspace (after the 256-byte header, each part 256-byte aligned): the parts every top-k call
 * has (tk_carve_common: flags, row_soft [bt] double and for the dense path row_hard [bt], the
 * slot / bitmap slices), then
 * dense: lt_ws 32 MiB (cuBLASLt scratch), zs (C x ldz) fp32 chunk logits (dz over them),
 *   dw_acc (v x hs) and db_acc [v] fp32 for a bf16 student with gradients (as fld.cu),
 *   xm (C x hs) in the student's dtype with gradients (fld_mask_rows);
 *   C from chunk_size, or memory_budget (0 = 256 MiB) over ldz 4 bytes per row.
 * sparse with gradients: dz (bt x k) fp32, pcol (bt x k) int32, and for dws / dbs
 *   count, offs [v + 1] and rank0, e0, e1 [bt k] uint32. */

/* Rows per chunk of the dense fused loss (fld.cu's rule with one logit buffer). */
static int64_t tk_chunk_rows(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                             int64_t ldz) {
    const uint64_t row_bytes = (uint64_t)ldz * sizeof(float);
    if (p->chunk_size > 0) {
        const int64_t c = p->chunk_size < bt ? p->chunk_size : bt;
        return c > ((int64_t)1 << 30) ? (int64_t)1 << 30 : c;
    }
    const uint64_t budget = p->memory_budget ? (uint64_t)p->memory_budget : TK_DEFAULT_BUDGET;
    int64_t cmax = (int64_t)(budget / row_bytes);
    if (cmax < 1) cmax = 1;
    if (cmax > bt) cmax = bt;
    if (cmax > ((int64_t)1 << 30)) cmax = (int64_t)1 << 30;
    const int64_t nch = (bt + cmax - 1) / cmax; /* equal chunks, a multiple of 64 if it fits */
    int64_t c = (bt + nch - 1) / nch;
    const int64_t c64 = (c + 63) / 64 * 64;
    return c > 64 && c64 <= cmax ? c64 : c;
}

kdloss_status tk_dense_carve(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                             int64_t hs, int64_t v, int64_t k, kdloss_dtype sdt, int want_grad,
                             kd_carver *c, tk_plan *P) {
    if (!tk_sizes_ok(bt, v, k, hs)) return KDLOSS_ERR_INVALID_SIZE;
    memset(P, 0, sizeof *P);
    P->sc = tk_scratch_plan(v, k, 1);
    P->ldz = (v + 63) / 64 * 64; /* 256-byte rows */
    P->chunk = tk_chunk_rows(p, bt, P->ldz);
    if ((uint64_t)P->chunk > ((uint64_t)1 << 60) / ((uint64_t)P->ldz * 4u) ||
        (uint64_t)v * (uint64_t)hs > ((uint64_t)1 << 60))
        return KDLOSS_ERR_INVALID_SIZE;
    tk_carve_common(c, bt, 1, P);
    P->lt_ws = kd_carve(c, TK_LT_WS_BYTES);
    P->zs = (float *)kd_carve(c, (size_t)P->chunk * (size_t)P->ldz * sizeof(float));
    if (want_grad && sdt == KDLOSS_BF16) {
        P->dw_acc = (float *)kd_carve(c, (size_t)v * (size_t)hs * sizeof(float));
        P->db_acc = (float *)kd_carve(c, (size_t)v * sizeof(float));
    }
    if (want_grad) P->xm = kd_carve(c, (size_t)P->chunk * (size_t)hs * kdloss_dtype_size(sdt));
    return KDLOSS_OK;
}

static kdloss_status tk_dense_plan(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                                   int64_t hs, int64_t v, int64_t k, kdloss_dtype sdt,
                                   int want_grad, void *ws, tk_plan *P) {
    kd_carver c = kd_carver_for(ws);
    kdloss_status s = tk_dense_carve(p, bt, hs, v, k, sdt, want_grad, &c, P);
    P->hdr = (tk_header *)ws;
    P->total = kd_ws_total(&c);
    return s;
}

static kdloss_status tk_sparse_plan(int64_t bt, int64_t hs, int64_t v, int64_t k, int want_grad,
                                    void *ws, tk_plan *P) {
    if (!tk_sizes_ok(bt, v, k, hs)) return KDLOSS_ERR_INVALID_SIZE;
    memset(P, 0, sizeof *P);
    P->sc = tk_scratch_plan(v, k, 0);
    kd_carver c = kd_carver_for(ws);
    tk_carve_common(&c, bt, 0, P);
    if (want_grad) {
        const size_t np = (size_t)bt * (size_t)k, nv = (size_t)v + 1;
        P->dz = (float *)kd_carve(&c, np * sizeof(float));
        P->pcol = (int32_t *)kd_carve(&c, np * sizeof(int32_t));
        P->count = (uint32_t *)kd_carve(&c, nv * sizeof(uint32_t));
        P->offs = (uint32_t *)kd_carve(&c, nv * sizeof(uint32_t));
        P->rank0 = (uint32_t *)kd_carve(&c, np * sizeof(uint32_t));
        P->e0 = (uint32_t *)kd_carve(&c, np * sizeof(uint32_t));
        P->e1 = (uint32_t *)kd_carve(&c, np * sizeof(uint32_t));
    }
    P->hdr = (tk_header *)ws;
    P->total = kd_ws_total(&c);
    return KDLOSS_OK;
}

/* renorm_both with no cross-entropy and no row_lse depends on the student through its K
 * selected logits only (MATH.md 8): the sparse path. Its pair indices are uint32. Not under a
 * student logit map, as the CPU's. */
static int tk_sparse_params(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                            int64_t k) {
    return p->tail == KDLOSS_TAIL_RENORM_BOTH && !(p->weight_hard_loss > 0.0) &&
           (uint64_t)bt * (uint64_t)k <= (uint64_t)INT32_MAX &&
           !kd_logit_map_make(p->student_map).on; /* the sparse rows take the logits as they are */
}
static int tk_sparse_call(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                          int64_t k, const kdloss_fused_linear_distill_out *out) {
    /* the entropy spans every column, as row_lse: the full-vocabulary path (MATH.md 12) */
    return tk_sparse_params(p, bt, k) && !out->hard_loss && !out->row_hard && !out->row_lse &&
           !out->row_entropy;
}

/* ---- host side: the dense path --------------------------------------------------------------- */

void tk_row_fused(tk_row_args *a, const kdloss_fused_linear_topk_distill_params *p,
                         const kdloss_fused_linear_distill_out *out, int has_labels,
                         const void *bs, const tk_plan &P, int want_grad) {
    a->z = P.zs;
    a->ldz = P.ldz;
    a->g = want_grad ? (void *)P.zs : NULL;
    a->g_pitch = P.ldz * (int64_t)sizeof(float);
    a->map_s = kd_logit_map_make(p->student_map);
    a->map_bias = a->map_s.on ? bs : NULL; /* a mapped head's bias: added by fld_map_rows */
    a->bias = a->map_s.on ? NULL : bs;
    a->inv_t = (float)(1.0 / p->temperature);
    a->inv_t64 = (double)(float)(1.0 / p->temperature); /* fp32-exact: topk_row.h */
    a->same_t = p->temperature == 1.0;
    a->coef = kd_div_coef_make(&p->div);
    a->tail = (int)p->tail;
    /* "0 skips all cross-entropy work": the CE only when weighted or asked for */
    a->do_ce = has_labels && (p->weight_hard_loss > 0.0 || out->hard_loss || out->row_hard);
    a->do_hard = a->do_ce || out->row_lse != NULL;
    /* R for the untempered lse at T = 1, and for the entropy (over every column) */
    a->need_r = p->tail != KDLOSS_TAIL_RENORM_BOTH || (a->do_hard && a->same_t) ||
                out->row_entropy != NULL;
    fld_grad_fields(a, p, out, want_grad);
    a->w = p->row_weights;
    a->out_ent = out->row_entropy;
}

/* The zero-gradient rows of a top-k chunk (fld_mask): rows that do not count, and without the
 * cross-entropy's gradient (gh0) rows without a used slot. */
fld_mask tk_mask_of(const tk_row_args &a, int gh0) {
    const fld_mask m = {NULL, 0, 0, 0, a.flags, gh0 ? a.ids : NULL, a.ids64, a.ld_ids, a.k, NULL};
    return m;
}

/* Per chunk: zs = xs_c ws^T (cuBLASLt, fp32 out), the row kernel, the backward
 * (fld_chunk_backward; its dxs rows from the columns in S alone when sdx: renorm_both without the
 * cross-entropy's gradient), then the gradients' completion (fld_end_grads). */
static kdloss_status tk_run_dense(const fld_gemms &gm, const fld_grad_out &G, int64_t bt,
                                  const kd_fld_checked &g, const tk_plan &P, tk_row_args a,
                                  const kdloss_fused_linear_topk_distill_params *p) {
    const int gh0 = tk_gh_zero(p), sdx = gh0 && p->tail == KDLOSS_TAIL_RENORM_BOTH;
    const kdloss_cmat none = {NULL, KDLOSS_F32, 0};
    const kdloss_dtype ds = gm.sdt;
    kdloss_status s = tk_zero_slices(P, gm.st);
    s = fld_for_chunks(s, bt, P.chunk, [&](int64_t r0, int64_t rows) {
        kdloss_status sc = fld_chunk_logits(&gm, r0, rows, P.zs, none, none, 0, NULL);
        if (sc == KDLOSS_OK)
            sc = fld_map_rows(gm.st, P.zs, P.ldz, rows, a.v, a.map_bias, ds, a.map_s);
        if (sc != KDLOSS_OK) return sc;
        a.row0 = r0;
        a.rows = rows;
        if ((sc = tk_row_launch_fused(ds, a, P.sc, gm.st)) != KDLOSS_OK) return sc;
        return fld_chunk_backward(gm, G, tk_mask_of(a, gh0), r0, rows, [&] {
            void *dxs_c = fld_dxs_at(G, r0, ds);
            return sdx ? tk_dx_s_launch(gm.st, a, ds, P.zs, ds == KDLOSS_BF16 ? 2 * P.ldz : P.ldz,
                                        gm.ws, g.ld_ws, 0, gm.hs, dxs_c, g.ld_dxs,
                                        ds == KDLOSS_BF16)
                       : fld_chunk_dx(&gm, rows, dxs_c, fld_cuda_type(ds), g.ld_dxs);
        });
    });
    return s == KDLOSS_OK ? fld_end_grads(gm, G, bt) : s;
}

/* ---- host side: the sparse path -------------------------------------------------------------- */

/* dws and dbs from the rows' (dz, id) pairs: CSR by id, each segment in row order, one pass per
 * vocabulary row. Every row of dws / dbs is written (0 where no row uses the id). */
static kdloss_status tk_sparse_wgrad(cudaStream_t st, int64_t bt, int64_t hs, int64_t v,
                                     int64_t k, kdloss_cmat xs, const kd_fld_checked &g,
                                     const kdloss_fused_linear_distill_out *out, const tk_plan &P) {
    const int64_t np = bt * k;
    const unsigned gp = kd_grid_1d(np, 256);
    cudaError_t e = cudaMemsetAsync(P.count, 0, ((size_t)v + 1) * sizeof(uint32_t), st);
    if (e != cudaSuccess) return kd_cuda_status(e);
    KD_LAUNCH(gp, 256, 0, st, tk_count_kernel)(P.pcol, np, P.count, P.rank0);
    KD_LAUNCH(1, 1024, 0, st, tk_scan_kernel)(P.count, v + 1, P.offs);
    KD_LAUNCH(gp, 256, 0, st, tk_place_kernel)(P.pcol, np, P.offs, P.rank0, P.e0);
    KD_LAUNCH(gp, 256, 0, st, tk_rank_kernel)(P.pcol, v, P.offs, P.e0, P.e1);
    const unsigned gv = kd_grid(v > 65536 ? 65536 : v);
    if (xs.dtype == KDLOSS_BF16)
        KD_LAUNCH(gv, 256, 0, st, tk_dw_kernel<KDLOSS_BF16>)(
            P.offs, P.e1, P.dz, k, xs.data, g.ld_xs, hs, v, out->dws.data, g.ld_dws, out->dbs,
            &P.hdr->poisoned);
    else
        KD_LAUNCH(gv, 256, 0, st, tk_dw_kernel<KDLOSS_F32>)(
            P.offs, P.e1, P.dz, k, xs.data, g.ld_xs, hs, v, out->dws.data, g.ld_dws, out->dbs,
            &P.hdr->poisoned);
    return kd_launch_status();
}

/* The row kernel (logits of the used slots, kd_topk_row, dxs), then the weight gradients. */
static kdloss_status tk_run_sparse(cudaStream_t st, const kdloss_fused_linear_topk_distill_params *p,
                                   int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs,
                                   kdloss_cmat ws, const void *bs, const kdloss_topk_teacher &t,
                                   const kd_fld_checked &g,
                                   const kdloss_fused_linear_distill_out *out, const tk_plan &P) {
    const int wgrad = out->dws.data || out->dbs;
    tk_sparse_args a;
    memset(&a, 0, sizeof a);
    a.xs = xs.data;
    a.ld_xs = g.ld_xs;
    a.ws = ws.data;
    a.ld_ws = g.ld_ws;
    a.bias = bs;
    a.ids = t.ids.data;
    a.ids64 = t.ids.dtype == KDLOSS_I64;
    a.ld_ids = g.ld_ids;
    a.lp = t.logprobs.data;
    a.lpdt = (int)t.logprobs.dtype;
    a.ld_lp = g.ld_lp;
    a.flags = P.flags;
    a.hdr = P.hdr;
    a.bt = bt;
    a.hs = hs;
    a.k = t.k;
    a.inv_t64 = (double)(float)(1.0 / p->temperature); /* fp32-exact: topk_row.h */
    a.coef = kd_div_coef_make(&p->div);
    a.grad_soft = g.want_grad && p->weight_soft_loss > 0.0;
    a.w_soft = p->weight_soft_loss;
    a.grad_scale = p->grad_scale;
    a.temperature = p->temperature;
    a.soft_fac = p->t2_scale ? p->temperature * p->temperature : 1.0;
    a.row_soft = P.row_soft;
    a.out_soft = out->row_soft;
    a.w = p->row_weights;
    a.dz = wgrad ? P.dz : NULL;
    a.pcol = wgrad ? P.pcol : NULL;
    a.dxs = out->dxs.data;
    a.ld_dxs = g.ld_dxs;
    a.gslot = P.gslot;
    a.slot_stride = P.sc.slot_stride;
    a.slots_smem = P.sc.slots_smem;
    const unsigned grid = tk_row_grid(bt, P.sc);
    const cudaError_t e = cudaMemsetAsync(&P.hdr->poisoned, 0, sizeof(uint32_t), st);
    if (e != cudaSuccess) return kd_cuda_status(e);
    if (xs.dtype == KDLOSS_BF16)
        KD_LAUNCH(grid, TK_SP_THREADS, P.sc.smem, st, tk_sparse_kernel<KDLOSS_BF16>)(a);
    else
        KD_LAUNCH(grid, TK_SP_THREADS, P.sc.smem, st, tk_sparse_kernel<KDLOSS_F32>)(a);
    kdloss_status s = kd_launch_status();
    if (s == KDLOSS_OK && wgrad) s = tk_sparse_wgrad(st, bt, hs, v, t.k, xs, g, out, P);
    return s;
}

/* ---- host side: kdloss_cuda_fused_linear_topk_distill ---------------------------------------- */

/* The size covers either path when the params allow the sparse one (the call picks it from its
 * outputs: a row_lse or cross-entropy output needs the dense logits). */
kdloss_status kdloss_cuda_fused_linear_topk_distill_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status s = fld_size_checks(kd_topk_check_fused_params(params), bt, hs, hs, v, k,
                                     student_dtype);
    if (s != KDLOSS_OK) return s;
    tk_plan P;
    s = tk_dense_plan(params, bt, hs, v, k, student_dtype, want_grad != 0, NULL, &P);
    if (s != KDLOSS_OK) return s;
    size_t total = P.total;
    if (tk_sparse_params(params, bt, k)) {
        if ((s = tk_sparse_plan(bt, hs, v, k, want_grad != 0, NULL, &P)) != KDLOSS_OK) return s;
        if (P.total > total) total = P.total;
    }
    *bytes = total;
    return KDLOSS_OK;
}

/* Shapes: xs (bt x hs), ws (v x hs), bs [v], teacher (bt rows of k), labels [bt] optional;
 * outputs per kdloss_fused_linear_distill_out; all device pointers, each with its own ld. */
kdloss_status kdloss_cuda_fused_linear_topk_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_fld_checked g;
    kd_spanset spans;
    kdloss_status s = kd_check_fltk(&kd_cuda_rules, params, bt, hs, v, xs, ws, bs, teacher, labels,
                                    out, &g, &spans);
    if (s != KDLOSS_OK) return s;
    const int sparse = tk_sparse_call(params, bt, teacher.k, out);
    tk_plan P;
    s = sparse ? tk_sparse_plan(bt, hs, v, teacher.k, g.want_grad, NULL, &P)
               : tk_dense_plan(params, bt, hs, v, teacher.k, xs.dtype, g.want_grad, NULL, &P);
    if (s != KDLOSS_OK) return s;
    if ((s = kd_check_fld_workspace(&kd_cuda_rules, workspace, workspace_bytes, P.total,
                                    &spans)) != KDLOSS_OK)
        return s;
    if (sparse) tk_sparse_plan(bt, hs, v, teacher.k, g.want_grad, workspace, &P);
    else tk_dense_plan(params, bt, hs, v, teacher.k, xs.dtype, g.want_grad, workspace, &P);

    tk_check_args c = tk_check_of(teacher, g.ld_ids, labels, params->ignore_index, bt, v, P);
    c.w = params->row_weights;
    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    s = tk_check_launch(st, c);
    if (s == KDLOSS_OK && sparse) {
        s = tk_run_sparse(st, params, bt, hs, v, xs, ws, bs, teacher, g, out, P);
    } else if (s == KDLOSS_OK) {
        const fld_grad_out G = fld_grad_out_of(params, g, out, P);
        const fld_gemms gm = {ctx, st, P.lt_ws, xs.dtype, xs.data, ws.data, g.ld_xs, g.ld_ws, hs,
                             v, P.zs, P.ldz};
        tk_row_args a;
        tk_row_common(&a, teacher, g.ld_lp, c, P);
        tk_row_fused(&a, params, out, labels.data != NULL, bs, P, g.want_grad && !G.zero_g);
        s = tk_run_dense(gm, G, bt, g, P, a, params);
    }
    if (s == KDLOSS_OK) {
        const double soft_fac = params->t2_scale ? params->temperature * params->temperature : 1.0;
        s = tk_final_launch(st, P.row_soft, P.row_hard, bt, P.hdr, out, params->weight_hard_loss,
                            params->weight_soft_loss, soft_fac, 1, params->row_weights);
    }
    kd_dev_leave(&dg);
    return s;
}
