/* AVX2 + FMA build of the GEMM layer's allocation-free fallback (gemm_fb.h): 6 x 16 tile. */
#define KD_ISA_AVX2 1
#include "simd.h"
#include "gemm_fb_impl.h"
