"""Constrained decoding in the engine: masks from the grammar engine applied in the sampler, the
matcher advanced per token, its state copied, rolled back and restored (engine/grammar/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from execstate.engine.config import EngineConfig
from execstate.engine.grammar.matcher import GrammarSnapshot
from execstate.engine.grammar.spec import StructuredOutputsParams as S
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.token_mask import TokenMask, allowed, apply_token_mask
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate.session.lm.llm import LLM

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green"]},
    },
    "required": ["n", "ok", "tag"],
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread) -> None:
    return None


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    d = make_random("llama", tmp_path_factory.mktemp("grammar_llama"), seed=0)
    write_tokenizer(Path(d))
    return LLM(d, max_model_len=256, seed=0)


def _gen(llm: LLM, spec: S | None, seed: int = 0, n_prompts: int = 1, **kw) -> list[str]:
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=kw.pop("max_tokens", 80), structured_outputs=spec,
                            **kw)
    outs = llm.generate([f"prompt {i}" for i in range(n_prompts)], params, use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_each_kind_constrains_a_random_model(llm):
    # A random model left alone writes noise; under each constraint its output is valid.
    for seed in range(3):
        out = _gen(llm, S(json=SCHEMA), seed)[0]
        jsonschema.validate(json.loads(out), SCHEMA)
        assert re.fullmatch(r"[a-c]{2}-[0-9]{3}", _gen(llm, S(regex=r"[a-c]{2}-[0-9]{3}"), seed)[0])
        assert _gen(llm, S(choice=["alpha", "beta", "gamma"]), seed)[0] in ("alpha", "beta", "gamma")
        obj = llm.generate(["p"], SamplingParams(temperature=1.0, seed=seed, max_tokens=100,
                                                 structured_outputs=S(json_object=True)), use_tqdm=False)[0].outputs[0]
        # any object: a random model may still be inside it at max_tokens
        assert obj.text.startswith("{") and (obj.finish_reason == "length" or isinstance(json.loads(obj.text), dict))
        assert _gen(llm, S(grammar='root ::= "x" digits\ndigits ::= [0-9]+ "!"'), seed)[0][0] == "x"
        assert re.fullmatch(r"(ab|cd)+\.", _gen(llm, S(grammar='start: ITEM+ "."\nITEM: "ab" | "cd"'), seed)[0])


def test_finish_reason_is_stop_when_the_grammar_completes(llm):
    out = llm.generate(["p"], SamplingParams(temperature=1.0, seed=3, max_tokens=50,
                                             structured_outputs=S(choice=["yes", "no"])), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.text in ("yes", "no")
    assert llm.get_tokenizer().decode(c.token_ids) == c.text


def test_unconstrained_rows_are_unchanged_by_constrained_batch_mates(llm):
    alone = _gen(llm, None, seed=11)[0]
    params = [SamplingParams(temperature=1.0, seed=11, max_tokens=80),
              SamplingParams(temperature=1.0, seed=5, max_tokens=80, structured_outputs=S(json=SCHEMA))]
    outs = llm.generate(["prompt 0", "prompt 1"], params, use_tqdm=False)
    assert outs[0].outputs[0].text == alone
    jsonschema.validate(json.loads(outs[1].outputs[0].text), SCHEMA)


def test_invalid_constraints_are_value_errors_before_the_engine(llm):
    for spec, msg in [(S(regex="(?=a)b"), "invalid structured output regex"),
                      (S(grammar="start: foo"), "invalid structured output grammar"),
                      (S(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "invalid structured")]:
        with pytest.raises(ValueError, match=msg):
            llm.generate(["p"], SamplingParams(structured_outputs=spec), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_catastrophic_regexes_compile_and_run_in_bounded_time(llm):
    # Backtracking engines take exponential time on these; llguidance's derivative lexer does not.
    import time

    for rx, valid in [(r"(x+x+)+y", r"x+y"), (r"((a{1,1000}){1,1000}){1,1000}", r"a+")]:
        t = time.perf_counter()
        text = _gen(llm, S(regex=rx), seed=1, max_tokens=20)[0]
        assert re.fullmatch(valid, text) or re.fullmatch(valid[:-1] + "*", text)
        assert time.perf_counter() - t < 20
    for rx, msg in [(r"(a)\1", "backreference"), (r"(?=a)a", "look-around")]:
        with pytest.raises(ValueError, match=msg):
            llm.engine.grammar.compile(S(regex=rx))


def _mask_of(compiler, matcher) -> torch.Tensor:
    bits = torch.empty((1, (compiler.vocab_size + 31) // 32), dtype=torch.int32)
    matcher.ll.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
    return allowed(TokenMask(torch.tensor([0]), bits), compiler.vocab_size)[0]


def test_matcher_copy_rollback_and_snapshot_restore(llm):
    compiler = llm.engine.grammar
    tok = llm.get_tokenizer()
    m = compiler.compile(S(json=SCHEMA)).matcher()
    ids = tok.encode('{"n": 12, "ok": true, "tag": "red"}', add_special_tokens=False)
    for t in ids[:6]:
        assert m.accept(t)
    mask_at_6 = _mask_of(compiler, m)
    c = m.copy()
    for t in ids[6:]:
        assert m.accept(t)
    assert m.stopped and not c.stopped
    assert torch.equal(_mask_of(compiler, c), mask_at_6)  # the copy did not move
    m.rollback(len(ids) - 6)
    assert m.token_ids == ids[:6] and torch.equal(_mask_of(compiler, m), mask_at_6)
    snap = m.snapshot()
    wire = json.loads(json.dumps({"spec": snap.spec, "token_ids": list(snap.token_ids)}))
    restored = compiler.restore(GrammarSnapshot(wire["spec"], tuple(wire["token_ids"])))
    assert torch.equal(_mask_of(compiler, restored), mask_at_6)
    with pytest.raises(ValueError, match="not accepted"):
        compiler.restore(GrammarSnapshot(snap.spec, (tok.encode("zzz", add_special_tokens=False)[0],)))
    assert not m.accept(tok.encode("]", add_special_tokens=False)[0]) and m.error


def test_apply_token_mask_touches_only_masked_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 70, generator=g)
    before = x.clone()
    bits = torch.zeros((2, 3), dtype=torch.int32)
    bits[0, 0] = 0b1010  # tokens 1 and 3
    bits[1, 2] = 1 << 5  # token 69
    apply_token_mask(x, TokenMask(torch.tensor([1, 3]), bits))
    assert torch.equal(x[0], before[0]) and torch.equal(x[2], before[2])
    assert torch.isfinite(x[1]).nonzero().flatten().tolist() == [1, 3]
    assert torch.isfinite(x[3]).nonzero().flatten().tolist() == [69]
    # A row the bans left empty keeps the grammar's mask alone.
    y = torch.full((1, 70), float("-inf"))
    apply_token_mask(y, TokenMask(torch.tensor([0]), bits[:1]), fallback=before[:1])
    assert torch.isfinite(y[0]).nonzero().flatten().tolist() == [1, 3]


def test_engine_config_without_tokenizer_refuses(tmp_path):
    d = make_random("llama", tmp_path / "m", seed=0)
    llm = LLM(EngineConfig(model=d).model, max_model_len=64)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate([[5, 6, 7]], SamplingParams(structured_outputs=S(regex="a")), use_tqdm=False)
