"""The end-of-turn probe's training (``execstate_bench.end_probe_train``) on a tiny random model:
the features are the engine's own hidden states (the live step returns the same), the fit is
deterministic for a seed, and the held-out reader takes every scored turn end and pause of the
nine recorded runs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from execstate.agent.end_probe import EndProbe
from execstate.agent.front import SessionFront
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate_bench import end_probe_train as ept
from execstate_bench.end_probe_text import generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = make_random("llama", tmp_path_factory.mktemp("probe_llama"), seed=0)
    write_tokenizer(d)
    return d


def test_training_on_a_tiny_seeded_set_gives_the_same_weights_twice(tiny, tmp_path):
    front = ept.Front(str(tiny))
    turns = generate(24, 3)
    a = ept.training_features(front, turns, 3, log=False)
    b = ept.training_features(front, turns, 3, log=False)
    assert np.array_equal(a.hidden, b.hidden) and np.array_equal(a.label, b.label)
    assert a.label.sum() == 24 and len(a.label) == 24 + sum(len(t.cuts) for t in turns) - a.dropped
    pa, pb = ept.train(a, 3), ept.train(b, 3)
    assert np.array_equal(pa.w, pb.w) and pa.b == pb.b and pa.thresholds == pb.thresholds
    assert set(pa.thresholds) == {"high", "medium", "low"} and all(t in ept.GRID for t in pa.thresholds.values())
    path = tmp_path / "probe.safetensors"
    ept.save(pa, path, {"model": "tiny", "weights_version": front.weights_version,
                        **{f"threshold_{k}": str(t) for k, t in pa.thresholds.items()}})
    probe = EndProbe.load(path)
    assert probe.weights_version == front.weights_version
    assert np.allclose([probe.prob(h) for h in a.hidden[:5]], pa.prob(a.hidden[:5]), rtol=1e-5, atol=1e-7)
    c = ept.training_features(front, generate(24, 4), 4, log=False)
    assert not np.array_equal(ept.train(c, 4).w, pa.w)


@pytest.mark.parametrize("kernels", [None, "torch"])
def test_the_live_speculation_returns_the_hidden_state_the_training_reads(tiny, kernels):
    """``SamplingParams.return_hidden`` through the engine (its CPU kernels, and the torch path:
    ``engine/device_runner.py``), the session step and ``SessionFront``: the state at the
    speculated input's last token, as one causal pass over the same tokens gives."""
    front_t = ept.Front(str(tiny))
    ids = front_t.encode("hello there how are you", special=True)

    async def main():
        extra = {} if kernels is None else {"kernels": kernels}
        eng = AsyncEngine(LLMEngine(EngineConfig(model=str(tiny), seed=0, **extra)))
        try:
            front = await SessionFront.open(eng, "")
            assert front.weights_version == front_t.weights_version
            s1 = await front.speculate(ids[:3], frozenset({1}), ids[3])
            s2 = await front.speculate(ids[4:], frozenset({1}), 2)  # on the held KV: only the new tokens
            return s1, s2
        finally:
            eng.shutdown()

    s1, s2 = asyncio.run(asyncio.wait_for(main(), 60))
    full = front_t.hidden(ids).numpy()
    assert s1.hidden is not None and s1.hidden.shape == (full.shape[1],)
    assert np.allclose(s1.hidden, full[2], atol=1e-4)
    assert s2.hidden is not None and np.allclose(s2.hidden, full[-1], atol=1e-4)
    assert not np.allclose(s1.hidden, s2.hidden, atol=1e-2)
    with pytest.raises(ValueError, match="return_hidden"):
        SamplingParams(return_hidden=1)  # type: ignore[arg-type]


def test_the_held_out_set_is_every_scored_turn_end_and_pause_of_the_nine_runs():
    items = ept.bench_heldout()
    assert (sum(lbl for _, lbl, _ in items), sum(1 - lbl for _, lbl, _ in items)) == (189, 68)
    y = np.array([lbl for _, lbl, _ in items])
    live = np.array([p for _, _, p in items])
    assert round(ept.auc(live, y), 3) == 0.890  # the live end score's separation, as docs/voice.md says
    assert ept.auc(np.array([1.0, 0.5, 0.5, 0.0]), np.array([1, 1, 0, 0])) == 0.875
