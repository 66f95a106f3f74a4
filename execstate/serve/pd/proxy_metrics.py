"""The PD proxy's Prometheus metrics and per-request log line (its own registry).

- ``execstate_proxy_requests_total{endpoint}``: requests received (completions, chat);
- ``execstate_proxy_failures_total{stage}``: requests that ended in an error, by where it
  happened: ``request`` (bad body), ``prefill`` (P unreachable or answered an error),
  ``handoff`` (P's reply carried no valid handoff), ``decode`` (D unreachable or answered an
  error, or the stream broke);
- ``execstate_proxy_prefill_seconds``: request sent to P -> P's reply read;
- ``execstate_proxy_decode_seconds``: request sent to D -> D's response fully relayed.

One log line per request on the ``execstate.proxy`` logger (INFO; WARNING when it failed):
``request_id``, P and D urls, the status returned, both latencies and whether it streamed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

PREFIX = "execstate_proxy"
STAGES = ("request", "prefill", "handoff", "decode")
ENDPOINTS = ("completions", "chat")
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
log = logging.getLogger("execstate.proxy")


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}_requests", "Requests received by the proxy", ["endpoint"], registry=r)
        for endpoint in ENDPOINTS:
            self.requests.labels(endpoint=endpoint)
        self.failures = Counter(f"{PREFIX}_failures", "Requests that failed, by stage", ["stage"], registry=r)
        for stage in STAGES:
            self.failures.labels(stage=stage)  # every stage exported from the start, at 0
        self.prefill_seconds = Histogram(f"{PREFIX}_prefill_seconds", "Prefill (P) round trip", buckets=_BUCKETS,
                                         registry=r)
        self.decode_seconds = Histogram(f"{PREFIX}_decode_seconds", "Decode (D) request until fully relayed",
                                        buckets=_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class ProxyRecord:
    """What one request did; ``finish`` counts it and writes its log line (once)."""

    metrics: ProxyMetrics
    request_id: str
    endpoint: str
    stream: bool = False
    prefill_url: str | None = None
    decode_url: str | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    status: int | None = None
    failed_stage: str | None = None
    _done: bool = False

    def __post_init__(self) -> None:
        self.metrics.requests.labels(endpoint=self.endpoint).inc()

    def prefill_done(self, seconds: float) -> None:
        self.prefill_s = seconds
        self.metrics.prefill_seconds.observe(seconds)

    def finish(self, status: int, failed_stage: str | None = None, decode_s: float | None = None) -> None:
        if self._done:
            return
        self._done = True
        self.status, self.failed_stage = status, failed_stage
        if decode_s is not None:
            self.decode_s = decode_s
            self.metrics.decode_seconds.observe(decode_s)
        if failed_stage is not None:
            self.metrics.failures.labels(stage=failed_stage).inc()
        level = logging.INFO if failed_stage is None else logging.WARNING
        log.log(level, "request_id=%s endpoint=%s prefill=%s decode=%s status=%s failed_stage=%s "
                       "prefill_s=%s decode_s=%s stream=%s", self.request_id, self.endpoint, self.prefill_url,
                self.decode_url, status, failed_stage or "-", _s(self.prefill_s), _s(self.decode_s), self.stream)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
