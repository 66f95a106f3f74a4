"""Structured output constraints and their bounds, without a model (engine/grammar/spec.py, bounds.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.engine.grammar.bounds import GrammarBounds, check_bounds, json_depth
from execstate.engine.grammar.spec import StructuredOutputsParams as S


def test_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one of"):
        S()
    with pytest.raises(ValueError, match="got json, regex"):
        S(json={"type": "object"}, regex="a")
    assert S(regex="a+").kind == "regex"
    assert S(json_object=True).kind == "json_object"


@pytest.mark.parametrize("kwargs, msg", [
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": "[1]"}, "JSON Schema object"),
    ({"json": 3}, "JSON Schema object"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", ""]}, "non-empty list"),
    ({"grammar": "  "}, "non-empty string"),
    ({"regex": 5}, "must be a string"),
])
def test_invalid_values(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        S(**kwargs)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown field"):
        S.from_dict({"regex": "a", "regexp": "b"})


@given(st.one_of(
    st.builds(lambda r: S(regex=r), st.text(min_size=1, max_size=20)),
    st.builds(lambda c: S(choice=c), st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4)),
    st.builds(lambda d: S(json={"type": "object", "properties": {k: {"type": "integer"} for k in d}}),
              st.lists(st.text(max_size=5), max_size=4)),
))
def test_wire_form_round_trips(spec):
    back = S.from_wire(spec.to_wire())
    assert back.key == spec.key and back.kind == spec.kind


def test_key_is_canonical_and_keeps_the_property_order():
    a = S(json={"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}})
    same = S(json='{"type": "object",  "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}')
    swapped = S(json={"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}})
    assert a.key == same.key
    assert a.key != swapped.key  # the output writes the properties in this order: another constraint
    assert list(S.from_wire(swapped.to_wire()).value["properties"]) == ["b", "a"]


def test_json_depth_is_iterative():
    deep: dict = {}
    cur = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        cur["x"] = {}
        cur = cur["x"]
    assert json_depth(deep) == 5001
    assert json_depth(3) == 0 and json_depth([]) == 1


@pytest.mark.parametrize("spec, msg", [
    (S(json={"type": "string", "enum": [str(i) for i in range(2000)]}), "enum has 2000 items"),
    (S(choice=[str(i) for i in range(2000)]), "choice has 2000 items"),
    (S(regex="a" * 5000), "regex has 5000 characters"),
    (S(json={"type": "string", "pattern": "a" * 5000}), "pattern has 5000 characters"),
    (S(grammar="start: " + " | ".join(f'"{i}"' for i in range(20000))), "bytes; at most"),
])
def test_bounds(spec, msg):
    with pytest.raises(ValueError, match=msg):
        check_bounds(spec, GrammarBounds())


def test_nesting_bound():
    schema: dict = {"type": "object"}
    cur = schema
    for _ in range(40):
        cur["properties"] = {"a": {"type": "object"}}
        cur = cur["properties"]["a"]
    with pytest.raises(ValueError, match="nested .* levels deep; at most 32"):
        check_bounds(S(json=schema), GrammarBounds())
    check_bounds(S(json=schema), GrammarBounds(max_depth=200))


def test_sampling_params_take_a_dict():
    from execstate.engine.sampling_params import SamplingParams

    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs == S(regex="a+")
    with pytest.raises(ValueError, match="invalid sampling parameter structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs="a+")
