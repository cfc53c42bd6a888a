/* The sparse top-k teacher on the GPU, the parts its drivers share: the loss on logits
 * (topk.cu, which also holds the kernels every call launches), the fused loss (fld_topk.cu) and
 * its vocabulary-parallel form (topk_vp.cu): the workspace header and row kinds, the row
 * scratch, the row kernel's arguments and its device functions (the gradient pass and the slots'
 * values, written once), and the host steps (plan, checks, launch arguments). */
#ifndef KDLOSS_TK_ROWS_CUH
#define KDLOSS_TK_ROWS_CUH

#include <string.h>

#include "logit_map.h"
#include "topk_row.h" /* before kd_cuda.cuh: div_elem.h's locals would shadow cuda_fp16.h's half */
#include "fld_rows.cuh"

/* ---- the workspace header and the row kinds ------------------------------------------------ */

/* kd_ws_header's layout (status first, kdloss.h) with one more counter. */
typedef struct tk_header {
    int32_t status;
    uint32_t poisoned;              /* sparse path: a row with a gradient is NaN (tk_sparse_math) */
    unsigned long long n_valid;     /* rows with a kept label (or no labels) and valid ids */
    unsigned long long n_bad_label; /* label neither ignore_index nor in [0, V) (any ids) */
    unsigned long long n_bad_id;    /* an id neither -1 nor in [0, V), or repeated (any label) */
    unsigned long long n_bad_w;     /* a row weight not finite and >= 0 (any label, any ids) */
} tk_header;

/* A row of weight 0 is TK_ROW_IGNORED (docs/MATH.md section 12); a bad weight's row is
 * TK_ROW_BAD_WEIGHT unless its label or ids are bad too. */
enum { TK_ROW_OK = 0, TK_ROW_IGNORED = 1, TK_ROW_BAD_LABEL = 2, TK_ROW_BAD_ID = 3,
       TK_ROW_BAD_WEIGHT = 4 };

#define TK_ROW_THREADS 512
#define TK_TILE (TK_ROW_THREADS * 8)
#define TK_SP_THREADS 256
#define TK_CHECK_THREADS 256
#define TK_FINAL_THREADS 1024
#define TK_LT_WS_BYTES FLD_LT_WS_BYTES /* the fld_gemms steps (fld_rows.cuh) assume it */
#define TK_DEFAULT_BUDGET ((size_t)256 << 20)
/* Per-row scratch of a row block: the slots (column int64, logit, teacher log-prob, gradient:
 * 20 bytes each) and the bitmap of S (V bits). In dynamic shared memory when they fit, else in
 * TK_SLICES per-block slices of the workspace (the grid is then at most TK_SLICES blocks). */
#define TK_SLOT_BYTES 20
#define TK_SLOTS_SMEM_MAX ((size_t)16 << 10)
#define TK_SMEM_MAX ((size_t)44 << 10)
#define TK_SLICES 1024

typedef struct tk_scratch {
    int64_t words;      /* 32-bit words of a bitmap */
    size_t slot_stride; /* bytes of one block's slots, 16-byte multiple */
    int slots_smem, bits_smem;
    size_t smem;        /* dynamic shared memory per block */
} tk_scratch;

/* Where a row block keeps its slots and its bitmap, for these V and K (bits: 0 when no bitmap
 * is used: the sparse rows). */
static inline tk_scratch tk_scratch_plan(int64_t v, int64_t k, int bits) {
    tk_scratch s;
    s.words = bits ? (v + 31) / 32 : 0;
    s.slot_stride = kd_round_up((size_t)k * TK_SLOT_BYTES, 16);
    s.slots_smem = s.slot_stride <= TK_SLOTS_SMEM_MAX;
    const size_t sb = s.slots_smem ? s.slot_stride : 0;
    s.bits_smem = sb + (size_t)s.words * 4u <= TK_SMEM_MAX;
    s.smem = sb + (s.bits_smem ? (size_t)s.words * 4u : 0);
    return s;
}

/* Grid of a row kernel: one block per row, or TK_SLICES blocks looping over the rows when
 * global slices are in use. */
static inline unsigned tk_row_grid(int64_t rows, const tk_scratch &s) {
    const int global = !s.slots_smem || (s.words && !s.bits_smem);
    return kd_grid(global && rows > TK_SLICES ? TK_SLICES : rows);
}

/* ---- device helpers ------------------------------------------------------------------------ */

/* Element i of a float array whose dtype is known at run time only (the teacher's log-probs). */
__device__ __forceinline__ float tk_ld_any(const void *p, int dt, int64_t i) {
    if (dt == KDLOSS_F32) return kd_ld<KDLOSS_F32>(p, i);
    if (dt == KDLOSS_BF16) return kd_ld<KDLOSS_BF16>(p, i);
    return kd_ld<KDLOSS_F16>(p, i);
}

__device__ __forceinline__ double tk_qnan(void) { return __longlong_as_double(0x7ff8000000000000LL); }

/* A row block's slots: col[k] the id (-1 unused; compacted by tk_row_math; a vocabulary-parallel
 * rank's local column, -1 for the ids other ranks hold), z the student's logit there (bias
 * added), lp the teacher's log-prob, g kd_topk_row's gradient. */
typedef struct tk_slots {
    int64_t *col;
    float *z, *lp, *g;
} tk_slots;

__device__ __forceinline__ tk_slots tk_slots_at(char *base, int64_t k) {
    tk_slots s;
    s.col = (int64_t *)base;
    s.z = (float *)(s.col + k);
    s.lp = s.z + k;
    s.g = s.lp + k;
    return s;
}

/* Moves the used slots (col >= 0) of k to the front, in slot order; returns their count. */
__device__ __forceinline__ int64_t tk_compact(tk_slots s, int64_t k) {
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++)
        if (s.col[j] >= 0) {
            s.col[n] = s.col[j];
            s.z[n] = s.z[j];
            s.lp[n] = s.lp[j];
            n++;
        }
    return n;
}

/* ---- 1. row checks ------------------------------------------------------------------------- */

typedef struct tk_check_args {
    const void *labels; /* [bt] or NULL (every row kept) */
    int lab64;
    int64_t ignore;
    const void *ids;    /* (bt x k, ld_ids) I32 / I64 */
    int ids64;
    int64_t ld_ids, bt, v, k;
    const float *w;     /* [bt] row weights, or NULL */
    uint8_t *flags;     /* [bt] out: TK_ROW_* */
    tk_header *hdr;     /* counters, zeroed before in the same stream */
} tk_check_args;

kdloss_status tk_check_launch(cudaStream_t st, const tk_check_args &a);

/* The scalar losses in a fixed order and the status word (tk_final_kernel, topk.cu); row_hard
 * may be NULL; w [bt] the row weights (NULL: 1); ids_first: with several faults the ids' code
 * wins (the fused loss), else the labels', then the weights', then the ids' (the logits loss):
 * the orders of the CPU's checks. */
kdloss_status tk_final_launch(cudaStream_t st, const double *row_soft, const double *row_hard,
                              int64_t bt, tk_header *hdr, const kdloss_fused_linear_distill_out *out,
                              double w_hard, double w_soft, double soft_fac, int ids_first,
                              const float *w);

/* ---- the dense rows' arguments and device functions ------------------------------------------ */

typedef struct tk_row_args {
    const void *z;        /* logit rows of this launch: the student (dtype DZ), or the fused
                             chunk's fp32 logits */
    int64_t ldz;          /* in elements of DZ */
    void *g;              /* gradient rows (dtype DG) or NULL; fused: the same bytes as z */
    int64_t g_pitch;      /* bytes between gradient rows */
    const void *bias;     /* [v] in DG, or NULL (also under a student logit map: map_bias) */
    kd_logit_map map_s;   /* the fused student head's logit map (logit_map.h; the identity
                             otherwise): fld_map_rows applies it before the rows, its scale is
                             folded into ca, cb and its cap's factor into every dz */
    const void *map_bias; /* the bias fld_map_rows adds under a map, else NULL */
    const void *ids;      /* teacher, global rows of k slots */
    int ids64;
    int64_t ld_ids;
    const void *lp;
    int lpdt;
    int64_t ld_lp;
    const void *labels;   /* [bt] or NULL */
    int lab64;
    const uint8_t *flags; /* [bt] TK_ROW_* */
    int64_t row0;         /* global index of the launch's first row */
    int64_t rows, v, k;
    float inv_t;          /* 1 / T: the V-wide passes (u_j = z_j / T in fp32) */
    double inv_t64;       /* 1 / T rounded to fp32, as a double: kd_topk_row (topk_row.h) */
    int same_t;           /* T == 1: the untempered lse comes from R and the slots */
    kd_div_coef coef;
    int tail;
    int need_r;           /* the masked pass: R = lse(u_j, j not in S) */
    int do_hard;          /* the untempered lse (row_lse, CE) */
    int do_ce;            /* the label's cross-entropy (labels given) */
    int grad_soft, grad_hard; /* the gradient's two terms */
    double w_hard, w_soft, grad_scale, temperature, soft_fac;
    const tk_header *hdr;
    double *row_soft, *row_hard;          /* [bt] in the workspace; row_hard may be NULL */
    float *out_soft, *out_hard, *out_lse; /* the caller's [bt], or NULL */
    const float *w;       /* [bt] row weights (global rows), or NULL: 1 */
    float *out_ent;       /* [bt] the student's entropy (global rows), or NULL */
    char *gslot;          /* TK_SLICES slices of slot_stride bytes, when not in shared memory */
    size_t slot_stride;
    uint32_t *gbits;      /* TK_SLICES bitmaps of `words` words, when not in shared memory */
    int64_t words;
    int slots_smem, bits_smem;
} tk_row_args;

/* What thread 0 works out for a row, for the whole block. */
typedef struct tk_row_state {
    float R;      /* rest lse of u (-inf: no column outside S, or not needed) */
    float lh;     /* untempered lse over all v columns (do_hard) */
    float crest;  /* c_rest of kd_topk_row: dD/du_j = crest exp(u_j - R) outside S */
    float ca, cb; /* gradient factors of the CE and of the soft term (1/T folded into cb) */
    float zy;     /* the label's logit (do_ce) */
    float lt;     /* the tempered lse over all v columns (out_ent) */
    int64_t y;    /* the label (do_ce), else -1 */
    int64_t n;    /* used slots, compacted */
} tk_row_state;

/* zs at column c of local row r (bias added), as fp32: the value every pass sees. */
template <int DZ, int DG>
__device__ __forceinline__ float tk_z(const tk_row_args &a, int64_t r, int64_t c) {
    const float z = kd_ld<DZ>(a.z, r * a.ldz + c);
    return a.bias ? z + kd_ld<DG>(a.bias, c) : z;
}

/* Columns c0..c0+n-1 of local row r, as tk_z gives them (VEC: 16-byte aligned groups). */
template <int DZ, int DG, bool VEC>
__device__ __forceinline__ void tk_load8(const tk_row_args &a, int64_t r, int64_t c0, int n,
                                         float out[8]) {
    kd_ld8n<DZ, VEC>(a.z, r * a.ldz + c0, n, out);
    if (a.bias) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < n) out[j] += kd_ld<DG>(a.bias, c0 + j);
    }
}

/* The block's slots: in dynamic shared memory, or its slice of the workspace. */
__device__ __forceinline__ tk_slots tk_slots_of(const tk_row_args &a, char *smem) {
    return tk_slots_at(a.slots_smem ? smem : a.gslot + (size_t)blockIdx.x * a.slot_stride, a.k);
}

/* The block's bitmap of S: in dynamic shared memory after the slots, zeroed here (every thread
 * calls it), or its global slice, zeroed by tk_zero_slices and cleared by the kernels after each
 * row. */
__device__ __forceinline__ uint32_t *tk_bits_init(const tk_row_args &a, char *smem) {
    uint32_t *bits = a.bits_smem ? (uint32_t *)(smem + (a.slots_smem ? a.slot_stride : 0))
                                 : a.gbits + (size_t)blockIdx.x * (size_t)a.words;
    if (a.bits_smem) {
        for (int64_t w = threadIdx.x; w < a.words; w += blockDim.x) bits[w] = 0;
        __syncthreads();
    }
    return bits;
}

__device__ __forceinline__ void *tk_grow(const tk_row_args &a, int64_t r) {
    return (char *)a.g + r * a.g_pitch;
}

/* An ignored or bad row: zero gradient, row loss 0 (ignored) or NaN (bad label or id). */
template <int DG, bool VEC>
__device__ void tk_skip_row(const tk_row_args &a, int64_t r, int64_t gr, int kind) {
    if (a.g) {
        const float z8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        void *grow = tk_grow(a, r);
        for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += TK_TILE)
            kd_st8n<DG, VEC>(grow, c0, a.v - c0 >= 8 ? 8 : (int)(a.v - c0), z8);
    }
    if (threadIdx.x == 0) {
        const double x = kind == TK_ROW_IGNORED ? 0.0 : tk_qnan();
        a.row_soft[gr] = x;
        if (a.row_hard) a.row_hard[gr] = x;
        if (a.out_soft) a.out_soft[gr] = (float)x;
        if (a.out_hard) a.out_hard[gr] = (float)x;
        if (a.out_lse) a.out_lse[gr] = (float)x;
        if (a.out_ent) a.out_ent[gr] = (float)x;
    }
}


/* Thread 0, once kd_topk_row gave the row's loss d and c_rest: the row's outputs (hard its
 * cross-entropy, lh its untempered lse) and the state the gradient passes read. */
__device__ __forceinline__ void tk_row_finish(const tk_row_args &a, int64_t gr, double d,
                                              double hard, float R, float lh, double crest,
                                              int64_t n, tk_row_state *rs) {
    const unsigned long long nv = a.hdr->n_valid;
    const double nvd = nv > 0 ? (double)nv : 1.0;
    rs->R = R;
    rs->lh = lh;
    rs->crest = (float)crest;
    const double s = (double)a.map_s.scale; /* dz/du's constant factor (logit_map.h) */
    rs->ca = a.grad_hard ? (float)(s * a.w_hard * a.grad_scale / nvd) : 0.0f;
    rs->cb = a.grad_soft
                 ? (float)(s * a.w_soft * a.grad_scale * a.soft_fac / (nvd * a.temperature))
                 : 0.0f;
    if (a.w) { /* the row's whole gradient times its weight, once in fp32 (MATH.md 12) */
        rs->ca *= a.w[gr];
        rs->cb *= a.w[gr];
    }
    rs->n = n;
    a.row_soft[gr] = d;
    if (a.row_hard) a.row_hard[gr] = hard;
    if (a.out_soft) a.out_soft[gr] = (float)d;
    if (a.out_hard) a.out_hard[gr] = (float)hard;
    if (a.out_lse) a.out_lse[gr] = a.do_hard ? lh : 0.0f;
}

/* The gradient of every column as if it were outside S (the slots are rewritten after):
 *   dz_j = ca (exp(z_j - lh) - [j = y]) + cb crest exp(u_j - R)
 * Tile by tile with a barrier between a tile's loads and its stores: in the fused loss a bf16
 * dz row narrows in place over the fp32 logits (fld.cu's argument). */
template <int DZ, int DG, bool VEC>
__device__ void tk_pass_grad(const tk_row_args &a, int64_t r, const tk_row_state &st) {
    void *grow = tk_grow(a, r);
    const int soft = a.grad_soft && st.crest != 0.0f;
    for (int64_t tile0 = 0; tile0 < a.v; tile0 += TK_TILE) { /* same trip count everywhere */
        const int64_t c0 = tile0 + (int64_t)threadIdx.x * 8;
        const int n = c0 >= a.v ? 0 : a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float zz[8], d[8];
        if (n > 0) tk_load8<DZ, DG, VEC>(a, r, c0, n, zz);
        __syncthreads();
        if (n == 0) continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float dj = 0.0f;
            if (a.grad_hard) dj = st.ca * (expf(zz[j] - st.lh) - (c0 + j == st.y ? 1.0f : 0.0f));
            if (soft) dj += st.cb * (st.crest * expf(zz[j] * a.inv_t - st.R));
            d[j] = a.map_s.cap > 0.0f ? dj * kd_map_dcap(&a.map_s, zz[j]) : dj;
        }
        kd_st8n<DG, VEC>(grow, c0, n, d);
    }
}

/* The student's entropy of local row r over all v columns (docs/MATH.md section 12):
 * H = -sum Q_j log Q_j, log Q_j = u_j - lt, u_j = z_j / T as the other V-wide passes form it,
 * lt the row's tempered lse (tk_row_math); div_elem.h's element (0 where Q = 0). Summed as the
 * passes' sums (fp32 groups of 8, double across them, a fixed block order); NaN when lt is not
 * finite (a NaN or +inf logit: the NaN policy). Thread 0 writes it. red: 32 shared doubles. */
template <int DZ, int DG, bool VEC>
__device__ void tk_pass_ent(const tk_row_args &a, int64_t r, int64_t gr, float lt, double *red) {
    double acc = 0.0;
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += TK_TILE) {
        const int n = a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
        float zz[8], h8 = 0.0f;
        tk_load8<DZ, DG, VEC>(a, r, c0, n, zz);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float x = zz[j] * a.inv_t - lt;
            if (j < n) h8 += kd_s_entropy(x, expf(x));
        }
        acc += (double)h8;
    }
    const double h = kd_block_sum(acc, red);
    if (threadIdx.x == 0) a.out_ent[gr] = isfinite(lt) ? (float)h : __int_as_float(0x7fc00000);
}

/* After the pass (and a barrier): the slots' own values, from the gathered logits. */
template <int DG>
__device__ void tk_fixup(const tk_row_args &a, int64_t r, tk_slots s, const tk_row_state &st) {
    void *grow = tk_grow(a, r);
    for (int64_t k = threadIdx.x; k < st.n; k += blockDim.x) {
        const int64_t c = s.col[k];
        if (c < 0) continue; /* a vocabulary-parallel slot another rank holds */
        float d = 0.0f;
        if (a.grad_hard) d = st.ca * (expf(s.z[k] - st.lh) - (c == st.y ? 1.0f : 0.0f));
        if (a.grad_soft) d += st.cb * s.g[k];
        if (a.map_s.cap > 0.0f) d *= kd_map_dcap(&a.map_s, s.z[k]); /* the softcap's factor */
        kd_st<DG>(grow, c, d);
    }
}

/* ---- host side --------------------------------------------------------------------------------- */

/* The workspace of every top-k call (topk.cu and fld_topk.cu have the layouts). */
typedef struct tk_plan {
    tk_scratch sc;
    tk_header *hdr;
    uint8_t *flags;
    double *row_soft, *row_hard;
    char *gslot;
    uint32_t *gbits;
    int64_t chunk, ldz;   /* dense fused */
    void *lt_ws;
    float *zs, *dw_acc, *db_acc;
    void *xm;             /* (chunk x hs) student dtype, with gradients: fld_mask_rows */
    float *dz;            /* sparse fused */
    int32_t *pcol;
    uint32_t *count, *offs, *rank0, *e0, *e1;
    size_t total;
} tk_plan;

/* The parts every call has: flags, per-row losses, the scratch slices. */
static inline void tk_carve_common(kd_carver *c, int64_t bt, int hard_rows, tk_plan *P) {
    P->flags = (uint8_t *)kd_carve(c, (size_t)bt);
    P->row_soft = (double *)kd_carve(c, (size_t)bt * sizeof(double));
    P->row_hard = hard_rows ? (double *)kd_carve(c, (size_t)bt * sizeof(double)) : NULL;
    P->gslot = P->sc.slots_smem ? NULL : (char *)kd_carve(c, (size_t)TK_SLICES * P->sc.slot_stride);
    P->gbits = P->sc.words && !P->sc.bits_smem
                   ? (uint32_t *)kd_carve(c, (size_t)TK_SLICES * (size_t)P->sc.words * 4u)
                   : NULL;
}

/* Bounds that keep every byte count below 2^62. */
static inline int tk_sizes_ok(int64_t bt, int64_t v, int64_t k, int64_t hs) {
    const int64_t m = (int64_t)1 << 40;
    return bt <= m && v <= m && k <= m && hs <= m && (uint64_t)bt * (uint64_t)k <= ((uint64_t)1 << 56);
}

/* The dense fused loss's plan (fld_topk.cu; a chunk of rows, fp32 logits; as fld.cu's): carves
 * its regions from c after the header; the caller sets hdr and total, so more can follow. */
kdloss_status tk_dense_carve(const kdloss_fused_linear_topk_distill_params *p, int64_t bt,
                             int64_t hs, int64_t v, int64_t k, kdloss_dtype sdt, int want_grad,
                             kd_carver *c, tk_plan *P);

/* The dense row kernel over a fused chunk's rows a.row0 + [0, a.rows) (topk.cu's tk_row_kernel:
 * fp32 chunk logits, bias and dz in the student's dtype ds). */
kdloss_status tk_row_launch_fused(kdloss_dtype ds, const tk_row_args &a, const tk_scratch &sc,
                                  cudaStream_t st);

/* Global bitmap slices start zeroed; the row kernel clears what it sets. */
kdloss_status tk_zero_slices(const tk_plan &P, cudaStream_t st);

/* The teacher's and the labels' fields of the check kernel (v: the range of labels and ids;
 * ld_ids: the ids' effective ld, as the argument checks resolved it). */
tk_check_args tk_check_of(const kdloss_topk_teacher &t, int64_t ld_ids, kdloss_labels labels,
                          int64_t ignore, int64_t bt, int64_t v, const tk_plan &P);

/* The row kernel's teacher, label and workspace fields (the ids' ld and v from c: set v for a
 * block; ld_lp: the log-probs' effective ld). */
void tk_row_common(tk_row_args *a, const kdloss_topk_teacher &t, int64_t ld_lp,
                   const tk_check_args &c, const tk_plan &P);

/* dx rows [0, rows) of a chunk (fld_topk.cu; ld_dx, fp32 or bf16: dx_bf) = the sum over each
 * row's used slots, in slot order, of dz[c] ws[c] for the ids this rank holds (c = id - v_lo in
 * [0, v)); zeros on rows that do not count. renorm_both without the cross-entropy's gradient, where dz is 0
 * outside S: the CPU's topk_dx (src/cpu/fld.c), K axpys a row instead of the V-wide GEMM, and a
 * weight row outside S, which the loss never reads, is not read here either. dz: the chunk's
 * (in place over its logits, pitch zs_pitch in elements of the student's dtype sdt); ws (v x hs,
 * ld_ws) in sdt; flags, ids and labels global, rows from row0. */
kdloss_status tk_dx_s_launch(cudaStream_t st, const tk_row_args &a, kdloss_dtype sdt,
                             const void *dz, int64_t dz_pitch, const void *ws, int64_t ld_ws,
                             int64_t v_lo, int64_t hs, void *dx, int64_t ld_dx, int dx_bf);

/* Whether the cross-entropy's gradient factor is 0 (the CPU's gh = 0): weight_hard_loss 0 (so
 * also every call without labels) or grad_scale 0. */
static inline int tk_gh_zero(const kdloss_fused_linear_topk_distill_params *p) {
    return !(p->weight_hard_loss > 0.0) || p->grad_scale == 0.0;
}

/* The zero-gradient rows of a chunk for fld_mask_rows (fld_topk.cu): rows that do not count,
 * and with gh0 (tk_gh_zero) rows without a used slot. */
fld_mask tk_mask_of(const tk_row_args &a, int gh0);

/* The row-kernel fields of the dense fused loss (fld_topk.cu; dz in place over the chunk's
 * logits). */
void tk_row_fused(tk_row_args *a, const kdloss_fused_linear_topk_distill_params *p,
                  const kdloss_fused_linear_distill_out *out, int has_labels, const void *bs,
                  const tk_plan &P, int want_grad);

#endif /* KDLOSS_TK_ROWS_CUH */
