/* Internals of the CPU sparse top-k teacher loss (kdloss.h, docs/MATH.md section 8): the ids'
 * value check and the sparse renorm_both path. The row math is src/common/topk_row.h; the
 * full-vocabulary row pass is the fused loss's row kernel (fljsd_rows.h, kd_fljsd_rows.topk). */
#ifndef KDLOSS_CPU_TOPK_H
#define KDLOSS_CPU_TOPK_H

#include <stdint.h>

#include "fljsd.h"

/* Every row's ids (teacher.ids with its effective ld): each is -1 or in [0, v), and no used id
 * repeats within a row; else KDLOSS_ERR_INVALID_ID. OUT_OF_MEMORY if its scratch (a bitmap of
 * v bits, on the stack up to 2^18 ids) cannot be allocated. Writes nothing the caller owns. */
kdloss_status kd_topk_check_ids(kdloss_topk_teacher t, int64_t bt, int64_t v);

/* Bytes of per-row scratch the row kernel needs for K slots: gathered logits, log-probs and
 * slot gradients (3 K floats) and the gathered column indices (K int64), 64-byte multiples. */
static inline size_t kd_topk_row_scratch(int64_t k) {
    size_t b = (size_t)k * (3 * sizeof(float) + sizeof(int64_t));
    return (b + 63) / 64 * 64;
}

#endif /* KDLOSS_CPU_TOPK_H */
