/* The layout of every public struct of kdloss.h, as this build compiled it, for bindings that
 * mirror the structs by hand (Python's ctypes in python/kdloss/_lib.py, checked by
 * tests/python/test_abi.py): kdloss_abi_layout. */
#include <stddef.h>
#include <string.h>

#include "kdloss.h"
#include "check.h"

typedef struct kd_abi_entry {
    const char *type, *field; /* field NULL: the struct itself */
    size_t offset, size;
} kd_abi_entry;

#define KD_STRUCT(T) {#T, NULL, 0, sizeof(T)}
#define KD_FIELD(T, f) {#T, #f, offsetof(T, f), sizeof(((T *)0)->f)}

static const kd_abi_entry KD_ABI[] = {
    KD_STRUCT(kdloss_cmat),
    KD_FIELD(kdloss_cmat, data),
    KD_FIELD(kdloss_cmat, dtype),
    KD_FIELD(kdloss_cmat, ld),
    KD_STRUCT(kdloss_mat),
    KD_FIELD(kdloss_mat, data),
    KD_FIELD(kdloss_mat, dtype),
    KD_FIELD(kdloss_mat, ld),
    KD_STRUCT(kdloss_labels),
    KD_FIELD(kdloss_labels, data),
    KD_FIELD(kdloss_labels, dtype),
    KD_STRUCT(kdloss_gemm_info),
    KD_FIELD(kdloss_gemm_info, provider),
    KD_FIELD(kdloss_gemm_info, name),
    KD_FIELD(kdloss_gemm_info, version),
    KD_FIELD(kdloss_gemm_info, kernel),
    KD_FIELD(kdloss_gemm_info, generic),
    KD_FIELD(kdloss_gemm_info, thread_independent),
    KD_FIELD(kdloss_gemm_info, bf16_native),
    KD_STRUCT(kdloss_bf16_gemm_info),
    KD_FIELD(kdloss_bf16_gemm_info, mode),
    KD_FIELD(kdloss_bf16_gemm_info, grad),
    KD_FIELD(kdloss_bf16_gemm_info, native),
    KD_FIELD(kdloss_bf16_gemm_info, grad_native),
    KD_FIELD(kdloss_bf16_gemm_info, auto_native),
    KD_FIELD(kdloss_bf16_gemm_info, available),
    KD_FIELD(kdloss_bf16_gemm_info, reference),
    KD_FIELD(kdloss_bf16_gemm_info, measurements),
    KD_FIELD(kdloss_bf16_gemm_info, native_gflops),
    KD_FIELD(kdloss_bf16_gemm_info, widen_gflops),
    KD_FIELD(kdloss_bf16_gemm_info, margin),
    KD_FIELD(kdloss_bf16_gemm_info, m),
    KD_FIELD(kdloss_bf16_gemm_info, n),
    KD_FIELD(kdloss_bf16_gemm_info, k),
    KD_FIELD(kdloss_bf16_gemm_info, kernel),
    KD_STRUCT(kdloss_kl_params),
    KD_FIELD(kdloss_kl_params, reduction),
    KD_FIELD(kdloss_kl_params, log_target),
    KD_FIELD(kdloss_kl_params, eps),
    KD_FIELD(kdloss_kl_params, grad_scale),
    KD_STRUCT(kdloss_logit_map),
    KD_FIELD(kdloss_logit_map, scale),
    KD_FIELD(kdloss_logit_map, softcap),
    KD_STRUCT(kdloss_div_params),
    KD_FIELD(kdloss_div_params, divergence),
    KD_FIELD(kdloss_div_params, beta),
    KD_FIELD(kdloss_div_params, alpha),
    KD_STRUCT(kdloss_distill_params),
    KD_FIELD(kdloss_distill_params, div),
    KD_FIELD(kdloss_distill_params, ignore_index),
    KD_FIELD(kdloss_distill_params, grad_scale),
    KD_STRUCT(kdloss_distill_logits_params),
    KD_FIELD(kdloss_distill_logits_params, div),
    KD_FIELD(kdloss_distill_logits_params, temperature),
    KD_FIELD(kdloss_distill_logits_params, ignore_index),
    KD_FIELD(kdloss_distill_logits_params, grad_scale),
    KD_FIELD(kdloss_distill_logits_params, row_weights),
    KD_FIELD(kdloss_distill_logits_params, row_entropy),
    KD_STRUCT(kdloss_jsd_params),
    KD_FIELD(kdloss_jsd_params, beta),
    KD_FIELD(kdloss_jsd_params, ignore_index),
    KD_FIELD(kdloss_jsd_params, grad_scale),
    KD_STRUCT(kdloss_fljsd_params),
    KD_FIELD(kdloss_fljsd_params, beta),
    KD_FIELD(kdloss_fljsd_params, temperature),
    KD_FIELD(kdloss_fljsd_params, weight_hard_loss),
    KD_FIELD(kdloss_fljsd_params, weight_soft_loss),
    KD_FIELD(kdloss_fljsd_params, ignore_index),
    KD_FIELD(kdloss_fljsd_params, chunk_size),
    KD_FIELD(kdloss_fljsd_params, memory_budget),
    KD_FIELD(kdloss_fljsd_params, grad_scale),
    KD_STRUCT(kdloss_fljsd_out),
    KD_FIELD(kdloss_fljsd_out, loss),
    KD_FIELD(kdloss_fljsd_out, soft_loss),
    KD_FIELD(kdloss_fljsd_out, hard_loss),
    KD_FIELD(kdloss_fljsd_out, dxs),
    KD_FIELD(kdloss_fljsd_out, dws),
    KD_FIELD(kdloss_fljsd_out, dbs),
    KD_STRUCT(kdloss_fused_linear_distill_params),
    KD_FIELD(kdloss_fused_linear_distill_params, div),
    KD_FIELD(kdloss_fused_linear_distill_params, temperature),
    KD_FIELD(kdloss_fused_linear_distill_params, weight_hard_loss),
    KD_FIELD(kdloss_fused_linear_distill_params, weight_soft_loss),
    KD_FIELD(kdloss_fused_linear_distill_params, t2_scale),
    KD_FIELD(kdloss_fused_linear_distill_params, ignore_index),
    KD_FIELD(kdloss_fused_linear_distill_params, chunk_size),
    KD_FIELD(kdloss_fused_linear_distill_params, memory_budget),
    KD_FIELD(kdloss_fused_linear_distill_params, grad_scale),
    KD_FIELD(kdloss_fused_linear_distill_params, student_map),
    KD_FIELD(kdloss_fused_linear_distill_params, teacher_map),
    KD_FIELD(kdloss_fused_linear_distill_params, row_weights),
    KD_STRUCT(kdloss_fused_linear_distill_out),
    KD_FIELD(kdloss_fused_linear_distill_out, loss),
    KD_FIELD(kdloss_fused_linear_distill_out, soft_loss),
    KD_FIELD(kdloss_fused_linear_distill_out, hard_loss),
    KD_FIELD(kdloss_fused_linear_distill_out, dxs),
    KD_FIELD(kdloss_fused_linear_distill_out, dws),
    KD_FIELD(kdloss_fused_linear_distill_out, dbs),
    KD_FIELD(kdloss_fused_linear_distill_out, row_soft),
    KD_FIELD(kdloss_fused_linear_distill_out, row_hard),
    KD_FIELD(kdloss_fused_linear_distill_out, row_lse),
    KD_FIELD(kdloss_fused_linear_distill_out, row_entropy),
    KD_STRUCT(kdloss_teacher_heads),
    KD_FIELD(kdloss_teacher_heads, n),
    KD_FIELD(kdloss_teacher_heads, wt),
    KD_FIELD(kdloss_teacher_heads, bias),
    KD_FIELD(kdloss_teacher_heads, index),
    KD_STRUCT(kdloss_topk_teacher),
    KD_FIELD(kdloss_topk_teacher, k),
    KD_FIELD(kdloss_topk_teacher, ids),
    KD_FIELD(kdloss_topk_teacher, logprobs),
    KD_STRUCT(kdloss_topk_distill_params),
    KD_FIELD(kdloss_topk_distill_params, div),
    KD_FIELD(kdloss_topk_distill_params, tail),
    KD_FIELD(kdloss_topk_distill_params, temperature),
    KD_FIELD(kdloss_topk_distill_params, ignore_index),
    KD_FIELD(kdloss_topk_distill_params, grad_scale),
    KD_FIELD(kdloss_topk_distill_params, row_weights),
    KD_FIELD(kdloss_topk_distill_params, row_entropy),
    KD_STRUCT(kdloss_fused_linear_topk_distill_params),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, div),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, tail),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, temperature),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, weight_hard_loss),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, weight_soft_loss),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, t2_scale),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, ignore_index),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, chunk_size),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, memory_budget),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, grad_scale),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, student_map),
    KD_FIELD(kdloss_fused_linear_topk_distill_params, row_weights),
    KD_STRUCT(kdloss_comm),
    KD_FIELD(kdloss_comm, rank),
    KD_FIELD(kdloss_comm, size),
    KD_FIELD(kdloss_comm, allreduce),
    KD_FIELD(kdloss_comm, ctx),
    KD_STRUCT(kdloss_vocab_shard),
    KD_FIELD(kdloss_vocab_shard, comm),
    KD_FIELD(kdloss_vocab_shard, v_total),
    KD_FIELD(kdloss_vocab_shard, v_begin),
};
#define KD_ABI_N (sizeof KD_ABI / sizeof KD_ABI[0])

kdloss_status kdloss_abi_layout(const char *type, int index, const char **field, size_t *offset,
                                size_t *size) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!type || !field || !offset || !size) return KDLOSS_ERR_NULL_POINTER;
    for (size_t i = 0; i < KD_ABI_N; i++) {
        if (strcmp(KD_ABI[i].type, type) != 0 || KD_ABI[i].field) continue;
        /* the struct's row, then its fields in declaration order */
        if (index < 0 || (size_t)index >= KD_ABI_N - i) return KDLOSS_ERR_INVALID_PARAM;
        const kd_abi_entry *e = &KD_ABI[i + (size_t)index];
        if (index > 0 && (!e->field || strcmp(e->type, type) != 0)) return KDLOSS_ERR_INVALID_PARAM;
        *field = e->field;
        *offset = e->offset;
        *size = e->size;
        return KDLOSS_OK;
    }
    return KDLOSS_ERR_INVALID_PARAM;
}
