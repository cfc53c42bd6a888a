/* Internals of the CPU sparse top-k teacher loss (kdloss.h, docs/MATH.md section 8): the ids'
 * value check and the sparse renorm_both path. The row math is src/common/topk_row.h; the
 * full-vocabulary row pass is the fused loss's row kernel (fld_rows.h, kd_fld_rows.topk). */
#ifndef KDLOSS_CPU_TOPK_H
#define KDLOSS_CPU_TOPK_H

#include <stdint.h>

#include "div_coef.h"
#include "half.h"
#include "isa.h"
#include "fld.h"

/* kd_topk_check_ids (the ids' values): src/common/check.h. */

/* Log-prob in slot j of teacher row r as fp32 (the teacher's lds effective). */
static inline float kd_topk_logprob(const kdloss_topk_teacher *t, int64_t r, int64_t j) {
    const char *p = (const char *)t->logprobs.data +
                    (size_t)(r * t->logprobs.ld + j) * kdloss_dtype_size(t->logprobs.dtype);
    switch (t->logprobs.dtype) {
    case KDLOSS_BF16: return kd_bf16_to_f32(*(const uint16_t *)p);
    case KDLOSS_F16: return kd_f16_to_f32(*(const uint16_t *)p);
    default: return *(const float *)p;
    }
}

/* Bytes of per-row scratch the row kernels need for K slots: the slots' local columns and their
 * count (K + 1 int64), then their logits, log-probs and gradients (3 K floats); a multiple of 64. */
static inline size_t kd_topk_row_scratch(int64_t k) {
    /* unsigned: a huge K wraps (defined) and the caller's check catches it */
    size_t b = ((size_t)k + 1) * sizeof(int64_t) + (size_t)k * 3 * sizeof(float);
    return (b + 63) / 64 * 64;
}

/* ---- The sparse renorm_both path (docs/MATH.md section 8, "Sparse path") ---- */

/* One chunk of rows [row0, row0 + n) of the sparse path. Shapes: xs (BT x Hs) and ws (V x Hs)
 * of xdt (F32 or BF16), bs [V] fp32 or NULL; the teacher's K slots per row. */
typedef struct kd_topk_sparse {
    int64_t n, row0, hs;
    const char *xs;            /* the student's rows, xdt, stride ldx */
    kdloss_dtype xdt;
    int64_t ldx;
    const char *ws;            /* the LM head, xdt, stride ldw */
    int64_t ldw;
    const float *bs;           /* [V] fp32 bias, or NULL */
    const kdloss_topk_teacher *topk;
    kdloss_labels labels;      /* data NULL: every row kept */
    int64_t ignore_index;
    kd_div_coef coef;
    double inv_t;              /* 1 / T */
    float gs;                  /* d loss / d zs = gs dD/du; 0: no gradient */
    float *x32;                /* n x hs: the chunk's rows widened (bf16 student), else NULL */
    float *d32;                /* n x hs: fp32 dxs rows before their cast (bf16 student) */
    char *tk;                  /* n x kd_topk_row_scratch(K): slots; gk holds d loss / d zs_k */
    double *row_soft;          /* [n] out */
    kdloss_mat dxs;            /* the caller's (BT x Hs), or data NULL */
    float *dws;                /* (V x Hs, ld ldd) fp32 accumulator of dWs, or NULL */
    int64_t ldd;
    float *dbs;                /* [V] fp32 accumulator of dbs, or NULL */
    const float *w;            /* [BT] row weights (docs/MATH.md section 12), or NULL: all 1; a
                                  row of weight 0 is ignored, a kept row's gradient times w */
} kd_topk_sparse;

/* The chunk's rows: selected logits by dot products, kd_topk_row, slot gradients, dxs rows
 * (OpenMP over rows). Then the scatter: dws[id] += dz_k xs_row and dbs[id] += dz_k in row order
 * (OpenMP over blocks of hidden columns), so results do not depend on the thread count.
 * One pair per ISA of the registry (isa.h; topk_sparse_isa.c). */
#define KD_TOPK_SPARSE_DECL(ID, name, layer, has, flags)                                        \
    void kd_topk_sparse_rows_##name(const kd_topk_sparse *a);                                   \
    void kd_topk_sparse_scatter_##name(const kd_topk_sparse *a);
KD_ISAS(KD_TOPK_SPARSE_DECL)
#undef KD_TOPK_SPARSE_DECL

/* The sparse path's row of fld.c's path table (fld_topk.c): whether a checked call takes it (no
 * communicator, and nothing that needs the full logits), the workspace it uses when allocated
 * for it (at most plan->bytes), and the run on an aligned workspace `base`. */
int kd_topk_sparse_takes(const kd_fld_call *k);
size_t kd_topk_sparse_bytes(const kd_fld_call *k, const kd_fld_plan *pl);
kdloss_status kd_topk_sparse_run(const kd_fld_call *k, const kd_fld_plan *pl, char *base);

#endif /* KDLOSS_CPU_TOPK_H */
