/* The sparse renorm_both path compiled for the scalar path (topk_sparse_impl.h). */
#define TS(name) name##_scalar
#include "topk_sparse_impl.h"
