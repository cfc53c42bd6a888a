/* AVX2 + FMA build of the fused-linear row kernel (8 lanes, SLEEF u10 exp/log). */
#define KD_ISA_AVX2 1
#include "simd.h"
#include "div_simd.h"
#include "fljsd_rows_impl.h"
