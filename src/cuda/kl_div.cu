/* KL divergence on the GPU: KLDivLoss semantics (kdloss.h, kdloss_kl_div), forward and backward
 * in one pass that reads input and target once and writes the gradient (and the elementwise loss
 * for reduction NONE) once. The gradient does not depend on the row sums, so nothing waits for a
 * reduction. Sums: fp32 over the 16 columns of a thread, then double in fixed-order trees; the
 * scalar loss is reduced on the device by rowsum.cu, no float atomics, no host synchronization. */
#include "div_math.h"
#include "ew_tile.cuh"

typedef struct kl_args {
    const void *in;  /* (bt x v, ld_in) student log-probs */
    int64_t ld_in;
    const void *t;   /* (bt x v, ld_t) target */
    int64_t ld_t;
    void *grad;      /* (bt x v, ld_g) in the input dtype, or NULL; may equal in (same ld) */
    int64_t ld_g;
    float *elem;     /* (bt x v, ld_el) fp32, or NULL */
    int64_t ld_el;
    double *part;    /* (bt x ntiles) block sums, or NULL when no loss is wanted */
    unsigned int *flags; /* [bt] the NaN policy's row flags, or NULL (gradient only: the input
                            is not read, kdloss.h) */
    int64_t bt, v, ntiles;
    float eps;
    float gscale;    /* reduction scale x grad_scale */
    int log_target;
} kl_args;

/* One block per (row, tile): grid-stride over bt * ntiles blocks (ew_tile.cuh). DI/DT:
 * input/target dtypes; VEC: 16-byte aligned rows (kd_ew_tile). */
template <int DI, int DT, bool VEC>
__global__ void __launch_bounds__(KD_EW_THREADS) kl_kernel(kl_args a) {
    __shared__ double red[32];
    kd_ew_for_tiles(a.bt, a.ntiles, [&](int64_t b, int64_t row, int64_t cbase) {
        const kd_ew_row r = {a.in,   row * a.ld_in, a.t,    row * a.ld_t,
                             a.grad, row * a.ld_g,  a.elem, row * a.ld_el};
        float ck = 0.0f;
        const float acc = kd_ew_tile<DI, DT, VEC>(
            r, cbase, a.v, a.gscale, &ck,
            [&](float y, float t, float *g) { return kd_kl_elem(a.log_target, a.eps, y, t, g); });
        kd_ew_tile_end(a.flags, row, ck, a.part, b, acc, red);
    });
}

/* kl_kernel for the dtypes and the alignment kd_launch_dtypes picks. */
struct kl_launcher {
    const kl_args &a;
    unsigned grid;
    cudaStream_t st;
    template <int DI, int DT, bool VEC>
    void launch() const {
        KD_LAUNCH(grid, KD_EW_THREADS, 0, st, kl_kernel<DI, DT, VEC>)(a);
    }
};

kdloss_status kdloss_cuda_kl_div_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    return kd_ew_workspace_size(bt, v, bytes);
}

/* The kernel's arguments of a checked call; scale: the reduction's (kd_kl_reduction_scale). */
static kl_args kl_args_of(const kdloss_kl_params *params, int64_t bt, int64_t v,
                          kdloss_cmat input, kdloss_cmat target, int want_loss,
                          kdloss_mat elem_loss, kdloss_mat grad, const kd_kl_geom &g,
                          const kd_ew_plan &plan, double scale) {
    kl_args a;
    a.in = input.data;
    a.ld_in = g.ld_in;
    a.t = target.data;
    a.ld_t = g.ld_t;
    a.grad = grad.data;
    a.ld_g = g.ld_g;
    a.elem = (float *)elem_loss.data;
    a.ld_el = g.ld_el;
    a.part = want_loss ? plan.part : NULL;
    a.flags = (want_loss || elem_loss.data) ? plan.flags : NULL;
    a.bt = bt;
    a.v = v;
    a.ntiles = plan.ntiles;
    a.eps = (float)params->eps;
    a.gscale = (float)(scale * params->grad_scale);
    a.log_target = params->log_target != 0;
    return a;
}

/* Shapes: input, target, grad, elem_loss (bt x v) with their own ld; row_loss [bt]; loss [1];
 * all device pointers. Work on `stream`: label-free, so 1 main launch + 2 tiny reduction launches
 * (rows, final); nothing when only the gradient is wanted beyond the main launch and the
 * status-word write. With a loss or elem_loss wanted, the NaN policy's flags are cleared before
 * the main launch and the flagged rows rewritten after it (kd_cuda_poison_rows: one flag read
 * a row). */
kdloss_status kdloss_cuda_kl_div(kdloss_cuda_context *ctx, void *stream,
                                 const kdloss_kl_params *params, int64_t bt, int64_t v,
                                 kdloss_cmat input, kdloss_cmat target, float *loss,
                                 float *row_loss, kdloss_mat elem_loss, kdloss_mat grad,
                                 void *workspace, size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_kl_geom g;
    kd_spanset spans;
    kdloss_status s = kd_check_kl(&kd_cuda_rules, params, bt, v, input, target, loss, row_loss,
                                  elem_loss, grad, &g, &spans);
    if (s != KDLOSS_OK) return s;
    kd_ew_plan plan;
    if ((s = kd_ew_plan_place(bt, v, workspace, workspace_bytes, &spans, &plan)) != KDLOSS_OK)
        return s;
    /* the CPU's arithmetic: the same reduction scale, multiplied */
    const double scale = kd_kl_reduction_scale(params->reduction, bt, v);
    const kl_args a = kl_args_of(params, bt, v, input, target, loss || row_loss, elem_loss, grad,
                                 g, plan, scale);
    size_t ei = kdloss_dtype_size(input.dtype), et = kdloss_dtype_size(target.dtype);
    bool vec = kd_aligned16(input.data, g.ld_in, ei) && kd_aligned16(target.data, g.ld_t, et) &&
               kd_aligned16(grad.data, g.ld_g, ei) && kd_aligned16(elem_loss.data, g.ld_el, 4);

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    if (a.flags) s = kd_cuda_clear_flags(st, a.flags, bt);
    if (s == KDLOSS_OK) {
        kd_launch_dtypes(input.dtype, target.dtype, vec,
                         kl_launcher{a, kd_grid(bt * plan.ntiles), st});
        s = kd_launch_status();
    }
    if (s == KDLOSS_OK && a.flags) /* the NaN policy: rows that read a NaN or +inf */
        s = kd_cuda_poison_rows(st, a.flags, bt, v, grad.data, input.dtype, g.ld_g, a.gscale, 0.0,
                                NULL, a.elem, g.ld_el, a.part, plan.ntiles);
    if (s == KDLOSS_OK)
        s = kd_cuda_finish_rows(st, plan.part, bt, plan.ntiles, row_loss, loss, plan.blk, scale, 0,
                                0, plan.hdr);
    kd_dev_leave(&dg);
    return s;
}
