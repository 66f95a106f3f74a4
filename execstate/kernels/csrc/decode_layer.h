/* The whole-layer decode entry (decode_layer.c, decode_moe.c) and its Python binding
 * (decode_spec.c): a layer's weights and a step's inputs are checked and packed once (capsules),
 * so a layer call passes two capsules and its outputs. */
#ifndef EXECSTATE_DECODE_LAYER_H
#define EXECSTATE_DECODE_LAYER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A layer's weights and sizes (optional pointers NULL when absent). Each matrix is stored and
 * multiplied in its fmt (kernels.h ES_FMT_*); everything else is fp32. The MLP is one of:
 * - dense: w_gu [2I, H], w_d [H, I] (E == 0);
 * - router only: w_router [E, H], the call writes the router logits and stops (top_k == 0);
 * - MoE: w_router [E, H] and the experts w_gu [E, 2I, H], w_d [E, H, I] (top_k >= 1): the call
 *   routes (es_route) and adds the experts' weighted sum to the residual stream. */
typedef struct {
    const float *in_norm, *b_qkv, *q_norm, *k_norm, *b_o, *post_norm;
    const void *w_qkv, *w_o, *w_router, *w_gu, *w_d;
    int64_t H, nh, nkv, d, E, I, top_k;
    int fmt[5]; /* ES_FMT_* of w_qkv, w_o, w_router, w_gu, w_d */
    int norm_topk;
    float eps, scale;
} EsLayer;

/* A decode step's inputs, shared by its layers: token t is sequence t's one new position, written
 * at slots[t] of each layer's cache and attending to its first ctx_len[t] positions. */
typedef struct {
    float *x;                          /* [T, H] residual stream, updated in place */
    const float *cos, *sin;            /* [T, d] */
    char *k_base, *v_base;             /* layer 0 of the pool's [layers, slots, nkv, d], fp32 or bf16 */
    int64_t layer_bytes;               /* bytes of one layer of the pool */
    const int64_t *slots, *tok, *block_table, *ctx_len; /* [T], [T], [T, max_blocks], [T] */
    int64_t T, max_blocks, block_size;
    double *timers;                    /* [timer_threads, ES_T_COUNT] phase times added (step_clock.h), or NULL */
    int64_t timer_threads;
    int timer_cpu;                     /* 1: each thread's CPU time, 0: wall time */
    int kv_bf16;                       /* 1: the pool holds bf16 K/V (written rounded, read widened; nh / nkv <= 16) */
} EsStep;

/* One call: the cache layer and the outputs. */
typedef struct {
    int64_t layer;
    float *h_out;           /* [T, H] post-norm rows (router-only layer), or NULL */
    float *logits_out;      /* [T, E] (router-only layer) */
    int64_t *ids_out;       /* [T, top_k] the routes (MoE layer) */
    float *wts_out;         /* [T, top_k] their combine weights (MoE layer) */
    const int64_t *forced;  /* [T, top_k] routes to replay, or NULL */
    const uint8_t *mask;    /* [T]: which tokens replay (with forced) */
} EsCall;

/* 0 ok, 1 a forced expert id out of range, 2 out of memory. */
int es_decode_layer(const EsLayer *L, const EsStep *S, const EsCall *C);

/* decode_moe.c, inside the layer's parallel region, every thread: routing (thread 0 writes the
 * routes), the experts on rows h_r, the weighted sum added to the columns [lo, hi) ... see there. */
typedef struct {
    int64_t *count, *offset, *active, *pos, *fill; /* [E], [E], [E], [S], [E] */
    const float **xin, **hin;                       /* [S] */
    float **guo, **yo;                              /* [S] */
    int64_t *ids;                                   /* [T, k] */
    float *wts, *probs;                             /* [T, k], [E] */
} EsMoeThread;
size_t es_moe_thread_bytes(int64_t T, int64_t k, int64_t E);
void es_moe_thread_init(EsMoeThread *m, void *mem, int64_t T, int64_t k, int64_t E);
typedef void (*es_layer_rows_fn)(const EsLayer *L, int64_t T, int which, const float *const *xr, float *const *yr,
                                 const void *w, int64_t K, int64_t lo, int64_t hi);
int es_moe_layer(const EsLayer *L, const EsStep *S, const EsCall *C, es_layer_rows_fn rows, EsMoeThread *m,
                 const float *const *h_r, const float *logits, float *gu, float *act, float *y, void *clock);

PyObject *es_py_layer_spec(PyObject *self, PyObject *args);
PyObject *es_py_step_spec(PyObject *self, PyObject *args);
PyObject *es_py_decode_layer(PyObject *self, PyObject *args);
PyObject *es_py_route(PyObject *self, PyObject *args);

#endif
