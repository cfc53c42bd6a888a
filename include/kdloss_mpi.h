/*
 * kdloss_mpi.h: an MPI communicator for the vocabulary-parallel losses (kdloss.h). Header-only,
 * so libkdloss itself never depends on MPI: include it where you include mpi.h and link MPI as
 * you already do.
 *
 *   kdloss_mpi_comm c;
 *   kdloss_comm_from_mpi(MPI_COMM_WORLD, &c);            // or the tensor-parallel group
 *   kdloss_vocab_shard shard = {&c.comm, v_total, v_begin};
 *   kdloss_fused_linear_distill_vp(&params, &shard, ...);
 *
 * `c` must stay where it is while calls use it (c.comm.ctx points at it); it owns nothing, and
 * freeing the MPI communicator stays the caller's business.
 */
#ifndef KDLOSS_MPI_H
#define KDLOSS_MPI_H

#include <mpi.h>

#include "kdloss.h"

/* A kdloss_comm and the MPI_Comm behind it. */
typedef struct kdloss_mpi_comm {
    kdloss_comm comm; /* pass &x.comm as the shard's communicator */
    MPI_Comm mpi;
} kdloss_mpi_comm;

static inline int kdloss_mpi_allreduce_(void *ctx, void *buf, int64_t n, kdloss_dtype dtype,
                                        kdloss_comm_op op) {
    const kdloss_mpi_comm *c = (const kdloss_mpi_comm *)ctx;
    MPI_Datatype t = dtype == KDLOSS_F64 ? MPI_DOUBLE : MPI_FLOAT;
    MPI_Op o = op == KDLOSS_COMM_MAX ? MPI_MAX : MPI_SUM;
    if (dtype != KDLOSS_F64 && dtype != KDLOSS_F32) return 1;
    /* MPI counts are int: large buffers go in pieces of at most 2^30 elements */
    size_t es = dtype == KDLOSS_F64 ? 8 : 4;
    for (int64_t off = 0; off < n; off += (int64_t)1 << 30) {
        int cnt = (int)(n - off < ((int64_t)1 << 30) ? n - off : ((int64_t)1 << 30));
        if (MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)off * es, cnt, t, o, c->mpi) !=
            MPI_SUCCESS)
            return 1;
    }
    return 0;
}

/* Fills *c for the MPI communicator `mpi` (rank and size from it). Returns KDLOSS_ERR_COMM if
 * MPI cannot tell them. */
static inline kdloss_status kdloss_comm_from_mpi(MPI_Comm mpi, kdloss_mpi_comm *c) {
    int rank, size;
    if (MPI_Comm_rank(mpi, &rank) != MPI_SUCCESS || MPI_Comm_size(mpi, &size) != MPI_SUCCESS)
        return KDLOSS_ERR_COMM;
    c->mpi = mpi;
    c->comm.rank = rank;
    c->comm.size = size;
    c->comm.allreduce = kdloss_mpi_allreduce_;
    c->comm.ctx = c;
    return KDLOSS_OK;
}

#endif /* KDLOSS_MPI_H */
