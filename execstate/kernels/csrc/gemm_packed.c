/* Large-M fp32 linear (prefill): y[M, N] = x[M, K] @ w[N, K]^T, AVX-512, register-blocked,
 * with bitwise the numerics of gemm.c's dot_rows (module.c): so a row's result is the same
 * whichever kernel computes it, whatever M (batch invariance across the two paths).
 *
 * How the numerics survive 16-lane vectors: x rows are packed in pairs, 8 floats of each row
 * per 16-float vector (xp[pair][k/8] = x[2p, k:k+8] ++ x[2p+1, k:k+8]); each weight row's 8
 * floats are broadcast to both halves. So lane j of an accumulator's low half sums
 * w[n, k] * x[2p, k] over k = j (mod 8) in k order with FMA, exactly dot_rows's lane j; the
 * halves are then summed with dot_rows's tree (hsum8) and the K % 8 tail with fmaf (finish).
 * Without a tail (K % 8 == 0) a row pair's 2 x J sums are taken at once by hsum8_x16 (simd512.h:
 * the same tree on shuffled operands) and stored J columns per row with a masked store.
 *
 * Blocking: each thread owns a range of weight rows, split in NC-row blocks (kept in L2);
 * for each block it walks all row pairs in tiles of P pairs (the packed x tile, kept in L1)
 * and each tile against J weight rows at a time (a P x J tile of 512-bit accumulators). The
 * packed copy of x is built once per call, shared by the threads. Where w is no larger than
 * packed x (a router, the prefill's q/k/v and o-proj) the threads split x's row pairs instead,
 * each owning all weight rows for its pairs (linear_packed's split_by_rows).
 *
 * bf16 weights (the _bf16 entries, gemm_bf16.c's contract): each NC-row block is widened
 * exactly to fp32 into the thread's scratch (ES_SCRATCH_WIDEN) and multiplied as above, so
 * the result equals the fp32 kernel on the widened weights, i.e. es_linear_bf16 / es_moe_bf16,
 * bit for bit. The widening costs one pass over the block per call, against M rows of use. */
#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "simd512.h"

#define KP __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))
#define P_MAX 4  /* row pairs per tile (8 rows) */
#define J_MAX 6  /* weight rows per tile: 24 accumulators of 32 zmm registers */
#define NC 96    /* weight rows per L2 block */

/* One P x J tile over K8 = K & ~7: pairs xp[0..P) (stride kb16 floats), weight rows w[0..J). */
static KP inline __attribute__((always_inline)) void tile(const float *xp, int64_t kb16, const float *const *wr,
                                                         int P, int J, int64_t k8, __m512 acc[P_MAX][J_MAX]) {
#pragma GCC unroll 4
    for (int p = 0; p < P_MAX; p++)
#pragma GCC unroll 6
        for (int j = 0; j < J_MAX; j++) acc[p][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k8; k += 8) {
        __m512 xv[P_MAX];
#pragma GCC unroll 4
        for (int p = 0; p < P_MAX; p++)
            xv[p] = p < P ? _mm512_loadu_ps(xp + p * kb16 + 2 * k) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int j = 0; j < J_MAX; j++) {
            if (j >= J) continue;
            __m512 wv = _mm512_broadcast_f32x8(_mm256_loadu_ps(wr[j] + k));
#pragma GCC unroll 4
            for (int p = 0; p < P_MAX; p++)
                if (p < P) acc[p][j] = _mm512_fmadd_ps(wv, xv[p], acc[p][j]);
        }
    }
}

/* The MoE's weighted combine as the down product's epilogue (moe_packed's fused path): row m of an expert's
 * rows is slot row m of out's token tok[m]; its J sums are scaled by w[m] and stored there when
 * first[m] (the token's first slot in the order the thread visits them), else added to what is
 * there. For k <= 2 slots a token that is es_moe_f32's s = w0 * y0 (+ w1 * y1), bit for bit:
 * IEEE products and sums of two do not depend on the operands' order. */
typedef struct {
    float *out;
    int64_t ld;
    const int64_t *tok;
    const float *w;
    const unsigned char *first;
} Combine;

static KP inline __attribute__((always_inline)) void put(const Combine *c, int64_t m, int64_t n0, __mmask8 cols,
                                                        __m256 v) {
    float *o = c->out + c->tok[m] * c->ld + n0;
    v = _mm256_mul_ps(_mm256_set1_ps(c->w[m]), v);
    if (!c->first[m]) v = _mm256_add_ps(_mm256_maskz_loadu_ps(cols, o), v);
    _mm256_mask_storeu_ps(o, cols, v);
}

/* Writes the tile's outputs: y[m * ldy + n0 + j] for the valid rows m of pairs [pair0, pair0 + P),
 * or, with cmb (K % 8 == 0 only), combines them into cmb->out (put). */
static KP inline __attribute__((always_inline)) void store(__m512 acc[P_MAX][J_MAX], int P, int J,
                                                          const float *const *xr, const float *const *wr, float *y,
                                                          int64_t ldy, int64_t pair0, int64_t n0, int64_t M,
                                                          int64_t K, int64_t k8, const Combine *cmb) {
    if (k8 == K) { /* no tail: a pair's 2 x J lane sums at once (hsum8_x16: hsum8's tree, same bits) */
        /* hsum8_x16's lane 4q + e = half q % 2 of a[2e + q / 2] -> [row 2p: a[0..8) | row 2p + 1: a[0..8)] */
        const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        const __mmask8 cols = (__mmask8)((1u << J) - 1);
        for (int p = 0; p < P; p++) {
            const int64_t m = 2 * (pair0 + p);
            __m512 a[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) a[j] = j < J_MAX && j < J ? acc[p][j < J_MAX ? j : 0] : _mm512_setzero_ps();
            const __m512 r = _mm512_permutexvar_ps(order, hsum8_x16(a));
            if (cmb) {
                put(cmb, m, n0, cols, _mm512_castps512_ps256(r));
                if (m + 1 < M) put(cmb, m + 1, n0, cols, _mm512_extractf32x8_ps(r, 1));
                continue;
            }
            _mm256_mask_storeu_ps(y + m * ldy + n0, cols, _mm512_castps512_ps256(r));
            if (m + 1 < M) _mm256_mask_storeu_ps(y + (m + 1) * ldy + n0, cols, _mm512_extractf32x8_ps(r, 1));
        }
        return;
    }
    for (int p = 0; p < P; p++) {
        int64_t m = 2 * (pair0 + p);
        for (int j = 0; j < J; j++) {
            __m256 lo = _mm512_castps512_ps256(acc[p][j]);
            __m256 hi = _mm512_extractf32x8_ps(acc[p][j], 1);
            y[m * ldy + n0 + j] = finish(lo, wr[j], xr[m], k8, K);
            if (m + 1 < M) y[(m + 1) * ldy + n0 + j] = finish(hi, wr[j], xr[m + 1], k8, K);
        }
    }
}

#define TILE_CASE(PP, JJ, Y, LDY, PAIR0, MM, CMB)                                      \
    do {                                                                               \
        __m512 acc[P_MAX][J_MAX];                                                      \
        tile(xt, kb16, wr, PP, JJ, k8, acc);                                           \
        store(acc, PP, JJ, xr, wr, Y, LDY, PAIR0, n, MM, K, k8, CMB);                  \
    } while (0)

/* The P x J tile at pairs xt against weight rows wr, its constant sizes picked for the full tile. */
#define TILES(Y, LDY, PAIR0, MM, CMB)                                                  \
    do {                                                                               \
        if (P == P_MAX && J == J_MAX) {                                                \
            TILE_CASE(P_MAX, J_MAX, Y, LDY, PAIR0, MM, CMB);                           \
        } else if (P == P_MAX) {                                                       \
            TILE_CASE(P_MAX, J, Y, LDY, PAIR0, MM, CMB);                               \
        } else {                                                                       \
            TILE_CASE(P, J, Y, LDY, PAIR0, MM, CMB);                                   \
        }                                                                              \
    } while (0)

/* Weights of a call: fp32 rows, or bf16 rows (uint16 bit patterns) widened block by block
 * into `wide` (NC * K floats, this thread's). */
typedef struct {
    const void *w;
    int bf16;
    float *wide;
} Weights;

/* The weights starting `rows` rows into `w` (an expert's matrix within a stacked tensor). */
static inline Weights offset_rows(Weights w, int64_t rows, int64_t K) {
    w.w = w.bf16 ? (const void *)((const uint16_t *)w.w + rows * K) : (const void *)((const float *)w.w + rows * K);
    return w;
}

/* Exact: a bf16 is the top half of an fp32. */
static KP void widen(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16)));
    for (; i < n; i++) dst[i] = widen1(src[i]);
}

/* Weight rows to pull into L2 while the current block is multiplied: the next block's (or the
 * next expert's first block's) rows, which would otherwise come from memory when its first tile
 * starts J cold row streams at once. Up to two regions (SwiGLU: gate and up rows). A prefetch
 * changes no result. */
typedef struct {
    const char *p[2];
    int64_t bytes[2];
} Ahead;

/* The region of rows [r0, r1) of wt (K columns) as regions[i] of *a. */
static inline void ahead_rows(Ahead *a, int i, Weights wt, int64_t r0, int64_t r1, int64_t K) {
    const int64_t size = wt.bf16 ? 2 : 4;
    a->p[i] = (const char *)wt.w + r0 * K * size;
    a->bytes[i] = r1 > r0 ? (r1 - r0) * K * size : 0;
}

/* Part i of n of *a's cache lines (i in [0, n)): n calls, one per tile, cover it all once. */
static inline void ahead_part(const Ahead *a, int64_t i, int64_t n) {
    for (int r = 0; r < 2; r++) {
        const int64_t lines = (a->bytes[r] + 63) / 64;
        for (int64_t l = lines * i / n; l < lines * (i + 1) / n; l++) _mm_prefetch(a->p[r] + 64 * l, _MM_HINT_T1);
    }
}

/* Columns [n0, n1) of y (row stride ldy) for rows xr[0..M); xp holds those rows packed
 * (es_pack_pairs). With cmb (K % 8 == 0) the columns are combined into cmb->out instead (put). */
static KP void rows_block(const float *const *xr, const float *xp, Weights wt, float *y, int64_t ldy, int64_t M,
                          int64_t K, int64_t n0, int64_t n1, const Combine *cmb, const Ahead *next) {
    const int64_t k8 = K & ~(int64_t)7, kb16 = 2 * k8, pairs = (M + 1) / 2;
    for (int64_t nb = n0; nb < n1; nb += NC) {
        const int64_t nb1 = nb + NC < n1 ? nb + NC : n1;
        const float *wb = (const float *)wt.w + nb * K; /* row n at wb + (n - nb) * K */
        Ahead ah = {{NULL, NULL}, {0, 0}};
        if (nb1 < n1)
            ahead_rows(&ah, 0, wt, nb1, nb1 + NC < n1 ? nb1 + NC : n1, K);
        else if (next)
            ah = *next;
        const int64_t n_tiles = (pairs + P_MAX - 1) / P_MAX * ((nb1 - nb + J_MAX - 1) / J_MAX);
        int64_t tile_i = 0;
        if (wt.bf16) {
            widen((const uint16_t *)wt.w + nb * K, wt.wide, (nb1 - nb) * K);
            wb = wt.wide;
        }
        for (int64_t pair0 = 0; pair0 < pairs; pair0 += P_MAX) {
            const int P = pairs - pair0 < P_MAX ? (int)(pairs - pair0) : P_MAX;
            const float *xt = xp + pair0 * kb16;
            for (int64_t n = nb; n < nb1; n += J_MAX) {
                const int J = nb1 - n < J_MAX ? (int)(nb1 - n) : J_MAX;
                ahead_part(&ah, tile_i++, n_tiles);
                const float *wr[J_MAX];
                for (int j = 0; j < J_MAX; j++) wr[j] = wb + (n - nb + (j < J ? j : 0)) * K;
                TILES(y, ldy, pair0, M, cmb);
            }
        }
    }
}

#define NH (NC / 2) /* SwiGLU columns per block: their gate and up rows are NC weight rows */

/* The gate/up product of rows xp (packed, M rows, K % 8 == 0) for h columns [c0, c1) (multiples of
 * 8), wt the expert's [2I, K] (gate rows first), with SwiGLU as its epilogue: each tile of pairs
 * lands in a stack buffer (gate and up sums of the same columns side by side), then
 * es_silu_mul's h of its rows is written packed in pairs into hp (es_pack_pairs's layout for K =
 * I, a missing odd row zero). So hp is es_pack_pairs of es_silu_mul of the unfused product, bit
 * for bit, without that product's or h's pass through memory. */
static KP void swiglu_block(const float *xp, Weights wt, float *hp, int64_t M, int64_t K, int64_t I, int64_t c0,
                            int64_t c1, const Ahead *next) {
    const int64_t k8 = K, kb16 = 2 * K, pairs = (M + 1) / 2;
    const float *const *xr = NULL; /* no K tail: store reads no rows */
    float buf[2 * P_MAX][NC] __attribute__((aligned(64)));
    float h[NH] __attribute__((aligned(64)));
    for (int64_t cb = c0; cb < c1; cb += NH) {
        const int64_t nc = c1 - cb < NH ? c1 - cb : NH, cb1 = cb + nc;
        Ahead ah = {{NULL, NULL}, {0, 0}};
        if (cb1 < c1) { /* the next block's gate and up rows */
            const int64_t nn = c1 - cb1 < NH ? c1 - cb1 : NH;
            ahead_rows(&ah, 0, wt, cb1, cb1 + nn, K);
            ahead_rows(&ah, 1, wt, I + cb1, I + cb1 + nn, K);
        } else if (next) {
            ah = *next;
        }
        const int64_t n_tiles = (pairs + P_MAX - 1) / P_MAX * ((2 * nc + J_MAX - 1) / J_MAX);
        int64_t tile_i = 0;
        const float *gate = (const float *)wt.w + cb * K, *up = (const float *)wt.w + (I + cb) * K;
        if (wt.bf16) {
            widen((const uint16_t *)wt.w + cb * K, wt.wide, nc * K);
            widen((const uint16_t *)wt.w + (I + cb) * K, wt.wide + nc * K, nc * K);
            gate = wt.wide;
            up = wt.wide + nc * K;
        }
        for (int64_t pair0 = 0; pair0 < pairs; pair0 += P_MAX) {
            const int P = pairs - pair0 < P_MAX ? (int)(pairs - pair0) : P_MAX;
            const int64_t rows = M - 2 * pair0;
            const float *xt = xp + pair0 * kb16;
            for (int64_t n = 0; n < 2 * nc; n += J_MAX) { /* buffer column n: gate n, or up n - nc */
                const int J = 2 * nc - n < J_MAX ? (int)(2 * nc - n) : J_MAX;
                ahead_part(&ah, tile_i++, n_tiles);
                const float *wr[J_MAX];
                for (int j = 0; j < J_MAX; j++) {
                    const int64_t c = n + (j < J ? j : 0);
                    wr[j] = c < nc ? gate + c * K : up + (c - nc) * K;
                }
                TILES(&buf[0][0], NC, 0, rows, NULL);
            }
            for (int r = 0; r < 2 * P; r++) {
                float *o = hp + (pair0 + r / 2) * 2 * I + (r & 1) * 8 + 2 * cb;
                if (r < rows)
                    es_silu_mul(buf[r], buf[r] + nc, h, nc);
                else
                    memset(h, 0, sizeof(float) * (size_t)nc);
                for (int64_t q = 0; q < nc; q += 8) _mm256_storeu_ps(o + 2 * q, _mm256_load_ps(h + q));
            }
        }
    }
}

/* Rows xr[0..M) in pairs (see the header), pairs [p0, p1); a missing odd row is zero. */
KP void es_pack_pairs(const float *const *xr, float *xp, int64_t M, int64_t K, int64_t p0, int64_t p1) {
    const int64_t k8 = K & ~(int64_t)7;
    for (int64_t p = p0; p < p1; p++) {
        const float *a = xr[2 * p], *b = 2 * p + 1 < M ? xr[2 * p + 1] : NULL;
        float *o = xp + p * 2 * k8;
        for (int64_t k = 0; k < k8; k += 8) {
            _mm256_storeu_ps(o + 2 * k, _mm256_loadu_ps(a + k));
            _mm256_storeu_ps(o + 2 * k + 8, b ? _mm256_loadu_ps(b + k) : _mm256_setzero_ps());
        }
    }
}

/* This thread's part of packing the rows of every active expert (expert a: rows
 * rows[start[a] ..], count[a] of them, into xp at pair offset poff[a]). */
static KP void pack_groups(const float *const *rows, float *xp, int64_t K, const int64_t *start, const int64_t *count,
                           const int64_t *poff, int64_t n_groups) {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t k8 = K & ~(int64_t)7;
    for (int64_t a = 0; a < n_groups; a++) {
        const int64_t pairs = (count[a] + 1) / 2;
        es_pack_pairs(rows + start[a], xp + poff[a] * 2 * k8, count[a], K, pairs * tid / nt, pairs * (tid + 1) / nt);
    }
}

int es_gemm_packed_available(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}

/* This thread's widening buffer for weights of up to K columns (NULL for fp32 weights);
 * sets *oom (shared) when it cannot be had. */
static float *wide_buffer(int bf16, int64_t K, int *oom) {
    if (!bf16) return NULL;
    float *p = es_scratch(ES_SCRATCH_WIDEN, sizeof(float) * (size_t)(NC * K));
    if (!p) {
#pragma omp atomic write
        *oom = 1;
    }
    return p;
}

/* At most this many weight rows (a router's), or with w no larger than packed x (M * 4 bytes a
 * column against w's N * 2 or N * 4: the prefill's q/k/v and o-proj), the threads split the rows
 * of x, not w's: each reads all of w instead of all of packed x, packs only its own rows (no
 * barrier) and writes whole rows of y, the rows the row-split kernels before and after it (the
 * norms, the q/k/v split) handle on the same core. Each output is the same dot product either
 * way (a pair's two rows never mix), so the same bits. */
#define ROWS_SPLIT_N 32

static int split_by_rows(int bf16, int64_t M, int64_t N) {
    return N <= ROWS_SPLIT_N || N * (bf16 ? 2 : 4) <= M * 4;
}

/* The linears' temporaries in this thread's ES_SCRATCH_PACKED slot: room for x's M rows packed
 * in pairs (*xp, es_pack_pairs's layout) and x's row pointers (*xr, filled). Returns 0, or 2 when
 * out of memory. */
static int packed_input(const float *x, int64_t M, int64_t K, float **xp, const float ***xr) {
    const int64_t k8 = K & ~(int64_t)7, pairs = (M + 1) / 2;
    const size_t bytes[2] = {sizeof(float) * (size_t)(pairs * 2 * k8 + 16), sizeof(float *) * (size_t)M};
    void *parts[2];
    if (es_scratch_parts(ES_SCRATCH_PACKED, 2, bytes, parts)) return 2;
    *xp = parts[0];
    *xr = parts[1];
    for (int64_t m = 0; m < M; m++) (*xr)[m] = x + m * K;
    return 0;
}

/* y = x @ w^T for fp32 or bf16 w. Returns 0, 2 when out of memory, 3 when the CPU lacks
 * AVX-512 (nothing computed then). */
static int linear_packed(const float *x, const void *w, int bf16, float *y, int64_t M, int64_t K, int64_t N) {
    if (!es_gemm_packed_available()) return 3;
    if (M <= 0 || N <= 0) return 0;
    const int64_t k8 = K & ~(int64_t)7, pairs = (M + 1) / 2, zero = 0;
    float *xp;
    const float **xr;
    if (packed_input(x, M, K, &xp, &xr)) return 2;
    int oom = 0;
#pragma omp parallel if (M * K * N >= PARALLEL_MIN_MACS)
    {
        const Weights wt = {w, bf16, wide_buffer(bf16, K, &oom)};
        if (split_by_rows(bf16, M, N)) { /* each thread packs and multiplies its own row pairs */
            const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
            const int64_t p0 = pairs * tid / nt, p1 = pairs * (tid + 1) / nt, r1 = 2 * p1 < M ? 2 * p1 : M;
            es_pack_pairs(xr, xp, M, K, p0, p1);
            if (!oom && p1 > p0)
                rows_block(xr + 2 * p0, xp + p0 * 2 * k8, wt, y + 2 * p0 * N, N, r1 - 2 * p0, K, 0, N, NULL, NULL);
        } else {
            pack_groups(xr, xp, K, &zero, &M, &zero, 1);
#pragma omp barrier
            int64_t lo, hi;
            share(N, &lo, &hi);
            if (!oom) rows_block(xr, xp, wt, y, N, M, K, lo, hi, NULL, NULL);
        }
    }
    return oom ? 2 : 0;
}

/* Product rows per epilogue block (even: whole pairs): EPI_ROWS x N floats in this thread's
 * scratch, still in its L2 when es_qkv_rope_rows reads them (32, 64 and 128 measured within
 * noise of each other on the standard MoE's q/k/v). */
#define EPI_ROWS 128

/* es_linear_qkv_packed_f32 / es_linear_add_norm_packed_f32 (kernels.h): linear_packed's split by
 * rows for any shape (each output the same dot product whichever way, so the same bits), each
 * thread's rows EPI_ROWS at a time into its scratch, then the epilogue on them; no y. */
static int linear_epilogue(const float *x, const float *w, int64_t M, int64_t K, int64_t N, es_epilogue_fn epi,
                           const void *e) {
    if (!es_gemm_packed_available()) return 3;
    if (M <= 0) return 0;
    const int64_t k8 = K & ~(int64_t)7, pairs = (M + 1) / 2;
    float *xp;
    const float **xr;
    if (packed_input(x, M, K, &xp, &xr)) return 2;
    int oom = 0;
#pragma omp parallel if (M * K * N >= PARALLEL_MIN_MACS)
    {
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t p0 = pairs * tid / nt, p1 = pairs * (tid + 1) / nt, r1 = 2 * p1 < M ? 2 * p1 : M;
        const Weights wt = {w, 0, NULL};
        float *yb = p1 > p0 ? es_scratch(ES_SCRATCH_EPILOGUE, sizeof(float) * (size_t)(EPI_ROWS * N)) : NULL;
        if (p1 > p0 && !yb) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp barrier
        if (!oom && p1 > p0) {
            es_pack_pairs(xr, xp, M, K, p0, p1);
            for (int64_t r0 = 2 * p0; r0 < r1; r0 += EPI_ROWS) {
                const int64_t n = r1 - r0 < EPI_ROWS ? r1 - r0 : EPI_ROWS;
                rows_block(xr + r0, xp + r0 * k8, wt, yb, N, n, K, 0, N, NULL, NULL);
                epi(e, yb, r0, n);
            }
        }
    }
    return oom ? 2 : 0;
}

int es_linear_qkv_packed_f32(const float *x, const float *w, int64_t M, int64_t K, const EsQkvRope *e) {
    return linear_epilogue(x, w, M, K, (e->nh + 2 * e->nkv) * e->d, es_qkv_epilogue, e);
}

int es_linear_add_norm_packed_f32(const float *a, const float *w, int64_t M, int64_t K, const EsAddNorm *e) {
    return linear_epilogue(a, w, M, K, e->H, es_add_norm_epilogue, e);
}

int es_linear_packed_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
    return linear_packed(x, w, 0, y, M, K, N);
}

int es_linear_packed_bf16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N) {
    return linear_packed(x, w, 1, y, M, K, N);
}

/* The fused MoE block of gemm.c (es_moe_f32 / es_moe_bf16: same contract, same results bit
 * for bit) for many tokens: slots grouped by expert (token order within), each expert's rows
 * packed once and multiplied by its weights with the register-blocked kernel, both threads
 * sharing each expert's rows. With H and I multiples of 8 and k <= 2 slots a token (the fused
 * path) the SwiGLU is the gate/up product's epilogue (swiglu_block, h written packed) and the
 * weighted combine the down product's (put): one region, two barriers, no pass of the gate/up
 * product, h or the slots' outputs through memory. Else the unfused path: the products in
 * buffers, SwiGLU, packing h and the combine each a pass of their own.
 * Temporaries: this thread's ES_SCRATCH_MOE buffer (scratch.c).
 * Returns 0, 1 if an id is out of range, 2 when out of memory, 3 without AVX-512. */
static int moe_packed(const float *x, const int64_t *ids, const float *wts, const void *w_gu, const void *w_d,
                      int bf16, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    if (!es_gemm_packed_available()) return 3;
    const int64_t S = T * k;
    for (int64_t s = 0; s < S; s++)
        if (ids[s] < 0 || ids[s] >= E) return 1;
    const int fused = H % 8 == 0 && I % 8 == 0 && k <= 2;
    const int64_t h8 = H & ~(int64_t)7, i8 = I & ~(int64_t)7, kmax8 = h8 > i8 ? h8 : i8;
    const size_t n64 = sizeof(int64_t) * (size_t)E, fsz = sizeof(float);
    const size_t gu_n = (size_t)(S * 2 * I), hp_n = (size_t)((S + E) * i8 + 16);
    /* Every call takes the unfused layout's size (the fused path's packed h in gu's place, its
     * slots' tokens, weights and first flags in h's): the slot is shared with gemm.c's MoE
     * (es_moe_with, no larger), so whichever MoE kernel runs a step of some size first grows it
     * (scratch.c maps it in then) for all of them. */
    const size_t bytes[14] = {n64, n64, n64, sizeof(int64_t) * (size_t)(S + 1), n64, n64, n64, n64,
                              fsz * (gu_n > hp_n ? gu_n : hp_n),
                              fsz * (size_t)(S * I) > 13 * (size_t)S ? fsz * (size_t)(S * I) : 13 * (size_t)S,
                              fsz * (size_t)(S * H), fsz * (size_t)((S + E) * kmax8 + 16),
                              sizeof(float *) * (size_t)S, sizeof(float *) * (size_t)S};
    void *pt[14];
    if (es_scratch_parts(ES_SCRATCH_MOE, 14, bytes, pt)) return 2;
    int64_t *count = pt[0], *offset = pt[1], *fill = pt[2], *pos = pt[3], *a_start = pt[4], *a_count = pt[5];
    int64_t *a_poff = pt[6], *a_e = pt[7];
    float *gu = pt[8], *h = pt[9], *y = pt[10], *xp = pt[11], *hp = pt[8];
    const float **xin = pt[12], **hin = pt[13];
    int64_t *tok = pt[9]; /* fused: S each, in h's part (13 bytes a slot) */
    float *slot_w = (float *)(tok + S);
    unsigned char *first = (unsigned char *)(slot_w + S);
    int64_t n_active = 0, pacc = 0;
    int oom = 0;
    es_moe_group(ids, S, E, count, offset, fill, pos);
    for (int64_t e = 0; e < E; e++)
        if (count[e]) {
            a_e[n_active] = e;
            a_start[n_active] = offset[e];
            a_count[n_active] = count[e];
            a_poff[n_active++] = pacc;
            pacc += (count[e] + 1) / 2;
        }
    for (int64_t s = 0; s < S; s++) xin[pos[s]] = x + (s / k) * H;
    if (fused) {
        es_moe_combine_order(pos, wts, S, k, tok, slot_w, first);
#pragma omp parallel if (S * H * I >= PARALLEL_MIN_MACS)
        {
            const Weights gu_w = {w_gu, bf16, wide_buffer(bf16, H > I ? H : I, &oom)}, d_w = {w_d, bf16, gu_w.wide};
            const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
            const int64_t c0 = I / 8 * tid / nt * 8, c1 = I / 8 * (tid + 1) / nt * 8; /* h columns, 8 at a time */
            int64_t lo, hi;
            share(H, &lo, &hi); /* out's columns [lo, hi) are this thread's alone (the down product) */
            const int64_t c_nn = c1 - c0 < NH ? c1 - c0 : NH, d_nn = hi - lo < NC ? hi - lo : NC;
            pack_groups(xin, xp, H, a_start, a_count, a_poff, n_active);
#pragma omp barrier
            for (int64_t a = 0; a < n_active && !oom; a++) {
                /* while the last block runs: the next expert's first gate/up block, or the first down block */
                Ahead next = {{NULL, NULL}, {0, 0}};
                if (a + 1 < n_active) {
                    const Weights nw = offset_rows(gu_w, a_e[a + 1] * 2 * I, H);
                    ahead_rows(&next, 0, nw, c0, c0 + c_nn, H);
                    ahead_rows(&next, 1, nw, I + c0, I + c0 + c_nn, H);
                } else {
                    ahead_rows(&next, 0, offset_rows(d_w, a_e[0] * H, I), lo, lo + d_nn, I);
                }
                swiglu_block(xp + a_poff[a] * 2 * H, offset_rows(gu_w, a_e[a] * 2 * I, H), hp + a_poff[a] * 2 * I,
                             a_count[a], H, I, c0, c1, &next);
            }
#pragma omp barrier
            for (int64_t a = 0; a < n_active && !oom; a++) {
                const Combine ca = {out, H, tok + a_start[a], slot_w + a_start[a], first + a_start[a]};
                Ahead next = {{NULL, NULL}, {0, 0}};
                if (a + 1 < n_active) ahead_rows(&next, 0, offset_rows(d_w, a_e[a + 1] * H, I), lo, lo + d_nn, I);
                rows_block(NULL, hp + a_poff[a] * 2 * I, offset_rows(d_w, a_e[a] * H, I), NULL, H, a_count[a], I, lo,
                           hi, &ca, &next);
            }
        }
        return oom ? 2 : 0;
    }
    for (int64_t p = 0; p < S; p++) hin[p] = h + p * I;
#pragma omp parallel if (S * H * I >= PARALLEL_MIN_MACS)
    {
        int64_t lo, hi;
        const Weights gu_w = {w_gu, bf16, wide_buffer(bf16, H > I ? H : I, &oom)}, d_w = {w_d, bf16, gu_w.wide};
        pack_groups(xin, xp, H, a_start, a_count, a_poff, n_active);
#pragma omp barrier
        share(2 * I, &lo, &hi);
        for (int64_t a = 0; a < n_active && !oom; a++)
            rows_block(xin + a_start[a], xp + a_poff[a] * 2 * h8, offset_rows(gu_w, a_e[a] * 2 * I, H),
                       gu + a_start[a] * 2 * I, 2 * I, a_count[a], H, lo, hi, NULL, NULL);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t p = 0; p < S; p++) es_silu_mul(gu + p * 2 * I, gu + p * 2 * I + I, h + p * I, I);
        pack_groups(hin, xp, I, a_start, a_count, a_poff, n_active);
#pragma omp barrier
        share(H, &lo, &hi);
        for (int64_t a = 0; a < n_active && !oom; a++)
            rows_block(hin + a_start[a], xp + a_poff[a] * 2 * i8, offset_rows(d_w, a_e[a] * H, I), y + a_start[a] * H,
                       H, a_count[a], I, lo, hi, NULL, NULL);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) { /* as es_moe_f32 */
            float *o = out + t * H;
            for (int64_t n = 0; n < H; n++) {
                float s = wts[t * k] * y[pos[t * k] * H + n];
                for (int64_t j = 1; j < k; j++) s += wts[t * k + j] * y[pos[t * k + j] * H + n];
                o[n] = s;
            }
        }
    }
    return oom ? 2 : 0;
}

int es_moe_packed_f32(const float *x, const int64_t *ids, const float *wts, const float *w_gu, const float *w_d,
                      float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return moe_packed(x, ids, wts, w_gu, w_d, 0, out, T, k, E, H, I);
}

int es_moe_packed_bf16(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu,
                       const uint16_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return moe_packed(x, ids, wts, w_gu, w_d, 1, out, T, k, E, H, I);
}
