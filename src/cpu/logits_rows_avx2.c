/* AVX2 build of the dense logits row kernel (logits_rows_impl.h). */
#define KD_ISA_AVX2 1
#include "simd.h"
#include "div_simd.h"
#include "logits_rows_impl.h"
