/* The vocabulary-parallel fused losses on the GPU, the host steps both teachers share (vp.cu):
 * the checks that decide whether this rank can take part at all, the agreement collective staged
 * through the context's device buffer, the chunk's all-reduces, and the dxs step (a partial in
 * fp32, summed over the ranks, rounded once). The rules themselves are src/common/vp.h's, the
 * CPU's. */
#ifndef KDLOSS_VP_CUDA_H
#define KDLOSS_VP_CUDA_H

#include "vp.h"

/* The largest communicator the context's agreement buffer serves, and that buffer's bytes: the
 * agreement's first collective at that size; the second (the confirmation, KD_VP_CONFIRM_N
 * doubles) is smaller and reuses it. */
#define KD_VP_MAX_RANKS 4096
#define KD_VP_AGREE_DOUBLES (2 * KD_VP_MAX_RANKS + KD_VP_AG_N)
#define KD_VP_AGREE_BYTES ((size_t)KD_VP_AGREE_DOUBLES * sizeof(double))

#ifdef __CUDACC__
#include "fld_rows.cuh"

/* What decides whether this rank can take part in the agreement: kd_vp_check_comm, a context,
 * a communicator the context's buffer can serve (UNSUPPORTED above KD_VP_MAX_RANKS). */
kdloss_status kd_cuda_vp_enter(const kdloss_cuda_context *ctx, const kdloss_vocab_shard *sh);

/* Per-row weights (docs/MATH.md 12.1) of a vocabulary-parallel call, w [bt] device memory (NULL:
 * none, nothing done): read to the host on stream st (a copy and a stream synchronization: the
 * agreement is a host decision anyway), checked as the CPU checks them (kd_check_row_weights:
 * INVALID_PARAM naming the row, this rank's fault in the agreement, nothing written) and mixed
 * into the setup's fingerprint (kd_vp_weights_hash: ranks whose weights differ get
 * SHAPE_MISMATCH, as on the CPU). OUT_OF_MEMORY when the host copy cannot be allocated, the CUDA
 * error of the copy. On the context's device (kd_dev_enter done). */
kdloss_status kd_cuda_vp_weights(cudaStream_t st, const float *w, int64_t bt, uint64_t *setup);

/* kd_vp_agree_terms (vp.h: the agreement and the confirmation, two collectives that every rank
 * makes whatever its status) with each buffer staged through ctx->vp_agree on stream st (copy
 * in, the callback's all-reduce, copy out, synchronize: the verdict is a host decision). terms:
 * the call's fingerprints (kd_vp_setup_hash with n_valid -1, the device counts it after the
 * agreement; kd_vp_params_hash), filled only when this rank's own checks passed, else NULL or
 * zeros, as the CPU backend does. On the context's device (kd_dev_enter done). */
kdloss_status kd_cuda_vp_agree(kdloss_cuda_context *ctx, cudaStream_t st,
                               const kdloss_vocab_shard *sh, int64_t v, kdloss_status status,
                               int64_t bt, int64_t hs, int64_t shape, const kd_vp_terms *terms,
                               int64_t *chunk);

/* One of the chunk's all-reduces: n elements of dt at the device pointer buf (the callback
 * orders it on the call's stream). KDLOSS_ERR_COMM when the callback fails. */
kdloss_status kd_cuda_vp_allreduce(const kdloss_comm *c, void *buf, int64_t n, kdloss_dtype dt,
                                   kdloss_comm_op op);

/* The vocabulary-parallel regions after a plan's, from cv: n_st doubles of statistics a chunk
 * row, and with gradients the chunk's dxs partial (chunk x hs fp32). INVALID_SIZE when they
 * would overflow. */
kdloss_status kd_cuda_vp_carve(kd_carver *cv, int64_t chunk, int64_t n_st, int64_t hs,
                               int want_grad, double **st, float **part);

/* dxs rows [r0, r0 + rows) of a chunk: this rank's partial dzs ws_r in fp32 into part (rows x
 * hs, contiguous), summed over the ranks, then rounded once into dxs (the caller's, with its
 * effective ld, dtype of xs). */
kdloss_status kd_cuda_vp_dxs(const fld_gemms *gm, const kdloss_comm *c, float *part, int64_t r0,
                             int64_t rows, kdloss_mat dxs);

/* kd_cuda_vp_dxs after its GEMM: part (rows x hs fp32, this rank's partial, formed by the
 * caller) summed over the ranks, then rounded once into dxs rows [r0, r0 + rows). */
kdloss_status kd_cuda_vp_dxs_reduce(const fld_gemms *gm, const kdloss_comm *c, float *part,
                                    int64_t r0, int64_t rows, kdloss_mat dxs);
#endif

#endif /* KDLOSS_VP_CUDA_H */
