"""Over HTTP: scoring a long prompt (``echo`` with ``logprobs``, ``max_tokens: 0``, as
lm-evaluation-harness asks) no longer stops the other requests, and its length is bounded.

A server on a random dense model with 2048 positions scores 64 prompt tokens per step. While it
scores a 1500-token prompt, a streamed completion beside it keeps getting tokens (before, it got
none until the whole prompt had been scored in one pass on the engine thread); the scores equal
``LLM.score``; a prompt longer than ``--max-logprobs-prompt-tokens`` is a 400 naming the flag,
before any engine work.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import numpy as np
import pytest
from serve_helpers import running_server, wait_idle, write_tokenizer

from execstate import LLM
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.kernels import cpu
from execstate.model.random_models import make_random
from execstate.serve.app import build_app
from execstate.serve.limits import ServingLimits

NAME = "scorer"
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 512, 1500)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = make_random("qwen3", tmp_path_factory.mktemp("scoring_http"), seed=4, max_position_embeddings=2048)
    write_tokenizer(d)
    return d


def known(cls, **kw):
    """``cls(**kw)`` without the fields ``cls`` does not have (the code before the fix had none of these:
    the tests then fail on the finding itself)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kw.items() if k in names})


@pytest.fixture(scope="module")
def server(model_dir):
    engine = AsyncEngine(LLMEngine(known(EngineConfig, model=str(model_dir), seed=0, prompt_logprobs_chunk_tokens=64)))
    try:
        app = build_app(engine, NAME, limits=known(ServingLimits, max_logprobs_prompt_tokens=1600))
        with running_server(app) as (url, _):
            yield url, engine
    finally:
        engine.shutdown()


def test_a_stream_keeps_getting_tokens_while_a_long_prompt_is_scored(server, model_dir):
    """Measured on the engine thread, whatever the scoring's implementation: every forward pass that
    runs part of the scored prompt (more than 32 tokens) notes how many tokens the stream has by
    then. Before, the prompt was one forward pass (one note: the stream got nothing meanwhile); now
    it is ~23 chunks, and the stream gets a token beside each."""
    url, engine = server
    stream_prompt = [5, 6, 7]
    notes: list[int] = []

    def watch(eng) -> None:
        forward = eng.model.forward

        def noting(ids, ctx):
            if ids.shape[0] > 32:
                notes.append(sum(len(r.output_token_ids) for r in eng.requests.values()
                                 if r.prompt_token_ids == stream_prompt))
            return forward(ids, ctx)

        eng.model.forward = noting

    def unwatch(eng) -> None:
        del eng.model.forward

    arrivals: list[float] = []

    def stream() -> None:
        body = {"model": NAME, "prompt": stream_prompt, "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith('data: {"id"'):
                    arrivals.append(time.monotonic())

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    while len(arrivals) < 3:
        time.sleep(0.01)
    engine.call(watch)
    try:
        r = httpx.post(url + "/v1/completions", timeout=300, json={
            "model": NAME, "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 0})
    finally:
        engine.call(unwatch)
    assert r.status_code == 200, r.text[:300]
    steps = len(PROMPT) // 64
    assert notes and notes[-1] - notes[0] >= steps // 2, f"the stream got {notes[-1] - notes[0]} tokens meanwhile"
    lp = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    want = LLM(str(model_dir), seed=0).score(PROMPT).logprobs  # bit for bit on the CPU kernels, else fp32 rounding
    assert lp[0] is None and (lp[1:] == want if cpu.available() else np.allclose(lp[1:], want, rtol=0, atol=1e-5))
    t.join(300)
    assert wait_idle(engine) == (0, 0, 0)


def test_a_prompt_beyond_the_cap_is_refused_before_any_work(server):
    url, engine = server
    long = [5] * 1700
    looked_up = engine.call(lambda e: e.kv_manager.num_lookup_tokens)
    for body in ({"echo": True, "logprobs": 1, "max_tokens": 0}, {"prompt_logprobs": 0, "max_tokens": 1}):
        r = httpx.post(url + "/v1/completions", timeout=60, json={"model": NAME, "prompt": long, **body})
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert "--max-logprobs-prompt-tokens" in err["message"] and err["param"] == "prompt_logprobs", err
    assert engine.call(lambda e: e.kv_manager.num_lookup_tokens) == looked_up  # no request was admitted
    assert wait_idle(engine) == (0, 0, 0)
