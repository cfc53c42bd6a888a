/* The registry of CPU instruction sets: every ISA kdloss compiles for is one row of KD_ISAS,
 * and everything else (the run-time choice and the names in dispatch.c, the kernel tables, the
 * declarations of the per-ISA entry points, the CMake compile rules in cmake/isas.cmake, the
 * tests and the bench through kdloss.h's KDLOSS_ISA_COUNT) enumerates it. A row is
 *   X(ID, name, layer, has, "flags")
 *   ID     its kdloss_cpu_isa is KDLOSS_ISA_<ID> (kdloss.h); rows in enum order, from 1 (0 is
 *          AUTO), which is also the order of preference: AUTO takes the last row the CPU has
 *   name   kdloss_cpu_isa_name's string, KDLOSS_CPU_ISA's value and the suffix of the ISA's
 *          entry points (kd_kl_row_avx2)
 *   layer  the vector layer its generic sources compile against (simd.h: KD_LAYER_<layer>), or
 *          SCALAR: none (the reference kernels, *_scalar.c, alone)
 *   has    dispatch.c's test that this CPU can run it
 *   flags  the compiler flags of its sources (cmake/isas.cmake reads them from this file)
 * How to add an ISA: docs/ARCHITECTURE.md, "Instruction sets". */
#ifndef KDLOSS_CPU_ISA_H
#define KDLOSS_CPU_ISA_H

/* clang-format off */
#define KD_ISAS(X)                                                                              \
    X(SCALAR, scalar, SCALAR, kd_has_always, "")                                                \
    X(AVX2, avx2, AVX2, kd_has_avx2, "-mavx2 -mfma -mf16c")                                     \
    X(AVX512, avx512, AVX512, kd_has_avx512, "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2")
/* clang-format on */

/* KD_IF_VEC(layer, code): code when layer is a vector layer (the ISA compiles the *_vec.c
 * sources and has their entry points), nothing for SCALAR. One line per layer of simd.h. */
#define KD_IF_VEC(layer, ...) KD_IF_VEC_##layer(__VA_ARGS__)
#define KD_IF_VEC_SCALAR(...)
#define KD_IF_VEC_AVX2(...) __VA_ARGS__
#define KD_IF_VEC_AVX512(...) __VA_ARGS__

/* In a source compiled per ISA (*_isa.c, *_vec.c), the build defines KD_ISA_NAME (the row's
 * name) and KD_LAYER_<layer>; KD_SFX(f) is then f_<name>, the name of that ISA's copy of f. */
#define KD_SFX_CAT_(f, s) f##_##s
#define KD_SFX_CAT(f, s) KD_SFX_CAT_(f, s)
#define KD_SFX(f) KD_SFX_CAT(f, KD_ISA_NAME)

#endif /* KDLOSS_CPU_ISA_H */
