/* Per-layer elementwise kernels: SwiGLU gate, RMSNorm, q/k/v split + QK-norm + RoPE. */
#include "kernels.h"
#include "simd.h"
#include "simd512.h"

/* es_silu_mul's first n16 = n & ~15 elements on 16 lanes: per element the same operations
 * (exp16's lanes are exp8's), so the same bits. */
static K512 void silu_mul16(const float *g, const float *u, float *h, int64_t n16) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n16; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_storeu_ps(h + i, _mm512_mul_ps(sv, _mm512_loadu_ps(u + i)));
    }
}

/* h[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u for i < n: 16 lanes with AVX-512, then 8,
 * then one at a time, each element computed alike. */
KT void es_silu_mul(const float *g, const float *u, float *h, int64_t n) {
    int64_t i = 0;
    if (es_gemm_packed_available()) { /* AVX-512 */
        i = n & ~(int64_t)15;
        silu_mul16(g, u, h, i);
    }
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) h[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
}

/* y[i] = 1 / (1 + exp(-x[i])) for i < n: each element the same operations whatever its
 * position (exp1 is exp8's lane), so a row's gates do not depend on the rows around it. */
KT void es_sigmoid(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(),
                                                                                          _mm256_loadu_ps(x + i))))));
    for (; i < n; i++) y[i] = 1.0f / (1.0f + exp1(-x[i]));
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
KT void es_rms_norm_f32(const float *x, const float *w, float *out, int64_t T, int64_t H, float eps) {
    if (T * H < 16 * PARALLEL_MIN_MACS) {
        for (int64_t t = 0; t < T; t++) rms_row(x + t * H, w, out + t * H, H, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) rms_row(x + t * H, w, out + t * H, H, eps);
}

/* The pre-norm block's residual add and the next RMSNorm in one pass: s[T, H] = x + a (each element
 * one fp32 add, as torch's), out = rms_norm(s) * w (rms_row). s may be a (in place); the same bits
 * as torch's x + a followed by es_rms_norm_f32, in one team instead of two. */
KT void es_add_rms_norm_f32(const float *x, const float *a, const float *w, float *s, float *out, int64_t T, int64_t H,
                            float eps) {
#pragma omp parallel for schedule(static) if (T * H >= 16 * PARALLEL_MIN_MACS)
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H, *at = a + t * H;
        float *st = s + t * H;
        for (int64_t i = 0; i < H; i++) st[i] = xt[i] + at[i];
        rms_row(st, w, out + t * H, H, eps);
    }
}

/* The o-proj linear's epilogue (es_linear_add_norm_*): rows y[0..n) of the product (tokens t0 ..
 * t0 + n), bias added in place first (torch's y.add_(bias)), then es_add_rms_norm_f32's work with
 * a = y: s = x + a, out = rms_norm(s) * w, the same operations, so the same bits. */
KT void es_add_rms_rows(const EsAddNorm *e, float *y, int64_t t0, int64_t n) {
    const int64_t H = e->H;
    for (int64_t r = 0; r < n; r++) {
        float *at = y + r * H;
        const float *xt = e->x + (t0 + r) * H;
        float *st = e->s + (t0 + r) * H;
        if (e->bias)
            for (int64_t i = 0; i < H; i++) at[i] = at[i] + e->bias[i];
        for (int64_t i = 0; i < H; i++) st[i] = xt[i] + at[i];
        rms_row(st, e->w, e->out + (t0 + r) * H, H, e->eps);
    }
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

/* One token's row src of qkv [(nh + 2 nkv) d] (rows q | k | v): per-head RMS norm of q and k when
 * qw/kw are given (weights [d]), RoPE on q and k with the token's cos/sin [d]; q heads to q
 * [nh, d], k and v heads to k and v [nkv, d]. */
static KT void qkv_rope_row(const float *src, const float *c, const float *sn, const float *qw, const float *kw,
                            float eps, float *q, float *k, float *v, int64_t nh, int64_t nkv, int64_t d) {
    for (int64_t h = 0; h < nh; h++) {
        float *dst = q + h * d;
        if (qw) rms_row(src + h * d, qw, dst, d, eps);
        else for (int64_t i = 0; i < d; i++) dst[i] = src[h * d + i];
        rope_head(dst, c, sn, d);
    }
    for (int64_t h = 0; h < nkv; h++) {
        float *dst = k + h * d;
        if (kw) rms_row(src + (nh + h) * d, kw, dst, d, eps);
        else for (int64_t i = 0; i < d; i++) dst[i] = src[(nh + h) * d + i];
        rope_head(dst, c, sn, d);
        for (int64_t i = 0; i < d; i++) v[h * d + i] = src[(nh + nkv + h) * d + i];
    }
}

/* Split qkv[T, (nh + 2 nkv) d] into q[T, nh, d], k[T, nkv, d], v[T, nkv, d]; per-head RMS
 * norm of q and k when qw/kw are given (weights [d]); RoPE on q and k with cos/sin[T, d].
 * With slots, token t's k and v rows go to row slots[t] of k and v (a KV cache layer
 * [slots, nkv, d]) instead of row t: the same values, stored where the cache keeps them. */
static KT void qkv_rope_token(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                              float eps, float *q, float *k, float *v, const int64_t *slots, int64_t t, int64_t nh,
                              int64_t nkv, int64_t d) {
    const int64_t kr = slots ? slots[t] : t;
    qkv_rope_row(qkv + t * (nh + 2 * nkv) * d, cos + t * d, sin + t * d, qw, kw, eps, q + t * nh * d,
                 k + kr * nkv * d, v + kr * nkv * d, nh, nkv, d);
}

#define K16 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

/* One head of d (d % 32 == 0) of qkv_rope_row on 16 lanes: rms_row's sum of squares (the same
 * 8-lane loop and tree), then w * (x * r) and the rotation of elements i and i + d/2 16 at a
 * time, each element the same fp32 operations as rms_row and rope_head, so the same bits. */
static K16 inline void rope_head16(const float *src, const float *w, float eps, const float *c, const float *sn,
                                   float *dst, int64_t d) {
    const int64_t half = d / 2;
    __m512 r = _mm512_set1_ps(1.0f);
    if (w) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 v = _mm256_loadu_ps(src + i);
            a = _mm256_fmadd_ps(v, v, a);
        }
        r = _mm512_set1_ps(1.0f / sqrtf(hsum8(a) / (float)d + eps));
    }
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < half; i += 16) {
        __m512 a = _mm512_loadu_ps(src + i), b = _mm512_loadu_ps(src + i + half);
        if (w) {
            a = _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(a, r));
            b = _mm512_mul_ps(_mm512_loadu_ps(w + i + half), _mm512_mul_ps(b, r));
        }
        _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_mul_ps(a, _mm512_loadu_ps(c + i)),
                                                _mm512_mul_ps(_mm512_xor_ps(b, sign), _mm512_loadu_ps(sn + i))));
        _mm512_storeu_ps(dst + i + half, _mm512_add_ps(_mm512_mul_ps(b, _mm512_loadu_ps(c + i + half)),
                                                       _mm512_mul_ps(a, _mm512_loadu_ps(sn + i + half))));
    }
}

/* qkv_rope_row on 16 lanes for d % 32 == 0 (rope_head16; v copied), the bias added first. */
static K16 void qkv_rope_row16(const EsQkvRope *e, float *src, int64_t t, float *q, float *k, float *v) {
    const int64_t nh = e->nh, nkv = e->nkv, d = e->d, row = (nh + 2 * nkv) * d;
    const float *c = e->cos + t * d, *sn = e->sin + t * d;
    if (e->bias)
        for (int64_t i = 0; i < row; i += 16)
            _mm512_storeu_ps(src + i, _mm512_add_ps(_mm512_loadu_ps(src + i), _mm512_loadu_ps(e->bias + i)));
    for (int64_t h = 0; h < nh; h++) rope_head16(src + h * d, e->qw, e->eps, c, sn, q + h * d, d);
    for (int64_t h = 0; h < nkv; h++) rope_head16(src + (nh + h) * d, e->kw, e->eps, c, sn, k + h * d, d);
    for (int64_t i = 0; i < nkv * d; i += 16) _mm512_storeu_ps(v + i, _mm512_loadu_ps(src + (nh + nkv) * d + i));
}

/* The q/k/v linear's epilogue (es_linear_qkv_*): rows y[0..n) of the product (tokens t0 ..
 * t0 + n), bias added in place first (each element one fp32 add, as torch's y.add_(bias)), then
 * es_qkv_rope_f32's work on each row: the bits of the linear, the bias add and es_qkv_rope_f32.
 * On 16 lanes (qkv_rope_row16) where d % 32 == 0 and the CPU has AVX-512. */
KT void es_qkv_rope_rows(const EsQkvRope *e, float *y, int64_t t0, int64_t n) {
    const int64_t nh = e->nh, nkv = e->nkv, d = e->d, row = (nh + 2 * nkv) * d;
    const int wide = d % 32 == 0 && es_gemm_packed_available();
    for (int64_t r = 0; r < n; r++) {
        float *src = y + r * row;
        const int64_t t = t0 + r, kr = e->slots ? e->slots[t] : t;
        float *q = e->q + t * nh * d, *k = e->k + kr * nkv * d, *v = e->v + kr * nkv * d;
        if (wide) {
            qkv_rope_row16(e, src, t, q, k, v);
            continue;
        }
        if (e->bias)
            for (int64_t i = 0; i < row; i++) src[i] = src[i] + e->bias[i];
        qkv_rope_row(src, e->cos + t * d, e->sin + t * d, e->qw, e->kw, e->eps, q, k, v, nh, nkv, d);
    }
}

/* One head of qkv_rope_token's work (head < nh: q head; < nh + nkv: k head; else v head), for
 * callers that split a token's heads over threads (decode_layer.c): the same operations. */
KT void es_qkv_rope_head(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                         float eps, float *q, float *k, float *v, int64_t t, int64_t head, int64_t nh, int64_t nkv,
                         int64_t d) {
    const float *src = qkv + t * (nh + 2 * nkv) * d + head * d, *c = cos + t * d, *sn = sin + t * d;
    if (head >= nh + nkv) {
        for (int64_t i = 0; i < d; i++) v[(t * nkv + head - nh - nkv) * d + i] = src[i];
        return;
    }
    const float *w = head < nh ? qw : kw;
    float *dst = head < nh ? q + (t * nh + head) * d : k + (t * nkv + head - nh) * d;
    if (w) rms_row(src, w, dst, d, eps);
    else for (int64_t i = 0; i < d; i++) dst[i] = src[i];
    rope_head(dst, c, sn, d);
}

KT void es_qkv_rope_f32(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                            float eps, float *q, float *k, float *v, const int64_t *slots, int64_t T, int64_t nh,
                            int64_t nkv, int64_t d) {
    if (T * (nh + 2 * nkv) * d < 16 * PARALLEL_MIN_MACS) {
        for (int64_t t = 0; t < T; t++) qkv_rope_token(qkv, cos, sin, qw, kw, eps, q, k, v, slots, t, nh, nkv, d);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) qkv_rope_token(qkv, cos, sin, qw, kw, eps, q, k, v, slots, t, nh, nkv, d);
}
