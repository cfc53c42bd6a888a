/* Bad input: every error code of the elementwise losses is returned, and every output is left
 * exactly as it was (outputs are poisoned first and checked byte for byte afterwards). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/wait.h>

#include "testutil.h"

enum { BT = 6, V = 10 };

static float x[BT * V], t[BT * V], g[BT * V], rows[BT], elem[BT * V], loss;
static int64_t labels[BT];

static void poison_outputs(void) {
    kt_poison(g, BT * V, KDLOSS_F32);
    kt_poison(rows, BT, KDLOSS_F32);
    kt_poison(elem, BT * V, KDLOSS_F32);
    kt_poison(&loss, 1, KDLOSS_F32);
}

static int outputs_untouched(void) {
    return kt_is_poison(g, BT * V, KDLOSS_F32) && kt_is_poison(rows, BT, KDLOSS_F32) &&
           kt_is_poison(elem, BT * V, KDLOSS_F32) && kt_is_poison(&loss, 1, KDLOSS_F32);
}

static const kdloss_mat NOMAT = {NULL, KDLOSS_F32, 0};

/* One KL call expected to fail with `want`. */
static void kl_expect(const char *what, kdloss_status want, const kdloss_kl_params *p, int64_t bt,
                      int64_t v, kdloss_cmat in, kdloss_cmat tg, float *l, float *r, kdloss_mat em,
                      kdloss_mat gm) {
    poison_outputs();
    kdloss_status st = kdloss_kl_div(p, bt, v, in, tg, l, r, em, gm);
    KT_CHECK(st == want, "kl %s: got %d (%s), want %d (%s)", what, st, kdloss_status_string(st), want,
             kdloss_status_string(want));
    KT_CHECK(outputs_untouched(), "kl %s: an output was written", what);
}

static void jsd_expect(const char *what, kdloss_status want, const kdloss_jsd_params *p, int64_t bt,
                       int64_t v, kdloss_cmat s, kdloss_cmat te, kdloss_labels lab, float *l,
                       float *r, kdloss_mat gm) {
    poison_outputs();
    kdloss_status st = kdloss_jsd(p, bt, v, s, te, lab, l, r, gm);
    KT_CHECK(st == want, "jsd %s: got %d (%s), want %d (%s)", what, st, kdloss_status_string(st),
             want, kdloss_status_string(want));
    KT_CHECK(outputs_untouched(), "jsd %s: an output was written", what);
}

static void kl_errors(void) {
    kdloss_kl_params p, q;
    kdloss_kl_params_default(&p);
    kdloss_cmat in = {x, KDLOSS_F32, 0}, tg = {t, KDLOSS_F32, 0};
    kdloss_mat gm = {g, KDLOSS_F32, 0}, em = {elem, KDLOSS_F32, 0};
    kl_expect("params NULL", KDLOSS_ERR_NULL_POINTER, NULL, BT, V, in, tg, &loss, rows, NOMAT, gm);
    kl_expect("input NULL", KDLOSS_ERR_NULL_POINTER, &p, BT, V, (kdloss_cmat){NULL, KDLOSS_F32, 0}, tg, &loss, rows, NOMAT, gm);
    kl_expect("target NULL", KDLOSS_ERR_NULL_POINTER, &p, BT, V, in, (kdloss_cmat){NULL, KDLOSS_F32, 0}, &loss, rows, NOMAT, gm);
    kl_expect("bt 0", KDLOSS_ERR_INVALID_SIZE, &p, 0, V, in, tg, &loss, rows, NOMAT, gm);
    kl_expect("v negative", KDLOSS_ERR_INVALID_SIZE, &p, BT, -3, in, tg, &loss, rows, NOMAT, gm);
    kl_expect("bt huge", KDLOSS_ERR_INVALID_SIZE, &p, INT64_MAX / 2, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.reduction = (kdloss_reduction)7;
    kl_expect("reduction 7", KDLOSS_ERR_INVALID_REDUCTION, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.reduction = (kdloss_reduction)-1;
    kl_expect("reduction -1", KDLOSS_ERR_INVALID_REDUCTION, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.log_target = 2;
    kl_expect("log_target 2", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.eps = -1e-10;
    kl_expect("eps negative", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.eps = NAN;
    kl_expect("eps NaN", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.grad_scale = INFINITY;
    kl_expect("grad_scale inf", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.reduction = KDLOSS_REDUCTION_NONE;
    kl_expect("scalar loss with none", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, em, gm);
    kl_expect("elem loss without none", KDLOSS_ERR_INVALID_PARAM, &p, BT, V, in, tg, &loss, rows, em, gm);
    kl_expect("elem loss bf16", KDLOSS_ERR_INVALID_DTYPE, &q, BT, V, in, tg, NULL, rows,
              (kdloss_mat){elem, KDLOSS_BF16, 0}, gm);
    kl_expect("input dtype int32", KDLOSS_ERR_INVALID_DTYPE, &p, BT, V, (kdloss_cmat){x, KDLOSS_I32, 0}, tg, &loss, rows, NOMAT, gm);
    kl_expect("target dtype 99", KDLOSS_ERR_INVALID_DTYPE, &p, BT, V, in, (kdloss_cmat){t, (kdloss_dtype)99, 0}, &loss, rows, NOMAT, gm);
    kl_expect("grad dtype differs from input", KDLOSS_ERR_INVALID_DTYPE, &p, BT, V, in, tg, &loss, rows, NOMAT,
              (kdloss_mat){g, KDLOSS_BF16, 0});
    kl_expect("input ld < V", KDLOSS_ERR_INVALID_STRIDE, &p, BT, V, (kdloss_cmat){x, KDLOSS_F32, V - 1}, tg, &loss, rows, NOMAT, gm);
    kl_expect("target ld negative", KDLOSS_ERR_INVALID_STRIDE, &p, BT, V, in, (kdloss_cmat){t, KDLOSS_F32, -V}, &loss, rows, NOMAT, gm);
    kl_expect("grad ld < V", KDLOSS_ERR_INVALID_STRIDE, &p, BT, V, in, tg, &loss, rows, NOMAT, (kdloss_mat){g, KDLOSS_F32, 3});
    kl_expect("no output", KDLOSS_ERR_NO_OUTPUT, &p, BT, V, in, tg, NULL, NULL, NOMAT, NOMAT);
    /* aliasing: gradient over the target; gradient shifted by one element over the input;
     * row loss inside the gradient; loss inside the row loss */
    kl_expect("grad over target", KDLOSS_ERR_ALIASING, &p, BT, V, (kdloss_cmat){g, KDLOSS_F32, 0}, tg, &loss, rows, NOMAT,
              (kdloss_mat){(void *)t, KDLOSS_F32, 0});
    kl_expect("grad shifted over input", KDLOSS_ERR_ALIASING, &p, BT - 1, V, (kdloss_cmat){g, KDLOSS_F32, 0}, tg, &loss,
              rows, NOMAT, (kdloss_mat){g + 1, KDLOSS_F32, 0});
    kl_expect("grad in place but other ld", KDLOSS_ERR_ALIASING, &p, BT / 2, V, (kdloss_cmat){g, KDLOSS_F32, V}, tg,
              &loss, rows, NOMAT, (kdloss_mat){g, KDLOSS_F32, 2 * V});
    kl_expect("row_loss inside grad", KDLOSS_ERR_ALIASING, &p, BT, V, in, tg, &loss, g + 5, NOMAT, gm);
    kl_expect("loss inside row_loss", KDLOSS_ERR_ALIASING, &p, BT, V, in, tg, rows + 2, rows, NOMAT, gm);
    kl_expect("row_loss inside input", KDLOSS_ERR_ALIASING, &p, BT, V, in, tg, &loss, x + 3, NOMAT, NOMAT);
}

static void jsd_errors(void) {
    kdloss_jsd_params p, q;
    kdloss_jsd_params_default(&p);
    kdloss_cmat s = {x, KDLOSS_F32, 0}, te = {t, KDLOSS_F32, 0};
    kdloss_mat gm = {g, KDLOSS_F32, 0};
    kdloss_labels lab = {labels, KDLOSS_I64}, nol = {NULL, KDLOSS_I64};
    for (int r = 0; r < BT; r++) labels[r] = r % 2 ? -100 : r;
    jsd_expect("params NULL", KDLOSS_ERR_NULL_POINTER, NULL, BT, V, s, te, lab, &loss, rows, gm);
    jsd_expect("student NULL", KDLOSS_ERR_NULL_POINTER, &p, BT, V, (kdloss_cmat){NULL, KDLOSS_F32, 0}, te, lab, &loss, rows, gm);
    jsd_expect("v 0", KDLOSS_ERR_INVALID_SIZE, &p, BT, 0, s, te, lab, &loss, rows, gm);
    q = p, q.beta = -0.1;
    jsd_expect("beta -0.1", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, s, te, lab, &loss, rows, gm);
    q = p, q.beta = 1.5;
    jsd_expect("beta 1.5", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, s, te, lab, &loss, rows, gm);
    q = p, q.beta = NAN;
    jsd_expect("beta NaN", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, s, te, lab, &loss, rows, gm);
    q = p, q.grad_scale = NAN;
    jsd_expect("grad_scale NaN", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, s, te, lab, &loss, rows, gm);
    jsd_expect("teacher fp16 ld < V", KDLOSS_ERR_INVALID_STRIDE, &p, BT, V, s, (kdloss_cmat){t, KDLOSS_F16, 2}, lab, &loss, rows, gm);
    jsd_expect("labels float", KDLOSS_ERR_INVALID_DTYPE, &p, BT, V, s, te, (kdloss_labels){labels, KDLOSS_F32}, &loss, rows, gm);
    labels[3] = V;
    jsd_expect("label == V", KDLOSS_ERR_LABEL_OUT_OF_RANGE, &p, BT, V, s, te, lab, &loss, rows, gm);
    labels[3] = -2;
    jsd_expect("label -2", KDLOSS_ERR_LABEL_OUT_OF_RANGE, &p, BT, V, s, te, lab, &loss, rows, gm);
    labels[3] = 3;
    int32_t l32[BT] = {0, 1, 2, -100, 4, 1 << 30};
    jsd_expect("int32 label 2^30", KDLOSS_ERR_LABEL_OUT_OF_RANGE, &p, BT, V, s, te, (kdloss_labels){l32, KDLOSS_I32}, &loss, rows, gm);
    jsd_expect("no output", KDLOSS_ERR_NO_OUTPUT, &p, BT, V, s, te, lab, NULL, NULL, NOMAT);
    jsd_expect("grad over teacher", KDLOSS_ERR_ALIASING, &p, BT, V, (kdloss_cmat){g, KDLOSS_F32, 0}, te, nol, &loss, rows,
               (kdloss_mat){(void *)t, KDLOSS_F32, 0});
    jsd_expect("row_loss over labels", KDLOSS_ERR_ALIASING, &p, BT, V, s, te, lab, &loss, (float *)labels, gm);
    jsd_expect("grad dtype differs", KDLOSS_ERR_INVALID_DTYPE, &p, BT, V, s, te, lab, &loss, rows, (kdloss_mat){g, KDLOSS_F16, 0});
}

/* Parameters that do not survive the fp32 cast the kernels make (eps 1e39 became inf
 * on the scalar path and a wrong finite value on AVX; grad_scale 1e39 gave inf * 0 = NaN
 * gradients where the true value is 0), and misaligned element pointers (undefined behaviour
 * in the row kernels): errors now, nothing written. */
static void issue12_errors(void) {
    kdloss_kl_params p, q;
    kdloss_kl_params_default(&p);
    kdloss_jsd_params jp, jq;
    kdloss_jsd_params_default(&jp);
    kdloss_cmat in = {x, KDLOSS_F32, 0}, tg = {t, KDLOSS_F32, 0};
    kdloss_mat gm = {g, KDLOSS_F32, 0};
    kdloss_labels nol = {NULL, KDLOSS_I64};
    q = p, q.eps = 1e39;
    kl_expect("eps 1e39 (inf in fp32)", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.eps = 3.4028236e38; /* above FLT_MAX + half an ulp: rounds to inf */
    kl_expect("eps just above FLT_MAX", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.grad_scale = 1e39, q.reduction = KDLOSS_REDUCTION_SUM;
    kl_expect("grad_scale 1e39", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    q = p, q.grad_scale = -1e39, q.reduction = KDLOSS_REDUCTION_MEAN;
    kl_expect("grad_scale -1e39 mean", KDLOSS_ERR_INVALID_PARAM, &q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    jq = jp, jq.grad_scale = 1e39;
    jsd_expect("grad_scale 1e39", KDLOSS_ERR_INVALID_PARAM, &jq, BT, V, in, tg, nol, &loss, rows, gm);
    /* the largest accepted values still give finite results where the math is finite */
    q = p, q.eps = 3.4028234e38, q.reduction = KDLOSS_REDUCTION_SUM, q.grad_scale = 3.0e38;
    poison_outputs();
    kdloss_status st = kdloss_kl_div(&q, BT, V, in, tg, &loss, rows, NOMAT, gm);
    KT_CHECK(st == KDLOSS_OK && !isnan(loss) && !isnan(g[0]), "kl eps FLT_MAX: %d, loss %g", st, loss);

    /* misaligned element pointers: rejected, for every operand kind */
    const char *xb = (const char *)x, *tb = (const char *)t;
    char *gb = (char *)g;
    kdloss_cmat mis_in = {xb + 2, KDLOSS_F32, 0}, mis_t16 = {tb + 1, KDLOSS_BF16, 0};
    kl_expect("input fp32 at +2 bytes", KDLOSS_ERR_MISALIGNED, &p, BT, V - 1, mis_in, tg, &loss, rows, NOMAT, NOMAT);
    kl_expect("target bf16 at +1 byte", KDLOSS_ERR_MISALIGNED, &p, BT, V - 1, in, mis_t16, &loss, rows, NOMAT, NOMAT);
    kl_expect("grad fp16 at +1 byte", KDLOSS_ERR_MISALIGNED, &p, BT, V - 1, (kdloss_cmat){x, KDLOSS_F16, 0}, tg, NULL, rows, NOMAT,
              (kdloss_mat){gb + 1, KDLOSS_F16, 0});
    kl_expect("loss at +1 byte", KDLOSS_ERR_MISALIGNED, &p, BT, V, in, tg, (float *)(void *)((char *)rows + 1), NULL, NOMAT, NOMAT);
    jsd_expect("student fp32 at +1", KDLOSS_ERR_MISALIGNED, &jp, BT, V - 1, (kdloss_cmat){xb + 1, KDLOSS_F32, 0}, tg, nol, &loss, rows, NOMAT);
    jsd_expect("row_loss at +2", KDLOSS_ERR_MISALIGNED, &jp, BT, V, in, tg, nol, NULL, (float *)(void *)((char *)elem + 2), NOMAT);
    for (int r = 0; r < BT; r++) labels[r] = r;
    jsd_expect("int64 labels at +4", KDLOSS_ERR_MISALIGNED, &jp, BT - 1, V, in, tg,
               (kdloss_labels){(const char *)labels + 4, KDLOSS_I64}, &loss, rows, NOMAT);
    jsd_expect("int32 labels at +2", KDLOSS_ERR_MISALIGNED, &jp, BT - 1, V, in, tg,
               (kdloss_labels){(const char *)labels + 2, KDLOSS_I32}, &loss, rows, NOMAT);
    /* 2-byte dtypes at 2-byte (not 4-byte) alignment are fine */
    poison_outputs();
    st = kdloss_jsd(&jp, BT, V - 1, (kdloss_cmat){xb + 2, KDLOSS_BF16, 0}, (kdloss_cmat){tb + 2, KDLOSS_F16, 0}, nol, &loss, NULL,
                    (kdloss_mat){gb + 2, KDLOSS_BF16, 0});
    KT_CHECK(st == KDLOSS_OK, "bf16 at 2-byte alignment: %d", st);
}

static void misc(void) {
    /* every status has its own message; unknown codes get one too */
    const char *seen[32] = {0};
    for (int c = 0; c >= KDLOSS_ERR_MISALIGNED; c--) {
        const char *m = kdloss_status_string((kdloss_status)c);
        KT_CHECK(m && *m && strcmp(m, "unknown status code"), "status %d has no message", c);
        for (int d = 0; d < -c; d++) KT_CHECK(strcmp(seen[d], m) != 0, "status %d repeats a message", c);
        seen[-c] = m;
    }
    KT_CHECK(!strcmp(kdloss_status_string((kdloss_status)-99), "unknown status code"), "unknown code");
    KT_CHECK(kdloss_cpu_set_isa((kdloss_cpu_isa)9) == KDLOSS_ERR_INVALID_PARAM, "set_isa(9)");
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++) {
        kdloss_status st = kdloss_cpu_set_isa((kdloss_cpu_isa)i);
        KT_CHECK(st == (kdloss_cpu_isa_supported((kdloss_cpu_isa)i) ? KDLOSS_OK : KDLOSS_ERR_UNSUPPORTED),
                 "set_isa(%d) gave %d", i, st);
        if (st == KDLOSS_OK) KT_CHECK(kdloss_cpu_get_isa() == (kdloss_cpu_isa)i, "get_isa after set %d", i);
    }
    KT_CHECK(kdloss_cpu_set_isa(KDLOSS_ISA_AUTO) == KDLOSS_OK, "set_isa(auto)");
    KT_CHECK(kdloss_cpu_get_isa() != KDLOSS_ISA_AUTO, "get_isa never returns auto");
    KT_CHECK(kdloss_dtype_size((kdloss_dtype)42) == 0, "unknown dtype size");
    KT_CHECK(kdloss_dtype_size(KDLOSS_BF16) == 2 && kdloss_dtype_size(KDLOSS_I64) == 8, "dtype sizes");
    KT_CHECK(!strcmp(kdloss_dtype_name(KDLOSS_BF16), "bf16") &&
                 !strcmp(kdloss_dtype_name(KDLOSS_I32), "int32") &&
                 !strcmp(kdloss_dtype_name((kdloss_dtype)42), "unknown"), "dtype names");
    /* the defaults are PyTorch's / Liger's */
    kdloss_kl_params kp;
    kdloss_kl_params_default(&kp);
    KT_CHECK(kp.reduction == KDLOSS_REDUCTION_MEAN && kp.log_target == 0 && kp.eps == 1e-10 &&
                 kp.grad_scale == 1.0, "kl defaults");
    kdloss_jsd_params jp;
    kdloss_jsd_params_default(&jp);
    KT_CHECK(jp.beta == 0.5 && jp.ignore_index == -100 && jp.grad_scale == 1.0, "jsd defaults");
    kdloss_kl_params_default(NULL);
    kdloss_jsd_params_default(NULL);
    /* without a CUDA build (or GPU), the CUDA entry points say so and never crash */
    if (!kdloss_cuda_available()) {
        kdloss_cuda_context *ctx = (kdloss_cuda_context *)&jp;
        KT_CHECK(kdloss_cuda_context_create(0, &ctx) != KDLOSS_OK, "cuda context without a device");
    }
}

/* kdloss_error_detail names the failing argument, row and value: `want` must appear
 * in it after a call that failed with `st_want`. */
static void detail_is(const char *what, kdloss_status st, kdloss_status st_want, const char *want) {
    const char *d = kdloss_error_detail();
    KT_CHECK(st == st_want && d && strstr(d, want), "%s: status %d (want %d), detail \"%s\" lacks \"%s\"",
             what, st, st_want, d ? d : "(null)", want);
}

static void details(void) {
    float lz = 7.0f;
    kdloss_labels lab = {labels, KDLOSS_I64};
    kdloss_distill_params dp;
    kdloss_distill_params_default(&dp);
    kdloss_cmat a = {x, KDLOSS_F32, 0}, b = {t, KDLOSS_F32, 0};
    for (int i = 0; i < BT; i++) labels[i] = i;
    labels[4] = 4000;
    detail_is("label out of range", kdloss_distill(&dp, BT, V, a, b, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_LABEL_OUT_OF_RANGE, "labels[4] = 4000 is neither ignore_index (-100) nor in [0, 10)");
    labels[4] = 4;
    dp.div.alpha = 2.5;
    detail_is("alpha", kdloss_distill(&dp, BT, V, a, b, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_INVALID_PARAM, "alpha 2.5");
    kdloss_distill_params_default(&dp);
    kdloss_cmat bad_ld = {t, KDLOSS_F32, 3};
    detail_is("teacher ld", kdloss_distill(&dp, BT, V, a, bad_ld, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_INVALID_STRIDE, "teacher: ld 3 below its row length 10");
    kdloss_cmat i32 = {t, KDLOSS_I32, 0};
    detail_is("student dtype", kdloss_distill(&dp, BT, V, i32, b, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_INVALID_DTYPE, "student: dtype int32");
    /* the fused loss: operand names, dtype pairs, the workspace */
    enum { H = 4 };
    static float xs[BT * H], ws[V * H], xt[BT * H], wt[V * H], dxs[BT * H];
    static uint16_t wt16[V * H];
    kdloss_fused_linear_distill_params fp;
    kdloss_fused_linear_distill_params_default(&fp);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &lz;
    kdloss_cmat cxs = {xs, KDLOSS_F32, 0}, cws = {ws, KDLOSS_F32, 0}, cxt = {xt, KDLOSS_F32, 0};
    kdloss_cmat cwt16 = {wt16, KDLOSS_BF16, 0}, cwt = {wt, KDLOSS_F32, 0};
    detail_is("teacher pair", kdloss_fused_linear_distill(&fp, BT, H, H, V, cxs, cws, NULL, cxt, cwt16,
                                                          NULL, lab, &o, NULL, 0),
              KDLOSS_ERR_INVALID_DTYPE, "teacher_input is fp32 and teacher_weight bf16");
    fp.temperature = -1.0;
    detail_is("temperature", kdloss_fused_linear_distill(&fp, BT, H, H, V, cxs, cws, NULL, cxt, cwt,
                                                         NULL, lab, &o, NULL, 0),
              KDLOSS_ERR_INVALID_PARAM, "temperature = -1");
    kdloss_fused_linear_distill_params_default(&fp);
    o.dxs = (kdloss_mat){dxs, KDLOSS_BF16, 0};
    detail_is("dxs dtype", kdloss_fused_linear_distill(&fp, BT, H, H, V, cxs, cws, NULL, cxt, cwt,
                                                       NULL, lab, &o, NULL, 0),
              KDLOSS_ERR_INVALID_DTYPE, "dxs: dtype bf16, expected fp32");
    o.dxs = (kdloss_mat){NULL, KDLOSS_F32, 0};
    static char ws_small[64];
    detail_is("workspace", kdloss_fused_linear_distill(&fp, BT, H, H, V, cxs, cws, NULL, cxt, cwt,
                                                       NULL, lab, &o, ws_small, sizeof ws_small),
              KDLOSS_ERR_WORKSPACE_TOO_SMALL, "workspace of 64 bytes");
    /* a sparse teacher: a repeated id names its row and slot */
    static int64_t ids[BT * 2];
    static float lp[BT * 2];
    for (int i = 0; i < BT * 2; i++) ids[i] = i % V, lp[i] = -3.0f;
    ids[2 * 3 + 1] = ids[2 * 3];
    kdloss_topk_distill_params tp;
    kdloss_topk_distill_params_default(&tp);
    kdloss_topk_teacher te = {2, {ids, KDLOSS_I64, 0}, {lp, KDLOSS_F32, 0}};
    detail_is("repeated id", kdloss_topk_distill_logits(&tp, BT, V, a, te, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_INVALID_ID, "teacher ids[3][1]");
    tp.div.divergence = KDLOSS_DIV_JSD;
    tp.tail = KDLOSS_TAIL_RENORM_TEACHER;
    detail_is("renorm_teacher", kdloss_topk_distill_logits(&tp, BT, V, a, te, lab, &lz, NULL, NOMAT),
              KDLOSS_ERR_INVALID_PARAM, "renorm_teacher takes forward_kl only, not jsd");
    KT_CHECK(lz == 7.0f, "a failing call wrote the loss");
    /* the detail is per thread: another thread's failure does not change this one's */
    const char *mine = kdloss_error_detail();
    char copy[400];
    snprintf(copy, sizeof copy, "%s", mine);
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) {
            kdloss_distill_params q;
            kdloss_distill_params_default(&q);
            q.div.beta = -1;
            kdloss_distill(&q, BT, V, a, b, lab, NULL, NULL, NOMAT);
        }
    }
    KT_CHECK(!strcmp(kdloss_error_detail(), copy), "another thread's failure changed this one's detail");
}

/* The path a fresh process takes with KDLOSS_CPU_ISA=env (NULL: unset): this program run again
 * as "--isa-child", which exits with kdloss_cpu_get_isa(); -1 if it could not run. posix_spawn,
 * not fork: LLVM's libomp can hang in its own fork handler in a process that ran OpenMP. */
extern char **environ;
static int isa_in_child(const char *env) {
    char *envp[256], var[128];
    int n = 0;
    for (char **e = environ; *e && n < 254; e++)
        if (strncmp(*e, "KDLOSS_CPU_ISA=", 15)) envp[n++] = *e;
    if (env) {
        snprintf(var, sizeof var, "KDLOSS_CPU_ISA=%s", env);
        envp[n++] = var;
    }
    envp[n] = NULL;
    char *argv[] = {"test_errors", "--isa-child", NULL};
    pid_t pid;
    int ws = 0;
    fflush(stdout);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp) != 0) return -1;
    if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws)) return -1;
    return WEXITSTATUS(ws);
}

/* The ISA registry as the API shows it: every path in [SCALAR, KDLOSS_ISA_COUNT) has its own
 * name, and KDLOSS_CPU_ISA=<that name> makes a fresh process take it where the CPU has it (and
 * the automatic choice where not); COUNT and beyond, or a name of no path, are refused. */
static void isa_registry(void) {
    int best = isa_in_child(NULL);
    KT_CHECK(best >= KDLOSS_ISA_SCALAR && best < KDLOSS_ISA_COUNT, "automatic choice %d", best);
    KT_CHECK(isa_in_child("avx3") == best && isa_in_child("") == best, "unknown KDLOSS_CPU_ISA");
    KT_CHECK(isa_in_child("auto") == best, "KDLOSS_CPU_ISA=auto");
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++) {
        const char *nm = kdloss_cpu_isa_name((kdloss_cpu_isa)i);
        KT_CHECK(strcmp(nm, "unknown") && strcmp(nm, "auto"), "path %d has no name", i);
        for (int j = KDLOSS_ISA_SCALAR; j < i; j++)
            KT_CHECK(strcmp(nm, kdloss_cpu_isa_name((kdloss_cpu_isa)j)), "paths %d, %d: one name",
                     j, i);
        int sup = kdloss_cpu_isa_supported((kdloss_cpu_isa)i), got = isa_in_child(nm);
        KT_CHECK(got == (sup ? i : best), "KDLOSS_CPU_ISA=%s gave path %d", nm, got);
    }
    KT_CHECK(kdloss_cpu_isa_supported(KDLOSS_ISA_SCALAR), "scalar is always supported");
    KT_CHECK(!kdloss_cpu_isa_supported(KDLOSS_ISA_COUNT), "supported(COUNT)");
    KT_CHECK(!strcmp(kdloss_cpu_isa_name(KDLOSS_ISA_COUNT), "unknown"), "name(COUNT)");
    KT_CHECK(!strcmp(kdloss_cpu_isa_name(KDLOSS_ISA_AUTO), "auto"), "name(AUTO)");
    KT_CHECK(kdloss_cpu_set_isa(KDLOSS_ISA_COUNT) == KDLOSS_ERR_INVALID_PARAM, "set_isa(COUNT)");
    KT_CHECK(kdloss_cpu_set_isa((kdloss_cpu_isa)-1) == KDLOSS_ERR_INVALID_PARAM, "set_isa(-1)");
    KT_CHECK(kdloss_cpu_set_isa(KDLOSS_ISA_AUTO) == KDLOSS_OK && (int)kdloss_cpu_get_isa() == best,
             "set_isa(AUTO) is the automatic choice");
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--isa-child")) return (int)kdloss_cpu_get_isa();
    for (int i = 0; i < BT * V; i++) x[i] = -2.3f, t[i] = 0.1f;
    details();
    kl_errors();
    jsd_errors();
    issue12_errors();
    misc();
    isa_registry();
    return kt_finish("test_errors");
}
