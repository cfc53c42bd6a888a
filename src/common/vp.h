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

/* Slots of the agreement buffer after the 2 size block slots (begin, rows) of every rank: the
 * error flag, -chunk, then pairs x, -x (a MAX of both gives every rank the largest and the
 * smallest value, so equality is one comparison): BT, Hs, `shape` (Ht or K), the setup's
 * fingerprint (v_total, dtypes, which operands and outputs, the early exits: kd_vp_setup_hash)
 * and the parameters' (kd_vp_params_hash), each a 53-bit integer, exact in a double. */
enum { KD_VP_AG_ERROR, KD_VP_AG_NEG_CHUNK, KD_VP_AG_BT, KD_VP_AG_NEG_BT, KD_VP_AG_HS,
       KD_VP_AG_NEG_HS, KD_VP_AG_SHAPE, KD_VP_AG_NEG_SHAPE, KD_VP_AG_SETUP, KD_VP_AG_NEG_SETUP,
       KD_VP_AG_PARAMS, KD_VP_AG_NEG_PARAMS, KD_VP_AG_N };

/* Doubles of the agreement's second collective (the confirmation): every rank's verdict flag and
 * its chunk as chunk, -chunk. */
enum { KD_VP_CONFIRM_N = 3 };

/* Doubles of the agreement buffer of `size` ranks. */
static inline int64_t kd_vp_agree_len(int size) { return 2 * (int64_t)size + KD_VP_AG_N; }

/* What every rank must share beyond the shapes, as two fingerprints (0 = nothing to add). */
typedef struct kd_vp_terms {
    uint64_t setup;  /* kd_vp_setup_hash: a difference is KDLOSS_ERR_SHAPE_MISMATCH */
    uint64_t params; /* kd_vp_params_hash: a difference is KDLOSS_ERR_INVALID_PARAM */
} kd_vp_terms;

/* The parameters that decide the math: divergence, beta, alpha, temperature, the weights,
 * t2_scale, ignore_index, grad_scale, and the top-k tail (-1 for a dense teacher). Not the chunk
 * size or the memory budget, which may differ (the agreement takes the smallest chunk). */
uint64_t kd_vp_params_hash(const kdloss_div_params *div, double temperature, double w_hard,
                           double w_soft, int t2_scale, int64_t ignore_index, double grad_scale,
                           int tail);

/* params (kd_vp_params_hash) with the logit maps mixed in: the student's and the teacher's (NULL
 * where the call has none: the top-k teacher's log-probs come mapped), each as it is read (a
 * scale of 0 is 1), so ranks whose maps differ get KDLOSS_ERR_INVALID_PARAM, as for a differing
 * temperature, instead of silently different losses. */
uint64_t kd_vp_maps_hash(uint64_t params, const kdloss_logit_map *student,
                         const kdloss_logit_map *teacher);

/* The operands' dtypes (xs; the teacher's two: xt and wt, or ids and log-probs), which optional
 * operands are given (student bias, teacher bias, labels), the parts that decide the collectives
 * and the early exits (soft part, hard part, any gradient, dxs: from the weights and the outputs
 * as kdloss.h defines them) and n_valid (the rows whose label is kept; -1 where the backend
 * counts them on the device, after the agreement). */
uint64_t kd_vp_setup_hash(kdloss_dtype xs, kdloss_dtype t0, kdloss_dtype t1, const void *bs,
                          const void *tb, kdloss_labels labels, double w_hard, double w_soft,
                          const kdloss_fused_linear_distill_out *out, int64_t n_valid);

/* setup (kd_vp_setup_hash) with the per-row weights mixed in (host memory, [bt] fp32, docs/MATH.md
 * section 12): their presence and every value's bits in row order, so that ranks whose weights
 * differ (they must be replicated) get KDLOSS_ERR_SHAPE_MISMATCH, as for labels that differ.
 * NULL weights return setup unchanged. The row_entropy output is in kd_vp_setup_hash (it sizes
 * the per-chunk SUM). */
uint64_t kd_vp_weights_hash(uint64_t setup, const float *w, int64_t bt);

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

/* The agreement: two MAX collectives, which every rank joins with st, its own check result
 * (kd_vp_check_comm must have passed), whatever that result, so that every rank makes the same
 * calls:
 *   1. kd_vp_agree_len(size) doubles: the blocks, the error flag, the chunk, BT, Hs, `shape`
 *      (Ht, or K) and the terms' fingerprints (v_total is mixed into the setup's here);
 *   2. KD_VP_CONFIRM_N doubles: each rank's verdict on 1 and the chunk it read, so that a
 *      communicator that hands the ranks different or impossible values fails on every rank.
 * Every value read back is checked before it is used: the flags 0 or 1, this rank's own entries
 * where it put them (a MAX never lowers them), the blocks integers in range, the chunk an
 * integer in [1, *chunk] (this rank's plan); anything else is KDLOSS_ERR_COMM.
 * Returns st on a rank whose own arguments are bad, KDLOSS_ERR_PEER on the others;
 * SHAPE_MISMATCH when the ranks disagree on BT, Hs, `shape` or the setup, or their blocks do not
 * tile [0, v_total) in rank order; INVALID_PARAM when they disagree on the parameters;
 * KDLOSS_ERR_COMM (or the backend's error) when a reduction fails (then at once: no second
 * collective) or returns values that cannot be honest, or when the ranks' verdicts or chunks
 * differ; KDLOSS_ERR_OUT_OF_MEMORY at once when the buffer of more than 64 ranks cannot be
 * allocated (the others then wait, as for a NULL comm); else KDLOSS_OK with *chunk the smallest
 * chunk of all ranks. terms NULL: zero fingerprints. */
kdloss_status kd_vp_agree_terms(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st,
                                int64_t bt, int64_t hs, int64_t shape, const kd_vp_terms *terms,
                                int64_t *chunk, kd_vp_reduce_fn reduce, void *rctx);

/* kd_vp_agree_terms without terms (the same two collectives; only v_total in the setup). */
kdloss_status kd_vp_agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                          int64_t hs, int64_t shape, int64_t *chunk, kd_vp_reduce_fn reduce,
                          void *rctx);

#ifdef __cplusplus
}
#endif

#endif /* KDLOSS_VP_H */
