/* kdloss_error_detail() after an error (kdloss.h): every public entry point that returns an
 * error leaves this call's own detail or an empty one, never the text a previous call left (the
 * Python binding appends it to its message, which then named the wrong argument). Each call of
 * the sweep below fails on its own arguments (NULL params, a NULL output, a negative size, a NULL
 * shard, a bad enum, every kdloss_cuda_* entry point: without CUDA its stub, with CUDA a NULL
 * context) right after a call that left a known detail ("eps = -3.25: ..."). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kdloss.h"
#include "testutil.h"

#define SENTINEL "-3.25"

/* A failing kdloss_kl_div whose detail names eps = -3.25. */
static void leave_sentinel(void) {
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.eps = -3.25;
    float l = 0.0f;
    kdloss_cmat a = {&l, KDLOSS_F32, 1};
    kdloss_mat none = {NULL, KDLOSS_F32, 0};
    kdloss_kl_div(&p, 1, 1, a, a, &l, NULL, none, none);
}

enum { N_CALLS = 66 };

/* Call i of the sweep (each fails on its own arguments); *name says which. */
static kdloss_status sweep_call(int i, const char **name) {
    static float f[64];
    static uint16_t h[64];
    size_t bytes = 0;
    kdloss_cmat c = {f, KDLOSS_F32, 4};
    kdloss_mat m = {f + 32, KDLOSS_F32, 4}, none = {NULL, KDLOSS_F32, 0};
    kdloss_labels nl = {NULL, KDLOSS_I64};
    kdloss_kl_params kl;
    kdloss_kl_params_default(&kl);
    kdloss_distill_params di;
    kdloss_distill_params_default(&di);
    kdloss_distill_logits_params dl;
    kdloss_distill_logits_params_default(&dl);
    kdloss_jsd_params js;
    kdloss_jsd_params_default(&js);
    kdloss_fljsd_params fj;
    kdloss_fljsd_params_default(&fj);
    kdloss_fused_linear_distill_params fd;
    kdloss_fused_linear_distill_params_default(&fd);
    kdloss_topk_distill_params tk;
    kdloss_topk_distill_params_default(&tk);
    kdloss_fused_linear_topk_distill_params ft;
    kdloss_fused_linear_topk_distill_params_default(&ft);
    kdloss_topk_teacher tt = {2, {h, KDLOSS_I32, 2}, {f, KDLOSS_F32, 2}};
    kdloss_fljsd_out fo;
    memset(&fo, 0, sizeof fo);
    kdloss_fused_linear_distill_out fdo;
    memset(&fdo, 0, sizeof fdo);
    kdloss_gemm_info gi;
    kdloss_divergence dv;
    kdloss_topk_tail tl;
    const char *field;
    size_t off, sz;
    kdloss_cuda_context *ctx = NULL;
#define CALL(k, expr) \
    case k: *name = #expr; return expr;
    switch (i) {
    CALL(0, kdloss_abi_layout(NULL, 0, &field, &off, &sz))
    CALL(1, kdloss_abi_layout("no_such_type", 0, &field, &off, &sz))
    CALL(2, kdloss_cpu_set_isa((kdloss_cpu_isa)99))
    CALL(3, kdloss_gemm_query((kdloss_gemm_provider)99, &gi))
    CALL(4, kdloss_gemm_query(KDLOSS_GEMM_AUTO, NULL))
    CALL(5, kdloss_gemm_set_provider((kdloss_gemm_provider)99))
    CALL(6, kdloss_gemm_set_bf16((kdloss_bf16_gemm)99))
    CALL(7, kdloss_gemm_set_bf16_grad((kdloss_bf16_grad)99))
    CALL(8, kdloss_gemm_bf16_query(NULL))
    CALL(9, kdloss_gemm_f32(KDLOSS_GEMM_AUTO, 0, 0, -1, 1, 1, 1.0f, f, 1, f, 1, 0.0f, f, 1))
    CALL(10, kdloss_gemm_bf16(KDLOSS_GEMM_AUTO, 0, 0, -1, 1, 1, h, 1, h, 1, 0.0f, f, 1))
    CALL(11, kdloss_kl_div(NULL, 1, 4, c, c, f, NULL, none, none))
    CALL(12, kdloss_kl_div(&kl, -1, 4, c, c, f, NULL, none, none))
    CALL(13, kdloss_divergence_from_name(NULL, &dv))
    CALL(14, kdloss_divergence_from_name("no-such-divergence", &dv))
    CALL(15, kdloss_distill(NULL, 1, 4, c, c, nl, f, NULL, none))
    CALL(16, kdloss_distill(&di, -1, 4, c, c, nl, f, NULL, none))
    CALL(17, kdloss_distill_logits(NULL, 1, 4, c, c, nl, f, NULL, none))
    CALL(18, kdloss_distill_logits(&dl, 1, 4, c, c, nl, NULL, NULL, none))
    CALL(19, kdloss_jsd(NULL, 1, 4, c, c, nl, f, NULL, none))
    CALL(20, kdloss_jsd(&js, 1, -4, c, c, nl, f, NULL, m))
    CALL(21, kdloss_fljsd_workspace_size(NULL, 1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    CALL(22, kdloss_fljsd_workspace_size(&fj, -1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    CALL(23, kdloss_fljsd_min_budget(NULL, 1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    CALL(24, kdloss_fljsd_min_budget(&fj, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(25, kdloss_fused_linear_jsd(NULL, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fo, NULL, 0))
    CALL(26, kdloss_fused_linear_jsd(&fj, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, NULL, NULL, 0))
    CALL(27, kdloss_fused_linear_distill_workspace_size(NULL, 1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    CALL(28, kdloss_fused_linear_distill_min_budget(&fd, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(29, kdloss_fused_linear_distill(NULL, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fdo, NULL, 0))
    CALL(30, kdloss_fused_linear_distill(&fd, -1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fdo, NULL, 0))
    CALL(31, kdloss_topk_tail_from_name(NULL, &tl))
    CALL(32, kdloss_topk_tail_from_name("no-such-tail", &tl))
    CALL(33, kdloss_topk_distill_logits(NULL, 1, 4, c, tt, nl, f, NULL, none))
    CALL(34, kdloss_topk_distill_logits(&tk, -1, 4, c, tt, nl, f, NULL, none))
    CALL(35, kdloss_fused_linear_topk_distill_workspace_size(NULL, 1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    CALL(36, kdloss_fused_linear_topk_distill_min_budget(&ft, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(37, kdloss_fused_linear_topk_distill(NULL, 1, 4, 4, c, c, NULL, tt, nl, &fdo, NULL, 0))
    CALL(38, kdloss_fused_linear_topk_distill(&ft, -1, 4, 4, c, c, NULL, tt, nl, &fdo, NULL, 0))
    CALL(39, kdloss_fused_linear_distill_vp(&fd, NULL, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fdo, NULL, 0))
    CALL(40, kdloss_fused_linear_topk_distill_vp(&ft, NULL, 1, 4, 4, c, c, NULL, tt, nl, &fdo, NULL, 0))
    CALL(41, kdloss_cuda_context_create(0, NULL))
    CALL(42, kdloss_cuda_kl_div_workspace_size(1, 4, NULL))
    CALL(43, kdloss_cuda_kl_div(ctx, NULL, &kl, 1, 4, c, c, f, NULL, none, none, NULL, 0))
    CALL(44, kdloss_cuda_jsd_workspace_size(1, 4, NULL))
    CALL(45, kdloss_cuda_jsd(ctx, NULL, &js, 1, 4, c, c, nl, f, NULL, none, NULL, 0))
    CALL(46, kdloss_cuda_fljsd_workspace_size(&fj, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(47, kdloss_cuda_fused_linear_jsd(ctx, NULL, &fj, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fo, NULL, 0))
    CALL(48, kdloss_cuda_distill_workspace_size(1, 4, NULL))
    CALL(49, kdloss_cuda_distill(ctx, NULL, &di, 1, 4, c, c, nl, f, NULL, none, NULL, 0))
    CALL(50, kdloss_cuda_distill_logits_workspace_size(1, 4, NULL))
    CALL(51, kdloss_cuda_distill_logits(ctx, NULL, &dl, 1, 4, c, c, nl, f, NULL, none, NULL, 0))
    CALL(52, kdloss_cuda_fused_linear_distill_workspace_size(&fd, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(53, kdloss_cuda_fused_linear_distill(ctx, NULL, &fd, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fdo, NULL, 0))
    CALL(54, kdloss_cuda_topk_distill_logits_workspace_size(1, 4, 2, NULL))
    CALL(55, kdloss_cuda_topk_distill_logits(ctx, NULL, &tk, 1, 4, c, tt, nl, f, NULL, none, NULL, 0))
    CALL(56, kdloss_cuda_fused_linear_topk_distill_workspace_size(&ft, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(57, kdloss_cuda_fused_linear_topk_distill(ctx, NULL, &ft, 1, 4, 4, c, c, NULL, tt, nl, &fdo, NULL, 0))
    CALL(58, kdloss_cuda_fused_linear_distill_vp_workspace_size(&fd, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(59, kdloss_cuda_fused_linear_distill_vp(ctx, NULL, &fd, NULL, 1, 4, 4, 4, c, c, NULL, c, c, NULL, nl, &fdo, NULL, 0))
    CALL(60, kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&ft, 1, 1, 1, 1, KDLOSS_F32, 1, NULL))
    CALL(61, kdloss_cuda_fused_linear_topk_distill_vp(ctx, NULL, &ft, NULL, 1, 4, 4, c, c, NULL, tt, nl, &fdo, NULL, 0))
    CALL(62, kdloss_fused_linear_distill_workspace_size(&fd, 1, 1, 1, 1, (kdloss_dtype)77, 1, &bytes))
    CALL(63, kdloss_fused_linear_topk_distill_workspace_size(&ft, 1, 1, 1, 0, KDLOSS_F32, 1, &bytes))
    CALL(64, kdloss_gemm_f32((kdloss_gemm_provider)99, 0, 0, 1, 1, 1, 1.0f, f, 1, f, 1, 0.0f, f, 1))
    CALL(65, kdloss_fljsd_min_budget(&fj, -1, 1, 1, 1, KDLOSS_F32, 1, &bytes))
    }
#undef CALL
    *name = "?";
    return KDLOSS_OK;
}

int main(void) {
    int failed_calls = 0;
    for (int i = 0; i < N_CALLS; i++) {
        leave_sentinel();
        if (!KT_CHECK(strstr(kdloss_error_detail(), SENTINEL) != NULL, "the sentinel call left [%s]",
                      kdloss_error_detail()))
            continue;
        const char *name = "?";
        kdloss_status st = sweep_call(i, &name);
        KT_CHECK(st != KDLOSS_OK, "call %d (%s) did not fail", i, name);
        const char *d = kdloss_error_detail();
        if (!KT_CHECK(d[0] == 0 || strstr(d, SENTINEL) == NULL,
                      "call %d (%s) returned %d and left the previous call's detail [%s]", i, name,
                      (int)st, d))
            failed_calls++;
    }
    printf("error detail sweep: %d calls, %d left a stale detail\n", N_CALLS, failed_calls);
    return kt_finish("test_error_detail");
}
