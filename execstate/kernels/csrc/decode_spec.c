/* Python bindings of the whole-layer decode entry: a layer's weights (layer_spec) and a step's
 * inputs (step_spec) are packed once into capsules; decode_layer then takes the two capsules and
 * the call's outputs, so a layer call parses nine arguments instead of forty. Sizes are checked
 * here; the Python side (execstate/kernels/decode_layer.py) checks every tensor first. */
#include "decode_layer.h" /* Python.h first */

#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static const char LAYER[] = "execstate.decode_layer.layer", STEP[] = "execstate.decode_layer.step";

static void free_layer(PyObject *cap) { free(PyCapsule_GetPointer(cap, LAYER)); }
static void free_step(PyObject *cap) { free(PyCapsule_GetPointer(cap, STEP)); }

/* A capsule owning a heap copy of the n bytes at src. */
static PyObject *capsule_of(const void *src, size_t n, const char *name, PyCapsule_Destructor release) {
    void *copy = malloc(n);
    if (!copy) return PyErr_NoMemory();
    memcpy(copy, src, n);
    PyObject *cap = PyCapsule_New(copy, name, release);
    if (!cap) free(copy);
    return cap;
}

/* layer_spec(in_norm, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o, post_norm, w_router, w_gu, w_d,
 *            H, nh, nkv, d, E, I, top_k, eps, scale, formats, norm_topk): data pointers (0 = absent);
 * formats: the ES_FMT_* of w_qkv, w_o, w_router, w_gu, w_d in 4 bits each, w_qkv lowest. */
PyObject *es_py_layer_spec(PyObject *self, PyObject *args) {
    unsigned long long p[11];
    EsLayer L;
    int formats;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKnnnnnnnffii", &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7],
                          &p[8], &p[9], &p[10], &L.H, &L.nh, &L.nkv, &L.d, &L.E, &L.I, &L.top_k, &L.eps, &L.scale,
                          &formats, &L.norm_topk))
        return NULL;
    for (int j = 0; j < 5; j++) {
        L.fmt[j] = (formats >> (4 * j)) & 15;
        if (L.fmt[j] >= ES_FMT_COUNT) return PyErr_Format(PyExc_ValueError, "decode_layer: bad weight format");
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (L.H < 1 || L.nh < 1 || L.nkv < 1 || L.nh % L.nkv || L.d < 2 || L.d % 2 || L.E < 0 || L.I < 0 ||
        L.top_k < 0 || L.top_k > L.E)
        return PyErr_Format(PyExc_ValueError, "decode_layer: bad sizes");
    if (!p[0] || !p[1] || !p[5] || !p[7])
        return PyErr_Format(PyExc_ValueError, "decode_layer: in_norm, w_qkv, w_o and post_norm are required");
    if (L.top_k && !(p[8] && p[9] && p[10] && L.I))
        return PyErr_Format(PyExc_ValueError, "decode_layer: a MoE layer needs its router and both expert tensors");
    L.in_norm = (const float *)p[0]; L.w_qkv = (const void *)p[1]; L.b_qkv = (const float *)p[2];
    L.q_norm = (const float *)p[3]; L.k_norm = (const float *)p[4]; L.w_o = (const void *)p[5];
    L.b_o = (const float *)p[6]; L.post_norm = (const float *)p[7]; L.w_router = (const void *)p[8];
    L.w_gu = (const void *)p[9]; L.w_d = (const void *)p[10];
    return capsule_of(&L, sizeof L, LAYER, free_layer);
}

/* step_spec(x, cos, sin, k_base, v_base, slots, tok, block_table, ctx_len, layer_bytes, T, max_blocks,
 *           block_size, timers, timer_threads, timer_cpu, kv_bf16) */
PyObject *es_py_step_spec(PyObject *self, PyObject *args) {
    unsigned long long p[9], timers;
    EsStep S;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKnnnnKnii", &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7], &p[8],
                          &S.layer_bytes, &S.T, &S.max_blocks, &S.block_size, &timers, &S.timer_threads, &S.timer_cpu,
                          &S.kv_bf16))
        return NULL;
    if (S.T < 0 || S.max_blocks < 1 || S.block_size < 1 || S.layer_bytes < 0)
        return PyErr_Format(PyExc_ValueError, "decode_layer: bad step sizes");
    if (timers && S.timer_threads < 1)
        return PyErr_Format(PyExc_ValueError, "decode_layer: timers need timer_threads >= 1");
    S.x = (float *)p[0]; S.cos = (const float *)p[1]; S.sin = (const float *)p[2];
    S.k_base = (char *)p[3]; S.v_base = (char *)p[4]; S.slots = (const int64_t *)p[5];
    S.tok = (const int64_t *)p[6]; S.block_table = (const int64_t *)p[7]; S.ctx_len = (const int64_t *)p[8];
    S.timers = (double *)timers;
    return capsule_of(&S, sizeof S, STEP, free_step);
}

/* decode_layer(layer_spec, step_spec, layer, h_out, logits_out, ids_out, wts_out, forced, mask) */
PyObject *es_py_decode_layer(PyObject *self, PyObject *args) {
    PyObject *lcap, *scap;
    unsigned long long h, lg, ids, wts, forced, mask;
    EsCall C;
    int st;
    if (!PyArg_ParseTuple(args, "OOnKKKKKK", &lcap, &scap, &C.layer, &h, &lg, &ids, &wts, &forced, &mask)) return NULL;
    const EsLayer *L = PyCapsule_GetPointer(lcap, LAYER);
    const EsStep *S = L ? PyCapsule_GetPointer(scap, STEP) : NULL;
    if (!L || !S) return NULL;
    if (C.layer < 0) return PyErr_Format(PyExc_ValueError, "decode_layer: negative layer");
    if (S->kv_bf16 && L->nh / L->nkv > 16)
        return PyErr_Format(PyExc_ValueError, "decode_layer: bf16 K/V needs at most 16 query heads per KV head");
    if (L->top_k && !(ids && wts))
        return PyErr_Format(PyExc_ValueError, "decode_layer: a MoE layer needs ids_out and wts_out");
    if (L->w_router && !L->top_k && !lg)
        return PyErr_Format(PyExc_ValueError, "decode_layer: a router layer needs logits_out");
    C.h_out = (float *)h; C.logits_out = (float *)lg; C.ids_out = (int64_t *)ids; C.wts_out = (float *)wts;
    C.forced = (const int64_t *)forced; C.mask = (const uint8_t *)mask;
    if (S->T == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    st = es_decode_layer(L, S, &C);
    Py_END_ALLOW_THREADS
    if (st == 1) return PyErr_Format(PyExc_ValueError, "decode_layer: a forced expert id is outside [0, %zd)", L->E);
    if (st) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
