"""``/v1/realtime``'s chat turns: ``response.create`` with ``input: {"messages": [...]}`` applies
the model's chat template one turn at a time (``session/lm/chat.py``); after each turn the
session's context (``session.get``) is token for token the one-shot ``LLM.chat`` over the whole
conversation (prompt and reply), on the same weights offline. Over HTTP, ``messages`` in a step's
body does the same."""

from __future__ import annotations

import asyncio

import httpx
from realtime_helpers import client, open_session

from execstate import SamplingParams

TURNS = ["Hello", "what is the weather like", "and tomorrow?"]


def test_chat_turns_over_the_socket_match_a_one_shot_chat(served, offline):
    tok = offline.engine.tokenizer
    q = tok.token_to_id("q")  # "qq" is no merge: a reply of q's is its text's tokens
    params = SamplingParams(temperature=0.0, max_tokens=3, logit_bias={q: 100.0})

    async def run() -> None:
        async with client(served.url) as c:
            await open_session(c, sampling={"temperature": 0.0, "logit_bias": {str(q): 100.0}}, max_tokens=3)
            history: list[dict[str, str]] = []
            for text in TURNS:
                turn = [{"role": "user", "content": text}]
                _, _, done = await c.respond(input={"messages": turn})
                history += turn
                one_shot = offline.chat(history, params, use_tqdm=False)[0]
                info = await c.ask({"type": "session.get"})
                assert info["token_ids"] == list(one_shot.prompt_token_ids) + list(one_shot.outputs[0].token_ids)
                assert done["response"]["token_ids"] == list(one_shot.outputs[0].token_ids)
                history.append({"role": "assistant", "content": tok.decode(done["response"]["token_ids"])})
            bad = await c.ask({"type": "response.create", "event_id": "b", "input": {"messages": [{"role": "x"}]}})
            assert bad["type"] == "error" and bad["error"]["code"] == "invalid" and bad["event_id"] == "b", bad
            await c.ask({"type": "session.close"})

    asyncio.run(run())


def test_chat_turn_over_http(served, offline):
    q = offline.engine.tokenizer.token_to_id("q")
    params = SamplingParams(temperature=0.0, max_tokens=2, logit_bias={q: 100.0})
    with httpx.Client(base_url=served.url, timeout=60) as h:
        sid = h.post("/v1/sessions", json={"sampling": {"temperature": 0.0, "max_tokens": 2,
                                                        "logit_bias": {str(q): 100.0}}}).json()["session_id"]
        turn = [{"role": "user", "content": "Hello"}]
        r = h.post(f"/v1/sessions/{sid}/step", json={"messages": turn})
        assert r.status_code == 200, r.text
        one_shot = offline.chat(turn, params, use_tqdm=False)[0]
        got = h.get(f"/v1/sessions/{sid}").json()["token_ids"]
        assert got == list(one_shot.prompt_token_ids) + list(one_shot.outputs[0].token_ids)
        both = h.post(f"/v1/sessions/{sid}/step", json={"messages": turn, "input": "x"})
        assert both.status_code == 400
        h.delete(f"/v1/sessions/{sid}")
