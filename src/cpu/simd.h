/* A thin vector layer so one generic kernel source compiles for AVX2 (8 lanes) and AVX-512
 * (16 lanes): the layer is KD_LAYER_AVX2 or KD_LAYER_AVX512, which the build defines for each
 * ISA's copy of a `*_vec.c` source (the registry's layer, isa.h; cmake/isas.cmake).
 * vf_exp / vf_log / vf_log1p_unit are kdloss's own inlined functions (vmath.h, error bounds
 * stated there and checked by tests/test_vmath_*.c), which replaced SLEEF's out-of-line calls
 * (slower, by BENCHMARKS.md's measurements).
 * Tails: vf_load_n / vf_store_n move n < VL elements through a zero-filled buffer, so the
 * tail of a row runs the very same arithmetic as its body. */
#ifndef KDLOSS_SIMD_H
#define KDLOSS_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h" /* KD_SFX */

#define KD_INLINE static inline __attribute__((always_inline))

#if defined(KD_LAYER_AVX512)

#define VL 16
typedef __m512 vf;
typedef __mmask16 vm;
KD_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
KD_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
KD_INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
KD_INLINE void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
KD_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
KD_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
KD_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
KD_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
KD_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
KD_INLINE vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
KD_INLINE vf vf_abs(vf a) { return _mm512_abs_ps(a); }
KD_INLINE vf vf_neg(vf a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
/* -min(|a|, c) for c > 0, a NaN giving -c: one vrangeps (min of magnitudes, sign set). */
KD_INLINE vf vf_nabs_min(vf a, vf c) { return _mm512_range_ps(a, c, 0x0E); }
KD_INLINE vm vm_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
KD_INLINE vm vm_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
KD_INLINE vm vm_ne(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ); }
KD_INLINE vm vm_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
/* m ? t : f, lane by lane */
KD_INLINE vf vf_select(vm m, vf t, vf f) { return _mm512_mask_blend_ps(m, f, t); }
/* m ? v : 0 (exactly +0, even where v is NaN) */
KD_INLINE vf vf_keep(vm m, vf v) { return _mm512_maskz_mov_ps(m, v); }
/* m ? a * b + c : a, and m ? a + b : a (one masked instruction each) */
KD_INLINE vf vf_mask_fmadd(vm m, vf a, vf b, vf c) { return _mm512_mask_fmadd_ps(a, m, b, c); }
KD_INLINE vf vf_mask_add(vm m, vf a, vf b) { return _mm512_mask_add_ps(a, m, a, b); }
KD_INLINE float vf_hsum(vf v) { return _mm512_reduce_add_ps(v); }
KD_INLINE float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }
KD_INLINE vf vf_load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
KD_INLINE vf vf_load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
KD_INLINE void vf_store_bf16(uint16_t *p, vf v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)); /* quiet NaN */
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, q);
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
KD_INLINE void vf_store_f16(uint16_t *p, vf v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* integer lanes, for exponent manipulation in vmath.h */
typedef __m512i vi;
KD_INLINE vi vf_as_vi(vf a) { return _mm512_castps_si512(a); }
KD_INLINE vf vi_as_vf(vi a) { return _mm512_castsi512_ps(a); }
KD_INLINE vf vf_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
KD_INLINE vi vf_to_vi(vf a) { return _mm512_cvtps_epi32(a); } /* a already integral */
KD_INLINE vf vi_to_vf(vi a) { return _mm512_cvtepi32_ps(a); }
KD_INLINE vi vi_set1(int x) { return _mm512_set1_epi32(x); }
KD_INLINE vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
KD_INLINE vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
KD_INLINE vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
KD_INLINE vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
KD_INLINE vi vi_srai(vi a, int n) { return _mm512_srai_epi32(a, (unsigned)n); }
KD_INLINE vi vi_srli(vi a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }
KD_INLINE vi vi_slli(vi a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
KD_INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
KD_INLINE vm vm_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
KD_INLINE vm vm_unord(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
KD_INLINE vm vm_or(vm a, vm b) { return (vm)(a | b); }
/* non-temporal store of a 64-byte aligned vector */
KD_INLINE void vf_stream(float *p, vf v) { _mm512_stream_ps(p, v); }
#define KD_VBYTES 64

#elif defined(KD_LAYER_AVX2)

#define VL 8
typedef __m256 vf;
typedef __m256 vm;
KD_INLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
KD_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
KD_INLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
KD_INLINE void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
KD_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
KD_INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
KD_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
KD_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
KD_INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
KD_INLINE vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
KD_INLINE vf vf_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
KD_INLINE vf vf_neg(vf a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
/* -min(|a|, c) for c > 0, a NaN giving -c (minps returns its second operand on a NaN). */
KD_INLINE vf vf_nabs_min(vf a, vf c) { return vf_neg(_mm256_min_ps(vf_abs(a), c)); }
KD_INLINE vm vm_gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
KD_INLINE vm vm_ge(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
KD_INLINE vm vm_ne(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_UQ); }
KD_INLINE vm vm_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
KD_INLINE vf vf_select(vm m, vf t, vf f) { return _mm256_blendv_ps(f, t, m); }
KD_INLINE vf vf_keep(vm m, vf v) { return _mm256_and_ps(m, v); }
KD_INLINE vf vf_mask_fmadd(vm m, vf a, vf b, vf c) { return _mm256_blendv_ps(a, _mm256_fmadd_ps(a, b, c), m); }
KD_INLINE vf vf_mask_add(vm m, vf a, vf b) { return _mm256_add_ps(a, _mm256_and_ps(m, b)); }
KD_INLINE float vf_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
KD_INLINE float vf_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
KD_INLINE vf vf_load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
KD_INLINE vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
KD_INLINE void vf_store_bf16(uint16_t *p, vf v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)); /* quiet NaN */
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, q, nan);
    /* pack 8 x u32 (each <= 0xffff) to 8 x u16; packus works per 128-bit lane, so fix the order */
    __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(pk));
}
KD_INLINE void vf_store_f16(uint16_t *p, vf v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

typedef __m256i vi;
KD_INLINE vi vf_as_vi(vf a) { return _mm256_castps_si256(a); }
KD_INLINE vf vi_as_vf(vi a) { return _mm256_castsi256_ps(a); }
KD_INLINE vf vf_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
KD_INLINE vi vf_to_vi(vf a) { return _mm256_cvtps_epi32(a); }
KD_INLINE vf vi_to_vf(vi a) { return _mm256_cvtepi32_ps(a); }
KD_INLINE vi vi_set1(int x) { return _mm256_set1_epi32(x); }
KD_INLINE vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
KD_INLINE vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
KD_INLINE vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
KD_INLINE vi vi_or(vi a, vi b) { return _mm256_or_si256(a, b); }
KD_INLINE vi vi_srai(vi a, int n) { return _mm256_srai_epi32(a, n); }
KD_INLINE vi vi_srli(vi a, int n) { return _mm256_srli_epi32(a, n); }
KD_INLINE vi vi_slli(vi a, int n) { return _mm256_slli_epi32(a, n); }
KD_INLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
KD_INLINE vm vm_lt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
KD_INLINE vm vm_unord(vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
KD_INLINE vm vm_or(vm a, vm b) { return _mm256_or_ps(a, b); }
KD_INLINE void vf_stream(float *p, vf v) { _mm256_stream_ps(p, v); }
#define KD_VBYTES 32

#else
#error "simd.h needs KD_LAYER_AVX2 or KD_LAYER_AVX512 (a *_vec.c source, compiled per ISA)"
#endif

/* n < VL elements through a zero-filled buffer (row tails). */
KD_INLINE vf vf_load_n(const float *p, int64_t n) {
    float b[VL] = {0};
    memcpy(b, p, (size_t)n * sizeof(float));
    return vf_load(b);
}
KD_INLINE void vf_store_n(float *p, vf v, int64_t n) {
    float b[VL];
    vf_store(b, v);
    memcpy(p, b, (size_t)n * sizeof(float));
}
/* lanes [0, n) set */
KD_INLINE vm vm_first_n(int64_t n) {
    float b[VL];
    for (int i = 0; i < VL; i++) b[i] = i < n ? 1.0f : 0.0f;
    return vm_gt(vf_load(b), vf_zero());
}

#include "vmath.h"

#endif /* KDLOSS_SIMD_H */
