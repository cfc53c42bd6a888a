/* The fused-linear distillation loss on the GPU (kdloss.h, kdloss_cuda_fused_linear_distill and
 * kdloss_cuda_fused_linear_jsd; docs/MATH.md section 4): the chunk loop's host side, the row
 * kernel and the small kernels around it. */
#include "fld_rows.cuh"

/* Per chunk of C rows, on the caller's stream:
 *   1. zs = xs[chunk] ws^T and zt = xt[chunk] wt^T  (cuBLASLt, fp32 output from the fp32
 *      accumulator: logits are never rounded to bf16 before the softmax)
 *   2. one row kernel (one block per row): biases, the three log-sum-exps, the JSD, the hard CE,
 *      per-row stats, and the logit gradient dzs written in place over zs (fp32, or bf16
 *      narrowed in place when the student is bf16, which the backward GEMMs need anyway)
 *   3. dxs[chunk] = dzs ws (cuBLASLt, output in xs's dtype, complete in one GEMM)
 *      dws (+)= dzs^T xs[chunk] into an fp32 accumulator (dws itself when fp32), cast once
 *      dbs (+)= column sums of dzs, fixed row order
 * n_valid is counted on the device before the first chunk; the row kernel reads it to scale
 * dzs, so the host never waits. The final losses come from a fixed-order reduction of per-row
 * stats. Everything runs on one stream: the row kernel is memory-bound and the GEMMs
 * compute-bound, so overlapping chunk i's row kernel with chunk i+1's GEMMs would pay, but it
 * needs a second pair of logit buffers (2 C V floats more) and cross-stream events; not done yet.
 *
 * Workspace (after the 256-byte header, each part 256-byte aligned):
 *   row_soft, row_hard [bt] double  per-row JSD and CE (0 on ignored rows, NaN on bad labels)
 *   lt_ws   32 MiB                  cuBLASLt / cuBLAS scratch
 *   zs, zt  (C x ldz) fp32 each     chunk logits, ldz = V rounded up to 64 (256-byte rows)
 *   dw_acc  (V x Hs) fp32           only for a bf16 student with gradients
 *   db_acc  [V] fp32                same
 *   xm      (C x Hs) student dtype  with gradients: the chunk's xs for the dws GEMM, the rows
 *                                   whose gradient is 0 (ignored) zeroed (fld_mask_rows)
 * C comes from chunk_size, or from memory_budget (0 = 256 MiB) over 2 ldz 4 bytes per row.
 * The steps shared with the other fused drivers (plan, GEMM steps, dzs, the chunk loop) are
 * fld_rows.cuh's. */

kdloss_status fld_plan_carve(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs,
                            int64_t v, kdloss_dtype sdt, int want_grad, int device,
                            kd_carver *cv, fld_plan *P) {
    /* bounds that keep every byte count below 2^62 */
    if (v > ((int64_t)1 << 40) || bt > ((int64_t)1 << 40) || hs > ((int64_t)1 << 40))
        return KDLOSS_ERR_INVALID_SIZE;
    const int64_t ldz = (v + 63) / 64 * 64;
    const uint64_t row_bytes = 2u * (uint64_t)ldz * sizeof(float);
    int64_t c;
    if (p->chunk_size > 0) {
        c = p->chunk_size < bt ? p->chunk_size : bt;
        if (c > ((int64_t)1 << 30)) c = (int64_t)1 << 30; /* one row block per row: grid limit */
    } else {
        uint64_t budget =
            p->memory_budget ? (uint64_t)p->memory_budget : kd_cuda_default_budget(device);
        int64_t cmax = (int64_t)(budget / row_bytes);
        if (cmax < 1) cmax = 1;
        if (cmax > bt) cmax = bt;
        if (cmax > ((int64_t)1 << 30)) cmax = (int64_t)1 << 30;
        /* equal chunks rather than a short last one; a multiple of 64 rows when that still fits
         * (GEMM tiles are 64 to 256 wide in that dimension) */
        int64_t nch = (bt + cmax - 1) / cmax;
        c = (bt + nch - 1) / nch;
        int64_t c64 = (c + 63) / 64 * 64;
        if (c > 64 && c64 <= cmax) c = c64;
    }
    if ((uint64_t)c > ((uint64_t)1 << 62) / row_bytes) return KDLOSS_ERR_INVALID_SIZE;
    if ((uint64_t)v * (uint64_t)hs > ((uint64_t)1 << 60)) return KDLOSS_ERR_INVALID_SIZE;

    P->chunk = c;
    P->ldz = ldz;
    P->row_soft = (double *)kd_carve(cv, (size_t)bt * sizeof(double));
    P->row_hard = (double *)kd_carve(cv, (size_t)bt * sizeof(double));
    P->lt_ws = kd_carve(cv, FLD_LT_WS_BYTES);
    P->zs = (float *)kd_carve(cv, (size_t)c * (size_t)ldz * sizeof(float));
    P->zt = (float *)kd_carve(cv, (size_t)c * (size_t)ldz * sizeof(float));
    P->dw_acc = NULL;
    P->db_acc = NULL;
    if (want_grad && sdt == KDLOSS_BF16) {
        P->dw_acc = (float *)kd_carve(cv, (size_t)v * (size_t)hs * sizeof(float));
        P->db_acc = (float *)kd_carve(cv, (size_t)v * sizeof(float));
    }
    P->xm = want_grad ? kd_carve(cv, (size_t)c * (size_t)hs * kdloss_dtype_size(sdt)) : NULL;
    P->only = (uint8_t *)kd_carve(cv, (size_t)c);
    return KDLOSS_OK;
}

static kdloss_status fld_plan_make(const kdloss_fused_linear_distill_params *p, int64_t bt,
                                  int64_t hs, int64_t v, kdloss_dtype sdt, int want_grad,
                                  int device, void *ws, fld_plan *P) {
    kd_carver cv = kd_carver_for(ws);
    kdloss_status s = fld_plan_carve(p, bt, hs, v, sdt, want_grad, device, &cv, P);
    P->hdr = (kd_ws_header *)ws;
    P->total = kd_ws_total(&cv);
    return s;
}

/* ---- the row kernel ------------------------------------------------------------------------ */

/* Pass 1 of fld_row_kernel: online log-sum-exps of zs / T (the divergence, and the cross-entropy
 * when T = 1), zt / T (the divergence) and zs (the cross-entropy when T != 1; else h = a). */
template <int DS, int DT>
__device__ __forceinline__ fld_lses fld_lse_pass(const fld_row_args &a, const float *zs,
                                               const float *zt, kd_lse *lred) {
    const int needA = fld_need_a(a), needH = fld_need_h(a);
    kd_lse sA = {-INFINITY, 0.0f}, sB = {-INFINITY, 0.0f}, sH = {-INFINITY, 0.0f};
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += FLD_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8];
        fld_load<DS>(zs, a.bs, c0, n, s);
        if (needH) kd_lse_add8(&sH, s, n);
        if (needA) {
            float u[8];
#pragma unroll
            for (int j = 0; j < 8; j++) u[j] = s[j] * a.inv_t;
            kd_lse_add8(&sA, u, n);
        }
        if (a.do_soft) {
            float t[8];
            fld_load<DT>(zt, a.bt, c0, n, t);
#pragma unroll
            for (int j = 0; j < 8; j++) t[j] *= a.inv_t;
            kd_lse_add8(&sB, t, n);
        }
    }
    fld_lses L;
    L.a = needA ? kd_block_lse(sA, lred) : 0.0f;
    L.b = a.do_soft ? kd_block_lse(sB, lred) : 0.0f;
    L.h = needH ? kd_block_lse(sH, lred) : L.a;
    return L;
}

/* Pass 2 of fld_row_kernel (the divergence wanted): the row's divergence (valid in thread 0) and,
 * when its gradient is wanted, *S = sum of g = dD/dX (every thread; else 0). Needs pass 1's
 * log-normalizers. */
template <int DS, int DT>
__device__ __forceinline__ double fld_soft_pass(const fld_row_args &a, const float *zs,
                                               const float *zt, const fld_lses &L, double *red,
                                               double *S) {
    float accl = 0.0f, accg = 0.0f;
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += FLD_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8], t[8];
        fld_load<DS>(zs, a.bs, c0, n, s);
        fld_load<DT>(zt, a.bt, c0, n, t);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float g;
            float l = kd_div_elem(&a.coef, s[j] * a.inv_t - L.a, t[j] * a.inv_t - L.b, &g);
            if (j < n) {
                accl += l;
                accg += g;
            }
        }
    }
    const double soft = kd_block_sum((double)accl, red);
    *S = a.grad_soft ? kd_block_sum_all((double)accg, red) : 0.0;
    return soft;
}

/* One block per row of the chunk (grid = C). DS: student dtype (student bias and dzs), DT:
 * teacher dtype (teacher bias). Passes over the row:
 *   1. online log-sum-exp of zs/T, zt/T and (T != 1, CE wanted) zs       (fld_lse_pass)
 *   2. the divergence and the row sum of g = dD/dX (needs the lse of pass 1) (fld_soft_pass)
 *   3. dzs = a (softmax(zs) - onehot(y)) + b (g - softmax(zs/T) sum(g)), with
 *      a = w_hard gs / n_valid and b = w_soft gs / (n_valid T)  (needs sum(g) of pass 2)
 * Pass 3 is fld_dz_pass (in place, tile by tile: fld_rows.cuh). A row whose label does not count
 * takes fld_skip_row, one whose tempered normalizer is NaN fld_special_row (fld_rows.cuh). */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fld_row_kernel(fld_row_args a) {
    __shared__ double red[32];
    __shared__ kd_lse lred[32];
    __shared__ float fred[32];
    const int64_t r = blockIdx.x;
    if (a.only) { /* after the slab kernel (fld_slab.cu): only the rows it left, flag cleared */
        const bool mine = a.only[r] != 0;
        __syncthreads(); /* every thread has read the flag before thread 0 clears it */
        if (!mine) return;
        if (threadIdx.x == 0) a.only[r] = 0;
    }
    const int64_t gr = a.row0 + r;
    float *zs = a.zs + r * a.ldz;
    const float *zt = a.zt ? a.zt + r * a.ldz : NULL;
    const int64_t y = kd_label(a.labels, a.lab64, gr);
    const int wk = kd_weight_kind(a.w, gr); /* weight 0: ignored; bad: as a bad label */
    if (!(y != a.ignore && y >= 0 && y < a.v) || wk != 0) { /* the whole block: zero dzs */
        fld_skip_row<DS>(a, (void *)zs, gr, wk == 2 || (y != a.ignore && (y < 0 || y >= a.v)));
        return;
    }
    /* the label's own logit (thread 0), read before pass 3 may overwrite it */
    float zy = 0.0f;
    if (threadIdx.x == 0 && a.do_hard) zy = zs[y] + (a.bs ? kd_ld<DS>(a.bs, y) : 0.0f);
    const fld_lses L = fld_lse_pass<DS, DT>(a, zs, zt, lred);
    if (a.out_ent) { /* before pass 3 overwrites the logits; a NaN normalizer: careful form */
        if (isnan(L.a)) fld_wide_ent<DS>(a, zs, gr, red, fred);
        else fld_ent_pass<DS>(a, zs, L.a, gr, red);
    }
    /* one test a row (the same in every thread): a NaN tempered normalizer (a NaN or +inf
     * logit, or z / T beyond fp32) takes the careful form. Wider rows need nothing more here:
     * this kernel forms z / T before subtracting the maximum, so z / T - lse overflows only
     * where the log-prob itself is beyond fp32 (it rounds to -inf, as the CPU's). */
    if (a.do_soft && (isnan(L.a) || isnan(L.b))) {
        fld_special_row<DS, DT>(a, zs, zt, y, gr, zy, red, fred);
        return;
    }
    double S = 0.0;
    const double soft = a.do_soft ? fld_soft_pass<DS, DT>(a, zs, zt, L, red, &S) : 0.0;
    fld_put_row(a, gr, soft, a.do_hard ? (double)(L.h - zy) : 0.0, a.do_hard ? L.h : 0.0f);
    if (!a.do_grad) return;
    float ca, cb; /* pass 3: dzs in place */
    fld_factors(a, &ca, &cb);
    fld_weigh(a, gr, &ca, &cb);
    const float Sf = (float)S;
    fld_dz_pass<DS, DT>(a, zs, zt, a.grad_soft, [&](int64_t c, float s, float t) {
        return fld_dz(a, ca, cb, s, L.h, c == y, s * a.inv_t - L.a, t * a.inv_t - L.b, Sf);
    });
}

/* ---- small kernels ------------------------------------------------------------------------- */

#define FLD_FINAL_THREADS 1024

/* row_soft, row_hard [bt], w [bt] (NULL: 1) -> the three scalar losses (one block, fixed
 * order; the weighted sums of docs/MATH.md 12.1) and the status: a bad label's code, else a bad
 * weight's (INVALID_PARAM; the CPU checks the labels first). */
__global__ void __launch_bounds__(FLD_FINAL_THREADS)
fld_final_kernel(const double *row_soft, const double *row_hard, int64_t bt, kd_ws_header *hdr,
                float *loss, float *soft_loss, float *hard_loss, double w_hard, double w_soft,
                double soft_fac, const float *w) {
    __shared__ double red[32];
    double s = 0.0, h = 0.0;
    for (int64_t i = threadIdx.x; i < bt; i += blockDim.x) {
        s += w ? row_soft[i] * (double)w[i] : row_soft[i];
        h += w ? row_hard[i] * (double)w[i] : row_hard[i];
    }
    s = kd_block_sum(s, red);
    h = kd_block_sum(h, red);
    if (threadIdx.x == 0) {
        const int bad_label = hdr->n_bad > 0, bad = bad_label || hdr->n_bad_w > 0;
        const double n = hdr->n_valid > 0 ? (double)hdr->n_valid : 1.0;
        const float qnan = __int_as_float(0x7fc00000);
        const double sl = s * soft_fac / n, hl = h / n;
        if (loss) *loss = bad ? qnan : (float)(w_hard * hl + w_soft * sl);
        if (soft_loss) *soft_loss = bad ? qnan : (float)sl;
        if (hard_loss) *hard_loss = bad ? qnan : (float)hl;
        hdr->status = bad_label ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE
                      : bad     ? (int32_t)KDLOSS_ERR_INVALID_PARAM
                                : (int32_t)KDLOSS_OK;
    }
}

kdloss_status fld_final(cudaStream_t st, const fld_plan &P, int64_t bt,
                       const kdloss_fused_linear_distill_out *out,
                       const kdloss_fused_linear_distill_params *p) {
    const double soft_fac = p->t2_scale ? p->temperature * p->temperature : 1.0;
    KD_LAUNCH(1, FLD_FINAL_THREADS, 0, st, fld_final_kernel)(
        P.row_soft, P.row_hard, bt, P.hdr, out->loss, out->soft_loss, out->hard_loss,
        p->weight_hard_loss, p->weight_soft_loss, soft_fac, p->row_weights);
    return kd_launch_status();
}

/* ---- the heads' logit maps (fld_rows.cuh) ---------------------------------------------------- */

/* One block per row: z = map(z + bias), the mapped logits every later pass reads. */
template <int DB>
__global__ void __launch_bounds__(256)
fld_map_kernel(float *z, int64_t ldz, int64_t v, const void *bias, kd_logit_map m) {
    float *row = z + (int64_t)blockIdx.x * ldz;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x)
        row[c] = kd_map_z(&m, bias ? row[c] + kd_ld<DB>(bias, c) : row[c]);
}

kdloss_status fld_map_rows(cudaStream_t st, float *z, int64_t ldz, int64_t rows, int64_t v,
                          const void *bias, kdloss_dtype bdt, const kd_logit_map &m) {
    if (!m.on || !z || rows <= 0) return KDLOSS_OK;
    return fld_bias_map_rows(st, z, ldz, rows, v, bias, bdt, m);
}

kdloss_status fld_bias_map_rows(cudaStream_t st, float *z, int64_t ldz, int64_t rows, int64_t v,
                               const void *bias, kdloss_dtype bdt, const kd_logit_map &m) {
    if ((!m.on && !bias) || !z || rows <= 0) return KDLOSS_OK; /* the identity: kd_map_z exact */
    const unsigned grid = kd_grid(rows);
    if (bdt == KDLOSS_BF16)
        KD_LAUNCH(grid, 256, 0, st, fld_map_kernel<KDLOSS_BF16>)(z, ldz, v, bias, m);
    else
        KD_LAUNCH(grid, 256, 0, st, fld_map_kernel<KDLOSS_F32>)(z, ldz, v, bias, m);
    return kd_launch_status();
}

/* ---- the per-chunk GEMM steps (fld_rows.cuh) ------------------------------------------------- */

kdloss_status fld_chunk_logits(const fld_gemms *g, int64_t r0, int64_t rows, float *zs,
                              kdloss_cmat xt, kdloss_cmat wt, int64_t ht, float *zt) {
    const size_t es = kdloss_dtype_size(g->sdt);
    const char *xs_c = (const char *)g->xs + (size_t)(r0 * g->ld_xs) * es;
    /* zs^T (v x rows, ldz) = ws (hs x v col-major)^T  xs_c (hs x rows col-major) */
    kdloss_status s = kd_gemm(g->ctx, g->st, g->lt_ws, FLD_LT_WS_BYTES, CUBLAS_OP_T, CUBLAS_OP_N,
                              g->v, rows, g->hs, g->ws, fld_cuda_type(g->sdt), g->ld_ws, xs_c,
                              fld_cuda_type(g->sdt), g->ld_xs, 0.0f, zs, CUDA_R_32F, g->ldz);
    if (s != KDLOSS_OK || !wt.data) return s;
    return fld_teacher_gemm(g, r0, rows, xt, wt, ht, zt);
}

kdloss_status fld_teacher_gemm(const fld_gemms *g, int64_t r0, int64_t rows, kdloss_cmat xt,
                              kdloss_cmat wt, int64_t ht, float *zt) {
    /* zt^T (v x rows, ldz) = wt (ht x v col-major)^T  xt_c (ht x rows col-major) */
    const char *xt_c = (const char *)xt.data + (size_t)(r0 * xt.ld) * kdloss_dtype_size(xt.dtype);
    return kd_gemm(g->ctx, g->st, g->lt_ws, FLD_LT_WS_BYTES, CUBLAS_OP_T, CUBLAS_OP_N, g->v, rows,
                   ht, wt.data, fld_cuda_type(wt.dtype), wt.ld, xt_c, fld_cuda_type(xt.dtype),
                   xt.ld, 0.0f, zt, CUDA_R_32F, g->ldz);
}

/* dzs in the student dtype, in place over zs: the row pitch in elements of that dtype. */
static int64_t fld_dz_pitch(const fld_gemms *g) {
    return g->sdt == KDLOSS_BF16 ? 2 * g->ldz : g->ldz;
}

kdloss_status fld_chunk_dx(const fld_gemms *g, int64_t rows, void *dx, cudaDataType_t dxt,
                          int64_t ld_dx) {
    /* dx^T (hs x rows, ld_dx) = ws (hs x v col-major)  dzs^T (v x rows, dz pitch) */
    return kd_gemm(g->ctx, g->st, g->lt_ws, FLD_LT_WS_BYTES, CUBLAS_OP_N, CUBLAS_OP_N, g->hs, rows,
                   g->v, g->ws, fld_cuda_type(g->sdt), g->ld_ws, g->zs, fld_cuda_type(g->sdt),
                   fld_dz_pitch(g), 0.0f, dx, dxt, ld_dx);
}

kdloss_status fld_chunk_wgrad(const fld_gemms *g, int64_t r0, int64_t rows,
                             const kdloss_fused_linear_distill_out *out, int64_t ld_dws,
                             float *dw_acc, float *db_acc, const void *xm) {
    const int first = r0 == 0, bf = g->sdt == KDLOSS_BF16;
    const int64_t pitch = fld_dz_pitch(g), ld_dw = bf ? g->hs : ld_dws;
    float *dw = !out->dws.data ? NULL : bf ? dw_acc : (float *)out->dws.data;
    float *db = !out->dbs ? NULL : bf ? db_acc : (float *)out->dbs;
    kdloss_status s = KDLOSS_OK;
    if (dw) {
        /* dws^T (hs x v) (+)= xs_c (hs x rows col-major)  (dzs^T (v x rows))^T */
        const char *xs_c = (const char *)g->xs + (size_t)(r0 * g->ld_xs) * kdloss_dtype_size(g->sdt);
        s = kd_gemm(g->ctx, g->st, g->lt_ws, FLD_LT_WS_BYTES, CUBLAS_OP_N, CUBLAS_OP_T, g->hs,
                    g->v, rows, xm ? xm : (const void *)xs_c, fld_cuda_type(g->sdt),
                    xm ? g->hs : g->ld_xs, g->zs, fld_cuda_type(g->sdt), pitch,
                    first ? 0.0f : 1.0f, dw, CUDA_R_32F, ld_dw);
    }
    if (s != KDLOSS_OK || !db) return s;
    if (g->sdt == KDLOSS_BF16)
        KD_LAUNCH(kd_grid_1d(g->v, 256), 256, 0, g->st, kd_colsum_kernel<KDLOSS_BF16>)(
            g->zs, pitch, rows, g->v, db, first);
    else
        KD_LAUNCH(kd_grid_1d(g->v, 256), 256, 0, g->st, kd_colsum_kernel<KDLOSS_F32>)(
            g->zs, pitch, rows, g->v, db, first);
    return kd_launch_status();
}

/* One block per chunk row (grid-stride), threads over its hidden columns: the row of xs (raw
 * elements E, 4 or 2 bytes: a copy, not a conversion), or zeros where the mask names the row. */
template <typename E>
static __global__ void __launch_bounds__(256)
fld_mask_kernel(fld_mask m, const void *xs, int64_t ld_xs, int64_t r0, int64_t rows, int64_t hs,
               void *xm) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t gr = r0 + r;
        bool zero = false;
        if (m.flags) {
            zero = m.flags[gr] != 0;
        } else if (m.labels) {
            const int64_t y = kd_label(m.labels, m.lab64, gr);
            zero = y == m.ignore || y < 0 || y >= m.v_total;
        }
        zero = zero || kd_weight_kind(m.w, gr) != 0; /* weight 0 or bad: dz 0 */
        if (!zero && m.ids) { /* the same slots in every thread: broadcast loads */
            bool used = false;
            for (int64_t j = 0; !used && j < m.k; j++) /* kd_topk_id (topk_row.h) */
                used = (m.ids64 ? ((const int64_t *)m.ids)[gr * m.ld_ids + j]
                                : (int64_t)((const int32_t *)m.ids)[gr * m.ld_ids + j]) >= 0;
            zero = !used;
        }
        const E *x = (const E *)xs + gr * ld_xs;
        E *o = (E *)xm + r * hs;
        for (int64_t h = threadIdx.x; h < hs; h += blockDim.x) o[h] = zero ? (E)0 : x[h];
    }
}

kdloss_status fld_mask_rows(const fld_gemms *g, const fld_mask *m, int64_t r0, int64_t rows,
                           void *xm) {
    const unsigned grid = kd_grid(rows > 65536 ? 65536 : rows);
    if (g->sdt == KDLOSS_BF16)
        KD_LAUNCH(grid, 256, 0, g->st, fld_mask_kernel<uint16_t>)(*m, g->xs, g->ld_xs, r0, rows,
                                                                 g->hs, xm);
    else
        KD_LAUNCH(grid, 256, 0, g->st, fld_mask_kernel<uint32_t>)(*m, g->xs, g->ld_xs, r0, rows,
                                                                 g->hs, xm);
    return kd_launch_status();
}

/* rows x cols 2-byte units at out (pitch units between rows) = 0: +0 is all-zero bits in fp32
 * and bf16. */
static __global__ void __launch_bounds__(256)
fld_zero_kernel(uint16_t *out, int64_t pitch, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols;
        out[r * pitch + (i - r * cols)] = 0;
    }
}

kdloss_status fld_zero_grads(cudaStream_t st, const kdloss_fused_linear_distill_out *out,
                            int64_t ld_dxs, int64_t ld_dws, int64_t bt, int64_t hs, int64_t v,
                            kdloss_dtype sdt) {
    const int64_t u = (int64_t)kdloss_dtype_size(sdt) / 2; /* 2-byte units an element */
    struct { void *p; int64_t ld, rows, cols; } m[3] = {{out->dxs.data, ld_dxs, bt, hs},
                                                       {out->dws.data, ld_dws, v, hs},
                                                       {out->dbs, v, 1, v}};
    for (int i = 0; i < 3; i++) {
        if (!m[i].p) continue;
        KD_LAUNCH(kd_grid_1d(m[i].rows * m[i].cols * u, 256), 256, 0, st, fld_zero_kernel)(
            (uint16_t *)m[i].p, m[i].ld * u, m[i].rows, m[i].cols * u);
        const kdloss_status s = kd_launch_status();
        if (s != KDLOSS_OK) return s;
    }
    return KDLOSS_OK;
}

kdloss_status fld_cast_wgrad(cudaStream_t st, const float *dw_acc, const float *db_acc,
                            const kdloss_fused_linear_distill_out *out, int64_t ld_dws,
                            int64_t hs, int64_t v) {
    if (out->dws.data) {
        kd_cast_launch<KDLOSS_BF16>(st, dw_acc, hs, out->dws.data, ld_dws, v, hs);
        kdloss_status s = kd_launch_status();
        if (s != KDLOSS_OK) return s;
    }
    if (!out->dbs) return KDLOSS_OK;
    kd_cast_launch<KDLOSS_BF16>(st, db_acc, v, out->dbs, v, 1, v);
    return kd_launch_status();
}

/* ---- host side ----------------------------------------------------------------------------- */

static void fld_row_launch(kdloss_dtype ds, kdloss_dtype dt, int64_t rows, const fld_row_args &a,
                          cudaStream_t st) {
    const unsigned grid = kd_grid(rows);
    if (ds == KDLOSS_BF16) {
        if (dt == KDLOSS_BF16)
            KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fld_row_kernel<KDLOSS_BF16, KDLOSS_BF16>)(a);
        else
            KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fld_row_kernel<KDLOSS_BF16, KDLOSS_F32>)(a);
    } else {
        if (dt == KDLOSS_BF16)
            KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fld_row_kernel<KDLOSS_F32, KDLOSS_BF16>)(a);
        else
            KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fld_row_kernel<KDLOSS_F32, KDLOSS_F32>)(a);
    }
}

kdloss_status kdloss_cuda_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status s = fld_size_checks(kd_check_fld_params(&kd_cuda_rules, params), bt, hs, ht, v,
                                      1, student_dtype);
    fld_plan P;
    if (s == KDLOSS_OK)
        s = fld_plan_make(params, bt, hs, v, student_dtype, want_grad != 0, -1, NULL, &P);
    if (s == KDLOSS_OK) *bytes = P.total;
    return s;
}

kdloss_status fld_size_checks(kdloss_status st, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                             int64_t k, kdloss_dtype sdt) {
    if (st == KDLOSS_OK) st = kd_fld_check_sizes(bt, hs, ht, v);
    if (st == KDLOSS_OK && k < 1) st = KDLOSS_ERR_INVALID_SIZE;
    if (st != KDLOSS_OK) return st;
    return sdt == KDLOSS_F32 || sdt == KDLOSS_BF16 ? KDLOSS_OK : KDLOSS_ERR_INVALID_DTYPE;
}

void fld_row_setup(fld_row_args *a, const kdloss_fused_linear_distill_params *p,
                  const kdloss_fused_linear_distill_out *out, const fld_plan &P, const void *bs,
                  const void *bt_bias, kdloss_labels labels, int64_t v, int want_grad) {
    /* "0 skips all cross-entropy work": the CE runs only if it is weighted or asked for; the
     * same for the divergence and its teacher GEMM */
    const int do_hard = p->weight_hard_loss > 0.0 || out->hard_loss || out->row_hard ||
                        out->row_lse;
    const int do_soft = p->weight_soft_loss > 0.0 || out->soft_loss || out->row_soft;
    a->zs = P.zs;
    a->zt = do_soft ? P.zt : NULL;
    a->ldz = P.ldz;
    a->map_s = kd_logit_map_make(p->student_map);
    a->map_t = kd_logit_map_make(p->teacher_map);
    a->map_bs = bs;
    a->map_bt = bt_bias;
    a->bs = a->map_s.on ? NULL : bs; /* a mapped head's bias is added by fld_map_rows */
    a->bt = a->map_t.on ? NULL : bt_bias;
    a->labels = labels.data;
    a->lab64 = labels.dtype == KDLOSS_I64;
    a->ignore = p->ignore_index;
    a->row0 = 0;
    a->v = v;
    a->inv_t = (float)(1.0 / p->temperature);
    a->same_t = p->temperature == 1.0;
    a->coef = kd_div_coef_make(&p->div);
    a->do_soft = do_soft;
    a->do_hard = do_hard;
    a->do_grad = want_grad;
    fld_grad_fields(a, p, out, want_grad);
    a->hdr = P.hdr;
    a->row_soft = P.row_soft;
    a->row_hard = P.row_hard;
    a->only = NULL;
    a->w = p->row_weights;
    a->out_ent = out->row_entropy;
}

/* zt (rows x v, ldz) for the chunk's rows [r0, r0 + rows) with several teachers (docs/MATH.md
 * section 13): one GEMM per run of rows that share a head (the index is host memory), then that
 * run's bias and the teacher's logit map in one pass (fld_bias_map_rows): the row kernels then
 * see mapped logits and no teacher bias, as with one mapped head. */
static kdloss_status fld_heads_logits(const fld_gemms &gm, const fld_heads &H, int64_t r0,
                                     int64_t rows, kdloss_cmat xt, int64_t ht, float *zt,
                                     const kd_logit_map &m) {
    kdloss_status s = KDLOSS_OK;
    for (int64_t i0 = 0, i1; i0 < rows && s == KDLOSS_OK; i0 = i1) {
        const int32_t j = H.index[r0 + i0];
        for (i1 = i0 + 1; i1 < rows && H.index[r0 + i1] == j;) i1++;
        float *z = zt + i0 * gm.ldz;
        s = fld_teacher_gemm(&gm, r0 + i0, i1 - i0, xt, H.wt[j], ht, z);
        if (s == KDLOSS_OK)
            s = fld_bias_map_rows(gm.st, z, gm.ldz, i1 - i0, gm.v, H.bias ? H.bias[j] : NULL,
                                  H.wt[j].dtype, m);
    }
    return s;
}

/* One chunk: its logits (one teacher head, or several: H), the row kernels (the slab kernel
 * where the device has clusters, then fld_row_kernel on the rows it left; else fld_row_kernel
 * alone), its backward (fld_chunk_backward). */
static kdloss_status fld_chunk(const fld_gemms &gm, const fld_grad_out &G, kdloss_cmat xt,
                              kdloss_cmat wt, const fld_heads *H, int64_t ht, const fld_plan &P,
                              const fld_slab &sl, fld_row_args &a, int64_t r0, int64_t rows) {
    const kdloss_cmat none = {NULL, KDLOSS_F32, 0};
    kdloss_status s = fld_chunk_logits(&gm, r0, rows, P.zs, xt, a.zt && !H ? wt : none, ht, P.zt);
    if (s == KDLOSS_OK) s = fld_map_rows(gm.st, P.zs, P.ldz, rows, a.v, a.map_bs, gm.sdt, a.map_s);
    if (s == KDLOSS_OK && a.zt && H)
        s = fld_heads_logits(gm, *H, r0, rows, xt, ht, P.zt, a.map_t);
    else if (s == KDLOSS_OK && a.zt)
        s = fld_map_rows(gm.st, P.zt, P.ldz, rows, a.v, a.map_bt, xt.dtype, a.map_t);
    if (s != KDLOSS_OK) return s;
    a.row0 = r0;
    a.only = sl.blocks ? P.only : NULL;
    if (sl.blocks && (s = fld_slab_launch(gm.sdt, xt.dtype, rows, a, sl, gm.st)) != KDLOSS_OK)
        return s;
    fld_row_launch(gm.sdt, xt.dtype, rows, a, gm.st);
    if ((s = kd_launch_status()) != KDLOSS_OK) return s;
    const fld_mask m = {a.labels, a.lab64, a.ignore, a.v, NULL, NULL, 0, 0, 0, a.w}; /* the rules */
    return fld_chunk_backward(gm, G, m, r0, rows, [&] {
        return fld_chunk_dx(&gm, rows, fld_dxs_at(G, r0, gm.sdt), fld_cuda_type(gm.sdt), G.ld_dxs);
    });
}

kdloss_status fld_dense_run(const fld_dense_call &c, const kd_fld_checked &g,
                           const kd_spanset *spans, int64_t n_spans) {
    const kdloss_fused_linear_distill_params *params = c.params;
    const kdloss_cmat xs = c.xs, ws = c.ws, xt = c.xt, wt = c.wt;
    fld_plan P;
    const int dev = c.ctx->device;
    kdloss_status s = fld_plan_make(params, c.bt, c.hs, c.v, xs.dtype, g.want_grad, dev, NULL, &P);
    for (int64_t i = 0; s == KDLOSS_OK && i < n_spans; i++)
        s = kd_check_fld_workspace(&kd_cuda_rules, c.workspace, c.workspace_bytes, P.total,
                                   &spans[i]);
    if (s != KDLOSS_OK) return s;
    fld_plan_make(params, c.bt, c.hs, c.v, xs.dtype, g.want_grad, dev, c.workspace, &P);

    const fld_grad_out G = fld_grad_out_of(params, g, c.out, P);
    fld_row_args a;
    fld_row_setup(&a, params, c.out, P, c.bs, c.heads ? NULL : c.bt_bias, c.labels, c.v,
                  g.want_grad && !G.zero_g);
    kd_dev_guard dg;
    if ((s = kd_dev_enter(c.ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)c.stream;
    const fld_gemms gm = {c.ctx, st, P.lt_ws, xs.dtype, xs.data, ws.data, g.ld_xs, g.ld_ws, c.hs,
                         c.v, P.zs, P.ldz};
    const kdloss_cmat xt_e = {xt.data, xt.dtype, g.ld_xt}, wt_e = {wt.data, wt.dtype, g.ld_wt};
    s = kd_cuda_count_rows(st, c.labels.data, a.lab64, c.bt, c.v, params->ignore_index, a.w,
                           P.hdr);
    /* the entropy: fld_row_kernel alone (the slab kernel does not form it) */
    const fld_slab sl = a.out_ent ? fld_slab{0, 0, 0} : fld_slab_shape(c.ctx, c.v, a.do_soft);
    if (s == KDLOSS_OK && sl.blocks)
        s = kd_cuda_status(cudaMemsetAsync(P.only, 0, (size_t)P.chunk, st));
    s = fld_for_chunks(s, c.bt, P.chunk, [&](int64_t r0, int64_t rows) {
        return fld_chunk(gm, G, xt_e, wt_e, c.heads, c.ht, P, sl, a, r0, rows);
    });
    if (s == KDLOSS_OK) s = fld_end_grads(gm, G, c.bt);
    if (s == KDLOSS_OK) s = fld_final(st, P, c.bt, c.out, params);
    kd_dev_leave(&dg);
    return s;
}

/* Shapes: xs (bt x hs), ws (v x hs), bs [v], xt (bt x ht), wt (v x ht), bt_bias [v], labels [bt];
 * outputs per kdloss_fljsd_out; all device pointers, each matrix with its own ld. */
kdloss_status kdloss_cuda_fused_linear_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_fld_checked g;
    kd_spanset spans;
    const kd_fld_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    kdloss_status s = kd_check_fld(&kd_cuda_rules, params, bt, hs, v, v, xs, ws, bs, &t, labels,
                                  out, &g, &spans);
    if (s != KDLOSS_OK) return s;
    const fld_dense_call c = {ctx, stream, params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias,
                              NULL, labels, out, workspace, workspace_bytes};
    return fld_dense_run(c, g, &spans, 1);
}

/* The JSD-only names: wrappers (divergence JSD(beta), no T^2, no row outputs). */
kdloss_status kdloss_cuda_fljsd_workspace_size(const kdloss_fljsd_params *params, int64_t bt,
                                               int64_t hs, int64_t ht, int64_t v,
                                               kdloss_dtype student_dtype, int want_grad,
                                               size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_fused_linear_distill_params p = kd_fld_from_jsd(params);
    return kdloss_cuda_fused_linear_distill_workspace_size(&p, bt, hs, ht, v, student_dtype,
                                                           want_grad, bytes);
}

kdloss_status kdloss_cuda_fused_linear_jsd(kdloss_cuda_context *ctx, void *stream,
                                           const kdloss_fljsd_params *params, int64_t bt,
                                           int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs,
                                           kdloss_cmat ws, const void *bs, kdloss_cmat xt,
                                           kdloss_cmat wt, const void *bt_bias,
                                           kdloss_labels labels, kdloss_fljsd_out *out,
                                           void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !out) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_fused_linear_distill_params p = kd_fld_from_jsd(params);
    kdloss_fused_linear_distill_out o = kd_fld_out_from_jsd(out);
    return kdloss_cuda_fused_linear_distill(ctx, stream, &p, bt, hs, ht, v, xs, ws, bs, xt, wt,
                                            bt_bias, labels, &o, workspace, workspace_bytes);
}
