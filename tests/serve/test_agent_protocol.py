"""The agent socket's messages, conversions and built-in tools (no model, no server; its phases:
test_realtime_phases.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.agent.agent_events import (
    DelegationCreated,
    DelegationId,
    DelegationResult,
    ErrorEvent,
    OutputDelta,
    ResponseCreated,
    ResponseDone,
    ResponseId,
    TurnEvent,
)
from execstate.agent.config import AgentConfig
from execstate.serve.realtime.agent.convert import (
    MAX_RESPONSE_TOKENS,
    agent_config,
    delegation_policy,
    event_json,
    front_params,
)
from execstate.serve.realtime.agent.messages import (
    AGENT_PROTOCOL,
    AgentSessionConfig,
    DelegationSettings,
    InputAppend,
    ItemCreate,
    ItemTruncate,
    RuleSettings,
    SessionCreate,
    TurnSettings,
)
from execstate.serve.realtime.agent.tools import DEMO_TABLE, AgentTools, calculator, make_lookup
from execstate.serve.realtime.errors import ProtocolError
from execstate.session.runtime.events import SessionEventError

CLIENT_TYPES = AGENT_PROTOCOL.messages.types
parse_client_message = AGENT_PROTOCOL.parse


def test_client_types_are_the_documented_set():
    assert CLIENT_TYPES == ("conversation.item.create", "conversation.item.truncate", "delegation.cancel",
                            "delegation.result.submit", "input_text.append", "response.cancel", "session.close",
                            "session.create", "session.update")


def test_parse_typed_messages():
    m = parse_client_message('{"type": "input_text.append", "text": "hi there", "t": 1.5, "event_id": 7}')
    assert m == InputAppend(text="hi there", t=1.5, event_id=7)
    m = parse_client_message(json.dumps({"type": "session.create", "session": {
        "turn": {"end_of_turn_silence_s": 0.3}, "delegation": {"rules": [{"pattern": "x", "tool": "calculator"}]}}}))
    assert isinstance(m, SessionCreate)
    assert m.session.turn == TurnSettings(end_of_turn_silence_s=0.3)
    assert m.session.delegation == DelegationSettings(rules=[RuleSettings(pattern="x", tool="calculator")])
    m = parse_client_message(json.dumps({"type": "conversation.item.create", "event_id": "e", "item": {
        "type": "function_call_output", "call_id": "dlg_1", "output": "42"}}))
    assert isinstance(m, ItemCreate) and (m.item.call_id, m.item.output) == ("dlg_1", "42")
    m = parse_client_message('{"type": "conversation.item.truncate", "item_id": "resp_1", "audio_end_ms": 1200}')
    assert m == ItemTruncate(item_id="resp_1", audio_end_ms=1200.0)


@pytest.mark.parametrize("frame, code, event_id", [
    ("not json", "invalid_message", None),
    ("[1, 2]", "invalid_message", None),
    ('{"type": "input_audio_buffer.append", "event_id": "a"}', "unknown_type", "a"),
    ('{"type": "input_text.append", "event_id": "b"}', "invalid_message", "b"),  # text missing
    ('{"type": "input_text.append", "text": "x", "tt": 1, "event_id": 3}', "invalid_message", 3),  # typo
    ('{"type": "input_text.append", "text": 5, "event_id": "c"}', "invalid_message", "c"),
    ('{"type": "session.create", "session": {"turn": {"silence": 1}}, "event_id": "d"}', "invalid_message", "d"),
    ('{"type": "conversation.item.create", "item": {"type": "message"}, "event_id": "e"}', "invalid_message", "e"),
    ('{"type": "response.cancel", "event_id": true}', "invalid_message", None),  # a bool is no event id
])
def test_malformed_messages_name_the_problem_and_keep_the_event_id(frame, code, event_id):
    with pytest.raises(ProtocolError) as e:
        parse_client_message(frame)
    assert (e.value.code, e.value.event_id) == (code, event_id)
    assert e.value.message


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 st.dictionaries(st.sampled_from(["type", "event_id", "text", "t", "item_id", "session"]),
                                 st.one_of(st.none(), st.integers(), st.text(max_size=20), st.sampled_from(
                                     list(CLIENT_TYPES))), max_size=5).map(json.dumps)))
def test_parse_never_raises_anything_but_protocol_error(frame):
    try:
        parse_client_message(frame)
    except ProtocolError as e:
        assert e.code in ("invalid_message", "unknown_type")


def test_agent_config_overlays_and_bounds():
    base = AgentConfig()
    cfg = agent_config(AgentSessionConfig(step_tokens=2, turn=TurnSettings(backchannel_max_words=3)), base)
    assert (cfg.step_tokens, cfg.turn.backchannel_max_words, cfg.turn.end_of_turn_silence_s) == (
        2, 3, base.turn.end_of_turn_silence_s)
    assert agent_config(AgentSessionConfig(), cfg) == cfg
    assert base.turn.final_silence_s is not None
    off = parse_client_message('{"type": "session.update", "session": {"turn": {"final_silence_s": null}}}')
    assert agent_config(off.session, base).turn.final_silence_s is None  # null: no end-of-sentence shortcut
    assert agent_config(AgentSessionConfig(turn=TurnSettings(final_silence_s=0.1)), base).turn.final_silence_s == 0.1
    for bad, words in [(AgentSessionConfig(step_tokens=0), "step_tokens"),
                       (AgentSessionConfig(max_response_tokens=MAX_RESPONSE_TOKENS + 1), "max_response_tokens"),
                       (AgentSessionConfig(turn=TurnSettings(end_of_turn_silence_s=-1)), "end_of_turn_silence_s"),
                       (AgentSessionConfig(turn=TurnSettings(resume_after_s=float("inf"))), "resume_after_s"),
                       (AgentSessionConfig(speak_results="loud"), "speak_results"),
                       (AgentSessionConfig(result_template="{0} {secret}"), "result_template")]:
        with pytest.raises(SessionEventError) as e:
            agent_config(bad, base)
        assert e.value.code == "invalid" and words in e.value.message, e.value.message


def test_delegation_policy_from_rules():
    p = delegation_policy(DelegationSettings(rules=[
        RuleSettings(pattern=r"(?P<expression>\d+ times \d+)", tool="calculator", ack="One moment."),
        RuleSettings(pattern=r"code of (?P<key>\w+)", tool="lookup", arguments={"key": "default", "x": 1})]),
        {"calculator", "lookup"})
    call, ack = p.decide("what is 17 times 23?")
    assert (call.tool, call.arguments, ack) == ("calculator", {"expression": "17 times 23"}, "One moment.")
    call, _ = p.decide("the CODE OF zebra")
    assert (call.tool, call.arguments) == ("lookup", {"key": "zebra", "x": 1})
    assert p.decide("hello") is None
    for rules, words in [([RuleSettings(pattern="(", tool="lookup")], "not a valid regex"),
                         ([RuleSettings(pattern="x", tool="nope")], "not an enabled tool"),
                         ([RuleSettings(pattern="", tool="lookup")], "pattern"),
                         ([RuleSettings(pattern="x", tool="lookup")] * 33, "at most 32")]:
        with pytest.raises(SessionEventError) as e:
            delegation_policy(DelegationSettings(rules=rules), {"lookup"})
        assert words in e.value.message


def test_front_params():
    p = front_params({"temperature": 0.7, "seed": 3})
    assert (p.temperature, p.seed, p.stop) == (0.7, 3, ["\n"])
    with pytest.raises(SessionEventError, match="unknown or fixed"):
        front_params({"max_tokens": 5})
    with pytest.raises(SessionEventError, match="sampling"):
        front_params({"temperature": -1})


def test_event_json_of_every_agent_event():
    rid, did = ResponseId("resp_1"), DelegationId("dlg_1")
    runners = {"weather": "client"}
    assert event_json(TurnEvent(0.5, 0, "end_of_turn", "hi"), runners) == {
        "type": "input.turn", "event_id": None, "kind": "end_of_turn", "text": "hi", "t": 0.5, "epoch": 0}
    assert event_json(ResponseCreated(0.6, 0, rid, "turn"), runners)["response"] == {
        "id": "resp_1", "status": "in_progress", "cause": "turn"}
    assert event_json(OutputDelta(0.7, 0, rid, " Hi", (5,)), runners) == {
        "type": "response.output_text.delta", "event_id": None, "response_id": "resp_1", "item_id": "resp_1",
        "delta": " Hi", "t": 0.7, "epoch": 0}
    done = event_json(ResponseDone(0.8, 1, rid, "completed", "stop", " Hi"), runners)
    assert done["response"] == {"id": "resp_1", "status": "completed", "status_details": {"reason": "stop"},
                                "output_text": " Hi"}
    assert event_json(ResponseDone(0.8, 1, rid, "cancelled", "barge_in"), runners)["response"]["status"] == "cancelled"
    created = event_json(DelegationCreated(1.0, 0, did, "weather", {"city": "Oslo"}, "model"), runners)
    assert (created["runner"], created["call_id"], created["arguments"], created["source"]) == (
        "client", "dlg_1", {"city": "Oslo"}, "model")
    res = event_json(DelegationResult(1.1, 0, did, "stale", "4"), runners)
    assert (res["status"], res["result"], res["appended"]) == ("stale", "4", False)
    err = event_json(ErrorEvent(1.2, 0, "front_failed", "boom"), runners)
    assert err["error"] == {"type": "server_error", "code": "front_failed", "message": "boom"}
    assert event_json(ErrorEvent(1.2, 0, "unknown_tool", "x"), runners)["error"]["type"] == "agent_error"


@pytest.mark.parametrize("expr, value", [("17 times 23", "391"), ("17 x 23?", "391"), ("(2 + 3) * 4", "20"),
                                         ("10 divided by 4", "2.5"), ("-2**3", "-8"), ("7 % 3", "1")])
def test_calculator(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize("expr, words", [("__import__('os')", "Call"), ("a + 1", "Name"), ("1/0", "division by zero"),
                                         ("9**99", "exponent"), ("((9**64)**64)**64", "2**1024"), ("", "non-empty"),
                                         ("1 +", "not an arithmetic expression")])
def test_calculator_refuses(expr, words):
    with pytest.raises(ValueError, match=words.replace("*", r"\*")):
        calculator(expr)


def test_lookup_and_registry():
    lookup = make_lookup(DEMO_TABLE)
    assert lookup(" Zebra ") == "ZX-4417"
    with pytest.raises(KeyError, match="unicorn"):
        lookup("unicorn")
    tools = AgentTools()
    assert tools.names == ["calculator", "lookup"]
    tools.register("weather", lambda city: f"sunny in {city}")
    assert tools.names == ["calculator", "lookup", "weather"]
    for name, fn in [("", len), ("bad name", len), ("ok", 5)]:
        with pytest.raises(ValueError):
            tools.register(name, fn)
