/* The vocabulary-parallel fused loss against a sparse top-k teacher on the GPU (kdloss.h,
 * kdloss_cuda_fused_linear_topk_distill_vp; docs/MATH.md sections 8 and 9): fld_topk.cu's dense
 * path on this rank's rows of the head, its row kernel split into phases with the statistics
 * all-reduced in between. */
#include "tk_rows.cuh"
#include "vp_cuda.h"

/* The launches of a chunk, on the caller's stream:
 *   tk_check_kernel   every row's label and ids against v_total (the global ids)
 *   zs = xs[chunk] ws_r^T                                     (fld_chunk_logits)
 *   1. max   over this rank's columns outside S and over all of them -> MAX 2 a row   (stat_max)
 *   2. sums  sum e^((zs-mr)/T) and sum e^(zs-mr) (T != 1) outside S, the label's logit, the
 *            |S| <= K selected logits, each from the rank that holds it, and with the entropy
 *            E_r = sum -e^u u outside S, u = (zs-mr)/T           -> SUM 4 + K (5 + K) (stat_sum)
 *   3+4. thread 0: the rest's log-sum-exp R, the untempered lse, kd_topk_row on all of S (the
 *        same numbers on every rank, no third all-reduce), the entropy from E_r and the slots
 *        (docs/MATH.md 12.1, top-k); then tk_pass_grad and tk_fixup, the
 *        single-process gradient passes, on this rank's columns and the slots it holds
 *   dws, dbs of the block (fld_chunk_wgrad; the rows whose gradient is 0 zeroed in its xs,
 *   fld_mask_rows); dxs: the partial in fp32 (renorm_both without the cross-entropy's gradient:
 *   from this rank's columns in S alone, tk_dx_s_launch), SUM, rounded once. Both gradient
 *   factors 0: none of this (no dxs all-reduce, as the CPU's), zero gradients.
 * Every tail mode runs this full-vocabulary path (renorm_both's sparse path is single-process).
 * S's bitmap (this rank's ids) and the slots live where tk_row_kernel keeps them (shared memory,
 * or TK_SLICES slices of the workspace, the grid then at most TK_SLICES blocks). Nothing in this
 * file has run on a GPU yet.
 *
 * Workspace: fld_topk.cu's dense plan (for this rank's v), then st: 7 + K doubles a chunk row
 * (stat_max, stat_sum; the entropy's counted whether or not it is asked for), and with gradients
 * part: (C x Hs) fp32, the chunk's dxs partial. */

typedef struct tkvp_args {
    tk_row_args r;   /* v: this rank's columns; row0, flags, ids and labels global */
    int64_t v_lo;    /* global id of local column 0 */
    int64_t n_sum;   /* 4 + K, or 5 + K with the entropy's E_r (the last) */
    double *stat_max, *stat_sum; /* [2 rows], [n_sum rows] of the chunk */
} tkvp_args;

/* ---- device side ----------------------------------------------------------------------------- */

/* Sets (or clears) the bits of this rank's ids of row gr; threads over the slots. The ids of a
 * row that counts were checked: -1 or in [0, v_total). */
__device__ void tkvp_mark(const tkvp_args &a, int64_t gr, uint32_t *bits, bool set) {
    for (int64_t j = threadIdx.x; j < a.r.k; j += blockDim.x) {
        const int64_t id = kd_topk_id(a.r.ids, a.r.ids64, a.r.ld_ids, gr, j);
        const int64_t c = id - a.v_lo;
        if (id < 0 || c < 0 || c >= a.r.v) continue;
        /* shared or global: generic atomics; clearing too, as several threads share a word */
        if (set) atomicOr(&bits[c >> 5], 1u << (c & 31));
        else atomicAnd(&bits[c >> 5], ~(1u << (c & 31)));
    }
}

/* f(z, in_s) for each of this thread's columns of local row r (bias added), in_s whether S
 * holds the column. */
template <int DG, class F>
__device__ __forceinline__ void tkvp_each(const tkvp_args &a, int64_t r, const uint32_t *bits,
                                          const F &f) {
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.r.v; c0 += TK_TILE) {
        const int n = a.r.v - c0 >= 8 ? 8 : (int)(a.r.v - c0);
        float zz[8];
        tk_load8<KDLOSS_F32, DG, true>(a.r, r, c0, n, zz);
        const uint32_t mk = (bits[c0 >> 5] >> (c0 & 31)) & 0xffu; /* c0 % 8 == 0 */
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n) f(zz[j], ((mk >> j) & 1u) != 0u);
    }
}

/* The maxima of local row r: *mr outside S, *m over every column (every thread gets both). */
template <int DG>
__device__ void tkvp_pass_max(const tkvp_args &a, int64_t r, const uint32_t *bits, float *red,
                              float *mr, float *m) {
    float xr = -INFINITY, xa = -INFINITY;
    tkvp_each<DG>(a, r, bits, [&](float z, bool in_s) {
        xa = fmaxf(xa, z);
        if (!in_s) xr = fmaxf(xr, z);
    });
    float vr = kd_block_max(xr, red);
    *m = kd_block_max(xa, red);
    /* the NaN policy, as the CPU's ph_keep_nan (fld_row_phases.h): fmaxf drops NaN, and a -inf
     * maximum outside S would skip the row's sums (the NaN lost: a row of NaN logits, from a NaN
     * in its xs, then got a finite row_lse). So a -inf or NaN maximum (uniform over the block:
     * a pass only on such rows) is checked for a NaN outside S, and a NaN maximum, or one found,
     * is sent as +inf: the sums at +inf are NaN where a NaN or +inf is, and the MAX all-reduce
     * cannot drop it as it may a NaN */
    if (!(vr > -INFINITY)) {
        float f = isnan(vr) ? INFINITY : -INFINITY;
        tkvp_each<DG>(a, r, bits, [&](float z, bool in_s) {
            if (!in_s && isnan(z)) f = INFINITY;
        });
        vr = kd_block_max(f, red);
        *m = fmaxf(*m, vr);
    }
    *mr = vr;
}

/* Sum over local row r's columns outside S of exp((z - mr) s), in double (thread 0). */
template <int DG>
__device__ double tkvp_sum_rest(const tkvp_args &a, int64_t r, const uint32_t *bits, float mr,
                                float s, double *red) {
    double acc = 0.0;
    tkvp_each<DG>(a, r, bits, [&](float z, bool in_s) {
        if (!in_s) acc += (double)expf((z - mr) * s);
    });
    return kd_block_sum(acc, red);
}

/* Sum over local row r's columns outside S of -e^u u, u = (z - mr) s (thread 0): the entropy's
 * E_r, each term in fp32 as tkvp_sum_rest's (0 where e^u is), summed in double. */
template <int DG>
__device__ double tkvp_ent_rest(const tkvp_args &a, int64_t r, const uint32_t *bits, float mr,
                                float s, double *red) {
    double acc = 0.0;
    tkvp_each<DG>(a, r, bits, [&](float z, bool in_s) {
        const float u = (z - mr) * s, e = expf(u);
        if (!in_s && e > 0.0f) acc -= (double)(e * u);
    });
    return kd_block_sum(acc, red);
}

/* Phase 1: stat_max = {max zs outside S, max zs} over this rank's columns (-inf for rows that do
 * not count). One block per row, grid-stride (tk_row_grid). */
template <int DG>
__global__ void __launch_bounds__(TK_ROW_THREADS) tkvp_max_kernel(tkvp_args a) {
    KD_DYN_SMEM(char, tk_smem, 16);
    __shared__ float red[32];
    uint32_t *bits = tk_bits_init(a.r, tk_smem);
    for (int64_t r = blockIdx.x; r < a.r.rows; r += gridDim.x) {
        const int64_t gr = a.r.row0 + r;
        float mr = -INFINITY, m = -INFINITY;
        if (a.r.flags[gr] == TK_ROW_OK) { /* the same for the whole block */
            tkvp_mark(a, gr, bits, true);
            __syncthreads();
            tkvp_pass_max<DG>(a, r, bits, red, &mr, &m); /* ends with a barrier */
            tkvp_mark(a, gr, bits, false);
            __syncthreads(); /* cleared before the next row's marks */
        }
        if (threadIdx.x == 0) {
            a.stat_max[2 * r] = mr;
            a.stat_max[2 * r + 1] = m;
        }
    }
}

/* Thread 0 of phase 2: the label's logit and the used slots' logits in slot order (0 where
 * another rank holds the id), after the two sums; 0 up to n_sum. */
template <int DG>
__device__ void tkvp_slot_sums(const tkvp_args &a, int64_t r, int64_t gr, double s0, double s1,
                               double e) {
    double *sm = a.stat_sum + a.n_sum * r;
    const tk_row_args &b = a.r;
    /* the label's logit wherever the cross-entropy is formed (row_lse alone too: the CPU's) */
    const int64_t y = b.do_hard && b.labels ? kd_label(b.labels, b.lab64, gr) - a.v_lo : -1;
    sm[0] = s0;
    sm[1] = s1;
    sm[2] = 0.0;
    sm[3] = y >= 0 && y < b.v ? (double)tk_z<KDLOSS_F32, DG>(b, r, y) : 0.0;
    int64_t n = 0;
    for (int64_t j = 0; j < b.k; j++) {
        const int64_t id = kd_topk_id(b.ids, b.ids64, b.ld_ids, gr, j);
        if (id < 0) continue;
        const int64_t c = id - a.v_lo;
        sm[4 + n++] = c >= 0 && c < b.v ? (double)tk_z<KDLOSS_F32, DG>(b, r, c) : 0.0;
    }
    for (; n < b.k; n++) sm[4 + n] = 0.0;
    if (b.out_ent) sm[4 + b.k] = e;
}

/* Phase 2: stat_sum = {sum e^((zs-mr)/T) outside S, sum e^(zs-mr) outside S (untempered lse at
 * T != 1), 0, zs[y], zs at S} over this rank's columns, at the maxima of every rank. */
template <int DG>
__global__ void __launch_bounds__(TK_ROW_THREADS) tkvp_sums_kernel(tkvp_args a) {
    KD_DYN_SMEM(char, tk_smem, 16);
    __shared__ double red[32];
    uint32_t *bits = tk_bits_init(a.r, tk_smem);
    for (int64_t r = blockIdx.x; r < a.r.rows; r += gridDim.x) {
        const int64_t gr = a.r.row0 + r;
        if (a.r.flags[gr] != TK_ROW_OK) {
            for (int64_t j = threadIdx.x; j < a.n_sum; j += blockDim.x) a.stat_sum[a.n_sum * r + j] = 0.0;
            continue;
        }
        tkvp_mark(a, gr, bits, true);
        __syncthreads();
        const float mr = (float)a.stat_max[2 * r];
        double s0 = 0.0, s1 = 0.0, e = 0.0;
        if (mr > -INFINITY) { /* else no column outside S anywhere: the sums are empty */
            s0 = tkvp_sum_rest<DG>(a, r, bits, mr, a.r.inv_t, red);
            if (a.r.do_hard && !a.r.same_t) s1 = tkvp_sum_rest<DG>(a, r, bits, mr, 1.0f, red);
            if (a.r.out_ent) e = tkvp_ent_rest<DG>(a, r, bits, mr, a.r.inv_t, red);
        }
        if (threadIdx.x == 0) tkvp_slot_sums<DG>(a, r, gr, s0, s1, e);
        __syncthreads(); /* every thread is done with the bits */
        tkvp_mark(a, gr, bits, false);
        __syncthreads();
    }
}

/* The row's entropy over every column (docs/MATH.md 12.1, top-k, full path) from the reduced
 * sums: with L = logaddexp(rest, lse(u_S)) the tempered log-normalizer, rest = mr / T + log S_r,
 * and c = mr / T - L, H = e^c (E_r - c S_r) + sum over S of -Q_j log Q_j (both parts >= 0; the
 * first 0 when no column is outside S); NaN with a NaN sum (the NaN policy). zk: the slots'
 * logits (n of them), u = z inv_t. */
__device__ double tkvp_entropy(double mr, double inv_t, double s_r, double e_r, double rest,
                               const float *zk, int64_t n) {
    const double L = kd_topk_logaddexp(rest, kd_topk_lse(zk, n, inv_t));
    double h = 0.0;
    if (mr > -INFINITY) {
        const double c = mr * inv_t - L;
        h = exp(c) * (e_r - c * s_r);
    }
    for (int64_t j = 0; j < n; j++) {
        const double x = (double)zk[j] * inv_t - L, q = exp(x);
        if (q > 0.0) h -= q * x;
    }
    return isnan(L) ? L : h;
}

/* Thread 0 of phase 3+4: the slots of every rank (this rank's local columns, -1 for the others'),
 * R, the untempered lse, kd_topk_row, the row's outputs and the gradient's state. The CPU's
 * topk_div (src/cpu/fld_row_phases.h) on the same reduced numbers. */
__device__ void tkvp_row_math(const tkvp_args &a, int64_t r, int64_t gr, tk_slots s,
                              tk_row_state *rs) {
    const tk_row_args &b = a.r;
    const double *sm = a.stat_sum + a.n_sum * r;
    int64_t n = 0;
    for (int64_t j = 0; j < b.k; j++) {
        const int64_t id = kd_topk_id(b.ids, b.ids64, b.ld_ids, gr, j);
        if (id < 0) continue;
        const int64_t c = id - a.v_lo;
        s.col[n] = c >= 0 && c < b.v ? c : -1;
        s.z[n] = (float)sm[4 + n];
        s.lp[n] = tk_ld_any(b.lp, b.lpdt, gr * b.ld_lp + j);
        n++;
    }
    const float mr = (float)a.stat_max[2 * r];
    const double rest = mr > -INFINITY ? (double)mr * b.inv_t64 + log(sm[0]) : -INFINITY;
    double lse1 = 0.0;
    if (b.do_hard) {
        const double rest1 = b.same_t ? rest : mr > -INFINITY ? (double)mr + log(sm[1]) : -INFINITY;
        lse1 = kd_topk_logaddexp(rest1, kd_topk_lse(s.z, n, 1.0));
    }
    double crest = 0.0;
    if (b.out_ent)
        b.out_ent[gr] =
            (float)tkvp_entropy((double)mr, b.inv_t64, sm[0], sm[4 + b.k], rest, s.z, n);
    const double d = kd_topk_row(&b.coef, b.tail, n, s.z, s.lp, b.inv_t64, rest, s.g, &crest);
    const int64_t y = b.do_ce ? kd_label(b.labels, b.lab64, gr) - a.v_lo : -1;
    rs->y = y >= 0 && y < b.v ? y : -1;
    rs->zy = 0.0f;
    tk_row_finish(b, gr, d, b.do_hard ? lse1 - sm[3] : 0.0, (float)rest, (float)lse1, crest, n,
                  rs);
}

/* Phase 3+4: the row's loss (every rank the same) and dz over this rank's columns in place. */
template <int DG>
__global__ void __launch_bounds__(TK_ROW_THREADS) tkvp_grad_kernel(tkvp_args a) {
    KD_DYN_SMEM(char, tk_smem, 16);
    __shared__ tk_row_state rs;
    const tk_slots s = tk_slots_of(a.r, tk_smem);
    for (int64_t r = blockIdx.x; r < a.r.rows; r += gridDim.x) {
        const int64_t gr = a.r.row0 + r;
        const int kind = a.r.flags[gr];
        if (kind != TK_ROW_OK) {
            tk_skip_row<DG, true>(a.r, r, gr, kind);
            continue;
        }
        if (threadIdx.x == 0) tkvp_row_math(a, r, gr, s, &rs);
        __syncthreads();
        const tk_row_state st = rs;
        if (a.r.g) {
            tk_pass_grad<KDLOSS_F32, DG, true>(a.r, r, st);
            __syncthreads();
            tk_fixup<DG>(a.r, r, s, st);
        }
        __syncthreads(); /* slots and rs are the next row's */
    }
}

/* ---- host side ------------------------------------------------------------------------------- */

template <int DG>
static void tkvp_launch2(int phase, unsigned grid, size_t smem, const tkvp_args &a,
                         cudaStream_t st) {
    switch (phase) {
    case 1: KD_LAUNCH(grid, TK_ROW_THREADS, smem, st, tkvp_max_kernel<DG>)(a); break;
    case 2: KD_LAUNCH(grid, TK_ROW_THREADS, smem, st, tkvp_sums_kernel<DG>)(a); break;
    default: KD_LAUNCH(grid, TK_ROW_THREADS, smem, st, tkvp_grad_kernel<DG>)(a); break;
    }
}

/* Phase 1, 2 or 3 (3+4) over the chunk's rows; DG the student's dtype (bias, dz). */
static kdloss_status tkvp_launch(int phase, kdloss_dtype ds, const tkvp_args &a,
                                 const tk_scratch &sc, cudaStream_t st) {
    const unsigned grid = tk_row_grid(a.r.rows, sc);
    if (ds == KDLOSS_BF16) tkvp_launch2<KDLOSS_BF16>(phase, grid, sc.smem, a, st);
    else tkvp_launch2<KDLOSS_F32>(phase, grid, sc.smem, a, st);
    return kd_launch_status();
}

/* The plan: fld_topk.cu's dense regions for this rank's v, the statistics, the dxs partial. */
typedef struct tkvp_plan {
    tk_plan tk;
    double *st;  /* (7 + K) doubles a chunk row */
    float *part; /* (chunk x hs) fp32, with gradients */
} tkvp_plan;

static kdloss_status tkvp_plan_make(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                                    int64_t hs, int64_t v, int64_t k, kdloss_dtype sdt,
                                    int want_grad, void *ws, tkvp_plan *P) {
    kd_carver cv = kd_carver_for(ws);
    kdloss_status s = tk_dense_carve(p, bt, hs, v, k, sdt, want_grad, &cv, &P->tk);
    if (s == KDLOSS_OK)
        s = kd_cuda_vp_carve(&cv, P->tk.chunk, 7 + k, hs, want_grad, &P->st, &P->part);
    if (s != KDLOSS_OK) return s;
    P->tk.hdr = (tk_header *)ws;
    P->tk.total = kd_ws_total(&cv);
    return KDLOSS_OK;
}

/* A checked call after the agreement. */
typedef struct tkvp_call {
    fld_gemms gm;             /* ctx, stream, xs / ws_r with their lds, the chunk's zs */
    const kdloss_comm *comm;
    fld_grad_out G;           /* the gradients' outputs, zero_g */
    const kd_fld_checked *g;
    const tkvp_plan *P;
    int gh0, sdx;            /* tk_gh_zero; renorm_both with it: dxs from S (tk_dx_s_launch) */
} tkvp_call;

/* One chunk: logits of the block, the phases with their all-reduces, the backward
 * (fld_chunk_backward; dxs summed over the ranks). */
static kdloss_status tkvp_chunk(const tkvp_call &k, tkvp_args &a, int64_t r0, int64_t rows) {
    const tk_plan &P = k.P->tk;
    const kdloss_cmat none = {NULL, KDLOSS_F32, 0};
    const kdloss_dtype ds = k.gm.sdt;
    const cudaStream_t st = k.gm.st;
    a.r.row0 = r0;
    a.r.rows = rows;
    kdloss_status s = fld_chunk_logits(&k.gm, r0, rows, P.zs, none, none, 0, NULL);
    if (s == KDLOSS_OK)
        s = fld_map_rows(st, P.zs, P.ldz, rows, a.r.v, a.r.map_bias, ds, a.r.map_s);
    if (s == KDLOSS_OK) s = tkvp_launch(1, ds, a, P.sc, st);
    if (s == KDLOSS_OK) s = kd_cuda_vp_allreduce(k.comm, a.stat_max, 2 * rows, KDLOSS_F64, KDLOSS_COMM_MAX);
    if (s == KDLOSS_OK) s = tkvp_launch(2, ds, a, P.sc, st);
    if (s == KDLOSS_OK)
        s = kd_cuda_vp_allreduce(k.comm, a.stat_sum, a.n_sum * rows, KDLOSS_F64, KDLOSS_COMM_SUM);
    if (s == KDLOSS_OK) s = tkvp_launch(3, ds, a, P.sc, st);
    if (s != KDLOSS_OK) return s;
    return fld_chunk_backward(k.gm, k.G, tk_mask_of(a.r, k.gh0), r0, rows, [&] {
        const kdloss_mat dxs = {k.G.out->dxs.data, k.G.out->dxs.dtype, k.G.ld_dxs};
        if (!k.sdx) return kd_cuda_vp_dxs(&k.gm, k.comm, k.P->part, r0, rows, dxs);
        kdloss_status sd = tk_dx_s_launch(st, a.r, ds, P.zs, ds == KDLOSS_BF16 ? 2 * P.ldz : P.ldz,
                                          k.gm.ws, k.gm.ld_ws, a.v_lo, k.gm.hs, k.P->part,
                                          k.gm.hs, 0);
        return sd == KDLOSS_OK ? kd_cuda_vp_dxs_reduce(&k.gm, k.comm, k.P->part, r0, rows, dxs)
                               : sd;
    });
}

/* The row checks, every chunk, the gradients' completion, the scalar losses. On the context's
 * device. */
static kdloss_status tkvp_run(const tkvp_call &k, const kdloss_fused_linear_topk_distill_params *p,
                              const kdloss_vocab_shard *sh, const void *bs,
                              const kdloss_topk_teacher &t, kdloss_labels labels, int64_t bt) {
    const tk_plan &P = k.P->tk;
    const kd_fld_checked &g = *k.g;
    const cudaStream_t st = k.gm.st;
    tk_check_args c = tk_check_of(t, g.ld_ids, labels, p->ignore_index, bt, sh->v_total, P);
    c.w = p->row_weights; /* checked on the host (kd_cuda_vp_weights): 0 ignores a row */
    tkvp_args a;
    tk_row_common(&a.r, t, g.ld_lp, c, P);
    tk_row_fused(&a.r, p, k.G.out, labels.data != NULL, bs, P, g.want_grad && !k.G.zero_g);
    a.r.v = k.gm.v; /* tk_row_common gave the ids' range, v_total */
    a.v_lo = sh->v_begin;
    a.n_sum = 4 + t.k + (a.r.out_ent != NULL); /* the SUM's size: kdloss.h's protocol */
    a.stat_max = k.P->st;
    a.stat_sum = a.stat_max + 2 * P.chunk;
    kdloss_status s = tk_check_launch(st, c);
    if (s == KDLOSS_OK) s = tk_zero_slices(P, st);
    s = fld_for_chunks(s, bt, P.chunk,
                      [&](int64_t r0, int64_t rows) { return tkvp_chunk(k, a, r0, rows); });
    if (s == KDLOSS_OK) s = fld_end_grads(k.gm, k.G, bt);
    if (s == KDLOSS_OK)
        s = tk_final_launch(st, P.row_soft, P.row_hard, bt, P.hdr, k.G.out, p->weight_hard_loss,
                            p->weight_soft_loss,
                            p->t2_scale ? p->temperature * p->temperature : 1.0, 1,
                            p->row_weights);
    return s;
}

kdloss_status kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status s = fld_size_checks(kd_topk_check_fused_params(params), bt, hs, hs, v, k,
                                     student_dtype);
    tkvp_plan P;
    if (s == KDLOSS_OK)
        s = tkvp_plan_make(params, bt, hs, v, k, student_dtype, want_grad != 0, NULL, &P);
    if (s == KDLOSS_OK) *bytes = P.tk.total;
    return s;
}

/* Shapes: xs (bt x hs), ws (v x hs) this rank's rows of the head, bs [v], teacher (bt rows of k,
 * global ids), labels [bt] optional (global ids); outputs per kdloss_fused_linear_distill_out
 * (dws, dbs: the block's rows); all device pointers, each with its own ld. */
kdloss_status kdloss_cuda_fused_linear_topk_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs,
    kdloss_cmat ws, const void *bs, kdloss_topk_teacher teacher, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kdloss_status s = kd_cuda_vp_enter(ctx, shard);
    if (s != KDLOSS_OK) return s; /* this rank cannot take part */
    kd_fld_checked g;
    kd_spanset spans;
    tkvp_plan P;
    s = kd_vp_check_shard(shard, v);
    if (s == KDLOSS_OK)
        s = kd_check_fltk(&kd_cuda_rules, params, bt, hs, v, xs, ws, bs, teacher, labels, out, &g,
                          &spans);
    if (s == KDLOSS_OK)
        s = tkvp_plan_make(params, bt, hs, v, teacher.k, xs.dtype, g.want_grad, NULL, &P);
    if (s == KDLOSS_OK)
        s = kd_check_fld_workspace(&kd_cuda_rules, workspace, workspace_bytes, P.tk.total, &spans);
    /* the call's fingerprints (vp.h), as src/cpu/fld_vp.c forms them, once this rank's own checks
     * passed: the teacher's dtypes are the ids' and the log-probs', no teacher bias; n_valid -1:
     * the device counts it after the agreement */
    kd_vp_terms terms = {0, 0};
    if (s == KDLOSS_OK) {
        terms.setup = kd_vp_setup_hash(xs.dtype, teacher.ids.dtype, teacher.logprobs.dtype, bs,
                                       NULL, labels, params->weight_hard_loss,
                                       params->weight_soft_loss, out, -1);
        terms.params = kd_vp_params_hash(&params->div, params->temperature,
                                         params->weight_hard_loss, params->weight_soft_loss,
                                         params->t2_scale, params->ignore_index,
                                         params->grad_scale, (int)params->tail);
        terms.params = kd_vp_maps_hash(terms.params, &params->student_map, NULL);
    }
    int64_t chunk = s == KDLOSS_OK ? P.tk.chunk : 1;
    kd_dev_guard dg;
    kdloss_status e = kd_dev_enter(ctx, &dg);
    if (e != KDLOSS_OK) return e;
    const cudaStream_t st = (cudaStream_t)stream;
    /* everything that can fail before the first chunk was decided above: after the agreement
     * every rank makes the chunk loop's collectives */
    if (s == KDLOSS_OK) s = kd_cuda_vp_weights(st, params->row_weights, bt, &terms.setup);
    s = kd_cuda_vp_agree(ctx, st, shard, v, s, bt, hs, teacher.k, &terms, &chunk);
    if (s == KDLOSS_OK) {
        tkvp_plan_make(params, bt, hs, v, teacher.k, xs.dtype, g.want_grad, workspace, &P);
        P.tk.chunk = chunk; /* in [1, this rank's] (checked): its regions still hold it */
        const int gh0 = tk_gh_zero(params);
        const tkvp_call k = {{ctx, st, P.tk.lt_ws, xs.dtype, xs.data, ws.data, g.ld_xs, g.ld_ws,
                              hs, v, P.tk.zs, P.tk.ldz},
                             shard->comm, fld_grad_out_of(params, g, out, P.tk), &g, &P, gh0,
                             gh0 && params->tail == KDLOSS_TAIL_RENORM_BOTH};
        s = tkvp_run(k, params, shard, bs, teacher, labels, bt);
    }
    kd_dev_leave(&dg);
    return s;
}
