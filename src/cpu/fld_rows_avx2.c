/* AVX2 + FMA build of the fused-linear row kernel (8 lanes; exp/log from simd.h). */
#define KD_ISA_AVX2 1
#include "simd.h"
#include "div_simd.h"
#include "fld_rows_impl.h"
