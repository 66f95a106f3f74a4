"""Structured outputs over HTTP with the ``openai`` client: ``response_format``, vLLM's
``structured_outputs``, every output validated (``jsonschema``; hypothesis draws the schemas),
and the bounds: a bad or too large constraint is a 400 before the engine, a slow compile too."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import MODEL_NAME, wait_idle

from execstate.engine.grammar.bounds import GrammarBounds

MESSAGES = [{"role": "user", "content": "describe a thing"}]


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _leaf() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-50, 50), st.integers(0, 100)),
        st.just({"type": "boolean"}),
        st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=4, unique=True).map(
            lambda v: {"enum": v}),
        st.integers(1, 6).map(lambda n: {"type": "string", "pattern": f"^[a-z]{{1,{n}}}$"}),
        st.just({"type": "null"}),
    )


def _schemas() -> st.SearchStrategy[dict]:
    def obj(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
        return st.one_of(
            st.dictionaries(st.text("abcdef", min_size=1, max_size=3), children, min_size=1, max_size=3).map(
                lambda props: {"type": "object", "properties": props, "required": sorted(props),
                               "additionalProperties": False}),
            children.map(lambda item: {"type": "array", "items": item, "maxItems": 3}),
        )
    return st.recursive(_leaf(), obj, max_leaves=6).filter(lambda s: s.get("type") in ("object", "array"))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas(), seed=st.integers(0, 1000))
def test_every_output_validates_against_its_generated_schema(client, schema, seed):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=220,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    jsonschema.validate(json.loads(c.message.content), schema)


def test_structured_outputs_kinds_on_completions(client):
    def create(so: dict, **kw) -> str:
        r = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=60, temperature=1.0, seed=3,
                                      extra_body={"structured_outputs": so}, **kw)
        return r.choices[0].text

    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", create({"regex": r"[0-9]{3}-[a-z]{2}"}))
    assert create({"choice": ["left", "right"]}) in ("left", "right")
    assert create({"grammar": 'root ::= "go " ("north" | "south")'}) in ("go north", "go south")
    assert isinstance(json.loads(create({"json": {"type": "object", "properties": {"a": {"type": "boolean"}},
                                                  "required": ["a"], "additionalProperties": False}})), dict)
    # streamed: the deltas concatenate to a valid output too
    chunks = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=60, temperature=1.0, seed=4,
                                       stream=True, extra_body={"structured_outputs": {"regex": "(ab|cd){2,4}!"}})
    assert re.fullmatch(r"(ab|cd){2,4}!", "".join(ch.choices[0].text for ch in chunks if ch.choices))


def test_json_object_and_non_strict_schema(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=200, temperature=1.0, seed=1,
                                       response_format={"type": "json_object"})
    c = r.choices[0]
    assert c.message.content.startswith("{")
    assert c.finish_reason == "length" or isinstance(json.loads(c.message.content), dict)
    # without strict, keywords the engine does not implement are ignored instead of refused
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["a"], "additionalProperties": False, "dependentSchemas": {"a": {}}}
    body = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=50, response_format=body)
    assert json.loads(r.choices[0].message.content)["a"] in range(10)
    body["json_schema"]["strict"] = True
    with pytest.raises(openai.BadRequestError, match="dependentSchemas"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=50, response_format=body)


def test_slow_compile_is_a_400_and_unconstrained_requests_go_on(served, client, monkeypatch):
    compiler = served.engine.grammar
    original = compiler.compile

    def slow(spec):  # a compile that takes longer than the bound
        time.sleep(0.5)
        return original(spec)

    monkeypatch.setattr(compiler, "bounds", GrammarBounds(compile_timeout_s=0.1))
    monkeypatch.setattr(compiler, "compile", slow)
    t0 = time.perf_counter()
    with pytest.raises(openai.BadRequestError, match="took longer than 0.1 s"):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=5,
                                  extra_body={"structured_outputs": {"regex": "[a-z]{7}q"}})
    assert time.perf_counter() - t0 < 0.45  # answered at the timeout, not when the compile ended
    monkeypatch.undo()
    # schema bombs refused while a stream goes on: its tokens keep coming
    gaps: list[float] = []

    def stream() -> None:
        last = time.perf_counter()
        for _ in client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=40, stream=True,
                                           extra_body={"ignore_eos": True}):
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=stream)
    t.start()
    def nested(levels: int) -> dict:
        deep: dict = {"type": "object"}
        cur = deep
        for _ in range(levels):
            cur["properties"] = {"a": {"type": "object"}}
            cur = cur["properties"]["a"]
        return deep

    deep = nested(20)  # 41 levels: past the schema bound (32), within the body's (64 levels)
    bombs = [{"json": deep}, {"regex": "(?<=a)b"}, {"choice": [str(i) for i in range(5000)]},
             {"grammar": "start: undefined_rule"}, {"regex": "a" * 10_000}]
    with httpx.Client(base_url=served.url, timeout=30) as http:
        for so in bombs:
            r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "structured_outputs": so})
            assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text
        r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x",
                                               "structured_outputs": {"json": nested(200)}})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_message"), r.text  # the body's bound
    t.join(60)
    assert len(gaps) >= 10 and max(gaps[1:]) < 5.0  # chunks: tokens whose text is complete
    assert wait_idle(served.engine) == (0, 0, 0)


def test_a_session_over_http_with_a_constraint(served):
    with httpx.Client(base_url=served.url, timeout=60) as http:
        r = http.post("/v1/sessions", json={"sampling": {"seed": 2, "structured_outputs": {"choice": ["up", "down"]}}})
        assert r.status_code == 200, r.text
        sid = r.json()["session_id"]
        step = http.post(f"/v1/sessions/{sid}/step", json={"input": [5, 6, 7], "max_tokens": 10}).json()
        assert step["text"] in ("up", "down") and step["finish_reason"] == "stop"
        ev = http.post(f"/v1/sessions/{sid}/events", json={"event_id": 50, "kind": "sampling",
                                                          "data": {"structured_outputs": {"regex": "[0-9]{4}"}}})
        assert ev.status_code == 200, ev.text
        step = http.post(f"/v1/sessions/{sid}/step", json={"input": [8], "max_tokens": 10}).json()
        assert re.fullmatch(r"[0-9]{4}", step["text"])
        bad = http.post("/v1/sessions", json={"sampling": {"structured_outputs": {"regex": "a", "choice": ["b"]}}})
        assert bad.status_code == 400 and "exactly one" in bad.text
        http.delete(f"/v1/sessions/{sid}")
