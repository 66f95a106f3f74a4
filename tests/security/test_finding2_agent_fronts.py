"""Agent fronts were once exposed as plain LM sessions.

Reproduces: ``GET /v1/sessions/<agent session id>`` returned the agent's conversation (its token
ids, what the user said included), and ``session.resume`` of that id on ``/v1/realtime``
succeeded, after which its ``session.close`` broke the agent. Before the fix the GET answered 200
and the resume ``session.resumed``. Now an agent's front lives in the agents' realm: the session
API and ``/v1/realtime`` answer ``not_found`` for its id, and the agent keeps working.
"""

from __future__ import annotations

from typing import Any

from security_helpers import KEY_A, WS, code_of, http, server, ws

TURN = {"end_of_turn_silence_s": 0.05, "resume_after_s": 0.05}


def until(c: WS, kind: str) -> dict[str, Any]:
    while (event := c.recv())["type"] != kind:
        pass
    return event


def test_an_agents_front_is_not_a_session_of_the_session_api(model_dir):
    with server(model_dir, api_key=KEY_A) as s, ws(s.url, KEY_A, "/v1/realtime/agent") as agent:
        created = agent.ask({"type": "session.create", "event_id": "a", "session": {
            "turn": TURN, "max_response_tokens": 4}})
        assert created["type"] == "session.created", created
        sid = created["session"]["id"]
        agent.send({"type": "input_text.append", "text": "my secret plan is"})
        until(agent, "response.done")
        r = http("GET", f"{s.url}/v1/sessions/{sid}", KEY_A)
        assert (r.status_code, code_of(r)) == (404, "not_found"), r.text
        for method, suffix, body in (("POST", "/step", {"input": [5]}), ("DELETE", "", None)):
            r = http(method, f"{s.url}/v1/sessions/{sid}{suffix}", KEY_A, body)
            assert (r.status_code, code_of(r)) == (404, "not_found"), r.text
        with ws(s.url, KEY_A) as rt:
            err = rt.ask({"type": "session.resume", "event_id": "r", "session_id": sid})
            assert (err["type"], err["error"]["code"]) == ("error", "not_found"), err
            err = rt.ask({"type": "session.close", "event_id": "x"})  # nothing attached: nothing to close
            assert err["type"] == "error"
        agent.send({"type": "input_text.append", "text": "and then"})  # the agent is unharmed
        done = until(agent, "response.done")
        assert done["response"]["status"] in ("completed", "cancelled", "incomplete"), done
