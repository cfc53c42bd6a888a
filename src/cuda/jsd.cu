/* Generalized JSD(beta) on the GPU (kdloss.h, kdloss_jsd): one pass that reads student and
 * teacher log-probs once and writes the gradient once, with the per-element math of div_math.h
 * (the same code the CPU scalar path runs). With labels, the number of valid rows is counted on
 * the device first (rowsum.cu) and the gradient scale grad_scale / max(1, n_valid) is read from
 * device memory, so the host never waits. Out-of-range labels cannot be rejected before writing
 * (that needs the values on the host): they are reported in the workspace status word, with
 * NaN losses, as kdloss.h documents. */
#include "args.h"
#include "div_math.h"
#include "kd_cuda.cuh"

typedef struct jsd_args {
    const void *s;        /* (bt x v, ld_s) student log-probs X */
    int64_t ld_s;
    const void *t;        /* (bt x v, ld_t) teacher log-probs Y */
    int64_t ld_t;
    void *grad;           /* (bt x v, ld_g) student dtype, or NULL; may equal s (same ld) */
    int64_t ld_g;
    const void *labels;   /* [bt] or NULL */
    int lab64;
    int64_t ignore;
    const kd_ws_header *hdr; /* n_valid, when labels are given */
    double *part;         /* (bt x ntiles) block sums, or NULL */
    unsigned int *flags;  /* [bt] the NaN policy's row flags (kd_cuda_poison_rows) */
    int64_t bt, v, ntiles;
    kd_div_coef coef;     /* the divergence's element operation (div_coef.h) */
    float gscale;         /* grad_scale / bt, used without labels */
    double grad_scale;
} jsd_args;

/* One block per (row, tile), grid-stride over bt * ntiles. DS/DT: student/teacher dtypes. */
template <int DS, int DT, bool VEC>
__global__ void __launch_bounds__(KD_EW_THREADS) jsd_kernel(jsd_args a) {
    __shared__ double red[32];
    /* With labels the scale depends on n_valid, counted by the previous kernel in the stream. */
    float gscale = a.gscale;
    if (a.labels) {
        unsigned long long nv = a.hdr->n_valid;
        gscale = (float)(a.grad_scale / (nv > 0 ? (double)nv : 1.0));
    }
    const int64_t nblk = a.bt * a.ntiles;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const int64_t row = b / a.ntiles;
        const int64_t cbase = (b - row * a.ntiles) * KD_EW_TILE + (int64_t)threadIdx.x * 8;

        /* 0: counted row, 1: ignored, 2: label out of range. Same for the whole block. */
        int kind = 0;
        if (a.labels) {
            int64_t y = kd_label(a.labels, a.lab64, row);
            kind = y == a.ignore ? 1 : (y >= 0 && y < a.v) ? 0 : 2;
        }
        if (kind != 0) {
            /* zero gradient; the row adds 0 (ignored) or NaN (bad label: the loss must not look
             * valid) */
            if (a.grad) {
                float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
                for (int g = 0; g < KD_EW_GROUPS; g++) {
                    const int64_t c0 = cbase + (int64_t)g * KD_EW_THREADS * 8;
                    const int64_t o = row * a.ld_g + c0;
                    if (VEC && c0 + 8 <= a.v) {
                        kd_st8<DS>(a.grad, o, z);
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            if (c0 + j < a.v) kd_st<DS>(a.grad, o + j, 0.0f);
                    }
                }
            }
            if (a.part && threadIdx.x == 0) a.part[b] = kind == 1 ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
            continue;
        }

        const int64_t os = row * a.ld_s, ot = row * a.ld_t;
        float x[KD_EW_GROUPS][8], y[KD_EW_GROUPS][8];
        int n[KD_EW_GROUPS];
#pragma unroll
        for (int g = 0; g < KD_EW_GROUPS; g++) {
            const int64_t c0 = cbase + (int64_t)g * KD_EW_THREADS * 8;
            const int64_t rem = a.v - c0;
            n[g] = rem <= 0 ? 0 : rem >= 8 ? 8 : (int)rem;
            if (VEC && n[g] == 8) {
                kd_ld8<DS>(a.s, os + c0, x[g]);
                kd_ld8<DT>(a.t, ot + c0, y[g]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    x[g][j] = j < n[g] ? kd_ld<DS>(a.s, os + c0 + j) : 0.0f;
                    y[g][j] = j < n[g] ? kd_ld<DT>(a.t, ot + c0 + j) : 0.0f;
                }
            }
        }

        float acc = 0.0f, ck = 0.0f; /* ck: the NaN policy's sum of (x + y) 2^-100 */
#pragma unroll
        for (int g = 0; g < KD_EW_GROUPS; g++) {
            if (n[g] == 0) continue;
            const int64_t c0 = cbase + (int64_t)g * KD_EW_THREADS * 8;
            float gr[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float gj;
                ck = fmaf(y[g][j], KD_CK_SCALE, fmaf(x[g][j], KD_CK_SCALE, ck)); /* tail: 0s */
                float l = kd_div_elem(&a.coef, x[g][j], y[g][j], &gj);
                /* a factor of 0 writes zeros (kdloss.h), also where gj is infinite (reverse KL at
                 * a -inf teacher log-prob: inf x 0 would be NaN on a row nothing flags) */
                gr[j] = gscale == 0.0f ? 0.0f : gj * gscale;
                if (j < n[g]) acc += l;
            }
            if (a.grad) {
                const int64_t o = row * a.ld_g + c0;
                if (VEC && n[g] == 8) {
                    kd_st8<DS>(a.grad, o, gr);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (j < n[g]) kd_st<DS>(a.grad, o + j, gr[j]);
                }
            }
        }
        /* a NaN or +inf read: the row is rewritten after this kernel (kd_cuda_poison_rows) */
        if (!(ck < INFINITY)) atomicOr(&a.flags[row], 1u);
        if (a.part) { /* uniform across the block */
            double s = kd_block_sum((double)acc, red);
            if (threadIdx.x == 0) a.part[b] = s;
        }
    }
}

template <int DS, int DT>
static void jsd_launch2(const jsd_args &a, bool vec, unsigned grid, cudaStream_t st) {
    if (vec) KD_LAUNCH(grid, KD_EW_THREADS, 0, st, jsd_kernel<DS, DT, true>)(a);
    else KD_LAUNCH(grid, KD_EW_THREADS, 0, st, jsd_kernel<DS, DT, false>)(a);
}

template <int DS>
static void jsd_launch1(int dt, const jsd_args &a, bool vec, unsigned grid, cudaStream_t st) {
    switch (dt) {
    case KDLOSS_F32: jsd_launch2<DS, KDLOSS_F32>(a, vec, grid, st); break;
    case KDLOSS_BF16: jsd_launch2<DS, KDLOSS_BF16>(a, vec, grid, st); break;
    default: jsd_launch2<DS, KDLOSS_F16>(a, vec, grid, st); break;
    }
}

kdloss_status kdloss_cuda_jsd_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    if (!bytes) return KDLOSS_ERR_NULL_POINTER;
    kd_ew_plan p;
    kdloss_status s = kd_ew_plan_make(bt, v, NULL, &p);
    if (s != KDLOSS_OK) return s;
    *bytes = p.total;
    return KDLOSS_OK;
}

/* Shapes: student, teacher, grad (bt x v) with their own ld; labels [bt] optional; row_loss [bt];
 * loss [1]; all device pointers. Launches on `stream`: with labels, a memset and a counting
 * kernel; the NaN policy's flags cleared; the main kernel; the flagged rows rewritten
 * (kd_cuda_poison_rows); then the two small reduction kernels. */
kdloss_status kdloss_cuda_distill(kdloss_cuda_context *ctx, void *stream,
                                  const kdloss_distill_params *params, int64_t bt, int64_t v,
                                  kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                                  float *loss, float *row_loss, kdloss_mat grad, void *workspace,
                                  size_t workspace_bytes) {
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_jsd_geom g;
    kd_spanset spans;
    kdloss_status s =
        kd_args_distill(params, bt, v, student, teacher, labels, loss, row_loss, grad, &g, &spans);
    if (s != KDLOSS_OK) return s;
    kd_ew_plan plan;
    if ((s = kd_ew_plan_make(bt, v, NULL, &plan)) != KDLOSS_OK) return s;
    if ((s = kd_args_workspace(workspace, workspace_bytes, plan.total, &spans)) != KDLOSS_OK)
        return s;
    kd_ew_plan_make(bt, v, workspace, &plan);

    jsd_args a;
    kd_pair_args_fill(&a, student, g.ld_s, teacher, g.ld_t, grad, g.ld_g, labels,
                      params->ignore_index, plan, bt, v);
    if (!loss && !row_loss) a.part = NULL; /* no partial sums to write */
    a.ntiles = plan.ntiles;
    a.flags = plan.flags;
    a.coef = kd_div_coef_make(&params->div);
    a.grad_scale = params->grad_scale;
    a.gscale = (float)(params->grad_scale / (double)bt);
    size_t es = kdloss_dtype_size(student.dtype), et = kdloss_dtype_size(teacher.dtype);
    bool vec = kd_aligned16(student.data, g.ld_s, es) && kd_aligned16(teacher.data, g.ld_t, et) &&
               kd_aligned16(grad.data, g.ld_g, es);

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    if (labels.data)
        s = kd_cuda_count_labels(st, labels.data, a.lab64, bt, v, params->ignore_index, plan.hdr);
    if (s == KDLOSS_OK) s = kd_cuda_clear_flags(st, plan.flags, bt);
    if (s == KDLOSS_OK) {
        unsigned grid = kd_grid(bt * plan.ntiles);
        switch (student.dtype) {
        case KDLOSS_F32: jsd_launch1<KDLOSS_F32>(teacher.dtype, a, vec, grid, st); break;
        case KDLOSS_BF16: jsd_launch1<KDLOSS_BF16>(teacher.dtype, a, vec, grid, st); break;
        default: jsd_launch1<KDLOSS_F16>(teacher.dtype, a, vec, grid, st); break;
        }
        s = kd_launch_status();
    }
    if (s == KDLOSS_OK) /* the NaN policy: rows that read a NaN or +inf */
        s = kd_cuda_poison_rows(st, plan.flags, bt, v, grad.data, student.dtype, g.ld_g, a.gscale,
                                a.grad_scale, labels.data ? plan.hdr : NULL, NULL, 0, a.part,
                                plan.ntiles);
    if (s == KDLOSS_OK)
        s = kd_cuda_finish_rows(st, plan.part, bt, plan.ntiles, row_loss, loss, plan.blk,
                                (double)bt, 1, labels.data != NULL, plan.hdr);
    kd_dev_leave(&dg);
    return s;
}

kdloss_status kdloss_cuda_distill_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    return kdloss_cuda_jsd_workspace_size(bt, v, bytes);
}

/* The JSD-only name: a wrapper (divergence JSD(beta)). */
kdloss_status kdloss_cuda_jsd(kdloss_cuda_context *ctx, void *stream,
                              const kdloss_jsd_params *params, int64_t bt, int64_t v,
                              kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                              float *loss, float *row_loss, kdloss_mat grad, void *workspace,
                              size_t workspace_bytes) {
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    if (!params) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_distill_params d = kd_distill_from_jsd(params);
    return kdloss_cuda_distill(ctx, stream, &d, bt, v, student, teacher, labels, loss, row_loss,
                               grad, workspace, workspace_bytes);
}
