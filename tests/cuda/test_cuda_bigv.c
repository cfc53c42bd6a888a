/* 256k vocabularies on the GPU (tag "bigv"): kdloss_cuda_distill_logits at V 262144 (Gemma 4's)
 * and 248320 (Qwen3.5's, not a power of two) against kdloss_distill_logits on the same host
 * operands, with per-row weights (one 0), an ignored label and the entropy, fp32 and bf16 logits:
 * loss, row losses and entropies rtol 1e-4 (bf16 logits are exact in fp32, so only summation
 * orders differ), the gradient normwise 1e-4. The fused losses at these V are the "multi"
 * section's large cases (test_cuda_multi.c: the three-pass row kernel above the slab kernel's
 * V). */
#include "cuda_test.h"

static void bigv_case(kt_rng *rng, int64_t v, kdloss_dtype dt) {
    enum { BT = 3 };
    char tag[96];
    snprintf(tag, sizeof tag, "bigv V %lld %s", (long long)v, kt_dtype_name(dt));
    double *zs = xmalloc((size_t)(BT * v) * 8), *zt = xmalloc((size_t)(BT * v) * 8);
    fill_normal(rng, zs, BT * v, 3.0), fill_normal(rng, zt, BT * v, 2.0);
    kt_round_to(zs, BT * v, dt), kt_round_to(zt, BT * v, dt);
    ct_mat s = ct_in(zs, BT, v, v, dt, 0), t = ct_in(zt, BT, v, v, dt, 0);
    const int64_t lab[BT] = {7, -100, v - 1};
    const float w[BT] = {0.0f, 1.0f, 1.75f};
    void *dlab = dupload(lab, sizeof lab), *dw = dupload(w, sizeof w);
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div.divergence = KDLOSS_DIV_REVERSE_KL, p.temperature = 2.0, p.grad_scale = 0.5;
    /* the GPU call */
    float *dl = dalloc(4), *drow = dalloc(2 * BT * 4);
    ct_mat g = ct_out(BT, v, dt, 0);
    size_t wsb = 0;
    CK(kdloss_cuda_distill_logits_workspace_size(BT, v, &wsb) != KDLOSS_OK);
    void *ws = dalloc(wsb);
    p.row_weights = dw, p.row_entropy = drow + BT;
    const kdloss_cmat cs = {s.d, dt, 0}, ctt = {t.d, dt, 0};
    KT_CHECK(kdloss_cuda_distill_logits(g_ctx, g_st, &p, BT, v, cs, ctt,
                                        (kdloss_labels){dlab, KDLOSS_I64}, dl, drow,
                                        (kdloss_mat){g.d, dt, 0}, ws, wsb) == KDLOSS_OK,
             "%s GPU call", tag);
    CK(cudaStreamSynchronize(g_st));
    KT_CHECK(read_status(ws) == KDLOSS_OK, "%s status word", tag);
    /* the CPU call */
    float hl, hrow[2 * BT], gl, grow[2 * BT];
    void *hg = xmalloc(s.bytes);
    p.row_weights = w, p.row_entropy = hrow + BT;
    const kdloss_cmat hs = {s.h, dt, 0}, ht = {t.h, dt, 0};
    KT_CHECK(kdloss_distill_logits(&p, BT, v, hs, ht, (kdloss_labels){lab, KDLOSS_I64}, &hl, hrow,
                                   (kdloss_mat){hg, dt, 0}) == KDLOSS_OK,
             "%s CPU call", tag);
    d2h(&gl, dl, 4), d2h(grow, drow, sizeof grow);
    kt_close(gl, hl, 1e-6, 1e-4, "%s loss", tag);
    for (int i = 0; i < 2 * BT; i++)
        kt_close(grow[i], hrow[i], 1e-6, 1e-4, "%s row %d (%s)", tag, i % BT,
                 i < BT ? "loss" : "entropy");
    KT_CHECK(grow[BT + 1] == 0.0f && grow[0] == 0.0f, "%s ignored / weight-0 rows are 0", tag);
    double *ref = to_double(hg, dt, BT, v, v);
    void *got = ct_cmp_grad(tag, "grad", g.d, dt, BT, v, v, ref, 1e-4);
    free(ref), free(got), free(hg), free(zs), free(zt);
    ct_free(&s), ct_free(&t), ct_free(&g);
    void *dev[5] = {dl, drow, ws, dlab, dw};
    for (int i = 0; i < 5; i++) CK(cudaFree(dev[i]));
}

void test_bigv(kt_rng *rng) {
    bigv_case(rng, 262144, KDLOSS_F32);
    bigv_case(rng, 248320, KDLOSS_BF16);
}
