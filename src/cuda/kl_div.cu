/* KL divergence on the GPU: KLDivLoss semantics (kdloss.h, kdloss_kl_div), forward and backward
 * in one pass that reads input and target once and writes the gradient (and the elementwise loss
 * for reduction NONE) once. The gradient does not depend on the row sums, so nothing waits for a
 * reduction. Sums: fp32 over the 16 columns of a thread, then double in fixed-order trees; the
 * scalar loss is reduced on the device by rowsum.cu, no float atomics, no host synchronization. */
#include "args.h"
#include "div_math.h"
#include "kd_cuda.cuh"

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

/* One block per (row, tile): grid-stride over bt * ntiles blocks. DI/DT: input/target dtypes.
 * VEC: every pointer and row pitch is 16-byte aligned, so full groups use vector accesses; the
 * values and the order of the sums are the same either way. */
template <int DI, int DT, bool VEC>
__global__ void __launch_bounds__(KD_EW_THREADS) kl_kernel(kl_args a) {
    __shared__ double red[32];
    const int64_t nblk = a.bt * a.ntiles;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const int64_t row = b / a.ntiles;
        const int64_t cbase = (b - row * a.ntiles) * KD_EW_TILE + (int64_t)threadIdx.x * 8;
        const int64_t oin = row * a.ld_in, ot = row * a.ld_t;

        /* all loads first: several independent 16-byte requests in flight per thread */
        float y[KD_EW_GROUPS][8], t[KD_EW_GROUPS][8];
        int n[KD_EW_GROUPS];
#pragma unroll
        for (int g = 0; g < KD_EW_GROUPS; g++) {
            const int64_t c0 = cbase + (int64_t)g * KD_EW_THREADS * 8;
            const int64_t rem = a.v - c0;
            n[g] = rem <= 0 ? 0 : rem >= 8 ? 8 : (int)rem;
            if (VEC && n[g] == 8) {
                kd_ld8<DI>(a.in, oin + c0, y[g]);
                kd_ld8<DT>(a.t, ot + c0, t[g]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    y[g][j] = j < n[g] ? kd_ld<DI>(a.in, oin + c0 + j) : 0.0f;
                    t[g][j] = j < n[g] ? kd_ld<DT>(a.t, ot + c0 + j) : 0.0f;
                }
            }
        }

        float acc = 0.0f, ck = 0.0f; /* ck: the NaN policy's sum of (y + t) 2^-100 */
#pragma unroll
        for (int g = 0; g < KD_EW_GROUPS; g++) {
            if (n[g] == 0) continue;
            const int64_t c0 = cbase + (int64_t)g * KD_EW_THREADS * 8;
            float gr[8], el[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float gj;
                ck = fmaf(t[g][j], KD_CK_SCALE, fmaf(y[g][j], KD_CK_SCALE, ck)); /* tail: 0s */
                el[j] = kd_kl_elem(a.log_target, a.eps, y[g][j], t[g][j], &gj);
                /* a factor of 0 writes zeros (kdloss.h), also where gj is infinite (a log target
                 * of 100: -e^100 x 0 would be NaN on a row nothing flags) */
                gr[j] = a.gscale == 0.0f ? 0.0f : gj * a.gscale;
                if (j < n[g]) acc += el[j];
            }
            if (a.grad) {
                const int64_t o = row * a.ld_g + c0;
                if (VEC && n[g] == 8) {
                    kd_st8<DI>(a.grad, o, gr);
                } else {
#pragma unroll /* constant indices keep gr in registers */
                    for (int j = 0; j < 8; j++)
                        if (j < n[g]) kd_st<DI>(a.grad, o + j, gr[j]);
                }
            }
            if (a.elem) {
                const int64_t o = row * a.ld_el + c0;
                if (VEC && n[g] == 8) {
                    kd_st8<KDLOSS_F32>(a.elem, o, el);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (j < n[g]) a.elem[o + j] = el[j];
                }
            }
        }
        /* a NaN or +inf read: the row is rewritten after this kernel (kd_cuda_poison_rows) */
        if (a.flags && !(ck < INFINITY)) atomicOr(&a.flags[row], 1u);
        if (a.part) { /* uniform across the block: the barrier inside is safe */
            double s = kd_block_sum((double)acc, red);
            if (threadIdx.x == 0) a.part[b] = s;
        }
    }
}

template <int DI, int DT>
static void kl_launch2(const kl_args &a, bool vec, unsigned grid, cudaStream_t st) {
    if (vec) KD_LAUNCH(grid, KD_EW_THREADS, 0, st, kl_kernel<DI, DT, true>)(a);
    else KD_LAUNCH(grid, KD_EW_THREADS, 0, st, kl_kernel<DI, DT, false>)(a);
}

template <int DI>
static void kl_launch1(int dt, const kl_args &a, bool vec, unsigned grid, cudaStream_t st) {
    switch (dt) {
    case KDLOSS_F32: kl_launch2<DI, KDLOSS_F32>(a, vec, grid, st); break;
    case KDLOSS_BF16: kl_launch2<DI, KDLOSS_BF16>(a, vec, grid, st); break;
    default: kl_launch2<DI, KDLOSS_F16>(a, vec, grid, st); break;
    }
}

kdloss_status kdloss_cuda_kl_div_workspace_size(int64_t bt, int64_t v, size_t *bytes) {
    if (!bytes) return KDLOSS_ERR_NULL_POINTER;
    kd_ew_plan p;
    kdloss_status s = kd_ew_plan_make(bt, v, NULL, &p);
    if (s != KDLOSS_OK) return s;
    *bytes = p.total;
    return KDLOSS_OK;
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
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    kd_kl_geom g;
    kd_spanset spans;
    kdloss_status s = kd_args_kl(params, bt, v, input, target, loss, row_loss, elem_loss, grad,
                                 &g, &spans);
    if (s != KDLOSS_OK) return s;
    kd_ew_plan plan;
    if ((s = kd_ew_plan_make(bt, v, NULL, &plan)) != KDLOSS_OK) return s;
    if ((s = kd_args_workspace(workspace, workspace_bytes, plan.total, &spans)) != KDLOSS_OK)
        return s;
    kd_ew_plan_make(bt, v, workspace, &plan);

    /* the CPU's arithmetic: the same reduction scale, multiplied */
    double scale = kd_kl_reduction_scale(params->reduction, bt, v);

    kl_args a;
    a.in = input.data;
    a.ld_in = g.ld_in;
    a.t = target.data;
    a.ld_t = g.ld_t;
    a.grad = grad.data;
    a.ld_g = g.ld_g;
    a.elem = (float *)elem_loss.data;
    a.ld_el = g.ld_el;
    a.part = (loss || row_loss) ? plan.part : NULL;
    a.flags = (loss || row_loss || elem_loss.data) ? plan.flags : NULL;
    a.bt = bt;
    a.v = v;
    a.ntiles = plan.ntiles;
    a.eps = (float)params->eps;
    a.gscale = (float)(scale * params->grad_scale);
    a.log_target = params->log_target != 0;
    size_t ei = kdloss_dtype_size(input.dtype), et = kdloss_dtype_size(target.dtype);
    bool vec = kd_aligned16(input.data, g.ld_in, ei) && kd_aligned16(target.data, g.ld_t, et) &&
               kd_aligned16(grad.data, g.ld_g, ei) && kd_aligned16(elem_loss.data, g.ld_el, 4);

    kd_dev_guard dg;
    if ((s = kd_dev_enter(ctx, &dg)) != KDLOSS_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    unsigned grid = kd_grid(bt * plan.ntiles);
    if (a.flags) s = kd_cuda_clear_flags(st, a.flags, bt);
    if (s == KDLOSS_OK) {
        switch (input.dtype) {
        case KDLOSS_F32: kl_launch1<KDLOSS_F32>(target.dtype, a, vec, grid, st); break;
        case KDLOSS_BF16: kl_launch1<KDLOSS_BF16>(target.dtype, a, vec, grid, st); break;
        default: kl_launch1<KDLOSS_F16>(target.dtype, a, vec, grid, st); break;
        }
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
