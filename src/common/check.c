#include "check.h"

#include <stdint.h>

int kd_is_float_dtype(kdloss_dtype dt) {
    return dt == KDLOSS_F32 || dt == KDLOSS_BF16 || dt == KDLOSS_F16;
}

kdloss_status kd_check_fmat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                            int64_t ld, int64_t *ld_out, kd_span *span) {
    if (!data) return KDLOSS_ERR_NULL_POINTER;
    if (rows <= 0 || cols <= 0) return KDLOSS_ERR_INVALID_SIZE;
    if (!kd_is_float_dtype(dt)) return KDLOSS_ERR_INVALID_DTYPE;
    if (ld == 0) ld = cols;
    if (ld < cols) return KDLOSS_ERR_INVALID_STRIDE;
    int64_t es = (int64_t)kdloss_dtype_size(dt);
    /* elements spanned = (rows - 1) * ld + cols; it and its byte count must fit in int64 */
    if (rows - 1 > (INT64_MAX - cols) / ld) return KDLOSS_ERR_INVALID_SIZE;
    int64_t n = (rows - 1) * ld + cols;
    if (n > INT64_MAX / es) return KDLOSS_ERR_INVALID_SIZE;
    if ((uint64_t)(n * es) > (uint64_t)(UINTPTR_MAX - (uintptr_t)data))
        return KDLOSS_ERR_INVALID_SIZE;
    *ld_out = ld;
    span->lo = (const char *)data;
    span->hi = (const char *)data + n * es;
    return KDLOSS_OK;
}

kd_span kd_vec_span(const void *data, int64_t n, size_t elem) {
    kd_span s = {(const char *)data, (const char *)data};
    if (data && n > 0) s.hi += (size_t)n * elem;
    return s;
}

int kd_spans_overlap(kd_span a, kd_span b) {
    if (a.lo == a.hi || b.lo == b.hi) return 0;
    return a.lo < b.hi && b.lo < a.hi;
}

kdloss_status kd_check_labels(kdloss_labels labels, int64_t bt, int64_t v, int64_t ignore_index,
                              int64_t *n_valid) {
    if (!labels.data) return KDLOSS_ERR_NULL_POINTER;
    if (labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32) return KDLOSS_ERR_INVALID_DTYPE;
    int64_t n = 0;
    for (int64_t r = 0; r < bt; r++) {
        int64_t y = kd_label_at(labels, r);
        if (y == ignore_index) continue;
        if (y < 0 || y >= v) return KDLOSS_ERR_LABEL_OUT_OF_RANGE;
        n++;
    }
    *n_valid = n;
    return KDLOSS_OK;
}
