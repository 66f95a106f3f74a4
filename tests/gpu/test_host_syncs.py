"""Host round-trips of one decode step on the torch path, counted on the CPU.

``execstate_bench.host_syncs.HostSyncCounter`` counts what would stall a GPU (reads of device values,
data-dependent shapes, blocking uploads: its docstring has the rules). The torch path's decode
step (MoE with route capture, a mix of greedy, seeded and unseeded sampling with logprobs, penalties
off) may read the device once: the sampled ids. The C-kernel CPU path is not concerned.
"""

from __future__ import annotations

import pytest
import torch

from execstate import SamplingParams
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate_bench.host_syncs import HostSyncCounter


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_random("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"), seed=0)


def _decoding_engine(path, **kw) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=path, kernels="torch", enable_return_routed_experts=True, **kw))
    params = [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, top_p=0.8, top_k=40, seed=7, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.0, min_p=0.01, max_tokens=8, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    ]
    for i, p in enumerate(params):
        engine.add_request([3 + i, 40, 41 + i, 7, 9, 11 + i, 5][: 4 + i], p)
    engine.step()  # the prefills
    return engine


def test_a_decode_step_reads_the_device_once(moe_dir) -> None:
    engine = _decoding_engine(moe_dir)
    before = {r: len(req.output_token_ids) for r, req in engine.requests.items()}
    with HostSyncCounter() as count:
        outs = engine.step()
    assert len(outs) == 4 and all(len(engine.requests[r].output_token_ids) == n + 1 for r, n in before.items())
    assert count.reads <= 1, count.events
    assert count.uploads == 0, count.events


def test_the_counter_sees_what_the_old_paths_did(moe_dir) -> None:
    """The counter can fail: a per-expert ``bincount().tolist()`` (the former MoE dispatch) and a
    ``torch.tensor`` upload are each counted."""
    from execstate.model.moe import experts_torch

    x = torch.randn(5, 64)
    ids = torch.tensor([[0, 1], [1, 2], [0, 3], [2, 1], [3, 0]])
    w1, w2 = torch.randn(4, 64, 64), torch.randn(4, 64, 32)
    with HostSyncCounter() as count:
        experts_torch(x, ids, torch.ones(5, 2), w1, w2)
        torch.tensor([1, 2, 3])
        bool(x.sum() > 0)
        x[x > 0]
    assert count.reads == 4 and count.uploads == 1, count.events  # bincount and its tolist: two
