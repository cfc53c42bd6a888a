/* The chunked fused-linear loss on the GPU, the parts its drivers share: the single-process one
 * (fld.cu), the sparse teacher's dense path (fld_topk.cu) and the vocabulary-parallel
 * ones (fld_vp.cu, topk_vp.cu): the workspace plan, the row kernel's arguments and its
 * per-element device functions (one definition of dzs), the per-chunk GEMM steps and the chunk
 * loop with its backward. */
#ifndef KDLOSS_FL_ROWS_CUH
#define KDLOSS_FL_ROWS_CUH

#include "div_math.h"
#include "kd_cuda.cuh"
#include "logit_map.h"
#include "row_special.cuh"

#define FLD_ROW_THREADS 512
#define FLD_TILE (FLD_ROW_THREADS * 8)
#define FLD_LT_WS_BYTES ((size_t)32 << 20)

/* The dense fused loss's workspace (fld.cu has the layout). */
typedef struct fld_plan {
    int64_t chunk; /* rows per chunk */
    int64_t ldz;   /* row stride of zs and zt, in floats */
    kd_ws_header *hdr;
    double *row_soft, *row_hard;
    void *lt_ws;
    float *zs, *zt;
    float *dw_acc, *db_acc;
    void *xm;      /* (C x hs) in the student's dtype, with gradients: the dws GEMM's xs rows
                      (fld_mask_rows) */
    uint8_t *only; /* [C] the slab kernel's flags: rows left to fld_row_kernel (fld_slab.cu);
                      zeroed once a call, set by the slab kernel, cleared by fld_row_kernel */
    size_t total;
} fld_plan;

/* Whether both gradient factors of a fused call are 0 (the CPU's gs = gh = 0, src/cpu/fld.c):
 * grad_scale 0, or both weights 0. Its gradients are then zeros, written by fld_zero_grads
 * without running the gradient GEMMs (0 x a NaN weight or hidden state would be NaN). The CPU
 * also gets 0 where a factor underflows fp32 (grad_scale near 1e-45): not decided here, where
 * n_valid is a device value. */
static inline int fld_zero_factors(double w_hard, double w_soft, double grad_scale) {
    return grad_scale == 0.0 || (!(w_hard > 0.0) && !(w_soft > 0.0));
}

/* Chooses the chunk and carves the plan's regions from cv (after the header); the caller sets
 * hdr and total (kd_ws_total), so that more regions can follow. INVALID_SIZE on overflow. */
/* device: whose memory sizes the default budget (kd_cuda_default_budget; -1 the current one) */
kdloss_status fld_plan_carve(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs,
                            int64_t v, kdloss_dtype sdt, int want_grad, int device,
                            kd_carver *cv, fld_plan *P);

typedef struct fld_row_args {
    float *zs;            /* (C x ldz) student logits of the chunk; dzs overwrites them */
    const float *zt;      /* (C x ldz) teacher logits, NULL when the soft loss is skipped */
    int64_t ldz;
    const void *bs, *bt;  /* [v] biases in the student / teacher dtype, or NULL (also when the
                             head has a logit map: fld_map_rows added it, map_bs / map_bt) */
    kd_logit_map map_s, map_t; /* the heads' logit maps (logit_map.h), applied in place by
                             fld_map_rows before the row kernels; map_s.scale is folded into
                             fld_factors, the cap's factor 1 - (z/c)^2 into fld_dz_pass */
    const void *map_bs, *map_bt; /* the biases fld_map_rows adds (NULL when none) */
    const void *labels;   /* [bt], global row index */
    int lab64;
    int64_t ignore;
    int64_t row0;         /* global index of the chunk's first row */
    int64_t v;
    float inv_t;          /* 1 / temperature */
    int same_t;           /* temperature == 1: tempered and plain student softmax coincide */
    kd_div_coef coef;     /* the divergence's element operation (div_coef.h) */
    int do_soft, do_hard; /* compute the divergence / the CE at all */
    int do_grad;          /* write dzs (not when both gradient factors are 0: fld_zero_factors) */
    int grad_soft, grad_hard; /* its terms: weight > 0 and gradients wanted */
    double w_hard, w_soft, grad_scale, temperature;
    double soft_fac;      /* T^2 with t2_scale, else 1: the soft part's factor */
    const kd_ws_header *hdr; /* n_valid, counted before the first chunk */
    double *row_soft, *row_hard; /* [bt] */
    float *out_soft, *out_hard, *out_lse; /* [bt] caller's per-row outputs, or NULL */
    const float *w;       /* [bt] row weights (docs/MATH.md 12.1), or NULL: 1 */
    float *out_ent;       /* [bt] the student's entropy, or NULL: formed by fld_row_kernel and
                             the vocabulary-parallel phases, not by the slab kernel (fld.cu) */
    uint8_t *only;        /* [C] fld_row_kernel runs only the rows flagged 1 here (the slab
                             kernel's careful-form rows), or NULL: every row */
} fld_row_args;

/* The row's log-sum-exps (every thread gets them): a of zs / T, b of zt / T, h of zs. */
typedef struct fld_lses {
    float a, b, h;
} fld_lses;

/* Which of them a call forms: a for the divergence, and for the cross-entropy when T = 1; h for
 * the cross-entropy when T != 1 (else h = a); b with the divergence (do_soft). */
__host__ __device__ static inline int fld_need_a(const fld_row_args &a) {
    return a.do_soft || (a.do_hard && a.same_t) || a.out_ent != NULL;
}
__host__ __device__ static inline int fld_need_h(const fld_row_args &a) {
    return a.do_hard && !a.same_t;
}

/* The single-read row pass (fld_slab.cu): a cluster of `blocks` blocks a row, each holding
 * `cols` columns of zs and zt in `smem` bytes of shared memory. blocks 0: not used. */
typedef struct fld_slab {
    int blocks;
    int64_t cols;
    size_t smem;
} fld_slab;
#define FLD_SLAB_MAX_SMEM ((size_t)200 << 10)

/* The slab shape for rows of v columns on this device, or {0}: sm_80, or rows too wide. */
fld_slab fld_slab_shape(const kdloss_cuda_context *ctx, int64_t v, int do_soft);
/* The slab kernel over a chunk's rows (fld_row_kernel then runs the rows it flags). */
kdloss_status fld_slab_launch(kdloss_dtype ds, kdloss_dtype dt, int64_t rows,
                              const fld_row_args &a, const fld_slab &sl, cudaStream_t st);

/* The fields the dense and the top-k row kernels' arguments (A) share: the gradient's terms and
 * factors and the caller's row outputs, from either fused loss's params (P). */
template <class A, class P>
static inline void fld_grad_fields(A *a, const P *p, const kdloss_fused_linear_distill_out *out,
                                  int want_grad) {
    a->grad_soft = want_grad && p->weight_soft_loss > 0.0;
    a->grad_hard = want_grad && p->weight_hard_loss > 0.0;
    a->w_hard = p->weight_hard_loss;
    a->w_soft = p->weight_soft_loss;
    a->grad_scale = p->grad_scale;
    a->temperature = p->temperature;
    a->soft_fac = p->t2_scale ? p->temperature * p->temperature : 1.0;
    a->out_soft = out->row_soft;
    a->out_hard = out->row_hard;
    a->out_lse = out->row_lse;
}

/* z = map(z + bias) in place over rows x v of one head's chunk logits (ld ldz; bias of dtype
 * bdt or NULL), when the map is not the identity (logit_map.h). */
kdloss_status fld_map_rows(cudaStream_t st, float *z, int64_t ldz, int64_t rows, int64_t v,
                          const void *bias, kdloss_dtype bdt, const kd_logit_map &m);
/* The same for a bias alone too (no map): z = map(z + bias) whenever either is there. */
kdloss_status fld_bias_map_rows(cudaStream_t st, float *z, int64_t ldz, int64_t rows, int64_t v,
                               const void *bias, kdloss_dtype bdt, const kd_logit_map &m);

/* The row-kernel fields of a call (everything but row0). */
void fld_row_setup(fld_row_args *a, const kdloss_fused_linear_distill_params *p,
                  const kdloss_fused_linear_distill_out *out, const fld_plan &P, const void *bs,
                  const void *bt_bias, kdloss_labels labels, int64_t v, int want_grad);

#ifdef __CUDACC__
/* Logits c0..c0+n-1 of one row plus bias (dtype DB), fp32. Rows of z are 256-byte aligned and
 * c0 is a multiple of 8, so full groups are two 16-byte loads. */
template <int DB>
__device__ __forceinline__ void fld_load(const float *z, const void *bias, int64_t c0, int n,
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

/* The teacher's constants of a row in the phased form X = (zs - ms) it - lss,
 * Y = (zt - mt) it - lst (the vocabulary-parallel phases, fld_vp.cu), from the row maximum mt and
 * the float64 normalizers lss, lst: the CPU's dense_div (src/cpu/fld_row_phases.h; docs/MATH.md section 5)
 * term for term. Y = (zt - mt') it - lss with mt' = mt + (lst - lss) T makes X and Y subtract the
 * same fp32 constant, whose rounding then scales P and Q alike (a relative error of the
 * divergence) instead of shifting one against the other (an absolute error of ~1e-7, which at a
 * large T outweighs a divergence of ~1/T^2). Of the two, the one whose constant leaves the
 * smaller offset between Y and X is taken: mt''s rounding times 1/T, or the two normalizers'
 * roundings. *mt_eff, *lst_eff: what Y subtracts (mt, (float)lst without the shift). */
__device__ __forceinline__ void fld_teacher_shift(float mt, double lss, double lst, float inv_t,
                                                 float *mt_eff, float *lst_eff) {
    const double sh = (lst - lss) / (double)inv_t, it = (double)inv_t;
    const double mts = (double)mt + sh;
    const float mt2 = (float)mts;
    /* mt2 - mt first (exact in double): with mt far above sh, mt + sh would lose sh and hide
     * the shift's rounding (the CPU's dense_div had the same defect) */
    const double e_shift = fabs((((double)mt2 - (double)mt) - sh) * it);
    const double e_norm = fabs((lst - (double)(float)lst) - (lss - (double)(float)lss));
    const bool same = isfinite(mt2) && mt > -INFINITY && e_shift < e_norm;
    *mt_eff = same ? mt2 : mt;
    *lst_eff = same ? (float)lss : (float)lst;
}

/* The gradient's factors from the device's n_valid: ca of the cross-entropy, cb of the soft
 * term (1/T and T^2 folded in). */
__device__ __forceinline__ void fld_factors(const fld_row_args &a, float *ca, float *cb) {
    const unsigned long long nv = a.hdr->n_valid;
    const double nvd = nv > 0 ? (double)nv : 1.0;
    const double s = (double)a.map_s.scale; /* dz/du's constant factor (logit_map.h) */
    *ca = (float)(s * a.w_hard * a.grad_scale / nvd);
    *cb = (float)(s * a.w_soft * a.grad_scale * a.soft_fac / (nvd * a.temperature));
}

/* A kept row's weight on both factors (docs/MATH.md 12.1: once, in fp32; without weights
 * nothing, so the bits of a call without them stay). */
__device__ __forceinline__ void fld_weigh(const fld_row_args &a, int64_t gr, float *ca,
                                         float *cb) {
    if (!a.w) return;
    *ca *= a.w[gr];
    *cb *= a.w[gr];
}

/* dzs of one logit (docs/MATH.md 4 and 7.4): ca (softmax(zs)_j - [j = y]) + cb (g_j - Q_j S),
 * from s = zs_j (bias added), lh the row's untempered log-normalizer, x = log Q_j and
 * y = log P_j at the temperature (g_j = de/dx from kd_div_elem), S = sum g. A factor of 0
 * contributes nothing (a poisoned row's NaN S or lh then writes zeros, as the CPU's). */
__device__ __forceinline__ float fld_dz(const fld_row_args &a, float ca, float cb, float s,
                                       float lh, bool is_label, float x, float y, float S) {
    float d = 0.0f;
    if (a.grad_hard && ca != 0.0f) d = ca * (expf(s - lh) - (is_label ? 1.0f : 0.0f));
    if (a.grad_soft && cb != 0.0f) {
        float g;
        (void)kd_div_elem(&a.coef, x, y, &g);
        d += cb * (g - expf(x) * S);
    }
    return d;
}

/* Writes d_j = f(j, s_j, t_j), times the student softcap's factor at s_j, over the row in place
 * of its logits (dtype DS: a bf16 dzs row occupies the first half of the fp32 zs row), s and t
 * the student's and (when load_t, else 0) the teacher's logits with their biases. Tile by tile with a barrier between the tile's loads
 * and its stores: the stores of tile k land on fp32 elements below (k+1) FLD_TILE / 2, which
 * every thread has read by the barrier of tile k. Every thread makes the same trips. */
template <int DS, int DT, class F>
__device__ __forceinline__ void fld_dz_pass(const fld_row_args &a, float *zs, const float *zt,
                                           int load_t, const F &f) {
    void *dz = (void *)zs;
    for (int64_t tile0 = 0; tile0 < a.v; tile0 += FLD_TILE) {
        const int64_t c0 = tile0 + (int64_t)threadIdx.x * 8;
        const int n = c0 >= a.v ? 0 : a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8], t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (n > 0) {
            fld_load<DS>(zs, a.bs, c0, n, s);
            if (load_t) fld_load<DT>(zt, a.bt, c0, n, t);
        }
        __syncthreads(); /* every load of this tile precedes any store that narrows over it */
        if (n == 0) continue;
        float d[8];
#pragma unroll
        for (int j = 0; j < 8; j++) d[j] = f(c0 + j, s[j], t[j]);
        if (a.map_s.cap > 0.0f) { /* the student softcap's factor, from the mapped logit */
#pragma unroll
            for (int j = 0; j < 8; j++) d[j] *= kd_map_dcap(&a.map_s, s[j]);
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

/* Thread 0 writes a row's results: its divergence and cross-entropy (double: the final sums'
 * terms) and the caller's fp32 row outputs when asked for (lse: the untempered log-sum-exp). */
__device__ __forceinline__ void fld_put_row(const fld_row_args &a, int64_t gr, double soft,
                                           double hard, float lse) {
    if (threadIdx.x != 0) return;
    a.row_soft[gr] = soft;
    a.row_hard[gr] = hard;
    if (a.out_soft) a.out_soft[gr] = (float)soft;
    if (a.out_hard) a.out_hard[gr] = (float)hard;
    if (a.out_lse) a.out_lse[gr] = lse;
}

/* Logit c of a row with its bias (dtype DB; NULL: none): the careful form reads element by
 * element. */
template <int DB>
__device__ __forceinline__ float fld_logit(const float *z, const void *bias, int64_t c) {
    return bias ? z[c] + kd_ld<DB>(bias, c) : z[c];
}

/* The careful form's normalizers of a row: the maxima ms, mt of the logits (biases added), and
 * in double the log-normalizers lss, lst of zs / T and zt / T (the divergence) and lsh of zs (the
 * cross-entropy), each relative to its maximum. */
typedef struct fld_wide_norm {
    float ms, mt;
    double lss, lst, lsh;
} fld_wide_norm;

template <int DS, int DT>
__device__ fld_wide_norm fld_wide_norms(const fld_row_args &a, const float *zs, const float *zt,
                                      double *red, float *fred) {
    const double it = (double)a.inv_t;
    fld_wide_norm N = {-INFINITY, -INFINITY, 0.0, 0.0, 0.0};
    kd_cu_each(a.v, [&](int64_t c) {
        N.ms = fmaxf(N.ms, fld_logit<DS>(zs, a.bs, c));
        if (a.do_soft) N.mt = fmaxf(N.mt, fld_logit<DT>(zt, a.bt, c));
    });
    N.ms = kd_block_max(N.ms, fred);
    if (a.do_soft) N.mt = kd_block_max(N.mt, fred);
    if (a.do_soft) {
        double es = 0.0, et = 0.0;
        kd_cu_each(a.v, [&](int64_t c) {
            es += exp(((double)fld_logit<DS>(zs, a.bs, c) - N.ms) * it);
            et += exp(((double)fld_logit<DT>(zt, a.bt, c) - N.mt) * it);
        });
        N.lss = log(kd_block_sum_all(es, red));
        N.lst = log(kd_block_sum_all(et, red));
    }
    if (a.do_hard) {
        if (a.do_soft && a.same_t) {
            N.lsh = N.lss;
        } else {
            double eh = 0.0;
            kd_cu_each(a.v,
                       [&](int64_t c) { eh += exp((double)fld_logit<DS>(zs, a.bs, c) - N.ms); });
            N.lsh = log(kd_block_sum_all(eh, red));
        }
    }
    return N;
}

/* The careful form's divergence of a row (the divergence wanted; valid in thread 0) on
 * double-formed log-probs, and *S = sum of g (every thread; 0 when its gradient is not wanted):
 * both NaN when a normalizer is (the NaN policy). */
template <int DS, int DT>
__device__ double fld_wide_soft(const fld_row_args &a, const float *zs, const float *zt,
                               const fld_wide_norm &N, double *red, double *S) {
    const double it = (double)a.inv_t;
    double accl = 0.0, accg = 0.0;
    kd_cu_each(a.v, [&](int64_t c) {
        float g;
        accl += (double)kd_div_elem(&a.coef, kd_wide_lp(fld_logit<DS>(zs, a.bs, c), N.ms, it, N.lss),
                                    kd_wide_lp(fld_logit<DT>(zt, a.bt, c), N.mt, it, N.lst), &g);
        accg += (double)g;
    });
    double soft = kd_block_sum(accl, red);
    *S = a.grad_soft ? kd_block_sum_all(accg, red) : 0.0;
    if (isnan(N.lss) || isnan(N.lst)) soft = *S = __longlong_as_double(0x7ff8000000000000LL);
    return soft;
}

/* A row of the single-process fused kernel (fld_row_kernel, the whole block) that the fast
 * passes cannot serve (row_special.cuh): a NaN tempered normalizer, from a NaN or +inf logit
 * (the NaN policy) or from z / T beyond fp32 (T < 1). Everything again in the careful form, the
 * CPU's dense phases on such a row (src/cpu/fld_row_phases.h, kd_wide_*): the normalizers
 * (fld_wide_norms), the divergence and S = sum g (fld_wide_soft), the cross-entropy
 * (ms - zs[y]) + lsh, dzs from kd_wide_dz (fld_dz_pass: in place, narrowing safely). zy: zs[y]
 * with its bias, read by thread 0 before any store. */
template <int DS, int DT>
__device__ void fld_special_row(const fld_row_args &a, float *zs, const float *zt, int64_t y,
                               int64_t gr, float zy, double *red, float *fred) {
    const double it = (double)a.inv_t;
    const fld_wide_norm N = fld_wide_norms<DS, DT>(a, zs, zt, red, fred);
    double soft = 0.0, S = 0.0;
    if (a.do_soft) soft = fld_wide_soft<DS, DT>(a, zs, zt, N, red, &S);
    fld_put_row(a, gr, soft, a.do_hard ? ((double)N.ms - (double)zy) + N.lsh : 0.0,
               a.do_hard ? (float)((double)N.ms + N.lsh) : 0.0f);
    if (!a.do_grad) return;
    float ca, cb;
    fld_factors(a, &ca, &cb);
    fld_weigh(a, gr, &ca, &cb);
    const float gs = a.grad_soft ? cb : 0.0f, gh = a.grad_hard ? ca : 0.0f;
    const bool share = a.do_soft && a.same_t && gs != 0.0f;
    fld_dz_pass<DS, DT>(a, zs, zt, a.grad_soft, [&](int64_t c, float s, float t) {
        float g = 0.0f;
        if (gs != 0.0f)
            (void)kd_div_elem(&a.coef, kd_wide_lp(s, N.ms, it, N.lss),
                              kd_wide_lp(t, N.mt, it, N.lst), &g);
        const float d = kd_wide_dz(s, g, N.ms, it, N.lss, S, gs, gh, N.lsh, share);
        return c == y ? d - gh : d;
    });
}

/* Columns [c_lo, c_lo + n) of a row that does not count (label ignored or weight 0; bad: label
 * out of range or weight not finite and >= 0): zero dzs; with put, the row outputs (the entropy
 * too) 0, or NaN when bad. The whole block calls it; c_lo is a multiple of 8. */
template <int DS>
__device__ void fld_skip_slice(const fld_row_args &a, void *dz, int64_t c_lo, int64_t n,
                               int64_t gr, bool bad, bool put) {
    if (a.do_grad) {
        const float z8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t j = (int64_t)threadIdx.x * 8; j < n; j += FLD_TILE) {
            if (j + 8 <= n) {
                kd_st8<DS>(dz, c_lo + j, z8);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (j + k < n) kd_st<DS>(dz, c_lo + j + k, 0.0f);
            }
        }
    }
    /* the caller's row outputs too: 0 on ignored rows (kdloss.h), NaN on bad ones */
    const double z = bad ? __longlong_as_double(0x7ff8000000000000LL) : 0.0;
    if (put) fld_put_row(a, gr, z, z, (float)z);
    if (put && a.out_ent && threadIdx.x == 0) a.out_ent[gr] = (float)z;
}

/* A whole row that does not count (fld_skip_slice over its v columns). */
template <int DS>
__device__ void fld_skip_row(const fld_row_args &a, void *dz, int64_t gr, bool bad) {
    fld_skip_slice<DS>(a, dz, 0, a.v, gr, bad, true);
}

/* The student's entropy of a row (docs/MATH.md 12.1; the whole block, thread 0 writes it):
 * -sum Q log Q over x = log Q = zs / T - la, la the row's tempered lse from pass 1, with
 * div_elem.h's element (0 where Q = 0), summed as the loss is (fp32 groups of 8, double across
 * them). Its own pass over the row (before pass 3 overwrites it): the CUDA row kernels do not
 * fold it into pass 2 as the CPU's phases do (the same quantity; roundings a few ulps apart). */
template <int DS>
__device__ void fld_ent_pass(const fld_row_args &a, const float *zs, float la, int64_t gr,
                             double *red) {
    double acc = 0.0;
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += FLD_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float s[8], h8 = 0.0f;
        fld_load<DS>(zs, a.bs, c0, n, s);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float x = s[j] * a.inv_t - la;
            if (j < n) h8 += kd_s_entropy(x, expf(x));
        }
        acc += (double)h8;
    }
    const double h = kd_block_sum(acc, red);
    if (threadIdx.x == 0) a.out_ent[gr] = (float)h;
}

/* The same in the careful form (a NaN tempered normalizer: a NaN or +inf logit, or zs / T
 * beyond fp32): log Q from kd_wide_lp at the row maximum and the double normalizer, NaN when
 * that is NaN (the CPU's lr_special_entropy). */
template <int DS>
__device__ void fld_wide_ent(const fld_row_args &a, const float *zs, int64_t gr, double *red,
                             float *fred) {
    const double it = (double)a.inv_t;
    float ms = -INFINITY;
    kd_cu_each(a.v, [&](int64_t c) { ms = fmaxf(ms, fld_logit<DS>(zs, a.bs, c)); });
    ms = kd_block_max(ms, fred);
    double es = 0.0;
    kd_cu_each(a.v, [&](int64_t c) { es += exp(((double)fld_logit<DS>(zs, a.bs, c) - ms) * it); });
    const double lss = log(kd_block_sum_all(es, red));
    double acc = 0.0;
    kd_cu_each(a.v, [&](int64_t c) {
        const float x = kd_wide_lp(fld_logit<DS>(zs, a.bs, c), (double)ms, it, lss);
        acc += (double)kd_s_entropy(x, expf(x));
    });
    const double h = kd_block_sum(acc, red);
    if (threadIdx.x == 0) a.out_ent[gr] = isnan(lss) ? __int_as_float(0x7fc00000) : (float)h;
}
#endif /* __CUDACC__ */

static inline cudaDataType_t fld_cuda_type(kdloss_dtype d) {
    return d == KDLOSS_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* ---- the per-chunk GEMM steps (fld.cu) ----------------------------------------- */

/* One chunk's operands as the GEMMs see them: row-major matrices with their effective lds
 * (cuBLAS reads each as its column-major transpose), xs / ws / dz in the student's dtype sdt. */
typedef struct fld_gemms {
    kdloss_cuda_context *ctx;
    cudaStream_t st;
    void *lt_ws;              /* cuBLASLt scratch of FLD_LT_WS_BYTES */
    kdloss_dtype sdt;
    const void *xs, *ws;      /* (bt x hs, ld_xs), (v x hs, ld_ws) */
    int64_t ld_xs, ld_ws, hs, v;
    const float *zs;          /* the chunk's logits (rows x v, ldz floats); dzs over them */
    int64_t ldz;
} fld_gemms;

/* zs (rows x v, ldz) = xs[r0 .. r0 + rows) ws^T (fp32 from the accumulator); with a teacher
 * (wt not NULL) also zt = xt[r0 ..] wt^T. */
kdloss_status fld_chunk_logits(const fld_gemms *g, int64_t r0, int64_t rows, float *zs,
                              kdloss_cmat xt, kdloss_cmat wt, int64_t ht, float *zt);

/* zt (rows x v, ldz) = xt[r0 .. r0 + rows) wt^T, fp32 from the accumulator. */
kdloss_status fld_teacher_gemm(const fld_gemms *g, int64_t r0, int64_t rows, kdloss_cmat xt,
                              kdloss_cmat wt, int64_t ht, float *zt);

/* dx (rows x hs, ld_dx, dtype dxt) = dzs ws: the chunk's dxs rows, complete in one GEMM. */
kdloss_status fld_chunk_dx(const fld_gemms *g, int64_t rows, void *dx, cudaDataType_t dxt,
                          int64_t ld_dx);

/* The chunk's dws (+)= dzs^T xs[r0 ..] and dbs (+)= column sums of dzs (fixed row order), each
 * when the caller asked for it, summed in fp32: in the caller's fp32 outputs (dws with ld_dws),
 * or for a bf16 student in dw_acc (v x hs) and db_acc (fld_cast_wgrad rounds them once). r0 == 0
 * starts the sums. xm: the chunk's xs rows with the zero-gradient rows zeroed (fld_mask_rows,
 * rows x hs), which the dws GEMM then reads instead of xs. */
kdloss_status fld_chunk_wgrad(const fld_gemms *g, int64_t r0, int64_t rows,
                             const kdloss_fused_linear_distill_out *out, int64_t ld_dws,
                             float *dw_acc, float *db_acc, const void *xm);

/* Which rows of a chunk have a gradient of 0 by the rules (src/cpu/fld.c zero_dz_row), their
 * xs unread: rows whose label does not count (ignored, or a bad label: labels given, flags
 * NULL), rows whose top-k flag is not TK_ROW_OK (0; flags given), and with ids (top-k without
 * the cross-entropy's gradient) rows without a used slot (no id >= 0, on any rank). */
typedef struct fld_mask {
    const void *labels;   /* [bt] or NULL */
    int lab64;
    int64_t ignore, v_total;
    const uint8_t *flags; /* [bt] TK_ROW_* or NULL */
    const void *ids;      /* (bt x k, ld_ids) global ids, or NULL */
    int ids64;
    int64_t ld_ids, k;
    const float *w;       /* [bt] row weights, or NULL: rows whose weight is not > 0 masked */
} fld_mask;

/* xm (rows x hs, contiguous, the student's dtype) = xs rows [r0, r0 + rows), with zeros in the
 * rows the mask names: the dws GEMM multiplies those rows' dz, which is 0, by xm instead of by an
 * xs that may hold a NaN (0 x NaN; the CPU leaves such rows out of its GEMM). The same sums
 * otherwise: a masked row added 0 x x there. */
kdloss_status fld_mask_rows(const fld_gemms *g, const fld_mask *m, int64_t r0, int64_t rows,
                           void *xm);

/* Both gradient factors 0 (fld_zero_factors): zero dxs (bt x hs, ld_dxs), dws (v x hs, ld_dws)
 * and dbs [v], each when asked for, in the student's dtype sdt. */
kdloss_status fld_zero_grads(cudaStream_t st, const kdloss_fused_linear_distill_out *out,
                            int64_t ld_dxs, int64_t ld_dws, int64_t bt, int64_t hs, int64_t v,
                            kdloss_dtype sdt);

/* bf16 student: dws and dbs were summed in fp32 across chunks; round them once into the
 * caller's outputs (ld_dws of its dws). */
kdloss_status fld_cast_wgrad(cudaStream_t st, const float *dw_acc, const float *db_acc,
                            const kdloss_fused_linear_distill_out *out, int64_t ld_dws,
                            int64_t hs, int64_t v);

/* ---- the chunk loop of the fused drivers --------------------------------------------------
 * fld.cu, fld_topk.cu (dense path), fld_vp.cu and topk_vp.cu run the same loop: per
 * chunk of rows the logits GEMM, the driver's own row kernel(s) (vocabulary-parallel: with their
 * all-reduces), then the backward; after the last chunk the gradients are completed. The loop,
 * the backward's common steps and the completion are here; the row phases and the dxs step
 * (one GEMM, an all-reduced one, or the top-k's sparse one) are each driver's. */

/* Where a fused call's gradients go, and whether any are computed. */
typedef struct fld_grad_out {
    const kdloss_fused_linear_distill_out *out; /* dxs, dws, dbs: the caller's, each optional */
    int64_t ld_dxs, ld_dws;  /* their effective lds */
    int want_grad;           /* any of them asked for */
    int zero_g;              /* both gradient factors 0 (fld_zero_factors): zeros, no GEMMs */
    float *dw_acc, *db_acc;  /* a bf16 student's fp32 sums across chunks (the plan's) */
    void *xm;                /* the chunk's masked xs rows (fld_mask_rows; the plan's) */
} fld_grad_out;

/* From a checked call: p its params (either fused loss's), g its checked geometry
 * (kd_fld_checked), P its plan (fld_plan or tk_plan). */
template <class Params, class Geom, class Plan>
static inline fld_grad_out fld_grad_out_of(const Params *p, const Geom &g,
                                         const kdloss_fused_linear_distill_out *out,
                                         const Plan &P) {
    const fld_grad_out G = {out, g.ld_dxs, g.ld_dws, g.want_grad,
                           g.want_grad && fld_zero_factors(p->weight_hard_loss,
                                                          p->weight_soft_loss, p->grad_scale),
                           P.dw_acc, P.db_acc, P.xm};
    return G;
}

/* The caller's dxs from the chunk's first row r0 on (the student's dtype sdt). */
static inline void *fld_dxs_at(const fld_grad_out &G, int64_t r0, kdloss_dtype sdt) {
    return (char *)G.out->dxs.data + (size_t)(r0 * G.ld_dxs) * kdloss_dtype_size(sdt);
}

/* f(r0, rows) for each chunk [r0, r0 + rows) of bt rows (chunk rows each, the last one shorter)
 * while the status stays KDLOSS_OK, starting from s. */
template <class F>
static kdloss_status fld_for_chunks(kdloss_status s, int64_t bt, int64_t chunk, const F &f) {
    for (int64_t r0 = 0; s == KDLOSS_OK && r0 < bt; r0 += chunk)
        s = f(r0, bt - r0 < chunk ? bt - r0 : chunk);
    return s;
}

/* A chunk's backward, after its row kernel wrote dzs (nothing without gradients, or when both
 * factors are 0: fld_end_grads writes the zeros): dxs rows by dx() (the driver's step) when
 * asked for, the rows the mask names zeroed in xm (when dws is asked for), then dws and dbs
 * (+)= (fld_chunk_wgrad). */
template <class DX>
static kdloss_status fld_chunk_backward(const fld_gemms &gm, const fld_grad_out &G, const fld_mask &m,
                                       int64_t r0, int64_t rows, const DX &dx) {
    if (!G.want_grad || G.zero_g) return KDLOSS_OK;
    kdloss_status s = KDLOSS_OK;
    if (G.out->dxs.data && (s = dx()) != KDLOSS_OK) return s;
    if (G.out->dws.data && (s = fld_mask_rows(&gm, &m, r0, rows, G.xm)) != KDLOSS_OK) return s;
    return fld_chunk_wgrad(&gm, r0, rows, G.out, G.ld_dws, G.dw_acc, G.db_acc, G.xm);
}

/* After the last chunk: both factors 0, the zeros (fld_zero_grads); else for a bf16 student the
 * fp32 sums of dws and dbs rounded once (fld_cast_wgrad). */
static inline kdloss_status fld_end_grads(const fld_gemms &gm, const fld_grad_out &G, int64_t bt) {
    if (G.zero_g)
        return fld_zero_grads(gm.st, G.out, G.ld_dxs, G.ld_dws, bt, gm.hs, gm.v, gm.sdt);
    if (G.want_grad && gm.sdt == KDLOSS_BF16)
        return fld_cast_wgrad(gm.st, G.dw_acc, G.db_acc, G.out, G.ld_dws, gm.hs, gm.v);
    return KDLOSS_OK;
}

/* ---- the dense fused loss's run (fld.cu), for its entry points ---- */

/* Several teachers (kdloss_teacher_heads, docs/MATH.md section 13) as the chunk loop reads them:
 * n heads (each V x Ht, ld effective) in device memory, their biases (device, or NULL), the
 * per-row index in host memory. */
typedef struct fld_heads {
    int64_t n;
    const kdloss_cmat *wt;
    const void *const *bias;
    const int32_t *index;
} fld_heads;

/* A checked dense fused call: kdloss_cuda_fused_linear_distill's arguments, and for several
 * teachers (kdloss_cuda_fused_linear_distill_multi) heads (wt then unused), else NULL. */
typedef struct fld_dense_call {
    kdloss_cuda_context *ctx;
    void *stream;
    const kdloss_fused_linear_distill_params *params;
    int64_t bt, hs, ht, v;
    kdloss_cmat xs, ws;
    const void *bs;
    kdloss_cmat xt, wt;
    const void *bt_bias;
    const fld_heads *heads;
    kdloss_labels labels;
    kdloss_fused_linear_distill_out *out;
    void *workspace;
    size_t workspace_bytes;
} fld_dense_call;

/* Runs a call whose arguments passed (g and spans[0, n_spans): kd_check_fld's, one spanset per
 * teacher head): the plan, the workspace's checks against every spanset, the chunk loop, the
 * losses. */
kdloss_status fld_dense_run(const fld_dense_call &c, const kd_fld_checked &g,
                           const kd_spanset *spans, int64_t n_spans);

/* The size queries' checks after the params' (st, in the calls' order): the sizes, K (the sparse
 * teacher's slots; 1 for the dense one), the student's dtype. */
kdloss_status fld_size_checks(kdloss_status st, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                             int64_t k, kdloss_dtype sdt);

/* The scalar losses from the per-row double losses (one block, fixed order) and the status
 * word (LABEL_OUT_OF_RANGE when the device counted a bad label). */
kdloss_status fld_final(cudaStream_t st, const fld_plan &P, int64_t bt,
                       const kdloss_fused_linear_distill_out *out,
                       const kdloss_fused_linear_distill_params *p);

#endif /* KDLOSS_FL_ROWS_CUH */
