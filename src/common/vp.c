/* The vocabulary-parallel calls' host-side rules (vp.h), one definition for the CPU and CUDA
 * backends: the communicator and shard checks, and the agreement collective in which every rank
 * learns whether all of them accepted their arguments, that the blocks tile the vocabulary, and
 * which chunk size they share, and a second, small one in which they confirm that they all read
 * the same verdict. */
#include "vp.h"

#include "logit_map.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- fingerprints ---- */

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash_u64(uint64_t h, uint64_t x) {
    return mix64(h ^ mix64(x + 0x9e3779b97f4a7c15ULL));
}

static uint64_t hash_f64(uint64_t h, double x) {
    uint64_t bits = 0;
    if (x == 0.0) x = 0.0;          /* -0 and +0 are the same parameter */
    if (x != x) bits = 0x7ff8000000000000ULL; /* one NaN (checks reject them before this) */
    else memcpy(&bits, &x, sizeof bits);
    return hash_u64(h, bits);
}

uint64_t kd_vp_params_hash(const kdloss_div_params *div, double temperature, double w_hard,
                           double w_soft, int t2_scale, int64_t ignore_index, double grad_scale,
                           int tail) {
    uint64_t h = hash_u64(0x6b646c6f73737631ULL, (uint64_t)(int64_t)div->divergence);
    h = hash_f64(h, div->beta);
    h = hash_f64(h, div->alpha);
    h = hash_f64(h, temperature);
    h = hash_f64(h, w_hard);
    h = hash_f64(h, w_soft);
    h = hash_u64(h, (uint64_t)(t2_scale != 0));
    h = hash_u64(h, (uint64_t)ignore_index);
    h = hash_f64(h, grad_scale);
    return hash_u64(h, (uint64_t)(int64_t)tail);
}

uint64_t kd_vp_maps_hash(uint64_t params, const kdloss_logit_map *student,
                         const kdloss_logit_map *teacher) {
    uint64_t h = params;
    for (int i = 0; i < 2; i++) {
        const kdloss_logit_map *m = i ? teacher : student;
        h = hash_u64(h, (uint64_t)(m != NULL));
        if (!m) continue;
        h = hash_f64(h, kd_logit_map_scale(*m)); /* a scale of 0 is read as 1 (kdloss.h) */
        h = hash_f64(h, m->softcap);
    }
    return h;
}

uint64_t kd_vp_setup_hash(kdloss_dtype xs, kdloss_dtype t0, kdloss_dtype t1, const void *bs,
                          const void *tb, kdloss_labels labels, double w_hard, double w_soft,
                          const kdloss_fused_linear_distill_out *o, int64_t n_valid) {
    int soft = w_soft > 0.0 || o->soft_loss || o->row_soft;
    int hard = w_hard > 0.0 || o->hard_loss || o->row_hard || o->row_lse;
    int grad = o->dxs.data || o->dws.data || o->dbs;
    uint64_t bits = (uint64_t)xs | (uint64_t)t0 << 8 | (uint64_t)t1 << 16 |
                    (uint64_t)(bs != NULL) << 24 | (uint64_t)(tb != NULL) << 25 |
                    (uint64_t)(labels.data != NULL) << 26 | (uint64_t)soft << 27 |
                    (uint64_t)hard << 28 | (uint64_t)grad << 29 |
                    (uint64_t)(o->dxs.data != NULL) << 30 |
                    (uint64_t)(o->row_entropy != NULL) << 31; /* sizes the SUM of stat_sum */
    return hash_u64(hash_u64(0x6b646c6f73737632ULL, bits), (uint64_t)n_valid);
}

uint64_t kd_vp_weights_hash(uint64_t setup, const float *w, int64_t bt) {
    if (!w) return setup; /* the fingerprint without weights, as before they existed */
    uint64_t h = hash_u64(setup, 0x6b646c7277677473ULL); /* "given", then every value's bits */
    for (int64_t i = 0; i < bt; i++) {
        uint32_t bits;
        memcpy(&bits, &w[i], sizeof bits);
        h = hash_u64(h, (uint64_t)bits);
    }
    return h;
}

/* ---- the agreement ---- */

#define FP_BITS 53 /* a fingerprint's bits: an integer a double holds exactly */

static double fp_value(uint64_t h) { return (double)(h >> (64 - FP_BITS)); }

/* This rank's entries: its block's two slots, then the MAX slots. */
static void agree_fill(double *b, int64_t n, const kdloss_vocab_shard *sh, int64_t v,
                       kdloss_status st, int64_t bt, int64_t hs, int64_t shape,
                       const double fp[2], int64_t chunk) {
    const kdloss_comm *c = sh->comm;
    for (int64_t i = 0; i < n; i++) b[i] = -INFINITY;
    double *ag = b + 2 * c->size;
    b[2 * c->rank] = (double)sh->v_begin;
    b[2 * c->rank + 1] = (double)v;
    ag[KD_VP_AG_ERROR] = st != KDLOSS_OK;
    ag[KD_VP_AG_NEG_CHUNK] = -(double)chunk;
    const double own[5] = {(double)bt, (double)hs, (double)shape, fp[0], fp[1]};
    for (int i = 0; i < 5; i++) {
        ag[KD_VP_AG_BT + 2 * i] = own[i];
        ag[KD_VP_AG_NEG_BT + 2 * i] = -own[i];
    }
}

/* A reduced value that is an integer in [lo, hi] (NaN fails every comparison). */
static int int_in(double x, double lo, double hi) {
    return x >= lo && x <= hi && x == floor(x);
}

/* The verdict from the reduced buffer (the reduction succeeded). The values were put there by
 * the ranks and a MAX: anything a MAX of honest entries cannot give is the communicator's fault
 * (KDLOSS_ERR_COMM), checked before any of it is used. */
static kdloss_status agree_read(const double *b, const kdloss_vocab_shard *sh, int64_t v,
                                kdloss_status st, int64_t bt, int64_t hs, int64_t shape,
                                const double fp[2], int64_t *chunk) {
    const kdloss_comm *c = sh->comm;
    const double *ag = b + 2 * c->size;
    if (st != KDLOSS_OK) return st;
    const double err = ag[KD_VP_AG_ERROR];
    if (err != 0.0 && err != 1.0) return KDLOSS_ERR_COMM;
    if (err != 0.0) return KDLOSS_ERR_PEER;
    /* every rank's checks passed: every block slot holds a rank's block; this rank's its own */
    if (b[2 * c->rank] != (double)sh->v_begin || b[2 * c->rank + 1] != (double)v)
        return KDLOSS_ERR_COMM;
    for (int r = 0; r < c->size; r++)
        if (!int_in(b[2 * r], 0.0, (double)INT32_MAX) || !int_in(b[2 * r + 1], 1.0, (double)INT32_MAX))
            return KDLOSS_ERR_COMM;
    const double own[5] = {(double)bt, (double)hs, (double)shape, fp[0], fp[1]};
    int differ[5];
    for (int i = 0; i < 5; i++) { /* max >= own >= min, or the reduction lied */
        double hi = ag[KD_VP_AG_BT + 2 * i], lo = -ag[KD_VP_AG_NEG_BT + 2 * i];
        if (!(hi >= own[i] && lo <= own[i]) || !int_in(hi, 0.0, 0x1p62) ||
            !int_in(lo, -0x1p62, 0x1p62))
            return KDLOSS_ERR_COMM;
        differ[i] = hi != lo;
    }
    const double ch = -ag[KD_VP_AG_NEG_CHUNK]; /* the smallest chunk: in [1, this rank's] */
    if (!int_in(ch, 1.0, (double)*chunk)) return KDLOSS_ERR_COMM;
    if (differ[0] || differ[1] || differ[2] || differ[3]) return KDLOSS_ERR_SHAPE_MISMATCH;
    double end = 0.0; /* the blocks in rank order must tile [0, v_total) */
    for (int r = 0; r < c->size; r++) {
        if (b[2 * r] != end) return KDLOSS_ERR_SHAPE_MISMATCH;
        end += b[2 * r + 1];
    }
    if (end != (double)sh->v_total) return KDLOSS_ERR_SHAPE_MISMATCH;
    if (differ[4]) return KDLOSS_ERR_INVALID_PARAM;
    *chunk = (int64_t)ch;
    return KDLOSS_OK;
}

/* The confirmation: every rank's verdict and chunk. A rank that rejected its own arguments or
 * found a mismatch returns that verdict whatever the others saw; a rank that accepted returns OK
 * only when every rank accepted with the same chunk (honest reductions give every rank the same
 * buffer, hence the same verdict: a difference is the communicator's). */
static kdloss_status confirm(kdloss_status verdict, int64_t chunk, kd_vp_reduce_fn reduce,
                             void *rctx) {
    double b[KD_VP_CONFIRM_N] = {verdict != KDLOSS_OK, (double)chunk, -(double)chunk};
    kdloss_status s = reduce(rctx, b, KD_VP_CONFIRM_N);
    if (verdict != KDLOSS_OK) return verdict;
    if (s != KDLOSS_OK) return s;
    if (b[0] != 0.0 || b[1] != (double)chunk || b[2] != -(double)chunk) return KDLOSS_ERR_COMM;
    return KDLOSS_OK;
}

kdloss_status kd_vp_agree_terms(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st,
                                int64_t bt, int64_t hs, int64_t shape, const kd_vp_terms *terms,
                                int64_t *chunk, kd_vp_reduce_fn reduce, void *rctx) {
    double stack[2 * 64 + KD_VP_AG_N], *b = stack;
    int64_t n = kd_vp_agree_len(sh->comm->size);
    if (sh->comm->size > 64 && !(b = malloc((size_t)n * sizeof(double))))
        return KDLOSS_ERR_OUT_OF_MEMORY;
    const double fp[2] = {fp_value(hash_u64(terms ? terms->setup : 0, (uint64_t)sh->v_total)),
                          fp_value(terms ? terms->params : 0)};
    /* a rank that failed its checks may have no plan: its chunk is 1, and only its flag counts */
    int64_t own = st == KDLOSS_OK && *chunk >= 1 ? *chunk : 1;
    agree_fill(b, n, sh, v, st, bt, hs, shape, fp, own);
    kdloss_status out = reduce(rctx, b, n);
    if (out == KDLOSS_OK) {
        int64_t agreed = own;
        out = agree_read(b, sh, v, st, bt, hs, shape, fp, &agreed);
        out = confirm(out, out == KDLOSS_OK ? agreed : 0, reduce, rctx);
        if (out == KDLOSS_OK) *chunk = agreed;
    }
    if (b != stack) free(b);
    return out;
}

kdloss_status kd_vp_agree(const kdloss_vocab_shard *sh, int64_t v, kdloss_status st, int64_t bt,
                          int64_t hs, int64_t shape, int64_t *chunk, kd_vp_reduce_fn reduce,
                          void *rctx) {
    return kd_vp_agree_terms(sh, v, st, bt, hs, shape, NULL, chunk, reduce, rctx);
}
