"""``BlockTable``: a request's block ids as a list whose int64 mirror always equals it, grown in
place (a step copies it without converting the ids)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.engine.block_table import BlockTable
from execstate.engine.request import Request
from execstate.engine.sampling_params import SamplingParams

OPS = st.lists(st.tuples(st.sampled_from(["append", "extend", "set", "set_neg", "set_slice", "del", "pop", "insert",
                                          "clear", "iadd", "reverse", "sort", "remove"]),
                         st.integers(0, 50), st.lists(st.integers(0, 1000), max_size=40)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(start=st.lists(st.integers(0, 1000), max_size=20), ops=OPS, read_every=st.integers(1, 3))
def test_the_mirror_equals_the_list_after_any_change(start, ops, read_every) -> None:
    t, ref = BlockTable(start), list(start)
    for k, (op, i, ids) in enumerate(ops):
        for x in (t, ref):
            if op == "append":
                x.append(i)
            elif op == "extend":
                x.extend(ids)
            elif op == "iadd":
                x += ids
            elif op in ("set", "set_neg", "del", "pop", "insert", "remove") and x:
                j = i % len(x)
                if op == "set":
                    x[j] = i
                elif op == "set_neg":
                    x[-1 - j] = i
                elif op == "del":
                    del x[j]
                elif op == "pop":
                    x.pop(j)
                elif op == "insert":
                    x.insert(j, i)
                else:
                    x.remove(x[j])
            elif op == "set_slice":
                x[: i % 5] = ids[:3]
            elif op == "clear":
                x.clear()
            elif op == "reverse":
                x.reverse()
            elif op == "sort":
                x.sort()
        if k % read_every == 0:
            assert t.array().tolist() == ref
    assert t == ref and t.array().tolist() == ref and t.array().dtype == np.int64


def test_appends_grow_the_same_array_and_slices_are_lists() -> None:
    t = BlockTable([3, 4])
    first = t.array()
    t.append(5)
    t.extend([6, 7])
    assert np.shares_memory(first, t.array()) and t.array().tolist() == [3, 4, 5, 6, 7]
    assert type(t[1:3]) is list and t[1:3] == [4, 5]
    t.extend(range(100))  # past its capacity: one new array, the ids copied over
    assert t.array().tolist() == [3, 4, 5, 6, 7, *range(100)]


def test_a_request_wraps_what_it_is_given() -> None:
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=2), max_model_len=16)
    given_ids = [4, 9]
    req.block_ids = given_ids
    assert isinstance(req.block_ids, BlockTable) and req.block_ids == [4, 9] and req.block_ids is not given_ids
    req.block_ids[-1] = 11  # copy-on-write of a shared tail
    assert req.block_ids.array().tolist() == [4, 11] and given_ids == [4, 9]
    req.block_ids = []
    assert req.block_ids == [] and req.block_ids.array().tolist() == []
