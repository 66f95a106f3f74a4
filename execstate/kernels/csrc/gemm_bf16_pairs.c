/* Few-row linear with bf16 weights on AVX-512 (the decode shapes: 2-32 rows against weights
 * streamed from memory): gemm_bf16.c's dot products, bit for bit, at twice the FMA width.
 *
 * At batch 8 the AVX2 kernel is bound by its FMA rate, not by memory (the standard model's
 * 32000 x 512 bf16 LM head: 1.34 ms for 8 rows, 0.40 ms for 1). Here x rows are packed in
 * pairs as in gemm_packed.c (16 lanes = 8 lanes of row a ++ 8 lanes of row b) and each weight
 * row's 8 bf16 are widened straight into both halves of a 512-bit vector (broadcast the 16
 * bytes, zero-extend the 16 words, shift left 16: exact). So lane j of each half sums
 * w[n, k] * x[m, k] over k = j (mod 8) in k order with FMA, as dot_rows_bf16's lane j does;
 * the halves are summed with the same tree (hsum8) and the K % 8 tail with fmaf.
 *
 * Blocking: J_ROWS weight rows at a time (each read from memory once, prefetched PF_ROWS
 * rows ahead like gemm.c), against every row pair of x, P_PAIRS pairs per pass (their 4 KB
 * of weights stay in L1 between passes). The packed x copy is this thread's (ES_SCRATCH_ROWS):
 * callers run this inside their own parallel regions, each thread on its own weight rows. */
#include "kernels.h"
#include "simd.h"

#define KP __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
#define J_ROWS 4  /* weight rows per pass */
#define P_PAIRS 4 /* x row pairs per pass: 16 accumulators */

/* 8 bf16 weights at p, widened, in both halves. */
static KP inline __m512 wide2(const uint16_t *p) {
    const __m256i w8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w8), 16));
}

/* Weight rows w0..w0 + J - 1 (row n0 first) against pairs [0, P) of xp (pair stride kb16). */
static KP inline __attribute__((always_inline)) void pass(const float *xp, int64_t kb16, int P, const uint16_t *w0,
                                                         int J, int64_t K, int64_t k8, int prefetch,
                                                         __m512 acc[P_PAIRS][J_ROWS]) {
    for (int p = 0; p < P_PAIRS; p++)
        for (int j = 0; j < J_ROWS; j++) acc[p][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k8; k += 8) {
        if (prefetch && !(k & 31))
            for (int j = 0; j < J_ROWS; j++)
                if (j < J) PF(w0 + (PF_ROWS + j) * K + k);
        __m512 wv[J_ROWS], xv[P_PAIRS];
        for (int j = 0; j < J_ROWS; j++) wv[j] = j < J ? wide2(w0 + j * K + k) : _mm512_setzero_ps();
        for (int p = 0; p < P_PAIRS; p++) xv[p] = p < P ? _mm512_loadu_ps(xp + p * kb16 + 2 * k) : _mm512_setzero_ps();
        for (int p = 0; p < P_PAIRS; p++)
            for (int j = 0; j < J_ROWS; j++)
                if (p < P && j < J) acc[p][j] = _mm512_fmadd_ps(wv[j], xv[p], acc[p][j]);
    }
}

/* yr[m][n] for the rows of pairs [pair0, pair0 + P) and weight rows n0 .. n0 + J - 1. */
static KP inline __attribute__((always_inline)) void store(__m512 acc[P_PAIRS][J_ROWS], int P, int J,
                                                          const float *const *xr, float *const *yr, int64_t pair0,
                                                          int64_t M, const uint16_t *w0, int64_t n0, int64_t K,
                                                          int64_t k8) {
    for (int p = 0; p < P; p++) {
        const int64_t m = 2 * (pair0 + p);
        for (int j = 0; j < J; j++) {
            yr[m][n0 + j] = finish_bf16(_mm512_castps512_ps256(acc[p][j]), w0 + j * K, xr[m], k8, K);
            if (m + 1 < M)
                yr[m + 1][n0 + j] = finish_bf16(_mm512_extractf32x8_ps(acc[p][j], 1), w0 + j * K, xr[m + 1], k8, K);
        }
    }
}

#define PASS(PP, JJ)                                                                        \
    do {                                                                                    \
        __m512 acc[P_PAIRS][J_ROWS];                                                        \
        pass(xp + pair0 * kb16, kb16, PP, w0, JJ, K, k8, pair0 == 0, acc);                  \
        store(acc, PP, JJ, xr, yr, pair0, M, w0, n, K, k8);                                 \
    } while (0)

int es_bf16_pairs_available(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = es_gemm_packed_available() && __builtin_cpu_supports("avx512bw");
    }
    return ok;
}

/* dot_rows_bf16's contract (gemm_bf16.c: yr[m][n] = dot(xr[m], widen(w + n * K)), m < M,
 * n in [n0, n1)) and bits. Returns 0, or 2 when this thread's pack buffer cannot be had
 * (nothing written then). */
KP int es_linear_rows_bf16_pairs(const float *const *xr, float *const *yr, int64_t M, const uint16_t *w, int64_t K,
                                 int64_t n0, int64_t n1) {
    const int64_t k8 = K & ~(int64_t)7, kb16 = 2 * k8, pairs = (M + 1) / 2;
    float *xp = es_scratch(ES_SCRATCH_ROWS, sizeof(float) * (size_t)(pairs * kb16 + 16));
    if (!xp) return 2;
    es_pack_pairs(xr, xp, M, K, 0, pairs);
    for (int64_t n = n0; n < n1; n += J_ROWS) {
        const int J = n1 - n < J_ROWS ? (int)(n1 - n) : J_ROWS;
        const uint16_t *w0 = w + n * K;
        for (int64_t pair0 = 0; pair0 < pairs; pair0 += P_PAIRS) {
            const int P = pairs - pair0 < P_PAIRS ? (int)(pairs - pair0) : P_PAIRS;
            if (P == P_PAIRS && J == J_ROWS)
                PASS(P_PAIRS, J_ROWS);
            else if (J == J_ROWS)
                PASS(P, J_ROWS);
            else
                PASS(P, J);
        }
    }
    return 0;
}
