"""The load bench's clients: concurrent streaming completions (some cut mid-stream) and a
flood of non-streamed ones, each timed on the client side.

TTFT here is request sent -> first SSE chunk that carries a token id; ITL is the gap between
consecutive token-carrying chunks, divided evenly over the tokens that chunk brought (the same
definition as the server's metrics, measured where the user sits).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

SERVED_NAME = "m"


@dataclass
class Outcome:
    """One request as the client saw it. ``kind``: served, cut (closed by us mid-stream),
    refused (429), error (any other status, an in-band error event or a broken connection)."""

    kind: str
    status: int | None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    num_tokens: int = 0
    retry_after: str | None = None
    detail: str | None = None


def completion_body(prompt: list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "return_token_ids": True, "stream": stream}
    return body


async def stream_one(client: Any, url: str, prompt: list[int], max_tokens: int,
                     cut_after: int | None = None) -> Outcome:
    """One streamed completion; with ``cut_after`` the client closes the stream after that many tokens."""
    import httpx

    t0 = time.perf_counter()
    last: float | None = None
    out = Outcome("served", None)
    try:
        async with client.stream("POST", url + "/v1/completions",
                                 json=completion_body(prompt, max_tokens, True)) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.kind = "refused" if r.status_code == 429 else "error"
                out.retry_after = r.headers.get("retry-after")
                out.detail = (await r.aread()).decode(errors="replace")[:300]
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    out.kind, out.detail = "error", json.dumps(ev["error"])[:300]
                    continue
                n = sum(len(c.get("token_ids") or []) for c in ev.get("choices") or [])
                if not n:
                    continue
                now = time.perf_counter()
                if last is None:
                    out.ttft_s = now - t0
                else:
                    out.itl_s.extend([(now - last) / n] * n)
                last = now
                out.num_tokens += n
                if cut_after is not None and out.num_tokens >= cut_after:
                    out.kind = "cut"
                    return out  # leaving the context manager closes the connection mid-stream
    except httpx.HTTPError as e:
        out.kind, out.detail = "error", repr(e)[:300]
    return out


async def post_one(client: Any, url: str, prompt: list[int], max_tokens: int) -> Outcome:
    """One non-streamed completion (the flood): served, refused (429 + Retry-After) or error."""
    import httpx

    t0 = time.perf_counter()
    try:
        r = await client.post(url + "/v1/completions", json=completion_body(prompt, max_tokens, False))
    except httpx.HTTPError as e:
        return Outcome("error", None, detail=repr(e)[:300])
    if r.status_code == 200:
        n = len(r.json()["choices"][0].get("token_ids") or [])
        return Outcome("served", 200, ttft_s=None, num_tokens=n, detail=f"{time.perf_counter() - t0:.3f}s")
    kind = "refused" if r.status_code == 429 else "error"
    return Outcome(kind, r.status_code, retry_after=r.headers.get("retry-after"), detail=r.text[:300])


async def run_clients(url: str, prompts: list[list[int]], max_tokens: int, cut_every: int,
                      cut_after: int) -> list[Outcome]:
    """All ``prompts`` at once as streaming clients; every ``cut_every``-th one is cut after
    ``cut_after`` tokens (0 = never cut)."""
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        tasks = [stream_one(client, url, p, max_tokens, cut_after if cut_every and i % cut_every == 0 else None)
                 for i, p in enumerate(prompts)]
        return list(await asyncio.gather(*tasks))


async def run_flood(url: str, prompts: list[list[int]], max_tokens: int) -> list[Outcome]:
    """Every prompt sent at the same moment, non-streamed."""
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        return list(await asyncio.gather(*(post_one(client, url, p, max_tokens) for p in prompts)))
