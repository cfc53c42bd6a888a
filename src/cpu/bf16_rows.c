#include "bf16_rows.h"

#include "half.h"

/* Below this many elements a conversion runs on one thread: waking the team costs more. */
#define KD_CONVERT_PAR_MIN (1 << 16)

static void bf16_row(const uint16_t *s, float *d, int64_t cols) {
    for (int64_t c = 0; c < cols; c++) d[c] = kd_bf16_to_f32(s[c]);
}

static void f32_row(const float *s, uint16_t *d, int64_t cols) {
    for (int64_t c = 0; c < cols; c++) d[c] = kd_f32_to_bf16(s[c]);
}

/* No parallel region at all when serial: libgomp mallocs a team for an if(0) region. */
void kd_bf16_rows_to_f32(const uint16_t *src, int64_t src_ld, int64_t rows, int64_t cols,
                         float *dst, int par) {
    if (par && rows * cols >= KD_CONVERT_PAR_MIN) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) bf16_row(src + r * src_ld, dst + r * cols, cols);
    } else {
        for (int64_t r = 0; r < rows; r++) bf16_row(src + r * src_ld, dst + r * cols, cols);
    }
}

void kd_f32_rows_to_bf16(const float *src, int64_t src_ld, int64_t rows, int64_t cols,
                         uint16_t *dst, int64_t dst_ld, int par) {
    if (par && rows * cols >= KD_CONVERT_PAR_MIN) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) f32_row(src + r * src_ld, dst + r * dst_ld, cols);
    } else {
        for (int64_t r = 0; r < rows; r++) f32_row(src + r * src_ld, dst + r * dst_ld, cols);
    }
}
