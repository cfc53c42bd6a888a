/* Generalized JSD(beta) on the GPU (kdloss.h, kdloss_jsd): one pass that reads student and
 * teacher log-probs once and writes the gradient once, with the per-element math of div_math.h
 * (the same code the CPU scalar path runs). With labels, the number of valid rows is counted on
 * the device first (rowsum.cu) and the gradient scale grad_scale / max(1, n_valid) is read from
 * device memory, so the host never waits. Out-of-range labels cannot be rejected before writing
 * (that needs the values on the host): they are reported in the workspace status word, with
 * NaN losses, as kdloss.h documents. */
#include "div_math.h"
#include "ew_tile.cuh"

typedef struct distill_args {
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
} distill_args;

/* The gradient's factor: grad_scale / bt, or with labels grad_scale / max(1, n_valid), n_valid
 * counted by the previous kernel in the stream (the host never waits for it). */
__device__ __forceinline__ float distill_gscale(const distill_args &a) {
    if (!a.labels) return a.gscale;
    const unsigned long long nv = a.hdr->n_valid;
    return (float)(a.grad_scale / (nv > 0 ? (double)nv : 1.0));
}

/* 0: a counted row, 1: ignored, 2: a label out of range. The same for the whole block. */
__device__ __forceinline__ int distill_row_kind(const distill_args &a, int64_t row) {
    if (!a.labels) return 0;
    const int64_t y = kd_label(a.labels, a.lab64, row);
    return y == a.ignore ? 1 : (y >= 0 && y < a.v) ? 0 : 2;
}

/* Block b's tile of a row that does not count: zero gradient; the tile adds 0 (ignored) or NaN
 * (a bad label: the loss must not look valid). */
template <int DS, bool VEC>
__device__ __forceinline__ void distill_skip_tile(const distill_args &a, int64_t b, int64_t row,
                                              int64_t cbase, int kind) {
    if (a.grad) {
        const float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int g = 0; g < KD_EW_GROUPS; g++) {
            const int64_t c0 = kd_ew_col(cbase, g);
            kd_st8n<DS, VEC>(a.grad, row * a.ld_g + c0, kd_ew_count(a.v, c0), z);
        }
    }
    if (a.part && threadIdx.x == 0)
        a.part[b] = kind == 1 ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
}

/* One block per (row, tile), grid-stride over bt * ntiles (ew_tile.cuh). DS/DT: student/teacher
 * dtypes; VEC: 16-byte aligned rows (kd_ew_tile). */
template <int DS, int DT, bool VEC>
__global__ void __launch_bounds__(KD_EW_THREADS) distill_kernel(distill_args a) {
    __shared__ double red[32];
    const float gscale = distill_gscale(a);
    kd_ew_for_tiles(a.bt, a.ntiles, [&](int64_t b, int64_t row, int64_t cbase) {
        const int kind = distill_row_kind(a, row);
        if (kind != 0) {
            distill_skip_tile<DS, VEC>(a, b, row, cbase, kind);
            return;
        }
        const kd_ew_row r = {a.s, row * a.ld_s, a.t, row * a.ld_t, a.grad, row * a.ld_g, NULL, 0};
        float ck = 0.0f;
        const float acc = kd_ew_tile<DS, DT, VEC>(
            r, cbase, a.v, gscale, &ck,
            [&](float x, float y, float *g) { return kd_div_elem(&a.coef, x, y, g); });
        kd_ew_tile_end(a.flags, row, ck, a.part, b, acc, red);
    });
}

/* distill_kernel for the dtypes and the alignment kd_launch_dtypes picks. */
struct distill_launcher {
    const distill_args &a;
    unsigned grid;
    cudaStream_t st;
    template <int DS, int DT, bool VEC>
    void launch() const {
        KD_LAUNCH(grid, KD_EW_THREADS, 0, st, distill_kernel<DS, DT, VEC>)(a);
    }
};

kdloss_status kdloss_cuda_jsd_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return kd_ew_workspace_size(bt, v, bytes);
}

/* The kernel's arguments of a checked call. */
static distill_args distill_args_of(const kdloss_distill_params *params, int64_t bt, int64_t v,
                            kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                            const float *loss, const float *row_loss, kdloss_mat grad,
                            const kd_distill_geom &g, const kd_ew_plan &plan) {
    distill_args a;
    kd_pair_args_fill(&a, student, g.ld_s, teacher, g.ld_t, grad, g.ld_g, labels,
                      params->ignore_index, plan, bt, v);
    if (!loss && !row_loss) a.part = NULL; /* no partial sums to write */
    a.ntiles = plan.ntiles;
    a.flags = plan.flags;
    a.coef = kd_div_coef_make(&params->div);
    a.grad_scale = params->grad_scale;
    a.gscale = (float)(params->grad_scale / (double)bt);
    return a;
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
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_distill_geom g;
    kd_spanset spans;
    int64_t n_valid; /* the labels are device memory: not read here */
    kdloss_status s = kd_check_distill(&kd_cuda_rules, params, bt, v, student, teacher, labels,
                                       loss, row_loss, grad, &g, &n_valid, &spans);
    if (s != KDLOSS_OK) return s;
    kd_ew_plan plan;
    if ((s = kd_ew_plan_place(bt, v, workspace, workspace_bytes, &spans, &plan)) != KDLOSS_OK)
        return s;
    const distill_args a =
        distill_args_of(params, bt, v, student, teacher, labels, loss, row_loss, grad, g, plan);
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
        kd_launch_dtypes(student.dtype, teacher.dtype, vec,
                         distill_launcher{a, kd_grid(bt * plan.ntiles), st});
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
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return kd_ew_workspace_size(bt, v, bytes);
}

/* The JSD-only name: a wrapper (divergence JSD(beta)). */
kdloss_status kdloss_cuda_jsd(kdloss_cuda_context *ctx, void *stream,
                              const kdloss_jsd_params *params, int64_t bt, int64_t v,
                              kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                              float *loss, float *row_loss, kdloss_mat grad, void *workspace,
                              size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    if (!params) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_distill_params d = kd_distill_from_jsd(params);
    return kdloss_cuda_distill(ctx, stream, &d, bt, v, student, teacher, labels, loss, row_loss,
                               grad, workspace, workspace_bytes);
}
