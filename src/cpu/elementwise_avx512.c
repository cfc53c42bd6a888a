#define KD_ISA_AVX512 1
#include "elementwise_impl.h"
