"""LM sessions over the AsyncEngine (the API the realtime WebSocket uses): every operation runs
on the engine thread, a step streams deltas ending with its StepResult, cancel, close, fork and
checkpoints by id, and every session is released when the engine shuts down."""

from __future__ import annotations

import asyncio

import pytest
from session_helpers import GREEDY, SAMPLED, generate, make_llm, tokens

from execstate.engine.async_engine import AsyncEngine, EngineDeadError
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.step_failure import check_references
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.step import StepDelta, StepResult
from execstate.session.runtime.events import SessionEventError


@pytest.fixture
def served(moe_dir):
    eng = LLMEngine(EngineConfig(model=str(moe_dir), seed=0, enable_return_routed_experts=True))
    aeng = AsyncEngine(eng)
    yield aeng, AsyncSessions(aeng), eng
    aeng.shutdown()


async def run_step(sessions: AsyncSessions, sid: str, input=None, **kw):
    items = [item async for item in sessions.step(sid, input, **kw)]
    assert isinstance(items[-1], StepResult) and all(isinstance(i, StepDelta) for i in items[:-1])
    return items[:-1], items[-1]


def test_step_streams_deltas_that_add_up_to_the_offline_step(served, moe_dir):
    aeng, sessions, eng = served
    offline = make_llm(moe_dir).open_session(sampling_params=SAMPLED)
    ref1, ref2 = offline.step(tokens(90, 20)), offline.step("and text")

    async def main():
        info = await sessions.open("chat-1", SAMPLED)
        assert (info.session_id, info.status, info.step_index) == ("chat-1", "open", 0)
        deltas, r1 = await run_step(sessions, "chat-1", tokens(90, 20))
        assert len(deltas) == 8 and [t for d in deltas for t in d.token_ids] == r1.token_ids
        _, r2 = await run_step(sessions, "chat-1", "and text")
        assert "".join(d.text for d in _) == r2.text
        return r1, r2, await sessions.token_ids("chat-1"), await sessions.routed_experts("chat-1")

    r1, r2, ids, routes = asyncio.run(main())
    assert (r1.token_ids, r2.token_ids) == (ref1.token_ids, ref2.token_ids)
    assert ids == offline.token_ids and routes.tobytes() == offline.routed_experts.tobytes()
    assert r2.step_index == 2 and r2.num_computed_tokens == len(ids) - 8 - 20 - 8 + 1


def test_events_checkpoints_and_forks_by_id(served, moe_dir):
    aeng, sessions, eng = served

    async def main():
        await sessions.open("s", GREEDY)
        ack = await sessions.submit_event("s", 4, "input", {"text": "hello"})
        assert (ack.event_id, ack.status) == (4, "accepted")
        assert (await sessions.submit_event("s", 4, "input", {"text": "other"})).duplicate
        with pytest.raises(SessionEventError) as ei:
            await sessions.submit_event("s", 3, "input", {"token_ids": [1]})
        assert ei.value.code == "stale"
        _, r1 = await run_step(sessions, "s")
        assert r1.events["started"] == [4]
        cp = await sessions.checkpoint("s")
        _, r2 = await run_step(sessions, "s", [7, 8])
        fork = await sessions.fork("s", cp, new_session_id="s-fork")
        assert fork.step_index == 1 and fork.branch_id != (await sessions.info("s")).branch_id
        _, rf = await run_step(sessions, "s-fork", [7, 8])
        assert rf.token_ids == r2.token_ids
        await sessions.rollback("s", cp)
        assert (await sessions.info("s")).step_index == 1
        await sessions.release_checkpoint("s", cp)
        with pytest.raises(SessionEventError) as ei:
            await sessions.rollback("s", cp)
        assert ei.value.code == "not_found"
        with pytest.raises(SessionEventError) as ei:
            await sessions.info("nope")
        assert ei.value.code == "not_found"
        listed = sorted(i.session_id for i in await sessions.list())
        await sessions.close("s")
        await sessions.close("s-fork")
        return listed, r1

    listed, r1 = asyncio.run(main())
    tok = eng.tokenizer
    assert listed == ["s", "s-fork"]
    assert r1.token_ids == generate(make_llm(moe_dir), tok.encode("hello", add_special_tokens=False)).token_ids
    assert eng.kv_holds.num_holders == 0 and eng.block_pool.num_used == 0


def test_cancel_keeps_what_was_generated_and_the_session_goes_on(served):
    aeng, sessions, eng = served

    async def main():
        await sessions.open("c", GREEDY)
        got = []
        result = None
        cancelled = False
        async for item in sessions.step("c", tokens(91, 10), max_tokens=200):
            if isinstance(item, StepDelta):
                got += item.token_ids
                if len(got) >= 2 and not cancelled:
                    cancelled = await sessions.cancel("c")
                    assert cancelled
            else:
                result = item
        assert result.finish_reason == "abort" and result.token_ids == got
        assert 2 <= len(result.token_ids) < 200
        info = await sessions.info("c")
        assert info.status == "open" and info.num_tokens == 10 + len(result.token_ids)
        assert not await sessions.cancel("c")  # nothing in flight
        _, nxt = await run_step(sessions, "c", [5], max_tokens=3)
        assert nxt.num_computed_tokens == 2 and len(nxt.token_ids) == 3
        await sessions.close("c")

    asyncio.run(main())
    assert eng.block_pool.num_used == 0 and eng.kv_holds.num_holders == 0


def test_closing_the_step_iterator_early_cancels_and_close_during_a_step(served):
    aeng, sessions, eng = served

    async def main():
        await sessions.open("x", GREEDY)
        stream = sessions.step("x", tokens(92, 10), max_tokens=200)
        async for item in stream:
            assert isinstance(item, StepDelta)
            break
        await stream.aclose()
        for _ in range(200):  # the abort is a command: wait until the engine took it
            if not (await sessions.info("x")).stepping:
                break
            await asyncio.sleep(0.01)
        assert (await sessions.info("x")).status == "open"
        await sessions.open("y", GREEDY)
        items = []

        async def consume():
            async for item in sessions.step("y", tokens(93, 10), max_tokens=200):
                items.append(item)

        task = asyncio.create_task(consume())
        while not items:
            await asyncio.sleep(0.005)
        assert await sessions.close("y")
        await task
        assert isinstance(items[-1], StepResult) and items[-1].finish_reason == "abort"
        assert (await sessions.info("y")).status == "closed"

    asyncio.run(main())
    aeng.call(lambda e: e.check_integrity())
    assert aeng.call(lambda e: e.block_pool.num_used) > 0  # "x" still holds its KV
    aeng.call(check_references)


def test_shutdown_releases_every_session(moe_dir):
    eng = LLMEngine(EngineConfig(model=str(moe_dir), seed=0, enable_return_routed_experts=True))
    aeng = AsyncEngine(eng)
    sessions = AsyncSessions(aeng)

    async def main():
        for sid in ("a", "b"):
            await sessions.open(sid, GREEDY)
            await run_step(sessions, sid, tokens(94, 40))
            await sessions.checkpoint(sid)
        await sessions.fork("a")
        stream = sessions.step("b", [3], max_tokens=200)  # in flight at the shutdown
        first = await stream.__anext__()
        assert isinstance(first, StepDelta)
        aeng.shutdown()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    asyncio.run(main())
    assert not aeng.is_healthy
    eng.check_integrity()
    assert eng.kv_holds.num_holders == 0 and eng.block_pool.num_used == 0


def test_bad_calls_are_refused_with_codes(served):
    aeng, sessions, eng = served

    async def main():
        with pytest.raises(SessionEventError) as ei:
            await sessions.open("bad id!")
        assert ei.value.code == "invalid"
        await sessions.open("ok", GREEDY)
        with pytest.raises(SessionEventError) as ei:
            async for _ in sessions.step("ok"):  # nothing to step from
                pass
        assert ei.value.code == "invalid"
        with pytest.raises(SessionEventError) as ei:
            await sessions.rollback("ok", 5)
        assert ei.value.code == "invalid"
        await sessions.close("ok")
        with pytest.raises(SessionEventError) as ei:
            async for _ in sessions.step("ok", [1]):
                pass
        assert ei.value.code == "closed"

    asyncio.run(main())


def test_text_on_a_model_without_tokenizer_is_refused_as_invalid(moe_dir_other_weights):
    aeng = AsyncEngine(LLMEngine(EngineConfig(model=str(moe_dir_other_weights), seed=0)))
    sessions = AsyncSessions(aeng)

    async def main():
        await sessions.open("t")
        for call in (lambda: sessions.submit_event("t", 1, "input", {"text": "hi"}),
                     lambda: sessions.step("t", "hi").__anext__()):
            with pytest.raises(SessionEventError) as ei:
                await call()
            assert ei.value.code == "invalid" and "no tokenizer" in ei.value.message

    try:
        asyncio.run(main())
    finally:
        aeng.shutdown()
