"""The realtime WebSocket against a real uvicorn with the ``websockets`` client: a session's
steps, events, checkpoints, rollback and fork give exactly what the offline Session gives; a
cancel mid-stream ends in exactly one ``response.done``; every step ends with nothing leaked."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from realtime_helpers import client, decode_routes, open_session, slow_steps, wait_released

from execstate import SamplingParams

A = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10, 11, 12, 13]
B = [21, 22, 23, 24, 25, 26]
C = [40, 41, 42]


def joined(deltas):
    return [t for d in deltas for t in d["token_ids"]], "".join(d["text"] for d in deltas)


def same_step(done: dict, ref) -> None:
    """A response.done equals the offline StepResult ``ref`` (tokens, text, metadata, routes)."""
    r = done["response"]
    assert r["status"] == "completed" and r["error"] is None
    assert (r["step_index"], r["token_ids"], r["text"], r["finish_reason"]) == (
        ref.step_index, ref.token_ids, ref.text, ref.finish_reason)
    assert r["events"] == ref.events
    assert (r["num_computed_tokens"], r["num_cached_tokens"]) == (ref.num_computed_tokens, ref.num_cached_tokens)
    if "routed_experts" in r:
        assert decode_routes(r["routed_experts"]).tobytes() == ref.routed_experts.tobytes()


def test_steps_and_events_equal_the_offline_session(served, offline):
    """create -> submit -> response.create -> deltas -> done, three times, greedy; routes as .npy."""
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with offline.open_session(sampling_params=params) as s:
        ref = [s.step(A)]
        s.submit_event(event_id=5, kind="input", data={"text": "hello there"})
        s.submit_event(event_id=6, kind="sampling", data={"logit_bias": {7: 5.0}})
        ref.append(s.step(max_tokens=4))
        ref.append(s.step("and more"))
        ref_ids, ref_routes = s.token_ids, s.routed_experts

    async def main():
        async with client(served.url) as c:
            info = await open_session(c, id="greedy-1", sampling={"temperature": 0, "ignore_eos": True},
                                      max_tokens=6, return_routes=True)
            assert (info["session_id"], info["step_index"], info["status"], info["return_routes"]) == (
                "greedy-1", 0, "open", True)
            created, deltas, done = await c.respond(event_id="r1", input={"token_ids": A})
            assert created["event_id"] == "r1" and created["response"]["step_index"] == 1
            assert done["event_id"] == "r1" and done["response"]["id"] == created["response"]["id"]
            assert {d["response_id"] for d in deltas} == {created["response"]["id"]}
            assert joined(deltas) == (done["response"]["token_ids"], done["response"]["text"])
            same_step(done, ref[0])
            ack = await c.ask({"type": "event.submit", "event_id": 5, "kind": "input", "data": {"text": "hello there"}})
            assert ack == {"type": "event.accepted", "event_id": 5, "kind": "input", "status": "accepted",
                           "duplicate": False}
            ack = await c.ask({"type": "event.submit", "event_id": 6, "kind": "sampling",
                               "data": {"logit_bias": {"7": 5.0}}})  # JSON keys are strings
            assert ack["type"] == "event.accepted"
            _, deltas, done = await c.respond(event_id="r2", max_tokens=4)
            same_step(done, ref[1])
            assert done["response"]["events"]["started"] == [5, 6]
            _, deltas, done = await c.respond(event_id="r3", input={"text": "and more"})
            same_step(done, ref[2])
            assert joined(deltas)[0] == ref[2].token_ids
            got = await c.ask({"type": "session.get", "event_id": "g"})
            assert got["type"] == "session.info" and got["token_ids"] == ref_ids
            assert decode_routes(got["routed_experts"]).tobytes() == ref_routes.tobytes()
            assert got["session"]["step_index"] == 3 and got["session"]["last_event_id"] == 7
            closed = await c.ask({"type": "session.close", "event_id": "bye"})
            assert closed == {"type": "session.closed", "event_id": "bye", "session_id": "greedy-1"}

    asyncio.run(main())
    wait_released(served.sessions)


def test_seeded_sampling_equals_the_offline_session(served, offline):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=8, ignore_eos=True)
    with offline.open_session(sampling_params=params) as s:
        ref = [s.step(B), s.step(C), s.step(None, max_tokens=5)]

    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0.9, "top_p": 0.95, "seed": 1234, "ignore_eos": True},
                               max_tokens=8)
            outs = [await c.respond(input={"token_ids": B}), await c.respond(input={"token_ids": C}),
                    await c.respond(max_tokens=5)]
            for (_, _, done), r in zip(outs, ref, strict=True):
                same_step(done, r)
                assert "routed_experts" not in done["response"]  # not asked
            # asked per response: the next step's rows
            _, _, done = await c.respond(max_tokens=2, return_routes=True)
            assert decode_routes(done["response"]["routed_experts"]).shape[1:] == ref[0].routed_experts.shape[1:]

    asyncio.run(main())
    wait_released(served.sessions)


def test_checkpoint_rollback_and_fork_reproduce_the_offline_session(served, offline):
    """Sampling (seeded): rollback re-runs the same tokens (the RNG state is in the checkpoint); the
    fork, driven from a second connection, equals the offline fork."""
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=6, ignore_eos=True)
    with offline.open_session(sampling_params=params) as s:
        s.step(A)
        cp = s.checkpoint()
        after = s.step(B)
        s.rollback(cp)
        again = s.step(B)
        f = s.fork(cp)
        fork_step = f.step(C)
        fork_ids = f.token_ids
        f.close()
    assert again.token_ids == after.token_ids

    async def main():
        async with client(served.url) as c, client(served.url) as c2:
            await open_session(c, id="main-1", sampling={"temperature": 0.8, "seed": 7, "ignore_eos": True},
                               max_tokens=6, return_routes=True)
            await c.respond(input={"token_ids": A})
            ack = await c.ask({"type": "session.checkpoint", "event_id": 1})
            assert (ack["type"], ack["event_id"], ack["checkpoint_id"]) == ("session.checkpointed", 1, "cp-1")
            assert ack["session"]["step_index"] == 1 and ack["session"]["num_checkpoints"] == 1
            assert "checkpoints" not in ack["session"]  # a reply names what changed, not every checkpoint
            _, _, done = await c.respond(input={"token_ids": B})
            same_step(done, after)
            ack = await c.ask({"type": "session.rollback", "event_id": 2, "checkpoint_id": "cp-1"})
            assert ack["type"] == "session.rolled_back" and ack["session"]["step_index"] == 1
            _, _, done = await c.respond(input={"token_ids": B})
            same_step(done, again)
            ack = await c.ask({"type": "session.fork", "event_id": 3, "checkpoint_id": "cp-1", "session_id": "fork-1"})
            assert ack["type"] == "session.forked" and ack["parent_session_id"] == "main-1"
            assert (ack["session"]["session_id"], ack["session"]["step_index"]) == ("fork-1", 1)
            # the main session is attached to c: not resumable elsewhere; the fork is
            err = await c2.ask({"type": "session.resume", "event_id": "x", "session_id": "main-1"})
            assert (err["type"], err["event_id"], err["error"]["code"]) == ("error", "x", "session_in_use")
            ack = await c2.ask({"type": "session.resume", "event_id": "y", "session_id": "fork-1"})
            assert ack["type"] == "session.resumed" and ack["session"]["return_routes"] is True
            _, _, done = await c2.respond(input={"token_ids": C})
            same_step(done, fork_step)
            got = await c2.ask({"type": "session.get"})
            assert got["token_ids"] == fork_ids
            ack = await c.ask({"type": "checkpoint.release", "event_id": 4, "checkpoint_id": "cp-1"})
            assert ack == {"type": "checkpoint.released", "event_id": 4, "checkpoint_id": "cp-1"}
            err = await c.ask({"type": "session.rollback", "event_id": 5, "checkpoint_id": "cp-1"})
            assert (err["event_id"], err["error"]["code"]) == (5, "not_found")
        # both connections ended: both sessions closed (grace 0)

    asyncio.run(main())
    wait_released(served.sessions)


def test_cancel_mid_stream_gives_one_done_and_no_delta_after_it(served):
    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0, "ignore_eos": True}, max_tokens=200)
            created = await c.ask({"type": "response.create", "event_id": "long", "input": {"token_ids": A}})
            assert created["type"] == "response.created"
            first = await c.recv()
            assert first["type"] == "response.delta"
            await c.send({"type": "response.cancel", "event_id": "stop"})
            deltas, done = await c.until_done()
            deltas = [first, *deltas]
            r = done["response"]
            assert (done["event_id"], r["status"], r["finish_reason"], r["error"]) == (
                "long",
                "cancelled",
                "abort",
                None,
            )
            assert 0 < len(r["token_ids"]) < 200
            assert joined(deltas) == (r["token_ids"], r["text"])
            # nothing of that response after its done: the next event answers the next message
            got = await c.ask({"type": "session.get", "event_id": "after"})
            assert (got["type"], got["event_id"]) == ("session.info", "after")
            assert got["token_ids"] == A + r["token_ids"]  # the context keeps what was generated
            err = await c.ask({"type": "response.cancel", "event_id": "late"})
            assert (err["type"], err["event_id"], err["error"]["code"]) == ("error", "late", "no_response")
            _, _, done = await c.respond(max_tokens=3)
            assert done["response"]["status"] == "completed" and done["response"]["step_index"] == 2

    with slow_steps(served.engine):
        asyncio.run(main())
    wait_released(served.sessions)


def test_messages_mid_step_events_apply_at_the_next_step(served):
    """While a response streams: event.submit is accepted (applied at the next step), session.get
    answers, the rest gets response_in_progress; session.close cancels the response first."""

    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0, "ignore_eos": True}, max_tokens=100)
            await c.ask({"type": "response.create", "event_id": "r", "input": {"token_ids": A}})
            for msg in ({"type": "event.submit", "event_id": 10, "kind": "input", "data": {"token_ids": B}},
                        {"type": "response.create", "event_id": "again"},
                        {"type": "session.checkpoint", "event_id": "cp"},
                        {"type": "session.fork", "event_id": "fk"},
                        {"type": "session.get", "event_id": "get"}):
                await c.send(msg)
            answers = {}
            while len(answers) < 5:
                event = await c.recv()
                if event["type"] != "response.delta":
                    assert event["type"] != "response.done", "the step ended before the test could act"
                    answers[event["event_id"]] = event
            assert answers[10]["type"] == "event.accepted"
            for eid in ("again", "cp", "fk"):
                assert (answers[eid]["type"], answers[eid]["error"]["code"]) == ("error", "response_in_progress")
            assert answers["get"]["session"]["stepping"] is True
            await c.send({"type": "response.cancel"})
            _, done = await c.until_done()
            assert done["response"]["events"]["started"] == [0]
            _, _, done = await c.respond(max_tokens=2)
            assert done["response"]["events"]["started"] == [10]
            # close while streaming: the response ends (cancelled), then session.closed
            await c.ask({"type": "response.create", "event_id": "r3", "max_tokens": 100})
            await c.send({"type": "session.close", "event_id": "end"})
            _, done = await c.until_done()
            assert (done["event_id"], done["response"]["status"]) == ("r3", "cancelled")
            assert (await c.recv())["type"] == "session.closed"

    with slow_steps(served.engine):
        asyncio.run(main())
    wait_released(served.sessions)


def test_failed_step_then_reset(served, offline):
    """A failing engine step: response.done ``failed``; the session is FAILED (steps refused with
    ``failed``) until session.reset, after which it steps as the offline session does."""
    from realtime_helpers import fail_session_step

    with offline.open_session(sampling_params=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)) as s:
        s.step(A)
        s.checkpoint()
        ref = s.step(C)

    async def main():
        async with client(served.url) as c:
            await open_session(c, id="fails", sampling={"temperature": 0, "ignore_eos": True}, max_tokens=4)
            await c.respond(input={"token_ids": A})
            await c.ask({"type": "session.checkpoint"})
            with fail_session_step(served.engine, "fails"):
                _, _, done = await c.respond(event_id="bad", input={"token_ids": B})
            r = done["response"]
            assert (done["event_id"], r["status"], r["error"]["code"]) == ("bad", "failed", "failed")
            err = await c.ask({"type": "response.create", "event_id": "no"})
            assert (err["event_id"], err["error"]["code"]) == ("no", "failed")
            ack = await c.ask({"type": "session.reset", "event_id": "reset"})
            assert ack["type"] == "session.reset_done" and ack["session"]["status"] == "open"
            _, _, done = await c.respond(input={"token_ids": C})
            same_step(done, ref)

    asyncio.run(main())
    wait_released(served.sessions)


@pytest.mark.parametrize("mid_stream", [False, True])
def test_disconnect_releases_everything(served, mid_stream):
    """Closing the socket closes the connection's sessions (and its forks): blocks back to 0."""

    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0, "ignore_eos": True}, max_tokens=100 if mid_stream else 4)
            if not mid_stream:
                await c.respond(input={"token_ids": A})
                await c.ask({"type": "session.checkpoint"})
                fork = await c.ask({"type": "session.fork"})
                assert fork["type"] == "session.forked"
                await c.respond(input={"token_ids": B})
            else:
                await c.ask({"type": "response.create", "input": {"token_ids": A}})
                assert (await c.recv())["type"] == "response.delta"
            in_use = served.engine.call(lambda e: e.block_pool.num_used)
            assert in_use > 0
        # the client went away without session.close

    with slow_steps(served.engine):
        asyncio.run(main())
    wait_released(served.sessions)
    assert served.app.state.realtime.owners.num_sessions == 0


def test_routes_are_the_session_rows(served, offline):
    """session.get's routed_experts are the whole context's rows, equal to a one-shot generate's."""

    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0, "ignore_eos": True}, max_tokens=5, return_routes=True)
            await c.respond(input={"token_ids": A})
            _, _, done = await c.respond(input={"token_ids": B})
            got = await c.ask({"type": "session.get"})
            return done, got

    done, got = asyncio.run(main())
    wait_released(served.sessions)
    whole = offline.generate({"prompt_token_ids": got["token_ids"][:-1]},
                             SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)[0]
    rows = decode_routes(got["routed_experts"])
    assert rows.dtype == np.int16 and rows.shape[0] == len(got["token_ids"]) - 1
    assert rows.tobytes() == whole.outputs[0].routed_experts.tobytes()
    step_rows = decode_routes(done["response"]["routed_experts"])
    assert step_rows.tobytes() == rows[len(A) + 5 - 1:].tobytes()


def test_health_answers_while_realtime_text_is_tokenised(served):
    """Text events are tokenised in worker threads: /health keeps answering while a client sends
    frames of (almost) the largest size, each a text input of about a million characters."""
    import statistics
    import threading
    import time

    import httpx

    from execstate.serve.realtime.limits import MAX_MESSAGE_BYTES

    text = ("the quick brown fox jumps over a lazy dog " * (MAX_MESSAGE_BYTES // 42))[: MAX_MESSAGE_BYTES - 200]
    answers: list[dict] = []

    async def send_all():
        async with client(served.url) as c:
            await open_session(c)
            for i in range(4):
                answers.append(await c.ask({"type": "event.submit", "event_id": i, "kind": "input",
                                            "data": {"text": text}}))

    sender = threading.Thread(target=lambda: asyncio.run(send_all()))
    latencies = []
    with httpx.Client(base_url=served.url, timeout=30) as probe:
        assert probe.get("/health").status_code == 200
        sender.start()
        time.sleep(0.2)
        while sender.is_alive():
            t0 = time.monotonic()
            assert probe.get("/health").status_code == 200
            latencies.append(time.monotonic() - t0)
            time.sleep(0.02)
    sender.join()
    assert [(a["event_id"], a["error"]["code"]) for a in answers] == [(i, "invalid") for i in range(4)]
    assert "max_model_len" in answers[0]["error"]["message"]  # tokenised: far too many tokens
    assert len(latencies) >= 5
    print(f"/health during realtime tokenisation: {len(latencies)} probes, p50 "
          f"{statistics.median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms")
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0
    wait_released(served.sessions)
