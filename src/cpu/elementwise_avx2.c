#define KD_ISA_AVX2 1
#include "elementwise_impl.h"
