"""Greedy constrained rows settled argmax first (``engine/grammar_argmax.py``): the two facts about
llguidance's mask it rests on, checked on every token of many grammar states; ``settle`` against
the full mask on crafted logits rows; and the engine's tokens with and without it, equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.grammar.spec import StructuredOutputsParams as S
from execstate.engine.grammar_argmax import ArgmaxCounts, ArgmaxFirst, GreedyExecutor
from execstate.engine.grammar_masks import GrammarMasks
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.token_mask import TokenMask, allowed, apply_token_mask
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate.session.lm.llm import LLM

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green", "blue"]},
        "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    },
    "required": ["name", "n", "ok", "tag", "xs"],
    "additionalProperties": False,
}
SPECS = [S(json=SCHEMA), S(json_object=True), S(regex=r"[a-c]{2}-[0-9]{3}( ok)?"),
         S(regex=r"(the|then|there) [a-z]+\."), S(choice=["alpha", "beta", "gamma delta"]),
         S(grammar='start: "item" ITEM+ "."\nITEM: " a" | " ab" | " abc"')]
NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread) -> None:
    return None


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    d = make_random("llama", tmp_path_factory.mktemp("argmax_llama"), seed=0)
    write_tokenizer(Path(d))
    return LLM(d, max_model_len=256, seed=0)


def _mask(compiler: GrammarCompiler, m: GrammarMatcher) -> torch.Tensor:
    bits = torch.empty((1, (compiler.vocab_size + 31) // 32), dtype=torch.int32)
    m.ll.deep_copy().unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
    return bits


def _states(compiler: GrammarCompiler, spec: S, seed: int, steps: int = 40) -> list[GrammarMatcher]:
    """Copies of a matcher along one random valid path (tokens drawn from each state's mask)."""
    rng = np.random.default_rng(seed)
    m = compiler.compile(spec).matcher()
    out = []
    for _ in range(steps):
        if m.stopped:
            break
        out.append(m.copy())
        ok = allowed(TokenMask(torch.tensor([0]), _mask(compiler, m)), compiler.vocab_size)[0].nonzero().flatten()
        ok = [t for t in ok.tolist() if t not in compiler._eos] or ok.tolist()
        assert m.accept(int(rng.choice(ok)))
    return out


def test_the_mask_is_the_forced_token_or_the_validated_ones(llm):
    # The facts ArgmaxFirst rests on, on every token of every state visited: where the grammar
    # forces tokens the mask is the first of them (and it forces bytes: no forced byte, no forced
    # token); where it forces no byte, a non-EOS token is in the mask exactly when validate_tokens
    # accepts it.
    compiler = llm.engine.grammar
    V, eos = compiler.vocab_size, set(compiler._eos)
    seen = {"forced": 0, "free": 0, "other": 0}
    for k, spec in enumerate(SPECS):
        for seed in range(3):
            for m in _states(compiler, spec, seed=10 * k + seed):
                mask = allowed(TokenMask(torch.tensor([0]), _mask(compiler, m)), V)[0]
                ff = m.ll.compute_ff_tokens()
                if ff:
                    seen["forced"] += 1
                    assert mask.nonzero().flatten().tolist() == [ff[0]] and m.ll.compute_ff_bytes()
                elif not m.ll.compute_ff_bytes():
                    seen["free"] += 1
                    valid = [m.ll.validate_tokens([t]) == 1 for t in range(V)]
                    assert [t for t in range(V) if t not in eos and valid[t] != bool(mask[t])] == []
                else:
                    seen["other"] += 1
    assert seen["forced"] >= 20 and seen["free"] >= 100


def _full_mask_tokens(x: torch.Tensor, fallback: torch.Tensor, rows: list[int], bits: torch.Tensor) -> list[int]:
    y = x.clone()
    apply_token_mask(y, TokenMask(torch.tensor(rows), bits), fallback=fallback)
    return torch.argmax(y, dim=-1).tolist()


def test_settle_equals_the_full_mask_on_crafted_rows(llm):
    # Rows whose argmax is allowed, refused, EOS, a -inf row (the fallback decides), NaNs, ties:
    # settle gives the argmax under the full mask in every row, and needs no mask where the
    # grammar's answer suffices.
    compiler = llm.engine.grammar
    V, words = compiler.vocab_size, (compiler.vocab_size + 31) // 32
    eos = sorted(compiler._eos)[0]
    g = torch.Generator().manual_seed(0)
    counts = ArgmaxCounts()
    executor = GreedyExecutor()
    checked = 0
    for k, spec in enumerate(SPECS):
        states = _states(compiler, spec, seed=100 + k, steps=24)
        for j in range(0, len(states), 3):
            group = states[j : j + 3]
            n = len(group) + 2  # two unconstrained rows around them
            rows = list(range(1, 1 + len(group)))
            bits = torch.cat([_mask(compiler, m) for m in group])
            ok = allowed(TokenMask(torch.tensor(rows), bits), V)
            for case in range(7):
                x = torch.randn(n, V, generator=g)
                fallback = torch.randn(n, V, generator=g)
                for i, r in enumerate(rows):
                    good = ok[i].nonzero().flatten()
                    bad = (~ok[i]).nonzero().flatten()
                    if case == 1:  # the argmax is an allowed token
                        x[r, good[torch.randint(len(good), (1,), generator=g)]] = 9.0
                    elif case == 2 and len(bad):  # a refused token, an allowed one just below it
                        x[r, bad[0]] = 9.0
                        x[r, good[-1]] = 8.0
                    elif case == 3:  # EOS on top; ties between allowed tokens
                        x[r, eos] = 9.0
                        x[r, good[: 3]] = 8.0
                    elif case == 4:  # the bans left nothing: the fallback row under the mask decides
                        x[r] = NEG_INF
                    elif case == 5:  # an allowed token at -inf, a NaN on an allowed one
                        x[r, good[0]] = NEG_INF
                        x[r, good[-1]] = float("nan")
                    elif case == 6 and len(bad):  # NaNs on a refused token and on an allowed one
                        x[r, bad[0]] = float("nan")
                        x[r, good[-1]] = float("nan")
                want = _full_mask_tokens(x, fallback, rows, bits)
                tokens = torch.argmax(x, dim=-1)
                before = (x.clone(), fallback.clone())
                ArgmaxFirst(rows, group, words, frozenset(compiler._eos), executor, counts).settle(x, fallback, tokens)
                assert tokens.tolist() == want
                assert torch.equal(x.nan_to_num(), before[0].nan_to_num()) and torch.equal(fallback, before[1])
                checked += 1
    assert checked > 60 and counts.forced > 0 and counts.accepted > 0 and counts.masked > 0


def _run(llm: LLM, prompts: list[str], params: list[SamplingParams], defer: bool) -> tuple[list, ArgmaxCounts]:
    eng = llm.engine
    saved = eng.grammar_masks
    eng.grammar_masks = GrammarMasks(eng.model_config.vocab_size, eng.eos_token_ids, defer_greedy=defer)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs], eng.grammar_masks.argmax_counts
    finally:
        eng.grammar_masks.shutdown()
        eng.grammar_masks = saved


def test_engine_tokens_equal_with_and_without_argmax_first(llm):
    # One batch mixing greedy constrained rows (each kind; one with min_tokens bans, one with
    # penalties), a random constrained row and an unconstrained one: the same token ids and finish
    # reasons with the masks computed for every row and with greedy rows settled argmax first.
    prompts = [f"prompt {i}" for i in range(len(SPECS) + 3)]
    params = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=s) for s in SPECS]
    params += [SamplingParams(temperature=0.0, max_tokens=48, min_tokens=20, structured_outputs=S(json_object=True)),
               SamplingParams(temperature=0.0, max_tokens=48, repetition_penalty=1.3, presence_penalty=0.5,
                              structured_outputs=S(json=SCHEMA)),
               SamplingParams(temperature=1.0, seed=7, max_tokens=48, structured_outputs=S(json=SCHEMA))]
    prompts.append("plain")
    params.append(SamplingParams(temperature=0.0, max_tokens=48))
    eager, none = _run(llm, prompts, params, defer=False)
    deferred, counts = _run(llm, prompts, params, defer=True)
    assert none == ArgmaxCounts()
    assert deferred == eager
    assert counts.forced > 0 and counts.accepted > 0 and counts.masked > 0
    assert {r for _, r in eager} >= {"stop", "length"}
    # alone, each greedy constrained request gives the tokens it gave in the batch
    for i in (0, 3):
        alone, _ = _run(llm, [prompts[i]], [params[i]], defer=True)
        assert alone[0] == eager[i]
