/* The sparse renorm_both path compiled for the avx2 path (topk_sparse_impl.h). */
#define TS(name) name##_avx2
#include "topk_sparse_impl.h"
