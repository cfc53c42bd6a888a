/* AVX-512 build of the GEMM layer's allocation-free fallback (gemm_fb.h): 12 x 32 register tile,
 * transposing packs through 16 x 16 in-register transposes. */
#define KD_ISA_AVX512 1
#include "simd.h"
#include "gemm_fb_impl.h"
