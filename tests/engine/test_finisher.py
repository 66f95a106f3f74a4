"""The request finisher without a model: the one place a request ends (engine/finisher.py).

Checks its contract: the final output, the request gone from the live requests, the finish hook
run exactly once, a failing hook's blocks released (nothing leaks), deferred outputs returned by
the next take in order and only once.
"""

from __future__ import annotations

import pytest

from execstate.engine.finisher import RequestFinisher
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request, RequestStatus
from execstate.engine.sampling_params import SamplingParams
from execstate.state.block_holds import BlockHolds, HeldBlocks
from execstate.state.block_pool import BlockPool


def finished_request(rid: str, status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> Request:
    req = Request(rid, [5, 6, 7], SamplingParams(max_tokens=4), max_model_len=64)
    req.output_token_ids, req.output.logprobs, req.output.top_logprobs = [9, 10], [-0.5, -1.0], [[], []]
    req.status = status
    return req


def make(requests: dict[str, Request]) -> tuple[RequestFinisher, BlockHolds]:
    holds = BlockHolds(BlockPool(8))
    return RequestFinisher(requests, None, False, R3Clock(), holds), holds


def test_finalize_builds_the_final_output_forgets_the_request_and_runs_the_hook_once():
    req = finished_request("a")
    requests = {"a": req, "b": finished_request("b")}
    finisher, _ = make(requests)
    calls = []
    req.session.on_finished = lambda r, out: calls.append((r.request_id, out.finished, out.outputs[0].finish_reason))
    out = finisher.finalize(req)
    assert (out.request_id, out.finished, out.outputs[0].token_ids, out.outputs[0].finish_reason) == (
        "a", True, [9, 10], "stop")
    assert list(requests) == ["b"]  # the live requests are the engine's dict, shared, not copied
    assert calls == [("a", True, "stop")]
    finisher.run_finish_hook(req, out)  # cleared before it ran: never twice
    assert calls == [("a", True, "stop")] and req.session.on_finished is None


def test_a_failing_hook_is_logged_and_the_blocks_it_did_not_take_are_released(caplog):
    finisher, holds = make({})
    pool = holds.pool
    held = holds.adopt(HeldBlocks(pool.allocate(3), num_tokens=40))  # the step's blocks, handed back
    req = finished_request("s", RequestStatus.FINISHED_ABORTED)
    req.session.returned_blocks = held

    def hook(r, out):
        raise RuntimeError("session gone")

    req.session.on_finished = hook
    out = finisher.finalize(req)  # does not raise
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert pool.num_used == 0 and holds.num_holders == 0
    pool.check_integrity()
    holds.check_integrity()
    assert "the finish hook of request s failed" in caplog.text


def test_a_failing_hook_after_taking_its_blocks_leaves_them_with_their_new_owner():
    finisher, holds = make({})
    pool = holds.pool
    held = holds.adopt(HeldBlocks(pool.allocate(2), num_tokens=20))
    req = finished_request("s")
    req.session.returned_blocks = held
    kept = []

    def hook(r, out):
        kept.append(holds.pin(r.session.returned_blocks))  # the session keeps a reference of its own
        holds.release(r.session.returned_blocks)
        raise RuntimeError("after taking")

    req.session.on_finished = hook
    finisher.finalize(req)
    assert pool.num_used == 2 and holds.num_holders == 1 and holds.holds(kept[0])


@pytest.mark.parametrize("n", [0, 1, 3])
def test_deferred_outputs_come_back_once_in_order(n):
    requests = {f"r{i}": finished_request(f"r{i}") for i in range(n)}
    finisher, _ = make(requests)
    outs = [finisher.finalize(r) for r in list(requests.values())]
    for out in outs:
        finisher.defer(out)
    assert finisher.has_deferred is (n > 0)
    assert [o.request_id for o in finisher.take_deferred()] == [f"r{i}" for i in range(n)]
    assert not finisher.has_deferred and finisher.take_deferred() == []
