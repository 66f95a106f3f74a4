"""Greedy constrained rows settled argmax first (``engine/grammar_argmax.py``) on the real SmolLM2
vocabulary (slow: the embedded model): the benchmark's JSON workload gives the same token ids as
with every mask computed, and llguidance's mask is the forced token or the validated tokens on
every token of the states it visits."""

from __future__ import annotations

import pytest
import torch

from execstate.engine.grammar.spec import StructuredOutputsParams as S
from execstate.engine.grammar_masks import GrammarMasks
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.token_mask import TokenMask, allowed
from execstate.session.lm.llm import LLM
from execstate_bench.structured import SCHEMA, prompts


@pytest.mark.slow
def test_json_workload_tokens_equal_and_the_mask_facts_hold(dense_dir):
    llm = LLM(str(dense_dir), max_num_seqs=8)
    eng = llm.engine
    batch = [{"prompt_token_ids": p} for p in prompts(llm.get_tokenizer(), 8)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, structured_outputs=S(json=SCHEMA))
    runs = {}
    for defer in (False, True):
        eng.grammar_masks = GrammarMasks(eng.model_config.vocab_size, eng.eos_token_ids, defer_greedy=defer)
        runs[defer] = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
        counts = eng.grammar_masks.argmax_counts
        eng.grammar_masks.shutdown()
    assert runs[True] == runs[False] and all(len(t) == 64 for t in runs[True])
    # most rows need no mask on this workload (92% in the run that motivated it)
    assert counts.forced + counts.accepted + counts.masked == 8 * 64
    assert counts.masked < 0.25 * 8 * 64 and counts.forced > 0 and counts.accepted > 0

    compiler = eng.grammar
    V, eos = compiler.vocab_size, set(compiler._eos)
    m = compiler.compile(S(json=SCHEMA)).matcher()
    free = 0
    for t in runs[True][0][:40]:
        bits = torch.empty((1, (V + 31) // 32), dtype=torch.int32)
        m.ll.deep_copy().unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        mask = allowed(TokenMask(torch.tensor([0]), bits), V)[0]
        ff = m.ll.compute_ff_tokens()
        if ff:
            assert mask.nonzero().flatten().tolist() == [ff[0]] and m.ll.compute_ff_bytes()
        elif not m.ll.compute_ff_bytes():
            free += 1
            flags = mask.tolist()
            assert [u for u in range(V) if u not in eos and (m.ll.validate_tokens([u]) == 1) != flags[u]] == []
        assert m.accept(t)
    assert free >= 10
