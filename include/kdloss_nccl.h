/*
 * kdloss_nccl.h: an NCCL communicator for the vocabulary-parallel losses on the GPU
 * (kdloss_cuda_fused_linear_distill_vp, kdloss_cuda_fused_linear_topk_distill_vp in kdloss.h).
 * Header-only, so libkdloss itself never depends on NCCL: include it where you include nccl.h
 * and link NCCL (-lnccl) as you already do.
 *
 *   kdloss_nccl_comm c;
 *   kdloss_comm_from_nccl(nccl_comm, stream, &c);      // the tensor-parallel group's comm
 *   kdloss_vocab_shard shard = {&c.comm, v_total, v_begin};
 *   kdloss_cuda_fused_linear_distill_vp(ctx, stream, &params, &shard, ...);   // the SAME stream
 *
 * For the CUDA entry points the all-reduce buffer is DEVICE memory, and the reduction must be
 * ordered on the call's stream: the kernels that fill the buffer are queued on it before the
 * callback runs, and the ones that read the result are queued after it returns. The adapter
 * enqueues ncclAllReduce (in place) on `stream` and returns without waiting, so `stream` must be
 * the stream passed to the kdloss_cuda_* call (set c.stream again, or call kdloss_comm_from_nccl
 * again, when the call's stream changes). Not for the CPU entry points (host buffers).
 *
 * `c` must stay where it is while calls use it (c.comm.ctx points at it); it owns nothing:
 * creating and destroying the ncclComm_t and the stream stays the caller's business. NCCL's
 * group semantics apply as usual: every rank must make the same kdloss calls in the same order.
 */
#ifndef KDLOSS_NCCL_H
#define KDLOSS_NCCL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kdloss.h"

/* A kdloss_comm, the NCCL communicator and the stream its all-reduces are queued on. */
typedef struct kdloss_nccl_comm {
    kdloss_comm comm; /* pass &x.comm as the shard's communicator */
    ncclComm_t nccl;
    cudaStream_t stream; /* the kdloss_cuda_* call's stream */
} kdloss_nccl_comm;

/* kdloss_comm.allreduce: n elements of dtype (F32 or F64) at the device pointer buf, reduced in
 * place with op over every rank, queued on c->stream. 0 when NCCL accepted the operation. */
static inline int kdloss_nccl_allreduce_(void *ctx, void *buf, int64_t n, kdloss_dtype dtype,
                                         kdloss_comm_op op) {
    const kdloss_nccl_comm *c = (const kdloss_nccl_comm *)ctx;
    if ((dtype != KDLOSS_F64 && dtype != KDLOSS_F32) || n < 0) return 1;
    if (n == 0) return 0;
    ncclDataType_t t = dtype == KDLOSS_F64 ? ncclFloat64 : ncclFloat32;
    ncclRedOp_t o = op == KDLOSS_COMM_MAX ? ncclMax : ncclSum;
    return ncclAllReduce(buf, buf, (size_t)n, t, o, c->nccl, c->stream) == ncclSuccess ? 0 : 1;
}

/* Fills *c for the NCCL communicator `nccl` (rank and size from it) and the stream of the
 * kdloss_cuda_* calls that will use it. Returns KDLOSS_ERR_COMM if NCCL cannot tell them. */
static inline kdloss_status kdloss_comm_from_nccl(ncclComm_t nccl, cudaStream_t stream,
                                                  kdloss_nccl_comm *c) {
    int rank, size;
    if (ncclCommUserRank(nccl, &rank) != ncclSuccess || ncclCommCount(nccl, &size) != ncclSuccess)
        return KDLOSS_ERR_COMM;
    c->nccl = nccl;
    c->stream = stream;
    c->comm.rank = rank;
    c->comm.size = size;
    c->comm.allreduce = kdloss_nccl_allreduce_;
    c->comm.ctx = c;
    return KDLOSS_OK;
}

#endif /* KDLOSS_NCCL_H */
