/* Host steps of the vocabulary-parallel fused losses on the GPU (vp_cuda.h), shared by the
 * dense teacher (fld_vp.cu) and the sparse one (topk_vp.cu). Nothing here has run on a GPU. */
#include <stdlib.h>

#include "vp_cuda.h"

kdloss_status kd_cuda_vp_enter(const kdloss_cuda_context *ctx, const kdloss_vocab_shard *sh) {
    kdloss_status s = kd_vp_check_comm(sh);
    if (s != KDLOSS_OK) return s;
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    return sh->comm->size > KD_VP_MAX_RANKS ? KDLOSS_ERR_UNSUPPORTED : KDLOSS_OK;
}

typedef struct vp_stage {
    kdloss_cuda_context *ctx;
    cudaStream_t st;
    const kdloss_comm *comm;
} vp_stage;

/* kd_vp_reduce_fn on the GPU, for both of the agreement's collectives (2 size + KD_VP_AG_N
 * doubles, then KD_VP_CONFIRM_N): the host buffer into the context's device buffer, the
 * callback's MAX there (stream-ordered like every other all-reduce of the call), back, and a
 * stream synchronization before the host reads it (the second collective's copy in follows the
 * first's copy out on the same stream). n <= KD_VP_AGREE_DOUBLES (kd_cuda_vp_enter bounds the
 * size). */
static kdloss_status vp_reduce_staged(void *rctx, double *buf, int64_t n) {
    const vp_stage *g = (const vp_stage *)rctx;
    if (n < 1 || n > KD_VP_AGREE_DOUBLES) return KDLOSS_ERR_INTERNAL; /* not reached */
    const size_t bytes = (size_t)n * sizeof(double);
    cudaError_t e = cudaMemcpyAsync(g->ctx->vp_agree, buf, bytes, cudaMemcpyHostToDevice, g->st);
    if (e != cudaSuccess) return kd_cuda_status(e);
    kdloss_status s = kd_cuda_vp_allreduce(g->comm, g->ctx->vp_agree, n, KDLOSS_F64,
                                           KDLOSS_COMM_MAX);
    if (s != KDLOSS_OK) return s;
    e = cudaMemcpyAsync(buf, g->ctx->vp_agree, bytes, cudaMemcpyDeviceToHost, g->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    return kd_cuda_status(e);
}

kdloss_status kd_cuda_vp_weights(cudaStream_t st, const float *w, int64_t bt, uint64_t *setup) {
    if (!w) return KDLOSS_OK;
    float *h = (float *)malloc((size_t)bt * sizeof(float));
    if (!h) return KDLOSS_ERR_OUT_OF_MEMORY;
    cudaError_t e = cudaMemcpyAsync(h, w, (size_t)bt * sizeof(float), cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    kdloss_status s = kd_cuda_status(e);
    if (s == KDLOSS_OK) s = kd_check_row_weights(h, bt);
    if (s == KDLOSS_OK) *setup = kd_vp_weights_hash(*setup, h, bt);
    free(h);
    return s;
}

kdloss_status kd_cuda_vp_agree(kdloss_cuda_context *ctx, cudaStream_t st,
                               const kdloss_vocab_shard *sh, int64_t v, kdloss_status status,
                               int64_t bt, int64_t hs, int64_t shape, const kd_vp_terms *terms,
                               int64_t *chunk) {
    vp_stage g = {ctx, st, sh->comm};
    return kd_vp_agree_terms(sh, v, status, bt, hs, shape, terms, chunk, vp_reduce_staged, &g);
}

kdloss_status kd_cuda_vp_allreduce(const kdloss_comm *c, void *buf, int64_t n, kdloss_dtype dt,
                                   kdloss_comm_op op) {
    return c->allreduce(c->ctx, buf, n, dt, op) ? KDLOSS_ERR_COMM : KDLOSS_OK;
}

kdloss_status kd_cuda_vp_carve(kd_carver *cv, int64_t chunk, int64_t n_st, int64_t hs,
                               int want_grad, double **st, float **part) {
    const uint64_t c = (uint64_t)chunk;
    if (c * (uint64_t)n_st > ((uint64_t)1 << 56) || c * (uint64_t)hs > ((uint64_t)1 << 58))
        return KDLOSS_ERR_INVALID_SIZE;
    *st = (double *)kd_carve(cv, (size_t)(c * (uint64_t)n_st) * sizeof(double));
    *part = want_grad ? (float *)kd_carve(cv, (size_t)(c * (uint64_t)hs) * sizeof(float)) : NULL;
    return KDLOSS_OK;
}

kdloss_status kd_cuda_vp_dxs(const fld_gemms *gm, const kdloss_comm *c, float *part, int64_t r0,
                             int64_t rows, kdloss_mat dxs) {
    const kdloss_status s = fld_chunk_dx(gm, rows, part, CUDA_R_32F, gm->hs);
    return s == KDLOSS_OK ? kd_cuda_vp_dxs_reduce(gm, c, part, r0, rows, dxs) : s;
}

kdloss_status kd_cuda_vp_dxs_reduce(const fld_gemms *gm, const kdloss_comm *c, float *part,
                                    int64_t r0, int64_t rows, kdloss_mat dxs) {
    const kdloss_status s =
        kd_cuda_vp_allreduce(c, part, rows * gm->hs, KDLOSS_F32, KDLOSS_COMM_SUM);
    if (s != KDLOSS_OK) return s;
    char *dst = (char *)dxs.data + (size_t)(r0 * dxs.ld) * kdloss_dtype_size(dxs.dtype);
    if (dxs.dtype == KDLOSS_BF16)
        kd_cast_launch<KDLOSS_BF16>(gm->st, part, gm->hs, dst, dxs.ld, rows, gm->hs);
    else
        kd_cast_launch<KDLOSS_F32>(gm->st, part, gm->hs, dst, dxs.ld, rows, gm->hs);
    return kd_launch_status();
}
