"""A request's output tokens as a live view of its one token list (O(1) per token).

A ``Request`` keeps one list, ``all_token_ids``: the prompt, then every sampled token appended
in place (amortised O(1)); it is never rebuilt. ``OutputTokenIds`` is the outputs' part of it,
``all_token_ids[num_prompt_tokens:]``, without a copy: ``len``, indexing and ``append`` are
O(1), a slice costs what it returns. It compares equal to a list (or any sequence) with the
same ids. Readers that keep the ids (an output, a session) take a slice: the view follows the
request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, overload


class HasTokens(Protocol):
    """What the view reads: a ``Request``'s one token list and its prompt's length."""

    all_token_ids: list[int]
    num_prompt_tokens: int


class OutputTokenIds(Sequence[int]):
    """``req.all_token_ids[req.num_prompt_tokens:]``, live (module docstring)."""

    __slots__ = ("_req",)

    def __init__(self, req: HasTokens) -> None:
        self._req = req

    def __len__(self) -> int:
        return len(self._req.all_token_ids) - self._req.num_prompt_tokens

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        req = self._req
        n_prompt = req.num_prompt_tokens
        if isinstance(index, slice):
            start, stop, step = index.indices(len(req.all_token_ids) - n_prompt)
            if step != 1:
                return self[:][index]
            return req.all_token_ids[n_prompt + start : n_prompt + max(start, stop)]
        n = len(req.all_token_ids) - n_prompt
        if not -n <= index < n:
            raise IndexError("output token index out of range")
        return req.all_token_ids[n_prompt + index if index >= 0 else index]

    def __iter__(self) -> Iterator[int]:
        tokens, n_prompt = self._req.all_token_ids, self._req.num_prompt_tokens
        return (tokens[i] for i in range(n_prompt, len(tokens)))

    def append(self, token_id: int) -> None:
        """Append a sampled token to the request (its one list)."""
        self._req.all_token_ids.append(token_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OutputTokenIds | list | tuple):
            return self[:] == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self[:])
