/* Shared by the execstate CPU kernels: target attribute, thresholds, prefetch, lane sums, exp.
 * See module.c for the numerics contract every kernel keeps. */
#ifndef EXECSTATE_SIMD_H
#define EXECSTATE_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KT __attribute__((target("avx2,fma")))
/* Below this many multiply-adds a call runs on one thread (fork/join costs more). */
#define PARALLEL_MIN_MACS 65536
/* Software prefetch of the weight rows PF_ROWS ahead into L2 (hint T1): the hardware
 * prefetcher alone leaves a core short of DRAM parallelism (measured on 2 Zen cores, a
 * 1536x512 weight: M=1 21 -> 29 GB/s, M=8 12 -> 20 GB/s). */
#define PF_ROWS 8
#define PF(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)

static KT inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum8 of 8 accumulators at once, r[u] = hsum8(a[u]): the same adds in the same tree (lanes
 * i + i+4, then 0+2 and 1+3, then those two; IEEE adds commute exactly), so the same bits. */
static KT inline __m256 hsum8_x8(const __m256 a[8]) {
    __m256 s[4]; /* [a[2i] lanes i + i+4 | a[2i+1] lanes i + i+4] */
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    /* per 128-bit half: (0+2, 1+3) of two accumulators */
    const __m256 v0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 v1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(3, 2, 3, 2)));
    /* low half: a0 a2 a4 a6, high half: a1 a3 a5 a7 */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static KT inline float finish(__m256 acc, const float *w, const float *x, int64_t k8, int64_t K) {
    float s = hsum8(acc);
    for (int64_t k = k8; k < K; k++) s = fmaf(w[k], x[k], s);
    return s;
}

/* A bf16 (uint16 bit pattern) as fp32: exact, a bf16 is the top half of an fp32. */
static inline float widen1(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n rows of d bf16 values (row stride `stride` elements) as fp32 rows of d floats at dst: exact. */
static KT inline void widen_rows(const uint16_t *src, int64_t stride, int64_t n, int64_t d, float *dst) {
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t r = 0; r < n; r++, src += stride, dst += d) {
        int64_t i = 0;
        for (; i < d8; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))), 16)));
        for (; i < d; i++) dst[i] = widen1(src[i]);
    }
}

/* fp32 -> bf16, round to nearest even, subnormals kept; NaN -> 0x7FC0 (torch's conversion, bit
 * for bit; gemm_bf16dot_emu.c's round_bf16 flushes subnormals as vcvtne2ps2bf16 does). */
static inline uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* finish() with bf16 weights: the lane sum, then the K % 8 tail on widened weights. */
static KT inline float finish_bf16(__m256 acc, const uint16_t *w, const float *x, int64_t k8, int64_t K) {
    float s = hsum8(acc);
    for (int64_t k = k8; k < K; k++) s = fmaf(widen1(w[k]), x[k], s);
    return s;
}

/* s[j] = dot(q, k_j) * scale for four key rows k0..k3 of width d (d8 = d rounded down to 8):
 * the attention scores of the decode and prefill kernels, four keys per pass over q. */
static KT inline void scores4(const float *qg, const float *k0, const float *k1, const float *k2, const float *k3,
                              int64_t d8, int64_t d, float scale, float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 qv = _mm256_loadu_ps(qg + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), qv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + i), qv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + i), qv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + i), qv, a3);
    }
    s[0] = finish(a0, k0, qg, d8, d) * scale;
    s[1] = finish(a1, k1, qg, d8, d) * scale;
    s[2] = finish(a2, k2, qg, d8, d) * scale;
    s[3] = finish(a3, k3, qg, d8, d) * scale;
}

/* One key row's score, rounded as each of scores4's. */
static KT inline float score1(const float *qg, const float *k0, int64_t d8, int64_t d, float scale) {
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), _mm256_loadu_ps(qg + i), a0);
    return finish(a0, k0, qg, d8, d) * scale;
}

/* This thread's share [*lo, *hi) of `total` rows, in multiples of 4 rows. */
static inline void share(int64_t total, int64_t *lo, int64_t *hi) {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int64_t blocks = (total + 3) / 4;
    int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    *lo = b0 * 4 < total ? b0 * 4 : total;
    *hi = b1 * 4 < total ? b1 * 4 : total;
}

/* exp on 8 lanes: Cody-Waite range reduction and a degree-5 polynomial (Cephes expf),
 * about 1 ulp for x in [-87, 88]; +inf above 88.72 (overflow, as expf), 0 below -87.33
 * (where expf would be subnormal), NaN stays NaN. */
static KT inline __m256 exp8(__m256 in) {
    __m256 x = _mm256_min_ps(_mm256_max_ps(in, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    __m256 r = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(in, _mm256_set1_ps(88.72f), _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(in, _mm256_set1_ps(-87.33f), _CMP_LT_OQ));
    return _mm256_blendv_ps(r, in, _mm256_cmp_ps(in, in, _CMP_UNORD_Q));
}

static KT inline float exp1(float x) { return _mm256_cvtss_f32(exp8(_mm256_set1_ps(x))); }

/* softmax_numerators from position l on, given the scores' max mx and acc, the 8-lane sum of the
 * numerators before l (8-lane chunks in order): the rest 8 lanes at a time, then the tail in
 * order. The end shared with prefill_attention.c's 16-lane softmax_numerators16 (same bits). */
static KT inline float softmax_numerators_from(float *s, int64_t L, int64_t l, float mx, __m256 acc) {
    for (; l + 8 <= L; l += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(s + l, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; l < L; l++) {
        s[l] = exp1(s[l] - mx);
        sum += s[l];
    }
    return sum;
}

/* Softmax over attention scores: s[l] <- exp(s[l] - max) for l < L; returns the sum (8 lanes,
 * then the tail in order). One definition for the decode and prefill kernels (same bits). */
static KT inline float softmax_numerators(float *s, int64_t L) {
    float mx = -INFINITY;
    for (int64_t l = 0; l < L; l++) mx = s[l] > mx ? s[l] : mx;
    return softmax_numerators_from(s, L, 0, mx, _mm256_setzero_ps());
}

#endif
