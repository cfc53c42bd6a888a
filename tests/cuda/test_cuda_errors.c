/* The argument checks of every CUDA entry point (tag "errors"): the CPU function's status code
 * for the same arguments (tests/test_errors.c, test_fld_args.c, test_topk.c have the CPU side),
 * in the CPU's order for combined faults, and nothing written. Without a GPU these still run:
 * they return before any CUDA call, so any pointer will do. */
#include "cuda_test.h"


/* All operands of the error cases live at fixed offsets in one arena: device memory with a GPU,
 * host memory without (the checks return before anything touches it). The CPU twin of each
 * case uses a host arena with the same layout, so the aliasing cases mean the same thing. */
#define AR_BYTES ((size_t)48 << 20)
#define AR_IN 0
#define AR_T 4096
#define AR_G 8192
#define AR_E 12288
#define AR_LOSS 16384
#define AR_ROW 16448
#define AR_LAB 16640
#define AR_W1 32768 /* fused-linear weights */
#define AR_W2 65536
#define AR_WS (1u << 20) /* workspace: up to the end of the arena */
#define AR_RW (AR_LAB + 512) /* row_weights (an input: outside the poisoned outputs) */
#define AR_ENT AR_E          /* row_entropy (an output: inside them) */

static char *g_ar;  /* the CUDA calls' arena */
static char *g_har; /* the CPU calls' arena */
static kdloss_cuda_context *g_actx;

static void expect_code(const char *what, kdloss_status got, kdloss_status want, int have_cpu,
                        kdloss_status cpu) {
    KT_CHECK(got == want, "%s: CUDA returned %d, expected %d", what, (int)got, (int)want);
    if (have_cpu)
        KT_CHECK(cpu == got, "%s: CPU returned %d, CUDA %d", what, (int)cpu, (int)got);
}

static int arena_untouched(void) {
    if (!g_gpu) return 1;
    unsigned char buf[AR_ROW + 64 - AR_G];
    d2h(buf, g_ar + AR_G, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != 0xFF) return 0;
    return 1;
}

/* A faulty call: the CUDA entry point's code (outputs poisoned first, untouched after), and the
 * CPU function's (run(c, 1)) when have_cpu. */
typedef kdloss_status (*err_run)(const void *c, int cpu);
static void err_expect(const char *what, err_run run, const void *c, int have_cpu,
                       kdloss_status want) {
    if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
    kdloss_status got = run(c, 0);
    expect_code(what, got, want, have_cpu, have_cpu ? run(c, 1) : KDLOSS_OK);
    KT_CHECK(arena_untouched(), "%s: an output was written on error", what);
}

typedef struct kl_call {
    int null_params, null_ctx;
    kdloss_kl_params p;
    int64_t bt, v;
    kdloss_dtype di, dt, dg, de;
    int64_t ld_in, ld_t, ld_g, ld_e;
    size_t in_off, t_off, g_off, e_off, loss_off; /* loss at AR_LOSS + loss_off */
    int loss, row, elem, grad;
    size_t ws_bytes;
    int ws_null, ws_off;
} kl_call;

static kdloss_status run_kl(const void *arg, int cpu) {
    const kl_call *c = arg;
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat in = {ar + c->in_off, c->di, c->ld_in}, t = {ar + c->t_off, c->dt, c->ld_t};
    kdloss_mat e = {c->elem ? ar + c->e_off : NULL, c->de, c->ld_e};
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, c->ld_g};
    float *loss = c->loss ? (float *)(ar + AR_LOSS + c->loss_off) : NULL, *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    const kdloss_kl_params *p = c->null_params ? NULL : &c->p;
    if (cpu) return kdloss_kl_div(p, c->bt, c->v, in, t, loss, row, e, g);
    return kdloss_cuda_kl_div(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->v, in, t, loss, row,
                              e, g, c->ws_null ? NULL : ar + AR_WS + c->ws_off, c->ws_bytes);
}

static void kl_err(const char *what, const kl_call *c, kdloss_status want, int cpu_too) {
    err_expect(what, run_kl, c, cpu_too && kdloss_kl_div != NULL, want);
}

static void test_errors_kl(void) {
    kl_call b;
    memset(&b, 0, sizeof b);
    b.p.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    b.p.eps = 1e-10;
    b.p.grad_scale = 1.0;
    b.bt = 4;
    b.v = 8;
    b.di = b.dt = b.dg = b.de = KDLOSS_F32;
    b.in_off = AR_IN;
    b.t_off = AR_T;
    b.g_off = AR_G;
    b.e_off = AR_E;
    b.loss = b.row = b.grad = 1;
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "kl ws size");
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(0, 8, &b.ws_bytes) == KDLOSS_ERR_INVALID_SIZE,
             "kl ws size bt=0");
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(4, 8, NULL) == KDLOSS_ERR_NULL_POINTER,
             "kl ws size NULL");
    kl_call c;
    c = b; c.null_params = 1; kl_err("kl NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; kl_err("kl NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.reduction = (kdloss_reduction)9; kl_err("kl bad reduction", &c, KDLOSS_ERR_INVALID_REDUCTION, 1);
    c = b; c.p.eps = -1; kl_err("kl eps < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = INFINITY; kl_err("kl grad_scale inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = 0; kl_err("kl bt 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = -3; kl_err("kl v < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.di = KDLOSS_I32; kl_err("kl int input", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dt = (kdloss_dtype)77; kl_err("kl unknown target dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_t = 5; kl_err("kl ld < v", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.loss = c.row = c.grad = 0; kl_err("kl no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.dg = KDLOSS_BF16; kl_err("kl grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.elem = 1; kl_err("kl elem with batchmean", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.reduction = KDLOSS_REDUCTION_NONE; kl_err("kl loss with none", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.log_target = 2; kl_err("kl log_target 2", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.eps = INFINITY; kl_err("kl eps inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = 0; c.p.reduction = (kdloss_reduction)9; kl_err("kl bt 0 and bad reduction", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.loss = c.row = c.grad = 0; c.ld_t = 5; kl_err("kl no output and bad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.p.reduction = KDLOSS_REDUCTION_NONE; c.loss = 0; c.elem = 1; c.de = KDLOSS_BF16;
    kl_err("kl elem not fp32", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.g_off = AR_T + 16; kl_err("kl grad overlaps target", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN + 4; kl_err("kl grad overlaps input, shifted", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN; c.ld_g = 9; c.ld_in = 8; kl_err("kl in place, other ld", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_null = 1; kl_err("kl NULL workspace", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.ws_bytes -= 1; kl_err("kl workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_off = 4; c.ws_bytes += 64; kl_err("kl workspace misaligned", &c, KDLOSS_ERR_INVALID_PARAM, 0);
    c = b; c.in_off = AR_WS + 64; kl_err("kl workspace overlaps input", &c, KDLOSS_ERR_ALIASING, 0);
    c = b; c.loss_off = 2; kl_err("kl loss misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
}

typedef struct jsd_call {
    int null_params, null_ctx;
    kdloss_jsd_params p;
    int64_t bt, v;
    kdloss_dtype ds, dt, dg, dl;
    int64_t ld_g;
    size_t g_off;
    int labels, loss, row, grad;
    size_t ws_bytes;
    int distill;          /* 1: kdloss_cuda_distill / kdloss_distill with divergence d;
                             2: kdloss_cuda_distill_logits / kdloss_distill_logits, with T */
    kdloss_div_params d;  /* (p.beta unused then) */
    double temperature;   /* distill 2 */
    int ld_s, ws_null, ws_off;
    size_t s_off, lab_off, loss_off; /* the student, labels and loss moved by that many bytes */
    int rw, ent;          /* distill 2: row_weights at AR_RW, row_entropy at AR_ENT */
} jsd_call;

static kdloss_status run_distill_logits(const jsd_call *c, int cpu, kdloss_cmat s, kdloss_cmat t,
                                        kdloss_labels L, float *loss, float *row, kdloss_mat g) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_distill_logits_params pl = {c->d, c->temperature, c->p.ignore_index, c->p.grad_scale,
                                       c->rw ? (const float *)(ar + AR_RW) : NULL,
                                       c->ent ? (float *)(ar + AR_ENT) : NULL};
    const kdloss_distill_logits_params *pp = c->null_params ? NULL : &pl;
    if (cpu) return kdloss_distill_logits(pp, c->bt, c->v, s, t, L, loss, row, g);
    return kdloss_cuda_distill_logits(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt, c->v, s, t,
                                      L, loss, row, g, c->ws_null ? NULL : ar + AR_WS + c->ws_off,
                                      c->ws_bytes);
}

static kdloss_status run_jsd(const void *arg, int cpu) {
    const jsd_call *c = arg;
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat s = {ar + AR_IN + c->s_off, c->ds, c->ld_s}, t = {ar + AR_T, c->dt, 0};
    kdloss_labels L = {c->labels ? ar + AR_LAB + c->lab_off : NULL, c->dl};
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, c->ld_g};
    float *loss = c->loss ? (float *)(ar + AR_LOSS + c->loss_off) : NULL;
    float *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    const kdloss_jsd_params *p = c->null_params ? NULL : &c->p;
    if (c->distill == 2) return run_distill_logits(c, cpu, s, t, L, loss, row, g);
    if (c->distill) {
        kdloss_distill_params pd = {c->d, c->p.ignore_index, c->p.grad_scale};
        const kdloss_distill_params *pp = c->null_params ? NULL : &pd;
        if (cpu) return kdloss_distill(pp, c->bt, c->v, s, t, L, loss, row, g);
        return kdloss_cuda_distill(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt, c->v, s, t, L,
                                   loss, row, g, ar + AR_WS, c->ws_bytes);
    }
    if (cpu) return kdloss_jsd(p, c->bt, c->v, s, t, L, loss, row, g);
    return kdloss_cuda_jsd(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->v, s, t, L, loss, row,
                           g, ar + AR_WS, c->ws_bytes);
}

static void jsd_err(const char *what, const jsd_call *c, kdloss_status want, int cpu_too) {
    int have_cpu = cpu_too && (c->distill == 2   ? kdloss_distill_logits != NULL
                               : c->distill ? kdloss_distill != NULL
                                            : kdloss_jsd != NULL);
    err_expect(what, run_jsd, c, have_cpu, want);
}

/* A valid call of the family `distill` (jsd_call's kinds): 4 x 8 fp32, I64 labels, every output;
 * default divergence (beta 0.5 for kdloss_jsd), T 2 on logits. The workspace size is the case's. */
static jsd_call jsd_base(int distill) {
    jsd_call b;
    memset(&b, 0, sizeof b);
    b.distill = distill;
    kdloss_div_params_default(&b.d);
    b.p.beta = 0.5;
    b.temperature = 2.0;
    b.p.ignore_index = -100;
    b.p.grad_scale = 1.0;
    b.bt = 4;
    b.v = 8;
    b.ds = b.dt = b.dg = KDLOSS_F32;
    b.dl = KDLOSS_I64;
    b.g_off = AR_G;
    b.labels = b.loss = b.row = b.grad = 1;
    return b;
}

static void test_errors_jsd(void) {
    jsd_call b = jsd_base(0);
    KT_CHECK(kdloss_cuda_jsd_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "jsd ws size");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("jsd NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("jsd NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.beta = 1.5; jsd_err("jsd beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.beta = NAN; jsd_err("jsd beta NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = -1; jsd_err("jsd bt < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dt = KDLOSS_I64; jsd_err("jsd int teacher", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("jsd float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("jsd no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.dg = KDLOSS_F16; jsd_err("jsd grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_g = 3; jsd_err("jsd grad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.g_off = AR_LAB - 64; jsd_err("jsd grad overlaps labels", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_T; jsd_err("jsd grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes = 16; jsd_err("jsd workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

typedef struct fl_call {
    int null_params, null_ctx, null_out;
    kdloss_fljsd_params p;
    int64_t bt, hs, ht, v;
    kdloss_dtype dxs, dws, dxt, dwt, dl, ddxs;
    int bias_s, want_dbs, labels, loss, dx;
    size_t dx_off, ws_bytes;
    int distill; /* 1: the kdloss_*fused_linear_distill pair with pd (p unused) */
    kdloss_fused_linear_distill_params pd;
    int row_off; /* distill: row_soft at AR_ROW + row_off (with loss) */
    size_t lab_off; /* labels at AR_LAB + lab_off */
    int rw, ent;    /* distill: row_weights at AR_RW, row_entropy at AR_ENT */
    size_t xs_off;  /* xs at AR_IN + xs_off */
} fl_call;

/* operands: xs @AR_IN, xt @AR_T, ws @AR_W1, wt @AR_W2, student bias just before AR_WS */
static kdloss_status run_fl(const void *arg, int cpu) {
    const fl_call *c = arg;
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat xs = {ar + AR_IN + c->xs_off, c->dxs, 0}, ws = {ar + AR_W1, c->dws, 0};
    kdloss_cmat xt = {ar + AR_T, c->dxt, 0}, wt = {ar + AR_W2, c->dwt, 0};
    kdloss_labels L = {c->labels ? ar + AR_LAB + c->lab_off : NULL, c->dl};
    kdloss_fljsd_out o;
    memset(&o, 0, sizeof o);
    o.loss = c->loss ? (float *)(ar + AR_LOSS) : NULL;
    o.dxs = (kdloss_mat){c->dx ? ar + c->dx_off : NULL, c->ddxs, 0};
    o.dbs = c->want_dbs ? ar + AR_ROW : NULL;
    const void *bs = c->bias_s ? ar + AR_WS - 4096 : NULL;
    const kdloss_fljsd_params *p = c->null_params ? NULL : &c->p;
    kdloss_fljsd_out *op = c->null_out ? NULL : &o;
    if (c->distill) {
        kdloss_fused_linear_distill_out od;
        memset(&od, 0, sizeof od);
        od.loss = o.loss;
        od.dxs = o.dxs;
        od.dbs = o.dbs;
        od.row_soft = c->loss ? (float *)(ar + AR_ROW + c->row_off) : NULL;
        od.row_entropy = c->ent ? (float *)(ar + AR_ENT) : NULL;
        kdloss_fused_linear_distill_params pd = c->pd;
        pd.row_weights = c->rw ? (const float *)(ar + AR_RW) : NULL;
        const kdloss_fused_linear_distill_params *pp = c->null_params ? NULL : &pd;
        kdloss_fused_linear_distill_out *odp = c->null_out ? NULL : &od;
        if (cpu)
            return kdloss_fused_linear_distill(pp, c->bt, c->hs, c->ht, c->v, xs, ws, bs, xt, wt,
                                               NULL, L, odp, NULL, 0);
        return kdloss_cuda_fused_linear_distill(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt,
                                                c->hs, c->ht, c->v, xs, ws, bs, xt, wt, NULL, L,
                                                odp, ar + AR_WS, c->ws_bytes);
    }
    if (cpu)
        return kdloss_fused_linear_jsd(p, c->bt, c->hs, c->ht, c->v, xs, ws, bs, xt, wt, NULL, L,
                                       op, NULL, 0);
    return kdloss_cuda_fused_linear_jsd(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->hs, c->ht,
                                        c->v, xs, ws, bs, xt, wt, NULL, L, op, ar + AR_WS,
                                        c->ws_bytes);
}

static void fl_err(const char *what, const fl_call *c, kdloss_status want, int cpu_too) {
    int have_cpu = cpu_too && (c->distill ? kdloss_fused_linear_distill != NULL
                                          : kdloss_fused_linear_jsd != NULL);
    err_expect(what, run_fl, c, have_cpu, want);
}

/* A valid fused call (distill: the _distill pair with its defaults, else JSD 0.5, T 1, weights
 * 0.5 / 0.5): 4 rows, Hs = Ht = 8, V 16, bf16, I64 labels, loss and dxs. */
static fl_call fl_base(int distill) {
    fl_call b;
    memset(&b, 0, sizeof b);
    b.distill = distill;
    kdloss_fused_linear_distill_params_default(&b.pd);
    b.p.beta = 0.5, b.p.temperature = 1.0, b.p.weight_hard_loss = 0.5, b.p.weight_soft_loss = 0.5;
    b.p.ignore_index = -100, b.p.grad_scale = 1.0;
    b.bt = 4, b.hs = 8, b.ht = 8, b.v = 16;
    b.dxs = b.dws = b.dxt = b.dwt = b.ddxs = KDLOSS_BF16;
    b.dl = KDLOSS_I64;
    b.labels = b.loss = b.dx = 1;
    b.dx_off = AR_G;
    return b;
}

static void test_errors_fl(void) {
    fl_call b = fl_base(0);
    size_t need = 0;
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(&b.p, 4, 8, 8, 16, KDLOSS_BF16, 1, &need) == KDLOSS_OK,
             "fld_jsd ws size");
    KT_CHECK(need <= AR_BYTES - AR_WS, "fld_jsd ws fits the arena");
    b.ws_bytes = need;
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(&b.p, 4, 8, 8, 16, KDLOSS_F16, 1, &need) ==
                 KDLOSS_ERR_INVALID_DTYPE, "fld_jsd ws size f16");
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(NULL, 4, 8, 8, 16, KDLOSS_BF16, 1, &need) ==
                 KDLOSS_ERR_NULL_POINTER, "fld_jsd ws size NULL params");
    fl_call c;
    c = b; c.null_params = 1; fl_err("fld_jsd NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_out = 1; fl_err("fld_jsd NULL out", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; fl_err("fld_jsd NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.temperature = 0; fl_err("fld_jsd T = 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.beta = -0.1; fl_err("fld_jsd beta < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.weight_hard_loss = -1; fl_err("fld_jsd weight < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.chunk_size = -2; fl_err("fld_jsd chunk < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.ht = 0; fl_err("fld_jsd ht 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dxs = c.dws = c.ddxs = KDLOSS_F16; fl_err("fld_jsd f16 student", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dwt = KDLOSS_F32; fl_err("fld_jsd xt/wt dtypes differ", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    /* the student's views before the teacher pair's dtypes, on every backend (args.h, step 2) */
    c = b; c.xs_off = 1; fl_err("fld_jsd xs misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.dwt = KDLOSS_F32; c.xs_off = 1;
    fl_err("fld_jsd xs misaligned and xt/wt dtypes differ", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.labels = 0; fl_err("fld_jsd no labels", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.dl = KDLOSS_BF16; fl_err("fld_jsd float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.dx = 0; fl_err("fld_jsd no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.want_dbs = 1; fl_err("fld_jsd dbs without bias", &c, KDLOSS_ERR_SHAPE_MISMATCH, 1);
    c = b; c.ddxs = KDLOSS_F32; fl_err("fld_jsd dxs dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dx_off = AR_T; fl_err("fld_jsd dxs on xt", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.dx_off = AR_LOSS - 32; fl_err("fld_jsd dxs overlaps loss", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes -= 256; fl_err("fld_jsd workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_bytes -= 256; c.dx_off = AR_T;
    fl_err("fld_jsd workspace small and dxs on xt", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.dxs = KDLOSS_F16; c.labels = 0; fl_err("fld_jsd f16 xs and no labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
}

/* The divergence-family entry points: the shared checks (tests/test_errors.c has the CPU side). */
static void test_errors_distill(void) {
    jsd_call b = jsd_base(1);
    KT_CHECK(kdloss_cuda_distill_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "distill ws size");
    size_t need = 0;
    KT_CHECK(kdloss_cuda_distill_workspace_size(0, 8, &need) == KDLOSS_ERR_INVALID_SIZE,
             "distill ws size bt=0");
    KT_CHECK(kdloss_cuda_distill_workspace_size(4, 8, NULL) == KDLOSS_ERR_NULL_POINTER,
             "distill ws size NULL");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("distill NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("distill NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.d.divergence = (kdloss_divergence)6; jsd_err("distill unknown divergence", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = (kdloss_divergence)-1; jsd_err("distill divergence -1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.beta = 1.5; jsd_err("distill beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.alpha = NAN; jsd_err("distill alpha NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = KDLOSS_DIV_TVD; c.d.alpha = -0.5; jsd_err("distill tvd alpha < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = NAN; jsd_err("distill grad_scale NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = -1; jsd_err("distill bt < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("distill float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("distill no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.g_off = AR_T; jsd_err("distill grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes = 16; jsd_err("distill workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.lab_off = 4; jsd_err("distill int64 labels misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.loss_off = 2; jsd_err("distill loss misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = jsd_base(0); c.lab_off = 4;
    KT_CHECK(kdloss_cuda_jsd_workspace_size(4, 8, &c.ws_bytes) == KDLOSS_OK, "jsd ws size");
    jsd_err("jsd int64 labels misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
}

static void test_errors_fldistill(void) {
    fl_call f = fl_base(1);
    size_t need = 0;
    KT_CHECK(kdloss_cuda_fused_linear_distill_workspace_size(&f.pd, 4, 8, 8, 16, KDLOSS_BF16, 1,
                                                             &need) == KDLOSS_OK,
             "fldistill ws size");
    KT_CHECK(need <= AR_BYTES - AR_WS, "fldistill ws fits the arena");
    f.ws_bytes = need;
    KT_CHECK(kdloss_cuda_fused_linear_distill_workspace_size(NULL, 4, 8, 8, 16, KDLOSS_BF16, 1,
                                                             &need) == KDLOSS_ERR_NULL_POINTER,
             "fldistill ws size NULL params");
    fl_call e;
    e = f; e.null_params = 1; fl_err("fldistill NULL params", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.null_out = 1; fl_err("fldistill NULL out", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.null_ctx = 1; fl_err("fldistill NULL ctx", &e, KDLOSS_ERR_NULL_POINTER, 0);
    e = f; e.pd.div.divergence = (kdloss_divergence)9; fl_err("fldistill unknown divergence", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.div.alpha = 1.01; fl_err("fldistill alpha > 1", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.div.beta = NAN; fl_err("fldistill beta NaN", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.t2_scale = 2; fl_err("fldistill t2_scale 2", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.temperature = NAN; fl_err("fldistill T NaN", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.weight_soft_loss = -1; fl_err("fldistill weight < 0", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.row_off = 2; fl_err("fldistill row_soft misaligned", &e, KDLOSS_ERR_MISALIGNED, 1);
    e = f; e.lab_off = 4; fl_err("fldistill int64 labels misaligned", &e, KDLOSS_ERR_MISALIGNED, 1);
    e = f; e.dxt = KDLOSS_F32; e.xs_off = 1;
    fl_err("fldistill xs misaligned and xt/wt dtypes differ", &e, KDLOSS_ERR_MISALIGNED, 1);
    e = f; e.dx_off = AR_ROW - 16; fl_err("fldistill dxs overlaps row_soft", &e, KDLOSS_ERR_ALIASING, 1);
    e = f; e.labels = 0; fl_err("fldistill no labels", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.ws_bytes -= 256; fl_err("fldistill workspace small", &e, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

/* kdloss_cuda_distill_logits: the CPU's codes in the CPU's order, nothing written. */
static void test_errors_distill_logits(void) {
    jsd_call b = jsd_base(2);
    size_t need = 0;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK &&
                 b.ws_bytes <= AR_BYTES - AR_WS, "dlogits ws size");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(0, 8, &need) == KDLOSS_ERR_INVALID_SIZE,
             "dlogits ws size bt 0");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, -1, &need) == KDLOSS_ERR_INVALID_SIZE,
             "dlogits ws size v < 0");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, 8, NULL) == KDLOSS_ERR_NULL_POINTER,
             "dlogits ws size NULL");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("dlogits NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_params = 1; c.bt = 0; jsd_err("dlogits NULL params and bt 0", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("dlogits NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.bt = 0; jsd_err("dlogits bt 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = -1; jsd_err("dlogits v < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.bt = 0; c.temperature = 0; jsd_err("dlogits bt 0 and T 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.temperature = 0; jsd_err("dlogits T 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = -1; jsd_err("dlogits T < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = NAN; jsd_err("dlogits T NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = INFINITY; jsd_err("dlogits T inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 1e-39; jsd_err("dlogits 1/T beyond fp32", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 1e-30; c.p.grad_scale = 1e10;
    jsd_err("dlogits grad_scale / T beyond fp32", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = NAN; jsd_err("dlogits grad_scale NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = (kdloss_divergence)6; jsd_err("dlogits unknown divergence", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.alpha = NAN; jsd_err("dlogits alpha NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.beta = 1.5; jsd_err("dlogits beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 0; c.ds = KDLOSS_I32; jsd_err("dlogits T 0 and int student", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.ds = KDLOSS_I32; jsd_err("dlogits int student", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dt = (kdloss_dtype)77; jsd_err("dlogits unknown teacher dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.s_off = 2; jsd_err("dlogits student misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.ld_s = 5; jsd_err("dlogits student ld < v", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.dg = KDLOSS_BF16; jsd_err("dlogits grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_g = 3; jsd_err("dlogits grad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("dlogits float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.lab_off = 4; jsd_err("dlogits labels misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("dlogits no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.loss = c.row = c.grad = 0; c.dl = KDLOSS_F32;
    jsd_err("dlogits no output and float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss_off = 2; jsd_err("dlogits loss misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.g_off = AR_T; jsd_err("dlogits grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_LAB - 64; jsd_err("dlogits grad overlaps labels", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_ROW - 64; jsd_err("dlogits grad overlaps the losses", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN; c.ld_g = 9; jsd_err("dlogits in place, other ld", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN + 4; jsd_err("dlogits grad over the student, shifted", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_null = 1; jsd_err("dlogits NULL workspace", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.ws_bytes -= 1; jsd_err("dlogits workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_off = 4; c.ws_bytes += 64; jsd_err("dlogits workspace misaligned", &c, KDLOSS_ERR_INVALID_PARAM, 0);
    c = b; c.s_off = AR_WS + 64; jsd_err("dlogits workspace overlaps the student", &c, KDLOSS_ERR_ALIASING, 0);
    c = b; c.ws_bytes -= 1; c.g_off = AR_T;
    jsd_err("dlogits grad on teacher and workspace small", &c, KDLOSS_ERR_ALIASING, 0);
}

/* The top-k entry points: host-side checks with the CPU's codes, nothing written. Operands:
 * student / xs @AR_IN, ids @AR_T, log-probs @AR_T + 2048, weights @AR_W1, labels @AR_LAB. */
typedef struct tk_err {
    int null_params, null_ctx, null_out, fused;
    kdloss_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params pf;
    int64_t bt, v, k, hs;
    kdloss_dtype ds, dg, dl, did, dlp;
    int64_t ld_ids;
    size_t g_off, id_off;
    int labels, loss, row, grad, hard;
    size_t ws_bytes;
    int rw, ent; /* row_weights at AR_RW, row_entropy at AR_ENT */
} tk_err;

static kdloss_status run_tk_err(const void *arg, int cpu) {
    const tk_err *c = arg;
    char *ar = cpu ? g_har : g_ar;
    kdloss_topk_teacher t = {c->k, {ar + c->id_off, c->did, c->ld_ids}, {ar + AR_T + 2048, c->dlp, 0}};
    kdloss_labels L = {c->labels ? ar + AR_LAB : NULL, c->dl};
    float *loss = c->loss ? (float *)(ar + AR_LOSS) : NULL;
    float *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, 0};
    kdloss_cuda_context *ctx = c->null_ctx ? NULL : g_actx;
    const float *rw = c->rw ? (const float *)(ar + AR_RW) : NULL;
    float *ent = c->ent ? (float *)(ar + AR_ENT) : NULL;
    if (!c->fused) {
        kdloss_topk_distill_params pl = c->p;
        pl.row_weights = rw, pl.row_entropy = ent;
        const kdloss_topk_distill_params *p = c->null_params ? NULL : &pl;
        kdloss_cmat s = {ar + AR_IN, c->ds, 0};
        if (cpu) return kdloss_topk_distill_logits(p, c->bt, c->v, s, t, L, loss, row, g);
        return kdloss_cuda_topk_distill_logits(ctx, g_st, p, c->bt, c->v, s, t, L, loss, row, g,
                                               ar + AR_WS, c->ws_bytes);
    }
    kdloss_fused_linear_topk_distill_params pf = c->pf;
    pf.row_weights = rw;
    const kdloss_fused_linear_topk_distill_params *p = c->null_params ? NULL : &pf;
    kdloss_cmat xs = {ar + AR_IN, c->ds, 0}, ws = {ar + AR_W1, c->ds, 0};
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = loss;
    o.hard_loss = c->hard ? (float *)(ar + AR_LOSS + 4) : NULL;
    o.row_soft = row;
    o.dxs = g;
    o.row_entropy = ent;
    kdloss_fused_linear_distill_out *op = c->null_out ? NULL : &o;
    if (cpu)
        return kdloss_fused_linear_topk_distill(p, c->bt, c->hs, c->v, xs, ws, NULL, t, L, op,
                                                NULL, 0);
    return kdloss_cuda_fused_linear_topk_distill(ctx, g_st, p, c->bt, c->hs, c->v, xs, ws, NULL,
                                                 t, L, op, ar + AR_WS, c->ws_bytes);
}

static void tk_err_expect(const char *what, const tk_err *c, kdloss_status want, int cpu_too) {
    int have_cpu = cpu_too && (c->fused ? kdloss_fused_linear_topk_distill != NULL
                                        : kdloss_topk_distill_logits != NULL);
    err_expect(what, run_tk_err, c, have_cpu, want);
}

/* A valid call of the top-k logits loss: 4 x 8 fp32 logits, K 4 ids (I64, all -1) and fp32
 * log-probs, I64 labels, every output. */
static tk_err tk_base(void) {
    tk_err b;
    memset(&b, 0, sizeof b);
    kdloss_div_params_default(&b.p.div);
    b.p.tail = KDLOSS_TAIL_BUCKET, b.p.temperature = 1.0, b.p.ignore_index = -100;
    b.p.grad_scale = 1.0;
    b.bt = 4, b.v = 8, b.k = 4, b.hs = 8;
    b.ds = b.dg = KDLOSS_F32;
    b.dl = KDLOSS_I64, b.did = KDLOSS_I64, b.dlp = KDLOSS_F32;
    b.g_off = AR_G, b.id_off = AR_T;
    b.labels = b.loss = b.row = b.grad = 1;
    return b;
}

static void test_errors_topk(void) {
    /* the ids every case reads: all -1 (unused, valid), so that the CPU's value check of the
     * ids, which the GPU makes on the device, passes and the other checks decide */
    memset(g_har + AR_T, 0xFF, 256);
    if (g_gpu && g_ar != g_har) h2d(g_ar + AR_T, g_har + AR_T, 256);
    tk_err b = tk_base();
    size_t need = 0;
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 4, &b.ws_bytes) == KDLOSS_OK &&
                 b.ws_bytes <= AR_BYTES - AR_WS, "topk ws size");
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 0, &need) == KDLOSS_ERR_INVALID_SIZE,
             "topk ws size k 0");
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 4, NULL) == KDLOSS_ERR_NULL_POINTER,
             "topk ws size NULL");
    tk_err c;
    c = b; c.null_params = 1; tk_err_expect("topk NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; tk_err_expect("topk NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.k = 0; tk_err_expect("topk k 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = 0; tk_err_expect("topk v 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.p.tail = (kdloss_topk_tail)3; tk_err_expect("topk tail 3", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.tail = KDLOSS_TAIL_RENORM_TEACHER; c.p.div.divergence = KDLOSS_DIV_JSD;
    tk_err_expect("topk renorm_teacher jsd", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.temperature = 0; tk_err_expect("topk T 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.div.beta = 2; tk_err_expect("topk beta 2", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.did = KDLOSS_F32; tk_err_expect("topk float ids", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dlp = KDLOSS_I32; tk_err_expect("topk int log-probs", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_ids = 3; tk_err_expect("topk ids ld < k", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.id_off = AR_T + 4; tk_err_expect("topk ids misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.dg = KDLOSS_BF16; tk_err_expect("topk grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dl = KDLOSS_F32; tk_err_expect("topk float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; tk_err_expect("topk no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.g_off = AR_T; tk_err_expect("topk grad on ids", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_T + 2048 - 64; tk_err_expect("topk grad over log-probs", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes -= 256; tk_err_expect("topk workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);

}

/* kdloss_cuda_fused_linear_topk_distill: the base's operands as xs (4 x 8 bf16) and ws, soft
 * loss only. */
static void test_errors_fltopk(void) {
    tk_err f = tk_base(), c;
    size_t need = 0;
    f.fused = 1;
    kdloss_div_params_default(&f.pf.div);
    f.pf.temperature = 1.0, f.pf.weight_soft_loss = 1.0, f.pf.ignore_index = -100;
    f.pf.grad_scale = 1.0;
    f.ds = f.dg = KDLOSS_BF16;
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(&f.pf, 4, 8, 8, 4, KDLOSS_BF16,
                                                                  1, &f.ws_bytes) == KDLOSS_OK &&
                 f.ws_bytes <= AR_BYTES - AR_WS, "fltopk ws size");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(&f.pf, 4, 8, 8, 4, KDLOSS_F16,
                                                                  1, &need) == KDLOSS_ERR_INVALID_DTYPE,
             "fltopk ws size f16");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(NULL, 4, 8, 8, 4, KDLOSS_BF16,
                                                                  1, &need) == KDLOSS_ERR_NULL_POINTER,
             "fltopk ws size NULL params");
    c = f; c.null_params = 1; tk_err_expect("fltopk NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = f; c.null_out = 1; tk_err_expect("fltopk NULL out", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = f; c.null_ctx = 1; tk_err_expect("fltopk NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = f; c.pf.tail = (kdloss_topk_tail)-1; tk_err_expect("fltopk tail -1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.pf.tail = KDLOSS_TAIL_RENORM_TEACHER; c.pf.div.divergence = KDLOSS_DIV_REVERSE_KL;
    tk_err_expect("fltopk renorm_teacher reverse", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.pf.t2_scale = 3; tk_err_expect("fltopk t2_scale 3", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.k = -1; tk_err_expect("fltopk k < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = f; c.labels = 0; c.pf.weight_hard_loss = 0.5;
    tk_err_expect("fltopk CE weight without labels", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.labels = 0; c.hard = 1; tk_err_expect("fltopk hard_loss without labels", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.did = KDLOSS_I32; c.ld_ids = 2; tk_err_expect("fltopk i32 ids ld < k", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = f; c.dg = KDLOSS_F32; tk_err_expect("fltopk dxs dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = f; c.g_off = AR_T + 2048; tk_err_expect("fltopk dxs on log-probs", &c, KDLOSS_ERR_ALIASING, 1);
    c = f; c.ws_bytes -= 256; tk_err_expect("fltopk workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

/* Per-row weights and the entropy (docs/MATH.md section 12) on the entry points that take them:
 * with either, an argument error still gets the CPU's code (the weights' values are device
 * memory on the GPU: test_cuda_distill_logits.c, test_cuda_topk.c, test_cuda_fused_linear_distill.c
 * check them through the status word; the vocabulary-parallel forms read them to the host:
 * test_cuda_vp.c's agreement faults). */
static void test_errors_row_extras(void) {
    jsd_call j = jsd_base(2), jc;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, 8, &j.ws_bytes) == KDLOSS_OK,
             "extras dlogits ws size");
    /* kdloss_cuda_distill_logits takes both: their argument checks are the CPU's */
    jc = j; jc.rw = 1; jc.temperature = 0;
    jsd_err("dlogits row_weights and T 0", &jc, KDLOSS_ERR_INVALID_PARAM, 1);
    jc = j; jc.ent = 1; jc.ld_g = 3;
    jsd_err("dlogits row_entropy and grad ld", &jc, KDLOSS_ERR_INVALID_STRIDE, 1);
    jc = j; jc.ent = 1; jc.g_off = AR_ENT - 64;
    jsd_err("dlogits grad overlaps row_entropy", &jc, KDLOSS_ERR_ALIASING, 1);

    fl_call f = fl_base(1), fc;
    KT_CHECK(kdloss_cuda_fused_linear_distill_workspace_size(&f.pd, 4, 8, 8, 16, KDLOSS_BF16, 1,
                                                             &f.ws_bytes) == KDLOSS_OK,
             "extras fldistill ws size");
    /* kdloss_cuda_fused_linear_distill takes both: their argument checks are the CPU's */
    fc = f; fc.rw = 1; fc.pd.temperature = NAN;
    fl_err("fldistill row_weights and T NaN", &fc, KDLOSS_ERR_INVALID_PARAM, 1);
    fc = f; fc.ent = 1; fc.dx_off = AR_ENT - 16;
    fl_err("fldistill dxs overlaps row_entropy", &fc, KDLOSS_ERR_ALIASING, 1);

    tk_err t = tk_base(), tc;
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 4, &t.ws_bytes) == KDLOSS_OK,
             "extras topk ws size");
    /* kdloss_cuda_topk_distill_logits takes both: their argument checks are the CPU's */
    tc = t; tc.rw = 1; tc.p.temperature = 0;
    tk_err_expect("topk row_weights and T 0", &tc, KDLOSS_ERR_INVALID_PARAM, 1);
    tc = t; tc.ent = 1; tc.g_off = AR_ENT - 64;
    tk_err_expect("topk grad overlaps row_entropy", &tc, KDLOSS_ERR_ALIASING, 1);

    tk_err u = tk_base();
    u.fused = 1;
    kdloss_div_params_default(&u.pf.div);
    u.pf.temperature = 1.0, u.pf.weight_soft_loss = 1.0, u.pf.ignore_index = -100;
    u.pf.grad_scale = 1.0;
    u.ds = u.dg = KDLOSS_BF16;
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(&u.pf, 4, 8, 8, 4, KDLOSS_BF16,
                                                                  1, &u.ws_bytes) == KDLOSS_OK,
             "extras fltopk ws size");
    tc = u; tc.rw = 1; tc.pf.t2_scale = 3;
    tk_err_expect("fltopk row_weights and t2_scale 3", &tc, KDLOSS_ERR_INVALID_PARAM, 1);
    tc = u; tc.ent = 1; tc.g_off = AR_ENT - 16;
    tk_err_expect("fltopk dxs overlaps row_entropy", &tc, KDLOSS_ERR_ALIASING, 1);
}

/* A callback the at-once faults must never reach. */
static int vp_never(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    ++*(int *)ctx;
    return 1;
}

/* The vocabulary-parallel entries' faults that return at once, before any collective and any
 * CUDA call (every other fault meets the other ranks in the agreement: test_vp_agreement): no
 * shard, communicator or callback, a rank outside [0, size), no context, more ranks than the
 * context's agreement buffer serves. Nothing written, no collective. */
static void test_errors_vp(void) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_fused_linear_topk_distill_params_default(&tp);
    int calls = 0;
    kdloss_comm comm = {0, 2, vp_never, &calls};
    kdloss_vocab_shard sh = {&comm, 16, 0};
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = (float *)(g_ar + AR_LOSS);
    o.dxs = (kdloss_mat){g_ar + AR_G, KDLOSS_F32, 0};
    const kdloss_cmat x = {g_ar + AR_IN, KDLOSS_F32, 0}, w = {g_ar + AR_W1, KDLOSS_F32, 0};
    const kdloss_labels lab = {g_ar + AR_LAB, KDLOSS_I64};
    const kdloss_topk_teacher t = {4, {g_ar + AR_T, KDLOSS_I64, 0}, {g_ar + AR_E, KDLOSS_F32, 0}};
    void *wk = g_ar + AR_WS;
    const size_t wsb = AR_BYTES - AR_WS;
    struct { const char *what; int rank, size, null_cb, null_shard, null_ctx; kdloss_status want; } e[] = {
        {"no shard", 0, 2, 0, 1, 0, KDLOSS_ERR_NULL_POINTER},
        {"no callback", 0, 2, 1, 0, 0, KDLOSS_ERR_NULL_POINTER},
        {"rank -1", -1, 2, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"rank = size", 2, 2, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"size 0", 0, 0, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"no context", 0, 2, 0, 0, 1, KDLOSS_ERR_NULL_POINTER},
        {"5000 ranks", 0, 5000, 0, 0, 0, KDLOSS_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        comm.rank = e[i].rank, comm.size = e[i].size;
        comm.allreduce = e[i].null_cb ? NULL : vp_never;
        const kdloss_vocab_shard *shp = e[i].null_shard ? NULL : &sh;
        kdloss_cuda_context *ctx = e[i].null_ctx ? NULL : g_actx;
        if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
        kdloss_status sd = kdloss_cuda_fused_linear_distill_vp(
            ctx, g_st, &p, shp, 4, 8, 8, 8, x, w, NULL, x, w, NULL, lab, &o, wk, wsb);
        kdloss_status sk = kdloss_cuda_fused_linear_topk_distill_vp(
            ctx, g_st, &tp, shp, 4, 8, 8, x, w, NULL, t, lab, &o, wk, wsb);
        KT_CHECK(sd == e[i].want && sk == e[i].want, "vp %s: got %d / %d want %d", e[i].what,
                 (int)sd, (int)sk, (int)e[i].want);
        KT_CHECK(arena_untouched(), "vp %s: an output was written", e[i].what);
    }
    KT_CHECK(calls == 0, "vp at-once faults: %d collectives", calls);
}

/* The vocabulary-parallel entries' size queries. */
static void test_errors_vp_sizes(void) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_fused_linear_topk_distill_params_default(&tp);
    size_t b = 0;
    KT_CHECK(kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 8, 8, 8, KDLOSS_F32, 1, &b) ==
                 KDLOSS_OK && b > 0, "vp dense ws size");
    KT_CHECK(kdloss_cuda_fused_linear_distill_vp_workspace_size(NULL, 4, 8, 8, 8, KDLOSS_F32, 1,
                                                                &b) == KDLOSS_ERR_NULL_POINTER &&
                 kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 8, 8, 8, KDLOSS_F16, 1,
                                                                    &b) == KDLOSS_ERR_INVALID_DTYPE &&
                 kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 0, 8, 8, KDLOSS_F32, 1,
                                                                    &b) == KDLOSS_ERR_INVALID_SIZE,
             "vp dense ws size errors");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 4, KDLOSS_BF16, 1,
                                                                     &b) == KDLOSS_OK && b > 0,
             "vp topk ws size");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 0, KDLOSS_F32, 1,
                                                                     &b) == KDLOSS_ERR_INVALID_SIZE &&
                 kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 4, KDLOSS_F32,
                                                                         1, NULL) ==
                     KDLOSS_ERR_NULL_POINTER,
             "vp topk ws size errors");
}

void test_errors(void) {
    g_har = xmalloc(AR_BYTES);
    memset(g_har, 0, AR_BYTES);
    g_ar = g_gpu ? dalloc(AR_BYTES) : g_har;
    if (g_gpu) {
        CK(cudaMemset(g_ar, 0, AR_BYTES));
        CK(cudaDeviceSynchronize());
    }
    /* without a GPU: a zeroed stand-in for the context, never used on the error paths */
    static char fake_ctx[4096];
    g_actx = g_gpu ? g_ctx : (kdloss_cuda_context *)(void *)fake_ctx;
    test_errors_kl();
    test_errors_jsd();
    test_errors_fl();
    test_errors_distill();
    test_errors_fldistill();
    test_errors_distill_logits();
    test_errors_topk();
    test_errors_fltopk();
    test_errors_row_extras();
    test_errors_vp();
    test_errors_vp_sizes();
    if (g_gpu) CK(cudaFree(g_ar));
    free(g_har);

    kdloss_cuda_context *c = NULL;
    KT_CHECK(kdloss_cuda_context_create(0, NULL) == KDLOSS_ERR_NULL_POINTER, "context NULL out");
    kdloss_status s = kdloss_cuda_context_create(-1, &c);
    KT_CHECK(s == (g_gpu ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_UNSUPPORTED) && c == NULL,
             "context bad device: %d", (int)s);
    kdloss_cuda_context_destroy(NULL);
}
