/* Internals of the CPU fused-linear distillation loss: the checked form of a call and the
 * workspace plan (fld_check.c), used by the driver (fld.c). */
#ifndef KDLOSS_FLD_H
#define KDLOSS_FLD_H

#include <stddef.h>
#include <stdint.h>

#include "args.h" /* kd_fld_teacher, the shared checks */
#include "kdloss.h"

/* Alignment of every workspace region (a cache line, and an AVX-512 vector). */
#define KD_FLD_ALIGN 64

/*
 * Workspace layout, region by region, each starting on a 64-byte boundary of the (aligned)
 * workspace; `chunk` rows per chunk, H = max(Hs, Ht), sb = student is bf16:
 *   zs     chunk x V   fp32  student logits of the chunk, then dzs in place
 *   zt     chunk x V   fp32  teacher logits of the chunk, then the JSD gradient g
 *   xconv  chunk x Hx  fp32  teacher rows converted from bf16; then, for a bf16 student, dxs
 *                            before its cast (Hx = H when sb and gradients, else Ht)
 *   xs32   chunk x Hs  fp32  student rows converted from bf16 (sb only); kept for dWs
 *   panel  pr x H      fp32  one panel of pr = panel_rows bf16 weight rows converted, or the
 *                            logits GEMMs' per-thread slots (kd_sgemm_nt_b16) (not when whole)
 *   ws32   V x Hs      fp32  whole fp32 copy of a bf16 ws (whole only)
 *   wt32   V x Ht      fp32  whole fp32 copy of a bf16 wt (whole only)
 *   bias   2 x V       fp32  bs and bt converted to fp32
 *   dbs    V           fp32  dbs accumulator (gradients only)
 *   rows   2 x chunk   f64   per-row soft and hard loss terms of the chunk
 *   dws    V x Hs      fp32  dWs accumulator across chunks (sb and gradients only)
 *   tk     chunk x kd_topk_row_scratch(K) bytes: a sparse teacher's per-row scratch
 *   stat   chunk x kd_fld_n_stats(K) f64: the row phases' statistics (fld_rows.h), the
 *          entropy's sum included
 * A sparse teacher (K slots) has no zt, no teacher rows and no teacher weights (Ht = 0).
 * The teacher's dtype is not an argument of kdloss_fljsd_workspace_size(), so the layout
 * reserves the teacher's conversion space (xconv, panel, wt32) whatever that dtype is.
 * `whole` (bf16 weights converted once per call) is chosen only for a bf16 student, and only
 * when the budget holds both copies besides a chunk of all rows (of chunk_size rows when it is
 * set), so the copies never shrink the chunk; otherwise the panel region (at most 16 MiB and 1/8
 * of the budget) holds the slots in which the logits GEMMs widen their tiles' rows of W, and
 * the panels dXs widens, once per GEMM that reads them.
 */
typedef struct kd_fld_plan {
    int64_t chunk;   /* rows per chunk, 1..BT */
    int64_t panel_rows; /* weight rows per converted panel (V when whole) */
    size_t panel_floats; /* floats of the panel region: panel_rows x H (0 when whole) */
    int whole;       /* bf16 weights converted once into ws32 / wt32 */
    int64_t xconv_cols;
    size_t off_zs, off_zt, off_xconv, off_xs32, off_panel, off_ws32, off_wt32, off_bias, off_dbs,
        off_rows, off_dws, off_tk, off_stat;
    size_t bytes;    /* total, including KD_FLD_ALIGN - 1 bytes to align the caller's pointer */
    size_t min_budget; /* smallest memory_budget that holds a one-row chunk */
} kd_fld_plan;

/* Lays the workspace out for these arguments (see above). Errors: KDLOSS_ERR_INVALID_SIZE
 * when the byte counts overflow, KDLOSS_ERR_BUDGET_TOO_SMALL when a non-zero memory_budget
 * cannot hold a one-row chunk. */
kdloss_status kd_fld_plan_make(const kdloss_fused_linear_distill_params *p, int64_t bt, int64_t hs, int64_t ht,
                               int64_t v, int64_t topk_k, kdloss_dtype student_dtype,
                               int want_grad, kd_fld_plan *plan);

/* The teacher of a fused call (kd_fld_teacher) is src/common/args.h's, shared with CUDA. */

/* A call whose every argument has been checked: matrix views carry their effective ld. */
typedef struct kd_fld_call {
    kdloss_fused_linear_distill_params p;
    int64_t bt, hs, ht, v;
    kdloss_cmat xs, ws, xt, wt;
    const void *bs, *bt_bias;
    kdloss_topk_teacher topk; /* a sparse teacher with effective lds (topk.k > 0), or k = 0 */
    int tail;
    kdloss_labels labels;
    kdloss_fused_linear_distill_out out;
    int64_t n_valid; /* rows kept: label not ignore_index, row weight (if any) not 0 */
    int grad;        /* some gradient output is wanted */
    const kdloss_comm *comm; /* vocabulary-parallel: the ranks' communicator; NULL otherwise */
    int64_t v_lo;    /* vocabulary-parallel: the global id of this rank's first row */
    const kdloss_teacher_heads *heads; /* several teachers (checked), or NULL: wt is the one */
} kd_fld_call;

/* Checks every argument (src/common/args_fld.c's checks with the CPU's rules: params, sizes,
 * dtypes, strides, a sparse teacher's ids, labels, outputs; then the plan; then the workspace
 * size and aliasing) and fills *call and *plan. Writes nothing the caller owns. Labels are
 * optional with a sparse teacher only (then nothing may need them: no cross-entropy). */
kdloss_status kd_fld_check(const kdloss_fused_linear_distill_params *params, int64_t bt,
                           int64_t hs, int64_t v, int64_t v_ids, kdloss_cmat xs, kdloss_cmat ws,
                           const void *bs, const kd_fld_teacher *t, kdloss_labels labels,
                           const kdloss_fused_linear_distill_out *out, const void *workspace,
                           size_t workspace_bytes, kd_fld_call *call, kd_fld_plan *plan);

/* Runs a checked call: the caller's workspace or one allocated here, the sparse renorm_both path
 * or the chunked one. v_ids (above) is the range of labels and teacher ids: V, or the whole
 * vocabulary of a vocabulary-parallel call (whose call->comm and v_lo the caller sets). */
kdloss_status kd_fld_execute(const kd_fld_call *call, const kd_fld_plan *plan,
                             void *workspace);

/* Reserves the GEMM layer's fallback scratch for a checked call's products (gemm.h), as the
 * chunk loop does before it writes anything: KDLOSS_OK or KDLOSS_ERR_OUT_OF_MEMORY. The
 * vocabulary-parallel entry points call it before the agreement, so that this failure is reported
 * there (every rank returns) rather than after it (the others would wait). */
kdloss_status kd_fld_prepare(const kd_fld_call *call, const kd_fld_plan *plan);

/* ---- Shared by the fused drivers (fld.c, fld_topk.c, fld_multi.c) ---- */

static inline int64_t kd_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Checks a call with either teacher form, then runs it (kd_fld_check, kd_fld_execute). */
kdloss_status kd_fld_run_checked(const kdloss_fused_linear_distill_params *params, int64_t bt,
                                 int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                                 const void *bs, const kd_fld_teacher *t, kdloss_labels labels,
                                 kdloss_fused_linear_distill_out *out, void *workspace,
                                 size_t workspace_bytes);
/* [n] fp32 src stored as dt (fp32 copy, or rounded to bf16). */
void kd_fld_store_vec(const float *src, int64_t n, kdloss_dtype dt, void *dst);
/* Fills a (rows x cols, ld) matrix of its dtype with zeros. */
void kd_fld_zero_mat(kdloss_mat m, int64_t rows, int64_t cols);
/* The three scalar losses, where asked for. */
void kd_fld_write_losses(const kdloss_fused_linear_distill_out *o, float loss, float soft,
                         float hard);
/* Every row ignored, or nothing weighted or asked for: loss 0, zero row outputs and gradients. */
void kd_fld_write_zero(const kd_fld_call *k);
/* [v] bias of dtype dt as fp32 (widened into buf when bf16); NULL stays NULL. */
const float *kd_fld_bias_f32(const void *b, kdloss_dtype dt, int64_t v, float *buf);

#endif /* KDLOSS_FLD_H */
