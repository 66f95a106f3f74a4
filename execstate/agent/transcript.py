"""What the front's context holds, segment by segment, so it can be cut back to what was played.

Pure Python. The driver records every token it commits to the front session: input segments
(user words, the agent prefix, results) when a step boundary appends them, and the tokens a
response generated when its step ends. Before each response's first step it takes a session
checkpoint (a *mark*) and registers it here.

``plan_truncate(item_id, keep)`` cuts the response ``item_id`` to its first ``keep`` generated
tokens and returns (the mark to roll back to, the tokens to append again: the response's prefix,
its kept tokens and every segment after it, as they were). The driver applies that at the next
step boundary: rollback to the mark, then those tokens are the next step's input. Marks of later
responses are returned for release (their state no longer exists). Only the last
``max_marks`` responses can be truncated (older ones: KeyError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Segment:
    role: str  # "user", "prefix" (the agent's cue and forced text), "agent" (generated), "result"
    token_ids: list[int]
    item_id: str | None = None


@dataclass
class _Mark:
    mark: Any
    index: int  # segments[index:] were appended after the mark


@dataclass
class Transcript:
    max_marks: int = 4
    segments: list[Segment] = field(default_factory=list)
    _marks: dict[str, _Mark] = field(default_factory=dict)

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def append(self, role: str, token_ids: list[int], item_id: str | None = None) -> None:
        if not token_ids:
            return
        last = self.segments[-1] if self.segments else None
        if last is not None and last.role == role and last.item_id == item_id:
            last.token_ids.extend(token_ids)
        else:
            self.segments.append(Segment(role, list(token_ids), item_id))

    def add_mark(self, item_id: str, mark: Any, index: int | None = None) -> list[Any]:
        """Register the checkpoint taken before ``item_id``; returns marks that fell out (release them).
        ``index``: how many segments the checkpointed context holds (None: all so far; after a
        rollback whose replay was not sent yet: the index ``plan_truncate`` returned)."""
        self._marks[item_id] = _Mark(mark, len(self.segments) if index is None else index)
        out = []
        while len(self._marks) > self.max_marks:
            oldest = next(iter(self._marks))
            out.append(self._marks.pop(oldest).mark)
        return out

    def has_mark(self, item_id: str) -> bool:
        return item_id in self._marks

    def mark_index(self, item_id: str) -> int:
        return self._marks[item_id].index

    def generated(self, item_id: str) -> list[int]:
        return [t for s in self.segments if s.item_id == item_id and s.role == "agent" for t in s.token_ids]

    def plan_truncate(self, item_id: str, keep: int) -> tuple[Any, list[int], list[Any]]:
        """(mark, tokens to re-append, marks to release); the segments are rewritten (docstring).
        After it the context holds ``mark_index(item_id)`` segments until the tokens are sent."""
        m = self._marks[item_id]
        later = [k for k, v in self._marks.items() if v.index > m.index]
        released = [self._marks.pop(k).mark for k in later]
        tail = self.segments[m.index:]
        kept: list[Segment] = []
        left = keep
        for s in tail:
            if s.item_id == item_id and s.role == "agent":
                take = s.token_ids[: max(left, 0)]
                left -= len(take)
                if take:
                    kept.append(Segment(s.role, take, s.item_id))
            else:
                kept.append(Segment(s.role, list(s.token_ids), s.item_id))
        self.segments[m.index:] = kept
        return m.mark, [t for s in kept for t in s.token_ids], released
