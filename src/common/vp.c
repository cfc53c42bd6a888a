/* The vocabulary-parallel calls' host-side rules (vp.h), one definition for the CPU and CUDA
 * backends: the communicator and shard checks, and the agreement collective in which every rank
 * learns whether all of them accepted their arguments, that the blocks tile the vocabulary, and
 * which chunk size they share. */
#include "vp.h"

#include <math.h>
#include <stdlib.h>

kdloss_status kd_vp_check_comm(const kdloss_vocab_shard *sh) {
    if (!sh || !sh->comm || !sh->comm->allreduce) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_comm *c = sh->comm;
    return c->size >= 1 && c->rank >= 0 && c->rank < c->size && c->size <= (1 << 24)
               ? KDLOSS_OK
               : KDLOSS_ERR_INVALID_PARAM;
}

kdloss_status kd_vp_check_shard(const kdloss_vocab_shard *sh, int64_t v) {
    if (sh->v_total <= 0 || sh->v_begin < 0 || v <= 0 || sh->v_begin > sh->v_total - v)
        return KDLOSS_ERR_INVALID_SIZE;
    return sh->v_total > INT32_MAX ? KDLOSS_ERR_UNSUPPORTED : KDLOSS_OK;
}

/* This rank's entries: its block's two slots, then the MAX slots (a pair x, -x gives every
 * rank both the largest and the smallest value, so equality is one comparison). */
static void agree_fill(double *b, int64_t n, const kdloss_vocab_shard *sh, int64_t v,
                       kdloss_status st, int64_t bt, int64_t hs, int64_t shape, int64_t chunk) {
    const kdloss_comm *c = sh->comm;
    for (int64_t i = 0; i < n; i++) b[i] = -INFINITY;
    double *ag = b + 2 * c->size;
    b[2 * c->rank] = (double)sh->v_begin;
    b[2 * c->rank + 1] = (double)v;
    ag[KD_VP_AG_ERROR] = st != KDLOSS_OK;
    ag[KD_VP_AG_NEG_CHUNK] = -(double)chunk;
    ag[KD_VP_AG_BT] = (double)bt;
    ag[KD_VP_AG_NEG_BT] = -(double)bt;
    ag[KD_VP_AG_HS] = (double)hs;
    ag[KD_VP_AG_NEG_HS] = -(double)hs;
    ag[KD_VP_AG_SHAPE] = (double)shape;
    ag[KD_VP_AG_NEG_SHAPE] = -(double)shape;
}

/* The verdict from the reduced buffer (the reduction succeeded). */
static kdloss_status agree_read(const double *b, const kdloss_vocab_shard *sh, kdloss_status st,
                                int64_t *chunk) {
    const kdloss_comm *c = sh->comm;
    const double *ag = b + 2 * c->size;
    if (st != KDLOSS_OK) return st;
    if (ag[KD_VP_AG_ERROR] != 0.0) return KDLOSS_ERR_PEER;
    if (ag[KD_VP_AG_BT] != -ag[KD_VP_AG_NEG_BT] || ag[KD_VP_AG_HS] != -ag[KD_VP_AG_NEG_HS] ||
        ag[KD_VP_AG_SHAPE] != -ag[KD_VP_AG_NEG_SHAPE])
        return KDLOSS_ERR_SHAPE_MISMATCH;
    double end = 0.0; /* the blocks in rank order must tile [0, v_total) */
    for (int r = 0; r < c->size; r++) {
        if (b[2 * r] != end) return KDLOSS_ERR_SHAPE_MISMATCH;
        end += b[2 * r + 1];
    }
    if (end != (double)sh->v_total) return KDLOSS_ERR_SHAPE_MISMATCH;
    *chunk = (int64_t)-ag[KD_VP_AG_NEG_CHUNK];
    return KDLOSS_OK;
}

kdloss_status kd_vp_agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                          int64_t hs, int64_t shape, int64_t *chunk, kd_vp_reduce_fn reduce,
                          void *rctx) {
    double stack[2 * 64 + KD_VP_AG_N], *b = stack;
    int64_t n = kd_vp_agree_len(sh->comm->size);
    if (sh->comm->size > 64 && !(b = malloc((size_t)n * sizeof(double))))
        return KDLOSS_ERR_OUT_OF_MEMORY;
    agree_fill(b, n, sh, v, st, bt, hs, shape, *chunk);
    kdloss_status out = reduce(rctx, b, n);
    if (out == KDLOSS_OK) out = agree_read(b, sh, st, chunk);
    if (b != stack) free(b);
    return out;
}
