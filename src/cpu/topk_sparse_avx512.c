/* The sparse renorm_both path compiled for the avx512 path (topk_sparse_impl.h). */
#define TS(name) name##_avx512
#include "topk_sparse_impl.h"
