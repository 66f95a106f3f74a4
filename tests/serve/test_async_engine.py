"""AsyncEngine: one engine thread, outputs streamed into asyncio, aborts, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from serve_helpers import engine_config, wait_idle

from execstate import SamplingParams
from execstate.engine.async_engine import AsyncEngine, EngineDeadError
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
PROMPT = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]


@pytest.fixture
def aengine(model_dir):
    eng = AsyncEngine(LLMEngine(engine_config(model_dir)))
    yield eng
    eng.shutdown()


async def collect(eng: AsyncEngine, prompt, params, rid: str):
    return [out async for out in eng.generate(prompt, params, rid)]


def test_generate_streams_cumulative_outputs_equal_to_offline(aengine, offline):
    outs = asyncio.run(collect(aengine, PROMPT, GREEDY, "a"))
    ref = offline.generate({"prompt_token_ids": PROMPT}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert [len(o.outputs[0].token_ids) for o in outs] == list(range(1, 11))
    assert [o.finished for o in outs] == [False] * 9 + [True]
    final = outs[-1].outputs[0]
    assert final.token_ids == ref.token_ids and final.finish_reason == "length"
    assert np.array_equal(final.routed_experts, ref.routed_experts)
    assert wait_idle(aengine) == (0, 0, 0)


def test_concurrent_requests_on_one_loop(aengine, offline):
    async def main():
        return await asyncio.gather(*(collect(aengine, PROMPT[: 6 + i], GREEDY, f"r{i}") for i in range(4)))

    results = asyncio.run(main())
    for i, outs in enumerate(results):
        ref = offline.generate({"prompt_token_ids": PROMPT[: 6 + i]}, GREEDY, use_tqdm=False)[0]
        assert outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids


def test_add_error_raises_in_caller_and_engine_keeps_serving(aengine):
    async def main():
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await collect(aengine, [1, 100000], GREEDY, "bad")
        with pytest.raises(ValueError, match="too long"):
            await collect(aengine, [3] * 300, GREEDY, "long")
        return await collect(aengine, PROMPT, GREEDY, "good")

    outs = asyncio.run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 10
    assert aengine.is_healthy


def test_closing_the_consumer_aborts_and_frees_blocks(aengine):
    aborted: list[str] = []

    def spy(e: LLMEngine) -> None:
        real = e.abort_request
        e.abort_request = lambda rid: (aborted.append(rid), real(rid))[1]

    aengine.call(spy)

    async def main():
        gen = aengine.generate(PROMPT, LONG, "drop")
        async for out in gen:
            if len(out.outputs[0].token_ids) == 3:
                break
        await gen.aclose()
        await aengine.run_on_engine(lambda e: None)  # FIFO: the abort has run

    asyncio.run(main())
    assert aborted == ["drop"]
    assert wait_idle(aengine) == (0, 0, 0)


def test_cancelled_task_aborts(aengine):
    async def main():
        task = asyncio.create_task(collect(aengine, PROMPT, LONG, "cancel-me"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_idle(aengine) == (0, 0, 0)


def test_abort_from_outside_finishes_the_stream(aengine):
    async def main():
        outs = []
        async for out in aengine.generate(PROMPT, LONG, "victim"):
            outs.append(out)
            if len(outs) == 2:
                await aengine.abort("victim")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert len(outs[-1].outputs[0].token_ids) < 200
    assert wait_idle(aengine) == (0, 0, 0)


def test_run_on_engine_runs_on_the_engine_thread(aengine):
    async def main():
        name = await aengine.run_on_engine(lambda e: threading.current_thread().name)
        blocks = await aengine.run_on_engine(lambda e: e.block_pool.num_blocks)
        with pytest.raises(ZeroDivisionError):
            await aengine.run_on_engine(lambda e: 1 / 0)
        return name, blocks

    name, blocks = asyncio.run(main())
    assert name == "execstate-engine" and blocks > 0
    assert aengine.is_healthy


def _thread_cpu_s(native_id: int) -> float:
    """CPU seconds (user + system) of one thread of this process, from /proc."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_engine_does_not_spin(aengine):
    aengine.call(lambda e: None)
    # Only the engine thread is measured: other threads of the test process (left by
    # other tests) must not make this flaky.
    tid = aengine._thread.native_id
    cpu0 = _thread_cpu_s(tid)
    time.sleep(0.5)
    assert _thread_cpu_s(tid) - cpu0 < 0.05


def test_crash_fails_pending_requests_and_health(aengine):
    def boom() -> list:
        raise RuntimeError("boom in step")

    async def main():
        gen = aengine.generate(PROMPT, LONG, "doomed")
        first = await gen.__anext__()
        await aengine.run_on_engine(lambda e: setattr(e, "step", boom))
        with pytest.raises(EngineDeadError, match="boom in step"):
            async for _ in gen:
                pass
        return first

    assert asyncio.run(main()).request_id == "doomed"
    assert not aengine.is_healthy and isinstance(aengine.error.__cause__, RuntimeError)
    with pytest.raises(EngineDeadError):
        asyncio.run(collect(aengine, PROMPT, GREEDY, "after"))
    with pytest.raises(EngineDeadError):
        aengine.call(lambda e: None)
    client = TestClient(build_app(aengine, "m"))
    r = client.get("/health")
    assert r.status_code == 503 and "boom in step" in r.json()["error"]
    r = client.post("/v1/completions", json={"model": "m", "prompt": [5, 6]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    assert "execstate_engine_healthy 0.0" in client.get("/metrics").text


def test_shutdown_fails_pending_requests(model_dir):
    eng = AsyncEngine(LLMEngine(engine_config(model_dir)))

    async def main():
        gen = eng.generate(PROMPT, LONG, "pending")
        await gen.__anext__()
        threading.Thread(target=eng.shutdown).start()
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in gen:
                pass

    asyncio.run(main())
    assert not eng.is_healthy
    assert eng._engine.block_pool.num_used == 0  # aborted on the way out (thread is gone: safe to read)
    eng.shutdown()  # idempotent


def test_crash_mid_stream_sends_an_error_event(model_dir):
    eng = AsyncEngine(LLMEngine(engine_config(model_dir)))
    client = TestClient(build_app(eng, "m"))
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    try:
        with client.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"text_completion"' in first
            eng.call(lambda e: setattr(e, "step", lambda: 1 / 0))
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][len("data: "):])["error"]
        assert err["code"] == "engine_dead" and "ZeroDivisionError" in err["message"]
        assert client.get("/health").status_code == 503
    finally:
        eng.shutdown()
