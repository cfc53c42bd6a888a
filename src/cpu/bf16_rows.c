#include "bf16_rows.h"

#include "half.h"

/* Below this many elements a conversion runs on one thread: waking the team costs more. */
#define KD_CONVERT_PAR_MIN (1 << 16)

void kd_bf16_rows_to_f32(const uint16_t *src, int64_t src_ld, int64_t rows, int64_t cols,
                         float *dst, int par) {
#pragma omp parallel for schedule(static) if (par && rows * cols >= KD_CONVERT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *s = src + r * src_ld;
        float *d = dst + r * cols;
        for (int64_t c = 0; c < cols; c++) d[c] = kd_bf16_to_f32(s[c]);
    }
}

void kd_f32_rows_to_bf16(const float *src, int64_t src_ld, int64_t rows, int64_t cols,
                         uint16_t *dst, int64_t dst_ld, int par) {
#pragma omp parallel for schedule(static) if (par && rows * cols >= KD_CONVERT_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * src_ld;
        uint16_t *d = dst + r * dst_ld;
        for (int64_t c = 0; c < cols; c++) d[c] = kd_f32_to_bf16(s[c]);
    }
}
