"""``execstate bench prompt-logprobs``: what scoring a long prompt costs the others on one server.

One ``execstate serve`` process on a random dense model with 32k positions and a 32k vocabulary
(``make_random("qwen3", ...)``: the logits' width is what scoring a prompt materialises), its
``--max-logprobs-prompt-tokens`` raised to the longest size measured. For each prompt size:

1. a *stream* starts: a streamed completion of a short prompt, many tokens, ignoring EOS;
2. once it flows, one request scores a prompt of that many random tokens as lm-evaluation-harness
   does (``echo: true, logprobs: 20, max_tokens: 0``);
3. recorded: the scoring request's seconds and status, the stream's longest gap between two
   tokens while the scoring request was in flight (and how many tokens it got meanwhile), and the
   server's RSS (sampled every 50 ms from ``/proc``): its peak above the level before the request,
   and where it is 2 s after the answer.

Before prompt scoring ran through the scheduler, the whole prompt was one forward pass and one
``[n, vocab]`` log-softmax on the engine thread: the stream stopped for the whole request and the
RSS grew with ``n``. The report names the machine's load before and after (a shared machine).
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from execstate_bench.machine import cpu_name, loadavg
from execstate_bench.pd_cluster import SERVED_NAME, Cluster

DEFAULT_SIZES = (4096, 8192, 16384)
POSITIONS = 32768
VOCAB = 32000


def build_model(directory: Path) -> Path:
    """A random 4-layer dense model with 32k positions and a 32k vocabulary, and the tests' tokenizer."""
    from execstate.model.random_models import make_random
    from execstate.model.random_tokenizer import write_tokenizer

    d = make_random("qwen3", directory, seed=0, vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4,
                    intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=POSITIONS)
    write_tokenizer(d)
    return d


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler:
    """The peak RSS of ``pid`` since :meth:`reset`, sampled every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mb(self.pid))

    def reset(self) -> float:
        self.peak = now = rss_mb(self.pid)
        return now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)


class Stream:
    """A streamed completion on its own thread: the arrival time of each token chunk."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.times: list[float] = []
        self.error: str | None = None
        # return_token_ids: a chunk for every token, even one whose text is empty (the random model's
        # vocabulary is wider than the tokenizer's)
        body = {"model": SERVED_NAME, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True, "return_token_ids": True}
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        import httpx

        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=None) as r:
                if r.status_code != 200:
                    self.error = f"{r.status_code}: {r.read()[:300]!r}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"choices":[{' in line.replace(" ", ""):
                        self.times.append(time.monotonic())
        except Exception as e:  # reported, never raised on the thread
            self.error = f"{type(e).__name__}: {e}"

    def longest_gap(self, start: float, end: float) -> tuple[float, int]:
        """The longest wait for a token during [start, end] (from ``start`` to the first token after
        it counts too), and the tokens received in it."""
        inside = [t for t in self.times if start <= t <= end]
        after = [t for t in self.times if t > end]
        marks = [start, *inside] + ([after[0]] if after else [end])
        return max(b - a for a, b in zip(marks, marks[1:], strict=False)), len(inside)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def measure(url: str, pid: int, n: int, seed: int = 0) -> dict[str, Any]:
    import httpx

    rng = random.Random(seed + n)
    prompt = [rng.randrange(3, 512) for _ in range(n)]  # inside the tokenizer's vocabulary (echo decodes)
    sampler = RssSampler(pid)
    stream = Stream(url, max_tokens=POSITIONS - 16)
    try:
        deadline = time.monotonic() + 120
        while len(stream.times) < 5:  # the stream flows
            if stream.error or time.monotonic() > deadline:
                raise RuntimeError(f"the stream did not start: {stream.error}")
            time.sleep(0.05)
        base = sampler.reset()
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", timeout=None, json={
            "model": SERVED_NAME, "prompt": prompt, "echo": True, "logprobs": 20, "max_tokens": 0})
        t1 = time.monotonic()
        peak = sampler.peak
        time.sleep(2.0)
        after = rss_mb(pid)
        gap, during = stream.longest_gap(t0, t1)
        scored = None
        if r.status_code == 200:
            lp = r.json()["choices"][0]["logprobs"]
            scored = sum(v is not None for v in lp["token_logprobs"])
        return {"prompt_tokens": n, "status": r.status_code, "seconds": round(t1 - t0, 2),
                "tokens_scored": scored, "stream_longest_gap_s": round(gap, 3), "stream_tokens_during": during,
                "rss_before_mb": round(base), "rss_peak_growth_mb": round(peak - base),
                "rss_growth_2s_after_mb": round(after - base)}
    finally:
        sampler.close()
        httpx.post(url + "/v1/completions", timeout=5, json={"model": SERVED_NAME, "prompt": [1], "max_tokens": 1})
        stream.join(0)


def run_prompt_scoring_bench(sizes: tuple[int, ...] = DEFAULT_SIZES, threads: int = 2,
                             extra_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """The bench (module docstring); ``extra_args``: more ``execstate serve`` flags."""
    import httpx

    cluster = Cluster(threads=threads)
    rows = []
    load_before = loadavg()
    try:
        model = build_model(Path(tempfile.mkdtemp(prefix="execstate-bench-scoring-")))
        args = ["serve", str(model), "--served-model-name", SERVED_NAME, "--max-model-len", str(POSITIONS),
                *_cap_flag(max(sizes)), *extra_args]
        url = cluster.spawn("server", args, threads)
        with httpx.Client() as client:
            cluster.wait_healthy(client)
        pid = cluster.procs["server"].popen.pid
        for n in sizes:
            rows.append(measure(url, pid, n))
            # the stream of this size is cancelled when its client goes: let the server settle
            time.sleep(1.0)
    finally:
        cluster.close()
    return {"model": f"random qwen3 dense, 4 layers, hidden 256, vocab {VOCAB}, {POSITIONS} positions",
            "request": "echo: true, logprobs: 20, max_tokens: 0, beside one streamed completion",
            "threads": threads, "cpu": cpu_name(), "loadavg_before": load_before, "loadavg_after": loadavg(),
            "sizes": rows}


def _cap_flag(longest: int) -> list[str]:
    """``--max-logprobs-prompt-tokens`` raised to ``longest`` (on a server that has the limit: the bench
    also measures the code before it)."""
    from dataclasses import fields

    from execstate.serve.limits import ServingLimits

    names = {f.name for f in fields(ServingLimits)}
    return ["--max-logprobs-prompt-tokens", str(longest)] if "max_logprobs_prompt_tokens" in names else []


def format_table(report: dict[str, Any]) -> str:
    head = ("| prompt tokens | status | seconds | stream's longest gap (s) | stream tokens meanwhile "
            "| RSS peak growth (MB) | RSS growth 2 s after (MB) |")
    lines = [head, "|" + "---|" * 7]
    for r in report["sizes"]:
        lines.append(f"| {r['prompt_tokens']} | {r['status']} | {r['seconds']} | {r['stream_longest_gap_s']} | "
                     f"{r['stream_tokens_during']} | {r['rss_peak_growth_mb']} | {r['rss_growth_2s_after_mb']} |")
    lines.append(f"\nload average before {report['loadavg_before']}, after {report['loadavg_after']}; {report['cpu']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="execstate bench prompt-logprobs")
    add_arguments(p)
    return run_prompt_scoring_cli(p.parse_args(argv))


def add_prompt_scoring_parser(bsub: Any) -> None:
    add_arguments(bsub.add_parser("prompt-logprobs", help="what scoring a long prompt (echo, logprobs 20, "
                                  "max_tokens 0) costs a concurrent stream and the server's RSS"))


def add_arguments(p: Any) -> None:
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="prompt tokens, comma-separated")
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    p.add_argument("--out", default=None, help="write the report (JSON) here")
    p.add_argument("--json", action="store_true")


def run_prompt_scoring_cli(args: Any) -> int:
    report = run_prompt_scoring_bench(tuple(int(s) for s in args.sizes.split(",")), args.threads)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
