/* The sparse top-k teacher on the GPU, the loss on logits (kdloss.h:
 * kdloss_cuda_topk_distill_logits; docs/MATH.md section 8), and the kernels every top-k call
 * launches: the row checks, the dense row kernel (the V-wide work around kd_topk_row,
 * src/common/topk_row.h, the same code the CPU paths run on the used slots) and the final
 * reduction. The fused loss's host side and its sparse path are fld_topk.cu's; tk_rows.cuh
 * declares what they share. */
#include "tk_rows.cuh"

/* Launches of a call, on the caller's stream:
 *   1. tk_check_kernel: per row, the label's kind and the ids' validity (range and repeats: the
 *      ids are device memory, like labels, so a fault goes to the status word, kdloss.h), into
 *      one flag byte per row and the header counters. n_valid is known before any gradient.
 *   2. dense rows (the logits entry, and the fused loss chunk by chunk after its GEMM,
 *      tk_row_launch_fused): one block per row, tk_row_kernel: gather the slots (and mark S in a
 *      bitmap), the masked max / sum-exp over the columns outside S (rest_lse R) and the
 *      untempered lse, kd_topk_row in thread 0, then the gradient pass
 *      dz_j = cb c_rest exp(u_j - R) + ca (softmax(zs)_j - [j = y]) and the |S| slot values
 *      written over it.
 *   3. the fused loss's gradients and its sparse rows: fld_topk.cu.
 *   4. tk_final_kernel: the scalar losses in a fixed order, and the status word.
 * No float atomics anywhere: every sum has a fixed order, so results are bitwise reproducible.
 * The only atomics are integer ones (counters, a bitmap), whose results do not depend on their
 * order. */

/* ---- 1. row checks ------------------------------------------------------------------------- */

/* 1 if the ids of row r are valid: each -1 or in [0, v), no used id twice. One warp: lane l
 * holds slots l, l + 32, ... and compares each with every earlier slot (all lanes read slot i at
 * once: broadcast loads). K^2 / 2 compares a row: K is small. The whole warp gets the answer. */
__device__ __forceinline__ int tk_ids_ok(const tk_check_args &a, int64_t r, int lane) {
    int bad = 0;
    for (int64_t j0 = 0; j0 < a.k; j0 += 32) {
        const int64_t j = j0 + lane;
        const int64_t id = j < a.k ? kd_topk_id(a.ids, a.ids64, a.ld_ids, r, j) : -1;
        if (id != -1 && (id < 0 || id >= a.v)) bad = 1;
        for (int64_t i = 0; id >= 0 && !bad && i < j; i++)
            if (kd_topk_id(a.ids, a.ids64, a.ld_ids, r, i) == id) bad = 1;
    }
    return !__any_sync(0xffffffffu, bad);
}

/* Row r's flag from its ids (ok), its label's kind lk and its weight's (kd_weight_kind): a bad
 * id, label or weight makes the row bad (in that order); a weight of 0 ignores it. */
__device__ __forceinline__ int tk_row_flag(int ok, int lk, int wk) {
    if (!ok) return TK_ROW_BAD_ID;
    if (lk == TK_ROW_BAD_LABEL) return lk;
    if (wk == 2) return TK_ROW_BAD_WEIGHT;
    return lk == TK_ROW_IGNORED || wk == 1 ? TK_ROW_IGNORED : TK_ROW_OK;
}

/* One warp per row (grid-stride): flags[r] and the four counters (integer atomics, one per
 * block: the totals are exact whatever the order). Every row's ids and weight are checked,
 * ignored rows too (kdloss.h); a row with invalid ids is flagged so whatever its label. */
__global__ void __launch_bounds__(TK_CHECK_THREADS) tk_check_kernel(tk_check_args a) {
    __shared__ unsigned long long red[32];
    const int lane = threadIdx.x & 31;
    const int64_t wpb = TK_CHECK_THREADS / 32;
    unsigned long long nv = 0, nl = 0, ni = 0, nw = 0;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < a.bt;
         r += (int64_t)gridDim.x * wpb) {
        const int ok = tk_ids_ok(a, r, lane);
        int lk = TK_ROW_OK;
        if (a.labels) {
            const int64_t y = kd_label(a.labels, a.lab64, r);
            lk = y == a.ignore ? TK_ROW_IGNORED : (y >= 0 && y < a.v) ? TK_ROW_OK : TK_ROW_BAD_LABEL;
        }
        const int wk = kd_weight_kind(a.w, r);
        const int kind = tk_row_flag(ok, lk, wk);
        if (lane == 0) {
            a.flags[r] = (uint8_t)kind;
            nv += kind == TK_ROW_OK;
            nl += lk == TK_ROW_BAD_LABEL;
            ni += !ok;
            nw += wk == 2;
        }
    }
    nv = kd_block_sum(nv, red);
    nl = kd_block_sum(nl, red);
    ni = kd_block_sum(ni, red);
    nw = kd_block_sum(nw, red);
    if (threadIdx.x == 0) {
        if (nv) atomicAdd(&a.hdr->n_valid, nv);
        if (nl) atomicAdd(&a.hdr->n_bad_label, nl);
        if (ni) atomicAdd(&a.hdr->n_bad_id, ni);
        if (nw) atomicAdd(&a.hdr->n_bad_w, nw);
    }
}

kdloss_status tk_check_launch(cudaStream_t st, const tk_check_args &a) {
    cudaError_t e = cudaMemsetAsync(&a.hdr->n_valid, 0, 4 * sizeof(unsigned long long), st);
    if (e != cudaSuccess) return kd_cuda_status(e);
    const int64_t wpb = TK_CHECK_THREADS / 32;
    int64_t blocks = (a.bt + wpb - 1) / wpb;
    if (blocks > 4096) blocks = 4096; /* warps loop over rows; few atomics */
    KD_LAUNCH((unsigned)blocks, TK_CHECK_THREADS, 0, st, tk_check_kernel)(a);
    return kd_launch_status();
}

/* ---- 4. the scalar losses and the status word ------------------------------------------------ */

/* The status word of a top-k call from its counters: the code the CPU function returns for
 * the first fault its checks meet (the fused loss: ids, labels, weights; the logits loss:
 * labels, weights, ids). */
__device__ __forceinline__ int32_t tk_status_of(const tk_header *hdr, int ids_first) {
    const int bid = hdr->n_bad_id > 0, bl = hdr->n_bad_label > 0, bw = hdr->n_bad_w > 0;
    if (bid && (ids_first || (!bl && !bw))) return (int32_t)KDLOSS_ERR_INVALID_ID;
    if (bl) return (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE;
    return bw ? (int32_t)KDLOSS_ERR_INVALID_PARAM : (int32_t)KDLOSS_OK;
}

/* row_soft, row_hard [bt] (row_hard may be NULL), w [bt] (NULL: 1) -> the scalar losses (one
 * block, fixed order):
 *   soft = sum w row_soft * soft_fac / n, hard = sum w row_hard / n,
 *   loss = w_hard hard + w_soft soft
 * with n = max(1, n_valid); NaN when a row is bad; the status word (tk_status_of). */
__global__ void __launch_bounds__(TK_FINAL_THREADS)
tk_final_kernel(const double *row_soft, const double *row_hard, int64_t bt, tk_header *hdr,
                float *loss, float *soft_loss, float *hard_loss, double w_hard, double w_soft,
                double soft_fac, int ids_first, const float *w) {
    __shared__ double red[32];
    double s = 0.0, h = 0.0;
    for (int64_t i = threadIdx.x; i < bt; i += blockDim.x) {
        const double wi = w ? (double)w[i] : 1.0; /* 1: the same bits as without weights */
        s += w ? row_soft[i] * wi : row_soft[i];
        if (row_hard) h += w ? row_hard[i] * wi : row_hard[i];
    }
    s = kd_block_sum(s, red);
    h = kd_block_sum(h, red);
    if (threadIdx.x == 0) {
        const int32_t code = tk_status_of(hdr, ids_first);
        const int bad = code != (int32_t)KDLOSS_OK;
        const double n = hdr->n_valid > 0 ? (double)hdr->n_valid : 1.0;
        const float qnan = __int_as_float(0x7fc00000);
        const double sl = s * soft_fac / n, hl = h / n;
        if (loss) *loss = bad ? qnan : (float)(w_hard * hl + w_soft * sl);
        if (soft_loss) *soft_loss = bad ? qnan : (float)sl;
        if (hard_loss) *hard_loss = bad ? qnan : (float)hl;
        hdr->status = code;
    }
}

kdloss_status tk_final_launch(cudaStream_t st, const double *row_soft, const double *row_hard,
                              int64_t bt, tk_header *hdr, const kdloss_fused_linear_distill_out *out,
                              double w_hard, double w_soft, double soft_fac, int ids_first,
                              const float *w) {
    KD_LAUNCH(1, TK_FINAL_THREADS, 0, st, tk_final_kernel)(row_soft, row_hard, bt, hdr, out->loss,
                                                           out->soft_loss, out->hard_loss, w_hard,
                                                           w_soft, soft_fac, ids_first, w);
    return kd_launch_status();
}

/* ---- 2. dense rows --------------------------------------------------------------------------- */

/* Threads over the slots: id, logit and teacher log-prob of each (uncompacted), and S's bits.
 * Thread 0 also reads the label's logit (before the gradient pass may overwrite it). The ids
 * of an OK row were checked by tk_check_kernel. */
template <int DZ, int DG>
__device__ void tk_gather(const tk_row_args &a, int64_t r, int64_t gr, tk_slots s,
                          uint32_t *bits, tk_row_state *rs) {
    for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) {
        const int64_t id = kd_topk_id(a.ids, a.ids64, a.ld_ids, gr, j);
        s.col[j] = id;
        if (id < 0) continue;
        s.z[j] = tk_z<DZ, DG>(a, r, id);
        s.lp[j] = tk_ld_any(a.lp, a.lpdt, gr * a.ld_lp + j);
        atomicOr(&bits[id >> 5], 1u << (id & 31)); /* shared or global: generic atomics */
    }
    if (threadIdx.x == 0) {
        /* the label's logit wherever the row's cross-entropy is formed (row_lse alone too, as
         * the CPU's topk_div: a NaN there reaches row_hard, and the total loss with it) */
        const int64_t y = a.labels && a.do_hard ? kd_label(a.labels, a.lab64, gr) : -1;
        rs->y = a.do_ce ? y : -1;
        rs->zy = y >= 0 ? tk_z<DZ, DG>(a, r, y) : 0.0f;
    }
}

/* The V-wide reductions: R = lse(u_j : j not in S) (need_r; S masked through its bitmap) and
 * the untempered lse (do_hard with T != 1). Every thread gets both. */
template <int DZ, int DG, bool VEC>
__device__ void tk_pass_lse(const tk_row_args &a, int64_t r, const uint32_t *bits,
                            kd_lse *lred, float *R, float *lh) {
    const int need_h = a.do_hard && !a.same_t;
    kd_lse sR = {-INFINITY, 0.0f}, sH = {-INFINITY, 0.0f};
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += TK_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float zz[8];
        tk_load8<DZ, DG, VEC>(a, r, c0, n, zz);
        if (need_h) kd_lse_add8(&sH, zz, n);
        if (a.need_r) {
            const uint32_t m = (bits[c0 >> 5] >> (c0 & 31)) & 0xffu; /* c0 % 8 == 0 */
            float u[8];
#pragma unroll
            for (int j = 0; j < 8; j++) u[j] = (m >> j) & 1u ? -INFINITY : zz[j] * a.inv_t;
            kd_lse_add8(&sR, u, n);
        }
    }
    *R = a.need_r ? kd_block_lse(sR, lred) : -INFINITY;
    *lh = need_h ? kd_block_lse(sH, lred) : 0.0f;
}


/* Thread 0: compact the used slots (slot order), kd_topk_row, the row's outputs and the
 * gradient factors, and with the entropy the tempered lse over every column (R and the slots'
 * lse, as the untempered one at T = 1). lh: the untempered lse of the pass (T != 1). */
__device__ void tk_row_math(const tk_row_args &a, int64_t gr, tk_slots s, float R, float lh,
                            tk_row_state *rs) {
    const int64_t n = tk_compact(s, a.k);
    double crest = 0.0;
    const double d = kd_topk_row(&a.coef, a.tail, n, s.z, s.lp, a.inv_t64, (double)R, s.g,
                                 &crest);
    /* T == 1: lse over all columns = logaddexp(R, lse over S), both parts exact */
    if (a.do_hard && a.same_t) lh = (float)kd_topk_logaddexp((double)R, kd_topk_lse(s.z, n, 1.0));
    if (a.out_ent) rs->lt = (float)kd_topk_logaddexp((double)R, kd_topk_lse(s.z, n, a.inv_t64));
    tk_row_finish(a, gr, d, a.do_hard ? (double)(lh - rs->zy) : 0.0, R, lh, crest, n, rs);
}

/* One block per row (grid-stride over the launch's rows). DZ: dtype of the logit rows; DG: of
 * the gradient and the bias; VEC: every row 16-byte aligned. */
template <int DZ, int DG, bool VEC>
__global__ void __launch_bounds__(TK_ROW_THREADS) tk_row_kernel(tk_row_args a) {
    KD_DYN_SMEM(char, tk_smem, 16);
    __shared__ kd_lse lred[32];
    __shared__ double hred[32];
    __shared__ tk_row_state rs;
    const tk_slots s = tk_slots_of(a, tk_smem);
    uint32_t *bits = tk_bits_init(a, tk_smem);
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const int64_t gr = a.row0 + r;
        const int kind = a.flags[gr]; /* the same for the whole block */
        if (kind != TK_ROW_OK) {
            tk_skip_row<DG, VEC>(a, r, gr, kind);
            continue;
        }
        tk_gather<DZ, DG>(a, r, gr, s, bits, &rs);
        __syncthreads();
        float R, lh;
        tk_pass_lse<DZ, DG, VEC>(a, r, bits, lred, &R, &lh);
        if (threadIdx.x == 0) tk_row_math(a, gr, s, R, lh, &rs);
        __syncthreads();
        const tk_row_state st = rs;
        /* before the gradient, which may overwrite the logits (the fused loss's dz in place) */
        if (a.out_ent) tk_pass_ent<DZ, DG, VEC>(a, r, gr, st.lt, hred);
        if (a.g) {
            tk_pass_grad<DZ, DG, VEC>(a, r, st);
            __syncthreads();
            tk_fixup<DG>(a, r, s, st);
        }
        /* each thread clears its own bits: a plain store of the word by several threads at
         * once is a race (racecheck), even of the same value */
        for (int64_t k = threadIdx.x; k < st.n; k += blockDim.x)
            atomicAnd(&bits[s.col[k] >> 5], ~(1u << (s.col[k] & 31)));
        __syncthreads(); /* slots, bits and rs are the next row's */
    }
}

/* ---- host side: the logits loss's workspace plan -------------------------------------------
 * Workspace (after the 256-byte header, each part 256-byte aligned, tk_carve_common):
 *   flags [bt] uint8, row_soft [bt] double,
 *   slot / bitmap slices (TK_SLICES of them) when they do not fit in shared memory.
 * The fused loss's plans: fld_topk.cu. */

static kdloss_status tk_logits_plan(int64_t bt, int64_t v, int64_t k, void *ws, tk_plan *P) {
    if (bt <= 0 || v <= 0 || k <= 0) return KDLOSS_ERR_INVALID_SIZE;
    if (!tk_sizes_ok(bt, v, k, 1)) return KDLOSS_ERR_INVALID_SIZE;
    memset(P, 0, sizeof *P);
    P->sc = tk_scratch_plan(v, k, 1);
    kd_carver c = kd_carver_for(ws);
    tk_carve_common(&c, bt, 0, P);
    P->hdr = (tk_header *)ws;
    P->total = kd_ws_total(&c);
    return KDLOSS_OK;
}

/* ---- host side: launchers ------------------------------------------------------------------- */

template <int DZ, int DG>
static void tk_row_launch2(const tk_row_args &a, const tk_scratch &sc, bool vec, cudaStream_t st) {
    const unsigned grid = tk_row_grid(a.rows, sc);
    if (vec) KD_LAUNCH(grid, TK_ROW_THREADS, sc.smem, st, tk_row_kernel<DZ, DG, true>)(a);
    else KD_LAUNCH(grid, TK_ROW_THREADS, sc.smem, st, tk_row_kernel<DZ, DG, false>)(a);
}

/* The logits entry: logits and gradient in the student's dtype. */
static void tk_row_launch_logits(kdloss_dtype ds, const tk_row_args &a, const tk_scratch &sc,
                                 bool vec, cudaStream_t st) {
    switch (ds) {
    case KDLOSS_F32: tk_row_launch2<KDLOSS_F32, KDLOSS_F32>(a, sc, vec, st); break;
    case KDLOSS_BF16: tk_row_launch2<KDLOSS_BF16, KDLOSS_BF16>(a, sc, vec, st); break;
    default: tk_row_launch2<KDLOSS_F16, KDLOSS_F16>(a, sc, vec, st); break;
    }
}

/* The dense fused loss: fp32 chunk logits, bias and dz in the student's dtype. */
kdloss_status tk_row_launch_fused(kdloss_dtype ds, const tk_row_args &a, const tk_scratch &sc,
                                  cudaStream_t st) {
    const unsigned grid = tk_row_grid(a.rows, sc);
    if (ds == KDLOSS_BF16)
        KD_LAUNCH(grid, TK_ROW_THREADS, sc.smem, st, tk_row_kernel<KDLOSS_F32, KDLOSS_BF16, true>)(
            a);
    else
        KD_LAUNCH(grid, TK_ROW_THREADS, sc.smem, st, tk_row_kernel<KDLOSS_F32, KDLOSS_F32, true>)(
            a);
    return kd_launch_status();
}

kdloss_status tk_zero_slices(const tk_plan &P, cudaStream_t st) {
    if (!P.gbits) return KDLOSS_OK;
    return kd_cuda_status(cudaMemsetAsync(P.gbits, 0, (size_t)TK_SLICES * (size_t)P.sc.words * 4u, st));
}

/* The teacher's and the labels' fields of the check kernel and of a row kernel. */
tk_check_args tk_check_of(const kdloss_topk_teacher &t, int64_t ld_ids, kdloss_labels labels,
                          int64_t ignore, int64_t bt, int64_t v, const tk_plan &P) {
    tk_check_args c;
    c.labels = labels.data;
    c.lab64 = labels.dtype == KDLOSS_I64;
    c.ignore = ignore;
    c.ids = t.ids.data;
    c.ids64 = t.ids.dtype == KDLOSS_I64;
    c.ld_ids = ld_ids;
    c.bt = bt;
    c.v = v;
    c.k = t.k;
    c.w = NULL;
    c.flags = P.flags;
    c.hdr = P.hdr;
    return c;
}

void tk_row_common(tk_row_args *a, const kdloss_topk_teacher &t, int64_t ld_lp,
                   const tk_check_args &c, const tk_plan &P) {
    memset(a, 0, sizeof *a);
    a->map_s = kd_logit_map_make(kdloss_logit_map{1.0, 0.0}); /* the identity */
    a->ids = t.ids.data;
    a->ids64 = c.ids64;
    a->ld_ids = c.ld_ids;
    a->lp = t.logprobs.data;
    a->lpdt = (int)t.logprobs.dtype;
    a->ld_lp = ld_lp;
    a->labels = c.labels;
    a->lab64 = c.lab64;
    a->flags = P.flags;
    a->v = c.v;
    a->k = t.k;
    a->hdr = P.hdr;
    a->row_soft = P.row_soft;
    a->row_hard = P.row_hard;
    a->gslot = P.gslot;
    a->slot_stride = P.sc.slot_stride;
    a->gbits = P.gbits;
    a->words = P.sc.words;
    a->slots_smem = P.sc.slots_smem;
    a->bits_smem = P.sc.bits_smem;
}

/* ---- host side: kdloss_cuda_topk_distill_logits ------------------------------------------------ */

kdloss_status kdloss_cuda_topk_distill_logits_workspace_size(int64_t bt, int64_t v, int64_t k,
                                                            size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!bytes) return KDLOSS_ERR_NULL_POINTER;
    tk_plan P;
    kdloss_status s = tk_logits_plan(bt, v, k, NULL, &P);
    if (s == KDLOSS_OK) *bytes = P.total;
    return s;
}

/* The row kernel's arguments of a checked kdloss_cuda_topk_distill_logits call (the loss on
 * logits: soft part only, weight 1, the caller's grad_scale and temperature). */
static void tk_logits_row_args(tk_row_args *a, const kdloss_topk_distill_params *params,
                               kdloss_topk_teacher teacher, const kd_topk_geom &g,
                               const tk_check_args &c, const tk_plan &P,
                               kdloss_cmat student_logits, kdloss_mat grad, float *row_loss,
                               int64_t bt) {
    tk_row_common(a, teacher, g.ld_lp, c, P);
    a->w = params->row_weights;
    a->out_ent = params->row_entropy;
    const size_t es = kdloss_dtype_size(student_logits.dtype);
    a->z = student_logits.data;
    a->ldz = g.ld_s;
    a->g = grad.data;
    a->g_pitch = g.ld_g * (int64_t)es;
    a->rows = bt;
    a->inv_t = (float)(1.0 / params->temperature);
    a->inv_t64 = (double)(float)(1.0 / params->temperature); /* fp32-exact: topk_row.h */
    a->same_t = params->temperature == 1.0;
    a->coef = kd_div_coef_make(&params->div);
    a->tail = (int)params->tail;
    /* the entropy spans every column: renorm_both (which ignores R) forms R for it */
    a->need_r = params->tail != KDLOSS_TAIL_RENORM_BOTH || params->row_entropy != NULL;
    a->grad_soft = grad.data != NULL;
    a->w_soft = 1.0;
    a->grad_scale = params->grad_scale;
    a->temperature = params->temperature;
    a->soft_fac = 1.0;
    a->out_soft = row_loss;
}

/* Shapes: student_logits, grad (bt x v) with their own ld; teacher (bt rows of k); labels [bt]
 * optional; row_loss [bt]; loss [1]; all device pointers. Launches: the row checks, the row
 * kernel, the final reduction. */
kdloss_status kdloss_cuda_topk_distill_logits(
    kdloss_cuda_context *ctx, void *stream, const kdloss_topk_distill_params *params, int64_t bt,
    int64_t v, kdloss_cmat student_logits, kdloss_topk_teacher teacher, kdloss_labels labels,
    float *loss, float *row_loss, kdloss_mat grad, void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_topk_geom g;
    kd_spanset spans;
    int64_t n_valid; /* the labels are device memory: not read here */
    kdloss_status s = kd_check_topk_logits(&kd_cuda_rules, params, bt, v, student_logits, teacher,
                                           labels, loss, row_loss, grad, &g, &n_valid, &spans);
    if (s != KDLOSS_OK) return s;
    tk_plan P;
    if ((s = tk_logits_plan(bt, v, teacher.k, NULL, &P)) != KDLOSS_OK) return s;
    if ((s = kd_check_workspace(&kd_cuda_rules, workspace, workspace_bytes, P.total, &spans)) !=
        KDLOSS_OK)
        return s;
    tk_logits_plan(bt, v, teacher.k, workspace, &P);

    tk_check_args c = tk_check_of(teacher, g.ld_ids, labels, params->ignore_index, bt, v, P);
    c.w = params->row_weights;
    tk_row_args a;
    tk_logits_row_args(&a, params, teacher, g, c, P, student_logits, grad, row_loss, bt);
    const kdloss_dtype ds = student_logits.dtype;
    const size_t es = kdloss_dtype_size(ds);
    const bool vec = kd_aligned16(student_logits.data, g.ld_s, es) &&
                     kd_aligned16(grad.data, g.ld_g, es);

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    s = tk_check_launch(st, c);
    if (s == KDLOSS_OK) s = tk_zero_slices(P, st);
    if (s == KDLOSS_OK) {
        tk_row_launch_logits(ds, a, P.sc, vec, st);
        s = kd_launch_status();
    }
    if (s == KDLOSS_OK) {
        kdloss_fused_linear_distill_out o;
        memset(&o, 0, sizeof o);
        o.loss = loss;
        s = tk_final_launch(st, P.row_soft, NULL, bt, P.hdr, &o, 0.0, 1.0, 1.0, 0,
                            params->row_weights);
    }
    kd_dev_leave(&dg);
    return s;
}
