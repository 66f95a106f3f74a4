"""Careless requests get a 4xx that names the problem, before any template runs:

- a step on an expired session answers 410 with ``type: invalid_request_error`` (it was
  ``server_error``: the client's session expired, the server did nothing wrong);
- a ``tool`` message without ``tool_call_id``, a message with an unknown role, and ``null``
  content (except an assistant message that carries ``tool_calls``, as OpenAI allows) are refused
  with 400 naming ``messages[i]``, on ``/v1/chat/completions`` and on ``/tokenize``; before, they
  went to the chat template as they were.
"""

from __future__ import annotations

import time

import pytest
from security_helpers import code_of, http, server

from execstate.serve.app import serve_policy

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
BAD = [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}], 1, "tool_call_id"),
    ([{"role": "wizard", "content": "hi"}], 0, "role"),
    ([{"role": "user", "content": None}], 0, "content"),
    ([{"role": "system", "content": None}, {"role": "user", "content": "hi"}], 0, "content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], 1, "content"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42", "tool_call_id": 7}], 1, "tool_call_id"),
]
GOOD = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "content": "42", "tool_call_id": "call_1"}],
    [{"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
]


@pytest.fixture(scope="module")
def served(model_dir):
    with server(model_dir) as s:
        yield s


@pytest.mark.parametrize(("messages", "index", "field"), BAD)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_malformed_messages_are_400_naming_the_message(served, path, messages, index, field):
    r = http("POST", served.url + path, body={"model": "m", "messages": messages, "max_tokens": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "messages", err
    assert f"messages[{index}]" in err["message"] and field in err["message"], err["message"]
    assert "template" not in err["message"], err["message"]


@pytest.mark.parametrize("messages", GOOD)
def test_well_formed_messages_still_run(served, messages):
    r = http("POST", served.url + "/v1/chat/completions", body={"model": "m", "messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_an_expired_session_is_an_invalid_request_not_a_server_error(model_dir):
    with server(model_dir, policy=serve_policy(idle_ttl_s=0.5)) as s:
        assert http("POST", f"{s.url}/v1/sessions", body={"session_id": "old"}).status_code == 200
        time.sleep(1.2)
        r = http("POST", f"{s.url}/v1/sessions/old/step", body={"input": [5, 6], "max_tokens": 1})
        assert (r.status_code, code_of(r)) == (410, "expired"), r.text
        assert r.json()["error"]["type"] == "invalid_request_error", r.text


def test_an_empty_cache_salt_is_refused_on_every_surface(model_dir):
    """Found by the schema fuzzer: ``POST /v1/sessions`` with ``cache_salt: ""`` reached the
    engine thread and failed there (500); the session layer checks the salt as the request APIs do."""
    with server(model_dir) as s:
        for salt in ("", "x" * 10_000):
            r = http("POST", f"{s.url}/v1/sessions", body={"session_id": "salted", "cache_salt": salt})
            assert (r.status_code, code_of(r)) == (400, "invalid"), r.text
        assert http("POST", f"{s.url}/v1/sessions", body={"session_id": "salted", "cache_salt": "t1"}
                    ).status_code == 200
