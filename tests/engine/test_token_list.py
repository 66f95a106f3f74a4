"""A request's tokens are one list, appended in place, and a step reads only the span it runs.

No timing: the request's list is swapped for a list that counts the elements read from it
(``Counting``), so a step that rebuilt prompt + outputs, copied or iterated the context would
read O(context) elements, and the counts below would differ between a short and a long context.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from execstate import LLM, SamplingParams
from execstate.engine.device_inputs import DeviceInputs
from execstate.engine.request import Request
from execstate.engine.sampling_params import RequestOutputKind
from execstate.engine.scheduler import ScheduledRequest, SchedulerOutput
from execstate.kernels import cpu
from execstate.model.random_models import make_random

BS = 16


class Counting(list[int]):
    """A list that counts the elements read through Python (indexing, slices, iteration, copies)."""

    reads = 0

    def __getitem__(self, index):
        got = super().__getitem__(index)
        Counting.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __iter__(self):
        Counting.reads += len(self)
        return super().__iter__()

    def __add__(self, other):
        Counting.reads += len(self)
        return list(self) + list(other)

    def copy(self):
        Counting.reads += len(self)
        return list(super().__iter__())


def test_one_list_prompt_then_outputs() -> None:
    prompt = [5, 6, 7]
    req = Request("r", prompt, SamplingParams(max_tokens=8), max_model_len=64)
    tokens = req.all_token_ids
    assert tokens == [5, 6, 7] and tokens is not prompt and req.output_token_ids == []
    req.append_output_token(9)
    req.output_token_ids.append(10)
    assert req.all_token_ids is tokens and tokens == [5, 6, 7, 9, 10] and prompt == [5, 6, 7]
    out = req.output_token_ids
    assert (len(out), out[0], out[-1], out[1:], out[::-1], list(out)) == (2, 9, 10, [10], [10, 9], [9, 10])
    assert out == [9, 10] and out == (9, 10) and out != [9] and repr(out) == "[9, 10]"
    assert (req.num_tokens, req.num_output_tokens, req.num_prompt_tokens) == (5, 2, 3)
    with pytest.raises(IndexError):
        out[2]
    req.output_token_ids = [1, 2, 3]
    assert req.all_token_ids is tokens and tokens == [5, 6, 7, 1, 2, 3] and req.prompt_token_ids is prompt


def _decode_step(req: Request) -> SchedulerOutput:
    """The scheduler's output for one decode step of ``req`` (its last token runs)."""
    return SchedulerOutput([ScheduledRequest(req, 1, req.num_tokens - 1)])


def _long_request(context: int) -> Request:
    req = Request(f"c{context}", [3 + i % 400 for i in range(context - 2)], SamplingParams(max_tokens=8),
                  max_model_len=context + 8)
    req.append_output_token(7)
    req.append_output_token(8)
    req.block_ids = list(range(-(-(context + 8) // BS)))
    req.all_token_ids = Counting(req.all_token_ids)
    return req


@pytest.mark.parametrize("context", [128, 16384])
def test_the_device_inputs_read_one_token_per_decode(context: int) -> None:
    inputs = DeviceInputs(torch.device("cpu"), BS, 64, 4, 8)
    req = _long_request(context)
    Counting.reads = 0
    step = inputs.load(_decode_step(req))
    assert Counting.reads == 1 and int(step.ids[0]) == 8 and int(step.positions[0]) == context - 1
    # a chunk over outputs (a resumed request recomputing): the span it runs, nothing more
    Counting.reads = 0
    chunk = inputs.load(SchedulerOutput([ScheduledRequest(req, 5, context - 5)]))
    assert Counting.reads == 5 and chunk.ids[:5].tolist() == req.all_token_ids[context - 5:]


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory) -> Path:
    return make_random("llama", tmp_path_factory.mktemp("llama_long"), seed=0, max_position_embeddings=1024)


KERNELS = ["torch", pytest.param("execstate", marks=pytest.mark.skipif(not cpu.available(),
                                                                       reason="kernels unavailable"))]


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_decode_step_reads_the_same_whatever_the_context(long_llama: Path, kernels: str,
                                                           torch_single_thread: None) -> None:
    """Prefill two requests (contexts 33 and 993, the same offset in a block), then decode 12 steps
    each with the counting list: the elements read are the same, and few (the token fed in, the
    token sampled, the DELTA output's new token, one block's tokens for its key when a block
    fills); the list is never rebuilt."""
    llm = LLM(str(long_llama), kernels=kernels, block_size=BS, max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    reads = {}
    for n_prompt in (32, 992):
        rid = llm.engine.add_request({"prompt_token_ids": [3 + i % 400 for i in range(n_prompt)]}, params)
        req = llm.engine.requests[rid]
        outs = []
        while req.num_output_tokens < 1:
            outs += llm.engine.step()
        tokens = req.all_token_ids = Counting(req.all_token_ids)
        Counting.reads = 0
        for _ in range(12):
            outs += llm.engine.step()
        reads[n_prompt] = Counting.reads
        assert req.all_token_ids is tokens and len(tokens) == n_prompt + 13
        while llm.engine.has_unfinished_requests():
            outs += llm.engine.step()
        streamed = [t for o in outs for t in o.outputs[0].token_ids]
        assert len(streamed) == 14 and list(tokens) == outs[0].prompt_token_ids + streamed
    assert reads[32] == reads[992] <= 12 * 3 + BS
