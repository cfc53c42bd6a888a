/* The host-side rules of the vocabulary-parallel fused losses (kdloss.h, docs/MATH.md section 9),
 * shared by the CPU entry points (src/cpu/fld_vp.c) and the CUDA ones (src/cuda/vp.cu): which
 * communicator a rank can take part with, what a shard must satisfy before the collective, and
 * the agreement collective itself, whose all-reduce each backend performs its own way (the CPU on
 * the host buffer, CUDA staged through device memory). */
#ifndef KDLOSS_VP_H
#define KDLOSS_VP_H

#include <stdint.h>

#include "kdloss.h"

#ifdef __cplusplus
extern "C" { /* the CUDA sources (C++) call these C functions */
#endif

/* Slots of the agreement buffer after the 2 size block slots (begin, rows) of every rank. */
enum { KD_VP_AG_ERROR, KD_VP_AG_NEG_CHUNK, KD_VP_AG_BT, KD_VP_AG_NEG_BT, KD_VP_AG_HS,
       KD_VP_AG_NEG_HS, KD_VP_AG_SHAPE, KD_VP_AG_NEG_SHAPE, KD_VP_AG_N };

/* Doubles of the agreement buffer of `size` ranks. */
static inline int64_t kd_vp_agree_len(int size) { return 2 * (int64_t)size + KD_VP_AG_N; }

/* A communicator this rank can take part in: shard, comm and callback present, a rank inside
 * its size (NULL_POINTER, INVALID_PARAM). Without one the call returns at once, and the other
 * ranks then wait in the agreement (kdloss.h says so). */
kdloss_status kd_vp_check_comm(const kdloss_vocab_shard *sh);

/* The shard and this rank's v rows: what can be checked before the collective (INVALID_SIZE,
 * UNSUPPORTED above INT32_MAX rows in all). */
kdloss_status kd_vp_check_shard(const kdloss_vocab_shard *sh, int64_t v);

/* The all-reduce MAX of the agreement's n doubles at buf (host memory), every rank's in place:
 * KDLOSS_OK, KDLOSS_ERR_COMM when the callback failed, or the backend's own error. */
typedef kdloss_status (*kd_vp_reduce_fn)(void *rctx, double *buf, int64_t n);

/* The agreement collective: one MAX over kd_vp_agree_len(size) doubles, which every rank joins
 * with st, its own check result (kd_vp_check_comm must have passed). Returns st on a rank whose
 * own arguments are bad, KDLOSS_ERR_PEER on the others; SHAPE_MISMATCH when the ranks disagree on
 * BT, Hs or `shape` (Ht, or K) or their blocks do not tile [0, v_total) in rank order; the
 * reduction's failure; else KDLOSS_OK with *chunk the smallest chunk of all ranks. */
kdloss_status kd_vp_agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                          int64_t hs, int64_t shape, int64_t *chunk, kd_vp_reduce_fn reduce,
                          void *rctx);

#ifdef __cplusplus
}
#endif

#endif /* KDLOSS_VP_H */
