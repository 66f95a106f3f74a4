"""The HTTP session API once bypassed WebSocket ownership.

Reproduces: while client 1 holds a session attached to ``/v1/realtime``, client 2 with the same
API key could ``GET /v1/sessions/{id}`` (the whole context's ``token_ids``), ``POST .../step``,
``POST .../events`` (the event then appeared in client 1's next response) and ``DELETE`` it
(client 1's session closed). Before the fix every one of those answered 200. Now each answers
``409 session_in_use``, reads included, and client 1's session is untouched; once client 1 closes
its session, the HTTP API sees it again (``closed``).
"""

from __future__ import annotations

from security_helpers import KEY_A, code_of, http, server, ws

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def test_http_cannot_read_or_drive_a_session_a_live_connection_holds(model_dir):
    with server(model_dir, api_key=KEY_A) as s, ws(s.url, KEY_A) as c1:
        created = c1.ask({"type": "session.create", "event_id": "c", "session": {
            "id": "held-1", "sampling": {"temperature": 0}, "max_tokens": 3}})
        assert created["type"] == "session.created"
        first = c1.respond(input={"token_ids": PROMPT})
        assert first["type"] == "response.done" and first["response"]["status"] == "completed"
        base = f"{s.url}/v1/sessions/held-1"
        calls = [
            ("GET", base, None),
            ("GET", base + "?routes=true", None),
            ("POST", base + "/step", {"input": [40, 41]}),
            ("POST", base + "/events", {"event_id": 9, "kind": "input", "data": {"token_ids": [42]}}),
            ("DELETE", base, None),
        ]
        for method, url, body in calls:
            r = http(method, url, KEY_A, body)
            assert (r.status_code, code_of(r)) == (409, "session_in_use"), (method, url, r.text)
            assert "token_ids" not in r.text
        info = c1.ask({"type": "session.get", "event_id": "g"})  # nothing changed it, nothing was queued
        assert info["type"] == "session.info" and info["session"]["status"] == "open"
        assert info["session"]["step_index"] == 1 and info["session"]["num_pending_events"] == 0
        assert info["token_ids"][: len(PROMPT)] == PROMPT and len(info["token_ids"]) == len(PROMPT) + 3
        second = c1.respond(input={"token_ids": [13]})
        assert second["response"]["status"] == "completed" and second["response"]["events"]["started"] == [1]
        assert c1.ask({"type": "session.close", "event_id": "x"})["type"] == "session.closed"
        r = http("GET", base, KEY_A)
        assert r.status_code == 200 and r.json()["status"] == "closed"
