"""An engine serving GGUF blocks (``quantization="gguf"``; model/gguf_model.py): its numerics id per
format set, its cache never shared with an fp32 engine of the same model, a sequence's logprobs
the same bits alone and in a batch, refused configurations. The real files (the wheel's Q4_1
SmolLM2, the smollm2-moe builds): tests/embedded/test_embedded_gguf_serving.py (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.identity.execution import ExecutionIdentity
from execstate.kernels import cpu
from execstate.kernels.weight_format import WeightFormat
from execstate.model.gguf_quantize import quantize_checkpoint
from execstate.model.random_models import make_random

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    src = make_random("qwen3_moe", tmp_path_factory.mktemp("src"), seed=2)
    q41, q80 = tmp_path_factory.mktemp("q41"), tmp_path_factory.mktemp("q80")
    quantize_checkpoint(src, q41, WeightFormat.Q4_1, WeightFormat.Q8_0)
    quantize_checkpoint(src, q80, WeightFormat.Q8_0, WeightFormat.Q8_0)
    return src, q41, q80


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def test_numerics_ids_cache_keys_and_batch_invariance(dirs) -> None:
    src, q41, q80 = dirs
    a, b, f = LLM(str(q41), quantization="gguf"), LLM(str(q80), quantization="gguf"), LLM(str(src))
    pa, pb, pf = a.engine.provenance, b.engine.provenance, f.engine.provenance
    assert pa.numerics == "eager+cpu-gguf-q41-q80-v1" and pb.numerics == "eager+cpu-gguf-q80-v1"
    assert pa.dtype == "float32" and len({pa.weights_version, pb.weights_version, pf.weights_version}) == 3
    assert len({ExecutionIdentity(pa).root, ExecutionIdentity(pb).root, ExecutionIdentity(pf).root}) == 3
    prompt = _prompt(7, 45)
    alone = a.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0]
    outs = a.generate([{"prompt_token_ids": _prompt(s, 20 + 9 * s)} for s in (1, 2, 3)]
                      + [{"prompt_token_ids": prompt}], GREEDY, use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone.token_ids and outs[3].outputs[0].logprobs == alone.logprobs
    assert a.engine.model.decode_weights().reason is None  # decode steps took the whole-layer path


@pytest.mark.parametrize(("kwargs", "match"), [({"dtype": "bfloat16"}, "float32"), ({"kernels": "torch"}, "kernels"),
                                               ({"quantization": "gptq"}, "quantization")])
def test_bad_configurations(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="x", **{"quantization": "gguf", **kwargs})


def test_a_directory_without_a_gguf_file_is_refused(dirs) -> None:
    src, _, _ = dirs
    with pytest.raises(ValueError, match=r"one \.gguf file"):
        LLM(str(src), quantization="gguf")
