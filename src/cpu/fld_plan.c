/* Parameters, chunk choice and workspace layout of the CPU fused-linear distillation loss
 * (the layout itself is documented in fld.h). */
#include <math.h>
#include <stdint.h>

#include "fld.h"
#include "fld_rows.h"
#include "topk.h"
#include "check.h"

#define KD_DEFAULT_BUDGET ((size_t)256 << 20)
/* A converted weight panel holds at most this many bytes, and at most 1/8 of the budget (so a
 * small budget also gives small panels, which the tests rely on to cover the panel loop):
 * panels this large ran within a few percent of whole-matrix GEMMs, and their bf16 -> fp32
 * conversion within the noise of the GEMM that reads it (BENCHMARKS.md, "bf16 weights"). */
#define KD_PANEL_BYTES ((size_t)16 << 20)

/* a * b * c bytes, 0 on overflow (every caller's count is positive when valid). */
static size_t mul3(size_t a, size_t b, size_t c) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return 0;
    return abc;
}

/* Appends a region of `bytes` at the next aligned offset; sets *ok = 0 on overflow. */
static size_t take(size_t *end, size_t bytes, int *ok) {
    size_t off = (*end + KD_FLD_ALIGN - 1) & ~(size_t)(KD_FLD_ALIGN - 1);
    if (off < *end || __builtin_add_overflow(off, bytes, end)) *ok = 0;
    return off;
}

/* Rows per chunk when chunk_size is 0: the largest multiple of 16 whose per-row buffers fit in
 * what the budget leaves, at least 1, at most BT; then spread evenly over the same number of
 * chunks (still a multiple of 16), so the last chunk is not a sliver: fewer bytes, same GEMMs.
 * Unsigned arithmetic throughout: BT may be near INT64_MAX, and bt + cmax - 1 would overflow. */
static int64_t auto_chunk(int64_t bt, size_t avail, size_t per_row) {
    uint64_t ubt = (uint64_t)bt, fit = avail / per_row;
    if (fit >= ubt) return bt;
    uint64_t cmax = fit >= 16 ? fit / 16 * 16 : fit > 0 ? fit : 1; /* < bt */
    uint64_t nch = ubt / cmax + (ubt % cmax != 0);
    uint64_t c = ubt / nch + (ubt % nch != 0); /* <= cmax */
    if (cmax >= 16) c = (c + 15) / 16 * 16;    /* still <= cmax, a multiple of 16 */
    return c < ubt ? (int64_t)c : bt;
}

/* The workspace's regions for plan->chunk rows (plan->xconv_cols, whole, panel_floats set):
 * their offsets and plan->bytes; 0 when a size overflows. */
static int plan_layout(kd_fld_plan *plan, int64_t v, int64_t hs, int64_t ht, size_t zt_cols,
                       size_t tk_row, int64_t topk_k, int sb, int want_grad) {
    const size_t f4 = sizeof(float);
    size_t end = 0, c = (size_t)plan->chunk;
    int ok = 1;
    plan->off_zs = take(&end, mul3(c, (size_t)v, f4), &ok);
    plan->off_zt = take(&end, mul3(c, zt_cols, f4), &ok);
    plan->off_xconv = take(&end, mul3(c, (size_t)plan->xconv_cols, f4), &ok);
    plan->off_xs32 = take(&end, sb ? mul3(c, (size_t)hs, f4) : 0, &ok);
    plan->off_panel = take(&end, plan->panel_floats * f4, &ok);
    plan->off_ws32 = take(&end, plan->whole ? mul3((size_t)v, (size_t)hs, f4) : 0, &ok);
    plan->off_wt32 = take(&end, plan->whole ? mul3((size_t)v, (size_t)ht, f4) : 0, &ok);
    plan->off_bias = take(&end, mul3((size_t)v, 2, f4), &ok);
    plan->off_dbs = take(&end, want_grad ? mul3((size_t)v, 1, f4) : 0, &ok);
    plan->off_rows = take(&end, mul3(c, 2, sizeof(double)), &ok);
    plan->off_dws = take(&end, sb && want_grad ? mul3((size_t)v, (size_t)hs, f4) : 0, &ok);
    plan->off_tk = take(&end, mul3(c, tk_row, 1), &ok);
    plan->off_stat = take(&end, mul3(c, (size_t)kd_fld_n_stats(topk_k), sizeof(double)), &ok);
    if (topk_k > 0 && !mul3(c, tk_row, 1)) ok = 0;
    /* a zero from mul3 where a region must be non-empty means overflow */
    if (!mul3(c, (size_t)v, f4) || (sb && want_grad && !mul3((size_t)v, (size_t)hs, f4))) ok = 0;
    return ok && !__builtin_add_overflow(end, (size_t)KD_FLD_ALIGN - 1, &plan->bytes);
}

/* The smallest budget that holds a one-row chunk: the fixed part `base` with the smallest
 * panel (16 weight rows of h, or V when fewer) plus one row (per_row bytes), into
 * plan->min_budget. A given budget below it is an error; the default (0) is 256 MiB, or this
 * minimum when shapes need more: *budget. */
static kdloss_status plan_budget(const kdloss_fused_linear_distill_params *p, int64_t v,
                                 int64_t h, size_t base, size_t per_row, kd_fld_plan *plan,
                                 size_t *budget) {
    size_t min_budget;
    if (__builtin_add_overflow(base, mul3((size_t)(v < 16 ? v : 16), (size_t)h, sizeof(float)),
                               &min_budget) ||
        __builtin_add_overflow(min_budget, per_row, &min_budget) || !per_row)
        return KDLOSS_ERR_INVALID_SIZE;
    plan->min_budget = min_budget;
    if (p->memory_budget && p->memory_budget < min_budget) return KDLOSS_ERR_BUDGET_TOO_SMALL;
    *budget = p->memory_budget ? p->memory_budget : KD_DEFAULT_BUDGET;
    if (*budget < min_budget) *budget = min_budget;
    return KDLOSS_OK;
}

kdloss_status kd_fld_plan_make(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs, int64_t ht,
                               int64_t v, int64_t topk_k, kdloss_dtype student_dtype,
                               int want_grad, kd_fld_plan *plan) {
    const size_t f4 = sizeof(float);
    int sb = student_dtype == KDLOSS_BF16;
    int64_t h = hs > ht ? hs : ht;

    /* a sparse teacher: no teacher logits, K slots of scratch a row instead */
    size_t zt_cols = topk_k > 0 ? 0 : (size_t)v;
    size_t tk_row = topk_k > 0 ? kd_topk_row_scratch(topk_k) : 0;
    if (topk_k > 0 && tk_row / (3 * sizeof(float) + sizeof(int64_t)) < (size_t)topk_k)
        return KDLOSS_ERR_INVALID_SIZE;
    /* xconv also holds a chunk's fp32 dxs rows before their cast (bf16) or all-reduce (the
     * vocabulary-parallel loss), so it has room for Hs columns whenever gradients are wanted */
    plan->xconv_cols = want_grad ? h : ht;
    size_t per_row = mul3((size_t)v + zt_cols, 1, f4) + mul3((size_t)plan->xconv_cols, 1, f4) +
                     (sb ? mul3((size_t)hs, 1, f4) : 0) + 2 * sizeof(double) + tk_row +
                     mul3((size_t)kd_fld_n_stats(topk_k), sizeof(double), 1);
    /* bytes that do not scale with the chunk besides the weights' panel or copies (the dWs
     * accumulator is output-sized state, so it is not counted against the budget) */
    size_t base = mul3((size_t)v, want_grad ? 3 : 2, f4);
    size_t copies = mul3((size_t)v, (size_t)(hs + ht), f4);
    if (!copies) return KDLOSS_ERR_INVALID_SIZE; /* v (hs + ht) 4 overflows; the rest cannot */
    int64_t want_rows = p->chunk_size > 0 && p->chunk_size < bt ? p->chunk_size : bt;
    size_t budget;
    kdloss_status st = plan_budget(p, v, h, base, per_row, plan, &budget);
    if (st != KDLOSS_OK) return st;

    /* Whole fp32 copies of bf16 weights only when the budget holds them AND a chunk of every
     * row (or of chunk_size rows): they never shrink the chunk, because the chunk matters more
     * than the copies (taller GEMMs run faster; panels and whole copies measured the same:
     * BENCHMARKS.md, "Fused-linear distillation loss"). */
    size_t need_whole;
    plan->whole = sb && !__builtin_mul_overflow(per_row, (size_t)want_rows, &need_whole) &&
                  !__builtin_add_overflow(need_whole, copies, &need_whole) &&
                  !__builtin_add_overflow(need_whole, base, &need_whole) && need_whole <= budget;
    size_t panel_bytes = budget / 8 < KD_PANEL_BYTES ? budget / 8 : KD_PANEL_BYTES;
    int64_t pr = (int64_t)(panel_bytes / ((size_t)h * f4)) / 16 * 16;
    plan->panel_rows = plan->whole ? v : pr < 16 ? (v < 16 ? v : 16) : pr < v ? pr : v;
    /* panel_rows <= V, so the panel's bytes are at most the copies', whose product was checked */
    plan->panel_floats = plan->whole ? 0 : (size_t)plan->panel_rows * (size_t)h;
    size_t fixed = base + (plan->whole ? copies : plan->panel_floats * f4);

    /* the chunk the rows had before the statistics held the entropy's double (fld_rows.h), when
     * it still fits with that double: the same chunk, hence the same bits, as before it */
    size_t avail = budget > fixed ? budget - fixed : 0, used;
    int64_t chunk = p->chunk_size > 0 ? p->chunk_size : auto_chunk(bt, avail, per_row - sizeof(double));
    if (p->chunk_size <= 0 &&
        (__builtin_mul_overflow((size_t)chunk, per_row, &used) || used > avail))
        chunk = auto_chunk(bt, avail, per_row);
    if (chunk > bt) chunk = bt;
    if (chunk > INT32_MAX) chunk = INT32_MAX; /* a GEMM dimension (CBLAS int) */
    plan->chunk = chunk;

    if (!plan_layout(plan, v, hs, ht, zt_cols, tk_row, topk_k, sb, want_grad))
        return KDLOSS_ERR_INVALID_SIZE;
    return KDLOSS_OK;
}

/* Shared checks of the size queries. */
static kdloss_status query_plan(const kdloss_fused_linear_distill_params *params, int64_t bt,
                                int64_t hs, int64_t ht, int64_t v, kdloss_dtype student_dtype,
                                int want_grad, size_t *bytes, kd_fld_plan *plan) {
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_fld_check_params(params);
    if (st != KDLOSS_OK) return st;
    st = kd_fld_check_sizes(bt, hs, ht, v);
    if (st != KDLOSS_OK) return st;
    if (student_dtype != KDLOSS_F32 && student_dtype != KDLOSS_BF16)
        return KDLOSS_ERR_INVALID_DTYPE;
    return kd_fld_plan_make(params, bt, hs, ht, v, 0, student_dtype, want_grad != 0, plan);
}

kdloss_status kdloss_fused_linear_distill_min_budget(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_plan plan;
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_fused_linear_distill_params p = *params;
    p.memory_budget = 0; /* the caller's budget is what is being sized */
    kdloss_status st = query_plan(&p, bt, hs, ht, v, student_dtype, want_grad, bytes, &plan);
    if (st != KDLOSS_OK) return st;
    *bytes = plan.min_budget;
    return KDLOSS_OK;
}

kdloss_status kdloss_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_plan plan;
    kdloss_status st = query_plan(params, bt, hs, ht, v, student_dtype, want_grad, bytes, &plan);
    if (st != KDLOSS_OK) return st;
    *bytes = plan.bytes;
    return KDLOSS_OK;
}

/* The JSD-only names: wrappers. */
kdloss_status kdloss_fljsd_min_budget(const kdloss_fljsd_params *params, int64_t bt, int64_t hs,
                                      int64_t ht, int64_t v, kdloss_dtype student_dtype,
                                      int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_fused_linear_distill_params p = kd_fld_from_jsd(params);
    return kdloss_fused_linear_distill_min_budget(&p, bt, hs, ht, v, student_dtype, want_grad,
                                                  bytes);
}

kdloss_status kdloss_fljsd_workspace_size(const kdloss_fljsd_params *params, int64_t bt,
                                          int64_t hs, int64_t ht, int64_t v,
                                          kdloss_dtype student_dtype, int want_grad,
                                          size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_fused_linear_distill_params p = kd_fld_from_jsd(params);
    return kdloss_fused_linear_distill_workspace_size(&p, bt, hs, ht, v, student_dtype,
                                                      want_grad, bytes);
}

/* The top-k size queries' shared checks and plan. */
static kdloss_status topk_query_plan(const kdloss_fused_linear_topk_distill_params *params,
                                     int64_t bt, int64_t hs, int64_t v, int64_t k,
                                     kdloss_dtype student_dtype, int want_grad, size_t *bytes,
                                     kd_fld_plan *plan) {
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_topk_check_fused_params(params);
    if (st != KDLOSS_OK) return st;
    st = kd_fld_check_sizes(bt, hs, hs, v);
    if (st != KDLOSS_OK) return st;
    if (k <= 0) return KDLOSS_ERR_INVALID_SIZE;
    if (student_dtype != KDLOSS_F32 && student_dtype != KDLOSS_BF16)
        return KDLOSS_ERR_INVALID_DTYPE;
    kdloss_fused_linear_distill_params p = kd_topk_fld_params(params);
    return kd_fld_plan_make(&p, bt, hs, 0, v, k, student_dtype, want_grad != 0, plan);
}

kdloss_status kdloss_fused_linear_topk_distill_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_plan plan;
    kdloss_status st =
        topk_query_plan(params, bt, hs, v, k, student_dtype, want_grad, bytes, &plan);
    if (st == KDLOSS_OK) *bytes = plan.bytes;
    return st;
}

kdloss_status kdloss_fused_linear_topk_distill_min_budget(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_plan plan;
    if (!params || !bytes) return KDLOSS_ERR_NULL_POINTER;
    kdloss_fused_linear_topk_distill_params p = *params;
    p.memory_budget = 0; /* the caller's budget is what is being sized */
    kdloss_status st = topk_query_plan(&p, bt, hs, v, k, student_dtype, want_grad, bytes, &plan);
    if (st == KDLOSS_OK) *bytes = plan.min_budget;
    return st;
}
