/* Kernels shared by the elementwise losses (KL, JSD) and the fused-linear loss: label counting
 * and the deterministic second/third reduction passes. No float atomics anywhere: every sum is
 * formed in a fixed order, so the results are bitwise reproducible. */
#include "kd_cuda.cuh"

#define KD_COUNT_THREADS 256

/* labels [bt] (or NULL: every label kept), weights w [bt] (or NULL) -> hdr->n_valid += rows
 * kept (label in [0, v), weight kd_weight_kind 0), hdr->n_bad += rows with a label that is
 * neither ignore_index nor in range, hdr->n_bad_w += rows with a bad weight (any label). The
 * counters were zeroed earlier in the same stream. Integer atomics: the totals are exact
 * whatever the order. */
__global__ void __launch_bounds__(KD_COUNT_THREADS)
kd_count_rows_kernel(const void *labels, int is64, int64_t bt, int64_t v, int64_t ignore,
                     const float *w, kd_ws_header *hdr) {
    __shared__ unsigned long long red[32];
    unsigned long long nv = 0, nb = 0, nw = 0;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < bt;
         r += (int64_t)gridDim.x * blockDim.x) {
        const int wk = kd_weight_kind(w, r);
        nw += wk == 2;
        const int64_t y = labels ? kd_label(labels, is64, r) : 0;
        if (y == ignore && labels) continue;
        if (y >= 0 && y < v) nv += wk == 0;
        else nb++;
    }
    nv = kd_block_sum(nv, red);
    nb = kd_block_sum(nb, red);
    nw = kd_block_sum(nw, red);
    if (threadIdx.x == 0) {
        if (nv) atomicAdd(&hdr->n_valid, nv);
        if (nb) atomicAdd(&hdr->n_bad, nb);
        if (nw) atomicAdd(&hdr->n_bad_w, nw);
    }
}

kdloss_status kd_cuda_count_rows(cudaStream_t st, const void *labels, int is64, int64_t bt,
                                 int64_t v, int64_t ignore_index, const float *w,
                                 kd_ws_header *hdr) {
    cudaError_t e = cudaMemsetAsync(&hdr->n_valid, 0, 3 * sizeof(unsigned long long), st);
    if (e != cudaSuccess) return kd_cuda_status(e);
    int64_t blocks = (bt + KD_COUNT_THREADS - 1) / KD_COUNT_THREADS;
    if (blocks > 1024) blocks = 1024; /* each thread loops; a few atomics per block only */
    KD_LAUNCH((unsigned)blocks, KD_COUNT_THREADS, 0, st, kd_count_rows_kernel)(
        labels, is64, bt, v, ignore_index, w, hdr);
    return kd_launch_status();
}

kdloss_status kd_cuda_count_labels(cudaStream_t st, const void *labels, int is64, int64_t bt,
                                   int64_t v, int64_t ignore_index, kd_ws_header *hdr) {
    return kd_cuda_count_rows(st, labels, is64, bt, v, ignore_index, NULL, hdr);
}

/* part (bt x ntiles) -> row sums (fixed order over tiles) -> row_loss [bt] (optional) and one
 * partial per block of KD_ROWS_THREADS rows into blk [gridDim.x], each row's sum times its
 * weight w[r] there (w NULL: 1). */
__global__ void __launch_bounds__(KD_ROWS_THREADS)
kd_rows_kernel(const double *part, int64_t bt, int64_t ntiles, const float *w, float *row_loss,
               double *blk) {
    __shared__ double red[32];
    for (int64_t b = blockIdx.x; b * KD_ROWS_THREADS < bt; b += gridDim.x) {
        int64_t r = b * KD_ROWS_THREADS + threadIdx.x;
        double s = 0.0;
        if (r < bt) {
            const double *p = part + r * ntiles;
            for (int64_t t = 0; t < ntiles; t++) s += p[t];
            if (row_loss) row_loss[r] = (float)s;
            if (w) s *= (double)w[r];
        }
        s = kd_block_sum(s, red);
        if (threadIdx.x == 0 && blk) blk[b] = s;
    }
}

#define KD_FINAL_THREADS 1024

/* blk [nblk] -> loss (one block, fixed order), and the call's status word. */
__global__ void __launch_bounds__(KD_FINAL_THREADS)
kd_final_kernel(const double *blk, int64_t nblk, float *loss, double host_factor, int host_divides,
                int use_n_valid, kd_ws_header *hdr) {
    __shared__ double red[32];
    double s = 0.0;
    if (loss)
        for (int64_t i = threadIdx.x; i < nblk; i += blockDim.x) s += blk[i];
    s = kd_block_sum(s, red);
    if (threadIdx.x == 0) {
        const int bad_label = use_n_valid && hdr->n_bad > 0;
        const int bad = bad_label || (use_n_valid && hdr->n_bad_w > 0);
        if (loss) {
            /* the CPU functions' arithmetic: KL multiplies by its reduction scale, JSD divides by
             * n_valid (bt without labels) */
            double l = host_divides ? s / host_factor : s * host_factor;
            if (use_n_valid) l = s / (hdr->n_valid > 0 ? (double)hdr->n_valid : 1.0);
            *loss = bad ? __int_as_float(0x7fc00000) : (float)l;
        }
        hdr->status = bad_label ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE
                      : bad     ? (int32_t)KDLOSS_ERR_INVALID_PARAM
                                : (int32_t)KDLOSS_OK;
    }
}

kdloss_status kd_cuda_finish_rows(cudaStream_t st, const double *part, int64_t bt, int64_t ntiles,
                                  float *row_loss, float *loss, double *blk, double host_factor,
                                  int host_divides, int use_n_valid, kd_ws_header *hdr) {
    return kd_cuda_finish_rows_w(st, part, bt, ntiles, NULL, row_loss, loss, blk, host_factor,
                                 host_divides, use_n_valid, hdr);
}

kdloss_status kd_cuda_finish_rows_w(cudaStream_t st, const double *part, int64_t bt,
                                    int64_t ntiles, const float *w, float *row_loss, float *loss,
                                    double *blk, double host_factor, int host_divides,
                                    int use_n_valid, kd_ws_header *hdr) {
    if (row_loss || loss) {
        int64_t nb = kd_rows_blocks(bt);
        KD_LAUNCH(kd_grid(nb), KD_ROWS_THREADS, 0, st, kd_rows_kernel)(part, bt, ntiles, w,
                                                                       row_loss, loss ? blk : NULL);
        kdloss_status s = kd_launch_status();
        if (s != KDLOSS_OK) return s;
    }
    KD_LAUNCH(1, KD_FINAL_THREADS, 0, st, kd_final_kernel)(
        blk, kd_rows_blocks(bt), loss, host_factor, host_divides, use_n_valid, hdr);
    return kd_launch_status();
}

/* ---- the NaN policy of the elementwise losses (kd_cuda.cuh) ---------------------------------- */

kdloss_status kd_cuda_clear_flags(cudaStream_t st, unsigned int *flags, int64_t bt) {
    return kd_cuda_status(cudaMemsetAsync(flags, 0, (size_t)bt * sizeof(unsigned int), st));
}

#define KD_POISON_THREADS 256

/* One block per row (grid-stride): a clean row costs one flag read; a flagged one is rewritten
 * (kd_cuda_poison_rows). */
__global__ void __launch_bounds__(KD_POISON_THREADS)
kd_poison_rows_kernel(const unsigned int *flags, int64_t bt, int64_t v, void *grad, int gdt,
                      int64_t ld_g, float gscale, double grad_scale, const kd_ws_header *hdr,
                      float *elem, int64_t ld_e, double *part, int64_t ntiles) {
    for (int64_t r = blockIdx.x; r < bt; r += gridDim.x) {
        if (!flags[r]) continue; /* the same for the whole block */
        if (grad) {
            float gs = gscale;
            if (hdr) {
                const unsigned long long nv = hdr->n_valid;
                gs = (float)(grad_scale / (nv > 0 ? (double)nv : 1.0));
            }
            const int nan = gs != 0.0f; /* a gradient factor of 0 writes zeros */
            for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
                if (gdt == KDLOSS_F32)
                    ((uint32_t *)grad)[r * ld_g + c] = nan ? 0x7fc00000u : 0u;
                else
                    ((uint16_t *)grad)[r * ld_g + c] =
                        (uint16_t)(!nan ? 0u : gdt == KDLOSS_BF16 ? 0x7fc0u : 0x7e00u);
            }
        }
        if (elem)
            for (int64_t c = threadIdx.x; c < v; c += blockDim.x)
                elem[r * ld_e + c] = __int_as_float(0x7fc00000);
        if (part && threadIdx.x == 0) part[r * ntiles] = __longlong_as_double(0x7ff8000000000000LL);
    }
}

kdloss_status kd_cuda_poison_rows(cudaStream_t st, const unsigned int *flags, int64_t bt,
                                  int64_t v, void *grad, kdloss_dtype gdt, int64_t ld_g,
                                  float gscale, double grad_scale, const kd_ws_header *hdr,
                                  float *elem, int64_t ld_e, double *part, int64_t ntiles) {
    const unsigned grid = (unsigned)(bt < 1024 ? bt : 1024);
    KD_LAUNCH(grid, KD_POISON_THREADS, 0, st, kd_poison_rows_kernel)(
        flags, bt, v, grad, (int)gdt, ld_g, gscale, grad_scale, hdr, elem, ld_e, part, ntiles);
    return kd_launch_status();
}
