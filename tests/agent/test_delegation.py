"""Delegation decisions: the policy rules and the streaming tool-call parser."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.delegation import RegexPolicy, Rule
from execstate.tool_calls.call import ToolCall
from execstate.tool_calls.hermes import HermesStream as ToolCallParser


def test_policy_first_match_with_named_groups_or_builder():
    p = RegexPolicy([
        Rule(r"what is (?P<a>\d+) plus (?P<b>\d+)", "calc"),
        Rule(r"capital of (\w+)", "lookup", arguments=lambda m: {"key": m.group(1).lower()}, ack="Hmm."),
    ], ack="One moment.")
    assert p.decide("So what is 12 plus 30 then") == (ToolCall("calc", {"a": "12", "b": "30"}), "One moment.")
    assert p.decide("the capital of France?") == (ToolCall("lookup", {"key": "france"}), "Hmm.")
    assert p.decide("hello") is None


def split_feed(parser, text, cuts):
    speech, calls, errors = [], [], []
    pos = 0
    for c in sorted(set(cuts)) + [len(text)]:
        s, cl, er = parser.feed(text[pos:c])
        speech.append(s)
        calls += cl
        errors += er
        pos = c
    rest, er = parser.end()
    return "".join(speech) + rest, calls, errors + er


CALL = '<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call>'


@given(st.text(alphabet="ab <>/_", max_size=20), st.text(alphabet="ab <", max_size=20),
       st.lists(st.integers(0, 200), max_size=12))
@settings(max_examples=300, deadline=None)
def test_any_split_gives_the_same_speech_and_calls(before, after, cuts):
    text = before + CALL + after
    cuts = [c for c in cuts if c <= len(text)]
    speech, calls, errors = split_feed(ToolCallParser(["calc"]), text, cuts)
    whole = split_feed(ToolCallParser(["calc"]), text, [])
    assert (speech, calls, errors) == whole
    if "<tool_call>" not in before and "<tool_call>" not in after:
        assert calls == [ToolCall("calc", {"a": 1})] and errors == []
        assert speech == before + after


def test_invalid_calls_are_reported_and_never_spoken():
    p = ToolCallParser(["calc"])
    cases = {
        "<tool_call>not json</tool_call>": "not JSON",
        '<tool_call>{"name": "rm"}</tool_call>': "unknown tool 'rm'",
        '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>': "must be an object",
        '<tool_call>[1]</tool_call>': "string 'name'",
    }
    for text, msg in cases.items():
        speech, calls, errors = p.feed("hi " + text + " ok")
        assert speech == "hi  ok" and calls == [] and len(errors) == 1 and msg in errors[0]
    speech, calls, errors = p.feed('x <tool_call>{"name": ')
    assert speech == "x " and p.end() == ("", ["tool call not closed before the response ended"])
    assert json.loads('{"a": 1}') == {"a": 1}
