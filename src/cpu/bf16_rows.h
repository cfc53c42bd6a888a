/* Row-block conversions between bf16 matrices (with a row stride) and contiguous fp32.
 * par = 1 runs them OpenMP over rows (large, one-off conversions); par = 0 on the calling thread,
 * for conversions that sit between BLAS calls: an OpenMP team woken there keeps spinning while
 * the next GEMM runs and fights OpenBLAS's own threads for the cores (measured: the bf16 path
 * at BT 1024, V 32768 took 1.47x its GEMM floor with parallel panel conversions, 1.11x with
 * OMP_WAIT_POLICY=passive, i.e. without the fight). Never called inside a parallel region. */
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

#endif
