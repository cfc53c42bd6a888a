/* The vocabulary-parallel fused-linear distillation loss on the GPU (kdloss.h,
 * kdloss_cuda_fused_linear_distill_vp; docs/MATH.md section 9): fld.cu's chunk loop on this
 * rank's rows of the heads, its row kernel split into four phase kernels with the statistics
 * all-reduced in between (the CPU's phases, src/cpu/fld_row_phases.h). */
#include "vp_cuda.h"

/* The launches of a chunk, on the caller's stream:
 *   zs = xs[chunk] ws_r^T, zt = xt[chunk] wt_r^T           (fld_chunk_logits)
 *   1. max   the row maxima of zs and zt                    -> MAX 2 doubles a row  (stat_max)
 *   2. sums  sum e^((zs-ms)/T), sum e^((zt-mt)/T),
 *            sum e^(zs-ms) (CE at T != 1), zs[y] (its rank),
 *            with row_entropy E = sum -e^u u, u = (zs-ms)/T   -> SUM 4 (5)          (stat_sum)
 *   3. div   the divergence's terms and sum g over the block (the teacher's constants as the
 *            CPU's, fld_teacher_shift); the row's CE and lse  -> SUM 2              (stat_div)
 *   4. grad  dzs in place (fld_dz, the single-process definition), row_soft, the entropy
 *            H = E / S + log S from the reduced sums (docs/MATH.md 12.1)
 *   dws, dbs of the block (fld_chunk_wgrad; ignored rows zeroed in its xs, fld_mask_rows); dxs:
 *   the partial dzs ws_r in fp32, SUM, rounded once. Both gradient factors 0: none of this (no
 *   dxs all-reduce, as the CPU's), zero gradients (fld_zero_grads)
 * One block of FLD_ROW_THREADS per row in every phase (grid = the chunk's rows <= 2^30). Labels
 * are global ids, checked on the device against v_total; a row's label column is local on one
 * rank only. Nothing in this file has run on a GPU yet.
 *
 * Workspace: fld.cu's (for this rank's v), then st: 9 doubles a chunk row (stat_max,
 * stat_sum, stat_div; the entropy's double counted whether or not it is asked for, so that the
 * size query does not depend on the outputs), and with gradients part: (C x Hs) fp32, the
 * chunk's dxs partial. */

typedef struct fldvp_args {
    fld_row_args r;   /* v: this rank's columns; row0 and labels global */
    int64_t v_lo;    /* global id of local column 0 */
    int64_t v_total;
    double *stat_max, *stat_sum, *stat_div; /* [2 rows], [n_sum rows], [2 rows] of the chunk */
    int n_sum;       /* 4, or 5 with the entropy's E */
} fldvp_args;

/* The log-normalizers of a row from its reduced statistics (every thread computes them). */
typedef struct fldvp_norms {
    float ms, mt;   /* the row maxima over every rank; mt with the teacher's shift (below) */
    float lss, lst; /* log sum e^((zs-ms)/T), log sum e^((zt-mt)/T); lst = lss when shifted */
    float lh;       /* the untempered log-sum-exp ms + lsh */
    double lsh;
    /* the careful form (row_special.cuh): wide, a maximum >= 2^102 (logits spanning more than
     * FLT_MAX), whose log-probs are ((double)z - m) it - ls with mt0 (unshifted), lss64, lst64;
     * poisoned, a NaN normalizer (a NaN or +inf logit on any rank: the NaN policy) */
    bool wide, poisoned;
    float mt0;
    double lss64, lst64;
} fldvp_norms;

/* ---- device side ----------------------------------------------------------------------------- */

/* Row r's label y: *ycol its local column (-1 on the ranks that do not hold it). Returns whether
 * the row counts: not ignored and in [0, v_total), and its weight (if any) > 0 (a bad label is
 * NaN, as fld_row_kernel's; the weights were checked on the host: fld_vp's kd_cuda_vp_weights). */
__device__ __forceinline__ int fldvp_label(const fldvp_args &a, int64_t r, int64_t *y,
                                          int64_t *ycol) {
    *y = kd_label(a.r.labels, a.r.lab64, a.r.row0 + r);
    const int valid = *y != a.r.ignore && *y >= 0 && *y < a.v_total &&
                      kd_weight_kind(a.r.w, a.r.row0 + r) == 0;
    const int64_t c = *y - a.v_lo;
    *ycol = valid && c >= 0 && c < a.r.v ? c : -1;
    return valid;
}

/* f(x) for each of this thread's columns of the row, x = z + bias (dtype DB). */
template <int DB, class F>
__device__ __forceinline__ void fldvp_each(const fldvp_args &a, const float *z, const void *bias,
                                          const F &f) {
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.r.v; c0 += FLD_TILE) {
        const int n = a.r.v - c0 >= 8 ? 8 : (int)(a.r.v - c0);
        float x[8];
        fld_load<DB>(z, bias, c0, n, x);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n) f(x[j]);
    }
}

/* Max over the row of z + bias (dtype DB); every thread gets it. */
template <int DB>
__device__ float fldvp_row_max(const fldvp_args &a, const float *z, const void *bias, float *red) {
    float m = -INFINITY;
    fldvp_each<DB>(a, z, bias, [&](float x) { m = fmaxf(m, x); });
    return kd_block_max(m, red);
}

/* Sum over the row of exp((z + bias - m) s), each thread's part in double, the block's in a
 * fixed order (valid in thread 0). A maximum m >= 2^102 (the same in every thread) takes the
 * careful form exp(((double)x - m) s) (row_special.cuh). */
template <int DB>
__device__ double fldvp_sum_exp(const fldvp_args &a, const float *z, const void *bias, float m,
                               float s, double *red) {
    double acc = 0.0;
    if (kd_row_wide(m))
        fldvp_each<DB>(a, z, bias, [&](float x) { acc += exp(((double)x - m) * (double)s); });
    else
        fldvp_each<DB>(a, z, bias, [&](float x) { acc += (double)expf((x - m) * s); });
    return kd_block_sum(acc, red);
}

/* The entropy's sum over the row, E = sum -e^u u with u = (z + bias - m) s, in double (u <= 0;
 * 0 where e^u is: div_elem.h's element in double), the block's in a fixed order (valid in
 * thread 0). */
template <int DB>
__device__ double fldvp_ent_sum(const fldvp_args &a, const float *z, const void *bias, float m,
                                float s, double *red) {
    double acc = 0.0;
    fldvp_each<DB>(a, z, bias, [&](float x) {
        const double u = ((double)x - m) * (double)s, e = exp(u);
        acc += e > 0.0 ? -e * u : 0.0;
    });
    return kd_block_sum(acc, red);
}

__device__ __forceinline__ fldvp_norms fldvp_norms_of(const fldvp_args &a, int64_t r) {
    const double *sm = a.stat_sum + a.n_sum * r;
    fldvp_norms n;
    n.ms = (float)a.stat_max[2 * r];
    n.mt = (float)a.stat_max[2 * r + 1];
    const double lss = a.r.do_soft ? log(sm[0]) : 0.0, lst = a.r.do_soft ? log(sm[1]) : 0.0;
    /* the CE's normalizer: the tempered one when T = 1 (phase 2 then skipped sm[2]) */
    n.lsh = !a.r.do_hard ? 0.0 : a.r.do_soft && a.r.same_t ? lss : log(sm[2]);
    n.lss = (float)lss;
    n.lst = (float)lst;
    n.lss64 = lss;
    n.lst64 = lst;
    n.mt0 = n.mt;
    n.wide = kd_row_wide(n.ms) || (a.r.do_soft && kd_row_wide(n.mt));
    n.poisoned = a.r.do_soft && (isnan(lss) || isnan(lst));
    /* Y = (zt - mt) it - lst with the CPU's choice of constants (fld_teacher_shift, docs/MATH.md section 5),
     * in the divergence (phase 3) and in its gradient (phase 4) alike */
    if (a.r.do_soft) fld_teacher_shift(n.mt, lss, lst, a.r.inv_t, &n.mt, &n.lst);
    n.lh = (float)((double)n.ms + n.lsh);
    return n;
}

/* Phase 1: stat_max = {max zs, max zt} over this rank's columns (-inf for rows that do not
 * count, and for zt without a soft part). */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fldvp_max_kernel(fldvp_args a) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    int64_t y, yc;
    float ms = -INFINITY, mt = -INFINITY;
    if (fldvp_label(a, r, &y, &yc)) { /* the same branch for the whole block */
        ms = fldvp_row_max<DS>(a, a.r.zs + r * a.r.ldz, a.r.bs, red);
        if (a.r.do_soft) mt = fldvp_row_max<DT>(a, a.r.zt + r * a.r.ldz, a.r.bt, red);
    }
    if (threadIdx.x == 0) {
        a.stat_max[2 * r] = ms;
        a.stat_max[2 * r + 1] = mt;
    }
}

/* Phase 2: stat_sum = {sum e^((zs-ms)/T), sum e^((zt-mt)/T), sum e^(zs-ms), zs[y]} over this
 * rank's columns, at the maxima of every rank (0 for rows that do not count), and with the
 * entropy E (fldvp_ent_sum; the first sum then formed without the soft part too). */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fldvp_sums_kernel(fldvp_args a) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    const float *zs = a.r.zs + r * a.r.ldz;
    int64_t y, yc;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, zy = 0.0, e = 0.0;
    if (fldvp_label(a, r, &y, &yc)) {
        const float ms = (float)a.stat_max[2 * r], mt = (float)a.stat_max[2 * r + 1];
        if (a.r.do_soft || a.r.out_ent)
            s0 = fldvp_sum_exp<DS>(a, zs, a.r.bs, ms, a.r.inv_t, red);
        if (a.r.do_soft)
            s1 = fldvp_sum_exp<DT>(a, a.r.zt + r * a.r.ldz, a.r.bt, mt, a.r.inv_t, red);
        if (a.r.out_ent) e = fldvp_ent_sum<DS>(a, zs, a.r.bs, ms, a.r.inv_t, red);
        if (a.r.do_hard && !(a.r.do_soft && a.r.same_t))
            s2 = fldvp_sum_exp<DS>(a, zs, a.r.bs, ms, 1.0f, red);
        if (a.r.do_hard && yc >= 0) zy = zs[yc] + (a.r.bs ? kd_ld<DS>(a.r.bs, yc) : 0.0f);
    }
    if (threadIdx.x == 0) {
        double *sm = a.stat_sum + a.n_sum * r;
        sm[0] = s0;
        sm[1] = s1;
        sm[2] = s2;
        sm[3] = zy;
        if (a.n_sum > 4) sm[4] = e;
    }
}

/* Phase 3: stat_div = {sum of the divergence's terms, sum g} over this rank's columns; the row's
 * cross-entropy and lse (every rank computes the same from the reduced sums). */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fldvp_div_kernel(fldvp_args a) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x, gr = a.r.row0 + r;
    int64_t y, yc;
    const int valid = fldvp_label(a, r, &y, &yc);
    double d0 = 0.0, d1 = 0.0;
    const fldvp_norms nm = fldvp_norms_of(a, r);
    if (valid && a.r.do_soft) {
        const float *zs = a.r.zs + r * a.r.ldz, *zt = a.r.zt + r * a.r.ldz, it = a.r.inv_t;
        float accl = 0.0f, accg = 0.0f;
        for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.r.v; c0 += FLD_TILE) {
            const int n = a.r.v - c0 >= 8 ? 8 : (int)(a.r.v - c0);
            float s[8], t[8];
            fld_load<DS>(zs, a.r.bs, c0, n, s);
            fld_load<DT>(zt, a.r.bt, c0, n, t);
            if (nm.wide) { /* the careful form (row_special.cuh); the same in every thread */
                const double it64 = (double)it;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float g;
                    const float l =
                        kd_div_elem(&a.r.coef, kd_wide_lp(s[j], nm.ms, it64, nm.lss64),
                                    kd_wide_lp(t[j], nm.mt0, it64, nm.lst64), &g);
                    if (j < n) {
                        accl += l;
                        accg += g;
                    }
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float g;
                const float l = kd_div_elem(&a.r.coef, (s[j] - nm.ms) * it - nm.lss,
                                            (t[j] - nm.mt) * it - nm.lst, &g);
                if (j < n) {
                    accl += l;
                    accg += g;
                }
            }
        }
        d0 = kd_block_sum((double)accl, red);
        if (a.r.grad_soft) d1 = kd_block_sum((double)accg, red);
        /* the NaN policy: a NaN normalizer (every rank sees the reduced sums) makes the row's
         * divergence and sum g NaN, so that every element of its gradient is */
        if (nm.poisoned) d0 = d1 = __longlong_as_double(0x7ff8000000000000LL);
    }
    if (threadIdx.x != 0) return;
    a.stat_div[2 * r] = d0;
    a.stat_div[2 * r + 1] = d1;
    if (!valid) return; /* phase 4 writes the row outputs of rows that do not count */
    const double hard =
        a.r.do_hard ? ((double)nm.ms - a.stat_sum[a.n_sum * r + 3]) + nm.lsh : 0.0;
    a.r.row_hard[gr] = hard;
    if (a.r.out_hard) a.r.out_hard[gr] = (float)hard;
    if (a.r.out_lse) a.r.out_lse[gr] = a.r.do_hard ? nm.lh : 0.0f;
}

/* Phase 4: the row's divergence into row_soft, and dzs over zs (fld_dz_pass, in place). */
template <int DS, int DT>
__global__ void __launch_bounds__(FLD_ROW_THREADS) fldvp_grad_kernel(fldvp_args a) {
    const int64_t r = blockIdx.x, gr = a.r.row0 + r;
    float *zs = a.r.zs + r * a.r.ldz;
    const float *zt = a.r.zt ? a.r.zt + r * a.r.ldz : NULL;
    int64_t y, yc;
    if (!fldvp_label(a, r, &y, &yc)) {
        /* bad: a label out of range (a weight 0 ignores the row; bad weights never get here) */
        fld_skip_row<DS>(a.r, (void *)zs, gr, y != a.r.ignore && (y < 0 || y >= a.v_total));
        return;
    }
    if (threadIdx.x == 0) {
        const double d = a.r.do_soft ? a.stat_div[2 * r] : 0.0;
        a.r.row_soft[gr] = d;
        if (a.r.out_soft) a.r.out_soft[gr] = (float)d;
        if (a.r.out_ent) { /* H = E / S + log S (docs/MATH.md 12.1); NaN with a NaN S */
            const double *sm = a.stat_sum + a.n_sum * r;
            a.r.out_ent[gr] = (float)(sm[4] / sm[0] + log(sm[0]));
        }
    }
    if (!a.r.do_grad) return;
    const fldvp_norms nm = fldvp_norms_of(a, r);
    const float it = a.r.inv_t, S = (float)a.stat_div[2 * r + 1];
    float ca, cb;
    fld_factors(a.r, &ca, &cb);
    fld_weigh(a.r, gr, &ca, &cb);
    if (nm.wide) { /* the careful form (row_special.cuh): kd_wide_dz, S in double */
        const float gs = a.r.grad_soft ? cb : 0.0f, gh = a.r.grad_hard ? ca : 0.0f;
        const bool share = a.r.same_t && gs != 0.0f;
        const double it64 = (double)it, S64 = a.stat_div[2 * r + 1];
        fld_dz_pass<DS, DT>(a.r, zs, zt, a.r.grad_soft, [&](int64_t c, float s, float t) {
            float g = 0.0f;
            if (gs != 0.0f)
                (void)kd_div_elem(&a.r.coef, kd_wide_lp(s, nm.ms, it64, nm.lss64),
                                  kd_wide_lp(t, nm.mt0, it64, nm.lst64), &g);
            const float d = kd_wide_dz(s, g, nm.ms, it64, nm.lss64, S64, gs, gh, nm.lsh, share);
            return c == yc ? d - gh : d;
        });
        return;
    }
    fld_dz_pass<DS, DT>(a.r, zs, zt, a.r.grad_soft, [&](int64_t c, float s, float t) {
        return fld_dz(a.r, ca, cb, s, nm.lh, c == yc, (s - nm.ms) * it - nm.lss,
                     (t - nm.mt) * it - nm.lst, S);
    });
}

/* ---- host side ------------------------------------------------------------------------------- */

template <int DS, int DT>
static void fldvp_launch2(int phase, unsigned grid, const fldvp_args &a, cudaStream_t st) {
    switch (phase) {
    case 1: KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fldvp_max_kernel<DS, DT>)(a); break;
    case 2: KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fldvp_sums_kernel<DS, DT>)(a); break;
    case 3: KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fldvp_div_kernel<DS, DT>)(a); break;
    default: KD_LAUNCH(grid, FLD_ROW_THREADS, 0, st, fldvp_grad_kernel<DS, DT>)(a); break;
    }
}

/* Phase `phase` (1..4) over the chunk's rows. */
static kdloss_status fldvp_launch(int phase, kdloss_dtype ds, kdloss_dtype dt, int64_t rows,
                                 const fldvp_args &a, cudaStream_t st) {
    const unsigned grid = kd_grid(rows);
    if (ds == KDLOSS_BF16) {
        if (dt == KDLOSS_BF16) fldvp_launch2<KDLOSS_BF16, KDLOSS_BF16>(phase, grid, a, st);
        else fldvp_launch2<KDLOSS_BF16, KDLOSS_F32>(phase, grid, a, st);
    } else {
        if (dt == KDLOSS_BF16) fldvp_launch2<KDLOSS_F32, KDLOSS_BF16>(phase, grid, a, st);
        else fldvp_launch2<KDLOSS_F32, KDLOSS_F32>(phase, grid, a, st);
    }
    return kd_launch_status();
}

/* The plan: fld.cu's regions for this rank's v, the statistics, the dxs partial. */
typedef struct fldvp_plan {
    fld_plan fl;
    double *st;  /* 9 doubles a chunk row */
    float *part; /* (chunk x hs) fp32, with gradients */
} fldvp_plan;

static kdloss_status fldvp_plan_make(const kdloss_fused_linear_distill_params *p, int64_t bt,
                                    int64_t hs, int64_t v, kdloss_dtype sdt, int want_grad,
                                    int device, void *ws, fldvp_plan *P) {
    kd_carver cv = kd_carver_for(ws);
    kdloss_status s = fld_plan_carve(p, bt, hs, v, sdt, want_grad, device, &cv, &P->fl);
    if (s == KDLOSS_OK) s = kd_cuda_vp_carve(&cv, P->fl.chunk, 9, hs, want_grad, &P->st, &P->part);
    if (s != KDLOSS_OK) return s;
    P->fl.hdr = (kd_ws_header *)ws;
    P->fl.total = kd_ws_total(&cv);
    return KDLOSS_OK;
}

/* A checked call after the agreement. */
typedef struct fldvp_call {
    fld_gemms gm;             /* ctx, stream, xs / ws_r with their lds, the chunk's zs */
    const kdloss_comm *comm;
    kdloss_cmat xt, wt;      /* effective lds */
    int64_t ht;
    fld_grad_out G;           /* the gradients' outputs, zero_g */
    const fldvp_plan *P;
} fldvp_call;

/* The row phases of one chunk, the statistics all-reduced between them. */
static kdloss_status fldvp_rows(const fldvp_call &k, const fldvp_args &a, int64_t rows) {
    const kdloss_dtype ds = k.gm.sdt, dt = k.xt.dtype;
    const cudaStream_t st = k.gm.st;
    kdloss_status s = fldvp_launch(1, ds, dt, rows, a, st);
    if (s == KDLOSS_OK) s = kd_cuda_vp_allreduce(k.comm, a.stat_max, 2 * rows, KDLOSS_F64, KDLOSS_COMM_MAX);
    if (s == KDLOSS_OK) s = fldvp_launch(2, ds, dt, rows, a, st);
    if (s == KDLOSS_OK) s = kd_cuda_vp_allreduce(k.comm, a.stat_sum, a.n_sum * rows, KDLOSS_F64, KDLOSS_COMM_SUM);
    if (s == KDLOSS_OK) s = fldvp_launch(3, ds, dt, rows, a, st);
    if (s == KDLOSS_OK) s = kd_cuda_vp_allreduce(k.comm, a.stat_div, 2 * rows, KDLOSS_F64, KDLOSS_COMM_SUM);
    if (s == KDLOSS_OK) s = fldvp_launch(4, ds, dt, rows, a, st);
    return s;
}

/* One chunk: logits of the block, the phases, the backward (fld_chunk_backward; dxs summed over
 * the ranks). */
static kdloss_status fldvp_chunk(const fldvp_call &k, fldvp_args &a, int64_t r0, int64_t rows) {
    const fld_plan &P = k.P->fl;
    kdloss_status s = fld_chunk_logits(&k.gm, r0, rows, P.zs, k.xt,
                                      a.r.zt ? k.wt : kdloss_cmat{NULL, KDLOSS_F32, 0}, k.ht, P.zt);
    if (s == KDLOSS_OK)
        s = fld_map_rows(k.gm.st, P.zs, P.ldz, rows, a.r.v, a.r.map_bs, k.gm.sdt, a.r.map_s);
    if (s == KDLOSS_OK && a.r.zt)
        s = fld_map_rows(k.gm.st, P.zt, P.ldz, rows, a.r.v, a.r.map_bt, k.xt.dtype, a.r.map_t);
    a.r.row0 = r0;
    if (s == KDLOSS_OK) s = fldvp_rows(k, a, rows);
    if (s != KDLOSS_OK) return s;
    /* the label rules, against v_total */
    const fld_mask m = {a.r.labels, a.r.lab64, a.r.ignore, a.v_total, NULL, NULL, 0, 0, 0, a.r.w};
    return fld_chunk_backward(k.gm, k.G, m, r0, rows, [&] {
        const kdloss_mat dxs = {k.G.out->dxs.data, k.G.out->dxs.dtype, k.G.ld_dxs};
        return kd_cuda_vp_dxs(&k.gm, k.comm, k.P->part, r0, rows, dxs);
    });
}

/* Every chunk, then the gradients' completion and the scalar losses. On the context's device. */
static kdloss_status fldvp_run(const fldvp_call &k, const kdloss_fused_linear_distill_params *p,
                              const kdloss_vocab_shard *sh, const void *bs, const void *bt_bias,
                              kdloss_labels labels, int64_t bt) {
    const fld_plan &P = k.P->fl;
    fldvp_args a;
    fld_row_setup(&a.r, p, k.G.out, P, bs, bt_bias, labels, k.gm.v, k.G.want_grad && !k.G.zero_g);
    a.v_lo = sh->v_begin;
    a.v_total = sh->v_total;
    a.stat_max = k.P->st;
    a.n_sum = a.r.out_ent ? 5 : 4; /* the SUM's size: kdloss.h's protocol */
    a.stat_sum = a.stat_max + 2 * P.chunk;
    a.stat_div = a.stat_sum + a.n_sum * P.chunk;
    const cudaStream_t st = k.gm.st;
    kdloss_status s = kd_cuda_count_rows(st, labels.data, a.r.lab64, bt, sh->v_total,
                                         p->ignore_index, a.r.w, P.hdr);
    s = fld_for_chunks(s, bt, P.chunk,
                      [&](int64_t r0, int64_t rows) { return fldvp_chunk(k, a, r0, rows); });
    if (s == KDLOSS_OK) s = fld_end_grads(k.gm, k.G, bt);
    if (s == KDLOSS_OK) s = fld_final(st, P, bt, k.G.out, p);
    return s;
}

kdloss_status kdloss_cuda_fused_linear_distill_vp_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status s = fld_size_checks(kd_check_fld_params(&kd_cuda_rules, params), bt, hs, ht, v,
                                      1, student_dtype);
    fldvp_plan P;
    if (s == KDLOSS_OK)
        s = fldvp_plan_make(params, bt, hs, v, student_dtype, want_grad != 0, -1, NULL, &P);
    if (s == KDLOSS_OK) *bytes = P.fl.total;
    return s;
}

/* Shapes: xs (bt x hs), ws (v x hs) this rank's rows of the student head, bs [v], xt (bt x ht),
 * wt (v x ht), bt_bias [v], labels [bt] global ids; outputs per kdloss_fused_linear_distill_out
 * (dws, dbs: the block's rows); all device pointers, each matrix with its own ld. */
kdloss_status kdloss_cuda_fused_linear_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t ht, int64_t v,
    kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt, kdloss_cmat wt,
    const void *bt_bias, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kdloss_status s = kd_cuda_vp_enter(ctx, shard);
    if (s != KDLOSS_OK) return s; /* this rank cannot take part */
    kd_fld_checked g;
    kd_spanset spans;
    fldvp_plan P;
    const kd_fld_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    s = kd_vp_check_shard(shard, v);
    if (s == KDLOSS_OK)
        s = kd_check_fld(&kd_cuda_rules, params, bt, hs, v, v, xs, ws, bs, &t, labels, out, &g,
                         &spans);
    if (s == KDLOSS_OK)
        s = fldvp_plan_make(params, bt, hs, v, xs.dtype, g.want_grad, ctx->device, NULL, &P);
    if (s == KDLOSS_OK)
        s = kd_check_fld_workspace(&kd_cuda_rules, workspace, workspace_bytes, P.fl.total, &spans);
    /* the call's fingerprints (vp.h), as src/cpu/fld_vp.c forms them, once this rank's own checks
     * passed; n_valid -1: the device counts it after the agreement */
    kd_vp_terms terms = {0, 0};
    if (s == KDLOSS_OK) {
        terms.setup = kd_vp_setup_hash(xs.dtype, xt.dtype, wt.dtype, bs, bt_bias, labels,
                                       params->weight_hard_loss, params->weight_soft_loss, out, -1);
        terms.params = kd_vp_params_hash(&params->div, params->temperature,
                                         params->weight_hard_loss, params->weight_soft_loss,
                                         params->t2_scale, params->ignore_index,
                                         params->grad_scale, -1);
        terms.params = kd_vp_maps_hash(terms.params, &params->student_map, &params->teacher_map);
    }
    int64_t chunk = s == KDLOSS_OK ? P.fl.chunk : 1;
    kd_dev_guard dg;
    kdloss_status e = kd_dev_enter(ctx, &dg);
    if (e != KDLOSS_OK) return e;
    const cudaStream_t st = (cudaStream_t)stream;
    /* everything that can fail before the first chunk was decided above: after the agreement
     * every rank makes the chunk loop's collectives */
    if (s == KDLOSS_OK) s = kd_cuda_vp_weights(st, params->row_weights, bt, &terms.setup);
    s = kd_cuda_vp_agree(ctx, st, shard, v, s, bt, hs, ht, &terms, &chunk);
    if (s == KDLOSS_OK) {
        fldvp_plan_make(params, bt, hs, v, xs.dtype, g.want_grad, ctx->device, workspace,
                        &P);
        P.fl.chunk = chunk; /* in [1, this rank's] (checked): its regions still hold it */
        const fldvp_call k = {{ctx, st, P.fl.lt_ws, xs.dtype, xs.data, ws.data, g.ld_xs, g.ld_ws,
                              hs, v, P.fl.zs, P.fl.ldz},
                             shard->comm, {xt.data, xt.dtype, g.ld_xt}, {wt.data, wt.dtype, g.ld_wt},
                             ht, fld_grad_out_of(params, g, out, P.fl), &P};
        s = fldvp_run(k, params, shard, bs, bt_bias, labels, bt);
    }
    kd_dev_leave(&dg);
    return s;
}
