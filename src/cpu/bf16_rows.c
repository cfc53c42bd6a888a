#include "bf16_rows.h"

#include "half.h"
#include "omp_team.h"

#include <string.h>

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
    if (par && rows * cols >= KD_CONVERT_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) bf16_row(src + r * src_ld, dst + r * cols, cols);
    } else {
        for (int64_t r = 0; r < rows; r++) bf16_row(src + r * src_ld, dst + r * cols, cols);
    }
}

void kd_f32_rows_to_bf16(const float *src, int64_t src_ld, int64_t rows, int64_t cols,
                         uint16_t *dst, int64_t dst_ld, int par) {
    if (par && rows * cols >= KD_CONVERT_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) f32_row(src + r * src_ld, dst + r * dst_ld, cols);
    } else {
        for (int64_t r = 0; r < rows; r++) f32_row(src + r * src_ld, dst + r * dst_ld, cols);
    }
}

/* One row in place, a block at a time through a buffer: the block's bf16 bytes land at
 * [2 c0, 2 c1) of the row, below 4 c1, where the fp32 values not yet read start. */
#define KD_INPLACE_BLOCK 512
static void f32_row_inplace(float *row, int64_t cols) {
    uint16_t tmp[KD_INPLACE_BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += KD_INPLACE_BLOCK) {
        int64_t n = cols - c0 < KD_INPLACE_BLOCK ? cols - c0 : KD_INPLACE_BLOCK;
        f32_row(row + c0, tmp, n);
        memcpy((char *)row + 2 * c0, tmp, (size_t)n * sizeof(uint16_t));
    }
}

void kd_f32_rows_to_bf16_inplace(float *buf, int64_t rows, int64_t cols, int par) {
    if (par && rows * cols >= KD_CONVERT_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) f32_row_inplace(buf + r * cols, cols);
    } else {
        for (int64_t r = 0; r < rows; r++) f32_row_inplace(buf + r * cols, cols);
    }
}
