/* The divergence family on LOGITS on the GPU (kdloss.h, kdloss_cuda_distill_logits): the CPU's
 * kdloss_distill_logits (docs/MATH.md 7.4), one block per row. */
#include "div_math.h"
#include "kd_cuda.cuh"
#include "row_special.cuh"

/* One block per row (grid-stride over the rows), three passes over the row, each reading the
 * logits from global memory (a row of V = 256k fp32 is 1 MB, so the second and third reads mostly
 * hit L2); a row whose maximum is >= 2^102 or whose
 * normalizer is NaN (a NaN or +inf logit: the NaN policy) leaves after pass 1 for the careful
 * form (dl_special_row, docs/MATH.md 10):
 *   1. online max / sum-exp of zs and zt at T: m_s, ls_s = log sum exp((zs - m_s) / T), m_t,
 *      ls_t (the CPU's form: the max subtracted before the 1/T, so rows far from 0 keep their
 *      precision)
 *   2. x = (zs - m_s) / T - ls_s, y = (zt - m_t) / T - ls_t and the divergence's element
 *      function (kd_div_elem, div_math.h: div_elem.h's formulas, the code every CUDA kernel and
 *      the CPU scalar path run): the row loss and S = sum of g = dD/dx
 *   3. dz = gs w (g - exp(x) S), gs = grad_scale / (T max(1, n_valid)), w the row's weight (1
 *      without row_weights; the product rounded once in fp32, docs/MATH.md section 12), in the
 *      student's dtype
 * With row_entropy, pass 2 also sums the student's entropy elements -Q x (div_elem.h's
 * KDE(entropy) at Q = exp(x): docs/MATH.md section 12's first form, from the log-probs pass 2
 * already forms), as the loss is summed. A row of weight 0 is an ignored row; a weight that is
 * not finite and >= 0 makes its row a bad one (as a bad label: NaN row loss and entropy, zero
 * gradient) and the status word KDLOSS_ERR_INVALID_PARAM (a bad label's code wins: the CPU
 * checks the labels first).
 * Launches, on the caller's stream: with labels or weights kd_cuda_count_rows (n_valid, n_bad,
 * n_bad_w; the row kernel reads n_valid for gs, so the host never waits); the row kernel;
 * kd_cuda_finish_rows_w (row_loss, loss = sum of w times the row losses / max(1, n_valid) in a
 * fixed order, the status word). No float atomics: every sum has a fixed order, so results are
 * bitwise reproducible.
 * Workspace: the elementwise losses' plan with one partial sum per row (a single tile). */

#define DL_THREADS 512
#define DL_TILE (DL_THREADS * 8)

typedef struct dl_args {
    const void *s;           /* (bt x v, ld_s) student logits, dtype DS */
    int64_t ld_s;
    const void *t;           /* (bt x v, ld_t) teacher logits, dtype DT */
    int64_t ld_t;
    void *grad;              /* (bt x v, ld_g) dtype DS, or NULL; may equal s (same ld) */
    int64_t ld_g;
    const void *labels;      /* [bt] or NULL (every row counted) */
    int lab64;
    int64_t ignore;
    const float *w;          /* [bt] row weights, or NULL: every row weighs 1 */
    float *ent;              /* [bt] out: the student's entropy, or NULL */
    const kd_ws_header *hdr; /* n_valid, counted by the launch before when labels or w given */
    double *part;            /* [bt] row losses (0 ignored, NaN label out of range) */
    int64_t bt, v;
    float inv_t;             /* 1 / T rounded to fp32, as the CPU scales the logits */
    kd_div_coef coef;        /* the divergence's element operation (div_coef.h) */
    double grad_scale, temperature;
} dl_args;

/* The gradient factor grad_scale / (T max(1, n_valid)), rounded once, as the CPU's. */
__device__ __forceinline__ float dl_grad_scale(const dl_args &a) {
    const double n = a.labels || a.w ? (double)a.hdr->n_valid : (double)a.bt;
    return (float)(a.grad_scale / (a.temperature * (n > 0.0 ? n : 1.0)));
}

/* Row r: 0 counted, 1 ignored (label ignore_index or weight 0), 2 bad (label out of range, or a
 * weight not finite and >= 0). The same for the whole block. */
__device__ __forceinline__ int dl_row_kind(const dl_args &a, int64_t r) {
    const int wk = kd_weight_kind(a.w, r);
    if (!a.labels) return wk;
    const int64_t y = kd_label(a.labels, a.lab64, r);
    const int lk = y == a.ignore ? 1 : (y >= 0 && y < a.v) ? 0 : 2;
    return lk == 2 || wk == 2 ? 2 : lk | wk;
}

/* Columns in the group starting at c0 (0 past the row's end). */
__device__ __forceinline__ int dl_group(const dl_args &a, int64_t c0) {
    return c0 >= a.v ? 0 : a.v - c0 >= 8 ? 8 : (int)(a.v - c0);
}

/* An ignored row or one with a bad label: zero gradient; its partial is 0, or NaN so that the
 * loss cannot look valid (the status word says why). */
template <int DS, bool VEC>
__device__ void dl_skip_row(const dl_args &a, int64_t r, int kind) {
    if (a.grad) {
        const float z8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += DL_TILE)
            kd_st8n<DS, VEC>(a.grad, r * a.ld_g + c0, dl_group(a, c0), z8);
    }
    if (threadIdx.x == 0) {
        a.part[r] = kind == 1 ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
        if (a.ent) a.ent[r] = kind == 1 ? 0.0f : __int_as_float(0x7fc00000);
    }
}

/* A row's normalizer at temperature T: x = (z - m) / T - ls, m the row's largest logit. */
typedef struct dl_norm {
    float m, ls;
} dl_norm;

/* Pass 1: the normalizers of zs and zt over row r (online max / sum-exp of (z - m) / T, the
 * CPU's form); every thread gets both. */
template <int DS, int DT, bool VEC>
__device__ void dl_pass_lse(const dl_args &a, int64_t r, kd_lse *lred, dl_norm *ns,
                            dl_norm *nt) {
    kd_lse ss = {-INFINITY, 0.0f}, st = {-INFINITY, 0.0f};
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += DL_TILE) {
        const int n = dl_group(a, c0);
        float zs[8], zt[8];
        kd_ld8n<DS, VEC>(a.s, r * a.ld_s + c0, n, zs);
        kd_ld8n<DT, VEC>(a.t, r * a.ld_t + c0, n, zt);
        kd_lse_add8s(&ss, zs, n, a.inv_t);
        kd_lse_add8s(&st, zt, n, a.inv_t);
    }
    ss = kd_block_lse_state(ss, lred, a.inv_t);
    st = kd_block_lse_state(st, lred, a.inv_t);
    ns->m = ss.m;
    ns->ls = logf(ss.l);
    nt->m = st.m;
    nt->ls = logf(st.l);
}

/* x = (zs - ms) / T - lss and y = (zt - mt) / T - lst of the group at c0 of row r (n columns;
 * the rest are computed from zeros and must be masked by the caller). */
template <int DS, int DT, bool VEC>
__device__ __forceinline__ void dl_logprobs(const dl_args &a, int64_t r, int64_t c0, int n,
                                            dl_norm ns, dl_norm nt, float x[8], float y[8]) {
    kd_ld8n<DS, VEC>(a.s, r * a.ld_s + c0, n, x);
    kd_ld8n<DT, VEC>(a.t, r * a.ld_t + c0, n, y);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        x[j] = (x[j] - ns.m) * a.inv_t - ns.ls;
        y[j] = (y[j] - nt.m) * a.inv_t - nt.ls;
    }
}

/* Pass 2: the row's divergence and, with a.ent, its entropy (valid in thread 0), and S = sum of
 * g (every thread; only when a gradient is wanted). Groups of 8 are summed in fp32, the groups
 * in double. */
template <int DS, int DT, bool VEC>
__device__ void dl_pass_div(const dl_args &a, int64_t r, dl_norm ns, dl_norm nt, double *red,
                            double *loss, double *sum_g, double *ent) {
    double accl = 0.0, accg = 0.0, acch = 0.0;
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += DL_TILE) {
        const int n = dl_group(a, c0);
        float x[8], y[8], l8 = 0.0f, g8 = 0.0f, h8 = 0.0f;
        dl_logprobs<DS, DT, VEC>(a, r, c0, n, ns, nt, x, y);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float g;
            const float l = kd_div_elem(&a.coef, x[j], y[j], &g);
            if (j < n) {
                l8 += l;
                g8 += g;
            }
        }
        if (a.ent) /* the same for the whole block */
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < n) h8 += kd_s_entropy(x[j], expf(x[j]));
        accl += (double)l8;
        accg += (double)g8;
        acch += (double)h8;
    }
    *loss = kd_block_sum(accl, red);
    *sum_g = a.grad ? kd_block_sum_all(accg, red) : 0.0;
    *ent = a.ent ? kd_block_sum(acch, red) : 0.0;
}

/* Pass 3: dz = gs (g - exp(x) S) over row r. In place (grad == student, same ld) is safe: each
 * thread reads its own columns before it writes them, no other thread reads them in this pass,
 * and the barriers of pass 2's sums separate its reads from these writes. */
template <int DS, int DT, bool VEC>
__device__ void dl_pass_grad(const dl_args &a, int64_t r, dl_norm ns, dl_norm nt, float gs,
                             float S) {
    for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < a.v; c0 += DL_TILE) {
        const int n = dl_group(a, c0);
        float x[8], y[8], d[8];
        dl_logprobs<DS, DT, VEC>(a, r, c0, n, ns, nt, x, y);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float g;
            (void)kd_div_elem(&a.coef, x[j], y[j], &g);
            d[j] = gs * (g - expf(x[j]) * S);
        }
        kd_st8n<DS, VEC>(a.grad, r * a.ld_g + c0, n, d);
    }
}

/* A row the fast passes cannot serve, after its pass 1 (row_special.cuh): a maximum >= 2^102
 * (logits spanning more than FLT_MAX), or a NaN normalizer (a NaN or +inf logit: the NaN
 * policy). Its passes 2 and 3 in the careful form, the CPU's lr_special_row
 * (src/cpu/logits_rows_vec.c): normalizers, divergence and S = sum g in double-formed
 * log-probs, dz in double; the divergence and S NaN (so every dz NaN, 0 at gs = 0) when a
 * normalizer is NaN; the entropy (a.ent) over the same log-probs, NaN with the student's
 * normalizer (the CPU's lr_special_entropy). ms, mt: the row maxima of pass 1. In place is safe
 * as in pass 3: each thread reads and writes its own columns, after the barriers of the sums. */
template <int DS, int DT>
__device__ void dl_special_row(const dl_args &a, int64_t r, float ms_f, float mt_f, float gs,
                               double *red) {
    const double it = (double)a.inv_t, ms = (double)ms_f, mt = (double)mt_f;
    const int64_t os = r * a.ld_s, ot = r * a.ld_t;
    double es = 0.0, et = 0.0;
    kd_cu_each(a.v, [&](int64_t c) {
        es += exp(((double)kd_ld<DS>(a.s, os + c) - ms) * it);
        et += exp(((double)kd_ld<DT>(a.t, ot + c) - mt) * it);
    });
    const double lss = log(kd_block_sum_all(es, red));
    const double lst = log(kd_block_sum_all(et, red));
    double accl = 0.0, accg = 0.0, acch = 0.0;
    kd_cu_each(a.v, [&](int64_t c) {
        float g;
        const float x = kd_wide_lp(kd_ld<DS>(a.s, os + c), ms, it, lss);
        const float y = kd_wide_lp(kd_ld<DT>(a.t, ot + c), mt, it, lst);
        accl += (double)kd_div_elem(&a.coef, x, y, &g);
        accg += (double)g;
        if (a.ent) acch += (double)kd_s_entropy(x, expf(x));
    });
    double loss = kd_block_sum(accl, red);
    double S = a.grad ? kd_block_sum_all(accg, red) : 0.0;
    const double h = a.ent ? kd_block_sum(acch, red) : 0.0;
    if (isnan(lss) || isnan(lst)) loss = S = __longlong_as_double(0x7ff8000000000000LL);
    if (threadIdx.x == 0) {
        a.part[r] = loss;
        if (a.ent) a.ent[r] = isnan(lss) ? __int_as_float(0x7fc00000) : (float)h;
    }
    if (!a.grad) return;
    kd_cu_each(a.v, [&](int64_t c) {
        const float z = kd_ld<DS>(a.s, os + c);
        float g;
        (void)kd_div_elem(&a.coef, kd_wide_lp(z, ms, it, lss),
                          kd_wide_lp(kd_ld<DT>(a.t, ot + c), mt, it, lst), &g);
        kd_st<DS>(a.grad, r * a.ld_g + c, kd_wide_dz(z, g, ms, it, lss, S, gs, 0.0f, 0.0, false));
    });
}

/* One block per row, grid-stride over the rows. DS / DT: student / teacher dtypes; VEC: every
 * row of the student, the teacher and the gradient 16-byte aligned. */
template <int DS, int DT, bool VEC>
__global__ void __launch_bounds__(DL_THREADS) dl_row_kernel(dl_args a) {
    __shared__ double red[32];
    __shared__ kd_lse lred[32];
    const float gs0 = a.grad ? dl_grad_scale(a) : 0.0f;
    for (int64_t r = blockIdx.x; r < a.bt; r += gridDim.x) {
        const int kind = dl_row_kind(a, r);
        if (kind != 0) {
            dl_skip_row<DS, VEC>(a, r, kind);
            continue;
        }
        const float gs = a.w ? gs0 * a.w[r] : gs0; /* the row's whole gradient times its weight */
        dl_norm ns, nt;
        dl_pass_lse<DS, DT, VEC>(a, r, lred, &ns, &nt);
        /* one test a row (the same in every thread): the careful form's rows */
        if (kd_row_wide(ns.m) || kd_row_wide(nt.m) || isnan(ns.ls) || isnan(nt.ls)) {
            dl_special_row<DS, DT>(a, r, ns.m, nt.m, gs, red);
            continue;
        }
        double loss, S, h;
        dl_pass_div<DS, DT, VEC>(a, r, ns, nt, red, &loss, &S, &h);
        if (threadIdx.x == 0) {
            a.part[r] = loss;
            if (a.ent) a.ent[r] = (float)h;
        }
        if (a.grad) dl_pass_grad<DS, DT, VEC>(a, r, ns, nt, gs, (float)S);
    }
}

/* dl_row_kernel for the dtypes and the alignment kd_launch_dtypes picks. */
struct dl_launcher {
    const dl_args &a;
    unsigned grid;
    cudaStream_t st;
    template <int DS, int DT, bool VEC>
    void launch() const {
        KD_LAUNCH(grid, DL_THREADS, 0, st, dl_row_kernel<DS, DT, VEC>)(a);
    }
};

/* The workspace: header, one partial per row, kd_cuda_finish_rows's block sums (the elementwise
 * plan with a single tile per row). */
static kdloss_status dl_plan(int64_t bt, int64_t v, void *ws, kd_ew_plan *p) {
    if (bt <= 0 || v <= 0) return KDLOSS_ERR_INVALID_SIZE;
    return kd_ew_plan_make(bt, 1, ws, p);
}

kdloss_status kdloss_cuda_distill_logits_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!bytes) return KDLOSS_ERR_NULL_POINTER;
    kd_ew_plan p;
    kdloss_status s = dl_plan(bt, v, NULL, &p);
    if (s == KDLOSS_OK) *bytes = p.total;
    return s;
}

/* The kernel's arguments of a checked call. */
static dl_args dl_args_of(const kdloss_distill_logits_params *p, int64_t bt, int64_t v,
                          kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                          kdloss_mat grad, const kd_distill_geom &g, const kd_ew_plan &plan) {
    dl_args a;
    kd_pair_args_fill(&a, student, g.ld_s, teacher, g.ld_t, grad, g.ld_g, labels,
                      p->ignore_index, plan, bt, v);
    a.inv_t = (float)(1.0 / p->temperature);
    a.coef = kd_div_coef_make(&p->div);
    a.grad_scale = p->grad_scale;
    a.temperature = p->temperature;
    a.w = p->row_weights;
    a.ent = p->row_entropy;
    return a;
}

/* Shapes: student, teacher, grad (bt x v) with their own ld; labels [bt] optional; row_loss [bt];
 * loss [1]; all device pointers. */
kdloss_status kdloss_cuda_distill_logits(kdloss_cuda_context *ctx, void *stream,
                                         const kdloss_distill_logits_params *params, int64_t bt,
                                         int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                         kdloss_labels labels, float *loss, float *row_loss,
                                         kdloss_mat grad, void *workspace,
                                         size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_distill_geom g;
    kd_spanset spans;
    int64_t n_valid; /* the labels are device memory: not read here */
    kdloss_status s = kd_check_distill_logits(&kd_cuda_rules, params, bt, v, student, teacher,
                                              labels, loss, row_loss, grad, &g, &n_valid, &spans);
    if (s != KDLOSS_OK) return s;
    kd_ew_plan plan;
    if ((s = dl_plan(bt, v, NULL, &plan)) != KDLOSS_OK) return s;
    if ((s = kd_check_workspace(&kd_cuda_rules, workspace, workspace_bytes, plan.total,
                                &spans)) != KDLOSS_OK)
        return s;
    dl_plan(bt, v, workspace, &plan);

    const dl_args a = dl_args_of(params, bt, v, student, teacher, labels, grad, g, plan);
    const size_t es = kdloss_dtype_size(student.dtype), et = kdloss_dtype_size(teacher.dtype);
    const bool vec = kd_aligned16(student.data, g.ld_s, es) &&
                     kd_aligned16(teacher.data, g.ld_t, et) && kd_aligned16(grad.data, g.ld_g, es);

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    const int counted = labels.data || a.w; /* n_valid from the device */
    if (counted)
        s = kd_cuda_count_rows(st, labels.data, a.lab64, bt, v, params->ignore_index, a.w,
                               plan.hdr);
    if (s == KDLOSS_OK) {
        /* one block a row: the kernel loops over rows past the grid limit */
        kd_launch_dtypes(student.dtype, teacher.dtype, vec, dl_launcher{a, kd_grid(bt), st});
        s = kd_launch_status();
    }
    if (s == KDLOSS_OK)
        s = kd_cuda_finish_rows_w(st, plan.part, bt, 1, a.w, row_loss, loss, plan.blk,
                                  (double)bt, 1, counted, plan.hdr);
    kd_dev_leave(&dg);
    return s;
}
