"""The real GGUF files served as they are (``quantization="gguf"``, slow): the wheel's Q4_1 SmolLM2
(its blocks are the model's matrices, byte for byte) and the smollm2-moe Q8_0 / Q4_1 builds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from embedded_helpers import CAPITAL_PROMPT

from execstate import LLM, SamplingParams
from execstate.kernels import cpu
from execstate.model.gguf_import import find_packaged_gguf

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")]


def _answer(llm: LLM) -> str:
    text = llm.get_tokenizer().apply_chat_template([{"role": "user", "content": CAPITAL_PROMPT}],
                                                   add_generation_prompt=True)
    out = llm.generate(text, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    return out[0].outputs[0].text


def test_smollm2_135m_serves_the_wheels_q4_1_file_as_it_is(dense_dir) -> None:
    from gguf import GGUFReader

    llm = LLM("smollm2-135m", quantization="gguf")
    model = llm.engine.model
    assert llm.engine.provenance.numerics == "eager+cpu-gguf-q41-q80-v2"
    assert sum(p.nbytes for p in model.parameters()) < 100e6  # the file's 96.6 MB of blocks and norms
    file = {t.name: np.array(t.data) for t in GGUFReader(str(find_packaged_gguf())).tensors}
    assert torch.equal(model.layers[3].mlp.down_proj.weight, torch.from_numpy(file["blk.3.ffn_down.weight"]))
    assert torch.equal(model.embed_tokens.weight, torch.from_numpy(file["token_embd.weight"]))  # Q8_0, tied head
    gate_up = torch.from_numpy(np.concatenate([file["blk.0.ffn_gate.weight"], file["blk.0.ffn_up.weight"]]))
    assert torch.equal(model.layers[0].mlp.gate_up_proj.weight, gate_up)
    assert "Paris" in _answer(llm)


@pytest.mark.parametrize(("name", "numerics"), [("smollm2-moe-q4_1", "eager+cpu-gguf-q41-q80-v2"),
                                                ("smollm2-moe-q8_0", "eager+cpu-gguf-q80-v2")])
def test_smollm2_moe_builds_answer_paris(moe_dir, name: str, numerics: str) -> None:
    llm = LLM(name, quantization="gguf", enable_return_routed_experts=True)
    assert llm.engine.provenance.numerics == numerics
    assert llm.engine.model.decode_weights().reason is None
    assert "Paris" in _answer(llm)
