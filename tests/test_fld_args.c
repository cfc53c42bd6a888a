/* Argument checking of kdloss_fused_linear_jsd and kdloss_fljsd_workspace_size: every error
 * code it can return, each with every output poisoned beforehand and checked untouched after
 * (nothing is written on error, even when the bad argument is the last label). Also the
 * workspace contract: exact size accepted, one byte less refused, allocation failure reported. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_fld.h"
#include "testutil.h"

enum { BT = 9, HS = 5, HT = 6, V = 11 };
#define KD_ALIGN_SLACK 64 /* a workspace region's alignment padding, at most 64 bytes each */

/* One call's arguments, valid until a test breaks one of them. */
typedef struct call {
    kdloss_fljsd_params prm;
    const kdloss_fljsd_params *pprm;
    int64_t bt, hs, ht, v;
    kdloss_cmat xs, ws, xt, wt;
    const void *bs, *bt_bias;
    kdloss_labels labels;
    kdloss_fljsd_out out;
    kdloss_fljsd_out *pout;
    void *work;
    size_t work_bytes;
} call;

/* Output storage, poisoned before each call. */
static float o_loss[3];
static float o_dxs[BT * HS], o_dws[V * HS], o_dbs[V];
static unsigned char o_work[1 << 16];

static kt_fld_problem prob;

static void poison_outputs(void) {
    kt_poison(o_loss, 3, KDLOSS_F32);
    kt_poison(o_dxs, BT * HS, KDLOSS_F32);
    kt_poison(o_dws, V * HS, KDLOSS_F32);
    kt_poison(o_dbs, V, KDLOSS_F32);
}

static int outputs_untouched(void) {
    return kt_is_poison(o_loss, 3, KDLOSS_F32) && kt_is_poison(o_dxs, BT * HS, KDLOSS_F32) &&
           kt_is_poison(o_dws, V * HS, KDLOSS_F32) && kt_is_poison(o_dbs, V, KDLOSS_F32);
}

/* Fills *cp with a valid call (pprm and pout point into *cp itself). */
static void valid_call(call *cp) {
    call c;
    memset(&c, 0, sizeof(c));
    kdloss_fljsd_params_default(&c.prm);
    c.bt = BT;
    c.hs = HS;
    c.ht = HT;
    c.v = V;
    c.xs = (kdloss_cmat){prob.pxs, KDLOSS_F32, 0};
    c.ws = (kdloss_cmat){prob.pws, KDLOSS_F32, 0};
    c.xt = (kdloss_cmat){prob.pxt, KDLOSS_F32, 0};
    c.wt = (kdloss_cmat){prob.pwt, KDLOSS_F32, 0};
    c.bs = prob.pbias_s;
    c.bt_bias = prob.pbias_t;
    c.labels = (kdloss_labels){prob.labels, KDLOSS_I64};
    c.out.loss = &o_loss[0];
    c.out.soft_loss = &o_loss[1];
    c.out.hard_loss = &o_loss[2];
    c.out.dxs = (kdloss_mat){o_dxs, KDLOSS_F32, 0};
    c.out.dws = (kdloss_mat){o_dws, KDLOSS_F32, 0};
    c.out.dbs = o_dbs;
    *cp = c;
    cp->pprm = &cp->prm;
    cp->pout = &cp->out;
}

static kdloss_status run(const call *c) {
    return kdloss_fused_linear_jsd(c->pprm, c->bt, c->hs, c->ht, c->v, c->xs, c->ws, c->bs, c->xt,
                                   c->wt, c->bt_bias, c->labels, c->pout, c->work, c->work_bytes);
}

/* Runs c expecting `want`, and nothing written. */
static void expect(const char *what, const call *c, kdloss_status want) {
    poison_outputs();
    kdloss_status got = run(c);
    KT_CHECK(got == want, "%s: status %d (%s), want %d (%s)", what, got,
             kdloss_status_string(got), want, kdloss_status_string(want));
    KT_CHECK(outputs_untouched(), "%s: an output was written on error", what);
}

/* A mutation of the valid call, applied in a block with `c` in scope. */
#define CASE(want, ...)                                                                        \
    do {                                                                                       \
        call c;                                                                                \
        valid_call(&c);                                                                        \
        __VA_ARGS__;                                                                           \
        expect(#__VA_ARGS__, &c, want);                                                        \
    } while (0)

static void bad_calls(void) {
    /* the valid call works, and writes */
    {
        call c;
        valid_call(&c);
        poison_outputs();
        KT_CHECK(run(&c) == KDLOSS_OK && !outputs_untouched(), "valid call");
    }
    CASE(KDLOSS_ERR_NULL_POINTER, c.pprm = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.pout = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.xs.data = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.ws.data = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.xt.data = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.wt.data = NULL);
    CASE(KDLOSS_ERR_NULL_POINTER, c.labels.data = NULL);

    CASE(KDLOSS_ERR_INVALID_SIZE, c.bt = 0);
    CASE(KDLOSS_ERR_INVALID_SIZE, c.hs = -1);
    CASE(KDLOSS_ERR_INVALID_SIZE, c.ht = 0);
    CASE(KDLOSS_ERR_INVALID_SIZE, c.v = 0);
    CASE(KDLOSS_ERR_UNSUPPORTED, c.v = (int64_t)INT32_MAX + 1); /* beyond a CBLAS int */

    CASE(KDLOSS_ERR_INVALID_DTYPE, c.ws.dtype = KDLOSS_BF16);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.xt.dtype = KDLOSS_BF16);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.xs.dtype = KDLOSS_F16; c.ws.dtype = KDLOSS_F16);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.xt.dtype = KDLOSS_I32; c.wt.dtype = KDLOSS_I32);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.labels.dtype = KDLOSS_F32);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.out.dxs.dtype = KDLOSS_BF16);
    CASE(KDLOSS_ERR_INVALID_DTYPE, c.out.dws.dtype = KDLOSS_BF16);

    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = 0.0);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = -1.0);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = NAN);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = INFINITY);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = 1e-300); /* 1/T not an fp32 */
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.beta = -0.01);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.beta = 1.01);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.beta = NAN);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.weight_hard_loss = -0.5);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.weight_soft_loss = NAN);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.weight_soft_loss = INFINITY);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.chunk_size = -1);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.grad_scale = NAN);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.grad_scale = -INFINITY);

    CASE(KDLOSS_ERR_INVALID_STRIDE, c.xs.ld = HS - 1);
    CASE(KDLOSS_ERR_INVALID_STRIDE, c.wt.ld = -3);
    CASE(KDLOSS_ERR_INVALID_STRIDE, c.out.dws.ld = HS - 1);

    /* labels: out of range anywhere, the last row included, nothing written before */
    int64_t lab[BT];
    int32_t lab32[BT];
    memcpy(lab, prob.labels, sizeof(lab));
    lab[BT - 1] = V;
    CASE(KDLOSS_ERR_LABEL_OUT_OF_RANGE, c.labels.data = lab);
    lab[BT - 1] = -5;
    CASE(KDLOSS_ERR_LABEL_OUT_OF_RANGE, c.labels.data = lab);
    for (int i = 0; i < BT; i++) lab32[i] = (int32_t)prob.labels[i];
    lab32[0] = V + 7;
    CASE(KDLOSS_ERR_LABEL_OUT_OF_RANGE, c.labels = ((kdloss_labels){lab32, KDLOSS_I32}));
    lab[BT - 1] = -100; /* = ignore_index: fine, unless ignore_index changes */
    CASE(KDLOSS_ERR_LABEL_OUT_OF_RANGE, c.labels.data = lab; c.prm.ignore_index = -1);

    /* aliasing: outputs over inputs, over each other, and the workspace over either */
    float xs_copy[BT * HS];
    memcpy(xs_copy, prob.pxs, sizeof(xs_copy));
    CASE(KDLOSS_ERR_ALIASING, c.out.dxs.data = (void *)prob.pxs);
    CASE(KDLOSS_ERR_ALIASING, c.out.dws.data = (float *)prob.pws + 2);
    CASE(KDLOSS_ERR_ALIASING, c.out.dbs = (void *)prob.pbias_s);
    CASE(KDLOSS_ERR_ALIASING, c.out.loss = (float *)prob.pwt + 3);
    CASE(KDLOSS_ERR_ALIASING, c.out.soft_loss = c.out.loss);
    CASE(KDLOSS_ERR_ALIASING, c.out.hard_loss = &o_dxs[4]);
    CASE(KDLOSS_ERR_ALIASING, c.out.dbs = &o_dws[V * HS - 3]);
    CASE(KDLOSS_ERR_ALIASING, c.out.loss = (float *)(void *)prob.labels);
    CASE(KDLOSS_ERR_ALIASING, c.work = o_dxs; c.work_bytes = sizeof(o_work));
    CASE(KDLOSS_ERR_ALIASING, c.xs.data = xs_copy; c.work = xs_copy; c.work_bytes = 1 << 20);
    KT_CHECK(!memcmp(xs_copy, prob.pxs, sizeof(xs_copy)), "aliased input was written");

    CASE(KDLOSS_ERR_SHAPE_MISMATCH, c.bs = NULL);

    CASE(KDLOSS_ERR_NO_OUTPUT, memset(&c.out, 0, sizeof(c.out)));

    size_t need = 0;
    {
        call c;
        valid_call(&c);
        KT_CHECK(kdloss_fljsd_workspace_size(&c.prm, BT, HS, HT, V, KDLOSS_F32, 1, &need) ==
                     KDLOSS_OK && need > 0 && need <= sizeof(o_work),
                 "workspace size %zu", need);
    }
    CASE(KDLOSS_ERR_WORKSPACE_TOO_SMALL, c.work = o_work; c.work_bytes = need - 1);
    {
        call c;
        valid_call(&c);
        c.work = o_work;
        c.work_bytes = need;
        poison_outputs();
        KT_CHECK(run(&c) == KDLOSS_OK, "exact workspace accepted");
    }
}

/* Too much working space to allocate: KDLOSS_ERR_OUT_OF_MEMORY before anything is read or
 * written. The inputs are declared huge but never touched (the allocation comes first), so
 * small dummies stand in for them. Skipped under AddressSanitizer, which aborts on such a
 * request instead of returning NULL. */
static void out_of_memory(void) {
#if defined(__SANITIZE_ADDRESS__)
    printf("out-of-memory case skipped under AddressSanitizer\n");
#else
    const int64_t bt = 1 << 22, v = 1 << 24; /* one chunk of bt x v fp32 logits: 256 TiB */
    int32_t *labels = calloc((size_t)bt, sizeof(int32_t));
    float *dummy = calloc(4, sizeof(float)); /* on the heap: its declared spans stay far from
                                                the output on the stack */
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    prm.chunk_size = bt;
    kdloss_fljsd_out out;
    memset(&out, 0, sizeof(out));
    float loss;
    kt_poison(&loss, 1, KDLOSS_F32);
    out.loss = &loss;
    kdloss_cmat m = {dummy, KDLOSS_F32, 0};
    kdloss_status st = kdloss_fused_linear_jsd(&prm, bt, 1, 1, v, m, m, NULL, m, m, NULL,
                                               (kdloss_labels){labels, KDLOSS_I32}, &out, NULL, 0);
    KT_CHECK(st == KDLOSS_ERR_OUT_OF_MEMORY && kt_is_poison(&loss, 1, KDLOSS_F32),
             "out of memory: status %d (%s)", st, kdloss_status_string(st));
    free(labels);
    free(dummy);
#endif
}

static void workspace_size_args(void) {
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    size_t b = 0;
    KT_CHECK(kdloss_fljsd_workspace_size(NULL, 4, 4, 4, 4, KDLOSS_F32, 1, &b) ==
                 KDLOSS_ERR_NULL_POINTER, "size: NULL params");
    KT_CHECK(kdloss_fljsd_workspace_size(&prm, 4, 4, 4, 4, KDLOSS_F32, 1, NULL) ==
                 KDLOSS_ERR_NULL_POINTER, "size: NULL bytes");
    KT_CHECK(kdloss_fljsd_workspace_size(&prm, 0, 4, 4, 4, KDLOSS_F32, 1, &b) ==
                 KDLOSS_ERR_INVALID_SIZE, "size: bt 0");
    KT_CHECK(kdloss_fljsd_workspace_size(&prm, 4, 4, 4, 4, KDLOSS_F16, 1, &b) ==
                 KDLOSS_ERR_INVALID_DTYPE, "size: fp16 student");
    prm.beta = 2.0;
    KT_CHECK(kdloss_fljsd_workspace_size(&prm, 4, 4, 4, 4, KDLOSS_F32, 1, &b) ==
                 KDLOSS_ERR_INVALID_PARAM, "size: beta 2");
    prm.beta = 0.5;
    KT_CHECK(kdloss_fljsd_workspace_size(&prm, INT64_MAX / 2, INT32_MAX, INT32_MAX, INT32_MAX,
                                         KDLOSS_BF16, 1, &b) == KDLOSS_ERR_INVALID_SIZE,
             "size: overflowing byte count");
    /* the automatic chunk respects the budget: more budget, more rows per chunk, more bytes */
    size_t small = 0, big = 0;
    prm.memory_budget = 1 << 20;
    kdloss_fljsd_workspace_size(&prm, 4096, 64, 64, 1000, KDLOSS_F32, 1, &small);
    prm.memory_budget = 64 << 20;
    kdloss_fljsd_workspace_size(&prm, 4096, 64, 64, 1000, KDLOSS_F32, 1, &big);
    KT_CHECK(small > 0 && small <= (1 << 20) + (64 << 10) && big > small && big <= (64u << 20),
             "budget honoured: %zu bytes at 1 MiB, %zu at 64 MiB", small, big);
}

/* The fused-linear losses: scale factors that overflow fp32, a budget that cannot hold one
 * row, misaligned pointers, and the size query's chunk arithmetic at BT near INT64_MAX. */
static void issue12(void) {
    /* T = 3e-39 is subnormal in fp32 (logit gaps / T overflow); w_soft / T = 1e40 and
     * grad_scale w_hard = 5e38 are not fp32: the old code gave NaN gradients for them */
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = 3e-39);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.temperature = 1e-30; c.prm.weight_soft_loss = 1e10);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.grad_scale = 1e39);
    CASE(KDLOSS_ERR_INVALID_PARAM, c.prm.grad_scale = 1e30; c.prm.weight_hard_loss = 1e9);
    {   /* the largest accepted factors give finite gradients */
        call c;
        valid_call(&c);
        c.prm.temperature = 1.2e-38; /* normal */
        c.prm.weight_soft_loss = 1e-3;
        poison_outputs();
        kdloss_status st = run(&c);
        int nan = 0;
        for (int i = 0; i < BT * HS; i++) nan += isnan(o_dxs[i]);
        for (int i = 0; i < V * HS; i++) nan += isnan(o_dws[i]);
        KT_CHECK(st == KDLOSS_OK && !nan, "T 1.2e-38: status %d, %d NaN gradient elements", st, nan);
    }

    /* memory_budget: below the one-row minimum is an error naming how to learn the minimum */
    size_t min = 0, ws = 0;
    {
        call c;
        valid_call(&c);
        KT_CHECK(kdloss_fljsd_min_budget(&c.prm, BT, HS, HT, V, KDLOSS_F32, 1, &min) == KDLOSS_OK &&
                     min > 0, "min budget %zu", min);
        KT_CHECK(strstr(kdloss_status_string(KDLOSS_ERR_BUDGET_TOO_SMALL), "kdloss_fljsd_min_budget") != NULL,
                 "budget message names kdloss_fljsd_min_budget");
        c.prm.memory_budget = 1;
        KT_CHECK(kdloss_fljsd_workspace_size(&c.prm, BT, HS, HT, V, KDLOSS_F32, 1, &ws) ==
                     KDLOSS_ERR_BUDGET_TOO_SMALL && ws == 0, "size query with a 1-byte budget");
        c.prm.memory_budget = min;
        KT_CHECK(kdloss_fljsd_workspace_size(&c.prm, BT, HS, HT, V, KDLOSS_F32, 1, &ws) ==
                     KDLOSS_OK && ws <= min + 16 * KD_ALIGN_SLACK, "min budget %zu: workspace %zu", min, ws);
        poison_outputs();
        KT_CHECK(run(&c) == KDLOSS_OK, "a call at exactly the minimum budget");
    }
    CASE(KDLOSS_ERR_BUDGET_TOO_SMALL, c.prm.memory_budget = 1);
    CASE(KDLOSS_ERR_BUDGET_TOO_SMALL, c.prm.memory_budget = min - 1);
    CASE(KDLOSS_ERR_BUDGET_TOO_SMALL, c.prm.memory_budget = min - 1; c.prm.chunk_size = 1);
    {   /* a big problem: 1 MiB cannot hold one row of V = 2^20 logits */
        kdloss_fljsd_params prm;
        kdloss_fljsd_params_default(&prm);
        prm.memory_budget = 1 << 20;
        size_t b = 0, m = 0;
        KT_CHECK(kdloss_fljsd_workspace_size(&prm, 1000, 64, 64, 1 << 20, KDLOSS_BF16, 1, &b) ==
                     KDLOSS_ERR_BUDGET_TOO_SMALL, "1 MiB budget, V 2^20");
        KT_CHECK(kdloss_fljsd_min_budget(&prm, 1000, 64, 64, 1 << 20, KDLOSS_BF16, 1, &m) ==
                     KDLOSS_OK && m > (8u << 20), "min budget at V 2^20: %zu", m);
        prm.memory_budget = 0; /* the default grows to the minimum instead of failing */
        KT_CHECK(kdloss_fljsd_workspace_size(&prm, 1000, 64, 64, 1 << 20, KDLOSS_BF16, 1, &b) ==
                     KDLOSS_OK, "default budget, V 2^20");
        KT_CHECK(kdloss_fljsd_min_budget(NULL, 1, 1, 1, 1, KDLOSS_F32, 1, &m) == KDLOSS_ERR_NULL_POINTER &&
                     kdloss_fljsd_min_budget(&prm, 0, 1, 1, 1, KDLOSS_F32, 1, &m) == KDLOSS_ERR_INVALID_SIZE,
                 "min budget argument errors");
    }

    /* the size query at BT near INT64_MAX: no signed overflow (UBSan run), a sane answer */
    static const int64_t huge[] = {(int64_t)1 << 62, INT64_MAX, INT64_MAX - 1, INT64_MAX / 3};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 4; k++) {
            kdloss_fljsd_params prm;
            kdloss_fljsd_params_default(&prm);
            size_t m = 0, b = 0;
            kdloss_status st = kdloss_fljsd_min_budget(&prm, huge[i], 11, 9, 2, KDLOSS_BF16, 1, &m);
            KT_CHECK(st == KDLOSS_OK, "min budget at bt %lld: %d", (long long)huge[i], st);
            prm.memory_budget = k == 0 ? m : k == 1 ? m + 17 * 200 : k == 2 ? (size_t)1 << 20 : 0;
            st = kdloss_fljsd_workspace_size(&prm, huge[i], 11, 9, 2, KDLOSS_BF16, 1, &b);
            KT_CHECK(st == KDLOSS_OK && b > 0 && b <= (k == 3 ? (size_t)256 << 20 : prm.memory_budget) + 4096,
                     "size query bt %lld budget %zu: status %d, %zu bytes", (long long)huge[i],
                     prm.memory_budget, st, b);
        }
    }
    {   /* the issue's own example: a 64-byte budget is now an error, not undefined behaviour */
        kdloss_fljsd_params prm;
        kdloss_fljsd_params_default(&prm);
        prm.memory_budget = 64;
        size_t b = 0;
        KT_CHECK(kdloss_fljsd_workspace_size(&prm, (int64_t)1 << 62, 11, 9, 2, KDLOSS_BF16, 1, &b) ==
                     KDLOSS_ERR_BUDGET_TOO_SMALL, "issue example");
    }

    /* misaligned pointers: every operand kind (rejected before anything is read, so the
     * shifted views never reach past their arrays) */
    const char *pxs = prob.pxs, *pws = prob.pws;
    CASE(KDLOSS_ERR_MISALIGNED, c.xs.data = pxs + 2);
    CASE(KDLOSS_ERR_MISALIGNED, c.ws.data = pws + 1);
    CASE(KDLOSS_ERR_MISALIGNED, c.bs = (const char *)prob.pbias_s + 2);
    CASE(KDLOSS_ERR_MISALIGNED, c.bt_bias = (const char *)prob.pbias_t + 1);
    CASE(KDLOSS_ERR_MISALIGNED, c.out.dxs.data = (char *)o_dxs + 2);
    CASE(KDLOSS_ERR_MISALIGNED, c.out.loss = (float *)(void *)((char *)o_loss + 1));
    CASE(KDLOSS_ERR_MISALIGNED, c.out.dbs = (char *)o_dbs + 2);
    CASE(KDLOSS_ERR_MISALIGNED, c.labels.data = (const char *)prob.labels + 4);
}

static void defaults(void) {
    kdloss_fljsd_params p;
    memset(&p, 0xff, sizeof(p));
    kdloss_fljsd_params_default(&p);
    KT_CHECK(p.beta == 0.5 && p.temperature == 1.0 && p.weight_hard_loss == 0.5 &&
                 p.weight_soft_loss == 0.5 && p.ignore_index == -100 && p.chunk_size == 0 &&
                 p.memory_budget == 0 && p.grad_scale == 1.0,
             "defaults");
    kdloss_fljsd_params_default(NULL); /* harmless */
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    kt_fld_problem_make(&prob, &rng, BT, HS, HT, V, KDLOSS_F32, KDLOSS_F32, 1, 3.0, 4, -100, 0);
    bad_calls();
    out_of_memory();
    workspace_size_args();
    issue12();
    defaults();
    kt_fld_problem_free(&prob);
    return kt_finish("test_fld_args");
}
