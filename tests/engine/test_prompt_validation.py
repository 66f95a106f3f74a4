"""``validation.validate_prompt``: the plain-int fast path (type set, min and max in C) refuses and
accepts exactly what the per-token scan does, with the same message."""

from __future__ import annotations

import numpy as np
import pytest

from execstate.engine.validation import validate_prompt

VOCAB, MAX_LEN = 512, 4096


@pytest.mark.parametrize("ids", [[0], [511], [5, 17, 511, 0] * 300, [True, 3], [np.int64(7), 3],
                                 np.arange(0, 512, dtype=np.int64)])
def test_prompts_inside_the_vocabulary_pass(ids) -> None:
    validate_prompt(ids, VOCAB, MAX_LEN)


@pytest.mark.parametrize(("ids", "count", "first"), [
    ([5, 512, 7], 1, "512"),  # one past the end
    ([-1, 3, 4], 1, "-1"),  # below
    ([600] + list(range(2000)), 1489, "600"),  # a long prompt: every bad id counted, the first named
    ([3, 4.0], 1, "4.0"),  # a float among ints
    ([3, np.int64(512)], 1, "np.int64(512)" if np.__version__ >= "2" else "512"),
    (["7", 3], 1, "'7'"),
])
def test_prompts_outside_the_vocabulary_name_the_bad_ids(ids, count: int, first: str) -> None:
    with pytest.raises(ValueError, match=rf"prompt has {count} token id\(s\) outside the vocabulary \[0, 512\), "
                                         rf"e\.g\. {first.replace('(', '[(]').replace(')', '[)]')}$"):
        validate_prompt(ids, VOCAB, MAX_LEN)


def test_empty_and_long_prompts_are_refused_first() -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        validate_prompt([], VOCAB, MAX_LEN)
    with pytest.raises(ValueError, match="prompt is too long: 4096 tokens"):
        validate_prompt([600] * MAX_LEN, VOCAB, MAX_LEN)
