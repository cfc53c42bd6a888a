/* AVX-512 build of the fused-linear row kernel (16 lanes; exp/log from simd.h). Compiled on
 * every x86-64 build; dispatch.c runs it only on CPUs that have AVX-512 F/BW/VL/DQ. */
#define KD_ISA_AVX512 1
#include "simd.h"
#include "div_simd.h"
#include "fld_rows_impl.h"
