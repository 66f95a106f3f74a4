/* Small-batch linear and fused MoE expert block with bf16 weights, fp32 activations and fp32
 * accumulation (contracts in module.c). Same blocking as gemm.c: every weight row streamed once
 * for all rows that use it, at half the bytes.
 *
 * Widening: a bf16 is the top 16 bits of an fp32, so 8 weights are widened exactly by
 * zero-extending the uint16s to 32 bits and shifting left by 16 (AVX2: vpmovzxwd + vpslld).
 * Every output element is then the same FMA sequence as gemm.c's on the widened weights, so
 * es_linear_bf16(x, w) == es_linear_f32(x, float(w)) bit for bit (deterministic, batch-invariant).
 *
 * Not used: AVX512-BF16's vdpbf16ps (present on this CPU) multiplies bf16 by bf16, which would
 * round the activations to bf16 too; the kernels keep activations in fp32. */
#include "kernels.h"
#include "simd.h"

/* Rows from which es_linear_rows_bf16 takes the AVX-512 kernel (the results are the same
 * either way). */
#define PAIRS_MIN_ROWS 4

static KT inline __m256 wload(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 4 x rows by 2 weight rows (w0 = row n, w1 = row n + 1). */
static KT inline void dot_4x2(const float *const *xr, float *const *yr, const uint16_t *w0, const uint16_t *w1,
                              int64_t n, int64_t k8, int64_t K) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const uint16_t *p0 = w0 + PF_ROWS * K, *p1 = w1 + PF_ROWS * K;
    for (int64_t k = 0; k < k8; k += 8) {
        if (!(k & 31)) { PF(p0 + k); PF(p1 + k); } /* one prefetch per 64-byte line */
        __m256 v0 = wload(w0 + k), v1 = wload(w1 + k);
        __m256 u = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(v0, u, a0); b0 = _mm256_fmadd_ps(v1, u, b0);
        u = _mm256_loadu_ps(x1 + k);
        a1 = _mm256_fmadd_ps(v0, u, a1); b1 = _mm256_fmadd_ps(v1, u, b1);
        u = _mm256_loadu_ps(x2 + k);
        a2 = _mm256_fmadd_ps(v0, u, a2); b2 = _mm256_fmadd_ps(v1, u, b2);
        u = _mm256_loadu_ps(x3 + k);
        a3 = _mm256_fmadd_ps(v0, u, a3); b3 = _mm256_fmadd_ps(v1, u, b3);
    }
    yr[0][n] = finish_bf16(a0, w0, x0, k8, K); yr[0][n + 1] = finish_bf16(b0, w1, x0, k8, K);
    yr[1][n] = finish_bf16(a1, w0, x1, k8, K); yr[1][n + 1] = finish_bf16(b1, w1, x1, k8, K);
    yr[2][n] = finish_bf16(a2, w0, x2, k8, K); yr[2][n + 1] = finish_bf16(b2, w1, x2, k8, K);
    yr[3][n] = finish_bf16(a3, w0, x3, k8, K); yr[3][n + 1] = finish_bf16(b3, w1, x3, k8, K);
}

/* 1 x row by 4 weight rows: the batch-1 decode shape. */
static KT inline void dot_1x4(const float *xa, float *ya, const uint16_t *w0, int64_t n, int64_t k8, int64_t K) {
    const uint16_t *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < k8; k += 8) {
        if (!(k & 31)) {
            PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
        }
        __m256 va = _mm256_loadu_ps(xa + k);
        a0 = _mm256_fmadd_ps(wload(w0 + k), va, a0);
        a1 = _mm256_fmadd_ps(wload(w1 + k), va, a1);
        a2 = _mm256_fmadd_ps(wload(w2 + k), va, a2);
        a3 = _mm256_fmadd_ps(wload(w3 + k), va, a3);
    }
    ya[n] = finish_bf16(a0, w0, xa, k8, K);
    ya[n + 1] = finish_bf16(a1, w1, xa, k8, K);
    ya[n + 2] = finish_bf16(a2, w2, xa, k8, K);
    ya[n + 3] = finish_bf16(a3, w3, xa, k8, K);
}

/* 2 x rows by 4 weight rows: each widened weight vector serves both rows. */
static KT inline void dot_2x4(const float *xa, const float *xb, float *ya, float *yb, const uint16_t *w0, int64_t n,
                              int64_t k8, int64_t K) {
    const uint16_t *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < k8; k += 8) {
        if (!(k & 31)) {
            PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
        }
        __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
        __m256 v0 = wload(w0 + k), v1 = wload(w1 + k), v2 = wload(w2 + k), v3 = wload(w3 + k);
        a0 = _mm256_fmadd_ps(v0, va, a0); b0 = _mm256_fmadd_ps(v0, vb, b0);
        a1 = _mm256_fmadd_ps(v1, va, a1); b1 = _mm256_fmadd_ps(v1, vb, b1);
        a2 = _mm256_fmadd_ps(v2, va, a2); b2 = _mm256_fmadd_ps(v2, vb, b2);
        a3 = _mm256_fmadd_ps(v3, va, a3); b3 = _mm256_fmadd_ps(v3, vb, b3);
    }
    ya[n] = finish_bf16(a0, w0, xa, k8, K); yb[n] = finish_bf16(b0, w0, xb, k8, K);
    ya[n + 1] = finish_bf16(a1, w1, xa, k8, K); yb[n + 1] = finish_bf16(b1, w1, xb, k8, K);
    ya[n + 2] = finish_bf16(a2, w2, xa, k8, K); yb[n + 2] = finish_bf16(b2, w2, xb, k8, K);
    ya[n + 3] = finish_bf16(a3, w3, xa, k8, K); yb[n + 3] = finish_bf16(b3, w3, xb, k8, K);
}

/* yr[m][n] = dot(xr[m], widen(w + n*K)) for m < M, n in [n0, n1); weight rows 4 at a time. */
static KT void dot_rows_bf16(const float *const *xr, float *const *yr, int64_t M, const uint16_t *w, int64_t K,
                             int64_t n0, int64_t n1) {
    const int64_t k8 = K & ~(int64_t)7;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        const uint16_t *w0 = w + n * K, *w2 = w0 + 2 * K;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            dot_4x2(xr + m, yr + m, w0, w0 + K, n, k8, K);
            dot_4x2(xr + m, yr + m, w2, w2 + K, n + 2, k8, K);
        }
        for (; m + 2 <= M; m += 2) dot_2x4(xr[m], xr[m + 1], yr[m], yr[m + 1], w0, n, k8, K);
        if (m < M) dot_1x4(xr[m], yr[m], w0, n, k8, K);
    }
    for (; n < n1; n++) {
        const uint16_t *w0 = w + n * K;
        for (int64_t m = 0; m < M; m++) {
            const float *xa = xr[m];
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t k = 0; k < k8; k += 8) a0 = _mm256_fmadd_ps(wload(w0 + k), _mm256_loadu_ps(xa + k), a0);
            yr[m][n] = finish_bf16(a0, w0, xa, k8, K);
        }
    }
}

/* The rows kernel of every bf16 entry: from PAIRS_MIN_ROWS rows on AVX-512 the 16-lane kernel
 * (gemm_bf16_pairs.c: the same bits at twice the FMA width; it falls back here if it cannot
 * get its pack buffer), else dot_rows_bf16. */
KT void es_linear_rows_bf16(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                           int64_t n1) {
    if (M >= PAIRS_MIN_ROWS && es_bf16_pairs_available() &&
        !es_linear_rows_bf16_pairs(xr, yr, M, (const uint16_t *)w, K, n0, n1))
        return;
    dot_rows_bf16(xr, yr, M, (const uint16_t *)w, K, n0, n1);
}

/* es_linear_f32 / es_moe_f32 (gemm.c's drivers) on the bf16 row kernel. */
KT int es_linear_bf16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N) {
    return es_linear_with(es_linear_rows_bf16, x, w, y, M, K, N);
}

KT int es_moe_bf16(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                   float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return es_moe_with(es_linear_rows_bf16, 32 * sizeof(uint16_t), x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
}
