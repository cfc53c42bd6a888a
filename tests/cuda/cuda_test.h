/* The CUDA test's shared parts (tests/cuda/test_cuda_*.c build one program, test_cuda): the
 * device and stream, allocation and copies, comparisons with stated tolerances, packed operands
 * and labels, the checks every row loss shares, the fused losses' gradient checks, the
 * vocabulary-parallel harness, and each section's entry point. Tolerances: test_cuda_main.c. */
#ifndef KDLOSS_CUDA_TEST_H
#define KDLOSS_CUDA_TEST_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "kdloss.h"
#include "ref_topk.h"
#include "reference.h"
#include "testutil.h"

/* The CPU functions, when this build has them (resolved to NULL otherwise). */
#pragma weak kdloss_kl_div
#pragma weak kdloss_jsd
#pragma weak kdloss_fused_linear_jsd
#pragma weak kdloss_distill
#pragma weak kdloss_distill_logits
#pragma weak kdloss_fused_linear_distill
#pragma weak kdloss_topk_distill_logits
#pragma weak kdloss_fused_linear_topk_distill

extern kdloss_cuda_context *g_ctx;
extern cudaStream_t g_st; /* non-blocking: setup helpers end with a device-wide sync */
extern int g_gpu;

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define U32 0x1p-24 /* the fp32 unit roundoff */

/* ---- memory (test_cuda_util.c) ---- */
void *xmalloc(size_t n);
void *dalloc(size_t n);
void h2d(void *d, const void *h, size_t n);
void d2h(void *h, const void *d, size_t n);
void dpoison(void *d, size_t n);         /* 0xFF bytes: NaN in every float dtype */
void *dupload(const void *h, size_t n);  /* a fresh device copy of n host bytes */
void ddown(void *h, void *d, size_t n);  /* after g_st: n bytes of d into h, then frees d */
void *dfetch(const void *d, size_t n);   /* a fresh host copy of n device bytes */
int dpoisoned(const void *d, size_t n);  /* 1 if the n device bytes still hold 0xFF */
int32_t read_status(const void *dws);    /* a workspace's status word */

/* ---- comparisons ---- */
double *to_double(const void *p, kdloss_dtype dt, int64_t rows, int64_t cols, int64_t ld);
double max_abs(const double *x, int64_t n);
int close1(double got, double want, double atol, double rtol);
/* One check per tensor: every element within atol + rtol |want| (NaN and inf exactly). */
void cmp_arr(const char *what, const double *got, const double *ref, int64_t n, double atol,
             double rtol);
/* One check: ||got - ref|| / ||ref|| <= tol, every element finite. */
void cmp_norm(const char *what, const double *got, const double *ref, int64_t n, double tol);
int pad_untouched(const void *h, kdloss_dtype dt, int64_t bt, int64_t v, int64_t ld);
void cmp_bits(const char *what, const void *a, const void *b, size_t n);

/* ---- inputs ---- */
double logsumexp(const double *z, int64_t n, double scale);
void fill_normal(kt_rng *rng, double *x, int64_t n, double sd);
/* Student logits of spread ~2 with row offsets (0, +25, and a peak of +12 at one column). */
double *gen_logits(kt_rng *rng, int64_t bt, int64_t v, kdloss_dtype dt);
/* JSD(beta) elementwise on log-probs x (student), y (teacher): returns l, writes dl/dx. The
 * CUDA test's own reference for kdloss_cuda_jsd and the fused-linear JSD. */
double cu_ref_jsd_elem(double beta, double x, double y, double *g);
/* TVD's subgradient at (near) ties: P and Q equal to fp32 rounding, either sign is right. */
int tvd_tie(const kdloss_div_params *d, double x, double y);

/* A packed operand: the host copy (kt_pack: bt x ld, poisoned padding) and the device one, one
 * element past a 16-byte boundary when misaligned (the scalar path). */
typedef struct ct_mat {
    void *h;      /* host copy (NULL for an output) */
    char *base;   /* the device allocation */
    void *d;      /* the device operand */
    size_t bytes; /* rows x ld elements */
} ct_mat;
ct_mat ct_in(const double *x, int64_t rows, int64_t cols, int64_t ld, kdloss_dtype dt,
             int misalign);
ct_mat ct_out(int64_t rows, int64_t ld, kdloss_dtype dt, int misalign); /* 0xFF on the device */
void ct_free(ct_mat *m);

/* Labels: KT_LAB_NONE, KT_LAB_SOME (every fourth row from row 1 ignored, -100), KT_LAB_ALL;
 * bad: the last row's label V (out of range). */
typedef struct ct_labels {
    int mode, bad;
    int64_t *lab;       /* bt host values (0 without labels) */
    void *h;            /* host copy in the dtype (NULL without labels) */
    kdloss_labels dev;  /* the device operand (data NULL without labels) */
    kdloss_labels host; /* the host operand */
    int64_t nv;         /* rows counted (not ignored, in range) */
} ct_labels;
ct_labels ct_labels_make(kt_rng *rng, int mode, kdloss_dtype dt, int bad, int64_t bt, int64_t v);
/* The older kinds of the special-case tables: 0 none, 1 I64 some ignored, 2 I32 some ignored,
 * 3 I64 all ignored, 4 I32 some ignored and the last row out of range. */
ct_labels ct_labels_kind(kt_rng *rng, int kind, int64_t bt, int64_t v);
void ct_labels_free(ct_labels *L);

/* ---- a row loss: outputs and checks (test_cuda_util.c) ---- */
typedef kdloss_status (*ct_call)(void *arg);

typedef struct ct_rows {
    int64_t bt, v, ld;
    kdloss_dtype dg; /* the gradient's dtype */
    ct_mat g;        /* the gradient (in place: the student's device memory, g.base NULL) */
    int in_place;
    float *loss, *row; /* device; loss NULL: not asked */
    void *ws;
    size_t wsb;
} ct_rows;
/* Outputs poisoned; in_place: the gradient over `over`. */
void ct_rows_alloc(ct_rows *o, int64_t bt, int64_t v, int64_t ld, kdloss_dtype dg, int misalign,
                   const ct_mat *over, int want_loss, size_t wsb);
void ct_rows_free(ct_rows *o);

/* What the reference expects of a call, and how close. */
typedef struct ct_want {
    int32_t status;       /* the workspace's status word */
    const double *grad;   /* bt x v */
    const double *slack;  /* bt x v: how far an element may stray beyond the tolerance, or NULL */
    double g_atol, g_rtol;
    const double *row;    /* bt */
    double row_atol;      /* rtol 1e-4 */
    double loss, loss_atol; /* rtol 1e-4 */
} ct_want;

/* The status word, the gradient, its padding, the row losses and the loss against w; then the
 * call again (not in place): the same bits. Returns the gradient as doubles (bt x v) and the
 * loss in *hl, for the comparison with the CPU function. */
double *ct_check_rows(const char *tag, const ct_rows *o, const ct_want *w, ct_call call,
                      void *arg, float *hl);
/* The CPU function's gradient cg (packed like o's) and loss cl against the GPU's gg, hl:
 * elements within mult x slack of each other agree (TVD ties; slack NULL: none), else within
 * g_rel x the largest + g_abs + (2 u + 1e-5) relative; the loss within loss_atol + 1e-4. */
void ct_vs_cpu(const char *tag, const ct_rows *o, const double *gg, const void *cg,
               const double *slack, double mult, double g_rel, double g_abs, float hl, float cl,
               double loss_atol);

/* ---- the fused losses (test_cuda_fused_linear_distill.c) ---- */
/* dxs = dz ws, dws = dz^T xs, dbs = column sums of dz, in double (dz: bt x v). */
void ct_ref_grads(int64_t bt, int64_t hs, int64_t v, const double *dz, const double *xs,
                  const double *ws, double *rdx, double *rdw, double *rdb);
/* A device gradient (rows x cols, ld) normwise against ref, its padding untouched; returns the
 * host bytes (for the run-to-run bits). */
void *ct_cmp_grad(const char *tag, const char *name, const void *d, kdloss_dtype dt, int64_t rows,
                  int64_t cols, int64_t ld, const double *ref, double tol);
/* A device gradient against host bytes h of an earlier call: the same bits. */
void ct_same_bits(const char *tag, const char *name, const void *d, const void *h, size_t n);

/* ---- the vocabulary-parallel harness (test_cuda_vp.c) ---- */
#define VP_MAX_RANKS 3
#define VP_MAX_CALLS 64

typedef struct vp_call_rec {
    int64_t n;
    int dt, op;
} vp_call_rec;

/* A fault of the communicator: after call number `call` (0: the agreement, 1: the confirmation)
 * the F64 slot `slot` of what rank `rank` (-1: every rank) reads back becomes `val`. */
typedef struct vp_tamper {
    int on, call, rank;
    int64_t slot;
    double val;
} vp_tamper;

/* The ranks' meeting point: each rank's host copy of its buffer and its call, between two
 * barriers. */
typedef struct vp_world {
    int size;
    pthread_barrier_t bar;
    void *in[VP_MAX_RANKS];
    vp_call_rec call[VP_MAX_RANKS];
    vp_call_rec log[VP_MAX_CALLS]; /* rank 0's calls in order */
    int ncalls;
    vp_tamper tamper;
} vp_world;

typedef struct vp_rank {
    kdloss_comm comm; /* ctx points here */
    vp_world *w;
    cudaStream_t st;
    int ncalls; /* this rank's calls so far */
} vp_rank;

typedef struct vp_case {
    const char *tag;
    int topk;        /* 0: dense teacher, 1: sparse top-k teacher */
    int64_t bt, hs, ht, v, k;
    kdloss_dtype dt; /* every float operand's */
    int bias;
    int labels;      /* top-k: 0 runs without labels */
    int ent;         /* row_entropy too (the 4th row output) */
    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_topk_distill_params tp;
} vp_case;

/* The operands of a case on the device (whole heads): every pointer an allocation. */
typedef struct vp_data {
    void *xs, *ws, *bs, *xt, *wt, *bt, *lab, *ids, *lp;
} vp_data;

/* One call's outputs on the device: loss / soft / hard, the three row outputs, the gradients
 * (dws / dbs of `rows` vocabulary rows), and their host copies after the call. */
typedef struct vp_out {
    float *d_sc, *d_rows;
    void *d_dxs, *d_dws, *d_dbs;
    float sc[3], *rows;
    void *dxs, *dws, *dbs;
} vp_out;

/* One rank of a vocabulary-parallel call. */
typedef struct vp_job {
    const vp_case *c;
    const vp_data *d;
    kdloss_fused_linear_distill_params dp; /* the case's, or a bad one */
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_vocab_shard shard;
    int64_t lo, n;               /* its block: shard.v_begin may differ */
    const kdloss_comm *comm;
    cudaStream_t st;             /* NULL: its own, made and destroyed here */
    kdloss_cuda_context *ctx;    /* NULL: its own */
    vp_rank *rank;               /* the test's communicator, or NULL */
    int ws_short;                /* pass one byte less than the size query's */
    int no_dxs;                  /* ask for dws / dbs but not dxs */
    float *row_entropy;          /* asked for when not NULL (device, bt floats) */
    vp_out o;
    kdloss_status status;
    int32_t word;                /* the workspace's status word */
} vp_job;

void vp_out_alloc(vp_out *o, const vp_case *c, int64_t rows);
void vp_out_fetch(vp_out *o, const vp_case *c, int64_t rows);
void vp_out_free(vp_out *o);
void vp_data_free(vp_data *d);
/* The whole-vocabulary call (single process) on g_st. */
kdloss_status vp_whole(const vp_case *c, const vp_data *d, vp_out *o);

/* Called for each rank after the run: its job (outputs fetched when its status is OK; freed
 * after), the whole call's outputs (NULL when not made). */
typedef void (*vp_rank_fn)(const char *tag, const vp_case *c, vp_job *j, const vp_out *whole,
                           void *arg);
/* A case on `size` ranks: first the whole call when `whole` is given (its outputs allocated and
 * fetched there, its status a check), then the ranks as threads with the test's communicator,
 * fn on each; w (may be NULL) gets the run's world. */
void vp_run_case(const char *tag, const vp_case *c, const vp_data *d, int size, vp_out *whole,
                 vp_world *w, vp_rank_fn fn, void *arg);

/* ---- the NaN section's parts (test_cuda_nan.c, test_cuda_nan_fused.c) ---- */
#define NB 3 /* rows of a NaN-policy call; row 1 is poisoned */
/* kdloss_cuda_distill_logits on host operands (bt x v of dt; no labels); rl, g NULL: not asked. */
kdloss_status nan_dl_call(const kdloss_distill_logits_params *p, int64_t bt, int64_t v,
                          kdloss_dtype dt, const void *s, const void *t, float *loss, float *rl,
                          void *g);
/* kdloss_cuda_topk_distill_logits on host fp32 operands (bt x v logits, bt x k I32 ids and
 * log-probs; no labels); rl NULL: not asked. */
kdloss_status nan_tk_call(const kdloss_topk_distill_params *p, int64_t bt, int64_t v, int64_t k,
                          const float *s, const int32_t *ids, const float *lp, float *loss,
                          float *rl, float *g);
void nan_fused(kt_rng *rng);
void nan_vp_cases(kt_rng *rng);
void nan_vp_topk(kt_rng *rng);
void nan_zero_grad(void);
void nan_wide(void);

/* ---- the sections, in main's order ---- */
void test_errors(void);
void test_kl(kt_rng *rng);
void test_jsd(kt_rng *rng);
void test_fl(kt_rng *rng);
void test_distill(kt_rng *rng);
void test_distill_logits(kt_rng *rng);
void test_fld(kt_rng *rng);
void test_topk_logits(kt_rng *rng);
void test_topk_fused(kt_rng *rng);
void test_logit_maps(kt_rng *rng); /* test_cuda_logit_map.c */
void test_vp(kt_rng *rng);
void test_nan(kt_rng *rng);
void test_multi(kt_rng *rng); /* test_cuda_multi.c */
void test_bigv(kt_rng *rng); /* test_cuda_bigv.c */
#ifdef KDLOSS_TEST_NCCL
void test_vp_nccl(kt_rng *rng);
#endif

#endif
