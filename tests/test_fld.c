/* kdloss_fused_linear_jsd against the double-precision reference (tests/support/ref_fld.c),
 * on every CPU path this machine runs, plus chunk-size invariance, run-to-run and thread-count
 * bit identity, caller workspace and the bf16 panel path.
 *
 * Tolerances (got vs reference):
 *  quantity              | bound                               | why
 *  loss, soft, hard      | 1e-6 + 1e-4 |want|                  | logits come from fp32 GEMMs over H (relative
 *                        |                                     | error ~ sqrt(H) 2^-24), softmax/JSD use exp/log
 *                        |                                     | of <= 2 ULP (vmath.h) in fp32; row sums go to
 *                        |                                     | double.
 *                        |                                     | bf16 inputs are rounded to bf16 in the reference
 *                        |                                     | too, so the same bound holds.
 *  dxs, dws, dbs (fp32)  | 1e-4 mag                            | elementwise; mag = the same product computed
 *                        |                                     | on the sizes of dz's terms and |ws|, |xs|
 *                        |                                     | (kt_ref_fld_dz's dz_mag): dz = g - q sum(g)
 *                        |                                     | cancels to nearly 0 on peaked rows, so only
 *                        |                                     | the terms' size bounds the fp32 error, which is
 *                        |                                     | ~2^-24 per term plus the logits' error.
 *  the same in bf16      | 1e-4 mag + 2^-8 |want|              | plus one cast to bf16 (half-ULP 2^-9)
 *  dxs, dws, native bf16| + 2^-8 mag                          | the backward GEMMs multiply dZ rounded to bf16
 *  backward (bf16_native)|                                     | (relative 2^-8 an element; dbs: fp32 dZ)
 *  any gradient element  | + 1e-30 absolute                    | fp32 exp underflows below 2^-126
 *  chunk 1 / 7 vs BT     | loss 1e-5 rel, grads 1e-5 of max    | same math; only the GEMM blocking and the
 *                        | (+ 2^-7 for two bf16 casts)         | order dWs and dbs sum the chunks differ
 *  repeat, 1 vs N threads| bitwise                             | fixed-order reductions by design
 * The largest gradient error seen, as a fraction of its bound, is printed at the end.
 */
#include <omp.h>
#include <time.h>

#include "fld_common.h"

#define TOL_LOSS_REL 1e-4
#define TOL_LOSS_ABS 1e-6
#define TOL_GRAD 1e-4
#define TOL_CHUNK 1e-5

/* Added to TOL_GRAD for dxs and dws while the backward GEMMs multiply dZ rounded to bf16
 * (bf16_native): each dZ element carries a relative error <= 2^-8, so the products' error is
 * <= 2^-8 sum |dz| |w| <= 2^-8 mag (docs/MATH.md 4, "bf16 operands"). dbs sums the fp32 dZ:
 * unchanged. */
static double tol_dz = 0.0;

typedef struct ref_res {
    double loss, soft, hard;
    int64_t stride;             /* dxs, dws formed on rows r % stride == 0 only */
    double *dxs, *dws, *dbs;    /* the reference gradients */
    double *mxs, *mws, *mbs;    /* their error scales (see the table above) */
} ref_res;

static double *dalloc(int64_t n) { return calloc((size_t)n, sizeof(double)); }

/* The reference for problem p (its logits zs, zt already formed) under cfg. */
static ref_res ref_run(const kt_fld_problem *p, const kt_fld_cfg *cfg, const double *zs,
                       const double *zt, int64_t stride) {
    ref_res r;
    r.stride = stride;
    double *dz = dalloc(p->bt * p->v), *dz_mag = dalloc(p->bt * p->v);
    r.dxs = dalloc(p->bt * p->hs);
    r.dws = dalloc(p->v * p->hs);
    r.dbs = dalloc(p->v);
    r.mxs = dalloc(p->bt * p->hs);
    r.mws = dalloc(p->v * p->hs);
    r.mbs = dalloc(p->v);
    kt_ref_fld_dz(cfg, p->bt, p->v, zs, zt, p->labels, &r.loss, &r.soft, &r.hard, dz, dz_mag);
    kt_ref_fld_grads(p->bt, p->hs, p->v, dz, p->xs, p->ws, 0, stride, r.dxs, r.dws, r.dbs);
    kt_ref_fld_grads(p->bt, p->hs, p->v, dz_mag, p->xs, p->ws, 1, stride, r.mxs, r.mws, r.mbs);
    free(dz);
    free(dz_mag);
    return r;
}

static void ref_free(ref_res *r) {
    double *all[] = {r->dxs, r->dws, r->dbs, r->mxs, r->mws, r->mbs};
    for (int i = 0; i < 6; i++) free(all[i]);
}

static void check_vs_ref(const char *ctx, const kt_fld_problem *p, const fl_res *g,
                         const ref_res *w) {
    if (!KT_CHECK(g->st == KDLOSS_OK, "%s: status %d (%s)", ctx, g->st,
                  kdloss_status_string(g->st)))
        return;
    kt_close(g->loss, w->loss, TOL_LOSS_ABS, TOL_LOSS_REL, "%s loss", ctx);
    kt_close(g->soft, w->soft, TOL_LOSS_ABS, TOL_LOSS_REL, "%s soft", ctx);
    kt_close(g->hard, w->hard, TOL_LOSS_ABS, TOL_LOSS_REL, "%s hard", ctx);
    if (!g->dxs) return;
    double rt = p->ds == KDLOSS_BF16 ? 0x1p-8 : 0.0;
    int64_t s = w->stride;
    /* AUTO multiplies the backward natively from bf16 dZ wherever it measured native faster
     * (as on CPUs with AVX512_BF16): the bf16_native section's 2^-8 then applies everywhere */
    kdloss_bf16_gemm_info bi;
    double dz = tol_dz;
    if (p->ds == KDLOSS_BF16 && kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && bi.grad_native)
        dz = 0x1p-8;
    fl_cmp_mat(ctx, "dxs", g->dxs, p->ds, g->ld_dxs, w->dxs, w->mxs, p->bt, p->hs, s,
               TOL_GRAD + dz, rt);
    fl_cmp_mat(ctx, "dws", g->dws, p->ds, g->ld_dws, w->dws, w->mws, p->v, p->hs, s,
               TOL_GRAD + dz, rt);
    if (g->dbs)
        fl_cmp_mat(ctx, "dbs", g->dbs, p->ds, p->v, w->dbs, w->mbs, 1, p->v, 1, TOL_GRAD, rt);
}

/* Results of two chunk sizes agree within rounding. */
static void check_chunks(const char *ctx, const kt_fld_problem *p, const fl_res *a,
                         const fl_res *b) {
    if (a->st != KDLOSS_OK || b->st != KDLOSS_OK) return;
    kt_close(a->loss, b->loss, 1e-7, TOL_CHUNK, "%s chunk invariance loss", ctx);
    double rt = TOL_CHUNK + (p->ds == KDLOSS_BF16 ? 0x1p-7 : 0.0); /* two bf16 casts */
    KT_CHECK(fl_rel_diff(a->dxs, b->dxs, p->ds, a->ld_dxs, p->bt, p->hs) <= rt,
             "%s chunk invariance dxs", ctx);
    KT_CHECK(fl_rel_diff(a->dws, b->dws, p->ds, a->ld_dws, p->v, p->hs) <= rt,
             "%s chunk invariance dws", ctx);
}

/* Grid over beta, T, weights, chunk sizes and CPU paths on one problem. */
static void grid(const char *name, const kt_fld_problem *p, const double *betas, int nb,
                 const double *temps, int nt, int full_chunks) {
    static const double wpairs[3][2] = {{1.0, 0.0}, {0.0, 1.0}, {0.5, 0.5}}; /* hard, soft */
    double *zs = malloc(sizeof(double) * (size_t)(p->bt * p->v));
    double *zt = malloc(sizeof(double) * (size_t)(p->bt * p->v));
    kt_ref_logits(p->bt, p->hs, p->v, p->xs, p->ws, p->bias_s, zs);
    kt_ref_logits(p->bt, p->ht, p->v, p->xt, p->wt, p->bias_t, zt);
    int64_t chunks[4] = {0, 1, 7, p->bt + 5};
    int n_chunks = full_chunks ? 4 : 1;
    static int counter = 0;
    for (int ib = 0; ib < nb; ib++)
        for (int it = 0; it < nt; it++)
            for (int iw = 0; iw < 3; iw++) {
                kt_fld_cfg cfg = {betas[ib], temps[it], wpairs[iw][0], wpairs[iw][1],
                                  (counter % 3 == 1) ? 0.75 : (counter % 3 == 2) ? 2.5 : 1.0,
                                  p->ignore_index};
                counter++;
                ref_res w = ref_run(p, &cfg, zs, zt, 1);
                kdloss_fljsd_params prm;
                kdloss_fljsd_params_default(&prm);
                prm.beta = cfg.beta;
                prm.temperature = cfg.temperature;
                prm.weight_hard_loss = cfg.w_hard;
                prm.weight_soft_loss = cfg.w_soft;
                prm.grad_scale = cfg.grad_scale;
                prm.ignore_index = cfg.ignore_index;
                KT_FOR_EACH_ISA(path, NULL) {
                    fl_res res[4];
                    for (int ic = 0; ic < n_chunks; ic++) {
                        char ctx[256];
                        int l32 = (counter + ic) & 1;
                        snprintf(ctx, sizeof ctx,
                                 "%s %s/%s bias %d beta %g T %g w %g/%g gs %g chunk %lld %s %s",
                                 name, kt_dtype_name(p->ds), kt_dtype_name(p->dt), p->bias_s != NULL,
                                 cfg.beta, cfg.temperature, cfg.w_hard, cfg.w_soft,
                                 cfg.grad_scale, (long long)chunks[ic], path.name,
                                 l32 ? "i32" : "i64");
                        prm.chunk_size = chunks[ic];
                        res[ic] = fl_run(p, &prm, 1, l32, NULL, 0);
                        check_vs_ref(ctx, p, &res[ic], &w);
                        if (ic > 0) check_chunks(ctx, p, &res[ic], &res[0]);
                    }
                    /* forward only: the same losses, bit for bit, with no gradient work */
                    prm.chunk_size = 0;
                    fl_res fw = fl_run(p, &prm, 0, 0, NULL, 0);
                    KT_CHECK(fw.st == KDLOSS_OK && !memcmp(&fw.loss, &res[0].loss, 4) &&
                                 !memcmp(&fw.soft, &res[0].soft, 4) &&
                                 !memcmp(&fw.hard, &res[0].hard, 4),
                             "%s beta %g T %g %s: forward-only losses differ from the full call",
                             name, cfg.beta, cfg.temperature, path.name);
                    fl_res_free(&fw);
                    for (int ic = 0; ic < n_chunks; ic++) fl_res_free(&res[ic]);
                }
                ref_free(&w);
            }
    free(zs);
    free(zt);
}

/* Small shape: the whole grid. */
static void small_shapes(kt_rng *rng) {
    static const double betas[] = {0.0, 0.2, 0.5, 0.8, 1.0}, temps[] = {0.5, 1.0, 2.0};
    int quick = kt_quick();
    static const kdloss_dtype pairs[4][2] = {{KDLOSS_F32, KDLOSS_F32},
                                             {KDLOSS_BF16, KDLOSS_BF16},
                                             {KDLOSS_BF16, KDLOSS_F32},
                                             {KDLOSS_F32, KDLOSS_BF16}};
    for (int ip = 0; ip < 4; ip++)
        for (int bias = 0; bias <= 1; bias++) {
            if (ip >= 2 && !bias) continue; /* mixed dtypes: one problem each */
            kt_fld_problem p;
            /* padding on the biased problems; ignore_index 5 (a real class id) on one */
            kt_fld_problem_make(&p, rng, 141, 15, 31, 123, pairs[ip][0], pairs[ip][1], bias,
                                3.0, 5, ip == 1 && bias ? 5 : -100, bias ? 3 : 0);
            int full = !quick && ip < 2;
            grid("small", &p, betas, full ? 5 : 2, temps, full ? 3 : 2, !quick || ip == 0);
            kt_fld_problem_free(&p);
        }
}

/* Peaked logits (spread 25, up to 200 after T = 0.5): softmaxes near one-hot, exps underflowing. */
static void peaked(kt_rng *rng) {
    static const double betas[] = {0.0, 0.5, 1.0}, temps[] = {0.5, 2.0};
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 37, 16, 24, 257, KDLOSS_F32, KDLOSS_F32, 1, 25.0, 4, -100, 0);
    grid("peaked", &p, betas, 3, temps, 2, 0);
    kt_fld_problem_free(&p);
}

/* All rows ignored: loss 0, exactly zero gradients. */
static void all_ignored(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 20, 8, 12, 50, KDLOSS_BF16, KDLOSS_BF16, 1, 3.0, 1, -100, 2);
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    prm.chunk_size = 7;
    fl_res r = fl_run(&p, &prm, 1, 0, NULL, 0);
    KT_CHECK(r.st == KDLOSS_OK && r.loss == 0.0f && r.soft == 0.0f && r.hard == 0.0f,
             "all ignored: status %d, losses %g %g %g", r.st, r.loss, r.soft, r.hard);
    int zero = 1;
    for (int64_t i = 0; i < p.bt; i++)
        for (int64_t k = 0; k < p.hs; k++) zero &= kt_get(r.dxs, p.ds, r.ld_dxs, i, k) == 0.0;
    for (int64_t c = 0; c < p.v; c++) {
        for (int64_t k = 0; k < p.hs; k++) zero &= kt_get(r.dws, p.ds, r.ld_dws, c, k) == 0.0;
        zero &= kt_get(r.dbs, p.ds, p.v, 0, c) == 0.0;
    }
    KT_CHECK(zero, "all ignored: a gradient is not zero");
    KT_CHECK(fl_padding_intact(r.dxs, p.ds, p.bt, p.hs, r.ld_dxs) &&
                 fl_padding_intact(r.dws, p.ds, p.v, p.hs, r.ld_dws),
             "all ignored: padding written");
    fl_res_free(&r);
    kt_fld_problem_free(&p);
}

/* Bitwise: the same call twice, one thread vs all, caller workspace (misaligned on purpose)
 * vs the library's own. */
static void determinism(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 150, 40, 56, 517, KDLOSS_BF16, KDLOSS_BF16, 1, 3.0, 6, -100, 1);
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    prm.beta = 0.3;
    prm.temperature = 1.5;
    prm.chunk_size = 64;
    KT_FOR_EACH_ISA(path, NULL) {
        fl_res a = fl_run(&p, &prm, 1, 0, NULL, 0), b = fl_run(&p, &prm, 1, 1, NULL, 0);
        KT_CHECK(a.st == KDLOSS_OK && b.st == KDLOSS_OK && fl_same_bits(&p, &a, &b),
                 "%s: two identical calls differ", path.name);
        int nthreads = omp_get_max_threads();
        omp_set_num_threads(1);
        fl_res c = fl_run(&p, &prm, 1, 0, NULL, 0);
        omp_set_num_threads(nthreads);
        KT_CHECK(c.st == KDLOSS_OK && fl_same_bits(&p, &a, &c),
                 "%s: 1 thread differs from %d threads", path.name, nthreads);
        size_t need = 0;
        KT_CHECK(kdloss_fljsd_workspace_size(&prm, p.bt, p.hs, p.ht, p.v, p.ds, 1, &need) ==
                     KDLOSS_OK, "workspace size");
        char *buf = malloc(need + 8);
        fl_res d = fl_run(&p, &prm, 1, 0, buf + 4, need);
        KT_CHECK(d.st == KDLOSS_OK && fl_same_bits(&p, &a, &d),
                 "%s: caller workspace (%zu bytes, misaligned) differs", path.name, need);
        free(buf);
        fl_res_free(&a);
        fl_res_free(&b);
        fl_res_free(&c);
        fl_res_free(&d);
    }
    kt_fld_problem_free(&p);
}

/* Relative Frobenius-norm difference of two gradients of the same shape (dtype dt, ld). */
static double rel_norm(const void *a, const void *b, kdloss_dtype dt, int64_t ld, int64_t rows,
                       int64_t cols) {
    double num = 0.0, den = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double x = kt_get(a, dt, ld, r, c), y = kt_get(b, dt, ld, r, c);
            num += (x - y) * (x - y);
            den += y * y;
        }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* The bf16 products multiplied natively (oneDNN matmul, fp32 accumulation) instead of widened,
 * forward and backward. The logits are exact products summed in fp32: the same loss
 * bounds. The gradient GEMMs multiply dZ rounded to bf16: tol_dz = 2^-8 more on dxs and dws
 * (elementwise, against the float64 reference), and within 2e-2 relative norm of the exact
 * variant (KDLOSS_BF16_GRAD_EXACT: fp32 dZ, widened operands; the fp32 bounds). 1, 2 and 3
 * threads bitwise. Where oneDNN has no bf16 matmul (AVX2 only) the native products run emulated
 * (KDLOSS_GEMM_BF16_EMULATE=1: each tile's operands widened, one sgemm), which exercises the same
 * driver paths (dZ rounded in place, transposed and strided bf16 operands, dWs accumulated by
 * the GEMM) with another summation order. */
static void bf16_native(kt_rng *rng) {
    int emulated = 0;
    if (kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_NATIVE) != KDLOSS_OK) {
        setenv("KDLOSS_GEMM_BF16_EMULATE", "1", 1);
        emulated = 1;
        if (!KT_CHECK(kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_NATIVE) == KDLOSS_OK,
                      "NATIVE refused with KDLOSS_GEMM_BF16_EMULATE=1")) {
            unsetenv("KDLOSS_GEMM_BF16_EMULATE");
            return;
        }
    }
    printf("bf16 native GEMMs: %s\n",
           emulated ? "emulated (oneDNN has no bf16 matmul for this CPU)" : "oneDNN");
    kdloss_bf16_gemm_info bi;
    KT_CHECK(kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && bi.native && bi.grad_native,
             "forced NATIVE: query says native %d, grad_native %d", bi.native, bi.grad_native);
    static const double betas[] = {0.0, 0.5, 1.0}, temps[] = {0.7, 1.0};
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 133, 48, 72, 650, KDLOSS_BF16, KDLOSS_BF16, 1, 3.0, 5, -100, 2);
    tol_dz = 0x1p-8;
    grid("bf16-native", &p, betas, 3, temps, 2, !kt_quick());
    /* the exact backward: the fp32 bounds again, and the rounded one within 2e-2 of it */
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    prm.chunk_size = 48;
    fl_res rounded = fl_run(&p, &prm, 1, 0, NULL, 0);
    KT_CHECK(kdloss_gemm_set_bf16_grad((kdloss_bf16_grad)2) == KDLOSS_ERR_INVALID_PARAM,
             "set_bf16_grad 2");
    KT_CHECK(kdloss_gemm_set_bf16_grad(KDLOSS_BF16_GRAD_EXACT) == KDLOSS_OK, "grad EXACT");
    KT_CHECK(kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && bi.native && !bi.grad_native,
             "EXACT: query says native %d, grad_native %d", bi.native, bi.grad_native);
    tol_dz = 0.0;
    grid("bf16-native exact grad", &p, betas + 1, 1, temps, 1, 0);
    fl_res exact = fl_run(&p, &prm, 1, 0, NULL, 0);
    KT_CHECK(kdloss_gemm_set_bf16_grad(KDLOSS_BF16_GRAD_AUTO) == KDLOSS_OK, "grad AUTO");
    if (rounded.st == KDLOSS_OK && exact.st == KDLOSS_OK) {
        KT_CHECK(!memcmp(&rounded.loss, &exact.loss, 4),
                 "the exact backward changed the loss: %.9g vs %.9g", rounded.loss, exact.loss);
        double ex = rel_norm(rounded.dxs, exact.dxs, p.ds, rounded.ld_dxs, p.bt, p.hs);
        double ew = rel_norm(rounded.dws, exact.dws, p.ds, rounded.ld_dws, p.v, p.hs);
        printf("bf16 dZ vs fp32 dZ: relative norm dxs %.3g, dws %.3g\n", ex, ew);
        KT_CHECK(ex <= 2e-2 && ew <= 2e-2, "bf16 dZ vs exact: dxs %.3g dws %.3g", ex, ew);
    }
    fl_res_free(&rounded);
    fl_res_free(&exact);
    /* thread-count independence of the native paths (tiles over a fixed grid) */
    int save = omp_get_max_threads();
    fl_res r[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        r[t] = fl_run(&p, &prm, 1, 1, NULL, 0);
    }
    omp_set_num_threads(save);
    for (int t = 1; t < 3; t++)
        KT_CHECK(r[0].st == KDLOSS_OK && r[t].st == KDLOSS_OK && fl_same_bits(&p, &r[0], &r[t]),
                 "bf16 native: %d threads differ from 1 thread", t + 1);
    for (int t = 0; t < 3; t++) fl_res_free(&r[t]);
    kt_fld_problem_free(&p);
    /* a bf16 student with an fp32 teacher, with the panel-sized budget's plan */
    tol_dz = 0x1p-8;
    kt_fld_problem_make(&p, rng, 64, 40, 56, 300, KDLOSS_BF16, KDLOSS_F32, 0, 3.0, 0, -100, 0);
    grid("bf16-native mixed", &p, betas, 2, temps, 1, 0);
    kt_fld_problem_free(&p);
    tol_dz = 0.0;
    kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_AUTO);
    if (emulated) unsetenv("KDLOSS_GEMM_BF16_EMULATE");
}

/* Forced WIDEN is the computation without native bf16 GEMMs (bf16 widened, fp32 dZ): the same
 * bits with either backward mode, and the same bits as AUTO wherever AUTO measured widen. */
static void bf16_widen(kt_rng *rng) {
    kt_fld_problem p;
    kt_fld_problem_make(&p, rng, 96, 40, 56, 517, KDLOSS_BF16, KDLOSS_BF16, 1, 3.0, 6, -100, 1);
    kdloss_fljsd_params prm;
    kdloss_fljsd_params_default(&prm);
    prm.chunk_size = 40;
    kdloss_bf16_gemm_info bi;
    KT_CHECK(kdloss_gemm_bf16_query(&bi) == KDLOSS_OK, "bf16 query");
    fl_res aut = fl_run(&p, &prm, 1, 0, NULL, 0);
    KT_CHECK(kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_WIDEN) == KDLOSS_OK, "WIDEN");
    KT_CHECK(kdloss_gemm_bf16_query(&bi) == KDLOSS_OK && !bi.native && !bi.grad_native,
             "WIDEN: query says native %d, grad_native %d", bi.native, bi.grad_native);
    fl_res w = fl_run(&p, &prm, 1, 0, NULL, 0);
    kdloss_gemm_set_bf16_grad(KDLOSS_BF16_GRAD_EXACT);
    fl_res we = fl_run(&p, &prm, 1, 0, NULL, 0);
    kdloss_gemm_set_bf16_grad(KDLOSS_BF16_GRAD_AUTO);
    kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_AUTO);
    KT_CHECK(w.st == KDLOSS_OK && we.st == KDLOSS_OK && fl_same_bits(&p, &w, &we),
             "WIDEN: the EXACT backward differs from AUTO's");
    if (!bi.auto_native)
        KT_CHECK(aut.st == KDLOSS_OK && fl_same_bits(&p, &aut, &w),
                 "AUTO measured widen, but its results differ from forced WIDEN");
    fl_res_free(&aut);
    fl_res_free(&w);
    fl_res_free(&we);
    kt_fld_problem_free(&p);
}

/* Bitwise the same results with 1, 2 and 3 threads on a shape whose GEMMs split into several
 * tiles (the GEMM layer's grid depends on the processor count, not the thread count), fp32 and
 * bf16, every CPU path. */
static void thread_counts(kt_rng *rng) {
    static const kdloss_dtype dts[2] = {KDLOSS_F32, KDLOSS_BF16};
    int save = omp_get_max_threads();
    for (int id = 0; id < 2; id++) {
        kt_fld_problem p;
        kt_fld_problem_make(&p, rng, 320, 192, 256, kt_quick() ? 1500 : 3001, dts[id], dts[id],
                            1, 3.0, 7, -100, 1);
        kdloss_fljsd_params prm;
        kdloss_fljsd_params_default(&prm);
        prm.chunk_size = 128;
        KT_FOR_EACH_ISA(path, NULL) {
            fl_res r[3];
            for (int t = 0; t < 3; t++) {
                omp_set_num_threads(t + 1);
                r[t] = fl_run(&p, &prm, 1, 0, NULL, 0);
            }
            omp_set_num_threads(save);
            for (int t = 1; t < 3; t++)
                KT_CHECK(r[0].st == KDLOSS_OK && r[t].st == KDLOSS_OK &&
                             fl_same_bits(&p, &r[0], &r[t]),
                         "%s %s: %d threads differ from 1 thread", kt_dtype_name(dts[id]),
                         path.name, t + 1);
            for (int t = 0; t < 3; t++) fl_res_free(&r[t]);
        }
        kt_fld_problem_free(&p);
    }
}

/* The larger shape: two problems, two configurations each; the double reference costs seconds
 * per problem, so its gradients are formed (and checked) on every 4th row of dxs and dws. A small
 * memory budget sends the bf16 weights through the panel loop and the automatic chunk below BT. */
static void large_shape(kt_rng *rng) {
    int quick = kt_quick();
    int64_t bt = quick ? 96 : 1024, hs = quick ? 64 : 512, ht = quick ? 80 : 1024,
            v = quick ? 1000 : 4096, stride = quick ? 1 : 4;
    typedef struct {
        double beta, temp, wh, wsoft, gs;
        int64_t chunk;
        size_t budget;
        kdloss_cpu_isa isa;
        int l32;
    } lcase;
    static const lcase f32_cases[2] = {
        {0.5, 1.0, 0.5, 0.5, 1.0, 0, 0, KDLOSS_ISA_AUTO, 0},
        {0.0, 2.0, 1.0, 0.0, 2.0, 100000, 0, KDLOSS_ISA_SCALAR, 1},
    };
    /* budget: small enough that the weights' fp32 copies do not fit, so panels of 1/8 of it */
    const lcase bf16_cases[2] = {
        {0.2, 0.5, 0.5, 0.5, 0.75, 0, quick ? 256u << 10 : 8u << 20, KDLOSS_ISA_AUTO, 1},
        {1.0, 1.0, 0.0, 1.0, 1.0, 7, 0, KDLOSS_ISA_AUTO, 0},
    };
    double *zs = malloc(sizeof(double) * (size_t)(bt * v));
    double *zt = malloc(sizeof(double) * (size_t)(bt * v));
    for (int prob = 0; prob < 2; prob++) {
        kdloss_dtype dt = prob ? KDLOSS_BF16 : KDLOSS_F32;
        const lcase *cases = prob ? bf16_cases : f32_cases;
        kt_fld_problem p;
        kt_fld_problem_make(&p, rng, bt, hs, ht, v, dt, dt, !prob, 3.0, 7, -100, prob ? 4 : 0);
        kt_ref_logits(bt, hs, v, p.xs, p.ws, p.bias_s, zs);
        kt_ref_logits(bt, ht, v, p.xt, p.wt, p.bias_t, zt);
        for (int i = 0; i < (quick ? 1 : 2); i++) {
            const lcase *c = &cases[i];
            kt_fld_cfg cfg = {c->beta, c->temp, c->wh, c->wsoft, c->gs, -100};
            ref_res w = ref_run(&p, &cfg, zs, zt, stride);
            kdloss_fljsd_params prm;
            kdloss_fljsd_params_default(&prm);
            prm.beta = cfg.beta;
            prm.temperature = cfg.temperature;
            prm.weight_hard_loss = cfg.w_hard;
            prm.weight_soft_loss = cfg.w_soft;
            prm.grad_scale = cfg.grad_scale;
            prm.chunk_size = c->chunk;
            prm.memory_budget = c->budget;
            kdloss_cpu_set_isa(c->isa);
            char ctx[200];
            snprintf(ctx, sizeof ctx, "large %lldx%lldx%lldx%lld %s beta %g T %g chunk %lld %s",
                     (long long)bt, (long long)hs, (long long)ht, (long long)v, kt_dtype_name(dt),
                     cfg.beta, cfg.temperature, (long long)c->chunk,
                     kdloss_cpu_isa_name(kdloss_cpu_get_isa()));
            if (c->budget) { /* the panel path: no room for whole fp32 weight copies */
                size_t need = 0;
                kdloss_fljsd_workspace_size(&prm, bt, hs, ht, v, dt, 1, &need);
                KT_CHECK(need < (size_t)(v * (hs + ht)) * sizeof(float),
                         "%s: %zu workspace bytes, room for whole weight copies", ctx, need);
            }
            fl_res r = fl_run(&p, &prm, 1, c->l32, NULL, 0);
            check_vs_ref(ctx, &p, &r, &w);
            fl_res_free(&r);
            kdloss_cpu_set_isa(KDLOSS_ISA_AUTO);
            ref_free(&w);
        }
        kt_fld_problem_free(&p);
    }
    free(zs);
    free(zt);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define TIMED(call)                                                                            \
    do {                                                                                       \
        double t0_ = now();                                                                    \
        call;                                                                                  \
        printf("%-24s %6.1f s\n", #call, now() - t0_);                                         \
    } while (0)

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    TIMED(small_shapes(&rng));
    TIMED(peaked(&rng));
    TIMED(all_ignored(&rng));
    TIMED(determinism(&rng));
    TIMED(thread_counts(&rng));
    TIMED(bf16_native(&rng));
    TIMED(bf16_widen(&rng));
    TIMED(large_shape(&rng));
    printf("largest gradient error: %.3g of its bound\n", fl_worst_seen);
    return kt_finish("test_fld");
}
