"""``/metrics`` series of the offload tiers, one label value per tier (docs/offload.md "Metrics").

The tiers count on the engine side (``state/tiers/stats.py``); at each scrape the server takes a
snapshot on the engine thread (``EngineLoad.offload``) and this collector renders it:

| series | type | labels |
|---|---|---|
| ``execstate_offload_tier_bytes`` / ``_units`` / ``_capacity_bytes`` | gauge | tier |
| ``execstate_offload_tier_available`` (0 while down or slow) | gauge | tier |
| ``execstate_offload_hits_total`` / ``_misses_total`` (lookups) | counter | tier |
| ``execstate_offload_reloaded_units_total`` | counter | tier |
| ``execstate_offload_write_backs_total`` (``rate()``: the write-back rate) | counter | tier |
| ``execstate_offload_dropped_units_total`` | counter | tier, reason |
| ``execstate_offload_checksum_failures_total`` (units failing verification) | counter | tier, kind |
| ``execstate_offload_errors_total`` (I/O errors, timeouts) | counter | tier |
| ``execstate_offload_reload_seconds`` | histogram | tier |
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from execstate.state.tiers.stats import RELOAD_BUCKETS, TierSnapshot

PREFIX = "execstate_offload"


class OffloadCollector(Collector):
    def __init__(self) -> None:
        self._tiers: tuple[TierSnapshot, ...] = ()

    def update(self, tiers: Sequence[TierSnapshot]) -> None:
        self._tiers = tuple(tiers)

    def collect(self) -> Iterator[Metric]:
        tiers = self._tiers
        gauges = {
            "tier_bytes": ("Bytes of units the tier holds", lambda t: t.bytes),
            "tier_units": ("Units the tier holds", lambda t: t.units),
            "tier_capacity_bytes": ("Most bytes the tier holds", lambda t: t.capacity_bytes),
            "tier_available": ("1 while the tier serves, 0 while it is marked down", lambda t: int(t.available)),
        }
        for name, (doc, get) in gauges.items():
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["tier"])
            for t in tiers:
                g.add_metric([t.name], get(t))
            yield g
        counters = {
            "hits": ("Blocks looked up in the tier and found", lambda t: t.hits),
            "misses": ("Blocks looked up in the tier and not found", lambda t: t.misses),
            "reloaded_units": ("Units reloaded from the tier, verified", lambda t: t.reloaded),
            "write_backs": ("Units written into the tier", lambda t: t.write_backs),
            "errors": ("I/O errors and timeouts of the tier", lambda t: t.errors),
        }
        for name, (doc, get) in counters.items():
            c = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["tier"])
            for t in tiers:
                c.add_metric([t.name], get(t))
            yield c
        dropped = CounterMetricFamily(f"{PREFIX}_dropped_units", "Units the tier dropped or could not take",
                                      labels=["tier", "reason"])
        failures = CounterMetricFamily(f"{PREFIX}_checksum_failures",
                                       "Units that failed verification on reload (discarded, recomputed)",
                                       labels=["tier", "kind"])
        hist = HistogramMetricFamily(f"{PREFIX}_reload_seconds", "Time one reload spent on the tier's units",
                                     labels=["tier"])
        for t in tiers:
            for reason, n in sorted(t.dropped.items()):
                dropped.add_metric([t.name, reason], n)
            for kind, n in sorted(t.failures.items()):
                failures.add_metric([t.name, kind], n)
            if t.reload_buckets:
                buckets = [(repr(b), n) for b, n in zip(RELOAD_BUCKETS, t.reload_buckets, strict=False)]
                buckets.append(("+Inf", t.reload_buckets[-1]))
                hist.add_metric([t.name], buckets, t.reload_sum)
        yield dropped
        yield failures
        yield hist
