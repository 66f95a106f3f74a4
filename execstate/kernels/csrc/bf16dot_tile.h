/* The bf16 dot order's building blocks (gemm_bf16dot.c's header states the order): x rows
 * rounded to bf16, a P x J tile of vdpbf16ps accumulators, and its sums by hsum16's tree.
 * Shared by the linears (gemm_bf16dot.c) and the fused MoE (moe_bf16dot.c), so both compute
 * every output the same way. */
#ifndef ES_BF16DOT_TILE_H
#define ES_BF16DOT_TILE_H

#include "kernels.h"
#include "simd.h"
#include "simd512.h"

#define KB __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))

/* Rows xr[m0 .. m0 + n) as bf16 into xb (row stride kp elements, zero padded past K). */
static KB inline void round_rows(const float *const *xr, uint16_t *xb, int64_t n, int64_t K, int64_t kp) {
    for (int64_t m = 0; m < n; m++) {
        const float *x = xr[m];
        uint16_t *o = xb + m * kp;
        for (int64_t k = 0; k < kp; k += 32) {
            const int64_t left = K - k;
            const __mmask16 lo = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __mmask16 hi = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + k + 16), _mm512_maskz_loadu_ps(lo, x + k));
            _mm512_storeu_si512(o + k, (__m512i)v);
        }
    }
}

#define P_MAX 4 /* x rows per tile */
#define J_MAX 6 /* weight rows per tile: 24 accumulators */

/* One P x J tile: x rows xb[0 .. P) (stride kp), weight rows w0 .. w0 + (J - 1) K; nfull full
 * chunks then, when tail_mask, one masked chunk. */
static KB inline __attribute__((always_inline)) void tile(const uint16_t *xb, int64_t kp, int P, const uint16_t *w0,
                                                         int64_t K, int J, int64_t nfull, __mmask32 tail_mask,
                                                         int prefetch, __m512 acc[P_MAX][J_MAX]) {
    for (int p = 0; p < P_MAX; p++)
        for (int j = 0; j < J_MAX; j++) acc[p][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nfull; c++) {
        const int64_t k = 32 * c;
        __m512i xv[P_MAX];
        for (int p = 0; p < P_MAX; p++)
            if (p < P) xv[p] = _mm512_loadu_si512(xb + p * kp + k);
        for (int j = 0; j < J_MAX; j++)
            if (j < J) {
                if (prefetch) PF(w0 + (PF_ROWS + j) * K + k);
                const __m512i wv = _mm512_loadu_si512(w0 + j * K + k);
                for (int p = 0; p < P_MAX; p++)
                    if (p < P) acc[p][j] = _mm512_dpbf16_ps(acc[p][j], (__m512bh)xv[p], (__m512bh)wv);
            }
    }
    if (tail_mask) {
        const int64_t k = 32 * nfull;
        __m512i xv[P_MAX];
        for (int p = 0; p < P_MAX; p++)
            if (p < P) xv[p] = _mm512_loadu_si512(xb + p * kp + k);
        for (int j = 0; j < J_MAX; j++)
            if (j < J) {
                const __m512i wv = _mm512_maskz_loadu_epi16(tail_mask, w0 + j * K + k);
                for (int p = 0; p < P_MAX; p++)
                    if (p < P) acc[p][j] = _mm512_dpbf16_ps(acc[p][j], (__m512bh)xv[p], (__m512bh)wv);
            }
    }
}

/* s[p * J + j] = the tile's P x J sums (hsum16 of each accumulator), 16 and 8 at a time, then singly. */
static KB inline __attribute__((always_inline)) void tile_sums(__m512 acc[P_MAX][J_MAX], int P, int J, float *s) {
    __m512 a[P_MAX * J_MAX];
    const int count = P * J;
    for (int p = 0; p < P; p++)
        for (int j = 0; j < J; j++) a[p * J + j] = acc[p][j];
    int i = 0;
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(s + i, hsum16_x16(a + i));
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(s + i, hsum16_x8(a + i));
    for (; i < count; i++) s[i] = hsum16(a[i]);
}

/* yr[m0 + p][n + j] for the tile's P x J outputs. */
static KB inline __attribute__((always_inline)) void store(__m512 acc[P_MAX][J_MAX], int P, int J, float *const *yr,
                                                          int64_t m0, int64_t n) {
    float s[P_MAX * J_MAX];
    tile_sums(acc, P, J, s);
    for (int p = 0; p < P; p++)
        for (int j = 0; j < J; j++) yr[m0 + p][n + j] = s[p * J + j];
}

#define TILE(PP, JJ)                                                                            \
    do {                                                                                        \
        __m512 acc[P_MAX][J_MAX];                                                               \
        tile(xb + (m - m0) * kp, kp, PP, w + n * K, K, JJ, nfull, tail, prefetch, acc);         \
        store(acc, PP, JJ, yr, m, n);                                                           \
    } while (0)

/* Weight rows [n0, n1) against the bf16 rows xb (rows m0 .. m1 of the call). */
static KB inline void block_rows(const uint16_t *xb, int64_t kp, float *const *yr, int64_t m0, int64_t m1, const uint16_t *w,
                          int64_t K, int64_t n0, int64_t n1, int prefetch) {
    const int64_t nfull = K / 32;
    const __mmask32 tail = K % 32 ? (__mmask32)((1ull << (K % 32)) - 1) : 0;
    int64_t n = n0;
    for (; n + J_MAX <= n1; n += J_MAX) {
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) TILE(4, J_MAX);
        if (m1 - m == 3) TILE(3, J_MAX);
        else if (m1 - m == 2) TILE(2, J_MAX);
        else if (m1 - m == 1) TILE(1, J_MAX);
    }
    for (; n < n1; n++) {
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) TILE(4, 1);
        for (; m < m1; m++) TILE(1, 1);
    }
}

#endif
