"""Prometheus metrics of one server (a per-app ``CollectorRegistry``; docs/contracts.md 9).

Engine gauges (running / waiting requests, KV blocks used / total, prefix-cache hit
rate, health) are refreshed from an ``EngineLoad`` snapshot taken on the engine thread (``AsyncEngine.load``)
at scrape time. Request-level series are recorded by the serving layer as outputs
arrive: ``RequestTimer`` measures TTFT (request arrival at the server -> first token)
and ITL (gap between consecutive tokens; a gap that brought k tokens counts as k gaps
of gap/k). The PD layer reports transfers with
``record_transfer(num_bytes, ok, control_bytes, seconds)``. The offload tiers' series
(``execstate_offload_*``, per tier) come from the same snapshot (``serve/tier_metrics.py``).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from execstate.engine.engine_facts import EngineLoad
from execstate.engine.outputs import RequestOutput
from execstate.serve.tier_metrics import OffloadCollector

PREFIX = "execstate"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.num_requests_running = Gauge(
            f"{PREFIX}_num_requests_running", "Requests running in the engine", registry=r
        )
        self.num_requests_waiting = Gauge(
            f"{PREFIX}_num_requests_waiting", "Requests waiting to be scheduled", registry=r
        )
        self.kv_blocks_used = Gauge(f"{PREFIX}_kv_blocks_used", "KV blocks referenced by requests", registry=r)
        self.kv_blocks_total = Gauge(f"{PREFIX}_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.prefix_cache_hit_rate = Gauge(
            f"{PREFIX}_prefix_cache_hit_rate", "Prompt tokens hit in the prefix cache / tokens looked up", registry=r
        )
        self.engine_healthy = Gauge(f"{PREFIX}_engine_healthy", "1 while the engine thread serves", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of served requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Generated tokens", registry=r)
        self.requests_finished = Counter(
            f"{PREFIX}_requests_finished", "Finished requests by finish reason", ["finish_reason"], registry=r
        )
        self.transfer_bytes = Counter(f"{PREFIX}_kv_transfer_bytes", "KV bytes transferred (PD)", registry=r)
        self.transfer_failures = Counter(f"{PREFIX}_kv_transfer_failures", "Failed KV transfers (PD)", registry=r)
        self.transfers = Counter(f"{PREFIX}_kv_transfers", "KV transfers attempted (PD)", registry=r)
        self.transfer_control_bytes = Counter(
            f"{PREFIX}_kv_transfer_control_bytes", "Control-channel bytes of KV transfers (PD)", registry=r
        )
        self.transfer_seconds = Counter(
            f"{PREFIX}_kv_transfer_seconds", "Wall time spent in KV transfers (PD)", registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Request arrival -> first token", buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "Gap between consecutive tokens", buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.offload = OffloadCollector()
        r.register(self.offload)

    def record_transfer(self, num_bytes: int, ok: bool, control_bytes: int = 0, seconds: float = 0.0) -> None:
        """Called by the PD connector once per finished transfer (bytes actually moved)."""
        self.transfers.inc()
        self.transfer_control_bytes.inc(max(control_bytes, 0))
        self.transfer_seconds.inc(max(seconds, 0.0))
        if num_bytes > 0:
            self.transfer_bytes.inc(num_bytes)
        if not ok:
            self.transfer_failures.inc()

    def set_engine_stats(self, stats: EngineLoad | None, healthy: bool) -> None:
        self.engine_healthy.set(1.0 if healthy else 0.0)
        if stats is None:
            return
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_blocks_used.set(stats.kv_blocks_used)
        self.kv_blocks_total.set(stats.kv_blocks_total)
        self.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)
        self.offload.update(stats.offload)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def timer(self, arrival: float | None = None) -> RequestTimer:
        return RequestTimer(self, time.monotonic() if arrival is None else arrival)


class RequestTimer:
    """Per engine request: turns its outputs into metric samples.

    The server's requests are ``DELTA`` (streams) or ``FINAL_ONLY``: every output's
    ``token_ids`` are tokens this timer has not seen. An output that brings several tokens
    at once (``FINAL_ONLY``) takes its first token's time from the engine
    (``metrics["first_token_time"]``, same monotonic clock) and spreads the rest evenly.
    """

    def __init__(self, metrics: ServingMetrics, arrival: float) -> None:
        self.metrics = metrics
        self.arrival = arrival
        self.last_token_time: float | None = None
        self.num_tokens = 0
        self.finished = False

    def on_output(self, out: RequestOutput, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        m = self.metrics
        new = len(out.outputs[0].token_ids)
        if new > 0:
            m.generation_tokens.inc(new)
            self.num_tokens += new
            if self.last_token_time is None:
                first = out.metrics.get("first_token_time", now) if new > 1 else now
                m.prompt_tokens.inc(len(out.prompt_token_ids))
                m.ttft.observe(first - self.arrival)
                self.last_token_time = first
                new -= 1
            if new > 0:
                gap = (now - self.last_token_time) / new
                for _ in range(new):
                    m.itl.observe(gap)
            self.last_token_time = now
        if out.finished:
            self.finished = True
            m.requests_finished.labels(out.outputs[0].finish_reason or "unknown").inc()

    def on_abandoned(self) -> None:
        """The consumer stopped before the request finished (disconnect): it was aborted."""
        if not self.finished:
            self.finished = True
            self.metrics.requests_finished.labels("abort").inc()
