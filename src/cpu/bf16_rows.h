/* Row-block conversions between bf16 matrices (with a row stride) and contiguous fp32.
 * par = 1 runs them OpenMP over rows, par = 0 on the calling thread (small conversions). The
 * GEMMs between which they sit run on the same OpenMP threads (gemm.h), so a woken team has no
 * other pool to fight (with OpenBLAS's pthreads it had: BENCHMARKS.md). Never called inside a
 * parallel region. */
#ifndef KDLOSS_BF16_ROWS_H
#define KDLOSS_BF16_ROWS_H

#include <stdint.h>

/* dst (rows x cols, ld cols) = src (rows x cols, ld src_ld), exactly. */
void kd_bf16_rows_to_f32(const uint16_t *src, int64_t src_ld, int64_t rows, int64_t cols,
                         float *dst, int par);
/* dst (rows x cols, ld dst_ld) = src (rows x cols, ld src_ld) rounded to nearest even;
 * the padding of dst between rows is left alone. */
void kd_f32_rows_to_bf16(const float *src, int64_t src_ld, int64_t rows, int64_t cols,
                         uint16_t *dst, int64_t dst_ld, int par);

/* Rounds buf (rows x cols fp32, ld cols) to bf16 (nearest even) in place: row r's bf16 values
 * end at the start of its own fp32 row, so the result is a bf16 matrix of ld 2 cols at
 * (uint16_t *)buf; the second half of every row is left as it was. */
void kd_f32_rows_to_bf16_inplace(float *buf, int64_t rows, int64_t cols, int par);

#endif
