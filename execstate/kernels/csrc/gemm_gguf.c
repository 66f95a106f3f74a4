/* Linear and MoE rows on GGUF quantised weights (Q8_0, Q4_0, Q4_1), read as the file stores them:
 * each weight row is K / 32 blocks, dequantised in registers; activations and sums fp32.
 *
 * Blocks (32 values each, little-endian fp16 scales):
 *   Q8_0 (34 bytes): d, int8 q[32]               value i = d * q[i]
 *   Q4_0 (18 bytes): d, uint8 qs[16]             value i = d * (nib(i) - 8)
 *   Q4_1 (20 bytes): d, m, uint8 qs[16]          value i = d * nib(i) + m
 * nib(i) = qs[i] & 15 for i < 16, qs[i - 16] >> 4 for i >= 16. Every product d * q is exact in
 * fp32 (an 11-bit by an 8-bit significand), so a value is exact except Q4_1's one rounding of
 * + m: the values equal llama.cpp's and the gguf package's dequantisation.
 *
 * The dot product of one x row and one weight row, "GGUF dot order": 16 fp32 lanes, zero at
 * first; block b in order, lane j takes fma(w[32b + j], x[32b + j]) then fma(w[32b + 16 + j],
 * x[32b + 16 + j]); the lanes summed by simd512.h's tree (i + i+8), (i + i+4), (i + i+2), (0 + 1).
 * Every path below computes exactly this per output (a row's result does not depend on M, the
 * other rows, the thread count or the path): few rows dequantise each block in registers per
 * tile; from DEQ_MIN_ROWS rows a block of NC weight rows is dequantised once per call into the
 * thread's scratch (ES_SCRATCH_WIDEN, exact fp32 values) and multiplied by a register-blocked
 * 16-lane tile; without AVX-512 two 8-lane vectors hold lanes 0-7 and 8-15 (the same FMAs, the
 * same tree: the same bits, so the same numerics id). */
#include "kernels.h"
#include "simd.h"
#include "simd512.h"

#define DEQ_MIN_ROWS 33 /* rows from which weight blocks are dequantised into scratch */
#define NC 64          /* weight rows per dequantised block */

static inline int64_t block_bytes(int fmt) { return fmt == ES_FMT_Q8_0 ? 34 : fmt == ES_FMT_Q4_0 ? 18 : 20; }

/* Kernels here also use F16C (vcvtph2ps) for the blocks' fp16 scales; es_gguf_rows checks it. */
#define KG __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))
#define KG2 __attribute__((target("avx2,fma,f16c")))

/* The fp16 at p (and at p + 2) as fp32, exactly: lanes 0 and 1. */
static KG2 inline __m128 halves(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* ------------------------------------------------------------------------------- AVX-512 */

/* The 32 values of one block: lo = values 0-15, hi = 16-31. */
static KG inline __attribute__((always_inline)) void deq16(int fmt, const uint8_t *b, __m512 *lo, __m512 *hi) {
    const __m128 dm = halves(b); /* d, and m for Q4_1 */
    const __m512 d = _mm512_broadcastss_ps(dm);
    if (fmt == ES_FMT_Q8_0) {
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2)), q1 = _mm_loadu_si128((const __m128i *)(b + 18));
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
        return;
    }
    const __m128i qs = _mm_loadu_si128((const __m128i *)(b + (fmt == ES_FMT_Q4_1 ? 4 : 2)));
    const __m128i m4 = _mm_set1_epi8(15);
    __m512i l = _mm512_cvtepu8_epi32(_mm_and_si128(qs, m4)), h = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), m4));
    if (fmt == ES_FMT_Q4_0) {
        const __m512i eight = _mm512_set1_epi32(8);
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(l, eight)));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(h, eight)));
        return;
    }
    const __m512 m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
    *lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(l), m); /* d * q exact: one rounding, as d * q + m */
    *hi = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(h), m);
}

/* deq16's values for the one-row tile: a 4-bit block's 16 possible values are one vector
 * (value i = d * i + m, or d * (i - 8)): the same fp32 operations on the same operands as
 * converting each nibble and scaling it, so the same bits, and each value is then picked by its
 * nibble (vpermps reads an index's low 4 bits only, so the high nibble needs a shift and no mask):
 * one scale per block instead of one per value, and no conversion per value. Faster for one x
 * row (the dequantisation is the work there); deq16 stays for the multi-row tiles, where it
 * measured faster (8 rows: 77 against 85 us for a 1536 x 576 Q4_1 matrix in cache). */
static KG inline __attribute__((always_inline)) void deq16_table(int fmt, const uint8_t *b, __m512 *lo, __m512 *hi) {
    if (fmt == ES_FMT_Q8_0) { /* 256 values: no table */
        deq16(fmt, b, lo, hi);
        return;
    }
    int32_t dm_bits;
    memcpy(&dm_bits, b, sizeof dm_bits);
    const __m512 dm = _mm512_cvtph_ps(_mm256_set1_epi32(dm_bits)); /* d, m, d, m, ... (Q4_0: d, garbage) */
    const __m512 d = _mm512_moveldup_ps(dm);
    const __m512 table = fmt == ES_FMT_Q4_1
        ? _mm512_fmadd_ps(d, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_movehdup_ps(dm))
        : _mm512_mul_ps(d, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (fmt == ES_FMT_Q4_1 ? 4 : 2))));
    *lo = _mm512_permutexvar_ps(q, table);                         /* low nibbles: values 0-15 */
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);    /* high nibbles: values 16-31 */
}

#define P_MAX 8 /* x rows per tile */
#define JQ 4    /* weight rows per tile dequantised in registers (P * J <= 16) */
#define JF 6    /* weight rows per tile from dequantised scratch (P <= 4) */

/* yr[m + p][n + j] = the tile's sums (P x J accumulators at acc[p * ld + j], 16 / 8 at a time
 * through the tree). */
static KG inline __attribute__((always_inline)) void store(const __m512 *acc, int P, int J, int ld, float *const *yr,
                                                          int64_t m, int64_t n) {
    __m512 a[P_MAX * JQ > 4 * JF ? P_MAX * JQ : 4 * JF];
    float s[P_MAX * JQ > 4 * JF ? P_MAX * JQ : 4 * JF];
    const int count = P * J;
    for (int p = 0; p < P; p++)
        for (int j = 0; j < J; j++) a[p * J + j] = acc[p * ld + j];
    int i = 0;
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(s + i, hsum16_x16(a + i));
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(s + i, hsum16_x8(a + i));
    for (; i < count; i++) s[i] = hsum16(a[i]);
    for (int p = 0; p < P; p++)
        for (int j = 0; j < J; j++) yr[m + p][n + j] = s[p * J + j];
}

/* Rows xr[m .. m + P) by weight rows n .. n + J - 1 (P * J <= 16): each block of the J rows is
 * dequantised once in registers and used by the P rows. */
static KG inline __attribute__((always_inline)) void tile_q(int fmt, const float *const *xr, int64_t m, int P,
                                                           const uint8_t *w, int64_t rb, int64_t n, int J,
                                                           int64_t nb, float *const *yr) {
    const int64_t bb = block_bytes(fmt);
    __m512 acc[P_MAX * JQ];
    for (int i = 0; i < P_MAX * JQ; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 lo[JQ], hi[JQ];
        for (int j = 0; j < JQ; j++)
            if (j < J) {
                const uint8_t *blk = w + (n + j) * rb + b * bb;
                PF(blk + PF_ROWS * rb);
                deq16(fmt, blk, &lo[j], &hi[j]);
            }
        for (int p = 0; p < P_MAX; p++)
            if (p < P) {
                const __m512 xl = _mm512_loadu_ps(xr[m + p] + 32 * b), xh = _mm512_loadu_ps(xr[m + p] + 32 * b + 16);
                for (int j = 0; j < JQ; j++)
                    if (j < J) {
                        acc[p * JQ + j] = _mm512_fmadd_ps(lo[j], xl, acc[p * JQ + j]);
                        acc[p * JQ + j] = _mm512_fmadd_ps(hi[j], xh, acc[p * JQ + j]);
                    }
            }
    }
    store(acc, P, J, JQ, yr, m, n);
}

/* Rows xr[m .. m + P) by dequantised weight rows wf[0 .. J) (stride K), columns in order. */
static KG inline __attribute__((always_inline)) void tile_f(const float *const *xr, int64_t m, int P,
                                                             const float *wf, int64_t K, int64_t n, int J,
                                                             float *const *yr) {
    __m512 acc[4 * JF];
    for (int i = 0; i < 4 * JF; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m512 xv[4];
        for (int p = 0; p < 4; p++)
            if (p < P) xv[p] = _mm512_loadu_ps(xr[m + p] + k);
        for (int j = 0; j < JF; j++)
            if (j < J) {
                const __m512 wv = _mm512_loadu_ps(wf + j * K + k);
                for (int p = 0; p < 4; p++)
                    if (p < P) acc[p * JF + j] = _mm512_fmadd_ps(wv, xv[p], acc[p * JF + j]);
            }
    }
    store(acc, P, J, JF, yr, m, n);
}

#define J1 8 /* weight rows per tile for a single x row */
/* The one-row tile prefetches each block PF1_BYTES ahead (into L2, as PF): a tile's 8 rows are one
 * contiguous run, so this is about 3 tiles of the LM head's 612-byte Q8_0 rows ahead. Prefetching
 * the next tile's rows (PF_ROWS rows, 4.9 KB there) left one thread streaming the 30 MB Q8_0 LM
 * head at 25 GB/s, against 38 GB/s from 16 KB ahead (and 37-40 GB/s for the same kernel from L2);
 * the Q4_1 layer matrices, bound by their arithmetic (~20 GB/s a thread), gain 1-5 %. */
#define PF1_BYTES 16384

/* One x row by weight rows n .. n + J - 1 (J <= J1), blocks dequantised in registers: J
 * independent accumulators, so each row's two dependent FMAs per block overlap with the other
 * rows' (a 4-row tile waits on the FMA latency). */
static KG inline __attribute__((always_inline)) void tile_q1(int fmt, const float *x, const uint8_t *w, int64_t rb,
                                                            int64_t n, int J, int64_t nb, float *y) {
    const int64_t bb = block_bytes(fmt);
    __m512 acc[J1];
    for (int j = 0; j < J1; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 xl = _mm512_loadu_ps(x + 32 * b), xh = _mm512_loadu_ps(x + 32 * b + 16);
        for (int j = 0; j < J1; j++)
            if (j < J) {
                const uint8_t *blk = w + (n + j) * rb + b * bb;
                __m512 lo, hi;
                PF(blk + PF1_BYTES);
                deq16_table(fmt, blk, &lo, &hi);
                acc[j] = _mm512_fmadd_ps(lo, xl, acc[j]);
                acc[j] = _mm512_fmadd_ps(hi, xh, acc[j]);
            }
    }
    float *const yr[1] = {y};
    store(acc, 1, J, J1, yr, 0, n);
}

#define TQ(PP, JJ) tile_q(fmt, xr, m, PP, w, rb, n, JJ, nb, yr)
#define TF(PP, JJ) tile_f(xr, m, PP, wf + (n - n_blk) * K, K, n, JJ, yr)

/* Weight rows [n0, n1) for every x row, blocks dequantised in registers: 8 rows x 2 weight rows
 * per tile (a dequantised block serves 8 rows), fewer rows x 4 weight rows. */
static KG inline __attribute__((always_inline)) void rows_q(int fmt, const float *const *xr, float *const *yr,
                                                           int64_t M, const uint8_t *w, int64_t K, int64_t n0,
                                                           int64_t n1) {
    const int64_t nb = K / 32, rb = nb * block_bytes(fmt);
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) {
        int64_t n = n0;
        for (; n + 3 <= n1; n += 3) TQ(8, 3);
        for (; n < n1; n++) TQ(8, 1);
    }
    if (m == M) return;
    int64_t n = n0;
    if (M - m == 1) { /* one row (left): J1 weight rows a tile */
        for (; n + J1 <= n1; n += J1) tile_q1(fmt, xr[m], w, rb, n, J1, nb, yr[m]);
        if (n < n1) tile_q1(fmt, xr[m], w, rb, n, (int)(n1 - n), nb, yr[m]);
        return;
    }
    for (; n + JQ <= n1; n += JQ) {
        int64_t r = m;
        for (; r + 4 <= M; r += 4) tile_q(fmt, xr, r, 4, w, rb, n, JQ, nb, yr);
        if (M - r == 3) tile_q(fmt, xr, r, 3, w, rb, n, JQ, nb, yr);
        else if (M - r == 2) tile_q(fmt, xr, r, 2, w, rb, n, JQ, nb, yr);
        else if (M - r == 1) tile_q(fmt, xr, r, 1, w, rb, n, JQ, nb, yr);
    }
    for (; n < n1; n++)
        for (int64_t r = m; r < M; r++) tile_q(fmt, xr, r, 1, w, rb, n, 1, nb, yr);
}

/* NC-row blocks of weight rows [n0, n1) dequantised into wf, then the fp32 16-lane tiles. */
static KG inline __attribute__((always_inline)) void rows_f(int fmt, const float *const *xr, float *const *yr,
                                                             int64_t M, const uint8_t *w, int64_t K, int64_t n0,
                                                             int64_t n1, float *wf) {
    const int64_t nb = K / 32, bb = block_bytes(fmt), rb = nb * bb;
    for (int64_t n_blk = n0; n_blk < n1; n_blk += NC) {
        const int64_t n_end = n_blk + NC < n1 ? n_blk + NC : n1;
        for (int64_t r = n_blk; r < n_end; r++)
            for (int64_t b = 0; b < nb; b++) {
                __m512 lo, hi;
                deq16(fmt, w + r * rb + b * bb, &lo, &hi);
                _mm512_storeu_ps(wf + (r - n_blk) * K + 32 * b, lo);
                _mm512_storeu_ps(wf + (r - n_blk) * K + 32 * b + 16, hi);
            }
        int64_t n = n_blk;
        for (; n + JF <= n_end; n += JF) {
            int64_t m = 0;
            for (; m + 4 <= M; m += 4) TF(4, JF);
            for (; m < M; m++) TF(1, JF);
        }
        for (; n < n_end; n++) {
            int64_t m = 0;
            for (; m + 4 <= M; m += 4) TF(4, 1);
            for (; m < M; m++) TF(1, 1);
        }
    }
}

static KG inline __attribute__((always_inline)) void rows512(int fmt, const float *const *xr, float *const *yr,
                                                              int64_t M, const void *w, int64_t K, int64_t n0,
                                                              int64_t n1) {
    float *wf = M >= DEQ_MIN_ROWS ? es_scratch(ES_SCRATCH_WIDEN, sizeof(float) * (size_t)(NC * K)) : NULL;
    if (wf)
        rows_f(fmt, xr, yr, M, (const uint8_t *)w, K, n0, n1, wf);
    else /* few rows, or no scratch: blocks in registers (the same bits) */
        rows_q(fmt, xr, yr, M, (const uint8_t *)w, K, n0, n1);
}

static KG void rows512_q8_0(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                              int64_t n1) {
    rows512(ES_FMT_Q8_0, xr, yr, M, w, K, n0, n1);
}
static KG void rows512_q4_0(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                              int64_t n1) {
    rows512(ES_FMT_Q4_0, xr, yr, M, w, K, n0, n1);
}
static KG void rows512_q4_1(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                              int64_t n1) {
    rows512(ES_FMT_Q4_1, xr, yr, M, w, K, n0, n1);
}

/* ---------------------------------------------------------------------------------- AVX2 */

/* Values 8h .. 8h + 7 of one block (h = 0..3). */
static KG2 inline __attribute__((always_inline)) __m256 deq8(int fmt, const uint8_t *b, int h) {
    const __m128 dm = halves(b);
    const __m256 d = _mm256_broadcastss_ps(dm);
    if (fmt == ES_FMT_Q8_0)
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * h)))));
    __m128i q = _mm_loadl_epi64((const __m128i *)(b + (fmt == ES_FMT_Q4_1 ? 4 : 2) + 8 * (h & 1)));
    if (h >= 2) q = _mm_srli_epi16(q, 4);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_and_si128(q, _mm_set1_epi8(15)));
    if (fmt == ES_FMT_Q4_0) return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8))));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(v), _mm256_broadcastss_ps(_mm_movehdup_ps(dm)));
}

/* One output in GGUF dot order on 8-lane vectors: a = lanes 0-7, c = lanes 8-15. */
static KG2 inline __attribute__((always_inline)) float dot_avx2(int fmt, const float *x, const uint8_t *w, int64_t nb) {
    const int64_t bb = block_bytes(fmt);
    __m256 a = _mm256_setzero_ps(), c = a;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bb;
        const float *xb = x + 32 * b;
        a = _mm256_fmadd_ps(deq8(fmt, blk, 0), _mm256_loadu_ps(xb), a);
        c = _mm256_fmadd_ps(deq8(fmt, blk, 1), _mm256_loadu_ps(xb + 8), c);
        a = _mm256_fmadd_ps(deq8(fmt, blk, 2), _mm256_loadu_ps(xb + 16), a);
        c = _mm256_fmadd_ps(deq8(fmt, blk, 3), _mm256_loadu_ps(xb + 24), c);
    }
    return hsum8(_mm256_add_ps(a, c));
}

static KG2 inline __attribute__((always_inline)) void rows256(int fmt, const float *const *xr, float *const *yr,
                                                            int64_t M, const void *wv, int64_t K, int64_t n0,
                                                            int64_t n1) {
    const int64_t nb = K / 32, rb = nb * block_bytes(fmt);
    const uint8_t *w = (const uint8_t *)wv;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < M; m++) yr[m][n] = dot_avx2(fmt, xr[m], w + n * rb, nb);
}

static KG2 void rows256_q8_0(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                            int64_t n1) {
    rows256(ES_FMT_Q8_0, xr, yr, M, w, K, n0, n1);
}
static KG2 void rows256_q4_0(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                            int64_t n1) {
    rows256(ES_FMT_Q4_0, xr, yr, M, w, K, n0, n1);
}
static KG2 void rows256_q4_1(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                            int64_t n1) {
    rows256(ES_FMT_Q4_1, xr, yr, M, w, K, n0, n1);
}

/* ----------------------------------------------------------------------------- the entries */

/* The row kernel (es_rows_fn) of GGUF format `fmt`: AVX-512 unless avx2 or the CPU lacks it. */
int es_gguf_available(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return ok;
}

es_rows_fn es_gguf_rows(int fmt, int avx2) {
    const int wide = !avx2 && es_gemm_packed_available();
    switch (fmt) {
    case ES_FMT_Q8_0: return wide ? rows512_q8_0 : rows256_q8_0;
    case ES_FMT_Q4_0: return wide ? rows512_q4_0 : rows256_q4_0;
    case ES_FMT_Q4_1: return wide ? rows512_q4_1 : rows256_q4_1;
    default: return NULL;
    }
}

int es_gguf_block_bytes(int fmt) { return (int)block_bytes(fmt); }

int es_linear_gguf(int fmt, int avx2, const float *x, const uint8_t *w, float *y, int64_t M, int64_t K, int64_t N) {
    return es_linear_with(es_gguf_rows(fmt, avx2), x, w, y, M, K, N);
}

int es_moe_gguf(int fmt, int avx2, const float *x, const int64_t *ids, const float *wts, const uint8_t *w_gu,
                const uint8_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return es_moe_with(es_gguf_rows(fmt, avx2), (size_t)block_bytes(fmt), x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
}
