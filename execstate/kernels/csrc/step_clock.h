/* The kernels' own phase timers: a thread's time per phase of a kernel call, accumulated into
 * a caller's row of ES_T_COUNT doubles (nanoseconds), or nothing when the row is NULL (one
 * branch per phase). Two clocks: wall (CLOCK_MONOTONIC, a vDSO call, ~20 ns) or the thread's
 * CPU time (CLOCK_THREAD_CPUTIME_ID, a system call, ~0.2 us; what a phase cost, whatever the
 * time the thread spent descheduled on a shared host). A whole layer takes ~12 readings; the
 * caller turns the timers on only when it asks for a breakdown (execstate/model/step_timers.py). */
#ifndef EXECSTATE_STEP_CLOCK_H
#define EXECSTATE_STEP_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Phases of a decode layer (decode_layer.c), in the order of execstate/model/step_timers.py
 * KERNEL_PHASES. FORK: from the call's entry until the thread starts its share; JOIN: the
 * calling thread's wait for the team at the end; BARRIER: waits inside the call. */
enum {
    ES_T_NORM,
    ES_T_QKV,
    ES_T_ROPE,
    ES_T_ATTN,
    ES_T_O,
    ES_T_ROUTER,
    ES_T_ROUTE,
    ES_T_EXPERTS,
    ES_T_MLP,
    ES_T_BARRIER,
    ES_T_FORK,
    ES_T_JOIN,
    ES_T_COUNT
};

/* cpu: 0 wall time, 1 the calling thread's CPU time */
static inline double es_now_ns(int cpu) {
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct {
    double *row; /* this thread's ES_T_COUNT accumulators, or NULL (timers off) */
    double t;    /* the last reading */
    int cpu;     /* the clock (es_now_ns) */
} EsClock;

/* A thread's clock from `since` (a reading of its own clock), charging into `row` (or nothing). */
static inline EsClock es_clock(double *row, double since, int cpu) {
    EsClock c = {row, since, cpu};
    return c;
}

/* Charge the time since the last reading to `phase`. */
static inline void es_lap(EsClock *c, int phase) {
    if (!c->row) return;
    const double t = es_now_ns(c->cpu);
    c->row[phase] += t - c->t;
    c->t = t;
}

#endif
