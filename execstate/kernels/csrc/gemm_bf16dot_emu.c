/* bf16 arithmetic without AVX512-BF16 (AVX2 + FMA): gemm_bf16dot.c's "bf16 dot order" computed
 * with fp32 FMAs, for CPUs that lack vdpbf16ps.
 *
 * The 16 lanes are two 8-lane vectors (lanes 0-7: columns 0-15 of a chunk, 8-15: columns
 * 16-31). A bf16 pair (x[2j], x[2j+1]) is one 32-bit word: the odd element is the word with
 * its low 16 bits cleared, the even one the word shifted left by 16, both exact fp32 values.
 * Lane j then takes fma(x_odd, w_odd, acc), fma(x_even, w_even, acc): a bf16 x bf16 product is
 * exact in fp32, so each FMA rounds the add once, as vdpbf16ps does. The lanes are summed by
 * the same tree (lo + hi, then hsum8). x is rounded as vcvtne2ps2bf16 rounds (nearest even,
 * subnormals to zero, NaN quieted). So the results equal the AVX512-BF16 kernels' bit for bit
 * except where vdpbf16ps flushes a subnormal product or sum (it does; FMA does not): a numerics
 * id of its own. */
#include "kernels.h"
#include "simd.h"

/* One fp32 as vcvtne2ps2bf16 rounds it. */
static inline uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* zero or subnormal: signed zero */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN, quieted */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void round_rows(const float *const *xr, uint16_t *xb, int64_t n, int64_t K, int64_t kp) {
    for (int64_t m = 0; m < n; m++) {
        for (int64_t k = 0; k < K; k++) xb[m * kp + k] = round_bf16(xr[m][k]);
        for (int64_t k = K; k < kp; k++) xb[m * kp + k] = 0;
    }
}

static KT inline __m256 odd(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))); }
static KT inline __m256 even(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

/* acc (lanes 0-7, 8-15) += one 32-column chunk of x row xc and weight row wc. */
static KT inline void chunk(const uint16_t *xc, const uint16_t *wc, __m256 *a, __m256 *b) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)xc), x1 = _mm256_loadu_si256((const __m256i *)(xc + 16));
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)wc), w1 = _mm256_loadu_si256((const __m256i *)(wc + 16));
    *a = _mm256_fmadd_ps(odd(x0), odd(w0), *a);
    *a = _mm256_fmadd_ps(even(x0), even(w0), *a);
    *b = _mm256_fmadd_ps(odd(x1), odd(w1), *b);
    *b = _mm256_fmadd_ps(even(x1), even(w1), *b);
}

/* dot(x row xc (padded to kp), weight row w (K columns)) in bf16 dot order. */
static KT float dot1(const uint16_t *xc, const uint16_t *w, int64_t K) {
    __m256 a = _mm256_setzero_ps(), b = a;
    const int64_t full = K & ~(int64_t)31;
    for (int64_t k = 0; k < full; k += 32) chunk(xc + k, w + k, &a, &b);
    if (full < K) { /* the weight's tail chunk, zero padded */
        uint16_t t[32] = {0};
        memcpy(t, w + full, sizeof(uint16_t) * (size_t)(K - full));
        chunk(xc + full, t, &a, &b);
    }
    return hsum8(_mm256_add_ps(a, b));
}

/* Two x rows by two weight rows, full chunks only (the caller adds nothing for a tail: see dot1). */
static KT void dot2x2(const uint16_t *xa, const uint16_t *xc, const uint16_t *w0, const uint16_t *w1, int64_t K,
                      float *out) {
    __m256 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k);
        chunk(xa + k, w0 + k, &a[0], &b[0]);
        chunk(xa + k, w1 + k, &a[1], &b[1]);
        chunk(xc + k, w0 + k, &a[2], &b[2]);
        chunk(xc + k, w1 + k, &a[3], &b[3]);
    }
    for (int i = 0; i < 4; i++) out[i] = hsum8(_mm256_add_ps(a[i], b[i]));
}

/* es_rows_fn: gemm_bf16dot.c's es_linear_rows_bf16dot on AVX2 + FMA (see the header). */
KT void es_linear_rows_bf16dot_emu(const float *const *xr, float *const *yr, int64_t M, const void *wv, int64_t K,
                                   int64_t n0, int64_t n1) {
    const uint16_t *w = (const uint16_t *)wv;
    const int64_t kp = (K + 31) & ~(int64_t)31;
    if (M <= 0 || n1 <= n0) return;
    uint16_t *xb = es_scratch(ES_SCRATCH_ROWS, sizeof(uint16_t) * (size_t)(M * kp));
    const int64_t step = xb ? M : 1;
    uint16_t one[xb ? 1 : kp]; /* no scratch: one row at a time on the stack (same bits) */
    if (!xb) xb = one;
    for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t m1 = m0 + step < M ? m0 + step : M;
        round_rows(xr + m0, xb, m1 - m0, K, kp);
        int64_t n = n0;
        if (K % 32 == 0)
            for (; n + 2 <= n1; n += 2) {
                int64_t m = m0;
                for (; m + 2 <= m1; m += 2) {
                    float o[4];
                    dot2x2(xb + (m - m0) * kp, xb + (m + 1 - m0) * kp, w + n * K, w + (n + 1) * K, K, o);
                    yr[m][n] = o[0]; yr[m][n + 1] = o[1]; yr[m + 1][n] = o[2]; yr[m + 1][n + 1] = o[3];
                }
                for (; m < m1; m++) {
                    yr[m][n] = dot1(xb + (m - m0) * kp, w + n * K, K);
                    yr[m][n + 1] = dot1(xb + (m - m0) * kp, w + (n + 1) * K, K);
                }
            }
        for (; n < n1; n++)
            for (int64_t m = m0; m < m1; m++) yr[m][n] = dot1(xb + (m - m0) * kp, w + n * K, K);
    }
}

KT int es_linear_bf16dot_emu(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N) {
    return es_linear_with(es_linear_rows_bf16dot_emu, x, w, y, M, K, N);
}

KT int es_moe_bf16dot_emu(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu,
                          const uint16_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return es_moe_with(es_linear_rows_bf16dot_emu, 32 * sizeof(uint16_t), x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
}
