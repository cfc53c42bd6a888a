/* The case grid of the divergence family, one for every backend: every divergence case of
 * div_cases.h x every shape of KT_SHAPES x every student dtype, the other parameters drawn from
 * the case's index so that, for each divergence and student dtype, every teacher dtype, label
 * mode and temperature occurs, and for each divergence every (teacher dtype, label mode) pair.
 *
 * Read by tests/test_distill.c (kdloss_distill), tests/test_distill_logits.c
 * (kdloss_distill_logits), tests/test_topk.c (kdloss_topk_distill_logits, with its tails and K
 * on top), and tests/cuda/test_cuda_distill.c, test_cuda_distill_logits.c and test_cuda_topk.c
 * (their CUDA twins), so the CPU and the CUDA tests run the same divergence x dtype x shape
 * cases. Each test adds what only it checks (CPU paths, misaligned operands, in place, ...).
 * KDLOSS_TEST_QUICK runs keep the shapes marked quick (a backend may thin them further). */
#ifndef KDLOSS_TEST_CASES_H
#define KDLOSS_TEST_CASES_H

#include <stdint.h>
#include <stdlib.h>

#include "div_cases.h"
#include "testutil.h"

/* bt x V, each for a boundary of a row kernel. */
typedef struct kt_shape {
    int64_t bt, v;
    int quick; /* run by KDLOSS_TEST_QUICK=1 */
} kt_shape;

static const kt_shape KT_SHAPES[] = {
    {11, 1, 1},    /* one column */
    {13, 9, 1},    /* under one AVX-512 vector; two CUDA threads' 8 columns */
    {7, 1100, 1},  /* past one CPU tile (1024 columns) */
    {3, 4096, 0},  /* one whole CUDA tile (KD_EW_TILE, DL_TILE: 4096 columns) */
    {3, 4133, 0},  /* past one CUDA tile, four CPU tiles */
    {2, 9001, 0},  /* three CUDA tiles */
};
#define KT_NSHAPES ((int)(sizeof KT_SHAPES / sizeof KT_SHAPES[0]))

static const kdloss_dtype KT_DTYPES[3] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
static const double KT_TEMPS[3] = {1.0, 2.0, 0.7};

/* Labels: none; some rows ignored; every row ignored (loss 0, gradient 0). */
enum { KT_LAB_NONE, KT_LAB_SOME, KT_LAB_ALL };

typedef struct kt_case {
    int n;               /* index in the grid */
    int div;             /* index in KT_DIV_CASES */
    kdloss_div_params d; /* KT_DIV_CASES[div] */
    int shape;           /* index in KT_SHAPES */
    int64_t bt, v;
    kdloss_dtype ds, dt; /* student (and gradient), teacher */
    int labels;          /* KT_LAB_* */
    kdloss_dtype ldt;    /* the labels' dtype, I64 or I32 */
    int pad;             /* padded row strides */
    double t;            /* temperature (the losses on logits) */
    int quick;           /* in KDLOSS_TEST_QUICK runs */
} kt_case;

#define KT_NGRID (KT_NDIV_CASES * KT_NSHAPES * 3)

/* Case n of the grid, 0 <= n < KT_NGRID: divergence-major, then shape, then student dtype. */
static inline kt_case kt_grid_case(int n) {
    const int xi = n % 3, si = (n / 3) % KT_NSHAPES, i = n / (3 * KT_NSHAPES);
    kt_case c;
    c.n = n;
    c.div = i;
    c.d = KT_DIV_CASES[i];
    c.shape = si;
    c.bt = KT_SHAPES[si].bt;
    c.v = KT_SHAPES[si].v;
    c.ds = KT_DTYPES[xi];
    c.dt = KT_DTYPES[(xi + i + si) % 3];
    c.labels = (i + 2 * si + xi) % 3;
    c.ldt = (i + xi + si / 3) % 2 ? KDLOSS_I32 : KDLOSS_I64;
    c.pad = (i + si) % 2;
    c.t = KT_TEMPS[(2 * xi + si / 2) % 3];
    c.quick = KT_SHAPES[si].quick;
    return c;
}

/* The labels lab[bt] in dt (I64 or I32), malloc'd (the caller frees). */
static inline void *kt_pack_labels(const int64_t *lab, int64_t bt, kdloss_dtype dt) {
    void *p = malloc((size_t)(bt > 0 ? bt : 1) * kdloss_dtype_size(dt));
    for (int64_t r = 0; p && r < bt; r++) {
        if (dt == KDLOSS_I32) ((int32_t *)p)[r] = (int32_t)lab[r];
        else ((int64_t *)p)[r] = lab[r];
    }
    return p;
}

/* KT_FOR_EACH_CASE(c) { body }: the grid, the quick shapes only in KDLOSS_TEST_QUICK runs
 * (testutil.h's kt_quick). The body may `continue` (to the next case), not `break`. */
#define KT_FOR_EACH_CASE(c)                                                                    \
    for (int kt_n_ = 0; kt_n_ < KT_NGRID; kt_n_++)                                             \
        for (kt_case c = kt_grid_case(kt_n_); c.n == kt_n_ && (!kt_quick() || c.quick);        \
             c.n = -1)

#endif
