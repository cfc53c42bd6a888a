/* Ends one instantiation of div_elem.h: undefines the element type and the op set that the
 * including file (div_math.h for scalar / CUDA, div_simd.h for the SIMD layer) defined for it.
 * No include guard: it is included once after every instantiation. */
#undef KDE_T
#undef KDE_M
#undef KDE_K
#undef KDE
#undef KDE_FN
#undef KE_ADD
#undef KE_SUB
#undef KE_MUL
#undef KE_DIV
#undef KE_MIN
#undef KE_MAX
#undef KE_ABS
#undef KE_NEG
#undef KE_EXP
#undef KE_EXP_NONPOS
#undef KE_EXP_NONNAN
#undef KE_EXP_IN
#undef KE_NABS_MIN
#undef KE_LOG1P_UNIT
#undef KE_C
#undef KE_GT
#undef KE_GE
#undef KE_LT
#undef KE_SEL
#undef KE_KEEP
