/* execstate CPU kernels: bandwidth-bound small-batch fp32 GEMM and a fused MoE expert block.
 *
 * Why: at decode, a step multiplies a few rows (batch <= 16; an MoE expert sees 1-4 tokens)
 * by large weight matrices. That is memory-bound: the best kernel reads every weight once at
 * DRAM speed. torch's MKL path reaches ~10 GB/s on this kind of call on AMD CPUs; these
 * kernels stream each weight row once for all M rows and reach ~25-30 GB/s on 2 cores.
 *
 * Contracts (callers validate shapes/dtypes/contiguity; see execstate/kernels/cpu.py):
 *   linear: y[M, N] = x[M, K] @ w[N, K]^T; all fp32, row-major, contiguous.
 *   moe:    out[T, H] = sum_j wts[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j],
 *           w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I]; ids int64, wts fp32.
 *
 * Numerics: every output element y[m, n] is one dot product computed the same way whatever
 * M, the other rows, the thread count or the code path: 8 fp32 lanes accumulate k = lane
 * (mod 8) in order with FMA, the lanes are summed in a fixed tree, then the K % 8 tail is
 * added in order with fmaf. Results are therefore deterministic and batch-invariant (a row's
 * result does not depend on which rows share its batch). They differ from MKL's by normal
 * fp32 rounding (~1e-6 relative), which is why the engine records the kernel set in its
 * provenance numerics.
 *
 * Threads: OpenMP. Loaded after torch, this module binds to the libgomp torch already
 * loaded (same soname), so it shares torch's thread pool and torch.set_num_threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

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

static KT inline float finish(__m256 acc, const float *w, const float *x, int64_t k8, int64_t K) {
    float s = hsum8(acc);
    for (int64_t k = k8; k < K; k++) s = fmaf(w[k], x[k], s);
    return s;
}

/* 4 x rows by 2 weight rows (w0 = row n, w1 = row n + 1): 6 loads per 8 FMAs. */
static KT inline void dot_4x2(const float *const *xr, float *const *yr, const float *w0, const float *w1,
                              int64_t n, int64_t k8, int64_t K) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *p0 = w0 + PF_ROWS * K, *p1 = w1 + PF_ROWS * K;
    for (int64_t k = 0; k < k8; k += 8) {
        PF(p0 + k); PF(p1 + k);
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        __m256 u = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(v0, u, a0); b0 = _mm256_fmadd_ps(v1, u, b0);
        u = _mm256_loadu_ps(x1 + k);
        a1 = _mm256_fmadd_ps(v0, u, a1); b1 = _mm256_fmadd_ps(v1, u, b1);
        u = _mm256_loadu_ps(x2 + k);
        a2 = _mm256_fmadd_ps(v0, u, a2); b2 = _mm256_fmadd_ps(v1, u, b2);
        u = _mm256_loadu_ps(x3 + k);
        a3 = _mm256_fmadd_ps(v0, u, a3); b3 = _mm256_fmadd_ps(v1, u, b3);
    }
    yr[0][n] = finish(a0, w0, x0, k8, K); yr[0][n + 1] = finish(b0, w1, x0, k8, K);
    yr[1][n] = finish(a1, w0, x1, k8, K); yr[1][n + 1] = finish(b1, w1, x1, k8, K);
    yr[2][n] = finish(a2, w0, x2, k8, K); yr[2][n + 1] = finish(b2, w1, x2, k8, K);
    yr[3][n] = finish(a3, w0, x3, k8, K); yr[3][n + 1] = finish(b3, w1, x3, k8, K);
}

/* yr[m][n] = dot(xr[m], w + n*K) for m < M, n in [n0, n1). Weight rows are taken 4 at a
 * time (read from memory once, reused from L1 by every group of x rows). */
static KT void dot_rows(const float *const *xr, float *const *yr, int64_t M, const float *w, int64_t K,
                        int64_t n0, int64_t n1) {
    const int64_t k8 = K & ~(int64_t)7;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        const float *w0 = w + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            dot_4x2(xr + m, yr + m, w0, w1, n, k8, K);
            dot_4x2(xr + m, yr + m, w2, w3, n + 2, k8, K);
        }
        for (; m + 2 <= M; m += 2) {
            const float *xa = xr[m], *xb = xr[m + 1];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int64_t k = 0; k < k8; k += 8) {
                PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
                __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
                __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
                __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
                a0 = _mm256_fmadd_ps(v0, va, a0); b0 = _mm256_fmadd_ps(v0, vb, b0);
                a1 = _mm256_fmadd_ps(v1, va, a1); b1 = _mm256_fmadd_ps(v1, vb, b1);
                a2 = _mm256_fmadd_ps(v2, va, a2); b2 = _mm256_fmadd_ps(v2, vb, b2);
                a3 = _mm256_fmadd_ps(v3, va, a3); b3 = _mm256_fmadd_ps(v3, vb, b3);
            }
            float *ya = yr[m], *yb = yr[m + 1];
            ya[n] = finish(a0, w0, xa, k8, K); yb[n] = finish(b0, w0, xb, k8, K);
            ya[n + 1] = finish(a1, w1, xa, k8, K); yb[n + 1] = finish(b1, w1, xb, k8, K);
            ya[n + 2] = finish(a2, w2, xa, k8, K); yb[n + 2] = finish(b2, w2, xb, k8, K);
            ya[n + 3] = finish(a3, w3, xa, k8, K); yb[n + 3] = finish(b3, w3, xb, k8, K);
        }
        if (m < M) {
            const float *xa = xr[m];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < k8; k += 8) {
                PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
                __m256 va = _mm256_loadu_ps(xa + k);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), va, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), va, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), va, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), va, a3);
            }
            float *ya = yr[m];
            ya[n] = finish(a0, w0, xa, k8, K);
            ya[n + 1] = finish(a1, w1, xa, k8, K);
            ya[n + 2] = finish(a2, w2, xa, k8, K);
            ya[n + 3] = finish(a3, w3, xa, k8, K);
        }
    }
    for (; n < n1; n++) {
        const float *w0 = w + n * K;
        for (int64_t m = 0; m < M; m++) {
            const float *xa = xr[m];
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t k = 0; k < k8; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(xa + k), a0);
            yr[m][n] = finish(a0, w0, xa, k8, K);
        }
    }
}

/* This thread's share [*lo, *hi) of `total` rows, in multiples of 4 rows. */
static inline void share(int64_t total, int64_t *lo, int64_t *hi) {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int64_t blocks = (total + 3) / 4;
    int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    *lo = b0 * 4 < total ? b0 * 4 : total;
    *hi = b1 * 4 < total ? b1 * 4 : total;
}

/* Returns 0, or 2 when out of memory (nothing computed). */
static KT int linear_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
    const float **xr = malloc(sizeof(float *) * (M + 1));
    float **yr = malloc(sizeof(float *) * (M + 1));
    if (!xr || !yr) {
        free(xr);
        free(yr);
        return 2;
    }
    for (int64_t m = 0; m < M; m++) { xr[m] = x + m * K; yr[m] = y + m * N; }
    if (M * K * N < PARALLEL_MIN_MACS) { /* serial: no OpenMP team setup at all */
        dot_rows(xr, yr, M, w, K, 0, N);
    } else {
#pragma omp parallel
        {
            int64_t lo, hi;
            share(N, &lo, &hi);
            dot_rows(xr, yr, M, w, K, lo, hi);
        }
    }
    free(xr);
    free(yr);
    return 0;
}

/* Rows [lo, hi) of the concatenation over active experts of `rows` rows each, as
 * dot_rows calls on each expert's weight (stride `estride` floats) and its slot rows. */
static KT void expert_rows(int64_t lo, int64_t hi, int64_t rows, const int64_t *active, int64_t n_active,
                           const int64_t *offset, const int64_t *count, const float *const *in,
                           float *const *out, const float *w, int64_t estride, int64_t K) {
    for (int64_t a = lo / rows; a < n_active && a * rows < hi; a++) {
        int64_t r0 = a * rows > lo ? 0 : lo - a * rows;
        int64_t r1 = (a + 1) * rows < hi ? rows : hi - a * rows;
        int64_t e = active[a];
        dot_rows(in + offset[e], out + offset[e], count[e], w + e * estride, K, r0, r1);
    }
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

/* h[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u for i < n. */
static KT void silu_mul(const float *g, const float *u, float *h, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) h[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
}

/* Returns 0, 1 if an id is out of range or 2 when out of memory (nothing computed then). */
static KT int moe_f32(const float *x, const int64_t *ids, const float *wts, const float *w_gu, const float *w_d,
                      float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    const int64_t S = T * k;
    for (int64_t s = 0; s < S; s++)
        if (ids[s] < 0 || ids[s] >= E) return 1;
    int64_t *count = calloc(E, sizeof(int64_t)), *offset = malloc(sizeof(int64_t) * E);
    int64_t *active = malloc(sizeof(int64_t) * E), *pos = malloc(sizeof(int64_t) * S);
    int64_t *fill = malloc(sizeof(int64_t) * E);
    float *gu = malloc(sizeof(float) * S * 2 * I), *h = malloc(sizeof(float) * S * I);
    float *y = malloc(sizeof(float) * S * H);
    const float **xin = malloc(sizeof(float *) * S), **hin = malloc(sizeof(float *) * S);
    float **guo = malloc(sizeof(float *) * S), **yo = malloc(sizeof(float *) * S);
    int64_t n_active = 0, acc = 0;
    int oom = !count || !offset || !active || !pos || !fill || !gu || !h || !y || !xin || !hin || !guo || !yo;
    if (oom) goto done;
    for (int64_t s = 0; s < S; s++) count[ids[s]]++;
    for (int64_t e = 0; e < E; e++) {
        offset[e] = fill[e] = acc;
        acc += count[e];
        if (count[e]) active[n_active++] = e;
    }
    for (int64_t s = 0; s < S; s++) { /* slots grouped by expert, token order within */
        int64_t p = fill[ids[s]]++;
        pos[s] = p;
        xin[p] = x + (s / k) * H;
    }
    for (int64_t p = 0; p < S; p++) {
        guo[p] = gu + p * 2 * I;
        hin[p] = h + p * I;
        yo[p] = y + p * H;
    }
#pragma omp parallel if (S * H * I >= PARALLEL_MIN_MACS)
    {
        int64_t lo, hi;
        share(n_active * 2 * I, &lo, &hi);
        expert_rows(lo, hi, 2 * I, active, n_active, offset, count, xin, guo, w_gu, 2 * I * H, H);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t p = 0; p < S; p++) silu_mul(gu + p * 2 * I, gu + p * 2 * I + I, h + p * I, I);
        share(n_active * H, &lo, &hi);
        expert_rows(lo, hi, H, active, n_active, offset, count, hin, yo, w_d, H * I, I);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float *o = out + t * H;
            for (int64_t n = 0; n < H; n++) {
                float s = wts[t * k] * y[pos[t * k] * H + n];
                for (int64_t j = 1; j < k; j++) s += wts[t * k + j] * y[pos[t * k + j] * H + n];
                o[n] = s;
            }
        }
    }
done:
    free(count); free(offset); free(active); free(pos); free(fill);
    free(gu); free(h); free(y); free(xin); free(hin); free(guo); free(yo);
    return oom ? 2 : 0;
}

/* Pointer to position l's row of KV head h in a paged cache. */
static inline const float *kv_row(const float *cache, const int64_t *bt, int64_t l, int64_t bs, int64_t nkv,
                                  int64_t h, int64_t d) {
    return cache + ((bt[l / bs] * bs + l % bs) * nkv + h) * d;
}

/* s[l] = dot(q, K_l) * scale for l < L, four positions at a time (independent FMA chains);
 * every score is the same 8-lane dot product + finish whichever path computes it. */
static KT void scores(const float *qg, const float *kc, const int64_t *bt, int64_t L, int64_t bs, int64_t nkv,
                      int64_t h, int64_t d, float scale, float *s) {
    const int64_t d8 = d & ~(int64_t)7;
    int64_t l = 0;
    for (; l + 4 <= L; l += 4) {
        const float *k0 = kv_row(kc, bt, l, bs, nkv, h, d), *k1 = kv_row(kc, bt, l + 1, bs, nkv, h, d);
        const float *k2 = kv_row(kc, bt, l + 2, bs, nkv, h, d), *k3 = kv_row(kc, bt, l + 3, bs, nkv, h, d);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), qv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + i), qv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + i), qv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + i), qv, a3);
        }
        s[l] = finish(a0, k0, qg, d8, d) * scale;
        s[l + 1] = finish(a1, k1, qg, d8, d) * scale;
        s[l + 2] = finish(a2, k2, qg, d8, d) * scale;
        s[l + 3] = finish(a3, k3, qg, d8, d) * scale;
    }
    for (; l < L; l++) {
        const float *k0 = kv_row(kc, bt, l, bs, nkv, h, d);
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), _mm256_loadu_ps(qg + i), a0);
        s[l] = finish(a0, k0, qg, d8, d) * scale;
    }
}

/* s[l] <- exp(s[l] - max) for l < L; returns the sum (8 lanes, then the tail in order). */
static KT float softmax_numerators(float *s, int64_t L) {
    float mx = -INFINITY;
    for (int64_t l = 0; l < L; l++) mx = s[l] > mx ? s[l] : mx;
    int64_t l = 0;
    __m256 acc = _mm256_setzero_ps();
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

/* o[i] = inv * sum_l s[l] V_l[i] (FMA in l order). Full 64-wide chunks accumulate in
 * registers; other widths in o itself; both round identically. */
static KT void weighted_values(const float *s, const float *vc, const int64_t *bt, int64_t L, int64_t bs,
                               int64_t nkv, int64_t h, int64_t d, float inv, float *o) {
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0, r7 = r0;
        for (int64_t l = 0; l < L; l++) {
            const float *vp = kv_row(vc, bt, l, bs, nkv, h, d) + c;
            const __m256 p = _mm256_set1_ps(s[l]);
            r0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp), r0);
            r1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 8), r1);
            r2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 16), r2);
            r3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 24), r3);
            r4 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 32), r4);
            r5 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 40), r5);
            r6 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 48), r6);
            r7 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 56), r7);
        }
        const __m256 iv = _mm256_set1_ps(inv);
        _mm256_storeu_ps(o + c, _mm256_mul_ps(r0, iv));
        _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(r1, iv));
        _mm256_storeu_ps(o + c + 16, _mm256_mul_ps(r2, iv));
        _mm256_storeu_ps(o + c + 24, _mm256_mul_ps(r3, iv));
        _mm256_storeu_ps(o + c + 32, _mm256_mul_ps(r4, iv));
        _mm256_storeu_ps(o + c + 40, _mm256_mul_ps(r5, iv));
        _mm256_storeu_ps(o + c + 48, _mm256_mul_ps(r6, iv));
        _mm256_storeu_ps(o + c + 56, _mm256_mul_ps(r7, iv));
    }
    if (c == d) return;
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t i = c; i < d; i++) o[i] = 0.0f;
    for (int64_t l = 0; l < L; l++) {
        const float *vp = kv_row(vc, bt, l, bs, nkv, h, d);
        const __m256 p = _mm256_set1_ps(s[l]);
        int64_t i = c;
        for (; i < d8; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + i), _mm256_loadu_ps(o + i)));
        for (; i < d; i++) o[i] = fmaf(s[l], vp[i], o[i]);
    }
    for (int64_t i = c; i < d; i++) o[i] *= inv;
}

/* Decode attention over a paged KV cache, one query token per sequence.
 * q [*, nh, d] (row tok[b] is sequence b's query), k/v caches [slots, nkv, d],
 * block_table [B, max_blocks], ctx_len [B]; out rows tok[b] get softmax(q k^T * scale) v
 * over the sequence's ctx_len cached positions. Query head j uses KV head j / (nh / nkv).
 * One work item per (sequence, query head), so even batch 1 spreads over the threads;
 * scores are fp32, softmax subtracts the max. */
static KT int decode_attention_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                                   const int64_t *block_table, const int64_t *ctx_len, int64_t B, int64_t max_blocks,
                                   int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale) {
    const int64_t G = nh / nkv;
    int64_t lmax = 0;
    for (int64_t b = 0; b < B; b++) lmax = ctx_len[b] > lmax ? ctx_len[b] : lmax;
    int oom = 0;
#pragma omp parallel if (B * nh * lmax * d >= PARALLEL_MIN_MACS)
    {
        float *sc = malloc(sizeof(float) * (lmax + 1));
        if (!sc) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < B * nh; item++) {
            if (!sc) continue;
            const int64_t b = item / nh, j = item % nh, h = j / G, L = ctx_len[b];
            const int64_t *bt = block_table + b * max_blocks;
            scores(q + (tok[b] * nh + j) * d, kc, bt, L, bs, nkv, h, d, scale, sc);
            const float sum = softmax_numerators(sc, L);
            weighted_values(sc, vc, bt, L, bs, nkv, h, d, 1.0f / sum, out + (tok[b] * nh + j) * d);
        }
        free(sc);
    }
    return oom ? 2 : 0;
}

/* out[i] = w[i] * (x[i] * (1 / sqrt(mean(x^2) + eps))) over one row of n; the mean is an
 * 8-lane sum of squares (fixed order) divided by n. */
static KT void rms_row(const float *x, const float *w, float *out, int64_t n, float eps) {
    const int64_t n8 = n & ~(int64_t)7;
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a = _mm256_fmadd_ps(v, v, a);
    }
    float ss = finish(a, x, x, n8, n);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 rv = _mm256_set1_ps(r);
    int64_t i = 0;
    for (; i < n8; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* out[T, H] = rms_norm(x[T, H]) * w[H]; threads only for large T (a team costs microseconds). */
static KT void rms_norm_f32(const float *x, const float *w, float *out, int64_t T, int64_t H, float eps) {
    if (T * H < 16 * PARALLEL_MIN_MACS) {
        for (int64_t t = 0; t < T; t++) rms_row(x + t * H, w, out + t * H, H, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) rms_row(x + t * H, w, out + t * H, H, eps);
}

/* Rotate one head of d in place ("rotate_half" layout):
 * y[i] = x[i] cos[i] - x[i + d/2] sin[i], y[i + d/2] = x[i + d/2] cos[i + d/2] + x[i] sin[i + d/2]. */
static inline void rope_head(float *x, const float *cos, const float *sin, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] + (-b) * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Split qkv[T, (nh + 2 nkv) d] into q[T, nh, d], k[T, nkv, d], v[T, nkv, d]; per-head RMS
 * norm of q and k when qw/kw are given (weights [d]); RoPE on q and k with cos/sin[T, d]. */
static KT void qkv_rope_token(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                              float eps, float *q, float *k, float *v, int64_t t, int64_t nh, int64_t nkv, int64_t d) {
    const int64_t row = (nh + 2 * nkv) * d;
    {
        const float *src = qkv + t * row, *c = cos + t * d, *sn = sin + t * d;
        for (int64_t h = 0; h < nh; h++) {
            float *dst = q + (t * nh + h) * d;
            if (qw) rms_row(src + h * d, qw, dst, d, eps);
            else for (int64_t i = 0; i < d; i++) dst[i] = src[h * d + i];
            rope_head(dst, c, sn, d);
        }
        for (int64_t h = 0; h < nkv; h++) {
            float *dst = k + (t * nkv + h) * d;
            if (kw) rms_row(src + (nh + h) * d, kw, dst, d, eps);
            else for (int64_t i = 0; i < d; i++) dst[i] = src[(nh + h) * d + i];
            rope_head(dst, c, sn, d);
            for (int64_t i = 0; i < d; i++) v[(t * nkv + h) * d + i] = src[(nh + nkv + h) * d + i];
        }
    }
}

static KT void qkv_rope_f32(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                            float eps, float *q, float *k, float *v, int64_t T, int64_t nh, int64_t nkv, int64_t d) {
    if (T * (nh + 2 * nkv) * d < 16 * PARALLEL_MIN_MACS) {
        for (int64_t t = 0; t < T; t++) qkv_rope_token(qkv, cos, sin, qw, kw, eps, q, k, v, t, nh, nkv, d);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) qkv_rope_token(qkv, cos, sin, qw, kw, eps, q, k, v, t, nh, nkv, d);
}

static int cpu_ok(void) {
    static int ok = -1; /* probed once */
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}

static PyObject *py_available(PyObject *self, PyObject *args) { return PyBool_FromLong(cpu_ok()); }

static PyObject *py_max_threads(PyObject *self, PyObject *args) { return PyLong_FromLong(omp_get_max_threads()); }

static PyObject *py_linear(PyObject *self, PyObject *args) {
    unsigned long long x, w, y;
    Py_ssize_t M, K, N;
    int status;
    if (!PyArg_ParseTuple(args, "KKKnnn", &x, &w, &y, &M, &K, &N)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (M < 0 || K < 0 || N < 0) return PyErr_Format(PyExc_ValueError, "linear: negative size");
    Py_BEGIN_ALLOW_THREADS
    status = linear_f32((const float *)x, (const float *)w, (float *)y, M, K, N);
    Py_END_ALLOW_THREADS
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_moe(PyObject *self, PyObject *args) {
    unsigned long long x, ids, wts, wgu, wd, out;
    Py_ssize_t T, k, E, H, I;
    int bad;
    if (!PyArg_ParseTuple(args, "KKKKKKnnnnn", &x, &ids, &wts, &wgu, &wd, &out, &T, &k, &E, &H, &I)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || k < 1 || E < 1 || H < 1 || I < 1) return PyErr_Format(PyExc_ValueError, "moe: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    bad = moe_f32((const float *)x, (const int64_t *)ids, (const float *)wts, (const float *)wgu,
                  (const float *)wd, (float *)out, T, k, E, H, I);
    Py_END_ALLOW_THREADS
    if (bad == 2) return PyErr_NoMemory();
    if (bad) return PyErr_Format(PyExc_ValueError, "moe: expert id outside [0, %zd)", E);
    Py_RETURN_NONE;
}

static PyObject *py_decode_attention(PyObject *self, PyObject *args) {
    unsigned long long q, kc, vc, out, tok, bt, cl;
    Py_ssize_t B, max_blocks, nh, nkv, d, bs;
    float scale;
    int status;
    if (!PyArg_ParseTuple(args, "KKKKKKKnnnnnnf", &q, &kc, &vc, &out, &tok, &bt, &cl, &B, &max_blocks, &nh, &nkv, &d,
                          &bs, &scale))
        return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (B < 0 || max_blocks < 1 || nkv < 1 || nh % nkv || d < 1 || bs < 1)
        return PyErr_Format(PyExc_ValueError, "decode_attention: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    status = decode_attention_f32((const float *)q, (const float *)kc, (const float *)vc, (float *)out,
                                  (const int64_t *)tok, (const int64_t *)bt, (const int64_t *)cl, B, max_blocks, nh,
                                  nkv, d, bs, scale);
    Py_END_ALLOW_THREADS
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    Py_ssize_t T, H;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKnnf", &x, &w, &out, &T, &H, &eps)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || H < 1) return PyErr_Format(PyExc_ValueError, "rms_norm: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    rms_norm_f32((const float *)x, (const float *)w, (float *)out, T, H, eps);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_qkv_rope(PyObject *self, PyObject *args) {
    unsigned long long qkv, cos, sin, qw, kw, q, k, v;
    Py_ssize_t T, nh, nkv, d;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKKKfKKKnnnn", &qkv, &cos, &sin, &qw, &kw, &eps, &q, &k, &v, &T, &nh, &nkv, &d))
        return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || nh < 1 || nkv < 1 || d < 2 || d % 2) return PyErr_Format(PyExc_ValueError, "qkv_rope: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    qkv_rope_f32((const float *)qkv, (const float *)cos, (const float *)sin, (const float *)qw, (const float *)kw, eps,
                 (float *)q, (float *)k, (float *)v, T, nh, nkv, d);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    unsigned long long gu, h;
    Py_ssize_t T, I;
    if (!PyArg_ParseTuple(args, "KKnn", &gu, &h, &T, &I)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || I < 1) return PyErr_Format(PyExc_ValueError, "silu_mul: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < T; t++)
        silu_mul((const float *)gu + t * 2 * I, (const float *)gu + t * 2 * I + I, (float *)h + t * I, I);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, w, out, T, H, eps) (fp32 data pointers)."},
    {"qkv_rope", py_qkv_rope, METH_VARARGS,
     "qkv_rope(qkv, cos, sin, q_norm_w or 0, k_norm_w or 0, eps, q, k, v, T, nh, nkv, d) (fp32 data pointers)."},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(gate_up, h, T, I): h = silu(gate) * up per row."},
    {"decode_attention", py_decode_attention, METH_VARARGS,
     "decode_attention(q, k_cache, v_cache, out, tok, block_table, ctx_len, B, max_blocks, nh, nkv, d, bs, scale)."},
    {"available", py_available, METH_NOARGS, "True when this CPU has AVX2 and FMA."},
    {"max_threads", py_max_threads, METH_NOARGS, "omp_get_max_threads() of the OpenMP runtime in use."},
    {"linear", py_linear, METH_VARARGS, "linear(x, w, y, M, K, N): y = x @ w.T (fp32 data pointers)."},
    {"moe", py_moe, METH_VARARGS, "moe(x, ids, wts, w_gate_up, w_down, out, T, k, E, H, I) (data pointers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu", "execstate CPU kernels", -1, methods};

PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&module); }
