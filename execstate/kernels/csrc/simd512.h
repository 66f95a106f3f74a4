/* AVX-512 helpers shared by the 16-lane kernels (gemm_bf16dot.c, gemm_gguf.c, gemm_packed.c,
 * prefill_attention.c, fused.c): the fixed lane tree that sums a 16-lane accumulator, one at a
 * time and 16 or 8 at a time (the same adds in the same tree, so the same bits); simd.h's 8-lane
 * sums of 8 accumulators' halves at once (hsum8_x16) and its exp8 on 16 lanes (exp16). */
#ifndef EXECSTATE_SIMD512_H
#define EXECSTATE_SIMD512_H

#include "simd.h"

#define K512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

/* hsum16: the lanes of one accumulator summed by the tree (i + i+8), (i + i+4), (i + i+2), (0 + 1). */
static K512 inline float hsum16(__m512 a) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}

/* hsum16 of 16 accumulators at once (lane r of the result = hsum16(a[r])): the same adds in the
 * same tree, the operands brought together by shuffles. */
static K512 inline __m512 hsum16_x16(const __m512 a[16]) {
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) /* lanes i + i+8: acc 2i in the low 256 bits, 2i + 1 in the high */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* i + i+4: quarter q holds acc 4i + q */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* i + i+2: quarter q holds acc 8i + q (lanes 0-1), 8i + 4 + q (2-3) */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* 0 + 1: lane 4q + e holds acc q + 4e */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, s);
}

/* hsum16 of 8 accumulators (lane r < 8 of the result = hsum16(a[r])): hsum16_x16's steps. */
static K512 inline __m256 hsum16_x8(const __m512 a[8]) {
    __m512 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* quarter q: lanes 0-1 acc q (from u[0]: accs 0-3), 2-3 acc q + 4 (u[1]) */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(w, w, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w, w, _MM_SHUFFLE(3, 1, 3, 1)));
    /* lane 4q holds acc q, lane 4q + 1 acc q + 4 */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, s));
}

/* simd.h's hsum8 of the low and the high 8 lanes of 8 accumulators at once: the same adds in
 * the same tree (lanes i + i+4, then 0+2 and 1+3, then those two), so the same bits. Result
 * lane 4q + e is half q % 2 of a[2e + q / 2]. */
static K512 inline __m512 hsum8_x16(const __m512 a[8]) {
    __m512 s[4];
    for (int i = 0; i < 4; i++) /* quarters: [a.lo s4, a.hi s4, b.lo s4, b.hi s4] */
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 v0 = _mm512_add_ps(_mm512_shuffle_ps(s[0], s[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(s[0], s[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 v1 = _mm512_add_ps(_mm512_shuffle_ps(s[2], s[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(s[2], s[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* simd.h's exp8 on 16 lanes: the same operations per lane (vroundps mode 8 = vrndscaleps mode 8,
 * the same converts, clamps and blends), so each lane is exp8's bits. */
static K512 inline __m512 exp16(__m512 in) {
    __m512 x = _mm512_min_ps(_mm512_max_ps(in, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    __m512 r = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(in, _mm512_set1_ps(88.72f), _CMP_GT_OQ), r, _mm512_set1_ps(INFINITY));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(in, _mm512_set1_ps(-87.33f), _CMP_LT_OQ), r, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(in, in, _CMP_UNORD_Q), r, in);
}

#endif
