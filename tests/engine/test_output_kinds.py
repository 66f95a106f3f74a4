"""Output kinds through the engine (tiny random MoE with the byte-level test tokenizer).

Seeded sampling gives random bytes, so characters split across tokens and invalid
UTF-8 occur. Oracle: the same request with ``CUMULATIVE`` outputs (today's behaviour)
and ``tokenizer.decode`` of the final token ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from execstate import LLM
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.outputs import RequestOutput
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
PROMPT = [5, 17, 42, 99, 250, 311, 7, 8, 9]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tokenizer(make_random("qwen3_moe", tmp_path_factory.mktemp("kinds"), seed=0))


@pytest.fixture(scope="module")
def engine(model_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), seed=0, enable_return_routed_experts=True))


def run(engine: LLMEngine, rid: str, kind: RequestOutputKind, **kw) -> list[RequestOutput]:
    kw = {"temperature": 1.0, "seed": 3, "max_tokens": 24, "ignore_eos": True, "logprobs": 2, **kw}
    engine.add_request({"prompt_token_ids": PROMPT}, SamplingParams(output_kind=kind, **kw), request_id=rid)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def test_delta_and_final_only_carry_what_cumulative_carries(engine):
    cum = run(engine, "c", CUMULATIVE)
    deltas = run(engine, "d", DELTA)
    only = run(engine, "f", FINAL_ONLY)
    ref = cum[-1].outputs[0]
    assert len(ref.token_ids) == 24 and ref.text == engine.tokenizer.decode(ref.token_ids)
    assert "\ufffd" in ref.text  # random bytes: the decoder really met invalid/split UTF-8
    assert [len(o.outputs[0].token_ids) for o in cum] == list(range(1, 25))
    assert [len(o.outputs[0].token_ids) for o in deltas] == [1] * 24
    assert "".join(o.outputs[0].text for o in deltas) == ref.text
    assert sum((o.outputs[0].token_ids for o in deltas), []) == ref.token_ids
    assert sum((o.outputs[0].logprobs for o in deltas), []) == ref.logprobs
    assert all(o.outputs[0].routed_experts is None and o.outputs[0].finish_reason is None for o in deltas[:-1])
    last = deltas[-1]
    assert last.finished and last.outputs[0].finish_reason == "length"
    assert np.array_equal(last.outputs[0].routed_experts, ref.routed_experts)
    assert last.outputs[0].cumulative_logprob == ref.cumulative_logprob
    assert last.prompt_token_sources == cum[-1].prompt_token_sources
    assert len(only) == 1 and only[0].finished
    got = only[0].outputs[0]
    assert (got.text, got.token_ids, got.logprobs, got.cumulative_logprob) == (
        ref.text, ref.token_ids, ref.logprobs, ref.cumulative_logprob)
    assert np.array_equal(got.routed_experts, ref.routed_experts)


def test_stop_string_through_the_engine_is_cut_and_held_back(engine):
    ref = run(engine, "ref", CUMULATIVE, logprobs=None)[-1].outputs[0]
    ends = np.cumsum([len(engine.tokenizer.decode(ref.token_ids[: k + 1])) for k in range(len(ref.token_ids))])
    # a 2-character stop string across a token boundary, first occurring there, no U+FFFD in it
    text = ref.text
    at = next(i for i in range(1, len(text) - 1)
              if i + 1 in set(ends.tolist()) and "\ufffd" not in text[i : i + 2] and text.find(text[i : i + 2]) == i)
    stop = text[at : at + 2]
    deltas = run(engine, "stop", DELTA, logprobs=None, stop=[stop])
    sent = ""
    for o in deltas:
        sent += o.outputs[0].text
        assert text[:at].startswith(sent)  # the stop string's first character was held back
    final = deltas[-1].outputs[0]
    assert sent == text[:at] and final.finish_reason == "stop" and final.stop_reason == stop
    assert sum((o.outputs[0].token_ids for o in deltas), []) == ref.token_ids[: len(deltas)]


def test_abort_flushes_held_back_text_into_the_final_delta(engine):
    engine.add_request({"prompt_token_ids": PROMPT}, SamplingParams(
        temperature=0.0, max_tokens=50, ignore_eos=True, stop=["\x00" * 8], output_kind=DELTA), request_id="ab")
    outs = []
    while len(outs) < 10:
        outs += [o for o in engine.step() if o.request_id == "ab"]
    final = engine.abort_request("ab")
    assert final is not None and final.finished and final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].token_ids == []
    # held back (7 characters could start the stop string), sent with the final output
    text = "".join(o.outputs[0].text for o in outs) + final.outputs[0].text
    ids = sum((o.outputs[0].token_ids for o in outs), [])
    assert text == engine.tokenizer.decode(ids) and len(final.outputs[0].text) > 0


def test_llm_generate_returns_everything_whatever_the_kind(model_dir):
    llm = LLM(str(model_dir), seed=0)
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1, output_kind=k)
              for k in (CUMULATIVE, DELTA, FINAL_ONLY)]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * 3, params, use_tqdm=False)
    first = outs[0].outputs[0]
    assert len(first.token_ids) == 12 and first.text == llm.get_tokenizer().decode(first.token_ids)
    assert all(o.outputs[0].token_ids == first.token_ids and o.outputs[0].text == first.text for o in outs)
    assert all(len(o.outputs[0].logprobs) == 12 for o in outs)
    assert params[1].output_kind is DELTA  # the caller's params are not changed
