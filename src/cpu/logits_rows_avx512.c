/* AVX-512 build of the dense logits row kernel (logits_rows_impl.h); dispatch.c runs it only
 * on CPUs that have AVX-512 F/BW/VL/DQ. */
#define KD_ISA_AVX512 1
#include "simd.h"
#include "div_simd.h"
#include "logits_rows_impl.h"
