/* Chunked fused-linear JSD distillation loss on the GPU (kdloss.h, kdloss_fused_linear_jsd;
 * docs/MATH.md section 4). Per chunk of C rows, on the caller's stream:
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
 * C comes from chunk_size, or from memory_budget (0 = 256 MiB) over 2 ldz 4 bytes per row. */
#include "args.h"
#include "div_math.h"
#include "kd_cuda.cuh"

#define FL_ROW_THREADS 512
#define FL_TILE (FL_ROW_THREADS * 8)
#define FL_LT_WS_BYTES ((size_t)32 << 20)
#define FL_DEFAULT_BUDGET ((size_t)256 << 20)

typedef struct fl_plan {
    int64_t chunk; /* rows per chunk */
    int64_t ldz;   /* row stride of zs and zt, in floats */
    kd_ws_header *hdr;
    double *row_soft, *row_hard;
    void *lt_ws;
    float *zs, *zt;
    float *dw_acc, *db_acc;
    size_t total;
} fl_plan;

static kdloss_status fl_plan_make(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs, int64_t v,
                                  kdloss_dtype sdt, int want_grad, void *ws, fl_plan *P) {
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
        uint64_t budget = p->memory_budget ? (uint64_t)p->memory_budget : FL_DEFAULT_BUDGET;
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

    kd_carver cv = kd_carver_for(ws);
    P->chunk = c;
    P->ldz = ldz;
    P->hdr = (kd_ws_header *)ws;
    P->row_soft = (double *)kd_carve(&cv, (size_t)bt * sizeof(double));
    P->row_hard = (double *)kd_carve(&cv, (size_t)bt * sizeof(double));
    P->lt_ws = kd_carve(&cv, FL_LT_WS_BYTES);
    P->zs = (float *)kd_carve(&cv, (size_t)c * (size_t)ldz * sizeof(float));
    P->zt = (float *)kd_carve(&cv, (size_t)c * (size_t)ldz * sizeof(float));
    P->dw_acc = NULL;
    P->db_acc = NULL;
    if (want_grad && sdt == KDLOSS_BF16) {
        P->dw_acc = (float *)kd_carve(&cv, (size_t)v * (size_t)hs * sizeof(float));
        P->db_acc = (float *)kd_carve(&cv, (size_t)v * sizeof(float));
    }
    P->total = kd_ws_total(&cv);
    return KDLOSS_OK;
}

/* ---- the row kernel ------------------------------------------------------------------------ */

typedef struct fl_row_args {
    float *zs;            /* (C x ldz) student logits of the chunk; dzs overwrites them */
    const float *zt;      /* (C x ldz) teacher logits, NULL when the soft loss is skipped */
    int64_t ldz;
    const void *bs, *bt;  /* [v] biases in the student / teacher dtype, or NULL */
    const void *labels;   /* [bt], global row index */
    int lab64;
    int64_t ignore;
    int64_t row0;         /* global index of the chunk's first row */
    int64_t v;
    float inv_t;          /* 1 / temperature */
    int same_t;           /* temperature == 1: tempered and plain student softmax coincide */
    kd_div_coef coef;     /* the divergence's element operation (div_coef.h) */
    int do_soft, do_hard; /* compute the divergence / the CE at all */
    int do_grad;          /* write dzs (zeros when both weights are 0: the GEMMs still read it) */
    int grad_soft, grad_hard; /* its terms: weight > 0 and gradients wanted */
    double w_hard, w_soft, grad_scale, temperature;
    double soft_fac;      /* T^2 with t2_scale, else 1: the soft part's factor */
    const kd_ws_header *hdr; /* n_valid, counted before the first chunk */
    double *row_soft, *row_hard; /* [bt] */
    float *out_soft, *out_hard, *out_lse; /* [bt] caller's per-row outputs, or NULL */
} fl_row_args;

/* Logits c0..c0+n-1 of one row plus bias (dtype DB), fp32. Rows of z are 256-byte aligned and
 * c0 is a multiple of 8, so full groups are two 16-byte loads. */
template <int DB>
__device__ __forceinline__ void fl_load(const float *z, const void *bias, int64_t c0, int n,
                                        float out[8]) {
    if (n == 8) {
        kd_ld8<KDLOSS_F32>(z, c0, out);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) out[j] = j < n ? z[c0 + j] : 0.0f;
    }
    if (bias) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n) out[j] += kd_ld<DB>(bias, c0 + j);
    }
}

/* One block per row of the chunk (grid = C). DS: student dtype (student bias and dzs), DT:
 * teacher dtype (teacher bias). Passes over the row:
 *   1. online log-sum-exp of zs/T, zt/T and (T != 1, CE wanted) zs
 *   2. JSD terms and the row sum of g = dJSD/dX (needs the lse of pass 1)
 *   3. dzs = a (softmax(zs) - onehot(y)) + b (g - softmax(zs/T) sum(g)), with
 *      a = w_hard gs / n_valid and b = w_soft gs / (n_valid T)  (needs sum(g) of pass 2)
 * Pass 3 goes tile by tile with a barrier between the tile's loads and its stores: a bf16 dzs
 * row occupies the first half of the fp32 zs row, so the stores of tile k land on fp32 elements
 * below (k+1) FL_TILE / 2, which every thread has read by the barrier of tile k. */
template <int DS, int DT>
__global__ void __launch_bounds__(FL_ROW_THREADS) fl_row_kernel(fl_row_args a) {
    __shared__ double red[32];
    __shared__ kd_lse lred[32];
    const int tid = threadIdx.x;
    const int64_t r = blockIdx.x;
    const int64_t gr = a.row0 + r;
    float *zs = a.zs + r * a.ldz;
    const float *zt = a.zt ? a.zt + r * a.ldz : NULL;
    /* dzs row: same start as the zs row; element c at index c in dtype DS */
    void *dz = (void *)zs;
    const int64_t y = kd_label(a.labels, a.lab64, gr);
    const int valid = y != a.ignore && y >= 0 && y < a.v;

    if (!valid) { /* whole block takes this branch: zero gradient, stats 0 (ignored) or NaN */
        if (a.do_grad) {
            const float z8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int64_t c0 = (int64_t)tid * 8; c0 < a.v; c0 += FL_TILE) {
                if (c0 + 8 <= a.v) {
                    kd_st8<DS>(dz, c0, z8);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (c0 + j < a.v) kd_st<DS>(dz, c0 + j, 0.0f);
                }
            }
        }
        if (tid == 0) {
            double z = y == a.ignore ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
            a.row_soft[gr] = z;
            a.row_hard[gr] = z;
            /* the caller's row outputs too: 0 on ignored rows (kdloss.h), NaN on bad labels */
            if (a.out_soft) a.out_soft[gr] = (float)z;
            if (a.out_hard) a.out_hard[gr] = (float)z;
            if (a.out_lse) a.out_lse[gr] = (float)z;
        }
        return;
    }

    /* ---- pass 1: log-sum-exps ---- */
    const int needA = a.do_soft || (a.do_hard && a.same_t);
    const int needH = a.do_hard && !a.same_t;
    kd_lse sA = {-INFINITY, 0.0f}, sB = {-INFINITY, 0.0f}, sH = {-INFINITY, 0.0f};
    for (int64_t c0 = (int64_t)tid * 8; c0 < a.v; c0 += FL_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8];
        fl_load<DS>(zs, a.bs, c0, n, s);
        if (needH) kd_lse_add8(&sH, s, n);
        if (needA) {
            float u[8];
#pragma unroll
            for (int j = 0; j < 8; j++) u[j] = s[j] * a.inv_t;
            kd_lse_add8(&sA, u, n);
        }
        if (a.do_soft) {
            float t[8];
            fl_load<DT>(zt, a.bt, c0, n, t);
#pragma unroll
            for (int j = 0; j < 8; j++) t[j] *= a.inv_t;
            kd_lse_add8(&sB, t, n);
        }
    }
    /* the label's own logit, read before pass 3 may overwrite it */
    float zy = 0.0f;
    if (tid == 0 && a.do_hard) zy = zs[y] + (a.bs ? kd_ld<DS>(a.bs, y) : 0.0f);
    const float lseA = needA ? kd_block_lse(sA, lred) : 0.0f;
    const float lseB = a.do_soft ? kd_block_lse(sB, lred) : 0.0f;
    const float lseH = needH ? kd_block_lse(sH, lred) : lseA;

    /* ---- pass 2: JSD and sum of its gradient ---- */
    double S = 0.0, soft = 0.0;
    if (a.do_soft) {
        float accl = 0.0f, accg = 0.0f;
        for (int64_t c0 = (int64_t)tid * 8; c0 < a.v; c0 += FL_TILE) {
            const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
            float s[8], t[8];
            fl_load<DS>(zs, a.bs, c0, n, s);
            fl_load<DT>(zt, a.bt, c0, n, t);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float g;
                float l = kd_div_elem(&a.coef, s[j] * a.inv_t - lseA, t[j] * a.inv_t - lseB, &g);
                if (j < n) {
                    accl += l;
                    accg += g;
                }
            }
        }
        soft = kd_block_sum((double)accl, red);
        if (a.grad_soft) S = kd_block_sum_all((double)accg, red);
    }
    if (tid == 0) {
        a.row_soft[gr] = a.do_soft ? soft : 0.0;
        a.row_hard[gr] = a.do_hard ? (double)(lseH - zy) : 0.0;
        if (a.out_soft) a.out_soft[gr] = (float)a.row_soft[gr];
        if (a.out_hard) a.out_hard[gr] = (float)a.row_hard[gr];
        if (a.out_lse) a.out_lse[gr] = a.do_hard ? lseH : 0.0f;
    }

    /* ---- pass 3: dzs in place ---- */
    if (!a.do_grad) return;
    const unsigned long long nv = a.hdr->n_valid;
    const double nvd = nv > 0 ? (double)nv : 1.0;
    const float ca = (float)(a.w_hard * a.grad_scale / nvd);
    const float cb = (float)(a.w_soft * a.grad_scale * a.soft_fac / (nvd * a.temperature));
    const float Sf = (float)S;
    for (int64_t tile0 = 0; tile0 < a.v; tile0 += FL_TILE) { /* same trip count in every thread */
        const int64_t c0 = tile0 + (int64_t)tid * 8;
        const int n = c0 >= a.v ? 0 : a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8], t[8];
        if (n > 0) {
            fl_load<DS>(zs, a.bs, c0, n, s);
            if (a.grad_soft) fl_load<DT>(zt, a.bt, c0, n, t);
        }
        __syncthreads(); /* every load of this tile precedes any store that narrows over it */
        if (n > 0) {
            float d[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float dzj = 0.0f;
                if (a.grad_hard) dzj = ca * (expf(s[j] - lseH) - (c0 + j == y ? 1.0f : 0.0f));
                if (a.grad_soft) {
                    const float x = s[j] * a.inv_t - lseA;
                    float g;
                    (void)kd_div_elem(&a.coef, x, t[j] * a.inv_t - lseB, &g);
                    dzj += cb * (g - expf(x) * Sf);
                }
                d[j] = dzj;
            }
            if (n == 8) {
                kd_st8<DS>(dz, c0, d);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < n) kd_st<DS>(dz, c0 + j, d[j]);
            }
        }
    }
}

/* ---- small kernels ------------------------------------------------------------------------- */

#define FL_FINAL_THREADS 1024

/* row_soft, row_hard [bt] -> the three scalar losses (one block, fixed order) and the status. */
__global__ void __launch_bounds__(FL_FINAL_THREADS)
fl_final_kernel(const double *row_soft, const double *row_hard, int64_t bt, kd_ws_header *hdr,
                float *loss, float *soft_loss, float *hard_loss, double w_hard, double w_soft,
                double soft_fac) {
    __shared__ double red[32];
    double s = 0.0, h = 0.0;
    for (int64_t i = threadIdx.x; i < bt; i += blockDim.x) {
        s += row_soft[i];
        h += row_hard[i];
    }
    s = kd_block_sum(s, red);
    h = kd_block_sum(h, red);
    if (threadIdx.x == 0) {
        const int bad = hdr->n_bad > 0;
        const double n = hdr->n_valid > 0 ? (double)hdr->n_valid : 1.0;
        const float qnan = __int_as_float(0x7fc00000);
        const double sl = s * soft_fac / n, hl = h / n;
        if (loss) *loss = bad ? qnan : (float)(w_hard * hl + w_soft * sl);
        if (soft_loss) *soft_loss = bad ? qnan : (float)sl;
        if (hard_loss) *hard_loss = bad ? qnan : (float)hl;
        hdr->status = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)KDLOSS_OK;
    }
}

/* ---- host side ----------------------------------------------------------------------------- */

static cudaDataType_t fl_cuda_type(kdloss_dtype d) {
    return d == KDLOSS_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static void fl_row_launch(kdloss_dtype ds, kdloss_dtype dt, int64_t rows, const fl_row_args &a,
                          cudaStream_t st) {
    const unsigned grid = kd_grid(rows);
    if (ds == KDLOSS_BF16) {
        if (dt == KDLOSS_BF16)
            fl_row_kernel<KDLOSS_BF16, KDLOSS_BF16><<<grid, FL_ROW_THREADS, 0, st>>>(a);
        else
            fl_row_kernel<KDLOSS_BF16, KDLOSS_F32><<<grid, FL_ROW_THREADS, 0, st>>>(a);
    } else {
        if (dt == KDLOSS_BF16)
            fl_row_kernel<KDLOSS_F32, KDLOSS_BF16><<<grid, FL_ROW_THREADS, 0, st>>>(a);
        else
            fl_row_kernel<KDLOSS_F32, KDLOSS_F32><<<grid, FL_ROW_THREADS, 0, st>>>(a);
    }
}

kdloss_status kdloss_cuda_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status s = kd_args_fl_params(params);
    if (s == KDLOSS_OK) s = kd_args_fl_sizes(bt, hs, ht, v);
    if (s != KDLOSS_OK) return s;
    if (student_dtype != KDLOSS_F32 && student_dtype != KDLOSS_BF16)
        return KDLOSS_ERR_INVALID_DTYPE;
    fl_plan P;
    s = fl_plan_make(params, bt, hs, v, student_dtype, want_grad != 0, NULL, &P);
    if (s != KDLOSS_OK) return s;
    *bytes = P.total;
    return KDLOSS_OK;
}

/* Shapes: xs (bt x hs), ws (v x hs), bs [v], xt (bt x ht), wt (v x ht), bt_bias [v], labels [bt];
 * outputs per kdloss_fljsd_out; all device pointers, each matrix with its own ld. */
kdloss_status kdloss_cuda_fused_linear_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_fl_geom g;
    kd_spanset spans;
    kdloss_status s = kd_args_fl(params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, out,
                                 &g, &spans);
    if (s != KDLOSS_OK) return s;
    fl_plan P;
    if ((s = fl_plan_make(params, bt, hs, v, xs.dtype, g.want_grad, NULL, &P)) != KDLOSS_OK)
        return s;
    if ((s = kd_args_fl_workspace(workspace, workspace_bytes, P.total, &spans)) != KDLOSS_OK)
        return s;
    fl_plan_make(params, bt, hs, v, xs.dtype, g.want_grad, workspace, &P);

    const kdloss_dtype sdt = xs.dtype, tdt = xt.dtype;
    const size_t es = kdloss_dtype_size(sdt), et = kdloss_dtype_size(tdt);
    const cudaDataType_t cs = fl_cuda_type(sdt), ct = fl_cuda_type(tdt);
    /* "0 skips all cross-entropy work": the CE runs only if it is weighted or asked for; the
     * same for the JSD and its teacher GEMM */
    const int do_hard = params->weight_hard_loss > 0.0 || out->hard_loss || out->row_hard ||
                        out->row_lse;
    const int do_soft = params->weight_soft_loss > 0.0 || out->soft_loss || out->row_soft;
    /* dzs in the student dtype: in place over zs, row pitch in elements of that dtype */
    const int64_t dz_pitch = sdt == KDLOSS_BF16 ? 2 * P.ldz : P.ldz;
    float *dw = sdt == KDLOSS_BF16 ? P.dw_acc : (float *)out->dws.data;
    const int64_t ld_dw = sdt == KDLOSS_BF16 ? hs : g.ld_dws;
    float *db = sdt == KDLOSS_BF16 ? P.db_acc : (float *)out->dbs;

    fl_row_args a;
    a.zs = P.zs;
    a.zt = do_soft ? P.zt : NULL;
    a.ldz = P.ldz;
    a.bs = bs;
    a.bt = bt_bias;
    a.labels = labels.data;
    a.lab64 = labels.dtype == KDLOSS_I64;
    a.ignore = params->ignore_index;
    a.v = v;
    a.inv_t = (float)(1.0 / params->temperature);
    a.same_t = params->temperature == 1.0;
    a.coef = kd_div_coef_make(&params->div);
    a.do_soft = do_soft;
    a.do_hard = do_hard;
    a.do_grad = g.want_grad;
    a.grad_soft = g.want_grad && params->weight_soft_loss > 0.0;
    a.grad_hard = g.want_grad && params->weight_hard_loss > 0.0;
    a.w_hard = params->weight_hard_loss;
    a.w_soft = params->weight_soft_loss;
    a.grad_scale = params->grad_scale;
    a.temperature = params->temperature;
    a.soft_fac = params->t2_scale ? params->temperature * params->temperature : 1.0;
    a.out_soft = out->row_soft;
    a.out_hard = out->row_hard;
    a.out_lse = out->row_lse;
    a.hdr = P.hdr;
    a.row_soft = P.row_soft;
    a.row_hard = P.row_hard;

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    s = kd_cuda_count_labels(st, labels.data, a.lab64, bt, v, params->ignore_index, P.hdr);

    for (int64_t r0 = 0; s == KDLOSS_OK && r0 < bt; r0 += P.chunk) {
        const int64_t rows = bt - r0 < P.chunk ? bt - r0 : P.chunk;
        const int first = r0 == 0;
        const char *xs_c = (const char *)xs.data + (size_t)(r0 * g.ld_xs) * es;
        const char *xt_c = (const char *)xt.data + (size_t)(r0 * g.ld_xt) * et;
        /* zs^T (v x rows, ldz) = ws (hs x v col-major)^T  xs_c (hs x rows col-major) */
        s = kd_gemm(ctx, st, P.lt_ws, FL_LT_WS_BYTES, CUBLAS_OP_T, CUBLAS_OP_N, v, rows, hs,
                    ws.data, cs, g.ld_ws, xs_c, cs, g.ld_xs, 0.0f, P.zs, CUDA_R_32F, P.ldz);
        if (s == KDLOSS_OK && do_soft)
            s = kd_gemm(ctx, st, P.lt_ws, FL_LT_WS_BYTES, CUBLAS_OP_T, CUBLAS_OP_N, v, rows, ht,
                        wt.data, ct, g.ld_wt, xt_c, ct, g.ld_xt, 0.0f, P.zt, CUDA_R_32F, P.ldz);
        if (s != KDLOSS_OK) break;

        a.row0 = r0;
        fl_row_launch(sdt, tdt, rows, a, st);
        if ((s = kd_launch_status()) != KDLOSS_OK) break;

        if (out->dxs.data) {
            /* dxs_c^T (hs x rows, ld_dxs) = ws (hs x v col-major)  dzs^T (v x rows, dz_pitch) */
            char *dxs_c = (char *)out->dxs.data + (size_t)(r0 * g.ld_dxs) * es;
            s = kd_gemm(ctx, st, P.lt_ws, FL_LT_WS_BYTES, CUBLAS_OP_N, CUBLAS_OP_N, hs, rows, v,
                        ws.data, cs, g.ld_ws, P.zs, cs, dz_pitch, 0.0f, dxs_c, cs, g.ld_dxs);
            if (s != KDLOSS_OK) break;
        }
        if (out->dws.data) {
            /* dws^T (hs x v) (+)= xs_c (hs x rows col-major)  (dzs^T (v x rows))^T */
            s = kd_gemm(ctx, st, P.lt_ws, FL_LT_WS_BYTES, CUBLAS_OP_N, CUBLAS_OP_T, hs, v, rows,
                        xs_c, cs, g.ld_xs, P.zs, cs, dz_pitch, first ? 0.0f : 1.0f, dw,
                        CUDA_R_32F, ld_dw);
            if (s != KDLOSS_OK) break;
        }
        if (out->dbs) {
            if (sdt == KDLOSS_BF16)
                kd_colsum_kernel<KDLOSS_BF16><<<kd_grid_1d(v, 256), 256, 0, st>>>(
                    P.zs, dz_pitch, rows, v, db, first);
            else
                kd_colsum_kernel<KDLOSS_F32><<<kd_grid_1d(v, 256), 256, 0, st>>>(
                    P.zs, dz_pitch, rows, v, db, first);
            if ((s = kd_launch_status()) != KDLOSS_OK) break;
        }
    }

    if (s == KDLOSS_OK && sdt == KDLOSS_BF16) {
        if (out->dws.data) {
            kd_cast_kernel<KDLOSS_BF16><<<kd_grid_1d(v * hs, 256), 256, 0, st>>>(
                P.dw_acc, hs, out->dws.data, g.ld_dws, v, hs);
            s = kd_launch_status();
        }
        if (s == KDLOSS_OK && out->dbs) {
            kd_cast_kernel<KDLOSS_BF16><<<kd_grid_1d(v, 256), 256, 0, st>>>(P.db_acc, v, out->dbs,
                                                                            v, 1, v);
            s = kd_launch_status();
        }
    }
    if (s == KDLOSS_OK) {
        fl_final_kernel<<<1, FL_FINAL_THREADS, 0, st>>>(
            P.row_soft, P.row_hard, bt, P.hdr, out->loss, out->soft_loss, out->hard_loss,
            params->weight_hard_loss, params->weight_soft_loss, a.soft_fac);
        s = kd_launch_status();
    }
    kd_dev_leave(&dg);
    return s;
}

/* The JSD-only names: wrappers (divergence JSD(beta), no T^2, no row outputs). */
kdloss_status kdloss_cuda_fljsd_workspace_size(const kdloss_fljsd_params *params, int64_t bt,
                                               int64_t hs, int64_t ht, int64_t v,
                                               kdloss_dtype student_dtype, int want_grad,
                                               size_t *bytes) {
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_fused_linear_distill_params p = kd_fld_from_fljsd(params);
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
    if (!params || !out) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_fused_linear_distill_params p = kd_fld_from_fljsd(params);
    kdloss_fused_linear_distill_out o = kd_fld_out_from_fljsd(out);
    return kdloss_cuda_fused_linear_distill(ctx, stream, &p, bt, hs, ht, v, xs, ws, bs, xt, wt,
                                            bt_bias, labels, &o, workspace, workspace_bytes);
}
