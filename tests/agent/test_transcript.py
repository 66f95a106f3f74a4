"""Truncation plans: the context after a rollback equals the transcript with the item cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.transcript import Transcript


@given(st.lists(st.tuples(st.sampled_from(["user", "agent", "result"]), st.lists(st.integers(0, 99), min_size=1,
                                                                                  max_size=5)), max_size=8),
       st.integers(0, 12), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_plan_truncate_keeps_the_prefix_the_cut_item_and_everything_after(segs, keep, n_before):
    tr = Transcript(max_marks=8)
    context: list[int] = []  # what a front would hold
    marks = {}
    for i in range(n_before):
        tr.append("user", [1000 + i])
        context.append(1000 + i)
    marks["r1"] = list(context)
    tr.add_mark("r1", 1)
    tr.append("prefix", [7], "r1")
    context.append(7)
    gen = [500 + i for i in range(6)]
    tr.append("agent", gen, "r1")
    context += gen
    for role, toks in segs:
        tr.append(role, toks, "r2" if role == "agent" else None)
        context += toks
    assert tr.token_ids == context
    mark, replay, released = tr.plan_truncate("r1", keep)
    assert mark == 1 and released == []
    expect = marks["r1"] + [7] + gen[:keep] + [t for _, toks in segs for t in toks]
    assert marks["r1"] + replay == expect == tr.token_ids
    assert tr.generated("r1") == gen[:keep]


def test_old_marks_fall_out_and_later_marks_are_released():
    tr = Transcript(max_marks=2)
    assert tr.add_mark("a", "m1") == []
    tr.append("agent", [1], "a")
    assert tr.add_mark("b", "m2") == []
    tr.append("agent", [2], "b")
    assert tr.add_mark("c", "m3") == ["m1"]
    assert not tr.has_mark("a")
    tr.append("agent", [3], "c")
    assert tr.plan_truncate("b", 0) == ("m2", [3], ["m3"])
    assert tr.has_mark("b") and not tr.has_mark("c")
