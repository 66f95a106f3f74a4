"""The PD bench's HTTP client side: one streamed greedy completion, timed, and a server's
``/metrics`` counters (the KV transfer figures are deltas of these around requests)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from execstate_bench.pd_cluster import SERVED_NAME

KV_METRIC = "execstate_kv_transfer"  # prefix of the decode side's transfer counters
TTFT_SUM_METRIC = "execstate_time_to_first_token_seconds_sum"


@dataclass
class Result:
    ok: bool
    status: int
    error: str | None
    seconds: float  # request sent -> stream finished
    ttft_s: float | None  # request sent -> first chunk with a token id
    token_ids: list[int]
    usage: dict[str, Any] | None
    t_first: float | None = None  # perf_counter of the first token
    t_end: float = 0.0  # perf_counter at the end of the response

    @property
    def tok_s(self) -> float | None:
        return len(self.token_ids) / self.seconds if self.ok and self.seconds > 0 else None


def stream_completion(client: Any, url: str, prompt: list[int], max_tokens: int) -> Result:
    """One streamed greedy completion; an error is a non-200 status or an in-band error event."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens: list[int] = []
    usage = error = None
    t_first = None
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = r.read().decode(errors="replace")
            t = time.perf_counter()
            return Result(False, r.status_code, text[:500], t - t0, None, [], None, None, t)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                error = json.dumps(ev["error"])[:500]
                continue
            for c in ev.get("choices") or []:
                ids = c.get("token_ids") or []
                if ids and t_first is None:
                    t_first = time.perf_counter()
                tokens += ids
            usage = ev.get("usage") or usage
    t = time.perf_counter()
    ttft = None if t_first is None else t_first - t0
    return Result(error is None, r.status_code, error, t - t0, ttft, tokens, usage, t_first, t)


def scrape(client: Any, url: str) -> dict[str, float]:
    """Unlabelled samples of a server's ``/metrics`` (counters as ``*_total``, histogram ``_sum``/``_count``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get(url + "/metrics", timeout=10.0).text
    return {s.name: float(s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples if not s.labels}


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    """Change of one scraped sample between two scrapes (absent counts as 0)."""
    return after.get(name, 0.0) - before.get(name, 0.0)
