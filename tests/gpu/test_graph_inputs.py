"""The data path CUDA graphs replay, run eagerly on the CPU: a decode batch padded to a graph's bucket
(``DeviceInputs.load(pad_to=...)``, then the exact forward a graph captures,
``cuda_graphs._forward``) gives the real rows' logits bit for bit (deterministic mode, Triton's
interpreter), and its pad rows write no KV slot but row 0's. Capture and replay themselves are
GPU-only (``scripts/gpu_check.sh``)."""

from __future__ import annotations

import pytest
import torch

from execstate import SamplingParams
from execstate.engine import cuda_graphs
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random


def test_buckets() -> None:
    assert cuda_graphs.buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert cuda_graphs.buckets(3) == [1, 2, 3]


@pytest.mark.slow  # the model through Triton's interpreter
def test_padded_decode_equals_the_eager_step(tmp_path) -> None:
    engine = LLMEngine(EngineConfig(model=make_random("qwen3_moe", tmp_path, seed=0), kernels="torch",
                                    gpu_kernels="triton", deterministic=True, enable_return_routed_experts=True))
    for i in range(3):
        engine.add_request([5 + i, 9, 11, 13 + i, 4], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()  # prefills
    sched = engine.scheduler.schedule()
    runner = engine.runner.device_runner
    eager = runner.execute(sched)
    k_before = engine.kv_pool.k.clone()
    runner.inputs.load(sched, pad_to=4)
    with torch.inference_mode():
        logits, routes = cuda_graphs._forward(runner, 4)
    assert torch.equal(logits[:3], eager.logits)
    assert routes is not None and (routes[:3].numpy() == eager.routes).all()
    assert torch.equal(engine.kv_pool.k, k_before)  # the pad row rewrote row 0's slot with row 0's K
    assert cuda_graphs.DecodeGraphs.capture(runner, 4) is None  # no CUDA device: eager
