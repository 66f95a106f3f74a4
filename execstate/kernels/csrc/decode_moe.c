/* A MoE layer's routing and experts inside the whole-layer decode call (decode_layer.c), and the
 * routing kernel the per-op path shares with it (model/moe.py SparseMoE.route on the kernels).
 *
 * Routing of token t over E experts (es_route), one fixed order of operations:
 *   m = max_e l[e]; p[e] = exp(l[e] - m) (exp1, simd.h); s = p[0] + ... + p[E-1] in expert order;
 *   p[e] = p[e] / s;
 *   ids = the k largest p in descending order, the lower expert id first among equal values;
 *   a replayed token (mask[t]) takes its forced ids instead, in their order, and their p;
 *   with norm_topk, w[j] = w[j] / (w[0] + ... + w[k-1]) (the sum in slot order).
 * It differs from torch.softmax's rounding (a different exp and sum order), so the engine names
 * this kernel set in its numerics; prefill and decode both route here, so a token's routes and
 * weights are the same bits whichever path computed it.
 *
 * The experts (es_moe_layer) compute every slot exactly as es_moe_with (gemm.c) does: slots
 * grouped by expert (token order within), gate/up rows by the format's row kernel, silu * up,
 * down rows, then out[t][n] = sum_j w[t][j] * y[slot(t, j)][n] in j order, and x += out. */
#include "decode_layer.h" /* Python.h first */

#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "step_clock.h"

enum { W_ROUTER = 2, W_GU = 3, W_D = 4 }; /* decode_layer.c's matrix order */

KT int es_route(const float *logits, int64_t T, int64_t E, int64_t k, const int64_t *forced, const uint8_t *mask,
                int norm_topk, int64_t *ids, float *wts, float *p) {
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float m = l[0];
        for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
        float s = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            p[e] = exp1(l[e] - m);
            s += p[e];
        }
        for (int64_t e = 0; e < E; e++) p[e] = p[e] / s;
        int64_t *id = ids + t * k;
        float *w = wts + t * k;
        if (forced && mask && mask[t]) {
            for (int64_t j = 0; j < k; j++) {
                const int64_t e = forced[t * k + j];
                if (e < 0 || e >= E) return 1;
                id[j] = e;
                w[j] = p[e];
            }
        } else {
            for (int64_t j = 0; j < k; j++) { /* selection: the largest not yet taken, lowest id on ties */
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++) {
                    int taken = 0;
                    for (int64_t i = 0; i < j; i++) taken |= id[i] == e;
                    if (!taken && (best < 0 || p[e] > p[best])) best = e;
                }
                id[j] = best;
                w[j] = p[best];
            }
        }
        if (norm_topk) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += w[j];
            for (int64_t j = 0; j < k; j++) w[j] = w[j] / sum;
        }
    }
    return 0;
}

size_t es_moe_thread_bytes(int64_t T, int64_t k, int64_t E) {
    const int64_t S = T * k;
    return sizeof(int64_t) * (size_t)(4 * E + S + S) + sizeof(float *) * (size_t)(4 * S) +
           sizeof(float) * (size_t)(S + E) + 64;
}

void es_moe_thread_init(EsMoeThread *m, void *mem, int64_t T, int64_t k, int64_t E) {
    const int64_t S = T * k;
    int64_t *i64 = mem;
    m->count = i64; m->offset = i64 + E; m->active = i64 + 2 * E; m->fill = i64 + 3 * E;
    m->pos = i64 + 4 * E; m->ids = m->pos + S;
    void **pp = (void **)(m->ids + S);
    m->xin = (const float **)pp; m->hin = (const float **)(pp + S);
    m->guo = (float **)(pp + 2 * S); m->yo = (float **)(pp + 3 * S);
    m->wts = (float *)(pp + 4 * S); m->probs = m->wts + S;
}

/* Bytes of `rows` elements of a matrix stored in fmt, per 32 elements: fp32 128, bf16 64, GGUF its block. */
static size_t bytes32(int fmt) {
    if (fmt == ES_FMT_F32) return 128;
    if (fmt == ES_FMT_BF16 || fmt == ES_FMT_BF16_DOT) return 64;
    return (size_t)es_gguf_block_bytes(fmt);
}

/* Rows [lo, hi) of the active experts' rows (`rows` each), as gemm.c's expert_rows. */
static void expert_rows(const EsLayer *L, es_layer_rows_fn fn, int which, int64_t lo, int64_t hi, int64_t rows,
                        const EsMoeThread *m, int64_t n_active, const float *const *in, float *const *out,
                        const void *w, int64_t estride, int64_t K) {
    const size_t b32 = bytes32(L->fmt[which]);
    for (int64_t a = lo / rows; a < n_active && a * rows < hi; a++) {
        const int64_t r0 = a * rows > lo ? 0 : lo - a * rows, r1 = (a + 1) * rows < hi ? rows : hi - a * rows;
        const int64_t e = m->active[a];
        fn(L, m->count[e], which, in + m->offset[e], out + m->offset[e], (const char *)w + e * estride * (int64_t)b32 / 32,
           K, r0, r1);
    }
}

/* This thread's share [*lo, *hi) of `total` rows, in multiples of 4 (simd.h share). */
static void share_of(int64_t total, int64_t *lo, int64_t *hi) { share(total, lo, hi); }

/* Every thread of the team, after the post-attention norm (h_r: this thread's rows of it, logits:
 * this thread's [T, E] buffer): router logits, routing (thread 0 writes C->ids_out/wts_out),
 * gate/up rows into gu [S, 2I] (shared), silu * up into act [S, I] (this thread's), down rows into
 * y [S, H] (shared), then this thread's columns of x += the weighted sum. Two barriers. Returns 0,
 * or 1 when a forced id is out of range (then every thread returns 1 before any barrier). */
int es_moe_layer(const EsLayer *L, const EsStep *S, const EsCall *C, es_layer_rows_fn rows, EsMoeThread *m,
                 const float *const *h_r, const float *logits, float *gu, float *act, float *y, void *clock) {
    EsClock *c = clock;
    const int64_t T = S->T, H = L->H, E = L->E, I = L->I, k = L->top_k, Sl = T * k;
    float **lr = (float **)m->guo; /* the logits rows, before guo is built */
    for (int64_t t = 0; t < T; t++) lr[t] = (float *)logits + t * E;
    rows(L, T, W_ROUTER, h_r, lr, L->w_router, H, 0, E); /* every thread all of them: no barrier */
    es_lap(c, ES_T_ROUTER);
    if (es_route(logits, T, E, k, C->forced, C->mask, L->norm_topk, m->ids, m->wts, m->probs)) return 1;
    if (omp_get_thread_num() == 0) {
        memcpy(C->ids_out, m->ids, sizeof(int64_t) * (size_t)Sl);
        memcpy(C->wts_out, m->wts, sizeof(float) * (size_t)Sl);
    }
    int64_t n_active = 0, acc = 0;
    memset(m->count, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t s = 0; s < Sl; s++) m->count[m->ids[s]]++;
    for (int64_t e = 0; e < E; e++) {
        m->offset[e] = m->fill[e] = acc;
        acc += m->count[e];
        if (m->count[e]) m->active[n_active++] = e;
    }
    for (int64_t s = 0; s < Sl; s++) { /* slots grouped by expert, token order within */
        const int64_t p = m->fill[m->ids[s]]++;
        m->pos[s] = p;
        m->xin[p] = h_r[s / k];
    }
    for (int64_t p = 0; p < Sl; p++) {
        m->guo[p] = gu + p * 2 * I;
        m->hin[p] = act + p * I;
        m->yo[p] = y + p * H;
    }
    es_lap(c, ES_T_ROUTE);
    int64_t lo, hi;
    share_of(n_active * 2 * I, &lo, &hi);
    expert_rows(L, rows, W_GU, lo, hi, 2 * I, m, n_active, m->xin, m->guo, L->w_gu, 2 * I * H, H);
    es_lap(c, ES_T_EXPERTS);
#pragma omp barrier
    es_lap(c, ES_T_BARRIER);
    for (int64_t p = 0; p < Sl; p++) es_silu_mul(gu + p * 2 * I, gu + p * 2 * I + I, act + p * I, I);
    share_of(n_active * H, &lo, &hi);
    expert_rows(L, rows, W_D, lo, hi, H, m, n_active, m->hin, m->yo, L->w_d, H * I, I);
    es_lap(c, ES_T_EXPERTS);
#pragma omp barrier
    es_lap(c, ES_T_BARRIER);
    share_of(H, &lo, &hi);
    for (int64_t t = 0; t < T; t++) {
        float *xt = S->x + t * H;
        const int64_t *ps = m->pos + t * k;
        const float *w = m->wts + t * k;
        for (int64_t n = lo; n < hi; n++) {
            float s = w[0] * y[ps[0] * H + n];
            for (int64_t j = 1; j < k; j++) s += w[j] * y[ps[j] * H + n];
            xt[n] = xt[n] + s;
        }
    }
    es_lap(c, ES_T_EXPERTS);
    return 0;
}

/* route(logits, T, E, k, forced or 0, mask or 0, norm_topk, ids, wts): data pointers (logits fp32
 * [T, E], forced int64 [T, k], mask uint8 [T], ids int64 [T, k], wts fp32 [T, k]). */
PyObject *es_py_route(PyObject *self, PyObject *args) {
    unsigned long long lg, forced, mask, ids, wts;
    Py_ssize_t T, E, k;
    int norm, st = 0;
    if (!PyArg_ParseTuple(args, "KnnnKKiKK", &lg, &T, &E, &k, &forced, &mask, &norm, &ids, &wts)) return NULL;
    if (T < 0 || E < 1 || k < 1 || k > E) return PyErr_Format(PyExc_ValueError, "route: bad sizes");
    float *p = malloc(sizeof(float) * (size_t)E);
    if (!p) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    st = es_route((const float *)lg, T, E, k, (const int64_t *)forced, (const uint8_t *)mask, norm, (int64_t *)ids,
                  (float *)wts, p);
    Py_END_ALLOW_THREADS
    free(p);
    if (st) return PyErr_Format(PyExc_ValueError, "route: a forced expert id is outside [0, %zd)", E);
    Py_RETURN_NONE;
}
